/* check_gen.c - the generation ops of bk_gen_ops_cuda (gpu/cuda/cuda_gen.cu, cuda_sample.cu)
 * against the host twin bk_gen_ops_host and bk_sample_token on fresh random inputs:
 * linear (odd and aligned sizes, T = 1..257), LoRA, paged KV store + decode attention
 * (odd lengths, lengths on and across block boundaries and key splits, GQA ratios 1, 2,
 * 8, D = 8, 64, 128, shuffled block tables, another layer than 0), and sampling (greedy
 * with tied maxima, temperature + top-p peaked and flat rows, top-p 1, a NaN row; top-k
 * 50, 1, a K of thousands of a flat row, K >= V, with top-p 0.9 and 1).  Every
 * output is poisoned with NaN before the run; NaN never passes.  Also: a row's result
 * does not depend on the other rows run with it (bit for bit), for linear and attention.
 * The linear on a 4-bit weight (QLoRA: NF4 and FP4, with and without double quant,
 * weights of odd width, odd size, several nested blocks, split-K; T = 1..65, the decode
 * kernels on the 4 bits up to 64 rows, dequantise + bf16 above): bit for bit the linear
 * on the dequantised bf16 weight (bk_q4_dequantize(q, w, 1) uploaded plain: the 4-bit
 * kernels expand exactly those values), within the linear's bound of the host twin on
 * them, and its last row alone bit for bit (across the 64-row switch for T = 65).
 * Bounds (max|cuda - host| / max(max|host|, 1e-3)):
 *   linear 1e-3 (weights and activations bf16-exact on both sides: only the fp32
 *          summation order differs)
 *   LoRA   1e-5 (fp32 both, other summation order)
 *   attention 2e-3 (keys and values bf16-exact on both sides; fp32 math, __expf)
 *   sampling: the same token, every draw (a mismatch needs a cumulative mass within
 *   ~1e-16 of a boundary).
 * --e2e: greedy generation (bk_gen_run, shared prefix) on models/stories260K on the GPU
 * against the host twin for a fixed prompt set: the same tokens, or a first difference
 * only where the host's top-2 logit margin is within 4x the logit error there (a near
 * tie, reported with its step and margin); logits before it within 5e-2; the prefix
 * built once on each device.
 * --tiny (tests/gpu/run.sh --emu, the CPU's emulation of the GPU): the same checks at
 * small sizes: linears up to 65 x 264 x 200, context lengths up to 257 and one of 600,
 * 8 query heads at most, sampling rows of V 4099 for those of 32000 and a quarter of
 * the draws (--e2e is stories260K's size either way).
 * One line per check; exit 1 on any failure.  Needs a GPU (dies naming the call).
 * Usage: check_gen [--e2e | --tiny] */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "formats/tokenizer.h"
#include "formats/template.h"
#include "gpu/cuda/cuda.h"
#include "gpu/device.h"
#include "gpu/gen.h"
#include "gpu/load.h"
#include "gpu/quant4.h"
#include "tests/gpu/gpu_check.h"
#include "tests/harness.h"

static const bk_ops *D_;
static const bk_gen_ops *G;
static bk_rng rng;

static float urand(void) { return (float)(2 * bk_rng_uniform(&rng) - 1); }

static float *hrand(size_t n, float scale, int round)
{
	return round ? gc_rand_bf16(&rng, n, scale) : gc_rand(&rng, n, scale);
}

static void poison(void *d, size_t bytes)
{
	float *n = xmalloc(bytes);
	for (size_t i = 0; i < bytes / sizeof(float); i++)
		n[i] = NAN;
	D_->upload(d, n, bytes);
	free(n);
}

static float *fetch(const void *d, size_t nfloat)
{
	float *h = xmalloc(nfloat * sizeof(float));
	D_->download(h, d, nfloat * sizeof(float));
	return h;
}

static void report(const char *what, double err, double tol)
{
	int ok = err <= tol; /* NaN fails */
	printf("%-58s err %.3e (bound %.0e) %s\n", what, err, tol, ok ? "ok" : "FAIL");
	CHECK(ok, "%s: error %.3g over %.1g", what, err, tol);
}

/* ---- linear and LoRA ---- */

static void check_linear(int T, int in, int out)
{
	float *x = hrand((size_t)T * in, 1, 0), *w = hrand((size_t)out * in, 0.1f, 1);
	float *yh = xmalloc((size_t)T * out * sizeof(float));
	bk_weight wh = { out, in, w, BK_WEIGHT_PLAIN };
	/* the host reference sees the same bf16 activations as the tensor cores */
	float *xr = xmalloc((size_t)T * in * sizeof(float));
	for (size_t i = 0; i < (size_t)T * in; i++)
		xr[i] = gc_bf16(x[i]);
	bk_gen_ops_host.linear(yh, xr, &wh, T);
	bk_weight *wd = D_->weight_upload(w, out, in);
	float *xd = gc_dup(D_, x, (size_t)T * in * 4), *yd = D_->alloc((size_t)T * out * 4);
	poison(yd, (size_t)T * out * 4);
	G->linear(yd, xd, wd, T);
	float *y = fetch(yd, (size_t)T * out);
	char what[96];
	snprintf(what, sizeof(what), "linear T=%d in=%d out=%d", T, in, out);
	report(what, bk_max_relerr(y, yh, (size_t)T * out, 1e-3), 1e-3);
	/* batch invariance: the last row alone, bit for bit */
	float *y1d = D_->alloc((size_t)out * 4);
	poison(y1d, (size_t)out * 4);
	G->linear(y1d, xd + (size_t)(T - 1) * in, wd, 1);
	float *y1 = fetch(y1d, out);
	int same = !memcmp(y1, y + (size_t)(T - 1) * out, (size_t)out * 4);
	printf("%-58s %s\n", "  its last row alone: bit for bit", same ? "ok" : "FAIL");
	CHECK(same, "linear T=%d in=%d out=%d: the last row differs when run alone", T, in, out);
	D_->free(xd);
	D_->free(yd);
	D_->free(y1d);
	D_->weight_free(wd);
	free(x);
	free(xr);
	free(w);
	free(yh);
	free(y);
	free(y1);
}

/* the linear on a 4-bit weight: see the top */
static void check_linear_q4(int T, int in, int out, int type, int dq)
{
	float *x = hrand((size_t)T * in, 1, 0), *w = hrand((size_t)out * in, 0.1f, 0);
	bk_q4 q;
	bk_q4_quantize(&q, w, out, in, type, dq, 0);
	float *wb = xmalloc((size_t)out * in * sizeof(float)); /* the dequantised bf16 values */
	bk_q4_dequantize(&q, wb, 1);
	float *xr = xmalloc((size_t)T * in * sizeof(float)), *yh = xmalloc((size_t)T * out * 4);
	for (size_t i = 0; i < (size_t)T * in; i++)
		xr[i] = gc_bf16(x[i]);
	bk_weight wh = { out, in, wb, BK_WEIGHT_PLAIN };
	bk_gen_ops_host.linear(yh, xr, &wh, T);
	bk_weight *wq = D_->weight_upload_q4(&q, 1), *wp = D_->weight_upload(wb, out, in);
	float *xd = gc_dup(D_, x, (size_t)T * in * 4), *yd = D_->alloc((size_t)T * out * 4);
	float *ypd = D_->alloc((size_t)T * out * 4), *y1d = D_->alloc((size_t)out * 4);
	poison(yd, (size_t)T * out * 4);
	poison(ypd, (size_t)T * out * 4);
	poison(y1d, (size_t)out * 4);
	G->linear(yd, xd, wq, T);
	G->linear(ypd, xd, wp, T);
	G->linear(y1d, xd + (size_t)(T - 1) * in, wq, 1);
	float *y = fetch(yd, (size_t)T * out), *yp = fetch(ypd, (size_t)T * out);
	float *y1 = fetch(y1d, out);
	char what[96];
	snprintf(what, sizeof(what), "linear 4-bit %s%s T=%d in=%d out=%d", bk_q4_name(type),
		 dq ? "+dq" : "", T, in, out);
	report(what, bk_max_relerr(y, yh, (size_t)T * out, 1e-3), 1e-3);
	int same = !memcmp(y, yp, (size_t)T * out * 4);
	printf("%-58s %s\n", "  = the linear on the dequantised bf16 weight, bit for bit",
	       same ? "ok" : "FAIL");
	CHECK(same, "%s: differs from the linear on the dequantised weight", what);
	same = !memcmp(y1, y + (size_t)(T - 1) * out, (size_t)out * 4);
	printf("%-58s %s\n", "  its last row alone: bit for bit", same ? "ok" : "FAIL");
	CHECK(same, "%s: the last row differs when run alone", what);
	void *d[] = { xd, yd, ypd, y1d };
	for (int i = 0; i < 4; i++)
		D_->free(d[i]);
	D_->weight_free(wq);
	D_->weight_free(wp);
	bk_q4_free(&q);
	free(x), free(w), free(wb), free(xr), free(yh), free(y), free(yp), free(y1);
}

static void check_lora(int T, int in, int out, int R)
{
	float *x = hrand((size_t)T * in, 1, 0), *A = hrand((size_t)R * in, 0.2f, 0);
	float *B = hrand((size_t)out * R, 0.2f, 0), *y0 = hrand((size_t)T * out, 1, 0);
	float *yh = xmalloc((size_t)T * out * 4), *xa = xmalloc((size_t)T * R * 4);
	memcpy(yh, y0, (size_t)T * out * 4);
	bk_gen_ops_host.lora(yh, x, A, B, T, in, out, R, 2.0f, xa);
	float *xd = gc_dup(D_, x, (size_t)T * in * 4), *Ad = gc_dup(D_, A, (size_t)R * in * 4);
	float *Bd = gc_dup(D_, B, (size_t)out * R * 4), *yd = gc_dup(D_, y0, (size_t)T * out * 4);
	float *xad = D_->alloc((size_t)T * R * 4);
	poison(xad, (size_t)T * R * 4);
	G->lora(yd, xd, Ad, Bd, T, in, out, R, 2.0f, xad);
	float *y = fetch(yd, (size_t)T * out);
	char what[96];
	snprintf(what, sizeof(what), "lora T=%d in=%d out=%d R=%d", T, in, out, R);
	report(what, bk_max_relerr(y, yh, (size_t)T * out, 1e-3), 1e-5);
	void *d[] = { xd, Ad, Bd, yd, xad };
	for (int i = 0; i < 5; i++)
		D_->free(d[i]);
	free(x), free(A), free(B), free(y0), free(yh), free(xa), free(y);
}

/* ---- paged KV cache + attention ---- */

/* scale 0: Dh^-0.5; cap, window: ops.h bk_attn */
static void check_attend_p(int NH, int NKV, int Dh, const int *lens, int S, int qper,
			   float scale, float cap, int window)
{
	bk_attn ap = bk_attn_default(Dh);
	if (scale > 0)
		ap.scale = scale;
	ap.softcap = cap;
	ap.window = window;
	const int L = 3, l = 1, BS = BK_GEN_BLOCK;
	int W = 1, NB = 0;
	for (int s = 0; s < S; s++) {
		int nb = (lens[s] + BS - 1) / BS;
		W = nb > W ? nb : W;
		NB += nb;
	}
	/* shuffled block ids: sequence s's table row */
	int32_t *perm = xmalloc((size_t)NB * 4), *table = xmalloc((size_t)S * W * 4);
	for (int i = 0; i < NB; i++)
		perm[i] = i;
	for (int i = NB - 1; i > 0; i--) {
		int j = (int)bk_rng_below(&rng, (uint64_t)i + 1);
		int32_t t = perm[i];
		perm[i] = perm[j];
		perm[j] = t;
	}
	for (int s = 0, at = 0; s < S; s++)
		for (int j = 0; j < W; j++)
			table[(size_t)s * W + j] = j < (lens[s] + BS - 1) / BS ? perm[at++] : -1;
	/* every key of every sequence through kv_store (tokens = all positions) */
	int T = 0;
	for (int s = 0; s < S; s++)
		T += lens[s];
	size_t kvw = (size_t)NKV * Dh;
	float *k = hrand((size_t)T * kvw, 1, 1), *v = hrand((size_t)T * kvw, 1, 1);
	int32_t *slot = xmalloc((size_t)T * 4);
	for (int s = 0, t = 0; s < S; s++)
		for (int j = 0; j < lens[s]; j++, t++)
			slot[t] = table[(size_t)s * W + j / BS] * BS + j % BS;
	size_t pool_n = (size_t)NB * L * BS * kvw;
	float *kph = xmalloc(pool_n * 4), *vph = xmalloc(pool_n * 4);
	for (size_t i = 0; i < pool_n; i++)
		kph[i] = vph[i] = NAN; /* unwritten rows must never be read */
	bk_gen_ops_host.kv_store(kph, vph, l, L, k, v, slot, T, NKV, Dh);
	void *kpd = D_->alloc(pool_n * 2), *vpd = D_->alloc(pool_n * 2); /* 0xff: NaN bf16 */
	float *kd = gc_dup(D_, k, (size_t)T * kvw * 4), *vd = gc_dup(D_, v, (size_t)T * kvw * 4);
	int32_t *slotd = gc_dup(D_, slot, (size_t)T * 4), *tabd = gc_dup(D_, table, (size_t)S * W * 4);
	G->kv_store(kpd, vpd, l, L, kd, vd, slotd, T, NKV, Dh);
	/* queries: the last qper positions of each sequence (qper 1: a decode step) */
	int Q = 0;
	for (int s = 0; s < S; s++)
		Q += lens[s] < qper ? lens[s] : qper;
	int32_t *seq = xmalloc((size_t)Q * 4), *nkey = xmalloc((size_t)Q * 4);
	for (int s = 0, t = 0; s < S; s++)
		for (int j = lens[s] - (lens[s] < qper ? lens[s] : qper); j < lens[s]; j++, t++) {
			seq[t] = s;
			nkey[t] = j + 1;
		}
	size_t qn = (size_t)Q * NH * Dh;
	float *q = hrand(qn, 1, 0), *oh = xmalloc(qn * 4);
	bk_gen_ops_host.attend(oh, q, seq, nkey, Q, NH, NKV, Dh, kph, vph, l, L, table, W, &ap);
	float *qd = gc_dup(D_, q, qn * 4), *od = D_->alloc(qn * 4);
	int32_t *seqd = gc_dup(D_, seq, (size_t)Q * 4), *nkeyd = gc_dup(D_, nkey, (size_t)Q * 4);
	poison(od, qn * 4);
	G->attend(od, qd, seqd, nkeyd, Q, NH, NKV, Dh, kpd, vpd, l, L, tabd, W, &ap);
	float *o = fetch(od, qn);
	char what[128];
	snprintf(what, sizeof(what), "kv_store+attend NH=%d NKV=%d D=%d S=%d queries=%d (max %d)%s",
		 NH, NKV, Dh, S, Q, lens[S - 1], cap > 0 || window > 0 ? " cap/window" : "");
	report(what, bk_max_relerr(o, oh, qn, 1e-3), 2e-3);
	/* batch invariance: the last query alone */
	float *o1d = D_->alloc((size_t)NH * Dh * 4);
	poison(o1d, (size_t)NH * Dh * 4);
	G->attend(o1d, qd + (size_t)(Q - 1) * NH * Dh, seqd + Q - 1, nkeyd + Q - 1, 1, NH, NKV, Dh,
		  kpd, vpd, l, L, tabd, W, &ap);
	float *o1 = fetch(o1d, (size_t)NH * Dh);
	int same = !memcmp(o1, o + (size_t)(Q - 1) * NH * Dh, (size_t)NH * Dh * 4);
	printf("%-58s %s\n", "  its last query alone: bit for bit", same ? "ok" : "FAIL");
	CHECK(same, "%s: the last query differs when run alone", what);
	void *d[] = { kpd, vpd, kd, vd, slotd, tabd, qd, od, seqd, nkeyd, o1d };
	for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
		D_->free(d[i]);
	free(perm), free(table), free(k), free(v), free(slot), free(kph), free(vph);
	free(seq), free(nkey), free(q), free(oh), free(o), free(o1);
}

static void check_attend(int NH, int NKV, int Dh, const int *lens, int S, int qper)
{
	check_attend_p(NH, NKV, Dh, lens, S, qper, 0, 0, 0);
}

/* ---- sampling ---- */

static void check_sample(int V, float temperature, float top_p, int N, int top_k)
{
	/* row kinds by i % 4: peaked (scale 8), flat (0.05), tied maxima, mid (2) */
	float *lg = xmalloc((size_t)N * V * 4);
	for (int i = 0; i < N; i++) {
		float sc = i % 4 == 0 ? 8.0f : i % 4 == 1 ? 0.05f : 2.0f;
		for (int j = 0; j < V; j++)
			lg[(size_t)i * V + j] = sc * urand();
		if (i % 4 == 2) { /* three equal maxima */
			for (int r = 0; r < 3; r++)
				lg[(size_t)i * V + (int)bk_rng_below(&rng, (uint64_t)V)] = 50.0f;
		}
	}
	int nan_row = N > 4 ? 5 : -1;
	if (nan_row >= 0)
		lg[(size_t)nan_row * V + V / 2] = NAN;
	int32_t *rows = xmalloc((size_t)N * 4), *ctr = xmalloc((size_t)N * 4);
	uint64_t *keys = xmalloc((size_t)N * 8);
	for (int i = 0; i < N; i++) {
		rows[i] = N - 1 - i; /* draws read rows out of order */
		keys[i] = bk_rng_u64(&rng);
		ctr[i] = (int32_t)bk_rng_below(&rng, 200);
	}
	float *lgd = gc_dup(D_, lg, (size_t)N * V * 4);
	int32_t *rowsd = gc_dup(D_, rows, (size_t)N * 4), *ctrd = gc_dup(D_, ctr, (size_t)N * 4);
	uint64_t *keysd = gc_dup(D_, keys, (size_t)N * 8);
	int32_t *idsd = D_->alloc((size_t)N * 4);
	void *work = D_->alloc(G->sample_work_bytes(N, V));
	poison(idsd, (size_t)N * 4);
	G->sample(idsd, lgd, rowsd, keysd, ctrd, N, V, temperature, top_k, top_p, work);
	int32_t *ids = xmalloc((size_t)N * 4);
	D_->download(ids, idsd, (size_t)N * 4);
	bk_sample_work *sw = bk_sample_work_new(V);
	bk_sample_params sp = { temperature, top_p, top_k };
	int bad = 0, first = -1;
	for (int i = 0; i < N; i++) {
		int32_t want;
		if (rows[i] == nan_row)
			want = -1;
		else {
			double u = temperature > 0 ? bk_crng_uniform(keys[i], (uint64_t)ctr[i]) : 0;
			want = bk_sample_token(lg + (size_t)rows[i] * V, V, &sp, u, sw);
		}
		if (ids[i] != want) {
			bad++;
			if (first < 0)
				first = i;
		}
	}
	char what[112];
	snprintf(what, sizeof(what), "sample V=%d temperature=%g top_k=%d top_p=%g draws=%d", V,
		 temperature, top_k, top_p, N);
	printf("%-58s %d differ %s\n", what, bad, bad ? "FAIL" : "ok");
	CHECK(!bad, "%s: %d draws differ from bk_sample_token (first: draw %d, got %d)", what, bad,
	      first, first >= 0 ? ids[first] : 0);
	void *d[] = { lgd, rowsd, ctrd, keysd, idsd, work };
	for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
		D_->free(d[i]);
	bk_sample_work_free(sw);
	free(lg), free(rows), free(ctr), free(keys), free(ids);
}

/* ---- end to end: greedy generation, GPU vs host ---- */

enum { E2E_N = 8, E2E_NEW = 48 };
typedef struct {
	float *rows[E2E_N][E2E_NEW]; /* logits of each draw */
	int V;
} capture;

static void on_logits(void *ctx, uint64_t tag, int step, const float *logits, int n)
{
	capture *c = ctx;
	BUG_ON(tag >= E2E_N || step >= E2E_NEW || n != c->V);
	free(c->rows[tag][step]);
	c->rows[tag][step] = xmalloc((size_t)n * 4);
	memcpy(c->rows[tag][step], logits, (size_t)n * 4);
}

static void run_greedy(const bk_ops *ops, const char *dir, bk_tok *spm, capture *cap,
		       int32_t **out, int *nout, bk_gen_stats *st)
{
	static const char *const users[E2E_N] = {
		"Once upon a time", "Tom had a red ball.", "The cat sat", "Lily wanted to play",
		"One day, a big dog", "The sun was hot.", "Ben and Mia went to the park.", "Hi",
	};
	bk_loaded_model lm = bk_model_load(ops, dir);
	cap->V = lm.model->cfg.V;
	bk_ids pr[E2E_N];
	const int32_t *pp[E2E_N];
	int lens[E2E_N];
	for (int i = 0; i < E2E_N; i++) {
		memset(&pr[i], 0, sizeof(pr[i]));
		bk_template_prompt(BK_TMPL_RAW, spm, "Sparky the dragon lives in a big castle.",
				   users[i], &pr[i]);
		pp[i] = pr[i].v;
		lens[i] = (int)pr[i].n;
	}
	int32_t stop = bk_tok_eos(spm);
	bk_gen_config cfg = { .max_batch = 3, .max_new = E2E_NEW, .max_seq = 512,
			      .sample = { 0, 1 }, .stop = &stop, .n_stop = 1,
			      .on_logits = on_logits, .ctx = cap };
	/* through the engine (not bk_gen_run) to read its stats */
	bk_gen *g = bk_gen_create(lm.model, bk_gen_ops_for(ops), NULL, &cfg);
	bk_gen_set_prefix(g, pp[0], bk_gen_common_prefix(pp, lens, E2E_N));
	for (int i = 0; i < E2E_N; i++) {
		uint64_t tag = (uint64_t)i, key = 0;
		bk_gen_submit(g, pp[i], lens[i], 1, &key, &tag);
	}
	bk_gen_result r;
	for (int more = 1; more;) {
		more = bk_gen_step(g);
		while (bk_gen_take(g, &r)) {
			out[r.tag] = r.ids;
			nout[r.tag] = r.n;
		}
	}
	*st = *bk_gen_get_stats(g);
	bk_gen_free(g);
	for (int i = 0; i < E2E_N; i++)
		free(pr[i].v);
	bk_model_unload(&lm);
}

static void check_e2e(void)
{
	const char *dir = "models/stories260K";
	bk_tok *spm = bk_tok_open("models/stories260K/tokenizer.model");
	static capture ch, cd;
	int32_t *oh[E2E_N], *od[E2E_N];
	int nh[E2E_N], nd[E2E_N];
	bk_gen_stats sh, sd;
	run_greedy(&bk_ops_host, dir, spm, &ch, oh, nh, &sh);
	run_greedy(D_, dir, spm, &cd, od, nd, &sd);
	CHECK(sh.prefix_builds == 1 && sd.prefix_builds == 1 && sd.prefix_hits == E2E_N &&
		      sd.prefix_len > 0,
	      "prefix: built %llu (host) and %llu (cuda) times, %llu hits of %d tokens",
	      (unsigned long long)sh.prefix_builds, (unsigned long long)sd.prefix_builds,
	      (unsigned long long)sd.prefix_hits, sd.prefix_len);
	printf("e2e: shared prefix of %d tokens (%d blocks) built %llu time(s) on the GPU, "
	       "used by %llu prompts\n", sd.prefix_len, sd.prefix_blocks,
	       (unsigned long long)sd.prefix_builds, (unsigned long long)sd.prefix_hits);
	int V = ch.V, equal = 0;
	double worst = 0;
	for (int i = 0; i < E2E_N; i++) {
		int n = nh[i] < nd[i] ? nh[i] : nd[i], j = 0;
		while (j < n && oh[i][j] == od[i][j])
			j++;
		/* logits of every draw up to and including the first difference */
		int last = j < n ? j : n - 1;
		for (int s = 0; s <= last; s++) {
			if (!ch.rows[i][s] || !cd.rows[i][s]) {
				CHECK(0, "prompt %d step %d: no logits captured", i, s);
				break;
			}
			double e = bk_max_relerr(cd.rows[i][s], ch.rows[i][s], (size_t)V, 1e-3);
			worst = e > worst || e != e ? e : worst;
		}
		if (j == n && nh[i] == nd[i]) {
			equal++;
			printf("e2e: prompt %d: %d greedy tokens equal\n", i, nh[i]);
			continue;
		}
		if (j == n) { /* one stopped, the other did not: the stop token differs */
			CHECK(0, "prompt %d: %d vs %d tokens with equal common part", i, nh[i], nd[i]);
			continue;
		}
		const float *h = ch.rows[i][j], *d = cd.rows[i][j];
		int a = bk_sample_argmax(h, V);
		float b2 = -INFINITY, err = 0;
		for (int v = 0; v < V; v++) {
			if (v != a && h[v] > b2)
				b2 = h[v];
			float e = fabsf(h[v] - d[v]);
			err = e > err ? e : err;
		}
		float margin = h[a] - b2;
		int tie = margin <= 4 * err;
		printf("e2e: prompt %d: first difference at step %d (host %d, cuda %d): host top-2 "
		       "margin %.4g, max |logit error| there %.4g: %s\n", i, j, oh[i][j], od[i][j],
		       margin, err, tie ? "a near tie, allowed" : "NOT a near tie");
		CHECK(tie, "prompt %d: greedy differs at step %d with margin %.4g > 4 x error %.4g",
		      i, j, margin, err);
	}
	printf("e2e: %d of %d prompts equal; logits max relative error %.3e (bound 5e-2) %s\n",
	       equal, E2E_N, worst, worst <= 5e-2 ? "ok" : "FAIL");
	CHECK(worst <= 5e-2, "greedy logits: relative error %.3g", worst);
	for (int i = 0; i < E2E_N; i++) {
		free(oh[i]);
		free(od[i]);
		for (int s = 0; s < E2E_NEW; s++) {
			free(ch.rows[i][s]);
			free(cd.rows[i][s]);
		}
	}
	bk_tok_free(spm);
}

/* the 4-bit linears: {T, in, out, type, double quant} */
static void check_q4(int tiny)
{
	static const int both[][5] = {
		{ 1, 64, 96, BK_Q4_NF4, 1 },   /* decode, several 64-blocks a row */
		{ 7, 172, 64, BK_Q4_FP4, 0 },  /* in % 8 != 0: value by value, blocks across rows */
		{ 3, 9, 7, BK_Q4_NF4, 1 },     /* 63 values: a short last block, a padded byte */
		{ 1, 512, 64, BK_Q4_NF4, 0 },  /* split-K (v2: 8 ranges) */
		{ 5, 352, 64, BK_Q4_FP4, 1 },  /* ranges of 3 chunks: pieces across 64-blocks */
		{ 33, 256, 96, BK_Q4_NF4, 1 }, /* 384 blocks: 2 nested blocks */
		{ 64, 128, 40, BK_Q4_FP4, 1 }, /* the last row count on the 4 bits */
		{ 65, 264, 200, BK_Q4_NF4, 1 }, /* dequantise + bf16; its last row alone on the 4 bits */
	};
	static const int big[][5] = {
		{ 1, 2048, 2048, BK_Q4_NF4, 1 }, { 8, 2048, 5632, BK_Q4_NF4, 1 },
		{ 1, 5632, 2048, BK_Q4_FP4, 0 }, { 17, 4096, 1024, BK_Q4_NF4, 0 },
	};
	for (size_t i = 0; i < sizeof(both) / sizeof(both[0]); i++)
		check_linear_q4(both[i][0], both[i][1], both[i][2], both[i][3], both[i][4]);
	for (size_t i = 0; !tiny && i < sizeof(big) / sizeof(big[0]); i++)
		check_linear_q4(big[i][0], big[i][1], big[i][2], big[i][3], big[i][4]);
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	D_ = bk_device_select("cuda");
	G = bk_gen_ops_for(D_);
	bk_rng_seed(&rng, 20261130);
	if (argc > 1 && !strcmp(argv[1], "--e2e")) {
		check_e2e();
		return bk_test_done("check_gen --e2e");
	}
	int tiny = argc > 1 && !strcmp(argv[1], "--tiny");
	if (argc > 2 || (argc > 1 && !tiny))
		die_usage("usage: check_gen [--e2e | --tiny]");
	if (tiny) {
		static const int lin[][3] = { { 1, 64, 96 }, { 7, 172, 64 }, { 17, 100, 37 },
					      { 65, 264, 200 }, { 3, 8, 5 } };
		for (size_t i = 0; i < sizeof(lin) / sizeof(lin[0]); i++)
			check_linear(lin[i][0], lin[i][1], lin[i][2]);
		check_q4(1);
		check_lora(1, 64, 96, 8);
		check_lora(37, 172, 64, 16);
		static const int l1[] = { 1, 15, 16, 17, 33 };
		static const int l2[] = { 7, 128, 129, 257 };
		static const int l3[] = { 230, 600 };
		check_attend(8, 4, 8, l1, 5, 1);
		check_attend(8, 4, 8, l1, 5, 40);
		check_attend(8, 1, 64, l2, 4, 1);
		check_attend(8, 1, 64, l2, 4, 9);
		check_attend(2, 2, 128, l2, 4, 3);
		check_attend(4, 2, 64, l3, 2, 2);
		check_attend_p(8, 4, 8, l1, 5, 40, 0, 0, 5);
		check_attend_p(8, 1, 64, l2, 4, 9, 0, 0, 100);
		check_attend_p(4, 2, 64, l3, 2, 2, 0, 0, 512);
		check_attend_p(4, 2, 64, l2, 4, 3, 0.0625f, 50.0f, 0);
		check_attend_p(2, 1, 256, l2, 4, 2, 0.0625f, 3.0f, 300);
		check_sample(512, 0, 1, 64, 0);
		check_sample(4099, 0, 1, 75, 0);
		check_sample(512, 0.8f, 0.9f, 64, 0);
		check_sample(4099, 0.8f, 0.9f, 16, 0);
		check_sample(4099, 1.5f, 0.5f, 8, 0);
		check_sample(1001, 1.0f, 1.0f, 24, 0);
		check_sample(4099, 0.7f, 0.999f, 4, 0);
		check_sample(512, 0.8f, 0.9f, 64, 50);
		check_sample(4099, 0.8f, 0.9f, 16, 50);
		check_sample(4099, 1.0f, 1.0f, 6, 50);
		check_sample(4099, 1.5f, 0.5f, 8, 1);
		check_sample(4099, 1.0f, 0.999f, 4, 3000);
		check_sample(1001, 1.0f, 0.9f, 24, 1001);
		return bk_test_done("check_gen --tiny");
	}

	static const int lin[][3] = { { 1, 64, 96 },    { 7, 172, 64 },  { 16, 2048, 256 },
				      { 17, 100, 37 },  { 33, 256, 512 }, { 64, 5632, 128 },
				      { 257, 264, 200 }, { 3, 8, 5 } };
	for (size_t i = 0; i < sizeof(lin) / sizeof(lin[0]); i++)
		check_linear(lin[i][0], lin[i][1], lin[i][2]);
	check_q4(0);
	check_lora(1, 64, 96, 8);
	check_lora(37, 172, 64, 16);

	static const int l1[] = { 1, 15, 16, 17, 33 };
	static const int l2[] = { 7, 128, 129, 255, 256, 257, 1000 };
	static const int l3[] = { 230, 4097 };
	check_attend(8, 4, 8, l1, 5, 1);     /* stories260K shape, decode */
	check_attend(8, 4, 8, l1, 5, 40);    /* prefill-like: every position */
	check_attend(32, 4, 64, l2, 7, 1);   /* TinyLlama shape, decode, across splits */
	check_attend(32, 4, 64, l2, 7, 9);
	check_attend(4, 4, 128, l2, 7, 3);   /* no GQA, D 128 */
	check_attend(16, 8, 64, l3, 2, 2);   /* group 2, a long context */
	/* sliding windows (inside one split, across splits: whole splits skipped) and a
	 * softcap with a Gemma-2 scale */
	check_attend_p(8, 4, 8, l1, 5, 40, 0, 0, 5);
	check_attend_p(32, 4, 64, l2, 7, 9, 0, 0, 100);
	check_attend_p(16, 8, 64, l3, 2, 2, 0, 0, 512);
	check_attend_p(16, 8, 64, l2, 7, 3, 0.0625f, 50.0f, 0);
	check_attend_p(8, 1, 256, l2, 7, 2, 0.0625f, 3.0f, 300);

	check_sample(512, 0, 1, 64, 0);
	check_sample(32000, 0, 1, 300, 0); /* more draws than blocks of the grid */
	check_sample(512, 0.8f, 0.9f, 64, 0);
	check_sample(32000, 0.8f, 0.9f, 64, 0);
	check_sample(32000, 1.5f, 0.5f, 32, 0);
	check_sample(1001, 1.0f, 1.0f, 24, 0); /* top-p 1: the whole row */
	check_sample(32000, 0.7f, 0.999f, 16, 0);
	/* top-k: HF's 50 (as bk-bake), 1, a flat row's thousands (past v1's candidates: its
	 * full sort), K >= V */
	check_sample(512, 0.8f, 0.9f, 64, 50);
	check_sample(32000, 0.8f, 0.9f, 64, 50);
	check_sample(32000, 1.0f, 1.0f, 24, 50);
	check_sample(32000, 1.5f, 0.5f, 32, 1);
	check_sample(32000, 1.0f, 0.999f, 16, 3000);
	check_sample(1001, 1.0f, 0.9f, 24, 1001);
	return bk_test_done("check_gen");
}
