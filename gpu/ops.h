/* ops.h - the one op interface of the compute layer: a table of function pointers
 * (memory + transformer ops, each forward with its backward) that the model calls.
 * bk_ops_host (host_ops.c, fp32 + OpenBLAS + OpenMP) is the reference every other
 * implementation (CUDA, bf16 weights) is tested against.  Not a tensor library:
 * no shapes are stored in buffers, no autograd; the caller passes every dimension.
 *
 * Dimension letters (used in every shape comment of gpu/):
 *   T   tokens of a packed batch (all sequences back to back, no padding)
 *   S   sequences in the batch; cu_seqlens [S+1] holds token offsets, cu[0] = 0, cu[S] = T
 *   P   tokens of a shared read-only prefix (the teacher's system prompt)
 *   H   hidden size                 I   MLP intermediate size
 *   NH  query heads                 NKV key/value heads (NH % NKV == 0, GQA)
 *   D   head dimension (even)       V   vocabulary size
 *   R   LoRA rank                   in/out  input/output features of a linear
 *
 * Conventions (Hugging Face Llama):
 *   - a frozen weight W is [out,in] and a linear is y = x W^T;
 *   - buffers are row-major fp32 "device" memory obtained from ops->alloc (on the
 *     host twin, ordinary memory); int arrays (ids, pos, cu_seqlens) are int32;
 *   - frozen base weights live behind an opaque bk_weight created by weight_upload,
 *     so an implementation may store them in another type (bf16 on the GPU);
 *     trainable LoRA matrices and all activations are fp32 buffers;
 *   - every backward ADDS (+=) into the gradients it produces (dx, dA, dB, ...);
 *     callers zero them first.  Base weights get no gradient;
 *   - ops are ordered on one stream: a download sees every op issued before it.
 */
#ifndef BK_OPS_H
#define BK_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* A frozen weight matrix [rows, cols] (rows = out features, cols = in features;
 * a vector such as an RMSNorm weight is [1, H]).  data is the implementation's
 * own storage (fp32 on the host, e.g. bf16 on a GPU): only ops read it. */
typedef struct bk_weight {
	int rows, cols;
	void *data;
	int kind; /* BK_WEIGHT_PLAIN (0): from weight_upload; BK_WEIGHT_Q4: weight_upload_q4 */
} bk_weight;
enum { BK_WEIGHT_PLAIN = 0, BK_WEIGHT_Q4 = 1 };

struct bk_q4; /* gpu/quant4.h */

/* Writes elements [off, off + n) of a row-major weight as bf16 bit patterns into out
 * (bk_ops.weight_upload_bf16's staging); dies (naming the tensor) on bad numbers. */
typedef void (*bk_bf16_fill)(void *ctx, size_t off, size_t n, uint16_t *out);

/* The attention parameters of attention_forward/backward (see there). */
typedef struct bk_attn {
	float scale;   /* score = q.k * scale */
	float softcap; /* > 0: tanh(score / softcap) * softcap; 0 = none */
	int window;    /* > 0: sliding window of this many positions; 0 = full causal */
} bk_attn;

/* HF's default: scale D^-0.5, no softcap, full causal */
static inline bk_attn bk_attn_default(int D)
{
	bk_attn a = { (float)(1.0 / sqrt((double)D)), 0.0f, 0 };
	return a;
}

/* One member of a projection group (bk_ops.proj_forward / proj_backward): a frozen
 * linear W [out,in] with an optional LoRA adapter on it. */
typedef struct bk_proj {
	const bk_weight *W; /* [out,in] */
	const float *A;     /* [R,in] LoRA down, or NULL: no adapter on this member */
	const float *B;     /* [out,R] LoRA up (with A) */
	uint64_t key;       /* the member's dropout key (lora_forward's key) */
	float *y;           /* forward: [T,out], overwritten */
	const float *dy;    /* backward: [T,out] */
	float *dA, *dB;     /* backward: [R,in] +=, [out,R] += (with A) */
} bk_proj;
#define BK_PROJ_MAX 3 /* members of a group: q/k/v */

typedef struct bk_ops {
	const char *name; /* "host", "cuda" */

	/* ---- memory (bytes; "device" = the implementation's memory) ---- */
	void *(*alloc)(size_t bytes); /* contents undefined (the host fills with NaN) */
	/* alloc with the buffer's name: a short stable label ("kv pool", "activations") that
	 * an out-of-memory error names, and groups this process's holdings by (the CUDA
	 * ops); the host ignores it.  NULL: alloc.  Callers use bk_alloc below. */
	void *(*alloc_as)(size_t bytes, const char *name);
	void (*free)(void *p);        /* NULL is fine */
	void (*upload)(void *dst_device, const void *src_host, size_t bytes);
	void (*download)(void *dst_host, const void *src_device, size_t bytes);
	void (*copy)(void *dst_device, const void *src_device, size_t bytes);
	void (*zero)(void *p_device, size_t bytes);
	bk_weight *(*weight_upload)(const float *host /* [rows,cols] */, int rows, int cols);
	/* The weight that weight_upload of the fp32 values of these bf16 numbers makes (the
	 * same handle, the same device bits), its numbers pulled chunk by chunk: fill is
	 * called for consecutive ranges covering [0, rows*cols) in order, each into a
	 * staging buffer of the implementation of bounded size, so a loader holds no copy
	 * of the tensor (gpu/load.c: from the mapped checkpoint through the staging to the
	 * device, no fp32 on the way).  NULL: the implementation takes fp32 only (the host
	 * twin, which keeps fp32 weights: a bf16 path would round an fp32 checkpoint). */
	bk_weight *(*weight_upload_bf16)(int rows, int cols, bk_bf16_fill fill, void *ctx);
	void (*weight_free)(bk_weight *w); /* NULL is fine */
	/* A frozen base linear in 4 bits (QLoRA: bitsandbytes' NF4/FP4 blocks with their
	 * statistics, gpu/quant4.h), [q->rows, q->cols].  Every op that takes the handle
	 * (linear_*, proj_*) computes with W = bk_q4_dequantize(q), rounded to bf16 values
	 * when compute_bf16 (bnb_4bit_compute_dtype bfloat16).  The implementation decides
	 * how it holds it: the host twin (the reference) expands it here, once, to those
	 * fp32 values; a GPU keeps the 4 bits and statistics and dequantises as it computes.
	 * The handle's kind is BK_WEIGHT_Q4.  NULL: the implementation has no 4-bit weights
	 * (gpu/model.c refuses a 4-bit model on it). */
	bk_weight *(*weight_upload_q4)(const struct bk_q4 *q, int compute_bf16);

	/* ---- embedding: x[t,:] = embed[ids[t],:]; ids must be in [0,V) (BUG otherwise) ---- */
	void (*embedding_forward)(float *x /* [T,H] */, const int32_t *ids /* [T] */,
				  const bk_weight *embed /* [V,H] */, int T);

	/* ---- RMSNorm: out = w * x * rstd, rstd = 1/sqrt(mean(x^2) + eps), fp32 ---- */
	void (*rmsnorm_forward)(float *out /* [T,H] */, float *rstd /* [T] saved */,
				const float *x /* [T,H] */, const bk_weight *w /* [1,H] */,
				int T, int H, float eps);
	void (*rmsnorm_backward)(float *dx /* [T,H] += */, const float *dout /* [T,H] */,
				 const float *x /* [T,H] */, const bk_weight *w /* [1,H] */,
				 const float *rstd /* [T] */, int T, int H);

	/* ---- frozen linear: y = x W^T (overwrites y); backward dx += dy W ---- */
	void (*linear_forward)(float *y /* [T,out] */, const float *x /* [T,in] */,
			       const bk_weight *W /* [out,in] */, int T);
	void (*linear_backward)(float *dx /* [T,in] += */, const float *dy /* [T,out] */,
				const bk_weight *W /* [out,in] */, int T);

	/* ---- LoRA on a linear: y += scale * (drop(x) A^T) B^T ----
	 * drop(x)[t,i] = x[t,i] * keep(t,i) / (1-p), keep(t,i) = bk_crng_uniform(key,
	 * t*in + i) >= p; p = 0 means drop(x) = x (no mask).  The mask is recomputed in the
	 * backward from the same key, never stored.  xa = drop(x) A^T is saved.
	 * scratch: [T, in + R] floats of workspace, clobbered. */
	void (*lora_forward)(float *y /* [T,out] += */, float *xa /* [T,R] saved */,
			     const float *x /* [T,in] */, const float *A /* [R,in] */,
			     const float *B /* [out,R] */, int T, int in, int out, int R,
			     float scale, float p, uint64_t key, float *scratch);
	void (*lora_backward)(float *dx /* [T,in] += */, float *dA /* [R,in] += */,
			      float *dB /* [out,R] += */, const float *dy /* [T,out] */,
			      const float *x /* [T,in] */, const float *xa /* [T,R] */,
			      const float *A /* [R,in] */, const float *B /* [out,R] */,
			      int T, int in, int out, int R, float scale, float p, uint64_t key,
			      float *scratch);

	/* ---- RoPE, HF rotate_half, in place on x [T,n,D] (n = NH for q, NKV for k) ----
	 * for i < D/2, angle = pos[t] * inv_freq[i] (fp32), c = cos, s = sin:
	 *   x[i] <- x[i] c - x[i+D/2] s,   x[i+D/2] <- x[i+D/2] c + x[i] s.
	 * backward rotates by -angle, in place on the gradient. */
	void (*rope_forward)(float *x /* [T,n,D] */, const int32_t *pos /* [T] */,
			     const float *inv_freq /* [D/2] */, int T, int n, int D);
	void (*rope_backward)(float *dx /* [T,n,D] in place */, const int32_t *pos /* [T] */,
			      const float *inv_freq /* [D/2] */, int T, int n, int D);

	/* ---- causal GQA attention over packed sequences ----
	 * Query t of sequence s (cu[s] <= t < cu[s+1]), head h, attends to every prefix
	 * key 0..P-1 (if P > 0) and to the keys cu[s]..t of its own sequence, kv head
	 * h / (NH/NKV).  Positions are absolute: prefix key p is at position p, token
	 * cu[s]+i of a sequence at P + i (so with no prefix the sequence starts at 0).
	 * The attention parameters (struct bk_attn below, the same for every
	 * implementation):
	 *   scale    score = q.k * scale (HF: head_dim^-0.5, Gemma-2/3:
	 *            query_pre_attn_scalar^-0.5);
	 *   softcap  > 0: score <- tanh(score / softcap) * softcap, before the mask
	 *            (Gemma-2 attn_logit_softcapping); 0 = none;
	 *   window   > 0: query at position i sees only keys j with i - window < j <= i
	 *            (sliding window, prefix keys counted at their positions); 0 = full.
	 * lse[h,t] = log sum exp of its (capped) scores.
	 * The prefix (positions 0..P-1, already roped) is read-only and forward only:
	 * pass P = 0 (and NULL) for a forward whose backward will run. */
	void (*attention_forward)(float *out /* [T,NH,D] */, float *lse /* [NH,T] saved */,
				  const float *q /* [T,NH,D] */, const float *k /* [T,NKV,D] */,
				  const float *v /* [T,NKV,D] */,
				  const int32_t *cu_seqlens /* [S+1] */, int S, int T, int NH,
				  int NKV, int D, const float *prefix_k /* [P,NKV,D] or NULL */,
				  const float *prefix_v /* [P,NKV,D] or NULL */, int P,
				  const struct bk_attn *ap);
	/* recomputes the probabilities from q, k and lse (no [T,T] matrix kept) */
	void (*attention_backward)(float *dq /* [T,NH,D] += */, float *dk /* [T,NKV,D] += */,
				   float *dv /* [T,NKV,D] += */, const float *dout /* [T,NH,D] */,
				   const float *q, const float *k, const float *v,
				   const float *out /* [T,NH,D] */, const float *lse /* [NH,T] */,
				   const int32_t *cu_seqlens /* [S+1] */, int S, int T, int NH,
				   int NKV, int D, const struct bk_attn *ap);

	/* ---- SwiGLU: h = silu(gate) * up, silu(g) = g / (1 + exp(-g)) ---- */
	void (*swiglu_forward)(float *h /* [T,I] */, const float *gate /* [T,I] */,
			       const float *up /* [T,I] */, size_t n /* T*I */);
	/* the backward WRITES dgate and dup (no accumulation); dgate may be gate and dup
	 * may be up (in place: the model's fp32 backward reuses the layer's gate/up) */
	void (*swiglu_backward)(float *dgate /* [T,I] = */, float *dup /* [T,I] = */,
				const float *dh /* [T,I] */, const float *gate, const float *up,
				size_t n);

	/* ---- GeGLU (Gemma): h = gelu_tanh(gate) * up, HF gelu_pytorch_tanh:
	 * gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) ---- */
	void (*geglu_forward)(float *h /* [T,I] */, const float *gate /* [T,I] */,
			      const float *up /* [T,I] */, size_t n /* T*I */);
	void (*geglu_backward)(float *dgate /* [T,I] = */, float *dup /* [T,I] = */, /* as swiglu */
			       const float *dh /* [T,I] */, const float *gate, const float *up,
			       size_t n);

	/* ---- frozen bias: y[t,:] += b (Qwen2 q/k/v).  The backward is the identity on
	 * dy (the bias is frozen), so no op is needed. ---- */
	void (*bias_forward)(float *y /* [T,n] += */, const bk_weight *b /* [1,n] */, int T);

	/* ---- final-logit softcap (Gemma-2): x <- tanh(x / cap) * cap, in place
	 * (generation's logits before sampling; the loss ops take the cap themselves,
	 * their softcap argument, with the same arithmetic) ---- */
	void (*softcap_forward)(float *x /* [n] */, float cap, size_t n);

	/* ---- residual: out = a + b (out may alias a or b); the backward is the identity:
	 * the gradient of out flows unchanged to both a and b, so no op is needed. ---- */
	void (*residual_forward)(float *out, const float *a, const float *b, size_t n);

	/* ---- rows of a [T,H] buffer by an index list (the loss's response rows) ----
	 * rows [N] is a device int32 array with entries in [0,T) (the host twin BUGs
	 * otherwise).  gather: dst[r,:] = src[rows[r],:].  scatter is its backward,
	 * dst[rows[r],:] += src[r,:], with rows distinct (no two adds to one row). */
	void (*gather_rows)(float *dst /* [N,H] */, const float *src /* [T,H] */,
			    const int32_t *rows /* [N] */, int N, int T, int H);
	void (*scatter_rows)(float *dst /* [T,H] += */, const float *src /* [N,H] */,
			     const int32_t *rows /* [N] */, int N, int T, int H);

	/* ---- the baking loss of gpu/host/loss.h on device rows ----
	 * Same semantics, arguments and error messages as bk_loss_kl_exact,
	 * bk_loss_kl_topk, bk_teacher_topk (hidden-row form) and bk_teacher_logprobs,
	 * except: the LM head is the weight handle lm_head [V,H] (V = rows, H = cols);
	 * softcap: the final logit softcap (0: none; Gemma-2 final_logit_softcapping),
	 * applied to each logit before the temperature, in the gradient too;
	 * every float and id array is device memory, except sample_of and row_kl,
	 * which are HOST arrays (the row weights and per-row KL are host numbers).
	 * d_hidden [N,H] is overwritten.  chunk: vocabulary columns per pass (an
	 * implementation may use its own chunking; results agree within rounding). */
	double (*kl_exact)(const float *hidden /* [N,H] student */,
			   const bk_weight *lm_head /* [V,H] */,
			   const float *teacher_hidden /* [N,H] or NULL */,
			   const float *teacher_logp /* [N,V] or NULL */,
			   const int32_t *sample_of /* [N] host */, int n, int n_samples,
			   int chunk, float temperature, float softcap,
			   float *d_hidden /* [N,H] or NULL */,
			   float *row_kl /* [N] host, or NULL */);
	double (*kl_topk)(const float *hidden /* [N,H] student */,
			  const bk_weight *lm_head /* [V,H] */,
			  const int32_t *topk_ids /* [N,K] */, const float *topk_logp /* [N,K] */,
			  const float *rest /* [N] */, const int32_t *sample_of /* [N] host */,
			  int n, int n_samples, int k, int chunk, float temperature, float softcap,
			  float *d_hidden /* [N,H] or NULL */, float *row_kl /* [N] host, or NULL */);
	void (*teacher_topk)(const float *hidden /* [N,H] */, const bk_weight *lm_head /* [V,H] */,
			     int n, int chunk, float temperature, float softcap, int k,
			     int32_t *ids /* [N,K] out */, float *logp /* [N,K] out */,
			     float *rest /* [N] out */);
	void (*teacher_logprobs)(const float *hidden /* [N,H] */,
				 const bk_weight *lm_head /* [V,H] */, int n, int chunk,
				 float temperature, float softcap, float *logp /* [N,V] out */);

	/* ---- optimizer, on flat fp32 device vectors (rules and 8-bit state: gpu/optim8.h).
	 * AdamW as torch.optim.AdamW: step is the update's 1-based count (bias correction);
	 * the float scalars are bk_adamw_scalars_make's and each element gets bk_adamw_elem's
	 * arithmetic, so the host twin equals gpu/optim.c's bk_adamw_step bit for bit. ---- */
	void (*adamw_step)(float *param /* [n] */, const float *grad /* [n] */,
			   float *m /* [n] */, float *v /* [n] */, size_t n, double lr,
			   double beta1, double beta2, double eps, double weight_decay,
			   int64_t step);
	/* 8-bit AdamW of one tensor: codes qm, qv [n] and an fp32 absmax per block of
	 * `block` (256 or 2048) values: dequantise, fp32 update, requantise */
	void (*adamw8_step)(float *param /* [n] */, const float *grad /* [n] */,
			    uint8_t *qm /* [n] */, uint8_t *qv /* [n] */,
			    float *absmax_m /* [ceil(n/block)] */,
			    float *absmax_v /* [ceil(n/block)] */, size_t n, int block, double lr,
			    double beta1, double beta2, double eps, double weight_decay,
			    int64_t step);
	/* sum of g[i]^2 in double, in an order fixed by n alone (deterministic).  Host
	 * twin: 65536-value blocks each summed in index order, then the block sums in
	 * order; another implementation may use another fixed order. */
	double (*grad_sumsq)(const float *g /* [n] */, size_t n);
	/* x[i] *= (float)s */
	void (*scale)(float *x /* [n] */, double s, size_t n);

	/* ---- a projection group: n (1..BK_PROJ_MAX) frozen linears on one input x [T,in],
	 * each with an optional LoRA (q/k/v on the attention norm's output, gate/up on the
	 * MLP norm's, o and down alone).  The function is that of linear_forward then
	 * lora_forward (when p[j].A) of each member j = 0..n-1 in turn:
	 *   p[j].y = x W_j^T + scale * (drop_j(x) A_j^T) B_j^T,   drop_j keyed by p[j].key;
	 * the backward, that of linear_backward then lora_backward of each member in turn:
	 *   dx += dy_j W_j + (LoRA terms),  dA_j +=, dB_j +=.
	 * xa [n*T*R] floats: the saved LoRA activations, written by the forward and read by
	 * the backward of the same implementation in a layout of its own (NULL when no
	 * member has A); R = 0 is allowed then.  scratch: [T, in + R] floats, clobbered.
	 * An implementation may reorder and fuse (one bf16 copy of x for all members, one
	 * GEMM for the members' A): results agree within its rounding.  NULL (a table
	 * whose linears must not be bypassed, e.g. bk_ops_host_rows): the caller composes
	 * linear_forward/lora_forward itself, as gpu/model.c does. ---- */
	void (*proj_forward)(const bk_proj *p, int n, const float *x /* [T,in] */,
			     float *xa /* [n*T*R] saved */, int T, int in, int R, float scale,
			     float drop, float *scratch /* [T,in+R] */);
	void (*proj_backward)(float *dx /* [T,in] += */, const bk_proj *p, int n,
			      const float *x /* [T,in] */, const float *xa /* [n*T*R] */, int T,
			      int in, int R, float scale, float drop,
			      float *scratch /* [T,in+R] */);

	/* ---- bf16 activations (BK_ACT=bf16: gpu/cuda/cuda_act.cuh; NULL on the host twin) ----
	 * act_bytes: the element size of gpu/model.c's "act" buffers, the saved activations
	 * that feed GEMMs and attention (ln1, ln2, q, k, v after RoPE, att, gate, up, h; a
	 * shared prefix's K/V).  NULL or 4: they are fp32 and the ops below are never
	 * called (the host twin, BK_ACT=fp32); 2: they are bf16, and gpu/model.c writes and
	 * reads them only through the ops below, every other buffer (the residual stream,
	 * rstd, lse, LoRA xa, every gradient, the loss) staying fp32.  "act" marks a pointer
	 * to act_bytes-sized elements; the shapes and semantics are those of the fp32 op
	 * named, with each act output rounded once (round to nearest even) as it is stored.
	 * The error bounds against the host twin: gpu/cuda/cuda_act.cuh. */
	int (*act_bytes)(void);
	/* rmsnorm_forward with the output in act (rstd fp32) */
	void (*rmsnorm_forward_act)(void *out /* [T,H] act */, float *rstd /* [T] */,
				    const float *x /* [T,H] */, const bk_weight *w /* [1,H] */,
				    int T, int H, float eps);
	/* out = rope_forward(x) into act; x [T,n,D] fp32 is left as it is */
	void (*rope_forward_act)(void *out /* [T,n,D] act */, const float *x /* [T,n,D] */,
				 const int32_t *pos /* [T] */, const float *inv_freq /* [D/2] */,
				 int T, int n, int D);
	/* dst = src rounded into act (v, which has no RoPE) */
	void (*to_act)(void *dst /* [n] act */, const float *src /* [n] */, size_t n);
	/* gate_act, up_act = gate, up rounded into act (saved for the backward); h =
	 * silu(g) * u (geglu: gelu_tanh(g) * u) of those rounded values, into act */
	void (*glu_forward_act)(void *h /* [n] act */, void *gate_act /* [n] act */,
				void *up_act /* [n] act */, const float *gate /* [n] */,
				const float *up /* [n] */, size_t n, int geglu);
	void (*glu_backward_act)(float *dgate /* [n] += */, float *dup /* [n] += */,
				 const float *dh /* [n] */, const void *gate /* [n] act */,
				 const void *up /* [n] act */, size_t n, int geglu);
	/* attention_forward / attention_backward with q, k, v, out and the prefix in act */
	void (*attention_forward_act)(void *out /* [T,NH,D] act */, float *lse /* [NH,T] */,
				      const void *q, const void *k, const void *v /* act */,
				      const int32_t *cu_seqlens, int S, int T, int NH, int NKV,
				      int D, const void *prefix_k, const void *prefix_v /* act */,
				      int P, const struct bk_attn *ap);
	void (*attention_backward_act)(float *dq, float *dk, float *dv /* += */,
				       const float *dout /* [T,NH,D] */, const void *q,
				       const void *k, const void *v, const void *out /* act */,
				       const float *lse, const int32_t *cu_seqlens, int S, int T,
				       int NH, int NKV, int D, const struct bk_attn *ap);
	/* proj_forward / proj_backward with x in act (y, dy, dx, xa fp32) */
	void (*proj_forward_act)(const bk_proj *p, int n, const void *x /* [T,in] act */,
				 float *xa, int T, int in, int R, float scale, float drop,
				 float *scratch /* [T,in+R] */);
	void (*proj_backward_act)(float *dx /* [T,in] += */, const bk_proj *p, int n,
				  const void *x /* [T,in] act */, const float *xa, int T, int in,
				  int R, float scale, float drop, float *scratch /* [T,in+R] */);
} bk_ops;

extern const bk_ops bk_ops_host;

/* ops->alloc of a named buffer (alloc_as where the ops have it) */
static inline void *bk_alloc(const bk_ops *ops, size_t bytes, const char *name)
{
	return ops->alloc_as ? ops->alloc_as(bytes, name) : ops->alloc(bytes);
}

#endif
