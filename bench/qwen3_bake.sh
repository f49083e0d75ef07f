#!/usr/bin/env bash
# qwen3_bake.sh - issue 13 item 6: the Python tool's own basic config (bakery-py
# examples/basic.yaml, its default model Qwen/Qwen3-0.6B) through bk-bake on the host twin,
# with model_name_or_path pointing at a local Qwen3-0.6B-shaped directory: the real
# config.json, tokenizer_config.json, chat_template.jinja and generation_config.json
# (tests/data/hf-configs/Qwen3-0.6B), the real Qwen tokenizer.json
# (tests/golden/bpe/qwen.tokenizer.json.xz) and random bf16 weights of the real shape
# (bench/make_model ... qwen3, 596M parameters, 1.2 GB), built in a temporary directory.
#
#   BUILD=build bench/qwen3_bake.sh [bk-bake --FIELD VALUE overrides...]
#
# The config: $BAKE_CONFIG, else ../shared/reference/bakery-py/examples/basic.yaml when
# present, else the copy in bench/data/bakery-py-basic.yaml; output_dir and
# model_name_or_path are rewritten, nothing else (PROMPTS=N keeps the first N
# training_prompts; overrides such as --num_train_epochs 1 go to bk-bake as given, and
# each cut is printed).  Every stage bk-bake starts runs under /usr/bin/time (a copy of
# bk-bake in a directory of wrappers: bk-bake runs the stages from its own directory), so
# each stage's wall and CPU (user+sys) seconds are known although bk-lens | bk-gen |
# bk-teach | bk-step run as one pipe (overlapping: each pipe stage's wall time is about
# the pipe's).  Prints per stage: tokens, wall s, CPU s, tokens/s of wall and per
# CPU-second, and the whole bake's wall and CPU from /usr/bin/time, plus the load
# average before and after; the last line sums it up (bench/run.sh's row with
# BENCH_QWEN3_BAKE=1).  KEEP=1 keeps the temporary directory; TINY=1 runs the same on a
# 2-layer Qwen3 (hidden 64) with make_model's config, to check this script.  To stop a
# run, signal the stages too, not only bk-bake: the /usr/bin/time wrappers do not pass a
# SIGTERM on.  Slow: the full basic config (5 prompts x 4 trajectories x 128 tokens x 3
# epochs) took 502 s wall, 624 CPU-s on a quiet machine (2026-12-01); bk-gen peaks at
# 8.4 GB of memory (the KV cache of 60 sequences), bk-teach and bk-step at 5.7 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
B="$ROOT/$BUILD/bin"
for t in bk-bake bk-tokenize bk-lens bk-gen bk-teach bk-step bk-eval bk-dump; do
	[ -x "$B/$t" ] || { echo "qwen3_bake: no $B/$t (make BUILD=$BUILD)" >&2; exit 1; }
done
MK="$ROOT/$BUILD/bench/make_model"
[ -x "$MK" ] || { echo "qwen3_bake: no $MK (make BUILD=$BUILD)" >&2; exit 1; }
CFG=${BAKE_CONFIG:-}
if [ -z "$CFG" ]; then
	CFG=$ROOT/../shared/reference/bakery-py/examples/basic.yaml
	[ -f "$CFG" ] || CFG=$ROOT/bench/data/bakery-py-basic.yaml
fi
[ -f "$CFG" ] || { echo "qwen3_bake: no config $CFG" >&2; exit 1; }
HFC=$ROOT/tests/data/hf-configs/Qwen3-0.6B
T=$(mktemp -d "${TMPDIR:-/tmp}/bk-qwen3.XXXXXX")
[ -n "${KEEP:-}" ] && echo "qwen3_bake: keeping $T" || trap 'rm -rf "$T"' EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# the model: random bf16 weights of the real shape, then the real configuration files
M=$T/Qwen3-0.6B
xz -dc "$ROOT/tests/golden/bpe/qwen.tokenizer.json.xz" >"$T/tokenizer.json"
if [ -n "${TINY:-}" ]; then # a smoke test of this script: a 2-layer Qwen3, make_model's config
	"$MK" "$M" 64 2 4 2 128 151936 "$T/tokenizer.json" bf16 1 qwen3
	cp "$HFC/tokenizer_config.json" "$HFC/chat_template.jinja" "$HFC/generation_config.json" "$M/"
else
	"$MK" "$M" 1024 28 16 8 3072 151936 "$T/tokenizer.json" bf16 1 qwen3
	cp "$HFC/config.json" "$HFC/tokenizer_config.json" "$HFC/chat_template.jinja" \
		"$HFC/generation_config.json" "$M/"
fi
[ -n "${TINY:-}" ] || for k in hidden_size:1024 num_hidden_layers:28 num_attention_heads:16 num_key_value_heads:8 \
	intermediate_size:3072 vocab_size:151936 head_dim:128; do
	jq -e ".${k%%:*} == ${k##*:}" "$M/config.json" >/dev/null ||
		{ echo "qwen3_bake: $HFC/config.json: ${k%%:*} is not ${k##*:}" >&2; exit 1; }
done

# the config: the tool's file with the local model and our output_dir
awk -v m="$M" -v o="$T/out" -v n="${PROMPTS:-0}" '
	/^model_name_or_path:/ { print "model_name_or_path: \"" m "\""; next }
	/^output_dir:/ { print "output_dir: \"" o "\""; next }
	/^[A-Za-z_]+:/ { inp = ($1 == "training_prompts:") }
	inp && /^  - / { if (n > 0 && ++k > n) next }
	{ print }' "$CFG" >"$T/basic.yaml"
echo "qwen3_bake: config $CFG, with model_name_or_path and output_dir rewritten${PROMPTS:+, the first $PROMPTS training_prompts}${*:+, overrides: $*}"
diff "$CFG" "$T/basic.yaml" | sed 's/^/  /' || true

# bk-bake from a directory of wrappers: each stage under /usr/bin/time; bk-gen and bk-teach
# with -v (their token counts on their logs); MIN_MASS=M adds bk-teach --min-mass M (0:
# top-k fields even for a flat teacher, as a trained model's would be)
mkdir -p "$T/bin" "$T/time"
cp "$B/bk-bake" "$T/bin/"
for t in bk-tokenize bk-lens bk-gen bk-teach bk-step bk-eval; do
	x=""
	case $t in
	bk-gen) x=" -v" ;;
	bk-teach) x=" -v${MIN_MASS:+ --min-mass $MIN_MASS}" ;;
	esac
	printf '#!/bin/sh
echo "$*" >"%s/time/%s.$$.args"
exec /usr/bin/time -f "%%e %%U %%S %%M" -o "%s/time/%s.$$" "%s/%s"%s "$@"
' \
		"$T" "$t" "$T" "$t" "$B" "$t" "$x" >"$T/bin/$t"
	chmod +x "$T/bin/$t"
done

echo "qwen3_bake: $(git log -1 --format='HEAD %h %cd' --date=iso 2>/dev/null || echo 'no git'), bk-bake built $(date -u -r "$B/bk-bake" '+%F %T UTC'); $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg) before"
/usr/bin/time -f '%e %U %S %M' -o "$T/bake.time" "$T/bin/bk-bake" "$T/basic.yaml" "$@" \
	>"$T/bake.log" 2>"$T/bake.err" || {
	cat "$T/bake.err" >&2; tail -5 "$T"/out/logs/*.log >&2 2>/dev/null
	echo "qwen3_bake: bk-bake failed" >&2; exit 1; }
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
test -f "$T/out/final_model/adapter_model.safetensors"
sed -n '/bake summary/,/^=====*$/p' "$T/bake.log"
[ -s "$T/bake.err" ] && sed 's/^/  bk-bake stderr: /' "$T/bake.err"

# tokens per stage, from the stages' own reports on their logs
L=$T/out/logs
gen_new=$(sed -n 's/.* prompt tokens, \([0-9]*\) new tokens in .*/\1/p' "$L/bk-gen.log" | tail -1)
gen_prompt=$(sed -n 's/.* \([0-9]*\) prompt tokens, [0-9]* new tokens in .*/\1/p' "$L/bk-gen.log" | tail -1)
teach_tok=$(sed -n 's/.* forwards, \([0-9]*\) tokens (prefix.*/\1/p' "$L/bk-teach.log" | tail -1)
step_tok=$(jq -r '.bakery.train.tokens // empty' "$T/out/results.json")
grep -h 'writing no teacher field\|uncovered mass' "$L/bk-teach.log" | sed 's/^/  /' || true
printf '\n%-12s %10s %9s %9s %12s %14s %9s\n' stage tokens "wall s" "CPU s" "tokens/s" "per CPU-s" "max RSS"
for t in bk-tokenize bk-lens bk-gen bk-teach bk-step bk-eval; do
	for f in "$T/time/$t".*; do
		case $f in *.args) continue ;; esac
		[ -f "$f" ] || continue
		[ "$(cat "$f.args")" = --help ] && continue # bk-bake's probe of bk-step's flags
		read -r w u s rss <"$f"
		c=$(echo "$u + $s" | bc)
		case $t in
		bk-gen) n=$gen_new what="new tokens sampled (prompt tokens prefilled: $gen_prompt)" ;;
		bk-teach) n=$teach_tok what="teacher tokens (prompt + response) scored"
			grep -q 'writing no teacher field' "$L/bk-teach.log" &&
				what="$what: the first batch only (a flat teacher: bk-step runs the exact teacher)" ;;
		bk-step) n=$step_tok what="student tokens trained" ;;
		*) n="" what="" ;;
		esac
		if [ -n "$n" ] && [ "$n" -gt 0 ]; then
			sum="${sum:+$sum, }$t $n tokens $(printf '%.1f/s, %.1f per CPU-s' "$(echo "$n / $w" | bc -l)" "$(echo "$n / $c" | bc -l)")"
			printf '%-12s %10s %9.1f %9.1f %12.2f %14.2f %6d MB  %s\n' "$t" "$n" "$w" "$c" \
				"$(echo "$n / $w" | bc -l)" "$(echo "$n / $c" | bc -l)" $((rss / 1024)) "$what"
		else
			printf '%-12s %10s %9.1f %9.1f %12s %14s %6d MB\n' "$t" - "$w" "$c" - - $((rss / 1024))
		fi
	done
done
read -r w u s rss <"$T/bake.time"
printf '%-12s %10s %9.1f %9.1f %12s %14s %6d MB  (bk-bake and every stage; max RSS of one process)\n' "whole bake" - "$w" \
	"$(echo "$u + $s" | bc)" - - $((rss / 1024))
echo "qwen3_bake: load average $load_after after"
echo "qwen3_bake: $sum; whole bake $w s wall, $(echo "$u + $s" | bc) s CPU"
