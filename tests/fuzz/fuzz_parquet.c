/* fuzz_parquet.c - libFuzzer target for the Parquet reader (formats/parquet.c).  The
 * input is a whole file: its footer is parsed, then every row group is read whole
 * (all columns), and again from its second row with one column.  A die() (a corrupt
 * or unsupported file) ends the run through bk_die_hook; a crash, a sanitizer report
 * or a broken promise of parquet.h (abort) is a finding. */
#include "formats/parquet.h"
#include "tests/fuzz/reclaim.h"

#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	bk_diag_init("fuzz_parquet");
	reclaim_init();
	return 0;
}

/* "a new JSON array of objects", count of them (clamped to the group) */
static void check_rows(json_t *rows, int64_t want)
{
	if (!json_is_array(rows) || (int64_t)json_array_size(rows) != want)
		abort();
	for (size_t i = 0; i < json_array_size(rows); i++)
		if (!json_is_object(json_array_get(rows, i)))
			abort();
	char *s = json_dumps(rows, JSON_ENCODE_ANY); /* every value is encodable */
	if (!s)
		abort();
	free(s);
}

static void run(const uint8_t *buf, size_t len)
{
	bk_parquet *pq = bk_parquet_open_mem("fuzz.parquet", buf, len);
	int64_t total = 0;
	for (size_t g = 0; g < bk_parquet_num_row_groups(pq); g++) {
		int64_t n = bk_parquet_row_group_rows(pq, g);
		total += n;
		json_t *rows = bk_parquet_read_rows(pq, g, 0, -1, NULL);
		check_rows(rows, n);
		json_decref(rows);
		if (bk_parquet_num_columns(pq)) {
			const char *cols[] = {bk_parquet_column(pq, 0), NULL};
			rows = bk_parquet_read_rows(pq, g, 1, 3, cols);
			check_rows(rows, n < 1 ? 0 : n - 1 < 3 ? n - 1 : 3);
			json_decref(rows);
		}
	}
	if (total != bk_parquet_num_rows(pq))
		abort();
	bk_parquet_close(pq);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* exactly size bytes, so ASan sees a read past the end */
	uint8_t *buf = malloc(size ? size : 1);
	if (!buf)
		return 0;
	memcpy(buf, data, size);
	reclaim_begin();
	if (setjmp(reclaim_jmp) == 0) {
		run(buf, size);
		reclaim_end(0);
	} else {
		reclaim_end(1);
	}
	free(buf);
	return 0;
}
