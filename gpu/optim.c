/* optim.c - host AdamW, gradient clipping, HF learning-rate schedules and LoRA init
 * (see optim.h).  Not a CUDA kernel; a device version copies these signatures. */
#include "gpu/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/hash.h"
#include "common/rng.h"

void bk_adamw_init(bk_adamw *o, double beta1, double beta2, double eps, double weight_decay)
{
	if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
		die("adamw: betas (%g, %g) are not in [0, 1)", beta1, beta2);
	if (!(eps >= 0) || !(weight_decay >= 0))
		die("adamw: eps %g and weight decay %g must be >= 0", eps, weight_decay);
	memset(o, 0, sizeof(*o));
	o->beta1 = beta1, o->beta2 = beta2, o->eps = eps, o->weight_decay = weight_decay;
}

void bk_adamw_add(bk_adamw *o, const char *name, float *param, float *grad, size_t n)
{
	if (bk_adamw_find(o, name))
		BUG("adamw: parameter '%s' registered twice", name);
	if (o->n_groups == o->cap) {
		o->cap = o->cap ? 2 * o->cap : 16;
		o->groups = xrealloc(o->groups, (size_t)o->cap * sizeof(*o->groups));
	}
	bk_adamw_group *g = &o->groups[o->n_groups++];
	g->name = xstrdup(name);
	g->param = param, g->grad = grad, g->n = n;
	g->m = xcalloc(n ? n : 1, sizeof(float));
	g->v = xcalloc(n ? n : 1, sizeof(float));
}

void bk_adamw_free(bk_adamw *o)
{
	for (int i = 0; i < o->n_groups; i++)
		free(o->groups[i].name), free(o->groups[i].m), free(o->groups[i].v);
	free(o->groups);
	memset(o, 0, sizeof(*o));
}

bk_adamw_group *bk_adamw_find(bk_adamw *o, const char *name)
{
	for (int i = 0; i < o->n_groups; i++)
		if (strcmp(o->groups[i].name, name) == 0)
			return &o->groups[i];
	return NULL;
}

void bk_adamw_step(bk_adamw *o, double lr)
{
	o->step++;
	double bc1 = 1 - pow(o->beta1, (double)o->step);
	double bc2_sqrt = sqrt(1 - pow(o->beta2, (double)o->step));
	float decay = (float)(1 - lr * o->weight_decay);
	float w1 = (float)(1 - o->beta1), b2 = (float)o->beta2, w2 = (float)(1 - o->beta2);
	float neg_step = (float)(-(lr / bc1)), bc2s = (float)bc2_sqrt, eps = (float)o->eps;
	int do_decay = o->weight_decay != 0;
	for (int gi = 0; gi < o->n_groups; gi++) {
		bk_adamw_group *g = &o->groups[gi];
		float *p = g->param, *m = g->m, *v = g->v;
		const float *gr = g->grad;
		ptrdiff_t n = (ptrdiff_t)g->n;
#pragma omp parallel for schedule(static) if (n > 65536)
		for (ptrdiff_t i = 0; i < n; i++) {
			float pi = p[i], gi_ = gr[i];
			if (do_decay)
				pi *= decay;
			float mi = m[i] + w1 * (gi_ - m[i]); /* torch lerp_, weight < 0.5 */
			float vi = v[i] * b2 + w2 * gi_ * gi_;
			float denom = sqrtf(vi) / bc2s + eps;
			p[i] = pi + neg_step * (mi / denom);
			m[i] = mi, v[i] = vi;
		}
	}
}

void bk_adamw_zero_grad(bk_adamw *o)
{
	for (int i = 0; i < o->n_groups; i++)
		memset(o->groups[i].grad, 0, o->groups[i].n * sizeof(float));
}

void bk_adamw_scale_grad(bk_adamw *o, double s)
{
	float f = (float)s;
	for (int gi = 0; gi < o->n_groups; gi++) {
		float *g = o->groups[gi].grad;
		for (size_t i = 0; i < o->groups[gi].n; i++)
			g[i] *= f;
	}
}

void bk_adamw_average_grad(bk_adamw *o, int n_micro)
{
	if (n_micro < 1)
		BUG("adamw: %d micro-batches", n_micro);
	if (n_micro > 1)
		bk_adamw_scale_grad(o, 1.0 / n_micro);
}

double bk_adamw_grad_norm(const bk_adamw *o)
{
	double s = 0;
	for (int gi = 0; gi < o->n_groups; gi++) {
		const float *g = o->groups[gi].grad;
		ptrdiff_t n = (ptrdiff_t)o->groups[gi].n;
		double acc = 0;
#pragma omp parallel for schedule(static) reduction(+ : acc) if (n > 65536)
		for (ptrdiff_t i = 0; i < n; i++)
			acc += (double)g[i] * g[i];
		s += acc;
	}
	return sqrt(s);
}

double bk_adamw_clip_grad_norm(bk_adamw *o, double max_norm)
{
	double total = bk_adamw_grad_norm(o);
	if (!isfinite(total))
		return total;
	double coef = max_norm / (total + 1e-6);
	if (coef < 1)
		bk_adamw_scale_grad(o, coef);
	return total;
}

static const char *sched_names[] = {
	[BK_SCHED_LINEAR] = "linear",
	[BK_SCHED_COSINE] = "cosine",
	[BK_SCHED_CONSTANT] = "constant",
	[BK_SCHED_CONSTANT_WITH_WARMUP] = "constant_with_warmup",
};

int bk_sched_parse(const char *name, bk_sched_kind *kind)
{
	for (int i = 0; i < (int)(sizeof(sched_names) / sizeof(sched_names[0])); i++)
		if (strcmp(name, sched_names[i]) == 0) {
			*kind = (bk_sched_kind)i;
			return 0;
		}
	return -1;
}

const char *bk_sched_name(bk_sched_kind kind)
{
	if ((unsigned)kind >= sizeof(sched_names) / sizeof(sched_names[0]))
		BUG("scheduler kind %d", (int)kind);
	return sched_names[kind];
}

int64_t bk_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total)
{
	if (warmup_steps < 0 || !(warmup_ratio >= 0 && warmup_ratio <= 1))
		die("schedule: warmup steps %lld / ratio %g out of range", (long long)warmup_steps,
		    warmup_ratio);
	if (warmup_steps > 0)
		return warmup_steps;
	return (int64_t)ceil((double)total * warmup_ratio);
}

static double max1(int64_t x) { return (double)(x > 1 ? x : 1); }

double bk_sched_factor(bk_sched_kind kind, int64_t step, int64_t warmup, int64_t total)
{
	double s = (double)step;
	switch (kind) {
	case BK_SCHED_CONSTANT:
		return 1.0;
	case BK_SCHED_CONSTANT_WITH_WARMUP:
		return step < warmup ? s / max1(warmup) : 1.0;
	case BK_SCHED_LINEAR: {
		if (step < warmup)
			return s / max1(warmup);
		double f = (double)(total - step) / max1(total - warmup);
		return f > 0 ? f : 0.0;
	}
	case BK_SCHED_COSINE: {
		if (step < warmup)
			return s / max1(warmup);
		double progress = (double)(step - warmup) / max1(total - warmup);
		double f = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
		return f > 0 ? f : 0.0;
	}
	}
	BUG("scheduler kind %d", (int)kind);
}

double bk_sched_lr(bk_sched_kind kind, double base_lr, int64_t step, int64_t warmup,
		   int64_t total)
{
	return base_lr * bk_sched_factor(kind, step, warmup, total);
}

void bk_lora_init(float *a, float *b, int r, int in, int out, uint64_t seed, int layer,
		  const char *module)
{
	if (r <= 0 || in <= 0 || out <= 0)
		BUG("lora init: bad shape r=%d in=%d out=%d", r, in, out);
	uint64_t key = bk_crng_key(seed, (uint64_t)(int64_t)layer,
				   bk_hash(module, strlen(module), 0), 0x6c6f72615f41ULL /* "lora_A" */);
	double bound = 1.0 / sqrt((double)in);
	size_t na = (size_t)r * in;
	for (size_t i = 0; i < na; i++)
		a[i] = (float)((2.0 * bk_crng_uniform(key, i) - 1.0) * bound);
	memset(b, 0, (size_t)out * r * sizeof(float));
}
