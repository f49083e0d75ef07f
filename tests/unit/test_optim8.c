/* test_optim8.c - the optimizer ops of the host twin and 8-bit AdamW (gpu/optim8.h):
 * (a) the dynamic maps: 256 sorted codes whose spot values are bitsandbytes'
 *     create_dynamic_map bit for bit (hex floats printed by torch 2.x);
 * (b) encoding takes the nearest code (brute force over the map) with the sign rule;
 *     block-wise quantise + dequantise of heavy-tailed values (blocks 256 and 2048, odd
 *     lengths) errs per value by at most half the gap between the two codes around
 *     value/absmax, times absmax (at worst 0.00704 absmax: the largest half gap, or
 *     -1 to the lowest signed code -0.99297);
 * (c) ops->adamw_step equals bk_adamw_step (gpu/optim.c, the torch-golden AdamW) bit for
 *     bit over 6 steps with and without weight decay; ops->scale equals
 *     bk_adamw_scale_grad; ops->grad_sumsq equals the 64K-block fixed-order sum bit for
 *     bit and a long double sum to 1e-12;
 * (d) ops->adamw8_step equals a naive composition (bk_q8_dequantize, bk_adamw_elem,
 *     bk_q8_quantize) bit for bit over 5 steps; its first step equals fp32 AdamW's;
 * (e) 200 steps on a noisy ill-conditioned quadratic (n = 5003, curvatures 0.01..10,
 *     gradient noise +-0.2): 8-bit AdamW tracks fp32 AdamW: the loss curves differ by
 *     < 1% of the initial loss at every step (measured 0.3%), and the final parameters
 *     by < 4% of the distance fp32 AdamW travelled in the problem's norm (measured
 *     1.7%; the flat, noise-driven directions differ more in plain L2: about 11%);
 * (f) the trainer with --optim adamw8bit on models/stories260K: a 20-step bake ends
 *     within 15% of adamw's final loss (both < half the first), and save after 3 steps
 *     + resume + 2 steps equals 5 uninterrupted steps bit for bit (adapter and 8-bit
 *     state), also with 2048-value blocks. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "common/rng.h"
#include "gpu/load.h"
#include "gpu/optim.h"
#include "gpu/optim8.h"
#include "gpu/train.h"
#include "tests/harness.h"

static const bk_ops *ops = &bk_ops_host;
static bk_rng rng;

static float urand(float lo, float hi) { return lo + (hi - lo) * (float)bk_rng_uniform(&rng); }

/* sign * 10^U(-9, 0) * scale: values over nine decades, like Adam moments */
static float heavy(float scale)
{
	float x = (float)pow(10.0, -9.0 * bk_rng_uniform(&rng)) * scale;
	return bk_rng_uniform(&rng) < 0.5 ? -x : x;
}

/* ---- (a) ---- */

static void test_maps(void)
{
	static const struct { int i; double v; } s_want[] = {
		{0, -0x1.fc6666p-1}, {1, -0x1.f53334p-1}, {2, -0x1.eep-1}, {31, -0x1.1d3334p-1},
		{64, -0x1.93d70ap-4}, {100, -0x1.e978d4p-8}, {126, -0x1.27476ep-21}, {127, 0},
		{128, 0x1.27476ep-21}, {129, 0x1.b43528p-19}, {160, 0x1.d1eb86p-7},
		{200, 0x1.de6666p-3}, {253, 0x1.f53334p-1}, {254, 0x1.fc6666p-1}, {255, 1},
	}, u_want[] = {
		{0, 0}, {1, 0x1.5cf754p-22}, {2, 0x1.a01330p-21}, {31, 0x1.2b020cp-10},
		{64, 0x1.8ccccep-7}, {100, 0x1.00f5c4p-4}, {126, 0x1.96b852p-4}, {127, 0x1.a8p-4},
		{128, 0x1.c4ccccp-4}, {129, 0x1.e1999ap-4}, {160, 0x1.579998p-2},
		{200, 0x1.3bccccp-1}, {253, 0x1.fa9998p-1}, {254, 0x1.fe3334p-1}, {255, 1},
	};
	for (int sg = 0; sg < 2; sg++) {
		const float *m = bk_q8_map(sg);
		int sorted = 1, neg = 0;
		for (int i = 0; i < 256; i++) {
			if (i && !(m[i] > m[i - 1]))
				sorted = 0;
			neg += m[i] < 0;
		}
		CHECK(sorted, "map %d: strictly ascending", sg);
		CHECK(neg == (sg ? 127 : 0), "map %d: %d negative codes", sg, neg);
		for (int k = 0; k < 15; k++) {
			int i = sg ? s_want[k].i : u_want[k].i;
			double w = sg ? s_want[k].v : u_want[k].v;
			CHECK(m[i] == (float)w, "map %d code %d: %a, bitsandbytes %a", sg, i,
			      (double)m[i], w);
		}
	}
}

/* ---- (b) ---- */

static void test_encode(void)
{
	for (int sg = 0; sg < 2; sg++) {
		const float *m = bk_q8_map(sg);
		int bad = 0;
		for (int t = 0; t < 20000; t++) {
			float x = t < 10000 ? urand(sg ? -1 : 0, 1) : fabsf(heavy(1)) * (sg && t % 2 ? -1 : 1);
			int c = bk_q8_encode(m, sg, x), best = 0;
			for (int j = 1; j < 256; j++)
				if (fabsf(m[j] - x) < fabsf(m[best] - x))
					best = j;
			/* the sign rule moves a negative x that rounds to 0 one code down */
			int want = best;
			if (sg && x < 0 && m[best] == 0)
				want = best - 1;
			if (c != want && fabsf(m[c] - x) != fabsf(m[want] - x))
				bad++;
		}
		CHECK(bad == 0, "map %d: %d of 20000 encodings are not the nearest code", sg, bad);
	}
	CHECK(bk_q8_encode(bk_q8_map(1), 1, -1e-12f) == 126, "tiny negative m keeps its sign");
	CHECK(bk_q8_encode(bk_q8_map(1), 1, 1e-12f) == 127, "tiny positive m rounds to 0");
	CHECK(bk_q8_encode(bk_q8_map(1), 1, 0.0f) == 127 && bk_q8_encode(bk_q8_map(0), 0, 0.0f) == 0,
	      "zero encodes as the zero code");

	/* the worst error per absmax: the largest half gap of the signed map, or the
	 * distance from -1 to its lowest code (the bound stated in the header) */
	const float *ms = bk_q8_map(1);
	double half_gap = 1.0 + ms[0];
	for (int j = 1; j < 256; j++)
		half_gap = fmax(half_gap, (ms[j] - ms[j - 1]) / 2.0);
	CHECK(half_gap < 0.00704, "worst quantisation error %g absmax", half_gap);

	int blocks[2] = {256, 2048};
	size_t lens[3] = {1, 2048 * 3 + 77, 256 * 5 - 1};
	for (int bi = 0; bi < 2; bi++)
		for (int li = 0; li < 3; li++)
			for (int sg = 0; sg < 2; sg++) {
				size_t n = lens[li], nb = bk_q8_blocks(n, blocks[bi]);
				const float *m = bk_q8_map(sg);
				float *x = xmalloc(n * 4), *y = xmalloc(n * 4), *am = xmalloc(nb * 4);
				uint8_t *q = xmalloc(n);
				for (size_t i = 0; i < n; i++) {
					/* each block gets its own scale; one all-zero block */
					float sc = (float)pow(10.0, (double)(i / blocks[bi] % 7) - 3);
					x[i] = i / blocks[bi] == 1 ? 0 : sg ? heavy(sc) : fabsf(heavy(sc));
				}
				bk_q8_quantize(x, n, blocks[bi], sg, q, am);
				bk_q8_dequantize(q, am, n, blocks[bi], sg, y);
				double worst = 0, worst_abs = 0; /* err / allowed, err / absmax */
				int nan = 0;
				for (size_t i = 0; i < n; i++) {
					float a = am[i / blocks[bi]], r = a > 0 ? x[i] / a : 0;
					int lo = 0;
					while (lo < 254 && m[lo + 1] <= r)
						lo++;
					double allowed = (m[lo + 1] - m[lo]) / 2.0 * a;
					if (r < m[0]) /* -1 <= r < -0.99297: the lowest code */
						allowed = (1.0 + m[0]) * a;
					if (sg && r < 0 && r > m[126]) /* the sign rule: up to |m[126]| */
						allowed = -m[126] * (double)a;
					double err = fabs((double)y[i] - x[i]);
					nan += isnan(y[i]);
					/* + the rounding of map[c] * absmax to float */
					allowed += 6e-8 * a;
					worst = fmax(worst, allowed > 0 ? err / allowed : err > 0);
					if (a > 0)
						worst_abs = fmax(worst_abs, err / a);
				}
				CHECK(!nan && worst <= 1, "block %d n %zu map %d: error %.3g of the half "
				      "gap around the value", blocks[bi], n, sg, worst);
				CHECK(worst_abs <= half_gap + 6e-8, "block %d n %zu map %d: error "
				      "%.3g absmax", blocks[bi], n, sg, worst_abs);
				if (n > (size_t)blocks[bi])
					CHECK(am[1] == 0 && y[blocks[bi]] == 0, "an all-zero block stays zero");
				free(x), free(y), free(am), free(q);
			}
}

/* ---- (c) ---- */

static void test_fp32_ops(void)
{
	size_t n = 65536 * 2 + 1234; /* over the parallel threshold, two sum blocks + tail */
	for (int wdi = 0; wdi < 2; wdi++) {
		double wd = wdi ? 0.01 : 0;
		float *p0 = xmalloc(n * 4), *p1 = xmalloc(n * 4), *g = xmalloc(n * 4);
		float *m = xcalloc(n, 4), *v = xcalloc(n, 4);
		for (size_t i = 0; i < n; i++)
			p0[i] = p1[i] = urand(-1, 1);
		bk_adamw o;
		bk_adamw_init(&o, 0.9, 0.999, 1e-8, wd);
		bk_adamw_add(&o, "p", p0, g, n);
		for (int t = 0; t < 6; t++) {
			for (size_t i = 0; i < n; i++)
				g[i] = heavy(0.1f);
			double lr = 1e-3 * (t + 1);
			bk_adamw_step(&o, lr);
			ops->adamw_step(p1, g, m, v, n, lr, 0.9, 0.999, 1e-8, wd, t + 1);
		}
		CHECK(!memcmp(p0, p1, n * 4) && !memcmp(o.groups[0].m, m, n * 4) &&
		      !memcmp(o.groups[0].v, v, n * 4),
		      "wd %g: ops->adamw_step equals bk_adamw_step bit for bit", wd);
		bk_adamw_free(&o);
		free(p0), free(p1), free(g), free(m), free(v);
	}

	float *g = xmalloc(n * 4), *h = xmalloc(n * 4);
	for (size_t i = 0; i < n; i++)
		g[i] = h[i] = heavy(3);
	/* the fixed order: 65536-value blocks, each in order, then the block sums */
	double want = 0;
	long double ld = 0;
	for (size_t b0 = 0; b0 < n; b0 += 65536) {
		double acc = 0;
		for (size_t i = b0; i < n && i < b0 + 65536; i++)
			acc += (double)g[i] * g[i];
		want += acc;
	}
	for (size_t i = 0; i < n; i++)
		ld += (long double)g[i] * g[i];
	double got = ops->grad_sumsq(g, n);
	CHECK(got == want, "grad_sumsq %.17g, fixed-order sum %.17g", got, want);
	CHECK(bk_relerr(got, (double)ld, 0) < 1e-12, "grad_sumsq vs long double: %g",
	      bk_relerr(got, (double)ld, 0));
	CHECK(ops->grad_sumsq(g, 0) == 0, "empty sum");

	bk_adamw o;
	bk_adamw_init(&o, 0.9, 0.999, 1e-8, 0);
	bk_adamw_add(&o, "g", h, h, n);
	bk_adamw_scale_grad(&o, 1.0 / 3);
	ops->scale(g, 1.0 / 3, n);
	CHECK(!memcmp(g, h, n * 4), "ops->scale equals bk_adamw_scale_grad bit for bit");
	bk_adamw_free(&o);
	free(g), free(h);
}

/* ---- (d) ---- */

static void test_adamw8_ops(void)
{
	int blocks[2] = {256, 2048};
	for (int bi = 0; bi < 2; bi++) {
		int B = blocks[bi];
		size_t n = (size_t)B * 3 + 101, nb = bk_q8_blocks(n, B);
		float *p = xmalloc(n * 4), *pr = xmalloc(n * 4), *g = xmalloc(n * 4);
		float *m = xmalloc(n * 4), *v = xmalloc(n * 4), *p32 = xmalloc(n * 4);
		float *m32 = xcalloc(n, 4), *v32 = xcalloc(n, 4);
		uint8_t *qm = xcalloc(n, 1), *qv = xcalloc(n, 1), *rqm = xcalloc(n, 1),
			*rqv = xcalloc(n, 1);
		float *am = xcalloc(nb, 4), *av = xcalloc(nb, 4), *ram = xcalloc(nb, 4),
		      *rav = xcalloc(nb, 4);
		for (size_t i = 0; i < n; i++)
			p[i] = pr[i] = p32[i] = urand(-1, 1);
		int same = 1;
		for (int t = 1; t <= 5; t++) {
			for (size_t i = 0; i < n; i++)
				g[i] = heavy(0.05f) * (float)(1 + i / B); /* blocks of other scales */
			double lr = 2e-3, wd = t % 2 ? 0.01 : 0;
			ops->adamw8_step(p, g, qm, qv, am, av, n, B, lr, 0.9, 0.999, 1e-8, wd, t);
			/* naive: dequantise, fp32 AdamW per element, quantise */
			bk_q8_dequantize(rqm, ram, n, B, 1, m);
			bk_q8_dequantize(rqv, rav, n, B, 0, v);
			bk_adamw_scalars s;
			bk_adamw_scalars_make(&s, lr, 0.9, 0.999, 1e-8, wd, t);
			for (size_t i = 0; i < n; i++)
				bk_adamw_elem(&s, &pr[i], &m[i], &v[i], g[i]);
			bk_q8_quantize(m, n, B, 1, rqm, ram);
			bk_q8_quantize(v, n, B, 0, rqv, rav);
			same &= !memcmp(p, pr, n * 4) && !memcmp(qm, rqm, n) && !memcmp(qv, rqv, n) &&
				!memcmp(am, ram, nb * 4) && !memcmp(av, rav, nb * 4);
			if (t == 1) {
				ops->adamw_step(p32, g, m32, v32, n, lr, 0.9, 0.999, 1e-8, wd, 1);
				CHECK(!memcmp(p, p32, n * 4), "block %d: the first 8-bit step is fp32 "
				      "AdamW's (zero state is exact)", B);
			}
		}
		CHECK(same, "block %d: ops->adamw8_step equals dequantise + AdamW + quantise bit "
		      "for bit", B);
		free(p), free(pr), free(g), free(m), free(v), free(p32), free(m32), free(v32);
		free(qm), free(qv), free(rqm), free(rqv), free(am), free(av), free(ram), free(rav);
	}
}

/* ---- (e) ---- */

static void test_quadratic(void)
{
	const size_t n = 5003;
	const int steps = 200;
	float *h = xmalloc(n * 4), *c = xmalloc(n * 4), *x32 = xcalloc(n, 4), *x8 = xcalloc(n, 4);
	float *g32 = xmalloc(n * 4), *g8 = xmalloc(n * 4), *noise = xmalloc(n * 4);
	float *m = xcalloc(n, 4), *v = xcalloc(n, 4), *am = xcalloc(bk_q8_blocks(n, 256), 4);
	float *av = xcalloc(bk_q8_blocks(n, 256), 4);
	uint8_t *qm = xcalloc(n, 1), *qv = xcalloc(n, 1);
	for (size_t i = 0; i < n; i++) {
		h[i] = (float)pow(10.0, urand(-2, 1)); /* condition number 1000 */
		c[i] = urand(-1, 1);
	}
	double loss0 = 0, worst = 0, l32 = 0, l8 = 0;
	for (size_t i = 0; i < n; i++)
		loss0 += 0.5 * h[i] * c[i] * c[i];
	for (int t = 1; t <= steps; t++) {
		for (size_t i = 0; i < n; i++) {
			noise[i] = 0.2f * urand(-1, 1);
			g32[i] = h[i] * (x32[i] - c[i]) + noise[i];
			g8[i] = h[i] * (x8[i] - c[i]) + noise[i];
		}
		ops->adamw_step(x32, g32, m, v, n, 1e-2, 0.9, 0.999, 1e-8, 0.01, t);
		ops->adamw8_step(x8, g8, qm, qv, am, av, n, 256, 1e-2, 0.9, 0.999, 1e-8, 0.01, t);
		l32 = l8 = 0;
		for (size_t i = 0; i < n; i++) {
			l32 += 0.5 * h[i] * (x32[i] - c[i]) * (x32[i] - c[i]);
			l8 += 0.5 * h[i] * (x8[i] - c[i]) * (x8[i] - c[i]);
		}
		worst = fmax(worst, fabs(l8 - l32) / loss0);
	}
	/* distances in the norm of the problem (|z|_h^2 = sum h z^2) and plain L2 */
	double e = 0, etr = 0, d = 0, travel = 0;
	for (size_t i = 0; i < n; i++) {
		double z = (double)x8[i] - x32[i];
		e += h[i] * z * z;
		etr += h[i] * (double)x32[i] * x32[i];
		d += z * z;
		travel += (double)x32[i] * x32[i];
	}
	e = sqrt(e / etr), d = sqrt(d / travel);
	fprintf(stderr, "quadratic, %d steps: loss %.5g -> fp32 %.5g, 8-bit %.5g; max |loss "
		"difference| %.3g%% of the initial loss; final |x8 - x32|_h / |x32 - x0|_h %.3g%% "
		"(plain L2 %.3g%%, noise-driven flat directions)\n", steps, loss0, l32, l8,
		100 * worst, 100 * e, 100 * d);
	CHECK(l32 < 0.01 * loss0 && l8 < 0.01 * loss0, "both converge (%g -> %g, %g)", loss0,
	      l32, l8);
	CHECK(worst < 0.01, "8-bit loss curve within 1%% of the initial loss of fp32's: %g", worst);
	CHECK(e < 0.04, "8-bit final parameters within 4%% of fp32's travel (h-norm): %g", e);
	free(h), free(c), free(x32), free(x8), free(g32), free(g8), free(noise), free(m), free(v);
	free(am), free(av), free(qm), free(qv);
}

/* ---- (f) ---- */

static bk_loaded_model lm;

typedef struct {
	int32_t s[16], t[40], r[16];
	int ns, nt, nr;
} seq;

static void make_seq(seq *q, const int32_t *sys, int nsys, int nuser, int nresp)
{
	q->s[0] = q->t[0] = 1;
	for (int i = 0; i < nuser; i++)
		q->s[1 + i] = q->t[1 + nsys + i] = 3 + (int32_t)bk_rng_below(&rng, 500);
	memcpy(q->t + 1, sys, (size_t)nsys * 4);
	q->ns = 1 + nuser;
	q->nt = 1 + nsys + nuser;
	for (int i = 0; i < nresp; i++)
		q->r[i] = 3 + (int32_t)bk_rng_below(&rng, 500);
	q->nr = nresp;
}

static bk_train_opts opts8(bk_optim_kind kind, int block)
{
	return (bk_train_opts){.r = 8, .alpha = 16, .dropout = 0.05f, .targets = BK_LORA_ALL,
			       .lr = 2e-3, .max_grad_norm = 1.0, .weight_decay = 0.01,
			       .sched = BK_SCHED_CONSTANT, .temperature = 1, .seed = 3,
			       .vocab_chunk = 128, .optim = kind, .optim_block = block};
}

static void train_steps(bk_trainer *t, const bk_train_sample *s, int n, int steps,
			double *first, double *last)
{
	for (int k = 0; k < steps; k++) {
		bk_train_micro_info info;
		bk_trainer_micro(t, s, n, &info);
		bk_trainer_step(t, NULL);
		if (first && t->step == 1)
			*first = info.loss;
		if (last)
			*last = info.loss;
	}
}

static void test_trainer(void)
{
	const bk_model *M = lm.model;
	int32_t sys[8] = {301, 427, 295, 433, 422, 265, 279, 420};
	seq q[4];
	bk_train_sample s[4];
	for (int i = 0; i < 4; i++) {
		make_seq(&q[i], sys, 8, 3 + i, 6);
		s[i] = (bk_train_sample){q[i].s, q[i].t, q[i].r, q[i].ns, q[i].nt, q[i].nr, NULL};
	}
	/* a 20-step bake with each optimizer */
	double f32 = 0, l32 = 0, f8 = 0, l8 = 0;
	bk_train_opts o = opts8(BK_OPTIM_ADAMW, 0);
	bk_trainer *a = bk_trainer_create(M, &o);
	train_steps(a, s, 4, 20, &f32, &l32);
	o = opts8(BK_OPTIM_ADAMW8BIT, 0);
	bk_trainer *b = bk_trainer_create(M, &o);
	train_steps(b, s, 4, 20, &f8, &l8);
	fprintf(stderr, "stories260K bake, 20 steps: adamw %.5f -> %.5f, adamw8bit %.5f -> %.5f\n",
		f32, l32, f8, l8);
	CHECK(f8 == f32, "the first loss does not depend on the optimizer");
	CHECK(l32 < 0.5 * f32 && l8 < 0.5 * f8, "both bakes halve the loss");
	CHECK(fabs(l8 - l32) < 0.15 * l32, "8-bit final loss %g within 15%% of fp32's %g", l8, l32);
	CHECK(b->opt.n_blocks > 0 && b->opt.qm && !b->opt.m, "8-bit state allocated, no fp32 one");
	bk_trainer_free(a);
	bk_trainer_free(b);

	/* save after 3 steps, resume, 2 more = 5 uninterrupted, for both block sizes */
	char dir[] = "/tmp/bk-test-optim8.XXXXXX";
	if (!mkdtemp(dir))
		die("mkdtemp: failed");
	for (int bi = 0; bi < 2; bi++) {
		o = opts8(BK_OPTIM_ADAMW8BIT, bi ? 2048 : 256);
		char *ck = bk_path_join(dir, bi ? "ck2048" : "ck256");
		bk_train_setting set[1] = {{"lr", "0.002"}};
		bk_train_progress p = {.epoch = 0, .records = 12, .order_seed = 5}, p2;
		bk_trainer *x = bk_trainer_create(M, &o), *y = bk_trainer_create(M, &o);
		train_steps(x, s, 4, 3, NULL, NULL);
		bk_trainer_save(x, lm.cfg, "models/stories260K", &p, set, 1, ck);
		bk_trainer_resume(y, lm.cfg, ck, &p2, set, 1);
		CHECK(y->step == 3 && y->opt.step == 3, "resumed at step %lld/%lld",
		      (long long)y->step, (long long)y->opt.step);
		size_t n = x->lora->n_flat, nb = x->opt.n_blocks;
		CHECK(!memcmp(x->opt.qm, y->opt.qm, n) && !memcmp(x->opt.qv, y->opt.qv, n) &&
		      !memcmp(x->opt.am, y->opt.am, nb * 4) && !memcmp(x->opt.av, y->opt.av, nb * 4),
		      "block %d: the 8-bit state round-trips bit for bit", o.optim_block);
		train_steps(x, s, 4, 2, NULL, NULL);
		train_steps(y, s, 4, 2, NULL, NULL);
		CHECK(!memcmp(x->lora->flat, y->lora->flat, n * 4) && !memcmp(x->opt.qm, y->opt.qm, n) &&
		      !memcmp(x->opt.am, y->opt.am, nb * 4),
		      "block %d: resumed run equals the uninterrupted one bit for bit", o.optim_block);
		int nz = 0;
		for (size_t i = 0; i < nb; i++)
			nz += x->opt.am[i] > 0;
		CHECK(nz == (int)nb, "every block has a nonzero first moment (%d of %zu)", nz, nb);
		bk_trainer_free(x);
		bk_trainer_free(y);
		free(ck);
	}
	char *cmd = xasprintf("rm -rf '%s'", dir);
	CHECK(system(cmd) == 0, "cleanup");
	free(cmd);
}

int main(void)
{
	bk_diag_init("test_optim8");
	bk_rng_seed(&rng, 8);
	test_maps();
	test_encode();
	test_fp32_ops();
	test_adamw8_ops();
	test_quadratic();
	lm = bk_model_load(&bk_ops_host, "models/stories260K");
	test_trainer();
	bk_model_unload(&lm);
	return bk_test_done("test_optim8");
}
