#!/usr/bin/env bash
# t0950-emu.sh - the CUDA engine on the emulated GPU (make emu: gpu/cuda compiled for the CPU
# against gpu/emu's runtime and cuBLAS, in build-emu/) against the host twin, tool by tool,
# under every selectable variant (BK_ATTN, BK_ACT, BK_LINEAR, BK_LOSS, BK_DECODE), on
# stories260K and on two tiny synthetic models of head dimension 64 (tests/emu/make_tiny.py:
# a Gemma-3 with q/k norms, GeGLU, sandwich norms, softcaps and a sliding window; a Qwen-2
# with q/k/v biases), so the tensor-core attention and bf16 activations run too.  Bounds
# (tests/emu/compare.py): run.sh's for bk-step (per step |dloss| <= 5 % |loss| + 1e-3, 1 %
# with BK_ACT=bf16; adapters within 10 % in L2), bf16 bounds for bk-teach's log-probs,
# check_gen.sh's for bk-gen (the first greedy difference only after a near tie), 5 % for
# bk-eval's KL; data-parallel bk-step on 2 ranks through the stand-in NCCL; and the
# kernels of tests/emu/test_*.cc on their own.  Ends with "kernels launched: N of M" over
# every __global__ of gpu/cuda/ (tests/emu's programs stay out of the count: the tools and
# the op checks must launch each): a kernel no run launched fails the test.
. "$(dirname "$0")/lib.sh"
emu_setup bin/bk-step
export BK_EMU_KERNEL_LOG="$TEST_TMP/kernels.log"
set -o pipefail
C="python3 $ROOT/tests/emu/compare.py"
# under ASan (make asan test: build-emu/asan) every run is about 4 times slower: the
# sanitized emulation runs the emulation's own test, the op checks, one bk-step per
# model, bk-teach's top-k and the decode invariance; the rest (and the kernel count) in
# the plain run
FULL=1
case $EMU_BUILD in */asan) FULL=0 ;; esac
SYS="Sparky is a friendly dragon who lives in a cave."

# step DIR-SUFFIX DEVICE MODEL STREAM [flags...]: a bk-step run and its metrics as JSON Lines
step() {
	local o=$1 dev=$2 m=$3 s=$4; shift 4
	rm -rf "o-$o" && bk-step --model "$m" --device "$dev" --lora-r 8 --lora-alpha 16 --lr 2e-3 \
		--seed 1 --logging-steps 1 --out "o-$o" "$@" "$s" >"m-$o.bk" 2>"e-$o" &&
		bk-dump "m-$o.bk" >"m-$o.jsonl" || { tail -3 "e-$o"; return 1; }
}
# same CPU-RUN CUDA-RUN [REL]: losses and adapters within bounds
same() {
	$C loss "m-$1.jsonl" "m-$2.jsonl" ${3:-} &&
		$C adapter "o-$1/final/adapter_model.safetensors" "o-$2/final/adapter_model.safetensors"
}

bk-tokenize --model "$M" --system "$SYS" "$DATA/pipe/stories.txt" -o tok.bk 2>/dev/null &&
	bk-gen --model "$M" --device cpu --num-trajectories 2 --max-new-tokens 24 --seed 1 tok.bk -o gen.bk 2>/dev/null &&
	bk-lens -q --max-tokens 256 --seed 1 gen.bk -o b.bk || echo "not ok - stories260K stream"

test_expect_success 'the emulation catches what it is there to catch (tests/emu/test_emu_runtime.cc: 19 planted mistakes and their fixes)' '
	env -u BK_EMU_KERNEL_LOG "$EMU_BUILD/tests/emu/test_emu_runtime" >rt.log 2>&1 || { cat rt.log; false; }
'

test_expect_success 'kernels on their own against the host twin (tests/emu/test_act_kernels, test_attention_tc, test_decode2, test_loss2, test_proj3)' '
	for t in test_act_kernels test_attention_tc test_decode2 test_loss2 test_proj3; do
		env -u BK_EMU_KERNEL_LOG "$EMU_BUILD/tests/emu/$t" >$t.log 2>&1 || { tail -20 $t.log; return 1; }
	done
'

test_expect_success 'the memory plan against the CUDA ops. own accounting, each stage within 10 % (test_memplan_cuda)' '
	(cd "$ROOT" && "$EMU_BUILD/tests/test_memplan_cuda") >mp.log 2>&1 || { tail -20 mp.log; false; }
'

test_expect_success 'the op table against the host twin (test_cuda_ops, every op and shape)' '
	"$EMU_BUILD/tests/gpu/test_cuda_ops" >ops.log 2>&1 || { tail -20 ops.log; false; } &&
	tail -1 ops.log | grep "0 failed"
'

# the default paths over 2 epochs (6 steps); each variant over 2 steps (every kernel of a
# step runs in each, and the optimizer's state across steps is the long run's)
test_expect_success 'bk-step cuda vs cpu on stories260K: dropout 0 and 0.1, BK_LINEAR v1/v2/v3, BK_LOSS v2' '
	step cpu0 cpu "$M" b.bk --lora-dropout 0 --epochs 2 &&
	step cuda0 cuda "$M" b.bk --lora-dropout 0 --epochs 2 && same cpu0 cuda0 &&
	[ $FULL = 1 ] || return 0
	step cpu1 cpu "$M" b.bk --lora-dropout 0.1 --max-steps 2 &&
	step cpu0s cpu "$M" b.bk --lora-dropout 0 --max-steps 2 &&
	for v in "BK_LINEAR=v1" "BK_LINEAR=v2" "BK_LINEAR=v3" "BK_LOSS=v2"; do
		(export $v; step "cuda1-$v" cuda "$M" b.bk --lora-dropout 0.1 --max-steps 2) && same cpu1 "cuda1-$v" || return 1
	done &&
	for v in "BK_LINEAR=v2" "BK_LINEAR=v3"; do
		(export $v; step "cuda0-$v" cuda "$M" b.bk --lora-dropout 0 --max-steps 2) && same cpu0s "cuda0-$v" || return 1
	done
'

if [ $FULL = 1 ]; then
# 4 steps over 2 epochs of 3: the resume at step 2 crosses the epoch boundary
test_expect_success 'bk-step cuda: gradient checkpointing (also in segments: the same bits), adamw8bit, a resume equal to the run it continues' '
	step cpuck cpu "$M" b.bk --lora-dropout 0.1 --grad-checkpoint --optim adamw8bit --epochs 2 --max-steps 4 --save-steps 2 &&
	step cudack cuda "$M" b.bk --lora-dropout 0.1 --grad-checkpoint --optim adamw8bit --epochs 2 --max-steps 4 --save-steps 2 &&
	same cpuck cudack &&
	step cudaseg cuda "$M" b.bk --lora-dropout 0.1 --grad-checkpoint-every 2 --optim adamw8bit --epochs 2 --max-steps 4 --save-steps 2 &&
	cmp o-cudack/final/adapter_model.safetensors o-cudaseg/final/adapter_model.safetensors &&
	rm -rf o-res && cp -r o-cudack o-res && rm -rf o-res/final o-res/checkpoint-4 &&
	bk-step --model "$M" --device cuda --lora-r 8 --lora-alpha 16 --lr 2e-3 --seed 1 --logging-steps 1 \
		--lora-dropout 0.1 --grad-checkpoint --optim adamw8bit --epochs 2 --max-steps 4 --save-steps 2 \
		--out o-res --resume o-res/checkpoint-2 b.bk >/dev/null 2>e-res &&
	cmp o-res/final/adapter_model.safetensors o-cudack/final/adapter_model.safetensors
'
fi

# intermediate 3 x hidden: the loss rows live in the acts (gpu/train.c rows_in_acts)
test_expect_success 'bk-step cuda vs cpu on a Llama with I = 3H (loss rows in the acts), checkpointed the same bits, fp32 and bf16 activations' '
	"$EMU_BUILD/bench/make_model" wide 64 2 4 2 192 512 "$M/tokenizer.model" f32 3 >/dev/null &&
	bk-tokenize --model wide --system "$SYS" "$DATA/pipe/stories.txt" 2>/dev/null |
	bk-gen --model wide --device cpu --num-trajectories 2 --max-new-tokens 24 --seed 1 2>/dev/null |
	bk-lens -q --max-tokens 256 --seed 1 -o w.bk &&
	step wcpu cpu wide w.bk --lora-dropout 0.1 --max-steps 3 &&
	step wcuda cuda wide w.bk --lora-dropout 0.1 --max-steps 3 && same wcpu wcuda &&
	step wcudack cuda wide w.bk --lora-dropout 0.1 --max-steps 3 --grad-checkpoint &&
	cmp o-wcuda/final/adapter_model.safetensors o-wcudack/final/adapter_model.safetensors &&
	(export BK_ACT=bf16; step wcudab cuda wide w.bk --lora-dropout 0.1 --max-steps 3 &&
		step wcudabck cuda wide w.bk --lora-dropout 0.1 --max-steps 3 --grad-checkpoint-every 2) &&
	same wcpu wcudab 0.01 &&
	cmp o-wcudab/final/adapter_model.safetensors o-wcudabck/final/adapter_model.safetensors
'

# the teacher streams of the emulated GPU, then 2 steps on each (exact KL from log-probs,
# top-k KL under BK_LOSS v1 and v2)
test_expect_success 'bk-teach cuda vs cpu on stories260K (top-k 8, BK_LOSS v1 and v2; full log-probs)' '
	bk-teach --model "$M" --device cpu --top-k 8 b.bk | bk-dump >t-cpu.jsonl &&
	bk-teach --model "$M" --device cuda --top-k 8 b.bk >t8.bk && bk-dump t8.bk >t-cuda.jsonl &&
	$C teach t-cpu.jsonl t-cuda.jsonl &&
	{ [ $FULL = 1 ] || return 0; } &&
	BK_LOSS=v2 bk-teach --model "$M" --device cuda --top-k 8 b.bk | bk-dump >t-cuda2.jsonl &&
	$C teach t-cpu.jsonl t-cuda2.jsonl &&
	bk-teach --model "$M" --device cuda --top-k 0 b.bk >t0.bk &&
	S="--lora-dropout 0 --max-steps 2" &&
	step cpuT cpu "$M" t0.bk $S && step cudaT cuda "$M" t0.bk $S && same cpuT cudaT &&
	step cpu8 cpu "$M" t8.bk $S && step cuda8 cuda "$M" t8.bk $S && same cpu8 cuda8 &&
	BK_LOSS=v2 step cuda8v2 cuda "$M" t8.bk $S && same cpu8 cuda8v2
'

# the generation ops at check_gen's small sizes (--tiny: the same checks and bounds on
# shapes that still span tiles, blocks and key splits; the realistic ones are for a GPU,
# tests/gpu/run.sh)
if [ $FULL = 1 ]; then
test_expect_success "bk-gen cuda on stories260K: check_gen --tiny (ops, greedy vs cpu but near ties) under BK_DECODE v1 and v2" '
	for d in v1 v2; do
		BK_DECODE=$d "$EMU_BUILD/tests/gpu/check_gen" --tiny >cg-$d.log 2>&1 &&
		(cd "$ROOT" && BK_DECODE=$d "$EMU_BUILD/tests/gpu/check_gen" --e2e) >>cg-$d.log 2>&1 ||
			{ tail -20 cg-$d.log; return 1; }
	done
'
fi

test_expect_success 'bk-gen cuda: the samples do not depend on --max-batch or a small --kv-memory (decode v1 and v2, graphs)' '
	head -3 "$DATA/pipe/stories.txt" >three.txt &&
	bk-tokenize --model "$M" --system "$SYS" three.txt -o three.bk 2>/dev/null &&
	G="bk-gen --model $M --device cuda --num-trajectories 2 --max-new-tokens 12 --seed 5" &&
	for d in v1 v2; do
		BK_DECODE=$d $G --max-batch 1 three.bk | bk-dump | jq -c "{id, resp}" >g1-$d &&
		BK_DECODE=$d $G --max-batch 5 three.bk | bk-dump | jq -c "{id, resp}" >g5-$d &&
		BK_DECODE=$d $G --max-batch 5 --kv-memory 200K three.bk | bk-dump | jq -c "{id, resp}" >gk-$d &&
		test_cmp g1-$d g5-$d && test_cmp g1-$d gk-$d && test $(wc -l <g1-$d) = 6 || return 1
	done
'

if [ $FULL = 1 ]; then
test_expect_success 'bk-eval cuda vs cpu (held-out KL of base and baked)' '
	printf "Once upon a time\nThe dragon said\n" >kl.txt &&
	bk-eval --model "$M" --device cpu --adapter o-cpu0/final --system "$SYS" --kl-prompts kl.txt --kl-tokens 16 >ev-cpu.json 2>/dev/null &&
	bk-eval --model "$M" --device cuda --adapter o-cpu0/final --system "$SYS" --kl-prompts kl.txt --kl-tokens 16 >ev-cuda.json 2>ev.err &&
	$C eval ev-cpu.json ev-cuda.json
'
fi

# a sampled bake trains on tokens each device sampled (bf16 logits on the GPU), so its
# losses are only checked finite; the paired bake (no sampling) is held to run.sh's bound
if [ $FULL = 1 ]; then
test_expect_success 'bk-bake --device cuda: a whole bake on the emulated GPU; paired, losses as the host twin bakes' '
	sed "s|models/stories260K|$M|; s|output_dir: out|output_dir: bake-cpu|" "$DATA/bake/tiny.yaml" >tiny.yaml &&
	bk-bake tiny.yaml --device cuda --output_dir bake-cuda >bake.out 2>bake.err || { cat bake.err; false; } &&
	test -s bake-cuda/final_model/adapter_model.safetensors && test -s bake-cuda/results.json &&
	bk-dump bake-cuda/metrics.bk | jq -e -s "[.[] | select(.loss != null) | .loss] | length > 0 and all(. >= 0)" &&
	{ cat tiny.yaml; echo "dataset: $DATA/pipe/bake.json"; } >paired.yaml &&
	bk-bake paired.yaml --device cpu --output_dir paired-cpu >/dev/null 2>&1 &&
	bk-bake paired.yaml --device cuda --output_dir paired-cuda >/dev/null 2>bake.err || { cat bake.err; false; } &&
	bk-dump paired-cpu/metrics.bk >mb-cpu.jsonl && bk-dump paired-cuda/metrics.bk >mb-cuda.jsonl &&
	$C loss mb-cpu.jsonl mb-cuda.jsonl
'
fi

# data-parallel bk-step on the emulated GPU, 2 ranks under mpirun: gradients summed by the
# stand-in NCCL (tests/unit/fake_nccl.c), which queues its sum on the op stream as NCCL's
# kernel would be (cudaLaunchHostFunc), equal bit for bit to the MPI chain's sum (the
# device's gradients through host memory, in rank order)
if [ $FULL = 1 ] && command -v mpirun >/dev/null && ldd "$EMU_BUILD/bin/bk-step" | grep -q libmpi; then
test_expect_success 'bk-step --device cuda, 2 ranks: gradients summed by NCCL (the stand-in, in stream order) as by MPI, bit for bit' '
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader TMPDIR="$TEST_TMP" &&
	F="--model $M --device cuda --lora-r 8 --lora-alpha 16 --lr 2e-3 --batch-size 1 --max-steps 2" &&
	mpirun --oversubscribe -np 2 env BK_DIST=mpi bk-step $F --out d-mpi b.bk >/dev/null 2>err-m &&
	grep -q "2 data-parallel ranks: gradients summed over MPI" err-m &&
	mpirun --oversubscribe -np 2 env BK_DIST=nccl BK_NCCL_LIB="$EMU_BUILD/tests/fake-nccl/libnccl.so.2" \
		FAKE_NCCL_LOG=nlog bk-step $F --out d-nccl b.bk >/dev/null 2>err-n &&
	grep -q "2 data-parallel ranks: gradients summed by NCCL .* on the GPUs" err-n &&
	test $(grep -c "^allreduce rank=1 .*inplace=1 stream=set" nlog) -eq 2 &&
	cmp d-mpi/final/adapter_model.safetensors d-nccl/final/adapter_model.safetensors
'
fi

for kind in gemma3 qwen2; do
	python3 "$ROOT/tests/emu/make_tiny.py" "$kind" "$kind" &&
		bk-tokenize --model "$kind" --template raw --system "$SYS" "$DATA/pipe/bake.json" 2>/dev/null |
		bk-lens -q --max-tokens 128 -o "$kind.bk" || echo "not ok - $kind model"
	test_expect_success "tiny $kind (head dim 64): bk-step under BK_ATTN fp32/tc x BK_ACT fp32/bf16, BK_LINEAR v3 + BK_LOSS v2" '
		step "$kind-cpu" cpu "$kind" "$kind.bk" --lora-dropout 0.1 --max-steps 2 &&
		vs=("BK_ATTN=fp32" "BK_ATTN=tc" "BK_ATTN=fp32 BK_ACT=bf16" "BK_ATTN=tc BK_ACT=bf16" "BK_LINEAR=v3 BK_LOSS=v2 BK_ATTN=tc")
		[ $FULL = 1 ] || vs=("BK_ATTN=tc BK_ACT=bf16")
		for v in "${vs[@]}"; do
			rel=0.05; case $v in *bf16*) rel=0.01 ;; esac
			(export $v; step "$kind-$v" cuda "$kind" "$kind.bk" --lora-dropout 0.1 --max-steps 2) &&
				same "$kind-cpu" "$kind-$v" $rel || { echo "under $v"; return 1; }
		done
	'
	test_expect_success "tiny $kind: bk-teach cuda vs cpu, bk-gen cuda (decode v1 and v2) vs cpu greedy" '
		bk-teach --model "$kind" --device cpu --top-k 8 --min-mass 0 "$kind.bk" | bk-dump >"$kind-t-cpu.jsonl" &&
		BK_ATTN=tc bk-teach --model "$kind" --device cuda --top-k 8 --min-mass 0 "$kind.bk" | bk-dump >"$kind-t-cuda.jsonl" &&
		$C teach "$kind-t-cpu.jsonl" "$kind-t-cuda.jsonl" &&
		bk-tokenize --model "$kind" --template raw --system "$SYS" "$DATA/pipe/stories.txt" -o "$kind-s.bk" 2>/dev/null &&
		G="bk-gen --model $kind --num-trajectories 2 --max-new-tokens 12 --seed 2" &&
		$G --device cpu "$kind-s.bk" | bk-dump | jq -c .resp >"$kind-g-cpu" &&
		for d in v1 v2; do
			BK_DECODE=$d $G --device cuda "$kind-s.bk" | bk-dump | jq -c .resp >"$kind-g-$d" &&
			# sampled with the same counter-based draws: the first tokens agree
			paste -d" " <(jq -c ".[0:2]" "$kind-g-cpu") <(jq -c ".[0:2]" "$kind-g-$d") |
				awk "{ n++; if (\$1 == \$2) same++ } END { print same \" of \" n \" records start alike\"; exit (same < n * 3 / 4) }" || return 1
		done
	'
done

# QLoRA (gpu/cuda/cuda_q4.cuh): the 4-bit linears dequantised to bf16 before each GEMM,
# or in bk-gen's decode expanded inside the linear kernels (cuda_wsrc.cuh: the 4-bit
# decode kernels launch here), equal the host twin's compute dtype bf16 weights, so the
# bounds are those above
test_expect_success 'QLoRA --load-in-4bit: bk-teach and bk-step cuda vs cpu (nf4 + double quant), bk-gen cuda (decode v1 and v2) vs cpu' '
	Q="--load-in-4bit --bnb-4bit-compute-dtype bfloat16" &&
	bk-teach --model "$M" --device cpu --top-k 8 $Q b.bk | bk-dump >q-cpu.jsonl &&
	bk-teach --model "$M" --device cuda --top-k 8 $Q b.bk | bk-dump >q-cuda.jsonl &&
	$C teach q-cpu.jsonl q-cuda.jsonl &&
	{ [ $FULL = 1 ] || return 0; } &&
	step q4cpu cpu "$M" b.bk --lora-dropout 0 $Q && step q4cuda cuda "$M" b.bk --lora-dropout 0 $Q &&
	same q4cpu q4cuda &&
	G="bk-gen --model $M --num-trajectories 2 --max-new-tokens 12 --seed 2 $Q" &&
	$G --device cpu tok.bk | bk-dump | jq -c .resp >q-g-cpu &&
	for d in v1 v2; do
		BK_DECODE=$d $G --device cuda tok.bk | bk-dump | jq -c .resp >"q-g-$d" &&
		paste -d" " <(jq -c ".[0:2]" q-g-cpu) <(jq -c ".[0:2]" "q-g-$d") |
			awk "{ n++; if (\$1 == \$2) same++ } END { print same \" of \" n \" records start alike\"; exit (n == 0 || same < n * 3 / 4) }" || return 1
	done
'

if [ $FULL = 1 ]; then
	test_expect_success 'every kernel of gpu/cuda/ launched' '
		$C kernels "$BK_EMU_KERNEL_LOG" "$ROOT"/gpu/cuda/*.cu "$ROOT"/gpu/cuda/*.cuh >kernels.txt
	'
	cat kernels.txt # "kernels launched: N of M" (tests/run.sh shows it), then what was not
fi

# the static side, when the CUDA build is there (nvcc found): ptxas's registers and shared
# memory of each kernel on sm_80/86/90 against the largest launch the runs above made
if [ $FULL = 1 ] && ls "$ROOT"/build/obj/gpu/cuda/*.o >/dev/null 2>&1; then
	test_expect_success 'registers and shared memory of every launched kernel (ptxas, each arch) fit its launches' '
		ls "$ROOT"/build/obj/gpu/cuda/*.o.ptxas >/dev/null &&
		python3 "$ROOT/tests/emu/resources.py" "$BK_EMU_KERNEL_LOG" "$ROOT"/build/obj/gpu/cuda/*.o.ptxas >res.txt
	'
	grep "^resources: sm" res.txt
elif [ $FULL = 1 ]; then
	echo "# no CUDA build in $ROOT/build (no nvcc): the static resource check is not run"
fi

test_done
