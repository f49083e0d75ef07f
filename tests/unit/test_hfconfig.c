/* test_hfconfig.c - config.json parsing for the Llama family: the published configs in
 * tests/data/hf-configs (right numbers, or refused naming the architecture), refusals of
 * unsupported options, stories260K checked against its safetensors (missing, mis-shaped
 * and extra tensors refused by name), RoPE frequencies against transformers' values. */
#include "common/diag.h"
#include "common/files.h"
#include "formats/hfconfig.h"
#include "tests/harness.h"

#include <dirent.h>
#include <ftw.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>


#define STORIES "models/stories260K"

static char tmpdir[64];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
	(void)sb, (void)flag, (void)f;
	return remove(p);
}


/* ---- the published configs ---- */

static const struct {
	const char *dir, *arch;
	int L, H, I, NH, NKV, D, V, max_pos, tied, sliding, max_seq;
	double theta;
	float eps;
} good[] = {
	{"TinyLlama-1.1B-Chat-v1.0", "LlamaForCausalLM", 22, 2048, 5632, 32, 4, 64, 32000,
	 2048, 0, 0, 2048, 10000.0, 1e-5f},
	{"Llama-2-7b-chat-hf", "LlamaForCausalLM", 32, 4096, 11008, 32, 32, 128, 32000, 4096,
	 0, 0, 4096, 10000.0, 1e-5f},
	{"Mistral-7B-Instruct-v0.1", "MistralForCausalLM", 32, 4096, 14336, 32, 8, 128, 32000,
	 32768, 0, 4096, 4096, 10000.0, 1e-5f},
	{"Mistral-7B-Instruct-v0.2", "MistralForCausalLM", 32, 4096, 14336, 32, 8, 128, 32000,
	 32768, 0, 0, 32768, 1000000.0, 1e-5f},
	{"SmolLM2-135M-Instruct", "LlamaForCausalLM", 30, 576, 1536, 9, 3, 64, 49152, 8192, 1,
	 0, 8192, 100000.0, 1e-5f},
};

static const struct {
	const char *dir, *arch;
} refused_arch[] = {
	{"Qwen2.5-0.5B-Instruct", "Qwen2ForCausalLM"},
	{"Qwen3-0.6B", "Qwen3ForCausalLM"},
	{"gemma-2b-it", "GemmaForCausalLM"},
};

static void load_it(void *path) { bk_config_free(bk_config_load(path)); }

static void test_published(void)
{
	DIR *d = opendir("tests/data/hf-configs");
	CHECK(d, "tests/data/hf-configs");
	if (!d)
		return;
	int seen_good = 0, seen_bad = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char *path = xasprintf("tests/data/hf-configs/%s/config.json", e->d_name);
		int known = 0;
		for (size_t k = 0; k < sizeof good / sizeof good[0]; k++) {
			if (strcmp(good[k].dir, e->d_name))
				continue;
			known = 1;
			seen_good++;
			bk_config *c = bk_config_load(path);
			CHECK(!strcmp(c->architecture, good[k].arch), "%s arch", path);
			CHECK(c->n_layers == good[k].L && c->hidden_size == good[k].H &&
				      c->intermediate_size == good[k].I &&
				      c->n_heads == good[k].NH && c->n_kv_heads == good[k].NKV &&
				      c->head_dim == good[k].D && c->vocab_size == good[k].V,
			      "%s: L %d H %d I %d NH %d NKV %d D %d V %d", path, c->n_layers,
			      c->hidden_size, c->intermediate_size, c->n_heads, c->n_kv_heads,
			      c->head_dim, c->vocab_size);
			CHECK(c->max_pos == good[k].max_pos && c->tie_word_embeddings == good[k].tied &&
				      c->sliding_window == good[k].sliding &&
				      bk_config_max_seq(c) == good[k].max_seq,
			      "%s: max_pos %d tied %d sliding %d max_seq %d", path, c->max_pos,
			      c->tie_word_embeddings, c->sliding_window, bk_config_max_seq(c));
			CHECK(c->rope_theta == good[k].theta && c->rms_norm_eps == good[k].eps &&
				      c->rope_type == BK_ROPE_DEFAULT,
			      "%s: theta %g eps %g", path, c->rope_theta, c->rms_norm_eps);
			CHECK(c->bos_token_id == 1 && c->n_eos == 1 && c->eos_token_ids[0] == 2,
			      "%s: bos %d eos %d", path, c->bos_token_id, c->eos_token_ids[0]);
			bk_config_free(c);
		}
		for (size_t k = 0; k < sizeof refused_arch / sizeof refused_arch[0]; k++) {
			if (strcmp(refused_arch[k].dir, e->d_name))
				continue;
			known = 1;
			seen_bad++;
			char *want = xasprintf("architecture '%s' is not supported (supported: "
					       "LlamaForCausalLM, MistralForCausalLM)",
					       refused_arch[k].arch);
			bk_expect_die(path, load_it, path, path, want);
			free(want);
		}
		CHECK(known, "%s: not in this test's tables; add it", path);
		free(path);
	}
	closedir(d);
	CHECK(seen_good == 5 && seen_bad == 3, "saw %d good, %d refused configs", seen_good,
	      seen_bad);

	/* a model directory works as well as the file */
	bk_config *c = bk_config_load("tests/data/hf-configs/TinyLlama-1.1B-Chat-v1.0");
	CHECK(c->n_layers == 22 && strstr(c->path, "TinyLlama-1.1B-Chat-v1.0/config.json"),
	      "dir path %s", c->path);
	bk_config_free(c);

	c = bk_config_load("tests/data/ckpt/llama3.2-1b-rope");
	CHECK(c->rope_type == BK_ROPE_LLAMA3 && c->rope_factor == 32.0 &&
		      c->rope_low_freq_factor == 1.0 && c->rope_high_freq_factor == 4.0 &&
		      c->rope_original_max_pos == 8192 && c->rope_theta == 500000.0,
	      "llama3.2 rope");
	CHECK(c->n_eos == 3 && c->eos_token_ids[0] == 128001 && c->eos_token_ids[2] == 128009 &&
		      c->bos_token_id == 128000 && c->tie_word_embeddings && c->head_dim == 64,
	      "llama3.2 ids");
	bk_config_free(c);
	c = bk_config_load("tests/data/ckpt/llama3.1-8b-rope-tf5/config.json");
	CHECK(c->rope_type == BK_ROPE_LLAMA3 && c->rope_factor == 8.0 &&
		      c->rope_theta == 500000.0 && c->head_dim == 128 && c->n_eos == 1 &&
		      c->eos_token_ids[0] == 128009 && !c->tie_word_embeddings,
	      "llama3.1 transformers-5 layout");
	bk_config_free(c);
	c = bk_config_load("tests/golden/peft/tiny-model");
	CHECK(c->rope_type == BK_ROPE_DEFAULT && c->rope_theta == 10000.0 && c->head_dim == 8 &&
		      c->n_kv_heads == 2,
	      "transformers-5 default rope_parameters");
	bk_config_free(c);
}

/* ---- refusals and defaults from inline JSON ---- */

#define BASE                                                                            \
	"\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "       \
	"\"num_attention_heads\": 4, \"vocab_size\": 100, \"max_position_embeddings\": 256, " \
	"\"rms_norm_eps\": 1e-6"
#define LLAMA "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", " BASE

static void parse_it(void *text)
{
	bk_config_free(bk_config_parse("x/config.json", text, strlen(text)));
}

static void test_refusals(void)
{
	static const struct {
		const char *what, *json, *must;
	} cases[] = {
		{"gpt2", "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\"}",
		 "architecture 'GPT2LMHeadModel' is not supported (supported: LlamaForCausalLM, "
		 "MistralForCausalLM)"},
		{"no architectures", "{\"model_type\": \"llama\", " BASE "}", "'architectures'"},
		{"model_type", "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": "
			       "\"mistral\", " BASE "}",
		 "'model_type'"},
		{"gelu", LLAMA ", \"hidden_act\": \"gelu\"}", "'hidden_act' is gelu"},
		{"attention_bias", LLAMA ", \"attention_bias\": true}", "'attention_bias'"},
		{"mlp_bias", LLAMA ", \"mlp_bias\": true}", "'mlp_bias'"},
		{"yarn", LLAMA ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}}",
		 "key 'rope_scaling': rope type 'yarn' is not supported"},
		{"linear", LLAMA ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2}}",
		 "rope type 'linear'"},
		{"dynamic tf5",
		 LLAMA ", \"rope_parameters\": {\"rope_type\": \"dynamic\", \"rope_theta\": 1e4}}",
		 "key 'rope_parameters': rope type 'dynamic'"},
		{"llama3 incomplete",
		 LLAMA ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}",
		 "'low_freq_factor' is missing"},
		{"partial rotary",
		 LLAMA ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e4, "
		       "\"partial_rotary_factor\": 0.5}}",
		 "'partial_rotary_factor'"},
		{"quantized", LLAMA ", \"quantization_config\": {\"bits\": 4}}",
		 "'quantization_config'"},
		{"gqa", LLAMA ", \"num_key_value_heads\": 3}", "'num_key_value_heads'"},
		{"odd head_dim", LLAMA ", \"head_dim\": 15}", "'head_dim'"},
		{"zero layers", "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": "
				"\"llama\", \"hidden_size\": 64, \"intermediate_size\": 128, "
				"\"num_hidden_layers\": 0}",
		 "'num_hidden_layers' must be positive"},
		{"missing hidden", "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": "
				   "\"llama\"}",
		 "'hidden_size' is missing"},
		{"string size", "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": "
				"\"llama\", \"hidden_size\": \"64\"}",
		 "key 'hidden_size' is not an integer"},
		{"eos list", LLAMA ", \"eos_token_id\": [1,2,3,4,5,6,7,8,9]}", "'eos_token_id'"},
		{"eos negative", LLAMA ", \"eos_token_id\": -1}", "'eos_token_id'"},
		{"bad json", "{\"architectures\": [", "invalid JSON"},
	};
	for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
		bk_expect_die(cases[k].what, parse_it, (void *)cases[k].json, "x/config.json",
			   cases[k].must);
	bk_expect_die("missing file", load_it, "tests/nope", "tests/nope", NULL);

	/* defaults: kv heads = heads, head_dim = H / NH, theta 10000, untied, no bos/eos */
	const char *text = LLAMA "}";
	bk_config *c = bk_config_parse("x/config.json", text, strlen(text));
	CHECK(c->n_kv_heads == 4 && c->head_dim == 16 && c->rope_theta == 10000.0 &&
		      !c->tie_word_embeddings && c->bos_token_id == -1 && c->n_eos == 0 &&
		      c->rope_type == BK_ROPE_DEFAULT && c->sliding_window == 0,
	      "defaults");
	bk_config_free(c);
	text = LLAMA ", \"rope_scaling\": null, \"bos_token_id\": null, \"eos_token_id\": [7, "
		     "9], \"head_dim\": 32, \"sliding_window\": 16}";
	c = bk_config_parse("x/config.json", text, strlen(text));
	CHECK(c->head_dim == 32 && c->bos_token_id == -1 && c->n_eos == 2 &&
		      c->eos_token_ids[1] == 9 && c->sliding_window == 0 &&
		      bk_config_max_seq(c) == 256,
	      "nulls, explicit head_dim, llama ignores sliding_window");
	bk_config_free(c);
	text = "{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\", " BASE
	       ", \"sliding_window\": 4096}";
	c = bk_config_parse("x/config.json", text, strlen(text));
	CHECK(c->sliding_window == 4096 && bk_config_max_seq(c) == 256,
	      "window above max_pos does not limit");
	bk_config_free(c);
}

/* ---- checkpoint against config ---- */

struct ck {
	const char *model;
	const char *config;
};

static void check_it(void *arg)
{
	const struct ck *k = arg;
	bk_config *c = bk_config_load(k->config);
	bk_st *st = bk_st_open(k->model);
	bk_config_check_st(c, st);
	bk_st_close(st);
	bk_config_free(c);
}

/* copy stories260K, dropping `drop`, reshaping `reshape` to (d0, d1), adding `add` */
static char *variant(const char *name, const char *drop, const char *reshape, int64_t d0,
		     int64_t d1, const char *add)
{
	bk_st *st = bk_st_open(STORIES);
	bk_st_writer *w = bk_st_writer_new();
	float *zeros = xcalloc((size_t)(d0 * d1 + 64 * 512), sizeof(float));
	for (size_t i = 0; i < bk_st_count(st); i++) {
		const bk_st_tensor *t = bk_st_at(st, i);
		if (drop && !strcmp(t->name, drop))
			continue;
		if (reshape && !strcmp(t->name, reshape)) {
			int64_t s[2] = {d0, d1};
			bk_st_writer_add(w, t->name, BK_DT_F32, 2, s, zeros);
			continue;
		}
		bk_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
	}
	if (add) {
		int64_t s[2] = {512, 64};
		bk_st_writer_add(w, add, BK_DT_F32, 2, s, zeros);
	}
	char *path = xasprintf("%s/%s.safetensors", tmpdir, name);
	bk_st_writer_write(w, path);
	bk_st_writer_free(w);
	bk_st_close(st);
	free(zeros);
	return path;
}

static void test_check_st(void)
{
	bk_config *c = bk_config_load(STORIES);
	CHECK(c->n_layers == 5 && c->hidden_size == 64 && c->intermediate_size == 172 &&
		      c->n_heads == 8 && c->n_kv_heads == 4 && c->head_dim == 8 &&
		      c->vocab_size == 512 && c->tie_word_embeddings,
	      "stories260K config");
	bk_st *st = bk_st_open(STORIES);
	bk_config_check_st(c, st); /* dies (test fails) if anything is off */
	bk_st_close(st);
	bk_config_free(c);
	c = bk_config_load("tests/golden/peft/tiny-model");
	st = bk_st_open("tests/golden/peft/tiny-model");
	bk_config_check_st(c, st); /* untied: lm_head.weight present */
	bk_st_close(st);
	bk_config_free(c);

	struct ck k = {NULL, STORIES "/config.json"};
	char *p = variant("missing", "model.layers.3.mlp.up_proj.weight", NULL, 0, 0, NULL);
	k.model = p;
	bk_expect_die("missing tensor", check_it, &k,
		   "tensor 'model.layers.3.mlp.up_proj.weight' is missing", "[172, 64]");
	free(p);
	p = variant("shape", NULL, "model.layers.1.self_attn.k_proj.weight", 64, 64, NULL);
	k.model = p;
	bk_expect_die("wrong shape", check_it, &k,
		   "tensor 'model.layers.1.self_attn.k_proj.weight' has shape [64, 64]",
		   "needs [32, 64]");
	free(p);
	p = variant("extra", NULL, NULL, 0, 0, "model.layers.5.self_attn.q_proj.weight");
	k.model = p;
	bk_expect_die("extra tensor", check_it, &k,
		   "unexpected tensor 'model.layers.5.self_attn.q_proj.weight'", NULL);
	free(p);
	/* tied config with an lm_head.weight of the right shape: allowed, and checked */
	p = variant("tied-head", NULL, NULL, 0, 0, "lm_head.weight");
	k.model = p;
	check_it(&k);
	free(p);
	/* an untied config needs lm_head.weight */
	k.model = STORIES;
	k.config = "tests/golden/peft/tiny-model";
	bk_expect_die("wrong model", check_it, &k, STORIES, "model.embed_tokens.weight");
}

/* ---- RoPE ---- */

static void test_rope(void)
{
	json_error_t err;
	json_t *g = json_load_file("tests/golden/rope/inv_freq.json", 0, &err);
	CHECK(g, "golden: %s", err.text);
	if (!g)
		return;
	CHECK(json_integer_value(json_object_get(g, "version")) == 1, "golden version");
	json_t *cases = json_object_get(g, "cases");
	size_t i;
	json_t *cs;
	int n_llama3 = 0, n_medium = 0, total_inexact = 0, total = 0;
	json_array_foreach(cases, i, cs) {
		const char *path = json_string_value(json_object_get(cs, "config"));
		json_t *vals = json_object_get(cs, "inv_freq");
		bk_config *c = bk_config_load(path);
		size_t n = (size_t)c->head_dim / 2;
		CHECK(json_array_size(vals) == n, "%s: %zu values for head_dim %d", path,
		      json_array_size(vals), c->head_dim);
		float *out = xmalloc(n * sizeof(float));
		bk_rope_inv_freq(c, out);
		int inexact = 0, max_ulp = 0;
		for (size_t j = 0; j < n && j < json_array_size(vals); j++) {
			float want = (float)json_number_value(json_array_get(vals, j));
			int32_t a, b;
			memcpy(&a, &out[j], 4);
			memcpy(&b, &want, 4);
			int ulp = abs(a - b);
			if (ulp && bk_verbose)
				fprintf(stderr, "  %s: inv_freq[%zu] = %a, transformers %a\n", path,
					j, out[j], want);
			inexact += ulp != 0;
			if (ulp > max_ulp)
				max_ulp = ulp;
		}
		/* torch's fp32 pow is SIMD Sleef (1 ulp, and which lanes take it depends on
		 * the CPU); ours is the correctly rounded powf: a 1-ulp difference is torch's
		 * rounding, anything more is a bug here */
		CHECK(max_ulp <= 1 && inexact * 8 <= (int)n, "%s: %d of %zu inv_freq differ "
		      "from transformers, by up to %d ulp", path, inexact, n, max_ulp);
		total_inexact += inexact;
		total += (int)n;
		if (c->rope_type == BK_ROPE_LLAMA3) {
			n_llama3++;
			/* the smoothed band was exercised: values neither inv nor inv/factor */
			for (size_t j = 0; j < n; j++) {
				float base = 1.0f / powf((float)c->rope_theta,
							 (float)(2 * j) / (float)c->head_dim);
				if (out[j] != base && out[j] != base / (float)c->rope_factor)
					n_medium++;
			}
		}
		free(out);
		bk_config_free(c);
	}
	if (bk_verbose)
		fprintf(stderr, "  rope: %d of %d values differ by 1 ulp\n", total_inexact, total);
	CHECK(json_array_size(cases) >= 6 && n_llama3 == 2 && n_medium > 0,
	      "%zu cases, %d llama3, %d smoothed values", json_array_size(cases), n_llama3,
	      n_medium);
	json_decref(g);
}

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	if (getenv("BK_TEST_VERBOSE"))
		bk_verbose = 1;
	strcpy(tmpdir, "/tmp/bk-test-hfc-XXXXXX");
	if (!mkdtemp(tmpdir))
		BUG("mkdtemp");
	test_published();
	test_refusals();
	test_check_st();
	test_rope();
	nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return bk_test_done("test_hfconfig");
}
