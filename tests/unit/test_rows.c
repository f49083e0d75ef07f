/* test_rows.c - the row-wise matmul of the host twin's generation and teacher paths
 * (gpu/host/host_decode.c, through bk_gen_ops_host.linear and .lora): every code path
 * this CPU runs (avx512, avx2, sse2: bk_host_rows_isa) gives, bit for bit, the scalar
 * definition written out below (16 lanes in order of k, a multiply then an add, then the
 * pairwise fold) for every shape tried: rows 1..9 and past a row chunk (64), outputs
 * that are and are not multiples of a tile, inputs with and without a tail (K % 16),
 * R = 8 and 16 LoRA products, inputs with zeros, negative zeros and a wide range; a row's
 * outputs are the same bits alone and among 70 rows (threaded); an unknown path name is
 * refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/gen.h"
#include "gpu/host/host_rows.h"
#include "tests/harness.h"

/* the definition: lane j sums x[i] w[i] over i = j mod 16 in order of i, then lanes
 * j + 8 into j, j + 4, j + 2, j + 1 */
static float ref_dot(const float *x, const float *w, int n)
{
	float a[16] = { 0 };
	for (int i = 0; i < n; i++) {
		float p = x[i] * w[i];
		a[i % 16] = a[i % 16] + p;
	}
	for (int h = 8; h > 0; h /= 2)
		for (int j = 0; j < h; j++)
			a[j] = a[j] + a[j + h];
	return a[0];
}

static void ref_matmul(float *y, const float *x, const float *W, int T, int out, int in,
		       float alpha, int acc)
{
	for (int t = 0; t < T; t++)
		for (int o = 0; o < out; o++) {
			float d = ref_dot(x + (size_t)t * in, W + (size_t)o * in, in);
			float *p = y + (size_t)t * out + o;
			*p = acc ? *p + alpha * d : alpha * d;
		}
}

/* uniform values over a wide range, with exact zeros and negative zeros */
static void fill(bk_rng *r, float *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		double u = bk_rng_uniform(r);
		if (u < 0.05)
			p[i] = 0.0f;
		else if (u < 0.1)
			p[i] = -0.0f;
		else
			p[i] = (float)((2 * bk_rng_uniform(r) - 1) * pow(2.0, 8 * bk_rng_uniform(r) - 4));
	}
}

static int same_bits(const float *a, const float *b, size_t n, size_t *at)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp(a + i, b + i, sizeof(float))) {
			*at = i;
			return 0;
		}
	return 1;
}

static void check_linear(bk_rng *r, const char *isa, int T, int out, int in)
{
	float *x = xmalloc((size_t)T * in * sizeof(float));
	float *w = xmalloc((size_t)out * in * sizeof(float));
	float *y = xmalloc((size_t)T * out * sizeof(float));
	float *z = xmalloc((size_t)T * out * sizeof(float));
	fill(r, x, (size_t)T * in);
	fill(r, w, (size_t)out * in);
	bk_weight W = { .data = w, .rows = out, .cols = in };
	bk_gen_ops_host.linear(y, x, &W, T);
	ref_matmul(z, x, w, T, out, in, 1.0f, 0);
	size_t at = 0;
	CHECK(same_bits(y, z, (size_t)T * out, &at),
	      "%s linear T=%d out=%d in=%d: element %zu is %.9g, the definition %.9g", isa, T,
	      out, in, at, y[at], z[at]);
	/* each row alone: the same bits as in the batch */
	for (int t = 0; t < T; t += (T > 8 ? 7 : 1)) {
		bk_gen_ops_host.linear(z, x + (size_t)t * in, &W, 1);
		CHECK(!memcmp(z, y + (size_t)t * out, (size_t)out * sizeof(float)),
		      "%s linear T=%d out=%d in=%d: row %d alone differs from the batch", isa, T,
		      out, in, t);
	}
	free(x);
	free(w);
	free(y);
	free(z);
}

static void check_lora(bk_rng *r, const char *isa, int T, int out, int in, int R)
{
	float *x = xmalloc((size_t)T * in * sizeof(float));
	float *A = xmalloc((size_t)R * in * sizeof(float));
	float *B = xmalloc((size_t)out * R * sizeof(float));
	float *y = xmalloc((size_t)T * out * sizeof(float));
	float *z = xmalloc((size_t)T * out * sizeof(float));
	float *xa = xmalloc((size_t)T * R * sizeof(float));
	float *za = xmalloc((size_t)T * R * sizeof(float));
	fill(r, x, (size_t)T * in);
	fill(r, A, (size_t)R * in);
	fill(r, B, (size_t)out * R);
	fill(r, y, (size_t)T * out);
	memcpy(z, y, (size_t)T * out * sizeof(float));
	bk_gen_ops_host.lora(y, x, A, B, T, in, out, R, 0.37f, xa);
	ref_matmul(za, x, A, T, R, in, 1.0f, 0);
	ref_matmul(z, za, B, T, out, R, 0.37f, 1);
	size_t at = 0;
	CHECK(same_bits(y, z, (size_t)T * out, &at),
	      "%s lora T=%d out=%d in=%d R=%d: element %zu is %.9g, the definition %.9g", isa,
	      T, out, in, R, at, y[at], z[at]);
	free(x);
	free(A);
	free(B);
	free(y);
	free(z);
	free(xa);
	free(za);
}

int main(void)
{
	static const char *isas[] = { "avx512", "avx2", "sse2" };
	static const int Ts[] = { 1, 2, 3, 4, 5, 6, 7, 9, 64, 67 };
	static const int outs[] = { 1, 2, 5, 7, 13, 48, 50, 97 };
	static const int ins[] = { 1, 8, 15, 16, 17, 33, 64, 581 };
	bk_rng r;
	bk_rng_seed(&r, 7);
	int ran = 0;
	for (int i = 0; i < 3; i++) {
		if (bk_host_rows_isa(isas[i]) < 0) {
			fprintf(stderr, "test_rows: this CPU does not run %s: not checked\n", isas[i]);
			continue;
		}
		CHECK(!strcmp(bk_host_rows_isa_name(), isas[i]), "selected %s, in use %s", isas[i],
		      bk_host_rows_isa_name());
		ran++;
		for (size_t a = 0; a < sizeof(Ts) / sizeof(*Ts); a++)
			for (size_t b = 0; b < sizeof(outs) / sizeof(*outs); b++)
				check_linear(&r, isas[i], Ts[a], outs[b], ins[(a + b) % 8]);
		for (size_t c = 0; c < sizeof(ins) / sizeof(*ins); c++)
			check_linear(&r, isas[i], 3, 11, ins[c]);
		check_linear(&r, isas[i], 70, 300, 576); /* threaded, two row chunks */
		check_lora(&r, isas[i], 5, 97, 64, 8);
		check_lora(&r, isas[i], 33, 50, 581, 16);
	}
	CHECK(ran >= 1 && !strcmp(isas[2], "sse2"), "no code path ran");
	CHECK(bk_host_rows_isa("avx9000") == -1, "an unknown path name is accepted");
	CHECK(bk_host_rows_isa(NULL) == 0, "the default path is refused");
	return bk_test_done("test_rows");
}
