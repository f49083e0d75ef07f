/* test_gen_fast.c - the engine's fast decode step (gpu/gen.c, forward_fast: the one
 * pinned input block, batch buckets with padding rows on the scratch KV block, table
 * width buckets, draws uploaded with the inputs, the capture and epoch logic) on the
 * host: the host twin's gen ops with the fast hooks of gen.h filled in by host stand-ins
 * (memcpy for the copies, bk_sample_token for the device sampler, a capture that runs the
 * step eagerly and hands back no graph, so the engine captures again every step).  On
 * stories260K, greedy and sampled, at --max-batch 1, 3 and 5 (buckets 1, 2, 4, 8), with a
 * shared prefix and prompts of different lengths: the tokens and the logits of every
 * draw are bit for bit those of the plain host engine, the fast path ran for the decode
 * steps and its capture was attempted, and the steps made no blocking copy (only the
 * shared prefix's one forward uploads through the op table); with teacher scoring
 * (teacher_k) the fast step's rows (its copies on the stream, a bucket's padding rows
 * left out) are the plain engine's bit for bit.  What this cannot check:
 * CUDA graph replay and the asynchronous copies themselves (tests/gpu/check_decode.c
 * does, on a GPU). */
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/gen.h"
#include "gpu/load.h"
#include "tests/harness.h"

#define MODEL "models/stories260K"

static int n_fast_calls, n_capture, n_sample_calls, n_upload, n_download;

/* the host op table with its blocking copies counted */
static bk_ops counted;
static void c_upload(void *d, const void *s, size_t n)
{
	n_upload++;
	bk_ops_host.upload(d, s, n);
}
static void c_download(void *d, const void *s, size_t n)
{
	n_download++;
	bk_ops_host.download(d, s, n);
}

static int h_fast(void)
{
	n_fast_calls++;
	return 1;
}
static void *h_host_alloc(size_t n) { return xmalloc(n ? n : 1); }
static void h_host_free(void *p) { free(p); }
static void h_copy(void *d, const void *s, size_t n) { memcpy(d, s, n); }
static void h_sync(void) {}
static int h_capture_begin(void)
{
	n_capture++;
	return 1;
}
static void *h_capture_end(void) { return NULL; } /* "no graph": the engine runs eagerly */
static void h_graph_launch(void *g)
{
	(void)g;
	BUG("graph_launch without a graph");
}
static void h_graph_free(void *g) { BUG_ON(g != NULL); }
static uint64_t h_epoch(void) { return 7; }

static int g_V;
static bk_sample_work *g_sw;
static void h_sample(int32_t *ids, const float *logits, const int32_t *rows, const uint64_t *keys,
		     const int32_t *counters, int N, int V, float temperature, int top_k,
		     float top_p, void *work)
{
	(void)work;
	n_sample_calls++;
	bk_sample_params sp = { temperature, top_p, top_k };
	for (int i = 0; i < N; i++) {
		double u = temperature > 0 ? bk_crng_uniform(keys[i], (uint64_t)counters[i]) : 0;
		ids[i] = bk_sample_token(logits + (size_t)rows[i] * V, V, &sp, u, g_sw);
	}
}
static size_t h_work(int N, int V)
{
	(void)N;
	return (size_t)V;
}

enum { NP = 7, NEW = 24 };
typedef struct {
	float *rows[NP][NEW];
} capture;

static void on_logits(void *ctx, uint64_t tag, int step, const float *logits, int n)
{
	capture *c = ctx;
	BUG_ON(tag >= NP || step >= NEW || n != g_V);
	free(c->rows[tag][step]);
	c->rows[tag][step] = xmalloc((size_t)n * 4);
	memcpy(c->rows[tag][step], logits, (size_t)n * 4);
}

static void run(const bk_model *m, const bk_gen_ops *go, int max_batch, float temperature,
		capture *cap, int32_t **out, int *nout)
{
	int32_t *pr[NP];
	const int32_t *pp[NP];
	int lens[NP];
	uint64_t keys[NP];
	bk_rng r;
	bk_rng_seed(&r, 3);
	for (int i = 0; i < NP; i++) {
		lens[i] = 9 + (i * 13) % 17;
		pr[i] = xmalloc((size_t)lens[i] * 4);
		pr[i][0] = 1;
		for (int j = 1; j < lens[i]; j++)
			pr[i][j] = j < 6 ? 10 + j : 3 + (int32_t)bk_rng_below(&r, (uint64_t)g_V - 3);
		pp[i] = pr[i];
		keys[i] = bk_crng_key(9, (uint64_t)i, 0, 0);
	}
	bk_gen_config cfg = { .max_batch = max_batch, .max_new = NEW, .max_seq = 256,
			      .sample = { temperature, 0.9f }, .on_logits = on_logits, .ctx = cap };
	bk_gen_run(m, go, NULL, &cfg, NULL, -1, pp, lens, NP, temperature > 0 ? keys : NULL, out,
		   nout);
	for (int i = 0; i < NP; i++)
		free(pr[i]);
}

static int same(int32_t **a, const int *na, const capture *ca, int32_t **b, const int *nb,
		const capture *cb)
{
	for (int i = 0; i < NP; i++) {
		if (na[i] != nb[i] || memcmp(a[i], b[i], (size_t)na[i] * 4))
			return 0;
		for (int s = 0; s < na[i]; s++)
			if (!ca->rows[i][s] || !cb->rows[i][s] ||
			    memcmp(ca->rows[i][s], cb->rows[i][s], (size_t)g_V * 4))
				return 0;
	}
	return 1;
}

static void release(int32_t **o, capture *c)
{
	for (int i = 0; i < NP; i++) {
		free(o[i]);
		for (int s = 0; s < NEW; s++) {
			free(c->rows[i][s]);
			c->rows[i][s] = NULL;
		}
	}
}

/* teacher scoring through the queue API (bk_gen_run has none): every sample's ids and
 * teacher rows, by tag */
enum { SK = 6 };
typedef struct {
	int32_t *ids[NP], *t_ids[NP];
	float *t_logp[NP], *t_rest[NP];
	int n[NP];
} scored;

static void run_scored(const bk_model *m, const bk_gen_ops *go, int max_batch, scored *o)
{
	bk_gen_config cfg = { .max_batch = max_batch, .max_new = NEW, .max_seq = 256,
			      .sample = { 0.8f, 0.9f }, .teacher_k = SK,
			      .teacher_temperature = 0.9f };
	bk_gen *g = bk_gen_create(m, go, NULL, &cfg);
	for (int i = 0; i < NP; i++) {
		int32_t pr[12] = { 1, 11, 12, 13, 14, 15 };
		for (int j = 6; j < 12; j++)
			pr[j] = 3 + (i * 37 + j * 11) % (g_V - 3);
		uint64_t key = bk_crng_key(4, (uint64_t)i, 0, 0), tag = (uint64_t)i;
		bk_gen_submit(g, pr, 6 + i % 6 + 1, 1, &key, &tag);
	}
	bk_gen_result r;
	while (bk_gen_step(g))
		while (bk_gen_take(g, &r)) {
			o->ids[r.tag] = r.ids, o->n[r.tag] = r.n;
			o->t_ids[r.tag] = r.t_ids, o->t_logp[r.tag] = r.t_logp, o->t_rest[r.tag] = r.t_rest;
		}
	bk_gen_free(g);
}

static void check_scored(const bk_model *m, const bk_gen_ops *fast)
{
	static const int batches[] = { 1, 3, 5 };
	for (int bi = 0; bi < 3; bi++) {
		scored a, b;
		memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
		run_scored(m, &bk_gen_ops_host, batches[bi], &a);
		run_scored(m, fast, batches[bi], &b);
		int rows = 0;
		for (int i = 0; i < NP; i++) {
			int n = a.n[i];
			CHECK(a.t_ids[i] && b.t_ids[i] && n == b.n[i] && n > 0 &&
				      !memcmp(a.ids[i], b.ids[i], (size_t)n * 4) &&
				      !memcmp(a.t_ids[i], b.t_ids[i], (size_t)n * SK * 4) &&
				      !memcmp(a.t_logp[i], b.t_logp[i], (size_t)n * SK * 4) &&
				      !memcmp(a.t_rest[i], b.t_rest[i], (size_t)n * 4),
			      "max batch %d, sample %d: the fast step's teacher rows differ", batches[bi], i);
			rows += n;
			free(a.ids[i]), free(a.t_ids[i]), free(a.t_logp[i]), free(a.t_rest[i]);
			free(b.ids[i]), free(b.t_ids[i]), free(b.t_logp[i]), free(b.t_rest[i]);
		}
		printf("scored, max batch %d: %d teacher rows of the fast step bit for bit\n",
		       batches[bi], rows);
	}
}

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	counted = bk_ops_host;
	counted.name = "host-counted";
	counted.upload = c_upload;
	counted.download = c_download;
	bk_loaded_model lm = bk_model_load(&counted, MODEL);
	g_V = lm.model->cfg.V;
	g_sw = bk_sample_work_new(g_V);
	bk_gen_ops fast = bk_gen_ops_host;
	fast.name = "host-fast";
	fast.sample = h_sample;
	fast.sample_work_bytes = h_work;
	fast.fast = h_fast;
	fast.host_alloc = h_host_alloc;
	fast.host_free = h_host_free;
	fast.upload_async = h_copy;
	fast.download_async = h_copy;
	fast.sync = h_sync;
	fast.capture_begin = h_capture_begin;
	fast.capture_end = h_capture_end;
	fast.graph_launch = h_graph_launch;
	fast.graph_free = h_graph_free;
	fast.epoch = h_epoch;
	static const float temps[] = { 0, 0.8f };
	static const int batches[] = { 1, 3, 5 };
	for (int ti = 0; ti < 2; ti++)
		for (int bi = 0; bi < 3; bi++) {
			static capture ch, cf;
			int32_t *oh[NP], *of[NP];
			int nh[NP], nf[NP];
			run(lm.model, &bk_gen_ops_host, batches[bi], temps[ti], &ch, oh, nh);
			int calls = n_sample_calls, caps = n_capture, up = n_upload, down = n_download;
			run(lm.model, &fast, batches[bi], temps[ti], &cf, of, nf);
			up = n_upload - up, down = n_download - down;
			int ok = same(oh, nh, &ch, of, nf, &cf);
			printf("fast decode step, temperature %g, max batch %d: tokens and logits %s; "
			       "%d device draws, %d captures tried, %d blocking uploads, %d downloads\n",
			       temps[ti], batches[bi], ok ? "bit for bit" : "DIFFER",
			       n_sample_calls - calls, n_capture - caps, up, down);
			/* the steps copy only through the hooks: the blocking copies are the shared
			 * prefix's one forward (6 input arrays) */
			CHECK(up <= 6 && down == 0, "%d blocking uploads and %d downloads in the steps",
			      up, down);
			CHECK(ok, "temperature %g max batch %d: the fast step differs from the host engine",
			      temps[ti], batches[bi]);
			/* steps of the same shape after the first try a capture */
			CHECK(n_sample_calls - calls > NEW / 2 && n_capture - caps > NEW / 2,
			      "the fast path ran %d draws and %d captures", n_sample_calls - calls,
			      n_capture - caps);
			release(oh, &ch);
			release(of, &cf);
		}
	CHECK(n_fast_calls >= 6, "fast() asked %d times", n_fast_calls);
	check_scored(lm.model, &fast);
	bk_sample_work_free(g_sw);
	bk_model_unload(&lm);
	return bk_test_done("test_gen_fast");
}
