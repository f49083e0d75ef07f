/* test_loss.c - the chunked baking loss (gpu/host/loss.h) against a naive double-precision
 * full-logits reference written here: loss, per-row KL, d_hidden (against central
 * finite differences of the reference), sparse top-k mode, teacher top-k, extremes;
 * every case without and with a final logit softcap (Gemma-2).
 * Not a speed test. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/host/host_rows.h" /* bk_host_rows_isa: each code path of the row-block loss */
#include "gpu/host/loss.h"
#include "tests/harness.h"

/* The final logit softcap of every call below (the cases run with 0 and with a cap small
 * enough to bend these logits, which reach about +-4): the reference caps in double. */
static double g_cap;
#define CAPF ((float)g_cap)

/* ---- naive reference, double precision, whole vocabulary at once ---- */

/* z [N,V] = cap(x [N,H] @ W^T) / T, cap(a) = tanh(a / c) c for c = g_cap > 0 */
static void ref_scaled_logits(const double *x, const float *w, int n, int h, int v, double t,
			      double *z)
{
	for (int r = 0; r < n; r++)
		for (int j = 0; j < v; j++) {
			double acc = 0;
			for (int c = 0; c < h; c++)
				acc += x[(size_t)r * h + c] * w[(size_t)j * h + c];
			if (g_cap > 0)
				acc = tanh(acc / g_cap) * g_cap;
			z[(size_t)r * v + j] = acc / t;
		}
}

/* logp [N,V] = log_softmax(z) in place */
static void ref_log_softmax(double *z, int n, int v)
{
	for (int r = 0; r < n; r++) {
		double *row = z + (size_t)r * v, m = -INFINITY, s = 0;
		for (int j = 0; j < v; j++)
			m = row[j] > m ? row[j] : m;
		for (int j = 0; j < v; j++)
			s += exp(row[j] - m);
		for (int j = 0; j < v; j++)
			row[j] -= m + log(s);
	}
}

static void ref_weights(const int32_t *sample_of, int n, int ns, double *w)
{
	int count[64] = {0}, nonempty = 0;
	for (int r = 0; r < n; r++)
		count[sample_of[r]]++;
	for (int s = 0; s < ns; s++)
		nonempty += count[s] > 0;
	for (int r = 0; r < n; r++)
		w[r] = 1.0 / count[sample_of[r]] / nonempty;
}

/* exact KL against teacher log-probs tl [N,V] (double) */
static double ref_exact(const double *x, const float *w, const double *tl, const int32_t *sample_of,
			int n, int ns, int h, int v, double t, double *row_kl)
{
	double *ls = malloc((size_t)n * v * sizeof(double)), wr[64], loss = 0;
	ref_scaled_logits(x, w, n, h, v, t, ls);
	ref_log_softmax(ls, n, v);
	ref_weights(sample_of, n, ns, wr);
	for (int r = 0; r < n; r++) {
		double kl = 0;
		for (int j = 0; j < v; j++) {
			double lt = tl[(size_t)r * v + j], p = exp(lt);
			if (p > 0)
				kl += p * (lt - ls[(size_t)r * v + j]);
		}
		if (row_kl)
			row_kl[r] = kl;
		loss += wr[r] * kl;
	}
	free(ls);
	return loss;
}

/* brute-force KL of the distributions coarsened to {ids..., rest} */
static double ref_coarse(const double *x, const float *w, const int32_t *ids, const float *logp,
			 const float *rest, const int32_t *sample_of, int n, int ns, int h, int v,
			 int k, double t, double *row_kl)
{
	double *ls = malloc((size_t)n * v * sizeof(double)), wr[64], loss = 0;
	char *in = malloc((size_t)v);
	ref_scaled_logits(x, w, n, h, v, t, ls);
	ref_log_softmax(ls, n, v);
	ref_weights(sample_of, n, ns, wr);
	for (int r = 0; r < n; r++) {
		memset(in, 0, (size_t)v);
		double kl = 0, qrest = 0, prest = k == v || rest[r] < 0 ? 0 : rest[r];
		for (int i = 0; i < k; i++) {
			int id = ids[(size_t)r * k + i];
			double lp = logp[(size_t)r * k + i], p = exp(lp);
			in[id] = 1;
			if (p > 0)
				kl += p * (lp - ls[(size_t)r * v + id]);
		}
		for (int j = 0; j < v; j++)
			if (!in[j])
				qrest += exp(ls[(size_t)r * v + j]);
		if (prest > 0)
			kl += prest * (log(prest) - log(qrest));
		if (row_kl)
			row_kl[r] = kl;
		loss += wr[r] * kl;
	}
	free(ls), free(in);
	return loss;
}

typedef struct {
	int sparse; /* 0: ref_exact with tl; 1: ref_coarse */
	const float *w;
	const double *tl;
	const int32_t *ids, *sample_of;
	const float *logp, *rest;
	int n, ns, h, v, k;
	double t;
} ref_case;

static double ref_loss(const ref_case *c, const double *x, double *row_kl)
{
	if (c->sparse)
		return ref_coarse(x, c->w, c->ids, c->logp, c->rest, c->sample_of, c->n, c->ns, c->h,
				  c->v, c->k, c->t, row_kl);
	return ref_exact(x, c->w, c->tl, c->sample_of, c->n, c->ns, c->h, c->v, c->t, row_kl);
}

/* g [N,H] = d ref_loss / dx by central differences in double */
static void ref_grad_fd(const ref_case *c, const float *hidden, double *g)
{
	size_t nh = (size_t)c->n * c->h;
	double *x = malloc(nh * sizeof(double));
	for (size_t i = 0; i < nh; i++)
		x[i] = hidden[i];
	for (size_t i = 0; i < nh; i++) {
		double e = 1e-5, x0 = x[i];
		x[i] = x0 + e;
		double lp = ref_loss(c, x, NULL);
		x[i] = x0 - e;
		double lm = ref_loss(c, x, NULL);
		x[i] = x0;
		g[i] = (lp - lm) / (2 * e);
	}
	free(x);
}

static double max_relerr_d(const float *a, const double *b, size_t n, double floor)
{
	double num = 0, den = floor;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(a[i]) || !isfinite(b[i]))
			return INFINITY;
		num = fmax(num, fabs(a[i] - b[i]));
		den = fmax(den, fabs(b[i]));
	}
	return num / den;
}

static void fill(bk_rng *rng, float *a, size_t n, double scale)
{
	for (size_t i = 0; i < n; i++)
		a[i] = (float)((2 * bk_rng_uniform(rng) - 1) * scale);
}

/* ---- the cases ---- */

/* Exact mode, teacher from hidden rows and from precomputed log-probs, several
 * temperatures and chunk sizes (dividing V or not). */
static void test_exact(int n, int h, int v, const int32_t *sample_of, int ns, uint64_t seed)
{
	bk_rng rng;
	bk_rng_seed(&rng, seed);
	size_t nh = (size_t)n * h;
	float *w = malloc((size_t)v * h * sizeof(float)), *hs = malloc(nh * sizeof(float));
	float *ht = malloc(nh * sizeof(float)), *dh = malloc(nh * sizeof(float));
	float *dh2 = malloc(nh * sizeof(float)), *rk = malloc((size_t)n * sizeof(float));
	float *tlogp = malloc((size_t)n * v * sizeof(float));
	double *tl = malloc((size_t)n * v * sizeof(double)), *xt = malloc(nh * sizeof(double));
	double *g = malloc(nh * sizeof(double)), *rkr = malloc((size_t)n * sizeof(double));
	fill(&rng, w, (size_t)v * h, 1.0);
	fill(&rng, hs, nh, 1.5);
	fill(&rng, ht, nh, 1.5);
	const double temps[] = {1.0, 2.0};
	const int chunks[] = {1, 7, 16, v - 1, v, v + 5, 4096};
	for (int ti = 0; ti < 2; ti++) {
		double t = temps[ti];
		for (size_t i = 0; i < nh; i++)
			xt[i] = ht[i];
		ref_scaled_logits(xt, w, n, h, v, t, tl);
		ref_log_softmax(tl, n, v);
		ref_case c = {.w = w, .tl = tl, .sample_of = sample_of, .n = n, .ns = ns, .h = h,
			      .v = v, .t = t};
		for (size_t i = 0; i < nh; i++)
			xt[i] = hs[i];
		double want = ref_loss(&c, xt, rkr);
		ref_grad_fd(&c, hs, g);
		for (size_t ci = 0; ci < sizeof(chunks) / sizeof(chunks[0]); ci++) {
			int chunk = chunks[ci];
			if (chunk <= 0)
				continue;
			double got = bk_loss_kl_exact(hs, w, ht, NULL, sample_of, n, ns, h, v, chunk,
						      (float)t, CAPF, dh, rk);
			CHECK(bk_relerr(got, want, 1e-6) < 2e-5,
			      "exact/hidden n=%d v=%d T=%g chunk=%d: loss %.9g want %.9g", n, v, t,
			      chunk, got, want);
			CHECK(max_relerr_d(dh, g, nh, 1e-6) < 2e-4,
			      "exact/hidden n=%d v=%d T=%g chunk=%d: d_hidden relerr %g", n, v, t, chunk,
			      max_relerr_d(dh, g, nh, 1e-6));
			double rkerr = 0;
			for (int r = 0; r < n; r++)
				rkerr = fmax(rkerr, bk_relerr(rk[r], rkr[r], 1e-4));
			CHECK(rkerr < 1e-4, "exact/hidden T=%g chunk=%d: row KL relerr %g", t, chunk, rkerr);

			/* teacher log-probs through the chunked helper, then the logp mode */
			bk_teacher_logprobs(ht, w, n, h, v, chunk, (float)t, CAPF, tlogp);
			double lerr = 0;
			for (size_t i = 0; i < (size_t)n * v; i++)
				lerr = fmax(lerr, fabs(tlogp[i] - tl[i]));
			CHECK(lerr < 1e-5, "teacher log-probs T=%g chunk=%d: max abs error %g", t, chunk,
			      lerr);
			double got2 = bk_loss_kl_exact(hs, w, NULL, tlogp, sample_of, n, ns, h, v, chunk,
						       (float)t, CAPF, dh2, NULL);
			CHECK(bk_relerr(got2, want, 1e-6) < 2e-5,
			      "exact/logp T=%g chunk=%d: loss %.9g want %.9g", t, chunk, got2, want);
			CHECK(max_relerr_d(dh2, g, nh, 1e-6) < 2e-4,
			      "exact/logp T=%g chunk=%d: d_hidden relerr %g", t, chunk,
			      max_relerr_d(dh2, g, nh, 1e-6));
			double got3 = bk_loss_kl_exact(hs, w, ht, NULL, sample_of, n, ns, h, v, chunk,
						       (float)t, CAPF, NULL, NULL);
			CHECK(got3 == got, "loss without gradient %.9g differs from %.9g", got3, got);
		}
	}
	free(w), free(hs), free(ht), free(dh), free(dh2), free(rk), free(tlogp), free(tl), free(xt);
	free(g), free(rkr);
}

/* Finite differences of the float implementation itself (not the reference). */
static void test_exact_fd_self(void)
{
	enum { N = 3, H = 5, V = 23 };
	int32_t so[N] = {0, 0, 1};
	bk_rng rng;
	bk_rng_seed(&rng, 99);
	float w[V * H], hs[N * H], ht[N * H], dh[N * H];
	fill(&rng, w, V * H, 1.0);
	fill(&rng, hs, N * H, 1.0);
	fill(&rng, ht, N * H, 1.0);
	bk_loss_kl_exact(hs, w, ht, NULL, so, N, 2, H, V, 6, 1.5f, CAPF, dh, NULL);
	double num = 0, den = 0;
	for (int i = 0; i < N * H; i++) {
		float x0 = hs[i], e = 1e-2f;
		hs[i] = x0 + e;
		double lp = bk_loss_kl_exact(hs, w, ht, NULL, so, N, 2, H, V, 6, 1.5f, CAPF, NULL, NULL);
		hs[i] = x0 - e;
		double lm = bk_loss_kl_exact(hs, w, ht, NULL, so, N, 2, H, V, 6, 1.5f, CAPF, NULL, NULL);
		hs[i] = x0;
		double fd = (lp - lm) / (2.0 * e);
		num = fmax(num, fabs(fd - dh[i]));
		den = fmax(den, fabs(dh[i]));
	}
	CHECK(den > 1e-3 && num / den < 2e-2, "float finite differences: relerr %g (max |g| %g)",
	      num / den, den);
}

/* Sparse mode against the brute-force coarsened KL, and k = V against exact mode. */
static void test_sparse(void)
{
	enum { N = 6, H = 8, V = 41, NS = 4 };
	int32_t so[N] = {0, 0, 0, 2, 3, 3}; /* sample 1 empty, uneven sizes */
	bk_rng rng;
	bk_rng_seed(&rng, 7);
	float w[V * H], hs[N * H], ht[N * H], dh[N * H], dh2[N * H], rk[N];
	int32_t ids[N * V];
	float logp[N * V], rest[N];
	double g[N * H], rkr[N], x[N * H];
	fill(&rng, w, V * H, 1.0);
	fill(&rng, hs, N * H, 1.5);
	fill(&rng, ht, N * H, 1.5);
	for (int i = 0; i < N * H; i++)
		x[i] = hs[i];
	const int ks[] = {1, 3, 8, V};
	const double temps[] = {1.0, 2.0};
	const int chunks[] = {1, 6, 16, V, 4096};
	for (int ti = 0; ti < 2; ti++)
		for (int ki = 0; ki < 4; ki++) {
			int k = ks[ki];
			double t = temps[ti];
			bk_teacher_topk(ht, w, NULL, N, H, V, 16, (float)t, CAPF, k, ids, logp, rest);
			if (k == V)
				for (int r = 0; r < N; r++)
					rest[r] = 0;
			ref_case c = {.sparse = 1, .w = w, .ids = ids, .sample_of = so, .logp = logp,
				      .rest = rest, .n = N, .ns = NS, .h = H, .v = V, .k = k, .t = t};
			double want = ref_loss(&c, x, rkr);
			ref_grad_fd(&c, hs, g);
			for (int ci = 0; ci < 5; ci++) {
				double got = bk_loss_kl_topk(hs, w, ids, logp, rest, so, N, NS, H, V, k,
							     chunks[ci], (float)t, CAPF, dh, rk);
				CHECK(bk_relerr(got, want, 1e-6) < 2e-5,
				      "sparse k=%d T=%g chunk=%d: loss %.9g want %.9g", k, t, chunks[ci],
				      got, want);
				CHECK(max_relerr_d(dh, g, N * H, 1e-6) < 2e-4,
				      "sparse k=%d T=%g chunk=%d: d_hidden relerr %g", k, t, chunks[ci],
				      max_relerr_d(dh, g, N * H, 1e-6));
				double e = 0;
				for (int r = 0; r < N; r++)
					e = fmax(e, bk_relerr(rk[r], rkr[r], 1e-4));
				CHECK(e < 1e-4, "sparse k=%d T=%g: row KL relerr %g", k, t, e);
			}
			if (k == V) { /* equals the exact mode */
				double ex = bk_loss_kl_exact(hs, w, ht, NULL, so, N, NS, H, V, 16, (float)t, CAPF,
							     dh2, NULL);
				double sp = bk_loss_kl_topk(hs, w, ids, logp, rest, so, N, NS, H, V, k, 16,
							    (float)t, CAPF, dh, NULL);
				CHECK(bk_relerr(sp, ex, 1e-6) < 2e-5, "k=V T=%g: sparse %.9g exact %.9g", t,
				      sp, ex);
				CHECK(bk_max_relerr(dh, dh2, N * H, 1e-6) < 1e-4,
				      "k=V T=%g: d_hidden relerr %g", t, bk_max_relerr(dh, dh2, N * H, 1e-6));
				/* a rounding-size rest mass with K = V is ignored */
				float tiny[N];
				for (int r = 0; r < N; r++)
					tiny[r] = 3e-7f;
				double sp2 = bk_loss_kl_topk(hs, w, ids, logp, tiny, so, N, NS, H, V, k, 16,
							     (float)t, CAPF, dh2, NULL);
				CHECK(sp2 == sp, "k=V T=%g: rest 3e-7 gives %.9g, rest 0 %.9g", t, sp2, sp);
			}
		}
	/* the coarsened loss is at most the exact one (data processing inequality) */
	bk_teacher_topk(ht, w, NULL, N, H, V, 16, 1.0f, CAPF, 3, ids, logp, rest);
	double sp = bk_loss_kl_topk(hs, w, ids, logp, rest, so, N, NS, H, V, 3, 16, 1.0f, CAPF, NULL, NULL);
	double ex = bk_loss_kl_exact(hs, w, ht, NULL, so, N, NS, H, V, 16, 1.0f, CAPF, NULL, NULL);
	CHECK(sp > 0 && sp < ex, "coarsened KL %.9g not in (0, exact %.9g)", sp, ex);
}

/* A teacher whose mass is all on the top-k ids: rest = 0 drops the rest term. */
static void test_sparse_rest_zero(void)
{
	enum { N = 2, H = 4, V = 13, K = 3 };
	int32_t so[N] = {0, 1};
	bk_rng rng;
	bk_rng_seed(&rng, 11);
	float w[V * H], hs[N * H], dh[N * H];
	double g[N * H], x[N * H];
	fill(&rng, w, V * H, 1.0);
	fill(&rng, hs, N * H, 1.0);
	for (int i = 0; i < N * H; i++)
		x[i] = hs[i];
	int32_t ids[N * K] = {4, 0, 12, 7, 3, 9};
	float logp[N * K] = {logf(0.5f), logf(0.3f), logf(0.2f), 0.0f, -INFINITY, -INFINITY};
	float rest[N] = {0.0f, 0.0f};
	ref_case c = {.sparse = 1, .w = w, .ids = ids, .sample_of = so, .logp = logp, .rest = rest,
		      .n = N, .ns = 2, .h = H, .v = V, .k = K, .t = 1.0};
	double want = ref_loss(&c, x, NULL);
	ref_grad_fd(&c, hs, g);
	double got = bk_loss_kl_topk(hs, w, ids, logp, rest, so, N, 2, H, V, K, 5, 1.0f, CAPF, dh, NULL);
	CHECK(isfinite(got) && bk_relerr(got, want, 1e-6) < 2e-5, "rest=0: loss %.9g want %.9g",
	      got, want);
	CHECK(max_relerr_d(dh, g, N * H, 1e-6) < 2e-4, "rest=0: d_hidden relerr %g",
	      max_relerr_d(dh, g, N * H, 1e-6));
	/* teacher mass not summing to 1 (P = 0.9): the gradient stays that of the formula */
	float logp9[N * K] = {logf(0.5f), logf(0.1f), logf(0.1f), logf(0.3f), logf(0.3f), logf(0.1f)};
	float rest9[N] = {0.2f, 0.2f};
	c.logp = logp9, c.rest = rest9;
	want = ref_loss(&c, x, NULL);
	ref_grad_fd(&c, hs, g);
	got = bk_loss_kl_topk(hs, w, ids, logp9, rest9, so, N, 2, H, V, K, 4, 1.0f, CAPF, dh, NULL);
	CHECK(bk_relerr(got, want, 1e-6) < 2e-5, "P=0.9: loss %.9g want %.9g", got, want);
	CHECK(max_relerr_d(dh, g, N * H, 1e-6) < 2e-4, "P=0.9: d_hidden relerr %g",
	      max_relerr_d(dh, g, N * H, 1e-6));
	/* only rest mass (k = 0): KL of {rest} vs {rest} is 0 */
	float one[N] = {1.0f, 1.0f};
	got = bk_loss_kl_topk(hs, w, ids, logp, one, so, N, 2, H, V, 0, 5, 1.0f, CAPF, dh, NULL);
	CHECK(fabs(got) < 1e-9, "k=0: loss %g", got);
	CHECK(bk_max_relerr(dh, (float[N * H]){0}, N * H, 1.0) < 1e-7, "k=0: gradient not 0");
}

/* Teacher top-k: ids, log-probs, rest against the reference; ties keep the smaller id;
 * the hidden and logits paths agree. */
static void test_teacher_topk(void)
{
	enum { N = 4, H = 6, V = 29, K = 5 };
	bk_rng rng;
	bk_rng_seed(&rng, 5);
	float w[V * H], hs[N * H], logits[N * V], logp[N * K], rest[N], logp2[N * K], rest2[N];
	int32_t ids[N * K], ids2[N * K];
	double x[N * H], z[N * V];
	fill(&rng, w, V * H, 1.0);
	fill(&rng, hs, N * H, 2.0);
	for (int i = 0; i < N * H; i++)
		x[i] = hs[i];
	const int chunks[] = {1, 4, 29, 100};
	for (int ti = 0; ti < 2; ti++) {
		double t = ti ? 2.0 : 1.0;
		ref_scaled_logits(x, w, N, H, V, t, z);
		ref_log_softmax(z, N, V);
		for (int ci = 0; ci < 4; ci++) {
			bk_teacher_topk(hs, w, NULL, N, H, V, chunks[ci], (float)t, CAPF, K, ids, logp, rest);
			int ok_order = 1;
			double lerr = 0, rerr = 0;
			for (int r = 0; r < N; r++) {
				double *row = z + (size_t)r * V, top = 0;
				for (int i = 0; i < K; i++) {
					int id = ids[r * K + i], rank = 0;
					for (int j = 0; j < V; j++)
						rank += row[j] > row[id];
					ok_order &= rank == i;
					lerr = fmax(lerr, fabs(logp[r * K + i] - row[id]));
					top += exp(row[id]);
				}
				rerr = fmax(rerr, fabs(rest[r] - (1 - top)));
			}
			CHECK(ok_order, "teacher top-k T=%g chunk=%d: ids not the top-k in order", t,
			      chunks[ci]);
			CHECK(lerr < 1e-5, "teacher top-k T=%g chunk=%d: logp error %g", t, chunks[ci],
			      lerr);
			CHECK(rerr < 1e-6, "teacher top-k T=%g chunk=%d: rest error %g", t, chunks[ci],
			      rerr);
		}
	}
	/* logits path: the same rows as raw logits (capped by the function) */
	for (int r = 0; r < N; r++)
		for (int j = 0; j < V; j++) {
			double acc = 0;
			for (int c = 0; c < H; c++)
				acc += (double)hs[r * H + c] * w[j * H + c];
			logits[r * V + j] = (float)acc;
		}
	bk_teacher_topk(hs, w, NULL, N, H, V, 8, 2.0f, CAPF, K, ids, logp, rest);
	bk_teacher_topk(NULL, NULL, logits, N, H, V, 8, 2.0f, CAPF, K, ids2, logp2, rest2);
	CHECK(memcmp(ids, ids2, sizeof(ids)) == 0, "hidden and logits paths pick different ids");
	CHECK(bk_max_relerr(logp2, logp, N * K, 1.0) < 1e-5, "hidden/logits logp differ");
	CHECK(bk_max_relerr(rest2, rest, N, 1e-3) < 1e-4, "hidden/logits rest differ");
	/* ties: equal logits keep the smaller id first, whatever the chunking */
	float tie[V];
	for (int j = 0; j < V; j++)
		tie[j] = (j % 3 == 0) ? 1.0f : 0.0f; /* ids 0,3,6,... tie at the top */
	for (int ci = 0; ci < 4; ci++) {
		bk_teacher_topk(NULL, NULL, tie, 1, 1, V, chunks[ci], 1.0f, CAPF, K, ids, logp, rest);
		int ok = 1;
		for (int i = 0; i < K; i++)
			ok &= ids[i] == 3 * i;
		CHECK(ok, "ties chunk=%d: ids %d %d %d %d %d", chunks[ci], ids[0], ids[1], ids[2], ids[3],
		      ids[4]);
		double s = rest[0];
		for (int i = 0; i < K; i++)
			s += exp(logp[i]);
		CHECK(fabs(s - 1) < 1e-6, "ties: mass sums to %.9g", s);
	}
	/* k = V: rest 0, everything sorted */
	int32_t idsv[V];
	float logpv[V];
	bk_teacher_topk(NULL, NULL, logits, 1, 1, V, 7, 1.0f, CAPF, V, idsv, logpv, rest2);
	int sorted = 1;
	for (int i = 1; i < V; i++)
		sorted &= logpv[i] <= logpv[i - 1];
	CHECK(sorted && rest2[0] == 0.0f, "k=V: sorted %d rest %g", sorted, rest2[0]);
}

static void fill_small_w(float *w, int v, int h)
{
	for (int i = 0; i < v * h; i++)
		w[i] = (float)sin(0.7 * i + 0.3);
}

/* Logits of +-1e4: no NaN or inf anywhere. */
static void test_extreme(void)
{
	enum { N = 3, H = 2, V = 37, K = 4 };
	int32_t so[N] = {0, 1, 1};
	float w[V * H], hs[N * H] = {1, 0, 0, 1, 1, 1}, ht[N * H] = {0, 1, 1, 0, -1, 1};
	float dh[N * H], logp[N * K], rest[N], tlogp[N * V], logits[N * V];
	int32_t ids[N * K];
	for (int j = 0; j < V; j++) {
		w[j * H] = (j % 2 ? 1e4f : -1e4f) * (j % 5 == 0 ? 0.5f : 1.0f);
		w[j * H + 1] = (j % 3 ? -1e4f : 1e4f);
	}
	for (int ti = 0; ti < 2; ti++) {
		float t = ti ? 2.0f : 1.0f;
		double l = bk_loss_kl_exact(hs, w, ht, NULL, so, N, 2, H, V, 5, t, CAPF, dh, NULL);
		int fin = isfinite(l) && l >= 0;
		for (int i = 0; i < N * H; i++)
			fin &= isfinite(dh[i]);
		CHECK(fin, "extreme exact T=%g: loss %g or gradient not finite", t, l);
		bk_teacher_logprobs(ht, w, N, H, V, 5, t, CAPF, tlogp);
		l = bk_loss_kl_exact(hs, w, NULL, tlogp, so, N, 2, H, V, 5, t, CAPF, dh, NULL);
		fin = isfinite(l) && l >= 0;
		for (int i = 0; i < N * H; i++)
			fin &= isfinite(dh[i]);
		CHECK(fin, "extreme exact/logp T=%g: loss %g or gradient not finite", t, l);
		bk_teacher_topk(ht, w, NULL, N, H, V, 5, t, CAPF, K, ids, logp, rest);
		fin = 1;
		for (int i = 0; i < N * K; i++)
			fin &= logp[i] <= 0 && !isnan(logp[i]);
		for (int r = 0; r < N; r++)
			fin &= rest[r] >= 0 && rest[r] <= 1;
		CHECK(fin, "extreme teacher top-k T=%g: bad logp or rest", t);
		l = bk_loss_kl_topk(hs, w, ids, logp, rest, so, N, 2, H, V, K, 5, t, CAPF, dh, NULL);
		fin = isfinite(l) && l >= -1e-6;
		for (int i = 0; i < N * H; i++)
			fin &= isfinite(dh[i]);
		CHECK(fin, "extreme sparse T=%g: loss %g or gradient not finite", t, l);
		/* student == teacher: loss 0 even at the extremes */
		l = bk_loss_kl_exact(ht, w, ht, NULL, so, N, 2, H, V, 5, t, CAPF, dh, NULL);
		CHECK(fabs(l) < 1e-6, "extreme: KL(p||p) = %g", l);
	}
	/* a one-hot teacher given as log-probs with -inf: exact mode = sparse k = 1 */
	int32_t one_id[N] = {5, 0, 36};
	float zero_lp[N] = {0, 0, 0}, zero_rest[N] = {0, 0, 0};
	for (int i = 0; i < N * V; i++)
		tlogp[i] = -INFINITY;
	for (int r = 0; r < N; r++)
		tlogp[r * V + one_id[r]] = 0.0f;
	fill_small_w(w, V, H);
	double le = bk_loss_kl_exact(hs, w, NULL, tlogp, so, N, 2, H, V, 5, 1.0f, CAPF, dh, NULL);
	double ls = bk_loss_kl_topk(hs, w, one_id, zero_lp, zero_rest, so, N, 2, H, V, 1, 5, 1.0f, CAPF,
				    NULL, NULL);
	CHECK(isfinite(le) && bk_relerr(le, ls, 1e-6) < 1e-5, "one-hot teacher with -inf: exact %g sparse %g",
	      le, ls);
	for (int i = 0; i < N * V; i++)
		logits[i] = (i % 7 == 0) ? 1e4f : -1e4f;
	bk_teacher_topk(NULL, NULL, logits, N, 1, V, 6, 1.0f, CAPF, K, ids, logp, rest);
	int fin = 1;
	for (int i = 0; i < N * K; i++)
		fin &= !isnan(logp[i]) && logp[i] <= 0;
	CHECK(fin, "extreme logits: teacher top-k logp has NaN");
}

/* No rows, or rows that all belong to a sample: weights and the zero loss. */
static void test_empty(void)
{
	float w[3 * 2] = {1, 2, 3, 4, 5, 6}, wt[4];
	double l = bk_loss_kl_exact(NULL, w, w, NULL, NULL, 0, 0, 2, 3, 2, 1.0f, CAPF, NULL, NULL);
	CHECK(l == 0.0, "no rows: loss %g", l);
	l = bk_loss_kl_topk(NULL, w, NULL, NULL, NULL, NULL, 0, 3, 2, 3, 1, 2, 1.0f, CAPF, NULL, NULL);
	CHECK(l == 0.0, "no rows (sparse): loss %g", l);
	int32_t so[4] = {2, 0, 2, 2};
	int ne = bk_loss_row_weights(so, 4, 5, wt);
	CHECK(ne == 2, "non-empty samples %d", ne);
	CHECK(fabsf(wt[0] - 1.0f / 6) < 1e-7 && fabsf(wt[1] - 0.5f) < 1e-7,
	      "weights %g %g %g %g", wt[0], wt[1], wt[2], wt[3]);
}

/* Bad input dies with exit status 1 (run in a child). */
struct fn_box {
	void (*fn)(void);
};
static void call_box(void *a) { ((struct fn_box *)a)->fn(); }

/* fn dies: exit status 1 and one line on stderr (the harness's child runner: leak
 * checks off, so what die() leaves allocated is no sanitizer error) */
static int dies(void (*fn)(void))
{
	struct fn_box b = {fn};
	char err[4096];
	int st = bk_run_child(call_box, &b, err, sizeof err);
	size_t n = strlen(err);
	return st == BK_EXIT_FAIL && n && strchr(err, '\n') == err + n - 1;
}

static void bad_duplicate(void)
{
	float w[4 * 1] = {1, 2, 3, 4}, hs[1] = {1}, lp[2] = {-1, -2}, rest[1] = {0.5f};
	int32_t ids[2] = {2, 2}, so[1] = {0};
	bk_loss_kl_topk(hs, w, ids, lp, rest, so, 1, 1, 1, 4, 2, 2, 1.0f, CAPF, NULL, NULL);
}

static void bad_sample(void)
{
	float w[4] = {1, 2, 3, 4}, hs[1] = {1};
	int32_t so[1] = {3};
	bk_loss_kl_exact(hs, w, hs, NULL, so, 1, 1, 1, 4, 2, 1.0f, CAPF, NULL, NULL);
}

static void bad_rest(void)
{
	float w[4] = {1, 2, 3, 4}, hs[1] = {1}, lp[1] = {-1}, rest[1] = {1.5f};
	int32_t ids[1] = {1}, so[1] = {0};
	bk_loss_kl_topk(hs, w, ids, lp, rest, so, 1, 1, 1, 4, 1, 2, 1.0f, CAPF, NULL, NULL);
}

/* The cap bends the loss: with a cap the loss differs from the uncapped one, and a cap
 * far above every logit gives the uncapped loss within rounding. */
static void test_cap_effect(void)
{
	enum { N = 3, H = 6, V = 19 };
	int32_t so[N] = {0, 1, 1};
	bk_rng rng;
	bk_rng_seed(&rng, 3);
	float w[V * H], hs[N * H], ht[N * H];
	fill(&rng, w, V * H, 1.0);
	fill(&rng, hs, N * H, 1.5);
	fill(&rng, ht, N * H, 1.5);
	double l0 = bk_loss_kl_exact(hs, w, ht, NULL, so, N, 2, H, V, 5, 1.0f, 0.0f, NULL, NULL);
	double l2 = bk_loss_kl_exact(hs, w, ht, NULL, so, N, 2, H, V, 5, 1.0f, 2.0f, NULL, NULL);
	double lbig = bk_loss_kl_exact(hs, w, ht, NULL, so, N, 2, H, V, 5, 1.0f, 1e4f, NULL, NULL);
	CHECK(fabs(l2 - l0) > 1e-3 * l0, "cap 2 leaves the loss %.9g (uncapped %.9g)", l2, l0);
	CHECK(bk_relerr(lbig, l0, 1e-9) < 1e-4, "cap 1e4: loss %.9g, uncapped %.9g", lbig, l0);
}

/* The row-block path (bk_loss_block_bytes) against the chunked one and the double
 * reference on rows wider than a span (V = 1000: 3 spans of 256 and a tail of 232, 8
 * lanes of the last vector) with a peaked student (logits up to +-30, so exp reaches far
 * below 1), in several blocks; the same bits from every code path this CPU runs, and
 * from one block or several; the errors against the reference are printed. */
static void test_row_blocks(void)
{
	enum { N = 9, H = 16, V = 1000, NS = 3, K = 20 };
	int32_t so[N] = {0, 0, 0, 0, 1, 1, 2, 2, 2};
	bk_rng rng;
	bk_rng_seed(&rng, 11);
	float *w = malloc((size_t)V * H * sizeof(float)), hs[N * H], ht[N * H];
	float dh[N * H], dhc[N * H], dhb[N * H], rk[N], rkc[N];
	fill(&rng, w, (size_t)V * H, 1.0);
	fill(&rng, hs, N * H, 3.0);
	fill(&rng, ht, N * H, 3.0);
	double x[N * H], rkr[N], *tl = malloc((size_t)N * V * sizeof(double));
	for (int i = 0; i < N * H; i++)
		x[i] = ht[i];
	ref_scaled_logits(x, w, N, H, V, 1.0, tl);
	ref_log_softmax(tl, N, V);
	ref_case c = {.w = w, .tl = tl, .sample_of = so, .n = N, .ns = NS, .h = H, .v = V, .t = 1.0};
	for (int i = 0; i < N * H; i++)
		x[i] = hs[i];
	double want = ref_loss(&c, x, rkr);

	size_t old = bk_loss_block_bytes(0); /* chunked */
	double lc = bk_loss_kl_exact(hs, w, ht, NULL, so, N, NS, H, V, 97, 1.0f, CAPF, dhc, rkc);
	bk_loss_block_bytes((size_t)V * 8 * 2); /* 2 rows a block: 5 blocks */
	double lb = bk_loss_kl_exact(hs, w, ht, NULL, so, N, NS, H, V, 97, 1.0f, CAPF, dhb, NULL);
	bk_loss_block_bytes(old); /* one block */
	double l1 = bk_loss_kl_exact(hs, w, ht, NULL, so, N, NS, H, V, 97, 1.0f, CAPF, dh, rk);
	double rerr = 0, cerr = 0;
	for (int r = 0; r < N; r++) {
		rerr = fmax(rerr, bk_relerr(rk[r], rkr[r], 1e-6));
		cerr = fmax(cerr, bk_relerr(rkc[r], rkr[r], 1e-6));
	}
	CHECK(lb == l1 && !memcmp(dh, dhb, sizeof dh), "row blocks: 5 blocks %.9g, one %.9g", lb, l1);
	CHECK(bk_relerr(l1, want, 1e-9) < 2e-6, "row blocks: loss %.9g want %.9g", l1, want);
	CHECK(bk_relerr(lc, want, 1e-9) < 2e-6, "chunked: loss %.9g want %.9g", lc, want);
	CHECK(rerr < 2e-5, "row blocks: row KL relerr %g", rerr);
	CHECK(bk_max_relerr(dh, dhc, N * H, 1e-6) < 2e-5, "row blocks vs chunked: d_hidden relerr %g",
	      bk_max_relerr(dh, dhc, N * H, 1e-6));
	printf("row blocks (cap %g): loss relerr %.2g (chunked %.2g), row KL %.2g (chunked %.2g), "
	       "d_hidden vs chunked %.2g\n", g_cap, bk_relerr(l1, want, 1e-9),
	       bk_relerr(lc, want, 1e-9), rerr, cerr, bk_max_relerr(dh, dhc, N * H, 1e-6));

	/* sparse: rows vs chunked */
	int32_t ids[N * K];
	float logp[N * K], rest[N];
	bk_teacher_topk(ht, w, NULL, N, H, V, 128, 1.0f, CAPF, K, ids, logp, rest);
	bk_loss_block_bytes(0);
	double sc = bk_loss_kl_topk(hs, w, ids, logp, rest, so, N, NS, H, V, K, 97, 1.0f, CAPF,
				    dhc, rkc);
	bk_loss_block_bytes((size_t)V * 4 * 4); /* 4 rows a block */
	double sb = bk_loss_kl_topk(hs, w, ids, logp, rest, so, N, NS, H, V, K, 97, 1.0f, CAPF,
				    dhb, NULL);
	bk_loss_block_bytes(old);
	double s1 = bk_loss_kl_topk(hs, w, ids, logp, rest, so, N, NS, H, V, K, 97, 1.0f, CAPF, dh,
				    rk);
	double srk = 0;
	for (int r = 0; r < N; r++)
		srk = fmax(srk, bk_relerr(rk[r], rkc[r], 1e-6));
	CHECK(sb == s1 && !memcmp(dh, dhb, sizeof dh), "sparse row blocks: 3 blocks %.9g, one %.9g",
	      sb, s1);
	CHECK(bk_relerr(s1, sc, 1e-9) < 2e-6 && srk < 2e-5, "sparse: rows %.9g chunked %.9g (row KL %g)",
	      s1, sc, srk);
	CHECK(bk_max_relerr(dh, dhc, N * H, 1e-6) < 2e-5, "sparse rows vs chunked: d_hidden relerr %g",
	      bk_max_relerr(dh, dhc, N * H, 1e-6));

	/* every code path: the same bits (dh: the exact gradient, dhs the sparse one, of the
	 * default path) */
	float dhs[N * H], dhe[N * H];
	memcpy(dhs, dh, sizeof dh);
	bk_loss_kl_exact(hs, w, ht, NULL, so, N, NS, H, V, 97, 1.0f, CAPF, dhe, NULL);
	static const char *const isas[] = {"avx512", "avx2", "sse2"};
	int paths = 0;
	for (int i = 0; i < 3; i++) {
		if (bk_host_rows_isa(isas[i]) < 0)
			continue;
		paths++;
		double li = bk_loss_kl_exact(hs, w, ht, NULL, so, N, NS, H, V, 97, 1.0f, CAPF, dhb,
					     NULL);
		CHECK(li == l1 && !memcmp(dhb, dhe, sizeof dhb),
		      "%s: exact loss %.17g, default path %.17g (or d_hidden differs)", isas[i], li, l1);
		double si = bk_loss_kl_topk(hs, w, ids, logp, rest, so, N, NS, H, V, K, 97, 1.0f, CAPF,
					    dhb, NULL);
		CHECK(si == s1 && !memcmp(dhb, dhs, sizeof dhb),
		      "%s: sparse loss %.17g, default path %.17g (or d_hidden differs)", isas[i], si, s1);
	}
	CHECK(paths >= 1, "no code path runs here");
	bk_host_rows_isa(NULL);
	free(w), free(tl);
}

static void bad_cap(void)
{
	float w[4] = {1, 2, 3, 4}, hs[1] = {1};
	int32_t so[1] = {0};
	bk_loss_kl_exact(hs, w, hs, NULL, so, 1, 1, 1, 4, 2, 1.0f, -1.0f, NULL, NULL);
}

int main(void)
{
	bk_diag_init("test_loss");
	/* every case on the row-block path (default budget), on the chunked path (budget 0)
	 * and in row blocks of a few rows (the exact loss with a teacher's hidden rows of
	 * V = 37: 3 rows a block, 6 with log-probs; V = 300: none, so chunked) */
	const size_t budgets[] = {bk_loss_block_bytes(0), 0, 37 * 4 * 6};
	for (int bi = 0; bi < 3; bi++)
	for (int ci = 0; ci < 2; ci++) {
		bk_loss_block_bytes(budgets[bi]);
		g_cap = ci ? 2.0 : 0.0;
		int32_t so1[7] = {0, 0, 0, 2, 2, 3, 3}; /* sample 1 empty, sizes 3, 2, 2 */
		test_exact(7, 8, 37, so1, 4, 1);
		int32_t so2[10];
		for (int r = 0; r < 10; r++)
			so2[r] = r < 6 ? 0 : r < 7 ? 1 : 3; /* sizes 6, 1, 0, 3 */
		test_exact(10, 12, 300, so2, 4, 2);
		test_exact_fd_self();
		test_sparse();
		test_sparse_rest_zero();
		test_teacher_topk();
		test_extreme();
		test_empty();
	}
	bk_loss_block_bytes(budgets[0]);
	for (int ci = 0; ci < 2; ci++) {
		g_cap = ci ? 2.0 : 0.0;
		test_row_blocks();
	}
	g_cap = 0;
	test_cap_effect();
	CHECK(dies(bad_cap), "a negative final logit softcap does not die");
	CHECK(dies(bad_duplicate), "a duplicate top-k id does not die");
	CHECK(dies(bad_sample), "a sample index out of range does not die");
	CHECK(dies(bad_rest), "a rest mass of 1.5 does not die");
	return bk_test_done("test_loss");
}
