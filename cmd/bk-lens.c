/* bk-lens - adds token lengths, shuffles within a window, plans packed batches. */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/plan.h"
#include "common/rng.h"
#include "formats/stream.h"
#include "formats/tokenizer.h"
#include "formats/hub.h"

#include <string.h>

static const char usage[] =
	"usage: bk-lens [--max-tokens N] [--max-batch N] [--window N] [--seed N]\n"
	"               [--reserve N] [--no-shuffle] [--model DIR | --tokenizer FILE]\n"
	"               [-q] [-o FILE] [STREAM]\n"
	"Adds 'lens' {t, s, resp} and a planned batch number 'batch' to every record.\n"
	"Records are shuffled within windows and packed whole into batches of at most\n"
	"--max-tokens teacher tokens (prompt + response + --reserve).\n"
	"  --max-tokens N  token budget per batch (default 4096; 0 = no budget)\n"
	"  --max-batch N   records per batch (default 64; 0 = no limit)\n"
	"  --window N      records shuffled and packed together (default 1024)\n"
	"  --seed N        shuffle seed (default 0)\n"
	"  --reserve N     tokens to reserve per record, e.g. --max-new-tokens for bk-gen (default 0)\n"
	"  --no-shuffle    keep arrival order inside batches and windows\n"
	"  --model DIR     refuse a stream tokenized with another tokenizer than DIR's (or a hub id's)\n"
	"  --tokenizer FILE  the same, with a tokenizer.json or tokenizer.model\n"
	"  -q, --quiet     do not print the plan summary on stderr\n"
	"  -o, --output FILE  write to FILE (atomically) instead of stdout\n";

typedef struct {
	long max_tokens, max_batch, window, seed, reserve;
	int no_shuffle, quiet;
} lens_opts;

typedef struct {
	char *buf; /* raw records of the window, back to back */
	size_t len, cap;
	BK_VEC(size_t) off;
	BK_VEC(long) cost;
	BK_VEC(long) t, s, resp;
} window;

typedef struct {
	uint64_t records, batches, tokens, batches_arrival, oversize;
} totals;

static void shuffle(size_t *v, size_t n, bk_rng *rng)
{
	for (size_t i = n; i > 1; i--) {
		size_t j = (size_t)bk_rng_below(rng, i);
		size_t t = v[i - 1];
		v[i - 1] = v[j];
		v[j] = t;
	}
}

static void flush(window *w, bk_writer *out, const lens_opts *o, bk_rng *rng, totals *tot)
{
	size_t n = w->off.n;
	if (!n)
		return;
	size_t *order = xmalloc(n * sizeof *order), *batch = xmalloc(n * sizeof *batch);
	long *cost = xmalloc(n * sizeof *cost);
	for (size_t i = 0; i < n; i++)
		order[i] = i;
	if (!o->no_shuffle)
		shuffle(order, n, rng);
	for (size_t i = 0; i < n; i++)
		cost[i] = w->cost.v[order[i]];
	bk_plan_limits lim = {o->max_tokens, o->max_batch};
	/* --no-shuffle keeps the arrival order: consecutive records, a batch closed when the
	 * next does not fit (packing sorts by cost, which would put the longest first) */
	size_t nb = o->no_shuffle ? bk_plan_next_fit(cost, n, lim, batch)
				  : bk_plan_pack(cost, n, lim, batch);
	/* arrival-order plan for comparison (uses its own scratch) */
	size_t *scratch = xmalloc(n * sizeof *scratch);
	tot->batches_arrival += bk_plan_next_fit(cost, n, lim, scratch);
	free(scratch);
	/* run batches in a shuffled order so long ones are not all first */
	size_t *border = xmalloc(nb * sizeof *border);
	for (size_t b = 0; b < nb; b++)
		border[b] = b;
	if (!o->no_shuffle)
		shuffle(border, nb, rng);
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	static const char *const skip[] = {"lens", "batch", NULL};
	for (size_t bi = 0; bi < nb; bi++) {
		for (size_t k = 0; k < n; k++) {
			if (batch[k] != border[bi])
				continue;
			size_t i = order[k], end = i + 1 < n ? w->off.v[i + 1] : w->len, off = 0;
			if (msgpack_unpack_next(&up, w->buf + w->off.v[i], end - w->off.v[i], &off) !=
			    MSGPACK_UNPACK_SUCCESS)
				BUG("stored record does not parse");
			msgpack_packer *pk = bk_rec_begin(out);
			bk_rec_copy(out, &up.data, skip);
			bk_rec_key(out, "lens");
			msgpack_pack_map(pk, 3);
			bk_pack_str(pk, "t");
			msgpack_pack_long(pk, w->t.v[i]);
			bk_pack_str(pk, "s");
			msgpack_pack_long(pk, w->s.v[i]);
			bk_pack_str(pk, "resp");
			msgpack_pack_long(pk, w->resp.v[i]);
			bk_rec_key(out, "batch");
			msgpack_pack_uint64(pk, tot->batches + bi);
			bk_rec_end(out);
			tot->tokens += (uint64_t)w->cost.v[i];
			if (o->max_tokens > 0 && w->cost.v[i] > o->max_tokens)
				tot->oversize++;
		}
	}
	msgpack_unpacked_destroy(&up);
	tot->batches += nb;
	tot->records += n;
	free(order);
	free(batch);
	free(cost);
	free(border);
	w->len = w->off.n = w->cost.n = w->t.n = w->s.n = w->resp.n = 0;
}

int main(int argc, char **argv)
{
	lens_opts o = {.max_tokens = 4096, .max_batch = 64, .window = 1024};
	const char *out_path = "-", *model = NULL, *tokenizer = NULL;
	bk_opt opts[] = {
		{"max-tokens", 0, BK_OPT_INT, &o.max_tokens, 0, 1L << 40},
		{"max-batch", 0, BK_OPT_INT, &o.max_batch, 0, 1L << 40},
		{"window", 0, BK_OPT_INT, &o.window, 1, 1L << 30},
		{"seed", 0, BK_OPT_INT, &o.seed, 0, 0},
		{"reserve", 0, BK_OPT_INT, &o.reserve, 0, 1L << 30},
		{"no-shuffle", 0, BK_OPT_FLAG, &o.no_shuffle, 0, 0},
		{"quiet", 'q', BK_OPT_FLAG, &o.quiet, 0, 0},
		{"model", 0, BK_OPT_STR, &model, 0, 0},
		{"tokenizer", 0, BK_OPT_STR, &tokenizer, 0, 0},
		{"output", 'o', BK_OPT_STR, &out_path, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	bk_stdout_init();
	int n = bk_flags_parse(argc, argv, opts, usage);
	if (n > 1)
		die_usage("too many arguments");
	if (model && tokenizer)
		die_usage("give --model or --tokenizer, not both");
	char *model_dir = model ? bk_hub_model_dir(model, NULL) : NULL;
	if (model_dir)
		model = model_dir;
	bk_reader *in = bk_reader_open(n ? argv[0] : "-");
	if (model || tokenizer) {
		char *p = tokenizer ? xstrdup(tokenizer) : bk_tok_file(model);
		bk_reader_expect_file(in, "tokenizer", p, "tokenizer");
		free(p);
	}
	bk_writer *out = bk_writer_open(out_path);
	bk_kv kv[] = {BK_KV_I("max_tokens", o.max_tokens), BK_KV_I("max_batch", o.max_batch),
		      BK_KV_I("window", o.window), BK_KV_I("seed", o.seed),
		      BK_KV_I("reserve", o.reserve), BK_KV_I("shuffle", !o.no_shuffle)};
	bk_writer_header(out, in, kv, 6);

	bk_rng rng;
	bk_rng_seed(&rng, (uint64_t)o.seed);
	window w = {0};
	totals tot = {0};
	int32_t *ids = NULL;
	size_t cap = 0, nt, ns, nr;
	const msgpack_object *rec;
	while ((rec = bk_reader_next(in))) {
		nt = bk_rec_ids(in, rec, "t_prompt", &ids, &cap);
		ns = bk_rec_ids(in, rec, "s_prompt", &ids, &cap);
		bk_rec_ids_opt(in, rec, "resp", &ids, &cap, &nr);
		size_t rawlen;
		const char *raw = bk_reader_raw(in, &rawlen);
		if (w.len + rawlen > w.cap) {
			w.cap = (w.len + rawlen) * 2;
			w.buf = xrealloc(w.buf, w.cap);
		}
		bk_vec_push(&w.off, w.len);
		memcpy(w.buf + w.len, raw, rawlen);
		w.len += rawlen;
		bk_vec_push(&w.t, (long)(nt + nr));
		bk_vec_push(&w.s, (long)(ns + nr));
		bk_vec_push(&w.resp, (long)nr);
		bk_vec_push(&w.cost, (long)(nt + nr) + o.reserve);
		if ((long)w.off.n >= o.window)
			flush(&w, out, &o, &rng, &tot);
	}
	flush(&w, out, &o, &rng, &tot);
	bk_reader_close(in);
	bk_writer_close(out);
	if (!o.quiet && o.max_tokens > 0 && tot.batches) {
		double eff = (double)tot.tokens / ((double)tot.batches * (double)o.max_tokens);
		double eff0 = (double)tot.tokens / ((double)tot.batches_arrival * (double)o.max_tokens);
		fprintf(stderr,
			"%s: %llu record%s in %llu batch%s; packing efficiency %.1f%% "
			"(arrival order: %llu batch%s, %.1f%%)\n",
			bk_prog, (unsigned long long)tot.records, bk_s(tot.records),
			(unsigned long long)tot.batches, tot.batches == 1 ? "" : "es",
			100 * eff, (unsigned long long)tot.batches_arrival,
			tot.batches_arrival == 1 ? "" : "es", 100 * eff0);
	} else if (!o.quiet) {
		fprintf(stderr, "%s: %llu record%s in %llu batch%s\n", bk_prog,
			(unsigned long long)tot.records, bk_s(tot.records),
			(unsigned long long)tot.batches, tot.batches == 1 ? "" : "es");
	}
	if (tot.oversize)
		warn("%llu record%s exceed%s --max-tokens %ld and got batches of their own",
		     (unsigned long long)tot.oversize, bk_s(tot.oversize),
		     tot.oversize == 1 ? "s" : "", o.max_tokens);
	free(ids);
	free(w.buf);
	free(w.off.v);
	free(w.cost.v);
	free(w.t.v);
	free(w.s.v);
	free(w.resp.v);
	free(model_dir);
	bk_stdout_close();
	return 0;
}
