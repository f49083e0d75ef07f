// cuda_act_kernels.cuh - the device code of BK_ACT=bf16 (gpu/cuda/cuda_act.cuh has the
// design, the host side and the error bounds): the elementwise and row kernels that write
// or read bf16 activations.  Device code only, so that tests/emu/test_act_kernels.cc can
// launch it on its own on the emulated GPU; include after cuda_common.cuh.
// Each kernel is the fp32 kernel of gpu/cuda/cuda_ops.cu it is named after, with the
// same fp32 arithmetic in the same order, and a rounding (round to nearest even) where
// a value is stored as bf16 or a widening where one is read.
#ifndef BK_CUDA_ACT_KERNELS_CUH
#define BK_CUDA_ACT_KERNELS_CUH

typedef __nv_bfloat16 act_bf16;

// rmsnorm_forward_kernel with out in bf16: one block per row
__global__ void act_rmsnorm_kernel(act_bf16 *out, float *rstd, const float *x,
				   const act_bf16 *w, int H, float eps)
{
	__shared__ float sh[32];
	int t = blockIdx.x;
	const float *xt = x + (size_t)t * H;
	act_bf16 *ot = out + (size_t)t * H;
	float ss = 0;
	for (int i = threadIdx.x; i < H; i += blockDim.x)
		ss += xt[i] * xt[i];
	ss = bk_block_sum(ss, sh);
	float r = 1.0f / sqrtf(ss / (float)H + eps);
	if (threadIdx.x == 0)
		rstd[t] = r;
	for (int i = threadIdx.x; i < H; i += blockDim.x)
		ot[i] = bk_f32_to_bf16(bk_bf16_to_f32(w[i]) * (xt[i] * r));
}

// rope_kernel (sign +1) from fp32 x into bf16 out (x unchanged); one thread per
// (t, head, i < D/2)
__global__ void act_rope_kernel(act_bf16 *out, const float *x, const int32_t *pos,
				const float *inv_freq, int T, int n, int D)
{
	int half = D / 2;
	size_t total = (size_t)T * n * half;
	size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (idx >= total)
		return;
	int i = (int)(idx % half);
	size_t th = idx / half; // t * n + h
	int t = (int)(th / n);
	float ang = (float)pos[t] * inv_freq[i];
	float c = cosf(ang), s = sinf(ang);
	const float *xh = x + th * D;
	act_bf16 *oh = out + th * D;
	float a = xh[i], b = xh[i + half];
	oh[i] = bk_f32_to_bf16(a * c - b * s);
	oh[i + half] = bk_f32_to_bf16(b * c + a * s);
}

#define ACT_GELU_K0 0.7978845608028654f // sqrt(2/pi), as cuda_ops.cu's GELU_K0
#define ACT_GELU_K1 0.044715f

// silu(g) or gelu_tanh(g) (swiglu_forward_kernel's / geglu_forward_kernel's formulas)
__device__ __forceinline__ float act_glu_f(float g, int geglu)
{
	if (geglu) {
		float th = tanhf(ACT_GELU_K0 * (g + ACT_GELU_K1 * g * g * g));
		return 0.5f * g * (1.0f + th);
	}
	return g / (1.0f + expf(-g));
}

// gs, us = round(gate), round(up) (saved); h = round(f(gs) * us)
__global__ void act_glu_forward_kernel(act_bf16 *h, act_bf16 *gs, act_bf16 *us,
				       const float *gate, const float *up, size_t n, int geglu)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride) {
		act_bf16 gb = bk_f32_to_bf16(gate[i]), ub = bk_f32_to_bf16(up[i]);
		gs[i] = gb;
		us[i] = ub;
		h[i] = bk_f32_to_bf16(act_glu_f(bk_bf16_to_f32(gb), geglu) * bk_bf16_to_f32(ub));
	}
}

// swiglu_backward_kernel / geglu_backward_kernel on the saved bf16 gate and up
__global__ void act_glu_backward_kernel(float *dgate, float *dup, const float *dh,
					const act_bf16 *gate, const act_bf16 *up, size_t n,
					int geglu)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride) {
		float g = bk_bf16_to_f32(gate[i]), u = bk_bf16_to_f32(up[i]);
		if (geglu) {
			float th = tanhf(ACT_GELU_K0 * (g + ACT_GELU_K1 * g * g * g));
			float gl = 0.5f * g * (1.0f + th);
			float dg = 0.5f * (1.0f + th) + 0.5f * g * (1.0f - th * th) * ACT_GELU_K0 *
								(1.0f + 3.0f * ACT_GELU_K1 * g * g);
			dgate[i] += dh[i] * u * dg;
			dup[i] += dh[i] * gl;
		} else {
			float sg = 1.0f / (1.0f + expf(-g));
			dgate[i] += dh[i] * u * sg * (1.0f + g * (1.0f - sg));
			dup[i] += dh[i] * g * sg;
		}
	}
}

// out [n] fp32 = in [n] bf16 (exact)
__global__ void act_widen_kernel(float *out, const act_bf16 *in, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride)
		out[i] = bk_bf16_to_f32(in[i]);
}

// xd [n] bf16 = round(x * keep / (1-p)), x bf16: dropout_kernel's mask (crng(key, i) >= p)
__global__ void act_dropout_kernel(act_bf16 *xd, const act_bf16 *x, size_t n, float p,
				   float inv, uint64_t key)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride)
		xd[i] = bk_f32_to_bf16(bk_crng_uniform_dev(key, i) >= (double)p
					       ? bk_bf16_to_f32(x[i]) * inv
					       : 0.0f);
}

#endif
