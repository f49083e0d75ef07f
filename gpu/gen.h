/* gen.h - batched generation with a KV cache over the op table (gpu/ops.h) and the
 * model (gpu/model.h): packed prefill of many prompts, one-token decode steps for up to
 * max_batch sequences, continuous batching (a finished sequence's slot is refilled in
 * the same step), and a shared read-only prefix (the system prompt) computed once.
 * Not the sampler (gpu/sample.h) and not stream handling (cmd/bk-gen.c).
 *
 * Dimension letters as in ops.h; in addition
 *   NB  blocks of the paged KV cache    BS  token rows per block (BK_GEN_BLOCK)
 *   W   width of a block table (blocks of the longest sequence in a step)
 *
 * Numerics do not depend on batch composition: every op used by the generation path is
 * row-wise (a token's output depends only on that token's inputs and its own sequence's
 * keys), so a sequence's logits are bit-for-bit the same whichever sequences share its
 * steps, whatever --max-batch is, and whether its system prompt came from the shared
 * prefix or was prefilled with the rest of its prompt.  The frozen linears and the LoRA
 * therefore go through bk_gen_ops, not ops->linear_forward (OpenBLAS sgemm picks
 * kernels by matrix size, so a row's rounding depends on how many rows it runs with).
 * The CUDA gen ops keep that property (a fixed reduction order per output element
 * whatever the number of rows), with their own bf16 numerics, not the host's bits.
 *
 * Scoring (bk_gen_config.teacher_k >= 1).  Token j of a sample is drawn from the logits
 * of position n + j - 1 (n: the prompt's length): the prefill's last row for j = 0, a
 * decode step's row after.  With the adapter off these are the teacher's logits on
 * prompt + ids[0..j-1], the rows bk-teach computes for that sequence (teach.h: positions
 * a-1 .. a+n-2).  Each step also runs gops->teacher_topk on its rows at the KL
 * temperature (not the sampling temperature, top-k or top-p: the full vocabulary) and
 * keeps row j of every sample with its token, so every result carries the teacher field
 * of its ids; a prompt's prefill row is computed once and copied to each of its samples. */
#ifndef BK_GEN_H
#define BK_GEN_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/model.h"
#include "gpu/sample.h"

/* The paged KV cache.  Keys and values live in two pools of fixed-size blocks of
 * BK_GEN_BLOCK token rows, each laid out [NB][L][BS][NKV][D] (block-major, so one copy
 * moves a block of every layer) in the gen ops' own number type (kv_bytes: fp32 on the
 * host, bf16 on CUDA).  A sequence's keys at positions 0..n-1 are found through its
 * block table: position j is row j % BS of block table[j / BS].  A token's "slot" is
 * block * BS + row.  The shared prefix's full blocks head every table that uses it. */
enum { BK_GEN_BLOCK = 16 };

/* Ops of the generation path that the training op table lacks; the host twin is
 * bk_gen_ops_host (gpu/host/host_decode.c), the CUDA one bk_gen_ops_cuda (gpu/cuda/cuda_gen.cu).
 * Buffers are device memory from ops->alloc unless said otherwise; int arrays int32. */
typedef struct bk_gen_ops {
	const char *name;
	int kv_bytes; /* bytes of one cached key or value number (4: fp32, 2: bf16) */
	/* y [T,out] = x [T,in] W^T, row t of y a function of row t of x and W only */
	void (*linear)(float *y /* [T,out] */, const float *x /* [T,in] */,
		       const bk_weight *W /* [out,in] */, int T);
	/* y [T,out] += scale * (x A^T) B^T, row-wise like linear; no dropout (inference).
	 * xa: [T,R] workspace */
	void (*lora)(float *y /* [T,out] += */, const float *x /* [T,in] */,
		     const float *A /* [R,in] */, const float *B /* [out,R] */, int T, int in,
		     int out, int R, float scale, float *xa /* [T,R] */);
	/* Layer l of pools kp, vp ([NB][L][BS][NKV][D]): the row of slot[t] gets k[t] and
	 * v[t] (converted to the pool's type). */
	void (*kv_store)(void *kp, void *vp, int l, int L, const float *k /* [T,NKV,D] */,
			 const float *v /* [T,NKV,D] */, const int32_t *slot /* [T] */, int T,
			 int NKV, int D);
	/* Attention of T new query tokens (after kv_store): query t of sequence s = seq[t]
	 * (at position nkey[t]-1) attends, head h with kv head h / (NH/NKV) and scores
	 * cap(q.k * ap->scale) (ops.h's bk_attn), to the keys at positions
	 * max(0, nkey[t] - ap->window) .. nkey[t]-1 (all from 0 when window is 0) of
	 * sequence s (layer l, through row s of table), in position order; blocks wholly
	 * before the window are not read.  A decode step is T = S single-token queries. */
	void (*attend)(float *out /* [T,NH,D] */, const float *q /* [T,NH,D] */,
		       const int32_t *seq /* [T] */, const int32_t *nkey /* [T] */, int T,
		       int NH, int NKV, int D, const void *kp, const void *vp, int l, int L,
		       const int32_t *table /* [S,W] */, int W, const bk_attn *ap);
	/* Optional (NULL: the engine samples on the host with gpu/sample.h): draws N tokens
	 * on the device by the rule of sample.h, draw i from the row rows[i] of logits
	 * [*,V] with u = bk_crng_uniform(keys[i], counters[i]) (ignored when temperature
	 * is 0), top_k 0 = off.  ids: [N] device, -1 where a row holds a NaN.  work:
	 * sample_work_bytes. */
	void (*sample)(int32_t *ids /* [N] */, const float *logits /* [*,V] */,
		       const int32_t *rows /* [N] */, const uint64_t *keys /* [N] */,
		       const int32_t *counters /* [N] */, int N, int V, float temperature,
		       int top_k, float top_p, void *work);
	size_t (*sample_work_bytes)(int N, int V);
	/* The teacher top-k of N rows of logits (the step's rows 0..N-1, final softcap
	 * already applied, as forward leaves them): for row r the k largest ids of
	 * softmax(logits[r] / temperature), most likely first (ties: smaller id first),
	 * their log-probs over the full vocabulary and rest[r], the probability of all
	 * other ids summed directly: gpu/host/loss.h bk_teacher_topk's logits form, which
	 * the host twin calls (bk-teach's field).  ids, logp [N,k], rest [N] device.  The
	 * logits may be overwritten (CUDA scales them in place: the step's draws are made). */
	void (*teacher_topk)(float *logits /* [N,V] */, int N, int V, float temperature, int k,
			     int32_t *ids /* [N,k] */, float *logp /* [N,k] */,
			     float *rest /* [N] */);
	/* Optional: bytes of device memory free now (reports only: the KV pool is never
	 * sized by it, see bk_gen_config.kv_memory). */
	size_t (*mem_free)(void);
	/* Optional, all or none (the host twin has none; needs sample): the fast step.
	 * When fast() is nonzero (CUDA: BK_DECODE=v2), every step is one upload of its
	 * inputs and draws from pinned memory, the forward, the sampler, one download,
	 * one sync; a step that only decodes runs as a CUDA graph per (batch-size bucket,
	 * table-width bucket), replayed.
	 *   host_alloc / host_free   pinned host memory
	 *   upload_async / download_async   ordered on the ops' stream; the host side must
	 *                            be host_alloc memory and stays in use until sync()
	 *   capture_begin            starts capturing the stream's work; 0: capture is
	 *                            off (e.g. BK_CUDA_SYNC=1), run eagerly
	 *   capture_end              the captured work as a replayable graph
	 *   graph_launch / graph_free
	 *   epoch                    changes whenever a workspace that a captured graph
	 *                            points into is reallocated (the engine then captures
	 *                            again) */
	int (*fast)(void);
	void *(*host_alloc)(size_t bytes);
	void (*host_free)(void *p);
	void (*upload_async)(void *dst_device, const void *src_host, size_t bytes);
	void (*download_async)(void *dst_host, const void *src_device, size_t bytes);
	void (*sync)(void);
	int (*capture_begin)(void);
	void *(*capture_end)(void);
	void (*graph_launch)(void *graph);
	void (*graph_free)(void *graph);
	uint64_t (*epoch)(void);
} bk_gen_ops;

extern const bk_gen_ops bk_gen_ops_host;
#ifdef BK_HAVE_CUDA
extern const bk_gen_ops bk_gen_ops_cuda; /* gpu/cuda/cuda_gen.cu */
#endif
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
	size_t kv_memory;    /* bytes for the K and V pools, allocated at once; 0 = the plan
			      * of max_prompt below, or without it grown on demand (never
			      * sized by the device's free memory) */
	int max_prompt;      /* longest prompt (tokens, prefix included) the pool is planned
			      * for (gpu/memplan.h bk_mem_kv_blocks); 0 = unknown */
	int ntraj;           /* samples per prompt, for that plan (0: 1) */
	int prefix_len;      /* the shared prefix's tokens, for that plan (0: none) */
	bk_sample_params sample; /* temperature 0 = greedy; then top-k (0: off), top-p */
	const int32_t *stop; /* ids that end a sample (kept as its last id); copied */
	int n_stop;
	int teacher_k;       /* >= 1: score every drawn token (Scoring, above); 0: none */
	float teacher_temperature; /* the KL temperature of that score (> 0) */
	bk_gen_logits_fn on_logits; /* optional (tests) */
	void *ctx;
} bk_gen_config;

typedef struct bk_gen_result {
	uint64_t tag;
	int32_t *ids;   /* [n] malloc'd, the caller frees */
	int n;
	int stopped;    /* 1: ids[n-1] is a stop id; 0: ended at max_new (or max_seq) */
	/* with teacher_k (else NULL), malloc'd, the caller frees: row j is the teacher
	 * top-k of the logits ids[j] was drawn from (Scoring, above) */
	int32_t *t_ids; /* [n, teacher_k] */
	float *t_logp;  /* [n, teacher_k] */
	float *t_rest;  /* [n] */
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
	int kv_block;            /* tokens per KV block (BK_GEN_BLOCK) */
	int kv_blocks;           /* blocks the pool holds now */
	int kv_blocks_limit;     /* the most it may hold (INT32_MAX: unbounded) */
	int kv_blocks_peak;      /* most blocks in use at once */
	int prefix_blocks;       /* blocks of the current prefix (shared read-only) */
	uint64_t prefix_shared;  /* prefix blocks referenced instead of recomputed/copied */
	uint64_t kv_waits;       /* times a prompt or sample waited for free blocks */
	uint64_t recomputes;     /* prefilled prompts dropped to free blocks, to run again */
	uint64_t decode_steps;   /* steps that advanced at least one running sample */
	double decode_seconds;   /* wall time of those steps (forward + sampling) */
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
