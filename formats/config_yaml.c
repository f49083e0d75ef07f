/* config_yaml.c - the flat YAML bake config (libyaml events) and its mapping onto the
 * bakery stages.  Each field of the reference tool's config is mapped, noted or
 * refused here, in one table-like function (bk_bake_plan_make); nothing runs here. */
#include "formats/config_yaml.h"
#include "common/diag.h"
#include "common/files.h"
#include "formats/hub.h"
#include "formats/hubdata.h"

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
			/* a "\0" escape: the text would be cut there on its way to the tokenizer */
			if (memchr(e.data.scalar.value, 0, e.data.scalar.length)) {
				what = "a NUL character (\\0) in a value; text with NUL cannot be "
				       "tokenized";
				break;
			}
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
	/* null on the command line: null, None, ~ or nothing */
	int null = !*value || !strcmp(value, "null") || !strcmp(value, "None") || !strcmp(value, "~");
	f->v[0] = null ? NULL : xstrdup(value);
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

/* a range bound as written: whole numbers in full (1048576, not 1.04858e+06) */
static const char *bound(double v, char *buf, size_t n)
{
	if (v == floor(v) && fabs(v) < 1e15)
		snprintf(buf, n, "%.0f", v);
	else
		snprintf(buf, n, "%g", v);
	return buf;
}

/* lo_open: the range is (lo, hi], lo itself refused */
static int get_double_in(mapper *m, const char *key, double *dst, double lo, double hi,
			 int lo_open)
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
	char bl[32], bh[32];
	if (v < lo || v > hi || (lo_open && v == lo))
		die("%s: field '%s': %s is not in %c%s, %s]", where(m, f, w, sizeof w), key, s,
		    lo_open ? '(' : '[', bound(lo, bl, sizeof bl), bound(hi, bh, sizeof bh));
	*dst = v;
	return 1;
}

static int get_double(mapper *m, const char *key, double *dst, double lo, double hi)
{
	return get_double_in(m, key, dst, lo, hi, 0);
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

/* ---- the fields ---- */

/* how: "mapped" (map_* below), or for the table-driven ones what happens when the
 * value is not def (NULL = null): "note" (accepted, the note says why it has no
 * effect), "ignored" (accepted; only speed, memory or reporting differ) or "refused"
 * (the bake refuses: the result would differ) */
#define TA "TrainingArguments"
#define TA4 "TrainingArguments (transformers 4)"
#define TA5N "TrainingArguments (transformers > 5.3)"
#define BC "BakeryConfig"
#define DC "DataConfig"
#define LC "LoraConfig"
#define EXT "bakery"
#define NOVAL "no effect: bakery's validation loss (eval_strategy) is the loss alone, over every record, as the tool's"
#define ONEDEV "no effect: bakery trains in one process on one device"
#define NOHUB "no effect: bakery never uploads; the adapter is in output_dir/final_model"
#define NOLOG "no effect: no logging integrations; the metrics stream is output_dir/metrics.bk (bk-dump, bk-plot)"
#define NOLOADER "no effect: the stages are processes joined by pipes, not a torch DataLoader"
#define NOTORCH "no effect on the result: there is no torch; bakery's kernels are compiled ahead"
static const bk_cfg_known known[] = {
	/* the tool's BakeryConfig (config.py) */
	{"system_prompt", BC, "mapped", NULL, "the system prompt (wins over system_prompt_file and corpus_file, as in the tool)"},
	{"system_prompt_file", BC, "mapped", NULL, "read and stripped at both ends (str.strip), as the tool does"},
	{"num_trajectories", BC, "mapped", "4", "bk-gen --num-trajectories"},
	{"trajectory_length", BC, "mapped", "128", "bk-gen --max-new-tokens"},
	{"temperature", BC, "mapped", "1.0", "the KL temperature: bk-teach, bk-step, bk-eval --temperature"},
	{"sampling_temperature", BC, "mapped", "0.8", "bk-gen --temperature"},
	{"max_seq_length", BC, "mapped", NULL, "bk-tokenize --max-seq-length"},
	{"sequential_eval", BC, "note", "false", "no effect on the result: it only lowers the tool's peak memory in its validation loss"},
	/* DataConfig */
	{"model_name_or_path", DC, "mapped", NULL, "--model of every stage: a local HF directory, else a hub id (Org/Name) through the HF cache, downloaded into it when missing (HF_HUB_OFFLINE=1: cache only)"},
	{"torch_dtype", DC, "note", "bfloat16", "with load_in_4bit: the 4-bit compute dtype, as the tool's bnb_4bit_compute_dtype (--bnb-4bit-compute-dtype bfloat16, or float32); else no effect: weights are read in their stored dtype; the GPU computes in bf16, the CPU twin in fp32"},
	{"trust_remote_code", DC, "note", "false", "no effect: bakery runs Llama-family checkpoints with its own code, never the model's"},
	{"load_in_4bit", DC, "mapped", "false", "QLoRA: --load-in-4bit on bk-gen, bk-teach, bk-step and bk-eval: the decoder linears quantised as bitsandbytes does, teacher and student on the quantised base"},
	{"bnb_4bit_quant_type", DC, "mapped", "nf4", "with load_in_4bit: --bnb-4bit-quant-type (nf4, fp4); no effect without it"},
	{"bnb_4bit_use_double_quant", DC, "mapped", "true", "with load_in_4bit: --bnb-4bit-use-double-quant; no effect without it"},
	{"bnb_4bit_compute_dtype", EXT, "mapped", NULL, "with load_in_4bit: --bnb-4bit-compute-dtype (bfloat16, float32); the tool sets it to torch_dtype, which it overrides"},
	{"attn_implementation", DC, "note", NULL, "no effect on the result: bakery's own attention (flash-style kernels on the GPU, exact on the CPU)"},
	{"auto_install_optional_deps", DC, "note", "true", "no effect: bakery installs nothing at run time"},
	{"use_unsloth", DC, "mapped", "false", "true: lora_dropout 0, as the tool's Unsloth path; bakery's own kernels otherwise"},
	{"dataset", DC, "mapped", NULL, "bk-tokenize's data: a local JSON/JSONL file, else a hub dataset (Org/Name, or a directory laid out as one) through the HF cache, only its split's files downloaded (HF_HUB_OFFLINE=1: cache only)"},
	{"dataset_split", DC, "mapped", "train", "bk-tokenize --split, datasets' syntax (train_sft[:1000], [:10%], a+b); a local file is read whole, as the tool does"},
	{"training_prompts", DC, "mapped", NULL, "bk-tokenize --prompt"},
	{"eval_dataset_split", DC, "mapped", NULL, "with eval_strategy: the validation records from dataset, or eval_dataset: a hub dataset's split (bk-tokenize --split; a local file is read whole, as the tool does)"},
	{"eval_dataset", DC, "mapped", NULL, "with eval_strategy: the validation records, a local prompt/response file or a hub dataset (Org/Name, through the HF cache) (bk-tokenize, then bk-step --eval)"},
	{"eval_file", DC, "mapped", NULL, "bk-eval --eval: baseline_none, baseline_discrete, baked_eval"},
	{"heldout_file", DC, "mapped", NULL, "bk-eval --held-out: heldout_discrete, baked_heldout"},
	{"corpus_file", DC, "mapped", NULL, "bk-tokenize --corpus"},
	{"corpus_format", DC, "mapped", "papers", "bk-tokenize --corpus-format (papers, text, list; others as JSON)"},
	{"system_prompt_template", DC, "mapped", NULL, "--system-template (the tool's wrapper text when absent)"},
	/* LoraConfig */
	{"r", LC, "mapped", "64", "bk-step --lora-r"},
	{"lora_alpha", LC, "mapped", "128", "bk-step --lora-alpha"},
	{"target_modules", LC, "mapped", "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj", "bk-step --target-modules (all, all-linear or the Llama projections)"},
	{"lora_dropout", LC, "mapped", "0.05", "bk-step --lora-dropout"},
	{"bias", LC, "refused", "none", "bakery trains no bias terms (LoRA A and B only)"},
	/* HF TrainingArguments of transformers 5.3, the tool's pinned version (fields of
	 * later 5.x, which 5.3 drops silently, are marked TA5N) */
	{"output_dir", TA, "mapped", NULL, "final_model/, checkpoint-*, results.json, metrics.bk, logs/ (default 'output')"},
	{"per_device_train_batch_size", TA, "mapped", "8", "prompts (or pairs) per micro-batch; x num_trajectories records for bk-step --batch-size"},
	{"num_train_epochs", TA, "mapped", "3", "bk-gen --epochs (whole epochs, rounded up) and bk-step's step count (fractions as HF: ceil)"},
	{"max_steps", TA, "mapped", "-1", "> 0: bk-step --max-steps, bk-gen makes the epochs it needs"},
	{"learning_rate", TA, "mapped", "5e-5", "bk-step --lr"},
	{"lr_scheduler_type", TA, "mapped", "linear", "bk-step --schedule (linear, cosine, constant, constant_with_warmup)"},
	{"lr_scheduler_kwargs", TA, "refused", NULL, "bk-step's schedules take no extra arguments"},
	{"warmup_steps", TA, "mapped", "0", "bk-step --warmup-steps (below 1: a ratio of the steps, as HF 5; above 1: its whole part, as HF's int())"},
	{"optim", TA, "mapped", "adamw_torch_fused", "AdamW (adamw_torch*, adamw_hf) or bk-step --optim adamw8bit (adamw_bnb_8bit, adamw_8bit, paged_adamw_8bit)"},
	{"optim_args", TA, "refused", NULL, "bk-step's AdamW takes no extra arguments"},
	{"weight_decay", TA, "mapped", "0", "bk-step --weight-decay"},
	{"adam_beta1", TA, "refused", "0.9", "bk-step's AdamW has beta1 0.9 (the default) only"},
	{"adam_beta2", TA, "refused", "0.999", "bk-step's AdamW has beta2 0.999 (the default) only"},
	{"adam_epsilon", TA, "refused", "1e-8", "bk-step's AdamW has epsilon 1e-8 (the default) only"},
	{"optim_target_modules", TA, "refused", NULL, "GaLore/APOLLO targets: bk-step trains LoRA with AdamW"},
	{"gradient_accumulation_steps", TA, "mapped", "1", "bk-step --grad-accum (each micro-batch's mean loss / the count, as HF)"},
	{"average_tokens_across_devices", TA, "note", "true", ONEDEV},
	{"max_grad_norm", TA, "mapped", "1.0", "bk-step --max-grad-norm"},
	{"label_smoothing_factor", TA, "note", "0", "no effect: the KL loss has no labels to smooth (the tool's compute_loss ignores it too)"},
	{"bf16", TA, "note", "false", "no effect on the choice: the GPU always computes in bf16 with fp32 accumulation and fp32 master LoRA weights, the CPU twin in fp32"},
	{"fp16", TA, "note", "false", "no effect: the GPU computes in bf16 (not fp16) with fp32 accumulation, the CPU twin in fp32"},
	{"bf16_full_eval", TA, "note", "false", "no effect: bk-eval computes as training does (bf16 on the GPU, fp32 on the CPU)"},
	{"fp16_full_eval", TA, "note", "false", "no effect: bk-eval computes as training does (bf16 on the GPU, fp32 on the CPU)"},
	{"tf32", TA, "note", NULL, "no effect: the GPU linears run in bf16 with fp32 accumulation"},
	{"activation_checkpointing", TA5N, "mapped", "false", "as gradient_checkpointing (its new name)"},
	{"activation_checkpointing_kwargs", TA5N, "note", NULL, "no effect: bk-step recomputes each layer; torch's checkpoint options do not apply"},
	{"gradient_checkpointing", TA, "mapped", "false", "bk-step --grad-checkpoint (same result, less memory)"},
	{"gradient_checkpointing_kwargs", TA, "note", NULL, "no effect: bk-step recomputes each layer; torch's checkpoint options do not apply"},
	{"torch_compile", TA, "note", "false", NOTORCH},
	{"torch_compile_backend", TA, "note", NULL, NOTORCH},
	{"torch_compile_mode", TA, "note", NULL, NOTORCH},
	{"use_liger_kernel", TA, "note", "false", "no effect on the result: bakery's fused chunked LM-head loss plays that part"},
	{"liger_kernel_config", TA, "note", NULL, "no effect on the result: bakery's fused chunked LM-head loss plays that part"},
	{"use_cache", TA, "note", "false", "no effect: training uses no KV cache; generation always does"},
	{"neftune_noise_alpha", TA, "refused", NULL, "bakery adds no NEFTune noise to the input embeddings"},
	{"torch_empty_cache_steps", TA, "note", NULL, NOTORCH},
	{"auto_find_batch_size", TA, "ignored", "false", "the batch size is the one given; no retry with a smaller one on out-of-memory"},
	{"logging_strategy", TA, "note", "steps", "bk-step writes a metrics record every logging_steps steps; the summary and results.json are computed over every step"},
	{"logging_steps", TA, "mapped", "1", "bk-step --logging-steps (default 1, HF's 500; below 1: a ratio of the steps)"},
	{"logging_first_step", TA, "note", "false", "no effect on the bake: the summary is computed over every step, logged or not"},
	{"log_on_each_node", TA, "note", "true", ONEDEV},
	{"logging_nan_inf_filter", TA, "note", "true", "no effect: a step whose gradient norm is not finite is skipped with a warning"},
	{"include_num_input_tokens_seen", TA, "note", "no", "no effect: the metrics stream always counts tokens"},
	{"log_level", TA, "note", "passive", "no effect: stage messages go to output_dir/logs/ (bk-bake -v: the terminal)"},
	{"log_level_replica", TA, "note", "warning", ONEDEV},
	{"disable_tqdm", TA, "note", NULL, "no effect: a progress line is drawn on a terminal only"},
	{"report_to", TA, "note", "none", NOLOG},
	{"run_name", TA, "note", NULL, NOLOG},
	{"project", TA, "note", "huggingface", NOLOG},
	{"trackio_space_id", TA, "note", "trackio", NOLOG},
	{"trackio_bucket_id", TA5N, "note", NULL, NOLOG},
	{"trackio_static_space_id", TA5N, "note", NULL, NOLOG},
	{"eval_strategy", TA, "mapped", "no", "steps: bk-step --eval-steps; epoch: --eval-steps (an epoch's steps) --eval-final"},
	{"eval_steps", TA, "mapped", NULL, "bk-step --eval-steps (null: logging_steps as given, else HF's 500; below 1: a ratio of the steps)"},
	{"eval_delay", TA, "mapped", "0", "bk-step --eval-delay (steps; epochs with eval_strategy epoch)"},
	{"per_device_eval_batch_size", TA, "mapped", "8", "bk-step --eval-batch-size (HF weighs each validation batch alike)"},
	{"prediction_loss_only", TA, "note", "false", NOVAL},
	{"eval_on_start", TA, "note", "false", "not done: bk-step evaluates after steps, not before the first"},
	{"eval_do_concat_batches", TA, "note", "true", NOVAL},
	{"eval_use_gather_object", TA, "note", "false", NOVAL},
	{"eval_accumulation_steps", TA, "note", NULL, NOVAL},
	{"include_for_metrics", TA, "note", "[]", NOVAL},
	{"batch_eval_metrics", TA, "note", "false", NOVAL},
	{"save_only_model", TA, "note", "false", "no effect: checkpoints always hold the adapter and bk-step's optimizer state (resumable)"},
	{"save_strategy", TA, "mapped", "steps", "bk-step --save-steps (epoch: the steps of an epoch; no: none)"},
	{"save_steps", TA, "mapped", "500", "bk-step --save-steps with save_strategy steps (below 1: a ratio of the steps)"},
	{"save_on_each_node", TA, "note", "false", ONEDEV},
	{"save_total_limit", TA, "mapped", NULL, "bk-step --save-total-limit: the newest N checkpoint-* kept"},
	{"enable_jit_checkpoint", TA, "note", "false", "no effect: bk-step saves a checkpoint on SIGINT and SIGTERM anyway"},
	{"push_to_hub", TA, "refused", "false", "bakery never uploads; the adapter is in output_dir/final_model"},
	{"hub_token", TA, "note", NULL, NOHUB},
	{"hub_private_repo", TA, "note", NULL, NOHUB},
	{"hub_model_id", TA, "note", NULL, NOHUB},
	{"hub_strategy", TA, "note", "every_save", NOHUB},
	{"hub_always_push", TA, "note", "false", NOHUB},
	{"hub_revision", TA, "note", NULL, NOHUB},
	{"load_best_model_at_end", TA, "refused", "false", "bakery keeps the last adapter: no choice of the best checkpoint by validation loss"},
	{"metric_for_best_model", TA, "note", NULL, NOVAL},
	{"greater_is_better", TA, "note", NULL, NOVAL},
	{"ignore_data_skip", TA, "refused", "false", "bk-step --resume always continues where the checkpoint stopped in the data"},
	{"restore_callback_states_from_checkpoint", TA, "note", "false", "no effect: there are no callbacks"},
	{"full_determinism", TA, "note", "false", "no effect: a bake is deterministic for a seed on one device anyway"},
	{"seed", TA, "mapped", "42", "bk-gen, bk-step (LoRA init, dropout) and bk-lens --seed"},
	{"data_seed", TA, "mapped", NULL, "bk-lens --seed: the prompt order (default: seed)"},
	{"use_cpu", TA, "mapped", "false", "true: --device cpu"},
	{"accelerator_config", TA, "note", NULL, ONEDEV},
	{"parallelism_config", TA, "note", NULL, ONEDEV},
	{"dataloader_drop_last", TA, "refused", "false", "bakery trains the last partial micro-batch of an epoch, as the default does"},
	{"dataloader_num_workers", TA, "note", "0", NOLOADER},
	{"dataloader_pin_memory", TA, "note", "true", NOLOADER},
	{"dataloader_persistent_workers", TA, "note", "false", NOLOADER},
	{"dataloader_prefetch_factor", TA, "note", NULL, NOLOADER},
	{"dataloader_multiprocessing_context", TA5N, "note", NULL, NOLOADER},
	{"dataloader_in_order", TA5N, "note", "true", NOLOADER},
	{"remove_unused_columns", TA, "note", "true", "no effect (the tool sets it to false itself)"},
	{"label_names", TA, "note", NULL, "no effect: the KL loss has no labels"},
	{"train_sampling_strategy", TA, "refused", "random", "bk-lens shuffles the prompts with the seed (random) only"},
	{"length_column_name", TA, "note", "length", "no effect: there is no length grouping"},
	{"ddp_find_unused_parameters", TA, "note", NULL, ONEDEV},
	{"ddp_bucket_cap_mb", TA, "note", NULL, ONEDEV},
	{"ddp_broadcast_buffers", TA, "note", NULL, ONEDEV},
	{"ddp_static_graph", TA5N, "note", NULL, ONEDEV},
	{"ddp_backend", TA, "note", NULL, ONEDEV},
	{"ddp_timeout", TA, "note", "1800", ONEDEV},
	{"fsdp", TA, "refused", NULL, "bakery trains on one device, without FSDP"},
	{"fsdp_config", TA, "note", NULL, ONEDEV},
	{"deepspeed", TA, "refused", NULL, "bakery trains on one device, without DeepSpeed"},
	{"debug", TA, "note", "", "no effect (torch debug modes)"},
	{"skip_memory_metrics", TA, "note", "true", "no effect: no memory metrics"},
	{"do_train", TA, "note", "false", "no effect: the tool trains whatever it says, and so does bk-bake"},
	{"do_eval", TA, "note", "false", "no effect: bk-eval runs when eval_file or heldout_file is given, as in the tool"},
	{"do_predict", TA, "note", "false", "no effect: there is no prediction pass"},
	{"resume_from_checkpoint", TA, "mapped", NULL, "bk-step --resume: a checkpoint directory, or true for the last output_dir/checkpoint-N (the tool's trainer.train() ignores the field; a note says so)"},
	{"local_rank", TA, "note", "-1", ONEDEV},
	/* fields of older transformers that configs still carry */
	{"warmup_ratio", TA, "mapped", NULL, "as transformers 5.3: replaces warmup_steps (deprecated there; transformers 5.15 and later drop it silently; a note says so)"},
	{"overwrite_output_dir", TA4, "mapped", "false", "true: the previous bake's outputs in output_dir are removed first"},
	{"evaluation_strategy", TA4, "mapped", "no", "as eval_strategy (transformers 5 drops it silently; a note says so)"},
	{"logging_dir", TA, "note", NULL, NOLOG},
	{"no_cuda", TA4, "mapped", "false", "true: --device cpu"},
	{"save_safetensors", TA4, "note", "true", "no effect: adapters are always safetensors"},
	{"group_by_length", TA4, "note", "false", "no effect, as in transformers 5.3, which has no such field (the tool drops it); length grouping is train_sampling_strategy there, which bakery refuses"},
	{"include_tokens_per_second", TA4, "note", "false", "no effect: the metrics stream always has tokens/s"},
	/* bakery's own fields */
	{"template", EXT, "mapped", NULL, "the chat template by name (raw, llama2, chatml, ...) for models without one"},
	{"prompts_file", EXT, "mapped", NULL, "a text/JSON/JSONL data file for bk-tokenize"},
	{"dataset_path", EXT, "mapped", NULL, "a data file for bk-tokenize"},
	{"dataset_file", EXT, "mapped", NULL, "a data file for bk-tokenize"},
	{"data_file", EXT, "mapped", NULL, "a data file for bk-tokenize"},
	{"train_file", EXT, "mapped", NULL, "a data file for bk-tokenize"},
	{"dataset_name", EXT, "mapped", NULL, "as dataset"},
	{"lora_r", EXT, "mapped", NULL, "as r"},
	{"held_out_file", EXT, "mapped", NULL, "as heldout_file"},
	{"kl_prompts", EXT, "mapped", NULL, "bk-eval --kl-prompts: held-out KL(teacher || model), base and baked"},
	{"teacher_top_k", EXT, "mapped", NULL, "null: the exact KL over the vocabulary, the teacher run in bk-step, as the tool; N: bk-teach --top-k N (0: the full distribution stored)"},
	{"top_p", EXT, "mapped", "0.9", "bk-gen --top-p (the tool's fixed 0.9)"},
	{"retokenize_trajectories", EXT, "mapped", "true", "bk-gen --retokenize: each trajectory decoded, stripped and tokenized again in the chat template with its end of turn, as the tool trains it (false: the sampled ids)"},
	{"top_k", EXT, "mapped", "50", "bk-gen --top-k (HF generate's default 50, which the tool's sampling gets; 0: off)"},
	{"device", EXT, "mapped", "auto", "--device of every stage: cpu, cuda or auto"},
	{"revision", EXT, "mapped", "main", "the hub model's branch, tag or commit (transformers' from_pretrained revision)"},
	{"use_flash_attention", EXT, "note", "false", "no effect: bakery's attention runs over packed sequences with its own kernels; there is no switch"},
	{"validation_split", EXT, "ignored", NULL, "no effect: the validation records are eval_dataset, or eval_dataset_split of dataset"},
	{"use_peft", EXT, "refused", "true", "bakery only trains LoRA adapters"},
	{"load_in_8bit", EXT, "refused", "false", "quantised base weights are not supported (bf16 on the GPU, fp32 on the CPU)"},
};

const bk_cfg_known *bk_cfg_fields(size_t *n)
{
	*n = sizeof known / sizeof known[0];
	return known;
}

long bk_bake_steps(double v, long total)
{
	if (v <= 0)
		return 0;
	if (v < 1)
		return (long)ceil(v * (double)total);
	return (long)v;
}

/* the value of f is the default def: bool words, numbers and null compared by meaning */
static int bool_word(const char *s)
{
	static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "on", NULL};
	static const char *const no[] = {"false", "False", "FALSE", "no", "No", "off", NULL};
	for (int i = 0; yes[i]; i++)
		if (!strcmp(s, yes[i]))
			return 1;
	for (int i = 0; no[i]; i++)
		if (!strcmp(s, no[i]))
			return 0;
	return -1;
}

static int same_value(const char *v, const char *def)
{
	if (!v || !strcmp(v, "None"))
		return !def;
	if (!def)
		return 0;
	int a = bool_word(v), b = bool_word(def);
	if (a >= 0 || b >= 0)
		return a == b;
	char *e1, *e2;
	double x = strtod(v, &e1), y = strtod(def, &e2);
	if (e1 != v && !*e1 && e2 != def && !*e2)
		return x == y;
	return !strcmp(v, def);
}

static int is_default(const bk_cfg_field *f, const char *def)
{
	if (f->is_list)
		return f->n == 0 ? !def || !strcmp(def, "[]") : f->n == 1 && same_value(f->v[0], def);
	return f->n == 0 || same_value(f->v[0], def);
}

/* the table's note, ignored and refused fields */
static void map_table(mapper *m)
{
	for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
		const bk_cfg_known *k = &known[i];
		if (!strcmp(k->how, "mapped"))
			continue;
		bk_cfg_field *f = find(m->c, k->key);
		if (!f)
			continue;
		m->used[f - m->c->v] = 1;
		if (is_default(f, k->def))
			continue;
		bk_cfg_kind kind = !strcmp(k->how, "note")      ? BK_CFG_NOTE
				   : !strcmp(k->how, "ignored") ? BK_CFG_IGNORED
								: BK_CFG_UNSUPPORTED;
		if (kind == BK_CFG_UNSUPPORTED)
			note_add(m, kind, k->key, "'%s': %s", f->n && f->v[0] ? f->v[0] : "null",
				 k->text);
		else
			note_add(m, kind, k->key, "%s", k->text);
	}
}

/* ---- mapping ---- */

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
	size_t cap = 16;
	for (int i = 0; i < t.n; i++)
		cap += strlen(t.v[i]) + 12;
	char *out = xmalloc(cap);
	out[0] = 0;
	int bad = 0;
	for (int i = 0; i < t.n && !bad; i++) {
		char *copy = xstrdup(t.v[i]), *save = NULL;
		for (char *tok = strtok_r(copy, ", \t[]'\"", &save); tok;
		     tok = strtok_r(NULL, ", \t[]'\"", &save)) {
			if (!strcmp(tok, "all")) /* the tool's shorthand (PEFT's all-linear) */
				tok = "all-linear";
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
		/* a hub id: bk-bake resolves it through the HF cache before the stages */
		if (!bk_hub_is_id(p->model))
			note_add(m, BK_CFG_UNSUPPORTED, "model_name_or_path",
				 "'%s' is neither a directory nor a hub id (Org/Name)", p->model);
	} else {
		char *cj = bk_path_join(p->model, "config.json"),
		     *tk = bk_path_join(p->model, "tokenizer.model"),
		     *tj = bk_path_join(p->model, "tokenizer.json");
		if (!is_file(cj))
			note_add(m, BK_CFG_UNSUPPORTED, "model_name_or_path",
				 "'%s' has no config.json (an HF model directory is expected)",
				 p->model);
		else if (!is_file(tk) && !is_file(tj))
			note_add(m, BK_CFG_UNSUPPORTED, "model_name_or_path",
				 "'%s' has no tokenizer.json or tokenizer.model", p->model);
		free(cj);
		free(tk);
		free(tj);
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
	int local = 0;
	for (int i = 0; named[i]; i++) {
		const char *d = scalar(m, named[i]);
		struct stat st;
		if (!d)
			continue;
		if (is_file(d)) {
			p->data.v = xrealloc(p->data.v, (size_t)(p->data.n + 1) * sizeof(char *));
			p->data.v[p->data.n++] = d;
			local = 1;
		} else if ((!stat(d, &st) && S_ISDIR(st.st_mode)) ||
			   (errno == ENOENT && bk_hub_dataset_id(d))) {
			if (p->hub_data)
				note_add(m, BK_CFG_UNSUPPORTED, named[i],
					 "'%s' and '%s': give one hub dataset", p->hub_data, d);
			p->hub_data = d; /* bk-tokenize reads (and fetches) it */
		} else {
			note_add(m, BK_CFG_UNSUPPORTED, named[i],
				 "'%s' is not a local file, a dataset directory or a hub id "
				 "(Org/Name)", d);
		}
	}
	const char *split = scalar(m, "dataset_split");
	if (p->hub_data) {
		char err[256];
		bk_split_spec sp;
		p->hub_split = split ? split : "train";
		if (bk_split_parse(p->hub_split, &sp, err, sizeof err))
			note_add(m, BK_CFG_UNSUPPORTED, "dataset_split", "'%s': %s", p->hub_split,
				 err);
		else
			bk_split_free(&sp);
	}
	if (split && strcmp(split, "train") && local)
		note_add(m, BK_CFG_NOTE, "dataset_split",
			 "'%s' applies to hub datasets; a local file is read whole, as the tool "
			 "does", split);
	for (int i = 0; i < p->data.n; i++)
		if (!is_file(p->data.v[i]))
			note_add(m, BK_CFG_UNSUPPORTED, "training data",
				 "'%s' is not a readable file", p->data.v[i]);
	if (p->prompts.n && (p->data.n || p->hub_data))
		note_add(m, BK_CFG_NOTE, "training_prompts",
			 "not used: the tool trains on 'dataset' when both are given");
	if (p->prompts.n && (p->data.n || p->hub_data))
		p->prompts.n = 0;
	if (!p->data.n && !p->prompts.n && !p->hub_data)
		note_add(m, BK_CFG_UNSUPPORTED, "training_prompts",
			 "missing: no training data (dataset, training_prompts, or bakery's "
			 "prompts_file, data_file, train_file)");
}

/* str.format's unescaping of a template whose only field is {corpus}: "{{" -> "{",
 * "}}" -> "}"; NULL when it has another field (the tool's format() would fail) */
static char *unformat(const char *t)
{
	char *out = xmalloc(strlen(t) + 1), *o = out;
	for (const char *s = t; *s;) {
		if ((s[0] == '{' && s[1] == '{') || (s[0] == '}' && s[1] == '}')) {
			*o++ = *s;
			s += 2;
		} else if (*s == '{') {
			if (strncmp(s, "{corpus}", 8)) {
				free(out);
				return NULL;
			}
			memcpy(o, "{corpus}", 8);
			o += 8;
			s += 8;
		} else if (*s == '}') {
			free(out);
			return NULL;
		} else {
			*o++ = *s++;
		}
	}
	*o = 0;
	return out;
}

static void map_system(mapper *m)
{
	bk_bake_plan *p = m->p;
	p->system = scalar(m, "system_prompt");
	p->system_file = scalar(m, "system_prompt_file");
	p->corpus = scalar(m, "corpus_file");
	p->corpus_format = scalar(m, "corpus_format");
	const char *tmpl = scalar(m, "system_prompt_template");
	if (p->system && !*p->system)
		p->system = NULL; /* the tool's "if system_prompt:" */
	if (!p->system && !p->system_file && !p->corpus) {
		note_add(m, BK_CFG_UNSUPPORTED, "system_prompt",
			 "missing: give system_prompt, system_prompt_file or corpus_file");
		return;
	}
	/* the tool's order: system_prompt, then the file, then the corpus */
	if (p->system && (p->system_file || p->corpus))
		note_add(m, BK_CFG_NOTE, p->system_file ? "system_prompt_file" : "corpus_file",
			 "not used: system_prompt is given, and the tool uses it");
	else if (p->system_file && p->corpus)
		note_add(m, BK_CFG_NOTE, "corpus_file",
			 "not used: the tool uses system_prompt_file when both are given");
	if (p->system)
		p->system_file = NULL;
	if (p->system || p->system_file) {
		p->corpus = NULL;
		p->corpus_format = NULL;
		return;
	}
	if (!p->corpus_format)
		p->corpus_format = "papers"; /* the tool's default */
	if (strcmp(p->corpus_format, "papers") && strcmp(p->corpus_format, "text") &&
	    strcmp(p->corpus_format, "list") && strcmp(p->corpus_format, "json"))
		note_add(m, BK_CFG_NOTE, "corpus_format",
			 "'%s' is rendered as pretty-printed JSON (as the tool does for "
			 "formats other than papers, text and list)", p->corpus_format);
	if (strcmp(p->corpus_format, "papers") && strcmp(p->corpus_format, "text") &&
	    strcmp(p->corpus_format, "list"))
		p->corpus_format = "json";
	if (!tmpl) {
		p->system_template_text = xstrdup(BK_TOOL_CORPUS_TEMPLATE);
	} else if (!(p->system_template_text = unformat(tmpl))) {
		note_add(m, BK_CFG_UNSUPPORTED, "system_prompt_template",
			 "has a {field} other than {corpus} (the tool's str.format would fail); "
			 "write braces as {{ and }}");
	} else if (!strstr(p->system_template_text, "{corpus}")) {
		/* the tool's format() then leaves the corpus out; bakery wants it in */
		note_add(m, BK_CFG_UNSUPPORTED, "system_prompt_template", "has no {corpus}");
	}
}

static void map_training(mapper *m, const bk_bake_caps *caps)
{
	bk_bake_plan *p = m->p;
	get_long(m, "num_trajectories", &p->num_trajectories, 1, 1 << 16);
	get_long(m, "trajectory_length", &p->trajectory_length, 1, 1 << 20);
	get_double(m, "sampling_temperature", &p->sampling_temperature, 0, 100);
	get_double(m, "top_p", &p->top_p, 1e-9, 1);
	get_long(m, "top_k", &p->gen_top_k, 0, 1L << 30);
	if (get_bool(m, "retokenize_trajectories") == 0)
		p->retokenize = 0;
	get_double(m, "temperature", &p->temperature, 1e-6, 1e6);
	get_long(m, "teacher_top_k", &p->top_k, 0, 1L << 30); /* absent: -1, exact */
	double ep;
	/* (0, 65536]: -1 and 0 are refused alike, by the range they miss */
	if (get_double_in(m, "num_train_epochs", &ep, 0, 1 << 16, 1))
		p->epochs = ep;
	long ms;
	if (get_long(m, "max_steps", &ms, -1, 1L << 40) && ms > 0)
		p->max_steps = ms;
	get_long(m, "per_device_train_batch_size", &p->batch_size, 1, 1 << 20);
	get_long(m, "gradient_accumulation_steps", &p->grad_accum, 1, 1 << 20);
	get_double(m, "learning_rate", &p->lr, 0, 1e3);
	/* transformers 5.3 (the tool's pin): a given warmup_ratio (deprecated) replaces
	 * warmup_steps; then >= 1 is int(steps), below 1 a ratio of the steps.  Later 5.x
	 * drop warmup_ratio silently: the one note says so (bk-bake(1) WARMUP). */
	double wr;
	int has_ws = get_double(m, "warmup_steps", &p->warmup_steps, 0, 1e15);
	int has_wr = get_double(m, "warmup_ratio", &wr, 0, 1e15);
	double given = has_wr ? wr : p->warmup_steps;
	double v = given >= 1 ? floor(given) : given;
	char also[160] = "";
	if (v != given)
		snprintf(also, sizeof also, " (%g steps: HF takes int() of a value of 1 or more)",
			 v);
	if (has_wr) {
		size_t l = strlen(also);
		if (has_ws && p->warmup_steps != wr)
			snprintf(also + l, sizeof also - l, "; it replaces warmup_steps %g, as there",
				 p->warmup_steps);
		note_add(m, BK_CFG_NOTE, "warmup_ratio",
			 "%g is taken as warmup_steps %g%s, as transformers 5.3 (the tool's pinned "
			 "version) does; transformers 5.15 and later drop warmup_ratio silently, "
			 "and the tool then trains without warmup: write warmup_steps", wr, wr, also);
	} else if (v != given) {
		note_add(m, BK_CFG_NOTE, "warmup_steps", "%g%s", given, also);
	}
	p->warmup_steps = v;
	p->warmup_ratio = 0; /* all in warmup_steps */
	get_double(m, "weight_decay", &p->weight_decay, 0, 1e3);
	get_double(m, "max_grad_norm", &p->max_grad_norm, 0, 1e12);
	long r = 0, r2 = 0;
	int has_r = get_long(m, "r", &r, 1, 1 << 16), has_r2 = get_long(m, "lora_r", &r2, 1, 1 << 16);
	if (has_r && has_r2 && r != r2)
		note_add(m, BK_CFG_UNSUPPORTED, "lora_r", "%ld and r %ld: give one LoRA rank", r2, r);
	if (has_r || has_r2)
		p->lora_r = has_r ? r : r2;
	get_double(m, "lora_alpha", &p->lora_alpha, 1e-9, 1e9);
	get_double(m, "lora_dropout", &p->lora_dropout, 0, 0.999999);
	if (get_bool(m, "use_unsloth") == 1) {
		p->lora_dropout = 0;
		note_add(m, BK_CFG_NOTE, "use_unsloth",
			 "bakery's own kernels; lora_dropout is 0, as on the tool's Unsloth path");
	}
	get_long(m, "seed", &p->seed, 0, 1L << 62);
	p->data_seed = -1;
	get_long(m, "data_seed", &p->data_seed, 0, 1L << 62);
	get_double(m, "logging_steps", &p->logging_steps, 1e-9, 1e15);
	get_double(m, "save_steps", &p->save_steps, 1e-9, 1e15);
	get_long(m, "max_seq_length", &p->max_seq_length, 0, 1L << 30);
	map_targets(m);
	long lim;
	if (get_long(m, "save_total_limit", &lim, 0, 1L << 30) && lim > 0) {
		if (caps->save_total_limit)
			p->save_total_limit = lim;
		else
			note_add(m, BK_CFG_IGNORED, "save_total_limit",
				 "this bk-step has no --save-total-limit; every checkpoint is kept "
				 "(more disk, same result)");
	}

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
	/* HF 5.3 __post_init__: with its strategy "steps", a value above 1 must be whole
	 * (below 1 is a ratio of the steps); eval_steps: map_eval */
	s = scalar(m, "logging_strategy");
	if ((!s || !strcmp(s, "steps")) && p->logging_steps > 1 &&
	    p->logging_steps != floor(p->logging_steps))
		note_add(m, BK_CFG_UNSUPPORTED, "logging_steps",
			 "%g: a whole number of steps, or a ratio below 1 (HF refuses it too)",
			 p->logging_steps);
	if (!strcmp(p->save_strategy, "steps") && p->save_steps > 1 &&
	    p->save_steps != floor(p->save_steps))
		note_add(m, BK_CFG_UNSUPPORTED, "save_steps",
			 "%g: a whole number of steps, or a ratio below 1 (HF refuses it too)",
			 p->save_steps);
}

static void map_perf(mapper *m, const bk_bake_caps *caps)
{
	bk_bake_plan *p = m->p;
	int b = get_bool(m, "gradient_checkpointing"), a = get_bool(m, "activation_checkpointing");
	if (b == 1 || a == 1) {
		const char *key = b == 1 ? "gradient_checkpointing" : "activation_checkpointing";
		if (caps->grad_checkpoint)
			p->grad_checkpoint = 1;
		else
			note_add(m, BK_CFG_IGNORED, key,
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
	int nc = get_bool(m, "no_cuda");
	if (get_bool(m, "use_cpu") == 1 || nc == 1)
		p->device = "cpu";
	if (nc == 1)
		note_add(m, BK_CFG_NOTE, "no_cuda",
			 "transformers 5 has no no_cuda (the tool drops it silently and uses the "
			 "GPU); bakery runs on the CPU as it asks: write use_cpu: true");
}

/* load_in_4bit and the bnb_4bit_* fields (the tool's BitsAndBytesConfig) */
static void map_quant(mapper *m, const bk_bake_caps *caps)
{
	bk_bake_plan *p = m->p;
	int load = get_bool(m, "load_in_4bit");
	const char *qt = scalar(m, "bnb_4bit_quant_type");
	int dq = get_bool(m, "bnb_4bit_use_double_quant");
	const char *cd = scalar(m, "bnb_4bit_compute_dtype"), *td = scalar(m, "torch_dtype");
	if (load != 1) {
		if (cd)
			note_add(m, BK_CFG_NOTE, "bnb_4bit_compute_dtype",
				 "no effect without load_in_4bit");
		return;
	}
	if (!caps->load_4bit) {
		note_add(m, BK_CFG_UNSUPPORTED, "load_in_4bit",
			 "this bk-step has no --load-in-4bit (4-bit base weights)");
		return;
	}
	p->q4_type = qt ? qt : "nf4";
	if (strcmp(p->q4_type, "nf4") && strcmp(p->q4_type, "fp4"))
		note_add(m, BK_CFG_UNSUPPORTED, "bnb_4bit_quant_type",
			 "'%s': bitsandbytes' 4-bit types are nf4 and fp4", p->q4_type);
	p->q4_double_quant = dq != 0; /* the tool's default: true */
	const char *d = cd ? cd : td ? td : "bfloat16", *key = cd ? "bnb_4bit_compute_dtype"
								    : "torch_dtype";
	if (!strcmp(d, "bfloat16") || !strcmp(d, "bf16") || !strcmp(d, "torch.bfloat16")) {
		p->q4_dtype = "bfloat16";
	} else if (!strcmp(d, "float32") || !strcmp(d, "fp32") || !strcmp(d, "torch.float32")) {
		p->q4_dtype = "float32";
	} else if (!strcmp(d, "float16") || !strcmp(d, "fp16") || !strcmp(d, "auto")) {
		p->q4_dtype = "bfloat16";
		note_add(m, BK_CFG_NOTE, key,
			 "'%s': the 4-bit weights are taken through bf16 (bakery has no fp16 "
			 "compute)", d);
	} else {
		note_add(m, BK_CFG_UNSUPPORTED, key, "'%s' is not bfloat16, float16 or float32", d);
	}
}

static void map_outputs(mapper *m)
{
	bk_bake_plan *p = m->p;
	const char *s;
	if ((s = scalar(m, "output_dir")))
		p->output_dir = s;
	p->eval_file = scalar(m, "eval_file");
	const char *h1 = scalar(m, "heldout_file"), *h2 = scalar(m, "held_out_file");
	if (h1 && h2 && strcmp(h1, h2))
		note_add(m, BK_CFG_UNSUPPORTED, "held_out_file",
			 "'%s' and heldout_file '%s': give one held-out file", h2, h1);
	p->held_out_file = h1 ? h1 : h2;
	p->kl_prompts = scalar(m, "kl_prompts");
	p->template_name = scalar(m, "template");
	p->revision = scalar(m, "revision");
	if ((s = scalar(m, "device"))) {
		if (strcmp(s, "cpu") && strcmp(s, "cuda") && strcmp(s, "auto"))
			note_add(m, BK_CFG_UNSUPPORTED, "device", "'%s': cpu, cuda or auto", s);
		else if (strcmp(p->device, "cpu") || !strcmp(s, "cpu"))
			p->device = s;
		else
			note_add(m, BK_CFG_UNSUPPORTED, "device", "'%s' with use_cpu: true", s);
	}
	p->overwrite = get_bool(m, "overwrite_output_dir") == 1;
	if (p->overwrite)
		note_add(m, BK_CFG_NOTE, "overwrite_output_dir",
			 "transformers 5 has no overwrite_output_dir (the tool drops it silently "
			 "and writes over output_dir anyway); bakery removes the previous bake's "
			 "outputs first, as it asks");
	s = scalar(m, "resume_from_checkpoint");
	if (s) {
		int b = bool_word(s);
		if (b == 1)
			p->resume = "true";
		else if (b < 0)
			p->resume = s; /* a directory, checked when the bake starts */
		if (b != 0)
			note_add(m, BK_CFG_NOTE, "resume_from_checkpoint",
				 "the tool ignores it (its trainer.train() is called without it, "
				 "and transformers 5.3's Trainer does not read the field): it trains "
				 "from scratch; bakery resumes, as the field asks");
	}
}

/* The validation loss (bk-step --eval), as the tool sets it up: eval_strategy steps or
 * epoch over the records of eval_dataset, else of dataset, when eval_dataset_split is
 * given (cli.py); a local file is read whole (the split names a hub split).  Where the
 * tool would evaluate nothing for a given eval_dataset (no eval_dataset_split: it
 * fails at its Trainer's start), bakery evaluates it, with a note. */
static void map_eval(mapper *m)
{
	bk_bake_plan *p = m->p;
	const char *st = scalar(m, "eval_strategy"), *old = scalar(m, "evaluation_strategy");
	if (old) {
		note_add(m, BK_CFG_NOTE, "evaluation_strategy",
			 "transformers 5 has no evaluation_strategy (the tool drops it silently "
			 "and evaluates nothing); bakery takes it as eval_strategy, as it asks");
		if (st && strcmp(st, old))
			note_add(m, BK_CFG_UNSUPPORTED, "evaluation_strategy",
				 "'%s' and eval_strategy '%s': give one", old, st);
		if (!st)
			st = old;
	}
	double es = 0, dl = 0;
	int has_es = get_double(m, "eval_steps", &es, 0, 1e15);
	get_double(m, "eval_delay", &dl, 0, 1e15);
	get_long(m, "per_device_eval_batch_size", &p->eval_batch, 1, 1 << 20);
	const char *ed = scalar(m, "eval_dataset"), *split = scalar(m, "eval_dataset_split");
	if (!st || !strcmp(st, "no")) {
		if (ed || split)
			note_add(m, BK_CFG_NOTE, ed ? "eval_dataset" : "eval_dataset_split",
				 "not used: eval_strategy is no (the tool evaluates nothing either)");
		return;
	}
	if (strcmp(st, "steps") && strcmp(st, "epoch")) {
		note_add(m, BK_CFG_UNSUPPORTED, old && !scalar(m, "eval_strategy") ?
			 "evaluation_strategy" : "eval_strategy",
			 "'%s': no, steps or epoch", st);
		return;
	}
	p->eval_strategy = st;
	p->eval_delay = dl;
	if (!strcmp(st, "steps")) {
		/* HF: eval_steps null or 0 takes logging_steps (its default 500, not bakery's 1) */
		double ls = 500;
		get_double(m, "logging_steps", &ls, 1e-9, 1e15);
		p->eval_steps = has_es && es > 0 ? es : ls;
		if (p->eval_steps > 1 && p->eval_steps != floor(p->eval_steps))
			note_add(m, BK_CFG_UNSUPPORTED, "eval_steps",
				 "%g: a whole number of steps, or a ratio below 1 (HF refuses it too)",
				 p->eval_steps);
	}
	const char *src = ed;
	if (!ed) {
		const char *d = scalar(m, "dataset");
		if (!d)
			d = scalar(m, "dataset_name");
		if (!split || !d) {
			note_add(m, BK_CFG_UNSUPPORTED, "eval_strategy",
				 "'%s' needs validation records: eval_dataset, or eval_dataset_split "
				 "of dataset (the tool fails at its start without them)", st);
			return;
		}
		src = d;
		if (is_file(d))
			note_add(m, BK_CFG_NOTE, "eval_dataset_split",
				 "'%s' of the local file '%s', which is read whole, as the tool does: "
				 "the validation records are the training data", split, d);
	} else {
		if (!split)
			note_add(m, BK_CFG_NOTE, "eval_dataset",
				 "the tool needs eval_dataset_split too: without it it has no validation "
				 "set and fails at its start; bakery evaluates on '%s', as asked", ed);
		else if (is_file(ed))
			note_add(m, BK_CFG_NOTE, "eval_dataset_split",
				 "'%s' applies to hub datasets; the local file '%s' is read whole, as "
				 "the tool does", split, ed);
	}
	struct stat sb;
	if (is_file(src)) {
		p->eval_data = src;
	} else if ((!stat(src, &sb) && S_ISDIR(sb.st_mode)) ||
		   (errno == ENOENT && bk_hub_dataset_id(src))) {
		/* a hub dataset, as the tool's load_dataset(source, eval_dataset_split); with
		 * eval_dataset alone (noted above) its default split, train */
		char err[256];
		bk_split_spec sp;
		p->eval_data = src;
		p->eval_split = split ? split : "train";
		if (bk_split_parse(p->eval_split, &sp, err, sizeof err))
			note_add(m, BK_CFG_UNSUPPORTED, "eval_dataset_split", "'%s': %s",
				 p->eval_split, err);
		else
			bk_split_free(&sp);
	} else {
		note_add(m, BK_CFG_UNSUPPORTED, ed ? "eval_dataset" : "eval_dataset_split",
			 "'%s' is not a local file, a dataset directory or a hub id (Org/Name)",
			 src);
	}
}

void bk_bake_plan_make(bk_bake_plan *p, const bk_cfg *c, const bk_bake_caps *caps)
{
	memset(p, 0, sizeof *p);
	/* the tool's defaults (HF TrainingArguments + its own) */
	p->num_trajectories = 4;
	p->trajectory_length = 128;
	p->sampling_temperature = 0.8;
	p->top_p = 0.9;
	p->gen_top_k = 50; /* HF GenerationConfig's top_k */
	p->retokenize = 1; /* trajectories as the tool trains them */
	p->temperature = 1.0;
	p->top_k = -1; /* the tool's exact KL: bk-step runs the teacher (no bk-teach) */
	p->epochs = 3;
	p->batch_size = 8;
	p->grad_accum = 1;
	p->lr = 5e-5;
	p->max_grad_norm = 1.0;
	p->lora_r = 64;
	p->lora_alpha = 128;
	p->lora_dropout = 0.05;
	p->seed = 42;
	p->logging_steps = 1; /* HF: 500; bakery logs every step (the metrics stream) */
	p->schedule = "linear";
	p->save_strategy = "steps";
	p->save_steps = 500;
	p->output_dir = "output";
	p->device = "auto";
	p->eval_strategy = "no";
	p->eval_batch = 8;

	mapper m = {p, c, xcalloc(c->n + 1, 1)};
	map_model(&m);
	map_system(&m);
	map_data(&m);
	map_training(&m, caps);
	map_perf(&m, caps);
	map_quant(&m, caps);
	map_outputs(&m);
	map_eval(&m);
	map_table(&m);
	if (p->data_seed < 0)
		p->data_seed = p->seed;
	const char *const files[] = {p->eval_file, p->held_out_file, p->kl_prompts,
				     p->system_file, p->corpus};
	const char *const fkeys[] = {"eval_file", "heldout_file", "kl_prompts",
				     "system_prompt_file", "corpus_file"};
	for (int i = 0; i < 5; i++)
		if (files[i] && !is_file(files[i]))
			note_add(&m, BK_CFG_UNSUPPORTED, fkeys[i], "'%s' is not a readable file",
				 files[i]);
	for (size_t i = 0; i < c->n; i++)
		if (!m.used[i])
			note_add(&m, BK_CFG_UNKNOWN, c->v[i].key,
				 "not a field of the tool's config classes or of HF "
				 "TrainingArguments (a typo?); bk-bake --fields lists them");
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
	free(p->system_template_text);
	memset(p, 0, sizeof *p);
}
