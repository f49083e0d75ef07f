/* sample.h - choosing the next token from a row of logits: greedy (temperature 0) or
 * temperature + top-p (nucleus) sampling with HF semantics, driven by one uniform
 * number the caller draws (bk_crng_uniform(key, step)), so a draw is a pure function
 * of (logits, parameters, u).  Not the RNG (common/rng.h), not the model.
 *
 * Nucleus (HF TopPLogitsWarper): p = softmax(logits / temperature); sort descending
 * (ties: lower id first); keep the token at rank i while the mass of ranks 0..i-1 is
 * < top_p; the first token is always kept.  top_p >= 1 keeps every token. */
#ifndef BK_SAMPLE_H
#define BK_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bk_sample_params {
	float temperature; /* 0 = greedy (argmax); > 0 scales the logits */
	float top_p;       /* (0, 1]; 1 = no truncation */
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

/* The nucleus of softmax(logits / temperature) (temperature > 0): writes its ids in
 * descending probability order (ties: lower id first) to ids_out [V] and, when probs_out
 * is not NULL, their probabilities renormalised over the nucleus; returns its size
 * (>= 1).  ids_out / probs_out may be w->idx / NULL. */
int bk_sample_nucleus(const float *logits /* [V] */, int V, float temperature, float top_p,
		      bk_sample_work *w, int32_t *ids_out, double *probs_out);

/* One token: argmax when p->temperature == 0, else the nucleus token whose cumulative
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
 * mass within about V 2^-53 of top_p or of the draw's target. */
void bk_cuda_sample(int32_t *ids /* [N] */, const float *logits /* [*,V] */,
		    const int32_t *rows /* [N] */, const uint64_t *keys /* [N] */,
		    const int32_t *counters /* [N] */, int N, int V, float temperature,
		    float top_p, void *work);
size_t bk_cuda_sample_work_bytes(int N, int V);
#endif

#endif
