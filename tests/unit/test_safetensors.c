/* test_safetensors.c - safetensors reader and writer: stories260K shapes and values,
 * corrupt files built at run time (each must die with status 1 and one line naming the
 * file), half-precision conversions, a sharded checkpoint, writer round trips. */
#include "common/diag.h"
#include "common/files.h"
#include "formats/safetensors.h"
#include "tests/harness.h"

#include <ftw.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>


#define STORIES "models/stories260K/model.safetensors"

static char tmpdir[64];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)sb, (void)flag, (void)f;
	return remove(p);
}

static char *tmp_path(const char *name) { return bk_path_join(tmpdir, name); }


/* ---- stories260K ---- */

static float f32_at(const bk_st_tensor *t, size_t i)
{
	float v;
	BUG_ON(t->dtype != BK_DT_F32 || (i + 1) * 4 > t->nbytes);
	memcpy(&v, (const char *)t->data + 4 * i, 4);
	return v;
}

static void test_stories(void)
{
	bk_st *st = bk_st_open(STORIES);
	CHECK(bk_st_count(st) == 47, "count %zu", bk_st_count(st));
	CHECK(bk_st_meta(st, "format") && !strcmp(bk_st_meta(st, "format"), "pt"),
	      "metadata format");
	CHECK(!bk_st_meta(st, "nope"), "absent metadata");
	CHECK(!bk_st_find(st, "lm_head.weight"), "stories260K is tied: no lm_head");
	for (size_t i = 1; i < bk_st_count(st); i++)
		CHECK(strcmp(bk_st_at(st, i - 1)->name, bk_st_at(st, i)->name) < 0,
		      "sorted at %zu", i);
	struct {
		const char *name;
		int ndim;
		int64_t d0, d1;
		float first, second, last;
	} want[] = {
		{"model.embed_tokens.weight", 2, 512, 64, -0x1.2dd2ap-2f, 0x1.1fb0c8p-1f,
		 -0x1.b2359ap-2f},
		{"model.norm.weight", 1, 64, 0, 0x1.3aa9dep+1f, 0x1.5e08dcp+0f, 0x1.b530dep+0f},
		{"model.layers.4.mlp.down_proj.weight", 2, 64, 172, -0x1.88801cp-5f,
		 -0x1.783ca8p-6f, -0x1.cba716p-9f},
		{"model.layers.0.self_attn.k_proj.weight", 2, 32, 64, 0x1.baa26cp-3f,
		 0x1.78fa42p-3f, -0x1.7a2e74p-3f},
	};
	for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
		const bk_st_tensor *t = bk_st_find(st, want[k].name);
		CHECK(t, "%s missing", want[k].name);
		if (!t)
			continue;
		CHECK(t->dtype == BK_DT_F32 && t->ndim == want[k].ndim &&
			      t->shape[0] == want[k].d0 && (t->ndim == 1 || t->shape[1] == want[k].d1),
		      "%s shape", want[k].name);
		size_t n = (size_t)bk_st_numel(t);
		CHECK(t->nbytes == n * 4, "%s nbytes", want[k].name);
		CHECK(f32_at(t, 0) == want[k].first && f32_at(t, 1) == want[k].second &&
			      f32_at(t, n - 1) == want[k].last,
		      "%s values %a %a %a", want[k].name, f32_at(t, 0), f32_at(t, 1),
		      f32_at(t, n - 1));
		float *buf = xmalloc(n * sizeof(float));
		bk_st_read_f32(st, want[k].name, t->ndim, t->shape, buf);
		CHECK(buf[0] == want[k].first && buf[n - 1] == want[k].last, "%s read_f32",
		      want[k].name);
		free(buf);
	}
	bk_st_close(st);
}

static void read_wrong_shape(void *arg)
{
	(void)arg;
	bk_st *st = bk_st_open(STORIES);
	float buf[64 * 64];
	int64_t shape[2] = {64, 64};
	bk_st_read_f32(st, "model.layers.0.self_attn.k_proj.weight", 2, shape, buf);
}

static void read_missing(void *arg)
{
	(void)arg;
	bk_st *st = bk_st_open(STORIES);
	float x;
	int64_t shape[1] = {1};
	bk_st_read_f32(st, "lm_head.weight", 1, shape, &x);
}

/* ---- corrupt files ---- */

/* 8-byte length (hlen_override unless ~0), the header text, data_len pattern bytes */
static char *write_raw(const char *name, const char *header, uint64_t hlen_override,
		       size_t data_len)
{
	char *path = tmp_path(name);
	FILE *f = fopen(path, "wb");
	uint64_t hlen = hlen_override != ~(uint64_t)0 ? hlen_override : strlen(header);
	fwrite(&hlen, 8, 1, f);
	fwrite(header, 1, strlen(header), f);
	for (size_t i = 0; i < data_len; i++)
		fputc((int)(i * 7 + 1), f);
	fclose(f);
	return path;
}

static void open_it(void *path) { bk_st_open(path); }

static void test_corrupt(void)
{
	const uint64_t H = ~(uint64_t)0;
	struct {
		const char *name, *header;
		uint64_t hlen;
		size_t data, trunc; /* trunc: cut this many bytes off the end */
		const char *must;   /* besides the path */
	} cases[] = {
		{"short.st", "", 0, 0, 3, "too short"},
		{"trunc-data.st",
		 "{\"a\":{\"dtype\":\"F32\",\"shape\":[4,4],\"data_offsets\":[0,64]}}", H, 64, 4,
		 "'a'"},
		{"hlen-big.st", "{}", 1000, 16, 0, "exceeds the file size"},
		{"hlen-huge.st", "{}", (uint64_t)200 << 20, 16, 0, "limit"},
		{"hlen-wrap.st", "{}", ~(uint64_t)0 - 3, 16, 0, "limit"},
		{"beyond.st",
		 "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]}}", H, 16, 0,
		 "'w'"},
		{"nbytes.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
		 H, 16, 0, "'w'"},
		{"nbytes-bf16.st",
		 "{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", H, 16, 0,
		 "'w'"},
		{"overlap.st",
		 "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
		 "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
		 H, 16, 0, "overlaps"},
		{"dtype.st", "{\"ids\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}",
		 H, 16, 0, "dtype 'I64'"},
		{"json.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],", H, 16, 0, "invalid JSON"},
		{"notobj.st", "[1,2]", H, 0, 0, "not an object"},
		{"negshape.st",
		 "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2,2],\"data_offsets\":[0,16]}}", H, 16, 0,
		 "'w'"},
		{"overflow.st",
		 "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
		 "\"data_offsets\":[0,16]}}",
		 H, 16, 0, "overflows"},
		{"backwards.st",
		 "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", H, 16, 0,
		 "'w'"},
		{"fracshape.st",
		 "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", H, 16, 0,
		 "'w'"},
		{"nooffsets.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", H, 16, 0,
		 "data_offsets"},
		{"manydims.st",
		 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}",
		 H, 16, 0, "dimensions"},
		{"meta.st", "{\"__metadata__\":{\"n\":3}}", H, 0, 0, "'n'"},
		{"dupkey.st",
		 "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
		 "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
		 H, 16, 0, "invalid JSON"},
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		char *path = write_raw(cases[k].name, cases[k].header, cases[k].hlen,
				       cases[k].data);
		if (cases[k].trunc) {
			struct stat sb;
			if (stat(path, &sb) || truncate(path, sb.st_size - (off_t)cases[k].trunc))
				BUG("truncate");
		}
		bk_expect_die(cases[k].name, open_it, path, path, cases[k].must);
		free(path);
	}
	/* a header that is not padded: data unaligned, still read correctly */
	char *path = write_raw("unaligned.st",
			       "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]}}",
			       H, 0);
	FILE *f = fopen(path, "ab");
	float vals[3] = {1.5f, -2.25f, 3e-20f};
	fwrite(vals, 4, 3, f);
	fclose(f);
	bk_st *st = bk_st_open(path);
	float got[3];
	int64_t shape[1] = {3};
	bk_st_read_f32(st, "w", 1, shape, got);
	CHECK(!memcmp(got, vals, sizeof vals), "unaligned read");
	bk_st_close(st);
	free(path);

	bk_expect_die("read wrong shape", read_wrong_shape, NULL, "k_proj",
		   "expected shape [64, 64], got [32, 64]");
	bk_expect_die("read missing", read_missing, NULL, STORIES, "'lm_head.weight' not found");
	bk_expect_die("missing file", open_it, "tests/nope/none.safetensors",
		   "tests/nope/none.safetensors", NULL);
	bk_expect_die("dir without model", open_it, "tests", "tests", "model.safetensors");
}

/* ---- half precision ---- */

static uint32_t bits(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	return x;
}

static float from_bits(uint32_t x)
{
	float f;
	memcpy(&f, &x, 4);
	return f;
}

/* nearest bf16 by distance in double, ties to even: an independent judge. Past the
 * largest finite bf16 the next step is 2^128 (inf), as IEEE rounding has it. */
static double bf16_val(uint16_t h)
{
	if ((h & 0x7fff) == 0x7f80)
		return (h & 0x8000) ? -0x1p128 : 0x1p128;
	return bk_bf16_to_f32(h);
}

static uint16_t bf16_ref(float f)
{
	uint16_t lo = (uint16_t)(bits(f) >> 16), hi = (uint16_t)(lo + 1);
	double dl = fabs(bf16_val(lo) - f), dh = fabs(bf16_val(hi) - f);
	if (dl != dh)
		return dl < dh ? lo : hi;
	return (lo & 1) ? hi : lo;
}

static void test_half(void)
{
	int bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = bk_bf16_to_f32((uint16_t)h);
		uint16_t back = bk_f32_to_bf16(f);
		if (isnan(f)) {
			bad += !isnan(bk_bf16_to_f32(back)) || (back & 0x8000) != (h & 0x8000);
			continue;
		}
		bad += back != h;
	}
	CHECK(!bad, "bf16 round trip: %d bad", bad);
	bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = bk_f16_to_f32((uint16_t)h);
		uint16_t back = bk_f32_to_f16(f);
		if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff)) {
			bad += !isnan(f) || (back & 0x7c00) != 0x7c00 || !(back & 0x3ff);
			continue;
		}
		bad += back != h;
#ifdef __FLT16_MAX__
		_Float16 r;
		uint16_t hh = (uint16_t)h;
		memcpy(&r, &hh, 2);
		bad += bits((float)r) != bits(f);
#endif
	}
	CHECK(!bad, "f16 round trip / widening: %d bad", bad);

	/* rounding to nearest even, bf16 */
	CHECK(bk_f32_to_bf16(from_bits(0x3f808000)) == 0x3f80, "bf16 tie down to even");
	CHECK(bk_f32_to_bf16(from_bits(0x3f818000)) == 0x3f82, "bf16 tie up to even");
	CHECK(bk_f32_to_bf16(from_bits(0x3f808001)) == 0x3f81, "bf16 above half");
	CHECK(bk_f32_to_bf16(from_bits(0x3f807fff)) == 0x3f80, "bf16 below half");
	CHECK(bk_f32_to_bf16(from_bits(0x7f7fffff)) == 0x7f80, "bf16 overflow to inf");
	CHECK(bk_f32_to_bf16(-INFINITY) == 0xff80, "bf16 -inf");
	CHECK(bk_f32_to_bf16(-0.0f) == 0x8000, "bf16 -0");
	CHECK(isnan(bk_bf16_to_f32(bk_f32_to_bf16(from_bits(0x7f800001)))),
	      "bf16 signalling NaN with low payload stays NaN");
	CHECK(bk_bf16_to_f32(0x3f80) == 1.0f && bk_bf16_to_f32(0xc000) == -2.0f, "bf16 values");
	/* f16 */
	CHECK(bk_f32_to_f16(1.0f) == 0x3c00 && bk_f32_to_f16(-2.0f) == 0xc000, "f16 values");
	CHECK(bk_f32_to_f16(65504.0f) == 0x7bff, "f16 max");
	CHECK(bk_f32_to_f16(65519.996f) == 0x7bff, "f16 just below overflow");
	CHECK(bk_f32_to_f16(65520.0f) == 0x7c00, "f16 overflow tie to inf");
	CHECK(bk_f32_to_f16(INFINITY) == 0x7c00 && bk_f32_to_f16(-INFINITY) == 0xfc00, "f16 inf");
	CHECK(bk_f32_to_f16(0x1p-24f) == 0x0001, "f16 min subnormal");
	CHECK(bk_f32_to_f16(0x1p-25f) == 0x0000, "f16 2^-25 ties to 0");
	CHECK(bk_f32_to_f16(0x1.8p-24f) == 0x0002, "f16 1.5 * 2^-24 ties to 2");
	CHECK(bk_f32_to_f16(0x1.000002p-25f) == 0x0001, "f16 above 2^-25 rounds up");
	CHECK(bk_f32_to_f16(0x1.ff8p-15f) == 0x03ff, "f16 max subnormal");
	CHECK(bk_f32_to_f16(0x1.ffcp-15f) == 0x0400, "f16 subnormal tie up to min normal");
	CHECK(bk_f32_to_f16(0x1.ffep-15f) == 0x0400, "f16 subnormal rounds to min normal");
	CHECK(bk_f32_to_f16(from_bits(0x3f801000)) == 0x3c00, "f16 tie down to even");
	CHECK(bk_f32_to_f16(from_bits(0x3f803000)) == 0x3c02, "f16 tie up to even");
	CHECK(bk_f32_to_f16(-0.0f) == 0x8000, "f16 -0");
	CHECK(isnan(bk_f16_to_f32(bk_f32_to_f16(NAN))), "f16 NaN");
	CHECK(isnan(bk_f16_to_f32(bk_f32_to_f16(from_bits(0x7f800001)))), "f16 low-payload NaN");
	CHECK(bk_f16_to_f32(0x0001) == 0x1p-24f && bk_f16_to_f32(0x8400) == -0x1p-14f,
	      "f16 widening subnormal / normal");

	/* sweep of fp32 bit patterns against independent judges */
	int bad16 = 0, badbf = 0;
	for (uint64_t x = 0; x < (1ull << 32); x += 1021) {
		float f = from_bits((uint32_t)x);
		if (isnan(f) || isinf(f))
			continue;
		badbf += bk_f32_to_bf16(f) != bf16_ref(f);
#ifdef __FLT16_MAX__
		_Float16 r = (_Float16)f;
		uint16_t rb;
		memcpy(&rb, &r, 2);
		bad16 += bk_f32_to_f16(f) != rb;
#endif
	}
	CHECK(!badbf, "bf16 sweep: %d differ from nearest-even", badbf);
	CHECK(!bad16, "f16 sweep: %d differ from the compiler's _Float16", bad16);
}

/* ---- writer and shards ---- */

static void same_tensors(const bk_st *a, const bk_st *b, const char *what)
{
	CHECK(bk_st_count(a) == bk_st_count(b), "%s: count %zu vs %zu", what, bk_st_count(a),
	      bk_st_count(b));
	for (size_t i = 0; i < bk_st_count(a) && i < bk_st_count(b); i++) {
		const bk_st_tensor *x = bk_st_at(a, i), *y = bk_st_at(b, i);
		int same = !strcmp(x->name, y->name) && x->dtype == y->dtype &&
			   x->ndim == y->ndim && x->nbytes == y->nbytes &&
			   !memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)x->ndim) &&
			   !memcmp(x->data, y->data, x->nbytes);
		CHECK(same, "%s: tensor %zu '%s' vs '%s' differs", what, i, x->name, y->name);
	}
}

static void write_index(const char *path, const bk_st *st, size_t split, const char *s1,
			const char *s2)
{
	json_t *root = json_object(), *wm = json_object(), *meta = json_object();
	for (size_t i = 0; i < bk_st_count(st); i++)
		json_object_set_new(wm, bk_st_at(st, i)->name, json_string(i < split ? s1 : s2));
	json_object_set_new(meta, "total_size", json_integer(1));
	json_object_set_new(root, "metadata", meta);
	json_object_set_new(root, "weight_map", wm);
	char *text = json_dumps(root, JSON_INDENT(2));
	bk_write_file_atomic(path, text, strlen(text));
	free(text);
	json_decref(root);
}

static void test_shards(void)
{
	bk_st *st = bk_st_open(STORIES);
	size_t n = bk_st_count(st), split = n / 2;
	char *dir = tmp_path("sharded");
	bk_mkdir_p(dir);
	for (int part = 0; part < 2; part++) {
		bk_st_writer *w = bk_st_writer_new();
		bk_st_writer_meta(w, "format", "pt");
		for (size_t i = part ? split : 0; i < (part ? n : split); i++) {
			const bk_st_tensor *t = bk_st_at(st, i);
			bk_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
		}
		char *p = xasprintf("%s/model-0000%d-of-00002.safetensors", dir, part + 1);
		bk_st_writer_write(w, p);
		bk_st_writer_free(w);
		free(p);
	}
	char *index = bk_path_join(dir, "model.safetensors.index.json");
	write_index(index, st, split, "model-00001-of-00002.safetensors",
		    "model-00002-of-00002.safetensors");
	bk_st *sh = bk_st_open(dir);
	same_tensors(st, sh, "sharded dir");
	CHECK(strstr(bk_st_find(sh, bk_st_at(st, n - 1)->name)->file, "00002-of"),
	      "last tensor from shard 2");
	bk_st_close(sh);
	sh = bk_st_open(index);
	same_tensors(st, sh, "index path");
	bk_st_close(sh);

	/* broken indexes */
	write_index(index, st, split, "model-00002-of-00002.safetensors",
		    "model-00001-of-00002.safetensors");
	bk_expect_die("index: shards swapped", open_it, dir, "model.safetensors.index.json",
		   "but found in");
	write_index(index, st, n - 1, "model-00001-of-00002.safetensors",
		    "model-00002-of-00002.safetensors");
	bk_expect_die("index: tensor mapped to the wrong shard", open_it, dir, "index.json",
		   "shard");
	write_index(index, st, split, "model-00001-of-00002.safetensors",
		    "model-00003-of-00002.safetensors");
	bk_expect_die("index: missing shard file", open_it, dir, "model-00003-of-00002", NULL);
	write_index(index, st, split, "model-00001-of-00002.safetensors", "../model.safetensors");
	bk_expect_die("index: shard outside the directory", open_it, dir, "index.json",
		   "../model.safetensors");
	/* a weight_map that misses tensors: one shard not mapped at all */
	json_t *root = json_object(), *wm = json_object();
	for (size_t i = 0; i < split; i++)
		json_object_set_new(wm, bk_st_at(st, i)->name,
				    json_string("model-00001-of-00002.safetensors"));
	json_object_set_new(wm, bk_st_at(st, split)->name,
			    json_string("model-00002-of-00002.safetensors"));
	json_object_set_new(root, "weight_map", wm);
	char *text = json_dumps(root, 0);
	bk_write_file_atomic(index, text, strlen(text));
	free(text);
	json_decref(root);
	bk_expect_die("index: unmapped tensor", open_it, dir, "index.json",
		   "is not in the weight_map");
	/* a mapped tensor no shard has */
	write_index(index, st, split, "model-00001-of-00002.safetensors",
		    "model-00002-of-00002.safetensors");
	root = json_load_file(index, 0, NULL);
	json_object_set_new(json_object_get(root, "weight_map"), "ghost",
			    json_string("model-00001-of-00002.safetensors"));
	json_dump_file(root, index, 0);
	json_decref(root);
	bk_expect_die("index: ghost tensor", open_it, dir, "index.json", "'ghost' is not in shard");
	/* the same tensor in two shards */
	bk_st_writer *w = bk_st_writer_new();
	const bk_st_tensor *t0 = bk_st_at(st, 0);
	float one = 1;
	bk_st_writer_add(w, t0->name, t0->dtype, t0->ndim, t0->shape, t0->data);
	bk_st_writer_add(w, "extra", BK_DT_F32, 0, NULL, &one);
	char *p3 = xasprintf("%s/dup.safetensors", dir);
	bk_st_writer_write(w, p3);
	bk_st_writer_free(w);
	write_index(index, st, split, "model-00001-of-00002.safetensors",
		    "model-00002-of-00002.safetensors");
	root = json_load_file(index, 0, NULL);
	json_object_set_new(json_object_get(root, "weight_map"), "extra",
			    json_string("dup.safetensors"));
	json_dump_file(root, index, 0);
	json_decref(root);
	bk_expect_die("index: duplicate tensor", open_it, dir, t0->name, "dup.safetensors");
	free(p3);
	free(index);
	free(dir);
	bk_st_close(st);
}

static void test_writer(void)
{
	float a[2 * 3] = {1, -2, 3.5f, 1e-8f, 65504, -0.0f};
	float b[5] = {0.1f, 0.2f, 0.3f, -7, 1e30f};
	float c[4 * 1 * 3] = {0};
	for (int i = 0; i < 12; i++)
		c[i] = (float)i / 7.0f - 0.5f;
	float scalar = 42.0f;
	int64_t sa[2] = {2, 3}, sb[1] = {5}, sc[3] = {4, 1, 3}, sz[2] = {0, 3};
	bk_st_writer *w = bk_st_writer_new();
	bk_st_writer_add(w, "z.f32", BK_DT_F32, 2, sa, a);
	bk_st_writer_add_f32(w, "b.bf16", BK_DT_BF16, 1, sb, b);
	bk_st_writer_add_f32(w, "c.f16", BK_DT_F16, 3, sc, c);
	bk_st_writer_add(w, "scalar", BK_DT_F32, 0, NULL, &scalar);
	bk_st_writer_add(w, "empty", BK_DT_F32, 2, sz, NULL);
	bk_st_writer_meta(w, "format", "pt");
	bk_st_writer_meta(w, "note", "a \"quoted\" value");
	char *path = tmp_path("written.safetensors");
	bk_st_writer_write(w, path);
	bk_st_writer_free(w);

	size_t len;
	char *raw = bk_read_file(path, &len);
	uint64_t hlen;
	memcpy(&hlen, raw, 8);
	CHECK(hlen % 8 == 0 && raw[8] == '{', "header length %llu aligned, starts with {",
	      (unsigned long long)hlen);
	CHECK(raw[8 + hlen - 1] == ' ' || raw[8 + hlen - 1] == '}', "padded with spaces");
	char *hdr = xstrndup(raw + 8, hlen);
	CHECK(strstr(hdr, "\"__metadata__\"") && strstr(hdr, "\"b.bf16\"") <
							    strstr(hdr, "\"c.f16\""),
	      "keys sorted: %s", hdr);
	free(hdr);
	free(raw);

	bk_st *st = bk_st_open(path);
	CHECK(bk_st_count(st) == 5, "count %zu", bk_st_count(st));
	CHECK(!strcmp(bk_st_meta(st, "note"), "a \"quoted\" value"), "metadata value");
	float got[12];
	bk_st_read_f32(st, "z.f32", 2, sa, got);
	CHECK(!memcmp(got, a, sizeof a), "f32 round trip exact");
	bk_st_read_f32(st, "b.bf16", 1, sb, got);
	int ok = 1;
	for (int i = 0; i < 5; i++)
		ok &= got[i] == bk_bf16_to_f32(bk_f32_to_bf16(b[i])) &&
		      bk_relerr(got[i], b[i], 0) < 1.0 / 256;
	CHECK(ok, "bf16 values");
	bk_st_read_f32(st, "c.f16", 3, sc, got);
	ok = 1;
	for (int i = 0; i < 12; i++)
		ok &= got[i] == bk_f16_to_f32(bk_f32_to_f16(c[i])) &&
		      bk_relerr(got[i], c[i], 1e-3) < 1.0 / 1024;
	CHECK(ok, "f16 values");
	const bk_st_tensor *t = bk_st_find(st, "scalar");
	CHECK(t && t->ndim == 0 && t->nbytes == 4 && bk_st_numel(t) == 1, "scalar");
	bk_st_read_f32(st, "scalar", 0, NULL, got);
	CHECK(got[0] == 42.0f, "scalar value");
	t = bk_st_find(st, "empty");
	CHECK(t && t->nbytes == 0 && t->shape[0] == 0 && t->shape[1] == 3, "empty tensor");
	/* data region starts 8-aligned: the first tensor (in name order) is aligned */
	const bk_st_tensor *first = bk_st_at(st, 0);
	const bk_st_tensor *fz = bk_st_find(st, "b.bf16");
	CHECK(first == fz && (uintptr_t)fz->data % 8 == 0, "data region aligned");
	bk_st_close(st);

	/* rewrite stories260K through the writer: identical tensors */
	bk_st *s0 = bk_st_open(STORIES);
	w = bk_st_writer_new();
	for (size_t i = 0; i < bk_st_count(s0); i++) {
		const bk_st_tensor *x = bk_st_at(s0, i);
		bk_st_writer_add(w, x->name, x->dtype, x->ndim, x->shape, x->data);
	}
	char *p2 = tmp_path("stories-copy.safetensors");
	bk_st_writer_write(w, p2);
	bk_st_writer_free(w);
	bk_st *s1 = bk_st_open(p2);
	same_tensors(s0, s1, "stories rewrite");
	char *tmp = xasprintf("%s.tmp.%ld", p2, (long)getpid());
	CHECK(!bk_file_exists(tmp), "no temporary left");
	free(tmp);
	bk_st_close(s1);
	bk_st_close(s0);
	free(p2);
	free(path);
}

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	if (getenv("BK_TEST_VERBOSE"))
		bk_verbose = 1;
	strcpy(tmpdir, "/tmp/bk-test-st-XXXXXX");
	if (!mkdtemp(tmpdir))
		BUG("mkdtemp");
	test_stories();
	test_corrupt();
	test_half();
	test_shards();
	test_writer();
	nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return bk_test_done("test_safetensors");
}
