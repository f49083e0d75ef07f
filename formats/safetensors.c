/* safetensors.c - safetensors reader (mmap + validation) and writer; see safetensors.h.
 * Header JSON goes through jansson; every number in it is checked against the file
 * before any tensor byte is touched. */
#include "safetensors.h"
#include "common/diag.h"
#include "common/files.h"
#include "formats/msgjson.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* ---- dtypes ---- */

static const struct {
	const char *name;
	size_t size;
} dtypes[] = {
	[BK_DT_F32] = {"F32", 4},
	[BK_DT_F16] = {"F16", 2},
	[BK_DT_BF16] = {"BF16", 2},
};

const char *bk_dtype_name(bk_dtype dt) { return dtypes[dt].name; }
size_t bk_dtype_size(bk_dtype dt) { return dtypes[dt].size; }

int bk_dtype_parse(const char *s, bk_dtype *out)
{
	for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
		if (!strcmp(s, dtypes[i].name)) {
			*out = (bk_dtype)i;
			return 0;
		}
	return -1;
}

/* ---- half precision ---- */

static uint32_t f32_bits(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	return x;
}

static float bits_f32(uint32_t x)
{
	float f;
	memcpy(&f, &x, 4);
	return f;
}

float bk_bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t bk_f32_to_bf16(float f)
{
	uint32_t x = f32_bits(f);
	if ((x & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and top payload, quiet */
		return (uint16_t)((x >> 16) | 0x40);
	x += 0x7fffu + ((x >> 16) & 1); /* round to nearest even; overflow -> inf */
	return (uint16_t)(x >> 16);
}

float bk_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
	if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
		float v = (float)man * 0x1p-24f;
		return sign ? -v : v;
	}
	if (exp == 31)
		return bits_f32(sign | 0x7f800000u | (man << 13));
	return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t bk_f32_to_f16(float f)
{
	uint32_t x = f32_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
	uint32_t ax = x & 0x7fffffffu;
	if (ax > 0x7f800000u) /* NaN */
		return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff);
	if (ax >= 0x477ff000u) /* >= 65520 rounds to inf (and inf itself) */
		return sign | 0x7c00;
	if (ax >= 0x38800000u) { /* normal f16: rebias exponent, round 13 bits away */
		uint32_t r = ax - 0x38000000u;
		r += 0xfffu + ((r >> 13) & 1);
		return sign | (uint16_t)(r >> 13);
	}
	if (ax < 0x33000000u) /* below 2^-25 (or the 2^-25 tie): zero */
		return sign;
	/* subnormal result: round(m * 2^(e - 126)) to nearest even */
	uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
	uint32_t shift = 126 - e; /* 14 .. 24 */
	uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return sign | (uint16_t)q;
}

void bk_convert_to_f32(bk_dtype dt, const void *src, size_t n, float *out)
{
	const uint8_t *s = src;
	switch (dt) {
	case BK_DT_F32:
		memcpy(out, src, n * 4);
		return;
	case BK_DT_F16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, s + 2 * i, 2);
			out[i] = bk_f16_to_f32(h);
		}
		return;
	case BK_DT_BF16:
		for (size_t i = 0; i < n; i++) {
			uint16_t h;
			memcpy(&h, s + 2 * i, 2);
			out[i] = bk_bf16_to_f32(h);
		}
		return;
	}
	BUG("bad dtype %d", (int)dt);
}

void bk_shape_str(int ndim, const int64_t *shape, char *buf, size_t size)
{
	size_t k = 0;
	if (!size)
		return;
	buf[0] = 0;
	k += (size_t)snprintf(buf + k, size - k, "[");
	for (int i = 0; i < ndim && k < size; i++)
		k += (size_t)snprintf(buf + k, size - k, "%s%lld", i ? ", " : "",
				      (long long)shape[i]);
	if (k < size)
		snprintf(buf + k, size - k, "]");
}

int64_t bk_st_numel(const bk_st_tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->ndim; i++)
		n *= t->shape[i];
	return n;
}

/* ---- reader ---- */

struct st_file {
	char *path;
	bk_map map;
};

struct bk_st {
	char *path;
	struct st_file *files;
	size_t n_files;
	BK_VEC(bk_st_tensor) t;
	BK_VEC(char *) meta; /* key, value, key, value ... */
};

static int64_t json_nonneg_int(json_t *v)
{
	if (!json_is_integer(v))
		return -1;
	json_int_t x = json_integer_value(v);
	return x < 0 ? -1 : (int64_t)x;
}

/* Read the header of one file and append its tensors (validated). */
static void parse_file(bk_st *st, struct st_file *f, int keep_meta)
{
	const char *path = f->path;
	const uint8_t *p = f->map.data;
	size_t len = f->map.len;
	if (len < 8)
		die("%s: file too short for a safetensors header (%zu bytes)", path, len);
	uint64_t hlen;
	memcpy(&hlen, p, 8);
	if (hlen >= BK_ST_MAX_HEADER)
		die("%s: header length %llu is not below the limit of %u bytes", path,
		    (unsigned long long)hlen, BK_ST_MAX_HEADER);
	if (hlen > len - 8)
		die("%s: header length %llu exceeds the file size (%zu bytes)", path,
		    (unsigned long long)hlen, len);
	const uint8_t *data = p + 8 + hlen;
	uint64_t data_len = len - 8 - hlen;

	json_error_t jerr;
	json_t *root = json_loadb((const char *)p + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		die("%s: invalid JSON header: %s (header byte %d)", path, jerr.text,
		    jerr.position);
	if (!json_is_object(root))
		die("%s: JSON header is not an object", path);

	size_t first = st->t.n;
	const char *key;
	json_t *val;
	json_object_foreach(root, key, val) {
		if (!strcmp(key, "__metadata__")) {
			if (!json_is_object(val))
				die("%s: '__metadata__' is not an object", path);
			const char *mk;
			json_t *mv;
			json_object_foreach(val, mk, mv) {
				if (!json_is_string(mv))
					die("%s: '__metadata__' key '%s' is not a string", path,
					    mk);
				if (keep_meta) {
					bk_vec_push(&st->meta, xstrdup(mk));
					bk_vec_push(&st->meta, xstrdup(json_string_value(mv)));
				}
			}
			continue;
		}
		if (!json_is_object(val))
			die("%s: tensor '%s': entry is not an object", path, key);
		json_t *jdt = json_object_get(val, "dtype");
		json_t *jshape = json_object_get(val, "shape");
		json_t *joff = json_object_get(val, "data_offsets");
		if (!json_is_string(jdt))
			die("%s: tensor '%s': key 'dtype' missing or not a string", path, key);
		bk_dtype dt;
		if (bk_dtype_parse(json_string_value(jdt), &dt))
			die("%s: tensor '%s': dtype '%s' is not supported (supported: F32, F16, "
			    "BF16)",
			    path, key, json_string_value(jdt));
		if (!json_is_array(jshape))
			die("%s: tensor '%s': key 'shape' missing or not an array", path, key);
		size_t ndim = json_array_size(jshape);
		if (ndim > BK_ST_MAX_DIM)
			die("%s: tensor '%s': %zu dimensions (at most %d supported)", path, key,
			    ndim, BK_ST_MAX_DIM);
		bk_st_tensor t = {0};
		t.dtype = dt;
		t.ndim = (int)ndim;
		uint64_t numel = 1;
		for (size_t i = 0; i < ndim; i++) {
			int64_t d = json_nonneg_int(json_array_get(jshape, i));
			if (d < 0)
				die("%s: tensor '%s': shape entry %zu is not a non-negative integer",
				    path, key, i);
			t.shape[i] = d;
			if (__builtin_mul_overflow(numel, (uint64_t)d, &numel))
				die("%s: tensor '%s': shape product overflows", path, key);
		}
		uint64_t nbytes;
		if (__builtin_mul_overflow(numel, (uint64_t)bk_dtype_size(dt), &nbytes))
			die("%s: tensor '%s': shape product overflows", path, key);
		if (!json_is_array(joff) || json_array_size(joff) != 2)
			die("%s: tensor '%s': key 'data_offsets' missing or not a pair", path,
			    key);
		int64_t b = json_nonneg_int(json_array_get(joff, 0));
		int64_t e = json_nonneg_int(json_array_get(joff, 1));
		if (b < 0 || e < 0)
			die("%s: tensor '%s': data_offsets are not non-negative integers", path,
			    key);
		if (e < b)
			die("%s: tensor '%s': data_offsets [%lld, %lld) end before they begin",
			    path, key, (long long)b, (long long)e);
		if ((uint64_t)e > data_len)
			die("%s: tensor '%s': data_offsets [%lld, %lld) beyond the data region "
			    "(%llu bytes)",
			    path, key, (long long)b, (long long)e, (unsigned long long)data_len);
		if ((uint64_t)(e - b) != nbytes)
			die("%s: tensor '%s': data_offsets span %lld bytes but shape and dtype %s "
			    "need %llu",
			    path, key, (long long)(e - b), bk_dtype_name(dt),
			    (unsigned long long)nbytes);
		t.name = xstrdup(key);
		t.data = data + b;
		t.nbytes = (size_t)nbytes;
		t.file = f->path;
		bk_vec_push(&st->t, t);
	}
	json_decref(root);

	/* overlap: order this file's non-empty tensors by start */
	size_t n = st->t.n - first, m = 0;
	bk_st_tensor **by = xmalloc((n ? n : 1) * sizeof *by);
	for (size_t i = first; i < st->t.n; i++)
		if (st->t.v[i].nbytes)
			by[m++] = &st->t.v[i];
	for (size_t i = 1; i < m; i++) { /* insertion sort is fine for a header's size */
		bk_st_tensor *x = by[i];
		size_t j = i;
		while (j > 0 && (const uint8_t *)by[j - 1]->data > (const uint8_t *)x->data) {
			by[j] = by[j - 1];
			j--;
		}
		by[j] = x;
	}
	for (size_t i = 1; i < m; i++) {
		const uint8_t *prev_end = (const uint8_t *)by[i - 1]->data + by[i - 1]->nbytes;
		if ((const uint8_t *)by[i]->data < prev_end)
			die("%s: tensor '%s' overlaps tensor '%s'", path, by[i]->name,
			    by[i - 1]->name);
	}
	free(by);
}

static int cmp_tensor(const void *a, const void *b)
{
	return strcmp(((const bk_st_tensor *)a)->name, ((const bk_st_tensor *)b)->name);
}

/* sort by name; names must be unique over all shards */
static void sort_tensors(bk_st *st)
{
	qsort(st->t.v, st->t.n, sizeof *st->t.v, cmp_tensor);
	for (size_t i = 1; i < st->t.n; i++)
		if (!strcmp(st->t.v[i - 1].name, st->t.v[i].name))
			die("%s: tensor '%s' appears in both %s and %s", st->path,
			    st->t.v[i].name, st->t.v[i - 1].file, st->t.v[i].file);
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

static int is_dir(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static void add_file(bk_st *st, const char *path)
{
	st->files = xrealloc(st->files, (st->n_files + 1) * sizeof *st->files);
	struct st_file *f = &st->files[st->n_files++];
	f->path = xstrdup(path);
	f->map = bk_map_file(path);
}

static void open_index(bk_st *st, const char *index_path)
{
	size_t len;
	char *text = bk_read_file(index_path, &len);
	json_error_t jerr;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	free(text);
	if (!root)
		die("%s: invalid JSON: %s", index_path, bk_json_error(&jerr));
	json_t *wm = json_object_get(root, "weight_map");
	if (!json_is_object(wm))
		die("%s: key 'weight_map' missing or not an object", index_path);
	if (!json_object_size(wm))
		die("%s: key 'weight_map' is empty", index_path);

	char *dir = xstrdup(index_path);
	char *slash = strrchr(dir, '/');
	if (slash)
		slash[1] = 0;
	else
		dir[0] = 0;

	/* the shard names, each once, in order of appearance */
	BK_VEC(const char *) shards = {0};
	const char *key;
	json_t *val;
	json_object_foreach(wm, key, val) {
		if (!json_is_string(val))
			die("%s: weight_map key '%s' is not a string", index_path, key);
		const char *s = json_string_value(val);
		if (!*s || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, ".."))
			die("%s: weight_map key '%s': shard name '%s' is not a file name in the "
			    "index's directory",
			    index_path, key, s);
		size_t i;
		for (i = 0; i < shards.n; i++)
			if (!strcmp(shards.v[i], s))
				break;
		if (i == shards.n)
			bk_vec_push(&shards, s);
	}
	for (size_t i = 0; i < shards.n; i++) {
		char *p = xasprintf("%s%s", dir, shards.v[i]);
		add_file(st, p);
		free(p);
	}
	free(shards.v);
	for (size_t i = 0; i < st->n_files; i++)
		parse_file(st, &st->files[i], i == 0);
	sort_tensors(st);
	/* every mapped tensor is in its shard, and every shard tensor is mapped */
	json_object_foreach(wm, key, val) {
		const bk_st_tensor *t = bk_st_find(st, key);
		const char *s = json_string_value(val);
		if (!t)
			die("%s: tensor '%s' is not in shard '%s'", index_path, key, s);
		char *want = xasprintf("%s%s", dir, s);
		if (strcmp(t->file, want))
			die("%s: tensor '%s' is mapped to shard '%s' but found in %s", index_path,
			    key, s, t->file);
		free(want);
	}
	free(dir);
	for (size_t i = 0; i < st->t.n; i++)
		if (!json_object_get(wm, st->t.v[i].name))
			die("%s: tensor '%s' in %s is not in the weight_map", index_path,
			    st->t.v[i].name, st->t.v[i].file);
	json_decref(root);
}

bk_st *bk_st_open(const char *path)
{
	bk_st *st = xcalloc(1, sizeof *st);
	st->path = xstrdup(path);
	if (is_dir(path)) {
		char *single = bk_path_join(path, "model.safetensors");
		char *index = bk_path_join(path, "model.safetensors.index.json");
		if (bk_file_exists(single)) {
			add_file(st, single);
			parse_file(st, &st->files[0], 1);
		} else if (bk_file_exists(index)) {
			open_index(st, index);
		} else {
			die("%s: no model.safetensors or model.safetensors.index.json in this "
			    "directory",
			    path);
		}
		free(single);
		free(index);
	} else if (ends_with(path, ".index.json")) {
		open_index(st, path);
	} else {
		add_file(st, path);
		parse_file(st, &st->files[0], 1);
	}
	if (st->n_files == 1)
		sort_tensors(st);
	return st;
}

bk_st *bk_st_open_checked(const char *path, bk_bytes_check check, void *ctx)
{
	if (!check)
		return bk_st_open(path);
	bk_st *st = xcalloc(1, sizeof *st);
	st->path = xstrdup(path);
	add_file(st, path);
	check(path, st->files[0].map.data, st->files[0].map.len, ctx);
	parse_file(st, &st->files[0], 1);
	sort_tensors(st);
	return st;
}

void bk_st_close(bk_st *st)
{
	if (!st)
		return;
	for (size_t i = 0; i < st->t.n; i++)
		free(st->t.v[i].name);
	free(st->t.v);
	for (size_t i = 0; i < st->meta.n; i++)
		free(st->meta.v[i]);
	free(st->meta.v);
	for (size_t i = 0; i < st->n_files; i++) {
		bk_unmap(&st->files[i].map);
		free(st->files[i].path);
	}
	free(st->files);
	free(st->path);
	free(st);
}

const char *bk_st_path(const bk_st *st) { return st->path; }
size_t bk_st_count(const bk_st *st) { return st->t.n; }

const bk_st_tensor *bk_st_at(const bk_st *st, size_t i)
{
	BUG_ON(i >= st->t.n);
	return &st->t.v[i];
}

const bk_st_tensor *bk_st_find(const bk_st *st, const char *name)
{
	size_t lo = 0, hi = st->t.n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, st->t.v[mid].name);
		if (!c)
			return &st->t.v[mid];
		if (c < 0)
			hi = mid;
		else
			lo = mid + 1;
	}
	return NULL;
}

const char *bk_st_meta(const bk_st *st, const char *key)
{
	for (size_t i = 0; i + 1 < st->meta.n; i += 2)
		if (!strcmp(st->meta.v[i], key))
			return st->meta.v[i + 1];
	return NULL;
}

const bk_st_tensor *bk_st_get(const bk_st *st, const char *name, int ndim, const int64_t *shape)
{
	const bk_st_tensor *t = bk_st_find(st, name);
	if (!t)
		die("%s: tensor '%s' not found", st->path, name);
	int same = t->ndim == ndim;
	for (int i = 0; same && i < ndim; i++)
		same = t->shape[i] == shape[i];
	if (!same) {
		char want[128], got[128];
		bk_shape_str(ndim, shape, want, sizeof want);
		bk_shape_str(t->ndim, t->shape, got, sizeof got);
		die("%s: tensor '%s': expected shape %s, got %s", t->file, name, want, got);
	}
	return t;
}

/* a NaN or inf weight poisons every output: refuse it where it is named, not later as
 * NaN log-probs or skipped steps */
static void die_nonfinite(const bk_st_tensor *t, int nan, size_t i)
{
	die("%s: tensor '%s': non-finite value (%s) at index %zu", t->file, t->name,
	    nan ? "nan" : "inf", i);
}

void bk_st_read_f32(const bk_st *st, const char *name, int ndim, const int64_t *shape,
		    float *out)
{
	const bk_st_tensor *t = bk_st_get(st, name, ndim, shape);
	size_t n = (size_t)bk_st_numel(t);
	bk_convert_to_f32(t->dtype, t->data, n, out);
	for (size_t i = 0; i < n; i++)
		if (!isfinite(out[i]))
			die_nonfinite(t, isnan(out[i]), i);
}

void bk_st_read_bf16(const bk_st_tensor *t, size_t off, size_t n, uint16_t *out)
{
	size_t es = bk_dtype_size(t->dtype);
	if (off > (size_t)bk_st_numel(t) || n > (size_t)bk_st_numel(t) - off)
		BUG("tensor '%s': elements [%zu, +%zu) of %lld", t->name, off, n,
		    (long long)bk_st_numel(t));
	const uint8_t *s = (const uint8_t *)t->data + off * es;
	if (t->dtype == BK_DT_BF16) /* the bytes as they are: no rounding, no fp32 */
		memcpy(out, s, n * 2);
	for (size_t i = 0; i < n; i++) {
		float f;
		if (t->dtype == BK_DT_BF16) {
			if ((out[i] & 0x7f80) == 0x7f80)
				die_nonfinite(t, (out[i] & 0x7f) != 0, off + i);
			continue;
		}
		if (t->dtype == BK_DT_F16) {
			uint16_t h;
			memcpy(&h, s + 2 * i, 2);
			f = bk_f16_to_f32(h); /* exact */
		} else {
			memcpy(&f, s + 4 * i, 4);
		}
		if (!isfinite(f))
			die_nonfinite(t, isnan(f), off + i);
		out[i] = bk_f32_to_bf16(f);
	}
}

/* ---- writer ---- */

struct w_tensor {
	char *name;
	bk_dtype dt;
	int ndim;
	int64_t shape[BK_ST_MAX_DIM];
	const void *data;
	void *owned;
	size_t nbytes;
};

struct bk_st_writer {
	BK_VEC(struct w_tensor) t;
	BK_VEC(char *) meta; /* key, value pairs */
};

bk_st_writer *bk_st_writer_new(void) { return xcalloc(1, sizeof(bk_st_writer)); }

static struct w_tensor *w_push(bk_st_writer *w, const char *name, bk_dtype dt, int ndim,
			       const int64_t *shape)
{
	if (ndim < 0 || ndim > BK_ST_MAX_DIM)
		BUG("tensor '%s': ndim %d", name, ndim);
	if (!strcmp(name, "__metadata__"))
		BUG("tensor name '__metadata__' is reserved");
	struct w_tensor t = {0};
	t.name = xstrdup(name);
	t.dt = dt;
	t.ndim = ndim;
	size_t numel = 1;
	for (int i = 0; i < ndim; i++) {
		if (shape[i] < 0)
			BUG("tensor '%s': negative dimension", name);
		t.shape[i] = shape[i];
		if (__builtin_mul_overflow(numel, (size_t)shape[i], &numel))
			BUG("tensor '%s': shape overflows", name);
	}
	if (__builtin_mul_overflow(numel, bk_dtype_size(dt), &t.nbytes))
		BUG("tensor '%s': shape overflows", name);
	bk_vec_push(&w->t, t);
	return &w->t.v[w->t.n - 1];
}

void bk_st_writer_add(bk_st_writer *w, const char *name, bk_dtype dt, int ndim,
		      const int64_t *shape, const void *data)
{
	struct w_tensor *t = w_push(w, name, dt, ndim, shape);
	t->data = data;
}

void bk_st_writer_add_f32(bk_st_writer *w, const char *name, bk_dtype dt, int ndim,
			  const int64_t *shape, const float *src)
{
	struct w_tensor *t = w_push(w, name, dt, ndim, shape);
	size_t n = t->nbytes / bk_dtype_size(dt);
	uint8_t *buf = xmalloc(t->nbytes ? t->nbytes : 1);
	for (size_t i = 0; i < n; i++) {
		uint16_t h;
		switch (dt) {
		case BK_DT_F32:
			memcpy(buf + 4 * i, &src[i], 4);
			break;
		case BK_DT_F16:
			h = bk_f32_to_f16(src[i]);
			memcpy(buf + 2 * i, &h, 2);
			break;
		case BK_DT_BF16:
			h = bk_f32_to_bf16(src[i]);
			memcpy(buf + 2 * i, &h, 2);
			break;
		}
	}
	t->owned = buf;
	t->data = buf;
}

void bk_st_writer_meta(bk_st_writer *w, const char *key, const char *value)
{
	bk_vec_push(&w->meta, xstrdup(key));
	bk_vec_push(&w->meta, xstrdup(value));
}

static int cmp_wtensor(const void *a, const void *b)
{
	return strcmp(((const struct w_tensor *)a)->name, ((const struct w_tensor *)b)->name);
}

void bk_st_writer_write(bk_st_writer *w, const char *path)
{
	qsort(w->t.v, w->t.n, sizeof *w->t.v, cmp_wtensor);
	json_t *root = json_object();
	if (w->meta.n) {
		json_t *meta = json_object();
		for (size_t i = 0; i + 1 < w->meta.n; i += 2)
			json_object_set_new(meta, w->meta.v[i], json_string(w->meta.v[i + 1]));
		json_object_set_new(root, "__metadata__", meta);
	}
	uint64_t off = 0;
	for (size_t i = 0; i < w->t.n; i++) {
		struct w_tensor *t = &w->t.v[i];
		if (i && !strcmp(t->name, w->t.v[i - 1].name))
			BUG("duplicate tensor '%s' written to %s", t->name, path);
		json_t *e = json_object(), *shape = json_array(), *offs = json_array();
		for (int d = 0; d < t->ndim; d++)
			json_array_append_new(shape, json_integer(t->shape[d]));
		json_array_append_new(offs, json_integer((json_int_t)off));
		json_array_append_new(offs, json_integer((json_int_t)(off + t->nbytes)));
		json_object_set_new(e, "dtype", json_string(bk_dtype_name(t->dt)));
		json_object_set_new(e, "shape", shape);
		json_object_set_new(e, "data_offsets", offs);
		json_object_set_new(root, t->name, e);
		off += t->nbytes;
	}
	char *hdr = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
	if (!hdr)
		BUG("json_dumps failed for %s", path);
	json_decref(root);
	size_t hlen = strlen(hdr), padded = (hlen + 7) & ~(size_t)7;
	uint64_t h64 = padded;

	bk_out *o = bk_out_open(path);
	FILE *f = bk_out_file(o);
	int ok = fwrite(&h64, 8, 1, f) == 1 && fwrite(hdr, 1, hlen, f) == hlen;
	for (size_t i = hlen; ok && i < padded; i++)
		ok = fputc(' ', f) != EOF;
	for (size_t i = 0; ok && i < w->t.n; i++)
		if (w->t.v[i].nbytes)
			ok = fwrite(w->t.v[i].data, 1, w->t.v[i].nbytes, f) == w->t.v[i].nbytes;
	if (!ok)
		die("%s: write error: %s", bk_out_path(o), strerror(errno));
	free(hdr);
	bk_out_commit(o);
}

void bk_st_writer_free(bk_st_writer *w)
{
	if (!w)
		return;
	for (size_t i = 0; i < w->t.n; i++) {
		free(w->t.v[i].name);
		free(w->t.v[i].owned);
	}
	free(w->t.v);
	for (size_t i = 0; i < w->meta.n; i++)
		free(w->meta.v[i]);
	free(w->meta.v);
	free(w);
}
