/* hfconfig.c - config.json of Llama/Mistral checkpoints, tensor checks, RoPE
 * frequencies; see hfconfig.h. Accepts both the transformers 4 layout (rope_theta,
 * rope_scaling) and the transformers 5 one (rope_parameters). */
#include "hfconfig.h"
#include "common/diag.h"
#include "common/files.h"
#include "formats/msgjson.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const struct {
	const char *arch, *model_type;
	bk_family fam;
	int tied, head_dim; /* defaults of the config class (head_dim 0: H / NH) */
} supported[] = {
	{"LlamaForCausalLM", "llama", BK_FAM_LLAMA, 0, 0},
	{"MistralForCausalLM", "mistral", BK_FAM_LLAMA, 0, 0},
	{"MinistralForCausalLM", "ministral", BK_FAM_LLAMA, 0, 0},
	{"Qwen2ForCausalLM", "qwen2", BK_FAM_QWEN2, 0, 0},
	{"Qwen3ForCausalLM", "qwen3", BK_FAM_QWEN3, 0, 128},
	{"GemmaForCausalLM", "gemma", BK_FAM_GEMMA, 1, 256},
	{"Gemma2ForCausalLM", "gemma2", BK_FAM_GEMMA2, 1, 256},
	{"Gemma3ForCausalLM", "gemma3_text", BK_FAM_GEMMA3, 1, 256},
	{"Gemma3ForConditionalGeneration", "gemma3", BK_FAM_GEMMA3, 1, 256},
};
#define SUPPORTED_LIST                                                                   \
	"LlamaForCausalLM, MistralForCausalLM, MinistralForCausalLM, Qwen2ForCausalLM, " \
	"Qwen3ForCausalLM, "                                                             \
	"GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, "                       \
	"Gemma3ForConditionalGeneration"

/* absent and null are the same to HF */
static json_t *get(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_null(v) ? NULL : v;
}

static int get_int(const char *path, json_t *o, const char *key, int required, int dflt)
{
	json_t *v = get(o, key);
	if (!v) {
		if (required)
			die("%s: key '%s' is missing", path, key);
		return dflt;
	}
	if (!json_is_integer(v))
		die("%s: key '%s' is not an integer", path, key);
	json_int_t x = json_integer_value(v);
	if (x < INT_MIN || x > INT_MAX)
		die("%s: key '%s' is out of range (%lld)", path, key, (long long)x);
	return (int)x;
}

/* a positive count where HF takes any size: beyond INT_MAX means no limit to us
 * (max_position_embeddings of 10^12, as tokenizer_config.json's model_max_length has) */
static int get_pos_int_clamped(const char *path, json_t *o, const char *key, int required,
			       int dflt)
{
	json_t *v = get(o, key);
	if (v && json_is_integer(v) && json_integer_value(v) > INT_MAX)
		return INT_MAX;
	int x = get_int(path, o, key, required, dflt);
	if (x <= 0)
		die("%s: key '%s' must be positive (got %d)", path, key, x);
	return x;
}

static int get_pos_int(const char *path, json_t *o, const char *key, int required, int dflt)
{
	int x = get_int(path, o, key, required, dflt);
	if (x <= 0)
		die("%s: key '%s' must be positive (got %d)", path, key, x);
	return x;
}

static double get_num(const char *path, json_t *o, const char *key, int required,
		      double dflt)
{
	json_t *v = get(o, key);
	if (!v) {
		if (required)
			die("%s: key '%s' is missing", path, key);
		return dflt;
	}
	if (!json_is_number(v))
		die("%s: key '%s' is not a number", path, key);
	return json_number_value(v);
}

static int get_bool(const char *path, json_t *o, const char *key, int dflt)
{
	json_t *v = get(o, key);
	if (!v)
		return dflt;
	if (!json_is_boolean(v))
		die("%s: key '%s' is not a boolean", path, key);
	return json_is_true(v);
}

static int token_id(const char *path, const char *key, json_t *v)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0 ||
	    json_integer_value(v) > INT_MAX)
		die("%s: key '%s' is not a token id", path, key);
	return (int)json_integer_value(v);
}

/* YaRN's get_mscale (transformers' _compute_yarn_parameters), in double */
static double yarn_mscale(double scale, double mscale)
{
	if (scale <= 1)
		return 1.0;
	double a = 0.1 * mscale;
	a *= log(scale);
	return a + 1.0;
}

/* original_max_position_embeddings of llama3 / yarn: a top-level key wins (transformers'
 * standardize_rope_params, the Phi-3 exception), then the parameter set's own, then
 * max_position_embeddings */
static int rope_original_max(const bk_config *c, json_t *root, json_t *params, int required)
{
	const char *k = "original_max_position_embeddings";
	if (get(root, k))
		return get_pos_int(c->path, root, k, 1, 0);
	return get_pos_int(c->path, params, k, required, c->max_pos);
}

/* YaRN (transformers 5's _compute_yarn_parameters): the factor (null: max_position_
 * embeddings / original), the attention factor (given, or from mscale and mscale_all_dim,
 * or from the factor), beta_fast/beta_slow (absent, null or 0: 32 and 1), truncate */
static void parse_yarn(bk_config *c, json_t *root, json_t *params, const char *key)
{
	const char *path = c->path;
	c->rope_type = BK_ROPE_YARN;
	c->rope_original_max_pos = rope_original_max(c, root, params, 0);
	if (!json_object_get(params, "factor"))
		die("%s: key '%s': yarn needs a 'factor'", path, key);
	c->rope_factor = get_num(path, params, "factor", 0,
				 (double)c->max_pos / c->rope_original_max_pos);
	if (!(c->rope_factor >= 1) || !isfinite(c->rope_factor))
		die("%s: key '%s': yarn needs a finite factor >= 1 (got %g)", path, key,
		    c->rope_factor);
	double af;
	if (get(params, "attention_factor")) {
		af = get_num(path, params, "attention_factor", 1, 0);
		if (!(af > 0) || !isfinite(af))
			die("%s: key '%s': 'attention_factor' must be a finite number above 0", path,
			    key);
	} else {
		double ms = get_num(path, params, "mscale", 0, 0),
		       msa = get_num(path, params, "mscale_all_dim", 0, 0);
		af = ms != 0 && msa != 0 ? yarn_mscale(c->rope_factor, ms) /
						   yarn_mscale(c->rope_factor, msa)
					 : yarn_mscale(c->rope_factor, 1);
	}
	c->rope_attention_factor = af;
	double bf = get_num(path, params, "beta_fast", 0, 0),
	       bs = get_num(path, params, "beta_slow", 0, 0);
	c->rope_beta_fast = bf != 0 ? bf : 32;
	c->rope_beta_slow = bs != 0 ? bs : 1;
	c->rope_truncate = get_bool(path, params, "truncate", 1);
	if (!isfinite(c->rope_beta_fast) || !isfinite(c->rope_beta_slow) ||
	    !(c->rope_beta_fast > 0) || !(c->rope_beta_slow > 0))
		die("%s: key '%s': yarn's beta_fast and beta_slow must be finite and above 0",
		    path, key);
}

/* One RoPE parameter set (rope_scaling / rope_parameters or one of its per-layer-type
 * entries) named key: theta (if it holds one), type and scaling into c's full-layer
 * fields, or only the theta (local != 0: Gemma-3's sliding layers, default type). */
static void parse_rope_params(bk_config *c, json_t *root, json_t *params, const char *key,
			      int local)
{
	const char *path = c->path;
	if (!json_is_object(params))
		die("%s: key '%s' is not an object", path, key);
	double *theta = local ? &c->rope_local_theta : &c->rope_theta;
	if (get(params, "rope_theta"))
		*theta = get_num(path, params, "rope_theta", 1, 0);
	json_t *jt = get(params, "rope_type");
	if (!jt)
		jt = get(params, "type");
	if (jt && !json_is_string(jt))
		die("%s: key '%s': 'rope_type' is not a string", path, key);
	const char *type = jt ? json_string_value(jt) : "default";
	if (get(params, "partial_rotary_factor") &&
	    get_num(path, params, "partial_rotary_factor", 1, 1.0) != 1.0)
		die("%s: key '%s': 'partial_rotary_factor' other than 1 is not supported", path,
		    key);
	if (!strcmp(type, "default"))
		return;
	if (local)
		die("%s: key '%s': rope type '%s' on the sliding layers is not supported "
		    "(supported: default)",
		    path, key, type);
	if (!strcmp(type, "linear") || !strcmp(type, "dynamic")) {
		c->rope_type = type[0] == 'l' ? BK_ROPE_LINEAR : BK_ROPE_DYNAMIC;
		c->rope_factor = get_num(path, params, "factor", 1, 0);
		if (!(c->rope_factor >= 1) || !isfinite(c->rope_factor))
			die("%s: key '%s': %s rope needs a finite factor >= 1", path, key, type);
		return;
	}
	if (!strcmp(type, "yarn") && c->family != BK_FAM_GEMMA3) {
		parse_yarn(c, root, params, key);
		return;
	}
	if (strcmp(type, "llama3"))
		die("%s: key '%s': rope type '%s' is not supported (supported: default, "
		    "linear, dynamic, llama3%s)",
		    path, key, type, c->family == BK_FAM_GEMMA3 ? "" : ", yarn");
	c->rope_type = BK_ROPE_LLAMA3;
	c->rope_factor = get_num(path, params, "factor", 1, 0);
	c->rope_low_freq_factor = get_num(path, params, "low_freq_factor", 1, 0);
	c->rope_high_freq_factor = get_num(path, params, "high_freq_factor", 1, 0);
	c->rope_original_max_pos = rope_original_max(c, root, params, 1);
	if (!(c->rope_factor > 0) || !(c->rope_low_freq_factor > 0) ||
	    !(c->rope_high_freq_factor > c->rope_low_freq_factor))
		die("%s: key '%s': llama3 needs factor > 0 and 0 < low_freq_factor < "
		    "high_freq_factor",
		    path, key);
}

static void parse_rope(bk_config *c, json_t *root)
{
	const char *path = c->path;
	int g3 = c->family == BK_FAM_GEMMA3;
	c->rope_theta = get_num(path, root, "rope_theta", 0, g3 ? 1000000.0 : 10000.0);
	c->rope_type = BK_ROPE_DEFAULT;
	c->rope_attention_factor = 1;
	if (g3)
		c->rope_local_theta = get_num(path, root, "rope_local_base_freq", 0, 10000.0);
	/* transformers 4 reads it at the top level too (5 moves it into rope_parameters) */
	if (get(root, "partial_rotary_factor") &&
	    get_num(path, root, "partial_rotary_factor", 1, 1.0) != 1.0)
		die("%s: key 'partial_rotary_factor' other than 1 is not supported", path);
	/* transformers 5 keeps theta and scaling in rope_parameters (Gemma-3: one set per
	 * layer type); 4 at top level and in rope_scaling */
	json_t *params = get(root, "rope_parameters");
	if (params && json_is_object(params) && g3 && (get(params, "full_attention") ||
						      get(params, "sliding_attention"))) {
		json_t *f = get(params, "full_attention"), *sl = get(params, "sliding_attention");
		if (f)
			parse_rope_params(c, root, f, "rope_parameters.full_attention", 0);
		if (sl)
			parse_rope_params(c, root, sl, "rope_parameters.sliding_attention", 1);
	} else if (params) {
		parse_rope_params(c, root, params, "rope_parameters", 0);
	} else if ((params = get(root, "rope_scaling"))) {
		parse_rope_params(c, root, params, "rope_scaling", 0);
	}
	if (!(c->rope_theta > 1) || !isfinite(c->rope_theta))
		die("%s: key 'rope_theta' must be a finite number above 1", path);
	if (g3 && (!(c->rope_local_theta > 1) || !isfinite(c->rope_local_theta)))
		die("%s: key 'rope_local_base_freq' must be a finite number above 1", path);
}

/* layer_types (transformers >= 4.53) or the family's default pattern */
static void parse_layer_types(bk_config *c, json_t *root, int sliding_default_every)
{
	const char *path = c->path;
	int L = c->n_layers;
	c->layer_window = xcalloc((size_t)L, sizeof(int));
	json_t *lt = get(root, "layer_types");
	if (lt) {
		if (!json_is_array(lt) || json_array_size(lt) != (size_t)L)
			die("%s: key 'layer_types' is not a list of %d layer types", path, L);
		for (int l = 0; l < L; l++) {
			json_t *e = json_array_get(lt, (size_t)l);
			const char *t = json_is_string(e) ? json_string_value(e) : "";
			if (!strcmp(t, "sliding_attention"))
				c->layer_window[l] = c->sliding_window;
			else if (strcmp(t, "full_attention"))
				die("%s: key 'layer_types'[%d] is '%s' (supported: full_attention, "
				    "sliding_attention)",
				    path, l, t);
			if (c->layer_window[l] && c->sliding_window <= 0)
				die("%s: key 'layer_types'[%d] is sliding_attention but "
				    "'sliding_window' is not set",
				    path, l);
		}
		return;
	}
	for (int l = 0; l < L; l++)
		c->layer_window[l] = sliding_default_every > 0 && (l + 1) % sliding_default_every
					     ? c->sliding_window
					     : 0;
}

static void parse_family(bk_config *c, json_t *root)
{
	const char *path = c->path;
	bk_family f = c->family;
	int L = c->n_layers;
	c->sliding_window = 0;
	switch (f) {
	case BK_FAM_LLAMA:
		/* Mistral and Ministral: sliding_window (MistralConfig's and MinistralConfig's
		 * 4096 when the key is missing; null: none), on every layer, or Ministral's
		 * per layer_types; Llama ignores the key */
		if (!strcmp(c->model_type, "mistral") || !strcmp(c->model_type, "ministral"))
			c->sliding_window = json_is_null(json_object_get(root, "sliding_window"))
						    ? 0
						    : get_int(path, root, "sliding_window", 0, 4096);
		if (c->sliding_window < 0)
			die("%s: key 'sliding_window' is negative", path);
		if (!strcmp(c->model_type, "ministral") && get(root, "layer_types")) {
			parse_layer_types(c, root, 0);
			break;
		}
		c->layer_window = xcalloc((size_t)L, sizeof(int));
		for (int l = 0; l < L; l++)
			c->layer_window[l] = c->sliding_window;
		break;
	case BK_FAM_QWEN2:
	case BK_FAM_QWEN3: {
		c->qkv_bias = f == BK_FAM_QWEN2;
		c->qk_norm = f == BK_FAM_QWEN3;
		if (get_bool(path, root, "use_sliding_window", 0)) {
			c->sliding_window = get_pos_int(path, root, "sliding_window", 1, 0);
			int mwl = get_int(path, root, "max_window_layers", 0, L);
			if (get(root, "layer_types")) {
				parse_layer_types(c, root, 0);
			} else {
				c->layer_window = xcalloc((size_t)L, sizeof(int));
				for (int l = mwl < 0 ? 0 : mwl; l < L; l++)
					c->layer_window[l] = c->sliding_window;
			}
		} else {
			/* Qwen2.5 writes sliding_window but use_sliding_window false: ignored */
			c->layer_window = xcalloc((size_t)L, sizeof(int));
		}
		break;
	}
	case BK_FAM_GEMMA:
	case BK_FAM_GEMMA2:
	case BK_FAM_GEMMA3:
		c->norm_plus_one = c->geglu = c->embed_scaled = 1;
		c->sandwich = f != BK_FAM_GEMMA;
		c->qk_norm = f == BK_FAM_GEMMA3;
		if (f == BK_FAM_GEMMA) {
			c->layer_window = xcalloc((size_t)L, sizeof(int));
			break;
		}
		c->query_pre_attn_scalar = get_num(path, root, "query_pre_attn_scalar", 0, 256);
		if (!(c->query_pre_attn_scalar > 0) || !isfinite(c->query_pre_attn_scalar))
			die("%s: key 'query_pre_attn_scalar' must be a positive number", path);
		c->attn_softcap = get_num(path, root, "attn_logit_softcapping", 0,
					  f == BK_FAM_GEMMA2 && !json_object_get(root,
						"attn_logit_softcapping") ? 50.0 : 0.0);
		c->final_softcap = get_num(path, root, "final_logit_softcapping", 0,
					   f == BK_FAM_GEMMA2 && !json_object_get(root,
						"final_logit_softcapping") ? 30.0 : 0.0);
		if (c->attn_softcap < 0 || c->final_softcap < 0)
			die("%s: key '%s' (%g) is negative", path,
			    c->attn_softcap < 0 ? "attn_logit_softcapping" : "final_logit_softcapping",
			    c->attn_softcap < 0 ? c->attn_softcap : c->final_softcap);
		c->sliding_window = get_pos_int(path, root, "sliding_window", 0, 4096);
		if (get_bool(path, root, "use_bidirectional_attention", 0))
			die("%s: key 'use_bidirectional_attention' is true (only causal "
			    "attention is supported)",
			    path);
		if (f == BK_FAM_GEMMA2) {
			parse_layer_types(c, root, 2);
		} else {
			int pat = get_pos_int(path, root, "sliding_window_pattern", 0, 6);
			parse_layer_types(c, root, pat);
		}
		break;
	}
	/* activations */
	json_t *act = get(root, "hidden_activation");
	const char *akey = "hidden_activation";
	if (!act || c->family == BK_FAM_LLAMA || c->family == BK_FAM_QWEN2 ||
	    c->family == BK_FAM_QWEN3) {
		act = get(root, "hidden_act");
		akey = "hidden_act";
	}
	if (act && !json_is_string(act))
		die("%s: key '%s' is not a string", path, akey);
	const char *an = act ? json_string_value(act) : NULL;
	if (!c->geglu) {
		if (an && strcmp(an, "silu"))
			die("%s: key 'hidden_act' is %s (only 'silu' is supported for %s)", path, an,
			    c->architecture);
	} else if (an && strcmp(an, "gelu_pytorch_tanh") &&
		   !(f == BK_FAM_GEMMA && !strcmp(an, "gelu"))) {
		/* GemmaForCausalLM rewrites 'gelu' to the tanh form; Gemma-2/3 do not */
		die("%s: key '%s' is %s (only 'gelu_pytorch_tanh' is supported for %s)", path,
		    akey, an, c->architecture);
	}
	/* biases other than Qwen2's */
	if (get_bool(path, root, "attention_bias", 0))
		die("%s: key 'attention_bias' is true (biases are not supported for %s)", path,
		    c->architecture);
	if (get_bool(path, root, "mlp_bias", 0))
		die("%s: key 'mlp_bias' is true (biases are not supported)", path);
	if (f == BK_FAM_QWEN3 && get(root, "head_dim") == NULL && c->head_dim != 128)
		BUG("qwen3 head_dim default");
}

bk_config *bk_config_parse(const char *name, const char *text, size_t len)
{
	json_error_t jerr;
	json_t *top = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!top)
		die("%s: invalid JSON: %s", name, bk_json_error(&jerr));
	if (!json_is_object(top))
		die("%s: not a JSON object", name);
	bk_config *c = xcalloc(1, sizeof *c);
	c->path = xstrdup(name);
	const char *path = c->path;

	json_t *archs = get(top, "architectures");
	if (!json_is_array(archs) || json_array_size(archs) != 1 ||
	    !json_is_string(json_array_get(archs, 0)))
		die("%s: key 'architectures' is not a list of one name", path);
	const char *arch = json_string_value(json_array_get(archs, 0));
	size_t k;
	for (k = 0; k < sizeof supported / sizeof supported[0]; k++)
		if (!strcmp(arch, supported[k].arch))
			break;
	if (k == sizeof supported / sizeof supported[0])
		die("%s: architecture '%s' is not supported (supported: " SUPPORTED_LIST ")",
		    path, arch);
	c->architecture = xstrdup(arch);
	c->family = supported[k].fam;
	json_t *mt = get(top, "model_type");
	if (!json_is_string(mt) || strcmp(json_string_value(mt), supported[k].model_type))
		die("%s: key 'model_type' is %s%s%s (expected '%s' for %s)", path,
		    json_is_string(mt) ? "'" : "",
		    json_is_string(mt) ? json_string_value(mt) : "missing or not a string",
		    json_is_string(mt) ? "'" : "", supported[k].model_type, arch);
	if (get(top, "quantization_config"))
		die("%s: key 'quantization_config': quantized checkpoints are not supported (take "
		    "the unquantized model: load_in_4bit: true quantizes it at load as "
		    "bitsandbytes does)", path);
	/* the text model's keys: Gemma3ForConditionalGeneration nests them in text_config */
	json_t *root = top;
	if (!strcmp(arch, "Gemma3ForConditionalGeneration")) {
		root = get(top, "text_config");
		if (!json_is_object(root))
			die("%s: key 'text_config' is missing or not an object (needed for %s)", path,
			    arch);
		json_t *tmt = get(root, "model_type");
		if (tmt && (!json_is_string(tmt) || strcmp(json_string_value(tmt), "gemma3_text")))
			die("%s: key 'text_config.model_type' is not 'gemma3_text'", path);
		if (get(root, "quantization_config"))
			die("%s: key 'text_config.quantization_config': quantized checkpoints are "
			    "not supported",
			    path);
		c->multimodal = 1;
		c->model_type = xstrdup("gemma3_text");
	} else {
		c->model_type = xstrdup(supported[k].model_type);
	}

	/* Gemma-3: a key left out takes Gemma3TextConfig's default, as in transformers; the
	 * published multimodal configs (gemma-3-4b/12b/27b-it) leave out of text_config what
	 * equals it (vocab_size 262208, the heads of the 4B); other families need the shape */
	int g3 = c->family == BK_FAM_GEMMA3;
	c->hidden_size = get_pos_int(path, root, "hidden_size", !g3, 2304);
	c->intermediate_size = get_pos_int(path, root, "intermediate_size", !g3, 9216);
	c->n_layers = get_pos_int(path, root, "num_hidden_layers", !g3, 26);
	c->n_heads = get_pos_int(path, root, "num_attention_heads", !g3, 8);
	c->n_kv_heads = get_pos_int(path, root, "num_key_value_heads", 0, g3 ? 4 : c->n_heads);
	if (c->n_heads % c->n_kv_heads)
		die("%s: key 'num_key_value_heads' (%d) does not divide num_attention_heads "
		    "(%d)",
		    path, c->n_kv_heads, c->n_heads);
	int hd_default = supported[k].head_dim;
	if (!get(root, "head_dim") && !hd_default && c->hidden_size < c->n_heads)
		die("%s: key 'num_attention_heads' (%d) exceeds hidden_size (%d)", path,
		    c->n_heads, c->hidden_size);
	c->head_dim = get_pos_int(path, root, "head_dim", 0,
				  hd_default ? hd_default : c->hidden_size / c->n_heads);
	if (c->head_dim % 2)
		die("%s: key 'head_dim' is odd (%d); RoPE needs an even head size", path,
		    c->head_dim);
	c->vocab_size = get_pos_int(path, root, "vocab_size", !g3, 262208);
	/* a missing key: the default of transformers' config class (Qwen2Config and
	 * Qwen3Config 32768, Gemma3TextConfig 131072, GemmaConfig and Gemma2Config 8192) */
	int qwen = c->family == BK_FAM_QWEN2 || c->family == BK_FAM_QWEN3;
	c->max_pos = get_pos_int_clamped(path, root, "max_position_embeddings",
					 c->family == BK_FAM_LLAMA,
					 g3 ? 131072 : qwen ? 32768 : 8192);
	double eps = get_num(path, root, "rms_norm_eps", c->family == BK_FAM_LLAMA, 1e-6);
	if (!(eps > 0) || eps > 1)
		die("%s: key 'rms_norm_eps' must be in (0, 1] (got %g)", path, eps);
	c->rms_norm_eps = (float)eps;
	int tied = supported[k].tied;
	if (root != top)
		tied = get_bool(path, top, "tie_word_embeddings", tied);
	c->tie_word_embeddings = get_bool(path, root, "tie_word_embeddings", tied);

	c->bos_token_id = -1;
	json_t *bos = get(root, "bos_token_id");
	if (!bos && root != top)
		bos = get(top, "bos_token_id");
	if (bos)
		c->bos_token_id = token_id(path, "bos_token_id", bos);
	json_t *eos = get(root, "eos_token_id");
	if (!eos && root != top)
		eos = get(top, "eos_token_id");
	if (json_is_array(eos)) {
		if (json_array_size(eos) > BK_MAX_EOS)
			die("%s: key 'eos_token_id' has more than %d ids", path, BK_MAX_EOS);
		for (size_t i = 0; i < json_array_size(eos); i++)
			c->eos_token_ids[c->n_eos++] =
				token_id(path, "eos_token_id", json_array_get(eos, i));
	} else if (eos) {
		c->eos_token_ids[c->n_eos++] = token_id(path, "eos_token_id", eos);
	}

	parse_family(c, root);
	parse_rope(c, root);
	json_decref(top);
	return c;
}

bk_config *bk_config_load(const char *path)
{
	struct stat sb;
	char *file = (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
			     ? bk_path_join(path, "config.json")
			     : xstrdup(path);
	size_t len;
	char *text = bk_read_file(file, &len);
	bk_config *c = bk_config_parse(file, text, len);
	free(text);
	free(file);
	return c;
}

void bk_config_free(bk_config *c)
{
	if (!c)
		return;
	free(c->path);
	free(c->architecture);
	free(c->model_type);
	free(c->layer_window);
	free(c);
}

int bk_config_max_seq(const bk_config *c) { return c->max_pos; }

float bk_config_attn_scale(const bk_config *c)
{
	double d = c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : c->head_dim;
	double s = 1.0 / sqrt(d); /* Python: x ** -0.5 in double, used as fp32 */
	if (c->rope_attention_factor != 1) /* yarn: (a q).(a k) s = q.k (s a^2) */
		s *= c->rope_attention_factor * c->rope_attention_factor;
	return (float)s;
}

float bk_config_embed_scale(const bk_config *c, int dtype)
{
	if (!c->embed_scaled)
		return 1.0f;
	/* torch.tensor(hidden_size ** 0.5, dtype=hidden_states.dtype) */
	float s = (float)sqrt((double)c->hidden_size);
	if (dtype == BK_DT_BF16)
		return bk_bf16_to_f32(bk_f32_to_bf16(s));
	if (dtype == BK_DT_F16)
		return bk_f16_to_f32(bk_f32_to_f16(s));
	return s;
}

const char *bk_config_check_len(const bk_config *c, long n, const char *what, char *buf,
				size_t size)
{
	long max = bk_config_max_seq(c);
	if (max <= 0 || n <= max)
		return NULL;
	snprintf(buf, size, "%s of %ld tokens is longer than the model's context of %ld "
		 "positions", what, n, max);
	return buf;
}

/* ---- checkpoint check ---- */

typedef struct {
	char *name;
	int ndim;
	int64_t shape[2];
} want_t;
typedef BK_VEC(want_t) want_vec;

static void want(want_vec *w, char *name, int ndim, int64_t d0, int64_t d1)
{
	want_t x = {name, ndim, {d0, d1}};
	bk_vec_push(w, x);
}

static int cmp_want(const void *a, const void *b)
{
	return strcmp(((const want_t *)a)->name, ((const want_t *)b)->name);
}

static void check_shape(const bk_config *c, const bk_st *st, const bk_st_tensor *t,
			const want_t *w)
{
	int same = t->ndim == w->ndim;
	for (int i = 0; same && i < w->ndim; i++)
		same = t->shape[i] == w->shape[i];
	if (!same) {
		char a[128], b[128];
		bk_shape_str(t->ndim, t->shape, a, sizeof a);
		bk_shape_str(w->ndim, w->shape, b, sizeof b);
		die("%s: tensor '%s' has shape %s but %s needs %s", bk_st_path(st), w->name, a,
		    c->path, b);
	}
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

static int starts_with(const char *s, const char *prefix)
{
	return !strncmp(s, prefix, strlen(prefix));
}

const char *bk_config_prefix(const bk_config *c, const bk_st *st)
{
	if (!c->multimodal)
		return "model.";
	static const char *const cand[] = {"language_model.model.", "model.language_model."};
	for (size_t i = 0; i < 2; i++) {
		char *n = xasprintf("%sembed_tokens.weight", cand[i]);
		int found = bk_st_find(st, n) != NULL;
		free(n);
		if (found)
			return cand[i];
	}
	die("%s: no text-model embedding (language_model.model.embed_tokens.weight or "
	    "model.language_model.embed_tokens.weight) for %s",
	    bk_st_path(st), c->architecture);
}

const char *bk_config_lm_head(const bk_config *c, const bk_st *st)
{
	if (c->multimodal && !strcmp(bk_config_prefix(c, st), "language_model.model."))
		return "language_model.lm_head.weight";
	return "lm_head.weight";
}

/* a VLM's tensors that are not the text model's */
static int is_vision(const bk_config *c, const char *name)
{
	return c->multimodal &&
	       (starts_with(name, "vision_tower.") || starts_with(name, "multi_modal_projector.") ||
		starts_with(name, "model.vision_tower.") ||
		starts_with(name, "model.multi_modal_projector."));
}

void bk_config_check_st(const bk_config *c, const bk_st *st)
{
	int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size, D = c->head_dim;
	int64_t QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
	const char *pre = bk_config_prefix(c, st), *lm_head = bk_config_lm_head(c, st);
	want_vec w = {0};
	want(&w, xasprintf("%sembed_tokens.weight", pre), 2, V, H);
	want(&w, xasprintf("%snorm.weight", pre), 1, H, 0);
	want(&w, xstrdup(lm_head), 2, V, H); /* optional when tied */
	for (int l = 0; l < c->n_layers; l++) {
#define W(fmt, nd, d0, d1) want(&w, xasprintf("%slayers.%d." fmt, pre, l), nd, d0, d1)
		W("self_attn.q_proj.weight", 2, QD, H);
		W("self_attn.k_proj.weight", 2, KD, H);
		W("self_attn.v_proj.weight", 2, KD, H);
		W("self_attn.o_proj.weight", 2, H, QD);
		W("mlp.gate_proj.weight", 2, I, H);
		W("mlp.up_proj.weight", 2, I, H);
		W("mlp.down_proj.weight", 2, H, I);
		W("input_layernorm.weight", 1, H, 0);
		W("post_attention_layernorm.weight", 1, H, 0);
		if (c->qkv_bias) {
			W("self_attn.q_proj.bias", 1, QD, 0);
			W("self_attn.k_proj.bias", 1, KD, 0);
			W("self_attn.v_proj.bias", 1, KD, 0);
		}
		if (c->qk_norm) {
			W("self_attn.q_norm.weight", 1, D, 0);
			W("self_attn.k_norm.weight", 1, D, 0);
		}
		if (c->sandwich) {
			W("pre_feedforward_layernorm.weight", 1, H, 0);
			W("post_feedforward_layernorm.weight", 1, H, 0);
		}
#undef W
	}
	for (size_t i = 0; i < w.n; i++) {
		const bk_st_tensor *t = bk_st_find(st, w.v[i].name);
		if (!t) {
			if (c->tie_word_embeddings && !strcmp(w.v[i].name, lm_head))
				continue;
			char b[128];
			bk_shape_str(w.v[i].ndim, w.v[i].shape, b, sizeof b);
			die("%s: tensor '%s' is missing (%s needs it with shape %s)",
			    bk_st_path(st), w.v[i].name, c->path, b);
		}
		check_shape(c, st, t, &w.v[i]);
	}
	qsort(w.v, w.n, sizeof *w.v, cmp_want);
	size_t vision = 0;
	for (size_t i = 0; i < bk_st_count(st); i++) {
		const bk_st_tensor *t = bk_st_at(st, i);
		want_t key = {t->name, 0, {0, 0}};
		if (bsearch(&key, w.v, w.n, sizeof *w.v, cmp_want))
			continue;
		if (ends_with(t->name, ".rotary_emb.inv_freq")) /* old non-persistent buffer */
			continue;
		if (is_vision(c, t->name)) {
			vision++;
			continue;
		}
		die("%s: unexpected tensor '%s' (not part of %s with %d layers as %s "
		    "describes)",
		    bk_st_path(st), t->name, c->architecture, c->n_layers, c->path);
	}
	if (vision) {
		static int noted;
		if (!noted++)
			fprintf(stderr, "%s: note: %zu vision tensors ignored (the text tower of %s "
					"is used)\n",
				bk_st_path(st), vision, c->architecture);
	}
	for (size_t i = 0; i < w.n; i++)
		free(w.v[i].name);
	free(w.v);
}

/* ---- RoPE ---- */

static void inv_default(int dim, double theta, float *out)
{
	/* transformers: inv = 1 / base ** (arange(0, dim, 2).float() / dim), fp32 */
	float base = (float)theta;
	for (int i = 0; i < dim / 2; i++)
		out[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim);
}

/* _compute_yarn_parameters, op by op: the correction range in double (Python floats),
 * the frequencies in fp32 (torch tensors; a Python number meeting an fp32 tensor is
 * rounded to fp32 first) */
static void inv_yarn(const bk_config *c, float *out)
{
	int dim = c->head_dim;
	double base = c->rope_theta, omax = c->rope_original_max_pos;
	/* find_correction_dim: (dim * log(max / (rot * 2 * pi))) / (2 * log(base)) */
	double lo = (dim * log(omax / (c->rope_beta_fast * 2 * M_PI))) / (2 * log(base));
	double hi = (dim * log(omax / (c->rope_beta_slow * 2 * M_PI))) / (2 * log(base));
	if (c->rope_truncate)
		lo = floor(lo), hi = ceil(hi);
	lo = lo > 0 ? lo : 0;
	hi = hi < dim - 1 ? hi : dim - 1;
	if (lo == hi) /* linear_ramp_factor: a singularity avoided */
		hi += 0.001;
	float flo = (float)lo, span = (float)(hi - lo), factor = (float)c->rope_factor;
	for (int i = 0; i < dim / 2; i++) {
		float pos = powf((float)base, (float)(2 * i) / (float)dim);
		float extra = 1.0f / pos, inter = 1.0f / (factor * pos);
		float ramp = ((float)i - flo) / span;
		ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
		float ef = 1.0f - ramp;
		float a = inter * (1.0f - ef), b = extra * ef;
		out[i] = a + b;
	}
}

int bk_rope_inv_freq_local(const bk_config *c, float *out)
{
	if (!(c->rope_local_theta > 0))
		return 0;
	inv_default(c->head_dim, c->rope_local_theta, out);
	return 1;
}

void bk_rope_inv_freq(const bk_config *c, float *out)
{
	int dim = c->head_dim;
	inv_default(dim, c->rope_theta, out);
	if (c->rope_type == BK_ROPE_DEFAULT || c->rope_type == BK_ROPE_DYNAMIC)
		return;
	if (c->rope_type == BK_ROPE_YARN) {
		inv_yarn(c, out);
		return;
	}
	if (c->rope_type == BK_ROPE_LINEAR) { /* _compute_linear_scaling_rope_parameters */
		float factor = (float)c->rope_factor;
		for (int i = 0; i < dim / 2; i++)
			out[i] /= factor;
		return;
	}
	/* _compute_llama3_parameters, op by op in fp32. `x / tensor` is
	 * reciprocal(tensor) * x in torch, `tensor / x` a true division. */
	double old = c->rope_original_max_pos, lo = c->rope_low_freq_factor,
	       hi = c->rope_high_freq_factor;
	float factor = (float)c->rope_factor;
	float low_wavelen = (float)(old / lo), high_wavelen = (float)(old / hi);
	float two_pi = (float)(2.0 * M_PI);
	for (int i = 0; i < dim / 2; i++) {
		float inv = out[i];
		float wavelen = (1.0f / inv) * two_pi;
		float inv_l = wavelen > low_wavelen ? inv / factor : inv;
		float smooth = ((1.0f / wavelen) * (float)old - (float)lo) / (float)(hi - lo);
		float smoothed = ((1.0f - smooth) * inv_l) / factor + smooth * inv_l;
		int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
		out[i] = medium ? smoothed : inv_l;
	}
}
