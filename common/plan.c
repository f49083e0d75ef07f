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

static size_t plan_ffd(const long *cost, size_t n, bk_plan_limits lim, size_t *batch)
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

/* Worst-fit decreasing over the lower bound of batches: each item (largest first) goes
 * to the open batch with the most room left, so tokens and record counts both spread
 * evenly; a new batch opens only when nothing fits.  Beats first fit when --max-batch
 * binds (first fit piles the small records into count-limited batches). */
static size_t plan_wfd(const long *cost, size_t n, bk_plan_limits lim, size_t *batch)
{
	if (lim.max_tokens <= 0)
		return plan_ffd(cost, n, lim, batch);
	item *it = xmalloc(n * sizeof *it);
	long total = 0;
	for (size_t i = 0; i < n; i++) {
		it[i] = (item){cost[i], i};
		total += cost[i];
	}
	qsort(it, n, sizeof *it, by_cost_desc);
	size_t lb = (size_t)((total + lim.max_tokens - 1) / lim.max_tokens);
	if (lim.max_batch > 0 && (n + (size_t)lim.max_batch - 1) / (size_t)lim.max_batch > lb)
		lb = (n + (size_t)lim.max_batch - 1) / (size_t)lim.max_batch;
	if (lb < 1)
		lb = 1;
	long *used = xcalloc(n + lb, sizeof *used), *count = xcalloc(n + lb, sizeof *count);
	size_t nb = lb;
	for (size_t k = 0; k < n; k++) {
		size_t best = nb;
		for (size_t b = 0; b < nb; b++)
			if (fits(used[b], count[b], it[k].cost, lim) &&
			    (best == nb || used[b] < used[best]))
				best = b;
		if (best == nb)
			nb++;
		used[best] += it[k].cost;
		count[best]++;
		batch[it[k].idx] = best;
	}
	/* renumber without empty batches (possible when one item exceeds the budget) */
	size_t *map = xmalloc(nb * sizeof *map), m = 0;
	for (size_t b = 0; b < nb; b++)
		map[b] = count[b] ? m++ : (size_t)-1;
	for (size_t i = 0; i < n; i++)
		batch[i] = map[batch[i]];
	free(map);
	free(it);
	free(used);
	free(count);
	return m;
}

size_t bk_plan_pack(const long *cost, size_t n, bk_plan_limits lim, size_t *batch)
{
	if (!n)
		return 0;
	size_t *alt = xmalloc(n * sizeof *alt);
	size_t a = plan_ffd(cost, n, lim, batch), b = plan_wfd(cost, n, lim, alt);
	if (b < a) {
		for (size_t i = 0; i < n; i++)
			batch[i] = alt[i];
		a = b;
	}
	free(alt);
	return a;
}
