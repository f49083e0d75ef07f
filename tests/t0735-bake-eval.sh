#!/usr/bin/env bash
# bk-bake's validation loss, as the tool sets it up over transformers 5.3: eval_strategy
# steps / epoch over eval_dataset (or eval_dataset_split of dataset), bk-step --eval at
# HF's points, eval_loss in metrics.bk and in every trainer_state.json's log_history
# beside the training losses; eval_steps null takes logging_steps as given, else HF's
# 500; evaluation_strategy (transformers 4) with a note; refusals in one line.
. "$(dirname "$0")/lib.sh"
export XDG_CACHE_HOME="$TEST_TMP/cache"
export OMP_NUM_THREADS=1
S="Sparky the dragon lives in a big castle. Sparky loves to fly."

head_yaml() { # head_yaml OUT: the common part, prompts-only, 4 prompts, batch 2
	cat <<EOF
model_name_or_path: $MODELS/stories260K
template: raw
system_prompt: "$S"
training_prompts: ["Once upon a time", "The sky was blue", "Tom had a red ball.", "Lily wanted to play"]
num_trajectories: 2
trajectory_length: 8
per_device_train_batch_size: 2
learning_rate: 2e-3
lora_r: 4
lora_alpha: 8
lora_dropout: 0
seed: 1
output_dir: $1
EOF
}

# the eval records of a metrics stream: "step eval_loss"
evals() { bk-dump "$1" | jq -r "select(.eval_loss != null) | \"\(.step) \(.eval_loss)\""; }

{ head_yaml ep; cat <<EOF
num_train_epochs: 2
save_strategy: epoch
eval_strategy: epoch
eval_dataset: $DATA/pipe/bake.json
per_device_eval_batch_size: 3
EOF
} >ep.yaml

test_expect_success 'eval_strategy epoch: eval_loss at each epoch end, in metrics.bk and log_history' '
	bk-bake ep.yaml >out 2>err &&
	grep -q "note .eval_dataset.: the tool needs eval_dataset_split too" err &&
	test "$(evals ep/metrics.bk | cut -d" " -f1 | tr "\n" " ")" = "2 4 " &&
	bk-dump ep/metrics.bk | jq -s -e "map(select(.eval_loss != null)) | all(.[];
		.eval_samples == 8 and .eval_loss > 0)" &&
	jq -e "[.log_history[] | select(.eval_loss != null) | [.step, .epoch]] == [[2, 1], [4, 2]] and
		([.log_history[] | select(.loss != null) | .step] == [1, 2, 3, 4]) and
		(.log_history | all(.[]; .learning_rate != null or .eval_loss != null)) and
		.global_step == 4 and .epoch == 2" ep/final_model/trainer_state.json &&
	e4=$(evals ep/metrics.bk | sed -n 2p | cut -d" " -f2) &&
	jq -e --argjson e $e4 "[.log_history[] | select(.step == 4) | .eval_loss // empty] == [\$e]" \
		ep/final_model/trainer_state.json &&
	jq -e "[.log_history[].step] == [1, 2, 2] and .format == \"bakery-trainer-state\"" \
		ep/checkpoint-2/trainer_state.json
'

{ head_yaml st; cat <<EOF
dataset: $DATA/pipe/bake.json
num_train_epochs: 1
eval_strategy: steps
eval_steps: 3
eval_dataset_split: "test[:2]"
EOF
} >st.yaml

test_expect_success 'eval_strategy steps over paired data; eval_dataset_split of a local dataset reads it whole' '
	bk-bake st.yaml >out 2>err &&
	grep -q "note .eval_dataset_split.: .test\[:2\]. of the local file .*read whole" err &&
	test "$(evals st/metrics.bk | cut -d" " -f1 | tr "\n" " ")" = "3 " &&
	bk-dump st/metrics.bk | jq -s -e "map(select(.eval_loss != null))[0].eval_samples == 8" &&
	jq -e "[.log_history[] | select(.eval_loss != null) | .step] == [3] and .global_step == 4" \
		st/final_model/trainer_state.json
'

test_expect_success 'eval_steps null: logging_steps as given, else HF.s 500; evaluation_strategy' '
	bk-bake --dry-run st.yaml --eval_steps null >plan 2>/dev/null &&
	grep -q -- "--eval [^ ]*eval_tokens.bk --eval-steps 500 --eval-batch-size 8" plan &&
	bk-bake --dry-run st.yaml --eval_steps null --logging_steps 2 >plan 2>/dev/null &&
	grep -q -- "--eval-steps 2 " plan &&
	bk-bake --dry-run st.yaml --eval_strategy null --evaluation_strategy epoch >plan 2>err &&
	grep -q "note .evaluation_strategy.: transformers 5 has no evaluation_strategy" err &&
	grep -q -- "--eval-steps \(STEPS_PER_EPOCH\|[0-9][0-9]*\) --eval-final" plan &&
	bk-bake --dry-run st.yaml --eval_strategy no >plan 2>err &&
	! grep -q -- "--eval" plan && grep -q "note .eval_dataset_split.: not used" err
'

# learning_rate 0, batch 8: the adapter stays at B = 0, so step 1's training loss and
# the validation loss after it are KLs of the same model over the same 8 pairs
{ head_yaml kl; cat <<EOF
dataset: $DATA/pipe/bake.json
num_train_epochs: 1
eval_strategy: steps
eval_steps: 1
eval_dataset: $DATA/pipe/bake.json
eval_dataset_split: train
EOF
} >kl.yaml

test_expect_success 'the training KL is exact by default, as the tool.s; teacher_top_k N is bk-teach.s' '
	K="--per_device_train_batch_size 8 --learning_rate 0" &&
	bk-bake --dry-run kl.yaml $K >plan 2>/dev/null &&
	! grep -q "^bk-teach\|| *bk-teach" plan &&
	bk-bake kl.yaml $K >out 2>/dev/null &&
	bk-dump kl/metrics.bk | jq -s -e "(map(select(.loss != null))[0].loss) as \$l |
		(map(select(.eval_loss != null))[0].eval_loss) as \$e | (\$l - \$e | fabs) < 1e-6 * \$e" &&
	bk-bake kl.yaml $K --teacher_top_k 4 --output_dir k4 >out 2>/dev/null &&
	bk-dump k4/metrics.bk | jq -s -e "(map(select(.loss != null))[0].loss) as \$l |
		(map(select(.eval_loss != null))[0].eval_loss) as \$e | \$l < 0.99 * \$e"
'

test_expect_success 'refused: no validation records, a missing file, prompts alone, a bad strategy' '
	{ head_yaml x; echo "eval_strategy: steps"; } >none.yaml &&
	{ bk-bake --dry-run none.yaml 2>err; test $? = 1; } &&
	grep -q "unsupported .eval_strategy.: .steps. needs validation records" err &&
	{ bk-bake --dry-run st.yaml --eval_dataset ./no/such.json 2>err; test $? = 1; } &&
	grep -q "unsupported .eval_dataset.: .\./no/such.json. is not a local file, a dataset directory or a hub id" err &&
	{ bk-bake --dry-run st.yaml --eval_strategy sometimes 2>err; test $? = 1; } &&
	grep -q "unsupported .eval_strategy.: .sometimes." err &&
	printf "[\"Once upon a time\", \"A cat sat\"]\n" >prompts.json &&
	{ bk-bake ep.yaml --eval_dataset prompts.json --output_dir pr 2>err; test $? = 1; } &&
	grep -q "^bk-bake: error: prompts.json: no prompt/response pairs" err &&
	! test -e pr/metrics.bk
'

test_done
