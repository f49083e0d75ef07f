#!/usr/bin/env bash
# bake_speed.sh - the whole bake, bk-bake against the Python tool (bakery-py), on the same
# cores one after the other: SmolLM2-135M-Instruct with the tool's basic config
# (examples/basic.yaml) at the shape of issue 13: 16 prompts (pipelines/demo-chat) x 2
# trajectories x 48 tokens, 2 epochs, batch 1 (32 steps), r 16 / alpha 32 on all seven
# linears, cosine, warmup 0.1, sampling temperature 0.8, float32 (bf16 off: a CPU run).
#
#   BAKE_TOOL_VENV=/tmp/venv-x bench/bake_speed.sh        (BAKE_ONLY=1: bk-bake alone)
#
# The model: $BK_SMOLLM2, else $XDG_CACHE_HOME/bakery/SmolLM2-135M-Instruct (make
# demo-chat converts it there).  Prints one line per run (wall, user and system CPU
# seconds, from /usr/bin/time; CPU time counts every stage of bk-bake) and a last line
# "bake_speed: bk-bake W s (C s CPU) | tool W s (C s CPU) | Rx wall, Qx CPU".  On a
# loaded machine the CPU-time ratio is the steadier one.  Slow: minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD=${BUILD:-build}
B="$ROOT/$BUILD/bin"
M=${BK_SMOLLM2:-${XDG_CACHE_HOME:-$HOME/.cache}/bakery/SmolLM2-135M-Instruct}
[ -f "$M/config.json" ] || { echo "bake_speed: no model at $M (make demo-chat, or set BK_SMOLLM2)" >&2; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/bk-speed.XXXXXX")
trap 'rm -rf "$T"' EXIT
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

head -16 pipelines/demo-chat/train.txt | jq -R . | jq -s . >"$T/train.json"
S=$(cat pipelines/demo-chat/system.txt)
cat >"$T/basic.yaml" <<EOF
output_dir: $T/unused
num_train_epochs: 2
learning_rate: 1e-4
per_device_train_batch_size: 1
max_grad_norm: 1.0
logging_steps: 5
save_strategy: "no"
gradient_checkpointing: false
optim: "adamw_torch"
bf16: false
report_to: "none"
seed: 42
lr_scheduler_type: "cosine"
warmup_ratio: 0.1
system_prompt: $(jq -Rn --arg s "$S" '$s')
num_trajectories: 2
trajectory_length: 48
temperature: 1.0
sampling_temperature: 0.8
model_name_or_path: $M
torch_dtype: "float32"
r: 16
lora_alpha: 32
target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
lora_dropout: 0.05
dataset: $T/train.json
EOF

# run NAME CMD...: wall, user and system seconds of CMD and its children
run() {
	local name=$1
	shift
	/usr/bin/time -f '%e %U %S' -o "$T/$name.time" "$@" >"$T/$name.log" 2>&1 ||
		{ tail "$T/$name.log" >&2; echo "bake_speed: $name failed" >&2; exit 1; }
	read -r w u s <"$T/$name.time"
	echo "$name: ${w} s wall, ${u} s user, ${s} s system"
}

run bk-bake "$B/bk-bake" "$T/basic.yaml" --output_dir "$T/bk"
test -f "$T/bk/final_model/adapter_model.safetensors"
read -r bw bu bs <"$T/bk-bake.time"
line="bake_speed: bk-bake $bw s ($(echo "$bu + $bs" | bc) s CPU)"
if [ -z "${BAKE_ONLY:-}" ]; then
	PY="${BAKE_TOOL_VENV:?set BAKE_TOOL_VENV to a venv with torch, transformers, peft and bakery-py (or BAKE_ONLY=1)}/bin/python"
	HF_HUB_OFFLINE=1 run tool "$PY" -m bakery.cli --config "$T/basic.yaml" --output_dir "$T/tool"
	test -d "$T/tool/final_model"
	read -r tw tu ts <"$T/tool.time"
	line="$line | tool $tw s ($(echo "$tu + $ts" | bc) s CPU) | $(printf '%.2fx wall, %.2fx CPU' \
		"$(echo "$tw / $bw" | bc -l)" "$(echo "($tu + $ts) / ($bu + $bs)" | bc -l)")"
fi
echo "$line"
