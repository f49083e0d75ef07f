/* hubdata.c - hub datasets as `datasets` reads them: split specs, the files of a
 * split, and their rows into a bk_dataset (see hubdata.h for the rules). */
#include "formats/hubdata.h"
#include "common/diag.h"
#include "common/files.h"
#include "formats/hub.h"
#include "formats/parquet.h"

#include <ctype.h>
#include <dirent.h>
#include <fnmatch.h>
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

/* datasets' _ALL_ALLOWED_EXTENSIONS (datasets 5.2.0, load.py): a file is a data file
 * when one of the dot-separated parts of its name after the first is one of these
 * (case as written: "TRAIN.JSON" is none) */
static const char allowed_exts[] =
	" 3G2 3GP 3g2 3gp AIFF APNG ASF AU AVI AVR BLP BMP BUFR BW CAF CUR DCX DDS DIB EMF ENT "
	"EPS F4V FIT FITS FLAC FLC FLI FLV FTC FTU GBR GIF GLB GLTF GRIB HTK ICB ICNS ICO IIM "
	"IM IRCAM J2C J2K JFIF JP2 JPC JPE JPEG JPF JPG JPX M4V MAT4 MAT5 MKV MOV MP3 MP4 "
	"MPC2K MPEG MPG MSP MXF NII NIST NUT OGG OGM OPUS PAF PBM PCD PCX PDB PDF PGM PLY PNG "
	"PNM PPM PS PSD PVF PXR RAS RAW RF64 RGB RGBA SD2 SDS SGI STL SVX TGA TIF TIFF VDA "
	"VOC VST W64 WAV WAVEX WEBM WEBP WMA WMF WMV WVE XBM XI XPM afa aiff apng arrow asf "
	"au avi avr blp bmp bufr bw caf cif conll conllu csv cur dcx dds dib emf ent eps eval "
	"f4v fa faa fasta fastq ffn fit fits flac flc fli flv fna fq frn ftc ftu gb gbk gbr "
	"genbank geoparquet gif glb gltf gpq grib h5 hdf5 htk icb icns ico idx iim im ircam "
	"j2c j2k jfif jp2 jpc jpe jpeg jpf jpg jpx json jsonl lance m4v manifest mat4 mat5 md "
	"mkv mmcif mov mp3 mp4 mpc2k mpeg mpg msp mxf ndjson nii nist nut ogg ogm opus paf "
	"parquet pbm pcd pcx pdb pdf pgm ply png pnm ppm ps psd pvf pxr ras raw rf64 rgb rgba "
	"sd2 sds sgi stl svx tar tga tif tiff toml tsfile tsv txn txt vda voc vortex vst w64 "
	"wav wavex webm webp wma wmf wmv wve xbm xi xml xpm zip ";

static const char *base_name(const char *path)
{
	const char *b = strrchr(path, '/');
	return b ? b + 1 : path;
}

static int datasets_data_file(const char *path)
{
	const char *p = strchr(base_name(path), '.');
	while (p) {
		const char *q = strchr(p + 1, '.');
		size_t n = q ? (size_t)(q - p - 1) : strlen(p + 1);
		for (const char *a = strstr(allowed_exts, " "); n && a;
		     a = strchr(a + 1, ' '))
			if (!strncmp(a + 1, p + 1, n) && a[1 + n] == ' ')
				return 1;
		p = q;
	}
	return 0;
}

/* the formats bakery reads: by the name's last extension */
static int has_ext(const char *path, const char *ext);
static int bakery_reads(const char *path)
{
	return has_ext(path, ".parquet") || has_ext(path, ".jsonl") || has_ext(path, ".ndjson") ||
	       has_ext(path, ".json");
}

/* Left out of every pattern, as datasets' resolve_pattern leaves them out: a hidden
 * part (a name starting with "." that is not all dots), a directory starting with
 * "__" (__pycache__), and its FILES_TO_IGNORE. */
static int excluded(const char *path)
{
	static const char *const ignore[] = {"README.md", "config.json", "dataset_info.json",
					     "dataset_infos.json", "dummy_data.zip",
					     "dataset_dict.json", NULL};
	for (const char *c = path; *c;) {
		size_t n = strcspn(c, "/");
		int dots = 1;
		for (size_t i = 0; i < n; i++)
			dots &= c[i] == '.';
		if (c[0] == '.' && !dots)
			return 1;
		if (c[n] == '/' && n >= 2 && c[0] == '_' && c[1] == '_')
			return 1;
		c += n + (c[n] == '/');
	}
	for (int i = 0; ignore[i]; i++)
		if (!strcmp(base_name(path), ignore[i]))
			return 1;
	return 0;
}

/* SPLIT_PATTERN_SHARDED: data/{split}-[0-9]{5}-of-[0-9]{5}*.* ('*' within one name) */
static int sharded_as(const char *path, const char *split)
{
	char pat[300];
	if (snprintf(pat, sizeof pat, "data/%s-[0-9][0-9][0-9][0-9][0-9]-of-"
		     "[0-9][0-9][0-9][0-9][0-9]*.*", split) >= (int)sizeof pat)
		return 0;
	return !fnmatch(pat, path, FNM_PATHNAME);
}

/* the split name datasets reads from a sharded path (string_to_dict: the greedy
 * (?P<split>.+) before "-DDDDD-of-DDDD"): its length, or 0 */
static size_t sharded_name(const char *path)
{
	if (!sharded_as(path, "*"))
		return 0;
	const char *b = path + 5;
	size_t best = 0;
	for (const char *d = strchr(b + 1, '-'); d; d = strchr(d + 1, '-')) {
		int ok = 1;
		for (int i = 1; i <= 5 && ok; i++)
			ok = isdigit((unsigned char)d[i]);
		ok = ok && !strncmp(d + 6, "-of-", 4);
		for (int i = 10; i < 14 && ok; i++)
			ok = isdigit((unsigned char)d[i]);
		if (ok)
			best = (size_t)(d - b);
	}
	return best;
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

/* datasets' default patterns (data_files.py), tried group by group: the first group
 * in which some split matches some file gives the repo's splits */
enum { G_LOGS, G_HARBOR, G_DIR, G_FILE, G_ALL, NGROUPS };
enum { P_EVAL, P_TASK, P_INSTRUCTION, P_D1, P_D2, P_D3, P_D4, P_F1, P_F2, P_ALL };

static const char *const kw_train[] = {"train", "training", NULL};
static const char *const kw_valid[] = {"validation", "valid", "dev", "val", NULL};
static const char *const kw_test[] = {"test", "testing", "eval", "evaluation", NULL};
static const char *const default_splits[] = {"train", "validation", "test"};
static const char *const *const split_keywords[] = {kw_train, kw_valid, kw_test};

/* the splits of group g */
static size_t group_splits(int g, const char **names)
{
	switch (g) {
	case G_LOGS: names[0] = "logs"; return 1;
	case G_HARBOR: names[0] = "test"; return 1;
	case G_ALL: names[0] = "train"; return 1;
	default:
		for (int i = 0; i < 3; i++)
			names[i] = default_splits[i];
		return 3;
	}
}

/* pattern p of split s of group g, in datasets' order (for each keyword, each base
 * pattern): 1 with *kind and *kw set, 0 past the last */
static int group_pattern(int g, size_t s, size_t p, int *kind, const char **kw)
{
	*kw = NULL;
	switch (g) {
	case G_LOGS: *kind = P_EVAL; return p == 0;
	case G_HARBOR: *kind = p ? P_INSTRUCTION : P_TASK; return p < 2;
	case G_ALL: *kind = P_ALL; return p == 0;
	default: {
		size_t per = g == G_DIR ? 4 : 2, k = p / per;
		const char *const *kws = split_keywords[s];
		for (size_t i = 0; i < k; i++)
			if (!kws[i])
				return 0;
		if (!kws[k])
			return 0;
		*kw = kws[k];
		*kind = (g == G_DIR ? P_D1 : P_F1) + (int)(p % per);
		return 1;
	}
	}
}

static int sep_char(char c) { return c && strchr("-._ 0123456789", c); }

/* one name [c, c + n) against a keyword pattern (NON_WORDS_CHARS = "-._ 0-9") */
static int name_match(int kind, const char *c, size_t n, const char *kw)
{
	size_t k = strlen(kw);
	switch (kind) {
	case P_D1: return n == k && !memcmp(c, kw, k);                      /* kw */
	case P_D2:
	case P_F1: return n > k && !memcmp(c, kw, k) && sep_char(c[k]);     /* kw[sep]* */
	case P_D3: return n > k && !memcmp(c + n - k, kw, k) && sep_char(c[n - k - 1]);
	default: /* *[sep]kw[sep]* */
		for (size_t q = 1; q + k < n; q++)
			if (sep_char(c[q - 1]) && !memcmp(c + q, kw, k) && sep_char(c[q + k]))
				return 1;
		return 0;
	}
}

static int pattern_match(int kind, const char *kw, const char *path)
{
	const char *b = base_name(path);
	size_t bn = strlen(b);
	switch (kind) {
	case P_ALL: return 1;
	case P_EVAL: return bn >= 5 && !strcmp(b + bn - 5, ".eval");
	case P_TASK: return !strcmp(b, "task.toml");
	case P_INSTRUCTION: return !strcmp(b, "instruction.md");
	case P_F1:
	case P_F2: return name_match(kind, b, bn, kw);
	default: /* a directory of the path: "**" / NAME / "**" */
		for (const char *c = path; c < b;) {
			size_t n = strcspn(c, "/");
			if (name_match(kind, c, n, kw))
				return 1;
			c += n + 1;
		}
		return 0;
	}
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef BK_VEC(char) charvec;

static void names_add(charvec *nm, const char *name, size_t len)
{
	if (nm->n) {
		bk_vec_push(nm, ',');
		bk_vec_push(nm, ' ');
	}
	for (size_t i = 0; i < len; i++)
		bk_vec_push(nm, name[i]);
}

char **bk_split_files(const char *const *paths, size_t n, const char *split, size_t *nout,
		      char **names)
{
	BK_VEC(char *) out = {0};
	BK_VEC(const char *) c = {0}; /* the candidates, sorted as fsspec's glob sorts */
	charvec nm = {0};
	*names = NULL;
	for (size_t i = 0; i < n; i++)
		if (!excluded(paths[i]))
			bk_vec_push(&c, paths[i]);
	if (c.n)
		qsort(c.v, c.n, sizeof *c.v, cmp_str);
	int sharded = 0;
	for (size_t i = 0; i < c.n && !sharded; i++)
		sharded = sharded_name(c.v[i]) > 0;
	if (sharded) {
		/* its splits: train, validation, test first, then the others sorted */
		BK_VEC(char *) sp = {0};
		for (size_t i = 0; i < c.n; i++) {
			size_t k = sharded_name(c.v[i]);
			if (!k)
				continue;
			char *name = xstrndup(c.v[i] + 5, k);
			int seen = 0;
			for (size_t j = 0; j < sp.n && !seen; j++)
				seen = !strcmp(sp.v[j], name);
			if (seen)
				free(name);
			else
				bk_vec_push(&sp, name);
		}
		qsort(sp.v, sp.n, sizeof *sp.v, cmp_str);
		for (int pass = 0; pass < 2; pass++)
			for (size_t j = 0; j < sp.n; j++) {
				int dflt = 0;
				for (int d = 0; d < 3; d++)
					dflt |= !strcmp(sp.v[j], default_splits[d]);
				if (dflt == !pass)
					names_add(&nm, sp.v[j], strlen(sp.v[j]));
			}
		for (size_t i = 0; i < sp.n; i++)
			free(sp.v[i]);
		free(sp.v);
		for (size_t i = 0; i < c.n; i++)
			if (sharded_as(c.v[i], split) && datasets_data_file(c.v[i]))
				bk_vec_push(&out, xstrdup(c.v[i]));
	} else {
		for (int g = 0; g < NGROUPS && !nm.n; g++) {
			const char *gs[3];
			size_t ns = group_splits(g, gs);
			int want = -1;
			for (size_t s = 0; s < ns; s++) {
				int hit = 0, kind;
				const char *kw;
				for (size_t p = 0; !hit && group_pattern(g, s, p, &kind, &kw); p++)
					for (size_t i = 0; i < c.n && !hit; i++)
						hit = pattern_match(kind, kw, c.v[i]);
				if (hit) {
					names_add(&nm, gs[s], strlen(gs[s]));
					if (!strcmp(gs[s], split))
						want = (int)s;
				}
			}
			if (want < 0)
				continue;
			/* DataFilesList.from_patterns: pattern by pattern, each one's files in
			 * sorted order, data-file extensions only, repeats kept */
			int kind;
			const char *kw;
			for (size_t p = 0; group_pattern(g, (size_t)want, p, &kind, &kw); p++)
				for (size_t i = 0; i < c.n; i++)
					if (pattern_match(kind, kw, c.v[i]) && datasets_data_file(c.v[i]))
						bk_vec_push(&out, xstrdup(c.v[i]));
		}
	}
	if (nm.n) {
		bk_vec_push(&nm, 0);
		*names = nm.v;
	}
	free(c.v);
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

/* What is being read: a directory, or a hub repo's files (fetched into the cache when
 * online; else its snapshot, whose whole file list the cached listing gives). */
typedef struct {
	const char *what, *dir; /* dir: a local directory, or the snapshot when offline */
	char **paths;           /* the repo's files, relative */
	size_t npaths;
	const char *id, *commit; /* hub repos */
	int fetch;               /* online: bk_hub_file fetches a file before it is read */
	const char *why;         /* hub repos read offline: why ("HF_HUB_OFFLINE is set ...") */
	int have_cols;           /* the columns, chosen from the first file opened */
	bk_row_columns cols;
} repo_ctx;

/* The tool picks the columns once, from the dataset's column names (a parquet
 * file's schema; the keys of all rows of a JSON file, as datasets' JSON loader makes
 * one table of them); datasets requires every file of it to have the same. */
static void pick_columns(repo_ctx *r, split_file *f)
{
	BK_VEC(const char *) names = {0};
	if (f->pq) {
		for (size_t i = 0; i < bk_parquet_num_columns(f->pq); i++)
			bk_vec_push(&names, bk_parquet_column(f->pq, i));
	} else {
		size_t i;
		json_t *row;
		json_array_foreach(f->rows, i, row) {
			const char *k;
			json_t *v;
			json_object_foreach(row, k, v) {
				int seen = 0;
				for (size_t j = 0; j < names.n && !seen; j++)
					seen = !strcmp(names.v[j], k);
				if (!seen)
					bk_vec_push(&names, k);
			}
		}
	}
	if (bk_row_columns_pick(names.v, names.n, &r->cols)) {
		char list[512];
		size_t o = 0;
		list[0] = 0;
		for (size_t i = 0; i < names.n && o < sizeof list; i++)
			o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "",
					      names.v[i]);
		free(names.v);
		die("%s: no messages and no prompt column (tried %s); its columns: %s", f->name,
		    bk_row_columns_tried(), names.n ? list : "none");
	}
	free(names.v);
	r->have_cols = 1;
}

static void file_open(repo_ctx *r, split_file *f)
{
	if (has_ext(f->path, ".parquet")) {
		f->pq = bk_parquet_open(f->path);
		f->n = bk_parquet_num_rows(f->pq);
	} else {
		size_t len;
		char *buf = bk_read_file(f->path, &len);
		f->rows = bk_dataset_json_rows(f->name, buf, len);
		free(buf);
		f->n = (int64_t)json_array_size(f->rows);
	}
	if (!r->have_cols)
		pick_columns(r, f);
}

static void file_close(split_file *f)
{
	bk_parquet_close(f->pq);
	json_decref(f->rows);
	f->pq = NULL, f->rows = NULL;
}

/* The columns the tool reads of a hub dataset's row (bakery-py data.py _load_hf):
 * messages, else its prompt and response columns.  Not a row's "system",
 * "conversations" or "user_message" (local files only), nor the system messages of a
 * chat (the tool pairs user and assistant turns only). */
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

static void file_rows(bk_dataset *ds, const repo_ctx *r, split_file *f, int64_t from,
		      int64_t to)
{
	if (f->rows) {
		for (int64_t i = from; i < to; i++) {
			json_t *row = json_array_get(f->rows, (size_t)i);
			tool_row(row);
			bk_dataset_add_hub_row(ds, f->name, "row", (size_t)i + 1, &r->cols, row);
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
				bk_dataset_add_hub_row(ds, f->name, "row",
						       (size_t)(base + a) + i + 1, &r->cols, row);
			}
			json_decref(rows);
		}
		base += gn;
	}
}

/* the files under dir, relative, recursively (symlinks followed; dot names skipped:
 * datasets leaves hidden files out) */
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
		else if (!stat(p, &st) && S_ISREG(st.st_mode))
			bk_vec_push(out, xstrdup(r));
		free(p);
		free(r);
	}
	closedir(d);
	free(full);
}

/* The split being read, reachable from here while a die() may happen (a bad row, a
 * missing shard): die() exits with it allocated, and LeakSanitizer (make asan) calls
 * a block whose only pointer was in a clobbered register a leak. */
static split_file *volatile live_files;
static char **volatile live_paths;
static char *volatile live_names;

static int cached(const repo_ctx *r, const char *file)
{
	char *p = bk_path_join(r->dir, file);
	struct stat st;
	int ok = !stat(p, &st) && S_ISREG(st.st_mode);
	free(p);
	return ok;
}

/* A hub repo read offline: files[i0, nf) of the split must all be in the snapshot
 * (the listing says which the split has); dies naming the missing ones. */
static void check_cached(const repo_ctx *r, const char *split, char **files, size_t i0,
			 size_t nf)
{
	char list[1024];
	size_t o = 0, missing = 0, total = 0;
	list[0] = 0;
	for (size_t i = 0; i < nf; i++) {
		int dup = 0;
		for (size_t j = 0; j < i && !dup; j++)
			dup = !strcmp(files[j], files[i]);
		if (dup)
			continue;
		total++;
		if (i < i0 || cached(r, files[i]))
			continue;
		if (missing < 8 && o < sizeof list)
			o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", missing ? ", " : "",
					      files[i]);
		missing++;
	}
	if (missing)
		die("%s: split '%s': %zu of the %zu files it has are not in the cache (%s%s)%s, "
		    "and %s: read it online once", r->what, split, missing, total, list,
		    missing > 8 ? ", ..." : "",
		    i0 ? ", and the rows asked for reach the first of them" : "", r->why);
}

/* fetches (hub) and opens one file of a split */
static void open_split_file(repo_ctx *r, split_file *f, const char *file)
{
	f->path = r->fetch ? bk_hub_file(BK_HUB_DATASET, r->id, r->commit, file, 0)
			   : bk_path_join(r->dir, file);
	file_open(r, f);
}

static void load_spec(bk_dataset *ds, repo_ctx *r, const char *spec)
{
	char err[512];
	bk_split_spec sp;
	if (bk_split_parse(spec, &sp, err, sizeof err))
		die("%s: split '%s': %s", r->what, spec, err);
	size_t n0 = ds->n, s0 = ds->skipped;
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
		for (size_t i = 0; i < nf; i++)
			if (!bakery_reads(files[i]))
				die("%s: split '%s': %s is a data file datasets reads, in a format "
				    "bakery does not (it reads .parquet, .jsonl, .ndjson and .json)",
				    r->what, pt->split, files[i]);
		/* a sharded split must be whole from its first shard up to what is read:
		 * a local copy may hold only some shards */
		long shards = -1, k, m;
		size_t have = 0;
		while (have < nf && shard_info(files[have], &k, &m) && k == (long)have)
			have++;
		if (have == nf && nf && shard_info(files[0], &k, &m) && m != (long)nf)
			shards = m;
		else if (have != nf && shard_info(files[0], &k, &m))
			die("%s: split '%s': its shards are not 0, 1, ... of %ld (%s)", r->what,
			    pt->split, m, files[have < nf ? have : 0]);
		/* the total is needed for percent and negative bounds and an open end;
		 * otherwise files after the slice are not even fetched */
		int need_total = pt->pct || !pt->has_to || pt->to < 0 ||
				 (pt->has_from && pt->from < 0);
		if (r->id && !r->fetch && need_total)
			check_cached(r, pt->split, files, 0, nf);
		split_file *f = xcalloc(nf, sizeof *f);
		live_files = f;
		for (size_t i = 0; i < nf; i++)
			f[i].name = xasprintf("%s: %s", r->what, files[i]);
		int64_t total = 0, from, to;
		for (size_t i = 0; i < nf && need_total; i++) {
			open_split_file(r, &f[i], files[i]);
			total += f[i].n;
			if (f[i].rows) /* JSON rows stay in memory only while needed */
				file_close(&f[i]);
		}
		if (shards >= 0 && need_total)
			die("%s: split '%s' has %ld shards, %zu of them here (a copy that holds "
			    "only some shards)", r->what, pt->split, shards, nf);
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
			if (!f[i].path) {
				if (r->id && !r->fetch && !cached(r, files[i]))
					check_cached(r, pt->split, files, i, nf);
				open_split_file(r, &f[i], files[i]);
			} else if (!f[i].pq && !f[i].rows) {
				file_open(r, &f[i]);
			}
			int64_t a = from > base ? from - base : 0;
			int64_t b = to < base + f[i].n ? to - base : f[i].n;
			if (a < b)
				file_rows(ds, r, &f[i], a, b);
			base += f[i].n;
			file_close(&f[i]);
		}
		if (shards >= 0 && base < to)
			die("%s: split '%s' has %ld shards, %zu of them here, and rows up to %lld "
			    "are asked for (a copy that holds only some shards)", r->what, pt->split,
			    shards, nf, (long long)to);
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
		die("%s: split '%s': no samples%s", r->what, spec,
		    ds->skipped > s0 ? " (every row skipped: null or empty prompt, or no "
				       "user/assistant pair)" : "");
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

/* kept reachable while a die() may happen (see live_files) */
static char *volatile live_why, *volatile live_snap;

void bk_dataset_load_hub(bk_dataset *ds, const char *id, const char *revision,
			 const char *spec)
{
	const char *rev = revision ? revision : "main";
	bk_hub_listing l;
	char *why = NULL, *snap = NULL;
	int fetch = !bk_hub_list_try(BK_HUB_DATASET, id, revision, &l, &why);
	live_why = why;
	if (!fetch) {
		/* offline, or no connection: the snapshot, read only when the listing the
		 * last read online recorded says which files a split has */
		if (bk_hub_listing_cached(BK_HUB_DATASET, id, revision, &l)) {
			char *c = bk_hub_cache_dir();
			if (!l.commit)
				die("dataset %s (revision '%s') is not in the cache %s, and %s", id, rev,
				    c, why);
			live_snap = snap = bk_hub_snapshot_dir(BK_HUB_DATASET, id, l.commit);
			die("dataset %s: the cache %s has no file listing of its commit %s (revision "
			    "'%s'; bakery records one each time it reads the dataset online), so "
			    "which files a split has is not known, and %s: read it online once, or "
			    "give the snapshot directory %s itself to read what it holds",
			    id, c, l.commit, rev, why, snap);
		}
		if (!bk_hub_offline(BK_HUB_DATASET)) /* as huggingface_hub: said so */
			warn("%s; dataset %s: the cached snapshot %s", why, id, l.commit);
		live_snap = snap = bk_hub_snapshot_dir(BK_HUB_DATASET, id, l.commit);
	}
	char **paths = xcalloc(l.n ? l.n : 1, sizeof *paths);
	for (size_t i = 0; i < l.n; i++)
		paths[i] = xstrdup(l.v[i].path);
	repo_ctx r = {.what = id, .dir = snap, .paths = paths, .npaths = l.n, .id = id,
		      .commit = l.commit, .fetch = fetch, .why = why};
	load_spec(ds, &r, spec);
	free_paths(&r);
	bk_hub_listing_free(&l);
	live_why = live_snap = NULL;
	free(why);
	free(snap);
}
