/* hfconfig.c - config.json of Llama/Mistral checkpoints, tensor checks, RoPE
 * frequencies; see hfconfig.h. Accepts both the transformers 4 layout (rope_theta,
 * rope_scaling) and the transformers 5 one (rope_parameters). */
#include "hfconfig.h"
#include "common/diag.h"
#include "common/files.h"

#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const struct {
	const char *arch, *model_type;
} supported[] = {
	{"LlamaForCausalLM", "llama"},
	{"MistralForCausalLM", "mistral"},
};

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

static void parse_rope(bk_config *c, json_t *root)
{
	const char *path = c->path;
	/* transformers 5 keeps theta and scaling in rope_parameters; 4 at top level */
	json_t *params = get(root, "rope_parameters");
	const char *key = "rope_parameters";
	if (params && !json_is_object(params))
		die("%s: key 'rope_parameters' is not an object", path);
	if (!params) {
		params = get(root, "rope_scaling");
		key = "rope_scaling";
		if (params && !json_is_object(params))
			die("%s: key 'rope_scaling' is not an object", path);
	}
	c->rope_theta = get_num(path, root, "rope_theta", 0, 10000.0);
	c->rope_type = BK_ROPE_DEFAULT;
	if (!params)
		goto check_theta;
	if (get(params, "rope_theta"))
		c->rope_theta = get_num(path, params, "rope_theta", 1, 0);
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
		goto check_theta;
	if (strcmp(type, "llama3"))
		die("%s: key '%s': rope type '%s' is not supported (supported: default, "
		    "llama3)",
		    path, key, type);
	c->rope_type = BK_ROPE_LLAMA3;
	c->rope_factor = get_num(path, params, "factor", 1, 0);
	c->rope_low_freq_factor = get_num(path, params, "low_freq_factor", 1, 0);
	c->rope_high_freq_factor = get_num(path, params, "high_freq_factor", 1, 0);
	c->rope_original_max_pos =
		get_pos_int(path, params, "original_max_position_embeddings", 1, 0);
	if (!(c->rope_factor > 0) || !(c->rope_low_freq_factor > 0) ||
	    !(c->rope_high_freq_factor > c->rope_low_freq_factor))
		die("%s: key '%s': llama3 needs factor > 0 and 0 < low_freq_factor < "
		    "high_freq_factor",
		    path, key);
check_theta:
	if (!(c->rope_theta > 1) || !isfinite(c->rope_theta))
		die("%s: key 'rope_theta' must be a finite number above 1", path);
}

bk_config *bk_config_parse(const char *name, const char *text, size_t len)
{
	json_error_t jerr;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	if (!root)
		die("%s: invalid JSON: %s (line %d)", name, jerr.text, jerr.line);
	if (!json_is_object(root))
		die("%s: not a JSON object", name);
	bk_config *c = xcalloc(1, sizeof *c);
	c->path = xstrdup(name);
	const char *path = c->path;

	json_t *archs = get(root, "architectures");
	if (!json_is_array(archs) || json_array_size(archs) != 1 ||
	    !json_is_string(json_array_get(archs, 0)))
		die("%s: key 'architectures' is not a list of one name", path);
	const char *arch = json_string_value(json_array_get(archs, 0));
	size_t k;
	for (k = 0; k < sizeof supported / sizeof supported[0]; k++)
		if (!strcmp(arch, supported[k].arch))
			break;
	if (k == sizeof supported / sizeof supported[0])
		die("%s: architecture '%s' is not supported (supported: LlamaForCausalLM, "
		    "MistralForCausalLM)",
		    path, arch);
	c->architecture = xstrdup(arch);
	json_t *mt = get(root, "model_type");
	if (!json_is_string(mt) || strcmp(json_string_value(mt), supported[k].model_type))
		die("%s: key 'model_type' is %s%s%s (expected '%s' for %s)", path,
		    json_is_string(mt) ? "'" : "",
		    json_is_string(mt) ? json_string_value(mt) : "missing or not a string",
		    json_is_string(mt) ? "'" : "", supported[k].model_type, arch);
	c->model_type = xstrdup(supported[k].model_type);

	if (get(root, "quantization_config"))
		die("%s: key 'quantization_config': quantized checkpoints are not supported",
		    path);
	json_t *act = get(root, "hidden_act");
	if (act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
		die("%s: key 'hidden_act' is %s (only 'silu' is supported)", path,
		    json_is_string(act) ? json_string_value(act) : "not a string");
	if (get_bool(path, root, "attention_bias", 0))
		die("%s: key 'attention_bias' is true (biases are not supported)", path);
	if (get_bool(path, root, "mlp_bias", 0))
		die("%s: key 'mlp_bias' is true (biases are not supported)", path);

	c->hidden_size = get_pos_int(path, root, "hidden_size", 1, 0);
	c->intermediate_size = get_pos_int(path, root, "intermediate_size", 1, 0);
	c->n_layers = get_pos_int(path, root, "num_hidden_layers", 1, 0);
	c->n_heads = get_pos_int(path, root, "num_attention_heads", 1, 0);
	c->n_kv_heads = get_pos_int(path, root, "num_key_value_heads", 0, c->n_heads);
	if (c->n_heads % c->n_kv_heads)
		die("%s: key 'num_key_value_heads' (%d) does not divide num_attention_heads "
		    "(%d)",
		    path, c->n_kv_heads, c->n_heads);
	if (!get(root, "head_dim") && c->hidden_size < c->n_heads)
		die("%s: key 'num_attention_heads' (%d) exceeds hidden_size (%d)", path,
		    c->n_heads, c->hidden_size);
	c->head_dim = get_pos_int(path, root, "head_dim", 0, c->hidden_size / c->n_heads);
	if (c->head_dim % 2)
		die("%s: key 'head_dim' is odd (%d); RoPE needs an even head size", path,
		    c->head_dim);
	c->vocab_size = get_pos_int(path, root, "vocab_size", 1, 0);
	c->max_pos = get_pos_int(path, root, "max_position_embeddings", 1, 0);
	double eps = get_num(path, root, "rms_norm_eps", 1, 0);
	if (!(eps > 0) || eps > 1)
		die("%s: key 'rms_norm_eps' must be in (0, 1] (got %g)", path, eps);
	c->rms_norm_eps = (float)eps;
	c->tie_word_embeddings = get_bool(path, root, "tie_word_embeddings", 0);

	c->bos_token_id = -1;
	json_t *bos = get(root, "bos_token_id");
	if (bos)
		c->bos_token_id = token_id(path, "bos_token_id", bos);
	json_t *eos = get(root, "eos_token_id");
	if (json_is_array(eos)) {
		if (json_array_size(eos) > BK_MAX_EOS)
			die("%s: key 'eos_token_id' has more than %d ids", path, BK_MAX_EOS);
		for (size_t i = 0; i < json_array_size(eos); i++)
			c->eos_token_ids[c->n_eos++] =
				token_id(path, "eos_token_id", json_array_get(eos, i));
	} else if (eos) {
		c->eos_token_ids[c->n_eos++] = token_id(path, "eos_token_id", eos);
	}

	/* Llama ignores sliding_window; Mistral records it (not applied, see header) */
	if (!strcmp(c->model_type, "mistral"))
		c->sliding_window = get_int(path, root, "sliding_window", 0, 0);
	if (c->sliding_window < 0)
		die("%s: key 'sliding_window' is negative", path);

	parse_rope(c, root);
	json_decref(root);
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
	free(c);
}

int bk_config_max_seq(const bk_config *c)
{
	if (c->sliding_window > 0 && c->sliding_window < c->max_pos)
		return c->sliding_window;
	return c->max_pos;
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

void bk_config_check_st(const bk_config *c, const bk_st *st)
{
	int64_t H = c->hidden_size, I = c->intermediate_size, V = c->vocab_size;
	int64_t QD = (int64_t)c->n_heads * c->head_dim, KD = (int64_t)c->n_kv_heads * c->head_dim;
	want_vec w = {0};
	want(&w, xstrdup("model.embed_tokens.weight"), 2, V, H);
	want(&w, xstrdup("model.norm.weight"), 1, H, 0);
	want(&w, xstrdup("lm_head.weight"), 2, V, H); /* optional when tied */
	for (int l = 0; l < c->n_layers; l++) {
		want(&w, xasprintf("model.layers.%d.self_attn.q_proj.weight", l), 2, QD, H);
		want(&w, xasprintf("model.layers.%d.self_attn.k_proj.weight", l), 2, KD, H);
		want(&w, xasprintf("model.layers.%d.self_attn.v_proj.weight", l), 2, KD, H);
		want(&w, xasprintf("model.layers.%d.self_attn.o_proj.weight", l), 2, H, QD);
		want(&w, xasprintf("model.layers.%d.mlp.gate_proj.weight", l), 2, I, H);
		want(&w, xasprintf("model.layers.%d.mlp.up_proj.weight", l), 2, I, H);
		want(&w, xasprintf("model.layers.%d.mlp.down_proj.weight", l), 2, H, I);
		want(&w, xasprintf("model.layers.%d.input_layernorm.weight", l), 1, H, 0);
		want(&w, xasprintf("model.layers.%d.post_attention_layernorm.weight", l), 1, H,
		     0);
	}
	for (size_t i = 0; i < w.n; i++) {
		const bk_st_tensor *t = bk_st_find(st, w.v[i].name);
		if (!t) {
			if (c->tie_word_embeddings && !strcmp(w.v[i].name, "lm_head.weight"))
				continue;
			char b[128];
			bk_shape_str(w.v[i].ndim, w.v[i].shape, b, sizeof b);
			die("%s: tensor '%s' is missing (%s needs it with shape %s)",
			    bk_st_path(st), w.v[i].name, c->path, b);
		}
		check_shape(c, st, t, &w.v[i]);
	}
	qsort(w.v, w.n, sizeof *w.v, cmp_want);
	for (size_t i = 0; i < bk_st_count(st); i++) {
		const bk_st_tensor *t = bk_st_at(st, i);
		want_t key = {t->name, 0, {0, 0}};
		if (bsearch(&key, w.v, w.n, sizeof *w.v, cmp_want))
			continue;
		if (ends_with(t->name, ".rotary_emb.inv_freq")) /* old non-persistent buffer */
			continue;
		die("%s: unexpected tensor '%s' (not part of %s with %d layers as %s "
		    "describes)",
		    bk_st_path(st), t->name, c->architecture, c->n_layers, c->path);
	}
	for (size_t i = 0; i < w.n; i++)
		free(w.v[i].name);
	free(w.v);
}

/* ---- RoPE ---- */

void bk_rope_inv_freq(const bk_config *c, float *out)
{
	/* transformers: inv = 1 / base ** (arange(0, dim, 2).float() / dim), fp32 */
	int dim = c->head_dim;
	float base = (float)c->rope_theta;
	for (int i = 0; i < dim / 2; i++)
		out[i] = 1.0f / powf(base, (float)(2 * i) / (float)dim);
	if (c->rope_type == BK_ROPE_DEFAULT)
		return;
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
