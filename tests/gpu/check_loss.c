/* check_loss.c - on a GPU: both CUDA versions of the LM-head KL (gpu/cuda/cuda_loss.cu:
 * BK_LOSS=v1, the default, vocabulary chunks; v2, row blocks with 3 / 2 head GEMMs and
 * device-side validation of the teacher fields) and the teacher ops, with and without
 * Gemma-2's final logit softcap, against the host twin (gpu/host/loss.c) on the same
 * inputs; v2's bad-input errors; then v1 and v2 timed side by side.  One line per case
 * and output; exit 1 on any failure (NaN never passes: outputs are poisoned with NaN and
 * fenced by sentinels that catch out-of-bounds writes).
 *
 * Bounds (both versions; base weights and hidden rows are rounded to bf16 before both
 * runs, so the GPU's bf16 GEMM inputs are exact): the logits differ by fp32 summation
 * order only (|dz| <= H 2^-24 sum|x w|, ~1e-6 relative here), the maxima are fp32 and the
 * sums of exponentials and the KL double on both sides, so the loss and each row's KL
 * differ by that much; the one coarse rounding is dlogits to bf16 (2^-9 relative each)
 * before the d_hidden GEMM, and the softcap's slope 1 - tanh^2 <= 1 does not enlarge it:
 *   loss: relative 2e-3;  row_kl: max abs / max(max|host|, 1e-3) 2e-3;
 *   d_hidden: max abs / max|host| 1e-2;  teacher_logprobs: max abs 1e-3;
 *   teacher_topk: ids distinct and each within 1e-3 of the host's K-th log-prob or above,
 *     logp within 1e-3 of the host's full log-probs at those ids, rest within 1e-3.
 * (tests/gpu/check_attention.c checks v1 the same way without a cap; these are its bounds.)
 * Cases: V = 1000 and 5003 (chunks 256 / 1024: partial last chunk), V = 151936 with
 * 400 rows (v2's exact loss with a hidden teacher: row blocks of 353 and 47 rows),
 * temperatures 1 and 1.5, caps 0, 2
 * (bends these logits, |z| up to ~5) and 30 (Gemma-2's default).
 * Bad input under v2, each in a child process (CUDA does not survive fork): an id out
 * of range, an id twice, rest 1.5, a log-prob > 0 must exit 1 with loss.c's message.
 * Timing: "loss <op> <shape>: v1 X ms, v2 Y ms, v1/v2 R" at the Qwen2.5-0.5B head
 * (H 896, V 151936, 2048 rows) and the TinyLlama head (H 2048, V 32000, 4096 rows), K 64,
 * with d_hidden, median of 5 after a warm-up.
 * --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU): the V = 5003 case with
 * 40 rows, the V = 151936 one as 2 rows of V = 20011 (5 chunks, one row block), the
 * timing rows at a small head (H 64, V 4099, 16 and 32 rows).
 * Usage: check_loss [--no-bench | --tiny] | check_loss --bad N (internal: one bad-input
 * case) */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/rng.h"
#include "formats/safetensors.h"
#include "gpu/cuda/cuda.h"
#include "gpu/host/loss.h"
#include "gpu/ops.h"
#include "tests/gpu/gpu_check.h"

#ifndef BK_HAVE_CUDA
#error "check_loss needs a CUDA build (BK_HAVE_CUDA)"
#endif

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
	printf("%-22s %-52s %-8s err %-10.3g bound %-8.1g%s %s\n", op, size, what, err, tol,
	       damage ? " sentinel damaged" : "", ok ? "ok" : "FAIL");
}

/* one KL result of the GPU against the host's: loss, row_kl, d_hidden */
static void judge(const char *op, const char *size, double lg, double lr, const float *klg,
		  const float *klr, int n, float *dd, const float *dref, size_t nh)
{
	float *dgot = xmalloc(nh * sizeof(float));
	report(op, size, "loss", fabs(lg - lr) / fabs(lr), TOL_LOSS, 0);
	report(op, size, "row_kl", gc_relerr(klg, klr, (size_t)n, 1e-3), TOL_ROWKL, 0);
	int dmg = gc_get(G, dgot, dd, nh);
	report(op, size, "d_hidden", gc_relerr(dgot, dref, nh, 1e-12), TOL_DHID, dmg);
	free(dgot);
}

static void check_case(int mode, int n, int h, int v, int chunk, float temp, int k, float cap)
{
	char size[128];
	snprintf(size, sizeof size, "v%d N=%d H=%d V=%d C=%d T=%g K=%d cap=%g", mode, n, h, v,
		 chunk, (double)temp, k, (double)cap);
	bk_cuda_loss_set_mode(mode);
	size_t nh = (size_t)n * h, nv = (size_t)n * v, nk = (size_t)n * k;
	float *head = gc_rand_bf16(&rng, (size_t)v * h, 1.0f);
	float *hs = gc_rand_bf16(&rng, nh, 5.0f / sqrtf((float)h)),
	      *ht = gc_rand_bf16(&rng, nh, 5.0f / sqrtf((float)h));
	int32_t *so = xmalloc((size_t)n * 4);
	for (int r = 0; r < n; r++)
		so[r] = r % 3 == 2 ? 1 : r % 5 == 0 ? 3 : 0; /* 4 samples of different sizes */
	int ns = 4;
	bk_weight *wh = H->weight_upload(head, v, h), *wg = G->weight_upload(head, v, h);
	float *dhs = gc_put(G, hs, nh), *dht = gc_put(G, ht, nh);
	float *dref = xmalloc(nh * 4), *klr = xmalloc((size_t)n * 4), *klg = xmalloc((size_t)n * 4);

	/* exact, teacher hidden */
	float *dd = gc_put(G, NULL, nh);
	double lr = H->kl_exact(hs, wh, ht, NULL, so, n, ns, chunk, temp, cap, dref, klr);
	double lg = G->kl_exact(dhs, wg, dht, NULL, so, n, ns, chunk, temp, cap, dd, klg);
	judge("kl_exact hidden", size, lg, lr, klg, klr, n, dd, dref, nh);
	gc_drop(G, dd);

	/* teacher log-probs (one version of the teacher ops: both modes share them) */
	float *tl = xmalloc(nv * 4), *tlg = xmalloc(nv * 4), *dtl = gc_put(G, NULL, nv);
	H->teacher_logprobs(ht, wh, n, chunk, temp, cap, tl);
	G->teacher_logprobs(dht, wg, n, chunk, temp, cap, dtl);
	int dmg = gc_get(G, tlg, dtl, nv);
	report("teacher_logprobs", size, "logp", gc_relerr(tlg, tl, nv, -1), TOL_LOGP, dmg);
	G->upload(dtl, tl, nv * 4); /* the host's log-probs as the teacher on both sides */
	dd = gc_put(G, NULL, nh);
	lr = H->kl_exact(hs, wh, NULL, tl, so, n, ns, chunk, temp, cap, dref, klr);
	lg = G->kl_exact(dhs, wg, NULL, dtl, so, n, ns, chunk, temp, cap, dd, klg);
	judge("kl_exact logp", size, lg, lr, klg, klr, n, dd, dref, nh);
	gc_drop(G, dd);

	/* teacher top-k on the GPU, judged against the host's full log-probs; then the
	 * sparse loss on the host's top-k */
	int32_t *idh = xmalloc(nk * 4), *idg = xmalloc(nk * 4);
	float *lph = xmalloc(nk * 4), *lpg = xmalloc(nk * 4), *rsh = xmalloc((size_t)n * 4);
	float *rsg = xmalloc((size_t)n * 4);
	H->teacher_topk(ht, wh, n, chunk, temp, cap, k, idh, lph, rsh);
	int32_t *did = G->alloc(nk * 4);
	float *dlp = gc_put(G, NULL, nk), *drs = gc_put(G, NULL, (size_t)n);
	G->teacher_topk(dht, wg, n, chunk, temp, cap, k, did, dlp, drs);
	G->download(idg, did, nk * 4);
	dmg = gc_get(G, lpg, dlp, nk) + gc_get(G, rsg, drs, (size_t)n);
	double e_lp = 0, e_rest = 0, e_set = 0;
	int bad_ids = 0;
	for (int r = 0; r < n; r++) {
		const float *full = tl + (size_t)r * v;
		float kth = lph[(size_t)r * k + k - 1];
		for (int i = 0; i < k; i++) {
			int id = idg[(size_t)r * k + i];
			if (id < 0 || id >= v) {
				bad_ids++;
				continue;
			}
			for (int j = 0; j < i; j++)
				bad_ids += idg[(size_t)r * k + j] == id;
			e_lp = fmax(e_lp, fabs(lpg[(size_t)r * k + i] - full[id]));
			e_set = fmax(e_set, kth - full[id]);
		}
		e_rest = fmax(e_rest, fabs(rsg[r] - rsh[r]));
	}
	report("teacher_topk", size, "ids", (double)bad_ids, 0, 0);
	report("teacher_topk", size, "logp", e_lp, TOL_LOGP, dmg);
	report("teacher_topk", size, "set", e_set, TOL_LOGP, 0);
	report("teacher_topk", size, "rest", e_rest, TOL_LOGP, 0);
	G->upload(did, idh, nk * 4);
	G->upload(dlp, lph, nk * 4);
	G->upload(drs, rsh, (size_t)n * 4);
	dd = gc_put(G, NULL, nh);
	lr = H->kl_topk(hs, wh, idh, lph, rsh, so, n, ns, k, chunk, temp, cap, dref, klr);
	lg = G->kl_topk(dhs, wg, did, dlp, drs, so, n, ns, k, chunk, temp, cap, dd, klg);
	judge("kl_topk", size, lg, lr, klg, klr, n, dd, dref, nh);
	gc_drop(G, dd);

	H->weight_free(wh), G->weight_free(wg);
	gc_drop(G, dhs), gc_drop(G, dht), gc_drop(G, dtl), gc_drop(G, dlp), gc_drop(G, drs);
	G->free(did);
	free(head), free(hs), free(ht), free(so), free(dref), free(klr), free(klg), free(tl);
	free(tlg), free(idh), free(idg), free(lph), free(lpg), free(rsh), free(rsg);
}

/* ---- bad teacher fields under v2: run in a child (this program with --bad N) ---- */

static const struct {
	const char *what, *message;
} bad_cases[] = {
	{"an id out of range", "sparse loss: row 2: top-k id 50 is not in [0, 50)"},
	{"an id twice", "sparse loss: row 1: top-k id 7 appears twice"},
	{"rest 1.5", "sparse loss: row 3: teacher rest mass 1.5 is not in [0, 1]"},
	{"a log-prob > 0", "sparse loss: row 0: teacher log-prob 0.5 is not <= 0"},
};

static int run_bad(int which)
{
	enum { N = 4, Hd = 8, V = 50, K = 3 };
	bk_cuda_loss_set_mode(2);
	float *head = gc_rand_bf16(&rng, (size_t)V * Hd, 1.0f),
	      *hs = gc_rand_bf16(&rng, (size_t)N * Hd, 1.0f);
	int32_t ids[N * K], so[N] = {0, 0, 1, 1};
	float lp[N * K], rest[N];
	for (int r = 0; r < N; r++) {
		for (int i = 0; i < K; i++)
			ids[r * K + i] = 3 * i + r, lp[r * K + i] = -2.0f - i;
		rest[r] = 0.5f;
	}
	if (which == 0)
		ids[2 * K + 1] = 50;
	else if (which == 1)
		ids[1 * K + 0] = 7, ids[1 * K + 2] = 7;
	else if (which == 2)
		rest[3] = 1.5f;
	else
		lp[0 * K + 2] = 0.5f;
	bk_weight *w = G->weight_upload(head, V, Hd);
	float *dhs = gc_put(G, hs, (size_t)N * Hd), *dlp = gc_put(G, lp, N * K),
	      *drs = gc_put(G, rest, N);
	float *dd = gc_put(G, NULL, (size_t)N * Hd);
	int32_t *did = G->alloc(sizeof ids);
	G->upload(did, ids, sizeof ids);
	G->kl_topk(dhs, w, did, dlp, drs, so, N, 2, K, 16, 1.0f, 0.0f, dd, NULL);
	printf("no error\n");
	return 0;
}

static void check_bad(const char *self)
{
	for (int i = 0; i < (int)(sizeof bad_cases / sizeof bad_cases[0]); i++) {
		char cmd[4200], out[4096] = "";
		snprintf(cmd, sizeof cmd, "'%s' --bad %d 2>&1", self, i);
		FILE *p = popen(cmd, "r");
		size_t got = p ? fread(out, 1, sizeof out - 1, p) : 0;
		out[got] = 0;
		int st = p ? pclose(p) : -1;
		int ok = WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(out, bad_cases[i].message) &&
			 strchr(out, '\n') == out + strlen(out) - 1;
		n_lines++;
		n_fail += !ok;
		char *nl = strchr(out, '\n');
		if (nl)
			*nl = 0;
		printf("%-22s %-52s %-8s %s: %s\n", "kl_topk v2 bad input", bad_cases[i].what, "error",
		       ok ? "ok" : "FAIL", out);
	}
}

/* ---- timing ---- */

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void bench(int n, int h, int v, int k, const char *name)
{
	size_t nh = (size_t)n * h, nk = (size_t)n * k;
	float *head = gc_rand_bf16(&rng, (size_t)v * h, 1.0f),
	      *hs = gc_rand_bf16(&rng, nh, 5.0f / sqrtf((float)h));
	float *ht = gc_rand_bf16(&rng, nh, 5.0f / sqrtf((float)h));
	int32_t *so = xmalloc((size_t)n * 4);
	for (int r = 0; r < n; r++)
		so[r] = r / 64; /* samples of 64 rows */
	int ns = (n + 63) / 64;
	bk_weight *w = G->weight_upload(head, v, h);
	float *dhs = G->alloc(nh * 4), *dht = G->alloc(nh * 4), *dd = G->alloc(nh * 4);
	G->upload(dhs, hs, nh * 4), G->upload(dht, ht, nh * 4);
	int32_t *did = G->alloc(nk * 4);
	float *dlp = G->alloc(nk * 4), *drs = G->alloc((size_t)n * 4);
	G->teacher_topk(dht, w, n, 4096, 1.0f, 0.0f, k, did, dlp, drs);
	for (int op = 0; op < 2; op++) {
		double ms[2];
		for (int mode = 1; mode <= 2; mode++) {
			bk_cuda_loss_set_mode(mode);
			double t[6];
			for (int it = 0; it < 6; it++) {
				double t0 = now_ms();
				if (op == 0)
					G->kl_exact(dhs, w, dht, NULL, so, n, ns, 4096, 1.0f, 0.0f, dd, NULL);
				else
					G->kl_topk(dhs, w, did, dlp, drs, so, n, ns, k, 4096, 1.0f, 0.0f, dd,
						   NULL);
				t[it] = now_ms() - t0; /* the op returns the loss: it has synchronised */
			}
			qsort(t + 1, 5, sizeof(double), cmp_d);
			ms[mode - 1] = t[3];
		}
		printf("loss %s %s N=%d H=%d V=%d%s: v1 %.2f ms, v2 %.2f ms, v1/v2 %.2fx\n",
		       op ? "kl_topk" : "kl_exact hidden", name, n, h, v, op ? " K=64" : "", ms[0],
		       ms[1], ms[0] / ms[1]);
	}
	G->weight_free(w);
	G->free(dhs), G->free(dht), G->free(dd), G->free(did), G->free(dlp), G->free(drs);
	free(head), free(hs), free(ht), free(so);
}

int main(int argc, char **argv)
{
	bk_diag_init("check_loss");
	bk_rng_seed(&rng, 20261201);
	if (argc == 3 && !strcmp(argv[1], "--bad"))
		return run_bad(atoi(argv[2]));
	int no_bench = argc > 1 && !strcmp(argv[1], "--no-bench");
	int tiny = argc > 1 && !strcmp(argv[1], "--tiny");
	if (argc > 2 || (argc > 1 && !no_bench && !tiny))
		die_usage("usage: check_loss [--no-bench | --tiny] | check_loss --bad N");
	for (int mode = 1; mode <= 2; mode++) {
		check_case(mode, 37, 64, 1000, 256, 1.0f, 16, 0.0f);
		check_case(mode, 37, 64, 1000, 256, 1.5f, 16, 2.0f);
		check_case(mode, tiny ? 40 : 150, 96, 5003, 1024, 1.0f, 64, 30.0f);
		check_case(mode, tiny ? 2 : 400, 64, tiny ? 20011 : 151936, 4096, 1.0f, 32, 2.0f);
	}
	check_bad(argv[0]);
	bk_cuda_loss_set_mode(1);
	if (tiny) {
		bench(16, 64, 4099, 64, "small head");
		bench(32, 64, 4099, 64, "small head");
	} else if (!no_bench) {
		bench(2048, 896, 151936, 64, "Qwen2.5-0.5B head");
		bench(4096, 2048, 32000, 64, "TinyLlama head");
	}
	printf("check_loss: %d lines, %d failed\n", n_lines, n_fail);
	return n_fail ? 1 : 0;
}
