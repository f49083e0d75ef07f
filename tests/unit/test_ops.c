/* test_ops.c - every op of an ops table (gpu/ops.h) against a naive double-precision
 * reference written here, over aligned and odd shapes, with sentinels around outputs,
 * and every backward against central finite differences.  Runs on bk_ops_host; any
 * other table can be added to the list in main.
 *
 * Tolerances: forward max |a-b| / max(max|b|, 1e-3) < 2e-5 (fp32 vs double).
 * Finite differences: J(x) = sum(c .* y(x)) accumulated in double, step 1e-2 (2e-3 for
 * attention), max |analytic - fd| / max(max|fd|, 1e-2) < 5e-3.  Backwards are called
 * on gradients pre-filled with random values to check that they add (+=). */
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/ops.h"
#include "tests/harness.h"

#define PAD 16
#define SENTINEL 12345.625f
#define FWD_TOL 2e-5
#define FD_TOL 5e-3

static const bk_ops *ops;
static bk_rng rng;

static float urand(void) { return (float)(2 * bk_rng_uniform(&rng) - 1); }
static float *hrand(size_t n)
{
	float *x = xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = urand();
	return x;
}
static float *hzero(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }

/* ---- device buffers with sentinels ---- */

static float *dput(const float *h, size_t n) /* upload n floats between sentinel pads */
{
	float *tmp = xmalloc((n + 2 * PAD) * sizeof(float));
	for (size_t i = 0; i < PAD; i++)
		tmp[i] = tmp[n + PAD + i] = SENTINEL;
	if (h)
		memcpy(tmp + PAD, h, n * sizeof(float));
	else
		for (size_t i = 0; i < n; i++)
			tmp[PAD + i] = SENTINEL; /* an output the op must overwrite */
	float *d = ops->alloc((n + 2 * PAD) * sizeof(float));
	ops->upload(d, tmp, (n + 2 * PAD) * sizeof(float));
	free(tmp);
	return d + PAD;
}

static void dget(float *h, const float *d, size_t n, const char *what)
{
	float *tmp = xmalloc((n + 2 * PAD) * sizeof(float));
	ops->download(tmp, d - PAD, (n + 2 * PAD) * sizeof(float));
	int bad = 0;
	for (size_t i = 0; i < PAD; i++)
		bad += tmp[i] != SENTINEL || tmp[n + PAD + i] != SENTINEL;
	CHECK(!bad, "%s: %d sentinel values around the output were overwritten", what, bad);
	memcpy(h, tmp + PAD, n * sizeof(float));
	free(tmp);
}

static void dfree(float *d) { ops->free(d - PAD); }

static int32_t *iput(const int32_t *h, size_t n)
{
	int32_t *d = ops->alloc((n ? n : 1) * sizeof(int32_t));
	ops->upload(d, h, n * sizeof(int32_t));
	return d;
}

static void check_close(const char *what, const float *got, const double *want, size_t n,
			double tol)
{
	double num = 0, den = 1e-3;
	int nan = 0;
	for (size_t i = 0; i < n; i++) {
		if (!isfinite(got[i]) || !isfinite(want[i]))
			nan++;
		double d = fabs(got[i] - want[i]);
		num = d > num ? d : num;
		den = fabs(want[i]) > den ? fabs(want[i]) : den;
	}
	double err = nan ? INFINITY : num / den;
	if (getenv("BK_TEST_VERBOSE"))
		fprintf(stderr, "%-44s error %.3g\n", what, err);
	CHECK(err < tol, "%s: error %.3g (tolerance %.3g, %d non-finite)", what, err, tol, nan);
}

/* Finite differences.  fd_J evaluates J = sum(c .* y) for the current host inputs. */
typedef double (*fd_fn)(void *ctx);

static void fd_check(const char *what, float *x, size_t n, const float *grad /* [n] */,
		     fd_fn J, void *ctx, float eps)
{
	double num = 0, den = 1e-2;
	int nan = 0;
	for (size_t i = 0; i < n; i++) {
		float x0 = x[i], xp = x0 + eps, xm = x0 - eps;
		x[i] = xp;
		double jp = J(ctx);
		x[i] = xm;
		double jm = J(ctx);
		x[i] = x0;
		double fd = (jp - jm) / ((double)xp - xm);
		if (!isfinite(grad[i]) || !isfinite(fd))
			nan++;
		double d = fabs(grad[i] - fd);
		num = d > num ? d : num;
		den = fabs(fd) > den ? fabs(fd) : den;
	}
	double err = nan ? INFINITY : num / den;
	if (getenv("BK_TEST_VERBOSE"))
		fprintf(stderr, "%-44s fd error %.3g\n", what, err);
	CHECK(err < FD_TOL, "%s: gradient vs finite differences: error %.3g (%d non-finite)", what,
	      err, nan);
}

static double project(const float *y, const float *c, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)c[i] * y[i];
	return s;
}

/* gradient added by a backward: after - before */
static void added(float *g, const float *before, size_t n)
{
	for (size_t i = 0; i < n; i++)
		g[i] -= before[i];
}

/* ---- embedding ---- */

static void test_embedding(int T, int V, int H)
{
	float *E = hrand((size_t)V * H), *x = hzero((size_t)T * H);
	int32_t *ids = xmalloc(T * sizeof(int32_t));
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)bk_rng_below(&rng, V);
	double *want = xmalloc((size_t)T * H * sizeof(double));
	for (int t = 0; t < T; t++)
		for (int i = 0; i < H; i++)
			want[(size_t)t * H + i] = E[(size_t)ids[t] * H + i];
	bk_weight *w = ops->weight_upload(E, V, H);
	int32_t *dids = iput(ids, T);
	float *dx = dput(NULL, (size_t)T * H);
	ops->embedding_forward(dx, dids, w, T);
	dget(x, dx, (size_t)T * H, "embedding");
	char what[64];
	snprintf(what, sizeof(what), "embedding T=%d V=%d H=%d", T, V, H);
	check_close(what, x, want, (size_t)T * H, 1e-7);
	dfree(dx);
	ops->free(dids);
	ops->weight_free(w);
	free(E), free(x), free(ids), free(want);
}

/* ---- RMSNorm ---- */

typedef struct {
	int T, H;
	float eps;
	float *x, *w, *c;
} rms_ctx;

static double rms_J(void *p)
{
	rms_ctx *k = p;
	size_t n = (size_t)k->T * k->H;
	bk_weight *w = ops->weight_upload(k->w, 1, k->H);
	float *dx = dput(k->x, n), *dy = dput(NULL, n), *dr = dput(NULL, k->T);
	float *y = xmalloc(n * sizeof(float));
	ops->rmsnorm_forward(dy, dr, dx, w, k->T, k->H, k->eps);
	dget(y, dy, n, "rmsnorm fd");
	double J = project(y, k->c, n);
	dfree(dx), dfree(dy), dfree(dr), free(y);
	ops->weight_free(w);
	return J;
}

static void test_rmsnorm(int T, int H, int fd)
{
	size_t n = (size_t)T * H;
	rms_ctx k = { T, H, 1e-5f, hrand(n), hrand(H), hrand(n) };
	double *want = xmalloc(n * sizeof(double)), *wr = xmalloc(T * sizeof(double));
	for (int t = 0; t < T; t++) {
		double ss = 0;
		for (int i = 0; i < H; i++)
			ss += (double)k.x[t * H + i] * k.x[t * H + i];
		wr[t] = 1 / sqrt(ss / H + k.eps);
		for (int i = 0; i < H; i++)
			want[t * H + i] = k.w[i] * (k.x[t * H + i] * wr[t]);
	}
	bk_weight *w = ops->weight_upload(k.w, 1, H);
	float *dx = dput(k.x, n), *dy = dput(NULL, n), *dr = dput(NULL, T);
	float *y = xmalloc(n * sizeof(float)), *r = xmalloc(T * sizeof(float));
	ops->rmsnorm_forward(dy, dr, dx, w, T, H, k.eps);
	dget(y, dy, n, "rmsnorm out");
	dget(r, dr, T, "rmsnorm rstd");
	char what[64];
	snprintf(what, sizeof(what), "rmsnorm T=%d H=%d", T, H);
	check_close(what, y, want, n, FWD_TOL);
	check_close("rmsnorm rstd", r, wr, T, FWD_TOL);
	if (fd) {
		float *g0 = hrand(n), *g = xmalloc(n * sizeof(float));
		float *dg = dput(g0, n), *dc = dput(k.c, n);
		ops->rmsnorm_backward(dg, dc, dx, w, dr, T, H);
		dget(g, dg, n, "rmsnorm dx");
		added(g, g0, n);
		snprintf(what, sizeof(what), "rmsnorm backward T=%d H=%d", T, H);
		fd_check(what, k.x, n, g, rms_J, &k, 1e-2f);
		dfree(dg), dfree(dc), free(g0), free(g);
	}
	dfree(dx), dfree(dy), dfree(dr);
	ops->weight_free(w);
	free(k.x), free(k.w), free(k.c), free(want), free(wr), free(y), free(r);
}

/* ---- frozen linear ---- */

typedef struct {
	int T, in, out;
	float *x, *W, *c;
} lin_ctx;

static double lin_J(void *p)
{
	lin_ctx *k = p;
	bk_weight *w = ops->weight_upload(k->W, k->out, k->in);
	float *dx = dput(k->x, (size_t)k->T * k->in), *dy = dput(NULL, (size_t)k->T * k->out);
	float *y = xmalloc((size_t)k->T * k->out * sizeof(float));
	ops->linear_forward(dy, dx, w, k->T);
	dget(y, dy, (size_t)k->T * k->out, "linear fd");
	double J = project(y, k->c, (size_t)k->T * k->out);
	dfree(dx), dfree(dy), free(y);
	ops->weight_free(w);
	return J;
}

static void test_linear(int T, int in, int out, int fd)
{
	size_t nx = (size_t)T * in, ny = (size_t)T * out;
	lin_ctx k = { T, in, out, hrand(nx), hrand((size_t)out * in), hrand(ny) };
	double *want = xcalloc(ny, sizeof(double)), *wdx = xcalloc(nx, sizeof(double));
	for (int t = 0; t < T; t++)
		for (int o = 0; o < out; o++)
			for (int i = 0; i < in; i++) {
				want[(size_t)t * out + o] += (double)k.x[(size_t)t * in + i] * k.W[(size_t)o * in + i];
				wdx[(size_t)t * in + i] += (double)k.c[(size_t)t * out + o] * k.W[(size_t)o * in + i];
			}
	bk_weight *w = ops->weight_upload(k.W, out, in);
	float *dx = dput(k.x, nx), *dy = dput(NULL, ny), *y = xmalloc(ny * sizeof(float));
	ops->linear_forward(dy, dx, w, T);
	dget(y, dy, ny, "linear y");
	char what[80];
	snprintf(what, sizeof(what), "linear T=%d in=%d out=%d", T, in, out);
	check_close(what, y, want, ny, FWD_TOL);

	float *g0 = hrand(nx), *g = xmalloc(nx * sizeof(float));
	float *dg = dput(g0, nx), *dc = dput(k.c, ny);
	ops->linear_backward(dg, dc, w, T);
	dget(g, dg, nx, "linear dx");
	added(g, g0, nx);
	snprintf(what, sizeof(what), "linear backward T=%d in=%d out=%d", T, in, out);
	check_close(what, g, wdx, nx, 1e-4); /* g - g0 loses a few bits */
	if (fd)
		fd_check(what, k.x, nx, g, lin_J, &k, 1e-2f);
	dfree(dx), dfree(dy), dfree(dg), dfree(dc);
	ops->weight_free(w);
	free(k.x), free(k.W), free(k.c), free(want), free(wdx), free(y), free(g0), free(g);
}

/* ---- LoRA ---- */

typedef struct {
	int T, in, out, R;
	float scale, p;
	uint64_t key;
	float *x, *A, *B, *c, *y0;
} lora_ctx;

/* y = y0 + lora(x) on the device; returns y (host, caller frees) and xa */
static float *lora_run(lora_ctx *k, float **xa_out)
{
	size_t nx = (size_t)k->T * k->in, ny = (size_t)k->T * k->out, na = (size_t)k->T * k->R;
	float *dx = dput(k->x, nx), *dA = dput(k->A, (size_t)k->R * k->in);
	float *dB = dput(k->B, (size_t)k->out * k->R), *dy = dput(k->y0, ny);
	float *dxa = dput(NULL, na), *dsc = dput(NULL, (size_t)k->T * (k->in + k->R));
	ops->lora_forward(dy, dxa, dx, dA, dB, k->T, k->in, k->out, k->R, k->scale, k->p, k->key,
			  dsc);
	float *y = xmalloc(ny * sizeof(float));
	dget(y, dy, ny, "lora y");
	if (xa_out) {
		*xa_out = xmalloc(na * sizeof(float));
		dget(*xa_out, dxa, na, "lora xa");
	}
	dfree(dx), dfree(dA), dfree(dB), dfree(dy), dfree(dxa), dfree(dsc);
	return y;
}

static double lora_J(void *p)
{
	lora_ctx *k = p;
	float *y = lora_run(k, NULL);
	double J = project(y, k->c, (size_t)k->T * k->out);
	free(y);
	return J;
}

static void test_lora(int T, int in, int out, int R, float p, int fd)
{
	size_t nx = (size_t)T * in, ny = (size_t)T * out, na = (size_t)T * R;
	size_t nA = (size_t)R * in, nB = (size_t)out * R;
	lora_ctx k = { T, in, out, R, 2.0f, p, bk_crng_key(7, (uint64_t)T, (uint64_t)in, 3),
		       hrand(nx), hrand(nA), hrand(nB), hrand(ny), hrand(ny) };
	/* naive: xd = x * keep / (1-p), xa = xd A^T, y = y0 + scale xa B^T */
	double *xd = xmalloc(nx * sizeof(double)), *wxa = xcalloc(na, sizeof(double));
	double *want = xmalloc(ny * sizeof(double));
	for (size_t i = 0; i < nx; i++)
		xd[i] = p > 0 ? (bk_crng_uniform(k.key, i) >= p ? k.x[i] / (1.0 - p) : 0) : k.x[i];
	for (int t = 0; t < T; t++)
		for (int r = 0; r < R; r++)
			for (int i = 0; i < in; i++)
				wxa[(size_t)t * R + r] += xd[(size_t)t * in + i] * k.A[(size_t)r * in + i];
	for (int t = 0; t < T; t++)
		for (int o = 0; o < out; o++) {
			double s = 0;
			for (int r = 0; r < R; r++)
				s += wxa[(size_t)t * R + r] * k.B[(size_t)o * R + r];
			want[(size_t)t * out + o] = k.y0[(size_t)t * out + o] + k.scale * s;
		}
	float *xa, *y = lora_run(&k, &xa);
	char what[96];
	snprintf(what, sizeof(what), "lora T=%d in=%d out=%d R=%d p=%g", T, in, out, R, p);
	check_close(what, y, want, ny, FWD_TOL);
	check_close("lora xa", xa, wxa, na, FWD_TOL);
	if (p > 0 && nx >= 50) {
		size_t zeros = 0;
		for (size_t i = 0; i < nx; i++)
			zeros += xd[i] == 0;
		CHECK(zeros > 0 && zeros < nx, "lora dropout p=%g masked %zu of %zu", p, zeros, nx);
	}
	if (fd) {
		float *gx0 = hrand(nx), *gA0 = hrand(nA), *gB0 = hrand(nB);
		float *dgx = dput(gx0, nx), *dgA = dput(gA0, nA), *dgB = dput(gB0, nB);
		float *dc = dput(k.c, ny), *dx = dput(k.x, nx), *dxa = dput(xa, na);
		float *dA = dput(k.A, nA), *dB = dput(k.B, nB);
		float *dsc = dput(NULL, (size_t)T * (in + R));
		ops->lora_backward(dgx, dgA, dgB, dc, dx, dxa, dA, dB, T, in, out, R, k.scale, p,
				   k.key, dsc);
		float *gx = xmalloc(nx * sizeof(float)), *gA = xmalloc(nA * sizeof(float));
		float *gB = xmalloc(nB * sizeof(float));
		dget(gx, dgx, nx, "lora dx");
		dget(gA, dgA, nA, "lora dA");
		dget(gB, dgB, nB, "lora dB");
		added(gx, gx0, nx), added(gA, gA0, nA), added(gB, gB0, nB);
		snprintf(what, sizeof(what), "lora backward dx p=%g", p);
		fd_check(what, k.x, nx, gx, lora_J, &k, 1e-2f);
		snprintf(what, sizeof(what), "lora backward dA p=%g", p);
		fd_check(what, k.A, nA, gA, lora_J, &k, 1e-2f);
		snprintf(what, sizeof(what), "lora backward dB p=%g", p);
		fd_check(what, k.B, nB, gB, lora_J, &k, 1e-2f);
		dfree(dgx), dfree(dgA), dfree(dgB), dfree(dc), dfree(dx), dfree(dxa);
		dfree(dA), dfree(dB), dfree(dsc);
		free(gx0), free(gA0), free(gB0), free(gx), free(gA), free(gB);
	}
	free(k.x), free(k.A), free(k.B), free(k.c), free(k.y0), free(xd), free(wxa), free(want);
	free(y), free(xa);
}

/* ---- RoPE ---- */

static float *inv_freqs(int D)
{
	float *f = xmalloc(D / 2 * sizeof(float));
	for (int i = 0; i < D / 2; i++)
		f[i] = (float)pow(10000.0, -2.0 * i / D);
	return f;
}

typedef struct {
	int T, n, D;
	int32_t *pos;
	float *invf, *x, *c;
} rope_ctx;

static double rope_J(void *p)
{
	rope_ctx *k = p;
	size_t n = (size_t)k->T * k->n * k->D;
	float *dx = dput(k->x, n), *df = dput(k->invf, k->D / 2), *y = xmalloc(n * sizeof(float));
	int32_t *dp = iput(k->pos, k->T);
	ops->rope_forward(dx, dp, df, k->T, k->n, k->D);
	dget(y, dx, n, "rope fd");
	double J = project(y, k->c, n);
	dfree(dx), dfree(df), ops->free(dp), free(y);
	return J;
}

static void test_rope(int T, int nh, int D, int fd)
{
	size_t n = (size_t)T * nh * D;
	rope_ctx k = { T, nh, D, xmalloc(T * sizeof(int32_t)), inv_freqs(D), hrand(n), hrand(n) };
	for (int t = 0; t < T; t++)
		k.pos[t] = (int32_t)bk_rng_below(&rng, 64);
	double *want = xmalloc(n * sizeof(double));
	int half = D / 2;
	for (int t = 0; t < T; t++)
		for (int h = 0; h < nh; h++)
			for (int i = 0; i < D; i++) {
				/* HF: x * cos + rotate_half(x) * sin, rotate_half = cat(-x2, x1) */
				double ang = (double)k.pos[t] * k.invf[i % half];
				const float *xh = k.x + ((size_t)t * nh + h) * D;
				double rot = i < half ? -xh[i + half] : xh[i - half];
				want[((size_t)t * nh + h) * D + i] = xh[i] * cos(ang) + rot * sin(ang);
			}
	float *dx = dput(k.x, n), *df = dput(k.invf, half), *y = xmalloc(n * sizeof(float));
	int32_t *dp = iput(k.pos, T);
	ops->rope_forward(dx, dp, df, T, nh, D);
	dget(y, dx, n, "rope");
	char what[64];
	snprintf(what, sizeof(what), "rope T=%d n=%d D=%d", T, nh, D);
	check_close(what, y, want, n, 1e-4); /* fp32 angle: pos*inv_freq rounds */
	if (fd) {
		float *g = xmalloc(n * sizeof(float)), *dg = dput(k.c, n);
		ops->rope_backward(dg, dp, df, T, nh, D);
		dget(g, dg, n, "rope dx");
		snprintf(what, sizeof(what), "rope backward T=%d n=%d D=%d", T, nh, D);
		fd_check(what, k.x, n, g, rope_J, &k, 1e-2f);
		dfree(dg), free(g);
	}
	dfree(dx), dfree(df), ops->free(dp);
	free(k.pos), free(k.invf), free(k.x), free(k.c), free(want), free(y);
}

/* ---- attention ---- */

typedef struct {
	int S, T, NH, NKV, D, P;
	int32_t *cu;
	float *q, *k, *v, *pk, *pv, *c;
	bk_attn ap; /* scale, softcap, window */
} att_ctx;

/* runs the op; returns out [T,NH,D] and lse [NH,T] (host, caller frees) */
static float *att_run(att_ctx *a, float **lse_out)
{
	size_t nq = (size_t)a->T * a->NH * a->D, nk = (size_t)a->T * a->NKV * a->D;
	size_t np = (size_t)a->P * a->NKV * a->D, nl = (size_t)a->NH * a->T;
	float *dq = dput(a->q, nq), *dk = dput(a->k, nk), *dv = dput(a->v, nk);
	float *dpk = a->P ? dput(a->pk, np) : NULL, *dpv = a->P ? dput(a->pv, np) : NULL;
	float *dout = dput(NULL, nq), *dl = dput(NULL, nl);
	int32_t *dcu = iput(a->cu, a->S + 1);
	ops->attention_forward(dout, dl, dq, dk, dv, dcu, a->S, a->T, a->NH, a->NKV, a->D, dpk,
			       dpv, a->P, &a->ap);
	float *out = xmalloc(nq * sizeof(float));
	dget(out, dout, nq, "attention out");
	if (lse_out) {
		*lse_out = xmalloc(nl * sizeof(float));
		dget(*lse_out, dl, nl, "attention lse");
	}
	dfree(dq), dfree(dk), dfree(dv), dfree(dout), dfree(dl), ops->free(dcu);
	if (a->P)
		dfree(dpk), dfree(dpv);
	return out;
}

static double att_J(void *p)
{
	att_ctx *a = p;
	float *out = att_run(a, NULL);
	double J = project(out, a->c, (size_t)a->T * a->NH * a->D);
	free(out);
	return J;
}

/* naive: for each sequence, the explicit key list prefix ++ own tokens <= t, keeping
 * those within the window (query at position P + t - cu[s], prefix key j at j, own key
 * j at P + j - cu[s]); score = cap(q.k * scale) */
static void att_naive(const att_ctx *a, double *out, double *lse)
{
	int g = a->NH / a->NKV, D = a->D;
	double *sc = xmalloc(((size_t)a->P + a->T) * sizeof(double));
	for (int s = 0; s < a->S; s++)
		for (int t = a->cu[s]; t < a->cu[s + 1]; t++)
			for (int h = 0; h < a->NH; h++) {
				int kh = h / g, nk = 0, W = a->ap.window;
				int qpos = a->P + t - a->cu[s];
				const float *qt = a->q + ((size_t)t * a->NH + h) * D;
				const float *keys[512], *vals[512];
				BUG_ON(a->P + a->T > 512);
				for (int j = 0; j < a->P; j++) {
					if (W > 0 && qpos - j >= W)
						continue;
					keys[nk] = a->pk + ((size_t)j * a->NKV + kh) * D;
					vals[nk++] = a->pv + ((size_t)j * a->NKV + kh) * D;
				}
				for (int j = a->cu[s]; j <= t; j++) {
					if (W > 0 && t - j >= W)
						continue;
					keys[nk] = a->k + ((size_t)j * a->NKV + kh) * D;
					vals[nk++] = a->v + ((size_t)j * a->NKV + kh) * D;
				}
				double mx = -INFINITY, sum = 0;
				for (int j = 0; j < nk; j++) {
					double d = 0;
					for (int i = 0; i < D; i++)
						d += (double)qt[i] * keys[j][i];
					sc[j] = d * a->ap.scale;
					if (a->ap.softcap > 0)
						sc[j] = tanh(sc[j] / a->ap.softcap) * a->ap.softcap;
					mx = sc[j] > mx ? sc[j] : mx;
				}
				for (int j = 0; j < nk; j++)
					sum += exp(sc[j] - mx);
				lse[(size_t)h * a->T + t] = mx + log(sum);
				for (int i = 0; i < D; i++) {
					double o = 0;
					for (int j = 0; j < nk; j++)
						o += exp(sc[j] - mx) / sum * vals[j][i];
					out[((size_t)t * a->NH + h) * D + i] = o;
				}
			}
	free(sc);
}

/* scale 0: D^-0.5 */
static void test_attention_p(int S, const int *lens, int NH, int NKV, int D, int P, int fd,
			     float scale, float softcap, int window)
{
	att_ctx a = { .S = S, .NH = NH, .NKV = NKV, .D = D, .P = P };
	a.ap = bk_attn_default(D);
	if (scale > 0)
		a.ap.scale = scale;
	a.ap.softcap = softcap;
	a.ap.window = window;
	a.cu = xmalloc((S + 1) * sizeof(int32_t));
	a.cu[0] = 0;
	for (int s = 0; s < S; s++)
		a.cu[s + 1] = a.cu[s] + lens[s];
	a.T = a.cu[S];
	size_t nq = (size_t)a.T * NH * D, nk = (size_t)a.T * NKV * D, np = (size_t)P * NKV * D;
	a.q = hrand(nq), a.k = hrand(nk), a.v = hrand(nk), a.pk = hrand(np), a.pv = hrand(np);
	a.c = hrand(nq);
	for (size_t i = 0; i < nq; i++) /* larger scores: sharper softmax */
		a.q[i] *= 2;
	double *want = xmalloc(nq * sizeof(double)), *wl = xmalloc((size_t)NH * a.T * sizeof(double));
	att_naive(&a, want, wl);
	float *lse, *out = att_run(&a, &lse);
	char what[96];
	int n = snprintf(what, sizeof(what), "attention NH=%d NKV=%d D=%d P=%d cap %g W %d lens",
			 NH, NKV, D, P, softcap, window);
	for (int s = 0; s < S && n < 80; s++)
		n += snprintf(what + n, sizeof(what) - n, " %d", lens[s]);
	check_close(what, out, want, nq, FWD_TOL);
	check_close("attention lse", lse, wl, (size_t)NH * a.T, FWD_TOL);
	if (fd) {
		BUG_ON(P);
		float *gq0 = hrand(nq), *gk0 = hrand(nk), *gv0 = hrand(nk);
		float *dgq = dput(gq0, nq), *dgk = dput(gk0, nk), *dgv = dput(gv0, nk);
		float *dc = dput(a.c, nq), *dq = dput(a.q, nq), *dk = dput(a.k, nk);
		float *dv = dput(a.v, nk), *dout = dput(out, nq), *dl = dput(lse, (size_t)NH * a.T);
		int32_t *dcu = iput(a.cu, S + 1);
		ops->attention_backward(dgq, dgk, dgv, dc, dq, dk, dv, dout, dl, dcu, S, a.T, NH, NKV,
					D, &a.ap);
		float *gq = xmalloc(nq * sizeof(float)), *gk = xmalloc(nk * sizeof(float));
		float *gv = xmalloc(nk * sizeof(float));
		dget(gq, dgq, nq, "attention dq");
		dget(gk, dgk, nk, "attention dk");
		dget(gv, dgv, nk, "attention dv");
		added(gq, gq0, nq), added(gk, gk0, nk), added(gv, gv0, nk);
		snprintf(what, sizeof(what), "attention backward dq NH=%d NKV=%d cap %g W %d", NH,
			 NKV, softcap, window);
		fd_check(what, a.q, nq, gq, att_J, &a, 2e-3f);
		snprintf(what, sizeof(what), "attention backward dk NH=%d NKV=%d cap %g W %d", NH,
			 NKV, softcap, window);
		fd_check(what, a.k, nk, gk, att_J, &a, 2e-3f);
		snprintf(what, sizeof(what), "attention backward dv NH=%d NKV=%d cap %g W %d", NH,
			 NKV, softcap, window);
		fd_check(what, a.v, nk, gv, att_J, &a, 2e-3f);
		dfree(dgq), dfree(dgk), dfree(dgv), dfree(dc), dfree(dq), dfree(dk), dfree(dv);
		dfree(dout), dfree(dl), ops->free(dcu);
		free(gq0), free(gk0), free(gv0), free(gq), free(gk), free(gv);
	}
	free(a.cu), free(a.q), free(a.k), free(a.v), free(a.pk), free(a.pv), free(a.c);
	free(want), free(wl), free(out), free(lse);
}

static void test_attention(int S, const int *lens, int NH, int NKV, int D, int P, int fd)
{
	test_attention_p(S, lens, NH, NKV, D, P, fd, 0, 0, 0);
}

/* ---- SwiGLU, GeGLU, bias, softcap and residual ---- */

typedef struct {
	size_t n;
	float *g, *u, *c;
	int gelu;
} glu_ctx;

static double glu_J(void *p)
{
	glu_ctx *k = p;
	float *dg = dput(k->g, k->n), *du = dput(k->u, k->n), *dh = dput(NULL, k->n);
	float *h = xmalloc(k->n * sizeof(float));
	if (k->gelu)
		ops->geglu_forward(dh, dg, du, k->n);
	else
		ops->swiglu_forward(dh, dg, du, k->n);
	dget(h, dh, k->n, "swiglu fd");
	double J = project(h, k->c, k->n);
	dfree(dg), dfree(du), dfree(dh), free(h);
	return J;
}

typedef void glu_bwd_fn(float *dgate, float *dup, const float *dh, const float *gate,
			const float *up, size_t n);

/* a GLU backward writes dgate and dup (the random values they held are gone: checked by
 * fd_check after) and may run in place, dgate over gate and dup over up, to the same
 * bits as into separate buffers (gg, gu) */
static void glu_in_place(const char *what, glu_bwd_fn *bwd, const glu_ctx *k, const float *dc,
			 const float *gg, const float *gu)
{
	size_t n = k->n;
	float *g = dput(k->g, n), *u = dput(k->u, n), *a = xmalloc(n * 4), *b = xmalloc(n * 4);
	bwd(g, u, dc, g, u, n);
	dget(a, g, n, what);
	dget(b, u, n, what);
	CHECK(!memcmp(a, gg, n * 4) && !memcmp(b, gu, n * 4),
	      "%s backward in place: not the bits of separate outputs", what);
	dfree(g), dfree(u), free(a), free(b);
}

static void test_swiglu(size_t n, int fd)
{
	glu_ctx k = { n, hrand(n), hrand(n), hrand(n), 0 };
	for (size_t i = 0; i < n; i++)
		k.g[i] *= 4;
	double *want = xmalloc(n * sizeof(double));
	for (size_t i = 0; i < n; i++)
		want[i] = k.g[i] / (1 + exp(-(double)k.g[i])) * k.u[i];
	float *dg = dput(k.g, n), *du = dput(k.u, n), *dh = dput(NULL, n);
	float *h = xmalloc(n * sizeof(float));
	ops->swiglu_forward(dh, dg, du, n);
	dget(h, dh, n, "swiglu");
	char what[64];
	snprintf(what, sizeof(what), "swiglu n=%zu", n);
	check_close(what, h, want, n, FWD_TOL);
	if (fd) {
		float *gg0 = hrand(n), *gu0 = hrand(n), *dgg = dput(gg0, n), *dgu = dput(gu0, n);
		float *dc = dput(k.c, n), *gg = xmalloc(n * sizeof(float)), *gu = xmalloc(n * sizeof(float));
		ops->swiglu_backward(dgg, dgu, dc, dg, du, n);
		dget(gg, dgg, n, "swiglu dgate");
		dget(gu, dgu, n, "swiglu dup");
		glu_in_place("swiglu", ops->swiglu_backward, &k, dc, gg, gu);
		fd_check("swiglu backward dgate", k.g, n, gg, glu_J, &k, 1e-2f);
		fd_check("swiglu backward dup", k.u, n, gu, glu_J, &k, 1e-2f);
		dfree(dgg), dfree(dgu), dfree(dc), free(gg0), free(gu0), free(gg), free(gu);
	}
	dfree(dg), dfree(du), dfree(dh);
	free(k.g), free(k.u), free(k.c), free(want), free(h);
}

/* gelu_pytorch_tanh(g) * up against double; backward against finite differences */
static void test_geglu(size_t n, int fd)
{
	glu_ctx k = { n, hrand(n), hrand(n), hrand(n), 1 };
	for (size_t i = 0; i < n; i++)
		k.g[i] *= 4;
	double *want = xmalloc(n * sizeof(double));
	for (size_t i = 0; i < n; i++) {
		double g = k.g[i];
		want[i] = 0.5 * g * (1 + tanh(sqrt(2 / M_PI) * (g + 0.044715 * g * g * g))) * k.u[i];
	}
	float *dg = dput(k.g, n), *du = dput(k.u, n), *dh = dput(NULL, n);
	float *h = xmalloc(n * sizeof(float));
	ops->geglu_forward(dh, dg, du, n);
	dget(h, dh, n, "geglu");
	char what[64];
	snprintf(what, sizeof(what), "geglu n=%zu", n);
	check_close(what, h, want, n, FWD_TOL);
	if (fd) {
		float *gg0 = hrand(n), *gu0 = hrand(n), *dgg = dput(gg0, n), *dgu = dput(gu0, n);
		float *dc = dput(k.c, n), *gg = xmalloc(n * sizeof(float)), *gu = xmalloc(n * sizeof(float));
		ops->geglu_backward(dgg, dgu, dc, dg, du, n);
		dget(gg, dgg, n, "geglu dgate");
		dget(gu, dgu, n, "geglu dup");
		glu_in_place("geglu", ops->geglu_backward, &k, dc, gg, gu);
		fd_check("geglu backward dgate", k.g, n, gg, glu_J, &k, 1e-2f);
		fd_check("geglu backward dup", k.u, n, gu, glu_J, &k, 1e-2f);
		dfree(dgg), dfree(dgu), dfree(dc), free(gg0), free(gu0), free(gg), free(gu);
	}
	dfree(dg), dfree(du), dfree(dh);
	free(k.g), free(k.u), free(k.c), free(want), free(h);
}

/* y [T,n] += b; the bias is a [1,n] weight */
static void test_bias(int T, int n)
{
	float *y0 = hrand((size_t)T * n), *b = hrand(n), *y = xmalloc((size_t)T * n * sizeof(float));
	double *want = xmalloc((size_t)T * n * sizeof(double));
	for (int t = 0; t < T; t++)
		for (int i = 0; i < n; i++)
			want[(size_t)t * n + i] = (double)y0[(size_t)t * n + i] + b[i];
	bk_weight *w = ops->weight_upload(b, 1, n);
	float *dy = dput(y0, (size_t)T * n);
	ops->bias_forward(dy, w, T);
	dget(y, dy, (size_t)T * n, "bias");
	char what[64];
	snprintf(what, sizeof(what), "bias T=%d n=%d", T, n);
	check_close(what, y, want, (size_t)T * n, 1e-7);
	ops->weight_free(w);
	dfree(dy), free(y0), free(b), free(y), free(want);
}

/* x <- tanh(x / cap) * cap */
static void test_softcap(size_t n, float cap)
{
	float *x = hrand(n), *y = xmalloc(n * sizeof(float));
	double *want = xmalloc(n * sizeof(double));
	for (size_t i = 0; i < n; i++) {
		x[i] *= 3 * cap;
		want[i] = tanh((double)x[i] / cap) * cap;
	}
	float *dx = dput(x, n);
	ops->softcap_forward(dx, cap, n);
	dget(y, dx, n, "softcap");
	char what[64];
	snprintf(what, sizeof(what), "softcap n=%zu cap %g", n, cap);
	check_close(what, y, want, n, FWD_TOL);
	dfree(dx), free(x), free(y), free(want);
}

static void test_residual(size_t n)
{
	float *a = hrand(n), *b = hrand(n), *y = xmalloc(n * sizeof(float));
	double *want = xmalloc(n * sizeof(double));
	for (size_t i = 0; i < n; i++)
		want[i] = (double)a[i] + b[i];
	float *da = dput(a, n), *db = dput(b, n), *dy = dput(NULL, n);
	ops->residual_forward(dy, da, db, n);
	dget(y, dy, n, "residual");
	check_close("residual", y, want, n, 1e-7);
	ops->residual_forward(da, da, db, n); /* in place */
	dget(y, da, n, "residual in place");
	check_close("residual in place", y, want, n, 1e-7);
	dfree(da), dfree(db), dfree(dy);
	free(a), free(b), free(y), free(want);
}

static void run_all(const bk_ops *o)
{
	ops = o;
	bk_rng_seed(&rng, 42);
	fprintf(stderr, "ops: %s\n", o->name);
	static const int Ts[] = { 1, 5, 13 };
	for (int i = 0; i < 3; i++) {
		int T = Ts[i];
		test_embedding(T, 11, 7);
		test_embedding(T, 32, 64);
		test_rmsnorm(T, 7, 0);
		test_rmsnorm(T, 64, 0);
		test_linear(T, 5, 7, 0);
		test_linear(T, 16, 16, 0);
		test_linear(T, 17, 33, 0);
		test_lora(T, 5, 7, 2, 0, 0);
		test_lora(T, 16, 12, 4, 0.3f, 0);
		test_rope(T, 3, 8, 0);
		test_rope(T, 2, 16, 0);
		test_swiglu((size_t)T * 24, 0);
		test_geglu((size_t)T * 24, 0);
		test_bias(T, 24);
		test_softcap((size_t)T * 19, 30.0f);
		test_residual((size_t)T * 17);
	}
	test_linear(200, 300, 70, 0); /* big enough for threaded BLAS paths */
	test_lora(100, 700, 90, 8, 0.05f, 0); /* threaded dropout path */
	test_rmsnorm(40, 33, 0);
	test_rope(40, 4, 16, 0);
	test_swiglu(70000, 0);
	test_geglu(70000, 0);
	test_softcap(70000, 50.0f);
	test_residual(70000);

	/* attention: GQA ratios 1, 2, 4; D = 8, 16; one or several sequences of odd
	 * lengths (one empty); with and without a prefix */
	static const int l1[] = { 1 }, l5[] = { 5 }, l13[] = { 3, 1, 5, 4 }, l9[] = { 2, 0, 7 };
	static const int l40[] = { 17, 23 };
	static const int heads[][2] = { { 2, 2 }, { 4, 2 }, { 4, 1 } };
	for (int h = 0; h < 3; h++)
		for (int D = 8; D <= 16; D += 8)
			for (int P = 0; P <= 3; P += 3) {
				test_attention(1, l1, heads[h][0], heads[h][1], D, P, 0);
				test_attention(1, l5, heads[h][0], heads[h][1], D, P, 0);
				test_attention(4, l13, heads[h][0], heads[h][1], D, P, 0);
				test_attention(3, l9, heads[h][0], heads[h][1], D, P, 0);
			}
	test_attention(2, l40, 8, 2, 16, 5, 0);
	/* the attention parameters: scale, softcap, sliding window (shorter than the
	 * sequences, so keys drop out; with a prefix the window reaches into it) */
	for (int P = 0; P <= 3; P += 3) {
		test_attention_p(4, l13, 4, 2, 8, P, 0, 0.2f, 0, 0);
		test_attention_p(4, l13, 4, 2, 8, P, 0, 0, 0.7f, 0);
		test_attention_p(4, l13, 4, 2, 8, P, 0, 0, 0, 2);
		test_attention_p(3, l9, 4, 1, 16, P, 0, 0.3f, 1.5f, 3);
		test_attention_p(2, l40, 8, 2, 16, P, 0, 0, 0, 1);
		test_attention_p(2, l40, 8, 2, 16, P, 0, 0, 0, 6);
	}

	/* backward vs finite differences on tiny shapes */
	test_rmsnorm(3, 7, 1);
	test_linear(3, 5, 4, 1);
	test_lora(3, 5, 4, 2, 0, 1);
	test_lora(4, 6, 5, 3, 0.4f, 1);
	test_rope(3, 2, 8, 1);
	test_swiglu(21, 1);
	test_geglu(21, 1);
	static const int f7[] = { 3, 4 }, f6[] = { 1, 5 };
	test_attention(2, f7, 2, 2, 4, 0, 1);
	test_attention(2, f7, 4, 2, 4, 0, 1);
	test_attention(2, f6, 4, 1, 8, 0, 1);
	test_attention_p(2, f7, 4, 2, 4, 0, 1, 0.6f, 0.8f, 0); /* softcap near saturation */
	test_attention_p(2, f7, 4, 2, 4, 0, 1, 0, 0, 2);       /* window */
	test_attention_p(2, f6, 4, 1, 8, 0, 1, 0.4f, 1.2f, 3); /* all three */
}

int main(void)
{
	const bk_ops *tables[] = { &bk_ops_host };
	for (size_t i = 0; i < sizeof(tables) / sizeof(tables[0]); i++)
		run_all(tables[i]);
	return bk_test_done("test_ops");
}
