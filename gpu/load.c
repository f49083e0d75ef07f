/* load.c - see load.h. */
#include "load.h"
#include "common/diag.h"
#include "common/files.h"
#include "common/hash.h"
#include "gpu/cuda/cuda.h"
#include "gpu/cuda/cuda_vmm.h"
#include "formats/stream.h"
#include "gpu/wshare.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

/* The fingerprint cache: a model's fingerprint is a function of its files' bytes, which
 * a full read costs every stage of every run (XXH3 at memory speed, but 16 GB of an 8B
 * model from disk).  The cache keeps it under a key that changes whenever a file may
 * have changed: config.json's bytes, and per safetensors file the sha256 name of its HF
 * cache blob when it is one (content-addressed: .../blobs/<64 hex>), else its path,
 * device, inode, size and mtime (nanoseconds).  A file modified less than 2 s before the
 * fingerprint was computed is not cached (it may change again within the mtime's
 * granularity, git's "racy" case).  Entries live in $XDG_CACHE_HOME/bakery/fingerprints
 * (default ~/.cache/bakery), one small file each, written atomically; a cache that
 * cannot be written is skipped silently (the fingerprint is then computed each time). */
static char *fp_cache_dir(void)
{
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	return xdg && *xdg ? xasprintf("%s/bakery/fingerprints", xdg)
			   : xasprintf("%s/.cache/bakery/fingerprints", home && *home ? home : "/tmp");
}

/* the HF cache blob name (64 hex digits) a path resolves to, or NULL */
static char *hf_blob_name(const char *path)
{
	char *real = realpath(path, NULL);
	if (!real)
		return NULL;
	char *base = strrchr(real, '/');
	int ok = base && base - real >= 6 && !strncmp(base - 6, "/blobs", 6) &&
		 strlen(base + 1) == 64 && strspn(base + 1, "0123456789abcdef") == 64;
	char *name = ok ? xstrdup(base + 1) : NULL;
	free(real);
	return name;
}

/* the cache key of dir's fingerprint (config text, the safetensors files of s);
 * *racy set when a file changed in the last 2 s */
static uint64_t fp_key(const char *cfg_text, size_t cfg_len, const bk_st *s, int *racy)
{
	XXH3_state_t *st = XXH3_createState();
	if (!st)
		die("out of memory");
	XXH3_64bits_reset(st);
	static const char tag[] = "bakery-fingerprint-key-1";
	XXH3_64bits_update(st, tag, sizeof tag);
	XXH3_64bits_update(st, cfg_text, cfg_len);
	*racy = 0;
	const char *prev = NULL;
	time_t now = time(NULL);
	for (size_t i = 0; i < bk_st_count(s); i++) {
		const char *f = bk_st_at(s, i)->file;
		if (prev && !strcmp(prev, f))
			continue;
		int seen = 0; /* tensors are sorted by name: a shard's may interleave */
		for (size_t j = 0; j < i && !seen; j++)
			seen = !strcmp(bk_st_at(s, j)->file, f);
		prev = f;
		if (seen)
			continue;
		XXH3_64bits_update(st, f, strlen(f) + 1);
		char *blob = hf_blob_name(f);
		if (blob) {
			XXH3_64bits_update(st, blob, strlen(blob) + 1);
			free(blob);
			continue;
		}
		struct stat sb;
		if (stat(f, &sb)) {
			*racy = 1;
			continue;
		}
		uint64_t v[6] = {(uint64_t)sb.st_dev, (uint64_t)sb.st_ino, (uint64_t)sb.st_size,
				 (uint64_t)sb.st_mtim.tv_sec, (uint64_t)sb.st_mtim.tv_nsec,
				 (uint64_t)sb.st_ctim.tv_sec};
		XXH3_64bits_update(st, v, sizeof v);
		if (now - sb.st_mtim.tv_sec < 2)
			*racy = 1;
	}
	uint64_t k = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return k;
}

/* the fingerprint of the bytes: config.json and every tensor, read in full */
static void fp_full(const char *cfg_text, size_t cfg_len, const bk_st *s, char out[17])
{
	XXH3_state_t *st = XXH3_createState();
	if (!st)
		die("out of memory");
	XXH3_64bits_reset(st);
	XXH3_64bits_update(st, cfg_text, cfg_len);
	/* every tensor: name, dtype, shape and all its bytes, so that two checkpoints
	 * differing in one weight differ */
	for (size_t i = 0; i < bk_st_count(s); i++) {
		const bk_st_tensor *t = bk_st_at(s, i);
		XXH3_64bits_update(st, t->name, strlen(t->name));
		XXH3_64bits_update(st, t->shape, sizeof t->shape);
		XXH3_64bits_update(st, &t->dtype, sizeof t->dtype);
		XXH3_64bits_update(st, t->data, t->nbytes);
	}
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

static void fingerprint(const char *dir, char out[17], int use_cache)
{
	char *cfg = bk_path_join(dir, "config.json");
	size_t n;
	char *text = bk_read_file(cfg, &n);
	free(cfg);
	bk_st *s = bk_st_open(dir);
	int racy = 0;
	uint64_t key = use_cache ? fp_key(text, n, s, &racy) : 0;
	char *cdir = use_cache ? fp_cache_dir() : NULL, kh[17], *path = NULL;
	if (use_cache) {
		bk_hash_hex(key, kh);
		path = xasprintf("%s/%s", cdir, kh);
		size_t len;
		char *hit = bk_try_read_file(path, &len);
		if (hit && len == 17 && hit[16] == '\n' && strspn(hit, "0123456789abcdef") == 16) {
			memcpy(out, hit, 16);
			out[16] = 0;
			free(hit), free(path), free(cdir), free(text);
			bk_st_close(s);
			return;
		}
		free(hit);
	}
	fp_full(text, n, s, out);
	bk_st_close(s);
	free(text);
	if (use_cache && !racy) { /* temporary, then rename: never a partial entry */
		char *p = xstrdup(cdir);
		for (char *q = p + 1; *q; q++)
			if (*q == '/') {
				*q = 0;
				mkdir(p, 0777);
				*q = '/';
			}
		mkdir(p, 0777);
		free(p);
		char *tmp = xasprintf("%s.tmp.%ld", path, (long)getpid());
		FILE *f = fopen(tmp, "w");
		int ok = f && fprintf(f, "%s\n", out) == 17;
		ok = f && !fclose(f) && ok;
		if (!ok || rename(tmp, path))
			unlink(tmp);
		free(tmp);
	}
	free(path);
	free(cdir);
}

void bk_model_fingerprint(const char *dir, char out[17])
{
	fingerprint(dir, out, 1);
}

void bk_model_fingerprint_full(const char *dir, char out[17])
{
	fingerprint(dir, out, 0);
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

/* the checkpoint as a bk_weight_source (model.h): names of HF's layout */
typedef struct {
	const bk_config *c;
	const bk_st *st;
	const char *pre;
} load_src;

/* the checkpoint's name of weight id of layer (-1: the model's own) into name; *norm:
 * a norm weight (read_norm's (1 + w) for Gemma) */
static void weight_name(const load_src *ls, int layer, int id, char name[256], int *norm)
{
	const bk_config *c = ls->c;
	*norm = 1;
	if (layer < 0) {
		*norm = id == BK_W_FINAL_NORM;
		if (id == BK_W_LM_HEAD)
			snprintf(name, 256, "%s", bk_config_lm_head(c, ls->st));
		else
			snprintf(name, 256, "%s%s", ls->pre,
				 id == BK_W_EMBED ? "embed_tokens.weight" : "norm.weight");
		return;
	}
	static const char *const lin[BK_LORA_NMOD] = {
		"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
		"self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
		"mlp.down_proj.weight"};
	const char *what = NULL;
	switch (id) {
	case BK_W_ATTN_NORM: what = "input_layernorm.weight"; break;
	case BK_W_MLP_NORM:
		what = c->sandwich ? "pre_feedforward_layernorm.weight"
				   : "post_attention_layernorm.weight";
		break;
	case BK_W_POST_ATTN_NORM: what = "post_attention_layernorm.weight"; break;
	case BK_W_POST_MLP_NORM: what = "post_feedforward_layernorm.weight"; break;
	case BK_W_Q_NORM: what = "self_attn.q_norm.weight"; break;
	case BK_W_K_NORM: what = "self_attn.k_norm.weight"; break;
	case BK_W_BQ: what = "self_attn.q_proj.bias", *norm = 0; break;
	case BK_W_BK: what = "self_attn.k_proj.bias", *norm = 0; break;
	case BK_W_BV: what = "self_attn.v_proj.bias", *norm = 0; break;
	default:
		BUG_ON(id < 0 || id >= BK_LORA_NMOD);
		what = lin[id], *norm = 0;
	}
	snprintf(name, 256, "%slayers.%d.%s", ls->pre, layer, what);
}

static const float *load_get(void *ctx, int layer, int id, int rows, int cols)
{
	const load_src *ls = ctx;
	char name[256];
	int norm;
	weight_name(ls, layer, id, name, &norm);
	return norm ? read_norm(ls->c, ls->st, name, cols) : read_tensor(ls->st, name, rows, cols);
}

static void load_put(void *ctx, const float *p)
{
	(void)ctx;
	free((void *)p);
}

static void load_fill(void *ctx, size_t off, size_t n, uint16_t *out)
{
	bk_st_read_bf16(ctx, off, n, out);
}

/* the tensor as it is in the mapped file, converted chunk by chunk into the device's
 * staging (Gemma's norms, 1 + w computed in fp32, go through load_get) */
static int load_bf16(void *ctx, int layer, int id, int rows, int cols, bk_bf16_fill *fill,
		     void **fill_ctx)
{
	const load_src *ls = ctx;
	char name[256];
	int norm;
	weight_name(ls, layer, id, name, &norm);
	if (norm && ls->c->norm_plus_one)
		return 0;
	int64_t shape[2] = {rows, cols}; /* the shapes read_tensor checks */
	const bk_st_tensor *t = rows == 1 ? bk_st_get(ls->st, name, 1, shape + 1)
					  : bk_st_get(ls->st, name, 2, shape);
	*fill = load_fill;
	*fill_ctx = (void *)t;
	return 1;
}

/* ---- one copy of the weights per GPU (load.h) ---- */

/* the layout of a shared copy: bump when the placement of weight_upload changes (2: the
 * 4-bit linears placed too, bk_wdesc with a kind and bytes) */
#define BK_WLAYOUT 2

struct bk_wshared {
#ifdef BK_HAVE_CUDA
	bk_vmm_map map;
#endif
	int unused;
};

#ifdef BK_HAVE_CUDA
/* the blob a server hands out (wshare.h): this header, then n bk_wdesc */
typedef struct {
	char key[224];  /* the key it was made under */
	uint64_t bytes; /* the mapped size of the allocation */
	uint64_t n;
} wblob_hdr;

/* a source that reads nothing: MEASURE and ATTACH take no numbers */
static const float *no_numbers(void *ctx, int layer, int id, int rows, int cols)
{
	(void)ctx, (void)layer, (void)id, (void)rows, (void)cols;
	static const float none = 0;
	return &none;
}

/* creates lm->model on the shared copy (found or made); 0: the caller loads its own */
static int load_shared(const bk_ops *ops, bk_loaded_model *lm, const bk_llama_config *mc,
		       const bk_weight_source *real)
{
	if (ops != &bk_ops_cuda)
		return 0;
	const char *why = NULL;
	char uuid[33], key[sizeof ((wblob_hdr *)0)->key];
	int fd = -1;
	void *blob = NULL;
	size_t len = 0;
	long pid = 0;
	bk_vmm_map map;
	bk_weight_source none = {no_numbers, NULL, NULL, NULL, 1};
	bk_wdesc *lay = NULL;
	size_t nlay = 0;
	if (!bk_wshare_enabled()) {
		why = "--no-share-weights or BK_SHARE_WEIGHTS=0";
		goto own;
	}
	if (!bk_vmm_supported(&why) || bk_vmm_device_uuid(uuid, &why))
		goto own;
	/* the 4-bit setting is the copy's: its codes (type, double quant) and the values they
	 * were quantised from (compute dtype bfloat16: rounded to bf16 first) */
	snprintf(key, sizeof key,
		 "bakery-weights device=%s model=%s dtype=bf16 q4=%s q4-threads=%d layout=%d", uuid,
		 lm->fingerprint, bk_q4_config_str(&mc->q4), mc->q4.threads, BK_WLAYOUT);
	char q4s[80] = ""; /* the notes say a 4-bit copy's setting */
	if (mc->q4.type)
		snprintf(q4s, sizeof q4s, "4-bit %s, ", bk_q4_config_str(&mc->q4));
	/* the layout: where each tensor goes (no numbers read) */
	bk_cuda_wplace_begin(BK_WPLACE_MEASURE, NULL, 0, NULL, 0);
	bk_model *mm = bk_model_create_from(ops, mc, &none);
	size_t used = bk_cuda_wplace_end(&lay, &nlay);
	bk_model_free(mm);
	int role = bk_wshare_join(key, &fd, &blob, &len, &pid, &why);
	if (role == BK_WSHARE_IMPORTED) {
		wblob_hdr h;
		const bk_wdesc *desc = (const bk_wdesc *)((const char *)blob + sizeof h);
		if (len >= sizeof h)
			memcpy(&h, blob, sizeof h);
		if (len < sizeof h || memchr(h.key, 0, sizeof h.key) == NULL || strcmp(h.key, key) ||
		    h.n > (len - sizeof h) / sizeof(bk_wdesc) ||
		    len != sizeof h + h.n * sizeof(bk_wdesc) || h.bytes < used) {
			why = "the shared copy's description is not this model's";
			goto own;
		}
		if (h.n != nlay || memcmp(desc, lay, nlay * sizeof *lay)) {
			why = "the shared copy's layout is another (a process of another bakery build?)";
			goto own;
		}
		if ((why = bk_vmm_import(fd, h.bytes, &map)))
			goto own;
		close(fd); /* the mapping holds the copy now */
		fd = -1;
		/* every tensor at the layout's offset, checked shape by shape (a
		 * difference dies: the fingerprint said it is the same model) */
		bk_cuda_wplace_begin(BK_WPLACE_ATTACH, map.ptr, map.bytes, desc, h.n);
		lm->model = bk_model_create_from(ops, mc, &none);
		bk_cuda_wplace_end(NULL, NULL);
		note("mapped the shared copy of the weights (%s%.1f MiB, served by process %ld)", q4s,
		     (double)map.bytes / (1 << 20), pid);
	} else if (role == BK_WSHARE_LOAD) {
		/* one allocation for the layout */
		const bk_wdesc *desc = lay;
		size_t n = nlay;
		if ((why = bk_vmm_create(used, &map, &fd))) {
			bk_wshare_abandon(key);
			if (why == bk_vmm_no_memory) /* an own copy would not fit either */
				bk_cuda_die_oom(BK_CUDA_SHARED_WEIGHTS, map.bytes);
			goto own;
		}
		bk_cuda_wplace_begin(BK_WPLACE_UPLOAD, map.ptr, map.bytes, desc, n);
		lm->model = bk_model_create_from(ops, mc, real);
		bk_cuda_wplace_end(NULL, NULL);
		wblob_hdr h;
		memset(&h, 0, sizeof h);
		snprintf(h.key, sizeof h.key, "%s", key);
		h.bytes = map.bytes;
		h.n = n;
		len = sizeof h + n * sizeof(bk_wdesc);
		blob = xmalloc(len);
		memcpy(blob, &h, sizeof h);
		memcpy((char *)blob + sizeof h, desc, n * sizeof(bk_wdesc));
		bk_wshare_serve(key, fd, blob, len); /* keeps fd */
		fd = -1;
		note("loaded the weights into a copy shared with the stages on this GPU (%s%.1f MiB)",
		     q4s, (double)map.bytes / (1 << 20));
	} else {
		goto own;
	}
	free(lay);
	free(blob);
	lm->shared = xcalloc(1, sizeof *lm->shared);
	lm->shared->map = map;
	return 1;
own:
	if (fd >= 0)
		close(fd);
	free(blob);
	free(lay);
	static int said;
	if (!said++)
		warn("not sharing the weights with the other stages on this GPU (%s): loading an own "
		     "copy", why ? why : "unknown reason");
	return 0;
}
#endif

bk_loaded_model bk_model_load(const bk_ops *ops, const char *dir)
{
	return bk_model_load_q4(ops, dir, NULL);
}

bk_loaded_model bk_model_load_q4(const bk_ops *ops, const char *dir, const bk_q4_config *q4)
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
	if (q4) {
		mc.q4 = *q4; /* the base linears quantised at create (gpu/model.h) */
		mc.q4.threads = bk_q4_config_threads(q4); /* explicit: the shared copy's key */
	}
	/* tensor by tensor from the mapped checkpoint: on a bf16 device (weight_upload_bf16)
	 * converted chunk by chunk into its staging, so the host holds no copy of a tensor
	 * (the peak is the staging buffer); else read into fp32, uploaded, freed, so the
	 * host holds at most one tensor in fp32 besides what the device keeps */
	load_src ls = {c, st, pre};
	bk_weight_source src = {load_get, load_put, &ls, load_bf16, 0};
	bk_model_fingerprint(dir, lm.fingerprint); /* the shared copy's key */
#ifdef BK_HAVE_CUDA
	if (!load_shared(ops, &lm, &mc, &src))
#endif
		lm.model = bk_model_create_from(ops, &mc, &src);
	free(inv_freq);
	free(inv_local);
	bk_st_close(st);
	return lm;
}

void bk_model_unload(bk_loaded_model *lm)
{
	bk_model_free(lm->model);
#ifdef BK_HAVE_CUDA
	if (lm->shared) { /* the weights' handles are gone: unmap the copy (ours, or the
			   * others' still) */
		bk_cuda_warena_drop(lm->shared->map.ptr);
		bk_vmm_unmap(&lm->shared->map);
	}
#endif
	free(lm->shared);
	bk_config_free(lm->cfg);
	lm->model = NULL;
	lm->cfg = NULL;
	lm->shared = NULL;
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

/* ---- the 4-bit setting from stage to stage ---- */

int bk_q4_prov(const bk_q4_config *q4, char buf[BK_Q4_PROV_BUF], bk_kv kv[2])
{
	snprintf(buf, BK_Q4_PROV_BUF, "%s", bk_q4_config_str(q4));
	kv[0] = BK_KV_S("load_in_4bit", buf);
	kv[1] = BK_KV_I("bnb_4bit_threads", bk_q4_config_threads(q4));
	return 2;
}

static void adopt(bk_q4_config *q4, const char *from, long n)
{
	int mine = bk_q4_config_threads(&(bk_q4_config){q4->type, q4->double_quant, 0, 0});
	if (n != mine)
		note("4-bit: double quantisation with %ld torch threads, as %s (this machine's: %d)",
		     n, from, mine);
	q4->threads = (int)n;
}

void bk_q4_adopt_stream(bk_q4_config *q4, const bk_reader *in)
{
	double n;
	char *s = bk_reader_prov_str(in, "load_in_4bit");
	if (q4->type && q4->double_quant && s && !strcmp(s, bk_q4_config_str(q4)) &&
	    bk_obj_number(bk_reader_prov(in, "bnb_4bit_threads"), &n) && n >= 1 && n <= 1 << 20 &&
	    n == (long)n) {
		char from[300];
		snprintf(from, sizeof from, "%s's stage did", bk_reader_name(in));
		adopt(q4, from, (long)n);
	}
	free(s);
	q4->threads = bk_q4_config_threads(q4);
}

int bk_q4_adopt_dir(bk_q4_config *q4, const char *dir)
{
	int done = 0;
	char *ts = bk_path_join(dir, "trainer_state.json");
	json_t *o = q4->type && q4->double_quant && bk_file_exists(ts) ? json_load_file(ts, 0, NULL)
								     : NULL;
	json_t *set = json_object_get(o, "settings");
	const char *s = json_string_value(json_object_get(set, "load-in-4bit"));
	const char *t = json_string_value(json_object_get(set, "torch-threads"));
	char *end;
	long n = t ? strtol(t, &end, 10) : 0;
	if (s && !strcmp(s, bk_q4_config_str(q4)) && t && !*end && n >= 1 && n <= 1 << 20) {
		char from[300];
		snprintf(from, sizeof from, "%s was trained", dir);
		adopt(q4, from, n);
		done = 1;
	}
	json_decref(o);
	free(ts);
	q4->threads = bk_q4_config_threads(q4);
	return done;
}
