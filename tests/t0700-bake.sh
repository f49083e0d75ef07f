#!/usr/bin/env bash
# bk-bake: the Python tool's flat YAML config mapped onto the stages (every field of its
# config classes and of HF TrainingArguments is mapped, noted or refused by name, held
# against tests/data/bake/tool-fields.txt), its four example configs run unchanged but
# for local paths, overrides, one-line YAML errors with the line, and small bakes on
# stories260K: output_dir as the tool leaves it (final_model/, checkpoint-*, results.json
# with its keys), a summary computed over every step, resume and overwrite as HF, the
# tool's system-prompt rules.
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
	grep -q "bk-gen .*--num-trajectories 2 --temperature 0.7 --top-k 50 --top-p 0.95 --max-new-tokens 8 --seed 3" plan &&
	grep -q "bk-step .*--out [^ ]* --grad-accum 2 .*--lr 0.0001 --schedule cosine --warmup-ratio 0.1 --weight-decay 0.01 --max-grad-norm 1 --lora-r 4 --lora-alpha 8 --lora-dropout 0.05 --target-modules q_proj,v_proj .*--seed 3 --logging-steps 1 --save-steps 1" plan &&
	grep -q "^bk-eval .*--eval .*sparky-qa.json" plan
'

test_expect_success 'overrides win over the file (--field value and --field=value)' '
	bk-bake --dry-run every.yaml --learning_rate 5e-5 --lora-r=16 --target_modules all-linear >plan 2>/dev/null &&
	grep -q "bk-step .*--lr 5e-05 .*--lora-r 16 .*--target-modules all-linear" plan
'

test_expect_success 'top_k (HF generate: 50) is bk-gen --top-k; 0 is off; negative is an error' '
	bk-bake --dry-run every.yaml --top_k 0 >plan 2>/dev/null &&
	grep -q "bk-gen .*--temperature 0.7 --top-k 0 --top-p 0.95" plan &&
	test_must_fail bk-bake --dry-run every.yaml --top_k -3 >/dev/null 2>err &&
	grep -q "top_k" err && test $(wc -l <err) -eq 1
'

test_expect_success 'an unknown field or an unsupported value refuses the bake, naming each' '
	cp every.yaml typo.yaml && echo "learning_rat: 3" >>typo.yaml &&
	{ bk-bake --dry-run typo.yaml 2>err; test $? = 1; } &&
	grep -q "typo.yaml:36: unknown .learning_rat.: not a field of the tool.s config classes or of HF TrainingArguments" err &&
	{ bk-bake --dry-run every.yaml --lr_scheduler_type polynomial --optim sgd --adam_beta1 0.8 2>err; test $? = 1; } &&
	grep -q "unsupported .lr_scheduler_type.: .polynomial." err &&
	grep -q "unsupported .optim.: .sgd." err &&
	grep -q "unsupported .adam_beta1.: .0.8.: bk-step.s AdamW has beta1 0.9" err &&
	grep -q "3 fields cannot be baked" err
'

test_expect_success 'a hub model id is accepted (tests/t0050-hub.sh bakes one); offline and not cached: one line' '
	bk-bake --dry-run every.yaml --model_name_or_path meta-llama/Llama-2-7b-chat-hf >plan 2>err &&
	grep -q "^ *bk-step --model meta-llama/Llama-2-7b-chat-hf " plan &&
	test_must_fail --list env HF_HUB_OFFLINE=1 HF_HUB_CACHE="$TEST_TMP/nocache" bk-bake every.yaml \
		--model_name_or_path meta-llama/Llama-2-7b-chat-hf --output_dir hubout >/dev/null 2>err.all &&
	grep -v ": note " err.all >err && test $(grep -c "" err) = 1 && test ! -e hubout &&
	grep -q "model meta-llama/Llama-2-7b-chat-hf (revision .main.) is not in the cache .*/nocache/models--meta-llama--Llama-2-7b-chat-hf, and HF_HUB_OFFLINE is set" err &&
	{ bk-bake --dry-run every.yaml --model_name_or_path ./no/such 2>err; test $? = 1; } &&
	grep -q "unsupported .model_name_or_path.: .\./no/such. is neither a directory nor a hub id" err
'

test_expect_success 'the tool.s command line: --config FILE, --config=FILE, bare --flag of a bool field' '
	bk-bake --dry-run every.yaml --seed 5 >plan.pos 2>/dev/null &&
	bk-bake --dry-run --config every.yaml --seed 5 >plan.cfg 2>/dev/null &&
	bk-bake --dry-run --seed 5 --config=every.yaml >plan.eq 2>/dev/null &&
	test_cmp plan.pos plan.cfg && test_cmp plan.pos plan.eq &&
	bk-bake --dry-run --config every.yaml --gradient_checkpointing false --seed 5 >plan.nogc 2>/dev/null &&
	bk-bake --dry-run --config every.yaml --gradient_checkpointing false --gradient_checkpointing --seed 5 >plan.gc 2>/dev/null &&
	grep -q "^ *bk-step .*--grad-checkpoint" plan.gc && ! grep -q -- "--grad-checkpoint" plan.nogc &&
	test_must_fail --exit 2 bk-bake --config every.yaml every.yaml &&
	test_must_fail --exit 2 bk-bake --config &&
	test_must_fail --exit 2 bk-bake --config a.yaml --config b.yaml &&
	test_must_fail --exit 2 bk-bake --dry-run --config every.yaml --seed
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

test_expect_success 'bk-bake --fields covers the tool.s config classes and TrainingArguments, no more' '
	bk-bake --fields >fields &&
	awk -F"\t" "NR > 1 && \$2 ~ /^(BakeryConfig|DataConfig|LoraConfig|TrainingArguments)\$/ {print \$2, \$1}" fields | sort >ours &&
	grep -v "^#" "$DATA/bake/tool-fields.txt" | sort >theirs &&
	test $(grep -c "" theirs) -gt 140 &&
	test_cmp theirs ours &&
	awk -F"\t" "NR > 1 && (\$3 == \"\" || \$5 == \"\") {print; bad = 1} END {exit bad}" fields
'

test_expect_success 'the tool.s example configs run with only the model (and dataset) local (borealis_1b: its plan)' '
	bk-bake --dry-run "$DATA/bake/tool/borealis_1b.yaml" --model_name_or_path "$MODELS/stories260K" >plan 2>notes &&
	! grep -q "unsupported\|unknown\|ignored" notes &&
	grep -q "bk-step .*--max-steps [0-9]* --lr 0.0001 --schedule cosine --warmup-ratio 0.1 .*--lora-r 64 --lora-alpha 128 .*--grad-checkpoint" plan &&
	for y in basic performance sft_dataset; do
		bk-bake "$DATA/bake/tool/$y.yaml" --model_name_or_path "$MODELS/stories260K" \
			$(test $y = sft_dataset && echo --dataset "$ROOT/pipelines/examples/data/chat.json") \
			>sum-$y 2>notes-$y || { cat notes-$y; exit 1; }
		cat notes-$y
		! grep -q "unsupported\|unknown\|ignored" notes-$y || exit 1
	done &&
	grep -q "attn_implementation.: no effect" notes-basic &&
	grep -q "dataset_split.: .train_sft\[:1000\]. applies to hub datasets" notes-sft_dataset &&
	grep -q "^optimizer steps *15 " sum-basic && grep -q "^optimizer steps *3 " sum-performance &&
	grep -q "^optimizer steps *3 " sum-performance &&
	for d in basic performance sft_bake; do
		test -f outputs/$d/final_model/adapter_model.safetensors &&
		test -f outputs/$d/final_model/tokenizer.model &&
		test -f outputs/$d/final_model/tokenizer_config.json &&
		grep -q "^library_name: peft" outputs/$d/final_model/README.md &&
		jq -e "(.prompt_tokens | type) == \"number\" and (keys - [\"bakery\", \"prompt_tokens\"]) == []" outputs/$d/results.json || exit 1
	done &&
	ls -d outputs/basic/checkpoint-5 outputs/basic/checkpoint-10 outputs/basic/checkpoint-15 &&
	jq -e ".r == 64 and .lora_alpha == 128" outputs/basic/final_model/adapter_config.json
'

test_expect_success 'a small bake: the tool.s results.json, final_model, metrics, and a summary' '
	n=$(grep -c . "$DATA/pipe/stories.txt") &&
	bk-bake small.yaml --heldout_file "$ROOT/pipelines/examples/data/sparky-qa.json" >summary &&
	cat summary &&
	test -f out/final_model/adapter_model.safetensors &&
	test -f out/final_model/adapter_config.json &&
	test -f out/final_model/tokenizer.model && test -f out/final_model/README.md &&
	test -d out/checkpoint-2 && test -f out/metrics.bk &&
	jq -e "keys == [\"baked_eval\", \"baked_heldout\", \"bakery\", \"baseline_discrete\", \"baseline_none\", \"heldout_discrete\", \"prompt_tokens\"]" out/results.json &&
	for k in baseline_none baseline_discrete heldout_discrete baked_eval baked_heldout; do
		jq -e ".$k | (keys == [\"accuracy\", \"correct\", \"results\", \"total\"]) and .total == 10 and (.results | length) == 10 and .accuracy == .correct / .total and (.results[0] | keys) == [\"correct\", \"question\", \"response\"]" out/results.json || exit 1
	done &&
	jq -e ".prompt_tokens == .bakery.system_prompt_tokens + 1 and .bakery.train.steps > 0" out/results.json &&
	jq -e ".baseline_discrete.results | map(.response == (.response | ascii_downcase) and (.response | length) <= 200) | all" out/results.json &&
	steps=$(( (n + 1) / 2 )) &&
	grep -q "^optimizer steps *$steps " summary &&
	grep -q "^data *$n prompts x 2 trajectories" summary &&
	grep -q "^system prompt *36 tokens" summary &&
	grep -q "^eval accuracy *10 samples: baseline" summary &&
	grep -q "^held-out accuracy *10 samples: prompted" summary &&
	grep -q "^adapter *out/final_model" summary &&
	test "$(bk-dump out/metrics.bk | jq -s "map(select(.step)) | length")" = $steps &&
	test "$(bk-dump out/metrics.bk | jq -r "select(.final) | .final")" = out/final_model
'

test_expect_success 'the summary is computed over every step, whatever logging_steps is' '
	bk-bake small.yaml --output_dir l1 --eval_file null --logging_steps 1 >s1 &&
	bk-bake small.yaml --output_dir l2 --eval_file null --logging_steps 2 >s2 &&
	bk-bake small.yaml --output_dir l9 --eval_file null --logging_steps 9 >s9 &&
	steps=$(bk-dump l1/metrics.bk | jq -s "map(select(.step)) | length") &&
	mean=$(bk-dump l1/metrics.bk | jq -s "map(select(.step) | .loss) | add / length * 10000 | round") &&
	test $steps -gt 2 &&
	for s in s1 s2 s9; do
		grep -q "^optimizer steps *$steps " $s &&
		m=$(sed -n "s/^mean loss *\([0-9.]*\) over $steps steps.*/\1/p" $s) &&
		test "$(echo "$m * 10000 / 1" | bc)" -ge $((mean - 1)) &&
		test "$(echo "$m * 10000 / 1" | bc)" -le $((mean + 1)) || exit 1
	done &&
	jq -e "keys == [\"bakery\", \"prompt_tokens\"] and .prompt_tokens == 36" l9/results.json
'

test_expect_success 'fractional num_train_epochs and max_steps count steps as HF' '
	bk-bake small.yaml --output_dir fr --eval_file null --num_train_epochs 1.5 >s &&
	n=$(grep -c . "$DATA/pipe/stories.txt") && per=$(( (n + 1) / 2 )) &&
	want=$(( (3 * per + 1) / 2 )) &&
	grep -q "^optimizer steps *$want " s &&
	bk-bake small.yaml --output_dir ms --eval_file null --max_steps 2 >s &&
	grep -q "^optimizer steps *2 " s
'

test_expect_success 'writing into an existing output_dir, overwrite_output_dir, resume_from_checkpoint' '
	bk-bake small.yaml --output_dir re --eval_file null --save_steps 1 >/dev/null &&
	ls -d re/checkpoint-1 re/checkpoint-2 &&
	cp re/final_model/adapter_model.safetensors full.safetensors &&
	bk-bake small.yaml --output_dir re --eval_file null --save_steps 1 --max_steps 2 >/dev/null &&
	ls -d re/checkpoint-1 re/checkpoint-2 && ! test -d re/checkpoint-3 &&
	jq -e ".bakery.train.steps == 2" re/results.json &&
	bk-bake small.yaml --output_dir re --eval_file null --save_strategy no --overwrite_output_dir true >/dev/null &&
	! ls -d re/checkpoint-* 2>/dev/null && test -f re/final_model/adapter_model.safetensors &&
	bk-bake small.yaml --output_dir rs --eval_file null --save_steps 1 >/dev/null &&
	cp rs/final_model/adapter_model.safetensors whole.safetensors &&
	bk-bake small.yaml --output_dir rs --eval_file null --save_steps 1 --resume_from_checkpoint rs/checkpoint-2 >s &&
	grep -q "resuming from rs/checkpoint-2 at step 2" rs/logs/bk-step.log &&
	cmp whole.safetensors rs/final_model/adapter_model.safetensors &&
	bk-bake small.yaml --output_dir rs --eval_file null --save_steps 1 --resume_from_checkpoint true >s &&
	grep -q "resuming from rs/checkpoint-3 at step 3" rs/logs/bk-step.log &&
	bk-bake small.yaml --output_dir lim --eval_file null --save_steps 1 --save_total_limit 1 >/dev/null &&
	test "$(cd lim && ls -d checkpoint-*)" = checkpoint-3 &&
	{ bk-bake small.yaml --output_dir none --eval_file null --resume_from_checkpoint true 2>err; test $? = 1; } &&
	grep -q "holds no checkpoint-N" err
'

test_expect_success 'the system prompt as the tool builds it: file stripped, system_prompt first' '
	printf "  \n\t$S \n\n" >sys.txt &&
	bk-bake small.yaml --output_dir sf --eval_file null --system_prompt "" --system_prompt_file sys.txt >s &&
	printf "%s" "$S" | cmp - sf/system_prompt.txt &&
	jq -e ".prompt_tokens == 36" sf/results.json &&
	bk-bake --dry-run small.yaml --corpus_file "$ROOT/pipelines/examples/data/papers.json" >plan 2>notes &&
	grep -q "note .corpus_file.: not used: system_prompt is given" notes &&
	grep -q "^bk-tokenize .*--system .Sparky" plan && ! grep -q -- "--corpus" plan &&
	bk-bake --dry-run small.yaml --system_prompt "" --corpus_file "$ROOT/pipelines/examples/data/papers.json" >plan &&
	grep -q "the tool.s default wrapper" plan &&
	grep -q -- "--corpus-format papers --system-template out/system_template.txt" plan
'

test_expect_success 'a failing stage is named, with the end of its log' '
	printf "{not json\n" >broken.json &&
	{ bk-bake small.yaml --output_dir out2 --prompts_file broken.json 2>err; test $? = 1; } &&
	grep -q "broken.json" err && grep -q "stage bk-tokenize failed (exit 1); its log: out2/logs/bk-tokenize.log" err
'

test_done
