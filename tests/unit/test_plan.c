/* test_plan.c - batch planning: every item placed once, limits kept, close to the
 * lower bound, never worse than arrival order. */
#include "common/diag.h"
#include "common/plan.h"
#include "common/rng.h"
#include "tests/harness.h"

#include <stdlib.h>

static void check_plan(const long *cost, size_t n, bk_plan_limits lim, const char *what)
{
	size_t *b = xmalloc(n * sizeof *b), *b0 = xmalloc(n * sizeof *b0);
	size_t nb = bk_plan_pack(cost, n, lim, b), nb0 = bk_plan_next_fit(cost, n, lim, b0);
	long *used = xcalloc(nb, sizeof *used), *cnt = xcalloc(nb, sizeof *cnt), total = 0;
	int ok = 1;
	for (size_t i = 0; i < n; i++) {
		if (b[i] >= nb) {
			ok = 0;
			break;
		}
		used[b[i]] += cost[i];
		cnt[b[i]]++;
		total += cost[i];
	}
	CHECK(ok, "%s: batch numbers in range", what);
	int limits = 1, empty = 0;
	for (size_t k = 0; ok && k < nb; k++) {
		empty += cnt[k] == 0;
		if (lim.max_batch && cnt[k] > lim.max_batch)
			limits = 0;
		if (lim.max_tokens && used[k] > lim.max_tokens && cnt[k] > 1)
			limits = 0;
	}
	CHECK(limits, "%s: limits kept", what);
	CHECK(!empty, "%s: no empty batch", what);
	CHECK(nb <= nb0, "%s: %zu batches, arrival order %zu", what, nb, nb0);
	size_t lb = lim.max_tokens ? (size_t)((total + lim.max_tokens - 1) / lim.max_tokens) : 1;
	if (lim.max_batch && (n + (size_t)lim.max_batch - 1) / (size_t)lim.max_batch > lb)
		lb = (n + (size_t)lim.max_batch - 1) / (size_t)lim.max_batch;
	CHECK(nb <= lb + lb / 20 + 1, "%s: %zu batches, lower bound %zu", what, nb, lb);
	free(b);
	free(b0);
	free(used);
	free(cnt);
}

int main(void)
{
	bk_rng r;
	bk_rng_seed(&r, 3);
	enum { N = 1024 };
	long cost[N];
	for (int mix = 0; mix < 3; mix++) {
		for (int i = 0; i < N; i++) {
			double u = bk_rng_uniform(&r);
			cost[i] = mix == 0   ? 20 + (long)bk_rng_below(&r, 60)
				  : mix == 1 ? (u < 0.6 ? 20 : u < 0.9 ? 100 : 500) + (long)bk_rng_below(&r, 200)
					     : 1 + (long)bk_rng_below(&r, 4000);
		}
		check_plan(cost, N, (bk_plan_limits){4096, 64}, "budget and count");
		check_plan(cost, N, (bk_plan_limits){4096, 0}, "budget only");
	}
	/* count only */
	size_t b[N];
	CHECK(bk_plan_pack(cost, N, (bk_plan_limits){0, 10}, b) == (N + 9) / 10, "count only");
	/* oversize items get their own batch */
	long big[3] = {5000, 10, 10};
	size_t bb[3];
	size_t nb = bk_plan_pack(big, 3, (bk_plan_limits){100, 0}, bb);
	CHECK(nb == 2 && bb[1] == bb[2] && bb[0] != bb[1], "oversize alone: %zu", nb);
	CHECK(bk_plan_pack(big, 0, (bk_plan_limits){100, 0}, bb) == 0, "empty input");
	return bk_test_done("test_plan");
}
