/* load.c - see load.h. */
#include "load.h"
#include "common/diag.h"
#include "common/files.h"
#include "common/hash.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void bk_model_fingerprint(const char *dir, char out[17])
{
	XXH3_state_t *st = XXH3_createState();
	if (!st)
		die("out of memory");
	XXH3_64bits_reset(st);
	char *cfg = bk_path_join(dir, "config.json");
	size_t n;
	char *text = bk_read_file(cfg, &n);
	XXH3_64bits_update(st, text, n);
	free(text);
	free(cfg);
	/* every tensor: name, dtype, shape and all its bytes, so that two checkpoints
	 * differing in one weight differ (XXH3 runs at memory speed: a 1B-parameter bf16
	 * model adds well under a second to a load that reads those bytes anyway) */
	bk_st *s = bk_st_open(dir);
	for (size_t i = 0; i < bk_st_count(s); i++) {
		const bk_st_tensor *t = bk_st_at(s, i);
		XXH3_64bits_update(st, t->name, strlen(t->name));
		XXH3_64bits_update(st, t->shape, sizeof t->shape);
		XXH3_64bits_update(st, &t->dtype, sizeof t->dtype);
		XXH3_64bits_update(st, t->data, t->nbytes);
	}
	bk_st_close(s);
	bk_hash_hex(XXH3_64bits_digest(st), out);
	XXH3_freeState(st);
}

/* the text model's type of a config.json: text_config.model_type, else model_type */
static char *config_model_type(const char *dir)
{
	char *path = bk_path_join(dir, "config.json");
	json_t *o = bk_file_exists(path) ? json_load_file(path, JSON_DECODE_INT_AS_REAL, NULL) : NULL;
	free(path);
	json_t *tc = json_object_get(o, "text_config");
	json_t *mt = json_object_get(json_is_object(tc) ? tc : o, "model_type");
	if (!json_is_string(mt))
		mt = json_object_get(o, "model_type");
	char *r = json_is_string(mt) ? xstrdup(json_string_value(mt)) : NULL;
	json_decref(o);
	return r;
}

static int same_dir(const char *a, const char *b)
{
	char *ra = realpath(a, NULL), *rb = realpath(b, NULL);
	int same = ra && rb && !strcmp(ra, rb);
	free(ra);
	free(rb);
	return same;
}

void bk_adapter_check_base(const char *adapter_dir, const bk_adapter *ad, const char *model_dir,
			   const bk_config *cfg, const char *fingerprint)
{
	char *fp = NULL, *type = NULL, *ts = bk_path_join(adapter_dir, "trainer_state.json");
	const char *from = ts;
	json_t *o = bk_file_exists(ts) ? json_load_file(ts, 0, NULL) : NULL;
	json_t *set = json_object_get(o, "settings");
	if (json_is_string(json_object_get(set, "model")))
		fp = xstrdup(json_string_value(json_object_get(set, "model")));
	if (json_is_string(json_object_get(set, "model-type")))
		type = xstrdup(json_string_value(json_object_get(set, "model-type")));
	json_decref(o);
	if (type && !strcmp(type, "-")) { /* recorded as unknown */
		free(type);
		type = NULL;
	}
	const char *base = ad->base_model;
	char *base_cfg = base ? bk_path_join(base, "config.json") : NULL;
	int base_local = base_cfg && bk_file_exists(base_cfg);
	free(base_cfg);
	if (!type && base_local) { /* an adapter made elsewhere, or before model-type */
		type = config_model_type(base);
		from = base;
	}
	if (type && cfg->model_type && strcmp(type, cfg->model_type))
		die("%s: the adapter was trained on a %s model (%s), %s is %s (%s): another "
		    "architecture",
		    adapter_dir, type, from, model_dir, cfg->model_type, cfg->architecture);
	char here[17];
	if (!fp && base_local && !same_dir(base, model_dir)) {
		fp = xmalloc(17);
		bk_model_fingerprint(base, fp);
	}
	if (fp) {
		if (!fingerprint) {
			bk_model_fingerprint(model_dir, here);
			fingerprint = here;
		}
		if (strcmp(fp, fingerprint))
			warn("%s: the adapter was trained on another checkpoint of this architecture "
			     "(%s%s fingerprint %s; %s is %s)",
			     adapter_dir, base ? base : "its base", base ? "," : "", fp, model_dir,
			     fingerprint);
	}
	free(fp);
	free(type);
	free(ts);
}

static float *read_tensor(const bk_st *st, const char *name, int64_t rows, int64_t cols)
{
	float *p = xmalloc((size_t)(rows * cols) * sizeof(float));
	int64_t shape[2] = {rows, cols};
	if (rows == 1)
		bk_st_read_f32(st, name, 1, shape + 1, p);
	else
		bk_st_read_f32(st, name, 2, shape, p);
	return p;
}

/* a norm weight as the model applies it: (1 + w) for Gemma, computed in fp32 */
static float *read_norm(const bk_config *c, const bk_st *st, const char *name, int64_t n)
{
	float *p = read_tensor(st, name, 1, n);
	if (c->norm_plus_one)
		for (int64_t i = 0; i < n; i++)
			p[i] = 1.0f + p[i];
	return p;
}

bk_loaded_model bk_model_load(const bk_ops *ops, const char *dir)
{
	bk_loaded_model lm = {0};
	lm.cfg = bk_config_load(dir);
	bk_st *st = bk_st_open(dir);
	bk_config_check_st(lm.cfg, st);
	const bk_config *c = lm.cfg;
	int H = c->hidden_size, I = c->intermediate_size, L = c->n_layers, NH = c->n_heads,
	    NKV = c->n_kv_heads, D = c->head_dim, V = c->vocab_size;
	const char *pre = bk_config_prefix(c, st);
	float *inv_freq = xmalloc((size_t)(D / 2) * sizeof(float));
	float *inv_local = xmalloc((size_t)(D / 2) * sizeof(float));
	bk_rope_inv_freq(c, inv_freq);
	int has_local = bk_rope_inv_freq_local(c, inv_local);
	char name[256];
	bk_llama_config mc = {.H = H, .I = I, .L = L, .NH = NH, .NKV = NKV, .D = D, .V = V,
			      .rms_eps = c->rms_norm_eps, .inv_freq = inv_freq,
			      .tied = c->tie_word_embeddings};
	mc.qkv_bias = c->qkv_bias;
	mc.qk_norm = c->qk_norm;
	mc.geglu = c->geglu;
	mc.sandwich = c->sandwich;
	/* the scale in the dtype of the computation, as HF's torch.tensor(H ** 0.5,
	 * dtype=hidden_states.dtype): the residual stream is fp32 on the host twin and on
	 * the GPU, so sqrt(H) in fp32 whatever the checkpoint's dtype (HF running a bf16
	 * checkpoint in fp32 does the same; rounding it to bf16, 6.3125 for sqrt(40), put
	 * the log-probs 0.01-0.04 off HF's: tests/unit/test_families_bf16.c) */
	mc.embed_scale = bk_config_embed_scale(c, BK_DT_F32);
	mc.attn_scale = bk_config_attn_scale(c);
	mc.attn_softcap = (float)c->attn_softcap;
	mc.final_softcap = (float)c->final_softcap;
	mc.window = c->layer_window;
	mc.inv_freq_local = has_local ? inv_local : NULL;
	bk_llama_layer_weights *lw = xcalloc((size_t)L, sizeof *lw);
	for (int l = 0; l < L; l++) {
#define T(field, fmt, r, cc)                                                           \
	snprintf(name, sizeof name, "%slayers.%d." fmt, pre, l);                       \
	lw[l].field = read_tensor(st, name, r, cc)
#define N(field, fmt, n)                                                               \
	snprintf(name, sizeof name, "%slayers.%d." fmt, pre, l);                       \
	lw[l].field = read_norm(c, st, name, n)
		T(wq, "self_attn.q_proj.weight", NH * D, H);
		T(wk, "self_attn.k_proj.weight", NKV * D, H);
		T(wv, "self_attn.v_proj.weight", NKV * D, H);
		T(wo, "self_attn.o_proj.weight", H, NH * D);
		T(w_gate, "mlp.gate_proj.weight", I, H);
		T(w_up, "mlp.up_proj.weight", I, H);
		T(w_down, "mlp.down_proj.weight", H, I);
		N(attn_norm, "input_layernorm.weight", H);
		if (c->sandwich) {
			N(post_attn_norm, "post_attention_layernorm.weight", H);
			N(mlp_norm, "pre_feedforward_layernorm.weight", H);
			N(post_mlp_norm, "post_feedforward_layernorm.weight", H);
		} else {
			N(mlp_norm, "post_attention_layernorm.weight", H);
		}
		if (c->qkv_bias) {
			T(bq, "self_attn.q_proj.bias", 1, NH * D);
			T(bk, "self_attn.k_proj.bias", 1, NKV * D);
			T(bv, "self_attn.v_proj.bias", 1, NKV * D);
		}
		if (c->qk_norm) {
			N(q_norm, "self_attn.q_norm.weight", D);
			N(k_norm, "self_attn.k_norm.weight", D);
		}
#undef T
#undef N
	}
	bk_llama_weights w = {0};
	snprintf(name, sizeof name, "%sembed_tokens.weight", pre);
	w.embed = read_tensor(st, name, V, H);
	snprintf(name, sizeof name, "%snorm.weight", pre);
	w.final_norm = read_norm(c, st, name, H);
	w.lm_head = c->tie_word_embeddings ? w.embed
					   : read_tensor(st, bk_config_lm_head(c, st), V, H);
	w.layers = lw;
	lm.model = bk_model_create(ops, &mc, &w);
	for (int l = 0; l < L; l++) {
		const float *ps[] = { lw[l].wq, lw[l].wk, lw[l].wv, lw[l].wo, lw[l].w_gate,
				      lw[l].w_up, lw[l].w_down, lw[l].attn_norm, lw[l].mlp_norm,
				      lw[l].bq, lw[l].bk, lw[l].bv, lw[l].q_norm, lw[l].k_norm,
				      lw[l].post_attn_norm, lw[l].post_mlp_norm };
		for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++)
			free((void *)ps[i]);
	}
	if (!c->tie_word_embeddings)
		free((void *)w.lm_head);
	free((void *)w.embed);
	free((void *)w.final_norm);
	free(lw);
	free(inv_freq);
	free(inv_local);
	bk_st_close(st);
	bk_model_fingerprint(dir, lm.fingerprint);
	return lm;
}

void bk_model_unload(bk_loaded_model *lm)
{
	bk_model_free(lm->model);
	bk_config_free(lm->cfg);
	lm->model = NULL;
	lm->cfg = NULL;
}

static void check_same_shape(const bk_lora *l, const bk_adapter *a)
{
	if (l->L != a->n_layers || l->r != a->r || l->targets != a->targets)
		die("adapter shape differs from the model's LoRA (layers %d/%d, r %d/%d, targets "
		    "%#x/%#x)",
		    a->n_layers, l->L, a->r, l->r, a->targets, l->targets);
}

void bk_lora_from_adapter(const bk_model *m, bk_lora *dst, const bk_adapter *src)
{
	check_same_shape(dst, src);
	for (int l = 0; l < dst->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			if (!(dst->targets & (1u << mod)))
				continue;
			int in, out;
			bk_model_module_dims(&m->cfg, mod, &in, &out);
			m->ops->upload(dst->A[l][mod], bk_adapter_a(src, l, mod),
				       (size_t)dst->r * (size_t)in * sizeof(float));
			m->ops->upload(dst->B[l][mod], bk_adapter_b(src, l, mod),
				       (size_t)out * (size_t)dst->r * sizeof(float));
		}
}

void bk_lora_to_adapter(const bk_model *m, const bk_lora *src, bk_adapter *dst)
{
	check_same_shape(src, dst);
	for (int l = 0; l < src->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			if (!(src->targets & (1u << mod)))
				continue;
			int in, out;
			bk_model_module_dims(&m->cfg, mod, &in, &out);
			m->ops->download(bk_adapter_a(dst, l, mod), src->A[l][mod],
					 (size_t)src->r * (size_t)in * sizeof(float));
			m->ops->download(bk_adapter_b(dst, l, mod), src->B[l][mod],
					 (size_t)out * (size_t)src->r * sizeof(float));
		}
}

void bk_model_stop_ids(const bk_config *cfg, int tmpl, const bk_tok *spm, bk_ids *out)
{
	bk_template_stop_ids(tmpl, spm, out);
	for (int i = 0; i < cfg->n_eos; i++) {
		int dup = 0;
		for (size_t k = 0; k < out->n; k++)
			dup |= out->v[k] == cfg->eos_token_ids[i];
		if (!dup)
			bk_vec_push(out, cfg->eos_token_ids[i]);
	}
}
