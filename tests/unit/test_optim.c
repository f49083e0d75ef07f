/* test_optim.c - gpu/optim.h against tests/golden/optim/adamw_schedules.json (written
 * by tests/ref/make_optim_golden.py with torch AdamW, clip_grad_norm_ and HF
 * get_scheduler), plus warmup rounding, accumulation, state hooks and LoRA init.
 * Not a speed test. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "gpu/optim.h"
#include "tests/harness.h"

#define GOLDEN "tests/golden/optim/adamw_schedules.json"
#define REGEN "regenerate it with: python3 tests/ref/make_optim_golden.py"

static json_t *need(json_t *obj, const char *key)
{
	json_t *x = json_object_get(obj, key);
	if (!x)
		die("%s: key '%s' is missing; " REGEN, GOLDEN, key);
	return x;
}

static double num(json_t *obj, const char *key) { return json_number_value(need(obj, key)); }

/* a JSON array of numbers into floats; returns the count */
static size_t floats(json_t *arr, float *out, size_t cap)
{
	size_t n = json_array_size(arr);
	if (n > cap)
		die("%s: array of %zu numbers is larger than expected; " REGEN, GOLDEN, n);
	for (size_t i = 0; i < n; i++)
		out[i] = (float)json_number_value(json_array_get(arr, i));
	return n;
}

enum { MAXG = 4, MAXN = 64 };

static void test_golden(void)
{
	json_error_t err;
	json_t *doc = json_load_file(GOLDEN, 0, &err);
	if (!doc)
		die("%s: line %d: %s; " REGEN, GOLDEN, err.line, err.text);
	const char *fmt = json_string_value(need(doc, "format"));
	if (!fmt || strcmp(fmt, "bakery-optim-golden") != 0 || num(doc, "version") != 1)
		die("%s: not a version 1 bakery-optim-golden file; " REGEN, GOLDEN);
	double base_lr = num(doc, "lr"), max_norm = num(doc, "max_grad_norm");
	double eps = num(doc, "eps");
	double b1 = json_number_value(json_array_get(need(doc, "betas"), 0));
	double b2 = json_number_value(json_array_get(need(doc, "betas"), 1));
	int64_t total = (int64_t)num(doc, "total_steps");
	json_t *init = need(doc, "init"), *grads = need(doc, "grads"), *cases = need(doc, "cases");
	int ng = (int)json_array_size(init);
	if (ng < 1 || ng > MAXG)
		die("%s: %d parameter tensors; " REGEN, GOLDEN, ng);
	CHECK(json_array_size(cases) == 16, "golden has %zu cases", json_array_size(cases));

	size_t ci;
	json_t *c;
	double worst_lr = 0, worst_p = 0, worst_mv = 0, worst_norm = 0;
	json_array_foreach(cases, ci, c)
	{
		const char *sname = json_string_value(need(c, "schedule"));
		bk_sched_kind kind;
		if (!sname || bk_sched_parse(sname, &kind) != 0)
			die("%s: case %zu: unknown schedule; " REGEN, GOLDEN, ci);
		CHECK(strcmp(bk_sched_name(kind), sname) == 0, "schedule name round trip %s", sname);
		double wd = num(c, "weight_decay");
		int64_t warmup = bk_warmup_steps((int64_t)num(c, "warmup_steps"),
						 num(c, "warmup_ratio"), total);
		CHECK(warmup == (int64_t)num(c, "warmup_resolved"),
		      "case %zu %s: warmup %lld, HF %lld", ci, sname, (long long)warmup,
		      (long long)num(c, "warmup_resolved"));

		/* the whole lr sequence, steps 0..total */
		json_t *seq = need(c, "lr_sequence");
		double lr_err = 0;
		for (size_t s = 0; s < json_array_size(seq); s++) {
			double want = json_number_value(json_array_get(seq, s));
			double got = bk_sched_lr(kind, base_lr, (int64_t)s, warmup, total);
			lr_err = fmax(lr_err, bk_relerr(got, want, 1e-12));
		}
		worst_lr = fmax(worst_lr, lr_err);
		CHECK(json_array_size(seq) == (size_t)total + 1 && lr_err < 1e-6,
		      "case %zu %s warmup %lld: lr sequence relerr %g", ci, sname, (long long)warmup,
		      lr_err);

		/* 5 steps of clip + AdamW */
		float param[MAXG][MAXN], grad[MAXG][MAXN], want[MAXN];
		size_t n[MAXG];
		bk_adamw o;
		bk_adamw_init(&o, b1, b2, eps, wd);
		for (int g = 0; g < ng; g++) {
			n[g] = floats(json_array_get(init, g), param[g], MAXN);
			char name[16];
			snprintf(name, sizeof(name), "p%d", g);
			bk_adamw_add(&o, name, param[g], grad[g], n[g]);
		}
		json_t *steps = need(c, "steps"), *st;
		size_t si;
		json_array_foreach(steps, si, st)
		{
			for (int g = 0; g < ng; g++)
				floats(json_array_get(json_array_get(grads, si), g), grad[g], MAXN);
			double lr = bk_sched_lr(kind, base_lr, o.step, warmup, total);
			CHECK(bk_relerr(lr, num(st, "lr"), 1e-12) < 1e-6, "case %zu step %zu: lr %g want %g",
			      ci, si, lr, num(st, "lr"));
			double norm = bk_adamw_clip_grad_norm(&o, max_norm);
			worst_norm = fmax(worst_norm, bk_relerr(norm, num(st, "grad_norm"), 1e-12));
			CHECK(bk_relerr(norm, num(st, "grad_norm"), 1e-12) < 1e-5,
			      "case %zu step %zu: grad norm %.9g want %.9g", ci, si, norm,
			      num(st, "grad_norm"));
			bk_adamw_step(&o, lr);
			double perr = 0, merr = 0, verr = 0;
			for (int g = 0; g < ng; g++) {
				floats(json_array_get(need(st, "params"), g), want, MAXN);
				perr = fmax(perr, bk_max_relerr(param[g], want, n[g], 1e-6));
				floats(json_array_get(need(st, "exp_avg"), g), want, MAXN);
				merr = fmax(merr, bk_max_relerr(o.groups[g].m, want, n[g], 1e-12));
				floats(json_array_get(need(st, "exp_avg_sq"), g), want, MAXN);
				verr = fmax(verr, bk_max_relerr(o.groups[g].v, want, n[g], 1e-20));
			}
			worst_p = fmax(worst_p, perr);
			worst_mv = fmax(worst_mv, fmax(merr, verr));
			CHECK(perr < 1e-5, "case %zu (%s wd %g warmup %lld) step %zu: params relerr %g", ci,
			      sname, wd, (long long)warmup, si, perr);
			CHECK(merr < 1e-5 && verr < 1e-5, "case %zu step %zu: exp_avg relerr %g exp_avg_sq %g",
			      ci, si, merr, verr);
		}
		CHECK(o.step == (int64_t)json_array_size(steps), "step count %lld", (long long)o.step);
		bk_adamw_free(&o);
	}
	printf("golden: %zu cases, max relerr: lr %.3g grad norm %.3g params %.3g moments %.3g\n",
	       json_array_size(cases), worst_lr, worst_norm, worst_p, worst_mv);
	json_decref(doc);
}

/* HF rounding of warmup ratios and edge values of the schedules. */
static void test_schedules(void)
{
	CHECK(bk_warmup_steps(0, 0.3, 8) == 3, "ceil(2.4) -> %lld", (long long)bk_warmup_steps(0, 0.3, 8));
	CHECK(bk_warmup_steps(0, 0.25, 8) == 2, "ceil(2.0) -> %lld", (long long)bk_warmup_steps(0, 0.25, 8));
	CHECK(bk_warmup_steps(0, 0.1, 10) == 1, "ratio 0.1 of 10 -> %lld", (long long)bk_warmup_steps(0, 0.1, 10));
	CHECK(bk_warmup_steps(5, 0.5, 100) == 5, "steps win over ratio");
	CHECK(bk_warmup_steps(0, 0.0, 100) == 0, "no warmup");
	/* no warmup: the first step has the full lr; past the end: 0 */
	CHECK(bk_sched_factor(BK_SCHED_LINEAR, 0, 0, 10) == 1.0, "linear step 0");
	CHECK(bk_sched_factor(BK_SCHED_LINEAR, 12, 0, 10) == 0.0, "linear past the end");
	CHECK(bk_sched_factor(BK_SCHED_COSINE, 5, 0, 10) == 0.5, "cosine half way %g",
	      bk_sched_factor(BK_SCHED_COSINE, 5, 0, 10));
	CHECK(fabs(bk_sched_factor(BK_SCHED_COSINE, 10, 0, 10)) < 1e-15, "cosine at the end");
	CHECK(bk_sched_factor(BK_SCHED_CONSTANT, 0, 5, 10) == 1.0, "constant ignores warmup");
	CHECK(bk_sched_factor(BK_SCHED_CONSTANT_WITH_WARMUP, 1, 4, 10) == 0.25, "constant warmup");
	bk_sched_kind k;
	CHECK(bk_sched_parse("polynomial", &k) == -1, "unknown schedule accepted");
}

/* Accumulation averages; clipping leaves small grads alone and scales big ones. */
static void test_grads(void)
{
	float p[3] = {0}, g[3] = {3, 0, 4}, q[2] = {0}, h[2] = {0, 0};
	bk_adamw o;
	bk_adamw_init(&o, 0.9, 0.999, 1e-8, 0.0);
	bk_adamw_add(&o, "a", p, g, 3);
	bk_adamw_add(&o, "b", q, h, 2);
	CHECK(fabs(bk_adamw_grad_norm(&o) - 5.0) < 1e-12, "norm %g", bk_adamw_grad_norm(&o));
	bk_adamw_average_grad(&o, 4);
	CHECK(g[0] == 0.75f && g[2] == 1.0f, "average over 4: %g %g", g[0], g[2]);
	double n0 = bk_adamw_clip_grad_norm(&o, 10.0);
	CHECK(n0 == 1.25 && g[2] == 1.0f, "no clip below max: norm %g g %g", n0, g[2]);
	double n1 = bk_adamw_clip_grad_norm(&o, 0.5);
	CHECK(n1 == 1.25 && fabs(bk_adamw_grad_norm(&o) - 0.5) < 1e-6, "clip to 0.5: %g",
	      bk_adamw_grad_norm(&o));
	bk_adamw_zero_grad(&o);
	CHECK(g[0] == 0 && g[1] == 0 && g[2] == 0, "zero_grad");
	/* state hooks: find by name, arrays are the live moments */
	g[0] = 1;
	bk_adamw_step(&o, 0.1);
	bk_adamw_group *ga = bk_adamw_find(&o, "a");
	CHECK(ga && ga->n == 3 && fabsf(ga->m[0] - 0.1f) < 1e-7 && o.step == 1, "state of 'a'");
	CHECK(fabsf(p[0] + 0.1f) < 1e-6, "first Adam step moves by lr: %g", p[0]);
	CHECK(bk_adamw_find(&o, "c") == NULL, "found a group never added");
	bk_adamw_free(&o);
}

/* LoRA init: bounds, B = 0, determinism per (seed, layer, module). */
static void test_lora_init(void)
{
	enum { R = 8, IN = 64, OUT = 48 };
	static float a1[R * IN], a2[R * IN], a3[R * IN], a4[R * IN], a5[R * IN], b[OUT * R];
	for (int i = 0; i < OUT * R; i++)
		b[i] = 1;
	bk_lora_init(a1, b, R, IN, OUT, 42, 3, "q_proj");
	bk_lora_init(a2, b, R, IN, OUT, 42, 3, "q_proj");
	bk_lora_init(a3, b, R, IN, OUT, 42, 4, "q_proj");
	bk_lora_init(a4, b, R, IN, OUT, 42, 3, "k_proj");
	bk_lora_init(a5, b, R, IN, OUT, 43, 3, "q_proj");
	float bound = 1.0f / sqrtf((float)IN), amax = 0;
	double mean = 0, var = 0;
	int inb = 1, bzero = 1;
	for (int i = 0; i < R * IN; i++) {
		inb &= fabsf(a1[i]) <= bound;
		amax = fmaxf(amax, fabsf(a1[i]));
		mean += a1[i];
		var += (double)a1[i] * a1[i];
	}
	mean /= R * IN, var /= R * IN;
	for (int i = 0; i < OUT * R; i++)
		bzero &= b[i] == 0;
	CHECK(inb && amax > 0.95f * bound, "A not in U(-%g, %g): max |a| %g", bound, bound, amax);
	/* U(-b, b): mean 0, variance b^2/3 (512 samples) */
	CHECK(fabs(mean) < 0.1 * bound && fabs(var / (bound * bound / 3) - 1) < 0.15,
	      "A mean %g variance %g (want %g)", mean, var, bound * bound / 3);
	CHECK(bzero, "B is not zero");
	CHECK(memcmp(a1, a2, sizeof(a1)) == 0, "same seed, layer, module: different A");
	CHECK(memcmp(a1, a3, sizeof(a1)) != 0, "different layer: same A");
	CHECK(memcmp(a1, a4, sizeof(a1)) != 0, "different module: same A");
	CHECK(memcmp(a1, a5, sizeof(a1)) != 0, "different seed: same A");
}

int main(void)
{
	bk_diag_init("test_optim");
	test_golden();
	test_schedules();
	test_grads();
	test_lora_init();
	return bk_test_done("test_optim");
}
