/* test_memplan_cuda.c - the memory plan against the CUDA ops' own accounting
 * (bk_cuda_mem_stats: every allocation through dev_alloc) under the CPU emulation of
 * the CUDA runtime (make emu) or on a GPU: each stage, in a process of its own as in a
 * bake, runs a small shape on models/stories260K and its measured peak is within 10%
 * of its plan (gpu/memplan.c with the environment's BK_* switches), less the items that
 * bypass dev_alloc (the CUDA context estimate, the weight staging buffer, the gradient
 * norm and decode scratch: cudaMalloc directly).  Without CUDA it checks nothing. */
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
#include "gpu/gen.h"
#include "gpu/load.h"
#include "gpu/memplan.h"
#include "gpu/teach.h"
#include "gpu/train.h"

/* the plan's bytes that dev_alloc sees: weights and buffers, not the items that bypass it */
static size_t tracked(const bk_mem_stage *s)
{
	static const char *const bypass[] = {"CUDA context (estimate)", "weight staging (load only)",
					     "gradient norm scratch", "decode linear scratch",
					     "decode attention workspace", NULL};
	size_t n = 0;
	for (int i = 0; i < s->n; i++) {
		int skip = 0;
		for (int k = 0; bypass[k]; k++)
			skip |= !strcmp(s->item[i].name, bypass[k]);
		if (!skip)
			n += s->item[i].bytes;
	}
	return n;
}

static int32_t ids[64];

/* one stage in this (child) process: exit 0 when within 10%, the numbers on stderr */
static void stage(void *arg)
{
	int which = *(int *)arg;
	bk_loaded_model lm = bk_model_load(&bk_ops_cuda, "models/stories260K");
	bk_mem_model mm = bk_mem_model_of(lm.cfg);
	bk_mem_dev d = bk_mem_dev_cuda_env();
	bk_mem_stage s;
	int32_t p1[14], p2[14], p3[14];
	memcpy(p1, ids, sizeof p1), memcpy(p2, ids, sizeof p2), memcpy(p3, ids, sizeof p3);
	p2[13] = 7, p3[12] = 9;
	if (which == 0) { /* bk-step, exact mode (gpu/train.c) */
		bk_train_opts o = {.r = 4, .alpha = 8, .targets = BK_LORA_ALL, .lr = 1e-3,
				   .temperature = 1, .seed = 1, .vocab_chunk = 100};
		bk_trainer *t = bk_trainer_create(lm.model, &o);
		bk_train_sample sm[3] = {{ids, ids, ids + 40, 6, 15, 9, NULL},
					 {ids + 3, ids, ids + 20, 10, 20, 12, NULL},
					 {ids + 5, ids, ids + 30, 4, 9, 7, NULL}};
		bk_train_micro_info info;
		bk_trainer_micro(t, sm, 3, &info);
		double lr;
		bk_trainer_step(t, &lr);
		bk_mem_step so = {.r = 4, .targets = BK_LORA_ALL, .max_T = 72, .rows = 28, .k = -1,
				  .vocab_chunk = 100};
		bk_mem_plan_step(&s, &mm, &d, &so);
	} else if (which == 1) { /* bk-teach: as test_memplan (g) */
		bk_teach_seq sq[3] = {{p1, 14, ids + 40, 10}, {p2, 14, ids + 20, 16},
				      {p3, 14, ids + 10, 5}};
		bk_teach *tc = bk_teach_create(lm.model, NULL, 25, 8, 1.0f, 64);
		bk_teach_prefix_from(tc, sq, 3);
		bk_teacher out[3];
		memset(out, 0, sizeof out);
		bk_teach_run(tc, sq, 3, out);
		bk_mem_teach to = {.max_T = 23, .rows = 21, .k = 8, .P = 12, .fwd_only = 1};
		bk_mem_plan_teach(&s, &mm, &d, &to);
	} else { /* bk-gen */
		bk_gen_config gc = {.max_batch = 4, .max_new = 12, .max_prompt = 14, .ntraj = 2,
				    .max_seq = 512, .sample = {0.8f, 1, 0}};
		bk_gen *g = bk_gen_create(lm.model, &bk_gen_ops_cuda, NULL, &gc);
		uint64_t keys[2] = {1, 2}, tags[2] = {0, 1};
		const int32_t *pr[3] = {p1, p2, p3};
		for (int i = 0; i < 3; i++)
			bk_gen_submit(g, pr[i], 14, 2, keys, tags);
		while (bk_gen_step(g)) {
			bk_gen_result r;
			while (bk_gen_take(g, &r))
				free(r.ids);
		}
		bk_mem_gen go = {.max_batch = 4, .max_prompt = 14, .max_new = 12, .ntraj = 2};
		bk_mem_plan_gen(&s, &mm, &d, &go);
	}
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
	for (int i = 0; i < 64; i++)
		ids[i] = 1 + (i * 37) % 500;
	for (int which = 0; which < 3; which++) {
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
