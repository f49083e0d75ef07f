/* device.c - see device.h.  "cuda" and "auto" (with a GPU) give bk_ops_cuda in a
 * CUDA build; without one "cuda" dies naming the reason and "auto" says it falls back. */
#include "device.h"
#include "common/diag.h"
#include "gpu/host/blas_core.h"
#include "gpu/cuda/cuda.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef BK_HAVE_CUDA
int bk_cuda_device_count(const char **why)
{
	*why = "this bakery was built without CUDA (make CUDA=0 or no nvcc)";
	return 0;
}
#endif

#ifdef BK_HAVE_CUDA
/* Number of function slots the host twin fills and bk_ops_cuda leaves NULL (ops other
 * files add to ops.h before their CUDA version is wired in): such a table must not be
 * used, a NULL call would crash mid-run. */
static int cuda_missing_ops(void)
{
	size_t first = offsetof(bk_ops, alloc), n = (sizeof(bk_ops) - first) / sizeof(void (*)(void));
	int missing = 0;
	for (size_t i = 0; i < n; i++) {
		void (*fh)(void), (*fc)(void);
		memcpy(&fh, (const char *)&bk_ops_host + first + i * sizeof(fh), sizeof(fh));
		memcpy(&fc, (const char *)&bk_ops_cuda + first + i * sizeof(fc), sizeof(fc));
		missing += fh && !fc;
	}
	return missing;
}
#endif

/* The "no GPU" notice of --device auto, once per pipe: the stages of one pipe (and of
 * one make recipe or script) share a process group, so the stage that first binds the
 * abstract socket "bakery/no-gpu/UID/SID/PGID" prints the notice and holds the name
 * until it exits; a stage that finds the name taken stays quiet.  An abstract socket
 * leaves no file behind and vanishes with its holder, so a reused process-group id
 * never silences a later job.  Where no socket can be made (no AF_UNIX), every stage
 * prints, as before. */
static int first_in_pipe(void)
{
	int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 1;
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	int n = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "bakery/no-gpu/%ld/%ld/%ld",
			 (long)getuid(), (long)getsid(0), (long)getpgrp());
	socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
	if (bind(fd, (struct sockaddr *)&a, len) == 0)
		return 1; /* fd stays open (and the name ours) until this process exits */
	close(fd);
	return 0;
}

const bk_ops *bk_device_select(const char *name)
{
	bk_blas_core_fix(); /* before any BLAS call: OpenBLAS's AVX kernels on a CPU it does not know */
	if (!strcmp(name, "cpu"))
		return &bk_ops_host;
	if (strcmp(name, "cuda") && strcmp(name, "auto"))
		die_usage("unknown device '%s' (cpu, cuda or auto)", name);
	const char *why = NULL;
	int n = bk_cuda_device_count(&why);
	if (n > 0) {
#ifdef BK_HAVE_CUDA
		int missing = cuda_missing_ops();
		if (!missing) {
			note("using the GPU (cuda)");
			return &bk_ops_cuda;
		}
		if (!strcmp(name, "cuda"))
			die("--device cuda: %d ops of the CUDA table are not built yet "
			    "(tests/gpu/test_cuda_ops names them); use --device cpu", missing);
		warn("a GPU is present but %d CUDA ops are not built yet; using the host twin (cpu)",
		     missing);
		return &bk_ops_host;
#else
		BUG("a CUDA device was counted in a build without CUDA");
#endif
	}
	if (!strcmp(name, "cuda"))
		die("--device cuda: no usable GPU: %s", why);
	if (first_in_pipe())
		fprintf(stderr, "%s: no GPU (%s); using the host twin (cpu)\n", bk_prog, why);
	return &bk_ops_host;
}
