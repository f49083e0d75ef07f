// kernel_check.h - device buffers for the kernel tests of tests/emu/ (test_act_kernels.cc,
// test_attention_tc.cc, test_decode2.cc, test_loss2.cc, test_proj3.cc): C++ programs of the
// emulation build (make emu) that include a kernel's own source after cuda_common.cuh and
// launch it with BK_LAUNCH on the op stream, so it runs under every check of gpu/emu
// (exact-size poisoned allocations with guard bytes, pointer arguments inside live
// allocations, fibers in shuffled order, barrier and warp-collective checks, launch limits).
// dbuf<T>: one exact-size device allocation, fresh (0xff: NaN as fp32 and bf16) or a copy
// of a host vector; get() waits for the device and copies it back.  Header-only.
#ifndef BK_TESTS_EMU_KERNEL_CHECK_H
#define BK_TESTS_EMU_KERNEL_CHECK_H

#include "gpu/cuda/cuda_common.cuh"

#include <vector>

template <typename T> struct dbuf {
	T *p = nullptr;
	size_t n = 0;
	explicit dbuf(size_t count) : n(count)
	{
		CUDA_CHECK(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
	}
	explicit dbuf(const std::vector<T> &h) : dbuf(h.size())
	{
		CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
	}
	dbuf(const dbuf &) = delete;
	dbuf &operator=(const dbuf &) = delete;
	~dbuf() { CUDA_CHECK(cudaFree(p)); }
	operator T *() const { return p; }
	std::vector<T> get() const
	{
		std::vector<T> h(n);
		CUDA_CHECK(cudaStreamSynchronize(bk_cuda_stream()));
		CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
		return h;
	}
};

// cu_seqlens [S+1] of packed sequences of these lengths
static inline std::vector<int32_t> kc_cu_seqlens(const std::vector<int> &lens)
{
	std::vector<int32_t> cu(lens.size() + 1, 0);
	for (size_t s = 0; s < lens.size(); s++)
		cu[s + 1] = cu[s] + lens[s];
	return cu;
}

// bf16 bits and values on the host
static inline uint16_t kc_bits(__nv_bfloat16 b) { return __bfloat16_as_ushort(b); }
static inline float kc_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

#endif
