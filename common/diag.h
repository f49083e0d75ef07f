/* diag.h - diagnostics for every bakery tool: one program name, fixed exit codes.
 * Human text goes to stderr, data to stdout.  Messages are lower case:
 *   bk-lens: error: data.json: record 12: key 'prompt' is not a string
 * die() is for bad input or environment; BUG() for broken invariants (always on). */
#ifndef BK_DIAG_H
#define BK_DIAG_H

#include <stdarg.h>
#include <stddef.h>

enum bk_exit {
	BK_EXIT_OK = 0,
	BK_EXIT_FAIL = 1,  /* bad input, failed I/O, refused stream */
	BK_EXIT_USAGE = 2, /* bad command line */
	BK_EXIT_BUG = 70,  /* internal error (EX_SOFTWARE) */
};

extern const char *bk_prog; /* set by bk_diag_init(argv[0]) */
extern int bk_verbose;     /* -v count */

void bk_diag_init(const char *argv0);
/* "s" unless n is 1, for counts in messages: "%llu batch%s", n, bk_s(n) */
static inline const char *bk_s(unsigned long long n) { return n == 1 ? "" : "s"; }
_Noreturn void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
_Noreturn void die_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void note(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* only with -v */
_Noreturn void bk_bug(const char *file, int line, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
#define BUG(...) bk_bug(__FILE__, __LINE__, __VA_ARGS__)
#define BUG_ON(c)                                                              \
	do {                                                                   \
		if (c)                                                         \
			BUG("%s", #c);                                         \
	} while (0)

/* Called by die() after printing and before exiting; a fuzz target sets it to a
 * function that longjmp()s back, so bad input ends one run instead of the fuzzer. */
extern void (*bk_die_hook)(void);

/* Run before exit: remove temporary files, etc.  Called by die() too. */
void bk_atexit(void (*fn)(void));

/* Allocation that dies on failure. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A growable array: BK_VEC(int) v = {0}; bk_vec_push(&v, 3); free(v.v); */
#define BK_VEC(T)                                                              \
	struct {                                                               \
		T *v;                                                          \
		size_t n, cap;                                                 \
	}
#define bk_vec_reserve(a, want)                                                \
	do {                                                                   \
		if ((want) > (a)->cap) {                                       \
			size_t c_ = (a)->cap ? (a)->cap * 2 : 16;              \
			while (c_ < (want))                                    \
				c_ *= 2;                                       \
			(a)->v = xrealloc((a)->v, c_ * sizeof(*(a)->v));       \
			(a)->cap = c_;                                         \
		}                                                              \
	} while (0)
#define bk_vec_push(a, x)                                                      \
	do {                                                                   \
		bk_vec_reserve((a), (a)->n + 1);                               \
		(a)->v[(a)->n++] = (x);                                        \
	} while (0)

#endif
