/* check_attention_tc.c - on a GPU: both CUDA attention kernels, the fp32 one
 * (gpu/cuda/cuda_attention.cu, BK_ATTN=fp32) and the tensor-core one
 * (gpu/cuda/cuda_attention_tc.cu, BK_ATTN=tc), against the host twin on the same random
 * inputs, forward (out, lse) and backward (dq, dk, dv, accumulated onto random values);
 * then both kernels timed with CUDA events, one row per shape and direction, so one GPU
 * run validates and ranks them.
 * One line per kernel, case and output; exit 1 on any failure (outputs start as NaN,
 * fenced by sentinels that catch out-of-bounds writes; NaN never passes).
 * Not the row and loss ops (check_attention.c).
 *
 * Inputs q, k, v, prefix k/v and dout are rounded to bf16 first (both kernels and the
 * host see the same numbers), so the tensor-core kernel's own conversion is exact and
 * what is checked is its arithmetic.  Bounds, with u = 2^-8 (bf16 round to nearest),
 * L = the most keys a query sees, e_s = D 2^-23 scale max|q_i| max|k_j| (norms: the
 * worst fp32 error of one score, cap' <= 1) and fp32 slack f = L 2^-23 + 2^-14 + 2.1 e_s:
 *   out  <= (u' + f) max|v|                  u' = 1.01 u for tc (P rounded to bf16 in
 *                                             P V: each term off by <= u relative), 0 fp32
 *   lse  <= 2.1 e_s + L 2^-23 + 2^-20 max|lse|   (no bf16 product involved)
 *   dv_j <= (u' + f) max|dout| max_j sum_i p_ij          (P rounded in P^T dO)
 *   dq_i <= scale max|k| ((u' + f) max_i sum_j a_ij + e_d)      (dS rounded in dS K)
 *   dk_j <= scale max|q| ((u' + f) max_j sum_i a_ij + e_d max_j sum_i p_ij)  (dS^T Q)
 * with a_ij = p_ij (|dout_i.v_j| + |D_i|) cap'_ij >= |ds_ij| (the sums over the group's
 * query heads for dk/dv), e_d = D 2^-22 max|dout_i| max|v_j| (norms: the fp32 error of
 * dout.v and of D_i = dout.out on both sides, times sum_j p_ij = 1), each plus
 * 2^-22 max|expected| for the fp32 += onto the start values.  The sums are computed here
 * from the host's lse, in double.
 * Shapes: packed odd lengths (1, 7, 100, 257: T not a multiple of the 64-row tile, tiles
 * spanning sequences), GQA 8/8, 32/4 and 8/2 (ratios 1, 8, 4), D 64, 128 and 256, a
 * 37-token prefix (forward), softcap and sliding window on and off; D = 256 also as
 * Gemma 2 (scale 1/16, softcap 50, windows of 20 and 100, 8/4 and 8/8 heads);
 * realistic 1 x 1024 (32/4, D 128; 8/4, D 256, softcap 50, window 512) and 2 x 2048
 * (32/4, D 64); one D = 96 case checks the tc entry's fp32 fallback.  The bounds above
 * hold for every D (e_s, e_d grow with it); nothing in them is tuned to a shape.
 * Timing rows: 16 x 256 and 4 x 2048 (32/4, D 64), 1 x 1024 (D 128), a 512 window;
 * Gemma-2-2B's 16 x 256 and 1 x 8192 with its 4096 window (8/4, D 256, softcap 50).
 * Usage: check_attention_tc [--no-bench | --quick | --tiny]  (--quick: no realistic sizes
 * and no timing, for compute-sanitizer; --tiny, for tests/gpu/run.sh --emu on the CPU's
 * emulation of the GPU: the cases above at small sizes, sequences of 1, 7 and 33 tokens
 * and heads 2/2, 8/1 and 4/1 (the same GQA ratios), no realistic sizes, and two timing
 * rows at 2 x 32 tokens (4/2 heads of 64) and 1 x 64 (2/1 heads of 256, window 16,
 * softcap 50)) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "formats/safetensors.h"
#include "gpu/cuda/cuda.h"
#include "gpu/cuda/cuda_attention_tc.h"
#include "gpu/ops.h"
#include "tests/gpu/gpu_check.h"

#ifndef BK_HAVE_CUDA
#error "check_attention_tc needs a CUDA build (BK_HAVE_CUDA)"
#endif

#define U_BF16 0x1p-8

static const bk_ops *H = &bk_ops_host, *G = &bk_ops_cuda;
static bk_rng rng;
static int n_fail, n_lines;

/* the two kernels under test */
typedef struct kern {
	const char *name;
	int tc; /* 1: bf16 products (u' = 1.01 u), 0: fp32 */
	void (*fwd)(float *, float *, const float *, const float *, const float *,
		    const int32_t *, int, int, int, int, int, const float *, const float *, int,
		    const bk_attn *);
	void (*bwd)(float *, float *, float *, const float *, const float *, const float *,
		    const float *, const float *, const float *, const int32_t *, int, int, int,
		    int, int, const bk_attn *);
} kern;

static const kern KERNS[2] = {
	{"fp32", 0, bk_cuda_attention_forward, bk_cuda_attention_backward},
	{"tc", 1, bk_cuda_attention_tc_forward, bk_cuda_attention_tc_backward},
};

/* compares got against want [n] with an absolute bound; one line */
static void check(const char *kn, const char *size, const char *what, const float *got,
		  const float *want, size_t n, double bound, int damage)
{
	double err = gc_maxerr(got, want, n);
	int ok = !damage && err <= bound;
	n_lines++;
	n_fail += !ok;
	printf("attention %-4s %-52s %-3s err %-10.3g bound %-10.3g (%.2f)%s %s\n", kn, size, what,
	       err, bound, bound > 0 ? err / bound : 0.0, damage ? " sentinel damaged" : "",
	       ok ? "ok" : "FAIL");
}

static float cap_of(float s, float cap) { return cap > 0 ? tanhf(s / cap) * cap : s; }

/* max_j sum_i p_ij, max_i sum_j a_ij, max_j sum_i a_ij (module comment), in double from
 * the host's out and lse; dk/dv sums over the query heads of each kv head */
static void bwd_sums(const float *q, const float *k, const float *v, const float *go,
		     const float *out, const float *lse, const int32_t *cu, int S, int T, int NH,
		     int NKV, int D, const bk_attn *ap, double *colp, double *rowa, double *cola)
{
	int group = NH / NKV, W = ap->window;
	double *cp = xcalloc((size_t)NH * T, sizeof(double));
	double *ca = xcalloc((size_t)NH * T, sizeof(double));
	double ra_max = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(max : ra_max)
	for (int h = 0; h < NH; h++) {
		int kh = h / group;
		for (int s = 0; s < S; s++)
			for (int i = cu[s]; i < cu[s + 1]; i++) {
				const float *qi = q + ((size_t)i * NH + h) * D;
				const float *gi = go + ((size_t)i * NH + h) * D;
				const float *oi = out + ((size_t)i * NH + h) * D;
				double Di = 0, ra = 0, l = lse[(size_t)h * T + i];
				for (int d = 0; d < D; d++)
					Di += (double)gi[d] * oi[d];
				for (int j = cu[s]; j <= i; j++) {
					if (W > 0 && i - j >= W)
						continue;
					const float *kj = k + ((size_t)j * NKV + kh) * D;
					const float *vj = v + ((size_t)j * NKV + kh) * D;
					double qk = 0, dp = 0;
					for (int d = 0; d < D; d++) {
						qk += (double)qi[d] * kj[d];
						dp += (double)gi[d] * vj[d];
					}
					double c = cap_of((float)(qk * ap->scale), ap->softcap);
					double p = exp(c - l);
					double a = p * (fabs(dp) + fabs(Di));
					if (ap->softcap > 0)
						a *= 1 - (c / ap->softcap) * (c / ap->softcap);
					ra += a;
					cp[(size_t)h * T + j] += p;
					ca[(size_t)h * T + j] += a;
				}
				ra_max = ra > ra_max ? ra : ra_max;
			}
	}
	double cpm = 0, cam = 0;
	for (int kh = 0; kh < NKV; kh++)
		for (int j = 0; j < T; j++) {
			double sp = 0, sa = 0;
			for (int h = kh * group; h < (kh + 1) * group; h++)
				sp += cp[(size_t)h * T + j], sa += ca[(size_t)h * T + j];
			cpm = sp > cpm ? sp : cpm;
			cam = sa > cam ? sa : cam;
		}
	*colp = cpm, *rowa = ra_max, *cola = cam;
	free(cp), free(ca);
}

static void check_case(const int *lens, int S, int NH, int NKV, int D, int P, const bk_attn *ap)
{
	int32_t cu[9];
	int Lmax = 0;
	cu[0] = 0;
	for (int s = 0; s < S; s++) {
		cu[s + 1] = cu[s] + lens[s];
		Lmax = lens[s] > Lmax ? lens[s] : Lmax;
	}
	Lmax += P;
	int T = cu[S];
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, np = (size_t)P * NKV * D;
	size_t nl = (size_t)NH * T;
	char size[128];
	snprintf(size, sizeof size, "T=%d S=%d NH=%d/%d D=%d P=%d s%.3g c%g W%d", T, S, NH, NKV, D,
		 P, (double)ap->scale, (double)ap->softcap, ap->window);
	float *q = gc_rand_bf16(&rng, nq, 1.5f), *k = gc_rand_bf16(&rng, nk, 1.5f);
	float *v = gc_rand_bf16(&rng, nk, 1.0f);
	float *pk = gc_rand_bf16(&rng, np, 1.5f), *pv = gc_rand_bf16(&rng, np, 1.0f);
	float *out_h = xmalloc((nq + 1) * 4), *lse_h = xmalloc((nl + 1) * 4);
	float *got = xmalloc((nq + 1) * 4);
	H->attention_forward(out_h, lse_h, q, k, v, cu, S, T, NH, NKV, D, P ? pk : NULL,
			     P ? pv : NULL, P, ap);

	/* the forward bounds */
	double mv = gc_maxabs(v, nk), mq = gc_maxabs(q, nq), mk = gc_maxabs(k, nk);
	double nrk = gc_maxnorm(k, (size_t)T * NKV, D);
	if (P) {
		double a = gc_maxabs(pv, np), b = gc_maxabs(pk, np);
		double c = gc_maxnorm(pk, (size_t)P * NKV, D);
		mv = a > mv ? a : mv, mk = b > mk ? b : mk, nrk = c > nrk ? c : nrk;
	}
	double e_s = D * 0x1p-23 * ap->scale * gc_maxnorm(q, (size_t)T * NH, D) * nrk;
	double f = Lmax * 0x1p-23 + 0x1p-14 + 2.1 * e_s;
	double b_lse = 2.1 * e_s + Lmax * 0x1p-23 + 0x1p-20 * gc_maxabs(lse_h, nl);

	float *dq_ = gc_put(G, q, nq), *dk_ = gc_put(G, k, nk), *dv_ = gc_put(G, v, nk);
	float *dpk = gc_put(G, pk, np), *dpv = gc_put(G, pv, np);
	int32_t *dcu = G->alloc(((size_t)S + 1) * sizeof(int32_t));
	G->upload(dcu, cu, ((size_t)S + 1) * sizeof(int32_t));
	for (int kn = 0; kn < 2; kn++) {
		const kern *K = &KERNS[kn];
		double up = K->tc ? 1.01 * U_BF16 : 0;
		float *dout = gc_put(G, NULL, nq), *dlse = gc_put(G, NULL, nl);
		K->fwd(dout, dlse, dq_, dk_, dv_, dcu, S, T, NH, NKV, D, P ? dpk : NULL,
		       P ? dpv : NULL, P, ap);
		int dmg = gc_get(G, got, dout, nq);
		check(K->name, size, "out", got, out_h, nq, (up + f) * mv, dmg);
		dmg = gc_get(G, got, dlse, nl);
		check(K->name, size, "lse", got, lse_h, nl, b_lse, dmg);
		gc_drop(G, dout), gc_drop(G, dlse);
	}

	if (!P) { /* backward (no prefix: ops.h) from the host's out and lse on both sides */
		float *go = gc_rand_bf16(&rng, nq, 1.0f);
		float *dq0 = gc_rand_bf16(&rng, nq, 0.5f), *dk0 = gc_rand_bf16(&rng, nk, 0.5f);
		float *dv0 = gc_rand_bf16(&rng, nk, 0.5f);
		float *dq_h = xmalloc(nq * 4), *dk_h = xmalloc(nk * 4), *dv_h = xmalloc(nk * 4);
		memcpy(dq_h, dq0, nq * 4), memcpy(dk_h, dk0, nk * 4), memcpy(dv_h, dv0, nk * 4);
		H->attention_backward(dq_h, dk_h, dv_h, go, q, k, v, out_h, lse_h, cu, S, T, NH, NKV,
				      D, ap);
		double colp, rowa, cola;
		bwd_sums(q, k, v, go, out_h, lse_h, cu, S, T, NH, NKV, D, ap, &colp, &rowa, &cola);
		double mg = gc_maxabs(go, nq);
		double e_d = D * 0x1p-22 * gc_maxnorm(go, (size_t)T * NH, D) *
			     gc_maxnorm(v, (size_t)T * NKV, D);
		float *dgo = gc_put(G, go, nq), *dout_h = gc_put(G, out_h, nq);
		float *dlse_h = gc_put(G, lse_h, nl);
		for (int kn = 0; kn < 2; kn++) {
			const kern *K = &KERNS[kn];
			double r = (K->tc ? 1.01 * U_BF16 : 0) + f;
			float *ddq = gc_put(G, dq0, nq), *ddk = gc_put(G, dk0, nk);
			float *ddv = gc_put(G, dv0, nk);
			K->bwd(ddq, ddk, ddv, dgo, dq_, dk_, dv_, dout_h, dlse_h, dcu, S, T, NH, NKV, D,
			       ap);
			int dmg = gc_get(G, got, ddq, nq);
			check(K->name, size, "dq", got, dq_h, nq,
			      ap->scale * mk * (r * rowa + e_d) + 0x1p-22 * gc_maxabs(dq_h, nq), dmg);
			dmg = gc_get(G, got, ddk, nk);
			check(K->name, size, "dk", got, dk_h, nk,
			      ap->scale * mq * (r * cola + e_d * colp) + 0x1p-22 * gc_maxabs(dk_h, nk),
			      dmg);
			dmg = gc_get(G, got, ddv, nk);
			check(K->name, size, "dv", got, dv_h, nk,
			      r * mg * colp + 0x1p-22 * gc_maxabs(dv_h, nk), dmg);
			gc_drop(G, ddq), gc_drop(G, ddk), gc_drop(G, ddv);
		}
		free(go), free(dq0), free(dk0), free(dv0), free(dq_h), free(dk_h), free(dv_h);
		gc_drop(G, dgo), gc_drop(G, dout_h), gc_drop(G, dlse_h);
	}
	free(q), free(k), free(v), free(pk), free(pv), free(out_h), free(lse_h), free(got);
	gc_drop(G, dq_), gc_drop(G, dk_), gc_drop(G, dv_), gc_drop(G, dpk), gc_drop(G, dpv);
	G->free(dcu);
}

/* ---- timing ---- */

typedef struct bench_args {
	const kern *K;
	float *q, *k, *v, *o, *lse, *go, *dq, *dk, *dv;
	int32_t *cu;
	int S, T, NH, NKV, D;
	bk_attn ap;
} bench_args;

static void run_fwd(void *p)
{
	bench_args *a = p;
	a->K->fwd(a->o, a->lse, a->q, a->k, a->v, a->cu, a->S, a->T, a->NH, a->NKV, a->D, NULL,
		  NULL, 0, &a->ap);
}

static void run_bwd(void *p)
{
	bench_args *a = p;
	a->K->bwd(a->dq, a->dk, a->dv, a->go, a->q, a->k, a->v, a->o, a->lse, a->cu, a->S, a->T,
		  a->NH, a->NKV, a->D, &a->ap);
}

/* rows "attention fwd|bwd <shape>: fp32 X ms, tc Y ms, ratio fp32/tc" (causal FLOPs:
 * forward 4 D sum_s L(L+1)/2 per head, backward 2.5x the forward) */
static void bench(int S, int L, int NH, int NKV, int D, int W, float cap)
{
	enum { REP = 5 };
	int T = S * L;
	int32_t *cu = xmalloc(((size_t)S + 1) * sizeof(int32_t));
	for (int s = 0; s <= S; s++)
		cu[s] = s * L;
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D;
	float *hq = gc_rand_bf16(&rng, nq, 1), *hk = gc_rand_bf16(&rng, nk, 1);
	bench_args a = {0};
	a.q = gc_put(G, hq, nq), a.k = gc_put(G, hk, nk), a.v = gc_put(G, hk, nk);
	a.o = gc_put(G, NULL, nq), a.go = gc_put(G, hq, nq), a.dq = gc_put(G, hq, nq);
	a.dk = gc_put(G, hk, nk), a.dv = gc_put(G, hk, nk);
	a.lse = gc_put(G, NULL, (size_t)NH * T);
	a.cu = G->alloc(((size_t)S + 1) * sizeof(int32_t));
	G->upload(a.cu, cu, ((size_t)S + 1) * sizeof(int32_t));
	a.S = S, a.T = T, a.NH = NH, a.NKV = NKV, a.D = D;
	a.ap = bk_attn_default(D);
	a.ap.window = W;
	a.ap.softcap = cap;
	double keys = W > 0 && W < L ? (double)W * (W + 1) / 2 + (double)(L - W) * W
				     : (double)L * (L + 1) / 2;
	double flops = 4.0 * D * keys * S * NH, ms[2][2];
	for (int kn = 0; kn < 2; kn++) {
		a.K = &KERNS[kn];
		ms[0][kn] = bk_cuda_time_ms(run_fwd, &a, REP);
		ms[1][kn] = bk_cuda_time_ms(run_bwd, &a, REP);
	}
	char shape[96];
	snprintf(shape, sizeof shape, "%dx%d NH=%d/%d D=%d W=%d c%g", S, L, NH, NKV, D, W,
		 (double)cap);
	for (int dir = 0; dir < 2; dir++) {
		double fl = dir ? 2.5 * flops : flops;
		printf("attention %s %s: fp32 %.3f ms, tc %.3f ms, ratio %.2f  (fp32 %.1f, tc %.1f "
		       "TFLOP/s)\n", dir ? "bwd" : "fwd", shape, ms[dir][0], ms[dir][1],
		       ms[dir][0] / ms[dir][1], fl / ms[dir][0] * 1e-9, fl / ms[dir][1] * 1e-9);
	}
	free(cu), free(hq), free(hk);
	float *bufs[9] = {a.q, a.k, a.v, a.o, a.go, a.dq, a.dk, a.dv, a.lse};
	for (int i = 0; i < 9; i++)
		gc_drop(G, bufs[i]);
	G->free(a.cu);
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	int quick = argc > 1 && !strcmp(argv[1], "--quick");
	int tiny = argc > 1 && !strcmp(argv[1], "--tiny");
	int do_bench = !quick && !(argc > 1 && !strcmp(argv[1], "--no-bench"));
	if (argc > 2 || (argc > 1 && !quick && !tiny && strcmp(argv[1], "--no-bench")))
		die("usage: check_attention_tc [--no-bench | --quick | --tiny]");
	quick |= tiny;
	bk_rng_seed(&rng, 20261201);
	const char *sel = getenv("BK_ATTN");
	printf("check_attention_tc: BK_ATTN=%s (the op table's kernel; both are checked here)\n",
	       sel && *sel ? sel : "fp32 (unset)");
	const int big_lens[4] = {1, 7, 100, 257}, tiny_lens[3] = {1, 7, 33}, one[1] = {1},
		  odd[3] = {33, 1, 64};
	const int *lens = tiny ? tiny_lens : big_lens, NS = tiny ? 3 : 4;
	/* GQA ratios 1, 8, 4 */
	const int big_heads[3][2] = {{8, 8}, {32, 4}, {8, 2}}, tiny_heads[3][2] = {{2, 2}, {8, 1}, {4, 1}};
	const int (*heads)[2] = tiny ? tiny_heads : big_heads;
	const int dims[3] = {64, 128, 256};
	for (int d = 0; d < 3; d++)
		if (!bk_cuda_attention_tc_supports(dims[d]))
			die("the tensor-core attention does not support D=%d", dims[d]);
	/* GQA ratios 1, 8, 4 at each D, with and without a prefix */
	for (int d = 0; d < 3; d++)
		for (int g = 0; g < 3; g++)
			for (int p = 0; p < 2; p++) {
				bk_attn ap = bk_attn_default(dims[d]);
				check_case(lens, NS, heads[g][0], heads[g][1], dims[d], p ? 37 : 0, &ap);
			}
	{
		bk_attn ap = bk_attn_default(64);
		check_case(one, 1, 4, 1, 64, 0, &ap);
		check_case(odd, 3, heads[2][0], heads[2][1], 128, 5, &ap);
		check_case(odd, 3, heads[2][0], heads[2][1], 128, 0, &ap);
	}
	/* softcap and sliding windows: shorter than a tile, longer than a tile, reaching
	 * into the prefix, with a cap */
	for (int p = 0; p < 2; p++) {
		bk_attn a1 = {0.0625f, 50.0f, 0}, a2 = {0.125f, 0, 16}, a3 = {0.125f, 0, 100},
			a4 = {0.2f, 3.0f, 40};
		check_case(lens, NS, heads[2][0], heads[2][1], 64, p ? 37 : 0, &a1);
		check_case(lens, NS, heads[2][0], heads[2][1], 64, p ? 37 : 0, &a2);
		check_case(lens, NS, heads[2][0], heads[2][1], 128, p ? 37 : 0, &a3);
		check_case(odd, 3, heads[0][0], heads[0][0], 64, p ? 5 : 0, &a4);
		check_case(lens, NS, heads[1][0], heads[1][1], 128, p ? 37 : 0, &a4);
		/* D = 256 as Gemma 2: scale 256^-0.5, softcap 50, windows shorter and longer
		 * than a tile (16 and 32 keys at D = 256), GQA 2 (Gemma-2-2B: 8/4) and 1 */
		bk_attn g1 = {0.0625f, 50.0f, 100}, g2 = {0.0625f, 50.0f, 20};
		check_case(lens, NS, tiny ? 2 : 8, tiny ? 1 : 4, 256, p ? 37 : 0, &g1);
		check_case(odd, 3, heads[0][0], heads[0][0], 256, p ? 5 : 0, &g2);
		check_case(lens, NS, tiny ? 8 : 16, tiny ? 1 : 2, 256, p ? 37 : 0, &a4);
	}
	/* realistic sizes */
	if (!quick) {
		const int l1[1] = {1024}, l2[2] = {2048, 2048};
		bk_attn a128 = bk_attn_default(128), a64 = bk_attn_default(64);
		check_case(l1, 1, 32, 4, 128, 0, &a128);
		check_case(l2, 2, 32, 4, 64, 0, &a64);
		bk_attn g = {0.0625f, 50.0f, 512}; /* Gemma-2-2B's heads, a window of half */
		check_case(l1, 1, 8, 4, 256, 0, &g);
	}
	/* D = 96: the tc entry runs the fp32 kernel (checked with the tc bounds) */
	{
		bk_attn ap = bk_attn_default(96);
		check_case(odd, 3, 6, 3, 96, 0, &ap);
	}

	if (tiny) {
		bench(2, 32, 4, 2, 64, 0, 0);
		bench(1, 64, 2, 1, 256, 16, 50);
	} else if (do_bench) {
		bench(16, 256, 32, 4, 64, 0, 0); /* the training shape of the issue */
		bench(4, 2048, 32, 4, 64, 0, 0);
		bench(1, 1024, 32, 4, 128, 0, 0);
		bench(4, 2048, 32, 4, 64, 512, 0);
		/* Gemma-2-2B's attention (8/4 heads, D 256, softcap 50): the training shape,
		 * and 8k tokens with its 4096 window (its local layers) */
		bench(16, 256, 8, 4, 256, 0, 50);
		bench(1, 8192, 8, 4, 256, 4096, 50);
	}
	printf("check_attention_tc: %d lines, %d failed\n", n_lines, n_fail);
	return n_fail ? 1 : 0;
}
