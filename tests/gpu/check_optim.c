/* check_optim.c - the optimizer ops of bk_ops_cuda (gpu/cuda/cuda_optim.cu) against the host
 * twin on the same random inputs, at sizes 1, 255, 256, 2049, 65536*3+17 and 2^22+3:
 * adamw_step (3 consecutive steps, weight decay on and off), adamw8_step (blocks 256
 * and 2048, 4 steps, per-block scales over several decades), grad_sumsq and scale.
 * Device buffers carry NaN sentinels after their end (an out-of-bounds write shows);
 * NaN in any result never passes.  Bounds:
 *   adamw_step, adamw8_step, scale       0: bit-equal (both sides do the same IEEE float
 *                                        operations without contraction, optim8.h)
 *   grad_sumsq                           relative 1e-12 (another fixed summation order),
 *                                        and two device runs bit-equal (deterministic)
 * Then times both optimizers on 50M parameters (TinyLlama r=64 LoRA size) and prints
 * GB/s.  One line per op and size ("ok" / "FAIL"); exit 1 on any failure.
 * --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU): sizes up to 65536*3+17
 * and the timing on 65536 parameters.
 * Usage: check_optim [--host] [--tiny]   (--host: the host twin against itself, a dry run of this
 * program without a GPU). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/cuda/cuda.h"
#include "gpu/ops.h"
#include "gpu/optim8.h"

#define PAD 64 /* sentinel bytes after every device buffer */

static const bk_ops *ref = &bk_ops_host, *dut;
static bk_rng rng;
static int n_fail;

static void line(const char *op, size_t n, const char *detail, int ok)
{
	printf("%-12s n=%-9zu %-44s %s\n", op, n, detail, ok ? "ok" : "FAIL");
	fflush(stdout);
	n_fail += !ok;
}

/* a device copy of host bytes, followed by PAD bytes of 0xff (NaN floats, code 255) */
static void *up(const void *h, size_t bytes)
{
	unsigned char *d = dut->alloc(bytes + PAD), pad[PAD];
	memset(pad, 0xff, PAD);
	dut->upload(d, h, bytes);
	dut->upload(d + bytes, pad, PAD);
	return d;
}

/* downloads bytes into h; returns 0 when the sentinel after them was overwritten */
static int down(void *h, const void *d, size_t bytes)
{
	unsigned char pad[PAD];
	dut->download(h, d, bytes);
	dut->download(pad, (const unsigned char *)d + bytes, PAD);
	for (int i = 0; i < PAD; i++)
		if (pad[i] != 0xff)
			return 0;
	return 1;
}

/* sign * 10^U(-6, 0) * scale */
static float heavy(float scale)
{
	float x = (float)pow(10.0, -6.0 * bk_rng_uniform(&rng)) * scale;
	return bk_rng_uniform(&rng) < 0.5 ? -x : x;
}

static float *hrand(size_t n, float scale)
{
	float *x = xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = heavy(scale);
	return x;
}

static int has_nan(const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (isnan(x[i]))
			return 1;
	return 0;
}

/* index of the first differing float, or -1 */
static long first_diff(const float *a, const float *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], 4))
			return (long)i;
	return -1;
}

static void check_adamw(size_t n)
{
	for (int wdi = 0; wdi < 2; wdi++) {
		double wd = wdi ? 0.01 : 0;
		float *p = hrand(n, 1), *g = hrand(n, 0.1f), *m = xcalloc(n ? n : 1, 4);
		float *v = xcalloc(n ? n : 1, 4);
		float *dp = up(p, n * 4), *dg = up(g, n * 4), *dm = up(m, n * 4), *dv = up(v, n * 4);
		int fence = 1;
		for (int t = 1; t <= 3; t++) {
			if (t > 1) { /* fresh gradients each step */
				free(g);
				g = hrand(n, 0.1f);
				dut->upload(dg, g, n * 4);
			}
			ref->adamw_step(p, g, m, v, n, 1e-3 * t, 0.9, 0.999, 1e-8, wd, t);
			dut->adamw_step(dp, dg, dm, dv, n, 1e-3 * t, 0.9, 0.999, 1e-8, wd, t);
		}
		float *rp = xmalloc(n * 4 + 4), *rm = xmalloc(n * 4 + 4), *rv = xmalloc(n * 4 + 4);
		fence &= down(rp, dp, n * 4) & down(rm, dm, n * 4) & down(rv, dv, n * 4);
		long d = first_diff(rp, p, n), dm_ = first_diff(rm, m, n), dv_ = first_diff(rv, v, n);
		char det[128];
		snprintf(det, sizeof det, "3 steps wd %g: first diff p %ld m %ld v %ld%s", wd, d, dm_,
			 dv_, fence ? "" : " (fence hit)");
		line("adamw_step", n, det,
		     fence && d < 0 && dm_ < 0 && dv_ < 0 && !has_nan(rp, n) && !has_nan(rv, n));
		dut->free(dp), dut->free(dg), dut->free(dm), dut->free(dv);
		free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv);
	}
}

static void check_adamw8(size_t n, int block)
{
	size_t nb = bk_q8_blocks(n, block);
	float *p = xmalloc((n ? n : 1) * 4), *g = xmalloc((n ? n : 1) * 4);
	uint8_t *qm = xcalloc(n ? n : 1, 1), *qv = xcalloc(n ? n : 1, 1);
	float *am = xcalloc(nb ? nb : 1, 4), *av = xcalloc(nb ? nb : 1, 4);
	for (size_t i = 0; i < n; i++)
		p[i] = heavy(1);
	float *dp = up(p, n * 4), *dg = up(p, n * 4), *dam = up(am, nb * 4), *dav = up(av, nb * 4);
	uint8_t *dqm = up(qm, n), *dqv = up(qv, n);
	for (int t = 1; t <= 4; t++) {
		for (size_t i = 0; i < n; i++) /* blocks of different scales */
			g[i] = heavy((float)pow(10.0, (double)(i / (size_t)block % 5) - 2));
		dut->upload(dg, g, n * 4);
		double wd = t % 2 ? 0.01 : 0;
		ref->adamw8_step(p, g, qm, qv, am, av, n, block, 1e-3, 0.9, 0.999, 1e-8, wd, t);
		dut->adamw8_step(dp, dg, dqm, dqv, dam, dav, n, block, 1e-3, 0.9, 0.999, 1e-8, wd,
				 t);
	}
	float *rp = xmalloc(n * 4 + 4), *ram = xmalloc(nb * 4 + 4), *rav = xmalloc(nb * 4 + 4);
	uint8_t *rqm = xmalloc(n + 1), *rqv = xmalloc(n + 1);
	int fence = down(rp, dp, n * 4) & down(ram, dam, nb * 4) & down(rav, dav, nb * 4) &
		    down(rqm, dqm, n) & down(rqv, dqv, n);
	long d = first_diff(rp, p, n), da = first_diff(ram, am, nb), dv = first_diff(rav, av, nb);
	int codes = !memcmp(rqm, qm, n) && !memcmp(rqv, qv, n);
	char det[128];
	snprintf(det, sizeof det, "block %d, 4 steps: first diff p %ld absmax %ld %ld%s%s", block,
		 d, da, dv, codes ? "" : " codes differ", fence ? "" : " (fence hit)");
	line("adamw8_step", n, det,
	     fence && codes && d < 0 && da < 0 && dv < 0 && !has_nan(rp, n) && !has_nan(ram, nb));
	dut->free(dp), dut->free(dg), dut->free(dam), dut->free(dav), dut->free(dqm),
		dut->free(dqv);
	free(p), free(g), free(qm), free(qv), free(am), free(av), free(rp), free(ram), free(rav);
	free(rqm), free(rqv);
}

static void check_sumsq_scale(size_t n)
{
	float *g = hrand(n, 3);
	float *dg = up(g, n * 4);
	double want = ref->grad_sumsq(g, n), a = dut->grad_sumsq(dg, n), b = dut->grad_sumsq(dg, n);
	double rel = fabs(a - want) / (want > 0 ? want : 1);
	char det[128];
	snprintf(det, sizeof det, "rel err %.3g, repeat %s", rel, a == b ? "equal" : "DIFFERS");
	line("grad_sumsq", n, det, isfinite(a) && rel <= 1e-12 && a == b);

	ref->scale(g, 1.0 / 3, n);
	dut->scale(dg, 1.0 / 3, n);
	float *r = xmalloc(n * 4 + 4);
	int fence = down(r, dg, n * 4);
	long d = first_diff(r, g, n);
	snprintf(det, sizeof det, "by 1/3: first diff %ld%s", d, fence ? "" : " (fence hit)");
	line("scale", n, det, fence && d < 0 && !has_nan(r, n));
	dut->free(dg);
	free(g), free(r);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* one optimizer step over n parameters, timed (n = 50M: the LoRA of TinyLlama-1.1B at
 * r = 64 on all seven projections) */
static void bench(size_t n)
{
	float *h = hrand(n, 0.01f);
	float *p = up(h, n * 4), *g = up(h, n * 4), *m = dut->alloc(n * 4), *v = dut->alloc(n * 4);
	size_t nb = bk_q8_blocks(n, 256);
	uint8_t *qm = dut->alloc(n), *qv = dut->alloc(n);
	float *am = dut->alloc(nb * 4), *av = dut->alloc(nb * 4);
	dut->zero(m, n * 4), dut->zero(v, n * 4), dut->zero(qm, n), dut->zero(qv, n);
	dut->zero(am, nb * 4), dut->zero(av, nb * 4);
	double t[3] = {0};
	for (int k = 0; k < 3; k++) {
		int reps = 5;
		dut->download(h, p, 4); /* synchronises */
		double t0 = now_s();
		for (int r = 0; r < reps; r++) {
			if (k == 0)
				dut->adamw_step(p, g, m, v, n, 1e-4, 0.9, 0.999, 1e-8, 0, r + 1);
			else if (k == 1)
				dut->adamw8_step(p, g, qm, qv, am, av, n, 256, 1e-4, 0.9, 0.999, 1e-8, 0,
						 r + 1);
			else
				dut->grad_sumsq(g, n);
		}
		dut->download(h, p, 4);
		t[k] = (now_s() - t0) / reps;
	}
	/* bytes moved: p r/w, g r, m and v r/w (fp32: 4 B each; 8-bit: 1 B each) */
	printf("bench n=%zu: adamw_step %.3f ms (%.0f GB/s), adamw8_step %.3f ms (%.0f GB/s), "
	       "grad_sumsq %.3f ms (%.0f GB/s)\n", n, t[0] * 1e3, 28.0 * n / t[0] / 1e9,
	       t[1] * 1e3, 16.0 * n / t[1] / 1e9, t[2] * 1e3, 4.0 * n / t[2] / 1e9);
	dut->free(p), dut->free(g), dut->free(m), dut->free(v), dut->free(qm), dut->free(qv);
	dut->free(am), dut->free(av);
	free(h);
}

int main(int argc, char **argv)
{
	bk_diag_init("check_optim");
#ifdef BK_HAVE_CUDA
	dut = &bk_ops_cuda;
#endif
	int tiny = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--host"))
			dut = &bk_ops_host;
		else if (!strcmp(argv[i], "--tiny"))
			tiny = 1;
		else
			die_usage("usage: check_optim [--host] [--tiny]");
	}
	if (!dut)
		die("check_optim: built without CUDA; only --host is available");
	if (!dut->adamw_step || !dut->adamw8_step || !dut->grad_sumsq || !dut->scale)
		die("check_optim: the %s op table lacks an optimizer op (adamw_step, adamw8_step, "
		    "grad_sumsq, scale)", dut->name);
	bk_rng_seed(&rng, 2024);
	size_t sizes[] = {1, 255, 256, 2049, 65536 * 3 + 17, (1u << 22) + 3};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] - (tiny ? 1 : 0); i++) {
		check_adamw(sizes[i]);
		check_adamw8(sizes[i], 256);
		check_adamw8(sizes[i], 2048);
		check_sumsq_scale(sizes[i]);
	}
	if (dut != &bk_ops_host)
		bench(tiny ? (size_t)1 << 16 : (size_t)50 << 20);
	printf("check_optim: %d failed\n", n_fail);
	return n_fail ? 1 : 0;
}
