#!/usr/bin/env bash
# bk-bake's memory plan (gpu/memplan.c): --dry-run --gpu-memory on real model shapes
# (tests/golden/memplan: config.json only, a BPE tokenizer put next to it) at the Python
# tool's basic shape (2 prompts x 4 trajectories x 256 tokens, all linears): the
# issue's targets at r 16 and r 64, the plan's lines and choices in the commands, a
# one-line refusal; and a real bake on stories260K whose GPU stages run one after another
# through files because of --gpu-memory, with the pipe's adapter bit for bit.
. "$(dirname "$0")/lib.sh"
G="$ROOT/tests/golden"

model() { # NAME TOKENIZER: a copy of the shape with its tokenizer
	mkdir -p "$1" && cp "$G/memplan/$1"/* "$1"/ && xz -dc "$G/bpe/$2.tokenizer.json.xz" >"$1/tokenizer.json"
}

yaml() { basic_shape_yaml "$@"; } # MODEL R [extra lines]: tests/lib.sh

# the peak of "fits: yes, peak X GiB of Y GiB" at or below a bound
peak_at_most() { awk -v b="$2" '/^fits: yes, peak / { p = $4 } END { exit !(p != "" && p <= b) }' "$1"; }

test_expect_success 'setup: the shapes and their tokenizers' '
	model Qwen3-1.7B qwen && model Qwen3-4B qwen && model Qwen3-8B qwen &&
	model Llama-3.1-8B-Instruct llama-bpe
'

test_expect_success 'Qwen3-8B and Llama-3.1-8B at r 16 fit 24 GiB with 1 GiB to spare' '
	yaml Qwen3-8B 16 >q8.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB q8.yaml >plan 2>err &&
	tail -n 1 plan | grep -q "^fits: yes, peak [0-9.]* GiB of 24.00 GiB$" &&
	peak_at_most plan 23 &&
	yaml Llama-3.1-8B-Instruct 16 "template: llama3" >l8.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB l8.yaml >plan-l 2>err &&
	tail -n 1 plan-l | grep -q "^fits: yes" && peak_at_most plan-l 23
'

test_expect_success 'at r 64 they fit, or the one line says what to change' '
	for y in q8 l8; do
		sed "s/^lora_r: 16/lora_r: 64/" $y.yaml >$y-64.yaml &&
		if bk-bake --dry-run --gpu-memory 24GiB $y-64.yaml >plan64 2>err; then
			tail -n 1 plan64 | grep -q "^fits: yes" || exit 1
		else
			test $(grep -c "" err) = 1 && grep -q "does not fit: .*lower lora_r" err &&
			tail -n 1 plan64 | grep -q "^fits: no" || exit 1
		fi
	done
'

test_expect_success 'a GPU where checkpointing every layer does not fit: checkpoints in segments (the same result) before a micro-batch split' '
	grep -v "^teacher_top_k" l8.yaml | sed "s/^lora_r: 16/lora_r: 64/" >l8x.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB l8x.yaml >p24 2>err &&
	grep -q "^# chose: gradient checkpointing$" p24 &&
	bk-bake --dry-run --gpu-memory 21.5GiB l8x.yaml >p22 2>err &&
	grep -q "^# chose: gradient checkpointing; its checkpoints every [0-9]* layers" p22 &&
	grep -q "^#   activations (checkpointed in segments)  *[0-9.]* MiB" p22 &&
	grep -q "bk-step .*--grad-checkpoint --grad-checkpoint-every [0-9]* " p22 &&
	! grep -q "micro-batches" p22 && tail -n 1 p22 | grep -q "^fits: yes"
'

test_expect_success 'Qwen3-4B and Qwen3-1.7B fit at r 64' '
	yaml Qwen3-4B 64 >q4.yaml && yaml Qwen3-1.7B 64 >q17.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB q4.yaml >plan4 &&
	tail -n 1 plan4 | grep -q "^fits: yes" &&
	bk-bake --dry-run --gpu-memory 24GiB q17.yaml >plan17 &&
	tail -n 1 plan17 | grep -q "^fits: yes" &&
	grep -q "^# the pipe: bk-gen .* + bk-teach .* + bk-step .* (side by side)$" plan17 &&
	grep -v "^teacher_top_k" q17.yaml >q17x.yaml &&
	bk-bake --dry-run --gpu-memory 24GiB q17x.yaml >plan17x &&
	grep -q "^# the pipe: bk-gen .* + bk-step .* (side by side)$" plan17x && ! grep -q "^# bk-teach$" plan17x
'

test_expect_success 'the plan names each buffer and its allocation site; the commands carry the choices (one shared copy of the weights: side by side; each its own: one after another)' '
	grep -q "^# bk-gen$" plan && grep -q "^# bk-teach$" plan && grep -q "^# bk-step$" plan &&
	grep -q "^#   KV pool  *[0-9.]* MiB  gpu/gen.c pool_grow" plan &&
	grep -q "^#   activations (forward)  *[0-9.]* MiB  gpu/teach.c ensure_acts: bk_acts_create_fwd" plan &&
	grep -q "^#   activations (checkpointed)  *[0-9.]* MiB  gpu/model.c bk_acts_create_ckpt" plan &&
	grep -q "^#   AdamW m, v (fp32)  *[0-9.]* MiB  gpu/train.c optim_create" plan &&
	grep -q "^#   base weights  *15622.6 MiB  gpu/model.c bk_model_create" plan &&
	grep -q "^#   peak  " plan &&
	grep -q "^# chose: gradient checkpointing$" plan &&
	grep -q "^# one copy of the weights (15.26 GiB) mapped by every stage" plan &&
	: "bk-gen decodes at most the samples of one optimizer step (2 prompts x 4)" &&
	grep -q "bk-gen .*--max-batch 8 --max-prompt [0-9]* |$" plan &&
	grep -q "bk-teach .*--max-tokens 1024 |$" plan &&
	BK_SHARE_WEIGHTS=0 bk-bake --dry-run --gpu-memory 24GiB q8.yaml >plan-own 2>err &&
	grep -q "^# chose: gradient checkpointing; .*one after another" plan-own &&
	grep -q "bk-gen .*--max-prompt [0-9]* >.*/gen.bk$" plan-own &&
	grep -q "^bk-teach .*<.*/gen.bk >.*/teach.bk$" plan-own &&
	grep -q "^bk-step .*--grad-checkpoint .*<.*/teach.bk >.*/metrics.bk$" plan-own &&
	test ! -e "$TEST_TMP/out-Qwen3-8B"
'

test_expect_success 'BK_LINEAR=v3 adds the stacked weight copies to bk-step; BK_ACT=bf16 shrinks bk-step.s activations' '
	BK_LINEAR=v3 bk-bake --dry-run q17.yaml >plan-v3 &&
	grep -q "^#   v3: stacked weight copies  *[0-9.]* MiB  gpu/cuda/cuda_proj.cuh" plan-v3 &&
	tail -n 1 plan-v3 | grep -q "^fits: unknown, peak [0-9.]* GiB (give --gpu-memory SIZE)$" &&
	bk-bake --dry-run q17.yaml >plan-fp32 && BK_ACT=bf16 bk-bake --dry-run q17.yaml >plan-bf16 &&
	a=$(awk "/^#   activations  / { print \$3 }" plan-fp32) &&
	b=$(awk "/^#   activations  / { print \$3 }" plan-bf16) &&
	test -n "$a" && test -n "$b" &&
	awk -v a=$a -v b=$b "BEGIN { exit !(b < a) }" &&
	test_must_fail env BK_LINEAR=v9 bk-bake --dry-run q17.yaml >/dev/null 2>err &&
	grep -q "BK_LINEAR=.v9.: expected v1" err
'

test_expect_success 'a GPU too small is refused up front in one line' '
	test_must_fail bk-bake --dry-run --gpu-memory 12GiB q8.yaml >plan12 2>err &&
	test $(grep -c "" err) = 1 &&
	grep -q "^bk-bake: error: q8.yaml: the bake does not fit: the model.s weights alone take 15.3 GiB of the GPU.s 12.0 GiB" err &&
	tail -n 1 plan12 | grep -q "^fits: no" &&
	test_must_fail bk-bake --gpu-memory 12GiB q8.yaml 2>err &&
	grep -q "does not fit" err && test ! -e "$TEST_TMP/out-Qwen3-8B/gen.bk" &&
	test_must_fail --exit 2 bk-bake --dry-run --gpu-memory lots q8.yaml 2>err &&
	grep -q "gpu-memory .lots. is not a size" err
'

test_expect_success 'bk-gen --max-prompt: the KV cache planned, the same samples; a longer prompt refused in one line' '
	M="$MODELS/stories260K" &&
	bk-tokenize --model "$M" --system "Sparky the dragon lives in a big castle." "$DATA/pipe/stories.txt" >s.bk 2>/dev/null &&
	bk-gen --device cpu --model "$M" --max-new-tokens 12 --max-batch 3 s.bk 2>/dev/null | bk-dump >a.jsonl &&
	n=$(bk-dump s.bk | jq -s "map(.t_prompt | length) | max") &&
	bk-gen --device cpu --model "$M" --max-new-tokens 12 --max-batch 3 --max-prompt $n s.bk 2>/dev/null |
		bk-dump >b.jsonl &&
	test_cmp a.jsonl b.jsonl &&
	test_must_fail bk-gen --device cpu --model "$M" --max-prompt $((n - 1)) s.bk >/dev/null 2>err &&
	grep -q "s.bk.*t_prompt. has $n tokens, more than --max-prompt $((n - 1))" err
'

test_expect_success 'stages one after another (--gpu-memory) give the pipe.s adapter bit for bit (top-k and exact)' '
	T="$DATA/bake/tiny.yaml --model_name_or_path $MODELS/stories260K" &&
	bk-bake $T --teacher_top_k 64 --output_dir pipe >sum1 &&
	bk-bake --gpu-memory 1GiB $T --teacher_top_k 64 --output_dir seq >sum2 2>err &&
	cat err &&
	grep -q "^bk-bake: memory plan: chose the GPU stages one after another" err &&
	grep -q "^bk-bake: memory plan: fits, peak" err &&
	test -s seq/gen.bk && test -s seq/teach.bk && test ! -e pipe/gen.bk &&
	cmp pipe/final_model/adapter_model.safetensors seq/final_model/adapter_model.safetensors &&
	bk-bake $T --output_dir pipex >sum3 &&
	bk-bake --gpu-memory 1GiB $T --output_dir seqx >sum4 2>err &&
	grep -q "^bk-bake: memory plan: chose the GPU stages one after another" err &&
	test -s seqx/gen.bk && test ! -e seqx/teach.bk &&
	cmp pipex/final_model/adapter_model.safetensors seqx/final_model/adapter_model.safetensors
'

test_done
