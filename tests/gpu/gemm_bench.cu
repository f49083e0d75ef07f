// gemm_bench.cu - the bf16 GEMM rate of this GPU as cuBLAS gives it (bf16 inputs, fp32
// accumulation), the denominator of the training benchmark's MFU.  Square 8192^3 with
// bf16 output (the best case) and the shapes bk_ops_cuda's linears run (fp32 output).
// Not a check of results (test_cuda_ops does that).
// --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU): the same at 256^3 and
// the linears' shapes of a small layer (H 128, I 352, 64 tokens), 2 iterations.
// Usage: gemm_bench [--tiny]   prints one line per shape and "peak <TFLOP/s>" last.
#include "gpu/cuda/cuda_common.cuh"

#include <stdio.h>
#include <string.h>

__global__ void fill_kernel(__nv_bfloat16 *p, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		p[i] = __float2bfloat16_rn((float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f);
}

static double run(cublasHandle_t h, cudaStream_t st, int m, int n, int k, bool f32_out, int iters)
{
	size_t na = (size_t)m * k, nb = (size_t)k * n, nc = (size_t)m * n;
	__nv_bfloat16 *A, *B;
	void *C;
	CUDA_CHECK(cudaMalloc(&A, na * 2));
	CUDA_CHECK(cudaMalloc(&B, nb * 2));
	CUDA_CHECK(cudaMalloc(&C, nc * (f32_out ? 4 : 2)));
	BK_LAUNCH(fill_kernel, bk_cuda_blocks(na, 256), 256, 0, st, A, na);
	BK_LAUNCH(fill_kernel, bk_cuda_blocks(nb, 256), 256, 0, st, B, nb);
	float alpha = 1, beta = 0;
	cudaEvent_t e0, e1;
	CUDA_CHECK(cudaEventCreate(&e0));
	CUDA_CHECK(cudaEventCreate(&e1));
	for (int w = 0; w < 2; w++) { // warm-up round, then the timed one
		CUDA_CHECK(cudaEventRecord(e0, st));
		for (int i = 0; i < iters; i++)
			CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, A,
						  CUDA_R_16BF, k, B, CUDA_R_16BF, k, &beta, C,
						  f32_out ? CUDA_R_32F : CUDA_R_16BF, m,
						  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
		CUDA_CHECK(cudaEventRecord(e1, st));
		CUDA_CHECK(cudaEventSynchronize(e1));
	}
	float ms = 0;
	CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
	CUDA_CHECK(cudaEventDestroy(e0));
	CUDA_CHECK(cudaEventDestroy(e1));
	CUDA_CHECK(cudaFree(A));
	CUDA_CHECK(cudaFree(B));
	CUDA_CHECK(cudaFree(C));
	return 2.0 * m * n * k * iters / (ms * 1e-3) / 1e12;
}

int main(int argc, char **argv)
{
	bool tiny = argc == 2 && !strcmp(argv[1], "--tiny");
	if (argc > 2 || (argc == 2 && !tiny)) {
		fprintf(stderr, "gemm_bench: error: usage: gemm_bench [--tiny]\n");
		return 2;
	}
	cublasHandle_t h = bk_cuda_cublas();
	cudaStream_t st = bk_cuda_stream();
	struct {
		int m, n, k;
		bool f32;
		const char *what;
	} big[] = {
		{ 8192, 8192, 8192, false, "square, bf16 out" },
		{ 8192, 8192, 8192, true, "square, fp32 out" },
		{ 5632, 4096, 2048, true, "gate/up: I x T x H" },
		{ 2048, 4096, 5632, true, "down: H x T x I" },
		{ 2048, 4096, 2048, true, "q/o: H x T x H" },
	}, small[] = {
		{ 256, 256, 256, false, "square, bf16 out" },
		{ 256, 256, 256, true, "square, fp32 out" },
		{ 352, 64, 128, true, "gate/up: I x T x H" },
		{ 128, 64, 352, true, "down: H x T x I" },
		{ 128, 64, 128, true, "q/o: H x T x H" },
	}, *shapes = tiny ? small : big;
	double peak = 0;
	for (size_t i = 0; i < sizeof(big) / sizeof(big[0]); i++) {
		double r = run(h, st, shapes[i].m, shapes[i].n, shapes[i].k, shapes[i].f32,
			       tiny ? 2 : 20);
		printf("gemm %5d x %5d x %5d  %-20s %7.1f TFLOP/s\n", shapes[i].m, shapes[i].n,
		       shapes[i].k, shapes[i].what, r);
		peak = r > peak ? r : peak;
	}
	printf("peak %.1f\n", peak);
	return 0;
}
