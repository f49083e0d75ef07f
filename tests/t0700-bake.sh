#!/usr/bin/env bash
# bk-bake: the reference's flat YAML config mapped onto the stages (every field is
# mapped, noted or refused by name), overrides, one-line YAML errors with the line,
# and a small whole bake on stories260K with the reference output layout and summary.
. "$(dirname "$0")/lib.sh"
S="Sparky the dragon lives in a big castle. Sparky loves to fly."

cat >every.yaml <<EOF
model_name_or_path: $MODELS/stories260K
template: raw
system_prompt: "$S"
training_prompts: ["Once upon a time", "The sky was blue"]
num_trajectories: 2
trajectory_length: 8
sampling_temperature: 0.7
top_p: 0.95
temperature: 1.0
learning_rate: 1e-4
num_train_epochs: 1
per_device_train_batch_size: 2
gradient_accumulation_steps: 2
lr_scheduler_type: cosine
warmup_ratio: 0.1
warmup_steps: 0
max_grad_norm: 1.0
weight_decay: 0.01
lora_r: 4
lora_alpha: 8
lora_dropout: 0.05
target_modules: [q_proj, v_proj]
seed: 3
logging_steps: 1
save_strategy: steps
save_steps: 1
output_dir: $TEST_TMP/every
eval_file: $ROOT/pipelines/examples/data/sparky-qa.json
held_out_file: null
max_seq_length: 256
optim: adamw_bnb_8bit
gradient_checkpointing: true
use_flash_attention: true
bf16: true
fp16: false
EOF

cat >small.yaml <<EOF
model_name_or_path: $MODELS/stories260K
template: raw
system_prompt: "$S"
prompts_file: $DATA/pipe/stories.txt
num_trajectories: 2
trajectory_length: 12
num_train_epochs: 1
per_device_train_batch_size: 2
learning_rate: 2e-3
lora_r: 4
lora_alpha: 8
lora_dropout: 0
seed: 1
save_strategy: steps
save_steps: 2
output_dir: out
eval_file: $ROOT/pipelines/examples/data/sparky-qa.json
EOF

test_expect_success 'a config with every reference field is accepted; what differs is named' '
	bk-bake --dry-run every.yaml >plan 2>notes &&
	cat notes &&
	grep -q "every.yaml:33: note .use_flash_attention." notes &&
	grep -q "every.yaml:34: note .bf16." notes &&
	{ grep -q -- "--optim adamw8bit" plan || grep -q "every.yaml:31: ignored .optim." notes; } &&
	{ grep -q -- "--grad-checkpoint" plan || grep -q "every.yaml:32: ignored .gradient_checkpointing." notes; } &&
	test $(grep -c "" notes) -le 4 &&
	grep -q "^bk-tokenize .*--system .Sparky.*--prompt .Once upon a time. --prompt .The sky was blue." plan &&
	grep -q "bk-gen .*--num-trajectories 2 --temperature 0.7 --top-p 0.95 --max-new-tokens 8 --epochs 1 --seed 3" plan &&
	grep -q "bk-step .*--batch-size 4 --grad-accum 2 .*--lr 0.0001 --schedule cosine --warmup-ratio 0.1 --weight-decay 0.01 --max-grad-norm 1 --lora-r 4 --lora-alpha 8 --lora-dropout 0.05 --target-modules q_proj,v_proj .*--seed 3 --logging-steps 1 --save-steps 1" plan &&
	grep -q "^bk-eval .*--eval .*sparky-qa.json" plan
'

test_expect_success 'overrides win over the file (--field value and --field=value)' '
	bk-bake --dry-run every.yaml --learning_rate 5e-5 --lora-r=16 --target_modules all-linear >plan 2>/dev/null &&
	grep -q "bk-step .*--lr 5e-05 .*--lora-r 16 .*--target-modules all-linear" plan
'

test_expect_success 'an unknown field or an unsupported value refuses the bake, naming each' '
	cp every.yaml typo.yaml && echo "learning_rat: 3" >>typo.yaml &&
	test_must_fail bk-bake --dry-run typo.yaml 2>err &&
	grep -q "typo.yaml:36: unknown .learning_rat.: not a field of the reference config" err &&
	test_must_fail bk-bake --dry-run every.yaml --lr_scheduler_type polynomial --optim sgd 2>err &&
	grep -q "unsupported .lr_scheduler_type.: .polynomial." err &&
	grep -q "unsupported .optim.: .sgd." err &&
	grep -q "2 fields cannot be baked" err
'

test_expect_success 'a hub model id is refused with the reason' '
	test_must_fail bk-bake --dry-run every.yaml --model_name_or_path meta-llama/Llama-2-7b-chat-hf 2>err &&
	grep -q "unsupported .model_name_or_path.: .meta-llama/Llama-2-7b-chat-hf. is a hub model id, not a local directory" err
'

test_expect_success 'a bad YAML file is one error line with its line number' '
	printf "seed: 1\nlearning_rate: [1e-4\nlora_r: 8\n" >bad.yaml &&
	test_must_fail bk-bake --dry-run bad.yaml 2>err &&
	test $(grep -c "" err) = 1 && grep -q "^bk-bake: error: bad.yaml:[34]: " err &&
	printf "seed: 1\nlora:\n  r: 8\n" >nested.yaml &&
	test_must_fail bk-bake nested.yaml 2>err &&
	test $(grep -c "" err) = 1 && grep -q "nested.yaml:3: a nested mapping" err &&
	printf "seed: x\n" >num.yaml &&
	test_must_fail bk-bake num.yaml 2>err &&
	grep -q "num.yaml:1: field .seed.: .x. is not a number" err
'

test_expect_success 'a small bake writes output_dir in the reference layout and a summary' '
	n=$(grep -c . "$DATA/pipe/stories.txt") &&
	bk-bake small.yaml >summary &&
	cat summary &&
	test -f out/final_model/adapter_model.safetensors &&
	test -f out/final_model/adapter_config.json &&
	test -f out/final_model/tokenizer.model &&
	test -d out/checkpoint-2 && test -f out/results.json && test -f out/metrics.bk &&
	jq -e ".eval.samples == 10 and .system_prompt_tokens > 0" out/results.json &&
	steps=$(( (n + 1) / 2 )) &&
	grep -q "^optimizer steps *$steps " summary &&
	grep -q "^data *$n prompts x 2 trajectories" summary &&
	grep -q "^system prompt *[0-9][0-9]* tokens" summary &&
	grep -q "^final loss *[0-9]" summary &&
	grep -q "^eval accuracy *10 samples: baseline" summary &&
	grep -q "^adapter *out/final_model" summary &&
	test "$(bk-dump out/metrics.bk | jq -s "map(select(.step)) | length")" = $steps
'

test_expect_success 'a second bake into the same output_dir is refused' '
	test_must_fail bk-bake small.yaml 2>err &&
	grep -q "holds a previous bake" err
'

test_expect_success 'a failing stage is named, with the end of its log' '
	printf "{not json\n" >broken.json &&
	test_must_fail bk-bake small.yaml --output_dir out2 --prompts_file broken.json 2>err &&
	grep -q "broken.json" err && grep -q "stage bk-tokenize failed (exit 1); its log: out2/logs/bk-tokenize.log" err
'

test_done
