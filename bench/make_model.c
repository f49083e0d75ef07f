/* make_model.c - writes a random Llama model directory of a given shape (config.json,
 * model.safetensors, a copy of a tokenizer.model) for benchmarks of real shape.
 * usage: make_model OUTDIR H L NH NKV I V TOKENIZER [f32|bf16] [SEED] [qwen3]
 * Weights ~ U(-a, a) with a = 0.02 * sqrt(3) (std 0.02), norms 1, untied head.
 * qwen3: a Qwen3ForCausalLM of that shape instead (head_dim 128, q_norm and k_norm,
 * tied embeddings, rope_theta 1e6; Qwen3-0.6B is H 1024, L 28, NH 16, NKV 8, I 3072,
 * V 151936).  A TOKENIZER named *.json is copied as tokenizer.json, else as
 * tokenizer.model. */
#include "common/diag.h"
#include "common/files.h"
#include "common/rng.h"
#include "formats/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float *rnd(bk_rng *r, size_t n, float a)
{
	float *p = xmalloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = a * (float)(2 * bk_rng_uniform(r) - 1);
	return p;
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	if (argc < 9)
		die_usage("usage: make_model OUTDIR H L NH NKV I V TOKENIZER [f32|bf16] [SEED] [qwen3]");
	const char *dir = argv[1], *tok = argv[8];
	long H = atol(argv[2]), L = atol(argv[3]), NH = atol(argv[4]), NKV = atol(argv[5]),
	     I = atol(argv[6]), V = atol(argv[7]), D = H / NH;
	int qwen3 = argc > 11 && !strcmp(argv[11], "qwen3");
	if (argc > 11 && !qwen3)
		die_usage("make_model: unknown architecture '%s' (qwen3, or nothing for Llama)", argv[11]);
	if (qwen3)
		D = 128;
	bk_dtype dt = argc > 9 && !strcmp(argv[9], "bf16") ? BK_DT_BF16 : BK_DT_F32;
	bk_rng r;
	bk_rng_seed(&r, argc > 10 ? (uint64_t)atoll(argv[10]) : 1);
	bk_mkdir_p(dir);
	bk_st_writer *w = bk_st_writer_new();
	float a = 0.02f * 1.7320508f;
	float *ones = xmalloc((size_t)(H > I ? H : I) * sizeof *ones);
	for (long i = 0; i < (H > I ? H : I); i++)
		ones[i] = 1;
	char name[128];
	int64_t sh[2];
#define ADD(nm, rows, cols)                                                            \
	do {                                                                           \
		sh[0] = rows, sh[1] = cols;                                            \
		float *p_ = rnd(&r, (size_t)(rows) * (size_t)(cols), a);               \
		bk_st_writer_add_f32(w, nm, dt, 2, sh, p_);                            \
		free(p_);                                                              \
	} while (0)
	for (long l = 0; l < L; l++) {
		const char *mods[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
				       "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
				       "mlp.down_proj"};
		long rows[7] = {NH * D, NKV * D, NKV * D, H, I, I, H};
		long cols[7] = {H, H, H, NH * D, H, H, I};
		for (int m = 0; m < 7; m++) {
			snprintf(name, sizeof name, "model.layers.%ld.%s.weight", l, mods[m]);
			ADD(name, rows[m], cols[m]);
		}
		sh[0] = H;
		snprintf(name, sizeof name, "model.layers.%ld.input_layernorm.weight", l);
		bk_st_writer_add_f32(w, name, dt, 1, sh, ones);
		snprintf(name, sizeof name, "model.layers.%ld.post_attention_layernorm.weight", l);
		bk_st_writer_add_f32(w, name, dt, 1, sh, ones);
		if (qwen3) {
			sh[0] = D;
			snprintf(name, sizeof name, "model.layers.%ld.self_attn.q_norm.weight", l);
			bk_st_writer_add_f32(w, name, dt, 1, sh, ones);
			snprintf(name, sizeof name, "model.layers.%ld.self_attn.k_norm.weight", l);
			bk_st_writer_add_f32(w, name, dt, 1, sh, ones);
		}
	}
	ADD("model.embed_tokens.weight", V, H);
	if (!qwen3)
		ADD("lm_head.weight", V, H);
	sh[0] = H;
	bk_st_writer_add_f32(w, "model.norm.weight", dt, 1, sh, ones);
	char *path = bk_path_join(dir, "model.safetensors");
	bk_st_writer_write(w, path);
	bk_st_writer_free(w);
	free(path);
	char *cfg = qwen3 ? xasprintf(
		"{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"model_type\": \"qwen3\",\n"
		"  \"hidden_size\": %ld,\n  \"intermediate_size\": %ld,\n  \"num_hidden_layers\": %ld,\n"
		"  \"num_attention_heads\": %ld,\n  \"num_key_value_heads\": %ld,\n  \"head_dim\": %ld,\n"
		"  \"vocab_size\": %ld,\n  \"max_position_embeddings\": 40960,\n"
		"  \"rms_norm_eps\": 1e-06,\n  \"rope_theta\": 1000000,\n  \"hidden_act\": \"silu\",\n"
		"  \"attention_bias\": false,\n  \"use_sliding_window\": false,\n"
		"  \"tie_word_embeddings\": true,\n  \"bos_token_id\": 151643,\n"
		"  \"eos_token_id\": 151645,\n  \"torch_dtype\": \"%s\"\n}\n",
		H, I, L, NH, NKV, D, V, dt == BK_DT_BF16 ? "bfloat16" : "float32") : xasprintf(
		"{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n"
		"  \"hidden_size\": %ld,\n  \"intermediate_size\": %ld,\n  \"num_hidden_layers\": %ld,\n"
		"  \"num_attention_heads\": %ld,\n  \"num_key_value_heads\": %ld,\n"
		"  \"vocab_size\": %ld,\n  \"max_position_embeddings\": 2048,\n"
		"  \"rms_norm_eps\": 1e-05,\n  \"rope_theta\": 10000.0,\n  \"hidden_act\": \"silu\",\n"
		"  \"tie_word_embeddings\": false,\n  \"bos_token_id\": 1,\n  \"eos_token_id\": 2,\n"
		"  \"torch_dtype\": \"%s\"\n}\n",
		H, I, L, NH, NKV, V, dt == BK_DT_BF16 ? "bfloat16" : "float32");
	path = bk_path_join(dir, "config.json");
	bk_write_file_atomic(path, cfg, strlen(cfg));
	free(path);
	free(cfg);
	size_t n;
	char *t = bk_read_file(tok, &n);
	size_t tl = strlen(tok);
	path = bk_path_join(dir, tl > 5 && !strcmp(tok + tl - 5, ".json") ? "tokenizer.json"
									 : "tokenizer.model");
	bk_write_file_atomic(path, t, n);
	free(path);
	free(t);
	free(ones);
	return 0;
}
