/* test_attn_blocked.c - bk_ops_host's blocked attention (query tiles by sgemm,
 * gpu/host/host_ops.c) against the row-wise one (host_attn.h, the form test_ops checks
 * against a naive reference and finite differences) on sequences longer than a query tile
 * (64) and of odd lengths (one empty, one of one token): forward out and lse with and
 * without a prefix, backward dq/dk/dv (accumulated onto non-zero gradients); causal,
 * sliding windows (shorter than a tile, reaching into the prefix, of one key), softcap,
 * scale, GQA ratios 1, 2 and 6.  The blocked results are the same bits at 1 and 2
 * threads; the teacher's table (host_rows.h) keeps the row-wise forward.
 * Not a speed test. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/host/host_attn.h"
#include "gpu/host/host_rows.h"
#include "gpu/ops.h"
#include "tests/harness.h"

static float *rnd(bk_rng *r, size_t n, float scale)
{
	float *p = xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = scale * (float)(2 * bk_rng_uniform(r) - 1);
	return p;
}

static float *dup(const float *a, size_t n)
{
	float *p = xmalloc((n ? n : 1) * sizeof(float));
	memcpy(p, a, n * sizeof(float));
	return p;
}

/* max |a - b| / max(max |b|, floor) */
static double err(const float *a, const float *b, size_t n, double floor)
{
	double num = 0, den = floor;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(a[i]) || !isfinite(b[i]))
			return INFINITY;
		num = fmax(num, fabs((double)a[i] - b[i]));
		den = fmax(den, fabs((double)b[i]));
	}
	return num / den;
}

static double worst_fwd, worst_bwd;

static void run_case(int S, const int *lens, int NH, int NKV, int D, int P, float scale,
		     float cap, int window)
{
	bk_rng rng;
	bk_rng_seed(&rng, (uint64_t)(1000 * S + 100 * NH + 10 * P + window + 7));
	int32_t cu[16];
	cu[0] = 0;
	for (int s = 0; s < S; s++)
		cu[s + 1] = cu[s] + lens[s];
	int T = cu[S];
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, np = (size_t)P * NKV * D;
	float *q = rnd(&rng, nq, 2.0f), *k = rnd(&rng, nk, 1.0f), *v = rnd(&rng, nk, 1.0f);
	float *pk = P ? rnd(&rng, np, 1.0f) : NULL, *pv = P ? rnd(&rng, np, 1.0f) : NULL;
	bk_attn ap = bk_attn_default(D);
	if (scale > 0)
		ap.scale = scale;
	ap.softcap = cap;
	ap.window = window;
	char what[128];
	int n = snprintf(what, sizeof what, "NH=%d NKV=%d D=%d P=%d scale %g cap %g W %d lens", NH,
			 NKV, D, P, (double)ap.scale, (double)cap, window);
	for (int s = 0; s < S && n < 110; s++)
		n += snprintf(what + n, sizeof what - (size_t)n, " %d", lens[s]);

	float *o_ref = xmalloc((nq ? nq : 1) * sizeof(float)), *l_ref = xmalloc(((size_t)NH * T + 1) * sizeof(float));
	float *o_blk = xmalloc((nq ? nq : 1) * sizeof(float)), *l_blk = xmalloc(((size_t)NH * T + 1) * sizeof(float));
	float *o_1 = xmalloc((nq ? nq : 1) * sizeof(float)), *l_1 = xmalloc(((size_t)NH * T + 1) * sizeof(float));
	bk_host_attention_forward_rows(o_ref, l_ref, q, k, v, cu, S, T, NH, NKV, D, pk, pv, P, &ap);
	bk_ops_host.attention_forward(o_blk, l_blk, q, k, v, cu, S, T, NH, NKV, D, pk, pv, P, &ap);
	omp_set_num_threads(1);
	bk_ops_host.attention_forward(o_1, l_1, q, k, v, cu, S, T, NH, NKV, D, pk, pv, P, &ap);
	omp_set_num_threads(2);
	double eo = err(o_blk, o_ref, nq, 1e-3), el = err(l_blk, l_ref, (size_t)NH * T, 1.0);
	worst_fwd = fmax(worst_fwd, fmax(eo, el));
	CHECK(eo < 1e-5, "forward %s: out error %g", what, eo);
	CHECK(el < 1e-5, "forward %s: lse error %g", what, el);
	CHECK(!memcmp(o_1, o_blk, nq * sizeof(float)) &&
		      !memcmp(l_1, l_blk, (size_t)NH * T * sizeof(float)),
	      "forward %s: 1 and 2 threads differ", what);

	if (!P) {
		float *dout = rnd(&rng, nq, 1.0f);
		float *g0q = rnd(&rng, nq, 0.1f), *g0k = rnd(&rng, nk, 0.1f), *g0v = rnd(&rng, nk, 0.1f);
		float *rq = dup(g0q, nq), *rk = dup(g0k, nk), *rv = dup(g0v, nk);
		float *bq = dup(g0q, nq), *bk = dup(g0k, nk), *bv = dup(g0v, nk);
		float *cq = dup(g0q, nq), *ck = dup(g0k, nk), *cv = dup(g0v, nk);
		bk_host_attention_backward_rows(rq, rk, rv, dout, q, k, v, o_ref, l_ref, cu, S, T, NH,
						NKV, D, &ap);
		bk_ops_host.attention_backward(bq, bk, bv, dout, q, k, v, o_ref, l_ref, cu, S, T, NH,
					       NKV, D, &ap);
		omp_set_num_threads(1);
		bk_ops_host.attention_backward(cq, ck, cv, dout, q, k, v, o_ref, l_ref, cu, S, T, NH,
					       NKV, D, &ap);
		omp_set_num_threads(2);
		double e1 = err(bq, rq, nq, 1e-3), e2 = err(bk, rk, nk, 1e-3), e3 = err(bv, rv, nk, 1e-3);
		worst_bwd = fmax(worst_bwd, fmax(e1, fmax(e2, e3)));
		CHECK(e1 < 1e-4, "backward %s: dq error %g", what, e1);
		CHECK(e2 < 1e-4, "backward %s: dk error %g", what, e2);
		CHECK(e3 < 1e-4, "backward %s: dv error %g", what, e3);
		CHECK(!memcmp(cq, bq, nq * sizeof(float)) && !memcmp(ck, bk, nk * sizeof(float)) &&
			      !memcmp(cv, bv, nk * sizeof(float)),
		      "backward %s: 1 and 2 threads differ", what);
		free(dout), free(g0q), free(g0k), free(g0v), free(rq), free(rk), free(rv);
		free(bq), free(bk), free(bv), free(cq), free(ck), free(cv);
	}
	free(q), free(k), free(v), free(pk), free(pv), free(o_ref), free(l_ref), free(o_blk);
	free(l_blk), free(o_1), free(l_1);
}

int main(void)
{
	bk_diag_init("test_attn_blocked");
	omp_set_num_threads(2);
	static const int la[] = { 130, 1, 0, 77, 200 }, lb[] = { 65, 64, 63, 129 }, lc[] = { 5 };
	static const int heads[][2] = { { 2, 2 }, { 4, 2 }, { 6, 1 } };
	for (int hh = 0; hh < 3; hh++)
		for (int P = 0; P <= 70; P += 70) {
			int NH = heads[hh][0], NKV = heads[hh][1], D = hh == 2 ? 8 : 16;
			run_case(5, la, NH, NKV, D, P, 0, 0, 0);
			run_case(4, lb, NH, NKV, D, P, 0, 0, 0);
			run_case(5, la, NH, NKV, D, P, 0, 0, 50);  /* window shorter than a tile */
			run_case(5, la, NH, NKV, D, P, 0, 0, 100); /* reaches into the prefix */
			run_case(4, lb, NH, NKV, D, P, 0, 0, 1);   /* each query its own key */
			run_case(5, la, NH, NKV, D, P, 0.3f, 1.5f, 70);
			run_case(4, lb, NH, NKV, D, P, 0, 0.8f, 0);
			run_case(1, lc, NH, NKV, D, P, 0, 0, 0);
		}
	/* the teacher's batch-invariant table keeps the row-wise forward, training the blocked */
	CHECK(bk_ops_host_rows()->attention_forward == bk_host_attention_forward_rows,
	      "host_rows: attention_forward is not the row-wise one");
	CHECK(bk_ops_host.attention_forward != bk_host_attention_forward_rows,
	      "bk_ops_host: attention_forward is the row-wise one");
	printf("blocked vs row-wise attention: forward max error %.2g, backward %.2g\n", worst_fwd,
	       worst_bwd);
	return bk_test_done("test_attn_blocked");
}
