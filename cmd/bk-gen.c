/* bk-gen - samples responses ("trajectories") from the teacher (adapter off, system
 * prompt present) for every prompt-only record, batched with a KV cache (gpu/gen.h);
 * records that already have a response pass through.  Wiring only: reading, ordering
 * and writing records; the engine and the sampler live in gpu/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/hash.h"
#include "common/rng.h"
#include "formats/tokenizer.h"
#include "formats/inputs.h"
#include "formats/shard.h"
#include "formats/stream.h"
#include "formats/teacher.h"
#include "formats/template.h"
#include "gpu/device.h"
#include "gpu/gen.h"
#include "gpu/load.h"
#include "gpu/wshare.h"
#include "formats/hub.h"

static const char usage[] =
	"usage: bk-gen --model DIR [--device D] [--num-trajectories N] [--temperature T]\n"
	"              [--top-k K] [--top-p P] [--max-new-tokens N] [--epochs N] [--seed N]\n"
	"              [--max-batch N] [--kv-memory BYTES] [--max-prompt N] [--window N]\n"
	"              [-v] [-o FILE] [--shard I/N] [--retokenize]\n"
	"              [--teacher-top-k K [--teacher-temperature T] [--min-mass M]]\n"
	"              [--system TEXT | --system-file FILE]\n"
	"              [--load-in-4bit [--bnb-4bit-quant-type T]\n"
	"               [--bnb-4bit-use-double-quant N] [--bnb-4bit-compute-dtype D]]\n"
	"              [STREAM]\n"
	"Samples --num-trajectories responses per epoch from the teacher (adapter off, the\n"
	"record's t_prompt) for every record without 'resp', and writes one record per\n"
	"sample with resp, response, traj and epoch added; empty samples are dropped.\n"
	"Records with 'resp' pass through once, untouched.  Output order is input order.\n"
	"  --model DIR             HF model directory or hub id (config.json, safetensors, tokenizer)\n"
	"  --device D              cpu, cuda or auto (default auto)\n"
	"  --no-share-weights      load an own copy of the weights on the GPU, not the one\n"
	"                          copy per GPU and model the stages share\n"
	"  --system TEXT           refuse a stream made with another system prompt\n"
	"  --system-file FILE      the same, the system prompt read from FILE\n"
	"  --num-trajectories N    samples per prompt and epoch (default 4)\n"
	"  --temperature T         sampling temperature, 0 = greedy (default 0.8)\n"
	"  --top-k K               keep the K most likely tokens (and their ties) before\n"
	"                          top-p, as HF's top_k; 0 = off (default 0)\n"
	"  --top-p P               nucleus mass in (0,1] (default 0.9)\n"
	"  --max-new-tokens N      new tokens per sample at most (default 128)\n"
	"  --epochs N              fresh trajectories for each of N epochs (default 1)\n"
	"  --seed N                sampling seed (default 0)\n"
	"  --max-batch N           sequences decoded together (default 64)\n"
	"  --kv-memory BYTES       KV cache size, e.g. 2G or 512M, allocated at once\n"
	"                          (default: planned from --max-prompt, else grown as needed)\n"
	"  --max-prompt N          longest teacher prompt in tokens: the KV cache is planned\n"
	"                          for --max-batch samples of N + --max-new-tokens tokens, and\n"
	"                          a longer prompt is refused (default: not planned)\n"
	"  --window N              records held to restore input order (default 256)\n"
	"  -v, --verbose           report the shared prefix, steps and tokens/s\n"
	"  -o, --output FILE       write to FILE (atomically) instead of stdout\n"
	"  --shard I/N             only the records of shard I of N (by record id; merge\n"
	"                          the shards with bk-dump --merge)\n"
	"  --retokenize            resp is the response text tokenized again as an assistant\n"
	"                          turn, with the template's end of turn (what bk-tokenize\n"
	"                          makes of a given response; the tool's trajectories), not\n"
	"                          the sampled ids\n"
	"  --teacher-top-k K       score what is sampled: add bk-teach's 'teacher' field (the\n"
	"                          teacher's K most likely ids, their log-probs and the rest\n"
	"                          mass) at every sampled position, from the logits it was\n"
	"                          drawn from; bk-teach is then not needed (not with\n"
	"                          --retokenize, nor on paired records)\n"
	"  --teacher-temperature T the KL temperature of that field (default 1.0)\n"
	"  --min-mass M            bk-teach's rule: when the first batch's top-K keeps less\n"
	"                          than M of the teacher's mass on average, write no teacher\n"
	"                          field (bk-step computes the exact teacher) (default 0.5)\n"
	BK_Q4_USAGE;

typedef struct {
	long ntraj, max_new, epochs, seed, max_batch, window, top_k;
	double temperature, top_p;
	/* this pass over the input: epochs epoch0 .. epoch0 + pass_epochs - 1; records
	 * with a response are written in the first pass only */
	long epoch0, pass_epochs;
	int skip_paired;
	int retokenize, tmpl; /* --retokenize with the stream's chat template */
	long teacher_k;       /* --teacher-top-k (0: no scoring) */
	double teacher_temp;
	int vocab;
} gen_opts;

/* A record read but not yet written: its raw bytes and, when it is generated for,
 * one result per sample (sample i = epoch * ntraj + traj). */
typedef struct {
	char *raw;
	size_t len;
	int generate;
	int n_t, n_s; /* prompt lengths (for 'lens') */
	int has_batch; /* bk-lens's 'batch' (the min-mass rule's first batch) */
	int64_t batch;
	int32_t *t_prompt;
	bk_gen_result *res; /* [epochs * ntraj]; ids NULL until done */
	int n_done;
} pending_rec;

typedef struct {
	pending_rec *v; /* ring of cap */
	size_t cap, head, n;
	uint64_t head_no; /* record number of v[head] */
} ring;

static pending_rec *ring_at(ring *r, uint64_t no)
{
	BUG_ON(no < r->head_no || no >= r->head_no + r->n);
	return &r->v[(r->head + (no - r->head_no)) % r->cap];
}

typedef struct {
	uint64_t in, passed, samples, written, dropped;
} totals;

/* bk-teach's --min-mass rule: the mass top-k leaves out (the 'rest'), over every
 * position written; decided on the first batch (min_mass_decide) */
typedef struct {
	double sum, max, min_mass;
	uint64_t n;
	int decided, exact; /* exact: the first batch was flat, no teacher fields */
} mass_stats;

/* "2G", "512M", "64K" or plain bytes (powers of 1024) */
static size_t parse_bytes(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	double mul = 1;
	if (*end && !end[1] && strchr("kKmMgGtT", *end))
		mul = *end == 'k' || *end == 'K' ? 1024.0 : *end == 'm' || *end == 'M' ? 1048576.0
			: *end == 'g' || *end == 'G' ? 1073741824.0 : 1099511627776.0;
	else if (*end)
		die_usage("--kv-memory '%s' is not a size (e.g. 2G, 512M, 1000000)", s);
	if (end == s || !(v > 0) || v * mul > 1e18)
		die_usage("--kv-memory '%s' is not a positive size", s);
	return (size_t)(v * mul);
}

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* text without leading/trailing whitespace (Python's str.strip on ASCII space) */
static char *strip(char *s)
{
	char *b = s, *e = s + strlen(s);
	while (*b && strchr(" \t\n\r\f\v", *b))
		b++;
	while (e > b && strchr(" \t\n\r\f\v", e[-1]))
		e--;
	*e = 0;
	return b;
}

/* the response text of a sample (decoded without its stop id, stripped) in *text
 * (malloc'd, free it); returns where it starts, "" for a sample that is dropped */
static char *sample_text(const bk_tok *spm, const bk_gen_result *r, char **text)
{
	int n_text = r->n - (r->stopped ? 1 : 0);
	*text = bk_tok_decode(spm, r->ids, (size_t)(n_text > 0 ? n_text : 0));
	return n_text > 0 ? strip(*text) : *text + strlen(*text);
}

/* Decides the --min-mass rule once, as bk-teach does on its first batch: over the
 * written samples of the records at the head of the ring that share the first
 * record's bk-lens 'batch' (the first record alone without one), at most a window.
 * Returns 0 while that batch is not complete (the caller waits). */
static int min_mass_decide(mass_stats *ms, const ring *rg, int eof, long per, const bk_tok *spm)
{
	const pending_rec *h = &rg->v[rg->head];
	size_t cnt = 0;
	while (cnt < rg->n) {
		const pending_rec *p = &rg->v[(rg->head + cnt) % rg->cap];
		if (cnt && (!h->has_batch || !p->has_batch || p->batch != h->batch))
			break;
		if (p->n_done < per)
			return 0;
		cnt++;
	}
	if (cnt == rg->n && !eof && rg->n < rg->cap)
		return 0; /* the next record may still belong to the batch */
	double sum = 0;
	uint64_t n = 0;
	for (size_t i = 0; i < cnt; i++) {
		const pending_rec *p = &rg->v[(rg->head + i) % rg->cap];
		for (long j = 0; j < per; j++) {
			const bk_gen_result *r = &p->res[j];
			char *text;
			int kept = *sample_text(spm, r, &text) != 0;
			free(text);
			for (int t = 0; kept && t < r->n; t++)
				sum += r->t_rest[t], n++;
		}
	}
	ms->decided = 1;
	if (n && ms->min_mass > 0 && 1 - sum / (double)n < ms->min_mass) {
		ms->exact = 1;
		warn("the teacher is flat: its top-k keeps %.1f%% of the mass on average over the "
		     "first batch's %llu positions (--min-mass %g); writing no teacher field, so "
		     "bk-step computes the exact teacher", 100 * (1 - sum / (double)n),
		     (unsigned long long)n, ms->min_mass);
	}
	return 1;
}

static void emit(bk_writer *w, pending_rec *p, const gen_opts *o, const bk_tok *spm,
		 totals *tot, mass_stats *ms)
{
	if (!p->generate) {
		if (!o->skip_paired) {
			bk_writer_raw(w, p->raw, p->len);
			tot->passed++;
		}
		return;
	}
	static const char *const skip[] = { "resp", "response", "traj", "epoch", "lens",
					    "teacher", NULL };
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	size_t off = 0;
	if (msgpack_unpack_next(&up, p->raw, p->len, &off) != MSGPACK_UNPACK_SUCCESS)
		BUG("stored record does not parse");
	int has_lens = bk_obj_get(&up.data, "lens") != NULL;
	for (long i = 0; i < o->pass_epochs * o->ntraj; i++) {
		bk_gen_result *r = &p->res[i];
		char *text, *t = sample_text(spm, r, &text);
		bk_ids rt = { 0 };
		if (!*t) {
			tot->dropped++;
		} else {
			/* --retokenize: the tool decodes (special tokens skipped), strips and
			 * renders the text as the assistant turn, whose tokens end with the
			 * template's end of turn also when the sample was cut */
			const int32_t *ids = r->ids;
			size_t n_ids = (size_t)r->n;
			if (o->retokenize) {
				bk_template_response(o->tmpl, spm, t, &rt);
				ids = rt.v, n_ids = rt.n;
			}
			msgpack_packer *pk = bk_rec_begin(w);
			bk_rec_copy(w, &up.data, skip);
			bk_rec_key(w, "resp");
			bk_pack_ids(pk, ids, n_ids);
			bk_rec_key(w, "response");
			bk_pack_str(pk, t);
			bk_rec_key(w, "traj");
			msgpack_pack_long(pk, i % o->ntraj);
			bk_rec_key(w, "epoch");
			msgpack_pack_long(pk, o->epoch0 + i / o->ntraj);
			if (has_lens) { /* bk-lens's lengths, now with the response */
				bk_rec_key(w, "lens");
				msgpack_pack_map(pk, 3);
				bk_pack_str(pk, "t");
				msgpack_pack_long(pk, p->n_t + (long)n_ids);
				bk_pack_str(pk, "s");
				msgpack_pack_long(pk, p->n_s + (long)n_ids);
				bk_pack_str(pk, "resp");
				msgpack_pack_long(pk, (long)n_ids);
			}
			if (o->teacher_k && !ms->exact) { /* the rows ids were drawn from */
				bk_teacher tf = { .k = (int)o->teacher_k,
						  .temperature = (float)o->teacher_temp, .n = r->n,
						  .v = o->vocab, .ids = r->t_ids, .logp = r->t_logp,
						  .rest = r->t_rest };
				bk_rec_key(w, "teacher");
				bk_teacher_pack(pk, &tf);
				for (int j = 0; j < r->n; j++) {
					ms->sum += r->t_rest[j], ms->n++;
					if (r->t_rest[j] > ms->max)
						ms->max = r->t_rest[j];
				}
			}
			bk_rec_end(w);
			tot->written++;
		}
		free(text);
		free(rt.v);
		free(r->ids), free(r->t_ids), free(r->t_logp), free(r->t_rest);
	}
	msgpack_unpacked_destroy(&up);
}

static void submit(bk_gen *g, pending_rec *p, uint64_t no, const char *id, const gen_opts *o)
{
	long n = o->pass_epochs * o->ntraj;
	uint64_t *keys = xmalloc((size_t)n * sizeof(*keys)), *tags = xmalloc((size_t)n * sizeof(*tags));
	uint64_t idh = bk_hash(id, strlen(id), 0);
	for (long i = 0; i < n; i++) {
		keys[i] = bk_crng_key((uint64_t)o->seed, idh, (uint64_t)(i % o->ntraj),
				      (uint64_t)(o->epoch0 + i / o->ntraj));
		tags[i] = no * (uint64_t)n + (uint64_t)i;
	}
	bk_gen_submit(g, p->t_prompt, p->n_t, (int)n, keys, tags);
	free(keys);
	free(tags);
}

/* tokens: the engine's count of tokens sampled so far, finished samples or not (the
 * samples' own lengths arrive only when they finish, in lockstep batches often all at
 * the end of a window or an epoch) */
static void progress(const totals *t, const bk_gen *g, double t0, int final)
{
	double dt = now() - t0;
	unsigned long long tokens = (unsigned long long)bk_gen_get_stats(g)->new_tokens;
	fprintf(stderr, "\r%s: %llu records, %llu samples, %llu tokens, %.0f tokens/s%s", bk_prog,
		(unsigned long long)t->in, (unsigned long long)t->samples, tokens,
		dt > 0 ? (double)tokens / dt : 0.0, final ? "\n" : "");
}

int main(int argc, char **argv)
{
	const char *sys_text = NULL, *sys_file = NULL;
	gen_opts o = { .ntraj = 4, .max_new = 128, .epochs = 1, .max_batch = 64, .window = 256,
		       .temperature = 0.8, .top_p = 0.9, .teacher_temp = 1.0 };
	mass_stats ms = { .min_mass = 0.5 };
	const char *out_path = "-", *model = NULL, *device = "auto", *kv_memory = NULL;
	const char *shard_spec = NULL;
	long max_prompt = 0;
	bk_q4_flags q4f = BK_Q4_FLAGS_INIT;
	bk_opt opts[] = {
		{"model", 0, BK_OPT_STR, &model, 0, 0},
		{"device", 0, BK_OPT_STR, &device, 0, 0},
		{"no-share-weights", 0, BK_OPT_FLAG, &bk_wshare_off, 0, 0},
		{"num-trajectories", 0, BK_OPT_INT, &o.ntraj, 1, 1L << 16},
		{"temperature", 0, BK_OPT_DOUBLE, &o.temperature, 0, 0},
		{"top-k", 0, BK_OPT_INT, &o.top_k, 0, 1L << 30},
		{"top-p", 0, BK_OPT_DOUBLE, &o.top_p, 0, 0},
		{"max-new-tokens", 0, BK_OPT_INT, &o.max_new, 1, 1L << 20},
		{"epochs", 0, BK_OPT_INT, &o.epochs, 1, 1L << 16},
		{"seed", 0, BK_OPT_INT, &o.seed, 0, 0},
		{"max-batch", 0, BK_OPT_INT, &o.max_batch, 1, 1L << 16},
		{"kv-memory", 0, BK_OPT_STR, &kv_memory, 0, 0},
		{"max-prompt", 0, BK_OPT_INT, &max_prompt, 1, 1L << 30},
		{"window", 0, BK_OPT_INT, &o.window, 1, 1L << 24},
		{"verbose", 'v', BK_OPT_FLAG, &bk_verbose, 0, 0},
		{"system", 0, BK_OPT_STR, &sys_text, 0, 0},
		{"system-file", 0, BK_OPT_STR, &sys_file, 0, 0},
		{"output", 'o', BK_OPT_STR, &out_path, 0, 0},
		{"shard", 0, BK_OPT_STR, &shard_spec, 0, 0},
		{"retokenize", 0, BK_OPT_FLAG, &o.retokenize, 0, 0},
		{"load-in-4bit", 0, BK_OPT_FLAG, &q4f.load, 0, 0},
		{"bnb-4bit-quant-type", 0, BK_OPT_STR, &q4f.type, 0, 0},
		{"bnb-4bit-use-double-quant", 0, BK_OPT_INT, &q4f.double_quant, 0, 1},
		{"bnb-4bit-compute-dtype", 0, BK_OPT_STR, &q4f.dtype, 0, 0},
		{"teacher-top-k", 0, BK_OPT_INT, &o.teacher_k, 0, 1L << 30},
		{"teacher-temperature", 0, BK_OPT_DOUBLE, &o.teacher_temp, 0, 0},
		{"min-mass", 0, BK_OPT_DOUBLE, &ms.min_mass, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	bk_stdout_init();
	int n = bk_flags_parse(argc, argv, opts, usage);
	if (n > 1)
		die_usage("too many arguments");
	if (!model)
		die_usage("--model DIR is required");
	bk_q4_config q4 = bk_q4_flags_config(&q4f);
	char *model_dir = bk_hub_model_dir(model, NULL);
	model = model_dir;
	if (!(o.temperature >= 0 && o.temperature <= 100))
		die_usage("--temperature %g is not in [0,100]", o.temperature);
	if (!(o.top_p > 0 && o.top_p <= 1))
		die_usage("--top-p %g is not in (0,1]", o.top_p);
	if (o.ntraj * o.epochs > (1L << 20))
		die_usage("--num-trajectories x --epochs is over 1048576");
	if (bk_flag_given("teacher-top-k") && o.teacher_k < 1)
		die_usage("--teacher-top-k %ld: bk-gen writes a top-k field (K >= 1); the full "
			  "distribution is bk-teach --top-k 0's", o.teacher_k);
	if (!o.teacher_k && (bk_flag_given("teacher-temperature") || bk_flag_given("min-mass")))
		die_usage("--%s needs --teacher-top-k", bk_flag_given("min-mass")
								? "min-mass" : "teacher-temperature");
	if (o.teacher_k && o.retokenize)
		die_usage("--teacher-top-k scores the sampled ids, but --retokenize writes other "
			  "ones (the text tokenized again, with the template's end of turn): score "
			  "those with bk-teach");
	if (!(o.teacher_temp > 0) || o.teacher_temp > 1e6)
		die_usage("--teacher-temperature %g is not a positive number", o.teacher_temp);
	if (!(ms.min_mass >= 0 && ms.min_mass <= 1))
		die_usage("--min-mass %g is not in [0, 1]", ms.min_mass);
	size_t kv_bytes = kv_memory ? parse_bytes(kv_memory) : 0;
	bk_shard shard = {0, 0};
	if (shard_spec)
		shard = bk_shard_parse("--shard", shard_spec);
	const bk_ops *ops = bk_device_select(device);
	const bk_gen_ops *gops = bk_gen_ops_for(ops);

	bk_config_free(bk_config_load(model)); /* an unsupported model is refused first */
	bk_reader *in = bk_reader_open(n ? argv[0] : "-");
	char *tok_path = bk_tok_file(model);
	bk_reader_expect_file(in, "tokenizer", tok_path, "tokenizer");
	if (sys_text || sys_file) {
		char *sys = bk_system_prompt(sys_text, sys_file, NULL, NULL, NULL);
		bk_reader_expect_system(in, sys);
		free(sys);
	}
	bk_tok *spm = bk_tok_open(tok_path);
	free(tok_path);
	char *tmpl_name = bk_reader_prov_str(in, "template");
	int tmpl = tmpl_name ? bk_template_from_name(tmpl_name) : bk_template_detect(model);
	if (tmpl < 0)
		die("%s: stream made with template '%s', which this bk-gen does not know",
		    bk_reader_name(in), tmpl_name);
	free(tmpl_name);
	o.tmpl = tmpl;

	bk_q4_adopt_stream(&q4, in); /* the thread count of a 4-bit stage before (load.h) */
	bk_loaded_model lm = bk_model_load_q4(ops, model, &q4);
	const bk_model *m = lm.model;
	bk_ids stop = { 0 };
	bk_model_stop_ids(lm.cfg, tmpl, spm, &stop);
	if (o.teacher_k > lm.cfg->vocab_size)
		die_usage("--teacher-top-k %ld is larger than the vocabulary (%d)", o.teacher_k,
			  lm.cfg->vocab_size);
	o.vocab = lm.cfg->vocab_size;
	bk_gen_config gc = { .max_batch = (int)o.max_batch, .max_new = (int)o.max_new,
			     .max_seq = bk_config_max_seq(lm.cfg),
			     .sample = { (float)o.temperature, (float)o.top_p, (int)o.top_k },
			     .stop = stop.v, .n_stop = (int)stop.n, .kv_memory = kv_bytes,
			     .max_prompt = (int)max_prompt, .ntraj = (int)o.ntraj,
			     .teacher_k = (int)o.teacher_k,
			     .teacher_temperature = (float)o.teacher_temp };
	bk_gen *g = bk_gen_create(m, gops, NULL, &gc);

	bk_writer *w = bk_writer_open(out_path);
	bk_kv kv[14] = { BK_KV_S("model", lm.fingerprint), BK_KV_I("seed", o.seed),
			 BK_KV_D("sampling_temperature", o.temperature), BK_KV_I("top_k", o.top_k),
			 BK_KV_D("top_p", o.top_p), BK_KV_I("max_new_tokens", o.max_new),
			 BK_KV_I("num_trajectories", o.ntraj), BK_KV_I("epochs", o.epochs),
			 BK_KV_I("retokenize", o.retokenize) };
	char shard_buf[32], q4_buf[BK_Q4_PROV_BUF];
	/* the 4-bit setting of the base that sampled (and scored: bk-step compares it) */
	int nkv = 9 + bk_q4_prov(&q4, q4_buf, kv + 9);
	if (shard.n)
		kv[nkv++] = BK_KV_S("shard", bk_shard_str(&shard, shard_buf, sizeof shard_buf));
	if (o.teacher_k) { /* bk-gen scored: bk-teach's KL temperature (bk-step checks it) */
		kv[nkv++] = BK_KV_D("temperature", o.teacher_temp);
		kv[nkv++] = BK_KV_I("teacher_top_k", o.teacher_k);
	}
	bk_writer_header(w, in, kv, nkv);

	/* Epoch-major over a file: one pass per epoch, so that epoch e's samples of every
	 * record come before epoch e+1's (what bk-step's epochs expect).  A pipe cannot be
	 * read twice: there each record's epochs come together. */
	struct stat st_in;
	int passes = o.epochs > 1 && n && strcmp(argv[0], "-") && stat(argv[0], &st_in) == 0 &&
				     S_ISREG(st_in.st_mode)
			     ? (int)o.epochs
			     : 1;
	o.pass_epochs = passes > 1 ? 1 : o.epochs;
	long per = o.pass_epochs * o.ntraj;
	ring rg = { .cap = (size_t)o.window };
	rg.v = xcalloc(rg.cap, sizeof(*rg.v));
	totals tot = { 0 };
	int tty = isatty(2), eof = 0, started = 0;
	double t0 = now(), last_progress = 0;
	int32_t *ids = NULL;
	size_t cap = 0;
	BK_VEC(char *) first_ids = { 0 }; /* record ids of the first window, until started */

	for (int pass = 0; pass < passes; pass++) {
	if (pass > 0) {
		bk_reader_close(in);
		in = bk_reader_open(argv[0]);
		o.epoch0 = pass;
		o.skip_paired = 1;
		eof = 0;
		rg.head_no = 0;
	}
	while (!eof || rg.n) {
		/* read while the window has room */
		while (!eof && rg.n < rg.cap) {
			const msgpack_object *rec = bk_reader_next(in);
			if (!rec) {
				eof = 1;
				break;
			}
			if (!bk_shard_owns(&shard, in, rec))
				continue; /* another shard's record: not in this output */
			uint64_t no = rg.head_no + rg.n;
			pending_rec *p = &rg.v[(rg.head + rg.n) % rg.cap];
			memset(p, 0, sizeof(*p));
			rg.n++;
			tot.in++;
			size_t len;
			const char *raw = bk_reader_raw(in, &len);
			p->raw = xmalloc(len);
			memcpy(p->raw, raw, len);
			p->len = len;
			size_t nr;
			if (bk_rec_ids_opt(in, rec, "resp", &ids, &cap, &nr)) {
				if (o.teacher_k)
					bk_reader_die(in, "key 'resp' is given: bk-gen --teacher-top-k "
							  "scores only what it samples; score paired "
							  "records with bk-teach");
				continue; /* paired: passes through */
			}
			p->generate = 1;
			p->has_batch = bk_rec_int_opt(in, rec, "batch", &p->batch);
			p->n_t = (int)bk_rec_ids(in, rec, "t_prompt", &ids, &cap);
			size_t ns = 0;
			bk_rec_ids_opt(in, rec, "s_prompt", &ids, &cap, &ns);
			p->n_s = (int)ns;
			bk_rec_ids(in, rec, "t_prompt", &ids, &cap);
			if (p->n_t < 1)
				bk_reader_die(in, "field 't_prompt' is empty");
			if (max_prompt && p->n_t > max_prompt)
				bk_reader_die(in, "field 't_prompt' has %d tokens, more than --max-prompt "
					      "%ld (the KV cache is planned for it)", p->n_t, max_prompt);
			for (int t = 0; t < p->n_t; t++)
				if (ids[t] < 0 || ids[t] >= m->cfg.V)
					bk_reader_die(in, "field 't_prompt': id %d is not in [0,%d)",
						      ids[t], m->cfg.V);
			char lbuf[160];
			const char *lmsg = bk_config_check_len(lm.cfg, p->n_t + 1,
							       "teacher prompt plus one new token",
							       lbuf, sizeof lbuf);
			if (lmsg)
				bk_reader_die(in, "%s", lmsg);
			p->t_prompt = xmalloc((size_t)p->n_t * sizeof(int32_t));
			memcpy(p->t_prompt, ids, (size_t)p->n_t * sizeof(int32_t));
			p->res = xcalloc((size_t)per, sizeof(*p->res));
			char *id = bk_rec_str_opt(in, rec, "id");
			if (!id)
				bk_reader_die(in, "field 'id' is missing (the sampling key needs it)");
			if (started) {
				submit(g, p, no, id, &o);
				free(id);
			} else {
				bk_vec_push(&first_ids, id);
			}
		}
		if (!started) {
			/* the shared prefix: common prefix of the first window's teacher prompts */
			BK_VEC(const int32_t *) pp = { 0 };
			BK_VEC(int) pl = { 0 };
			for (size_t i = 0; i < rg.n; i++)
				if (rg.v[i].generate) {
					bk_vec_push(&pp, rg.v[i].t_prompt);
					bk_vec_push(&pl, rg.v[i].n_t);
				}
			int P = bk_gen_common_prefix(pp.v, pl.v, (int)pp.n);
			if (P > 0)
				bk_gen_set_prefix(g, pp.v[0], P);
			for (size_t i = 0, k = 0; i < rg.n; i++)
				if (rg.v[i].generate) {
					submit(g, &rg.v[i], i, first_ids.v[k], &o);
					free(first_ids.v[k++]);
				}
			free(pp.v);
			free(pl.v);
			free(first_ids.v);
			started = 1;
		}
		/* write every finished record at the head, in input order */
		while (rg.n && (!rg.v[rg.head].generate || rg.v[rg.head].n_done == per)) {
			pending_rec *p = &rg.v[rg.head];
			if (o.teacher_k && !ms.decided && !min_mass_decide(&ms, &rg, eof, per, spm))
				break; /* the first batch is not complete yet */
			emit(w, p, &o, spm, &tot, &ms);
			free(p->raw);
			free(p->t_prompt);
			free(p->res);
			rg.head = (rg.head + 1) % rg.cap;
			rg.head_no++;
			rg.n--;
		}
		if (eof && !rg.n)
			break;
		if (rg.n < rg.cap && !eof)
			continue;
		/* one step of the engine; collect what finished */
		if (!bk_gen_step(g))
			BUG("records wait for samples but the engine has none");
		bk_gen_result r;
		while (bk_gen_take(g, &r)) {
			pending_rec *p = ring_at(&rg, r.tag / (uint64_t)per);
			p->res[r.tag % (uint64_t)per] = r;
			p->n_done++;
			tot.samples++;
		}
		if (tty && now() - last_progress > 0.5) {
			progress(&tot, g, t0, 0);
			last_progress = now();
		}
	}
	}
	if (tty)
		progress(&tot, g, t0, 1);
	const bk_gen_stats *st = bk_gen_get_stats(g);
	double dt = now() - t0;
	note("shared prefix: %d tokens, built %llu time%s; %llu prompt%s used it, %llu prefilled in "
	     "full",
	     st->prefix_len, (unsigned long long)st->prefix_builds, bk_s(st->prefix_builds),
	     (unsigned long long)st->prefix_hits, bk_s(st->prefix_hits),
	     (unsigned long long)st->prefix_misses);
	note("%llu records in, %llu passed through, %llu samples written, %llu empty dropped",
	     (unsigned long long)tot.in, (unsigned long long)tot.passed,
	     (unsigned long long)tot.written, (unsigned long long)tot.dropped);
	note("%llu steps, up to %d sequences per step, %llu prompt tokens, %llu new tokens in "
	     "%.2f s (%.1f new tokens/s)",
	     (unsigned long long)st->steps, st->max_active, (unsigned long long)st->prompt_tokens,
	     (unsigned long long)st->new_tokens, dt, dt > 0 ? (double)st->new_tokens / dt : 0.0);
	note("kv cache: blocks of %d tokens, %d allocated (limit %d), at most %d in use; %d prefix "
	     "blocks shared %llu time%s; %llu waits for blocks, %llu prompts prefilled again",
	     st->kv_block, st->kv_blocks, st->kv_blocks_limit, st->kv_blocks_peak, st->prefix_blocks,
	     (unsigned long long)st->prefix_shared, bk_s(st->prefix_shared),
	     (unsigned long long)st->kv_waits,
	     (unsigned long long)st->recomputes);

	if (o.teacher_k && ms.n) {
		double mean = ms.sum / (double)ms.n;
		note("top-%ld uncovered mass: mean %.4f, max %.4f over %llu positions", o.teacher_k,
		     mean, ms.max, (unsigned long long)ms.n);
		if (ms.min_mass > 0 && 1 - mean < ms.min_mass)
			warn("top-%ld left %.1f%% of the teacher's mass uncovered on average (more than "
			     "1 - --min-mass %g): the loss underestimates the KL; use a larger "
			     "--teacher-top-k", o.teacher_k, 100 * mean, ms.min_mass);
	}

	bk_reader_close(in);
	bk_writer_close(w);
	bk_gen_free(g);
	bk_model_unload(&lm);
	bk_tok_free(spm);
	free(stop.v);
	free(ids);
	free(rg.v);
	free(model_dir);
	bk_stdout_close();
	return 0;
}
