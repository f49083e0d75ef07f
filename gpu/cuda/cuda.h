/* cuda.h - C-callable declarations of the CUDA compute path: the op table bk_ops_cuda
 * (gpu/cuda/cuda_ops.cu), the attention ops it points at (gpu/cuda/cuda_attention.cu) and a few
 * device queries (memory counters, synchronisation).  Everything here exists only in a
 * CUDA build (BK_HAVE_CUDA); host C that uses it must be guarded the same way.
 * Not the kernels (the gpu/ .cu files) and not device selection (gpu/device.h). */
#ifndef BK_CUDA_H
#define BK_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/ops.h"

#ifdef BK_HAVE_CUDA
#ifdef __cplusplus
extern "C" {
#endif

/* The CUDA op table: base weights in bf16, activations and LoRA in fp32, matmuls on
 * tensor cores with fp32 accumulation.  Ordered on one stream (bk_cuda_stream in
 * cuda_common.cuh); download synchronises. */
extern const bk_ops bk_ops_cuda;

/* gpu/cuda/cuda_attention.cu: exactly the signatures of bk_ops.attention_forward and
 * bk_ops.attention_backward (see ops.h for the semantics). */
void bk_cuda_attention_forward(float *out /* [T,NH,D] */, float *lse /* [NH,T] */,
			       const float *q /* [T,NH,D] */, const float *k /* [T,NKV,D] */,
			       const float *v /* [T,NKV,D] */,
			       const int32_t *cu_seqlens /* [S+1] */, int S, int T, int NH,
			       int NKV, int D, const float *prefix_k /* [P,NKV,D] or NULL */,
			       const float *prefix_v /* [P,NKV,D] or NULL */, int P,
			       const bk_attn *ap);
void bk_cuda_attention_backward(float *dq /* [T,NH,D] += */, float *dk /* [T,NKV,D] += */,
				float *dv /* [T,NKV,D] += */, const float *dout /* [T,NH,D] */,
				const float *q, const float *k, const float *v,
				const float *out /* [T,NH,D] */, const float *lse /* [NH,T] */,
				const int32_t *cu_seqlens /* [S+1] */, int S, int T, int NH,
				int NKV, int D, const bk_attn *ap);

/* gpu/cuda/cuda_loss.cu: the row and loss ops, signatures of the bk_ops fields of the same
 * names (ops.h has the semantics). */
void bk_cuda_gather_rows(float *dst, const float *src, const int32_t *rows, int N, int T,
			 int H);
void bk_cuda_scatter_rows(float *dst, const float *src, const int32_t *rows, int N, int T,
			  int H);
double bk_cuda_kl_exact(const float *hidden, const bk_weight *lm_head,
			const float *teacher_hidden, const float *teacher_logp,
			const int32_t *sample_of, int n, int n_samples, int chunk,
			float temperature, float softcap, float *d_hidden, float *row_kl);
double bk_cuda_kl_topk(const float *hidden, const bk_weight *lm_head, const int32_t *topk_ids,
		       const float *topk_logp, const float *rest, const int32_t *sample_of,
		       int n, int n_samples, int k, int chunk, float temperature,
		       float softcap, float *d_hidden, float *row_kl);
void bk_cuda_teacher_topk(const float *hidden, const bk_weight *lm_head, int n, int chunk,
			  float temperature, float softcap, int k, int32_t *ids, float *logp,
			  float *rest);
void bk_cuda_teacher_logprobs(const float *hidden, const bk_weight *lm_head, int n, int chunk,
			      float temperature, float softcap, float *logp);
/* the same top-k on rows of logits (softcap applied), scaled in place: bk_gen_ops_cuda's
 * teacher_topk (gen.h), bk-gen's scoring */
void bk_cuda_teacher_topk_logits(float *logits, int n, int V, float temperature, int k,
				 int32_t *ids, float *logp, float *rest);
/* which kl_exact / kl_topk the op table runs: 1 = v1 (the default: vocabulary chunks,
 * 5 / 3 LM-head GEMMs, teacher fields checked on the host), 2 = v2 (BK_LOSS=v2: row
 * blocks within a 512 MiB budget, 3 / 2 GEMMs, fields checked on the device).  Read from
 * BK_LOSS (v1, v2; anything else dies) on first use; set_mode overrides it (the check
 * program compares both in one process). */
int bk_cuda_loss_mode(void);
void bk_cuda_loss_set_mode(int mode /* 1 or 2 */);

/* gpu/cuda/cuda_optim.cu: the optimizer ops (ops.h, gpu/optim8.h). */
void bk_cuda_adamw_step(float *param, const float *grad, float *m, float *v, size_t n,
			double lr, double beta1, double beta2, double eps, double weight_decay,
			int64_t step);
void bk_cuda_adamw8_step(float *param, const float *grad, uint8_t *qm, uint8_t *qv,
			 float *absmax_m, float *absmax_v, size_t n, int block, double lr,
			 double beta1, double beta2, double eps, double weight_decay,
			 int64_t step);
double bk_cuda_grad_sumsq(const float *g, size_t n);
void bk_cuda_scale(float *x, double s, size_t n);

/* Bytes of device memory this process holds through bk_cuda_dev_alloc (every device
 * buffer of gpu/cuda/: bk_ops_cuda.alloc, weight_upload and its staging buffer, the op
 * workspaces and scratches) and in mapped shared weights, now and at peak since the
 * last reset (cuBLAS's own workspace and the CUDA context are not counted: see
 * bk_cuda_mem_used). */
void bk_cuda_mem_stats(size_t *current, size_t *peak);
/* Out of device memory for the buffer `name` of `bytes`: dies with one line naming it,
 * the device's free and total, what this process holds by buffer name (largest first),
 * what other processes hold, and the flags of the stage (bk_prog) that need less. */
__attribute__((noreturn)) void bk_cuda_die_oom(const char *name, size_t bytes);
/* the name of the shared weights (gpu/cuda/cuda_vmm.h) in those counters */
#define BK_CUDA_SHARED_WEIGHTS "shared weights"
void bk_cuda_mem_reset_peak(void);
/* total - free of cudaMemGetInfo: everything on the device, context included. */
size_t bk_cuda_mem_used(void);
/* Waits for every op issued so far (for timing). */
void bk_cuda_sync(void);

/* gpu/cuda/cuda_gen.cu: which decode path bk_gen_ops_cuda and the engine (gpu/gen.c)
 * take: 1 = v1 (the default: the kernels as first written), 2 = v2 (BK_DECODE=v2: the
 * bandwidth-bound linear with split-K and a tiled prefill, the bounded top-p sampler,
 * one CUDA graph per batch-size bucket for the decode step, pinned asynchronous copies).
 * Read from BK_DECODE (v1, v2; anything else dies) on first use; set_mode overrides it
 * (the check programs compare both in one process). */
int bk_cuda_decode_mode(void);
void bk_cuda_decode_set_mode(int mode /* 1 or 2 */);

/* gpu/cuda/cuda_proj.cuh: the projection-group ops (bk_ops.proj_forward/proj_backward,
 * ops.h).  1 = v1 (the default: each member's linear and LoRA kernels in turn), 2 = v2
 * (BK_LINEAR=v2: one bf16 copy of x per group, one GEMM for the members' LoRA A, the
 * LoRA B product written first and the base GEMM accumulating onto it), 3 = v3
 * (BK_LINEAR=v3: v2 with the equal-shape members' base GEMMs in one batched launch and
 * the backward's dx as one GEMM over the stacked weights; cuda_proj.cuh has the
 * details).  Read from BK_LINEAR (v1, v2, v3; anything else dies) on first use;
 * set_mode overrides it.  The v1/v2/v3 entries are the paths themselves, whatever the
 * mode (check programs compare them in one process).  xa is each path's own layout: a
 * backward must read the xa of the same path's forward. */
int bk_cuda_linear_mode(void);
void bk_cuda_linear_set_mode(int mode /* 1, 2 or 3 */);

/* gpu/cuda/cuda_act.cuh: the activations' element type.  Mode 1 = fp32 (the default;
 * bk_ops_cuda.act_bytes() is 4), 2 = bf16 (BK_ACT=bf16, act_bytes() 2: the saved
 * activations that feed GEMMs and attention; cuda_act.cuh has the list).  Read from BK_ACT (fp32, bf16; anything else
 * dies) on first use; set_mode overrides it.  gpu/model.c reads it in bk_model_create:
 * a model keeps the mode it was created with (check programs create one per mode). */
int bk_cuda_act_mode(void);
void bk_cuda_act_set_mode(int mode /* 1 or 2 */);
void bk_cuda_proj_forward_v1(const bk_proj *p, int n, const float *x, float *xa, int T,
			     int in, int R, float scale, float drop, float *scratch);
void bk_cuda_proj_backward_v1(float *dx, const bk_proj *p, int n, const float *x,
			      const float *xa, int T, int in, int R, float scale, float drop,
			      float *scratch);
void bk_cuda_proj_forward_v2(const bk_proj *p, int n, const float *x, float *xa, int T,
			     int in, int R, float scale, float drop, float *scratch);
void bk_cuda_proj_backward_v2(float *dx, const bk_proj *p, int n, const float *x,
			      const float *xa, int T, int in, int R, float scale, float drop,
			      float *scratch);
void bk_cuda_proj_forward_v3(const bk_proj *p, int n, const float *x, float *xa, int T,
			     int in, int R, float scale, float drop, float *scratch);
void bk_cuda_proj_backward_v3(float *dx, const bk_proj *p, int n, const float *x,
			      const float *xa, int T, int in, int R, float scale, float drop,
			      float *scratch);

#ifdef __cplusplus
}
#endif
#endif /* BK_HAVE_CUDA */

#endif
