/* loss.h - the baking loss on the host: KL(teacher || student) per response token,
 * with its gradient w.r.t. the student's final hidden rows, computed in vocabulary
 * chunks from hidden states and the LM head (a [N,V] student logits tensor is never
 * held).  Also the teacher's top-k / full log-probs for bk-teach.
 * Not the transformer (gpu/model.c) and not the optimizer (gpu/optim.h).
 *
 * Dimension letters: N rows (response-predicting positions of the whole batch,
 * gathered by the caller), H hidden size, V vocabulary size, C vocabulary chunk,
 * K top-k ids per row.  All arrays are row-major fp32 unless noted.
 *
 * Semantics (BAKERY-SEMANTICS.md "Loss"): per row r,
 *   KL_r = sum_v P_t(v) (log P_t(v) - log P_s(v)),
 *   P_t = softmax(teacher_logits / T), log P_s = log_softmax(student_logits / T),
 * no T^2 factor; with a final logit softcap c > 0 (Gemma-2 final_logit_softcapping) every
 * logit z of either side is first capped, z <- tanh(z / c) c (bk_loss_softcap), then
 * divided by T, as HF caps after the LM head and before the softmax (softcap 0: none;
 * a teacher given as log-probs was capped when they were made).  The batch loss is the mean over samples (a sample = the rows with
 * the same sample_of[r]) of the mean over that sample's rows.  Samples without rows
 * are dropped; no rows at all gives loss 0.  The teacher is detached.
 *
 * Gradients: d_hidden (when not NULL) is OVERWRITTEN with dLoss/dhidden [N,H] =
 * sum over chunks of dlogits_chunk [N,C] @ W_chunk [C,H].  The LM head is frozen (no
 * gradient).  Gradient-accumulation scaling is the optimizer's job (gpu/optim.h).
 *
 * Bad input (a sample index or top-k id out of range, a duplicate top-k id, a rest
 * mass outside [0, 1]) dies naming the row. */
#ifndef BK_LOSS_H
#define BK_LOSS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

/* the final logit softcap of one logit, the arithmetic of every loss op and of
 * ops->softcap_forward: tanhf(z / c) * c (c > 0) */
static inline float bk_loss_softcap(float z, float c) { return tanhf(z / c) * c; }

/* Per-row weights of the batch mean: w[r] = 1 / (rows of sample_of[r]) / (number of
 * samples with rows).  Returns that number of non-empty samples (0: all w are 0). */
int bk_loss_row_weights(const int32_t *sample_of /* [N] in [0, n_samples) */, int n,
			int n_samples, float *w /* [N] out */);

/* The losses' two paths.  Row blocks: rows in blocks whose full-vocabulary logits
 * ([rows,V] floats per side: two with teacher hidden rows, else one) fit a memory budget,
 * each block's logits formed once (one LM-head sgemm per side, one more for d_hidden),
 * each row's sums in a fixed float/double lane order with a vectorized exp (loss.c);
 * chunk is not used.  Chunked: when a single row does not fit, two passes over
 * vocabulary chunks of `chunk` ids, logits formed twice, sums in double.  Both within
 * float rounding of the definition above (tests/unit/test_loss.c: each against a double
 * reference and against each other).  bk_loss_block_bytes sets the budget (default
 * 256 MiB; 0: always chunked) and returns the previous one; not thread-safe (set it
 * before the losses run; for tests and benchmarks). */
size_t bk_loss_block_bytes(size_t bytes);

/* Exact (full-vocabulary) teacher.  Exactly one of teacher_hidden (teacher final
 * hidden rows, same LM head) and teacher_logp (precomputed log_softmax(teacher_logits /
 * T), already at temperature T) is non-NULL.  Log-sum-exp of both sides, then KL and
 * gradient, by row blocks or in vocabulary chunks (above).
 * Returns the batch loss; row_kl (if not NULL) gets the unweighted KL_r. */
double bk_loss_kl_exact(const float *hidden /* [N,H] student */,
			const float *lm_head /* [V,H] */,
			const float *teacher_hidden /* [N,H] or NULL */,
			const float *teacher_logp /* [N,V] or NULL */,
			const int32_t *sample_of /* [N] */, int n, int n_samples, int h,
			int v, int chunk, float temperature, float softcap /* 0: none */,
			float *d_hidden /* [N,H] out, or NULL */,
			float *row_kl /* [N] out, or NULL */);

/* Sparse top-k teacher: per row K distinct ids with their teacher log-probs at
 * temperature T normalised over the FULL vocabulary, and the remaining mass
 * rest[r] = 1 - sum_i exp(logp[r,i]).  The loss is the exact KL of the two
 * distributions coarsened to {the K ids, everything else}:
 *   KL_r = sum_i p_i (log p_i - log q_i) + p_rest (log p_rest - log q_rest),
 * q = softmax(student_logits / T), q_rest = sum of q over the other ids, its log
 * taken as a log-sum-exp over those logits (no 1 - sum cancellation).  rest <= 0 (or
 * K = V, where rest can only be rounding) drops the rest term; rest may be up to
 * 1e-4 below 0 or above 1 from rounding (clamped), further out dies.  With K = V and
 * rest = 0 this is the exact loss.  Gradient: dKL_r/du_v = P q_v - p_v for the K ids
 * and P q_v - p_rest q_v / q_rest for the others (u = logits / T, P = sum p + p_rest).
 * With a softcap the gradient w.r.t. the raw logit z is dKL/du (1 - (cap(z)/c)^2) / T. */
double bk_loss_kl_topk(const float *hidden /* [N,H] student */,
		       const float *lm_head /* [V,H] */,
		       const int32_t *topk_ids /* [N,K] */,
		       const float *topk_logp /* [N,K] */,
		       const float *rest /* [N] */,
		       const int32_t *sample_of /* [N] */, int n, int n_samples, int h,
		       int v, int k, int chunk, float temperature, float softcap /* 0: none */,
		       float *d_hidden /* [N,H] out, or NULL */,
		       float *row_kl /* [N] out, or NULL */);

/* Teacher top-k of softmax(cap(logits) / T), in vocabulary chunks, for bk-teach.  Exactly
 * one of hidden (with lm_head) and logits is non-NULL.  Out: the K largest ids per
 * row in descending probability (ties: smaller id first), their log-probs normalised
 * over the full vocabulary, and rest[r] = the probability of all other ids (summed
 * directly, not as 1 - sum).  1 <= K <= V; K = 0 (full distribution) is the caller's
 * job, see bk_teacher_logprobs. */
void bk_teacher_topk(const float *hidden /* [N,H] or NULL */,
		     const float *lm_head /* [V,H], used with hidden */,
		     const float *logits /* [N,V] raw logits, or NULL */, int n, int h,
		     int v, int chunk, float temperature, float softcap /* 0: none */, int k,
		     int32_t *ids /* [N,K] out */, float *logp /* [N,K] out */,
		     float *rest /* [N] out */);

/* Full teacher log-probs log_softmax(cap(hidden @ lm_head^T) / T), chunked (two
 * passes). */
void bk_teacher_logprobs(const float *hidden /* [N,H] */,
			 const float *lm_head /* [V,H] */, int n, int h, int v,
			 int chunk, float temperature, float softcap /* 0: none */,
			 float *logp /* [N,V] out */);

#endif
