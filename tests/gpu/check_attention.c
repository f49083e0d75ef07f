/* check_attention.c - on a GPU: the CUDA fused attention (gpu/cuda/cuda_attention.cu; with the
 * attention parameters scale, softcap and sliding window too) and the
 * CUDA row and loss ops (gpu/cuda/cuda_loss.cu) against the host twin on the same random
 * inputs; then the attention's speed.  One line per case and output; exit 1 on any
 * failure (NaN never passes: every output is poisoned with NaN before the run, fenced by
 * sentinels that catch out-of-bounds writes).  Not the other ops (test_cuda_ops.c).
 *
 * Attention cases: sequences of 1, 7, 100 and 257 tokens packed (T = 365, and T = 1),
 * GQA ratios 1, 4, 8, D = 8, 64, 128, with and without a 37-token prefix (forward);
 * backward with dq/dk/dv starting from random values (they accumulate).  The CUDA
 * attention computes in fp32, so its bounds are fp32 bounds (other summation order):
 *   out, dq, dk, dv: max|cuda - host| / max(max|host|, 1e-3) <= 1e-4;  lse: max abs <= 1e-4.
 * Loss cases: base weights and hidden rows are rounded to bf16 before both runs, so the
 * GPU's bf16 GEMM inputs are exact and only fp32 accumulation order and the bf16 rounding
 * of dlogits differ:
 *   loss: relative 2e-3;  row_kl: max abs / max(max|host|, 1e-3) 2e-3;
 *   d_hidden: max abs / max|host| 1e-2 (dlogits rounded to bf16, 2^-9 each);
 *   teacher_logprobs: max abs 1e-3;  gather / scatter: bit-equal;
 *   teacher_topk: ids distinct, in descending order of the host's log-probs within 1e-3,
 *     each at least the host's K-th largest log-prob - 1e-3 (near-ties may swap), logp
 *     within 1e-3 of the host's full log-probs at those ids, rest within 1e-3.
 * Timing: forward and backward at 16 sequences x 256 tokens, 32 heads, 4 KV heads, D 64
 * (causal FLOPs: forward 4 D sum_s L_s (L_s + 1) / 2 per head, backward 2.5x forward).
 * --tiny (tests/gpu/run.sh --emu: the CPU's emulation of the GPU): the same cases at
 * small sizes: sequences of 1, 7 and 33 tokens, heads 2/2, 4/1 and 8/1 (the same GQA
 * ratios), the Llama-2-vocabulary loss case with 8 rows, the timing at 2 x 32 tokens,
 * 4/2 heads of 64.
 * Usage: check_attention [--no-bench] [--tiny] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/diag.h"
#include "common/rng.h"
#include "formats/safetensors.h"
#include "gpu/cuda/cuda.h"
#include "gpu/host/loss.h"
#include "gpu/ops.h"
#include "tests/gpu/gpu_check.h"

#ifndef BK_HAVE_CUDA
#error "check_attention needs a CUDA build (BK_HAVE_CUDA)"
#endif

#define TOL_ATT 1e-4
#define TOL_LSE 1e-4
#define TOL_LOSS 2e-3
#define TOL_ROWKL 2e-3
#define TOL_DHID 1e-2
#define TOL_LOGP 1e-3

static const bk_ops *H = &bk_ops_host, *G = &bk_ops_cuda;
static bk_rng rng;
static int n_fail, n_lines;

static void report(const char *op, const char *size, const char *what, double err, double tol,
		   int damage)
{
	int ok = !damage && err <= tol; /* NaN / inf err fails */
	n_lines++;
	n_fail += !ok;
	printf("%-18s %-40s %-8s err %-10.3g bound %-8.1g%s %s\n", op, size, what, err, tol,
	       damage ? " sentinel damaged" : "", ok ? "ok" : "FAIL");
}

/* ---- attention ---- */

/* ap: the attention parameters (scale, softcap, window) of both sides */
static void check_attention_p(const int *lens, int S, int NH, int NKV, int D, int P,
			      const bk_attn *ap)
{
	int32_t cu[8];
	cu[0] = 0;
	for (int s = 0; s < S; s++)
		cu[s + 1] = cu[s] + lens[s];
	int T = cu[S];
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, np = (size_t)P * NKV * D;
	size_t nl = (size_t)NH * T;
	char size[96];
	snprintf(size, sizeof size, "T=%d S=%d NH=%d NKV=%d D=%d P=%d s%.3g c%g W%d", T, S, NH,
		 NKV, D, P, (double)ap->scale, (double)ap->softcap, ap->window);
	float *q = gc_rand(&rng, nq, 1.5f), *k = gc_rand(&rng, nk, 1.5f),
	      *v = gc_rand(&rng, nk, 1.0f);
	float *pk = gc_rand(&rng, np, 1.5f), *pv = gc_rand(&rng, np, 1.0f);
	float *out_h = xmalloc((nq + 1) * 4), *lse_h = xmalloc((nl + 1) * 4);
	float *out_g = xmalloc((nq + 1) * 4), *lse_g = xmalloc((nl + 1) * 4);
	H->attention_forward(out_h, lse_h, q, k, v, cu, S, T, NH, NKV, D, P ? pk : NULL,
			     P ? pv : NULL, P, ap);
	float *dq_ = gc_put(G, q, nq), *dk_ = gc_put(G, k, nk), *dv_ = gc_put(G, v, nk);
	float *dpk = gc_put(G, pk, np), *dpv = gc_put(G, pv, np);
	float *dout = gc_put(G, NULL, nq), *dlse = gc_put(G, NULL, nl);
	int32_t *dcu = gc_put_i(G, cu, (size_t)S + 1);
	bk_cuda_attention_forward(dout, dlse, dq_, dk_, dv_, dcu, S, T, NH, NKV, D,
				  P ? dpk : NULL, P ? dpv : NULL, P, ap);
	int dmg = gc_get(G, out_g, dout, nq);
	report("attention fwd", size, "out", gc_relerr(out_g, out_h, nq, 1e-3), TOL_ATT, dmg);
	dmg = gc_get(G, lse_g, dlse, nl);
	report("attention fwd", size, "lse", gc_relerr(lse_g, lse_h, nl, -1), TOL_LSE, dmg);

	if (!P) { /* backward (no prefix: ops.h) from the host's out and lse on both sides */
		float *go = gc_rand(&rng, nq, 1.0f);
		float *dq0 = gc_rand(&rng, nq, 0.5f), *dk0 = gc_rand(&rng, nk, 0.5f),
		      *dv0 = gc_rand(&rng, nk, 0.5f);
		float *dq_h = xmalloc(nq * 4), *dk_h = xmalloc(nk * 4), *dv_h = xmalloc(nk * 4);
		memcpy(dq_h, dq0, nq * 4), memcpy(dk_h, dk0, nk * 4), memcpy(dv_h, dv0, nk * 4);
		H->attention_backward(dq_h, dk_h, dv_h, go, q, k, v, out_h, lse_h, cu, S, T, NH, NKV,
				      D, ap);
		float *dgo = gc_put(G, go, nq), *dout_h = gc_put(G, out_h, nq),
		      *dlse_h = gc_put(G, lse_h, nl);
		float *ddq = gc_put(G, dq0, nq), *ddk = gc_put(G, dk0, nk),
		      *ddv = gc_put(G, dv0, nk);
		bk_cuda_attention_backward(ddq, ddk, ddv, dgo, dq_, dk_, dv_, dout_h, dlse_h, dcu, S,
					   T, NH, NKV, D, ap);
		float *g = xmalloc(nq * 4);
		dmg = gc_get(G, g, ddq, nq);
		report("attention bwd", size, "dq", gc_relerr(g, dq_h, nq, 1e-3), TOL_ATT, dmg);
		dmg = gc_get(G, g, ddk, nk);
		report("attention bwd", size, "dk", gc_relerr(g, dk_h, nk, 1e-3), TOL_ATT, dmg);
		dmg = gc_get(G, g, ddv, nk);
		report("attention bwd", size, "dv", gc_relerr(g, dv_h, nk, 1e-3), TOL_ATT, dmg);
		/* the gradient part alone (dq0 removed), so += of a zero is not what passes */
		for (size_t i = 0; i < nk; i++)
			dk_h[i] -= dk0[i];
		gc_get(G, g, ddk, nk);
		for (size_t i = 0; i < nk; i++)
			g[i] -= dk0[i];
		report("attention bwd", size, "dk-only", gc_relerr(g, dk_h, nk, 1e-3), 1e-3, 0);
		free(g), free(go), free(dq0), free(dk0), free(dv0), free(dq_h), free(dk_h), free(dv_h);
		gc_drop(G, dgo), gc_drop(G, dout_h), gc_drop(G, dlse_h), gc_drop(G, ddq),
			gc_drop(G, ddk), gc_drop(G, ddv);
	}
	free(q), free(k), free(v), free(pk), free(pv), free(out_h), free(lse_h), free(out_g);
	free(lse_g);
	gc_drop(G, dq_), gc_drop(G, dk_), gc_drop(G, dv_), gc_drop(G, dpk), gc_drop(G, dpv),
		gc_drop(G, dout), gc_drop(G, dlse);
	G->free(dcu);
}

static void check_attention(const int *lens, int S, int NH, int NKV, int D, int P)
{
	bk_attn ap = bk_attn_default(D);
	check_attention_p(lens, S, NH, NKV, D, P, &ap);
}

/* ---- rows and loss ---- */

static void check_rows(void)
{
	enum { T = 301, Hd = 96, N = 37 };
	float *src = gc_rand(&rng, (size_t)T * Hd, 1), *base = gc_rand(&rng, (size_t)T * Hd, 1);
	int32_t rows[N];
	for (int r = 0; r < N; r++)
		rows[r] = (r * 97 + 5) % T; /* distinct: 97 and 301 are coprime */
	float *want = xmalloc((size_t)N * Hd * 4), *got = xmalloc((size_t)T * Hd * 4);
	H->gather_rows(want, src, rows, N, T, Hd);
	float *ds = gc_put(G, src, (size_t)T * Hd), *dd = gc_put(G, NULL, (size_t)N * Hd);
	int32_t *dr = gc_put_i(G, rows, N);
	bk_cuda_gather_rows(dd, ds, dr, N, T, Hd);
	int dmg = gc_get(G, got, dd, (size_t)N * Hd);
	report("gather_rows", "T=301 H=96 N=37", "rows",
	       gc_relerr(got, want, (size_t)N * Hd, -1), 0, dmg);
	float *acc = xmalloc((size_t)T * Hd * 4);
	memcpy(acc, base, (size_t)T * Hd * 4);
	H->scatter_rows(acc, want, rows, N, T, Hd);
	float *db = gc_put(G, base, (size_t)T * Hd);
	bk_cuda_scatter_rows(db, dd, dr, N, T, Hd);
	dmg = gc_get(G, got, db, (size_t)T * Hd);
	report("scatter_rows", "T=301 H=96 N=37", "dst",
	       gc_relerr(got, acc, (size_t)T * Hd, -1), 0, dmg);
	free(src), free(base), free(want), free(got), free(acc);
	gc_drop(G, ds), gc_drop(G, dd), gc_drop(G, db);
	G->free(dr);
}

static void check_loss(int n, int h, int v, int chunk, float temp, int k)
{
	char size[96];
	snprintf(size, sizeof size, "N=%d H=%d V=%d C=%d T=%g K=%d", n, h, v, chunk, (double)temp, k);
	size_t nh = (size_t)n * h, nv = (size_t)n * v, nk = (size_t)n * k;
	float *head = gc_rand_bf16(&rng, (size_t)v * h, 1.0f);
	float *hs = gc_rand_bf16(&rng, nh, 3.0f / sqrtf((float)h) * 1.7f);
	float *ht = gc_rand_bf16(&rng, nh, 3.0f / sqrtf((float)h) * 1.7f);
	int32_t *so = xmalloc((size_t)n * 4);
	for (int r = 0; r < n; r++)
		so[r] = r % 3 == 2 ? 1 : r % 5 == 0 ? 3 : 0; /* 4 samples of different sizes */
	int ns = 4;
	bk_weight *wh = H->weight_upload(head, v, h), *wg = G->weight_upload(head, v, h);
	float *dhs = gc_put(G, hs, nh), *dht = gc_put(G, ht, nh);
	float *dref = xmalloc(nh * 4), *dgot = xmalloc(nh * 4);
	float *klr = xmalloc((size_t)n * 4), *klg = xmalloc((size_t)n * 4);
	int dmg;

	/* exact, teacher hidden */
	float *dd = gc_put(G, NULL, nh);
	double lr = H->kl_exact(hs, wh, ht, NULL, so, n, ns, chunk, temp, 0.0f, dref, klr);
	for (int r = 0; r < n; r++)
		klg[r] = NAN;
	double lg = bk_cuda_kl_exact(dhs, wg, dht, NULL, so, n, ns, chunk, temp, 0.0f, dd, klg);
	report("kl_exact hidden", size, "loss", fabs(lg - lr) / fabs(lr), TOL_LOSS, 0);
	report("kl_exact hidden", size, "row_kl", gc_relerr(klg, klr, (size_t)n, 1e-3),
	       TOL_ROWKL, 0);
	dmg = gc_get(G, dgot, dd, nh);
	report("kl_exact hidden", size, "d_hidden", gc_relerr(dgot, dref, nh, 1e-12), TOL_DHID,
	       dmg);

	/* teacher log-probs */
	float *tl = xmalloc(nv * 4), *tlg = xmalloc(nv * 4), *dtl = gc_put(G, NULL, nv);
	H->teacher_logprobs(ht, wh, n, chunk, temp, 0.0f, tl);
	bk_cuda_teacher_logprobs(dht, wg, n, chunk, temp, 0.0f, dtl);
	dmg = gc_get(G, tlg, dtl, nv);
	report("teacher_logprobs", size, "logp", gc_relerr(tlg, tl, nv, -1), TOL_LOGP, dmg);
	G->upload(dtl, tl, nv * 4); /* the host's log-probs as the teacher on both sides */
	gc_drop(G, dd);
	dd = gc_put(G, NULL, nh);
	lr = H->kl_exact(hs, wh, NULL, tl, so, n, ns, chunk, temp, 0.0f, dref, klr);
	lg = bk_cuda_kl_exact(dhs, wg, NULL, dtl, so, n, ns, chunk, temp, 0.0f, dd, klg);
	report("kl_exact logp", size, "loss", fabs(lg - lr) / fabs(lr), TOL_LOSS, 0);
	report("kl_exact logp", size, "row_kl", gc_relerr(klg, klr, (size_t)n, 1e-3), TOL_ROWKL,
	       0);
	dmg = gc_get(G, dgot, dd, nh);
	report("kl_exact logp", size, "d_hidden", gc_relerr(dgot, dref, nh, 1e-12), TOL_DHID,
	       dmg);

	/* teacher top-k: validity against the host's full log-probs */
	int32_t *idh = xmalloc(nk * 4), *idg = xmalloc(nk * 4);
	float *lph = xmalloc(nk * 4), *lpg = xmalloc(nk * 4);
	float *rsh = xmalloc((size_t)n * 4), *rsg = xmalloc((size_t)n * 4);
	H->teacher_topk(ht, wh, n, chunk, temp, 0.0f, k, idh, lph, rsh);
	int32_t *did = G->alloc(nk * 4);
	{ /* poison the ids with -1 */
		int32_t *m1 = xmalloc(nk * 4);
		memset(m1, 0xff, nk * 4);
		G->upload(did, m1, nk * 4);
		free(m1);
	}
	float *dlp = gc_put(G, NULL, nk), *drs = gc_put(G, NULL, (size_t)n);
	bk_cuda_teacher_topk(dht, wg, n, chunk, temp, 0.0f, k, did, dlp, drs);
	G->download(idg, did, nk * 4);
	dmg = gc_get(G, lpg, dlp, nk) + gc_get(G, rsg, drs, (size_t)n);
	double e_lp = 0, e_set = 0, e_rest = gc_relerr(rsg, rsh, (size_t)n, -1);
	int bad_ids = 0, same_rows = 0;
	char *seen = xcalloc((size_t)v, 1);
	for (int r = 0; r < n; r++) {
		const int32_t *id = idg + (size_t)r * k;
		const float *full = tl + (size_t)r * v; /* host log-probs of this row */
		float kth = lph[(size_t)r * k + k - 1];
		same_rows += !memcmp(id, idh + (size_t)r * k, (size_t)k * 4);
		for (int i = 0; i < k; i++) {
			if (id[i] < 0 || id[i] >= v || seen[id[i]]) {
				bad_ids++;
				continue;
			}
			seen[id[i]] = 1;
			double d = fabs((double)lpg[(size_t)r * k + i] - full[id[i]]);
			if (isnan(lpg[(size_t)r * k + i]))
				d = INFINITY;
			e_lp = d > e_lp ? d : e_lp;
			double below = (double)kth - full[id[i]]; /* > 0: not a top-k value */
			e_set = below > e_set ? below : e_set;
			if (i > 0 && lpg[(size_t)r * k + i] > lpg[(size_t)r * k + i - 1])
				bad_ids++; /* not in descending order */
		}
		for (int i = 0; i < k; i++)
			if (id[i] >= 0 && id[i] < v)
				seen[id[i]] = 0;
	}
	report("teacher_topk", size, "ids", (double)bad_ids, 0, 0);
	report("teacher_topk", size, "logp", e_lp, TOL_LOGP, dmg);
	report("teacher_topk", size, "set", e_set, TOL_LOGP, 0);
	report("teacher_topk", size, "rest", e_rest, TOL_LOGP, 0);
	printf("%-18s %-40s rows equal to the host's ids: %d of %d\n", "teacher_topk", size,
	       same_rows, n);

	/* sparse loss on the host's top-k (same teacher arrays on both sides) */
	G->upload(did, idh, nk * 4);
	G->upload(dlp, lph, nk * 4);
	G->upload(drs, rsh, (size_t)n * 4);
	gc_drop(G, dd);
	dd = gc_put(G, NULL, nh);
	lr = H->kl_topk(hs, wh, idh, lph, rsh, so, n, ns, k, chunk, temp, 0.0f, dref, klr);
	lg = bk_cuda_kl_topk(dhs, wg, did, dlp, drs, so, n, ns, k, chunk, temp, 0.0f, dd, klg);
	report("kl_topk", size, "loss", fabs(lg - lr) / fabs(lr), TOL_LOSS, 0);
	report("kl_topk", size, "row_kl", gc_relerr(klg, klr, (size_t)n, 1e-3), TOL_ROWKL, 0);
	dmg = gc_get(G, dgot, dd, nh);
	report("kl_topk", size, "d_hidden", gc_relerr(dgot, dref, nh, 1e-12), TOL_DHID, dmg);

	H->weight_free(wh), G->weight_free(wg);
	free(head), free(hs), free(ht), free(so), free(dref), free(dgot), free(klr), free(klg);
	free(tl), free(tlg), free(idh), free(idg), free(lph), free(lpg), free(rsh), free(rsg);
	free(seen);
	gc_drop(G, dhs), gc_drop(G, dht), gc_drop(G, dd), gc_drop(G, dtl), gc_drop(G, dlp),
		gc_drop(G, drs);
	G->free(did);
}

/* ---- timing ---- */

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void bench(int S, int L, int NH, int NKV, int D)
{
	enum { REP = 10 };
	int T = S * L;
	int32_t *cu = xmalloc((size_t)(S + 1) * sizeof *cu);
	for (int s = 0; s <= S; s++)
		cu[s] = s * L;
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D;
	float *hq = gc_rand(&rng, nq, 1), *hk = gc_rand(&rng, nk, 1);
	float *q = gc_put(G, hq, nq), *k = gc_put(G, hk, nk), *v = gc_put(G, hk, nk),
	      *o = gc_put(G, NULL, nq);
	float *go = gc_put(G, hq, nq), *dq = gc_put(G, hq, nq), *dk = gc_put(G, hk, nk),
	      *dv = gc_put(G, hk, nk);
	float *lse = gc_put(G, NULL, (size_t)NH * T);
	int32_t *dcu = gc_put_i(G, cu, S + 1);
	double flops = 4.0 * D * ((double)L * (L + 1) / 2) * S * NH;
	bk_attn ap = bk_attn_default(D);
	bk_cuda_attention_forward(o, lse, q, k, v, dcu, S, T, NH, NKV, D, NULL, NULL, 0, &ap);
	bk_cuda_attention_backward(dq, dk, dv, go, q, k, v, o, lse, dcu, S, T, NH, NKV, D, &ap);
	bk_cuda_sync();
	double t0 = now();
	for (int i = 0; i < REP; i++)
		bk_cuda_attention_forward(o, lse, q, k, v, dcu, S, T, NH, NKV, D, NULL, NULL, 0,
					  &ap);
	bk_cuda_sync();
	double tf = (now() - t0) / REP;
	t0 = now();
	for (int i = 0; i < REP; i++)
		bk_cuda_attention_backward(dq, dk, dv, go, q, k, v, o, lse, dcu, S, T, NH, NKV, D,
					   &ap);
	bk_cuda_sync();
	double tb = (now() - t0) / REP;
	printf("attention timing S=%d L=%d NH=%d NKV=%d D=%d: forward %.3f ms %.2f TFLOP/s, "
	       "backward %.3f ms %.2f TFLOP/s\n", S, L, NH, NKV, D, tf * 1e3, flops / tf * 1e-12,
	       tb * 1e3, 2.5 * flops / tb * 1e-12);
	free(hq), free(hk);
	gc_drop(G, q), gc_drop(G, k), gc_drop(G, v), gc_drop(G, o), gc_drop(G, go),
		gc_drop(G, dq), gc_drop(G, dk), gc_drop(G, dv), gc_drop(G, lse);
	G->free(dcu);
	free(cu);
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	int do_bench = 1, tiny = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--no-bench"))
			do_bench = 0;
		else if (!strcmp(argv[i], "--tiny"))
			tiny = 1;
		else
			die_usage("usage: check_attention [--no-bench] [--tiny]");
	}
	bk_rng_seed(&rng, 20240607);
	const int big_lens[4] = {1, 7, 100, 257}, tiny_lens[3] = {1, 7, 33}, one[1] = {1};
	const int *lens = tiny ? tiny_lens : big_lens, NS = tiny ? 3 : 4;
	/* GQA ratios 1, 4, 8 */
	const int big_heads[3][2] = {{8, 8}, {8, 2}, {16, 2}}, tiny_heads[3][2] = {{2, 2}, {4, 1}, {8, 1}};
	const int (*heads)[2] = tiny ? tiny_heads : big_heads;
	const int dims[3] = {64, 128, 8};
	for (int d = 0; d < 3; d++)
		for (int g = 0; g < 3; g++)
			for (int p = 0; p < 2; p++)
				check_attention(lens, NS, heads[g][0], heads[g][1], dims[d], p ? 37 : 0);
	check_attention(one, 1, 4, 1, 64, 0);
	const int odd[3] = {33, 1, 64}; /* tiles that start and end inside sequences */
	check_attention(odd, 3, 6, 3, 96, 5);
	check_attention(odd, 3, 6, 3, 96, 0);
	/* the attention parameters: Gemma-2-like scale and softcap, sliding windows shorter
	 * than the sequences and than a tile (and one reaching into the prefix), all three */
	for (int p = 0; p < 2; p++) {
		bk_attn a1 = {0.0625f, 50.0f, 0}, a2 = {0.125f, 0, 16}, a3 = {0.125f, 0, 100},
			a4 = {0.2f, 3.0f, 40};
		check_attention_p(lens, NS, heads[1][0], heads[1][1], 64, p ? 37 : 0, &a1);
		check_attention_p(lens, NS, heads[1][0], heads[1][1], 64, p ? 37 : 0, &a2);
		check_attention_p(lens, NS, heads[1][0], heads[1][1], 128, p ? 37 : 0, &a3);
		check_attention_p(odd, 3, 6, 3, 96, p ? 5 : 0, &a4);
		check_attention_p(lens, NS, heads[2][0], heads[2][1], 8, p ? 37 : 0, &a4);
	}

	check_rows();
	check_loss(37, 64, 1000, 256, 1.0f, 16);      /* V not a multiple of the chunk */
	check_loss(29, 96, 4099, 4096, 2.0f, 64);     /* two chunks, the last of 3 columns */
	check_loss(tiny ? 8 : 64, 256, 32000, 4096, 1.0f, 64); /* Llama-2 vocabulary */
	check_loss(5, 64, 6000, 1024, 0.7f, 5000);    /* k above the GPU's sort: host fallback */
	check_loss(7, 32, 512, 4096, 1.0f, 512);      /* k = V (stories260K vocabulary) */

	if (do_bench && tiny)
		bench(2, 32, 4, 2, 64);
	else if (do_bench)
		bench(16, 256, 32, 4, 64);
	printf("check_attention: %d lines, %d failed\n", n_lines, n_fail);
	return n_fail ? 1 : 0;
}
