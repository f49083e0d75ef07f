/* check_sizes.c - on a GPU: the CUDA ops at realistic sizes against the host twin, where
 * check_attention and test_cuda_ops use small ones (tiles, chunks and grids that only
 * large shapes reach):
 *   loss: kl_exact at V = 151936 (Qwen2 vocabulary, 37 chunks of 4096 and a partial
 *     one), H = 1536, 128 rows of 3 samples, teacher as hidden rows and as log-probs
 *     (teacher_logprobs); base weights and hidden rows rounded to bf16 on both sides;
 *     bounds as check_attention's: loss relative 2e-3, row_kl 2e-3, d_hidden 1e-2,
 *     log-probs absolute 1e-3;
 *   attention: forward and backward (dq, dk, dv accumulate onto random values) at
 *     1 x 1024 tokens and 2 x 2048 tokens, 32 heads, 4 KV heads, D 64; bound
 *     max|cuda - host| / max(max|host|, 1e-3) <= 2e-4 (check_attention's 1e-4 for sums
 *     up to 8x longer), lse absolute 2e-4.
 * Outputs are poisoned with NaN before each run; NaN never passes.  One line per case
 * and output ("ok" / "FAIL"), a summary line last; exit 1 on any failure.
 * --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU): the loss at V = 151936
 * (the same chunks) with 4 rows of H 64, the attention at 1 x 128 and 2 x 80 tokens, 8/1
 * heads.
 * Usage: check_sizes [--tiny] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "formats/safetensors.h"
#include "gpu/cuda/cuda.h"
#include "gpu/ops.h"
#include "tests/gpu/gpu_check.h"

#ifndef BK_HAVE_CUDA
#error "check_sizes needs a CUDA build (BK_HAVE_CUDA)"
#endif

static const bk_ops *Hs = &bk_ops_host, *G = &bk_ops_cuda;
static bk_rng rng;
static int n_fail, n_lines;

/* device copy of h [n]; h NULL: NaN everywhere */
static float *put(const float *h, size_t n)
{
	float *d = G->alloc(n * sizeof(float));
	if (h) {
		G->upload(d, h, n * sizeof(float));
	} else {
		float *nan = xmalloc(n * sizeof(float));
		for (size_t i = 0; i < n; i++)
			nan[i] = NAN;
		G->upload(d, nan, n * sizeof(float));
		free(nan);
	}
	return d;
}

static float *get(const float *d, size_t n)
{
	float *h = xmalloc(n * sizeof(float));
	G->download(h, d, n * sizeof(float));
	return h;
}

static void report(const char *op, const char *size, const char *what, double err, double tol)
{
	int ok = err <= tol; /* NaN / inf fails */
	n_lines++;
	n_fail += !ok;
	printf("%-18s %-34s %-8s err %-10.3g bound %-8.1g %s\n", op, size, what, err, tol,
	       ok ? "ok" : "FAIL");
	fflush(stdout);
}

static void check_loss(int n, int h, int v, int chunk)
{
	char size[96];
	snprintf(size, sizeof size, "N=%d H=%d V=%d C=%d", n, h, v, chunk);
	size_t nh = (size_t)n * h, nv = (size_t)n * v;
	float *head = gc_rand_bf16(&rng, (size_t)v * h, 1.0f);
	float *hs = gc_rand_bf16(&rng, nh, 5.0f / sqrtf((float)h)),
	      *ht = gc_rand_bf16(&rng, nh, 5.0f / sqrtf((float)h));
	int32_t *so = xmalloc((size_t)n * 4);
	for (int r = 0; r < n; r++)
		so[r] = r < n / 2 ? 0 : r < 3 * n / 4 ? 1 : 2;
	bk_weight *wh = Hs->weight_upload(head, v, h), *wg = G->weight_upload(head, v, h);
	float *dhs = put(hs, nh), *dht = put(ht, nh), *dd = put(NULL, nh);
	float *dref = xmalloc(nh * 4), *klr = xmalloc((size_t)n * 4), *klg = xmalloc((size_t)n * 4);
	for (int pass = 0; pass < 2; pass++) { /* teacher hidden rows, then log-probs */
		float *tl = NULL, *dtl = NULL;
		const char *op = pass ? "kl_exact logp" : "kl_exact hidden";
		if (pass) {
			tl = xmalloc(nv * 4);
			Hs->teacher_logprobs(ht, wh, n, chunk, 1.0f, 0.0f, tl);
			dtl = put(NULL, nv);
			G->teacher_logprobs(dht, wg, n, chunk, 1.0f, 0.0f, dtl);
			float *g = get(dtl, nv);
			report("teacher_logprobs", size, "logp", gc_relerr(g, tl, nv, -1),
			       1e-3);
			free(g);
			G->upload(dtl, tl, nv * 4); /* the host's log-probs as the teacher on both sides */
		}
		for (int r = 0; r < n; r++)
			klg[r] = NAN;
		double lr = Hs->kl_exact(hs, wh, pass ? NULL : ht, tl, so, n, 3, chunk, 1.0f, 0.0f,
					 dref, klr);
		double lg = G->kl_exact(dhs, wg, pass ? NULL : dht, dtl, so, n, 3, chunk, 1.0f, 0.0f,
					dd, klg);
		report(op, size, "loss", fabs(lg - lr) / fabs(lr), 2e-3);
		report(op, size, "row_kl", gc_relerr(klg, klr, (size_t)n, 1e-3), 2e-3);
		float *g = get(dd, nh);
		report(op, size, "d_hidden", gc_relerr(g, dref, nh, 1e-12), 1e-2);
		free(g);
		free(tl);
		if (dtl)
			G->free(dtl);
	}
	Hs->weight_free(wh);
	G->weight_free(wg);
	G->free(dhs), G->free(dht), G->free(dd);
	free(head), free(hs), free(ht), free(so), free(dref), free(klr), free(klg);
}

static void check_attention(int S, int len, int NH, int NKV, int D)
{
	int32_t cu[3] = { 0, len, 2 * len };
	int T = S * len;
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, nl = (size_t)NH * T;
	char size[96];
	snprintf(size, sizeof size, "%d x %d, NH=%d NKV=%d D=%d", S, len, NH, NKV, D);
	bk_attn ap = bk_attn_default(D);
	float *q = gc_rand(&rng, nq, 1.5f), *k = gc_rand(&rng, nk, 1.5f),
	      *v = gc_rand(&rng, nk, 1.0f);
	float *out_h = xmalloc(nq * 4), *lse_h = xmalloc(nl * 4);
	Hs->attention_forward(out_h, lse_h, q, k, v, cu, S, T, NH, NKV, D, NULL, NULL, 0, &ap);
	float *dq_ = put(q, nq), *dk_ = put(k, nk), *dv_ = put(v, nk);
	float *dout = put(NULL, nq), *dlse = put(NULL, nl);
	int32_t *dcu = G->alloc(sizeof cu);
	G->upload(dcu, cu, sizeof cu);
	G->attention_forward(dout, dlse, dq_, dk_, dv_, dcu, S, T, NH, NKV, D, NULL, NULL, 0, &ap);
	float *g = get(dout, nq);
	report("attention fwd", size, "out", gc_relerr(g, out_h, nq, 1e-3), 2e-4);
	free(g);
	g = get(dlse, nl);
	report("attention fwd", size, "lse", gc_relerr(g, lse_h, nl, -1), 2e-4);
	free(g);

	float *go = gc_rand(&rng, nq, 1.0f);
	float *dq0 = gc_rand(&rng, nq, 0.5f), *dk0 = gc_rand(&rng, nk, 0.5f),
	      *dv0 = gc_rand(&rng, nk, 0.5f);
	float *dq_h = xmalloc(nq * 4), *dk_h = xmalloc(nk * 4), *dv_h = xmalloc(nk * 4);
	memcpy(dq_h, dq0, nq * 4), memcpy(dk_h, dk0, nk * 4), memcpy(dv_h, dv0, nk * 4);
	Hs->attention_backward(dq_h, dk_h, dv_h, go, q, k, v, out_h, lse_h, cu, S, T, NH, NKV, D,
			       &ap);
	float *dgo = put(go, nq), *dout_h = put(out_h, nq), *dlse_h = put(lse_h, nl);
	float *ddq = put(dq0, nq), *ddk = put(dk0, nk), *ddv = put(dv0, nk);
	G->attention_backward(ddq, ddk, ddv, dgo, dq_, dk_, dv_, dout_h, dlse_h, dcu, S, T, NH, NKV,
			      D, &ap);
	/* the gradient parts alone (the random starting values removed) */
	const struct {
		const char *name;
		float *dev, *host, *start;
		size_t n;
	} outs[3] = { { "dq", ddq, dq_h, dq0, nq }, { "dk", ddk, dk_h, dk0, nk },
		      { "dv", ddv, dv_h, dv0, nk } };
	for (int i = 0; i < 3; i++) {
		g = get(outs[i].dev, outs[i].n);
		for (size_t j = 0; j < outs[i].n; j++) {
			g[j] -= outs[i].start[j];
			outs[i].host[j] -= outs[i].start[j];
		}
		report("attention bwd", size, outs[i].name,
		       gc_relerr(g, outs[i].host, outs[i].n, 1e-3), 2e-4);
		free(g);
	}
	free(q), free(k), free(v), free(out_h), free(lse_h), free(go), free(dq0), free(dk0);
	free(dv0), free(dq_h), free(dk_h), free(dv_h);
	G->free(dq_), G->free(dk_), G->free(dv_), G->free(dout), G->free(dlse), G->free(dcu);
	G->free(dgo), G->free(dout_h), G->free(dlse_h), G->free(ddq), G->free(ddk), G->free(ddv);
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	int tiny = argc == 2 && !strcmp(argv[1], "--tiny");
	if (argc > 2 || (argc == 2 && !tiny))
		die_usage("usage: check_sizes [--tiny]");
	bk_rng_seed(&rng, 151936);
	if (tiny) {
		check_loss(4, 64, 151936, 4096);
		check_attention(1, 128, 8, 1, 64);
		check_attention(2, 80, 8, 1, 64);
	} else {
		check_loss(128, 1536, 151936, 4096);
		check_attention(1, 1024, 32, 4, 64);
		check_attention(2, 2048, 32, 4, 64);
	}
	printf("check_sizes: %d lines, %d failed\n", n_lines, n_fail);
	return n_fail ? 1 : 0;
}
