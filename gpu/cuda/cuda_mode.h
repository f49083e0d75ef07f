// cuda_mode.h - the switch an environment variable makes between a CUDA kernel path that
// stays the default until a GPU run validates the other one: BK_LINEAR (cuda_ops.cu),
// BK_LOSS (cuda_loss.cu), BK_ATTN (cuda_attention_tc.cu), BK_DECODE (cuda_gen.cu).
// Host C++ only; included by cuda_common.cuh (which declares die() first) and by
// tests/unit/test_cuda_mode.cc.
#ifndef BK_CUDA_MODE_H
#define BK_CUDA_MODE_H

#include <stdlib.h>
#include <string.h>

// *mode caches the choice: 0 = not read yet, then 1 = `first` (also when `name` is unset
// or empty), 2 = `second`; any other value dies "NAME=value: expected first (the
// default) or second" (the value in single quotes where quote_value is set: BK_LINEAR's
// message).  Returns *mode.  The environment does not change during a run, so the
// variable is read once per cache.
static inline int bk_cuda_env_mode(int *mode, const char *name, const char *first,
				   const char *second, int quote_value)
{
	if (!*mode) {
		const char *e = getenv(name);
		if (!e || !*e || !strcmp(e, first))
			*mode = 1;
		else if (!strcmp(e, second))
			*mode = 2;
		else if (quote_value)
			die("%s='%s': expected %s (the default) or %s", name, e, first, second);
		else
			die("%s=%s: expected %s (the default) or %s", name, e, first, second);
	}
	return *mode;
}

#endif
