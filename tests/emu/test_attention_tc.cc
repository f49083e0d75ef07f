/* test_attention_tc.cc - the tensor-core attention of gpu/cuda/cuda_attention_tc.cu on the
 * emulated GPU (make emu: its mma.sync and ldmatrix .trans decode their fragments by the
 * PTX layout; run by tests/t0950-emu.sh), against the host twin: forward out / lse and
 * backward dq / dk / dv on small packed shapes (odd lengths, tiles spanning sequences,
 * GQA 4/2, 4/1, 2/1 and NH = NKV (dk/dv added directly, no reduction), D 64, 128 and 256
 * (its 32-key forward tiles with Q from shared memory, 16-key dq tiles, dk/dv in two
 * column halves), a prefix, softcap (Gemma 2's 50 at D = 256) and sliding window), and
 * the tile schedule of tc_sched_kernel (a permutation, the work non-increasing).  This
 * checks the kernels' indexing, masks, online softmax, fragment packing, barriers and the
 * GQA reduction without a GPU; not the hardware's rounding, its fragment layout itself,
 * races between blocks under true concurrency or speed (tests/gpu/check_attention_tc.c
 * does those on a GPU).
 * Inputs are rounded to bf16 first, so the only bf16 error left is P and dS rounded in
 * the second products: each term off by <= 2^-8 relative, so
 *   out <= 1.01 2^-8 max|v| + 1e-5;   lse <= 1e-4 (fp32 only);
 *   dq, dk, dv <= 2e-2 max|gradient|  (2^-8 of the sums of |terms|, which for these short
 *   sequences are within a few times the largest gradient: a loose bound, as a wrong
 *   index or mask is off by O(1)).
 * Usage: test_attention_tc [LABEL]: only the cases whose label ("T=91 S=3 NH=2/1
 * D=256 ...") contains LABEL, e.g. D=256 (none: an error).  A broken kernel fails it:
 * dropping the column half's offset in dk/dv (output or ldmatrix), reading every warp's Q
 * fragments from row 0 at D = 256, or one column half only, each fail 2 to 6 lines. */
#include "tests/emu/kernel_check.h"
#include "gpu/cuda/cuda_attention_tc.h"
#include "tests/gpu/gpu_check.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

// the file's own source, for tc_sched_kernel: in a namespace, its C entry points renamed
// (libbakery.a has them; the cases below call those)
#define bk_cuda_attention_tc_forward tcsrc_forward
#define bk_cuda_attention_tc_backward tcsrc_backward
#define bk_cuda_attention_tc_supports tcsrc_supports
#define bk_cuda_attention_tc_bf16_ok tcsrc_bf16_ok
#define bk_cuda_attention_tc_forward_bf16 tcsrc_forward_bf16
#define bk_cuda_attention_tc_backward_bf16 tcsrc_backward_bf16
#define bk_cuda_attention_tc_selected tcsrc_selected
#define bk_cuda_attention_forward_sel tcsrc_forward_sel
#define bk_cuda_attention_backward_sel tcsrc_backward_sel
#define bk_cuda_time_ms tcsrc_time_ms
namespace tcsrc {
#include "gpu/cuda/cuda_attention_tc.cu"
}
#undef bk_cuda_attention_tc_forward
#undef bk_cuda_attention_tc_backward
#undef bk_cuda_attention_tc_supports
#undef bk_cuda_attention_tc_bf16_ok
#undef bk_cuda_attention_tc_forward_bf16
#undef bk_cuda_attention_tc_backward_bf16
#undef bk_cuda_attention_tc_selected
#undef bk_cuda_attention_forward_sel
#undef bk_cuda_attention_backward_sel
#undef bk_cuda_time_ms

// ---- the test ----

extern "C" void bk_diag_init(const char *argv0);

static uint64_t rs = 88172645463325252ull;
static float urand(void) /* [-1, 1) */
{
	rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
	return (float)((double)(rs >> 11) * 0x1p-53 * 2 - 1);
}

static std::vector<float> rnd_bf16(size_t n, float scale)
{
	std::vector<float> x(n + 1);
	for (size_t i = 0; i < n; i++)
		x[i] = kc_bf16(scale * urand());
	return x;
}

static int n_fail, n_lines;

static void check(const char *size, const char *what, const float *got, const float *want,
		  size_t n, double bound)
{
	double err = gc_maxerr(got, want, n);
	int ok = err <= bound;
	n_lines++;
	n_fail += !ok;
	printf("%-48s %-3s err %-10.3g bound %-10.3g %s\n", size, what, err, bound,
	       ok ? "ok" : "FAIL");
}

static const char *only; // argv[1]: run only the cases whose label contains it

// tc_sched_kernel's order for packed lengths lens and window W, kind kv, against the work
// of each 64-row tile counted here by brute force: a permutation, the work non-increasing,
// ties the later tile first
static void check_sched(const std::vector<int> &lens, int W, int kv)
{
	int S = (int)lens.size();
	std::vector<int32_t> cu = kc_cu_seqlens(lens);
	int T = cu[S], n = (T + 63) / 64;
	char label[64];
	snprintf(label, sizeof label, "sched T=%d S=%d W%d %s", T, S, W, kv ? "keys" : "queries");
	if (only && !strstr(label, only))
		return;
	std::vector<int> seq(T), work(n, 0), order(n, -1), seen(n, 0);
	for (int s = 0; s < S; s++)
		for (int t = cu[s]; t < cu[s + 1]; t++)
			seq[t] = s;
	for (int x = 0; x < n; x++) { // visible (query, key) pairs with a key / query in range
		int t0 = 64 * x, t1 = min(t0 + 64, T);
		int lo = kv ? t0 : cu[seq[t0]], hi = kv ? cu[seq[t1 - 1] + 1] : t1;
		if (W > 0)
			lo = kv ? lo : max(lo, t0 - W + 1), hi = kv ? min(hi, t1 - 1 + W) : hi;
		work[x] = hi - lo;
	}
	{
		dbuf<int> dorder((size_t)n);
		dbuf<int32_t> dcu(cu);
		BK_LAUNCH(tcsrc::tc_sched_kernel, 1, TC_SCHED_THREADS, (size_t)n * sizeof(int),
			  bk_cuda_stream(), dorder.p, dcu.p, S, T, W, kv);
		order = dorder.get();
	}
	int bad = 0;
	for (int r = 0; r < n; r++) {
		int x = order[r];
		if (x < 0 || x >= n || seen[x]++) {
			bad++;
			continue;
		}
		if (r > 0 && order[r - 1] >= 0 && order[r - 1] < n) {
			int p = order[r - 1];
			bad += work[p] < work[x] || (work[p] == work[x] && p < x);
		}
	}
	n_lines++;
	n_fail += bad > 0;
	printf("%-48s %d tiles, first %d (work %d), %d out of order %s\n", label, n, order[0],
	       order[0] >= 0 && order[0] < n ? work[order[0]] : -1, bad, bad ? "FAIL" : "ok");
}

static void run_case(const std::vector<int> &lens, int NH, int NKV, int D, int P, bk_attn ap,
		     bool bwd)
{
	int S = (int)lens.size();
	std::vector<int32_t> cu = kc_cu_seqlens(lens);
	int T = cu[S];
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, np = (size_t)P * NKV * D;
	size_t nl = (size_t)NH * T;
	char size[96];
	snprintf(size, sizeof size, "T=%d S=%d NH=%d/%d D=%d P=%d c%g W%d", T, S, NH, NKV, D, P,
		 (double)ap.softcap, ap.window);
	if (only && !strstr(size, only))
		return;
	std::vector<float> q = rnd_bf16(nq, 1.5f), k = rnd_bf16(nk, 1.5f), v = rnd_bf16(nk, 1.0f);
	std::vector<float> pk = rnd_bf16(np, 1.5f), pv = rnd_bf16(np, 1.0f);
	std::vector<float> oh(nq + 1), lh(nl + 1);
	bk_ops_host.attention_forward(oh.data(), lh.data(), q.data(), k.data(), v.data(), cu.data(),
				      S, T, NH, NKV, D, P ? pk.data() : NULL,
				      P ? pv.data() : NULL, P, &ap);
	dbuf<float> dq(q), dk(k), dv(v), dpk(pk), dpv(pv), dog(nq), dlg(nl);
	dbuf<int32_t> dcu(cu);
	bk_cuda_attention_tc_forward(dog, dlg, dq, dk, dv, dcu, S, T, NH, NKV, D, P ? dpk.p : NULL,
				     P ? dpv.p : NULL, P, &ap);
	std::vector<float> og = dog.get(), lg = dlg.get();
	double mv = gc_maxabs(v.data(), nk);
	if (P && gc_maxabs(pv.data(), np) > mv)
		mv = gc_maxabs(pv.data(), np);
	check(size, "out", og.data(), oh.data(), nq, 1.01 * 0x1p-8 * mv + 1e-5);
	check(size, "lse", lg.data(), lh.data(), nl, 1e-4);
	if (!bwd)
		return;
	std::vector<float> go = rnd_bf16(nq, 1.0f);
	std::vector<float> dq0 = rnd_bf16(nq, 0.25f), dk0 = rnd_bf16(nk, 0.25f);
	std::vector<float> dv0 = rnd_bf16(nk, 0.25f);
	std::vector<float> dqh = dq0, dkh = dk0, dvh = dv0;
	bk_ops_host.attention_backward(dqh.data(), dkh.data(), dvh.data(), go.data(), q.data(),
				       k.data(), v.data(), oh.data(), lh.data(), cu.data(), S, T, NH,
				       NKV, D, &ap);
	dbuf<float> dgo(go), doh(oh), dlh(lh), ddq(dq0), ddk(dk0), ddv(dv0);
	bk_cuda_attention_tc_backward(ddq, ddk, ddv, dgo, dq, dk, dv, doh, dlh, dcu, S, T, NH, NKV,
				      D, &ap);
	std::vector<float> dqg = ddq.get(), dkg = ddk.get(), dvg = ddv.get();
	check(size, "dq", dqg.data(), dqh.data(), nq, 2e-2 * gc_maxerr(dqh.data(), dq0.data(), nq));
	check(size, "dk", dkg.data(), dkh.data(), nk, 2e-2 * gc_maxerr(dkh.data(), dk0.data(), nk));
	check(size, "dv", dvg.data(), dvh.data(), nk, 2e-2 * gc_maxerr(dvh.data(), dv0.data(), nk));
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	if (argc > 2)
		die("usage: test_attention_tc [SUBSTRING of the case labels to run]");
	only = argc > 1 ? argv[1] : NULL;
	clock_t c0 = clock();
	bk_attn a64 = bk_attn_default(64), a128 = bk_attn_default(128);
	bk_attn capwin = {0.2f, 3.0f, 40}, win = {0.125f, 0, 16};
	run_case({1, 7, 70, 80}, 4, 2, 64, 0, a64, true);   // GQA 2, tiles spanning sequences
	run_case({1, 7, 70, 80}, 2, 2, 128, 37, a128, false); // prefix (forward only)
	run_case({33, 1, 64}, 4, 1, 128, 0, capwin, true);   // softcap + window, GQA 4
	run_case({100}, 2, 2, 64, 5, win, false);            // window into the prefix
	run_case({100, 30}, 2, 1, 64, 0, win, true);         // window shorter than a tile
	run_case({65, 3}, 2, 2, 64, 0, a64, true);           // NH = NKV: dk/dv added directly
	// the schedules: packed sequences (the last tile of a short one is shorter than a
	// middle one of a long one), windows, one long sequence
	check_sched({1, 7, 70, 80, 300, 64, 5}, 0, 0);
	check_sched({1, 7, 70, 80, 300, 64, 5}, 0, 1);
	check_sched({1, 7, 70, 80, 300, 64, 5}, 100, 0);
	check_sched({1, 7, 70, 80, 300, 64, 5}, 100, 1);
	check_sched({256, 256, 256, 256}, 0, 0);
	check_sched({1000}, 0, 1);
	// D = 256 (Gemma 2/3): 32-key forward tiles with Q from shared memory, 16-key dq
	// tiles, dk/dv in two column halves (two blocks a head); Gemma-2's scale 256^-0.5 and softcap 50
	// (cap' = 1 - (s / 50)^2 is within 1e-3 of 1 at these scores: the second case's cap of
	// 1 is what makes a wrong cap' factor fail)
	bk_attn g2 = {0.0625f, 50.0f, 24}, hard = {0.0625f, 1.0f, 0};
	run_case({1, 40, 50}, 2, 1, 256, 0, g2, true);       // GQA 2, softcap + window
	run_case({70, 9}, 1, 1, 256, 0, hard, true);         // NH = NKV: halves added directly
	run_case({30, 45}, 2, 1, 256, 21, g2, false);        // prefix + window (forward)
	if (!n_lines)
		die("no case label contains '%s'", only);
	printf("test_attention_tc: %d checks, %d failed (%.1f s CPU)\n", n_lines, n_fail,
	       (double)(clock() - c0) / CLOCKS_PER_SEC);
	return n_fail ? 1 : 0;
}
