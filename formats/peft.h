/* peft.h - LoRA adapters in PEFT's on-disk form: adapter_model.safetensors (keys
 * base_model.model.model.layers.N.{self_attn,mlp}.M.lora_{A,B}.weight) and
 * adapter_config.json, for the Llama family's seven linear modules.  The text tower of a
 * Gemma3ForConditionalGeneration checkpoint: keys under the module path PEFT sees,
 * base_model.model.model.language_model.layers.N... (transformers 5; written and read),
 * or base_model.model.language_model.model.layers.N... (transformers 4; read), and
 * target_modules the pattern ".*language_model.*\.(q_proj|...)" so that PEFT leaves
 * the vision tower's q/k/v alone.
 * Not the LoRA math (gpu/model.h's bk_lora lives on the device); this is the file
 * format and its host-side fp32 arrays (bk_adapter). Plain LoRA only: rsLoRA, DoRA,
 * biases, per-module rank or alpha patterns, layer subsets and modules_to_save are
 * refused when read. */
#ifndef BK_PEFT_H
#define BK_PEFT_H

#include "common/files.h"
#include "formats/hfconfig.h"

typedef enum {
	BK_PEFT_Q_PROJ,
	BK_PEFT_K_PROJ,
	BK_PEFT_V_PROJ,
	BK_PEFT_O_PROJ,
	BK_PEFT_GATE_PROJ,
	BK_PEFT_UP_PROJ,
	BK_PEFT_DOWN_PROJ,
	BK_PEFT_NMOD
} bk_peft_mod;

/* Bit m of a target mask is module m; the order is PEFT's and the same as gpu/model.h's
 * enum bk_lora_module, so masks pass between the two unchanged. */
#define BK_PEFT_ALL ((1u << BK_PEFT_NMOD) - 1) /* "all-linear" */

extern const char *const bk_peft_mod_names[BK_PEFT_NMOD];  /* "q_proj" ... */
extern const char *const bk_peft_mod_parent[BK_PEFT_NMOD]; /* "self_attn" / "mlp" */
int bk_peft_mod_parse(const char *name); /* module index, or -1 */
/* "q_proj,v_proj", "q_proj v_proj" or "all-linear" -> bit mask; dies naming what,
 * the source of the text (a flag or file and key), on an unknown module: a usage
 * error (exit 2) when what is a flag ("--target-modules"), else a bad-input one. */
unsigned bk_peft_targets_parse(const char *what, const char *text);
/* in/out features of module m for this config: q (H -> NH*D), k/v (H -> NKV*D),
 * o (NH*D -> H), gate/up (H -> I), down (I -> H). */
void bk_peft_dims(const bk_config *c, int m, int *in, int *out);

/* where the layers are in PEFT's tensor names (bk_adapter.layout) */
enum {
	BK_PEFT_PLAIN, /* base_model.model.model.layers.N. (every *ForCausalLM) */
	BK_PEFT_VLM5,  /* base_model.model.model.language_model.layers.N. (transformers 5) */
	BK_PEFT_VLM4,  /* base_model.model.language_model.model.layers.N. (transformers 4) */
};

typedef struct {
	int n_layers;     /* L */
	int r;            /* rank */
	double alpha;     /* lora_alpha; scaling = alpha / r */
	double dropout;   /* lora_dropout (training only) */
	unsigned targets; /* bit m set: module m carries LoRA */
	char *base_model; /* base_model_name_or_path as given; NULL writes null */
	int layout;       /* tensor names: BK_PEFT_PLAIN, BK_PEFT_VLM5 or BK_PEFT_VLM4 */
	int in[BK_PEFT_NMOD], out[BK_PEFT_NMOD];
	/* [L * BK_PEFT_NMOD], index l * BK_PEFT_NMOD + m; NULL when m is not targeted.
	 * a: (r, in) row-major like lora_A.weight; b: (out, r) like lora_B.weight. */
	float **a, **b;
} bk_adapter;

static inline float *bk_adapter_a(const bk_adapter *l, int layer, int m)
{
	return l->a[layer * BK_PEFT_NMOD + m];
}
static inline float *bk_adapter_b(const bk_adapter *l, int layer, int m)
{
	return l->b[layer * BK_PEFT_NMOD + m];
}

/* Zero-filled adapter for config c (layout BK_PEFT_VLM5 for a vision-language
 * checkpoint's text tower); base_model may be NULL. */
bk_adapter *bk_adapter_new(const bk_config *c, int r, double alpha, double dropout,
			   unsigned targets, const char *base_model);
void bk_adapter_free(bk_adapter *l);

/* Write dir/adapter_model.safetensors (F32) and dir/adapter_config.json, each
 * atomically; creates dir. base_model_name_or_path is exactly l->base_model. */
void bk_adapter_save(const bk_adapter *l, const char *dir);
/* Read an adapter directory and check it against c: refuses unsupported settings
 * naming the field, and missing, extra or mis-shaped tensors naming the tensor.
 * Tensors may be F32, F16 or BF16; they are converted to fp32. */
bk_adapter *bk_adapter_load(const char *dir, const bk_config *c);
/* The same, each file's bytes seen by check() as read, before they are parsed
 * (adapter_config.json, then adapter_model.safetensors; check NULL: none). */
bk_adapter *bk_adapter_load_checked(const char *dir, const bk_config *c,
				    bk_bytes_check check, void *ctx);

/* PEFT's tensor name for (layer, module, 'A' or 'B') in a layout; malloc'd. */
char *bk_peft_tensor_name_in(int layout, int layer, int m, char ab);
/* the same for a plain model (BK_PEFT_PLAIN) */
char *bk_peft_tensor_name(int layer, int m, char ab);

#endif
