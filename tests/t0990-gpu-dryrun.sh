#!/usr/bin/env bash
# The GPU run without a GPU: tests/gpu/pack.sh packs this build (the host twin) with every
# library it needs, and tests/gpu/run.sh --prebuilt --dry-run runs end to end on it:
# results.md (a row per check, each with a result), env.txt, smi.csv and logs.tar.gz in
# --out and nothing else there; a failing check is named and re-run with BK_CUDA_SYNC=1;
# a hanging stage is cut by the budget and the stages after it are reported as not run;
# a library missing from the pack is named.  (No "cmd | grep -q" here: with pipefail, grep
# leaving early can fail the step by SIGPIPE.)
. "$(dirname "$0")/lib.sh"
BUILD_DIR=$(dirname "$BK_BIN")
export BK_PACK_XZ_LEVEL=0 # fast; the real pack uses xz -6
# the build under test may be the CUDA one for sm_80/86/90 (CI), three times the size of
# the real pack's sm_90 build: sizes are the real pack's business, not this test's
export BK_PACK_SIZE_CHECK=0
set -o pipefail

test_expect_success 'pack.sh packs the build and resolves every library' '
	"$ROOT/tests/gpu/pack.sh" --build "$BUILD_DIR" --no-build --no-wheels --pack "$TEST_TMP/pack" >pack.out &&
	cat pack.out &&
	grep -q "every library resolved" pack.out &&
	grep -q "^pack.sh: size [0-9]* MiB" pack.out &&
	test -s "$TEST_TMP/pack/MANIFEST" && test ! -e "$TEST_TMP/pack/bin" &&
	tar -tJf "$TEST_TMP/pack/programs.tar.xz" >progs &&
	for f in bin/bk-step bin/bk-dump bin/jq tests/test_ops bench/bench_step bench/bench_gen; do
		grep -qx "$f" progs || { echo "pack lacks $f"; exit 1; }
	done &&
	ls "$TEST_TMP/pack/lib" "$TEST_TMP/pack/lib/sys" >libs &&
	grep -q "^libmsgpackc\.so" libs &&
	grep -q "^libopenblas\.so\.0\.xz$" libs &&
	grep -q "^libstdc++\.so\.6$" libs &&
	! grep -q "^libc\.so\|^libcuda" libs
'

test_expect_success 'pack.sh refuses a build directory without programs' '
	mkdir -p empty/bin &&
	test_must_fail "$ROOT/tests/gpu/pack.sh" --build empty --no-build --no-wheels --pack "$TEST_TMP/p2" 2>err &&
	grep -q "no programs to pack" err
'

test_expect_success 'run.sh --dry-run: every row filled, four files in --out' '
	t0=$SECONDS &&
	"$ROOT/tests/gpu/run.sh" --prebuilt --pack "$TEST_TMP/pack" --dry-run --out out --budget 300 >run.out 2>&1 &&
	echo "dry run took $((SECONDS - t0)) s" &&
	cat out/results.md &&
	test "$(ls -A out | sort | tr "\n" " ")" = "env.txt logs.tar.gz results.md smi.csv " &&
	grep -q "^| [0-9]* | pack | libraries on this machine | ok |" out/results.md &&
	grep -q "| host | test_ops | ok |" out/results.md &&
	grep -q "| correctness | bk-step cpu vs cpu, dropout 0 | ok |  | [0-9]* steps, worst abs(dloss) 0.00e+00, 0 out of tolerance; adapter rel. L2 diff 0.00e+00" out/results.md &&
	grep -q "| correctness | bk-step cpu vs cpu, dropout 0.1 | ok |" out/results.md &&
	grep -q "| timing | bakery step, tiny Llama (H 64, 2 layers, host twin), 4x32 tokens, plain | [0-9]* tokens/s |.*phases ms: teacher_fwd:[0-9.]*,student_fwd:" out/results.md &&
	grep -q "| timing | bakery step, tiny Llama (H 64, 2 layers, host twin), 2x64 tokens, ckpt | [0-9]* tokens/s |" out/results.md &&
	grep -q "| timing | bakery generate: greedy, batch 1 | [0-9.]* tokens/s |" out/results.md &&
	grep -q "| timing | bakery generate: sampled, batch 16 | [0-9.]* tokens/s |" out/results.md &&
	grep -q "| compare | Python scripts (syntax) | ok |" out/results.md &&
	grep -q "| sanitizer | compute-sanitizer memcheck / racecheck | skipped (dry run) |" out/results.md &&
	grep -q "^All correctness checks that ran passed" out/results.md &&
	! grep -q "FAIL\|TIMEOUT\|not run" out/results.md &&
	awk -F"|" "/^\| [0-9]/ && \$5 ~ /^ *\$/ { print \"empty result: \" \$0; bad = 1 } END { exit bad }" out/results.md &&
	tar -tzf out/logs.tar.gz >list &&
	grep -q "^logs/run.log$" list && grep -q "^logs/bench_gen.log$" list &&
	grep -q "^logs/bench_step-4x32-plain.log$" list &&
	grep -q "^python: " out/env.txt && grep -q "bakery GPU pack" out/env.txt &&
	grep -q "dry run" out/smi.csv
'

test_expect_success 'run.sh: a failing check is named and re-run with BK_CUDA_SYNC=1; a hang is cut by the budget; a missing library is named' '
	cp -a "$TEST_TMP/pack" pack2 && rm pack2/lib/libxxhash.so* &&
	t0=$SECONDS &&
	test_must_fail env BK_GPU_TEST_FAIL=test_ops BK_GPU_TEST_HANG=test_model_grad \
		"$ROOT/tests/gpu/run.sh" --prebuilt --pack "$TEST_TMP/pack2" --dry-run --out out2 --budget 35 >run2.out 2>err &&
	grep -q "^run.sh: error: 3 correctness check(s) failed: libraries on this machine test_ops test_model_grad (see .*/out2/results.md)$" err &&
	dt=$((SECONDS - t0)) && echo "took $dt s" && cat out2/results.md &&
	test $dt -le 45 &&
	grep -q "| pack | libraries on this machine | FAIL |  | .*libxxhash.so.0 => /.* (not from the pack)" out2/results.md &&
	grep -q "| host | test_ops | FAIL | [0-9]* | FAIL (exit 3): planted failure (BK_GPU_TEST_FAIL, BK_CUDA_SYNC=unset); re-run with BK_CUDA_SYNC=1: FAIL (exit 3): planted failure (BK_GPU_TEST_FAIL, BK_CUDA_SYNC=1)" out2/results.md &&
	grep -q "| host | test_model_grad | FAIL | [0-9]* | TIMEOUT ([0-9]*s)" out2/results.md &&
	grep -q "| bakery generate (bench_gen) | not run: budget spent |" out2/results.md &&
	grep -q "3 correctness check(s) FAILED: libraries on this machine test_ops test_model_grad$" out2/results.md &&
	tar -tzf out2/logs.tar.gz >list2 && grep -q "^logs/test_ops.sync.log$" list2
'

test_expect_success 'run.sh: usage errors' '
	test_must_fail "$ROOT/tests/gpu/run.sh" --dry-run 2>err && grep -q "out DIR is required" err &&
	test_must_fail "$ROOT/tests/gpu/run.sh" --out o --budget 5 2>err && grep -q "at least 10" err &&
	test_must_fail "$ROOT/tests/gpu/run.sh" --out o --bogus 2>err && grep -q "unknown argument" err
'

test_done
