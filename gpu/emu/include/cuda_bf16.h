// the emulation build's <cuda_bf16.h> (make emu): gpu/emu/emu.h
#include "gpu/emu/emu.h"
