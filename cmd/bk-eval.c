/* bk-eval - baseline / prompted / baked: Q&A keyword accuracy and held-out KL. */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/progress.h"
#include "formats/inputs.h"
#include "formats/qa.h"
#include "formats/tokenizer.h"
#include "formats/template.h"
#include "gpu/device.h"
#include "gpu/eval.h"
#include "gpu/gen.h"
#include "gpu/load.h"
#include "gpu/teach.h"
#include "gpu/wshare.h"
#include "formats/hub.h"

#include <jansson.h>
#include <string.h>

static const char usage[] =
	"usage: bk-eval --model DIR [--adapter DIR] [--device D] [--template NAME]\n"
	"               [--system TEXT | --system-file FILE | --corpus FILE\n"
	"                [--corpus-format F] [--system-template FILE]]\n"
	"               [--eval FILE] [--held-out FILE] [--kl-prompts FILE]\n"
	"               [--kl-tokens N] [--max-new-tokens N] [--max-batch N]\n"
	"               [--temperature T] [--show N] [-o FILE]\n"
	"               [--load-in-4bit [--bnb-4bit-quant-type T]\n"
	"                [--bnb-4bit-use-double-quant N] [--bnb-4bit-compute-dtype D]]\n"
	"Compares the base model without the system prompt (baseline), with it\n"
	"(discrete) and base + adapter without it (baked): keyword accuracy of greedy\n"
	"answers on Q&A files, and the mean per-token KL(teacher || student) on\n"
	"held-out prompts.  Writes results.json to -o (default stdout).\n"
	"  --model DIR          HF model directory or hub id (tokenizer.json or .model, template detected)\n"
	"  --adapter DIR        PEFT adapter to evaluate as 'baked' (else only base)\n"
	"  --device D           cpu, cuda or auto (default auto)\n"
	"  --no-share-weights   load an own copy of the weights on the GPU, not the one\n"
	"                       copy per GPU and model the stages share\n"
	"  --template NAME      chat template instead of the detected one\n"
	"  --system TEXT        the system prompt (also --system-file, --corpus ...)\n"
	"  --eval FILE          Q&A file: question/input and answer/expected/target\n"
	"  --held-out FILE      a second Q&A file, reported separately\n"
	"  --kl-prompts FILE    prompts (any bk-tokenize data format) for the KL figures\n"
	"  --kl-tokens N        teacher response length for the KL (greedy, default 64)\n"
	"  --max-new-tokens N   answer length (default 100, as the reference)\n"
	"  --max-batch N        sequences generated together (default 64)\n"
	"  --temperature T      KL temperature (default 1.0)\n"
	"  --show N             print the first N answers of each configuration on stderr\n"
	"  -o, --output FILE    write results.json to FILE (atomically)\n"
	BK_Q4_USAGE;

typedef struct {
	const char *model, *adapter, *device, *template_name, *system, *system_file, *corpus,
		*corpus_format, *system_template, *eval, *held_out, *kl_prompts, *out;
	long kl_tokens, max_new, max_batch, show;
	double temperature;
} eval_opts;

typedef struct {
	const bk_model *m;
	const bk_gen_ops *gops;
	const bk_lora *lora;
	const bk_tok *spm;
	int tmpl;
	const char *system;
	bk_ids stop;
	long max_batch, show, max_new;
	const bk_config *cfg;
} evaluator;

/* greedy answers for n prompts; returns malloc'd texts */
static char **answer(const evaluator *ev, const char *src, const char *const *questions,
		     size_t n, int with_system, int with_adapter, long max_new, int32_t ***ids_out,
		     int **n_out)
{
	bk_ids *p = xcalloc(n, sizeof *p);
	const int32_t **prompts = xmalloc(n * sizeof *prompts);
	int *lens = xmalloc(n * sizeof *lens);
	for (size_t i = 0; i < n; i++) {
		bk_template_prompt(ev->tmpl, ev->spm, with_system ? ev->system : NULL, questions[i], &p[i]);
		prompts[i] = p[i].v;
		lens[i] = (int)p[i].n;
		char buf[160];
		const char *msg = bk_config_check_len(ev->cfg, lens[i] + 1,
						      "prompt plus one new token", buf, sizeof buf);
		if (msg)
			die("%s: prompt %zu: %s", src, i + 1, msg);
	}
	bk_gen_config gc = {.max_batch = (int)ev->max_batch, .max_new = (int)max_new,
			    .max_seq = bk_config_max_seq(ev->cfg), .sample = {0.0f, 1.0f}, .stop = ev->stop.v,
			    .n_stop = (int)ev->stop.n};
	int32_t **ids = xmalloc(n * sizeof *ids);
	int *nids = xmalloc(n * sizeof *nids);
	bk_gen_run(ev->m, ev->gops, with_adapter ? ev->lora : NULL, &gc, NULL, with_system ? -1 : 0,
		   prompts, lens, (int)n, NULL, ids, nids);
	char **texts = xmalloc(n * sizeof *texts);
	for (size_t i = 0; i < n; i++)
		texts[i] = bk_tok_decode(ev->spm, ids[i], (size_t)nids[i]);
	for (size_t i = 0; i < n; i++)
		free(p[i].v);
	free(p);
	free(prompts);
	free(lens);
	if (ids_out) {
		*ids_out = ids;
		*n_out = nids;
	} else {
		for (size_t i = 0; i < n; i++)
			free(ids[i]);
		free(ids);
		free(nids);
	}
	return texts;
}

static bk_progress pg; /* generation passes done, of all the passes */
static uint64_t passes;

static const char *const config_names[3] = {"baseline", "discrete", "baked"};

/* one line on stderr: "baked   [hit ] Once upon a time -> ..., newlines as spaces */
static void show_line(const char *config, int ok, const char *q, const char *a)
{
	fprintf(stderr, "%-8s [%s] %s -> ", config, ok ? "hit " : "miss", q);
	for (const char *p = a; *p; p++)
		fputc(*p == '\n' ? ' ' : *p, stderr);
	fputc('\n', stderr);
}

/* accuracy of the three configurations on one Q&A set, as a JSON object */
static json_t *score_set(const evaluator *ev, const char *path, json_t *examples)
{
	bk_qa_set set = {0};
	bk_qa_load(&set, path);
	const char **q = xmalloc(set.n * sizeof *q);
	for (size_t i = 0; i < set.n; i++)
		q[i] = set.v[i].question;
	json_t *res = json_pack("{s:s, s:I}", "file", path, "samples", (json_int_t)set.n);
	for (int c = 0; c < 3; c++) {
		if (c == 2 && !ev->lora) {
			json_object_set_new(res, "baked_accuracy", json_null());
			continue;
		}
		char **a = answer(ev, path, q, set.n, c == 1, c == 2, ev->max_new, NULL, NULL);
		size_t correct = 0;
		for (size_t i = 0; i < set.n; i++) {
			int ok = bk_qa_correct(a[i], &set.v[i]);
			correct += (size_t)ok;
			if ((long)i < ev->show) {
				show_line(config_names[c], ok, q[i], a[i]);
				json_array_append_new(examples,
					json_pack("{s:s, s:s, s:s, s:b}", "config", config_names[c],
						  "question", q[i], "answer", a[i], "correct", ok));
			}
			free(a[i]);
		}
		free(a);
		bk_progress_update(&pg, ++passes, 0);
		char key[32];
		snprintf(key, sizeof key, "%s_accuracy", config_names[c]);
		json_object_set_new(res, key, json_real((double)correct / (double)set.n));
	}
	free(q);
	bk_qa_free(&set);
	return res;
}

static json_t *kl_json(bk_kl_result r)
{
	return json_pack("{s:f, s:f, s:I, s:i}", "per_token", r.per_token, "per_sample",
			 r.per_sample, "tokens", (json_int_t)r.tokens, "samples", r.samples);
}

int main(int argc, char **argv)
{
	eval_opts o = {.device = "auto", .out = "-", .kl_tokens = 64, .max_new = 100,
		       .max_batch = 64, .temperature = 1.0};
	bk_q4_flags q4f = BK_Q4_FLAGS_INIT;
	bk_opt opts[] = {
		{"model", 0, BK_OPT_STR, &o.model, 0, 0},
		{"adapter", 0, BK_OPT_STR, &o.adapter, 0, 0},
		{"device", 0, BK_OPT_STR, &o.device, 0, 0},
		{"no-share-weights", 0, BK_OPT_FLAG, &bk_wshare_off, 0, 0},
		{"template", 0, BK_OPT_STR, &o.template_name, 0, 0},
		{"system", 0, BK_OPT_STR, &o.system, 0, 0},
		{"system-file", 0, BK_OPT_STR, &o.system_file, 0, 0},
		{"corpus", 0, BK_OPT_STR, &o.corpus, 0, 0},
		{"corpus-format", 0, BK_OPT_STR, &o.corpus_format, 0, 0},
		{"system-template", 0, BK_OPT_STR, &o.system_template, 0, 0},
		{"eval", 0, BK_OPT_STR, &o.eval, 0, 0},
		{"held-out", 0, BK_OPT_STR, &o.held_out, 0, 0},
		{"kl-prompts", 0, BK_OPT_STR, &o.kl_prompts, 0, 0},
		{"kl-tokens", 0, BK_OPT_INT, &o.kl_tokens, 1, 1L << 20},
		{"max-new-tokens", 0, BK_OPT_INT, &o.max_new, 1, 1L << 20},
		{"max-batch", 0, BK_OPT_INT, &o.max_batch, 1, 1L << 20},
		{"temperature", 0, BK_OPT_DOUBLE, &o.temperature, 0, 0},
		{"show", 0, BK_OPT_INT, &o.show, 0, 1L << 20},
		{"output", 'o', BK_OPT_STR, &o.out, 0, 0},
		{"load-in-4bit", 0, BK_OPT_FLAG, &q4f.load, 0, 0},
		{"bnb-4bit-quant-type", 0, BK_OPT_STR, &q4f.type, 0, 0},
		{"bnb-4bit-use-double-quant", 0, BK_OPT_INT, &q4f.double_quant, 0, 1},
		{"bnb-4bit-compute-dtype", 0, BK_OPT_STR, &q4f.dtype, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	bk_stdout_init();
	if (bk_flags_parse(argc, argv, opts, usage))
		die_usage("bk-eval takes no positional arguments");
	if (!o.model)
		die_usage("--model DIR is required");
	bk_q4_config q4 = bk_q4_flags_config(&q4f);
	const char *model_arg = o.model;
	char *model_dir = bk_hub_model_dir(o.model, NULL);
	o.model = model_dir;
	if (!o.eval && !o.held_out && !o.kl_prompts)
		die_usage("nothing to evaluate: give --eval, --held-out or --kl-prompts");
	if (!(o.temperature > 0))
		die_usage("--temperature must be positive");
	char *system = bk_system_prompt(o.system, o.system_file, o.corpus, o.corpus_format,
					o.system_template);
	if (!system)
		die_usage("no system prompt: give --system, --system-file or --corpus");

	bk_config_free(bk_config_load(o.model)); /* an unsupported model is refused first */
	const bk_ops *ops = bk_device_select(o.device);
	char *tok_path = bk_tok_file(o.model);
	bk_tok *spm = bk_tok_open(tok_path);
	int tmpl = o.template_name ? bk_template_from_name(o.template_name) : bk_template_detect(o.model);
	if (tmpl < 0)
		die_usage("unknown template '%s' (known: %s)", o.template_name, bk_template_names());
	bk_template_check(tmpl, spm);
	if (o.adapter) /* the 4-bit base the adapter was trained on: its thread count */
		bk_q4_adopt_dir(&q4, o.adapter);
	bk_loaded_model lm = bk_model_load_q4(ops, o.model, &q4);
	bk_lora *lora = NULL;
	if (o.adapter) {
		bk_adapter *ad = bk_adapter_load(o.adapter, lm.cfg);
		bk_adapter_check_base(o.adapter, ad, o.model, lm.cfg, lm.fingerprint);
		lora = bk_lora_create(lm.model, ad->r, (float)ad->alpha, 0.0f, ad->targets);
		bk_lora_from_adapter(lm.model, lora, ad);
		bk_adapter_free(ad);
	}
	evaluator ev = {lm.model, bk_gen_ops_for(ops), lora, spm, tmpl, system, {0}, o.max_batch,
			o.show, o.max_new, lm.cfg};
	bk_model_stop_ids(lm.cfg, tmpl, spm, &ev.stop);
	bk_ids sys_ids = {0};
	bk_tok_encode(spm, system, strlen(system), &sys_ids.v, &sys_ids.n);

	json_t *res = json_pack("{s:s, s:s?, s:s, s:I}", "model", model_arg, "adapter", o.adapter,
				"template", bk_template_name(tmpl), "system_prompt_tokens",
				(json_int_t)sys_ids.n);
	json_t *examples = json_array();
	bk_progress_start(&pg, "passes", (uint64_t)((o.adapter ? 3 : 2) * (!!o.eval + !!o.held_out)));
	if (o.eval)
		json_object_set_new(res, "eval", score_set(&ev, o.eval, examples));
	if (o.held_out)
		json_object_set_new(res, "held_out", score_set(&ev, o.held_out, examples));
	if (o.kl_prompts) {
		bk_dataset ds = {0};
		bk_dataset_load(&ds, o.kl_prompts, BK_FMT_AUTO);
		const char **q = xmalloc(ds.n * sizeof *q);
		for (size_t i = 0; i < ds.n; i++)
			q[i] = ds.v[i].prompt;
		/* the teacher's own greedy responses are the positions the KL is taken on */
		int32_t **resp;
		int *nresp;
		char **t = answer(&ev, o.kl_prompts, q, ds.n, 1, 0, o.kl_tokens, &resp, &nresp);
		bk_eval_seq *seqs = xcalloc(ds.n, sizeof *seqs);
		bk_ids *tp = xcalloc(ds.n, sizeof *tp), *sp = xcalloc(ds.n, sizeof *sp);
		for (size_t i = 0; i < ds.n; i++) {
			bk_template_prompt(tmpl, spm, system, q[i], &tp[i]);
			bk_template_prompt(tmpl, spm, NULL, q[i], &sp[i]);
			seqs[i] = (bk_eval_seq){tp[i].v, sp[i].v, resp[i], (int)tp[i].n, (int)sp[i].n,
						nresp[i]};
		}
		const float *head = NULL; /* unused: the loss op reads the model's own head */
		bk_kl_result base = bk_eval_kl(lm.model, head, NULL, seqs, (int)ds.n, (float)o.temperature);
		json_t *kl = json_pack("{s:s, s:f, s:o}", "prompts", o.kl_prompts, "temperature",
				       o.temperature, "base", kl_json(base));
		if (lora) {
			bk_kl_result baked = bk_eval_kl(lm.model, head, lora, seqs, (int)ds.n,
							(float)o.temperature);
			json_object_set_new(kl, "baked", kl_json(baked));
			json_object_set_new(kl, "baked_over_base",
					    json_real(base.per_token > 0 ? baked.per_token / base.per_token : 0));
		}
		json_object_set_new(res, "kl", kl);
		for (size_t i = 0; i < ds.n; i++) {
			free(t[i]);
			free(resp[i]);
			free(tp[i].v);
			free(sp[i].v);
		}
		free(t);
		free(resp);
		free(nresp);
		free(tp);
		free(sp);
		free(seqs);
		free(q);
		bk_dataset_free(&ds);
	}
	bk_progress_end(&pg, passes, 0);
	json_object_set_new(res, "examples", examples);
	char *text = json_dumps(res, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
	size_t len = strlen(text);
	text = xrealloc(text, len + 2);
	text[len] = '\n';
	text[len + 1] = 0;
	if (strcmp(o.out, "-"))
		bk_write_file_atomic(o.out, text, len + 1);
	else if (fwrite(text, 1, len + 1, stdout) != len + 1)
		die("write error on standard output");
	free(text);
	json_decref(res);
	free(sys_ids.v);
	free(ev.stop.v);
	if (lora)
		bk_lora_free(lm.model, lora);
	bk_model_unload(&lm);
	bk_tok_free(spm);
	free(tok_path);
	free(system);
	free(model_dir);
	bk_stdout_close();
	return 0;
}
