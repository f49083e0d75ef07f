# bake.mk - a bake as a make recipe: every stage writes a file named by a content hash
# of its input and its options, so a change re-runs only the stages it touches:
#   runs/NAME/tokens-H.bk    bk-tokenize            (data, system prompt, tokenizer, template)
#   runs/NAME/lens-H.bk      bk-lens                (+ batch plan, seed)
#   runs/NAME/gen-H.bk       bk-gen                 (+ trajectories, sampling, epochs, seed)
#   runs/NAME/teach-H.bk     bk-teach               (+ KL temperature, top-k)
#   runs/NAME/adapter-H/     bk-step (final/ = the adapter; metrics-H.bk its metrics)
#   runs/NAME/results-H.json bk-eval (when EVAL, HELD_OUT or KL_PROMPTS is set)
#   runs/NAME/loss-H.txt     bk-plot (and loss-H.png with gnuplot)
# Changing LR re-runs only bk-step; SAMPLING_TEMPERATURE or SAMPLING_TOP_K (bk-gen's
# --top-k, default 50 as in HF generate and bk-bake; TOP_K is the teacher's) re-runs from
# bk-gen; deleting gen-*.bk re-runs from bk-gen.  make -j runs evaluation and plotting
# side by side.
# SHARDS=N runs bk-gen and bk-teach as N independent shard targets
#   runs/NAME/gen-H.IofN.bk, teach-H.IofN.bk  (make -j N, or one cluster job each:
#   make -f pipelines/bake.mk SHARDS=N runs/NAME/teach-H.IofN.bk)
# merged by bk-dump --merge into the same gen-H.bk / teach-H.bk an unsharded run
# writes (so SHARDS is not part of any hash).  NPROC=N runs bk-step as N data-parallel
# ranks under $(MPIRUN) $(MPIRUN_NP) (default mpirun -np N; on Slurm MPIRUN=srun
# MPIRUN_NP=--ntasks=N): N ranks x GRAD_ACCUM micro-batches per step.
#   make -f pipelines/bake.mk                               (the defaults: Sparky, stories260K)
#   make -f pipelines/bake.mk CONFIG=pipelines/examples/basic.mk LR=1e-3
#   make -f pipelines/bake.mk CONFIG=... print               (the stage files and hashes)
# CONFIG is a make file of VAR = value lines; command-line variables win over it.
# Stage options are those of the tools (man bk-gen, ...); DEVICE is not part of a hash.

# bk-plot: next to this file in the repository (pipelines/), else on PATH (make install
# puts bake.mk in PREFIX/share/bakery and bk-plot in PREFIX/bin)
BAKE_MK_DIR := $(dir $(lastword $(MAKEFILE_LIST)))
BK_PLOT ?= $(or $(wildcard $(BAKE_MK_DIR)bk-plot),bk-plot)

ifdef CONFIG
include $(CONFIG)
endif

BIN                  ?= build/bin
NAME                 ?= bake
RUNS                 ?= runs
MODEL                ?= models/stories260K
DATA                 ?= pipelines/examples/data/stories.txt
SYSTEM               ?= Sparky the dragon lives in a big castle. Sparky loves to fly.
SYSTEM_FILE          ?=
CORPUS               ?=
CORPUS_FORMAT        ?= text
TEMPLATE             ?=
MAX_SEQ_LENGTH       ?= 0
NUM_TRAJECTORIES     ?= 4
SAMPLING_TEMPERATURE ?= 0.8
TOP_P                ?= 0.9
SAMPLING_TOP_K       ?= 50
MAX_NEW_TOKENS       ?= 48
EPOCHS               ?= 2
TOP_K                ?= 64
KL_TEMPERATURE       ?= 1.0
LR                   ?= 2e-3
SCHEDULE             ?= linear
WARMUP_RATIO         ?= 0.05
WEIGHT_DECAY         ?= 0
MAX_GRAD_NORM        ?= 1.0
LORA_R               ?= 8
LORA_ALPHA           ?= 16
LORA_DROPOUT         ?= 0
TARGET_MODULES       ?= all-linear
BATCH_SIZE           ?= 4
GRAD_ACCUM           ?= 1
SAVE_STEPS           ?= 0
LOGGING_STEPS        ?= 1
SEED                 ?= 1
DEVICE               ?= auto
EVAL                 ?=
HELD_OUT             ?=
KL_PROMPTS           ?=
STEP_EXTRA           ?=
SHARDS               ?= 1
NPROC                ?= 1
MPIRUN               ?= mpirun
MPIRUN_NP            ?= -np $(NPROC)

export PATH := $(abspath $(BIN)):$(PATH)
# OpenMP threads that spin while waiting starve the other stages on a small machine
export OMP_WAIT_POLICY ?= passive
SHELL := /bin/bash
.DELETE_ON_ERROR:

OUT := $(RUNS)/$(NAME)
comma := ,
q = '$(subst ','\'',$(1))'
# 16 hex digits of sha256 over a string and the contents of some files
hash = $(shell { printf '%s' $(call q,$(1)); $(if $(strip $(2)),cat $(2);) } | sha256sum | cut -c1-16)

# the model: its config and tokenizer, and the size and first MiB (the header, where
# tensor names and offsets are) of each weight file; not the whole weights (gigabytes)
MODEL_ID := $(shell cd $(MODEL) && for f in config.json tokenizer.model *.safetensors; do \
	stat -c '%n %s' $$f && head -c 1048576 $$f; done 2>&1 | sha256sum | cut -c1-16)

ifneq ($(SYSTEM_FILE),)
SYS_ARGS  = --system-file $(SYSTEM_FILE)
SYS_FILES = $(SYSTEM_FILE)
else ifneq ($(CORPUS),)
SYS_ARGS  = --corpus $(CORPUS) --corpus-format $(CORPUS_FORMAT) $(if $(SYSTEM_TEMPLATE),--system-template $(SYSTEM_TEMPLATE))
SYS_FILES = $(CORPUS) $(SYSTEM_TEMPLATE)
else
SYS_ARGS  = --system $(call q,$(SYSTEM))
SYS_FILES =
endif

TOK_OPTS   = --model $(MODEL) $(if $(TEMPLATE),--template $(TEMPLATE)) $(SYS_ARGS) \
             --max-seq-length $(MAX_SEQ_LENGTH)
LENS_OPTS  = --max-tokens 0 --max-batch $(BATCH_SIZE) --window 1048576 --seed $(SEED) -q
GEN_OPTS   = --num-trajectories $(NUM_TRAJECTORIES) --temperature $(SAMPLING_TEMPERATURE) \
             --top-k $(SAMPLING_TOP_K) --top-p $(TOP_P) --max-new-tokens $(MAX_NEW_TOKENS) --epochs $(EPOCHS) --seed $(SEED)
TEACH_OPTS = --top-k $(TOP_K) --temperature $(KL_TEMPERATURE)
STEP_OPTS  = --batch-size $(shell echo $$(( $(BATCH_SIZE) * $(NUM_TRAJECTORIES) ))) \
             --grad-accum $(GRAD_ACCUM) --lr $(LR) --schedule $(SCHEDULE) \
             --warmup-ratio $(WARMUP_RATIO) --weight-decay $(WEIGHT_DECAY) \
             --max-grad-norm $(MAX_GRAD_NORM) --lora-r $(LORA_R) --lora-alpha $(LORA_ALPHA) \
             --lora-dropout $(LORA_DROPOUT) --target-modules $(TARGET_MODULES) \
             --temperature $(KL_TEMPERATURE) --seed $(SEED) --save-steps $(SAVE_STEPS) \
             --logging-steps $(LOGGING_STEPS) $(STEP_EXTRA)
EVAL_OPTS  = --model $(MODEL) $(if $(TEMPLATE),--template $(TEMPLATE)) $(SYS_ARGS) \
             $(if $(EVAL),--eval $(EVAL)) $(if $(HELD_OUT),--held-out $(HELD_OUT)) \
             $(if $(KL_PROMPTS),--kl-prompts $(KL_PROMPTS)) --temperature $(KL_TEMPERATURE)

# each stage's hash: the hash of its input stage + its own options (+ its files);
# bk-gen reads the plan as a file (epoch-major samples: every epoch's records before
# the next epoch's), marked "file" in its hash
H_TOK   := $(call hash,$(MODEL_ID) $(TOK_OPTS),$(DATA) $(SYS_FILES))
H_LENS  := $(call hash,$(H_TOK) $(LENS_OPTS))
H_GEN   := $(call hash,$(H_LENS) $(MODEL_ID) $(GEN_OPTS) file)
H_TEACH := $(call hash,$(H_GEN) $(TEACH_OPTS))
H_STEP  := $(call hash,$(H_TEACH) $(STEP_OPTS) $(if $(filter-out 1,$(NPROC)),ranks $(NPROC)))
H_EVAL  := $(call hash,$(H_STEP) $(EVAL_OPTS),$(EVAL) $(HELD_OUT) $(KL_PROMPTS))

TOKENS  := $(OUT)/tokens-$(H_TOK).bk
LENS    := $(OUT)/lens-$(H_LENS).bk
GEN     := $(OUT)/gen-$(H_GEN).bk
TEACH   := $(OUT)/teach-$(H_TEACH).bk
ADAPTER := $(OUT)/adapter-$(H_STEP)
METRICS := $(OUT)/metrics-$(H_STEP).bk
RESULTS := $(OUT)/results-$(H_EVAL).json
LOSS    := $(OUT)/loss-$(H_STEP).txt
SHARD_IDS    := $(shell seq 0 $$(( $(SHARDS) - 1 )))
GEN_SHARDS   := $(foreach i,$(SHARD_IDS),$(OUT)/gen-$(H_GEN).$(i)of$(SHARDS).bk)
TEACH_SHARDS := $(foreach i,$(SHARD_IDS),$(OUT)/teach-$(H_TEACH).$(i)of$(SHARDS).bk)
STEP_RUN     := $(if $(filter-out 1,$(NPROC)),$(MPIRUN) $(MPIRUN_NP)) bk-step

.PHONY: all adapter eval plot print clean
all: adapter plot $(if $(EVAL)$(HELD_OUT)$(KL_PROMPTS),eval)
	@echo "bake.mk: adapter $(ADAPTER)/final, metrics $(METRICS)$(if $(EVAL)$(HELD_OUT)$(KL_PROMPTS),$(comma) results $(RESULTS))"
adapter: $(METRICS)
eval: $(RESULTS)
plot: $(LOSS)

$(TOKENS): $(DATA) $(SYS_FILES)
	@mkdir -p $(OUT)
	bk-tokenize $(TOK_OPTS) -o $@ $(DATA)

# the batch plan (B prompts a batch, shuffled)
$(LENS): $(TOKENS)
	bk-lens $(LENS_OPTS) $< -o $@

ifeq ($(SHARDS),1)
# the teacher's trajectories and its distributions
$(GEN): $(LENS)
	bk-gen --model $(MODEL) --device $(DEVICE) $(GEN_OPTS) $< -o $@

$(TEACH): $(GEN)
	bk-teach --model $(MODEL) --device $(DEVICE) $(TEACH_OPTS) $< -o $@
else
# shard I of N of each teacher stage: independent targets
$(OUT)/gen-$(H_GEN).%of$(SHARDS).bk: $(LENS)
	bk-gen --model $(MODEL) --device $(DEVICE) $(GEN_OPTS) --shard $*/$(SHARDS) $< -o $@

$(OUT)/teach-$(H_TEACH).%of$(SHARDS).bk: $(OUT)/gen-$(H_GEN).%of$(SHARDS).bk
	bk-teach --model $(MODEL) --device $(DEVICE) $(TEACH_OPTS) --shard $*/$(SHARDS) $< -o $@

# the unsharded streams, record for record
$(GEN): $(GEN_SHARDS) $(LENS)
	bk-dump --merge $(LENS) -o $@ $(GEN_SHARDS)

$(TEACH): $(TEACH_SHARDS) $(LENS)
	bk-dump --merge $(LENS) -o $@ $(TEACH_SHARDS)
endif

$(METRICS): $(TEACH)
	rm -rf $(ADAPTER)
	$(STEP_RUN) --model $(MODEL) --device $(DEVICE) --out $(ADAPTER) $(STEP_OPTS) $< >$@

$(RESULTS): $(METRICS) $(EVAL) $(HELD_OUT) $(KL_PROMPTS)
	bk-eval $(EVAL_OPTS) --device $(DEVICE) --adapter $(ADAPTER)/final -o $@

$(LOSS): $(METRICS)
	$(BK_PLOT) $< $(basename $@).png >$@

print:
	@printf '%s\n' $(TOKENS) $(LENS) $(GEN) $(TEACH) $(ADAPTER) $(METRICS) $(RESULTS) $(LOSS) \
		$(if $(filter-out 1,$(SHARDS)),$(GEN_SHARDS) $(TEACH_SHARDS))

clean:
	rm -rf $(OUT)
