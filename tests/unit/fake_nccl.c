/* fake_nccl.c - a stand-in libnccl.so.2 for tests/t0410-mpi.sh on machines without a GPU
 * or NCCL: the entry points gpu/nccl.c loads, over host memory (bk-step with
 * BK_NCCL_HOST=1 hands it the host twin's buffers).  ncclAllReduce really sums: each
 * rank writes its buffer to a file in a directory the unique id names, waits for every
 * rank's file and adds them in rank order, so N ranks give the same bits as the MPI
 * chain (for 2 ranks a + b in any order).  It checks what a caller gets wrong (the type,
 * the operation, a rank outside the communicator) and plants failures on request:
 *   FAKE_NCCL_LOG=FILE     one line per call appended (init, allreduce, abort, destroy)
 *   FAKE_NCCL_FAIL=init | allreduce:K | async:K | hang:K   ncclCommInitRank fails,
 *                          the K-th ncclAllReduce returns ncclRemoteError, reports one
 *                          through ncclCommGetAsyncError, or never finishes (reports
 *                          ncclInProgress for ever: with host buffers there is no
 *                          stream, so bk-step reads that as still running); on
 *                          FAKE_NCCL_FAIL_RANK alone when set
 *   FAKE_NCCL_NOOP=1       ncclAllReduce leaves the buffer alone (a test that must fail)
 * With a stream (bk-step --device cuda of the emulation build, make emu, whose device
 * memory is host memory: tests/t0950-emu.sh) the sum is queued on it with the process's
 * cudaLaunchHostFunc, so it runs in stream order as NCCL's kernel would: after the
 * backward that wrote the buffer, and done only when the stream is.
 * Not NCCL and not its header: the declarations follow NCCL's public API documentation,
 * as gpu/nccl.c does, so this checks bakery's use of the API, not the ABI itself. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct {
	char internal[128];
} id128;

typedef struct comm {
	char dir[128];
	int nranks, rank, seq, async;
} comm;

static void logf_(const char *fmt, ...)
{
	const char *path = getenv("FAKE_NCCL_LOG");
	if (!path || !*path)
		return;
	char buf[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if (n > (int)sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
	if (fd >= 0) {
		ssize_t w = write(fd, buf, (size_t)n); /* one write: lines of ranks do not mix */
		(void)w;
		close(fd);
	}
}

/* is failure `what` planted for this call (K-th all-reduce; rank filter)? */
static int planted(const comm *c, const char *what, int k)
{
	const char *f = getenv("FAKE_NCCL_FAIL"), *r = getenv("FAKE_NCCL_FAIL_RANK");
	if (!f || !*f)
		return 0;
	if (r && *r && c && atoi(r) != c->rank)
		return 0;
	size_t n = strlen(what);
	if (strncmp(f, what, n))
		return 0;
	if (!f[n])
		return 1;
	return f[n] == ':' && atoi(f + n + 1) == k;
}

int ncclGetVersion(int *v)
{
	*v = 22305; /* "2.23.5" */
	return 0;
}

const char *ncclGetErrorString(int r)
{
	static const char *s[] = {"no error", "unhandled cuda error", "unhandled system error",
				  "internal error", "invalid argument", "invalid usage",
				  "remote process exited or there was a network error",
				  "NCCL operation in progress"};
	return r >= 0 && r < 8 ? s[r] : "unknown result code";
}

const char *ncclGetLastError(void *comm)
{
	(void)comm;
	return getenv("FAKE_NCCL_FAIL") ? "fake NCCL: planted failure" : "";
}

int ncclGetUniqueId(id128 *id)
{
	memset(id, 0, sizeof *id);
	const char *t = getenv("TMPDIR");
	snprintf(id->internal, sizeof id->internal, "%s/fake-nccl.XXXXXX", t && *t ? t : "/tmp");
	if (!mkdtemp(id->internal))
		return 2;
	return 0;
}

int ncclCommInitRank(comm **out, int nranks, id128 id, int rank)
{
	if (nranks < 1 || rank < 0 || rank >= nranks || !id.internal[0] ||
	    !memchr(id.internal, 0, sizeof id.internal))
		return 4;
	comm *c = calloc(1, sizeof *c);
	if (!c)
		return 2;
	memcpy(c->dir, id.internal, sizeof c->dir);
	c->nranks = nranks, c->rank = rank;
	logf_("init nranks=%d rank=%d id=%s", nranks, rank, c->dir);
	if (planted(c, "init", 0)) {
		free(c);
		return 2;
	}
	*out = c;
	return 0;
}

static int write_all(const char *path, const void *p, size_t n)
{
	char tmp[320];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "wb");
	if (!f)
		return -1;
	int ok = fwrite(p, 1, n, f) == n;
	ok &= fclose(f) == 0;
	return ok && rename(tmp, path) == 0 ? 0 : -1;
}

/* the sum of all-reduce seq: each rank's file, added in rank order */
static int reduce(const comm *c, int seq, const void *send, void *recv, size_t count)
{
	size_t bytes = count * sizeof(float);
	if (c->nranks == 1) {
		if (send != recv)
			memmove(recv, send, bytes);
		return 0;
	}
	char path[300];
	snprintf(path, sizeof path, "%s/%d.%d", c->dir, seq, c->rank);
	if (write_all(path, send, bytes))
		return 2;
	float *sum = calloc(count ? count : 1, sizeof(float));
	float *part = malloc(bytes ? bytes : 1);
	if (!sum || !part)
		return 2;
	for (int r = 0; r < c->nranks; r++) {
		snprintf(path, sizeof path, "%s/%d.%d", c->dir, seq, r);
		FILE *f;
		while (!(f = fopen(path, "rb"))) { /* no timeout: bk-step's job is to not hang */
			struct timespec ts = {0, 1000000};
			nanosleep(&ts, NULL);
		}
		size_t got = fread(part, 1, bytes, f);
		fclose(f);
		if (got != bytes) {
			free(sum), free(part);
			return 3;
		}
		for (size_t i = 0; i < count; i++)
			sum[i] = r ? sum[i] + part[i] : part[i];
	}
	memcpy(recv, sum, bytes);
	free(sum), free(part);
	if (seq > 2) { /* every rank has written seq - 1, so has read seq - 2 */
		snprintf(path, sizeof path, "%s/%d.%d", c->dir, seq - 2, c->rank);
		unlink(path);
	}
	return 0;
}

/* an all-reduce queued on the emulated stream (cudaLaunchHostFunc) */
typedef struct {
	comm *c;
	int seq;
	const void *send;
	void *recv;
	size_t count;
} job;

static void run_job(void *p)
{
	job *j = p;
	int r = reduce(j->c, j->seq, j->send, j->recv, j->count);
	if (r)
		j->c->async = r;
	free(j);
}

int ncclAllReduce(const void *send, void *recv, size_t count, int type, int op, comm *c,
		  void *stream)
{
	if (!c)
		return 5;
	c->seq++;
	logf_("allreduce rank=%d seq=%d count=%zu type=%d op=%d inplace=%d stream=%s", c->rank,
	      c->seq, count, type, op, send == recv, stream ? "set" : "null");
	if (type != 7 || op != 0) /* ncclFloat32, ncclSum: all bakery asks for */
		return 4;
	if (planted(c, "allreduce", c->seq))
		return 6;
	if (planted(c, "async", c->seq)) {
		c->async = 6;
		return 0;
	}
	if (planted(c, "hang", c->seq)) { /* never finishes: bk-step's timeout must end it */
		c->async = 7;
		return 0;
	}
	if (getenv("FAKE_NCCL_NOOP"))
		return 0;
	if (!stream)
		return reduce(c, c->seq, send, recv, count);
	int (*launch)(void *, void (*)(void *), void *);
	*(void **)&launch = dlsym(RTLD_DEFAULT, "cudaLaunchHostFunc");
	job *j = malloc(sizeof *j);
	if (!launch || !j) { /* not the emulation build */
		free(j);
		return 1;
	}
	*j = (job){c, c->seq, send, recv, count};
	return launch(stream, run_job, j) ? 1 : 0;
}

int ncclCommGetAsyncError(comm *c, int *async)
{
	if (!c)
		return 5;
	*async = c->async;
	return 0;
}

int ncclCommAbort(comm *c)
{
	if (c)
		logf_("abort rank=%d seq=%d", c->rank, c->seq);
	free(c);
	return 0;
}

int ncclCommDestroy(comm *c)
{
	if (!c)
		return 5;
	logf_("destroy rank=%d seq=%d", c->rank, c->seq);
	free(c);
	return 0;
}
