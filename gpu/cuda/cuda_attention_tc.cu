// cuda_attention_tc.cu - the tensor-core flash attention (ops.h attention_forward /
// attention_backward, same contract as the fp32 kernel of gpu/cuda/cuda_attention.cu: out
// [T,NH,D] fp32, lse [NH,T], the backward recomputes P from lse), and the BK_ATTN
// selection between the two (gpu/cuda/cuda_attention_tc.h).  Not the decode attention.
//
// Choices:
//  - bf16 mma.sync m16n8k16 with fp32 accumulation (sm_80+).  q/k/v/dout are fp32 in the
//    interface; each tile is rounded to bf16 (round to nearest even) as it is staged in
//    shared memory.  Scores, the online softmax (m, l), exp, lse, D_i = dout.out and every
//    accumulator are fp32; P (forward, dv) and dS (dq, dk) are rounded to bf16 as the
//    A operand of the second product, the FlashAttention-2 way.
//  - every operand is staged once, row-major [rows][D+8] (8 bf16 of padding: the 8
//    groups x 4 lanes of a fragment hit 32 distinct banks).  A and "n-major" B fragments
//    (Q, K in Q K^T; dO, V in dO V^T; K, V, Q, dO in K Q^T, V dO^T) are 32-bit loads of
//    bf16 pairs at the addresses of the PTX m16n8k16 layout; "k-major" B fragments (V in
//    P V, K in dS K, Q and dO in dS^T Q, P^T dO) come from the same rows by ldmatrix
//    .trans.  The C fragment of a product is re-packed in registers as the A fragment of
//    the next (P and dS never go to shared memory).
//  - forward and dq: a block is 64 query rows (4 warps x 16) of one head; it loops over
//    every prefix key tile, then its own key tiles from row 0's sequence start (or window
//    start) to its last row; masks as the fp32 kernel (per row: sequence start, causal,
//    window; prefix keys by position).  dk/dv: a block is 64 keys (4 warps x 16) of one
//    QUERY head (grid over NH, not NKV: 8x more blocks at 32/4 heads) looping over the
//    query rows that can see them; with GQA each query head writes its partial dk/dv to
//    a workspace [NH,T,D] and a reduction kernel adds the group's heads in head order
//    (deterministic, no atomics).  dq is a kernel of its own (recomputes S and dP: 7
//    products in the backward instead of FA2's 5 with atomics, but deterministic).
//  - causal load balancing: blocks take their tiles longest first, by a schedule by
//    work computed on the device from cu_seqlens (tc_sched_kernel: one small block per
//    call, the tiles ranked by their key / query count; over 8192 tiles, by position:
//    the last query tiles, the first key tiles first).  The head is the fastest grid
//    index (grid (NH, tiles); dk/dv (NH x column halves, tiles)), so the blocks,
//    dispatched in index order, go longest first over all heads and the last wave is
//    every head's shortest tile (with the tile fastest, the shortest tiles of head 0
//    would run before the longest of head 1).  By work rather than position because in
//    a packed batch a tile at a sequence's start is short wherever it stands.  A warp
//    skips the key tiles wholly after its rows (forward, dq) and the query tiles wholly
//    before its keys (dk/dv), so the causal half of a diagonal tile costs nothing but
//    the barrier.
//  - D = 64, 128 and 256 (templates); other head dimensions, buffers not 16-byte aligned:
//    the fp32 kernel.  D = 256 (Gemma 2/3) keeps every tile under 96 KiB of shared
//    memory (sm_86's opt-in limit is 99 KiB) with smaller key / query tiles: forward
//    64 x 32 keys (67.5 KiB, the Q fragments read from shared memory each tile instead
//    of 64 registers a thread), dq 64 x 16 keys (82.5 KiB), dk/dv 64 keys x 16 queries
//    (82.7 KiB) with the D output columns split in two halves (two blocks a head; each
//    recomputes S and dP over all of D: 6 products instead of 4, but 128 accumulator
//    registers a thread instead of 256).  ptxas (sm_90, -O2): no spills at any D,
//    212-227 registers a thread in the D = 256 kernels (at most 2 blocks an SM by
//    registers).  Shared memory allows 2 (dq, dk/dv) or 3 (forward) blocks an SM on
//    sm_90, 1 or 2 on sm_80, 1 on sm_86: few warps to hide latency with, to be measured.
//  - BK_ACT=bf16 (gpu/cuda/cuda_act.cuh): the same kernels with q, k, v, the prefix and
//    out in bf16 (template argument TI): staged by a copy, out written as bf16 pairs;
//    bk_cuda_attention_tc_forward_bf16 / _backward_bf16 below.
//  - not validated on a GPU yet: BK_ATTN=fp32 stays the default; tests/gpu/
//    check_attention_tc.c checks both kernels against the host twin and times them.
#include "gpu/cuda/cuda_common.cuh"
#include "gpu/cuda/cuda_attention_tc.h"
#include "gpu/cuda/cuda_attn_dot.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef __nv_bfloat16 tc_bf16;

#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)
#define TC_SMEM_MAX (96 * 1024) // the opt-in limit of sm_80 / sm_86 / sm_90 we stay under

#define TC_UNROLL _Pragma("unroll")
#define TC_SHARED(name) BK_DYN_SMEM(unsigned char, name)

// ---------------------------------------------------------------------------------
// device helpers

// the sequence of packed token t: the largest s with cu[s] <= t (cu [S+1], cu[S] = T > t)
__device__ __forceinline__ int tc_seq_of(const int32_t *cu, int S, int t)
{
	int lo = 0, hi = S - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) >> 1;
		if (cu[mid] <= t)
			lo = mid;
		else
			hi = mid - 1;
	}
	return lo;
}

// two floats as a bf16 pair: lo in the low 16 bits (the lower column of a fragment)
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi)
{
	__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
	uint32_t r;
	memcpy(&r, &v, 4);
	return r;
}

__device__ __forceinline__ uint32_t tc_ld32(const tc_bf16 *p)
{
	return *reinterpret_cast<const uint32_t *>(p);
}

__device__ __forceinline__ float tc_bf16_f32(tc_bf16 x)
{
	return __bfloat162float(x);
}

// c[16x8] += a[16x16] b[16x8]: bf16 inputs, fp32 accumulators.  Fragments (PTX ISA,
// m16n8k16, g = lane / 4, t = lane % 4): a0 = A[g][2t,2t+1], a1 = A[g+8][2t..],
// a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]; b0 = B[2t,2t+1][g], b1 = B[2t+8,2t+9][g];
// c0,c1 = C[g][2t,2t+1], c2,c3 = C[g+8][2t,2t+1].
__device__ __forceinline__ void tc_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
#ifndef BK_CUDA_EMU
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
	emu_mma_m16n8k16(c, a, b0, b1);
#endif
}

// A fragment of rows r0..r0+15, columns k0..k0+15 of row-major X [*][LD]
__device__ __forceinline__ void tc_frag_a(uint32_t a[4], const tc_bf16 *X, int LD, int r0,
					  int k0, int g, int t)
{
	const tc_bf16 *p = X + (size_t)(r0 + g) * LD + k0 + 2 * t;
	a[0] = tc_ld32(p);
	a[1] = tc_ld32(p + 8 * LD);
	a[2] = tc_ld32(p + 8);
	a[3] = tc_ld32(p + 8 * LD + 8);
}

// B fragment (k0..k0+15) x (n0..n0+7) where B[k][n] = Y[n][k], Y row-major [*][LD]
__device__ __forceinline__ void tc_frag_b(uint32_t &b0, uint32_t &b1, const tc_bf16 *Y, int LD,
					  int n0, int k0, int g, int t)
{
	const tc_bf16 *p = Y + (size_t)(n0 + g) * LD + k0 + 2 * t;
	b0 = tc_ld32(p);
	b1 = tc_ld32(p + 8);
}

// B fragment (k0..k0+15) x (n0..n0+7) where B[k][n] = X[k][n], X row-major [*][LD]
// ("k-major": V, K, Q, dO as staged): ldmatrix .x2 .trans, lanes 0-15 addressing rows
// k0..k0+15 at column n0 (16-byte aligned: LD and n0 are multiples of 8); the
// transposed 8x8 load gives lane (g, t) X[k0+2t, k0+2t+1][n0+g] (b0) and rows +8 (b1)
__device__ __forceinline__ void tc_frag_bt(uint32_t &b0, uint32_t &b1, const tc_bf16 *X, int LD,
					   int k0, int n0, int lane)
{
	const tc_bf16 *p = X + (size_t)(k0 + (lane & 15)) * LD + n0;
#ifndef BK_CUDA_EMU
	uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
	asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
		     : "=r"(b0), "=r"(b1)
		     : "r"(a)
		     : "memory");
#else
	emu_ldmatrix_x2_trans(b0, b1, p);
#endif
}

// A fragment of k-step kk from the C fragments of n-tiles 2kk and 2kk+1
__device__ __forceinline__ void tc_c_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
	a[0] = tc_pack(c0[0], c0[1]);
	a[1] = tc_pack(c0[2], c0[3]);
	a[2] = tc_pack(c1[0], c1[1]);
	a[3] = tc_pack(c1[2], c1[3]);
}

// dst [BR][LD] bf16 = rows r0..r0+n-1 of src [*,nh,D] at head h; rows n..BR-1 zero
// (a zero row, not NaN: 0 * NaN would poison the products).  src 16-byte aligned.
template <int D>
__device__ __forceinline__ void tc_stage(tc_bf16 *dst, int LD, int BR, const float *src, int r0,
					 int n, int nh, int h)
{
	constexpr int D4 = D / 4;
	for (int i = threadIdx.x; i < BR * D4; i += blockDim.x) {
		int r = i / D4, d = (i - r * D4) * 4;
		float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		if (r < n)
			x = *reinterpret_cast<const float4 *>(src + ((size_t)(r0 + r) * nh + h) * D + d);
		uint2 w;
		w.x = tc_pack(x.x, x.y);
		w.y = tc_pack(x.z, x.w);
		*reinterpret_cast<uint2 *>(dst + (size_t)r * LD + d) = w;
	}
}

// the same from a bf16 source (BK_ACT=bf16: q/k/v saved in bf16): a copy, no rounding.
// src 8-byte aligned (rows of D bf16, D a multiple of 64).
template <int D>
__device__ __forceinline__ void tc_stage(tc_bf16 *dst, int LD, int BR, const tc_bf16 *src, int r0,
					 int n, int nh, int h)
{
	constexpr int D4 = D / 4;
	for (int i = threadIdx.x; i < BR * D4; i += blockDim.x) {
		int r = i / D4, d = (i - r * D4) * 4;
		uint2 w;
		w.x = w.y = 0u; // bf16 zeros
		if (r < n)
			w = *reinterpret_cast<const uint2 *>(src + ((size_t)(r0 + r) * nh + h) * D + d);
		*reinterpret_cast<uint2 *>(dst + (size_t)r * LD + d) = w;
	}
}

// two adjacent outputs of the forward: fp32, or one bf16 pair (round to nearest even)
__device__ __forceinline__ void tc_store2(float *p, float a, float b)
{
	*reinterpret_cast<float2 *>(p) = make_float2(a, b);
}
__device__ __forceinline__ void tc_store2(tc_bf16 *p, float a, float b)
{
	*reinterpret_cast<uint32_t *>(p) = tc_pack(a, b);
}

// the score of raw q.k: cap(acc * scale)
__device__ __forceinline__ float tc_score(float acc, float scale, float cap)
{
	float s = acc * scale;
	return cap > 0.0f ? tanhf(s / cap) * cap : s;
}

// can query token t (sequence start st) see own key j?  (causal, same sequence, window)
__device__ __forceinline__ bool tc_vis_own(int t, int st, int j, int W)
{
	return j >= st && j <= t && (W <= 0 || t - j < W);
}

// ---------------------------------------------------------------------------------
// the schedule: which tile a block takes

// order[r] = the tile of rank r when the n = ceil(T / 64) tiles of 64 rows are sorted by
// their work, the most first (ties: the later tile first), so blocks dispatched in index
// order take the longest tiles first also across packed sequences (by position alone, a
// tile at a sequence's start is short wherever it stands).  Work: kv = 0, query tiles
// (forward, dq): the own keys from row 0's sequence (or window) start to the last row
// (the prefix tiles are the same for every tile); kv = 1, key tiles (dk/dv): the queries
// from the first key to the last key's sequence end (or window end).  One block; the
// works in shared memory [n]; rank by counting (O(n^2 / threads), deterministic).
#define TC_SCHED_THREADS 256
#define TC_SCHED_MAX 8192 // tiles (T = 512k): 32 KiB of works; more: position order
__global__ void __launch_bounds__(TC_SCHED_THREADS)
tc_sched_kernel(int *order, const int32_t *cu, int S, int T, int W, int kv)
{
	TC_SHARED(tc_sm);
	int *work = (int *)tc_sm;
	const int n = (T + 63) / 64;
	for (int x = threadIdx.x; x < n; x += blockDim.x) {
		const int t0 = x * 64, last = min(t0 + 64, T) - 1;
		int w;
		if (!kv) {
			int st = cu[tc_seq_of(cu, S, t0)];
			w = last + 1 - (W > 0 ? max(st, t0 - W + 1) : st);
		} else {
			int qend = cu[tc_seq_of(cu, S, last) + 1];
			w = (W > 0 ? min(qend, last + W) : qend) - t0;
		}
		work[x] = w;
	}
	__syncthreads();
	for (int x = threadIdx.x; x < n; x += blockDim.x) {
		const int wx = work[x];
		int r = 0;
		for (int y = 0; y < n; y++)
			r += work[y] > wx || (work[y] == wx && y > x);
		order[r] = x;
	}
}

// the tile of block index b of nb: order[b], or without an order the last first
__device__ __forceinline__ int tc_tile(const int *order, int b, int nb)
{
	return order ? order[b] : nb - 1 - b;
}

// ---------------------------------------------------------------------------------
// forward

// forward: Q [64][D+8], K, V [BN][D+8]; D = 256: 32-key tiles (67.5 KiB) and the Q
// fragments read from shared memory each tile (in registers they would be 64 a thread,
// beside the 128 of the o accumulators)
template <int D> struct TcFwd {
	static constexpr int BM = 64, BN = D <= 128 ? 64 : 32, LD = D + 8;
	static constexpr bool QREG = D <= 128; // Q fragments held in registers
	static constexpr size_t smem = ((size_t)BM * LD + (size_t)2 * BN * LD) * 2;
	static_assert(smem <= TC_SMEM_MAX, "forward tile over the shared-memory budget");
};

// one key tile (keys j0..j0+nc-1 of kg/vg [*,NKV,D]) into the warp's running m, l, o
template <int D, typename TI>
__device__ __forceinline__ void tc_fwd_tile(const TI *kg, const TI *vg, int j0, int nc,
					    bool prefix, int NKV, int kh, tc_bf16 *Ks, tc_bf16 *Vs,
					    const tc_bf16 *Qs, const uint32_t (*qa)[4],
					    float (*o)[4], float *m,
					    float *l, const int *trow, const int *srow,
					    const bool *vrow, int P, float scale, float cap, int W,
					    bool warp_live, int warp_last)
{
	typedef TcFwd<D> C;
	constexpr int NK = D / 16, NN = C::BN / 8, ND = D / 8;
	const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3, warp = threadIdx.x >> 5;
	__syncthreads(); // the previous tile's readers are done
	tc_stage<D>(Ks, C::LD, C::BN, kg, j0, nc, NKV, kh);
	tc_stage<D>(Vs, C::LD, C::BN, vg, j0, nc, NKV, kh);
	__syncthreads();
	if (!warp_live || (!prefix && j0 > warp_last))
		return; // every key of the tile is after every row of this warp
	float s[NN][4];
TC_UNROLL
	for (int n = 0; n < NN; n++)
		s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
TC_UNROLL
	for (int kk = 0; kk < NK; kk++) {
		uint32_t a[4];
		if constexpr (C::QREG) {
			a[0] = qa[kk][0], a[1] = qa[kk][1], a[2] = qa[kk][2], a[3] = qa[kk][3];
		} else {
			tc_frag_a(a, Qs, C::LD, warp * 16, kk * 16, g, tq);
		}
TC_UNROLL
		for (int n = 0; n < NN; n++) {
			uint32_t b0, b1;
			tc_frag_b(b0, b1, Ks, C::LD, n * 8, kk * 16, g, tq);
			tc_mma(s[n], a, b0, b1);
		}
	}
	// scale, cap, mask; row maxima (rows 0: g, 1: g+8 of the warp)
	float mx[2] = {-INFINITY, -INFINITY};
TC_UNROLL
	for (int n = 0; n < NN; n++)
TC_UNROLL
		for (int e = 0; e < 4; e++) {
			int ri = e >> 1, c = n * 8 + 2 * tq + (e & 1), j = j0 + c;
			bool vis = false;
			if (vrow[ri] && c < nc)
				vis = prefix ? (W <= 0 || P + trow[ri] - srow[ri] - j < W)
					     : tc_vis_own(trow[ri], srow[ri], j, W);
			float sc = vis ? tc_score(s[n][e], scale, cap) : -INFINITY;
			s[n][e] = sc;
			mx[ri] = fmaxf(mx[ri], sc);
		}
	float alpha[2], sum[2] = {0.0f, 0.0f}, mu[2];
TC_UNROLL
	for (int ri = 0; ri < 2; ri++) {
		mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffffu, mx[ri], 1));
		mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xffffffffu, mx[ri], 2));
		float mnew = fmaxf(m[ri], mx[ri]);
		mu[ri] = mnew == -INFINITY ? 0.0f : mnew; // nothing visible yet in this row
		alpha[ri] = expf(m[ri] - mu[ri]);
		m[ri] = mnew;
	}
TC_UNROLL
	for (int n = 0; n < NN; n++)
TC_UNROLL
		for (int e = 0; e < 4; e++) {
			float p = expf(s[n][e] - mu[e >> 1]);
			s[n][e] = p;
			sum[e >> 1] += p;
		}
TC_UNROLL
	for (int ri = 0; ri < 2; ri++)
		l[ri] = l[ri] * alpha[ri] + sum[ri]; // this thread's columns; quad-summed at the end
TC_UNROLL
	for (int dn = 0; dn < ND; dn++) {
		o[dn][0] *= alpha[0];
		o[dn][1] *= alpha[0];
		o[dn][2] *= alpha[1];
		o[dn][3] *= alpha[1];
	}
	// o += P V: A = P (bf16), B[k=key][n=d] = Vs[key][d]
TC_UNROLL
	for (int kk = 0; kk < C::BN / 16; kk++) {
		uint32_t a[4];
		tc_c_to_a(a, s[2 * kk], s[2 * kk + 1]);
TC_UNROLL
		for (int dn = 0; dn < ND; dn++) {
			uint32_t b0, b1;
			tc_frag_bt(b0, b1, Vs, C::LD, kk * 16, dn * 8, lane);
			tc_mma(o[dn], a, b0, b1);
		}
	}
}

// grid (NH, ceil(T/64)): head x, query tile ntiles-1-y (the longest first)
// TI: the type of q, k, v, the prefix and out (float, or tc_bf16 with BK_ACT=bf16)
template <int D, typename TI = float>
__global__ void __launch_bounds__(TC_THREADS)
tc_fwd_kernel(TI *out, float *lse, const TI *q, const TI *k, const TI *v,
	      const int32_t *cu, int S, int T, int NH, int NKV, const TI *pk, const TI *pv,
	      int P, float scale, float cap, int W, const int *order)
{
	typedef TcFwd<D> C;
	constexpr int NK = D / 16, ND = D / 8;
	TC_SHARED(tc_sm);
	tc_bf16 *Qs = (tc_bf16 *)tc_sm, *Ks = Qs + C::BM * C::LD, *Vs = Ks + C::BN * C::LD;
	const int h = blockIdx.x, kh = h / (NH / NKV);
	const int t0 = tc_tile(order, blockIdx.y, gridDim.y) * C::BM, nr = min(C::BM, T - t0);
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
	const int w0 = t0 + warp * 16; // the warp's first row
	const bool warp_live = w0 < T;
	const int warp_last = min(w0 + 15, T - 1);
	int trow[2] = {w0 + g, w0 + g + 8}, srow[2];
	bool vrow[2];
	for (int ri = 0; ri < 2; ri++) {
		vrow[ri] = trow[ri] < T;
		srow[ri] = vrow[ri] ? cu[tc_seq_of(cu, S, trow[ri])] : 0;
	}
	tc_stage<D>(Qs, C::LD, C::BM, q, t0, nr, NH, h);
	__syncthreads();
	uint32_t qa[C::QREG ? NK : 1][4];
	if constexpr (C::QREG) {
TC_UNROLL
		for (int kk = 0; kk < NK; kk++)
			tc_frag_a(qa[kk], Qs, C::LD, warp * 16, kk * 16, g, tq);
	}
	float o[ND][4];
TC_UNROLL
	for (int dn = 0; dn < ND; dn++)
		o[dn][0] = o[dn][1] = o[dn][2] = o[dn][3] = 0.0f;
	float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
	// every prefix tile (its keys masked by the window only), then the own-key tiles from
	// row 0's sequence start (or row 0's window start) to the last row
	for (int j0 = 0; j0 < P; j0 += C::BN)
		tc_fwd_tile<D, TI>(pk, pv, j0, min(C::BN, P - j0), true, NKV, kh, Ks, Vs, Qs, qa, o, m, l,
			       trow, srow, vrow, P, scale, cap, W, warp_live, warp_last);
	const int start0 = cu[tc_seq_of(cu, S, t0)];
	const int kend = t0 + nr, kfirst = W > 0 ? max(start0, t0 - W + 1) : start0;
	for (int j0 = kfirst; j0 < kend; j0 += C::BN)
		tc_fwd_tile<D, TI>(k, v, j0, min(C::BN, kend - j0), false, NKV, kh, Ks, Vs, Qs, qa, o, m, l,
			       trow, srow, vrow, P, scale, cap, W, warp_live, warp_last);
TC_UNROLL
	for (int ri = 0; ri < 2; ri++) {
		l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 1);
		l[ri] += __shfl_xor_sync(0xffffffffu, l[ri], 2);
	}
TC_UNROLL
	for (int ri = 0; ri < 2; ri++) {
		if (!vrow[ri])
			continue;
		float inv = 1.0f / l[ri];
		TI *orow = out + ((size_t)trow[ri] * NH + h) * D;
TC_UNROLL
		for (int dn = 0; dn < ND; dn++)
			tc_store2(orow + dn * 8 + 2 * tq, o[dn][2 * ri] * inv, o[dn][2 * ri + 1] * inv);
		if (tq == 0)
			lse[(size_t)h * T + trow[ri]] = m[ri] + logf(l[ri]);
	}
}

// ---------------------------------------------------------------------------------
// backward


// s = A1 B1^T and dp = A2 B2^T over the D columns: the warp's 16 rows r0.. of A1, A2
// against rows 0 .. 8 NN - 1 of B1, B2 (all row-major [*][LD] bf16).  The backward's S
// and dP: dq (A = Q, dO; B = K, V) and dk/dv transposed (A = K, V; B = Q, dO).
template <int D, int NN>
__device__ __forceinline__ void tc_s_dp(float (*s)[4], float (*dp)[4], const tc_bf16 *A1,
					const tc_bf16 *A2, const tc_bf16 *B1, const tc_bf16 *B2,
					int LD, int r0, int g, int tq)
{
TC_UNROLL
	for (int n = 0; n < NN; n++)
TC_UNROLL
		for (int e = 0; e < 4; e++)
			s[n][e] = dp[n][e] = 0.0f;
TC_UNROLL
	for (int kk = 0; kk < D / 16; kk++) {
		uint32_t a1[4], a2[4];
		tc_frag_a(a1, A1, LD, r0, kk * 16, g, tq);
		tc_frag_a(a2, A2, LD, r0, kk * 16, g, tq);
TC_UNROLL
		for (int n = 0; n < NN; n++) {
			uint32_t b0, b1;
			tc_frag_b(b0, b1, B1, LD, n * 8, kk * 16, g, tq);
			tc_mma(s[n], a1, b0, b1);
			tc_frag_b(b0, b1, B2, LD, n * 8, kk * 16, g, tq);
			tc_mma(dp[n], a2, b0, b1);
		}
	}
}

// ds of a visible (query, key) from its raw q.k, dout.v, the query's lse and D_i:
// p (dp - D_i), times cap' = 1 - (score / cap)^2 under a softcap; *p = the probability
__device__ __forceinline__ float tc_ds(float qk, float dpv, float lse, float Di, float scale,
				       float cap, float *p)
{
	float sc = tc_score(qk, scale, cap);
	*p = expf(sc - lse);
	float ds = *p * (dpv - Di);
	return cap > 0.0f ? ds * (1.0f - (sc / cap) * (sc / cap)) : ds;
}

// dq: Q, dO [64][D+8]; K, V [BN][D+8] (D = 256: 16-key tiles, 82.5 KiB)
template <int D> struct TcDq {
	static constexpr int BM = 64, BN = D <= 64 ? 64 : D <= 128 ? 32 : 16, LD = D + 8;
	static constexpr size_t smem = ((size_t)2 * BM * LD + (size_t)2 * BN * LD) * 2;
	static_assert(smem <= TC_SMEM_MAX, "dq tile over the shared-memory budget");
};

// grid (NH, ceil(T/64)): dq rows of query tile ntiles-1-y, head x, += scale sum_j ds_ij k_j
template <int D, typename TI = float>
__global__ void __launch_bounds__(TC_THREADS)
tc_bwd_dq_kernel(float *dq, const float *dout, const TI *q, const TI *k, const TI *v,
		 const float *lse, const float *Di, const int32_t *cu, int S, int T, int NH,
		 int NKV, float scale, float cap, int W, const int *order)
{
	typedef TcDq<D> C;
	constexpr int NN = C::BN / 8, ND = D / 8;
	TC_SHARED(tc_sm);
	tc_bf16 *Qs = (tc_bf16 *)tc_sm, *dOs = Qs + C::BM * C::LD, *Ks = dOs + C::BM * C::LD;
	tc_bf16 *Vs = Ks + C::BN * C::LD;
	const int h = blockIdx.x, kh = h / (NH / NKV);
	const int t0 = tc_tile(order, blockIdx.y, gridDim.y) * C::BM, nr = min(C::BM, T - t0);
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
	const int w0 = t0 + warp * 16;
	const bool warp_live = w0 < T;
	const int warp_last = min(w0 + 15, T - 1);
	int trow[2] = {w0 + g, w0 + g + 8}, srow[2];
	bool vrow[2];
	float lrow[2], drow[2];
	for (int ri = 0; ri < 2; ri++) {
		vrow[ri] = trow[ri] < T;
		srow[ri] = vrow[ri] ? cu[tc_seq_of(cu, S, trow[ri])] : 0;
		lrow[ri] = vrow[ri] ? lse[(size_t)h * T + trow[ri]] : 0.0f;
		drow[ri] = vrow[ri] ? Di[(size_t)h * T + trow[ri]] : 0.0f;
	}
	tc_stage<D>(Qs, C::LD, C::BM, q, t0, nr, NH, h);
	tc_stage<D>(dOs, C::LD, C::BM, dout, t0, nr, NH, h);
	float acc[ND][4];
TC_UNROLL
	for (int dn = 0; dn < ND; dn++)
		acc[dn][0] = acc[dn][1] = acc[dn][2] = acc[dn][3] = 0.0f;
	__syncthreads();
	const int start0 = cu[tc_seq_of(cu, S, t0)];
	const int kend = t0 + nr, kfirst = W > 0 ? max(start0, t0 - W + 1) : start0;
	for (int j0 = kfirst; j0 < kend; j0 += C::BN) {
		const int nc = min(C::BN, kend - j0);
		__syncthreads();
		tc_stage<D>(Ks, C::LD, C::BN, k, j0, nc, NKV, kh);
		tc_stage<D>(Vs, C::LD, C::BN, v, j0, nc, NKV, kh);
		__syncthreads();
		if (!warp_live || j0 > warp_last)
			continue;
		float s[NN][4], dp[NN][4];
		tc_s_dp<D, NN>(s, dp, Qs, dOs, Ks, Vs, C::LD, warp * 16, g, tq);
		// ds = p (dp - D_i) (cap' factor); s <- ds
TC_UNROLL
		for (int n = 0; n < NN; n++)
TC_UNROLL
			for (int e = 0; e < 4; e++) {
				int ri = e >> 1, c = n * 8 + 2 * tq + (e & 1), j = j0 + c;
				float ds = 0.0f;
				if (vrow[ri] && c < nc && tc_vis_own(trow[ri], srow[ri], j, W)) {
					float p;
					ds = tc_ds(s[n][e], dp[n][e], lrow[ri], drow[ri], scale, cap,
						   &p);
				}
				s[n][e] = ds;
			}
		// acc += dS K: B[k=key][n=d] = Ks[key][d]
TC_UNROLL
		for (int kk = 0; kk < C::BN / 16; kk++) {
			uint32_t a[4];
			tc_c_to_a(a, s[2 * kk], s[2 * kk + 1]);
TC_UNROLL
			for (int dn = 0; dn < ND; dn++) {
				uint32_t b0, b1;
				tc_frag_bt(b0, b1, Ks, C::LD, kk * 16, dn * 8, lane);
				tc_mma(acc[dn], a, b0, b1);
			}
		}
	}
TC_UNROLL
	for (int ri = 0; ri < 2; ri++) {
		if (!vrow[ri])
			continue;
		float *row = dq + ((size_t)trow[ri] * NH + h) * D;
TC_UNROLL
		for (int dn = 0; dn < ND; dn++) {
			float2 *p = reinterpret_cast<float2 *>(row + dn * 8 + 2 * tq);
			float2 w = *p;
			w.x += acc[dn][2 * ri] * scale;
			w.y += acc[dn][2 * ri + 1] * scale;
			*p = w;
		}
	}
}

// dk/dv: K, V [64][D+8]; Q, dO [BQ][D+8]; lse, Di, starts [BQ].  A block accumulates DO
// of the D output columns of dk and dv (2 x DO / 2 fp32 registers a thread): D = 256
// runs two blocks per key tile and head (z = x % 2 of the grid), each recomputing S and
// dP over all of D and keeping columns z DO .. z DO + DO - 1 (6 products instead of 4,
// 128 accumulator registers instead of 256); 16-query tiles (82.7 KiB)
template <int D> struct TcDkv {
	static constexpr int BN = 64, BQ = D <= 64 ? 64 : D <= 128 ? 32 : 16, LD = D + 8;
	static constexpr int DO = D <= 128 ? D : 128, NZ = D / DO;
	static constexpr size_t smem_bf16 = ((size_t)2 * BN * LD + (size_t)2 * BQ * LD) * 2;
	static constexpr size_t smem = smem_bf16 + (size_t)3 * BQ * 4;
	static_assert(smem <= TC_SMEM_MAX, "dk/dv tile over the shared-memory budget");
};

// grid (NH NZ, ceil(T/64)): keys j0 = 64 y .. j0+63 of kv head h / group, gradient from
// query head h = x / NZ, output columns z DO .. z DO + DO - 1 (z = x % NZ).  group == 1:
// dk/dv += directly (this block owns the rows); else the partials go to wk, wv [NH,T,D]
// (overwritten) for tc_bwd_reduce_kernel.
template <int D, typename TI = float>
__global__ void __launch_bounds__(TC_THREADS)
tc_bwd_dkv_kernel(float *dk, float *dv, float *wk, float *wv, const float *dout,
		  const TI *q, const TI *k, const TI *v, const float *lse,
		  const float *Di, const int32_t *cu, int S, int T, int NH, int NKV, float scale,
		  float cap, int W, const int *order)
{
	typedef TcDkv<D> C;
	constexpr int NQ = C::BQ / 8, ND = C::DO / 8;
	TC_SHARED(tc_sm);
	tc_bf16 *Ks = (tc_bf16 *)tc_sm, *Vs = Ks + C::BN * C::LD, *Qs = Vs + C::BN * C::LD;
	tc_bf16 *dOs = Qs + C::BQ * C::LD;
	float *ls = (float *)(tc_sm + C::smem_bf16), *ds_ = ls + C::BQ;
	int *ss = (int *)(ds_ + C::BQ);
	const int group = NH / NKV, h = blockIdx.x / C::NZ, kh = h / group;
	const int j0 = (order ? order[blockIdx.y] : (int)blockIdx.y) * C::BN;
	const int nc = min(C::BN, T - j0);
	const int d0 = (blockIdx.x % C::NZ) * C::DO;
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
	const int wj0 = j0 + warp * 16; // the warp's first key
	const bool warp_live = wj0 < T;
	int jrow[2] = {wj0 + g, wj0 + g + 8};
	bool vrow[2] = {jrow[0] < T, jrow[1] < T};
	tc_stage<D>(Ks, C::LD, C::BN, k, j0, nc, NKV, kh);
	tc_stage<D>(Vs, C::LD, C::BN, v, j0, nc, NKV, kh);
	float ak[ND][4], av[ND][4];
TC_UNROLL
	for (int dn = 0; dn < ND; dn++)
TC_UNROLL
		for (int e = 0; e < 4; e++)
			ak[dn][e] = av[dn][e] = 0.0f;
	// queries from j0 to the end of the last key's sequence (and its window)
	int qend = cu[tc_seq_of(cu, S, j0 + nc - 1) + 1];
	if (W > 0)
		qend = min(qend, j0 + nc - 1 + W);
	for (int i0 = j0; i0 < qend; i0 += C::BQ) {
		const int nq = min(C::BQ, qend - i0);
		__syncthreads();
		tc_stage<D>(Qs, C::LD, C::BQ, q, i0, nq, NH, h);
		tc_stage<D>(dOs, C::LD, C::BQ, dout, i0, nq, NH, h);
		for (int r = threadIdx.x; r < C::BQ; r += blockDim.x) {
			ls[r] = r < nq ? lse[(size_t)h * T + i0 + r] : 0.0f;
			ds_[r] = r < nq ? Di[(size_t)h * T + i0 + r] : 0.0f;
			ss[r] = r < nq ? cu[tc_seq_of(cu, S, i0 + r)] : 0;
		}
		__syncthreads();
		if (!warp_live || wj0 > i0 + nq - 1)
			continue; // every query of the tile is before every key of this warp
		// S^T = K Q^T and dP^T = V dO^T: rows = this warp's 16 keys, columns = queries
		float st[NQ][4], dpt[NQ][4];
		tc_s_dp<D, NQ>(st, dpt, Ks, Vs, Qs, dOs, C::LD, warp * 16, g, tq);
		// st <- p, dpt <- ds (0 where the query cannot see the key)
TC_UNROLL
		for (int n = 0; n < NQ; n++)
TC_UNROLL
			for (int e = 0; e < 4; e++) {
				int ri = e >> 1, c = n * 8 + 2 * tq + (e & 1), i = i0 + c;
				float p = 0.0f, ds = 0.0f;
				if (vrow[ri] && c < nq && tc_vis_own(i, ss[c], jrow[ri], W))
					ds = tc_ds(st[n][e], dpt[n][e], ls[c], ds_[c], scale, cap, &p);
				st[n][e] = p;
				dpt[n][e] = ds;
			}
		// dV += P^T dO (B[k=query][n=d] = dOs[query][d]); dK += dS^T Q (Qs)
TC_UNROLL
		for (int kk = 0; kk < C::BQ / 16; kk++) {
			uint32_t ap[4], as[4];
			tc_c_to_a(ap, st[2 * kk], st[2 * kk + 1]);
			tc_c_to_a(as, dpt[2 * kk], dpt[2 * kk + 1]);
TC_UNROLL
			for (int dn = 0; dn < ND; dn++) {
				uint32_t b0, b1;
				tc_frag_bt(b0, b1, dOs, C::LD, kk * 16, d0 + dn * 8, lane);
				tc_mma(av[dn], ap, b0, b1);
				tc_frag_bt(b0, b1, Qs, C::LD, kk * 16, d0 + dn * 8, lane);
				tc_mma(ak[dn], as, b0, b1);
			}
		}
	}
TC_UNROLL
	for (int ri = 0; ri < 2; ri++) {
		if (!vrow[ri])
			continue;
		const int j = jrow[ri];
TC_UNROLL
		for (int dn = 0; dn < ND; dn++) {
			const int d = d0 + dn * 8 + 2 * tq;
			float2 gk = make_float2(ak[dn][2 * ri] * scale, ak[dn][2 * ri + 1] * scale);
			float2 gv = make_float2(av[dn][2 * ri], av[dn][2 * ri + 1]);
			if (group == 1) {
				float2 *pk = reinterpret_cast<float2 *>(dk + ((size_t)j * NKV + kh) * D + d);
				float2 *pv = reinterpret_cast<float2 *>(dv + ((size_t)j * NKV + kh) * D + d);
				float2 x = *pk, y = *pv;
				x.x += gk.x, x.y += gk.y, y.x += gv.x, y.y += gv.y;
				*pk = x, *pv = y;
			} else {
				size_t o = ((size_t)h * T + j) * D + d;
				*reinterpret_cast<float2 *>(wk + o) = gk;
				*reinterpret_cast<float2 *>(wv + o) = gv;
			}
		}
	}
}

// dk[j,kh,d] += sum over the group's query heads h (in order) of wk[h,j,d]; dv the same
__global__ void tc_bwd_reduce_kernel(float *dk, float *dv, const float *wk, const float *wv,
				     int T, int NH, int NKV, int D)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t n = (size_t)T * NKV * D;
	if (i >= n)
		return;
	int d = (int)(i % D);
	size_t r = i / D;
	int kh = (int)(r % NKV), j = (int)(r / NKV), group = NH / NKV;
	float sk = 0.0f, sv = 0.0f;
	for (int h = kh * group; h < (kh + 1) * group; h++) {
		size_t o = ((size_t)h * T + j) * D + d;
		sk += wk[o];
		sv += wv[o];
	}
	dk[i] += sk;
	dv[i] += sv;
}

// ---------------------------------------------------------------------------------
// host side

static void tc_check(const char *what, int S, int T, int NH, int NKV, int D, const bk_attn *ap)
{
	if (S < 0 || T < 0 || NH <= 0 || NKV <= 0 || NH % NKV || D <= 0)
		CUDA_BUG("cuda tc attention (%s): bad sizes S=%d T=%d NH=%d NKV=%d D=%d", what, S,
			 T, NH, NKV, D);
	if (T > 0 && S < 1)
		CUDA_BUG("cuda tc attention (%s): %d tokens in no sequence", what, T);
	if (!ap || ap->window < 0 || ap->softcap < 0)
		CUDA_BUG("cuda tc attention (%s): bad attention parameters", what);
}

static int tc_aligned(const void *p) { return p == NULL || ((uintptr_t)p & 15) == 0; }

extern "C" int bk_cuda_attention_tc_supports(int D) { return D == 64 || D == 128 || D == 256; }

// opt in to the kernel's dynamic shared memory (once per kernel instance)
template <typename K> static void tc_optin(K kernel, size_t bytes, int *done)
{
	if (*done)
		return;
	if (bytes > TC_SMEM_MAX)
		CUDA_BUG("cuda tc attention: %zu bytes of shared memory", bytes);
	CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
					(int)bytes));
	*done = 1;
}

// the schedule of kind kv (tc_sched_kernel) into order [ceil(T/64)]; NULL (position
// order) over TC_SCHED_MAX tiles
static const int *tc_schedule(int *order, const int32_t *cu, int S, int T, int W, int kv)
{
	int n = (T + 63) / 64;
	if (n > TC_SCHED_MAX)
		return NULL;
	BK_LAUNCH(tc_sched_kernel, 1, TC_SCHED_THREADS, (size_t)n * sizeof(int), bk_cuda_stream(), order, cu, S, T,
		  W, kv);
	return order;
}

template <int D, typename TI = float>
static void tc_forward(TI *out, float *lse, const TI *q, const TI *k, const TI *v,
		       const int32_t *cu, int S, int T, int NH, int NKV, const TI *pk,
		       const TI *pv, int P, const bk_attn *ap)
{
	static int optin;
	typedef TcFwd<D> C;
	void (*const kf)(TI *, float *, const TI *, const TI *, const TI *, const int32_t *, int,
			 int, int, int, const TI *, const TI *, int, float, float, int,
			 const int *) = tc_fwd_kernel<D, TI>; // (a name with a comma: not a macro argument)
	tc_optin(kf, C::smem, &optin);
	const int n = (T + C::BM - 1) / C::BM;
	const int *order = tc_schedule((int *)bk_cuda_workspace(0, (size_t)n * sizeof(int)), cu, S,
				       T, ap->window, 0);
	dim3 grid((unsigned)NH, (unsigned)n);
	BK_LAUNCH_N("tc_fwd_kernel", kf, grid, TC_THREADS, C::smem, bk_cuda_stream(), out, lse, q, k, v, cu, S, T, NH,
		  NKV, pk, pv, P, ap->scale, ap->softcap, ap->window, order);
}

template <int D, typename TI = float>
static void tc_backward(float *dq, float *dk, float *dv, const float *dout, const TI *q,
			const TI *k, const TI *v, const float *Di, const float *lse,
			const int32_t *cu, int S, int T, int NH, int NKV, const bk_attn *ap)
{
	static int optin_dq, optin_dkv;
	float scale = ap->scale, cap = ap->softcap;
	int W = ap->window;
	typedef TcDq<D> Q;
	typedef TcDkv<D> K;
	static_assert(Q::BM == 64 && K::BN == 64, "the schedule is of 64-row tiles");
	const int n = (T + 63) / 64;
	int *ws = (int *)bk_cuda_workspace(0, (size_t)2 * n * sizeof(int));
	const int *qorder = tc_schedule(ws, cu, S, T, W, 0);
	const int *korder = tc_schedule(ws + n, cu, S, T, W, 1);
	void (*const kq)(float *, const float *, const TI *, const TI *, const TI *, const float *,
			 const float *, const int32_t *, int, int, int, int, float, float, int,
			 const int *) = tc_bwd_dq_kernel<D, TI>;
	tc_optin(kq, Q::smem, &optin_dq);
	dim3 gq((unsigned)NH, (unsigned)n);
	BK_LAUNCH_N("tc_bwd_dq_kernel", kq, gq, TC_THREADS, Q::smem, bk_cuda_stream(), dq, dout, q, k, v, lse, Di, cu, S,
		  T, NH, NKV, scale, cap, W, qorder);

	float *wk = NULL, *wv = NULL;
	if (NH != NKV) { // per-query-head partials [NH,T,D] each
		size_t bytes = (size_t)NH * T * D * sizeof(float);
		wk = (float *)bk_cuda_workspace(1, bytes);
		wv = (float *)bk_cuda_workspace(2, bytes);
	}
	void (*const kk)(float *, float *, float *, float *, const float *, const TI *, const TI *,
			 const TI *, const float *, const float *, const int32_t *, int, int, int,
			 int, float, float, int, const int *) = tc_bwd_dkv_kernel<D, TI>;
	tc_optin(kk, K::smem, &optin_dkv);
	dim3 gk((unsigned)(NH * K::NZ), (unsigned)n);
	BK_LAUNCH_N("tc_bwd_dkv_kernel", kk, gk, TC_THREADS, K::smem, bk_cuda_stream(), dk, dv, wk, wv, dout, q, k, v,
		  lse, Di, cu, S, T, NH, NKV, scale, cap, W, korder);
	if (NH != NKV) {
		size_t n = (size_t)T * NKV * D;
		BK_LAUNCH(tc_bwd_reduce_kernel, bk_cuda_blocks(n, 256), 256, 0, bk_cuda_stream(), dk, dv, wk, wv, T,
			  NH, NKV, D);
	}
}

extern "C" void bk_cuda_attention_tc_forward(float *out, float *lse, const float *q,
					     const float *k, const float *v,
					     const int32_t *cu_seqlens, int S, int T, int NH,
					     int NKV, int D, const float *prefix_k,
					     const float *prefix_v, int P, const bk_attn *ap)
{
	tc_check("forward", S, T, NH, NKV, D, ap);
	if (P < 0 || (P > 0 && (!prefix_k || !prefix_v)))
		CUDA_BUG("cuda tc attention (forward): prefix of %d tokens without K/V", P);
	if (!bk_cuda_attention_tc_supports(D) || !tc_aligned(out) || !tc_aligned(q) ||
	    !tc_aligned(k) || !tc_aligned(v) || !tc_aligned(prefix_k) || !tc_aligned(prefix_v)) {
		bk_cuda_attention_forward(out, lse, q, k, v, cu_seqlens, S, T, NH, NKV, D,
					  prefix_k, prefix_v, P, ap);
		return;
	}
	if (T == 0)
		return;
	if (D == 64)
		tc_forward<64>(out, lse, q, k, v, cu_seqlens, S, T, NH, NKV, prefix_k, prefix_v, P,
			       ap);
	else if (D == 128)
		tc_forward<128>(out, lse, q, k, v, cu_seqlens, S, T, NH, NKV, prefix_k, prefix_v, P,
				ap);
	else
		tc_forward<256>(out, lse, q, k, v, cu_seqlens, S, T, NH, NKV, prefix_k, prefix_v, P,
				ap);
}

extern "C" void bk_cuda_attention_tc_backward(float *dq, float *dk, float *dv,
					      const float *dout, const float *q, const float *k,
					      const float *v, const float *out, const float *lse,
					      const int32_t *cu_seqlens, int S, int T, int NH,
					      int NKV, int D, const bk_attn *ap)
{
	tc_check("backward", S, T, NH, NKV, D, ap);
	if (!bk_cuda_attention_tc_supports(D) || !tc_aligned(dq) || !tc_aligned(dk) ||
	    !tc_aligned(dv) || !tc_aligned(dout) || !tc_aligned(q) || !tc_aligned(k) ||
	    !tc_aligned(v)) {
		bk_cuda_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens, S, T,
					   NH, NKV, D, ap);
		return;
	}
	if (T == 0)
		return;
	float *Di = (float *)bk_cuda_workspace(3, (size_t)NH * T * sizeof(float)); // [NH,T]
	size_t warps = (size_t)T * NH;
	BK_LAUNCH(bk_attn_dot_kernel, bk_cuda_blocks(warps * 32, 256), 256, 0, bk_cuda_stream(), Di, dout, out, T, NH,
		  D);
	if (D == 64)
		tc_backward<64>(dq, dk, dv, dout, q, k, v, Di, lse, cu_seqlens, S, T, NH, NKV, ap);
	else if (D == 128)
		tc_backward<128>(dq, dk, dv, dout, q, k, v, Di, lse, cu_seqlens, S, T, NH, NKV, ap);
	else
		tc_backward<256>(dq, dk, dv, dout, q, k, v, Di, lse, cu_seqlens, S, T, NH, NKV, ap);
}

// ---------------------------------------------------------------------------------
// bf16 activations (BK_ACT=bf16, gpu/cuda/cuda_act.cuh): q, k, v, the prefix and out are
// bf16; the kernels above stage them into shared memory by a copy instead of a rounding
// (the same bf16 tiles as when the fp32 path rounds an fp32 value that was itself
// bf16), write out as bf16 pairs, and D_i = dout . out reads the bf16 out.  Everything
// else (lse, D_i, dq/dk/dv, dout) stays fp32.

// Di [NH,T] = sum_d dout[t,h,d] * out[t,h,d], out bf16: bk_attn_dot_kernel's order
__global__ void tc_dot_bf16_kernel(float *Di, const float *dout, const tc_bf16 *out, int T,
				   int NH, int D)
{
	size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (w >= (size_t)T * NH)
		return;
	int t = (int)(w / NH), h = (int)(w % NH);
	const float *a = dout + w * D;
	const tc_bf16 *b = out + w * D;
	float acc = 0.0f;
	for (int d = lane; d < D; d += 32)
		acc = fmaf(a[d], tc_bf16_f32(b[d]), acc);
	acc = bk_warp_sum(acc);
	if (lane == 0)
		Di[(size_t)h * T + t] = acc;
}

extern "C" int bk_cuda_attention_tc_bf16_ok(int D, const void *const *bufs, int n)
{
	if (!bk_cuda_attention_tc_supports(D))
		return 0;
	for (int i = 0; i < n; i++)
		if (!tc_aligned(bufs[i]))
			return 0;
	return 1;
}

extern "C" void bk_cuda_attention_tc_forward_bf16(void *out, float *lse, const void *q,
						  const void *k, const void *v,
						  const int32_t *cu_seqlens, int S, int T, int NH,
						  int NKV, int D, const void *prefix_k,
						  const void *prefix_v, int P, const bk_attn *ap)
{
	tc_check("forward, bf16", S, T, NH, NKV, D, ap);
	if (P < 0 || (P > 0 && (!prefix_k || !prefix_v)))
		CUDA_BUG("cuda tc attention (forward, bf16): prefix of %d tokens without K/V", P);
	const void *b[] = { out, q, k, v, prefix_k, prefix_v };
	if (!bk_cuda_attention_tc_bf16_ok(D, b, 6))
		CUDA_BUG("cuda tc attention (forward, bf16): D=%d or an unaligned buffer", D);
	if (T == 0)
		return;
	typedef tc_bf16 B;
	B *o = (B *)out;
	const B *qb = (const B *)q, *kb = (const B *)k, *vb = (const B *)v;
	const B *pk = (const B *)prefix_k, *pv = (const B *)prefix_v;
	if (D == 64)
		tc_forward<64, B>(o, lse, qb, kb, vb, cu_seqlens, S, T, NH, NKV, pk, pv, P, ap);
	else if (D == 128)
		tc_forward<128, B>(o, lse, qb, kb, vb, cu_seqlens, S, T, NH, NKV, pk, pv, P, ap);
	else
		tc_forward<256, B>(o, lse, qb, kb, vb, cu_seqlens, S, T, NH, NKV, pk, pv, P, ap);
}

extern "C" void bk_cuda_attention_tc_backward_bf16(float *dq, float *dk, float *dv,
						   const float *dout, const void *q, const void *k,
						   const void *v, const void *out, const float *lse,
						   const int32_t *cu_seqlens, int S, int T, int NH,
						   int NKV, int D, const bk_attn *ap)
{
	tc_check("backward, bf16", S, T, NH, NKV, D, ap);
	const void *b[] = { dq, dk, dv, dout, q, k, v, out };
	if (!bk_cuda_attention_tc_bf16_ok(D, b, 8))
		CUDA_BUG("cuda tc attention (backward, bf16): D=%d or an unaligned buffer", D);
	if (T == 0)
		return;
	typedef tc_bf16 B;
	const B *qb = (const B *)q, *kb = (const B *)k, *vb = (const B *)v;
	float *Di = (float *)bk_cuda_workspace(3, (size_t)NH * T * sizeof(float)); // [NH,T]
	size_t warps = (size_t)T * NH;
	BK_LAUNCH(tc_dot_bf16_kernel, bk_cuda_blocks(warps * 32, 256), 256, 0, bk_cuda_stream(), Di, dout,
		  (const B *)out, T, NH, D);
	if (D == 64)
		tc_backward<64, B>(dq, dk, dv, dout, qb, kb, vb, Di, lse, cu_seqlens, S, T, NH, NKV, ap);
	else if (D == 128)
		tc_backward<128, B>(dq, dk, dv, dout, qb, kb, vb, Di, lse, cu_seqlens, S, T, NH, NKV,
				    ap);
	else
		tc_backward<256, B>(dq, dk, dv, dout, qb, kb, vb, Di, lse, cu_seqlens, S, T, NH, NKV,
				    ap);
}

// ---------------------------------------------------------------------------------
// BK_ATTN: which kernel the op table runs

static int tc_selected(void)
{
	static int mode; // 0: not read yet; 1: fp32; 2: tc
	return bk_cuda_env_mode(&mode, "BK_ATTN", "fp32", "tc", 0) == 2;
}

extern "C" int bk_cuda_attention_tc_selected(void) { return tc_selected(); }

extern "C" void bk_cuda_attention_forward_sel(float *out, float *lse, const float *q,
					      const float *k, const float *v,
					      const int32_t *cu_seqlens, int S, int T, int NH,
					      int NKV, int D, const float *prefix_k,
					      const float *prefix_v, int P, const bk_attn *ap)
{
	if (tc_selected())
		bk_cuda_attention_tc_forward(out, lse, q, k, v, cu_seqlens, S, T, NH, NKV, D,
					     prefix_k, prefix_v, P, ap);
	else
		bk_cuda_attention_forward(out, lse, q, k, v, cu_seqlens, S, T, NH, NKV, D, prefix_k,
					  prefix_v, P, ap);
}

extern "C" void bk_cuda_attention_backward_sel(float *dq, float *dk, float *dv,
					       const float *dout, const float *q, const float *k,
					       const float *v, const float *out, const float *lse,
					       const int32_t *cu_seqlens, int S, int T, int NH,
					       int NKV, int D, const bk_attn *ap)
{
	if (tc_selected())
		bk_cuda_attention_tc_backward(dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens, S, T,
					      NH, NKV, D, ap);
	else
		bk_cuda_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, cu_seqlens, S, T,
					   NH, NKV, D, ap);
}

extern "C" double bk_cuda_time_ms(void (*fn)(void *arg), void *arg, int reps)
{
	cudaStream_t st = bk_cuda_stream();
	cudaEvent_t a, b;
	CUDA_CHECK(cudaEventCreate(&a));
	CUDA_CHECK(cudaEventCreate(&b));
	fn(arg); // warm-up (first-call opt-ins, workspace growth)
	CUDA_CHECK(cudaEventRecord(a, st));
	for (int i = 0; i < reps; i++)
		fn(arg);
	CUDA_CHECK(cudaEventRecord(b, st));
	CUDA_CHECK(cudaEventSynchronize(b));
	float ms = 0.0f;
	CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
	CUDA_CHECK(cudaEventDestroy(a));
	CUDA_CHECK(cudaEventDestroy(b));
	return reps > 0 ? (double)ms / reps : 0.0;
}
