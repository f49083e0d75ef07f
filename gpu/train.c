/* train.c - the training step and checkpoint state of bk-step (see train.h).
 * Not the data plan and not the math of the model, loss or optimizer.
 *
 * The loss runs through the op table (ops.h kl_exact / kl_topk): the response rows of
 * the final hidden states are gathered on the device, their gradient scattered back
 * into a zeroed [T,H] buffer; only the loss and the teacher records cross to/from the
 * host. */
#include "gpu/train.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/rng.h"
#include "formats/peft.h"
#include "formats/safetensors.h"
#include "gpu/load.h"
#include "gpu/host/loss.h"
#include "formats/msgjson.h"

#define GROW(p, cap, want)                                                     \
	do {                                                                   \
		if ((size_t)(want) > (cap)) {                                  \
			(cap) = (size_t)(want) * 2;                            \
			(p) = xrealloc((p), (cap) * sizeof(*(p)));             \
		}                                                              \
	} while (0)

/* The optimizer state (invariant 3), zero: AdamW's m = v = 0 (8-bit: absmax 0). */
static void optim_create(bk_trainer *t)
{
	const bk_ops *ops = t->m->ops;
	const bk_lora *lo = t->lora;
	size_t n = lo->n_flat;
	if (!(t->o.weight_decay >= 0))
		die("adamw: weight decay %g must be >= 0", t->o.weight_decay);
	if (t->o.optim == BK_OPTIM_ADAMW) {
		t->opt.m = bk_alloc(ops, n * sizeof(float), "optimizer state");
		t->opt.v = bk_alloc(ops, n * sizeof(float), "optimizer state");
		ops->zero(t->opt.m, n * sizeof(float));
		ops->zero(t->opt.v, n * sizeof(float));
		return;
	}
	if (t->o.optim != BK_OPTIM_ADAMW8BIT)
		BUG("optimizer kind %d", (int)t->o.optim);
	if (!t->o.optim_block)
		t->o.optim_block = BK_Q8_BLOCK;
	if (t->o.optim_block != 256 && t->o.optim_block != 2048)
		die("adamw8bit: block of %d values (256 or 2048)", t->o.optim_block);
	/* the LoRA tensors in flat order: A then B of each targeted (layer, module) */
	t->opt.tensors = xcalloc(2 * (size_t)lo->L * BK_LORA_NMOD, sizeof(*t->opt.tensors));
	size_t nb = 0;
	for (int l = 0; l < lo->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			if (!lo->A[l][mod])
				continue;
			int in, out;
			bk_model_module_dims(&t->m->cfg, mod, &in, &out);
			const float *start[2] = {lo->A[l][mod], lo->B[l][mod]};
			size_t len[2] = {(size_t)lo->r * in, (size_t)out * lo->r};
			for (int ab = 0; ab < 2; ab++) {
				int i = t->opt.n_tensors++;
				t->opt.tensors[i].off = (size_t)(start[ab] - lo->flat);
				t->opt.tensors[i].n = len[ab];
				t->opt.tensors[i].block0 = nb;
				nb += bk_q8_blocks(len[ab], t->o.optim_block);
			}
		}
	t->opt.n_blocks = nb;
	t->opt.qm = bk_alloc(ops, n ? n : 1, "optimizer state");
	t->opt.qv = bk_alloc(ops, n ? n : 1, "optimizer state");
	t->opt.am = bk_alloc(ops, (nb ? nb : 1) * sizeof(float), "optimizer state");
	t->opt.av = bk_alloc(ops, (nb ? nb : 1) * sizeof(float), "optimizer state");
	ops->zero(t->opt.qm, n);
	ops->zero(t->opt.qv, n);
	ops->zero(t->opt.am, nb * sizeof(float));
	ops->zero(t->opt.av, nb * sizeof(float));
}

bk_trainer *bk_trainer_create(const bk_model *m, const bk_train_opts *o)
{
	bk_trainer *t = xcalloc(1, sizeof(*t));
	t->m = m;
	t->o = *o;
	if (t->o.vocab_chunk <= 0)
		t->o.vocab_chunk = 4096;
	if (!(o->temperature > 0))
		die("temperature %g is not positive", (double)o->temperature);
	t->lora = bk_lora_create(m, o->r, o->alpha, o->dropout, o->targets);
	bk_lora_init_peft(m, t->lora, o->seed);
	t->grads = bk_lora_create_like(m, t->lora);
	t->rows_in_acts = 3 * (int64_t)m->cfg.H <= m->cfg.I; /* gpu/memplan.c the same */
	optim_create(t);
	return t;
}

void bk_trainer_free(bk_trainer *t)
{
	if (!t)
		return;
	const bk_ops *ops = t->m->ops;
	bk_acts_free(t->m, t->acts); /* hid, dhid with them */
	bk_lora_free(t->m, t->lora);
	bk_lora_free(t->m, t->grads);
	ops->free(t->opt.m), ops->free(t->opt.v), ops->free(t->opt.qm), ops->free(t->opt.qv);
	ops->free(t->opt.am), ops->free(t->opt.av);
	free(t->opt.tensors);
	free(t->ids), free(t->pos), free(t->cu), free(t->sample_of), free(t->rows);
	ops->free(t->rows_d), ops->free(t->tk_rest_d);
	if (!t->rows_in_acts)
		ops->free(t->hrows_d), ops->free(t->trows_d), ops->free(t->drows_d);
	ops->free(t->tk_ids_d), ops->free(t->tk_logp_d);
	free(t);
}

void bk_trainer_reserve(bk_trainer *t, int max_T)
{
	if (max_T <= t->acts_T)
		return;
	bk_acts_free(t->m, t->acts);
	t->acts = bk_acts_create_ckpt(t->m, max_T, t->o.r, t->o.grad_checkpoint);
	/* one buffer, the acts' own: the hidden states are gathered into rows right after
	 * each forward, and the backward reads their gradient before anything else writes
	 * there (gpu/model.h bk_acts_hidden) */
	t->hid = t->dhid = bk_acts_hidden(t->acts);
	if (t->rows_in_acts) { /* the loss rows in the acts' spare [max_T,I] (3 H <= I) */
		size_t n, rows = (size_t)max_T * t->m->cfg.H;
		t->hrows_d = bk_acts_spare(t->m, t->acts, &n);
		BUG_ON(!t->hrows_d || n < 3 * rows);
		t->trows_d = t->hrows_d + rows;
		t->drows_d = t->trows_d + rows;
	}
	t->acts_T = max_T;
}

/* ---- one micro-batch ---- */

enum { KIND_EXACT, KIND_FULL, KIND_TOPK };

/* Packs sequences prompt_i + resp_i of the samples in idx into t->ids/pos/cu and
 * the response rows (positions a-1 .. a+n-2 of each) into t->rows; returns T. */
static int pack(bk_trainer *t, const bk_train_sample *s, const int *idx, int ns, int teacher)
{
	int T = 0, N = 0;
	for (int i = 0; i < ns; i++) {
		const bk_train_sample *x = &s[idx[i]];
		T += (teacher ? x->t_len : x->s_len) + x->n_resp;
		N += x->n_resp;
	}
	GROW(t->ids, t->cap_T, T);
	t->pos = xrealloc(t->pos, t->cap_T * sizeof(*t->pos));
	GROW(t->cu, t->cap_S, ns + 1);
	GROW(t->rows, t->cap_N, N);
	t->sample_of = xrealloc(t->sample_of, t->cap_N * sizeof(*t->sample_of));
	int off = 0, r = 0;
	t->cu[0] = 0;
	for (int i = 0; i < ns; i++) {
		const bk_train_sample *x = &s[idx[i]];
		int a = teacher ? x->t_len : x->s_len;
		memcpy(t->ids + off, teacher ? x->t_prompt : x->s_prompt, (size_t)a * sizeof(int32_t));
		memcpy(t->ids + off + a, x->resp, (size_t)x->n_resp * sizeof(int32_t));
		for (int p = 0; p < a + x->n_resp; p++)
			t->pos[off + p] = p;
		for (int j = 0; j < x->n_resp; j++, r++) {
			t->rows[r] = off + a - 1 + j;
			t->sample_of[r] = i;
		}
		off += a + x->n_resp;
		t->cu[i + 1] = off;
	}
	return T;
}

/* device scratch of the loss for N rows and tk teacher numbers (ids or log-probs), sized
 * to the largest micro-batch so far and no more (like the activations): a new largest
 * one frees and reallocates; the memory plan counts exactly these bytes.  With
 * rows_in_acts the [N,H] rows are not allocated here but live in the acts' spare
 * (bk_trainer_reserve): N <= the student's tokens <= acts_T, and the rows are dead
 * before the backward's first layer (gather after a forward, loss, scatter into dhid) */
static void loss_reserve(bk_trainer *t, int N, size_t tk)
{
	const bk_ops *ops = t->m->ops;
	size_t H = (size_t)t->m->cfg.H;
	if ((size_t)N > t->cap_rows_d) {
		size_t cap = (size_t)N;
		ops->free(t->rows_d), ops->free(t->tk_rest_d);
		t->rows_d = bk_alloc(ops, cap * sizeof(int32_t), "loss rows");
		if (!t->rows_in_acts) {
			ops->free(t->hrows_d), ops->free(t->trows_d), ops->free(t->drows_d);
			t->hrows_d = bk_alloc(ops, cap * H * sizeof(float), "loss rows");
			t->trows_d = bk_alloc(ops, cap * H * sizeof(float), "loss rows");
			t->drows_d = bk_alloc(ops, cap * H * sizeof(float), "loss rows");
		}
		t->tk_rest_d = bk_alloc(ops, cap * sizeof(float), "loss rows");
		t->cap_rows_d = cap;
	}
	if (tk > t->cap_tk_d) {
		size_t cap = tk;
		ops->free(t->tk_ids_d), ops->free(t->tk_logp_d);
		t->tk_ids_d = bk_alloc(ops, cap * sizeof(int32_t), "teacher fields");
		t->tk_logp_d = bk_alloc(ops, cap * sizeof(float), "teacher fields");
		t->cap_tk_d = cap;
	}
}

/* dst [N,H] (device) = rows t->rows of the final hidden states [T,H]; leaves the row
 * list in t->rows_d */
static void gather_rows(bk_trainer *t, float *dst, int N, int T)
{
	const bk_ops *ops = t->m->ops;
	ops->upload(t->rows_d, t->rows, (size_t)N * sizeof(int32_t));
	ops->gather_rows(dst, t->hid, t->rows_d, N, T, t->m->cfg.H);
}

/* Exact mode: the teacher's response rows of the samples idx[0..ns) into t->trows_d, in
 * sample order; returns the teacher tokens run.  The teacher's sequences (system prompt
 * and all) are longer than the student's, so they run in chunks of whole sequences of
 * at most the student's tokens (or one sequence, when that is longer): the training
 * activations are sized for the student's micro-batch (gpu/memplan.c plans the same).
 * The chunks are a function of the micro-batch alone, not of what was reserved before,
 * so a run's numbers do not depend on its history (resume). */
static int64_t teacher_rows(bk_trainer *t, const bk_train_sample *s, const int *idx, int ns)
{
	const bk_model *m = t->m;
	int Ts = 0, cap = 0, r0 = 0;
	for (int i = 0; i < ns; i++) {
		const bk_train_sample *x = &s[idx[i]];
		Ts += x->s_len + x->n_resp;
		if (x->t_len + x->n_resp > cap)
			cap = x->t_len + x->n_resp;
	}
	cap = cap > Ts ? cap : Ts;
	bk_trainer_reserve(t, cap);
	int64_t Tt = 0;
	for (int i0 = 0, i1; i0 < ns; i0 = i1) {
		int tok = 0, n = 0;
		for (i1 = i0; i1 < ns; i1++) {
			const bk_train_sample *x = &s[idx[i1]];
			if (i1 > i0 && tok + x->t_len + x->n_resp > cap)
				break;
			tok += x->t_len + x->n_resp;
			n += x->n_resp;
		}
		int T = pack(t, s, idx + i0, i1 - i0, 1);
		bk_batch tb = {.T = T, .S = i1 - i0, .ids = t->ids, .pos = t->pos,
			       .cu_seqlens = t->cu};
		bk_model_forward(m, NULL, &tb, NULL, t->acts, t->hid);
		gather_rows(t, t->trows_d + (size_t)r0 * m->cfg.H, n, T);
		r0 += n;
		Tt += T;
	}
	return Tt;
}

static int sample_kind(const bk_train_sample *x) {
	return !x->teacher ? KIND_EXACT : x->teacher->k ? KIND_TOPK : KIND_FULL;
}

/* the micro-batch's forward and loss; train: dropout, backward into grads, n_micro
 * counted; else forward only (the adapter as it is, no dropout), grads untouched */
static void run_micro(bk_trainer *t, const bk_train_sample *s, int n,
		      bk_train_micro_info *info, int train)
{
	const bk_model *m = t->m;
	const bk_ops *ops = m->ops;
	const int H = m->cfg.H, V = m->cfg.V;
	memset(info, 0, sizeof(*info));
	int *idx = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
	int ns = 0, kind = -1, K = 0;
	for (int i = 0; i < n; i++) {
		const bk_train_sample *x = &s[i];
		if (x->n_resp < 0 || x->s_len < 0 || x->t_len < 0)
			BUG("negative length in sample %d", i);
		int k = sample_kind(x);
		if (kind < 0)
			kind = k, K = x->teacher ? x->teacher->k : 0;
		else if (k != kind || (x->teacher && x->teacher->k != K))
			die("micro-batch sample %d: its teacher field differs in kind from sample 0's "
			    "(all exact, all full or all top-k with one k)", i);
		if (x->teacher) {
			const bk_teacher *tc = x->teacher;
			if (tc->n != x->n_resp)
				die("micro-batch sample %d: teacher has %d positions, resp has %d tokens",
				    i, tc->n, x->n_resp);
			if (tc->v != V)
				die("micro-batch sample %d: teacher vocabulary %d, model vocabulary %d",
				    i, tc->v, V);
			if (fabsf(tc->temperature - t->o.temperature) >
			    1e-6f * fmaxf(1.0f, t->o.temperature))
				die("micro-batch sample %d: teacher temperature %g differs from the "
				    "training temperature %g", i, (double)tc->temperature,
				    (double)t->o.temperature);
		}
		if (!x->n_resp)
			continue;
		if (x->s_len < 1 || (kind == KIND_EXACT && x->t_len < 1))
			die("micro-batch sample %d: empty prompt (no position predicts the first "
			    "response token)", i);
		idx[ns++] = i;
	}
	if (train)
		t->n_micro++;
	if (!ns) {
		free(idx);
		return;
	}
	int N = 0;
	for (int i = 0; i < ns; i++)
		N += s[idx[i]].n_resp;
	loss_reserve(t, N, (size_t)N * (kind == KIND_FULL ? V : kind == KIND_TOPK ? K : 0));

	/* teacher first (exact mode): the student's forward must be the one the acts
	 * keep for the backward */
	if (kind == KIND_EXACT)
		info->teacher_tokens = teacher_rows(t, s, idx, ns);
	int T = pack(t, s, idx, ns, 0);
	bk_trainer_reserve(t, T);
	/* the micro-batch's number in its step, 1-based, over all ranks (invariant 4);
	 * n_micro was counted above */
	uint64_t micro = 1 + (uint64_t)t->micro_base +
			 (uint64_t)(t->micro_stride > 0 ? t->micro_stride : 1) *
				 (uint64_t)(t->n_micro - 1);
	bk_batch sb = {.T = T, .S = ns, .ids = t->ids, .pos = t->pos, .cu_seqlens = t->cu,
		       .train = train && t->o.dropout > 0,
		       .dropout_key = bk_crng_key(t->o.seed, (uint64_t)t->step,
						  micro, 0x64726f70 /* "drop" */)};
	bk_model_forward(m, t->lora, &sb, NULL, t->acts, t->hid);
	gather_rows(t, t->hrows_d, N, T);

	int chunk = t->o.vocab_chunk;
	float T_ = t->o.temperature, cap = m->cfg.final_softcap; /* Gemma-2: 0 = none */
	float *drows = train ? t->drows_d : NULL;
	double loss;
	if (kind == KIND_EXACT) {
		loss = ops->kl_exact(t->hrows_d, m->lm_head, t->trows_d, NULL, t->sample_of, N, ns,
				     chunk, T_, cap, drows, NULL);
	} else if (kind == KIND_FULL) {
		size_t r = 0;
		for (int i = 0; i < ns; i++) {
			const bk_teacher *tc = s[idx[i]].teacher;
			ops->upload(t->tk_logp_d + r * V, tc->logp, (size_t)tc->n * V * sizeof(float));
			r += (size_t)tc->n;
		}
		loss = ops->kl_exact(t->hrows_d, m->lm_head, NULL, t->tk_logp_d, t->sample_of, N,
				     ns, chunk, T_, cap, drows, NULL);
	} else {
		size_t r = 0;
		for (int i = 0; i < ns; i++) {
			const bk_teacher *tc = s[idx[i]].teacher;
			ops->upload(t->tk_logp_d + r * K, tc->logp, (size_t)tc->n * K * sizeof(float));
			ops->upload(t->tk_ids_d + r * K, tc->ids, (size_t)tc->n * K * sizeof(int32_t));
			ops->upload(t->tk_rest_d + r, tc->rest, (size_t)tc->n * sizeof(float));
			r += (size_t)tc->n;
		}
		loss = ops->kl_topk(t->hrows_d, m->lm_head, t->tk_ids_d, t->tk_logp_d, t->tk_rest_d,
				    t->sample_of, N, ns, K, chunk, T_, cap, drows, NULL);
	}

	/* scatter dLoss/d(response rows) into a zeroed [T,H] gradient (t->rows_d holds the
	 * student's rows), then backward */
	if (train) {
		float *dh = t->dhid;
		ops->zero(dh, (size_t)T * H * sizeof(float));
		ops->scatter_rows(dh, t->drows_d, t->rows_d, N, T, H);
		bk_model_backward(m, t->lora, &sb, t->acts, dh, t->grads);
	}

	info->loss = loss;
	info->samples = ns;
	info->tokens = T;
	info->rows = N;
	free(idx);
}

void bk_trainer_micro(bk_trainer *t, const bk_train_sample *s, int n,
		      bk_train_micro_info *info)
{
	run_micro(t, s, n, info, 1);
}

void bk_trainer_eval(bk_trainer *t, const bk_train_sample *s, int n,
		     bk_train_micro_info *info)
{
	run_micro(t, s, n, info, 0);
}

/* ---- the optimizer step ---- */

double bk_trainer_lr(const bk_trainer *t)
{
	return bk_sched_lr(t->o.sched, t->o.lr, t->step, t->o.warmup, t->o.total);
}

/* one AdamW update of lora->flat from grads->flat at lr (opt.step already counts it) */
static void optim_update(bk_trainer *t, double lr)
{
	const bk_ops *ops = t->m->ops;
	const double b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = t->o.weight_decay;
	float *p = t->lora->flat, *g = t->grads->flat;
	if (t->o.optim == BK_OPTIM_ADAMW) {
		ops->adamw_step(p, g, t->opt.m, t->opt.v, t->lora->n_flat, lr, b1, b2, eps, wd,
				t->opt.step);
		return;
	}
	for (int i = 0; i < t->opt.n_tensors; i++) {
		size_t off = t->opt.tensors[i].off, b0 = t->opt.tensors[i].block0;
		ops->adamw8_step(p + off, g + off, t->opt.qm + off, t->opt.qv + off, t->opt.am + b0,
				 t->opt.av + b0, t->opt.tensors[i].n, t->o.optim_block, lr, b1, b2,
				 eps, wd, t->opt.step);
	}
}

double bk_trainer_step(bk_trainer *t, double *lr_out)
{
	const bk_ops *ops = t->m->ops;
	size_t n = t->lora->n_flat;
	float *g = t->grads->flat;
	if (t->n_micro <= 0)
		BUG("optimizer step without a micro-batch");
	if (t->n_micro > 1) /* the average (invariant 2) */
		ops->scale(g, 1.0 / t->n_micro, n);
	double norm = sqrt(ops->grad_sumsq(g, n)); /* invariant 5 */
	double lr = bk_trainer_lr(t);
	if (isfinite(norm)) {
		if (t->o.max_grad_norm > 0) {
			/* torch.nn.utils.clip_grad_norm_ */
			double coef = t->o.max_grad_norm / (norm + 1e-6);
			if (coef < 1)
				ops->scale(g, coef, n);
		}
		t->opt.step++;
		optim_update(t, lr);
	} else {
		warn("step %lld: gradient norm is not finite; update skipped", (long long)t->step + 1);
	}
	t->step++;
	bk_trainer_drop(t);
	if (lr_out)
		*lr_out = lr;
	return norm;
}

void bk_trainer_drop(bk_trainer *t)
{
	t->m->ops->zero(t->grads->flat, t->grads->n_flat * sizeof(float));
	t->n_micro = 0;
}

/* ---- checkpoints ---- */

#define STATE_FORMAT "bakery-trainer-state"
#define STATE_VERSION 2 /* 2 added 'checksums'; a version 1 state has none */

/* the files of a checkpoint whose bytes trainer_state.json's 'checksums' records */
static const char *const ckpt_files[] = {"adapter_model.safetensors", "adapter_config.json",
					 "trainer_state.safetensors"};
#define N_CKPT_FILES (sizeof ckpt_files / sizeof *ckpt_files)

/* "xxh3-64:" and the 16 hex digits of the XXH3-64 of a file's bytes */
static void file_sum(const char *path, char out[32])
{
	char hex[17];
	bk_hash_hex(bk_hash_file(path), hex);
	snprintf(out, 32, "xxh3-64:%s", hex);
}

/* removes a flat directory of ours (files only) if it exists */
static void remove_dir(const char *dir)
{
	if (bk_remove_flat_dir(dir) != 0)
		die("%s: cannot remove: %s", dir, strerror(errno));
}

/* n floats of a device buffer into a new host array */
static float *fetch_f32(const bk_trainer *t, const float *dev, size_t n)
{
	float *h = xmalloc((n ? n : 1) * sizeof(float));
	t->m->ops->download(h, dev, n * sizeof(float));
	return h;
}

/* n 8-bit codes of a device buffer as floats 0..255 (exact in F16) */
static float *fetch_codes(const bk_trainer *t, const uint8_t *dev, size_t n)
{
	uint8_t *q = xmalloc(n ? n : 1);
	float *h = xmalloc((n ? n : 1) * sizeof(float));
	t->m->ops->download(q, dev, n);
	for (size_t i = 0; i < n; i++)
		h[i] = q[i];
	free(q);
	return h;
}

/* the optimizer moments into trainer_state.safetensors (see train.h) */
static void optim_save(const bk_trainer *t, const char *path)
{
	size_t n = t->lora->n_flat, nb = t->opt.n_blocks;
	int64_t shape[1] = {(int64_t)n}, bshape[1] = {(int64_t)nb};
	bk_st_writer *w = bk_st_writer_new();
	bk_st_writer_meta(w, "format", STATE_FORMAT);
	float *buf[4] = {0};
	if (t->o.optim == BK_OPTIM_ADAMW) {
		buf[0] = fetch_f32(t, t->opt.m, n);
		buf[1] = fetch_f32(t, t->opt.v, n);
		bk_st_writer_add(w, "exp_avg", BK_DT_F32, 1, shape, buf[0]);
		bk_st_writer_add(w, "exp_avg_sq", BK_DT_F32, 1, shape, buf[1]);
	} else {
		buf[0] = fetch_codes(t, t->opt.qm, n);
		buf[1] = fetch_codes(t, t->opt.qv, n);
		buf[2] = fetch_f32(t, t->opt.am, nb);
		buf[3] = fetch_f32(t, t->opt.av, nb);
		bk_st_writer_add_f32(w, "exp_avg.code", BK_DT_F16, 1, shape, buf[0]);
		bk_st_writer_add_f32(w, "exp_avg_sq.code", BK_DT_F16, 1, shape, buf[1]);
		bk_st_writer_add(w, "exp_avg.absmax", BK_DT_F32, 1, bshape, buf[2]);
		bk_st_writer_add(w, "exp_avg_sq.absmax", BK_DT_F32, 1, bshape, buf[3]);
	}
	bk_st_writer_write(w, path);
	bk_st_writer_free(w);
	for (int i = 0; i < 4; i++)
		free(buf[i]);
}

/* a [n] F32 tensor of the state file onto the device */
static void load_f32(const bk_trainer *t, const bk_st *s, const char *name, float *dev,
		     size_t n)
{
	int64_t shape[1] = {(int64_t)n};
	float *h = xmalloc((n ? n : 1) * sizeof(float));
	bk_st_read_f32(s, name, 1, shape, h);
	t->m->ops->upload(dev, h, n * sizeof(float));
	free(h);
}

/* a [n] tensor of codes 0..255 of the state file onto the device */
static void load_codes(const bk_trainer *t, const bk_st *s, const char *path,
		       const char *name, uint8_t *dev, size_t n)
{
	int64_t shape[1] = {(int64_t)n};
	float *h = xmalloc((n ? n : 1) * sizeof(float));
	uint8_t *q = xmalloc(n ? n : 1);
	bk_st_read_f32(s, name, 1, shape, h);
	for (size_t i = 0; i < n; i++) {
		if (!(h[i] >= 0 && h[i] <= 255 && h[i] == (float)(int)h[i]))
			die("%s: tensor '%s': value %g at %zu is not an 8-bit code", path, name,
			    (double)h[i], i);
		q[i] = (uint8_t)h[i];
	}
	t->m->ops->upload(dev, q, n);
	free(q);
	free(h);
}

static void optim_load(bk_trainer *t, const char *path, bk_bytes_check check, void *ctx)
{
	size_t n = t->lora->n_flat, nb = t->opt.n_blocks;
	bk_st *s = bk_st_open_checked(path, check, ctx);
	if (t->o.optim == BK_OPTIM_ADAMW) {
		load_f32(t, s, "exp_avg", t->opt.m, n);
		load_f32(t, s, "exp_avg_sq", t->opt.v, n);
	} else {
		load_codes(t, s, path, "exp_avg.code", t->opt.qm, n);
		load_codes(t, s, path, "exp_avg_sq.code", t->opt.qv, n);
		load_f32(t, s, "exp_avg.absmax", t->opt.am, nb);
		load_f32(t, s, "exp_avg_sq.absmax", t->opt.av, nb);
	}
	bk_st_close(s);
}

static void fsync_dir(const char *dir)
{
	FILE *f = fopen(dir, "r");
	if (f) {
		fsync(fileno(f));
		fclose(f);
	}
}

void bk_trainer_save(const bk_trainer *t, const bk_config *cfg, const char *base_model,
		     const bk_train_progress *p, const bk_train_setting *settings,
		     int n_settings, const char *dir)
{
	char *tmp = xasprintf("%s.tmp.%ld", dir, (long)getpid());
	remove_dir(tmp);
	bk_adapter *a = bk_adapter_new(cfg, t->lora->r, t->lora->alpha, t->lora->dropout,
				       t->lora->targets, base_model);
	bk_lora_to_adapter(t->m, t->lora, a);
	bk_adapter_save(a, tmp);
	bk_adapter_free(a);

	char *path = bk_path_join(tmp, "trainer_state.safetensors");
	optim_save(t, path);
	free(path);

	json_t *o = json_object(), *pr = json_object(), *st = json_object();
	char seed[32];
	snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->order_seed);
	json_object_set_new(o, "format", json_string(STATE_FORMAT));
	json_object_set_new(o, "version", json_integer(STATE_VERSION));
	json_object_set_new(o, "step", json_integer(t->step));
	json_object_set_new(o, "adam_step", json_integer(t->opt.step));
	json_object_set_new(o, "n_flat", json_integer((json_int_t)t->lora->n_flat));
	json_object_set_new(o, "optim", json_string(bk_optim_name(t->o.optim)));
	if (t->o.optim == BK_OPTIM_ADAMW8BIT)
		json_object_set_new(o, "optim_block", json_integer(t->o.optim_block));
	json_object_set_new(o, "total_steps", json_integer(t->o.total));
	json_object_set_new(o, "warmup_steps", json_integer(t->o.warmup));
	json_object_set_new(o, "next_lr", json_real(bk_trainer_lr(t)));
	json_object_set_new(pr, "epoch", json_integer(p->epoch));
	json_object_set_new(pr, "micro_in_epoch", json_integer(p->micro_in_epoch));
	json_object_set_new(pr, "records_in_epoch", json_integer(p->records_in_epoch));
	json_object_set_new(pr, "records", json_integer(p->records));
	json_object_set_new(pr, "tokens", json_integer(p->tokens));
	json_object_set_new(pr, "loss_sum", json_real(p->loss_sum));
	json_object_set_new(pr, "elapsed", json_real(p->elapsed));
	json_object_set_new(pr, "order_seed", json_string(seed));
	json_object_set_new(o, "progress", pr);
	json_object_set_new(o, "log_history",
			    p->log_history ? json_incref(p->log_history) : json_array());
	for (int i = 0; i < n_settings; i++)
		json_object_set_new(st, settings[i].key, json_string(settings[i].value));
	json_object_set_new(o, "settings", st);
	json_t *sums = json_object(); /* of the files as written, read back */
	for (size_t i = 0; i < N_CKPT_FILES; i++) {
		char sum[32], *f = bk_path_join(tmp, ckpt_files[i]);
		file_sum(f, sum);
		json_object_set_new(sums, ckpt_files[i], json_string(sum));
		free(f);
	}
	json_object_set_new(o, "checksums", sums);
	char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
	json_decref(o);
	if (!text)
		die("out of memory");
	path = bk_path_join(tmp, "trainer_state.json");
	size_t len = strlen(text);
	text[len] = '\n'; /* replaces the NUL; written with its length */
	bk_write_file_atomic(path, text, len + 1);
	free(text);
	free(path);
	fsync_dir(tmp);

	/* publish: rename(2) of the directory; an older DIR moves aside first */
	if (rename(tmp, dir) != 0) {
		if (errno != ENOTEMPTY && errno != EEXIST)
			die("rename %s -> %s: %s", tmp, dir, strerror(errno));
		char *old = xasprintf("%s.old.%ld", dir, (long)getpid());
		remove_dir(old);
		if (rename(dir, old) != 0)
			die("rename %s -> %s: %s", dir, old, strerror(errno));
		if (rename(tmp, dir) != 0)
			die("rename %s -> %s: %s", tmp, dir, strerror(errno));
		remove_dir(old);
		free(old);
	}
	char *parent = xstrdup(dir);
	char *slash = strrchr(parent, '/');
	if (slash)
		*slash = 0;
	fsync_dir(slash ? parent : ".");
	free(parent);
	free(tmp);
}

static json_int_t get_int(const char *path, json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_integer(v))
		die("%s: key '%s' is missing or not an integer", path, key);
	return json_integer_value(v);
}

/* progress.KEY: an integer >= 0 */
static int64_t get_count(const char *path, json_t *pr, const char *key)
{
	json_t *v = json_object_get(pr, key);
	if (!json_is_integer(v))
		die("%s: key 'progress.%s' is missing or not an integer", path, key);
	json_int_t n = json_integer_value(v);
	if (n < 0)
		die("%s: key 'progress.%s' is %lld, below 0", path, key, (long long)n);
	return n;
}

/* progress.KEY: a finite number >= lo */
static double get_amount(const char *path, json_t *pr, const char *key, double lo)
{
	json_t *v = json_object_get(pr, key);
	if (!json_is_number(v))
		die("%s: key 'progress.%s' is missing or not a number", path, key);
	double x = json_number_value(v);
	if (!isfinite(x))
		die("%s: key 'progress.%s' is %g, not a finite number", path, key, x);
	if (x < lo)
		die("%s: key 'progress.%s' is %g, below 0", path, key, x);
	return x;
}

/* the progress a checkpoint holds, each field checked on its own and against the
 * others (steprun.c checks it against the stream's plan) */
static void read_progress(const char *path, json_t *o, int64_t step, int64_t total,
			  bk_train_progress *p)
{
	json_t *pr = json_object_get(o, "progress");
	if (!json_is_object(pr))
		die("%s: key 'progress' is missing or not an object", path);
	memset(p, 0, sizeof(*p));
	p->epoch = get_count(path, pr, "epoch");
	p->micro_in_epoch = get_count(path, pr, "micro_in_epoch");
	p->records_in_epoch = get_count(path, pr, "records_in_epoch");
	p->records = get_count(path, pr, "records");
	p->tokens = get_count(path, pr, "tokens");
	/* a KL is >= 0; a float sum of near-zero ones may round a little below */
	p->loss_sum = get_amount(path, pr, "loss_sum", -1e-3 * (double)step);
	p->elapsed = get_amount(path, pr, "elapsed", 0);
	if (p->records_in_epoch > p->records)
		die("%s: key 'progress.records_in_epoch' is %lld, more than the run's "
		    "'progress.records' %lld", path, (long long)p->records_in_epoch,
		    (long long)p->records);
	if (total > 0 && step > total)
		die("%s: key 'step' is %lld, past the run's %lld optimizer steps", path,
		    (long long)step, (long long)total);
	json_t *seed = json_object_get(pr, "order_seed");
	const char *sv = json_is_string(seed) ? json_string_value(seed) : NULL;
	if (!sv)
		die("%s: key 'progress.order_seed' is missing or not a string", path);
	char *end;
	errno = 0;
	unsigned long long u = strtoull(sv, &end, 10);
	if (*sv < '0' || *sv > '9' || *end || errno)
		die("%s: key 'progress.order_seed' \"%s\" is not a decimal 64-bit number", path,
		    sv);
	p->order_seed = (uint64_t)u;
	json_t *lh = json_object_get(o, "log_history"); /* absent in older checkpoints */
	if (lh && !json_is_array(lh))
		die("%s: key 'log_history' is not a list", path);
	size_t i;
	json_t *e;
	json_array_foreach(lh, i, e) {
		json_t *es = json_object_get(e, "step");
		if (!json_is_object(e) || (es && !json_is_integer(es)))
			die("%s: key 'log_history' entry %zu is not an object with an integer "
			    "'step'", path, i);
		if (es && (json_integer_value(es) < 0 || json_integer_value(es) > step))
			die("%s: key 'log_history' entry %zu is at step %lld, past the "
			    "checkpoint's 'step' %lld", path, i, (long long)json_integer_value(es),
			    (long long)step);
	}
	if (json_array_size(lh))
		p->log_history = json_incref(lh);
}

/* the checksums trainer_state.json recorded of the data files when they were written,
 * in ckpt_files' order, each file present; NULL: a version 1 state (an older bakery)
 * recorded none (a warning).  The bytes are compared as they are loaded (sum_check). */
typedef struct {
	char sum[N_CKPT_FILES][32];
} ckpt_sums;

static ckpt_sums *read_sums(const char *dir, const char *path, json_t *o, int version)
{
	if (version < 2) {
		warn("%s: trainer state version %d (an older bakery) records no checksums; the "
		     "checkpoint's files are not verified", path, version);
		return NULL;
	}
	json_t *sums = json_object_get(o, "checksums");
	if (!json_is_object(sums))
		die("%s: key 'checksums' is missing or not an object", path);
	ckpt_sums *cs = xcalloc(1, sizeof *cs);
	for (size_t i = 0; i < N_CKPT_FILES; i++) {
		json_t *v = json_object_get(sums, ckpt_files[i]);
		if (!json_is_string(v))
			die("%s: key 'checksums' has no string for '%s'", path, ckpt_files[i]);
		char *f = bk_path_join(dir, ckpt_files[i]);
		if (!bk_file_exists(f))
			die("%s: missing (the checkpoint is incomplete)", f);
		free(f);
		snprintf(cs->sum[i], sizeof cs->sum[i], "%s", json_string_value(v));
	}
	return cs;
}

/* bk_bytes_check: a checkpoint file's bytes, as its reader read them, against the
 * checksum trainer_state.json recorded, before any of them is parsed */
static void sum_check(const char *f, const void *data, size_t len, void *ctx)
{
	const ckpt_sums *cs = ctx;
	const char *base = strrchr(f, '/');
	base = base ? base + 1 : f;
	size_t i = 0;
	while (i < N_CKPT_FILES && strcmp(base, ckpt_files[i]))
		i++;
	if (i == N_CKPT_FILES)
		BUG("%s: not a checkpoint data file", f);
	char hex[17], sum[32];
	bk_hash_hex(bk_hash(data, len, 0), hex);
	snprintf(sum, sizeof sum, "xxh3-64:%s", hex);
	if (strcmp(sum, cs->sum[i]))
		die("%s: damaged or changed since it was saved (its checksum is %s, "
		    "trainer_state.json recorded %s)", f, sum, cs->sum[i]);
}

void bk_trainer_resume(bk_trainer *t, const bk_config *cfg, const char *dir,
		       bk_train_progress *p, const bk_train_setting *settings,
		       int n_settings)
{
	char *path = bk_path_join(dir, "trainer_state.json");
	json_error_t err;
	json_t *o = json_load_file(path, 0, &err);
	if (!o)
		die("%s: %s", path, bk_json_error(&err));
	json_t *fmt = json_object_get(o, "format");
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), STATE_FORMAT))
		die("%s: not a bakery trainer state (key 'format')", path);
	json_int_t version = get_int(path, o, "version");
	if (version < 1 || version > STATE_VERSION)
		die("%s: trainer state version %lld, this bk-step reads 1 to %d", path,
		    (long long)version, STATE_VERSION);
	if ((size_t)get_int(path, o, "n_flat") != t->lora->n_flat)
		die("%s: key 'n_flat' is %lld, this adapter has %zu numbers", path,
		    (long long)get_int(path, o, "n_flat"), t->lora->n_flat);
	json_t *st = json_object_get(o, "settings");
	if (!json_is_object(st))
		die("%s: key 'settings' is missing or not an object", path);
	for (int i = 0; i < n_settings; i++) {
		json_t *v = json_object_get(st, settings[i].key);
		if (!json_is_string(v)) /* a checkpoint from before the setting existed */
			continue;
		const char *was = json_string_value(v);
		if (strcmp(was, settings[i].value))
			die("%s: the checkpoint was trained with %s %s, given %s", dir,
			    settings[i].key, was, settings[i].value);
	}
	/* the optimizer: a state without 'optim' is adamw */
	json_t *jo = json_object_get(o, "optim");
	const char *was = jo ? json_string_value(jo) : "adamw";
	bk_optim_kind kind;
	if (!was || bk_optim_parse(was, &kind))
		die("%s: key 'optim' is not adamw or adamw8bit", path);
	if (kind != t->o.optim)
		die("%s: the checkpoint was trained with optim %s, given %s", dir, was,
		    bk_optim_name(t->o.optim));
	if (kind == BK_OPTIM_ADAMW8BIT && get_int(path, o, "optim_block") != t->o.optim_block)
		die("%s: the checkpoint's 8-bit blocks have %lld values, this trainer's %d", dir,
		    (long long)get_int(path, o, "optim_block"), t->o.optim_block);
	int64_t step = get_int(path, o, "step"), adam_step = get_int(path, o, "adam_step");
	if (step < 0 || adam_step < 0 || adam_step > step)
		die("%s: keys 'step' %lld and 'adam_step' %lld are inconsistent", path,
		    (long long)step, (long long)adam_step);
	read_progress(path, o, step, t->o.total, p);
	ckpt_sums *cs = read_sums(dir, path, o, (int)version);
	json_decref(o);
	free(path);

	/* each data file read once: its checksum over the bytes that are then parsed */
	bk_bytes_check check = cs ? sum_check : NULL;
	bk_adapter *a = bk_adapter_load_checked(dir, cfg, check, cs);
	bk_lora_from_adapter(t->m, t->lora, a);
	bk_adapter_free(a);

	path = bk_path_join(dir, "trainer_state.safetensors");
	optim_load(t, path, check, cs);
	free(path);
	free(cs);
	t->step = step;
	t->opt.step = adam_step;
	bk_trainer_drop(t);
}
