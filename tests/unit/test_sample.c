/* test_sample.c - gpu/sample.c: the nucleus equals a brute-force HF top-p (full sort,
 * cumulative mass before a token < top_p) over random, peaked, flat and tied logits;
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

/* brute force: ids of the nucleus in order; returns its size */
static int brute_nucleus(const float *lg, int V, double T, double top_p, int *ids, double *p)
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
	double cum = 0;
	int k = 0;
	if (top_p >= 1) /* HF adds no top-p warper then: every token stays */
		return V;
	while (k < V && (k == 0 || cum < top_p))
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
			for (size_t ti = 0; ti < sizeof(tops) / sizeof(tops[0]); ti++) {
				for (float T = 0.5f; T < 2.1f; T += 0.7f) {
					int k = brute_nucleus(lg, V, T, (float)tops[ti], want, p);
					int n = bk_sample_nucleus(lg, V, T, (float)tops[ti], w, got, probs);
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
						CHECK(ok, "V %d kind %d top_p %g T %g: nucleus of %d, want %d", V,
						      kind, tops[ti], T, n, k);
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
		int n = bk_sample_nucleus(lg, 5, (float)T, 1.0f, w, ids, pr);
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
	bk_sample_nucleus(lg, 5, 0.5f, 1.0f, w, ids, pr);
	double sharp = pr[0];
	bk_sample_nucleus(lg, 5, 2.0f, 1.0f, w, ids, pr);
	CHECK(sharp > pr[0], "p(best) at T 0.5 %g <= at T 2 %g", sharp, pr[0]);
	/* a tiny top_p keeps the single best token */
	CHECK(bk_sample_nucleus(lg, 5, 1.0f, 1e-6f, w, ids, NULL) == 1 && ids[0] == 4,
	      "top_p 1e-6 keeps more than the best token");
	bk_sample_work_free(w);
}

static void check_greedy(void)
{
	float lg[9] = { 0, 1, 2, 5, 1, 5, -3, 5, 4 };
	CHECK(bk_sample_argmax(lg, 9) == 3, "argmax of a tie is %d, want 3",
	      bk_sample_argmax(lg, 9));
	bk_sample_work *w = bk_sample_work_new(9);
	bk_sample_params g = { 0, 0.9f };
	for (double u = 0; u < 1; u += 0.125)
		CHECK(bk_sample_token(lg, 9, &g, u, w) == 3, "greedy depends on u = %g", u);
	/* sampling among the ties: all three tied tokens come out, nothing else at top_p 0.5 */
	bk_sample_params s = { 1.0f, 0.5f };
	int seen[9] = { 0 };
	for (int i = 0; i < 3000; i++)
		seen[bk_sample_token(lg, 9, &s, bk_crng_uniform(9, (uint64_t)i), w)]++;
	CHECK(seen[3] > 0 && seen[5] > 0 && seen[7] == 0 && seen[8] == 0,
	      "top_p 0.5 over three tied best: counts 3:%d 5:%d 7:%d 8:%d", seen[3], seen[5],
	      seen[7], seen[8]);
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
	bk_sample_params sp = { 0.8f, 0.9f };
	int k = bk_sample_nucleus(lg, V, sp.temperature, sp.top_p, w, ids, pr);
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
	bk_sample_params full = { 1.3f, 1.0f };
	k = bk_sample_nucleus(lg, V, full.temperature, full.top_p, w, ids, pr);
	memset(cnt, 0, sizeof(cnt));
	for (int i = 0; i < N; i++)
		cnt[bk_sample_token(lg, V, &full, bk_crng_uniform(key + 1, (uint64_t)i), w)]++;
	chi = 0;
	for (int i = 0; i < k; i++)
		chi += (cnt[ids[i]] - pr[i] * N) * (cnt[ids[i]] - pr[i] * N) / (pr[i] * N);
	bound = (k - 1) + 6 * sqrt(2.0 * (k - 1));
	CHECK(k == V && chi < bound, "untruncated: %d tokens, chi-square %.1f > %.1f", k, chi, bound);
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
	bk_sample_params sp = { 0.8f, 0.9f };
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
	check_distribution();
	check_rng();
	return bk_test_done("sample");
}
