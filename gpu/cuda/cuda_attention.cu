// cuda_attention.cu - fused causal GQA attention over packed variable-length sequences
// (ops.h attention_forward / attention_backward) in the FlashAttention-2 manner: query
// tiles against key tiles in shared memory, online softmax, lse saved; the backward
// recomputes the probabilities from q, k and lse, so no [T,T] matrix is ever held.
// Not the decode attention of generation and not the judge (host_ops.c is).
//
// Choices:
//  - fp32 all the way (q/k/v are fp32 in the interface; CUDA-core FMAs from shared
//    memory, fp32 softmax and accumulators): results are within fp32 rounding of the
//    host twin.  At the shapes of training (a few hundred tokens per sequence) the
//    attention is ~1% of a step's FLOPs, so tensor cores are not used here.
//  - any head dimension D: the tile edge BT (query rows = key columns per tile) is the
//    largest power of two <= 64 whose shared memory fits in ATT_SMEM_MAX; D = 64 gives
//    BT = 64 (forward) / 32 (backward), D = 128 gives 32 / 16, D = 8 gives 64.
//  - a query tile covers BT consecutive packed tokens, whatever sequences they belong
//    to: each row finds its sequence start by binary search in cu_seqlens and masks
//    keys outside [start, t]; the tile loops over the keys from its first row's
//    sequence start to its last row (plus every prefix key first, in the forward).
//  - backward, two kernels and no atomics (deterministic): dq by query tiles (like the
//    forward), dk/dv by key tiles looping over the query rows that can see them and
//    over the NH/NKV query heads of the kv head, so one block owns its dk/dv rows.
//    Both recompute p = exp(cap(q.k * scale) - lse); D_i = dout_i . out_i comes first.
//  - the attention parameters of ops.h (bk_attn): scale, softcap (tanh(s/c) c before
//    the mask; its derivative 1 - (capped/c)^2 in the backward) and a sliding window
//    (query at position i sees keys at positions > i - W: own key tiles wholly before
//    a tile's window are skipped, prefix keys at positions 0..P-1 are masked by it).
#include "gpu/cuda/cuda_common.cuh"
#include "gpu/cuda/cuda_attn_dot.cuh"

#include <math.h>

#define ATT_THREADS 256
#define ATT_SMEM_MAX (96 * 1024) // fits the opt-in limit of sm_80 / sm_86 / sm_90

// the sequence of packed token t: the largest s with cu[s] <= t (cu [S+1], cu[S] = T > t)
__device__ __forceinline__ int att_seq_of(const int32_t *cu, int S, int t)
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

__device__ __forceinline__ float att_warp_max(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// dst [BT][LD] = rows r0..r0+n-1 of src [rows,nh,D] at head h (rows >= n are zero)
__device__ __forceinline__ void att_load_tile(float *dst, const float *src, int r0, int n,
					      int nh, int h, int D, int LD, int BT)
{
	for (int i = threadIdx.x; i < BT * D; i += blockDim.x) {
		int r = i / D, d = i - r * D;
		dst[r * LD + d] = r < n ? src[((size_t)(r0 + r) * nh + h) * D + d] : 0.0f;
	}
}

// ---------------------------------------------------------------------------------
// forward

// shared floats of the forward: Q, O, K, V tiles [BT][D+1], scores [BT][BT+1], m, l,
// alpha [BT], row starts [BT] (int)
static size_t fwd_smem(int BT, int D)
{
	return ((size_t)4 * BT * (D + 1) + (size_t)BT * (BT + 1) + 4 * (size_t)BT) * sizeof(float);
}

// the score of raw q.k: cap(acc * scale)
__device__ __forceinline__ float att_score(float acc, float scale, float cap)
{
	float s = acc * scale;
	return cap > 0.0f ? tanhf(s / cap) * cap : s;
}

// One key tile into the running (m, l, O) of the query tile.  Keys j0..j0+nc-1 of kg/vg
// [*,NKV,D]; prefix keys (positions j) are visible to every row within the window, own
// keys to rows with start <= j <= t and t - j < W.  Row r is at position P + t - start.
__device__ __forceinline__ void fwd_tile(const float *kg, const float *vg, int j0, int nc,
					 bool prefix, int NKV, int kh, int D, int LD, int BT,
					 int t0, int nr, float scale, float cap, int W, int P,
					 float *Qs, float *Os,
					 float *Ks, float *Vs, float *Ss, float *mrow, float *lrow,
					 float *arow, const int *rstart)
{
	const int SL = BT + 1;
	att_load_tile(Ks, kg, j0, nc, NKV, kh, D, LD, BT);
	att_load_tile(Vs, vg, j0, nc, NKV, kh, D, LD, BT);
	__syncthreads();
	// S [BT,BT] = Q K^T * scale, masked to -inf
	for (int i = threadIdx.x; i < BT * BT; i += blockDim.x) {
		int r = i / BT, c = i - r * BT, j = j0 + c;
		float sc = -INFINITY;
		bool vis = false;
		if (r < nr && c < nc) {
			int qpos = P + t0 + r - rstart[r];
			vis = prefix ? (W <= 0 || qpos - j < W)
				     : (j >= rstart[r] && j <= t0 + r && (W <= 0 || t0 + r - j < W));
		}
		if (vis) {
			const float *qr = Qs + r * LD, *kc = Ks + c * LD;
			float acc = 0.0f;
			for (int d = 0; d < D; d++)
				acc = fmaf(qr[d], kc[d], acc);
			sc = att_score(acc, scale, cap);
		}
		Ss[r * SL + c] = sc;
	}
	__syncthreads();
	// online softmax, one warp per row: S <- exp(S - m_new), l, m, alpha = exp(m_old - m_new)
	int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarp = blockDim.x >> 5;
	for (int r = warp; r < BT; r += nwarp) {
		float mold = mrow[r], lold = lrow[r], mx = -INFINITY;
		for (int c = lane; c < BT; c += 32)
			mx = fmaxf(mx, Ss[r * SL + c]);
		mx = att_warp_max(mx);
		float mnew = fmaxf(mold, mx);
		float mu = mnew == -INFINITY ? 0.0f : mnew; // a row with nothing visible yet
		float sum = 0.0f;
		for (int c = lane; c < BT; c += 32) {
			float p = expf(Ss[r * SL + c] - mu);
			Ss[r * SL + c] = p;
			sum += p;
		}
		sum = bk_warp_sum(sum);
		if (lane == 0) {
			float alpha = expf(mold - mu);
			lrow[r] = lold * alpha + sum;
			mrow[r] = mnew;
			arow[r] = alpha;
		}
	}
	__syncthreads();
	// O = alpha O + P V
	for (int i = threadIdx.x; i < BT * D; i += blockDim.x) {
		int r = i / D, d = i - r * D;
		const float *pr = Ss + r * SL;
		float acc = Os[r * LD + d] * arow[r];
		for (int c = 0; c < nc; c++)
			acc = fmaf(pr[c], Vs[c * LD + d], acc);
		Os[r * LD + d] = acc;
	}
	__syncthreads();
}

// grid (ceil(T/BT), NH): query rows t0..t0+BT-1 of head h
__global__ void __launch_bounds__(ATT_THREADS)
attn_fwd_kernel(float *out /* [T,NH,D] */, float *lse /* [NH,T] */, const float *q,
		const float *k, const float *v, const int32_t *cu, int S, int T, int NH, int NKV,
		int D, const float *pk, const float *pv, int P, float scale, float cap, int W,
		int BT)
{
	BK_DYN_SMEM(float, sm);
	const int LD = D + 1, h = blockIdx.y, kh = h / (NH / NKV);
	const int t0 = blockIdx.x * BT, nr = min(BT, T - t0);
	float *Qs = sm, *Os = Qs + BT * LD, *Ks = Os + BT * LD, *Vs = Ks + BT * LD;
	float *Ss = Vs + BT * LD, *mrow = Ss + BT * (BT + 1), *lrow = mrow + BT, *arow = lrow + BT;
	int *rstart = (int *)(arow + BT);
	att_load_tile(Qs, q, t0, nr, NH, h, D, LD, BT);
	for (int i = threadIdx.x; i < BT * D; i += blockDim.x)
		Os[(i / D) * LD + i % D] = 0.0f;
	for (int r = threadIdx.x; r < BT; r += blockDim.x) {
		mrow[r] = -INFINITY;
		lrow[r] = 0.0f;
		rstart[r] = r < nr ? cu[att_seq_of(cu, S, t0 + r)] : 0;
	}
	__syncthreads();
	// every prefix tile (the window masks its keys: rows of a later sequence in the tile
	// may sit at smaller positions than row 0); own-key tiles wholly before row 0's
	// window are skipped (every later row's window starts later)
	for (int j0 = 0; j0 < P; j0 += BT)
		fwd_tile(pk, pv, j0, min(BT, P - j0), true, NKV, kh, D, LD, BT, t0, nr, scale, cap,
			 W, P, Qs, Os, Ks, Vs, Ss, mrow, lrow, arow, rstart);
	const int kend = t0 + nr;
	const int kfirst = W > 0 ? max(rstart[0], t0 - W + 1) : rstart[0];
	for (int j0 = kfirst; j0 < kend; j0 += BT)
		fwd_tile(k, v, j0, min(BT, kend - j0), false, NKV, kh, D, LD, BT, t0, nr, scale,
			 cap, W, P, Qs, Os, Ks, Vs, Ss, mrow, lrow, arow, rstart);
	for (int i = threadIdx.x; i < nr * D; i += blockDim.x) {
		int r = i / D, d = i - r * D;
		out[((size_t)(t0 + r) * NH + h) * D + d] = Os[r * LD + d] / lrow[r];
	}
	for (int r = threadIdx.x; r < nr; r += blockDim.x)
		lse[(size_t)h * T + t0 + r] = mrow[r] + logf(lrow[r]);
}

// ---------------------------------------------------------------------------------
// backward


// dq kernel: Q, dO, dQ, K, V tiles, dS [BT][BT+1], lse, Di, row starts
static size_t bwd_dq_smem(int BT, int D)
{
	return ((size_t)5 * BT * (D + 1) + (size_t)BT * (BT + 1) + 3 * (size_t)BT) * sizeof(float);
}

// grid (ceil(T/BT), NH): dq rows t0.. of head h += scale * sum_j ds_ij k_j
__global__ void __launch_bounds__(ATT_THREADS)
attn_bwd_dq_kernel(float *dq, const float *dout, const float *q, const float *k,
		   const float *v, const float *lse, const float *Di, const int32_t *cu, int S,
		   int T, int NH, int NKV, int D, float scale, float cap, int W, int BT)
{
	BK_DYN_SMEM(float, sm);
	const int LD = D + 1, SL = BT + 1, h = blockIdx.y, kh = h / (NH / NKV);
	const int t0 = blockIdx.x * BT, nr = min(BT, T - t0);
	float *Qs = sm, *dOs = Qs + BT * LD, *dQs = dOs + BT * LD, *Ks = dQs + BT * LD;
	float *Vs = Ks + BT * LD, *dSs = Vs + BT * LD, *lrow = dSs + BT * SL, *drow = lrow + BT;
	int *rstart = (int *)(drow + BT);
	att_load_tile(Qs, q, t0, nr, NH, h, D, LD, BT);
	att_load_tile(dOs, dout, t0, nr, NH, h, D, LD, BT);
	for (int i = threadIdx.x; i < BT * D; i += blockDim.x)
		dQs[(i / D) * LD + i % D] = 0.0f;
	for (int r = threadIdx.x; r < BT; r += blockDim.x) {
		lrow[r] = r < nr ? lse[(size_t)h * T + t0 + r] : 0.0f;
		drow[r] = r < nr ? Di[(size_t)h * T + t0 + r] : 0.0f;
		rstart[r] = r < nr ? cu[att_seq_of(cu, S, t0 + r)] : 0;
	}
	__syncthreads();
	const int kend = t0 + nr;
	const int kfirst = W > 0 ? max(rstart[0], t0 - W + 1) : rstart[0];
	for (int j0 = kfirst; j0 < kend; j0 += BT) {
		int nc = min(BT, kend - j0);
		att_load_tile(Ks, k, j0, nc, NKV, kh, D, LD, BT);
		att_load_tile(Vs, v, j0, nc, NKV, kh, D, LD, BT);
		__syncthreads();
		for (int i = threadIdx.x; i < BT * BT; i += blockDim.x) {
			int r = i / BT, c = i - r * BT, j = j0 + c;
			float ds = 0.0f;
			if (r < nr && c < nc && j >= rstart[r] && j <= t0 + r &&
			    (W <= 0 || t0 + r - j < W)) {
				const float *qr = Qs + r * LD, *gr = dOs + r * LD;
				const float *kc = Ks + c * LD, *vc = Vs + c * LD;
				float s = 0.0f, dp = 0.0f;
				for (int d = 0; d < D; d++) {
					s = fmaf(qr[d], kc[d], s);
					dp = fmaf(gr[d], vc[d], dp);
				}
				float sc = att_score(s, scale, cap);
				float p = expf(sc - lrow[r]);
				ds = p * (dp - drow[r]);
				if (cap > 0.0f)
					ds *= 1.0f - (sc / cap) * (sc / cap);
			}
			dSs[r * SL + c] = ds;
		}
		__syncthreads();
		for (int i = threadIdx.x; i < BT * D; i += blockDim.x) {
			int r = i / D, d = i - r * D;
			const float *sr = dSs + r * SL;
			float acc = 0.0f;
			for (int c = 0; c < nc; c++)
				acc = fmaf(sr[c], Ks[c * LD + d], acc);
			dQs[r * LD + d] += acc * scale;
		}
		__syncthreads();
	}
	for (int i = threadIdx.x; i < nr * D; i += blockDim.x) {
		int r = i / D, d = i - r * D;
		dq[((size_t)(t0 + r) * NH + h) * D + d] += dQs[r * LD + d];
	}
}

// dk/dv kernel: K, V, dK, dV, Q, dO tiles, P and dS [BT][BT+1], lse, Di, row starts
static size_t bwd_dkv_smem(int BT, int D)
{
	return ((size_t)6 * BT * (D + 1) + (size_t)2 * BT * (BT + 1) + 3 * (size_t)BT) *
	       sizeof(float);
}

// grid (ceil(T/BT), NKV): keys j0..j0+BT-1 of kv head kh; loops over the query heads of
// the group and the query rows j0 .. end of the last key's sequence
__global__ void __launch_bounds__(ATT_THREADS)
attn_bwd_dkv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k,
		    const float *v, const float *lse, const float *Di, const int32_t *cu, int S,
		    int T, int NH, int NKV, int D, float scale, float cap, int W, int BT)
{
	BK_DYN_SMEM(float, sm);
	const int LD = D + 1, SL = BT + 1, kh = blockIdx.y, group = NH / NKV;
	const int j0 = blockIdx.x * BT, nc = min(BT, T - j0);
	float *Ks = sm, *Vs = Ks + BT * LD, *dKs = Vs + BT * LD, *dVs = dKs + BT * LD;
	float *Qs = dVs + BT * LD, *dOs = Qs + BT * LD, *Ps = dOs + BT * LD, *dSs = Ps + BT * SL;
	float *lrow = dSs + BT * SL, *drow = lrow + BT;
	int *rstart = (int *)(drow + BT);
	att_load_tile(Ks, k, j0, nc, NKV, kh, D, LD, BT);
	att_load_tile(Vs, v, j0, nc, NKV, kh, D, LD, BT);
	for (int i = threadIdx.x; i < BT * D; i += blockDim.x) {
		int r = i / D, d = i - r * D;
		dKs[r * LD + d] = 0.0f;
		dVs[r * LD + d] = 0.0f;
	}
	int qend = cu[att_seq_of(cu, S, j0 + nc - 1) + 1];
	if (W > 0) // rows past the last key's window see none of these keys
		qend = min(qend, j0 + nc - 1 + W);
	for (int h = kh * group; h < (kh + 1) * group; h++) {
		for (int i0 = j0; i0 < qend; i0 += BT) {
			int nr = min(BT, qend - i0);
			__syncthreads(); // the previous tile's readers are done
			att_load_tile(Qs, q, i0, nr, NH, h, D, LD, BT);
			att_load_tile(dOs, dout, i0, nr, NH, h, D, LD, BT);
			for (int r = threadIdx.x; r < BT; r += blockDim.x) {
				lrow[r] = r < nr ? lse[(size_t)h * T + i0 + r] : 0.0f;
				drow[r] = r < nr ? Di[(size_t)h * T + i0 + r] : 0.0f;
				rstart[r] = r < nr ? cu[att_seq_of(cu, S, i0 + r)] : 0;
			}
			__syncthreads();
			for (int i = threadIdx.x; i < BT * BT; i += blockDim.x) {
				int r = i / BT, c = i - r * BT, j = j0 + c;
				float p = 0.0f, ds = 0.0f;
				if (r < nr && c < nc && j >= rstart[r] && j <= i0 + r &&
				    (W <= 0 || i0 + r - j < W)) {
					const float *qr = Qs + r * LD, *gr = dOs + r * LD;
					const float *kc = Ks + c * LD, *vc = Vs + c * LD;
					float s = 0.0f, dp = 0.0f;
					for (int d = 0; d < D; d++) {
						s = fmaf(qr[d], kc[d], s);
						dp = fmaf(gr[d], vc[d], dp);
					}
					float sc = att_score(s, scale, cap);
					p = expf(sc - lrow[r]);
					ds = p * (dp - drow[r]);
					if (cap > 0.0f)
						ds *= 1.0f - (sc / cap) * (sc / cap);
				}
				Ps[r * SL + c] = p;
				dSs[r * SL + c] = ds;
			}
			__syncthreads();
			// dV[c] += sum_r p_rc dO_r;  dK[c] += scale * sum_r ds_rc Q_r
			for (int i = threadIdx.x; i < BT * D; i += blockDim.x) {
				int c = i / D, d = i - c * D;
				float av = 0.0f, ak = 0.0f;
				for (int r = 0; r < nr; r++) {
					av = fmaf(Ps[r * SL + c], dOs[r * LD + d], av);
					ak = fmaf(dSs[r * SL + c], Qs[r * LD + d], ak);
				}
				dVs[c * LD + d] += av;
				dKs[c * LD + d] += ak * scale;
			}
		}
	}
	__syncthreads();
	for (int i = threadIdx.x; i < nc * D; i += blockDim.x) {
		int c = i / D, d = i - c * D;
		size_t o = ((size_t)(j0 + c) * NKV + kh) * D + d;
		dk[o] += dKs[c * LD + d];
		dv[o] += dVs[c * LD + d];
	}
}

// ---------------------------------------------------------------------------------
// host side

// the largest tile edge <= 64 whose shared memory fits; dies when not even 1 does
static int att_tile(size_t (*smem)(int, int), int D, const char *what)
{
	for (int bt = 64; bt >= 1; bt >>= 1)
		if (smem(bt, D) <= ATT_SMEM_MAX)
			return bt;
	die("cuda attention (%s): head dimension %d needs more shared memory than %d bytes",
	    what, D, ATT_SMEM_MAX);
}

static void att_check(const char *what, int S, int T, int NH, int NKV, int D)
{
	if (S < 0 || T < 0 || NH <= 0 || NKV <= 0 || NH % NKV || D <= 0)
		CUDA_BUG("cuda attention (%s): bad sizes S=%d T=%d NH=%d NKV=%d D=%d", what, S, T,
			 NH, NKV, D);
	if (T > 0 && S < 1)
		CUDA_BUG("cuda attention (%s): %d tokens in no sequence", what, T);
}

// opt in to more than 48 KiB of dynamic shared memory, once per kernel
static void att_smem_optin(const void *kernel, int *done)
{
	if (*done)
		return;
	CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
					ATT_SMEM_MAX));
	*done = 1;
}

extern "C" void bk_cuda_attention_forward(float *out, float *lse, const float *q,
					  const float *k, const float *v,
					  const int32_t *cu_seqlens, int S, int T, int NH, int NKV,
					  int D, const float *prefix_k, const float *prefix_v, int P,
					  const bk_attn *ap)
{
	static int optin;
	att_check("forward", S, T, NH, NKV, D);
	if (!ap || ap->window < 0 || ap->softcap < 0)
		CUDA_BUG("cuda attention (forward): bad attention parameters");
	if (P < 0 || (P > 0 && (!prefix_k || !prefix_v)))
		CUDA_BUG("cuda attention (forward): prefix of %d tokens without K/V", P);
	if (T == 0)
		return;
	int bt = att_tile(fwd_smem, D, "forward");
	att_smem_optin((const void *)attn_fwd_kernel, &optin);
	dim3 grid((unsigned)((T + bt - 1) / bt), (unsigned)NH);
	BK_LAUNCH(attn_fwd_kernel, grid, ATT_THREADS, fwd_smem(bt, D), bk_cuda_stream(),
		out, lse, q, k, v, cu_seqlens, S, T, NH, NKV, D, prefix_k, prefix_v, P, ap->scale,
		ap->softcap, ap->window, bt);
}

extern "C" void bk_cuda_attention_backward(float *dq, float *dk, float *dv, const float *dout,
					   const float *q, const float *k, const float *v,
					   const float *out, const float *lse,
					   const int32_t *cu_seqlens, int S, int T, int NH, int NKV,
					   int D, const bk_attn *ap)
{
	static int optin_dq, optin_dkv;
	att_check("backward", S, T, NH, NKV, D);
	if (!ap || ap->window < 0 || ap->softcap < 0)
		CUDA_BUG("cuda attention (backward): bad attention parameters");
	if (T == 0)
		return;
	cudaStream_t st = bk_cuda_stream();
	float scale = ap->scale, cap = ap->softcap;
	int W = ap->window;
	float *Di = (float *)bk_cuda_workspace(3, (size_t)NH * T * sizeof(float)); // [NH,T]
	size_t warps = (size_t)T * NH;
	BK_LAUNCH(bk_attn_dot_kernel, bk_cuda_blocks(warps * 32, 256), 256, 0, st, Di, dout, out, T, NH,
									    D);

	int bq = att_tile(bwd_dq_smem, D, "backward dq");
	att_smem_optin((const void *)attn_bwd_dq_kernel, &optin_dq);
	dim3 gq((unsigned)((T + bq - 1) / bq), (unsigned)NH);
	BK_LAUNCH(attn_bwd_dq_kernel, gq, ATT_THREADS, bwd_dq_smem(bq, D), st,
		dq, dout, q, k, v, lse, Di, cu_seqlens, S, T, NH, NKV, D, scale, cap, W, bq);

	int bk = att_tile(bwd_dkv_smem, D, "backward dk/dv");
	att_smem_optin((const void *)attn_bwd_dkv_kernel, &optin_dkv);
	dim3 gk((unsigned)((T + bk - 1) / bk), (unsigned)NKV);
	BK_LAUNCH(attn_bwd_dkv_kernel, gk, ATT_THREADS, bwd_dkv_smem(bk, D), st,
		dk, dv, dout, q, k, v, lse, Di, cu_seqlens, S, T, NH, NKV, D, scale, cap, W, bk);
}
