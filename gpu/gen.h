/* gen.h - batched generation with a KV cache over the op table (gpu/ops.h) and the
 * model (gpu/model.h): packed prefill of many prompts, one-token decode steps for up to
 * max_batch sequences, continuous batching (a finished sequence's slot is refilled in
 * the same step), and a shared read-only prefix (the system prompt) computed once.
 * Not the sampler (gpu/sample.h) and not stream handling (cmd/bk-gen.c).
 *
 * Dimension letters as in ops.h; in addition
 *   C   rows of one sequence's own KV cache (its tokens after the shared prefix)
 *
 * Numerics do not depend on batch composition: every op used by the generation path is
 * row-wise (a token's output depends only on that token's inputs and its own sequence's
 * keys), so a sequence's logits are bit-for-bit the same whichever sequences share its
 * steps, whatever --max-batch is, and whether its system prompt came from the shared
 * prefix or was prefilled with the rest of its prompt.  The frozen linears and the LoRA
 * therefore go through bk_gen_ops, not ops->linear_forward (OpenBLAS sgemm picks
 * kernels by matrix size, so a row's rounding depends on how many rows it runs with). */
#ifndef BK_GEN_H
#define BK_GEN_H

#include <stdint.h>

#include "gpu/model.h"
#include "gpu/sample.h"

/* Ops of the generation path that the training op table lacks; the host twin is
 * bk_gen_ops_host (gpu/host_decode.c).  A CUDA version (paged KV cache) slots in here.
 * Buffers are device memory from ops->alloc unless said otherwise; int arrays int32. */
typedef struct bk_gen_ops {
	const char *name;
	/* y [T,out] = x [T,in] W^T, row t of y a function of row t of x and W only */
	void (*linear)(float *y /* [T,out] */, const float *x /* [T,in] */,
		       const bk_weight *W /* [out,in] */, int T);
	/* y [T,out] += scale * (x A^T) B^T, row-wise like linear; no dropout (inference).
	 * xa: [T,R] workspace */
	void (*lora)(float *y /* [T,out] += */, const float *x /* [T,in] */,
		     const float *A /* [R,in] */, const float *B /* [out,R] */, int T, int in,
		     int out, int R, float scale, float *xa /* [T,R] */);
	/* kc[seq[t]][row[t],:,:] = k[t,:,:], the same for v: stores the new tokens' keys
	 * and values in their sequences' caches.  kc, vc: host arrays of S device
	 * pointers, each [C_s,NKV,D] (one layer). */
	void (*kv_store)(float *const *kc, float *const *vc, const float *k /* [T,NKV,D] */,
			 const float *v /* [T,NKV,D] */, const int32_t *seq /* [T] */,
			 const int32_t *row /* [T] */, int T, int NKV, int D);
	/* Attention of T new query tokens (after kv_store): query t of sequence s = seq[t]
	 * attends, head h with kv head h / (NH/NKV) and scores q.k / sqrt(D), to the shared
	 * prefix keys 0..P-1 when use_prefix[s], then to rows 0..row[t] of its own cache,
	 * in that order.  A decode step is T = S single-token queries. */
	void (*attend)(float *out /* [T,NH,D] */, const float *q /* [T,NH,D] */,
		       const int32_t *seq /* [T] */, const int32_t *row /* [T] */, int T,
		       int NH, int NKV, int D, const float *const *kc, const float *const *vc,
		       const int32_t *use_prefix /* [S] */, const float *prefix_k /* [P,NKV,D] */,
		       const float *prefix_v /* [P,NKV,D] */, int P);
} bk_gen_ops;

extern const bk_gen_ops bk_gen_ops_host;
/* The generation ops that go with ops (the host twin's for bk_ops_host); dies naming
 * the device when there are none. */
const bk_gen_ops *bk_gen_ops_for(const bk_ops *ops);

/* Called with every row of logits a sample is drawn from (host memory, [V]), before the
 * draw; step = index of the token about to be drawn (0 = first new token). */
typedef void (*bk_gen_logits_fn)(void *ctx, uint64_t tag, int step, const float *logits,
				 int V);

typedef struct bk_gen_config {
	int max_batch;       /* sequences decoding together (>= 1) */
	int max_new;         /* new tokens per sample at most (>= 1) */
	int max_seq;         /* prompt + new tokens <= max_seq (model positions); 0 = none */
	bk_sample_params sample; /* temperature 0 = greedy */
	const int32_t *stop; /* ids that end a sample (kept as its last id); copied */
	int n_stop;
	bk_gen_logits_fn on_logits; /* optional (tests) */
	void *ctx;
} bk_gen_config;

typedef struct bk_gen_result {
	uint64_t tag;
	int32_t *ids;   /* [n] malloc'd, the caller frees */
	int n;
	int stopped;    /* 1: ids[n-1] is a stop id; 0: ended at max_new (or max_seq) */
} bk_gen_result;

typedef struct bk_gen_stats {
	uint64_t steps;          /* forward passes */
	uint64_t prefix_builds;  /* shared-prefix computations */
	int prefix_len;          /* P of the current prefix (0: none) */
	uint64_t prefix_hits;    /* prompts that used the shared prefix */
	uint64_t prefix_misses;  /* prompts prefilled in full (do not start with it) */
	uint64_t prompt_tokens;  /* prompt tokens prefilled (not counting the prefix) */
	uint64_t new_tokens;     /* tokens sampled */
	int max_active;          /* most sequences decoding in one step */
} bk_gen_stats;

typedef struct bk_gen bk_gen;

/* lora NULL = adapter off.  The engine keeps pointers to m, gops and lora. */
bk_gen *bk_gen_create(const bk_model *m, const bk_gen_ops *gops, const bk_lora *lora,
		      const bk_gen_config *cfg);
void bk_gen_free(bk_gen *g);

/* Computes the K/V of ids[0..P) (with the engine's adapter) once; every prompt queued
 * afterwards that starts with these ids and is longer reuses them.  Only while nothing
 * is queued or running; P = 0 drops the prefix. */
void bk_gen_set_prefix(bk_gen *g, const int32_t *ids, int P);
/* The longest common prefix of n prompts, capped so that each keeps one own token. */
int bk_gen_common_prefix(const int32_t *const *prompts, const int *lens, int n);

/* Queues a prompt with n samples; sample i draws token j with u = bk_crng_uniform(
 * keys[i], j) and is reported with tags[i].  Prompts run in queue order. */
void bk_gen_submit(bk_gen *g, const int32_t *prompt, int n_prompt, int n,
		   const uint64_t *keys, const uint64_t *tags);
/* One step: prefill queued prompts as slots need them, advance every running sample by
 * one token, refill finished slots.  Returns 0 when nothing is queued or running. */
int bk_gen_step(bk_gen *g);
/* Samples queued or running. */
uint64_t bk_gen_pending(const bk_gen *g);
/* Pops a finished sample (in finishing order); 0 when there is none. */
int bk_gen_take(bk_gen *g, bk_gen_result *out);
const bk_gen_stats *bk_gen_get_stats(const bk_gen *g);

/* Whole-list generation for callers such as bk-eval: one sample per prompt; keys NULL
 * for greedy (cfg->sample.temperature must then be 0).  prefix NULL and P = -1: the
 * common prefix of the prompts; P = 0: none.  out_ids[i] (malloc'd) and out_n[i] get
 * prompt i's new tokens, including its stop id when it stopped on one. */
void bk_gen_run(const bk_model *m, const bk_gen_ops *gops, const bk_lora *lora,
		const bk_gen_config *cfg, const int32_t *prefix, int P,
		const int32_t *const *prompts, const int *lens, int n, const uint64_t *keys,
		int32_t **out_ids, int *out_n);

#endif
