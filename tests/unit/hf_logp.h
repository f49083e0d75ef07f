/* hf_logp.h - one sequence through a model on its ops and its log-probs against HF's
 * (a fixture's "ids" and "logp" arrays): the largest |logp - HF| over every position
 * and token.  Shared by the fixture tests that hold a model to HF's log_softmax
 * (test_families_bf16.c, test_rope_scaling.c); static, included once per test. */
#ifndef BK_TEST_HF_LOGP_H
#define BK_TEST_HF_LOGP_H

#include <jansson.h>
#include <math.h>
#include <stdlib.h>

#include "common/diag.h"
#include "gpu/model.h"
#include "tests/harness.h"

static double hf_logp_worst(const bk_model *m, json_t *jids, json_t *jlogp, const char *name)
{
	const bk_ops *ops = m->ops;
	int T = (int)json_array_size(jids), V = m->cfg.V;
	int32_t *ids = xmalloc((size_t)T * sizeof *ids), *pos = xmalloc((size_t)T * sizeof *pos);
	int32_t cu[2] = {0, T};
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)json_integer_value(json_array_get(jids, (size_t)t)), pos[t] = t;
	bk_batch b = {.T = T, .S = 1, .ids = ids, .pos = pos, .cu_seqlens = cu};
	bk_acts *acts = bk_acts_create(m, T, 0);
	float *dhid = ops->alloc((size_t)T * m->cfg.H * sizeof(float));
	float *dlog = ops->alloc((size_t)T * V * sizeof(float));
	float *logits = xmalloc((size_t)T * V * sizeof(float));
	bk_model_forward(m, NULL, &b, NULL, acts, dhid);
	bk_model_logits(m, dhid, dlog, T);
	ops->download(logits, dlog, (size_t)T * V * sizeof(float));
	double worst = 0;
	for (int t = 0; t < T; t++) {
		const float *row = logits + (size_t)t * V;
		double mx = row[0], s = 0;
		for (int v = 1; v < V; v++)
			mx = row[v] > mx ? row[v] : mx;
		for (int v = 0; v < V; v++)
			s += exp(row[v] - mx);
		double lse = mx + log(s);
		json_t *ref = json_array_get(jlogp, (size_t)t);
		CHECK((int)json_array_size(ref) == V, "%s: logp row %d has %zu values", name, t,
		      json_array_size(ref));
		for (int v = 0; v < V && v < (int)json_array_size(ref); v++) {
			double d = fabs(row[v] - lse - json_number_value(json_array_get(ref, (size_t)v)));
			worst = d > worst ? d : worst;
		}
	}
	free(logits);
	ops->free(dlog);
	ops->free(dhid);
	bk_acts_free(m, acts);
	free(ids);
	free(pos);
	return worst;
}

#endif
