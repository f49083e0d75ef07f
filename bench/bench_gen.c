/* bench_gen.c - the generation benchmark of tests/gpu/run.sh on a TinyLlama-1.1B-shaped
 * random model (22 layers, hidden 2048, intermediate 5632, 32 heads, 4 KV heads, vocab
 * 32000; random bf16 weights written as a safetensors model directory with config.json
 * and the llama2 tokenizer; the LM head at 8/sqrt(H), so next-token distributions are
 * peaked as a trained model's rather than flat), through the engine of gpu/gen.h.
 * Prompts: BOS + a 199-token shared system prompt + a 30-token user message.
 *   greedy rows (bandwidth): batch 1, 8 and 64 (that many prompts, one sample each, 64
 *     new tokens, all decoding together): tokens/s, decode step time, and the fraction
 *     of the device-to-device copy bandwidth measured in the same run that the step's
 *     bytes (bf16 linears + LM head + the KV rows read) make;
 *   sampling rows (temperature 0.8, top-p 0.9): batch 64 as above, then the whole job,
 *     256 prompts x 4 trajectories x 128 new tokens at up to 256 in flight.
 * Each row also gives the allocator's peak memory.  One "bench_gen: mode=... batch=..."
 * line per row for tests/gpu/run.sh; tests/gpu/hf_gen.py does the same rows with HF.
 * Not a correctness check (check_gen is).
 * Usage: bench_gen [--device cuda|cpu] [--quick] [--tiny] [--keep DIR]
 *   --quick: 2 layers, 64 prompts;  --tiny: a 2-layer H=64 model and 8 prompts (the
 *   host twin in the dry run of tests/gpu/run.sh);  --keep DIR: write the model there
 *   (with prompts.txt, one line of token ids per prompt) and keep it
 *        bench_gen --write-only DIR   (the 2-layer model directory, loaded back on the
 *        host to check it) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "common/rng.h"
#include "formats/safetensors.h"
#include "gpu/cuda/cuda.h"
#include "gpu/device.h"
#include "gpu/gen.h"
#include "gpu/load.h"

static int H = 2048, I = 5632, NH = 32, NKV = 4, HD = 64, V = 32000, SYS = 199, USER = 30;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* random bf16 [rows,cols] uniform in (-scale, scale), or all `one` when scale is 0 */
static uint16_t *rand_bf16(bk_rng *r, size_t n, float scale, float one)
{
	uint16_t *p = xmalloc(n * sizeof(*p));
	for (size_t i = 0; i < n; i++)
		p[i] = bk_f32_to_bf16(scale > 0 ? scale * (float)(2 * bk_rng_uniform(r) - 1) : one);
	return p;
}

static void write_model(const char *dir, int L)
{
	char *p = xasprintf("%s/config.json", dir);
	FILE *f = fopen(p, "w");
	if (!f)
		die("%s: cannot write", p);
	fprintf(f, "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", "
		   "\"hidden_size\": %d, \"intermediate_size\": %d, \"num_hidden_layers\": %d, "
		   "\"num_attention_heads\": %d, \"num_key_value_heads\": %d, \"head_dim\": %d, "
		   "\"vocab_size\": %d, \"max_position_embeddings\": 2048, \"rms_norm_eps\": 1e-05, "
		   "\"rope_theta\": 10000.0, \"hidden_act\": \"silu\", \"tie_word_embeddings\": false, "
		   "\"attention_bias\": false, \"mlp_bias\": false, \"bos_token_id\": 1, "
		   "\"eos_token_id\": 2, \"torch_dtype\": \"bfloat16\"}\n",
		H, I, L, NH, NKV, HD, V);
	if (fclose(f))
		die("%s: write failed", p);
	free(p);
	/* the tokenizer, for completeness of the directory */
	size_t n;
	char *tok = bk_read_file("models/llama2-tokenizer/tokenizer.model", &n);
	p = xasprintf("%s/tokenizer.model", dir);
	f = fopen(p, "wb");
	if (!f || fwrite(tok, 1, n, f) != n || fclose(f))
		die("%s: cannot write", p);
	free(p);
	free(tok);

	bk_rng r;
	bk_rng_seed(&r, 42);
	bk_st_writer *w = bk_st_writer_new();
	BK_VEC(void *) keep = { 0 };
	BK_VEC(char *) names = { 0 };
#define ADD(name, n0, n1, scale, one)                                                    \
	do {                                                                           \
		int64_t shp_[2] = { (n0), (n1) };                                      \
		int nd_ = (n0) == 1 ? 1 : 2;                                           \
		void *d_ = rand_bf16(&r, (size_t)(n0) * (n1), (scale), (one));         \
		char *n_ = (name); /* evaluated once: it allocates */                  \
		bk_vec_push(&keep, d_);                                                \
		bk_vec_push(&names, n_);                                               \
		bk_st_writer_add(w, n_, BK_DT_BF16, nd_, nd_ == 1 ? shp_ + 1 : shp_, d_); \
	} while (0)
	ADD(xstrdup("model.embed_tokens.weight"), V, H, 0.02f, 0);
	ADD(xstrdup("model.norm.weight"), 1, H, 0, 1);
	ADD(xstrdup("lm_head.weight"), V, H, 8.0f / sqrtf((float)H), 0);
	for (int l = 0; l < L; l++) {
		static const char *const mods[] = { "self_attn.q_proj", "self_attn.k_proj",
						    "self_attn.v_proj", "self_attn.o_proj",
						    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj" };
		const int rows[] = { NH * HD, NKV * HD, NKV * HD, H, I, I, H };
		const int cols[] = { H, H, H, NH * HD, H, H, I };
		for (int m = 0; m < 7; m++)
			ADD(xasprintf("model.layers.%d.%s.weight", l, mods[m]), rows[m], cols[m],
			    1.0f / sqrtf((float)cols[m]), 0);
		ADD(xasprintf("model.layers.%d.input_layernorm.weight", l), 1, H, 0, 1);
		ADD(xasprintf("model.layers.%d.post_attention_layernorm.weight", l), 1, H, 0, 1);
	}
#undef ADD
	p = xasprintf("%s/model.safetensors", dir);
	bk_st_writer_write(w, p);
	free(p);
	bk_st_writer_free(w);
	for (size_t i = 0; i < keep.n; i++) {
		free(keep.v[i]);
		free(names.v[i]);
	}
	free(keep.v);
	free(names.v);
}

static void sync_dev(const bk_ops *ops)
{
#ifdef BK_HAVE_CUDA
	if (ops == &bk_ops_cuda)
		bk_cuda_sync();
#else
	(void)ops;
#endif
}

static void reset_peak(const bk_ops *ops)
{
#ifdef BK_HAVE_CUDA
	if (ops == &bk_ops_cuda)
		bk_cuda_mem_reset_peak();
#else
	(void)ops;
#endif
}

static double peak_gib(const bk_ops *ops)
{
	size_t cur = 0, peak = 0;
#ifdef BK_HAVE_CUDA
	if (ops == &bk_ops_cuda)
		bk_cuda_mem_stats(&cur, &peak);
#else
	(void)ops;
#endif
	(void)cur;
	return (double)peak / 1073741824.0;
}

/* bytes/s of a device-to-device copy (read + write counted), best of a few */
static double copy_bandwidth(const bk_ops *ops)
{
	size_t n = ops == &bk_ops_host ? (size_t)1 << 26 : (size_t)1 << 30;
	void *a = ops->alloc(n), *b = ops->alloc(n);
	ops->zero(a, n);
	double best = 0;
	for (int i = 0; i < 6; i++) {
		sync_dev(ops);
		double t0 = now();
		ops->copy(b, a, n);
		sync_dev(ops);
		double bw = 2.0 * (double)n / (now() - t0);
		best = i > 0 && bw > best ? bw : best; /* the first is a warm-up */
	}
	ops->free(a);
	ops->free(b);
	return best;
}

typedef struct {
	double wall, tokens_per_s, step_s, kv_bytes_step;
	uint64_t new_tokens, decode_steps;
	bk_gen_stats st;
} run_result;

/* n prompts x ntraj samples of max_new tokens with max_batch in flight */
static run_result run(const bk_model *m, int32_t **prompts, int plen, int n, int ntraj,
		      int max_new, int max_batch, int greedy)
{
	bk_gen_config cfg = { .max_batch = max_batch, .max_new = max_new, .max_seq = 2048,
			      .sample = { greedy ? 0.0f : 0.8f, 0.9f }, .n_stop = 0 };
	const bk_gen_ops *gops = bk_gen_ops_for(m->ops);
	bk_gen *g = bk_gen_create(m, gops, NULL, &cfg);
	double t0 = now();
	bk_gen_set_prefix(g, prompts[0], 1 + SYS);
	for (int i = 0; i < n; i++) {
		uint64_t keys[64], tags[64];
		for (int j = 0; j < ntraj; j++) {
			keys[j] = bk_crng_key(0, (uint64_t)i, (uint64_t)j, 0);
			tags[j] = (uint64_t)i * ntraj + j;
		}
		bk_gen_submit(g, prompts[i], plen, ntraj, keys, tags);
	}
	bk_gen_result r;
	while (bk_gen_step(g))
		while (bk_gen_take(g, &r))
			free(r.ids);
	run_result res = { 0 };
	res.wall = now() - t0;
	res.st = *bk_gen_get_stats(g);
	res.new_tokens = res.st.new_tokens;
	res.tokens_per_s = (double)res.new_tokens / res.wall;
	res.decode_steps = res.st.decode_steps;
	res.step_s = res.st.decode_steps ? res.st.decode_seconds / (double)res.st.decode_steps : 0;
	/* KV rows read by an average decode step: every running sample reads its keys and
	 * values at the mean context length plen + max_new/2, every layer, in the cache's
	 * number type (bf16 on the GPU) */
	double active = max_batch < n * ntraj ? max_batch : n * ntraj;
	res.kv_bytes_step = active * (plen + max_new / 2.0) * m->cfg.L * 2.0 * NKV * HD *
			    (double)gops->kv_bytes;
	bk_gen_free(g);
	return res;
}

static double weight_bytes(int L)
{
	double per_layer = (double)NH * HD * H * 2 + 2.0 * NKV * HD * H + (double)H * NH * HD +
			   3.0 * I * H;
	return 2.0 * (per_layer * L + (double)V * H); /* bf16; the lm head, not the embedding */
}

/* one "bench_gen: mode=..." row */
static void report(const char *mode, int batch, const char *what, const run_result *rr,
		   double wb, double bw, const bk_ops *ops)
{
	double bytes = wb + rr->kv_bytes_step, frac = rr->step_s > 0 ? bytes / rr->step_s / bw : 0;
	printf("bench_gen: mode=%s batch=%d tokens_per_s=%.1f step_ms=%.3f bytes_per_step_gb=%.3f "
	       "bw_fraction=%.3f peak_gib=%.2f new_tokens=%llu wall_s=%.2f (%s)\n",
	       mode, batch, rr->tokens_per_s, 1e3 * rr->step_s, bytes / 1e9, frac, peak_gib(ops),
	       (unsigned long long)rr->new_tokens, rr->wall, what);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	int quick = 0, tiny = 0;
	if (argc == 3 && !strcmp(argv[1], "--write-only")) {
		mkdir(argv[2], 0755);
		write_model(argv[2], 2);
		bk_loaded_model lm = bk_model_load(&bk_ops_host, argv[2]);
		printf("bench_gen: %s holds a loadable %d-layer model (V %d, H %d)\n", argv[2],
		       lm.model->cfg.L, lm.model->cfg.V, lm.model->cfg.H);
		bk_model_unload(&lm);
		return 0;
	}
	const char *keep = NULL, *device = "cuda";
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--tiny"))
			tiny = 1;
		else if (!strcmp(argv[i], "--device") && i + 1 < argc)
			device = argv[++i];
		else if (!strcmp(argv[i], "--keep") && i + 1 < argc)
			keep = argv[++i];
		else
			die_usage("usage: bench_gen [--device cuda|cpu] [--quick] [--tiny] [--keep DIR]");
	}
	const bk_ops *ops = bk_device_select(device);
	int L = quick || tiny ? 2 : 22, NP = quick ? 64 : 256, NT = 4, NEW = 128, MB = 256,
	    GNEW = 64;
	static const int gbatch[] = { 1, 8, 64 };
	int ngb = 3;
	if (tiny) {
		H = 64, I = 128, NH = 4, NKV = 2, HD = 16, V = 512, SYS = 12, USER = 6;
		NP = 8, NT = 2, NEW = 8, MB = 16, GNEW = 8, ngb = 2;
	}
	char tmpl[] = "/tmp/bk-bench-gen.XXXXXX";
	const char *dir = keep;
	if (!dir) {
		if (!mkdtemp(tmpl))
			die("mkdtemp failed");
		dir = tmpl;
	} else {
		mkdir(dir, 0755);
	}
	double t0 = now();
	write_model(dir, L);
	fprintf(stderr, "bench_gen: wrote a %d-layer model to %s in %.1f s\n", L, dir, now() - t0);
	t0 = now();
	bk_loaded_model lm = bk_model_load(ops, dir);
	fprintf(stderr, "bench_gen: loaded on %s in %.1f s\n", ops->name, now() - t0);

	/* prompts: BOS, the shared system prompt, a user message */
	bk_rng r;
	bk_rng_seed(&r, 7);
	int plen = 1 + SYS + USER;
	int32_t **prompts = xmalloc((size_t)NP * sizeof(*prompts));
	int32_t *sys = xmalloc((size_t)SYS * sizeof(*sys));
	for (int j = 0; j < SYS; j++)
		sys[j] = 3 + (int32_t)bk_rng_below(&r, (uint64_t)V - 3);
	char *pf = xasprintf("%s/prompts.txt", dir);
	FILE *f = fopen(pf, "w");
	if (!f)
		die("%s: cannot write", pf);
	for (int i = 0; i < NP; i++) {
		prompts[i] = xmalloc((size_t)plen * sizeof(int32_t));
		prompts[i][0] = 1;
		memcpy(prompts[i] + 1, sys, (size_t)SYS * sizeof(*sys));
		for (int j = 0; j < USER; j++)
			prompts[i][1 + SYS + j] = 3 + (int32_t)bk_rng_below(&r, (uint64_t)V - 3);
		for (int j = 0; j < plen; j++)
			fprintf(f, "%d%c", prompts[i][j], j + 1 < plen ? ' ' : '\n');
	}
	if (fclose(f))
		die("%s: write failed", pf);
	/* the rows, for tests/gpu/hf_gen.py: mode batch prompts trajectories new max_batch */
	char *jf = xasprintf("%s/rows.txt", dir);
	f = fopen(jf, "w");
	if (!f)
		die("%s: cannot write", jf);
	for (int k = 0; k < ngb; k++)
		fprintf(f, "greedy %d %d 1 %d %d\n", gbatch[k], gbatch[k], GNEW, gbatch[k]);
	int sb = tiny ? 8 : 64;
	fprintf(f, "sampled %d %d 1 %d %d\nsampled %d %d %d %d %d\n", sb, sb, GNEW, sb, MB, NP, NT,
		NEW, MB);
	if (fclose(f))
		die("%s: write failed", jf);

	double bw = copy_bandwidth(ops), wb = weight_bytes(L);
	printf("copy bandwidth (device to device, read + write counted): %.0f GB/s; weights read per "
	       "decode step (bf16 linears + LM head): %.3f GB\n", bw / 1e9, wb / 1e9);

	/* warm-up (first-touch allocations, clocks) */
	run(lm.model, prompts, plen, 2, 1, 8, 2, 1);
	for (int k = 0; k < ngb; k++) {
		int b = gbatch[k];
		reset_peak(ops);
		run_result rr = run(lm.model, prompts, plen, b, 1, GNEW, b, 1);
		char what[96];
		snprintf(what, sizeof what, "%d prompts x 1 x %d new tokens, greedy", b, GNEW);
		report("greedy", b, what, &rr, wb, bw, ops);
	}
	reset_peak(ops);
	run_result rs = run(lm.model, prompts, plen, sb, 1, GNEW, sb, 0);
	char what[128];
	snprintf(what, sizeof what, "%d prompts x 1 x %d new tokens, T 0.8 top-p 0.9", sb, GNEW);
	report("sampled", sb, what, &rs, wb, bw, ops);
	reset_peak(ops);
	run_result rr = run(lm.model, prompts, plen, NP, NT, NEW, MB, 0);
	snprintf(what, sizeof what, "the job: %d prompts x %d x %d new tokens, T 0.8 top-p 0.9, "
		 "prefix built %llu time(s)", NP, NT, NEW, (unsigned long long)rr.st.prefix_builds);
	report("sampled", MB, what, &rr, wb, bw, ops);
	bk_model_unload(&lm);
	if (!keep) {
		char *cmd = xasprintf("rm -rf '%s'", dir);
		if (system(cmd) != 0)
			warn("could not remove %s", dir);
		free(cmd);
	}
	free(pf);
	free(jf);
	free(sys);
	for (int i = 0; i < NP; i++)
		free(prompts[i]);
	free(prompts);
	return 0;
}
