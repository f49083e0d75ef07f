/* test_decode2.cc - the v2 decode kernels (BK_DECODE=v2) of gpu/cuda/cuda_linear2.cuh
 * (the split-K decode linear and the tiled prefill linear) and gpu/cuda/cuda_sample2.cuh
 * (the bounded top-p sampler), their own source launched on the emulated GPU (make emu;
 * tests/emu/kernel_check.h), run by tests/t0950-emu.sh.
 *
 * Checked: the linear against a double reference on bf16-rounded inputs (bound 1e-4 of
 * max|y|: the emulated mma adds its 16 products in fp32, a wrong index is off by O(1));
 * sizes with one and several K ranges, ragged ranges, in % 8 != 0 (scalar loads), out not
 * a multiple of 16 or 64; that every row is bit for bit the same whether it runs alone,
 * with other rows, or through the prefill kernel (T > 64) - the batch invariance the
 * engine relies on; that the tile counters are back at 0 after a call; NaN-poisoned
 * outputs fully written and nothing past them.  The sampler against bk_sample_token
 * (gpu/sample.c, the host twin) token for token: greedy with tied maxima, peaked, flat
 * (the nucleus far larger than any candidate set), tied probabilities across the top-p
 * boundary, top-p 1, tiny top-p, a NaN row; and with top-k (1, 50 with top-p 0.9 and 1,
 * a K inside a run of ties, a K above the nucleus, K = V - 1 and K >= V).
 * Not checked here: the hardware's rounding, its fragment layout itself, races between
 * blocks under true concurrency, speed (tests/gpu/check_decode.c does those on a GPU). */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "common/rng.h"
#include "gpu/sample.h"
void bk_diag_init(const char *argv0);
}

#include "tests/emu/kernel_check.h"

static inline uint16_t bf16_bits(float f) { return kc_bits(__float2bfloat16_rn(f)); }
static inline float bf16_float(uint16_t b) { return __bfloat162float(__ushort_as_bfloat16(b)); }

// cuda_gen.cu's pack_bf16 and mma_bf16 (d = A B + d, m16n8k16 bf16 -> f32), which it
// defines before including cuda_linear2.cuh
static inline uint32_t pack_bf16(float a, float b)
{
	return (uint32_t)bf16_bits(a) | ((uint32_t)bf16_bits(b) << 16);
}
static void mma_bf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
		     uint32_t b0, uint32_t b1)
{
	const uint32_t a[4] = {a0, a1, a2, a3};
	emu_mma_m16n8k16(d, a, b0, b1);
}

// the kernels themselves
#include "gpu/cuda/cuda_linear2.cuh"
#include "gpu/cuda/cuda_sample2.cuh"

// ---- the host side of the kernels (as cuda_gen.cu / cuda_sample.cu launch them) ----

static unsigned bk_cuda_blocks_(int n, int per) { return (unsigned)((n + per - 1) / per); }

static int g_prefill_calls, g_decode_calls;
static unsigned *g_cnt; // [L2_NCNT] tile counters, zero between calls (as cuda_gen.cu keeps them)

static void linear2(float *y, const float *x, const __nv_bfloat16 *w, int T, int in, int out)
{
	int KS, CPS;
	lin2_plan(in, out, &KS, &CPS);
	if (T > 64) {
		g_prefill_calls++;
		dim3 grid(bk_cuda_blocks_(out, L2_PRE_NW * 16), bk_cuda_blocks_(T, 64));
		BK_LAUNCH(gen_linear2_prefill_kernel, grid, L2_PRE_NW * 32, 0, bk_cuda_stream(), y, x,
			  w, T, in, out, KS, CPS);
		return;
	}
	g_decode_calls++;
	dim3 grid(bk_cuda_blocks_(out, L2_DEC_NW * 16), 1, KS);
	dbuf<float> part((size_t)KS * T * out);
	void (*k)(float *, const float *, const __nv_bfloat16 *, int, int, int, int, int, float *,
		  unsigned *) = T <= 8    ? gen_linear2_kernel<1>
				: T <= 16 ? gen_linear2_kernel<2>
				: T <= 32 ? gen_linear2_kernel<4>
					  : gen_linear2_kernel<8>;
	BK_LAUNCH_N("gen_linear2_kernel", k, grid, L2_DEC_NW * 32, 0, bk_cuda_stream(), y, x, w, T,
		    in, out, KS, CPS, part.p, g_cnt);
	CUDA_CHECK(cudaStreamSynchronize(bk_cuda_stream())); // before part is freed
}

// ---- the test ----

static uint64_t rs = 88172645463325252ull;
static float urand(void) /* [-1, 1) */
{
	rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
	return (float)((double)(rs >> 11) * 0x1p-53 * 2 - 1);
}

static int n_fail;
static void verdict(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void verdict(int ok, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" %s\n", ok ? "ok" : "FAIL");
	n_fail += !ok;
}

static void check_linear(int T, int in, int out)
{
	std::vector<float> x((size_t)T * in), yref((size_t)T * out);
	std::vector<__nv_bfloat16> w((size_t)out * in);
	for (auto &v : x)
		v = urand();
	for (auto &v : w)
		v = __ushort_as_bfloat16(bf16_bits(0.1f * urand()));
	double ymax = 1e-3;
	for (int t = 0; t < T; t++)
		for (int o = 0; o < out; o++) {
			double s = 0;
			for (int k = 0; k < in; k++)
				s += (double)bf16_float(bf16_bits(x[(size_t)t * in + k])) *
				     bf16_float(kc_bits(w[(size_t)o * in + k]));
			yref[(size_t)t * out + o] = (float)s;
			ymax = fabs(s) > ymax ? fabs(s) : ymax;
		}
	// NaN everywhere (fresh device memory), the emulation's guard bytes past the end
	dbuf<float> dx(x), dy((size_t)T * out);
	dbuf<__nv_bfloat16> dw(w);
	linear2(dy.p, dx.p, dw.p, T, in, out);
	std::vector<float> y = dy.get();
	double err = 0;
	for (size_t i = 0; i < (size_t)T * out; i++) {
		double e = fabs((double)y[i] - yref[i]) / ymax;
		err = e > err || e != e ? e : err;
	}
	int KS, CPS;
	lin2_plan(in, out, &KS, &CPS);
	verdict(err <= 1e-4,
		"linear2 T=%d in=%d out=%d (%s, %d K ranges of %d chunks): err %.2e (bound 1e-4)",
		T, in, out, T > 64 ? "prefill" : "decode", KS, CPS, err);
	int zero = 1;
	std::vector<unsigned> cnt(L2_NCNT);
	CUDA_CHECK(cudaMemcpy(cnt.data(), g_cnt, L2_NCNT * sizeof(unsigned), cudaMemcpyDeviceToHost));
	for (unsigned c : cnt)
		zero &= c == 0;
	verdict(zero, "  tile counters back at 0");
	// batch invariance: every row alone (decode T = 1); and in chunks of up to 64 rows
	// (decode) when T > 64 ran the prefill kernel
	int same = 1;
	dbuf<float> dy1((size_t)out);
	for (int t = 0; t < T; t += T > 8 ? 7 : 1) {
		linear2(dy1.p, dx.p + (size_t)t * in, dw.p, 1, in, out);
		std::vector<float> y1 = dy1.get();
		same &= !memcmp(y1.data(), y.data() + (size_t)t * out, (size_t)out * 4);
	}
	verdict(same, "  rows alone (T=1): bit for bit");
	if (T > 1) {
		dbuf<float> dyc((size_t)T * out);
		for (int t0 = 0; t0 < T; t0 += 64 - 11) { // odd chunks, never the prefill kernel
			int n = T - t0 < 64 - 11 ? T - t0 : 64 - 11;
			linear2(dyc.p + (size_t)t0 * out, dx.p + (size_t)t0 * in, dw.p, n, in, out);
		}
		std::vector<float> yc = dyc.get();
		verdict(!memcmp(yc.data(), y.data(), (size_t)T * out * 4),
			"  rows in chunks of 53 (decode kernel): bit for bit");
	}
}

enum { ROW_PEAKED, ROW_FLAT, ROW_TIED_MAX, ROW_TIED_P, ROW_MID, ROW_NAN, NKIND };

static void check_sample(int V, float temperature, float top_p, int N, int threads,
			 int top_k = 0)
{
	std::vector<float> lg((size_t)N * V);
	for (int i = 0; i < N; i++) {
		int kind = i % NKIND;
		float *r = lg.data() + (size_t)i * V;
		float sc = kind == ROW_PEAKED ? 8.0f : kind == ROW_FLAT ? 0.05f : 2.0f;
		for (int j = 0; j < V; j++)
			r[j] = sc * urand();
		if (kind == ROW_TIED_MAX)
			for (int k = 0; k < 3; k++)
				r[(int)((urand() + 1) * 0.5f * V) % V] = 50.0f;
		if (kind == ROW_TIED_P) // a few distinct values only: long runs of ties
			for (int j = 0; j < V; j++)
				r[j] = (float)((int)((urand() + 1) * 2));
		if (kind == ROW_NAN)
			r[V / 3] = NAN;
	}
	std::vector<int32_t> rows(N), ctr(N), ids(N, -7);
	std::vector<uint64_t> keys(N);
	for (int i = 0; i < N; i++) {
		rows[i] = N - 1 - i;
		keys[i] = rs ^ (uint64_t)i * 0x9e3779b97f4a7c15ull;
		ctr[i] = i * 3;
	}
	size_t per = ((size_t)V * sizeof(double) + 64 + 15) & ~(size_t)15;
	int nb = N < 5 ? N : 5; // fewer blocks than draws: each block takes several
	{
		dbuf<int32_t> dids(ids), drows(rows), dctr(ctr);
		dbuf<float> dlg(lg);
		dbuf<uint64_t> dkeys(keys);
		dbuf<char> work(per * nb); // 256-byte aligned, as cudaMalloc
		void (*k)(int32_t *, const float *, const int32_t *, const uint64_t *,
			  const int32_t *, int, int, float, int, float, char *, size_t) =
			sample2_kernel<1024>;
		BK_LAUNCH_N("sample2_kernel", k, nb, threads, 0, bk_cuda_stream(), dids.p, dlg.p,
			    drows.p, dkeys.p, dctr.p, N, V, temperature, top_k, top_p, work.p, per);
		ids = dids.get();
	}
	bk_sample_work *sw = bk_sample_work_new(V);
	bk_sample_params sp = {temperature, top_p, top_k};
	int bad = 0, first = -1;
	int32_t fw = 0;
	for (int i = 0; i < N; i++) {
		int32_t want;
		if (rows[i] % NKIND == ROW_NAN) {
			want = -1;
		} else {
			double u = temperature > 0 ? bk_crng_uniform(keys[i], (uint64_t)ctr[i]) : 0;
			want = bk_sample_token(lg.data() + (size_t)rows[i] * V, V, &sp, u, sw);
		}
		if (ids[i] != want) {
			if (first < 0)
				first = i, fw = want;
			bad++;
		}
	}
	bk_sample_work_free(sw);
	verdict(!bad, "sample2 V=%d temperature=%g top_k=%d top_p=%g draws=%d threads=%d: %d differ%s",
		V, temperature, top_k, top_p, N, threads, bad,
		first >= 0 ? " (see the first below)" : "");
	if (first >= 0)
		printf("  first: draw %d (row kind %d) got %d, host %d\n", first, rows[first] % NKIND,
		       ids[first], fw);
}

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	dbuf<unsigned> cnt(std::vector<unsigned>(L2_NCNT, 0));
	g_cnt = cnt.p;
	// decode: one range, several, ragged; scalar loads; out not a multiple of 16 / 64
	check_linear(1, 64, 96);
	check_linear(3, 8, 5);
	check_linear(5, 100, 37);
	check_linear(9, 520, 200);
	check_linear(17, 264, 70);
	check_linear(33, 1024, 64);
	// prefill (T > 64) against decode chunks
	check_linear(70, 264, 130);
	check_linear(129, 96, 20);
	printf("linear2: %d prefill and %d decode launches\n", g_prefill_calls, g_decode_calls);
	verdict(g_prefill_calls == 2, "the prefill kernel ran for T > 64 only");

	check_sample(300, 0, 1, 6, 64);
	check_sample(300, 0.8f, 0.9f, 12, 64);
	check_sample(1500, 1.5f, 0.5f, 6, 64);
	check_sample(1500, 1.0f, 0.98f, 6, 96);
	check_sample(777, 1.0f, 1.0f, 6, 64);     // top-p 1: the whole row
	check_sample(500, 0.7f, 0.0001f, 6, 64);  // the first token only
	check_sample(3000, 2.0f, 0.95f, 6, 128);  // flat: a nucleus of thousands
	// top-k: HF's default 50 (below and above the nucleus), greedy-like 1, ties at the
	// K-th (the tied rows' few levels), K = V - 1, K >= V (no top-k)
	check_sample(300, 0.8f, 0.9f, 12, 64, 50);
	check_sample(1500, 1.0f, 1.0f, 6, 96, 50);
	check_sample(1500, 1.5f, 0.5f, 6, 64, 1);
	check_sample(777, 1.0f, 0.98f, 12, 64, 200);
	check_sample(500, 0.7f, 0.9f, 6, 64, 499);
	check_sample(500, 0.7f, 0.9f, 6, 64, 500);
	check_sample(3000, 2.0f, 0.95f, 6, 128, 2000);
	if (n_fail) {
		printf("test_decode2: %d FAILED\n", n_fail);
		return 1;
	}
	printf("test_decode2: all ok\n");
	return 0;
}
