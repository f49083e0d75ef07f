#!/usr/bin/env bash
# t0955-emu-gen-teacher.sh - bk-gen --teacher-top-k on the emulated GPU (make emu:
# build-emu/, --device cuda): the teacher field bk-gen's CUDA decode (v1, and v2 with its
# graphs) writes from the logits it samples from, against the host twin's bk-teach on
# the same trajectories, within bf16 bounds (tests/emu/compare.py teach: bf16 base
# weights and GEMM inputs, here also a bf16 KV cache), on stories260K and on the tiny
# Gemma-3 (final logit softcap: bk-gen's logits are capped before the top-k, bk-teach
# caps in its own).  A companion of tests/t0950-emu.sh.
. "$(dirname "$0")/lib.sh"
emu_setup bin/bk-gen
set -o pipefail
C="python3 $ROOT/tests/emu/compare.py"
# under ASan (make asan test: build-emu/asan) an emulated run is about 4 times slower:
# stories260K only there; the tiny Gemma-3 in the plain run
FULL=1
case $EMU_BUILD in */asan) FULL=0 ;; esac
SYS="Sparky is a friendly dragon who lives in a cave."

bk-tokenize --model "$M" --system "$SYS" "$DATA/pipe/stories.txt" -o s.bk 2>/dev/null &&
	python3 "$ROOT/tests/emu/make_tiny.py" gemma3 gemma3 &&
	bk-tokenize --model gemma3 --template raw --system "$SYS" "$DATA/pipe/stories.txt" -o g3.bk 2>/dev/null ||
	echo "not ok - the streams"

# scored MODEL STREAM [flags]: bk-gen --device cuda --teacher-top-k 8 under BK_DECODE v1
# and v2, each against bk-teach --device cpu (the host twin) on its own trajectories
scored() {
	local m=$1 s=$2 d; shift 2
	for d in v1 v2; do
		BK_DECODE=$d bk-gen --device cuda --model "$m" --num-trajectories 2 --max-new-tokens 16 \
			--seed 3 --teacher-top-k 8 "$@" "$s" -o "gen-$d.bk" &&
			bk-dump "gen-$d.bk" >"gen-$d.jsonl" &&
			bk-teach --device cpu --model "$m" --top-k 8 "$@" "gen-$d.bk" | bk-dump >"teach-$d.jsonl" &&
			$C teach "teach-$d.jsonl" "gen-$d.jsonl" || { echo "under BK_DECODE=$d"; return 1; }
		jq -e -s "length > 0 and all(.[]; .teacher.n == (.resp | length))" "gen-$d.jsonl" >/dev/null || return 1
	done
}

test_expect_success 'stories260K: bk-gen cuda --teacher-top-k (decode v1, v2) vs the host twin'"'"'s bk-teach' '
	scored "$M" s.bk
'

[ $FULL = 1 ] &&
test_expect_success 'tiny Gemma-3 (final softcap): the same, a flat teacher kept (--min-mass 0)' '
	scored gemma3 g3.bk --min-mass 0
'

test_done
