/* flags.h - table-driven command-line parsing shared by every tool.
 * Accepts "--name value", "--name=value", "-x value" and "--" ; "-" is a positional
 * (stdin).  Numbers are validated; a bad one is a usage error naming the flag.
 * --help prints the usage text to stdout and exits 0; --version prints the version. */
#ifndef BK_FLAGS_H
#define BK_FLAGS_H

#include <stdint.h>

typedef enum {
	BK_OPT_FLAG,   /* int*, set to 1 (counted for -v) */
	BK_OPT_INT,    /* long* */
	BK_OPT_DOUBLE, /* double* */
	BK_OPT_STR,    /* const char** (points into argv) */
	BK_OPT_LIST,   /* bk_strlist*: repeatable */
} bk_opt_type;

typedef struct {
	const char **v;
	int n;
} bk_strlist;

typedef struct {
	const char *name; /* long name without "--" */
	char shortname;   /* 0 if none */
	bk_opt_type type;
	void *dst;
	long min, max; /* for BK_OPT_INT when min < max */
} bk_opt;

#define BK_VERSION "0.1.0"

/* Parses argv in place: options are consumed, positionals are compacted to argv[0..n)
 * (argv[0] itself is dropped); returns n.  usage is printed for --help. */
int bk_flags_parse(int argc, char **argv, const bk_opt *opts, const char *usage);
/* Was the option given on the command line (by long name)? */
int bk_flag_given(const char *name);

#endif
