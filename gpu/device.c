/* device.c - see device.h. */
#include "device.h"
#include "common/diag.h"

#include <stdio.h>
#include <string.h>

#ifndef BK_HAVE_CUDA
int bk_cuda_device_count(const char **why)
{
	*why = "this bakery was built without CUDA (make CUDA=0 or no nvcc)";
	return 0;
}
#endif

const bk_ops *bk_device_select(const char *name)
{
	if (!strcmp(name, "cpu"))
		return &bk_ops_host;
	if (strcmp(name, "cuda") && strcmp(name, "auto"))
		die_usage("unknown device '%s' (cpu, cuda or auto)", name);
	const char *why = NULL;
	int n = bk_cuda_device_count(&why);
	if (!strcmp(name, "cuda")) {
		if (n <= 0)
			die("--device cuda: no usable GPU: %s", why);
		/* the CUDA ops table arrives with the CUDA training path */
		die("--device cuda: the CUDA compute path is not part of this build yet; "
		    "use --device cpu");
	}
	if (n > 0)
		warn("a GPU is present but the CUDA compute path is not part of this build "
		     "yet; using the host twin (cpu)");
	else
		fprintf(stderr, "%s: no GPU (%s); using the host twin (cpu)\n", bk_prog, why);
	return &bk_ops_host;
}
