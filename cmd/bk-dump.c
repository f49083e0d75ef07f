/* bk-dump - record stream <-> JSON Lines, and stream statistics. */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "formats/msgjson.h"
#include "formats/shard.h"
#include "formats/stream.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
	"usage: bk-dump [--header] [FILE]\n"
	"       bk-dump --stats [FILE]\n"
	"       bk-dump --from-json [-o FILE] [JSONL]\n"
	"       bk-dump --merge REF [-o FILE] SHARD ...\n"
	"Prints a bakery stream as JSON Lines, one record per line (bin payloads as\n"
	"{\"$bin\": base64}); --from-json turns such lines back into a stream.\n"
	"  --header       print the stream header as the first line\n"
	"  --stats        print the record count, token-length histograms and the header\n"
	"  --from-json    read JSON Lines, write a stream\n"
	"  --merge REF    merge the streams of bk-gen/bk-teach --shard I/N (all N of one\n"
	"                 stage) into the stream the unsharded stage writes; REF is the\n"
	"                 stream the shards read (it gives the order)\n"
	"  -o, --output FILE  output file for --from-json and --merge (default stdout)\n"
	"  -v, --verbose\n";

static void print_json(json_t *j)
{
	if (json_dumpf(j, stdout, JSON_COMPACT | JSON_REAL_PRECISION(17)) != 0)
		die("write error on standard output: %s", strerror(errno));
	putchar('\n');
}

static void dump(const char *path, int header)
{
	bk_reader *r = bk_reader_open(path);
	const char *why = NULL;
	if (header) {
		json_t *h = bk_msg_to_json(bk_reader_header(r), &why);
		if (!h)
			die("%s: header: %s", bk_reader_name(r), why);
		print_json(h);
		json_decref(h);
	}
	const msgpack_object *rec;
	while ((rec = bk_reader_next(r))) {
		json_t *j = bk_msg_to_json(rec, &why);
		if (!j)
			bk_reader_die(r, "%s", why);
		print_json(j);
		json_decref(j);
	}
	bk_reader_close(r);
}

/* ---- --stats ---- */

#define NBINS 16 /* length bins: 0, 1, 2-3, 4-7, ... 2^14- */
typedef struct {
	char name[32];
	uint64_t n, sum, min, max, bins[NBINS];
} len_stat;

static int bin_of(uint64_t len)
{
	int b = 0;
	while (len && b < NBINS - 1) {
		len >>= 1;
		b++;
	}
	return b;
}

static void stats(const char *path)
{
	bk_reader *r = bk_reader_open(path);
	len_stat st[16];
	int nst = 0;
	const msgpack_object *rec;
	while ((rec = bk_reader_next(r))) {
		for (uint32_t i = 0; i < rec->via.map.size; i++) {
			const msgpack_object_kv *kv = &rec->via.map.ptr[i];
			if (kv->key.type != MSGPACK_OBJECT_STR || kv->val.type != MSGPACK_OBJECT_ARRAY)
				continue;
			const msgpack_object_array *a = &kv->val.via.array;
			if (a->size && a->ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
				continue;
			int k;
			for (k = 0; k < nst; k++)
				if (strlen(st[k].name) == kv->key.via.str.size &&
				    !memcmp(st[k].name, kv->key.via.str.ptr, kv->key.via.str.size))
					break;
			if (k == nst) {
				if (nst == 16 || kv->key.via.str.size >= sizeof st[0].name)
					continue;
				memset(&st[k], 0, sizeof st[k]);
				memcpy(st[k].name, kv->key.via.str.ptr, kv->key.via.str.size);
				st[k].min = UINT64_MAX;
				nst++;
			}
			len_stat *s = &st[k];
			s->n++;
			s->sum += a->size;
			s->min = a->size < s->min ? a->size : s->min;
			s->max = a->size > s->max ? a->size : s->max;
			s->bins[bin_of(a->size)]++;
		}
	}
	printf("records: %llu\n", (unsigned long long)bk_reader_count(r));
	for (int k = 0; k < nst; k++) {
		len_stat *s = &st[k];
		printf("%s: %llu records, tokens %llu, length min %llu mean %.1f max %llu\n", s->name,
		       (unsigned long long)s->n, (unsigned long long)s->sum,
		       (unsigned long long)s->min, (double)s->sum / (double)s->n,
		       (unsigned long long)s->max);
		for (int b = 0; b < NBINS; b++) {
			if (!s->bins[b])
				continue;
			uint64_t lo = b ? 1ull << (b - 1) : 0, hi = b ? (1ull << b) - 1 : 0;
			int bar = (int)(40 * s->bins[b] / s->n);
			printf("  %6llu-%-6llu %8llu %.*s\n", (unsigned long long)lo,
			       (unsigned long long)hi, (unsigned long long)s->bins[b], bar,
			       "########################################");
		}
	}
	const char *why = NULL;
	json_t *h = bk_msg_to_json(bk_reader_header(r), &why);
	if (!h)
		die("%s: header: %s", bk_reader_name(r), why);
	printf("header: ");
	if (json_dumpf(h, stdout, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) != 0)
		die("write error on standard output");
	putchar('\n');
	json_decref(h);
	bk_reader_close(r);
}

/* ---- --from-json ---- */

static void from_json(const char *path, const char *out)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	const char *name = strcmp(path, "-") ? path : "stdin";
	if (!f)
		die("%s: %s", path, strerror(errno));
	bk_writer *w = bk_writer_open(out);
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	long lineno = 0;
	int header_done = 0;
	const char *why = NULL;
	while ((n = getline(&line, &cap, f)) > 0) {
		lineno++;
		if (strspn(line, " \t\r\n") == (size_t)n)
			continue;
		json_error_t err;
		json_t *j = json_loadb(line, (size_t)n, JSON_DISABLE_EOF_CHECK * 0, &err);
		if (!j)
			die("%s: line %ld: %s", name, lineno, bk_json_error_text(&err));
		if (!json_is_object(j))
			die("%s: line %ld: a record must be a JSON object", name, lineno);
		json_t *bk = json_object_get(j, "bk");
		if (bk && json_is_string(bk) && !strcmp(json_string_value(bk), "header")) {
			if (header_done)
				die("%s: line %ld: header after records", name, lineno);
			/* carry the provenance of the dumped stream */
			msgpack_sbuffer sb;
			msgpack_sbuffer_init(&sb);
			msgpack_packer pk;
			msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
			json_t *prov = json_object_get(j, "provenance");
			if (!json_is_array(prov) || bk_json_to_msg(&pk, prov, &why))
				die("%s: line %ld: header has no valid 'provenance' list", name, lineno);
			msgpack_unpacked up;
			msgpack_unpacked_init(&up);
			size_t off = 0;
			msgpack_unpack_next(&up, sb.data, sb.size, &off);
			bk_writer_header_obj(w, &up.data.via.array, NULL, 0);
			msgpack_unpacked_destroy(&up);
			msgpack_sbuffer_destroy(&sb);
			header_done = 1;
			json_decref(j);
			continue;
		}
		if (bk && json_is_string(bk) && !strcmp(json_string_value(bk), "trailer")) {
			json_decref(j); /* recomputed on output */
			continue;
		}
		if (bk)
			die("%s: line %ld: records may not have a 'bk' field", name, lineno);
		if (!header_done) {
			bk_writer_header(w, NULL, NULL, 0);
			header_done = 1;
		}
		msgpack_packer *pk = bk_rec_begin(w);
		const char *k;
		size_t klen;
		json_t *v;
		json_object_keylen_foreach(j, k, klen, v)
		{
			char *key = xstrndup(k, klen);
			bk_rec_key(w, key);
			free(key);
			if (bk_json_to_msg(pk, v, &why))
				die("%s: line %ld: key '%.*s': %s", name, lineno, (int)klen, k, why);
		}
		bk_rec_end(w);
		json_decref(j);
	}
	if (ferror(f))
		die("%s: read error: %s", name, strerror(errno));
	if (!header_done)
		bk_writer_header(w, NULL, NULL, 0);
	free(line);
	if (f != stdin)
		fclose(f);
	bk_writer_close(w);
}

int main(int argc, char **argv)
{
	int header = 0, do_stats = 0, do_from = 0;
	const char *out = "-", *merge_ref = NULL;
	bk_opt opts[] = {
		{"header", 0, BK_OPT_FLAG, &header, 0, 0},
		{"stats", 0, BK_OPT_FLAG, &do_stats, 0, 0},
		{"from-json", 0, BK_OPT_FLAG, &do_from, 0, 0},
		{"merge", 0, BK_OPT_STR, &merge_ref, 0, 0},
		{"output", 'o', BK_OPT_STR, &out, 0, 0},
		{"verbose", 'v', BK_OPT_FLAG, &bk_verbose, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	bk_stdout_init();
	int n = bk_flags_parse(argc, argv, opts, usage);
	if (merge_ref) {
		if (header || do_stats || do_from)
			die_usage("--merge excludes --header, --stats and --from-json");
		if (n < 1)
			die_usage("--merge REF needs the shard streams");
		bk_shard_merge(merge_ref, (const char *const *)argv, n, out);
		bk_stdout_close();
		return 0;
	}
	if (n > 1)
		die_usage("too many arguments");
	if (do_stats + do_from > 1)
		die_usage("--stats and --from-json exclude each other");
	if (strcmp(out, "-") && !do_from)
		die_usage("--output is for --from-json and --merge");
	const char *path = n ? argv[0] : "-";
	struct stat st;
	if (fstat(1, &st) == 0 && !S_ISREG(st.st_mode))
		setvbuf(stdout, NULL, _IOLBF, 0); /* to jq, less, a terminal: line by line */
	if (do_from)
		from_json(path, out);
	else if (do_stats)
		stats(path);
	else
		dump(path, header);
	bk_stdout_close();
	return 0;
}
