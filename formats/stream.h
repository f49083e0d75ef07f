/* stream.h - bakery record streams (see man/bk-stream.5): a concatenation of msgpack
 * maps: one header, records, one trailer with the record count and an XXH3-64 of the
 * header's and records' bytes.  The reader validates as it goes and dies with "stream truncated" /
 * "stream corrupt" naming the stream and record; the writer keeps every field of the
 * input record it is not told to replace (pass-through).  Memory is constant in the
 * number of records: one record is alive at a time.
 * Not here: what fields mean (stages define them) or any JSON (bk-dump does that). */
#ifndef BK_STREAM_H
#define BK_STREAM_H

#include <msgpack.h>
#include <stdint.h>
#include <stdio.h>

#define BK_STREAM_VERSION 1

/* ---------------- reading ---------------- */

typedef struct bk_reader bk_reader;

/* Opens path ("-" = stdin) and reads the header; dies if it is not a bakery stream. */
bk_reader *bk_reader_open(const char *path);
/* The same over an open stream (not closed by bk_reader_close); name is for messages. */
bk_reader *bk_reader_from_file(FILE *f, const char *name);
/* The next record (a map), or NULL after a valid trailer.  The object lives until the
 * next call.  Dies on truncation, corruption, or a record that is not a map. */
const msgpack_object *bk_reader_next(bk_reader *r);
/* Raw msgpack bytes of the current record (for verbatim copies). */
const char *bk_reader_raw(const bk_reader *r, size_t *len);
/* Header map (lives as long as the reader) and its provenance list (may be empty). */
const msgpack_object *bk_reader_header(const bk_reader *r);
const msgpack_object_array *bk_reader_provenance(const bk_reader *r);
/* Newest provenance value for key (NULL if no stage recorded it). */
const msgpack_object *bk_reader_prov(const bk_reader *r, const char *key);
/* Newest provenance string value of key; NULL if absent or not a string (malloc'd). */
char *bk_reader_prov_str(const bk_reader *r, const char *key);
/* Refuse the stream if the newest provenance value of key differs from want:
 *   "stdin: stream was made with another tokenizer (stream: 1f2e..., given: 99ab...)" */
void bk_reader_expect(const bk_reader *r, const char *key, const char *want, const char *what);
/* The same with want = the XXH3-64 (hex) of a file's bytes, e.g. a tokenizer.model. */
void bk_reader_expect_file(const bk_reader *r, const char *key, const char *path,
			   const char *what);
/* The same for the system prompt: provenance 'system' is the hex XXH3-64 of its text
 * (bk-tokenize); refuses a stream made with another system prompt. */
void bk_reader_expect_system(const bk_reader *r, const char *text);
const char *bk_reader_name(const bk_reader *r);
uint64_t bk_reader_count(const bk_reader *r); /* records returned so far */
void bk_reader_close(bk_reader *r);

/* Die with "NAME: record N: MSG" for the current record. */
_Noreturn void bk_reader_die(const bk_reader *r, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* ---------------- map access ---------------- */

const msgpack_object *bk_obj_get(const msgpack_object *map, const char *key);
/* A number where a number is meant: a float or an integer (jq and other JSON tools write
 * 1.0 as 1, and bk-dump --from-json packs it as an integer).  0 when o is NULL or not a
 * number. */
int bk_obj_number(const msgpack_object *o, double *v);
int bk_obj_is(const msgpack_object *o, const char *s); /* o is the string s */
/* Field accessors for the current record: die naming the field when the type is wrong;
 * the *_opt forms return 0 when the field is absent. */
size_t bk_rec_ids(const bk_reader *r, const msgpack_object *rec, const char *key,
		  int32_t **ids, size_t *cap);
int bk_rec_ids_opt(const bk_reader *r, const msgpack_object *rec, const char *key,
		   int32_t **ids, size_t *cap, size_t *n);
int64_t bk_rec_int(const bk_reader *r, const msgpack_object *rec, const char *key);
int bk_rec_int_opt(const bk_reader *r, const msgpack_object *rec, const char *key, int64_t *v);
/* string field copied to a malloc'd NUL-terminated string; NULL when absent */
char *bk_rec_str_opt(const bk_reader *r, const msgpack_object *rec, const char *key);

/* ---------------- batches ---------------- */

/* Records of one batch are adjacent (bk-stream(5)): a batch number, in the epochs (the
 * 'epoch' field, 0 when absent) its run of records had, is over for good once another
 * batch starts.  (bk-gen after bk-lens repeats each batch number in every epoch; bk-lens
 * after bk-gen mixes epochs in one batch.)  Every reader of 'batch' keeps one
 * bk_batch_order (zeroed) and passes each record through bk_batch_next, which dies
 * naming the record when a finished batch comes back (a merge with the wrong
 * reference, a hand-edited stream).  Returns 0 when the record has no 'batch', else 1
 * with it in *batch. */
typedef struct {
	int64_t *e, *b; /* finished (epoch, batch) pairs: open addressing */
	uint8_t *used;
	size_t cap, n;
	int has_cur;
	int64_t cur_b;
	int64_t *run_e; /* the epochs of the current batch's run */
	size_t n_run, cap_run;
} bk_batch_order;
int bk_batch_next(bk_batch_order *o, const bk_reader *r, const msgpack_object *rec,
		  int64_t *batch);
void bk_batch_order_free(bk_batch_order *o);

/* ---------------- writing ---------------- */

typedef struct bk_writer bk_writer;

/* One provenance item for this stage's header entry. */
typedef struct {
	const char *key;
	enum { BK_KV_STR, BK_KV_INT, BK_KV_NUM } type;
	const char *s;
	int64_t i;
	double d;
} bk_kv;
#define BK_KV_S(k, v) ((bk_kv){.key = (k), .type = BK_KV_STR, .s = (v)})
#define BK_KV_I(k, v) ((bk_kv){.key = (k), .type = BK_KV_INT, .i = (v)})
#define BK_KV_D(k, v) ((bk_kv){.key = (k), .type = BK_KV_NUM, .d = (v)})

/* Opens path ("-" = stdout; a file is written to a temporary name and renamed by
 * bk_writer_close, so a failed run leaves no partial file). */
bk_writer *bk_writer_open(const char *path);
/* Writes the header: the input stream's provenance (in may be NULL) plus one entry for
 * this tool with the given items. */
void bk_writer_header(bk_writer *w, const bk_reader *in, const bk_kv *items, int n);
/* Same, with the previous provenance given as an object (bk-dump --from-json). */
void bk_writer_header_obj(bk_writer *w, const msgpack_object_array *prev, const bk_kv *items,
			  int n);

/* Record building: begin, then for each field bk_rec_key + pack its value with the
 * packer, or bk_rec_copy to pass fields of an input record through; then end. */
msgpack_packer *bk_rec_begin(bk_writer *w);
void bk_rec_key(bk_writer *w, const char *key);
/* Copies every field of in except those named in skip (NULL-terminated, may be NULL). */
void bk_rec_copy(bk_writer *w, const msgpack_object *in, const char *const *skip);
void bk_rec_end(bk_writer *w);
/* Writes an already-encoded record map verbatim (must be a map without "bk"). */
void bk_writer_raw(bk_writer *w, const char *data, size_t len);
/* Writes the trailer and commits the file.  Frees w. */
void bk_writer_close(bk_writer *w);
/* A stream that is a view, not the job (bk-step's metrics): when its reader goes away
 * (EPIPE; SIGPIPE must be ignored) the writer warns once, naming what, and drops
 * everything after instead of dying. */
void bk_writer_optional(bk_writer *w, const char *what);
int bk_writer_dead(const bk_writer *w); /* the reader of an optional stream went away */
uint64_t bk_writer_count(const bk_writer *w);

/* Packing helpers. */
void bk_pack_str(msgpack_packer *pk, const char *s);
void bk_pack_strn(msgpack_packer *pk, const char *s, size_t n);
void bk_pack_ids(msgpack_packer *pk, const int32_t *ids, size_t n);

#endif
