#!/usr/bin/env bash
# data-parallel bk-step over MPI on the host twin: 2 ranks with --grad-accum 2 train the
# adapter one process trains with --grad-accum 4; rank 0 alone writes; a resume needs
# the same number of ranks; a rank killed mid-run ends the job, and --resume goes on.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
export XDG_CACHE_HOME="$TEST_TMP/cache"
export OMP_NUM_THREADS=1
# root in CI and containers; leak reports from libmpi are not ours under ASan
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
set -o pipefail
# (grep -q under pipefail would skip now and then: ldd killed by SIGPIPE)
if ! command -v mpirun >/dev/null || ! ldd "$BK_BIN/bk-step" | grep libmpi >/dev/null; then
	echo "ok - # skip: bk-step built without MPI or no mpirun (make deps, then make)"
	test_done; exit
fi
MPI="mpirun --oversubscribe -np 2"

bk-tokenize --model "$M" --system "Sparky is a friendly dragon who lives in a cave." \
	"$DATA/pipe/bake.json" 2>/dev/null | bk-lens -q --max-tokens 128 >b.bk
F="--model $M --device cpu --lora-r 8 --lora-alpha 16 --lr 2e-3 --batch-size 1"

# relative Frobenius distance of two adapters with the same layout (the same header)
st_rel() {
	local n; n=$(od -An -tu8 -N8 "$1" | tr -d " ")
	paste <(od -An -tf4 -v -w4 -j $((8 + n)) "$1") <(od -An -tf4 -v -w4 -j $((8 + n)) "$2") |
		awk '{ d = $1 - $2; s += d * d; t += $1 * $1 } END { printf "%.3g\n", sqrt(s / t) }'
}

# The bound: each step sums the same N*G = 4 micro-batch gradients in another order
# ((m0+m2)+(m1+m3) against ((m0+m1)+m2)+m3), a relative difference of at most about
# 4 * 2^-24 = 2.4e-7 of the gradient; AdamW divides by sqrt(v), so entries whose
# gradient is near its rounding noise amplify that, and over 4 steps the adapters were
# measured 1.4e-6 apart (relative Frobenius norm) on Intel; 1e-5 leaves 7x for other
# CPUs and BLAS kernels.  A wrong rank split or dropout key gives differences of 1e-2.
test_expect_success 'mpirun -np 2 with --grad-accum 2 = one process with --grad-accum 4' '
	bk-step $F --out one --epochs 2 --grad-accum 4 b.bk >m1.bk 2>/dev/null &&
	$MPI bk-step $F --out two --epochs 2 --grad-accum 2 b.bk >m2.bk 2>err &&
	grep -q "2 data-parallel ranks" err && test $(grep -c " steps in " err) -eq 1 &&
	r=$(st_rel one/final/adapter_model.safetensors two/final/adapter_model.safetensors) &&
	echo "relative distance $r" &&
	awk -v r=$r "BEGIN { exit !(r <= 1e-5) }" &&
	bk-dump m1.bk | jq -c "select(.step) | [.step, .lr, .tokens]" >a &&
	bk-dump m2.bk | jq -c "select(.step) | [.step, .lr, .tokens]" >b && test_cmp a b &&
	bk-dump m2.bk | jq -s -e ".[-1].final == \"two/final\"" &&
	ls two >l && test_cmp l - <<-EOT
	checkpoint-2
	checkpoint-4
	final
	EOT
'

test_expect_success 'the split is real: another dropout seed or one rank alone differs' '
	$MPI bk-step $F --out two-s --epochs 2 --grad-accum 2 --seed 1 b.bk >/dev/null 2>&1 &&
	r=$(st_rel two/final/adapter_model.safetensors two-s/final/adapter_model.safetensors) &&
	awk -v r=$r "BEGIN { exit !(r > 1e-3) }" &&
	bk-step $F --out g2 --epochs 2 --grad-accum 2 b.bk >/dev/null 2>&1 &&
	r=$(st_rel two/final/adapter_model.safetensors g2/final/adapter_model.safetensors) &&
	awk -v r=$r "BEGIN { exit !(r > 1e-3) }"
'

test_expect_success 'a resume needs the same number of ranks; a pipe needs one rank' '
	test_must_fail bk-step $F --out two --epochs 2 --grad-accum 2 --resume two/checkpoint-2 b.bk 2>err >/dev/null &&
	grep -q "this run has 1 data-parallel ranks, the checkpoint.s had 2" err &&
	cat b.bk | { $MPI bk-step $F --out p --max-steps 2 --schedule constant >/dev/null 2>err; test $? -ne 0; } &&
	grep -q "ranks need a STREAM file" err && ! test -e p
'

wait_for() { local i=0; while ! test -d "$1"; do sleep 0.01; i=$((i + 1)); [ $i -lt 3000 ] || return 1; done; }
L="$F --epochs 12 --grad-accum 1 --save-steps 4 --schedule cosine"
test_expect_success 'a rank killed mid-run ends the job promptly; --resume with -np 2 goes on' '
	$MPI bk-step $L --out full b.bk >/dev/null 2>&1 &&
	{ $MPI bk-step $L --out k b.bk >/dev/null 2>kerr & pid=$!; } &&
	wait_for k/checkpoint-8 &&
	victim=$(pgrep -f "bk-step $L --out k" | grep -v "^$pid\$" | tail -1) && kill -9 $victim &&
	t0=$SECONDS && { wait $pid; test $? -ne 0; } && test $((SECONDS - t0)) -lt 20 &&
	! test -d k/final &&
	c=$(ls -d k/checkpoint-* | grep -v "\.tmp\." | sort -t- -k2 -n | tail -1) &&
	$MPI bk-step $L --out k --resume $c b.bk >/dev/null 2>err && grep -q "resuming from $c" err &&
	cmp full/final/adapter_model.safetensors k/final/adapter_model.safetensors
'
test_done
