// cuda_gen.cu - bk_gen_ops_cuda: the generation ops of gpu/gen.h on the GPU: a row-wise
// bf16 tensor-core linear (whose decode reads a QLoRA 4-bit weight's codes itself:
// cuda_wsrc.cuh), a fp32 LoRA, the paged bf16 KV cache (store) and the decode
// attention over block tables (split along the keys, then a reduction).  Every output
// element is computed by one fixed sequence of operations that depends on its own row
// and the sequence's length only, never on how many rows run together, so generation on
// the GPU is batch-invariant like the host twin's.  Not the sampler (cuda_sample.cu),
// not the engine (gen.c), not the training ops (cuda_ops.cu), not the teacher top-k of
// bk-gen's scoring (bk-teach's kernel: cuda_loss.cu bk_cuda_teacher_topk_logits).
#include "gpu/cuda/cuda_common.cuh"
#include "gpu/cuda/cuda_wsrc.cuh" // the linears' weight sources: bf16, 4-bit

#include <math.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "gpu/gen.h"
}

// ---------------------------------------------------------------------------------
// linear: y [T,out] = bf16(x) [T,in] W^T (W bf16 [out,in]) with mma.sync m16n8k16,
// fp32 accumulation.
//
// Reduction order of one output (t, o), the same for every T:
//   the input is cut in chunks of 32; chunk c belongs to warp c % KW of the block;
//   a warp accumulates its chunks in increasing order, two mmas per chunk (a fixed
//   assignment of the chunk's 32 inputs to the mmas' k slots, the same for every row);
//   then the KW warps' partial sums are added in warp order 0, 1, ..., KW-1.
// Which rows share a tile (MT, the grid) changes nothing: an mma's output element
// depends only on its row of A, its column of B and its accumulator.

enum { LIN_KW = 8, LIN_NT = 2, LIN_THREADS = LIN_KW * 32 };

// A 4-bit weight (QLoRA, cuda_q4.cuh) times at most this many rows (decode; v2's decode
// kernel's limit) goes to the linear kernels on the 4-bit source: they read 0.5 byte a
// weight plus the statistics instead of 2 (cuda_wsrc.cuh).  More rows (prefill): the
// weight is dequantised into the bf16 scratch once and the bf16 kernels run, whose tiles
// read W once per 64 rows, so expanding the codes in every tile would cost more than the
// one pass.  Both paths give the same bits: the threshold changes the speed only.
enum { Q4_DECODE_MAX_T = 64 };

__device__ __forceinline__ uint32_t pack_bf16(float a, float b)
{
	__nv_bfloat162 h = __floats2bfloat162_rn(a, b); // .x (a) in the low half
	uint32_t u;
	memcpy(&u, &h, sizeof u);
	return u;
}

// 8 fp32 x[t, k..k+7] rounded to bf16, as 4 pairs; zeros past the matrix
__device__ __forceinline__ void load_x8(uint32_t r[4], const float *x, int t, int k, int in,
					int T, bool vec)
{
	float f[8];
	const float *p = x + (size_t)t * in + k;
	if (t < T && vec && k < in) {
		float4 a = *reinterpret_cast<const float4 *>(p);
		float4 b = *reinterpret_cast<const float4 *>(p + 4);
		f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
		f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
	} else {
		for (int i = 0; i < 8; i++)
			f[i] = t < T && k + i < in ? p[i] : 0.0f;
	}
	for (int i = 0; i < 4; i++)
		r[i] = pack_bf16(f[2 * i], f[2 * i + 1]);
}

__device__ __forceinline__ void mma_bf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2,
					 uint32_t a3, uint32_t b0, uint32_t b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
		     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#elif defined(BK_CUDA_EMU)
	const uint32_t a[4] = {a0, a1, a2, a3};
	emu_mma_m16n8k16(d, a, b0, b1);
#else
	__trap(); // built only for sm_80 and later
#endif
}

// block: LIN_KW warps over the input chunks of one tile of MT*16 rows x LIN_NT*8 outputs,
// W from the source ws (cuda_wsrc.cuh)
template <int MT, class WS>
static __device__ __forceinline__ void gen_linear_tile(float *y, const float *x, const WS &ws,
						       int T, int in, int out)
{
	__shared__ float red[LIN_KW - 1][MT * LIN_NT * 4][32];
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
	int n0 = blockIdx.x * (LIN_NT * 8), t0 = blockIdx.y * (MT * 16);
	bool vec = (in & 7) == 0;
	float acc[MT][LIN_NT][4];
	for (int i = 0; i < MT; i++)
		for (int j = 0; j < LIN_NT; j++)
			acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.0f;
	int nchunk = (in + 31) / 32;
	for (int c = warp; c < nchunk; c += LIN_KW) {
		int k = c * 32 + q * 8; // this thread's 8 inputs: 4 pairs p0..p3
		uint32_t a[MT][2][4];
		uint4 r[LIN_NT], b[LIN_NT];
		for (int j = 0; j < LIN_NT; j++)
			r[j] = ws.fetch(n0 + j * 8 + g, k, in, out, vec, true);
		for (int j = 0; j < LIN_NT; j++)
			b[j] = ws.expand(r[j], vec);
		for (int i = 0; i < MT; i++) {
			load_x8(a[i][0], x, t0 + i * 16 + g, k, in, T, vec);
			load_x8(a[i][1], x, t0 + i * 16 + g + 8, k, in, T, vec);
		}
		// mma 1: k slots (2q, 2q+1) <- p0, (2q+8, 2q+9) <- p1; mma 2: p2, p3
		for (int i = 0; i < MT; i++)
			for (int j = 0; j < LIN_NT; j++) {
				mma_bf16(acc[i][j], a[i][0][0], a[i][1][0], a[i][0][1], a[i][1][1],
					 b[j].x, b[j].y);
				mma_bf16(acc[i][j], a[i][0][2], a[i][1][2], a[i][0][3], a[i][1][3],
					 b[j].z, b[j].w);
			}
	}
	if (warp > 0)
		for (int i = 0; i < MT; i++)
			for (int j = 0; j < LIN_NT; j++)
				for (int e = 0; e < 4; e++)
					red[warp - 1][(i * LIN_NT + j) * 4 + e][lane] = acc[i][j][e];
	__syncthreads();
	if (warp > 0)
		return;
	for (int i = 0; i < MT; i++)
		for (int j = 0; j < LIN_NT; j++)
			for (int e = 0; e < 4; e++) {
				float s = acc[i][j][e];
				for (int w = 0; w < LIN_KW - 1; w++)
					s += red[w][(i * LIN_NT + j) * 4 + e][lane];
				// c0,c1: row g, cols 2q, 2q+1; c2,c3: row g+8
				int t = t0 + i * 16 + g + (e >= 2 ? 8 : 0), o = n0 + j * 8 + 2 * q + (e & 1);
				if (t < T && o < out)
					y[(size_t)t * out + o] = s;
			}
}

template <int MT>
__global__ void __launch_bounds__(LIN_THREADS)
	gen_linear_kernel(float *y, const float *x, const __nv_bfloat16 *W, int T, int in, int out)
{
	wsrc_bf16 ws = { W };
	gen_linear_tile<MT>(y, x, ws, T, in, out);
}

// on a 4-bit weight (decode, T <= Q4_DECODE_MAX_T): the results of gen_linear_kernel on the
// dequantised bf16 weight, bit for bit
template <int MT>
__global__ void __launch_bounds__(LIN_THREADS)
	gen_linear_q4_kernel(float *y, const float *x, q4_wview W, int T, int in, int out)
{
	__shared__ float book[16], map2[256];
	wsrc_q4 ws = q4_tables_load(W, book, map2);
	__syncthreads();
	gen_linear_tile<MT>(y, x, ws, T, in, out);
}

static void cuda_gen_linear2(float *y, const float *x, const bk_weight *W, int T);

static void cuda_gen_linear(float *y, const float *x, const bk_weight *W, int T)
{
	if (T <= 0)
		return;
	if (bk_cuda_decode_mode() == 2) {
		cuda_gen_linear2(y, x, W, T);
		return;
	}
	int out = W->rows, in = W->cols;
	cudaStream_t st = bk_cuda_stream();
	unsigned gx = bk_cuda_blocks((size_t)out, LIN_NT * 8);
	q4_wview q = {};
	if (T <= Q4_DECODE_MAX_T && bk_cuda_q4_view(W, &q)) { // one tile of rows: T <= 64
		if (T <= 16)
			BK_LAUNCH(gen_linear_q4_kernel<1>, dim3(gx, 1), LIN_THREADS, 0, st, y, x, q, T, in, out);
		else if (T <= 32)
			BK_LAUNCH(gen_linear_q4_kernel<2>, dim3(gx, 1), LIN_THREADS, 0, st, y, x, q, T, in, out);
		else
			BK_LAUNCH(gen_linear_q4_kernel<4>, dim3(gx, 1), LIN_THREADS, 0, st, y, x, q, T, in, out);
		return;
	}
	const __nv_bfloat16 *w = bk_cuda_weight_bf16(W); // 4-bit: dequantised (cuda_q4.cuh)
	if (T <= 16) {
		BK_LAUNCH(gen_linear_kernel<1>, dim3(gx, 1), LIN_THREADS, 0, st, y, x, w, T, in, out);
	} else if (T <= 32) {
		BK_LAUNCH(gen_linear_kernel<2>, dim3(gx, 1), LIN_THREADS, 0, st, y, x, w, T, in, out);
	} else {
		unsigned gy = bk_cuda_blocks((size_t)T, 64);
		if (gy > 65535)
			CUDA_BUG("gen linear: %d rows", T);
		BK_LAUNCH(gen_linear_kernel<4>, dim3(gx, gy), LIN_THREADS, 0, st, y, x, w, T, in, out);
	}
}

// ---------------------------------------------------------------------------------
// linear v2 (BK_DECODE=v2): W streamed with 8-16 16-byte loads in flight per thread, 64
// outputs per block (a warp per 16 outputs: W is the mma's A operand, the tokens its
// B operand), x staged once per block in shared memory as bf16 (pieces of 256 inputs),
// split-K over the grid for enough blocks, and a tiled prefill kernel for T > 64.
//
// Reduction order of one output (t, o), the same for every T and both kernels:
//   the input is cut in chunks of 32 and the chunks in KS ranges of CPS chunks each
//   (KS, CPS from in and out alone: lin2_plan); in a range the chunks go in increasing
//   order, two mmas per chunk (the v1 assignment of a chunk's 32 inputs to k slots),
//   into an fp32 accumulator that starts at 0; then y = p_0 + p_1 + ... + p_{KS-1}, in
//   range order.  Decode (T <= 64): a block per (64 outputs, range); the last block of
//   an output tile to finish (an atomic count) adds the ranges' partial sums in order.
//   Prefill (T > 64): a block per (128 outputs, 64 tokens) runs every range itself and
//   adds them in the same order, so its rows are bit for bit those of decode.
// An mma's output element depends only on its row of A (W row o), its column of B (x
// row t) and its accumulator, so which tokens share a tile changes nothing.

#include "gpu/cuda/cuda_linear2.cuh"

static int g_decode_mode; // 0: not read yet; 1: v1; 2: v2
static uint64_t g_gen_epoch = 1; // bumped when a workspace a graph may point into moves

extern "C" int bk_cuda_decode_mode(void)
{
	return bk_cuda_env_mode(&g_decode_mode, "BK_DECODE", "v1", "v2", 0);
}

extern "C" void bk_cuda_decode_set_mode(int mode)
{
	if (mode != 1 && mode != 2)
		CUDA_BUG("decode mode %d (1 or 2)", mode);
	g_decode_mode = mode;
}

// the decode kernels' scratch: fixed size (allocated once, so a captured graph's
// pointers stay valid): partial sums of KS > 1 for <= 64 tokens, tile counters
static float *g_l2_part;
static unsigned *g_l2_cnt;
static size_t g_l2_part_floats;

static void lin2_scratch(void)
{
	if (g_l2_part)
		return;
	// KS > 1 only when tiles < L2_TARGET_BLOCKS, and then KS * tiles < 2 L2_TARGET_BLOCKS
	g_l2_part_floats = (size_t)64 * 2 * L2_TARGET_BLOCKS * 64;
	g_l2_part = (float *)bk_cuda_dev_alloc(g_l2_part_floats * sizeof(float), "lin2 scratch");
	g_l2_cnt = (unsigned *)bk_cuda_dev_alloc(L2_NCNT * sizeof(unsigned), "lin2 scratch");
	CUDA_CHECK(cudaMemset(g_l2_cnt, 0, L2_NCNT * sizeof(unsigned)));
	g_gen_epoch++;
}

static void cuda_gen_linear2(float *y, const float *x, const bk_weight *W, int T)
{
	int out = W->rows, in = W->cols, KS, CPS;
	cudaStream_t st = bk_cuda_stream();
	lin2_plan(in, out, &KS, &CPS);
	q4_wview q = {};
	bool q4 = T <= Q4_DECODE_MAX_T && bk_cuda_q4_view(W, &q); // else dequantised first
	const __nv_bfloat16 *w = q4 ? NULL : bk_cuda_weight_bf16(W);
	if (T > 64) {
		unsigned gx = bk_cuda_blocks((size_t)out, L2_PRE_NW * 16);
		unsigned gy = bk_cuda_blocks((size_t)T, 64);
		if (gy > 65535)
			CUDA_BUG("gen linear v2: %d rows", T);
		BK_LAUNCH(gen_linear2_prefill_kernel, dim3(gx, gy), L2_PRE_NW * 32, 0, st, y, x, w, T, in,
										   out, KS, CPS);
		return;
	}
	unsigned gx = bk_cuda_blocks((size_t)out, L2_DEC_NW * 16);
	if (KS > 1) {
		lin2_scratch();
		if ((size_t)KS * T * out > g_l2_part_floats || gx > L2_NCNT)
			CUDA_BUG("gen linear v2: %d ranges x %d rows x %d outputs", KS, T, out);
	}
	dim3 grid(gx, 1, KS);
#define L2_LAUNCH(NT)                                                                      \
	do {                                                                               \
		if (q4)                                                                    \
			BK_LAUNCH(gen_linear2_q4_kernel<NT>, grid, L2_DEC_NW * 32, 0, st, y, x, q, T, \
				  in, out, KS, CPS, g_l2_part, g_l2_cnt);                          \
		else                                                                       \
			BK_LAUNCH(gen_linear2_kernel<NT>, grid, L2_DEC_NW * 32, 0, st, y, x, w, T, \
				  in, out, KS, CPS, g_l2_part, g_l2_cnt);                          \
	} while (0)
	if (T <= 8) {
		L2_LAUNCH(1);
	} else if (T <= 16) {
		L2_LAUNCH(2);
	} else if (T <= 32) {
		L2_LAUNCH(4);
	} else {
		L2_LAUNCH(8);
	}
#undef L2_LAUNCH
}

// ---------------------------------------------------------------------------------
// LoRA (fp32, inference): xa [T,R] = x A^T (a warp per (t,r): lane-strided partial sums,
// then a fixed xor tree); y [T,out] += scale * xa B^T (a thread per (t,o), r in order).

__global__ void gen_lora_a_kernel(float *xa, const float *x, const float *A, int T, int in, int R)
{
	int w = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
	if (w >= T * R)
		return;
	int t = w / R, r = w % R;
	const float *xt = x + (size_t)t * in, *ar = A + (size_t)r * in;
	float s = 0.0f;
	for (int i = lane; i < in; i += 32)
		s += xt[i] * ar[i];
	s = bk_warp_sum(s);
	if (lane == 0)
		xa[w] = s;
}

__global__ void gen_lora_b_kernel(float *y, const float *xa, const float *B, int T, int out,
				  int R, float scale)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= (size_t)T * out)
		return;
	int t = (int)(i / out), o = (int)(i % out);
	const float *a = xa + (size_t)t * R, *b = B + (size_t)o * R;
	float s = 0.0f;
	for (int r = 0; r < R; r++)
		s += a[r] * b[r];
	y[i] += scale * s;
}

static void cuda_gen_lora(float *y, const float *x, const float *A, const float *B, int T,
			  int in, int out, int R, float scale, float *xa)
{
	if (T <= 0)
		return;
	cudaStream_t st = bk_cuda_stream();
	BK_LAUNCH(gen_lora_a_kernel, bk_cuda_blocks((size_t)T * R * 32, 256), 256, 0, st, xa, x, A, T, in, R);
	BK_LAUNCH(gen_lora_b_kernel, bk_cuda_blocks((size_t)T * out, 256), 256, 0, st, y, xa, B, T, out, R,
										 scale);
}

// ---------------------------------------------------------------------------------
// paged KV cache: pools [NB][L][BS][NKV][D] bf16

__device__ __forceinline__ size_t kv_row(int32_t blk, int j, int l, int L)
{
	return ((size_t)blk * L + l) * BK_GEN_BLOCK + (j % BK_GEN_BLOCK);
}

__global__ void gen_kv_store_kernel(__nv_bfloat16 *kp, __nv_bfloat16 *vp, int l, int L,
				    const float *k, const float *v, const int32_t *slot, int T,
				    int w /* NKV*D */)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= (size_t)T * w)
		return;
	int t = (int)(i / w), e = (int)(i % w);
	int s = slot[t];
	size_t r = kv_row(s / BK_GEN_BLOCK, s, l, L);
	kp[r * w + e] = bk_f32_to_bf16(k[i]);
	vp[r * w + e] = bk_f32_to_bf16(v[i]);
}

static void cuda_gen_kv_store(void *kp, void *vp, int l, int L, const float *k, const float *v,
			      const int32_t *slot, int T, int NKV, int D)
{
	if (T <= 0)
		return;
	size_t n = (size_t)T * NKV * D;
	BK_LAUNCH(gen_kv_store_kernel, bk_cuda_blocks(n, 256), 256, 0, bk_cuda_stream(),
		(__nv_bfloat16 *)kp, (__nv_bfloat16 *)vp, l, L, k, v, slot, T, NKV * D);
}

// ---------------------------------------------------------------------------------
// decode attention over block tables, split along the keys.
// Pass 1 (a block per (query t, kv head, split c)): keys c*CH .. min((c+1)*CH, nkey)-1,
// every query head of the kv head's group: m = max score, p_j = exp(s_j - m),
// l = sum p_j (lane-strided then xor tree), o = sum_j p_j v_j (j in order).
// Pass 2 (a block per (t, h)): M = max_c m_c, L = sum_c l_c e^(m_c-M), out =
// (sum_c o_c e^(m_c-M)) / L, c in order.  The splits depend on nkey only.
// Scores are cap(q.k * scale) (ops.h bk_attn); with a window W only keys at positions
// >= nkey - W count: splits wholly before it are not run (nor reduced), and keys
// before it in the first split are masked.

enum { ATT_CH = 128, ATT_THREADS = 128 };

__global__ void __launch_bounds__(ATT_THREADS)
	gen_attend_split_kernel(float *po /* [T,NH,NC,D] */, float *pm /* [T,NH,NC] */,
				float *pl /* [T,NH,NC] */, const float *q, const int32_t *seq,
				const int32_t *nkey, int NH, int NKV, int D,
				const __nv_bfloat16 *kp, const __nv_bfloat16 *vp, int l, int L,
				const int32_t *table, int W, float scale, float cap, int win)
{
	BK_DYN_SMEM(float, sm);
	int t = blockIdx.x, kh = blockIdx.y, c = blockIdx.z, NC = gridDim.z;
	int nk = nkey[t], j0 = c * ATT_CH;
	int kfirst = win > 0 && nk > win ? nk - win : 0;
	if (j0 >= nk || j0 + ATT_CH <= kfirst)
		return;
	int cnt = nk - j0 < ATT_CH ? nk - j0 : ATT_CH;
	int group = NH / NKV, h0 = kh * group;
	float *qs = sm;                    // [group][D]
	float *sc = qs + group * D;        // [group][CH]
	size_t *roff = (size_t *)(sc + group * ATT_CH); // [CH] element offsets of key rows
	const int32_t *tb = table + (size_t)seq[t] * W;
	for (int i = threadIdx.x; i < group * D; i += blockDim.x)
		qs[i] = q[((size_t)t * NH + h0) * D + i];
	for (int j = threadIdx.x; j < cnt; j += blockDim.x) {
		int key = j0 + j;
		roff[j] = (kv_row(tb[key / BK_GEN_BLOCK], key, l, L) * NKV + kh) * D;
	}
	__syncthreads();
	for (int j = threadIdx.x; j < ATT_CH; j += blockDim.x) {
		if (j >= cnt || j0 + j < kfirst) {
			for (int g = 0; g < group; g++)
				sc[g * ATT_CH + j] = -INFINITY;
			continue;
		}
		const __nv_bfloat16 *kr = kp + roff[j];
		for (int g0 = 0; g0 < group; g0 += 8) { // 8 heads' dots at a time
			float s[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
			int ng = group - g0 < 8 ? group - g0 : 8;
			for (int d = 0; d < D; d++) {
				float kd = bk_bf16_to_f32(kr[d]);
				for (int g = 0; g < ng; g++)
					s[g] += qs[(g0 + g) * D + d] * kd;
			}
			for (int g = 0; g < ng; g++) {
				float v = s[g] * scale;
				sc[(g0 + g) * ATT_CH + j] = cap > 0.0f ? tanhf(v / cap) * cap : v;
			}
		}
	}
	__syncthreads();
	// a warp per head: max, exponentials, sum
	int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
	for (int g = warp; g < group; g += nw) {
		float *s = sc + g * ATT_CH, m = -INFINITY, sum = 0.0f;
		for (int j = lane; j < ATT_CH; j += 32)
			m = fmaxf(m, s[j]);
		for (int o = 16; o > 0; o >>= 1)
			m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
		for (int j = lane; j < ATT_CH; j += 32) {
			float p = j < cnt && j0 + j >= kfirst ? __expf(s[j] - m) : 0.0f;
			s[j] = p;
			sum += p;
		}
		sum = bk_warp_sum(sum);
		if (lane == 0) {
			size_t i = ((size_t)t * NH + h0 + g) * NC + c;
			pm[i] = m;
			pl[i] = sum;
		}
	}
	__syncthreads();
	for (int i = threadIdx.x; i < group * D; i += blockDim.x) {
		int g = i / D, d = i % D;
		const float *p = sc + g * ATT_CH;
		float o = 0.0f;
		for (int j = kfirst > j0 ? kfirst - j0 : 0; j < cnt; j++)
			o += p[j] * bk_bf16_to_f32(vp[roff[j] + d]);
		po[(((size_t)t * NH + h0 + g) * NC + c) * D + d] = o;
	}
}

__global__ void gen_attend_reduce_kernel(float *out, const float *po, const float *pm,
					 const float *pl, const int32_t *nkey, int NH, int D, int NC,
					 int win)
{
	int th = blockIdx.x, t = th / NH;
	int nc = (nkey[t] + ATT_CH - 1) / ATT_CH;
	int c0 = win > 0 && nkey[t] > win ? (nkey[t] - win) / ATT_CH : 0; // first split run
	const float *m = pm + (size_t)th * NC, *l = pl + (size_t)th * NC;
	float M = -INFINITY;
	for (int c = c0; c < nc; c++)
		M = fmaxf(M, m[c]);
	float Lsum = 0.0f;
	for (int c = c0; c < nc; c++)
		Lsum += l[c] * __expf(m[c] - M);
	for (int d = threadIdx.x; d < D; d += blockDim.x) {
		float o = 0.0f;
		for (int c = c0; c < nc; c++)
			o += po[((size_t)th * NC + c) * D + d] * __expf(m[c] - M);
		out[(size_t)th * D + d] = o / Lsum;
	}
}

static float *g_att_ws;
static size_t g_att_ws_bytes;

static float *att_workspace(size_t bytes)
{
	if (bytes <= g_att_ws_bytes)
		return g_att_ws;
	bk_cuda_dev_free(g_att_ws); // after the stream is done with it
	size_t want = bytes + bytes / 2;
	g_att_ws = (float *)bk_cuda_dev_alloc(want, "decode attention workspace");
	g_att_ws_bytes = want;
	g_gen_epoch++;
	return g_att_ws;
}

static void cuda_gen_attend(float *out, const float *q, const int32_t *seq, const int32_t *nkey,
			    int T, int NH, int NKV, int D, const void *kp, const void *vp, int l,
			    int L, const int32_t *table, int W, const bk_attn *ap)
{
	if (T <= 0)
		return;
	if (!ap || ap->window < 0 || ap->softcap < 0)
		CUDA_BUG("gen attend: bad attention parameters");
	if (NH % NKV)
		CUDA_BUG("gen attend: %d heads over %d kv heads", NH, NKV);
	// the longest key range a table of width W can hold bounds the splits
	int NC = (W * BK_GEN_BLOCK + ATT_CH - 1) / ATT_CH;
	size_t nth = (size_t)T * NH;
	float *po = att_workspace(nth * NC * ((size_t)D + 2) * sizeof(float));
	float *pm = po + nth * NC * D, *pl = pm + nth * NC;
	int group = NH / NKV;
	size_t smem = ((size_t)group * D + (size_t)group * ATT_CH) * sizeof(float) +
		      ATT_CH * sizeof(size_t);
	if (smem > 48 * 1024)
		CUDA_BUG("gen attend: %zu bytes of shared memory (group %d, D %d)", smem, group, D);
	if (NC > 65535 || NKV > 65535)
		CUDA_BUG("gen attend: grid of %d kv heads x %d key splits", NKV, NC);
	cudaStream_t st = bk_cuda_stream();
	BK_LAUNCH(gen_attend_split_kernel, dim3(T, NKV, NC), ATT_THREADS, smem, st,
		po, pm, pl, q, seq, nkey, NH, NKV, D, (const __nv_bfloat16 *)kp,
		(const __nv_bfloat16 *)vp, l, L, table, W, ap->scale, ap->softcap, ap->window);
	int thr = D < 32 ? 32 : (D > 256 ? 256 : (D + 31) / 32 * 32);
	BK_LAUNCH(gen_attend_reduce_kernel, (unsigned)nth, thr, 0, st, out, po, pm, pl, nkey, NH, D, NC,
								ap->window);
}

static size_t cuda_gen_mem_free(void)
{
	size_t fr = 0, total = 0;
	CUDA_CHECK(cudaMemGetInfo(&fr, &total));
	return fr;
}

// ---------------------------------------------------------------------------------
// the fast decode step's hooks (gen.h): pinned memory, asynchronous copies on the ops'
// stream, stream capture into graphs (relaxed mode: the engine runs each step shape once
// eagerly first, so no workspace is allocated while capturing)

static int cuda_gen_fast(void) { return bk_cuda_decode_mode() == 2; }

static void *cuda_gen_host_alloc(size_t bytes)
{
	void *p = NULL;
	CUDA_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault));
	return p;
}

static void cuda_gen_host_free(void *p)
{
	if (p)
		CUDA_CHECK(cudaFreeHost(p));
}

static void cuda_gen_upload_async(void *dst, const void *src, size_t bytes)
{
	if (bytes)
		CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice,
					   bk_cuda_stream()));
}

static void cuda_gen_download_async(void *dst, const void *src, size_t bytes)
{
	if (bytes)
		CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost,
					   bk_cuda_stream()));
}

static void cuda_gen_sync(void) { CUDA_CHECK(cudaStreamSynchronize(bk_cuda_stream())); }

static int cuda_gen_capture_begin(void)
{
	if (bk_cuda_sync_launches()) // every launch check synchronises: not capturable
		return 0;
	CUDA_CHECK(cudaStreamBeginCapture(bk_cuda_stream(), cudaStreamCaptureModeRelaxed));
	return 1;
}

static void *cuda_gen_capture_end(void)
{
	cudaGraph_t graph;
	cudaGraphExec_t exec;
	CUDA_CHECK(cudaStreamEndCapture(bk_cuda_stream(), &graph));
	CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
	CUDA_CHECK(cudaGraphDestroy(graph));
	return (void *)exec;
}

static void cuda_gen_graph_launch(void *graph)
{
	CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, bk_cuda_stream()));
	if (bk_cuda_sync_launches())
		CUDA_CHECK(cudaStreamSynchronize(bk_cuda_stream()));
}

static void cuda_gen_graph_free(void *graph)
{
	if (graph)
		CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}

static uint64_t cuda_gen_epoch(void) { return g_gen_epoch; }

extern "C" const bk_gen_ops bk_gen_ops_cuda = {
	.name = "cuda",
	.kv_bytes = 2, // bf16 KV cache
	.linear = cuda_gen_linear,
	.lora = cuda_gen_lora,
	.kv_store = cuda_gen_kv_store,
	.attend = cuda_gen_attend,
	.sample = bk_cuda_sample,
	.sample_work_bytes = bk_cuda_sample_work_bytes,
	.teacher_topk = bk_cuda_teacher_topk_logits,
	.mem_free = cuda_gen_mem_free,
	.fast = cuda_gen_fast,
	.host_alloc = cuda_gen_host_alloc,
	.host_free = cuda_gen_host_free,
	.upload_async = cuda_gen_upload_async,
	.download_async = cuda_gen_download_async,
	.sync = cuda_gen_sync,
	.capture_begin = cuda_gen_capture_begin,
	.capture_end = cuda_gen_capture_end,
	.graph_launch = cuda_gen_graph_launch,
	.graph_free = cuda_gen_graph_free,
	.epoch = cuda_gen_epoch,
};
