/* dist.c - data-parallel ranks over MPI (see dist.h).  Built with MPI when the Makefile
 * finds it (BK_HAVE_MPI); without it a run is always one rank. */
#include "common/dist.h"
#include "common/diag.h"

#include <stdlib.h>
#include <string.h>

#ifdef BK_HAVE_MPI
#include <mpi.h>
#endif

static long env_long(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? strtol(v, NULL, 10) : -1;
}

int bk_dist_launched(void)
{
	return env_long("OMPI_COMM_WORLD_SIZE") > 1 || env_long("PMI_SIZE") > 1 ||
	       env_long("PMIX_SIZE") > 1 ||
	       (getenv("PMIX_RANK") && env_long("SLURM_NTASKS") > 1);
}

#ifdef BK_HAVE_MPI
static int started;

/* die() on any rank ends the job: the others would wait for it in a collective */
static void abort_job(void)
{
	if (started)
		MPI_Abort(MPI_COMM_WORLD, BK_EXIT_FAIL);
}

void bk_dist_init(bk_dist *d)
{
	d->rank = 0, d->size = 1, d->local_rank = 0;
	if (!bk_dist_launched())
		return;
	if (MPI_Init(NULL, NULL) != MPI_SUCCESS)
		die("MPI_Init failed");
	started = 1;
	bk_atexit(abort_job);
	MPI_Comm_rank(MPI_COMM_WORLD, &d->rank);
	MPI_Comm_size(MPI_COMM_WORLD, &d->size);
	MPI_Comm local;
	MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, d->rank, MPI_INFO_NULL, &local);
	MPI_Comm_rank(local, &d->local_rank);
	MPI_Comm_free(&local);
}

void bk_dist_finish(const bk_dist *d)
{
	(void)d;
	if (started) {
		started = 0;
		MPI_Finalize();
	}
}

#define CHUNK (1 << 20) /* values per message */

/* the chain: rank r receives the sum of ranks 0..r-1, adds its own, hands it on; the
 * last rank holds the total and broadcasts it */
#define CHAIN_SUM(T, MPI_T)                                                          \
	do {                                                                         \
		if (d->size <= 1)                                                    \
			return;                                                      \
		T *tmp = xmalloc((n < CHUNK ? (n ? n : 1) : CHUNK) * sizeof(T));     \
		for (size_t off = 0; off < n; off += CHUNK) {                        \
			int k = (int)(n - off < CHUNK ? n - off : CHUNK);            \
			T *p = x + off;                                              \
			if (d->rank > 0) {                                           \
				MPI_Recv(tmp, k, MPI_T, d->rank - 1, 0, MPI_COMM_WORLD, \
					 MPI_STATUS_IGNORE);                         \
				for (int i = 0; i < k; i++)                          \
					p[i] = tmp[i] + p[i];                        \
			}                                                            \
			if (d->rank < d->size - 1)                                   \
				MPI_Send(p, k, MPI_T, d->rank + 1, 0, MPI_COMM_WORLD);  \
			MPI_Bcast(p, k, MPI_T, d->size - 1, MPI_COMM_WORLD);         \
		}                                                                    \
		free(tmp);                                                           \
	} while (0)

void bk_dist_sum_f32(const bk_dist *d, float *x, size_t n) { CHAIN_SUM(float, MPI_FLOAT); }
void bk_dist_sum_f64(const bk_dist *d, double *x, size_t n) { CHAIN_SUM(double, MPI_DOUBLE); }

void bk_dist_bcast(const bk_dist *d, void *buf, size_t n, int root)
{
	if (d->size <= 1)
		return;
	if (n > (size_t)1 << 30)
		BUG("bk_dist_bcast of %zu bytes", n);
	MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD);
}

void bk_dist_barrier(const bk_dist *d)
{
	if (d->size > 1)
		MPI_Barrier(MPI_COMM_WORLD);
}

#else /* no MPI in this build */

void bk_dist_init(bk_dist *d)
{
	d->rank = 0, d->size = 1, d->local_rank = 0;
	if (bk_dist_launched())
		die("started by an MPI launcher with several processes, but this build has no "
		    "MPI (install libopenmpi-dev: make deps, then make)");
}

void bk_dist_finish(const bk_dist *d) { (void)d; }
void bk_dist_sum_f32(const bk_dist *d, float *x, size_t n) { (void)d, (void)x, (void)n; }
void bk_dist_sum_f64(const bk_dist *d, double *x, size_t n) { (void)d, (void)x, (void)n; }
void bk_dist_bcast(const bk_dist *d, void *buf, size_t n, int root)
{
	(void)d, (void)buf, (void)n, (void)root;
}
void bk_dist_barrier(const bk_dist *d) { (void)d; }

#endif
