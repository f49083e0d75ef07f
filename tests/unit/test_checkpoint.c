/* test_checkpoint.c - gradient checkpointing (bk_acts_create_ckpt, gpu/model.c) on
 * models/stories260K, host twin:
 * (a) a packed batch of 3 sequences, LoRA on all modules with random B and dropout on:
 *     the forward's hidden states and every LoRA gradient are the same bits with and
 *     without checkpointing; also for an adapter on a subset of modules, for a second
 *     backward after an adapter-off forward in between (the teacher's, exact mode), for a
 *     second backward of the same forward, and
 *     for a teacher forward with a shared prefix (its K/V built on checkpointed acts);
 * (b) the activation memory: bk_acts_bytes without checkpointing minus with it is
 *     exactly (L-1) layers' saved activations and dgate, dup (invariant 10), ln2
 *     (invariant 12), dln, datt, dq, dk, dv (invariant 11), and is printed;
 * (c) bk-step's trainer with grad_checkpoint: 3 steps of a bake give the same adapter,
 *     bit for bit.
 * (a) and (c) also for checkpoints in segments of 2, 3 and L layers (gpu/model.c
 * invariant 9: stories260K has 5 layers, so the last segment is a partial one).
 * (d) the trainer's loss rows in the acts' spare (invariant 13) on a model that has
 *     room for them: the same bits as in their own buffers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/load.h"
#include "gpu/train.h"
#include "tests/harness.h"

static bk_loaded_model lm;
static const bk_model *M;
static bk_rng rng;

enum { S = 3, MAXT = 64 };

typedef struct {
	int32_t ids[MAXT], pos[MAXT], cu[S + 1];
	bk_batch b;
} packed;

/* S sequences of the given lengths back to back, positions from `pos0` */
static void make_batch(packed *p, const int *len, int pos0, int train, uint64_t key)
{
	int T = 0;
	p->cu[0] = 0;
	for (int s = 0; s < S; s++) {
		for (int i = 0; i < len[s]; i++, T++) {
			p->ids[T] = 1 + (int32_t)bk_rng_below(&rng, (uint64_t)M->cfg.V - 1);
			p->pos[T] = pos0 + i;
		}
		p->cu[s + 1] = T;
	}
	p->b = (bk_batch){.T = T, .S = S, .ids = p->ids, .pos = p->pos, .cu_seqlens = p->cu,
			  .train = train, .dropout_key = key};
}

static void randomize(bk_lora *lo, float scale)
{
	for (size_t i = 0; i < lo->n_flat; i++)
		lo->flat[i] = ((float)bk_rng_uniform(&rng) - 0.5f) * scale;
}

/* forward + backward of one batch on acts a; hidden [T,H] and grads out */
static void fwd_bwd(bk_acts *a, const bk_lora *lo, const bk_batch *b, const float *dh,
		    float *hid, bk_lora *g)
{
	memset(g->flat, 0, g->n_flat * sizeof(float));
	bk_model_forward(M, lo, b, NULL, a, hid);
	bk_model_backward(M, lo, b, a, dh, g);
}

static void test_same_bits(unsigned targets, int ckpt, const char *what)
{
	const int H = M->cfg.H;
	int len[S] = {17, 9, 23};
	packed p, t;
	make_batch(&p, len, 0, 1, 0x1234);
	make_batch(&t, len, 0, 0, 0);
	bk_lora *lo = bk_lora_create(M, 4, 8, 0.1f, targets);
	randomize(lo, 0.2f);
	bk_lora *g0 = bk_lora_create_like(M, lo), *g1 = bk_lora_create_like(M, lo);
	bk_acts *a0 = bk_acts_create(M, MAXT, 4), *a1 = bk_acts_create_ckpt(M, MAXT, 4, ckpt);
	size_t nh = (size_t)MAXT * H;
	float *h0 = xmalloc(nh * 4), *h1 = xmalloc(nh * 4), *dh = xmalloc(nh * 4);
	for (size_t i = 0; i < nh; i++)
		dh[i] = (float)bk_rng_uniform(&rng) - 0.5f;

	fwd_bwd(a0, lo, &p.b, dh, h0, g0);
	fwd_bwd(a1, lo, &p.b, dh, h1, g1);
	size_t nT = (size_t)p.b.T * H * 4;
	double gn = 0;
	for (size_t i = 0; i < g0->n_flat; i++)
		gn += fabs(g0->flat[i]);
	CHECK(gn > 0, "%s: gradients are not all zero", what);
	CHECK(!memcmp(h0, h1, nT), "%s: hidden states equal with checkpointing", what);
	CHECK(!memcmp(g0->flat, g1->flat, g0->n_flat * 4),
	      "%s: LoRA gradients equal bit for bit with checkpointing", what);
	/* a second backward of the same forward adds the same again (invariant 10: the
	 * in-place GLU backward leaves no forward in the slot, so every layer reruns) */
	bk_model_backward(M, lo, &p.b, a0, dh, g0);
	bk_model_backward(M, lo, &p.b, a1, dh, g1);
	CHECK(!memcmp(g0->flat, g1->flat, g0->n_flat * 4),
	      "%s: a second backward adds the same bits with checkpointing", what);

	/* exact mode's order: teacher forward (adapter off), student forward, backward */
	bk_model_forward(M, NULL, &t.b, NULL, a0, h0);
	bk_model_forward(M, NULL, &t.b, NULL, a1, h1);
	CHECK(!memcmp(h0, h1, nT), "%s: teacher hidden states equal", what);
	fwd_bwd(a0, lo, &p.b, dh, h0, g0);
	fwd_bwd(a1, lo, &p.b, dh, h1, g1);
	CHECK(!memcmp(g0->flat, g1->flat, g0->n_flat * 4),
	      "%s: gradients equal after an adapter-off forward", what);

	/* a shared prefix: K/V built on each kind of acts, then a teacher forward */
	int32_t pre[7] = {1, 301, 427, 295, 433, 422, 265};
	bk_prefix *p0 = bk_model_prefix_build(M, a0, pre, 7);
	bk_prefix *p1 = bk_model_prefix_build(M, a1, pre, 7);
	size_t kv = (size_t)7 * M->cfg.NKV * M->cfg.D * 4;
	int same = 1;
	for (int l = 0; l < M->cfg.L; l++)
		same &= !memcmp(p0->k[l], p1->k[l], kv) && !memcmp(p0->v[l], p1->v[l], kv);
	CHECK(same, "%s: prefix K/V equal", what);
	packed q;
	make_batch(&q, len, 7, 0, 0);
	bk_model_forward(M, NULL, &q.b, p0, a0, h0);
	bk_model_forward(M, NULL, &q.b, p1, a1, h1);
	CHECK(!memcmp(h0, h1, (size_t)q.b.T * H * 4), "%s: prefixed forward equal", what);
	bk_prefix_free(M, p0);
	bk_prefix_free(M, p1);

	bk_acts_free(M, a0);
	bk_acts_free(M, a1);
	bk_lora_free(M, lo);
	bk_lora_free(M, g0);
	bk_lora_free(M, g1);
	free(h0), free(h1), free(dh);
}

static void test_bytes(void)
{
	const bk_llama_config *c = &M->cfg;
	int sizes[2] = {64, 512}, R = 8;
	for (int k = 0; k < 2; k++) {
		int T = sizes[k];
		bk_acts *a0 = bk_acts_create(M, T, R), *a1 = bk_acts_create_ckpt(M, T, R, 1);
		size_t b0 = bk_acts_bytes(a0), b1 = bk_acts_bytes(a1);
		size_t H = c->H, I = c->I, QD = (size_t)c->NH * c->D, KVD = (size_t)c->NKV * c->D;
		/* one layer's saved activations (model.c's design note) */
		size_t layer = (size_t)T * (3 * H + 2 * QD + 2 * KVD + 3 * I + BK_LORA_NMOD * R + 2) +
			       (size_t)c->NH * T;
		/* and dgate, dup: the checkpointed GLU backward runs in place (invariant 10);
		 * dln, datt and dq/dk/dv live in slot buffers where they fit (invariant 11),
		 * ln2 in ln1 (invariant 12) */
		size_t ws = 2 * I + H;
		ws += I >= H ? H : 0;
		ws += I >= QD ? QD : 0;
		ws += I >= QD + 2 * KVD ? QD + 2 * KVD : 0;
		CHECK(ws == 2 * I + 2 * H + 2 * QD + 2 * KVD, "stories260K: every alias fits");
		size_t want = ((size_t)(c->L - 1) * layer + (size_t)T * ws) * sizeof(float);
		fprintf(stderr, "activation bytes, T = %d, r = %d, L = %d: %zu without, %zu with "
			"--grad-checkpoint (saving %zu bytes, %.1f%%)\n", T, R, c->L, b0, b1,
			b0 - b1, 100.0 * (double)(b0 - b1) / (double)b0);
		CHECK(b1 < b0 && b0 - b1 == want, "T %d: saving %zu bytes, expected (L-1) layers "
		      "+ dgate, dup, ln2, dln, datt, dq, dk, dv = %zu", T, b0 - b1, want);
		bk_acts_free(M, a0);
		bk_acts_free(M, a1);
	}
}

static int32_t sp[3][8], tp[3][14], rs[3][6];

/* 3 samples of an exact-mode bake: student prompts, teacher prompts with a system
 * prompt, responses of 6, 5, 4 tokens (ids < 503) */
static void make_samples(bk_train_sample *s)
{
	int32_t sys[6] = {301, 427, 295, 433, 422, 265};
	for (int i = 0; i < 3; i++) {
		int nu = 3 + 2 * i;
		sp[i][0] = tp[i][0] = 1;
		memcpy(tp[i] + 1, sys, sizeof sys);
		for (int j = 0; j < nu; j++)
			sp[i][1 + j] = tp[i][7 + j] = 3 + (int32_t)bk_rng_below(&rng, 500);
		for (int j = 0; j < 6; j++)
			rs[i][j] = 3 + (int32_t)bk_rng_below(&rng, 500);
		s[i] = (bk_train_sample){sp[i], tp[i], rs[i], 1 + nu, 7 + nu, 6 - i, NULL};
	}
}

static void test_trainer(int ckpt)
{
	bk_train_sample s[3];
	make_samples(s);
	bk_train_opts o = {.r = 4, .alpha = 8, .dropout = 0.1f, .targets = BK_LORA_ALL,
			   .lr = 2e-3, .max_grad_norm = 1.0, .sched = BK_SCHED_CONSTANT,
			   .temperature = 1, .seed = 11, .vocab_chunk = 100};
	bk_trainer *t0 = bk_trainer_create(M, &o);
	o.grad_checkpoint = ckpt;
	bk_trainer *t1 = bk_trainer_create(M, &o);
	for (int k = 0; k < 3; k++) {
		bk_train_micro_info i0, i1;
		bk_trainer_micro(t0, s, 3, &i0);
		bk_trainer_micro(t1, s, 3, &i1);
		CHECK(i0.loss == i1.loss, "step %d: loss %.17g vs %.17g", k, i0.loss, i1.loss);
		bk_trainer_step(t0, NULL);
		bk_trainer_step(t1, NULL);
	}
	CHECK(!memcmp(t0->lora->flat, t1->lora->flat, t0->lora->n_flat * 4),
	      "trainer: 3 steps with grad_checkpoint %d give the same adapter bit for bit", ckpt);
	bk_trainer_free(t0);
	bk_trainer_free(t1);
}

/* (d) a random Llama with I = 3H (stories260K has I < 3H): the trainer keeps the loss's
 * student, teacher and gradient rows in the acts' spare (gpu/train.c rows_in_acts,
 * gpu/model.c invariant 13); 3 steps give the same losses and adapter, bit for bit, as
 * with the rows in their own buffers, without checkpointing, with it, and in segments */
static void test_rows_in_acts(void)
{
	enum { H = 32, I = 96, L = 3, NH = 4, NKV = 2, D = 8, V = 512 };
	static float inv[D / 2];
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	bk_llama_config c = {.H = H, .I = I, .L = L, .NH = NH, .NKV = NKV, .D = D, .V = V,
			     .rms_eps = 1e-5f, .inv_freq = inv};
	size_t n = 2 * (size_t)V * H + H + L * (2 * (size_t)NH * D * H + 2 * (size_t)NKV * D * H +
						 3 * (size_t)I * H + 2 * H);
	float *w = xmalloc(n * sizeof(float)), *p = w;
	for (size_t i = 0; i < n; i++)
		w[i] = ((float)bk_rng_uniform(&rng) - 0.5f) * 0.4f;
#define TAKE(k) (p += (k), p - (k))
	bk_llama_layer_weights lw[L];
	for (int l = 0; l < L; l++) {
		lw[l] = (bk_llama_layer_weights){0};
		lw[l].wq = TAKE((size_t)NH * D * H), lw[l].wk = TAKE((size_t)NKV * D * H);
		lw[l].wv = TAKE((size_t)NKV * D * H), lw[l].wo = TAKE((size_t)H * NH * D);
		lw[l].w_gate = TAKE((size_t)I * H), lw[l].w_up = TAKE((size_t)I * H);
		lw[l].w_down = TAKE((size_t)H * I);
		lw[l].attn_norm = TAKE(H), lw[l].mlp_norm = TAKE(H);
	}
	bk_llama_weights ws = {.embed = TAKE((size_t)V * H), .final_norm = TAKE(H),
			       .lm_head = TAKE((size_t)V * H), .layers = lw};
#undef TAKE
	BUG_ON(p != w + n);
	bk_model *m = bk_model_create(&bk_ops_host, &c, &ws);
	bk_train_sample s[3];
	make_samples(s);
	int ckpts[3] = {0, 1, 2};
	for (int k = 0; k < 3; k++) {
		bk_train_opts o = {.r = 4, .alpha = 8, .dropout = 0.1f, .targets = BK_LORA_ALL,
				   .lr = 2e-3, .max_grad_norm = 1.0, .sched = BK_SCHED_CONSTANT,
				   .temperature = 1, .seed = 11, .vocab_chunk = 100,
				   .grad_checkpoint = ckpts[k]};
		bk_trainer *t0 = bk_trainer_create(m, &o), *t1 = bk_trainer_create(m, &o);
		CHECK(t1->rows_in_acts, "I = 3H: the loss rows go in the acts");
		t0->rows_in_acts = 0; /* before anything is reserved: their own buffers */
		int same = 1;
		for (int st = 0; st < 3; st++) {
			bk_train_micro_info i0, i1;
			bk_trainer_micro(t0, s, 3, &i0);
			bk_trainer_micro(t1, s, 3, &i1);
			same &= i0.loss == i1.loss;
			bk_trainer_step(t0, NULL);
			bk_trainer_step(t1, NULL);
		}
		CHECK(same && !memcmp(t0->lora->flat, t1->lora->flat, t0->lora->n_flat * 4),
		      "checkpoint %d: the loss rows in the acts give other losses or another "
		      "adapter than in their own buffers", ckpts[k]);
		bk_trainer_free(t0);
		bk_trainer_free(t1);
	}
	bk_model_free(m);
	free(w);
}

int main(void)
{
	bk_diag_init("test_checkpoint");
	bk_rng_seed(&rng, 5);
	lm = bk_model_load(&bk_ops_host, "models/stories260K");
	M = lm.model;
	unsigned qvd = (1u << BK_LORA_Q) | (1u << BK_LORA_V) | (1u << BK_LORA_DOWN);
	int ckpts[4] = {1, 2, 3, M->cfg.L};
	for (int i = 0; i < 4; i++) {
		char w[64];
		snprintf(w, sizeof w, "all modules, checkpoint %d", ckpts[i]);
		test_same_bits(BK_LORA_ALL, ckpts[i], w);
		snprintf(w, sizeof w, "q,v,down, checkpoint %d", ckpts[i]);
		test_same_bits(qvd, ckpts[i], w);
		test_trainer(ckpts[i]);
	}
	test_bytes();
	test_rows_in_acts();
	bk_model_unload(&lm);
	return bk_test_done("test_checkpoint");
}
