/* device.h - choosing where the compute layer runs: --device cpu|cuda|auto.
 * auto takes a GPU when the CUDA build finds one, else the host twin, and says so on
 * stderr once per pipe (the first stage of its process group; see bakery(7)).  Not the
 * ops themselves (ops.h). */
#ifndef BK_DEVICE_H
#define BK_DEVICE_H

#include "gpu/ops.h"

/* Returns the ops table for name ("cpu", "cuda", "auto"); dies with one line naming
 * the reason when the device cannot be had (unknown name, no GPU for "cuda"). */
const bk_ops *bk_device_select(const char *name);

/* Number of CUDA devices; 0 with a reason in why (static text) when there is no CUDA
 * build, no driver or no device.  Defined in cuda_device.cu when built with CUDA. */
int bk_cuda_device_count(const char **why);

#endif
