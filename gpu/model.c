/* model.c - Llama transformer over a packed batch: forward, LoRA backward, logits and
 * the shared-prefix K/V, written only in terms of the ops table (gpu/ops.h).
 * Not the loss, not the optimizer, not a checkpoint loader.
 *
 * Design note.
 *
 * One layer l (x = resid[l], all [T,*] buffers row-major, dims as in ops.h):
 *     ln1    = rmsnorm(x; attn_norm)                       saved: ln1[l], rstd1[l]
 *     q,k,v  = ln1 Wq^T, ln1 Wk^T, ln1 Wv^T  (+ LoRA)      saved: xa[l][Q,K,V]
 *     q,k    = rope(q), rope(k)  (in place)                saved: q[l], k[l], v[l]
 *     att    = attention(q, k, v; cu_seqlens, prefix)      saved: att[l], lse[l]
 *     resid2 = x + att Wo^T (+ LoRA)                       saved: resid2[l], xa[l][O]
 *     ln2    = rmsnorm(resid2; mlp_norm)                   saved: ln2[l], rstd2[l]
 *     gate,up = ln2 Wg^T, ln2 Wu^T (+ LoRA)                saved: gate[l], up[l], xa
 *     h      = silu(gate) * up                             saved: hmlp[l]
 *     resid[l+1] = resid2 + h Wd^T (+ LoRA)                saved: resid[l+1], xa[l][DOWN]
 * and at the end out_hidden = rmsnorm(resid[L]; final_norm), saved: rstdf.
 *
 * The backward walks the same list upwards with one running gradient dres = dLoss/d
 * (current residual stream): the residual add passes dres unchanged to both branches,
 * and every branch's input gradient is added into it by rmsnorm_backward.  Base weights
 * get no gradient; LoRA A/B gradients are added into `grads`.
 *
 * Invariants:
 *  1. acts are sized once for max_T tokens and rank max_r; a step allocates nothing.
 *  2. bk_model_backward uses the activations of the last bk_model_forward on the same
 *     acts, which must have had the same lora and batch (checked: T, S, lora pointer).
 *  3. A forward with a prefix is never followed by a backward (checked): the prefix is
 *     the frozen teacher's, and lse then covers keys the backward does not revisit.
 *  4. The dropout mask of (layer, module) is keyed by (batch->dropout_key, layer,
 *     module): forward and backward recompute the same mask; nothing else is random.
 *  5. Token ids are checked against V and cu_seqlens for monotonicity before anything
 *     reaches the ops (bad input dies here, not inside a kernel).
 *  6. Device buffers of layer l for a [T,W] activation start at l * max_T * W; lse of
 *     layer l is [NH,T] with row stride T (the current batch's T).
 */
#include "gpu/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"

const char *const bk_lora_module_names[BK_LORA_NMOD] = {
	"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};

struct bk_acts {
	int max_T, max_r;
	/* what the last forward saw (invariant 2) */
	int T, S, has_forward, used_prefix;
	const bk_lora *lora;
	int train;
	uint64_t dropout_key;
	/* the batch, on the device */
	int32_t *ids, *pos; /* [max_T] */
	int32_t *cu;        /* [max_T+1] */
	/* saved activations, per layer (stride max_T * width) */
	float *resid;         /* [L+1][T,H] */
	float *resid2;        /* [L][T,H] */
	float *ln1, *ln2;     /* [L][T,H] */
	float *rstd1, *rstd2; /* [L][T] */
	float *rstdf;         /* [T] */
	float *q;             /* [L][T,NH*D] after RoPE */
	float *k, *v;         /* [L][T,NKV*D] k after RoPE */
	float *att;           /* [L][T,NH*D] attention output (input of o_proj) */
	float *lse;           /* [L][NH,T] */
	float *gate, *up, *hmlp; /* [L][T,I] */
	float *xa;            /* [L][NMOD][T,R] */
	/* workspace */
	float *tmp;     /* [T,H] a branch output before the residual add */
	float *scratch; /* [T, max(H, NH*D, I) + R] for LoRA ops */
	float *dres, *dln;    /* [T,H] */
	float *dq, *datt;     /* [T,NH*D] */
	float *dk, *dv;       /* [T,NKV*D] */
	float *dgate, *dup, *dh; /* [T,I] */
};

/* ---- model ---- */

void bk_model_module_dims(const bk_llama_config *c, int module, int *in, int *out)
{
	switch (module) {
	case BK_LORA_Q: *in = c->H, *out = c->NH * c->D; break;
	case BK_LORA_K:
	case BK_LORA_V: *in = c->H, *out = c->NKV * c->D; break;
	case BK_LORA_O: *in = c->NH * c->D, *out = c->H; break;
	case BK_LORA_GATE:
	case BK_LORA_UP: *in = c->H, *out = c->I; break;
	case BK_LORA_DOWN: *in = c->I, *out = c->H; break;
	default: BUG("bad lora module %d", module);
	}
}

bk_model *bk_model_create(const bk_ops *ops, const bk_llama_config *cfg,
			  const bk_llama_weights *w)
{
	const bk_llama_config *c = cfg;
	if (c->H <= 0 || c->I <= 0 || c->L <= 0 || c->NH <= 0 || c->NKV <= 0 || c->D <= 0 ||
	    c->V <= 0)
		die("model config: a dimension is not positive (H %d I %d L %d NH %d NKV %d D %d V %d)",
		    c->H, c->I, c->L, c->NH, c->NKV, c->D, c->V);
	if (c->NH % c->NKV)
		die("model config: num_attention_heads %d is not a multiple of num_key_value_heads %d",
		    c->NH, c->NKV);
	if (c->D % 2)
		die("model config: head_dim %d is odd", c->D);
	bk_model *m = xcalloc(1, sizeof(*m));
	m->ops = ops;
	m->cfg = *cfg;
	m->inv_freq_host = xmalloc(c->D / 2 * sizeof(float));
	memcpy(m->inv_freq_host, cfg->inv_freq, c->D / 2 * sizeof(float));
	m->cfg.inv_freq = m->inv_freq_host;
	m->inv_freq = ops->alloc(c->D / 2 * sizeof(float));
	ops->upload(m->inv_freq, m->inv_freq_host, c->D / 2 * sizeof(float));

	m->embed = ops->weight_upload(w->embed, c->V, c->H);
	m->final_norm = ops->weight_upload(w->final_norm, 1, c->H);
	m->lm_head = c->tied ? m->embed : ops->weight_upload(w->lm_head, c->V, c->H);
	m->layers = xcalloc(c->L, sizeof(*m->layers));
	for (int l = 0; l < c->L; l++) {
		const bk_llama_layer_weights *lw = &w->layers[l];
		const float *src[BK_LORA_NMOD] = { lw->wq, lw->wk, lw->wv, lw->wo,
						   lw->w_gate, lw->w_up, lw->w_down };
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			int in, out;
			bk_model_module_dims(c, mod, &in, &out);
			m->layers[l].w[mod] = ops->weight_upload(src[mod], out, in);
		}
		m->layers[l].attn_norm = ops->weight_upload(lw->attn_norm, 1, c->H);
		m->layers[l].mlp_norm = ops->weight_upload(lw->mlp_norm, 1, c->H);
	}
	return m;
}

void bk_model_free(bk_model *m)
{
	if (!m)
		return;
	const bk_ops *ops = m->ops;
	for (int l = 0; l < m->cfg.L; l++) {
		for (int mod = 0; mod < BK_LORA_NMOD; mod++)
			ops->weight_free(m->layers[l].w[mod]);
		ops->weight_free(m->layers[l].attn_norm);
		ops->weight_free(m->layers[l].mlp_norm);
	}
	if (m->lm_head != m->embed)
		ops->weight_free(m->lm_head);
	ops->weight_free(m->embed);
	ops->weight_free(m->final_norm);
	ops->free(m->inv_freq);
	free(m->inv_freq_host);
	free(m->layers);
	free(m);
}

/* ---- activations ---- */

static float *falloc(const bk_ops *ops, size_t n) { return ops->alloc(n * sizeof(float)); }

bk_acts *bk_acts_create(const bk_model *m, int max_T, int max_r)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	BUG_ON(max_T <= 0 || max_r < 0);
	bk_acts *a = xcalloc(1, sizeof(*a));
	size_t T = max_T, L = c->L, H = c->H, I = c->I, R = max_r > 0 ? max_r : 1;
	size_t QD = (size_t)c->NH * c->D, KVD = (size_t)c->NKV * c->D;
	size_t widest = H > QD ? H : QD;
	widest = widest > I ? widest : I;
	a->max_T = max_T;
	a->max_r = max_r;
	a->ids = ops->alloc(T * sizeof(int32_t));
	a->pos = ops->alloc(T * sizeof(int32_t));
	a->cu = ops->alloc((T + 1) * sizeof(int32_t));
	a->resid = falloc(ops, (L + 1) * T * H);
	a->resid2 = falloc(ops, L * T * H);
	a->ln1 = falloc(ops, L * T * H);
	a->ln2 = falloc(ops, L * T * H);
	a->rstd1 = falloc(ops, L * T);
	a->rstd2 = falloc(ops, L * T);
	a->rstdf = falloc(ops, T);
	a->q = falloc(ops, L * T * QD);
	a->k = falloc(ops, L * T * KVD);
	a->v = falloc(ops, L * T * KVD);
	a->att = falloc(ops, L * T * QD);
	a->lse = falloc(ops, L * c->NH * T);
	a->gate = falloc(ops, L * T * I);
	a->up = falloc(ops, L * T * I);
	a->hmlp = falloc(ops, L * T * I);
	a->xa = falloc(ops, L * BK_LORA_NMOD * T * R);
	a->tmp = falloc(ops, T * H);
	a->scratch = falloc(ops, T * (widest + R));
	a->dres = falloc(ops, T * H);
	a->dln = falloc(ops, T * H);
	a->dq = falloc(ops, T * QD);
	a->datt = falloc(ops, T * QD);
	a->dk = falloc(ops, T * KVD);
	a->dv = falloc(ops, T * KVD);
	a->dgate = falloc(ops, T * I);
	a->dup = falloc(ops, T * I);
	a->dh = falloc(ops, T * I);
	return a;
}

void bk_acts_free(const bk_model *m, bk_acts *a)
{
	if (!a)
		return;
	void *bufs[] = { a->ids, a->pos, a->cu, a->resid, a->resid2, a->ln1, a->ln2,
			 a->rstd1, a->rstd2, a->rstdf, a->q, a->k, a->v, a->att, a->lse,
			 a->gate, a->up, a->hmlp, a->xa, a->tmp, a->scratch, a->dres, a->dln,
			 a->dq, a->datt, a->dk, a->dv, a->dgate, a->dup, a->dh };
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		m->ops->free(bufs[i]);
	free(a);
}

/* layer l's slice of a per-layer [T,width] buffer (invariant 6) */
static float *lay(const bk_acts *a, float *base, int l, size_t width)
{
	return base + (size_t)l * a->max_T * width;
}

static float *xa_of(const bk_acts *a, int l, int mod)
{
	size_t R = a->max_r > 0 ? a->max_r : 1;
	return a->xa + ((size_t)l * BK_LORA_NMOD + mod) * a->max_T * R;
}

/* ---- LoRA ---- */

static bk_lora *lora_alloc(const bk_model *m, int r, float alpha, float dropout,
			   unsigned targets)
{
	const bk_llama_config *c = &m->cfg;
	if (r <= 0)
		die("lora: rank r = %d is not positive", r);
	if (!(dropout >= 0 && dropout < 1))
		die("lora: dropout %g is not in [0,1)", dropout);
	if (targets & ~BK_LORA_ALL)
		BUG("lora: bad target mask %#x", targets);
	bk_lora *lo = xcalloc(1, sizeof(*lo));
	lo->L = c->L;
	lo->r = r;
	lo->alpha = alpha;
	lo->scale = alpha / r;
	lo->dropout = dropout;
	lo->targets = targets;
	lo->A = xcalloc(c->L, sizeof(*lo->A));
	lo->B = xcalloc(c->L, sizeof(*lo->B));
	size_t n = 0;
	for (int pass = 0; pass < 2; pass++) { /* pass 0 counts, pass 1 points */
		n = 0;
		for (int l = 0; l < c->L; l++)
			for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
				if (!(targets & (1u << mod)))
					continue;
				int in, out;
				bk_model_module_dims(c, mod, &in, &out);
				if (pass) {
					lo->A[l][mod] = lo->flat + n;
					lo->B[l][mod] = lo->flat + n + (size_t)r * in;
				}
				n += (size_t)r * in + (size_t)out * r;
			}
		if (!pass) {
			lo->n_flat = n;
			lo->flat = falloc(m->ops, n);
			m->ops->zero(lo->flat, n * sizeof(float));
		}
	}
	return lo;
}

bk_lora *bk_lora_create(const bk_model *m, int r, float alpha, float dropout,
			unsigned targets)
{
	return lora_alloc(m, r, alpha, dropout, targets);
}

bk_lora *bk_lora_create_like(const bk_model *m, const bk_lora *like)
{
	return lora_alloc(m, like->r, like->alpha, like->dropout, like->targets);
}

void bk_lora_free(const bk_model *m, bk_lora *l)
{
	if (!l)
		return;
	m->ops->free(l->flat);
	free(l->A);
	free(l->B);
	free(l);
}

void bk_lora_init_peft(const bk_model *m, bk_lora *lo, uint64_t seed)
{
	float *h = xcalloc(lo->n_flat ? lo->n_flat : 1, sizeof(float));
	bk_rng rng;
	bk_rng_seed(&rng, seed);
	for (int l = 0; l < lo->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			if (!lo->A[l][mod])
				continue;
			int in, out;
			bk_model_module_dims(&m->cfg, mod, &in, &out);
			float *A = h + (lo->A[l][mod] - lo->flat), bound = 1.0f / sqrtf((float)in);
			for (size_t i = 0; i < (size_t)lo->r * in; i++)
				A[i] = (float)((2 * bk_rng_uniform(&rng) - 1) * bound);
		}
	m->ops->upload(lo->flat, h, lo->n_flat * sizeof(float));
	free(h);
}

/* ---- forward ---- */

static float lora_p(const bk_lora *lora, const bk_acts *a) { return a->train ? lora->dropout : 0; }

static uint64_t lora_key(const bk_acts *a, int l, int mod)
{
	return bk_crng_key(a->dropout_key, (uint64_t)l, (uint64_t)mod, 0x6c6f7261 /* "lora" */);
}

/* y [T,out] = x [T,in] W^T (+ LoRA of module mod when targeted) */
static void linear_fwd(const bk_model *m, const bk_lora *lora, bk_acts *a, int l, int mod,
		       float *y, const float *x, int T)
{
	m->ops->linear_forward(y, x, m->layers[l].w[mod], T);
	if (!lora || !lora->A[l][mod])
		return;
	int in, out;
	bk_model_module_dims(&m->cfg, mod, &in, &out);
	m->ops->lora_forward(y, xa_of(a, l, mod), x, lora->A[l][mod], lora->B[l][mod], T, in,
			     out, lora->r, lora->scale, lora_p(lora, a), lora_key(a, l, mod),
			     a->scratch);
}

static void check_batch(const bk_model *m, const bk_batch *b, const bk_acts *a, int P)
{
	if (b->T <= 0 || b->T > a->max_T)
		die("model: batch of %d tokens does not fit the %d allocated", b->T, a->max_T);
	if (b->S <= 0 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->S] != b->T)
		die("model: cu_seqlens must run from 0 to T = %d over S = %d sequences", b->T, b->S);
	for (int s = 0; s < b->S; s++)
		if (b->cu_seqlens[s + 1] < b->cu_seqlens[s])
			die("model: cu_seqlens decreases at sequence %d", s);
	for (int t = 0; t < b->T; t++) {
		if (b->ids[t] < 0 || b->ids[t] >= m->cfg.V)
			die("model: token %d: id %d is not in [0,%d)", t, b->ids[t], m->cfg.V);
		if (b->pos[t] < P)
			die("model: token %d: position %d is inside the %d-token prefix", t,
			    b->pos[t], P);
	}
}

void bk_model_forward(const bk_model *m, const bk_lora *lora, const bk_batch *b,
		      const bk_prefix *prefix, bk_acts *a, float *out_hidden)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	int T = b->T, P = prefix ? prefix->P : 0;
	size_t H = c->H, I = c->I, QD = (size_t)c->NH * c->D, KVD = (size_t)c->NKV * c->D;
	check_batch(m, b, a, P);
	if (lora && (lora->L != c->L || lora->r > a->max_r))
		BUG("lora with L %d r %d on a model of %d layers, acts for rank %d", lora->L,
		    lora->r, c->L, a->max_r);
	BUG_ON(prefix && prefix->L != c->L);
	a->T = T;
	a->S = b->S;
	a->lora = lora;
	a->train = b->train;
	a->dropout_key = b->dropout_key;
	a->used_prefix = prefix != NULL;
	a->has_forward = 1;
	ops->upload(a->ids, b->ids, T * sizeof(int32_t));
	ops->upload(a->pos, b->pos, T * sizeof(int32_t));
	ops->upload(a->cu, b->cu_seqlens, (b->S + 1) * sizeof(int32_t));

	ops->embedding_forward(a->resid, a->ids, m->embed, T);
	for (int l = 0; l < c->L; l++) {
		const bk_layer *w = &m->layers[l];
		float *x = lay(a, a->resid, l, H), *ln1 = lay(a, a->ln1, l, H);
		float *q = lay(a, a->q, l, QD), *k = lay(a, a->k, l, KVD), *v = lay(a, a->v, l, KVD);
		float *att = lay(a, a->att, l, QD), *resid2 = lay(a, a->resid2, l, H);
		float *ln2 = lay(a, a->ln2, l, H), *gate = lay(a, a->gate, l, I);
		float *up = lay(a, a->up, l, I), *hm = lay(a, a->hmlp, l, I);

		/* attention block */
		ops->rmsnorm_forward(ln1, lay(a, a->rstd1, l, 1), x, w->attn_norm, T, c->H, c->rms_eps);
		linear_fwd(m, lora, a, l, BK_LORA_Q, q, ln1, T);
		linear_fwd(m, lora, a, l, BK_LORA_K, k, ln1, T);
		linear_fwd(m, lora, a, l, BK_LORA_V, v, ln1, T);
		ops->rope_forward(q, a->pos, m->inv_freq, T, c->NH, c->D);
		ops->rope_forward(k, a->pos, m->inv_freq, T, c->NKV, c->D);
		ops->attention_forward(att, lay(a, a->lse, l, c->NH), q, k, v, a->cu, b->S, T,
				       c->NH, c->NKV, c->D, prefix ? prefix->k[l] : NULL,
				       prefix ? prefix->v[l] : NULL, P);
		linear_fwd(m, lora, a, l, BK_LORA_O, a->tmp, att, T);
		ops->residual_forward(resid2, x, a->tmp, (size_t)T * H);

		/* MLP block */
		ops->rmsnorm_forward(ln2, lay(a, a->rstd2, l, 1), resid2, w->mlp_norm, T, c->H,
				     c->rms_eps);
		linear_fwd(m, lora, a, l, BK_LORA_GATE, gate, ln2, T);
		linear_fwd(m, lora, a, l, BK_LORA_UP, up, ln2, T);
		ops->swiglu_forward(hm, gate, up, (size_t)T * I);
		linear_fwd(m, lora, a, l, BK_LORA_DOWN, a->tmp, hm, T);
		ops->residual_forward(lay(a, a->resid, l + 1, H), resid2, a->tmp, (size_t)T * H);
	}
	ops->rmsnorm_forward(out_hidden, a->rstdf, lay(a, a->resid, c->L, H), m->final_norm, T,
			     c->H, c->rms_eps);
}

/* ---- backward ---- */

/* dx [T,in] += dy [T,out] W (+ LoRA backward, adding into grads' A/B of module mod) */
static void linear_bwd(const bk_model *m, const bk_lora *lora, bk_lora *grads, bk_acts *a,
		       int l, int mod, float *dx, const float *dy, const float *x, int T)
{
	m->ops->linear_backward(dx, dy, m->layers[l].w[mod], T);
	if (!lora || !lora->A[l][mod])
		return;
	int in, out;
	bk_model_module_dims(&m->cfg, mod, &in, &out);
	m->ops->lora_backward(dx, grads->A[l][mod], grads->B[l][mod], dy, x, xa_of(a, l, mod),
			      lora->A[l][mod], lora->B[l][mod], T, in, out, lora->r, lora->scale,
			      lora_p(lora, a), lora_key(a, l, mod), a->scratch);
}

void bk_model_backward(const bk_model *m, const bk_lora *lora, const bk_batch *b,
		       bk_acts *a, const float *d_hidden, bk_lora *grads)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	int T = b->T;
	size_t H = c->H, I = c->I, QD = (size_t)c->NH * c->D, KVD = (size_t)c->NKV * c->D;
	if (!a->has_forward || a->T != T || a->S != b->S || a->lora != lora)
		BUG("model backward: acts do not hold the forward of this batch and adapter");
	if (a->used_prefix)
		BUG("model backward: the forward used a prefix (forward only)");
	if (lora && (!grads || grads->targets != lora->targets || grads->r != lora->r ||
		     grads->L != lora->L))
		BUG("model backward: grads do not have the adapter's shape");
	size_t fT = (size_t)T * sizeof(float);

	/* final norm: dres = d resid[L] */
	ops->zero(a->dres, fT * H);
	ops->rmsnorm_backward(a->dres, d_hidden, lay(a, a->resid, c->L, H), m->final_norm,
			      a->rstdf, T, c->H);
	for (int l = c->L - 1; l >= 0; l--) {
		const bk_layer *w = &m->layers[l];
		float *x = lay(a, a->resid, l, H), *ln1 = lay(a, a->ln1, l, H);
		float *q = lay(a, a->q, l, QD), *k = lay(a, a->k, l, KVD), *v = lay(a, a->v, l, KVD);
		float *att = lay(a, a->att, l, QD), *resid2 = lay(a, a->resid2, l, H);
		float *ln2 = lay(a, a->ln2, l, H), *gate = lay(a, a->gate, l, I);
		float *up = lay(a, a->up, l, I), *hm = lay(a, a->hmlp, l, I);

		/* MLP block: dres = d resid[l+1] = d (down output) */
		ops->zero(a->dh, fT * I);
		linear_bwd(m, lora, grads, a, l, BK_LORA_DOWN, a->dh, a->dres, hm, T);
		ops->zero(a->dgate, fT * I);
		ops->zero(a->dup, fT * I);
		ops->swiglu_backward(a->dgate, a->dup, a->dh, gate, up, (size_t)T * I);
		ops->zero(a->dln, fT * H);
		linear_bwd(m, lora, grads, a, l, BK_LORA_GATE, a->dln, a->dgate, ln2, T);
		linear_bwd(m, lora, grads, a, l, BK_LORA_UP, a->dln, a->dup, ln2, T);
		ops->rmsnorm_backward(a->dres, a->dln, resid2, w->mlp_norm, lay(a, a->rstd2, l, 1),
				      T, c->H);

		/* attention block: dres = d resid2 = d (o_proj output) */
		ops->zero(a->datt, fT * QD);
		linear_bwd(m, lora, grads, a, l, BK_LORA_O, a->datt, a->dres, att, T);
		ops->zero(a->dq, fT * QD);
		ops->zero(a->dk, fT * KVD);
		ops->zero(a->dv, fT * KVD);
		ops->attention_backward(a->dq, a->dk, a->dv, a->datt, q, k, v, att,
					lay(a, a->lse, l, c->NH), a->cu, b->S, T, c->NH, c->NKV,
					c->D);
		ops->rope_backward(a->dq, a->pos, m->inv_freq, T, c->NH, c->D);
		ops->rope_backward(a->dk, a->pos, m->inv_freq, T, c->NKV, c->D);
		ops->zero(a->dln, fT * H);
		linear_bwd(m, lora, grads, a, l, BK_LORA_Q, a->dln, a->dq, ln1, T);
		linear_bwd(m, lora, grads, a, l, BK_LORA_K, a->dln, a->dk, ln1, T);
		linear_bwd(m, lora, grads, a, l, BK_LORA_V, a->dln, a->dv, ln1, T);
		ops->rmsnorm_backward(a->dres, a->dln, x, w->attn_norm, lay(a, a->rstd1, l, 1), T,
				      c->H);
	}
}

void bk_model_logits(const bk_model *m, const float *hidden, float *logits, int T)
{
	m->ops->linear_forward(logits, hidden, m->lm_head, T);
}

/* ---- shared prefix ---- */

bk_prefix *bk_model_prefix_build(const bk_model *m, bk_acts *a, const int32_t *ids, int P)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	if (P <= 0 || P > a->max_T)
		die("model: prefix of %d tokens does not fit the %d allocated", P, a->max_T);
	size_t KVD = (size_t)c->NKV * c->D;
	int32_t *pos = xmalloc(P * sizeof(int32_t)), cu[2] = { 0, P };
	for (int t = 0; t < P; t++)
		pos[t] = t;
	bk_batch b = { .T = P, .S = 1, .ids = ids, .pos = pos, .cu_seqlens = cu };
	bk_model_forward(m, NULL, &b, NULL, a, a->dres /* hidden unused: workspace */);
	free(pos);
	a->has_forward = 0; /* acts now hold no forward a backward could use */

	bk_prefix *p = xcalloc(1, sizeof(*p));
	p->P = P;
	p->L = c->L;
	p->k = xcalloc(c->L, sizeof(*p->k));
	p->v = xcalloc(c->L, sizeof(*p->v));
	for (int l = 0; l < c->L; l++) {
		p->k[l] = falloc(ops, P * KVD);
		p->v[l] = falloc(ops, P * KVD);
		ops->copy(p->k[l], lay(a, a->k, l, KVD), P * KVD * sizeof(float));
		ops->copy(p->v[l], lay(a, a->v, l, KVD), P * KVD * sizeof(float));
	}
	return p;
}

void bk_prefix_free(const bk_model *m, bk_prefix *p)
{
	if (!p)
		return;
	for (int l = 0; l < p->L; l++) {
		m->ops->free(p->k[l]);
		m->ops->free(p->v[l]);
	}
	free(p->k);
	free(p->v);
	free(p);
}
