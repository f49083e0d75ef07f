/* test_loss_ops.c - the host twin's row and loss ops (ops.h gather_rows, scatter_rows,
 * kl_exact, kl_topk, teacher_topk, teacher_logprobs) against a naive row copy and
 * against direct calls of the gpu/host/loss.h functions they stand for: bit-identical
 * results on odd sizes (V not a multiple of the chunk, H != V), through the op table
 * with the LM head behind a bk_weight.  Not the loss math itself (test_loss.c). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/host/host_rows.h"
#include "gpu/host/loss.h"
#include "gpu/ops.h"
#include "tests/harness.h"

static const bk_ops *ops = &bk_ops_host;

static void fill(bk_rng *g, float *x, size_t n, double scale)
{
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((bk_rng_uniform(g) * 2 - 1) * scale);
}

static int same(const void *a, const void *b, size_t bytes) { return !memcmp(a, b, bytes); }

/* a device copy of host data (host twin: ordinary memory, but through the ops) */
static void *dev(const void *host, size_t bytes)
{
	void *d = ops->alloc(bytes);
	ops->upload(d, host, bytes);
	return d;
}

static void test_rows(void)
{
	bk_rng g;
	bk_rng_seed(&g, 11);
	enum { T = 13, H = 7, N = 5 };
	float src[T * H], base[T * H], rows[N * H];
	fill(&g, src, T * H, 1);
	fill(&g, base, T * H, 1);
	int32_t idx[N] = {12, 0, 7, 3, 8};
	float *src_d = dev(src, sizeof src), *out_d = ops->alloc(sizeof rows);
	int32_t *idx_d = dev(idx, sizeof idx);
	ops->gather_rows(out_d, src_d, idx_d, N, T, H);
	ops->download(rows, out_d, sizeof rows);
	int ok = 1;
	for (int r = 0; r < N; r++)
		ok &= same(rows + r * H, src + idx[r] * H, H * sizeof(float));
	CHECK(ok, "gather_rows differs from the rows it names");

	float *dst_d = dev(base, sizeof base), got[T * H];
	ops->scatter_rows(dst_d, out_d, idx_d, N, T, H);
	ops->download(got, dst_d, sizeof got);
	int bad = 0;
	for (int t = 0; t < T; t++) {
		int r = -1;
		for (int i = 0; i < N; i++)
			r = idx[i] == t ? i : r;
		for (int h = 0; h < H; h++) {
			float want = r < 0 ? base[t * H + h] : base[t * H + h] + rows[r * H + h];
			bad += got[t * H + h] != want;
		}
	}
	CHECK(!bad, "scatter_rows: %d numbers differ from dst + rows", bad);
	/* N = 0 touches nothing */
	ops->scatter_rows(dst_d, out_d, idx_d, 0, T, H);
	float again[T * H];
	ops->download(again, dst_d, sizeof again);
	CHECK(same(again, got, sizeof got), "scatter_rows with N = 0 wrote something");
	ops->free(src_d), ops->free(out_d), ops->free(idx_d), ops->free(dst_d);
}

/* kl_exact (teacher hidden and teacher log-probs), kl_topk, teacher_topk and
 * teacher_logprobs through the ops against the loss.h functions, bit for bit */
static void test_loss(int n, int h, int v, int chunk, float temp, float cap, int k,
		      uint64_t seed)
{
	bk_rng g;
	bk_rng_seed(&g, seed);
	float *head = xmalloc((size_t)v * h * sizeof(float));
	float *hs = xmalloc((size_t)n * h * sizeof(float)), *ht = xmalloc((size_t)n * h * sizeof(float));
	fill(&g, head, (size_t)v * h, 1);
	fill(&g, hs, (size_t)n * h, 1.5);
	fill(&g, ht, (size_t)n * h, 1.5);
	int32_t *so = xmalloc((size_t)n * sizeof(int32_t));
	int ns = 3;
	for (int r = 0; r < n; r++)
		so[r] = r * 7 % 5 == 1 ? 2 : r % 2; /* sample counts differ; 3 samples */
	bk_weight *w = ops->weight_upload(head, v, h);
	CHECK(w->rows == v && w->cols == h, "weight %dx%d", w->rows, w->cols);
	float *hs_d = dev(hs, (size_t)n * h * sizeof(float));
	float *ht_d = dev(ht, (size_t)n * h * sizeof(float));
	size_t nh = (size_t)n * h;
	float *d_ref = xmalloc(nh * sizeof(float)), *d_got = xmalloc(nh * sizeof(float));
	float *kl_ref = xmalloc((size_t)n * sizeof(float)), *kl_got = xmalloc((size_t)n * sizeof(float));
	float *dd = ops->alloc(nh * sizeof(float));

	/* exact, teacher hidden */
	double lr = bk_loss_kl_exact(hs, head, ht, NULL, so, n, ns, h, v, chunk, temp, cap, d_ref, kl_ref);
	double lg = ops->kl_exact(hs_d, w, ht_d, NULL, so, n, ns, chunk, temp, cap, dd, kl_got);
	ops->download(d_got, dd, nh * sizeof(float));
	CHECK(lr == lg && lr > 0, "exact (hidden) n=%d v=%d: loss %.17g vs %.17g", n, v, lg, lr);
	CHECK(same(d_ref, d_got, nh * sizeof(float)), "exact (hidden) n=%d v=%d: d_hidden differs", n, v);
	CHECK(same(kl_ref, kl_got, (size_t)n * sizeof(float)), "exact (hidden): row_kl differs");
	/* no gradient, no row_kl */
	double l0 = ops->kl_exact(hs_d, w, ht_d, NULL, so, n, ns, chunk, temp, cap, NULL, NULL);
	CHECK(l0 == lr, "exact without outputs: loss %.17g vs %.17g", l0, lr);

	/* teacher log-probs: the op's teacher_logprobs against bk_teacher_logprobs */
	size_t nv = (size_t)n * v;
	float *tl_ref = xmalloc(nv * sizeof(float)), *tl_got = xmalloc(nv * sizeof(float));
	float *tl_d = ops->alloc(nv * sizeof(float));
	bk_teacher_logprobs(ht, head, n, h, v, chunk, temp, cap, tl_ref);
	ops->teacher_logprobs(ht_d, w, n, chunk, temp, cap, tl_d);
	ops->download(tl_got, tl_d, nv * sizeof(float));
	CHECK(same(tl_ref, tl_got, nv * sizeof(float)), "teacher_logprobs n=%d v=%d differs", n, v);
	lr = bk_loss_kl_exact(hs, head, NULL, tl_ref, so, n, ns, h, v, chunk, temp, cap, d_ref, kl_ref);
	lg = ops->kl_exact(hs_d, w, NULL, tl_d, so, n, ns, chunk, temp, cap, dd, kl_got);
	ops->download(d_got, dd, nh * sizeof(float));
	CHECK(lr == lg && lr > 0, "exact (log-probs): loss %.17g vs %.17g", lg, lr);
	CHECK(same(d_ref, d_got, nh * sizeof(float)), "exact (log-probs): d_hidden differs");
	CHECK(same(kl_ref, kl_got, (size_t)n * sizeof(float)), "exact (log-probs): row_kl differs");

	/* teacher top-k, then the sparse loss on it */
	size_t nk = (size_t)n * k;
	int32_t *id_ref = xmalloc(nk * sizeof(int32_t)), *id_got = xmalloc(nk * sizeof(int32_t));
	float *lp_ref = xmalloc(nk * sizeof(float)), *lp_got = xmalloc(nk * sizeof(float));
	float *rs_ref = xmalloc((size_t)n * sizeof(float)), *rs_got = xmalloc((size_t)n * sizeof(float));
	int32_t *id_d = ops->alloc(nk * sizeof(int32_t));
	float *lp_d = ops->alloc(nk * sizeof(float)), *rs_d = ops->alloc((size_t)n * sizeof(float));
	bk_teacher_topk(ht, head, NULL, n, h, v, chunk, temp, cap, k, id_ref, lp_ref, rs_ref);
	ops->teacher_topk(ht_d, w, n, chunk, temp, cap, k, id_d, lp_d, rs_d);
	ops->download(id_got, id_d, nk * sizeof(int32_t));
	ops->download(lp_got, lp_d, nk * sizeof(float));
	ops->download(rs_got, rs_d, (size_t)n * sizeof(float));
	CHECK(same(id_ref, id_got, nk * sizeof(int32_t)), "teacher_topk k=%d: ids differ", k);
	CHECK(same(lp_ref, lp_got, nk * sizeof(float)), "teacher_topk k=%d: logp differ", k);
	CHECK(same(rs_ref, rs_got, (size_t)n * sizeof(float)), "teacher_topk k=%d: rest differs", k);
	lr = bk_loss_kl_topk(hs, head, id_ref, lp_ref, rs_ref, so, n, ns, h, v, k, chunk, temp, cap, d_ref,
			     kl_ref);
	lg = ops->kl_topk(hs_d, w, id_d, lp_d, rs_d, so, n, ns, k, chunk, temp, cap, dd, kl_got);
	ops->download(d_got, dd, nh * sizeof(float));
	CHECK(lr == lg && lr > 0, "top-k k=%d: loss %.17g vs %.17g", k, lg, lr);
	CHECK(same(d_ref, d_got, nh * sizeof(float)), "top-k k=%d: d_hidden differs", k);
	CHECK(same(kl_ref, kl_got, (size_t)n * sizeof(float)), "top-k k=%d: row_kl differs", k);

	/* the batch-invariant host table of bk-teach (host_rows.h) caps as loss.c does */
	if (ops == &bk_ops_host) {
		const bk_ops *ro = bk_ops_host_rows();
		ro->teacher_logprobs(ht_d, w, n, chunk, temp, cap, tl_d);
		ops->download(tl_got, tl_d, nv * sizeof(float));
		CHECK(bk_max_relerr(tl_got, tl_ref, nv, 1.0) < 1e-5,
		      "host rows teacher_logprobs cap %g: relerr %g", (double)cap,
		      bk_max_relerr(tl_got, tl_ref, nv, 1.0));
		ro->teacher_topk(ht_d, w, n, chunk, temp, cap, k, id_d, lp_d, rs_d);
		ops->download(id_got, id_d, nk * sizeof(int32_t));
		ops->download(lp_got, lp_d, nk * sizeof(float));
		CHECK(same(id_ref, id_got, nk * sizeof(int32_t)) &&
			      bk_max_relerr(lp_got, lp_ref, nk, 1.0) < 1e-5,
		      "host rows teacher_topk cap %g: ids or logp differ", (double)cap);
	}

	ops->weight_free(w);
	ops->free(hs_d), ops->free(ht_d), ops->free(dd), ops->free(tl_d);
	ops->free(id_d), ops->free(lp_d), ops->free(rs_d);
	free(head), free(hs), free(ht), free(so), free(d_ref), free(d_got), free(kl_ref);
	free(kl_got), free(tl_ref), free(tl_got), free(id_ref), free(id_got), free(lp_ref);
	free(lp_got), free(rs_ref), free(rs_got);
}

/* fn exits with status code, or (code < 0) is killed by signal -code (a BUG aborts);
 * run in a child, its stderr captured */
struct fn_box {
	void (*fn)(void);
};
static void call_box(void *a) { ((struct fn_box *)a)->fn(); }

static int exits_with(void (*fn)(void), int code)
{
	/* the harness's child runner: leak checks off in the child, so what die() leaves
	 * allocated is no sanitizer error; returns 128 + the signal of a killed child */
	struct fn_box b = {fn};
	char err[4096];
	int st = bk_run_child(call_box, &b, err, sizeof err);
	return code < 0 ? st == 128 - code : st == code;
}

static void bad_row(void)
{
	float src[4] = {1, 2, 3, 4}, dst[2];
	int32_t idx[1] = {2};
	ops->gather_rows(dst, src, idx, 1, 2, 2); /* row 2 of a [2,2] buffer */
}

static void bad_topk_id(void)
{
	float head[4] = {1, 2, 3, 4}, hs[1] = {1}, lp[1] = {-1}, rest[1] = {0.5f};
	int32_t ids[1] = {4}, so[1] = {0};
	bk_weight *w = ops->weight_upload(head, 4, 1);
	ops->kl_topk(hs, w, ids, lp, rest, so, 1, 1, 1, 2, 1.0f, 0.0f, NULL, NULL);
}

int main(void)
{
	bk_diag_init("test_loss_ops");
	test_rows();
	for (int c = 0; c < 2; c++) {
		float cap = c ? 2.0f : 0.0f; /* Gemma-2's final logit softcap, small enough to bend */
		test_loss(9, 6, 37, 8, 1.0f, cap, 5, 1);     /* V not a multiple of the chunk */
		test_loss(4, 16, 300, 4096, 2.0f, cap, 1, 2); /* one chunk, temperature 2, k = 1 */
		test_loss(3, 5, 23, 7, 0.7f, cap, 23, 3);    /* k = V */
	}
	CHECK(exits_with(bad_row, -SIGABRT), "a row index out of range does not BUG");
	CHECK(exits_with(bad_topk_id, BK_EXIT_FAIL), "a top-k id out of range does not die");
	return bk_test_done("test_loss_ops");
}
