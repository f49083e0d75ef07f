#!/usr/bin/env bash
# The device run rehearsed on the emulated GPU: tests/gpu/pack.sh packs the emulation's
# build (make emu: build-emu, the CUDA code compiled for the CPU against gpu/emu), and
# tests/gpu/run.sh --emu --quick runs the script in device mode on it (not the dry run:
# the check programs' GPU parts at their --tiny sizes, bk-step --device cuda against the
# host twin, the benchmarks): every row ok, "ran (emulated: not a speed)" or skipped
# with a reason, none FAIL; a planted failure (BK_GPU_TEST_FAIL) fails it.  The full
# list (every check program, check_gen.sh twice, the bk-step comparisons under v2/v3
# and BK_ACT=bf16, every benchmark size) is run.sh --emu without --quick, by hand
# (tests/gpu/README.md: a few minutes).
. "$(dirname "$0")/lib.sh"
EMU_BUILD=${BK_EMU_BUILD:-$ROOT/build-emu}
[ -x "$EMU_BUILD/bin/bk-step" ] && [ -x "$EMU_BUILD/tests/gpu/test_cuda_ops" ] ||
	{ echo "not ok - no emulation build in $EMU_BUILD (make emu)"; exit 1; }
export BK_PACK_XZ_LEVEL=0 BK_PACK_SIZE_CHECK=0 OMP_NUM_THREADS=1
unset BK_ATTN BK_ACT BK_LINEAR BK_LOSS BK_DECODE BK_GPU_EMU
set -o pipefail
# under ASan (make asan test: build-emu/asan) every emulated run is about 4 times slower:
# the planted failure and the usage only
FULL=1 PB=20 # PB: the planted run's budget (less 8 s kept for the archive), past test_cuda_ops
case $EMU_BUILD in */asan) FULL=0 PB=30 ;; esac

test_expect_success 'pack.sh packs the emulation build' '
	"$ROOT/tests/gpu/pack.sh" --build "$EMU_BUILD" --no-build --no-wheels --pack "$TEST_TMP/pack" >pack.out &&
	grep -q "every library resolved" pack.out
'

if [ $FULL = 1 ]; then
test_expect_success 'run.sh --emu --quick: device mode on the emulated GPU, every row ok or skipped with a reason' '
	t0=$SECONDS &&
	"$ROOT/tests/gpu/run.sh" --prebuilt --pack "$TEST_TMP/pack" --emu --quick --out out --budget 600 >run.out 2>&1 &&
	echo "run.sh --emu --quick took $((SECONDS - t0)) s" &&
	cat out/results.md &&
	test "$(ls -A out | sort | tr "\n" " ")" = "env.txt logs.tar.gz results.md smi.csv " &&
	grep -q "^Mode: EMULATED" out/results.md &&
	grep -q "| env | GPU | emulated (gpu/emu) |" out/results.md &&
	grep -q "| gpu | test_cuda_ops | ok | [0-9]* | # [0-9]* checks, 0 failed |" out/results.md &&
	grep -q "| correctness | bk-step cpu vs cuda, dropout 0.1 | ok |" out/results.md &&
	grep -q "| gpu | check_share.sh | ok | [0-9]* | check_share: 4 checks, 0 failed |" out/results.md &&
	grep -q "| timing | cuBLAS bf16 GEMM rate (best shape) | ran (emulated: not a speed) |" out/results.md &&
	grep -q "| timing | bakery step, small Llama .* | ran (emulated: not a speed) |" out/results.md &&
	grep -q "| timing | bakery generate: greedy, batch 1 | ran (emulated: not a speed) |" out/results.md &&
	grep -q "| timing | decode batch 1: 4-bit/bf16 | ran (emulated: not a speed) |" out/results.md &&
	grep -q "| compare | HF + PEFT step, HF generate, the Python tool | skipped (emulation) |  | need torch" out/results.md &&
	grep -q "| sanitizer | compute-sanitizer memcheck / racecheck | skipped (emulation) |  | needs a real GPU" out/results.md &&
	grep -q "^All correctness checks that ran passed" out/results.md &&
	! grep -q "FAIL\|TIMEOUT\|not run\|killed" out/results.md &&
	awk -F"|" "/^\| [0-9]/ { r = \$5; gsub(/^ +| +\$/, \"\", r); n = \$7; gsub(/^ +| +\$/, \"\", n)
		if (r != \"ok\" && r != \"ran (emulated: not a speed)\" && r != \"emulated (gpu/emu)\" && r !~ /^skipped \(/ && r != \"SKIP\") { print \"unexpected result: \" \$0; bad = 1 }
		if (r ~ /^skipped|SKIP/ && n == \"\") { print \"skipped without a reason: \" \$0; bad = 1 } }
		END { exit bad }" out/results.md
'
fi

test_expect_success 'run.sh --emu: a planted failure fails the run and is named' '
	test_must_fail env BK_GPU_TEST_FAIL=test_cuda_ops "$ROOT/tests/gpu/run.sh" --prebuilt --pack "$TEST_TMP/pack" \
		--emu --quick --out out2 --budget $PB >run2.out 2>err &&
	cat out2/results.md &&
	grep -q "^run.sh: error: .*correctness check(s) failed: test_cuda_ops" err &&
	grep -q "| gpu | test_cuda_ops | FAIL | [0-9]* | FAIL (exit 3): planted failure (BK_GPU_TEST_FAIL, BK_CUDA_SYNC=unset); re-run with BK_CUDA_SYNC=1: FAIL (exit 3)" out2/results.md &&
	grep -q "correctness check(s) FAILED: test_cuda_ops" out2/results.md
'

test_expect_success 'run.sh --emu: usage' '
	test_must_fail "$ROOT/tests/gpu/run.sh" --emu --dry-run --out o 2>err && grep -q "exclude each other" err &&
	test_must_fail env BK_GPU_EMU=1 "$ROOT/tests/gpu/run.sh" --dry-run --out o 2>err && grep -q "exclude each other" err
'

test_done
