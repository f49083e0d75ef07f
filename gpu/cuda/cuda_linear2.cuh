// cuda_linear2.cuh - the v2 decode linear kernels (BK_DECODE=v2) of gpu/cuda/cuda_gen.cu
// (the reduction order is described there), on a bf16 weight or, for decode, straight on a
// 4-bit one (gen_linear2_q4_kernel: cuda_wsrc.cuh, the same results bit for bit).
// Included by cuda_gen.cu after pack_bf16 and mma_bf16, and by tests/emu/test_decode2.cc,
// which launches them on their own on the emulated GPU.

#include "gpu/cuda/cuda_wsrc.cuh"

#define BK_UNROLL _Pragma("unroll")

enum { L2_KP = 256, L2_PAD = 8, L2_UNROLL = 4, L2_TARGET_BLOCKS = 264, L2_DEC_NW = 4,
       L2_PRE_NW = 8, L2_NCNT = 4096 };

// KS ranges of CPS chunks of 32 inputs: about L2_TARGET_BLOCKS decode blocks, at least
// 2 chunks a range; from (in, out) alone
static void lin2_plan(int in, int out, int *ks_out, int *cps_out)
{
	int nchunk = (in + 31) / 32, tiles = (out + 63) / 64;
	int ks = (L2_TARGET_BLOCKS + tiles - 1) / tiles, maxks = nchunk / 2 > 1 ? nchunk / 2 : 1;
	ks = ks < maxks ? ks : maxks;
	int cps = (nchunk + ks - 1) / ks;
	*ks_out = (nchunk + cps - 1) / cps;
	*cps_out = cps;
}

// acc[NT][4] += the chunks [c0, c1) of this warp's 16 outputs (rows oa = o0+g, ob = oa+8)
// over the block's NT*8 tokens; x staged by the whole block; W from the source ws
// (cuda_wsrc.cuh: fetched a group ahead, expanded just before its mmas)
template <int NW, int NT, class WS>
static __device__ __forceinline__ void lin2_range(float (*acc)[4], uint32_t (*xs)[(L2_KP + L2_PAD) / 2],
					   const float *x, const WS &ws, int T, int in,
					   int out, int t0, int oa, int c0, int c1, bool vec)
{
	int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
	for (int j = 0; j < NT; j++)
		acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
	for (int cp = c0; cp < c1; cp += L2_KP / 32) {
		int np = c1 - cp < L2_KP / 32 ? c1 - cp : L2_KP / 32, kb = cp * 32, hw = np * 16;
		// the piece's first group of W loads goes out before x is staged, and each
		// group's successor before its mmas: up to 16 16-byte loads in flight
		uint4 ra[L2_UNROLL], rb[L2_UNROLL];
BK_UNROLL
		for (int u = 0; u < L2_UNROLL; u++) {
			int k = (cp + u) * 32 + q * 8;
			ra[u] = ws.fetch(oa, k, in, out, vec, u < np);
			rb[u] = ws.fetch(oa + 8, k, in, out, vec, u < np);
		}
		__syncthreads(); // the previous piece is consumed
		for (int i = threadIdx.x; i < NT * 8 * hw; i += NW * 32) {
			int r = i / hw, kk = (i - r * hw) * 2, t = t0 + r, k = kb + kk;
			float a = 0.0f, b = 0.0f;
			if (t < T) {
				const float *p = x + (size_t)t * in + k;
				if (vec) { // in % 8 == 0: the pair is inside or outside
					if (k < in) {
						float2 f = *reinterpret_cast<const float2 *>(p);
						a = f.x, b = f.y;
					}
				} else {
					a = k < in ? p[0] : 0.0f;
					b = k + 1 < in ? p[1] : 0.0f;
				}
			}
			xs[r][kk / 2] = pack_bf16(a, b);
		}
		__syncthreads();
		for (int c = 0; c < np; c += L2_UNROLL) {
			uint4 na[L2_UNROLL], nb[L2_UNROLL];
BK_UNROLL
			for (int u = 0; u < L2_UNROLL; u++) { // the next group
				int k = (cp + c + L2_UNROLL + u) * 32 + q * 8;
				bool live = c + L2_UNROLL + u < np;
				na[u] = ws.fetch(oa, k, in, out, vec, live);
				nb[u] = ws.fetch(oa + 8, k, in, out, vec, live);
			}
BK_UNROLL
			for (int u = 0; u < L2_UNROLL; u++) {
				if (c + u >= np)
					break;
				int kk = (c + u) * 32 + q * 8;
				uint4 wa = ws.expand(ra[u], vec), wb = ws.expand(rb[u], vec);
BK_UNROLL
				for (int j = 0; j < NT; j++) {
					uint4 b = *reinterpret_cast<const uint4 *>(&xs[j * 8 + g][kk / 2]);
					// mma 1: k slots (2q, 2q+1) <- p0, (2q+8, 2q+9) <- p1; mma 2: p2, p3
					mma_bf16(acc[j], wa.x, wb.x, wa.y, wb.y, b.x, b.y);
					mma_bf16(acc[j], wa.z, wb.z, wa.w, wb.w, b.z, b.w);
				}
			}
BK_UNROLL
			for (int u = 0; u < L2_UNROLL; u++)
				ra[u] = na[u], rb[u] = nb[u];
		}
	}
}

// decode: block (64 outputs, NT*8 tokens, range z); part [KS][T][out], cnt [tiles] zeros
template <int NT, class WS>
static __device__ __forceinline__ void lin2_decode(float *y, const float *x, const WS &ws, int T,
						   int in, int out, int KS, int CPS, float *part,
						   unsigned *cnt)
{
	__shared__ __align__(16) uint32_t xs[NT * 8][(L2_KP + L2_PAD) / 2]; // bf16 pairs
	__shared__ int s_last;
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
	int ob0 = blockIdx.x * L2_DEC_NW * 16, o0 = ob0 + warp * 16, t0 = blockIdx.y * NT * 8;
	int s = blockIdx.z, nchunk = (in + 31) / 32;
	int c0 = s * CPS, c1 = c0 + CPS < nchunk ? c0 + CPS : nchunk;
	float acc[NT][4];
	lin2_range<L2_DEC_NW, NT>(acc, xs, x, ws, T, in, out, t0, o0 + g, c0, c1, (in & 7) == 0);
	float *dst = KS == 1 ? y : part + (size_t)s * T * out;
	for (int j = 0; j < NT; j++)
		for (int e = 0; e < 4; e++) {
			// c0,c1: output g, tokens 2q, 2q+1; c2,c3: output g+8
			int o = o0 + g + (e >= 2 ? 8 : 0), t = t0 + j * 8 + 2 * q + (e & 1);
			if (t < T && o < out)
				dst[(size_t)t * out + o] = acc[j][e];
		}
	if (KS == 1)
		return;
	__threadfence();
	__syncthreads();
	unsigned *c = cnt + blockIdx.y * gridDim.x + blockIdx.x;
	if (threadIdx.x == 0)
		s_last = atomicAdd(c, 1u) == (unsigned)KS - 1;
	__syncthreads();
	if (!s_last)
		return;
	__threadfence();
	int nt = T - t0 < NT * 8 ? T - t0 : NT * 8, no = out - ob0 < 64 ? out - ob0 : 64;
	for (int i = threadIdx.x; i < nt * no; i += blockDim.x) {
		int t = t0 + i / no, o = ob0 + i % no;
		size_t at = (size_t)t * out + o, stride = (size_t)T * out;
		float v = __ldcg(part + at);
		for (int r = 1; r < KS; r++)
			v += __ldcg(part + r * stride + at);
		y[at] = v;
	}
	if (threadIdx.x == 0)
		*c = 0; // ready for the next call (and a graph's next replay)
}

template <int NT>
static __global__ void __launch_bounds__(L2_DEC_NW * 32)
	gen_linear2_kernel(float *y, const float *x, const __nv_bfloat16 *W, int T, int in, int out,
			   int KS, int CPS, float *part, unsigned *cnt)
{
	wsrc_bf16 ws = { W };
	lin2_decode<NT>(y, x, ws, T, in, out, KS, CPS, part, cnt);
}

// decode on a 4-bit weight: 4 bits a weight read, expanded in registers; the results of
// gen_linear2_kernel on the dequantised bf16 weight, bit for bit
template <int NT>
static __global__ void __launch_bounds__(L2_DEC_NW * 32)
	gen_linear2_q4_kernel(float *y, const float *x, q4_wview W, int T, int in, int out, int KS,
			      int CPS, float *part, unsigned *cnt)
{
	__shared__ float book[16], map2[256];
	wsrc_q4 ws = q4_tables_load(W, book, map2);
	__syncthreads();
	lin2_decode<NT>(y, x, ws, T, in, out, KS, CPS, part, cnt);
}

// prefill: block (128 outputs, 64 tokens), every range in order
static __global__ void __launch_bounds__(L2_PRE_NW * 32)
	gen_linear2_prefill_kernel(float *y, const float *x, const __nv_bfloat16 *W, int T, int in,
				   int out, int KS, int CPS)
{
	enum { NT = 8 };
	__shared__ __align__(16) uint32_t xs[NT * 8][(L2_KP + L2_PAD) / 2]; // bf16 pairs
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
	int o0 = (blockIdx.x * L2_PRE_NW + warp) * 16, t0 = blockIdx.y * NT * 8;
	int nchunk = (in + 31) / 32;
	bool vec = (in & 7) == 0;
	wsrc_bf16 ws = { W };
	float acc[NT][4], tot[NT][4];
	for (int s = 0; s < KS; s++) {
		int c0 = s * CPS, c1 = c0 + CPS < nchunk ? c0 + CPS : nchunk;
		lin2_range<L2_PRE_NW, NT>(acc, xs, x, ws, T, in, out, t0, o0 + g, c0, c1, vec);
		for (int j = 0; j < NT; j++)
			for (int e = 0; e < 4; e++)
				tot[j][e] = s == 0 ? acc[j][e] : tot[j][e] + acc[j][e];
	}
	for (int j = 0; j < NT; j++)
		for (int e = 0; e < 4; e++) {
			int o = o0 + g + (e >= 2 ? 8 : 0), t = t0 + j * 8 + 2 * q + (e & 1);
			if (t < T && o < out)
				y[(size_t)t * out + o] = tot[j][e];
		}
}

