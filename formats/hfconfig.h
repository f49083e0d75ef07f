/* hfconfig.h - HF config.json for the Llama family (LlamaForCausalLM, MistralForCausalLM):
 * the numbers the model code needs, checks of a checkpoint's tensor names and shapes
 * against them, and RoPE inverse frequencies (default and llama3 scaling).
 * Not a general HF config reader: every other architecture or option is refused.
 *
 * sliding_window (Mistral) is recorded, not applied: attention here is full causal.
 * Full attention equals sliding-window attention while a sequence is not longer than
 * the window, so bk_config_max_seq() is min(max_position_embeddings, sliding_window)
 * and tools must refuse longer sequences. */
#ifndef BK_HFCONFIG_H
#define BK_HFCONFIG_H

#include "formats/safetensors.h"

#define BK_MAX_EOS 8

typedef enum { BK_ROPE_DEFAULT, BK_ROPE_LLAMA3 } bk_rope_type;

typedef struct {
	char *path;         /* config.json path, for messages */
	char *architecture; /* "LlamaForCausalLM" or "MistralForCausalLM" */
	char *model_type;   /* "llama" or "mistral" */
	int hidden_size;    /* H */
	int intermediate_size; /* I */
	int n_layers;       /* L */
	int n_heads;        /* NH */
	int n_kv_heads;     /* NKV (default NH); NH % NKV == 0 */
	int head_dim;       /* D (default H / NH); even */
	int vocab_size;     /* V */
	int max_pos;        /* max_position_embeddings */
	float rms_norm_eps;
	double rope_theta;  /* default 10000 */
	int tie_word_embeddings; /* default 0 */
	int bos_token_id;   /* -1 when absent or null */
	int n_eos;          /* 0 .. BK_MAX_EOS */
	int eos_token_ids[BK_MAX_EOS];
	int sliding_window; /* 0 = none; recorded, not applied (see above) */
	bk_rope_type rope_type;
	/* llama3 scaling (rope_type BK_ROPE_LLAMA3) */
	double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
	int rope_original_max_pos;
} bk_config;

/* path: a config.json or a model directory holding one. Dies on anything unsupported,
 * naming the file and key, e.g. "m/config.json: architecture 'GPT2LMHeadModel' is not
 * supported (supported: LlamaForCausalLM, MistralForCausalLM)". */
bk_config *bk_config_load(const char *path);
/* Same from JSON text; name is used in messages. */
bk_config *bk_config_parse(const char *name, const char *json_text, size_t len);
void bk_config_free(bk_config *c);

/* Longest sequence whose attention is exact here: min(max_pos, sliding_window). */
int bk_config_max_seq(const bk_config *c);
/* The one context-length check of every stage that runs the model (bk-tokenize
 * --model, bk-gen, bk-teach, bk-step, bk-eval): NULL when a sequence of n tokens fits,
 * else a message in buf, e.g. "teacher sequence of 1927 tokens is longer than the
 * model's context of 512 positions" (what = "teacher sequence"). */
const char *bk_config_check_len(const bk_config *c, long n, const char *what, char *buf,
				size_t size);

/* Check a checkpoint against the config: every expected tensor present with the right
 * shape, nothing else (rotary_emb.inv_freq buffers ignored; lm_head.weight allowed
 * and shape-checked when embeddings are tied). Dies naming the tensor:
 *   model.embed_tokens.weight (V, H); model.norm.weight (H); lm_head.weight (V, H)
 *   model.layers.N.self_attn.{q (NH*D, H), k/v (NKV*D, H), o (H, NH*D)}_proj.weight
 *   model.layers.N.mlp.{gate/up (I, H), down (H, I)}_proj.weight
 *   model.layers.N.{input,post_attention}_layernorm.weight (H) */
void bk_config_check_st(const bk_config *c, const bk_st *st);

/* RoPE inverse frequencies, out: head_dim/2 floats, computed in fp32 in the same order
 * of operations as transformers' default and _compute_llama3_parameters. */
void bk_rope_inv_freq(const bk_config *c, float *out);

#endif
