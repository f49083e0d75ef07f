/* nccl.c - NCCL loaded at run time for the gradient sum of data-parallel bk-step (see
 * nccl.h).  The few entry points and types used are declared here from NCCL's public
 * API documentation (docs.nvidia.com, "NCCL API"); no NCCL header is needed to build. */
#include "gpu/nccl.h"
#include "common/diag.h"

#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- NCCL's ABI (C enums are ints; a communicator is a pointer) ---- */
typedef int nccl_result;                         /* ncclResult_t */
enum { NCCL_SUCCESS = 0, NCCL_IN_PROGRESS = 7 }; /* ncclSuccess, ncclInProgress (2.14) */
enum { NCCL_FLOAT32 = 7 };                       /* ncclDataType_t ncclFloat32 */
enum { NCCL_SUM = 0 };                           /* ncclRedOp_t ncclSum */
typedef struct {
	char internal[128]; /* NCCL_UNIQUE_ID_BYTES */
} nccl_id;              /* ncclUniqueId, passed by value to ncclCommInitRank */
typedef void *nccl_comm; /* ncclComm_t */

typedef struct {
	nccl_result (*get_version)(int *version);
	nccl_result (*get_unique_id)(nccl_id *id);
	nccl_result (*comm_init_rank)(nccl_comm *comm, int nranks, nccl_id id, int rank);
	nccl_result (*all_reduce)(const void *send, void *recv, size_t count, int type, int op,
				  nccl_comm comm, void *stream);
	nccl_result (*comm_get_async_error)(nccl_comm comm, nccl_result *async);
	nccl_result (*comm_abort)(nccl_comm comm);
	nccl_result (*comm_destroy)(nccl_comm comm);
	const char *(*get_error_string)(nccl_result r);
	const char *(*get_last_error)(nccl_comm comm); /* 2.13 and later: may be NULL */
} nccl_lib;

struct bk_nccl {
	nccl_lib L;
	nccl_comm comm;
	void *stream;    /* bk_ops_cuda's stream; NULL on the host twin (BK_NCCL_HOST) */
	int host;        /* buffers are host memory: nothing to poll */
	int rank;
	double timeout;  /* seconds an all-reduce may take */
	long n_reduce;   /* all-reduces so far (for messages) */
};

#ifndef BK_HAVE_CUDA
void *bk_cuda_nccl_stream(void) { return NULL; }
int bk_cuda_nccl_poll(const char **why)
{
	*why = "this bakery was built without CUDA";
	return -1;
}
#endif

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* the library's name: BK_NCCL_LIB, or the soname every NCCL 2 installs */
static const char *lib_name(void)
{
	const char *v = getenv("BK_NCCL_LIB");
	return v && *v ? v : "libnccl.so.2";
}

/* opens NCCL into L; on failure returns 0 with the reason in why */
static int load(nccl_lib *L, int *version, char *why, size_t cap)
{
	const char *name = lib_name();
	void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		const char *e = dlerror();
		snprintf(why, cap, "%s", e ? e : name);
		return 0;
	}
	static const struct {
		const char *sym;
		size_t off;
		int optional;
	} syms[] = {
		{"ncclGetVersion", offsetof(nccl_lib, get_version), 0},
		{"ncclGetUniqueId", offsetof(nccl_lib, get_unique_id), 0},
		{"ncclCommInitRank", offsetof(nccl_lib, comm_init_rank), 0},
		{"ncclAllReduce", offsetof(nccl_lib, all_reduce), 0},
		{"ncclCommGetAsyncError", offsetof(nccl_lib, comm_get_async_error), 0},
		{"ncclCommAbort", offsetof(nccl_lib, comm_abort), 0},
		{"ncclCommDestroy", offsetof(nccl_lib, comm_destroy), 0},
		{"ncclGetErrorString", offsetof(nccl_lib, get_error_string), 0},
		{"ncclGetLastError", offsetof(nccl_lib, get_last_error), 1},
	};
	for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		void *f = dlsym(h, syms[i].sym);
		if (!f && !syms[i].optional) {
			snprintf(why, cap, "%s has no %s (not NCCL 2.4 or later?)", name, syms[i].sym);
			dlclose(h);
			return 0;
		}
		memcpy((char *)L + syms[i].off, &f, sizeof f); /* object <-> function pointer */
	}
	nccl_result r = L->get_version(version);
	if (r != NCCL_SUCCESS) {
		snprintf(why, cap, "%s: ncclGetVersion failed (%d)", name, r);
		dlclose(h);
		return 0;
	}
	return 1; /* the handle stays open for the life of the process */
}

/* NCCL's version code: major*10000 + minor*100 + patch since 2.9, major*1000 + ... before */
static void version_str(int v, char *buf, size_t cap)
{
	if (v >= 10000)
		snprintf(buf, cap, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
	else
		snprintf(buf, cap, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
}

/* ---- ending a job on an error: abort the communicator, then die (MPI_Abort) ---- */

static bk_nccl *g_open; /* the communicator to abort when the process dies */

static void abort_comm(bk_nccl *c)
{
	if (c && c->comm) {
		nccl_comm comm = c->comm;
		c->comm = NULL;
		c->L.comm_abort(comm);
	}
}

static void abort_on_exit(void) { abort_comm(g_open); }

static _Noreturn void fail(bk_nccl *c, const char *what, nccl_result r)
{
	const char *s = c->L.get_error_string(r);
	const char *last = c->L.get_last_error ? c->L.get_last_error(c->comm) : NULL;
	abort_comm(c);
	die("NCCL: %s failed on rank %d: %s%s%s", what, c->rank,
	    s ? s : "?", last && *last ? ": " : "", last && *last ? last : "");
}

/* ncclCommInitRank blocks until every rank has joined: an alarm ends a rank that waits
 * longer than the timeout (its exit ends the job under mpirun or srun) */
static char alarm_msg[256];
static void on_alarm(int sig)
{
	(void)sig;
	ssize_t w = write(2, alarm_msg, strlen(alarm_msg));
	(void)w;
	_exit(BK_EXIT_FAIL);
}

static double timeout_s(void)
{
	const char *v = getenv("BK_NCCL_TIMEOUT");
	if (!v || !*v)
		return 600;
	char *end;
	double t = strtod(v, &end);
	if (*end || !(t > 0) || t > 1e7)
		die("BK_NCCL_TIMEOUT='%s': seconds, a number above 0", v);
	return t;
}

/* ---- the path of the run ---- */

enum { MODE_AUTO, MODE_MPI, MODE_NCCL };

static int dist_mode(void)
{
	const char *v = getenv("BK_DIST");
	if (!v || !*v || !strcmp(v, "auto"))
		return MODE_AUTO;
	if (!strcmp(v, "mpi"))
		return MODE_MPI;
	if (!strcmp(v, "nccl"))
		return MODE_NCCL;
	die("BK_DIST='%s': auto, mpi or nccl (see bk-step(1), DATA PARALLEL)", v);
}

static const char *mode_name(int m)
{
	return m == MODE_MPI ? "mpi" : m == MODE_NCCL ? "nccl" : "auto";
}

/* the host path's note (rank 0; several ranks or BK_DIST set) */
static void note_host(const bk_dist *d, int mode, const char *why)
{
	if (d->rank || (d->size == 1 && !getenv("BK_DIST")))
		return;
	if (d->size == 1) {
		fprintf(stderr, "%s: one process: no gradients to sum (BK_DIST=%s)\n", bk_prog,
			mode_name(mode));
		return;
	}
	fprintf(stderr, "%s: %d data-parallel ranks: gradients summed over MPI in rank order, "
		"through host memory (BK_DIST=%s%s%s)\n", bk_prog, d->size, mode_name(mode),
		why ? ": " : "", why ? why : "");
}

bk_nccl *bk_nccl_open(const bk_dist *d, const bk_ops *ops)
{
	int mode = dist_mode();
	if (mode == MODE_MPI || (mode == MODE_AUTO && d->size == 1)) {
		note_host(d, mode, NULL);
		return NULL;
	}
	double timeout = timeout_s();
	/* can this rank use NCCL? */
	const char *hook = getenv("BK_NCCL_HOST"); /* tests: host buffers, a fake libnccl */
	int host = hook && !strcmp(hook, "1");
	char why[512] = "";
	nccl_lib L;
	memset(&L, 0, sizeof L);
	int version = 0;
	if (strcmp(ops->name, "cuda") && !host)
#ifdef BK_HAVE_CUDA
		snprintf(why, sizeof why, "it runs on the host twin, not a GPU (--device cpu, or "
			 "auto without a GPU)");
#else
		snprintf(why, sizeof why, "it runs on the host twin: this bakery was built "
			 "without CUDA");
#endif
	else
		load(&L, &version, why, sizeof why);
	int ok = !*why;
	if (mode == MODE_NCCL && !ok)
		die("BK_DIST=nccl: rank %d cannot use NCCL: %s", d->rank, why);
	if (mode == MODE_AUTO) { /* every rank takes the same path */
		double bad = ok ? 0 : 1;
		bk_dist_sum_f64(d, &bad, 1);
		if (bad > 0) {
			char *w = ok ? xasprintf("%.0f of %d ranks cannot use NCCL; BK_DIST=nccl "
						 "names the reason", bad, d->size)
				     : xasprintf("rank 0 cannot use NCCL: %s", why);
			note_host(d, mode, w);
			free(w);
			return NULL;
		}
	}

	bk_nccl *c = xcalloc(1, sizeof *c);
	c->L = L, c->host = host, c->rank = d->rank, c->timeout = timeout;
	c->stream = host ? NULL : bk_cuda_nccl_stream();
	nccl_id id;
	memset(&id, 0, sizeof id);
	nccl_result r = NCCL_SUCCESS;
	if (d->rank == 0 && (r = L.get_unique_id(&id)) != NCCL_SUCCESS)
		fail(c, "ncclGetUniqueId", r);
	bk_dist_bcast(d, &id, sizeof id, 0);
	snprintf(alarm_msg, sizeof alarm_msg, "%s: error: NCCL: ncclCommInitRank did not return "
		 "within %g s on rank %d (a rank that never joined? BK_NCCL_TIMEOUT)\n", bk_prog,
		 timeout, d->rank);
	struct sigaction sa, old;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_alarm;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGALRM, &sa, &old);
	alarm((unsigned)(timeout + 0.999));
	r = L.comm_init_rank(&c->comm, d->size, id, d->rank);
	alarm(0);
	sigaction(SIGALRM, &old, NULL);
	if (r != NCCL_SUCCESS) {
		c->comm = NULL;
		fail(c, "ncclCommInitRank", r);
	}
	g_open = c;
	bk_atexit(abort_on_exit); /* runs before dist.c's MPI_Abort (registered earlier) */
	if (d->rank == 0) {
		char v[32];
		version_str(version, v, sizeof v);
		fprintf(stderr, "%s: %d data-parallel %s: gradients summed by NCCL %s, ncclAllReduce "
			"on the %s (BK_DIST=%s; %s)\n", bk_prog, d->size,
			d->size == 1 ? "rank" : "ranks", v,
			host ? "host twin's buffers, a test (BK_NCCL_HOST=1)" : "GPUs", mode_name(mode),
			lib_name());
	}
	return c;
}

/* waits for the all-reduce just issued: the stream done, no asynchronous error, within
 * the timeout; polls every 20 us at first, at most every millisecond */
static void wait_done(bk_nccl *c)
{
	double t0 = now_s();
	long ns = 20000;
	for (;;) {
		const char *why = NULL;
		nccl_result a = NCCL_SUCCESS, r = c->L.comm_get_async_error(c->comm, &a);
		if (r != NCCL_SUCCESS)
			fail(c, "ncclCommGetAsyncError", r);
		if (a != NCCL_SUCCESS && a != NCCL_IN_PROGRESS)
			fail(c, "the all-reduce (an asynchronous error)", a);
		/* host buffers (a test): no stream; "in progress" stands for a hung peer */
		int done = c->host ? a != NCCL_IN_PROGRESS : bk_cuda_nccl_poll(&why);
		if (done < 0) {
			abort_comm(c);
			die("NCCL: the all-reduce failed on rank %d: %s", c->rank, why ? why : "?");
		}
		if (done)
			return;
		if (now_s() - t0 > c->timeout) {
			abort_comm(c);
			die("NCCL: all-reduce %ld did not finish within %g s on rank %d: a rank "
			    "stopped or hangs; communicator aborted (BK_NCCL_TIMEOUT)", c->n_reduce,
			    c->timeout, c->rank);
		}
		struct timespec ts = {0, ns};
		nanosleep(&ts, NULL);
		if (ns < 1000000)
			ns *= 2;
	}
}

void bk_nccl_sum_f32(bk_nccl *c, float *x, size_t n)
{
	c->n_reduce++;
	if (!n)
		return;
	nccl_result r = c->L.all_reduce(x, x, n, NCCL_FLOAT32, NCCL_SUM, c->comm, c->stream);
	if (r != NCCL_SUCCESS && r != NCCL_IN_PROGRESS)
		fail(c, "ncclAllReduce", r);
	wait_done(c);
}

void bk_nccl_close(bk_nccl *c)
{
	if (!c)
		return;
	if (c->comm) {
		nccl_result r = c->L.comm_destroy(c->comm);
		c->comm = NULL;
		if (r != NCCL_SUCCESS)
			warn("NCCL: ncclCommDestroy failed on rank %d: %s", c->rank,
			     c->L.get_error_string(r));
	}
	if (g_open == c)
		g_open = NULL;
	free(c);
}
