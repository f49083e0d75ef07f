// emu_runtime.cc - the emulated CUDA runtime of `make emu` (gpu/emu/emu.h says what is
// modelled): device memory, streams as deferred queues, events, graphs, launches run as
// fibers on the calling host thread, launch counting.  Not cuBLAS (emu_cublas.cc).
//
// Invariants:
//  - g_allocs maps the base of every live device allocation, pinned host allocation and
//    registered __constant__ symbol to its size and kind, and every range of a physical
//    allocation mapped with access (cuMemMap + cuMemSetAccess); nothing else is device
//    memory.
//  - An op in a stream queue runs only from emu_drain (a sync point), in issue order; a
//    capturing stream appends to its graph instead.
//  - One block runs at a time; within it each device thread is a fiber on its own stack,
//    switched only at barriers, warp collectives and its end (emu_sched).
#include "gpu/emu/emu.h"

#include <cuda.h> // the driver calls of the virtual memory management (below)

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define EMU_ASAN 1
#endif
#endif
#ifdef EMU_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

extern "C" {
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
}

thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// ---------------------------------------------------------------------------------
// errors

static thread_local cudaError_t g_last = cudaSuccess;
static cudaError_t fail(cudaError_t e)
{
	if (g_last == cudaSuccess)
		g_last = e;
	return e;
}

// one line on stderr naming what the emulation caught, then exit 1 like die()
void emu_fatal(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	die("cuda emulation: %s", buf);
}

const char *cudaGetErrorName(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "cudaSuccess";
	case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
	case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
	case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
	case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
	case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
	case cudaErrorNotReady: return "cudaErrorNotReady";
	case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
	case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
	case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
	case cudaErrorNoDevice: return "cudaErrorNoDevice";
	}
	return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
	switch (e) {
	case cudaSuccess: return "no error";
	case cudaErrorInvalidValue: return "invalid argument";
	case cudaErrorMemoryAllocation: return "out of memory";
	case cudaErrorInvalidConfiguration: return "invalid configuration argument";
	case cudaErrorInvalidDevicePointer: return "invalid device pointer";
	case cudaErrorInvalidResourceHandle: return "invalid resource handle";
	case cudaErrorNotReady: return "device not ready";
	case cudaErrorLaunchFailure: return "unspecified launch failure";
	case cudaErrorStreamCaptureUnsupported:
		return "operation not permitted when stream is capturing";
	case cudaErrorStreamCaptureInvalidated:
		return "operation failed due to a previous error during capture";
	case cudaErrorNoDevice: return "no CUDA-capable device is detected";
	}
	return "unknown error";
}

cudaError_t cudaGetLastError(void)
{
	cudaError_t e = g_last;
	g_last = cudaSuccess;
	return e;
}
cudaError_t cudaPeekAtLastError(void) { return g_last; }

// ---------------------------------------------------------------------------------
// memory

enum { MEM_DEVICE, MEM_PINNED, MEM_SYMBOL, MEM_MAPPED /* cuMemMap + cuMemSetAccess */ };
struct emu_alloc {
	size_t size;
	int kind;
};
static std::mutex g_mu; // guards everything below (host threads may call the runtime)
static std::map<uintptr_t, emu_alloc> g_allocs;
static size_t g_dev_used;

static size_t emu_device_total(void)
{
	static size_t total;
	if (!total) {
		const char *e = getenv("BK_EMU_DEVICE_MEMORY"); // bytes, or with a G/M suffix
		total = (size_t)4 << 30;
		if (e && *e) {
			char *end;
			double v = strtod(e, &end);
			if (*end == 'G' || *end == 'g')
				v *= 1 << 30;
			else if (*end == 'M' || *end == 'm')
				v *= 1 << 20;
			if (v < 1 << 20)
				emu_fatal("BK_EMU_DEVICE_MEMORY '%s' is below 1 MiB", e);
			total = (size_t)v;
		}
	}
	return total;
}

// the live allocation holding [p, p + n), or NULL
static const std::pair<const uintptr_t, emu_alloc> *find_range(const void *p, size_t n)
{
	uintptr_t a = (uintptr_t)p;
	auto it = g_allocs.upper_bound(a);
	if (it == g_allocs.begin())
		return NULL;
	--it;
	if (a < it->first || a - it->first > it->second.size || n > it->second.size - (a - it->first))
		return NULL;
	return &*it;
}

bool emu_ptr_ok(const void *p)
{
	if (!p)
		return true;
	std::lock_guard<std::mutex> lk(g_mu);
	return find_range(p, 0) != NULL;
}

// is [p, p + n) inside device memory (pinned host memory counts as device-accessible)?
static bool dev_range(const void *p, size_t n)
{
	std::lock_guard<std::mutex> lk(g_mu);
	return find_range(p, n) != NULL;
}
bool emu_dev_range(const void *p, size_t n) { return dev_range(p, n); }

static bool pinned_range(const void *p, size_t n)
{
	std::lock_guard<std::mutex> lk(g_mu);
	auto r = find_range(p, n);
	return r && r->second.kind == MEM_PINNED;
}

// Without ASan, GUARD bytes of 0xff follow each allocation (a read past the end gets a NaN
// or a -1; a write there is found by guard_ok after the kernel or GEMM that wrote it).
// Under ASan the size is exact: its redzone starts at byte `bytes`.
#ifdef EMU_ASAN
static const size_t GUARD = 0;
#else
static const size_t GUARD = 256;
#endif

static void *exact_alloc(size_t bytes)
{
	void *p = NULL;
	// 256-byte aligned as cudaMalloc; NaN-filled (all-ones bytes)
	if (posix_memalign(&p, 256, bytes + GUARD ? bytes + GUARD : 1))
		return NULL;
	memset(p, 0xff, bytes + GUARD ? bytes + GUARD : 1);
	return p;
}

// are the guard bytes after the allocation holding p intact?  (name the first changed one)
static bool guard_ok(const void *p, uintptr_t *base, size_t *size, size_t *at)
{
	if (!GUARD || !p)
		return true;
	std::lock_guard<std::mutex> lk(g_mu);
	auto r = find_range(p, 0);
	if (!r || r->second.kind == MEM_SYMBOL || r->second.kind == MEM_MAPPED)
		return true;
	const unsigned char *g = (const unsigned char *)r->first + r->second.size;
	for (size_t i = 0; i < GUARD; i++)
		if (g[i] != 0xff) {
			*base = r->first, *size = r->second.size, *at = i;
			return false;
		}
	return true;
}

void emu_guard_check(const void *p, const char *who)
{
	uintptr_t base;
	size_t size, at;
	if (!guard_ok(p, &base, &size, &at))
		emu_fatal("%s wrote past the end of the device allocation %p of %zu bytes (byte %zu "
			"after its end changed)",
			who, (void *)base, size, at);
}

static void register_alloc(void *p, size_t bytes, int kind)
{
	std::lock_guard<std::mutex> lk(g_mu);
	g_allocs[(uintptr_t)p] = {bytes, kind};
	if (kind == MEM_DEVICE)
		g_dev_used += bytes;
}

static bool unregister_alloc(void *p, int kind)
{
	std::lock_guard<std::mutex> lk(g_mu);
	auto it = g_allocs.find((uintptr_t)p);
	if (it == g_allocs.end() || it->second.kind != kind)
		return false;
	if (kind == MEM_DEVICE)
		g_dev_used -= it->second.size;
	memset(p, 0xff, it->second.size + (kind == MEM_SYMBOL ? 0 : GUARD)); // stale reads: NaN
	g_allocs.erase(it);
	return true;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
	*p = NULL;
	{
		std::lock_guard<std::mutex> lk(g_mu);
		if (bytes > emu_device_total() - g_dev_used)
			return fail(cudaErrorMemoryAllocation);
	}
	void *q = exact_alloc(bytes);
	if (!q)
		return fail(cudaErrorMemoryAllocation);
	register_alloc(q, bytes, MEM_DEVICE);
	*p = q;
	return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned)
{
	void *q = exact_alloc(bytes);
	if (!q)
		return fail(cudaErrorMemoryAllocation);
	register_alloc(q, bytes, MEM_PINNED);
	*p = q;
	return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

static void drain_all(void);
static bool any_capturing(void);

cudaError_t cudaFree(void *p)
{
	if (!p)
		return cudaSuccess;
	if (any_capturing())
		return fail(cudaErrorStreamCaptureUnsupported);
	drain_all(); // cudaFree waits for the device
	if (!unregister_alloc(p, MEM_DEVICE))
		return fail(cudaErrorInvalidValue);
	free(p);
	return cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
	if (!p)
		return cudaSuccess;
	drain_all();
	if (!unregister_alloc(p, MEM_PINNED))
		return fail(cudaErrorInvalidValue);
	free(p);
	return cudaSuccess;
}

cudaError_t emu_memcpy_to_symbol(void *sym, size_t sym_bytes, const void *src, size_t n, size_t off)
{
	if (off > sym_bytes || n > sym_bytes - off)
		return fail(cudaErrorInvalidValue);
	drain_all();
	{
		std::lock_guard<std::mutex> lk(g_mu);
		g_allocs[(uintptr_t)sym] = {sym_bytes, MEM_SYMBOL};
	}
	memcpy((char *)sym + off, src, n);
	return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total)
{
	std::lock_guard<std::mutex> lk(g_mu);
	*total = emu_device_total();
	*free_bytes = *total - g_dev_used;
	return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int *n)
{
	const char *e = getenv("BK_EMU_DEVICES");
	*n = e && *e ? atoi(e) : 1;
	if (*n <= 0) {
		*n = 0;
		return fail(cudaErrorNoDevice);
	}
	return cudaSuccess;
}
cudaError_t cudaSetDevice(int d)
{
	int n;
	cudaGetDeviceCount(&n);
	return d >= 0 && d < n ? cudaSuccess : fail(cudaErrorInvalidValue);
}
cudaError_t cudaGetDevice(int *d)
{
	*d = 0;
	return cudaSuccess;
}

// ---------------------------------------------------------------------------------
// the driver's virtual memory management (cuda.h): a physical allocation is a memfd (so
// an fd exported here and imported in another process is the same memory, as on a GPU),
// a reservation is PROT_NONE address space, a mapping is the memfd mmapped MAP_SHARED at
// a reserved address, and cuMemSetAccess makes the range device memory (MEM_MAPPED in
// g_allocs: no guard bytes, never NaN-filled on release: other processes see it).
// A mapping holds the memfd open by itself, as the driver's mapping holds its physical
// memory: a released handle, a closed fd or a killed exporter leave it intact.

struct emu_phys {
	int fd;
	size_t size;
	bool created;	 // by cuMemCreate here (an import is not a new allocation)
	bool exportable; // created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (or imported)
};
static std::map<CUmemGenericAllocationHandle, emu_phys> g_phys; // guarded by g_mu
static std::map<uintptr_t, size_t> g_reserved;			  // guarded by g_mu
static CUmemGenericAllocationHandle g_next_handle = 1;
static const size_t EMU_GRANULE = (size_t)2 << 20; // the real minimum: 2 MiB

CUresult cuInit(unsigned) { return CUDA_SUCCESS; }
CUresult cuCtxGetDevice(CUdevice *dev)
{
	*dev = 0;
	return CUDA_SUCCESS;
}

// BK_EMU_NO_VMM=1: a device without virtual memory management (the fallback's test)
CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute attr, CUdevice dev)
{
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	const char *e = getenv("BK_EMU_NO_VMM");
	int vmm = !(e && *e && strcmp(e, "0"));
	if (attr == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ||
	    attr == CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) {
		*v = vmm;
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	memcpy(uuid->bytes, "bakery-emu-gpu-0", 16);
	return CUDA_SUCCESS;
}

static bool prop_ok(const CUmemAllocationProp *p)
{
	return p && p->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
	       p->location.type == CU_MEM_LOCATION_TYPE_DEVICE && p->location.id == 0;
}

CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
				       CUmemAllocationGranularity_flags)
{
	if (!prop_ok(prop))
		return CUDA_ERROR_INVALID_VALUE;
	*g = EMU_GRANULE;
	return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
		     unsigned long long flags)
{
	if (!prop_ok(prop) || flags || !size || size % EMU_GRANULE ||
	    (prop->requestedHandleTypes & ~CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
		return CUDA_ERROR_INVALID_VALUE;
	{
		std::lock_guard<std::mutex> lk(g_mu);
		if (size > emu_device_total() - g_dev_used)
			return CUDA_ERROR_OUT_OF_MEMORY;
	}
	int fd = memfd_create("bk-emu-phys", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)size)) {
		if (fd >= 0)
			close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	// contents undefined: all-ones bytes (NaN floats), as cudaMalloc's
	static const std::vector<unsigned char> ones(1 << 20, 0xff);
	for (size_t off = 0; off < size; off += ones.size())
		if (pwrite(fd, ones.data(), std::min(ones.size(), size - off), (off_t)off) < 0) {
			close(fd);
			return CUDA_ERROR_OUT_OF_MEMORY;
		}
	std::lock_guard<std::mutex> lk(g_mu);
	g_dev_used += size;
	*h = g_next_handle++;
	// exportable only when asked for at creation, as with the driver
	g_phys[*h] = {fd, size, true,
		      (prop->requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0};
	return CUDA_SUCCESS;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	std::lock_guard<std::mutex> lk(g_mu);
	auto it = g_phys.find(h);
	if (it == g_phys.end())
		return CUDA_ERROR_INVALID_VALUE;
	close(it->second.fd);
	if (it->second.created)
		g_dev_used -= it->second.size;
	g_phys.erase(it);
	return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle h,
				      CUmemAllocationHandleType type, unsigned long long flags)
{
	std::lock_guard<std::mutex> lk(g_mu);
	auto it = g_phys.find(h);
	if (it == g_phys.end() || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags ||
	    !it->second.exportable)
		return CUDA_ERROR_INVALID_VALUE;
	int fd = fcntl(it->second.fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*(int *)shareable = fd;
	return CUDA_SUCCESS;
}

// the caller keeps its fd (as with the driver: the import does not take it)
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os_handle,
					CUmemAllocationHandleType type)
{
	int src = (int)(intptr_t)os_handle;
	struct stat sb;
	if (type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || fstat(src, &sb) || sb.st_size <= 0 ||
	    (size_t)sb.st_size % EMU_GRANULE)
		return CUDA_ERROR_INVALID_VALUE;
	int fd = fcntl(src, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	std::lock_guard<std::mutex> lk(g_mu);
	*h = g_next_handle++;
	g_phys[*h] = {fd, (size_t)sb.st_size, false, true};
	return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
			     unsigned long long flags)
{
	if (!size || size % EMU_GRANULE || addr || flags || (alignment & (alignment - 1)))
		return CUDA_ERROR_INVALID_VALUE;
	size_t al = alignment > EMU_GRANULE ? alignment : EMU_GRANULE;
	char *p = (char *)mmap(NULL, size + al, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
			       -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	uintptr_t a = ((uintptr_t)p + al - 1) & ~(uintptr_t)(al - 1);
	if (a > (uintptr_t)p)
		munmap(p, a - (uintptr_t)p);
	if ((uintptr_t)p + size + al > a + size)
		munmap((void *)(a + size), (uintptr_t)p + size + al - (a + size));
	std::lock_guard<std::mutex> lk(g_mu);
	g_reserved[a] = size;
	*ptr = (CUdeviceptr)a;
	return CUDA_SUCCESS;
}

// is [p, p + n) inside one reservation?
static bool reserved_range(uintptr_t p, size_t n)
{
	auto it = g_reserved.upper_bound(p);
	if (it == g_reserved.begin())
		return false;
	--it;
	return p >= it->first && p - it->first <= it->second && n <= it->second - (p - it->first);
}

// does [p, p + n) overlap a range made device memory by cuMemSetAccess?
static bool any_mapped(uintptr_t p, size_t n)
{
	for (auto &a : g_allocs)
		if (a.second.kind == MEM_MAPPED && a.first < p + n && p < a.first + a.second.size)
			return true;
	return false;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	drain_all();
	std::lock_guard<std::mutex> lk(g_mu);
	auto it = g_reserved.find((uintptr_t)ptr);
	if (it == g_reserved.end() || it->second != size || any_mapped((uintptr_t)ptr, size))
		return CUDA_ERROR_INVALID_VALUE;
	munmap((void *)ptr, size);
	g_reserved.erase(it);
	return CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
		  unsigned long long flags)
{
	std::lock_guard<std::mutex> lk(g_mu);
	auto it = g_phys.find(h);
	if (it == g_phys.end() || flags || !size || size % EMU_GRANULE || offset % EMU_GRANULE ||
	    offset > it->second.size || size > it->second.size - offset ||
	    !reserved_range((uintptr_t)ptr, size))
		return CUDA_ERROR_INVALID_VALUE;
	// mapped without access: as on a GPU, a touch before cuMemSetAccess faults
	void *q = mmap((void *)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, it->second.fd,
		       (off_t)offset);
	return q == MAP_FAILED ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
	if (count != 1 || desc->location.type != CU_MEM_LOCATION_TYPE_DEVICE || desc->location.id ||
	    (desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
	     desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE))
		return CUDA_ERROR_INVALID_VALUE;
	std::lock_guard<std::mutex> lk(g_mu);
	if (!reserved_range((uintptr_t)ptr, size) || any_mapped((uintptr_t)ptr, size))
		return CUDA_ERROR_INVALID_VALUE;
	int prot = desc->flags == CU_MEM_ACCESS_FLAGS_PROT_READ ? PROT_READ : PROT_READ | PROT_WRITE;
	if (mprotect((void *)ptr, size, prot))
		return CUDA_ERROR_INVALID_VALUE;
	g_allocs[(uintptr_t)ptr] = {size, MEM_MAPPED};
	return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	drain_all(); // the device may still read it
	std::lock_guard<std::mutex> lk(g_mu);
	if (!reserved_range((uintptr_t)ptr, size))
		return CUDA_ERROR_INVALID_VALUE;
	auto it = g_allocs.find((uintptr_t)ptr);
	if (it != g_allocs.end() && it->second.kind == MEM_MAPPED) {
		if (it->second.size != size)
			return CUDA_ERROR_INVALID_VALUE;
		g_allocs.erase(it);
	}
	// back to reserved address space (no memset: the memory is other processes' too)
	void *q = mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED |
			MAP_NORESERVE, -1, 0);
	return q == MAP_FAILED ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn, unsigned int,
					     unsigned long long,
					     enum cudaDriverEntryPointQueryResult *status)
{
	static const std::map<std::string, void *> table = {
		{"cuInit", (void *)cuInit},
		{"cuCtxGetDevice", (void *)cuCtxGetDevice},
		{"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
		{"cuDeviceGetUuid", (void *)cuDeviceGetUuid},
		{"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
		{"cuMemCreate", (void *)cuMemCreate},
		{"cuMemRelease", (void *)cuMemRelease},
		{"cuMemExportToShareableHandle", (void *)cuMemExportToShareableHandle},
		{"cuMemImportFromShareableHandle", (void *)cuMemImportFromShareableHandle},
		{"cuMemAddressReserve", (void *)cuMemAddressReserve},
		{"cuMemAddressFree", (void *)cuMemAddressFree},
		{"cuMemMap", (void *)cuMemMap},
		{"cuMemUnmap", (void *)cuMemUnmap},
		{"cuMemSetAccess", (void *)cuMemSetAccess},
	};
	auto it = table.find(symbol ? symbol : "");
	*fn = it == table.end() ? NULL : it->second;
	if (status)
		*status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
	return cudaSuccess;
}

// ---------------------------------------------------------------------------------
// streams, events, graphs

struct emu_op {
	std::function<void()> run;
	std::string what; // for messages
};
struct emu_graph {
	std::vector<emu_op> ops;
	bool invalid = false;
	bool exec = false; // an instantiated graph (cudaGraphExec_t)
};
struct emu_stream {
	std::deque<emu_op> q;
	emu_graph *capture = NULL; // capturing into this graph
	bool queried = false;	   // cudaStreamQuery's "not ready" once per batch of work
};
struct emu_event {
	bool recorded = false, done = false;
	emu_stream *stream = NULL;
	double t_ms = 0;
};

static emu_stream g_legacy; // stream 0
static std::vector<emu_stream *> g_streams = {&g_legacy};
static std::recursive_mutex g_run_mu; // one drain at a time

static emu_stream *S(cudaStream_t s) { return s ? s : &g_legacy; }

static bool any_capturing(void)
{
	for (emu_stream *s : g_streams)
		if (s->capture)
			return true;
	return false;
}

// queue op on s (or record it into s's capture)
static void issue(emu_stream *s, std::function<void()> run, std::string what)
{
	if (s->capture)
		s->capture->ops.push_back({std::move(run), std::move(what)});
	else
		s->q.push_back({std::move(run), std::move(what)});
	s->queried = false;
}

void emu_issue(cudaStream_t s, std::function<void()> run, const char *what)
{
	issue(S(s), std::move(run), what);
}

static void drain(emu_stream *s)
{
	std::lock_guard<std::recursive_mutex> lk(g_run_mu);
	while (!s->q.empty()) {
		emu_op op = std::move(s->q.front());
		s->q.pop_front();
		op.run();
	}
}

static void drain_all(void)
{
	for (size_t i = 0; i < g_streams.size(); i++)
		drain(g_streams[i]);
}

// a synchronising call while any stream captures invalidates the capture
static cudaError_t sync_during_capture(const char *call)
{
	for (emu_stream *s : g_streams)
		if (s->capture) {
			s->capture->invalid = true;
			if (getenv("BK_EMU_VERBOSE"))
				fprintf(stderr, "cuda emulation: %s during a graph capture\n", call);
			return fail(cudaErrorStreamCaptureUnsupported);
		}
	return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s)
{
	*s = new emu_stream;
	std::lock_guard<std::mutex> lk(g_mu);
	g_streams.push_back(*s);
	return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
	if (!s)
		return fail(cudaErrorInvalidResourceHandle);
	drain(s);
	std::lock_guard<std::mutex> lk(g_mu);
	g_streams.erase(std::find(g_streams.begin(), g_streams.end(), s));
	delete s;
	return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
	if (S(s)->capture)
		return sync_during_capture("cudaStreamSynchronize");
	if (!s) // the legacy stream waits for every blocking stream
		drain_all();
	else
		drain(s);
	return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
	if (any_capturing())
		return sync_during_capture("cudaDeviceSynchronize");
	drain_all();
	return cudaSuccess;
}

// not ready once after new work, then done: a poll loop sees both answers
cudaError_t cudaStreamQuery(cudaStream_t s)
{
	emu_stream *st = S(s);
	if (st->capture)
		return sync_during_capture("cudaStreamQuery");
	if (!st->q.empty() && !st->queried) {
		st->queried = true;
		return cudaErrorNotReady;
	}
	drain(st);
	return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void *arg)
{
	issue(S(s), [fn, arg]() { fn(arg); }, "cudaLaunchHostFunc");
	return cudaSuccess;
}

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

cudaError_t cudaEventCreate(cudaEvent_t *e)
{
	*e = new emu_event;
	return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
	delete e;
	return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
	if (!e)
		return fail(cudaErrorInvalidResourceHandle);
	e->recorded = true;
	e->done = false;
	e->stream = S(s);
	issue(S(s), [e] { e->done = true, e->t_ms = now_ms(); }, "cudaEventRecord");
	return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	if (!e || !e->recorded)
		return fail(cudaErrorInvalidResourceHandle);
	if (any_capturing())
		return sync_during_capture("cudaEventSynchronize");
	drain(e->stream);
	return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b)
{
	if (!a || !b || !a->done || !b->done)
		return fail(cudaErrorNotReady);
	*ms = (float)(b->t_ms - a->t_ms);
	return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned)
{
	if (!e)
		return fail(cudaErrorInvalidResourceHandle);
	emu_stream *src = e->stream;
	if (src && src != S(s))
		issue(S(s), [src] { drain(src); }, "cudaStreamWaitEvent");
	return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode)
{
	emu_stream *st = S(s);
	if (!s || st->capture) // the legacy stream cannot capture
		return fail(cudaErrorInvalidValue);
	drain(st); // work issued before the capture is not part of it
	st->capture = new emu_graph;
	return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
	emu_stream *st = S(s);
	if (!st->capture)
		return fail(cudaErrorInvalidValue);
	emu_graph *gr = st->capture;
	st->capture = NULL;
	if (gr->invalid) {
		delete gr;
		*g = NULL;
		return fail(cudaErrorStreamCaptureInvalidated);
	}
	*g = gr;
	return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long)
{
	if (!g || g->exec)
		return fail(cudaErrorInvalidValue);
	emu_graph *e = new emu_graph;
	e->ops = g->ops; // the recorded operations with their arguments
	e->exec = true;
	*x = e;
	return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s)
{
	if (!x || !x->exec)
		return fail(cudaErrorInvalidValue);
	for (const emu_op &op : x->ops)
		issue(S(s), op.run, op.what);
	return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
	if (!g || g->exec)
		return fail(cudaErrorInvalidValue);
	delete g;
	return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x)
{
	if (!x || !x->exec)
		return fail(cudaErrorInvalidValue);
	drain_all(); // a launched graph may still be queued
	delete x;
	return cudaSuccess;
}

// ---------------------------------------------------------------------------------
// copies

static const char *kind_name(cudaMemcpyKind k)
{
	static const char *n[] = {"host to host", "host to device", "device to host",
				  "device to device", "default"};
	return (unsigned)k < 5 ? n[k] : "?";
}

// the device side(s) of a copy must be live device memory for the whole range
static cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
			      const char *call)
{
	bool dd = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
	bool sd = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
	if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost || (unsigned)kind > 4)
		emu_fatal("%s: kind %s is not used by bakery", call, kind_name(kind));
	if ((dd && !dev_range(dst, n)) || (sd && !dev_range(src, n)))
		emu_fatal("%s (%s) of %zu bytes: %s %p is not inside a live device allocation",
			call, kind_name(kind), n, dd && !dev_range(dst, n) ? "dst" : "src",
			dd && !dev_range(dst, n) ? dst : src);
	return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind kind)
{
	if (any_capturing())
		return sync_during_capture("cudaMemcpy");
	check_copy(dst, src, n, kind, "cudaMemcpy");
	drain_all();
	if (n)
		memmove(dst, src, n);
	return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind,
			    cudaStream_t s)
{
	emu_stream *st = S(s);
	check_copy(dst, src, n, kind, "cudaMemcpyAsync");
	if (!n)
		return cudaSuccess;
	if (kind == cudaMemcpyDeviceToDevice) {
		issue(st, [=] { memmove(dst, src, n); }, "cudaMemcpyAsync D2D");
		return cudaSuccess;
	}
	if (kind == cudaMemcpyHostToDevice) {
		if (pinned_range(src, n)) { // read when it runs: the host must not touch src
			issue(st, [=] { memcpy(dst, src, n); }, "cudaMemcpyAsync H2D");
			return cudaSuccess;
		}
		if (st->capture) // a capture may not hold a pageable copy
			return sync_during_capture("cudaMemcpyAsync from pageable host memory");
		// pageable: staged at the call, so the caller may reuse src at once
		auto stage = std::make_shared<std::vector<unsigned char>>(
			(const unsigned char *)src, (const unsigned char *)src + n);
		issue(st, [=] { memcpy(dst, stage->data(), n); }, "cudaMemcpyAsync H2D");
		return cudaSuccess;
	}
	// device to host
	if (pinned_range(dst, n)) {
		if (!st->capture)
			memset(dst, 0xff, n); // read before the sync: NaN, not stale data
		issue(st, [=] { memcpy(dst, src, n); }, "cudaMemcpyAsync D2H");
		return cudaSuccess;
	}
	if (st->capture)
		return sync_during_capture("cudaMemcpyAsync to pageable host memory");
	// pageable: returns when the copy is done
	issue(st, [=] { memcpy(dst, src, n); }, "cudaMemcpyAsync D2H");
	drain(st);
	return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
	if (!dev_range(dst, n))
		emu_fatal("cudaMemsetAsync of %zu bytes: %p is not inside a live device allocation",
			n, dst);
	if (n)
		issue(S(s), [=] { memset(dst, v, n); }, "cudaMemsetAsync");
	return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int v, size_t n)
{
	if (any_capturing())
		return sync_during_capture("cudaMemset");
	cudaMemsetAsync(dst, v, n, 0);
	drain_all();
	return cudaSuccess;
}

// ---------------------------------------------------------------------------------
// fibers: x86-64 System V, the callee-saved registers.  Not MXCSR nor the x87 control
// word: saving and loading them was 85 % of a switch (fldcw serialises), and every
// fiber runs on the one host thread with its floating-point environment, which no
// kernel changes (run_grid checks that after each block)

extern "C" void emu_ctx_switch(void **save_sp, void *load_sp);
extern "C" void emu_fiber_start(void);
asm(R"(
	.text
	.globl emu_ctx_switch
	.type emu_ctx_switch,@function
emu_ctx_switch:
	pushq %rbp
	pushq %rbx
	pushq %r12
	pushq %r13
	pushq %r14
	pushq %r15
	movq %rsp, (%rdi)
	movq %rsi, %rsp
	popq %r15
	popq %r14
	popq %r13
	popq %r12
	popq %rbx
	popq %rbp
	ret
	.size emu_ctx_switch, .-emu_ctx_switch

	.globl emu_fiber_start
	.type emu_fiber_start,@function
emu_fiber_start:
	subq $8, %rsp
	movq %r12, %rdi
	callq *%r13
	ud2
	.size emu_fiber_start, .-emu_fiber_start
	.section .note.GNU-stack,"",@progbits
	.text
)");

enum { F_RUN, F_BAR, F_WARP, F_DONE };
struct emu_fiber {
	void *sp = NULL;
	char *stack = NULL;
	size_t size = 0;
	int state = F_DONE;
	dim3 tid;
	unsigned flat = 0;
	const char *file = NULL; // where it waits
	int line = 0;
	const char *what = NULL;
	void *fake = NULL; // ASan's fake stack while switched out
};

#ifdef EMU_ASAN
static const size_t FIBER_STACK = (size_t)1 << 20;
#else
static const size_t FIBER_STACK = (size_t)256 << 10;
#endif

// warp collective state: lanes deposit into buf[parity], the last arriving lane releases
struct emu_warp {
	unsigned arrived = 0; // lane bits
	unsigned mask = 0;
	unsigned gen = 0;
	const char *what = NULL;
	unsigned char buf[2][32][EMU_SLOT];
};

struct emu_block_run {
	const emu_launch_desc *d;
	const std::function<void()> *body;
	std::vector<emu_fiber> *f;
	std::vector<unsigned> order;
	std::vector<emu_warp> warps;
	unsigned nthreads;
	int cur = -1;	   // the running fiber
	unsigned pos = 0; // its place in order
	void *sched_sp = NULL;
	unsigned waiting_bar = 0, done = 0;
	int bar_or = 0;
};
static emu_block_run *g_blk;	 // the block being run
static std::vector<emu_fiber> g_fibers; // stacks reused across blocks and launches
static unsigned char *g_smem;		 // the block's dynamic shared memory

void *emu_dyn_smem(void) { return g_smem; }

#ifdef EMU_ASAN
// stack bounds of the scheduler (the host thread's stack), for ASan's fiber switches
static thread_local const void *g_sched_stack_bottom;
static thread_local size_t g_sched_stack_size;
#endif

// switches from the running fiber `me` (or the scheduler, me == NULL) to fiber i
static void switch_to_fiber(emu_block_run *b, emu_fiber *me, int final_switch, unsigned k)
{
	emu_fiber &f = (*b->f)[b->order[k]];
	b->pos = k;
	b->cur = (int)b->order[k];
	threadIdx = f.tid;
#ifdef EMU_ASAN
	void *fake = NULL;
	__sanitizer_start_switch_fiber(final_switch ? NULL : me ? &me->fake : &fake, f.stack,
				       f.size);
	emu_ctx_switch(me ? &me->sp : &b->sched_sp, f.sp);
	if (me)
		__sanitizer_finish_switch_fiber(me->fake, NULL, NULL);
	else
		__sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
	(void)final_switch;
	emu_ctx_switch(me ? &me->sp : &b->sched_sp, f.sp);
#endif
}

// the running fiber stops (at a barrier, a warp collective or its end): the pass goes on
// with the next fiber in the block's shuffled order that can run, straight from this one
// (one context switch, not two through the scheduler); at the end of the pass the
// scheduler takes over (barrier release, deadlock checks, the next pass)
static void yield_fiber(int final_switch)
{
	emu_block_run *b = g_blk;
	emu_fiber *me = &(*b->f)[b->cur];
	for (unsigned k = b->pos + 1; k < b->nthreads; k++)
		if ((*b->f)[b->order[k]].state == F_RUN) {
			switch_to_fiber(b, me, final_switch, k);
			return;
		}
	b->cur = -1;
#ifdef EMU_ASAN
	__sanitizer_start_switch_fiber(final_switch ? NULL : &me->fake, g_sched_stack_bottom,
				       g_sched_stack_size);
#endif
	emu_ctx_switch(&me->sp, b->sched_sp);
#ifdef EMU_ASAN
	__sanitizer_finish_switch_fiber(me->fake, NULL, NULL);
#endif
}

static void fiber_main(void *)
{
#ifdef EMU_ASAN
	// the first fiber of a launch starts from the scheduler: its stack bounds are kept
	// (the host thread's stack; the same for every launch); a switch from another fiber
	// reports that fiber's stack, which is not wanted
	if (!g_sched_stack_bottom)
		__sanitizer_finish_switch_fiber(NULL, &g_sched_stack_bottom, &g_sched_stack_size);
	else
		__sanitizer_finish_switch_fiber(NULL, NULL, NULL);
#endif
	(*g_blk->body)();
	emu_fiber &me = (*g_blk->f)[g_blk->cur];
	me.state = F_DONE;
	g_blk->done++;
	yield_fiber(1);
	__builtin_unreachable();
}

// a fresh thread on fiber f (the idx-th): its stack top is offset by idx cache lines
// within a page, so the tops of the block's stacks (all at the same offset in their
// pages otherwise) do not compete for one L1 set at every switch
static void fiber_init(emu_fiber &f, unsigned idx)
{
	if (!f.stack) {
		size_t page = (size_t)sysconf(_SC_PAGESIZE);
		void *m = mmap(NULL, FIBER_STACK + page, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (m == MAP_FAILED)
			emu_fatal("mmap of a fiber stack failed: %s", strerror(errno));
		mprotect(m, page, PROT_NONE); // guard page below the stack
		f.stack = (char *)m + page;
		f.size = FIBER_STACK;
	}
#ifdef EMU_ASAN
	// the redzones a previous thread left poisoned: only the frames still live at its
	// last switch (fiber_main's and the switch's own; every deeper frame returned and
	// cleared its shadow), not the whole stack (clearing 1 MiB of stack per thread was
	// 84 % of an emulated run under ASan)
	if (f.sp) {
		char *lo = (char *)f.sp - 4096;
		if (lo < f.stack)
			lo = f.stack;
		ASAN_UNPOISON_MEMORY_REGION(lo, (size_t)(f.stack + f.size - lo));
	}
#endif
	uintptr_t top = ((uintptr_t)f.stack + f.size - (idx % 64) * 64) & ~(uintptr_t)15;
	uint64_t *sp = (uint64_t *)top;
	*--sp = 0;			     // (alignment: the return slot below is 16-aligned)
	*--sp = (uint64_t)emu_fiber_start;    // ret target
	*--sp = 0;			     // rbp
	*--sp = 0;			     // rbx
	*--sp = (uint64_t)NULL;		     // r12: argument
	*--sp = (uint64_t)(void *)fiber_main; // r13: function
	*--sp = 0;			     // r14
	*--sp = 0;			     // r15
	f.sp = sp;
	f.state = F_RUN;
	f.fake = NULL;
}

static std::string site(const char *file, int line)
{
	const char *p = file ? strstr(file, "gpu/") : NULL;
	return std::string(p ? p : file ? file : "?") + ":" + std::to_string(line);
}

[[noreturn]] static void block_error(emu_block_run *b, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void block_error(emu_block_run *b, const char *fmt, ...)
{
	char buf[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	emu_fatal("kernel %s (launched at %s) block (%u,%u,%u): %s", b->d->name,
		site(b->d->file, b->d->line).c_str(), blockIdx.x, blockIdx.y, blockIdx.z, buf);
}

void emu_syncthreads(const char *file, int line)
{
	emu_block_run *b = g_blk;
	if (!b || b->cur < 0)
		emu_fatal("__syncthreads outside a kernel at %s", site(file, line).c_str());
	emu_fiber &me = (*b->f)[b->cur];
	me.state = F_BAR;
	me.file = file;
	me.line = line;
	b->waiting_bar++;
	yield_fiber(0);
}

int emu_syncthreads_or(int v, const char *file, int line)
{
	emu_block_run *b = g_blk;
	if (v)
		b->bar_or = 1;
	emu_syncthreads(file, line);
	int r = b->bar_or;
	emu_syncthreads(file, line); // everyone has read it before it is cleared
	if (g_blk->cur >= 0 && (*b->f)[b->cur].flat == b->order[0])
		b->bar_or = 0;
	emu_syncthreads(file, line);
	return r;
}

const unsigned char *emu_warp_exchange(unsigned mask, const void *in, size_t bytes,
				       const char *what)
{
	emu_block_run *b = g_blk;
	if (!b || b->cur < 0)
		emu_fatal("%s outside a kernel", what);
	if (bytes > EMU_SLOT)
		emu_fatal("%s of %zu bytes per lane", what, bytes);
	emu_fiber &me = (*b->f)[b->cur];
	unsigned lane = me.flat % 32, w = me.flat / 32;
	emu_warp &W = b->warps[w];
	if (!(mask >> lane & 1))
		block_error(b, "%s with mask %#x called by lane %u outside the mask", what, mask,
			    lane);
	if (W.arrived && (W.mask != mask || (W.what != what && strcmp(W.what, what) != 0)))
		block_error(b,
			    "warp %u: lane %u at %s (mask %#x) while other lanes wait at %s "
			    "(mask %#x): divergent warp collectives",
			    w, lane, what, mask, W.what, W.mask);
	// two buffers by parity: a lane cannot be two collectives ahead of a lane still
	// reading, since the next one needs that lane too
	unsigned par = W.gen & 1;
	switch (bytes) { // the common sizes as fixed copies, not a call to memcpy
	case 4: memcpy(W.buf[par][lane], in, 4); break;
	case 8: memcpy(W.buf[par][lane], in, 8); break;
	default: memcpy(W.buf[par][lane], in, bytes);
	}
	W.arrived |= 1u << lane;
	W.mask = mask;
	W.what = what;
	if (W.arrived == mask) { // the last lane: release the others
		W.arrived = 0;
		W.gen++;
		for (unsigned l = 0; l < 32; l++)
			if (mask >> l & 1 && l != lane)
				(*b->f)[w * 32 + l].state = F_RUN;
	} else {
		me.state = F_WARP;
		me.what = what;
		yield_fiber(0);
	}
	return &W.buf[par][0][0];
}

struct emu_frag {
	uint32_t a[4], b[2];
};

void emu_mma_m16n8k16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
	emu_frag in = {{a[0], a[1], a[2], a[3]}, {b0, b1}}, F[32];
	const unsigned char *all = emu_warp_exchange(0xffffffffu, &in, sizeof in, "mma.sync m16n8k16");
	for (int l = 0; l < 32; l++)
		memcpy(&F[l], all + l * EMU_SLOT, sizeof in);
	unsigned lane = emu_lane(), g = lane / 4, t = lane % 4;
	float out[4];
	for (int e = 0; e < 4; e++) {
		unsigned row = g + 8 * (e >> 1), col = 2 * t + (e & 1);
		float acc = 0.0f;
		for (unsigned kk = 0; kk < 16; kk++) {
			uint32_t ar = F[(row % 8) * 4 + (kk % 8) / 2].a[(row / 8) + 2 * (kk / 8)];
			uint32_t br = F[col * 4 + (kk % 8) / 2].b[kk / 8];
			float av = emu_bf16_bits_to_f32((uint16_t)(ar >> (16 * (kk % 2))));
			float bv = emu_bf16_bits_to_f32((uint16_t)(br >> (16 * (kk % 2))));
			acc += av * bv;
		}
		out[e] = c[e] + acc;
	}
	for (int e = 0; e < 4; e++)
		c[e] = out[e];
}

void emu_ldmatrix_x2_trans(uint32_t &r0, uint32_t &r1, const void *row)
{
	const uint16_t *rows[32];
	const uint16_t *mine = (const uint16_t *)row;
	const unsigned char *all = emu_warp_exchange(0xffffffffu, &mine, sizeof mine, "ldmatrix.x2.trans");
	for (int l = 0; l < 32; l++)
		memcpy(&rows[l], all + l * EMU_SLOT, sizeof mine);
	unsigned lane = emu_lane(), g = lane / 4, t = lane % 4;
	uint32_t r[2];
	for (unsigned m = 0; m < 2; m++) {
		uint32_t lo = rows[8 * m + 2 * t][g], hi = rows[8 * m + 2 * t + 1][g];
		r[m] = lo | hi << 16;
	}
	r0 = r[0], r1 = r[1];
}

[[noreturn]] void emu_trap(const char *file, int line)
{
	if (g_blk)
		block_error(g_blk, "__trap() at %s", site(file, line).c_str());
	emu_fatal("__trap() at %s", site(file, line).c_str());
}

// ---------------------------------------------------------------------------------
// launches

// the sm_86 (RTX 3090) limits: the smallest opt-in of the targets we build for
static const size_t SMEM_DEFAULT = 48 * 1024, SMEM_OPTIN_MAX = 99 * 1024;
static std::map<const void *, int> g_optin; // kernel -> its max dynamic shared memory
struct emu_count {
	unsigned long launches = 0;
	size_t max_threads = 0, max_smem = 0; // the largest block and dynamic shared memory
};
static std::map<std::string, emu_count> g_counts;
static uint64_t g_launch_seq;

cudaError_t emu_func_set_attribute(const void *fn, const char *, int attr, int value)
{
	if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
		return fail(cudaErrorInvalidValue);
	if (value < 0 || (size_t)value > SMEM_OPTIN_MAX)
		return fail(cudaErrorInvalidValue);
	std::lock_guard<std::mutex> lk(g_mu);
	g_optin[fn] = value;
	return cudaSuccess;
}

// "gen_linear_kernel<4>" -> "gen_linear_kernel"
static std::string base_name(const char *n)
{
	std::string s(n);
	size_t lt = s.find('<');
	if (lt != std::string::npos)
		s.resize(lt);
	while (!s.empty() && (s.back() == ' ' || s.back() == ')'))
		s.pop_back();
	size_t st = s.find_first_not_of("( ");
	return st == std::string::npos ? s : s.substr(st);
}

static void write_counts(void)
{
	const char *path = getenv("BK_EMU_KERNEL_LOG");
	if (!path || !*path || g_counts.empty())
		return;
	std::string out;
	for (auto &c : g_counts)
		out += c.first + " " + std::to_string(c.second.launches) + " " +
		       std::to_string(c.second.max_threads) + " " + std::to_string(c.second.max_smem) +
		       "\n";
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd < 0)
		return;
	if (write(fd, out.data(), out.size()) != (ssize_t)out.size())
		fprintf(stderr, "cuda emulation: short write to %s\n", path);
	close(fd);
}

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static void shuffle(std::vector<unsigned> &v, uint64_t key)
{
	for (size_t i = v.size(); i > 1; i--) {
		size_t j = mix64(key ^ (i * 0x100000001b3ULL)) % i;
		std::swap(v[i - 1], v[j]);
	}
}

static uint64_t emu_seed(void)
{
	static uint64_t seed = 0;
	static bool read = false;
	if (!read) {
		const char *e = getenv("BK_EMU_SEED");
		seed = e && *e ? strtoull(e, NULL, 0) : 1;
		read = true;
	}
	return seed;
}

// the floating-point controls the fibers share: MXCSR's (rounding, DAZ/FTZ, masks) and
// the x87 control word
static uint64_t fp_env(void)
{
	uint32_t mx;
	uint16_t cw;
	__asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mx), "=m"(cw));
	return (uint64_t)(mx & ~0x3fu) << 16 | cw; // not MXCSR's sticky exception flags
}

// runs every block of a launch, in a shuffled order, each with its threads as fibers
static void run_grid(const emu_launch_desc &d, const std::function<void()> &body,
		     uint64_t key)
{
	unsigned nt = d.block.x * d.block.y * d.block.z;
	size_t nb = (size_t)d.grid.x * d.grid.y * d.grid.z;
	if (g_fibers.size() < nt)
		g_fibers.resize(nt);
	std::vector<unsigned> blocks(nb);
	for (size_t i = 0; i < nb; i++)
		blocks[i] = (unsigned)i;
	shuffle(blocks, mix64(key));
	gridDim = d.grid;
	blockDim = d.block;
	const uint64_t env = fp_env();
	emu_block_run br; // reused by every block of the launch
	br.d = &d;
	br.body = &body;
	br.f = &g_fibers;
	br.nthreads = nt;
	br.order.resize(nt);
	br.warps.resize((nt + 31) / 32);
	for (size_t bi = 0; bi < nb; bi++) {
		unsigned b = blocks[bi];
		blockIdx = dim3(b % d.grid.x, b / d.grid.x % d.grid.y, b / (d.grid.x * d.grid.y));
		// dynamic shared memory: exact size (ASan sees an overflow), NaN-filled
		unsigned char *sm = NULL;
		if (d.smem) {
			void *p = NULL;
			if (posix_memalign(&p, 16, d.smem))
				emu_fatal("out of memory for %zu bytes of shared memory", d.smem);
			memset(p, 0xff, d.smem);
			sm = (unsigned char *)p;
		}
		g_smem = sm;
		br.cur = -1;
		br.waiting_bar = br.done = 0;
		br.bar_or = 0;
		for (unsigned i = 0; i < nt; i++)
			br.order[i] = i;
		shuffle(br.order, mix64(key ^ (0xb10c0000ULL + b)));
		for (emu_warp &w : br.warps)
			w.arrived = w.mask = w.gen = 0, w.what = NULL;
		for (unsigned i = 0; i < nt; i++) {
			emu_fiber &f = g_fibers[i];
			fiber_init(f, i);
			f.flat = i;
			f.tid = dim3(i % d.block.x, i / d.block.x % d.block.y,
				     i / (d.block.x * d.block.y));
		}
		g_blk = &br;
		for (;;) {
			// a pass: the first fiber that can run, then (yield_fiber) each next one
			bool ran = false;
			for (unsigned k = 0; k < nt; k++)
				if (g_fibers[br.order[k]].state == F_RUN) {
					switch_to_fiber(&br, NULL, 0, k);
					br.cur = -1;
					ran = true;
					break;
				}
			if (br.done == nt)
				break;
			unsigned at_bar = br.waiting_bar;
			if (at_bar && at_bar + br.done == nt) {
				const emu_fiber *first = NULL;
				for (unsigned i = 0; i < nt; i++) {
					const emu_fiber &f = g_fibers[i];
					if (f.state != F_BAR)
						continue;
					if (!first)
						first = &f;
					else if (f.line != first->line ||
						 (f.file != first->file && strcmp(f.file, first->file)))
						block_error(&br,
							    "__syncthreads at %s and at %s: "
							    "threads wait at different barriers",
							    site(first->file, first->line).c_str(),
							    site(f.file, f.line).c_str());
				}
				if (br.done)
					block_error(&br,
						    "__syncthreads at %s reached by %u of %u threads; "
						    "%u had returned (divergent barrier)",
						    site(first->file, first->line).c_str(), at_bar, nt,
						    br.done);
				for (unsigned i = 0; i < nt; i++)
					if (g_fibers[i].state == F_BAR)
						g_fibers[i].state = F_RUN;
				br.waiting_bar = 0;
				continue;
			}
			if (!ran) { // nobody can move: name who waits where
				for (unsigned i = 0; i < nt; i++) {
					const emu_fiber &f = g_fibers[i];
					if (f.state == F_WARP)
						block_error(&br,
							    "thread %u waits at %s for lanes of its "
							    "warp that returned or wait elsewhere",
							    i, f.what);
				}
				block_error(&br, "deadlock: %u threads at barriers, %u returned",
					    at_bar, br.done);
			}
		}
		if (fp_env() != env) // the fibers do not save it (emu_ctx_switch)
			block_error(&br, "the floating-point environment (MXCSR, x87 control word) "
					 "changed: fibers share it, as no kernel may change it");
		g_blk = NULL;
		g_smem = NULL;
		free(sm);
	}
}

void emu_launch(const emu_launch_desc &d, cudaStream_t s, std::function<void()> body,
		std::function<void(const char *when)> check_args)
{
	size_t nt = (size_t)d.block.x * d.block.y * d.block.z;
	bool bad = nt == 0 || nt > 1024 || d.block.z > 64 || d.grid.x == 0 || d.grid.y == 0 ||
		   d.grid.z == 0 || d.grid.y > 65535 || d.grid.z > 65535 ||
		   d.grid.x > 0x7fffffffu;
	if (bad) {
		if (getenv("BK_EMU_VERBOSE"))
			fprintf(stderr,
				"cuda emulation: %s: grid (%u,%u,%u) block (%u,%u,%u) is not a "
				"valid configuration\n",
				d.name, d.grid.x, d.grid.y, d.grid.z, d.block.x, d.block.y,
				d.block.z);
		fail(cudaErrorInvalidConfiguration);
		return;
	}
	if (d.smem > SMEM_DEFAULT) {
		std::lock_guard<std::mutex> lk(g_mu);
		auto it = g_optin.find(d.fn);
		if (it == g_optin.end() || (size_t)it->second < d.smem) {
			fprintf(stderr,
				"cuda emulation: %s: %zu bytes of dynamic shared memory without "
				"the opt-in (cudaFuncSetAttribute: %d)\n",
				d.name, d.smem, it == g_optin.end() ? 0 : it->second);
			fail(cudaErrorInvalidValue);
			return;
		}
	}
	check_args("issued");
	uint64_t key = emu_seed() ^ mix64(++g_launch_seq);
	{
		std::lock_guard<std::mutex> lk(g_mu);
		static bool at = false;
		if (!at) {
			atexit(write_counts);
			at = true;
		}
	}
	emu_launch_desc dd = d;
	std::string bn = base_name(d.name);
	issue(S(s),
	      [dd, body, check_args, key, bn] {
		      check_args("run");
		      emu_count &c = g_counts[bn];
		      c.launches++;
		      size_t nt = (size_t)dd.block.x * dd.block.y * dd.block.z;
		      c.max_threads = std::max(c.max_threads, nt);
		      c.max_smem = std::max(c.max_smem, dd.smem);
		      run_grid(dd, body, key);
		      check_args("after");
	      },
	      bn);
}

[[noreturn]] void emu_bad_arg(const emu_launch_desc &d, int i, const void *p, const char *when)
{
	emu_fatal("kernel %s (launched at %s): argument %d = %p is not in live device memory "
		"(checked when %s)",
		d.name, site(d.file, d.line).c_str(), i + 1, p, when);
}
