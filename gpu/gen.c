/* gen.c - the generation engine of gen.h: prompt queue, slots with their own KV caches,
 * one packed forward per step (new prompts' tokens and one token of every running
 * sample together), sampling on the host.  Not the stream tool (cmd/bk-gen.c).
 *
 * Design note.  A queued prompt (an "entry") carries n samples.  Its own tokens (those
 * after the shared prefix, or all of them when it does not start with the prefix) are
 * prefilled once into the entry's cache, and the logits of its last position are kept;
 * each sample that gets a slot copies that cache into its own and draws its first token
 * from those logits.  A step:
 *   1. picks queued entries to prefill until the prefilled-but-not-started samples
 *      number max_batch (or the queue is empty);
 *   2. runs one forward over [one token of every running sample] + [those prompts];
 *   3. draws the next token of every running sample; a sample that drew a stop id or
 *      reached its max_new is finished and its slot freed;
 *   4. fills every free slot (those just freed too) with the next waiting sample.
 *
 * Invariants:
 *  1. A running sample's cache holds rows 0..n_own+n_out-2 after a step: its prompt's
 *     own rows, then every drawn token but the last, which is the token fed next step.
 *     Token positions are own0 + row (own0 = P with the prefix, else 0).
 *  2. Entries leave the queue in order; the prefilled ones are a prefix of the queue.
 *  3. Sample i of an entry draws its token j with u = bk_crng_uniform(key_i, j): a pure
 *     function of the key, so nothing depends on slots, steps or batch size; and every
 *     op is row-wise (gen.h), so the logits do not either.
 *  4. The prefix is only set while nothing is queued or running. */
#include "gpu/gen.h"

#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"

typedef struct {
	float *k, *v; /* [L][cap][NKV,D] device */
	int cap;
} kvbuf;

typedef struct entry {
	int32_t *ids; /* [n] whole prompt, host */
	int n, own0, use_prefix, max_new;
	int n_samples, next; /* samples; the next one to start */
	uint64_t *keys, *tags;
	kvbuf kv;       /* own prompt rows [n - own0] */
	float *logits;  /* [V] host, at the last prompt position once prefilled */
	int prefilled;
	struct entry *link;
} entry;

typedef struct {
	int active;
	int own0, n_own, use_prefix, max_new;
	uint64_t key, tag;
	kvbuf kv;     /* cap n_own + max_new */
	int32_t *out; /* [max_new] */
	int n_out;
} slot;

typedef struct {
	int n_tok, pos0, row0, use_prefix;
	const int32_t *ids;
	kvbuf *kv;
} item;

struct bk_gen {
	const bk_model *m;
	const bk_ops *ops;
	const bk_gen_ops *gops;
	const bk_lora *lora;
	bk_gen_config cfg;
	int32_t *stop;
	bk_prefix *prefix;
	int32_t *prefix_ids; /* [P] host */
	entry *qhead, *qtail;
	slot *slots;
	int n_active;
	uint64_t pending;
	BK_VEC(bk_gen_result) done;
	size_t done_head;
	bk_sample_work *sw;
	bk_gen_stats st;
	/* step workspace, for capT tokens and capS sequences */
	int capT, capS;
	float *x, *ln, *q, *k, *v, *att, *tmp, *gate, *up, *hm, *rstd, *xa; /* device */
	float *hl, *hn, *logits;                                           /* device [S,*] */
	int32_t *d_ids, *d_pos, *d_seq, *d_row, *d_use;                    /* device */
	int32_t *h_ids, *h_pos, *h_seq, *h_row, *h_use, *h_last;          /* host */
	float **kptr, **vptr;                                              /* host [S] */
	float *h_logits;                                                   /* host [S,V] */
};

static size_t kvd(const bk_model *m) { return (size_t)m->cfg.NKV * m->cfg.D; }

static void kv_alloc(const bk_gen *g, kvbuf *kv, int cap)
{
	size_t n = (size_t)g->m->cfg.L * (cap > 0 ? cap : 1) * kvd(g->m) * sizeof(float);
	kv->cap = cap;
	kv->k = g->ops->alloc(n);
	kv->v = g->ops->alloc(n);
}

static void kv_free(const bk_gen *g, kvbuf *kv)
{
	g->ops->free(kv->k);
	g->ops->free(kv->v);
	kv->k = kv->v = NULL;
	kv->cap = 0;
}

/* ---- workspace ---- */

static void ws_free(bk_gen *g)
{
	const bk_ops *ops = g->ops;
	void *dev[] = { g->x, g->ln, g->q, g->k, g->v, g->att, g->tmp, g->gate, g->up, g->hm,
			g->rstd, g->xa, g->hl, g->hn, g->logits, g->d_ids, g->d_pos, g->d_seq,
			g->d_row, g->d_use };
	for (size_t i = 0; i < sizeof(dev) / sizeof(dev[0]); i++)
		ops->free(dev[i]);
	void *host[] = { g->h_ids, g->h_pos, g->h_seq, g->h_row, g->h_use, g->h_last, g->kptr,
			 g->vptr, g->h_logits };
	for (size_t i = 0; i < sizeof(host) / sizeof(host[0]); i++)
		free(host[i]);
}

static void ws_ensure(bk_gen *g, int T, int S)
{
	if (T <= g->capT && S <= g->capS)
		return;
	ws_free(g);
	T = T > g->capT ? (T > 2 * g->capT ? T : 2 * g->capT) : g->capT;
	S = S > g->capS ? (S > 2 * g->capS ? S : 2 * g->capS) : g->capS;
	g->capT = T;
	g->capS = S;
	const bk_ops *ops = g->ops;
	const bk_llama_config *c = &g->m->cfg;
	size_t H = c->H, I = c->I, QD = (size_t)c->NH * c->D, KVD = kvd(g->m), V = c->V;
	size_t R = g->lora ? (size_t)g->lora->r : 1, f = sizeof(float), i4 = sizeof(int32_t);
	g->x = ops->alloc(T * H * f);
	g->ln = ops->alloc(T * H * f);
	g->tmp = ops->alloc(T * H * f);
	g->q = ops->alloc(T * QD * f);
	g->att = ops->alloc(T * QD * f);
	g->k = ops->alloc(T * KVD * f);
	g->v = ops->alloc(T * KVD * f);
	g->gate = ops->alloc(T * I * f);
	g->up = ops->alloc(T * I * f);
	g->hm = ops->alloc(T * I * f);
	g->rstd = ops->alloc(T * f);
	g->xa = ops->alloc(T * R * f);
	g->hl = ops->alloc(S * H * f);
	g->hn = ops->alloc(S * H * f);
	g->logits = ops->alloc(S * V * f);
	g->d_ids = ops->alloc(T * i4);
	g->d_pos = ops->alloc(T * i4);
	g->d_seq = ops->alloc(T * i4);
	g->d_row = ops->alloc(T * i4);
	g->d_use = ops->alloc(S * i4);
	g->h_ids = xmalloc(T * i4);
	g->h_pos = xmalloc(T * i4);
	g->h_seq = xmalloc(T * i4);
	g->h_row = xmalloc(T * i4);
	g->h_use = xmalloc(S * i4);
	g->h_last = xmalloc(S * i4);
	g->kptr = xmalloc(S * sizeof(float *));
	g->vptr = xmalloc(S * sizeof(float *));
	g->h_logits = xmalloc(S * V * f);
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

static void rmsnorm_rows(bk_gen *g, float *out, const float *x, const bk_weight *w, int T)
{
	const bk_llama_config *c = &g->m->cfg;
	for (int t0 = 0, ch = row_chunk(g, T); t0 < T; t0 += ch) {
		int n = T - t0 < ch ? T - t0 : ch;
		g->ops->rmsnorm_forward(out + (size_t)t0 * c->H, g->rstd + t0, x + (size_t)t0 * c->H,
					w, n, c->H, c->rms_eps);
	}
}

static void rope_rows(bk_gen *g, float *x, int T, int nh)
{
	const bk_llama_config *c = &g->m->cfg;
	for (int t0 = 0, ch = row_chunk(g, T); t0 < T; t0 += ch) {
		int n = T - t0 < ch ? T - t0 : ch;
		g->ops->rope_forward(x + (size_t)t0 * nh * c->D, g->d_pos + t0, g->m->inv_freq, n,
				     nh, c->D);
	}
}

/* Runs items[0..S) through the model, storing every token's K/V in its item's cache;
 * leaves the logits of each item's last token in g->h_logits [S,V]. */
static void forward(bk_gen *g, const item *it, int S)
{
	const bk_ops *ops = g->ops;
	const bk_model *m = g->m;
	const bk_llama_config *c = &m->cfg;
	int T = 0;
	for (int s = 0; s < S; s++)
		T += it[s].n_tok;
	BUG_ON(T <= 0);
	ws_ensure(g, T, S);
	size_t H = c->H, I = c->I, KVD = kvd(m), i4 = sizeof(int32_t);
	int t = 0;
	for (int s = 0; s < S; s++) {
		for (int i = 0; i < it[s].n_tok; i++, t++) {
			g->h_ids[t] = it[s].ids[i];
			g->h_pos[t] = it[s].pos0 + i;
			g->h_seq[t] = s;
			g->h_row[t] = it[s].row0 + i;
			BUG_ON(g->h_row[t] >= it[s].kv->cap);
		}
		g->h_last[s] = t - 1;
		g->h_use[s] = it[s].use_prefix;
	}
	ops->upload(g->d_ids, g->h_ids, T * i4);
	ops->upload(g->d_pos, g->h_pos, T * i4);
	ops->upload(g->d_seq, g->h_seq, T * i4);
	ops->upload(g->d_row, g->h_row, T * i4);
	ops->upload(g->d_use, g->h_use, S * i4);

	ops->embedding_forward(g->x, g->d_ids, m->embed, T);
	for (int l = 0; l < c->L; l++) {
		const bk_layer *w = &m->layers[l];
		for (int s = 0; s < S; s++) {
			size_t off = (size_t)l * it[s].kv->cap * KVD;
			g->kptr[s] = it[s].kv->k + off;
			g->vptr[s] = it[s].kv->v + off;
		}
		/* attention block */
		rmsnorm_rows(g, g->ln, g->x, w->attn_norm, T);
		lin(g, l, BK_LORA_Q, g->q, g->ln, T);
		lin(g, l, BK_LORA_K, g->k, g->ln, T);
		lin(g, l, BK_LORA_V, g->v, g->ln, T);
		rope_rows(g, g->q, T, c->NH);
		rope_rows(g, g->k, T, c->NKV);
		g->gops->kv_store(g->kptr, g->vptr, g->k, g->v, g->d_seq, g->d_row, T, c->NKV, c->D);
		g->gops->attend(g->att, g->q, g->d_seq, g->d_row, T, c->NH, c->NKV, c->D,
				(const float *const *)g->kptr, (const float *const *)g->vptr, g->d_use,
				g->prefix ? g->prefix->k[l] : NULL, g->prefix ? g->prefix->v[l] : NULL,
				g->prefix ? g->prefix->P : 0);
		lin(g, l, BK_LORA_O, g->tmp, g->att, T);
		ops->residual_forward(g->x, g->x, g->tmp, (size_t)T * H);
		/* MLP block */
		rmsnorm_rows(g, g->ln, g->x, w->mlp_norm, T);
		lin(g, l, BK_LORA_GATE, g->gate, g->ln, T);
		lin(g, l, BK_LORA_UP, g->up, g->ln, T);
		ops->swiglu_forward(g->hm, g->gate, g->up, (size_t)T * I);
		lin(g, l, BK_LORA_DOWN, g->tmp, g->hm, T);
		ops->residual_forward(g->x, g->x, g->tmp, (size_t)T * H);
	}
	for (int s = 0; s < S; s++)
		ops->copy(g->hl + (size_t)s * H, g->x + (size_t)g->h_last[s] * H, H * sizeof(float));
	rmsnorm_rows(g, g->hn, g->hl, m->final_norm, S);
	g->gops->linear(g->logits, g->hn, m->lm_head, S);
	ops->download(g->h_logits, g->logits, (size_t)S * c->V * sizeof(float));
	g->st.steps++;
}

/* ---- engine ---- */

bk_gen *bk_gen_create(const bk_model *m, const bk_gen_ops *gops, const bk_lora *lora,
		      const bk_gen_config *cfg)
{
	if (cfg->max_batch < 1)
		die("generation: max batch %d is not positive", cfg->max_batch);
	if (cfg->max_new < 1)
		die("generation: max new tokens %d is not positive", cfg->max_new);
	if (!(cfg->sample.temperature >= 0) || !(cfg->sample.top_p > 0 && cfg->sample.top_p <= 1))
		die("generation: temperature %g must be >= 0 and top-p %g in (0,1]",
		    cfg->sample.temperature, cfg->sample.top_p);
	if (lora && lora->L != m->cfg.L)
		BUG("generation: lora of %d layers on a model of %d", lora->L, m->cfg.L);
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
	return g;
}

static void entry_free(bk_gen *g, entry *e)
{
	kv_free(g, &e->kv);
	free(e->ids);
	free(e->keys);
	free(e->tags);
	free(e->logits);
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
		kv_free(g, &g->slots[i].kv);
		free(g->slots[i].out);
	}
	for (size_t i = g->done_head; i < g->done.n; i++)
		free(g->done.v[i].ids);
	free(g->done.v);
	bk_prefix_free(g->m, g->prefix);
	free(g->prefix_ids);
	ws_free(g);
	bk_sample_work_free(g->sw);
	free(g->slots);
	free(g->stop);
	free(g);
}

void bk_gen_set_prefix(bk_gen *g, const int32_t *ids, int P)
{
	if (g->pending)
		BUG("generation: the prefix changes while samples are queued or running");
	bk_prefix_free(g->m, g->prefix);
	free(g->prefix_ids);
	g->prefix = NULL;
	g->prefix_ids = NULL;
	g->st.prefix_len = 0;
	if (P <= 0)
		return;
	const bk_llama_config *c = &g->m->cfg;
	for (int t = 0; t < P; t++)
		if (ids[t] < 0 || ids[t] >= c->V)
			die("generation: prefix token %d: id %d is not in [0,%d)", t, ids[t], c->V);
	/* the prefix's K/V come from the same row-wise path as every prompt (gen.h) */
	kvbuf kv;
	kv_alloc(g, &kv, P);
	item it = { .n_tok = P, .pos0 = 0, .row0 = 0, .use_prefix = 0, .ids = ids, .kv = &kv };
	forward(g, &it, 1);
	bk_prefix *p = xcalloc(1, sizeof(*p));
	size_t KVD = kvd(g->m), bytes = (size_t)P * KVD * sizeof(float);
	p->P = P;
	p->L = c->L;
	p->k = xcalloc((size_t)c->L, sizeof(*p->k));
	p->v = xcalloc((size_t)c->L, sizeof(*p->v));
	for (int l = 0; l < c->L; l++) {
		p->k[l] = g->ops->alloc(bytes);
		p->v[l] = g->ops->alloc(bytes);
		g->ops->copy(p->k[l], kv.k + (size_t)l * P * KVD, bytes);
		g->ops->copy(p->v[l], kv.v + (size_t)l * P * KVD, bytes);
	}
	kv_free(g, &kv);
	g->prefix = p;
	g->prefix_ids = xmalloc((size_t)P * sizeof(int32_t));
	memcpy(g->prefix_ids, ids, (size_t)P * sizeof(int32_t));
	g->st.prefix_len = P;
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
	int P = g->prefix ? g->prefix->P : 0;
	e->use_prefix = P > 0 && n_prompt > P &&
			!memcmp(prompt, g->prefix_ids, (size_t)P * sizeof(int32_t));
	e->own0 = e->use_prefix ? P : 0;
	if (P > 0) {
		if (e->use_prefix)
			g->st.prefix_hits++;
		else
			g->st.prefix_misses++;
	}
	e->max_new = max_new;
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

/* draws token n_out of slot s from logits [V]; finishes the slot when it is done */
static void draw(bk_gen *g, slot *s, const float *logits)
{
	int V = g->m->cfg.V;
	if (g->cfg.on_logits)
		g->cfg.on_logits(g->cfg.ctx, s->tag, s->n_out, logits, V);
	double u = g->cfg.sample.temperature > 0 ? bk_crng_uniform(s->key, (uint64_t)s->n_out) : 0;
	int32_t id = bk_sample_token(logits, V, &g->cfg.sample, u, g->sw);
	s->out[s->n_out++] = id;
	g->st.new_tokens++;
	int stopped = bk_sample_is_stop(id, g->stop, g->cfg.n_stop);
	if (!stopped && s->n_out < s->max_new)
		return;
	bk_gen_result r = { .tag = s->tag, .ids = s->out, .n = s->n_out, .stopped = stopped };
	bk_vec_push(&g->done, r);
	s->out = NULL;
	s->active = 0;
	kv_free(g, &s->kv);
	g->n_active--;
	g->pending--;
}

/* starts the next waiting sample of the (prefilled) head entry in slot s */
static void start(bk_gen *g, slot *s)
{
	entry *e = g->qhead;
	BUG_ON(!e || !e->prefilled || e->next >= e->n_samples);
	int i = e->next++;
	s->active = 1;
	s->own0 = e->own0;
	s->n_own = e->n - e->own0;
	s->use_prefix = e->use_prefix;
	s->max_new = e->max_new;
	s->key = e->keys[i];
	s->tag = e->tags[i];
	s->n_out = 0;
	s->out = xmalloc((size_t)s->max_new * sizeof(int32_t));
	kv_alloc(g, &s->kv, s->n_own + s->max_new);
	size_t KVD = kvd(g->m), bytes = (size_t)s->n_own * KVD * sizeof(float);
	for (int l = 0; l < g->m->cfg.L; l++) {
		g->ops->copy(s->kv.k + (size_t)l * s->kv.cap * KVD, e->kv.k + (size_t)l * e->kv.cap * KVD,
			     bytes);
		g->ops->copy(s->kv.v + (size_t)l * s->kv.cap * KVD, e->kv.v + (size_t)l * e->kv.cap * KVD,
			     bytes);
	}
	g->n_active++;
	draw(g, s, e->logits);
	if (e->next == e->n_samples) { /* every sample started: the entry is done */
		g->qhead = e->link;
		if (!g->qhead)
			g->qtail = NULL;
		entry_free(g, e);
	}
}

int bk_gen_step(bk_gen *g)
{
	if (!g->pending)
		return 0;
	int MB = g->cfg.max_batch, V = g->m->cfg.V;
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
		int row = s->n_own + s->n_out - 1;
		it[S] = (item){ .n_tok = 1, .pos0 = s->own0 + row, .row0 = row,
				.use_prefix = s->use_prefix, .ids = &s->out[s->n_out - 1], .kv = &s->kv };
		who[S++] = i;
	}
	if (S > g->st.max_active)
		g->st.max_active = S;
	int n_decode = S;
	/* 2. prompts to prefill so that max_batch samples are ready to start */
	long ready = 0;
	entry *e = g->qhead;
	for (; e && e->prefilled; e = e->link)
		ready += e->n_samples - e->next;
	for (; e && ready < MB; e = e->link) {
		if (npre == cappre) {
			cappre = cappre ? 2 * cappre : 8;
			pre = xrealloc(pre, cappre * sizeof(*pre));
			it = xrealloc(it, ((size_t)MB + cappre) * sizeof(*it));
		}
		pre[npre++] = e;
		kv_alloc(g, &e->kv, e->n - e->own0);
		it[S++] = (item){ .n_tok = e->n - e->own0, .pos0 = e->own0, .row0 = 0,
				  .use_prefix = e->use_prefix, .ids = e->ids + e->own0, .kv = &e->kv };
		g->st.prompt_tokens += (uint64_t)(e->n - e->own0);
		ready += e->n_samples;
	}
	if (S > 0)
		forward(g, it, S);
	/* 3. draw the next token of every running sample */
	for (int j = 0; j < n_decode; j++)
		draw(g, &g->slots[who[j]], g->h_logits + (size_t)j * V);
	for (size_t j = 0; j < npre; j++) {
		pre[j]->logits = xmalloc((size_t)V * sizeof(float));
		memcpy(pre[j]->logits, g->h_logits + (size_t)(n_decode + j) * V, (size_t)V * sizeof(float));
		pre[j]->prefilled = 1;
	}
	/* 4. refill free slots, in slot order, with waiting samples in queue order */
	for (int i = 0; i < MB; i++) {
		while (!g->slots[i].active && g->qhead && g->qhead->prefilled)
			start(g, &g->slots[i]);
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
