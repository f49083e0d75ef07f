/* gguf.c - GGUF reader and ggml dequantization (see gguf.h for the invariants).
 * The block layouts are ggml's (ggml-common.h): every block starts or ends with fp16
 * scales, quants packed low nibble first.  Written from the format's description, not
 * from llama.cpp's code. */
#include "formats/gguf.h"

#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/files.h"
#include "formats/safetensors.h"

struct bk_gguf {
	char *path;
	bk_map map; /* len 0 when the buffer is the caller's */
	const uint8_t *data;
	size_t len;
	uint32_t version;
	uint64_t alignment;
	size_t data_start;
	bk_gguf_kv *kv;
	size_t n_kv;
	bk_gguf_tensor *t;
	size_t n_t;
};

/* ---- reading the header ---- */

typedef struct {
	const bk_gguf *g;
	size_t pos;
} cursor;

static void need(cursor *c, uint64_t n, const char *what)
{
	if (n > c->g->len - c->pos)
		die("%s: truncated at byte %zu reading %s (%llu bytes needed, %zu left)",
		    c->g->path, c->pos, what, (unsigned long long)n, c->g->len - c->pos);
}

static uint32_t rd_u32(cursor *c, const char *what)
{
	need(c, 4, what);
	uint32_t v;
	memcpy(&v, c->g->data + c->pos, 4);
	c->pos += 4;
	return v;
}

static uint64_t rd_u64(cursor *c, const char *what)
{
	need(c, 8, what);
	uint64_t v;
	memcpy(&v, c->g->data + c->pos, 8);
	c->pos += 8;
	return v;
}

static bk_gguf_str rd_str(cursor *c, const char *what)
{
	uint64_t n = rd_u64(c, what);
	need(c, n, what);
	bk_gguf_str s = { (const char *)c->g->data + c->pos, n };
	c->pos += n;
	return s;
}

static size_t scalar_size(uint32_t type)
{
	switch (type) {
	case BK_GGUF_U8: case BK_GGUF_I8: case BK_GGUF_BOOL: return 1;
	case BK_GGUF_U16: case BK_GGUF_I16: return 2;
	case BK_GGUF_U32: case BK_GGUF_I32: case BK_GGUF_F32: return 4;
	case BK_GGUF_U64: case BK_GGUF_I64: case BK_GGUF_F64: return 8;
	default: return 0;
	}
}

static void rd_value(cursor *c, bk_gguf_kv *kv)
{
	const char *path = c->g->path;
	if (kv->type == BK_GGUF_ARRAY) {
		kv->arr_type = rd_u32(c, kv->key);
		kv->n = rd_u64(c, kv->key);
		if (kv->arr_type == BK_GGUF_ARRAY)
			die("%s: key '%s': arrays of arrays are not supported", path, kv->key);
		if (kv->arr_type == BK_GGUF_STRING) {
			/* each string takes at least its 8-byte length */
			if (kv->n > (c->g->len - c->pos) / 8)
				die("%s: key '%s': array of %llu strings does not fit in the file",
				    path, kv->key, (unsigned long long)kv->n);
			kv->strs = xmalloc((kv->n ? kv->n : 1) * sizeof(bk_gguf_str));
			for (uint64_t i = 0; i < kv->n; i++)
				kv->strs[i] = rd_str(c, kv->key);
			return;
		}
		size_t es = scalar_size(kv->arr_type);
		if (!es)
			die("%s: key '%s': unknown array element type %u", path, kv->key,
			    kv->arr_type);
		if (kv->n > (c->g->len - c->pos) / es)
			die("%s: key '%s': array of %llu elements does not fit in the file", path,
			    kv->key, (unsigned long long)kv->n);
		kv->data = c->g->data + c->pos;
		c->pos += kv->n * es;
		return;
	}
	kv->n = 1;
	if (kv->type == BK_GGUF_STRING) {
		kv->strs = xmalloc(sizeof(bk_gguf_str));
		kv->strs[0] = rd_str(c, kv->key);
		return;
	}
	size_t es = scalar_size(kv->type);
	if (!es)
		die("%s: key '%s': unknown value type %u", path, kv->key, kv->type);
	need(c, es, kv->key);
	kv->data = c->g->data + c->pos;
	c->pos += es;
}

static const struct {
	uint32_t id;
	const char *name;
	int elems;
	size_t bytes;
} types[] = {
	{ BK_GGML_F32, "F32", 1, 4 },     { BK_GGML_F16, "F16", 1, 2 },
	{ BK_GGML_Q4_0, "Q4_0", 32, 18 }, { BK_GGML_Q4_1, "Q4_1", 32, 20 },
	{ BK_GGML_Q8_0, "Q8_0", 32, 34 }, { BK_GGML_Q4_K, "Q4_K", 256, 144 },
	{ BK_GGML_Q6_K, "Q6_K", 256, 210 }, { BK_GGML_BF16, "BF16", 1, 2 },
	{ BK_GGML_Q5_0, "Q5_0", 32, 22 }, { BK_GGML_Q5_1, "Q5_1", 32, 24 },
	{ BK_GGML_Q5_K, "Q5_K", 256, 176 },
	/* known, not dequantized here: sizes for validation and messages */
	{ 9, "Q8_1", 32, 36 },
	{ 10, "Q2_K", 256, 84 }, { 11, "Q3_K", 256, 110 },
	{ 15, "Q8_K", 256, 292 }, { 16, "IQ2_XXS", 256, 66 }, { 17, "IQ2_XS", 256, 74 },
	{ 18, "IQ3_XXS", 256, 98 }, { 19, "IQ1_S", 256, 50 }, { 20, "IQ4_NL", 32, 18 },
	{ 21, "IQ3_S", 256, 110 }, { 22, "IQ2_S", 256, 82 }, { 23, "IQ4_XS", 256, 136 },
	{ 24, "I8", 1, 1 },      { 25, "I16", 1, 2 },     { 26, "I32", 1, 4 },
	{ 27, "I64", 1, 8 },     { 28, "F64", 1, 8 },     { 29, "IQ1_M", 256, 56 },
	{ 34, "TQ1_0", 256, 54 }, { 35, "TQ2_0", 256, 66 },
};
#define N_TYPES (sizeof types / sizeof types[0])

static int type_index(uint32_t id)
{
	for (size_t i = 0; i < N_TYPES; i++)
		if (types[i].id == id)
			return (int)i;
	return -1;
}

const char *bk_ggml_type_name(uint32_t type)
{
	int i = type_index(type);
	return i < 0 ? "unknown" : types[i].name;
}

int bk_ggml_type_supported(uint32_t type)
{
	switch (type) {
	case BK_GGML_F32: case BK_GGML_F16: case BK_GGML_BF16: case BK_GGML_Q4_0:
	case BK_GGML_Q4_1: case BK_GGML_Q5_0: case BK_GGML_Q5_1: case BK_GGML_Q8_0:
	case BK_GGML_Q4_K: case BK_GGML_Q5_K: case BK_GGML_Q6_K:
		return 1;
	default:
		return 0;
	}
}

int bk_ggml_block_elems(uint32_t type)
{
	return bk_ggml_type_supported(type) ? types[type_index(type)].elems : 0;
}

size_t bk_ggml_block_bytes(uint32_t type)
{
	return bk_ggml_type_supported(type) ? types[type_index(type)].bytes : 0;
}

static int cmp_offset(const void *a, const void *b)
{
	const bk_gguf_tensor *x = *(const bk_gguf_tensor *const *)a;
	const bk_gguf_tensor *y = *(const bk_gguf_tensor *const *)b;
	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static char *str_copy(const bk_gguf *g, bk_gguf_str s, const char *what)
{
	if (memchr(s.s, 0, s.n))
		die("%s: %s holds a NUL byte", g->path, what);
	return xstrndup(s.s, s.n);
}

static void parse(bk_gguf *g)
{
	cursor c = { g, 0 };
	if (g->len < 4 || memcmp(g->data, "GGUF", 4))
		die("%s: not a GGUF file (no 'GGUF' magic)", g->path);
	c.pos = 4;
	g->version = rd_u32(&c, "the version");
	if (g->version != 2 && g->version != 3)
		die("%s: GGUF version %u is not supported (supported: 2, 3)", g->path, g->version);
	uint64_t n_t = rd_u64(&c, "the tensor count");
	uint64_t n_kv = rd_u64(&c, "the key count");
	/* a key takes at least 12 bytes, a tensor info at least 28 */
	if (n_kv > g->len / 12 || n_t > g->len / 28)
		die("%s: %llu keys and %llu tensors cannot fit in a file of %zu bytes", g->path,
		    (unsigned long long)n_kv, (unsigned long long)n_t, g->len);
	g->kv = xcalloc(n_kv ? n_kv : 1, sizeof(bk_gguf_kv));
	for (uint64_t i = 0; i < n_kv; i++) {
		bk_gguf_kv *kv = &g->kv[i];
		bk_gguf_str k = rd_str(&c, "a key");
		kv->key = str_copy(g, k, "a key");
		g->n_kv = i + 1;
		for (uint64_t j = 0; j < i; j++)
			if (!strcmp(g->kv[j].key, kv->key))
				die("%s: key '%s' appears twice", g->path, kv->key);
		kv->type = rd_u32(&c, kv->key);
		rd_value(&c, kv);
	}
	g->alignment = 32;
	const bk_gguf_kv *al = bk_gguf_find_kv(g, "general.alignment");
	if (al) {
		if (al->type != BK_GGUF_U32)
			die("%s: key 'general.alignment' is not a uint32", g->path);
		uint32_t a;
		memcpy(&a, al->data, 4);
		if (!a || (a & (a - 1)))
			die("%s: general.alignment %u is not a power of two", g->path, a);
		g->alignment = a;
	}
	g->t = xcalloc(n_t ? n_t : 1, sizeof(bk_gguf_tensor));
	for (uint64_t i = 0; i < n_t; i++) {
		bk_gguf_tensor *t = &g->t[i];
		bk_gguf_str nm = rd_str(&c, "a tensor name");
		t->name = str_copy(g, nm, "a tensor name");
		g->n_t = i + 1;
		uint32_t nd = rd_u32(&c, t->name);
		if (nd < 1 || nd > 4)
			die("%s: tensor '%s': %u dimensions (1 to 4 allowed)", g->path, t->name, nd);
		t->ndim = (int)nd;
		uint64_t numel = 1;
		for (uint32_t d = 0; d < nd; d++) {
			uint64_t ne = rd_u64(&c, t->name);
			if (ne < 1 || ne > ((uint64_t)1 << 40) || numel > (((uint64_t)1 << 62) / ne))
				die("%s: tensor '%s': dimension %u is %llu", g->path, t->name, d,
				    (unsigned long long)ne);
			t->ne[d] = (int64_t)ne;
			numel *= ne;
		}
		for (int d = t->ndim; d < 4; d++)
			t->ne[d] = 1;
		t->type = rd_u32(&c, t->name);
		t->offset = rd_u64(&c, t->name);
		int ti = type_index(t->type);
		if (ti < 0)
			die("%s: tensor '%s': unknown ggml type %u", g->path, t->name, t->type);
		if (t->ne[0] % types[ti].elems)
			die("%s: tensor '%s': ne[0] = %lld is not a multiple of %s's block of %d",
			    g->path, t->name, (long long)t->ne[0], types[ti].name, types[ti].elems);
		t->nbytes = (size_t)(numel / types[ti].elems * types[ti].bytes);
		if (t->offset % g->alignment)
			die("%s: tensor '%s': offset %llu is not a multiple of the alignment %llu",
			    g->path, t->name, (unsigned long long)t->offset,
			    (unsigned long long)g->alignment);
		for (uint64_t j = 0; j < i; j++)
			if (!strcmp(g->t[j].name, t->name))
				die("%s: tensor '%s' appears twice", g->path, t->name);
	}
	size_t ds = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
	if (n_t && ds > g->len)
		die("%s: truncated: the data region would start at byte %zu of %zu", g->path, ds,
		    g->len);
	g->data_start = ds;
	size_t room = g->len > ds ? g->len - ds : 0;
	for (size_t i = 0; i < g->n_t; i++) {
		bk_gguf_tensor *t = &g->t[i];
		if (t->offset > room || t->nbytes > room - t->offset)
			die("%s: tensor '%s': data [%llu, +%zu) lies outside the file's %zu data bytes",
			    g->path, t->name, (unsigned long long)t->offset, t->nbytes, room);
		t->data = g->data + ds + t->offset;
	}
	if (g->n_t > 1) {
		bk_gguf_tensor **o = xmalloc(g->n_t * sizeof(*o));
		for (size_t i = 0; i < g->n_t; i++)
			o[i] = &g->t[i];
		qsort(o, g->n_t, sizeof(*o), cmp_offset);
		for (size_t i = 1; i < g->n_t; i++)
			if (o[i - 1]->offset + o[i - 1]->nbytes > o[i]->offset)
				die("%s: tensors '%s' and '%s' overlap", g->path, o[i - 1]->name,
				    o[i]->name);
		free(o);
	}
}

bk_gguf *bk_gguf_open_mem(const char *name, const uint8_t *data, size_t len)
{
	bk_gguf *g = xcalloc(1, sizeof(*g));
	g->path = xstrdup(name);
	g->data = data;
	g->len = len;
	parse(g);
	return g;
}

bk_gguf *bk_gguf_open(const char *path)
{
	bk_map m = bk_map_file(path);
	bk_gguf *g = xcalloc(1, sizeof(*g));
	g->path = xstrdup(path);
	g->map = m;
	g->data = m.data;
	g->len = m.len;
	parse(g);
	return g;
}

void bk_gguf_close(bk_gguf *g)
{
	if (!g)
		return;
	for (size_t i = 0; i < g->n_kv; i++) {
		free(g->kv[i].key);
		free(g->kv[i].strs);
	}
	free(g->kv);
	for (size_t i = 0; i < g->n_t; i++)
		free(g->t[i].name);
	free(g->t);
	if (g->map.len)
		bk_unmap(&g->map);
	free(g->path);
	free(g);
}

const char *bk_gguf_path(const bk_gguf *g) { return g->path; }
uint32_t bk_gguf_version(const bk_gguf *g) { return g->version; }
size_t bk_gguf_n_kv(const bk_gguf *g) { return g->n_kv; }
const bk_gguf_kv *bk_gguf_kv_at(const bk_gguf *g, size_t i) { return &g->kv[i]; }
size_t bk_gguf_n_tensors(const bk_gguf *g) { return g->n_t; }
const bk_gguf_tensor *bk_gguf_tensor_at(const bk_gguf *g, size_t i) { return &g->t[i]; }

const bk_gguf_kv *bk_gguf_find_kv(const bk_gguf *g, const char *key)
{
	for (size_t i = 0; i < g->n_kv; i++)
		if (!strcmp(g->kv[i].key, key))
			return &g->kv[i];
	return NULL;
}

const bk_gguf_tensor *bk_gguf_find_tensor(const bk_gguf *g, const char *name)
{
	for (size_t i = 0; i < g->n_t; i++)
		if (!strcmp(g->t[i].name, name))
			return &g->t[i];
	return NULL;
}

int64_t bk_gguf_numel(const bk_gguf_tensor *t)
{
	return t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
}

/* ---- typed values ---- */

static int is_int_type(uint32_t t)
{
	return t == BK_GGUF_U8 || t == BK_GGUF_I8 || t == BK_GGUF_U16 || t == BK_GGUF_I16 ||
	       t == BK_GGUF_U32 || t == BK_GGUF_I32 || t == BK_GGUF_U64 || t == BK_GGUF_I64 ||
	       t == BK_GGUF_BOOL;
}

static int64_t int_at(uint32_t type, const uint8_t *p, const char *path, const char *key)
{
	switch (type) {
	case BK_GGUF_U8: case BK_GGUF_BOOL: return p[0];
	case BK_GGUF_I8: return (int8_t)p[0];
	case BK_GGUF_U16: { uint16_t v; memcpy(&v, p, 2); return v; }
	case BK_GGUF_I16: { int16_t v; memcpy(&v, p, 2); return v; }
	case BK_GGUF_U32: { uint32_t v; memcpy(&v, p, 4); return v; }
	case BK_GGUF_I32: { int32_t v; memcpy(&v, p, 4); return v; }
	case BK_GGUF_I64: { int64_t v; memcpy(&v, p, 8); return v; }
	case BK_GGUF_U64: {
		uint64_t v;
		memcpy(&v, p, 8);
		if (v > INT64_MAX)
			die("%s: key '%s': value %llu is too large", path, key, (unsigned long long)v);
		return (int64_t)v;
	}
	default: BUG("not an integer type %u", type);
	}
}

int bk_gguf_get_int(const bk_gguf *g, const char *key, int64_t *out)
{
	const bk_gguf_kv *kv = bk_gguf_find_kv(g, key);
	if (!kv)
		return 0;
	if (!is_int_type(kv->type))
		die("%s: key '%s' is not an integer", g->path, key);
	*out = int_at(kv->type, kv->data, g->path, key);
	return 1;
}

int bk_gguf_get_float(const bk_gguf *g, const char *key, double *out)
{
	const bk_gguf_kv *kv = bk_gguf_find_kv(g, key);
	if (!kv)
		return 0;
	if (kv->type == BK_GGUF_F32) {
		float f;
		memcpy(&f, kv->data, 4);
		*out = f;
	} else if (kv->type == BK_GGUF_F64) {
		memcpy(out, kv->data, 8);
	} else if (is_int_type(kv->type) && kv->type != BK_GGUF_BOOL) {
		*out = (double)int_at(kv->type, kv->data, g->path, key);
	} else {
		die("%s: key '%s' is not a number", g->path, key);
	}
	return 1;
}

int bk_gguf_get_bool(const bk_gguf *g, const char *key, int *out)
{
	const bk_gguf_kv *kv = bk_gguf_find_kv(g, key);
	if (!kv)
		return 0;
	if (kv->type != BK_GGUF_BOOL)
		die("%s: key '%s' is not a bool", g->path, key);
	*out = kv->data[0] != 0;
	return 1;
}

char *bk_gguf_get_str(const bk_gguf *g, const char *key)
{
	const bk_gguf_kv *kv = bk_gguf_find_kv(g, key);
	if (!kv)
		return NULL;
	if (kv->type != BK_GGUF_STRING)
		die("%s: key '%s' is not a string", g->path, key);
	char *what = xasprintf("key '%s'", key);
	char *s = str_copy(g, kv->strs[0], what);
	free(what);
	return s;
}

const bk_gguf_kv *bk_gguf_get_arr(const bk_gguf *g, const char *key, uint32_t elem_type)
{
	const bk_gguf_kv *kv = bk_gguf_find_kv(g, key);
	if (!kv)
		return NULL;
	int ok = kv->type == BK_GGUF_ARRAY &&
		 (kv->arr_type == elem_type ||
		  (elem_type == BK_GGUF_I64 && is_int_type(kv->arr_type)));
	if (!ok)
		die("%s: key '%s' is not an array of %s", g->path, key,
		    elem_type == BK_GGUF_STRING ? "strings" :
		    elem_type == BK_GGUF_I64    ? "integers" : "the expected type");
	return kv;
}

int64_t bk_gguf_arr_int(const bk_gguf_kv *kv, uint64_t i)
{
	BUG_ON(kv->type != BK_GGUF_ARRAY || !is_int_type(kv->arr_type) || i >= kv->n);
	return int_at(kv->arr_type, kv->data + i * scalar_size(kv->arr_type), "", kv->key);
}

/* ---- dequantization ---- */

static float h2f(const uint8_t *p)
{
	uint16_t h;
	memcpy(&h, p, 2);
	return bk_f16_to_f32(h);
}

/* Q4_K scales: 8 6-bit (scale, min) pairs packed in 12 bytes */
static void q4k_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
	if (j < 4) {
		*sc = q[j] & 63;
		*m = q[j + 4] & 63;
	} else {
		*sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
		*m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
	}
}

void bk_ggml_dequant(uint32_t type, const void *src, float *y, int64_t n)
{
	const uint8_t *b = src;
	int be = bk_ggml_block_elems(type);
	BUG_ON(!be || n % be);
	int64_t nb = n / be;
	switch (type) {
	case BK_GGML_F32:
		memcpy(y, b, (size_t)n * 4);
		return;
	case BK_GGML_F16:
		bk_convert_to_f32(BK_DT_F16, b, (size_t)n, y);
		return;
	case BK_GGML_BF16:
		bk_convert_to_f32(BK_DT_BF16, b, (size_t)n, y);
		return;
	case BK_GGML_Q4_0: /* d; qs[16]: element j low nibble, j + 16 high nibble */
		for (int64_t i = 0; i < nb; i++, b += 18, y += 32) {
			float d = h2f(b);
			for (int j = 0; j < 16; j++) {
				y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
				y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
			}
		}
		return;
	case BK_GGML_Q4_1: /* d, m; qs[16] */
		for (int64_t i = 0; i < nb; i++, b += 20, y += 32) {
			float d = h2f(b), m = h2f(b + 2);
			for (int j = 0; j < 16; j++) {
				y[j] = (float)(b[4 + j] & 0xF) * d + m;
				y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
			}
		}
		return;
	case BK_GGML_Q5_0: /* d; qh (bit 4 of element j = bit j); qs[16] as Q4_0; minus 16 */
	case BK_GGML_Q5_1: /* d, m; qh; qs[16]: no offset, plus m */
		for (int64_t i = 0; i < nb; i++) {
			int one = type == BK_GGML_Q5_1;
			float d = h2f(b), m = one ? h2f(b + 2) : 0;
			uint32_t qh;
			memcpy(&qh, b + (one ? 4 : 2), 4);
			const uint8_t *qs = b + (one ? 8 : 6);
			for (int j = 0; j < 16; j++) {
				int x0 = (qs[j] & 0xF) | (int)(((qh >> j) & 1) << 4);
				int x1 = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
				if (one) {
					y[j] = (float)x0 * d + m;
					y[j + 16] = (float)x1 * d + m;
				} else {
					y[j] = (float)(x0 - 16) * d;
					y[j + 16] = (float)(x1 - 16) * d;
				}
			}
			b += one ? 24 : 22;
			y += 32;
		}
		return;
	case BK_GGML_Q8_0: /* d; int8 qs[32] */
		for (int64_t i = 0; i < nb; i++, b += 34, y += 32) {
			float d = h2f(b);
			for (int j = 0; j < 32; j++)
				y[j] = (float)(int8_t)b[2 + j] * d;
		}
		return;
	case BK_GGML_Q4_K: /* d, dmin; scales[12]; qs[128]: 4 chunks of 64 = 32 low + 32 high */
		for (int64_t i = 0; i < nb; i++, b += 144) {
			float d = h2f(b), dmin = h2f(b + 2);
			const uint8_t *sc = b + 4, *q = b + 16;
			for (int c = 0; c < 4; c++, q += 32) {
				int s1, m1, s2, m2;
				q4k_scale_min(2 * c, sc, &s1, &m1);
				q4k_scale_min(2 * c + 1, sc, &s2, &m2);
				float d1 = d * (float)s1, mm1 = dmin * (float)m1;
				float d2 = d * (float)s2, mm2 = dmin * (float)m2;
				for (int l = 0; l < 32; l++)
					*y++ = d1 * (float)(q[l] & 0xF) - mm1;
				for (int l = 0; l < 32; l++)
					*y++ = d2 * (float)(q[l] >> 4) - mm2;
			}
		}
		return;
	case BK_GGML_Q5_K: /* Q4_K plus qh[32]: bit 2c (low nibbles) / 2c+1 (high) of chunk c */
		for (int64_t i = 0; i < nb; i++, b += 176) {
			float d = h2f(b), dmin = h2f(b + 2);
			const uint8_t *sc = b + 4, *qh = b + 16, *q = b + 48;
			for (int c = 0; c < 4; c++, q += 32) {
				int s1, m1, s2, m2;
				q4k_scale_min(2 * c, sc, &s1, &m1);
				q4k_scale_min(2 * c + 1, sc, &s2, &m2);
				float d1 = d * (float)s1, mm1 = dmin * (float)m1;
				float d2 = d * (float)s2, mm2 = dmin * (float)m2;
				for (int l = 0; l < 32; l++)
					*y++ = d1 * (float)((q[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4)) -
					       mm1;
				for (int l = 0; l < 32; l++)
					*y++ = d2 * (float)((q[l] >> 4) |
							    (((qh[l] >> (2 * c + 1)) & 1) << 4)) -
					       mm2;
			}
		}
		return;
	case BK_GGML_Q6_K: /* ql[128], qh[64], int8 scales[16], d: 2 halves of 128 */
		for (int64_t i = 0; i < nb; i++, b += 210) {
			const uint8_t *ql = b, *qh = b + 128;
			const int8_t *sc = (const int8_t *)(b + 192);
			float d = h2f(b + 208);
			for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
				for (int l = 0; l < 32; l++) {
					int is = l / 16;
					int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
					int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
					int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
					int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
					y[l] = d * (float)sc[is] * (float)q1;
					y[l + 32] = d * (float)sc[is + 2] * (float)q2;
					y[l + 64] = d * (float)sc[is + 4] * (float)q3;
					y[l + 96] = d * (float)sc[is + 6] * (float)q4;
				}
			}
		}
		return;
	default:
		BUG("dequant of type %u", type);
	}
}

void bk_gguf_dequant(const bk_gguf *g, const bk_gguf_tensor *t, float *out)
{
	if (!bk_ggml_type_supported(t->type))
		die("%s: tensor '%s': type %s is not supported (supported: F32, F16, BF16, Q4_0, "
		    "Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", g->path, t->name,
		    bk_ggml_type_name(t->type));
	bk_ggml_dequant(t->type, t->data, out, bk_gguf_numel(t));
}

void bk_gguf_unpermute(float *w, int64_t rows, int64_t cols, int n_head)
{
	BUG_ON(n_head < 1 || rows % n_head || (rows / n_head) % 2);
	int64_t D = rows / n_head, half = D / 2;
	float *tmp = xmalloc((size_t)(D * cols) * sizeof(float));
	for (int h = 0; h < n_head; h++) {
		float *blk = w + (size_t)(h * D * cols);
		memcpy(tmp, blk, (size_t)(D * cols) * sizeof(float));
		for (int64_t i = 0; i < half; i++)
			for (int j = 0; j < 2; j++)
				memcpy(blk + (size_t)((j * half + i) * cols),
				       tmp + (size_t)((2 * i + j) * cols), (size_t)cols * sizeof(float));
	}
	free(tmp);
}
