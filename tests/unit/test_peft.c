/* test_peft.c - PEFT adapter files: the adapter PEFT 0.21 saved
 * (tests/golden/peft/adapter-peft) read back with exactly the values PEFT held; our own
 * adapters written, re-read and compared; adapter_config.json fields; refusals of
 * unsupported settings and of missing, extra or mis-shaped tensors.
 * BK_PEFT_KEEP=DIR also writes our adapter to DIR for tests/ref/make_peft_fixture.py
 * --check DIR (PEFT loading it). */
#include "common/diag.h"
#include "common/files.h"
#include "formats/peft.h"
#include "tests/harness.h"

#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


#define GOLD "tests/golden/peft"

static char tmpdir[64];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)sb, (void)flag, (void)f;
	return remove(p);
}


static bk_config *cfg; /* tests/golden/peft/tiny-model */

/* ---- PEFT's own adapter ---- */

static void test_read_peft(void)
{
	bk_adapter *ad = bk_adapter_load(GOLD "/adapter-peft", cfg);
	CHECK(ad->r == 4 && ad->alpha == 8.0 && ad->dropout == 0.05 &&
		      ad->targets == BK_PEFT_ALL && ad->n_layers == 2,
	      "r %d alpha %g dropout %g targets %#x", ad->r, ad->alpha, ad->dropout,
	      ad->targets);
	CHECK(ad->base_model && !strcmp(ad->base_model, "tests/golden/peft/tiny-model"),
	      "base_model %s", ad->base_model ? ad->base_model : "(null)");
	CHECK(ad->in[BK_PEFT_Q_PROJ] == 32 && ad->out[BK_PEFT_K_PROJ] == 16 &&
		      ad->in[BK_PEFT_O_PROJ] == 32 && ad->out[BK_PEFT_UP_PROJ] == 48 &&
		      ad->in[BK_PEFT_DOWN_PROJ] == 48,
	      "dims");

	json_error_t err;
	json_t *g = json_load_file(GOLD "/lora-values.json", 0, &err);
	CHECK(g, "lora-values.json: %s", err.text);
	if (!g) {
		bk_adapter_free(ad);
		return;
	}
	json_t *tensors = json_object_get(g, "tensors");
	CHECK(json_object_size(tensors) == 28, "28 tensors in the dump");
	int compared = 0, bad = 0, nonzero_b = 0;
	for (int l = 0; l < ad->n_layers; l++)
		for (int m = 0; m < BK_PEFT_NMOD; m++)
			for (int ab = 0; ab < 2; ab++) {
				char *name = bk_peft_tensor_name(l, m, ab ? 'B' : 'A');
				json_t *t = json_object_get(tensors, name);
				CHECK(t, "%s not in the dump", name);
				json_t *shape = json_object_get(t, "shape");
				json_t *vals = json_object_get(t, "values");
				int64_t d0 = ab ? ad->out[m] : ad->r, d1 = ab ? ad->r : ad->in[m];
				CHECK(t && json_integer_value(json_array_get(shape, 0)) == d0 &&
					      json_integer_value(json_array_get(shape, 1)) == d1 &&
					      json_array_size(vals) == (size_t)(d0 * d1),
				      "%s shape", name);
				const float *got = ab ? bk_adapter_b(ad, l, m) : bk_adapter_a(ad, l, m);
				for (size_t i = 0; t && i < json_array_size(vals); i++) {
					float want =
						(float)json_number_value(json_array_get(vals, i));
					bad += got[i] != want;
					nonzero_b += ab && got[i] != 0;
				}
				compared++;
				free(name);
			}
	CHECK(compared == 28 && !bad, "%d tensors compared, %d values differ", compared, bad);
	CHECK(nonzero_b > 0, "B is not zero in the fixture");
	json_decref(g);
	bk_adapter_free(ad);
}

/* ---- our own adapters ---- */

static void fill(bk_adapter *ad, float seed)
{
	for (int l = 0; l < ad->n_layers; l++)
		for (int m = 0; m < BK_PEFT_NMOD; m++) {
			if (!(ad->targets & (1u << m)))
				continue;
			float *a = bk_adapter_a(ad, l, m), *b = bk_adapter_b(ad, l, m);
			for (int i = 0; i < ad->r * ad->in[m]; i++)
				a[i] = sinf(seed + (float)(i * 7 + l * 131 + m * 17)) * 0.3f;
			for (int i = 0; i < ad->out[m] * ad->r; i++)
				b[i] = cosf(seed * 3 + (float)(i * 5 + l * 19 + m * 3)) * 0.05f;
		}
}

static int same_adapter(const bk_adapter *x, const bk_adapter *y)
{
	if (x->r != y->r || x->alpha != y->alpha || (float)x->dropout != (float)y->dropout ||
	    x->targets != y->targets || x->n_layers != y->n_layers ||
	    !x->base_model != !y->base_model ||
	    (x->base_model && strcmp(x->base_model, y->base_model)))
		return 0;
	for (int l = 0; l < x->n_layers; l++)
		for (int m = 0; m < BK_PEFT_NMOD; m++) {
			if (!(x->targets & (1u << m))) {
				if (bk_adapter_a(y, l, m) || bk_adapter_b(y, l, m))
					return 0;
				continue;
			}
			if (memcmp(bk_adapter_a(x, l, m), bk_adapter_a(y, l, m),
				   sizeof(float) * (size_t)(x->r * x->in[m])) ||
			    memcmp(bk_adapter_b(x, l, m), bk_adapter_b(y, l, m),
				   sizeof(float) * (size_t)(x->out[m] * x->r)))
				return 0;
		}
	return 1;
}

static json_t *load_json(const char *dir, const char *name)
{
	char *p = bk_path_join(dir, name);
	json_t *j = json_load_file(p, 0, NULL);
	free(p);
	return j;
}

static void test_write(void)
{
	/* all seven modules, PEFT-like numbers */
	bk_adapter *ad = bk_adapter_new(cfg, 4, 8, 0.05, BK_PEFT_ALL, "tests/golden/peft/tiny-model");
	fill(ad, 0.5f);
	char *dir = bk_path_join(tmpdir, "ours");
	bk_adapter_save(ad, dir);
	const char *keep = getenv("BK_PEFT_KEEP");
	if (keep && *keep)
		bk_adapter_save(ad, keep);
	/* only the two files, no temporaries */
	DIR *d = opendir(dir);
	int files = 0, others = 0;
	for (struct dirent *e; d && (e = readdir(d));) {
		if (e->d_name[0] == '.')
			continue;
		if (!strcmp(e->d_name, "adapter_model.safetensors") ||
		    !strcmp(e->d_name, "adapter_config.json"))
			files++;
		else
			others++;
	}
	if (d)
		closedir(d);
	CHECK(files == 2 && !others, "%d adapter files, %d others", files, others);

	bk_adapter *back = bk_adapter_load(dir, cfg);
	CHECK(same_adapter(ad, back), "all-module adapter round trip");
	bk_adapter_free(back);

	/* adapter_config.json as PEFT writes it */
	json_t *j = load_json(dir, "adapter_config.json");
	json_t *peft = load_json(GOLD "/adapter-peft", "adapter_config.json");
	CHECK(j && peft, "configs parse");
	if (j && peft) {
		CHECK(!strcmp(json_string_value(json_object_get(j, "peft_type")), "LORA") &&
			      !strcmp(json_string_value(json_object_get(j, "task_type")),
				      "CAUSAL_LM") &&
			      !strcmp(json_string_value(json_object_get(j, "bias")), "none"),
		      "peft_type, task_type, bias");
		CHECK(json_is_integer(json_object_get(j, "r")) &&
			      json_integer_value(json_object_get(j, "r")) == 4 &&
			      json_is_integer(json_object_get(j, "lora_alpha")) &&
			      json_integer_value(json_object_get(j, "lora_alpha")) == 8 &&
			      json_is_real(json_object_get(j, "lora_dropout")) &&
			      json_real_value(json_object_get(j, "lora_dropout")) == 0.05,
		      "r, lora_alpha, lora_dropout");
		CHECK(json_is_false(json_object_get(j, "fan_in_fan_out")) &&
			      json_is_true(json_object_get(j, "inference_mode")) &&
			      json_is_false(json_object_get(j, "use_rslora")) &&
			      json_is_false(json_object_get(j, "use_dora")),
		      "flags");
		CHECK(!strcmp(json_string_value(json_object_get(j, "base_model_name_or_path")),
			      "tests/golden/peft/tiny-model"),
		      "base_model_name_or_path exactly as given");
		json_t *tm = json_object_get(j, "target_modules");
		CHECK(json_array_size(tm) == 7 &&
			      !strcmp(json_string_value(json_array_get(tm, 0)), "q_proj") &&
			      !strcmp(json_string_value(json_array_get(tm, 6)), "down_proj"),
		      "target_modules");
		/* every key we write is one PEFT writes, with the same value unless it
		 * describes this adapter */
		const char *key;
		json_t *v;
		json_object_foreach(j, key, v) {
			json_t *pv = json_object_get(peft, key);
			CHECK(pv, "key '%s' is not one PEFT writes", key);
			if (pv && strcmp(key, "target_modules"))
				CHECK(json_equal(v, pv), "key '%s' differs from PEFT's", key);
		}
	}
	json_decref(j);
	json_decref(peft);

	/* tensor file: F32, PEFT key names, format pt */
	char *stp = bk_path_join(dir, "adapter_model.safetensors");
	bk_st *st = bk_st_open(stp);
	CHECK(bk_st_count(st) == 28, "28 tensors");
	const bk_st_tensor *t =
		bk_st_find(st, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");
	CHECK(t && t->dtype == BK_DT_F32 && t->shape[0] == 32 && t->shape[1] == 4, "down B");
	t = bk_st_find(st, "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight");
	CHECK(t && t->shape[0] == 4 && t->shape[1] == 32, "k A");
	CHECK(bk_st_meta(st, "format") && !strcmp(bk_st_meta(st, "format"), "pt"), "format pt");
	bk_st_close(st);
	free(stp);
	bk_adapter_free(ad);

	/* a subset of modules, non-integral alpha, no base model name; overwrite in place;
	 * the dropout through a float, as bk-step keeps it: still written 0.1 */
	ad = bk_adapter_new(cfg, 2, 5.5, (double)0.1f, (1u << BK_PEFT_Q_PROJ) | (1u << BK_PEFT_DOWN_PROJ),
			    NULL);
	fill(ad, -1.25f);
	bk_adapter_save(ad, dir);
	back = bk_adapter_load(dir, cfg);
	CHECK(same_adapter(ad, back), "subset adapter round trip");
	CHECK(!bk_adapter_a(back, 0, BK_PEFT_K_PROJ) && bk_adapter_b(back, 1, BK_PEFT_DOWN_PROJ),
	      "untargeted modules are NULL");
	bk_adapter_free(back);
	j = load_json(dir, "adapter_config.json");
	CHECK(j && json_is_null(json_object_get(j, "base_model_name_or_path")) &&
		      json_real_value(json_object_get(j, "lora_alpha")) == 5.5 &&
		      json_array_size(json_object_get(j, "target_modules")) == 2,
	      "subset config");
	json_decref(j);
	char *cp = bk_path_join(dir, "adapter_config.json");
	char *text = bk_read_file(cp, NULL);
	free(cp);
	CHECK(strstr(text, "\"lora_dropout\": 0.1,") && strstr(text, "\"lora_alpha\": 5.5,"),
	      "short decimal numbers: %s", text);
	free(text);
	bk_adapter_free(ad);
	free(dir);

	/* target parsing */
	CHECK(bk_peft_targets_parse("t", "all-linear") == BK_PEFT_ALL, "all-linear");
	CHECK(bk_peft_targets_parse("t", "q_proj, v_proj") ==
		      ((1u << BK_PEFT_Q_PROJ) | (1u << BK_PEFT_V_PROJ)),
	      "q,v");
	CHECK(bk_peft_mod_parse("gate_proj") == BK_PEFT_GATE_PROJ && bk_peft_mod_parse("x") == -1,
	      "mod parse");
}

/* ---- refusals ---- */

struct bad {
	const char *dir;
	const bk_config *c;
};

static void load_it(void *arg)
{
	const struct bad *b = arg;
	bk_adapter_free(bk_adapter_load(b->dir, b->c));
}

static void targets_it(void *text) { bk_peft_targets_parse("--target-modules", text); }
static void file_targets_it(void *text)
{
	bk_peft_targets_parse("x/adapter_config.json: key 'target_modules'", text);
}

/* a copy of PEFT's adapter whose config has key set to the JSON value */
static char *with_config(const char *name, const char *key, const char *value)
{
	char *dir = bk_path_join(tmpdir, name);
	bk_mkdir_p(dir);
	char *src = bk_path_join(GOLD "/adapter-peft", "adapter_model.safetensors");
	char *dst = bk_path_join(dir, "adapter_model.safetensors");
	size_t len;
	char *data = bk_read_file(src, &len);
	bk_write_file_atomic(dst, data, len);
	free(data);
	json_t *j = load_json(GOLD "/adapter-peft", "adapter_config.json");
	if (key)
		json_object_set_new(j, key, json_loads(value, JSON_DECODE_ANY, NULL));
	char *cp = bk_path_join(dir, "adapter_config.json");
	json_dump_file(j, cp, JSON_INDENT(2));
	json_decref(j);
	free(cp);
	free(src);
	free(dst);
	return dir;
}

/* our adapter, then its tensor file rewritten: drop `drop`, reshape `reshape`, add `add` */
static char *with_tensors(const char *name, const char *drop, const char *reshape,
			  const char *add)
{
	char *dir = bk_path_join(tmpdir, name);
	bk_adapter *ad = bk_adapter_new(cfg, 4, 8, 0, BK_PEFT_ALL, NULL);
	fill(ad, 2);
	bk_adapter_save(ad, dir);
	bk_adapter_free(ad);
	char *p = bk_path_join(dir, "adapter_model.safetensors");
	bk_st *st = bk_st_open(p);
	bk_st_writer *w = bk_st_writer_new();
	static float zeros[4096];
	for (size_t i = 0; i < bk_st_count(st); i++) {
		const bk_st_tensor *t = bk_st_at(st, i);
		if (drop && !strcmp(t->name, drop))
			continue;
		if (reshape && !strcmp(t->name, reshape)) {
			int64_t s[2] = {t->shape[0] + 1, t->shape[1]};
			bk_st_writer_add(w, t->name, BK_DT_F32, 2, s, zeros);
			continue;
		}
		bk_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
	}
	if (add) {
		int64_t s[2] = {4, 32};
		bk_st_writer_add(w, add, BK_DT_F32, 2, s, zeros);
	}
	char *p2 = bk_path_join(dir, "new.safetensors");
	bk_st_writer_write(w, p2);
	bk_st_writer_free(w);
	bk_st_close(st);
	if (rename(p2, p))
		BUG("rename");
	free(p);
	free(p2);
	return dir;
}

static void test_refusals(void)
{
	static const struct {
		const char *name, *key, *value, *must;
	} cases[] = {
		{"rslora", "use_rslora", "true", "key 'use_rslora' is set"},
		{"dora", "use_dora", "true", "key 'use_dora' is set"},
		{"bias", "bias", "\"all\"", "key 'bias' is all"},
		{"rank_pattern", "rank_pattern", "{\"q_proj\": 8}", "key 'rank_pattern' is set"},
		{"alpha_pattern", "alpha_pattern", "{\"q_proj\": 8}", "key 'alpha_pattern'"},
		{"peft_type", "peft_type", "\"IA3\"", "key 'peft_type' is IA3"},
		{"task_type", "task_type", "\"SEQ_CLS\"", "key 'task_type'"},
		{"layers", "layers_to_transform", "[0]", "key 'layers_to_transform'"},
		{"modules_to_save", "modules_to_save", "[\"lm_head\"]", "key 'modules_to_save'"},
		{"fan_in_fan_out", "fan_in_fan_out", "true", "key 'fan_in_fan_out'"},
		{"regex targets", "target_modules", "\".*proj\"", "pattern '.*proj'"},
		{"lm_head target", "target_modules", "[\"q_proj\", \"lm_head\"]",
		 "target module 'lm_head' is not supported"},
		{"no r", "r", "null", "key 'r'"},
		{"r zero", "r", "0", "key 'r'"},
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
		struct bad b = {with_config(cases[k].name, cases[k].key, cases[k].value), cfg};
		bk_expect_die(cases[k].name, load_it, &b, "adapter_config.json", cases[k].must);
		free((char *)b.dir);
	}
	/* a config r that the tensors do not have */
	struct bad b = {with_config("r8", "r", "8"), cfg};
	bk_expect_die("r mismatch", load_it, &b, "lora_A.weight", "expected shape [8, 32], got [4, 32]");
	free((char *)b.dir);
	/* "all-linear" as a string is the seven modules */
	b.dir = with_config("all-linear", "target_modules", "\"all-linear\"");
	bk_adapter *ad = bk_adapter_load(b.dir, cfg);
	CHECK(ad->targets == BK_PEFT_ALL, "all-linear string");
	bk_adapter_free(ad);
	free((char *)b.dir);
	/* fewer targets than tensors: the others are extra */
	b.dir = with_config("fewer", "target_modules", "[\"q_proj\"]");
	bk_expect_die("extra tensors for targets", load_it, &b, "unexpected tensor",
		   "lora_A.weight");
	free((char *)b.dir);

	b.dir = with_tensors("missing", "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight",
			     NULL, NULL);
	bk_expect_die("missing tensor", load_it, &b,
		   "tensor 'base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight' is "
		   "missing",
		   "'v_proj'");
	free((char *)b.dir);
	b.dir = with_tensors("shape", NULL, "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight",
			     NULL);
	bk_expect_die("mis-shaped tensor", load_it, &b,
		   "'base_model.model.model.layers.0.mlp.up_proj.lora_B.weight'",
		   "expected shape [48, 4], got [49, 4]");
	free((char *)b.dir);
	b.dir = with_tensors("extra", NULL, NULL,
			     "base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight");
	bk_expect_die("extra tensor", load_it, &b,
		   "unexpected tensor 'base_model.model.model.layers.2.self_attn.q_proj.lora_A.weight'",
		   NULL);
	free((char *)b.dir);
	/* an adapter for another model */
	bk_config *stories = bk_config_load("models/stories260K");
	b.dir = GOLD "/adapter-peft";
	b.c = stories;
	bk_expect_die("other model", load_it, &b, "adapter_model.safetensors", "expected shape");
	bk_config_free(stories);
	b.dir = "tests/nope";
	b.c = cfg;
	bk_expect_die("missing dir", load_it, &b, "tests/nope/adapter_config.json", NULL);
	/* a flag's bad value is a usage error (exit 2), a file's bad input (exit 1) */
	bk_expect_exit("bad target flag", 2, targets_it, "q_proj,qkv_proj", "--target-modules",
		       "'qkv_proj'");
	bk_expect_die("bad target in a file", file_targets_it, "q_proj,qkv_proj",
		      "adapter_config.json: key 'target_modules'", "'qkv_proj'");
}

/* The text tower of a Gemma3ForConditionalGeneration checkpoint: tensors under PEFT's
 * module path of transformers 5 (base_model.model.model.language_model.layers.N...), as
 * PEFT 0.21 + transformers 5.24 save a LoRA of that model, and target_modules a pattern
 * that leaves the vision tower out; read back equal; transformers 4's names
 * (base_model.model.language_model.model.layers.N...) read too; the pattern refused on
 * a text-only model. */
static void test_vlm(void)
{
	static const char *vlm_json =
		"{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
		"\"gemma3\", \"text_config\": {\"model_type\": \"gemma3_text\", "
		"\"hidden_size\": 16, \"intermediate_size\": 24, \"num_hidden_layers\": 2, "
		"\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8, "
		"\"vocab_size\": 40}, \"vision_config\": {\"hidden_size\": 8}}";
	bk_config *vc = bk_config_parse("vlm/config.json", vlm_json, strlen(vlm_json));
	unsigned targets = (1u << BK_PEFT_Q_PROJ) | (1u << BK_PEFT_V_PROJ) | (1u << BK_PEFT_DOWN_PROJ);
	bk_adapter *ad = bk_adapter_new(vc, 2, 4, 0, targets, "vlm");
	CHECK(ad->layout == BK_PEFT_VLM5, "vlm adapter layout %d", ad->layout);
	fill(ad, 0.25f);
	char *dir = bk_path_join(tmpdir, "vlm");
	bk_adapter_save(ad, dir);
	char *stp = bk_path_join(dir, "adapter_model.safetensors");
	bk_st *st = bk_st_open(stp);
	CHECK(bk_st_count(st) == 12 &&
		      bk_st_find(st, "base_model.model.model.language_model.layers.1.mlp.down_proj"
				     ".lora_B.weight") &&
		      bk_st_find(st, "base_model.model.model.language_model.layers.0.self_attn."
				     "q_proj.lora_A.weight"),
	      "vlm adapter tensor names (%zu tensors)", bk_st_count(st));
	char *cp = bk_path_join(dir, "adapter_config.json");
	json_t *o = json_load_file(cp, 0, NULL);
	json_t *tm = json_object_get(o, "target_modules");
	CHECK(json_is_string(tm) &&
		      !strcmp(json_string_value(tm), ".*language_model.*\\.(q_proj|v_proj|down_proj)"),
	      "vlm target_modules %s", json_is_string(tm) ? json_string_value(tm) : "not a string");
	bk_adapter *back = bk_adapter_load(dir, vc);
	int same = back->targets == targets && back->layout == BK_PEFT_VLM5;
	for (int l = 0; l < 2; l++)
		for (int m = 0; m < BK_PEFT_NMOD; m++)
			if (targets & (1u << m))
				same &= !memcmp(bk_adapter_a(back, l, m), bk_adapter_a(ad, l, m),
						(size_t)ad->r * ad->in[m] * 4) &&
					!memcmp(bk_adapter_b(back, l, m), bk_adapter_b(ad, l, m),
						(size_t)ad->out[m] * ad->r * 4);
	CHECK(same, "vlm adapter read back differs");
	bk_adapter_free(back);
	/* the same tensors under transformers 4's module path */
	char *dir4 = bk_path_join(tmpdir, "vlm4");
	bk_mkdir_p(dir4);
	bk_st_writer *w = bk_st_writer_new();
	for (size_t i = 0; i < bk_st_count(st); i++) {
		const bk_st_tensor *t = bk_st_at(st, i);
		const char *rest = t->name + strlen("base_model.model.model.language_model.");
		char *n = xasprintf("base_model.model.language_model.model.%s", rest);
		bk_st_writer_add(w, n, t->dtype, t->ndim, t->shape, t->data);
		free(n);
	}
	char *st4 = bk_path_join(dir4, "adapter_model.safetensors");
	bk_st_writer_write(w, st4);
	bk_st_writer_free(w);
	char *cp4 = bk_path_join(dir4, "adapter_config.json");
	json_dump_file(o, cp4, 0);
	back = bk_adapter_load(dir4, vc);
	CHECK(back->layout == BK_PEFT_VLM4 &&
		      !memcmp(bk_adapter_b(back, 1, BK_PEFT_DOWN_PROJ),
			      bk_adapter_b(ad, 1, BK_PEFT_DOWN_PROJ),
			      (size_t)ad->out[BK_PEFT_DOWN_PROJ] * ad->r * 4),
	      "transformers-4 vlm adapter names");
	bk_adapter_free(back);
	/* the language-model pattern on a text-only model is refused */
	struct bad b = {dir, cfg};
	bk_expect_die("vlm pattern, text model", load_it, &b, "key 'target_modules' names the "
		      "language model", NULL);
	json_decref(o);
	bk_st_close(st);
	bk_adapter_free(ad);
	bk_config_free(vc);
	free(dir), free(stp), free(cp), free(dir4), free(st4), free(cp4);
}

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	if (getenv("BK_TEST_VERBOSE"))
		bk_verbose = 1;
	strcpy(tmpdir, "/tmp/bk-test-peft-XXXXXX");
	if (!mkdtemp(tmpdir))
		BUG("mkdtemp");
	cfg = bk_config_load(GOLD "/tiny-model");
	bk_st *st = bk_st_open(GOLD "/tiny-model");
	bk_config_check_st(cfg, st);
	bk_st_close(st);
	test_read_peft();
	test_write();
	test_refusals();
	test_vlm();
	bk_config_free(cfg);
	nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return bk_test_done("test_peft");
}
