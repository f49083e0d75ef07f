/* test_proj3.cc - the device code of BK_LINEAR=v3 (gpu/cuda/cuda_proj3.cuh), its own
 * source launched on the emulated GPU (make emu; tests/emu/kernel_check.h), run by
 * tests/t0950-emu.sh:
 *   - proj_cat_layout: the column offsets of the interleaved [T, sum out] layout;
 *   - proj_interleave_bf16_kernel: every element (t, o) of every member j lands at
 *     t * ld + off[j] + o, rounded to bf16 (bit for bit, round to nearest even), every
 *     element of the matrix written, nothing outside it (the exact-size allocation's
 *     guard bytes, which the emulation checks after the launch), on grids
 *     smaller than the matrix (the grid-stride loops) and on proj_interleave_grid's;
 *     the index of the source element is computed here independently, and the values
 *     are random, so a wrong offset or row stride reads another value and fails;
 *   - the interleaved matrix times the stacked weights equals sum_j dy_j W_j (in double,
 *     on the rounded values): the layout is the one the single dx GEMM needs;
 *   - proj_batches: which members share a batched GEMM (q/k/v under GQA and not, gate/up,
 *     a member without LoRA);
 *   - proj_ptrs_kernel: the pointer table.
 * Not checked here: cuBLAS, the host side of cuda_proj.cuh (the caches, the GEMMs), the
 * hardware (tests/gpu/check_linear.c does those). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <memory>
#include <vector>

extern "C" {
#include "common/rng.h"
#include "tests/harness.h"
void bk_diag_init(const char *argv0);
}

#include "tests/emu/kernel_check.h"

#include "gpu/cuda/cuda_proj3.cuh"

static bk_rng rng;

/* one group: T tokens, n members of outs[j] features; launched on grid (gx, gy) of
 * `threads` threads (gx = 0: proj_interleave_grid's, with 256 threads) */
static void test_interleave(int T, int n, const int *outs, unsigned gx, unsigned gy,
			    int threads)
{
	proj_cat c;
	int ld = proj_cat_layout(&c, outs, n);
	int sum = 0;
	for (int j = 0; j < n; j++) {
		CHECK(c.off[j] == sum, "off[%d] = %d, want %d", j, c.off[j], sum);
		sum += outs[j];
	}
	CHECK(ld == sum && c.ld == sum && c.off[n] == sum && c.n == n, "ld %d, want %d", ld, sum);
	std::vector<std::vector<float>> dy(n);
	std::vector<std::unique_ptr<dbuf<float>>> ddy(n);
	for (int j = 0; j < n; j++) {
		dy[j].resize((size_t)T * outs[j]);
		for (float &v : dy[j])
			v = (float)(2 * bk_rng_uniform(&rng) - 1);
		ddy[j].reset(new dbuf<float>(dy[j]));
		c.src[j] = *ddy[j];
	}
	dbuf<__nv_bfloat16> dcat((size_t)T * ld); /* fresh: 0xffff, a NaN no rounding gives */
	if (!gx) {
		proj_interleave_grid(T, ld, &gx, &gy);
		threads = 256;
	}
	BK_LAUNCH(proj_interleave_bf16_kernel, dim3(gx, gy), threads, 0, bk_cuda_stream(), dcat.p,
		  c, T);
	std::vector<__nv_bfloat16> cat = dcat.get();
	int bad = 0, unwritten = 0;
	for (int j = 0, col0 = 0; j < n; col0 += outs[j], j++)
		for (int t = 0; t < T; t++)
			for (int o = 0; o < outs[j]; o++) {
				uint16_t want = kc_bits(__float2bfloat16_rn(dy[j][(size_t)t * outs[j] + o]));
				bad += kc_bits(cat[(size_t)t * sum + col0 + o]) != want;
			}
	for (size_t i = 0; i < (size_t)T * ld; i++)
		unwritten += kc_bits(cat[i]) == 0xffff;
	CHECK(!bad && !unwritten, "T %d n %d outs %d/%d/%d grid %ux%u x %d: %d wrong, %d unwritten",
	      T, n, outs[0], n > 1 ? outs[1] : 0, n > 2 ? outs[2] : 0, gx, gy, threads, bad,
	      unwritten);

	/* cat [T, ld] . W_cat [ld, in] = sum_j round(dy_j) W_j, W_cat the W_j stacked in
	 * member order (as proj_wcat_get copies them) */
	const int in = 5;
	std::vector<float> wcat((size_t)ld * in);
	for (float &v : wcat)
		v = (float)(2 * bk_rng_uniform(&rng) - 1);
	double worst = 0;
	for (int t = 0; t < T; t++)
		for (int i = 0; i < in; i++) {
			double a = 0, b = 0;
			for (int k = 0; k < ld; k++)
				a += (double)__bfloat162float(cat[(size_t)t * ld + k]) *
				     wcat[(size_t)k * in + i];
			for (int j = 0, row0 = 0; j < n; row0 += outs[j], j++)
				for (int o = 0; o < outs[j]; o++)
					b += (double)kc_bf16(dy[j][(size_t)t * outs[j] + o]) *
					     wcat[(size_t)(row0 + o) * in + i];
			worst = fmax(worst, fabs(a - b));
		}
	CHECK(worst < 1e-9, "T %d n %d: cat . W_cat differs from sum_j dy_j W_j by %g", T, n,
	      worst);
}

static void test_batches(int n, const int *outs, const int *lora, int want_nb,
			 const int *want)
{
	int batch[BK_PROJ_MAX] = { -1, -1, -1 };
	int nb = proj_batches(outs, lora, n, batch);
	int same = nb == want_nb;
	for (int j = 0; j < n; j++)
		same &= batch[j] == want[j];
	CHECK(same, "proj_batches outs %d/%d/%d lora %d%d%d: %d batches (%d %d %d), want %d (%d %d %d)",
	      outs[0], n > 1 ? outs[1] : 0, n > 2 ? outs[2] : 0, lora[0], n > 1 ? lora[1] : 0,
	      n > 2 ? lora[2] : 0, nb, batch[0], batch[1], batch[2], want_nb, want[0],
	      n > 1 ? want[1] : -1, n > 2 ? want[2] : -1);
}

static void test_ptrs(void)
{
	int x[PROJ_PTRS];
	proj_ptrs v = {};
	for (int i = 0; i < 6; i++)
		v.p[i] = &x[i];
	std::vector<const void *> h(PROJ_PTRS + 1, &rng);
	dbuf<const void *> ddst(h);
	BK_LAUNCH(proj_ptrs_kernel, 1, 32, 0, bk_cuda_stream(), ddst.p, v, 6);
	std::vector<const void *> dst = ddst.get();
	int ok = 1;
	for (int i = 0; i < 6; i++)
		ok &= dst[i] == &x[i];
	for (int i = 6; i <= PROJ_PTRS; i++)
		ok &= dst[i] == (const void *)&rng;
	CHECK(ok, "proj_ptrs_kernel: the table of 6 pointers");
}

int main(void)
{
	bk_diag_init("test_proj3");
	bk_rng_seed(&rng, 20261201);
	const int qkv[3] = { 24, 8, 8 }, odd[3] = { 33, 7, 1 }, gu[2] = { 17, 17 }, one[1] = { 9 };
	test_interleave(5, 3, qkv, 1, 1, 32);   /* one block: every row and column by stride */
	test_interleave(5, 3, qkv, 2, 3, 32);
	test_interleave(3, 3, odd, 1, 2, 32);
	test_interleave(7, 3, odd, 3, 7, 32);   /* more threads than columns */
	test_interleave(4, 2, gu, 1, 1, 32);
	test_interleave(6, 1, one, 1, 4, 32);
	test_interleave(3, 3, qkv, 0, 0, 0);    /* proj_interleave_grid's grid */
	const int big[3] = { 300, 40, 40 };     /* more than one block of 256 columns */
	test_interleave(2, 3, big, 0, 0, 0);
	test_interleave(3, 3, big, 1, 2, 64);

	const int tl[3] = { 2048, 256, 256 }, mha[3] = { 64, 64, 64 }, gup[2] = { 5632, 5632 };
	const int l111[3] = { 1, 1, 1 }, l101[3] = { 1, 0, 1 }, l011[3] = { 0, 1, 1 };
	const int l110[3] = { 1, 1, 0 }, l01[2] = { 0, 1 };
	const int b011[3] = { 0, 1, 1 }, b012[3] = { 0, 1, 2 }, b000[3] = { 0, 0, 0 };
	const int b001[3] = { 0, 0, 1 }, b01[2] = { 0, 1 }, b00[2] = { 0, 0 };
	test_batches(3, tl, l111, 2, b011);  /* GQA: {q}, {k, v} */
	test_batches(3, tl, l101, 3, b012);  /* k without LoRA: beta 0 for k alone */
	test_batches(3, tl, l011, 2, b011);  /* q alone anyway */
	test_batches(3, mha, l111, 1, b000); /* no GQA: one launch */
	test_batches(3, mha, l110, 2, b001);
	test_batches(2, gup, l111, 1, b00);  /* gate/up */
	test_batches(2, gup, l01, 2, b01);
	test_batches(1, one, l111, 1, b000); /* o, down */
	test_ptrs();
	return bk_test_done("test_proj3");
}
