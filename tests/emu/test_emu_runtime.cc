// test_emu_runtime.cc - the emulated CUDA runtime itself (gpu/emu/): that each fidelity check
// of emu.h catches what it is there to catch.  Every case is a small kernel or host
// sequence with a planted mistake, run in a child process; the child must die with the
// emulation's one-line message (or the CUDA error a real device gives), and the same
// sequence without the mistake must pass.  Built and run by make emu (tests/t0950-emu.sh).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "gpu/cuda/cuda_common.cuh"

extern "C" void bk_diag_init(const char *argv0);

static int n_checks, n_failed;
#if defined(__SANITIZE_ADDRESS__)
static const bool asan = true;
#else
static const bool asan = false;
#endif

// runs fn in a child; want_death: it must exit 1 with `msg` in its stderr; else exit 0
static void expect(const char *what, bool want_death, const char *msg, void (*fn)(void))
{
	char path[] = "/tmp/bk-emu-test.XXXXXX";
	int fd = mkstemp(path);
	fflush(stdout);
	pid_t pid = fork();
	if (pid == 0) {
		dup2(fd, 2);
		fn();
		CUDA_CHECK(cudaDeviceSynchronize());
		_exit(0);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	std::string err;
	char buf[4096];
	ssize_t r;
	lseek(fd, 0, SEEK_SET);
	while ((r = read(fd, buf, sizeof buf)) > 0)
		err.append(buf, (size_t)r);
	close(fd);
	unlink(path);
	// under ASan the allocation is exact and ASan's report (its own exit code) names it
	bool died = WIFEXITED(st) && (WEXITSTATUS(st) == 1 || (asan && WEXITSTATUS(st) != 0));
	bool ok = want_death ? died && err.find(msg) != std::string::npos
			     : WIFEXITED(st) && WEXITSTATUS(st) == 0;
	n_checks++;
	if (!ok)
		n_failed++;
	printf("%-62s %s\n", what, ok ? "ok" : "FAIL");
	if (!ok)
		printf("    status %d, stderr: %s\n", st, err.c_str());
}

// ---- kernels ----

__global__ void fill_kernel(float *y, int n, int extra) // writes n + extra elements
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n + extra)
		y[i] = 1.0f;
}

__global__ void half_barrier_kernel(float *y)
{
	if (threadIdx.x < 16)
		return; // half the block leaves before the barrier
	__syncthreads();
	y[threadIdx.x] = 1.0f;
}

__global__ void two_barriers_kernel(float *y)
{
	if (threadIdx.x & 1)
		__syncthreads();
	else
		__syncthreads();
	y[threadIdx.x] = 1.0f;
}

// neighbour exchange through shared memory; `sync`: with the barrier it needs
__global__ void neighbour_kernel(float *y, int sync)
{
	__shared__ float s[64];
	s[threadIdx.x] = (float)threadIdx.x;
	if (sync)
		__syncthreads();
	y[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

__global__ void shuffle_kernel(float *y, int lanes)
{
	if ((int)threadIdx.x >= lanes)
		return;
	float v = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
	y[threadIdx.x] = v;
}

// block b writes y[b] = y[b - 1] + 1: correct only if blocks run in order
__global__ void chain_kernel(float *y)
{
	unsigned b = blockIdx.x;
	y[b] = b ? y[b - 1] + 1.0f : 0.0f;
}

__global__ void smem_kernel(float *y)
{
	BK_DYN_SMEM(float, s);
	s[threadIdx.x] = 1.0f;
	__syncthreads();
	y[threadIdx.x] = s[threadIdx.x];
}

// ---- the cases ----

static float *dev(size_t n)
{
	float *p;
	CUDA_CHECK(cudaMalloc(&p, n * sizeof(float)));
	return p;
}

static void oob_write(void) { BK_LAUNCH(fill_kernel, 1, 64, 0, 0, dev(60), 60, 1); }
static void in_bounds_write(void) { BK_LAUNCH(fill_kernel, 1, 64, 0, 0, dev(60), 60, 0); }
static void host_pointer_arg(void)
{
	static float host[64];
	BK_LAUNCH(fill_kernel, 1, 64, 0, 0, host, 64, 0);
}
static void freed_pointer_arg(void)
{
	float *p = dev(64);
	CUDA_CHECK(cudaFree(p));
	BK_LAUNCH(fill_kernel, 1, 64, 0, 0, p, 64, 0);
}
static void divergent_barrier(void) { BK_LAUNCH(half_barrier_kernel, 1, 32, 0, 0, dev(32)); }
static void different_barriers(void) { BK_LAUNCH(two_barriers_kernel, 1, 32, 0, 0, dev(32)); }
static void missing_lanes(void) { BK_LAUNCH(shuffle_kernel, 1, 32, 0, 0, dev(32), 20); }
static void all_lanes(void) { BK_LAUNCH(shuffle_kernel, 1, 32, 0, 0, dev(32), 32); }

// the neighbour exchange without its barrier: some thread reads a slot before its writer
static void check_neighbours(int sync)
{
	float *y = dev(64), h[64];
	BK_LAUNCH(neighbour_kernel, 1, 64, 0, 0, y, sync);
	CUDA_CHECK(cudaMemcpy(h, y, sizeof h, cudaMemcpyDeviceToHost));
	for (int i = 0; i < 64; i++)
		if (h[i] != (float)((i + 1) % 64))
			die("neighbour_kernel: thread %d read %g, not %d", i, h[i], (i + 1) % 64);
}
static void no_barrier(void) { check_neighbours(0); }
static void with_barrier(void) { check_neighbours(1); }

static void block_order(void)
{
	float *y = dev(64), h[64];
	BK_LAUNCH(chain_kernel, 64, 32, 0, 0, y);
	CUDA_CHECK(cudaMemcpy(h, y, sizeof h, cudaMemcpyDeviceToHost));
	for (int i = 0; i < 64; i++)
		if (h[i] != (float)i)
			die("chain_kernel: block %d holds %g (blocks ran out of order)", i, h[i]);
}

// an asynchronous copy into pinned memory read before the stream is synchronised
static void read_before_sync(int sync)
{
	float *y = dev(64), *h;
	CUDA_CHECK(cudaMemset(y, 0, 64 * sizeof(float)));
	CUDA_CHECK(cudaHostAlloc(&h, 64 * sizeof(float), cudaHostAllocDefault));
	cudaStream_t s;
	CUDA_CHECK(cudaStreamCreate(&s));
	CUDA_CHECK(cudaMemcpyAsync(h, y, 64 * sizeof(float), cudaMemcpyDeviceToHost, s));
	if (sync)
		CUDA_CHECK(cudaStreamSynchronize(s));
	if (h[0] != 0.0f)
		die("read before sync: the host sees %g, not the copied 0", h[0]);
}
static void async_no_sync(void) { read_before_sync(0); }
static void async_sync(void) { read_before_sync(1); }

static void sync_in_capture(void)
{
	cudaStream_t s;
	CUDA_CHECK(cudaStreamCreate(&s));
	CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	CUDA_CHECK(cudaStreamSynchronize(s));
}

// a captured launch re-run by the graph with its captured arguments, after the capture
// ran nothing
static void graph_replay(void)
{
	float *y = dev(64), h[64];
	CUDA_CHECK(cudaMemset(y, 0, 64 * sizeof(float)));
	cudaStream_t s;
	cudaGraph_t g;
	cudaGraphExec_t x;
	CUDA_CHECK(cudaStreamCreate(&s));
	CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
	BK_LAUNCH(fill_kernel, 1, 64, 0, s, y, 64, 0);
	CUDA_CHECK(cudaStreamEndCapture(s, &g));
	CUDA_CHECK(cudaMemcpy(h, y, sizeof h, cudaMemcpyDeviceToHost));
	if (h[5] != 0.0f)
		die("graph: the capture ran the kernel");
	CUDA_CHECK(cudaGraphInstantiate(&x, g, 0));
	CUDA_CHECK(cudaGraphLaunch(x, s));
	CUDA_CHECK(cudaStreamSynchronize(s));
	CUDA_CHECK(cudaMemcpy(h, y, sizeof h, cudaMemcpyDeviceToHost));
	if (h[5] != 1.0f)
		die("graph: the replay did not run the kernel");
}

static void smem_no_optin(void) { BK_LAUNCH(smem_kernel, 1, 64, 64 * 1024, 0, dev(64)); }
static void smem_optin(void)
{
	CUDA_CHECK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
					64 * 1024));
	BK_LAUNCH(smem_kernel, 1, 64, 64 * 1024, 0, dev(64));
}
static void smem_over_sm86(void)
{
	CUDA_CHECK(cudaFuncSetAttribute(smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
					100 * 1024));
}
static void too_many_threads(void) { BK_LAUNCH(fill_kernel, 1, 2048, 0, 0, dev(64), 64, 0); }

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	expect("a write one past an allocation is named", true,
	       asan ? "heap-buffer-overflow" : "fill_kernel wrote past the end", oob_write);
	expect("  the same kernel within bounds passes", false, "", in_bounds_write);
	expect("a host pointer as a kernel argument", true, "not in live device memory", host_pointer_arg);
	expect("a freed pointer as a kernel argument", true, "not in live device memory", freed_pointer_arg);
	expect("__syncthreads after half the block returned", true, "divergent barrier", divergent_barrier);
	expect("__syncthreads at two places", true, "different barriers", different_barriers);
	expect("a full-mask shuffle with 12 lanes gone", true, "lanes of its warp", missing_lanes);
	expect("  with every lane", false, "", all_lanes);
	expect("shared memory read without the barrier", true, "neighbour_kernel: thread", no_barrier);
	expect("  with the barrier", false, "", with_barrier);
	expect("a result that needs blocks in order", true, "blocks ran out of order", block_order);
	expect("a pinned async copy read before the sync", true, "read before sync", async_no_sync);
	expect("  read after the sync", false, "", async_sync);
	expect("a sync inside a graph capture", true, "cudaStreamSynchronize", sync_in_capture);
	expect("a graph records, then replays its launch", false, "", graph_replay);
	expect("64 KiB of dynamic shared memory without the opt-in", true, "smem_kernel", smem_no_optin);
	expect("  with the opt-in", false, "", smem_optin);
	expect("an opt-in beyond sm_86's 99 KiB", true, "cudaFuncSetAttribute", smem_over_sm86);
	expect("2048 threads in a block", true, "fill_kernel", too_many_threads);
	printf("# %d checks, %d failed\n", n_checks, n_failed);
	return n_failed ? 1 : 0;
}
