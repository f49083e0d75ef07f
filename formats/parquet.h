/* parquet.h - a focused reader of Apache Parquet files as the Hugging Face hub stores
 * datasets (written by pyarrow, the datasets library and the hub's converter): rows come
 * back as jansson values, one object per row keyed by top-level column name.
 * Not a general Parquet library, not a writer, no predicate push-down.
 *
 * Supported: the Thrift compact footer (PAR1, unencrypted); data pages v1 and v2;
 * dictionary pages; PLAIN and PLAIN_DICTIONARY / RLE_DICTIONARY values; RLE/bit-packed
 * hybrid levels; codecs UNCOMPRESSED, SNAPPY, GZIP and ZSTD; physical types BOOLEAN,
 * INT32, INT64, FLOAT, DOUBLE, BYTE_ARRAY (must be UTF-8: strings, JSON, binary that is
 * text); nested columns through definition/repetition levels: structs (objects), LIST
 * in its 3-level and legacy 2-level forms and bare repeated fields (arrays), e.g.
 * messages: list<struct<role: string, content: string>>.  Nulls are JSON null; an empty
 * list is [].  Non-finite floats become null (JSON has no NaN).
 * Refused with one line naming the file and column: other encodings (DELTA_*,
 * BYTE_STREAM_SPLIT, BIT_PACKED levels), INT96, FIXED_LEN_BYTE_ARRAY, DECIMAL, MAP,
 * codecs LZO/BROTLI/LZ4, external column chunks, encrypted files.  A corrupt file dies
 * with "NAME: corrupt parquet file (...)"; nothing is read past the buffer. */
#ifndef BK_PARQUET_H
#define BK_PARQUET_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef struct bk_parquet bk_parquet;

/* Parses the footer of a file held in memory; buf must outlive the handle.  name is
 * used in messages.  Dies on a corrupt or unsupported (encrypted) file. */
bk_parquet *bk_parquet_open_mem(const char *name, const void *buf, size_t len);
/* The same for a file on disk (mapped read-only; unmapped by bk_parquet_close). */
bk_parquet *bk_parquet_open(const char *path);
void bk_parquet_close(bk_parquet *pq);

int64_t bk_parquet_num_rows(const bk_parquet *pq);
size_t bk_parquet_num_row_groups(const bk_parquet *pq);
int64_t bk_parquet_row_group_rows(const bk_parquet *pq, size_t g);
/* The top-level column names, in schema order (n of them). */
const char *bk_parquet_column(const bk_parquet *pq, size_t i);
size_t bk_parquet_num_columns(const bk_parquet *pq);

/* Rows [first, first + count) of row group g (clamped to the group) as a new JSON array
 * of objects.  columns: the top-level columns to decode (NULL-terminated; names the
 * file lacks are ignored), or NULL for all; other columns are not read at all, so an
 * unsupported type there does no harm.  Pages after the last wanted row are not read.
 * Dies on a corrupt or unsupported column. */
json_t *bk_parquet_read_rows(bk_parquet *pq, size_t g, int64_t first, int64_t count,
			     const char *const *columns);

#endif
