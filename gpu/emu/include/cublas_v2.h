// the emulation build's <cublas_v2.h> (make emu): gpu/emu/emu_cublas.h
#include "gpu/emu/emu_cublas.h"
