/* cuda_emu.h - just enough of CUDA to run gpu/cuda/cuda_attention_tc.cu (compiled as C++
 * with BK_TC_EMU: tests/unit/test_attention_tc_emu.cc) and the v2 loss kernels of
 * gpu/cuda/cuda_loss2.cuh (tests/unit/test_loss_emu.cc) and, with a few additions there,
 * the v2 decode kernels (tests/unit/test_decode_emu.cc) on the CPU: one host thread per
 * CUDA thread of a block, blocks one after another (x fastest); __syncthreads (and
 * __syncthreads_or) is a barrier of the block's threads; warp shuffles and
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate) are warp-collective exchanges through
 * per-warp buffers between two barriers of the warp's 32 threads; __shared__ variables
 * are statics (one block runs at a time).  Header-only (inline definitions): each
 * emulation test is one translation unit.  The mma decodes its
 * fragments by the PTX ISA layout (g = lane / 4, t = lane % 4):
 *   A: reg r of lane holds rows g + 8 (r & 1), columns 2t + 8 (r >> 1) + {0, 1};
 *   B: reg r holds rows (k) 2t + 8 r + {0, 1}, column (n) g;
 *   C: c0, c1 at row g, columns 2t, 2t+1; c2, c3 at row g + 8;
 * lower column / row index in the low 16 bits; ldmatrix .x2 .trans likewise (below).
 * Device memory is host memory.  Slow (a
 * few thousand barriers per tile): for small shapes in tests/unit only.
 * Not a general CUDA emulator: only what those files use. */
#ifndef BK_CUDA_EMU_H
#define BK_CUDA_EMU_H

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <atomic>
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
#define __shared__ static

struct emu_dim3 {
	unsigned x, y, z;
	emu_dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
typedef emu_dim3 dim3;
inline thread_local emu_dim3 threadIdx, blockIdx;
inline emu_dim3 gridDim, blockDim;

/* CUDA's alignment; may_alias: the kernels load them through reinterpret_cast */
struct __attribute__((may_alias, aligned(8))) float2 {
	float x, y;
};
struct __attribute__((may_alias, aligned(16))) float4 {
	float x, y, z, w;
};
struct __attribute__((may_alias, aligned(8))) uint2 {
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

/* ---- block and warp collectives ---- */

inline pthread_barrier_t emu_block_bar;
inline std::vector<pthread_barrier_t> emu_warp_bar;
struct emu_warp_buf {
	uint64_t v[32]; /* shuffles */
	uint32_t a[32][4], b[32][2]; /* mma fragments */
	const __nv_bfloat16 *row[32]; /* ldmatrix rows */
};
inline std::vector<emu_warp_buf> emu_wb;
inline std::atomic<int> emu_or_flag;

static inline void emu_warp_sync(int w) { pthread_barrier_wait(&emu_warp_bar[w]); }

static inline void __syncthreads(void) { pthread_barrier_wait(&emu_block_bar); }

static inline int __syncthreads_or(int v)
{
	pthread_barrier_wait(&emu_block_bar);
	if (v)
		emu_or_flag = 1;
	pthread_barrier_wait(&emu_block_bar);
	int r = emu_or_flag;
	pthread_barrier_wait(&emu_block_bar);
	if (threadIdx.x == 0)
		emu_or_flag = 0;
	pthread_barrier_wait(&emu_block_bar);
	return r;
}

template <typename T> static inline T __shfl_xor_sync(unsigned, T v, int lane_mask)
{
	static_assert(sizeof(T) <= 8, "8 bytes at most");
	int w = threadIdx.x / 32, lane = threadIdx.x % 32;
	uint64_t u = 0;
	memcpy(&u, &v, sizeof(T));
	emu_wb[w].v[lane] = u;
	emu_warp_sync(w);
	u = emu_wb[w].v[lane ^ lane_mask];
	emu_warp_sync(w);
	T r;
	memcpy(&r, &u, sizeof(T));
	return r;
}

static inline unsigned long long atomicOr(unsigned long long *p, unsigned long long v)
{
	return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}

static inline float emu_half(uint32_t reg, int half)
{
	return emu_bf16_to_f32((uint16_t)(reg >> (16 * half)));
}

static inline void emu_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
	int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
	emu_warp_buf &B = emu_wb[w];
	memcpy(B.a[lane], a, sizeof B.a[lane]);
	B.b[lane][0] = b0, B.b[lane][1] = b1;
	emu_warp_sync(w);
	float out[4];
	for (int e = 0; e < 4; e++) {
		int row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
		float acc = 0.0f;
		for (int kk = 0; kk < 16; kk++) {
			// A[row][kk]: lane (row % 8) * 4 + (kk % 8) / 2, reg (row / 8) + 2 (kk / 8)
			float av = emu_half(B.a[(row % 8) * 4 + (kk % 8) / 2][(row / 8) + 2 * (kk / 8)],
					    kk % 2);
			// B[kk][col]: lane col * 4 + (kk % 8) / 2, reg kk / 8
			float bv = emu_half(B.b[col * 4 + (kk % 8) / 2][kk / 8], kk % 2);
			acc += av * bv;
		}
		out[e] = c[e] + acc;
	}
	emu_warp_sync(w);
	for (int e = 0; e < 4; e++)
		c[e] = out[e];
}

/* ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16: lanes 0-7 give the row addresses of
 * matrix 0, lanes 8-15 those of matrix 1 (8 bf16 each); lane (g = lane / 4, t = lane % 4)
 * gets r_i = {M_i[2t][g], M_i[2t+1][g]}, the lower row in the low 16 bits */
static inline void emu_ldmatrix_x2_trans(uint32_t &r0, uint32_t &r1, const __nv_bfloat16 *row)
{
	int w = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
	emu_warp_buf &B = emu_wb[w];
	B.row[lane] = row;
	emu_warp_sync(w);
	uint32_t r[2];
	for (int m = 0; m < 2; m++) { // matrix m: rows from lanes 8m .. 8m+7
		uint32_t lo = B.row[8 * m + 2 * t][g].bits, hi = B.row[8 * m + 2 * t + 1][g].bits;
		r[m] = lo | hi << 16;
	}
	emu_warp_sync(w);
	r0 = r[0], r1 = r[1];
}

static inline float bk_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* ---- launches ---- */

/* the block's dynamic shared memory */
inline unsigned char *emu_smem;
#define TC_SHARED(name) unsigned char *name = emu_smem

struct emu_thread_arg {
	unsigned tid, bx, by, bz;
	const std::function<void()> *body;
};

static inline void *emu_thread(void *p)
{
	emu_thread_arg *a = (emu_thread_arg *)p;
	threadIdx = emu_dim3(a->tid);
	blockIdx = emu_dim3(a->bx, a->by, a->bz);
	(*a->body)();
	return NULL;
}

/* runs body once per thread of every block of grid (threads per block), one block at a
 * time, with smem bytes of shared memory filled with NaN (all-ones bytes) */
static inline void emu_launch(emu_dim3 grid, int threads, size_t smem,
			      const std::function<void()> &body)
{
	if (threads % 32)
		die("emu_launch: %d threads is not whole warps", threads);
	gridDim = grid;
	blockDim = emu_dim3((unsigned)threads);
	std::vector<unsigned char> sm(smem, 0xff); // exact size: ASan sees any overflow
	emu_smem = smem ? sm.data() : NULL;
	int nw = threads / 32;
	emu_warp_bar.resize(nw);
	emu_wb.resize(nw);
	std::vector<pthread_t> th(threads);
	std::vector<emu_thread_arg> args(threads);
	for (unsigned b = 0; b < grid.x * grid.y * grid.z; b++) { // x fastest, as on a GPU
		unsigned bx = b % grid.x, by = b / grid.x % grid.y, bz = b / (grid.x * grid.y);
		if (smem)
			memset(sm.data(), 0xff, sm.size());
		pthread_barrier_init(&emu_block_bar, NULL, (unsigned)threads);
		for (int w = 0; w < nw; w++)
			pthread_barrier_init(&emu_warp_bar[w], NULL, 32);
		for (int i = 0; i < threads; i++) {
			args[i] = {(unsigned)i, bx, by, bz, &body};
			if (pthread_create(&th[i], NULL, emu_thread, &args[i]))
				die("emu_launch: pthread_create failed");
		}
		for (int i = 0; i < threads; i++)
			pthread_join(th[i], NULL);
		pthread_barrier_destroy(&emu_block_bar);
		for (int w = 0; w < nw; w++)
			pthread_barrier_destroy(&emu_warp_bar[w]);
	}
}
/* gpu/cuda/cuda_common.cuh's launch macro; the stream is not modelled here */
#define BK_LAUNCH_N(name, kernel, grid, threads, smem, stream, ...)                     \
	((void)(stream), emu_launch(emu_dim3(grid), threads, smem, [&]() { kernel(__VA_ARGS__); }))
#define BK_LAUNCH(kernel, ...) BK_LAUNCH_N(#kernel, kernel, __VA_ARGS__)
static inline int bk_cuda_stream(void) { return 0; }

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
