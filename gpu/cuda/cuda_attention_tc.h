/* cuda_attention_tc.h - the tensor-core (bf16 mma.sync) flash attention of
 * gpu/cuda/cuda_attention_tc.cu, the BK_ATTN selection between it and the fp32 kernel of
 * gpu/cuda/cuda_attention.cu, and a CUDA-event timer for the check programs.  Exists only in a
 * CUDA build (BK_HAVE_CUDA).  Not the fp32 kernel (gpu/cuda/cuda.h declares that one).
 *
 * BK_ATTN (environment, read once): "fp32" or unset = the fp32 kernel (the default until
 * a GPU run has validated the tensor-core one); "tc" = the tensor-core kernel; anything
 * else dies with a one-line message.  The tensor-core kernel handles D = 64, 128 and 256
 * with 16-byte aligned buffers; any other call goes to the fp32 kernel (same contract). */
#ifndef BK_CUDA_ATTENTION_TC_H
#define BK_CUDA_ATTENTION_TC_H

#include <stdint.h>

#include "gpu/ops.h"

#ifdef BK_HAVE_CUDA
#ifdef __cplusplus
extern "C" {
#endif

/* the signatures of bk_ops.attention_forward / attention_backward (ops.h semantics) */
void bk_cuda_attention_tc_forward(float *out /* [T,NH,D] */, float *lse /* [NH,T] */,
				  const float *q /* [T,NH,D] */, const float *k /* [T,NKV,D] */,
				  const float *v /* [T,NKV,D] */,
				  const int32_t *cu_seqlens /* [S+1] */, int S, int T, int NH,
				  int NKV, int D, const float *prefix_k /* [P,NKV,D] or NULL */,
				  const float *prefix_v /* [P,NKV,D] or NULL */, int P,
				  const bk_attn *ap);
void bk_cuda_attention_tc_backward(float *dq /* [T,NH,D] += */, float *dk /* [T,NKV,D] += */,
				   float *dv /* [T,NKV,D] += */, const float *dout /* [T,NH,D] */,
				   const float *q, const float *k, const float *v,
				   const float *out /* [T,NH,D] */, const float *lse /* [NH,T] */,
				   const int32_t *cu_seqlens /* [S+1] */, int S, int T, int NH,
				   int NKV, int D, const bk_attn *ap);

/* 1 when the tensor-core kernel itself runs for head dimension D (else the fp32 one) */
int bk_cuda_attention_tc_supports(int D);

/* the op-table entries: the kernel BK_ATTN selects */
void bk_cuda_attention_forward_sel(float *out, float *lse, const float *q, const float *k,
				   const float *v, const int32_t *cu_seqlens, int S, int T,
				   int NH, int NKV, int D, const float *prefix_k,
				   const float *prefix_v, int P, const bk_attn *ap);
void bk_cuda_attention_backward_sel(float *dq, float *dk, float *dv, const float *dout,
				    const float *q, const float *k, const float *v,
				    const float *out, const float *lse, const int32_t *cu_seqlens,
				    int S, int T, int NH, int NKV, int D, const bk_attn *ap);

/* 1 when BK_ATTN=tc */
int bk_cuda_attention_tc_selected(void);

/* BK_ACT=bf16 (gpu/cuda/cuda_act.cuh): the same kernels on bf16 q, k, v, prefix and out
 * (lse, dout, dq/dk/dv fp32).  _ok: 1 when D is 64/128/256 and the n buffers are 16-byte
 * aligned (NULL is fine), else the caller widens to fp32 and runs the fp32 op; the two
 * others BUG on what _ok refuses. */
int bk_cuda_attention_tc_bf16_ok(int D, const void *const *bufs, int n);
void bk_cuda_attention_tc_forward_bf16(void *out /* [T,NH,D] bf16 */, float *lse /* [NH,T] */,
				       const void *q, const void *k, const void *v,
				       const int32_t *cu_seqlens, int S, int T, int NH, int NKV,
				       int D, const void *prefix_k, const void *prefix_v, int P,
				       const bk_attn *ap);
void bk_cuda_attention_tc_backward_bf16(float *dq, float *dk, float *dv, const float *dout,
					const void *q, const void *k, const void *v,
					const void *out, const float *lse,
					const int32_t *cu_seqlens, int S, int T, int NH, int NKV,
					int D, const bk_attn *ap);

/* milliseconds per call of fn(arg), CUDA events on the op stream around reps calls
 * (after one untimed warm-up call) */
double bk_cuda_time_ms(void (*fn)(void *arg), void *arg, int reps);

#ifdef __cplusplus
}
#endif
#endif /* BK_HAVE_CUDA */

#endif
