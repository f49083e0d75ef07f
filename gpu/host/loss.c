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

/* below this many elements per chunk a parallel region costs more than it saves */
#define PAR_MIN 65536

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
		double lse_rest = lse_value(mr[r], sr[r]), mt = -INFINITY, st = 0;
		const float *t = tu + (size_t)r * k;
		for (int i = 0; i < k; i++)
			if (t[i] > mt)
				mt = t[i];
		for (int i = 0; i < k && mt > -INFINITY; i++)
			st += exp(t[i] - mt);
		double l = logaddexp(lse_rest, lse_value(mt, st)), acc = 0;
		for (int i = 0; i < k; i++) {
			double pi = p[(size_t)r * k + i];
			if (pi > 0)
				acc += pi * ((double)topk_logp[(size_t)r * k + i] - (t[i] - l));
		}
		if (prest[r] > 0)
			acc += prest[r] * (log(prest[r]) - (lse_rest - l));
		lse[r] = l;
		mr[r] = lse_rest; /* mr now holds log-sum-exp over the other ids */
		kl[r] = acc;
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
