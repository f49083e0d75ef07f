/* host_rows.c - see host_rows.h. */
#include "gpu/host/host_rows.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>

#include "common/diag.h"
#include "gpu/gen.h"
#include "gpu/host/host_attn.h"
#include "gpu/host/loss.h"

enum { RB = 32 }; /* LM-head rows per pass: logits [RB,V] */

static void rows_linear_forward(float *y, const float *x, const bk_weight *W, int T)
{
	bk_gen_ops_host.linear(y, x, W, T);
}

/* a view of rows [r0, r0+n) of the LM head's input as logits [n,V], one block at a time */
static void head_logits(float *lg, const float *hidden, const bk_weight *head, int r0, int n)
{
	bk_gen_ops_host.linear(lg, hidden + (size_t)r0 * head->cols, head, n);
}

static void rows_teacher_topk(const float *hidden, const bk_weight *head, int n, int chunk,
			      float temperature, float softcap, int k, int32_t *ids, float *logp,
			      float *rest)
{
	int V = head->rows, H = head->cols;
	if (n <= 0) { /* bk_teacher_topk's checks and messages (n = 0 stops after them) */
		static const float none = 0;
		bk_teacher_topk(NULL, NULL, &none, 0, H, V, chunk, temperature, softcap, k, ids,
				logp, rest);
		return;
	}
	float *lg = xmalloc((size_t)RB * V * sizeof(float));
	for (int r0 = 0; r0 < n; r0 += RB) {
		int nb = n - r0 < RB ? n - r0 : RB;
		head_logits(lg, hidden, head, r0, nb);
		/* the logits form of bk_teacher_topk: each row's heap and log-sum-exp see
		 * only that row */
		bk_teacher_topk(NULL, NULL, lg, nb, H, V, chunk, temperature, softcap, k,
				ids + (size_t)r0 * k, logp + (size_t)r0 * k, rest + r0);
	}
	free(lg);
}

/* log_softmax(logits / T) per row: max, then the sum of exp in index order, in double */
static void rows_teacher_logprobs(const float *hidden, const bk_weight *head, int n, int chunk,
				  float temperature, float softcap, float *logp)
{
	int V = head->rows;
	/* bk_teacher_logprobs's checks and messages (n = 0 stops right after them) */
	bk_teacher_logprobs(NULL, NULL, 0, head->cols, V, chunk, temperature, softcap, NULL);
	if (n <= 0)
		return;
	float *lg = xmalloc((size_t)RB * V * sizeof(float));
	for (int r0 = 0; r0 < n; r0 += RB) {
		int nb = n - r0 < RB ? n - r0 : RB;
		head_logits(lg, hidden, head, r0, nb);
#pragma omp parallel for schedule(static) if ((size_t)nb * V > 65536)
		for (int r = 0; r < nb; r++) {
			float *u = lg + (size_t)r * V;
			double mx = -INFINITY, s = 0;
			for (int j = 0; j < V; j++) {
				if (softcap > 0) /* Gemma-2's final softcap, as loss.c */
					u[j] = bk_loss_softcap(u[j], softcap);
				if (temperature != 1.0f)
					u[j] /= temperature;
				mx = u[j] > mx ? u[j] : mx;
			}
			for (int j = 0; j < V; j++)
				s += exp((double)u[j] - mx);
			double l = mx + log(s);
			float *o = logp + (size_t)(r0 + r) * V;
			for (int j = 0; j < V; j++)
				o[j] = (float)((double)u[j] - l);
		}
	}
	free(lg);
}

static bk_ops table;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void build(void)
{
	table = bk_ops_host;
	table.linear_forward = rows_linear_forward;
	table.proj_forward = NULL; /* the model then composes the row-wise linear_forward */
	table.proj_backward = NULL;
	table.teacher_topk = rows_teacher_topk;
	table.teacher_logprobs = rows_teacher_logprobs;
	table.attention_forward = bk_host_attention_forward_rows; /* row by row (host_attn.h) */
}

const bk_ops *bk_ops_host_rows(void)
{
	pthread_once(&once, build);
	return &table;
}
