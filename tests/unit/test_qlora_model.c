/* test_qlora_model.c - a model with 4-bit base linears (gpu/model.h cfg.q4, the host
 * twin's weight_upload_q4) on stories260K: its forward hidden states and LoRA
 * gradients equal, bit for bit, those of the fp32 model whose seven linears per layer
 * are set to bk_q4_dequantize of bitsandbytes' quantisation (so the 4-bit path computes
 * with exactly those weights, forward and backward, and nothing else is quantised), and
 * differ from the unquantised model's.  Also: handle kinds, bf16 compute dtype, a device
 * with no 4-bit linears refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/load.h"
#include "gpu/model.h"
#include "gpu/quant4.h"
#include "tests/harness.h"

#define MODEL "models/stories260K"

enum { T = 24, S = 2, R = 4 };

static const bk_loaded_model *base; /* unquantised */

/* hidden [T,H] and the LoRA gradient (flat) of model m for a fixed batch and adapter */
static void run(const bk_model *m, float *hidden, float *grad, size_t *n_flat)
{
	const bk_ops *ops = m->ops;
	int H = m->cfg.H;
	int32_t ids[T], pos[T], cu[S + 1] = {0, 10, T};
	for (int t = 0; t < T; t++) {
		ids[t] = (t * 37 + 5) % m->cfg.V;
		pos[t] = t < 10 ? t : t - 10;
	}
	bk_batch b = {.T = T, .S = S, .ids = ids, .pos = pos, .cu_seqlens = cu};
	bk_lora *l = bk_lora_create(m, R, 8.0f, 0.0f, BK_LORA_ALL);
	bk_lora *g = bk_lora_create_like(m, l);
	float *init = xmalloc(l->n_flat * sizeof(float));
	bk_rng rng;
	bk_rng_seed(&rng, 7);
	for (size_t i = 0; i < l->n_flat; i++)
		init[i] = (float)(bk_rng_uniform(&rng) - 0.5) * 0.2f;
	ops->upload(l->flat, init, l->n_flat * sizeof(float));
	ops->zero(g->flat, g->n_flat * sizeof(float));
	bk_acts *a = bk_acts_create(m, T, R);
	float *out = ops->alloc((size_t)T * H * sizeof(float));
	float *dh = ops->alloc((size_t)T * H * sizeof(float));
	bk_model_forward(m, l, &b, NULL, a, out);
	ops->download(hidden, out, (size_t)T * H * sizeof(float));
	float *dhh = xmalloc((size_t)T * H * sizeof(float));
	for (size_t i = 0; i < (size_t)T * H; i++)
		dhh[i] = (float)sin(0.1 * (double)i) * hidden[i];
	ops->upload(dh, dhh, (size_t)T * H * sizeof(float));
	bk_model_backward(m, l, &b, a, dh, g);
	ops->download(grad, g->flat, g->n_flat * sizeof(float));
	*n_flat = g->n_flat;
	ops->free(out), ops->free(dh);
	bk_acts_free(m, a);
	bk_lora_free(m, l), bk_lora_free(m, g);
	free(init), free(dhh);
}

/* the model of base with every base linear replaced by its dequantised 4-bit form */
static bk_model *dequantised_twin(const bk_q4_config *q4)
{
	const bk_model *m = base->model;
	const bk_llama_config *c = &m->cfg;
	bk_llama_layer_weights *lw = xcalloc(c->L, sizeof(*lw));
	float **owned = xcalloc((size_t)c->L * BK_LORA_NMOD, sizeof(float *));
	for (int l = 0; l < c->L; l++) {
		const bk_layer *ly = &m->layers[l];
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			const bk_weight *w = ly->w[mod];
			bk_q4 q;
			size_t n = (size_t)w->rows * w->cols;
			float *in = xmalloc(n * sizeof(float)); /* bf16 compute: from bf16 values */
			for (size_t i = 0; i < n; i++)
				in[i] = q4->compute_bf16 ? bk_q4_bf16_round(((float *)w->data)[i])
							 : ((float *)w->data)[i];
			bk_q4_quantize(&q, in, w->rows, w->cols, q4->type, q4->double_quant, 0);
			free(in);
			float *d = xmalloc((size_t)w->rows * w->cols * sizeof(float));
			bk_q4_dequantize(&q, d, q4->compute_bf16);
			bk_q4_free(&q);
			owned[l * BK_LORA_NMOD + mod] = d;
		}
		float **o = owned + l * BK_LORA_NMOD;
		lw[l] = (bk_llama_layer_weights){
			.wq = o[0], .wk = o[1], .wv = o[2], .wo = o[3], .w_gate = o[4], .w_up = o[5],
			.w_down = o[6], .attn_norm = ly->attn_norm->data, .mlp_norm = ly->mlp_norm->data};
	}
	bk_llama_weights w = {.embed = m->embed->data, .final_norm = m->final_norm->data,
			      .lm_head = m->lm_head->data, .layers = lw};
	bk_llama_config cfg = *c;
	cfg.q4 = (bk_q4_config){0};
	bk_model *twin = bk_model_create(&bk_ops_host, &cfg, &w);
	for (int i = 0; i < c->L * BK_LORA_NMOD; i++)
		free(owned[i]);
	free(owned), free(lw);
	return twin;
}

static void check_config(int type, int dq, int bf16)
{
	bk_q4_config q4 = {type, dq, bf16, 0};
	const char *what = bk_q4_name(type);
	bk_loaded_model lq = bk_model_load_q4(&bk_ops_host, MODEL, &q4);
	const bk_model *mq = lq.model;
	for (int l = 0; l < mq->cfg.L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++)
			CHECK(mq->layers[l].w[mod]->kind == BK_WEIGHT_Q4, "%s: layer %d module %d kind",
			      what, l, mod);
	CHECK(mq->embed->kind == BK_WEIGHT_PLAIN && mq->final_norm->kind == BK_WEIGHT_PLAIN &&
		      mq->layers[0].attn_norm->kind == BK_WEIGHT_PLAIN,
	      "%s: embeddings and norms stay as they are", what);
	CHECK(!strcmp(lq.fingerprint, base->fingerprint), "%s: the checkpoint's fingerprint", what);
	if (bf16) {
		int all = 1;
		const bk_weight *w = mq->layers[1].w[BK_LORA_DOWN];
		for (size_t i = 0; i < (size_t)w->rows * w->cols; i++) {
			float v = ((const float *)w->data)[i];
			all &= bk_q4_bf16_round(v) == v;
		}
		CHECK(all, "%s: compute dtype bf16: the weights are bf16 values", what);
	}
	bk_model *twin = dequantised_twin(&q4);
	size_t H = (size_t)mq->cfg.H, nf = 0, nf2 = 0, nf3 = 0;
	float *hq = xmalloc(T * H * 4), *ht = xmalloc(T * H * 4), *hb = xmalloc(T * H * 4);
	float *gq = xmalloc(1 << 22), *gt = xmalloc(1 << 22), *gb = xmalloc(1 << 22);
	run(mq, hq, gq, &nf);
	run(twin, ht, gt, &nf2);
	run(base->model, hb, gb, &nf3);
	CHECK(nf == nf2 && nf == nf3 && nf * 4 < (1 << 22), "%s: flat sizes", what);
	CHECK(!memcmp(hq, ht, T * H * 4), "%s: forward equals the dequantised model's", what);
	CHECK(!memcmp(gq, gt, nf * 4), "%s: LoRA gradients equal the dequantised model's", what);
	double dh = bk_max_relerr(hq, hb, T * H, 1e-6), dg = bk_max_relerr(gq, gb, nf, 1e-6);
	/* 4 bits move a tiny model's hidden states by percents, not by nothing, not wholly */
	CHECK(dh > 1e-3 && dh < 0.5, "%s: hidden vs the unquantised model: rel %.3g", what, dh);
	CHECK(dg > 1e-3 && dg < 1.0, "%s: gradient vs the unquantised model: rel %.3g", what, dg);
	fprintf(stderr, "%s dq %d bf16 %d: vs unquantised: hidden rel %.4f, LoRA grad rel %.4f\n",
		what, dq, bf16, dh, dg);
	free(hq), free(ht), free(hb), free(gq), free(gt), free(gb);
	bk_model_free(twin);
	bk_model_unload(&lq);
}

static void load_on_plain(void *arg)
{
	(void)arg;
	bk_ops plain = bk_ops_host;
	plain.name = "plain";
	plain.weight_upload_q4 = NULL;
	bk_q4_config q4 = {BK_Q4_NF4, 1, 0, 0};
	bk_model_load_q4(&plain, MODEL, &q4);
}

int main(void)
{
	bk_diag_init("test_qlora_model");
	/* first, before OpenMP has threads to leave behind in the forked child */
	bk_expect_die("a device without 4-bit linears", load_on_plain, NULL, "plain",
		      "no 4-bit linears");
	bk_loaded_model lb = bk_model_load(&bk_ops_host, MODEL);
	base = &lb;
	check_config(BK_Q4_NF4, 1, 0);
	check_config(BK_Q4_NF4, 0, 0);
	check_config(BK_Q4_FP4, 1, 0);
	check_config(BK_Q4_NF4, 1, 1);
	bk_model_unload(&lb);
	return bk_test_done("test_qlora_model");
}
