#!/usr/bin/env bash
# bk-bake's save and log points as HF 5.3's Trainer: the end of training is a checkpoint
# (save_strategy steps; epoch: the last, partial epoch's end), and logging_steps /
# save_steps / eval_steps above 1 must be whole numbers (TrainingArguments refuses
# them). The bk-step side: a run ended by --max-steps mid-epoch saves its last step;
# over a pipe, with --save-steps; over a file --save-steps N saves every N steps and
# the last, not at epoch ends.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
export XDG_CACHE_HOME="$TEST_TMP/cache"
export OMP_NUM_THREADS=1
set -o pipefail

for i in 1 2 3 4 5 6 7 8; do
	echo "{\"prompt\": \"Tell me about thing $i\", \"response\": \"It is a nice thing number $i.\"}"
done >pairs.jsonl
# 8 pairs, batch 2: 4 steps an epoch
cat >p.yaml <<EOF
model_name_or_path: $M
template: raw
system_prompt: "Sparky the dragon lives in a big castle."
dataset: $TEST_TMP/pairs.jsonl
num_train_epochs: 1
per_device_train_batch_size: 2
learning_rate: 2e-3
lora_r: 4
lora_alpha: 8
lora_dropout: 0
seed: 1
output_dir: $TEST_TMP/out
EOF
ckpts() { (cd "$1" && ls -d checkpoint-* | sort -t- -k2 -n | tr '\n' ' '); }

test_expect_success 'save_strategy epoch, 1.5 epochs: checkpoints at the end of both epochs (HF: 4 and 6)' '
	bk-bake p.yaml --output_dir e --num_train_epochs 1.5 --save_strategy epoch >/dev/null 2>&1 &&
	test "$(ckpts e)" = "checkpoint-4 checkpoint-6 " &&
	jq -e ".step == 6" e/checkpoint-6/trainer_state.json
'

test_expect_success 'save_strategy steps: every save_steps and at the end of training (HF: 4 and 6)' '
	bk-bake p.yaml --output_dir s --num_train_epochs 1.5 --save_strategy steps --save_steps 4 >/dev/null 2>&1 &&
	test "$(ckpts s)" = "checkpoint-4 checkpoint-6 "
'

test_expect_success 'bk-step: --max-steps ending mid-epoch saves that step; it resumes to the same adapter' '
	bk-tokenize --model "$M" --system "Sparky is a friendly dragon who lives in a cave." \
		"$DATA/pipe/bake.json" 2>/dev/null | bk-lens -q --max-tokens 128 >b.bk &&
	F="--model $M --device cpu --lora-r 8 --lr 2e-3 --max-steps 6 --seed 3" &&
	bk-step $F --out m b.bk >/dev/null 2>&1 &&
	test "$(ckpts m)" = "checkpoint-4 checkpoint-6 " &&
	jq -e ".progress | .epoch == 1 and .micro_in_epoch == 2" m/checkpoint-6/trainer_state.json &&
	bk-step $F --out m2 --max-steps 8 --save-steps 6 b.bk >/dev/null 2>&1 &&
	bk-step $F --out m3 --max-steps 8 b.bk >/dev/null 2>&1 &&
	cp -a m2/checkpoint-6 m3/ &&
	bk-step $F --out m3 --max-steps 8 --resume m3/checkpoint-6 b.bk >/dev/null 2>&1 &&
	cmp m2/final/adapter_model.safetensors m3/final/adapter_model.safetensors &&
	bk-step $F --out q --max-steps 3 --save-steps 2 - <b.bk >/dev/null 2>&1 &&
	test "$(ckpts q)" = "checkpoint-2 checkpoint-3 " &&
	bk-step $F --out q0 --max-steps 3 - <b.bk >/dev/null 2>&1 && ! ls -d q0/checkpoint-* 2>/dev/null
'

# HF 5.3's save points with save_strategy steps (trainer_callback.py, DefaultFlowCallback):
# on_step_end saves when global_step % save_steps == 0 and when global_step >= max_steps;
# on_epoch_end saves only with epoch, so an epoch's end is no checkpoint of its own; a
# save_steps below 1 is ceil(max_steps * save_steps) (TrainerState.compute_steps); after
# each save rotate_checkpoints keeps the newest save_total_limit by step.  Over the 8
# pairs at batch 2 (4 steps an epoch) that gives:
#   2 epochs (8 steps), save_steps 3:                  3 6, end 8      -> 3 6 8
#   2 epochs, save_steps 0.3 = ceil(8 * 0.3) = 3:      the same        -> 3 6 8
#   2.5 epochs (10 steps), save_steps 3:               3 6 9, end 10   -> 3 6 9 10
#   3 epochs (12 steps), save_steps 5, limit 3:        5 10, end 12    -> 5 10 12
# (bakery before: also the epoch ends 4, 8: 3 4 6 8; 3 4 6 8 9 10; 8 10 12 kept)
test_expect_success 'save_strategy steps over pairs: no checkpoint at an epoch end (HF 5.3)' '
	bk-bake p.yaml --output_dir h1 --num_train_epochs 2 --save_strategy steps --save_steps 3 >/dev/null 2>&1 &&
	test "$(ckpts h1)" = "checkpoint-3 checkpoint-6 checkpoint-8 " &&
	bk-bake p.yaml --output_dir h2 --num_train_epochs 2 --save_strategy steps --save_steps 0.3 >/dev/null 2>&1 &&
	test "$(ckpts h2)" = "checkpoint-3 checkpoint-6 checkpoint-8 " &&
	bk-bake p.yaml --output_dir h3 --num_train_epochs 2.5 --save_strategy steps --save_steps 3 >/dev/null 2>&1 &&
	test "$(ckpts h3)" = "checkpoint-3 checkpoint-6 checkpoint-9 checkpoint-10 " &&
	bk-bake p.yaml --output_dir h4 --num_train_epochs 3 --save_strategy steps --save_steps 5 \
		--save_total_limit 3 >/dev/null 2>&1 &&
	test "$(ckpts h4)" = "checkpoint-5 checkpoint-10 checkpoint-12 " &&
	cmp h1/final_model/adapter_model.safetensors h2/final_model/adapter_model.safetensors
'

# bk-step over a file: --save-steps N is HF's steps strategy (every N steps and the last,
# no epoch ends), none is its epoch strategy; a run resumed from a mid-epoch checkpoint
# or from one at an epoch's end reaches the same adapter and the same checkpoints
test_expect_success 'bk-step --save-steps over a file: every N steps and the last only; exact resume' '
	bk-tokenize --model "$M" --system "Sparky is a friendly dragon who lives in a cave." \
		"$DATA/pipe/bake.json" 2>/dev/null | bk-lens -q --max-tokens 128 >b.bk &&
	G="--model $M --device cpu --lora-r 8 --lr 2e-3 --seed 3 --epochs 2" &&
	bk-step $G --out sh --save-steps 3 b.bk >/dev/null 2>&1 &&
	test "$(ckpts sh)" = "checkpoint-3 checkpoint-6 checkpoint-8 " &&
	jq -e ".progress | .epoch == 1 and .micro_in_epoch == 2" sh/checkpoint-6/trainer_state.json &&
	mkdir sr3 && cp -a sh/checkpoint-3 sr3/ &&
	bk-step $G --out sr3 --save-steps 3 --resume sr3/checkpoint-3 b.bk >/dev/null 2>&1 &&
	cmp sh/final/adapter_model.safetensors sr3/final/adapter_model.safetensors &&
	test "$(ckpts sr3)" = "checkpoint-3 checkpoint-6 checkpoint-8 " &&
	mkdir sr6 && cp -a sh/checkpoint-6 sr6/ &&
	bk-step $G --out sr6 --save-steps 3 --resume sr6/checkpoint-6 b.bk >/dev/null 2>&1 &&
	cmp sh/final/adapter_model.safetensors sr6/final/adapter_model.safetensors &&
	test "$(ckpts sr6)" = "checkpoint-6 checkpoint-8 " &&
	bk-step $G --out sh4 --save-steps 4 b.bk >/dev/null 2>&1 &&
	test "$(ckpts sh4)" = "checkpoint-4 checkpoint-8 " &&
	jq -e ".progress | .epoch == 0 and .micro_in_epoch == 4" sh4/checkpoint-4/trainer_state.json &&
	mkdir sr4 && cp -a sh4/checkpoint-4 sr4/ &&
	bk-step $G --out sr4 --save-steps 4 --resume sr4/checkpoint-4 b.bk >/dev/null 2>&1 &&
	cmp sh/final/adapter_model.safetensors sr4/final/adapter_model.safetensors &&
	bk-step $G --out se b.bk >/dev/null 2>&1 &&
	test "$(ckpts se)" = "checkpoint-4 checkpoint-8 "
'

test_expect_success 'logging_steps, save_steps, eval_steps above 1 must be whole (HF 5.3 refuses 2.5)' '
	{ bk-bake --dry-run p.yaml --logging_steps 2.5 --save_steps 2.5 2>err; test $? = 1; } &&
	grep -q "unsupported .logging_steps.: 2.5: a whole number of steps, or a ratio below 1" err &&
	grep -q "unsupported .save_steps.: 2.5: a whole number of steps, or a ratio below 1" err &&
	grep -q "2 fields cannot be baked" err &&
	{ bk-bake --dry-run p.yaml --eval_strategy steps --eval_steps 2.5 --eval_dataset pairs.jsonl 2>err; test $? = 1; } &&
	grep -q "unsupported .eval_steps.: 2.5" err &&
	bk-bake --dry-run p.yaml --logging_steps 0.5 --save_steps 0.25 --eval_strategy steps \
		--eval_steps 0.5 --eval_dataset pairs.jsonl >/dev/null 2>&1 &&
	bk-bake --dry-run p.yaml --logging_steps 3 --save_steps 2.0 >/dev/null 2>&1 &&
	bk-bake --dry-run p.yaml --save_strategy epoch --save_steps 2.5 >/dev/null 2>&1 &&
	bk-bake --dry-run p.yaml --logging_strategy epoch --logging_steps 2.5 >/dev/null 2>&1
'

test_done
