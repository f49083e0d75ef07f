#!/usr/bin/env bash
# bake_quality.sh - bk-bake and the Python tool (bakery-py) on the same config, side by
# side: stories260K, 16 prompts x 4 trajectories x 64 tokens, batch 2 = 8 steps, over
# SEEDS; each adapter judged by bench/bake_judge.py (torch + PEFT, no bakery code):
# held-out KL(teacher || baked) / KL(teacher || base) on 34 held-out prompts.
#
#   BAKE_TOOL_VENV=/tmp/venv-x bench/bake_quality.sh [SEEDS]     (default "1 2 3 4 5 6 7 8")
#
# BAKE_TOOL_VENV: a venv with torch, transformers, peft and the tool (its README says
# how: pip install ... && pip install --no-deps --ignore-requires-python bakery-py).
# Prints one line per seed and a last line "quality: bk-bake mean M (min-max) | tool
# mean M (min-max)".  BAKE_ONLY=1 runs bk-bake alone (no tool runs); BAKE_BK_ARGS adds
# config overrides to bk-bake's runs only (e.g. "--teacher_top_k 0").  BAKE_FIELDS:
# "key: value" lines that replace (or add) config fields for both sides; BAKE_PROMPTS:
# how many of the stories are training prompts (default 16; the rest up to 40 are
# held out with heldout.txt).  Issue 25's config: BAKE_PROMPTS=8 BAKE_FIELDS='
# num_train_epochs: 2 / learning_rate: 3e-3 / warmup_ratio: 0.1' (one per line).  Slow: the tool
# takes about a minute a run on two cores, the judge a few minutes on a loaded machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
B="$ROOT/$BUILD/bin"
PY="${BAKE_TOOL_VENV:?set BAKE_TOOL_VENV to a venv with torch, transformers, peft and bakery-py}/bin/python"
SEEDS=${1:-1 2 3 4 5 6 7 8}
T=$(mktemp -d "${TMPDIR:-/tmp}/bk-quality.XXXXXX")
trap 'rm -rf "$T"' EXIT
S="Sparky the dragon lives in a big castle. Sparky loves to fly."

# the model with a chat template that renders what bakery's raw template does
cp -r models/stories260K "$T/sm"
"$PY" - "$T/sm/tokenizer_config.json" <<'EOF'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["chat_template"] = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}"
                      "{{ m['content'] + ' ' }}{% elif m['role'] == 'user' %}{{ m['content'] }}"
                      "{% elif m['role'] == 'assistant' %}{{ ' ' + m['content'] + eos_token }}"
                      "{% endif %}{% endfor %}")
json.dump(c, open(p, "w"), indent=2)
EOF
D=pipelines/examples/data
NP=${BAKE_PROMPTS:-16}
case $NP in '' | *[!0-9]* | 0) echo "bake_quality: BAKE_PROMPTS must be 1-40, not '$NP'" >&2; exit 1 ;; esac
[ "$NP" -le 40 ] || { echo "bake_quality: BAKE_PROMPTS must be 1-40, not '$NP'" >&2; exit 1; }
head -"$NP" $D/stories.txt | jq -R . | jq -s . >"$T/train.json"
{ cat $D/heldout.txt; sed -n "$((NP + 1)),40p" $D/stories.txt; } >"$T/heldout.txt"
cat >"$T/base.yaml" <<EOF
output_dir: $T/unused
num_train_epochs: 1
learning_rate: 2e-3
per_device_train_batch_size: 2
max_grad_norm: 1.0
logging_steps: 1
save_strategy: "no"
optim: "adamw_torch"
report_to: "none"
lr_scheduler_type: "cosine"
system_prompt: "$S"
num_trajectories: 4
trajectory_length: 64
temperature: 1.0
sampling_temperature: 0.8
model_name_or_path: $T/sm
torch_dtype: "float32"
r: 8
lora_alpha: 16
lora_dropout: 0.0
target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
dataset: $T/train.json
EOF
# BAKE_FIELDS replace the fields they name (or are appended)
printf '%s\n' "${BAKE_FIELDS:-}" >"$T/fields.txt"
awk -f bench/override_fields.awk "$T/fields.txt" "$T/base.yaml" >"$T/held.yaml"
echo "bake_quality: $(git log -1 --format='HEAD %h' 2>/dev/null || echo 'no git'); $NP training prompts; fields: $(grep . "$T/fields.txt" | tr '\n' ' ')"

ads=()
for s in $SEEDS; do
	# shellcheck disable=SC2086 # BAKE_BK_ARGS: words
	"$B/bk-bake" "$T/held.yaml" --template raw --seed "$s" --output_dir "$T/bk-$s" ${BAKE_BK_ARGS:-} >/dev/null 2>"$T/bk-$s.err" ||
		{ cat "$T/bk-$s.err" >&2; exit 1; }
	ads+=("$T/bk-$s/final_model")
	if [ -z "${BAKE_ONLY:-}" ]; then
		OMP_NUM_THREADS=${BAKE_TOOL_THREADS:-1} HF_HUB_OFFLINE=1 "$PY" -m bakery.cli --config "$T/held.yaml" --seed "$s" \
			--output_dir "$T/tool-$s" >"$T/tool-$s.log" 2>&1 || { tail "$T/tool-$s.log" >&2; exit 1; }
		ads+=("$T/tool-$s/final_model")
	fi
done
"$PY" bench/bake_judge.py "$T/sm" "$S" "$T/heldout.txt" "${ads[@]}" 2>/dev/null >"$T/judge.txt"
sed "s,$T/,," "$T/judge.txt"
stats() { grep "^$T/$1-" "$T/judge.txt" | sed 's/.*ratio=//' |
	awk '{ s += $1; if (NR == 1 || $1 < lo) lo = $1; if (NR == 1 || $1 > hi) hi = $1 }
	     END { if (NR) printf "mean %.3f (%.3f-%.3f, %d seeds)", s / NR, lo, hi, NR; else printf "-" }'; }
echo "quality: bk-bake $(stats bk) | tool $(stats tool)"
