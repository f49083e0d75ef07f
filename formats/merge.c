/* merge.c - see merge.h.  One pass over the checkpoint's tensors in name order:
 * targeted projections are read into fp32, folded and rounded once; the rest are
 * referenced straight from the mapping (same dtype) or converted.  Peak memory is the
 * output's merged tensors plus one fp32 tensor. */
#include "formats/merge.h"

#include <cblas.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "formats/hfconfig.h"
#include "formats/msgjson.h"

void bk_merge_fold(float *w, const float *a, const float *b, int out, int in, int r,
		   float scale)
{
	/* (out, in) += scale * (out, r) @ (r, in) */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, out, in, r, scale, b, r, a, in,
		    1.0f, w, in);
}

int bk_merge_dtype_parse(const char *s)
{
	if (!strcasecmp(s, "auto"))
		return BK_MERGE_AUTO;
	if (!strcasecmp(s, "f32") || !strcasecmp(s, "float32"))
		return BK_DT_F32;
	if (!strcasecmp(s, "bf16") || !strcasecmp(s, "bfloat16"))
		return BK_DT_BF16;
	if (!strcasecmp(s, "f16") || !strcasecmp(s, "float16"))
		return BK_DT_F16;
	return -2;
}

/* the temporary output directory, removed (with its files) if the run dies */
static char *tmp_dir;

static void remove_tmp_dir(void)
{
	if (!tmp_dir)
		return;
	bk_remove_flat_dir(tmp_dir); /* best effort: we are dying */
	free(tmp_dir);
	tmp_dir = NULL;
}

/* module m of layer l when name is "<prefix>layers.L.PARENT.MOD.weight" (prefix
 * "model.", or a VLM's text tower's, bk_config_prefix); else -1 */
static int module_of(const char *name, const char *prefix, int *layer)
{
	int l, n = 0;
	char rest[64];
	size_t pl = strlen(prefix);
	if (strncmp(name, prefix, pl))
		return -1;
	name += pl;
	if (sscanf(name, "layers.%d.%63s%n", &l, rest, &n) != 2 || name[n])
		return -1;
	for (int m = 0; m < BK_PEFT_NMOD; m++) {
		char want[64];
		snprintf(want, sizeof want, "%s.%s.weight", bk_peft_mod_parent[m],
			 bk_peft_mod_names[m]);
		if (!strcmp(rest, want)) {
			*layer = l;
			return m;
		}
	}
	return -1;
}

static const char *torch_dtype_name(bk_dtype dt)
{
	return dt == BK_DT_F32 ? "float32" : dt == BK_DT_BF16 ? "bfloat16" : "float16";
}

/* config.json, its dtype key (dtype and/or torch_dtype) set when dtype is given */
static void write_config(const char *model_dir, const char *dir, int dtype)
{
	char *src = bk_path_join(model_dir, "config.json"), *dst = bk_path_join(dir, "config.json");
	size_t len;
	char *text = bk_read_file(src, &len);
	if (dtype == BK_MERGE_AUTO) {
		bk_write_file_atomic(dst, text, len);
	} else {
		json_error_t err;
		json_t *root = json_loadb(text, len, 0, &err);
		if (!root)
			die("%s: %s", src, bk_json_error(&err));
		if (!json_is_object(root))
			die("%s: not a JSON object", src);
		const char *name = torch_dtype_name((bk_dtype)dtype);
		/* transformers 5 writes "dtype", older versions "torch_dtype" */
		int has_new = json_object_get(root, "dtype") != NULL;
		if (has_new)
			json_object_set_new(root, "dtype", json_string(name));
		if (!has_new || json_object_get(root, "torch_dtype"))
			json_object_set_new(root, "torch_dtype", json_string(name));
		char *out = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		if (!out)
			BUG("json_dumps failed for %s", dst);
		size_t n = strlen(out);
		out = xrealloc(out, n + 2);
		out[n] = '\n';
		bk_write_file_atomic(dst, out, n + 1);
		free(out);
		json_decref(root);
	}
	free(text);
	free(src);
	free(dst);
}

static void copy_if_present(const char *model_dir, const char *dir, const char *name)
{
	char *src = bk_path_join(model_dir, name);
	if (bk_file_exists(src)) {
		char *dst = bk_path_join(dir, name);
		bk_map mp = bk_map_file(src);
		bk_write_file_atomic(dst, mp.data, mp.len);
		bk_unmap(&mp);
		free(dst);
	}
	free(src);
}

static int dir_is_empty(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		die("%s: %s", path, strerror(errno));
	struct dirent *e;
	int empty = 1;
	while (empty && (e = readdir(d)))
		empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
	closedir(d);
	return empty;
}

bk_merge_stats bk_merge_model(const char *model_dir, const bk_adapter *ad, const char *out_dir,
			      int dtype)
{
	bk_merge_stats stats = {0};
	struct stat sb;
	if (!stat(out_dir, &sb) && (!S_ISDIR(sb.st_mode) || !dir_is_empty(out_dir)))
		die("%s: already exists; remove it or choose another output directory", out_dir);
	bk_config *cfg = bk_config_load(model_dir);
	bk_st *st = bk_st_open(model_dir);
	bk_config_check_st(cfg, st);
	if (ad->n_layers != cfg->n_layers)
		BUG("adapter of %d layers on a model of %d", ad->n_layers, cfg->n_layers);

	static int registered;
	if (!registered) {
		bk_atexit(remove_tmp_dir);
		registered = 1;
	}
	size_t ol = strlen(out_dir);
	while (ol > 1 && out_dir[ol - 1] == '/')
		ol--;
	tmp_dir = xasprintf("%.*s.tmp.%ld", (int)ol, out_dir, (long)getpid());
	bk_mkdir_p(tmp_dir);

	bk_st_writer *w = bk_st_writer_new();
	bk_st_writer_meta(w, "format", "pt");
	float scale = (float)(ad->alpha / ad->r);
	const char *prefix = bk_config_prefix(cfg, st);
	for (size_t i = 0; i < bk_st_count(st); i++) {
		const bk_st_tensor *t = bk_st_at(st, i);
		int layer = -1, m = module_of(t->name, prefix, &layer);
		bk_dtype dt = dtype == BK_MERGE_AUTO ? t->dtype : (bk_dtype)dtype;
		int merge = m >= 0 && layer < ad->n_layers && (ad->targets & (1u << m));
		stats.tensors++;
		stats.bytes += (size_t)bk_st_numel(t) * bk_dtype_size(dt);
		if (!merge && dt == t->dtype) {
			bk_st_writer_add(w, t->name, dt, t->ndim, t->shape, t->data);
			continue;
		}
		size_t n = (size_t)bk_st_numel(t);
		float *f = xmalloc((n ? n : 1) * sizeof(float));
		bk_convert_to_f32(t->dtype, t->data, n, f);
		if (merge) {
			if (t->ndim != 2 || t->shape[0] != ad->out[m] || t->shape[1] != ad->in[m])
				BUG("%s: shape does not match the adapter's module", t->name);
			bk_merge_fold(f, bk_adapter_a(ad, layer, m), bk_adapter_b(ad, layer, m),
				      ad->out[m], ad->in[m], ad->r, scale);
			stats.merged++;
		}
		bk_st_writer_add_f32(w, t->name, dt, t->ndim, t->shape, f);
		free(f);
	}
	int want = 0; /* every targeted module of every layer folded, or no result */
	for (int m = 0; m < BK_PEFT_NMOD; m++)
		want += (ad->targets >> m & 1) * ad->n_layers;
	if ((int)stats.merged != want)
		die("%s: %d of the adapter's %d modules found under '%slayers.'", model_dir,
		    (int)stats.merged, want, prefix);
	char *st_path = bk_path_join(tmp_dir, "model.safetensors");
	bk_st_writer_write(w, st_path);
	free(st_path);
	bk_st_writer_free(w);
	bk_st_close(st);
	bk_config_free(cfg);

	write_config(model_dir, tmp_dir, dtype);
	static const char *const files[] = {
		"tokenizer.model",     "tokenizer.json",      "tokenizer_config.json",
		"special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
		"generation_config.json",
	};
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
		copy_if_present(model_dir, tmp_dir, files[i]);

	char *final = xstrndup(out_dir, ol);
	if (rename(tmp_dir, final) != 0)
		die("%s: cannot rename %s to it: %s", final, tmp_dir, strerror(errno));
	free(final);
	free(tmp_dir);
	tmp_dir = NULL;
	return stats;
}
