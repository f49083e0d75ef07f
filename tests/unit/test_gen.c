/* test_gen.c - the generation engine (gpu/gen.c + gpu/host/host_decode.c) on the shipped
 * stories260K model: (a) the logits every draw sees equal bk_model_forward +
 * bk_model_logits on the whole sequence so far (relative error < 1e-5), with and without
 * the shared prefix, with and without a LoRA (random non-zero A and B), several prompts
 * of different lengths decoding together; (b) greedy from BOS reproduces the model's
 * published sample; (c) sampled trajectories are identical with max batch 1, 3 and 16,
 * with the prompts queued in another order, and with or without the shared prefix, and
 * so are (bit for bit) the logits every draw of every sample saw; (d) scoring
 * (teacher_k): row j of every result is gpu/host/loss.h bk_teacher_topk of the logits
 * token j was drawn from, at the KL temperature, for samples that stopped (the stop id's
 * row included) and samples cut at max_new (row 0: the prompt's prefill row, computed
 * once for all its samples). */
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/hash.h"
#include "common/rng.h"
#include "formats/tokenizer.h"
#include "formats/template.h"
#include "gpu/gen.h"
#include "gpu/host/loss.h"
#include "gpu/load.h"
#include "tests/harness.h"

#define MODEL "models/stories260K"

static bk_loaded_model lm;
static const bk_model *M;
static bk_tok *spm;
static int V;

/* ---- logits capture ---- */

enum { MAXTAG = 8, MAXSTEP = 64 };
typedef struct {
	float *rows[MAXTAG][MAXSTEP]; /* [V] copies of the logits of each draw */
} capture;

static void on_logits(void *ctx, uint64_t tag, int step, const float *logits, int n)
{
	capture *c = ctx;
	BUG_ON(tag >= MAXTAG || step >= MAXSTEP || n != V);
	free(c->rows[tag][step]);
	c->rows[tag][step] = xmalloc((size_t)n * sizeof(float));
	memcpy(c->rows[tag][step], logits, (size_t)n * sizeof(float));
}

static void capture_free(capture *c)
{
	for (int i = 0; i < MAXTAG; i++)
		for (int j = 0; j < MAXSTEP; j++)
			free(c->rows[i][j]);
}

/* logits [n,V] of bk_model_forward on ids [n] (one sequence, positions 0..n-1) */
static float *ref_logits(const bk_lora *lora, const int32_t *ids, int n)
{
	const bk_ops *ops = M->ops;
	bk_acts *acts = bk_acts_create(M, n, lora ? lora->r : 0);
	int32_t *pos = xmalloc((size_t)n * sizeof(int32_t)), cu[2] = { 0, n };
	for (int t = 0; t < n; t++)
		pos[t] = t;
	bk_batch b = { .T = n, .S = 1, .ids = ids, .pos = pos, .cu_seqlens = cu };
	float *hid = ops->alloc((size_t)n * M->cfg.H * sizeof(float));
	float *lg = ops->alloc((size_t)n * V * sizeof(float));
	float *out = xmalloc((size_t)n * V * sizeof(float));
	bk_model_forward(M, lora, &b, NULL, acts, hid);
	bk_model_logits(M, hid, lg, n);
	ops->download(out, lg, (size_t)n * V * sizeof(float));
	ops->free(hid);
	ops->free(lg);
	free(pos);
	bk_acts_free(M, acts);
	return out;
}

static void prompt_of(const char *system, const char *user, bk_ids *out)
{
	out->n = 0;
	bk_template_prompt(BK_TMPL_RAW, spm, system, user, out);
}

/* (a) */
static void check_decode_logits(const bk_lora *lora, int use_prefix, const char *what)
{
	static const char *users[] = { "Once upon a time", "Tom had a red ball.",
				       "The sun was shining and the birds" };
	enum { NP = 3, NEW = 20 };
	bk_ids pr[NP] = { { 0 } };
	const int32_t *pp[NP];
	int lens[NP];
	for (int i = 0; i < NP; i++) {
		prompt_of("Sparky the dragon lives in a big castle.", users[i], (bk_ids *)&pr[i]);
		pp[i] = pr[i].v;
		lens[i] = (int)pr[i].n;
	}
	capture cap = { { { 0 } } };
	bk_gen_config cfg = { .max_batch = 4, .max_new = NEW, .sample = { 0, 1 },
			      .on_logits = on_logits, .ctx = &cap };
	int32_t *out[NP];
	int nout[NP];
	bk_gen_run(M, &bk_gen_ops_host, lora, &cfg, NULL, use_prefix ? -1 : 0, pp, lens, NP,
		   NULL, out, nout);
	double worst = 0;
	for (int i = 0; i < NP; i++) {
		CHECK(nout[i] == NEW, "%s: prompt %d: %d new tokens, want %d (no stop ids given)",
		      what, i, nout[i], NEW);
		int n = lens[i] + nout[i] - 1;
		int32_t *seq = xmalloc((size_t)n * sizeof(int32_t));
		memcpy(seq, pp[i], (size_t)lens[i] * sizeof(int32_t));
		memcpy(seq + lens[i], out[i], (size_t)(nout[i] - 1) * sizeof(int32_t));
		float *ref = ref_logits(lora, seq, n);
		for (int j = 0; j < nout[i]; j++) {
			const float *got = cap.rows[i][j];
			const float *want = ref + (size_t)(lens[i] - 1 + j) * V;
			CHECK(got != NULL, "%s: no logits for prompt %d step %d", what, i, j);
			if (!got)
				continue;
			double e = bk_max_relerr(got, want, (size_t)V, 1e-6);
			worst = e > worst ? e : worst;
			CHECK(e < 1e-5, "%s: prompt %d step %d: relative error %.3g", what, i, j, e);
			CHECK(out[i][j] == bk_sample_argmax(want, V),
			      "%s: prompt %d step %d: greedy token %d is not the argmax of the "
			      "full forward", what, i, j, out[i][j]);
		}
		free(ref);
		free(seq);
		free(out[i]);
		free(pr[i].v);
	}
	printf("decode vs full forward (%s): max relative error %.3g\n", what, worst);
	capture_free(&cap);
}

/* the first greedy logits with and without the adapter must differ (it is applied) */
static void check_lora_matters(const bk_lora *lora)
{
	int32_t bos = 1;
	const int32_t *pp[1] = { &bos };
	int lens[1] = { 1 }, n0, n1;
	int32_t *o0, *o1;
	capture c0 = { { { 0 } } }, c1 = { { { 0 } } };
	bk_gen_config cfg = { .max_batch = 1, .max_new = 1, .sample = { 0, 1 },
			      .on_logits = on_logits, .ctx = &c0 };
	bk_gen_run(M, &bk_gen_ops_host, NULL, &cfg, NULL, 0, pp, lens, 1, NULL, &o0, &n0);
	cfg.ctx = &c1;
	bk_gen_run(M, &bk_gen_ops_host, lora, &cfg, NULL, 0, pp, lens, 1, NULL, &o1, &n1);
	double e = bk_max_relerr(c1.rows[0][0], c0.rows[0][0], (size_t)V, 1e-6);
	CHECK(e > 1e-3, "the adapter changes the logits by only %.3g", e);
	free(o0);
	free(o1);
	capture_free(&c0);
	capture_free(&c1);
}

/* (b) */
static void check_published_sample(void)
{
	static const int32_t want[] = { 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315 };
	int32_t bos = bk_tok_bos(spm);
	const int32_t *pp[1] = { &bos };
	int lens[1] = { 1 }, n;
	int32_t *out, stop = bk_tok_eos(spm);
	bk_gen_config cfg = { .max_batch = 8, .max_new = 40, .sample = { 0, 0.9f },
			      .stop = &stop, .n_stop = 1 };
	bk_gen_run(M, &bk_gen_ops_host, NULL, &cfg, NULL, 0, pp, lens, 1, NULL, &out, &n);
	CHECK(n >= 11, "greedy from BOS gave only %d tokens", n);
	for (int i = 0; i < 11 && i < n; i++)
		CHECK(out[i] == want[i], "greedy token %d is %d, want %d", i, out[i], want[i]);
	char *text = bk_tok_decode(spm, out, (size_t)n);
	const char *sample = "Once upon a time, there was a little girl named Lily. She loved to "
			     "play outside in the park.";
	CHECK(!strncmp(text, sample, strlen(sample)), "greedy text '%s'", text);
	printf("greedy from BOS: %s\n", text);
	free(text);
	free(out);
}

/* (c) */
enum { NREC = 6, NTRAJ = 3 };
static const char *recs[NREC] = {
	"Once upon a time, there was a little girl", "The sun was shining and",
	"Tom had a red ball.", "One day, a big dog came to the park.",
	"Lily wanted to play with her friend.", "The cat sat",
};

typedef struct {
	int32_t *ids[NREC][NTRAJ];
	int n[NREC][NTRAJ];
	uint64_t lhash[NREC * NTRAJ]; /* chained XXH3 of every logits row a sample saw */
} trajs;

static void hash_logits(void *ctx, uint64_t tag, int step, const float *logits, int n)
{
	trajs *t = ctx;
	BUG_ON(tag >= NREC * NTRAJ);
	t->lhash[tag] = bk_hash(logits, (size_t)n * sizeof(float), t->lhash[tag] + (uint64_t)step);
}

static void run_sampled(int max_batch, int reverse, int use_prefix, trajs *t,
			bk_gen_stats *st)
{
	int32_t stop = bk_tok_eos(spm);
	bk_gen_config cfg = { .max_batch = max_batch, .max_new = 24, .sample = { 0.8f, 0.9f },
			      .stop = &stop, .n_stop = 1, .max_seq = 512,
			      .on_logits = hash_logits, .ctx = t };
	memset(t, 0, sizeof(*t));
	bk_gen *g = bk_gen_create(M, &bk_gen_ops_host, NULL, &cfg);
	bk_ids pr[NREC] = { { 0 } };
	const int32_t *pp[NREC];
	int lens[NREC];
	for (int i = 0; i < NREC; i++) {
		prompt_of("Sparky the dragon lives in a big castle.", recs[i], (bk_ids *)&pr[i]);
		pp[i] = pr[i].v;
		lens[i] = (int)pr[i].n;
	}
	int P = bk_gen_common_prefix(pp, lens, NREC);
	if (use_prefix)
		bk_gen_set_prefix(g, pp[0], P);
	for (int k = 0; k < NREC; k++) {
		int i = reverse ? NREC - 1 - k : k;
		uint64_t keys[NTRAJ], tags[NTRAJ];
		for (int j = 0; j < NTRAJ; j++) {
			keys[j] = bk_crng_key(7, bk_hash(recs[i], strlen(recs[i]), 0), (uint64_t)j, 0);
			tags[j] = (uint64_t)(i * NTRAJ + j);
		}
		bk_gen_submit(g, pp[i], lens[i], NTRAJ, keys, tags);
	}
	bk_gen_result r;
	int got = 0;
	while (bk_gen_step(g))
		while (bk_gen_take(g, &r)) {
			t->ids[r.tag / NTRAJ][r.tag % NTRAJ] = r.ids;
			t->n[r.tag / NTRAJ][r.tag % NTRAJ] = r.n;
			got++;
		}
	while (bk_gen_take(g, &r)) {
		t->ids[r.tag / NTRAJ][r.tag % NTRAJ] = r.ids;
		t->n[r.tag / NTRAJ][r.tag % NTRAJ] = r.n;
		got++;
	}
	CHECK(got == NREC * NTRAJ, "%d samples finished, want %d", got, NREC * NTRAJ);
	*st = *bk_gen_get_stats(g);
	CHECK(st->max_active <= max_batch, "max batch %d but %d decoded together", max_batch,
	      st->max_active);
	bk_gen_free(g);
	for (int i = 0; i < NREC; i++)
		free(pr[i].v);
}

static int same(const trajs *a, const trajs *b)
{
	for (int i = 0; i < NREC; i++)
		for (int j = 0; j < NTRAJ; j++)
			if (a->n[i][j] != b->n[i][j] ||
			    memcmp(a->ids[i][j], b->ids[i][j], (size_t)a->n[i][j] * sizeof(int32_t)))
				return 0;
	return !memcmp(a->lhash, b->lhash, sizeof(a->lhash));
}

static void trajs_free(trajs *t)
{
	for (int i = 0; i < NREC; i++)
		for (int j = 0; j < NTRAJ; j++)
			free(t->ids[i][j]);
}

static void check_batch_invariance(void)
{
	trajs base, t;
	bk_gen_stats st;
	run_sampled(16, 0, 1, &base, &st);
	CHECK(st.prefix_builds == 1 && st.prefix_len > 0 && st.prefix_hits == NREC &&
		      st.prefix_misses == 0,
	      "prefix: %llu builds of %d tokens, %llu hits, %llu misses",
	      (unsigned long long)st.prefix_builds, st.prefix_len,
	      (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_misses);
	CHECK(st.max_active > 3, "16 slots but at most %d sequences decoded together",
	      st.max_active);
	/* the trajectories are not all alike: the keys matter */
	int differ = 0;
	for (int i = 0; i < NREC; i++)
		differ += base.n[i][0] != base.n[i][1] ||
			  memcmp(base.ids[i][0], base.ids[i][1], (size_t)base.n[i][0] * 4);
	CHECK(differ >= NREC / 2, "only %d of %d records have distinct trajectories", differ, NREC);
	static const struct { int mb, rev, pre; const char *what; } runs[] = {
		{ 1, 0, 1, "max batch 1" }, { 3, 0, 1, "max batch 3" },
		{ 16, 1, 1, "reversed order" }, { 3, 1, 0, "no shared prefix" },
	};
	for (size_t k = 0; k < sizeof(runs) / sizeof(runs[0]); k++) {
		run_sampled(runs[k].mb, runs[k].rev, runs[k].pre, &t, &st);
		CHECK(same(&base, &t), "%s: trajectories or their logits (bit for bit) differ from "
		      "max batch 16's", runs[k].what);
		if (runs[k].mb == 1)
			CHECK(st.max_active == 1, "max batch 1 ran %d together", st.max_active);
		trajs_free(&t);
	}
	trajs_free(&base);
}

/* (d) */
static void check_scoring(void)
{
	enum { NP = 2, NT = 3, NEW = 24, K = 8 };
	const float T = 1.3f;
	bk_ids pr[NP] = { { 0 } };
	for (int i = 0; i < NP; i++)
		prompt_of("Sparky the dragon lives in a big castle.", recs[i], &pr[i]);
	/* the stop id: the token drawn most often without one, so some samples stop */
	int *count = xcalloc((size_t)V, sizeof(int)), stop = 0;
	for (int pass = 0; pass < 2; pass++) {
		capture cap;
		memset(&cap, 0, sizeof cap);
		int32_t sid = stop;
		bk_gen_config cfg = { .max_batch = 4, .max_new = NEW, .sample = { 1.0f, 1.0f },
				      .stop = &sid, .n_stop = pass, .max_seq = 512,
				      .teacher_k = pass ? K : 0, .teacher_temperature = T,
				      .on_logits = on_logits, .ctx = &cap };
		bk_gen *g = bk_gen_create(M, &bk_gen_ops_host, NULL, &cfg);
		for (int i = 0; i < NP; i++) {
			uint64_t keys[NT], tags[NT];
			for (int j = 0; j < NT; j++) {
				keys[j] = bk_crng_key(3, (uint64_t)i, (uint64_t)j, 0);
				tags[j] = (uint64_t)(i * NT + j);
			}
			bk_gen_submit(g, pr[i].v, (int)pr[i].n, NT, keys, tags);
		}
		int stopped = 0, cut = 0, got = 0;
		int32_t ids[K];
		float logp[K], rest;
		bk_gen_result r;
		while (bk_gen_step(g))
			while (bk_gen_take(g, &r)) {
				got++;
				for (int j = 0; j < r.n; j++)
					count[r.ids[j]] += !pass;
				if (!pass) {
					CHECK(!r.t_ids && !r.t_logp && !r.t_rest, "no scoring, yet rows");
					free(r.ids);
					continue;
				}
				stopped += r.stopped, cut += !r.stopped && r.n == NEW;
				CHECK(r.t_ids && r.t_logp && r.t_rest, "sample %llu: no teacher rows",
				      (unsigned long long)r.tag);
				for (int j = 0; j < r.n && r.t_ids; j++) {
					const float *lg = cap.rows[r.tag][j];
					bk_teacher_topk(NULL, NULL, lg, 1, 1, V, 8192, T, 0, K, ids, logp,
							&rest);
					CHECK(!memcmp(ids, r.t_ids + j * K, sizeof ids) &&
						      !memcmp(logp, r.t_logp + j * K, sizeof logp) &&
						      rest == r.t_rest[j],
					      "sample %llu row %d of %d%s: not the top-%d of its logits",
					      (unsigned long long)r.tag, j, r.n,
					      r.stopped && j == r.n - 1 ? " (the stop id's)" : "", K);
				}
				free(r.ids), free(r.t_ids), free(r.t_logp), free(r.t_rest);
			}
		CHECK(got == NP * NT, "%d samples, want %d", got, NP * NT);
		bk_gen_free(g);
		capture_free(&cap);
		if (!pass) {
			for (int v = 0; v < V; v++)
				stop = count[v] > count[stop] ? v : stop;
			continue;
		}
		CHECK(stopped > 0 && cut > 0, "stop id %d: %d samples stopped, %d were cut; want both",
		      stop, stopped, cut);
		printf("scoring: stop id %d, %d samples stopped, %d cut at %d tokens\n", stop, stopped,
		       cut, NEW);
	}
	free(count);
	for (int i = 0; i < NP; i++)
		free(pr[i].v);
}

int main(void)
{
	lm = bk_model_load(&bk_ops_host, MODEL);
	M = lm.model;
	V = M->cfg.V;
	spm = bk_tok_open(MODEL "/tokenizer.model");

	bk_lora *lora = bk_lora_create(M, 4, 8.0f, 0.0f, BK_LORA_ALL);
	bk_rng rng;
	bk_rng_seed(&rng, 42);
	float *h = xmalloc(lora->n_flat * sizeof(float));
	for (size_t i = 0; i < lora->n_flat; i++)
		h[i] = (float)(bk_rng_uniform(&rng) - 0.5) * 0.2f;
	M->ops->upload(lora->flat, h, lora->n_flat * sizeof(float));
	free(h);

	check_decode_logits(NULL, 0, "base");
	check_decode_logits(NULL, 1, "base, shared prefix");
	check_decode_logits(lora, 0, "lora");
	check_decode_logits(lora, 1, "lora, shared prefix");
	check_lora_matters(lora);
	check_published_sample();
	check_batch_invariance();
	check_scoring();

	bk_lora_free(M, lora);
	bk_tok_free(spm);
	bk_model_unload(&lm);
	return bk_test_done("gen");
}
