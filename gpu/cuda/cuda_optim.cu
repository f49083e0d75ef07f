// cuda_optim.cu - the optimizer ops of bk_ops_cuda: fp32 AdamW, 8-bit block-wise AdamW,
// the fixed-order gradient sum of squares and the scale, on device vectors.  The math
// is gpu/optim8.h's, written with __f*_rn intrinsics (no contraction into FMA) so that
// AdamW, the scale and the 8-bit update give the host twin's bits; the sum of squares
// uses its own fixed order (deterministic, not the host's bits).
// Not the op table (gpu/cuda/cuda_ops.cu points at these) and not the trainer (gpu/train.c).
#include "gpu/cuda/cuda_common.cuh"

#include <mutex>

#include "gpu/optim8.h"

// ---- fp32 AdamW: one thread per element, bk_adamw_elem's arithmetic ----

// the float scalars of bk_adamw_scalars, passed by value
struct adamw_k {
	float decay, w1, b2, w2, neg_step, bc2s, eps;
	int do_decay;
};

static adamw_k to_kernel(const bk_adamw_scalars &s)
{
	return adamw_k{s.decay, s.w1, s.b2, s.w2, s.neg_step, s.bc2s, s.eps, s.do_decay};
}

// bk_adamw_elem, operation for operation
__device__ __forceinline__ void adamw_elem(const adamw_k &s, float &p, float &m, float &v,
					   float g)
{
	float pi = p;
	if (s.do_decay)
		pi = __fmul_rn(pi, s.decay);
	float mi = __fadd_rn(m, __fmul_rn(s.w1, __fsub_rn(g, m)));
	float vi = __fadd_rn(__fmul_rn(v, s.b2), __fmul_rn(__fmul_rn(s.w2, g), g));
	float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2s), s.eps);
	p = __fadd_rn(pi, __fmul_rn(s.neg_step, __fdiv_rn(mi, denom)));
	m = mi;
	v = vi;
}

__global__ void adamw_kernel(float *__restrict__ param /* [n] */,
			     const float *__restrict__ grad /* [n] */, float *__restrict__ m,
			     float *__restrict__ v, size_t n, adamw_k s)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x) {
		float p = param[i], mi = m[i], vi = v[i];
		adamw_elem(s, p, mi, vi, grad[i]);
		param[i] = p;
		m[i] = mi;
		v[i] = vi;
	}
}

static unsigned grid_for(size_t n, int threads)
{
	size_t b = bk_cuda_blocks(n, threads);
	return (unsigned)(b < 65535 * 16 ? b : 65535 * 16); // grid-stride loops cover the rest
}

extern "C" void bk_cuda_adamw_step(float *param, const float *grad, float *m, float *v,
				   size_t n, double lr, double beta1, double beta2, double eps,
				   double weight_decay, int64_t step)
{
	if (!n)
		return;
	bk_adamw_scalars s;
	bk_adamw_scalars_make(&s, lr, beta1, beta2, eps, weight_decay, step);
	BK_LAUNCH(adamw_kernel, grid_for(n, 256), 256, 0, bk_cuda_stream(), param, grad, m, v, n,
								     to_kernel(s));
}

// ---- 8-bit AdamW: one thread block per quantisation block ----

// the two dynamic maps of gpu/optim8.c (built on the host: the same floats)
__constant__ float c_map_signed[256];
__constant__ float c_map_unsigned[256];
static std::once_flag g_map_once;

static void upload_maps(void)
{
	std::call_once(g_map_once, [] {
		CUDA_CHECK(cudaMemcpyToSymbol(c_map_signed, bk_q8_map(1), 256 * sizeof(float)));
		CUDA_CHECK(cudaMemcpyToSymbol(c_map_unsigned, bk_q8_map(0), 256 * sizeof(float)));
	});
}

// bk_q8_encode on a map in shared memory
__device__ __forceinline__ unsigned char q8_encode(const float *map, bool is_signed, float x)
{
	if (x <= map[0])
		return 0;
	if (x >= map[255])
		return 255;
	int lo = 0, hi = 255;
	while (hi - lo > 1) { // map[lo] <= x < map[hi]
		int mid = (lo + hi) / 2;
		if (map[mid] <= x)
			lo = mid;
		else
			hi = mid;
	}
	int c = __fsub_rn(x, map[lo]) <= __fsub_rn(map[hi], x) ? lo : hi;
	if (is_signed && x != 0.0f && signbit(map[c]) != signbit(x))
		c += x > 0.0f ? 1 : -1;
	return (unsigned char)c;
}

__device__ __forceinline__ float q8_normalise(float x, float absmax)
{
	return absmax > 0.0f ? __fdiv_rn(x, absmax) : 0.0f;
}

// max over the block; every thread gets it.  `sh` is __shared__ float[32].
__device__ __forceinline__ float block_max(float x, float *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	__syncthreads();
	if (lane == 0)
		sh[wid] = x;
	__syncthreads();
	x = lane < nw ? sh[lane] : 0.0f;
	for (int o = 16; o > 0; o >>= 1)
		x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
	return x;
}

#define Q8_THREADS 256
#define Q8_MAX_PER_THREAD (2048 / Q8_THREADS)

// block b of the tensor: values [b*block, min(n, (b+1)*block)); Q8_THREADS threads,
// each holding up to block/Q8_THREADS values in registers between the two passes
__global__ void __launch_bounds__(Q8_THREADS)
	adamw8_kernel(float *__restrict__ param /* [n] */, const float *__restrict__ grad /* [n] */,
		      unsigned char *__restrict__ qm /* [n] */, unsigned char *__restrict__ qv,
		      float *__restrict__ absmax_m /* [nb] */, float *__restrict__ absmax_v,
		      size_t n, int block, adamw_k s)
{
	__shared__ float ms[256], mu[256], sh[32];
	ms[threadIdx.x] = c_map_signed[threadIdx.x];
	mu[threadIdx.x] = c_map_unsigned[threadIdx.x];
	__syncthreads();
	size_t b = blockIdx.x, i0 = b * (size_t)block;
	size_t len = i0 + (size_t)block < n ? (size_t)block : n - i0;
	float am = absmax_m[b], av = absmax_v[b];
	float m[Q8_MAX_PER_THREAD], v[Q8_MAX_PER_THREAD];
	float new_am = 0.0f, new_av = 0.0f;
#pragma unroll
	for (int k = 0; k < Q8_MAX_PER_THREAD; k++) {
		size_t j = (size_t)k * Q8_THREADS + threadIdx.x;
		m[k] = v[k] = 0.0f;
		if (j < len) {
			size_t i = i0 + j;
			float p = param[i];
			m[k] = __fmul_rn(ms[qm[i]], am);
			v[k] = __fmul_rn(mu[qv[i]], av);
			adamw_elem(s, p, m[k], v[k], grad[i]);
			param[i] = p;
			new_am = fmaxf(new_am, fabsf(m[k]));
			new_av = fmaxf(new_av, v[k]);
		}
	}
	new_am = block_max(new_am, sh);
	new_av = block_max(new_av, sh);
	if (threadIdx.x == 0) {
		absmax_m[b] = new_am;
		absmax_v[b] = new_av;
	}
#pragma unroll
	for (int k = 0; k < Q8_MAX_PER_THREAD; k++) {
		size_t j = (size_t)k * Q8_THREADS + threadIdx.x;
		if (j < len) {
			qm[i0 + j] = q8_encode(ms, true, q8_normalise(m[k], new_am));
			qv[i0 + j] = q8_encode(mu, false, q8_normalise(v[k], new_av));
		}
	}
}

extern "C" void bk_cuda_adamw8_step(float *param, const float *grad, uint8_t *qm, uint8_t *qv,
				    float *absmax_m, float *absmax_v, size_t n, int block,
				    double lr, double beta1, double beta2, double eps,
				    double weight_decay, int64_t step)
{
	size_t nb = bk_q8_blocks(n, block); // BUGs unless block is 256 or 2048
	if (!nb)
		return;
	if (nb > 0x7fffffffu)
		die("cuda: adamw8: %zu blocks do not fit a grid", nb);
	upload_maps();
	bk_adamw_scalars s;
	bk_adamw_scalars_make(&s, lr, beta1, beta2, eps, weight_decay, step);
	BK_LAUNCH(adamw8_kernel, (unsigned)nb, Q8_THREADS, 0, bk_cuda_stream(),
		param, grad, qm, qv, absmax_m, absmax_v, n, block, to_kernel(s));
}

// ---- sum of squares in a fixed order ----
// pass 1: block b sums values [b*SQ_CHUNK, (b+1)*SQ_CHUNK) in double: thread t takes
// t, t+256, ... in order, then a fixed tree over the 256 partial sums; pass 2: one
// thread adds the block sums in index order.  The order depends on n only.

#define SQ_THREADS 256
#define SQ_CHUNK 65536

__global__ void __launch_bounds__(SQ_THREADS)
	sumsq_blocks_kernel(const float *__restrict__ g /* [n] */, size_t n,
			    double *__restrict__ part /* [nb] */)
{
	__shared__ double sh[SQ_THREADS];
	size_t i0 = (size_t)blockIdx.x * SQ_CHUNK;
	size_t i1 = i0 + SQ_CHUNK < n ? i0 + SQ_CHUNK : n;
	double acc = 0.0;
	for (size_t i = i0 + threadIdx.x; i < i1; i += SQ_THREADS) {
		double x = (double)g[i];
		acc = __dadd_rn(acc, __dmul_rn(x, x));
	}
	sh[threadIdx.x] = acc;
	__syncthreads();
	for (int w = SQ_THREADS / 2; w > 0; w >>= 1) {
		if ((int)threadIdx.x < w)
			sh[threadIdx.x] = __dadd_rn(sh[threadIdx.x], sh[threadIdx.x + w]);
		__syncthreads();
	}
	if (threadIdx.x == 0)
		part[blockIdx.x] = sh[0];
}

__global__ void sumsq_total_kernel(const double *__restrict__ part, size_t nb,
				   double *__restrict__ out)
{
	if (blockIdx.x == 0 && threadIdx.x == 0) {
		double s = 0.0;
		for (size_t b = 0; b < nb; b++)
			s = __dadd_rn(s, part[b]);
		*out = s;
	}
}

// device scratch of at least n doubles (the block sums and the total), kept and grown
static double *g_part;
static size_t g_part_n;
static std::mutex g_part_mu;

static double *sumsq_scratch(size_t n)
{
	std::lock_guard<std::mutex> lock(g_part_mu);
	if (n > g_part_n) {
		bk_cuda_dev_free(g_part);
		g_part = NULL;
		g_part = (double *)bk_cuda_dev_alloc(n * 2 * sizeof(double), "sumsq scratch");
		g_part_n = n * 2;
	}
	return g_part;
}

extern "C" double bk_cuda_grad_sumsq(const float *g, size_t n)
{
	if (!n)
		return 0.0;
	size_t nb = (n + SQ_CHUNK - 1) / SQ_CHUNK;
	if (nb > 0x7fffffffu)
		die("cuda: grad_sumsq: %zu blocks do not fit a grid", nb);
	cudaStream_t st = bk_cuda_stream();
	double *part = sumsq_scratch(nb + 1);
	BK_LAUNCH(sumsq_blocks_kernel, (unsigned)nb, SQ_THREADS, 0, st, g, n, part);
	BK_LAUNCH(sumsq_total_kernel, 1, 32, 0, st, part, nb, part + nb);
	double s = 0.0;
	CUDA_CHECK(cudaMemcpyAsync(&s, part + nb, sizeof(double), cudaMemcpyDeviceToHost, st));
	CUDA_CHECK(cudaStreamSynchronize(st));
	return s;
}

// ---- scale ----

__global__ void scale_kernel(float *__restrict__ x /* [n] */, float f, size_t n)
{
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
	     i += (size_t)gridDim.x * blockDim.x)
		x[i] = __fmul_rn(x[i], f);
}

extern "C" void bk_cuda_scale(float *x, double s, size_t n)
{
	if (!n)
		return;
	BK_LAUNCH(scale_kernel, grid_for(n, 256), 256, 0, bk_cuda_stream(), x, (float)s, n);
}
