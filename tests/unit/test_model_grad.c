/* test_model_grad.c - the transformer of gpu/model.c on a tiny random Llama (H=16, 2
 * layers, NH=4, NKV=2, D=4, I=24, V=32, packed sequences of 5 and 3 tokens):
 * forward and logits against a naive double-precision model written here, LoRA
 * gradients of J = sum(c .* hidden) against central finite differences on A and B
 * entries of every module of every layer (with and without dropout, all targets and a
 * subset), and the shared-prefix path against the concatenated sequences.  Then the
 * same gradient and prefix checks with every family delta switched on at once (q/k/v
 * bias, per-head q/k norms, GeGLU, sandwich norms, embedding scale, attention scale and
 * softcap, a sliding window of 3 on layer 0 with its own RoPE base): their forward is
 * judged by the HF parity fixtures (test_parity.c), their backward here.
 * Tolerances: forward 1e-4 (relative to the largest value); gradients: max |analytic -
 * fd| / max(max |fd|, 1e-2) < 1e-2 per module, fd step 1e-2. */
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/model.h"
#include "tests/harness.h"

enum { H = 16, L = 2, NH = 4, NKV = 2, D = 4, I = 24, V = 32, R = 3 };
#define EPS 1e-5f

static const bk_ops *ops = &bk_ops_host;
static bk_rng rng;

static float *hrand(size_t n, float lo, float hi)
{
	float *x = xmalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = lo + (hi - lo) * (float)bk_rng_uniform(&rng);
	return x;
}

/* ---- the tiny model's host weights ---- */

static float inv_freq[D / 2], inv_local[D / 2];
static int windows[L] = { 3, 0 };
static int family; /* the family deltas are on (no naive forward for them) */
static bk_llama_config cfg = { .H = H, .I = I, .L = L, .NH = NH, .NKV = NKV, .D = D,
			       .V = V, .rms_eps = EPS, .inv_freq = inv_freq };
static bk_llama_layer_weights lw[L];
static bk_llama_weights hw = { .layers = lw };

static void make_weights(void)
{
	for (int i = 0; i < D / 2; i++)
		inv_freq[i] = (float)pow(10000.0, -2.0 * i / D);
	hw.embed = hrand((size_t)V * H, -1, 1);
	hw.final_norm = hrand(H, 0.8f, 1.2f);
	hw.lm_head = hrand((size_t)V * H, -0.3f, 0.3f);
	for (int l = 0; l < L; l++) {
		const float **w[BK_LORA_NMOD] = { &lw[l].wq, &lw[l].wk, &lw[l].wv, &lw[l].wo,
						  &lw[l].w_gate, &lw[l].w_up, &lw[l].w_down };
		for (int m = 0; m < BK_LORA_NMOD; m++) {
			int in, out;
			bk_model_module_dims(&cfg, m, &in, &out);
			float b = 1.5f / sqrtf((float)in);
			*w[m] = hrand((size_t)out * in, -b, b);
		}
		lw[l].attn_norm = hrand(H, 0.8f, 1.2f);
		lw[l].mlp_norm = hrand(H, 0.8f, 1.2f);
		lw[l].bq = hrand(NH * D, -0.5f, 0.5f);
		lw[l].bk = hrand(NKV * D, -0.5f, 0.5f);
		lw[l].bv = hrand(NKV * D, -0.5f, 0.5f);
		lw[l].q_norm = hrand(D, 0.7f, 1.3f);
		lw[l].k_norm = hrand(D, 0.7f, 1.3f);
		lw[l].post_attn_norm = hrand(H, 0.7f, 1.3f);
		lw[l].post_mlp_norm = hrand(H, 0.7f, 1.3f);
	}
	for (int i = 0; i < D / 2; i++)
		inv_local[i] = (float)pow(100.0, -2.0 * i / D);
}

static void free_weights(void)
{
	free((void *)hw.embed), free((void *)hw.final_norm), free((void *)hw.lm_head);
	for (int l = 0; l < L; l++) {
		const float *w[] = { lw[l].wq, lw[l].wk, lw[l].wv, lw[l].wo, lw[l].w_gate,
				     lw[l].w_up, lw[l].w_down, lw[l].attn_norm, lw[l].mlp_norm,
				     lw[l].bq, lw[l].bk, lw[l].bv, lw[l].q_norm, lw[l].k_norm,
				     lw[l].post_attn_norm, lw[l].post_mlp_norm };
		for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
			free((void *)w[i]);
	}
}

/* ---- naive double-precision model ---- */

/* lo: host copy of the adapter's flat buffer (NULL = off), laid out like lora */
typedef struct {
	const bk_lora *lora;
	const float *flat;
} naive_lora;

static void dlin(double *y, const double *x, const float *W, int T, int in, int out,
		 const naive_lora *nl, int l, int m)
{
	for (int t = 0; t < T; t++)
		for (int o = 0; o < out; o++) {
			double s = 0;
			for (int i = 0; i < in; i++)
				s += x[t * in + i] * W[o * in + i];
			y[t * out + o] = s;
		}
	if (!nl || !nl->lora->A[l][m])
		return;
	const float *A = nl->flat + (nl->lora->A[l][m] - nl->lora->flat);
	const float *B = nl->flat + (nl->lora->B[l][m] - nl->lora->flat);
	int r = nl->lora->r;
	for (int t = 0; t < T; t++) {
		double xa[16] = { 0 };
		for (int k = 0; k < r; k++)
			for (int i = 0; i < in; i++)
				xa[k] += x[t * in + i] * A[k * in + i];
		for (int o = 0; o < out; o++) {
			double s = 0;
			for (int k = 0; k < r; k++)
				s += xa[k] * B[o * r + k];
			y[t * out + o] += nl->lora->scale * s;
		}
	}
}

static void drms(double *y, const double *x, const float *w, int T)
{
	for (int t = 0; t < T; t++) {
		double ss = 0;
		for (int i = 0; i < H; i++)
			ss += x[t * H + i] * x[t * H + i];
		double r = 1 / sqrt(ss / H + EPS);
		for (int i = 0; i < H; i++)
			y[t * H + i] = w[i] * x[t * H + i] * r;
	}
}

static void drope(double *x, const int32_t *pos, int T, int n)
{
	for (int t = 0; t < T; t++)
		for (int h = 0; h < n; h++)
			for (int i = 0; i < D / 2; i++) {
				double *xh = x + (t * n + h) * D, a = xh[i], b = xh[i + D / 2];
				double ang = pos[t] * (double)inv_freq[i];
				xh[i] = a * cos(ang) - b * sin(ang);
				xh[i + D / 2] = b * cos(ang) + a * sin(ang);
			}
}

static void naive_forward(const naive_lora *nl, const int32_t *ids, const int32_t *pos,
			  const int32_t *cu, int S, int T, double *hidden /* [T,H] */)
{
	double *x = xcalloc(T * H, 8), *ln = xcalloc(T * H, 8), *o = xcalloc(T * H, 8);
	double *q = xcalloc(T * NH * D, 8), *k = xcalloc(T * NKV * D, 8);
	double *v = xcalloc(T * NKV * D, 8), *att = xcalloc(T * NH * D, 8);
	double *g = xcalloc(T * I, 8), *u = xcalloc(T * I, 8), *sc = xcalloc(T, 8);
	for (int t = 0; t < T; t++)
		for (int i = 0; i < H; i++)
			x[t * H + i] = hw.embed[ids[t] * H + i];
	for (int l = 0; l < L; l++) {
		drms(ln, x, lw[l].attn_norm, T);
		dlin(q, ln, lw[l].wq, T, H, NH * D, nl, l, BK_LORA_Q);
		dlin(k, ln, lw[l].wk, T, H, NKV * D, nl, l, BK_LORA_K);
		dlin(v, ln, lw[l].wv, T, H, NKV * D, nl, l, BK_LORA_V);
		drope(q, pos, T, NH);
		drope(k, pos, T, NKV);
		for (int s = 0; s < S; s++)
			for (int t = cu[s]; t < cu[s + 1]; t++)
				for (int h = 0; h < NH; h++) {
					int kh = h / (NH / NKV);
					double mx = -INFINITY, sum = 0;
					for (int j = cu[s]; j <= t; j++) {
						double d = 0;
						for (int i = 0; i < D; i++)
							d += q[(t * NH + h) * D + i] * k[(j * NKV + kh) * D + i];
						sc[j] = d / sqrt(D);
						mx = sc[j] > mx ? sc[j] : mx;
					}
					for (int j = cu[s]; j <= t; j++)
						sum += exp(sc[j] - mx);
					for (int i = 0; i < D; i++) {
						double a = 0;
						for (int j = cu[s]; j <= t; j++)
							a += exp(sc[j] - mx) / sum * v[(j * NKV + kh) * D + i];
						att[(t * NH + h) * D + i] = a;
					}
				}
		dlin(o, att, lw[l].wo, T, NH * D, H, nl, l, BK_LORA_O);
		for (int i = 0; i < T * H; i++)
			x[i] += o[i];
		drms(ln, x, lw[l].mlp_norm, T);
		dlin(g, ln, lw[l].w_gate, T, H, I, nl, l, BK_LORA_GATE);
		dlin(u, ln, lw[l].w_up, T, H, I, nl, l, BK_LORA_UP);
		for (int i = 0; i < T * I; i++)
			g[i] = g[i] / (1 + exp(-g[i])) * u[i];
		dlin(o, g, lw[l].w_down, T, I, H, nl, l, BK_LORA_DOWN);
		for (int i = 0; i < T * H; i++)
			x[i] += o[i];
	}
	drms(hidden, x, hw.final_norm, T);
	free(x), free(ln), free(o), free(q), free(k), free(v), free(att), free(g), free(u), free(sc);
}

/* ---- helpers ---- */

static void check_close(const char *what, const float *got, const double *want, size_t n,
			double tol)
{
	double num = 0, den = 1e-3;
	int bad = 0;
	for (size_t i = 0; i < n; i++) {
		bad += !isfinite(got[i]);
		num = fabs(got[i] - want[i]) > num ? fabs(got[i] - want[i]) : num;
		den = fabs(want[i]) > den ? fabs(want[i]) : den;
	}
	double err = bad ? INFINITY : num / den;
	CHECK(err < tol, "%s: error %.3g (tolerance %.3g, %d non-finite)", what, err, tol, bad);
}

/* the batch: two packed sequences of 5 and 3 tokens */
enum { T = 8, S = 2 };
static int32_t ids[T], pos[T] = { 0, 1, 2, 3, 4, 0, 1, 2 }, cu[S + 1] = { 0, 5, 8 };

static double run_J(const bk_model *m, const bk_lora *lora, const bk_batch *b, bk_acts *acts,
		    float *d_hidden, const float *c)
{
	float h[T * H];
	bk_model_forward(m, lora, b, NULL, acts, d_hidden);
	ops->download(h, d_hidden, sizeof(h));
	double J = 0;
	for (int i = 0; i < T * H; i++)
		J += (double)c[i] * h[i];
	return J;
}

/* gradients of J on A/B entries of every module, analytic vs central differences */
static void check_grads(const bk_model *m, unsigned targets, float p)
{
	bk_lora *lora = bk_lora_create(m, R, 6.0f, p, targets); /* scale 2 */
	bk_lora *grads = bk_lora_create_like(m, lora);
	bk_acts *acts = bk_acts_create(m, T, R);
	float *flat = hrand(lora->n_flat, -0.4f, 0.4f), *c = hrand(T * H, -1, 1);
	float *g = xmalloc(lora->n_flat * sizeof(float));
	float *dh = ops->alloc(T * H * sizeof(float)), *dc = ops->alloc(T * H * sizeof(float));
	ops->upload(lora->flat, flat, lora->n_flat * sizeof(float));
	ops->upload(dc, c, T * H * sizeof(float));
	bk_batch b = { .T = T, .S = S, .ids = ids, .pos = pos, .cu_seqlens = cu, .train = p > 0,
		       .dropout_key = 99 };

	/* the forward with dropout off matches the naive model */
	if (p == 0 && !family) {
		double want[T * H];
		float got[T * H];
		naive_lora nl = { lora, flat };
		naive_forward(&nl, ids, pos, cu, S, T, want);
		bk_model_forward(m, lora, &b, NULL, acts, dh);
		ops->download(got, dh, sizeof(got));
		check_close("model forward with lora", got, want, T * H, 1e-4);
	}

	ops->zero(grads->flat, grads->n_flat * sizeof(float));
	bk_model_forward(m, lora, &b, NULL, acts, dh);
	bk_model_backward(m, lora, &b, acts, dc, grads);
	ops->download(g, grads->flat, lora->n_flat * sizeof(float));

	/* checkpointed: the same bits (gpu/model.c invariants 10-12; these dims fit dln, datt
	 * and, with qk_norm, dqr/dkr into the slot but not dq/dk/dv: I 24 < QD + 2 KVD 32) */
	{
		bk_acts *ck = bk_acts_create_ckpt(m, T, R, 1);
		bk_lora *gk = bk_lora_create_like(m, lora);
		float *gc = xmalloc(lora->n_flat * sizeof(float));
		ops->zero(gk->flat, gk->n_flat * sizeof(float));
		bk_model_forward(m, lora, &b, NULL, ck, dh);
		bk_model_backward(m, lora, &b, ck, dc, gk);
		ops->download(gc, gk->flat, lora->n_flat * sizeof(float));
		CHECK(!memcmp(gc, g, lora->n_flat * sizeof(float)),
		      "%scheckpointed backward: gradients differ from the plain one",
		      family ? "family deltas: " : "");
		free(gc);
		bk_lora_free(m, gk);
		bk_acts_free(m, ck);
	}

	/* a second backward adds the same gradient again */
	float *g2 = xmalloc(lora->n_flat * sizeof(float));
	bk_model_backward(m, lora, &b, acts, dc, grads);
	ops->download(g2, grads->flat, lora->n_flat * sizeof(float));
	double dmax = 0, gmax = 1e-3;
	for (size_t i = 0; i < lora->n_flat; i++) {
		dmax = fmax(dmax, fabs(g2[i] - 2 * g[i]));
		gmax = fmax(gmax, fabs(g[i]));
	}
	CHECK(dmax / gmax < 1e-5, "model backward twice: gradients do not add (%.3g)", dmax / gmax);
	free(g2);

	const float step = 1e-2f;
	for (int l = 0; l < L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			if (!(targets & (1u << mod))) {
				CHECK(!lora->A[l][mod] && !grads->A[l][mod], "untargeted module has A");
				continue;
			}
			int in, out;
			bk_model_module_dims(&cfg, mod, &in, &out);
			size_t offA = lora->A[l][mod] - lora->flat, offB = lora->B[l][mod] - lora->flat;
			/* 4 entries of A and 4 of B, one of them the last */
			size_t at[8];
			for (int e = 0; e < 4; e++) {
				at[e] = offA + (e == 3 ? (size_t)R * in - 1 : bk_rng_below(&rng, (size_t)R * in));
				at[4 + e] = offB + (e == 3 ? (size_t)out * R - 1 : bk_rng_below(&rng, (size_t)out * R));
			}
			double num = 0, den = 1e-2, any = 0;
			int bad = 0;
			for (int e = 0; e < 8; e++) {
				float x0 = flat[at[e]], xp = x0 + step, xm = x0 - step;
				flat[at[e]] = xp;
				ops->upload(lora->flat, flat, lora->n_flat * sizeof(float));
				double jp = run_J(m, lora, &b, acts, dh, c);
				flat[at[e]] = xm;
				ops->upload(lora->flat, flat, lora->n_flat * sizeof(float));
				double jm = run_J(m, lora, &b, acts, dh, c);
				flat[at[e]] = x0;
				double fd = (jp - jm) / ((double)xp - xm);
				bad += !isfinite(g[at[e]]) || !isfinite(fd);
				num = fmax(num, fabs(g[at[e]] - fd));
				den = fmax(den, fabs(fd));
				any = fmax(any, fabs(fd));
			}
			ops->upload(lora->flat, flat, lora->n_flat * sizeof(float));
			double err = bad ? INFINITY : num / den;
			CHECK(err < 1e-2, "%slayer %d %s p=%g targets %#x: lora gradient vs finite differences: error %.3g",
			      family ? "family deltas: " : "", l, bk_lora_module_names[mod], p, targets, err);
			CHECK(any > 1e-3, "layer %d %s: finite differences are all ~0 (%.3g): test is blind",
			      l, bk_lora_module_names[mod], any);
			if (getenv("BK_TEST_VERBOSE"))
				fprintf(stderr, "layer %d %-9s p=%.2f err %.3g max|fd| %.3g\n", l,
					bk_lora_module_names[mod], p, err, any);
		}
	ops->free(dh), ops->free(dc);
	free(flat), free(c), free(g);
	bk_acts_free(m, acts);
	bk_lora_free(m, grads);
	bk_lora_free(m, lora);
}

/* adapter off: forward and logits match the naive model; a zero adapter changes nothing */
static void check_forward(const bk_model *m)
{
	bk_acts *acts = bk_acts_create(m, T + 3, R);
	float *dh = ops->alloc(T * H * sizeof(float)), *dl = ops->alloc(T * V * sizeof(float));
	float got[T * H], got2[T * H], logits[T * V];
	double want[T * H], wl[T * V];
	bk_batch b = { .T = T, .S = S, .ids = ids, .pos = pos, .cu_seqlens = cu };
	naive_forward(NULL, ids, pos, cu, S, T, want);
	bk_model_forward(m, NULL, &b, NULL, acts, dh);
	ops->download(got, dh, sizeof(got));
	check_close("model forward, adapter off", got, want, T * H, 1e-4);

	const float *head = m->cfg.tied ? hw.embed : hw.lm_head;
	for (int t = 0; t < T; t++)
		for (int v = 0; v < V; v++) {
			double s = 0;
			for (int i = 0; i < H; i++)
				s += want[t * H + i] * head[v * H + i];
			wl[t * V + v] = s;
		}
	bk_model_logits(m, dh, dl, T);
	ops->download(logits, dl, sizeof(logits));
	check_close(m->cfg.tied ? "logits (tied)" : "logits", logits, wl, T * V, 1e-4);

	bk_lora *zero = bk_lora_create(m, R, 6.0f, 0, BK_LORA_ALL);
	bk_lora_init_peft(m, zero, 5); /* B = 0: the adapter is the identity */
	bk_model_forward(m, zero, &b, NULL, acts, dh);
	ops->download(got2, dh, sizeof(got2));
	CHECK(!memcmp(got, got2, sizeof(got)), "peft-initialised adapter changes the output");
	bk_lora_free(m, zero);
	ops->free(dh), ops->free(dl);
	bk_acts_free(m, acts);
}

/* hidden states of sequences run after a shared prefix equal those of prefix ++ seq */
static void check_prefix(const bk_model *m)
{
	enum { P = 4, TT = 2 * P + T };
	int32_t pids[P], cids[TT], cpos[TT], ccu[S + 1] = { 0, P + 5, TT }, spos[T];
	for (int t = 0; t < P; t++)
		pids[t] = (int32_t)bk_rng_below(&rng, V);
	for (int s = 0, o = 0; s < S; s++) {
		for (int t = 0; t < P; t++, o++)
			cids[o] = pids[t], cpos[o] = t;
		for (int t = cu[s]; t < cu[s + 1]; t++, o++)
			cids[o] = ids[t], cpos[o] = P + pos[t];
	}
	for (int t = 0; t < T; t++)
		spos[t] = P + pos[t];
	bk_acts *acts = bk_acts_create(m, TT, R);
	float *dh = ops->alloc(TT * H * sizeof(float));
	float whole[TT * H], got[T * H];
	double want[T * H];
	bk_batch cb = { .T = TT, .S = S, .ids = cids, .pos = cpos, .cu_seqlens = ccu };
	bk_model_forward(m, NULL, &cb, NULL, acts, dh);
	ops->download(whole, dh, sizeof(whole));
	for (int s = 0, o = 0; s < S; s++) {
		o += P;
		for (int t = cu[s]; t < cu[s + 1]; t++, o++)
			for (int i = 0; i < H; i++)
				want[t * H + i] = whole[o * H + i];
	}
	bk_prefix *pre = bk_model_prefix_build(m, acts, pids, P);
	bk_batch b = { .T = T, .S = S, .ids = ids, .pos = spos, .cu_seqlens = cu };
	bk_model_forward(m, NULL, &b, pre, acts, dh);
	ops->download(got, dh, sizeof(got));
	check_close(family ? "family deltas: model forward with a shared prefix (window reaches "
			     "into it on layer 0)"
			   : "model forward with a shared prefix",
		    got, want, T * H, 1e-5);
	bk_prefix_free(m, pre);
	ops->free(dh);
	bk_acts_free(m, acts);
}

int main(void)
{
	bk_rng_seed(&rng, 2024);
	make_weights();
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)bk_rng_below(&rng, V);
	for (int tied = 0; tied <= 1; tied++) {
		cfg.tied = tied;
		bk_model *m = bk_model_create(ops, &cfg, &hw);
		check_forward(m);
		if (!tied) {
			check_grads(m, BK_LORA_ALL, 0);
			check_grads(m, BK_LORA_ALL, 0.25f);
			check_grads(m, 1u << BK_LORA_Q | 1u << BK_LORA_V | 1u << BK_LORA_DOWN, 0);
			check_prefix(m);
		}
		bk_model_free(m);
	}
	/* every family delta at once */
	family = 1;
	cfg.tied = 1;
	cfg.qkv_bias = cfg.qk_norm = cfg.geglu = cfg.sandwich = 1;
	cfg.embed_scale = 4.0f;
	cfg.attn_scale = 0.3f;
	cfg.attn_softcap = 1.5f;
	cfg.window = windows;
	cfg.inv_freq_local = inv_local;
	bk_model *m = bk_model_create(ops, &cfg, &hw);
	check_grads(m, BK_LORA_ALL, 0);
	check_grads(m, BK_LORA_ALL, 0.25f);
	check_prefix(m);
	bk_model_free(m);
	free_weights();
	return bk_test_done("test_model_grad");
}
