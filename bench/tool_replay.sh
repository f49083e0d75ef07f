#!/usr/bin/env bash
# tool_replay.sh - bk-bake's training against the Python tool's on the same data.  One
# bake of CONFIG (a persona config in the tool's format, e.g. OUT/persona.yaml of
# bench/persona_quality.sh) at SEED, then its pipe (bk-lens | bk-gen | bk-step, the
# commands `bk-bake --dry-run` prints) run again with the trajectory stream kept and a
# checkpoint after every step: the first runs at learning rate 0 (HF's warmup), so
# checkpoint-1 holds bk-step's initial LoRA weights.  Then bench/tool_replay.py: the tool's
# PromptBakingTrainer on those trajectories, in bk-step's batches, from those weights.
# Prints both sides' loss and gradient norm per step with their relative difference, the
# adapters' relative difference (norm of A - B over norm of B, over all tensors, and the
# largest of one tensor), and whether the rerun reproduced the bake's adapter.
#
#   BAKE_TOOL_VENV=/venv OUT=DIR bench/tool_replay.sh CONFIG [SEED]     (default seed 1)
#
# TOOL_TOKENIZER=hf5: the tool tokenizes as transformers 5 does (for SmolLM2 white space
# before a digit splits otherwise; man bk-bake, Transformers 5.3).  Default: as bakery,
# so that only the training differs.  CONFIG must have warmup (warmup_steps or
# warmup_ratio), else step 1 moves the weights and the replay says so and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
B="$ROOT/${BUILD:-build}/bin"
PY="${BAKE_TOOL_VENV:?set BAKE_TOOL_VENV to a venv with torch, transformers, peft and bakery-py}/bin/python"
CONFIG=${1:?usage: OUT=DIR bench/tool_replay.sh CONFIG [SEED]}
SEED=${2:-1}
T=${OUT:?set OUT to a directory}
mkdir -p "$T"
PATH="$B:$PATH"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

bk-bake "$CONFIG" --seed "$SEED" --output_dir "$T/bk" --overwrite_output_dir true >"$T/bake.log" 2>&1 ||
	{ tail "$T/bake.log" >&2; exit 1; }
cp "$T/bk/final_model/adapter_model.safetensors" "$T/bake-adapter.safetensors"
# the pipe as the bake ran it (its tokens.bk and order.bk are reused): tee the bk-gen
# stream, a checkpoint every step
bk-bake --dry-run "$CONFIG" --seed "$SEED" --output_dir "$T/bk" --overwrite_output_dir true >"$T/plan" 2>/dev/null
export TRAJ="$T/traj.bk"
# shellcheck disable=SC2016 # $TRAJ is expanded when pipe.sh runs
awk '/^bk-lens /,/^    bk-step / { print }' "$T/plan" |
	sed -e '/^    bk-gen /s,|$,| tee "$TRAJ" |,' -e '/^    bk-step /s, >, --save-steps 1 >,' >"$T/pipe.sh"
# shellcheck disable=SC2016
if ! grep -q 'tee "$TRAJ"' "$T/pipe.sh" || ! grep -q -- '--save-steps 1 >' "$T/pipe.sh"; then
	echo "tool_replay: no bk-lens | bk-gen | bk-step pipe in bk-bake --dry-run's output ($T/plan)" >&2
	exit 1
fi
bash -o pipefail "$T/pipe.sh" 2>"$T/pipe.log" || { tail "$T/pipe.log" >&2; exit 1; }
bk-dump "$T/bk/metrics.bk" | jq -r 'select(.loss != null) | "\(.step) \(.loss) \(.lr) \(.grad_norm)"' >"$T/bk.steps"
[ "$(awk 'NR == 1 { print ($1 == 1 && $3 == 0) }' "$T/bk.steps")" = 1 ] ||
	{ echo "tool_replay: step 1 ran at a learning rate above 0: checkpoint-1 is not the initial adapter (give CONFIG warmup)" >&2; exit 1; }
bk-dump "$T/traj.bk" | jq -c '{user, response, batch}' >"$T/traj.jsonl"

flag=
[ "${TOOL_TOKENIZER:-}" = hf5 ] && flag=--hf5-tokenizer
HF_HUB_OFFLINE=1 "$PY" "$ROOT/bench/tool_replay.py" "$CONFIG" "$T/traj.jsonl" \
	"$T/bk/checkpoint-1/adapter_model.safetensors" "$T/tool" $flag >"$T/tool.log" 2>&1 ||
	{ tail "$T/tool.log" >&2; exit 1; }
grep '^step ' "$T/tool.log" | awk '{ print $2, $4, $6, $8 }' >"$T/tool.steps"

echo "tool_replay: $(wc -l <"$T/traj.jsonl") trajectories, $(wc -l <"$T/bk.steps") steps; the tool's tokenizer: $([ -n "$flag" ] && echo "transformers 5's own" || echo "tokenizer.json's pre-tokenizer, as bakery")"
echo "per step: bk-step loss, the tool's, relative difference; grad norms likewise"
join "$T/bk.steps" "$T/tool.steps" | awk '{
	dl = ($2 - $5) / $5; dg = ($4 - $7) / $7
	printf "step %3d loss %.6f %.6f %+.1e  grad_norm %.5f %.5f %+.1e\n", $1, $2, $5, dl, $4, $7, dg
	if (dl < 0) dl = -dl; if (dl > m) m = dl } END { printf "largest relative loss difference %.1e\n", m }'
"$PY" - "$T/bk/final/adapter_model.safetensors" "$T/tool/final_model/adapter_model.safetensors" <<'PYEOF'
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
if set(a) != set(b):
    sys.exit("tool_replay: the adapters hold different tensors")
num = den = worst = 0.0
for k in a:
    d = float((a[k].double() - b[k].double()).norm()) ** 2
    n = float(b[k].double().norm()) ** 2
    num, den = num + d, den + n
    if n > 0:
        worst = max(worst, (d / n) ** 0.5)
print("adapters: relative difference %.2e over all %d tensors, largest of one tensor %.2e" % ((num / den) ** 0.5, len(a), worst))
PYEOF
if cmp -s "$T/bake-adapter.safetensors" "$T/bk/final/adapter_model.safetensors"; then
	echo "the rerun pipe reproduced the bake's adapter bytes"
else
	echo "the rerun pipe did NOT reproduce the bake's adapter bytes"
fi
