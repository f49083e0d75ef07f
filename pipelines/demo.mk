# demo.mk - the main job on the shipped story model, on the CPU, in well under 3
# minutes: bake the system prompt "Sparky the dragon lives in a big castle. Sparky
# loves to fly." into a LoRA adapter for models/stories260K, then compare the base
# model, the prompted model and the baked model on held-out story openings.
#   make demo                       (from the top-level Makefile)
#   make -f pipelines/demo.mk BIN=build/bin OUT=runs/demo
# Every stage writes a file, so a second run only prints the summary; delete a file
# to re-run from that stage.
BIN ?= build/bin
OUT ?= runs/demo
MODEL ?= models/stories260K
D := pipelines/demo
export PATH := $(BIN):$(PATH)
# OpenMP threads that spin while waiting starve each other on a busy 2-core machine
export OMP_WAIT_POLICY ?= passive
DEV ?= --device auto

.PHONY: demo clean
.DELETE_ON_ERROR:

demo: $(OUT)/results.json $(OUT)/loss.txt
	@sh $(D)/summary.sh $(OUT)

$(OUT)/tokens.bk: $(D)/train.txt $(D)/system.txt
	@mkdir -p $(OUT)
	bk-tokenize --model $(MODEL) --system-file $(D)/system.txt $(D)/train.txt -o $@

# 4 trajectories per prompt for each of 3 epochs, fresh samples every epoch
$(OUT)/gen.bk: $(OUT)/tokens.bk
	bk-gen --model $(MODEL) $(DEV) --num-trajectories 4 --epochs 3 --max-new-tokens 48 \
	    --temperature 0.8 --top-p 0.9 --seed 1 $< -o $@

# plan packed batches over the generated records (shuffled, seeded)
$(OUT)/lens.bk: $(OUT)/gen.bk
	bk-lens --max-tokens 1024 --seed 1 $< -o $@

$(OUT)/teach.bk: $(OUT)/lens.bk
	bk-teach --model $(MODEL) $(DEV) --top-k 64 $< -o $@

$(OUT)/metrics.bk: $(OUT)/teach.bk
	rm -rf $(OUT)/adapter
	bk-step --model $(MODEL) $(DEV) --out $(OUT)/adapter --lr 2e-3 --lora-r 8 \
	    --lora-alpha 16 --lora-dropout 0 --warmup-ratio 0.05 --seed 1 $< >$@

$(OUT)/results.json: $(OUT)/metrics.bk $(D)/qa.json $(D)/heldout.txt
	bk-eval --model $(MODEL) $(DEV) --adapter $(OUT)/adapter/final \
	    --system-file $(D)/system.txt --eval $(D)/qa.json --kl-prompts $(D)/heldout.txt \
	    --max-new-tokens 60 --show 2 -o $@ 2>$(OUT)/examples.txt || \
	    { cat $(OUT)/examples.txt >&2; exit 1; }

# the loss curve: a PNG with gnuplot when it is installed, always a text plot
$(OUT)/loss.txt: $(OUT)/metrics.bk
	sh $(D)/plot.sh $< $(OUT)

clean:
	rm -rf $(OUT)
