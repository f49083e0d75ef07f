#!/usr/bin/env bash
# run.sh - runs every unit test binary and every shell test; prints "N passed, N failed".
# Usage: BUILD=build tests/run.sh [pattern]
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export BK_BIN="$PWD/$BUILD/bin" PATH="$PWD/$BUILD/bin:$PATH"
# OpenMP threads that spin while waiting starve each other (and the other tests) on
# a shared 2-core machine; waiting passively costs nothing measurable here.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export XDG_CACHE_HOME="${TMPDIR:-/tmp}/bk-test-cache.$$"
# Sanitizers (make asan) exit with codes of their own, never the 1 of a bad-input error
# or the 2 of a usage error, so an expected failure that is really an ASan/LSan report
# (86) or a UBSan one (87) fails its test (tests/lib.sh test_must_fail, harness.c
# bk_expect_die).  Appended: these settings win over any given in the environment.
export BK_ASAN_EXIT=86 BK_UBSAN_EXIT=87
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}exitcode=$BK_ASAN_EXIT"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}exitcode=$BK_UBSAN_EXIT:halt_on_error=1:print_stacktrace=1"
trap 'rm -rf "$XDG_CACHE_HOME"' EXIT
pat=${1:-}
pass=0 fail=0 failed=()
run_one() { # name, command...
	local name=$1; shift
	local log; log=$(mktemp)
	local t0=$SECONDS
	if "$@" >"$log" 2>&1; then
		pass=$((pass + 1)); printf 'ok   %-40s %3ds\n' "$name" $((SECONDS - t0))
		grep -h '^kernels launched: ' "$log" | sed 's/^/     /' # the emulation's coverage (t0950)
	else
		fail=$((fail + 1)); failed+=("$name"); printf 'FAIL %-40s\n' "$name"; sed 's/^/    /' "$log" | tail -n 40
	fi
	rm -f "$log"
}
for t in "$BUILD"/tests/test_*; do
	[ -x "$t" ] || continue
	case "$t" in *"$pat"*) ;; *) continue ;; esac
	run_one "$(basename "$t")" "$t"
done
for t in tests/t[0-9]*.sh; do
	[ -f "$t" ] || continue
	case "$t" in *"$pat"*) ;; *) continue ;; esac
	run_one "$(basename "$t")" bash "$t"
done
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
