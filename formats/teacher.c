/* teacher.c - see teacher.h.  Values are little-endian on the wire; this file
 * assumes a little-endian host (x86-64, aarch64), checked at compile time. */
#include "teacher.h"
#include "common/diag.h"

#include <math.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "teacher payloads are little-endian; a big-endian host needs byte swaps here"
#endif

static void pack_bin(msgpack_packer *pk, const char *key, const void *p, size_t bytes)
{
	bk_pack_str(pk, key);
	msgpack_pack_bin(pk, bytes);
	msgpack_pack_bin_body(pk, p, bytes);
}

void bk_teacher_pack(msgpack_packer *pk, const bk_teacher *t)
{
	msgpack_pack_map(pk, t->k ? 7 : 5);
	bk_pack_str(pk, "k");
	msgpack_pack_int(pk, t->k);
	bk_pack_str(pk, "temperature");
	msgpack_pack_double(pk, t->temperature);
	bk_pack_str(pk, "n");
	msgpack_pack_int(pk, t->n);
	bk_pack_str(pk, "v");
	msgpack_pack_int(pk, t->v);
	size_t per = t->k ? (size_t)t->k : (size_t)t->v;
	if (t->k)
		pack_bin(pk, "ids", t->ids, (size_t)t->n * per * 4);
	pack_bin(pk, "logp", t->logp, (size_t)t->n * per * 4);
	if (t->k)
		pack_bin(pk, "rest", t->rest, (size_t)t->n * 4);
}

static long get_int(const bk_reader *r, const msgpack_object *m, const char *key)
{
	const msgpack_object *o = bk_obj_get(m, key);
	if (!o || o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 > (1u << 30))
		bk_reader_die(r, "field 'teacher.%s' is missing or not a small integer", key);
	return (long)o->via.u64;
}

static void get_bin(const bk_reader *r, const msgpack_object *m, const char *key,
		    size_t want, void **dst, size_t *cap)
{
	const msgpack_object *o = bk_obj_get(m, key);
	if (!o || o->type != MSGPACK_OBJECT_BIN)
		bk_reader_die(r, "field 'teacher.%s' is missing or not binary", key);
	if (o->via.bin.size != want)
		bk_reader_die(r, "field 'teacher.%s' has %u bytes, its shape needs %zu", key,
			      o->via.bin.size, want);
	if (want > *cap) {
		*dst = xrealloc(*dst, want);
		*cap = want;
	}
	if (want)
		memcpy(*dst, o->via.bin.ptr, want); /* copy: the payload is unaligned */
}

int bk_teacher_read(const bk_reader *r, const msgpack_object *rec, bk_teacher *t)
{
	const msgpack_object *m = bk_obj_get(rec, "teacher");
	if (!m)
		return 0;
	if (m->type != MSGPACK_OBJECT_MAP)
		bk_reader_die(r, "field 'teacher' is not a map");
	t->k = (int)get_int(r, m, "k");
	t->n = (int)get_int(r, m, "n");
	t->v = (int)get_int(r, m, "v");
	double T;
	if (!bk_obj_number(bk_obj_get(m, "temperature"), &T) || !(T > 0))
		bk_reader_die(r, "field 'teacher.temperature' is missing or not a positive number");
	t->temperature = (float)T;
	if (t->v <= 0 || t->k > t->v)
		bk_reader_die(r, "field 'teacher': k %d and v %d do not fit", t->k, t->v);
	size_t n = (size_t)t->n, per = t->k ? (size_t)t->k : (size_t)t->v;
	get_bin(r, m, "logp", n * per * 4, (void **)&t->logp, &t->cap_logp);
	if (!t->k)
		return 1;
	get_bin(r, m, "ids", n * per * 4, (void **)&t->ids, &t->cap_ids);
	get_bin(r, m, "rest", n * 4, (void **)&t->rest, &t->cap_rest);
	for (size_t i = 0; i < n * per; i++)
		if (t->ids[i] < 0 || t->ids[i] >= t->v)
			bk_reader_die(r, "field 'teacher.ids' item %zu is %d, outside [0, %d)", i,
				      t->ids[i], t->v);
	for (size_t i = 0; i < n; i++)
		if (!(t->rest[i] >= -1e-4f && t->rest[i] <= 1 + 1e-4f))
			bk_reader_die(r, "field 'teacher.rest' item %zu is %g, outside [0, 1]", i,
				      (double)t->rest[i]);
	for (size_t i = 0; i < n * per; i++)
		if (!(t->logp[i] <= 1e-4f) || isnan(t->logp[i]))
			bk_reader_die(r, "field 'teacher.logp' item %zu is %g, not a log-probability",
				      i, (double)t->logp[i]);
	return 1;
}

void bk_teacher_free(bk_teacher *t)
{
	free(t->ids);
	free(t->logp);
	free(t->rest);
	memset(t, 0, sizeof *t);
}
