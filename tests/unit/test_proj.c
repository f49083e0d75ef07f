/* test_proj.c - the projection-group ops of the host twin (bk_ops.proj_forward /
 * proj_backward, gpu/host/host_ops.c) and gpu/model.c's use of them:
 *   - the host's proj ops give, bit for bit, its linear and LoRA ops called member by
 *     member (the order fixes the bits of dx, which every member adds into): groups of
 *     1, 2 and 3 members, a member without LoRA in the middle, dropout on and off;
 *   - a tiny random Llama's forward (hidden) and backward (every LoRA gradient) through
 *     the host's proj ops equal, bit for bit, those of a table without them (the model
 *     then composes linear_forward/lora_forward itself, as for bk_ops_host_rows), with
 *     all targets and a subset, dropout 0 and 0.25, with gradient checkpointing.
 * The CUDA paths (BK_LINEAR=v1/v2) are judged on a GPU by tests/gpu/check_linear.c. */
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/model.h"
#include "tests/harness.h"

static const bk_ops *ops = &bk_ops_host;
static bk_rng rng;

static float *hrand(size_t n, float s)
{
	float *x = xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = s * (float)(2 * bk_rng_uniform(&rng) - 1);
	return x;
}

static float *dup(const float *x, size_t n)
{
	float *y = xmalloc((n ? n : 1) * sizeof(float));
	memcpy(y, x, n * sizeof(float));
	return y;
}

static int same(const float *a, const float *b, size_t n)
{
	return memcmp(a, b, n * sizeof(float)) == 0;
}

static void check_group(int T, int in, int n, const int *outs, const int *lora, int R,
			float drop)
{
	float *x = hrand((size_t)T * in, 1), *dx0 = hrand((size_t)T * in, 0.5f);
	float *W[BK_PROJ_MAX], *A[BK_PROJ_MAX], *B[BK_PROJ_MAX], *dy[BK_PROJ_MAX];
	float *y1[BK_PROJ_MAX], *y2[BK_PROJ_MAX], *dA1[BK_PROJ_MAX], *dA2[BK_PROJ_MAX];
	float *dB1[BK_PROJ_MAX], *dB2[BK_PROJ_MAX];
	bk_weight *w[BK_PROJ_MAX];
	bk_proj p[BK_PROJ_MAX], q[BK_PROJ_MAX];
	for (int j = 0; j < n; j++) {
		int out = outs[j];
		W[j] = hrand((size_t)out * in, 0.3f);
		w[j] = ops->weight_upload(W[j], out, in);
		A[j] = hrand((size_t)R * in, 0.3f), B[j] = hrand((size_t)out * R, 1);
		dy[j] = hrand((size_t)T * out, 1);
		y1[j] = ops->alloc((size_t)T * out * 4), y2[j] = ops->alloc((size_t)T * out * 4);
		dA1[j] = hrand((size_t)R * in, 0.5f), dA2[j] = dup(dA1[j], (size_t)R * in);
		dB1[j] = hrand((size_t)out * R, 0.5f), dB2[j] = dup(dB1[j], (size_t)out * R);
		p[j] = (bk_proj){ .W = w[j], .A = lora[j] ? A[j] : NULL, .B = lora[j] ? B[j] : NULL,
				  .key = 99 + (uint64_t)j, .y = y1[j], .dy = dy[j], .dA = dA1[j],
				  .dB = dB1[j] };
		q[j] = p[j];
		q[j].y = y2[j], q[j].dA = dA2[j], q[j].dB = dB2[j];
	}
	float *xa1 = ops->alloc((size_t)n * T * R * 4), *xa2 = ops->alloc((size_t)n * T * R * 4);
	float *sc = ops->alloc((size_t)T * (in + R) * 4);
	float *dx1 = dup(dx0, (size_t)T * in), *dx2 = dup(dx0, (size_t)T * in);
	float scale = 1.75f;
	ops->proj_forward(p, n, x, xa1, T, in, R, scale, drop, sc);
	ops->proj_backward(dx1, p, n, x, xa1, T, in, R, scale, drop, sc);
	for (int j = 0; j < n; j++) {
		ops->linear_forward(q[j].y, x, w[j], T);
		if (lora[j])
			ops->lora_forward(q[j].y, xa2 + (size_t)j * T * R, x, A[j], B[j], T, in,
					  outs[j], R, scale, drop, q[j].key, sc);
	}
	for (int j = 0; j < n; j++) {
		ops->linear_backward(dx2, dy[j], w[j], T);
		if (lora[j])
			ops->lora_backward(dx2, dA2[j], dB2[j], dy[j], x, xa2 + (size_t)j * T * R,
					   A[j], B[j], T, in, outs[j], R, scale, drop, q[j].key, sc);
	}
	for (int j = 0; j < n; j++) {
		CHECK(same(y1[j], y2[j], (size_t)T * outs[j]), "y%d: T %d in %d n %d p %g", j, T,
		      in, n, (double)drop);
		CHECK(same(dA1[j], dA2[j], (size_t)R * in), "dA%d: T %d n %d", j, T, n);
		CHECK(same(dB1[j], dB2[j], (size_t)outs[j] * R), "dB%d: T %d n %d", j, T, n);
	}
	CHECK(same(dx1, dx2, (size_t)T * in), "dx: T %d in %d n %d p %g", T, in, n, (double)drop);
	for (int j = 0; j < n; j++) {
		free(W[j]), free(A[j]), free(B[j]), free(dy[j]), free(dA1[j]), free(dA2[j]);
		free(dB1[j]), free(dB2[j]);
		ops->free(y1[j]), ops->free(y2[j]);
		ops->weight_free(w[j]);
	}
	free(x), free(dx0), free(dx1), free(dx2);
	ops->free(xa1), ops->free(xa2), ops->free(sc);
}

/* ---- the model through proj ops vs composed by the model ---- */

enum { H = 32, L = 2, NH = 4, NKV = 2, D = 8, I = 48, V = 40, R = 4, T = 11 };

static void check_model(unsigned targets, float dropout, int ckpt)
{
	static float inv_freq[D / 2];
	for (int i = 0; i < D / 2; i++)
		inv_freq[i] = (float)pow(10000.0, -2.0 * i / D);
	bk_llama_config cfg = { .H = H, .I = I, .L = L, .NH = NH, .NKV = NKV, .D = D, .V = V,
				.rms_eps = 1e-5f, .inv_freq = inv_freq };
	bk_llama_layer_weights lw[L];
	memset(lw, 0, sizeof lw);
	float *all[L][9];
	for (int l = 0; l < L; l++) {
		const float **w[BK_LORA_NMOD] = { &lw[l].wq, &lw[l].wk, &lw[l].wv, &lw[l].wo,
						  &lw[l].w_gate, &lw[l].w_up, &lw[l].w_down };
		for (int m = 0; m < BK_LORA_NMOD; m++) {
			int in, out;
			bk_model_module_dims(&cfg, m, &in, &out);
			*w[m] = all[l][m] = hrand((size_t)out * in, 1.5f / sqrtf((float)in));
		}
		lw[l].attn_norm = all[l][7] = hrand(H, 1);
		lw[l].mlp_norm = all[l][8] = hrand(H, 1);
	}
	float *embed = hrand((size_t)V * H, 1), *fnorm = hrand(H, 1);
	bk_llama_weights hw = { .embed = embed, .final_norm = fnorm, .lm_head = embed,
				.layers = lw };
	cfg.tied = 1;
	int32_t ids[T], pos[T], cu[3] = { 0, 7, T };
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)bk_rng_below(&rng, V), pos[t] = t < 7 ? t : t - 7;
	bk_batch b = { .T = T, .S = 2, .ids = ids, .pos = pos, .cu_seqlens = cu, .train = 1,
		       .dropout_key = 5 };
	bk_ops composed = bk_ops_host;
	composed.proj_forward = NULL;
	composed.proj_backward = NULL;
	const bk_ops *tab[2] = { &bk_ops_host, &composed };
	float *hid[2], *grad[2];
	size_t ng = 0;
	float *c = hrand((size_t)T * H, 1);
	for (int k = 0; k < 2; k++) {
		bk_rng_seed(&rng, 77); /* the same adapter both times */
		bk_model *m = bk_model_create(tab[k], &cfg, &hw);
		bk_lora *lo = bk_lora_create(m, R, 8.0f, dropout, targets);
		bk_lora_init_peft(m, lo, 3);
		float *hb = hrand(lo->n_flat, 0.5f); /* B != 0 */
		float *flat = xmalloc(lo->n_flat * sizeof(float));
		tab[k]->download(flat, lo->flat, lo->n_flat * sizeof(float));
		for (int l = 0; l < L; l++)
			for (int mod = 0; mod < BK_LORA_NMOD; mod++)
				if (lo->B[l][mod]) {
					int in, out;
					bk_model_module_dims(&cfg, mod, &in, &out);
					size_t off = (size_t)(lo->B[l][mod] - lo->flat);
					memcpy(flat + off, hb + off, (size_t)out * R * sizeof(float));
				}
		tab[k]->upload(lo->flat, flat, lo->n_flat * sizeof(float));
		bk_lora *g = bk_lora_create_like(m, lo);
		bk_acts *a = bk_acts_create_ckpt(m, T, R, ckpt);
		hid[k] = tab[k]->alloc((size_t)T * H * 4);
		bk_model_forward(m, lo, &b, NULL, a, hid[k]);
		bk_model_backward(m, lo, &b, a, c, g);
		ng = g->n_flat;
		grad[k] = xmalloc(ng * sizeof(float));
		tab[k]->download(grad[k], g->flat, ng * sizeof(float));
		bk_acts_free(m, a);
		bk_lora_free(m, g);
		bk_lora_free(m, lo);
		bk_model_free(m);
		free(hb), free(flat);
	}
	CHECK(same(hid[0], hid[1], (size_t)T * H), "model hidden: targets %#x p %g ckpt %d",
	      targets, (double)dropout, ckpt);
	CHECK(same(grad[0], grad[1], ng), "model grads: targets %#x p %g ckpt %d", targets,
	      (double)dropout, ckpt);
	double gs = 0;
	for (size_t i = 0; i < ng; i++)
		gs += fabs(grad[0][i]);
	CHECK(gs > 0, "the gradients are not all zero");
	for (int k = 0; k < 2; k++)
		bk_ops_host.free(hid[k]), free(grad[k]);
	free(c), free(embed), free(fnorm);
	for (int l = 0; l < L; l++)
		for (int i = 0; i < 9; i++)
			free(all[l][i]);
}

int main(void)
{
	bk_rng_seed(&rng, 20261201);
	static const int o3[3] = { 24, 8, 8 }, l3[3] = { 1, 1, 1 }, l101[3] = { 1, 0, 1 };
	static const int o2[2] = { 37, 37 }, l2[2] = { 1, 1 }, o1[1] = { 16 }, l1[1] = { 1 };
	static const int l0[3] = { 0, 0, 0 };
	for (int p = 0; p < 2; p++) {
		float drop = p ? 0.2f : 0.0f;
		check_group(1, 24, 3, o3, l3, 4, drop);
		check_group(13, 24, 3, o3, l101, 4, drop);
		check_group(13, 33, 2, o2, l2, 5, drop);
		check_group(9, 37, 1, o1, l1, 3, drop);
		check_group(9, 24, 3, o3, l0, 0, drop);
	}
	check_model(BK_LORA_ALL, 0, 0);
	check_model(BK_LORA_ALL, 0.25f, 0);
	check_model(1u << BK_LORA_Q | 1u << BK_LORA_V | 1u << BK_LORA_UP, 0.25f, 1);
	return bk_test_done("test_proj");
}
