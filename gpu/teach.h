/* teach.h - the teacher pass of bk-teach: the frozen base model (adapter off) over
 * packed teacher sequences t_prompt + resp, optionally against a shared prefix (the
 * system prompt), and the teacher distribution (top-k or full) at each response row.
 * Not stream handling (cmd/bk-teach.c) and not the loss (gpu/host/loss.h computes both).
 *
 * Rows: a sequence with prompt length a and response length n runs as the a + n - 1
 * tokens prompt + resp[0..n-2] (the last response token predicts nothing that is
 * kept); its last n rows, positions a-1 .. a+n-2, predict resp[0..n-1].
 *
 * Invariants:
 *  1. The result for a sequence does not depend on which other sequences share its
 *     forward, on the token budget, or on whether it ran against the prefix: on the
 *     host twin bit for bit (its linears and LM head run row-wise, gpu/host/host_rows.h),
 *     on a GPU within float rounding (cuBLAS picks its kernels by matrix size).
 *  2. A sequence runs against the prefix iff its prompt starts with the prefix ids
 *     and a > P, so every one of its response rows is its own token; otherwise it
 *     runs in full from position 0.
 *  3. The prefix is set at most once per bk_teach (bk_teach_prefix_from).
 *  4. Activations are a forward's (gpu/model.h bk_acts_create_fwd), sized for the
 *     largest forward run so far, at most max(budget, longest sequence): a sequence
 *     longer than the budget runs alone in a forward of its own. */
#ifndef BK_TEACH_H
#define BK_TEACH_H

#include <stdint.h>

#include "formats/teacher.h"
#include "gpu/model.h"

typedef struct {
	const int32_t *prompt; /* [a] teacher prompt ids (t_prompt) */
	int a;                 /* >= 1 */
	const int32_t *resp;   /* [n] response ids */
	int n;                 /* >= 0; n = 0 gives an empty teacher field */
} bk_teach_seq;

typedef struct {
	uint64_t forwards;     /* model forwards run (prefix build not counted) */
	uint64_t tokens;       /* tokens run through the model, prefix tokens excluded */
	uint64_t rows;         /* response rows computed */
	uint64_t with_prefix;  /* sequences that ran against the prefix */
	uint64_t full;         /* sequences that ran in full */
	size_t acts_bytes;     /* device bytes of the activations now (bk_acts_bytes) */
	int acts_T;            /* the tokens they hold: the largest forward so far */
} bk_teach_stats;

typedef struct bk_teach bk_teach;

/* lm_head: unused (the ops read the model's own head, m->lm_head); NULL is fine, and
 * the tools pass NULL so that no host copy of the head is held.  max_tokens: own tokens per forward (>= 1).  k: top-k (1..V) or 0 for
 * the full distribution.  temperature > 0; vocab_chunk >= 1 (columns of the LM head
 * per pass, see gpu/host/loss.h). */
bk_teach *bk_teach_create(const bk_model *m, const float *lm_head, int max_tokens, int k,
			  float temperature, int vocab_chunk);
void bk_teach_free(bk_teach *t);

/* Builds the shared prefix once: the longest common prefix of the S prompts (those
 * with n >= 1), capped at min(a) - 1 so every sequence keeps its response rows.
 * Returns P (0: no prefix; sequences then run in full).  Calling it twice is a BUG. */
int bk_teach_prefix_from(bk_teach *t, const bk_teach_seq *seqs, int S);
int bk_teach_prefix_len(const bk_teach *t);

/* Runs the S sequences (packed into forwards of at most max_tokens own tokens) and
 * fills out[s] with the teacher field of sequence s: k, temperature, n, v and the
 * arrays (storage reused across calls: zero-initialise out once, bk_teacher_free). */
void bk_teach_run(bk_teach *t, const bk_teach_seq *seqs, int S, bk_teacher *out);
const bk_teach_stats *bk_teach_stats_get(const bk_teach *t);

/* The LM head [V,H] of the model in host fp32, as gpu/host/loss.h wants it: on the host
 * twin the model's own weights (*owned = NULL); on another device read from the
 * checkpoint in dir (lm_head.weight, or model.embed_tokens.weight when tied) into a
 * malloc'd *owned, which the caller frees. */
const float *bk_teach_lm_head(const bk_model *m, const char *dir, float **owned);

#endif
