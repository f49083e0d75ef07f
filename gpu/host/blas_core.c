/* blas_core.c - see blas_core.h. */
#include "gpu/host/blas_core.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char *bk_blas_core_fix(void)
{
	static int done;
	static const char *chosen;
	if (done)
		return chosen;
	done = 1;
	if (getenv("OPENBLAS_CORETYPE"))
		return NULL;
	char *(*corename)(void) = (char *(*)(void))dlsym(RTLD_DEFAULT, "openblas_get_corename");
	void (*quit)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit");
	void (*init)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init");
	if (!corename || !quit || !init)
		return NULL;
	const char *c = corename();
	static const char *const generic[] = { "Prescott", "Core2", "Penryn", "Dunnington",
					       "Nehalem", "Katmai", "Coppermine", "Northwood",
					       "Banias", "Atom" };
	int is_generic = 0;
	for (size_t i = 0; c && i < sizeof(generic) / sizeof(*generic); i++)
		is_generic |= !strcasecmp(c, generic[i]);
	if (!is_generic)
		return NULL;
	__builtin_cpu_init();
	const char *want = NULL;
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
	    __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
		want = "SkylakeX";
	else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
		want = "Haswell";
	if (!want)
		return NULL;
	setenv("OPENBLAS_CORETYPE", want, 0);
	quit();
	init();
	return chosen = want;
}
