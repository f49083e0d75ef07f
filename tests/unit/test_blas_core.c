/* test_blas_core.c - gpu/host/blas_core.c: where OpenBLAS fell back to a generic
 * pre-AVX core on a CPU with AVX2 + FMA or AVX-512, bk_blas_core_fix() switches it to
 * SkylakeX or Haswell (openblas_get_corename says so, OPENBLAS_CORETYPE is set for
 * children), and sgemm after the switch still computes the product (against a double
 * loop, 1e-5 relative).  Elsewhere it must leave the library alone (NULL). */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "gpu/host/blas_core.h"
#include "tests/harness.h"

char *openblas_get_corename(void);

int main(void)
{
	int had_env = getenv("OPENBLAS_CORETYPE") != NULL;
	char before[64];
	snprintf(before, sizeof before, "%s", openblas_get_corename());
	const char *c = bk_blas_core_fix();
	const char *after = openblas_get_corename();
	fprintf(stderr, "test_blas_core: OpenBLAS core %s -> %s (%s)\n", before, after,
		c ? c : "left alone");
	if (had_env)
		CHECK(!c && !strcmp(before, after), "OPENBLAS_CORETYPE set, yet switched to %s", c);
	if (c) {
		CHECK(!strcasecmp(after, c), "asked for %s, OpenBLAS runs %s", c, after);
		CHECK(getenv("OPENBLAS_CORETYPE") && !strcmp(getenv("OPENBLAS_CORETYPE"), c),
		      "OPENBLAS_CORETYPE not set for children");
	} else {
		CHECK(!strcmp(before, after), "left alone, yet the core changed %s -> %s", before,
		      after);
	}
	CHECK(bk_blas_core_fix() == c, "a second call answers differently");
	enum { M = 67, N = 45, K = 129 };
	float *a = xmalloc(M * K * sizeof(float)), *b = xmalloc(K * N * sizeof(float)),
	      *y = xmalloc(M * N * sizeof(float));
	for (int i = 0; i < M * K; i++)
		a[i] = (float)((i * 37 % 101) - 50) / 64.0f;
	for (int i = 0; i < K * N; i++)
		b[i] = (float)((i * 53 % 97) - 48) / 32.0f;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f,
		    y, N);
	double worst = 0;
	for (int i = 0; i < M; i++)
		for (int j = 0; j < N; j++) {
			double s = 0;
			for (int k = 0; k < K; k++)
				s += (double)a[i * K + k] * b[k * N + j];
			double e = bk_relerr(y[i * N + j], s, 1.0);
			worst = e > worst ? e : worst;
		}
	CHECK(worst < 1e-5, "sgemm after the switch: relative error %g", worst);
	free(a);
	free(b);
	free(y);
	return bk_test_done("test_blas_core");
}
