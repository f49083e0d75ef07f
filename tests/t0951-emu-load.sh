#!/usr/bin/env bash
# t0951-emu-load.sh - loading without a host copy of the model, on the emulated GPU (make
# emu, build-emu/): tests/unit/test_load_bf16.c's CUDA part (the plain build has no
# device and runs only its host-twin part): the weights streamed in bf16 chunks from the
# mapped checkpoint (ops->weight_upload_bf16) are the fp32 path's device weights byte for
# byte (bf16, fp16 and fp32 checkpoints; Llama, tied, Qwen-2, Gemma-3), a NaN dies naming
# its tensor, and the load's peak private host memory stays within the staging buffers
# plus 1 MiB on a model whose largest tensor is 12 MiB in fp32.  A companion of
# tests/t0950-emu.sh.
. "$(dirname "$0")/lib.sh"
EMU_BUILD=${BK_EMU_BUILD:-$ROOT/build-emu}
[ -x "$EMU_BUILD/tests/test_load_bf16" ] || { echo "not ok - no emulation build in $EMU_BUILD (make emu)"; exit 1; }
export XDG_CACHE_HOME="$TEST_TMP/cache" OMP_NUM_THREADS=1

test_expect_success 'streamed bf16 load: the fp32 path'"'"'s device weights, no host copy (test_load_bf16 on the emulated GPU)' '
	(cd "$ROOT" && "$EMU_BUILD/tests/test_load_bf16") >ld.log 2>&1 || { cat ld.log; false; } &&
	cat ld.log && grep -q "^cuda, big bf16: 57 device weights" ld.log &&
	grep -q "peak private host memory of the load\|host memory not measured under ASan" ld.log
'

test_done
