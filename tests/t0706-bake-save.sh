#!/usr/bin/env bash
# bk-bake's save and log points as HF 5.3's Trainer: the end of training is a checkpoint
# (save_strategy steps; epoch: the last, partial epoch's end), and logging_steps /
# save_steps / eval_steps above 1 must be whole numbers (TrainingArguments refuses
# them). The bk-step side: a run ended by --max-steps mid-epoch saves its last step;
# over a pipe, with --save-steps.
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
