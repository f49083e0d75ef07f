/* test_cuda_mode.cc - bk_cuda_env_mode (gpu/cuda/cuda_mode.h), the switch behind BK_LINEAR,
 * BK_LOSS, BK_ATTN and BK_DECODE (the CUDA kernels' old and new paths), compiled on the
 * CPU as the .cu files and the emulation tests compile it: unset, empty and the first
 * value give 1 (the default), the second value 2; the variable is read once per cache
 * (a later change is not seen until the cache is reset); any other value dies with the
 * one-line message each variable has always had (BK_LINEAR's with the value quoted). */
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "tests/harness.h"
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void bk_diag_init(const char *argv0);
}

#include "gpu/cuda/cuda_mode.h"

struct mode_case {
	const char *name, *first, *second;
	int quote;
};
static const mode_case cases[] = {
	{ "BK_LINEAR", "v1", "v2", 1 },
	{ "BK_LOSS", "v1", "v2", 0 },
	{ "BK_ATTN", "fp32", "tc", 0 },
	{ "BK_DECODE", "v1", "v2", 0 },
};

static int mode_with(const mode_case &c, const char *value)
{
	if (value)
		setenv(c.name, value, 1);
	else
		unsetenv(c.name);
	int mode = 0;
	return bk_cuda_env_mode(&mode, c.name, c.first, c.second, c.quote);
}

static const mode_case *bad_case;
static void bad_value(void *value) { mode_with(*bad_case, (const char *)value); }

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	for (const mode_case &c : cases) {
		CHECK(mode_with(c, NULL) == 1, "%s unset", c.name);
		CHECK(mode_with(c, "") == 1, "%s empty", c.name);
		CHECK(mode_with(c, c.first) == 1, "%s=%s", c.name, c.first);
		CHECK(mode_with(c, c.second) == 2, "%s=%s", c.name, c.second);

		// read once: the cached choice stands when the variable changes
		setenv(c.name, c.second, 1);
		int mode = 0;
		CHECK(bk_cuda_env_mode(&mode, c.name, c.first, c.second, c.quote) == 2, "%s",
		      c.name);
		setenv(c.name, "no such path", 1);
		CHECK(bk_cuda_env_mode(&mode, c.name, c.first, c.second, c.quote) == 2,
		      "%s read twice", c.name);
		mode = 0;
		unsetenv(c.name);
		CHECK(bk_cuda_env_mode(&mode, c.name, c.first, c.second, c.quote) == 1,
		      "%s after a reset", c.name);

		// anything else: the message of the variable (the text is what the .cu had)
		char want[160], what[64];
		const char *bads[] = { "v3", "V1", "tc ", "fp16" };
		for (const char *v : bads) {
			if (!strcmp(v, c.first) || !strcmp(v, c.second))
				continue;
			snprintf(want, sizeof want,
				 c.quote ? "%s='%s': expected %s (the default) or %s"
					 : "%s=%s: expected %s (the default) or %s",
				 c.name, v, c.first, c.second);
			snprintf(what, sizeof what, "%s=%s", c.name, v);
			bad_case = &c;
			bk_expect_die(what, bad_value, (void *)v, want, NULL);
		}
		unsetenv(c.name);
	}
	// the four messages spelled out, as tests and users see them
	bad_case = &cases[0];
	bk_expect_die("BK_LINEAR", bad_value, (void *)"x",
		      "BK_LINEAR='x': expected v1 (the default) or v2", NULL);
	bad_case = &cases[1];
	bk_expect_die("BK_LOSS", bad_value, (void *)"x",
		      "BK_LOSS=x: expected v1 (the default) or v2", NULL);
	bad_case = &cases[2];
	bk_expect_die("BK_ATTN", bad_value, (void *)"x",
		      "BK_ATTN=x: expected fp32 (the default) or tc", NULL);
	bad_case = &cases[3];
	bk_expect_die("BK_DECODE", bad_value, (void *)"x",
		      "BK_DECODE=x: expected v1 (the default) or v2", NULL);
	return bk_test_done("test_cuda_mode");
}
