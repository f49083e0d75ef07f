#!/usr/bin/env bash
# t0957-emu-oom.sh - out of device memory on the emulated GPU (make emu, build-emu/; its
# device as small as BK_EMU_DEVICE_MEMORY says): bk-gen, bk-step and bk-teach on
# stories260K each die with one line that names the stage, the buffer that did not fit
# (every device buffer of gpu/cuda/ goes through bk_cuda_dev_alloc with a name, the
# former bypasses too: the lin2 scratch, the decode attention workspace), what the process holds by name, what other processes hold, and what to
# change.  Each buffer is looked for over a few device sizes, so that a buffer that grows
# or shrinks a little still fails somewhere in the range; every run must fail that way.
. "$(dirname "$0")/lib.sh"
emu_setup bin/bk-gen

bk-tokenize --model "$M" --system "Sparky is a friendly dragon." "$DATA/pipe/stories.txt" -o tok.bk 2>/dev/null &&
	bk-gen --model "$M" --device cpu --num-trajectories 2 --max-new-tokens 24 --seed 1 tok.bk -o gen.bk 2>/dev/null &&
	bk-lens -q --max-tokens 256 --seed 1 gen.bk -o b.bk || echo "not ok - stories260K stream"

B='[0-9.]+ ([KMG]iB|bytes)' # an amount in a message
# oom 'SIZES' NAME TOOL ARGS...: TOOL fails on a device of each size, with its own
# rendezvous (no shared weights of another run), in one line of the expected shape; one
# of the sizes names NAME
oom() {
	local sizes=$1 name=$2 tool=$3 hit= mem; shift 3
	for mem in $sizes; do
		rm -rf run && mkdir -m 700 run &&
			test_must_fail env XDG_RUNTIME_DIR="$PWD/run" BK_EMU_DEVICE_MEMORY=$mem \
				"$tool" --model "$M" --device cuda "$@" 2>err >/dev/null || return 1
		grep -Eq "^$tool: error: out of device memory for '[^']+' \($B asked\): $B of [0-9.]+ MiB free; this process holds $B \([^;]*shared weights 2\.0 MiB[^;]*\); $B held by other processes \(other stages of the pipe, a shared weight copy\) and the CUDA context; .*bk-bake --dry-run --gpu-memory SIZE\$" err ||
			grep -Eq "^$tool: error: out of device memory for 'shared weights' \(2\.0 MiB asked\): .* this process holds nothing; " err ||
			{ echo "$tool on $mem: not the out-of-memory line:"; cat err; return 1; }
		grep -q "for '$name' (" err && hit=1
	done
	[ -n "$hit" ] || { echo "no run of $tool on $sizes ran out in '$name' (the last: $(cat err))"; return 1; }
}

G="--num-trajectories 4 --max-new-tokens 200 --seed 1 tok.bk"
test_expect_success 'bk-gen: the shared weights, the kv pool, the decode attention workspace, the lin2 scratch' '
	oom 1M "shared weights" bk-gen $G &&
	oom "4M 5M" "kv pool" bk-gen $G &&
	oom "3.3M 3.4M 3.5M 3.6M" "decode attention workspace" bk-gen --kv-memory 1M $G &&
	(export BK_DECODE=v2 && oom "4M 8M" "lin2 scratch" bk-gen $G) &&
	grep -q "lower --kv-memory" err
'

S="--lora-r 8 --lora-alpha 16 --max-steps 1 --out o b.bk"
# (no 'weight staging' here: stories260K's weights stream in bf16 through pinned host
# memory since gpu/cuda/cuda_wload.cuh, without the device staging buffer, which only
# Gemma's (1 + w) norm tensors still use; 4-bit linears are copied in directly)
test_expect_success 'bk-step: the LoRA adapter, the optimizer state, the activations' '
	oom "2.05M 2.2M" "LoRA adapter" bk-step $S &&
	oom "2.5M" "optimizer state" bk-step $S &&
	oom "3M" "activations" bk-step $S &&
	grep -q "use --grad-checkpoint" err
'

test_expect_success 'bk-teach: the activations, a workspace slot' '
	oom "2.2M 2.4M" activations bk-teach --top-k 8 b.bk &&
	oom "2.7M 2.8M 2.9M" "workspace 1" bk-teach --top-k 8 b.bk
'

test_done
