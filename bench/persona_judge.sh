#!/usr/bin/env bash
# persona_judge.sh - issue 13's persona check: a persona bake on SmolLM2-135M-Instruct
# through bk-bake (bench/data/persona-smollm2.yaml, the Python tool's config format: the
# pipelines/demo-chat persona and its 24 training questions), judged in plain HF
# transformers + PEFT (bench/persona_judge.py, no bakery code) on the 24 held-out
# questions of bench/data/persona-heldout.txt, which no training file holds:
# KL(prompted || baked) / KL(prompted || base) per answer token; the check wants < 0.5.
#
#   JUDGE_PYTHON=/tmp/venv-x/bin/python bench/persona_judge.sh [bk-bake --FIELD VALUE...]
#
# The model: $BK_SMOLLM2, else $XDG_CACHE_HOME/bakery/SmolLM2-135M-Instruct (make
# demo-chat converts it there).  JUDGE_PYTHON: a python with torch, transformers and peft
# (or BAKE_TOOL_VENV=/venv).  bk-bake also runs bk-eval --kl-prompts on the same held-out
# questions (bakery's own figure, printed next to the judge's).  JUDGE_SAMPLES (4) and
# JUDGE_TOKENS (48): the judge's teacher answers per question and their length;
# JUDGE_GREEDY (40): greedy answers of that many tokens, keyword hit counts (0: none).
# OUT=DIR keeps the bake there (else a temporary directory).  Prints the bake's wall and
# CPU (user+sys) seconds, the load average, the judge's lines, and last
#   persona_judge: ratio R over P prompts, N tokens: below 0.5 | NOT below 0.5
# exiting 0 in both cases (a measurement; 1 only when a step fails).  Slow: tens of
# minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
B="$ROOT/$BUILD/bin"
M=${BK_SMOLLM2:-${XDG_CACHE_HOME:-$HOME/.cache}/bakery/SmolLM2-135M-Instruct}
[ -f "$M/config.json" ] || { echo "persona_judge: no model at $M (make demo-chat, or set BK_SMOLLM2)" >&2; exit 1; }
PY=${JUDGE_PYTHON:-${BAKE_TOOL_VENV:+$BAKE_TOOL_VENV/bin/python}}
[ -n "$PY" ] || { echo "persona_judge: set JUDGE_PYTHON to a python with torch, transformers and peft" >&2; exit 1; }
"$PY" -c 'import torch, transformers, peft' ||
	{ echo "persona_judge: $PY lacks torch, transformers or peft" >&2; exit 1; }
[ -x "$B/bk-bake" ] || { echo "persona_judge: no $B/bk-bake (make BUILD=$BUILD)" >&2; exit 1; }
CFG=$ROOT/bench/data/persona-smollm2.yaml
HELD=$ROOT/bench/data/persona-heldout.txt
if [ -n "${OUT:-}" ]; then
	T=$OUT
	mkdir -p "$T"
else
	T=$(mktemp -d "${TMPDIR:-/tmp}/bk-persona.XXXXXX")
	trap 'rm -rf "$T"' EXIT
fi
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

echo "persona_judge: $(git log -1 --format='HEAD %h %cd' --date=iso 2>/dev/null || echo 'no git'), bk-bake built $(date -u -r "$B/bk-bake" '+%F %T UTC'); $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg) before"
/usr/bin/time -f '%e %U %S' -o "$T/bake.time" "$B/bk-bake" "$CFG" --model_name_or_path "$M" \
	--output_dir "$T/bake" --kl_prompts "$HELD" "$@" >"$T/bake.log" 2>"$T/bake.err" ||
	{ cat "$T/bake.err" >&2; echo "persona_judge: bk-bake failed (logs: $T/bake/logs)" >&2; exit 1; }
read -r w u s <"$T/bake.time"
sed -n '/bake summary/,/^=====*$/p' "$T/bake.log"
echo "persona_judge: bk-bake ${w} s wall, $(echo "$u + $s" | bc) s CPU (user $u, sys $s); load average $(cut -d' ' -f1-3 /proc/loadavg) after"
AD=$T/bake/final_model
test -f "$AD/adapter_model.safetensors"

# the system prompt the bake used, from its token stream's header
"$B/bk-dump" --header "$T/bake/tokens.bk" | head -1 | jq -je '.provenance[0].system_prompt' >"$T/system.txt"
/usr/bin/time -f '%e %U %S' -o "$T/judge.time" "$PY" "$ROOT/bench/persona_judge.py" "$M" \
	"$T/system.txt" "$HELD" "$AD" --samples "${JUDGE_SAMPLES:-4}" --tokens "${JUDGE_TOKENS:-48}" \
	--greedy "${JUDGE_GREEDY:-40}" >"$T/judge.out" 2>"$T/judge.err" ||
	{ tail "$T/judge.err" >&2; echo "persona_judge: the judge failed" >&2; exit 1; }
cat "$T/judge.out"
read -r jw ju js <"$T/judge.time"
echo "persona_judge: judge ${jw} s wall, $(echo "$ju + $js" | bc) s CPU"
last=$(tail -1 "$T/judge.out")
r=$(sed -n 's/.* ratio=\([0-9.e+-]*\).*/\1/p' <<<"$last")
p=$(sed -n 's/.* prompts=\([0-9]*\).*/\1/p' <<<"$last")
n=$(sed -n 's/.* tokens=\([0-9]*\).*/\1/p' <<<"$last")
[ -n "$r" ] || { echo "persona_judge: no ratio in the judge's output" >&2; exit 1; }
echo "persona_judge: ratio $r over $p prompts, $n tokens: $(awk -v r="$r" 'BEGIN { print (r < 0.5 ? "below 0.5" : "NOT below 0.5") }')"
