/* model.h - a Llama-architecture transformer with the deltas of Qwen2/3 and Gemma 1-3
 * (bias, q/k norms, GeGLU, sandwich norms, attention scale/softcap/window, two RoPE
 * bases, embedding scale; see bk_llama_config) over packed batches, forward and backward
 * (LoRA gradients only), built from the ops table in gpu/ops.h, so it runs on any
 * implementation.  Not a loader (formats/ turns checkpoints into bk_llama_weights) and
 * not the loss (gpu/host/loss.c takes the final hidden states).  Dimension letters: ops.h. */
#ifndef BK_MODEL_H
#define BK_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "gpu/ops.h"
#include "gpu/quant4.h"

typedef struct bk_llama_config {
	int H;          /* hidden_size */
	int I;          /* intermediate_size */
	int L;          /* num_hidden_layers */
	int NH;         /* num_attention_heads */
	int NKV;        /* num_key_value_heads (NH % NKV == 0) */
	int D;          /* head_dim (even) */
	int V;          /* vocab_size */
	float rms_eps;  /* rms_norm_eps */
	const float *inv_freq; /* [D/2] RoPE inverse frequencies (host, copied by create) */
	int tied;       /* tie_word_embeddings: lm_head is embed */
	/* ---- family deltas (all 0 / NULL: a plain Llama) ---- */
	int qkv_bias;   /* Qwen2: q/k/v projections add bq/bk/bv */
	int qk_norm;    /* Qwen3, Gemma-3: RMSNorm of q and k per head (over D), before RoPE */
	int geglu;      /* Gemma: gelu_tanh(gate) * up instead of silu(gate) * up */
	int sandwich;   /* Gemma-2/3: norms on the attention and MLP outputs (post_attn_norm,
			 * post_mlp_norm) before each residual add */
	float embed_scale; /* 0 or 1: none; Gemma: x = embed[id] * embed_scale */
	float attn_scale;  /* 0: D^-0.5; Gemma-2/3: query_pre_attn_scalar^-0.5 */
	float attn_softcap; /* 0: none; Gemma-2 attn_logit_softcapping */
	float final_softcap; /* 0: none; Gemma-2 final_logit_softcapping (the LM head's
			      * logits; generation applies it, see gen.c; the loss ops
			      * take it as their softcap argument) */
	const int *window;  /* [L] sliding window of each layer (0 = full) or NULL (copied) */
	const float *inv_freq_local; /* [D/2] RoPE of the sliding layers (Gemma-3), or NULL:
				      * every layer uses inv_freq (copied) */
	/* QLoRA (load_in_4bit): q4.type != BK_Q4_NONE quantises the seven base linears of
	 * every layer (q/k/v/o, gate/up/down) at create, as transformers' bitsandbytes
	 * integration does (embeddings, norms, biases and the LM head stay as they are),
	 * and uploads them with ops->weight_upload_q4 */
	bk_q4_config q4;
} bk_llama_config;

/* fp32 host pointers in HF layout (W [out,in]); only read by bk_model_create.  Norm
 * weights are the multipliers the model applies: a Gemma checkpoint's (1 + w), made by
 * the loader. */
typedef struct bk_llama_layer_weights {
	const float *wq;     /* [NH*D, H] */
	const float *wk;     /* [NKV*D, H] */
	const float *wv;     /* [NKV*D, H] */
	const float *wo;     /* [H, NH*D] */
	const float *w_gate; /* [I, H] */
	const float *w_up;   /* [I, H] */
	const float *w_down; /* [H, I] */
	const float *attn_norm; /* [H] input_layernorm */
	const float *mlp_norm;  /* [H] post_attention_layernorm (sandwich: pre_feedforward_) */
	const float *bq, *bk, *bv; /* [NH*D], [NKV*D], [NKV*D] when qkv_bias */
	const float *q_norm, *k_norm; /* [D] when qk_norm */
	const float *post_attn_norm, *post_mlp_norm; /* [H] when sandwich:
						      * post_attention_, post_feedforward_ */
} bk_llama_layer_weights;

typedef struct bk_llama_weights {
	const float *embed;      /* [V, H] */
	const float *final_norm; /* [H] */
	const float *lm_head;    /* [V, H]; ignored (embed used) when config.tied */
	const bk_llama_layer_weights *layers; /* [L] */
} bk_llama_weights;

/* LoRA target modules, in PEFT order; a mask has bit (1 << module). */
enum bk_lora_module {
	BK_LORA_Q, BK_LORA_K, BK_LORA_V, BK_LORA_O, BK_LORA_GATE, BK_LORA_UP, BK_LORA_DOWN,
	BK_LORA_NMOD
};
#define BK_LORA_ALL ((1u << BK_LORA_NMOD) - 1)
extern const char *const bk_lora_module_names[BK_LORA_NMOD]; /* "q_proj", ... "down_proj" */

/* The model on a device: frozen weights behind bk_weight handles. */
typedef struct bk_layer {
	bk_weight *w[BK_LORA_NMOD]; /* indexed by enum bk_lora_module: [out,in] each */
	bk_weight *attn_norm, *mlp_norm; /* [1,H] */
	bk_weight *bq, *bk, *bv;         /* [1,NH*D], [1,NKV*D] or NULL */
	bk_weight *q_norm, *k_norm;      /* [1,D] or NULL */
	bk_weight *post_attn_norm, *post_mlp_norm; /* [1,H] or NULL */
	bk_attn attn;                    /* scale, softcap, window of this layer */
	const float *inv_freq;           /* [D/2] device: the model's or the local one */
} bk_layer;

typedef struct bk_model {
	const bk_ops *ops;
	bk_llama_config cfg; /* cfg.inv_freq points at inv_freq_host */
	float *inv_freq_host; /* [D/2] */
	float *inv_freq;      /* [D/2] device */
	float *inv_freq_local; /* [D/2] device, or NULL */
	int *window_host;     /* [L] (cfg.window points here), or NULL */
	float *inv_freq_local_host; /* [D/2] (cfg.inv_freq_local), or NULL */
	bk_weight *embed;     /* [V,H] */
	bk_weight *final_norm; /* [1,H] */
	bk_weight *lm_head;   /* [V,H]; == embed when tied */
	bk_layer *layers;     /* [L] */
	int act_bytes;        /* element size of the activations that feed GEMMs and attention:
			       * 4 (fp32; the host twin) or 2 (bf16: the CUDA ops with BK_ACT=bf16,
			       * gpu/cuda/cuda_act.cuh), from ops->act_bytes at create */
} bk_model;

/* LoRA adapter (or its gradients: same struct, same shapes).  All trainable numbers
 * are one flat fp32 device buffer, so an optimizer or a gradient norm sees one vector;
 * A/B point into it, layer-major, modules in enum order, A before B, targeted modules
 * only (untargeted ones are NULL). */
typedef struct bk_lora {
	int L, r;
	float alpha, scale; /* scale = alpha / r */
	float dropout;      /* p, applied only when the batch says train */
	unsigned targets;   /* mask of enum bk_lora_module bits */
	float *flat;        /* [n_flat] device */
	size_t n_flat;
	float *(*A)[BK_LORA_NMOD]; /* A[l][m]: [R,in] or NULL */
	float *(*B)[BK_LORA_NMOD]; /* B[l][m]: [out,R] or NULL */
} bk_lora;

/* A packed batch: host arrays, uploaded by bk_model_forward. */
typedef struct bk_batch {
	int T, S;
	const int32_t *ids;        /* [T] */
	const int32_t *pos;        /* [T] positions (P + offset in sequence with a prefix) */
	const int32_t *cu_seqlens; /* [S+1] */
	int train;                 /* apply LoRA dropout */
	uint64_t dropout_key;      /* per micro-step; forward and backward must agree */
} bk_batch;

/* A shared prefix (e.g. the system prompt): post-RoPE K and V of every layer for
 * positions 0..P-1, attended to by every sequence of a batch (forward only). */
typedef struct bk_prefix {
	int P, L;
	void **k; /* [L] -> [P,NKV,D] device, elements of the model's act_bytes */
	void **v; /* [L] -> [P,NKV,D] device, elements of the model's act_bytes */
} bk_prefix;

/* Activations saved by the forward for the backward, plus backward workspace; sized
 * for at most max_T tokens and LoRA rank max_r, allocated once. */
typedef struct bk_acts bk_acts;

bk_model *bk_model_create(const bk_ops *ops, const bk_llama_config *cfg,
			  const bk_llama_weights *w);

/* The weights one tensor at a time: ids 0..6 are enum bk_lora_module's linears, then: */
enum bk_weight_id {
	BK_W_ATTN_NORM = BK_LORA_NMOD, BK_W_MLP_NORM, BK_W_BQ, BK_W_BK, BK_W_BV, BK_W_Q_NORM,
	BK_W_K_NORM, BK_W_POST_ATTN_NORM, BK_W_POST_MLP_NORM,
	BK_W_LAYER_N, /* the per-layer ids end here; the model's own (layer -1): */
	BK_W_EMBED = BK_W_LAYER_N, BK_W_FINAL_NORM, BK_W_LM_HEAD,
};
/* get: the fp32 host numbers of weight id of layer (-1: embed, final norm, LM head), in
 * the layout of bk_llama_weights, rows x cols; put (optional): called once it is on the
 * device, e.g. to free it.  bf16 (optional): the same weight in bf16 chunks for
 * ops->weight_upload_bf16, so that no host copy of it is made: sets *fill and *fill_ctx
 * (valid until the next call) and returns 1, or returns 0 for a weight to be got
 * through get (one the source computes, as Gemma's 1 + w norms).  bk_model_create_from
 * asks for one tensor at a time, in a fixed order, only for those the config has (the
 * LM head only when untied); it uses bf16 when both the source and the ops have it and
 * the weight is not a 4-bit linear (those are quantised from get's fp32).  no_numbers:
 * the ops place the weights without reading them (gpu/load.c's shared copy: its layout,
 * or a copy another process loaded); a 4-bit linear is then its shape only
 * (bk_q4_shape), get's numbers are never read. */
typedef struct {
	const float *(*get)(void *ctx, int layer, int id, int rows, int cols);
	void (*put)(void *ctx, const float *p);
	void *ctx;
	int (*bf16)(void *ctx, int layer, int id, int rows, int cols, bk_bf16_fill *fill,
		    void **fill_ctx);
	int no_numbers;
} bk_weight_source;
bk_model *bk_model_create_from(const bk_ops *ops, const bk_llama_config *cfg,
			       const bk_weight_source *src);
void bk_model_free(bk_model *m);
/* in/out features of a module's linear */
void bk_model_module_dims(const bk_llama_config *cfg, int module, int *in, int *out);

bk_acts *bk_acts_create(const bk_model *m, int max_T, int max_r);
/* checkpoint != 0: gradient checkpointing; the forward keeps each layer's input only
 * and the backward recomputes each layer's activations (same results, bit for bit,
 * one more forward of compute, about 1/L of the per-layer activation memory).
 * checkpoint = K >= 2: only every K-th layer's input is kept, the others of a segment
 * are rerun before its backward (same bits again, about one more forward; resid slots
 * L/K + K instead of L + 1: gpu/model.c invariant 9). */
bk_acts *bk_acts_create_ckpt(const bk_model *m, int max_T, int max_r, int checkpoint);
/* for forwards only (the teacher, a prefix; gpu/model.c invariant 8): one layer's
 * activations, no backward workspace; bk_model_backward on them is a BUG */
bk_acts *bk_acts_create_fwd(const bk_model *m, int max_T, int max_r);
void bk_acts_free(const bk_model *m, bk_acts *a);
/* device bytes the acts allocated (saved activations, batch arrays, workspace): the
 * model's peak activation memory, as nothing is allocated per step */
size_t bk_acts_bytes(const bk_acts *a);
/* the acts' [max_T,H] fp32 branch buffer, which no step uses from the end of a
 * bk_model_forward until the backward's first layer rerun (gpu/model.c invariant 13):
 * it may be the forward's out_hidden and the backward's d_hidden, and hold them in
 * between, but a forward on these acts overwrites it */
float *bk_acts_hidden(bk_acts *a);
/* the *n = max_T * I fp32 numbers (NULL, 0 on acts for a forward only) that no
 * forward writes and the backward uses only from its first layer on (invariant 13):
 * free to hold anything from before a forward until the bk_model_backward after it */
float *bk_acts_spare(const bk_model *m, bk_acts *a, size_t *n);

/* zeroed A and B; dropout p in [0,1) */
bk_lora *bk_lora_create(const bk_model *m, int r, float alpha, float dropout,
			unsigned targets);
bk_lora *bk_lora_create_like(const bk_model *m, const bk_lora *like); /* e.g. grads */
void bk_lora_free(const bk_model *m, bk_lora *l);
/* PEFT init: A ~ kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)), B = 0 */
void bk_lora_init_peft(const bk_model *m, bk_lora *l, uint64_t seed);

/* out_hidden [T,H] (device) = final RMSNorm of the last layer's output.  lora NULL =
 * adapter off.  prefix NULL = none; with a prefix no backward may follow. */
void bk_model_forward(const bk_model *m, const bk_lora *lora, const bk_batch *batch,
		      const bk_prefix *prefix, bk_acts *acts, float *out_hidden);
/* Adds dLoss/dA and dLoss/dB of every targeted module into grads (same targets/r as
 * lora) given d_hidden [T,H] (device) = dLoss/d out_hidden; acts from the forward of
 * the same batch and lora. */
void bk_model_backward(const bk_model *m, const bk_lora *lora, const bk_batch *batch,
		       bk_acts *acts, const float *d_hidden, bk_lora *grads);
/* logits [T,V] = hidden [T,H] lm_head^T (device buffers; the full vocabulary). */
void bk_model_logits(const bk_model *m, const float *hidden, float *logits, int T);

/* Runs the base model (adapter off) on ids [P] at positions 0..P-1 and keeps each
 * layer's K and V.  acts must hold P tokens. */
bk_prefix *bk_model_prefix_build(const bk_model *m, bk_acts *acts, const int32_t *ids, int P);
void bk_prefix_free(const bk_model *m, bk_prefix *p);

#endif
