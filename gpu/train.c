/* train.c - the training step and checkpoint state of bk-step (see train.h).
 * Not the data plan and not the math of the model, loss or optimizer.
 *
 * The loss runs on the host (gpu/loss.h): response rows of the final hidden states
 * are downloaded row by row, their gradient uploaded into a zeroed [T,H] buffer. */
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
#include "common/rng.h"
#include "formats/peft.h"
#include "formats/safetensors.h"
#include "gpu/load.h"
#include "gpu/loss.h"

#define GROW(p, cap, want)                                                     \
	do {                                                                   \
		if ((size_t)(want) > (cap)) {                                  \
			(cap) = (size_t)(want) * 2;                            \
			(p) = xrealloc((p), (cap) * sizeof(*(p)));             \
		}                                                              \
	} while (0)

static const float *host_lm_head(const bk_model *m)
{
	if (m->ops != &bk_ops_host)
		die("the baking loss runs on the host twin only in this build (--device cpu)");
	return (const float *)m->lm_head->data; /* [V,H] fp32 on the host twin */
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
	size_t n = t->lora->n_flat;
	t->param_h = xcalloc(n ? n : 1, sizeof(float));
	t->grad_h = xcalloc(n ? n : 1, sizeof(float));
	m->ops->download(t->param_h, t->lora->flat, n * sizeof(float));
	bk_adamw_init(&t->opt, 0.9, 0.999, 1e-8, o->weight_decay);
	for (int l = 0; l < t->lora->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			if (!t->lora->A[l][mod])
				continue;
			int in, out;
			bk_model_module_dims(&m->cfg, mod, &in, &out);
			size_t oa = (size_t)(t->lora->A[l][mod] - t->lora->flat);
			size_t ob = (size_t)(t->lora->B[l][mod] - t->lora->flat);
			char name[96];
			snprintf(name, sizeof name, "layers.%d.%s.lora_A", l, bk_lora_module_names[mod]);
			bk_adamw_add(&t->opt, name, t->param_h + oa, t->grad_h + oa,
				     (size_t)o->r * in);
			snprintf(name, sizeof name, "layers.%d.%s.lora_B", l, bk_lora_module_names[mod]);
			bk_adamw_add(&t->opt, name, t->param_h + ob, t->grad_h + ob,
				     (size_t)out * o->r);
		}
	return t;
}

void bk_trainer_free(bk_trainer *t)
{
	if (!t)
		return;
	const bk_ops *ops = t->m->ops;
	ops->free(t->hid);
	ops->free(t->dhid);
	bk_acts_free(t->m, t->acts);
	bk_lora_free(t->m, t->lora);
	bk_lora_free(t->m, t->grads);
	bk_adamw_free(&t->opt);
	free(t->param_h), free(t->grad_h);
	free(t->ids), free(t->pos), free(t->cu), free(t->sample_of), free(t->rows);
	free(t->tk_ids), free(t->rows_h), free(t->t_rows), free(t->d_rows);
	free(t->tk_logp), free(t->tk_rest);
	free(t);
}

void bk_trainer_reserve(bk_trainer *t, int max_T)
{
	if (max_T <= t->acts_T)
		return;
	const bk_ops *ops = t->m->ops;
	bk_acts_free(t->m, t->acts);
	ops->free(t->hid);
	ops->free(t->dhid);
	t->acts = bk_acts_create(t->m, max_T, t->o.r);
	size_t bytes = (size_t)max_T * t->m->cfg.H * sizeof(float);
	t->hid = ops->alloc(bytes);
	t->dhid = ops->alloc(bytes);
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

/* dst [N,H] = rows t->rows of the device hidden states */
static void gather_rows(bk_trainer *t, float *dst, int N)
{
	const bk_ops *ops = t->m->ops;
	size_t H = (size_t)t->m->cfg.H;
	for (int r = 0; r < N; r++)
		ops->download(dst + r * H, t->hid + (size_t)t->rows[r] * H,
			      H * sizeof(float));
}

static int sample_kind(const bk_train_sample *x) {
	return !x->teacher ? KIND_EXACT : x->teacher->k ? KIND_TOPK : KIND_FULL;
}

void bk_trainer_micro(bk_trainer *t, const bk_train_sample *s, int n,
		      bk_train_micro_info *info)
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
	t->n_micro++;
	if (!ns) {
		free(idx);
		return;
	}
	int N = 0;
	for (int i = 0; i < ns; i++)
		N += s[idx[i]].n_resp;
	GROW(t->rows_h, t->cap_tl, (size_t)N * H);
	t->t_rows = xrealloc(t->t_rows, t->cap_tl * sizeof(float));
	t->d_rows = xrealloc(t->d_rows, t->cap_tl * sizeof(float));

	/* teacher first (exact mode): the student's forward must be the one the acts
	 * keep for the backward */
	if (kind == KIND_EXACT) {
		int Tt = pack(t, s, idx, ns, 1);
		bk_trainer_reserve(t, Tt);
		bk_batch tb = {.T = Tt, .S = ns, .ids = t->ids, .pos = t->pos, .cu_seqlens = t->cu};
		bk_model_forward(m, NULL, &tb, NULL, t->acts, t->hid);
		gather_rows(t, t->t_rows, N);
		info->teacher_tokens = Tt;
	}
	int T = pack(t, s, idx, ns, 0);
	bk_trainer_reserve(t, T);
	bk_batch sb = {.T = T, .S = ns, .ids = t->ids, .pos = t->pos, .cu_seqlens = t->cu,
		       .train = t->o.dropout > 0,
		       .dropout_key = bk_crng_key(t->o.seed, (uint64_t)t->step,
						  (uint64_t)t->n_micro, 0x64726f70 /* "drop" */)};
	bk_model_forward(m, t->lora, &sb, NULL, t->acts, t->hid);
	gather_rows(t, t->rows_h, N);

	const float *lm = host_lm_head(m);
	int chunk = t->o.vocab_chunk;
	float T_ = t->o.temperature;
	double loss;
	if (kind == KIND_EXACT) {
		loss = bk_loss_kl_exact(t->rows_h, lm, t->t_rows, NULL, t->sample_of, N, ns, H, V,
					chunk, T_, t->d_rows, NULL);
	} else if (kind == KIND_FULL) {
		GROW(t->tk_logp, t->cap_TK, (size_t)N * V);
		size_t r = 0;
		for (int i = 0; i < ns; i++) {
			const bk_teacher *tc = s[idx[i]].teacher;
			memcpy(t->tk_logp + r * V, tc->logp, (size_t)tc->n * V * sizeof(float));
			r += (size_t)tc->n;
		}
		loss = bk_loss_kl_exact(t->rows_h, lm, NULL, t->tk_logp, t->sample_of, N, ns, H, V,
					chunk, T_, t->d_rows, NULL);
	} else {
		GROW(t->tk_logp, t->cap_TK, (size_t)N * K);
		t->tk_ids = xrealloc(t->tk_ids, t->cap_TK * sizeof(int32_t));
		t->tk_rest = xrealloc(t->tk_rest, t->cap_TK * sizeof(float));
		size_t r = 0;
		for (int i = 0; i < ns; i++) {
			const bk_teacher *tc = s[idx[i]].teacher;
			memcpy(t->tk_logp + r * K, tc->logp, (size_t)tc->n * K * sizeof(float));
			memcpy(t->tk_ids + r * K, tc->ids, (size_t)tc->n * K * sizeof(int32_t));
			memcpy(t->tk_rest + r, tc->rest, (size_t)tc->n * sizeof(float));
			r += (size_t)tc->n;
		}
		loss = bk_loss_kl_topk(t->rows_h, lm, t->tk_ids, t->tk_logp, t->tk_rest,
				       t->sample_of, N, ns, H, V, K, chunk, T_, t->d_rows, NULL);
	}

	/* scatter dLoss/d(response rows) into a zeroed [T,H] gradient, then backward */
	float *dh = t->dhid;
	ops->zero(dh, (size_t)T * H * sizeof(float));
	for (int r = 0; r < N; r++)
		ops->upload(dh + (size_t)t->rows[r] * H, t->d_rows + (size_t)r * H,
			    (size_t)H * sizeof(float));
	bk_model_backward(m, t->lora, &sb, t->acts, dh, t->grads);

	info->loss = loss;
	info->samples = ns;
	info->tokens = T;
	info->rows = N;
	free(idx);
}

/* ---- the optimizer step ---- */

double bk_trainer_lr(const bk_trainer *t)
{
	return bk_sched_lr(t->o.sched, t->o.lr, t->step, t->o.warmup, t->o.total);
}

/* sqrt(sum g^2) in a fixed order: 64K-element blocks summed in parallel, then the
 * block sums added in index order (invariant 5) */
static double grad_norm_fixed(const float *g, size_t n)
{
	const size_t blk = 65536;
	size_t nb = (n + blk - 1) / blk;
	double *part = xcalloc(nb ? nb : 1, sizeof(double));
#pragma omp parallel for schedule(static)
	for (size_t b = 0; b < nb; b++) {
		size_t end = (b + 1) * blk < n ? (b + 1) * blk : n;
		double acc = 0;
		for (size_t i = b * blk; i < end; i++)
			acc += (double)g[i] * g[i];
		part[b] = acc;
	}
	double s = 0;
	for (size_t b = 0; b < nb; b++)
		s += part[b];
	free(part);
	return sqrt(s);
}

double bk_trainer_step(bk_trainer *t, double *lr_out)
{
	const bk_ops *ops = t->m->ops;
	size_t n = t->lora->n_flat;
	if (t->n_micro <= 0)
		BUG("optimizer step without a micro-batch");
	ops->download(t->grad_h, t->grads->flat, n * sizeof(float));
	bk_adamw_average_grad(&t->opt, t->n_micro);
	double norm = grad_norm_fixed(t->grad_h, n);
	double lr = bk_trainer_lr(t);
	if (isfinite(norm)) {
		if (t->o.max_grad_norm > 0) {
			/* torch.nn.utils.clip_grad_norm_ */
			double coef = t->o.max_grad_norm / (norm + 1e-6);
			if (coef < 1)
				bk_adamw_scale_grad(&t->opt, coef);
		}
		bk_adamw_step(&t->opt, lr);
		ops->upload(t->lora->flat, t->param_h, n * sizeof(float));
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
#define STATE_VERSION 1

/* removes a flat directory of ours (files only) if it exists */
static void remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		if (errno == ENOENT)
			return;
		die("%s: %s", dir, strerror(errno));
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char *p = bk_path_join(dir, e->d_name);
		if (unlink(p) != 0)
			die("%s: %s", p, strerror(errno));
		free(p);
	}
	closedir(d);
	if (rmdir(dir) != 0)
		die("%s: %s", dir, strerror(errno));
}

/* m or v of every group into one [n_flat] buffer laid out like lora->flat */
static float *moments(const bk_trainer *t, int which)
{
	float *buf = xcalloc(t->lora->n_flat ? t->lora->n_flat : 1, sizeof(float));
	for (int i = 0; i < t->opt.n_groups; i++) {
		const bk_adamw_group *g = &t->opt.groups[i];
		memcpy(buf + (g->param - t->param_h), which ? g->v : g->m, g->n * sizeof(float));
	}
	return buf;
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

	float *m = moments(t, 0), *v = moments(t, 1);
	int64_t shape[1] = {(int64_t)t->lora->n_flat};
	bk_st_writer *w = bk_st_writer_new();
	bk_st_writer_meta(w, "format", STATE_FORMAT);
	bk_st_writer_add(w, "exp_avg", BK_DT_F32, 1, shape, m);
	bk_st_writer_add(w, "exp_avg_sq", BK_DT_F32, 1, shape, v);
	char *path = bk_path_join(tmp, "trainer_state.safetensors");
	bk_st_writer_write(w, path);
	bk_st_writer_free(w);
	free(path);
	free(m);
	free(v);

	json_t *o = json_object(), *pr = json_object(), *st = json_object();
	char seed[32];
	snprintf(seed, sizeof seed, "%llu", (unsigned long long)p->order_seed);
	json_object_set_new(o, "format", json_string(STATE_FORMAT));
	json_object_set_new(o, "version", json_integer(STATE_VERSION));
	json_object_set_new(o, "step", json_integer(t->step));
	json_object_set_new(o, "adam_step", json_integer(t->opt.step));
	json_object_set_new(o, "n_flat", json_integer((json_int_t)t->lora->n_flat));
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
	for (int i = 0; i < n_settings; i++)
		json_object_set_new(st, settings[i].key, json_string(settings[i].value));
	json_object_set_new(o, "settings", st);
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

static double get_num(const char *path, json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_number(v))
		die("%s: key '%s' is missing or not a number", path, key);
	return json_number_value(v);
}

void bk_trainer_resume(bk_trainer *t, const bk_config *cfg, const char *dir,
		       bk_train_progress *p, const bk_train_setting *settings,
		       int n_settings)
{
	char *path = bk_path_join(dir, "trainer_state.json");
	json_error_t err;
	json_t *o = json_load_file(path, 0, &err);
	if (!o)
		die("%s: %s (line %d)", path, err.text, err.line);
	json_t *fmt = json_object_get(o, "format");
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), STATE_FORMAT))
		die("%s: not a bakery trainer state (key 'format')", path);
	if (get_int(path, o, "version") != STATE_VERSION)
		die("%s: trainer state version %lld, this bk-step reads %d", path,
		    (long long)get_int(path, o, "version"), STATE_VERSION);
	if ((size_t)get_int(path, o, "n_flat") != t->lora->n_flat)
		die("%s: key 'n_flat' is %lld, this adapter has %zu numbers", path,
		    (long long)get_int(path, o, "n_flat"), t->lora->n_flat);
	json_t *st = json_object_get(o, "settings");
	if (!json_is_object(st))
		die("%s: key 'settings' is missing or not an object", path);
	for (int i = 0; i < n_settings; i++) {
		json_t *v = json_object_get(st, settings[i].key);
		const char *was = json_is_string(v) ? json_string_value(v) : "(none)";
		if (strcmp(was, settings[i].value))
			die("%s: the checkpoint was trained with %s %s, given %s", dir,
			    settings[i].key, was, settings[i].value);
	}
	json_t *pr = json_object_get(o, "progress");
	if (!json_is_object(pr))
		die("%s: key 'progress' is missing or not an object", path);
	memset(p, 0, sizeof(*p));
	p->epoch = get_int(path, pr, "epoch");
	p->micro_in_epoch = get_int(path, pr, "micro_in_epoch");
	p->records_in_epoch = get_int(path, pr, "records_in_epoch");
	p->records = get_int(path, pr, "records");
	p->tokens = get_int(path, pr, "tokens");
	p->loss_sum = get_num(path, pr, "loss_sum");
	p->elapsed = get_num(path, pr, "elapsed");
	json_t *seed = json_object_get(pr, "order_seed");
	if (!json_is_string(seed))
		die("%s: key 'progress.order_seed' is missing or not a string", path);
	p->order_seed = strtoull(json_string_value(seed), NULL, 10);
	int64_t step = get_int(path, o, "step"), adam_step = get_int(path, o, "adam_step");
	if (step < 0 || adam_step < 0 || adam_step > step)
		die("%s: keys 'step' %lld and 'adam_step' %lld are inconsistent", path,
		    (long long)step, (long long)adam_step);
	json_decref(o);
	free(path);

	bk_adapter *a = bk_adapter_load(dir, cfg);
	bk_lora_from_adapter(t->m, t->lora, a);
	bk_adapter_free(a);
	t->m->ops->download(t->param_h, t->lora->flat, t->lora->n_flat * sizeof(float));

	path = bk_path_join(dir, "trainer_state.safetensors");
	bk_st *s = bk_st_open(path);
	int64_t shape[1] = {(int64_t)t->lora->n_flat};
	float *m = xmalloc((t->lora->n_flat ? t->lora->n_flat : 1) * sizeof(float));
	float *v = xmalloc((t->lora->n_flat ? t->lora->n_flat : 1) * sizeof(float));
	bk_st_read_f32(s, "exp_avg", 1, shape, m);
	bk_st_read_f32(s, "exp_avg_sq", 1, shape, v);
	bk_st_close(s);
	free(path);
	for (int i = 0; i < t->opt.n_groups; i++) {
		bk_adamw_group *g = &t->opt.groups[i];
		memcpy(g->m, m + (g->param - t->param_h), g->n * sizeof(float));
		memcpy(g->v, v + (g->param - t->param_h), g->n * sizeof(float));
	}
	free(m);
	free(v);
	t->step = step;
	t->opt.step = adam_step;
	bk_trainer_drop(t);
}
