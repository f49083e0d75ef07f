/* eval.c - see eval.h.  One sample at a time: evaluation sets are small, and this
 * keeps the activations at the size of the longest sequence.  The KL runs through the
 * op table (ops.h kl_exact) on device rows; only per-row KL values reach the host. */
#include "eval.h"
#include "common/diag.h"

#include <stdlib.h>
#include <string.h>

/* forward of prompt + resp[0..nr-1) and the nr hidden rows predicting resp, copied
 * into rows [nr,H] (device) */
static void response_rows(const bk_model *m, const bk_lora *lora, bk_acts *acts,
			  const int32_t *prompt, int np, const int32_t *resp, int nr,
			  int32_t *ids, int32_t *pos, float *hid_dev, float *rows)
{
	int T = np + nr - 1, H = m->cfg.H;
	memcpy(ids, prompt, (size_t)np * sizeof *ids);
	memcpy(ids + np, resp, (size_t)(nr - 1) * sizeof *ids);
	for (int t = 0; t < T; t++)
		pos[t] = t;
	int32_t cu[2] = {0, T};
	bk_batch b = {T, 1, ids, pos, cu, 0, 0};
	bk_model_forward(m, lora, &b, NULL, acts, hid_dev);
	m->ops->copy(rows, hid_dev + (size_t)(np - 1) * H, (size_t)nr * H * sizeof(float));
}

bk_kl_result bk_eval_kl(const bk_model *m, const float *lm_head, const bk_lora *lora,
			const bk_eval_seq *seqs, int n, float temperature)
{
	(void)lm_head; /* the loss op reads the model's own head, m->lm_head */
	bk_kl_result res = {0};
	int maxT = 1, maxr = 1, H = m->cfg.H;
	for (int i = 0; i < n; i++) {
		int lt = seqs[i].nt + seqs[i].nr, ls = seqs[i].ns + seqs[i].nr;
		maxT = lt > maxT ? lt : maxT;
		maxT = ls > maxT ? ls : maxT;
		maxr = seqs[i].nr > maxr ? seqs[i].nr : maxr;
	}
	bk_acts *acts = bk_acts_create(m, maxT, lora ? lora->r : 0);
	int32_t *ids = xmalloc((size_t)maxT * sizeof *ids), *pos = xmalloc((size_t)maxT * sizeof *pos);
	int32_t *sample_of = xcalloc((size_t)maxr, sizeof *sample_of);
	float *hid = bk_alloc(m->ops, (size_t)maxT * H * sizeof(float), "hidden");
	float *trows = bk_alloc(m->ops, (size_t)maxr * H * sizeof(float), "eval rows"), /* [maxr,H] */
	      *srows = bk_alloc(m->ops, (size_t)maxr * H * sizeof(float), "eval rows"), /* [maxr,H] */
	      *kl = xmalloc((size_t)maxr * sizeof *kl);                  /* [maxr] host */
	double sum_tok = 0, sum_sample = 0;
	for (int i = 0; i < n; i++) {
		const bk_eval_seq *s = &seqs[i];
		if (s->nr <= 0)
			continue;
		response_rows(m, NULL, acts, s->t_prompt, s->nt, s->resp, s->nr, ids, pos, hid, trows);
		response_rows(m, lora, acts, s->s_prompt, s->ns, s->resp, s->nr, ids, pos, hid, srows);
		double loss = m->ops->kl_exact(srows, m->lm_head, trows, NULL, sample_of, s->nr, 1,
					       4096, temperature, m->cfg.final_softcap, NULL, kl);
		for (int r = 0; r < s->nr; r++)
			sum_tok += kl[r];
		sum_sample += loss;
		res.tokens += s->nr;
		res.samples++;
	}
	res.per_token = res.tokens ? sum_tok / (double)res.tokens : 0;
	res.per_sample = res.samples ? sum_sample / res.samples : 0;
	m->ops->free(hid);
	free(ids);
	free(pos);
	free(sample_of);
	m->ops->free(trows);
	m->ops->free(srows);
	free(kl);
	bk_acts_free(m, acts);
	return res;
}
