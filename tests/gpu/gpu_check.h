/* gpu_check.h - helpers of the GPU checks, header-only (static inline), so that
 * each check is one translation unit and an unused helper costs nothing:
 *   - error maxima (C and C++): the check programs of tests/gpu/ and the kernel tests
 *     of tests/emu/ (C++, on the emulated GPU);
 *   - fenced device buffers and (bf16-exact) random inputs (C only: an op table, the
 *     project's rng): the GPU check programs.
 * Not a test framework: each program prints its own lines and counts its failures. */
#ifndef BK_GPU_CHECK_H
#define BK_GPU_CHECK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* max |x_i| */
static inline double gc_maxabs(const float *x, size_t n)
{
	double m = 0;
	for (size_t i = 0; i < n; i++)
		m = fabs(x[i]) > m ? fabs(x[i]) : m;
	return m;
}

/* the largest Euclidean norm of the rows of D values of x [rows,D] */
static inline double gc_maxnorm(const float *x, size_t rows, int D)
{
	double m = 0;
	for (size_t r = 0; r < rows; r++) {
		double s = 0;
		for (int d = 0; d < D; d++)
			s += (double)x[r * D + d] * x[r * D + d];
		m = s > m ? s : m;
	}
	return sqrt(m);
}

/* max|a-b| / max(max|b|, floor); absolute (max|a-b|) when floor < 0; INFINITY when an
 * a_i, a b_i or a difference is NaN (NaN never passes) */
static inline double gc_relerr(const float *a, const float *b, size_t n, double floor)
{
	double md = 0, mb = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)a[i] - b[i]);
		if (isnan(a[i]) || isnan(b[i]) || isnan(d))
			return INFINITY;
		md = d > md ? d : md;
		mb = fabs(b[i]) > mb ? fabs(b[i]) : mb;
	}
	return floor < 0 ? md : md / (mb > floor ? mb : floor);
}

/* max |got_i - want_i|; INFINITY when a got_i or a difference is NaN (NaN never passes) */
static inline double gc_maxerr(const float *got, const float *want, size_t n)
{
	double err = 0;
	for (size_t i = 0; i < n; i++) {
		double d = fabs((double)got[i] - want[i]);
		if (isnan(got[i]) || isnan(d))
			return INFINITY;
		err = d > err ? d : err;
	}
	return err;
}

#ifndef __cplusplus
#include "common/diag.h"
#include "common/rng.h"
#include "formats/safetensors.h"
#include "gpu/ops.h"

#define GC_PAD 16               /* sentinel floats on each side of a device buffer */
#define GC_SENTINEL 12345.625f

/* uniform in [-scale, scale) */
static inline float *gc_rand(bk_rng *rng, size_t n, float scale)
{
	float *x = xmalloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = scale * (float)(2 * bk_rng_uniform(rng) - 1);
	return x;
}

/* nearest bf16, ties to even (__float2bfloat16_rn, the device's weight upload) */
static inline float gc_bf16(float f) { return bk_bf16_to_f32(bk_f32_to_bf16(f)); }

/* uniform in [-scale, scale), rounded to bf16 (the same draws as gc_rand) */
static inline float *gc_rand_bf16(bk_rng *rng, size_t n, float scale)
{
	float *x = gc_rand(rng, n, scale);
	for (size_t i = 0; i < n; i++)
		x[i] = gc_bf16(x[i]);
	return x;
}

/* a copy of h [n] in o's memory, fenced by GC_PAD sentinels each side; h NULL: NaN */
static inline float *gc_put(const bk_ops *o, const float *h, size_t n)
{
	float *tmp = xmalloc((n + 2 * GC_PAD) * sizeof(float));
	for (size_t i = 0; i < GC_PAD; i++)
		tmp[i] = tmp[n + GC_PAD + i] = GC_SENTINEL;
	for (size_t i = 0; i < n; i++)
		tmp[GC_PAD + i] = h ? h[i] : NAN;
	float *d = o->alloc((n + 2 * GC_PAD) * sizeof(float));
	o->upload(d, tmp, (n + 2 * GC_PAD) * sizeof(float));
	free(tmp);
	return d + GC_PAD;
}

/* h [n] = d [n] of gc_put; returns the number of damaged sentinels */
static inline int gc_get(const bk_ops *o, float *h, const float *d, size_t n)
{
	float *tmp = xmalloc((n + 2 * GC_PAD) * sizeof(float));
	o->download(tmp, d - GC_PAD, (n + 2 * GC_PAD) * sizeof(float));
	int bad = 0;
	for (size_t i = 0; i < GC_PAD; i++)
		bad += tmp[i] != GC_SENTINEL || tmp[n + GC_PAD + i] != GC_SENTINEL;
	memcpy(h, tmp + GC_PAD, n * sizeof(float));
	free(tmp);
	return bad;
}

/* frees a gc_put buffer (NULL is fine) */
static inline void gc_drop(const bk_ops *o, float *d)
{
	if (d)
		o->free(d - GC_PAD);
}

/* a copy of h [bytes] in o's memory (no fence) */
static inline void *gc_dup(const bk_ops *o, const void *h, size_t bytes)
{
	void *d = o->alloc(bytes ? bytes : 1);
	o->upload(d, h, bytes);
	return d;
}

/* a copy of h [n] int32 in o's memory (no fence) */
static inline int32_t *gc_put_i(const bk_ops *o, const int32_t *h, size_t n)
{
	return gc_dup(o, h, n * sizeof(int32_t));
}
#endif /* !__cplusplus */

#endif
