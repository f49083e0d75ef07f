/* bench_step.c - one baking training step on a random Llama of a given shape, entirely
 * through an op table (host twin or CUDA): teacher forward (adapter off), student
 * forward with LoRA on all seven projections, gather of the response rows, exact KL
 * with its hidden-row gradient (ops->kl_exact), scatter, LoRA backward, global-norm
 * clip and AdamW (ops->grad_sumsq, ops->scale, ops->adamw_step).  Prints one line of
 * key=value pairs for tests/gpu/run.sh.  Not a correctness check (test_cuda_ops and the
 * bk-step comparison are).
 * Usage: bench_step [--device cpu|cuda] [--grad-checkpoint] H L NH NKV I V R SEQS LEN [STEPS] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/cuda.h"
#include "gpu/device.h"
#include "gpu/model.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *urand(bk_rng *r, size_t n, float scale)
{
	float *p = xmalloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = scale * (float)(2 * bk_rng_uniform(r) - 1);
	return p;
}

static float *ones(int n)
{
	float *p = xmalloc((size_t)n * sizeof *p);
	for (int i = 0; i < n; i++)
		p[i] = 1;
	return p;
}

static void sync_dev(const bk_ops *ops)
{
#ifdef BK_HAVE_CUDA
	if (ops == &bk_ops_cuda)
		bk_cuda_sync();
#else
	(void)ops;
#endif
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	const char *device = "cpu";
	int ckpt = 0, a = 1;
	for (; a < argc && argv[a][0] == '-'; a++) {
		if (!strcmp(argv[a], "--device") && a + 1 < argc)
			device = argv[++a];
		else if (!strcmp(argv[a], "--grad-checkpoint"))
			ckpt = 1;
		else
			die_usage("unknown option '%s'", argv[a]);
	}
	if (argc - a < 9)
		die_usage("usage: bench_step [--device cpu|cuda] [--grad-checkpoint] H L NH NKV I V "
			  "R SEQS LEN [STEPS]");
	int H = atoi(argv[a]), L = atoi(argv[a + 1]), NH = atoi(argv[a + 2]),
	    NKV = atoi(argv[a + 3]), I = atoi(argv[a + 4]), V = atoi(argv[a + 5]),
	    R = atoi(argv[a + 6]), S = atoi(argv[a + 7]), LEN = atoi(argv[a + 8]),
	    steps = argc - a > 9 ? atoi(argv[a + 9]) : 3, D = H / NH;
	const bk_ops *ops = bk_device_select(device);
	bk_rng rng;
	bk_rng_seed(&rng, 1);
	float *inv = xmalloc((size_t)D / 2 * sizeof *inv);
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	bk_llama_config cfg = { H, I, L, NH, NKV, D, V, 1e-5f, inv, 0 };
	bk_llama_layer_weights *lw = xcalloc((size_t)L, sizeof *lw);
	/* one random matrix per shape shared by every layer: the upload converts each
	 * separately, so device memory and time are those of distinct weights */
	float sc = 0.02f;
	float *wq = urand(&rng, (size_t)NH * D * H, sc), *wkv = urand(&rng, (size_t)NKV * D * H, sc),
	      *wo = urand(&rng, (size_t)H * NH * D, sc), *wi = urand(&rng, (size_t)I * H, sc),
	      *wd = urand(&rng, (size_t)H * I, sc), *n1 = ones(H);
	for (int l = 0; l < L; l++)
		lw[l] = (bk_llama_layer_weights){ wq, wkv, wkv, wo, wi, wi, wd, n1, n1 };
	float *embed = urand(&rng, (size_t)V * H, 1), *head = urand(&rng, (size_t)V * H, sc);
	bk_llama_weights w = { embed, n1, head, lw };
	double t_load = now();
	bk_model *m = bk_model_create(ops, &cfg, &w);
	sync_dev(ops);
	t_load = now() - t_load;
	free(wq), free(wkv), free(wo), free(wi), free(wd), free(embed), free(head);

	const char *absent = !ops->gather_rows	 ? "gather_rows"
			     : !ops->scatter_rows ? "scatter_rows"
			     : !ops->kl_exact	  ? "kl_exact"
			     : !ops->adamw_step	  ? "adamw_step"
			     : !ops->grad_sumsq	  ? "grad_sumsq"
			     : !ops->scale	  ? "scale"
			     : !ops->attention_forward ? "attention_forward"
			     : !ops->attention_backward ? "attention_backward"
						     : NULL;
	if (absent) {
		printf("bench_step device=%s absent=%s\n", ops->name, absent);
		return 1;
	}

	int T = S * LEN, resp = LEN / 2; /* second half of each sequence is the response */
	int N = S * resp;
	int32_t *ids = xmalloc((size_t)T * 4), *pos = xmalloc((size_t)T * 4),
		*cu = xmalloc((size_t)(S + 1) * 4), *rows = xmalloc((size_t)N * 4),
		*sample_of = xmalloc((size_t)N * 4);
	for (int t = 0; t < T; t++) {
		ids[t] = (int32_t)bk_rng_below(&rng, (uint64_t)V);
		pos[t] = t % LEN;
	}
	for (int s = 0; s <= S; s++)
		cu[s] = s * LEN;
	for (int s = 0, n = 0; s < S; s++)
		for (int j = 0; j < resp; j++, n++) {
			rows[n] = s * LEN + LEN - resp - 1 + j; /* positions predicting the response */
			sample_of[n] = s;
		}
	bk_batch b = { T, S, ids, pos, cu, 1, 7 };
	bk_acts *acts = bk_acts_create_ckpt(m, T, R, ckpt); /* per-layer recompute when ckpt */
	bk_lora *lo = bk_lora_create(m, R, 2.0f * R, 0.0f, BK_LORA_ALL);
	bk_lora *gr = bk_lora_create_like(m, lo);
	bk_lora_init_peft(m, lo, 1);
	size_t nf = lo->n_flat;
	float *mom = ops->alloc(nf * 4), *var = ops->alloc(nf * 4);
	ops->zero(mom, nf * 4);
	ops->zero(var, nf * 4);
	int32_t *rows_d = ops->alloc((size_t)N * 4);
	ops->upload(rows_d, rows, (size_t)N * 4);
	float *th = ops->alloc((size_t)T * H * 4), *sh = ops->alloc((size_t)T * H * 4),
	      *trows = ops->alloc((size_t)N * H * 4), *srows = ops->alloc((size_t)N * H * 4),
	      *drows = ops->alloc((size_t)N * H * 4), *dh = ops->alloc((size_t)T * H * 4);
#ifdef BK_HAVE_CUDA
	if (ops == &bk_ops_cuda)
		bk_cuda_mem_reset_peak();
#endif
	double best = 1e30, loss = 0, gnorm = 0;
	for (int it = 0; it < steps; it++) {
		sync_dev(ops);
		double t0 = now();
		bk_model_forward(m, NULL, &b, NULL, acts, th);
		ops->gather_rows(trows, th, rows_d, N, T, H);
		bk_model_forward(m, lo, &b, NULL, acts, sh);
		ops->gather_rows(srows, sh, rows_d, N, T, H);
		loss = ops->kl_exact(srows, m->lm_head, trows, NULL, sample_of, N, S, 4096, 1.0f,
				     drows, NULL);
		ops->zero(dh, (size_t)T * H * 4);
		ops->scatter_rows(dh, drows, rows_d, N, T, H);
		ops->zero(gr->flat, nf * 4);
		bk_model_backward(m, lo, &b, acts, dh, gr);
		gnorm = sqrt(ops->grad_sumsq(gr->flat, nf));
		if (gnorm > 1.0)
			ops->scale(gr->flat, 1.0 / (gnorm + 1e-6), nf);
		ops->adamw_step(lo->flat, gr->flat, mom, var, nf, 1e-4, 0.9, 0.999, 1e-8, 0.0,
				it + 1);
		sync_dev(ops);
		double dt = now() - t0;
		if (dt < best)
			best = dt;
	}

	/* model FLOPs of one step (no recompute counted): linears 2*T*in*out; LoRA
	 * 2*T*R*(in+out) forward, twice that backward; causal attention 2*NH*D*len^2
	 * forward (QK^T and PV, half of each), twice that backward; LM head 2*N*V*H for
	 * the teacher and the student logits and again for d_hidden. */
	double QD = (double)NH * D, KVD = (double)NKV * D;
	double lin = 2.0 * T * L * (H * QD + 2 * H * KVD + QD * H + 3.0 * H * I);
	double lora = 2.0 * T * L * R * ((H + QD) + 2 * (H + KVD) + (QD + H) + 3.0 * (H + I));
	double att = 2.0 * NH * D * (double)LEN * LEN * S * L;
	double headf = 2.0 * N * (double)V * H;
	double flops = (lin + att + headf)          /* teacher forward */
		       + (lin + lora + att + headf) /* student forward */
		       + (lin + 2 * lora + 2 * att + headf); /* backward: dx, LoRA, d_hidden */
	size_t cur = 0, peak = 0, used = 0;
#ifdef BK_HAVE_CUDA
	if (ops == &bk_ops_cuda) {
		bk_cuda_mem_stats(&cur, &peak);
		used = bk_cuda_mem_used();
	}
#endif
	printf("bench_step device=%s tokens=%d steps=%d step_s=%.4f tokens_per_s=%.0f "
	       "tflop=%.3f tflops=%.2f peak_bytes=%zu device_used_bytes=%zu load_s=%.2f "
	       "loss=%.6f grad_norm=%.4g\n",
	       ops->name, T, steps, best, T / best, flops / 1e12, flops / best / 1e12, peak, used,
	       t_load, loss, gnorm);
	(void)cur;
	return isfinite(loss) && isfinite(gnorm) ? 0 : 1;
}
