/* gen.c - the generation engine of gen.h: prompt queue, slots, a paged KV cache (one pool
 * of fixed-size blocks, a block table per sequence, the shared prefix's blocks referenced
 * by every sequence that uses it), one packed forward per step, sampling on the host or
 * on the device.  Not the stream tool (cmd/bk-gen.c), not the kernels (bk_gen_ops).
 *
 * Design note.  A queued prompt (an "entry") carries n samples.  Its own tokens (those
 * after the shared prefix, or all of them when it does not start with the prefix) are
 * prefilled once into the entry's blocks, and the first token of each of its samples is
 * drawn right then from the logits of its last position (a pure function of the key, so
 * when it is drawn does not matter).  Each sample that gets a slot references the entry's
 * full blocks and copies the block holding the entry's last rows.  A step:
 *   1. picks queued entries to prefill until the prefilled-but-not-started samples
 *      number max_batch (or the queue is empty, or the pool is short of blocks);
 *   2. runs one forward over [one token of every running sample] + [those prompts];
 *   3. draws the next token of every running sample and the first token of every sample
 *      of the new prompts (with teacher_k, each row's teacher top-k is kept with the
 *      token drawn from it, the prefill row once per entry: gen.h Scoring); a sample
 *      that drew a stop id or reached its max_new is finished and its slot and blocks
 *      freed;
 *   4. fills every free slot (those just freed too) with the next waiting sample, while
 *      the pool has its blocks.
 *
 * Invariants:
 *  1. A running sample's table covers positions 0..n+max_new-1 (n = its prompt's length);
 *     after a step rows 0..n+n_out-2 hold keys: the prompt's, then every drawn token but
 *     the last, which is the token fed next step, at position n+n_out-1.
 *  2. Entries leave the queue in order; the prefilled ones are a prefix of the queue.
 *  3. Sample i of an entry draws its token j with u = bk_crng_uniform(key_i, j): a pure
 *     function of the key, so nothing depends on slots, steps or batch size; and every
 *     op is row-wise (gen.h), so the logits do not either.
 *  4. The prefix is only set while nothing is queued or running.
 *  5. A block's ref count is the number of tables (prefix, entries, samples) that hold it.
 *     A table shares only blocks wholly below its own first position, which are full and
 *     never written again; the block holding its first position is a private copy.  So a
 *     block is written only by the one table that owns its rows.
 *  6. A prefilled entry and a started sample hold every block they will write (allocated
 *     up front), so running samples always finish; admission waits for free blocks, and
 *     when nothing runs and the head cannot start, later prefilled entries give theirs
 *     back (to be prefilled again).  A prompt that cannot fit in the pool at all dies at
 *     submission. */
#include "gpu/gen.h"
#include "gpu/memplan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/diag.h"
#include "common/rng.h"

enum { BS = BK_GEN_BLOCK };

typedef struct {
	int32_t *b; /* block ids in logical order */
	int n;
} btable;

typedef struct entry {
	int32_t *ids; /* [n] whole prompt, host */
	int n, own0, use_prefix, max_new;
	int n_samples, next; /* samples; the next one to start */
	uint64_t *keys, *tags;
	int32_t *first; /* [n_samples] first token of each sample, once prefilled */
	int32_t *t_ids; /* [K] teacher top-k of the prefill row (teacher_k), once prefilled */
	float *t_logp;  /* [K] */
	float t_rest;
	btable tab;     /* positions 0..n-1, once prefilled */
	int prefilled;
	struct entry *link;
} entry;

typedef struct {
	int active;
	int n, max_new; /* prompt length; new tokens at most */
	uint64_t key, tag;
	btable tab;   /* positions 0..n+max_new-1 */
	int32_t *out; /* [max_new] */
	int n_out;
	int32_t *t_ids; /* [max_new, K] teacher rows of out (teacher_k), else NULL */
	float *t_logp;  /* [max_new, K] */
	float *t_rest;  /* [max_new] */
} slot;

typedef struct {
	int n_tok, pos0;
	const int32_t *ids;
	const btable *tab;
} item;

typedef struct {
	void *k, *v;       /* [cap][L][BS][NKV][D] device, gops->kv_bytes each */
	size_t bbytes;     /* bytes of one block (one of K or V, every layer) */
	int cap, limit;    /* blocks allocated; the most allowed */
	int32_t *ref;      /* [cap] */
	int32_t *freel;    /* [cap] free block ids (a stack) */
	int n_free, used;
} kvpool;

/* a captured decode step (the fast path): graph, the epochs it was captured at */
typedef struct {
	void *exec;
	uint64_t e_ops, e_eng;
	int seen; /* the shape ran once eagerly (its workspaces are allocated) */
} fgraph;

enum { FG_DIM = 32 }; /* graphs [log2 batch bucket][log2 table-width bucket] */

/* device pointers of a step's inputs */
typedef struct {
	const int32_t *ids, *pos, *seq, *slot, *nkey, *table;
} stepin;

/* one draw of a step: row of the step's logits, key, counter (token index) */
typedef struct {
	int row;
	uint64_t key, tag;
	int counter;
} drawreq;

struct bk_gen {
	const bk_model *m;
	const bk_ops *ops;
	const bk_gen_ops *gops;
	const bk_lora *lora;
	bk_gen_config cfg;
	int32_t *stop;
	kvpool pool;
	btable pfx;          /* the prefix's blocks */
	int P;               /* prefix length (0: none) */
	int32_t *prefix_ids; /* [P] host */
	entry *qhead, *qtail;
	slot *slots;
	int n_active;
	uint64_t pending;
	BK_VEC(bk_gen_result) done;
	size_t done_head;
	bk_sample_work *sw;
	bk_gen_stats st;
	/* step workspace, for capT tokens, capS sequences, capTab table entries, capN draws */
	int capT, capS, capTab, capN;
	float *x, *ln, *q, *k, *v, *att, *tmp, *gate, *up, *hm, *rstd, *xa; /* device */
	float *hl, *hn, *logits;                                           /* device [S,*] */
	int32_t *d_ids, *d_pos, *d_seq, *d_slot, *d_nkey, *d_last;        /* device [T] */
	int32_t *d_table;                                                  /* device [S,W] */
	int32_t *h_ids, *h_pos, *h_seq, *h_slot, *h_nkey, *h_last, *h_table; /* host */
	float *h_logits;                                                   /* host [S,V] */
	int32_t *d_drow, *d_dctr, *d_dids, *h_drow, *h_dctr, *h_dids;     /* [N] */
	uint64_t *d_dkey, *h_dkey;                                         /* [N] */
	void *swork;                                                       /* device */
	/* teacher scoring (cfg.teacher_k = K): the top-k of a step's capTk rows */
	int capTk;
	int32_t *d_tids, *h_tids; /* [capTk,K] device, host */
	float *d_tlogp, *h_tlogp; /* [capTk,K] */
	float *d_trest, *h_trest; /* [capTk] */
	/* the fast step (gops->fast(), gen.h): one pinned input block [f_ints] (ids, pos,
	 * seq, slot, nkey [fT] each, draw rows, draw counters [fN] each, draw keys [fN]
	 * uint64, table [fS, fW]) and its device mirror; padding rows of a batch bucket
	 * write the scratch KV block (one past the pool's own blocks) */
	int fast, fT, fS, fN, fW;
	int32_t *f_h, *f_d;
	size_t f_ints;
	int32_t *f_ids_h, *f_ids_d; /* [fN] drawn ids: pinned, device */
	void *f_swork;              /* sampler work for fN draws */
	int32_t scratch_blk;
	uint64_t eng_epoch;         /* bumped when a buffer a graph points into moves */
	fgraph *graphs;             /* [FG_DIM * FG_DIM] */
};

static size_t kvd(const bk_model *m) { return (size_t)m->cfg.NKV * m->cfg.D; }
static int nblk(long npos) { return (int)((npos + BS - 1) / BS); }

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the block pool ---- */

static int pool_avail(const bk_gen *g) { return g->pool.n_free + (g->pool.limit - g->pool.cap); }

static void pool_grow(bk_gen *g, int want)
{
	kvpool *p = &g->pool;
	int cap = p->cap;
	long nc = cap * 2L > want ? cap * 2L : want;
	nc = nc < 64 ? 64 : nc;
	nc = nc > p->limit ? p->limit : nc;
	BUG_ON(nc <= cap);
	size_t nphys = (size_t)nc + (g->fast ? 1 : 0); /* + the fast path's scratch block */
	void *k = bk_alloc(g->ops, nphys * p->bbytes, "kv pool");
	void *v = bk_alloc(g->ops, nphys * p->bbytes, "kv pool");
	if (cap) {
		g->ops->copy(k, p->k, (size_t)cap * p->bbytes);
		g->ops->copy(v, p->v, (size_t)cap * p->bbytes);
	}
	g->ops->free(p->k);
	g->ops->free(p->v);
	p->k = k;
	p->v = v;
	p->ref = xrealloc(p->ref, (size_t)nc * sizeof(int32_t));
	p->freel = xrealloc(p->freel, (size_t)nc * sizeof(int32_t));
	for (long b = nc - 1; b >= cap; b--) { /* lower ids pop first */
		p->ref[b] = 0;
		p->freel[p->n_free++] = (int32_t)b;
	}
	p->cap = (int)nc;
	g->st.kv_blocks = p->cap;
	g->scratch_blk = (int32_t)nc;
	g->eng_epoch++;
}

static int32_t blk_alloc(bk_gen *g)
{
	kvpool *p = &g->pool;
	if (!p->n_free)
		pool_grow(g, p->cap + 1);
	BUG_ON(!p->n_free);
	int32_t b = p->freel[--p->n_free];
	BUG_ON(p->ref[b] != 0);
	p->ref[b] = 1;
	if (++p->used > g->st.kv_blocks_peak)
		g->st.kv_blocks_peak = p->used;
	return b;
}

static void blk_ref(bk_gen *g, int32_t b)
{
	BUG_ON(b < 0 || b >= g->pool.cap || g->pool.ref[b] <= 0);
	g->pool.ref[b]++;
}

static void blk_put(bk_gen *g, int32_t b)
{
	kvpool *p = &g->pool;
	BUG_ON(b < 0 || b >= p->cap || p->ref[b] <= 0);
	if (--p->ref[b] == 0) {
		p->freel[p->n_free++] = b;
		p->used--;
	}
}

static void blk_copy(bk_gen *g, int32_t dst, int32_t src)
{
	size_t bb = g->pool.bbytes;
	g->ops->copy((char *)g->pool.k + dst * bb, (char *)g->pool.k + src * bb, bb);
	g->ops->copy((char *)g->pool.v + dst * bb, (char *)g->pool.v + src * bb, bb);
}

static void tab_release(bk_gen *g, btable *t)
{
	for (int j = 0; j < t->n; j++)
		blk_put(g, t->b[j]);
	free(t->b);
	t->b = NULL;
	t->n = 0;
}

/* t covers positions 0..npos-1: the first `share` blocks from src (referenced), then
 * fresh ones; the first fresh one starts as a copy of src's block `share` when cow. */
static void tab_build(bk_gen *g, btable *t, long npos, const btable *src, int share, int cow)
{
	t->n = nblk(npos);
	BUG_ON(share > t->n || (src && share > src->n) || (cow && (!src || share >= src->n)));
	t->b = xmalloc((size_t)(t->n > 0 ? t->n : 1) * sizeof(int32_t));
	for (int j = 0; j < share; j++) {
		t->b[j] = src->b[j];
		blk_ref(g, t->b[j]);
	}
	g->st.prefix_shared += src == &g->pfx ? (uint64_t)share : 0;
	for (int j = share; j < t->n; j++)
		t->b[j] = blk_alloc(g);
	if (cow && share < t->n)
		blk_copy(g, t->b[share], src->b[share]);
}

/* blocks an entry takes to prefill, and one of its samples to start */
static int need_entry(const entry *e) { return nblk(e->n) - e->own0 / BS; }
static int need_sample(const entry *e) { return nblk((long)e->n + e->max_new) - e->n / BS; }

/* ---- workspace ---- */

static void ws_free(bk_gen *g)
{
	const bk_ops *ops = g->ops;
	void *dev[] = { g->x, g->ln, g->q, g->k, g->v, g->att, g->tmp, g->gate, g->up, g->hm,
			g->rstd, g->xa, g->hl, g->hn, g->logits, g->d_ids, g->d_pos, g->d_seq,
			g->d_slot, g->d_nkey, g->d_last };
	for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
		ops->free(dev[i]);
	void *host[] = { g->h_ids, g->h_pos, g->h_seq, g->h_slot, g->h_nkey, g->h_last,
			 g->h_logits };
	for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
		free(host[i]);
}

static void ws_ensure(bk_gen *g, int T, int S)
{
	if (T <= g->capT && S <= g->capS)
		return;
	ws_free(g);
	g->eng_epoch++;
	/* rounded up (to 64 tokens, 16 sequences), not doubled: gpu/memplan.c's plan of the
	 * step workspace is the largest step's, so rounded */
	T = T > g->capT ? (T + 63) / 64 * 64 : g->capT;
	S = S > g->capS ? (S + 15) / 16 * 16 : g->capS;
	g->capT = T;
	g->capS = S;
	const bk_ops *ops = g->ops;
	const bk_llama_config *c = &g->m->cfg;
	size_t H = c->H, I = c->I, QD = (size_t)c->NH * c->D, KVD = kvd(g->m), V = c->V;
	size_t R = g->lora ? (size_t)g->lora->r : 1, f = sizeof(float), i4 = sizeof(int32_t);
	const char *ws = "step workspace"; /* the buffers' name in an out-of-memory error */
	g->x = bk_alloc(ops, T * H * f, ws);
	g->ln = bk_alloc(ops, T * H * f, ws);
	g->tmp = bk_alloc(ops, T * H * f, ws);
	g->q = bk_alloc(ops, T * QD * f, ws);
	g->att = bk_alloc(ops, T * QD * f, ws);
	g->k = bk_alloc(ops, T * KVD * f, ws);
	g->v = bk_alloc(ops, T * KVD * f, ws);
	g->gate = bk_alloc(ops, T * I * f, ws);
	g->up = bk_alloc(ops, T * I * f, ws);
	g->hm = bk_alloc(ops, T * I * f, ws);
	g->rstd = bk_alloc(ops, T * (size_t)(c->NH > 1 ? c->NH : 1) * f, ws); /* per head: qk_norm */
	g->xa = bk_alloc(ops, T * R * f, ws);
	g->hl = bk_alloc(ops, S * H * f, ws);
	g->hn = bk_alloc(ops, S * H * f, ws);
	g->logits = bk_alloc(ops, S * V * f, ws);
	g->d_ids = bk_alloc(ops, T * i4, ws);
	g->d_pos = bk_alloc(ops, T * i4, ws);
	g->d_seq = bk_alloc(ops, T * i4, ws);
	g->d_slot = bk_alloc(ops, T * i4, ws);
	g->d_nkey = bk_alloc(ops, T * i4, ws);
	g->d_last = bk_alloc(ops, S * i4, ws);
	g->h_ids = xmalloc(T * i4);
	g->h_pos = xmalloc(T * i4);
	g->h_seq = xmalloc(T * i4);
	g->h_slot = xmalloc(T * i4);
	g->h_nkey = xmalloc(T * i4);
	g->h_last = xmalloc(S * i4);
	g->h_logits = xmalloc(S * V * f);
}

static void table_ensure(bk_gen *g, int n)
{
	if (n <= g->capTab)
		return;
	g->capTab = n > 2 * g->capTab ? n : 2 * g->capTab;
	g->eng_epoch++;
	g->ops->free(g->d_table);
	free(g->h_table);
	g->d_table = bk_alloc(g->ops, (size_t)g->capTab * sizeof(int32_t), "block tables");
	g->h_table = xmalloc((size_t)g->capTab * sizeof(int32_t));
}

static void draws_ensure(bk_gen *g, int N)
{
	if (N <= g->capN)
		return;
	int n = (N + 15) / 16 * 16; /* rounded as gpu/memplan.c plans it */
	const bk_ops *ops = g->ops;
	free(g->h_drow);
	free(g->h_dctr);
	free(g->h_dids);
	free(g->h_dkey);
	g->h_drow = xmalloc((size_t)n * sizeof(int32_t));
	g->h_dctr = xmalloc((size_t)n * sizeof(int32_t));
	g->h_dids = xmalloc((size_t)n * sizeof(int32_t));
	g->h_dkey = xmalloc((size_t)n * sizeof(uint64_t));
	if (g->gops->sample) {
		void *dev[] = { g->d_drow, g->d_dctr, g->d_dids, g->d_dkey, g->swork };
		for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
			ops->free(dev[i]);
		const char *dw = "draws and sampler work";
		g->d_drow = bk_alloc(ops, (size_t)n * sizeof(int32_t), dw);
		g->d_dctr = bk_alloc(ops, (size_t)n * sizeof(int32_t), dw);
		g->d_dids = bk_alloc(ops, (size_t)n * sizeof(int32_t), dw);
		g->d_dkey = bk_alloc(ops, (size_t)n * sizeof(uint64_t), dw);
		g->swork = bk_alloc(ops, g->gops->sample_work_bytes(n, g->m->cfg.V), dw);
	}
	g->capN = n;
}

/* host memory of the teacher rows: pinned on the fast path (its copies are async) */
static void *score_host_alloc(const bk_gen *g, size_t bytes)
{
	return g->fast ? g->gops->host_alloc(bytes) : xmalloc(bytes);
}

static void score_host_free(const bk_gen *g)
{
	void *h[] = { g->h_tids, g->h_tlogp, g->h_trest };
	for (int i = 0; i < 3; i++)
		if (g->fast)
			g->gops->host_free(h[i]);
		else
			free(h[i]);
}

/* device and host rows for the teacher top-k of S logits rows (cfg.teacher_k) */
static void score_ensure(bk_gen *g, int S)
{
	if (S <= g->capTk)
		return;
	int n = (S + 15) / 16 * 16; /* rounded as gpu/memplan.c plans it */
	size_t K = (size_t)g->cfg.teacher_k;
	const bk_ops *ops = g->ops;
	if (g->fast && g->capTk)
		g->gops->sync(); /* no copy in flight into the old rows */
	ops->free(g->d_tids), ops->free(g->d_tlogp), ops->free(g->d_trest);
	score_host_free(g);
	g->d_tids = bk_alloc(ops, (size_t)n * K * sizeof(int32_t), "teacher top-k");
	g->d_tlogp = bk_alloc(ops, (size_t)n * K * sizeof(float), "teacher top-k");
	g->d_trest = bk_alloc(ops, (size_t)n * sizeof(float), "teacher top-k");
	g->h_tids = score_host_alloc(g, (size_t)n * K * sizeof(int32_t));
	g->h_tlogp = score_host_alloc(g, (size_t)n * K * sizeof(float));
	g->h_trest = score_host_alloc(g, (size_t)n * sizeof(float));
	g->capTk = n;
}

/* The teacher top-k of the step's logits rows 0..S-1 into h_tids, h_tlogp, h_trest
 * (gen.h Scoring), after the draws (the op may scale the logits in place).  async: the
 * fast path's copies, ordered on the stream, waited for by its one sync. */
static void score_rows(bk_gen *g, int S, int async)
{
	size_t K = (size_t)g->cfg.teacher_k;
	score_ensure(g, S);
	g->gops->teacher_topk(g->logits, S, g->m->cfg.V, g->cfg.teacher_temperature, (int)K,
			      g->d_tids, g->d_tlogp, g->d_trest);
	void (*dl)(void *, const void *, size_t) = async ? g->gops->download_async
							 : g->ops->download;
	dl(g->h_tids, g->d_tids, (size_t)S * K * sizeof(int32_t));
	dl(g->h_tlogp, g->d_tlogp, (size_t)S * K * sizeof(float));
	dl(g->h_trest, g->d_trest, (size_t)S * sizeof(float));
}

/* row `row` of the step's teacher top-k into row `at` of ids, logp [*,K], rest [*] */
static void score_put(const bk_gen *g, int32_t *ids, float *logp, float *rest, int at, int row)
{
	size_t K = (size_t)g->cfg.teacher_k;
	memcpy(ids + (size_t)at * K, g->h_tids + (size_t)row * K, K * sizeof(int32_t));
	memcpy(logp + (size_t)at * K, g->h_tlogp + (size_t)row * K, K * sizeof(float));
	rest[at] = g->h_trest[row];
}

/* ---- the forward of one step ---- */

/* y [T,out] = x W^T (+ LoRA) for module mod of layer l */
static void lin(bk_gen *g, int l, int mod, float *y, const float *x, int T)
{
	g->gops->linear(y, x, g->m->layers[l].w[mod], T);
	const bk_lora *lo = g->lora;
	if (!lo || !lo->A[l][mod])
		return;
	int in, out;
	bk_model_module_dims(&g->m->cfg, mod, &in, &out);
	g->gops->lora(y, x, lo->A[l][mod], lo->B[l][mod], T, in, out, lo->r, lo->scale, g->xa);
}

/* The host twin's rmsnorm and rope open an OpenMP region above 16 rows; a decode step's
 * few rows are not worth one (waking threads costs more than the work, and far more on a
 * busy machine), so on the host they go in row chunks of 16.  Both ops are row-wise, so
 * chunking changes no bit. */
static int row_chunk(const bk_gen *g, int T) { return g->ops == &bk_ops_host ? 16 : T; }

/* rows [T, width] */
static void norm_rows(bk_gen *g, float *out, const float *x, const bk_weight *w, int T,
		      int width)
{
	const bk_llama_config *c = &g->m->cfg;
	for (int t0 = 0, ch = row_chunk(g, T); t0 < T; t0 += ch) {
		int n = T - t0 < ch ? T - t0 : ch;
		g->ops->rmsnorm_forward(out + (size_t)t0 * width, g->rstd + t0,
					x + (size_t)t0 * width, w, n, width, c->rms_eps);
	}
}

static void rmsnorm_rows(bk_gen *g, float *out, const float *x, const bk_weight *w, int T)
{
	norm_rows(g, out, x, w, T, g->m->cfg.H);
}

static void rope_rows(bk_gen *g, float *x, const int32_t *pos, int T, int nh,
		      const float *inv_freq)
{
	const bk_llama_config *c = &g->m->cfg;
	for (int t0 = 0, ch = row_chunk(g, T); t0 < T; t0 += ch) {
		int n = T - t0 < ch ? T - t0 : ch;
		g->ops->rope_forward(x + (size_t)t0 * nh * c->D, pos + t0, inv_freq, n, nh, c->D);
	}
}

static void forward_ops(bk_gen *g, const stepin *in, int T, int S, int W,
			const int32_t *h_last);

/* Runs items[0..S) through the model, storing every token's K/V in its item's blocks;
 * leaves the logits of each item's last token in g->logits [S,V] (device) and, when
 * want_host, in g->h_logits. */
static void forward(bk_gen *g, const item *it, int S, int want_host)
{
	const bk_ops *ops = g->ops;
	const bk_model *m = g->m;
	const bk_llama_config *c = &m->cfg;
	int T = 0, W = 1;
	for (int s = 0; s < S; s++) {
		T += it[s].n_tok;
		W = it[s].tab->n > W ? it[s].tab->n : W;
	}
	BUG_ON(T <= 0);
	ws_ensure(g, T, S);
	table_ensure(g, S * W);
	size_t i4 = sizeof(int32_t);
	int t = 0;
	for (int s = 0; s < S; s++) {
		const btable *tb = it[s].tab;
		for (int i = 0; i < it[s].n_tok; i++, t++) {
			int pos = it[s].pos0 + i;
			BUG_ON(pos / BS >= tb->n);
			g->h_ids[t] = it[s].ids[i];
			g->h_pos[t] = pos;
			g->h_seq[t] = s;
			g->h_slot[t] = tb->b[pos / BS] * BS + pos % BS;
			g->h_nkey[t] = pos + 1;
		}
		g->h_last[s] = t - 1;
		for (int j = 0; j < W; j++)
			g->h_table[(size_t)s * W + j] = j < tb->n ? tb->b[j] : -1;
	}
	ops->upload(g->d_ids, g->h_ids, T * i4);
	ops->upload(g->d_pos, g->h_pos, T * i4);
	ops->upload(g->d_seq, g->h_seq, T * i4);
	ops->upload(g->d_slot, g->h_slot, T * i4);
	ops->upload(g->d_nkey, g->h_nkey, T * i4);
	ops->upload(g->d_table, g->h_table, (size_t)S * W * i4);
	stepin in = { g->d_ids, g->d_pos, g->d_seq, g->d_slot, g->d_nkey, g->d_table };
	forward_ops(g, &in, T, S, W, g->h_last);
	if (want_host)
		ops->download(g->h_logits, g->logits, (size_t)S * c->V * sizeof(float));
	g->st.steps++;
}

/* The ops of a step on device inputs `in`: T tokens of S sequences, tables [S,W]; the
 * last token of sequence s is row h_last[s] (NULL: row s, every sequence one token). */
static void forward_ops(bk_gen *g, const stepin *in, int T, int S, int W,
			const int32_t *h_last)
{
	const bk_ops *ops = g->ops;
	const bk_model *m = g->m;
	const bk_llama_config *c = &m->cfg;
	size_t H = c->H, I = c->I;
	ops->embedding_forward(g->x, in->ids, m->embed, T);
	if (c->embed_scale > 0 && c->embed_scale != 1)
		ops->scale(g->x, c->embed_scale, (size_t)T * H);
	for (int l = 0; l < c->L; l++) {
		const bk_layer *w = &m->layers[l];
		/* attention block (the same op sequence as model.c's layer_forward) */
		rmsnorm_rows(g, g->ln, g->x, w->attn_norm, T);
		if (c->qk_norm) { /* per-head norms of q and k, from their raw values in att */
			lin(g, l, BK_LORA_K, g->att, g->ln, T);
			if (c->qkv_bias)
				ops->bias_forward(g->att, w->bk, T);
			norm_rows(g, g->k, g->att, w->k_norm, T * c->NKV, c->D);
			lin(g, l, BK_LORA_Q, g->att, g->ln, T);
			if (c->qkv_bias)
				ops->bias_forward(g->att, w->bq, T);
			norm_rows(g, g->q, g->att, w->q_norm, T * c->NH, c->D);
		} else {
			lin(g, l, BK_LORA_Q, g->q, g->ln, T);
			lin(g, l, BK_LORA_K, g->k, g->ln, T);
			if (c->qkv_bias) {
				ops->bias_forward(g->q, w->bq, T);
				ops->bias_forward(g->k, w->bk, T);
			}
		}
		lin(g, l, BK_LORA_V, g->v, g->ln, T);
		if (c->qkv_bias)
			ops->bias_forward(g->v, w->bv, T);
		rope_rows(g, g->q, in->pos, T, c->NH, w->inv_freq);
		rope_rows(g, g->k, in->pos, T, c->NKV, w->inv_freq);
		g->gops->kv_store(g->pool.k, g->pool.v, l, c->L, g->k, g->v, in->slot, T, c->NKV,
				  c->D);
		g->gops->attend(g->att, g->q, in->seq, in->nkey, T, c->NH, c->NKV, c->D, g->pool.k,
				g->pool.v, l, c->L, in->table, W, &w->attn);
		lin(g, l, BK_LORA_O, g->tmp, g->att, T);
		if (c->sandwich) {
			rmsnorm_rows(g, g->ln, g->tmp, w->post_attn_norm, T);
			ops->residual_forward(g->x, g->x, g->ln, (size_t)T * H);
		} else {
			ops->residual_forward(g->x, g->x, g->tmp, (size_t)T * H);
		}
		/* MLP block */
		rmsnorm_rows(g, g->ln, g->x, w->mlp_norm, T);
		lin(g, l, BK_LORA_GATE, g->gate, g->ln, T);
		lin(g, l, BK_LORA_UP, g->up, g->ln, T);
		if (c->geglu)
			ops->geglu_forward(g->hm, g->gate, g->up, (size_t)T * I);
		else
			ops->swiglu_forward(g->hm, g->gate, g->up, (size_t)T * I);
		lin(g, l, BK_LORA_DOWN, g->tmp, g->hm, T);
		if (c->sandwich) {
			rmsnorm_rows(g, g->ln, g->tmp, w->post_mlp_norm, T);
			ops->residual_forward(g->x, g->x, g->ln, (size_t)T * H);
		} else {
			ops->residual_forward(g->x, g->x, g->tmp, (size_t)T * H);
		}
	}
	if (h_last)
		for (int s = 0; s < S; s++)
			ops->copy(g->hl + (size_t)s * H, g->x + (size_t)h_last[s] * H,
				  H * sizeof(float));
	else
		ops->copy(g->hl, g->x, (size_t)S * H * sizeof(float));
	rmsnorm_rows(g, g->hn, g->hl, m->final_norm, S);
	g->gops->linear(g->logits, g->hn, m->lm_head, S);
	if (c->final_softcap > 0) /* Gemma-2: logits <- tanh(logits / cap) * cap */
		ops->softcap_forward(g->logits, c->final_softcap, (size_t)S * c->V);
}

/* Draws every request of a step from the step's logits (rows of g->logits, S rows):
 * on the device when the gen ops sample, else on the host.  Ids go to g->h_dids. */
static void draw_all(bk_gen *g, const drawreq *d, int N)
{
	int V = g->m->cfg.V;
	const bk_sample_params *sp = &g->cfg.sample;
	if (g->cfg.on_logits)
		for (int i = 0; i < N; i++)
			g->cfg.on_logits(g->cfg.ctx, d[i].tag, d[i].counter,
					 g->h_logits + (size_t)d[i].row * V, V);
	draws_ensure(g, N);
	if (!g->gops->sample) {
		for (int i = 0; i < N; i++) {
			double u = sp->temperature > 0 ? bk_crng_uniform(d[i].key, (uint64_t)d[i].counter)
						       : 0;
			g->h_dids[i] = bk_sample_token(g->h_logits + (size_t)d[i].row * V, V, sp, u,
						       g->sw);
		}
		return;
	}
	for (int i = 0; i < N; i++) {
		g->h_drow[i] = d[i].row;
		g->h_dkey[i] = d[i].key;
		g->h_dctr[i] = d[i].counter;
	}
	const bk_ops *ops = g->ops;
	ops->upload(g->d_drow, g->h_drow, (size_t)N * sizeof(int32_t));
	ops->upload(g->d_dkey, g->h_dkey, (size_t)N * sizeof(uint64_t));
	ops->upload(g->d_dctr, g->h_dctr, (size_t)N * sizeof(int32_t));
	g->gops->sample(g->d_dids, g->logits, g->d_drow, g->d_dkey, g->d_dctr, N, V,
			sp->temperature, sp->top_k, sp->top_p, g->swork);
	ops->download(g->h_dids, g->d_dids, (size_t)N * sizeof(int32_t));
	for (int i = 0; i < N; i++)
		if (g->h_dids[i] < 0 || g->h_dids[i] >= V)
			die("sampling: the logits of sample %llu at token %d hold a NaN",
			    (unsigned long long)d[i].tag, d[i].counter);
}

/* ---- the fast decode step (gops->fast, gen.h) ---- */

static int pow2_ge(int n)
{
	int p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

static int log2_of(int p)
{
	int l = 0;
	while ((1 << l) < p)
		l++;
	return l;
}

/* Capacities of the pinned input block (tokens, rows, draws, table width): growing it
 * moves what captured graphs point at (eng_epoch). */
static void fast_inputs(bk_gen *g, int T, int S, int N, int W)
{
	if (g->f_h && T <= g->fT && S <= g->fS && N <= g->fN && W <= g->fW)
		return;
	const bk_gen_ops *go = g->gops;
	const bk_ops *ops = g->ops;
	if (g->f_h) {
		go->sync(); /* nothing in flight reads the old buffers */
		go->host_free(g->f_h);
		go->host_free(g->f_ids_h);
		ops->free(g->f_d);
		ops->free(g->f_ids_d);
		ops->free(g->f_swork);
	}
#define GROW(cap, want) ((want) > (cap) ? ((want) > 2 * (cap) ? (want) : 2 * (cap)) : (cap))
	g->fT = GROW(g->fT, T);
	g->fS = GROW(g->fS, S);
	g->fN = GROW(g->fN, N);
	g->fW = GROW(g->fW, W);
#undef GROW
	g->fT += g->fT & 1, g->fN += g->fN & 1; /* even: the uint64 keys stay 8-byte aligned */
	g->f_ints = (size_t)5 * g->fT + (size_t)4 * g->fN + (size_t)g->fS * g->fW;
	g->f_h = go->host_alloc(g->f_ints * sizeof(int32_t));
	g->f_d = bk_alloc(ops, g->f_ints * sizeof(int32_t), "fast step inputs");
	g->f_ids_h = go->host_alloc((size_t)g->fN * sizeof(int32_t));
	g->f_ids_d = bk_alloc(ops, (size_t)g->fN * sizeof(int32_t), "fast step inputs");
	g->f_swork = bk_alloc(ops, go->sample_work_bytes(g->fN, g->m->cfg.V), "fast step inputs");
	g->eng_epoch++;
}

/* One step on the fast path: the step's inputs and draws in one upload from the pinned
 * block, the forward, the sampler, the ids (and the logits when wanted) downloaded, one
 * sync.  A decode-only step (every item one token) runs for the batch bucket B =
 * pow2(S) (padding rows: token 0 at position 0 of the scratch block) and table width
 * pow2(W) as a graph: captured on the second step of a shape (the first runs eagerly, so
 * every workspace exists), replayed after, captured again when an epoch says a buffer
 * moved.  Other steps (prompts to prefill) run eagerly.  Ids go to g->h_dids. */
static void forward_fast(bk_gen *g, const item *it, int S, const drawreq *d, int N,
			 int want_host)
{
	const bk_gen_ops *go = g->gops;
	const bk_llama_config *c = &g->m->cfg;
	int T = 0, W = 1, decode = 1;
	for (int s = 0; s < S; s++) {
		T += it[s].n_tok;
		W = it[s].tab->n > W ? it[s].tab->n : W;
		decode &= it[s].n_tok == 1;
	}
	int B = decode ? pow2_ge(S) : S, Wb = decode ? pow2_ge(W) : W;
	if (decode)
		T = B;
	fast_inputs(g, T, B, N, Wb);
	ws_ensure(g, T, B);
	draws_ensure(g, N);
	size_t fT = (size_t)g->fT, fN = (size_t)g->fN;
	int32_t *h = g->f_h, *dv = g->f_d;
	int32_t *ids = h, *pos = h + fT, *seq = h + 2 * fT, *slot = h + 3 * fT, *nkey = h + 4 * fT;
	int32_t *drow = h + 5 * fT, *dctr = drow + fN, *table = drow + 4 * fN;
	uint64_t *dkey = (uint64_t *)(void *)(drow + 2 * fN); /* 5 fT + 2 fN: even */
	int t = 0;
	for (int s = 0; s < B; s++) {
		const btable *tb = s < S ? it[s].tab : NULL;
		int n = tb ? it[s].n_tok : 1;
		for (int i = 0; i < n; i++, t++) {
			int p = tb ? it[s].pos0 + i : 0;
			BUG_ON(tb && p / BS >= tb->n);
			ids[t] = tb ? it[s].ids[i] : 0;
			pos[t] = p;
			seq[t] = s;
			slot[t] = tb ? tb->b[p / BS] * BS + p % BS : g->scratch_blk * BS;
			nkey[t] = p + 1;
		}
		g->h_last[s] = t - 1;
		for (int j = 0; j < Wb; j++)
			table[(size_t)s * Wb + j] = tb ? (j < tb->n ? tb->b[j] : -1)
						       : (j == 0 ? g->scratch_blk : -1);
	}
	BUG_ON(t != T);
	for (int i = 0; i < N; i++) {
		drow[i] = d[i].row;
		dctr[i] = d[i].counter;
		dkey[i] = d[i].key;
	}
	go->upload_async(dv, h, (5 * fT + 4 * fN + (size_t)B * Wb) * sizeof(int32_t));
	int32_t *dvd = dv + 5 * fT;
	stepin in = { dv, dv + fT, dv + 2 * fT, dv + 3 * fT, dv + 4 * fT, dvd + 4 * fN };
	fgraph *fg = decode ? &g->graphs[log2_of(B) * FG_DIM + log2_of(Wb)] : NULL;
	if (fg && fg->exec && (fg->e_ops != go->epoch() || fg->e_eng != g->eng_epoch)) {
		go->graph_free(fg->exec);
		fg->exec = NULL;
		fg->seen = 0; /* a buffer moved: run the shape eagerly once more */
	}
	if (fg && !fg->exec && fg->seen && go->capture_begin()) {
		uint64_t eo = go->epoch(), ee = g->eng_epoch;
		forward_ops(g, &in, B, B, Wb, NULL);
		fg->exec = go->capture_end();
		fg->e_ops = go->epoch();
		fg->e_eng = g->eng_epoch;
		if (fg->e_ops != eo || fg->e_eng != ee) /* allocated while capturing */
			BUG("generation: a workspace moved while the decode step was captured");
	}
	if (fg && fg->exec) {
		go->graph_launch(fg->exec);
	} else {
		forward_ops(g, &in, T, B, Wb, decode ? NULL : g->h_last);
		if (fg)
			fg->seen = 1;
	}
	const bk_sample_params *sp = &g->cfg.sample;
	int V = c->V;
	go->sample(g->f_ids_d, g->logits, dvd, (const uint64_t *)(const void *)(dvd + 2 * fN),
		   dvd + fN, N, V, sp->temperature, sp->top_k, sp->top_p, g->f_swork);
	go->download_async(g->f_ids_h, g->f_ids_d, (size_t)N * sizeof(int32_t));
	if (want_host) /* pageable: this copy waits for itself */
		go->download_async(g->h_logits, g->logits, (size_t)S * V * sizeof(float));
	if (g->cfg.teacher_k) /* after the draws and the logits' copy: on the stream */
		score_rows(g, S, 1);
	go->sync();
	g->st.steps++;
	if (g->cfg.on_logits)
		for (int i = 0; i < N; i++)
			g->cfg.on_logits(g->cfg.ctx, d[i].tag, d[i].counter,
					 g->h_logits + (size_t)d[i].row * V, V);
	for (int i = 0; i < N; i++) {
		g->h_dids[i] = g->f_ids_h[i];
		if (g->h_dids[i] < 0 || g->h_dids[i] >= V)
			die("sampling: the logits of sample %llu at token %d hold a NaN",
			    (unsigned long long)d[i].tag, d[i].counter);
	}
}

/* ---- engine ---- */

bk_gen *bk_gen_create(const bk_model *m, const bk_gen_ops *gops, const bk_lora *lora,
		      const bk_gen_config *cfg)
{
	if (cfg->max_batch < 1)
		die("generation: max batch %d is not positive", cfg->max_batch);
	if (cfg->max_new < 1)
		die("generation: max new tokens %d is not positive", cfg->max_new);
	if (!(cfg->sample.temperature >= 0) || !(cfg->sample.top_p > 0 && cfg->sample.top_p <= 1) ||
	    cfg->sample.top_k < 0)
		die("generation: temperature %g must be >= 0, top-p %g in (0,1] and top-k %d >= 0",
		    cfg->sample.temperature, cfg->sample.top_p, cfg->sample.top_k);
	if (lora && lora->L != m->cfg.L)
		BUG("generation: lora of %d layers on a model of %d", lora->L, m->cfg.L);
	if (cfg->teacher_k < 0 || cfg->teacher_k > m->cfg.V)
		die("generation: teacher top-k %d is not in [0, %d]", cfg->teacher_k, m->cfg.V);
	if (cfg->teacher_k && !(cfg->teacher_temperature > 0))
		die("generation: teacher temperature %g is not positive",
		    (double)cfg->teacher_temperature);
	if (cfg->teacher_k && !gops->teacher_topk)
		die("generation: the %s decode ops cannot score the teacher", gops->name);
	bk_gen *g = xcalloc(1, sizeof(*g));
	g->m = m;
	g->ops = m->ops;
	g->gops = gops;
	g->lora = lora;
	g->cfg = *cfg;
	g->stop = xmalloc((size_t)(cfg->n_stop > 0 ? cfg->n_stop : 1) * sizeof(int32_t));
	if (cfg->n_stop > 0)
		memcpy(g->stop, cfg->stop, (size_t)cfg->n_stop * sizeof(int32_t));
	g->cfg.stop = g->stop;
	g->slots = xcalloc((size_t)cfg->max_batch, sizeof(*g->slots));
	g->sw = bk_sample_work_new(m->cfg.V);
	/* the fast decode step: the gen ops have it and it is on (CUDA: BK_DECODE=v2) */
	if (gops->fast && gops->fast()) {
		g->fast = 1;
		g->graphs = xcalloc((size_t)FG_DIM * FG_DIM, sizeof(*g->graphs));
	}

	/* the KV pool, never sized by the device's free memory: --kv-memory (allocated at
	 * once); else with max_prompt the stream's need, gpu/memplan.c bk_mem_kv_blocks
	 * (allocated at once: the plan); else grown on demand up to what max_batch samples of
	 * max_seq positions could hold */
	const bk_llama_config *c = &m->cfg;
	kvpool *p = &g->pool;
	p->bbytes = (size_t)c->L * BS * kvd(m) * (size_t)gops->kv_bytes;
	double lim = INT32_MAX;
	int at_once = 0;
	if (cfg->kv_memory > 0) {
		lim = (double)cfg->kv_memory / (2.0 * (double)p->bbytes);
		if (lim < 1)
			die("generation: --kv-memory %zu bytes is less than one KV block of %d tokens "
			    "(%zu bytes for K and V)", cfg->kv_memory, BS, 2 * p->bbytes);
		at_once = 1;
	} else if (cfg->max_prompt > 0) {
		lim = (double)bk_mem_kv_blocks(cfg->max_batch, cfg->max_prompt, cfg->max_new,
					       cfg->ntraj, cfg->prefix_len);
		at_once = 1;
	}
	if (cfg->max_seq > 0) { /* never more than max_batch samples + as many entries need */
		double ub = (2.0 * cfg->max_batch + 2) * (nblk(cfg->max_seq) + 1) + nblk(cfg->max_seq);
		lim = lim < ub ? lim : ub;
	}
	p->limit = lim > INT32_MAX ? INT32_MAX : (int)lim;
	g->st.kv_block = BS;
	g->st.kv_blocks_limit = p->limit;
	if (at_once)
		pool_grow(g, p->limit);
	return g;
}

static void entry_unprefill(bk_gen *g, entry *e)
{
	tab_release(g, &e->tab);
	free(e->first);
	free(e->t_ids);
	free(e->t_logp);
	e->first = NULL;
	e->t_ids = NULL;
	e->t_logp = NULL;
	e->prefilled = 0;
}

static void entry_free(bk_gen *g, entry *e)
{
	entry_unprefill(g, e);
	free(e->ids);
	free(e->keys);
	free(e->tags);
	free(e);
}

void bk_gen_free(bk_gen *g)
{
	if (!g)
		return;
	while (g->qhead) {
		entry *e = g->qhead;
		g->qhead = e->link;
		entry_free(g, e);
	}
	for (int i = 0; i < g->cfg.max_batch; i++) {
		slot *s = &g->slots[i];
		tab_release(g, &s->tab);
		free(s->out), free(s->t_ids), free(s->t_logp), free(s->t_rest);
	}
	for (size_t i = g->done_head; i < g->done.n; i++) {
		bk_gen_result *r = &g->done.v[i];
		free(r->ids), free(r->t_ids), free(r->t_logp), free(r->t_rest);
	}
	free(g->done.v);
	tab_release(g, &g->pfx);
	free(g->prefix_ids);
	ws_free(g);
	const bk_ops *ops = g->ops;
	void *dev[] = { g->d_table, g->d_drow, g->d_dctr, g->d_dids, g->d_dkey, g->swork,
			g->pool.k, g->pool.v, g->d_tids, g->d_tlogp, g->d_trest };
	for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
		ops->free(dev[i]);
	free(g->h_table);
	free(g->h_drow);
	free(g->h_dctr);
	free(g->h_dids);
	free(g->h_dkey);
	score_host_free(g);
	free(g->pool.ref);
	free(g->pool.freel);
	if (g->fast) {
		for (int i = 0; i < FG_DIM * FG_DIM; i++)
			if (g->graphs[i].exec)
				g->gops->graph_free(g->graphs[i].exec);
		free(g->graphs);
		g->gops->host_free(g->f_h);
		g->gops->host_free(g->f_ids_h);
		ops->free(g->f_d);
		ops->free(g->f_ids_d);
		ops->free(g->f_swork);
	}
	bk_sample_work_free(g->sw);
	free(g->slots);
	free(g->stop);
	free(g);
}

void bk_gen_set_prefix(bk_gen *g, const int32_t *ids, int P)
{
	if (g->pending)
		BUG("generation: the prefix changes while samples are queued or running");
	tab_release(g, &g->pfx);
	free(g->prefix_ids);
	g->prefix_ids = NULL;
	g->P = 0;
	g->st.prefix_len = 0;
	g->st.prefix_blocks = 0;
	if (P <= 0)
		return;
	const bk_llama_config *c = &g->m->cfg;
	for (int t = 0; t < P; t++)
		if (ids[t] < 0 || ids[t] >= c->V)
			die("generation: prefix token %d: id %d is not in [0,%d)", t, ids[t], c->V);
	if (pool_avail(g) < nblk(P))
		die("generation: the KV pool of %d blocks of %d tokens cannot hold a prefix of %d "
		    "tokens (raise --kv-memory)", g->pool.limit, BS, P);
	/* the prefix's K/V come from the same row-wise path as every prompt (gen.h) */
	tab_build(g, &g->pfx, P, NULL, 0, 0);
	item it = { .n_tok = P, .pos0 = 0, .ids = ids, .tab = &g->pfx };
	forward(g, &it, 1, 0);
	g->P = P;
	g->prefix_ids = xmalloc((size_t)P * sizeof(int32_t));
	memcpy(g->prefix_ids, ids, (size_t)P * sizeof(int32_t));
	g->st.prefix_len = P;
	g->st.prefix_blocks = g->pfx.n;
	g->st.prefix_builds++;
}

int bk_gen_common_prefix(const int32_t *const *prompts, const int *lens, int n)
{
	if (n <= 0)
		return 0;
	int p = lens[0] - 1;
	for (int i = 1; i < n; i++) {
		int q = 0, lim = lens[i] - 1 < p ? lens[i] - 1 : p;
		while (q < lim && prompts[i][q] == prompts[0][q])
			q++;
		p = q;
	}
	return p > 0 ? p : 0;
}

void bk_gen_submit(bk_gen *g, const int32_t *prompt, int n_prompt, int n,
		   const uint64_t *keys, const uint64_t *tags)
{
	const bk_llama_config *c = &g->m->cfg;
	if (n_prompt < 1)
		die("generation: an empty prompt (at least one token, e.g. BOS, is needed)");
	if (n < 1)
		return;
	for (int t = 0; t < n_prompt; t++)
		if (prompt[t] < 0 || prompt[t] >= c->V)
			die("generation: prompt token %d: id %d is not in [0,%d)", t, prompt[t], c->V);
	int max_new = g->cfg.max_new;
	if (g->cfg.max_seq > 0) {
		if (n_prompt >= g->cfg.max_seq)
			die("generation: a prompt of %d tokens leaves no room for new tokens under the "
			    "model's %d positions", n_prompt, g->cfg.max_seq);
		if (max_new > g->cfg.max_seq - n_prompt)
			max_new = g->cfg.max_seq - n_prompt;
	}
	entry *e = xcalloc(1, sizeof(*e));
	e->ids = xmalloc((size_t)n_prompt * sizeof(int32_t));
	memcpy(e->ids, prompt, (size_t)n_prompt * sizeof(int32_t));
	e->n = n_prompt;
	int P = g->P;
	e->use_prefix = P > 0 && n_prompt > P &&
			!memcmp(prompt, g->prefix_ids, (size_t)P * sizeof(int32_t));
	e->own0 = e->use_prefix ? P : 0;
	e->max_new = max_new;
	long need = (long)need_entry(e) + need_sample(e) + g->pfx.n;
	if (need > g->pool.limit)
		die("generation: a prompt of %d tokens with %d new tokens needs %ld KV blocks of %d "
		    "tokens but the pool holds %d (raise --kv-memory)", n_prompt, max_new, need, BS,
		    g->pool.limit);
	if (P > 0) {
		if (e->use_prefix)
			g->st.prefix_hits++;
		else
			g->st.prefix_misses++;
	}
	e->n_samples = n;
	e->keys = xmalloc((size_t)n * sizeof(uint64_t));
	e->tags = xmalloc((size_t)n * sizeof(uint64_t));
	for (int i = 0; i < n; i++) {
		e->keys[i] = keys ? keys[i] : 0;
		e->tags[i] = tags ? tags[i] : (uint64_t)i;
	}
	if (g->qtail)
		g->qtail->link = e;
	else
		g->qhead = e;
	g->qtail = e;
	g->pending += (uint64_t)n;
}

static void finish(bk_gen *g, slot *s, int stopped)
{
	bk_gen_result r = { .tag = s->tag, .ids = s->out, .n = s->n_out, .stopped = stopped,
			    .t_ids = s->t_ids, .t_logp = s->t_logp, .t_rest = s->t_rest };
	bk_vec_push(&g->done, r);
	s->out = NULL;
	s->t_ids = NULL;
	s->t_logp = NULL;
	s->t_rest = NULL;
	g->pending--;
}

/* appends token id to slot s; finishes the slot when it is done */
static void push(bk_gen *g, slot *s, int32_t id)
{
	s->out[s->n_out++] = id;
	g->st.new_tokens++;
	int stopped = bk_sample_is_stop(id, g->stop, g->cfg.n_stop);
	if (!stopped && s->n_out < s->max_new)
		return;
	finish(g, s, stopped);
	if (s->active) {
		s->active = 0;
		tab_release(g, &s->tab);
		g->n_active--;
	}
}

/* Starts the next waiting sample of the (prefilled) head entry in slot s, when the pool
 * has its blocks (a sample that ends on its first token needs none).  Returns 0 when it
 * must wait for blocks. */
static int start(bk_gen *g, slot *s)
{
	entry *e = g->qhead;
	BUG_ON(!e || !e->prefilled || e->next >= e->n_samples || s->active);
	int i = e->next;
	int32_t id = e->first[i];
	int ends = e->max_new == 1 || bk_sample_is_stop(id, g->stop, g->cfg.n_stop);
	if (!ends && pool_avail(g) < need_sample(e)) {
		g->st.kv_waits++;
		return 0;
	}
	e->next++;
	s->n = e->n;
	s->max_new = e->max_new;
	s->key = e->keys[i];
	s->tag = e->tags[i];
	s->n_out = 0;
	s->out = xmalloc((size_t)s->max_new * sizeof(int32_t));
	if (g->cfg.teacher_k) { /* its first row: the entry's prefill row */
		size_t K = (size_t)g->cfg.teacher_k, n = (size_t)s->max_new;
		s->t_ids = xmalloc(n * K * sizeof(int32_t));
		s->t_logp = xmalloc(n * K * sizeof(float));
		s->t_rest = xmalloc(n * sizeof(float));
		memcpy(s->t_ids, e->t_ids, K * sizeof(int32_t));
		memcpy(s->t_logp, e->t_logp, K * sizeof(float));
		s->t_rest[0] = e->t_rest;
	}
	if (!ends) {
		tab_build(g, &s->tab, (long)e->n + e->max_new, &e->tab, e->n / BS, e->n % BS != 0);
		s->active = 1;
		g->n_active++;
	}
	push(g, s, id);
	if (e->next == e->n_samples) { /* every sample started: the entry is done */
		g->qhead = e->link;
		if (!g->qhead)
			g->qtail = NULL;
		entry_free(g, e);
	}
	return 1;
}

/* fills free slots, in slot order, with waiting samples in queue order */
static void refill(bk_gen *g)
{
	for (int i = 0; i < g->cfg.max_batch; i++)
		while (!g->slots[i].active && g->qhead && g->qhead->prefilled)
			if (!start(g, &g->slots[i]))
				return;
}

/* Nothing runs: make sure the head entry can go (invariant 6). */
static void ensure_progress(bk_gen *g)
{
	entry *h = g->qhead;
	if (!h || !h->prefilled)
		return;
	while (pool_avail(g) < need_sample(h)) {
		entry *last = NULL;
		for (entry *e = h->link; e && e->prefilled; e = e->link)
			last = e;
		if (!last)
			BUG("generation: nothing runs, yet the head prompt finds no KV blocks");
		entry_unprefill(g, last);
		g->st.recomputes++;
	}
	refill(g);
}

int bk_gen_step(bk_gen *g)
{
	if (!g->pending)
		return 0;
	double t0 = now();
	if (!g->n_active)
		ensure_progress(g);
	int MB = g->cfg.max_batch;
	item *it = xmalloc(((size_t)MB + 1) * sizeof(*it));
	int *who = xmalloc(((size_t)MB + 1) * sizeof(int));
	entry **pre = NULL;
	size_t npre = 0, cappre = 0;
	int S = 0;
	/* 1. running samples feed their last token */
	for (int i = 0; i < MB; i++) {
		slot *s = &g->slots[i];
		if (!s->active)
			continue;
		it[S] = (item){ .n_tok = 1, .pos0 = s->n + s->n_out - 1,
				.ids = &s->out[s->n_out - 1], .tab = &s->tab };
		who[S++] = i;
	}
	if (S > g->st.max_active)
		g->st.max_active = S;
	int n_decode = S;
	/* 2. prompts to prefill so that max_batch samples are ready to start */
	long ready = 0, ndraw = n_decode;
	entry *e = g->qhead;
	for (; e && e->prefilled; e = e->link)
		ready += e->n_samples - e->next;
	for (; e && ready < MB; e = e->link) {
		if (pool_avail(g) < need_entry(e) + need_sample(e)) {
			g->st.kv_waits++;
			break;
		}
		if (npre == cappre) {
			cappre = cappre ? 2 * cappre : 8;
			pre = xrealloc(pre, cappre * sizeof(*pre));
			it = xrealloc(it, ((size_t)MB + 1 + cappre) * sizeof(*it));
		}
		pre[npre++] = e;
		int sh = e->own0 / BS;
		tab_build(g, &e->tab, e->n, &g->pfx, sh, e->own0 % BS != 0);
		it[S++] = (item){ .n_tok = e->n - e->own0, .pos0 = e->own0, .ids = e->ids + e->own0,
				  .tab = &e->tab };
		g->st.prompt_tokens += (uint64_t)(e->n - e->own0);
		ready += e->n_samples;
		ndraw += e->n_samples;
	}
	if (S > 0) {
		/* 3. draw the next token of every running sample, the first of every new one */
		drawreq *d = xmalloc((size_t)ndraw * sizeof(*d));
		int N = 0;
		for (int j = 0; j < n_decode; j++) {
			slot *s = &g->slots[who[j]];
			d[N++] = (drawreq){ .row = j, .key = s->key, .tag = s->tag, .counter = s->n_out };
		}
		for (size_t j = 0; j < npre; j++)
			for (int i = 0; i < pre[j]->n_samples; i++)
				d[N++] = (drawreq){ .row = n_decode + (int)j, .key = pre[j]->keys[i],
						    .tag = pre[j]->tags[i], .counter = 0 };
		int want_host = !g->gops->sample || g->cfg.on_logits;
		if (g->fast) {
			forward_fast(g, it, S, d, N, want_host);
		} else {
			forward(g, it, S, want_host);
			draw_all(g, d, N);
			if (g->cfg.teacher_k)
				score_rows(g, S, 0);
		}
		N = 0;
		for (int j = 0; j < n_decode; j++) {
			slot *s = &g->slots[who[j]];
			if (g->cfg.teacher_k) /* the row its next token was drawn from */
				score_put(g, s->t_ids, s->t_logp, s->t_rest, s->n_out, j);
			push(g, s, g->h_dids[N++]);
		}
		for (size_t j = 0; j < npre; j++) {
			pre[j]->first = xmalloc((size_t)pre[j]->n_samples * sizeof(int32_t));
			for (int i = 0; i < pre[j]->n_samples; i++)
				pre[j]->first[i] = g->h_dids[N++];
			if (g->cfg.teacher_k) { /* the prefill row, once for all its samples */
				size_t K = (size_t)g->cfg.teacher_k;
				pre[j]->t_ids = xmalloc(K * sizeof(int32_t));
				pre[j]->t_logp = xmalloc(K * sizeof(float));
				score_put(g, pre[j]->t_ids, pre[j]->t_logp, &pre[j]->t_rest, 0,
					  n_decode + (int)j);
			}
			pre[j]->prefilled = 1;
		}
		free(d);
	}
	/* 4. refill free slots */
	refill(g);
	if (n_decode > 0 && npre == 0) {
		g->st.decode_steps++;
		g->st.decode_seconds += now() - t0;
	}
	free(it);
	free(who);
	free(pre);
	return 1;
}

uint64_t bk_gen_pending(const bk_gen *g) { return g->pending; }

int bk_gen_take(bk_gen *g, bk_gen_result *out)
{
	if (g->done_head == g->done.n)
		return 0;
	*out = g->done.v[g->done_head++];
	if (g->done_head == g->done.n)
		g->done_head = g->done.n = 0;
	return 1;
}

const bk_gen_stats *bk_gen_get_stats(const bk_gen *g) { return &g->st; }

void bk_gen_run(const bk_model *m, const bk_gen_ops *gops, const bk_lora *lora,
		const bk_gen_config *cfg, const int32_t *prefix, int P,
		const int32_t *const *prompts, const int *lens, int n, const uint64_t *keys,
		int32_t **out_ids, int *out_n)
{
	if (!keys && cfg->sample.temperature != 0)
		BUG("bk_gen_run: sampling (temperature %g) needs keys", cfg->sample.temperature);
	if (cfg->teacher_k)
		BUG("bk_gen_run: teacher scoring is bk_gen_take's (the results' rows)");
	bk_gen *g = bk_gen_create(m, gops, lora, cfg);
	if (!prefix && P < 0) {
		P = bk_gen_common_prefix(prompts, lens, n);
		prefix = n > 0 ? prompts[0] : NULL;
	}
	if (prefix && P > 0)
		bk_gen_set_prefix(g, prefix, P);
	for (int i = 0; i < n; i++) {
		uint64_t tag = (uint64_t)i;
		bk_gen_submit(g, prompts[i], lens[i], 1, keys ? &keys[i] : NULL, &tag);
		out_ids[i] = NULL;
		out_n[i] = 0;
	}
	bk_gen_result r;
	while (bk_gen_step(g))
		while (bk_gen_take(g, &r)) {
			out_ids[r.tag] = r.ids;
			out_n[r.tag] = r.n;
		}
	while (bk_gen_take(g, &r)) {
		out_ids[r.tag] = r.ids;
		out_n[r.tag] = r.n;
	}
	bk_gen_free(g);
}

/* here, not in gpu/host/host_decode.c: the host twin's objects reference no CUDA symbol,
 * so a program that links them (the CPU emulation tests) pulls no CUDA object in */
const bk_gen_ops *bk_gen_ops_for(const bk_ops *ops)
{
	if (ops == &bk_ops_host)
		return &bk_gen_ops_host;
#ifdef BK_HAVE_CUDA
	if (!strcmp(ops->name, "cuda"))
		return &bk_gen_ops_cuda;
#endif
	die("generation: no decode ops for device '%s' in this build (use --device cpu)",
	    ops->name);
}
