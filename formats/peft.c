/* peft.c - PEFT LoRA adapter directories (adapter_model.safetensors +
 * adapter_config.json): write them as PEFT 0.21 does, read them back strictly;
 * see peft.h. */
#include "peft.h"
#include "common/diag.h"
#include "common/files.h"
#include "formats/msgjson.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *const bk_peft_mod_names[BK_PEFT_NMOD] = {
	"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};
const char *const bk_peft_mod_parent[BK_PEFT_NMOD] = {
	"self_attn", "self_attn", "self_attn", "self_attn", "mlp", "mlp", "mlp",
};

int bk_peft_mod_parse(const char *name)
{
	for (int m = 0; m < BK_PEFT_NMOD; m++)
		if (!strcmp(name, bk_peft_mod_names[m]))
			return m;
	return -1;
}

/* a flag's bad value is a usage error, a file's bad input */
#define TARGETS_FAIL(flag, ...) ((flag) ? die_usage(__VA_ARGS__) : die(__VA_ARGS__))

unsigned bk_peft_targets_parse(const char *what, const char *text)
{
	if (!strcmp(text, "all-linear"))
		return BK_PEFT_ALL;
	int flag = what[0] == '-' && what[1] == '-';
	unsigned mask = 0;
	char *s = xstrdup(text), *save = NULL;
	for (char *tok = strtok_r(s, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
		int m = bk_peft_mod_parse(tok);
		if (m < 0)
			TARGETS_FAIL(flag,
				     "%s: target module '%s' is not supported (supported: q_proj "
				     "k_proj v_proj o_proj gate_proj up_proj down_proj, or all-linear)",
				     what, tok);
		mask |= 1u << m;
	}
	free(s);
	if (!mask)
		TARGETS_FAIL(flag, "%s: no target modules", what);
	return mask;
}

void bk_peft_dims(const bk_config *c, int m, int *in, int *out)
{
	int H = c->hidden_size, I = c->intermediate_size;
	int QD = c->n_heads * c->head_dim, KD = c->n_kv_heads * c->head_dim;
	switch (m) {
	case BK_PEFT_Q_PROJ: *in = H, *out = QD; return;
	case BK_PEFT_K_PROJ:
	case BK_PEFT_V_PROJ: *in = H, *out = KD; return;
	case BK_PEFT_O_PROJ: *in = QD, *out = H; return;
	case BK_PEFT_GATE_PROJ:
	case BK_PEFT_UP_PROJ: *in = H, *out = I; return;
	case BK_PEFT_DOWN_PROJ: *in = I, *out = H; return;
	}
	BUG("bad lora module %d", m);
}

static const char *const layout_stem[3] = {
	"base_model.model.model.layers.",
	"base_model.model.model.language_model.layers.",
	"base_model.model.language_model.model.layers.",
};

char *bk_peft_tensor_name_in(int layout, int layer, int m, char ab)
{
	if (layout < 0 || layout > 2)
		BUG("bad PEFT name layout %d", layout);
	return xasprintf("%s%d.%s.%s.lora_%c.weight", layout_stem[layout], layer,
			 bk_peft_mod_parent[m], bk_peft_mod_names[m], ab);
}

char *bk_peft_tensor_name(int layer, int m, char ab)
{
	return bk_peft_tensor_name_in(BK_PEFT_PLAIN, layer, m, ab);
}

/* target_modules of a VLM text tower's adapter: a pattern PEFT matches in full against
 * module names, so the vision tower's own q/k/v_proj stay without LoRA */
#define VLM_PATTERN_HEAD ".*language_model.*\\.("

static char *vlm_pattern(unsigned targets)
{
	size_t cap = 256, n = 0;
	char *s = xmalloc(cap);
	n += (size_t)snprintf(s, cap, "%s", VLM_PATTERN_HEAD);
	for (int m = 0; m < BK_PEFT_NMOD; m++)
		if (targets & (1u << m))
			n += (size_t)snprintf(s + n, cap - n, "%s%s", n > strlen(VLM_PATTERN_HEAD) ? "|" : "",
					      bk_peft_mod_names[m]);
	snprintf(s + n, cap - n, ")");
	return s;
}

bk_adapter *bk_adapter_new(const bk_config *c, int r, double alpha, double dropout,
			   unsigned targets, const char *base_model)
{
	if (r <= 0 || !targets || (targets & ~BK_PEFT_ALL))
		BUG("bk_adapter_new: r %d, targets %#x", r, targets);
	bk_adapter *l = xcalloc(1, sizeof *l);
	l->layout = c->multimodal ? BK_PEFT_VLM5 : BK_PEFT_PLAIN;
	l->n_layers = c->n_layers;
	l->r = r;
	l->alpha = alpha;
	l->dropout = dropout;
	l->targets = targets;
	l->base_model = base_model ? xstrdup(base_model) : NULL;
	size_t n = (size_t)c->n_layers * BK_PEFT_NMOD;
	l->a = xcalloc(n, sizeof *l->a);
	l->b = xcalloc(n, sizeof *l->b);
	for (int m = 0; m < BK_PEFT_NMOD; m++)
		bk_peft_dims(c, m, &l->in[m], &l->out[m]);
	for (int layer = 0; layer < c->n_layers; layer++)
		for (int m = 0; m < BK_PEFT_NMOD; m++) {
			if (!(targets & (1u << m)))
				continue;
			size_t k = (size_t)layer * BK_PEFT_NMOD + m;
			l->a[k] = xcalloc((size_t)r * l->in[m], sizeof(float));  /* (r, in) */
			l->b[k] = xcalloc((size_t)l->out[m] * r, sizeof(float)); /* (out, r) */
		}
	return l;
}

void bk_adapter_free(bk_adapter *l)
{
	if (!l)
		return;
	for (size_t k = 0; k < (size_t)l->n_layers * BK_PEFT_NMOD; k++) {
		free(l->a[k]);
		free(l->b[k]);
	}
	free(l->a);
	free(l->b);
	free(l->base_model);
	free(l);
}

/* ---- writing ---- */

static int is_integral(double x) { return x == floor(x) && fabs(x) < 1e15; }

static json_t *number_like_peft(double x)
{
	/* PEFT keeps what the user gave: 8 stays an integer, 0.05 a float */
	return is_integral(x) ? json_integer((json_int_t)x) : json_real(x);
}

/* x as the user wrote it where it passed through a float (bk-step keeps the dropout as
 * one): 0.05f is written 0.05, as PEFT writes the user's 0.05, not 0.05000000074505806 */
static double as_written(double x)
{
	float f = (float)x;
	if ((double)f != x || !isfinite(x))
		return x;
	char buf[32];
	for (int p = 1; p <= 9; p++) {
		snprintf(buf, sizeof buf, "%.*g", p, x);
		if ((float)strtod(buf, NULL) == f)
			break;
	}
	return strtod(buf, NULL);
}

/* fewest significant digits that read back as x (like Python's repr) */
static int shortest_digits(double x)
{
	char buf[64];
	for (int p = 1; p < 17; p++) {
		snprintf(buf, sizeof buf, "%.*g", p, x);
		if (strtod(buf, NULL) == x)
			return p;
	}
	return 17;
}

void bk_adapter_save(const bk_adapter *l, const char *dir)
{
	bk_mkdir_p(dir);
	bk_st_writer *w = bk_st_writer_new();
	bk_st_writer_meta(w, "format", "pt");
	for (int layer = 0; layer < l->n_layers; layer++)
		for (int m = 0; m < BK_PEFT_NMOD; m++) {
			if (!(l->targets & (1u << m)))
				continue;
			float *a = bk_adapter_a(l, layer, m), *b = bk_adapter_b(l, layer, m);
			if (!a || !b)
				BUG("layer %d %s: targeted but not allocated", layer,
				    bk_peft_mod_names[m]);
			int64_t sa[2] = {l->r, l->in[m]}, sb[2] = {l->out[m], l->r};
			char *na = bk_peft_tensor_name_in(l->layout, layer, m, 'A');
			char *nb = bk_peft_tensor_name_in(l->layout, layer, m, 'B');
			bk_st_writer_add(w, na, BK_DT_F32, 2, sa, a);
			bk_st_writer_add(w, nb, BK_DT_F32, 2, sb, b);
			free(na);
			free(nb);
		}
	char *st_path = bk_path_join(dir, "adapter_model.safetensors");
	bk_st_writer_write(w, st_path);
	bk_st_writer_free(w);
	free(st_path);

	/* the fields PEFT 0.21 writes for a plain LoRA, with its defaults */
	json_t *o = json_object();
	double dropout = as_written(l->dropout);
	json_t *targets;
	if (l->layout != BK_PEFT_PLAIN) {
		char *pat = vlm_pattern(l->targets);
		targets = json_string(pat);
		free(pat);
	} else {
		targets = json_array();
		for (int m = 0; m < BK_PEFT_NMOD; m++)
			if (l->targets & (1u << m))
				json_array_append_new(targets, json_string(bk_peft_mod_names[m]));
	}
	json_object_set_new(o, "alpha_pattern", json_object());
	json_object_set_new(o, "auto_mapping", json_null());
	json_object_set_new(o, "base_model_name_or_path",
			    l->base_model ? json_string(l->base_model) : json_null());
	json_object_set_new(o, "bias", json_string("none"));
	json_object_set_new(o, "exclude_modules", json_null());
	json_object_set_new(o, "fan_in_fan_out", json_false());
	json_object_set_new(o, "inference_mode", json_true());
	json_object_set_new(o, "init_lora_weights", json_true());
	json_object_set_new(o, "layer_replication", json_null());
	json_object_set_new(o, "layers_pattern", json_null());
	json_object_set_new(o, "layers_to_transform", json_null());
	json_object_set_new(o, "loftq_config", json_object());
	json_object_set_new(o, "lora_alpha", number_like_peft(l->alpha));
	json_object_set_new(o, "lora_bias", json_false());
	json_object_set_new(o, "lora_dropout", json_real(dropout));
	json_object_set_new(o, "megatron_config", json_null());
	json_object_set_new(o, "megatron_core", json_string("megatron.core"));
	json_object_set_new(o, "modules_to_save", json_null());
	json_object_set_new(o, "peft_type", json_string("LORA"));
	json_object_set_new(o, "r", json_integer(l->r));
	json_object_set_new(o, "rank_pattern", json_object());
	json_object_set_new(o, "revision", json_null());
	json_object_set_new(o, "target_modules", targets);
	json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
	json_object_set_new(o, "trainable_token_indices", json_null());
	json_object_set_new(o, "use_dora", json_false());
	json_object_set_new(o, "use_rslora", json_false());
	int prec = shortest_digits(dropout);
	if (!is_integral(l->alpha) && shortest_digits(l->alpha) > prec)
		prec = shortest_digits(l->alpha);
	char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(prec));
	if (!text)
		BUG("json_dumps failed");
	json_decref(o);
	char *cfg_path = bk_path_join(dir, "adapter_config.json");
	size_t n = strlen(text);
	text = xrealloc(text, n + 2);
	text[n++] = '\n';
	text[n] = 0;
	bk_write_file_atomic(cfg_path, text, n);
	free(text);
	free(cfg_path);
}

/* ---- reading ---- */

/* null, false, "", {} and [] all mean "not used" */
static int is_unset(json_t *v)
{
	return !v || json_is_null(v) || json_is_false(v) ||
	       (json_is_string(v) && !*json_string_value(v)) ||
	       (json_is_object(v) && !json_object_size(v)) ||
	       (json_is_array(v) && !json_array_size(v));
}

/* fields that change what the adapter computes, which plain LoRA here does not do */
static const struct {
	const char *key, *why;
} refused[] = {
	{"use_rslora", "rsLoRA scaling"},
	{"use_dora", "DoRA"},
	{"fan_in_fan_out", "transposed weights"},
	{"lora_bias", "LoRA biases"},
	{"use_qalora", "QALoRA"},
	{"rank_pattern", "per-module ranks"},
	{"alpha_pattern", "per-module alphas"},
	{"layers_to_transform", "layer subsets"},
	{"layers_pattern", "layer subsets"},
	{"modules_to_save", "fully trained extra modules"},
	{"layer_replication", "layer replication"},
	{"trainable_token_indices", "trainable tokens"},
	{"exclude_modules", "excluded modules"},
	{"target_parameters", "parameter targets"},
	{"alora_invocation_tokens", "activated LoRA"},
	{"use_bdlora", "block-diagonal LoRA"},
	{"megatron_config", "Megatron layers"},
};

typedef struct {
	int r;
	double alpha, dropout;
	unsigned targets;
	int vlm_pattern; /* target_modules was VLM_PATTERN_HEAD...: the language model only */
	char *base_model;
} adapter_cfg;

static adapter_cfg parse_adapter_config(const char *path, bk_bytes_check check, void *ctx)
{
	size_t len;
	char *text = bk_read_file(path, &len);
	if (check)
		check(path, text, len, ctx);
	json_error_t jerr;
	json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
	free(text);
	if (!o)
		die("%s: invalid JSON: %s", path, bk_json_error(&jerr));
	if (!json_is_object(o))
		die("%s: not a JSON object", path);
	adapter_cfg a = {0};
	json_t *v = json_object_get(o, "peft_type");
	if (!json_is_string(v) || strcmp(json_string_value(v), "LORA"))
		die("%s: key 'peft_type' is %s (only 'LORA' is supported)", path,
		    json_is_string(v) ? json_string_value(v) : "missing or not a string");
	v = json_object_get(o, "task_type");
	if (v && !json_is_null(v) &&
	    (!json_is_string(v) || strcmp(json_string_value(v), "CAUSAL_LM")))
		die("%s: key 'task_type' is %s (only 'CAUSAL_LM' is supported)", path,
		    json_is_string(v) ? json_string_value(v) : "not a string");
	v = json_object_get(o, "bias");
	if (v && !json_is_null(v) &&
	    (!json_is_string(v) || strcmp(json_string_value(v), "none")))
		die("%s: key 'bias' is %s (only 'none' is supported)", path,
		    json_is_string(v) ? json_string_value(v) : "not a string");
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
		if (!is_unset(json_object_get(o, refused[i].key)))
			die("%s: key '%s' is set (not supported: %s)", path, refused[i].key,
			    refused[i].why);

	v = json_object_get(o, "r");
	if (!json_is_integer(v) || json_integer_value(v) <= 0 ||
	    json_integer_value(v) > 1 << 20)
		die("%s: key 'r' is missing or not a positive integer", path);
	a.r = (int)json_integer_value(v);
	v = json_object_get(o, "lora_alpha"); /* PEFT's default is 8 */
	if (v && !json_is_number(v))
		die("%s: key 'lora_alpha' is not a number", path);
	a.alpha = v ? json_number_value(v) : 8.0;
	v = json_object_get(o, "lora_dropout");
	if (v && !json_is_null(v) && !json_is_number(v))
		die("%s: key 'lora_dropout' is not a number", path);
	a.dropout = json_is_number(v) ? json_number_value(v) : 0.0;
	if (!(a.dropout >= 0 && a.dropout < 1))
		die("%s: key 'lora_dropout' is not in [0, 1)", path);

	v = json_object_get(o, "target_modules");
	char *what = xasprintf("%s: key 'target_modules'", path);
	const char *pat = json_is_string(v) ? json_string_value(v) : NULL;
	size_t hl = strlen(VLM_PATTERN_HEAD), pl = pat ? strlen(pat) : 0;
	if (pat && pl > hl + 1 && !strncmp(pat, VLM_PATTERN_HEAD, hl) && pat[pl - 1] == ')') {
		/* our pattern for a VLM's text tower: the module names between the parentheses */
		char *names = xstrdup(pat + hl), *save = NULL;
		names[pl - hl - 1] = 0;
		for (char *t = strtok_r(names, "|", &save); t; t = strtok_r(NULL, "|", &save))
			a.targets |= bk_peft_targets_parse(what, t);
		free(names);
		a.vlm_pattern = 1;
	} else if (pat) {
		if (strcmp(pat, "all-linear"))
			die("%s is the pattern '%s' (only a list of module names, 'all-linear' or "
			    "'" VLM_PATTERN_HEAD "names)' is supported)",
			    what, pat);
		a.targets = BK_PEFT_ALL;
	} else if (json_is_array(v) && json_array_size(v)) {
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e) {
			if (!json_is_string(e))
				die("%s: entry %zu is not a string", what, i);
			a.targets |= bk_peft_targets_parse(what, json_string_value(e));
		}
	} else {
		die("%s is missing or not a non-empty list", what);
	}
	free(what);

	v = json_object_get(o, "base_model_name_or_path");
	if (v && !json_is_null(v) && !json_is_string(v))
		die("%s: key 'base_model_name_or_path' is not a string", path);
	a.base_model = json_is_string(v) ? xstrdup(json_string_value(v)) : NULL;
	json_decref(o);
	return a;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

bk_adapter *bk_adapter_load(const char *dir, const bk_config *c)
{
	return bk_adapter_load_checked(dir, c, NULL, NULL);
}

bk_adapter *bk_adapter_load_checked(const char *dir, const bk_config *c,
				    bk_bytes_check check, void *ctx)
{
	char *cfg_path = bk_path_join(dir, "adapter_config.json");
	adapter_cfg a = parse_adapter_config(cfg_path, check, ctx);
	free(cfg_path);
	if (a.vlm_pattern && !c->multimodal)
		die("%s/adapter_config.json: key 'target_modules' names the language model of a "
		    "vision-language checkpoint, but %s is %s",
		    dir, c->path, c->architecture);
	bk_adapter *l = bk_adapter_new(c, a.r, a.alpha, a.dropout, a.targets,
				 a.base_model);
	free(a.base_model);

	char *st_path = bk_path_join(dir, "adapter_model.safetensors");
	bk_st *st = bk_st_open_checked(st_path, check, ctx);
	if (c->multimodal) { /* transformers 4's module path when its first tensor is there */
		for (int m = 0; m < BK_PEFT_NMOD; m++)
			if (l->targets & (1u << m)) {
				char *n4 = bk_peft_tensor_name_in(BK_PEFT_VLM4, 0, m, 'A');
				if (bk_st_find(st, n4))
					l->layout = BK_PEFT_VLM4;
				free(n4);
				break;
			}
	}
	BK_VEC(char *) names = {0};
	for (int layer = 0; layer < l->n_layers; layer++)
		for (int m = 0; m < BK_PEFT_NMOD; m++) {
			if (!(l->targets & (1u << m)))
				continue;
			for (int ab = 0; ab < 2; ab++) {
				char *name = bk_peft_tensor_name_in(l->layout, layer, m, ab ? 'B' : 'A');
				if (!bk_st_find(st, name))
					die("%s: tensor '%s' is missing (target_modules lists "
					    "'%s')",
					    st_path, name, bk_peft_mod_names[m]);
				int64_t shape[2] = {ab ? l->out[m] : l->r, ab ? l->r : l->in[m]};
				bk_st_read_f32(st, name, 2, shape,
					       ab ? bk_adapter_b(l, layer, m) : bk_adapter_a(l, layer, m));
				bk_vec_push(&names, name);
			}
		}
	qsort(names.v, names.n, sizeof *names.v, cmp_str);
	for (size_t i = 0; i < bk_st_count(st); i++) {
		const char *name = bk_st_at(st, i)->name;
		if (!bsearch(&name, names.v, names.n, sizeof *names.v, cmp_str))
			die("%s: unexpected tensor '%s' (not a lora_A/lora_B of the target "
			    "modules of %s with %d layers)",
			    st_path, name, c->path, c->n_layers);
	}
	for (size_t i = 0; i < names.n; i++)
		free(names.v[i]);
	free(names.v);
	bk_st_close(st);
	free(st_path);
	return l;
}
