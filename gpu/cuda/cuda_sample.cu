// cuda_sample.cu - the sampler of gpu/sample.h on the GPU (bk_gen_ops_cuda.sample): a
// block per draw, greedy argmax or temperature + top-p without sorting the vocabulary:
// softmax in double, a radix select (8 passes of 8 bits over the probabilities' bit
// patterns, integer counts) finds the CAND-th largest probability, only the tokens at or
// above it are sorted (bitonic, by probability then id) and the nucleus and the draw are
// scanned in that order as on the host.  When the nucleus is larger than the candidates
// (flat distributions, top-p 1) the whole row is sorted instead.  Top-k (gpu/sample.h):
// the same radix select finds the K-th largest probability first; the candidates, the
// nucleus and the draw then stay among the tokens at or above it, and top-p's bound is
// top_p of their mass (a block sum).  BK_DECODE=v2 takes
// sample2_kernel (cuda_sample2.cuh) instead: a bounded radix select by mass, no sort.
// Not the engine (gen.c).
#include "gpu/cuda/cuda_common.cuh"

#include <math.h>

extern "C" {
#include "gpu/sample.h"
}

enum { SMP_THREADS = 1024, CAND = 1024, CAND_CAP = 2048, SMP_MAX_BLOCKS = 264 };

static int pow2_at_least(int n)
{
	int p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

// per block of the grid: p [V] doubles, then a sort buffer of pow2(V) (double, int32)
static size_t per_block_bytes(int V)
{
	size_t vp = (size_t)pow2_at_least(V);
	size_t b = (size_t)V * sizeof(double) + vp * (sizeof(double) + sizeof(int32_t)) + 64;
	return (b + 15) & ~(size_t)15; // every block's region starts 16-byte aligned
}

extern "C" size_t bk_cuda_sample_work_bytes(int N, int V)
{
	int nb = N < SMP_MAX_BLOCKS ? N : SMP_MAX_BLOCKS;
	return (size_t)(nb > 0 ? nb : 1) * per_block_bytes(V);
}

// (pa, ia) goes before (pb, ib): more probable first, then the lower id
__device__ __forceinline__ bool before(double pa, int32_t ia, double pb, int32_t ib)
{
	return pa > pb || (pa == pb && ia < ib);
}

// sorts n (a power of two) entries by `before`, in place, by the whole block
__device__ void bitonic_sort(double *p, int32_t *id, int n)
{
	for (int k = 2; k <= n; k <<= 1)
		for (int j = k >> 1; j > 0; j >>= 1) {
			for (int i = threadIdx.x; i < n; i += blockDim.x) {
				int o = i ^ j;
				if (o <= i)
					continue;
				bool up = (i & k) == 0; // this run goes in `before` order
				bool sw = up ? before(p[o], id[o], p[i], id[i])
					     : before(p[i], id[i], p[o], id[o]);
				if (sw) {
					double tp = p[i];
					p[i] = p[o];
					p[o] = tp;
					int32_t ti = id[i];
					id[i] = id[o];
					id[o] = ti;
				}
			}
			__syncthreads();
		}
}

// max over the block of v (every thread gets it); sh: [32] floats
__device__ float block_max(float v, float *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		sh[threadIdx.x >> 5] = v;
	__syncthreads();
	v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? sh[threadIdx.x & 31] : -INFINITY;
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

// sum over the block (fixed order: thread-strided, then xor trees); sh: [32] doubles
__device__ double block_sum_d(double v, double *sh)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		sh[threadIdx.x >> 5] = v;
	__syncthreads();
	v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? sh[threadIdx.x & 31] : 0.0;
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

__device__ __forceinline__ unsigned long long dbits(double x)
{
	return (unsigned long long)__double_as_longlong(x);
}

// The nucleus over n sorted entries (thread 0) of the V candidate tokens (those top-k
// keeps): its size k, or 0 when the n entries are not enough (their mass stays below lim,
// the top-p bound, and more tokens exist).
__device__ int nucleus_size(const double *p, int n, int V, float top_p, double lim)
{
	if (top_p >= 1.0f)
		return n == V ? V : 0;
	int k = 0;
	double cum = 0;
	while (k < n && (k == 0 || cum < lim))
		cum += p[k++];
	if (cum < lim && n < V)
		return 0;
	return k;
}

// Radix select (the whole block; 8 passes of 8 bits over the bit patterns of p, integer
// counts): the bit pattern of the want-th largest p, 1 <= want <= V.  hist [256], s_*:
// shared.
__device__ unsigned long long radix_kth(const double *p, int V, int want, int *hist,
					int *s_rem, int *s_digit)
{
	unsigned long long prefix = 0, mask = 0;
	if (threadIdx.x == 0)
		*s_rem = want;
	for (int shift = 56; shift >= 0; shift -= 8) {
		if (threadIdx.x < 256)
			hist[threadIdx.x] = 0;
		__syncthreads();
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			unsigned long long b = dbits(p[j]);
			if ((b & mask) == prefix)
				atomicAdd(&hist[(b >> shift) & 255], 1);
		}
		__syncthreads();
		if (threadIdx.x == 0) {
			int acc = 0, d = 255;
			for (; d > 0; d--) {
				if (acc + hist[d] >= *s_rem)
					break;
				acc += hist[d];
			}
			*s_digit = d;
			*s_rem -= acc;
		}
		__syncthreads();
		prefix |= (unsigned long long)*s_digit << shift;
		mask |= 0xffull << shift;
	}
	return prefix;
}

// token of the draw among the first k sorted entries (as bk_sample_token)
__device__ int32_t draw_sorted(const double *p, const int32_t *id, int k, double u)
{
	double mass = 0, acc = 0;
	for (int i = 0; i < k; i++)
		mass += p[i];
	double target = u * mass;
	for (int i = 0; i < k; i++) {
		acc += p[i];
		if (target < acc)
			return id[i];
	}
	return id[k - 1];
}

__global__ void __launch_bounds__(SMP_THREADS)
	sample_kernel(int32_t *ids, const float *logits, const int32_t *rows,
		      const uint64_t *keys, const int32_t *counters, int N, int V,
		      float temperature, int top_k, float top_p, char *work, size_t per_block)
{
	__shared__ double shd[32];
	__shared__ float shf[32];
	__shared__ int shi[32];
	__shared__ int hist[256];
	__shared__ double cp[CAND_CAP];
	__shared__ int32_t cid[CAND_CAP];
	__shared__ int s_digit, s_rem, s_count, s_k;
	int vp = 1;
	while (vp < V)
		vp <<= 1;
	double *p = (double *)(work + per_block * blockIdx.x);
	double *sp = p + V;
	int32_t *sid = (int32_t *)(sp + vp);
	for (int i = blockIdx.x; i < N; i += gridDim.x) {
		const float *lg = logits + (size_t)rows[i] * V;
		// max, NaN check, greedy argmax (first index of the largest)
		float mx = -INFINITY;
		int nan = 0, best = -1;
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			float x = lg[j];
			if (isnan(x))
				nan = 1;
			else if (best < 0 || x > mx)
				mx = x, best = j;
		}
		float gmx = block_max(mx, shf);
		int anynan = __syncthreads_or(nan);
		if (anynan) {
			if (threadIdx.x == 0)
				ids[i] = -1;
			__syncthreads();
			continue;
		}
		if (temperature == 0.0f) {
			int cand = best >= 0 && mx == gmx ? best : 0x7fffffff;
			for (int o = 16; o > 0; o >>= 1)
				cand = min(cand, __shfl_xor_sync(0xffffffffu, cand, o));
			if ((threadIdx.x & 31) == 0)
				shi[threadIdx.x >> 5] = cand;
			__syncthreads();
			if (threadIdx.x == 0) {
				int b = 0x7fffffff;
				for (int w = 0; w < (int)(blockDim.x >> 5); w++)
					b = min(b, shi[w]);
				ids[i] = b;
			}
			__syncthreads();
			continue;
		}
		// softmax in double, as the host: p = exp((l - max) / T) / sum
		double dmx = (double)gmx, part = 0;
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			double e = exp(((double)lg[j] - dmx) / (double)temperature);
			p[j] = e;
			part += e;
		}
		double Z = block_sum_d(part, shd);
		for (int j = threadIdx.x; j < V; j += blockDim.x)
			p[j] /= Z;
		__syncthreads();
		double u = bk_crng_uniform_dev(keys[i], (uint64_t)counters[i]);
		// top-k: nk tokens (p >= the K-th largest) stay; the top-p bound is lim
		int nk = V;
		double lim = (double)top_p;
		if (top_k > 0 && top_k < V) {
			unsigned long long kb = radix_kth(p, V, top_k, hist, &s_rem, &s_digit);
			double mpart = 0, cpart = 0;
			for (int j = threadIdx.x; j < V; j += blockDim.x)
				if (dbits(p[j]) >= kb) {
					mpart += p[j];
					cpart += 1;
				}
			double kmass = block_sum_d(mpart, shd);
			int kc = (int)block_sum_d(cpart, shd);
			if (kc < V) {
				nk = kc;
				lim = (double)top_p * kmass;
			}
		}
		// radix select: the bit pattern of the want-th largest probability (want <= nk,
		// so every candidate is a kept token)
		int want = nk < CAND ? nk : CAND, k = 0;
		if (top_p < 1.0f || nk < V) {
			unsigned long long prefix = radix_kth(p, V, want, hist, &s_rem, &s_digit);
			// candidates: p >= threshold (and > 0 unless the threshold is)
			if (threadIdx.x == 0)
				s_count = 0;
			__syncthreads();
			for (int j = threadIdx.x; j < V; j += blockDim.x) {
				unsigned long long b = dbits(p[j]);
				if (b >= prefix && (b > 0 || prefix == 0)) {
					int at = atomicAdd(&s_count, 1);
					if (at < CAND_CAP) {
						cp[at] = p[j];
						cid[at] = j;
					}
				}
			}
			__syncthreads();
			int n = s_count;
			if (n <= CAND_CAP) {
				int np2 = 1;
				while (np2 < n)
					np2 <<= 1;
				for (int j = n + threadIdx.x; j < np2; j += blockDim.x) {
					cp[j] = -1.0;
					cid[j] = 0x7fffffff;
				}
				__syncthreads();
				bitonic_sort(cp, cid, np2);
				if (threadIdx.x == 0) {
					s_k = nucleus_size(cp, n, nk, top_p, lim);
					if (s_k > 0)
						ids[i] = draw_sorted(cp, cid, s_k, u);
				}
				__syncthreads();
				k = s_k;
			}
		}
		if (k > 0)
			continue;
		// the whole row, sorted
		for (int j = threadIdx.x; j < vp; j += blockDim.x) {
			sp[j] = j < V ? p[j] : -1.0;
			sid[j] = j < V ? j : 0x7fffffff;
		}
		__syncthreads();
		bitonic_sort(sp, sid, vp);
		if (threadIdx.x == 0) { // the kept tokens are the first nk
			int kk = nucleus_size(sp, nk, nk, top_p, lim);
			ids[i] = draw_sorted(sp, sid, kk > 0 ? kk : nk, u);
		}
		__syncthreads();
	}
}

#include "gpu/cuda/cuda_sample2.cuh"

extern "C" void bk_cuda_sample(int32_t *ids, const float *logits, const int32_t *rows,
			       const uint64_t *keys, const int32_t *counters, int N, int V,
			       float temperature, int top_k, float top_p, void *work)
{
	if (N <= 0)
		return;
	if (V <= 0 || !(temperature >= 0) || !(top_p > 0) || top_k < 0)
		CUDA_BUG("cuda sample: V %d, temperature %g, top-k %d, top-p %g", V, temperature,
			 top_k, top_p);
	int nb = N < SMP_MAX_BLOCKS ? N : SMP_MAX_BLOCKS;
	if (bk_cuda_decode_mode() == 2) {
		BK_LAUNCH(sample2_kernel<SMP_THREADS>, nb, SMP_THREADS, 0, bk_cuda_stream(),
			ids, logits, rows, keys, counters, N, V, temperature, top_k, top_p,
			(char *)work, per_block_bytes(V));
		return;
	}
	BK_LAUNCH(sample_kernel, nb, SMP_THREADS, 0, bk_cuda_stream(), ids, logits, rows, keys, counters,
								N, V, temperature, top_k, top_p,
								(char *)work, per_block_bytes(V));
}
