// cuda_vmm.cu - the driver half of one shared copy of the weights: physical allocations
// exported as file descriptors, imported and mapped (gpu/cuda/cuda_vmm.h).  The driver
// calls come from cudaGetDriverEntryPointByVersion, once, so a CUDA build needs no
// libcuda at link time (the runtime finds the driver when there is one).  No kernels.
#include "gpu/cuda/cuda_common.cuh"
#include "gpu/cuda/cuda_vmm.h"

#include <cuda.h>
#include <mutex>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

namespace {
struct driver {
	decltype(&cuCtxGetDevice) ctx_get_device;
	decltype(&cuDeviceGetAttribute) get_attribute;
	decltype(&cuDeviceGetUuid) get_uuid;
	decltype(&cuMemGetAllocationGranularity) granularity;
	decltype(&cuMemCreate) create;
	decltype(&cuMemRelease) release;
	decltype(&cuMemExportToShareableHandle) export_fd;
	decltype(&cuMemImportFromShareableHandle) import_fd;
	decltype(&cuMemAddressReserve) reserve;
	decltype(&cuMemAddressFree) address_free;
	decltype(&cuMemMap) map;
	decltype(&cuMemUnmap) unmap;
	decltype(&cuMemSetAccess) set_access;
	const char *why; // NULL when every call was found
};
} // namespace

static driver g_drv;
static std::once_flag g_drv_once;

template <typename F> static void entry(F *fn, const char *name)
{
	void *p = NULL;
	cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
	if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &st) != cudaSuccess ||
	    st != cudaDriverEntryPointSuccess || !p) {
		cudaGetLastError();
		*fn = NULL;
		if (!g_drv.why)
			g_drv.why = "the CUDA driver lacks a virtual memory management call";
		return;
	}
	*fn = (F)p;
}

static const driver *drv(void)
{
	std::call_once(g_drv_once, [] {
		bk_cuda_stream(); // the runtime's context, current on this thread
		entry(&g_drv.ctx_get_device, "cuCtxGetDevice");
		entry(&g_drv.get_attribute, "cuDeviceGetAttribute");
		entry(&g_drv.get_uuid, "cuDeviceGetUuid");
		entry(&g_drv.granularity, "cuMemGetAllocationGranularity");
		entry(&g_drv.create, "cuMemCreate");
		entry(&g_drv.release, "cuMemRelease");
		entry(&g_drv.export_fd, "cuMemExportToShareableHandle");
		entry(&g_drv.import_fd, "cuMemImportFromShareableHandle");
		entry(&g_drv.reserve, "cuMemAddressReserve");
		entry(&g_drv.address_free, "cuMemAddressFree");
		entry(&g_drv.map, "cuMemMap");
		entry(&g_drv.unmap, "cuMemUnmap");
		entry(&g_drv.set_access, "cuMemSetAccess");
	});
	return &g_drv;
}

// the current device (the runtime's, made current on this thread)
static int current_device(const driver *d, CUdevice *dev)
{
	int rt = 0;
	if (cudaGetDevice(&rt) != cudaSuccess || cudaSetDevice(rt) != cudaSuccess) {
		cudaGetLastError();
		return -1;
	}
	return d->ctx_get_device(dev) == CUDA_SUCCESS ? 0 : -1;
}

extern "C" int bk_vmm_supported(const char **why)
{
	const driver *d = drv();
	if (d->why) {
		*why = d->why;
		return 0;
	}
	CUdevice dev;
	int vmm = 0, fd = 0;
	if (current_device(d, &dev)) {
		*why = "no current CUDA device";
		return 0;
	}
	if (d->get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
		    CUDA_SUCCESS ||
	    !vmm) {
		*why = "the GPU or its driver has no virtual memory management";
		return 0;
	}
	if (d->get_attribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
			     dev) != CUDA_SUCCESS ||
	    !fd) {
		*why = "the GPU's driver cannot export memory as a file descriptor";
		return 0;
	}
	return 1;
}

extern "C" int bk_vmm_device_uuid(char out[33], const char **why)
{
	const driver *d = drv();
	CUdevice dev;
	CUuuid u;
	if (d->why || current_device(d, &dev) || d->get_uuid(&u, dev) != CUDA_SUCCESS) {
		*why = d->why ? d->why : "the GPU's UUID is unknown";
		return -1;
	}
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", (unsigned char)u.bytes[i]);
	return 0;
}

static CUmemAllocationProp prop_of(CUdevice dev)
{
	CUmemAllocationProp p;
	memset(&p, 0, sizeof p);
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = (int)dev;
	return p;
}

// reserves address space for m->handle's bytes, maps it there with read-write access
// (the stages only read the weights; CUDA grants device access as read-write)
static const char *map_handle(const driver *d, CUdevice dev, bk_vmm_map *m)
{
	CUdeviceptr p = 0;
	if (d->reserve(&p, m->bytes, 0, 0, 0) != CUDA_SUCCESS)
		return "cuMemAddressReserve failed";
	if (d->map(p, m->bytes, 0, m->handle, 0) != CUDA_SUCCESS) {
		d->address_free(p, m->bytes);
		return "cuMemMap failed";
	}
	CUmemAccessDesc a;
	memset(&a, 0, sizeof a);
	a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a.location.id = (int)dev;
	a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	if (d->set_access(p, m->bytes, &a, 1) != CUDA_SUCCESS) {
		d->unmap(p, m->bytes);
		d->address_free(p, m->bytes);
		return "cuMemSetAccess failed";
	}
	m->ptr = (void *)(uintptr_t)p;
	return NULL;
}

// what bk_vmm_create and bk_vmm_import start with: m cleared, the driver's calls and the
// current device; the reason when there are none
static const char *vmm_begin(const driver **d, bk_vmm_map *m, CUdevice *dev)
{
	*d = drv();
	memset(m, 0, sizeof *m);
	if ((*d)->why)
		return (*d)->why;
	if (current_device(*d, dev))
		return "no current CUDA device";
	return NULL;
}

extern "C" const char bk_vmm_no_memory[] = "cuMemCreate: out of device memory";

extern "C" const char *bk_vmm_create(size_t bytes, bk_vmm_map *m, int *fd)
{
	const driver *d;
	CUdevice dev;
	*fd = -1;
	const char *why0 = vmm_begin(&d, m, &dev);
	if (why0)
		return why0;
	CUmemAllocationProp p = prop_of(dev);
	size_t g = 0;
	if (d->granularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g)
		return "cuMemGetAllocationGranularity failed";
	m->bytes = (bytes + g - 1) / g * g;
	CUmemGenericAllocationHandle h;
	CUresult r = d->create(&h, m->bytes, &p, 0);
	if (r == CUDA_ERROR_OUT_OF_MEMORY)
		return bk_vmm_no_memory;
	if (r != CUDA_SUCCESS)
		return "cuMemCreate failed";
	m->handle = h;
	if (d->export_fd(fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS) {
		d->release(h);
		*fd = -1;
		return "cuMemExportToShareableHandle failed";
	}
	const char *why = map_handle(d, dev, m);
	if (why) {
		d->release(h);
		close(*fd);
		*fd = -1;
	}
	return why;
}

extern "C" const char *bk_vmm_import(int fd, size_t bytes, bk_vmm_map *m)
{
	const driver *d;
	CUdevice dev;
	const char *why0 = vmm_begin(&d, m, &dev);
	if (why0)
		return why0;
	CUmemGenericAllocationHandle h;
	if (d->import_fd(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) !=
	    CUDA_SUCCESS)
		return "cuMemImportFromShareableHandle failed";
	m->handle = h;
	m->bytes = bytes;
	const char *why = map_handle(d, dev, m);
	if (why)
		d->release(h);
	return why;
}

extern "C" void bk_vmm_unmap(bk_vmm_map *m)
{
	if (!m->ptr)
		return;
	const driver *d = drv();
	CUDA_CHECK(cudaStreamSynchronize(bk_cuda_stream())); // the device may still read it
	CUdeviceptr p = (CUdeviceptr)(uintptr_t)m->ptr;
	if (d->unmap(p, m->bytes) != CUDA_SUCCESS || d->address_free(p, m->bytes) != CUDA_SUCCESS ||
	    d->release(m->handle) != CUDA_SUCCESS)
		die("cuda: unmapping the shared weights at %p (%zu bytes) failed", m->ptr, m->bytes);
	memset(m, 0, sizeof *m);
}
