/* flags.c - see flags.h. */
#include "flags.h"
#include "diag.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GIVEN 64
static const char *given[MAX_GIVEN];
static int n_given;

int bk_flag_given(const char *name)
{
	for (int i = 0; i < n_given; i++)
		if (!strcmp(given[i], name))
			return 1;
	return 0;
}

static void set_value(const bk_opt *o, const char *val)
{
	char *end;
	switch (o->type) {
	case BK_OPT_INT: {
		errno = 0;
		long v = strtol(val, &end, 10);
		if (errno || end == val || *end)
			die_usage("option '--%s' wants an integer, not '%s'", o->name, val);
		if (o->min < o->max && (v < o->min || v > o->max))
			die_usage("option '--%s' must be in [%ld, %ld], not %ld", o->name,
				  o->min, o->max, v);
		*(long *)o->dst = v;
		break;
	}
	case BK_OPT_DOUBLE: {
		errno = 0;
		double v = strtod(val, &end);
		if (errno || end == val || *end || !isfinite(v))
			die_usage("option '--%s' wants a number, not '%s'", o->name, val);
		*(double *)o->dst = v;
		break;
	}
	case BK_OPT_STR:
		*(const char **)o->dst = val;
		break;
	case BK_OPT_LIST: {
		bk_strlist *l = o->dst;
		l->v = xrealloc(l->v, sizeof(*l->v) * (size_t)(l->n + 1));
		l->v[l->n++] = val;
		break;
	}
	case BK_OPT_FLAG:
		BUG("flag with value");
	}
}

int bk_flags_parse(int argc, char **argv, const bk_opt *opts, const char *usage)
{
	int npos = 0, only_pos = 0;
	for (int i = 1; i < argc; i++) {
		char *a = argv[i];
		if (only_pos || a[0] != '-' || !a[1]) {
			argv[npos++] = a;
			continue;
		}
		if (!strcmp(a, "--")) {
			only_pos = 1;
			continue;
		}
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			fputs(usage, stdout);
			exit(0);
		}
		if (!strcmp(a, "--version")) {
			printf("%s %s\n", bk_prog, BK_VERSION);
			exit(0);
		}
		const bk_opt *o = NULL;
		const char *val = NULL;
		if (a[1] == '-') {
			const char *name = a + 2;
			const char *eq = strchr(name, '=');
			size_t len = eq ? (size_t)(eq - name) : strlen(name);
			for (const bk_opt *p = opts; p->name; p++)
				if (strlen(p->name) == len && !strncmp(p->name, name, len))
					o = p;
			if (!o)
				die_usage("unknown option '--%.*s'", (int)len, name);
			if (eq)
				val = eq + 1;
		} else {
			if (a[2])
				die_usage("unknown option '%s' (long options take two dashes)", a);
			for (const bk_opt *p = opts; p->name; p++)
				if (p->shortname == a[1])
					o = p;
			if (!o)
				die_usage("unknown option '%s'", a);
		}
		if (n_given < MAX_GIVEN)
			given[n_given++] = o->name;
		if (o->type == BK_OPT_FLAG) {
			if (val)
				die_usage("option '--%s' takes no value", o->name);
			(*(int *)o->dst)++;
			continue;
		}
		if (!val) {
			if (i + 1 >= argc)
				die_usage("option '--%s' needs a value", o->name);
			val = argv[++i];
		}
		set_value(o, val);
	}
	return npos;
}
