/* harness.c - see harness.h. */
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define BK_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BK_LSAN 1
#endif
#endif
#ifdef BK_LSAN
#include <sanitizer/lsan_interface.h>
#endif

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

int bk_run_child(void (*fn)(void *), void *arg, char *err, size_t errlen)
{
	int fd[2];
	if (pipe(fd))
		abort();
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		abort();
	if (pid == 0) {
#ifdef BK_LSAN
		__lsan_disable();
#endif
		close(fd[0]);
		dup2(fd[1], 2);
		fn(arg);
		_exit(0);
	}
	close(fd[1]);
	size_t n = 0;
	ssize_t r;
	while (n + 1 < errlen && (r = read(fd[0], err + n, errlen - 1 - n)) > 0)
		n += (size_t)r;
	err[n] = 0;
	close(fd[0]);
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void bk_expect_die(const char *what, void (*fn)(void *), void *arg, const char *s1,
		   const char *s2)
{
	bk_expect_exit(what, 1, fn, arg, s1, s2);
}

void bk_expect_exit(const char *what, int status, void (*fn)(void *), void *arg,
		    const char *s1, const char *s2)
{
	char buf[4096];
	int st = bk_run_child(fn, arg, buf, sizeof buf);
	size_t n = strlen(buf);
	int lines = 0;
	for (size_t i = 0; i < n; i++)
		lines += buf[i] == '\n';
	/* tests/run.sh gives ASan/LSan exit 86 and UBSan 87, so a sanitizer report on the
	 * error path is no expected death */
	CHECK(st == status, "%s: exit status %d (want %d)%s, stderr: %s", what, st, status,
	      st == 86 || st == 87 ? " (a sanitizer error)" : "", buf);
	CHECK(lines == 1 && n && buf[n - 1] == '\n', "%s: %d lines: %s", what, lines, buf);
	CHECK(!s1 || strstr(buf, s1), "%s: message lacks '%s': %s", what, s1, buf);
	CHECK(!s2 || strstr(buf, s2), "%s: message lacks '%s': %s", what, s2, buf);
}
