/* hubdata.c - hub datasets as `datasets` reads them: split specs, the files of a
 * split, and their rows into a bk_dataset (see hubdata.h for the rules). */
#include "formats/hubdata.h"
#include "common/diag.h"
#include "common/files.h"
#include "formats/hub.h"
#include "formats/parquet.h"

#include <ctype.h>
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

/* ---- split specs ---- */

static int word_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* -?digits with single '_' between digits (Python's int()); *s advanced */
static int parse_int(const char **s, int64_t *v)
{
	const char *p = *s;
	int neg = 0;
	if (*p == '-')
		neg = 1, p++;
	if (!isdigit((unsigned char)*p))
		return 0;
	int64_t x = 0;
	for (;;) {
		if (isdigit((unsigned char)*p)) {
			if (x > (INT64_MAX - 9) / 10)
				return 0;
			x = x * 10 + (*p++ - '0');
		} else if (*p == '_' && isdigit((unsigned char)p[1])) {
			p++;
		} else {
			break;
		}
	}
	*v = neg ? -x : x;
	*s = p;
	return 1;
}

static int part_parse(const char *s, size_t len, bk_split_part *pt, char *err, size_t errlen)
{
	char *buf = xstrndup(s, len);
	const char *p = buf;
	memset(pt, 0, sizeof *pt);
	/* NAME = \w+(\.\w+)* */
	const char *n0 = p;
	for (;;) {
		if (!word_char(*p))
			goto bad;
		while (word_char(*p))
			p++;
		if (*p == '.' && word_char(p[1]))
			p++;
		else
			break;
	}
	pt->split = xstrndup(n0, (size_t)(p - n0));
	if (*p == '[') {
		p++;
		int fpct = 0, tpct = 0;
		if (*p != ':') {
			if (!parse_int(&p, &pt->from))
				goto bad;
			pt->has_from = 1;
			if (*p == '%')
				fpct = 1, p++;
		}
		if (*p++ != ':')
			goto bad;
		if (*p != ']') {
			if (!parse_int(&p, &pt->to))
				goto bad;
			pt->has_to = 1;
			if (*p == '%')
				tpct = 1, p++;
		}
		if (*p++ != ']')
			goto bad;
		pt->pct = fpct || tpct;
	}
	int rounding_given = 0;
	if (*p == '(') {
		const char *r = ++p;
		while (*p && *p != ')')
			p++;
		if (*p != ')')
			goto bad;
		size_t rl = (size_t)(p - r);
		p++;
		rounding_given = 1;
		if (rl == 7 && !strncmp(r, "closest", 7))
			pt->rounding = BK_ROUND_CLOSEST;
		else if (rl == 18 && !strncmp(r, "pct1_dropremainder", 18))
			pt->rounding = BK_ROUND_PCT1;
		else {
			snprintf(err, errlen, "rounding must be closest or pct1_dropremainder");
			goto fail;
		}
	}
	if (*p)
		goto bad;
	if (rounding_given && !pt->pct) {
		snprintf(err, errlen, "a rounding is only allowed with percent slicing");
		goto fail;
	}
	if (pt->pct && ((pt->has_from && llabs(pt->from) > 100) ||
			(pt->has_to && llabs(pt->to) > 100))) {
		snprintf(err, errlen, "percent slice boundaries must be within -100%% and 100%%");
		goto fail;
	}
	free(buf);
	return 0;
bad:
	snprintf(err, errlen, "'%.*s' is not SPLIT, SPLIT[FROM:TO] or SPLIT[FROM%%:TO%%]",
		 (int)(len > 200 ? 200 : len), s);
fail:
	free(pt->split);
	pt->split = NULL;
	free(buf);
	return -1;
}

static int is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' ||
				      c == '\f' || c == '\v'; }

int bk_split_parse(const char *spec, bk_split_spec *out, char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	BK_VEC(bk_split_part) v = {0};
	const char *p = spec;
	for (;;) {
		/* a part ends at the blanks before a '+', or at the end */
		const char *e = p;
		while (*e && *e != '+')
			e++;
		const char *pe = e;
		if (*e == '+')
			while (pe > p && is_blank(pe[-1]))
				pe--;
		bk_split_part pt;
		if (part_parse(p, (size_t)(pe - p), &pt, err, errlen)) {
			out->v = v.v, out->n = v.n;
			bk_split_free(out);
			return -1;
		}
		bk_vec_push(&v, pt);
		if (!*e)
			break;
		p = e + 1;
		while (is_blank(*p))
			p++;
	}
	/* datasets refuses to add percent parts of different roundings */
	for (size_t i = 1; i < v.n; i++)
		if (v.v[0].pct && v.v[i].pct && v.v[0].rounding != v.v[i].rounding) {
			snprintf(err, errlen, "the parts of a split use different roundings");
			out->v = v.v, out->n = v.n;
			bk_split_free(out);
			return -1;
		}
	out->v = v.v;
	out->n = v.n;
	return 0;
}

void bk_split_free(bk_split_spec *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i].split);
	free(s->v);
	memset(s, 0, sizeof *s);
}

static int64_t pct_to_abs(const bk_split_part *p, int64_t b, int64_t n)
{
	if (p->rounding == BK_ROUND_PCT1)
		return b * (int64_t)trunc((double)n / 100.0);
	return (int64_t)nearbyint((double)(b * n) / 100.0); /* Python round(): half to even */
}

int bk_split_bounds(const bk_split_part *p, int64_t n, int64_t *from, int64_t *to, char *err,
		    size_t errlen)
{
	int64_t f, t;
	if (p->pct) {
		if (p->rounding == BK_ROUND_PCT1 && n < 100) {
			snprintf(err, errlen,
				 "pct1_dropremainder rounding on a split of fewer than 100 rows "
				 "(%lld) selects nothing", (long long)n);
			return -1;
		}
		f = p->has_from ? pct_to_abs(p, p->from, n) : 0;
		t = p->has_to ? pct_to_abs(p, p->to, n) : n;
	} else {
		f = p->has_from ? p->from : 0;
		t = p->has_to ? p->to : n;
	}
	if (f < 0)
		f = n + f < 0 ? 0 : n + f;
	if (t < 0)
		t = n + t < 0 ? 0 : n + t;
	*from = f < n ? f : n;
	*to = t < n ? t : n;
	return 0;
}

/* ---- the files of a split ---- */

static int data_ext(const char *path)
{
	static const char *const exts[] = {".parquet", ".jsonl", ".ndjson", ".json", NULL};
	const char *slash = strrchr(path, '/');
	const char *dot = strrchr(slash ? slash + 1 : path, '.');
	if (!dot)
		return 0;
	for (int i = 0; exts[i]; i++)
		if (!strcasecmp(dot, exts[i]))
			return 1;
	return 0;
}

/* data/NAME-DDDDD-of-DDDDD...: the length of NAME, or 0 */
static size_t sharded_name(const char *path)
{
	if (strncmp(path, "data/", 5))
		return 0;
	const char *b = path + 5;
	if (strchr(b, '/'))
		return 0;
	for (const char *d = strchr(b, '-'); d; d = strchr(d + 1, '-')) {
		const char *q = d + 1;
		int ok = 1;
		for (int i = 0; i < 5 && ok; i++)
			ok = isdigit((unsigned char)q[i]);
		ok = ok && !strncmp(q + 5, "-of-", 4);
		for (int i = 0; i < 5 && ok; i++)
			ok = isdigit((unsigned char)q[9 + i]);
		if (ok && d > b)
			return (size_t)(d - b);
	}
	return 0;
}

/* data/NAME-KKKKK-of-MMMMM...: 1 with *k and *m set, else 0 */
static int shard_info(const char *path, long *k, long *m)
{
	size_t nl = sharded_name(path);
	if (!nl)
		return 0;
	const char *q = path + 5 + nl + 1;
	*k = strtol(q, NULL, 10);
	*m = strtol(q + 9, NULL, 10);
	return 1;
}

static int sep_char(char c) { return c && strchr("-._ 0123456789", c); }

static int in_split(const char *path, const char *split)
{
	size_t sl = strlen(split);
	/* a directory named split */
	for (const char *p = path;;) {
		const char *slash = strchr(p, '/');
		if (!slash)
			break;
		if ((size_t)(slash - p) == sl && !strncmp(p, split, sl))
			return 1;
		p = slash + 1;
	}
	const char *base = strrchr(path, '/');
	base = base ? base + 1 : path;
	for (const char *q = strstr(base, split); q; q = strstr(q + 1, split))
		if ((q == base || sep_char(q[-1])) && sep_char(q[sl]))
			return 1;
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

char **bk_split_files(const char *const *paths, size_t n, const char *split, size_t *nout,
		      char **names)
{
	BK_VEC(char *) out = {0};
	BK_VEC(char) nm = {0};
	int sharded = 0;
	*names = NULL;
	for (size_t i = 0; i < n; i++)
		if (data_ext(paths[i]) && sharded_name(paths[i]))
			sharded = 1;
	for (size_t i = 0; i < n; i++) {
		const char *p = paths[i];
		if (!data_ext(p))
			continue;
		if (sharded) {
			size_t k = sharded_name(p);
			if (!k)
				continue;
			/* remember the split name for messages */
			char *name = xstrndup(p + 5, k);
			int seen = 0;
			for (const char *q = nm.v; q && q < nm.v + nm.n; q += strlen(q) + 1)
				seen |= !strcmp(q, name);
			if (!seen)
				for (size_t j = 0; j <= k; j++)
					bk_vec_push(&nm, name[j]);
			int hit = strlen(split) == k && !strcmp(name, split);
			free(name);
			if (!hit)
				continue;
		} else if (!in_split(p, split)) {
			continue;
		}
		bk_vec_push(&out, xstrdup(p));
	}
	if (nm.n) { /* "a\0b\0" -> "a, b" */
		BK_VEC(char) s = {0};
		for (const char *q = nm.v; q < nm.v + nm.n; q += strlen(q) + 1) {
			if (s.n) {
				bk_vec_push(&s, ',');
				bk_vec_push(&s, ' ');
			}
			for (const char *c = q; *c; c++)
				bk_vec_push(&s, *c);
		}
		bk_vec_push(&s, 0);
		*names = s.v;
	}
	free(nm.v);
	if (out.n)
		qsort(out.v, out.n, sizeof *out.v, cmp_str);
	*nout = out.n;
	return out.v;
}

int bk_hub_dataset_id(const char *s)
{
	static const char *const exts[] = {".parquet", ".jsonl", ".ndjson", ".json", ".txt",
					   ".csv", ".tsv", NULL};
	if (!bk_hub_is_id(s) || !strchr(s, '/'))
		return 0;
	size_t n = strlen(s);
	for (int i = 0; exts[i]; i++)
		if (n >= strlen(exts[i]) && !strcasecmp(s + n - strlen(exts[i]), exts[i]))
			return 0;
	return 1;
}

/* ---- rows ---- */

static int has_ext(const char *path, const char *ext)
{
	size_t n = strlen(path), e = strlen(ext);
	return n >= e && !strcasecmp(path + n - e, ext);
}

/* One file of a split: its row count, and its rows in [from, to) appended to ds. */
typedef struct {
	const char *path;   /* on disk */
	const char *name;   /* in messages: "Org/Name: data/x.parquet" */
	bk_parquet *pq;     /* parquet files */
	json_t *rows;       /* JSON / JSON Lines files */
	int64_t n;
} split_file;

static void file_open(split_file *f)
{
	if (has_ext(f->path, ".parquet")) {
		f->pq = bk_parquet_open(f->path);
		f->n = bk_parquet_num_rows(f->pq);
		return;
	}
	size_t len;
	char *buf = bk_read_file(f->path, &len);
	f->rows = bk_dataset_json_rows(f->name, buf, len);
	free(buf);
	f->n = (int64_t)json_array_size(f->rows);
}

static void file_close(split_file *f)
{
	bk_parquet_close(f->pq);
	json_decref(f->rows);
	f->pq = NULL, f->rows = NULL;
}

/* The columns the tool reads of a hub dataset's row (bakery-py data.py _load_hf):
 * messages, else the first present of its prompt and response columns.  Not a row's
 * "system", "conversations" or "user_message" (local files only), nor the system
 * messages of a chat (the tool pairs user and assistant turns only). */
static const char *const hub_columns[] = {
	"messages", "prompt", "input", "question", "text", "instruction",
	"response", "completion", "output", "answer", "target", NULL,
};

/* row as the tool sees it: other keys dropped, system messages out of messages */
static void tool_row(json_t *row)
{
	if (!json_is_object(row))
		return;
	const char *k;
	void *tmp;
	json_t *v;
	json_object_foreach_safe(row, tmp, k, v) {
		size_t i = 0;
		while (hub_columns[i] && strcmp(hub_columns[i], k))
			i++;
		if (!hub_columns[i])
			json_object_del(row, k);
	}
	json_t *msgs = json_object_get(row, "messages");
	for (size_t i = json_array_size(msgs); i-- > 0;) {
		json_t *r = json_object_get(json_array_get(msgs, i), "role");
		if (json_is_string(r) && !strcmp(json_string_value(r), "system"))
			json_array_remove(msgs, i);
	}
}

static void file_rows(bk_dataset *ds, split_file *f, int64_t from, int64_t to)
{
	if (f->rows) {
		for (int64_t i = from; i < to; i++) {
			json_t *row = json_array_get(f->rows, (size_t)i);
			tool_row(row);
			bk_dataset_add_row(ds, f->name, "row", (size_t)i + 1, row);
		}
		return;
	}
	int64_t base = 0;
	for (size_t g = 0; g < bk_parquet_num_row_groups(f->pq) && base < to; g++) {
		int64_t gn = bk_parquet_row_group_rows(f->pq, g);
		if (base + gn > from) {
			int64_t a = from > base ? from - base : 0;
			int64_t b = to < base + gn ? to - base : gn;
			json_t *rows = bk_parquet_read_rows(f->pq, g, a, b - a, hub_columns);
			for (size_t i = 0; i < json_array_size(rows); i++) {
				json_t *row = json_array_get(rows, i);
				tool_row(row);
				bk_dataset_add_row(ds, f->name, "row",
						   (size_t)(base + a) + i + 1, row);
			}
			json_decref(rows);
		}
		base += gn;
	}
}

/* the data files under dir, relative, recursively (symlinks followed; dot names
 * skipped) */
typedef BK_VEC(char *) strvec;

static void walk(const char *dir, const char *rel, strvec *out, int depth)
{
	if (depth > 16)
		return;
	char *full = *rel ? bk_path_join(dir, rel) : xstrdup(dir);
	DIR *d = opendir(full);
	if (!d)
		die("%s: cannot read the directory: %m", full);
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char *r = *rel ? xasprintf("%s/%s", rel, e->d_name) : xstrdup(e->d_name);
		char *p = bk_path_join(dir, r);
		struct stat st;
		if (!stat(p, &st) && S_ISDIR(st.st_mode))
			walk(dir, r, out, depth + 1);
		else if (!stat(p, &st) && S_ISREG(st.st_mode) && data_ext(r))
			bk_vec_push(out, xstrdup(r));
		free(p);
		free(r);
	}
	closedir(d);
	free(full);
}

typedef struct {
	const char *what, *dir;
	char **paths; /* repo paths of the repo's data files */
	size_t npaths;
	/* online hub repos: fetch a file before reading it */
	const char *id, *commit;
} repo_ctx;

/* The split being read, reachable from here while a die() may happen (a bad row, a
 * missing shard): die() exits with it allocated, and LeakSanitizer (make asan) calls
 * a block whose only pointer was in a clobbered register a leak. */
static split_file *volatile live_files;
static char **volatile live_paths;
static char *volatile live_names;

/* fetches (hub) and opens one file of a split */
static void open_split_file(const repo_ctx *r, split_file *f, const char *file)
{
	f->path = r->id ? bk_hub_file(BK_HUB_DATASET, r->id, r->commit, file, 0)
			: bk_path_join(r->dir, file);
	file_open(f);
}

static void load_spec(bk_dataset *ds, repo_ctx *r, const char *spec)
{
	char err[512];
	bk_split_spec sp;
	if (bk_split_parse(spec, &sp, err, sizeof err))
		die("%s: split '%s': %s", r->what, spec, err);
	size_t n0 = ds->n;
	for (size_t k = 0; k < sp.n; k++) {
		const bk_split_part *pt = &sp.v[k];
		size_t nf;
		char *names;
		char **files = bk_split_files((const char *const *)r->paths, r->npaths, pt->split,
					      &nf, &names);
		live_paths = files, live_names = names;
		if (!nf)
			die("%s: no data files for split '%s'%s%s%s", r->what, pt->split,
			    names ? " (its splits: " : "", names ? names : "", names ? ")" : "");
		live_names = NULL;
		free(names);
		/* a sharded split must be whole from its first shard up to what is read:
		 * a cache read offline may hold only the shards an earlier slice needed */
		long shards = -1, k, m;
		size_t have = 0;
		while (have < nf && shard_info(files[have], &k, &m) && k == (long)have)
			have++;
		if (have == nf && nf && shard_info(files[0], &k, &m) && m != (long)nf)
			shards = m;
		else if (have != nf && shard_info(files[0], &k, &m))
			die("%s: split '%s': its shards are not 0, 1, ... of %ld (%s)", r->what,
			    pt->split, m, files[have < nf ? have : 0]);
		split_file *f = xcalloc(nf, sizeof *f);
		live_files = f;
		for (size_t i = 0; i < nf; i++)
			f[i].name = xasprintf("%s: %s", r->what, files[i]);
		/* the total is needed for percent and negative bounds and an open end;
		 * otherwise files after the slice are not even fetched */
		int need_total = pt->pct || !pt->has_to || pt->to < 0 ||
				 (pt->has_from && pt->from < 0);
		int64_t total = 0, from, to;
		for (size_t i = 0; i < nf && need_total; i++) {
			open_split_file(r, &f[i], files[i]);
			total += f[i].n;
			if (f[i].rows) /* JSON rows stay in memory only while needed */
				file_close(&f[i]);
		}
		if (shards >= 0 && need_total)
			die("%s: split '%s' has %ld shards, %zu of them here (a cache read offline "
			    "holds those earlier reads fetched: read it online once)", r->what,
			    pt->split, shards, nf);
		if (need_total) {
			if (bk_split_bounds(pt, total, &from, &to, err, sizeof err))
				die("%s: split '%s': %s", r->what, spec, err);
			note("%s: split %s: rows [%lld, %lld) of %lld in %zu file%s", r->what,
			     pt->split, (long long)from, (long long)to, (long long)total, nf,
			     bk_s(nf));
		} else {
			from = pt->has_from ? pt->from : 0;
			to = pt->to;
		}
		int64_t base = 0;
		for (size_t i = 0; i < nf && base < to; i++) {
			if (!f[i].path)
				open_split_file(r, &f[i], files[i]);
			else if (!f[i].pq && !f[i].rows)
				file_open(&f[i]);
			int64_t a = from > base ? from - base : 0;
			int64_t b = to < base + f[i].n ? to - base : f[i].n;
			if (a < b)
				file_rows(ds, &f[i], a, b);
			base += f[i].n;
			file_close(&f[i]);
		}
		if (shards >= 0 && base < to)
			die("%s: split '%s' has %ld shards, %zu of them here, and rows up to %lld "
			    "are asked for (a cache read offline holds those earlier reads fetched: "
			    "read it online once)", r->what, pt->split, shards, nf, (long long)to);
		for (size_t i = 0; i < nf; i++) {
			file_close(&f[i]);
			free((char *)f[i].path);
			free((char *)f[i].name);
			free(files[i]);
		}
		live_files = NULL, live_paths = NULL;
		free(f);
		free(files);
	}
	bk_split_free(&sp);
	if (ds->n == n0)
		die("%s: split '%s': no samples", r->what, spec);
}

static void free_paths(repo_ctx *r)
{
	for (size_t i = 0; i < r->npaths; i++)
		free(r->paths[i]);
	free(r->paths);
}

void bk_dataset_load_dir(bk_dataset *ds, const char *what, const char *dir, const char *spec)
{
	strvec paths = {0};
	walk(dir, "", &paths, 0);
	repo_ctx r = {.what = what, .dir = dir, .paths = paths.v, .npaths = paths.n};
	load_spec(ds, &r, spec);
	free_paths(&r);
}

void bk_dataset_load_hub(bk_dataset *ds, const char *id, const char *revision,
			 const char *spec)
{
	if (bk_hub_offline()) {
		char *snap = bk_hub_snapshot(BK_HUB_DATASET, id, revision, NULL);
		bk_dataset_load_dir(ds, id, snap, spec);
		free(snap);
		return;
	}
	bk_hub_listing l;
	bk_hub_list(BK_HUB_DATASET, id, revision, &l);
	char **paths = xcalloc(l.n ? l.n : 1, sizeof *paths);
	for (size_t i = 0; i < l.n; i++)
		paths[i] = xstrdup(l.v[i].path);
	repo_ctx r = {.what = id, .paths = paths, .npaths = l.n, .id = id, .commit = l.commit};
	load_spec(ds, &r, spec);
	free_paths(&r);
	bk_hub_listing_free(&l);
}
