/* blas_core.h - OpenBLAS's kernel on CPUs newer than the library.  A DYNAMIC_ARCH
 * OpenBLAS picks its kernels from the CPU model number; a model it does not know
 * (Debian 12's 0.3.21 on an Emerald Rapids Xeon, model 207) gets the generic SSE3
 * "Prescott" kernels, about half the speed of its AVX-512 ones for the training
 * step's sgemm.  bk_blas_core_fix(), when OPENBLAS_CORETYPE is unset and OpenBLAS runs
 * Prescott (or another pre-AVX core) on a CPU with AVX-512 (F, BW, DQ, VL) or with AVX2
 * and FMA, sets OPENBLAS_CORETYPE to SkylakeX or Haswell (children inherit it) and has
 * OpenBLAS choose again (gotoblas_dynamic_quit/init, looked up at run time: a library
 * without them is left alone).  Call it before the first BLAS call; once is enough. */
#ifndef BK_BLAS_CORE_H
#define BK_BLAS_CORE_H

/* returns the core it switched to, or NULL when it left OpenBLAS alone */
const char *bk_blas_core_fix(void);

#endif
