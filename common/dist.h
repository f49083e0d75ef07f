/* dist.h - the processes of one data-parallel run, over MPI: which rank this is, how
 * many there are, and the few collectives bk-step needs, each in a fixed order so the
 * result does not depend on timing.  Without an MPI launcher (or in a build without
 * MPI) a run is one rank of one and every call is a no-op.
 * Not a transport of our own: MPI (OpenMPI from Debian) does the work.  On GPUs the
 * gradients are summed by NCCL on the device (gpu/nccl.h, which uses bk_dist_bcast for
 * its unique id) or, without it, staged through host memory by the caller. */
#ifndef BK_DIST_H
#define BK_DIST_H

#include <stddef.h>

typedef struct {
	int rank, size; /* 0 and 1 without a launcher */
	int local_rank; /* rank among the processes of this machine (GPU choice) */
} bk_dist;

/* Starts MPI when the process was started by an MPI launcher (mpirun, mpiexec, srun:
 * OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the environment); otherwise, or for
 * a launch of one process, leaves d as one rank of one.  Dies when a launcher started
 * several processes but this build has no MPI.  A die() on any rank then aborts the
 * whole job (MPI_Abort), so no rank waits for a dead one. */
void bk_dist_init(bk_dist *d);
/* MPI_Finalize when started. */
void bk_dist_finish(const bk_dist *d);

/* In-place sum of n floats over all ranks, in rank order ((x0 + x1) + x2) + ...: the
 * same bits on every rank and on every run (a chain, not MPI_Allreduce, whose order
 * is the library's choice). */
void bk_dist_sum_f32(const bk_dist *d, float *x, size_t n);
/* The same for doubles (counters and losses). */
void bk_dist_sum_f64(const bk_dist *d, double *x, size_t n);
/* Rank root's n bytes at buf to every rank (a no-op for one rank). */
void bk_dist_bcast(const bk_dist *d, void *buf, size_t n, int root);
/* Every rank stops here until all have arrived. */
void bk_dist_barrier(const bk_dist *d);
/* Was the process started by a launcher of more than one process? (no MPI needed) */
int bk_dist_launched(void);

#endif
