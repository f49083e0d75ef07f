// emu.h - the CUDA runtime, device built-ins and launch of the emulation build (`make emu`):
// gpu/cuda/*.cu compiled as C++ for the CPU.  gpu/emu/include/cuda_runtime.h and
// cuda_bf16.h are this file; cublas_v2.h is emu_cublas.h.  The runtime is emu_runtime.cc.
//
// What it models, and how (the invariants a kernel or host side relies on):
//  1. Device memory is host memory from exact-size allocations (ASan sees one byte past
//     the end), 256-byte aligned, filled with 0xff (NaN as fp32 and bf16) when fresh; a
//     pointer argument of a kernel or cuBLAS call must lie in a live allocation (or pinned
//     host memory, or NULL), checked when the launch is issued and when it runs.
//  2. Streams are deferred queues: nothing issued runs until a sync point (a stream,
//     event or device synchronisation, a synchronous copy, cudaFree, a stream query).  An
//     asynchronous copy into pinned host memory fills the destination with 0xff when it
//     is issued and the data arrives at the sync; from or to pageable memory it behaves
//     as CUDA documents (staged / synchronous), and inside a graph capture it is an error.
//  3. Graphs: a capture records without running; a sync inside it is an error; a launch
//     of the instantiated graph re-issues the recorded operations with their arguments.
//  4. Threads of a block are fibers, each run until it blocks at a barrier or a warp
//     collective; the order of the threads and of the blocks is a seeded shuffle
//     (BK_EMU_SEED), so code that assumes lockstep warps or an order of blocks fails.
//     __syncthreads reached by only part of the block (others exited, or at another
//     barrier) and a warp collective missing lanes are reported as errors.
//  5. Launch limits of every target (sm_80, sm_86, sm_90): 1024 threads, grid y/z
//     65535, 48 KiB of dynamic shared memory unless the kernel opted in with
//     cudaFuncSetAttribute, and opt-ins at most sm_86's 99 KiB.
//  6. Launches are counted per kernel; with BK_EMU_KERNEL_LOG=FILE each process appends
//     "name launches max-threads max-dynamic-smem" lines there at exit (tests/emu/compare.py
//     sums them; tests/emu/resources.py checks them against ptxas's resource use).
// Not modelled: speed, the hardware's rounding of mma and of __expf, true concurrency
// between blocks (inter-block races), driver behaviour (tests/gpu/README.md).
#ifndef BK_GPU_EMU_H
#define BK_GPU_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#define BK_CUDA_EMU 1

// ---- qualifiers ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__
#define __align__(n) __attribute__((aligned(n)))

#include "gpu/emu/include/cuda_runtime_api.h"

struct dim3 {
	unsigned x, y, z;
	constexpr dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3 {
	unsigned x, y, z;
};

// vector types with CUDA's alignment (the kernels load them through reinterpret_cast)
struct __attribute__((may_alias, aligned(8))) float2 {
	float x, y;
};
struct __attribute__((may_alias, aligned(16))) float4 {
	float x, y, z, w;
};
struct __attribute__((may_alias, aligned(8))) uint2 {
	uint32_t x, y;
};
struct __attribute__((may_alias, aligned(16))) uint4 {
	uint32_t x, y, z, w;
};
struct __attribute__((may_alias, aligned(16))) int4 {
	int32_t x, y, z, w;
};
static inline float2 make_float2(float x, float y) { return {x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
static inline uint2 make_uint2(uint32_t x, uint32_t y) { return {x, y}; }
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w)
{
	return {x, y, z, w};
}

// ---- bf16: round to nearest even, a NaN stays a NaN (quiet) ----
static inline uint16_t emu_f32_to_bf16_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}
static inline float emu_bf16_bits_to_f32(uint16_t b)
{
	uint32_t u = (uint32_t)b << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}
struct __attribute__((aligned(2))) __nv_bfloat16 {
	uint16_t __x;
	__nv_bfloat16() = default;
	__nv_bfloat16(float f) : __x(emu_f32_to_bf16_bits(f)) {}
	operator float() const { return emu_bf16_bits_to_f32(__x); }
};
struct __attribute__((aligned(4))) __nv_bfloat162 {
	__nv_bfloat16 x, y;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
	__nv_bfloat16 r;
	r.__x = emu_f32_to_bf16_bits(f);
	return r;
}
static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
static inline float __bfloat162float(__nv_bfloat16 b) { return emu_bf16_bits_to_f32(b.__x); }
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
	__nv_bfloat162 r;
	r.x = __float2bfloat16_rn(lo);
	r.y = __float2bfloat16_rn(hi);
	return r;
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }
static inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u)
{
	__nv_bfloat16 r;
	r.__x = u;
	return r;
}

// ---- the thread's coordinates (set by the scheduler on every switch) ----
extern thread_local dim3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
static const int warpSize = 32;

// ---- block and warp collectives (emu_runtime.cc) ----
void emu_syncthreads(const char *file, int line);
int emu_syncthreads_or(int v, const char *file, int line);
// a warp collective over the lanes of mask: the lane's `in` (bytes <= 64) is published;
// returns the warp's 32 slots (lane l at l * EMU_SLOT), valid until the lane's next
// collective
enum { EMU_SLOT = 64 };
const unsigned char *emu_warp_exchange(unsigned mask, const void *in, size_t bytes,
				       const char *what);
[[noreturn]] void emu_trap(const char *file, int line);
#define __syncthreads() emu_syncthreads(__FILE__, __LINE__)
#define __syncthreads_or(v) emu_syncthreads_or((v), __FILE__, __LINE__)
#define __trap() emu_trap(__FILE__, __LINE__)

static inline unsigned emu_lane(void)
{
	unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
	return t % 32;
}
// the shuffles: v published in a warp exchange, then lane src's value (src < 0: v itself)
template <typename T> static inline T emu_shfl(unsigned mask, T v, int src, const char *what)
{
	static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle type");
	const unsigned char *all = emu_warp_exchange(mask, &v, sizeof(T), what);
	if (src >= 0)
		memcpy(&v, all + src * EMU_SLOT, sizeof(T));
	return v;
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask)
{
	return emu_shfl(mask, v, (int)((emu_lane() ^ (unsigned)lane_mask) & 31), "__shfl_xor_sync");
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src)
{
	return emu_shfl(mask, v, (int)((unsigned)src & 31), "__shfl_sync");
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d)
{
	unsigned l = emu_lane();
	return emu_shfl(mask, v, l + d < 32 ? (int)(l + d) : -1, "__shfl_down_sync");
}
static inline unsigned __ballot_sync(unsigned mask, int p)
{
	int v = p != 0;
	const unsigned char *all = emu_warp_exchange(mask, &v, sizeof v, "__ballot_sync");
	unsigned r = 0;
	for (int i = 0; i < 32; i++)
		if ((mask >> i & 1) && all[i * EMU_SLOT])
			r |= 1u << i;
	return r;
}
template <typename T> static inline unsigned __match_any_sync(unsigned mask, T v)
{
	const unsigned char *all = emu_warp_exchange(mask, &v, sizeof(T), "__match_any_sync");
	unsigned r = 0;
	for (int i = 0; i < 32; i++)
		if ((mask >> i & 1) && memcmp(all + i * EMU_SLOT, &v, sizeof(T)) == 0)
			r |= 1u << i;
	return r;
}
static inline void __syncwarp(unsigned mask = 0xffffffffu)
{
	int v = 0;
	emu_warp_exchange(mask, &v, sizeof v, "__syncwarp");
}

// ---- atomics (one host thread runs every device thread: plain read-modify-writes) ----
template <typename T, typename F> static inline T emu_atomic(T *p, F f)
{
	T o = *p;
	*p = f(o);
	return o;
}
template <typename T> static inline T atomicAdd(T *p, T v)
{
	return emu_atomic(p, [v](T o) { return o + v; });
}
template <typename T> static inline T atomicMax(T *p, T v)
{
	return emu_atomic(p, [v](T o) { return o > v ? o : v; });
}
template <typename T> static inline T atomicMin(T *p, T v)
{
	return emu_atomic(p, [v](T o) { return o < v ? o : v; });
}
template <typename T> static inline T atomicOr(T *p, T v)
{
	return emu_atomic(p, [v](T o) { return o | v; });
}
template <typename T> static inline T atomicExch(T *p, T v)
{
	return emu_atomic(p, [v](T) { return v; });
}
template <typename T> static inline T atomicCAS(T *p, T cmp, T v)
{
	return emu_atomic(p, [cmp, v](T o) { return o == cmp ? v : o; });
}
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}

// ---- arithmetic intrinsics (IEEE, round to nearest: the emulation has no FMA contraction) ----
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
// __expf, __logf: the exact functions (the GPU's are approximate)
#define __expf(x) expf(x)
#define __logf(x) logf(x)
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline unsigned long long __double2ull_rn(double x)
{
	return (unsigned long long)nearbyint(x);
}
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
// CUDA's reinterpretations (__*_as_*): the bits of x as a To
template <typename To, typename From> static inline To emu_bit_cast(From x)
{
	static_assert(sizeof(To) == sizeof(From), "a reinterpretation keeps the size");
	To r;
	memcpy(&r, &x, sizeof r);
	return r;
}
static inline long long __double_as_longlong(double x) { return emu_bit_cast<long long>(x); }
static inline double __longlong_as_double(long long x) { return emu_bit_cast<double>(x); }
static inline float __int_as_float(int x) { return emu_bit_cast<float>(x); }
static inline int __float_as_int(float x) { return emu_bit_cast<int>(x); }
static inline unsigned __float_as_uint(float x) { return emu_bit_cast<unsigned>(x); }
static inline float __uint_as_float(unsigned x) { return emu_bit_cast<float>(x); }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }
template <typename T> static inline T __ldg(const T *p) { return *p; }
template <typename T> static inline T __ldcg(const T *p) { return *p; }
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline size_t min(size_t a, size_t b) { return a < b ? a : b; }
static inline size_t max(size_t a, size_t b) { return a > b ? a : b; }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 for the calling lane's fragments (the
// PTX ISA layout, g = lane / 4, t = lane % 4: A reg r holds rows g + 8 (r & 1), columns
// 2t + 8 (r >> 1) + {0, 1}; B reg r rows (k) 2t + 8 r + {0, 1}, column g; C c0, c1 at row g,
// columns 2t, 2t + 1, c2, c3 at row g + 8; the lower index in the low 16 bits): a warp
// collective, products summed in fp32 in k order then added to c
void emu_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1);
// ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16: lanes 0-7 give the row addresses of
// matrix 0, lanes 8-15 those of matrix 1 (8 bf16 each); lane (g, t) gets
// r_m = {M_m[2t][g], M_m[2t+1][g]}, the lower row in the low 16 bits
void emu_ldmatrix_x2_trans(uint32_t &r0, uint32_t &r1, const void *row);

// the block's dynamic shared memory (exact size, 0xff when the block starts)
void *emu_dyn_smem(void);

// ---- the runtime API (emu_runtime.cc; C declarations in cuda_runtime_api.h) ----
extern "C" {
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
			    cudaStream_t s = 0);
cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s = 0);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags = 0);
}
template <typename T> static inline cudaError_t cudaMalloc(T **p, size_t bytes)
{
	return cudaMalloc((void **)p, bytes);
}
template <typename T> static inline cudaError_t cudaHostAlloc(T **p, size_t bytes, unsigned f)
{
	return cudaHostAlloc((void **)p, bytes, f);
}
cudaError_t emu_memcpy_to_symbol(void *sym, size_t sym_bytes, const void *src, size_t n,
				 size_t off);
template <typename T>
static inline cudaError_t cudaMemcpyToSymbol(T &sym, const void *src, size_t n, size_t off = 0,
					     cudaMemcpyKind = cudaMemcpyHostToDevice)
{
	return emu_memcpy_to_symbol((void *)&sym, sizeof(T), src, n, off);
}
cudaError_t emu_func_set_attribute(const void *fn, const char *name, int attr, int value);
template <typename F> static inline cudaError_t cudaFuncSetAttribute(F *fn, cudaFuncAttribute a,
								     int v)
{
	return emu_func_set_attribute((const void *)fn, "", (int)a, v);
}

// ---- launches ----
// the op of a launch, run later by its stream: grid/block, dynamic shared memory, the
// body run once per device thread (the kernel on the launch's copied arguments)
struct emu_launch_desc {
	const char *name; // as written at the launch site
	const void *fn;
	dim3 grid, block;
	size_t smem;
	const char *file;
	int line;
};
// checks the configuration (a bad one sets the sticky error cudaGetLastError returns)
// and queues the launch on s
void emu_launch(const emu_launch_desc &d, cudaStream_t s, std::function<void()> body,
		std::function<void(const char *when)> check_args);
// queue an op on s (cuBLAS calls are ops of their handle's stream); is [p, p + n) in live
// device memory (or pinned host memory)?
void emu_issue(cudaStream_t s, std::function<void()> run, const char *what);
bool emu_dev_range(const void *p, size_t n);
[[noreturn]] void emu_fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// is p (a kernel's pointer argument) inside live device memory, pinned host memory, a
// __constant__ symbol registered by cudaMemcpyToSymbol, or NULL?
bool emu_ptr_ok(const void *p);
[[noreturn]] void emu_bad_arg(const emu_launch_desc &d, int i, const void *p, const char *when);

// a write past the end of the allocation holding p (its guard bytes changed) dies naming who
void emu_guard_check(const void *p, const char *who);
template <typename T> static inline void emu_check_one(const emu_launch_desc &d, int i, const T &v,
							const char *when)
{
	if constexpr (std::is_pointer<T>::value) {
		if (when[0] == 'a') // "after" the kernel ran
			emu_guard_check((const void *)v, d.name);
		else if (!emu_ptr_ok((const void *)v))
			emu_bad_arg(d, i, (const void *)v, when);
	}
}
template <typename... P, typename... A>
static inline void emu_launch_kernel(const emu_launch_desc &d, cudaStream_t s, void (*k)(P...),
				     A &&...args)
{
	static_assert(sizeof...(P) == sizeof...(A), "kernel argument count");
	// CUDA converts each argument to its parameter's type and copies it at the launch
	auto t = std::make_shared<std::tuple<typename std::decay<P>::type...>>(
		std::forward<A>(args)...);
	emu_launch_desc dd = d;
	dd.fn = (const void *)k;
	auto check = [dd, t](const char *when) {
		std::apply(
			[&](const auto &...a) {
				int i = 0;
				(emu_check_one(dd, i++, a, when), ...);
			},
			*t);
	};
	emu_launch(dd, s, [k, t]() { std::apply(k, *t); }, check);
}
#endif
