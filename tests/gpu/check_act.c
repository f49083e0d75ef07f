/* check_act.c - BK_ACT=bf16 (gpu/cuda/cuda_act.cuh: bf16 activations on the CUDA training
 * path) against the host twin and against BK_ACT=fp32, on a GPU.  Run by tests/gpu/run.sh
 * (once as the environment has it and once with BK_ATTN=tc, so both attention kernels
 * are ranked under both activation types).
 *   1. the act ops on their own, against the host twin's fp32 ops on bf16-exact inputs,
 *      with the bounds of cuda_act.cuh (u = 2^-8): rmsnorm_forward_act, rope_forward_act,
 *      to_act, glu_forward_act / glu_backward_act (SwiGLU and GeGLU),
 *      attention_forward_act / backward_act, proj_forward_act / backward_act (q/k/v group,
 *      LoRA r 16, dropout 0 and 0.1): relative errors max|d - h| / max|h| against the
 *      bound named on each line;
 *   2. one training step (forward, a loss 0.5 |hidden - Y|^2 with d_hidden = hidden - Y,
 *      backward into the LoRA gradients of all 7 modules, r 16) on a small model (H 256,
 *      I 688, 2 layers, 4/2 heads of 64, 4 x 64 tokens), the same with every family
 *      delta on (q/k/v bias, q/k norms, GeGLU, sandwich norms: model.c's other bf16
 *      branches) and on a TinyLlama-1.1B-shaped one
 *      (H 2048, I 5632, 32/4 heads of 64, 16 x 256 tokens, 2 layers: the host twin's
 *      share of the run; vocabulary 4096, as the loss does not use the LM head), each with BK_ACT=fp32 and bf16 against the host twin: the loss,
 *      the final hidden state and every LoRA gradient tensor as relative L2 errors
 *      |x - h| / |h|.  fp32 mode: <= 0.05 (bf16 weights and GEMM inputs); bf16 mode:
 *      <= sqrt(e_fp32^2 + 9 L (4 u)^2) for the same tensor (cuda_act.cuh's compounding;
 *      the worst tensor is printed); the loss: |dl| / l <= 2 e_hidden |h| / |h - Y| +
 *      1e-6 (+ the second-order term);
 *   3. timings (no checks): the TinyLlama-shaped step, fp32 and bf16 alternately in one
 *      process (CUDA events around 5 steps after one warm-up): ms per step, tokens/s, the
 *      bf16/fp32 speed ratio and bk_acts_bytes of each; lines "act step ...".
 * --host: part 2 at the small shape with the host twin on both sides (the dry run
 * without a GPU: the program's own plumbing; bf16 lines say skipped).  --quick: the
 * small shape only.  --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU):
 * part 1 at T 42, H 128, I 352 (8/2 heads of 64, r 8), part 2 at H 128, I 352, 2/1
 * heads of 64, 2 x 32 tokens, r 8 (with and without the deltas), part 3 on that shape
 * (1 step timed, not 5).
 * One line per check; exit 1 on any failure.  Usage: check_act [--host] [--quick | --tiny] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/cuda/cuda.h"
#include "gpu/model.h"
#include "tests/gpu/gpu_check.h"
#include "tests/harness.h"

static const double U = 0x1p-8; /* one bf16 rounding (cuda_act.cuh) */
static bk_rng rng;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void verdict(int ok, const char *what)
{
	printf("%-100s %s\n", what, ok ? "ok" : "FAIL");
	fflush(stdout);
	CHECK(ok, "%s", what);
}

/* |a - b| / |b| over n values (double sums); INFINITY on NaN */
static double rel_l2(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double d = (double)a[i] - b[i];
		if (isnan(a[i]) || isnan(d))
			return INFINITY;
		num += d * d;
		den += (double)b[i] * b[i];
	}
	return den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0);
}

/* ---- the model step ---- */

typedef struct {
	int H, I, L, NH, NKV, V, S, len, R;
	const char *name;
	int deltas; /* every family delta on: q/k/v bias, q/k norms, GeGLU, sandwich norms */
} shape;

typedef struct { /* host copies of what a step produced */
	float *hidden;  /* [T,H] */
	float *grads;   /* [n_flat] */
	double loss;
	size_t n_flat, acts_bytes;
	double ms;      /* per step (timed runs), else 0 */
} step_out;

static float *brand(size_t n, double scale) { return gc_rand_bf16(&rng, n, (float)scale); }

/* bf16-exact random weights (so the host twin and the device hold the same numbers) */
static bk_model *make_model(const bk_ops *ops, const shape *sh, uint64_t seed)
{
	bk_rng_seed(&rng, seed);
	int H = sh->H, I = sh->I, NH = sh->NH, NKV = sh->NKV, D = H / NH, L = sh->L, V = sh->V;
	float *inv = xmalloc((size_t)D / 2 * sizeof *inv);
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	bk_llama_config cfg = { .H = H, .I = I, .L = L, .NH = NH, .NKV = NKV, .D = D, .V = V,
				.rms_eps = 1e-5f, .inv_freq = inv };
	bk_llama_layer_weights *lw = xcalloc((size_t)L, sizeof *lw);
	float *wq = brand((size_t)NH * D * H, 1.0 / sqrt(H)), *wk = brand((size_t)NKV * D * H, 1.0 / sqrt(H));
	float *wv = brand((size_t)NKV * D * H, 1.0 / sqrt(H)), *wo = brand((size_t)H * NH * D, 1.0 / sqrt(NH * D));
	float *wg = brand((size_t)I * H, 1.0 / sqrt(H)), *wu = brand((size_t)I * H, 1.0 / sqrt(H));
	float *wd = brand((size_t)H * I, 1.0 / sqrt(I));
	float *n1 = xmalloc((size_t)H * sizeof(float)), *n2 = xmalloc((size_t)H * sizeof(float));
	for (int i = 0; i < H; i++)
		n1[i] = gc_bf16(1.0f + 0.25f * (float)(2 * bk_rng_uniform(&rng) - 1)),
		n2[i] = gc_bf16(1.0f + 0.25f * (float)(2 * bk_rng_uniform(&rng) - 1));
	/* the family deltas' weights (Qwen2 bias, Qwen3 / Gemma-3 q/k norms, Gemma sandwich) */
	float *bq = brand((size_t)NH * D, 0.5), *bkv = brand((size_t)NKV * D, 0.5);
	float *qn = xmalloc((size_t)D * sizeof(float));
	for (int i = 0; i < D; i++)
		qn[i] = gc_bf16(1.0f + 0.25f * (float)(2 * bk_rng_uniform(&rng) - 1));
	if (sh->deltas)
		cfg.qkv_bias = cfg.qk_norm = cfg.geglu = cfg.sandwich = 1;
	for (int l = 0; l < L; l++)
		lw[l] = (bk_llama_layer_weights){ .wq = wq, .wk = wk, .wv = wv, .wo = wo,
						  .w_gate = wg, .w_up = wu, .w_down = wd,
						  .attn_norm = n1, .mlp_norm = n2, .bq = bq, .bk = bkv,
						  .bv = bkv, .q_norm = qn, .k_norm = qn,
						  .post_attn_norm = n2, .post_mlp_norm = n1 };
	float *embed = brand((size_t)V * H, 1.0);
	bk_llama_weights w = { embed, n2, embed, lw };
	cfg.tied = 1;
	bk_model *m = bk_model_create(ops, &cfg, &w);
	free(wq), free(wk), free(wv), free(wo), free(wg), free(wu), free(wd), free(n1), free(n2);
	free(bq), free(bkv), free(qn);
	free(embed), free(lw), free(inv);
	return m;
}

/* one training step of the shape on ops in the current BK_ACT mode (reps > 0: also timed
 * over reps steps after a warm-up) */
static step_out run_step(const bk_ops *ops, const shape *sh, int reps)
{
	bk_model *m = make_model(ops, sh, 7);
	int T = sh->S * sh->len, H = sh->H;
	bk_lora *lo = bk_lora_create(m, sh->R, 2.0f * sh->R, 0.0f, BK_LORA_ALL);
	bk_lora *g = bk_lora_create_like(m, lo);
	bk_rng_seed(&rng, 11);
	float *fl = gc_rand(&rng, lo->n_flat, 0.02f); /* A and B both nonzero: every gradient lives */
	ops->upload(lo->flat, fl, lo->n_flat * sizeof(float));
	free(fl);
	int32_t *ids = xmalloc((size_t)T * 4), *pos = xmalloc((size_t)T * 4);
	int32_t *cu = xmalloc((size_t)(sh->S + 1) * 4);
	for (int s = 0; s <= sh->S; s++)
		cu[s] = s * sh->len;
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)bk_rng_below(&rng, (uint64_t)sh->V), pos[t] = t % sh->len;
	float *Y = gc_rand(&rng, (size_t)T * H, 1.0f);
	bk_batch b = { .T = T, .S = sh->S, .ids = ids, .pos = pos, .cu_seqlens = cu };
	bk_acts *a = bk_acts_create(m, T, sh->R);
	float *hid = ops->alloc((size_t)T * H * 4), *dh = ops->alloc((size_t)T * H * 4);
	step_out o = { .n_flat = lo->n_flat, .acts_bytes = bk_acts_bytes(a) };
	o.hidden = xmalloc((size_t)T * H * 4);
	o.grads = xmalloc(lo->n_flat * 4);
	float *d = xmalloc((size_t)T * H * 4);
	ops->zero(g->flat, g->n_flat * 4);
	bk_model_forward(m, lo, &b, NULL, a, hid);
	ops->download(o.hidden, hid, (size_t)T * H * 4);
	for (size_t i = 0; i < (size_t)T * H; i++) {
		d[i] = o.hidden[i] - Y[i];
		o.loss += 0.5 * (double)d[i] * d[i];
	}
	ops->upload(dh, d, (size_t)T * H * 4);
	bk_model_backward(m, lo, &b, a, dh, g);
	ops->download(o.grads, g->flat, g->n_flat * 4);
	if (reps > 0) { /* the same step again (d_hidden kept), timed */
		bk_model_forward(m, lo, &b, NULL, a, hid);
		bk_model_backward(m, lo, &b, a, dh, g);
#ifdef BK_HAVE_CUDA
		bk_cuda_sync();
#endif
		double t0 = now();
		for (int r = 0; r < reps; r++) {
			bk_model_forward(m, lo, &b, NULL, a, hid);
			bk_model_backward(m, lo, &b, a, dh, g);
		}
#ifdef BK_HAVE_CUDA
		bk_cuda_sync();
#endif
		o.ms = (now() - t0) * 1e3 / reps;
	}
	free(d), free(Y), free(ids), free(pos), free(cu);
	ops->free(hid), ops->free(dh);
	bk_acts_free(m, a);
	bk_lora_free(m, lo), bk_lora_free(m, g);
	bk_model_free(m);
	return o;
}

static void step_free(step_out *o) { free(o->hidden), free(o->grads); }

/* the worst LoRA gradient tensor of got against the host's: relative L2 errors per tensor
 * (A and B of each targeted module of each layer), e32 (NULL or the fp32 mode's per
 * tensor errors) for the bf16 bound; fills err[] */
static double grad_errs(const bk_model *m, const shape *sh, const step_out *got,
			const step_out *host, double *err, int *n)
{
	double worst = 0;
	size_t off = 0;
	*n = 0;
	for (int l = 0; l < sh->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			int in, out;
			bk_model_module_dims(&m->cfg, mod, &in, &out);
			size_t na = (size_t)sh->R * in, nb = (size_t)out * sh->R;
			err[(*n)++] = rel_l2(got->grads + off, host->grads + off, na);
			err[(*n)++] = rel_l2(got->grads + off + na, host->grads + off + na, nb);
			off += na + nb;
		}
	for (int i = 0; i < *n; i++)
		worst = err[i] > worst ? err[i] : worst;
	return worst;
}

/* timed > 0: then that many steps timed (after a warm-up), alternately fp32 and bf16 */
static void check_shape(const bk_ops *dev, const shape *sh, int host_only, int timed)
{
	int T = sh->S * sh->len;
	char what[256];
	step_out h = run_step(&bk_ops_host, sh, 0);
	bk_model *mh = make_model(&bk_ops_host, sh, 7); /* for the module dims */
	int nt = 2 * BK_LORA_NMOD * sh->L, n;
	double *e32 = xcalloc((size_t)nt, sizeof(double)), *e16 = xcalloc((size_t)nt, sizeof(double));
	double eh32 = 0; /* the fp32 mode's hidden-state error */
	for (int mode = 1; mode <= 2; mode++) {
		const char *mn = mode == 1 ? "fp32" : "bf16";
		if (host_only && mode == 2) {
			printf("act %s %s: skipped (--host: the host twin has no bf16 activations)\n",
			       sh->name, mn);
			continue;
		}
#ifdef BK_HAVE_CUDA
		if (!host_only)
			bk_cuda_act_set_mode(mode);
#endif
		step_out o = run_step(dev, sh, 0);
		double eh = rel_l2(o.hidden, h.hidden, (size_t)T * sh->H);
		double *e = mode == 1 ? e32 : e16;
		double worst = grad_errs(mh, sh, &o, &h, e, &n);
		double dl = fabs(o.loss - h.loss) / h.loss;
		/* |h - Y| / |h| from the host's run: loss = 0.5 |h - Y|^2 */
		double hn = 0;
		for (size_t i = 0; i < (size_t)T * sh->H; i++)
			hn += (double)h.hidden[i] * h.hidden[i];
		/* |dl| = |<dh, 2 (h - Y) + dh>| / 2 <= e |h| |h - Y| + e^2 |h|^2 / 2, over l = |h - Y|^2 / 2 */
		double r = eh * sqrt(hn) / sqrt(2 * h.loss), lb = 2 * r + r * r + 1e-6;
		double bh = 0.05;
		if (mode == 1) {
			eh32 = eh;
			snprintf(what, sizeof what, "act %s %s (%s, %d tokens): hidden rel L2 %.3e (bound %.2g)",
				 sh->name, mn, dev->name, T, eh, bh);
			verdict(eh <= bh, what);
			snprintf(what, sizeof what,
				 "act %s %s: worst of %d LoRA gradient tensors rel L2 %.3e (bound 0.05)",
				 sh->name, mn, n, worst);
			verdict(worst <= 0.05, what);
		} else {
			double k = 4 * U, add = 9.0 * sh->L * k * k;
			bh = sqrt(eh32 * eh32 + add);
			snprintf(what, sizeof what,
				 "act %s %s (%s, %d tokens): hidden rel L2 %.3e (bound sqrt(%.2e^2 + 9 L (4u)^2) = %.2e)",
				 sh->name, mn, dev->name, T, eh, eh32, bh);
			verdict(eh <= bh, what);
			int bad = 0, wi = 0;
			double wr = 0;
			for (int i = 0; i < n; i++) {
				double b = sqrt(e32[i] * e32[i] + add);
				bad += !(e16[i] <= b);
				if (e16[i] / b > wr)
					wr = e16[i] / b, wi = i;
			}
			snprintf(what, sizeof what,
				 "act %s %s: %d of %d LoRA gradient tensors over sqrt(e_fp32^2 + 9 L (4u)^2); worst: tensor %d rel L2 %.3e vs fp32 %.3e (%.2f of its bound)",
				 sh->name, mn, bad, n, wi, e16[wi], e32[wi], wr);
			verdict(bad == 0, what);
		}
		snprintf(what, sizeof what, "act %s %s: loss %.9g vs host %.9g, rel %.2e (bound %.2e)",
			 sh->name, mn, o.loss, h.loss, dl, lb);
		verdict(dl <= lb, what);
		printf("act %s %s: activation memory (bk_acts_bytes) %.1f MiB\n", sh->name, mn,
		       (double)o.acts_bytes / (1 << 20));
		step_free(&o);
	}
	if (timed && !host_only) {
		double ms[3] = { 0, 0, 0 };
		size_t by[3] = { 0, 0, 0 };
		for (int round = 0; round < 2; round++) /* alternately, twice: fp32 bf16 fp32 bf16 */
			for (int mode = 1; mode <= 2; mode++) {
#ifdef BK_HAVE_CUDA
				bk_cuda_act_set_mode(mode);
#endif
				step_out o = run_step(dev, sh, timed);
				if (round == 1 || ms[mode] == 0)
					ms[mode] = round ? (ms[mode] + o.ms) / 2 : o.ms;
				by[mode] = o.acts_bytes;
				step_free(&o);
			}
		for (int mode = 1; mode <= 2; mode++)
			printf("act step %s BK_ACT=%s: %.2f ms/step, %.0f tokens/s, activations %.1f MiB\n",
			       sh->name, mode == 1 ? "fp32" : "bf16", ms[mode], T / (ms[mode] * 1e-3),
			       (double)by[mode] / (1 << 20));
		printf("act step %s bf16/fp32: %.2fx speed, %.2fx activation memory\n", sh->name,
		       ms[1] / ms[2], (double)by[2] / (double)by[1]);
	}
	free(e32), free(e16);
	bk_model_free(mh);
	step_free(&h);
}

/* ---- 1. the act ops alone ---- */

#ifdef BK_HAVE_CUDA
static const bk_ops *G;

static float *dput(const float *h, size_t n) { return gc_dup(G, h, n * 4); }
static float *dget(const void *d, size_t n)
{
	float *h = xmalloc((n ? n : 1) * 4);
	G->download(h, d, n * 4);
	return h;
}
/* a device bf16 buffer [n] -> host fp32 */
static float *dget_act(const void *d, size_t n)
{
	uint16_t *b = xmalloc((n ? n : 1) * 2);
	G->download(b, d, n * 2);
	float *h = xmalloc((n ? n : 1) * 4);
	for (size_t i = 0; i < n; i++)
		h[i] = bk_bf16_to_f32(b[i]);
	free(b);
	return h;
}
/* host fp32 [n] (bf16-exact) -> device bf16 */
static void *dput_act(const float *h, size_t n)
{
	uint16_t *b = xmalloc((n ? n : 1) * 2);
	for (size_t i = 0; i < n; i++)
		b[i] = bk_f32_to_bf16(h[i]);
	void *d = gc_dup(G, b, n * 2);
	free(b);
	return d;
}

static void op_line(const char *op, double err, double bound)
{
	char what[200];
	snprintf(what, sizeof what, "act op %s: rel err %.3e (bound %.3e)", op, err, bound);
	verdict(err <= bound, what);
}

static void check_ops(int tiny)
{
	bk_cuda_act_set_mode(2);
	int T = tiny ? 42 : 300, H = tiny ? 128 : 1024, NH = 8, NKV = 2, D = 64,
	    I = tiny ? 352 : 2816, R = tiny ? 8 : 16;
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D;
	bk_rng_seed(&rng, 3);
	/* rmsnorm */
	float *x = gc_rand(&rng, (size_t)T * H, 2.0f), *w = gc_rand_bf16(&rng, H, 1.5f);
	float *oh = xmalloc((size_t)T * H * 4), *rh = xmalloc((size_t)T * 4);
	bk_weight hw = { 1, H, w, BK_WEIGHT_PLAIN };
	bk_ops_host.rmsnorm_forward(oh, rh, x, &hw, T, H, 1e-5f);
	bk_weight *wd = G->weight_upload(w, 1, H);
	float *xd = dput(x, (size_t)T * H), *rd = G->alloc((size_t)T * 4);
	void *od = G->alloc((size_t)T * H * 2);
	G->rmsnorm_forward_act(od, rd, xd, wd, T, H, 1e-5f);
	float *o = dget_act(od, (size_t)T * H), *r = dget(rd, T);
	op_line("rmsnorm_forward_act out", gc_relerr(o, oh, (size_t)T * H, 0), U + 1e-5);
	op_line("rmsnorm_forward_act rstd", gc_relerr(r, rh, T, 0), 1e-5);
	free(o), free(r), free(oh), free(rh), free(x), free(w);
	G->free(xd), G->free(rd), G->free(od), G->weight_free(wd);
	/* rope */
	float *q = gc_rand(&rng, nq, 3.0f), *qh = xmalloc(nq * 4), *inv = xmalloc(D / 2 * 4);
	int32_t *pos = xmalloc((size_t)T * 4);
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	for (int t = 0; t < T; t++)
		pos[t] = 7 * t;
	memcpy(qh, q, nq * 4);
	bk_ops_host.rope_forward(qh, pos, inv, T, NH, D);
	float *qd = dput(q, nq), *invd = dput(inv, D / 2);
	int32_t *posd = gc_put_i(G, pos, T);
	void *qo = G->alloc(nq * 2);
	G->rope_forward_act(qo, qd, posd, invd, T, NH, D);
	o = dget_act(qo, nq);
	op_line("rope_forward_act", gc_relerr(o, qh, nq, 0), U + 1e-5);
	free(o);
	/* to_act */
	G->to_act(qo, qd, nq);
	o = dget_act(qo, nq);
	op_line("to_act", gc_relerr(o, q, nq, 0), U);
	free(o), free(q), free(qh);
	G->free(qd), G->free(qo);
	/* GLU forward / backward */
	for (int ge = 0; ge < 2; ge++) {
		size_t n = (size_t)T * I;
		float *g = gc_rand(&rng, n, 4.0f), *u = gc_rand(&rng, n, 2.0f), *dh = gc_rand(&rng, n, 1.0f);
		float *hh = xmalloc(n * 4), *dgh = xcalloc(n, 4), *duh = xcalloc(n, 4);
		(ge ? bk_ops_host.geglu_forward : bk_ops_host.swiglu_forward)(hh, g, u, n);
		(ge ? bk_ops_host.geglu_backward : bk_ops_host.swiglu_backward)(dgh, duh, dh, g, u, n);
		float *gd = dput(g, n), *ud = dput(u, n), *dhd = dput(dh, n);
		float *dgd = G->alloc(n * 4), *dud = G->alloc(n * 4);
		G->zero(dgd, n * 4), G->zero(dud, n * 4);
		void *hd = G->alloc(n * 2), *gs = G->alloc(n * 2), *us = G->alloc(n * 2);
		G->glu_forward_act(hd, gs, us, gd, ud, n, ge);
		G->glu_backward_act(dgd, dud, dhd, gs, us, n, ge);
		float *hg = dget_act(hd, n), *dg = dget(dgd, n), *du = dget(dud, n);
		/* |g| < 4: k_f <= 5 (silu at g = -4: |1 + g (1 - sigmoid)| = 2.9; gelu 5.0), so
		 * 1.01 u (2 + 5) relative to max|h|; the derivatives within 1.01 u 12 */
		op_line(ge ? "geglu glu_forward_act" : "swiglu glu_forward_act",
			gc_relerr(hg, hh, n, 0), 1.01 * U * 7);
		op_line(ge ? "geglu glu_backward_act dgate" : "swiglu glu_backward_act dgate",
			gc_relerr(dg, dgh, n, 0), 1.01 * U * 12);
		op_line(ge ? "geglu glu_backward_act dup" : "swiglu glu_backward_act dup",
			gc_relerr(du, duh, n, 0), 1.01 * U * 6);
		free(g), free(u), free(dh), free(hh), free(dgh), free(duh), free(hg), free(dg), free(du);
		G->free(gd), G->free(ud), G->free(dhd), G->free(dgd), G->free(dud);
		G->free(hd), G->free(gs), G->free(us);
	}
	/* attention: 3 sequences of T / 3, GQA 4 */
	{
		int32_t cu[4] = { 0, T / 3, 2 * (T / 3), T };
		bk_attn ap = bk_attn_default(D);
		float *qa = gc_rand_bf16(&rng, nq, 1.5f), *ka = gc_rand_bf16(&rng, nk, 1.5f);
		float *va = gc_rand_bf16(&rng, nk, 1.0f), *go = gc_rand(&rng, nq, 1.0f);
		float *ao = xmalloc(nq * 4), *al = xmalloc((size_t)NH * T * 4);
		float *dq = xcalloc(nq, 4), *dk = xcalloc(nk, 4), *dv = xcalloc(nk, 4);
		bk_ops_host.attention_forward(ao, al, qa, ka, va, cu, 3, T, NH, NKV, D, NULL, NULL, 0, &ap);
		bk_ops_host.attention_backward(dq, dk, dv, go, qa, ka, va, ao, al, cu, 3, T, NH, NKV, D,
					       &ap);
		void *qb = dput_act(qa, nq), *kb = dput_act(ka, nk), *vb = dput_act(va, nk);
		void *ob = G->alloc(nq * 2);
		float *ld = G->alloc((size_t)NH * T * 4), *god = dput(go, nq);
		int32_t *cud = gc_put_i(G, cu, 4);
		float *dqd = G->alloc(nq * 4), *dkd = G->alloc(nk * 4), *dvd = G->alloc(nk * 4);
		G->zero(dqd, nq * 4), G->zero(dkd, nk * 4), G->zero(dvd, nk * 4);
		G->attention_forward_act(ob, ld, qb, kb, vb, cud, 3, T, NH, NKV, D, NULL, NULL, 0, &ap);
		G->attention_backward_act(dqd, dkd, dvd, god, qb, kb, vb, ob, ld, cud, 3, T, NH, NKV, D,
					  &ap);
		float *og = dget_act(ob, nq), *lg = dget(ld, (size_t)NH * T);
		float *dqg = dget(dqd, nq), *dkg = dget(dkd, nk), *dvg = dget(dvd, nk);
		op_line("attention_forward_act out (rel to max|v|)",
			gc_relerr(og, ao, nq, 0) * gc_maxabs(ao, nq) / gc_maxabs(va, nk),
			2.01 * U + 1e-5);
		op_line("attention_forward_act lse (abs)", gc_relerr(lg, al, (size_t)NH * T, -1), 1e-4);
		op_line("attention_backward_act dq", gc_relerr(dqg, dq, nq, 0), 2e-2);
		op_line("attention_backward_act dk", gc_relerr(dkg, dk, nk, 0), 2e-2);
		op_line("attention_backward_act dv", gc_relerr(dvg, dv, nk, 0), 2e-2);
		free(qa), free(ka), free(va), free(go), free(ao), free(al), free(dq), free(dk), free(dv);
		free(og), free(lg), free(dqg), free(dkg), free(dvg);
		G->free(qb), G->free(kb), G->free(vb), G->free(ob), G->free(ld), G->free(god);
		G->free(cud), G->free(dqd), G->free(dkd), G->free(dvd);
	}
	/* the q/k/v projection group with LoRA, x bf16 */
	for (int dr = 0; dr < 2; dr++) {
		float drop = dr ? 0.1f : 0.0f;
		int outs[3] = { NH * D, NKV * D, NKV * D };
		float *xa = gc_rand_bf16(&rng, (size_t)T * H, 1.0f);
		bk_proj ph[3], pg[3];
		float *Wh[3], *Ah[3], *Bh[3], *dyh[3], *yh[3], *dAh[3], *dBh[3];
		bk_weight Wl[3];
		float *dxh = xcalloc((size_t)T * H, 4);
		float *xah = xmalloc((size_t)3 * T * R * 4), *scr = xmalloc((size_t)T * (H + R) * 4);
		void *xb = dput_act(xa, (size_t)T * H);
		float *dxd = G->alloc((size_t)T * H * 4), *xad = G->alloc((size_t)3 * T * R * 4);
		float *scd = G->alloc((size_t)T * (H + R) * 4);
		G->zero(dxd, (size_t)T * H * 4);
		for (int j = 0; j < 3; j++) {
			int out = outs[j];
			Wh[j] = gc_rand_bf16(&rng, (size_t)out * H, (float)(1 / sqrt(H)));
			Ah[j] = gc_rand(&rng, (size_t)R * H, (float)(1 / sqrt(H)));
			Bh[j] = gc_rand(&rng, (size_t)out * R, 0.1f);
			dyh[j] = gc_rand(&rng, (size_t)T * out, 1.0f);
			yh[j] = xmalloc((size_t)T * out * 4);
			dAh[j] = xcalloc((size_t)R * H, 4), dBh[j] = xcalloc((size_t)out * R, 4);
			Wl[j] = (bk_weight){ out, H, Wh[j], BK_WEIGHT_PLAIN };
			ph[j] = (bk_proj){ &Wl[j], Ah[j], Bh[j], 100 + j, yh[j], dyh[j], dAh[j], dBh[j] };
			float *dA = G->alloc((size_t)R * H * 4), *dB = G->alloc((size_t)out * R * 4);
			G->zero(dA, (size_t)R * H * 4), G->zero(dB, (size_t)out * R * 4);
			pg[j] = (bk_proj){ G->weight_upload(Wh[j], out, H), dput(Ah[j], (size_t)R * H),
					   dput(Bh[j], (size_t)out * R), 100 + j,
					   G->alloc((size_t)T * out * 4), dput(dyh[j], (size_t)T * out),
					   dA, dB };
		}
		bk_ops_host.proj_forward(ph, 3, xa, xah, T, H, R, 2.0f, drop, scr);
		bk_ops_host.proj_backward(dxh, ph, 3, xa, xah, T, H, R, 2.0f, drop, scr);
		G->proj_forward_act(pg, 3, xb, xad, T, H, R, 2.0f, drop, scd);
		G->proj_backward_act(dxd, pg, 3, xb, xad, T, H, R, 2.0f, drop, scd);
		/* bf16 GEMM of bf16 operands with fp32 accumulation over K = 1024 and 300: the
		 * products are exact, the sums fp32 (about 1e-6), A, dy and dxa rounded (u each,
		 * against sums of |terms| within ~10x the result at these random signs) */
		double ey = 0, eA = 0, eB = 0;
		for (int j = 0; j < 3; j++) {
			float *y = dget(pg[j].y, (size_t)T * outs[j]);
			float *dA = dget(pg[j].dA, (size_t)R * H), *dB = dget(pg[j].dB, (size_t)outs[j] * R);
			double e = gc_relerr(y, yh[j], (size_t)T * outs[j], 0);
			ey = e > ey ? e : ey;
			e = gc_relerr(dA, dAh[j], (size_t)R * H, 0);
			eA = e > eA ? e : eA;
			e = gc_relerr(dB, dBh[j], (size_t)outs[j] * R, 0);
			eB = e > eB ? e : eB;
			free(y), free(dA), free(dB);
		}
		float *dx = dget(dxd, (size_t)T * H);
		char nm[64];
		snprintf(nm, sizeof nm, "proj_forward_act q/k/v y, dropout %g", (double)drop);
		op_line(nm, ey, 10 * U);
		snprintf(nm, sizeof nm, "proj_backward_act dx, dropout %g", (double)drop);
		op_line(nm, gc_relerr(dx, dxh, (size_t)T * H, 0), 10 * U);
		snprintf(nm, sizeof nm, "proj_backward_act dA, dropout %g", (double)drop);
		op_line(nm, eA, 10 * U);
		snprintf(nm, sizeof nm, "proj_backward_act dB, dropout %g", (double)drop);
		op_line(nm, eB, 10 * U);
		free(dx), free(xa), free(dxh), free(xah), free(scr);
		G->free(xb), G->free(dxd), G->free(xad), G->free(scd);
		for (int j = 0; j < 3; j++) {
			free(Wh[j]), free(Ah[j]), free(Bh[j]), free(dyh[j]), free(yh[j]), free(dAh[j]),
				free(dBh[j]);
			G->weight_free((bk_weight *)pg[j].W);
			G->free((void *)pg[j].A), G->free((void *)pg[j].B), G->free(pg[j].y);
			G->free((void *)pg[j].dy), G->free(pg[j].dA), G->free(pg[j].dB);
		}
	}
	free(inv), free(pos);
	G->free(invd), G->free(posd);
}
#endif

int main(int argc, char **argv)
{
	int host_only = 0, quick = 0, tiny = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--host"))
			host_only = 1;
		else if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--tiny"))
			tiny = 1;
		else
			die("usage: check_act [--host] [--quick | --tiny]");
	}
	const bk_ops *dev = &bk_ops_host;
#ifdef BK_HAVE_CUDA
	if (!host_only) {
		G = dev = &bk_ops_cuda;
		printf("check_act: BK_ATTN=%s\n", getenv("BK_ATTN") ? getenv("BK_ATTN") : "(unset: fp32)");
		check_ops(tiny);
	}
#else
	if (!host_only)
		die("check_act: built without CUDA; only --host is available");
#endif
	shape small = { 256, 688, 2, 4, 2, 512, 4, 64, 16, "small (H 256, 2 layers)", 0 };
	shape deltas = { 256, 688, 2, 4, 2, 512, 4, 64, 16,
			 "small, bias + q/k norms + GeGLU + sandwich", 1 };
	/* vocabulary 4096, not 32000: the loss is on the hidden state (no LM head) */
	shape tl = { 2048, 5632, 2, 32, 4, 4096, 16, 256, 16, "TinyLlama shape (2 layers)", 0 };
	shape emu = { 128, 352, 2, 2, 1, 512, 2, 32, 8, "tiny (H 128, 2 layers)", 0 };
	shape emu_deltas = { 128, 352, 2, 2, 1, 512, 2, 32, 8,
			     "tiny, bias + q/k norms + GeGLU + sandwich", 1 };
	check_shape(dev, tiny ? &emu : &small, host_only, tiny && !host_only ? 1 : 0);
	check_shape(dev, tiny ? &emu_deltas : &deltas, host_only, 0);
	if (!quick && !tiny && !host_only)
		check_shape(dev, &tl, 0, 5);
	return bk_test_done("check_act");
}
