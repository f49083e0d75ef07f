#!/usr/bin/env bash
# check_gen.sh - the GPU generation checks (needs a GPU and a CUDA build in $BUILD,
# default build/gpu; about a minute on an H200), called by tests/gpu/run.sh:
#   1. check_gen: decode ops and the sampler against the host twin (random inputs);
#   2. check_gen --e2e: greedy generation on models/stories260K, GPU vs host, the first
#      difference only after a near tie (its step and top-2 margin are printed), the
#      shared prefix built once;
#   3. bk-gen --device cuda: the output does not depend on --max-batch (1, 7, 64) nor on
#      a small --kv-memory pool (blocks waited for), sampled and greedy; the prefix is
#      built once; greedy text equal to --device cpu's for most records (reported);
#   4. bk-gen --device cuda --top-k (bk-bake passes HF's 50): 50 does not depend on
#      --max-batch, 512 (the vocabulary) gives the tokens of no top-k, 1 those of greedy.
# --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU): check_gen --tiny, and
# bk-gen with 2 trajectories of 8 new tokens instead of 3 of 40.
# Exit status 1 when a check fails; the last line sums up.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build/gpu}
TINY= NEW=40 NT=3
case ${1:-} in
--tiny) TINY=--tiny NEW=8 NT=2 ;;
"") ;;
*) echo "check_gen.sh: error: unknown argument '$1' (usage: check_gen.sh [--tiny])" >&2; exit 2 ;;
esac
case $BUILD in /*) B=$BUILD ;; *) B=$PWD/$BUILD ;; esac
W=$(mktemp -d "${TMPDIR:-/tmp}/bk-gen-gpu.XXXXXX")
trap 'rm -rf "$W"' EXIT
export XDG_CACHE_HOME="$W/cache" PATH="$B/bin:$PATH"
fail=0 notes=()
bad() { fail=1; echo "check_gen.sh: FAIL: $*"; }

echo "== check_gen $TINY (ops vs host twin)"
"$B/tests/gpu/check_gen" $TINY || bad "check_gen $TINY"
echo "== check_gen --e2e (greedy, stories260K, cuda vs cpu)"
"$B/tests/gpu/check_gen" --e2e | tee "$W/e2e.log" || bad "check_gen --e2e"
notes+=("e2e: $(grep -c 'greedy tokens equal' "$W/e2e.log") of 8 prompts equal")

echo "== bk-gen --device cuda"
M=models/stories260K
bk-tokenize --model $M --system "Sparky the dragon lives in a big castle." \
	tests/data/pipe/stories.txt -o "$W/s.bk" 2>/dev/null || bad "bk-tokenize"
G="bk-gen --model $M --num-trajectories $NT --max-new-tokens $NEW --seed 5"
for mb in 1 7 64; do
	$G --device cuda --max-batch $mb "$W/s.bk" -o "$W/c$mb.bk" 2>"$W/c$mb.err" || { tail -3 "$W/c$mb.err"; bad "bk-gen cuda --max-batch $mb"; }
done
# a pool of a few blocks: a stories260K block of K and V is 10 KiB in bf16 (20 blocks)
$G --device cuda --max-batch 64 --kv-memory 200K -v "$W/s.bk" -o "$W/ckv.bk" 2>"$W/ckv.err" || { tail -3 "$W/ckv.err"; bad "bk-gen cuda --kv-memory 200K"; }
cmp -s "$W/c1.bk" "$W/c7.bk" && cmp -s "$W/c1.bk" "$W/c64.bk" || bad "sampled output depends on --max-batch on the GPU"
cmp -s "$W/c64.bk" "$W/ckv.bk" || bad "sampled output depends on --kv-memory on the GPU"
grep -q "waits for blocks" "$W/ckv.err" && grep 'kv cache' "$W/ckv.err"
$G --device cuda -v "$W/s.bk" 2>"$W/v.err" >/dev/null || bad "bk-gen cuda -v"
grep -q "built 1 time; 6 prompts used it" "$W/v.err" || bad "the prefix is not built once: $(grep prefix "$W/v.err")"
grep -E "shared prefix|kv cache" "$W/v.err"
for dev in cuda cpu; do
	$G --device $dev --temperature 0 --num-trajectories 1 --max-batch 4 "$W/s.bk" 2>/dev/null |
		bk-dump | jq -c '{id, resp}' >"$W/g-$dev.jsonl" || bad "greedy bk-gen on $dev"
done
$G --device cuda --temperature 0 --num-trajectories 1 --max-batch 1 "$W/s.bk" 2>/dev/null |
	bk-dump | jq -c '{id, resp}' | cmp -s - "$W/g-cuda.jsonl" || bad "greedy output depends on --max-batch on the GPU"
same=$(paste -d'\n' "$W/g-cpu.jsonl" "$W/g-cuda.jsonl" | paste - - | awk -F'\t' '$1 == $2' | wc -l)
total=$(wc -l <"$W/g-cpu.jsonl")
echo "greedy bk-gen: $same of $total records give the same tokens on cuda and cpu (differences are judged by --e2e)"
notes+=("bk-gen greedy cuda=cpu for $same/$total records")
[ "$total" -gt 0 ] || bad "no greedy records"

echo "== bk-gen --device cuda --top-k"
for mb in 1 64; do
	$G --device cuda --top-k 50 --max-batch $mb "$W/s.bk" 2>/dev/null | bk-dump | jq -c '{id, resp}' >"$W/k50-$mb.jsonl" ||
		bad "bk-gen cuda --top-k 50 --max-batch $mb"
done
cmp -s "$W/k50-1.jsonl" "$W/k50-64.jsonl" || bad "top-k 50 output depends on --max-batch on the GPU"
cmp -s "$W/k50-64.jsonl" <(bk-dump "$W/c64.bk" | jq -c '{id, resp}') &&
	echo "top-k 50: the same tokens as no top-k (stories260K at top-p 0.9)" ||
	echo "top-k 50: other tokens than no top-k (stories260K at top-p 0.9; expected where the top 50 hold less than all the mass)"
$G --device cuda --top-k 512 "$W/s.bk" 2>/dev/null | bk-dump | jq -c '{id, resp}' |
	cmp -s - <(bk-dump "$W/c64.bk" | jq -c '{id, resp}') || bad "--top-k 512 (the vocabulary) differs from no top-k on the GPU"
$G --device cuda --top-k 1 --num-trajectories 1 --max-batch 4 "$W/s.bk" 2>/dev/null | bk-dump | jq -c '{id, resp}' |
	cmp -s - "$W/g-cuda.jsonl" || bad "--top-k 1 is not greedy on the GPU"

if [ $fail = 0 ]; then echo "check_gen.sh: ok (${notes[*]})"; else echo "check_gen.sh: FAILED (${notes[*]})"; fi
exit $fail
