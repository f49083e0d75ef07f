// cuda_device.cu - CUDA runtime probing for --device auto|cuda: how many devices,
// and why none when there are none.  Every CUDA return code is checked by callers
// through the message; this file never aborts.
#include <cuda_runtime.h>

extern "C" int bk_cuda_device_count(const char **why)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		*why = cudaGetErrorString(e);
		cudaGetLastError(); // clear the sticky error so later probes start clean
		return 0;
	}
	if (n == 0)
		*why = "cudaGetDeviceCount found no device";
	return n;
}
