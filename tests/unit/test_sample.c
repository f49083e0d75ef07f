/* test_sample.c - gpu/sample.c: the nucleus equals a brute-force HF top-k then top-p
 * (full sort; every token >= the K-th largest; cumulative mass before a token < top_p of
 * the kept mass) over random, peaked, flat and tied logits and K from 1 to past V;
 * hand-made top-k cases (top-k shrinks the nucleus, HF's renormalisation over the kept
 * tokens, ties at the K-th, K >= V changes nothing, K 1 is greedy);
 * temperature scaling of the probabilities; greedy ties go to the lowest id; the
 * empirical distribution of 200000 draws matches the renormalised nucleus (chi-square)
 * and never leaves it; the counter RNG is a pure function of (key, counter). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/sample.h"
#include "tests/harness.h"

static double *bf_p;
static int cmp_bf(const void *a, const void *b)
{
	int i = *(const int *)a, j = *(const int *)b;
	if (bf_p[i] != bf_p[j])
		return bf_p[i] > bf_p[j] ? -1 : 1;
	return i - j;
}

/* brute force: ids of the nucleus in order; returns its size.  top_k K (0: off): the
 * tokens >= the K-th largest stay, the rest go; then top-p over those, its bound top_p of
 * their mass (HF's top_p over probabilities renormalised over them, up to rounding) */
static int brute_nucleus(const float *lg, int V, double T, int top_k, double top_p, int *ids,
			 double *p)
{
	double mx = -INFINITY, s = 0;
	for (int i = 0; i < V; i++)
		mx = lg[i] > mx ? lg[i] : mx;
	for (int i = 0; i < V; i++)
		s += p[i] = exp((lg[i] - mx) / T);
	for (int i = 0; i < V; i++) {
		p[i] /= s;
		ids[i] = i;
	}
	bf_p = p;
	qsort(ids, (size_t)V, sizeof(int), cmp_bf);
	double cum = 0, lim = top_p;
	int k = 0, n = V;
	if (top_k > 0 && top_k < V) {
		double kept = 0;
		for (n = 0; n < V && p[ids[n]] >= p[ids[top_k - 1]]; n++)
			kept += p[ids[n]];
		if (n < V)
			lim = top_p * kept;
	}
	if (top_p >= 1) /* HF adds no top-p warper then: every kept token stays */
		return n;
	while (k < n && (k == 0 || cum < lim))
		cum += p[ids[k++]];
	return k;
}

static void check_nucleus(void)
{
	bk_rng rng;
	bk_rng_seed(&rng, 1);
	static const int Vs[] = { 1, 2, 7, 50, 512, 4099 };
	static const double tops[] = { 0.05, 0.5, 0.9, 0.95, 0.999, 1.0 };
	int cases = 0, bad = 0;
	for (size_t vi = 0; vi < sizeof(Vs) / sizeof(Vs[0]); vi++) {
		int V = Vs[vi];
		float *lg = xmalloc((size_t)V * sizeof(float));
		int *want = xmalloc((size_t)V * sizeof(int));
		double *p = xmalloc((size_t)V * sizeof(double)), *probs = xmalloc((size_t)V * sizeof(double));
		int32_t *got = xmalloc((size_t)V * sizeof(int32_t));
		bk_sample_work *w = bk_sample_work_new(V);
		for (int kind = 0; kind < 4; kind++) {
			for (int i = 0; i < V; i++) {
				double u = bk_rng_uniform(&rng);
				lg[i] = kind == 0 ? (float)(4 * u - 2)          /* mild */
				      : kind == 1 ? (float)(30 * u * u * u)    /* peaked */
				      : kind == 2 ? 0.25f                      /* flat: all tied */
						  : (float)(int)(6 * u);       /* few tied levels */
			}
			const int topks[] = { 0, 1, 3, 50, V - 1, V, V + 5 };
			enum { NK = sizeof(topks) / sizeof(topks[0]) };
			for (size_t c = 0; c < NK * sizeof(tops) / sizeof(tops[0]); c++) {
				size_t ti = c / NK, ki = c % NK;
				for (float T = 0.5f; T < 2.1f; T += 0.7f) {
					int K = topks[ki] < 0 ? 0 : topks[ki];
					int k = brute_nucleus(lg, V, T, K, (float)tops[ti], want, p);
					int n = bk_sample_nucleus(lg, V, T, K, (float)tops[ti], w, got,
								  probs);
					cases++;
					int ok = n == k;
					for (int i = 0; ok && i < k; i++)
						ok = got[i] == want[i];
					double mass = 0;
					for (int i = 0; ok && i < k; i++)
						mass += p[want[i]];
					for (int i = 0; ok && i < k; i++)
						ok = fabs(probs[i] - p[want[i]] / mass) < 1e-12;
					if (!ok && bad++ < 5)
						CHECK(ok, "V %d kind %d top_k %d top_p %g T %g: nucleus of %d, want %d",
						      V, kind, K, tops[ti], T, n, k);
				}
			}
		}
		bk_sample_work_free(w);
		free(lg);
		free(want);
		free(p);
		free(probs);
		free(got);
	}
	CHECK(bad == 0, "%d of %d nucleus cases differ from the brute force", bad, cases);
	printf("nucleus: %d cases against the brute force\n", cases);
}

static void check_temperature(void)
{
	float lg[5] = { 1.0f, 2.0f, 0.5f, -1.0f, 3.0f };
	bk_sample_work *w = bk_sample_work_new(5);
	int32_t ids[5];
	double pr[5];
	for (double T = 0.25; T <= 4; T *= 2) {
		int n = bk_sample_nucleus(lg, 5, (float)T, 0, 1.0f, w, ids, pr);
		CHECK(n == 5, "top_p 1 keeps %d of 5", n);
		double z = 0;
		for (int i = 0; i < 5; i++)
			z += exp(lg[i] / T);
		for (int i = 0; i < n; i++)
			CHECK(fabs(pr[i] - exp(lg[ids[i]] / T) / z) < 1e-12,
			      "T %g: p(%d) = %g, want %g", T, ids[i], pr[i], exp(lg[ids[i]] / T) / z);
		CHECK(ids[0] == 4 && ids[1] == 1 && ids[4] == 3, "order %d %d .. %d", ids[0], ids[1],
		      ids[4]);
	}
	/* a lower temperature sharpens: p(best) grows */
	bk_sample_nucleus(lg, 5, 0.5f, 0, 1.0f, w, ids, pr);
	double sharp = pr[0];
	bk_sample_nucleus(lg, 5, 2.0f, 0, 1.0f, w, ids, pr);
	CHECK(sharp > pr[0], "p(best) at T 0.5 %g <= at T 2 %g", sharp, pr[0]);
	/* a tiny top_p keeps the single best token */
	CHECK(bk_sample_nucleus(lg, 5, 1.0f, 0, 1e-6f, w, ids, NULL) == 1 && ids[0] == 4,
	      "top_p 1e-6 keeps more than the best token");
	bk_sample_work_free(w);
}

static void check_greedy(void)
{
	float lg[9] = { 0, 1, 2, 5, 1, 5, -3, 5, 4 };
	CHECK(bk_sample_argmax(lg, 9) == 3, "argmax of a tie is %d, want 3",
	      bk_sample_argmax(lg, 9));
	bk_sample_work *w = bk_sample_work_new(9);
	bk_sample_params g = { 0, 0.9f, 0 };
	for (double u = 0; u < 1; u += 0.125)
		CHECK(bk_sample_token(lg, 9, &g, u, w) == 3, "greedy depends on u = %g", u);
	/* sampling among the ties: all three tied tokens come out, nothing else at top_p 0.5 */
	bk_sample_params s = { 1.0f, 0.5f, 0 };
	int seen[9] = { 0 };
	for (int i = 0; i < 3000; i++)
		seen[bk_sample_token(lg, 9, &s, bk_crng_uniform(9, (uint64_t)i), w)]++;
	CHECK(seen[3] > 0 && seen[5] > 0 && seen[7] == 0 && seen[8] == 0,
	      "top_p 0.5 over three tied best: counts 3:%d 5:%d 7:%d 8:%d", seen[3], seen[5],
	      seen[7], seen[8]);
	bk_sample_work_free(w);
}

/* hand-made top-k cases */
static void check_topk(void)
{
	bk_sample_work *w = bk_sample_work_new(16);
	int32_t ids[16], ids2[16];
	double pr[16], pr2[16];
	/* p = 0.4 0.3 0.2 0.1 (T 1): top-p 0.75 alone keeps 3; top-k 3 keeps ids 0-2 (mass
	 * 0.9) and top-p then needs 0.75 of 0.9 = 0.675: 2 tokens (HF renormalises) */
	float lg[4] = { logf(0.4f), logf(0.3f), logf(0.2f), logf(0.1f) };
	CHECK(bk_sample_nucleus(lg, 4, 1.0f, 0, 0.75f, w, ids, NULL) == 3,
	      "top-p 0.75 without top-k: want 3 tokens");
	int n = bk_sample_nucleus(lg, 4, 1.0f, 3, 0.75f, w, ids, pr);
	CHECK(n == 2 && ids[0] == 0 && ids[1] == 1 && fabs(pr[0] - 4.0 / 7) < 1e-6,
	      "top-k 3 then top-p 0.75: %d tokens (want 2: ids 0 1)", n);
	/* top-k below the nucleus: top-k 2 of a flat-ish row that top-p 0.9 keeps whole */
	n = bk_sample_nucleus(lg, 4, 1.0f, 2, 0.9f, w, ids, pr);
	CHECK(n == 2 && ids[0] == 0 && ids[1] == 1, "top-k 2, top-p 0.9: %d tokens", n);
	n = bk_sample_nucleus(lg, 4, 1.0f, 2, 1.0f, w, ids, pr);
	CHECK(n == 2 && fabs(pr[0] - 4.0 / 7) < 1e-6 && fabs(pr[1] - 3.0 / 7) < 1e-6,
	      "top-k 2, top-p 1: %d tokens, p %g %g", n, pr[0], pr[1]);
	/* ties at the K-th largest: all stay (HF keeps every score >= the K-th) */
	float tl[7] = { 1, 3, 5, 3, 0, 3, -2 };
	n = bk_sample_nucleus(tl, 7, 1.0f, 2, 1.0f, w, ids, NULL);
	CHECK(n == 4 && ids[0] == 2 && ids[1] == 1 && ids[2] == 3 && ids[3] == 5,
	      "top-k 2 with a three-way tie at the 2nd: %d tokens (want 2 1 3 5)", n);
	CHECK(bk_sample_nucleus(tl, 7, 1.0f, 4, 1.0f, w, ids, NULL) == 4 &&
		      bk_sample_nucleus(tl, 7, 1.0f, 5, 1.0f, w, ids, NULL) == 5 &&
		      bk_sample_nucleus(tl, 7, 1.0f, 1, 1.0f, w, ids, NULL) == 1,
	      "top-k 4, 5, 1 with ties below");
	bk_sample_params tie1 = { 1.0f, 1.0f, 2 };
	int seen[7] = { 0 };
	for (int i = 0; i < 4000; i++)
		seen[bk_sample_token(tl, 7, &tie1, bk_crng_uniform(77, (uint64_t)i), w)]++;
	CHECK(seen[1] && seen[3] && seen[5] && seen[2] && !seen[0] && !seen[4] && !seen[6],
	      "top-k 2 draws: %d %d %d %d %d %d %d", seen[0], seen[1], seen[2], seen[3], seen[4],
	      seen[5], seen[6]);
	/* K >= V is no top-k, bit for bit; K 1 is greedy (a unique best) */
	bk_rng rng;
	bk_rng_seed(&rng, 9);
	float rl[16];
	for (int r = 0; r < 50; r++) {
		for (int i = 0; i < 16; i++)
			rl[i] = (float)(4 * bk_rng_uniform(&rng) - 2);
		int32_t best = bk_sample_argmax(rl, 16);
		for (int kk = 16; kk <= 17; kk++) {
			int a = bk_sample_nucleus(rl, 16, 0.8f, 0, 0.9f, w, ids, pr);
			int b = bk_sample_nucleus(rl, 16, 0.8f, kk, 0.9f, w, ids2, pr2);
			CHECK(a == b && !memcmp(ids, ids2, (size_t)a * sizeof(*ids)) &&
				      !memcmp(pr, pr2, (size_t)a * sizeof(*pr)),
			      "row %d: top-k %d differs from no top-k", r, kk);
		}
		for (int i = 0; i < 20; i++) {
			double u = bk_crng_uniform(r, (uint64_t)i);
			bk_sample_params off = { 0.8f, 0.9f, 0 }, all = { 0.8f, 0.9f, 16 },
					 one = { 0.8f, 0.9f, 1 }, one1 = { 1.5f, 1.0f, 1 };
			CHECK(bk_sample_token(rl, 16, &off, u, w) == bk_sample_token(rl, 16, &all, u, w),
			      "row %d u %g: top-k 16 of 16 draws another token", r, u);
			CHECK(bk_sample_token(rl, 16, &one, u, w) == best &&
				      bk_sample_token(rl, 16, &one1, u, w) == best,
			      "row %d u %g: top-k 1 is not the argmax %d", r, u, best);
		}
	}
	bk_sample_work_free(w);
}

static void check_distribution(void)
{
	enum { V = 20, N = 200000 };
	float lg[V];
	bk_rng rng;
	bk_rng_seed(&rng, 5);
	for (int i = 0; i < V; i++)
		lg[i] = (float)(3 * bk_rng_uniform(&rng));
	bk_sample_work *w = bk_sample_work_new(V);
	int32_t ids[V];
	double pr[V];
	bk_sample_params sp = { 0.8f, 0.9f, 0 };
	int k = bk_sample_nucleus(lg, V, sp.temperature, sp.top_k, sp.top_p, w, ids, pr);
	CHECK(k > 2 && k < V, "nucleus of %d tokens (test wants a real cut)", k);
	long cnt[V] = { 0 };
	uint64_t key = bk_crng_key(3, 1, 4, 1);
	for (int i = 0; i < N; i++)
		cnt[bk_sample_token(lg, V, &sp, bk_crng_uniform(key, (uint64_t)i), w)]++;
	double chi = 0;
	long inside = 0;
	for (int i = 0; i < k; i++) {
		double e = pr[i] * N;
		chi += (cnt[ids[i]] - e) * (cnt[ids[i]] - e) / e;
		inside += cnt[ids[i]];
	}
	CHECK(inside == N, "%ld of %d draws fell outside the nucleus", N - inside, N);
	/* chi-square with k-1 degrees of freedom: mean k-1, sd sqrt(2(k-1)); 6 sd */
	double bound = (k - 1) + 6 * sqrt(2.0 * (k - 1));
	CHECK(chi < bound, "chi-square %.1f over %d tokens exceeds %.1f", chi, k, bound);
	printf("distribution: nucleus %d of %d, chi-square %.1f (bound %.1f)\n", k, V, chi, bound);
	/* and the full distribution without truncation */
	bk_sample_params full = { 1.3f, 1.0f, 0 };
	k = bk_sample_nucleus(lg, V, full.temperature, full.top_k, full.top_p, w, ids, pr);
	memset(cnt, 0, sizeof(cnt));
	for (int i = 0; i < N; i++)
		cnt[bk_sample_token(lg, V, &full, bk_crng_uniform(key + 1, (uint64_t)i), w)]++;
	chi = 0;
	for (int i = 0; i < k; i++)
		chi += (cnt[ids[i]] - pr[i] * N) * (cnt[ids[i]] - pr[i] * N) / (pr[i] * N);
	bound = (k - 1) + 6 * sqrt(2.0 * (k - 1));
	CHECK(k == V && chi < bound, "untruncated: %d tokens, chi-square %.1f > %.1f", k, chi, bound);
	/* top-k 4 then top-p 0.9: the draws follow the renormalised 4 (or fewer) */
	bk_sample_params tk = { 1.0f, 0.9f, 4 };
	k = bk_sample_nucleus(lg, V, tk.temperature, tk.top_k, tk.top_p, w, ids, pr);
	memset(cnt, 0, sizeof(cnt));
	for (int i = 0; i < N; i++)
		cnt[bk_sample_token(lg, V, &tk, bk_crng_uniform(key + 2, (uint64_t)i), w)]++;
	chi = 0;
	inside = 0;
	for (int i = 0; i < k; i++) {
		chi += (cnt[ids[i]] - pr[i] * N) * (cnt[ids[i]] - pr[i] * N) / (pr[i] * N);
		inside += cnt[ids[i]];
	}
	bound = (k - 1) + 6 * sqrt(2.0 * (k - 1));
	CHECK(k >= 2 && k <= 4 && inside == N && chi < bound,
	      "top-k 4: %d tokens, %ld draws outside, chi-square %.1f > %.1f", k, N - inside, chi,
	      bound);
	bk_sample_work_free(w);
}

static void check_rng(void)
{
	uint64_t k1 = bk_crng_key(0, 11, 2, 1), k2 = bk_crng_key(0, 11, 2, 1);
	CHECK(k1 == k2, "the same words give other keys");
	CHECK(bk_crng_key(0, 11, 2, 0) != k1 && bk_crng_key(0, 11, 3, 1) != k1 &&
		      bk_crng_key(1, 11, 2, 1) != k1 && bk_crng_key(0, 12, 2, 1) != k1,
	      "a key ignores one of its words");
	/* pure function: any order of evaluation gives the same values */
	double fwd[64], back[64];
	for (int i = 0; i < 64; i++)
		fwd[i] = bk_crng_uniform(k1, (uint64_t)i);
	for (int i = 63; i >= 0; i--)
		back[i] = bk_crng_uniform(k1, (uint64_t)i);
	CHECK(!memcmp(fwd, back, sizeof(fwd)), "bk_crng_uniform depends on call order");
	int equal = 0;
	for (int i = 0; i < 64; i++) {
		CHECK(fwd[i] >= 0 && fwd[i] < 1, "u = %g outside [0,1)", fwd[i]);
		equal += fwd[i] == bk_crng_uniform(k1 ^ 1, (uint64_t)i);
	}
	CHECK(equal == 0, "two keys share %d of 64 values", equal);
	/* a draw is a pure function of (logits, params, u) */
	float lg[6] = { 0.1f, 0.2f, 0.3f, 1.0f, 0.0f, -0.5f };
	bk_sample_work *w = bk_sample_work_new(6);
	bk_sample_params sp = { 0.8f, 0.9f, 0 };
	for (int i = 0; i < 64; i++)
		CHECK(bk_sample_token(lg, 6, &sp, fwd[i], w) == bk_sample_token(lg, 6, &sp, back[i], w),
		      "draw %d differs", i);
	bk_sample_work_free(w);
}

int main(void)
{
	check_nucleus();
	check_temperature();
	check_greedy();
	check_topk();
	check_distribution();
	check_rng();
	return bk_test_done("sample");
}
