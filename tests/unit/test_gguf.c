/* test_gguf.c - formats/gguf.c and formats/gguf_hf.c against fixtures written by
 * tests/ref/make_gguf_golden.py with llama.cpp's gguf package and transformers:
 *   (a) every quant type dequantized bit-for-bit as gguf.quants.dequantize does;
 *   (b) metadata values of each type;
 *   (c) bk-convert's HF directory of a tiny Llama GGUF equal to transformers' GGUF
 *       loader (dequantized, q/k permutation undone), config and tokenizer files;
 *   (d) corrupt files: one-line errors naming the file and what is wrong. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "formats/gguf.h"
#include "formats/gguf_hf.h"
#include "formats/hfconfig.h"
#include "formats/safetensors.h"
#include "tests/harness.h"
#include "tests/unit/gguf_compare.h"

#define DIR "tests/golden/gguf/"

static void check_quants(void)
{
	bk_gguf *g = bk_gguf_open(DIR "quants.gguf");
	bk_st *gold = bk_st_open(DIR "quants.golden.safetensors");
	CHECK(bk_gguf_version(g) == 3, "version %u", bk_gguf_version(g));
	static const char *const want[] = { "f32", "f16", "bf16", "q4_0", "q4_1", "q8_0",
					    "q4_k", "q6_k", "vec_f32", "q5_0", "q5_1", "q5_k" };
	static const uint32_t want_type[] = { BK_GGML_F32, BK_GGML_F16, BK_GGML_BF16,
					      BK_GGML_Q4_0, BK_GGML_Q4_1, BK_GGML_Q8_0,
					      BK_GGML_Q4_K, BK_GGML_Q6_K, BK_GGML_F32,
					      BK_GGML_Q5_0, BK_GGML_Q5_1, BK_GGML_Q5_K };
	CHECK(bk_gguf_n_tensors(g) == 12, "%zu tensors", bk_gguf_n_tensors(g));
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		const bk_gguf_tensor *t = bk_gguf_find_tensor(g, want[i]);
		const bk_st_tensor *r = bk_st_find(gold, want[i]);
		CHECK(t && r, "tensor %s missing", want[i]);
		if (!t || !r)
			continue;
		CHECK(t->type == want_type[i], "%s: type %s", want[i], bk_ggml_type_name(t->type));
		/* HF shape [rows, cols] is ne {cols, rows} */
		int64_t n = bk_gguf_numel(t);
		CHECK(n == bk_st_numel(r), "%s: %lld elements, golden %lld", want[i], (long long)n,
		      (long long)bk_st_numel(r));
		CHECK(t->ne[0] == r->shape[r->ndim - 1], "%s: ne[0] %lld", want[i],
		      (long long)t->ne[0]);
		if (n != bk_st_numel(r))
			continue;
		float *got = xmalloc((size_t)n * sizeof(float));
		float *ref = xmalloc((size_t)n * sizeof(float));
		bk_gguf_dequant(g, t, got);
		bk_convert_to_f32(r->dtype, r->data, (size_t)n, ref);
		int64_t bad = 0;
		double worst = 0;
		for (int64_t k = 0; k < n; k++) {
			if (memcmp(&got[k], &ref[k], 4))
				bad++;
			double d = fabs((double)got[k] - ref[k]);
			worst = d > worst ? d : worst;
		}
		CHECK(bad == 0, "%s: %lld of %lld values differ from gguf-py (max |diff| %g)",
		      want[i], (long long)bad, (long long)n, worst);
		printf("%-8s %-5s %5lld values bit-identical to gguf.quants.dequantize: %s\n",
		       want[i], bk_ggml_type_name(t->type), (long long)n, bad ? "NO" : "yes");
		free(got);
		free(ref);
	}
	int64_t iv;
	double fv;
	int bv;
	CHECK(bk_gguf_get_int(g, "test.u32", &iv) && iv == 4000000000LL, "test.u32 %lld",
	      (long long)iv);
	CHECK(bk_gguf_get_int(g, "test.i32", &iv) && iv == -7, "test.i32 %lld", (long long)iv);
	CHECK(bk_gguf_get_float(g, "test.f32", &fv) && fv == 0.25, "test.f32 %g", fv);
	CHECK(bk_gguf_get_bool(g, "test.bool", &bv) && bv == 1, "test.bool");
	CHECK(!bk_gguf_get_int(g, "test.absent", &iv), "absent key found");
	char *s = bk_gguf_get_str(g, "test.string");
	CHECK(s && !strcmp(s, "h\xc3\xa9llo"), "test.string '%s'", s ? s : "(null)");
	free(s);
	const bk_gguf_kv *a = bk_gguf_get_arr(g, "test.strs", BK_GGUF_STRING);
	CHECK(a && a->n == 3 && a->strs[1].n == 2 && !memcmp(a->strs[1].s, "bc", 2) &&
		      a->strs[2].n == 0, "test.strs");
	a = bk_gguf_get_arr(g, "test.ints", BK_GGUF_I64);
	CHECK(a && a->n == 3 && bk_gguf_arr_int(a, 0) == 1 && bk_gguf_arr_int(a, 1) == -2 &&
		      bk_gguf_arr_int(a, 2) == 3, "test.ints");
	bk_st_close(gold);
	bk_gguf_close(g);
}

/* the permutation llama.cpp's converter applies, and bk_gguf_unpermute undoing it */
static void check_unpermute(void)
{
	enum { NHD = 3, D = 6, C = 5, R = NHD * D };
	float hf[R * C], gg[R * C];
	for (int i = 0; i < R * C; i++)
		hf[i] = (float)i;
	/* permute: reshape (n, 2, D/2, C).swapaxes(1, 2): gguf row h*D + 2i + j = hf row
	 * h*D + j*D/2 + i */
	for (int h = 0; h < NHD; h++)
		for (int i = 0; i < D / 2; i++)
			for (int j = 0; j < 2; j++)
				memcpy(&gg[(h * D + 2 * i + j) * C], &hf[(h * D + j * D / 2 + i) * C],
				       C * sizeof(float));
	bk_gguf_unpermute(gg, R, C, NHD);
	CHECK(!memcmp(gg, hf, sizeof hf), "unpermute does not invert the permutation");
}

static char *tmp_out(const char *name)
{
	const char *t = getenv("TMPDIR");
	return xasprintf("%s/bk-test-gguf.%ld.%s", t && *t ? t : "/tmp", (long)getpid(), name);
}

static void rm_dir(const char *d)
{
	static const char *const files[] = { "config.json", "model.safetensors", "tokenizer.json",
					     "tokenizer_config.json", "special_tokens_map.json",
					     "generation_config.json" };
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		char *p = bk_path_join(d, files[i]);
		unlink(p);
		free(p);
	}
	rmdir(d);
}

static void check_convert(void)
{
	char *out = tmp_out("tiny");
	rm_dir(out);
	bk_gguf_hf_stats st = bk_gguf_to_hf(DIR "tiny.gguf", out, BK_DT_F32);
	CHECK(st.tensors == 20 && st.vocab == 269 && st.merges == 10 && st.added == 3,
	      "stats %d tensors %d vocab %d merges %d added", st.tensors, st.vocab, st.merges,
	      st.added);
	gguf_compare_model(out, DIR "tiny.hf.safetensors", "tiny.gguf", BK_DT_F32);

	bk_config *c = bk_config_load(out);
	CHECK(c->hidden_size == 32 && c->n_layers == 2 && c->n_heads == 2 && c->n_kv_heads == 1 &&
		      c->intermediate_size == 256 && c->vocab_size == 269 && c->head_dim == 16 &&
		      c->tie_word_embeddings == 1 && c->rope_theta == 100000 &&
		      c->rms_norm_eps == 1e-5f && c->bos_token_id == 1 && c->n_eos == 1 &&
		      c->eos_token_ids[0] == 2 && c->max_pos == 128,
	      "config.json read back wrong");
	bk_config_free(c);

	char *tp = bk_path_join(out, "tokenizer.json");
	json_error_t je;
	json_t *tj = json_load_file(tp, 0, &je);
	CHECK(tj != NULL, "%s: %s", tp, je.text);
	if (tj) {
		json_t *model = json_object_get(tj, "model");
		json_t *vocab = json_object_get(model, "vocab");
		CHECK(!strcmp(json_string_value(json_object_get(model, "type")), "BPE"), "model type");
		CHECK(json_object_size(vocab) == 269, "vocab size %zu", json_object_size(vocab));
		CHECK(json_integer_value(json_object_get(vocab, "\xc4\xa0the")) == 261,
		      "'\xc4\xa0the' id %lld", (long long)json_integer_value(json_object_get(vocab,
		      "\xc4\xa0the")));
		CHECK(json_integer_value(json_object_get(vocab, "!")) == 3 + '!', "'!' is not id 36");
		json_t *mj = json_object_get(model, "merges");
		CHECK(json_array_size(mj) == 10 &&
			      !strcmp(json_string_value(json_array_get(mj, 2)), "\xc4\xa0t he"),
		      "merges");
		json_t *added = json_object_get(tj, "added_tokens");
		CHECK(json_array_size(added) == 3, "%zu added tokens", json_array_size(added));
		json_t *a1 = json_array_get(added, 1);
		CHECK(json_integer_value(json_object_get(a1, "id")) == 1 &&
			      !strcmp(json_string_value(json_object_get(a1, "content")), "<|im_start|>") &&
			      json_is_true(json_object_get(a1, "special")) &&
			      json_is_false(json_object_get(a1, "normalized")),
		      "added token 1");
		json_t *pre = json_object_get(tj, "pre_tokenizer");
		json_t *p0 = json_array_get(json_object_get(pre, "pretokenizers"), 0);
		json_t *p1 = json_array_get(json_object_get(pre, "pretokenizers"), 1);
		CHECK(!strcmp(json_string_value(json_object_get(pre, "type")), "Sequence") &&
			      !strcmp(json_string_value(json_object_get(p0, "type")), "Digits") &&
			      json_is_true(json_object_get(p0, "individual_digits")) &&
			      !strcmp(json_string_value(json_object_get(p1, "type")), "ByteLevel") &&
			      json_is_false(json_object_get(p1, "add_prefix_space")) &&
			      json_is_true(json_object_get(p1, "use_regex")),
		      "pre_tokenizer is not Sequence[Digits(individual), ByteLevel]");
		CHECK(json_is_null(json_object_get(tj, "normalizer")), "normalizer not null");
		json_decref(tj);
	}
	free(tp);
	tp = bk_path_join(out, "tokenizer_config.json");
	tj = json_load_file(tp, 0, &je);
	CHECK(tj != NULL, "%s: %s", tp, je.text);
	if (tj) {
		const char *t = json_string_value(json_object_get(tj, "chat_template"));
		CHECK(t && strstr(t, "You are a helpful AI assistant named SmolLM"), "chat template");
		CHECK(!strcmp(json_string_value(json_object_get(tj, "eos_token")), "<|im_end|>") &&
			      !strcmp(json_string_value(json_object_get(tj, "bos_token")), "<|im_start|>") &&
			      !strcmp(json_string_value(json_object_get(tj, "unk_token")), "<|endoftext|>"),
		      "special tokens in tokenizer_config.json");
		json_decref(tj);
	}
	free(tp);
	rm_dir(out);

	bk_gguf_to_hf(DIR "tiny.gguf", out, BK_DT_BF16);
	gguf_compare_model(out, DIR "tiny.hf.safetensors", "tiny.gguf", BK_DT_BF16);
	rm_dir(out);
	free(out);
}

/* ---- corrupt files ---- */

static uint8_t *good;
static size_t good_len;
static uint8_t *buf;
static size_t buf_len;

static void open_buf(void *arg)
{
	(void)arg;
	bk_gguf *g = bk_gguf_open_mem("bad.gguf", buf, buf_len);
	/* a file that opens must still dequantize without reading out of bounds */
	for (size_t i = 0; i < bk_gguf_n_tensors(g); i++) {
		const bk_gguf_tensor *t = bk_gguf_tensor_at(g, i);
		float *f = xmalloc((size_t)bk_gguf_numel(t) * sizeof(float));
		bk_gguf_dequant(g, t, f);
		free(f);
	}
	bk_gguf_close(g);
	exit(0);
}

static void reset(void)
{
	memcpy(buf, good, good_len);
	buf_len = good_len;
}

/* offset of the tensor info of name (just after its name string) */
static size_t info_of(const char *name)
{
	size_t n = strlen(name);
	for (size_t i = 8; i + n <= good_len; i++) {
		uint64_t len;
		memcpy(&len, good + i - 8, 8);
		if (len == n && !memcmp(good + i, name, n))
			return i + n;
	}
	BUG("tensor info of %s not found", name);
}

static void put32(size_t at, uint32_t v) { memcpy(buf + at, &v, 4); }
static void put64(size_t at, uint64_t v) { memcpy(buf + at, &v, 8); }
static uint64_t get64(size_t at) { uint64_t v; memcpy(&v, good + at, 8); return v; }

static void expect_bad(const char *what, const char *s1, const char *s2)
{
	bk_expect_die(what, open_buf, NULL, s1, s2);
}

static void convert_child(void *arg)
{
	const char **a = arg;
	bk_gguf_to_hf(a[0], a[1], BK_DT_F32);
	exit(0);
}

static void check_corrupt(void)
{
	bk_map m = bk_map_file(DIR "quants.gguf");
	good_len = m.len;
	good = xmalloc(good_len);
	memcpy(good, m.data, good_len);
	bk_unmap(&m);
	buf = xmalloc(good_len);

	reset();
	char err[512];
	CHECK(bk_run_child(open_buf, NULL, err, sizeof err) == 0, "good copy fails: %s", err);

	reset();
	buf[0] = 'X';
	expect_bad("bad magic", "bad.gguf", "not a GGUF file");
	reset();
	put32(4, 1);
	expect_bad("version 1", "bad.gguf", "version 1 is not supported");
	reset();
	put64(8, (uint64_t)1 << 40);
	expect_bad("huge tensor count", "bad.gguf", "cannot fit");
	reset();
	put64(16, 1000);
	expect_bad("more keys than present", "bad.gguf", NULL);

	/* truncation anywhere in the header and the data */
	size_t q6 = info_of("q6_k");
	size_t cuts[] = { 0, 3, 4, 7, 12, 23, 24, 30, 60, 200, q6 - 2, q6 + 3, q6 + 30,
			  good_len - 100 };
	for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
		reset();
		buf_len = cuts[i];
		char what[64];
		snprintf(what, sizeof what, "truncated to %zu bytes", cuts[i]);
		expect_bad(what, "bad.gguf", NULL);
	}
	/* one of them must say where */
	reset();
	buf_len = q6 + 3;
	expect_bad("truncated in a tensor info", "truncated at byte", "q6_k");

	/* tensor infos: n_dims u32, ne u64 x n, type u32, offset u64 */
	size_t f32 = info_of("f32");
	reset();
	put32(f32, 5);
	expect_bad("5 dimensions", "'f32'", "5 dimensions");
	reset();
	put64(f32 + 4, 0);
	expect_bad("zero dimension", "'f32'", "dimension 0 is 0");
	reset();
	put32(f32 + 4 + 16, 99);
	expect_bad("unknown type", "'f32'", "unknown ggml type 99");
	reset();
	put64(f32 + 4 + 16 + 4, get64(f32 + 4 + 16 + 4) + 4);
	expect_bad("misaligned offset", "'f32'", "alignment");
	reset();
	put64(f32 + 4 + 16 + 4, (uint64_t)1 << 40);
	expect_bad("data outside the file", "'f32'", "outside the file");
	size_t f16 = info_of("f16");
	reset();
	put64(f16 + 4 + 16 + 4, get64(f32 + 4 + 16 + 4)); /* f16 at f32's offset */
	expect_bad("overlapping tensors", "overlap", NULL);
	reset();
	size_t q40 = info_of("q4_0");
	put64(q40 + 4, 48);
	expect_bad("ne[0] not a block multiple", "'q4_0'", "not a multiple of Q4_0's block");
	reset();
	put32(f32 + 4 + 16, 9); /* Q8_1: known, not dequantized here */
	expect_bad("unsupported type", "'f32'", "type Q8_1 is not supported");
	reset();
	memcpy(buf + info_of("f16") - 3, "f32", 3); /* two tensors named f32 */
	expect_bad("duplicate tensor", "tensor 'f32' appears twice", NULL);

	/* bk-convert refuses other architectures and an existing output */
	char *out = tmp_out("x");
	const char *args[2] = { DIR "quants.gguf", out };
	bk_expect_die("convert quants.gguf", convert_child, args, "quants.gguf",
		      "architecture 'test' is not supported (supported: llama, gemma3)");
	bk_mkdir_p(out);
	char *f = bk_path_join(out, "config.json");
	bk_write_file_atomic(f, "{}", 2);
	args[0] = DIR "tiny.gguf";
	bk_expect_die("convert into a non-empty directory", convert_child, args, out,
		      "already exists");
	unlink(f);
	free(f);
	rmdir(out);
	free(out);
	free(good);
	free(buf);
}

int main(void)
{
	check_quants();
	check_unpermute();
	check_convert();
	check_corrupt();
	return bk_test_done("gguf");
}
