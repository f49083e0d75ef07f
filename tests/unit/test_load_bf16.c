/* test_load_bf16.c - loading without a host copy of the model (gpu/load.c load_bf16,
 * ops->weight_upload_bf16): the weights stream from the mapped checkpoint in bf16 chunks.
 *  1. On the host twin with a test weight_upload_bf16 that expands the chunks (odd chunk
 *     sizes): a bf16 checkpoint gives the host twin's own weights bit for bit, an fp16 or
 *     fp32 one those weights rounded to bf16 (Llama, Qwen-2 biases, Gemma-3 norms).
 *  2. On the CUDA ops (the emulation, or a GPU): every device weight of the streamed load
 *     equals, byte for byte, that of the fp32 path (weight_upload; the op table without
 *     weight_upload_bf16), for bf16, fp16 and fp32 checkpoints, a tensor of several
 *     staging chunks among them; a NaN in the checkpoint dies naming the tensor.
 *  3. The host memory of a load: peak private memory (RssAnon, less the emulated
 *     device memory, which lives in this process) above the level before it, sampled at
 *     every upload and every chunk, is at most the staging (cuda_wload.cuh: 2 x 2 MiB)
 *     plus 1 MiB, on a model whose largest tensor in fp32 is 12 MiB and whole bf16 copy
 *     22 MiB: a host copy of a tensor or of the model fails it.
 * `test_load_bf16 DIR` measures (3) on the model in DIR and prints it. */
#include "tests/harness.h"

#include <malloc.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "common/rng.h"
#include "formats/safetensors.h"
#include "gpu/load.h"
#ifdef BK_HAVE_CUDA
#include "gpu/cuda/cuda.h"
#include "gpu/device.h"
#endif

static char tmp[256];

/* ---- a random checkpoint ---- */

enum { LLAMA, LLAMA_TIED, QWEN2, GEMMA3 };
typedef struct {
	int kind;
	long H, I, L, NH, NKV, D, V;
} shape;

static const char *g_poison; /* a tensor written with a NaN at index 5 */

static void add(bk_st_writer *w, bk_rng *r, bk_dtype dt, const char *name, long rows, long cols,
		float base, float a, float **keep)
{
	size_t n = (size_t)rows * cols;
	float *p = xmalloc(n * sizeof *p);
	for (size_t i = 0; i < n; i++)
		p[i] = base + a * (float)(2 * bk_rng_uniform(r) - 1);
	if (g_poison && !strcmp(name, g_poison))
		p[5] = NAN;
	int64_t sh[2] = {rows, cols};
	if (rows == 1)
		bk_st_writer_add_f32(w, name, dt, 1, sh + 1, p);
	else
		bk_st_writer_add_f32(w, name, dt, 2, sh, p);
	*keep = p; /* the writer references the converted copy; freed by the caller */
}

static char *write_model(const char *name, const shape *s, bk_dtype dt, uint64_t seed)
{
	char *dir = xasprintf("%s/%s", tmp, name);
	bk_mkdir_p(dir);
	bk_rng r;
	bk_rng_seed(&r, seed);
	bk_st_writer *w = bk_st_writer_new();
	BK_VEC(float *) keep = {0};
	float *p;
	char nm[160];
	int gemma = s->kind == GEMMA3, tied = s->kind == LLAMA_TIED || gemma;
	float nb = gemma ? 0.0f : 1.0f; /* Gemma's norms are 1 + w */
#define T(rows, cols, base, a)                                                         \
	do {                                                                           \
		add(w, &r, dt, nm, rows, cols, base, a, &p);                           \
		bk_vec_push(&keep, p);                                                 \
	} while (0)
	for (long l = 0; l < s->L; l++) {
		static const char *const mods[7] = {"self_attn.q_proj", "self_attn.k_proj",
						    "self_attn.v_proj", "self_attn.o_proj",
						    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
		long rows[7] = {s->NH * s->D, s->NKV * s->D, s->NKV * s->D, s->H, s->I, s->I, s->H};
		long cols[7] = {s->H, s->H, s->H, s->NH * s->D, s->H, s->H, s->I};
		for (int m = 0; m < 7; m++) {
			snprintf(nm, sizeof nm, "model.layers.%ld.%s.weight", l, mods[m]);
			T(rows[m], cols[m], 0, 0.05f);
		}
		const char *norms[4] = {"input_layernorm", "post_attention_layernorm",
					"pre_feedforward_layernorm", "post_feedforward_layernorm"};
		for (int k = 0; k < (gemma ? 4 : 2); k++) {
			snprintf(nm, sizeof nm, "model.layers.%ld.%s.weight", l, norms[k]);
			T(1, s->H, nb, 0.1f);
		}
		if (gemma)
			for (int k = 0; k < 2; k++) {
				snprintf(nm, sizeof nm, "model.layers.%ld.self_attn.%c_norm.weight", l,
					 "qk"[k]);
				T(1, s->D, 0, 0.1f);
			}
		if (s->kind == QWEN2)
			for (int k = 0; k < 3; k++) {
				snprintf(nm, sizeof nm, "model.layers.%ld.self_attn.%c_proj.bias", l,
					 "qkv"[k]);
				T(1, (k ? s->NKV : s->NH) * s->D, 0, 0.1f);
			}
	}
	snprintf(nm, sizeof nm, "model.embed_tokens.weight");
	T(s->V, s->H, 0, 0.05f);
	snprintf(nm, sizeof nm, "model.norm.weight");
	T(1, s->H, nb, 0.1f);
	if (!tied) {
		snprintf(nm, sizeof nm, "lm_head.weight");
		T(s->V, s->H, 0, 0.05f);
	}
#undef T
	char *path = bk_path_join(dir, "model.safetensors");
	bk_st_writer_write(w, path);
	bk_st_writer_free(w);
	free(path);
	for (size_t i = 0; i < keep.n; i++)
		free(keep.v[i]);
	free(keep.v);
	char *cfg;
	const char *tdt = dt == BK_DT_BF16 ? "bfloat16" : dt == BK_DT_F16 ? "float16" : "float32";
	if (gemma)
		cfg = xasprintf(
			"{\"architectures\": [\"Gemma3ForCausalLM\"], \"model_type\": \"gemma3_text\","
			" \"hidden_size\": %ld, \"num_attention_heads\": %ld, \"num_key_value_heads\": %ld,"
			" \"head_dim\": %ld, \"intermediate_size\": %ld, \"num_hidden_layers\": %ld,"
			" \"vocab_size\": %ld, \"rms_norm_eps\": 1e-6,"
			" \"hidden_activation\": \"gelu_pytorch_tanh\", \"query_pre_attn_scalar\": %ld,"
			" \"sliding_window\": 6, \"attn_logit_softcapping\": 20.0,"
			" \"final_logit_softcapping\": 15.0, \"rope_theta\": 1000000.0,"
			" \"rope_local_base_freq\": 10000.0, \"max_position_embeddings\": 512,"
			" \"tie_word_embeddings\": true, \"bos_token_id\": 1, \"eos_token_id\": 2,"
			" \"pad_token_id\": 0, \"torch_dtype\": \"%s\"}\n",
			s->H, s->NH, s->NKV, s->D, s->I, s->L, s->V, s->D, tdt);
	else
		cfg = xasprintf(
			"{\"architectures\": [\"%s\"], \"model_type\": \"%s\", \"hidden_size\": %ld,"
			" \"intermediate_size\": %ld, \"num_hidden_layers\": %ld,"
			" \"num_attention_heads\": %ld, \"num_key_value_heads\": %ld, \"head_dim\": %ld,"
			" \"vocab_size\": %ld, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-05,"
			" \"rope_theta\": 10000.0, \"hidden_act\": \"silu\", \"tie_word_embeddings\": %s,"
			" \"bos_token_id\": 1, \"eos_token_id\": 2, \"torch_dtype\": \"%s\"}\n",
			s->kind == QWEN2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM",
			s->kind == QWEN2 ? "qwen2" : "llama", s->H, s->I, s->L, s->NH, s->NKV, s->D,
			s->V, tied ? "true" : "false", tdt);
	path = bk_path_join(dir, "config.json");
	bk_write_file_atomic(path, cfg, strlen(cfg));
	free(path);
	free(cfg);
	return dir;
}

/* ---- the weights of two models, handle by handle ---- */

typedef void (*weight_fn)(void *ctx, const char *what, const bk_weight *a, const bk_weight *b);

static void each_weight(const bk_model *a, const bk_model *b, weight_fn fn, void *ctx)
{
	char what[64];
	fn(ctx, "embed", a->embed, b->embed);
	fn(ctx, "final_norm", a->final_norm, b->final_norm);
	fn(ctx, "lm_head", a->lm_head, b->lm_head);
	for (int l = 0; l < a->cfg.L; l++) {
		const bk_layer *x = &a->layers[l], *y = &b->layers[l];
		for (int m = 0; m < BK_LORA_NMOD; m++) {
			snprintf(what, sizeof what, "layer %d %s", l, bk_lora_module_names[m]);
			fn(ctx, what, x->w[m], y->w[m]);
		}
		const bk_weight *wx[] = {x->attn_norm, x->mlp_norm, x->bq, x->bk, x->bv, x->q_norm,
					 x->k_norm, x->post_attn_norm, x->post_mlp_norm};
		const bk_weight *wy[] = {y->attn_norm, y->mlp_norm, y->bq, y->bk, y->bv, y->q_norm,
					 y->k_norm, y->post_attn_norm, y->post_mlp_norm};
		for (int k = 0; k < 9; k++) {
			snprintf(what, sizeof what, "layer %d weight %d", l, k);
			CHECK(!wx[k] == !wy[k], "%s: present in one model only", what);
			if (wx[k] && wy[k])
				fn(ctx, what, wx[k], wy[k]);
		}
	}
}

typedef struct {
	const char *model;
	const bk_ops *ops;
	size_t esize;  /* bytes per element of the weights' storage */
	int round_b;   /* compare a with b rounded to bf16 (host twin, fp16/fp32 checkpoint) */
	size_t tensors;
} cmp_ctx;

static void cmp_weight(void *ctx, const char *what, const bk_weight *a, const bk_weight *b)
{
	cmp_ctx *c = ctx;
	CHECK(a->rows == b->rows && a->cols == b->cols && a->kind == b->kind,
	      "%s %s: %d x %d kind %d vs %d x %d kind %d", c->model, what, a->rows, a->cols,
	      a->kind, b->rows, b->cols, b->kind);
	size_t n = (size_t)a->rows * a->cols, bytes = n * c->esize;
	char *x = xmalloc(bytes), *y = xmalloc(bytes);
	c->ops->download(x, a->data, bytes);
	c->ops->download(y, b->data, bytes);
	if (c->round_b)
		for (size_t i = 0; i < n; i++) {
			float *f = (float *)y + i;
			*f = bk_bf16_to_f32(bk_f32_to_bf16(*f));
		}
	size_t i = 0;
	while (i < bytes && x[i] == y[i])
		i++;
	CHECK(i == bytes, "%s %s [%d x %d]: streamed and fp32 path differ at element %zu",
	      c->model, what, a->rows, a->cols, i / c->esize);
	c->tensors++;
	free(x), free(y);
}

/* ---- 1. the host twin with an expanding weight_upload_bf16 ---- */

static bk_ops g_host16;

/* the chunks in odd sizes, so that offsets inside rows and tensors are exercised */
static bk_weight *host_upload_bf16(int rows, int cols, bk_bf16_fill fill, void *ctx)
{
	size_t n = (size_t)rows * cols, chunk = 777;
	float *f = xmalloc(n * sizeof *f);
	uint16_t *h = xmalloc(chunk * sizeof *h);
	for (size_t off = 0; off < n; off += chunk) {
		size_t m = n - off < chunk ? n - off : chunk;
		fill(ctx, off, m, h);
		for (size_t i = 0; i < m; i++)
			f[off + i] = bk_bf16_to_f32(h[i]);
	}
	bk_weight *w = bk_ops_host.weight_upload(f, rows, cols);
	free(h), free(f);
	return w;
}

static void test_host(const char *name, const char *dir, int rounded)
{
	g_host16 = bk_ops_host;
	g_host16.weight_upload_bf16 = host_upload_bf16;
	bk_loaded_model s = bk_model_load(&g_host16, dir), f = bk_model_load(&bk_ops_host, dir);
	cmp_ctx c = {name, &bk_ops_host, sizeof(float), rounded, 0};
	each_weight(s.model, f.model, cmp_weight, &c);
	printf("host twin, %s: %zu tensors streamed in bf16 chunks equal the fp32 path's%s\n", name,
	       c.tensors, rounded ? " rounded to bf16" : "");
	bk_model_unload(&s);
	bk_model_unload(&f);
}

#ifdef BK_HAVE_CUDA
/* ---- 2. the CUDA ops: streamed vs the fp32 path ---- */

/* copies of the table: gpu/load.c shares weights only on bk_ops_cuda itself, so these
 * load own copies without a word */
static void test_cuda(const char *name, const char *dir)
{
	bk_ops s16 = bk_ops_cuda, fp32 = bk_ops_cuda;
	fp32.weight_upload_bf16 = NULL; /* gpu/model.c then takes the fp32 path */
	bk_loaded_model s = bk_model_load(&s16, dir), f = bk_model_load(&fp32, dir);
	cmp_ctx c = {name, &bk_ops_cuda, 2, 0, 0};
	each_weight(s.model, f.model, cmp_weight, &c);
	printf("cuda, %s: %zu device weights streamed equal the fp32 path's\n", name, c.tensors);
	bk_model_unload(&s);
	bk_model_unload(&f);
}

static void load_cuda(void *dir)
{
	bk_ops ops = bk_ops_cuda;
	bk_loaded_model m = bk_model_load(&ops, dir);
	bk_model_unload(&m);
}

/* ---- 3. host memory at load ---- */

/* private memory now: RssAnon, less the emulated device memory (host memory of this
 * process under the emulation; on a GPU device memory is not in RssAnon) */
static size_t private_bytes(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	size_t kb = 0;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "RssAnon: %zu kB", &kb) == 1)
			break;
	if (f)
		fclose(f);
	size_t b = kb << 10;
#ifdef BK_CUDA_EMU
	size_t dev = bk_cuda_mem_used();
	b = b > dev ? b - dev : 0;
#endif
	return b;
}

static size_t g_peak;
static bk_bf16_fill g_fill;
static void sample(void)
{
	size_t p = private_bytes();
	if (p > g_peak)
		g_peak = p;
}
static void fill_sampled(void *ctx, size_t off, size_t n, uint16_t *out)
{
	g_fill(ctx, off, n, out);
	sample();
}
static bk_weight *up16_sampled(int rows, int cols, bk_bf16_fill fill, void *ctx)
{
	sample();
	g_fill = fill;
	bk_weight *w = bk_ops_cuda.weight_upload_bf16(rows, cols, fill_sampled, ctx);
	sample();
	return w;
}
static bk_weight *up_sampled(const float *host, int rows, int cols)
{
	sample(); /* the caller's fp32 tensor is here */
	bk_weight *w = bk_ops_cuda.weight_upload(host, rows, cols);
	sample();
	return w;
}

#define STAGING ((size_t)4 << 20) /* cuda_wload.cuh: 2 buffers of WL_CHUNK bf16 */
#define SLACK ((size_t)1 << 20)

/* in a child: the load's peak private memory above the level before it; exit 0 when
 * within STAGING + SLACK */
static void measure(void *dir)
{
	/* blocks of 128 KiB and more mapped on their own and unmapped when freed, so that
	 * RssAnon follows what is live: the emulated device memory comes from this heap too,
	 * and its holes (glibc's dynamic threshold puts the staging there) would count as
	 * the load's (120 MiB of 240 at a Llama-8B-like shape); on a GPU neither is here */
	mallopt(M_MMAP_THRESHOLD, 128 << 10);
#ifdef __SANITIZE_ADDRESS__
	/* ASan's allocator keeps freed blocks in quarantine: RssAnon says nothing here */
	fprintf(stderr, "%s: host memory not measured under ASan\n", (char *)dir);
	_exit(0);
#endif
	bk_ops ops = bk_ops_cuda;
	if (ops.weight_upload_bf16)
		ops.weight_upload_bf16 = up16_sampled;
	ops.weight_upload = up_sampled;
	bk_ops_cuda.free(bk_ops_cuda.alloc(256)); /* the context and cuBLAS before the baseline */
	size_t base = private_bytes();
	g_peak = base;
	bk_loaded_model m = bk_model_load(&ops, dir);
	size_t dev = 0, peak_dev;
	bk_cuda_mem_stats(&dev, &peak_dev);
	size_t extra = g_peak - base;
	fprintf(stderr, "%s: device weights %.1f MiB; peak private host memory of the load %.2f "
		"MiB above %.1f MiB (bound %.1f MiB)\n", (char *)dir, dev / 1048576.0,
		extra / 1048576.0, base / 1048576.0, (STAGING + SLACK) / 1048576.0);
	bk_model_unload(&m);
	_exit(extra <= STAGING + SLACK ? 0 : 1);
}
#endif

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
#ifdef BK_HAVE_CUDA
	if (argc > 1) {
		char err[4096];
		int st = bk_run_child(measure, argv[1], err, sizeof err);
		fputs(err, stdout);
		return st;
	}
#endif
	(void)argc;
	snprintf(tmp, sizeof tmp, "%s/bk-ld.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp))
		die("mkdtemp");
	char *cache = xasprintf("%s/cache", tmp);
	setenv("XDG_CACHE_HOME", cache, 1);
	const shape small = {LLAMA, 64, 160, 2, 2, 1, 32, 300};
	const shape tied = {LLAMA_TIED, 64, 160, 2, 2, 1, 32, 300};
	const shape qwen = {QWEN2, 64, 96, 2, 2, 1, 32, 200};
	const shape gemma = {GEMMA3, 64, 96, 2, 2, 1, 32, 200};
	char *m16 = write_model("llama-bf16", &small, BK_DT_BF16, 1);
	char *mf16 = write_model("llama-f16", &small, BK_DT_F16, 2);
	char *mf32 = write_model("llama-f32", &small, BK_DT_F32, 3);
	char *mt = write_model("tied-bf16", &tied, BK_DT_BF16, 4);
	char *mq = write_model("qwen2-bf16", &qwen, BK_DT_BF16, 5);
	char *mg = write_model("gemma3-bf16", &gemma, BK_DT_BF16, 6);
	char *mg32 = write_model("gemma3-f32", &gemma, BK_DT_F32, 7);
	test_host("llama bf16", m16, 0);
	test_host("llama tied bf16", mt, 0);
	test_host("qwen2 bf16", mq, 0);
	test_host("gemma3 bf16", mg, 0);
	test_host("llama f16", mf16, 1);
#ifdef BK_HAVE_CUDA
	const char *why = NULL;
	if (bk_cuda_device_count(&why) <= 0) {
		printf("test_load_bf16: no CUDA device (%s): tests/t0951-emu-load.sh runs the CUDA "
		       "part on the emulated one\n", why ? why : "none");
	} else {
		/* a tensor of several staging chunks (cuda_wload.cuh: 2^20): the embedding */
		const shape big = {LLAMA, 256, 768, 6, 4, 2, 64, 12288};
		char *mb = write_model("big-bf16", &big, BK_DT_BF16, 8);
		/* the children first, before this process has a CUDA context */
		char err[4096];
		int st = bk_run_child(measure, mb, err, sizeof err);
		fputs(err, stdout);
		CHECK(st == 0, "the load's host memory is above the staging: %s", err);
		g_poison = "model.layers.1.mlp.up_proj.weight";
		char *mn = write_model("nan-bf16", &small, BK_DT_BF16, 9);
		g_poison = NULL;
		bk_expect_die("a NaN weight", load_cuda, mn, "tensor 'model.layers.1.mlp.up_proj.weight'",
			      "non-finite value (nan) at index 5");
		test_cuda("llama bf16", m16);
		test_cuda("llama f16", mf16);
		test_cuda("llama f32", mf32);
		test_cuda("llama tied bf16", mt);
		test_cuda("qwen2 bf16", mq);
		test_cuda("gemma3 bf16", mg);
		test_cuda("gemma3 f32", mg32);
		test_cuda("big bf16", mb);
		free(mb), free(mn);
	}
#endif
	char *rm = xasprintf("rm -rf '%s'", tmp);
	if (system(rm))
		warn("cannot remove %s", tmp);
	free(rm), free(cache), free(m16), free(mf16), free(mf32), free(mt), free(mq), free(mg),
		free(mg32);
	return bk_test_done("test_load_bf16");
}
