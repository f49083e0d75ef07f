#!/usr/bin/env bash
# check_share.sh - one copy of the frozen weights per GPU on the real driver (the CUDA VMM
# calls of gpu/cuda/cuda_vmm.cu: physical allocations exported as file descriptors and
# passed over a Unix socket, gpu/wshare.c), called by tests/gpu/run.sh; needs a GPU and a
# CUDA build in $BUILD (default build/gpu); seconds.  On models/stories260K:
#   - each stage with its own copy (BK_SHARE_WEIGHTS=0): says so once;
#   - a pipe bk-gen | bk-teach (bf16 weights): bk-gen loads the shared copy, bk-teach maps
#     it; both streams byte for byte those of the own-copy runs;
#   - the same pipe with --load-in-4bit (nf4, double quant): the shared copy is the
#     quantised one; byte for byte the own-copy runs in 4 bits.
# What the emulation (tests/t0960-share.sh) cannot tell: whether this driver grants the
# calls (a driver that refuses makes each stage load its own and say so: a FAIL row here,
# with the stage's message), and real device memory behind the mappings.  --tiny (run.sh
# --emu): the same on the emulated GPU.  Exit status 0 passed, 1 failed; the last line
# sums up.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
BUILD=${BUILD:-build/gpu}
case $BUILD in /*) B=$BUILD ;; *) B=$PWD/$BUILD ;; esac
case ${1:-} in
--tiny | "") ;;
*) echo "check_share.sh: error: unknown argument '$1' (usage: check_share.sh [--tiny])" >&2; exit 2 ;;
esac
W=$(mktemp -d "${TMPDIR:-/tmp}/bk-share-gpu.XXXXXX")
trap 'rm -rf "$W"' EXIT
# a private rendezvous directory: no copy of another run is found
export XDG_CACHE_HOME="$W/cache" XDG_RUNTIME_DIR="$W/run" PATH="$B/bin:$PATH" BK_SHARE_LINGER=2
mkdir -p -m 700 "$XDG_RUNTIME_DIR"
unset BK_SHARE_WEIGHTS BK_SHARE_HOLDER
M=models/stories260K
n=0 failed=0
ok() { n=$((n + 1)); echo "share $1 ok"; }
bad() { n=$((n + 1)); failed=$((failed + 1)); echo "share $1 FAIL: $2"; }

bk-tokenize --model $M --system "Sparky is a friendly dragon who lives in a cave." \
	tests/data/pipe/stories.txt -o "$W/tok.bk" 2>"$W/tok.err" ||
	{ echo "check_share.sh: error: bk-tokenize: $(tail -1 "$W/tok.err")" >&2; exit 1; }

# one variant: NAME, then bk-gen/bk-teach flags
pair() {
	local name=$1; shift
	local G=(bk-gen --model $M --device cuda -v --num-trajectories 2 --max-new-tokens 8 --seed 1 "$@")
	local T=(bk-teach --model $M --device cuda -v "$@")
	rm -rf "${XDG_RUNTIME_DIR:?}"/* # the copy of the variant before goes with its holder
	if BK_SHARE_WEIGHTS=0 "${G[@]}" "$W/tok.bk" -o "$W/g0-$name.bk" 2>"$W/g0-$name.err" &&
		BK_SHARE_WEIGHTS=0 "${T[@]}" "$W/g0-$name.bk" -o "$W/t0-$name.bk" 2>"$W/t0-$name.err"; then
		local c; c=$(cat "$W/g0-$name.err" "$W/t0-$name.err" | grep -c "not sharing the weights")
		if [ "$c" = 2 ]; then ok "$name own copies"
		else bad "$name own copies" "'not sharing the weights' said $c times, not once per stage"; fi
	else
		bad "$name own copies" "$(cat "$W/g0-$name.err" "$W/t0-$name.err" 2>/dev/null | grep -m1 -i error)"
		return
	fi
	if ! "${G[@]}" "$W/tok.bk" 2>"$W/g1-$name.err" | "${T[@]}" -o "$W/t1-$name.bk" 2>"$W/t1-$name.err"; then
		bad "$name pipe" "$(grep -h error "$W/g1-$name.err" "$W/t1-$name.err" | head -1)"
	elif ! grep -q "loaded the weights into a copy shared" "$W/g1-$name.err"; then
		bad "$name pipe" "bk-gen did not load a shared copy: $(grep -h -m1 'shar' "$W/g1-$name.err")"
	elif ! grep -q "mapped the shared copy of the weights" "$W/t1-$name.err"; then
		bad "$name pipe" "bk-teach did not map the copy: $(grep -h -m1 'shar' "$W/t1-$name.err")"
	elif ! cmp -s "$W/t0-$name.bk" "$W/t1-$name.bk"; then
		bad "$name pipe" "bk-teach's stream on the shared copy differs from its own copy's"
	else
		ok "$name pipe: one copy, mapped by bk-teach; the same bytes as own copies"
	fi
}
pair bf16
pair 4bit --load-in-4bit --bnb-4bit-use-double-quant 1

echo "check_share: $n checks, $failed failed"
[ $failed = 0 ]
