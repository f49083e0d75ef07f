/* host_loss_ops.h - the host twin's row and loss ops (host_loss_ops.c, wrappers of
 * gpu/host/loss.c), put into bk_ops_host by host_ops.c.  Internal to gpu/: callers use
 * the op table. */
#ifndef BK_HOST_LOSS_OPS_H
#define BK_HOST_LOSS_OPS_H

#include "gpu/ops.h"

void bk_host_gather_rows(float *dst, const float *src, const int32_t *rows, int N, int T, int H);
void bk_host_scatter_rows(float *dst, const float *src, const int32_t *rows, int N, int T,
			  int H);
double bk_host_kl_exact(const float *hidden, const bk_weight *lm_head,
			const float *teacher_hidden, const float *teacher_logp,
			const int32_t *sample_of, int n, int n_samples, int chunk,
			float temperature, float softcap, float *d_hidden, float *row_kl);
double bk_host_kl_topk(const float *hidden, const bk_weight *lm_head, const int32_t *topk_ids,
		       const float *topk_logp, const float *rest, const int32_t *sample_of,
		       int n, int n_samples, int k, int chunk, float temperature,
		       float softcap, float *d_hidden, float *row_kl);
void bk_host_teacher_topk(const float *hidden, const bk_weight *lm_head, int n, int chunk,
			  float temperature, float softcap, int k, int32_t *ids, float *logp,
			  float *rest);
void bk_host_teacher_logprobs(const float *hidden, const bk_weight *lm_head, int n, int chunk,
			      float temperature, float softcap, float *logp);

#endif
