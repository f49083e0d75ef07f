/* bk-teach - appends the teacher's distribution (base model, adapter off, system prompt
 * present) at every response position of every record.  The model pass is gpu/teach.c;
 * this file groups records into batches and writes them back in arrival order. */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/progress.h"
#include "formats/inputs.h"
#include "formats/shard.h"
#include "formats/stream.h"
#include "formats/teacher.h"
#include "formats/tokenizer.h"
#include "gpu/device.h"
#include "gpu/load.h"
#include "gpu/teach.h"
#include "gpu/wshare.h"
#include "formats/hub.h"

#include <string.h>
#include <time.h>

static const char usage[] =
	"usage: bk-teach --model DIR [--device D] [--top-k K] [--min-mass M]\n"
	"                [--temperature T] [--max-tokens N | --batch-size N] [--vocab-chunk N]\n"
	"                [-o FILE] [-v]\n"
	"                [--shard I/N] [--system TEXT | --system-file FILE]\n"
	"                [--load-in-4bit [--bnb-4bit-quant-type T]\n"
	"                 [--bnb-4bit-use-double-quant N] [--bnb-4bit-compute-dtype D]]\n"
	"                [STREAM]\n"
	"Appends 'teacher' to every record: the base model's log-probs (adapter off) on\n"
	"t_prompt + resp at each response position.  Records must carry 'resp' (run bk-gen\n"
	"first on prompts-only data); a record without one is refused.\n"
	"  --model DIR        HF model directory or hub id Org/Name (the teacher)\n"
	"  --device D         cpu, cuda or auto (default auto)\n"
	"  --no-share-weights load an own copy of the weights on the GPU, not the one\n"
	"                     copy per GPU and model the stages share\n"
	"  --system TEXT      refuse a stream made with another system prompt\n"
	"  --system-file FILE the same, the system prompt read from FILE\n"
	"  --top-k K          keep the K most likely ids per position and the remaining mass\n"
	"                     (default 64; 0 = the full distribution)\n"
	"  --min-mass M       when the first batch's top-k keeps less than M of the teacher's\n"
	"                     mass on average (a flat teacher), write no teacher field: bk-step\n"
	"                     then computes the exact teacher itself (default 0.5; 0 = never)\n"
	"  --temperature T    KL temperature: log-probs of softmax(logits / T) (default 1.0)\n"
	"  --max-tokens N     tokens per model forward; records without a bk-lens 'batch' are\n"
	"                     packed in arrival order under it (default 4096)\n"
	"  --batch-size N     batches of N records in arrival order, ignoring 'batch'\n"
	"  --vocab-chunk N    LM-head columns per pass (default 8192)\n"
	"  -o, --output FILE  write to FILE (atomically) instead of stdout\n"
	"  --shard I/N        only the records of shard I of N (by record id; merge the\n"
	"                     shards with bk-dump --merge)\n"
	"  -v, --verbose      report the prefix, forwards, tokens and speed\n"
	BK_Q4_USAGE;

/* the records of one batch: raw bytes (re-read for the output) and their ids */
typedef struct {
	BK_VEC(char) raw;
	BK_VEC(size_t) off;   /* [count+1] into raw */
	BK_VEC(int32_t) ids;  /* prompt then resp of every record, back to back */
	BK_VEC(size_t) ioff;  /* [count] into ids */
	BK_VEC(int) a, n;     /* [count] */
	int has_key;          /* the batch is a bk-lens batch */
	int64_t key;
	long tokens;
} group;

static void group_clear(group *g)
{
	g->raw.n = g->off.n = g->ids.n = g->ioff.n = g->a.n = g->n.n = 0;
	g->tokens = 0;
}

/* the mass top-k leaves out (the 'rest' bucket), over every position written */
typedef struct {
	double sum, max, min_mass;
	uint64_t n;
	int exact; /* the first batch was flat: no teacher fields */
} mass_stats;
static mass_stats ms = {0, 0, 0.5, 0, 0};

/* Runs and writes the batch.  The first batch also sets the shared prefix: the
 * longest common prefix of its t_prompts and that of the record after it (next, NULL
 * at the end), so a first batch of one record does not make its user text the prefix. */
static void flush(group *g, bk_teach *tc, bk_writer *out, int *first, const bk_teach_seq *next)
{
	size_t cnt = g->a.n;
	if (!cnt)
		return;
	bk_teach_seq *seqs = xmalloc((cnt + 1) * sizeof(*seqs));
	bk_teacher *tv = xcalloc(cnt, sizeof(*tv));
	for (size_t i = 0; i < cnt; i++) {
		const int32_t *p = g->ids.v + g->ioff.v[i];
		seqs[i] = (bk_teach_seq){p, g->a.v[i], p + g->a.v[i], g->n.v[i]};
	}
	if (*first) {
		if (next)
			seqs[cnt] = *next;
		int P = bk_teach_prefix_from(tc, seqs, (int)cnt + (next != NULL));
		note("shared prefix: %d tokens (longest common prefix of the first batch's "
		     "t_prompt)", P);
		*first = 0;
	}
	if (!ms.exact) /* after a flat first batch the fields are not written */
		bk_teach_run(tc, seqs, (int)cnt, tv);
	double bsum = 0;
	uint64_t bn = 0;
	for (size_t i = 0; i < cnt; i++)
		if (tv[i].k && tv[i].rest)
			for (int r = 0; r < tv[i].n; r++) {
				double u = tv[i].rest[r];
				bsum += u, bn++;
				if (u > ms.max)
					ms.max = u;
			}
	if (ms.n == 0 && bn && ms.min_mass > 0 && 1 - bsum / (double)bn < ms.min_mass) {
		ms.exact = 1;
		warn("the teacher is flat: its top-%d keeps %.1f%% of the mass on average over the "
		     "first batch's %llu positions (--min-mass %g); writing no teacher field, so "
		     "bk-step computes the exact teacher", tv[0].k, 100 * (1 - bsum / (double)bn),
		     (unsigned long long)bn, ms.min_mass);
	}
	ms.sum += bsum, ms.n += bn;

	static const char *const skip[] = {"teacher", NULL};
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	for (size_t i = 0; i < cnt; i++) {
		size_t off = 0, len = g->off.v[i + 1] - g->off.v[i];
		if (msgpack_unpack_next(&up, g->raw.v + g->off.v[i], len, &off) !=
		    MSGPACK_UNPACK_SUCCESS)
			BUG("stored record does not parse");
		msgpack_packer *pk = bk_rec_begin(out);
		bk_rec_copy(out, &up.data, skip);
		if (!ms.exact) {
			bk_rec_key(out, "teacher");
			bk_teacher_pack(pk, &tv[i]);
		}
		bk_rec_end(out);
		bk_teacher_free(&tv[i]);
	}
	msgpack_unpacked_destroy(&up);
	free(tv);
	free(seqs);
	group_clear(g);
}

int main(int argc, char **argv)
{
	const char *sys_text = NULL, *sys_file = NULL;
	const char *model = NULL, *device = "auto", *out_path = "-", *shard_spec = NULL;
	long top_k = 64, max_tokens = 4096, batch_size = 0, vocab_chunk = 8192;
	double temperature = 1.0;
	bk_q4_flags q4f = BK_Q4_FLAGS_INIT;
	bk_opt opts[] = {
		{"model", 0, BK_OPT_STR, &model, 0, 0},
		{"device", 0, BK_OPT_STR, &device, 0, 0},
		{"no-share-weights", 0, BK_OPT_FLAG, &bk_wshare_off, 0, 0},
		{"top-k", 0, BK_OPT_INT, &top_k, 0, 1L << 30},
		{"min-mass", 0, BK_OPT_DOUBLE, &ms.min_mass, 0, 0},
		{"temperature", 0, BK_OPT_DOUBLE, &temperature, 0, 0},
		{"max-tokens", 0, BK_OPT_INT, &max_tokens, 1, 1L << 30},
		{"batch-size", 0, BK_OPT_INT, &batch_size, 1, 1L << 30},
		{"vocab-chunk", 0, BK_OPT_INT, &vocab_chunk, 1, 1L << 30},
		{"system", 0, BK_OPT_STR, &sys_text, 0, 0},
		{"system-file", 0, BK_OPT_STR, &sys_file, 0, 0},
		{"output", 'o', BK_OPT_STR, &out_path, 0, 0},
		{"verbose", 'v', BK_OPT_FLAG, &bk_verbose, 0, 0},
		{"shard", 0, BK_OPT_STR, &shard_spec, 0, 0},
		{"load-in-4bit", 0, BK_OPT_FLAG, &q4f.load, 0, 0},
		{"bnb-4bit-quant-type", 0, BK_OPT_STR, &q4f.type, 0, 0},
		{"bnb-4bit-use-double-quant", 0, BK_OPT_INT, &q4f.double_quant, 0, 1},
		{"bnb-4bit-compute-dtype", 0, BK_OPT_STR, &q4f.dtype, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	bk_stdout_init();
	int npos = bk_flags_parse(argc, argv, opts, usage);
	if (npos > 1)
		die_usage("too many arguments");
	if (!model)
		die_usage("--model DIR is required");
	bk_q4_config q4 = bk_q4_flags_config(&q4f);
	char *model_dir = bk_hub_model_dir(model, NULL);
	model = model_dir;
	bk_shard shard = {0, 0};
	if (shard_spec)
		shard = bk_shard_parse("--shard", shard_spec);
	if (bk_flag_given("max-tokens") && bk_flag_given("batch-size"))
		die_usage("give --max-tokens or --batch-size, not both");
	if (!(ms.min_mass >= 0 && ms.min_mass <= 1))
		die_usage("--min-mass %g is not in [0, 1]", ms.min_mass);
	if (!(temperature > 0) || temperature > 1e6)
		die_usage("--temperature %g is not a positive number", temperature);

	bk_config_free(bk_config_load(model)); /* an unsupported model is refused first */
	bk_reader *in = bk_reader_open(npos ? argv[0] : "-");
	char *tok = bk_tok_file(model);
	bk_reader_expect_file(in, "tokenizer", tok, "tokenizer");
	if (sys_text || sys_file) {
		char *sys = bk_system_prompt(sys_text, sys_file, NULL, NULL, NULL);
		bk_reader_expect_system(in, sys);
		free(sys);
	}
	free(tok);
	const bk_ops *ops = bk_device_select(device);
	bk_q4_adopt_stream(&q4, in); /* the thread count of a 4-bit stage before (load.h) */
	bk_loaded_model lm = bk_model_load_q4(ops, model, &q4);
	bk_reader_expect(in, "model", lm.fingerprint, "model");
	int V = lm.cfg->vocab_size;
	if (top_k > V)
		die_usage("--top-k %ld is larger than the vocabulary (%d)", top_k, V);
	/* no host copy of the LM head: the ops read the model's own */
	bk_teach *tc = bk_teach_create(lm.model, NULL, (int)max_tokens, (int)top_k,
				       (float)temperature, (int)vocab_chunk);

	bk_writer *out = bk_writer_open(out_path);
	/* the 4-bit setting too: bk-step refuses a student of another one */
	bk_kv kv[6] = {BK_KV_S("model", lm.fingerprint), BK_KV_D("temperature", temperature),
		       BK_KV_I("top_k", top_k)};
	char shard_buf[32], q4_buf[BK_Q4_PROV_BUF];
	int nkv = 3 + bk_q4_prov(&q4, q4_buf, kv + 3);
	if (shard.n)
		kv[nkv++] = BK_KV_S("shard", bk_shard_str(&shard, shard_buf, sizeof shard_buf));
	bk_writer_header(out, in, kv, nkv);

	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	group g = {0};
	int first = 1;
	int32_t *tp = NULL, *rp = NULL;
	size_t tcap = 0, rcap = 0;
	const msgpack_object *rec;
	bk_progress pg;
	bk_progress_start(&pg, "records", 0);
	bk_batch_order bo = {0}; /* records of a batch are adjacent: checked */
	while ((rec = bk_reader_next(in))) {
		if (!bk_shard_owns(&shard, in, rec))
			continue; /* another shard's record */
		bk_progress_update(&pg, bk_writer_count(out), bk_teach_stats_get(tc)->tokens);
		if (!bk_obj_get(rec, "resp"))
			bk_reader_die(in, "key 'resp' is missing: bk-teach needs responses (run "
					  "bk-gen on prompts-only data first)");
		size_t na = bk_rec_ids(in, rec, "t_prompt", &tp, &tcap);
		size_t nr = bk_rec_ids(in, rec, "resp", &rp, &rcap);
		if (!na)
			bk_reader_die(in, "key 't_prompt' is empty");
		char lbuf[160];
		const char *lmsg = bk_config_check_len(lm.cfg, (long)(na + nr), "teacher sequence",
						       lbuf, sizeof lbuf);
		if (lmsg)
			bk_reader_die(in, "%s", lmsg);
		for (size_t i = 0; i < na + nr; i++) {
			int32_t id = i < na ? tp[i] : rp[i - na];
			if (id < 0 || id >= V)
				bk_reader_die(in, "key '%s' holds id %d, outside the vocabulary [0, %d)",
					      i < na ? "t_prompt" : "resp", id, V);
		}

		/* a batch ends before this record? */
		int64_t key = 0;
		int has_key = !batch_size && bk_batch_next(&bo, in, rec, &key);
		long cost = (long)(na + nr) - 1;
		int cut = 0;
		if (g.a.n && batch_size)
			cut = (long)g.a.n >= batch_size;
		else if (g.a.n)
			cut = has_key != g.has_key || (has_key && key != g.key) ||
			      (!has_key && g.tokens + cost > max_tokens);
		if (cut) {
			bk_teach_seq next = {tp, (int)na, rp, (int)nr};
			flush(&g, tc, out, &first, &next);
		}
		g.has_key = has_key;
		g.key = key;
		g.tokens += cost;
		bk_vec_push(&g.ioff, g.ids.n);
		bk_vec_push(&g.a, (int)na);
		bk_vec_push(&g.n, (int)nr);
		bk_vec_reserve(&g.ids, g.ids.n + na + nr);
		memcpy(g.ids.v + g.ids.n, tp, na * sizeof(int32_t));
		memcpy(g.ids.v + g.ids.n + na, rp, nr * sizeof(int32_t));
		g.ids.n += na + nr;
		size_t rawlen;
		const char *raw = bk_reader_raw(in, &rawlen);
		if (!g.off.n)
			bk_vec_push(&g.off, (size_t)0);
		bk_vec_reserve(&g.raw, g.raw.n + rawlen);
		memcpy(g.raw.v + g.raw.n, raw, rawlen);
		g.raw.n += rawlen;
		bk_vec_push(&g.off, g.raw.n);
	}
	flush(&g, tc, out, &first, NULL);
	uint64_t nrec = bk_writer_count(out);
	bk_progress_end(&pg, nrec, bk_teach_stats_get(tc)->tokens);
	bk_writer_close(out);
	bk_reader_close(in);
	bk_batch_order_free(&bo);

	clock_gettime(CLOCK_MONOTONIC, &t1);
	double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
	const bk_teach_stats *st = bk_teach_stats_get(tc);
	note("%llu records, %llu forwards, %llu tokens (prefix %d reused by %llu sequences, "
	     "%llu in full), %llu rows, %.1f tokens/s",
	     (unsigned long long)nrec, (unsigned long long)st->forwards,
	     (unsigned long long)st->tokens, bk_teach_prefix_len(tc),
	     (unsigned long long)st->with_prefix, (unsigned long long)st->full,
	     (unsigned long long)st->rows, secs > 0 ? (double)st->tokens / secs : 0.0);
	if (ms.n) {
		double mean = ms.sum / (double)ms.n;
		note("top-%ld uncovered mass: mean %.4f, max %.4f over %llu positions%s", top_k,
		     mean, ms.max, (unsigned long long)ms.n,
		     ms.exact ? " (no teacher fields written: exact in bk-step)" : "");
		if (!ms.exact && ms.min_mass > 0 && 1 - mean < ms.min_mass)
			warn("top-%ld left %.1f%% of the teacher's mass uncovered on average (more than "
			     "1 - --min-mass %g): the loss underestimates the KL; use --top-k 0 or a "
			     "larger k", top_k, 100 * mean, ms.min_mass);
	}
	bk_teach_free(tc);
	bk_model_unload(&lm);
	free(tp), free(rp);
	free(g.raw.v), free(g.off.v), free(g.ids.v), free(g.ioff.v), free(g.a.v), free(g.n.v);
	free(model_dir);
	bk_stdout_close();
	return 0;
}
