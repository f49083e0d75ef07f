/* harness.c - see harness.h. */
#include "harness.h"

int bk_test_failures, bk_test_checks;

double bk_relerr(double a, double b, double floor)
{
	if (isnan(a) || isnan(b) || isinf(a) || isinf(b))
		return INFINITY;
	double d = fabs(b) > floor ? fabs(b) : floor;
	return fabs(a - b) / d;
}

double bk_max_relerr(const float *a, const float *b, size_t n, double floor)
{
	double num = 0, den = floor;
	for (size_t i = 0; i < n; i++) {
		if (isnan(a[i]) || isnan(b[i]) || isinf(a[i]) || isinf(b[i]))
			return INFINITY;
		double d = fabs((double)a[i] - b[i]);
		if (d > num)
			num = d;
		if (fabs(b[i]) > den)
			den = fabs(b[i]);
	}
	return num / den;
}

int bk_test_done(const char *name)
{
	printf("%s: %d checks, %d failed\n", name, bk_test_checks, bk_test_failures);
	return bk_test_failures ? 1 : 0;
}
