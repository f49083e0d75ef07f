/* test_parity.c - golden parity of the model core (host twin) with HF transformers +
 * PEFT, on the fixtures of tests/ref/make_parity.py (format: tests/ref/README.md) for
 * tiny random models and models/stories260K (tied):
 *   1. logits of the base model on the 3 teacher sequences and of the adapted model
 *      (lora.init) on the 3 student sequences, each set PACKED in one batch; the
 *      teacher also through the shared system-prompt prefix (KV prefix, RoPE offset);
 *   2. the baking loss at T = 1 and T = 2 (total and per sample), with a vocabulary
 *      chunk that does not divide V;
 *   3. the LoRA gradients at T = 1;
 *   4. 3 AdamW steps with clipping and the cosine schedule: from the stored gradients
 *      (the optimizer alone), end to end (forward, loss, backward, clip, AdamW) and
 *      through bk-step's trainer; per step loss, pre-clip norm, lr, weights, and the
 *      logits after step 3;
 *   5. PEFT's adapter directory read by bk_adapter_load (exactly lora.init, same logits);
 *   6. an adapter written by us round-trips (BK_PARITY_KEEP=DIR keeps it in DIR/<model>
 *      for `python3 tests/ref/make_parity.py --check-adapter DIR/<model> --which step3`);
 *   7. bk-merge's model (our step-3 adapter folded in) without an adapter gives the
 *      stored HF + PEFT step-3 logits.
 * Models: tiny (Llama), stories260K, and the families qwen2 (bias, window), qwen3 (q/k
 * norms, head_dim != H/NH), gemma2 (Gemma norms, GeGLU, sandwich, softcap, window),
 * gemma3 (q/k norms, two RoPE bases, window).
 * Errors are max|a-b| / max|b| per tensor (bk_max_relerr), one line per quantity.
 * Not the finite-difference checks (test_model_grad.c) and not the edge cases of each
 * part (test_loss.c, test_optim.c, test_peft.c, test_train.c). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "formats/merge.h"
#include "formats/peft.h"
#include "formats/safetensors.h"
#include "gpu/load.h"
#include "gpu/host/loss.h"
#include "gpu/model.h"
#include "gpu/optim.h"
#include "gpu/train.h"
#include "tests/harness.h"

#define MAX_S 8
#define VOCAB_CHUNK 37 /* divides neither V = 96 nor V = 512 */

/* documented tolerances (tests/ref/README.md, issue [2/6]) */
#define TOL_LOGITS 1e-5
#define TOL_LOSS 1e-5
#define TOL_GRAD 1e-4
#define TOL_WEIGHTS 1e-4
#define TOL_OPTIM_ONLY 1e-5 /* README: same stored gradients, agree to ~2e-7 */
#define TOL_LR 1e-9
/* Adam's first update of an entry whose clipped gradient is above this (1000 eps) does
 * not depend on the entry's own float32 rounding (tests/ref/README.md: the sensitive
 * entries lie within a few hundred eps of 0) */
#define WELL_COND_G 1e-5

static char failed_list[4096];

/* one line per checked quantity; ok when err < bound (err == 0 when bound is 0) */
static void report(const char *model, const char *what, double err, double bound)
{
	int ok = bound > 0 ? err < bound : err == 0;
	printf("%-11s %-46s relerr %9.2e  bound %7.1e  %s\n", model, what, err, bound,
	       ok ? "ok" : "FAIL");
	CHECK(ok, "%s %s: relative error %.3g, bound %.3g", model, what, err, bound);
	if (!ok && strlen(failed_list) + strlen(model) + strlen(what) + 4 < sizeof failed_list) {
		strcat(failed_list, "\n  ");
		strcat(failed_list, model);
		strcat(failed_list, " ");
		strcat(failed_list, what);
	}
}

/* ---- case.json ---- */

typedef struct {
	int32_t *v;
	int n;
} idv;

typedef struct {
	idv t_prompt, s_prompt, resp, t_ids, s_ids;
} sample;

static json_t *jkey(const char *file, json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	if (!v)
		die("%s: key '%s' is missing", file, key);
	return v;
}

static double jnum(const char *file, json_t *o, const char *key)
{
	json_t *v = jkey(file, o, key);
	if (!json_is_number(v))
		die("%s: key '%s' is not a number", file, key);
	return json_number_value(v);
}

static const char *jstr(const char *file, json_t *o, const char *key)
{
	json_t *v = jkey(file, o, key);
	if (!json_is_string(v))
		die("%s: key '%s' is not a string", file, key);
	return json_string_value(v);
}

static double jidx(const char *file, json_t *a, size_t i, const char *key)
{
	json_t *v = json_array_get(a, i);
	if (!json_is_number(v))
		die("%s: key '%s': element %zu is not a number", file, key, i);
	return json_number_value(v);
}

static idv jids(const char *file, json_t *o, const char *key)
{
	json_t *a = jkey(file, o, key);
	if (!json_is_array(a) || json_array_size(a) == 0)
		die("%s: key '%s' is not a non-empty array", file, key);
	idv r = {xmalloc(json_array_size(a) * sizeof(int32_t)), (int)json_array_size(a)};
	for (int i = 0; i < r.n; i++) {
		json_t *x = json_array_get(a, (size_t)i);
		if (!json_is_integer(x))
			die("%s: key '%s': element %d is not an integer", file, key, i);
		r.v[i] = (int32_t)json_integer_value(x);
	}
	return r;
}

/* ---- one packed batch (teacher: t_ids, student: s_ids) ---- */

typedef struct {
	int T, S, N;
	int32_t *ids, *pos, *cu;   /* [T] [T] [S+1] */
	int32_t *rows, *sample_of; /* [N] response-predicting positions, their sample */
	bk_batch b;
} packed;

typedef struct {
	const char *name;
	char *dir, *json_path;
	json_t *root;
	const char *model_path;
	bk_st *gt; /* tensors.safetensors */
	bk_loaded_model lm;
	const bk_model *m;
	const bk_ops *ops;
	int H, V, L, r, S, max_T;
	float alpha;
	sample smp[MAX_S];
	packed tp, sp;
	bk_acts *acts;
	float *dhid, *dgrad, *dlogits; /* device: [max_T,H] [max_T,H] [max_T,V] */
	float *hid;                    /* host [max_T,H] */
	bk_lora *shape;                /* a LoRA of the fixture's shape (layout of flat arrays) */
	size_t n_flat;
	float *init;                   /* host [n_flat]: lora.init.* in the flat layout */
} pcase;

static void pack(packed *p, const pcase *c, int teacher)
{
	int T = 0, N = 0;
	for (int i = 0; i < c->S; i++) {
		T += teacher ? c->smp[i].t_ids.n : c->smp[i].s_ids.n;
		N += c->smp[i].resp.n;
	}
	p->T = T, p->S = c->S, p->N = N;
	p->ids = xmalloc((size_t)T * sizeof(int32_t));
	p->pos = xmalloc((size_t)T * sizeof(int32_t));
	p->cu = xmalloc((size_t)(c->S + 1) * sizeof(int32_t));
	p->rows = xmalloc((size_t)N * sizeof(int32_t));
	p->sample_of = xmalloc((size_t)N * sizeof(int32_t));
	int off = 0, r = 0;
	p->cu[0] = 0;
	for (int i = 0; i < c->S; i++) {
		const idv *seq = teacher ? &c->smp[i].t_ids : &c->smp[i].s_ids;
		int a = teacher ? c->smp[i].t_prompt.n : c->smp[i].s_prompt.n;
		for (int t = 0; t < seq->n; t++) {
			p->ids[off + t] = seq->v[t];
			p->pos[off + t] = t;
		}
		/* the logits at position t predict token t+1: rows a-1 .. len-2 */
		for (int j = 0; j < c->smp[i].resp.n; j++, r++) {
			p->rows[r] = off + a - 1 + j;
			p->sample_of[r] = i;
		}
		off += seq->n;
		p->cu[i + 1] = off;
	}
	p->b = (bk_batch){.T = T, .S = c->S, .ids = p->ids, .pos = p->pos, .cu_seqlens = p->cu};
}

static void packed_free(packed *p)
{
	free(p->ids), free(p->pos), free(p->cu), free(p->rows), free(p->sample_of);
}

static float *read_tensor(const pcase *c, const char *name, int64_t d0, int64_t d1)
{
	int64_t shape[2] = {d0, d1};
	float *x = xmalloc((size_t)(d0 * d1) * sizeof(float));
	bk_st_read_f32(c->gt, name, 2, shape, x);
	return x;
}

/* reads PREFIX.layers.L.M.{A,B} of every module into a flat host array laid out like
 * c->shape->flat */
static float *read_lora_set(const pcase *c, const char *prefix)
{
	float *flat = xcalloc(c->n_flat, sizeof(float));
	size_t covered = 0;
	for (int l = 0; l < c->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			int in, out;
			bk_model_module_dims(&c->m->cfg, mod, &in, &out);
			char name[128];
			int64_t sa[2] = {c->r, in}, sb[2] = {out, c->r};
			snprintf(name, sizeof name, "%s.layers.%d.%s.A", prefix, l,
				 bk_lora_module_names[mod]);
			bk_st_read_f32(c->gt, name, 2, sa,
				       flat + (c->shape->A[l][mod] - c->shape->flat));
			snprintf(name, sizeof name, "%s.layers.%d.%s.B", prefix, l,
				 bk_lora_module_names[mod]);
			bk_st_read_f32(c->gt, name, 2, sb,
				       flat + (c->shape->B[l][mod] - c->shape->flat));
			covered += (size_t)c->r * (in + out);
		}
	if (covered != c->n_flat)
		BUG("lora set %s covers %zu of %zu numbers", prefix, covered, c->n_flat);
	return flat;
}

/* per-tensor comparison of two flat LoRA arrays; one line per tensor; bound 0 = exact */
static double check_lora_set(const pcase *c, const char *what, const float *got,
			     const float *ref, double bound)
{
	double worst = 0;
	for (int l = 0; l < c->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			int in, out;
			bk_model_module_dims(&c->m->cfg, mod, &in, &out);
			for (int ab = 0; ab < 2; ab++) {
				size_t off = (size_t)((ab ? c->shape->B[l][mod] : c->shape->A[l][mod]) -
						      c->shape->flat);
				size_t n = (size_t)c->r * (ab ? out : in);
				/* bound 0 (exact): relerr 0 means equal values */
				double e = bk_max_relerr(got + off, ref + off, n, 1e-30);
				char name[160];
				snprintf(name, sizeof name, "%s %d.%s.%c", what, l,
					 bk_lora_module_names[mod], ab ? 'B' : 'A');
				report(c->name, name, e, bound);
				if (e > worst)
					worst = e;
			}
		}
	return worst;
}

/* Like check_lora_set, one line for the whole set, over the entries with keep[i] only:
 * max over tensors of max_{keep} |a-b| / max_{all} |b|. */
static void check_lora_masked(const pcase *c, const char *what, const float *got,
			      const float *ref, const unsigned char *keep, double bound)
{
	double worst = 0;
	for (int l = 0; l < c->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			int in, out;
			bk_model_module_dims(&c->m->cfg, mod, &in, &out);
			for (int ab = 0; ab < 2; ab++) {
				size_t off = (size_t)((ab ? c->shape->B[l][mod] : c->shape->A[l][mod]) -
						      c->shape->flat);
				size_t n = (size_t)c->r * (ab ? out : in);
				double num = 0, den = 1e-30;
				for (size_t i = off; i < off + n; i++) {
					double d = fabs((double)got[i] - ref[i]);
					if (isnan(d))
						d = INFINITY;
					if (keep[i] && d > num)
						num = d;
					if (fabs(ref[i]) > den)
						den = fabs(ref[i]);
				}
				if (num / den > worst)
					worst = num / den;
			}
		}
	report(c->name, what, worst, bound);
}

/* ---- forward, logits, loss ---- */

/* c->hid [T,H] (host) = final hidden states of a packed batch; lora NULL: base model */
static void forward(pcase *c, const bk_lora *lora, const packed *p)
{
	bk_model_forward(c->m, lora, &p->b, NULL, c->acts, c->dhid);
	c->ops->download(c->hid, c->dhid, (size_t)p->T * c->H * sizeof(float));
}

/* logits [T,V] (host) of a packed batch */
static void logits_of(pcase *c, const bk_lora *lora, const packed *p, float *logits)
{
	bk_model_forward(c->m, lora, &p->b, NULL, c->acts, c->dhid);
	bk_model_logits(c->m, c->dhid, c->dlogits, p->T);
	c->ops->download(logits, c->dlogits, (size_t)p->T * c->V * sizeof(float));
}

/* compare sequence i of packed logits with fixture tensor NAME [len_i, V] */
static void check_seq_logits(pcase *c, const char *name, const packed *p, int i,
			     const float *logits, double bound)
{
	int len = p->cu[i + 1] - p->cu[i];
	float *ref = read_tensor(c, name, len, c->V);
	double e = bk_max_relerr(logits + (size_t)p->cu[i] * c->V, ref, (size_t)len * c->V, 1e-30);
	char what[128];
	snprintf(what, sizeof what, "%s (packed, seq %d of %d)", name, i, p->S);
	report(c->name, what, e, bound);
	free(ref);
}

/* The baking loss at temperature temp: teacher = base model on t_ids, student = lora
 * on s_ids, response rows gathered, bk_loss_kl_exact with a chunk not dividing V.
 * per_sample[S] (if not NULL) gets each sample's mean KL; grads (if not NULL, zeroed
 * by the caller) get dLoss/dA, dB added. */
static double baking_loss(pcase *c, const bk_lora *lora, float temp, bk_lora *grads,
			  double *per_sample)
{
	const int H = c->H, N = c->sp.N;
	if (c->tp.N != N)
		BUG("teacher and student have different row counts");
	float *th = xmalloc((size_t)N * H * sizeof(float));
	float *sh = xmalloc((size_t)N * H * sizeof(float));
	float *dh = xmalloc((size_t)N * H * sizeof(float));
	float *rkl = xmalloc((size_t)N * sizeof(float));
	forward(c, NULL, &c->tp);
	for (int r = 0; r < N; r++)
		memcpy(th + (size_t)r * H, c->hid + (size_t)c->tp.rows[r] * H, H * sizeof(float));
	forward(c, lora, &c->sp); /* last: its activations serve the backward */
	for (int r = 0; r < N; r++)
		memcpy(sh + (size_t)r * H, c->hid + (size_t)c->sp.rows[r] * H, H * sizeof(float));
	const float *lm_head = (const float *)c->m->lm_head->data; /* host twin: fp32 [V,H] */
	double loss = bk_loss_kl_exact(sh, lm_head, th, NULL, c->sp.sample_of, N, c->S, H, c->V,
				       VOCAB_CHUNK, temp, c->m->cfg.final_softcap, grads ? dh : NULL,
				       rkl);
	if (per_sample) {
		for (int i = 0; i < c->S; i++) {
			double s = 0;
			int n = 0;
			for (int r = 0; r < N; r++)
				if (c->sp.sample_of[r] == i)
					s += rkl[r], n++;
			per_sample[i] = n ? s / n : 0;
		}
	}
	if (grads) {
		memset(c->hid, 0, (size_t)c->sp.T * H * sizeof(float));
		for (int r = 0; r < N; r++)
			memcpy(c->hid + (size_t)c->sp.rows[r] * H, dh + (size_t)r * H, H * sizeof(float));
		c->ops->upload(c->dgrad, c->hid, (size_t)c->sp.T * H * sizeof(float));
		bk_model_backward(c->m, lora, &c->sp.b, c->acts, c->dgrad, grads);
	}
	free(th), free(sh), free(dh), free(rkl);
	return loss;
}

/* ---- the optimizer settings of case.json ---- */

typedef struct {
	double lr, beta1, beta2, eps, wd, max_norm, temperature;
	int64_t warmup, total;
	bk_sched_kind sched;
	double step_loss[3], step_norm[3], step_lr[3];
} optim_case;

static optim_case read_optim(const pcase *c)
{
	const char *f = c->json_path;
	json_t *o = jkey(f, c->root, "optim");
	optim_case q;
	if (strcmp(jstr(f, o, "name"), "torch.optim.AdamW"))
		die("%s: optim.name '%s' is not torch.optim.AdamW", f, jstr(f, o, "name"));
	if (strcmp(jstr(f, o, "schedule"), "transformers.get_cosine_schedule_with_warmup"))
		die("%s: optim.schedule '%s' is not the cosine schedule", f, jstr(f, o, "schedule"));
	q.sched = BK_SCHED_COSINE;
	q.lr = jnum(f, o, "lr");
	json_t *betas = jkey(f, o, "betas");
	q.beta1 = jidx(f, betas, 0, "optim.betas");
	q.beta2 = jidx(f, betas, 1, "optim.betas");
	q.eps = jnum(f, o, "eps");
	q.wd = jnum(f, o, "weight_decay");
	q.max_norm = jnum(f, o, "max_grad_norm");
	q.warmup = (int64_t)jnum(f, o, "num_warmup_steps");
	q.total = (int64_t)jnum(f, o, "num_training_steps");
	q.temperature = jnum(f, o, "temperature");
	json_t *steps = jkey(f, c->root, "steps");
	if (!json_is_array(steps) || json_array_size(steps) != 3 || q.total != 3)
		die("%s: key 'steps' must hold the 3 steps of num_training_steps 3", f);
	for (int t = 0; t < 3; t++) {
		json_t *s = json_array_get(steps, (size_t)t);
		q.step_loss[t] = jnum(f, s, "loss");
		q.step_norm[t] = jnum(f, s, "grad_norm");
		q.step_lr[t] = jnum(f, s, "lr");
	}
	return q;
}

static void add_groups(const pcase *c, bk_adamw *o, float *param, float *grad)
{
	for (int l = 0; l < c->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			int in, out;
			bk_model_module_dims(&c->m->cfg, mod, &in, &out);
			size_t oa = (size_t)(c->shape->A[l][mod] - c->shape->flat);
			size_t ob = (size_t)(c->shape->B[l][mod] - c->shape->flat);
			char name[96];
			snprintf(name, sizeof name, "layers.%d.%s.lora_A", l, bk_lora_module_names[mod]);
			bk_adamw_add(o, name, param + oa, grad + oa, (size_t)c->r * in);
			snprintf(name, sizeof name, "layers.%d.%s.lora_B", l, bk_lora_module_names[mod]);
			bk_adamw_add(o, name, param + ob, grad + ob, (size_t)out * c->r);
		}
}

static void report_lr(const pcase *c, const char *what, int t, double lr, double ref)
{
	char name[96];
	snprintf(name, sizeof name, "%s step %d lr (%g)", what, t + 1, ref);
	report(c->name, name, bk_relerr(lr, ref, 1e-3), TOL_LR);
}

/* ---- adapters on disk ---- */

static void remove_tree(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char *p = bk_path_join(dir, e->d_name);
		if (unlink(p) != 0)
			remove_tree(p);
		free(p);
	}
	closedir(d);
	if (rmdir(dir) != 0)
		warn("%s: %s", dir, strerror(errno));
}

/* the adapter's tensors into a flat host array laid out like c->shape->flat */
static float *adapter_flat(const pcase *c, const bk_adapter *ad)
{
	bk_lora *tmp = bk_lora_create(c->m, c->r, c->alpha, 0, BK_LORA_ALL);
	bk_lora_from_adapter(c->m, tmp, ad);
	float *flat = xmalloc(c->n_flat * sizeof(float));
	c->ops->download(flat, tmp->flat, c->n_flat * sizeof(float));
	bk_lora_free(c->m, tmp);
	return flat;
}

static void check_adapter_header(const pcase *c, const char *what, const bk_adapter *ad)
{
	char name[128];
	snprintf(name, sizeof name, "%s r, lora_alpha, targets", what);
	int same = ad->r == c->r && ad->alpha == c->alpha && ad->targets == BK_PEFT_ALL &&
		   ad->n_layers == c->L;
	report(c->name, name, same ? 0 : 1, 0);
	snprintf(name, sizeof name, "%s base_model_name_or_path", what);
	report(c->name, name,
	       ad->base_model && !strcmp(ad->base_model, c->model_path) ? 0 : 1, 0);
}

/* ---- one model ---- */

static int load_case(pcase *c, const char *name)
{
	memset(c, 0, sizeof(*c));
	c->name = name;
	c->dir = xasprintf("tests/golden/parity/%s", name);
	c->json_path = xasprintf("%s/case.json", c->dir);
	json_error_t jerr;
	c->root = json_load_file(c->json_path, 0, &jerr);
	if (!c->root)
		die("%s: line %d: %s", c->json_path, jerr.line, jerr.text);
	const char *f = c->json_path;
	json_t *fmt = json_object_get(c->root, "format"), *ver = json_object_get(c->root, "version");
	char *tpath = xasprintf("%s/%s", c->dir, jstr(f, c->root, "tensors"));
	c->gt = bk_st_open(tpath);
	free(tpath);
	const char *mf = bk_st_meta(c->gt, "format"), *mv = bk_st_meta(c->gt, "version");
	int fmt_ok = json_is_string(fmt) && !strcmp(json_string_value(fmt), "bakery-parity") &&
		     json_is_integer(ver) && json_integer_value(ver) == 1 && mf &&
		     !strcmp(mf, "bakery-parity") && mv && !strcmp(mv, "1");
	CHECK(fmt_ok, "%s: fixture format is not bakery-parity version 1; regenerate with "
		      "python3 tests/ref/make_parity.py", c->dir);
	if (!fmt_ok)
		return 0;
	json_t *model = jkey(f, c->root, "model"), *lora = jkey(f, c->root, "lora");
	if (strcmp(jstr(f, model, "name"), name))
		die("%s: model.name '%s' is not '%s'", f, jstr(f, model, "name"), name);
	c->model_path = jstr(f, model, "path");
	c->lm = bk_model_load(&bk_ops_host, c->model_path);
	c->m = c->lm.model;
	c->ops = c->m->ops;
	c->H = c->m->cfg.H, c->V = c->m->cfg.V, c->L = c->m->cfg.L;
	if (c->V != (int)jnum(f, model, "vocab_size") || c->H != (int)jnum(f, model, "hidden_size") ||
	    c->L != (int)jnum(f, model, "num_hidden_layers") ||
	    c->m->cfg.tied != json_is_true(jkey(f, model, "tie_word_embeddings")))
		die("%s: model does not match %s (vocab, hidden, layers or tying)", f, c->model_path);
	c->r = (int)jnum(f, lora, "r");
	c->alpha = (float)jnum(f, lora, "alpha");
	if (jnum(f, lora, "dropout") != 0)
		die("%s: lora.dropout is not 0", f);
	json_t *targets = jkey(f, lora, "targets");
	if (json_array_size(targets) != BK_LORA_NMOD)
		die("%s: lora.targets: expected the 7 linear modules", f);
	for (int mod = 0; mod < BK_LORA_NMOD; mod++)
		if (!json_is_string(json_array_get(targets, (size_t)mod)) ||
		    strcmp(json_string_value(json_array_get(targets, (size_t)mod)),
			   bk_lora_module_names[mod]))
			die("%s: lora.targets[%d] is not %s", f, mod, bk_lora_module_names[mod]);
	json_t *samples = jkey(f, c->root, "samples");
	c->S = (int)json_array_size(samples);
	if (c->S < 1 || c->S > MAX_S)
		die("%s: key 'samples' holds %d samples (1..%d)", f, c->S, MAX_S);
	for (int i = 0; i < c->S; i++) {
		json_t *s = json_array_get(samples, (size_t)i);
		sample *x = &c->smp[i];
		x->t_prompt = jids(f, s, "t_prompt"), x->s_prompt = jids(f, s, "s_prompt");
		x->resp = jids(f, s, "resp"), x->t_ids = jids(f, s, "t_ids"), x->s_ids = jids(f, s, "s_ids");
		if (x->t_ids.n != x->t_prompt.n + x->resp.n || x->s_ids.n != x->s_prompt.n + x->resp.n ||
		    memcmp(x->t_ids.v + x->t_prompt.n, x->resp.v, (size_t)x->resp.n * 4) ||
		    memcmp(x->s_ids.v + x->s_prompt.n, x->resp.v, (size_t)x->resp.n * 4))
			die("%s: samples[%d]: t_ids/s_ids are not prompt + resp", f, i);
	}
	pack(&c->tp, c, 1);
	pack(&c->sp, c, 0);
	c->max_T = c->tp.T > c->sp.T ? c->tp.T : c->sp.T;
	c->acts = bk_acts_create(c->m, c->max_T, c->r);
	c->dhid = c->ops->alloc((size_t)c->max_T * c->H * sizeof(float));
	c->dgrad = c->ops->alloc((size_t)c->max_T * c->H * sizeof(float));
	c->dlogits = c->ops->alloc((size_t)c->max_T * c->V * sizeof(float));
	c->hid = xmalloc((size_t)c->max_T * c->H * sizeof(float));
	c->shape = bk_lora_create(c->m, c->r, c->alpha, 0, BK_LORA_ALL);
	c->n_flat = c->shape->n_flat;
	c->init = read_lora_set(c, "lora.init");
	/* the LoRA scale the fixtures were made with is ours: alpha / r */
	report(name, "lora scale alpha/r", bk_relerr(c->shape->scale, jnum(f, lora, "scale"), 1e-30),
	       1e-7);
	return 1;
}

static void free_case(pcase *c)
{
	for (int i = 0; i < c->S; i++) {
		sample *x = &c->smp[i];
		free(x->t_prompt.v), free(x->s_prompt.v), free(x->resp.v), free(x->t_ids.v),
			free(x->s_ids.v);
	}
	packed_free(&c->tp), packed_free(&c->sp);
	if (c->m) {
		bk_acts_free(c->m, c->acts);
		c->ops->free(c->dhid), c->ops->free(c->dgrad), c->ops->free(c->dlogits);
		bk_lora_free(c->m, c->shape);
		bk_model_unload(&c->lm);
	}
	free(c->hid), free(c->init);
	if (c->gt)
		bk_st_close(c->gt);
	json_decref(c->root);
	free(c->dir), free(c->json_path);
}

static bk_lora *lora_from_flat(const pcase *c, const float *flat)
{
	bk_lora *l = bk_lora_create(c->m, c->r, c->alpha, 0, BK_LORA_ALL);
	c->ops->upload(l->flat, flat, c->n_flat * sizeof(float));
	return l;
}

/* 1b. the teacher as bk-teach runs it: the shared [BOS] + system prompt as a prefix
 * (K/V at positions 0..P-1), the 3 remainders packed at positions P.. (RoPE offset).
 * Compared with rows P.. of logits.teacher.i. */
static void check_prefix_teacher(pcase *c)
{
	int P = c->smp[0].t_prompt.n - c->smp[0].s_prompt.n + 1; /* BOS + system */
	for (int i = 0; i < c->S; i++)
		if (c->smp[i].t_prompt.n - c->smp[i].s_prompt.n + 1 != P ||
		    memcmp(c->smp[i].t_ids.v, c->smp[0].t_ids.v, (size_t)P * sizeof(int32_t)))
			die("%s: samples[%d]: the teacher prompts do not share [BOS] + system",
			    c->json_path, i);
	packed p = {0};
	p.S = c->S;
	p.T = c->tp.T - c->S * P;
	p.ids = xmalloc((size_t)p.T * sizeof(int32_t));
	p.pos = xmalloc((size_t)p.T * sizeof(int32_t));
	p.cu = xmalloc((size_t)(c->S + 1) * sizeof(int32_t));
	p.cu[0] = 0;
	for (int i = 0, off = 0; i < c->S; i++) {
		for (int t = P; t < c->smp[i].t_ids.n; t++, off++) {
			p.ids[off] = c->smp[i].t_ids.v[t];
			p.pos[off] = t;
		}
		p.cu[i + 1] = off;
	}
	p.b = (bk_batch){.T = p.T, .S = p.S, .ids = p.ids, .pos = p.pos, .cu_seqlens = p.cu};
	bk_prefix *pre = bk_model_prefix_build(c->m, c->acts, c->smp[0].t_ids.v, P);
	bk_model_forward(c->m, NULL, &p.b, pre, c->acts, c->dhid);
	bk_model_logits(c->m, c->dhid, c->dlogits, p.T);
	float *logits = xmalloc((size_t)p.T * c->V * sizeof(float));
	c->ops->download(logits, c->dlogits, (size_t)p.T * c->V * sizeof(float));
	for (int i = 0; i < c->S; i++) {
		char name[64], what[128];
		snprintf(name, sizeof name, "logits.teacher.%d", i);
		int len = c->smp[i].t_ids.n;
		float *ref = read_tensor(c, name, len, c->V);
		double e = bk_max_relerr(logits + (size_t)p.cu[i] * c->V, ref + (size_t)P * c->V,
					 (size_t)(len - P) * c->V, 1e-30);
		snprintf(what, sizeof what, "%s rows %d.. (prefix %d, packed)", name, P, P);
		report(c->name, what, e, TOL_LOGITS);
		free(ref);
	}
	free(logits);
	bk_prefix_free(c->m, pre);
	packed_free(&p);
}

/* ---- the checks of one model ---- */

typedef struct {
	float *w[4]; /* lora.init, lora.step1..3 (flat) */
	float *g[3]; /* the gradients of steps 1..3 (g[1] == g[0]) */
	double w_bound; /* end-to-end weights, see end_to_end */
} refs;

/* 1. logits, each set of 3 sequences packed into one batch; returns our student
 * logits of sequence 0 [len0,V] */
static float *check_logits(pcase *c, const bk_lora *lora)
{
	char what[96];
	float *logits = xmalloc((size_t)c->max_T * c->V * sizeof(float));
	logits_of(c, NULL, &c->tp, logits);
	for (int i = 0; i < c->S; i++) {
		snprintf(what, sizeof what, "logits.teacher.%d", i);
		check_seq_logits(c, what, &c->tp, i, logits, TOL_LOGITS);
	}
	check_prefix_teacher(c);
	logits_of(c, lora, &c->sp, logits);
	for (int i = 0; i < c->S; i++) {
		snprintf(what, sizeof what, "logits.student.%d", i);
		check_seq_logits(c, what, &c->sp, i, logits, TOL_LOGITS);
	}
	return logits;
}

/* 2. the loss at T = 1 and T = 2, total and per sample */
static void check_loss(pcase *c, const bk_lora *lora)
{
	const char *f = c->json_path;
	char what[96];
	json_t *jl = jkey(f, c->root, "loss"), *jper = jkey(f, jl, "per_sample");
	CHECK(c->V % VOCAB_CHUNK != 0, "the vocabulary chunk %d divides V = %d", VOCAB_CHUNK, c->V);
	for (int k = 0; k < 2; k++) {
		const char *key = k ? "T2" : "T1";
		double per[MAX_S];
		double loss = baking_loss(c, lora, k ? 2.0f : 1.0f, NULL, per);
		snprintf(what, sizeof what, "loss %s (chunk %d of V %d)", key, VOCAB_CHUNK, c->V);
		report(c->name, what, bk_relerr(loss, jnum(f, jl, key), 1e-30), TOL_LOSS);
		for (int i = 0; i < c->S; i++) {
			snprintf(what, sizeof what, "loss %s sample %d", key, i);
			report(c->name, what,
			       bk_relerr(per[i], jidx(f, jkey(f, jper, key), (size_t)i, "loss.per_sample"),
					 1e-30),
			       TOL_LOSS);
		}
	}
}

/* 4a. the optimizer alone on the stored gradients (same inputs as torch: 1e-5) */
static void check_optim_only(pcase *c, const optim_case *q, const refs *rf)
{
	char what[96];
	float *param = xmalloc(c->n_flat * sizeof(float)), *grad = xmalloc(c->n_flat * sizeof(float));
	bk_adamw o;
	bk_adamw_init(&o, q->beta1, q->beta2, q->eps, q->wd);
	add_groups(c, &o, param, grad);
	memcpy(param, rf->w[0], c->n_flat * sizeof(float));
	for (int t = 0; t < 3; t++) {
		memcpy(grad, rf->g[t], c->n_flat * sizeof(float));
		double norm = bk_adamw_clip_grad_norm(&o, q->max_norm);
		snprintf(what, sizeof what, "optim-only step %d grad_norm", t + 1);
		report(c->name, what, bk_relerr(norm, q->step_norm[t], 1e-30), TOL_OPTIM_ONLY);
		double lr = bk_sched_lr(q->sched, q->lr, t, q->warmup, q->total);
		report_lr(c, "optim-only", t, lr, q->step_lr[t]);
		bk_adamw_step(&o, lr);
		snprintf(what, sizeof what, "optim-only lora.step%d", t + 1);
		check_lora_set(c, what, param, rf->w[t + 1], TOL_OPTIM_ONLY);
	}
	bk_adamw_free(&o);
	free(param), free(grad);
}

/* The bound of the end-to-end weights: 1e-4, or case.json's first_update_f32_bound
 * where that is larger (tests/ref/README.md "About the step weights"); then the
 * entries whose first update is well conditioned are still held at 1e-4. */
static double weight_bound(const pcase *c)
{
	const char *f = c->json_path;
	json_t *lora = jkey(f, c->root, "lora");
	double fu = jnum(f, lora, "first_update_f32_bound");
	if (fu <= TOL_WEIGHTS)
		return TOL_WEIGHTS;
	printf("%-11s end-to-end weights: bound %.2g instead of %.0g over all entries, because\n"
	       "            Adam's first update of an entry is ~lr*g/(|g|+eps): entries whose clipped\n"
	       "            gradient is within a few hundred eps of 0 (min |g| here %.2g) follow their own\n"
	       "            float32 rounding, which case.json first_update_f32_bound bounds for two correct\n"
	       "            implementations (tests/ref/README.md); entries with |clipped g| >= %.0g stay\n"
	       "            at %.0g, and the step losses and step-3 logits at %.0g\n",
	       c->name, fu, TOL_WEIGHTS, jnum(f, lora, "min_abs_clipped_grad"), WELL_COND_G,
	       TOL_WEIGHTS, TOL_LOSS);
	return fu;
}

/* 3. + 4b. end to end: forward, loss, backward, clipping, AdamW; lora ends at step 3 */
static void check_end_to_end(pcase *c, const optim_case *q, const refs *rf, bk_lora *lora)
{
	char what[128];
	float *param = xmalloc(c->n_flat * sizeof(float)), *grad = xmalloc(c->n_flat * sizeof(float));
	/* the entries whose first real update (step 2) is well conditioned */
	unsigned char *keep = xmalloc(c->n_flat);
	size_t n_keep = 0;
	double coef = q->max_norm / (q->step_norm[1] + 1e-6);
	for (size_t i = 0; i < c->n_flat; i++) {
		keep[i] = fabs(rf->g[1][i] * (coef < 1 ? coef : 1)) >= WELL_COND_G;
		n_keep += keep[i];
	}
	bk_lora *grads = bk_lora_create_like(c->m, lora);
	bk_adamw o;
	bk_adamw_init(&o, q->beta1, q->beta2, q->eps, q->wd);
	add_groups(c, &o, param, grad);
	memcpy(param, rf->w[0], c->n_flat * sizeof(float));
	c->ops->upload(lora->flat, param, c->n_flat * sizeof(float));
	for (int t = 0; t < 3; t++) {
		c->ops->zero(grads->flat, c->n_flat * sizeof(float));
		double loss = baking_loss(c, lora, 1.0f, grads, NULL);
		snprintf(what, sizeof what, "end-to-end step %d loss", t + 1);
		report(c->name, what, bk_relerr(loss, q->step_loss[t], 1e-30), TOL_LOSS);
		c->ops->download(grad, grads->flat, c->n_flat * sizeof(float));
		if (t == 0) /* 3. the gradients at T = 1, at the initial weights */
			check_lora_set(c, "grad", grad, rf->g[0], TOL_GRAD);
		if (t == 2) /* at our step-2 weights */
			check_lora_set(c, "grad.step3", grad, rf->g[2], TOL_GRAD);
		double norm = bk_adamw_clip_grad_norm(&o, q->max_norm);
		snprintf(what, sizeof what, "end-to-end step %d grad_norm (pre-clip)", t + 1);
		report(c->name, what, bk_relerr(norm, q->step_norm[t], 1e-30), TOL_GRAD);
		double lr = bk_sched_lr(q->sched, q->lr, t, q->warmup, q->total);
		report_lr(c, "end-to-end", t, lr, q->step_lr[t]);
		bk_adamw_step(&o, lr);
		c->ops->upload(lora->flat, param, c->n_flat * sizeof(float));
		snprintf(what, sizeof what, "end-to-end lora.step%d", t + 1);
		/* lr 0 at step 1: the weights must not move at all */
		check_lora_set(c, what, param, rf->w[t + 1], t == 0 ? 0 : rf->w_bound);
		if (t > 0 && rf->w_bound > TOL_WEIGHTS) {
			snprintf(what, sizeof what, "end-to-end lora.step%d, %zu of %zu entries", t + 1,
				 n_keep, c->n_flat);
			check_lora_masked(c, what, param, rf->w[t + 1], keep, TOL_WEIGHTS);
		}
	}
	float *logits = xmalloc((size_t)c->sp.T * c->V * sizeof(float));
	logits_of(c, lora, &c->sp, logits);
	check_seq_logits(c, "logits.student_step3.0", &c->sp, 0, logits, TOL_LOGITS);
	bk_adamw_free(&o);
	bk_lora_free(c->m, grads);
	free(logits), free(keep), free(param), free(grad);
}

/* 4c. the same 3 steps through bk-step's trainer (exact mode: teacher run here) */
static void check_trainer(pcase *c, const optim_case *q, const refs *rf)
{
	char what[96];
	bk_train_opts to = {.r = c->r, .alpha = c->alpha, .dropout = 0, .targets = BK_LORA_ALL,
			    .lr = q->lr, .weight_decay = q->wd, .max_grad_norm = q->max_norm,
			    .sched = q->sched, .warmup = q->warmup, .total = q->total,
			    .temperature = (float)q->temperature, .seed = 1,
			    .vocab_chunk = VOCAB_CHUNK};
	bk_trainer *tr = bk_trainer_create(c->m, &to);
	/* the fixture's initial weights instead of the seeded init (no step taken yet:
	 * the optimizer state is zero) */
	c->ops->upload(tr->lora->flat, rf->w[0], c->n_flat * sizeof(float));
	bk_train_sample ts[MAX_S];
	for (int i = 0; i < c->S; i++)
		ts[i] = (bk_train_sample){.s_prompt = c->smp[i].s_prompt.v,
					  .t_prompt = c->smp[i].t_prompt.v,
					  .resp = c->smp[i].resp.v,
					  .s_len = c->smp[i].s_prompt.n,
					  .t_len = c->smp[i].t_prompt.n,
					  .n_resp = c->smp[i].resp.n,
					  .teacher = NULL};
	for (int t = 0; t < 3; t++) {
		bk_train_micro_info info;
		bk_trainer_micro(tr, ts, c->S, &info);
		snprintf(what, sizeof what, "trainer step %d loss", t + 1);
		report(c->name, what, bk_relerr(info.loss, q->step_loss[t], 1e-30), TOL_LOSS);
		double lr;
		double norm = bk_trainer_step(tr, &lr);
		snprintf(what, sizeof what, "trainer step %d grad_norm (pre-clip)", t + 1);
		report(c->name, what, bk_relerr(norm, q->step_norm[t], 1e-30), TOL_GRAD);
		report_lr(c, "trainer", t, lr, q->step_lr[t]);
	}
	float *w = xmalloc(c->n_flat * sizeof(float));
	c->ops->download(w, tr->lora->flat, c->n_flat * sizeof(float));
	check_lora_set(c, "trainer lora.step3", w, rf->w[3], rf->w_bound);
	free(w);
	bk_trainer_free(tr);
}

/* 5. PEFT's adapter directory: exactly lora.init, and the same logits */
static void check_peft_adapter(pcase *c, const float *student0)
{
	const char *f = c->json_path;
	char *dir = xasprintf("%s/%s", c->dir, jstr(f, jkey(f, c->root, "peft_reload"), "adapter_dir"));
	bk_adapter *ad = bk_adapter_load(dir, c->lm.cfg);
	check_adapter_header(c, "peft adapter", ad);
	float *flat = adapter_flat(c, ad);
	check_lora_set(c, "peft adapter == lora.init", flat, c->init, 0);
	bk_lora *l = lora_from_flat(c, flat);
	float *logits = xmalloc((size_t)c->sp.T * c->V * sizeof(float));
	logits_of(c, l, &c->sp, logits);
	check_seq_logits(c, "logits.student.0", &c->sp, 0, logits, TOL_LOGITS);
	check_seq_logits(c, "logits.peft_reload.0", &c->sp, 0, logits, TOL_LOGITS);
	report(c->name, "peft adapter logits == lora.init logits (bits)",
	       memcmp(logits, student0, (size_t)c->sp.cu[1] * c->V * sizeof(float)) ? 1 : 0, 0);
	bk_lora_free(c->m, l);
	free(logits), free(flat), free(dir);
	bk_adapter_free(ad);
}

/* 6. an adapter written by us (the step-3 weights in lora) round-trips; with
 * BK_PARITY_KEEP=DIR it is also written to DIR/<model> for PEFT to check */
static void check_our_adapter(pcase *c, const bk_lora *lora)
{
	float *step3 = xmalloc(c->n_flat * sizeof(float));
	c->ops->download(step3, lora->flat, c->n_flat * sizeof(float));
	bk_adapter *mine = bk_adapter_new(c->lm.cfg, c->r, c->alpha, 0, BK_PEFT_ALL, c->model_path);
	bk_lora_to_adapter(c->m, lora, mine);
	char tmp[] = "/tmp/bk-parity-XXXXXX";
	if (!mkdtemp(tmp))
		die("mkdtemp %s: %s", tmp, strerror(errno));
	char *dir = bk_path_join(tmp, c->name);
	bk_adapter_save(mine, dir);
	bk_adapter *back = bk_adapter_load(dir, c->lm.cfg);
	check_adapter_header(c, "our adapter (reloaded)", back);
	float *flat = adapter_flat(c, back);
	check_lora_set(c, "our adapter (reloaded) == step3", flat, step3, 0);
	bk_lora *l = lora_from_flat(c, flat);
	float *logits = xmalloc((size_t)c->sp.T * c->V * sizeof(float));
	logits_of(c, l, &c->sp, logits);
	check_seq_logits(c, "logits.student_step3.0", &c->sp, 0, logits, TOL_LOGITS);
	bk_lora_free(c->m, l);
	/* 7. bk-merge's model (the adapter folded into the weights, f32) with no adapter
	 * gives the adapted model's logits (HF + PEFT's, stored) */
	char *mdir = bk_path_join(tmp, "merged");
	bk_merge_model(c->model_path, back, mdir, BK_MERGE_AUTO);
	bk_loaded_model merged = bk_model_load(&bk_ops_host, mdir);
	bk_acts *ma = bk_acts_create(merged.model, c->sp.T, 1);
	float *mh = c->ops->alloc((size_t)c->sp.T * c->H * sizeof(float));
	bk_model_forward(merged.model, NULL, &c->sp.b, NULL, ma, mh);
	bk_model_logits(merged.model, mh, c->dlogits, c->sp.T);
	c->ops->download(logits, c->dlogits, (size_t)c->sp.T * c->V * sizeof(float));
	int len0 = c->sp.cu[1] - c->sp.cu[0];
	float *want = read_tensor(c, "logits.student_step3.0", len0, c->V);
	report(c->name, "bk-merge model == logits.student_step3.0",
	       bk_max_relerr(logits, want, (size_t)len0 * c->V, 1e-30), TOL_LOGITS);
	free(want);
	c->ops->free(mh);
	bk_acts_free(merged.model, ma);
	bk_model_unload(&merged);
	free(mdir);
	bk_adapter_free(back);
	remove_tree(tmp);
	const char *keep = getenv("BK_PARITY_KEEP");
	if (keep && *keep) {
		char *kd = bk_path_join(keep, c->name);
		bk_adapter_save(mine, kd);
		printf("%-11s kept our step-3 adapter in %s; check it with PEFT:\n"
		       "            python3 tests/ref/make_parity.py --check-adapter %s --model %s "
		       "--which step3\n", c->name, kd, kd, c->name);
		free(kd);
	}
	bk_adapter_free(mine);
	free(logits), free(flat), free(dir), free(step3);
}

static void run_case(const char *name)
{
	pcase c_, *c = &c_;
	if (!load_case(c, name)) {
		free_case(c);
		return;
	}
	bk_lora *lora = lora_from_flat(c, c->init);
	float *student0 = check_logits(c, lora);
	check_loss(c, lora);

	optim_case q = read_optim(c);
	if (q.temperature != 1)
		die("%s: optim.temperature is not 1", c->json_path);
	refs rf = {{c->init, read_lora_set(c, "lora.step1"), read_lora_set(c, "lora.step2"),
		    read_lora_set(c, "lora.step3")},
		   {read_lora_set(c, "grad"), NULL, read_lora_set(c, "grad.step3")},
		   weight_bound(c)};
	rf.g[1] = rf.g[0]; /* the gradient of step 2 is that of step 1 (lr 0 at step 1) */
	check_optim_only(c, &q, &rf);
	check_end_to_end(c, &q, &rf, lora);
	check_trainer(c, &q, &rf);
	check_peft_adapter(c, student0);
	check_our_adapter(c, lora);

	for (int t = 1; t < 4; t++)
		free(rf.w[t]);
	free(rf.g[0]), free(rf.g[2]), free(student0);
	bk_lora_free(c->m, lora);
	free_case(c);
}

int main(void)
{
	run_case("tiny");
	run_case("stories260K");
	run_case("qwen2");
	run_case("qwen3");
	run_case("gemma2");
	run_case("gemma3");
	if (failed_list[0])
		fprintf(stderr, "failed:%s\n", failed_list);
	return bk_test_done("test_parity");
}
