/* bench_step.c - one baking training step on a random Llama of a given shape, entirely
 * through an op table (host twin or CUDA): teacher forward (adapter off) on the teacher's
 * sequence, student forward with LoRA on all seven projections on the student's sequence
 * (other prompt tokens, the same response tokens: the two see different inputs, so the
 * KL and every gradient are non-zero), gather of the response rows, exact KL with its
 * hidden-row gradient (ops->kl_exact), scatter, LoRA backward, global-norm clip and
 * AdamW (ops->grad_sumsq, ops->scale, ops->adamw_step).  LoRA B starts non-zero (random,
 * as after some training) so the backward GEMMs multiply real numbers.
 * Per-phase times (teacher forward, student forward, loss, backward, optimizer) come
 * from CUDA events on the GPU (recorded on the legacy default stream, which orders with
 * the op table's blocking stream), from the wall clock on the host; the first step is a
 * warm-up, phases are the mean of the others, step_s the best; cpu_s (the best step's
 * CPU seconds of the whole process, every thread) and phases_cpu_ms (their means per
 * phase) are the host's steadier measure on a loaded machine (CUDA: host-side CPU
 * time, not the GPU's).  Prints one line of
 * key=value pairs for tests/gpu/run.sh: tokens/s, model TFLOP/s, MFU as 6 N FLOPs per
 * token (N = the base model's parameters) over --peak-tflops (the bf16 GEMM rate
 * tests/gpu/gemm_bench measured in the same run), and the allocator's peak memory.
 * Not a correctness check (test_cuda_ops and the bk-step comparison are).
 * Usage: bench_step [--device cpu|cuda] [--grad-checkpoint] [--peak-tflops X]
 *                   H L NH NKV I V R SEQS LEN [STEPS] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/cuda/cuda.h"
#include "gpu/device.h"
#include "gpu/model.h"

#ifdef BK_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

enum { PH_TEACHER, PH_STUDENT, PH_LOSS, PH_BACKWARD, PH_OPTIM, NPH };
static const char *const ph_name[NPH] = { "teacher_fwd", "student_fwd", "loss", "backward",
					   "optim" };

/* phase marks: CUDA events on the GPU, the wall clock on the host */
typedef struct {
	int cuda;
	double wall[NPH + 1], cpu[NPH + 1];
#ifdef BK_HAVE_CUDA
	cudaEvent_t ev[NPH + 1];
#endif
} marks;

static void check_cuda(int ok, const char *what)
{
	if (!ok)
		die("bench_step: %s failed", what);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CPU seconds of the whole process (every thread), for timing on a loaded machine */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
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

static void marks_init(marks *mk, int cuda)
{
	mk->cuda = cuda;
#ifdef BK_HAVE_CUDA
	if (cuda)
		for (int i = 0; i <= NPH; i++)
			check_cuda(cudaEventCreate(&mk->ev[i]) == cudaSuccess, "cudaEventCreate");
#else
	check_cuda(!cuda, "CUDA events without CUDA");
#endif
}

static void mark(marks *mk, int i)
{
#ifdef BK_HAVE_CUDA
	if (mk->cuda) {
		check_cuda(cudaEventRecord(mk->ev[i], 0) == cudaSuccess, "cudaEventRecord");
		return;
	}
#endif
	mk->wall[i] = now();
	mk->cpu[i] = cpu_now();
}

/* seconds of each phase of the step just marked (waits for its end); cpu (host only:
 * else left) the CPU seconds of each */
static void marks_read(marks *mk, double *sec, double *cpu)
{
#ifdef BK_HAVE_CUDA
	if (mk->cuda) {
		check_cuda(cudaEventSynchronize(mk->ev[NPH]) == cudaSuccess, "cudaEventSynchronize");
		for (int i = 0; i < NPH; i++) {
			float ms = 0;
			check_cuda(cudaEventElapsedTime(&ms, mk->ev[i], mk->ev[i + 1]) == cudaSuccess,
				   "cudaEventElapsedTime");
			sec[i] = 1e-3 * ms;
		}
		return;
	}
#endif
	for (int i = 0; i < NPH; i++) {
		sec[i] = mk->wall[i + 1] - mk->wall[i];
		cpu[i] = mk->cpu[i + 1] - mk->cpu[i];
	}
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
	double peak_tflops = 0;
	for (; a < argc && argv[a][0] == '-'; a++) {
		if (!strcmp(argv[a], "--device") && a + 1 < argc)
			device = argv[++a];
		else if (!strcmp(argv[a], "--grad-checkpoint"))
			ckpt = 1;
		else if (!strcmp(argv[a], "--peak-tflops") && a + 1 < argc) {
			char *e;
			peak_tflops = strtod(argv[++a], &e);
			if (*e || !(peak_tflops > 0))
				die_usage("--peak-tflops '%s': a positive number", argv[a]);
		} else
			die_usage("unknown option '%s'", argv[a]);
	}
	if (argc - a < 9)
		die_usage("usage: bench_step [--device cpu|cuda] [--grad-checkpoint] [--peak-tflops X] "
			  "H L NH NKV I V R SEQS LEN [STEPS]");
	int H = atoi(argv[a]), L = atoi(argv[a + 1]), NH = atoi(argv[a + 2]),
	    NKV = atoi(argv[a + 3]), I = atoi(argv[a + 4]), V = atoi(argv[a + 5]),
	    R = atoi(argv[a + 6]), S = atoi(argv[a + 7]), LEN = atoi(argv[a + 8]),
	    steps = argc - a > 9 ? atoi(argv[a + 9]) : 3;
	if (H <= 0 || L <= 0 || NH <= 0 || NKV <= 0 || NH % NKV || H % NH || (H / NH) % 2 ||
	    I <= 0 || V <= 1 || R <= 0 || S <= 0 || LEN < 4 || steps < 2)
		die_usage("bench_step: bad shape (H %% NH == 0, even head dim, NH %% NKV == 0, LEN >= 4, "
			  "STEPS >= 2: one warm-up and at least one timed step)");
	int D = H / NH;
	const bk_ops *ops = bk_device_select(device);
	int on_cuda = 0;
#ifdef BK_HAVE_CUDA
	on_cuda = ops == &bk_ops_cuda;
#endif
	bk_rng rng;
	bk_rng_seed(&rng, 1);
	float *inv = xmalloc((size_t)D / 2 * sizeof *inv);
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	bk_llama_config cfg = { .H = H, .I = I, .L = L, .NH = NH, .NKV = NKV, .D = D, .V = V,
				.rms_eps = 1e-5f, .inv_freq = inv };
	bk_llama_layer_weights *lw = xcalloc((size_t)L, sizeof *lw);
	/* one random matrix per shape shared by every layer: the upload converts each
	 * separately, so device memory and time are those of distinct weights.  Scales
	 * 1/sqrt(in) keep activations O(1) through the layers (as a trained model's). */
	float *wq = urand(&rng, (size_t)NH * D * H, 1.0f / sqrtf((float)H)),
	      *wkv = urand(&rng, (size_t)NKV * D * H, 1.0f / sqrtf((float)H)),
	      *wo = urand(&rng, (size_t)H * NH * D, 1.0f / sqrtf((float)(NH * D))),
	      *wi = urand(&rng, (size_t)I * H, 1.0f / sqrtf((float)H)),
	      *wd = urand(&rng, (size_t)H * I, 1.0f / sqrtf((float)I)), *n1 = ones(H);
	for (int l = 0; l < L; l++)
		lw[l] = (bk_llama_layer_weights){ .wq = wq, .wk = wkv, .wv = wkv, .wo = wo,
						  .w_gate = wi, .w_up = wi, .w_down = wd,
						  .attn_norm = n1, .mlp_norm = n1 };
	/* the LM head at 4/sqrt(H): logits of a few units, a peaked distribution as a trained
	 * model's (a flat one makes every KL and gradient tiny) */
	float *embed = urand(&rng, (size_t)V * H, 1),
	      *head = urand(&rng, (size_t)V * H, 4.0f / sqrtf((float)H));
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

	/* each sequence: a prompt (first half), then the response (second half).  The
	 * teacher's prompt tokens differ from the student's (the system prompt is what
	 * differs in baking); the response tokens are the same. */
	int T = S * LEN, resp = LEN / 2;
	int N = S * resp;
	int32_t *sids = xmalloc((size_t)T * 4), *tids = xmalloc((size_t)T * 4),
		*pos = xmalloc((size_t)T * 4), *cu = xmalloc((size_t)(S + 1) * 4),
		*rows = xmalloc((size_t)N * 4), *sample_of = xmalloc((size_t)N * 4);
	for (int t = 0; t < T; t++) {
		sids[t] = (int32_t)bk_rng_below(&rng, (uint64_t)V);
		pos[t] = t % LEN;
		tids[t] = pos[t] < LEN - resp ? (int32_t)bk_rng_below(&rng, (uint64_t)V) : sids[t];
	}
	for (int s = 0; s <= S; s++)
		cu[s] = s * LEN;
	for (int s = 0, n = 0; s < S; s++)
		for (int j = 0; j < resp; j++, n++) {
			rows[n] = s * LEN + LEN - resp - 1 + j; /* positions predicting the response */
			sample_of[n] = s;
		}
	bk_batch bs = { T, S, sids, pos, cu, 1, 7 }, bt = { T, S, tids, pos, cu, 0, 0 };
	bk_acts *acts = bk_acts_create_ckpt(m, T, R, ckpt); /* per-layer recompute when ckpt */
	bk_lora *lo = bk_lora_create(m, R, 2.0f * R, 0.0f, BK_LORA_ALL);
	bk_lora *gr = bk_lora_create_like(m, lo);
	bk_lora_init_peft(m, lo, 1);
	/* B non-zero: every B of the adapter uniform in +-1/sqrt(R) / 4 (A as PEFT makes it) */
	for (int l = 0; l < L; l++)
		for (int mo = 0; mo < BK_LORA_NMOD; mo++) {
			if (!lo->B[l][mo])
				continue;
			int out = mo == BK_LORA_Q ? NH * D : mo == BK_LORA_K || mo == BK_LORA_V ? NKV * D
				  : mo == BK_LORA_GATE || mo == BK_LORA_UP ? I : H;
			float *b = urand(&rng, (size_t)out * R, 0.25f / sqrtf((float)R));
			ops->upload(lo->B[l][mo], b, (size_t)out * R * 4);
			free(b);
		}
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
	if (on_cuda)
		bk_cuda_mem_reset_peak();
#endif
	marks mk;
	marks_init(&mk, on_cuda);
	double best = 1e30, best_cpu = 1e30, loss = 0, loss0 = 0, gnorm = 0, ph[NPH] = { 0 },
	       phc[NPH] = { 0 }, sec[NPH], cpu[NPH] = { 0 };
	for (int it = 0; it < steps; it++) {
		sync_dev(ops);
		double t0 = now(), c0 = cpu_now();
		mark(&mk, PH_TEACHER);
		bk_model_forward(m, NULL, &bt, NULL, acts, th);
		ops->gather_rows(trows, th, rows_d, N, T, H);
		mark(&mk, PH_STUDENT);
		bk_model_forward(m, lo, &bs, NULL, acts, sh);
		ops->gather_rows(srows, sh, rows_d, N, T, H);
		mark(&mk, PH_LOSS);
		loss = ops->kl_exact(srows, m->lm_head, trows, NULL, sample_of, N, S, 4096, 1.0f,
				     m->cfg.final_softcap, drows, NULL);
		ops->zero(dh, (size_t)T * H * 4);
		ops->scatter_rows(dh, drows, rows_d, N, T, H);
		mark(&mk, PH_BACKWARD);
		ops->zero(gr->flat, nf * 4);
		bk_model_backward(m, lo, &bs, acts, dh, gr);
		mark(&mk, PH_OPTIM);
		gnorm = sqrt(ops->grad_sumsq(gr->flat, nf));
		if (gnorm > 1.0)
			ops->scale(gr->flat, 1.0 / (gnorm + 1e-6), nf);
		ops->adamw_step(lo->flat, gr->flat, mom, var, nf, 1e-4, 0.9, 0.999, 1e-8, 0.0,
				it + 1);
		mark(&mk, NPH);
		marks_read(&mk, sec, cpu);
		sync_dev(ops);
		double dt = now() - t0, dc = cpu_now() - c0;
		if (it == 0) {
			loss0 = loss;
			continue; /* warm-up: first-touch allocations, cuBLAS heuristics, clocks */
		}
		for (int p = 0; p < NPH; p++) {
			ph[p] += sec[p] / (steps - 1);
			phc[p] += cpu[p] / (steps - 1);
		}
		if (dt < best)
			best = dt;
		if (dc < best_cpu)
			best_cpu = dc;
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
	/* N: parameters of the base model (embedding, layers, norms, LM head) */
	double nparam = (double)L * (H * QD + 2 * H * KVD + QD * H + 3.0 * H * I + 2.0 * H) +
			2.0 * V * H + H;
	double tps = T / best, mfu = peak_tflops > 0 ? 6 * nparam * tps / (peak_tflops * 1e12) : 0;
	size_t cur = 0, peak = 0, used = 0;
#ifdef BK_HAVE_CUDA
	if (on_cuda) {
		bk_cuda_mem_stats(&cur, &peak);
		used = bk_cuda_mem_used();
	}
#endif
	char phs[256], phcs[256];
	int o = 0, oc = 0;
	for (int p = 0; p < NPH; p++) {
		o += snprintf(phs + o, sizeof phs - (size_t)o, "%s%s:%.2f", p ? "," : "", ph_name[p],
			      1e3 * ph[p]);
		oc += snprintf(phcs + oc, sizeof phcs - (size_t)oc, "%s%s:%.2f", p ? "," : "",
			       ph_name[p], 1e3 * phc[p]);
	}
	char mfus[32] = "?";
	if (peak_tflops > 0)
		snprintf(mfus, sizeof mfus, "%.1f%%", 100 * mfu);
	printf("bench_step device=%s ckpt=%d tokens=%d steps=%d step_s=%.4f tokens_per_s=%.0f "
	       "tflop=%.3f tflops=%.2f params=%.0f mfu_6n=%s peak_tflops=%.1f phases_ms=%s "
	       "cpu_s=%.4f phases_cpu_ms=%s "
	       "peak_bytes=%zu peak_gib=%.2f device_used_bytes=%zu device_used_gib=%.2f "
	       "load_s=%.2f loss0=%.6f loss=%.6f grad_norm=%.4g\n",
	       ops->name, ckpt, T, steps, best, tps, flops / 1e12, flops / best / 1e12, nparam, mfus,
	       peak_tflops, phs, best_cpu, phcs, peak, (double)peak / 1073741824.0, used,
	       (double)used / 1073741824.0, t_load, loss0, loss, gnorm);
	(void)cur;
#ifdef BK_HAVE_CUDA
	if (on_cuda)
		for (int i = 0; i <= NPH; i++)
			cudaEventDestroy(mk.ev[i]);
#endif
	float *dev[] = { mom, var, th, sh, trows, srows, drows, dh };
	for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
		ops->free(dev[i]);
	ops->free(rows_d);
	bk_lora_free(m, gr);
	bk_lora_free(m, lo);
	bk_acts_free(m, acts);
	bk_model_free(m);
	free(inv), free(lw), free(n1), free(sids), free(tids), free(pos), free(cu), free(rows);
	free(sample_of);
	/* different inputs and a non-zero adapter: a zero KL or gradient means the step
	 * measured multiplications of zeros */
	if (!(isfinite(loss) && isfinite(gnorm) && loss0 > 0 && gnorm > 0)) {
		fprintf(stderr, "bench_step: error: loss %g (first step %g), grad norm %g: not a real step\n",
			loss, loss0, gnorm);
		return 1;
	}
	return 0;
}
