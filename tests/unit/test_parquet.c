/* test_parquet.c - formats/parquet.c against pyarrow: each tests/golden/parquet/NAME.parquet
 * (written by tests/ref/make_parquet_golden.py) is read whole, row group by row group,
 * in slices and by column, and compared with the rows pyarrow read back from it
 * (NAME.jsonl).  Damaged copies of the files and the refused encoding must die with
 * one line naming the file. */
#include "common/diag.h"
#include "common/files.h"
#include "formats/parquet.h"
#include "tests/harness.h"

#include <stdlib.h>
#include <string.h>

#define G "tests/golden/parquet/"

static json_t *expected_rows(const char *name)
{
	char path[256];
	snprintf(path, sizeof path, G "%s.jsonl", name);
	size_t len;
	char *buf = bk_read_file(path, &len);
	json_t *rows = json_array();
	for (char *p = buf, *nl; *p; p = nl + 1) {
		nl = strchr(p, '\n');
		if (!nl)
			break;
		json_error_t err;
		json_t *v = json_loadb(p, (size_t)(nl - p), 0, &err);
		if (!v)
			BUG("%s: %s", path, err.text);
		json_array_append_new(rows, v);
	}
	free(buf);
	return rows;
}

static void show_diff(const char *what, size_t i, json_t *got, json_t *want)
{
	char *g = json_dumps(got, JSON_SORT_KEYS | JSON_ENCODE_ANY);
	char *w = json_dumps(want, JSON_SORT_KEYS | JSON_ENCODE_ANY);
	fprintf(stderr, "  %s row %zu:\n    got  %s\n    want %s\n", what, i, g, w);
	free(g);
	free(w);
}

/* rows [from, from + n) of want equal got */
static void compare(const char *what, json_t *got, json_t *want, size_t from, size_t n)
{
	CHECK(json_array_size(got) == n, "%s: %zu rows, want %zu", what, json_array_size(got), n);
	for (size_t i = 0; i < n && i < json_array_size(got); i++) {
		json_t *w = json_array_get(want, from + i), *g = json_array_get(got, i);
		int eq = json_equal(g, w);
		CHECK(eq, "%s: row %zu differs", what, from + i);
		if (!eq)
			show_diff(what, from + i, g, w);
	}
}

/* the whole file, then every slice of each row group (first, count) over a small grid */
static void check_file(const char *name)
{
	char path[256];
	snprintf(path, sizeof path, G "%s.parquet", name);
	json_t *want = expected_rows(name);
	bk_parquet *pq = bk_parquet_open(path);
	CHECK(bk_parquet_num_rows(pq) == (int64_t)json_array_size(want), "%s: %lld rows, want %zu",
	      name, (long long)bk_parquet_num_rows(pq), json_array_size(want));
	size_t base = 0;
	for (size_t g = 0; g < bk_parquet_num_row_groups(pq); g++) {
		int64_t nr = bk_parquet_row_group_rows(pq, g);
		json_t *rows = bk_parquet_read_rows(pq, g, 0, -1, NULL);
		char what[300];
		snprintf(what, sizeof what, "%s group %zu", name, g);
		compare(what, rows, want, base, (size_t)nr);
		json_decref(rows);
		for (int64_t first = 0; first <= nr; first += nr > 6 ? nr / 3 : 1)
			for (int64_t count = 0; count <= nr - first; count += nr > 6 ? nr / 4 : 1) {
				rows = bk_parquet_read_rows(pq, g, first, count, NULL);
				snprintf(what, sizeof what, "%s group %zu rows [%lld, +%lld)", name,
					 g, (long long)first, (long long)count);
				compare(what, rows, want, base + (size_t)first, (size_t)count);
				json_decref(rows);
			}
		base += (size_t)nr;
	}
	CHECK(base == json_array_size(want), "%s: row groups hold %zu rows", name, base);
	bk_parquet_close(pq);
	json_decref(want);
}

/* only some columns: the others are absent from the rows */
static void check_columns(void)
{
	json_t *want = expected_rows("ultrachat");
	bk_parquet *pq = bk_parquet_open(G "ultrachat.parquet");
	CHECK(bk_parquet_num_columns(pq) == 3, "ultrachat: %zu columns",
	      bk_parquet_num_columns(pq));
	CHECK(!strcmp(bk_parquet_column(pq, 2), "messages"), "column 2 is %s",
	      bk_parquet_column(pq, 2));
	const char *cols[] = {"messages", "no_such_column", NULL};
	size_t base = 0;
	for (size_t g = 0; g < bk_parquet_num_row_groups(pq); g++) {
		json_t *rows = bk_parquet_read_rows(pq, g, 0, -1, cols);
		for (size_t i = 0; i < json_array_size(rows); i++) {
			json_t *r = json_array_get(rows, i);
			CHECK(json_object_size(r) == 1, "row %zu has %zu keys", base + i,
			      json_object_size(r));
			CHECK(json_equal(json_object_get(r, "messages"),
					 json_object_get(json_array_get(want, base + i), "messages")),
			      "row %zu: messages differ", base + i);
		}
		base += json_array_size(rows);
		json_decref(rows);
	}
	CHECK(base == 11, "%zu rows", base);
	/* no selected column: empty objects, one per row */
	const char *none[] = {"nothing", NULL};
	json_t *rows = bk_parquet_read_rows(pq, 0, 1, 2, none);
	CHECK(json_array_size(rows) == 2 && json_object_size(json_array_get(rows, 0)) == 0,
	      "rows without columns");
	json_decref(rows);
	bk_parquet_close(pq);
	json_decref(want);
}

typedef struct {
	const char *name;
	const uint8_t *buf;
	size_t len;
	const char *const *cols;
} read_ctx;

static void do_read_all(void *arg)
{
	read_ctx *c = arg;
	bk_parquet *pq = bk_parquet_open_mem(c->name, c->buf, c->len);
	for (size_t g = 0; g < bk_parquet_num_row_groups(pq); g++)
		json_decref(bk_parquet_read_rows(pq, g, 0, -1, c->cols));
	bk_parquet_close(pq);
}

static void check_refused(void)
{
	bk_map m = bk_map_file(G "refused.parquet");
	const char *ok_cols[] = {"prompt", NULL};
	read_ctx c = {"refused.parquet", m.data, m.len, ok_cols};
	/* the supported column of the same file reads */
	bk_parquet *pq = bk_parquet_open_mem(c.name, m.data, m.len);
	json_t *rows = bk_parquet_read_rows(pq, 0, 0, -1, ok_cols);
	CHECK(json_array_size(rows) == 5 &&
		      !strcmp(json_string_value(json_object_get(json_array_get(rows, 4), "prompt")),
			      "p4"),
	      "refused.parquet: column prompt");
	json_decref(rows);
	bk_parquet_close(pq);
	c.cols = NULL;
	bk_expect_die("delta encoding", do_read_all, &c,
		      "refused.parquet: column 'n': encoding DELTA_BINARY_PACKED is not supported",
		      NULL);
	/* damaged copies: truncated, bad magic, a flipped footer length */
	uint8_t *bad = xmalloc(m.len);
	memcpy(bad, m.data, m.len);
	c.buf = bad;
	c.len = m.len - 1;
	bk_expect_die("truncated", do_read_all, &c, "refused.parquet: corrupt parquet file", NULL);
	c.len = m.len;
	bad[0] = 'X';
	bk_expect_die("magic", do_read_all, &c, "refused.parquet: not a parquet file", NULL);
	bad[0] = 'P';
	/* a column name that is not UTF-8 (names become JSON keys) */
	uint8_t *name = memmem(bad + 4, m.len - 4, "prompt", 6);
	CHECK(name != NULL, "no column name in the footer");
	if (name) {
		name[1] = 0xff;
		bk_expect_die("name", do_read_all, &c,
			      "refused.parquet: corrupt parquet file (a column name is not UTF-8)",
			      NULL);
		name[1] = 'r';
	}
	bad[m.len - 8] ^= 0x40;
	bk_expect_die("footer length", do_read_all, &c, "refused.parquet: corrupt parquet file",
		      NULL);
	free(bad);
	bk_unmap(&m);
}

/* every single-byte change of a small file either reads or dies with one line */
static void check_mutations(void)
{
	bk_map m = bk_map_file(G "ultrachat.parquet");
	uint8_t *bad = xmalloc(m.len);
	int died = 0, read = 0;
	for (size_t at = 0; at < m.len; at += 37) {
		memcpy(bad, m.data, m.len);
		bad[at] ^= 0x5a;
		read_ctx c = {"u.parquet", bad, m.len, NULL};
		char err[1024];
		int st = bk_run_child(do_read_all, &c, err, sizeof err);
		CHECK(st == 0 || (st == 1 && strstr(err, ": error: u.parquet: ") &&
				  strchr(err, '\n') == err + strlen(err) - 1),
		      "byte %zu flipped: status %d, %s", at, st, err);
		died += st == 1;
		read += st == 0;
	}
	CHECK(died > 0 && read > 0, "flips: %d died, %d read", died, read);
	free(bad);
	bk_unmap(&m);
}

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	static const char *const files[] = {"ultrachat", "chat", "pairs", "fallback", "types-zstd",
					    "types-gzip"};
	for (size_t i = 0; i < sizeof files / sizeof *files; i++)
		check_file(files[i]);
	check_columns();
	check_refused();
	check_mutations();
	return bk_test_done("test_parquet");
}
