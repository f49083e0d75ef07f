/* test_quant4.c - gpu/quant4.c against bitsandbytes: the fixtures of
 * tests/ref/make_nf4_golden.py (tests/golden/quant4/: bnb 0.50's quantize_4bit and
 * dequantize_4bit on the CPU).  Packed bytes, absmaxes, nested statistics and the
 * dequantised fp32 and bf16 values must be equal, bit for bit.  And the offset of double
 * quantisation, torch.mean, for rows of up to 3M values and 1..64 threads
 * (tests/ref/make_q4_mean_golden.py), the thread count torch would take, and the
 * nested statistics' 8-bit codes at their rounding edges (tests/ref/make_q8_golden.py). */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "gpu/quant4.h"
#include "tests/harness.h"

#define DIR "tests/golden/quant4"

static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* make_nf4_golden.py's gen(): the inputs, exact in fp32 */
static void gen(float *out, int rows, int cols, int seed, const char *special, int type)
{
	uint64_t state = (uint64_t)seed * 0x1000193u;
	for (int r = 0; r < rows; r++) {
		int shift = r % 7;
		for (int c = 0; c < cols; c++) {
			int64_t v = 0;
			for (int k = 0; k < 3; k++)
				v += (int64_t)(splitmix64(&state) >> 44);
			v -= 3 << 19;
			double x = (double)v * ldexp(1.0, -21 - shift);
			size_t i = (size_t)r * cols + c;
			if (i % 97 == 0)
				x *= 8.0;
			out[i] = (float)x;
		}
	}
	size_t n = (size_t)rows * cols;
	if (!strcmp(special, "zeros"))
		for (size_t i = 64; i < n; i++)
			out[i] = 0.0f;
	if (!strcmp(special, "ties")) {
		/* 1, 0, -0, the midpoints of the sorted book with both signs, the book, +-2^-30 */
		const float *code = bk_q4_code(type);
		float sorted[16], vals[64];
		memcpy(sorted, code, sizeof sorted);
		for (int i = 1; i < 16; i++) /* insertion sort: stable, zeros stay in order */
			for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
				float t = sorted[j];
				sorted[j] = sorted[j - 1];
				sorted[j - 1] = t;
			}
		int k = 0;
		vals[k++] = 1.0f, vals[k++] = 0.0f, vals[k++] = -0.0f;
		for (int i = 0; i < 15; i++)
			vals[k++] = (sorted[i] + sorted[i + 1]) / 2.0f;
		for (int i = 0; i < 15; i++)
			vals[k++] = -((sorted[i] + sorted[i + 1]) / 2.0f);
		for (int i = 0; i < 16; i++)
			vals[k++] = code[i];
		vals[k++] = ldexpf(1.0f, -30), vals[k++] = -ldexpf(1.0f, -30);
		for (int i = 0; i < 64; i++) {
			out[i] = i < k ? vals[i] : 0.5f;
			out[64 + i] = 2.0f * (i < k ? vals[i] : 0.25f);
		}
	}
}

static float hexf(json_t *a, size_t i)
{
	return (float)strtod(json_string_value(json_array_get(a, i)), NULL);
}

/* first index where a and b differ (bytes), or -1 */
static long first_diff(const void *a, const void *b, size_t n, size_t elem)
{
	for (size_t i = 0; i < n; i++)
		if (memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem))
			return (long)i;
	return -1;
}

static void check_books(json_t *books)
{
	static const char *const names[] = {"nf4", "fp4"};
	for (int t = 0; t < 2; t++) {
		json_t *b = json_object_get(books, names[t]);
		const float *code = bk_q4_code(bk_q4_parse(names[t]));
		for (size_t i = 0; i < 16; i++) {
			/* FP4's code 8: -0 in bnb's C kernels, +0 in get_4bit_type (quant4.c) */
			float want = hexf(json_object_get(b, "code"), i);
			if (t == 1 && i == 8)
				want = -want;
			CHECK(!memcmp(&want, &code[i], 4), "%s code[%zu] %a, bnb %a", names[t], i,
			      code[i], want);
		}
	}
}

static void check_case(json_t *c)
{
	const char *name = json_string_value(json_object_get(c, "name"));
	int rows = (int)json_integer_value(json_object_get(c, "rows"));
	int cols = (int)json_integer_value(json_object_get(c, "cols"));
	int seed = (int)json_integer_value(json_object_get(c, "seed"));
	int dq = (int)json_integer_value(json_object_get(c, "double_quant"));
	int type = bk_q4_parse(json_string_value(json_object_get(c, "quant_type")));
	const char *special = json_string_value(json_object_get(c, "special"));
	int bf16 = !strcmp(json_string_value(json_object_get(c, "dtype")), "bf16");
	size_t n = (size_t)rows * cols, nb = (n + 63) / 64;
	size_t nb2 = (size_t)json_integer_value(json_object_get(c, "blocks2"));
	CHECK(type > 0, "%s: type", name);

	char *path = xasprintf("%s/%s.bin", DIR, name);
	size_t len;
	uint8_t *blob = (uint8_t *)bk_read_file(path, &len);
	free(path);
	size_t want_len = (n + 1) / 2 + nb * 4 + (dq ? nb + nb2 * 4 + 4 + 256 * 4 : 0) + nb * 4 +
			  n * 4 + n * 2;
	CHECK(len == want_len, "%s: %zu bytes, expected %zu", name, len, want_len);
	if (len != want_len) {
		free(blob);
		return;
	}
	const uint8_t *p = blob;
	const uint8_t *g_packed = p;
	p += (n + 1) / 2;
	float *g_absmax = xmalloc(nb * 4), *g_absmax2 = xmalloc(nb2 * 4 + 4), g_offset = 0;
	float *g_code2 = xmalloc(256 * 4), *g_deq_absmax = xmalloc(nb * 4);
	float *g_d32 = xmalloc(n * 4);
	uint16_t *g_d16 = xmalloc(n * 2);
	memcpy(g_absmax, p, nb * 4), p += nb * 4;
	const uint8_t *g_q8 = p;
	if (dq) {
		p += nb;
		memcpy(g_absmax2, p, nb2 * 4), p += nb2 * 4;
		memcpy(&g_offset, p, 4), p += 4;
		memcpy(g_code2, p, 256 * 4), p += 256 * 4;
	}
	memcpy(g_deq_absmax, p, nb * 4), p += nb * 4;
	memcpy(g_d32, p, n * 4), p += n * 4;
	memcpy(g_d16, p, n * 2);

	float *w = xmalloc(n * sizeof(float));
	gen(w, rows, cols, seed, special, type);
	if (bf16)
		for (size_t i = 0; i < n; i++)
			w[i] = bk_q4_bf16_round(w[i]);

	/* the plain quantisation (statistics before double quant) */
	bk_q4 q;
	bk_q4_quantize(&q, w, rows, cols, type, 0, 0);
	long d = first_diff(q.packed, g_packed, (n + 1) / 2, 1);
	CHECK(d < 0, "%s: packed byte %ld: %02x, bnb %02x", name, d, d < 0 ? 0 : q.packed[d],
	      d < 0 ? 0 : g_packed[d]);
	d = first_diff(q.absmax, g_absmax, nb, 4);
	CHECK(d < 0, "%s: absmax[%ld] %a, bnb %a", name, d, d < 0 ? 0 : q.absmax[d],
	      d < 0 ? 0 : g_absmax[d]);
	bk_q4_free(&q);

	bk_q4_quantize(&q, w, rows, cols, type, dq, 0);
	CHECK(q.nb == nb && q.nb2 == nb2, "%s: blocks %zu/%zu nested %zu/%zu", name, q.nb, nb,
	      q.nb2, nb2);
	d = first_diff(q.packed, g_packed, (n + 1) / 2, 1);
	CHECK(d < 0, "%s: packed byte %ld differs (double quant %d)", name, d, dq);
	if (dq && q.nb2 == nb2) {
		const float *code2 = bk_q4_code2();
		d = first_diff(code2, g_code2, 256, 4);
		CHECK(d < 0, "%s: code2[%ld] %a, bnb %a", name, d, d < 0 ? 0 : code2[d],
		      d < 0 ? 0 : g_code2[d]);
		CHECK(!memcmp(&q.offset, &g_offset, 4), "%s: offset %a, bnb %a", name, q.offset,
		      g_offset);
		d = first_diff(q.absmax2, g_absmax2, nb2, 4);
		CHECK(d < 0, "%s: absmax2[%ld] %a, bnb %a", name, d, d < 0 ? 0 : q.absmax2[d],
		      d < 0 ? 0 : g_absmax2[d]);
		d = first_diff(q.qabsmax, g_q8, nb, 1);
		CHECK(d < 0, "%s: qabsmax[%ld] %u, bnb %u", name, d, d < 0 ? 0 : q.qabsmax[d],
		      d < 0 ? 0 : g_q8[d]);
	}
	float *am = xmalloc(nb * 4);
	bk_q4_block_absmax(&q, am);
	d = first_diff(am, g_deq_absmax, nb, 4);
	CHECK(d < 0, "%s: dequantised absmax[%ld] %a, bnb %a", name, d, d < 0 ? 0 : am[d],
	      d < 0 ? 0 : g_deq_absmax[d]);

	float *out = xmalloc(n * 4);
	bk_q4_dequantize(&q, out, 0);
	/* FP4's code 8 dequantises to -0 or +0 depending on which of bnb's CPU paths runs
	 * (the scalar C kernel, its vectorised one, the Python fallback for an odd last
	 * dimension): zeros of either sign are equal here, every other value bit for bit */
	for (size_t i = 0; i < n; i++)
		if (out[i] == 0 && g_d32[i] == 0)
			out[i] = g_d32[i], g_d16[i] = bk_q4_bf16_bits(g_d32[i]);
	d = first_diff(out, g_d32, n, 4);
	CHECK(d < 0, "%s: dequantize fp32 [%ld] %a, bnb %a", name, d, d < 0 ? 0 : out[d],
	      d < 0 ? 0 : g_d32[d]);
	bk_q4_dequantize(&q, out, 1);
	for (size_t i = 0; i < n; i++)
		if (out[i] == 0 && g_d32[i] == 0)
			out[i] = g_d32[i];
	long bad = -1;
	for (size_t i = 0; i < n && bad < 0; i++)
		if (bk_q4_bf16_bits(out[i]) != g_d16[i] ||
		    bk_q4_bf16_bits(g_d32[i]) != g_d16[i])
			bad = (long)i;
	CHECK(bad < 0, "%s: dequantize bf16 [%ld] %04x, bnb %04x", name, bad,
	      bad < 0 ? 0 : bk_q4_bf16_bits(out[bad]), bad < 0 ? 0 : g_d16[bad]);
	/* the quantisation is what it claims: without double quant, every value within half
	 * the widest gap of the book (NF4 0.152, FP4 0.167, plus the scaling's rounding) times its block's absmax */
	double worst = 0;
	for (size_t i = 0; i < n && !dq; i++) {
		float a = am[i / 64];
		double e = fabs((double)out[i] - w[i]) / (a > 0 ? a : 1);
		worst = e > worst ? e : worst;
	}
	CHECK(worst <= (type == BK_Q4_NF4 ? 0.153 : 0.168), "%s: max |dequant - w| / absmax %.4f",
	      name, worst);
	size_t bytes = bk_q4_bytes((size_t)rows, (size_t)cols, dq);
	CHECK(bytes == (n + 1) / 2 + (dq ? nb + nb2 * 4 + 4 : nb * 4), "%s: bytes %zu", name,
	      bytes);

	bk_q4_free(&q);
	free(out), free(am), free(w), free(blob);
	free(g_absmax), free(g_absmax2), free(g_code2), free(g_deq_absmax), free(g_d32);
	free(g_d16);
}

/* make_q4_mean_golden.py's gen(): value i of the row of a seed */
static float mean_input(uint64_t seed, size_t i)
{
	uint64_t z = (seed << 32) + (uint64_t)(i + 1) * 0x9E3779B97F4A7C15ull;
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	z ^= z >> 31;
	return ldexpf((float)((z >> 41) | (1u << 23)), -29 - (int)((z >> 38) & 7));
}

static void check_means(void)
{
	json_error_t err;
	json_t *m = json_load_file(DIR "/mean.json", 0, &err);
	CHECK(m, "%s: %s", DIR "/mean.json", err.text);
	if (!m)
		return;
	json_t *cases = json_object_get(m, "cases");
	size_t checked = 0;
	for (size_t c = 0; c < json_array_size(cases); c++) {
		json_t *cs = json_array_get(cases, c);
		size_t n = (size_t)json_integer_value(json_object_get(cs, "n"));
		uint64_t seed = (uint64_t)json_integer_value(json_object_get(cs, "seed"));
		float *x = xmalloc(n * sizeof(float));
		for (size_t i = 0; i < n; i++)
			x[i] = mean_input(seed, i);
		const char *t;
		json_t *v;
		json_object_foreach(json_object_get(cs, "means"), t, v) {
			uint32_t want = (uint32_t)strtoul(json_string_value(v), NULL, 16), got;
			float mean = bk_q4_torch_mean(x, n, atoi(t));
			memcpy(&got, &mean, 4);
			CHECK(got == want, "torch.mean of %zu values, %s threads: %08x, torch %08x", n,
			      t, got, want);
			checked++;
		}
		free(x);
	}
	CHECK(checked >= 100, "%zu means checked", checked);
	json_decref(m);
}

/* bnb's quantize_blockwise at the edges of its table: q8.bin's blocks, one at a time and
 * all together */
static void check_q8(void)
{
	size_t len;
	uint8_t *blob = (uint8_t *)bk_read_file(DIR "/q8.bin", &len);
	uint32_t blocks = 0;
	if (len >= 4)
		memcpy(&blocks, blob, 4);
	size_t rec = BK_Q4_BLOCK2 * 5 + 4;
	CHECK(blocks >= 8 && len == 4 + blocks * rec, "q8.bin: %zu bytes, %u blocks", len, blocks);
	if (blocks < 8 || len != 4 + blocks * rec) {
		free(blob);
		return;
	}
	float *x = xmalloc(blocks * BK_Q4_BLOCK2 * sizeof(float)), *am = xmalloc(blocks * 4);
	uint8_t *want = xmalloc(blocks * BK_Q4_BLOCK2), *q = xmalloc(blocks * BK_Q4_BLOCK2);
	float *want_am = xmalloc(blocks * 4);
	for (uint32_t b = 0; b < blocks; b++) {
		const uint8_t *p = blob + 4 + b * rec;
		memcpy(x + b * BK_Q4_BLOCK2, p, BK_Q4_BLOCK2 * 4);
		memcpy(want + b * BK_Q4_BLOCK2, p + BK_Q4_BLOCK2 * 4, BK_Q4_BLOCK2);
		memcpy(want_am + b, p + BK_Q4_BLOCK2 * 5, 4);
	}
	bk_q4_q8_blockwise(x, (size_t)blocks * BK_Q4_BLOCK2, q, am);
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < (size_t)blocks * BK_Q4_BLOCK2; i++)
		if (q[i] != want[i] && !bad++)
			first = i;
	CHECK(!bad, "q8: %zu of %u codes differ, first [%zu] %a: %u, bnb %u", bad,
	      blocks * BK_Q4_BLOCK2, first, x[first], q[first], want[first]);
	CHECK(!memcmp(am, want_am, blocks * 4), "q8: absmax differs");
	/* a short last block */
	bk_q4_q8_blockwise(x, 100, q, am);
	CHECK(!memcmp(q, want, 100) && am[0] == want_am[0], "q8: a block of 100");
	free(x), free(am), free(want), free(q), free(want_am), free(blob);
}

/* the thread count torch's wheel starts with (OpenMP sized by MKL), from the environment */
static void check_threads(void)
{
	static const char *const vars[] = {"MKL_NUM_THREADS", "OMP_NUM_THREADS", "MKL_DYNAMIC"};
	for (int i = 0; i < 3; i++)
		unsetenv(vars[i]);
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	int cores = bk_q4_torch_threads(); /* the physical cores this process may use */
	CHECK(cores >= 1 && cores <= cpus, "default %d threads, %ld CPUs", cores, cpus);
	static const struct {
		const char *mkl, *omp, *dyn;
		int want; /* -1: the default */
	} cases[] = {
		{NULL, "1", NULL, 1},          {"1", "2", NULL, 1},        {"x", "1", NULL, 1},
		{NULL, "1,3", NULL, 1},        {NULL, "1x", NULL, -1},     {NULL, "0", NULL, -1},
		{NULL, "48", "FALSE", 48},     {"5", "48", "false", 5},    {NULL, "3,2", "False", 3},
		{NULL, "100000", NULL, -2}, /* capped at the machine's physical cores */
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *vals[] = {cases[i].mkl, cases[i].omp, cases[i].dyn};
		for (int k = 0; k < 3; k++)
			vals[k] ? setenv(vars[k], vals[k], 1) : unsetenv(vars[k]);
		int got = bk_q4_torch_threads(), want = cases[i].want;
		if (want == -1)
			want = cores;
		if (want == -2)
			CHECK(got >= cores && got <= cpus, "OMP_NUM_THREADS=100000: %d threads", got);
		else
			CHECK(got == want, "MKL_NUM_THREADS=%s OMP_NUM_THREADS=%s MKL_DYNAMIC=%s: %d "
			      "threads, torch %d", vals[0] ? vals[0] : "-", vals[1] ? vals[1] : "-",
			      vals[2] ? vals[2] : "-", got, want);
	}
	for (int i = 0; i < 3; i++)
		unsetenv(vars[i]);
}

int main(void)
{
	check_means();
	check_threads();
	check_q8();
	json_error_t err;
	json_t *m = json_load_file(DIR "/cases.json", 0, &err);
	CHECK(m, "%s: %s", DIR "/cases.json", err.text);
	if (!m)
		return bk_test_done("quant4");
	check_books(json_object_get(m, "books"));
	json_t *cases = json_object_get(m, "cases");
	CHECK(json_array_size(cases) >= 10, "%zu cases", json_array_size(cases));
	for (size_t i = 0; i < json_array_size(cases); i++)
		check_case(json_array_get(cases, i));
	/* names */
	CHECK(bk_q4_parse("nf4") == BK_Q4_NF4 && bk_q4_parse("fp4") == BK_Q4_FP4 &&
		      bk_q4_parse("int4") == -1,
	      "parse");
	/* bf16 rounding: nearest, ties to even */
	CHECK(bk_q4_bf16_bits(1.0f) == 0x3f80 && bk_q4_bf16_bits(1.00390625f) == 0x3f80 &&
		      bk_q4_bf16_bits(1.01171875f) == 0x3f82,
	      "bf16 ties to even");
	json_decref(m);
	return bk_test_done("quant4");
}
