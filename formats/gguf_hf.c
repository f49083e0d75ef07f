/* gguf_hf.c - see gguf_hf.h.  Architecture 'llama': the tokenizer.json written here is
 * the one HF's tokenizers library saves for SmolLM2 (byte-level BPE,
 * Digits(individual_digits) then ByteLevel pre-tokenizer, ByteLevel post-processor and
 * decoder), with the vocabulary, merges and added tokens taken from the GGUF.
 * Architecture 'gemma3': llama.cpp's convert_hf_to_gguf.py stores every RMSNorm weight
 * as 1 + w (its norm multiplies by the weight; HF's Gemma norm by 1 + w), leaves q/k
 * unpermuted and the embedding unscaled (both engines scale it at run time), and writes
 * the SentencePiece vocabulary as tokens, scores and token types (the same numbers as
 * sentencepiece's piece types): tokenizer.model is that ModelProto rebuilt (BPE, Gemma's
 * identity normalizer without a dummy prefix, byte fallback).  What llama.cpp's gemma3
 * loader fixes in code rather than in keys is fixed here the same way: every 6th layer
 * full attention, the others sliding with RoPE base 10000 unscaled, query scale
 * 1/sqrt(key_length) (hidden/heads for the 62-layer 27B).  Peak memory: the output's
 * weights plus one fp32 tensor. */
#include "formats/gguf_hf.h"

#include <ctype.h>
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
#include "formats/tokenizer.h"

/* GGUF token types (llama.cpp's llama_token_type) */
enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

typedef enum { ARCH_LLAMA, ARCH_GEMMA3 } arch_t;

/* "ARCH.key" in one of 4 rotating buffers (a message may name two keys) */
static const char *ak(arch_t a, const char *key)
{
	static char buf[4][96];
	static int next;
	char *b = buf[next++ & 3];
	snprintf(b, sizeof buf[0], "%s.%s", a == ARCH_GEMMA3 ? "gemma3" : "llama", key);
	return b;
}

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

static arch_t gguf_arch(const bk_gguf *g)
{
	char *arch = bk_gguf_get_str(g, "general.architecture");
	if (!arch)
		die("%s: key 'general.architecture' is missing", bk_gguf_path(g));
	arch_t a;
	if (!strcmp(arch, "llama"))
		a = ARCH_LLAMA;
	else if (!strcmp(arch, "gemma3"))
		a = ARCH_GEMMA3;
	else
		die("%s: architecture '%s' is not supported (supported: llama, gemma3)",
		    bk_gguf_path(g), arch);
	free(arch);
	return a;
}

static arch_t check_arch(const bk_gguf *g)
{
	const char *p = bk_gguf_path(g);
	arch_t a = gguf_arch(g);
	char *rs = bk_gguf_get_str(g, ak(a, "rope.scaling.type"));
	if (rs && strcmp(rs, "none") && !(a == ARCH_GEMMA3 && !strcmp(rs, "linear")))
		die("%s: %s '%s' is not supported (supported: none%s)", p,
		    ak(a, "rope.scaling.type"), rs, a == ARCH_GEMMA3 ? ", linear" : "");
	free(rs);
	int64_t ex;
	if (bk_gguf_get_int(g, ak(a, "expert_count"), &ex) && ex > 0)
		die("%s: %s %lld: mixture-of-experts models are not supported", p,
		    ak(a, "expert_count"), (long long)ex);
	if (a == ARCH_GEMMA3) {
		/* llama.cpp's gemma3 reads no softcap; one in the file would be ignored there */
		static const char *const caps[] = { "attn_logit_softcapping",
						    "final_logit_softcapping" };
		for (int i = 0; i < 2; i++) {
			double v;
			if (bk_gguf_find_kv(g, ak(a, caps[i])) &&
			    (!bk_gguf_get_float(g, ak(a, caps[i]), &v) || v != 0))
				die("%s: key '%s' is set: softcapping is not part of Gemma-3 (not "
				    "supported)", p, ak(a, caps[i]));
		}
	}
	return a;
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
	arch_t a = gguf_arch(g);
	if (bk_gguf_get_int(g, ak(a, "vocab_size"), &v))
		return need_pos_int(g, ak(a, "vocab_size"), 1 << 24);
	const bk_gguf_kv *tok = bk_gguf_get_arr(g, "tokenizer.ggml.tokens", BK_GGUF_STRING);
	if (!tok)
		die("%s: neither '%s' nor 'tokenizer.ggml.tokens' is present", bk_gguf_path(g),
		    ak(a, "vocab_size"));
	return (int)tok->n;
}

/* gemma3's attention layout: layer_types from sliding_window_pattern (a period, or one
 * bool per layer, true = sliding) or llama.cpp's fixed period 6; no sliding_window key:
 * every layer full, as llama.cpp's loader does then. */
static json_t *gemma3_layer_types(const bk_gguf *g, int L, int *any_sliding)
{
	const char *p = bk_gguf_path(g);
	const char *pk = ak(ARCH_GEMMA3, "attention.sliding_window_pattern");
	int has_window = bk_gguf_find_kv(g, ak(ARCH_GEMMA3, "attention.sliding_window")) != NULL;
	const bk_gguf_kv *kv = bk_gguf_find_kv(g, pk);
	int period = 6;
	const bk_gguf_kv *arr = NULL;
	if (kv && kv->type == BK_GGUF_ARRAY && (arr = bk_gguf_get_arr(g, pk, BK_GGUF_I64))) {
		if (arr->n != (uint64_t)L)
			die("%s: key '%s' has %llu entries for %d layers", p, pk,
			    (unsigned long long)arr->n, L);
	} else if (kv) {
		period = need_pos_int(g, pk, 1 << 12);
	}
	json_t *lt = json_array();
	*any_sliding = 0;
	for (int l = 0; l < L; l++) {
		int sliding = arr ? bk_gguf_arr_int(arr, (uint64_t)l) != 0 : (l + 1) % period != 0;
		sliding = sliding && has_window;
		*any_sliding |= sliding;
		json_array_append_new(lt, json_string(sliding ? "sliding_attention"
							      : "full_attention"));
	}
	return lt;
}

static json_t *rope_set(double theta, const char *type, double factor)
{
	json_t *o = json_object();
	if (factor > 0)
		json_object_set_new(o, "factor", number(short_f32(factor)));
	json_object_set_new(o, "rope_theta", json_real(short_f32(theta)));
	json_object_set_new(o, "rope_type", json_string(type));
	return o;
}

json_t *bk_gguf_hf_config(const bk_gguf *g, bk_dtype dt)
{
	const char *p = bk_gguf_path(g);
	arch_t a = check_arch(g);
	int g3 = a == ARCH_GEMMA3;
	int H = need_pos_int(g, ak(a, "embedding_length"), 1 << 20);
	int L = need_pos_int(g, ak(a, "block_count"), 1 << 12);
	int I = need_pos_int(g, ak(a, "feed_forward_length"), 1 << 22);
	int NH = need_pos_int(g, ak(a, "attention.head_count"), 1 << 12);
	int NKV = NH;
	if (bk_gguf_find_kv(g, ak(a, "attention.head_count_kv")))
		NKV = need_pos_int(g, ak(a, "attention.head_count_kv"), NH);
	if (NH % NKV)
		die("%s: head_count %d is not a multiple of head_count_kv %d", p, NH, NKV);
	int D = H / NH;
	if (bk_gguf_find_kv(g, ak(a, "attention.key_length")))
		D = need_pos_int(g, ak(a, "attention.key_length"), 1 << 16);
	else if (H % NH)
		die("%s: embedding_length %d is not a multiple of head_count %d", p, H, NH);
	if (bk_gguf_find_kv(g, ak(a, "attention.value_length")) &&
	    need_int(g, ak(a, "attention.value_length")) != D)
		die("%s: %s %lld differs from the key length %d (not supported)", p,
		    ak(a, "attention.value_length"),
		    (long long)need_int(g, ak(a, "attention.value_length")), D);
	if (bk_gguf_find_kv(g, ak(a, "rope.dimension_count")) &&
	    need_int(g, ak(a, "rope.dimension_count")) != D)
		die("%s: %s %lld differs from the head size %d (partial rotary embeddings are not "
		    "supported)", p, ak(a, "rope.dimension_count"),
		    (long long)need_int(g, ak(a, "rope.dimension_count")), D);
	double eps, theta = g3 ? 1000000 : 10000;
	if (!bk_gguf_get_float(g, ak(a, "attention.layer_norm_rms_epsilon"), &eps))
		die("%s: key '%s' is missing", p, ak(a, "attention.layer_norm_rms_epsilon"));
	bk_gguf_get_float(g, ak(a, "rope.freq_base"), &theta);
	int ctx = need_pos_int(g, ak(a, "context_length"), 1 << 24);
	int V = vocab_size(g);

	json_t *c = json_object();
	json_t *arch = json_array();
	json_array_append_new(arch, json_string(g3 ? "Gemma3ForCausalLM" : "LlamaForCausalLM"));
	json_object_set_new(c, "architectures", arch);
	json_object_set_new(c, "attention_bias", json_false());
	json_object_set_new(c, "attention_dropout", json_real(0.0));
	if (g3)
		json_object_set_new(c, "attn_logit_softcapping", json_null());
	int bos = opt_id(g, "tokenizer.ggml.bos_token_id", V);
	int eos = opt_id(g, "tokenizer.ggml.eos_token_id", V);
	int pad = opt_id(g, "tokenizer.ggml.padding_token_id", V);
	json_object_set_new(c, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
	json_object_set_new(c, "eos_token_id", eos >= 0 ? json_integer(eos) : json_null());
	if (g3)
		json_object_set_new(c, "final_logit_softcapping", json_null());
	if (D * NH != H || g3)
		json_object_set_new(c, "head_dim", json_integer(D));
	json_object_set_new(c, g3 ? "hidden_activation" : "hidden_act",
			    json_string(g3 ? "gelu_pytorch_tanh" : "silu"));
	json_object_set_new(c, "hidden_size", json_integer(H));
	json_object_set_new(c, "intermediate_size", json_integer(I));
	int any_sliding = 0;
	if (g3)
		json_object_set_new(c, "layer_types", gemma3_layer_types(g, L, &any_sliding));
	json_object_set_new(c, "max_position_embeddings", json_integer(ctx));
	if (!g3)
		json_object_set_new(c, "mlp_bias", json_false());
	json_object_set_new(c, "model_type", json_string(g3 ? "gemma3_text" : "llama"));
	json_object_set_new(c, "num_attention_heads", json_integer(NH));
	json_object_set_new(c, "num_hidden_layers", json_integer(L));
	json_object_set_new(c, "num_key_value_heads", json_integer(NKV));
	if (pad >= 0)
		json_object_set_new(c, "pad_token_id", json_integer(pad));
	if (g3) /* llama.cpp: scale 1/sqrt(key_length), but 1/sqrt(H/NH) for 62 layers (27B) */
		json_object_set_new(c, "query_pre_attn_scalar",
				    json_integer(L == 62 ? H / NH : D));
	json_object_set_new(c, "rms_norm_eps", number(short_f32(eps)));
	if (g3) {
		/* transformers 5's layout: one RoPE set per layer type */
		double factor = 0;
		char *rs = bk_gguf_get_str(g, ak(a, "rope.scaling.type"));
		if (rs && !strcmp(rs, "linear")) {
			if (!bk_gguf_get_float(g, ak(a, "rope.scaling.factor"), &factor) ||
			    !(factor >= 1) || !isfinite(factor))
				die("%s: key '%s' is missing or below 1 (linear rope scaling needs it)",
				    p, ak(a, "rope.scaling.factor"));
		}
		free(rs);
		json_t *rp = json_object();
		json_object_set_new(rp, "full_attention",
				    rope_set(theta, factor > 0 ? "linear" : "default", factor));
		json_object_set_new(rp, "sliding_attention", rope_set(10000, "default", 0));
		json_object_set_new(c, "rope_parameters", rp);
		if (any_sliding)
			json_object_set_new(c, "sliding_window",
					    json_integer(need_pos_int(g, ak(a, "attention.sliding_window"),
								      1 << 24)));
	} else {
		json_object_set_new(c, "rope_scaling", json_null());
		json_object_set_new(c, "rope_theta", number(short_f32(theta)));
	}
	json_object_set_new(c, "tie_word_embeddings",
			    json_boolean(!bk_gguf_find_tensor(g, "output.weight")));
	json_object_set_new(c, "torch_dtype",
			    json_string(dt == BK_DT_BF16 ? "bfloat16" : "float32"));
	if (g3)
		json_object_set_new(c, "use_bidirectional_attention", json_false());
	json_object_set_new(c, "use_cache", json_true());
	json_object_set_new(c, "vocab_size", json_integer(V));
	return c;
}

/* ---- tokenizer ---- */

/* 1: SentencePiece ('llama', with gemma3: tokenizer.model); 0: byte-level BPE ('gpt2'
 * with 'smollm': tokenizer.json).  Dies on anything else. */
static int check_tokenizer(const bk_gguf *g)
{
	const char *p = bk_gguf_path(g);
	char *model = bk_gguf_get_str(g, "tokenizer.ggml.model");
	if (!model)
		die("%s: key 'tokenizer.ggml.model' is missing (no tokenizer in the file)", p);
	int spm = !strcmp(model, "llama");
	if (!spm && strcmp(model, "gpt2"))
		die("%s: tokenizer.ggml.model '%s' is not supported (supported: gpt2, llama)", p,
		    model);
	if (spm && gguf_arch(g) != ARCH_GEMMA3)
		die("%s: tokenizer.ggml.model 'llama' is supported with architecture gemma3 only",
		    p);
	free(model);
	char *pre = bk_gguf_get_str(g, "tokenizer.ggml.pre");
	if (spm ? pre && strcmp(pre, "default") : !pre || strcmp(pre, "smollm"))
		die("%s: tokenizer.ggml.pre '%s' is not supported (supported: %s)", p,
		    pre ? pre : "(missing)", spm ? "default" : "smollm");
	free(pre);
	int v = 0;
	if (!spm && bk_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &v) && v)
		die("%s: tokenizer.ggml.add_bos_token true is not supported with pre 'smollm'", p);
	if (spm && bk_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &v) && v)
		die("%s: tokenizer.ggml.add_space_prefix true is not supported (Gemma's "
		    "tokenizer adds no dummy prefix)", p);
	if (spm && bk_gguf_find_kv(g, "tokenizer.ggml.precompiled_charsmap"))
		die("%s: key 'tokenizer.ggml.precompiled_charsmap': SentencePiece normalization "
		    "rules are not supported", p);
	return spm;
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

/* the token arrays; *merges NULL for SentencePiece; returns check_tokenizer's answer */
static int tok_arrays(const bk_gguf *g, const bk_gguf_kv **tok, const bk_gguf_kv **types,
		      const bk_gguf_kv **merges)
{
	int spm = check_tokenizer(g);
	const char *p = bk_gguf_path(g);
	*tok = bk_gguf_get_arr(g, "tokenizer.ggml.tokens", BK_GGUF_STRING);
	if (!*tok || !(*tok)->n)
		die("%s: key 'tokenizer.ggml.tokens' is missing or empty", p);
	*types = bk_gguf_get_arr(g, "tokenizer.ggml.token_type", BK_GGUF_I64);
	if (*types && (*types)->n != (*tok)->n)
		die("%s: tokenizer.ggml.token_type has %llu entries for %llu tokens", p,
		    (unsigned long long)(*types)->n, (unsigned long long)(*tok)->n);
	if (spm && !*types)
		die("%s: key 'tokenizer.ggml.token_type' is missing (a SentencePiece vocabulary "
		    "needs it)", p);
	*merges = NULL;
	if (spm)
		return 1;
	*merges = bk_gguf_get_arr(g, "tokenizer.ggml.merges", BK_GGUF_STRING);
	if (!*merges)
		die("%s: key 'tokenizer.ggml.merges' is missing", p);
	return 0;
}

/* ---- a SentencePiece ModelProto, written field by field (libsentencepiece-dev ships
 * no ModelProto header; field numbers of sentencepiece_model.proto) ---- */

typedef struct {
	char *b;
	size_t n, cap;
} pbuf;

static void pb_raw(pbuf *p, const void *d, size_t n)
{
	if (p->n + n > p->cap) {
		p->cap = (p->n + n) * 2 + 64;
		p->b = xrealloc(p->b, p->cap);
	}
	memcpy(p->b + p->n, d, n);
	p->n += n;
}

static void pb_varint(pbuf *p, uint64_t v)
{
	unsigned char t[10];
	int k = 0;
	for (; v >= 0x80; v >>= 7)
		t[k++] = (unsigned char)(0x80 | (v & 0x7f));
	t[k++] = (unsigned char)v;
	pb_raw(p, t, (size_t)k);
}

static void pb_int(pbuf *p, int field, int64_t v) /* int32/enum/bool: negatives as 10 bytes */
{
	pb_varint(p, (uint64_t)field << 3);
	pb_varint(p, (uint64_t)v);
}

static void pb_bytes(pbuf *p, int field, const void *d, size_t n)
{
	pb_varint(p, (uint64_t)field << 3 | 2);
	pb_varint(p, n);
	pb_raw(p, d, n);
}

static void pb_float(pbuf *p, int field, float f)
{
	unsigned char t[4];
	uint32_t u;
	memcpy(&u, &f, 4);
	for (int k = 0; k < 4; k++)
		t[k] = (unsigned char)(u >> (8 * k)); /* fixed32: little-endian */
	pb_varint(p, (uint64_t)field << 3 | 5);
	pb_raw(p, t, 4);
}

enum { SP_UNKNOWN = 2 };

char *bk_gguf_hf_spm(const bk_gguf *g, size_t *len)
{
	const bk_gguf_kv *tok, *types, *merges;
	if (!tok_arrays(g, &tok, &types, &merges))
		die("%s: tokenizer.ggml.model is 'gpt2': written as tokenizer.json, not as a "
		    "SentencePiece model", bk_gguf_path(g));
	const char *p = bk_gguf_path(g);
	int n = (int)tok->n;
	if (tok->n > (1u << 24))
		die("%s: tokenizer.ggml.tokens has %llu entries (at most %d)", p,
		    (unsigned long long)tok->n, 1 << 24);
	const bk_gguf_kv *scores = bk_gguf_get_arr(g, "tokenizer.ggml.scores", BK_GGUF_F32);
	if (!scores || scores->n != tok->n)
		die("%s: key 'tokenizer.ggml.scores' is missing or has %llu entries for %d tokens",
		    p, scores ? (unsigned long long)scores->n : 0ULL, n);
	int unk = opt_id(g, "tokenizer.ggml.unknown_token_id", n);
	if (unk < 0)
		die("%s: key 'tokenizer.ggml.unknown_token_id' is missing (SentencePiece needs an "
		    "unknown token)", p);
	int ids[3] = { opt_id(g, "tokenizer.ggml.bos_token_id", n),
		       opt_id(g, "tokenizer.ggml.eos_token_id", n),
		       opt_id(g, "tokenizer.ggml.padding_token_id", n) };
	json_t *seen = json_object();
	pbuf m = {0}, piece = {0};
	int n_bytes = 0;
	for (int i = 0; i < n; i++) {
		const bk_gguf_str *s = &tok->strs[i];
		if (!s->n || memchr(s->s, 0, s->n))
			die("%s: tokenizer.ggml.tokens[%d] is empty or holds a NUL byte", p, i);
		json_t *js = tok_string(g, tok, (uint64_t)i);
		const char *k = json_string_value(js);
		if (json_object_get(seen, k))
			die("%s: tokenizer.ggml.tokens[%d] '%s' is a duplicate of id %lld", p, i, k,
			    (long long)json_integer_value(json_object_get(seen, k)));
		json_object_set_new(seen, k, json_integer(i));
		int tt = token_type(g, types, (uint64_t)i);
		/* llama.cpp marks <unk> CONTROL when the HF side lists it as a special token;
		 * SentencePiece needs exactly one piece of type UNKNOWN */
		if (i == unk) {
			if (tt != TT_CONTROL && tt != TT_UNKNOWN)
				die("%s: tokenizer.ggml.unknown_token_id %d has token type %d "
				    "(control or unknown expected)", p, i, tt);
			tt = SP_UNKNOWN;
		} else if (tt == TT_UNKNOWN) {
			die("%s: tokenizer.ggml.token_type[%d] is 2 (unknown) but the unknown token "
			    "is id %d", p, i, unk);
		}
		if (tt == TT_BYTE) { /* sentencepiece's own spelling: <0x%02X> */
			char want[8] = "";
			if (s->n == 6 && isxdigit((unsigned char)k[3]) && isxdigit((unsigned char)k[4]))
				snprintf(want, sizeof want, "<0x%02X>",
					 (unsigned)strtoul((char[]){ k[3], k[4], 0 }, NULL, 16));
			if (strcmp(want, k))
				die("%s: tokenizer.ggml.tokens[%d] '%s' has the byte type but is not "
				    "<0xXX>", p, i, k);
			n_bytes++;
		}
		json_decref(js);
		float sc;
		memcpy(&sc, scores->data + 4 * (size_t)i, 4);
		if (!isfinite(sc))
			die("%s: tokenizer.ggml.scores[%d] is not finite", p, i);
		piece.n = 0;
		pb_bytes(&piece, 1, s->s, s->n);
		pb_float(&piece, 2, sc);
		if (tt != TT_NORMAL)
			pb_int(&piece, 3, tt);
		pb_bytes(&m, 1, piece.b, piece.n);
	}
	json_decref(seen);
	if (n_bytes && n_bytes != 256)
		die("%s: tokenizer.ggml.token_type: %d byte tokens (256 or none expected)", p,
		    n_bytes);
	for (int k = 0; k < 3; k++)
		if (ids[k] >= 0 && token_type(g, types, (uint64_t)ids[k]) != TT_CONTROL)
			die("%s: key 'tokenizer.ggml.%s_token_id' is %d, a token of type %d "
			    "(control expected)", p, k == 0 ? "bos" : k == 1 ? "eos" : "padding",
			    ids[k], token_type(g, types, (uint64_t)ids[k]));
	/* TrainerSpec (2): BPE, the vocabulary size, byte fallback, the special pieces */
	pbuf ts = {0};
	pb_int(&ts, 3, 2); /* model_type BPE */
	pb_int(&ts, 4, n);
	if (n_bytes)
		pb_int(&ts, 35, 1);
	pb_int(&ts, 40, unk);
	pb_int(&ts, 41, ids[0]);
	pb_int(&ts, 42, ids[1]);
	pb_int(&ts, 43, ids[2]);
	int all[4] = { unk, ids[0], ids[1], ids[2] };
	for (int k = 0; k < 4; k++)
		if (all[k] >= 0)
			pb_bytes(&ts, 45 + k, tok->strs[all[k]].s, tok->strs[all[k]].n);
	pb_bytes(&m, 2, ts.b, ts.n);
	/* NormalizerSpec (3): identity, no dummy prefix, whitespace kept and escaped */
	pbuf ns = {0};
	pb_bytes(&ns, 1, "identity", 8);
	pb_int(&ns, 3, 0);
	pb_int(&ns, 4, 0);
	pb_int(&ns, 5, 1);
	pb_bytes(&m, 3, ns.b, ns.n);
	free(ts.b);
	free(ns.b);
	free(piece.b);
	*len = m.n;
	return m.b;
}

json_t *bk_gguf_hf_tokenizer(const bk_gguf *g)
{
	const bk_gguf_kv *tok, *types, *merges;
	const char *p = bk_gguf_path(g);
	if (tok_arrays(g, &tok, &types, &merges))
		die("%s: tokenizer.ggml.model is 'llama': written as tokenizer.model, not as "
		    "tokenizer.json", p);

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
	int spm = tok_arrays(g, &tok, &types, &merges);
	json_t *c = json_object();
	if (spm) { /* GemmaTokenizer's defaults: BOS added, EOS not */
		int ab = 1, ae = 0;
		bk_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &ab);
		bk_gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &ae);
		json_object_set_new(c, "add_bos_token", json_boolean(ab));
		json_object_set_new(c, "add_eos_token", json_boolean(ae));
	} else {
		int asp = 0;
		bk_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &asp);
		json_object_set_new(c, "add_prefix_space", json_boolean(asp));
	}
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
	if (bk_gguf_get_int(g, ak(gguf_arch(g), "context_length"), &ctx))
		json_object_set_new(c, "model_max_length", json_integer(ctx));
	json_object_set_new(c, "pad_token",
			    token_or_null(g, tok, "tokenizer.ggml.padding_token_id"));
	if (spm)
		json_object_set_new(c, "spaces_between_special_tokens", json_false());
	json_object_set_new(c, "tokenizer_class",
			    json_string(spm ? "GemmaTokenizer" : "GPT2Tokenizer"));
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

char *bk_gguf_hf_name(const char *gn, int gemma3, int n_head, int n_kv, int *perm_heads,
		      int *minus_one)
{
	static const char *const blk3[][2] = { /* gemma3: sandwich and q/k norms, (1 + w) */
		{ "attn_norm.weight", "input_layernorm.weight" },
		{ "post_attention_norm.weight", "post_attention_layernorm.weight" },
		{ "ffn_norm.weight", "pre_feedforward_layernorm.weight" },
		{ "post_ffw_norm.weight", "post_feedforward_layernorm.weight" },
		{ "attn_q_norm.weight", "self_attn.q_norm.weight" },
		{ "attn_k_norm.weight", "self_attn.k_norm.weight" },
	};
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
	*perm_heads = *minus_one = 0;
	for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
		if (!strcmp(gn, top[i][0])) {
			*minus_one = gemma3 && i == 1;
			return xstrdup(top[i][1]);
		}
	unsigned layer;
	int off = 0;
	if (sscanf(gn, "blk.%u.%n", &layer, &off) != 1 || !off || layer > 100000)
		return NULL;
	char num[16];
	snprintf(num, sizeof num, "%u", layer);
	if (strncmp(gn + 4, num, strlen(num)) || gn[4 + strlen(num)] != '.')
		return NULL; /* "blk.01." or "blk.+1." */
	for (size_t i = 0; gemma3 && i < sizeof blk3 / sizeof blk3[0]; i++)
		if (!strcmp(gn + off, blk3[i][0])) {
			*minus_one = 1;
			return xasprintf("model.layers.%u.%s", layer, blk3[i][1]);
		}
	for (size_t i = 0; i < sizeof blk / sizeof blk[0]; i++)
		if (!strcmp(gn + off, blk[i][0])) {
			if (gemma3) /* not permuted for Gemma: HF's rotate_half order as is */
				return xasprintf("model.layers.%u.%s", layer, blk[i][1]);
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
	int g3 = gguf_arch(g) == ARCH_GEMMA3;
	const bk_gguf_kv *tok, *types, *merges;
	int spm = tok_arrays(g, &tok, &types, &merges);
	json_t *tokenizer = spm ? NULL : bk_gguf_hf_tokenizer(g);
	size_t spm_len = 0;
	char *spm_model = spm ? bk_gguf_hf_spm(g, &spm_len) : NULL;
	json_t *tok_config = bk_gguf_hf_tokenizer_config(g);
	json_t *stmap = special_tokens_map(g);
	json_t *gen = generation_config(g);
	int NH = (int)json_integer_value(json_object_get(config, "num_attention_heads"));
	int NKV = (int)json_integer_value(json_object_get(config, "num_key_value_heads"));
	for (size_t i = 0; i < bk_gguf_n_tensors(g); i++) {
		const bk_gguf_tensor *t = bk_gguf_tensor_at(g, i);
		int ph, m1;
		char *hn = bk_gguf_hf_name(t->name, g3, NH, NKV, &ph, &m1);
		if (!hn)
			die("%s: tensor '%s' is not one of a %s model's (biases, rope_freqs and "
			    "other extras are not supported)", gguf_path, t->name,
			    g3 ? "Gemma-3" : "Llama");
		free(hn);
		if (!bk_ggml_type_supported(t->type))
			die("%s: tensor '%s': type %s is not supported (supported: F32, F16, BF16, "
			    "Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", gguf_path, t->name,
			    bk_ggml_type_name(t->type));
		if (t->ndim > 2)
			die("%s: tensor '%s' has %d dimensions (1 or 2 expected)", gguf_path, t->name,
			    t->ndim);
		if (ph && (t->ne[1] % ph || (t->ne[1] / ph) % 2))
			die("%s: tensor '%s': %lld rows are not %d heads of an even size", gguf_path,
			    t->name, (long long)t->ne[1], ph);
	}
	if (spm) {
		stats.vocab = (int)tok->n;
		stats.added = (int)json_object_size(json_object_get(tok_config,
								      "added_tokens_decoder"));
	} else {
		stats.vocab = (int)json_object_size(
			json_object_get(json_object_get(tokenizer, "model"), "vocab"));
		stats.merges = (int)json_array_size(
			json_object_get(json_object_get(tokenizer, "model"), "merges"));
		stats.added = (int)json_array_size(json_object_get(tokenizer, "added_tokens"));
	}

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
		int ph, m1;
		names[i] = bk_gguf_hf_name(t->name, g3, NH, NKV, &ph, &m1);
		int64_t n = bk_gguf_numel(t);
		float *f = xmalloc((size_t)n * sizeof(float));
		bk_gguf_dequant(g, t, f);
		if (ph)
			bk_gguf_unpermute(f, t->ne[1], t->ne[0], ph);
		for (int64_t k = 0; m1 && k < n; k++) /* llama.cpp stored 1 + w */
			f[k] -= 1.0f;
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

	write_json(tmp_dir, "config.json", config, JSON_REAL_PRECISION(9));
	if (spm) {
		char *mp = bk_path_join(tmp_dir, "tokenizer.model");
		bk_write_file_atomic(mp, spm_model, spm_len);
		free(mp);
		free(spm_model);
	} else {
		write_json(tmp_dir, "tokenizer.json", tokenizer, 0);
	}
	write_json(tmp_dir, "tokenizer_config.json", tok_config, 0);
	write_json(tmp_dir, "special_tokens_map.json", stmap, 0);
	write_json(tmp_dir, "generation_config.json", gen, 0);

	/* the directory must load as the model code reads it */
	bk_config *cfg = bk_config_load(tmp_dir);
	bk_st *st = bk_st_open(tmp_dir);
	bk_config_check_st(cfg, st);
	bk_st_close(st);
	bk_config_free(cfg);
	if (spm) { /* and the tokenizer as bk-tokenize reads it, with the GGUF's special ids */
		bk_tok *tk = bk_tok_open(tmp_dir);
		int32_t want[4] = { opt_id(g, "tokenizer.ggml.bos_token_id", (int)tok->n),
				    opt_id(g, "tokenizer.ggml.eos_token_id", (int)tok->n),
				    opt_id(g, "tokenizer.ggml.unknown_token_id", (int)tok->n),
				    opt_id(g, "tokenizer.ggml.padding_token_id", (int)tok->n) };
		int32_t got[4] = { bk_tok_bos(tk), bk_tok_eos(tk), bk_tok_unk(tk), bk_tok_pad(tk) };
		if (bk_tok_vocab_size(tk) != (int32_t)tok->n || memcmp(want, got, sizeof want))
			BUG("tokenizer.model read back: %d pieces, bos/eos/unk/pad %d %d %d %d",
			    bk_tok_vocab_size(tk), got[0], got[1], got[2], got[3]);
		bk_tok_free(tk);
	}
	bk_gguf_close(g);

	char *final = xstrndup(out_dir, ol);
	if (rename(tmp_dir, final) != 0)
		die("%s: cannot rename %s to it: %s", final, tmp_dir, strerror(errno));
	free(final);
	free(tmp_dir);
	tmp_dir = NULL;
	return stats;
}
