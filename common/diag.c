/* diag.c - die/error/warn/BUG and checked allocation; see diag.h. */
#include "diag.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *bk_prog = "bakery";
int bk_verbose;
void (*bk_die_hook)(void);

#define BK_MAX_ATEXIT 8
static void (*atexit_fns[BK_MAX_ATEXIT])(void);
static int n_atexit;

void bk_diag_init(const char *argv0)
{
	if (argv0 && *argv0) {
		const char *s = strrchr(argv0, '/');
		bk_prog = s ? s + 1 : argv0;
	}
}

void bk_atexit(void (*fn)(void))
{
	if (n_atexit == BK_MAX_ATEXIT)
		BUG("too many exit handlers");
	atexit_fns[n_atexit++] = fn;
}

static void run_atexit(void)
{
	while (n_atexit > 0)
		atexit_fns[--n_atexit]();
}

static void vreport(const char *kind, const char *fmt, va_list ap)
{
	char buf[4096];
	vsnprintf(buf, sizeof buf, fmt, ap);
	/* one line: newlines inside a message would break log parsing */
	for (char *p = buf; *p; p++)
		if (*p == '\n')
			*p = ' ';
	fprintf(stderr, "%s: %s%s\n", bk_prog, kind, buf);
}

void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreport("error: ", fmt, ap);
	va_end(ap);
	if (bk_die_hook)
		bk_die_hook();
	run_atexit();
	exit(BK_EXIT_FAIL);
}

/* one line too, the pointer to --help at its end */
void die_usage(const char *fmt, ...)
{
	char buf[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	for (char *p = buf; *p; p++)
		if (*p == '\n')
			*p = ' ';
	fprintf(stderr, "%s: %s (try '%s --help')\n", bk_prog, buf, bk_prog);
	run_atexit();
	exit(BK_EXIT_USAGE);
}

void error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreport("error: ", fmt, ap);
	va_end(ap);
}

void warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreport("warning: ", fmt, ap);
	va_end(ap);
}

void note(const char *fmt, ...)
{
	if (!bk_verbose)
		return;
	va_list ap;
	va_start(ap, fmt);
	vreport("", fmt, ap);
	va_end(ap);
}

void bk_bug(const char *file, int line, const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s: BUG: %s:%d: %s\n", bk_prog, file, line, buf);
	run_atexit();
	abort();
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		die("out of memory (%zu bytes)", n);
	return p;
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	if (!p)
		die("out of memory (%zu x %zu bytes)", n, size);
	return p;
}

void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (!p)
		die("out of memory (%zu bytes)", n);
	return p;
}

char *xstrdup(const char *s)
{
	return xstrndup(s, strlen(s));
}

char *xstrndup(const char *s, size_t n)
{
	char *p = xmalloc(n + 1);
	memcpy(p, s, n);
	p[n] = 0;
	return p;
}

char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0)
		BUG("vsnprintf failed");
	char *p = xmalloc((size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(p, (size_t)n + 1, fmt, ap);
	va_end(ap);
	return p;
}
