// cuda_wload.cuh - ops->weight_upload_bf16 (gpu/ops.h): a frozen weight pulled in bf16
// chunks from the loader (gpu/load.c: straight from the mapped checkpoint) into pinned
// host staging and copied from there into its device storage.  No fp32 anywhere, no
// host copy of the tensor, no device staging: the device gets the bytes the loader wrote,
// so a bf16 checkpoint lands bit for bit as cuda_weight_upload's fp32 -> bf16 of the same
// values (exact for bf16 values) would put it.
//
// Staging: two pinned buffers of at most WL_CHUNK elements (4 MiB together, less for a
// smaller tensor), allocated for the tensor and freed after it: while the stream copies
// chunk k from one, the loader fills chunk k + 1 into the other; an event per buffer says
// when its copy has read it (the emulation runs a copy at the next sync and so sees a
// buffer refilled too early).  This is the host memory a load costs beyond the page
// cache, whatever the tensor's size.  Placement (g_wmode, cuda_vmm.h) as cuda_weight_upload.
// Included by cuda_ops.cu, after cuda_weight_upload (its allocator and placement).
#ifndef BK_CUDA_WLOAD_CUH
#define BK_CUDA_WLOAD_CUH

#define WL_CHUNK ((size_t)1 << 20) // bf16 elements per staging buffer (2 MiB)

static bk_weight *cuda_weight_upload_bf16(int rows, int cols, bk_bf16_fill fill, void *ctx)
{
	if (rows <= 0 || cols <= 0 || !fill)
		CUDA_BUG("weight_upload_bf16: %d x %d", rows, cols);
	cuda_init();
	size_t n = (size_t)rows * cols;
	bk_weight *w = weight_new_bf16(rows, cols);
	uint16_t *d = (uint16_t *)w->data;
	if (weight_placed_only())
		return w;
	size_t cb = n < WL_CHUNK ? n : WL_CHUNK;
	int nbuf = n > cb ? 2 : 1;
	uint16_t *stage[2] = { NULL, NULL };
	cudaEvent_t read[2];
	for (int b = 0; b < nbuf; b++) {
		if (cudaHostAlloc(&stage[b], cb * sizeof(uint16_t), cudaHostAllocDefault) != cudaSuccess) {
			cudaGetLastError();
			die("cuda: out of pinned host memory for the weight staging buffer (%zu bytes, "
			    "gpu/cuda/cuda_wload.cuh) while loading the weights",
			    cb * sizeof(uint16_t));
		}
		CUDA_CHECK(cudaEventCreate(&read[b]));
	}
	for (size_t off = 0, k = 0; off < n; off += cb, k++) {
		int b = (int)(k % 2);
		size_t m = n - off < cb ? n - off : cb;
		if (k >= 2) // the copy of chunk k - 2 out of this buffer is done
			CUDA_CHECK(cudaEventSynchronize(read[b]));
		fill(ctx, off, m, stage[b]);
		CUDA_CHECK(cudaMemcpyAsync(d + off, stage[b], m * sizeof(uint16_t),
					   cudaMemcpyHostToDevice, g_stream));
		CUDA_CHECK(cudaEventRecord(read[b], g_stream));
	}
	CUDA_CHECK(cudaStreamSynchronize(g_stream));
	for (int b = 0; b < nbuf; b++) {
		CUDA_CHECK(cudaEventDestroy(read[b]));
		CUDA_CHECK(cudaFreeHost(stage[b]));
	}
	return w;
}

#endif
