/* test_teach.c - the teacher pass of bk-teach (gpu/teach.c) on models/stories260K:
 * (a) packed forwards against a shared prefix give the same teacher field as one plain
 * full-sequence forward per sequence + full logits (bk_model_logits) + a double-
 * precision softmax, for K = 8 and K = 0, at T = 1 and T = 0.7.  Two references:
 *   - the same forward on the row-wise host ops teach uses (gpu/host/host_rows.h): the
 *     logits are then the same floats, and the field may differ from the double
 *     softmax only by teach's own float roundings, a bound derived per row below
 *     (rows_bound); top-k ids identical;
 *   - the ordinary host twin (OpenBLAS sgemm, whose summation order depends on the
 *     matrix sizes and the CPU's kernel): within the a priori fp32 bound of
 *     blas_bound, which holds for any summation order;
 * the field is bit for bit the same for every token budget (1 sequence per forward,
 * all in one) and with or without the prefix (teach.h invariant 1);
 * (b) with K = V the sparse loss (bk_loss_kl_topk) equals the exact loss, and so
 * does its gradient. */
#include "tests/harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/host/host_rows.h"
#include "gpu/load.h"
#include "gpu/host/loss.h"
#include "gpu/teach.h"

#define NSEQ 7
#define U32 (1.0 / 16777216.0) /* 2^-24: the unit roundoff of fp32 */

/* Bound on |logp - reference| / max(1, |logp|) and on |rest - reference| when the
 * logits z are the same floats on both sides (the row-wise reference).  Teach rounds
 * u = z / T to float (|du| <= U32 |u|), sums exp in double (relative error ~1e-16,
 * negligible), so the log-sum-exp l moves by at most max|du| <= U32 max|u|, and logp =
 * (float)(u - l) adds one more rounding, U32 |logp|.  So |dlogp| <= U32 (|logp| +
 * 2 max|u|), and over max(1, |logp|): <= U32 (1 + 2 max|u|).  rest = exp(l_rest - l)
 * < 1 moves by the same relative amount plus one rounding.  Factor 2 for the double
 * parts and slack. */
static double rows_bound(double max_abs_u) { return 2 * U32 * (1 + 2 * max_abs_u); }

/* A priori bound for logits from another summation order (the sgemm forward): each
 * dot product or sum of n fp32 terms carries a relative error of at most
 * gamma_n = n U32 / (1 - n U32) of the sum of the terms' magnitudes (Higham, Accuracy
 * and Stability of Numerical Algorithms, 2nd ed., section 3.1), whatever the order.
 * Along one logit's dependency path in stories260K the sums have lengths, per layer:
 * RMSNorm H = 64, q/k/v H = 64, q.k D = 8, softmax and the weighted value sum <= 96
 * keys each, o_proj NH*D = 64, RMSNorm 64, gate/up 64, down I = 172: 692; times L = 5,
 * plus the final RMSNorm 64 and the LM head 64: N = 3588.  Treating the network as
 * 1-Lipschitz in the relative error of its activations (RMSNorm renormalises every
 * layer's input), the logits' error is at most gamma_N times the largest logit
 * magnitude, on both sides of the comparison: |dz| <= 2 gamma_N max|z|; logp moves by
 * at most twice that over T.  This is a worst-case bound (about 1e-3 here, against a
 * typical 1e-5); the row-wise reference above is the sharp check. */
#define BLAS_SUM_LENGTH 3588
static double blas_bound(double max_abs_u)
{
	double g = BLAS_SUM_LENGTH * U32 / (1 - BLAS_SUM_LENGTH * U32);
	return 4 * g * max_abs_u + rows_bound(max_abs_u);
}

typedef struct {
	int32_t ids[96]; /* prompt then resp */
	int a, n;
} seq_buf;

/* Prompts share a 14-token "system prompt" after BOS, except sequence 5 (other
 * prefix) and sequence 6 (a prompt shorter than the prefix); sequence 3 has an empty
 * response. */
static void make_seqs(seq_buf *sb, bk_teach_seq *sq, int V)
{
	bk_rng rng;
	bk_rng_seed(&rng, 42);
	int32_t sys[14];
	for (int i = 0; i < 14; i++)
		sys[i] = 3 + (int32_t)bk_rng_below(&rng, (uint64_t)V - 3);
	for (int s = 0; s < NSEQ; s++) {
		seq_buf *b = &sb[s];
		int user = 2 + (int)bk_rng_below(&rng, 9), k = 0;
		b->ids[k++] = 1;
		if (s == 6) {
			for (int i = 0; i < 5; i++)
				b->ids[k++] = sys[i];
		} else {
			for (int i = 0; i < 14; i++)
				b->ids[k++] = s == 5 && i == 3 ? (sys[i] + 1) % V : sys[i];
			for (int i = 0; i < user; i++)
				b->ids[k++] = 3 + (int32_t)bk_rng_below(&rng, (uint64_t)V - 3);
		}
		b->a = k;
		b->n = s == 3 ? 0 : 4 + (int)bk_rng_below(&rng, 14);
		for (int i = 0; i < b->n; i++)
			b->ids[k++] = 3 + (int32_t)bk_rng_below(&rng, (uint64_t)V - 3);
		sq[s] = (bk_teach_seq){b->ids, b->a, b->ids + b->a, b->n};
	}
}

/* Reference: log_softmax(logits / T) in double at the response rows of one sequence
 * run alone from position 0.  out: [n,V]; umax[r] = max |logit / T| of row r. */
static void reference(const bk_model *m, const bk_teach_seq *q, float temperature, double *out,
		      double *umax)
{
	const bk_ops *ops = m->ops;
	int V = m->cfg.V, H = m->cfg.H, T = q->a + q->n;
	int32_t ids[128], pos[128], cu[2] = {0, T};
	for (int t = 0; t < T; t++) {
		ids[t] = t < q->a ? q->prompt[t] : q->resp[t - q->a];
		pos[t] = t;
	}
	bk_acts *acts = bk_acts_create(m, T, 0);
	float *hid = ops->alloc((size_t)T * H * sizeof(float));
	float *lg = ops->alloc((size_t)T * V * sizeof(float));
	float *hl = xmalloc((size_t)T * V * sizeof(float));
	bk_batch b = {.T = T, .S = 1, .ids = ids, .pos = pos, .cu_seqlens = cu};
	bk_model_forward(m, NULL, &b, NULL, acts, hid);
	bk_model_logits(m, hid, lg, T);
	ops->download(hl, lg, (size_t)T * V * sizeof(float));
	for (int r = 0; r < q->n; r++) {
		const float *row = hl + (size_t)(q->a - 1 + r) * V;
		double mx = -INFINITY, s = 0;
		umax[r] = 0;
		for (int v = 0; v < V; v++) {
			mx = fmax(mx, row[v] / (double)temperature);
			umax[r] = fmax(umax[r], fabs(row[v] / (double)temperature));
		}
		for (int v = 0; v < V; v++)
			s += exp(row[v] / (double)temperature - mx);
		for (int v = 0; v < V; v++)
			out[(size_t)r * V + v] = row[v] / (double)temperature - mx - log(s);
	}
	free(hl);
	ops->free(lg);
	ops->free(hid);
	bk_acts_free(m, acts);
}

typedef struct {
	double v;
	int id;
} entry;
static int cmp_entry(const void *a, const void *b)
{
	const entry *x = a, *y = b;
	if (x->v != y->v)
		return x->v > y->v ? -1 : 1;
	return x->id - y->id;
}

/* bound(max |u| of a row) is the allowed error of that row (rows_bound, blas_bound);
 * reports the worst ratio error / bound */
static void check_against_reference(const bk_model *m, const bk_teach_seq *sq,
				    const bk_teacher *out, int K, float temperature,
				    double (*bound)(double), const char *what)
{
	int V = m->cfg.V;
	double worst = 0, max_logp = 0, max_rest = 0;
	int bad_ids = 0;
	entry *e = xmalloc((size_t)V * sizeof(*e));
	for (int s = 0; s < NSEQ; s++) {
		const bk_teacher *o = &out[s];
		CHECK(o->n == sq[s].n && o->k == K && o->v == V &&
			      o->temperature == temperature,
		      "%s: seq %d: field n %d k %d v %d T %g", what, s, o->n, o->k, o->v,
		      (double)o->temperature);
		if (o->n != sq[s].n || !sq[s].n)
			continue;
		double *ref = xmalloc((size_t)sq[s].n * V * sizeof(double));
		double *umax = xmalloc((size_t)sq[s].n * sizeof(double));
		reference(m, &sq[s], temperature, ref, umax);
		for (int r = 0; r < sq[s].n; r++) {
			const double *lr = ref + (size_t)r * V;
			double b = bound(umax[r]), dl = 0, dr = 0;
			if (!K) {
				/* and the row exp-sums to 1: |sum - 1| <= sum_v p_v |dlogp_v|
				 * <= b sum_v p_v max(1, |logp_v|) to first order */
				double sum = 0, wsum = 0;
				for (int v = 0; v < V; v++) {
					double lp = o->logp[(size_t)r * V + v], p = exp(lp);
					dl = fmax(dl, fabs(lp - lr[v]) / fmax(1, fabs(lr[v])));
					sum += p;
					wsum += p * fmax(1, fabs(lp));
				}
				worst = fmax(worst, fabs(sum - 1) / (b * wsum));
			} else {
				for (int v = 0; v < V; v++)
					e[v] = (entry){lr[v], v};
				qsort(e, (size_t)V, sizeof(*e), cmp_entry);
				double rest = 0;
				for (int v = K; v < V; v++)
					rest += exp(e[v].v);
				for (int i = 0; i < K; i++) {
					bad_ids += o->ids[(size_t)r * K + i] != e[i].id;
					dl = fmax(dl, fabs(o->logp[(size_t)r * K + i] - e[i].v) /
							      fmax(1, fabs(e[i].v)));
				}
				dr = fabs(o->rest[r] - rest);
			}
			max_logp = fmax(max_logp, dl);
			max_rest = fmax(max_rest, dr);
			worst = fmax(worst, fmax(dl, dr) / b);
		}
		free(ref), free(umax);
	}
	free(e);
	CHECK(bad_ids == 0, "%s: %d top-k ids differ from the reference", what, bad_ids);
	CHECK(worst <= 1, "%s: max |logp - reference| = %.3g, |rest - reference| %.3g: %.3g of "
			  "the bound",
	      what, max_logp, max_rest, worst);
	printf("%-40s max|dlogp| %.2e  max|drest| %.2e  %.3f of the bound  ids differing %d\n",
	       what, max_logp, max_rest, worst, bad_ids);
}

static double max_field_diff(const bk_teacher *a, const bk_teacher *b, int *ids_differ)
{
	double d = 0;
	for (int s = 0; s < NSEQ; s++) {
		size_t per = a[s].k ? (size_t)a[s].k : (size_t)a[s].v;
		BUG_ON(a[s].n != b[s].n);
		for (size_t i = 0; i < (size_t)a[s].n * per; i++) {
			d = fmax(d, fabs(a[s].logp[i] - b[s].logp[i]) / fmax(1, fabs(b[s].logp[i])));
			if (a[s].k)
				*ids_differ += a[s].ids[i] != b[s].ids[i];
		}
		for (int i = 0; a[s].k && i < a[s].n; i++)
			d = fmax(d, fabs(a[s].rest[i] - b[s].rest[i]));
	}
	return d;
}

static void run(const bk_model *m, const float *head, const bk_teach_seq *sq, int budget,
		int prefix, int K, float temperature, bk_teacher *out, int *P)
{
	bk_teach *t = bk_teach_create(m, head, budget, K, temperature, 100 /* odd chunks */);
	int p = prefix ? bk_teach_prefix_from(t, sq, 5) : 0;
	if (P)
		*P = p;
	bk_teach_run(t, sq, NSEQ, out);
	const bk_teach_stats *st = bk_teach_stats_get(t);
	if (prefix) /* sequences 5 and 6 cannot use the prefix; 3 has no rows */
		CHECK(st->with_prefix == 4 && st->full == 2,
		      "prefix used by %llu, full %llu", (unsigned long long)st->with_prefix,
		      (unsigned long long)st->full);
	bk_teach_free(t);
}

static void test_against_reference(const bk_model *m, const float *head, const bk_teach_seq *sq)
{
	int P = 0;
	/* the reference on the row-wise ops teach runs on (same weights) */
	bk_model rm = *m;
	rm.ops = bk_ops_host_rows();
	bk_teacher a[NSEQ] = {0}, b[NSEQ] = {0};
	/* only the prefix-sharing sequences decide the prefix: 0..4 share 15 tokens */
	bk_teach *t = bk_teach_create(m, head, 40, 8, 1.0f, 100);
	P = bk_teach_prefix_from(t, sq, 5);
	CHECK(P == 15, "shared prefix of the first five prompts: %d tokens, want 15", P);
	bk_teach_run(t, sq, NSEQ, a);
	const bk_teach_stats *st = bk_teach_stats_get(t);
	CHECK(st->with_prefix == 4 && st->full == 2 && st->forwards >= 3,
	      "prefix used by %llu, full %llu, forwards %llu", (unsigned long long)st->with_prefix,
	      (unsigned long long)st->full, (unsigned long long)st->forwards);
	bk_teach_free(t);
	check_against_reference(&rm, sq, a, 8, 1.0f, rows_bound, "K=8 T=1 prefix budget 40, rows");
	check_against_reference(m, sq, a, 8, 1.0f, blas_bound, "K=8 T=1 prefix budget 40, sgemm");

	for (int K = 8; K >= 0; K -= 8) {
		float temp = K ? 0.7f : 1.0f;
		char what[64];
		run(m, head, sq, 40, 1, K, temp, a, NULL);
		snprintf(what, sizeof what, "K=%d T=%g prefix budget 40, rows", K, (double)temp);
		check_against_reference(&rm, sq, a, K, temp, rows_bound, what);
		snprintf(what, sizeof what, "K=%d T=%g prefix budget 40, sgemm", K, (double)temp);
		check_against_reference(m, sq, a, K, temp, blas_bound, what);
		/* the token budget (1: one sequence per forward; 4096: all in one) and the
		 * prefix change no bit of the field */
		int budgets[] = {1, 4096};
		for (int i = 0; i < 2; i++)
			for (int pre = 0; pre < 2; pre++) {
				int differ = 0;
				run(m, head, sq, budgets[i], pre, K, temp, b, NULL);
				double d = max_field_diff(a, b, &differ);
				CHECK(d == 0 && differ == 0,
				      "K=%d budget %d prefix %d: max diff %.3g, %d ids differ", K,
				      budgets[i], pre, d, differ);
				printf("K=%d T=%g budget %-4d prefix %d: max diff to budget 40 %.2e\n", K,
				       (double)temp, budgets[i], pre, d);
			}
	}
	for (int s = 0; s < NSEQ; s++)
		bk_teacher_free(&a[s]), bk_teacher_free(&b[s]);
}

/* (b) K = V: the sparse loss is the exact loss (student = base + a random LoRA on the
 * same sequences without the first 10 prefix tokens, so the two sides differ). */
static void test_full_k(const bk_model *m, const float *head, const bk_teach_seq *sq)
{
	const bk_ops *ops = m->ops;
	int V = m->cfg.V, H = m->cfg.H;
	bk_teacher tk[NSEQ] = {0}, t0[NSEQ] = {0};
	run(m, head, sq, 64, 1, V, 1.3f, tk, NULL);
	run(m, head, sq, 64, 1, 0, 1.3f, t0, NULL);

	bk_lora *lo = bk_lora_create(m, 4, 8.0f, 0.0f, BK_LORA_ALL);
	float *flat = xmalloc(lo->n_flat * sizeof(float));
	bk_rng rng;
	bk_rng_seed(&rng, 7);
	for (size_t i = 0; i < lo->n_flat; i++)
		flat[i] = (float)(bk_rng_uniform(&rng) - 0.5) * 0.2f;
	ops->upload(lo->flat, flat, lo->n_flat * sizeof(float));
	free(flat);

	/* student rows: sequence s without prompt tokens 1..10, packed in one forward */
	BK_VEC(int32_t) ids = {0}, pos = {0}, cu = {0}, sample = {0};
	BK_VEC(int) last = {0};
	bk_vec_push(&cu, 0);
	int N = 0;
	for (int s = 0; s < NSEQ; s++) {
		const bk_teach_seq *q = &sq[s];
		if (!q->n)
			continue;
		int skip = q->a > 11 ? 10 : 0, len = q->a - skip + q->n - 1;
		for (int j = 0; j < len; j++) {
			int p = j ? j + skip : 0;
			bk_vec_push(&ids, p < q->a ? q->prompt[p] : q->resp[p - q->a]);
			bk_vec_push(&pos, j);
		}
		int32_t end = cu.v[cu.n - 1] + len;
		bk_vec_push(&cu, end);
		bk_vec_push(&last, s);
		for (int r = 0; r < q->n; r++)
			bk_vec_push(&sample, s);
		N += q->n;
	}
	int T = cu.v[cu.n - 1], S = (int)cu.n - 1;
	bk_acts *acts = bk_acts_create(m, T, 4);
	float *hid = ops->alloc((size_t)T * H * sizeof(float));
	bk_batch b = {.T = T, .S = S, .ids = ids.v, .pos = pos.v, .cu_seqlens = cu.v};
	bk_model_forward(m, lo, &b, NULL, acts, hid);
	float *rows = xmalloc((size_t)N * H * sizeof(float));
	int32_t *kid = xmalloc((size_t)N * V * sizeof(int32_t));
	float *klp = xmalloc((size_t)N * V * sizeof(float)), *krest = xmalloc((size_t)N * sizeof(float));
	float *flp = xmalloc((size_t)N * V * sizeof(float));
	int r = 0;
	for (int i = 0; i < S; i++) {
		int s = last.v[i], n = sq[s].n;
		ops->download(rows + (size_t)r * H, hid + (size_t)(cu.v[i + 1] - n) * H,
			      (size_t)n * H * sizeof(float));
		memcpy(kid + (size_t)r * V, tk[s].ids, (size_t)n * V * sizeof(int32_t));
		memcpy(klp + (size_t)r * V, tk[s].logp, (size_t)n * V * sizeof(float));
		memcpy(krest + r, tk[s].rest, (size_t)n * sizeof(float));
		memcpy(flp + (size_t)r * V, t0[s].logp, (size_t)n * V * sizeof(float));
		r += n;
	}
	float *g1 = xmalloc((size_t)N * H * sizeof(float)), *g2 = xmalloc((size_t)N * H * sizeof(float));
	double l_topk = bk_loss_kl_topk(rows, head, kid, klp, krest, sample.v, N, NSEQ, H, V, V,
					128, 1.3f, 0.0f, g1, NULL);
	double l_exact = bk_loss_kl_exact(rows, head, NULL, flp, sample.v, N, NSEQ, H, V, 128,
					  1.3f, 0.0f, g2, NULL);
	double e = bk_relerr(l_topk, l_exact, 1e-12), eg = bk_max_relerr(g1, g2, (size_t)N * H, 1e-12);
	printf("K=V: sparse loss %.8f exact loss %.8f relerr %.2e, gradient relerr %.2e\n", l_topk,
	       l_exact, e, eg);
	CHECK(l_exact > 1e-3, "the student differs from the teacher (exact loss %g)", l_exact);
	CHECK(e < 1e-5, "K=V sparse loss %.8f vs exact %.8f", l_topk, l_exact);
	CHECK(eg < 1e-4, "K=V gradient relerr %.3g", eg);
	double worst_rest = 0;
	for (int i = 0; i < N; i++)
		worst_rest = fmax(worst_rest, fabs(krest[i]));
	CHECK(worst_rest < 1e-6, "K=V rest mass %.3g", worst_rest);

	free(g1), free(g2), free(rows), free(kid), free(klp), free(krest), free(flp);
	free(ids.v), free(pos.v), free(cu.v), free(sample.v), free(last.v);
	ops->free(hid);
	bk_acts_free(m, acts);
	bk_lora_free(m, lo);
	for (int s = 0; s < NSEQ; s++)
		bk_teacher_free(&tk[s]), bk_teacher_free(&t0[s]);
}

int main(void)
{
	bk_loaded_model lm = bk_model_load(&bk_ops_host, "models/stories260K");
	float *owned;
	const float *head = bk_teach_lm_head(lm.model, "models/stories260K", &owned);
	/* the host twin's LM head equals the checkpoint's (the path other devices take) */
	bk_st *st = bk_st_open("models/stories260K");
	int64_t shape[2] = {lm.model->cfg.V, lm.model->cfg.H};
	float *file_head = xmalloc((size_t)shape[0] * shape[1] * sizeof(float));
	bk_st_read_f32(st, "model.embed_tokens.weight", 2, shape, file_head);
	CHECK(!memcmp(head, file_head, (size_t)shape[0] * shape[1] * sizeof(float)),
	      "LM head differs from model.embed_tokens.weight");
	free(file_head);
	bk_st_close(st);

	seq_buf sb[NSEQ];
	bk_teach_seq sq[NSEQ];
	make_seqs(sb, sq, lm.model->cfg.V);
	test_against_reference(lm.model, head, sq);
	test_full_k(lm.model, head, sq);
	free(owned);
	bk_model_unload(&lm);
	return bk_test_done("test_teach");
}
