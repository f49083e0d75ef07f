/* check_decode.c - the v2 decode path (BK_DECODE=v2: gpu/cuda/cuda_linear2.cuh,
 * cuda_sample2.cuh, the graph-captured step of gpu/gen.c) against the host twin, then
 * v1 against v2 timed on a TinyLlama-1.1B-shaped random model.  Run by tests/gpu/run.sh
 * (check_gen, check_gen --e2e and check_gen.sh also run there under BK_DECODE=v2).
 *   1. linear v2 at the TinyLlama projections' shapes and odd ones, T = 1, 8, 64, 65,
 *      257 (65 and 257: the tiled prefill kernel), against the host twin on the same bf16
 *      inputs: max|cuda - host| / max(max|host|, 1e-3) <= 1e-3 (only the fp32 summation
 *      order differs); bit for bit the same rows run alone (T = 1), in chunks of 53 (the
 *      decode kernel) and all together, so a row never depends on its batch;
 *   2. the v2 sampler against bk_sample_token on peaked, flat (top-p 0.9 of a flat row:
 *      tens of thousands of tokens in the nucleus, where v1 sorts the whole row) and
 *      tied rows at V = 32000 and 151936, top-p 1, greedy: the same token every draw;
 *      twice the same call gives the same ids; with top-k (HF's 50, 1, a K of thousands
 *      in a flat row, K >= V) as well; each case also run by the v1 sampler (the same
 *      tokens as the host) and both timed, rows "... (v2 X ms, v1 Y ms)";
 *   3. the engine on a small random model (4 layers, H 128, V 1000), greedy: v2 against
 *      the host twin, the same tokens or a first difference only at a near tie (host
 *      top-2 margin <= 4 x the logit error there), logits before it within 5e-2
 *      relative; v2 at --max-batch 1, 3 and 8 (batch buckets 1..8, padding rows, graphs
 *      captured and replayed): tokens and logits bit for bit; sampled (temperature 0.8,
 *      top-p 0.9): the same tokens at every --max-batch, and every drawn token equal to
 *      bk_sample_token applied to the logits the GPU drew it from (the host twin's rule);
 *   4. --bench (timings only, no checks): greedy decode of 64 new tokens after a 230-token
 *      prompt at batch 1 and 64 on the TinyLlama shape (22 layers, H 2048, I 5632, 32/4
 *      heads, V 32000; --quick: 2 layers), v1 and v2 alternately in one process: tokens/s,
 *      decode step time and the fraction of the device-to-device copy bandwidth measured
 *      in the same run that the step's bytes make (bf16 weights + LM head + KV rows
 *      read); rows "decode v1|v2 batch B: ..." and a ratio; then the same model with its
 *      decoder linears in 4 bits (NF4, double quant) at batch 1: rows "decode v1|v2 4-bit
 *      batch 1: ..." and "decode batch 1: 4-bit/bf16 tokens/s v1 Xx v2 Yx".
 * --host: part 3 with the host twin on both sides (the dry run without a GPU).
 * --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU): part 1 at in/out up to
 * 352 and 4099 (the LM-head-like one), T = 1, 8 and 65; part 2 at V 1031 for 32000 and
 * 2 rows of V 4099 for 151936, an eighth of the other draws, a K of 600 for the
 * thousands; part 3 with 10 new tokens per prompt; with --bench: a 2-layer model of H 128 (4/2 heads, I 352,
 * V 1000), a 24-token prompt (16 shared), 4 new tokens at batch 1 and 4.
 * One line per check; exit 1 on any failure.
 * Usage: check_decode [--host] [--bench] [--quick | --tiny] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/cuda/cuda.h"
#include "gpu/device.h"
#include "gpu/gen.h"
#include "gpu/quant4.h"
#include "tests/gpu/gpu_check.h"
#include "tests/harness.h"

static const bk_ops *D_;
static bk_rng rng;
static int host_only;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float urand(void) { return (float)(2 * bk_rng_uniform(&rng) - 1); }

static float *hrand(size_t n, float scale, int round)
{
	return round ? gc_rand_bf16(&rng, n, scale) : gc_rand(&rng, n, scale);
}

static float *fetch(const void *d, size_t n)
{
	float *h = xmalloc((n ? n : 1) * sizeof(float));
	D_->download(h, d, n * sizeof(float));
	return h;
}

static void verdict(int ok, const char *what)
{
	printf("%-72s %s\n", what, ok ? "ok" : "FAIL");
	CHECK(ok, "%s", what);
}

/* ---- 1. linear ---- */

static void check_linear(const bk_gen_ops *G, int T, int in, int out)
{
	float *x = hrand((size_t)T * in, 1, 0), *w = hrand((size_t)out * in, 0.05f, 1);
	float *xr = xmalloc((size_t)T * in * sizeof(float)), *yh = xmalloc((size_t)T * out * 4);
	for (size_t i = 0; i < (size_t)T * in; i++)
		xr[i] = gc_bf16(x[i]);
	bk_weight wh = { out, in, w, BK_WEIGHT_PLAIN };
	bk_gen_ops_host.linear(yh, xr, &wh, T);
	bk_weight *wd = D_->weight_upload(w, out, in);
	float *xd = gc_dup(D_, x, (size_t)T * in * 4), *yd = D_->alloc((size_t)T * out * 4);
	G->linear(yd, xd, wd, T);
	float *y = fetch(yd, (size_t)T * out);
	double err = bk_max_relerr(y, yh, (size_t)T * out, 1e-3);
	char what[160];
	snprintf(what, sizeof(what), "linear v2 T=%d in=%d out=%d%s: err %.2e (bound 1e-3)", T, in,
		 out, T > 64 ? " (prefill kernel)" : "", err);
	verdict(err <= 1e-3, what);
	/* rows alone and in chunks of 53: bit for bit */
	float *yc = D_->alloc((size_t)T * out * 4);
	for (int t0 = 0; t0 < T; t0 += 53) {
		int n = T - t0 < 53 ? T - t0 : 53;
		G->linear(yc + (size_t)t0 * out, xd + (size_t)t0 * in, wd, n);
	}
	float *c = fetch(yc, (size_t)T * out);
	int same = !memcmp(c, y, (size_t)T * out * 4);
	for (int t = 0; t < T && same; t += T > 16 ? 13 : 1) {
		G->linear(yc, xd + (size_t)t * in, wd, 1);
		float *r = fetch(yc, (size_t)out);
		same &= !memcmp(r, y + (size_t)t * out, (size_t)out * 4);
		free(r);
	}
	verdict(same, "  the same rows in chunks of 53 and alone: bit for bit");
	D_->free(xd), D_->free(yd), D_->free(yc);
	D_->weight_free(wd);
	free(x), free(xr), free(w), free(yh), free(y), free(c);
}

/* ---- 2. sampler ---- */

static void check_sample(const bk_gen_ops *G, int V, float temperature, float top_p, int N,
			 float scale, int top_k)
{
	float *lg = xmalloc((size_t)N * V * 4);
	for (int i = 0; i < N; i++) {
		float *r = lg + (size_t)i * V;
		for (int j = 0; j < V; j++)
			r[j] = scale * urand();
		if (i % 4 == 1) /* a few distinct values: ties across the boundary */
			for (int j = 0; j < V; j++)
				r[j] = (float)(int)(3 * (urand() + 1));
		if (i % 4 == 2) /* tied maxima */
			for (int k = 0; k < 3; k++)
				r[(int)bk_rng_below(&rng, (uint64_t)V)] = 40.0f;
	}
	int32_t *rows = xmalloc((size_t)N * 4), *ctr = xmalloc((size_t)N * 4);
	uint64_t *keys = xmalloc((size_t)N * 8);
	for (int i = 0; i < N; i++) {
		rows[i] = (i * 7) % N;
		keys[i] = bk_rng_u64(&rng);
		ctr[i] = (int32_t)bk_rng_below(&rng, 500);
	}
	float *lgd = gc_dup(D_, lg, (size_t)N * V * 4);
	int32_t *rowsd = gc_dup(D_, rows, (size_t)N * 4), *ctrd = gc_dup(D_, ctr, (size_t)N * 4);
	uint64_t *keysd = gc_dup(D_, keys, (size_t)N * 8);
	int32_t *idsd = D_->alloc((size_t)N * 4);
	void *work = D_->alloc(G->sample_work_bytes(N, V));
	int32_t *ids = xmalloc((size_t)N * 4), *ids2 = xmalloc((size_t)N * 4);
	int32_t *ids1 = xmalloc((size_t)N * 4);
	G->sample(idsd, lgd, rowsd, keysd, ctrd, N, V, temperature, top_k, top_p, work);
	D_->download(ids, idsd, (size_t)N * 4);
	D_->zero(idsd, (size_t)N * 4);
	double t0 = now();
	G->sample(idsd, lgd, rowsd, keysd, ctrd, N, V, temperature, top_k, top_p, work);
	D_->download(ids2, idsd, (size_t)N * 4);
	double dt = now() - t0;
	/* the v1 sampler on the same call, warmed up once, then timed */
	bk_cuda_decode_set_mode(1);
	G->sample(idsd, lgd, rowsd, keysd, ctrd, N, V, temperature, top_k, top_p, work);
	D_->download(ids1, idsd, (size_t)N * 4);
	t0 = now();
	G->sample(idsd, lgd, rowsd, keysd, ctrd, N, V, temperature, top_k, top_p, work);
	D_->download(ids1, idsd, (size_t)N * 4);
	double dt1 = now() - t0;
	bk_cuda_decode_set_mode(2);
	bk_sample_work *sw = bk_sample_work_new(V);
	bk_sample_params sp = { temperature, top_p, top_k };
	int bad = 0, bad1 = 0, first = -1;
	int32_t fw = 0;
	for (int i = 0; i < N; i++) {
		double u = temperature > 0 ? bk_crng_uniform(keys[i], (uint64_t)ctr[i]) : 0;
		int32_t want = bk_sample_token(lg + (size_t)rows[i] * V, V, &sp, u, sw);
		if (ids[i] != want && first < 0)
			first = i, fw = want;
		bad += ids[i] != want;
		bad1 += ids1[i] != want;
	}
	int again = !memcmp(ids, ids2, (size_t)N * 4);
	char what[240];
	snprintf(what, sizeof(what),
		 "sample v2 V=%d temperature=%g top_k=%d top_p=%g scale=%g draws=%d: %d differ "
		 "(v1 %d), again %s (v2 %.2f ms, v1 %.2f ms)", V, temperature, top_k, top_p, scale,
		 N, bad, bad1, again ? "equal" : "DIFFERENT", 1e3 * dt, 1e3 * dt1);
	verdict(!bad && !bad1 && again, what);
	if (first >= 0)
		printf("  first: draw %d got %d, bk_sample_token %d\n", first, ids[first], fw);
	free(ids1);
	void *d[] = { lgd, rowsd, ctrd, keysd, idsd, work };
	for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
		D_->free(d[i]);
	bk_sample_work_free(sw);
	free(lg), free(rows), free(ctr), free(keys), free(ids), free(ids2);
}

/* ---- a random Llama ---- */

static float *rnd(bk_rng *r, size_t n, double scale)
{
	float *p = xmalloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		p[i] = (float)scale * (float)(2 * bk_rng_uniform(r) - 1);
	return p;
}

/* q4: NULL, or the base linears in 4 bits (QLoRA) */
static bk_model *random_model_q4(const bk_ops *ops, int H, int L, int NH, int NKV, int I, int V,
				 float head_scale, uint64_t seed, const bk_q4_config *q4)
{
	bk_rng r;
	bk_rng_seed(&r, seed);
	int D = H / NH;
	float *inv = xmalloc((size_t)D / 2 * sizeof *inv);
	for (int i = 0; i < D / 2; i++)
		inv[i] = (float)pow(10000.0, -2.0 * i / D);
	bk_llama_config cfg = { .H = H, .I = I, .L = L, .NH = NH, .NKV = NKV, .D = D, .V = V,
				.rms_eps = 1e-5f, .inv_freq = inv };
	if (q4)
		cfg.q4 = *q4;
	bk_llama_layer_weights *lw = xcalloc((size_t)L, sizeof *lw);
	/* one matrix per shape, shared by the layers (uploaded separately: distinct device
	 * memory); 1/sqrt(in) keeps activations O(1) */
	float *wq = rnd(&r, (size_t)NH * D * H, 1.0 / sqrt(H)), *wk = rnd(&r, (size_t)NKV * D * H, 1.0 / sqrt(H)),
	      *wv = rnd(&r, (size_t)NKV * D * H, 1.0 / sqrt(H)),
	      *wo = rnd(&r, (size_t)H * NH * D, 1.0 / sqrt(NH * D)), *wg = rnd(&r, (size_t)I * H, 1.0 / sqrt(H)),
	      *wu = rnd(&r, (size_t)I * H, 1.0 / sqrt(H)), *wd = rnd(&r, (size_t)H * I, 1.0 / sqrt(I));
	float *n1 = xmalloc((size_t)H * sizeof(float));
	for (int i = 0; i < H; i++)
		n1[i] = 1;
	for (int l = 0; l < L; l++)
		lw[l] = (bk_llama_layer_weights){ .wq = wq, .wk = wk, .wv = wv, .wo = wo,
						  .w_gate = wg, .w_up = wu, .w_down = wd,
						  .attn_norm = n1, .mlp_norm = n1 };
	float *embed = rnd(&r, (size_t)V * H, 1), *head = rnd(&r, (size_t)V * H, head_scale / sqrt(H));
	bk_llama_weights w = { embed, n1, head, lw };
	bk_model *m = bk_model_create(ops, &cfg, &w);
	free(wq), free(wk), free(wv), free(wo), free(wg), free(wu), free(wd), free(n1);
	free(embed), free(head), free(lw), free(inv);
	return m;
}

static bk_model *random_model(const bk_ops *ops, int H, int L, int NH, int NKV, int I, int V,
			      float head_scale, uint64_t seed)
{
	return random_model_q4(ops, H, L, NH, NKV, I, V, head_scale, seed, NULL);
}

/* ---- 3. the engine ---- */

enum { EN = 6, ENEW = 40, EP = 24 };
static int enew = ENEW; /* new tokens per prompt: ENEW, --tiny 10 */
typedef struct {
	float *rows[EN][ENEW];
	int V;
} capture;

static void on_logits(void *ctx, uint64_t tag, int step, const float *logits, int n)
{
	capture *c = ctx;
	BUG_ON(tag >= EN || step >= ENEW || n != c->V);
	free(c->rows[tag][step]);
	c->rows[tag][step] = xmalloc((size_t)n * 4);
	memcpy(c->rows[tag][step], logits, (size_t)n * 4);
}

static void capture_free(capture *c)
{
	for (int i = 0; i < EN; i++)
		for (int s = 0; s < ENEW; s++) {
			free(c->rows[i][s]);
			c->rows[i][s] = NULL;
		}
}

/* EN prompts sharing a prefix (lengths 14..33), greedy or sampled */
static void run_engine(const bk_model *m, int max_batch, float temperature, capture *cap,
		       int32_t **out, int *nout)
{
	int32_t *pr[EN];
	const int32_t *pp[EN];
	int lens[EN];
	bk_rng r;
	bk_rng_seed(&r, 99);
	for (int i = 0; i < EN; i++) {
		lens[i] = 14 + (i * 37) % 20;
		pr[i] = xmalloc((size_t)lens[i] * 4);
		for (int j = 0; j < lens[i]; j++)
			pr[i][j] = j < 10 ? 3 + j : 3 + (int32_t)bk_rng_below(&r, (uint64_t)m->cfg.V - 3);
		pp[i] = pr[i];
	}
	uint64_t keys[EN];
	for (int i = 0; i < EN; i++)
		keys[i] = bk_crng_key(5, (uint64_t)i, 0, 0);
	bk_gen_config cfg = { .max_batch = max_batch, .max_new = enew, .max_seq = 512,
			      .sample = { temperature, 0.9f }, .on_logits = cap ? on_logits : NULL,
			      .ctx = cap };
	if (cap)
		cap->V = m->cfg.V;
	bk_gen_run(m, bk_gen_ops_for(m->ops), NULL, &cfg, NULL, -1, pp, lens, EN,
		   temperature > 0 ? keys : NULL, out, nout);
	for (int i = 0; i < EN; i++)
		free(pr[i]);
}

static void free_out(int32_t **o)
{
	for (int i = 0; i < EN; i++)
		free(o[i]);
}

static int same_out(int32_t **a, const int *na, int32_t **b, const int *nb)
{
	for (int i = 0; i < EN; i++)
		if (na[i] != nb[i] || memcmp(a[i], b[i], (size_t)na[i] * 4))
			return 0;
	return 1;
}

static int same_logits(const capture *a, const capture *b, int32_t **o, const int *n)
{
	for (int i = 0; i < EN; i++)
		for (int s = 0; s < n[i]; s++)
			if (!a->rows[i][s] || !b->rows[i][s] ||
			    memcmp(a->rows[i][s], b->rows[i][s], (size_t)a->V * 4))
				return 0;
	(void)o;
	return 1;
}

static void check_engine(void)
{
	const int H = 128, L = 4, NH = 4, NKV = 2, I = 256, V = 1000;
	bk_model *mh = random_model(&bk_ops_host, H, L, NH, NKV, I, V, 6.0f, 11);
	bk_model *md = random_model(D_, H, L, NH, NKV, I, V, 6.0f, 11);
	static capture ch, c1, c3, c8;
	int32_t *oh[EN], *o1[EN], *o3[EN], *o8[EN];
	int nh[EN], n1[EN], n3[EN], n8[EN];
	run_engine(mh, 3, 0, &ch, oh, nh);
	run_engine(md, 3, 0, &c3, o3, n3);
	/* greedy against the host twin */
	double worst = 0;
	int equal = 0, ok = 1;
	for (int i = 0; i < EN; i++) {
		int n = nh[i] < n3[i] ? nh[i] : n3[i], j = 0;
		while (j < n && oh[i][j] == o3[i][j])
			j++;
		int last = j < n ? j : n - 1;
		for (int s = 0; s <= last; s++) {
			double e = bk_max_relerr(c3.rows[i][s], ch.rows[i][s], (size_t)V, 1e-3);
			worst = e > worst || e != e ? e : worst;
		}
		if (j == n && nh[i] == n3[i]) {
			equal++;
			continue;
		}
		const float *h = ch.rows[i][j < n ? j : n - 1], *d = c3.rows[i][j < n ? j : n - 1];
		int a = bk_sample_argmax(h, V);
		float b2 = -INFINITY, err = 0;
		for (int v = 0; v < V; v++) {
			if (v != a && h[v] > b2)
				b2 = h[v];
			float e = fabsf(h[v] - d[v]);
			err = e > err ? e : err;
		}
		int tie = j < n && h[a] - b2 <= 4 * err;
		printf("engine: prompt %d: first difference at step %d: host top-2 margin %.4g, max "
		       "|logit error| %.4g: %s\n", i, j, h[a] - b2, err,
		       tie ? "a near tie, allowed" : "NOT a near tie");
		ok &= tie;
	}
	char what[200];
	snprintf(what, sizeof(what), "engine greedy %s vs host: %d of %d prompts equal, logits err %.2e "
		 "(bound 5e-2)", host_only ? "host" : "cuda v2", equal, EN, worst);
	verdict(ok && worst <= 5e-2, what);
	/* batch invariance on the device: max_batch 1, 3, 8 */
	run_engine(md, 1, 0, &c1, o1, n1);
	run_engine(md, 8, 0, &c8, o8, n8);
	int inv = same_out(o1, n1, o3, n3) && same_out(o8, n8, o3, n3) &&
		  same_logits(&c1, &c3, o3, n3) && same_logits(&c8, &c3, o3, n3);
	verdict(inv, "engine greedy at --max-batch 1, 3, 8: tokens and logits bit for bit");
	free_out(o1), free_out(o8), free_out(oh);
	capture_free(&c1), capture_free(&c8), capture_free(&ch);
	/* sampled: the same at every max_batch; each draw the host rule on the GPU's logits */
	int32_t *s1[EN], *s5[EN];
	int m1[EN], m5[EN];
	run_engine(md, 5, 0.8f, &c3, s5, m5);
	run_engine(md, 1, 0.8f, NULL, s1, m1);
	verdict(same_out(s1, m1, s5, m5), "engine sampled at --max-batch 1 and 5: the same tokens");
	bk_sample_work *sw = bk_sample_work_new(V);
	bk_sample_params sp = { 0.8f, 0.9f, 0 };
	uint64_t keys[EN];
	int bad = 0, draws = 0;
	for (int i = 0; i < EN; i++) {
		keys[i] = bk_crng_key(5, (uint64_t)i, 0, 0);
		for (int s = 0; s < m5[i]; s++, draws++)
			bad += !c3.rows[i][s] ||
			       bk_sample_token(c3.rows[i][s], V, &sp, bk_crng_uniform(keys[i], (uint64_t)s),
					       sw) != s5[i][s];
	}
	snprintf(what, sizeof(what), "engine sampled: %d of %d draws differ from bk_sample_token on "
		 "the same logits", bad, draws);
	verdict(!bad, what);
	bk_sample_work_free(sw);
	capture_free(&c3);
	free_out(o3), free_out(s1), free_out(s5);
	bk_model_free(mh);
	bk_model_free(md);
}

/* ---- 4. timings ---- */

static double copy_bandwidth(size_t n)
{
	void *a = D_->alloc(n), *b = D_->alloc(n);
	D_->zero(a, n);
	double best = 0;
	for (int i = 0; i < 6; i++) {
		bk_cuda_sync();
		double t0 = now();
		D_->copy(b, a, n);
		bk_cuda_sync();
		double bw = 2.0 * (double)n / (now() - t0);
		best = i > 0 && bw > best ? bw : best;
	}
	D_->free(a);
	D_->free(b);
	return best;
}

/* greedy decode of NEW tokens after PLEN-token prompts (PREFIX shared) at batch B in
 * decode mode `mode`: tokens/s and the mean decode step */
typedef struct {
	double tps, step;
	unsigned long long steps;
} decode_time;

static decode_time time_gen(bk_model *m, int B, int mode, int PLEN, int NEW, int PREFIX, int V)
{
	bk_cuda_decode_set_mode(mode);
	int32_t **pr = xmalloc((size_t)B * sizeof(*pr));
	const int32_t **pp = xmalloc((size_t)B * sizeof(*pp));
	for (int i = 0; i < B; i++) {
		pr[i] = xmalloc(PLEN * 4);
		for (int j = 0; j < PLEN; j++)
			pr[i][j] = 3 + (int32_t)((j < PREFIX ? j * 131 : (i + 1) * j * 7919) % (V - 3));
		pp[i] = pr[i];
	}
	bk_gen_config cfg = { .max_batch = B, .max_new = NEW, .max_seq = 2048, .sample = { 0, 1 } };
	bk_gen *g = bk_gen_create(m, bk_gen_ops_for(D_), NULL, &cfg);
	bk_gen_set_prefix(g, pp[0], PREFIX);
	for (int i = 0; i < B; i++) {
		uint64_t key = 0, tag = (uint64_t)i;
		bk_gen_submit(g, pp[i], PLEN, 1, &key, &tag);
	}
	bk_cuda_sync();
	double w0 = now();
	bk_gen_result r;
	while (bk_gen_step(g))
		while (bk_gen_take(g, &r))
			free(r.ids);
	double wall = now() - w0;
	const bk_gen_stats *st = bk_gen_get_stats(g);
	decode_time t = { (double)st->new_tokens / wall,
			  st->decode_steps ? st->decode_seconds / (double)st->decode_steps : 0,
			  (unsigned long long)st->decode_steps };
	bk_gen_free(g);
	for (int i = 0; i < B; i++)
		free(pr[i]);
	free(pr), free(pp);
	return t;
}

static void time_decode(int quick, int tiny)
{
	const int H = tiny ? 128 : 2048, L = quick || tiny ? 2 : 22, NH = tiny ? 4 : 32,
		  NKV = tiny ? 2 : 4, I = tiny ? 352 : 5632, V = tiny ? 1000 : 32000, D = H / NH;
	const int PLEN = tiny ? 24 : 230, NEW = tiny ? 4 : 64, PREFIX = tiny ? 16 : 200;
	double t0 = now();
	bk_model *m = random_model(D_, H, L, NH, NKV, I, V, 8.0f, 3);
	bk_cuda_sync();
	printf("timing: a %d-layer %s model on the GPU in %.1f s\n", L,
	       tiny ? "small (H 128)" : "TinyLlama-shaped", now() - t0);
	double bw = copy_bandwidth(tiny ? (size_t)16 << 20 : (size_t)1 << 30);
	/* the decoder linears' weights (out x in, per layer), then the LM head's (bf16) */
	const double lin[7][2] = { { NH * D, H }, { NKV * D, H }, { NKV * D, H }, { H, NH * D },
				   { I, H }, { I, H }, { H, I } };
	double lbytes = 0, qbytes = 0, head = 2.0 * V * H;
	for (int i = 0; i < 7; i++) {
		lbytes += 2.0 * lin[i][0] * lin[i][1] * L;
		qbytes += (double)bk_q4_bytes((size_t)lin[i][0], (size_t)lin[i][1], 1) * L;
	}
	double wbytes = lbytes + head;
	printf("timing: device-to-device copy %.0f GB/s; weights %.3f GB (bf16, with the LM head)\n",
	       bw / 1e9, wbytes / 1e9);
	static const int batches[] = { 1, 64 }, tiny_batches[] = { 1, 4 };
	decode_time b1[3] = { { 0 } }; /* batch 1, bf16, by mode */
	for (int bi = 0; bi < 2; bi++) {
		int B = tiny ? tiny_batches[bi] : batches[bi];
		double tps[3] = { 0 };
		for (int rep = 0; rep < 2; rep++) /* v1, v2, v1, v2: the second pair is reported */
			for (int mode = 1; mode <= 2; mode++) {
				decode_time t = time_gen(m, B, mode, PLEN, NEW, PREFIX, V);
				double kv = (double)B * (PLEN + NEW / 2.0) * L * 2.0 * NKV * D * 2.0;
				double frac = t.step > 0 ? (wbytes + kv) / t.step / bw : 0;
				tps[mode] = t.tps;
				if (bi == 0)
					b1[mode] = t;
				if (rep == 1)
					printf("decode %s batch %d: tokens_per_s=%.1f step_ms=%.3f "
					       "bytes_per_step_gb=%.3f bw_fraction=%.3f (%llu decode steps)\n",
					       mode == 1 ? "v1" : "v2", B, t.tps, 1e3 * t.step,
					       (wbytes + kv) / 1e9, frac, t.steps);
			}
		printf("decode batch %d: v2/v1 tokens/s %.2fx\n", B, tps[1] > 0 ? tps[2] / tps[1] : 0);
	}
	bk_model_free(m);
	/* the same model with its decoder linears in 4 bits (QLoRA's NF4 + double quant), at
	 * batch 1: the decode linears read the 4 bits themselves (cuda_wsrc.cuh) */
	t0 = now();
	bk_q4_config q4 = { BK_Q4_NF4, 1, 1, 0 };
	m = random_model_q4(D_, H, L, NH, NKV, I, V, 8.0f, 3, &q4);
	bk_cuda_sync();
	printf("timing: the same model in 4 bits (nf4, double quant; weights %.3f GB with the "
	       "bf16 LM head) in %.1f s\n", (qbytes + head) / 1e9, now() - t0);
	double q1[3] = { 0 };
	for (int rep = 0; rep < 2; rep++)
		for (int mode = 1; mode <= 2; mode++) {
			decode_time t = time_gen(m, 1, mode, PLEN, NEW, PREFIX, V);
			double kv = (PLEN + NEW / 2.0) * L * 2.0 * NKV * D * 2.0;
			double frac = t.step > 0 ? (qbytes + head + kv) / t.step / bw : 0;
			q1[mode] = t.tps;
			if (rep == 1)
				printf("decode %s 4-bit batch 1: tokens_per_s=%.1f step_ms=%.3f "
				       "bytes_per_step_gb=%.3f bw_fraction=%.3f (%llu decode steps)\n",
				       mode == 1 ? "v1" : "v2", t.tps, 1e3 * t.step,
				       (qbytes + head + kv) / 1e9, frac, t.steps);
		}
	printf("decode batch 1: 4-bit/bf16 tokens/s v1 %.2fx v2 %.2fx\n",
	       b1[1].tps > 0 ? q1[1] / b1[1].tps : 0, b1[2].tps > 0 ? q1[2] / b1[2].tps : 0);
	bk_model_free(m);
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	int bench = 0, quick = 0, tiny = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--host"))
			host_only = 1;
		else if (!strcmp(argv[i], "--bench"))
			bench = 1;
		else if (!strcmp(argv[i], "--quick"))
			quick = 1;
		else if (!strcmp(argv[i], "--tiny"))
			tiny = 1, enew = 10;
		else
			die_usage("usage: check_decode [--host] [--bench] [--quick | --tiny]");
	}
	bk_rng_seed(&rng, 20261201);
	if (host_only) {
		D_ = &bk_ops_host;
		check_engine();
		return bk_test_done("check_decode --host");
	}
	D_ = bk_device_select("cuda");
	if (bench) {
		time_decode(quick, tiny);
		return 0;
	}
	bk_cuda_decode_set_mode(2);
	const bk_gen_ops *G = bk_gen_ops_for(D_);
	static const int big_lin[][2] = { { 2048, 2048 }, { 2048, 256 }, { 2048, 5632 },
					  { 5632, 2048 }, { 2048, 32000 }, { 100, 37 }, { 264, 200 } };
	static const int tiny_lin[][2] = { { 128, 128 }, { 128, 32 }, { 128, 352 },
					   { 352, 128 }, { 128, 4099 }, { 100, 37 }, { 264, 200 } };
	static const int big_Ts[] = { 1, 8, 64, 65, 257 }, tiny_Ts[] = { 1, 8, 65 };
	const int (*lin)[2] = tiny ? tiny_lin : big_lin, *Ts = tiny ? tiny_Ts : big_Ts;
	const int VH = tiny ? 4099 : 32000, NT = tiny ? 3 : 5;
	const int VS = tiny ? 1031 : 32000; /* the sampler's rows */
	for (size_t i = 0; i < sizeof(big_lin) / sizeof(big_lin[0]); i++)
		for (int t = 0; t < NT; t++)
			if (lin[i][1] < VH || Ts[t] <= 64)
				check_linear(G, Ts[t], lin[i][0], lin[i][1]);
	const int VQ = tiny ? 4099 : 151936, NQ = tiny ? 2 : 16; /* the Qwen vocabulary */
	/* draws (rows): an eighth under --tiny */
#define ND(n) (tiny ? ((n) / 8 > 2 ? (n) / 8 : 2) : (n))
	check_sample(G, VS, 0, 1, ND(16), 4, 0);
	check_sample(G, VS, 0.8f, 0.9f, ND(64), 8, 0);     /* peaked */
	check_sample(G, VS, 1.0f, 0.9f, ND(64), 0.05f, 0); /* flat: the v1 full sort */
	check_sample(G, VQ, 1.0f, 0.95f, NQ, 0.1f, 0);
	check_sample(G, VS, 1.0f, 1.0f, ND(16), 2, 0);
	/* top-k: HF's default 50 peaked and flat, 1, thousands of a flat row, K >= V */
	check_sample(G, VS, 0.8f, 0.9f, ND(64), 8, 50);
	check_sample(G, VS, 1.0f, 0.9f, ND(64), 0.05f, 50);
	check_sample(G, VQ, 1.0f, 0.95f, NQ, 0.1f, 50);
	check_sample(G, VS, 1.0f, 1.0f, ND(16), 2, 1);
	check_sample(G, VS, 1.0f, 0.9f, ND(64), 0.05f, tiny ? 600 : 5000);
	check_sample(G, VS, 0.8f, 0.9f, ND(16), 8, VS);
#undef ND
	check_engine();
	return bk_test_done("check_decode");
}
