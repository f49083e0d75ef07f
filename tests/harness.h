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

/* Runs fn(arg) in a forked child with its stderr captured into err (NUL-terminated);
 * returns the child's exit status, 128 + the signal when one killed it.  Leak checks
 * are off in the child: what die() leaves allocated at exit is not a leak. */
int bk_run_child(void (*fn)(void *), void *arg, char *err, size_t errlen);
/* fn(arg) must die: exit status 1 and exactly one line on stderr, containing s1 and s2
 * when they are not NULL.  Records failures with CHECK, naming what. */
void bk_expect_die(const char *what, void (*fn)(void *), void *arg, const char *s1,
		   const char *s2);
/* the same with exit status `status` (2: a usage error, die_usage) */
void bk_expect_exit(const char *what, int status, void (*fn)(void *), void *arg,
		    const char *s1, const char *s2);

#endif
