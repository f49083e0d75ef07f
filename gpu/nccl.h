/* nccl.h - the gradient sum of data-parallel bk-step on GPUs: NCCL's all-reduce on the
 * device buffers, one GPU per rank.  NCCL is not linked: libnccl.so.2 is opened at run
 * time (dlopen; BK_NCCL_LIB names another file), so one build runs on machines with and
 * without it.  The path of a run is chosen once, before the first step, by BK_DIST:
 *   auto (default)  NCCL when there are several ranks, every one runs on a GPU and
 *                   loads NCCL; otherwise the host path (bk_dist_sum_f32 over MPI)
 *   mpi             always the host path
 *   nccl            NCCL or a one-line error naming the reason; also for one process
 *                   (a communicator of one rank: the GPU check of tests/gpu)
 * Every rank takes the same path (the ranks agree over MPI); rank 0 says which on
 * stderr in one line when there are several ranks or BK_DIST is set.
 * No hang: NCCL's errors (returned or asynchronous) end the job non-zero after
 * ncclCommAbort; an all-reduce that has not finished after BK_NCCL_TIMEOUT seconds
 * (default 600) is aborted the same way; ncclCommInitRank runs under an alarm of the
 * same length.  Not MPI (common/dist.c), not the CUDA stream (gpu/cuda/cuda_nccl.cu). */
#ifndef BK_NCCL_H
#define BK_NCCL_H

#include <stddef.h>

#include "common/dist.h"
#include "gpu/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bk_nccl bk_nccl;

/* The path for a run on ops (the rank's device, chosen): a communicator of all ranks,
 * or NULL for the host path.  Collective: every rank calls it at the same point.  Dies
 * (with BK_DIST=nccl) naming why NCCL cannot be used, or on a bad BK_DIST. */
bk_nccl *bk_nccl_open(const bk_dist *d, const bk_ops *ops);
/* In-place sum of n floats of device memory over all ranks; returns when the result is
 * there (later ops on the stream see it).  Dies, after ncclCommAbort, on any error. */
void bk_nccl_sum_f32(bk_nccl *c, float *x_device, size_t n);
/* ncclCommDestroy; NULL is fine. */
void bk_nccl_close(bk_nccl *c);

/* gpu/cuda/cuda_nccl.cu in a CUDA build: the stream of bk_ops_cuda as a cudaStream_t,
 * and whether all work issued on it has finished: 1 done, 0 still running, -1 failed
 * (*why: the CUDA error).  In a build without CUDA, nccl.c defines them (no stream, a poll
 * that fails saying so); nothing calls them there: without CUDA, NCCL runs only under the
 * test hook BK_NCCL_HOST, on host buffers, which uses neither. */
void *bk_cuda_nccl_stream(void);
int bk_cuda_nccl_poll(const char **why);

#ifdef __cplusplus
}
#endif

#endif
