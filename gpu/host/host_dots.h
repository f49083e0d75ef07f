/* host_dots.h - the host twin's attention scores, shared by the packed attention of
 * gpu/host/host_ops.c (forward and backward) and the decode attention of
 * gpu/host/host_decode.c: a score is dot(q, k) summed in order of d in one float chain
 * per key; dots() runs KB keys' chains side by side (independent sums, so the same bits
 * as dotf() one key at a time, several times the speed).  Private to those two files. */
#ifndef BK_HOST_DOTS_H
#define BK_HOST_DOTS_H

#include <string.h>

enum { KB = 8 }; /* keys a dots() call scores at the most */

/* sum_i a[i] b[i] in order of i */
static inline float dotf(const float *a, const float *b, int n)
{
	float s = 0;
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* s[i] = dotf(q, k[i], D) for the n <= KB keys k[i] */
static inline void dots(float *s, const float *q, const float *const *k, int n, int D)
{
	float a[KB] = { 0 };
	if (n == KB) {
		for (int d = 0; d < D; d++) {
			float qd = q[d];
#pragma GCC unroll 8
			for (int i = 0; i < KB; i++)
				a[i] += qd * k[i][d];
		}
	} else {
		for (int i = 0; i < n; i++)
			a[i] = dotf(q, k[i], D);
	}
	memcpy(s, a, (size_t)n * sizeof(float));
}

#endif
