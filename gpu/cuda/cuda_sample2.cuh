// cuda_sample2.cuh - the v2 sampler kernel (BK_DECODE=v2) of gpu/cuda/cuda_sample.cu: the
// rule of gpu/sample.h (HF top-p) in a bounded number of passes over the row, never a
// sort.  Included by cuda_sample.cu, and by tests/emu/test_decode2.cc, which launches it
// on its own on the emulated GPU.
//
// A block per draw (any whole number of warps up to 1024 threads):
//   1. max, NaN check and greedy argmax (first index of the largest), as v1;
//   2. p = exp((l - max) / T) / sum in double, as v1, into the block's work row;
//   3. masses as 62-bit fixed point, fx(p) = round(p 2^62), summed with integer atomics
//      (exact, so the sums do not depend on the order the threads run in);
//   3b. top-k (top_k K, 0 < K < V): the K-th largest p by the same radix select walked
//      by counts instead of masses; the tokens at or above it stay (HF keeps the ties),
//      the rest drop out of every later select by its floor, and top-p's bound becomes
//      top_p of the kept mass (HF's softmax over the kept scores); K keeping every
//      token is no top-k;
//   4. the nucleus boundary by a radix select over the bit patterns of p (positive
//      doubles order as their bits): 8 passes of 8 bits, each a histogram of counts and
//      fixed-point masses of the tokens still in the running, walked from the top until
//      the mass from above reaches top_p: the boundary value tau and its tie count; the
//      nucleus is every token above tau and the first m (lowest ids) of the ties, m the
//      fewest that bring the mass to top_p (top_p >= 1: every token);
//   5. the draw: target = u * (nucleus mass); the same radix select over the tokens >=
//      tau, walked until the mass from above exceeds the target, gives the drawn value
//      beta; the token is the j-th (in id order) of those equal to beta, j the number of
//      whole beta masses the target lies beyond;
//   6. that token by a block scan of match counts over contiguous id ranges.
// The same token as bk_sample_token except when a cumulative mass lies within rounding of
// top_p or of the target (host: double sums in sorted order; here exact sums of p rounded
// to 2^-62, so a difference needs a boundary within about V 2^-53 of a cumulative mass).
// Bounded: 2 + 8 + 8 + 2 passes over the row whatever the distribution, 8 + 1 more with
// top-k (v1 sorts the whole row in global memory when the nucleus holds more than 1024
// tokens).

#define S2_FX_SCALE 0x1p62

static __device__ __forceinline__ unsigned long long s2_bits(double x)
{
	return (unsigned long long)__double_as_longlong(x);
}

static __device__ __forceinline__ unsigned long long s2_fx(double p)
{
	return __double2ull_rn(p * S2_FX_SCALE);
}

static __device__ __forceinline__ unsigned long long s2_warp_sum_ull(unsigned long long v)
{
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

// sum over the block, every thread gets it; sh [32]
static __device__ unsigned long long s2_block_sum_ull(unsigned long long v, unsigned long long *sh)
{
	v = s2_warp_sum_ull(v);
	__syncthreads();
	if ((threadIdx.x & 31) == 0)
		sh[threadIdx.x >> 5] = v;
	__syncthreads();
	v = (int)(threadIdx.x & 31) < (int)(blockDim.x >> 5) ? sh[threadIdx.x & 31] : 0ull;
	return s2_warp_sum_ull(v);
}

static __device__ double s2_block_sum_d(double v, double *sh)
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

static __device__ float s2_block_max(float v, float *sh)
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

// histogram of digit (bits >> shift) & 255 over tokens with (bits & mask) == prefix and
// bits >= floor: counts hc, fixed-point masses hm.  A warp whose 32 tokens share a bin
// (the common case in the first passes) adds once.
static __device__ void s2_hist(const double *p, int V, unsigned long long prefix,
			unsigned long long mask, int shift, unsigned long long floor_bits,
			unsigned *hc, unsigned long long *hm)
{
	for (int i = threadIdx.x; i < 256; i += blockDim.x)
		hc[i] = 0, hm[i] = 0;
	__syncthreads();
	int n = (V + (int)blockDim.x - 1) / (int)blockDim.x * (int)blockDim.x;
	for (int j = threadIdx.x; j < n; j += blockDim.x) {
		int bin = -1;
		unsigned long long m = 0;
		if (j < V) {
			unsigned long long b = s2_bits(p[j]);
			if ((b & mask) == prefix && b >= floor_bits) {
				bin = (int)((b >> shift) & 255);
				m = s2_fx(p[j]);
			}
		}
		unsigned peers = __match_any_sync(0xffffffffu, bin);
		if (peers == 0xffffffffu) {
			unsigned long long ms = s2_warp_sum_ull(m);
			if ((threadIdx.x & 31) == 0 && bin >= 0) {
				atomicAdd(&hc[bin], 32u);
				atomicAdd(&hm[bin], ms);
			}
		} else if (bin >= 0) {
			atomicAdd(&hc[bin], 1u);
			atomicAdd(&hm[bin], m);
		}
	}
	__syncthreads();
}

// Radix select over tokens with bits >= floor_bits, from the largest: rem is a mass
// (fixed point) strictly inside (ge = 0: rem < mass of them) or within (ge = 1: 0 < rem
// <= mass) the tokens' total.  Walking down the sorted order, the value where the mass
// from above first reaches rem (ge) or exceeds it (!ge).  by_count: rem counts tokens
// instead (1 <= rem <= their number; with ge, the rem-th largest value).  Thread 0's
// results: the value's bits, its count, and rem less the mass (count) above it.  sh_*:
// shared scalars.
static __device__ void s2_select(const double *p, int V, unsigned long long floor_bits,
			  unsigned long long rem, int ge, int by_count, unsigned *hc,
			  unsigned long long *hm, unsigned long long *s_prefix,
			  unsigned long long *s_rem, unsigned *s_cnt)
{
	unsigned long long prefix = 0, mask = 0;
	if (threadIdx.x == 0)
		*s_rem = rem;
	for (int shift = 56; shift >= 0; shift -= 8) {
		s2_hist(p, V, prefix, mask, shift, floor_bits, hc, hm);
		if (threadIdx.x == 0) {
			unsigned long long r = *s_rem;
			int d = 255;
			for (; d > 0; d--) {
				unsigned long long h = by_count ? (unsigned long long)hc[d] : hm[d];
				if (ge ? h >= r : h > r)
					break;
				r -= h;
			}
			*s_rem = r;
			*s_cnt = hc[d];
			*s_prefix = prefix | ((unsigned long long)d << shift);
		}
		__syncthreads();
		prefix = *s_prefix;
		mask |= 0xffull << shift;
	}
}

template <int MAXT>
static __global__ void __launch_bounds__(MAXT)
	sample2_kernel(int32_t *ids, const float *logits, const int32_t *rows,
		       const uint64_t *keys, const int32_t *counters, int N, int V,
		       float temperature, int top_k, float top_p, char *work, size_t per_block)
{
	__shared__ double shd[32];
	__shared__ float shf[32];
	__shared__ int shi[32];
	__shared__ unsigned long long shu[32];
	__shared__ unsigned hc[256];
	__shared__ unsigned long long hm[256];
	__shared__ unsigned scan[MAXT];
	__shared__ unsigned long long s_prefix, s_rem;
	__shared__ unsigned s_cnt;
	double *p = (double *)(work + per_block * blockIdx.x);
	for (int i = blockIdx.x; i < N; i += gridDim.x) {
		const float *lg = logits + (size_t)rows[i] * V;
		float mx = -INFINITY;
		int nan = 0, best = -1;
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			float x = lg[j];
			if (isnan(x))
				nan = 1;
			else if (best < 0 || x > mx)
				mx = x, best = j;
		}
		float gmx = s2_block_max(mx, shf);
		if (__syncthreads_or(nan)) {
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
		double dmx = (double)gmx, part = 0;
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			double e = exp(((double)lg[j] - dmx) / (double)temperature);
			p[j] = e;
			part += e;
		}
		double Z = s2_block_sum_d(part, shd);
		unsigned long long tpart = 0;
		for (int j = threadIdx.x; j < V; j += blockDim.x) {
			double q = p[j] / Z;
			p[j] = q;
			tpart += s2_fx(q);
		}
		unsigned long long total = s2_block_sum_ull(tpart, shu);
		__syncthreads(); // p complete
		// 3b. top-k: the tokens with bits >= kfloor stay, their mass is total
		unsigned long long kfloor = 0;
		int topk_on = 0;
		if (top_k > 0 && top_k < V) {
			s2_select(p, V, 0, (unsigned long long)top_k, 1, 1, hc, hm, &s_prefix, &s_rem,
				  &s_cnt);
			unsigned long long kb = s_prefix, kpart = 0, cpart = 0;
			for (int j = threadIdx.x; j < V; j += blockDim.x)
				if (s2_bits(p[j]) >= kb) {
					kpart += s2_fx(p[j]);
					cpart++;
				}
			unsigned long long kmass = s2_block_sum_ull(kpart, shu);
			unsigned long long kcnt = s2_block_sum_ull(cpart, shu);
			if (kcnt < (unsigned long long)V) {
				kfloor = kb;
				total = kmass;
				topk_on = 1;
			}
			__syncthreads(); // every thread has read s_prefix
		}
		// 4. the nucleus: every token with bits > tau, and m ties at tau
		unsigned long long tau = kfloor, mass = total;
		if (top_p < 1.0f) {
			unsigned long long need =
				topk_on ? __double2ull_rn((double)top_p * (double)total)
					: __double2ull_rn((double)top_p * S2_FX_SCALE);
			need = need < total ? need : total;
			need = need > 0 ? need : 1;
			s2_select(p, V, kfloor, need, 1, 0, hc, hm, &s_prefix, &s_rem, &s_cnt);
			tau = s_prefix;
			unsigned long long r = s_rem, ft = s2_fx(__longlong_as_double((long long)tau));
			unsigned c = s_cnt;
			unsigned long long m = ft > 0 ? (r + ft - 1) / ft : c;
			m = m < 1 ? 1 : m > c ? c : m;
			mass = need - r + m * ft;
			__syncthreads(); // every thread has read s_*
		}
		// 5. the draw
		double u = bk_crng_uniform_dev(keys[i], (uint64_t)counters[i]);
		unsigned long long target = (unsigned long long)(u * (double)mass);
		target = target < mass ? target : mass - 1;
		s2_select(p, V, tau, target, 0, 0, hc, hm, &s_prefix, &s_rem, &s_cnt);
		unsigned long long beta = s_prefix, fb = s2_fx(__longlong_as_double((long long)beta));
		unsigned cb = s_cnt;
		unsigned long long jj = fb > 0 ? s_rem / fb : 0;
		unsigned jsel = jj < cb ? (unsigned)jj : cb - 1;
		// 6. the jsel-th token (id order) whose bits are beta
		int per = (V + (int)blockDim.x - 1) / (int)blockDim.x;
		int a0 = threadIdx.x * per, a1 = a0 + per < V ? a0 + per : V;
		unsigned cnt = 0;
		for (int j = a0; j < a1; j++)
			cnt += s2_bits(p[j]) == beta;
		scan[threadIdx.x] = cnt;
		__syncthreads();
		if (threadIdx.x == 0) {
			unsigned acc = 0;
			for (int t = 0; t < (int)blockDim.x; t++) {
				unsigned c = scan[t];
				scan[t] = acc;
				acc += c;
			}
		}
		__syncthreads();
		unsigned before = scan[threadIdx.x];
		if (jsel >= before && jsel < before + cnt) {
			unsigned k = before;
			for (int j = a0; j < a1; j++)
				if (s2_bits(p[j]) == beta && k++ == jsel) {
					ids[i] = j;
					break;
				}
		}
		__syncthreads();
	}
}
