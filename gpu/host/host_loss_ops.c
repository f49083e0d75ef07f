/* host_loss_ops.c - the host twin's row gather/scatter and baking-loss ops (ops.h):
 * thin wrappers of gpu/host/loss.c over the fp32 LM head of a host bk_weight.  Not the
 * loss math (loss.c) and not the rest of the host table (host_ops.c). */
#include <string.h>

#include "common/diag.h"
#include "gpu/host/loss.h"
#include "gpu/ops.h"

#include "gpu/host/host_loss_ops.h"

static void check_rows(const char *what, const int32_t *rows, int N, int T, int H)
{
	if (N < 0 || T < 0 || H <= 0)
		BUG("%s: bad sizes N=%d T=%d H=%d", what, N, T, H);
	for (int r = 0; r < N; r++)
		if (rows[r] < 0 || rows[r] >= T)
			BUG("%s: row %d: index %d is not in [0, %d)", what, r, (int)rows[r], T);
}

/* dst [N,H] = src[rows] */
void bk_host_gather_rows(float *dst, const float *src /* [T,H] */, const int32_t *rows, int N,
			 int T, int H)
{
	check_rows("gather rows", rows, N, T, H);
	for (int r = 0; r < N; r++)
		memcpy(dst + (size_t)r * H, src + (size_t)rows[r] * H, (size_t)H * sizeof(float));
}

/* dst [T,H] rows += src [N,H] */
void bk_host_scatter_rows(float *dst, const float *src, const int32_t *rows, int N, int T,
			  int H)
{
	check_rows("scatter rows", rows, N, T, H);
	for (int r = 0; r < N; r++) {
		float *d = dst + (size_t)rows[r] * H;
		const float *s = src + (size_t)r * H;
		for (int i = 0; i < H; i++)
			d[i] += s[i];
	}
}

static const float *head(const bk_weight *w) { return (const float *)w->data; } /* [V,H] */

double bk_host_kl_exact(const float *hidden, const bk_weight *lm_head,
			const float *teacher_hidden, const float *teacher_logp,
			const int32_t *sample_of, int n, int n_samples, int chunk,
			float temperature, float softcap, float *d_hidden, float *row_kl)
{
	return bk_loss_kl_exact(hidden, head(lm_head), teacher_hidden, teacher_logp, sample_of, n,
				n_samples, lm_head->cols, lm_head->rows, chunk, temperature,
				softcap, d_hidden, row_kl);
}

double bk_host_kl_topk(const float *hidden, const bk_weight *lm_head, const int32_t *topk_ids,
		       const float *topk_logp, const float *rest, const int32_t *sample_of,
		       int n, int n_samples, int k, int chunk, float temperature,
		       float softcap, float *d_hidden, float *row_kl)
{
	return bk_loss_kl_topk(hidden, head(lm_head), topk_ids, topk_logp, rest, sample_of, n,
			       n_samples, lm_head->cols, lm_head->rows, k, chunk, temperature,
			       softcap, d_hidden, row_kl);
}

void bk_host_teacher_topk(const float *hidden, const bk_weight *lm_head, int n, int chunk,
			  float temperature, float softcap, int k, int32_t *ids, float *logp,
			  float *rest)
{
	bk_teacher_topk(hidden, head(lm_head), NULL, n, lm_head->cols, lm_head->rows, chunk,
			temperature, softcap, k, ids, logp, rest);
}

void bk_host_teacher_logprobs(const float *hidden, const bk_weight *lm_head, int n, int chunk,
			      float temperature, float softcap, float *logp)
{
	bk_teacher_logprobs(hidden, head(lm_head), n, lm_head->cols, lm_head->rows, chunk,
			    temperature, softcap, logp);
}
