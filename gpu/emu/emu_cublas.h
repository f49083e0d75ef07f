// emu_cublas.h - the cuBLAS of the emulation build (gpu/emu/emu.h): the handle, stream and
// math mode, cublasGemmEx in the two type combinations bakery uses (bf16 x bf16 -> fp32
// with fp32 compute; fp32 x fp32 -> fp32 with TF32 compute) and cublasGemmBatchedEx
// (bf16 x bf16 -> fp32).  Each call checks that every matrix it reads or writes lies in
// live device memory and is queued on the handle's stream (emu_cublas.cc).
#ifndef BK_GPU_EMU_CUBLAS_H
#define BK_GPU_EMU_CUBLAS_H

#include "gpu/emu/emu.h"

enum cublasStatus_t {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_NOT_INITIALIZED = 1,
	CUBLAS_STATUS_INVALID_VALUE = 7,
	CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
typedef cudaDataType cudaDataType_t;
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68, CUBLAS_COMPUTE_32F_FAST_TF32 = 77 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
enum cublasMath_t { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 };
struct emu_cublas;
typedef emu_cublas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m);
const char *cublasGetStatusString(cublasStatus_t s);
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
			    int n, int k, const void *alpha, const void *A, cudaDataType at, int lda,
			    const void *B, cudaDataType bt, int ldb, const void *beta, void *C,
			    cudaDataType ct, int ldc, cublasComputeType_t comp, cublasGemmAlgo_t algo);
cublasStatus_t cublasGemmBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb,
				   int m, int n, int k, const void *alpha, const void *const A[],
				   cudaDataType at, int lda, const void *const B[], cudaDataType bt,
				   int ldb, const void *beta, void *const C[], cudaDataType ct,
				   int ldc, int batch, cublasComputeType_t comp,
				   cublasGemmAlgo_t algo);
#endif
