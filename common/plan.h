/* plan.h - batch planning: pack whole sequences into batches under a token budget.
 * Decreasing-size bin packing over a window of records; no sequence is ever split, so the
 * batches are packed variable-length sequences with no padding at all.  "Efficiency"
 * is real tokens / (batches x max_tokens): how full the token budget of each step is. */
#ifndef BK_PLAN_H
#define BK_PLAN_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
	long max_tokens; /* budget per batch; 0 = count only */
	long max_batch;  /* records per batch; 0 = unlimited */
} bk_plan_limits;

/* Assigns batch[i] in [0, nbatch) for each of n items with cost[i]: the better (fewer
 * batches) of first-fit decreasing and worst-fit decreasing.  An item costing more
 * than max_tokens gets a batch of its own.  Returns the number of batches. */
size_t bk_plan_pack(const long *cost, size_t n, bk_plan_limits lim, size_t *batch);
/* The same items packed in arrival order (next fit): the naive plan, for comparison. */
size_t bk_plan_next_fit(const long *cost, size_t n, bk_plan_limits lim, size_t *batch);

#endif
