/* test_cuda_ops.c - every op of bk_ops_cuda against the host twin bk_ops_host on the
 * same random inputs, at aligned and odd sizes (T = 1, 7, 64, 257; H = 64, 96; GQA
 * ratios 1, 4, 8; D = 64, 128).  Base weights are rounded to bf16 before both uploads,
 * so only compute rounding differs.  Outputs are poisoned with NaN (and fenced by
 * sentinels that catch out-of-bounds writes) before each run; NaN never passes.  One
 * line per op and size; exit 1 on any failure.  Not a gradient check (test_ops.c does
 * finite differences on the host twin, the judge).
 *
 * Error measure: max|cuda - host| / max(max|host|, 1e-3) per output.  Bounds:
 *   exact ops (embedding, residual, dropout masks)                0 (bit-equal)
 *   fp32 ops (rmsnorm, rope, swiglu, geglu, bias, softcap: other summation
 *   order, 2-ulp libm)                                              1e-5
 *   bf16 linear (activation rounded to bf16: 2^-9 per element)     1e-2
 *   LoRA (TF32 operands, 2^-11 per element)                        5e-3
 *   attention (fp32 or bf16 inside, whichever cuda_attention.cu does) 2e-2
 * Usage: test_cuda_ops [--host] [--tiny]   (--host: judge the host twin against itself, a
 * dry run of this program on a machine without a GPU: every error must be 0; --tiny:
 * T = 1, 7, 33 and H = 64 only, every op and the rest as above, for tests/gpu/run.sh
 * --emu on the CPU's emulation of the GPU). */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "formats/safetensors.h"
#include "common/rng.h"
#include "gpu/cuda/cuda.h"
#include "gpu/ops.h"
#include "tests/gpu/gpu_check.h"

#define FLOOR 1e-3

#define TOL_EXACT 0.0
#define TOL_FP32 1e-5
#define TOL_BF16 1e-2
#define TOL_TF32 5e-3
#define TOL_ATTN 2e-2

static const bk_ops *ref, *dut; /* reference (host twin), device under test */
static bk_rng rng;
static int n_fail, n_lines;

/* ---- device buffers fenced by sentinels; h == NULL poisons with NaN ---- */

/* ---- comparison: one line per (op, size, output) ---- */

static void report(const char *op, const char *size, const char *what, double err,
		   double tol, int sentinel_damage, int absent)
{
	int ok = !absent && !sentinel_damage && err <= tol; /* NaN err fails here */
	n_lines++;
	n_fail += !ok;
	if (absent)
		printf("%-20s %-34s %-6s absent                      FAIL\n", op, size, what);
	else
		printf("%-20s %-34s %-6s relerr %.2e  bound %.0e%s  %s\n", op, size, what, err,
		       tol, sentinel_damage ? "  OUT-OF-BOUNDS WRITE" : "", ok ? "ok" : "FAIL");
}

static double relerr(const float *got, const float *want, size_t n)
{
	double mx = 0, den = FLOOR;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(got[i]) || !isfinite(want[i]))
			return INFINITY;
		double d = fabs((double)got[i] - want[i]);
		mx = d > mx ? d : mx;
		den = fabs(want[i]) > den ? fabs(want[i]) : den;
	}
	return mx / den;
}

/* run `out` (n floats, device pointers dr/dd on ref/dut) back and compare */
static void compare(const char *op, const char *size, const char *what, float *dr, float *dd,
		    size_t n, double tol)
{
	float *a = xmalloc((n ? n : 1) * sizeof(float)), *b = xmalloc((n ? n : 1) * sizeof(float));
	int bad = gc_get(ref, a, dr, n);
	bad += gc_get(dut, b, dd, n);
	report(op, size, what, relerr(b, a, n), tol, bad, 0);
	free(a);
	free(b);
}

/* a pair of device buffers with the same contents (h NULL: NaN) */
typedef struct {
	float *r, *d;
	size_t n;
} pair;
static pair pput(const float *h, size_t n)
{
	return (pair){ gc_put(ref, h, n), gc_put(dut, h, n), n };
}
static void pdrop(pair p)
{
	gc_drop(ref, p.r);
	gc_drop(dut, p.d);
}
static void pcmp(const char *op, const char *size, const char *what, pair p, double tol)
{
	compare(op, size, what, p.r, p.d, p.n, tol);
}

/* ---- ops ---- */

static void t_embedding(int T, int H)
{
	int V = 301;
	char sz[64];
	snprintf(sz, sizeof sz, "T=%d H=%d V=%d", T, H, V);
	float *e = gc_rand_bf16(&rng, (size_t)V * H, 1);
	int32_t *ids = xmalloc((size_t)T * 4);
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)bk_rng_below(&rng, V);
	ids[0] = V - 1;
	bk_weight *wr = ref->weight_upload(e, V, H), *wd = dut->weight_upload(e, V, H);
	int32_t *ir = gc_put_i(ref, ids, T), *id = gc_put_i(dut, ids, T);
	pair x = pput(NULL, (size_t)T * H);
	ref->embedding_forward(x.r, ir, wr, T);
	dut->embedding_forward(x.d, id, wd, T);
	pcmp("embedding_forward", sz, "x", x, TOL_EXACT);
	pdrop(x);
	ref->free(ir), dut->free(id);
	ref->weight_free(wr), dut->weight_free(wd);
	free(e), free(ids);
}

static void t_rmsnorm(int T, int H)
{
	char sz[64];
	snprintf(sz, sizeof sz, "T=%d H=%d", T, H);
	size_t n = (size_t)T * H;
	float *x = gc_rand(&rng, n, 3), *w = gc_rand_bf16(&rng, H, 1),
	      *dout = gc_rand(&rng, n, 1), *dx0 = gc_rand(&rng, n, 1);
	bk_weight *wr = ref->weight_upload(w, 1, H), *wd = dut->weight_upload(w, 1, H);
	pair px = pput(x, n), out = pput(NULL, n), rstd = pput(NULL, T);
	ref->rmsnorm_forward(out.r, rstd.r, px.r, wr, T, H, 1e-5f);
	dut->rmsnorm_forward(out.d, rstd.d, px.d, wd, T, H, 1e-5f);
	pcmp("rmsnorm_forward", sz, "out", out, TOL_FP32);
	pcmp("rmsnorm_forward", sz, "rstd", rstd, TOL_FP32);
	/* the backward reads the reference's rstd on both sides */
	float *rs = xmalloc((size_t)T * 4);
	gc_get(ref, rs, rstd.r, T);
	pair rs2 = pput(rs, T), pd = pput(dout, n), dx = pput(dx0, n);
	ref->rmsnorm_backward(dx.r, pd.r, px.r, wr, rs2.r, T, H);
	dut->rmsnorm_backward(dx.d, pd.d, px.d, wd, rs2.d, T, H);
	pcmp("rmsnorm_backward", sz, "dx+=", dx, TOL_FP32);
	pdrop(px), pdrop(out), pdrop(rstd), pdrop(rs2), pdrop(pd), pdrop(dx);
	ref->weight_free(wr), dut->weight_free(wd);
	free(x), free(w), free(dout), free(dx0), free(rs);
}

static void t_linear(int T, int in, int out)
{
	char sz[64];
	snprintf(sz, sizeof sz, "T=%d in=%d out=%d", T, in, out);
	float *W = gc_rand_bf16(&rng, (size_t)out * in, 0.1f),
	      *x = gc_rand(&rng, (size_t)T * in, 1), *dy = gc_rand(&rng, (size_t)T * out, 1),
	      *dx0 = gc_rand(&rng, (size_t)T * in, 1);
	bk_weight *wr = ref->weight_upload(W, out, in), *wd = dut->weight_upload(W, out, in);
	pair px = pput(x, (size_t)T * in), y = pput(NULL, (size_t)T * out);
	ref->linear_forward(y.r, px.r, wr, T);
	dut->linear_forward(y.d, px.d, wd, T);
	pcmp("linear_forward", sz, "y", y, TOL_BF16);
	pair pdy = pput(dy, (size_t)T * out), dx = pput(dx0, (size_t)T * in);
	ref->linear_backward(dx.r, pdy.r, wr, T);
	dut->linear_backward(dx.d, pdy.d, wd, T);
	pcmp("linear_backward", sz, "dx+=", dx, TOL_BF16);
	pdrop(px), pdrop(y), pdrop(pdy), pdrop(dx);
	ref->weight_free(wr), dut->weight_free(wd);
	free(W), free(x), free(dy), free(dx0);
}

static void t_lora(int T, int in, int out, int R, float p)
{
	char sz[64];
	snprintf(sz, sizeof sz, "T=%d in=%d out=%d r=%d p=%g", T, in, out, R, p);
	size_t nx = (size_t)T * in, ny = (size_t)T * out;
	float scale = 2.0f, *x = gc_rand(&rng, nx, 1), *A = gc_rand(&rng, (size_t)R * in, 0.2f),
	      *B = gc_rand(&rng, (size_t)out * R, 0.2f), *y0 = gc_rand(&rng, ny, 1),
	      *dy = gc_rand(&rng, ny, 1), *dx0 = gc_rand(&rng, nx, 1),
	      *dA0 = gc_rand(&rng, (size_t)R * in, 1), *dB0 = gc_rand(&rng, (size_t)out * R, 1);
	uint64_t key = bk_rng_u64(&rng);
	pair px = pput(x, nx), pA = pput(A, (size_t)R * in), pB = pput(B, (size_t)out * R);
	pair y = pput(y0, ny), xa = pput(NULL, (size_t)T * R), sc = pput(NULL, (size_t)T * (in + R));
	ref->lora_forward(y.r, xa.r, px.r, pA.r, pB.r, T, in, out, R, scale, p, key, sc.r);
	dut->lora_forward(y.d, xa.d, px.d, pA.d, pB.d, T, in, out, R, scale, p, key, sc.d);
	pcmp("lora_forward", sz, "y+=", y, TOL_TF32);
	pcmp("lora_forward", sz, "xa", xa, TOL_TF32);
	/* the backward reads the reference's xa on both sides */
	float *xah = xmalloc((size_t)T * R * 4);
	gc_get(ref, xah, xa.r, (size_t)T * R);
	pair xa2 = pput(xah, (size_t)T * R), pdy = pput(dy, ny), dx = pput(dx0, nx),
	     dA = pput(dA0, (size_t)R * in), dB = pput(dB0, (size_t)out * R);
	pdrop(sc);
	sc = pput(NULL, (size_t)T * (in + R));
	ref->lora_backward(dx.r, dA.r, dB.r, pdy.r, px.r, xa2.r, pA.r, pB.r, T, in, out, R, scale,
			   p, key, sc.r);
	dut->lora_backward(dx.d, dA.d, dB.d, pdy.d, px.d, xa2.d, pA.d, pB.d, T, in, out, R, scale,
			   p, key, sc.d);
	pcmp("lora_backward", sz, "dx+=", dx, TOL_TF32);
	pcmp("lora_backward", sz, "dA+=", dA, TOL_TF32);
	pcmp("lora_backward", sz, "dB+=", dB, TOL_TF32);
	if (p > 0) {
		/* the dropout mask itself: A = identity rows, B = 0 makes xa = drop(x)[:, :R],
		 * which must match bit for bit (same counter-based RNG on both sides) */
		float *I = xcalloc((size_t)R * in, 4), *Z = xcalloc((size_t)out * R, 4);
		for (int r = 0; r < R && r < in; r++)
			I[(size_t)r * in + r] = 1;
		pair pI = pput(I, (size_t)R * in), pZ = pput(Z, (size_t)out * R),
		     y2 = pput(y0, ny), xa3 = pput(NULL, (size_t)T * R);
		ref->lora_forward(y2.r, xa3.r, px.r, pI.r, pZ.r, T, in, out, R, 1, p, key, sc.r);
		dut->lora_forward(y2.d, xa3.d, px.d, pI.d, pZ.d, T, in, out, R, 1, p, key, sc.d);
		/* x*inv exactly: TF32 rounds x, so compare the zero pattern through a bound
		 * below the smallest kept |x| relative error: exact zeros or TF32 values */
		float *a = xmalloc((size_t)T * R * 4), *b = xmalloc((size_t)T * R * 4);
		int bad = gc_get(ref, a, xa3.r, (size_t)T * R) +
			  gc_get(dut, b, xa3.d, (size_t)T * R);
		size_t mism = 0;
		for (size_t i = 0; i < (size_t)T * R; i++)
			mism += (a[i] == 0) != (b[i] == 0) || !isfinite(b[i]);
		report("lora_dropout_mask", sz, "zeros", (double)mism, TOL_EXACT, bad, 0);
		pdrop(pI), pdrop(pZ), pdrop(y2), pdrop(xa3);
		free(I), free(Z), free(a), free(b);
	}
	pdrop(px), pdrop(pA), pdrop(pB), pdrop(y), pdrop(xa), pdrop(sc), pdrop(xa2), pdrop(pdy);
	pdrop(dx), pdrop(dA), pdrop(dB);
	free(x), free(A), free(B), free(y0), free(dy), free(dx0), free(dA0), free(dB0), free(xah);
}

static void t_rope(int T, int n, int D)
{
	char sz[64];
	snprintf(sz, sizeof sz, "T=%d heads=%d D=%d", T, n, D);
	size_t N = (size_t)T * n * D;
	float *x = gc_rand(&rng, N, 1), *inv = xmalloc((size_t)D / 2 * 4);
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	int32_t *pos = xmalloc((size_t)T * 4);
	for (int t = 0; t < T; t++)
		pos[t] = (int32_t)bk_rng_below(&rng, 4096);
	int32_t *pr = gc_put_i(ref, pos, T), *pd = gc_put_i(dut, pos, T);
	pair pinv = pput(inv, D / 2), px = pput(x, N);
	ref->rope_forward(px.r, pr, pinv.r, T, n, D);
	dut->rope_forward(px.d, pd, pinv.d, T, n, D);
	pcmp("rope_forward", sz, "x", px, TOL_FP32);
	pair pg = pput(x, N);
	ref->rope_backward(pg.r, pr, pinv.r, T, n, D);
	dut->rope_backward(pg.d, pd, pinv.d, T, n, D);
	pcmp("rope_backward", sz, "dx", pg, TOL_FP32);
	pdrop(pinv), pdrop(px), pdrop(pg);
	ref->free(pr), dut->free(pd);
	free(x), free(inv), free(pos);
}

/* a GLU backward in place (dgate over gate, dup over up: gpu/ops.h allows it) */
typedef void glu_bwd_fn(float *, float *, const float *, const float *, const float *, size_t);
static void glu_in_place(const char *op, const char *sz, glu_bwd_fn *fr, glu_bwd_fn *fd,
			 const float *g, const float *u, pair dh, size_t n)
{
	pair ig = pput(g, n), iu = pput(u, n);
	fr(ig.r, iu.r, dh.r, ig.r, iu.r, n);
	fd(ig.d, iu.d, dh.d, ig.d, iu.d, n);
	pcmp(op, sz, "dgate in place", ig, TOL_FP32);
	pcmp(op, sz, "dup in place", iu, TOL_FP32);
	pdrop(ig), pdrop(iu);
}

static void t_swiglu_residual(int T, int I)
{
	char sz[64];
	snprintf(sz, sizeof sz, "T=%d I=%d", T, I);
	size_t n = (size_t)T * I;
	float *g = gc_rand(&rng, n, 6), *u = gc_rand(&rng, n, 2), *dh = gc_rand(&rng, n, 1),
	      *dg0 = gc_rand(&rng, n, 1), *du0 = gc_rand(&rng, n, 1);
	pair pg = pput(g, n), pu = pput(u, n), h = pput(NULL, n);
	ref->swiglu_forward(h.r, pg.r, pu.r, n);
	dut->swiglu_forward(h.d, pg.d, pu.d, n);
	pcmp("swiglu_forward", sz, "h", h, TOL_FP32);
	pair pdh = pput(dh, n), dg = pput(dg0, n), du = pput(du0, n);
	ref->swiglu_backward(dg.r, du.r, pdh.r, pg.r, pu.r, n);
	dut->swiglu_backward(dg.d, du.d, pdh.d, pg.d, pu.d, n);
	pcmp("swiglu_backward", sz, "dgate", dg, TOL_FP32);
	pcmp("swiglu_backward", sz, "dup", du, TOL_FP32);
	glu_in_place("swiglu_backward", sz, ref->swiglu_backward, dut->swiglu_backward, g, u, pdh, n);
	pair o = pput(NULL, n);
	ref->residual_forward(o.r, pg.r, pu.r, n);
	dut->residual_forward(o.d, pg.d, pu.d, n);
	pcmp("residual_forward", sz, "out", o, TOL_EXACT);
	ref->residual_forward(pg.r, pg.r, pu.r, n); /* out aliasing a */
	dut->residual_forward(pg.d, pg.d, pu.d, n);
	pcmp("residual_forward", sz, "alias", pg, TOL_EXACT);
	pdrop(pg), pdrop(pu), pdrop(h), pdrop(pdh), pdrop(dg), pdrop(du), pdrop(o);
	free(g), free(u), free(dh), free(dg0), free(du0);
}

/* GeGLU (Gemma), the frozen bias (Qwen2) and the final-logit softcap (Gemma-2) */
static void t_geglu_bias_softcap(int T, int I)
{
	char sz[64];
	snprintf(sz, sizeof sz, "T=%d I=%d", T, I);
	size_t n = (size_t)T * I;
	float *g = gc_rand(&rng, n, 6), *u = gc_rand(&rng, n, 2), *dh = gc_rand(&rng, n, 1),
	      *dg0 = gc_rand(&rng, n, 1), *du0 = gc_rand(&rng, n, 1),
	      *b = gc_rand_bf16(&rng, I, 1);
	pair pg = pput(g, n), pu = pput(u, n), h = pput(NULL, n);
	ref->geglu_forward(h.r, pg.r, pu.r, n);
	dut->geglu_forward(h.d, pg.d, pu.d, n);
	pcmp("geglu_forward", sz, "h", h, TOL_FP32);
	pair pdh = pput(dh, n), dg = pput(dg0, n), du = pput(du0, n);
	ref->geglu_backward(dg.r, du.r, pdh.r, pg.r, pu.r, n);
	dut->geglu_backward(dg.d, du.d, pdh.d, pg.d, pu.d, n);
	pcmp("geglu_backward", sz, "dgate", dg, TOL_FP32);
	pcmp("geglu_backward", sz, "dup", du, TOL_FP32);
	glu_in_place("geglu_backward", sz, ref->geglu_backward, dut->geglu_backward, g, u, pdh, n);
	bk_weight *br = ref->weight_upload(b, 1, I), *bd = dut->weight_upload(b, 1, I);
	pair y = pput(u, n);
	ref->bias_forward(y.r, br, T);
	dut->bias_forward(y.d, bd, T);
	pcmp("bias_forward", sz, "y+=", y, TOL_FP32);
	pair x = pput(g, n); /* |g| up to 6: the cap of 2 bends them */
	ref->softcap_forward(x.r, 2.0f, n);
	dut->softcap_forward(x.d, 2.0f, n);
	pcmp("softcap_forward", sz, "x", x, TOL_FP32);
	ref->weight_free(br), dut->weight_free(bd);
	pdrop(pg), pdrop(pu), pdrop(h), pdrop(pdh), pdrop(dg), pdrop(du), pdrop(y), pdrop(x);
	free(g), free(u), free(dh), free(dg0), free(du0), free(b);
}

/* ap scale 0: D^-0.5 */
static void t_attention_p(int T, int NKV, int ratio, int D, int P, float scale, float cap,
			  int window)
{
	int NH = NKV * ratio, S = T < 4 ? 1 : 1 + (int)bk_rng_below(&rng, 4);
	bk_attn ap = bk_attn_default(D);
	if (scale > 0)
		ap.scale = scale;
	ap.softcap = cap;
	ap.window = window;
	char sz[112];
	snprintf(sz, sizeof sz, "T=%d S=%d NH=%d NKV=%d D=%d P=%d cap %g W %d", T, S, NH, NKV, D,
		 P, (double)cap, window);
	if (!dut->attention_forward || !dut->attention_backward) {
		report("attention_forward", sz, "", 0, 0, 0, !dut->attention_forward);
		report("attention_backward", sz, "", 0, 0, 0, !dut->attention_backward);
		return;
	}
	int32_t *cu = xmalloc((size_t)(S + 1) * 4);
	cu[0] = 0;
	cu[S] = T;
	for (int s = 1; s < S; s++) /* random cut points, sequences of length >= 0 */
		cu[s] = cu[s - 1] + (int)bk_rng_below(&rng, (uint64_t)(T - cu[s - 1]) + 1);
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, npk = (size_t)P * NKV * D;
	float *q = gc_rand(&rng, nq, 1), *k = gc_rand(&rng, nk, 1), *v = gc_rand(&rng, nk, 1),
	      *dout = gc_rand(&rng, nq, 1), *pk = gc_rand(&rng, npk, 1),
	      *pv = gc_rand(&rng, npk, 1), *dq0 = gc_rand(&rng, nq, 1),
	      *dk0 = gc_rand(&rng, nk, 1), *dv0 = gc_rand(&rng, nk, 1);
	int32_t *cr = gc_put_i(ref, cu, S + 1), *cd = gc_put_i(dut, cu, S + 1);
	pair pq = pput(q, nq), pk_ = pput(k, nk), pv_ = pput(v, nk), o = pput(NULL, nq),
	     lse = pput(NULL, (size_t)NH * T), ppk = pput(pk, npk), ppv = pput(pv, npk);
	ref->attention_forward(o.r, lse.r, pq.r, pk_.r, pv_.r, cr, S, T, NH, NKV, D,
			       P ? ppk.r : NULL, P ? ppv.r : NULL, P, &ap);
	dut->attention_forward(o.d, lse.d, pq.d, pk_.d, pv_.d, cd, S, T, NH, NKV, D,
			       P ? ppk.d : NULL, P ? ppv.d : NULL, P, &ap);
	pcmp("attention_forward", sz, "out", o, TOL_ATTN);
	pcmp("attention_forward", sz, "lse", lse, TOL_ATTN);
	if (!P) { /* the backward reads the reference's out and lse on both sides */
		float *oh = xmalloc(nq * 4), *lh = xmalloc((size_t)NH * T * 4);
		gc_get(ref, oh, o.r, nq);
		gc_get(ref, lh, lse.r, (size_t)NH * T);
		pair o2 = pput(oh, nq), l2 = pput(lh, (size_t)NH * T), pdo = pput(dout, nq),
		     dq = pput(dq0, nq), dk = pput(dk0, nk), dv = pput(dv0, nk);
		ref->attention_backward(dq.r, dk.r, dv.r, pdo.r, pq.r, pk_.r, pv_.r, o2.r, l2.r, cr,
					S, T, NH, NKV, D, &ap);
		dut->attention_backward(dq.d, dk.d, dv.d, pdo.d, pq.d, pk_.d, pv_.d, o2.d, l2.d, cd,
					S, T, NH, NKV, D, &ap);
		pcmp("attention_backward", sz, "dq+=", dq, TOL_ATTN);
		pcmp("attention_backward", sz, "dk+=", dk, TOL_ATTN);
		pcmp("attention_backward", sz, "dv+=", dv, TOL_ATTN);
		pdrop(o2), pdrop(l2), pdrop(pdo), pdrop(dq), pdrop(dk), pdrop(dv);
		free(oh), free(lh);
	}
	pdrop(pq), pdrop(pk_), pdrop(pv_), pdrop(o), pdrop(lse), pdrop(ppk), pdrop(ppv);
	ref->free(cr), dut->free(cd);
	free(cu), free(q), free(k), free(v), free(dout), free(pk), free(pv), free(dq0), free(dk0),
		free(dv0);
}

static void t_attention(int T, int NKV, int ratio, int D, int P)
{
	t_attention_p(T, NKV, ratio, D, P, 0, 0, 0);
}

/* Every function slot the host twin fills must be filled on the device too: ops that
 * other files add to bk_ops (loss, optimizer, ...) are found here by position even
 * before this file knows their names, and an empty one is a failure. */
static void t_complete(void)
{
	size_t nslots = (sizeof(bk_ops) - offsetof(bk_ops, alloc)) / sizeof(void (*)(void));
	const char *rb = (const char *)ref + offsetof(bk_ops, alloc);
	const char *db = (const char *)dut + offsetof(bk_ops, alloc);
	/* names of the slots this file knows (others are reported by position) */
#define K(f) { offsetof(bk_ops, f), #f }
	static const struct {
		size_t off;
		const char *name;
	} known[] = { K(attention_forward), K(attention_backward), K(gather_rows),
		      K(scatter_rows), K(kl_exact), K(kl_topk), K(teacher_topk),
		      K(teacher_logprobs), K(adamw_step), K(adamw8_step), K(grad_sumsq), K(scale),
		      K(geglu_forward), K(geglu_backward), K(bias_forward), K(softcap_forward) };
#undef K
	int missing = 0;
	for (size_t i = 0; i < nslots; i++) {
		void (*fr)(void), (*fd)(void);
		memcpy(&fr, rb + i * sizeof(fr), sizeof(fr));
		memcpy(&fd, db + i * sizeof(fd), sizeof(fd));
		if (fr && !fd) {
			size_t off = offsetof(bk_ops, alloc) + i * sizeof(fr);
			const char *name = NULL;
			for (size_t j = 0; j < sizeof(known) / sizeof(known[0]); j++)
				if (known[j].off == off)
					name = known[j].name;
			char what[64];
			snprintf(what, sizeof what, "slot %zu (byte offset %zu)", i, off);
			report(name ? name : "op table", what, "", 0, 0, 0, 1);
			missing++;
		}
	}
	char what[64];
	snprintf(what, sizeof what, "%zu function slots", nslots);
	report("op table complete", what, "", (double)missing, 0, 0, 0);
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	ref = &bk_ops_host;
#ifdef BK_HAVE_CUDA
	dut = &bk_ops_cuda;
#else
	dut = NULL;
#endif
	int tiny = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--host"))
			dut = &bk_ops_host;
		else if (!strcmp(argv[i], "--tiny"))
			tiny = 1;
		else
			die_usage("usage: test_cuda_ops [--host] [--tiny]");
	}
	if (!dut)
		die("test_cuda_ops: built without CUDA; only --host is available");
	bk_rng_seed(&rng, 20240611);
	printf("# %s vs %s (relerr = max|dut-ref| / max(max|ref|, %g))\n", dut->name, ref->name,
	       FLOOR);
	t_complete();
	static const int Ts[] = { 1, 7, 64, 257 }, Hs[] = { 64, 96 }, tinyTs[] = { 1, 7, 33 };
	for (size_t a = 0; a < (tiny ? 3u : 4u); a++) {
		int T = tiny ? tinyTs[a] : Ts[a];
		for (size_t b = 0; b < (tiny ? 1u : 2u); b++) {
			int H = Hs[b];
			t_embedding(T, H);
			t_rmsnorm(T, H);
			t_linear(T, H, H);
			t_linear(T, H, 2 * H + 7);    /* odd out */
			t_linear(T, 3 * H + 1, H);    /* odd in */
			t_lora(T, H, 3 * H, 8, 0.0f);
			t_lora(T, 3 * H + 1, H, 5, 0.1f); /* odd in and rank, dropout */
			t_swiglu_residual(T, 3 * H + 1);
			t_geglu_bias_softcap(T, 3 * H + 1);
		}
		static const int Ds[] = { 64, 128 }, ratios[] = { 1, 4, 8 };
		for (size_t d = 0; d < 2; d++) {
			t_rope(T, 1, Ds[d]);
			t_rope(T, 8, Ds[d]);
			for (size_t r = 0; r < 3; r++) {
				t_attention(T, 2, ratios[r], Ds[d], 0);
				if (r == 1)
					t_attention(T, 2, ratios[r], Ds[d], 5); /* with a prefix */
			}
			/* scale, softcap and sliding window, with and without a prefix */
			t_attention_p(T, 2, 4, Ds[d], 0, 0.0625f, 2.0f, 0);
			t_attention_p(T, 2, 4, Ds[d], 0, 0, 0, 5);
			t_attention_p(T, 2, 4, Ds[d], 7, 0, 0, 5);
			t_attention_p(T, 1, 8, Ds[d], 7, 0.2f, 3.0f, 40);
		}
	}
	printf("# %d checks, %d failed\n", n_lines, n_fail);
	return n_fail ? 1 : 0;
}
