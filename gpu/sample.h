/* sample.h - choosing the next token from a row of logits: greedy (temperature 0) or
 * temperature + top-p (nucleus) sampling with HF semantics, driven by one uniform
 * number the caller draws (bk_crng_uniform(key, step)), so a draw is a pure function
 * of (logits, parameters, u).  Not the RNG (common/rng.h), not the model.
 *
 * Nucleus (HF TopPLogitsWarper): p = softmax(logits / temperature); sort descending
 * (ties: lower id first); keep the token at rank i while the mass of ranks 0..i-1 is
 * < top_p; the first token is always kept.  top_p >= 1 keeps every token.
 *
 * Top-k (HF TopKLogitsWarper, applied after the temperature and before top-p, HF's
 * order): top_k K >= 1 keeps every token whose p is >= the K-th largest p (all ties of
 * the K-th, as HF keeps every score >= the K-th largest; p is strictly increasing in
 * the logit unless exp underflows to 0, where the extra tokens have no mass); the
 * nucleus is then taken over the kept tokens with their p renormalised over them, as HF
 * takes top-p's softmax over the masked scores: rank i is kept while the mass of ranks
 * 0..i-1 is < top_p * (mass of the kept tokens).  top_k 0, or a K that keeps every
 * token (K >= V), is no top-k: the same nucleus bit for bit as without it.  The draw
 * uses the same single uniform either way. */
#ifndef BK_SAMPLE_H
#define BK_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bk_sample_params {
	float temperature; /* 0 = greedy (argmax); > 0 scales the logits */
	float top_p;       /* (0, 1]; 1 = no truncation */
	int top_k;         /* >= 0; 0 = no top-k (HF generate's default is 50) */
} bk_sample_params;

/* Workspace for a vocabulary of V tokens (one per thread). */
typedef struct bk_sample_work {
	int V;
	double *p;    /* [V] probabilities */
	int32_t *idx; /* [V] candidate ids */
} bk_sample_work;

bk_sample_work *bk_sample_work_new(int V);
void bk_sample_work_free(bk_sample_work *w);

/* The first id with the largest logit (torch.argmax).  Dies on a NaN logit. */
int32_t bk_sample_argmax(const float *logits /* [V] */, int V);

/* The nucleus of softmax(logits / temperature) (temperature > 0) after top_k (0: off):
 * writes its ids in descending probability order (ties: lower id first) to ids_out [V] and, when probs_out
 * is not NULL, their probabilities renormalised over the nucleus; returns its size
 * (>= 1).  ids_out / probs_out may be w->idx / NULL. */
int bk_sample_nucleus(const float *logits /* [V] */, int V, float temperature, int top_k,
		      float top_p, bk_sample_work *w, int32_t *ids_out, double *probs_out);

/* One token: argmax when p->temperature == 0 (top-k and top-p then do nothing), else the
 * nucleus (after p->top_k) token whose cumulative
 * renormalised mass (in nucleus order) first exceeds u, u in [0,1). */
int32_t bk_sample_token(const float *logits /* [V] */, int V, const bk_sample_params *p,
			double u, bk_sample_work *w);

/* Is id one of stop[0..n)? */
int bk_sample_is_stop(int32_t id, const int32_t *stop, int n);

#ifdef BK_HAVE_CUDA
/* gpu/cuda/cuda_sample.cu: the same rule on the GPU (bk_gen_ops_cuda.sample, see gen.h):
 * draw i takes row rows[i] of logits [*,V] (device) and u = bk_crng_uniform(keys[i],
 * counters[i]); ids [N] (device) gets the token, or -1 when the row holds a NaN.
 * Equal to bk_sample_token on the same row except when a cumulative mass falls within
 * rounding (~1e-16 relative) of top_p or of the draw's target: the softmax sum and the
 * nucleus mass are reduced in another order.  work: bk_cuda_sample_work_bytes(N, V).
 * With BK_DECODE=v2 (gpu/cuda/cuda.h) the bounded sampler of cuda_sample2.cuh: the same
 * rule, masses summed exactly in 2^-62 fixed point, so a difference needs a cumulative
 * mass within about V 2^-53 of top_p or of the draw's target.  top_k as in
 * bk_sample_params: both kernels find the K-th largest p by the radix select they use
 * for the nucleus (v2: still no sort); the kept mass is a block sum (v1, so the top-p
 * bound top_p * mass can differ from the host's in the last bits) or exact fixed point
 * (v2). */
void bk_cuda_sample(int32_t *ids /* [N] */, const float *logits /* [*,V] */,
		    const int32_t *rows /* [N] */, const uint64_t *keys /* [N] */,
		    const int32_t *counters /* [N] */, int N, int V, float temperature,
		    int top_k, float top_p, void *work);
size_t bk_cuda_sample_work_bytes(int N, int V);
#endif

#endif
