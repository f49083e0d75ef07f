/* shard.c - record ownership of shard i/N and the merge of shard streams (shard.h). */
#include "formats/shard.h"
#include "common/diag.h"
#include "common/flags.h"
#include "common/hash.h"

#include <stdlib.h>
#include <string.h>

bk_shard bk_shard_parse(const char *flag, const char *spec)
{
	bk_shard s = {0, 0};
	char *end;
	long i = strtol(spec, &end, 10);
	if (end == spec || *end != '/')
		die_usage("%s '%s': give I/N, e.g. 0/4", flag, spec);
	const char *q = end + 1;
	long n = strtol(q, &end, 10);
	if (end == q || *end || n < 1 || n > 1 << 20 || i < 0 || i >= n)
		die_usage("%s '%s': give I/N with 0 <= I < N", flag, spec);
	s.i = (int)i, s.n = (int)n;
	return s;
}

const char *bk_shard_str(const bk_shard *s, char *buf, size_t n)
{
	snprintf(buf, n, "%d/%d", s->i, s->n);
	return buf;
}

/* the record's id as a number: bk-tokenize's 16 hex digits, else a hash of the text */
static uint64_t id_value(const char *p, size_t n)
{
	uint64_t v = 0;
	int hex = n == 16;
	for (size_t k = 0; hex && k < n; k++) {
		char c = p[k];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (d < 0)
			hex = 0;
		else
			v = v << 4 | (uint64_t)d;
	}
	return hex ? v : bk_hash(p, n, 0);
}

int bk_shard_owns(const bk_shard *s, const bk_reader *in, const msgpack_object *rec)
{
	if (s->n <= 1)
		return 1;
	const msgpack_object *id = bk_obj_get(rec, "id");
	if (!id || id->type != MSGPACK_OBJECT_STR)
		bk_reader_die(in, "no string 'id': --shard assigns records by id");
	return id_value(id->via.str.ptr, id->via.str.size) % (uint64_t)s->n == (uint64_t)s->i;
}

/* ---- merge ---- */

typedef struct {
	char *id;
	int64_t traj, epoch; /* -1 when absent */
	size_t off, len, seq;
	int used;
} ent;

static int cmp_ent(const void *a, const void *b)
{
	const ent *x = a, *y = b;
	int c = strcmp(x->id, y->id);
	if (c)
		return c;
	if (x->epoch != y->epoch)
		return x->epoch < y->epoch ? -1 : 1;
	if (x->traj != y->traj)
		return x->traj < y->traj ? -1 : 1;
	return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static char *rec_id(const bk_reader *in, const msgpack_object *rec)
{
	const msgpack_object *id = bk_obj_get(rec, "id");
	if (!id || id->type != MSGPACK_OBJECT_STR)
		bk_reader_die(in, "no string 'id': shards are merged by record id");
	return xstrndup(id->via.str.ptr, id->via.str.size);
}

static int64_t opt_int(const bk_reader *in, const msgpack_object *rec, const char *key,
		       int *has)
{
	int64_t v = -1;
	if (bk_rec_int_opt(in, rec, key, &v))
		*has = 1;
	return v;
}

/* a provenance list without its 'shard' keys (objects point into the reader's) */
typedef struct {
	msgpack_object_array a;
	msgpack_object *items;
	msgpack_object_kv **kvs;
	uint8_t *sharded; /* entry i had a 'shard' key */
} stripped;

static void strip_shard(const msgpack_object_array *p, stripped *s, bk_shard *found,
			const char *path)
{
	s->items = xcalloc(p->size ? p->size : 1, sizeof *s->items);
	s->kvs = xcalloc(p->size ? p->size : 1, sizeof *s->kvs);
	s->sharded = xcalloc(p->size ? p->size : 1, 1);
	found->n = 0;
	for (uint32_t i = 0; i < p->size; i++) {
		const msgpack_object *e = &p->ptr[i];
		s->items[i] = *e;
		if (e->type != MSGPACK_OBJECT_MAP)
			continue;
		s->kvs[i] = xcalloc(e->via.map.size ? e->via.map.size : 1, sizeof **s->kvs);
		uint32_t k = 0;
		for (uint32_t j = 0; j < e->via.map.size; j++) {
			const msgpack_object_kv *kv = &e->via.map.ptr[j];
			if (bk_obj_is(&kv->key, "shard")) {
				if (kv->val.type != MSGPACK_OBJECT_STR)
					die("%s: header: 'shard' is not a string", path);
				char *t = xstrndup(kv->val.via.str.ptr, kv->val.via.str.size);
				*found = bk_shard_parse("header 'shard'", t); /* the newest one */
				free(t);
				s->sharded[i] = 1;
				continue;
			}
			s->kvs[i][k++] = *kv;
		}
		s->items[i].via.map.ptr = s->kvs[i];
		s->items[i].via.map.size = k;
	}
	s->a.ptr = s->items;
	s->a.size = p->size;
}

static void free_stripped(stripped *s)
{
	for (uint32_t i = 0; i < s->a.size; i++)
		free(s->kvs[i]);
	free(s->kvs);
	free(s->items);
	free(s->sharded);
}

static void pack_array(const msgpack_object_array *a, msgpack_sbuffer *sb)
{
	msgpack_packer pk;
	msgpack_sbuffer_init(sb);
	msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
	msgpack_object o = {.type = MSGPACK_OBJECT_ARRAY, .via.array = *a};
	msgpack_pack_object(&pk, o);
}

/* the index range [lo, hi) of entries with this id and epoch (e sorted by cmp_ent) */
static void find_range(const ent *e, size_t n, const char *id, int64_t epoch, size_t *lo,
		       size_t *hi)
{
	size_t a = 0, b = n;
	while (a < b) { /* first entry >= (id, epoch) */
		size_t m = (a + b) / 2;
		int c = strcmp(e[m].id, id);
		if (c < 0 || (c == 0 && e[m].epoch < epoch))
			a = m + 1;
		else
			b = m;
	}
	*lo = a;
	while (a < n && !strcmp(e[a].id, id) && e[a].epoch == epoch)
		a++;
	*hi = a;
}

/* The name of provenance entry e ('tool'), for messages. */
static char *entry_tool(const msgpack_object *e)
{
	const msgpack_object *t = e->type == MSGPACK_OBJECT_MAP ? bk_obj_get(e, "tool") : NULL;
	return t && t->type == MSGPACK_OBJECT_STR ? xstrndup(t->via.str.ptr, t->via.str.size)
						 : xstrdup("?");
}

/* REF must be the stream the shards read, or one before it with only sharded stages
 * (or merges of them) between: its provenance is the start of the shards' and every
 * entry after it is a sharded stage or a merge.  A REF that lacks a stage the shards
 * have (bk-lens: it reorders) would give another order (batches torn apart). */
static void check_ref(const msgpack_object_array *ref, const char *ref_name,
		      const stripped *st, const char *shard_name)
{
	uint32_t m = ref->size, n = st->a.size;
	for (uint32_t i = 0; i < m; i++)
		if (i >= n || !msgpack_object_equal(ref->ptr[i], st->a.ptr[i])) {
			char *t = entry_tool(&ref->ptr[i]);
			die("%s: its provenance entry %u (%s) is not in %s's: not the stream the "
			    "shards read (give that stream as REF)",
			    ref_name, i + 1, t, shard_name);
		}
	for (uint32_t i = m; i < n; i++) {
		const msgpack_object *e = &st->a.ptr[i];
		if (st->sharded[i] ||
		    (e->type == MSGPACK_OBJECT_MAP && bk_obj_get(e, "merged_shards")))
			continue;
		char *t = entry_tool(e);
		die("%s: lacks the %s stage the shards of %s read (provenance entry %u): give "
		    "the stream the shards read as REF",
		    ref_name, t, shard_name, i + 1);
	}
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

void bk_shard_merge(const char *ref, const char *const *paths, int n, const char *out)
{
	BK_VEC(char) raw = {0};
	BK_VEC(ent) v = {0};
	int N = 0, *seen = NULL;
	msgpack_sbuffer prov0 = {0};
	stripped st0 = {0};
	bk_reader *r0 = NULL;
	for (int f = 0; f < n; f++) {
		bk_reader *in = bk_reader_open(paths[f]);
		stripped st;
		bk_shard sh;
		strip_shard(bk_reader_provenance(in), &st, &sh, paths[f]);
		if (!sh.n)
			die("%s: not a shard stream (no 'shard' in its header)", paths[f]);
		if (!N) {
			N = sh.n;
			seen = xcalloc((size_t)N, sizeof *seen);
		}
		if (sh.n != N)
			die("%s: shard %d/%d, but %s is a shard of %d", paths[f], sh.i, sh.n,
			    paths[0], N);
		if (seen[sh.i]++)
			die("%s: shard %d/%d is given twice", paths[f], sh.i, N);
		msgpack_sbuffer pb;
		pack_array(&st.a, &pb);
		if (!f) {
			prov0 = pb;
			st0 = st;
			r0 = in;
		} else {
			if (pb.size != prov0.size || memcmp(pb.data, prov0.data, pb.size))
				die("%s: its header differs from %s's beyond the 'shard' keys (another "
				    "run, model or flag)", paths[f], paths[0]);
			msgpack_sbuffer_destroy(&pb);
			free_stripped(&st);
		}
		const msgpack_object *rec;
		while ((rec = bk_reader_next(in))) {
			size_t len;
			const char *p = bk_reader_raw(in, &len);
			int has = 0;
			ent e = {rec_id(in, rec), opt_int(in, rec, "traj", &has),
				 opt_int(in, rec, "epoch", &has), raw.n, len, v.n, 0};
			bk_vec_reserve(&raw, raw.n + len);
			memcpy(raw.v + raw.n, p, len);
			raw.n += len;
			bk_vec_push(&v, e);
		}
		if (f)
			bk_reader_close(in);
	}
	for (int i = 0; i < N; i++)
		if (!seen[i])
			die("shard %d/%d is missing (give all %d shard streams)", i, N, N);
	if (n != N)
		die("%d streams given for %d shards", n, N);
	qsort(v.v, v.n, sizeof *v.v, cmp_ent);

	bk_reader *rr = bk_reader_open(ref);
	check_ref(bk_reader_provenance(rr), bk_reader_name(rr), &st0, paths[0]);
	bk_writer *w = bk_writer_open(out);
	bk_kv kv[] = {BK_KV_I("merged_shards", N)};
	bk_writer_header_obj(w, &st0.a, kv, 1);
	const msgpack_object *rec;
	int per_record = -1;
	BK_VEC(char *) ids = {0};
	while ((rec = bk_reader_next(rr))) {
		int has = 0;
		char *id = rec_id(rr, rec);
		int64_t traj = opt_int(rr, rec, "traj", &has), epoch = opt_int(rr, rec, "epoch", &has);
		if (per_record < 0)
			per_record = has;
		if (!per_record) {
			bk_vec_push(&ids, id);
			continue;
		}
		/* a stream of responses: its record's one counterpart */
		ent key = {id, traj, epoch, 0, 0, 0, 0};
		size_t lo, hi;
		find_range(v.v, v.n, id, epoch, &lo, &hi);
		ent *hit = NULL;
		for (size_t k = lo; k < hi && !hit; k++)
			if (v.v[k].traj == key.traj)
				hit = &v.v[k];
		if (!hit || hit->used)
			bk_reader_die(rr, "id %s (traj %lld, epoch %lld) is in no shard", id,
				      (long long)traj, (long long)epoch);
		hit->used = 1;
		bk_writer_raw(w, raw.v + hit->off, hit->len);
		free(id);
	}
	if (per_record == 0) { /* prompts: epoch by epoch, in ref's order */
		BK_VEC(int64_t) ep = {0};
		for (size_t k = 0; k < v.n; k++)
			if (!ep.n || ep.v[ep.n - 1] != v.v[k].epoch)
				bk_vec_push(&ep, v.v[k].epoch);
		qsort(ep.v, ep.n, sizeof *ep.v, cmp_i64);
		for (size_t e = 0; e < ep.n; e++) {
			if (e && ep.v[e] == ep.v[e - 1])
				continue;
			for (size_t r = 0; r < ids.n; r++) {
				size_t lo, hi;
				find_range(v.v, v.n, ids.v[r], ep.v[e], &lo, &hi);
				for (size_t k = lo; k < hi; k++) {
					if (v.v[k].used) /* an id twice in ref */
						continue;
					v.v[k].used = 1;
					bk_writer_raw(w, raw.v + v.v[k].off, v.v[k].len);
				}
			}
		}
		free(ep.v);
	}
	for (size_t k = 0; k < v.n; k++)
		if (!v.v[k].used)
			die("%s: a shard record (id %s, traj %lld, epoch %lld) matches no record of %s",
			    paths[0], v.v[k].id, (long long)v.v[k].traj, (long long)v.v[k].epoch, ref);
	bk_writer_close(w);
	bk_reader_close(rr);
	for (size_t r = 0; r < ids.n; r++)
		free(ids.v[r]);
	free(ids.v);
	for (size_t k = 0; k < v.n; k++)
		free(v.v[k].id);
	free(v.v);
	free(raw.v);
	free(seen);
	msgpack_sbuffer_destroy(&prov0);
	free_stripped(&st0);
	bk_reader_close(r0);
}
