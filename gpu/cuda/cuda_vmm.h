/* cuda_vmm.h - one copy of the frozen weights per GPU, the device half (gpu/wshare.h is
 * the host half: the rendezvous and the passing of the file descriptor).  The CUDA
 * driver's virtual memory management: a physical allocation exported as a POSIX file
 * descriptor, imported and mapped by another process; the driver counts the references
 * (every mapping, handle and descriptor), so the memory lives while any process maps it.
 * The driver calls are reached through cudaGetDriverEntryPointByVersion (no link against
 * libcuda: a CUDA build still starts on a machine without a driver); under the emulation
 * (make emu) they are gpu/emu's.  And the placement of bk_ops_cuda's weights in such an
 * allocation (gpu/cuda/cuda_ops.cu).  C-callable; exists only in a CUDA build. */
#ifndef BK_CUDA_VMM_H
#define BK_CUDA_VMM_H

#include <stddef.h>
#include <stdint.h>

#ifdef BK_HAVE_CUDA
#ifdef __cplusplus
extern "C" {
#endif

/* a mapping of one physical allocation in this process */
typedef struct {
	void *ptr;      /* device address, NULL when none */
	size_t bytes;   /* mapped bytes (a multiple of the granularity) */
	unsigned long long handle; /* the driver's allocation handle */
} bk_vmm_map;

/* Can this process's device (the current one) share memory by file descriptor?  1, or 0
 * with the reason in *why (static text). */
int bk_vmm_supported(const char **why);
/* the current device's UUID in hex (32 digits); 0, or -1 with *why */
int bk_vmm_device_uuid(char out[33], const char **why);
/* A new physical allocation of at least bytes on the current device, exportable as a
 * file descriptor, mapped read-write in this process; *fd its descriptor (the caller
 * owns it).  NULL, or the reason it failed (static text; nothing is left allocated):
 * bk_vmm_no_memory itself when the device has too little memory free (m->bytes then
 * the bytes asked: bytes rounded up to the granularity). */
const char *bk_vmm_create(size_t bytes, bk_vmm_map *m, int *fd);
extern const char bk_vmm_no_memory[];
/* Maps the allocation of a descriptor made by bk_vmm_create (any process) of bytes
 * (its mapped size there).  The caller keeps fd.  NULL, or the reason it failed. */
const char *bk_vmm_import(int fd, size_t bytes, bk_vmm_map *m);
/* Unmaps and releases this process's reference (after the device is done with it). */
void bk_vmm_unmap(bk_vmm_map *m);

/* ---- where bk_ops_cuda.weight_upload puts the weights (gpu/cuda/cuda_ops.cu) ---- */
enum {
	BK_WPLACE_OWN,     /* each weight its own allocation (the default) */
	BK_WPLACE_MEASURE, /* nowhere: the layout only (handles with data NULL, to be freed) */
	BK_WPLACE_UPLOAD,  /* converted into the arena at the layout's offsets */
	BK_WPLACE_ATTACH,  /* the arena already holds them (another process uploaded) */
};
/* one tensor of the layout: [rows, cols] at byte off of the arena, bytes long; kind
 * BK_WDESC_BF16 (bf16 values), or a 4-bit linear (gpu/cuda/cuda_q4.cuh: its packed codes
 * and statistics in one piece) BK_WDESC_Q4 | its quant type << 4 | double quant << 8 */
typedef struct {
	int32_t rows, cols;
	int32_t kind, zero; /* zero: 0 (the layouts are compared byte by byte) */
	uint64_t off, bytes;
} bk_wdesc;
enum { BK_WDESC_BF16 = 0, BK_WDESC_Q4 = 1 };
/* The weight_uploads until bk_cuda_wplace_end go by mode; UPLOAD and ATTACH into the
 * arena [base, base + bytes), each tensor checked against desc[0..n) (a difference
 * dies naming it). */
void bk_cuda_wplace_begin(int mode, void *base, size_t bytes, const bk_wdesc *desc, size_t n);
/* Ends the placement: the bytes the tensors span; with desc, a malloc'd copy of the
 * layout (MEASURE: the one recorded) and its length in *n. */
size_t bk_cuda_wplace_end(bk_wdesc **desc, size_t *n);
/* Forgets the arena at base (its weights freed by bk_model_free before): no longer
 * counted; call before unmapping it. */
void bk_cuda_warena_drop(void *base);

#ifdef __cplusplus
}
#endif
#endif /* BK_HAVE_CUDA */
#endif
