/* test_model_act.c - gpu/model.c's bf16-activation path (invariant 7, BK_ACT=bf16 on CUDA)
 * on the CPU.  The op table is the host twin plus act ops of this file: each is the host
 * twin's fp32 op on the act inputs widened from bf16, its act outputs rounded to bf16
 * (round to nearest even) as they are stored: the arithmetic gpu/cuda/cuda_act.cuh
 * specifies for the CUDA act ops, not their kernels (tests/emu/test_act_kernels.cc runs those;
 * tests/gpu/check_act.c the real ones on a GPU).  So model.c's byte offsets, its fp32
 * staging in the backward's buffers, the family branches, checkpointing and the prefix
 * run in bf16 mode without a GPU.  Checks, on a small random Llama and on one with every
 * family delta (q/k/v bias, q/k norms, GeGLU, sandwich norms), LoRA r 8 on all 7 modules:
 *   - a training step (forward, loss 0.5 |hidden - Y|^2, backward) in bf16 mode against
 *     the host twin's fp32 one: the final hidden state and every LoRA gradient tensor
 *     within sqrt(9 L) 4 u relative L2 (cuda_act.cuh's compounding with e_fp32 = 0, u =
 *     2^-8), and not bit-identical to it (the bf16 path was taken);
 *   - the same step with dropout 0.1, against the host twin's with dropout;
 *   - gradient checkpointing in bf16 mode: the same gradients bit for bit; and in fp32
 *     (the host twin), where the backward's workspaces live in the slot (model.c
 *     invariants 11, 12: with qk_norm, dqr/dkr in up), the same bits as fp32 without;
 *   - bk_acts_bytes: smaller by exactly 2 bytes per element of the act buffers;
 *   - a shared prefix (bk_model_prefix_build and a forward over it) in bf16 mode against
 *     fp32, within the same bound.
 * It fails when model.c reads an act buffer as fp32 (offsets in floats: garbage or a
 * wrong slot), skips a rounding op (e.g. v left unrounded: exact equality checks below
 * do not catch it, the bound does not either; the acts-bytes check does for a buffer
 * allocated in fp32), or writes the staging over something a later op reads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "formats/safetensors.h"
#include "gpu/model.h"
#include "tests/harness.h"

static const double U = 0x1p-8;

/* ---- the host act ops ---- */

static float *widen(const void *src, size_t n)
{
	const uint16_t *b = src;
	float *x = xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = bk_bf16_to_f32(b[i]);
	return x;
}
static void store(void *dst, const float *x, size_t n)
{
	uint16_t *b = dst;
	for (size_t i = 0; i < n; i++)
		b[i] = bk_f32_to_bf16(x[i]);
}
static int two(void) { return 2; }

static void a_rmsnorm(void *out, float *rstd, const float *x, const bk_weight *w, int T, int H,
		      float eps)
{
	float *o = xmalloc((size_t)T * H * sizeof(float));
	bk_ops_host.rmsnorm_forward(o, rstd, x, w, T, H, eps);
	store(out, o, (size_t)T * H);
	free(o);
}
static void a_rope(void *out, const float *x, const int32_t *pos, const float *inv, int T, int n,
		   int D)
{
	size_t N = (size_t)T * n * D;
	float *o = xmalloc(N * sizeof(float));
	memcpy(o, x, N * sizeof(float));
	bk_ops_host.rope_forward(o, pos, inv, T, n, D);
	store(out, o, N);
	free(o);
}
static void a_to_act(void *dst, const float *src, size_t n) { store(dst, src, n); }
static void a_glu_fwd(void *h, void *gs, void *us, const float *g, const float *u, size_t n,
		      int geglu)
{
	store(gs, g, n), store(us, u, n);
	float *gr = widen(gs, n), *ur = widen(us, n), *o = xmalloc(n * sizeof(float));
	(geglu ? bk_ops_host.geglu_forward : bk_ops_host.swiglu_forward)(o, gr, ur, n);
	store(h, o, n);
	free(gr), free(ur), free(o);
}
static void a_glu_bwd(float *dg, float *du, const float *dh, const void *gs, const void *us,
		      size_t n, int geglu)
{
	float *gr = widen(gs, n), *ur = widen(us, n);
	(geglu ? bk_ops_host.geglu_backward : bk_ops_host.swiglu_backward)(dg, du, dh, gr, ur, n);
	free(gr), free(ur);
}
static void a_attn_fwd(void *out, float *lse, const void *q, const void *k, const void *v,
		       const int32_t *cu, int S, int T, int NH, int NKV, int D, const void *pk,
		       const void *pv, int P, const bk_attn *ap)
{
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, np = (size_t)P * NKV * D;
	float *qf = widen(q, nq), *kf = widen(k, nk), *vf = widen(v, nk), *o = xmalloc(nq * 4);
	float *pkf = P ? widen(pk, np) : NULL, *pvf = P ? widen(pv, np) : NULL;
	bk_ops_host.attention_forward(o, lse, qf, kf, vf, cu, S, T, NH, NKV, D, pkf, pvf, P, ap);
	store(out, o, nq);
	free(qf), free(kf), free(vf), free(o), free(pkf), free(pvf);
}
static void a_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const void *q,
		       const void *k, const void *v, const void *out, const float *lse,
		       const int32_t *cu, int S, int T, int NH, int NKV, int D, const bk_attn *ap)
{
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D;
	float *qf = widen(q, nq), *kf = widen(k, nk), *vf = widen(v, nk), *of = widen(out, nq);
	bk_ops_host.attention_backward(dq, dk, dv, dout, qf, kf, vf, of, lse, cu, S, T, NH, NKV, D,
				       ap);
	free(qf), free(kf), free(vf), free(of);
}
static void a_proj_fwd(const bk_proj *p, int n, const void *x, float *xa, int T, int in, int R,
		       float scale, float drop, float *scratch)
{
	float *xf = widen(x, (size_t)T * in);
	bk_ops_host.proj_forward(p, n, xf, xa, T, in, R, scale, drop, scratch);
	free(xf);
}
static void a_proj_bwd(float *dx, const bk_proj *p, int n, const void *x, const float *xa, int T,
		       int in, int R, float scale, float drop, float *scratch)
{
	float *xf = widen(x, (size_t)T * in);
	bk_ops_host.proj_backward(dx, p, n, xf, xa, T, in, R, scale, drop, scratch);
	free(xf);
}

static bk_ops act_ops(void)
{
	bk_ops o = bk_ops_host;
	o.name = "host-act";
	o.act_bytes = two;
	o.rmsnorm_forward_act = a_rmsnorm;
	o.rope_forward_act = a_rope;
	o.to_act = a_to_act;
	o.glu_forward_act = a_glu_fwd;
	o.glu_backward_act = a_glu_bwd;
	o.attention_forward_act = a_attn_fwd;
	o.attention_backward_act = a_attn_bwd;
	o.proj_forward_act = a_proj_fwd;
	o.proj_backward_act = a_proj_bwd;
	return o;
}

/* ---- the model ---- */

enum { H = 64, I = 160, L = 2, NH = 4, NKV = 2, D = 16, V = 97, R = 8, S = 3, LEN = 21 };
enum { T = S * LEN };

static float *rnd(bk_rng *r, size_t n, double scale)
{
	float *x = xmalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = (float)((2 * bk_rng_uniform(r) - 1) * scale);
	return x;
}

static bk_model *make(const bk_ops *ops, int deltas)
{
	bk_rng r;
	bk_rng_seed(&r, 5);
	float inv[D / 2];
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	bk_llama_config c = { .H = H, .I = I, .L = L, .NH = NH, .NKV = NKV, .D = D, .V = V,
			      .rms_eps = 1e-5f, .inv_freq = inv };
	if (deltas)
		c.qkv_bias = c.qk_norm = c.geglu = c.sandwich = 1;
	float *wq = rnd(&r, NH * D * H, 1 / sqrt(H)), *wk = rnd(&r, NKV * D * H, 1 / sqrt(H));
	float *wv = rnd(&r, NKV * D * H, 1 / sqrt(H)), *wo = rnd(&r, H * NH * D, 1 / sqrt(NH * D));
	float *wg = rnd(&r, I * H, 1 / sqrt(H)), *wu = rnd(&r, I * H, 1 / sqrt(H));
	float *wd = rnd(&r, H * I, 1 / sqrt(I)), *n1 = rnd(&r, H, 0.2), *n2 = rnd(&r, H, 0.2);
	float *bq = rnd(&r, NH * D, 0.5), *bkv = rnd(&r, NKV * D, 0.5), *qn = rnd(&r, D, 0.2);
	for (int i = 0; i < H; i++)
		n1[i] += 1, n2[i] += 1;
	for (int i = 0; i < D; i++)
		qn[i] += 1;
	float *embed = rnd(&r, V * H, 1);
	bk_llama_layer_weights lw[L];
	for (int l = 0; l < L; l++)
		lw[l] = (bk_llama_layer_weights){ .wq = wq, .wk = wk, .wv = wv, .wo = wo,
						  .w_gate = wg, .w_up = wu, .w_down = wd,
						  .attn_norm = n1, .mlp_norm = n2, .bq = bq, .bk = bkv,
						  .bv = bkv, .q_norm = qn, .k_norm = qn,
						  .post_attn_norm = n2, .post_mlp_norm = n1 };
	bk_llama_weights w = { embed, n2, embed, lw };
	c.tied = 1;
	bk_model *m = bk_model_create(ops, &c, &w);
	free(wq), free(wk), free(wv), free(wo), free(wg), free(wu), free(wd), free(n1), free(n2);
	free(bq), free(bkv), free(qn), free(embed);
	return m;
}

typedef struct {
	float hidden[T * H];
	float *grads;
	size_t n, acts_bytes;
} result;

static void step(const bk_ops *ops, int deltas, float drop, int ckpt, result *o)
{
	bk_model *m = make(ops, deltas);
	bk_lora *lo = bk_lora_create(m, R, 16, drop, BK_LORA_ALL), *g = bk_lora_create_like(m, lo);
	bk_rng r;
	bk_rng_seed(&r, 9);
	float *fl = rnd(&r, lo->n_flat, 0.1);
	memcpy(lo->flat, fl, lo->n_flat * sizeof(float));
	free(fl);
	int32_t ids[T], pos[T], cu[S + 1];
	for (int s = 0; s <= S; s++)
		cu[s] = s * LEN;
	for (int t = 0; t < T; t++)
		ids[t] = (int32_t)bk_rng_below(&r, V), pos[t] = t % LEN;
	bk_batch b = { .T = T, .S = S, .ids = ids, .pos = pos, .cu_seqlens = cu, .train = 1,
		       .dropout_key = 77 };
	bk_acts *a = bk_acts_create_ckpt(m, T, R, ckpt);
	o->acts_bytes = bk_acts_bytes(a);
	bk_model_forward(m, lo, &b, NULL, a, o->hidden);
	float *Y = rnd(&r, T * H, 1), *dh = xmalloc(T * H * sizeof(float));
	for (int i = 0; i < T * H; i++)
		dh[i] = o->hidden[i] - Y[i];
	memset(g->flat, 0, g->n_flat * sizeof(float));
	bk_model_backward(m, lo, &b, a, dh, g);
	o->n = g->n_flat;
	o->grads = xmalloc(o->n * sizeof(float));
	memcpy(o->grads, g->flat, o->n * sizeof(float));
	free(Y), free(dh);
	bk_acts_free(m, a);
	bk_lora_free(m, lo), bk_lora_free(m, g);
	bk_model_free(m);
}

static double rel_l2(const float *a, const float *b, size_t n)
{
	double num = 0, den = 0;
	for (size_t i = 0; i < n; i++) {
		double d = (double)a[i] - b[i];
		if (isnan(d))
			return INFINITY;
		num += d * d, den += (double)b[i] * b[i];
	}
	return den > 0 ? sqrt(num / den) : INFINITY;
}

/* per LoRA tensor (A, B of each module of each layer, in bk_lora order) */
static void check_grads(const char *what, const bk_model *m, const result *got, const result *want,
			double bound)
{
	size_t off = 0;
	double worst = 0;
	for (int l = 0; l < L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			int in, out;
			bk_model_module_dims(&m->cfg, mod, &in, &out);
			size_t na = (size_t)R * in, nb = (size_t)out * R;
			double ea = rel_l2(got->grads + off, want->grads + off, na);
			double eb = rel_l2(got->grads + off + na, want->grads + off + na, nb);
			CHECK(ea <= bound && eb <= bound, "%s: layer %d %s: dA %.3e dB %.3e > %.3e", what,
			      l, bk_lora_module_names[mod], ea, eb, bound);
			worst = fmax(worst, fmax(ea, eb));
			off += na + nb;
		}
	printf("%-52s worst LoRA gradient rel L2 %.3e (bound %.3e)\n", what, worst, bound);
}

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	bk_ops A = act_ops();
	const double bound = sqrt(9.0 * L) * 4 * U;
	for (int deltas = 0; deltas < 2; deltas++) {
		const char *nm = deltas ? "deltas" : "llama";
		bk_model *mh = make(&bk_ops_host, deltas), *ma = make(&A, deltas);
		CHECK(mh->act_bytes == 4 && ma->act_bytes == 2, "act_bytes %d %d", mh->act_bytes,
		      ma->act_bytes);
		for (int di = 0; di < 2; di++) {
			float drop = di ? 0.1f : 0.0f;
			static result h, a, c;
			step(&bk_ops_host, deltas, drop, 0, &h);
			step(&A, deltas, drop, 0, &a);
			double eh = rel_l2(a.hidden, h.hidden, T * H);
			char what[96];
			snprintf(what, sizeof what, "%s dropout %g bf16 vs fp32", nm, (double)drop);
			printf("%-52s hidden rel L2 %.3e (bound %.3e)\n", what, eh, bound);
			CHECK(eh <= bound && eh > 0, "%s: hidden rel L2 %.3e (bound %.3e, > 0)", what, eh,
			      bound);
			check_grads(what, ma, &a, &h, bound);
			CHECK(memcmp(a.grads, h.grads, a.n * sizeof(float)),
			      "%s: the bf16 gradients are the fp32 ones bit for bit", what);
			/* activation bytes: 2 less per element of ln1, ln2, q, k, v, att, gate, up, h */
			size_t act = (size_t)L * T * (2 * H + 2 * NH * D + 2 * NKV * D + 3 * I);
			CHECK(h.acts_bytes - a.acts_bytes == 2 * act,
			      "%s: acts bytes %zu (fp32) - %zu (bf16) != %zu", what, h.acts_bytes,
			      a.acts_bytes, 2 * act);
			/* checkpointing: the same bits */
			step(&A, deltas, drop, 1, &c);
			CHECK(!memcmp(c.grads, a.grads, a.n * sizeof(float)) &&
				      !memcmp(c.hidden, a.hidden, sizeof(a.hidden)),
			      "%s: checkpointed bf16 step differs from the plain one", what);
			printf("%-52s checkpointed: %s\n", what,
			       !memcmp(c.grads, a.grads, a.n * sizeof(float)) ? "bit-identical" : "DIFFERS");
			free(c.grads);
			/* and in fp32, where the backward's workspaces live in the slot and ln2 in
			 * ln1 (model.c invariants 11, 12; every alias fits these dims): the same
			 * bits as without checkpointing */
			step(&bk_ops_host, deltas, drop, 1, &c);
			CHECK(!memcmp(c.grads, h.grads, h.n * sizeof(float)) &&
				      !memcmp(c.hidden, h.hidden, sizeof(h.hidden)),
			      "%s: checkpointed fp32 step differs from the plain one", what);
			free(h.grads), free(a.grads), free(c.grads);
		}
		/* a prefix in bf16 mode: forward over it against fp32 */
		int32_t pids[11], ids[T], pos[T], cu[S + 1];
		for (int i = 0; i < 11; i++)
			pids[i] = 3 + 7 * i;
		for (int s = 0; s <= S; s++)
			cu[s] = s * LEN;
		for (int t = 0; t < T; t++)
			ids[t] = (int32_t)((t * 13) % V), pos[t] = 11 + t % LEN;
		bk_batch b = { .T = T, .S = S, .ids = ids, .pos = pos, .cu_seqlens = cu };
		static float hh[T * H], ha[T * H];
		bk_model *ms[2] = { mh, ma };
		float *outs[2] = { hh, ha };
		for (int k = 0; k < 2; k++) {
			bk_acts *ac = bk_acts_create(ms[k], T, 0);
			bk_prefix *p = bk_model_prefix_build(ms[k], ac, pids, 11);
			bk_model_forward(ms[k], NULL, &b, p, ac, outs[k]);
			bk_prefix_free(ms[k], p);
			bk_acts_free(ms[k], ac);
		}
		double ep = rel_l2(ha, hh, T * H);
		printf("%-52s hidden rel L2 %.3e (bound %.3e)\n",
		       deltas ? "deltas prefix bf16 vs fp32" : "llama prefix bf16 vs fp32", ep, bound);
		CHECK(ep <= bound && ep > 0, "%s prefix: hidden rel L2 %.3e", nm, ep);
		bk_model_free(mh), bk_model_free(ma);
	}
	return bk_test_done("test_model_act");
}
