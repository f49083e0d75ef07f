// cuda_attn_dot.cuh - the first step of both attention backwards (the fp32 kernel of
// cuda_attention.cu and the tensor-core one of cuda_attention_tc.cu): Di [NH,T] =
// sum_d dout[t,h,d] * out[t,h,d] in fp32, one warp per (t, h).  Include after
// cuda_common.cuh.
#ifndef BK_CUDA_ATTN_DOT_CUH
#define BK_CUDA_ATTN_DOT_CUH

static __global__ void bk_attn_dot_kernel(float *Di, const float *dout, const float *out,
					  int T, int NH, int D)
{
	size_t w = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
	int lane = threadIdx.x & 31;
	if (w >= (size_t)T * NH)
		return;
	int t = (int)(w / NH), h = (int)(w % NH);
	const float *a = dout + w * D, *b = out + w * D;
	float acc = 0.0f;
	for (int d = lane; d < D; d += 32)
		acc = fmaf(a[d], b[d], acc);
	acc = bk_warp_sum(acc);
	if (lane == 0)
		Di[(size_t)h * T + t] = acc;
}

#endif
