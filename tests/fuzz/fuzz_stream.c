/* fuzz_stream.c - libFuzzer target for the record-stream reader (formats/stream.c), the
 * 'teacher' field reader (formats/teacher.c) and the msgpack -> JSON conversion of
 * bk-dump (formats/msgjson.c).  The input is the raw bytes of a stream; every record is
 * read and its usual fields touched.  A die() (bad
 * input) ends the run through bk_die_hook; a crash, a sanitizer report or a broken
 * invariant (abort) is a finding.  Not a writer test: tests/unit/test_stream.c is. */
#include "formats/msgjson.h"
#include "formats/stream.h"
#include "formats/teacher.h"
#include "tests/fuzz/reclaim.h"

#include <stdio.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	bk_diag_init("fuzz_stream");
	reclaim_init();
	return 0;
}

/* bk-dump's path: the JSON form of an object (when it has one) and back again.  Only
 * memory errors are findings here: NaN (no JSON form), duplicate keys (JSON keeps
 * one) and a map whose only key is "$bin" (read back as bin) do not round-trip. */
static void touch_json(const msgpack_object *o)
{
	const char *why = NULL;
	json_t *j = bk_msg_to_json(o, &why);
	if (!j)
		return;
	msgpack_sbuffer sb;
	msgpack_sbuffer_init(&sb);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
	if (!bk_json_to_msg(&pk, j, &why)) {
		msgpack_unpacked up;
		msgpack_unpacked_init(&up);
		size_t off = 0;
		if (msgpack_unpack_next(&up, sb.data, sb.size, &off) != MSGPACK_UNPACK_SUCCESS ||
		    off != sb.size)
			abort(); /* the packer wrote something that does not parse */
		msgpack_unpacked_destroy(&up);
	}
	msgpack_sbuffer_destroy(&sb);
	json_decref(j);
}

/* What bk_teacher_read promises about a field it accepted (see teacher.h). */
static void check_teacher(const bk_teacher *t)
{
	if (t->k < 0 || t->n < 0 || t->v <= 0 || t->k > t->v)
		abort();
	size_t n = (size_t)t->n, k = (size_t)t->k, per = k ? k : (size_t)t->v;
	if (n && (!t->logp || (k && (!t->ids || !t->rest))))
		abort();
	volatile float sink = 0;
	for (size_t i = 0; k && i < n * k; i++)
		if (t->ids[i] < 0 || t->ids[i] >= t->v)
			abort();
	for (size_t i = 0; i < n * per; i++)
		sink += t->logp[i]; /* every value is there to read (ASan checks the bounds) */
	for (size_t i = 0; k && i < n; i++)
		sink += t->rest[i];
	(void)sink;
}

/* storage reused across records, as a consumer does; empty between runs */
static bk_teacher teach;

static void read_all(bk_reader *r)
{
	static const char *const id_keys[] = {"t_prompt", "s_prompt", "resp", "tokens"};
	static const char *const str_keys[] = {"id", "user", "response", "system"};
	static const char *const int_keys[] = {"batch", "epoch", "traj", "step"};
	touch_json(bk_reader_header(r));
	const msgpack_object_array *prov = bk_reader_provenance(r);
	for (uint32_t i = 0; i < prov->size; i++)
		(void)bk_obj_get(&prov->ptr[i], "tool");
	free(bk_reader_prov_str(r, "tokenizer"));
	free(bk_reader_prov_str(r, "template"));
	(void)bk_reader_prov(r, "max_tokens");
	int32_t *ids = NULL;
	size_t cap = 0, n;
	const msgpack_object *rec;
	uint64_t count = 0;
	while ((rec = bk_reader_next(r))) {
		if (rec->type != MSGPACK_OBJECT_MAP || bk_obj_get(rec, "bk"))
			abort(); /* records are maps without "bk" */
		if (bk_reader_count(r) != ++count)
			abort();
		size_t rawlen;
		const char *raw = bk_reader_raw(r, &rawlen);
		/* the raw bytes are exactly this record (bk-lens copies them verbatim) */
		msgpack_unpacked up;
		msgpack_unpacked_init(&up);
		size_t off = 0;
		if (msgpack_unpack_next(&up, raw, rawlen, &off) != MSGPACK_UNPACK_SUCCESS ||
		    off != rawlen || up.data.type != MSGPACK_OBJECT_MAP ||
		    up.data.via.map.size != rec->via.map.size)
			abort();
		msgpack_unpacked_destroy(&up);
		for (size_t k = 0; k < sizeof id_keys / sizeof *id_keys; k++)
			if (bk_rec_ids_opt(r, rec, id_keys[k], &ids, &cap, &n))
				for (size_t i = 0; i < n; i++)
					if (ids[i] < 0)
						abort();
		for (size_t k = 0; k < sizeof str_keys / sizeof *str_keys; k++)
			free(bk_rec_str_opt(r, rec, str_keys[k]));
		for (size_t k = 0; k < sizeof int_keys / sizeof *int_keys; k++) {
			int64_t v;
			(void)bk_rec_int_opt(r, rec, int_keys[k], &v);
		}
		if (bk_teacher_read(r, rec, &teach))
			check_teacher(&teach);
		touch_json(rec);
	}
	if (bk_reader_next(r)) /* after the trailer: stays at the end */
		abort();
	bk_teacher_free(&teach);
	free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	/* fmemopen wants a non-empty writable-looking buffer; keep our own copy */
	char *copy = malloc(size ? size : 1);
	if (!copy)
		return 0;
	if (size)
		memcpy(copy, data, size);
	FILE *volatile f = NULL;
	bk_reader *volatile r = NULL;
	reclaim_begin();
	if (setjmp(reclaim_jmp) == 0) {
		f = size ? fmemopen(copy, size, "rb") : fopen("/dev/null", "rb");
		if (!f)
			abort();
		r = bk_reader_from_file(f, "fuzz");
		read_all(r);
		bk_reader_close(r);
		fclose(f);
		reclaim_end(0);
	} else {
		/* die(): the FILE is on stdio's global list, close it before the sweep */
		if (f)
			fclose(f);
		reclaim_end(1); /* frees teach's arrays too: they were allocated in this run */
		memset(&teach, 0, sizeof teach);
	}
	free(copy);
	return 0;
}
