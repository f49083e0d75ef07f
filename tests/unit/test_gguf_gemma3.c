/* test_gguf_gemma3.c - bk-convert's gemma3 path (formats/gguf_hf.c) on
 * tests/golden/gguf/gemma3.gguf, a tiny random Gemma-3 written by
 * tests/ref/make_gguf_golden.py the way llama.cpp's convert_hf_to_gguf.py writes one:
 *   (a) every tensor equal, bit for bit, to transformers' own GGUF loader (norm weights
 *       back from llama.cpp's 1 + w, q/k unpermuted), in F32 and BF16;
 *   (b) config.json: Gemma3ForCausalLM with transformers' layout of the same file (layer
 *       types of the fixed 5:1 pattern, window, two RoPE bases, head size), read back by
 *       formats/hfconfig.c;
 *   (c) tokenizer.model: the SentencePiece ModelProto rebuilt from the GGUF vocabulary
 *       gives the ids transformers' GGUF tokenizer gives for a few strings;
 *   (d) GGUF metadata built here (no tensors): the optional keys (sliding-window pattern,
 *       linear rope scaling, the 27B query scale) and the one-line refusals naming the
 *       key, for the config and for the tokenizer. */
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
#include "formats/tokenizer.h"
#include "tests/harness.h"
#include "tests/unit/gguf_compare.h"

#define DIR "tests/golden/gguf/"

static char *tmp_out(const char *name)
{
	const char *t = getenv("TMPDIR");
	return xasprintf("%s/bk-test-gguf3.%ld.%s", t && *t ? t : "/tmp", (long)getpid(), name);
}

static json_t *load_json(const char *path)
{
	json_error_t je;
	json_t *j = json_load_file(path, 0, &je);
	if (!j)
		die("%s: %s", path, je.text);
	return j;
}

static void check_config(const char *out, json_t *hf)
{
	char *cp = bk_path_join(out, "config.json");
	json_t *c = load_json(cp);
	free(cp);
	CHECK(!strcmp(json_string_value(json_array_get(json_object_get(c, "architectures"), 0)),
		      json_string_value(json_object_get(hf, "architecture"))),
	      "architectures");
	/* the keys transformers' GGUF loader sets the same way */
	static const char *const same[] = { "model_type", "layer_types", "sliding_window",
					    "head_dim", "tie_word_embeddings", "hidden_activation",
					    "vocab_size" };
	for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
		CHECK(json_equal(json_object_get(c, same[i]), json_object_get(hf, same[i])),
		      "config.json '%s' differs from transformers' GGUF config", same[i]);
	json_t *rp = json_object_get(c, "rope_parameters"), *hrp = json_object_get(hf, "rope_parameters");
	static const char *const lt[] = { "full_attention", "sliding_attention" };
	for (int i = 0; i < 2; i++) {
		json_t *a = json_object_get(rp, lt[i]), *b = json_object_get(hrp, lt[i]);
		CHECK(json_number_value(json_object_get(a, "rope_theta")) ==
				      json_number_value(json_object_get(b, "rope_theta")) &&
			      json_equal(json_object_get(a, "rope_type"), json_object_get(b, "rope_type")),
		      "rope_parameters.%s differs from transformers'", lt[i]);
	}
	CHECK((float)json_number_value(json_object_get(c, "rms_norm_eps")) ==
		      (float)json_number_value(json_object_get(hf, "rms_norm_eps")),
	      "rms_norm_eps");
	/* llama.cpp scales queries by 1/sqrt(key_length): HF's GGUF loader keeps its default
	 * query_pre_attn_scalar 256, which only agrees when the head size is 256 */
	CHECK(json_integer_value(json_object_get(c, "query_pre_attn_scalar")) == 16,
	      "query_pre_attn_scalar %lld (llama.cpp: the key length 16)",
	      (long long)json_integer_value(json_object_get(c, "query_pre_attn_scalar")));
	json_decref(c);

	bk_config *cfg = bk_config_load(out);
	int win[6] = { 4, 4, 4, 4, 4, 0 };
	CHECK(cfg->family == BK_FAM_GEMMA3 && cfg->hidden_size == 32 && cfg->n_layers == 6 &&
		      cfg->n_heads == 2 && cfg->n_kv_heads == 1 && cfg->head_dim == 16 &&
		      cfg->intermediate_size == 64 && cfg->vocab_size == 318 && cfg->qk_norm &&
		      cfg->norm_plus_one && cfg->sandwich && cfg->geglu && cfg->embed_scaled &&
		      cfg->tie_word_embeddings && cfg->rope_theta == 1e6 &&
		      cfg->rope_local_theta == 1e4 && cfg->rope_type == BK_ROPE_DEFAULT &&
		      cfg->query_pre_attn_scalar == 16 && cfg->attn_softcap == 0 &&
		      cfg->final_softcap == 0 && cfg->rms_norm_eps == 1e-6f &&
		      cfg->bos_token_id == 2 && cfg->n_eos == 1 && cfg->eos_token_ids[0] == 1 &&
		      !memcmp(cfg->layer_window, win, sizeof win),
	      "config.json read back wrong");
	bk_config_free(cfg);
}

static void check_tokenizer(const char *out, json_t *hf)
{
	char *tj = bk_path_join(out, "tokenizer.json"), *tm = bk_path_join(out, "tokenizer.model");
	CHECK(!bk_file_exists(tj) && bk_file_exists(tm), "tokenizer.model and no tokenizer.json");
	free(tj);
	free(tm);
	bk_tok *t = bk_tok_open(out);
	CHECK(bk_tok_kind(t) == BK_TOK_SPM && bk_tok_vocab_size(t) == 318 && bk_tok_bos(t) == 2 &&
		      bk_tok_eos(t) == 1 && bk_tok_unk(t) == 3 && bk_tok_pad(t) == 0 &&
		      bk_tok_piece_to_id(t, "<start_of_turn>") == 5 &&
		      bk_tok_piece_to_id(t, "<end_of_turn>") == 6,
	      "tokenizer.model: kind %d, %d pieces, bos %d eos %d unk %d pad %d", bk_tok_kind(t),
	      bk_tok_vocab_size(t), bk_tok_bos(t), bk_tok_eos(t), bk_tok_unk(t), bk_tok_pad(t));
	json_t *ids = json_object_get(hf, "ids");
	const char *s;
	json_t *want;
	json_object_foreach(ids, s, want) {
		int32_t *got;
		size_t n;
		bk_tok_encode(t, s, strlen(s), &got, &n);
		int same = n == json_array_size(want);
		for (size_t i = 0; same && i < n; i++)
			same = got[i] == json_integer_value(json_array_get(want, i));
		char *back = bk_tok_decode(t, got, n);
		CHECK(same, "'%s': %zu ids differ from transformers' GGUF tokenizer's %zu", s, n,
		      json_array_size(want));
		CHECK(!strcmp(back, s), "'%s' decodes to '%s'", s, back);
		printf("%-22s %2zu ids %s transformers' GGUF tokenizer\n", s, n,
		       same ? "equal to" : "DIFFER from");
		free(back);
		free(got);
	}
	bk_tok_free(t);

	char *cp = bk_path_join(out, "tokenizer_config.json");
	json_t *c = load_json(cp);
	free(cp);
	json_t *dec = json_object_get(c, "added_tokens_decoder");
	CHECK(!strcmp(json_string_value(json_object_get(c, "tokenizer_class")), "GemmaTokenizer") &&
		      json_is_true(json_object_get(c, "add_bos_token")) &&
		      json_is_false(json_object_get(c, "add_eos_token")) &&
		      !json_object_get(c, "chat_template") && json_object_size(dec) == 9 &&
		      json_is_true(json_object_get(json_object_get(dec, "5"), "special")) &&
		      json_is_false(json_object_get(json_object_get(dec, "7"), "special")) &&
		      !strcmp(json_string_value(json_object_get(c, "eos_token")), "<eos>"),
	      "tokenizer_config.json");
	json_decref(c);
}

static void check_convert(void)
{
	json_t *hf = load_json(DIR "gemma3.hf.json");
	char *out = tmp_out("g3");
	bk_remove_flat_dir(out);
	bk_gguf_hf_stats st = bk_gguf_to_hf(DIR "gemma3.gguf", out, BK_DT_F32);
	CHECK(st.tensors == 80 && st.vocab == 318 && st.merges == 0 && st.added == 9,
	      "stats: %d tensors, %d vocab, %d merges, %d added", st.tensors, st.vocab, st.merges,
	      st.added);
	gguf_compare_model(out, DIR "gemma3.hf.safetensors", "gemma3.gguf", BK_DT_F32);
	check_config(out, hf);
	check_tokenizer(out, hf);
	bk_remove_flat_dir(out);
	bk_gguf_to_hf(DIR "gemma3.gguf", out, BK_DT_BF16);
	gguf_compare_model(out, DIR "gemma3.hf.safetensors", "gemma3.gguf", BK_DT_BF16);
	bk_remove_flat_dir(out);
	free(out);
	json_decref(hf);
}

/* ---- GGUF metadata written here: a header, key/values, no tensors ---- */

typedef struct {
	uint8_t *b;
	size_t n, cap;
	uint64_t n_kv;
} gbuf;

static void put(gbuf *g, const void *d, size_t n)
{
	if (g->n + n > g->cap) {
		g->cap = (g->n + n) * 2 + 256;
		g->b = xrealloc(g->b, g->cap);
	}
	memcpy(g->b + g->n, d, n);
	g->n += n;
}
static void put32(gbuf *g, uint32_t v) { put(g, &v, 4); }
static void put64(gbuf *g, uint64_t v) { put(g, &v, 8); }
static void pstr(gbuf *g, const char *s) { put64(g, strlen(s)); put(g, s, strlen(s)); }
static void key(gbuf *g, const char *k, uint32_t type) { pstr(g, k); put32(g, type); g->n_kv++; }
static void kv_u32(gbuf *g, const char *k, uint32_t v) { key(g, k, BK_GGUF_U32); put32(g, v); }
static void kv_f32(gbuf *g, const char *k, float v) { key(g, k, BK_GGUF_F32); put(g, &v, 4); }
static void kv_bool(gbuf *g, const char *k, int v)
{
	uint8_t b = (uint8_t)v;
	key(g, k, BK_GGUF_BOOL);
	put(g, &b, 1);
}
static void kv_str(gbuf *g, const char *k, const char *v) { key(g, k, BK_GGUF_STRING); pstr(g, v); }
static void kv_arr(gbuf *g, const char *k, uint32_t et, uint64_t n)
{
	key(g, k, BK_GGUF_ARRAY);
	put32(g, et);
	put64(g, n);
}

/* what to change in the otherwise valid metadata */
enum {
	V_OK, V_PATTERN_INT, V_PATTERN_ARR, V_PATTERN_ARR_LEN, V_ROPE_LINEAR, V_ROPE_YARN,
	V_LINEAR_NO_FACTOR, V_SOFTCAP, V_VALUE_LEN, V_L62, V_NO_WINDOW, V_ARCH_GEMMA2,
	V_SPACE_PREFIX, V_NO_UNK, V_UNK_NORMAL, V_DUP, V_ONE_BYTE, V_NO_SCORES, V_LLAMA_SPM,
	V_PRE, V_BOS_NORMAL, V_CHARSMAP,
};

static gbuf meta(int v)
{
	gbuf g = {0};
	put(&g, "GGUF", 4);
	put32(&g, 3);
	put64(&g, 0);     /* tensors */
	put64(&g, 0);     /* key/values: patched below */
	int L = v == V_L62 ? 62 : 6;
	kv_str(&g, "general.architecture",
	       v == V_ARCH_GEMMA2 ? "gemma2" : v == V_LLAMA_SPM ? "llama" : "gemma3");
	const char *a = v == V_LLAMA_SPM ? "llama" : "gemma3";
	char k[96];
#define K(s) (snprintf(k, sizeof k, "%s.%s", a, s), k)
	kv_u32(&g, K("context_length"), 1024);
	kv_u32(&g, K("embedding_length"), 64);
	kv_u32(&g, K("block_count"), (uint32_t)L);
	kv_u32(&g, K("feed_forward_length"), 128);
	kv_u32(&g, K("attention.head_count"), 4);
	kv_u32(&g, K("attention.head_count_kv"), 1);
	kv_u32(&g, K("attention.key_length"), 32);
	kv_u32(&g, K("attention.value_length"), v == V_VALUE_LEN ? 16 : 32);
	kv_f32(&g, K("attention.layer_norm_rms_epsilon"), 1e-6f);
	kv_f32(&g, K("rope.freq_base"), 1e6f);
	if (v != V_NO_WINDOW)
		kv_u32(&g, K("attention.sliding_window"), 512);
	if (v == V_PATTERN_INT)
		kv_u32(&g, K("attention.sliding_window_pattern"), 3);
	if (v == V_PATTERN_ARR || v == V_PATTERN_ARR_LEN) {
		int n = v == V_PATTERN_ARR ? L : L - 1;
		kv_arr(&g, K("attention.sliding_window_pattern"), BK_GGUF_BOOL, (uint64_t)n);
		for (int l = 0; l < n; l++) {
			uint8_t b = l % 2 == 0;
			put(&g, &b, 1);
		}
	}
	if (v == V_ROPE_LINEAR || v == V_ROPE_YARN || v == V_LINEAR_NO_FACTOR)
		kv_str(&g, K("rope.scaling.type"), v == V_ROPE_YARN ? "yarn" : "linear");
	if (v == V_ROPE_LINEAR)
		kv_f32(&g, K("rope.scaling.factor"), 8);
	if (v == V_SOFTCAP)
		kv_f32(&g, K("final_logit_softcapping"), 30);
#undef K
	/* a SentencePiece vocabulary: specials, a newline, optional bytes, two pieces */
	const char *tok[] = { "<pad>", "<eos>", "<bos>", "<unk>", "\n", "a", v == V_DUP ? "a" : "b",
			      "<0x41>" };
	int type[] = { 3, 3, v == V_BOS_NORMAL ? 1 : 3, v == V_UNK_NORMAL ? 1 : 3, 4, 1, 1, 6 };
	int nt = v == V_ONE_BYTE ? 8 : 7;
	kv_str(&g, "tokenizer.ggml.model", "llama");
	kv_str(&g, "tokenizer.ggml.pre", v == V_PRE ? "gemma4" : "default");
	kv_arr(&g, "tokenizer.ggml.tokens", BK_GGUF_STRING, (uint64_t)nt);
	for (int i = 0; i < nt; i++)
		pstr(&g, tok[i]);
	if (v != V_NO_SCORES) {
		kv_arr(&g, "tokenizer.ggml.scores", BK_GGUF_F32, (uint64_t)nt);
		for (int i = 0; i < nt; i++) {
			float s = i < 5 ? -1000.0f : (float)(4 - i);
			put(&g, &s, 4);
		}
	}
	kv_arr(&g, "tokenizer.ggml.token_type", BK_GGUF_I32, (uint64_t)nt);
	for (int i = 0; i < nt; i++)
		put32(&g, (uint32_t)type[i]);
	kv_u32(&g, "tokenizer.ggml.bos_token_id", 2);
	kv_u32(&g, "tokenizer.ggml.eos_token_id", 1);
	if (v != V_NO_UNK)
		kv_u32(&g, "tokenizer.ggml.unknown_token_id", 3);
	kv_u32(&g, "tokenizer.ggml.padding_token_id", 0);
	kv_bool(&g, "tokenizer.ggml.add_space_prefix", v == V_SPACE_PREFIX);
	if (v == V_CHARSMAP) {
		kv_arr(&g, "tokenizer.ggml.precompiled_charsmap", BK_GGUF_U8, 1);
		put(&g, "x", 1);
	}
	memcpy(g.b + 16, &g.n_kv, 8);
	return g;
}

static json_t *config_of(int v)
{
	gbuf b = meta(v);
	bk_gguf *g = bk_gguf_open_mem("meta.gguf", b.b, b.n);
	json_t *c = bk_gguf_hf_config(g, BK_DT_F32);
	bk_gguf_close(g);
	free(b.b);
	return c;
}

static void config_child(void *arg)
{
	json_decref(config_of((int)(intptr_t)arg));
	exit(0);
}

static void spm_child(void *arg)
{
	gbuf b = meta((int)(intptr_t)arg);
	bk_gguf *g = bk_gguf_open_mem("meta.gguf", b.b, b.n);
	size_t n;
	free(bk_gguf_hf_spm(g, &n));
	json_decref(bk_gguf_hf_tokenizer_config(g));
	bk_gguf_close(g);
	exit(0);
}

static const char *layer_type(json_t *c, int l)
{
	return json_string_value(json_array_get(json_object_get(c, "layer_types"), (size_t)l));
}

static void check_meta(void)
{
	json_t *c = config_of(V_OK);
	CHECK(!strcmp(layer_type(c, 0), "sliding_attention") &&
		      !strcmp(layer_type(c, 5), "full_attention") &&
		      json_integer_value(json_object_get(c, "sliding_window")) == 512 &&
		      json_integer_value(json_object_get(c, "query_pre_attn_scalar")) == 32,
	      "default pattern: 5 sliding then full, window 512, scale 1/sqrt(32)");
	json_decref(c);
	c = config_of(V_PATTERN_INT);
	CHECK(!strcmp(layer_type(c, 1), "sliding_attention") &&
		      !strcmp(layer_type(c, 2), "full_attention") &&
		      !strcmp(layer_type(c, 5), "full_attention"),
	      "sliding_window_pattern 3: layers 2 and 5 full");
	json_decref(c);
	c = config_of(V_PATTERN_ARR);
	CHECK(!strcmp(layer_type(c, 0), "sliding_attention") &&
		      !strcmp(layer_type(c, 1), "full_attention") &&
		      !strcmp(layer_type(c, 4), "sliding_attention"),
	      "sliding_window_pattern [true, false, ...]: one per layer");
	json_decref(c);
	c = config_of(V_NO_WINDOW);
	CHECK(!strcmp(layer_type(c, 0), "full_attention") && !json_object_get(c, "sliding_window"),
	      "no sliding_window: every layer full, as llama.cpp");
	json_decref(c);
	c = config_of(V_ROPE_LINEAR);
	json_t *f = json_object_get(json_object_get(c, "rope_parameters"), "full_attention");
	json_t *sl = json_object_get(json_object_get(c, "rope_parameters"), "sliding_attention");
	CHECK(!strcmp(json_string_value(json_object_get(f, "rope_type")), "linear") &&
		      json_number_value(json_object_get(f, "factor")) == 8 &&
		      !strcmp(json_string_value(json_object_get(sl, "rope_type")), "default") &&
		      json_number_value(json_object_get(sl, "rope_theta")) == 10000,
	      "linear rope scaling on the full layers only");
	json_decref(c);
	c = config_of(V_L62);
	CHECK(json_integer_value(json_object_get(c, "query_pre_attn_scalar")) == 16,
	      "62 layers (27B): query_pre_attn_scalar hidden/heads, as llama.cpp");
	json_decref(c);

	struct {
		int v;
		void (*fn)(void *);
		const char *s1, *s2;
	} bad[] = {
		{ V_ARCH_GEMMA2, config_child, "meta.gguf", "architecture 'gemma2' is not supported (supported: llama, gemma3)" },
		{ V_ROPE_YARN, config_child, "gemma3.rope.scaling.type 'yarn'", "supported: none, linear" },
		{ V_LINEAR_NO_FACTOR, config_child, "'gemma3.rope.scaling.factor'", "missing" },
		{ V_SOFTCAP, config_child, "'gemma3.final_logit_softcapping' is set", NULL },
		{ V_VALUE_LEN, config_child, "gemma3.attention.value_length 16 differs", NULL },
		{ V_PATTERN_ARR_LEN, config_child, "'gemma3.attention.sliding_window_pattern' has 5 entries for 6 layers", NULL },
		{ V_SPACE_PREFIX, spm_child, "tokenizer.ggml.add_space_prefix true", NULL },
		{ V_NO_UNK, spm_child, "'tokenizer.ggml.unknown_token_id' is missing", NULL },
		{ V_UNK_NORMAL, spm_child, "unknown_token_id 3 has token type 1", NULL },
		{ V_DUP, spm_child, "tokenizer.ggml.tokens[6] 'a' is a duplicate of id 5", NULL },
		{ V_ONE_BYTE, spm_child, "1 byte tokens (256 or none expected)", NULL },
		{ V_NO_SCORES, spm_child, "'tokenizer.ggml.scores' is missing", NULL },
		{ V_LLAMA_SPM, spm_child, "tokenizer.ggml.model 'llama' is supported with architecture gemma3 only", NULL },
		{ V_PRE, spm_child, "tokenizer.ggml.pre 'gemma4' is not supported (supported: default)", NULL },
		{ V_BOS_NORMAL, spm_child, "'tokenizer.ggml.bos_token_id' is 2, a token of type 1", NULL },
		{ V_CHARSMAP, spm_child, "'tokenizer.ggml.precompiled_charsmap'", NULL },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char what[48];
		snprintf(what, sizeof what, "refusal %zu", i);
		bk_expect_die(what, bad[i].fn, (void *)(intptr_t)bad[i].v, bad[i].s1, bad[i].s2);
	}
	/* and the good metadata's tokenizer is accepted */
	char err[512];
	CHECK(bk_run_child(spm_child, (void *)(intptr_t)V_OK, err, sizeof err) == 0,
	      "valid SentencePiece metadata refused: %s", err);
}

int main(void)
{
	check_convert();
	check_meta();
	return bk_test_done("gguf_gemma3");
}
