#!/usr/bin/env bash
# persona_quality.sh - issue 25's persona check over seeds, both sides: the persona bake
# of bench/data/persona-smollm2.yaml on SmolLM2-135M-Instruct with the issue's training
# fields (lr 1e-3, cosine, warmup_ratio 0.1, r 16, lora_alpha 32 unless PERSONA_FIELDS
# says otherwise) through bk-bake and through the Python tool (bakery-py) at each seed,
# each bake timed, then every adapter judged in one run of bench/persona_judge.py (plain
# HF + PEFT: held-out KL(prompted || baked) / KL(prompted || base) on the 24 questions of
# bench/data/persona-heldout.txt, and greedy answers with a pirate word).
#
#   BAKE_TOOL_VENV=/venv OUT=DIR bench/persona_quality.sh [SEEDS]     (default "1 2 3 4")
#
# BAKE_TOOL_VENV: a venv with torch, transformers, peft and the tool (bench/README.md).
# OUT: where the bakes stay (a bake whose final_model exists is not redone, so a run
# can be resumed or extended with more seeds; the judge always judges them all).
# PERSONA_FIELDS: "key: value" lines that replace (or add) config fields for both sides.
# BK_VARIANTS: bk-bake runs per seed, ";"-separated NAME=ARGS (default "bk="); e.g.
# "bk=;bk4=--load_in_4bit true".  TOOL=0 skips the tool.  JUDGE=0 skips the judge.
# Prints one line per bake (wall and CPU seconds, load average), the judge's output, and
# per variant "quality: NAME mean M (min-max, N seeds), greedy in character mean G/24".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
B="$ROOT/$BUILD/bin"
PY="${BAKE_TOOL_VENV:?set BAKE_TOOL_VENV to a venv with torch, transformers, peft and bakery-py}/bin/python"
M=${BK_SMOLLM2:-${XDG_CACHE_HOME:-$HOME/.cache}/bakery/SmolLM2-135M-Instruct}
[ -f "$M/config.json" ] || { echo "persona_quality: no model at $M (make -f pipelines/demo-chat.mk model)" >&2; exit 1; }
SEEDS=${1:-1 2 3 4}
T=${OUT:?set OUT to a directory for the bakes}
mkdir -p "$T"
HELD=$ROOT/bench/data/persona-heldout.txt
FIELDS=${PERSONA_FIELDS:-"learning_rate: 1.0e-3
lr_scheduler_type: \"cosine\"
warmup_ratio: 0.1
r: 16
lora_alpha: 32"}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# the config: the yaml's fields with FIELDS replacing theirs (or appended)
printf '%s\n' "$FIELDS" >"$T/fields.txt"
awk -v model="$M" -f bench/override_fields.awk "$T/fields.txt" \
	"$ROOT/bench/data/persona-smollm2.yaml" >"$T/persona.yaml"
echo "persona_quality: $(git log -1 --format='HEAD %h %cd' --date=iso 2>/dev/null || echo 'no git'); $(nproc) cores; fields: $(tr '\n' ' ' <"$T/fields.txt")"

# run NAME CMD...: timed, its log in $T/NAME.log; one line "bake NAME: W s wall, C s CPU"
run() {
	local name=$1 l0 w u s
	shift
	[ -f "$T/$name/final_model/adapter_model.safetensors" ] && { cat "$T/$name.line"; return; }
	l0=$(cut -d' ' -f1 /proc/loadavg)
	/usr/bin/time -f '%e %U %S' -o "$T/$name.time" "$@" >"$T/$name.log" 2>&1 ||
		{ tail "$T/$name.log" >&2; echo "persona_quality: $name failed" >&2; exit 1; }
	read -r w u s <"$T/$name.time"
	echo "bake $name: $w s wall, $(echo "$u + $s" | bc) s CPU; load average $l0 before, $(cut -d' ' -f1 /proc/loadavg) after" |
		tee "$T/$name.line"
}

IFS=';' read -r -a variants <<<"${BK_VARIANTS:-bk=}"
ads=()
for s in $SEEDS; do
	for v in "${variants[@]}"; do
		name=${v%%=*}
		# shellcheck disable=SC2086 # the variant's arguments: words
		run "$name-$s" "$B/bk-bake" "$T/persona.yaml" --seed "$s" --output_dir "$T/$name-$s" --overwrite_output_dir true ${v#*=}
		ads+=("$T/$name-$s/final_model")
	done
	if [ "${TOOL:-1}" != 0 ]; then
		HF_HUB_OFFLINE=1 run "tool-$s" "$PY" -m bakery.cli --config "$T/persona.yaml" --seed "$s" --output_dir "$T/tool-$s"
		ads+=("$T/tool-$s/final_model")
	fi
done
[ "${JUDGE:-1}" != 0 ] || exit 0

"$PY" -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["system_prompt"])' "$T/persona.yaml" >"$T/system.txt"
/usr/bin/time -f '%e %U %S' -o "$T/judge.time" "$PY" "$ROOT/bench/persona_judge.py" "$M" "$T/system.txt" "$HELD" \
	"${ads[@]}" --samples "${JUDGE_SAMPLES:-4}" --tokens "${JUDGE_TOKENS:-48}" --greedy "${JUDGE_GREEDY:-40}" \
	--threads "${JUDGE_THREADS:-2}" >"$T/judge.out" 2>"$T/judge.err" ||
	{ tail "$T/judge.err" >&2; echo "persona_quality: the judge failed" >&2; exit 1; }
sed "s,$T/,," "$T/judge.out"
echo "persona_quality: judge $(cut -d' ' -f1 "$T/judge.time") s wall"
# per variant: the ratio line follows the adapter's greedy_baked_hits line
names=$(for v in "${variants[@]}"; do echo "${v%%=*}"; done; [ "${TOOL:-1}" = 0 ] || echo tool)
for n in $names; do
	awk -v n="$n" -v T="$T/" '
		/^greedy_baked_hits=/ { split($0, a, "="); split(a[2], b, "/"); h = b[1]; q = b[2] }
		index($1, T n "-") == 1 && / ratio=/ { r = $NF; sub(/ratio=/, "", r); c++; s += r; hs += h
			if (c == 1 || r < lo) lo = r; if (c == 1 || r > hi) hi = r }
		END { if (c) printf "quality: %s mean %.3f (%.3f-%.3f, %d seeds), greedy in character mean %.1f/%d\n", n, s / c, lo, hi, c, hs / c, q }' \
		"$T/judge.out"
done
