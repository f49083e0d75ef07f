/* host_attn.h - the host twin's two attentions (gpu/host/host_ops.c).  bk_ops_host's
 * attention_forward / attention_backward (ops.h) are blocked: query tiles against key
 * spans by sgemm, for training speed.  The row-wise ones here score one query row at a
 * time over its keys in position order (host_dots.h): every output of a row is one fixed
 * sequence of float operations on that row and its keys, whatever else is batched and
 * whether its first keys came as a prefix, so the teacher pass (host_rows.c) takes the
 * forward; the backward stays as the blocked one's reference for tests/unit.  Same
 * signatures and semantics as ops.h's attention_forward / attention_backward. */
#ifndef BK_HOST_ATTN_H
#define BK_HOST_ATTN_H

#include "gpu/ops.h"

void bk_host_attention_forward_rows(float *out, float *lse, const float *q, const float *k,
				    const float *v, const int32_t *cu_seqlens, int S, int T,
				    int NH, int NKV, int D, const float *prefix_k,
				    const float *prefix_v, int P, const bk_attn *ap);
void bk_host_attention_backward_rows(float *dq, float *dk, float *dv, const float *dout,
				     const float *q, const float *k, const float *v,
				     const float *out, const float *lse, const int32_t *cu_seqlens,
				     int S, int T, int NH, int NKV, int D, const bk_attn *ap);

#endif
