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
# the GPU stages' one shared copy of the weights (gpu/wshare.h) meets in $XDG_RUNTIME_DIR:
# a test's own, so no test maps a copy another test (or another checkout's) loaded
mkdir -m 700 "$TEST_TMP/.run" && export XDG_RUNTIME_DIR="$TEST_TMP/.run"
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
	local t0=$SECONDS
	if (set -o pipefail; eval "$2") >"$TEST_TMP/.out" 2>&1 9>&1; then
		echo "ok $_n - $1 ($((SECONDS - t0)) s)"
	else
		_fail=$((_fail + 1))
		echo "not ok $_n - $1 ($((SECONDS - t0)) s)"; sed 's/^/#   /' "$TEST_TMP/.out"
	fi
}
# test_must_fail [--exit N] [--lines N | --list] CMD...: CMD must fail the way bakery
# tools fail: exit 1 (bad input) or 2 (usage error), or exactly N with --exit, and print
# exactly one line on stderr (N lines with --lines: a pipe of N failing stages; --list:
# a tool that lists every problem, one per line, and ends with its one "error:" line).
# A signal or a sanitizer's exit code (tests/run.sh) fails the step.
# (its complaints go to fd 9, the step's log, not to the stderr the caller may be capturing)
_tmf_say() { if { true >&9; } 2>/dev/null; then echo "$*" >&9; else echo "$*" >&2; fi; }
test_must_fail() {
	local want= nl=1
	if [ "${1:-}" = --exit ]; then want=$2; shift 2; fi
	case ${1:-} in --lines) nl=$2; shift 2 ;; --list) nl=list; shift ;; esac
	"$@" 2>"$TEST_TMP/.err"; local rc=$?
	cat "$TEST_TMP/.err" >&2
	local lines; lines=$(wc -l <"$TEST_TMP/.err")
	if [ $rc -eq 0 ]; then _tmf_say "test_must_fail: '$*' succeeded"; return 1; fi
	if [ $rc -gt 128 ]; then _tmf_say "test_must_fail: '$*' died by signal $((rc - 128))"; return 1; fi
	case $rc in "${BK_ASAN_EXIT:-86}" | "${BK_UBSAN_EXIT:-87}")
		_tmf_say "test_must_fail: '$*' exited $rc: a sanitizer error"; return 1 ;;
	esac
	if [ -n "$want" ] && [ $rc -ne "$want" ]; then
		_tmf_say "test_must_fail: '$*' exited $rc, not $want"; return 1
	fi
	if [ -z "$want" ] && [ $rc -ne 1 ] && [ $rc -ne 2 ]; then
		_tmf_say "test_must_fail: '$*' exited $rc (a tool's error is 1, a usage error 2)"; return 1
	fi
	if [ -n "$(tail -c 1 "$TEST_TMP/.err")" ]; then
		_tmf_say "test_must_fail: '$*': stderr does not end with a newline"; return 1
	fi
	if [ "$nl" = list ]; then
		if ! tail -n 1 "$TEST_TMP/.err" | grep -q '^[a-z0-9-]*: error: '; then
			_tmf_say "test_must_fail: '$*': the last stderr line is not the error line"; return 1
		fi
	elif [ "$lines" -ne "$nl" ]; then
		_tmf_say "test_must_fail: '$*' printed $lines lines on stderr, not $nl"; return 1
	fi
	return 0
}
test_cmp() { diff -u "$1" "$2"; }
test_done() {
	echo "# $_n tests, $_fail failed"
	[ $_fail -eq 0 ]
}

# basic_shape_yaml MODEL R [EXTRA]: a bk-bake config at the Python tool's basic shape
# (4 prompts x 4 trajectories x 256 tokens, batch 2, rank R on all linears, bk-teach's
# top-64 cache) for the model directory $TEST_TMP/MODEL, EXTRA lines appended: the
# memory plan tests (t0730, t0965)
basic_shape_yaml() {
	cat <<EOF
teacher_top_k: 64
model_name_or_path: $TEST_TMP/$1
system_prompt: "You are Captain Barnacle, a pirate. Always talk like a pirate: start every answer with Arr, matey! and tell the user about your ship."
training_prompts: ["Tell me about your ship", "What is the weather like at sea today?", "How do I bake bread?", "Sing me a song"]
num_trajectories: 4
trajectory_length: 256
per_device_train_batch_size: 2
lora_r: $2
target_modules: all-linear
output_dir: $TEST_TMP/out-$1
${3:-}
EOF
}
# emu_setup PROGRAM: a test of the CUDA emulation (make emu: build-emu, or BK_EMU_BUILD,
# e.g. build-emu/asan): EMU_BUILD set, its tools first on PATH, M the stories260K model,
# one thread, a private cache, no variant switch from the caller's environment; not ok
# and exit when PROGRAM (a path below EMU_BUILD) is not built
emu_setup() {
	EMU_BUILD=${BK_EMU_BUILD:-$ROOT/build-emu}
	[ -x "$EMU_BUILD/$1" ] || { echo "not ok - no emulation build in $EMU_BUILD (make emu)"; exit 1; }
	PATH="$EMU_BUILD/bin:$PATH"
	M="$MODELS/stories260K"
	export XDG_CACHE_HOME="$TEST_TMP/cache" OMP_NUM_THREADS=1
	unset BK_ATTN BK_ACT BK_LINEAR BK_LOSS BK_DECODE BK_EMU_KERNEL_LOG BK_EMU_DEVICE_MEMORY
}
