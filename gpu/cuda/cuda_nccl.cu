// cuda_nccl.cu - the CUDA side of gpu/nccl.c: the stream NCCL's all-reduce is issued on
// (bk_ops_cuda's own, so it follows the backward and precedes the optimizer) and a
// non-blocking look at whether it has finished, so that nccl.c can watch NCCL's
// asynchronous errors and a timeout while it waits.  No NCCL here: nccl.c loads it.
#include "gpu/cuda/cuda_common.cuh"
#include "gpu/nccl.h"

extern "C" void *bk_cuda_nccl_stream(void)
{
	return (void *)bk_cuda_stream();
}

extern "C" int bk_cuda_nccl_poll(const char **why)
{
	cudaError_t e = cudaStreamQuery(bk_cuda_stream());
	if (e == cudaSuccess)
		return 1;
	if (e == cudaErrorNotReady)
		return 0;
	*why = cudaGetErrorString(e);
	return -1;
}
