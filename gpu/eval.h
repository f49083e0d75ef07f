/* eval.h - held-out KL(teacher || student) for bk-eval: the teacher (adapter off, with
 * the system prompt) against a student (base or base + adapter, without it) on given
 * responses.  Not generation (gpu/gen.h) and not Q&A scoring (formats/qa.h). */
#ifndef BK_EVAL_H
#define BK_EVAL_H

#include <stdint.h>

#include "gpu/model.h"

typedef struct {
	const int32_t *t_prompt, *s_prompt, *resp;
	int nt, ns, nr;
} bk_eval_seq;

typedef struct {
	double per_token;  /* mean KL over all response tokens */
	double per_sample; /* mean over samples of each sample's mean (the training loss) */
	long tokens;
	int samples; /* samples with at least one response token */
} bk_kl_result;

/* lm_head: host fp32 [V,H] (gpu/teach.h bk_teach_lm_head); lora NULL = base student. */
bk_kl_result bk_eval_kl(const bk_model *m, const float *lm_head, const bk_lora *lora,
			const bk_eval_seq *seqs, int n, float temperature);

#endif
