/* harness.h - tiny unit-test harness: CHECK(cond, fmt...) records a failure and goes on;
 * each test binary returns bk_test_done() from main (non-zero if anything failed).
 * Test data paths are relative to the repository root (tests run from there). */
#ifndef BK_HARNESS_H
#define BK_HARNESS_H

#include <math.h>
#include <stdio.h>

extern int bk_test_failures, bk_test_checks;

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		bk_test_checks++;                                              \
		if (!(cond)) {                                                 \
			bk_test_failures++;                                    \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                          \
			fputc('\n', stderr);                                   \
		}                                                              \
	} while (0)

/* relative error |a-b| / max(|b|, floor); NaN in either is a failure (returns inf) */
double bk_relerr(double a, double b, double floor);
/* max relative error over arrays: max|a-b| / max(max|b|, floor) */
double bk_max_relerr(const float *a, const float *b, size_t n, double floor);
int bk_test_done(const char *name);

#endif
