#!/usr/bin/env bash
# The path of data-parallel bk-step's gradient sum (BK_DIST, gpu/nccl.c) on a machine
# without a GPU: BK_DIST=nccl fails with one line naming the reason, auto and mpi take
# the host path (the MPI chain) and rank 0 says so.  NCCL's plumbing - loading the
# library, the unique id broadcast over MPI, one communicator per rank, ncclAllReduce in
# place on the gradient buffer once per step, errors and a hung all-reduce
# (BK_NCCL_TIMEOUT) ending the job - runs through a stand-in libnccl.so.2 over host
# memory (tests/unit/fake_nccl.c, BK_NCCL_HOST=1), which sums in rank order: the adapter
# equals the MPI chain's bit for bit.  It checks how bakery uses the API, not NCCL
# itself (tests/gpu/check_dist.sh does, on a GPU).
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
export XDG_CACHE_HOME="$TEST_TMP/cache" TMPDIR="$TEST_TMP" # the stand-in's rendezvous
export OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset BK_DIST BK_NCCL_LIB BK_NCCL_HOST BK_NCCL_TIMEOUT
set -o pipefail
FAKE=$(cd "$BK_BIN/.." && pwd)/tests/fake-nccl/libnccl.so.2
[ -f "$FAKE" ] || { echo "not ok - $FAKE is not built (make)"; exit 1; }
HOOK="BK_NCCL_HOST=1 BK_NCCL_LIB=$FAKE"

bk-tokenize --model "$M" --system "Sparky is a friendly dragon who lives in a cave." \
	"$DATA/pipe/bake.json" 2>/dev/null | bk-lens -q --max-tokens 128 >b.bk
F="--model $M --device cpu --lora-r 8 --lora-alpha 16 --lr 2e-3 --batch-size 1"
# the number of floats of an adapter file: what one all-reduce must carry
st_floats() { local n; n=$(od -An -tu8 -N8 "$1" | tr -d " "); echo $((($(stat -c %s "$1") - 8 - n) / 4)); }
st_rel() {
	local n; n=$(od -An -tu8 -N8 "$1" | tr -d " ")
	paste <(od -An -tf4 -v -w4 -j $((8 + n)) "$1") <(od -An -tf4 -v -w4 -j $((8 + n)) "$2") |
		awk '{ d = $1 - $2; s += d * d; t += $1 * $1 } END { printf "%.3g\n", sqrt(s / t) }'
}

test_expect_success 'BK_DIST=nccl on the host twin: one line naming the reason, no adapter' '
	test_must_fail env BK_DIST=nccl bk-step $F --out x b.bk 2>err >/dev/null &&
	grep -q "error: BK_DIST=nccl: rank 0 cannot use NCCL: it runs on the host twin" err &&
	! test -e x/final
'

test_expect_success 'a missing library, one without NCCL, a bad BK_DIST or timeout: named' '
	test_must_fail env BK_DIST=nccl BK_NCCL_HOST=1 BK_NCCL_LIB=$TEST_TMP/none/libnccl.so.2 \
		bk-step $F --out x b.bk 2>err >/dev/null &&
	grep -q "cannot use NCCL: .*none/libnccl.so.2: cannot open shared object file" err &&
	test_must_fail env BK_DIST=nccl BK_NCCL_HOST=1 BK_NCCL_LIB=libm.so.6 \
		bk-step $F --out x b.bk 2>err >/dev/null &&
	grep -q "cannot use NCCL: libm.so.6 has no ncclGetVersion" err &&
	test_must_fail env BK_DIST=gloo bk-step $F --out x b.bk 2>err >/dev/null &&
	grep -q "BK_DIST=.gloo.: auto, mpi or nccl" err &&
	test_must_fail env BK_DIST=nccl BK_NCCL_TIMEOUT=0 bk-step $F --out x b.bk 2>err >/dev/null &&
	grep -q "BK_NCCL_TIMEOUT=.0.: seconds" err && ! test -e x
'

test_expect_success 'one process through the stand-in: ncclAllReduce once a step, in place, same bits' '
	bk-step $F --out one --epochs 2 --grad-accum 2 b.bk >/dev/null 2>err &&
	! grep -q "NCCL\|BK_DIST" err &&
	env BK_DIST=nccl $HOOK FAKE_NCCL_LOG=log bk-step $F --out n1 --epochs 2 --grad-accum 2 b.bk >m.bk 2>err &&
	grep -q "1 data-parallel rank: gradients summed by NCCL 2.23.5, ncclAllReduce on the host twin" err &&
	cmp one/final/adapter_model.safetensors n1/final/adapter_model.safetensors &&
	steps=$(bk-dump m.bk | jq -s "[.[] | select(.step)] | length") && test $steps -gt 1 &&
	test "$(grep -c "^allreduce rank=0 seq=.* count=$(st_floats one/final/adapter_model.safetensors) type=7 op=0 inplace=1" log)" -eq $steps &&
	grep -q "^init nranks=1 rank=0 id=$TEST_TMP/fake-nccl" log && grep -q "^destroy rank=0 seq=$steps" log
'

test_expect_success 'an all-reduce that never finishes is aborted after BK_NCCL_TIMEOUT, exit 1' '
	t0=$SECONDS &&
	{ env BK_DIST=nccl $HOOK BK_NCCL_TIMEOUT=2 FAKE_NCCL_FAIL=hang:2 FAKE_NCCL_LOG=hlog \
		bk-step $F --out h b.bk >/dev/null 2>err; test $? -eq 1; } &&
	test $((SECONDS - t0)) -lt 30 &&
	grep -q "error: NCCL: all-reduce 2 did not finish within 2 s on rank 0: .*communicator aborted" err &&
	grep -q "^abort rank=0 seq=2$" hlog && ! test -e h/final &&
	grep -q "saved the 1 step done in h/checkpoint-1" err
'

# the library this machine has, if any, on a machine without a GPU: found, its id made,
# ncclCommInitRank fails for want of a GPU and says so in one line
REAL=$(ldconfig -p 2>/dev/null | awk '$1 == "libnccl.so.2" {print $NF; exit}')
if [ -n "$REAL" ] && ! nvidia-smi -L >/dev/null 2>&1; then
	test_expect_success "the real $REAL without a GPU: ncclCommInitRank fails, one line" '
		test_must_fail env BK_DIST=nccl BK_NCCL_HOST=1 bk-step $F --out x b.bk 2>err >/dev/null &&
		grep -q "error: NCCL: ncclCommInitRank failed on rank 0: " err && ! test -e x/final
	'
else
	echo "ok - # skip: the real libnccl.so.2 without a GPU (${REAL:-none here}$([ -n "$REAL" ] && echo ", and a GPU"))"
fi

if ! command -v mpirun >/dev/null || ! ldd "$BK_BIN/bk-step" | grep libmpi >/dev/null; then
	echo "ok - # skip: bk-step built without MPI or no mpirun (make deps, then make)"
	test_done; exit
fi
MPI="mpirun --oversubscribe -np 2"

test_expect_success 'mpirun -np 2, BK_DIST auto or mpi: the MPI chain, and rank 0 says why' '
	$MPI bk-step $F --out two --epochs 2 --grad-accum 2 b.bk >/dev/null 2>err &&
	test $(grep -c "gradients summed" err) -eq 1 &&
	grep -q "2 data-parallel ranks: gradients summed over MPI in rank order, through host memory (BK_DIST=auto: rank 0 cannot use NCCL: it runs on the host twin" err &&
	$MPI env BK_DIST=mpi bk-step $F --out two-m --epochs 2 --grad-accum 2 b.bk >/dev/null 2>err &&
	grep -q "gradients summed over MPI in rank order, through host memory (BK_DIST=mpi)$" err &&
	cmp two/final/adapter_model.safetensors two-m/final/adapter_model.safetensors
'

test_expect_success 'mpirun -np 2, BK_DIST=nccl on the host twin: the job fails naming why' '
	{ $MPI env BK_DIST=nccl bk-step $F --out x b.bk >/dev/null 2>err; test $? -ne 0; } &&
	grep -q "bk-step: error: BK_DIST=nccl: rank [01] cannot use NCCL: it runs on the host twin" err &&
	! test -e x/final
'

test_expect_success 'mpirun -np 2 through the stand-in: one id, 2 ranks, the MPI chain bit for bit' '
	$MPI env BK_DIST=nccl $HOOK FAKE_NCCL_LOG=log2 bk-step $F --out n2 --epochs 2 --grad-accum 2 b.bk >m2.bk 2>err &&
	grep -q "2 data-parallel ranks: gradients summed by NCCL" err &&
	cmp two/final/adapter_model.safetensors n2/final/adapter_model.safetensors &&
	test $(grep "^init nranks=2 " log2 | sed "s/.*id=//" | sort -u | wc -l) -eq 1 &&
	grep -q "^init nranks=2 rank=0 " log2 && grep -q "^init nranks=2 rank=1 " log2 &&
	steps=$(bk-dump m2.bk | jq -s "[.[] | select(.step)] | length") &&
	test $(grep -c "^allreduce rank=1 .*type=7 op=0 inplace=1" log2) -eq $steps &&
	test $(grep -c "^allreduce rank=0 .*type=7 op=0 inplace=1" log2) -eq $steps
'

test_expect_success 'the comparison can fail: a stand-in that sums nothing gives another adapter' '
	$MPI env BK_DIST=nccl $HOOK FAKE_NCCL_NOOP=1 bk-step $F --out n0 --epochs 2 --grad-accum 2 b.bk >/dev/null 2>&1 &&
	r=$(st_rel two/final/adapter_model.safetensors n0/final/adapter_model.safetensors) &&
	echo "relative distance $r" && awk -v r=$r "BEGIN { exit !(r > 1e-3) }"
'

test_expect_success 'an NCCL error on one rank ends the job promptly, naming the call' '
	for f in init:ncclCommInitRank allreduce:2:ncclAllReduce "async:3:the all-reduce (an asynchronous error)"; do
		t0=$SECONDS
		{ $MPI env BK_DIST=nccl $HOOK FAKE_NCCL_FAIL=${f%:*} FAKE_NCCL_FAIL_RANK=1 FAKE_NCCL_LOG=log-f \
			bk-step $F --out "f-${f%%:*}" --epochs 2 --grad-accum 2 b.bk >/dev/null 2>err; test $? -ne 0; } &&
		test $((SECONDS - t0)) -lt 30 &&
		grep -F "bk-step: error: NCCL: ${f##*:} failed on rank 1: " err | grep "planted failure" >/dev/null &&
		! test -e "f-${f%%:*}/final" || return 1
	done &&
	grep -q "^abort rank=1 seq=2" log-f && grep -q "^abort rank=1 seq=3" log-f
'

wait_for() { local i=0; while ! test -d "$1"; do sleep 0.01; i=$((i + 1)); [ $i -lt 3000 ] || return 1; done; }
test_expect_success 'a rank killed mid-run ends an NCCL job promptly' '
	{ $MPI env BK_DIST=nccl $HOOK bk-step $F --epochs 12 --save-steps 4 --out k b.bk >/dev/null 2>kerr & pid=$!; } &&
	wait_for k/checkpoint-4 &&
	victim=$(pgrep -f "bk-step $F --epochs 12 --save-steps 4 --out k" | grep -v "^$pid\$" | tail -1) && kill -9 $victim &&
	t0=$SECONDS && { wait $pid; test $? -ne 0; } && test $((SECONDS - t0)) -lt 20 &&
	! test -d k/final
'
test_done
