/* host_rows.h - bk_ops_host_rows(): the host twin with batch-invariant linears, for the
 * teacher pass (gpu/teach.c).  Every other op is bk_ops_host's.  The frozen linears and
 * the LM head go through the generation ops' row-wise matmul (gpu/host/host_decode.c), whose
 * every output element is one fixed sequence of float operations on its own row, and
 * every other op the forward uses is already per row (RMSNorm, RoPE, attention over a
 * row's keys in position order, elementwise ops).  So a sequence's teacher field is the
 * same bits whatever else shares its forward, the token budget and whether it ran
 * against a prefix; OpenBLAS's sgemm, by contrast, picks its blocking (and so its
 * summation order) from the matrix sizes and the CPU's kernel.  Not for training
 * (linear_backward and the LoRA ops stay OpenBLAS). */
#ifndef BK_HOST_ROWS_H
#define BK_HOST_ROWS_H

#include "gpu/ops.h"

const bk_ops *bk_ops_host_rows(void);

/* The row-wise matmul's code path (gpu/host/host_decode.c): "avx512", "avx2" or "sse2",
 * the same bits from each, only the speed differs.  bk_host_rows_isa_name() gives the
 * one in use, chosen at first use from $BK_HOST_ISA when set (an error when this CPU
 * cannot run it), else the fastest this CPU runs; bk_host_rows_isa(NAME) switches to
 * NAME (NULL or "": the fastest) and returns 0, or -1 when this CPU cannot run it. */
int bk_host_rows_isa(const char *name);
const char *bk_host_rows_isa_name(void);

#endif
