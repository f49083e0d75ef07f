// cuda_wsrc.cuh - where the decode linears (cuda_gen.cu v1, cuda_linear2.cuh v2) get
// their weights: 8 values W[row, k..k+7] as 4 bf16 pairs, the operand of one mma thread,
// from a bf16 matrix or straight from a 4-bit one (cuda_q4.cuh's storage: the packed
// NF4/FP4 codes, 4 bits a weight, and the block statistics).  Not the GEMMs themselves.
//
// A source has fetch (the loads, issued early: the v2 kernels keep several in flight)
// and expand (the arithmetic on what arrived, just before the mma).  The 4-bit source's
// expand computes what q4_dequant_kernel writes, value for value: bf16(code[q] * a) with
// a = absmax[b], or a = code2[qabsmax[b]] * absmax2[b / 256] + offset (two fp32
// roundings), b = the value's block of 64 in the row-major flattened weight.  So a kernel
// on a 4-bit source gives bit for bit what the same kernel gives on the dequantised bf16
// weight: which path runs (4-bit decode or dequantise + bf16, cuda_gen.cu) changes no
// result, and generation stays batch-invariant.
#ifndef BK_CUDA_WSRC_CUH
#define BK_CUDA_WSRC_CUH

#include "gpu/quant4.h"

typedef struct {
	float c[16]; // the 4-bit book (bk_q4_code)
} q4_book;

// a 4-bit weight's device storage as kernels read it (bk_cuda_q4_view)
struct q4_wview {
	const uint8_t *packed;  // [(n+1)/2] two codes a byte, the first value high
	const float *absmax;    // [nb] (no double quant) or NULL
	const uint8_t *qabsmax; // [nb] (double quant) or NULL
	const float *absmax2;   // [nb2] (double quant)
	const float *code2;     // [256] the nested absmax map (double quant)
	float offset;           // (double quant)
	q4_book book;
};

// the view of a BK_WEIGHT_Q4 weight (gpu/cuda/cuda_q4.cuh); 0 for any other kind
extern "C" int bk_cuda_q4_view(const bk_weight *w, q4_wview *v);

// 8 bf16 W[row, k..k+7] straight from the matrix (zeros past it or when !live)
struct wsrc_bf16 {
	const __nv_bfloat16 *W;

	__device__ __forceinline__ uint4 fetch(int row, int k, int in, int out, bool vec,
					       bool live) const
	{
		uint4 u = make_uint4(0, 0, 0, 0);
		if (!live || row >= out || k >= in)
			return u;
		const __nv_bfloat16 *p = W + (size_t)row * in + k;
		if (vec) // in % 8 == 0: the 8 are all inside
			return __ldg(reinterpret_cast<const uint4 *>(p));
		unsigned short h[8];
		for (int i = 0; i < 8; i++)
			h[i] = k + i < in ? __bfloat16_as_ushort(p[i]) : (unsigned short)0;
		u.x = (uint32_t)h[0] | ((uint32_t)h[1] << 16);
		u.y = (uint32_t)h[2] | ((uint32_t)h[3] << 16);
		u.z = (uint32_t)h[4] | ((uint32_t)h[5] << 16);
		u.w = (uint32_t)h[6] | ((uint32_t)h[7] << 16);
		return u;
	}
	__device__ __forceinline__ uint4 expand(uint4 r, bool) const { return r; }
};

// The 4-bit source.  The book (16 values) and the nested map (256) sit in the block's
// shared memory (q4_tables_load): a register array indexed by a code would spill, and the
// constant bank serialises a warp's different codes.
// fetch with vec (in % 8 == 0, so the 8 values are one aligned 32-bit word of codes in
// one block of 64): .x the codes (value k in the first byte's high nibble), .y the fp32
// absmax or the nested code, .z absmax2, .w 1 (0: zeros, past the matrix or !live).
// Without vec (odd widths: rare, small) fetch does it all, value by value.
struct wsrc_q4 {
	q4_wview v;
	const float *book; // shared [16]
	const float *map2; // shared [256] (double quant) or NULL

	__device__ __forceinline__ float block_absmax(size_t blk) const
	{
		if (!v.qabsmax)
			return __ldg(v.absmax + blk);
		float t = __fmul_rn(map2[__ldg(v.qabsmax + blk)], __ldg(v.absmax2 + blk / BK_Q4_BLOCK2));
		return __fadd_rn(t, v.offset);
	}
	__device__ __forceinline__ static uint32_t pair(float a, float b) // a in the low half
	{
		__nv_bfloat162 h = __floats2bfloat162_rn(a, b);
		uint32_t u;
		memcpy(&u, &h, sizeof u);
		return u;
	}
	// the two values of one byte of codes at block absmax a
	__device__ __forceinline__ uint32_t byte2(uint32_t b, float a) const
	{
		return pair(__fmul_rn(book[(b >> 4) & 15], a), __fmul_rn(book[b & 15], a));
	}
	__device__ __forceinline__ uint4 fetch(int row, int k, int in, int out, bool vec,
					       bool live) const
	{
		uint4 u = make_uint4(0, 0, 0, 0);
		if (!live || row >= out || k >= in)
			return u;
		size_t e = (size_t)row * in + k;
		if (vec) {
			size_t blk = e / BK_Q4_BLOCK;
			u.x = __ldg(reinterpret_cast<const uint32_t *>(v.packed + e / 2));
			if (v.qabsmax) {
				u.y = __ldg(v.qabsmax + blk);
				u.z = __float_as_uint(__ldg(v.absmax2 + blk / BK_Q4_BLOCK2));
			} else {
				u.y = __float_as_uint(__ldg(v.absmax + blk));
			}
			u.w = 1;
			return u;
		}
		float f[8];
		for (int i = 0; i < 8; i++) {
			f[i] = 0.0f;
			if (k + i < in) {
				size_t ei = e + i;
				uint32_t b = __ldg(v.packed + ei / 2);
				b = ei & 1 ? b & 15 : b >> 4;
				f[i] = __fmul_rn(book[b], block_absmax(ei / BK_Q4_BLOCK));
			}
		}
		u.x = pair(f[0], f[1]), u.y = pair(f[2], f[3]);
		u.z = pair(f[4], f[5]), u.w = pair(f[6], f[7]);
		return u;
	}
	__device__ __forceinline__ uint4 expand(uint4 r, bool vec) const
	{
		if (!vec)
			return r; // fetch expanded it
		if (!r.w)
			return make_uint4(0, 0, 0, 0);
		float a = __uint_as_float(r.y);
		if (v.qabsmax)
			a = __fadd_rn(__fmul_rn(map2[r.y], __uint_as_float(r.z)), v.offset);
		uint32_t c = r.x; // byte i: values k+2i (high nibble), k+2i+1
		return make_uint4(byte2(c, a), byte2(c >> 8, a), byte2(c >> 16, a), byte2(c >> 24, a));
	}
};

// the block's shared tables of a 4-bit source (every thread calls it, then a barrier
// before the first expand)
__device__ __forceinline__ wsrc_q4 q4_tables_load(const q4_wview &v, float *book, float *map2)
{
	if (threadIdx.x == 0) // constant indices: the parameter stays in its bank
		for (int i = 0; i < 16; i++)
			book[i] = v.book.c[i];
	if (v.qabsmax)
		for (int i = threadIdx.x; i < 256; i += blockDim.x)
			map2[i] = __ldg(v.code2 + i);
	wsrc_q4 s = { v, book, v.qabsmax ? map2 : NULL };
	return s;
}

#endif
