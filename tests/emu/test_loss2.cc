/* test_loss2.cc - the v2 loss kernels (BK_LOSS=v2) of gpu/cuda/cuda_loss2.cuh, their own
 * source launched on the emulated GPU (make emu; tests/emu/kernel_check.h), run by
 * tests/t0950-emu.sh.  The logits the cuBLAS GEMM would give are computed here (double
 * dot products rounded to float, then capped and divided by T as loss.c does), and
 * d_hidden = G W / T from the kernels' bf16 dlogits in double.
 *
 * Checked against the host twin (gpu/host/loss.c), with and without a final softcap, at
 * temperatures 1 and 1.7, V below and above the block's 256 threads:
 *   exact (teacher hidden rows, teacher log-probs) and top-k (K = 5, K = V): the loss and
 *   each row's KL within 1e-5 relative (the same fp32 logits up to summation order;
 *   maxima fp32, sums double on both sides), d_hidden within 1e-2 of max|host| (dlogits
 *   in bf16, 2^-9 each);
 *   the validation kernel: rest and P = sum p + rest as loss.c uses them (K = V: rest 0),
 *   no flag on good fields, the flag on each bad one (an id out of range, negative, twice;
 *   rest 1.5, NaN; a log-prob > 1e-4, NaN).
 * Not checked here: cuBLAS, the host side of cuda_loss.cu (row blocks, workspace, the one
 * copy back), the hardware's rounding, speed (tests/gpu/check_loss.c does those). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

extern "C" {
#include "common/rng.h"
#include "gpu/host/loss.h"
void bk_diag_init(const char *argv0);
}

#include "tests/emu/kernel_check.h"
#include "tests/gpu/gpu_check.h"

// the kernels (a namespace of their own: cuda_loss.cu in libbakery.a has them too)
namespace loss2 {
#include "gpu/cuda/cuda_loss2.cuh"
}
using namespace loss2;

static float bf16_to_float(__nv_bfloat16 b) { return __bfloat162float(b); }

// ---- the test ----

static int n_checks, n_failed;

static void check(bool ok, const char *what, double err, double bound)
{
	n_checks++;
	if (!ok) {
		n_failed++;
		printf("FAIL %s: error %.3g, bound %.3g\n", what, err, bound);
	}
}

static double relerr(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-12); }

static bk_rng rng;

static std::vector<float> rand_vec(size_t n, double scale)
{
	std::vector<float> x(n);
	for (auto &v : x)
		v = (float)((2 * bk_rng_uniform(&rng) - 1) * scale);
	return x;
}

// u [n,V] = cap(x W^T) / T, the GEMM's fp32 logits then cap_scale_kernel's arithmetic
static std::vector<float> logits(const std::vector<float> &x, const std::vector<float> &w, int n,
				 int h, int v, float t, float cap)
{
	std::vector<float> u((size_t)n * v);
	for (int r = 0; r < n; r++)
		for (int j = 0; j < v; j++) {
			double acc = 0;
			for (int c = 0; c < h; c++)
				acc += (double)x[(size_t)r * h + c] * w[(size_t)j * h + c];
			float z = (float)acc;
			u[(size_t)r * v + j] = (cap > 0 ? tanhf(z / cap) * cap : z) / t;
		}
	return u;
}

// d_hidden [n,H] = G [n,V] W / T in double
static std::vector<float> backward(const std::vector<__nv_bfloat16> &g, const std::vector<float> &w,
				   int n, int h, int v, float t)
{
	std::vector<float> d((size_t)n * h);
	for (int r = 0; r < n; r++)
		for (int c = 0; c < h; c++) {
			double acc = 0;
			for (int j = 0; j < v; j++)
				acc += (double)bf16_to_float(g[(size_t)r * v + j]) * w[(size_t)j * h + c];
			d[(size_t)r * h + c] = (float)(acc / t);
		}
	return d;
}

// the loss and row KL of a kernel's kl [n] with the host twin's row weights
static double loss_of(const std::vector<double> &kl, const int32_t *so, int n, int ns)
{
	std::vector<float> w(n);
	bk_loss_row_weights(so, n, ns, w.data());
	double l = 0;
	for (int r = 0; r < n; r++)
		l += w[r] * kl[r];
	return l;
}

static void compare(const char *what, double lg, double lr, const std::vector<double> &klg,
		    const float *klr, const std::vector<float> &dg, const float *dr, int n, int h)
{
	char name[200];
	snprintf(name, sizeof name, "%s: loss", what);
	check(relerr(lg, lr) < 1e-5 && lr > 0, name, relerr(lg, lr), 1e-5);
	double e = 0;
	for (int r = 0; r < n; r++)
		e = fmax(e, fabs(klg[r] - klr[r]) / fmax(fabs(klr[r]), 1e-4));
	snprintf(name, sizeof name, "%s: row KL", what);
	check(e < 1e-5, name, e, 1e-5);
	double de = gc_relerr(dg.data(), dr, (size_t)n * h, 1e-12);
	snprintf(name, sizeof name, "%s: d_hidden", what);
	check(de < 1e-2, name, de, 1e-2);
}

static void test_case(int n, int h, int v, int k, float t, float cap, uint64_t seed)
{
	bk_rng_seed(&rng, seed);
	char what[160];
	std::vector<float> w = rand_vec((size_t)v * h, 1.0), hs = rand_vec((size_t)n * h, 1.5),
			   ht = rand_vec((size_t)n * h, 1.5);
	std::vector<int32_t> so(n);
	for (int r = 0; r < n; r++)
		so[r] = r % 3 == 2 ? 1 : r % 4 == 0 ? 2 : 0;
	int ns = 3;
	std::vector<float> wr(n);
	bk_loss_row_weights(so.data(), n, ns, wr.data());
	float tc = cap > 0 ? t / cap : 0.0f;
	std::vector<float> dref((size_t)n * h), klr(n);
	std::vector<double> kl(n, NAN);
	std::vector<__nv_bfloat16> g((size_t)n * v);

	// exact, teacher hidden
	std::vector<float> us = logits(hs, w, n, h, v, t, cap), ut = logits(ht, w, n, h, v, t, cap);
	double lr = bk_loss_kl_exact(hs.data(), w.data(), ht.data(), NULL, so.data(), n, ns, h, v, 7,
				     t, cap, dref.data(), klr.data());
	dbuf<float> dus(us), dut(ut), dwr(wr);
	{
		dbuf<double> dkl((size_t)n);
		dbuf<__nv_bfloat16> dg((size_t)n * v);
		BK_LAUNCH(kl_exact_row_kernel, n, LOSS_THREADS, 0, bk_cuda_stream(), dus.p, dut.p,
			  (const float *)NULL, v, dwr.p, tc, dkl.p, dg.p);
		kl = dkl.get(), g = dg.get();
	}
	snprintf(what, sizeof what, "exact hidden n=%d V=%d T=%g cap=%g", n, v, (double)t, (double)cap);
	compare(what, loss_of(kl, so.data(), n, ns), lr, kl, klr.data(), backward(g, w, n, h, v, t),
		dref.data(), n, h);

	// exact, teacher log-probs
	std::vector<float> tl((size_t)n * v);
	bk_teacher_logprobs(ht.data(), w.data(), n, h, v, 7, t, cap, tl.data());
	lr = bk_loss_kl_exact(hs.data(), w.data(), NULL, tl.data(), so.data(), n, ns, h, v, 7, t, cap,
			      dref.data(), klr.data());
	{
		dbuf<float> dtl(tl);
		dbuf<double> dkl((size_t)n);
		dbuf<__nv_bfloat16> dg((size_t)n * v);
		BK_LAUNCH(kl_exact_row_kernel, n, LOSS_THREADS, 0, bk_cuda_stream(), dus.p,
			  (const float *)NULL, dtl.p, v, dwr.p, tc, dkl.p, dg.p);
		kl = dkl.get(), g = dg.get();
	}
	snprintf(what, sizeof what, "exact logp n=%d V=%d T=%g cap=%g", n, v, (double)t, (double)cap);
	compare(what, loss_of(kl, so.data(), n, ns), lr, kl, klr.data(), backward(g, w, n, h, v, t),
		dref.data(), n, h);

	// top-k: the host twin's teacher, validated on the "device", then the row kernel
	size_t nk = (size_t)n * k;
	std::vector<int32_t> ids(nk);
	std::vector<float> lp(nk), rest(n), tu(nk);
	bk_teacher_topk(ht.data(), w.data(), NULL, n, h, v, 7, t, cap, k, ids.data(), lp.data(),
			rest.data());
	if (k == v)
		for (int r = 0; r < n; r++)
			rest[r] = 3e-7f; // rounding-size rest with K = V: dropped
	int kp = 1;
	while (kp < k)
		kp <<= 1;
	dbuf<int32_t> dids(ids);
	dbuf<float> dlp(lp), drest(rest);
	dbuf<double> dprest((size_t)n), dptot((size_t)n);
	dbuf<unsigned long long> dflag(std::vector<unsigned long long>(1, 0));
	BK_LAUNCH(topk_validate_kernel, n, LOSS_THREADS, (size_t)kp * sizeof(int), bk_cuda_stream(),
		  dids.p, dlp.p, drest.p, k, kp, v, dprest.p, dptot.p, dflag.p);
	std::vector<double> prest = dprest.get(), ptot = dptot.get();
	unsigned long long flag = dflag.get()[0];
	double perr = 0;
	for (int r = 0; r < n; r++) {
		double p0 = k == v ? 0.0 : rest[r], s = p0;
		for (int i = 0; i < k; i++)
			s += exp((double)lp[(size_t)r * k + i]);
		perr = fmax(perr, fabs(prest[r] - p0) + fabs(ptot[r] - s));
	}
	snprintf(what, sizeof what, "validate n=%d V=%d K=%d: flag on good fields", n, v, k);
	check(flag == 0, what, (double)flag, 0);
	snprintf(what, sizeof what, "validate n=%d V=%d K=%d: rest and P", n, v, k);
	check(perr < 1e-12, what, perr, 1e-12);
	lr = bk_loss_kl_topk(hs.data(), w.data(), ids.data(), lp.data(), rest.data(), so.data(), n,
			     ns, h, v, k, 7, t, cap, dref.data(), klr.data());
	{
		dbuf<float> dum(us), dtu(tu); // the kernel masks the ids in place
		dbuf<double> dkl((size_t)n);
		dbuf<__nv_bfloat16> dg((size_t)n * v);
		BK_LAUNCH(kl_topk_row_kernel, n, LOSS_THREADS, 0, bk_cuda_stream(), dum.p, v, dids.p,
			  dlp.p, k, dtu.p, dprest.p, dptot.p, dwr.p, tc, dkl.p, dg.p);
		kl = dkl.get(), g = dg.get();
	}
	snprintf(what, sizeof what, "top-k n=%d V=%d K=%d T=%g cap=%g", n, v, k, (double)t,
		 (double)cap);
	compare(what, loss_of(kl, so.data(), n, ns), lr, kl, klr.data(), backward(g, w, n, h, v, t),
		dref.data(), n, h);
}

// each bad field alone sets the flag
static void test_validate_bad(void)
{
	enum { N = 3, V = 40, K = 4 };
	const char *names[] = {"id out of range", "negative id", "id twice", "rest 1.5", "rest NaN",
			       "log-prob 0.5", "log-prob NaN"};
	for (int c = 0; c < 7; c++) {
		int32_t ids[N * K];
		float lp[N * K], rest[N];
		for (int r = 0; r < N; r++) {
			for (int i = 0; i < K; i++)
				ids[r * K + i] = 5 * i + r, lp[r * K + i] = -1.5f - i;
			rest[r] = 0.25f;
		}
		switch (c) {
		case 0: ids[1 * K + 3] = V; break;
		case 1: ids[2 * K + 0] = -1; break;
		case 2: ids[1 * K + 0] = ids[1 * K + 3]; break;
		case 3: rest[2] = 1.5f; break;
		case 4: rest[0] = NAN; break;
		case 5: lp[1 * K + 1] = 0.5f; break;
		case 6: lp[2 * K + 2] = NAN; break;
		}
		dbuf<int32_t> dids(std::vector<int32_t>(ids, ids + N * K));
		dbuf<float> dlp(std::vector<float>(lp, lp + N * K)), drest(std::vector<float>(rest, rest + N));
		dbuf<double> dprest(N), dptot(N);
		dbuf<unsigned long long> dflag(std::vector<unsigned long long>(1, 0));
		BK_LAUNCH(topk_validate_kernel, N, LOSS_THREADS, 4 * sizeof(int), bk_cuda_stream(),
			  dids.p, dlp.p, drest.p, K, 4, V, dprest.p, dptot.p, dflag.p);
		unsigned long long flag = dflag.get()[0];
		char what[80];
		snprintf(what, sizeof what, "validate: %s sets the flag", names[c]);
		check(flag == 1, what, (double)flag, 1);
	}
}

int main(void)
{
	bk_diag_init("test_loss2");
	for (int ci = 0; ci < 2; ci++) {
		float cap = ci ? 2.0f : 0.0f; // the logits reach about +-4: a cap of 2 bends them
		test_case(7, 8, 37, 5, 1.0f, cap, 1);
		test_case(5, 6, 300, 5, 1.7f, cap, 2);
		test_case(4, 5, 37, 37, 1.0f, cap, 3);
	}
	test_validate_bad();
	printf("test_loss2: %d checks, %d failed\n", n_checks, n_failed);
	return n_failed ? 1 : 0;
}
