/* test_hfconfig.c - config.json parsing of the supported families: the published
 * configs in tests/data/hf-configs (right numbers and family deltas), each family's
 * defaults and layer patterns (sliding windows, RoPE bases, softcaps) in both the
 * transformers 4 and 5 layouts, refusals of unsupported architectures and options,
 * stories260K checked against its safetensors (missing, mis-shaped and extra tensors
 * refused by name), a Gemma3ForConditionalGeneration checkpoint's text tower (prefixes,
 * vision tensors ignored, same logits as the Gemma3ForCausalLM it was made from; LoRA
 * adapters for it refused), RoPE
 * frequencies against transformers' values. */
#include "common/diag.h"
#include "common/files.h"
#include "formats/hfconfig.h"
#include "formats/merge.h"
#include "formats/peft.h"
#include "gpu/load.h"
#include "tests/harness.h"

#include <dirent.h>
#include <math.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
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
	int bos, eos;
	bk_family fam;
	int qkv_bias, qk_norm, gemma; /* gemma: (1+w) norms, GeGLU, scaled embeddings */
} good[] = {
	{"TinyLlama-1.1B-Chat-v1.0", "LlamaForCausalLM", 22, 2048, 5632, 32, 4, 64, 32000,
	 2048, 0, 0, 2048, 10000.0, 1e-5f, 1, 2, BK_FAM_LLAMA, 0, 0, 0},
	{"Llama-2-7b-chat-hf", "LlamaForCausalLM", 32, 4096, 11008, 32, 32, 128, 32000, 4096,
	 0, 0, 4096, 10000.0, 1e-5f, 1, 2, BK_FAM_LLAMA, 0, 0, 0},
	/* the window is applied, not a limit on the sequence length */
	{"Mistral-7B-Instruct-v0.1", "MistralForCausalLM", 32, 4096, 14336, 32, 8, 128, 32000,
	 32768, 0, 4096, 32768, 10000.0, 1e-5f, 1, 2, BK_FAM_LLAMA, 0, 0, 0},
	{"Mistral-7B-Instruct-v0.2", "MistralForCausalLM", 32, 4096, 14336, 32, 8, 128, 32000,
	 32768, 0, 0, 32768, 1000000.0, 1e-5f, 1, 2, BK_FAM_LLAMA, 0, 0, 0},
	{"SmolLM2-135M-Instruct", "LlamaForCausalLM", 30, 576, 1536, 9, 3, 64, 49152, 8192, 1,
	 0, 8192, 100000.0, 1e-5f, 1, 2, BK_FAM_LLAMA, 0, 0, 0},
	/* sliding_window 32768 with use_sliding_window false: no window */
	{"Qwen2.5-0.5B-Instruct", "Qwen2ForCausalLM", 24, 896, 4864, 14, 2, 64, 151936,
	 32768, 1, 0, 32768, 1000000.0, 1e-6f, 151643, 151645, BK_FAM_QWEN2, 1, 0, 0},
	/* head_dim 128 != 1024 / 16 */
	{"Qwen3-0.6B", "Qwen3ForCausalLM", 28, 1024, 3072, 16, 8, 128, 151936, 40960, 1, 0,
	 40960, 1000000.0, 1e-6f, 151643, 151645, BK_FAM_QWEN3, 0, 1, 0},
	/* hidden_act 'gelu' is the tanh GeGLU for Gemma (1); tied by default */
	{"gemma-2b-it", "GemmaForCausalLM", 18, 2048, 16384, 8, 1, 256, 256000, 8192, 1, 0,
	 8192, 10000.0, 1e-6f, 2, 1, BK_FAM_GEMMA, 0, 0, 1},
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
			CHECK(c->bos_token_id == good[k].bos && c->n_eos == 1 &&
				      c->eos_token_ids[0] == good[k].eos,
			      "%s: bos %d eos %d", path, c->bos_token_id, c->eos_token_ids[0]);
			int g = good[k].gemma;
			CHECK(c->family == good[k].fam && c->qkv_bias == good[k].qkv_bias &&
				      c->qk_norm == good[k].qk_norm && c->norm_plus_one == g &&
				      c->geglu == g && c->embed_scaled == g && !c->sandwich &&
				      c->attn_softcap == 0 && c->final_softcap == 0,
			      "%s: family %d deltas bias %d qk_norm %d gemma %d", path, c->family,
			      c->qkv_bias, c->qk_norm, c->geglu);
			int nwin = 0;
			for (int l = 0; l < c->n_layers; l++)
				nwin += c->layer_window[l] == good[k].sliding;
			CHECK(nwin == c->n_layers, "%s: every layer's window is %d", path,
			      good[k].sliding);
			CHECK(bk_config_attn_scale(c) == (float)(1.0 / sqrt(good[k].D)),
			      "%s: attention scale", path);
			bk_config_free(c);
		}
		CHECK(known, "%s: not in this test's tables; add it", path);
		free(path);
	}
	closedir(d);
	CHECK(seen_good == 8 && seen_bad == 0, "saw %d good, %d refused configs", seen_good,
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
#define QWEN2 "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", " BASE
#define QWEN3 "{\"architectures\": [\"Qwen3ForCausalLM\"], \"model_type\": \"qwen3\", " BASE
#define GEMMA2 "{\"architectures\": [\"Gemma2ForCausalLM\"], \"model_type\": \"gemma2\", " BASE
#define GEMMA3                                                                          \
	"{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\", " BASE

static void parse_it(void *text)
{
	bk_config_free(bk_config_parse("x/config.json", text, strlen(text)));
}

static bk_config *parse(const char *text)
{
	return bk_config_parse("x/config.json", text, strlen(text));
}

/* each family's defaults, deltas and layer patterns */
static void test_families(void)
{
	/* Qwen2: bias; a window only with use_sliding_window, on layers >= max_window_layers */
	bk_config *c = parse(QWEN2 ", \"sliding_window\": 64}");
	CHECK(c->qkv_bias && !c->qk_norm && !c->tie_word_embeddings && c->sliding_window == 0 &&
		      c->layer_window[0] == 0 && c->layer_window[1] == 0 && c->head_dim == 16,
	      "qwen2 defaults");
	bk_config_free(c);
	c = parse(QWEN2 ", \"use_sliding_window\": true, \"sliding_window\": 64, "
		  "\"max_window_layers\": 1}");
	CHECK(c->layer_window[0] == 0 && c->layer_window[1] == 64, "qwen2 max_window_layers");
	bk_config_free(c);
	c = parse(QWEN2 ", \"use_sliding_window\": true, \"sliding_window\": 8, "
		  "\"layer_types\": [\"sliding_attention\", \"full_attention\"]}");
	CHECK(c->layer_window[0] == 8 && c->layer_window[1] == 0, "qwen2 layer_types");
	bk_config_free(c);
	/* Qwen3: q/k norms, head_dim 128 by default (not H / NH) */
	c = parse(QWEN3 "}");
	CHECK(c->qk_norm && !c->qkv_bias && c->head_dim == 128 && !c->norm_plus_one &&
		      bk_config_attn_scale(c) == (float)(1.0 / sqrt(128.0)),
	      "qwen3 defaults");
	bk_config_free(c);
	/* Gemma-2: softcap 50 by default, scale query_pre_attn_scalar^-0.5 (256), window
	 * 4096 on even layers, sandwich norms */
	c = parse(GEMMA2 ", \"final_logit_softcapping\": null}");
	CHECK(c->family == BK_FAM_GEMMA2 && c->sandwich && c->geglu && c->norm_plus_one &&
		      c->embed_scaled && !c->qk_norm && c->tie_word_embeddings &&
		      c->head_dim == 256 && c->attn_softcap == 50 && c->final_softcap == 0 &&
		      c->query_pre_attn_scalar == 256 &&
		      bk_config_attn_scale(c) == (float)(1.0 / 16) && c->layer_window[0] == 4096 &&
		      c->layer_window[1] == 0 && c->rope_local_theta == 0,
	      "gemma2 defaults");
	/* sqrt(64) = 8 is exact in every dtype; bf16 rounds sqrt(3072) to 55.5 */
	CHECK(bk_config_embed_scale(c, BK_DT_BF16) == 8.0f, "gemma2 embed scale");
	c->hidden_size = 3072;
	CHECK(bk_config_embed_scale(c, BK_DT_BF16) == 55.5f &&
		      bk_config_embed_scale(c, BK_DT_F32) == (float)sqrt(3072.0) &&
		      bk_config_embed_scale(c, BK_DT_F16) == 55.4375f,
	      "embed scale rounded to the weight dtype: bf16 %.9g f16 %.9g",
	      bk_config_embed_scale(c, BK_DT_BF16), bk_config_embed_scale(c, BK_DT_F16));
	bk_config_free(c);
	c = parse(GEMMA2 "}"); /* final_logit_softcapping absent: HF's default 30 */
	CHECK(c->final_softcap == 30 && c->attn_softcap == 50, "gemma2 default final softcap %g",
	      c->final_softcap);
	bk_config_free(c);
	c = parse(GEMMA2 ", \"final_logit_softcapping\": null, \"attn_logit_softcapping\": "
			 "null, \"query_pre_attn_scalar\": 144, \"sliding_window\": 7, "
			 "\"head_dim\": 16}");
	CHECK(c->attn_softcap == 0 && bk_config_attn_scale(c) == (float)(1.0 / 12) &&
		      c->layer_window[0] == 7 && c->head_dim == 16,
	      "gemma2 explicit");
	bk_config_free(c);
	/* Gemma-3, transformers 4: pattern 6 (2 layers: both sliding), two RoPE bases,
	 * linear scaling on the full layers */
	c = parse(GEMMA3 ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 8.0}, "
			 "\"sliding_window\": 512}");
	CHECK(c->qk_norm && c->sandwich && c->attn_softcap == 0 && c->final_softcap == 0 &&
		      c->rope_theta == 1e6 && c->rope_local_theta == 1e4 &&
		      c->rope_type == BK_ROPE_LINEAR && c->rope_factor == 8 &&
		      c->layer_window[0] == 512 && c->layer_window[1] == 512,
	      "gemma3 transformers-4 layout");
	float g[8], lo[8];
	bk_config_free(c);
	c = parse(GEMMA3 ", \"sliding_window_pattern\": 2, \"head_dim\": 16, \"rope_scaling\": "
			 "{\"rope_type\": \"linear\", \"factor\": 8.0}}");
	CHECK(c->layer_window[0] == 4096 && c->layer_window[1] == 0, "gemma3 pattern 2");
	bk_rope_inv_freq(c, g);
	CHECK(bk_rope_inv_freq_local(c, lo) == 1, "gemma3 has a local rope");
	CHECK(g[0] == 1.0f / 8 && lo[0] == 1.0f && g[1] == (1.0f / powf(1e6f, 2.0f / 16)) / 8 &&
		      lo[1] == 1.0f / powf(1e4f, 2.0f / 16),
	      "gemma3 global (linear / 8) and local inv_freq");
	bk_config_free(c);
	/* transformers 5: rope_parameters per layer type, layer_types */
	c = parse(GEMMA3 ", \"layer_types\": [\"sliding_attention\", \"full_attention\"], "
			 "\"rope_parameters\": {\"sliding_attention\": {\"rope_type\": "
			 "\"default\", \"rope_theta\": 20000.0}, \"full_attention\": "
			 "{\"rope_type\": \"default\", \"rope_theta\": 500000.0}}}");
	CHECK(c->rope_theta == 5e5 && c->rope_local_theta == 2e4 &&
		      c->rope_type == BK_ROPE_DEFAULT && c->layer_window[0] == 4096 &&
		      c->layer_window[1] == 0,
	      "gemma3 transformers-5 layout");
	bk_config_free(c);
	/* the text tower of a VLM: numbers from text_config, ids from the top level */
	c = parse("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
		  "\"gemma3\", \"eos_token_id\": [1, 106], \"text_config\": {\"model_type\": "
		  "\"gemma3_text\", " BASE "}, \"vision_config\": {\"hidden_size\": 1152}}");
	CHECK(c->multimodal && c->family == BK_FAM_GEMMA3 && c->hidden_size == 64 &&
		      c->n_eos == 2 && c->eos_token_ids[1] == 106 && c->tie_word_embeddings &&
		      !strcmp(c->model_type, "gemma3_text"),
	      "gemma3 conditional generation");
	bk_config_free(c);
	/* gemma-3-12b-it's config as published: text_config leaves out what equals
	 * Gemma3TextConfig's defaults (vocab_size 262208, head_dim 256, the context), and
	 * the 4B's also its heads (8, 4 KV) */
	c = parse("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
		  "\"gemma3\", \"text_config\": {\"hidden_size\": 3840, \"intermediate_size\": "
		  "15360, \"model_type\": \"gemma3_text\", \"num_attention_heads\": 16, "
		  "\"num_hidden_layers\": 48, \"num_key_value_heads\": 8, \"rope_scaling\": "
		  "{\"factor\": 8.0, \"rope_type\": \"linear\"}, \"sliding_window\": 1024}}");
	CHECK(c->vocab_size == 262208 && c->head_dim == 256 && c->n_heads == 16 &&
		      c->n_kv_heads == 8 && c->max_pos == 131072 && c->tie_word_embeddings &&
		      c->query_pre_attn_scalar == 256 && c->rope_factor == 8,
	      "gemma-3-12b-it as published: V %d D %d NH %d NKV %d max_pos %d", c->vocab_size,
	      c->head_dim, c->n_heads, c->n_kv_heads, c->max_pos);
	bk_config_free(c);
	/* Ministral (transformers >= 4.57's MinistralForCausalLM): Mistral's layers, the
	 * window per layer_types (1 full, 3 sliding), else on every layer; null: none */
#define MINISTRAL "{\"architectures\": [\"MinistralForCausalLM\"], \"model_type\": " \
		  "\"ministral\", " BASE
	c = parse(MINISTRAL ", \"num_key_value_heads\": 2, \"head_dim\": 32, "
		  "\"sliding_window\": 32768, \"layer_types\": [\"full_attention\", "
		  "\"sliding_attention\"]}");
	CHECK(c->family == BK_FAM_LLAMA && !c->qkv_bias && !c->qk_norm && c->head_dim == 32 &&
		      c->n_kv_heads == 2 && c->layer_window[0] == 0 && c->layer_window[1] == 32768,
	      "ministral: window %d %d", c->layer_window[0], c->layer_window[1]);
	bk_config_free(c);
	c = parse(MINISTRAL "}");
	CHECK(c->layer_window[0] == 4096 && c->layer_window[1] == 4096, "ministral default window");
	bk_config_free(c);
	c = parse(MINISTRAL ", \"sliding_window\": null}");
	CHECK(c->layer_window[0] == 0 && c->layer_window[1] == 0, "ministral: no window");
	bk_config_free(c);
#undef MINISTRAL
	/* a context beyond an int: no limit (HF takes any size) */
	c = parse("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
		  "\"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
		  "\"num_attention_heads\": 4, \"vocab_size\": 100, \"rms_norm_eps\": 1e-6, "
		  "\"max_position_embeddings\": 1000000000000}");
	CHECK(c->max_pos == INT_MAX && !bk_config_check_len(c, 1L << 30, "x", (char[64]){0}, 64),
	      "max_position_embeddings 10^12: %d", c->max_pos);
	bk_config_free(c);
	c = parse("{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
		  "\"gemma3\", \"text_config\": {\"hidden_size\": 2560, \"intermediate_size\": "
		  "10240, \"model_type\": \"gemma3_text\", \"num_hidden_layers\": 34, "
		  "\"sliding_window\": 1024}}");
	CHECK(c->vocab_size == 262208 && c->n_heads == 8 && c->n_kv_heads == 4 &&
		      c->n_layers == 34,
	      "gemma3 text defaults: NH %d NKV %d", c->n_heads, c->n_kv_heads);
	bk_config_free(c);
	/* Gemma (1): no sandwich, no window, head_dim 256 */
	c = parse("{\"architectures\": [\"GemmaForCausalLM\"], \"model_type\": \"gemma\", " BASE
		  ", \"hidden_act\": \"gelu_pytorch_tanh\"}");
	CHECK(c->geglu && !c->sandwich && c->head_dim == 256 && c->layer_window[1] == 0 &&
		      bk_config_attn_scale(c) == (float)(1.0 / 16),
	      "gemma defaults");
	bk_config_free(c);
}

/* A Gemma3ForConditionalGeneration checkpoint made from the gemma3 parity model
 * (language_model.* names, a vision tensor, the text config nested) loads as the same
 * text model: its logits equal the Gemma3ForCausalLM's bit for bit. */
static void test_vlm(void)
{
	const char *src = "tests/golden/parity/gemma3/model";
	char *dir = xasprintf("%s/vlm", tmpdir);
	bk_mkdir_p(dir);
	bk_st *st = bk_st_open(src);
	bk_st_writer *w = bk_st_writer_new();
	for (size_t i = 0; i < bk_st_count(st); i++) {
		const bk_st_tensor *t = bk_st_at(st, i);
		char *n = xasprintf("language_model.%s", t->name);
		bk_st_writer_add(w, n, t->dtype, t->ndim, t->shape, t->data);
		free(n);
	}
	float vis[6] = {0};
	int64_t vs[2] = {2, 3};
	bk_st_writer_add(w, "vision_tower.vision_model.embeddings.patch_embedding.weight",
			 BK_DT_F32, 2, vs, vis);
	bk_st_writer_add(w, "multi_modal_projector.mm_input_projection_weight", BK_DT_F32, 2, vs,
			 vis);
	char *p = bk_path_join(dir, "model.safetensors");
	bk_st_writer_write(w, p);
	free(p);
	bk_st_writer_free(w);
	bk_st_close(st);
	/* config: the text config nested */
	char *cfgp = bk_path_join(src, "config.json");
	size_t n;
	char *text = bk_read_file(cfgp, &n);
	free(cfgp);
	json_error_t err;
	json_t *tc = json_loadb(text, n, 0, &err);
	free(text);
	CHECK(tc, "gemma3 parity config: %s", err.text);
	if (!tc)
		return;
	json_t *top = json_pack("{s:[s], s:s, s:o}", "architectures",
				"Gemma3ForConditionalGeneration", "model_type", "gemma3",
				"text_config", tc);
	p = bk_path_join(dir, "config.json");
	json_dump_file(top, p, 0);
	free(p);
	json_decref(top);

	bk_loaded_model a = bk_model_load(&bk_ops_host, src), b = bk_model_load(&bk_ops_host, dir);
	CHECK(b.cfg->multimodal, "vlm config");
	/* its adapters get PEFT's language_model names (test_peft checks them); bk-merge
	 * folds one into the language_model.* tensors exactly as into the causal LM's */
	bk_adapter *vad = bk_adapter_new(b.cfg, 4, 8, 0, BK_PEFT_ALL, "x");
	CHECK(vad->layout == BK_PEFT_VLM5, "vlm adapter layout %d", vad->layout);
	for (int l = 0; l < vad->n_layers; l++)
		for (int m = 0; m < BK_PEFT_NMOD; m++) {
			for (int i = 0; i < vad->r * vad->in[m]; i++)
				bk_adapter_a(vad, l, m)[i] = 0.01f * (float)((i * 7 + l + m) % 11) - 0.05f;
			for (int i = 0; i < vad->r * vad->out[m]; i++)
				bk_adapter_b(vad, l, m)[i] = 0.02f * (float)((i * 3 + m) % 5) - 0.04f;
		}
	char *mv = xasprintf("%s/merged-vlm", tmpdir), *mp = xasprintf("%s/merged-lm", tmpdir);
	bk_merge_stats sv = bk_merge_model(dir, vad, mv, BK_MERGE_AUTO);
	bk_merge_stats sp = bk_merge_model(src, vad, mp, BK_MERGE_AUTO);
	bk_st *stv = bk_st_open(mv), *stp = bk_st_open(mp);
	int differ = 0;
	for (size_t i = 0; i < bk_st_count(stp); i++) {
		const bk_st_tensor *t = bk_st_at(stp, i);
		char *n = xasprintf("language_model.%s", t->name);
		const bk_st_tensor *u = bk_st_find(stv, n);
		differ += !u || u->nbytes != t->nbytes || memcmp(u->data, t->data, t->nbytes);
		free(n);
	}
	CHECK(sv.merged == 7 * vad->n_layers && sv.merged == sp.merged && !differ,
	      "vlm merge: %d and %d modules folded, %d tensors differ", sv.merged, sp.merged,
	      differ);
	bk_st_close(stv), bk_st_close(stp);
	free(mv), free(mp);
	bk_adapter_free(vad);
	enum { T = 6 };
	int32_t ids[T] = {5, 17, 33, 2, 90, 41}, pos[T] = {0, 1, 2, 3, 4, 5}, cu[2] = {0, T};
	bk_batch bt = {.T = T, .S = 1, .ids = ids, .pos = pos, .cu_seqlens = cu};
	int H = a.model->cfg.H, V = a.model->cfg.V;
	float *ha = xmalloc((size_t)T * H * 4), *hb = xmalloc((size_t)T * H * 4);
	float *la = xmalloc((size_t)T * V * 4), *lb = xmalloc((size_t)T * V * 4);
	bk_acts *aa = bk_acts_create(a.model, T, 1), *ab = bk_acts_create(b.model, T, 1);
	bk_model_forward(a.model, NULL, &bt, NULL, aa, ha);
	bk_model_forward(b.model, NULL, &bt, NULL, ab, hb);
	bk_model_logits(a.model, ha, la, T);
	bk_model_logits(b.model, hb, lb, T);
	CHECK(!memcmp(la, lb, (size_t)T * V * 4), "vlm text tower logits differ from the causal LM's");
	bk_acts_free(a.model, aa);
	bk_acts_free(b.model, ab);
	bk_model_unload(&a);
	bk_model_unload(&b);
	free(ha), free(hb), free(la), free(lb), free(dir);
}

static void test_refusals(void)
{
	static const struct {
		const char *what, *json, *must;
	} cases[] = {
		{"gpt2", "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": \"gpt2\"}",
		 "architecture 'GPT2LMHeadModel' is not supported (supported: LlamaForCausalLM, "
		 "MistralForCausalLM, MinistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
		 "GemmaForCausalLM, "
		 "Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration)"},
		{"phi3", "{\"architectures\": [\"Phi3ForCausalLM\"], \"model_type\": \"phi3\"}",
		 "architecture 'Phi3ForCausalLM' is not supported"},
		{"qwen3 attention_bias", QWEN3 ", \"attention_bias\": true}",
		 "key 'attention_bias' is true (biases are not supported for Qwen3ForCausalLM)"},
		{"qwen2 gelu", QWEN2 ", \"hidden_act\": \"gelu\"}", "'hidden_act' is gelu"},
		{"gemma2 exact gelu",
		 GEMMA2 ", \"hidden_activation\": \"gelu\", \"final_logit_softcapping\": null}",
		 "key 'hidden_activation' is gelu (only 'gelu_pytorch_tanh' is supported"},
		{"gemma2 negative final softcap", GEMMA2 ", \"final_logit_softcapping\": -1}",
		 "key 'final_logit_softcapping' (-1) is negative"},
		{"gemma3 bidirectional", GEMMA3 ", \"use_bidirectional_attention\": true}",
		 "'use_bidirectional_attention'"},
		{"gemma3 layer type", GEMMA3 ", \"layer_types\": [\"full_attention\", "
					     "\"chunked_attention\"]}",
		 "key 'layer_types'[1] is 'chunked_attention'"},
		{"gemma3 layer count", GEMMA3 ", \"layer_types\": [\"full_attention\"]}",
		 "key 'layer_types' is not a list of 2 layer types"},
		{"gemma3 local yarn", GEMMA3 ", \"rope_parameters\": {\"sliding_attention\": "
					    "{\"rope_type\": \"yarn\", \"factor\": 2}}}",
		 "rope_parameters.sliding_attention': rope type 'yarn' on the sliding layers"},
		{"gemma3 vlm without text_config",
		 "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": "
		 "\"gemma3\"}",
		 "key 'text_config' is missing"},
		{"qwen2 window missing", QWEN2 ", \"use_sliding_window\": true}",
		 "'sliding_window' is missing"},
		{"no architectures", "{\"model_type\": \"llama\", " BASE "}", "'architectures'"},
		{"model_type", "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": "
			       "\"mistral\", " BASE "}",
		 "'model_type'"},
		{"gelu", LLAMA ", \"hidden_act\": \"gelu\"}", "'hidden_act' is gelu"},
		{"attention_bias", LLAMA ", \"attention_bias\": true}", "'attention_bias'"},
		{"mlp_bias", LLAMA ", \"mlp_bias\": true}", "'mlp_bias'"},
		{"longrope", LLAMA ", \"rope_scaling\": {\"type\": \"longrope\", \"factor\": 4.0}}",
		 "key 'rope_scaling': rope type 'longrope' is not supported (supported: default, "
		 "linear, dynamic, llama3, yarn)"},
		{"gemma3 yarn", GEMMA3 ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 2}}",
		 "key 'rope_scaling': rope type 'yarn' is not supported (supported: default, linear, "
		 "dynamic, llama3)"},
		{"yarn without factor", LLAMA ", \"rope_scaling\": {\"type\": \"yarn\"}}",
		 "key 'rope_scaling': yarn needs a 'factor'"},
		{"yarn factor below 1",
		 LLAMA ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 0.5}}",
		 "yarn needs a finite factor >= 1 (got 0.5)"},
		{"yarn attention factor",
		 LLAMA ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2, "
		       "\"attention_factor\": 0}}",
		 "'attention_factor' must be a finite number above 0"},
		{"yarn truncate", LLAMA ", \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 2, "
				    "\"truncate\": 1}}",
		 "key 'truncate' is not a boolean"},
		{"linear factor", LLAMA ", \"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0.5}}",
		 "key 'rope_scaling': linear rope needs a finite factor >= 1"},
		{"dynamic tf5",
		 LLAMA ", \"rope_parameters\": {\"rope_type\": \"dynamic\", \"rope_theta\": 1e4}}",
		 "key 'factor' is missing"},
		{"llama3 incomplete",
		 LLAMA ", \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0}}",
		 "'low_freq_factor' is missing"},
		{"partial rotary",
		 LLAMA ", \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e4, "
		       "\"partial_rotary_factor\": 0.5}}",
		 "'partial_rotary_factor'"},
		{"partial rotary top level", LLAMA ", \"partial_rotary_factor\": 0.5}",
		 "key 'partial_rotary_factor' other than 1 is not supported"},
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
	CHECK(c->sliding_window == 4096 && bk_config_max_seq(c) == 256 &&
		      c->layer_window[0] == 4096 && c->layer_window[1] == 4096,
	      "mistral: the window on every layer; above max_pos it does not limit");
	bk_config_free(c);
	/* HF's defaults for missing keys: MistralConfig's window 4096 (null: none),
	 * Qwen2Config's and Qwen3Config's 32768 positions */
	text = "{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\", " BASE "}";
	c = bk_config_parse("x/config.json", text, strlen(text));
	CHECK(c->sliding_window == 4096 && c->layer_window[1] == 4096,
	      "mistral without sliding_window: 4096 (got %d)", c->sliding_window);
	bk_config_free(c);
	text = "{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\", " BASE
	       ", \"sliding_window\": null}";
	c = bk_config_parse("x/config.json", text, strlen(text));
	CHECK(c->sliding_window == 0 && c->layer_window[0] == 0, "mistral, sliding_window null: none");
	bk_config_free(c);
	for (int q = 0; q < 2; q++) {
		const char *arch = q ? "Qwen3ForCausalLM" : "Qwen2ForCausalLM";
		char buf[512];
		snprintf(buf, sizeof buf,
			 "{\"architectures\": [\"%s\"], \"model_type\": \"qwen%d\", \"hidden_size\": "
			 "64, \"intermediate_size\": 128, \"num_hidden_layers\": 2, "
			 "\"num_attention_heads\": 4, \"vocab_size\": 100}", arch, q ? 3 : 2);
		c = bk_config_parse("x/config.json", buf, strlen(buf));
		CHECK(c->max_pos == 32768, "%s without max_position_embeddings: 32768 (got %d)",
		      arch, c->max_pos);
		bk_config_free(c);
	}
	test_families();
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
	int n_llama3 = 0, n_medium = 0, total_inexact = 0, total = 0, n_yarn = 0, n_ramp = 0;
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
		/* the factor HF multiplies cos and sin by (yarn's, else 1), a Python float:
		 * folded into the attention scale as its square */
		double af = json_number_value(json_object_get(cs, "attention_factor"));
		CHECK(af > 0 && fabs(c->rope_attention_factor - af) <= 1e-15 * af,
		      "%s: attention factor %.17g, transformers %.17g", path,
		      c->rope_attention_factor, af);
		double d = c->query_pre_attn_scalar > 0 ? c->query_pre_attn_scalar : c->head_dim;
		CHECK(bk_config_attn_scale(c) == (float)(1.0 / sqrt(d) * af * af),
		      "%s: attention scale %.9g, want %.9g", path, bk_config_attn_scale(c),
		      (float)(1.0 / sqrt(d) * af * af));
		if (c->rope_type == BK_ROPE_YARN) {
			n_yarn++;
			/* the ramp's band exercised: values neither extrapolated nor interpolated */
			for (size_t j = 0; j < n; j++) {
				float p = powf((float)c->rope_theta, (float)(2 * j) / (float)c->head_dim);
				if (out[j] != 1.0f / p && out[j] != 1.0f / ((float)c->rope_factor * p))
					n_ramp++;
			}
		}
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
	CHECK(json_array_size(cases) >= 12 && n_llama3 == 2 && n_medium > 0 && n_yarn == 4 &&
		      n_ramp > 0,
	      "%zu cases, %d llama3, %d smoothed values, %d yarn, %d ramp values",
	      json_array_size(cases), n_llama3, n_medium, n_yarn, n_ramp);
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
	test_vlm();
	test_rope();
	nftw(tmpdir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	return bk_test_done("test_hfconfig");
}
