# lib.sh - helpers for shell pipeline tests (tests/tNNNN-*.sh), in the style of git's.
# Each test: test_expect_success 'title' 'commands' ; test_must_fail cmd ; test_cmp a b.
# The file ends with test_done, which exits non-zero when any step failed.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
: "${BK_BIN:=$ROOT/build/bin}"
PATH="$BK_BIN:$PATH"
TEST_TMP=$(mktemp -d "${TMPDIR:-/tmp}/bk-test.XXXXXX")
trap 'rm -rf "$TEST_TMP"' EXIT
cd "$TEST_TMP" || exit 1
MODELS="$ROOT/models"
DATA="$ROOT/tests/data"
_n=0 _fail=0
# A missing tool must fail the test file, not make pipelines quietly produce nothing.
for _t in "$ROOT"/cmd/bk-*.c; do
	_t=$(basename "$_t" .c)
	[ -x "$BK_BIN/$_t" ] || { echo "not ok - $_t is not built in $BK_BIN"; exit 1; }
done
# each step runs with pipefail: a failing stage fails the step even mid-pipe
test_expect_success() {
	_n=$((_n + 1))
	if (set -o pipefail; eval "$2") >"$TEST_TMP/.out" 2>&1; then
		echo "ok $_n - $1"
	else
		_fail=$((_fail + 1))
		echo "not ok $_n - $1"; sed 's/^/#   /' "$TEST_TMP/.out"
	fi
}
# test_must_fail CMD...: CMD must exit non-zero (not by a signal) and print one error line
test_must_fail() {
	"$@" 2>"$TEST_TMP/.err"; local rc=$?
	cat "$TEST_TMP/.err" >&2
	if [ $rc -eq 0 ]; then echo "test_must_fail: '$*' succeeded" >&2; return 1; fi
	if [ $rc -gt 128 ]; then echo "test_must_fail: '$*' died by signal $((rc - 128))" >&2; return 1; fi
	return 0
}
test_cmp() { diff -u "$1" "$2"; }
test_done() {
	echo "# $_n tests, $_fail failed"
	[ $_fail -eq 0 ]
}
