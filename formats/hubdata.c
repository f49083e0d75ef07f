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
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <yaml.h>

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
typedef BK_VEC(char *) strvec;

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

/* ---- the README's `configs:` ----
 *
 * datasets reads README.md's YAML front matter (huggingface_hub's REGEX_YAML_BLOCK, then
 * yaml.safe_load: YAML 1.1 with its implicit types) and, when it has a non-empty
 * `configs:` list, builds one config per entry (utils/metadata.py MetadataConfigs,
 * load.py create_builder_configs_from_metadata_configs) and picks one
 * (get_default_config_name, then a single README dataset_info, then the builder's
 * rule).  Here, with libyaml's document API. */

/* the YAML of the front matter: 1 with [*body, *body + *blen), 0 when there is none:
 * ^\s*---(\r\n|\r|\n)(BODY, as short as can be)(\r\n|\r|\n)---[ \t]*(\r\n|\n|$) */
static int front_matter(const char *t, size_t n, const char **body, size_t *blen)
{
	size_t i = 0;
	while (i < n && is_blank(t[i]))
		i++;
	if (n - i < 3 || memcmp(t + i, "---", 3))
		return 0;
	i += 3;
	if (i + 1 < n && t[i] == '\r' && t[i + 1] == '\n')
		i += 2;
	else if (i < n && (t[i] == '\r' || t[i] == '\n'))
		i++;
	else
		return 0;
	for (size_t k = i; k < n; k++) {
		size_t j = k;
		if (t[j] == '\r' && j + 1 < n && t[j + 1] == '\n')
			j += 2;
		else if (t[j] == '\r' || t[j] == '\n')
			j++;
		else
			continue;
		if (n - j < 3 || memcmp(t + j, "---", 3))
			continue;
		j += 3;
		while (j < n && (t[j] == ' ' || t[j] == '\t'))
			j++;
		if (j == n || t[j] == '\n' || (t[j] == '\r' && j + 1 < n && t[j + 1] == '\n')) {
			*body = t + i;
			*blen = k - i;
			return 1;
		}
	}
	return 0;
}

/* what yaml.safe_load makes of a node: a plain scalar's implicit type (YAML 1.1
 * resolvers of PyYAML), else str, list or dict */
enum { Y_NULL, Y_BOOL, Y_INT, Y_FLOAT, Y_TIME, Y_STR, Y_LIST, Y_DICT };

static int re_full(const char *re, const char *s)
{
	regex_t rx;
	if (regcomp(&rx, re, REG_EXTENDED | REG_NOSUB))
		BUG("bad regex %s", re);
	int m = !regexec(&rx, s, 0, NULL, 0);
	regfree(&rx);
	return m;
}

static const char re_bool[] =
	"^(yes|Yes|YES|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$";
static const char re_true[] = "^(yes|Yes|YES|true|True|TRUE|on|On|ON)$";
static const char re_int[] =
	"^([-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+|"
	"[-+]?[1-9][0-9_]*(:[0-5]?[0-9])+)$";
static const char re_float[] =
	"^([-+]?[0-9][0-9_]*\\.[0-9_]*([eE][-+][0-9]+)?|\\.[0-9_]+([eE][-+][0-9]+)?|"
	"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+\\.[0-9_]*|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN))$";
static const char re_time[] =
	"^([0-9]{4}-[0-9]{2}-[0-9]{2}|[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}([Tt]|[ \t]+)[0-9]{1,2}:"
	"[0-9]{2}:[0-9]{2}(\\.[0-9]*)?([ \t]*(Z|[-+][0-9]{1,2}(:[0-9]{2})?))?)$";

static const char *y_scalar(const yaml_node_t *n)
{
	return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

static int y_type(const yaml_node_t *n)
{
	if (!n)
		return Y_NULL;
	if (n->type == YAML_SEQUENCE_NODE)
		return Y_LIST;
	if (n->type == YAML_MAPPING_NODE)
		return Y_DICT;
	const char *s = y_scalar(n);
	if (n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return Y_STR;
	if (!*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
	    !strcmp(s, "NULL"))
		return Y_NULL;
	if (re_full(re_bool, s))
		return Y_BOOL;
	if (re_full(re_int, s))
		return Y_INT;
	if (re_full(re_float, s))
		return Y_FLOAT;
	if (re_full(re_time, s))
		return Y_TIME;
	return Y_STR;
}

/* Python's truth of the value yaml.safe_load makes */
static int y_truthy(const yaml_node_t *n)
{
	const char *s = y_scalar(n);
	switch (y_type(n)) {
	case Y_NULL: return 0;
	case Y_BOOL: return re_full(re_true, s);
	case Y_INT: /* nonzero: a digit other than 0 after the sign and base prefix */
		s += *s == '-' || *s == '+';
		if (s[0] == '0' && (s[1] == 'b' || s[1] == 'x'))
			s += 2;
		return strspn(s, "0_:") != strlen(s);
	case Y_FLOAT:
		if (strpbrk(s, "iInN"))
			return 1; /* inf, nan */
		return strspn(s, "+-0_.:") < strcspn(s, "eE");
	case Y_TIME: return 1;
	case Y_STR: return *s != 0;
	case Y_LIST: return n->data.sequence.items.top > n->data.sequence.items.start;
	default: return n->data.mapping.pairs.top > n->data.mapping.pairs.start;
	}
}

/* dict[key] (the last of repeated keys, as a Python dict keeps it), or NULL */
static yaml_node_t *y_get(yaml_document_t *d, yaml_node_t *map, const char *key)
{
	yaml_node_t *v = NULL;
	if (!map || map->type != YAML_MAPPING_NODE)
		return NULL;
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *k = yaml_document_get_node(d, p->key);
		if (y_type(k) == Y_STR && !strcmp(y_scalar(k), key))
			v = yaml_document_get_node(d, p->value);
	}
	return v;
}

static int y_has(yaml_document_t *d, yaml_node_t *map, const char *key)
{
	if (!map || map->type != YAML_MAPPING_NODE)
		return 0;
	for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *k = yaml_document_get_node(d, p->key);
		if (y_type(k) == Y_STR && !strcmp(y_scalar(k), key))
			return 1;
	}
	return 0;
}

static size_t y_len(const yaml_node_t *n)
{
	if (n->type == YAML_SEQUENCE_NODE)
		return (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
	if (n->type == YAML_MAPPING_NODE)
		return (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
	return 0;
}

static yaml_node_t *y_item(yaml_document_t *d, yaml_node_t *seq, size_t i)
{
	return yaml_document_get_node(d, seq->data.sequence.items.start[i]);
}

/* a split name datasets takes: \w+(\.\w+)* */
static int split_name_ok(const char *s)
{
	for (;;) {
		if (!word_char(*s))
			return 0;
		while (word_char(*s))
			s++;
		if (!*s)
			return 1;
		if (*s++ != '.')
			return 0;
	}
}

/* one name of a pattern (Python's fnmatch inside a path part) */
static int part_match(const char *pat, size_t pn, const char *s, size_t sn)
{
	char *p = xstrndup(pat, pn), *t = xstrndup(s, sn);
	int m = !fnmatch(p, t, FNM_NOESCAPE);
	free(p);
	free(t);
	return m;
}

/* fsspec's glob (glob_translate): '*' alone one name, '**' alone any number of names
 * ('**' last: at least one), else fnmatch within one name */
static int glob_match(const char *pat, const char *path)
{
	size_t pn = strcspn(pat, "/"), sn = strcspn(path, "/");
	int plast = !pat[pn], slast = !path[sn];
	if (pn == 2 && !memcmp(pat, "**", 2)) {
		if (plast)
			return *path != 0;
		for (const char *q = path;; q += strcspn(q, "/") + 1) {
			if (glob_match(pat + 3, q))
				return 1;
			if (!q[strcspn(q, "/")])
				return 0;
		}
	}
	if (!sn || !part_match(pat, pn, path, sn))
		return 0;
	if (plast || slast)
		return plast && slast;
	return glob_match(pat + pn + 1, path + sn + 1);
}

/* parts of a path as PurePath has them ("" and "." parts dropped) that are hidden
 * (start with '.', not all dots) or, of the parent parts, special (start with "__") */
static void count_parts(const char *p, int *hidden, int *special)
{
	*hidden = *special = 0;
	while (*p) {
		size_t n = strcspn(p, "/");
		if (n && !(n == 1 && *p == '.')) {
			int dots = 1;
			for (size_t i = 0; i < n; i++)
				dots &= p[i] == '.';
			*hidden += p[0] == '.' && !dots;
			*special += p[n] == '/' && n >= 2 && p[0] == '_' && p[1] == '_';
		}
		p += n + (p[n] == '/');
	}
}

typedef struct {
	const char *name;   /* its config_name as written */
	int name_str;       /* config_name is a string (not a number, a list, ...) */
	size_t index;       /* in configs */
	yaml_node_t *files; /* data_files; NULL when absent or null */
	const char *dir;    /* data_dir, or NULL */
} card_config;

typedef struct {
	yaml_document_t *d;
	char *err;
	size_t errlen;
	const char *const *paths; /* sorted */
	size_t n;
} card_ctx;

#define CARD_ERR(c, cfg, ...)                                                               \
	do {                                                                                \
		int o_ = snprintf((c)->err, (c)->errlen, "README.md: configs[%zu] (config '%s'): ", \
				  (cfg)->index, (cfg)->name);                                \
		if (o_ >= 0 && (size_t)o_ < (c)->errlen)                                    \
			snprintf((c)->err + o_, (c)->errlen - (size_t)o_, __VA_ARGS__);     \
	} while (0)

/* resolve_pattern: the files pattern matches under the config's data_dir, sorted, with
 * data-file extensions; -1 when a pattern without wildcards matches none */
static int glob_files(card_ctx *c, const card_config *cfg, const char *pat, strvec *out)
{
	for (const char *q = pat; *q; q += strcspn(q, "/") + (q[strcspn(q, "/")] == '/')) {
		size_t k = strcspn(q, "/");
		if (!(k == 2 && !memcmp(q, "**", 2)) && memmem(q, k, "**", 2)) {
			CARD_ERR(c, cfg, "data_files: '%s': '**' can only be a whole path part", pat);
			return -1;
		}
	}
	size_t dl = cfg->dir ? strlen(cfg->dir) : 0;
	while (dl && cfg->dir[dl - 1] == '/')
		dl--;
	int ph, ps;
	count_parts(pat, &ph, &ps);
	const char *pb = strrchr(pat, '/');
	static const char *const ignore[] = {"README.md", "config.json", "dataset_info.json",
					     "dataset_infos.json", "dummy_data.zip",
					     "dataset_dict.json", NULL};
	size_t found = 0;
	for (size_t i = 0; i < c->n; i++) {
		const char *p = c->paths[i];
		if (dl) {
			if (strncmp(p, cfg->dir, dl) || p[dl] != '/')
				continue;
			p += dl + 1;
		}
		if (!glob_match(pat, p))
			continue;
		const char *b = base_name(p);
		int skip = 0;
		for (int k = 0; ignore[k] && !skip; k++)
			skip = !strcmp(b, ignore[k]) && strcmp(pb ? pb + 1 : pat, ignore[k]);
		int h, s;
		count_parts(p, &h, &s);
		if (skip || h != ph || s != ps || !datasets_data_file(p))
			continue;
		bk_vec_push(out, xstrdup(c->paths[i]));
		found++;
	}
	if (!found && !strpbrk(pat, "*?[")) {
		CARD_ERR(c, cfg, "data_files: '%s'%s%.*s matches no data file", pat,
			 dl ? " in data_dir " : "", (int)dl, dl ? cfg->dir : "");
		return -1;
	}
	return 0;
}

/* the splits of a config's data_files (sanitize_patterns): names[i] and its patterns
 * (nodes) pats[i]; -1 on a form datasets refuses */
typedef struct {
	const char *split;
	yaml_node_t *path; /* a string or a list of strings */
} card_split;

static int card_splits(card_ctx *c, const card_config *cfg, card_split **out, size_t *nout)
{
	yaml_document_t *d = c->d;
	yaml_node_t *f = cfg->files;
	*out = NULL, *nout = 0;
	int t = y_type(f);
	if (t == Y_STR) {
		*out = xcalloc(1, sizeof **out);
		(*out)[0] = (card_split){"train", f};
		*nout = 1;
		return 0;
	}
	if (t != Y_LIST)
		goto bad;
	size_t n = y_len(f), dicts = 0;
	for (size_t i = 0; i < n; i++) {
		yaml_node_t *e = y_item(d, f, i);
		int et = y_type(e);
		if (et == Y_STR)
			continue;
		yaml_node_t *sp = y_get(d, e, "split"), *pa = y_get(d, e, "path");
		if (et != Y_DICT || y_len(e) != 2 || !y_has(d, e, "split") || y_type(sp) != Y_STR ||
		    !split_name_ok(y_scalar(sp)) || (y_type(pa) != Y_STR && y_type(pa) != Y_LIST))
			goto bad;
		dicts++;
	}
	if (dicts && dicts != n) {
		CARD_ERR(c, cfg, "data_files: a list of both strings and {split, path} entries");
		return -1;
	}
	if (!dicts) {
		*out = xcalloc(1, sizeof **out);
		(*out)[0] = (card_split){"train", f};
		*nout = 1;
		return 0;
	}
	*out = xcalloc(n, sizeof **out);
	for (size_t i = 0; i < n; i++) {
		yaml_node_t *e = y_item(d, f, i);
		const char *sp = y_scalar(y_get(d, e, "split"));
		for (size_t j = 0; j < i; j++)
			if (!strcmp((*out)[j].split, sp)) {
				CARD_ERR(c, cfg, "data_files: split '%s' is given twice", sp);
				free(*out);
				*out = NULL;
				return -1;
			}
		(*out)[i] = (card_split){sp, y_get(d, e, "path")};
	}
	*nout = n;
	return 0;
bad:
	CARD_ERR(c, cfg, "data_files: datasets takes a string, a list of strings or a list of "
		 "{split, path} (split a name of \\w+(.\\w+)*, path a string or a list of them)");
	return -1;
}

/* the files of split of a config with data_files: 0 (*nsplit: no such split), or -1 */
static int card_files(card_ctx *c, const card_config *cfg, const char *split, strvec *out,
		      charvec *names, int *nosplit)
{
	card_split *sp;
	size_t ns;
	*nosplit = 1;
	if (card_splits(c, cfg, &sp, &ns))
		return -1;
	int rc = 0;
	/* datasets resolves every split of the config before any is read */
	for (size_t i = 0; i < ns && !rc; i++) {
		names_add(names, sp[i].split, strlen(sp[i].split));
		strvec got = {0};
		yaml_node_t *p = sp[i].path;
		size_t np = p->type == YAML_SEQUENCE_NODE ? y_len(p) : 1;
		for (size_t k = 0; k < np && !rc; k++) {
			yaml_node_t *e = p->type == YAML_SEQUENCE_NODE ? y_item(c->d, p, k) : p;
			if (y_type(e) != Y_STR) {
				CARD_ERR(c, cfg, "data_files: split '%s': a path that is not a string",
					 sp[i].split);
				rc = -1;
			} else {
				rc = glob_files(c, cfg, y_scalar(e), &got);
			}
		}
		if (!rc && !strcmp(sp[i].split, split)) {
			*nosplit = 0;
			for (size_t k = 0; k < got.n; k++)
				bk_vec_push(out, got.v[k]);
		} else {
			for (size_t k = 0; k < got.n; k++)
				free(got.v[k]);
		}
		free(got.v);
	}
	free(sp);
	return rc;
}

/* the files of split of a config without data_files: datasets' default patterns under
 * its data_dir (NULL *names: no data files there) */
static char **card_default_files(card_ctx *c, const card_config *cfg, const char *split,
				 size_t *nf, char **names)
{
	size_t dl = cfg->dir ? strlen(cfg->dir) : 0;
	while (dl && cfg->dir[dl - 1] == '/')
		dl--;
	BK_VEC(const char *) sub = {0};
	for (size_t i = 0; i < c->n; i++)
		if (!dl || (!strncmp(c->paths[i], cfg->dir, dl) && c->paths[i][dl] == '/'))
			bk_vec_push(&sub, c->paths[i] + (dl ? dl + 1 : 0));
	char **f = bk_split_files((const char *const *)sub.v, sub.n, split, nf, names);
	for (size_t i = 0; dl && i < *nf; i++) {
		char *full = xasprintf("%.*s/%s", (int)dl, cfg->dir, f[i]);
		free(f[i]);
		f[i] = full;
	}
	free(sub.v);
	return f;
}

/* "'a', 'b'": the config names, for messages */
static void config_names(const card_config *v, size_t n, charvec *nm)
{
	for (size_t i = 0; i < n; i++) {
		char *q = xasprintf("'%s'", v[i].name);
		names_add(nm, q, strlen(q));
		free(q);
	}
	bk_vec_push(nm, 0);
}

/* the config load_dataset(repo) (config NULL) or load_dataset(repo, config) builds:
 * its index, or -1 */
static int card_pick(card_ctx *c, yaml_node_t *root, const card_config *v, size_t n,
		     const char *config)
{
	yaml_document_t *d = c->d;
	charvec nm = {0};
	if (config) {
		for (size_t i = 0; i < n; i++)
			if (v[i].name_str && !strcmp(v[i].name, config))
				return (int)i;
		config_names(v, n, &nm);
		snprintf(c->err, c->errlen, "README.md: configs: no config '%s' (its configs: %s)",
			 config, nm.v);
		free(nm.v);
		return -1;
	}
	/* MetadataConfigs.get_default_config_name */
	int pick = -1;
	for (size_t i = 0; i < n; i++) {
		yaml_node_t *e = y_item(d, y_get(d, root, "configs"), v[i].index);
		if (n == 1 || (v[i].name_str && !strcmp(v[i].name, "default")) ||
		    y_truthy(y_get(d, e, "default"))) {
			if (pick >= 0) {
				snprintf(c->err, c->errlen, "README.md: configs: two default configs, "
					 "'%s' and '%s' (a config named default or with default: "
					 "true)", v[pick].name, v[i].name);
				return -1;
			}
			pick = (int)i;
		}
	}
	if (pick >= 0)
		return pick;
	/* none: the one config a README dataset_info describes (DatasetInfosDict) */
	yaml_node_t *di = y_get(d, root, "dataset_info");
	const char *only = NULL;
	int several = 0;
	if (di && (di->type == YAML_MAPPING_NODE || di->type == YAML_SEQUENCE_NODE)) {
		size_t k = di->type == YAML_SEQUENCE_NODE ? y_len(di) : 1;
		for (size_t i = 0; i < k; i++) {
			yaml_node_t *e = di->type == YAML_SEQUENCE_NODE ? y_item(d, di, i) : di;
			if (e->type != YAML_MAPPING_NODE) {
				snprintf(c->err, c->errlen, "README.md: dataset_info: an entry that "
					 "is not a mapping");
				return -1;
			}
			yaml_node_t *cn = y_get(d, e, "config_name");
			const char *s = cn ? (y_scalar(cn) ? y_scalar(cn) : "?") : "default";
			if (only && strcmp(only, s))
				several = 1;
			only = s;
		}
	}
	if (only && !several) {
		for (size_t i = 0; i < n; i++)
			if (!strcmp(v[i].name, only))
				return (int)i;
		snprintf(c->err, c->errlen, "README.md: dataset_info: config '%s' is not one of "
			 "configs", only);
		return -1;
	}
	config_names(v, n, &nm);
	snprintf(c->err, c->errlen, "README.md: configs: %zu configs (%s) and none is the "
		 "default (config_name default, or default: true), so datasets needs a config "
		 "name, which the tool does not give", n, nm.v);
	free(nm.v);
	return -1;
}

static int cmp_cstr(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int bk_split_files_card(const char *readme, size_t len, const char *config,
			const char *const *paths, size_t n, const char *split, char ***files,
			size_t *nf, char **names, char *err, size_t errlen)
{
	*files = NULL, *nf = 0, *names = NULL;
	const char *body;
	size_t blen;
	if (!readme || !front_matter(readme, len, &body, &blen)) {
		*files = bk_split_files(paths, n, split, nf, names);
		return 0;
	}
	/* the line of the README where the YAML starts, for messages */
	size_t line0 = 1;
	for (const char *q = readme; q < body; q++)
		line0 += *q == '\n' || (*q == '\r' && q[1] != '\n');
	yaml_parser_t ps;
	yaml_document_t doc, next;
	if (!yaml_parser_initialize(&ps))
		die("libyaml: out of memory");
	yaml_parser_set_input_string(&ps, (const unsigned char *)body, blen);
	int rc = -1, have_doc = 0;
	card_config *v = NULL;
	const char **sorted = NULL;
	strvec out = {0};
	charvec nm = {0};
	if (!yaml_parser_load(&ps, &doc)) {
		snprintf(err, errlen, "README.md: the YAML front matter, line %zu: %s%s%s", line0 +
			 ps.problem_mark.line, ps.problem ? ps.problem : "not YAML",
			 ps.context ? " " : "", ps.context ? ps.context : "");
		goto out;
	}
	have_doc = 1;
	yaml_node_t *root = yaml_document_get_root_node(&doc);
	if (root) {
		if (!yaml_parser_load(&ps, &next)) {
			snprintf(err, errlen, "README.md: the YAML front matter, line %zu: %s",
				 line0 + ps.problem_mark.line, ps.problem ? ps.problem : "not YAML");
			goto out;
		}
		int more = yaml_document_get_root_node(&next) != NULL;
		yaml_document_delete(&next);
		if (more) {
			snprintf(err, errlen, "README.md: the YAML front matter holds more than one "
				 "YAML document");
			goto out;
		}
	}
	if (root && y_type(root) != Y_NULL && root->type != YAML_MAPPING_NODE) {
		snprintf(err, errlen, "README.md: the YAML front matter is not a mapping");
		goto out;
	}
	yaml_node_t *cs = y_get(&doc, root, "configs");
	if (!cs || !y_truthy(cs)) { /* no configs: datasets' default patterns */
		*files = bk_split_files(paths, n, split, nf, names);
		rc = 0;
		goto out;
	}
	if (cs->type != YAML_SEQUENCE_NODE) {
		snprintf(err, errlen, "README.md: configs: not a list");
		goto out;
	}
	sorted = xcalloc(n + 1, sizeof *sorted);
	memcpy(sorted, paths, n * sizeof *paths);
	if (n)
		qsort(sorted, n, sizeof *sorted, cmp_cstr);
	card_ctx c = {.d = &doc, .err = err, .errlen = errlen, .paths = sorted, .n = n};
	size_t nc = y_len(cs);
	v = xcalloc(nc, sizeof *v);
	for (size_t i = 0; i < nc; i++) {
		yaml_node_t *e = y_item(&doc, cs, i);
		if (e->type != YAML_MAPPING_NODE || !y_has(&doc, e, "config_name")) {
			snprintf(err, errlen, "README.md: configs[%zu]: no config_name (each config "
				 "is a mapping with one)", i);
			goto out;
		}
		yaml_node_t *name = y_get(&doc, e, "config_name");
		v[i].name = y_scalar(name) ? y_scalar(name) : "?";
		v[i].name_str = y_type(name) == Y_STR;
		v[i].index = i;
		yaml_node_t *f = y_get(&doc, e, "data_files");
		if (f && y_type(f) == Y_NULL) {
			if (i == 0) { /* load.py: the first config's data_files pick the builder */
				CARD_ERR(&c, &v[i], "data_files: null");
				goto out;
			}
			f = NULL;
		}
		v[i].files = f;
		yaml_node_t *dd = y_get(&doc, e, "data_dir");
		if (dd && y_truthy(dd)) {
			if (y_type(dd) != Y_STR) {
				CARD_ERR(&c, &v[i], "data_dir: not a string");
				goto out;
			}
			v[i].dir = y_scalar(dd);
		}
	}
	/* create_builder_configs_from_metadata_configs: every config's data_files checked,
	 * every config without them resolved by the default patterns */
	for (size_t i = 0; i < nc; i++) {
		if (v[i].files) {
			card_split *sp;
			size_t ns;
			if (card_splits(&c, &v[i], &sp, &ns))
				goto out;
			free(sp);
		} else {
			size_t k;
			char *nn;
			char **f = card_default_files(&c, &v[i], "train", &k, &nn);
			for (size_t j = 0; j < k; j++)
				free(f[j]);
			free(f);
			int none = !nn;
			free(nn);
			if (none) {
				CARD_ERR(&c, &v[i], "no data files%s%s%s", v[i].dir ? " in data_dir '" : "",
					 v[i].dir ? v[i].dir : "", v[i].dir ? "'" : "");
				goto out;
			}
		}
	}
	int pick = card_pick(&c, root, v, nc, config);
	if (pick < 0)
		goto out;
	const card_config *cfg = &v[pick];
	if (!cfg->files) {
		*files = card_default_files(&c, cfg, split, nf, names);
		rc = 0;
		goto out;
	}
	int nosplit;
	if (card_files(&c, cfg, split, &out, &nm, &nosplit))
		goto out;
	bk_vec_push(&nm, 0);
	if (nosplit) {
		CARD_ERR(&c, cfg, "data_files has no split '%s' (its splits: %s)", split, nm.v);
		goto out;
	}
	*files = out.v, *nf = out.n, *names = nm.v;
	out.v = NULL, out.n = 0, nm.v = NULL;
	rc = 0;
out:
	for (size_t i = 0; i < out.n; i++)
		free(out.v[i]);
	free(out.v);
	free(nm.v);
	free(v);
	free(sorted);
	if (have_doc)
		yaml_document_delete(&doc);
	yaml_parser_delete(&ps);
	return rc;
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
	const bk_hub_listing *listing; /* online: the sizes that cap each download */
	int fetch;               /* online: bk_hub_file fetches a file before it is read */
	const char *why;         /* hub repos read offline: why ("HF_HUB_OFFLINE is set ...") */
	int have_cols;           /* the columns, chosen from the first file opened */
	bk_row_columns cols;
	char *readme;            /* README.md (its `configs:`), or NULL when there is none */
	size_t readme_len;
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
	f->path = r->fetch ? bk_hub_file_listed(BK_HUB_DATASET, r->id, r->commit, file, 0,
						r->listing)
			   : bk_path_join(r->dir, file);
	file_open(r, f);
}

/* README.md of the repo into r->readme when it has one: its `configs:` picks the files
 * of a split (fetched first online; offline it must be in the snapshot) */
static char *volatile live_readme;

static void read_readme(repo_ctx *r)
{
	int listed = 0;
	for (size_t i = 0; i < r->npaths && !listed; i++)
		listed = !strcmp(r->paths[i], "README.md");
	if (!listed)
		return;
	if (r->id && !r->fetch && !cached(r, "README.md"))
		die("%s: README.md (its configs: say which files a split has) is not in the "
		    "cache, and %s: read it online once", r->what, r->why);
	char *p = r->fetch ? bk_hub_file_listed(BK_HUB_DATASET, r->id, r->commit, "README.md", 0,
						r->listing)
			   : bk_path_join(r->dir, "README.md");
	live_readme = r->readme = bk_read_file(p, &r->readme_len);
	free(p);
}

static void load_spec(bk_dataset *ds, repo_ctx *r, const char *spec)
{
	char err[512];
	bk_split_spec sp;
	if (bk_split_parse(spec, &sp, err, sizeof err))
		die("%s: split '%s': %s", r->what, spec, err);
	read_readme(r);
	size_t n0 = ds->n, s0 = ds->skipped;
	for (size_t k = 0; k < sp.n; k++) {
		const bk_split_part *pt = &sp.v[k];
		size_t nf;
		char *names, **files;
		if (bk_split_files_card(r->readme, r->readme_len, NULL,
					(const char *const *)r->paths, r->npaths, pt->split, &files,
					&nf, &names, err, sizeof err))
			die("%s: %s", r->what, err);
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
	free(r->readme);
	live_readme = r->readme = NULL;
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
		      .commit = l.commit, .fetch = fetch, .why = why, .listing = &l};
	load_spec(ds, &r, spec);
	free_paths(&r);
	bk_hub_listing_free(&l);
	live_why = live_snap = NULL;
	free(why);
	free(snap);
}
