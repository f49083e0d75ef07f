/* test_train.c - the training step of gpu/train.c on models/stories260K (host twin):
 * (a) a packed micro-batch's loss and LoRA gradients equal a direct composition of
 *     one-sequence forwards + loss + backward (batch loss = mean over samples);
 * (b) gradient accumulation: two micro-batches of one sample each (grad_accum 2) give
 *     the same averaged gradient and update as one micro-batch of both samples, for
 *     samples of DIFFERENT lengths (per-sample means, then the mean over samples, so
 *     equal sample counts per micro-batch suffice); with unequal counts (1 + 2 vs 3)
 *     the two differ, as in the HF Trainer;
 * (c) exact mode (teacher run here) and a full-distribution teacher field (k = 0)
 *     give the same loss (1e-5) and gradients, at temperatures 1 and 2;
 * (d) the loss decreases over 20 steps of a small bake;
 * (e) save after 3 steps + resume + 2 steps = 5 uninterrupted steps, bit for bit. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "common/rng.h"
#include "gpu/load.h"
#include "gpu/host/loss.h"
#include "gpu/train.h"
#include "tests/harness.h"

static bk_loaded_model lm;
static const bk_model *M;
static bk_rng rng;

typedef struct {
	int32_t s[16], t[40], r[16];
	int ns, nt, nr;
} seq;

/* student prompt BOS + user ids; teacher prompt BOS + system ids + the same user ids */
static void make_seq(seq *q, const int32_t *sys, int nsys, int nuser, int nresp)
{
	int32_t user[16];
	for (int i = 0; i < nuser; i++)
		user[i] = 3 + (int32_t)bk_rng_below(&rng, 500);
	q->s[0] = q->t[0] = 1;
	memcpy(q->s + 1, user, (size_t)nuser * 4);
	memcpy(q->t + 1, sys, (size_t)nsys * 4);
	memcpy(q->t + 1 + nsys, user, (size_t)nuser * 4);
	q->ns = 1 + nuser;
	q->nt = 1 + nsys + nuser;
	for (int i = 0; i < nresp; i++)
		q->r[i] = 3 + (int32_t)bk_rng_below(&rng, 500);
	q->nr = nresp;
}

static bk_train_sample smp(const seq *q, const bk_teacher *tc)
{
	return (bk_train_sample){q->s, q->t, q->r, q->ns, q->nt, q->nr, tc};
}

static bk_train_opts base_opts(float temperature)
{
	return (bk_train_opts){.r = 4, .alpha = 8, .dropout = 0, .targets = BK_LORA_ALL,
			       .lr = 1e-3, .max_grad_norm = 0, .sched = BK_SCHED_CONSTANT,
			       .temperature = temperature, .seed = 7, .vocab_chunk = 100};
}

/* give B random values too, so the gradients of A are not zero */
static void randomize_b(bk_trainer *t)
{
	for (int l = 0; l < t->lora->L; l++)
		for (int m = 0; m < BK_LORA_NMOD; m++) {
			int in, out;
			bk_model_module_dims(&M->cfg, m, &in, &out);
			float *b = t->lora->B[l][m];
			for (int i = 0; i < out * t->lora->r; i++)
				b[i] = (float)(bk_rng_uniform(&rng) - 0.5) * 0.2f;
		}
}

/* rows [n,H] of a one-sequence forward of prompt + resp (lora NULL: teacher) */
static void forward_rows(bk_acts *a, const bk_lora *lora, const int32_t *p, int np,
			 const int32_t *r, int nr, float *hid, float *rows)
{
	int T = np + nr, H = M->cfg.H;
	int32_t ids[64], pos[64], cu[2] = {0, T};
	memcpy(ids, p, (size_t)np * 4);
	memcpy(ids + np, r, (size_t)nr * 4);
	for (int i = 0; i < T; i++)
		pos[i] = i;
	bk_batch b = {.T = T, .S = 1, .ids = ids, .pos = pos, .cu_seqlens = cu};
	bk_model_forward(M, lora, &b, NULL, a, hid);
	memcpy(rows, hid + (size_t)(np - 1) * H, (size_t)nr * H * sizeof(float));
}

/* (a) direct composition: mean over samples of each sample's own loss */
static void test_packing(void)
{
	int32_t sys[6] = {301, 427, 295, 433, 422, 265};
	seq q[3];
	make_seq(&q[0], sys, 6, 4, 5);
	make_seq(&q[1], sys, 6, 7, 3);
	make_seq(&q[2], sys, 6, 2, 0); /* empty response: dropped */
	bk_train_opts o = base_opts(1.0f);
	bk_trainer *t = bk_trainer_create(M, &o);
	randomize_b(t);
	bk_train_sample s[3] = {smp(&q[0], NULL), smp(&q[1], NULL), smp(&q[2], NULL)};
	bk_train_micro_info info;
	bk_trainer_micro(t, s, 3, &info);
	CHECK(info.samples == 2 && info.rows == 8 && info.tokens == 5 + 5 + 8 + 3,
	      "samples %d rows %lld tokens %lld", info.samples, (long long)info.rows,
	      (long long)info.tokens);

	int H = M->cfg.H, V = M->cfg.V;
	bk_acts *a = bk_acts_create(M, 64, o.r);
	bk_lora *g = bk_lora_create_like(M, t->lora);
	float *hid = xmalloc(64 * (size_t)H * 4), *sr = xmalloc(16 * (size_t)H * 4);
	float *tr = xmalloc(16 * (size_t)H * 4), *dr = xmalloc(16 * (size_t)H * 4);
	float *dh = xcalloc(64 * (size_t)H, 4);
	int32_t so[16] = {0};
	double want = 0;
	for (int i = 0; i < 2; i++) {
		forward_rows(a, NULL, q[i].t, q[i].nt, q[i].r, q[i].nr, hid, tr);
		forward_rows(a, t->lora, q[i].s, q[i].ns, q[i].r, q[i].nr, hid, sr);
		double li = bk_loss_kl_exact(sr, (const float *)M->lm_head->data, tr, NULL, so,
					     q[i].nr, 1, H, V, 100, 1.0f, 0.0f, dr, NULL);
		want += li / 2;
		int T = q[i].ns + q[i].nr;
		memset(dh, 0, (size_t)T * H * 4);
		for (size_t k = 0; k < (size_t)q[i].nr * H; k++) /* batch weight 1/2 */
			dh[(size_t)(q[i].ns - 1) * H + k] = dr[k] / 2;
		int32_t ids[64], pos[64], cu[2] = {0, T};
		memcpy(ids, q[i].s, (size_t)q[i].ns * 4);
		memcpy(ids + q[i].ns, q[i].r, (size_t)q[i].nr * 4);
		for (int k = 0; k < T; k++)
			pos[k] = k;
		bk_batch b = {.T = T, .S = 1, .ids = ids, .pos = pos, .cu_seqlens = cu};
		forward_rows(a, t->lora, q[i].s, q[i].ns, q[i].r, q[i].nr, hid, sr);
		bk_model_backward(M, t->lora, &b, a, dh, g);
	}
	CHECK(bk_relerr(info.loss, want, 1e-9) < 1e-5, "packed loss %.9g, composed %.9g",
	      info.loss, want);
	CHECK(want > 1e-3, "the teacher differs from the student (loss %g)", want);
	double e = bk_max_relerr(t->grads->flat, g->flat, g->n_flat, 1e-12);
	CHECK(e < 1e-4, "packed gradients vs composed: max rel err %g", e);
	double gn = 0;
	for (size_t i = 0; i < g->n_flat; i++)
		gn += (double)g->flat[i] * g->flat[i];
	CHECK(gn > 0, "gradients are not all zero");
	bk_lora_free(M, g);
	bk_acts_free(M, a);
	free(hid), free(sr), free(tr), free(dr), free(dh);
	bk_trainer_free(t);
}

/* (b) accumulation */
static void test_accum(void)
{
	int32_t sys[4] = {301, 427, 295, 433};
	seq q[3];
	make_seq(&q[0], sys, 4, 5, 6);
	make_seq(&q[1], sys, 4, 3, 2);
	make_seq(&q[2], sys, 4, 6, 4);
	bk_train_opts o = base_opts(1.0f);
	bk_trainer *acc = bk_trainer_create(M, &o), *one = bk_trainer_create(M, &o);
	bk_rng save = rng;
	randomize_b(acc);
	rng = save;
	randomize_b(one);
	bk_train_micro_info i0, i1, ib;
	bk_train_sample s[3] = {smp(&q[0], NULL), smp(&q[1], NULL), smp(&q[2], NULL)};
	bk_trainer_micro(acc, &s[0], 1, &i0);
	bk_trainer_micro(acc, &s[1], 1, &i1);
	bk_trainer_micro(one, s, 2, &ib);
	CHECK(acc->n_micro == 2 && one->n_micro == 1, "micro counts %d %d", acc->n_micro,
	      one->n_micro);
	CHECK(bk_relerr((i0.loss + i1.loss) / 2, ib.loss, 1e-9) < 1e-5,
	      "mean of micro losses %.9g vs batch loss %.9g", (i0.loss + i1.loss) / 2, ib.loss);
	size_t n = acc->lora->n_flat;
	float *avg = xmalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		avg[i] = acc->grads->flat[i] / 2;
	double e = bk_max_relerr(avg, one->grads->flat, n, 1e-12);
	CHECK(e < 1e-4, "accumulated/2 vs batch gradient: max rel err %g", e);
	double lr0, lr1;
	double n0 = bk_trainer_step(acc, &lr0), n1 = bk_trainer_step(one, &lr1);
	CHECK(bk_relerr(n0, n1, 1e-12) < 1e-5, "grad norms %g %g", n0, n1);
	/* Adam's first update is about lr * sign(g) whatever |g|, so entries whose gradient
	 * is near eps turn gradient rounding into up to ~lr of difference: compare the
	 * parameters to 1e-4 of their largest value (lr is 1e-3 of it) */
	e = bk_max_relerr(acc->lora->flat, one->lora->flat, n, 1e-12);
	CHECK(e < 1e-4, "parameters after the step: max rel err %g", e);

	/* unequal sample counts: (g0 + (g1+g2)/2)/2 is not (g0+g1+g2)/3 */
	bk_trainer_micro(acc, &s[0], 1, &i0);
	bk_trainer_micro(acc, &s[1], 2, &i1);
	bk_trainer_micro(one, s, 3, &ib);
	for (size_t i = 0; i < n; i++)
		avg[i] = acc->grads->flat[i] / 2;
	e = bk_max_relerr(avg, one->grads->flat, n, 1e-12);
	CHECK(e > 1e-3, "1 + 2 samples accumulated differs from a batch of 3 (rel %g)", e);
	free(avg);
	bk_trainer_free(acc);
	bk_trainer_free(one);
}

/* (c) exact mode vs a full teacher field */
static void test_exact_vs_full(float temperature)
{
	int32_t sys[5] = {301, 427, 295, 433, 422};
	seq q[2];
	make_seq(&q[0], sys, 5, 4, 6);
	make_seq(&q[1], sys, 5, 6, 4);
	bk_train_opts o = base_opts(temperature);
	bk_trainer *ex = bk_trainer_create(M, &o), *fu = bk_trainer_create(M, &o);
	bk_rng save = rng;
	randomize_b(ex);
	rng = save;
	randomize_b(fu);
	int H = M->cfg.H, V = M->cfg.V;
	bk_acts *a = bk_acts_create(M, 64, o.r);
	float *hid = xmalloc(64 * (size_t)H * 4), *tr = xmalloc(16 * (size_t)H * 4);
	bk_teacher tc[2];
	for (int i = 0; i < 2; i++) {
		forward_rows(a, NULL, q[i].t, q[i].nt, q[i].r, q[i].nr, hid, tr);
		tc[i] = (bk_teacher){.k = 0, .temperature = temperature, .n = q[i].nr, .v = V};
		tc[i].logp = xmalloc((size_t)q[i].nr * V * 4);
		bk_teacher_logprobs(tr, (const float *)M->lm_head->data, q[i].nr, H, V, 128,
				    temperature, 0.0f, tc[i].logp);
	}
	bk_train_sample se[2] = {smp(&q[0], NULL), smp(&q[1], NULL)};
	bk_train_sample sf[2] = {smp(&q[0], &tc[0]), smp(&q[1], &tc[1])};
	bk_train_micro_info ie, iff;
	bk_trainer_micro(ex, se, 2, &ie);
	bk_trainer_micro(fu, sf, 2, &iff);
	CHECK(fabs(ie.loss - iff.loss) < 1e-5, "T=%g: exact loss %.9g, full field %.9g",
	      (double)temperature, ie.loss, iff.loss);
	CHECK(ie.teacher_tokens == q[0].nt + q[0].nr + q[1].nt + q[1].nr && !iff.teacher_tokens,
	      "teacher tokens %lld / %lld", (long long)ie.teacher_tokens,
	      (long long)iff.teacher_tokens);
	double e = bk_max_relerr(ex->grads->flat, fu->grads->flat, ex->lora->n_flat, 1e-12);
	CHECK(e < 1e-4, "T=%g: exact vs full gradients: max rel err %g", (double)temperature, e);
	for (int i = 0; i < 2; i++)
		free(tc[i].logp);
	free(hid), free(tr);
	bk_acts_free(M, a);
	bk_trainer_free(ex);
	bk_trainer_free(fu);
}

/* (d) a small bake: 4 prompts, exact mode, 20 steps */
static void test_decrease(void)
{
	int32_t sys[8] = {301, 427, 295, 433, 422, 265, 279, 420};
	seq q[4];
	for (int i = 0; i < 4; i++)
		make_seq(&q[i], sys, 8, 3 + i, 6);
	bk_train_opts o = base_opts(1.0f);
	o.r = 8, o.alpha = 16, o.lr = 2e-3, o.max_grad_norm = 1.0, o.dropout = 0.05f;
	bk_trainer *t = bk_trainer_create(M, &o);
	bk_train_sample s[4];
	for (int i = 0; i < 4; i++)
		s[i] = smp(&q[i], NULL);
	double first = 0, last = 0;
	for (int step = 0; step < 20; step++) {
		bk_train_micro_info info;
		bk_trainer_micro(t, s, 4, &info);
		bk_trainer_step(t, NULL);
		if (step == 0)
			first = info.loss;
		last = info.loss;
	}
	CHECK(first > 1e-3 && last < 0.5 * first, "loss over 20 steps: %g -> %g", first, last);
	fprintf(stderr, "small bake: loss %.5f -> %.5f in 20 steps\n", first, last);
	bk_trainer_free(t);
}

/* (e) checkpoint + resume = uninterrupted */
static void test_resume(void)
{
	int32_t sys[4] = {301, 427, 295, 433};
	seq q[3];
	for (int i = 0; i < 3; i++)
		make_seq(&q[i], sys, 4, 3 + i, 4 + i);
	bk_train_opts o = base_opts(1.0f);
	o.dropout = 0.1f, o.sched = BK_SCHED_LINEAR, o.total = 5, o.max_grad_norm = 0.5;
	bk_train_sample s[3] = {smp(&q[0], NULL), smp(&q[1], NULL), smp(&q[2], NULL)};
	char dir[] = "/tmp/bk-test-train.XXXXXX";
	if (!mkdtemp(dir))
		die("mkdtemp: failed");
	char *ck = bk_path_join(dir, "checkpoint-3");
	bk_train_setting set[1] = {{"lr", "0.001"}};
	bk_train_progress p = {.epoch = 1, .micro_in_epoch = 2, .records = 9, .loss_sum = 0.25,
			       .order_seed = 12345678901234567ULL};
	bk_trainer *a = bk_trainer_create(M, &o), *b = NULL;
	for (int step = 0; step < 5; step++) {
		bk_train_micro_info info;
		bk_trainer_micro(a, s, 2, &info);
		bk_trainer_micro(a, s + 2, 1, &info);
		bk_trainer_step(a, NULL);
		if (step == 2) {
			bk_trainer_save(a, lm.cfg, "models/stories260K", &p, set, 1, ck);
			b = bk_trainer_create(M, &o);
			bk_train_progress p2;
			bk_trainer_resume(b, lm.cfg, ck, &p2, set, 1);
			CHECK(!memcmp(&p, &p2, sizeof p), "progress round trip");
			CHECK(b->step == 3 && b->opt.step == 3, "steps %lld %lld", (long long)b->step,
			      (long long)b->opt.step);
		}
		if (step >= 3) {
			bk_trainer_micro(b, s, 2, &info);
			bk_trainer_micro(b, s + 2, 1, &info);
			bk_trainer_step(b, NULL);
		}
	}
	CHECK(!memcmp(a->lora->flat, b->lora->flat, a->lora->n_flat * sizeof(float)),
	      "resumed adapter equals the uninterrupted one bit for bit");
	CHECK(!memcmp(a->opt.m, b->opt.m, a->lora->n_flat * 4) &&
	      !memcmp(a->opt.v, b->opt.v, a->lora->n_flat * 4), "optimizer state equal");
	char *cmd = xasprintf("rm -rf '%s'", dir);
	CHECK(system(cmd) == 0, "cleanup");
	free(cmd);
	free(ck);
	bk_trainer_free(a);
	bk_trainer_free(b);
}

int main(void)
{
	bk_diag_init("test_train");
	bk_rng_seed(&rng, 42);
	lm = bk_model_load(&bk_ops_host, "models/stories260K");
	M = lm.model;
	test_packing();
	test_accum();
	test_exact_vs_full(1.0f);
	test_exact_vs_full(2.0f);
	test_decrease();
	test_resume();
	bk_model_unload(&lm);
	return bk_test_done("test_train");
}
