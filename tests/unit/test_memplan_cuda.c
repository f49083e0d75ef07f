/* test_memplan_cuda.c - the memory plan against the CUDA ops' own accounting
 * (bk_cuda_mem_stats: every allocation through bk_cuda_dev_alloc) under the CPU emulation of
 * the CUDA runtime (make emu) or on a GPU: each stage, in a process of its own as in a
 * bake, runs a small shape on models/stories260K and its measured peak is within 10%
 * of its plan (gpu/memplan.c with the environment's BK_* switches), less the CUDA context
 * estimate (no allocation).  Without CUDA it checks nothing. */
#include "tests/harness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef BK_HAVE_CUDA
#include "common/diag.h"
#include "gpu/bakemem.h"
#include "gpu/cuda/cuda.h"
#include "gpu/device.h"
#include "tests/unit/memplan_stages.h"

/* the plan's peak as the CUDA ops count it (every device buffer goes through
 * bk_cuda_dev_alloc): the weights and the larger of the load items (the staging buffer)
 * and the buffers; not the CUDA context estimate, which is no allocation */
static size_t tracked(const bk_mem_stage *s)
{
	size_t weights = 0, load = 0, other = 0;
	for (int i = 0; i < s->n; i++) {
		const bk_mem_item *it = &s->item[i];
		if (it->kind == BK_MEM_WEIGHTS)
			weights += it->bytes;
		else if (it->kind == BK_MEM_LOAD)
			load += it->bytes;
		else if (it->kind == BK_MEM_BUF)
			other += it->bytes;
	}
	return weights + (load > other ? load : other);
}

/* one stage in this (child) process: exit 0 when within 10%, the numbers on stderr */
static void stage(void *arg)
{
	bk_loaded_model lm = bk_model_load(&bk_ops_cuda, "models/stories260K");
	bk_mem_dev d = bk_mem_dev_cuda_env();
	bk_mem_stage s;
	mp_stage(*(int *)arg, &lm, &bk_gen_ops_cuda, &d, &s);
	size_t cur, peak;
	bk_cuda_mem_stats(&cur, &peak);
	size_t plan = tracked(&s);
	double rel = ((double)peak - (double)plan) / (double)plan;
	fprintf(stderr, "%s: measured peak %zu bytes, planned %zu (%+.1f%%)\n", s.stage, peak, plan,
		100 * rel);
	_exit(fabs(rel) <= 0.10 ? 0 : 1);
}
#endif

int main(void)
{
#ifdef BK_HAVE_CUDA
	const char *why = NULL;
	if (bk_cuda_device_count(&why) <= 0) { /* a CUDA build on a machine without a GPU */
		printf("test_memplan_cuda: no CUDA device (%s): tests/t0950-emu.sh runs it on the "
		       "emulated one\n", why ? why : "none");
		return bk_test_done("test_memplan_cuda");
	}
	for (int which = 0; which < 4; which++) {
		char err[4096];
		int st = bk_run_child(stage, &which, err, sizeof err);
		fputs(err, stdout);
		CHECK(st == 0, "stage %d: exit %d: %s", which, st, err);
	}
#else
	printf("test_memplan_cuda: no CUDA in this build (make emu runs it)\n");
#endif
	return bk_test_done("test_memplan_cuda");
}
