/* teach.c - see teach.h.  Packs sequences into forwards, runs the base model,
 * gathers the response rows' hidden states on the device and hands them to the
 * chunked LM-head ops (ops.h teacher_topk / teacher_logprobs, the semantics of
 * gpu/host/loss.h); only the teacher fields come back to the host.  No stream code here. */
#include "gpu/teach.h"

#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "formats/safetensors.h"
#include "gpu/host/host_rows.h"

struct bk_teach {
	const bk_model *m;   /* the caller's model, or rows_model on the host twin */
	bk_model rows_model; /* the caller's with batch-invariant host ops (host_rows.h) */
	const float *lm_head; /* [V,H] host, the caller's; the ops use m->lm_head */
	int max_tokens, k, vocab_chunk;
	float temperature;
	bk_acts *acts;   /* for acts_T tokens */
	int acts_T;
	float *hidden;   /* [acts_T,H] device */
	bk_prefix *prefix;
	int32_t *prefix_ids; /* [P] */
	int P, prefix_set;
	/* host scratch of one forward, grown as needed */
	BK_VEC(int32_t) ids, pos, cu;
	BK_VEC(int32_t) rowidx; /* [N] response rows of the packed forward */
	BK_VEC(int) order;   /* sequence indices of the current class */
	/* device scratch of one forward, for cap_rows rows */
	int32_t *rowidx_d;   /* [N] */
	float *rows_d;       /* [N,H] gathered hidden rows */
	int32_t *ids_d;      /* [N,K] */
	float *logp_d;       /* [N,K] or [N,V] */
	float *rest_d;       /* [N] */
	size_t cap_rows;
	bk_teach_stats stats;
};

bk_teach *bk_teach_create(const bk_model *m, const float *lm_head, int max_tokens, int k,
			  float temperature, int vocab_chunk)
{
	if (max_tokens < 1)
		die("teach: token budget %d is not positive", max_tokens);
	if (k < 0 || k > m->cfg.V)
		die("teach: top-k %d is not in [0, %d] (0 = full distribution)", k, m->cfg.V);
	if (!(temperature > 0))
		die("teach: temperature %g is not positive", (double)temperature);
	if (vocab_chunk < 1)
		die("teach: vocabulary chunk %d is not positive", vocab_chunk);
	bk_teach *t = xcalloc(1, sizeof(*t));
	t->m = m;
	if (m->ops == &bk_ops_host) { /* invariant 1 exactly: same weights, row-wise linears */
		t->rows_model = *m;
		t->rows_model.ops = bk_ops_host_rows();
		t->m = &t->rows_model;
	}
	t->lm_head = lm_head;
	t->max_tokens = max_tokens;
	t->k = k;
	t->temperature = temperature;
	t->vocab_chunk = vocab_chunk;
	return t;
}

void bk_teach_free(bk_teach *t)
{
	if (!t)
		return;
	bk_prefix_free(t->m, t->prefix);
	if (t->acts)
		bk_acts_free(t->m, t->acts);
	const bk_ops *ops = t->m->ops;
	ops->free(t->hidden);
	ops->free(t->rowidx_d), ops->free(t->rows_d), ops->free(t->ids_d);
	ops->free(t->logp_d), ops->free(t->rest_d);
	free(t->prefix_ids);
	free(t->ids.v), free(t->pos.v), free(t->cu.v), free(t->rowidx.v), free(t->order.v);
	free(t);
}

/* activations for at least T tokens (invariant 4): a forward's (bk_acts_create_fwd: one
 * layer's activations, no backward workspace), grown to exactly the largest forward
 * seen (a small stream never pays for a large budget, and gpu/memplan.c's plan of
 * bk-teach is the largest forward); a prefix lives outside the acts */
static void ensure_acts(bk_teach *t, int T)
{
	if (t->acts && t->acts_T >= T)
		return;
	if (t->acts)
		bk_acts_free(t->m, t->acts);
	t->m->ops->free(t->hidden);
	t->acts_T = T;
	t->acts = bk_acts_create_fwd(t->m, T, 0);
	t->stats.acts_bytes = bk_acts_bytes(t->acts);
	t->stats.acts_T = T;
	t->hidden = bk_alloc(t->m->ops, (size_t)T * t->m->cfg.H * sizeof(float), "hidden");
}

/* device scratch for N response rows: the largest batch so far, no headroom (a larger one
 * frees and reallocates, as ensure_acts) */
static void ensure_rows(bk_teach *t, int N)
{
	if ((size_t)N <= t->cap_rows)
		return;
	const bk_ops *ops = t->m->ops;
	size_t cap = (size_t)N, H = (size_t)t->m->cfg.H;
	size_t per = t->k ? (size_t)t->k : (size_t)t->m->cfg.V;
	ops->free(t->rowidx_d), ops->free(t->rows_d), ops->free(t->ids_d);
	ops->free(t->logp_d), ops->free(t->rest_d);
	t->rowidx_d = bk_alloc(ops, cap * sizeof(int32_t), "teacher rows");
	t->rows_d = bk_alloc(ops, cap * H * sizeof(float), "teacher rows");
	t->logp_d = bk_alloc(ops, cap * per * sizeof(float), "teacher rows");
	t->ids_d = t->k ? bk_alloc(ops, cap * per * sizeof(int32_t), "teacher rows") : NULL;
	t->rest_d = t->k ? bk_alloc(ops, cap * sizeof(float), "teacher rows") : NULL;
	t->cap_rows = cap;
}

int bk_teach_prefix_from(bk_teach *t, const bk_teach_seq *seqs, int S)
{
	if (t->prefix_set)
		BUG("teach: the prefix is set once");
	t->prefix_set = 1;
	int P = -1;
	const int32_t *first = NULL;
	for (int s = 0; s < S; s++) {
		if (seqs[s].n < 1)
			continue;
		if (!first) {
			first = seqs[s].prompt;
			P = seqs[s].a - 1;
			continue;
		}
		int cap = seqs[s].a - 1 < P ? seqs[s].a - 1 : P, i = 0;
		while (i < cap && seqs[s].prompt[i] == first[i])
			i++;
		P = i;
	}
	if (P <= 0)
		return t->P = 0;
	ensure_acts(t, P);
	t->prefix_ids = xmalloc((size_t)P * sizeof(int32_t));
	memcpy(t->prefix_ids, first, (size_t)P * sizeof(int32_t));
	t->prefix = bk_model_prefix_build(t->m, t->acts, t->prefix_ids, P);
	return t->P = P;
}

int bk_teach_prefix_len(const bk_teach *t) { return t->P; }
const bk_teach_stats *bk_teach_stats_get(const bk_teach *t) { return &t->stats; }

static int uses_prefix(const bk_teach *t, const bk_teach_seq *q)
{
	return t->P > 0 && q->a > t->P &&
	       !memcmp(q->prompt, t->prefix_ids, (size_t)t->P * sizeof(int32_t));
}

/* tokens a sequence puts into a forward: prompt + resp[0..n-2], less the prefix */
static int own_len(const bk_teach *t, const bk_teach_seq *q, int pre)
{
	return q->a + q->n - 1 - (pre ? t->P : 0);
}

static void out_alloc(bk_teach *t, bk_teacher *o, int n)
{
	int V = t->m->cfg.V;
	size_t per = t->k ? (size_t)t->k : (size_t)V;
	o->k = t->k;
	o->temperature = t->temperature;
	o->n = n;
	o->v = V;
	size_t nl = (size_t)n * per * sizeof(float);
	if (nl > o->cap_logp || !o->logp) {
		o->logp = xrealloc(o->logp, nl ? nl : 1);
		o->cap_logp = nl;
	}
	if (!t->k)
		return;
	size_t ni = (size_t)n * per * sizeof(int32_t), nr = (size_t)n * sizeof(float);
	if (ni > o->cap_ids || !o->ids) {
		o->ids = xrealloc(o->ids, ni ? ni : 1);
		o->cap_ids = ni;
	}
	if (nr > o->cap_rest || !o->rest) {
		o->rest = xrealloc(o->rest, nr ? nr : 1);
		o->cap_rest = nr;
	}
}

/* One forward over seqs[idx[0..cnt)] (all of one class: pre = against the prefix). */
static void run_forward(bk_teach *t, const bk_teach_seq *seqs, const int *idx, int cnt, int pre,
			bk_teacher *out)
{
	const bk_model *m = t->m;
	int H = m->cfg.H, V = m->cfg.V, base = pre ? t->P : 0;
	int T = 0, N = 0;
	for (int i = 0; i < cnt; i++) {
		T += own_len(t, &seqs[idx[i]], pre);
		N += seqs[idx[i]].n;
	}
	ensure_acts(t, T);
	t->ids.n = t->pos.n = t->cu.n = 0;
	bk_vec_reserve(&t->ids, (size_t)T);
	bk_vec_reserve(&t->pos, (size_t)T);
	bk_vec_reserve(&t->cu, (size_t)cnt + 1);
	t->cu.v[0] = 0;
	for (int i = 0; i < cnt; i++) {
		const bk_teach_seq *q = &seqs[idx[i]];
		int len = own_len(t, q, pre);
		for (int j = 0; j < len; j++) {
			int p = base + j; /* position in the full sequence prompt + resp */
			t->ids.v[t->ids.n++] = p < q->a ? q->prompt[p] : q->resp[p - q->a];
			t->pos.v[t->pos.n++] = p;
		}
		t->cu.v[i + 1] = t->cu.v[i] + len;
	}
	bk_batch b = {.T = T, .S = cnt, .ids = t->ids.v, .pos = t->pos.v, .cu_seqlens = t->cu.v};
	bk_model_forward(m, NULL, &b, pre ? t->prefix : NULL, t->acts, t->hidden);
	t->stats.forwards++;
	t->stats.tokens += (uint64_t)T;
	t->stats.rows += (uint64_t)N;
	if (pre)
		t->stats.with_prefix += (uint64_t)cnt;
	else
		t->stats.full += (uint64_t)cnt;

	/* gather the last n rows of each sequence: [N,H] on the device */
	const bk_ops *ops = m->ops;
	ensure_rows(t, N);
	t->rowidx.n = 0;
	bk_vec_reserve(&t->rowidx, (size_t)N);
	for (int i = 0; i < cnt; i++) {
		int n = seqs[idx[i]].n, end = t->cu.v[i + 1];
		for (int j = end - n; j < end; j++)
			t->rowidx.v[t->rowidx.n++] = j;
	}
	ops->upload(t->rowidx_d, t->rowidx.v, (size_t)N * sizeof(int32_t));
	ops->gather_rows(t->rows_d, t->hidden, t->rowidx_d, N, T, H);
	size_t per = t->k ? (size_t)t->k : (size_t)V;
	if (t->k)
		ops->teacher_topk(t->rows_d, m->lm_head, N, t->vocab_chunk, t->temperature,
				  m->cfg.final_softcap, t->k, t->ids_d, t->logp_d, t->rest_d);
	else
		ops->teacher_logprobs(t->rows_d, m->lm_head, N, t->vocab_chunk, t->temperature,
				      m->cfg.final_softcap, t->logp_d);
	size_t r = 0;
	for (int i = 0; i < cnt; i++) {
		bk_teacher *o = &out[idx[i]];
		int n = seqs[idx[i]].n;
		out_alloc(t, o, n);
		ops->download(o->logp, t->logp_d + r * per, (size_t)n * per * sizeof(float));
		if (t->k) {
			ops->download(o->ids, t->ids_d + r * per, (size_t)n * per * sizeof(int32_t));
			ops->download(o->rest, t->rest_d + r, (size_t)n * sizeof(float));
		}
		r += (size_t)n;
	}
}

void bk_teach_run(bk_teach *t, const bk_teach_seq *seqs, int S, bk_teacher *out)
{
	for (int s = 0; s < S; s++) {
		if (seqs[s].a < 1 || seqs[s].n < 0)
			BUG("teach: sequence %d has prompt length %d, response length %d", s,
			    seqs[s].a, seqs[s].n);
		if (!seqs[s].n)
			out_alloc(t, &out[s], 0);
	}
	/* two classes (invariant 2), each packed in order under the budget */
	for (int pre = 1; pre >= 0; pre--) {
		t->order.n = 0;
		int T = 0;
		for (int s = 0; s < S; s++) {
			if (!seqs[s].n || uses_prefix(t, &seqs[s]) != pre)
				continue;
			int len = own_len(t, &seqs[s], pre);
			if (t->order.n && T + len > t->max_tokens) {
				run_forward(t, seqs, t->order.v, (int)t->order.n, pre, out);
				t->order.n = 0;
				T = 0;
			}
			bk_vec_push(&t->order, s);
			T += len;
		}
		if (t->order.n)
			run_forward(t, seqs, t->order.v, (int)t->order.n, pre, out);
	}
}

const float *bk_teach_lm_head(const bk_model *m, const char *dir, float **owned)
{
	*owned = NULL;
	if (m->ops == &bk_ops_host)
		return m->lm_head->data; /* the host twin keeps weights in fp32 [rows,cols] */
	bk_st *st = bk_st_open(dir);
	const char *name = m->cfg.tied ? "model.embed_tokens.weight" : "lm_head.weight";
	int64_t shape[2] = {m->cfg.V, m->cfg.H};
	*owned = xmalloc((size_t)m->cfg.V * m->cfg.H * sizeof(float));
	bk_st_read_f32(st, name, 2, shape, *owned);
	bk_st_close(st);
	return *owned;
}
