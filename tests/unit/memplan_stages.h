/* memplan_stages.h - the stage workloads whose measured peak both memory-plan tests hold
 * to their plans: test_memplan.c (g) on the host twin with every allocation counted, and
 * test_memplan_cuda.c with the CUDA ops' own accounting.  mp_stage(which, ...) runs stage
 * which (0 bk-step in exact mode, 1 bk-teach, 2 bk-gen, 3 bk-step with gradient
 * checkpointing: gpu/model.c invariants 10-12) at a small shape on the model lm
 * (models/stories260K), bk-gen with the generation ops gops, and fills s with the plan of
 * that stage on device d (gpu/memplan.c); returns bk-teach's activation tokens (acts_T),
 * 0 for the other stages.  Header-only (static), for those two tests. */
#ifndef BK_TESTS_MEMPLAN_STAGES_H
#define BK_TESTS_MEMPLAN_STAGES_H

#include <stdlib.h>
#include <string.h>

#include "gpu/gen.h"
#include "gpu/load.h"
#include "gpu/memplan.h"
#include "gpu/teach.h"
#include "gpu/train.h"

static int mp_stage(int which, const bk_loaded_model *lm, const bk_gen_ops *gops,
		    const bk_mem_dev *d, bk_mem_stage *s)
{
	int32_t ids[64];
	for (int i = 0; i < 64; i++)
		ids[i] = 1 + (i * 37) % 500;
	int32_t p1[14], p2[14], p3[14];
	memcpy(p1, ids, sizeof p1), memcpy(p2, ids, sizeof p2), memcpy(p3, ids, sizeof p3);
	p2[13] = 7, p3[12] = 9;
	bk_mem_model mm = bk_mem_model_of(lm->cfg);
	int acts_T = 0;
	if (which == 0 || which == 3) { /* bk-step, exact mode: 3 samples, teacher prompts
					 * longer than the student's; 3: with checkpointing */
		bk_train_opts o = {.r = 4, .alpha = 8, .targets = BK_LORA_ALL, .lr = 1e-3,
				   .temperature = 1, .seed = 1, .vocab_chunk = 100,
				   .grad_checkpoint = which == 3};
		bk_trainer *t = bk_trainer_create(lm->model, &o);
		bk_train_sample sm[3] = {{ids, ids, ids + 40, 6, 15, 9, NULL},
					 {ids + 3, ids, ids + 20, 10, 20, 12, NULL},
					 {ids + 5, ids, ids + 30, 4, 9, 7, NULL}};
		bk_train_micro_info info;
		bk_trainer_micro(t, sm, 3, &info);
		double lr;
		bk_trainer_step(t, &lr);
		bk_trainer_free(t);
		/* tokens: teacher 15+9 + 20+12 + 9+7 = 72, student 6+9 + 10+12 + 4+7 = 48; rows
		 * 28; the teacher runs in chunks of at most 48 tokens: {24}, {32, 16} */
		bk_mem_step so = {.r = 4, .targets = BK_LORA_ALL, .max_T = 48, .rows = 28, .k = -1,
				  .vocab_chunk = 100, .grad_checkpoint = which == 3};
		bk_mem_plan_step(s, &mm, d, &so);
	} else if (which == 1) { /* bk-teach: two forwards (the budget splits them), a prefix, top-8 */
		bk_teach_seq sq[3] = {{p1, 14, ids + 40, 10}, {p2, 14, ids + 20, 16},
				      {p3, 14, ids + 10, 5}};
		bk_teach *tc = bk_teach_create(lm->model, NULL, 25, 8, 1.0f, 64);
		bk_teach_prefix_from(tc, sq, 3);
		bk_teacher out[3];
		memset(out, 0, sizeof out);
		bk_teach_run(tc, sq, 3, out);
		acts_T = bk_teach_stats_get(tc)->acts_T;
		bk_teach_free(tc);
		for (int i = 0; i < 3; i++)
			bk_teacher_free(&out[i]);
		/* prefix P = 12 (common prefix, capped at 14 - 1); own tokens 14 + n - 1 - 12: 11,
		 * 17, 6; budget 25: forwards {11}, {17, 6}: at most 23 tokens and 21 rows */
		bk_mem_teach to = {.max_T = 23, .rows = 21, .k = 8, .P = 12, .fwd_only = 1};
		bk_mem_plan_teach(s, &mm, d, &to);
	} else { /* bk-gen: 3 prompts of up to 14 tokens, 2 samples each, 12 new, batch 4 */
		bk_gen_config gc = {.max_batch = 4, .max_new = 12, .max_prompt = 14, .ntraj = 2,
				    .max_seq = 512, .sample = {0.8f, 1, 0}};
		bk_gen *g = bk_gen_create(lm->model, gops, NULL, &gc);
		uint64_t keys[2] = {1, 2}, tags[2] = {0, 1};
		const int32_t *pr[3] = {p1, p2, p3};
		for (int i = 0; i < 3; i++)
			bk_gen_submit(g, pr[i], 14, 2, keys, tags);
		while (bk_gen_step(g)) {
			bk_gen_result r;
			while (bk_gen_take(g, &r))
				free(r.ids);
		}
		bk_gen_free(g);
		bk_mem_gen go = {.max_batch = 4, .max_prompt = 14, .max_new = 12, .ntraj = 2};
		bk_mem_plan_gen(s, &mm, d, &go);
	}
	return acts_T;
}

#endif
