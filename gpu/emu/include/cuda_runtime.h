// the emulation build's <cuda_runtime.h> (make emu): gpu/emu/emu.h
#include "gpu/emu/emu.h"
