/* gguf_hf.c - see gguf_hf.h.  The tokenizer.json written here is the one HF's
 * tokenizers library saves for SmolLM2 (byte-level BPE, Digits(individual_digits) then
 * ByteLevel pre-tokenizer, ByteLevel post-processor and decoder), with the vocabulary,
 * merges and added tokens taken from the GGUF.  Peak memory: the output's weights plus
 * one fp32 tensor. */
#include "formats/gguf_hf.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "formats/hfconfig.h"

/* GGUF token types (llama.cpp's llama_token_type) */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

static int64_t need_int(const bk_gguf *g, const char *key)
{
	int64_t v;
	if (!bk_gguf_get_int(g, key, &v))
		die("%s: key '%s' is missing", bk_gguf_path(g), key);
	return v;
}

static int need_pos_int(const bk_gguf *g, const char *key, int64_t max)
{
	int64_t v = need_int(g, key);
	if (v < 1 || v > max)
		die("%s: key '%s' is %lld (1 to %lld allowed)", bk_gguf_path(g), key, (long long)v,
		    (long long)max);
	return (int)v;
}

static void check_arch(const bk_gguf *g)
{
	char *arch = bk_gguf_get_str(g, "general.architecture");
	if (!arch)
		die("%s: key 'general.architecture' is missing", bk_gguf_path(g));
	if (strcmp(arch, "llama"))
		die("%s: architecture '%s' is not supported (supported: llama)", bk_gguf_path(g),
		    arch);
	free(arch);
	char *rs = bk_gguf_get_str(g, "llama.rope.scaling.type");
	if (rs && strcmp(rs, "none"))
		die("%s: llama.rope.scaling.type '%s' is not supported (supported: none)",
		    bk_gguf_path(g), rs);
	free(rs);
	int64_t ex;
	if (bk_gguf_get_int(g, "llama.expert_count", &ex) && ex > 0)
		die("%s: llama.expert_count %lld: mixture-of-experts models are not supported",
		    bk_gguf_path(g), (long long)ex);
}

/* The shortest decimal that reads back as the same float32, as a double (so that
 * config.json says 1e-05, as HF's does, not 9.999999747378752e-06). */
static double short_f32(double v)
{
	float f = (float)v;
	char buf[32];
	for (int p = 1; p <= 9; p++) {
		snprintf(buf, sizeof buf, "%.*g", p, (double)f);
		if (strtof(buf, NULL) == f)
			return strtod(buf, NULL);
	}
	return (double)f;
}

static json_t *number(double v)
{
	if (v == floor(v) && fabs(v) < 9e15)
		return json_integer((json_int_t)v);
	return json_real(v);
}

static int opt_id(const bk_gguf *g, const char *key, int n_vocab)
{
	int64_t v;
	if (!bk_gguf_get_int(g, key, &v))
		return -1;
	if (v < 0 || v >= n_vocab)
		die("%s: key '%s' is %lld, outside the vocabulary of %d", bk_gguf_path(g), key,
		    (long long)v, n_vocab);
	return (int)v;
}

static int vocab_size(const bk_gguf *g)
{
	int64_t v;
	if (bk_gguf_get_int(g, "llama.vocab_size", &v))
		return need_pos_int(g, "llama.vocab_size", 1 << 24);
	const bk_gguf_kv *tok = bk_gguf_get_arr(g, "tokenizer.ggml.tokens", BK_GGUF_STRING);
	if (!tok)
		die("%s: neither 'llama.vocab_size' nor 'tokenizer.ggml.tokens' is present",
		    bk_gguf_path(g));
	return (int)tok->n;
}

json_t *bk_gguf_hf_config(const bk_gguf *g, bk_dtype dt)
{
	check_arch(g);
	int H = need_pos_int(g, "llama.embedding_length", 1 << 20);
	int L = need_pos_int(g, "llama.block_count", 1 << 12);
	int I = need_pos_int(g, "llama.feed_forward_length", 1 << 22);
	int NH = need_pos_int(g, "llama.attention.head_count", 1 << 12);
	int NKV = NH;
	if (bk_gguf_find_kv(g, "llama.attention.head_count_kv"))
		NKV = need_pos_int(g, "llama.attention.head_count_kv", NH);
	if (NH % NKV)
		die("%s: head_count %d is not a multiple of head_count_kv %d", bk_gguf_path(g), NH,
		    NKV);
	int D = H / NH;
	if (bk_gguf_find_kv(g, "llama.attention.key_length"))
		D = need_pos_int(g, "llama.attention.key_length", 1 << 16);
	else if (H % NH)
		die("%s: embedding_length %d is not a multiple of head_count %d", bk_gguf_path(g), H,
		    NH);
	if (bk_gguf_find_kv(g, "llama.rope.dimension_count") &&
	    need_int(g, "llama.rope.dimension_count") != D)
		die("%s: llama.rope.dimension_count %lld differs from the head size %d (partial "
		    "rotary embeddings are not supported)", bk_gguf_path(g),
		    (long long)need_int(g, "llama.rope.dimension_count"), D);
	double eps, theta = 10000;
	if (!bk_gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", &eps))
		die("%s: key 'llama.attention.layer_norm_rms_epsilon' is missing", bk_gguf_path(g));
	bk_gguf_get_float(g, "llama.rope.freq_base", &theta);
	int ctx = need_pos_int(g, "llama.context_length", 1 << 24);
	int V = vocab_size(g);

	json_t *c = json_object();
	json_t *arch = json_array();
	json_array_append_new(arch, json_string("LlamaForCausalLM"));
	json_object_set_new(c, "architectures", arch);
	json_object_set_new(c, "attention_bias", json_false());
	json_object_set_new(c, "attention_dropout", json_real(0.0));
	int bos = opt_id(g, "tokenizer.ggml.bos_token_id", V);
	int eos = opt_id(g, "tokenizer.ggml.eos_token_id", V);
	int pad = opt_id(g, "tokenizer.ggml.padding_token_id", V);
	json_object_set_new(c, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
	json_object_set_new(c, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
	if (D * NH != H)
		json_object_set_new(c, "head_dim", json_integer(D));
	json_object_set_new(c, "hidden_act", json_string("silu"));
	json_object_set_new(c, "hidden_size", json_integer(H));
	json_object_set_new(c, "intermediate_size", json_integer(I));
	json_object_set_new(c, "max_position_embeddings", json_integer(ctx));
	json_object_set_new(c, "mlp_bias", json_false());
	json_object_set_new(c, "model_type", json_string("llama"));
	json_object_set_new(c, "num_attention_heads", json_integer(NH));
	json_object_set_new(c, "num_hidden_layers", json_integer(L));
	json_object_set_new(c, "num_key_value_heads", json_integer(NKV));
	if (pad >= 0)
		json_object_set_new(c, "pad_token_id", json_integer(pad));
	json_object_set_new(c, "rms_norm_eps", number(short_f32(eps)));
	json_object_set_new(c, "rope_scaling", json_null());
	json_object_set_new(c, "rope_theta", number(short_f32(theta)));
	json_object_set_new(c, "tie_word_embeddings",
			    json_boolean(!bk_gguf_find_tensor(g, "output.weight")));
	json_object_set_new(c, "torch_dtype",
			    json_string(dt == BK_DT_BF16 ? "bfloat16" : "float32"));
	json_object_set_new(c, "use_cache", json_true());
	json_object_set_new(c, "vocab_size", json_integer(V));
	return c;
}

/* ---- tokenizer ---- */

static void check_tokenizer(const bk_gguf *g)
{
	const char *p = bk_gguf_path(g);
	char *model = bk_gguf_get_str(g, "tokenizer.ggml.model");
	if (!model)
		die("%s: key 'tokenizer.ggml.model' is missing (no tokenizer in the file)", p);
	if (strcmp(model, "gpt2"))
		die("%s: tokenizer.ggml.model '%s' is not supported (supported: gpt2)", p, model);
	free(model);
	char *pre = bk_gguf_get_str(g, "tokenizer.ggml.pre");
	if (!pre || strcmp(pre, "smollm"))
		die("%s: tokenizer.ggml.pre '%s' is not supported (supported: smollm)", p,
		    pre ? pre : "(missing)");
	free(pre);
	int add_bos = 0;
	if (bk_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos) && add_bos)
		die("%s: tokenizer.ggml.add_bos_token true is not supported with pre 'smollm'", p);
}

static json_t *tok_string(const bk_gguf *g, const bk_gguf_kv *kv, uint64_t i)
{
	json_t *s = json_stringn(kv->strs[i].s, kv->strs[i].n);
	if (!s)
		die("%s: %s[%llu] is not valid UTF-8 without NUL bytes", bk_gguf_path(g), kv->key,
		    (unsigned long long)i);
	return s;
}

static int token_type(const bk_gguf *g, const bk_gguf_kv *types, uint64_t i)
{
	if (!types)
		return TT_NORMAL;
	int64_t t = bk_gguf_arr_int(types, i);
	if (t < TT_NORMAL || t > TT_BYTE)
		die("%s: tokenizer.ggml.token_type[%llu] is %lld (1 to 6 allowed)", bk_gguf_path(g),
		    (unsigned long long)i, (long long)t);
	return (int)t;
}

static int is_added(int tt) { return tt == TT_CONTROL || tt == TT_USER || tt == TT_UNKNOWN; }

static json_t *bytelevel(int add_prefix_space, int trim_offsets, int use_regex)
{
	json_t *o = json_object();
	json_object_set_new(o, "type", json_string("ByteLevel"));
	json_object_set_new(o, "add_prefix_space", json_boolean(add_prefix_space));
	json_object_set_new(o, "trim_offsets", json_boolean(trim_offsets));
	json_object_set_new(o, "use_regex", json_boolean(use_regex));
	return o;
}

static void tok_arrays(const bk_gguf *g, const bk_gguf_kv **tok, const bk_gguf_kv **types,
		       const bk_gguf_kv **merges)
{
	check_tokenizer(g);
	const char *p = bk_gguf_path(g);
	*tok = bk_gguf_get_arr(g, "tokenizer.ggml.tokens", BK_GGUF_STRING);
	if (!*tok || !(*tok)->n)
		die("%s: key 'tokenizer.ggml.tokens' is missing or empty", p);
	*types = bk_gguf_get_arr(g, "tokenizer.ggml.token_type", BK_GGUF_I64);
	if (*types && (*types)->n != (*tok)->n)
		die("%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", p,
		    (unsigned long long)(*types)->n, (unsigned long long)(*tok)->n);
	*merges = bk_gguf_get_arr(g, "tokenizer.ggml.merges", BK_GGUF_STRING);
	if (!*merges)
		die("%s: key 'tokenizer.ggml.merges' is missing", p);
}

json_t *bk_gguf_hf_tokenizer(const bk_gguf *g)
{
	const bk_gguf_kv *tok, *types, *merges;
	tok_arrays(g, &tok, &types, &merges);
	const char *p = bk_gguf_path(g);

	json_t *root = json_object();
	json_object_set_new(root, "version", json_string("1.0"));
	json_object_set_new(root, "truncation", json_null());
	json_object_set_new(root, "padding", json_null());
	json_t *added = json_array();
	json_t *vocab = json_object();
	for (uint64_t i = 0; i < tok->n; i++) {
		json_t *s = tok_string(g, tok, i);
		const char *k = json_string_value(s);
		if (strlen(k) != tok->strs[i].n)
			BUG("NUL in a token json_stringn accepted");
		if (json_object_get(vocab, k))
			die("%s: tokenizer.ggml.tokens[%llu] '%s' is a duplicate of id %lld", p,
			    (unsigned long long)i, k,
			    (long long)json_integer_value(json_object_get(vocab, k)));
		json_object_set_new(vocab, k, json_integer((json_int_t)i));
		int tt = token_type(g, types, i);
		if (is_added(tt)) {
			json_t *a = json_object();
			json_object_set_new(a, "id", json_integer((json_int_t)i));
			json_object_set(a, "content", s);
			json_object_set_new(a, "single_word", json_false());
			json_object_set_new(a, "lstrip", json_false());
			json_object_set_new(a, "rstrip", json_false());
			json_object_set_new(a, "normalized", json_false());
			json_object_set_new(a, "special", json_boolean(tt != TT_USER));
			json_array_append_new(added, a);
		}
		json_decref(s);
	}
	json_t *mj = json_array();
	for (uint64_t i = 0; i < merges->n; i++) {
		json_t *s = tok_string(g, merges, i);
		const char *m = json_string_value(s);
		const char *sp = strchr(m, ' ');
		int ok = sp && sp != m && sp[1] && !strchr(sp + 1, ' ');
		if (ok) {
			char *a = xstrndup(m, (size_t)(sp - m));
			char *ab = xasprintf("%s%s", a, sp + 1);
			ok = json_object_get(vocab, a) && json_object_get(vocab, sp + 1) &&
			     json_object_get(vocab, ab);
			free(a);
			free(ab);
		}
		if (!ok)
			die("%s: tokenizer.ggml.merges[%llu] '%s' is not two vocabulary tokens whose "
			    "concatenation is one", p, (unsigned long long)i, m);
		json_array_append_new(mj, s);
	}
	json_object_set_new(root, "added_tokens", added);
	json_object_set_new(root, "normalizer", json_null());
	json_t *pre = json_object();
	json_object_set_new(pre, "type", json_string("Sequence"));
	json_t *pres = json_array();
	json_t *digits = json_object();
	json_object_set_new(digits, "type", json_string("Digits"));
	json_object_set_new(digits, "individual_digits", json_true());
	json_array_append_new(pres, digits);
	json_array_append_new(pres, bytelevel(0, 1, 1));
	json_object_set_new(pre, "pretokenizers", pres);
	json_object_set_new(root, "pre_tokenizer", pre);
	json_object_set_new(root, "post_processor", bytelevel(1, 0, 1));
	json_object_set_new(root, "decoder", bytelevel(1, 1, 1));
	json_t *model = json_object();
	json_object_set_new(model, "type", json_string("BPE"));
	json_object_set_new(model, "dropout", json_null());
	json_object_set_new(model, "unk_token", json_null());
	json_object_set_new(model, "continuing_subword_prefix", json_null());
	json_object_set_new(model, "end_of_word_suffix", json_null());
	json_object_set_new(model, "fuse_unk", json_false());
	json_object_set_new(model, "byte_fallback", json_false());
	json_object_set_new(model, "ignore_merges", json_false());
	json_object_set_new(model, "vocab", vocab);
	json_object_set_new(model, "merges", mj);
	json_object_set_new(root, "model", model);
	return root;
}

static json_t *token_or_null(const bk_gguf *g, const bk_gguf_kv *tok, const char *key)
{
	int id = opt_id(g, key, (int)tok->n);
	return id < 0 ? json_null() : tok_string(g, tok, (uint64_t)id);
}

json_t *bk_gguf_hf_tokenizer_config(const bk_gguf *g)
{
	const bk_gguf_kv *tok, *types, *merges;
	tok_arrays(g, &tok, &types, &merges);
	json_t *c = json_object();
	int asp = 0;
	bk_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &asp);
	json_object_set_new(c, "add_prefix_space", json_boolean(asp));
	json_t *dec = json_object();
	for (uint64_t i = 0; i < tok->n; i++) {
		int tt = token_type(g, types, i);
		if (!is_added(tt))
			continue;
		json_t *a = json_object();
		json_object_set_new(a, "content", tok_string(g, tok, i));
		json_object_set_new(a, "lstrip", json_false());
		json_object_set_new(a, "normalized", json_false());
		json_object_set_new(a, "rstrip", json_false());
		json_object_set_new(a, "single_word", json_false());
		json_object_set_new(a, "special", json_boolean(tt != TT_USER));
		char key[24];
		snprintf(key, sizeof key, "%llu", (unsigned long long)i);
		json_object_set_new(dec, key, a);
	}
	json_object_set_new(c, "added_tokens_decoder", dec);
	json_object_set_new(c, "bos_token", token_or_null(g, tok, "tokenizer.ggml.bos_token_id"));
	char *tmpl = bk_gguf_get_str(g, "tokenizer.chat_template");
	if (tmpl) {
		json_t *s = json_string(tmpl);
		if (!s)
			die("%s: key 'tokenizer.chat_template' is not valid UTF-8", bk_gguf_path(g));
		json_object_set_new(c, "chat_template", s);
		free(tmpl);
	}
	json_object_set_new(c, "clean_up_tokenization_spaces", json_false());
	json_object_set_new(c, "eos_token", token_or_null(g, tok, "tokenizer.ggml.eos_token_id"));
	int64_t ctx;
	if (bk_gguf_get_int(g, "llama.context_length", &ctx))
		json_object_set_new(c, "model_max_length", json_integer(ctx));
	json_object_set_new(c, "pad_token",
			    token_or_null(g, tok, "tokenizer.ggml.padding_token_id"));
	json_object_set_new(c, "tokenizer_class", json_string("GPT2Tokenizer"));
	json_object_set_new(c, "unk_token",
			    token_or_null(g, tok, "tokenizer.ggml.unknown_token_id"));
	json_object_set_new(c, "vocab_size", json_integer((json_int_t)tok->n));
	return c;
}

static json_t *special_tokens_map(const bk_gguf *g)
{
	const bk_gguf_kv *tok, *types, *merges;
	tok_arrays(g, &tok, &types, &merges);
	static const char *const keys[][2] = {
		{ "bos_token", "tokenizer.ggml.bos_token_id" },
		{ "eos_token", "tokenizer.ggml.eos_token_id" },
		{ "pad_token", "tokenizer.ggml.padding_token_id" },
		{ "unk_token", "tokenizer.ggml.unknown_token_id" },
	};
	json_t *m = json_object();
	for (int k = 0; k < 4; k++) {
		int id = opt_id(g, keys[k][1], (int)tok->n);
		if (id < 0)
			continue;
		json_t *o = json_object();
		json_object_set_new(o, "content", tok_string(g, tok, (uint64_t)id));
		json_object_set_new(o, "lstrip", json_false());
		json_object_set_new(o, "normalized", json_false());
		json_object_set_new(o, "rstrip", json_false());
		json_object_set_new(o, "single_word", json_false());
		json_object_set_new(m, keys[k][0], o);
	}
	return m;
}

static json_t *generation_config(const bk_gguf *g)
{
	int V = vocab_size(g);
	json_t *c = json_object();
	static const char *const keys[][2] = {
		{ "bos_token_id", "tokenizer.ggml.bos_token_id" },
		{ "eos_token_id", "tokenizer.ggml.eos_token_id" },
		{ "pad_token_id", "tokenizer.ggml.padding_token_id" },
	};
	for (int k = 0; k < 3; k++) {
		int id = opt_id(g, keys[k][1], V);
		if (id >= 0)
			json_object_set_new(c, keys[k][0], json_integer(id));
	}
	return c;
}

/* ---- tensors ---- */

char *bk_gguf_hf_name(const char *gn, int n_head, int n_kv, int *perm_heads)
{
	static const char *const top[][2] = {
		{ "token_embd.weight", "model.embed_tokens.weight" },
		{ "output_norm.weight", "model.norm.weight" },
		{ "output.weight", "lm_head.weight" },
	};
	static const char *const blk[][2] = {
		{ "attn_norm.weight", "input_layernorm.weight" },
		{ "ffn_norm.weight", "post_attention_layernorm.weight" },
		{ "attn_q.weight", "self_attn.q_proj.weight" },
		{ "attn_k.weight", "self_attn.k_proj.weight" },
		{ "attn_v.weight", "self_attn.v_proj.weight" },
		{ "attn_output.weight", "self_attn.o_proj.weight" },
		{ "ffn_gate.weight", "mlp.gate_proj.weight" },
		{ "ffn_up.weight", "mlp.up_proj.weight" },
		{ "ffn_down.weight", "mlp.down_proj.weight" },
	};
	*perm_heads = 0;
	for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
		if (!strcmp(gn, top[i][0]))
			return xstrdup(top[i][1]);
	unsigned layer;
	int off = 0;
	if (sscanf(gn, "blk.%u.%n", &layer, &off) != 1 || !off || layer > 100000)
		return NULL;
	char num[16];
	snprintf(num, sizeof num, "%u", layer);
	if (strncmp(gn + 4, num, strlen(num)) || gn[4 + strlen(num)] != '.')
		return NULL; /* "blk.01." or "blk.+1." */
	for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++)
		if (!strcmp(gn + off, blk[i][0])) {
			if (i == 2)
				*perm_heads = n_head;
			if (i == 3)
				*perm_heads = n_kv;
			return xasprintf("model.layers.%u.%s", layer, blk[i][1]);
		}
	return NULL;
}

static char *tmp_dir;

static void remove_tmp_dir(void)
{
	if (!tmp_dir)
		return;
	bk_remove_flat_dir(tmp_dir); /* best effort: we are dying */
}

static int dir_is_empty(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		die("%s: %s", path, strerror(errno));
	struct dirent *e;
	int empty = 1;
	while (empty && (e = readdir(d)))
		empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
	closedir(d);
	return empty;
}

static void write_json(const char *dir, const char *name, json_t *j, size_t flags)
{
	char *text = json_dumps(j, JSON_INDENT(2) | flags);
	if (!text)
		die("%s/%s: cannot format JSON (out of memory)", dir, name);
	size_t n = strlen(text);
	text = xrealloc(text, n + 2);
	text[n] = '\n';
	char *path = bk_path_join(dir, name);
	bk_write_file_atomic(path, text, n + 1);
	free(path);
	free(text);
	json_decref(j);
}

bk_gguf_hf_stats bk_gguf_to_hf(const char *gguf_path, const char *out_dir, bk_dtype dt)
{
	bk_gguf_hf_stats stats = {0};
	if (dt != BK_DT_F32 && dt != BK_DT_BF16)
		BUG("output dtype %s", bk_dtype_name(dt));
	struct stat sb;
	if (!stat(out_dir, &sb) && (!S_ISDIR(sb.st_mode) || !dir_is_empty(out_dir)))
		die("%s: already exists; remove it or choose another output directory", out_dir);
	bk_gguf *g = bk_gguf_open(gguf_path);
	/* everything that can be refused is refused before any output exists */
	json_t *config = bk_gguf_hf_config(g, dt);
	json_t *tokenizer = bk_gguf_hf_tokenizer(g);
	json_t *tok_config = bk_gguf_hf_tokenizer_config(g);
	json_t *stmap = special_tokens_map(g);
	json_t *gen = generation_config(g);
	int NH = (int)json_integer_value(json_object_get(config, "num_attention_heads"));
	int NKV = (int)json_integer_value(json_object_get(config, "num_key_value_heads"));
	for (size_t i = 0; i < bk_gguf_n_tensors(g); i++) {
		const bk_gguf_tensor *t = bk_gguf_tensor_at(g, i);
		int ph;
		char *hn = bk_gguf_hf_name(t->name, NH, NKV, &ph);
		if (!hn)
			die("%s: tensor '%s' is not one of a Llama model's (biases, rope_freqs and "
			    "other extras are not supported)", gguf_path, t->name);
		free(hn);
		if (!bk_ggml_type_supported(t->type))
			die("%s: tensor '%s': type %s is not supported (supported: F32, F16, BF16, "
			    "Q4_0, Q4_1, Q8_0, Q4_K, Q6_K)", gguf_path, t->name,
			    bk_ggml_type_name(t->type));
		if (t->ndim > 2)
			die("%s: tensor '%s' has %d dimensions (1 or 2 expected)", gguf_path, t->name,
			    t->ndim);
		if (ph && (t->ne[1] % ph || (t->ne[1] / ph) % 2))
			die("%s: tensor '%s': %lld rows are not %d heads of an even size", gguf_path,
			    t->name, (long long)t->ne[1], ph);
	}
	stats.vocab = (int)json_object_size(json_object_get(json_object_get(tokenizer, "model"),
							    "vocab"));
	stats.merges = (int)json_array_size(json_object_get(json_object_get(tokenizer, "model"),
							    "merges"));
	stats.added = (int)json_array_size(json_object_get(tokenizer, "added_tokens"));

	static int registered;
	if (!registered) {
		bk_atexit(remove_tmp_dir);
		registered = 1;
	}
	size_t ol = strlen(out_dir);
	while (ol > 1 && out_dir[ol - 1] == '/')
		ol--;
	tmp_dir = xasprintf("%.*s.tmp.%ld", (int)ol, out_dir, (long)getpid());
	bk_mkdir_p(tmp_dir);

	bk_st_writer *w = bk_st_writer_new();
	bk_st_writer_meta(w, "format", "pt");
	char **names = xcalloc(bk_gguf_n_tensors(g) + 1, sizeof(char *));
	for (size_t i = 0; i < bk_gguf_n_tensors(g); i++) {
		const bk_gguf_tensor *t = bk_gguf_tensor_at(g, i);
		int ph;
		names[i] = bk_gguf_hf_name(t->name, NH, NKV, &ph);
		int64_t n = bk_gguf_numel(t);
		float *f = xmalloc((size_t)n * sizeof(float));
		bk_gguf_dequant(g, t, f);
		if (ph)
			bk_gguf_unpermute(f, t->ne[1], t->ne[0], ph);
		int64_t shape[2];
		int nd = t->ndim;
		if (nd == 1) {
			shape[0] = t->ne[0];
		} else {
			shape[0] = t->ne[1];
			shape[1] = t->ne[0];
		}
		bk_st_writer_add_f32(w, names[i], dt, nd, shape, f);
		free(f);
		stats.tensors++;
		stats.bytes += (size_t)n * bk_dtype_size(dt);
	}
	char *st_path = bk_path_join(tmp_dir, "model.safetensors");
	bk_st_writer_write(w, st_path);
	free(st_path);
	bk_st_writer_free(w);
	for (size_t i = 0; i < bk_gguf_n_tensors(g); i++)
		free(names[i]);
	free(names);
	bk_gguf_close(g);

	write_json(tmp_dir, "config.json", config, JSON_REAL_PRECISION(9));
	write_json(tmp_dir, "tokenizer.json", tokenizer, 0);
	write_json(tmp_dir, "tokenizer_config.json", tok_config, 0);
	write_json(tmp_dir, "special_tokens_map.json", stmap, 0);
	write_json(tmp_dir, "generation_config.json", gen, 0);

	/* the directory must load as the model code reads it */
	bk_config *cfg = bk_config_load(tmp_dir);
	bk_st *st = bk_st_open(tmp_dir);
	bk_config_check_st(cfg, st);
	bk_st_close(st);
	bk_config_free(cfg);

	char *final = xstrndup(out_dir, ol);
	if (rename(tmp_dir, final) != 0)
		die("%s: cannot rename %s to it: %s", final, tmp_dir, strerror(errno));
	free(final);
	free(tmp_dir);
	tmp_dir = NULL;
	return stats;
}
