/* test_act_kernels.cc - the device code of BK_ACT=bf16 (gpu/cuda/cuda_act_kernels.cuh and the
 * bf16 entry points of gpu/cuda/cuda_attention_tc.cu), launched on its own on the emulated
 * GPU (make emu; tests/emu/kernel_check.h; run by tests/t0950-emu.sh), against the host
 * twin with the bounds written in gpu/cuda/cuda_act.cuh (u = 2^-8):
 *   rmsnorm_forward_act, rope_forward_act, glu_forward_act and glu_backward_act (SwiGLU
 *   and GeGLU) element by element against bk_ops_host's fp32 ops, and the dropout of a
 *   bf16 x against the host's mask (bk_crng_uniform, which the device port equals bit for
 *   bit: common/rng.c);
 *   the tensor-core attention on bf16 q/k/v/prefix against the same kernels on fp32
 *   inputs holding the same (bf16) values: the bf16 forward's out must be the fp32
 *   forward's rounded to bf16, bit for bit, and lse the same bits (the shared-memory
 *   tiles are the same); the bf16 backward must equal the fp32 backward run with that
 *   rounded out, bit for bit (only D_i reads out); and both against the host twin with
 *   the tensor-core bounds plus one rounding (u |out|).
 * Not the projections (cuBLAS: tests/gpu/check_act.c on a GPU), not the hardware's
 * rounding or speed.  A broken kernel fails it: the rope's sign, a GLU reading the fp32
 * gate instead of the rounded one (the bound is then still met, but the exact comparison
 * below of h against f(round g) round u is not), a stage reading the wrong row, D_i from
 * the wrong buffer. */
#include "tests/emu/kernel_check.h"
#include "gpu/cuda/cuda_attention_tc.h"
#include "tests/gpu/gpu_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

extern "C" {
#include "common/rng.h"
}

// the kernels (a namespace of their own: cuda_ops.cu in libbakery.a has them too); the
// attention is libbakery.a's (bk_cuda_attention_tc_*)
namespace act {
#include "gpu/cuda/cuda_act_kernels.cuh"
}
using namespace act;

// ---- the test ----

extern "C" void bk_diag_init(const char *argv0);

static const double U = 0x1p-8; // one bf16 rounding

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static float urand(void) /* [-1, 1) */
{
	rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
	return (float)((double)(rs >> 11) * 0x1p-53 * 2 - 1);
}
static float bf(float x) { return bk_bf16_to_f32(bk_f32_to_bf16(x)); }
static std::vector<float> rnd(size_t n, float scale, bool bf16)
{
	std::vector<float> x(n + 1);
	for (size_t i = 0; i < n; i++)
		x[i] = bf16 ? bf(scale * urand()) : scale * urand();
	return x;
}
static std::vector<__nv_bfloat16> to_b(const std::vector<float> &x)
{
	std::vector<__nv_bfloat16> b(x.size());
	for (size_t i = 0; i < x.size(); i++)
		b[i] = bk_f32_to_bf16(x[i]);
	return b;
}
static std::vector<float> from_b(const std::vector<__nv_bfloat16> &b)
{
	std::vector<float> x(b.size());
	for (size_t i = 0; i < b.size(); i++)
		x[i] = bk_bf16_to_f32(b[i]);
	return x;
}

static int n_fail, n_lines;

/* one line: the worst ratio |got - want| / bound_i over n elements (bound_i from fn) */
template <typename F>
static void check(const char *label, const float *got, const float *want, size_t n, F bound)
{
	double worst = 0, werr = 0;
	size_t wi = 0;
	int nan = 0;
	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)got[i] - want[i]), b = bound(i);
		if (isnan(got[i]) || isnan(e))
			nan++;
		else if (e / b > worst)
			worst = e / b, werr = e, wi = i;
	}
	int ok = !nan && worst <= 1.0;
	n_lines++;
	n_fail += !ok;
	printf("%-44s worst err/bound %-8.3g (err %.3g at %zu)%s %s\n", label, worst, werr, wi,
	       nan ? " NaN" : "", ok ? "ok" : "FAIL");
}

/* bit-for-bit equality of two float arrays */
static void same(const char *label, const float *a, const float *b, size_t n)
{
	size_t bad = 0, first = 0;
	for (size_t i = 0; i < n; i++)
		if (memcmp(&a[i], &b[i], 4) && !bad++)
			first = i;
	n_lines++;
	n_fail += bad > 0;
	if (bad)
		printf("%-44s %zu of %zu differ (first at %zu: %.9g vs %.9g) FAIL\n", label, bad, n,
		       first, (double)a[first], (double)b[first]);
	else
		printf("%-44s bit-identical over %zu ok\n", label, n);
}

static void test_rmsnorm(int T, int H)
{
	std::vector<float> x = rnd((size_t)T * H, 2.0f, false), w = rnd(H, 1.5f, true);
	std::vector<float> oh((size_t)T * H), rh(T);
	bk_weight hw = { 1, H, w.data(), BK_WEIGHT_PLAIN };
	bk_ops_host.rmsnorm_forward(oh.data(), rh.data(), x.data(), &hw, T, H, 1e-5f);
	dbuf<float> dx(x), drg((size_t)T);
	dbuf<__nv_bfloat16> dog((size_t)T * H), dwb(to_b(w));
	BK_LAUNCH(act_rmsnorm_kernel, T, 256, 0, bk_cuda_stream(), dog.p, drg.p, dx.p, dwb.p, H,
		  1e-5f);
	std::vector<float> o = from_b(dog.get()), rg = drg.get();
	double mh = gc_maxabs(oh.data(), oh.size());
	char l[64];
	snprintf(l, sizeof l, "rmsnorm_act T=%d H=%d out", T, H);
	check(l, o.data(), oh.data(), oh.size(), [&](size_t i) {
		return (U + 1e-5) * fabs(oh[i]) + 1e-6 * mh;
	});
	snprintf(l, sizeof l, "rmsnorm_act T=%d H=%d rstd", T, H);
	check(l, rg.data(), rh.data(), T, [&](size_t i) { return 1e-5 * fabs(rh[i]); });
}

static void test_rope(int T, int n, int D)
{
	size_t N = (size_t)T * n * D;
	std::vector<float> x = rnd(N, 3.0f, false), inv(D / 2), xh = x;
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	std::vector<int32_t> pos(T);
	for (int t = 0; t < T; t++)
		pos[t] = 37 * t + 5;
	bk_ops_host.rope_forward(xh.data(), pos.data(), inv.data(), T, n, D);
	std::vector<float> x0 = x;
	size_t total = (size_t)T * n * (D / 2);
	dbuf<__nv_bfloat16> dog(N);
	dbuf<float> dx(x), dinv(inv);
	dbuf<int32_t> dpos(pos);
	BK_LAUNCH(act_rope_kernel, bk_cuda_blocks(total, 256), 256, 0, bk_cuda_stream(), dog.p, dx.p,
		  dpos.p, dinv.p, T, n, D);
	std::vector<float> o = from_b(dog.get());
	x = dx.get();
	double mx = gc_maxabs(x.data(), N);
	char l[64];
	snprintf(l, sizeof l, "rope_act T=%d n=%d D=%d", T, n, D);
	check(l, o.data(), xh.data(), N, [&](size_t i) { return U * fabs(xh[i]) + 1e-5 * mx; });
	snprintf(l, sizeof l, "rope_act T=%d n=%d D=%d input kept", T, n, D);
	same(l, x.data(), x0.data(), N);
}

/* f, f', f'' in double (silu or gelu_tanh) by the formulas and central differences */
static double glu_f(double g, int geglu)
{
	if (geglu)
		return 0.5 * g * (1 + tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
	return g / (1 + exp(-g));
}
static double glu_d1(double g, int ge) { return (glu_f(g + 1e-4, ge) - glu_f(g - 1e-4, ge)) / 2e-4; }
static double glu_d2(double g, int ge)
{
	return (glu_f(g + 1e-3, ge) - 2 * glu_f(g, ge) + glu_f(g - 1e-3, ge)) / 1e-6;
}

static void test_glu(size_t n, int geglu)
{
	const char *nm = geglu ? "geglu" : "swiglu";
	std::vector<float> g = rnd(n, 6.0f, false), u = rnd(n, 2.0f, false), dh = rnd(n, 1.0f, false);
	std::vector<float> hh(n), dgh(n, 0.0f), duh(n, 0.0f);
	(geglu ? bk_ops_host.geglu_forward : bk_ops_host.swiglu_forward)(hh.data(), g.data(),
									  u.data(), n);
	(geglu ? bk_ops_host.geglu_backward : bk_ops_host.swiglu_backward)(
		dgh.data(), duh.data(), dh.data(), g.data(), u.data(), n);
	dbuf<__nv_bfloat16> dhb(n), dgb(n), dub(n);
	dbuf<float> dgi(g), dui(u), ddh(dh), ddg(std::vector<float>(n, 0.0f)),
		ddu(std::vector<float>(n, 0.0f));
	BK_LAUNCH(act_glu_forward_kernel, 4, 256, 0, bk_cuda_stream(), dhb.p, dgb.p, dub.p, dgi.p,
		  dui.p, n, geglu);
	BK_LAUNCH(act_glu_backward_kernel, 4, 256, 0, bk_cuda_stream(), ddg.p, ddu.p, ddh.p, dgb.p,
		  dub.p, n, geglu);
	std::vector<float> h = from_b(dhb.get()), gs = from_b(dgb.get()), us = from_b(dub.get());
	std::vector<float> dg = ddg.get(), du = ddu.get();
	char l[64];
	// the saved gate and up are the inputs rounded, exactly
	std::vector<float> gr(n), ur(n), hr(n);
	for (size_t i = 0; i < n; i++)
		gr[i] = bf(g[i]), ur[i] = bf(u[i]);
	snprintf(l, sizeof l, "%s_act saved gate = round(gate)", nm);
	same(l, gs.data(), gr.data(), n);
	snprintf(l, sizeof l, "%s_act saved up = round(up)", nm);
	same(l, us.data(), ur.data(), n);
	// h = round(f(round g) round u), f in fp32 as the host's formula
	std::vector<float> hrr(n);
	(geglu ? bk_ops_host.geglu_forward : bk_ops_host.swiglu_forward)(hrr.data(), gr.data(),
									  ur.data(), n);
	for (size_t i = 0; i < n; i++)
		hr[i] = bf(hrr[i]);
	snprintf(l, sizeof l, "%s_act h = round(f(round g) round u)", nm);
	check(l, h.data(), hr.data(), n, [&](size_t i) { return 1e-6 * fabs(hr[i]) + 1e-30; });
	double mh = gc_maxabs(hh.data(), n), mdg = gc_maxabs(dgh.data(), n);
	double mdu = gc_maxabs(duh.data(), n);
	snprintf(l, sizeof l, "%s_act h vs host", nm);
	check(l, h.data(), hh.data(), n, [&](size_t i) {
		double f = glu_f(g[i], geglu), k = f != 0 ? fabs(g[i] * glu_d1(g[i], geglu) / f) : 0;
		return 1.01 * U * (2 + k) * fabs(hh[i]) + 1e-6 * mh;
	});
	snprintf(l, sizeof l, "%s_act dgate vs host", nm);
	check(l, dg.data(), dgh.data(), n, [&](size_t i) {
		double d1 = glu_d1(g[i], geglu), d2 = glu_d2(g[i], geglu);
		return 1.01 * U * fabs(dh[i]) *
			       (fabs(u[i]) * (fabs(d1) + fabs(g[i] * d2)) + fabs(g[i] * d1)) +
		       1e-6 * mdg;
	});
	snprintf(l, sizeof l, "%s_act dup vs host", nm);
	check(l, du.data(), duh.data(), n, [&](size_t i) {
		return 1.01 * U * fabs(dh[i]) * fabs(g[i] * glu_d1(g[i], geglu)) + 1e-6 * mdu;
	});
}

static void test_dropout(size_t n, float p, uint64_t key)
{
	std::vector<float> x = rnd(n, 2.0f, true);
	dbuf<__nv_bfloat16> dxb(to_b(x)), dxd(n);
	BK_LAUNCH(act_dropout_kernel, 3, 256, 0, bk_cuda_stream(), dxd.p, dxb.p, n, p,
		  1.0f / (1.0f - p), key);
	std::vector<float> got = from_b(dxd.get()), want(n);
	for (size_t i = 0; i < n; i++) // the host twin's mask (host_ops.c lora dropout)
		want[i] = bk_crng_uniform(key, i) >= p ? bf(x[i] * (1.0f / (1.0f - p))) : 0.0f;
	char l[64];
	snprintf(l, sizeof l, "dropout_act n=%zu p=%g", n, (double)p);
	same(l, got.data(), want.data(), n);
}

static void test_attention(const std::vector<int> &lens, int NH, int NKV, int D, int P,
			   bk_attn ap, bool bwd)
{
	int S = (int)lens.size();
	std::vector<int32_t> cu = kc_cu_seqlens(lens);
	int T = cu[S];
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, np = (size_t)P * NKV * D;
	size_t nl = (size_t)NH * T;
	char sz[96], l[160];
	snprintf(sz, sizeof sz, "attn_act T=%d S=%d NH=%d/%d D=%d P=%d c%g W%d", T, S, NH, NKV, D, P,
		 (double)ap.softcap, ap.window);
	std::vector<float> q = rnd(nq, 1.5f, true), k = rnd(nk, 1.5f, true), v = rnd(nk, 1.0f, true);
	std::vector<float> pk = rnd(np, 1.5f, true), pv = rnd(np, 1.0f, true);
	// on the device: fp32 inputs (the same bf16 values) and bf16 ones; outputs NaN
	dbuf<float> dq(q), dk(k), dv(v), dpk(pk), dpv(pv), dof(nq), dlf(nl), dlb(nl);
	dbuf<__nv_bfloat16> dq16(to_b(q)), dk16(to_b(k)), dv16(to_b(v)), dpk16(to_b(pk)),
		dpv16(to_b(pv)), dob16(nq);
	dbuf<int32_t> dcu(cu);
	// fp32 kernel, bf16 kernel, host twin
	std::vector<float> oh(nq + 1), lh(nl + 1);
	bk_cuda_attention_tc_forward(dof, dlf, dq, dk, dv, dcu, S, T, NH, NKV, D, P ? dpk.p : NULL,
				     P ? dpv.p : NULL, P, &ap);
	bk_cuda_attention_tc_forward_bf16(dob16, dlb, dq16, dk16, dv16, dcu, S, T, NH, NKV, D,
					  P ? dpk16.p : NULL, P ? dpv16.p : NULL, P, &ap);
	bk_ops_host.attention_forward(oh.data(), lh.data(), q.data(), k.data(), v.data(), cu.data(),
				      S, T, NH, NKV, D, P ? pk.data() : NULL, P ? pv.data() : NULL,
				      P, &ap);
	std::vector<float> of = dof.get(), lf = dlf.get(), lb = dlb.get();
	std::vector<__nv_bfloat16> obb = dob16.get();
	std::vector<float> ob = from_b(obb), ofr(nq);
	for (size_t i = 0; i < nq; i++)
		ofr[i] = bf(of[i]);
	snprintf(l, sizeof l, "%s out = round(fp32 kernel's)", sz);
	same(l, ob.data(), ofr.data(), nq);
	snprintf(l, sizeof l, "%s lse = fp32 kernel's", sz);
	same(l, lb.data(), lf.data(), nl);
	double mv = gc_maxabs(v.data(), nk);
	if (P && gc_maxabs(pv.data(), np) > mv)
		mv = gc_maxabs(pv.data(), np);
	snprintf(l, sizeof l, "%s out vs host", sz);
	check(l, ob.data(), oh.data(), nq, [&](size_t i) {
		return 1.01 * U * mv + 1e-5 + U * fabs(oh[i]);
	});
	snprintf(l, sizeof l, "%s lse vs host", sz);
	check(l, lb.data(), lh.data(), nl, [&](size_t) { return 1e-4; });
	if (!bwd)
		return;
	std::vector<float> go = rnd(nq, 1.0f, true);
	std::vector<float> dq0 = rnd(nq, 0.25f, true), dk0 = rnd(nk, 0.25f, true);
	std::vector<float> dv0 = rnd(nk, 0.25f, true);
	std::vector<float> dqh = dq0, dkh = dk0, dvh = dv0;
	dbuf<float> dgo(go), dob(ob) /* the rounded out */, ddqf(dq0), ddkf(dk0), ddvf(dv0),
		ddqb(dq0), ddkb(dk0), ddvb(dv0);
	bk_cuda_attention_tc_backward(ddqf, ddkf, ddvf, dgo, dq, dk, dv, dob, dlf, dcu, S, T, NH,
				      NKV, D, &ap);
	bk_cuda_attention_tc_backward_bf16(ddqb, ddkb, ddvb, dgo, dq16, dk16, dv16, dob16, dlb, dcu,
					   S, T, NH, NKV, D, &ap);
	std::vector<float> dqf = ddqf.get(), dkf = ddkf.get(), dvf = ddvf.get();
	std::vector<float> dqb = ddqb.get(), dkb = ddkb.get(), dvb = ddvb.get();
	bk_ops_host.attention_backward(dqh.data(), dkh.data(), dvh.data(), go.data(), q.data(),
				       k.data(), v.data(), oh.data(), lh.data(), cu.data(), S, T, NH,
				       NKV, D, &ap);
	snprintf(l, sizeof l, "%s dq = fp32 kernel's", sz);
	same(l, dqb.data(), dqf.data(), nq);
	snprintf(l, sizeof l, "%s dk = fp32 kernel's", sz);
	same(l, dkb.data(), dkf.data(), nk);
	snprintf(l, sizeof l, "%s dv = fp32 kernel's", sz);
	same(l, dvb.data(), dvf.data(), nk);
	double bq = 2e-2 * gc_maxerr(dqh.data(), dq0.data(), nq);
	double bk = 2e-2 * gc_maxerr(dkh.data(), dk0.data(), nk);
	double bv = 2e-2 * gc_maxerr(dvh.data(), dv0.data(), nk);
	snprintf(l, sizeof l, "%s dq vs host", sz);
	check(l, dqb.data(), dqh.data(), nq, [&](size_t) { return bq; });
	snprintf(l, sizeof l, "%s dk vs host", sz);
	check(l, dkb.data(), dkh.data(), nk, [&](size_t) { return bk; });
	snprintf(l, sizeof l, "%s dv vs host", sz);
	check(l, dvb.data(), dvh.data(), nk, [&](size_t) { return bv; });
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	if (argc > 1)
		die("usage: test_act_kernels (no arguments)");
	clock_t c0 = clock();
	test_rmsnorm(5, 200);
	test_rmsnorm(3, 1024);
	test_rope(7, 3, 64);
	test_rope(4, 2, 128);
	test_glu(3000, 0);
	test_glu(3000, 1);
	test_dropout(2000, 0.1f, 0x1234);
	test_dropout(700, 0.5f, 99);
	bk_attn a64 = bk_attn_default(64), a128 = bk_attn_default(128);
	bk_attn capwin = { 0.2f, 3.0f, 40 };
	test_attention({ 1, 7, 70, 50 }, 4, 2, 64, 0, a64, true);   // GQA 2, tiles across sequences
	test_attention({ 33, 64 }, 4, 1, 128, 0, capwin, true);     // softcap + window, GQA 4
	test_attention({ 20, 45 }, 2, 2, 64, 19, a64, false);       // prefix (forward only)
	test_attention({ 65, 3 }, 2, 2, 128, 0, a128, true);        // NH = NKV: dk/dv directly
	printf("test_act_kernels: %d checks, %d failed (%.1f s CPU)\n", n_lines, n_fail,
	       (double)(clock() - c0) / CLOCKS_PER_SEC);
	return n_fail ? 1 : 0;
}
