/* check_linear.c - on a GPU: the three CUDA paths of the projection-group ops
 * (bk_ops.proj_forward / proj_backward, gpu/cuda/cuda_proj.cuh): v1 (BK_LINEAR=v1, the
 * default: each member's linear and LoRA kernels in turn), v2 (BK_LINEAR=v2: one bf16
 * copy of x, one GEMM for the members' A, the base GEMM accumulating onto the LoRA B
 * product) and v3 (BK_LINEAR=v3: v2 with the members' base GEMMs of equal shape in one
 * batched launch, and the backward's dx as ONE GEMM over the interleaved bf16 dy and the
 * stacked weights, K = sum out), against the host twin on the same random inputs,
 * forward (y) and backward (dx, dA, dB, accumulated onto random start values); then the
 * three timed with CUDA events at the TinyLlama-1.1B shape (hidden 2048, intermediate
 * 5632, 32/4 heads of 64, 16 x 256 tokens, LoRA r = 16 on all seven projections), one
 * row per group and direction, a per-layer total and a ranking, so one GPU run validates
 * and ranks them.  Cases 0/1 and 4/5 have equal weight shapes and new random weights, and
 * every path uploads and frees its own: a stale stacked copy of v3 (a weight freed and
 * another uploaded at its address without the copy dropped) fails the second case.
 * One line per path, case and output; exit 1 on any failure (outputs start as NaN,
 * fenced by sentinels that catch out-of-bounds writes; NaN never passes).
 *
 * Bounds, elementwise, with u = 2^-8 (bf16, round to nearest), v = 2^-10 (TF32: cuBLAS
 * may truncate rather than round) and g(K) = (K + 2) 2^-23 (an fp32 sum of K products,
 * once on each side).  The device rounds W to bf16 at upload and x (or drop(x)) to bf16
 * in the GEMM, so each product x W carries <= 2.01u relative error; v1 reads x, A, xa and
 * B as TF32 (<= 2.01v per product), v2 reads x and A as bf16 (2.01u) and xa, B as TF32.
 * xd = drop(x), bounded by |x| / (1-p) (p = 0: x).  With
 *   S1[t,o] = sum_i |x_ti| |W_oi|          S2[t,r] = sum_i |xd_ti| |A_ri|  (>= |xa_tr|)
 *   S3[t,o] = sum_r S2_tr |B_or|           cb = 2.01u + g(in)
 *   cl = 2.01u + g(in) + 2.01v + g(R)      (the error of xa, then of the TF32 xa B)
 *   y:   |dy| <= cb S1 + scale cl S3 + 2^-22 |y_ref|
 * Backward, for member j with D2[t,r] = sum_o |dy_to| |B_or| (>= |dxa_tr| / scale):
 *   dx:  <= (2.01u + g(N + n)) sum_j |dy_j| |W_j|   (N = sum_j out_j: v3 sums the N
 *           products in one GEMM, v1/v2 n sums of out_j each, then n additions)  +  scale (2.01u + g(out) + 2.01v + g(R))
 *           sum_j sum_r D2_tr |A_ri| / (1-p)  +  2^-20 (|dx0| + |dx_ref|)
 *           (v2/v3 round dy and B to bf16 for dxa: 2.01u; v1 TF32: 2.01v <= 2.01u)
 *   dB:  <= scale (2.01u + g(T) + cl) sum_t S2_tr |dy_to| + 2^-21 (|dB0| + |dB_ref|)
 *           (the product xa dy in bf16 (v2/v3) or TF32 (v1), plus the forward's error of xa)
 *   dA:  <= scale (2.01u + g(out) + 2.01v + g(T)) sum_t D2_tr |xd_ti| + 2^-21 (...)
 * The sums are computed here (OpenBLAS sgemm on absolute values, rel. error far below
 * the 1% margin the bounds get).  These are worst-case bounds (errors grow like sqrt(K)
 * in practice), but still tight enough to see a missing LoRA term: each case also
 * checks that v2 and v3 compared with the host WITHOUT the LoRA term fail ("sensitivity").
 *
 * --host (no GPU; the dry run): the host twin's proj ops against its own linear and
 * LoRA ops called in turn (bit for bit), and against the host on bf16-rounded x, W, A
 * and dy (an emulation of the device's input rounding) with the bounds above, plus the
 * sensitivity lines.  --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU):
 * the cases above without the realistic one, and the timing rows at a small layer
 * (H 128, I 352, 4/1 heads of 32, 64 tokens, r 8, 2 layers).
 * Usage: check_linear [--host | --no-bench | --tiny] */
#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "formats/safetensors.h"
#include "gpu/ops.h"
#include "tests/gpu/gpu_check.h"
#ifdef BK_HAVE_CUDA
#include "gpu/cuda/cuda.h"
#include "gpu/cuda/cuda_attention_tc.h" /* bk_cuda_time_ms */
#endif

#define U_BF16 0x1p-8
#define V_TF32 0x1p-10

static const bk_ops *H = &bk_ops_host, *G;
static bk_rng rng;
static int n_fail, n_lines, host_mode;

static double gam(double K) { return (K + 2) * 0x1p-23; }

static float *habs(const float *x, size_t n, float mul)
{
	float *y = xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		y[i] = fabsf(x[i]) * mul;
	return y;
}

static float *hround(const float *x, size_t n)
{
	float *y = xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		y[i] = bk_bf16_to_f32(bk_f32_to_bf16(x[i]));
	return y;
}

/* the implementation under test: the device, or (--host) the host twin itself */
static const bk_ops *D(void) { return host_mode ? H : G; }

/* got vs want [n] against the elementwise bound b [n] (b NULL: exact); one line.
 * expect_fail: a sensitivity line, which passes when the comparison FAILS. */
static void check(const char *path, const char *size, const char *what, const float *got,
		  const float *want, const float *b, size_t n, int damage, int expect_fail)
{
	double worst = 0, err = 0;
	int nan = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (isnan(got[i]) || isnan(d)) {
			nan = 1;
			break;
		}
		double r = b ? d / (1.01 * b[i]) : (d > 0 ? INFINITY : 0);
		if (r > worst)
			worst = r, err = d;
	}
	int within = !nan && !damage && worst <= 1;
	int ok = expect_fail ? !nan && !damage && !within : within;
	n_lines++;
	n_fail += !ok;
	printf("linear %-4s %-44s %-10s err %-10.3g err/bound %-9.3g%s%s %s\n", path, size, what,
	       nan ? INFINITY : err, nan ? INFINITY : worst, damage ? " sentinel damaged" : "",
	       expect_fail ? " (must exceed 1)" : "", ok ? "ok" : "FAIL");
}

/* one group: n members of one input [T,in]; lora[j] 0/1; outs[j] out features */
typedef struct gcase {
	int T, in, n, outs[BK_PROJ_MAX], lora[BK_PROJ_MAX], R;
	float scale, drop;
} gcase;

/* row-major C [m,n] = A [m,k] B [k,n] (transposes as cblas), beta 0 */
static void mm(int ta, int tb, int m, int n, int k, const float *A, const float *B, float *C)
{
	cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
		    m, n, k, 1.0f, A, ta ? m : k, B, tb ? k : n, 0.0f, C, n);
}

/* the inputs and the host's results of one case */
typedef struct gdata {
	const gcase *g;
	float *x, *W[BK_PROJ_MAX], *A[BK_PROJ_MAX], *B[BK_PROJ_MAX], *dy[BK_PROJ_MAX];
	float *dx0, *dA0[BK_PROJ_MAX], *dB0[BK_PROJ_MAX];
	/* reference results and bounds */
	float *y[BK_PROJ_MAX], *ybase[BK_PROJ_MAX], *dx, *dxbase, *dA[BK_PROJ_MAX], *dB[BK_PROJ_MAX];
	float *by[BK_PROJ_MAX], *bdx, *bdA[BK_PROJ_MAX], *bdB[BK_PROJ_MAX];
} gdata;

/* runs ops' proj_forward + proj_backward on host arrays (uploaded to ops' memory) and
 * returns the results in y/dx/dA/dB (host arrays allocated here); wup: weight_upload of
 * ops; fwd/bwd: the entries to call (NULL: ops'). base: no LoRA at all. */
typedef void (*proj_fwd_fn)(const bk_proj *, int, const float *, float *, int, int, int, float,
			    float, float *);
typedef void (*proj_bwd_fn)(float *, const bk_proj *, int, const float *, const float *, int,
			    int, int, float, float, float *);

static int run_ops(const bk_ops *ops, proj_fwd_fn fwd, proj_bwd_fn bwd, const gcase *g,
		   float *const *W, float *x, float *const *A, float *const *B, float *const *dy,
		   const float *dx0, float *const *dA0, float *const *dB0, int base, float **y,
		   float **dx, float **dA, float **dB)
{
	int hm = host_mode;
	/* put/get work on D(): point it at ops */
	host_mode = ops == H;
	int T = g->T, in = g->in, R = g->R, n = g->n, dmg = 0;
	bk_proj p[BK_PROJ_MAX];
	bk_weight *w[BK_PROJ_MAX];
	float *dA_d[BK_PROJ_MAX] = {0}, *dB_d[BK_PROJ_MAX] = {0}, *A_d[BK_PROJ_MAX] = {0};
	float *B_d[BK_PROJ_MAX] = {0}, *y_d[BK_PROJ_MAX], *dy_d[BK_PROJ_MAX];
	for (int j = 0; j < n; j++) {
		int out = g->outs[j], lo = g->lora[j] && !base;
		w[j] = ops->weight_upload(W[j], out, in);
		y_d[j] = gc_put(D(), NULL, (size_t)T * out);
		dy_d[j] = gc_put(D(), dy[j], (size_t)T * out);
		if (lo) {
			A_d[j] = gc_put(D(), A[j], (size_t)R * in),
			B_d[j] = gc_put(D(), B[j], (size_t)out * R);
			dA_d[j] = gc_put(D(), dA0[j], (size_t)R * in),
			dB_d[j] = gc_put(D(), dB0[j], (size_t)out * R);
		}
		p[j] = (bk_proj){ .W = w[j], .A = A_d[j], .B = B_d[j],
				  .key = 0x1234 + 77 * (uint64_t)j, .y = y_d[j], .dy = dy_d[j],
				  .dA = dA_d[j], .dB = dB_d[j] };
	}
	float *x_d = gc_put(D(), x, (size_t)T * in), *dx_d = gc_put(D(), dx0, (size_t)T * in);
	float *xa_d = gc_put(D(), NULL, (size_t)n * T * (R ? R : 1));
	float *sc_d = gc_put(D(), NULL, (size_t)T * (in + R));
	(fwd ? fwd : ops->proj_forward)(p, n, x_d, xa_d, T, in, R, g->scale, g->drop, sc_d);
	(bwd ? bwd : ops->proj_backward)(dx_d, p, n, x_d, xa_d, T, in, R, g->scale, g->drop,
					 sc_d);
	*dx = xmalloc((size_t)T * in * sizeof(float));
	dmg += gc_get(D(), *dx, dx_d, (size_t)T * in);
	for (int j = 0; j < n; j++) {
		int out = g->outs[j];
		y[j] = xmalloc((size_t)T * out * sizeof(float));
		dmg += gc_get(D(), y[j], y_d[j], (size_t)T * out);
		dA[j] = dB[j] = NULL;
		if (A_d[j]) {
			dA[j] = xmalloc((size_t)R * in * sizeof(float));
			dB[j] = xmalloc((size_t)out * R * sizeof(float));
			dmg += gc_get(D(), dA[j], dA_d[j], (size_t)R * in);
			dmg += gc_get(D(), dB[j], dB_d[j], (size_t)out * R);
		}
		gc_drop(D(), y_d[j]), gc_drop(D(), dy_d[j]), gc_drop(D(), A_d[j]),
			gc_drop(D(), B_d[j]), gc_drop(D(), dA_d[j]);
		gc_drop(D(), dB_d[j]);
		ops->weight_free(w[j]);
	}
	gc_drop(D(), x_d), gc_drop(D(), dx_d), gc_drop(D(), xa_d), gc_drop(D(), sc_d);
	host_mode = hm;
	return dmg;
}

static void free_res(const gcase *g, float **y, float *dx, float **dA, float **dB)
{
	for (int j = 0; j < g->n; j++)
		free(y[j]), free(dA[j]), free(dB[j]);
	free(dx);
}

static void make_data(gdata *d, const gcase *g)
{
	int T = g->T, in = g->in, R = g->R, n = g->n;
	memset(d, 0, sizeof(*d));
	d->g = g;
	float ws = 1.0f / sqrtf((float)in);
	d->x = gc_rand(&rng, (size_t)T * in, 1.0f);
	d->dx0 = gc_rand(&rng, (size_t)T * in, 0.5f);
	for (int j = 0; j < n; j++) {
		int out = g->outs[j];
		d->W[j] = gc_rand(&rng, (size_t)out * in, ws);
		d->dy[j] = gc_rand(&rng, (size_t)T * out, 1.0f);
		d->A[j] = gc_rand(&rng, (size_t)R * in, ws);
		d->B[j] = gc_rand(&rng, (size_t)out * R, 1.0f);
		d->dA0[j] = gc_rand(&rng, (size_t)R * in, 0.5f);
		d->dB0[j] = gc_rand(&rng, (size_t)out * R, 0.5f);
	}
	/* the host's results, with and without LoRA */
	float *dAb[BK_PROJ_MAX], *dBb[BK_PROJ_MAX];
	run_ops(H, NULL, NULL, g, d->W, d->x, d->A, d->B, d->dy, d->dx0, d->dA0, d->dB0, 0, d->y,
		&d->dx, d->dA, d->dB);
	run_ops(H, NULL, NULL, g, d->W, d->x, d->A, d->B, d->dy, d->dx0, d->dA0, d->dB0, 1,
		d->ybase, &d->dxbase, dAb, dBb);
	for (int j = 0; j < n; j++)
		free(dAb[j]), free(dBb[j]);

	/* the bounds (module comment) */
	double u2 = 2.01 * U_BF16, v2 = 2.01 * V_TF32;
	float inv = g->drop > 0 ? 1.0f / (1.0f - g->drop) : 1.0f;
	float *ax = habs(d->x, (size_t)T * in, 1), *axd = habs(d->x, (size_t)T * in, inv);
	float *s2 = xmalloc((size_t)T * R * sizeof(float) + 4);
	float *d2 = xmalloc((size_t)T * R * sizeof(float) + 4);
	float *tmp = xmalloc((size_t)T * in * sizeof(float));
	int outmax = 0, outsum = 0;
	for (int j = 0; j < n; j++) {
		outmax = g->outs[j] > outmax ? g->outs[j] : outmax;
		outsum += g->outs[j];
	}
	double cb = u2 + gam(in), cl = u2 + gam(in) + v2 + gam(R);
	double cdx = u2 + gam(outsum + n), cdxl = u2 + gam(outmax) + v2 + gam(R);
	double cdB = u2 + gam(T) + cl, cdA = u2 + gam(outmax) + v2 + gam(T);
	d->bdx = xcalloc((size_t)T * in, sizeof(float));
	for (int j = 0; j < n; j++) {
		int out = g->outs[j];
		size_t no = (size_t)T * out;
		float *aW = habs(d->W[j], (size_t)out * in, 1), *ady = habs(d->dy[j], no, 1);
		float *s1 = xmalloc(no * sizeof(float));
		mm(0, 1, T, out, in, ax, aW, s1);
		d->by[j] = xmalloc(no * sizeof(float));
		for (size_t i = 0; i < no; i++)
			d->by[j][i] = (float)(cb * s1[i] + 0x1p-22 * fabs(d->y[j][i]));
		/* dx base part: |dy| |W| */
		mm(0, 0, T, in, out, ady, aW, tmp);
		for (size_t i = 0; i < (size_t)T * in; i++)
			d->bdx[i] += (float)(cdx * tmp[i]);
		if (g->lora[j]) {
			float *aA = habs(d->A[j], (size_t)R * in, 1);
			float *aB = habs(d->B[j], (size_t)out * R, 1);
			mm(0, 1, T, R, in, axd, aA, s2); /* S2 [T,R] */
			float *s3 = xmalloc(no * sizeof(float));
			mm(0, 1, T, out, R, s2, aB, s3);
			for (size_t i = 0; i < no; i++)
				d->by[j][i] += (float)(g->scale * cl * s3[i]);
			mm(0, 0, T, R, out, ady, aB, d2); /* D2 [T,R] */
			mm(0, 0, T, in, R, d2, aA, tmp);
			for (size_t i = 0; i < (size_t)T * in; i++)
				d->bdx[i] += (float)(g->scale * cdxl * inv * tmp[i]);
			/* dB [out,R]: sum_t |dy_to| S2_tr */
			d->bdB[j] = xmalloc((size_t)out * R * sizeof(float));
			mm(1, 0, out, R, T, ady, s2, d->bdB[j]);
			for (size_t i = 0; i < (size_t)out * R; i++)
				d->bdB[j][i] = (float)(g->scale * cdB * d->bdB[j][i] +
						       0x1p-21 * (fabs(d->dB0[j][i]) + fabs(d->dB[j][i])));
			/* dA [R,in]: sum_t D2_tr |xd_ti| */
			d->bdA[j] = xmalloc((size_t)R * in * sizeof(float));
			mm(1, 0, R, in, T, d2, axd, d->bdA[j]);
			for (size_t i = 0; i < (size_t)R * in; i++)
				d->bdA[j][i] = (float)(g->scale * cdA * d->bdA[j][i] +
						       0x1p-21 * (fabs(d->dA0[j][i]) + fabs(d->dA[j][i])));
			free(aA), free(aB), free(s3);
		}
		free(aW), free(ady), free(s1);
	}
	for (size_t i = 0; i < (size_t)T * in; i++)
		d->bdx[i] += (float)(0x1p-20 * (fabs(d->dx0[i]) + fabs(d->dx[i])));
	free(ax), free(axd), free(s2), free(d2), free(tmp);
}

static void free_data(gdata *d)
{
	free(d->x), free(d->dx0), free(d->dx), free(d->dxbase), free(d->bdx);
	for (int j = 0; j < d->g->n; j++) {
		free(d->W[j]), free(d->A[j]), free(d->B[j]), free(d->dy[j]), free(d->dA0[j]);
		free(d->dB0[j]), free(d->y[j]), free(d->ybase[j]), free(d->dA[j]), free(d->dB[j]);
		free(d->by[j]), free(d->bdA[j]), free(d->bdB[j]);
	}
}

/* results of one path against the host: bounds, or exact (exact != 0) */
static void compare(const char *path, const char *size, const gdata *d, float **y, float *dx,
		    float **dA, float **dB, int dmg, int exact, int sensitivity)
{
	const gcase *g = d->g;
	int T = g->T, in = g->in, R = g->R;
	char what[32];
	for (int j = 0; j < g->n; j++) {
		int out = g->outs[j];
		snprintf(what, sizeof what, "y%d", j);
		check(path, size, what, y[j], d->y[j], exact ? NULL : d->by[j], (size_t)T * out, dmg,
		      0);
		if (sensitivity && g->lora[j]) {
			snprintf(what, sizeof what, "y%d-noLoRA", j);
			check(path, size, what, y[j], d->ybase[j], d->by[j], (size_t)T * out, dmg, 1);
		}
		if (g->lora[j]) {
			snprintf(what, sizeof what, "dA%d", j);
			check(path, size, what, dA[j], d->dA[j], exact ? NULL : d->bdA[j],
			      (size_t)R * in, dmg, 0);
			snprintf(what, sizeof what, "dB%d", j);
			check(path, size, what, dB[j], d->dB[j], exact ? NULL : d->bdB[j],
			      (size_t)out * R, dmg, 0);
		}
	}
	check(path, size, "dx", dx, d->dx, exact ? NULL : d->bdx, (size_t)T * in, dmg, 0);
	int any = 0;
	for (int j = 0; j < g->n; j++)
		any |= g->lora[j];
	if (sensitivity && any)
		check(path, size, "dx-noLoRA", dx, d->dxbase, d->bdx, (size_t)T * in, dmg, 1);
}

/* the host twin's linear and LoRA ops in turn: what proj_* must equal bit for bit */
static void host_compose_fwd(const bk_proj *p, int n, const float *x, float *xa, int T,
			     int in, int R, float scale, float drop, float *scratch)
{
	for (int j = 0; j < n; j++) {
		H->linear_forward(p[j].y, x, p[j].W, T);
		if (p[j].A)
			H->lora_forward(p[j].y, xa + (size_t)j * T * R, x, p[j].A, p[j].B, T, in,
					p[j].W->rows, R, scale, drop, p[j].key, scratch);
	}
}

static void host_compose_bwd(float *dx, const bk_proj *p, int n, const float *x,
			     const float *xa, int T, int in, int R, float scale, float drop,
			     float *scratch)
{
	for (int j = 0; j < n; j++) {
		H->linear_backward(dx, p[j].dy, p[j].W, T);
		if (p[j].A)
			H->lora_backward(dx, p[j].dA, p[j].dB, p[j].dy, x, xa + (size_t)j * T * R,
					 p[j].A, p[j].B, T, in, p[j].W->rows, R, scale, drop,
					 p[j].key, scratch);
	}
}

static void run_case(const gcase *g)
{
	char size[96];
	snprintf(size, sizeof size, "T=%d in=%d out=%d/%d/%d lora=%d%d%d R=%d p=%g", g->T, g->in,
		 g->outs[0], g->n > 1 ? g->outs[1] : 0, g->n > 2 ? g->outs[2] : 0, g->lora[0],
		 g->n > 1 ? g->lora[1] : 0, g->n > 2 ? g->lora[2] : 0, g->R, (double)g->drop);
	gdata d;
	make_data(&d, g);
	float *y[BK_PROJ_MAX], *dx, *dA[BK_PROJ_MAX], *dB[BK_PROJ_MAX];
	int dmg;
	if (host_mode) {
		/* the host's proj ops = its own ops in turn, bit for bit */
		dmg = run_ops(H, host_compose_fwd, host_compose_bwd, g, d.W, d.x, d.A, d.B, d.dy,
			      d.dx0, d.dA0, d.dB0, 0, y, &dx, dA, dB);
		compare("host", size, &d, y, dx, dA, dB, dmg, 1, 0);
		free_res(g, y, dx, dA, dB);
		/* the device's input rounding emulated: bf16 x, W, A, dy */
		float *xr = hround(d.x, (size_t)g->T * g->in), *Wr[BK_PROJ_MAX], *Ar[BK_PROJ_MAX];
		float *dyr[BK_PROJ_MAX];
		for (int j = 0; j < g->n; j++) {
			Wr[j] = hround(d.W[j], (size_t)g->outs[j] * g->in);
			Ar[j] = hround(d.A[j], (size_t)g->R * g->in);
			dyr[j] = hround(d.dy[j], (size_t)g->T * g->outs[j]);
		}
		dmg = run_ops(H, NULL, NULL, g, Wr, xr, Ar, d.B, dyr, d.dx0, d.dA0, d.dB0, 0, y, &dx,
			      dA, dB);
		compare("emul", size, &d, y, dx, dA, dB, dmg, 0, 1);
		free_res(g, y, dx, dA, dB);
		free(xr);
		for (int j = 0; j < g->n; j++)
			free(Wr[j]), free(Ar[j]), free(dyr[j]);
	} else {
#ifdef BK_HAVE_CUDA
		dmg = run_ops(G, bk_cuda_proj_forward_v1, bk_cuda_proj_backward_v1, g, d.W, d.x, d.A,
			      d.B, d.dy, d.dx0, d.dA0, d.dB0, 0, y, &dx, dA, dB);
		compare("v1", size, &d, y, dx, dA, dB, dmg, 0, 0);
		free_res(g, y, dx, dA, dB);
		dmg = run_ops(G, bk_cuda_proj_forward_v2, bk_cuda_proj_backward_v2, g, d.W, d.x, d.A,
			      d.B, d.dy, d.dx0, d.dA0, d.dB0, 0, y, &dx, dA, dB);
		compare("v2", size, &d, y, dx, dA, dB, dmg, 0, 1);
		free_res(g, y, dx, dA, dB);
		dmg = run_ops(G, bk_cuda_proj_forward_v3, bk_cuda_proj_backward_v3, g, d.W, d.x, d.A,
			      d.B, d.dy, d.dx0, d.dA0, d.dB0, 0, y, &dx, dA, dB);
		compare("v3", size, &d, y, dx, dA, dB, dmg, 0, 1);
		free_res(g, y, dx, dA, dB);
#endif
	}
	free_data(&d);
}

/* ---- timing (device only) ---- */
#ifdef BK_HAVE_CUDA
typedef struct bench_args {
	proj_fwd_fn fwd;
	proj_bwd_fn bwd;
	bk_proj p[BK_PROJ_MAX];
	int n, T, in, R;
	float *x, *xa, *dx, *scratch;
} bench_args;

static void run_fwd(void *v)
{
	bench_args *a = v;
	a->fwd(a->p, a->n, a->x, a->xa, a->T, a->in, a->R, 2.0f, 0.0f, a->scratch);
}

static void run_bwd(void *v)
{
	bench_args *a = v;
	a->bwd(a->dx, a->p, a->n, a->x, a->xa, a->T, a->in, a->R, 2.0f, 0.0f, a->scratch);
}

enum { NPATH = 3 }; /* v1, v2, v3 */

/* ms[dir][path] of one group, LoRA on every member, dropout 0 */
static void bench_group(const char *name, int T, int in, int n, const int *outs, int R,
			double ms[2][NPATH])
{
	enum { REP = 10 };
	bench_args a = { .n = n, .T = T, .in = in, .R = R };
	float *hw = NULL;
	size_t hwn = 0;
	bk_weight *w[BK_PROJ_MAX];
	float *bufs[6 * BK_PROJ_MAX]; /* y, dy, A, B, dA, dB of each member */
	int nb = 0;
	double flops = 0;
	for (int j = 0; j < n; j++) {
		size_t m = (size_t)outs[j] * in;
		if (m > hwn) {
			free(hw);
			hw = gc_rand(&rng, m, 1.0f / sqrtf((float)in));
			hwn = m;
		}
		w[j] = G->weight_upload(hw, outs[j], in);
		float *y = G->alloc((size_t)T * outs[j] * 4), *dy = G->alloc((size_t)T * outs[j] * 4);
		float *A = G->alloc((size_t)R * in * 4), *B = G->alloc((size_t)outs[j] * R * 4);
		float *dA = G->alloc((size_t)R * in * 4), *dB = G->alloc((size_t)outs[j] * R * 4);
		G->upload(A, hw, (size_t)R * in * 4);
		G->upload(B, hw, (size_t)outs[j] * R * 4); /* B != 0: the LoRA GEMMs do real work */
		G->zero(dy, (size_t)T * outs[j] * 4);
		G->upload(dy, hw, (size_t)(T * (size_t)outs[j] < hwn ? T * (size_t)outs[j] : hwn) * 4);
		G->zero(dA, (size_t)R * in * 4), G->zero(dB, (size_t)outs[j] * R * 4);
		a.p[j] = (bk_proj){ .W = w[j], .A = A, .B = B, .key = 1, .y = y, .dy = dy, .dA = dA,
				    .dB = dB };
		bufs[nb++] = y, bufs[nb++] = dy, bufs[nb++] = A, bufs[nb++] = B;
		bufs[nb++] = dA, bufs[nb++] = dB;
		flops += 2.0 * T * in * outs[j];
	}
	a.x = G->alloc((size_t)T * in * 4), a.dx = G->alloc((size_t)T * in * 4);
	a.xa = G->alloc((size_t)n * T * R * 4), a.scratch = G->alloc((size_t)T * (in + R) * 4);
	G->zero(a.x, (size_t)T * in * 4), G->zero(a.dx, (size_t)T * in * 4);
	G->upload(a.x, hw, ((size_t)T * in < hwn ? (size_t)T * in : hwn) * 4);
	proj_fwd_fn F[NPATH] = { bk_cuda_proj_forward_v1, bk_cuda_proj_forward_v2,
				 bk_cuda_proj_forward_v3 };
	proj_bwd_fn B[NPATH] = { bk_cuda_proj_backward_v1, bk_cuda_proj_backward_v2,
				 bk_cuda_proj_backward_v3 };
	for (int k = 0; k < NPATH; k++) {
		a.fwd = F[k], a.bwd = B[k];
		ms[0][k] = bk_cuda_time_ms(run_fwd, &a, REP);
		run_fwd(&a); /* the backward reads this path's xa */
		ms[1][k] = bk_cuda_time_ms(run_bwd, &a, REP);
	}
	for (int dir = 0; dir < 2; dir++) {
		double fl = dir ? 2 * flops : flops; /* base GEMMs only (LoRA adds ~1-3%) */
		printf("linear %s %s T=%d in=%d r=%d: v1 %.3f ms, v2 %.3f ms, v3 %.3f ms, ratio "
		       "v1/v2 %.2f v1/v3 %.2f v2/v3 %.2f  (base-GEMM TFLOP/s: v1 %.0f, v2 %.0f, v3 "
		       "%.0f)\n",
		       dir ? "bwd" : "fwd", name, T, in, R, ms[dir][0], ms[dir][1], ms[dir][2],
		       ms[dir][0] / ms[dir][1], ms[dir][0] / ms[dir][2], ms[dir][1] / ms[dir][2],
		       fl / ms[dir][0] * 1e-9, fl / ms[dir][1] * 1e-9, fl / ms[dir][2] * 1e-9);
	}
	for (int j = 0; j < n; j++)
		G->weight_free(w[j]);
	for (int i = 0; i < nb; i++)
		G->free(bufs[i]);
	G->free(a.x), G->free(a.dx), G->free(a.xa), G->free(a.scratch);
	free(hw);
}

/* a layer (the TinyLlama-1.1B one at 16 x 256 tokens, r = 16 on all seven projections,
 * 22 layers; --tiny a small one) */
static void bench(const char *shape, int T, int Hd, int Im, int QD, int KVD, int R, int L)
{
	const int qkv[3] = { QD, KVD, KVD }, o[1] = { Hd }, gu[2] = { Im, Im }, dn[1] = { Hd };
	double ms[4][2][NPATH], tot[2][NPATH] = { { 0 } }, step[NPATH];
	bench_group("q/k/v", T, Hd, 3, qkv, R, ms[0]);
	bench_group("o", T, QD, 1, o, R, ms[1]);
	bench_group("gate/up", T, Hd, 2, gu, R, ms[2]);
	bench_group("down", T, Im, 1, dn, R, ms[3]);
	for (int g = 0; g < 4; g++)
		for (int d = 0; d < 2; d++)
			for (int k = 0; k < NPATH; k++)
				tot[d][k] += ms[g][d][k];
	for (int k = 0; k < NPATH; k++)
		step[k] = L * (tot[0][k] + tot[1][k]);
	printf("linear layer total (7 projections, %s, r %d): fwd v1 %.3f ms, v2 %.3f ms, v3 "
	       "%.3f ms; bwd v1 %.3f ms, v2 %.3f ms, v3 %.3f ms; x %d layers fwd+bwd: v1 %.1f ms, "
	       "v2 %.1f ms, v3 %.1f ms per step\n",
	       shape, R, tot[0][0], tot[0][1], tot[0][2], tot[1][0], tot[1][1], tot[1][2], L,
	       step[0], step[1], step[2]);
	/* the ranking, fastest first, by the whole layer (fwd + bwd) */
	int rk[NPATH] = { 0, 1, 2 };
	for (int i = 0; i < NPATH; i++)
		for (int j = i + 1; j < NPATH; j++)
			if (step[rk[j]] < step[rk[i]]) {
				int t = rk[i];
				rk[i] = rk[j], rk[j] = t;
			}
	printf("linear ranking (%s layer fwd+bwd, r %d): v%d %.1f ms < v%d %.1f ms < v%d %.1f ms "
	       "per step (v%d is %.2fx v1)\n",
	       shape, R, rk[0] + 1, step[rk[0]], rk[1] + 1, step[rk[1]], rk[2] + 1, step[rk[2]],
	       rk[0] + 1, step[0] / step[rk[0]]);
}
#endif

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	int do_bench = 1, tiny = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--host"))
			host_mode = 1;
		else if (!strcmp(argv[i], "--no-bench"))
			do_bench = 0;
		else if (!strcmp(argv[i], "--tiny"))
			tiny = 1;
		else
			die("usage: check_linear [--host | --no-bench | --tiny]");
	}
#ifdef BK_HAVE_CUDA
	G = &bk_ops_cuda;
	if (!host_mode)
		printf("check_linear: BK_LINEAR=%s (the op table's path; all three are checked "
		       "here)\n",
		       getenv("BK_LINEAR") && *getenv("BK_LINEAR") ? getenv("BK_LINEAR")
								  : "v1 (unset)");
#else
	if (!host_mode)
		die("check_linear: built without CUDA; only --host is available");
#endif
	bk_rng_seed(&rng, 20261201);
	static const gcase cases[] = {
		/* T, in, n, outs, lora, R, scale, drop */
		{ 1, 64, 3, { 64, 16, 16 }, { 1, 1, 1 }, 8, 2.0f, 0.0f },
		{ 7, 64, 3, { 64, 16, 16 }, { 1, 0, 1 }, 8, 2.0f, 0.0f }, /* k untargeted */
		{ 257, 96, 3, { 96, 32, 32 }, { 1, 1, 1 }, 8, 2.0f, 0.0f },
		{ 257, 97, 3, { 96, 33, 33 }, { 1, 1, 1 }, 5, 1.5f, 0.1f }, /* odd, dropout */
		{ 64, 96, 2, { 257, 257 }, { 1, 1, 0 }, 8, 2.0f, 0.0f },    /* gate/up */
		{ 64, 96, 2, { 257, 257 }, { 1, 1, 0 }, 8, 2.0f, 0.1f },
		{ 64, 257, 1, { 96, 0, 0 }, { 1, 0, 0 }, 8, 2.0f, 0.0f },   /* down */
		{ 7, 96, 1, { 96, 0, 0 }, { 0, 0, 0 }, 0, 0.0f, 0.0f },     /* no LoRA at all */
		{ 7, 96, 2, { 96, 96, 0 }, { 0, 1, 0 }, 4, 2.0f, 0.0f },
	};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
		run_case(&cases[c]);
	if (!host_mode && !tiny) { /* realistic: the TinyLlama q/k/v group at 512 tokens */
		static const gcase big = { 512, 2048, 3, { 2048, 256, 256 }, { 1, 1, 1 }, 16, 2.0f,
					   0.0f };
		run_case(&big);
	}
#ifdef BK_HAVE_CUDA
	if (!host_mode && do_bench && tiny)
		bench("small 64 tokens", 64, 128, 352, 4 * 32, 32, 8, 2);
	else if (!host_mode && do_bench)
		bench("TinyLlama 16x256", 16 * 256, 2048, 5632, 32 * 64, 4 * 64, 16, 22);
#else
	(void)do_bench, (void)tiny;
#endif
	printf("check_linear: %d lines, %d failed\n", n_lines, n_fail);
	return n_fail ? 1 : 0;
}
