#!/usr/bin/env bash
# No silent wrong results (issue 26): texts with NUL bytes never reach a tokenizer cut,
# a file is named as the user wrote it, prompt_tokens counts what the tokenizer adds,
# one run at a time in an output directory, resume keeps the metrics, SIGINT stops a
# bake with its checkpoint, small range messages.
. "$(dirname "$0")/lib.sh"

cat >small.yaml <<EOF2
model_name_or_path: $MODELS/stories260K
template: raw
system_prompt: "Sparky the dragon."
training_prompts: ["Once upon a time", "The sky was blue"]
num_trajectories: 1
trajectory_length: 6
num_train_epochs: 1
per_device_train_batch_size: 2
learning_rate: 2e-3
lora_r: 2
seed: 1
save_strategy: steps
save_steps: 1
logging_steps: 1
output_dir: out
EOF2

test_expect_success 'a NUL byte in system_prompt_file or a "\0" in the YAML: one line, nothing written' '
	printf "Hello\0World" >nul.txt &&
	test_must_fail bk-bake small.yaml --system_prompt "" --system_prompt_file nul.txt 2>err &&
	grep -q "^bk-bake: error: nul.txt: line 1: nul byte" err && test ! -e out &&
	test_must_fail bk-bake --dry-run small.yaml --system_prompt "" --system_prompt_file nul.txt 2>err &&
	printf "%s\n" "model_name_or_path: $MODELS/stories260K" "system_prompt: \"Hello\\0World\"" \
		"training_prompts: [a]" "output_dir: out" >nul.yaml &&
	test_must_fail bk-bake nul.yaml 2>err &&
	grep -q "^bk-bake: error: nul.yaml:2: a NUL character" err && test ! -e out &&
	printf "%s\n" "model_name_or_path: $MODELS/stories260K" "system_prompt: S" \
		"training_prompts: [\"a\\0b\"]" "output_dir: out" >nul2.yaml &&
	test_must_fail bk-bake nul2.yaml 2>err && grep -q "nul2.yaml:3: a NUL character" err
'

test_expect_success 'a binary system_prompt_file is named as the user gave it, not as its copy' '
	printf "ab\377\376cd\n" >bin.txt &&
	test_must_fail bk-bake small.yaml --system_prompt "" --system_prompt_file bin.txt 2>err &&
	grep -q "^bk-bake: error: bin.txt: line 1: invalid utf-8" err && test ! -e out
'

test_done
