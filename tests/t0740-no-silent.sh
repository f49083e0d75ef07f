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

test_expect_success 'ranges: num_train_epochs -1 and 0 are refused alike, bounds are written in full' '
	for v in -1 0 70000; do
		test_must_fail bk-bake --dry-run small.yaml --num_train_epochs $v 2>err >/dev/null &&
		grep -q "field .num_train_epochs.: $v is not in (0, 65536]" err || return 1
	done &&
	test_must_fail bk-bake --dry-run small.yaml --trajectory_length 2000000 2>err >/dev/null &&
	grep -q "field .trajectory_length.: 2000000 is not in \[1, 1048576\]" err &&
	test_must_fail bk-bake --dry-run small.yaml --top_p 2 2>err >/dev/null &&
	grep -q "field .top_p.: 2 is not in \[1e-09, 1\]" err
'

test_expect_success 'bk-bake on a model with no chat template: raw, said once' '
	grep -v "^template:" small.yaml >nt.yaml &&
	bk-bake --dry-run nt.yaml 2>err >plan &&
	test $(grep -c "has no chat template" err) = 1 &&
	grep -q "^bk-bake: warning: $MODELS/stories260K has no chat template .*baking with .raw.*where the tool fails" err &&
	grep -q "^bk-tokenize .*--template raw" plan &&
	bk-bake --dry-run small.yaml 2>err >/dev/null && ! grep -q "chat template" err
'

test_expect_success 'a resumed bake keeps the steps before its checkpoint: metrics.bk and log_history' '
	bk-bake small.yaml --output_dir rs --num_train_epochs 3 >/dev/null 2>&1 &&
	bk-dump rs/metrics.bk | jq -c "select(.step) | [.step, .loss]" >steps.full &&
	test $(wc -l <steps.full) = 3 &&
	jq -c "[.log_history[] | [.step, .loss]]" rs/checkpoint-3/trainer_state.json >lh.full &&
	test "$(jq -c "map(.[0])" lh.full)" = "[1,2,3]" &&
	bk-bake small.yaml --output_dir rs --num_train_epochs 3 --resume_from_checkpoint rs/checkpoint-1 >/dev/null 2>&1 &&
	bk-dump rs/metrics.bk | jq -c "select(.step) | [.step, .loss]" >steps &&
	test_cmp steps.full steps && ! test -e rs/metrics.bk.resumed &&
	bk-dump rs/metrics.bk | jq -s -e "map(select(.final)) | length == 1" &&
	jq -c "[.log_history[] | [.step, .loss]]" rs/checkpoint-3/trainer_state.json >lh &&
	test_cmp lh.full lh &&
	jq -c "[.log_history[] | [.step, .loss]]" rs/final_model/trainer_state.json >lh.final &&
	test_cmp lh.full lh.final
'

# SIGINT to bk-bake alone (not its process group): bk-step must stop at a checkpoint,
# not train every step and then have the bake thrown away
test_expect_success 'SIGINT to bk-bake alone stops bk-step at a checkpoint; the bake resumes from it' '
	{ bk-bake small.yaml --output_dir si --num_train_epochs 150 --save_steps 100000 >si.out 2>si.err & bp=$!; } &&
	for i in $(seq 300); do test $(stat -c %s si/metrics.bk 2>/dev/null || echo 0) -gt 1500 && break; sleep 0.1; done &&
	kill -INT $bp; wait $bp; rc=$?
	test $rc = 130 && grep -q "interrupted by signal 2" si.err &&
	ck=$(cd si && ls -d checkpoint-*) && n=${ck#checkpoint-} && test $n -lt 150 &&
	! test -e si/final && ! test -e si/final_model && ! test -e si/results.json &&
	grep -q "interrupted by signal 2 at step $n; saved si/$ck" si/logs/bk-step.log &&
	bk-bake small.yaml --output_dir si --num_train_epochs 150 --save_steps 100000 \
		--resume_from_checkpoint true >/dev/null 2>&1 &&
	grep -q "resuming from si/$ck at step $n" si/logs/bk-step.log &&
	test -f si/final_model/adapter_model.safetensors && jq -e ".bakery.train.steps == 150" si/results.json &&
	test "$(bk-dump si/metrics.bk | jq -s -c "map(select(.step) | .step) == [range(1; 151)]")" = true
'

M="$MODELS/stories260K"
printf 'Once upon a time\nThe dragon said\nLily went to the park\nA cat sat\n' >p.txt
bk-tokenize --model "$M" --system "Sparky the dragon." p.txt 2>/dev/null | bk-lens -q --max-tokens 64 |
	bk-gen --model "$M" --device cpu --num-trajectories 1 --max-new-tokens 6 2>/dev/null |
	bk-teach --model "$M" --device cpu --top-k 8 2>/dev/null >teach.bk
S="--model $M --device cpu --lora-r 2 --max-steps 2"

test_expect_success 'bk-eval refuses an empty expected answer (a substring of every response)' '
	printf "[{\"question\": \"Who?\", \"answer\": \"\"}]" >e1.json &&
	test_must_fail bk-eval --model "$M" --device cpu --system S --eval e1.json -o r.json 2>err &&
	grep -q "^bk-eval: error: e1.json: record 1: the answer is empty" err && ! test -e r.json &&
	printf "[{\"question\": \"Who?\", \"answer\": [\"dragon\", \"\"]}]" >e2.json &&
	test_must_fail bk-eval --model "$M" --device cpu --system S --eval e2.json 2>err >/dev/null &&
	grep -q "e2.json: record 1: answer item 1 is empty" err &&
	printf "{\"question\": \"Who?\", \"answer\": \"dragon\"}\n{\"question\": \"Who?\", \"answer\": \"<think>x</think>\"}\n" >e3.jsonl &&
	test_must_fail bk-eval --model "$M" --device cpu --system S --held-out e3.jsonl 2>err >/dev/null &&
	grep -q "e3.jsonl: line 2: the answer is empty" err
'

# until FILE holds a line (at most ~20 s)
wait_for_line() { for i in $(seq 200); do test -s "$1" && return 0; sleep 0.1; done; return 1; }
test_expect_success 'two bk-step runs into one --out: the second is refused naming the first one.s pid' '
	mkfifo in.fifo &&
	{ bk-step $S --out o --overwrite in.fifo >/dev/null 2>step1.err & p1=$!; } &&
	wait_for_line o/.bk-step.lock &&
	test_must_fail bk-step $S --out o --overwrite teach.bk >/dev/null 2>err; rc=$?
	timeout 30 sh -c "cat teach.bk >in.fifo"; wait $p1 && test $rc = 0 &&
	grep -q "^bk-step: error: --out o is in use by another bk-step run (pid $p1)" err &&
	test -f o/final/adapter_model.safetensors && ! test -e o/.bk-step.lock &&
	bk-step $S --out o --overwrite teach.bk >/dev/null 2>&1 && ! test -e o/.bk-step.lock
'

test_expect_success 'a refused bk-step leaves no --out behind; a bake in use is refused in one line' '
	test_must_fail bk-step $S --out new-out p.txt 2>err && ! test -e new-out &&
	mkdir held && echo 4242 >held/.bk-bake.lock &&
	{ flock held/.bk-bake.lock sleep 30 & fp=$!; } &&
	for i in $(seq 100); do flock -n held/.bk-bake.lock true || break; sleep 0.1; done &&
	test_must_fail bk-bake small.yaml --output_dir held 2>err; rc=$?; kill $fp; wait $fp 2>/dev/null
	test $rc = 0 && grep -q "^bk-bake: error: output_dir held is in use by another bk-bake run (pid 4242)" err &&
	! test -e held/logs
'

test_done
