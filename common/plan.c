/* plan.c - see plan.h. */
#include "plan.h"
#include "diag.h"

#include <stdlib.h>

typedef struct {
	long cost;
	size_t idx;
} item;

static int by_cost_desc(const void *a, const void *b)
{
	const item *x = a, *y = b;
	if (x->cost != y->cost)
		return x->cost < y->cost ? 1 : -1;
	return x->idx < y->idx ? -1 : x->idx > y->idx; /* stable: deterministic */
}

static int fits(long used, long count, long cost, bk_plan_limits lim)
{
	if (lim.max_batch > 0 && count >= lim.max_batch)
		return 0;
	return lim.max_tokens <= 0 || used + cost <= lim.max_tokens;
}

size_t bk_plan_ffd(const long *cost, size_t n, bk_plan_limits lim, size_t *batch)
{
	item *it = xmalloc(n * sizeof *it);
	for (size_t i = 0; i < n; i++)
		it[i] = (item){cost[i], i};
	qsort(it, n, sizeof *it, by_cost_desc);
	long *used = xcalloc(n ? n : 1, sizeof *used), *count = xcalloc(n ? n : 1, sizeof *count);
	size_t nb = 0, first_open = 0;
	for (size_t k = 0; k < n; k++) {
		size_t b = first_open;
		while (b < nb && !fits(used[b], count[b], it[k].cost, lim))
			b++;
		if (b == nb)
			nb++;
		used[b] += it[k].cost;
		count[b]++;
		batch[it[k].idx] = b;
		/* skip bins that can take nothing more (full or at max_batch) */
		while (first_open < nb && ((lim.max_batch > 0 && count[first_open] >= lim.max_batch) ||
					   (lim.max_tokens > 0 && used[first_open] >= lim.max_tokens)))
			first_open++;
	}
	free(it);
	free(used);
	free(count);
	return nb;
}

size_t bk_plan_next_fit(const long *cost, size_t n, bk_plan_limits lim, size_t *batch)
{
	size_t nb = 0;
	long used = 0, count = 0;
	for (size_t i = 0; i < n; i++) {
		if (nb == 0 || !fits(used, count, cost[i], lim)) {
			nb++;
			used = count = 0;
		}
		used += cost[i];
		count++;
		batch[i] = nb - 1;
	}
	return nb;
}
