/* loss.c - host twin of the baking loss (see loss.h): chunked LM head with
 * cblas_sgemm, per-row online log-sum-exp in double, KL and its gradient.
 * Not the CUDA version; that one copies these signatures and is judged by this file.
 *
 * Invariants: a chunk buffer holds at most [N,C] floats per side; scaled logits u are
 * logits / T (divided, as torch does); row accumulators (max m, sum s) are double
 * with m always equal to a float value; the gradient w.r.t. the logits is
 * dL/du / T, the 1/T folded into the backward sgemm's alpha. */
#include "gpu/host/loss.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "gpu/host/host_rows.h" /* bk_host_rows_isa_name: the vector code path */

/* below this many elements per chunk a parallel region costs more than it saves */
#define PAR_MIN 65536

/* the row-block path's memory budget for full-vocabulary logits (bk_loss_block_bytes) */
static size_t block_budget = (size_t)256 << 20;

size_t bk_loss_block_bytes(size_t bytes)
{
	size_t old = block_budget;
	block_budget = bytes;
	return old;
}

int bk_loss_row_weights(const int32_t *sample_of, int n, int n_samples, float *w)
{
	if (n_samples < 0 || n < 0)
		BUG("loss: negative row or sample count (%d, %d)", n, n_samples);
	int *count = xcalloc(n_samples > 0 ? (size_t)n_samples : 1, sizeof(int));
	for (int r = 0; r < n; r++) {
		if (sample_of[r] < 0 || sample_of[r] >= n_samples)
			die("loss: row %d: sample index %d is not in [0, %d)", r, (int)sample_of[r],
			    n_samples);
		count[sample_of[r]]++;
	}
	int nonempty = 0;
	for (int s = 0; s < n_samples; s++)
		nonempty += count[s] > 0;
	for (int r = 0; r < n; r++)
		w[r] = (float)(1.0 / ((double)count[sample_of[r]] * nonempty));
	free(count);
	return nonempty;
}

/* u = cap(z) / T, cap(z) = tanh(z / c) * c when c > 0 (bk_loss_softcap), in place */
static void scale_chunk(float *u, size_t total, float temperature, float softcap)
{
	if (softcap > 0) {
#pragma omp parallel for schedule(static) if (total > PAR_MIN)
		for (size_t i = 0; i < total; i++)
			u[i] = bk_loss_softcap(u[i], softcap) / temperature;
	} else if (temperature != 1.0f) {
#pragma omp parallel for schedule(static) if (total > PAR_MIN)
		for (size_t i = 0; i < total; i++)
			u[i] /= temperature;
	}
}

/* u [N,C] = cap(x [N,H] @ W[c0:c0+C, :]^T) / T */
static void logits_chunk(const float *x, const float *lm_head, int n, int h, int c0, int cn,
			 float temperature, float softcap, float *u)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, cn, h, 1.0f, x, h,
		    lm_head + (size_t)c0 * h, h, 0.0f, u, cn);
	scale_chunk(u, (size_t)n * cn, temperature, softcap);
}

/* u [N,C] = cap(logits[:, c0:c0+C]) / T */
static void logits_copy(const float *logits, int n, int v, int c0, int cn, float temperature,
			float softcap, float *u)
{
#pragma omp parallel for schedule(static) if ((size_t)n * cn > PAR_MIN)
	for (int r = 0; r < n; r++) {
		const float *src = logits + (size_t)r * v + c0;
		float *dst = u + (size_t)r * cn;
		for (int j = 0; j < cn; j++)
			dst[j] = (softcap > 0 ? bk_loss_softcap(src[j], softcap) : src[j]) /
				 temperature;
	}
}

/* d cap(z) / dz = 1 - tanh^2(z / c) at a scaled logit u = cap(z) / T: with
 * t = u T / c, 1 - t^2 (1 without a cap); tc = T / c */
static inline float cap_slope(float u, float tc)
{
	float t = u * tc;
	return 1.0f - t * t;
}

/* d_hidden [N,H] (+)= (G [N,C] @ W[c0:c0+C, :]) / T */
static void backward_chunk(const float *g, const float *lm_head, int n, int h, int c0, int cn,
			   float temperature, int first, float *d_hidden)
{
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, h, cn, 1.0f / temperature, g,
		    cn, lm_head + (size_t)c0 * h, h, first ? 0.0f : 1.0f, d_hidden, h);
}

/* Fold one chunk row into the running (m, s): log-sum-exp = m + log(s). */
static void lse_add_row(const float *u, int cn, double *m, double *s)
{
	float cm = -INFINITY;
	for (int j = 0; j < cn; j++)
		if (u[j] > cm)
			cm = u[j];
	if (cm == -INFINITY)
		return;
	if (cm > *m) {
		*s *= exp(*m - cm);
		*m = cm;
	}
	float mf = (float)*m;
	double acc = 0;
	for (int j = 0; j < cn; j++)
		acc += expf(u[j] - mf);
	*s += acc;
}

static double lse_value(double m, double s) { return s > 0 ? m + log(s) : -INFINITY; }

static double logaddexp(double a, double b)
{
	if (a == -INFINITY)
		return b;
	if (b == -INFINITY)
		return a;
	double mx = a > b ? a : b;
	return mx + log1p(exp(-fabs(a - b)));
}

static void check_dims(const char *what, int n, int h, int v, int chunk, float temperature,
		       float softcap)
{
	if (n < 0 || h <= 0 || v <= 0 || chunk <= 0)
		BUG("%s: bad sizes n=%d h=%d v=%d chunk=%d", what, n, h, v, chunk);
	if (!(temperature > 0) || isinf(temperature))
		die("%s: temperature %g is not a positive number", what, (double)temperature);
	if (!(softcap >= 0) || isinf(softcap))
		die("%s: final logit softcap %g is not a positive number or 0", what,
		    (double)softcap);
}

/* the batch loss sum_r w[r] kl[r]; row_kl (if not NULL) gets each row's KL */
static double weighted_loss(const float *w, const double *kl, int n, float *row_kl)
{
	double loss = 0;
	for (int r = 0; r < n; r++) {
		loss += w[r] * kl[r];
		if (row_kl)
			row_kl[r] = (float)kl[r];
	}
	return loss;
}

/* ---- the row-block path ----
 * Rows in blocks whose full-vocabulary logits ([rows,V] per side) fit the budget
 * (bk_loss_block_bytes): one sgemm per side gives a block's logits, each row's
 * log-sum-exp, KL and gradient come from its own logits in memory, then one sgemm
 * takes the block's gradient to d_hidden.  The exact loss with a teacher's hidden rows
 * makes 3 LM-head GEMMs (the chunked path 5), the sparse loss 2 (chunked 3).
 *
 * Per row the arithmetic is one fixed sequence of float operations on that row alone
 * (never dependent on the block, the thread count or the code path):
 *   exp: vexp, a polynomial in float (Cephes expf's range reduction and coefficients,
 *     not libm's expf, so that it vectorizes): a few ulp from exp (test_loss measures
 *     it against exp in double), 0 below -87;
 *   sums: 16 float lanes (lane l takes elements j = l mod 16 in order of j) over spans
 *     of 256 elements, each span's lanes added into 16 double lanes, folded pairwise
 *     (l + 8 into l, then + 4, + 2, + 1) at the end of the row;
 *   KL_r = sum_j p_j (t_j - u_j) + (lse_s - lse_t) sum_j p_j  (the two sums as above,
 *     p_j = vexp(t_j - lse_t) with lse rounded to float, t the teacher's u or log-prob),
 *     which is sum p (log p - log q) without the rounding of two large logs per term.
 * The lane loops are OpenMP simd loops of plain float code, compiled for AVX-512F, AVX2
 * and SSE2 (the clone bk_host_rows_isa_name() names, as host_decode.c's matmul): each
 * lane's operations are the same IEEE +, -, *, / (ISO C: no contraction into FMA) at any
 * vector width, so every clone gives the same bits. */
enum { VL = 16, SPAN = 256 };
#define AI static inline __attribute__((always_inline))
/* no-trapping-math: a lane's float compare-and-select may then become a vector blend (GCC
 * if-converts only what cannot raise an FP exception otherwise, and the AVX2 and SSE2
 * clones have no masked operations).  It changes no result: no reassociation, no
 * contraction, no assumption about NaNs or infinities. */
#if defined(__GNUC__) && !defined(__clang__) /* GCC's pragma (the fuzz build is clang's) */
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif

/* exp in float: x = k ln2 + r, |r| <= ln2/2 (k rounded by the 1.5 2^23 shift), exp(r)
 * by Cephes' polynomial, times 2^k built in the exponent bits; x < -87: 0 (also -inf);
 * x > 88: exp(88); NaN: NaN.  Branch-free, so that a loop of it vectorizes. */
AI float vexp(float x)
{
	float xc = x > 88.0f ? 88.0f : x;
	xc = ((x < -87.0f) | (x != x)) ? 0.0f : xc;
	float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
	float r = (xc - kf * 0.693359375f) - kf * -2.12194440e-4f;
	float pp = 1.9875691500e-4f;
	pp = pp * r + 1.3981999507e-3f;
	pp = pp * r + 8.3334519073e-3f;
	pp = pp * r + 4.1665795894e-2f;
	pp = pp * r + 1.6666665459e-1f;
	pp = pp * r + 5.0000001201e-1f;
	float e = (pp * r) * r + r + 1.0f;
	int32_t bits = ((int32_t)kf + 127) * 8388608; /* << 23, k in [-126, 127] */
	float sc;
	memcpy(&sc, &bits, sizeof sc);
	float y = x < -87.0f ? 0.0f : e * sc;
	return x != x ? x : y;
}

AI double fold_d(const double *d) /* 16 double lanes, pairwise */
{
	double a[8], b[4];
	for (int i = 0; i < 8; i++)
		a[i] = d[i] + d[i + 8];
	for (int i = 0; i < 4; i++)
		b[i] = a[i] + a[i + 4];
	return (b[0] + b[2]) + (b[1] + b[3]);
}

AI void span_add(double *d, const float *a)
{
	for (int i = 0; i < VL; i++)
		d[i] += (double)a[i];
}

/* the largest of u[0..n) (-inf when none is larger; NaNs skipped as a > test does) */
AI float row_max_i(const float *u, int n)
{
	float m[VL];
	for (int l = 0; l < VL; l++)
		m[l] = -INFINITY;
	int j = 0;
	for (; j + VL <= n; j += VL)
#pragma omp simd
		for (int l = 0; l < VL; l++)
			m[l] = u[j + l] > m[l] ? u[j + l] : m[l];
	float mx = -INFINITY;
	for (int l = 0; l < VL; l++)
		mx = m[l] > mx ? m[l] : mx;
	for (; j < n; j++)
		mx = u[j] > mx ? u[j] : mx;
	return mx;
}

/* sum_j exp(u[j] - m) (0 when m is -inf) */
AI double row_sumexp_i(const float *u, int n, float m)
{
	if (m == -INFINITY)
		return 0.0;
	double d[VL] = { 0 };
	for (int s = 0; s < n; s += SPAN) {
		int e = s + SPAN < n ? s + SPAN : n, j = s;
		float a[VL] = { 0 };
		for (; j + VL <= e; j += VL)
#pragma omp simd
			for (int l = 0; l < VL; l++)
				a[l] += vexp(u[j + l] - m);
		for (int l = 0; j + l < e; l++) /* the row's tail: lanes past it add nothing */
			a[l] += vexp(u[j + l] - m);
		span_add(d, a);
	}
	return fold_d(d);
}

/* the terms of lane l of row_kl_i at element j (x = u[j], y = t[j]) */
AI void kl_term(float x, float y, float ls, float lt, float w, float tc, float *a, float *pa,
		float *g)
{
	float p = vexp(y - lt);
	float d = p > 0 ? y - x : 0.0f; /* p = 0: no term (y may be -inf) */
	*a += p * d;
	*pa += p;
	float gg = w * (vexp(x - ls) - p);
	*g = tc > 0 ? gg * (1.0f - (x * tc) * (x * tc)) : gg;
}

/* *A = sum p (t - u), *P = sum p, p = exp(t - lt); with grad, u[j] = w (exp(u - ls) - p)
 * times the cap's slope 1 - (u tc)^2 when tc > 0 */
AI void row_kl_i(float *u, const float *t, int n, float ls, float lt, float w, float tc,
		 int grad, double *A, double *P)
{
	double da[VL] = { 0 }, dp[VL] = { 0 };
	for (int s = 0; s < n; s += SPAN) {
		int e = s + SPAN < n ? s + SPAN : n, j = s;
		float a[VL] = { 0 }, pa[VL] = { 0 }, g[VL];
		for (; j + VL <= e; j += VL) {
#pragma omp simd
			for (int l = 0; l < VL; l++)
				kl_term(u[j + l], t[j + l], ls, lt, w, tc, &a[l], &pa[l], &g[l]);
			if (grad)
				memcpy(u + j, g, sizeof g);
		}
		for (int l = 0; j + l < e; l++) {
			kl_term(u[j + l], t[j + l], ls, lt, w, tc, &a[l], &pa[l], &g[l]);
			if (grad)
				u[j + l] = g[l];
		}
		span_add(da, a);
		span_add(dp, pa);
	}
	*A = fold_d(da);
	*P = fold_d(dp);
}

/* u[j] = c exp(u[j] - l) times the cap's slope 1 - (u tc)^2 when tc > 0 */
AI void row_grad_i(float *u, int n, float c, float l, float tc)
{
#pragma omp simd
	for (int j = 0; j < n; j++) {
		float x = u[j], g = c * vexp(x - l);
		u[j] = tc > 0 ? g * (1.0f - (x * tc) * (x * tc)) : g;
	}
}

typedef struct {
	const char *name;
	float (*max)(const float *u, int n);
	double (*sumexp)(const float *u, int n, float m);
	void (*kl)(float *u, const float *t, int n, float ls, float lt, float w, float tc,
		   int grad, double *A, double *P);
	void (*grad)(float *u, int n, float c, float l, float tc);
} row_kern;

#define BK_ROW_KERN(isa, T)                                                                  \
	T static float isa##_max(const float *u, int n) { return row_max_i(u, n); }          \
	T static double isa##_sumexp(const float *u, int n, float m)                         \
	{                                                                                    \
		return row_sumexp_i(u, n, m);                                                \
	}                                                                                    \
	T static void isa##_kl(float *u, const float *t, int n, float ls, float lt, float w,  \
			       float tc, int grad, double *A, double *P)                     \
	{                                                                                    \
		row_kl_i(u, t, n, ls, lt, w, tc, grad, A, P);                                \
	}                                                                                    \
	T static void isa##_grad(float *u, int n, float c, float l, float tc)                \
	{                                                                                    \
		row_grad_i(u, n, c, l, tc);                                                  \
	}

BK_ROW_KERN(r512, __attribute__((target("avx512f"))))
BK_ROW_KERN(r256, __attribute__((target("avx2"))))
BK_ROW_KERN(r128, )
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

static const row_kern row_kerns[] = {
	{ "avx512", r512_max, r512_sumexp, r512_kl, r512_grad },
	{ "avx2", r256_max, r256_sumexp, r256_kl, r256_grad },
	{ "sse2", r128_max, r128_sumexp, r128_kl, r128_grad },
};

static const row_kern *row_kern_pick(void)
{
	const char *isa = bk_host_rows_isa_name();
	for (size_t i = 0; i < sizeof row_kerns / sizeof row_kerns[0]; i++)
		if (!strcmp(isa, row_kerns[i].name))
			return &row_kerns[i];
	BUG("loss: no row kernels for code path %s", isa);
}

/* u [n] = cap(u) / T in place (scale_chunk for one row) */
static void scale_row(float *u, int n, float temperature, float softcap)
{
	if (softcap > 0)
		for (int j = 0; j < n; j++)
			u[j] = bk_loss_softcap(u[j], softcap) / temperature;
	else if (temperature != 1.0f)
		for (int j = 0; j < n; j++)
			u[j] /= temperature;
}

/* rows in a block of the row-block path (0: the rows do not fit, take the chunked path) */
static int block_rows(int n, int v, int sides)
{
	size_t per_row = (size_t)v * sizeof(float) * (size_t)sides;
	size_t nb = block_budget / per_row;
	return nb < 1 ? 0 : nb < (size_t)n ? (int)nb : n;
}

/* bk_loss_kl_exact's row-block path: kl [N] out (unweighted), d_hidden overwritten */
static void kl_exact_rows(const float *hidden, const float *lm_head, const float *teacher_hidden,
			  const float *teacher_logp, int n, int h, int v, int nb,
			  float temperature, float softcap, const float *w, float *d_hidden,
			  double *kl)
{
	const row_kern *rk = row_kern_pick();
	float tc = softcap > 0 ? temperature / softcap : 0.0f;
	float *us = xmalloc((size_t)nb * v * sizeof(float)); /* [nb,V] student u, then G */
	float *ut = teacher_hidden ? xmalloc((size_t)nb * v * sizeof(float)) : NULL;
	for (int r0 = 0; r0 < n; r0 += nb) {
		int rn = n - r0 < nb ? n - r0 : nb;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rn, v, h, 1.0f,
			    hidden + (size_t)r0 * h, h, lm_head, h, 0.0f, us, v);
		if (ut)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rn, v, h, 1.0f,
				    teacher_hidden + (size_t)r0 * h, h, lm_head, h, 0.0f, ut, v);
#pragma omp parallel for schedule(static) if ((size_t)rn * v > PAR_MIN)
		for (int r = 0; r < rn; r++) {
			float *u = us + (size_t)r * v, *tw = ut ? ut + (size_t)r * v : NULL;
			const float *t = tw ? tw : teacher_logp + (size_t)(r0 + r) * v;
			scale_row(u, v, temperature, softcap);
			float mu = rk->max(u, v);
			double lse_s = lse_value(mu, rk->sumexp(u, v, mu)), lse_t = 0.0;
			if (tw) {
				scale_row(tw, v, temperature, softcap);
				float mt = rk->max(tw, v);
				lse_t = lse_value(mt, rk->sumexp(tw, v, mt));
			}
			double A, P;
			rk->kl(u, t, v, (float)lse_s, (float)lse_t, w[r0 + r], tc, d_hidden != NULL,
			       &A, &P);
			kl[r0 + r] = A + (lse_s - lse_t) * P;
		}
		if (d_hidden)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rn, h, v,
				    1.0f / temperature, us, v, lm_head, h, 0.0f,
				    d_hidden + (size_t)r0 * h, h);
	}
	free(us), free(ut);
}

double bk_loss_kl_exact(const float *hidden, const float *lm_head, const float *teacher_hidden,
			const float *teacher_logp, const int32_t *sample_of, int n, int n_samples,
			int h, int v, int chunk, float temperature, float softcap, float *d_hidden,
			float *row_kl)
{
	check_dims("exact loss", n, h, v, chunk, temperature, softcap);
	if (!teacher_hidden == !teacher_logp)
		BUG("exact loss: give exactly one of teacher hidden rows and teacher log-probs");
	if (n == 0)
		return 0.0;
	float *w = xmalloc((size_t)n * sizeof(float));
	bk_loss_row_weights(sample_of, n, n_samples, w);
	int nb = block_rows(n, v, teacher_hidden ? 2 : 1);
	if (nb > 0) {
		double *klr = xmalloc((size_t)n * sizeof(double));
		kl_exact_rows(hidden, lm_head, teacher_hidden, teacher_logp, n, h, v, nb,
			      temperature, softcap, w, d_hidden, klr);
		double loss = weighted_loss(w, klr, n, row_kl);
		free(w), free(klr);
		return loss;
	}

	/* the chunked path: two passes over the vocabulary */
	int cmax = chunk < v ? chunk : v;
	float *us = xmalloc((size_t)n * cmax * sizeof(float)); /* [N,C] student u, then G */
	float *ut = teacher_hidden ? xmalloc((size_t)n * cmax * sizeof(float)) : NULL; /* [N,C] */
	double *ms = xmalloc((size_t)n * sizeof(double)), *ss = xcalloc((size_t)n, sizeof(double));
	double *mt = xmalloc((size_t)n * sizeof(double)), *st = xcalloc((size_t)n, sizeof(double));
	double *kl = xcalloc((size_t)n, sizeof(double));
	for (int r = 0; r < n; r++)
		ms[r] = mt[r] = -INFINITY;

	/* pass 1: log-sum-exp of both sides */
	for (int c0 = 0; c0 < v; c0 += cmax) {
		int cn = v - c0 < cmax ? v - c0 : cmax;
		logits_chunk(hidden, lm_head, n, h, c0, cn, temperature, softcap, us);
		if (ut)
			logits_chunk(teacher_hidden, lm_head, n, h, c0, cn, temperature, softcap, ut);
#pragma omp parallel for schedule(static) if ((size_t)n * cn > PAR_MIN)
		for (int r = 0; r < n; r++) {
			lse_add_row(us + (size_t)r * cn, cn, &ms[r], &ss[r]);
			if (ut)
				lse_add_row(ut + (size_t)r * cn, cn, &mt[r], &st[r]);
		}
	}
	for (int r = 0; r < n; r++) {
		ms[r] = lse_value(ms[r], ss[r]); /* ms, mt now hold the log-sum-exps */
		mt[r] = ut ? lse_value(mt[r], st[r]) : 0.0;
	}

	/* pass 2: KL and dL/du = w (q - p), times the cap's slope: dL/dz T */
	float tc = softcap > 0 ? temperature / softcap : 0.0f;
	for (int c0 = 0; c0 < v; c0 += cmax) {
		int cn = v - c0 < cmax ? v - c0 : cmax;
		logits_chunk(hidden, lm_head, n, h, c0, cn, temperature, softcap, us);
		if (ut)
			logits_chunk(teacher_hidden, lm_head, n, h, c0, cn, temperature, softcap, ut);
#pragma omp parallel for schedule(static) if ((size_t)n * cn > PAR_MIN)
		for (int r = 0; r < n; r++) {
			float *u = us + (size_t)r * cn;
			const float *t = ut ? ut + (size_t)r * cn : teacher_logp + (size_t)r * v + c0;
			double lse_s = ms[r], lse_t = mt[r], acc = 0;
			for (int j = 0; j < cn; j++) {
				double ls = (double)u[j] - lse_s, lt = (double)t[j] - lse_t;
				float q = expf((float)ls), p = expf((float)lt);
				if (p > 0)
					acc += p * (lt - ls);
				float g = w[r] * (q - p);
				u[j] = softcap > 0 ? g * cap_slope(u[j], tc) : g;
			}
			kl[r] += acc;
		}
		if (d_hidden)
			backward_chunk(us, lm_head, n, h, c0, cn, temperature, c0 == 0, d_hidden);
	}

	double loss = weighted_loss(w, kl, n, row_kl);
	free(w), free(us), free(ut), free(ms), free(ss), free(mt), free(st), free(kl);
	return loss;
}

/* order [K] = 0..K-1 sorted by ids[order[i]]; dies on an id out of range or repeated */
typedef struct {
	int32_t id, i;
} id_index;

static int cmp_id_index(const void *a, const void *b)
{
	int32_t x = ((const id_index *)a)->id, y = ((const id_index *)b)->id;
	return (x > y) - (x < y);
}

static void topk_order(const int32_t *ids /* [N,K] */, int n, int k, int v,
		       int32_t *order /* [N,K] */)
{
	id_index *tmp = xmalloc((k ? (size_t)k : 1) * sizeof(*tmp));
	for (int r = 0; r < n; r++) {
		const int32_t *id = ids + (size_t)r * k;
		for (int i = 0; i < k; i++) {
			if (id[i] < 0 || id[i] >= v)
				die("sparse loss: row %d: top-k id %d is not in [0, %d)", r, (int)id[i], v);
			tmp[i].id = id[i], tmp[i].i = i;
		}
		qsort(tmp, (size_t)k, sizeof(*tmp), cmp_id_index);
		for (int i = 0; i < k; i++) {
			if (i > 0 && tmp[i].id == tmp[i - 1].id)
				die("sparse loss: row %d: top-k id %d appears twice", r, (int)tmp[i].id);
			order[(size_t)r * k + i] = tmp[i].i;
		}
	}
	free(tmp);
}

/* One row of the top-k KL, both paths: t [K] the student's u at the ids, lse_rest the
 * log-sum-exp of u over the other ids; *l gets the whole row's log-sum-exp; returns
 * sum_i p_i (logp_i - (t_i - l)) + prest (log prest - (lse_rest - l)). */
static double topk_row_kl(const float *t, int k, double lse_rest, const double *p,
			  const float *logp, double prest, double *l)
{
	double mt = -INFINITY, st = 0;
	for (int i = 0; i < k; i++)
		if (t[i] > mt)
			mt = t[i];
	for (int i = 0; i < k && mt > -INFINITY; i++)
		st += exp(t[i] - mt);
	*l = logaddexp(lse_rest, lse_value(mt, st));
	double acc = 0;
	for (int i = 0; i < k; i++)
		if (p[i] > 0)
			acc += p[i] * ((double)logp[i] - (t[i] - *l));
	if (prest > 0)
		acc += prest * (log(prest) - (lse_rest - *l));
	return acc;
}

/* bk_loss_kl_topk's row-block path (the chunked path's arithmetic per row, on the whole
 * row): the student u at the ids into tu, the log-sum-exp over the other ids, KL, then
 * dL/du = w (P q - prest q / q_rest) = w q (P - prest e^(l - l_rest)) at the other ids
 * (one exp each) and w (P q - p) at the ids, times the cap's slope; kl [N] out */
static void kl_topk_rows(const float *hidden, const float *lm_head, const int32_t *topk_ids,
			 const float *topk_logp, int n, int h, int v, int k, int nb,
			 float temperature, float softcap, const float *w, const double *p,
			 const double *prest, const double *ptot, float *tu, float *d_hidden,
			 double *kl)
{
	const row_kern *rk = row_kern_pick();
	float tc = softcap > 0 ? temperature / softcap : 0.0f;
	float *us = xmalloc((size_t)nb * v * sizeof(float)); /* [nb,V] u, then G */
	for (int r0 = 0; r0 < n; r0 += nb) {
		int rn = n - r0 < nb ? n - r0 : nb;
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rn, v, h, 1.0f,
			    hidden + (size_t)r0 * h, h, lm_head, h, 0.0f, us, v);
#pragma omp parallel for schedule(static) if ((size_t)rn * v > PAR_MIN)
		for (int rr = 0; rr < rn; rr++) {
			int r = r0 + rr;
			float *u = us + (size_t)rr * v, *t = tu + (size_t)r * k;
			const int32_t *id = topk_ids + (size_t)r * k;
			scale_row(u, v, temperature, softcap);
			for (int i = 0; i < k; i++) {
				t[i] = u[id[i]];
				u[id[i]] = -INFINITY;
			}
			float mr = rk->max(u, v);
			double lse_rest = lse_value(mr, rk->sumexp(u, v, mr)), l;
			kl[r] = topk_row_kl(t, k, lse_rest, p + (size_t)r * k,
					    topk_logp + (size_t)r * k, prest[r], &l);
			if (!d_hidden)
				continue;
			double cf = ptot[r];
			if (prest[r] > 0 && lse_rest > -INFINITY)
				cf -= prest[r] * exp(l - lse_rest);
			rk->grad(u, v, (float)(w[r] * cf), (float)l, tc);
			for (int i = 0; i < k; i++) {
				double q = exp((double)t[i] - l);
				float gi = w[r] * (float)(ptot[r] * q - p[(size_t)r * k + i]);
				u[id[i]] = softcap > 0 ? gi * cap_slope(t[i], tc) : gi;
			}
		}
		if (d_hidden)
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rn, h, v,
				    1.0f / temperature, us, v, lm_head, h, 0.0f,
				    d_hidden + (size_t)r0 * h, h);
	}
	free(us);
}

double bk_loss_kl_topk(const float *hidden, const float *lm_head, const int32_t *topk_ids,
		       const float *topk_logp, const float *rest, const int32_t *sample_of, int n,
		       int n_samples, int h, int v, int k, int chunk, float temperature,
		       float softcap, float *d_hidden, float *row_kl)
{
	check_dims("sparse loss", n, h, v, chunk, temperature, softcap);
	if (k < 0 || k > v)
		die("sparse loss: top-k count %d is not in [0, %d]", k, v);
	if (n == 0)
		return 0.0;
	float *w = xmalloc((size_t)n * sizeof(float));
	bk_loss_row_weights(sample_of, n, n_samples, w);
	size_t nk = (size_t)n * k;
	int32_t *order = xmalloc((nk ? nk : 1) * sizeof(int32_t));
	topk_order(topk_ids, n, k, v, order);

	double *p = xmalloc((nk ? nk : 1) * sizeof(double));  /* [N,K] teacher probabilities */
	float *tu = xmalloc((nk ? nk : 1) * sizeof(float));   /* [N,K] student u at the ids */
	double *prest = xmalloc((size_t)n * sizeof(double));  /* [N] rest mass used */
	double *ptot = xmalloc((size_t)n * sizeof(double));   /* [N] P = sum p + prest */
	for (int r = 0; r < n; r++) {
		double pr = rest[r];
		if (!(pr >= -1e-4 && pr <= 1 + 1e-4))
			die("sparse loss: row %d: teacher rest mass %g is not in [0, 1]", r, pr);
		prest[r] = (k == v || pr < 0) ? 0.0 : pr > 1 ? 1.0 : pr;
		double sum = prest[r];
		for (int i = 0; i < k; i++) {
			double lp = topk_logp[(size_t)r * k + i];
			if (isnan(lp) || lp > 1e-4)
				die("sparse loss: row %d: teacher log-prob %g is not <= 0", r, lp);
			p[(size_t)r * k + i] = exp(lp);
			sum += p[(size_t)r * k + i];
		}
		ptot[r] = sum;
	}

	int nb = block_rows(n, v, 1);
	if (nb > 0) {
		double *klr = xmalloc((size_t)n * sizeof(double));
		kl_topk_rows(hidden, lm_head, topk_ids, topk_logp, n, h, v, k, nb, temperature,
			     softcap, w, p, prest, ptot, tu, d_hidden, klr);
		double loss = weighted_loss(w, klr, n, row_kl);
		free(w), free(order), free(p), free(tu), free(prest), free(ptot), free(klr);
		return loss;
	}

	/* the chunked path: two passes over the vocabulary */
	int cmax = chunk < v ? chunk : v;
	float *us = xmalloc((size_t)n * cmax * sizeof(float)); /* [N,C] u, then G */
	int *cur = xcalloc((size_t)n, sizeof(int));
	double *mr = xmalloc((size_t)n * sizeof(double)), *sr = xcalloc((size_t)n, sizeof(double));
	double *lse = xmalloc((size_t)n * sizeof(double)), *kl = xmalloc((size_t)n * sizeof(double));
	for (int r = 0; r < n; r++)
		mr[r] = -INFINITY;

	/* pass 1: student u at the ids, log-sum-exp over the other ids */
	for (int c0 = 0; c0 < v; c0 += cmax) {
		int cn = v - c0 < cmax ? v - c0 : cmax;
		logits_chunk(hidden, lm_head, n, h, c0, cn, temperature, softcap, us);
#pragma omp parallel for schedule(static) if ((size_t)n * cn > PAR_MIN)
		for (int r = 0; r < n; r++) {
			float *u = us + (size_t)r * cn;
			const int32_t *id = topk_ids + (size_t)r * k, *o = order + (size_t)r * k;
			int c = cur[r];
			for (; c < k && id[o[c]] < c0 + cn; c++) {
				tu[(size_t)r * k + o[c]] = u[id[o[c]] - c0];
				u[id[o[c]] - c0] = -INFINITY;
			}
			cur[r] = c;
			lse_add_row(u, cn, &mr[r], &sr[r]);
		}
	}
#pragma omp parallel for schedule(static) if ((size_t)n * (k + 1) > PAR_MIN / 16)
	for (int r = 0; r < n; r++) {
		double lse_rest = lse_value(mr[r], sr[r]), l;
		kl[r] = topk_row_kl(tu + (size_t)r * k, k, lse_rest, p + (size_t)r * k,
				    topk_logp + (size_t)r * k, prest[r], &l);
		lse[r] = l;
		mr[r] = lse_rest; /* mr now holds log-sum-exp over the other ids */
	}

	/* pass 2: dL/du = w (P q - p) at the ids, w (P q - prest q / q_rest) elsewhere,
	 * times the cap's slope */
	if (d_hidden) {
		float tc = softcap > 0 ? temperature / softcap : 0.0f;
		memset(cur, 0, (size_t)n * sizeof(int));
		for (int c0 = 0; c0 < v; c0 += cmax) {
			int cn = v - c0 < cmax ? v - c0 : cmax;
			logits_chunk(hidden, lm_head, n, h, c0, cn, temperature, softcap, us);
#pragma omp parallel for schedule(static) if ((size_t)n * cn > PAR_MIN)
			for (int r = 0; r < n; r++) {
				float *u = us + (size_t)r * cn;
				const int32_t *id = topk_ids + (size_t)r * k, *o = order + (size_t)r * k;
				int c_begin = cur[r], c_end = c_begin;
				for (; c_end < k && id[o[c_end]] < c0 + cn; c_end++)
					u[id[o[c_end]] - c0] = -INFINITY;
				cur[r] = c_end;
				float wr = w[r];
				double l = lse[r], lr = mr[r], pt = ptot[r], pr = prest[r];
				for (int j = 0; j < cn; j++) {
					double g = pt * expf((float)((double)u[j] - l));
					if (pr > 0)
						g -= pr * expf((float)((double)u[j] - lr));
					float gj = wr * (float)g;
					u[j] = softcap > 0 ? gj * cap_slope(u[j], tc) : gj;
				}
				for (int c = c_begin; c < c_end; c++) {
					size_t i = (size_t)r * k + o[c];
					double q = exp((double)tu[i] - l);
					float gi = wr * (float)(pt * q - p[i]);
					u[id[o[c]] - c0] = softcap > 0 ? gi * cap_slope(tu[i], tc) : gi;
				}
			}
			backward_chunk(us, lm_head, n, h, c0, cn, temperature, c0 == 0, d_hidden);
		}
	}

	double loss = weighted_loss(w, kl, n, row_kl);
	free(w), free(order), free(p), free(tu), free(prest), free(ptot), free(us), free(cur);
	free(mr), free(sr), free(lse), free(kl);
	return loss;
}

/* Min-heap of the K best (value, id) so far; "worse" = smaller value, or equal value
 * and larger id, so ties keep the smaller id. */
static int worse(float va, int32_t ia, float vb, int32_t ib)
{
	return va < vb || (va == vb && ia > ib);
}

static void heap_sift_down(float *hv, int32_t *hi, int cnt, int i)
{
	for (;;) {
		int l = 2 * i + 1, rr = l + 1, m = i;
		if (l < cnt && worse(hv[l], hi[l], hv[m], hi[m]))
			m = l;
		if (rr < cnt && worse(hv[rr], hi[rr], hv[m], hi[m]))
			m = rr;
		if (m == i)
			return;
		float tv = hv[i];
		int32_t ti = hi[i];
		hv[i] = hv[m], hi[i] = hi[m], hv[m] = tv, hi[m] = ti;
		i = m;
	}
}

static void heap_push(float *hv, int32_t *hi, int *cnt, float x, int32_t id)
{
	int i = (*cnt)++;
	hv[i] = x, hi[i] = id;
	while (i > 0) {
		int par = (i - 1) / 2;
		if (!worse(hv[i], hi[i], hv[par], hi[par]))
			break;
		float tv = hv[i];
		int32_t ti = hi[i];
		hv[i] = hv[par], hi[i] = hi[par], hv[par] = tv, hi[par] = ti;
		i = par;
	}
}

/* one element into the running (m, s) */
static void lse_add_one(double x, double *m, double *s)
{
	if (x == -INFINITY)
		return;
	if (x > *m) {
		*s = *s * exp(*m - x) + 1.0;
		*m = x;
	} else {
		*s += exp(x - *m);
	}
}

typedef struct {
	float v;
	int32_t id;
} topk_entry;

static int cmp_entry_desc(const void *a, const void *b)
{
	const topk_entry *x = a, *y = b;
	if (x->v != y->v)
		return x->v > y->v ? -1 : 1;
	return (x->id > y->id) - (x->id < y->id);
}

void bk_teacher_topk(const float *hidden, const float *lm_head, const float *logits, int n, int h,
		     int v, int chunk, float temperature, float softcap, int k, int32_t *ids,
		     float *logp, float *rest)
{
	check_dims("teacher top-k", n, h, v, chunk, temperature, softcap);
	if (!hidden == !logits)
		BUG("teacher top-k: give exactly one of hidden rows and logits");
	if (k < 1 || k > v)
		die("teacher top-k: k %d is not in [1, %d]", k, v);
	if (n == 0)
		return;
	int cmax = chunk < v ? chunk : v;
	float *us = xmalloc((size_t)n * cmax * sizeof(float)); /* [N,C] */
	float *hv = xmalloc((size_t)n * k * sizeof(float));     /* [N,K] heap values */
	int32_t *hi = xmalloc((size_t)n * k * sizeof(int32_t)); /* [N,K] heap ids */
	int *cnt = xcalloc((size_t)n, sizeof(int));
	double *mr = xmalloc((size_t)n * sizeof(double)), *sr = xcalloc((size_t)n, sizeof(double));
	for (int r = 0; r < n; r++)
		mr[r] = -INFINITY;

	for (int c0 = 0; c0 < v; c0 += cmax) {
		int cn = v - c0 < cmax ? v - c0 : cmax;
		if (hidden)
			logits_chunk(hidden, lm_head, n, h, c0, cn, temperature, softcap, us);
		else
			logits_copy(logits, n, v, c0, cn, temperature, softcap, us);
#pragma omp parallel for schedule(static) if ((size_t)n * cn > PAR_MIN)
		for (int r = 0; r < n; r++) {
			const float *u = us + (size_t)r * cn;
			float *rv = hv + (size_t)r * k;
			int32_t *ri = hi + (size_t)r * k;
			for (int j = 0; j < cn; j++) {
				int32_t id = c0 + j;
				if (cnt[r] < k) {
					heap_push(rv, ri, &cnt[r], u[j], id);
				} else if (worse(rv[0], ri[0], u[j], id)) {
					lse_add_one(rv[0], &mr[r], &sr[r]); /* evicted: now "rest" */
					rv[0] = u[j], ri[0] = id;
					heap_sift_down(rv, ri, k, 0);
				} else {
					lse_add_one(u[j], &mr[r], &sr[r]);
				}
			}
		}
	}

#pragma omp parallel for schedule(static) if ((size_t)n * k > PAR_MIN / 16)
	for (int r = 0; r < n; r++) {
		topk_entry *e = xmalloc((size_t)k * sizeof(*e));
		double mt = -INFINITY, st = 0;
		for (int i = 0; i < k; i++) {
			e[i].v = hv[(size_t)r * k + i], e[i].id = hi[(size_t)r * k + i];
			lse_add_one(e[i].v, &mt, &st);
		}
		qsort(e, (size_t)k, sizeof(*e), cmp_entry_desc);
		double lse_rest = lse_value(mr[r], sr[r]);
		double l = logaddexp(lse_rest, lse_value(mt, st));
		for (int i = 0; i < k; i++) {
			ids[(size_t)r * k + i] = e[i].id;
			logp[(size_t)r * k + i] = (float)((double)e[i].v - l);
		}
		rest[r] = lse_rest == -INFINITY ? 0.0f : (float)exp(lse_rest - l);
		free(e);
	}
	free(us), free(hv), free(hi), free(cnt), free(mr), free(sr);
}

void bk_teacher_logprobs(const float *hidden, const float *lm_head, int n, int h, int v,
			 int chunk, float temperature, float softcap, float *logp)
{
	check_dims("teacher log-probs", n, h, v, chunk, temperature, softcap);
	if (n == 0)
		return;
	int cmax = chunk < v ? chunk : v;
	float *us = xmalloc((size_t)n * cmax * sizeof(float)); /* [N,C] */
	double *m = xmalloc((size_t)n * sizeof(double)), *s = xcalloc((size_t)n, sizeof(double));
	for (int r = 0; r < n; r++)
		m[r] = -INFINITY;
	for (int c0 = 0; c0 < v; c0 += cmax) {
		int cn = v - c0 < cmax ? v - c0 : cmax;
		logits_chunk(hidden, lm_head, n, h, c0, cn, temperature, softcap, us);
#pragma omp parallel for schedule(static) if ((size_t)n * cn > PAR_MIN)
		for (int r = 0; r < n; r++)
			lse_add_row(us + (size_t)r * cn, cn, &m[r], &s[r]);
	}
	for (int r = 0; r < n; r++)
		m[r] = lse_value(m[r], s[r]);
	for (int c0 = 0; c0 < v; c0 += cmax) {
		int cn = v - c0 < cmax ? v - c0 : cmax;
		logits_chunk(hidden, lm_head, n, h, c0, cn, temperature, softcap, us);
#pragma omp parallel for schedule(static) if ((size_t)n * cn > PAR_MIN)
		for (int r = 0; r < n; r++)
			for (int j = 0; j < cn; j++)
				logp[(size_t)r * v + c0 + j] =
					(float)((double)us[(size_t)r * cn + j] - m[r]);
	}
	free(us), free(m), free(s);
}
