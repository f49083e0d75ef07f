// cuda_loss2.cuh - the device side of cuda_loss.cu that tests/emu/test_loss2.cc also
// launches on its own (on the emulated GPU): block reductions, the final softcap's slope
// and the three kernels of the v2 loss (BK_LOSS=v2): the exact and the top-k row
// kernels and the validation of the teacher's top-k fields.  Host code, cuBLAS and the
// v1 kernels stay in cuda_loss.cu.  Included once, by cuda_loss.cu (and the test), after
// cuda_common.cuh.
#ifndef BK_CUDA_LOSS2_CUH
#define BK_CUDA_LOSS2_CUH

#define LOSS_THREADS 256

// ---- block reductions (blockDim.x == LOSS_THREADS) ----
template <typename T, typename F>
__device__ __forceinline__ T block_reduce(T v, F op, T *sh /* [32] */)
{
	int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
	for (int o = 16; o > 0; o >>= 1)
		v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
	__syncthreads(); // sh may still be read by a previous call
	if (lane == 0)
		sh[wid] = v;
	__syncthreads();
	T r = sh[0];
	for (int i = 1; i < nw; i++)
		r = op(r, sh[i]);
	return r;
}

struct op_max {
	__device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct op_sumf {
	__device__ float operator()(float a, float b) const { return a + b; }
};
struct op_sumd {
	__device__ double operator()(double a, double b) const { return a + b; }
};

// the slope of the cap at a scaled logit u = cap(z) / T: 1 - (u T / c)^2; tc = T / c
// (tc = 0: no cap, slope 1)
__device__ __forceinline__ float cap_slope(float u, float tc)
{
	float t = u * tc;
	return 1.0f - t * t;
}

// ---- per-logit arithmetic of v1's chunk kernels (cuda_loss.cu) and the v2 row kernels ----

// exact loss at a scaled logit u with student and teacher log-probs ls, lt:
// acc += p (lt - ls); returns the dlogit w (q - p) times the cap's slope at u when
// tc > 0 (q = e^ls, p = e^lt in fp32)
__device__ __forceinline__ float kl_exact_logit(float u, double ls, double lt, float wr,
						float tc, double *acc)
{
	float q = expf((float)ls), p = expf((float)lt);
	if (p > 0)
		*acc += p * (lt - ls);
	float g = wr * (q - p);
	return tc > 0 ? g * cap_slope(u, tc) : g;
}

// log(e^a + e^b) of two log-sum-exps, either of them -inf
__device__ __forceinline__ double log_add_exp(double a, double b)
{
	if (a == -INFINITY)
		return b;
	if (b == -INFINITY)
		return a;
	double mx = a > b ? a : b;
	return mx + log1p(exp(-fabs(a - b)));
}

// top-k loss at a logit u outside the ids: w (P q - prest q / q_rest), q = e^(u - l),
// q / q_rest = e^(u - lr) (l: log-sum-exp of the row, lr: of the logits outside the ids),
// before the cap's slope
__device__ __forceinline__ float topk_rest_dlogit(float u, double l, double lr, double pt,
						  double pr, float wr)
{
	double g = pt * expf((float)((double)u - l));
	if (pr > 0)
		g -= pr * expf((float)((double)u - lr));
	return wr * (float)g;
}

// ---- the v2 row kernels (cuda_loss.cu has the host side) ----

// One row of a block per CUDA block: log-sum-exp of the student u and of the teacher
// (ut with its own log-sum-exp, or tl already log-probs), KL, G = w (q - p) slope(u)
__global__ void __launch_bounds__(LOSS_THREADS)
kl_exact_row_kernel(const float *us /* [nb,V] */, const float *ut /* [nb,V] or NULL */,
		    const float *tl /* [nb,V] or NULL */, int V, const float *w /* [nb] */,
		    float tc, double *kl /* [nb] */, __nv_bfloat16 *G /* [nb,V] or NULL */)
{
	__shared__ float shf[32];
	__shared__ double shd[32];
	const int r = blockIdx.x;
	const float *u = us + (size_t)r * V;
	const float *t = ut ? ut + (size_t)r * V : tl + (size_t)r * V;
	float ms = -INFINITY, mt = -INFINITY;
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		ms = fmaxf(ms, u[j]);
		if (ut)
			mt = fmaxf(mt, t[j]);
	}
	ms = block_reduce(ms, op_max(), shf);
	if (ut)
		mt = block_reduce(mt, op_max(), shf);
	double ss = 0, st = 0;
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		ss += (double)expf(u[j] - ms);
		if (ut)
			st += (double)expf(t[j] - mt);
	}
	ss = block_reduce(ss, op_sumd(), shd);
	if (ut)
		st = block_reduce(st, op_sumd(), shd);
	double lse_s = ss > 0 ? (double)ms + log(ss) : -INFINITY;
	double lse_t = ut ? (st > 0 ? (double)mt + log(st) : -INFINITY) : 0.0;
	float wr = w[r];
	double acc = 0;
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		double ls = (double)u[j] - lse_s, lt = (double)t[j] - lse_t;
		float g = kl_exact_logit(u[j], ls, lt, wr, tc, &acc);
		if (G)
			G[(size_t)r * V + j] = bk_f32_to_bf16(g);
	}
	acc = block_reduce(acc, op_sumd(), shd);
	if (threadIdx.x == 0)
		kl[r] = acc;
}

// One row of a block per CUDA block, top-k teacher: tu = u at the ids, the ids masked
// to -inf in u, log-sum-exp over the others and over tu, the coarsened KL, then
// G = w (P q - prest q / q_rest) slope(u) and at the ids w (P q - p) slope(tu)
__global__ void __launch_bounds__(LOSS_THREADS)
kl_topk_row_kernel(float *us /* [nb,V] */, int V, const int32_t *ids /* [nb,K] */,
		   const float *logp /* [nb,K] */, int K, float *tus /* [nb,K] scratch */,
		   const double *prest, const double *ptot, const float *w, float tc,
		   double *kl, __nv_bfloat16 *G /* [nb,V] or NULL */)
{
	__shared__ float shf[32];
	__shared__ double shd[32];
	const int r = blockIdx.x;
	float *u = us + (size_t)r * V, *tu = tus + (size_t)r * K;
	const int32_t *id = ids + (size_t)r * K;
	const float *lp = logp + (size_t)r * K;
	for (int i = threadIdx.x; i < K; i += blockDim.x) {
		int x = id[i];
		tu[i] = x >= 0 && x < V ? u[x] : -INFINITY; // bad ids: flagged by validation
	}
	__syncthreads();
	for (int i = threadIdx.x; i < K; i += blockDim.x) {
		int x = id[i];
		if (x >= 0 && x < V)
			u[x] = -INFINITY;
	}
	__syncthreads();
	float m = -INFINITY, mk = -INFINITY;
	for (int j = threadIdx.x; j < V; j += blockDim.x)
		m = fmaxf(m, u[j]);
	for (int i = threadIdx.x; i < K; i += blockDim.x)
		mk = fmaxf(mk, tu[i]);
	m = block_reduce(m, op_max(), shf);
	mk = block_reduce(mk, op_max(), shf);
	double s = 0, sk = 0;
	if (m > -INFINITY)
		for (int j = threadIdx.x; j < V; j += blockDim.x)
			s += (double)expf(u[j] - m);
	if (mk > -INFINITY)
		for (int i = threadIdx.x; i < K; i += blockDim.x)
			sk += exp((double)tu[i] - mk);
	s = block_reduce(s, op_sumd(), shd);
	sk = block_reduce(sk, op_sumd(), shd);
	double lr = s > 0 ? (double)m + log(s) : -INFINITY;
	double lk = sk > 0 ? (double)mk + log(sk) : -INFINITY, l = log_add_exp(lr, lk);
	double acc = 0;
	for (int i = threadIdx.x; i < K; i += blockDim.x) {
		double pi = exp((double)lp[i]);
		if (pi > 0)
			acc += pi * ((double)lp[i] - ((double)tu[i] - l));
	}
	acc = block_reduce(acc, op_sumd(), shd);
	double pr = prest[r], pt = ptot[r];
	if (threadIdx.x == 0)
		kl[r] = acc + (pr > 0 ? pr * (log(pr) - (lr - l)) : 0.0);
	if (!G)
		return;
	float wr = w[r];
	__nv_bfloat16 *g = G + (size_t)r * V;
	for (int j = threadIdx.x; j < V; j += blockDim.x) {
		float uj = u[j], gj = topk_rest_dlogit(uj, l, lr, pt, pr, wr);
		g[j] = bk_f32_to_bf16(tc > 0 && gj != 0.0f ? gj * cap_slope(uj, tc) : gj);
	}
	__syncthreads();
	for (int i = threadIdx.x; i < K; i += blockDim.x) {
		int x = id[i];
		if (x < 0 || x >= V)
			continue;
		double q = exp((double)tu[i] - l), p = exp((double)lp[i]);
		float gi = wr * (float)(pt * q - p);
		g[x] = bk_f32_to_bf16(tc > 0 ? gi * cap_slope(tu[i], tc) : gi);
	}
}

// One row per CUDA block: the checks of loss.c on the teacher fields (ids sorted in
// shared memory, Kp = K rounded up to a power of two, at most VALIDATE_MAX_K), prest and
// P = sum p + prest; any failure sets *err (the host finds which and says it)
__global__ void __launch_bounds__(LOSS_THREADS)
topk_validate_kernel(const int32_t *ids, const float *logp, const float *rest, int K, int Kp,
		     int V, double *prest, double *ptot, unsigned long long *err)
{
	BK_DYN_SMEM(int, sid);
	__shared__ double shd[32];
	const int r = blockIdx.x;
	const int32_t *id = ids + (size_t)r * K;
	const float *lp = logp + (size_t)r * K;
	int bad = 0;
	for (int i = threadIdx.x; i < Kp; i += blockDim.x) {
		int x = i < K ? id[i] : 0x7fffffff;
		if (i < K && (x < 0 || x >= V))
			bad = 1;
		sid[i] = x;
	}
	for (int size = 2; size <= Kp; size <<= 1)
		for (int stride = size >> 1; stride > 0; stride >>= 1) {
			__syncthreads();
			for (int i = threadIdx.x; i < Kp; i += blockDim.x) {
				int p = i ^ stride;
				if (p <= i)
					continue;
				bool up = (i & size) == 0;
				int a = sid[i], b = sid[p];
				if (up ? a > b : a < b) {
					sid[i] = b;
					sid[p] = a;
				}
			}
		}
	__syncthreads();
	for (int i = threadIdx.x + 1; i < K; i += blockDim.x)
		if (sid[i] == sid[i - 1])
			bad = 1;
	double pr = rest[r], sum = 0;
	if (!(pr >= -1e-4 && pr <= 1 + 1e-4))
		bad = 1;
	for (int i = threadIdx.x; i < K; i += blockDim.x) {
		double l = lp[i];
		if (isnan(l) || l > 1e-4)
			bad = 1;
		sum += exp(l);
	}
	bad = __syncthreads_or(bad);
	sum = block_reduce(sum, op_sumd(), shd);
	if (threadIdx.x == 0) {
		double p0 = (K == V || pr < 0) ? 0.0 : pr > 1 ? 1.0 : pr;
		prest[r] = p0;
		ptot[r] = p0 + sum;
		if (bad)
			atomicOr(err, 1ull);
	}
}

#endif
