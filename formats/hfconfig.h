/* hfconfig.h - HF config.json of the families users bake: the numbers the model code
 * needs, checks of a checkpoint's tensor names and shapes against them, and RoPE
 * inverse frequencies (default, linear and llama3 scaling).  Supported (both the
 * transformers 4 and 5 layouts, e.g. rope_scaling / rope_parameters):
 *   LlamaForCausalLM (Llama 1-3.x, SmolLM2, TinyLlama), MistralForCausalLM (its
 *   sliding_window on every layer), MinistralForCausalLM (Mistral's layers, the window
 *   per layer_types), Qwen2ForCausalLM (q/k/v bias; sliding window only
 *   with use_sliding_window), Qwen3ForCausalLM (q_norm/k_norm, explicit head_dim),
 *   GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (gemma3_text) and the text
 *   tower of Gemma3ForConditionalGeneration (nested text_config; vision tensors
 *   ignored).  Every other architecture or option is refused, naming it.
 *   Gemma-3's keys default to Gemma3TextConfig's (vocab_size 262208, 8 heads, 4 KV
 *   heads, ...), as the published multimodal configs leave them out of text_config.
 *
 * Sliding-window layers are applied for real by the model (layer_window). */
#ifndef BK_HFCONFIG_H
#define BK_HFCONFIG_H

#include "formats/safetensors.h"

#define BK_MAX_EOS 8

/* dynamic: transformers' dynamic NTK rescales only past max_position_embeddings, which
 * bk_config_check_len refuses, so its frequencies are the default ones here */
typedef enum {
	BK_ROPE_DEFAULT,
	BK_ROPE_LLAMA3,
	BK_ROPE_LINEAR,
	BK_ROPE_DYNAMIC,
	BK_ROPE_YARN,
} bk_rope_type;

typedef enum {
	BK_FAM_LLAMA, /* Llama, Mistral, Ministral */
	BK_FAM_QWEN2,
	BK_FAM_QWEN3,
	BK_FAM_GEMMA,
	BK_FAM_GEMMA2,
	BK_FAM_GEMMA3,
} bk_family;

typedef struct {
	char *path;         /* config.json path, for messages */
	char *architecture; /* e.g. "LlamaForCausalLM", "Gemma3ForConditionalGeneration" */
	char *model_type;   /* e.g. "llama", "gemma3_text" (of the text model) */
	bk_family family;
	int multimodal;     /* Gemma3ForConditionalGeneration: text tower of a VLM */
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
	int sliding_window; /* 0 = none; the window of the sliding layers */
	int *layer_window;  /* [n_layers]: 0 = full attention, else sliding_window */
	/* RoPE of the full-attention layers (all layers unless rope_local_theta > 0) */
	bk_rope_type rope_type;
	/* llama3 scaling (BK_ROPE_LLAMA3); factor also for linear, dynamic and yarn,
	 * original_max_pos also for yarn */
	double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
	int rope_original_max_pos;
	/* yarn: the correction range's rotations and its truncation; the attention factor
	 * that multiplies cos and sin (1 for every other type; bk_config_attn_scale) */
	double rope_beta_fast, rope_beta_slow, rope_attention_factor;
	int rope_truncate;
	/* Gemma-3: the sliding layers use default RoPE with this base; 0 = as full */
	double rope_local_theta;
	/* family deltas */
	int qkv_bias;       /* Qwen2: self_attn.{q,k,v}_proj.bias */
	int qk_norm;        /* Qwen3, Gemma-3: self_attn.{q,k}_norm.weight [head_dim] */
	int norm_plus_one;  /* Gemma: every RMSNorm multiplies by (1 + w) */
	int geglu;          /* Gemma: gelu_pytorch_tanh(gate) * up */
	int embed_scaled;   /* Gemma: embeddings times sqrt(hidden_size) (bk_config_embed_scale) */
	int sandwich;       /* Gemma-2/3: pre/post_feedforward_layernorm, post-attention norm on
			     * the attention output */
	double attn_softcap;  /* Gemma-2 attn_logit_softcapping; 0 = none */
	double final_softcap; /* Gemma-2 final_logit_softcapping; 0 = none */
	double query_pre_attn_scalar; /* Gemma-2/3: scale = this^-0.5; 0 = head_dim */
} bk_config;

/* path: a config.json or a model directory holding one. Dies on anything unsupported,
 * naming the file and key, e.g. "m/config.json: architecture 'GPT2LMHeadModel' is not
 * supported (supported: LlamaForCausalLM, MistralForCausalLM)". */
bk_config *bk_config_load(const char *path);
/* Same from JSON text; name is used in messages. */
bk_config *bk_config_parse(const char *name, const char *json_text, size_t len);
void bk_config_free(bk_config *c);

/* Longest sequence the model takes: max_position_embeddings (sliding windows are
 * applied, not a limit). */
int bk_config_max_seq(const bk_config *c);

/* The attention scale: query_pre_attn_scalar^-0.5 or head_dim^-0.5, in fp32, times the
 * square of yarn's attention factor (HF multiplies cos and sin by it, so q and k after
 * RoPE, so their product by its square: folded into the scale here). */
float bk_config_attn_scale(const bk_config *c);
/* The embedding multiplier: 1, or (Gemma) sqrt(hidden_size) rounded to dtype, the dtype
 * of the computation's hidden states (BK_DT_BF16 / F16 / F32), as HF's
 * torch.tensor(H ** 0.5, dtype=hidden_states.dtype).  gpu/load.c passes BK_DT_F32: the
 * residual stream is fp32 on the host twin and on the GPU, whatever the checkpoint's dtype. */
float bk_config_embed_scale(const bk_config *c, int dtype);

/* Tensor names of the text model in st: the prefix of the decoder ("model.", or for
 * Gemma3ForConditionalGeneration "language_model.model." / "model.language_model.")
 * and the LM head's name ("lm_head.weight" or "language_model.lm_head.weight"). */
const char *bk_config_prefix(const bk_config *c, const bk_st *st);
const char *bk_config_lm_head(const bk_config *c, const bk_st *st);
/* The one context-length check of every stage that runs the model (bk-tokenize
 * --model, bk-gen, bk-teach, bk-step, bk-eval): NULL when a sequence of n tokens fits,
 * else a message in buf, e.g. "teacher sequence of 1927 tokens is longer than the
 * model's context of 512 positions" (what = "teacher sequence"). */
const char *bk_config_check_len(const bk_config *c, long n, const char *what, char *buf,
				size_t size);

/* Check a checkpoint against the config: every expected tensor present with the right
 * shape, nothing else (rotary_emb.inv_freq buffers ignored; lm_head.weight allowed
 * and shape-checked when embeddings are tied; a VLM's vision tensors ignored, with a
 * note). Dies naming the tensor:
 *   model.embed_tokens.weight (V, H); model.norm.weight (H); lm_head.weight (V, H)
 *   model.layers.N.self_attn.{q (NH*D, H), k/v (NKV*D, H), o (H, NH*D)}_proj.weight
 *   model.layers.N.mlp.{gate/up (I, H), down (H, I)}_proj.weight
 *   model.layers.N.{input,post_attention}_layernorm.weight (H)
 *   qkv_bias: model.layers.N.self_attn.{q (NH*D), k/v (NKV*D)}_proj.bias
 *   qk_norm: model.layers.N.self_attn.{q,k}_norm.weight (D)
 *   sandwich: model.layers.N.{pre,post}_feedforward_layernorm.weight (H) */
void bk_config_check_st(const bk_config *c, const bk_st *st);

/* RoPE inverse frequencies, out: head_dim/2 floats, computed in fp32 in the same order
 * of operations as transformers' default, linear, dynamic (below max_position_
 * embeddings: the default), _compute_llama3_parameters and _compute_yarn_parameters,
 * of the full-attention layers. */
void bk_rope_inv_freq(const bk_config *c, float *out);
/* The same for the sliding layers when rope_local_theta > 0 (returns 1), else 0. */
int bk_rope_inv_freq_local(const bk_config *c, float *out);

#endif
