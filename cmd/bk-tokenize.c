/* bk-tokenize - data files + system prompt -> stream of tokenized sample records. */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/progress.h"
#include "common/hash.h"
#include "formats/hfconfig.h"
#include "formats/inputs.h"
#include "formats/tokenizer.h"
#include "formats/stream.h"
#include "formats/template.h"
#include "formats/tokcache.h"
#include "formats/hub.h"
#include "formats/hubdata.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

static const char usage[] =
	"usage: bk-tokenize (--model DIR | --tokenizer FILE) [--template NAME]\n"
	"                   [--system TEXT | --system-file FILE | --corpus FILE\n"
	"                    [--corpus-format papers|text|list|json] [--system-template FILE]]\n"
	"                   [--format auto|json|jsonl|text] [--split SPEC] [--prompt TEXT]...\n"
	"                   [--enable-thinking | --no-thinking] [--date DATE]\n"
	"                   [--max-seq-length N] [--no-cache] [-o FILE] [DATA...]\n"
	"Reads prompts, prompt/response pairs or chat rows and writes one record per\n"
	"sample: id, user, response, t_prompt (teacher: with the system prompt),\n"
	"s_prompt (student: without), resp (paired data: response + end of turn).\n"
	"  --model DIR          HF model directory (or hub id): DIR/tokenizer.json, else DIR/tokenizer.model;\n"
	"                       template detected\n"
	"  --tokenizer FILE     a tokenizer.json or a sentencepiece tokenizer.model\n"
	"  --template NAME      raw, llama2, zephyr, mistral, mistral-v0.1, chatml, gemma,\n"
	"                       qwen2, qwen2.5, smollm2, qwen3, llama3, llama3.1, llama3.2\n"
	"  --enable-thinking    qwen3: the generation prompt lets the model think (default)\n"
	"  --no-thinking        qwen3: enable_thinking=false, an empty think block in the prompt\n"
	"  --date DATE          llama3.1/3.2: the \"Today Date\" line (default 26 Jul 2024 for\n"
	"                       3.1, today for 3.2, as HF); recorded in the stream header\n"
	"  --system TEXT        the system prompt to bake\n"
	"  --system-file FILE   the system prompt, from a file\n"
	"  --corpus FILE        a knowledge corpus placed into the system prompt\n"
	"  --corpus-format F    papers, text, list or json (default text)\n"
	"  --system-template FILE  text with {corpus} where the corpus goes\n"
	"  --format F           data format: auto (default), json, jsonl, text\n"
	"  --split SPEC         the rows of a hub dataset (DATA = Org/Name, fetched into the HF\n"
	"                       cache) or dataset directory: train (default), train[:1000],\n"
	"                       test[10%:20%], train+test, ... as datasets' split syntax\n"
	"  --prompt TEXT        an inline prompt (repeatable), in addition to DATA\n"
	"  --max-seq-length N   cut teacher and student sequences to N tokens (0 = off)\n"
	"  --no-cache           do not read or write the tokenization cache\n"
	"  -o, --output FILE    write to FILE (atomically) instead of stdout\n"
	"  -v, --verbose        report cache hits and sentencepiece calls\n";

typedef struct {
	const char *model, *tokenizer, *template_name, *system, *system_file, *corpus,
		*corpus_format, *system_template, *format, *out, *date, *split;
	bk_strlist prompts;
	long max_seq;
	int no_cache, enable_thinking, no_thinking;
} tok_opts;

/* The system prompt's token count (for results.json), through the cache so that a
 * warm run makes no sentencepiece call at all. */
static size_t count_system_tokens(const bk_tok *spm, bk_tokcache *cache, uint64_t tok_hash,
				  const char *system)
{
	uint64_t key = bk_tokcache_key(tok_hash, "system-tokens", system, NULL, NULL);
	bk_tokcache_entry e;
	if (cache && bk_tokcache_get(cache, key, &e))
		return e.nt;
	bk_ids ids = {0};
	bk_tok_encode(spm, system, strlen(system), &ids.v, &ids.n);
	size_t n = ids.n;
	if (cache) {
		e = (bk_tokcache_entry){ids.v, NULL, NULL, ids.n, 0, 0, 0};
		bk_tokcache_put(cache, key, &e);
	}
	free(ids.v);
	return n;
}

/* user-text hash -> occurrences so far (open addressing, grows at half full) */
typedef struct {
	uint64_t *key;
	uint32_t *count;
	size_t cap, n;
} occ_table;

static uint64_t occ_next(occ_table *t, uint64_t h)
{
	if ((t->n + 1) * 2 > t->cap) {
		occ_table g = {xcalloc(t->cap ? t->cap * 2 : 1024, 8), NULL, t->cap ? t->cap * 2 : 1024, 0};
		g.count = xcalloc(g.cap, 4);
		for (size_t i = 0; i < t->cap; i++)
			if (t->count[i]) {
				size_t j = t->key[i] & (g.cap - 1);
				while (g.count[j])
					j = (j + 1) & (g.cap - 1);
				g.key[j] = t->key[i], g.count[j] = t->count[i], g.n++;
			}
		free(t->key);
		free(t->count);
		*t = g;
	}
	size_t j = h & (t->cap - 1);
	while (t->count[j] && t->key[j] != h)
		j = (j + 1) & (t->cap - 1);
	if (!t->count[j])
		t->key[j] = h, t->n++;
	return t->count[j]++;
}

static void copy_ids(bk_ids *dst, const int32_t *src, size_t n)
{
	bk_vec_reserve(dst, n);
	if (n)
		memcpy(dst->v, src, 4 * n);
	dst->n = n;
}

/* --max-seq-length: the reference's right-side truncation of the whole sequence (prompt
 * + response, teacher and student alike), except that a prompt is never cut: cutting
 * one removes its end, the user text and the assistant cue, and leaves a record that
 * trains on the system prompt alone.  The response keeps the room both prompts leave
 * (the ids are shared).  Returns 0 when a prompt leaves no room for one response or
 * new token: the caller drops the sample. */
static int fit_sample(bk_ids *t, bk_ids *s, bk_ids *r, size_t max)
{
	if (!max)
		return 1;
	if (t->n >= max || s->n >= max)
		return 0;
	size_t room = max - (t->n > s->n ? t->n : s->n);
	if (r->n > room)
		r->n = room;
	return 1;
}

int main(int argc, char **argv)
{
	tok_opts o = {.format = "auto", .out = "-"};
	bk_opt opts[] = {
		{"model", 0, BK_OPT_STR, &o.model, 0, 0},
		{"tokenizer", 0, BK_OPT_STR, &o.tokenizer, 0, 0},
		{"template", 0, BK_OPT_STR, &o.template_name, 0, 0},
		{"system", 0, BK_OPT_STR, &o.system, 0, 0},
		{"system-file", 0, BK_OPT_STR, &o.system_file, 0, 0},
		{"corpus", 0, BK_OPT_STR, &o.corpus, 0, 0},
		{"corpus-format", 0, BK_OPT_STR, &o.corpus_format, 0, 0},
		{"system-template", 0, BK_OPT_STR, &o.system_template, 0, 0},
		{"format", 0, BK_OPT_STR, &o.format, 0, 0},
		{"split", 0, BK_OPT_STR, &o.split, 0, 0},
		{"prompt", 0, BK_OPT_LIST, &o.prompts, 0, 0},
		{"max-seq-length", 0, BK_OPT_INT, &o.max_seq, 0, 1L << 30},
		{"no-cache", 0, BK_OPT_FLAG, &o.no_cache, 0, 0},
		{"enable-thinking", 0, BK_OPT_FLAG, &o.enable_thinking, 0, 0},
		{"no-thinking", 0, BK_OPT_FLAG, &o.no_thinking, 0, 0},
		{"date", 0, BK_OPT_STR, &o.date, 0, 0},
		{"output", 'o', BK_OPT_STR, &o.out, 0, 0},
		{"verbose", 'v', BK_OPT_FLAG, &bk_verbose, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	bk_stdout_init();
	int npos = bk_flags_parse(argc, argv, opts, usage);
	if (!o.model == !o.tokenizer)
		die_usage("give one of --model DIR or --tokenizer FILE");
	char *model_dir = o.model ? bk_hub_model_dir(o.model, NULL) : NULL;
	if (model_dir)
		o.model = model_dir;
	if (!npos && !o.prompts.n)
		die_usage("no data: give DATA files (\"-\" for stdin) or --prompt TEXT");
	if (o.enable_thinking && o.no_thinking)
		die_usage("give --enable-thinking or --no-thinking, not both");
	bk_template_set_thinking(!o.no_thinking);
	if (o.date)
		bk_template_set_date(o.date);

	/* inputs first: a bad data file fails before any output exists */
	bk_input_format fmt = bk_input_format_parse(o.format);
	bk_dataset ds = {0};
	int hub_data = 0;
	for (int i = 0; i < npos; i++) {
		struct stat st;
		const char *split = o.split ? o.split : "train";
		int rc = stat(argv[i], &st), missing = rc && errno == ENOENT;
		if (!rc && S_ISDIR(st.st_mode)) {
			bk_dataset_load_dir(&ds, argv[i], argv[i], split);
			hub_data = 1;
		} else if (missing && bk_hub_dataset_id(argv[i])) {
			bk_dataset_load_hub(&ds, argv[i], NULL, split);
			hub_data = 1;
		} else {
			bk_dataset_load(&ds, argv[i], fmt);
		}
	}
	if (o.split && !hub_data)
		die_usage("--split applies to hub datasets and dataset directories; no DATA is one");
	for (int i = 0; i < o.prompts.n; i++)
		bk_dataset_add(&ds, o.prompts.v[i], NULL, NULL);
	char *system = bk_system_prompt(o.system, o.system_file, o.corpus, o.corpus_format,
					o.system_template);

	bk_config *cfg = NULL; /* --model: its context length is checked per sample;
			       * an unsupported model is refused first */
	if (o.model) {
		char *cp = bk_path_join(o.model, "config.json");
		if (bk_file_exists(cp))
			cfg = bk_config_load(cp);
		free(cp);
	}
	char *tok_path = o.tokenizer ? xstrdup(o.tokenizer) : bk_tok_file(o.model);
	bk_tok *spm = bk_tok_open(tok_path);
	int tmpl;
	if (o.template_name) {
		tmpl = bk_template_from_name(o.template_name);
		if (tmpl < 0)
			die_usage("unknown template '%s' (known: %s)", o.template_name,
				  bk_template_names());
	} else if (o.model) {
		tmpl = bk_template_detect(o.model);
	} else {
		tmpl = BK_TMPL_RAW;
	}
	bk_template_check(tmpl, spm);
	const char *tmpl_name = bk_template_name(tmpl);
	uint64_t tok_hash = bk_tok_hash(spm);
	bk_tokcache *cache = o.no_cache ? NULL : bk_tokcache_open(tok_hash);

	char tok_hex[17], sys_hex[17];
	bk_hash_hex(tok_hash, tok_hex);
	bk_hash_hex(bk_hash(system ? system : "", system ? strlen(system) : 0, 0), sys_hex);
	size_t sys_tokens = system ? count_system_tokens(spm, cache, tok_hash, system) : 0;

	bk_writer *w = bk_writer_open(o.out);
	bk_kv kv[] = {
		BK_KV_S("tokenizer", tok_hex),
		BK_KV_S("template", tmpl_name),
		BK_KV_S("system", sys_hex),
		BK_KV_S("system_prompt", system ? system : ""),
		BK_KV_I("system_tokens", (int64_t)sys_tokens),
		BK_KV_I("max_seq_length", o.max_seq),
		BK_KV_I("paired", ds.paired),
		/* what else decides the template's ids: qwen3's thinking, llama3.x's date */
		BK_KV_S("template_variant", bk_template_variant(tmpl)),
		BK_KV_S("template_date", bk_template_date(tmpl) ? bk_template_date(tmpl) : ""),
	};
	bk_writer_header(w, NULL, kv, (int)(sizeof kv / sizeof kv[0]));

	bk_ids t = {0}, s = {0}, r = {0};
	size_t hits = 0, dropped = 0, too_long = 0;
	/* occurrences of each user text so far: duplicates get distinct, stable ids */
	occ_table seen = {0};
	bk_progress pg;
	uint64_t ntok = 0;
	bk_progress_start(&pg, "samples", ds.n);
	for (size_t i = 0; i < ds.n; i++) {
		bk_progress_update(&pg, i, ntok);
		const bk_sample *sm = &ds.v[i];
		const char *sys = sm->system ? sm->system : system;
		const char *resp = ds.paired ? sm->response : NULL;
		if (ds.paired && (!resp || bk_text_blank(resp))) {
			/* the reference's trainer keeps only pairs whose resp.strip() is
			 * not empty */
			dropped++;
			continue;
		}
		t.n = s.n = r.n = 0;
		bk_tokcache_entry e;
		uint64_t key = bk_tokcache_key(tok_hash, bk_template_variant(tmpl), sys, sm->prompt, resp);
		if (cache && bk_tokcache_get(cache, key, &e)) {
			hits++;
			copy_ids(&t, e.t, e.nt);
			copy_ids(&s, e.s, e.ns);
			copy_ids(&r, e.r, e.nr);
		} else {
			bk_template_prompt(tmpl, spm, sys, sm->prompt, &t);
			bk_template_prompt(tmpl, spm, NULL, sm->prompt, &s);
			if (resp)
				bk_template_response(tmpl, spm, resp, &r);
			if (cache) {
				e = (bk_tokcache_entry){t.v, s.v, r.v, t.n, s.n, r.n, resp != NULL};
				bk_tokcache_put(cache, key, &e);
			}
		}
		if (!fit_sample(&t, &s, &r, (size_t)o.max_seq)) {
			too_long++;
			continue;
		}
		if (cfg) { /* the model's context, as every stage that runs it checks */
			char lbuf[160];
			const char *lmsg = bk_config_check_len(
				cfg, (long)(t.n + (resp ? r.n : 1)),
				resp ? "teacher sequence" : "teacher prompt plus one new token", lbuf,
				sizeof lbuf);
			if (lmsg)
				die("sample %zu: %s (--max-seq-length cuts sequences)", i + 1, lmsg);
		}
		if (resp && r.n == 0) {
			dropped++;
			continue;
		}
		uint64_t uh = bk_hash(sm->prompt, strlen(sm->prompt), 0);
		uint64_t occ = occ_next(&seen, uh);
		char id[17];
		bk_hash_hex(occ ? bk_hash(sm->prompt, strlen(sm->prompt), occ) : uh, id);

		msgpack_packer *pk = bk_rec_begin(w);
		bk_rec_key(w, "id");
		bk_pack_str(pk, id);
		bk_rec_key(w, "user");
		bk_pack_str(pk, sm->prompt);
		if (sm->system) {
			bk_rec_key(w, "system");
			bk_pack_str(pk, sm->system);
		}
		if (resp) {
			bk_rec_key(w, "response");
			bk_pack_str(pk, resp);
		}
		bk_rec_key(w, "t_prompt");
		bk_pack_ids(pk, t.v, t.n);
		bk_rec_key(w, "s_prompt");
		bk_pack_ids(pk, s.v, s.n);
		if (resp) {
			bk_rec_key(w, "resp");
			bk_pack_ids(pk, r.v, r.n);
		}
		bk_rec_end(w);
		ntok += t.n + s.n + r.n;
	}
	bk_progress_end(&pg, ds.n, ntok);
	size_t written = (size_t)bk_writer_count(w);
	if (!written) /* one line, before the writer commits: no output file */
		die("no records written: of %zu sample%s, %zu had an empty response and %zu a "
		    "prompt that leaves no room under --max-seq-length %ld (a prompt is never cut)",
		    ds.n, ds.n == 1 ? "" : "s", dropped, too_long, o.max_seq);
	if (ds.skipped)
		warn("skipped %zu row%s with a null or empty prompt or no user/assistant pair "
		     "(as the reference's loader skips them)",
		     ds.skipped, ds.skipped == 1 ? "" : "s");
	if (dropped)
		warn("dropped %zu sample%s with an empty response (or only white space, as the "
		     "reference's trainer drops them)", dropped, dropped == 1 ? "" : "s");
	if (too_long)
		warn("dropped %zu sample%s whose prompt leaves no room under --max-seq-length %ld "
		     "(a prompt is never cut: its user text would be lost)",
		     too_long, too_long == 1 ? "" : "s", o.max_seq);
	bk_writer_close(w);
	size_t added = cache ? bk_tokcache_close(cache) : 0;
	note("%zu records, cache hits %zu, new cache entries %zu, sentencepiece calls %lu", written,
	     hits, added, bk_tok_encode_calls);
	free(seen.key);
	free(seen.count);
	free(t.v);
	free(s.v);
	free(r.v);
	free(system);
	free(tok_path);
	free(o.prompts.v);
	bk_tok_free(spm);
	if (cfg)
		bk_config_free(cfg);
	bk_dataset_free(&ds);
	free(model_dir);
	bk_stdout_close();
	return 0;
}
