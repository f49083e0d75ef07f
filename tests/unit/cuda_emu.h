/* cuda_emu.h - just enough of CUDA to run gpu/cuda/cuda_attention_tc.cu on the CPU (compiled
 * as C++ with BK_TC_EMU): one host thread per CUDA thread of a block, blocks one after
 * another; __syncthreads is a barrier of the block's threads; warp shuffles and
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate) are warp-collective exchanges through
 * per-warp buffers between two barriers of the warp's 32 threads.  The mma decodes its
 * fragments by the PTX ISA layout (g = lane / 4, t = lane % 4):
 *   A: reg r of lane holds rows g + 8 (r & 1), columns 2t + 8 (r >> 1) + {0, 1};
 *   B: reg r holds rows (k) 2t + 8 r + {0, 1}, column (n) g;
 *   C: c0, c1 at row g, columns 2t, 2t+1; c2, c3 at row g + 8;
 * lower column / row index in the low 16 bits; ldmatrix .x2 .trans likewise (below).
 * Device memory is host memory.  Slow (a
 * few thousand barriers per tile): for small shapes in tests/unit only.
 * Not a general CUDA emulator: only what that file uses. */
#ifndef BK_CUDA_EMU_H
#define BK_CUDA_EMU_H

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <vector>

extern "C" {
#include "gpu/ops.h"
}

/* the file's entry points under other names, so a CUDA build's libbakery.a (which has the
 * real ones) links beside this translation unit */
#define bk_cuda_attention_tc_forward emu_tc_forward
#define bk_cuda_attention_tc_backward emu_tc_backward
#define bk_cuda_attention_tc_supports emu_tc_supports
#define bk_cuda_attention_forward_sel emu_tc_forward_sel
#define bk_cuda_attention_backward_sel emu_tc_backward_sel
#define bk_cuda_attention_forward emu_fp32_forward
#define bk_cuda_attention_backward emu_fp32_backward
#define bk_cuda_workspace emu_workspace

extern "C" {
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void bk_bug(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
}
#define CUDA_BUG(...) bk_bug(__FILE__, __LINE__, __VA_ARGS__)
#define CUDA_CHECK(call) ((void)(call))
#include "gpu/cuda/cuda_mode.h" /* bk_cuda_env_mode, as cuda_common.cuh has it */

#define TC_UNROLL /* nvcc's #pragma unroll */

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)

struct emu_dim3 {
	unsigned x, y, z;
	emu_dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef emu_dim3 dim3;
extern thread_local emu_dim3 threadIdx, blockIdx;
extern emu_dim3 gridDim, blockDim;

struct float2 {
	float x, y;
};
struct float4 {
	float x, y, z, w;
};
struct uint2 {
	uint32_t x, y;
};
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

/* bf16: round to nearest even (NaN kept a NaN) */
struct __nv_bfloat16 {
	uint16_t bits;
};
struct __nv_bfloat162 {
	__nv_bfloat16 x, y;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	__nv_bfloat16 r;
	if ((u & 0x7fffffffu) > 0x7f800000u)
		r.bits = (uint16_t)((u >> 16) | 0x40);
	else
		r.bits = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
	return r;
}
static inline float emu_bf16_to_f32(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
	__nv_bfloat162 r = {__float2bfloat16_rn(lo), __float2bfloat16_rn(hi)};
	return r;
}

/* block and warp collectives (emu.cc) */
void __syncthreads(void);
float __shfl_xor_sync(unsigned mask, float v, int lane_mask);
void emu_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
/* ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16: lanes 0-7 give the row addresses of
 * matrix 0, lanes 8-15 those of matrix 1 (8 bf16 each); lane (g = lane / 4, t = lane % 4)
 * gets r_i = {M_i[2t][g], M_i[2t+1][g]}, the lower row in the low 16 bits */
void emu_ldmatrix_x2_trans(uint32_t &r0, uint32_t &r1, const __nv_bfloat16 *row);

static inline float bk_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* the block's dynamic shared memory */
extern unsigned char *emu_smem;
#define TC_SHARED(name) unsigned char *name = emu_smem

/* runs body once per thread of every block of grid (threads per block), one block at a
 * time, with smem bytes of shared memory filled with NaN (all-ones bytes) */
void emu_launch(emu_dim3 grid, int threads, size_t smem, const std::function<void()> &body);
#define TC_LAUNCH(kernel, grid, threads, smem, ...)                                   \
	emu_launch(emu_dim3(grid), threads, smem, [&]() { kernel(__VA_ARGS__); })

/* what the host side of the file calls */
enum { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
template <typename K> static inline int cudaFuncSetAttribute(K, int, int) { return 0; }
void *bk_cuda_workspace(int slot, size_t bytes);
static inline unsigned bk_cuda_blocks(size_t n, int threads)
{
	return (unsigned)((n + (size_t)threads - 1) / (size_t)threads);
}
/* the fp32 kernel is not emulated: the tests use D = 64, 128 and 256 only */
extern "C" void bk_cuda_attention_forward(float *, float *, const float *, const float *,
					  const float *, const int32_t *, int, int, int, int, int,
					  const float *, const float *, int, const bk_attn *);
extern "C" void bk_cuda_attention_backward(float *, float *, float *, const float *,
					   const float *, const float *, const float *,
					   const float *, const float *, const int32_t *, int, int,
					   int, int, int, const bk_attn *);

#endif
