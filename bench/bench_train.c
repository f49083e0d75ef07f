/* bench_train.c - forward + backward tokens/s of the host twin on a random Llama of
 * a given shape: teacher forward (adapter off), student forward with LoRA on all seven
 * projections, chunked exact KL over the response rows, LoRA backward, AdamW step.
 * Usage: bench_train H L NH NKV I V R SEQS LEN [STEPS]   (prints one line) */
#include "common/diag.h"
#include "common/rng.h"
#include "gpu/loss.h"
#include "gpu/model.h"
#include "gpu/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *randn(bk_rng *r, size_t n, float scale)
{
	float *p = xmalloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = scale * (float)(2 * bk_rng_uniform(r) - 1);
	return p;
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	if (argc < 10)
		die_usage("usage: bench_train H L NH NKV I V R SEQS LEN [STEPS]");
	int H = atoi(argv[1]), L = atoi(argv[2]), NH = atoi(argv[3]), NKV = atoi(argv[4]),
	    I = atoi(argv[5]), V = atoi(argv[6]), R = atoi(argv[7]), S = atoi(argv[8]),
	    LEN = atoi(argv[9]), steps = argc > 10 ? atoi(argv[10]) : 3, D = H / NH;
	bk_rng rng;
	bk_rng_seed(&rng, 1);
	float *inv = xmalloc((size_t)D / 2 * sizeof *inv);
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	bk_llama_config cfg = {H, I, L, NH, NKV, D, V, 1e-5f, inv, 0};
	bk_llama_layer_weights *lw = xcalloc((size_t)L, sizeof *lw);
	float sc = 0.02f;
	for (int l = 0; l < L; l++) {
		lw[l].wq = randn(&rng, (size_t)NH * D * H, sc);
		lw[l].wk = randn(&rng, (size_t)NKV * D * H, sc);
		lw[l].wv = randn(&rng, (size_t)NKV * D * H, sc);
		lw[l].wo = randn(&rng, (size_t)H * NH * D, sc);
		lw[l].w_gate = randn(&rng, (size_t)I * H, sc);
		lw[l].w_up = randn(&rng, (size_t)I * H, sc);
		lw[l].w_down = randn(&rng, (size_t)H * I, sc);
		float *n1 = xmalloc((size_t)H * 4), *n2 = xmalloc((size_t)H * 4);
		for (int i = 0; i < H; i++)
			n1[i] = n2[i] = 1;
		lw[l].attn_norm = n1;
		lw[l].mlp_norm = n2;
	}
	float *fn = xmalloc((size_t)H * 4);
	for (int i = 0; i < H; i++)
		fn[i] = 1;
	float *embed = randn(&rng, (size_t)V * H, 1), *head = randn(&rng, (size_t)V * H, sc);
	bk_llama_weights w = {embed, fn, head, lw};
	const bk_ops *ops = &bk_ops_host;
	bk_model *m = bk_model_create(ops, &cfg, &w);

	int T = S * LEN, resp = LEN / 2; /* second half of each sequence is the response */
	int32_t *ids = xmalloc((size_t)T * 4), *pos = xmalloc((size_t)T * 4),
		*cu = xmalloc((size_t)(S + 1) * 4);
	for (int t = 0; t < T; t++) {
		ids[t] = (int32_t)bk_rng_below(&rng, (uint64_t)V);
		pos[t] = t % LEN;
	}
	for (int s = 0; s <= S; s++)
		cu[s] = s * LEN;
	bk_batch b = {T, S, ids, pos, cu, 1, 7};
	bk_acts *acts = bk_acts_create(m, T, R);
	bk_lora *lo = bk_lora_create(m, R, 2.0f * R, 0.0f, BK_LORA_ALL);
	bk_lora *gr = bk_lora_create_like(m, lo);
	bk_lora_init_peft(m, lo, 1);
	bk_adamw opt;
	bk_adamw_init(&opt, 0.9, 0.999, 1e-8, 0.0);
	bk_adamw_add(&opt, "lora", lo->flat, gr->flat, lo->n_flat);
	int N = S * resp;
	float *th = xmalloc((size_t)T * H * 4), *sh = xmalloc((size_t)T * H * 4),
	      *trows = xmalloc((size_t)N * H * 4), *srows = xmalloc((size_t)N * H * 4),
	      *drows = xmalloc((size_t)N * H * 4), *dh = xmalloc((size_t)T * H * 4);
	int32_t *sample_of = xmalloc((size_t)N * 4);
	double best = 1e30, loss = 0;
	for (int it = 0; it < steps; it++) {
		double t0 = now();
		bk_model_forward(m, NULL, &b, NULL, acts, th);
		bk_model_forward(m, lo, &b, NULL, acts, sh);
		int n = 0;
		for (int s = 0; s < S; s++)
			for (int j = 0; j < resp; j++, n++) {
				size_t row = (size_t)(s * LEN + LEN - resp - 1 + j);
				for (int h = 0; h < H; h++) {
					trows[(size_t)n * H + h] = th[row * H + h];
					srows[(size_t)n * H + h] = sh[row * H + h];
				}
				sample_of[n] = s;
			}
		loss = bk_loss_kl_exact(srows, head, trows, NULL, sample_of, N, S, H, V, 4096, 1.0f,
					drows, NULL);
		for (size_t i = 0; i < (size_t)T * H; i++)
			dh[i] = 0;
		for (int k = 0; k < N; k++) {
			int s = k / resp, j = k % resp;
			size_t row = (size_t)(s * LEN + LEN - resp - 1 + j);
			for (int h = 0; h < H; h++)
				dh[row * H + h] = drows[(size_t)k * H + h];
		}
		bk_adamw_zero_grad(&opt);
		bk_model_backward(m, lo, &b, acts, dh, gr);
		bk_adamw_clip_grad_norm(&opt, 1.0);
		bk_adamw_step(&opt, 1e-4);
		double dt = now() - t0;
		if (dt < best)
			best = dt;
	}
	long params = (long)V * H * 2 + (long)L * (2L * NH * D * H + 2L * NKV * D * H + 3L * I * H);
	printf("bakery host twin: %.1fM params, %d x %d tokens, LoRA r=%d: %.0f tokens/s "
	       "(best of %d steps, %.3f s/step, loss %.4f)\n",
	       params / 1e6, S, LEN, R, T / best, steps, best, loss);
	return 0;
}
