// cuda_common.cuh - what every gpu/*.cu shares: CUDA_CHECK / CUBLAS_CHECK (one-line
// death naming the call, file and line), the launch check after every kernel, the one
// stream and cuBLAS handle of the op table, bf16 helpers and the device port of the
// counter-based RNG of common/rng.c.  Not any op (gpu/cuda/cuda_ops.cu and friends).
#ifndef BK_CUDA_COMMON_CUH
#define BK_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/cuda/cuda.h"

// common/diag.h is C11 (_Noreturn); declare the two functions used here for C++.
extern "C" {
extern const char *bk_prog;
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void bk_bug(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
}
#define CUDA_BUG(...) bk_bug(__FILE__, __LINE__, __VA_ARGS__)

// A base weight as bf16 [rows, cols] for the next GEMM on the stream: its own storage, or
// a 4-bit weight dequantised into a scratch valid until the next 4-bit weight is asked
// for (gpu/cuda/cuda_q4.cuh)
extern "C" const __nv_bfloat16 *bk_cuda_weight_bf16(const bk_weight *w);

#include "gpu/cuda/cuda_mode.h" // bk_cuda_env_mode: BK_LINEAR, BK_LOSS, BK_ATTN, BK_DECODE

#define CUDA_CHECK(call)                                                               \
	do {                                                                           \
		cudaError_t e_ = (call);                                               \
		if (e_ != cudaSuccess)                                                 \
			die("cuda: %s failed: %s (%s) at %s:%d", #call,                \
			    cudaGetErrorName(e_), cudaGetErrorString(e_), __FILE__,    \
			    __LINE__);                                                 \
	} while (0)

#define CUBLAS_CHECK(call)                                                             \
	do {                                                                           \
		cublasStatus_t s_ = (call);                                            \
		if (s_ != CUBLAS_STATUS_SUCCESS)                                       \
			die("cublas: %s failed: %s (%d) at %s:%d", #call,              \
			    cublasGetStatusString(s_), (int)s_, __FILE__, __LINE__);   \
	} while (0)

// Is BK_CUDA_SYNC=1 set?  Then every launch check also synchronises, so a fault inside
// a kernel is reported at that kernel instead of at the next synchronising call.
int bk_cuda_sync_launches(void);

// after every <<<...>>>: a bad launch configuration dies here naming the kernel (and,
// with BK_CUDA_SYNC=1, a fault while it ran)
#define CUDA_LAUNCH_CHECK(kernel_name)                                                 \
	do {                                                                           \
		cudaError_t e_ = cudaGetLastError();                                   \
		if (e_ == cudaSuccess && bk_cuda_sync_launches())                      \
			e_ = cudaStreamSynchronize(bk_cuda_stream());                  \
		if (e_ != cudaSuccess)                                                 \
			die("cuda: launch of %s failed: %s (%s) at %s:%d", kernel_name, \
			    cudaGetErrorName(e_), cudaGetErrorString(e_), __FILE__,    \
			    __LINE__);                                                 \
	} while (0)

// BK_LAUNCH(kernel, grid, block, smem, stream, args...): the one way a kernel is launched:
// kernel<<<grid, block, smem, stream>>>(args) and its launch check; BK_LAUNCH_N names it
// where the kernel is a variable (a template instance with a comma).  Under the
// emulation (make emu, gpu/emu/emu.h) the launch is queued on the emulated stream with
// its arguments copied, checked and counted.  BK_DYN_SMEM(T, name): the block's dynamic
// shared memory as T name[] (16-byte aligned).
#ifdef BK_CUDA_EMU
#define BK_LAUNCH_N(name, kernel, grid, block, smem, stream, ...)                        \
	do {                                                                           \
		emu_launch_kernel(emu_launch_desc{name, nullptr, dim3(grid), dim3(block), \
						  (size_t)(smem), __FILE__, __LINE__},    \
				  (stream), kernel, ##__VA_ARGS__);                      \
		CUDA_LAUNCH_CHECK(name);                                               \
	} while (0)
#define BK_DYN_SMEM(T, name) T *name = (T *)emu_dyn_smem()
#else
#define BK_LAUNCH_N(name, kernel, grid, block, smem, stream, ...)                        \
	do {                                                                           \
		kernel<<<grid, block, smem, stream>>>(__VA_ARGS__);                    \
		CUDA_LAUNCH_CHECK(name);                                               \
	} while (0)
#define BK_DYN_SMEM(T, name) extern __shared__ __align__(16) T name[]
#endif
#define BK_LAUNCH(kernel, ...) BK_LAUNCH_N(#kernel, kernel, __VA_ARGS__)

// The stream every op of bk_ops_cuda runs on (created on first use with the cuBLAS
// handle, which is bound to it).  Kernels of other gpu/*.cu files launch on it too.
cudaStream_t bk_cuda_stream(void);
cublasHandle_t bk_cuda_cublas(void);
// Device scratch of at least `bytes`, shared by all ops (grows, never shrinks; valid
// until the next call with a larger size).  slot 0..3: independent buffers.
void *bk_cuda_workspace(int slot, size_t bytes);
// The one device allocator (gpu/cuda/cuda_ops.cu): every device buffer of gpu/cuda/ is one,
// with a short stable name ("lin2 scratch"), counted by name in bk_cuda_mem_stats; out of
// memory dies naming it and what this process holds (bk_cuda_die_oom in cuda.h).
void *bk_cuda_dev_alloc(size_t bytes, const char *name);
void bk_cuda_dev_free(void *p); // NULL is fine; waits for the stream first

// grid size for n elements at `threads` per block (1 when n == 0 is never launched)
static inline unsigned bk_cuda_blocks(size_t n, int threads)
{
	return (unsigned)((n + (size_t)threads - 1) / (size_t)threads);
}

// ---- bf16 ----
__device__ __forceinline__ float bk_bf16_to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ __nv_bfloat16 bk_f32_to_bf16(float x) { return __float2bfloat16_rn(x); }

// ---- counter-based RNG, bit for bit common/rng.c ----
__device__ __forceinline__ uint64_t bk_mix64_dev(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

__device__ __forceinline__ double bk_crng_uniform_dev(uint64_t key, uint64_t counter)
{
	uint64_t x = bk_mix64_dev(bk_mix64_dev(key ^ bk_mix64_dev(counter)) + counter);
	return (double)(x >> 11) * 0x1.0p-53;
}

// ---- reductions: sum over a block (blockDim.x a multiple of 32, <= 1024) ----
__device__ __forceinline__ float bk_warp_sum(float v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

// every thread gets the sum; `sh` is __shared__ float[32]; ends with a barrier
__device__ __forceinline__ float bk_block_sum(float v, float *sh)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	v = bk_warp_sum(v);
	__syncthreads(); // sh may still be read by a previous call
	if (lane == 0)
		sh[wid] = v;
	__syncthreads();
	v = lane < nw ? sh[lane] : 0.0f;
	v = bk_warp_sum(v);
	return v;
}

#endif
