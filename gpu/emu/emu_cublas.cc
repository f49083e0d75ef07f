// emu_cublas.cc - cuBLAS for the emulation build (gpu/emu/emu_cublas.h): GEMMs queued on the
// handle's stream, computed by OpenBLAS sgemm on fp32 copies of the operands (bf16
// widened exactly; FAST_TF32 rounds fp32 inputs to TF32 as the tensor cores take them).
// beta = 0 never reads C (a NaN-poisoned C stays out), as cuBLAS documents.
// Not modelled: cuBLAS's own accumulation order and its workspace.
#include "gpu/emu/emu_cublas.h"

#include <stdlib.h>

#include <vector>

extern "C" {
#include <cblas.h>
}

struct emu_cublas {
	cudaStream_t stream = 0;
	cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
	*h = new emu_cublas;
	return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t h)
{
	delete h;
	return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	h->math = m;
	return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s)
{
	switch (s) {
	case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
	}
	return "CUBLAS_STATUS_UNKNOWN";
}

// fp32 rounded to TF32 (10 mantissa bits, to nearest, ties away from zero: cvt.rna.tf32)
static float tf32(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	if ((u & 0x7f800000u) != 0x7f800000u)
		u = (u + 0x1000u) & 0xffffe000u;
	memcpy(&x, &u, 4);
	return x;
}

static size_t esize(cudaDataType t) { return t == CUDA_R_16BF ? 2 : 4; }

// elements of a column-major operand of rows x cols (as stored) with leading dimension ld
static size_t extent(int rows, int cols, int ld)
{
	return rows && cols ? (size_t)(cols - 1) * ld + rows : 0;
}

struct gemm_args {
	cublasOperation_t ta, tb;
	int m, n, k, lda, ldb, ldc;
	float alpha, beta;
	cudaDataType at, bt, ct;
	bool tf32;
};

static std::vector<float> widen(const void *p, cudaDataType t, size_t n, bool round_tf32)
{
	std::vector<float> v(n);
	if (t == CUDA_R_16BF)
		for (size_t i = 0; i < n; i++)
			v[i] = __bfloat162float(((const __nv_bfloat16 *)p)[i]);
	else
		for (size_t i = 0; i < n; i++)
			v[i] = round_tf32 ? tf32(((const float *)p)[i]) : ((const float *)p)[i];
	return v;
}

static void check_ranges(const gemm_args &g, const void *A, const void *B, const void *C,
			 const char *call)
{
	int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
	int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
	if (g.lda < (ar > 1 ? ar : 1) || g.ldb < (br > 1 ? br : 1) || g.ldc < (g.m > 1 ? g.m : 1))
		emu_fatal("%s: leading dimension below the rows (lda %d, ldb %d, ldc %d for "
			  "m %d n %d k %d)",
			  call, g.lda, g.ldb, g.ldc, g.m, g.n, g.k);
	if (g.k && !emu_dev_range(A, extent(ar, ac, g.lda) * esize(g.at)))
		emu_fatal("%s: A = %p [%d x %d, ld %d] is not inside live device memory", call, A,
			  ar, ac, g.lda);
	if (g.k && !emu_dev_range(B, extent(br, bc, g.ldb) * esize(g.bt)))
		emu_fatal("%s: B = %p [%d x %d, ld %d] is not inside live device memory", call, B,
			  br, bc, g.ldb);
	if (!emu_dev_range(C, extent(g.m, g.n, g.ldc) * esize(g.ct)))
		emu_fatal("%s: C = %p [%d x %d, ld %d] is not inside live device memory", call, C,
			  g.m, g.n, g.ldc);
}

static void gemm_run(const gemm_args &g, const void *A, const void *B, void *C)
{
	if (!g.m || !g.n)
		return;
	int ar = g.ta == CUBLAS_OP_N ? g.m : g.k, ac = g.ta == CUBLAS_OP_N ? g.k : g.m;
	int br = g.tb == CUBLAS_OP_N ? g.k : g.n, bc = g.tb == CUBLAS_OP_N ? g.n : g.k;
	std::vector<float> c((size_t)g.m * g.n, 0.0f);
	if (g.k) {
		std::vector<float> a = widen(A, g.at, extent(ar, ac, g.lda), g.tf32);
		std::vector<float> b = widen(B, g.bt, extent(br, bc, g.ldb), g.tf32);
		cblas_sgemm(CblasColMajor, g.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
			    g.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g.m, g.n, g.k, g.alpha,
			    a.data(), g.lda, b.data(), g.ldb, 0.0f, c.data(), g.m);
	}
	for (int j = 0; j < g.n; j++)
		for (int i = 0; i < g.m; i++) {
			size_t o = (size_t)j * g.ldc + i;
			float v = c[(size_t)j * g.m + i];
			if (g.ct == CUDA_R_32F) {
				float *y = (float *)C + o;
				*y = g.beta != 0.0f ? v + g.beta * *y : v;
			} else {
				__nv_bfloat16 *y = (__nv_bfloat16 *)C + o;
				*y = __float2bfloat16_rn(g.beta != 0.0f ? v + g.beta * __bfloat162float(*y)
									: v);
			}
		}
}

static cublasStatus_t make_args(gemm_args *g, cublasHandle_t h, cublasOperation_t ta,
				cublasOperation_t tb, int m, int n, int k, const void *alpha,
				cudaDataType at, int lda, cudaDataType bt, int ldb, const void *beta,
				cudaDataType ct, int ldc, cublasComputeType_t comp)
{
	if (!h)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (m < 0 || n < 0 || k < 0 || (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) ||
	    (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
		return CUBLAS_STATUS_INVALID_VALUE;
	bool bf = at == CUDA_R_16BF && bt == CUDA_R_16BF && comp == CUBLAS_COMPUTE_32F &&
		  (ct == CUDA_R_32F || ct == CUDA_R_16BF);
	bool f32 = at == CUDA_R_32F && bt == CUDA_R_32F && ct == CUDA_R_32F &&
		   (comp == CUBLAS_COMPUTE_32F || comp == CUBLAS_COMPUTE_32F_FAST_TF32);
	if (!bf && !f32)
		return CUBLAS_STATUS_NOT_SUPPORTED;
	*g = {ta, tb, m, n, k, lda, ldb, ldc, *(const float *)alpha, *(const float *)beta,
	      at, bt, ct,
	      f32 && (comp == CUBLAS_COMPUTE_32F_FAST_TF32 || h->math == CUBLAS_TF32_TENSOR_OP_MATH)};
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			    int n, int k, const void *alpha, const void *A, cudaDataType at, int lda,
			    const void *B, cudaDataType bt, int ldb, const void *beta, void *C,
			    cudaDataType ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t)
{
	gemm_args g;
	cublasStatus_t st = make_args(&g, h, ta, tb, m, n, k, alpha, at, lda, bt, ldb, beta, ct,
				      ldc, comp);
	if (st != CUBLAS_STATUS_SUCCESS)
		return st;
	check_ranges(g, A, B, C, "cublasGemmEx");
	emu_issue(h->stream,
		  [g, A, B, C] {
			  check_ranges(g, A, B, C, "cublasGemmEx (when it ran)");
			  gemm_run(g, A, B, C);
			  emu_guard_check(C, "cublasGemmEx");
		  },
		  "cublasGemmEx");
	return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
				   int m, int n, int k, const void *alpha, const void *const A[],
				   cudaDataType at, int lda, const void *const B[], cudaDataType bt,
				   int ldb, const void *beta, void *const C[], cudaDataType ct,
				   int ldc, int batch, cublasComputeType_t comp, cublasGemmAlgo_t)
{
	gemm_args g;
	cublasStatus_t st = make_args(&g, h, ta, tb, m, n, k, alpha, at, lda, bt, ldb, beta, ct,
				      ldc, comp);
	if (st != CUBLAS_STATUS_SUCCESS)
		return st;
	if (batch < 0)
		return CUBLAS_STATUS_INVALID_VALUE;
	size_t tb_bytes = (size_t)batch * sizeof(void *);
	// the pointer tables are read by the device: they must be device memory
	if (batch && (!emu_dev_range(A, tb_bytes) || !emu_dev_range(B, tb_bytes) ||
		      !emu_dev_range(C, tb_bytes)))
		emu_fatal("cublasGemmBatchedEx: a pointer table (A %p, B %p, C %p, %d entries) is "
			  "not inside live device memory",
			  (const void *)A, (const void *)B, (const void *)C, batch);
	emu_issue(h->stream,
		  [g, A, B, C, batch] {
			  for (int i = 0; i < batch; i++) {
				  check_ranges(g, A[i], B[i], C[i],
					       "cublasGemmBatchedEx (a member, when it ran)");
				  gemm_run(g, A[i], B[i], C[i]);
				  emu_guard_check(C[i], "cublasGemmBatchedEx");
			  }
		  },
		  "cublasGemmBatchedEx");
	return CUBLAS_STATUS_SUCCESS;
}
