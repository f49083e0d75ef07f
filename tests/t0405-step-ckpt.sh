#!/usr/bin/env bash
# bk-step --resume refuses a damaged or inconsistent checkpoint in one line naming the
# file and key: checksums of the data files (over the bytes that are loaded, each file
# read once), progress against itself and the plan; an intact one (and one of an older
# bakery, with a warning) resumes bit for bit.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
export XDG_CACHE_HOME="$TEST_TMP/cache"
export OMP_NUM_THREADS=1
set -o pipefail

bk-tokenize --model "$M" --system "Sparky is a friendly dragon who lives in a cave." \
	"$DATA/pipe/bake.json" 2>/dev/null | bk-lens -q --max-tokens 128 >b.bk
# 6 records, 4 bk-lens batches: 4 steps an epoch, 8 in all, a checkpoint at each
F="--model $M --device cpu --lora-r 8 --lr 2e-3 --epochs 2 --save-steps 1 --seed 3"
bk-step $F --out c0 b.bk >/dev/null 2>&1

# damaged NAME CKPT JQ-EXPR: a copy of c0/CKPT with its trainer_state.json edited
damaged() {
	rm -rf "$1" && mkdir "$1" && cp -a "c0/$2" "$1/" &&
	jq "$3" "$1/$2/trainer_state.json" >x.json && mv x.json "$1/$2/trainer_state.json"
}
# refused NAME CKPT PATTERN: --resume exits 1 with one line matching PATTERN, writes nothing
refused() {
	ls "$1" >before &&
	test_must_fail bk-step $F --out "$1" --resume "$1/$2" b.bk >/dev/null 2>err &&
	test $(wc -l <err) -eq 1 && grep -q -- "$3" err && ls "$1" >after && test_cmp before after
}

test_expect_success 'checkpoints record a checksum of each data file' '
	jq -e ".version == 2 and (.checksums | keys) == [\"adapter_config.json\",
		\"adapter_model.safetensors\", \"trainer_state.safetensors\"] and
		(.checksums | all(.[]; test(\"^xxh3-64:[0-9a-f]{16}$\")))" c0/checkpoint-3/trainer_state.json
'

test_expect_success 'an intact checkpoint resumes to the same adapter (mid-epoch and at an epoch end)' '
	damaged ok checkpoint-3 . && bk-step $F --out ok --resume ok/checkpoint-3 b.bk >/dev/null 2>err &&
	! grep -q warning err && cmp c0/final/adapter_model.safetensors ok/final/adapter_model.safetensors &&
	damaged ok4 checkpoint-4 . && jq -e ".progress | .epoch == 0 and .micro_in_epoch == 4" \
		ok4/checkpoint-4/trainer_state.json &&
	bk-step $F --out ok4 --resume ok4/checkpoint-4 b.bk >/dev/null 2>&1 &&
	cmp c0/final/adapter_model.safetensors ok4/final/adapter_model.safetensors &&
	damaged ok5 checkpoint-4 ".progress.epoch = 1 | .progress.micro_in_epoch = 0 | .progress.records_in_epoch = 0" &&
	bk-step $F --out ok5 --resume ok5/checkpoint-4 b.bk >/dev/null 2>&1 &&
	cmp c0/final/adapter_model.safetensors ok5/final/adapter_model.safetensors
'

# the checksums are taken over the bytes the loaders then parse: one read of each file
if command -v strace >/dev/null && strace -o /dev/null true 2>/dev/null; then
test_expect_success 'a resume opens each checksummed data file once' '
	damaged once checkpoint-3 . &&
	# (LeakSanitizer, under make asan, does not run under ptrace)
	ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" strace -f -e trace=open,openat \
		-o trace bk-step $F --out once --resume once/checkpoint-3 b.bk >/dev/null 2>&1 &&
	cmp c0/final/adapter_model.safetensors once/final/adapter_model.safetensors &&
	for f in adapter_model.safetensors adapter_config.json trainer_state.safetensors; do
		n=$(grep -c "\"once/checkpoint-3/$f\"" trace) && echo "$f: opened $n times" &&
		test $n -eq 1 || return 1
	done
'
else
	echo "ok - # skip: no strace here (a resume opens each data file once)"
fi

test_expect_success 'a flipped byte in the adapter, its config or the optimizer state is refused, naming the file' '
	damaged d1 checkpoint-3 . &&
	printf A | dd of=d1/checkpoint-3/adapter_model.safetensors bs=1 seek=150000 conv=notrunc 2>/dev/null &&
	refused d1 checkpoint-3 "d1/checkpoint-3/adapter_model.safetensors: damaged or changed since it was saved" &&
	damaged d2 checkpoint-3 . &&
	printf A | dd of=d2/checkpoint-3/trainer_state.safetensors bs=1 seek=150000 conv=notrunc 2>/dev/null &&
	refused d2 checkpoint-3 "d2/checkpoint-3/trainer_state.safetensors: damaged" &&
	damaged d3 checkpoint-3 . && sed -i "s/\"r\": 8/\"r\": 8 /" d3/checkpoint-3/adapter_config.json &&
	refused d3 checkpoint-3 "d3/checkpoint-3/adapter_config.json: damaged" &&
	damaged d4 checkpoint-3 . && rm d4/checkpoint-3/trainer_state.safetensors &&
	refused d4 checkpoint-3 "d4/checkpoint-3/trainer_state.safetensors: missing" &&
	damaged d5 checkpoint-3 "del(.checksums)" &&
	refused d5 checkpoint-3 "trainer_state.json: key .checksums. is missing"
'

test_expect_success 'progress that contradicts itself or the plan is refused, naming the key' '
	T=trainer_state.json &&
	damaged p1 checkpoint-3 ".progress.epoch = 1" &&
	refused p1 checkpoint-3 "p1/checkpoint-3/$T: key .progress.epoch. is 1, step 3 is in epoch 0 (4 steps an epoch)" &&
	damaged p2 checkpoint-3 ".progress.micro_in_epoch = 2" &&
	refused p2 checkpoint-3 "$T: key .progress.micro_in_epoch. is 2, step 3 has trained 3 of epoch 0.s 4" &&
	damaged p3 checkpoint-3 ".progress.order_seed = \"4\"" &&
	refused p3 checkpoint-3 "$T: key .progress.order_seed. is 4, this run.s (--seed) 3" &&
	damaged p4 checkpoint-3 ".progress.loss_sum = -5" &&
	refused p4 checkpoint-3 "$T: key .progress.loss_sum. is -5, below 0" &&
	damaged p5 checkpoint-3 ".progress.elapsed = -1" &&
	refused p5 checkpoint-3 "$T: key .progress.elapsed. is -1, below 0" &&
	damaged p6 checkpoint-3 ".progress.records_in_epoch -= 1 | .progress.records -= 1" &&
	refused p6 checkpoint-3 "$T: key .progress.records_in_epoch. is 5, the first 3 micro-batches of epoch 0 hold 6" &&
	damaged p7 checkpoint-3 ".progress.records += 6" &&
	refused p7 checkpoint-3 "$T: key .progress.records. is 12" &&
	damaged p8 checkpoint-3 ".progress.order_seed = \"3x\"" &&
	refused p8 checkpoint-3 "$T: key .progress.order_seed. \"3x\" is not a decimal" &&
	damaged p9 checkpoint-3 ".progress.tokens = -1" &&
	refused p9 checkpoint-3 "$T: key .progress.tokens. is -1, below 0" &&
	damaged p10 checkpoint-3 ".log_history = [{step: 7, loss: 1}]" &&
	refused p10 checkpoint-3 "$T: key .log_history. entry 0 is at step 7"
'

test_expect_success 'over a pipe: progress against the steps taken' '
	P="--model $M --device cpu --lora-r 8 --lr 2e-3 --max-steps 3 --save-steps 1 --seed 3" &&
	bk-step $P --out q0 - <b.bk >/dev/null 2>&1 &&
	mkdir q1 && cp -a q0/checkpoint-2 q1/ &&
	bk-step $P --out q1 --resume q1/checkpoint-2 - <b.bk >/dev/null 2>&1 &&
	cmp q0/final/adapter_model.safetensors q1/final/adapter_model.safetensors &&
	mkdir q2 && cp -a q0/checkpoint-2 q2/ &&
	jq ".progress.epoch = 1" q2/checkpoint-2/trainer_state.json >x.json &&
	mv x.json q2/checkpoint-2/trainer_state.json &&
	test_must_fail bk-step $P --out q2 --resume q2/checkpoint-2 - <b.bk >/dev/null 2>err &&
	grep -q "q2/checkpoint-2/trainer_state.json: key .progress.epoch. is 1, a run over a pipe has epoch 0" err &&
	mkdir q3 && cp -a q0/checkpoint-2 q3/ &&
	jq ".progress.micro_in_epoch = 1" q3/checkpoint-2/trainer_state.json >x.json &&
	mv x.json q3/checkpoint-2/trainer_state.json &&
	test_must_fail bk-step $P --out q3 --resume q3/checkpoint-2 - <b.bk >/dev/null 2>err &&
	grep -q "key .progress.micro_in_epoch. is 1, 2 steps at --grad-accum 1 train 2 micro-batches$" err
'

test_expect_success 'a checkpoint of an older bakery (version 1, no checksums) resumes with a warning' '
	damaged v1 checkpoint-3 "del(.checksums) | .version = 1" &&
	bk-step $F --out v1 --resume v1/checkpoint-3 b.bk >/dev/null 2>err &&
	grep -q "warning: v1/checkpoint-3/trainer_state.json: trainer state version 1 (an older bakery) records no checksums" err &&
	cmp c0/final/adapter_model.safetensors v1/final/adapter_model.safetensors &&
	damaged v3 checkpoint-3 ".version = 3" &&
	refused v3 checkpoint-3 "trainer state version 3, this bk-step reads 1 to 2"
'

test_done
