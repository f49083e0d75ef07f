/* config_yaml.c - the flat YAML bake config (libyaml events) and its mapping onto the
 * bakery stages.  Each field of the reference tool's config is mapped, noted or
 * refused here, in one table-like function (bk_bake_plan_make); nothing runs here. */
#include "formats/config_yaml.h"
#include "common/diag.h"
#include "common/files.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <yaml.h>

/* ---- reading ---- */

static int is_null_scalar(const yaml_event_t *e)
{
	if (e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return 0;
	const char *s = (const char *)e->data.scalar.value;
	return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
	       !strcmp(s, "NULL");
}

static bk_cfg_field *find(const bk_cfg *c, const char *key)
{
	for (size_t i = 0; i < c->n; i++)
		if (!strcmp(c->v[i].key, key))
			return &c->v[i];
	return NULL;
}

static bk_cfg_field *add(bk_cfg *c, const char *key, int line)
{
	c->v = xrealloc(c->v, (c->n + 1) * sizeof(*c->v));
	bk_cfg_field *f = &c->v[c->n++];
	memset(f, 0, sizeof *f);
	f->key = xstrdup(key);
	f->line = line;
	return f;
}

static void push_item(bk_cfg_field *f, const yaml_event_t *e)
{
	f->v = xrealloc(f->v, (size_t)(f->n + 1) * sizeof(*f->v));
	f->v[f->n++] = is_null_scalar(e) ? NULL : xstrdup((const char *)e->data.scalar.value);
}

static void field_free(bk_cfg_field *f)
{
	for (int i = 0; i < f->n; i++)
		free(f->v[i]);
	free(f->v);
	free(f->key);
}

int bk_cfg_parse(bk_cfg *c, const char *text, size_t len, const char *name, char *err,
		 size_t errlen)
{
	memset(c, 0, sizeof *c);
	c->name = xstrdup(name);
	yaml_parser_t ps;
	yaml_event_t e;
	if (!yaml_parser_initialize(&ps))
		die("out of memory initialising the YAML parser");
	yaml_parser_set_input_string(&ps, (const unsigned char *)text, len);
	/* state: 0 before the mapping, 1 expecting a key, 2 expecting a value,
	 * 3 inside a list value, 4 after the mapping */
	int state = 0, docs = 0, rc = -1;
	bk_cfg_field *cur = NULL;
	for (;;) {
		if (!yaml_parser_parse(&ps, &e)) {
			snprintf(err, errlen, "%s:%zu: %s%s%s", name, ps.problem_mark.line + 1,
				 ps.problem ? ps.problem : "YAML syntax error",
				 ps.context ? " " : "", ps.context ? ps.context : "");
			goto out;
		}
		int line = (int)e.start_mark.line + 1;
		yaml_event_type_t t = e.type;
		const char *what = NULL;
		switch (t) {
		case YAML_STREAM_START_EVENT:
		case YAML_DOCUMENT_END_EVENT:
			break;
		case YAML_DOCUMENT_START_EVENT:
			if (++docs > 1)
				what = "a second YAML document; the config is one flat mapping";
			break;
		case YAML_STREAM_END_EVENT:
			yaml_event_delete(&e);
			rc = 0;
			goto out;
		case YAML_MAPPING_START_EVENT:
			if (state == 0)
				state = 1;
			else if (state == 2)
				what = "a nested mapping; the config is flat (key: value)";
			else
				what = "a mapping inside a list; list items are single values";
			break;
		case YAML_MAPPING_END_EVENT:
			state = 4;
			break;
		case YAML_SEQUENCE_START_EVENT:
			if (state == 2) {
				cur->is_list = 1;
				state = 3;
			} else if (state == 3) {
				what = "a list inside a list; list items are single values";
			} else {
				what = "a list where a key: value mapping is expected";
			}
			break;
		case YAML_SEQUENCE_END_EVENT:
			state = 1;
			break;
		case YAML_ALIAS_EVENT:
			what = "a YAML alias; write the value out";
			break;
		case YAML_SCALAR_EVENT:
			if (state == 1) {
				const char *key = (const char *)e.data.scalar.value;
				bk_cfg_field *old = find(c, key);
				if (old) {
					snprintf(err, errlen, "%s:%d: duplicate key '%s' (first on line %d)",
						 name, line, key, old->line);
					yaml_event_delete(&e);
					goto out;
				}
				cur = add(c, key, line);
				state = 2;
			} else if (state == 2) {
				push_item(cur, &e);
				state = 1;
			} else if (state == 3) {
				push_item(cur, &e);
			} else {
				what = "a single value where a key: value mapping is expected";
			}
			break;
		default:
			break;
		}
		yaml_event_delete(&e);
		if (what) {
			snprintf(err, errlen, "%s:%d: %s", name, line, what);
			goto out;
		}
	}
out:
	yaml_parser_delete(&ps);
	return rc;
}

void bk_cfg_load(bk_cfg *c, const char *path)
{
	size_t len;
	char *text = bk_read_file(path, &len);
	char err[512];
	if (bk_cfg_parse(c, text, len, path, err, sizeof err))
		die("%s", err);
	free(text);
}

void bk_cfg_set(bk_cfg *c, const char *key, const char *value)
{
	bk_cfg_field *f = find(c, key);
	if (f) {
		for (int i = 0; i < f->n; i++)
			free(f->v[i]);
		free(f->v);
		f->v = NULL;
		f->n = 0;
		f->is_list = 0;
		f->line = 0;
	} else {
		f = add(c, key, 0);
	}
	f->v = xmalloc(sizeof(*f->v));
	f->v[0] = xstrdup(value);
	f->n = 1;
}

const bk_cfg_field *bk_cfg_get(const bk_cfg *c, const char *key)
{
	return find(c, key);
}

void bk_cfg_free(bk_cfg *c)
{
	for (size_t i = 0; i < c->n; i++)
		field_free(&c->v[i]);
	free(c->v);
	free(c->name);
	memset(c, 0, sizeof *c);
}

/* ---- mapping ---- */

typedef struct {
	bk_bake_plan *p;
	const bk_cfg *c;
	char *used; /* per field */
} mapper;

const char *bk_cfg_kind_name(bk_cfg_kind k)
{
	static const char *const names[] = {"note", "ignored", "unsupported", "unknown"};
	return names[k];
}

static void note_add(mapper *m, bk_cfg_kind kind, const char *key, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void note_add(mapper *m, bk_cfg_kind kind, const char *key, const char *fmt, ...)
{
	bk_bake_plan *p = m->p;
	const bk_cfg_field *f = find(m->c, key);
	p->notes = xrealloc(p->notes, (p->n_notes + 1) * sizeof(*p->notes));
	bk_cfg_note *n = &p->notes[p->n_notes++];
	va_list ap;
	va_start(ap, fmt);
	char buf[1024];
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	*n = (bk_cfg_note){kind, xstrdup(key), f ? f->line : 0, xstrdup(buf)};
	if (kind == BK_CFG_UNSUPPORTED || kind == BK_CFG_UNKNOWN)
		p->n_refused++;
}

/* "config.yaml:12" or "the command line" */
static const char *where(const mapper *m, const bk_cfg_field *f, char *buf, size_t n)
{
	if (f->line)
		snprintf(buf, n, "%s:%d", m->c->name, f->line);
	else
		snprintf(buf, n, "%s: override --%s", m->c->name, f->key);
	return buf;
}

/* the field (marked used), or NULL when absent or null */
static const bk_cfg_field *field(mapper *m, const char *key)
{
	bk_cfg_field *f = find(m->c, key);
	if (!f)
		return NULL;
	m->used[f - m->c->v] = 1;
	if (!f->is_list && (!f->n || !f->v[0]))
		return NULL;
	return f;
}

static const char *scalar(mapper *m, const char *key)
{
	const bk_cfg_field *f = field(m, key);
	if (!f)
		return NULL;
	if (f->is_list) {
		char w[256];
		die("%s: field '%s' is a list; a single value is expected", where(m, f, w, sizeof w),
		    key);
	}
	return f->v[0];
}

static int get_double(mapper *m, const char *key, double *dst, double lo, double hi)
{
	const char *s = scalar(m, key);
	if (!s)
		return 0;
	char *end, w[256];
	errno = 0;
	double v = strtod(s, &end);
	const bk_cfg_field *f = find(m->c, key);
	if (end == s || *end || errno || !isfinite(v))
		die("%s: field '%s': '%s' is not a number", where(m, f, w, sizeof w), key, s);
	if (v < lo || v > hi)
		die("%s: field '%s': %s is not in [%g, %g]", where(m, f, w, sizeof w), key, s, lo, hi);
	*dst = v;
	return 1;
}

static int get_long(mapper *m, const char *key, long *dst, long lo, long hi)
{
	double v;
	if (!get_double(m, key, &v, (double)lo, (double)hi))
		return 0;
	if (v != floor(v)) {
		char w[256];
		die("%s: field '%s': %s is not a whole number", where(m, find(m->c, key), w, sizeof w),
		    key, scalar(m, key));
	}
	*dst = (long)v;
	return 1;
}

/* -1 absent, else 0/1 */
static int get_bool(mapper *m, const char *key)
{
	const char *s = scalar(m, key);
	if (!s)
		return -1;
	static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", "1", NULL};
	static const char *const no[] = {"false", "False", "FALSE", "no", "No", "off", "0", NULL};
	for (int i = 0; yes[i]; i++)
		if (!strcmp(s, yes[i]))
			return 1;
	for (int i = 0; no[i]; i++)
		if (!strcmp(s, no[i]))
			return 0;
	char w[256];
	die("%s: field '%s': '%s' is not true or false", where(m, find(m->c, key), w, sizeof w), key,
	    s);
}

/* a scalar or a list, as strings (a scalar is a list of one) */
static void get_strs(mapper *m, const char *key, bk_cfg_strs *dst)
{
	const bk_cfg_field *f = field(m, key);
	if (!f)
		return;
	for (int i = 0; i < f->n; i++) {
		if (!f->v[i])
			continue;
		dst->v = xrealloc(dst->v, (size_t)(dst->n + 1) * sizeof(*dst->v));
		dst->v[dst->n++] = f->v[i];
	}
}

static int is_dir(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* "org/name": one slash, not a path that starts with / . or ~ */
static int looks_like_hub_id(const char *s)
{
	const char *sl = strchr(s, '/');
	return sl && sl != s && sl[1] && !strchr(sl + 1, '/') && *s != '.' && *s != '~';
}

static const char *const lora_targets[] = {"q_proj", "k_proj", "v_proj", "o_proj",
					   "gate_proj", "up_proj", "down_proj", NULL};

static void map_targets(mapper *m)
{
	bk_cfg_strs t = {0};
	get_strs(m, "target_modules", &t);
	bk_bake_plan *p = m->p;
	if (!t.n) {
		p->target_modules = xstrdup("q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
		return;
	}
	/* items may themselves be "a,b" or "a b" (an override) */
	size_t cap = 1;
	for (int i = 0; i < t.n; i++)
		cap += strlen(t.v[i]) + 1;
	char *out = xmalloc(cap);
	out[0] = 0;
	int bad = 0;
	for (int i = 0; i < t.n && !bad; i++) {
		char *copy = xstrdup(t.v[i]), *save = NULL;
		for (char *tok = strtok_r(copy, ", \t[]'\"", &save); tok;
		     tok = strtok_r(NULL, ", \t[]'\"", &save)) {
			int ok = !strcmp(tok, "all-linear");
			for (int k = 0; lora_targets[k] && !ok; k++)
				ok = !strcmp(tok, lora_targets[k]);
			if (!ok) {
				note_add(m, BK_CFG_UNSUPPORTED, "target_modules",
					 "module '%s': bakery's Llama LoRA targets are q_proj k_proj "
					 "v_proj o_proj gate_proj up_proj down_proj or all-linear", tok);
				bad = 1;
				break;
			}
			if (*out)
				strcat(out, ",");
			strcat(out, tok);
		}
		free(copy);
	}
	free(t.v);
	p->target_modules = out;
}

static void map_model(mapper *m)
{
	bk_bake_plan *p = m->p;
	p->model = scalar(m, "model_name_or_path");
	if (!p->model) {
		note_add(m, BK_CFG_UNSUPPORTED, "model_name_or_path",
			 "missing: the base model's local directory is required");
	} else if (!is_dir(p->model)) {
		if (looks_like_hub_id(p->model))
			note_add(m, BK_CFG_UNSUPPORTED, "model_name_or_path",
				 "'%s' is a hub model id, not a local directory: bakery never "
				 "downloads; fetch it (huggingface-cli download %s --local-dir DIR) "
				 "and give DIR", p->model, p->model);
		else
			note_add(m, BK_CFG_UNSUPPORTED, "model_name_or_path",
				 "'%s' is not a directory", p->model);
	} else {
		char *cj = bk_path_join(p->model, "config.json"),
		     *tk = bk_path_join(p->model, "tokenizer.model");
		if (!is_file(cj))
			note_add(m, BK_CFG_UNSUPPORTED, "model_name_or_path",
				 "'%s' has no config.json (an HF model directory is expected)",
				 p->model);
		else if (!is_file(tk))
			note_add(m, BK_CFG_UNSUPPORTED, "model_name_or_path",
				 "'%s' has no tokenizer.model (bakery reads sentencepiece "
				 "tokenizers)", p->model);
		free(cj);
		free(tk);
	}
}

static void map_data(mapper *m)
{
	bk_bake_plan *p = m->p;
	get_strs(m, "training_prompts", &p->prompts);
	static const char *const files[] = {"dataset_path", "dataset_file", "data_file",
					    "train_file", "prompts_file", NULL};
	for (int i = 0; files[i]; i++)
		get_strs(m, files[i], &p->data);
	static const char *const named[] = {"dataset", "dataset_name", NULL};
	for (int i = 0; named[i]; i++) {
		const char *d = scalar(m, named[i]);
		if (!d)
			continue;
		if (is_file(d)) {
			p->data.v = xrealloc(p->data.v, (size_t)(p->data.n + 1) * sizeof(char *));
			p->data.v[p->data.n++] = d;
		} else {
			note_add(m, BK_CFG_UNSUPPORTED, named[i],
				 "'%s' is not a local file (hub datasets are not downloaded; save "
				 "it as JSON/JSONL and give the file)", d);
		}
	}
	for (int i = 0; i < p->data.n; i++)
		if (!is_file(p->data.v[i]))
			note_add(m, BK_CFG_UNSUPPORTED, "training data",
				 "'%s' is not a readable file", p->data.v[i]);
	if (!p->data.n && !p->prompts.n)
		note_add(m, BK_CFG_UNSUPPORTED, "training_prompts",
			 "missing: no training data (training_prompts, dataset_path, data_file, "
			 "train_file or prompts_file)");
}

static void map_system(mapper *m)
{
	bk_bake_plan *p = m->p;
	p->system = scalar(m, "system_prompt");
	p->system_file = scalar(m, "system_prompt_file");
	p->corpus = scalar(m, "corpus_file");
	p->corpus_format = scalar(m, "corpus_format");
	p->system_template_text = scalar(m, "system_prompt_template");
	int n = !!p->system + !!p->system_file + !!p->corpus;
	if (!n)
		note_add(m, BK_CFG_UNSUPPORTED, "system_prompt",
			 "missing: give system_prompt, system_prompt_file or corpus_file");
	else if (n > 1)
		note_add(m, BK_CFG_UNSUPPORTED, p->corpus ? "corpus_file" : "system_prompt_file",
			 "give one of system_prompt, system_prompt_file and corpus_file");
	if (p->corpus_format && strcmp(p->corpus_format, "papers") && strcmp(p->corpus_format, "text") &&
	    strcmp(p->corpus_format, "list") && strcmp(p->corpus_format, "json"))
		note_add(m, BK_CFG_NOTE, "corpus_format",
			 "'%s' is rendered as pretty-printed JSON (as the reference does for "
			 "formats other than papers, text and list)", p->corpus_format);
	if (p->corpus_format && strcmp(p->corpus_format, "papers") && strcmp(p->corpus_format, "text") &&
	    strcmp(p->corpus_format, "list"))
		p->corpus_format = "json";
	if ((p->corpus_format || p->system_template_text) && !p->corpus)
		note_add(m, BK_CFG_UNSUPPORTED, p->corpus_format ? "corpus_format" : "system_prompt_template",
			 "needs corpus_file");
	if (p->system_template_text && !strstr(p->system_template_text, "{corpus}"))
		note_add(m, BK_CFG_UNSUPPORTED, "system_prompt_template", "has no {corpus}");
}

static void map_training(mapper *m)
{
	bk_bake_plan *p = m->p;
	get_long(m, "num_trajectories", &p->num_trajectories, 1, 1 << 16);
	get_long(m, "trajectory_length", &p->trajectory_length, 1, 1 << 20);
	get_double(m, "sampling_temperature", &p->sampling_temperature, 0, 100);
	get_double(m, "top_p", &p->top_p, 1e-9, 1);
	get_double(m, "temperature", &p->temperature, 1e-6, 1e6);
	get_long(m, "teacher_top_k", &p->top_k, 0, 1L << 30);
	double ep;
	if (get_double(m, "num_train_epochs", &ep, 0, 1 << 16)) {
		if (ep != floor(ep) || ep < 1)
			note_add(m, BK_CFG_UNSUPPORTED, "num_train_epochs",
				 "%g: bakery trains whole epochs (1 or more)", ep);
		else
			p->epochs = (long)ep;
	}
	get_long(m, "per_device_train_batch_size", &p->batch_size, 1, 1 << 20);
	get_long(m, "gradient_accumulation_steps", &p->grad_accum, 1, 1 << 20);
	get_double(m, "learning_rate", &p->lr, 0, 1e3);
	get_double(m, "warmup_ratio", &p->warmup_ratio, 0, 1);
	get_long(m, "warmup_steps", &p->warmup_steps, 0, 1L << 40);
	get_double(m, "weight_decay", &p->weight_decay, 0, 1e3);
	get_double(m, "max_grad_norm", &p->max_grad_norm, 0, 1e12);
	get_long(m, "lora_r", &p->lora_r, 1, 1 << 16);
	get_double(m, "lora_alpha", &p->lora_alpha, 1e-9, 1e9);
	get_double(m, "lora_dropout", &p->lora_dropout, 0, 0.999999);
	get_long(m, "seed", &p->seed, 0, 1L << 62);
	get_long(m, "logging_steps", &p->logging_steps, 1, 1L << 40);
	get_long(m, "save_steps", &p->save_steps, 1, 1L << 40);
	get_long(m, "max_seq_length", &p->max_seq_length, 0, 1L << 30);
	map_targets(m);

	const char *s = scalar(m, "lr_scheduler_type");
	if (s) {
		if (!strcmp(s, "linear") || !strcmp(s, "cosine") || !strcmp(s, "constant") ||
		    !strcmp(s, "constant_with_warmup"))
			p->schedule = s;
		else
			note_add(m, BK_CFG_UNSUPPORTED, "lr_scheduler_type",
				 "'%s': bk-step has linear, cosine, constant and constant_with_warmup",
				 s);
	}
	s = scalar(m, "save_strategy");
	if (s) {
		if (!strcmp(s, "epoch") || !strcmp(s, "steps") || !strcmp(s, "no"))
			p->save_strategy = s;
		else
			note_add(m, BK_CFG_UNSUPPORTED, "save_strategy",
				 "'%s': bakery saves by epoch, steps or no", s);
	}
	if (p->save_strategy && !strcmp(p->save_strategy, "no"))
		note_add(m, BK_CFG_NOTE, "save_strategy",
			 "'no': only final_model/ is kept by bk-bake (bk-step may still write "
			 "epoch checkpoints, which are removed)");
}

static void map_perf(mapper *m, const bk_bake_caps *caps)
{
	bk_bake_plan *p = m->p;
	int b = get_bool(m, "gradient_checkpointing");
	if (b == 1) {
		if (caps->grad_checkpoint)
			p->grad_checkpoint = 1;
		else
			note_add(m, BK_CFG_IGNORED, "gradient_checkpointing",
				 "this bk-step has no --grad-checkpoint; activations are kept "
				 "(more memory, same result)");
	}
	const char *o = scalar(m, "optim");
	if (o) {
		if (!strcmp(o, "adamw_torch") || !strcmp(o, "adamw_torch_fused") ||
		    !strcmp(o, "adamw_hf") || !strcmp(o, "adamw") || !strcmp(o, "adamw_apex_fused")) {
			/* bk-step's AdamW: betas 0.9/0.999, eps 1e-8, as adamw_torch */
		} else if (!strcmp(o, "adamw_bnb_8bit") || !strcmp(o, "adamw_8bit") ||
			   !strcmp(o, "paged_adamw_8bit") || !strcmp(o, "bnb_adamw_8bit")) {
			if (caps->optim_8bit)
				p->optim_8bit = 1;
			else
				note_add(m, BK_CFG_IGNORED, "optim",
					 "'%s': this bk-step has no --optim adamw8bit; 32-bit AdamW "
					 "states are used (more memory; the same update up to the 8-bit "
					 "quantisation)", o);
		} else {
			note_add(m, BK_CFG_UNSUPPORTED, "optim",
				 "'%s': bk-step trains with AdamW (adamw_torch) or 8-bit AdamW "
				 "(adamw_bnb_8bit)", o);
		}
	}
	if (get_bool(m, "use_flash_attention") == 1)
		note_add(m, BK_CFG_NOTE, "use_flash_attention",
			 "accepted, no effect: bakery's attention runs over packed sequences "
			 "with its own kernels; there is no switch");
	int bf = get_bool(m, "bf16"), fp = get_bool(m, "fp16");
	if (bf == 1 || fp == 1)
		note_add(m, BK_CFG_NOTE, bf == 1 ? "bf16" : "fp16",
			 "accepted: the GPU always computes in bf16 with fp32 accumulation and "
			 "fp32 master LoRA weights, the CPU twin in fp32");
	if (fp == 1 && bf == 1)
		note_add(m, BK_CFG_NOTE, "fp16", "bf16 and fp16 both given: bf16 is what runs");
}

/* fields of HF TrainingArguments a reference config may carry that only touch
 * logging, hub or data loading: each is named with what bakery does instead */
static void map_misc(mapper *m)
{
	static const struct {
		const char *key;
		bk_cfg_kind kind;
		const char *text;
	} misc[] = {
		{"report_to", BK_CFG_NOTE, "no logging integrations: the metrics stream is "
					   "output_dir/metrics.bk (bk-dump, bk-plot)"},
		{"run_name", BK_CFG_NOTE, "no effect (no logging integrations)"},
		{"logging_dir", BK_CFG_NOTE, "no effect: metrics go to output_dir/metrics.bk"},
		{"dataloader_num_workers", BK_CFG_NOTE, "no effect: the stages are processes"},
		{"trust_remote_code", BK_CFG_NOTE, "no effect: bakery runs Llama-family "
						   "checkpoints with its own code"},
		{"save_total_limit", BK_CFG_IGNORED, "every checkpoint is kept"},
		{"eval_steps", BK_CFG_IGNORED, "no validation loss during training; bk-eval "
					       "runs after it (eval_file, held_out_file)"},
		{"eval_strategy", BK_CFG_IGNORED, "no validation loss during training; bk-eval "
						  "runs after it"},
		{"evaluation_strategy", BK_CFG_IGNORED, "no validation loss during training; "
							"bk-eval runs after it"},
		{"validation_split", BK_CFG_IGNORED, "no validation loss during training; give "
						     "held_out_file for bk-eval"},
		{"torch_dtype", BK_CFG_NOTE, "weights are read in their stored dtype; the GPU "
					     "computes in bf16, the CPU in fp32"},
		{NULL, 0, NULL},
	};
	for (int i = 0; misc[i].key; i++) {
		const bk_cfg_field *f = field(m, misc[i].key);
		if (f)
			note_add(m, misc[i].kind, misc[i].key, "%s", misc[i].text);
	}
	static const char *const refuse[] = {"push_to_hub", "load_in_8bit", "load_in_4bit",
					     "use_peft", NULL};
	for (int i = 0; refuse[i]; i++) {
		int b = get_bool(m, refuse[i]);
		if (b == 1 && strcmp(refuse[i], "use_peft"))
			note_add(m, BK_CFG_UNSUPPORTED, refuse[i],
				 "%s", !strcmp(refuse[i], "push_to_hub")
					       ? "bakery never uploads; the adapter is in "
						 "output_dir/final_model"
					       : "quantised base weights are not supported (bf16 on "
						 "the GPU, fp32 on the CPU)");
		if (b == 0 && !strcmp(refuse[i], "use_peft"))
			note_add(m, BK_CFG_UNSUPPORTED, "use_peft",
				 "false: bakery only trains LoRA adapters");
	}
}

void bk_bake_plan_make(bk_bake_plan *p, const bk_cfg *c, const bk_bake_caps *caps)
{
	memset(p, 0, sizeof *p);
	/* the reference's defaults (HF TrainingArguments + the tool's own) */
	p->num_trajectories = 4;
	p->trajectory_length = 128;
	p->sampling_temperature = 0.8;
	p->top_p = 0.9;
	p->temperature = 1.0;
	p->top_k = 64;
	p->epochs = 3;
	p->batch_size = 8;
	p->grad_accum = 1;
	p->lr = 5e-5;
	p->max_grad_norm = 1.0;
	p->lora_r = 64;
	p->lora_alpha = 128;
	p->lora_dropout = 0.05;
	p->seed = 42;
	p->logging_steps = 1;
	p->schedule = "linear";
	p->save_strategy = "epoch";
	p->output_dir = "output";
	p->device = "auto";

	mapper m = {p, c, xcalloc(c->n + 1, 1)};
	map_model(&m);
	map_system(&m);
	map_data(&m);
	map_training(&m);
	map_perf(&m, caps);
	map_misc(&m);
	const char *s;
	if ((s = scalar(&m, "output_dir")))
		p->output_dir = s;
	p->eval_file = scalar(&m, "eval_file");
	p->held_out_file = scalar(&m, "held_out_file");
	p->kl_prompts = scalar(&m, "kl_prompts");
	p->template_name = scalar(&m, "template");
	if ((s = scalar(&m, "device"))) {
		if (strcmp(s, "cpu") && strcmp(s, "cuda") && strcmp(s, "auto"))
			note_add(&m, BK_CFG_UNSUPPORTED, "device", "'%s': cpu, cuda or auto", s);
		else
			p->device = s;
	}
	const char *const files[] = {p->eval_file, p->held_out_file, p->kl_prompts,
				     p->system_file, p->corpus};
	const char *const fkeys[] = {"eval_file", "held_out_file", "kl_prompts",
				     "system_prompt_file", "corpus_file"};
	for (int i = 0; i < 5; i++)
		if (files[i] && !is_file(files[i]))
			note_add(&m, BK_CFG_UNSUPPORTED, fkeys[i], "'%s' is not a readable file",
				 files[i]);
	if (p->save_strategy && !strcmp(p->save_strategy, "steps") && !p->save_steps)
		p->save_steps = 500; /* HF's default */
	for (size_t i = 0; i < c->n; i++)
		if (!m.used[i])
			note_add(&m, BK_CFG_UNKNOWN, c->v[i].key,
				 "not a field of the reference config (a typo?)");
	free(m.used);
}

void bk_bake_plan_free(bk_bake_plan *p)
{
	for (size_t i = 0; i < p->n_notes; i++) {
		free(p->notes[i].key);
		free(p->notes[i].text);
	}
	free(p->notes);
	free(p->prompts.v);
	free(p->data.v);
	free(p->target_modules);
	memset(p, 0, sizeof *p);
}
