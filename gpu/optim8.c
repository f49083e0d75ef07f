/* optim8.c - AdamW scalars, the bitsandbytes dynamic map, block-wise 8-bit
 * quantisation and the host twin of the 8-bit AdamW update (see optim8.h).
 * Not a CUDA kernel and not the fp32 AdamW loop (host_ops.c, gpu/optim.c). */
#include "gpu/optim8.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"

static const char *optim_names[] = {
	[BK_OPTIM_ADAMW] = "adamw",
	[BK_OPTIM_ADAMW8BIT] = "adamw8bit",
};

int bk_optim_parse(const char *name, bk_optim_kind *kind)
{
	for (int i = 0; i < (int)(sizeof(optim_names) / sizeof(optim_names[0])); i++)
		if (!strcmp(name, optim_names[i])) {
			*kind = (bk_optim_kind)i;
			return 0;
		}
	return -1;
}

const char *bk_optim_name(bk_optim_kind kind)
{
	if ((unsigned)kind >= sizeof(optim_names) / sizeof(optim_names[0]))
		BUG("optimizer kind %d", (int)kind);
	return optim_names[kind];
}

void bk_adamw_scalars_make(bk_adamw_scalars *s, double lr, double beta1, double beta2,
			   double eps, double weight_decay, int64_t step)
{
	BUG_ON(step < 1);
	double bc1 = 1 - pow(beta1, (double)step);
	double bc2_sqrt = sqrt(1 - pow(beta2, (double)step));
	s->decay = (float)(1 - lr * weight_decay);
	s->w1 = (float)(1 - beta1);
	s->b2 = (float)beta2;
	s->w2 = (float)(1 - beta2);
	s->neg_step = (float)(-(lr / bc1));
	s->bc2s = (float)bc2_sqrt;
	s->eps = (float)eps;
	s->do_decay = weight_decay != 0;
}

/* ---- the dynamic map ---- */

static float map_signed[256], map_unsigned[256];
static pthread_once_t map_once = PTHREAD_ONCE_INIT;

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

/* create_dynamic_map(signed, max_exponent_bits = 7, total_bits = 8) of bitsandbytes,
 * in float32 as torch evaluates it, so the codes are its bits: linspace(0.1, 1, k + 1)
 * as torch's CPU kernel computes it (step = (1 - 0.1) / k; entry i < (k+1)/2 is
 * fma(step, i, 0.1), the others fma(-step, k - i, 1)), midpoints (b[j] + b[j+1]) / 2,
 * each times (float)10^(e-6) */
static void make_map(float *out, int is_signed)
{
	int n = 0;
	for (int e = 0; e < 7; e++) {
		int k = is_signed ? 1 << e : 1 << (e + 1); /* intervals of the decade */
		int steps = k + 1, half = steps / 2;
		float start = 0.1f, end = 1.0f, step = (end - start) / (float)(steps - 1);
		float scale = (float)pow(10.0, (double)(e - 6)), b[130];
		for (int i = 0; i < steps; i++)
			b[i] = i < half ? fmaf(step, (float)i, start)
					: fmaf(-step, (float)(steps - i - 1), end);
		for (int j = 0; j < k; j++) {
			float mid = scale * ((b[j] + b[j + 1]) / 2.0f);
			out[n++] = mid;
			if (is_signed)
				out[n++] = -mid;
		}
	}
	out[n++] = 0.0f;
	out[n++] = 1.0f;
	if (n != 256)
		BUG("dynamic map has %d codes", n);
	qsort(out, 256, sizeof(float), cmp_float);
}

static void make_maps(void)
{
	make_map(map_signed, 1);
	make_map(map_unsigned, 0);
}

const float *bk_q8_map(int is_signed)
{
	pthread_once(&map_once, make_maps);
	return is_signed ? map_signed : map_unsigned;
}

uint8_t bk_q8_encode(const float *map, int is_signed, float x)
{
	int lo = 0, hi = 255;
	if (x <= map[0])
		return 0;
	if (x >= map[255])
		return 255;
	while (hi - lo > 1) { /* map[lo] <= x < map[hi] */
		int mid = (lo + hi) / 2;
		if (map[mid] <= x)
			lo = mid;
		else
			hi = mid;
	}
	int c = x - map[lo] <= map[hi] - x ? lo : hi;
	if (is_signed && x != 0 && signbit(map[c]) != signbit(x))
		c += x > 0 ? 1 : -1;
	return (uint8_t)c;
}

size_t bk_q8_blocks(size_t n, int block)
{
	if (block != 256 && block != 2048)
		BUG("8-bit block of %d values (256 or 2048)", block);
	return (n + (size_t)block - 1) / (size_t)block;
}

/* x / absmax, 0 for an all-zero block */
static float normalise(float x, float absmax) { return absmax > 0 ? x / absmax : 0.0f; }

void bk_q8_quantize(const float *x, size_t n, int block, int is_signed, uint8_t *q,
		    float *absmax)
{
	const float *map = bk_q8_map(is_signed);
	size_t nb = bk_q8_blocks(n, block);
	for (size_t b = 0; b < nb; b++) {
		size_t i0 = b * (size_t)block, i1 = i0 + (size_t)block < n ? i0 + (size_t)block : n;
		float a = 0;
		for (size_t i = i0; i < i1; i++)
			a = fmaxf(a, fabsf(x[i]));
		absmax[b] = a;
		for (size_t i = i0; i < i1; i++)
			q[i] = bk_q8_encode(map, is_signed, normalise(x[i], a));
	}
}

void bk_q8_dequantize(const uint8_t *q, const float *absmax, size_t n, int block,
		      int is_signed, float *x)
{
	const float *map = bk_q8_map(is_signed);
	for (size_t i = 0; i < n; i++)
		x[i] = map[q[i]] * absmax[i / (size_t)block];
}

/* ---- 8-bit AdamW ---- */

void bk_adamw8_update(float *param, const float *grad, uint8_t *qm, uint8_t *qv,
		      float *absmax_m, float *absmax_v, size_t n, int block, double lr,
		      double beta1, double beta2, double eps, double weight_decay, int64_t step)
{
	const float *ms = bk_q8_map(1), *mu = bk_q8_map(0);
	bk_adamw_scalars s;
	bk_adamw_scalars_make(&s, lr, beta1, beta2, eps, weight_decay, step);
	ptrdiff_t nb = (ptrdiff_t)bk_q8_blocks(n, block);
#pragma omp parallel for schedule(static) if (nb > 64)
	for (ptrdiff_t b = 0; b < nb; b++) {
		float m[2048], v[2048]; /* the block's fp32 moments */
		size_t i0 = (size_t)b * (size_t)block;
		size_t len = i0 + (size_t)block < n ? (size_t)block : n - i0;
		float am = absmax_m[b], av = absmax_v[b], new_am = 0, new_av = 0;
		for (size_t j = 0; j < len; j++) {
			size_t i = i0 + j;
			m[j] = ms[qm[i]] * am;
			v[j] = mu[qv[i]] * av;
			bk_adamw_elem(&s, &param[i], &m[j], &v[j], grad[i]);
			new_am = fmaxf(new_am, fabsf(m[j]));
			new_av = fmaxf(new_av, v[j]);
		}
		absmax_m[b] = new_am;
		absmax_v[b] = new_av;
		for (size_t j = 0; j < len; j++) {
			qm[i0 + j] = bk_q8_encode(ms, 1, normalise(m[j], new_am));
			qv[i0 + j] = bk_q8_encode(mu, 0, normalise(v[j], new_av));
		}
	}
}
