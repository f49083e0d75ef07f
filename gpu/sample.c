/* sample.c - greedy and temperature + top-p sampling from one row of logits (see
 * sample.h).  The nucleus is found without sorting the whole vocabulary: a 3-way
 * partition around a pivot probability narrows the range that holds the top-p boundary,
 * then only that range and the kept tokens are sorted.  Top-k finds the K-th largest
 * probability by the same partition (a quickselect).  Probabilities are in double. */
#include "gpu/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"

bk_sample_work *bk_sample_work_new(int V)
{
	BUG_ON(V <= 0);
	bk_sample_work *w = xcalloc(1, sizeof(*w));
	w->V = V;
	w->p = xmalloc((size_t)V * sizeof(double));
	w->idx = xmalloc((size_t)V * sizeof(int32_t));
	return w;
}

void bk_sample_work_free(bk_sample_work *w)
{
	if (!w)
		return;
	free(w->p);
	free(w->idx);
	free(w);
}

int32_t bk_sample_argmax(const float *logits, int V)
{
	int32_t best = 0;
	for (int i = 0; i < V; i++) {
		if (isnan(logits[i]))
			die("sampling: logit of token %d is NaN", i);
		if (logits[i] > logits[best])
			best = i;
	}
	return best;
}

/* descending probability, then ascending id */
static int cmp_desc(const void *a, const void *b, void *ctx)
{
	const double *p = ctx;
	int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
	if (p[i] != p[j])
		return p[i] > p[j] ? -1 : 1;
	return (i > j) - (i < j);
}

static void sort_desc(int32_t *v, int n, double *p)
{
	if (n > 1)
		qsort_r(v, (size_t)n, sizeof(*v), cmp_desc, p);
}

static double median3(double a, double b, double c)
{
	if (a > b) {
		double t = a;
		a = b;
		b = t;
	}
	return c <= a ? a : c >= b ? b : c;
}

/* The k-th largest (1 <= k <= n) of p[idx[0..n)] (idx is permuted) */
static double kth_largest(const double *p, int32_t *idx, int n, int k)
{
	int lo = 0, hi = n, want = k - 1; /* want: a rank in descending order */
	while (hi - lo > 1) {
		double piv = median3(p[idx[lo]], p[idx[lo + (hi - lo) / 2]], p[idx[hi - 1]]);
		int a = lo, b = lo, c = hi; /* [lo,a) > piv, [a,b) == piv, [c,hi) < piv */
		while (b < c) {
			int32_t t = idx[b];
			if (p[t] > piv) {
				idx[b++] = idx[a];
				idx[a++] = t;
			} else if (p[t] < piv) {
				idx[b] = idx[--c];
				idx[c] = t;
			} else {
				b++;
			}
		}
		if (want < a)
			hi = a;
		else if (want < b)
			return piv;
		else
			lo = b;
	}
	return p[idx[lo]];
}

int bk_sample_nucleus(const float *logits, int V, float temperature, int top_k, float top_p,
		      bk_sample_work *w, int32_t *ids_out, double *probs_out)
{
	BUG_ON(V <= 0 || V > w->V || !(temperature > 0) || !(top_p > 0) || top_k < 0);
	double *p = w->p, mx = -INFINITY, sum = 0;
	int32_t *idx = w->idx;
	for (int i = 0; i < V; i++) {
		if (isnan(logits[i]))
			die("sampling: logit of token %d is NaN", i);
		mx = logits[i] > mx ? logits[i] : mx;
	}
	for (int i = 0; i < V; i++) {
		p[i] = exp(((double)logits[i] - mx) / temperature);
		sum += p[i];
		idx[i] = i;
	}
	for (int i = 0; i < V; i++)
		p[i] /= sum;

	/* top-k: the candidates are idx[0..n), the tokens with p >= the K-th largest, in id
	 * order; the nucleus bound is top_p of their mass (HF renormalises over them) */
	int n = V;
	double lim = top_p;
	if (top_k > 0 && top_k < V) {
		double thr = kth_largest(p, idx, V, top_k), kept = 0;
		n = 0;
		for (int i = 0; i < V; i++)
			if (p[i] >= thr) {
				idx[n++] = i;
				kept += p[i];
			}
		if (n < V)
			lim = (double)top_p * kept;
		else
			for (int i = 0; i < V; i++)
				idx[i] = i; /* every token kept: no top-k, bit for bit */
	}

	/* invariant: idx[0..lo) are kept (each more probable than, or tied with and kept
	 * before, everything in idx[lo..n)), their mass is `before` < lim; the boundary
	 * lies in idx[lo..hi); idx[hi..n) are dropped. */
	int lo = 0, hi = n, k;
	double before = 0;
	if (top_p >= 1) {
		k = n;
	} else {
		while (hi - lo > 32) {
			double piv = median3(p[idx[lo]], p[idx[lo + (hi - lo) / 2]], p[idx[hi - 1]]);
			/* Dutch flag: [lo,a) > piv, [a,b) == piv, [c,hi) < piv */
			int a = lo, b = lo, c = hi;
			double mgt = 0, meq = 0;
			while (b < c) {
				int32_t t = idx[b];
				if (p[t] > piv) {
					mgt += p[t];
					idx[b++] = idx[a];
					idx[a++] = t;
				} else if (p[t] < piv) {
					idx[b] = idx[--c];
					idx[c] = t;
				} else {
					meq += p[t];
					b++;
				}
			}
			if (a > lo && before + mgt >= lim) {
				hi = a; /* the boundary is among the larger ones */
			} else if (before + mgt + meq >= lim) {
				before += mgt; /* all larger kept; boundary among the ties */
				lo = a;
				hi = b;
				break;
			} else {
				before += mgt + meq; /* larger and tied all kept */
				lo = b;
			}
		}
		sort_desc(idx + lo, hi - lo, p);
		k = lo;
		double cum = before;
		while (k < hi && (k == 0 || cum < lim))
			cum += p[idx[k++]];
	}
	sort_desc(idx, k, p);
	if (ids_out != idx)
		memcpy(ids_out, idx, (size_t)k * sizeof(int32_t));
	if (probs_out) {
		double mass = 0;
		for (int i = 0; i < k; i++)
			mass += p[idx[i]];
		for (int i = 0; i < k; i++)
			probs_out[i] = p[idx[i]] / mass;
	}
	return k;
}

int32_t bk_sample_token(const float *logits, int V, const bk_sample_params *sp, double u,
			bk_sample_work *w)
{
	BUG_ON(sp->temperature < 0 || !(u >= 0 && u < 1));
	if (sp->temperature == 0)
		return bk_sample_argmax(logits, V);
	int k = bk_sample_nucleus(logits, V, sp->temperature, sp->top_k, sp->top_p, w, w->idx,
				  NULL);
	double mass = 0, acc = 0;
	for (int i = 0; i < k; i++)
		mass += w->p[w->idx[i]];
	double target = u * mass;
	for (int i = 0; i < k; i++) {
		acc += w->p[w->idx[i]];
		if (target < acc)
			return w->idx[i];
	}
	return w->idx[k - 1];
}

int bk_sample_is_stop(int32_t id, const int32_t *stop, int n)
{
	for (int i = 0; i < n; i++)
		if (stop[i] == id)
			return 1;
	return 0;
}
