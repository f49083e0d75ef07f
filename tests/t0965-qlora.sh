#!/usr/bin/env bash
# QLoRA (--load-in-4bit, the tool's load_in_4bit): the stages on stories260K with the
# base linears in 4 bits (host twin), their flags and refusals, a resume that changes the
# 4-bit setting refused, bk-bake's mapping of the tool's fields, and the memory plan's
# targets on 24 GiB: Qwen3-14B at r 16, Llama-3.1-8B-Instruct at r 64.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
G="$ROOT/tests/golden"
export XDG_CACHE_HOME="$TEST_TMP/cache"
export OMP_NUM_THREADS=1
set -o pipefail
rc() { # N CMD...: CMD exits with status N
	local want=$1; shift
	"$@"
	test $? = "$want"
}
Q="--load-in-4bit --bnb-4bit-quant-type nf4 --bnb-4bit-use-double-quant 1 --bnb-4bit-compute-dtype float32"

bk-tokenize --model "$M" --system "Sparky is a friendly dragon who lives in a cave." \
	"$DATA/pipe/bake.json" 2>/dev/null | bk-lens -q --max-tokens 128 >b.bk

test_expect_success 'bk-teach --load-in-4bit: the teacher of the quantised base (another one)' '
	bk-teach --device cpu --model "$M" --top-k 0 b.bk | bk-dump >full.jsonl &&
	bk-teach --device cpu --model "$M" --top-k 0 $Q b.bk | bk-dump >q4.jsonl &&
	bk-teach --device cpu --model "$M" --top-k 0 $Q b.bk | bk-dump >q4b.jsonl &&
	cmp q4.jsonl q4b.jsonl &&
	test $(wc -l <q4.jsonl) = $(wc -l <full.jsonl) &&
	! cmp -s full.jsonl q4.jsonl &&
	bk-teach --device cpu --model "$M" --top-k 0 --load-in-4bit --bnb-4bit-quant-type fp4 b.bk |
		bk-dump >fp4.jsonl && ! cmp -s q4.jsonl fp4.jsonl
'

test_expect_success 'bk-step --load-in-4bit trains a PEFT adapter; the setting is recorded' '
	F="--model $M --device cpu --lora-r 8 --lora-alpha 16 --lr 2e-3 --epochs 1" &&
	bk-step $F --out o4 $Q b.bk >/dev/null 2>err &&
	bk-step $F --out o0 b.bk >/dev/null 2>err &&
	test -s o4/final/adapter_model.safetensors &&
	! cmp -s o4/final/adapter_model.safetensors o0/final/adapter_model.safetensors &&
	jq -e ".settings[\"load-in-4bit\"] == \"nf4,double-quant,float32\"" o4/final/trainer_state.json &&
	jq -e ".settings[\"load-in-4bit\"] == \"no\"" o0/final/trainer_state.json &&
	jq -e ".base_model_name_or_path and .peft_type == \"LORA\"" o4/final/adapter_config.json
'

test_expect_success 'a resume with another 4-bit setting is refused, naming it' '
	F="--model $M --device cpu --lora-r 8 --lora-alpha 16 --lr 2e-3 --epochs 2 --save-steps 1" &&
	bk-step $F --out r4 --max-steps 1 $Q b.bk >/dev/null 2>&1 &&
	ck=$(ls -d r4/checkpoint-* | head -1) &&
	rc 1 bk-step $F --out r4 --max-steps 1 --resume "$ck" b.bk >/dev/null 2>err &&
	grep -q "load-in-4bit no differs from the checkpoint.s nf4,double-quant,float32" err
'

test_expect_success 'a teacher stream records its 4-bit setting; bk-step refuses a student of another, naming both' '
	bk-teach --device cpu --model "$M" --top-k 8 $Q b.bk 2>/dev/null >t4.bk &&
	bk-dump --header t4.bk | head -1 | jq -e ".provenance[-1] | .load_in_4bit ==
		\"nf4,double-quant,float32\" and .bnb_4bit_threads == 1" &&
	bk-teach --device cpu --model "$M" --top-k 8 b.bk 2>/dev/null >t0.bk &&
	bk-dump --header t0.bk | head -1 | jq -e ".provenance[-1] | .load_in_4bit == \"no\" and
		.bnb_4bit_threads == 0" &&
	F="--model $M --device cpu --lora-r 8 --max-steps 1" &&
	test_must_fail bk-step $F --out s4 t4.bk 2>err >/dev/null &&
	grep -q "t4.bk: the teacher field was made with the 4-bit setting nf4,double-quant,float32, this run.s is no" err &&
	test_must_fail bk-step $F --out s4 --load-in-4bit --bnb-4bit-quant-type fp4 t4.bk 2>err >/dev/null &&
	grep -q "t4.bk: .* setting nf4,double-quant,float32, this run.s is fp4,double-quant,bfloat16" err &&
	test_must_fail bk-step $F --out s4 $Q t0.bk 2>err >/dev/null &&
	grep -q "t0.bk: .* setting no, this run.s is nf4,double-quant,float32" err &&
	test_must_fail bk-step $F --out s4 $Q --eval-final --eval t0.bk t4.bk 2>err >/dev/null &&
	grep -q "t0.bk: .* setting no, this run.s is nf4" err && ! test -e s4 &&
	bk-step $F --out s4 $Q --eval-final --eval t4.bk t4.bk >/dev/null 2>&1 && test -d s4/final &&
	bk-step $F --out s0 $Q b.bk >/dev/null 2>&1 && test -d s0/final &&
	bk-tokenize --model "$M" --system "Sparky." --prompt "Once upon a time" 2>/dev/null |
		bk-gen --device cpu --model "$M" --num-trajectories 2 --max-new-tokens 8 --seed 1 \
			--teacher-top-k 4 --load-in-4bit --bnb-4bit-quant-type fp4 >g4.bk &&
	bk-dump --header g4.bk | head -1 | jq -e ".provenance[-1].load_in_4bit == \"fp4,double-quant,bfloat16\"" &&
	test_must_fail bk-step $F --out s5 --batch-size 2 $Q g4.bk 2>err >/dev/null &&
	grep -q "g4.bk: .* setting fp4,double-quant,bfloat16, this run.s is nf4" err
'

# a weight of more than 32768 blocks (gate/up/down: 2.56M values): double quantisation's
# mean depends on the torch thread count
"$BK_BIN/../bench/make_model" big 64 1 8 4 40000 512 "$M/tokenizer.model" f32 3 >/dev/null
test_expect_success 'the torch thread count: recorded, a resume and the next stage quantise with it' '
	F="--model big --device cpu --lora-r 8 --lr 2e-3 --epochs 2 --save-steps 1 --seed 3 --lora-dropout 0" &&
	OMP_NUM_THREADS=1 bk-step $F $Q --out h1 b.bk >/dev/null 2>&1 &&
	jq -e ".settings[\"torch-threads\"] == \"1\"" h1/checkpoint-2/trainer_state.json &&
	mkdir h2 && cp -a h1/checkpoint-2 h2/ &&
	MKL_DYNAMIC=false OMP_NUM_THREADS=4 bk-step $F $Q --out h2 --resume h2/checkpoint-2 b.bk >/dev/null 2>&1 &&
	cmp h1/final/adapter_model.safetensors h2/final/adapter_model.safetensors &&
	jq -e ".settings[\"torch-threads\"] == \"1\"" h2/final/trainer_state.json &&
	MKL_DYNAMIC=false OMP_NUM_THREADS=3 bk-teach --device cpu --model big --top-k 8 $Q b.bk \
		2>/dev/null >tb.bk &&
	bk-dump --header tb.bk | head -1 | jq -e ".provenance[-1].bnb_4bit_threads == 3" &&
	OMP_NUM_THREADS=1 bk-step $F $Q --out h3 --max-steps 1 tb.bk >/dev/null 2>&1 &&
	jq -e ".settings[\"torch-threads\"] == \"3\"" h3/final/trainer_state.json
'

test_expect_success 'bk-gen and bk-eval take the flags' '
	bk-tokenize --model "$M" --system "Sparky." --prompt "Once upon a time" 2>/dev/null |
		bk-gen --device cpu --model "$M" --num-trajectories 2 --max-new-tokens 8 --seed 1 $Q |
		bk-dump >g.jsonl &&
	test $(wc -l <g.jsonl) -ge 1 &&
	bk-eval --device cpu --model "$M" --adapter o4/final --system "Sparky." \
		--kl-prompts "$DATA/pipe/bake.json" --kl-tokens 4 $Q -o res.json 2>/dev/null &&
	jq -e "type == \"object\"" res.json
'

test_expect_success 'bad 4-bit flags are usage errors naming the flag' '
	rc 2 bk-teach --device cpu --model "$M" --bnb-4bit-quant-type fp4 b.bk 2>err &&
	grep -q -- "--bnb-4bit-quant-type needs --load-in-4bit" err &&
	rc 2 bk-step --model "$M" --out x --load-in-4bit --bnb-4bit-quant-type int4 b.bk 2>err &&
	grep -q -- "--bnb-4bit-quant-type: .int4. is not nf4 or fp4" err &&
	rc 2 bk-gen --model "$M" --load-in-4bit --bnb-4bit-compute-dtype float16 b.bk 2>err &&
	grep -q -- "--bnb-4bit-compute-dtype: .float16. is not bfloat16 or float32" err &&
	rc 2 bk-eval --model "$M" --load-in-4bit --bnb-4bit-use-double-quant 2 --kl-prompts x --system s 2>err &&
	grep -q -- "--bnb-4bit-use-double-quant" err
'

test_expect_success 'a load_in_4bit bake of stories260K runs (CPU); its adapter is trained in 4 bits' '
	cat >bake.yaml <<EOF &&
model_name_or_path: $M
template: raw
system_prompt: "Sparky is a friendly dragon who lives in a cave."
prompts_file: $DATA/pipe/stories.txt
num_trajectories: 2
trajectory_length: 12
per_device_train_batch_size: 2
learning_rate: 2e-3
lora_r: 4
lora_alpha: 8
lora_dropout: 0
seed: 1
teacher_top_k: 16
output_dir: bake-out
use_cpu: true
load_in_4bit: true
bnb_4bit_quant_type: fp4
EOF
	bk-bake bake.yaml >bake.log 2>&1 &&
	jq -e ".settings[\"load-in-4bit\"] == \"fp4,double-quant,bfloat16\"" bake-out/final_model/trainer_state.json &&
	test -s bake-out/final_model/adapter_model.safetensors
'

model() { # NAME TOKENIZER: a copy of the shape with its tokenizer
	mkdir -p "$1" && cp "$G/memplan/$1"/* "$1"/ && xz -dc "$G/bpe/$2.tokenizer.json.xz" >"$1/tokenizer.json"
}

yaml() { basic_shape_yaml "$1" "$2" "load_in_4bit: true${3:+
$3}"; } # MODEL R [extra lines], in 4 bits

# the peak (GiB) of a stage in a plan: its "#   peak  X MiB" line after "# STAGE"
stage_peak() { awk -v s="# $2" '$0 == s { on = 1 } on && /^#   peak / { printf "%.2f\n", $3 / 1024; exit }' "$1"; }

test_expect_success 'setup: the shapes and their tokenizers' '
	model Qwen3-14B qwen && model Llama-3.1-8B-Instruct llama-bpe
'

test_expect_success 'bk-bake maps load_in_4bit onto bk-gen, bk-teach and bk-step' '
	yaml Qwen3-14B 16 >q14.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB q14.yaml >plan14 2>err &&
	for s in bk-gen bk-teach bk-step; do
		grep -E "^ *$s " plan14 | grep -q -- "--load-in-4bit --bnb-4bit-quant-type nf4 --bnb-4bit-use-double-quant 1 --bnb-4bit-compute-dtype bfloat16" ||
			{ echo "$s lacks the 4-bit flags"; exit 1; }
	done
'

test_expect_success 'Qwen3-14B at r 16 fits 24 GiB in 4 bits, and does not in bf16' '
	tail -n 1 plan14 | grep -q "^fits: yes, peak [0-9.]* GiB of 24.00 GiB$" &&
	grep -q "^#   4-bit base linears  *6500.0 MiB  gpu/model.c bk_model_create: ops->weight_upload_q4" plan14 &&
	grep -q "^#   base weights  *2968.3 MiB" plan14 &&
	grep -v "^load_in_4bit" q14.yaml >q14-bf16.yaml &&
	rc 1 bk-bake --dry-run --gpu-memory 24GiB q14-bf16.yaml >/dev/null 2>err &&
	grep -q "does not fit" err
'

test_expect_success 'Llama-3.1-8B-Instruct at r 64 fits 24 GiB in 4 bits, side by side on one quantised copy with >= 4 GiB to spare' '
	yaml Llama-3.1-8B-Instruct 64 "template: llama3" >l8.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB l8.yaml >plan8 2>err &&
	grep "^# one copy of the weights ([0-9.]* GiB) mapped by every stage" plan8 &&
	p=$(sed -n "s/^fits: yes, peak \([0-9.]*\) GiB of 24.00 GiB$/\1/p" plan8) && echo "side by side $p GiB" &&
	grep -q "(side by side)$" plan8 && awk -v p="$p" "BEGIN { exit !(p > 0 && p <= 20) }" &&
	for s in bk-gen bk-teach bk-step; do
		p=$(stage_peak plan8 $s) && echo "$s $p GiB" &&
		awk -v p="$p" "BEGIN { exit !(p > 0 && p <= 20) }" || exit 1
	done
'

test_expect_success 'without double quant the statistics take more: fp32 absmax per 64 weights' '
	yaml Llama-3.1-8B-Instruct 64 "template: llama3
bnb_4bit_use_double_quant: false" >l8n.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB l8n.yaml >plan8n 2>err &&
	a=$(awk "/^#   4-bit base linears/ { print \$5; exit }" plan8) &&
	b=$(awk "/^#   4-bit base linears/ { print \$5; exit }" plan8n) &&
	awk -v a="$a" -v b="$b" "BEGIN { exit !(b > a * 1.05) }"
'

test_done
