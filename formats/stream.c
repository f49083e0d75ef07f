/* stream.c - bakery record streams; see stream.h and man/bk-stream.5.
 *
 * Invariants of the reader:
 *  1. buf[off, len) holds bytes read but not yet parsed; a record is parsed only when
 *     all its bytes are in the buffer (msgpack_unpack_next on the whole record), so
 *     raw = buf + record start is exact and the hash covers the bytes as stored.
 *  2. The current record's objects point into buf; buf is only compacted or grown in
 *     fill(), which runs before parsing the next record.
 *  3. The header is deep-copied (own sbuffer + zone) and lives until close.
 *  4. After the trailer only EOF is accepted.
 *  5. A regular file is verified whole (every record parses, count and checksum of the
 *     trailer) when it is opened, before the caller sees its header: only a pipe can
 *     fail after records were handed on. */
#include "stream.h"
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/hash.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define BK_MAGIC "bakery-stream"
#define READ_CHUNK (1u << 16)
#define MAX_OBJECT (1ul << 30) /* a record over 1 GiB is taken as corruption */

struct bk_reader {
	FILE *f;
	char *name;
	char *buf;
	size_t cap, len, off;
	int eof, done, own;
	msgpack_unpacked cur;
	const char *raw;
	size_t rawlen;
	uint64_t count;
	XXH3_state_t *xx;
	msgpack_sbuffer hdr_buf;
	msgpack_unpacked hdr;
};

static void fill(bk_reader *r)
{
	if (r->off > 0) { /* compact: the previous record is no longer referenced */
		memmove(r->buf, r->buf + r->off, r->len - r->off);
		r->len -= r->off;
		r->off = 0;
	}
	if (r->cap - r->len < READ_CHUNK) {
		r->cap = r->cap * 2 > r->len + READ_CHUNK ? r->cap * 2 : r->len + READ_CHUNK;
		r->buf = xrealloc(r->buf, r->cap);
	}
	/* read(2) returns what a pipe holds now, so a record is handled as soon as it
	 * has arrived (fread would wait for the whole 64 KiB: no overlap of stages);
	 * streams without a descriptor (fmemopen) use fread */
	size_t n;
	int fd = fileno(r->f);
	if (fd >= 0) {
		ssize_t k;
		while ((k = read(fd, r->buf + r->len, r->cap - r->len)) < 0 && errno == EINTR)
			;
		if (k < 0)
			die("%s: read error: %s", r->name, strerror(errno));
		n = (size_t)k;
	} else {
		n = fread(r->buf + r->len, 1, r->cap - r->len, r->f);
		if (n == 0 && ferror(r->f))
			die("%s: read error: %s", r->name, strerror(errno));
	}
	r->len += n;
	if (n == 0)
		r->eof = 1;
}

static uint64_t be(const unsigned char *p, int k)
{
	uint64_t v = 0;
	for (int i = 0; i < k; i++)
		v = v << 8 | p[i];
	return v;
}

/* Length of the msgpack object at p[0..n) from its type tags and sizes alone: > 0 its
 * byte length, 0 when more bytes are needed, -1 when it cannot be msgpack within
 * MAX_OBJECT.  Run before msgpack-c so that a corrupt size field (a map "of 2^31
 * entries") is refused instead of making the library allocate for it. */
static long object_length(const unsigned char *p, size_t n)
{
	size_t pos = 0;
	uint64_t pending = 1; /* objects still to walk */
	while (pending) {
		if (pos >= n)
			return 0;
		unsigned b = p[pos];
		uint64_t head = 1, body = 0, items = 0;
		if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
			;
		else if (b <= 0x8f)
			items = 2 * (uint64_t)(b & 0xf);
		else if (b <= 0x9f)
			items = b & 0xf;
		else if (b <= 0xbf)
			body = b & 0x1f;
		else if (b == 0xc1)
			return -1;
		else {
			static const unsigned char len_bytes[] = {
				[0xc4 - 0xc4] = 1, 2, 4,       /* bin 8/16/32 */
				[0xc7 - 0xc4] = 1, 2, 4,       /* ext 8/16/32 */
				[0xca - 0xc4] = 0, 0,          /* float32/64 */
				[0xcc - 0xc4] = 0, 0, 0, 0,    /* uint */
				[0xd0 - 0xc4] = 0, 0, 0, 0,    /* int */
				[0xd4 - 0xc4] = 0, 0, 0, 0, 0, /* fixext */
				[0xd9 - 0xc4] = 1, 2, 4,       /* str 8/16/32 */
				[0xdc - 0xc4] = 2, 4,          /* array 16/32 */
				[0xde - 0xc4] = 2, 4,          /* map 16/32 */
			};
			static const unsigned char fixed[] = {
				[0xca - 0xc4] = 4, 8, [0xcc - 0xc4] = 1, 2, 4, 8,
				[0xd0 - 0xc4] = 1, 2, 4, 8, [0xd4 - 0xc4] = 2, 3, 5, 9, 17,
			};
			int k = len_bytes[b - 0xc4];
			head += (uint64_t)k + (b >= 0xc7 && b <= 0xc9);
			if (pos + head > n)
				return 0;
			uint64_t v = be(p + pos + 1, k);
			if (b >= 0xdc && b <= 0xdd)
				items = v;
			else if (b >= 0xde)
				items = 2 * v;
			else if (k)
				body = v;
			else
				body = fixed[b - 0xc4];
		}
		/* every pending object needs at least one byte: a count that cannot fit
		 * is corruption, not a reason to read on */
		if (items > MAX_OBJECT || body > MAX_OBJECT || pos + head + body > MAX_OBJECT ||
		    pending - 1 + items > MAX_OBJECT - pos)
			return -1;
		pos += head + body;
		pending += items - 1;
	}
	return pos <= n ? (long)pos : 0;
}

/* Parses the next msgpack object; returns 0 at a clean EOF (no bytes left). */
static int next_object(bk_reader *r, const char *what)
{
	for (;;) {
		size_t off = r->off;
		long len = object_length((const unsigned char *)r->buf + r->off, r->len - r->off);
		if (len < 0)
			die("%s: stream corrupt: %s is not valid msgpack", r->name, what);
		if (len == 0 && r->len - r->off > MAX_OBJECT)
			die("%s: stream corrupt: %s is larger than 1 GiB", r->name, what);
		msgpack_unpacked_destroy(&r->cur);
		msgpack_unpacked_init(&r->cur);
		msgpack_unpack_return ret =
			len == 0 ? MSGPACK_UNPACK_CONTINUE
				 : msgpack_unpack_next(&r->cur, r->buf, r->off + (size_t)len, &off);
		if (ret == MSGPACK_UNPACK_SUCCESS) {
			r->raw = r->buf + r->off;
			r->rawlen = off - r->off;
			r->off = off;
			return 1;
		}
		if (ret == MSGPACK_UNPACK_CONTINUE) {
			if (r->eof) {
				if (r->off == r->len)
					return 0;
				die("%s: stream truncated in %s", r->name, what);
			}
			fill(r);
			continue;
		}
		if (ret == MSGPACK_UNPACK_NOMEM_ERROR)
			die("%s: out of memory reading %s", r->name, what);
		die("%s: stream corrupt: %s is not valid msgpack", r->name, what);
	}
}

/* A regular file is read whole once before it is used (invariant 5): a damaged file
 * is reported as damaged before any record (or header field) of it is acted on. */
static void verify_file(FILE *f, const char *path)
{
	bk_reader *r = bk_reader_from_file(f, path);
	while (bk_reader_next(r))
		;
	bk_reader_close(r);
	if (lseek(fileno(f), 0, SEEK_SET) != 0)
		die("%s: %s", path, strerror(errno));
}

bk_reader *bk_reader_open(const char *path)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	if (!f)
		die("%s: %s", path, strerror(errno));
	struct stat st;
	if (f != stdin && fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode))
		verify_file(f, path);
	bk_reader *r = bk_reader_from_file(f, strcmp(path, "-") ? path : "stdin");
	r->own = f != stdin;
	return r;
}

bk_reader *bk_reader_from_file(FILE *f, const char *name)
{
	bk_reader *r = xcalloc(1, sizeof *r);
	r->name = xstrdup(name);
	r->f = f;
	msgpack_unpacked_init(&r->cur);
	msgpack_unpacked_init(&r->hdr);
	r->xx = XXH3_createState();
	if (!r->xx)
		die("out of memory");
	XXH3_64bits_reset(r->xx);
	fill(r);
	if (!next_object(r, "the header"))
		die("%s: empty stream (no header)", r->name);
	XXH3_64bits_update(r->xx, r->raw, r->rawlen); /* the checksum covers the header */
	const msgpack_object *h = &r->cur.data;
	const msgpack_object *fmt = bk_obj_get(h, "bk");
	if (h->type != MSGPACK_OBJECT_MAP || !fmt || !bk_obj_is(fmt, "header"))
		die("%s: not a bakery stream (no header map first)", r->name);
	const msgpack_object *ver = bk_obj_get(h, "version");
	if (!ver || ver->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
		die("%s: stream header has no version", r->name);
	if (ver->via.u64 != BK_STREAM_VERSION)
		die("%s: stream version %" PRIu64 " is not supported (this is version %d); "
		    "regenerate it with this bakery",
		    r->name, ver->via.u64, BK_STREAM_VERSION);
	const msgpack_object *prov = bk_obj_get(h, "provenance");
	if (prov && prov->type != MSGPACK_OBJECT_ARRAY)
		die("%s: stream header: 'provenance' is not an array", r->name);
	/* deep copy the header so it survives buffer compaction (invariant 3) */
	msgpack_sbuffer_init(&r->hdr_buf);
	msgpack_packer pk;
	msgpack_packer_init(&pk, &r->hdr_buf, msgpack_sbuffer_write);
	msgpack_pack_object(&pk, *h);
	size_t hoff = 0;
	if (msgpack_unpack_next(&r->hdr, r->hdr_buf.data, r->hdr_buf.size, &hoff) !=
	    MSGPACK_UNPACK_SUCCESS)
		BUG("header copy does not parse");
	return r;
}

const msgpack_object *bk_reader_next(bk_reader *r)
{
	if (r->done)
		return NULL;
	char what[64];
	snprintf(what, sizeof what, "record %" PRIu64, r->count + 1);
	if (!next_object(r, what))
		die("%s: stream truncated after %" PRIu64 " record%s (no trailer)", r->name,
		    r->count, bk_s(r->count));
	const msgpack_object *o = &r->cur.data;
	if (o->type != MSGPACK_OBJECT_MAP)
		die("%s: stream corrupt: record %" PRIu64 " is not a map", r->name, r->count + 1);
	const msgpack_object *bk = bk_obj_get(o, "bk");
	if (!bk) {
		XXH3_64bits_update(r->xx, r->raw, r->rawlen);
		r->count++;
		return o;
	}
	if (!bk_obj_is(bk, "trailer"))
		die("%s: stream corrupt: unexpected '%.*s' map at record %" PRIu64, r->name,
		    bk->type == MSGPACK_OBJECT_STR ? (int)bk->via.str.size : 1,
		    bk->type == MSGPACK_OBJECT_STR ? bk->via.str.ptr : "?", r->count + 1);
	const msgpack_object *cnt = bk_obj_get(o, "count");
	const msgpack_object *hx = bk_obj_get(o, "xxh3");
	if (!cnt || cnt->type != MSGPACK_OBJECT_POSITIVE_INTEGER || !hx ||
	    hx->type != MSGPACK_OBJECT_STR)
		die("%s: stream corrupt: malformed trailer", r->name);
	if (cnt->via.u64 != r->count)
		die("%s: stream corrupt: trailer says %" PRIu64 " record%s, read %" PRIu64,
		    r->name, cnt->via.u64, bk_s(cnt->via.u64), r->count);
	char want[17];
	bk_hash_hex(XXH3_64bits_digest(r->xx), want);
	if (hx->via.str.size != 16 || memcmp(hx->via.str.ptr, want, 16))
		die("%s: stream corrupt: checksum mismatch (header or records changed after writing)",
		    r->name);
	/* invariant 4: nothing may follow */
	if (r->off == r->len && !r->eof)
		fill(r);
	if (r->off != r->len)
		die("%s: stream corrupt: data after the trailer", r->name);
	r->done = 1;
	return NULL;
}

const char *bk_reader_raw(const bk_reader *r, size_t *len)
{
	*len = r->rawlen;
	return r->raw;
}

const msgpack_object *bk_reader_header(const bk_reader *r) { return &r->hdr.data; }

const msgpack_object_array *bk_reader_provenance(const bk_reader *r)
{
	static const msgpack_object_array empty;
	const msgpack_object *p = bk_obj_get(&r->hdr.data, "provenance");
	return p ? &p->via.array : &empty;
}

const msgpack_object *bk_reader_prov(const bk_reader *r, const char *key)
{
	const msgpack_object_array *a = bk_reader_provenance(r);
	for (uint32_t i = a->size; i-- > 0;) {
		const msgpack_object *v = bk_obj_get(&a->ptr[i], key);
		if (v)
			return v;
	}
	return NULL;
}

char *bk_reader_prov_str(const bk_reader *r, const char *key)
{
	const msgpack_object *v = bk_reader_prov(r, key);
	if (!v || v->type != MSGPACK_OBJECT_STR)
		return NULL;
	return xstrndup(v->via.str.ptr, v->via.str.size);
}

void bk_reader_expect(const bk_reader *r, const char *key, const char *want, const char *what)
{
	const msgpack_object *v = bk_reader_prov(r, key);
	if (!v)
		return;
	if (v->type == MSGPACK_OBJECT_STR && strlen(want) == v->via.str.size &&
	    !memcmp(want, v->via.str.ptr, v->via.str.size))
		return;
	char got[64] = "?";
	if (v->type == MSGPACK_OBJECT_STR)
		snprintf(got, sizeof got, "%.*s", (int)v->via.str.size, v->via.str.ptr);
	else if (v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32)
		snprintf(got, sizeof got, "%g", v->via.f64);
	else if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		snprintf(got, sizeof got, "%" PRIu64, v->via.u64);
	else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		snprintf(got, sizeof got, "%" PRId64, v->via.i64);
	die("%s: stream was made with another %s (stream: %s, given: %s)", r->name, what, got,
	    want);
}

void bk_reader_expect_file(const bk_reader *r, const char *key, const char *path,
			   const char *what)
{
	char hex[17];
	bk_hash_hex(bk_hash_file(path), hex);
	bk_reader_expect(r, key, hex, what);
}

void bk_reader_expect_system(const bk_reader *r, const char *text)
{
	char hex[17];
	bk_hash_hex(bk_hash(text, strlen(text), 0), hex);
	bk_reader_expect(r, "system", hex, "system prompt");
}

const char *bk_reader_name(const bk_reader *r) { return r->name; }
uint64_t bk_reader_count(const bk_reader *r) { return r->count; }

void bk_reader_close(bk_reader *r)
{
	if (!r)
		return;
	if (r->own)
		fclose(r->f);
	msgpack_unpacked_destroy(&r->cur);
	msgpack_unpacked_destroy(&r->hdr);
	msgpack_sbuffer_destroy(&r->hdr_buf);
	XXH3_freeState(r->xx);
	free(r->buf);
	free(r->name);
	free(r);
}

void bk_reader_die(const bk_reader *r, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	die("%s: record %" PRIu64 ": %s", r->name, r->count, msg);
}

/* ---------------- map access ---------------- */

const msgpack_object *bk_obj_get(const msgpack_object *map, const char *key)
{
	if (!map || map->type != MSGPACK_OBJECT_MAP)
		return NULL;
	size_t klen = strlen(key);
	for (uint32_t i = 0; i < map->via.map.size; i++) {
		const msgpack_object *k = &map->via.map.ptr[i].key;
		if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == klen &&
		    !memcmp(k->via.str.ptr, key, klen))
			return &map->via.map.ptr[i].val;
	}
	return NULL;
}

int bk_obj_is(const msgpack_object *o, const char *s)
{
	return o && o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
	       !memcmp(o->via.str.ptr, s, o->via.str.size);
}

int bk_rec_ids_opt(const bk_reader *r, const msgpack_object *rec, const char *key,
		   int32_t **ids, size_t *cap, size_t *n)
{
	const msgpack_object *v = bk_obj_get(rec, key);
	*n = 0;
	if (!v)
		return 0;
	if (v->type != MSGPACK_OBJECT_ARRAY)
		bk_reader_die(r, "field '%s' is not an array of token ids", key);
	if (v->via.array.size > *cap) {
		*cap = v->via.array.size;
		*ids = xrealloc(*ids, *cap * sizeof **ids);
	}
	for (uint32_t i = 0; i < v->via.array.size; i++) {
		const msgpack_object *e = &v->via.array.ptr[i];
		if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > INT32_MAX)
			bk_reader_die(r, "field '%s' item %u is not a token id", key, i);
		(*ids)[i] = (int32_t)e->via.u64;
	}
	*n = v->via.array.size;
	return 1;
}

size_t bk_rec_ids(const bk_reader *r, const msgpack_object *rec, const char *key,
		  int32_t **ids, size_t *cap)
{
	size_t n;
	if (!bk_rec_ids_opt(r, rec, key, ids, cap, &n))
		bk_reader_die(r, "missing field '%s'", key);
	return n;
}

int bk_rec_int_opt(const bk_reader *r, const msgpack_object *rec, const char *key, int64_t *v)
{
	const msgpack_object *o = bk_obj_get(rec, key);
	if (!o)
		return 0;
	if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 <= INT64_MAX)
		*v = (int64_t)o->via.u64;
	else if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		*v = o->via.i64;
	else
		bk_reader_die(r, "field '%s' is not an integer", key);
	return 1;
}

/* ---- batch order ---- */

static size_t batch_slot(const bk_batch_order *o, int64_t e, int64_t b)
{
	uint64_t h = (uint64_t)b * 0x9E3779B97F4A7C15ull ^ ((uint64_t)e + 0x632BE59BD9B4E019ull);
	h ^= h >> 29;
	size_t i = (size_t)(h & (o->cap - 1));
	while (o->used[i] && (o->e[i] != e || o->b[i] != b))
		i = (i + 1) & (o->cap - 1);
	return i;
}

static void batch_finish(bk_batch_order *o, int64_t e, int64_t b)
{
	if ((o->n + 1) * 2 > o->cap) {
		bk_batch_order g = {0};
		g.cap = o->cap ? o->cap * 2 : 64;
		g.e = xcalloc(g.cap, sizeof *g.e);
		g.b = xcalloc(g.cap, sizeof *g.b);
		g.used = xcalloc(g.cap, 1);
		for (size_t i = 0; i < o->cap; i++)
			if (o->used[i]) {
				size_t j = batch_slot(&g, o->e[i], o->b[i]);
				g.used[j] = 1, g.e[j] = o->e[i], g.b[j] = o->b[i];
			}
		free(o->e), free(o->b), free(o->used);
		o->e = g.e, o->b = g.b, o->used = g.used, o->cap = g.cap;
	}
	size_t j = batch_slot(o, e, b);
	if (!o->used[j]) {
		o->used[j] = 1, o->e[j] = e, o->b[j] = b;
		o->n++;
	}
}

int bk_batch_next(bk_batch_order *o, const bk_reader *r, const msgpack_object *rec,
		  int64_t *batch)
{
	int64_t b, e = 0;
	if (!bk_rec_int_opt(r, rec, "batch", &b))
		return 0;
	bk_rec_int_opt(r, rec, "epoch", &e);
	*batch = b;
	if (!o->has_cur || b != o->cur_b) { /* a run of records of one batch ends */
		for (size_t i = 0; i < o->n_run; i++)
			batch_finish(o, o->run_e[i], o->cur_b);
		o->n_run = 0;
		if (o->cap && o->used[batch_slot(o, e, b)])
			bk_reader_die(r, "batch %lld (epoch %lld) comes back after other batches: "
				      "records of one batch must be adjacent (a merge with the wrong "
				      "reference, or an edited stream?)",
				      (long long)b, (long long)e);
		o->has_cur = 1, o->cur_b = b;
	}
	/* the epochs of this run (bk-lens after bk-gen mixes them in one batch; bk-gen
	 * after bk-lens repeats each batch number once per epoch) */
	size_t i = 0;
	while (i < o->n_run && o->run_e[i] != e)
		i++;
	if (i == o->n_run) {
		if (o->n_run == o->cap_run) {
			o->cap_run = o->cap_run ? 2 * o->cap_run : 8;
			o->run_e = xrealloc(o->run_e, o->cap_run * sizeof *o->run_e);
		}
		o->run_e[o->n_run++] = e;
	}
	return 1;
}

void bk_batch_order_free(bk_batch_order *o)
{
	free(o->e), free(o->b), free(o->used), free(o->run_e);
	memset(o, 0, sizeof *o);
}

int bk_obj_number(const msgpack_object *o, double *v)
{
	if (!o)
		return 0;
	switch (o->type) {
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: *v = o->via.f64; return 1;
	case MSGPACK_OBJECT_POSITIVE_INTEGER: *v = (double)o->via.u64; return 1;
	case MSGPACK_OBJECT_NEGATIVE_INTEGER: *v = (double)o->via.i64; return 1;
	default: return 0;
	}
}

int64_t bk_rec_int(const bk_reader *r, const msgpack_object *rec, const char *key)
{
	int64_t v;
	if (!bk_rec_int_opt(r, rec, key, &v))
		bk_reader_die(r, "missing field '%s'", key);
	return v;
}

char *bk_rec_str_opt(const bk_reader *r, const msgpack_object *rec, const char *key)
{
	const msgpack_object *o = bk_obj_get(rec, key);
	if (!o)
		return NULL;
	if (o->type != MSGPACK_OBJECT_STR)
		bk_reader_die(r, "field '%s' is not a string", key);
	return xstrndup(o->via.str.ptr, o->via.str.size);
}

/* ---------------- writing ---------------- */

struct bk_writer {
	bk_out *out;
	FILE *f;
	int flush_each; /* a pipe or terminal: hand each record on at once */
	msgpack_sbuffer body;
	msgpack_packer pk;
	uint32_t nfields;
	int in_record, header_done;
	int optional, dead; /* bk_writer_optional; the reader went away */
	const char *optional_what;
	uint64_t count;
	XXH3_state_t *xx;
};

bk_writer *bk_writer_open(const char *path)
{
	bk_writer *w = xcalloc(1, sizeof *w);
	w->out = bk_out_open(path);
	w->f = bk_out_file(w->out);
	struct stat st;
	w->flush_each = fstat(fileno(w->f), &st) == 0 && !S_ISREG(st.st_mode);
	msgpack_sbuffer_init(&w->body);
	msgpack_packer_init(&w->pk, &w->body, msgpack_sbuffer_write);
	w->xx = XXH3_createState();
	if (!w->xx)
		die("out of memory");
	XXH3_64bits_reset(w->xx);
	return w;
}

static void write_failed(bk_writer *w)
{
	if (w->optional && errno == EPIPE) {
		w->dead = 1;
		warn("%s: the reader of the %s went away; going on without it",
		     bk_out_path(w->out), w->optional_what);
		return;
	}
	die("%s: write error: %s", bk_out_path(w->out), strerror(errno));
}

static void put(bk_writer *w, const void *p, size_t n)
{
	if (!w->dead && n && fwrite(p, 1, n, w->f) != n)
		write_failed(w);
}

void bk_pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
	msgpack_pack_str(pk, n);
	msgpack_pack_str_body(pk, s, n);
}

void bk_pack_str(msgpack_packer *pk, const char *s) { bk_pack_strn(pk, s, strlen(s)); }

void bk_pack_ids(msgpack_packer *pk, const int32_t *ids, size_t n)
{
	msgpack_pack_array(pk, n);
	for (size_t i = 0; i < n; i++)
		msgpack_pack_uint32(pk, (uint32_t)ids[i]);
}

void bk_writer_header_obj(bk_writer *w, const msgpack_object_array *prev, const bk_kv *items,
			  int n)
{
	BUG_ON(w->header_done);
	msgpack_sbuffer_clear(&w->body);
	msgpack_packer *pk = &w->pk;
	msgpack_pack_map(pk, 4);
	bk_pack_str(pk, "bk");
	bk_pack_str(pk, "header");
	bk_pack_str(pk, "format");
	bk_pack_str(pk, BK_MAGIC);
	bk_pack_str(pk, "version");
	msgpack_pack_uint32(pk, BK_STREAM_VERSION);
	bk_pack_str(pk, "provenance");
	uint32_t np = prev ? prev->size : 0;
	msgpack_pack_array(pk, np + 1);
	for (uint32_t i = 0; i < np; i++)
		msgpack_pack_object(pk, prev->ptr[i]);
	msgpack_pack_map(pk, (size_t)n + 2);
	bk_pack_str(pk, "tool");
	bk_pack_str(pk, bk_prog);
	bk_pack_str(pk, "version");
	bk_pack_str(pk, BK_VERSION);
	for (int i = 0; i < n; i++) {
		bk_pack_str(pk, items[i].key);
		switch (items[i].type) {
		case BK_KV_STR:
			if (items[i].s)
				bk_pack_str(pk, items[i].s);
			else
				msgpack_pack_nil(pk);
			break;
		case BK_KV_INT:
			msgpack_pack_int64(pk, items[i].i);
			break;
		case BK_KV_NUM:
			msgpack_pack_double(pk, items[i].d);
			break;
		}
	}
	put(w, w->body.data, w->body.size);
	XXH3_64bits_update(w->xx, w->body.data, w->body.size); /* checksum covers the header */
	msgpack_sbuffer_clear(&w->body);
	w->header_done = 1;
}

void bk_writer_header(bk_writer *w, const bk_reader *in, const bk_kv *items, int n)
{
	bk_writer_header_obj(w, in ? bk_reader_provenance(in) : NULL, items, n);
}

msgpack_packer *bk_rec_begin(bk_writer *w)
{
	BUG_ON(!w->header_done || w->in_record);
	msgpack_sbuffer_clear(&w->body);
	w->nfields = 0;
	w->in_record = 1;
	return &w->pk;
}

void bk_rec_key(bk_writer *w, const char *key)
{
	BUG_ON(!w->in_record);
	w->nfields++;
	bk_pack_str(&w->pk, key);
}

void bk_rec_copy(bk_writer *w, const msgpack_object *in, const char *const *skip)
{
	BUG_ON(!w->in_record || in->type != MSGPACK_OBJECT_MAP);
	for (uint32_t i = 0; i < in->via.map.size; i++) {
		const msgpack_object_kv *kv = &in->via.map.ptr[i];
		int skipped = 0;
		for (const char *const *s = skip; s && *s && !skipped; s++)
			skipped = bk_obj_is(&kv->key, *s);
		if (skipped)
			continue;
		w->nfields++;
		msgpack_pack_object(&w->pk, kv->key);
		msgpack_pack_object(&w->pk, kv->val);
	}
}

static void emit_record(bk_writer *w, const char *hdr, size_t hn, const char *body, size_t bn)
{
	put(w, hdr, hn);
	put(w, body, bn);
	XXH3_64bits_update(w->xx, hdr, hn);
	XXH3_64bits_update(w->xx, body, bn);
	w->count++;
	if (!w->dead && w->flush_each && fflush(w->f) != 0)
		write_failed(w);
}

void bk_writer_optional(bk_writer *w, const char *what)
{
	w->optional = 1;
	w->optional_what = what;
}

int bk_writer_dead(const bk_writer *w) { return w->dead; }

void bk_rec_end(bk_writer *w)
{
	BUG_ON(!w->in_record);
	char hdr[8];
	size_t hn;
	/* msgpack map header for nfields, smallest form (as msgpack_pack_map writes it) */
	if (w->nfields < 16) {
		hdr[0] = (char)(0x80 | w->nfields);
		hn = 1;
	} else if (w->nfields < 65536) {
		hdr[0] = (char)0xde;
		hdr[1] = (char)(w->nfields >> 8);
		hdr[2] = (char)w->nfields;
		hn = 3;
	} else {
		hdr[0] = (char)0xdf;
		for (int i = 0; i < 4; i++)
			hdr[1 + i] = (char)(w->nfields >> (24 - 8 * i));
		hn = 5;
	}
	emit_record(w, hdr, hn, w->body.data, w->body.size);
	w->in_record = 0;
}

void bk_writer_raw(bk_writer *w, const char *data, size_t len)
{
	BUG_ON(!w->header_done || w->in_record);
	emit_record(w, data, len, NULL, 0);
}

uint64_t bk_writer_count(const bk_writer *w) { return w->count; }

void bk_writer_close(bk_writer *w)
{
	BUG_ON(!w->header_done || w->in_record);
	char hex[17];
	bk_hash_hex(XXH3_64bits_digest(w->xx), hex);
	msgpack_sbuffer_clear(&w->body);
	msgpack_pack_map(&w->pk, 3);
	bk_pack_str(&w->pk, "bk");
	bk_pack_str(&w->pk, "trailer");
	bk_pack_str(&w->pk, "count");
	msgpack_pack_uint64(&w->pk, w->count);
	bk_pack_str(&w->pk, "xxh3");
	bk_pack_str(&w->pk, hex);
	put(w, w->body.data, w->body.size);
	if (w->dead) /* nobody reads it: the flush would only fail again */
		clearerr(w->f);
	bk_out_commit(w->out);
	msgpack_sbuffer_destroy(&w->body);
	XXH3_freeState(w->xx);
	free(w);
}
