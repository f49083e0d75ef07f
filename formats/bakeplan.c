/* bakeplan.c - the commands of a bk-bake run (see bakeplan.h): each stage's argv from
 * the mapped config, HF's step counts, the plan as shell lines, the checkpoint to
 * resume from and the config notes.  Moved from cmd/bk-bake.c without change. */
#include "formats/bakeplan.h"
#include "formats/bakeout.h"
#include "common/diag.h"
#include "common/files.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- commands ---- */

void bk_bake_cmd_init(bk_bake_cmd *c, const char *bindir, const char *tool)
{
	memset(c, 0, sizeof *c);
	c->name = tool;
	char *p = bindir && *bindir ? xasprintf("%s/%s", bindir, tool) : NULL;
	if (p && access(p, X_OK) == 0) {
		bk_vec_push(&c->a, p);
	} else {
		free(p);
		bk_vec_push(&c->a, xstrdup(tool)); /* from PATH */
	}
}

static void arg(bk_bake_cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void arg(bk_bake_cmd *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s;
	if (vasprintf(&s, fmt, ap) < 0)
		die("out of memory");
	va_end(ap);
	bk_vec_push(&c->a, s);
}

static void arg2(bk_bake_cmd *c, const char *flag, const char *value)
{
	arg(c, "%s", flag);
	arg(c, "%s", value);
}

/* a flag and its number: "--lr" 2e-3 */
static void arg_long(bk_bake_cmd *c, const char *flag, long v)
{
	arg(c, "%s", flag);
	arg(c, "%ld", v);
}
static void arg_num(bk_bake_cmd *c, const char *flag, double v)
{
	arg(c, "%s", flag);
	arg(c, "%g", v);
}

void bk_bake_cmd_free(bk_bake_cmd *c)
{
	for (size_t i = 0; i < c->a.n; i++)
		free(c->a.v[i]);
	free(c->a.v);
}

static void print_word(FILE *f, const char *s)
{
	if (*s && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./=,:+-") ==
			  strlen(s)) {
		fputs(s, f);
		return;
	}
	fputc('\'', f);
	for (; *s; s++)
		if (*s == '\'')
			fputs("'\\''", f);
		else
			fputc(*s, f);
	fputc('\'', f);
}

/* one shell line for the commands of a pipe */
static void print_pipe(FILE *f, const bk_bake_cmd *v, int n, const char *last_out)
{
	for (int i = 0; i < n; i++) {
		if (i)
			fputs(" |\n    ", f);
		fputs(v[i].name, f);
		for (size_t k = 1; k < v[i].a.n; k++) {
			fputc(' ', f);
			print_word(f, v[i].a.v[k]);
		}
		if (v[i].in) {
			fputs(" <", f);
			print_word(f, v[i].in);
		}
	}
	if (last_out) {
		fputs(" >", f);
		print_word(f, last_out);
	}
	fputc('\n', f);
}

/* ---- the bake's commands ---- */

int bk_bake_gen_scores(const bk_bake_plan *p)
{
	return p->top_k >= 1 && !p->retokenize;
}

static void add_system(bk_bake_cmd *c, const bk_bake_plan *p, const bk_bake_cmds *b)
{
	if (p->template_name)
		arg2(c, "--template", p->template_name);
	if (p->system)
		arg2(c, "--system", p->system);
	if (p->system_file)
		arg2(c, "--system-file", b->sys_file);
	if (p->corpus) {
		arg2(c, "--corpus", p->corpus);
		arg2(c, "--corpus-format", p->corpus_format);
		arg2(c, "--system-template", b->tmpl_file);
	}
}

static void add_model(bk_bake_cmd *c, const bk_bake_plan *p)
{
	arg2(c, "--model", p->model);
	arg2(c, "--device", p->device);
	if (p->q4_type) { /* load_in_4bit: every stage on the quantised base, as the tool */
		arg(c, "--load-in-4bit");
		arg2(c, "--bnb-4bit-quant-type", p->q4_type);
		arg2(c, "--bnb-4bit-use-double-quant", p->q4_double_quant ? "1" : "0");
		arg2(c, "--bnb-4bit-compute-dtype", p->q4_dtype);
	}
}

static int64_t ceil_div(int64_t a, int64_t b)
{
	return (a + b - 1) / b;
}

/* The steps as HF counts them: an epoch is ceil(ceil(N / batch) / accumulation)
 * steps; num_train_epochs (maybe fractional) gives ceil(epochs x that), max_steps
 * wins.  For prompts-only data the order stream holds the epochs those steps need,
 * the last one cut to its steps' prompts; bk-step accumulates across an epoch's end
 * over a pipe, so its total is ceil(micro-batches / accumulation). */
void bk_bake_plan_steps(bk_bake_cmds *b, const bk_bake_plan *p, int64_t n)
{
	b->prompts = n;
	int64_t mb = ceil_div(n, p->batch_size);
	b->per_epoch = ceil_div(mb, p->grad_accum);
	int64_t hf = p->max_steps > 0 ? p->max_steps : (int64_t)ceil(p->epochs * (double)b->per_epoch - 1e-9);
	if (hf < 1)
		hf = 1;
	int64_t full = hf / b->per_epoch, rem = hf % b->per_epoch;
	b->epochs_written = full + (rem > 0);
	b->last_records = rem > 0 ? (rem * p->grad_accum * p->batch_size < n ? rem * p->grad_accum * p->batch_size : n) : -1;
	if (b->paired) {
		b->total = hf;
		return;
	}
	int64_t m = full * mb + (rem > 0 ? ceil_div(b->last_records, p->batch_size) : 0);
	b->order_records = full * n + (rem > 0 ? b->last_records : 0);
	b->total = ceil_div(m, p->grad_accum);
}

/* bk-step's options */
static void build_step(bk_bake_cmds *b, const bk_bake_plan *p)
{
	bk_bake_cmd *c = &b->step;
	bk_bake_cmd_init(c, b->bindir, "bk-step");
	add_model(c, p);
	if (b->base_name)
		arg2(c, "--base-model-name", b->base_name);
	arg2(c, "--out", p->output_dir);
	/* over a pipe, bk-lens's batches: B prompts' trajectories (empty ones dropped, as
	 * the tool drops them), never across an epoch's end */
	if (b->paired)
		arg_long(c, "--batch-size", p->batch_size);
	arg_long(c, "--grad-accum", p->grad_accum);
	int whole = p->max_steps <= 0 && p->epochs == floor(p->epochs);
	if (b->paired && whole) {
		arg_long(c, "--epochs", (long)p->epochs);
	} else {
		arg(c, "--max-steps");
		if (b->total > 0)
			arg(c, "%lld", (long long)b->total);
		else
			arg(c, "STEPS");
	}
	arg_num(c, "--lr", p->lr);
	arg2(c, "--schedule", p->schedule);
	if (p->warmup_steps >= 1) {
		arg_long(c, "--warmup-steps", (long)p->warmup_steps);
	} else if (p->warmup_steps > 0) {
		arg_num(c, "--warmup-ratio", p->warmup_steps);
	}
	arg_num(c, "--weight-decay", p->weight_decay);
	arg_num(c, "--max-grad-norm", p->max_grad_norm);
	arg_long(c, "--lora-r", p->lora_r);
	arg_num(c, "--lora-alpha", p->lora_alpha);
	arg_num(c, "--lora-dropout", p->lora_dropout);
	arg2(c, "--target-modules", p->target_modules);
	arg_num(c, "--temperature", p->temperature);
	arg_long(c, "--seed", p->seed);
	if (p->logging_steps >= 1 || b->total > 0)
		arg_long(c, "--logging-steps", bk_bake_steps(p->logging_steps, (long)b->total));
	else
		arg(c, "--logging-steps"), arg(c, "CEIL_%g_STEPS", p->logging_steps);
	if (!strcmp(p->save_strategy, "steps")) {
		arg(c, "--save-steps");
		if (p->save_steps >= 1 || b->total > 0)
			arg(c, "%ld", bk_bake_steps(p->save_steps, (long)b->total));
		else
			arg(c, "CEIL_%g_STEPS", p->save_steps);
	} else if (!strcmp(p->save_strategy, "epoch") && !b->paired) {
		/* a pipe has no epoch ends: every epoch's steps */
		arg(c, "--save-steps");
		if (b->per_epoch > 0)
			arg(c, "%lld", (long long)b->per_epoch);
		else
			arg(c, "STEPS_PER_EPOCH");
	}
	if (p->eval_data) {
		/* HF's points: steps: every eval_steps (a ratio below 1); epoch: every
		 * epoch's end, the last partial one included (--eval-final); eval_delay in
		 * steps, or in epochs with epoch */
		arg2(c, "--eval", b->eval_tokens);
		int epoch = !strcmp(p->eval_strategy, "epoch");
		double es = epoch ? (double)b->per_epoch : p->eval_steps;
		arg(c, "--eval-steps");
		if (epoch && b->per_epoch <= 0)
			arg(c, "STEPS_PER_EPOCH");
		else if (es >= 1 || b->total > 0)
			arg(c, "%ld", bk_bake_steps(es, (long)b->total));
		else
			arg(c, "CEIL_%g_STEPS", es);
		if (epoch)
			arg(c, "--eval-final");
		arg_long(c, "--eval-batch-size", p->eval_batch);
		double dl = epoch ? p->eval_delay * (double)b->per_epoch : p->eval_delay;
		if (p->eval_delay > 0) {
			arg(c, "--eval-delay");
			if (epoch && b->per_epoch <= 0)
				arg(c, "CEIL_%g_EPOCHS", p->eval_delay);
			else
				arg(c, "%ld", (long)ceil(dl - 1e-9));
		}
	}
	if (p->save_total_limit > 0)
		arg_long(c, "--save-total-limit", p->save_total_limit);
	if (p->grad_checkpoint)
		arg(c, "--grad-checkpoint");
	if (p->grad_checkpoint > 1) /* in segments (the memory plan's choice) */
		arg_long(c, "--grad-checkpoint-every", p->grad_checkpoint);
	if (p->optim_8bit)
		arg2(c, "--optim", "adamw8bit");
	if (b->resume)
		arg2(c, "--resume", b->resume);
	else
		arg(c, "--overwrite"); /* the tool writes into an output_dir that holds a run */
	if (b->paired)
		arg(c, "%s", p->top_k < 0 ? b->tokens : b->teach_file);
}

void bk_bake_build(bk_bake_cmds *b, const bk_bake_plan *p)
{
	const char *od = p->output_dir;
	b->tokens = bk_path_join(od, "tokens.bk");
	b->order = bk_path_join(od, "order.bk");
	b->teach_file = bk_path_join(od, "teach.bk");
	b->metrics = bk_path_join(od, "metrics.bk");
	b->tmpl_file = p->corpus ? bk_path_join(od, "system_template.txt") : NULL;
	b->sys_file = p->system_file ? bk_path_join(od, "system_prompt.txt") : NULL;
	b->eval_json = bk_path_join(od, "logs/bk-eval.json");
	b->eval_tokens = p->eval_data ? bk_path_join(od, "eval_tokens.bk") : NULL;
	b->gen_file = bk_path_join(od, "gen.bk");

	bk_bake_cmd *c = &b->tok;
	bk_bake_cmd_init(c, b->bindir, "bk-tokenize");
	arg2(c, "--model", p->model);
	add_system(c, p, b);
	if (p->max_seq_length) {
		arg_long(c, "--max-seq-length", p->max_seq_length);
	}
	for (int i = 0; i < p->prompts.n; i++)
		arg2(c, "--prompt", p->prompts.v[i]);
	arg2(c, "-o", b->tokens);
	for (int i = 0; i < p->data.n; i++)
		arg(c, "%s", p->data.v[i]);
	if (p->hub_data) {
		arg2(c, "--split", p->hub_split);
		arg(c, "%s", p->hub_data);
	}

	/* the validation records: tokenized as the training data */
	c = &b->evtok;
	bk_bake_cmd_init(c, b->bindir, "bk-tokenize"); /* run first: its log is replaced */
	if (p->eval_data) {
		arg2(c, "--model", p->model);
		add_system(c, p, b);
		if (p->max_seq_length)
			arg_long(c, "--max-seq-length", p->max_seq_length);
		arg2(c, "-o", b->eval_tokens);
		if (p->eval_split)
			arg2(c, "--split", p->eval_split);
		arg(c, "%s", p->eval_data);
	}

	/* prompts-only: B prompts x T trajectories a micro-batch, as the tool; the order
	 * stream is already shuffled per epoch, bk-lens only cuts it into batches that
	 * do not cross an epoch's end (one window per epoch) */
	c = &b->lens;
	bk_bake_cmd_init(c, b->bindir, "bk-lens");
	arg2(c, "--max-tokens", "0");
	arg_long(c, "--max-batch", p->batch_size);
	if (b->prompts > 0)
		arg_long(c, "--window", (long)b->prompts);
	else
		arg2(c, "--window", "PROMPTS");
	arg(c, "--no-shuffle");
	arg(c, "-q");
	arg(c, "%s", b->order);

	c = &b->gen;
	bk_bake_cmd_init(c, b->bindir, "bk-gen");
	add_model(c, p);
	arg_long(c, "--num-trajectories", p->num_trajectories);
	arg_num(c, "--temperature", p->sampling_temperature);
	arg_long(c, "--top-k", p->gen_top_k);
	arg_num(c, "--top-p", p->top_p);
	arg_long(c, "--max-new-tokens", p->trajectory_length);
	arg_long(c, "--seed", p->seed);
	if (p->retokenize)
		arg(c, "--retokenize");
	b->gen_scores = bk_bake_gen_scores(p);
	if (b->gen_scores) { /* bk-gen scores what it samples: no bk-teach on the pipe */
		arg_long(c, "--teacher-top-k", p->top_k);
		arg_num(c, "--teacher-temperature", p->temperature);
	}
	if (b->gen_max_batch > 0)
		arg_long(c, "--max-batch", b->gen_max_batch);
	if (b->gen_max_prompt > 0)
		arg_long(c, "--max-prompt", b->gen_max_prompt);

	c = &b->teach;
	bk_bake_cmd_init(c, b->bindir, "bk-teach");
	add_model(c, p);
	arg_long(c, "--top-k", p->top_k);
	arg_num(c, "--temperature", p->temperature);
	if (b->teach_max_tokens > 0)
		arg_long(c, "--max-tokens", b->teach_max_tokens);
	if (b->paired) {
		arg(c, "%s", b->tokens);
		arg2(c, "-o", b->teach_file);
	}
	build_step(b, p);

	b->has_eval = p->eval_file || p->held_out_file || p->kl_prompts;
	c = &b->eval;
	bk_bake_cmd_init(c, b->bindir, "bk-eval");
	add_model(c, p);
	char *ad = bk_path_join(od, "final_model");
	arg2(c, "--adapter", ad);
	free(ad);
	add_system(c, p, b);
	if (p->eval_file)
		arg2(c, "--eval", p->eval_file);
	if (p->held_out_file)
		arg2(c, "--held-out", p->held_out_file);
	if (p->kl_prompts)
		arg2(c, "--kl-prompts", p->kl_prompts);
	arg_num(c, "--temperature", p->temperature);
	arg2(c, "--show", "1000000"); /* every answer: the tool's per-question results */
	arg2(c, "-o", b->eval_json);
}

void bk_bake_cmds_free(bk_bake_cmds *b)
{
	bk_bake_cmd *all[] = {&b->tok, &b->lens, &b->gen, &b->teach, &b->step, &b->eval,
			      &b->evtok};
	for (int i = 0; i < 7; i++)
		bk_bake_cmd_free(all[i]);
	free(b->tokens), free(b->order), free(b->teach_file), free(b->metrics);
	free(b->tmpl_file), free(b->sys_file), free(b->eval_json), free(b->eval_tokens), free(b->gen_file);
}

void bk_bake_rebuild(bk_bake_cmds *b, const bk_bake_plan *p)
{
	bk_bake_cmd *all[] = {&b->tok, &b->lens, &b->gen, &b->teach, &b->step, &b->eval,
			      &b->evtok};
	for (int i = 0; i < 7; i++)
		bk_bake_cmd_free(all[i]);
	free(b->tokens), free(b->order), free(b->teach_file), free(b->metrics);
	free(b->tmpl_file), free(b->sys_file), free(b->eval_json), free(b->eval_tokens), free(b->gen_file);
	bk_bake_build(b, p);
}

void bk_bake_print_plan(const bk_bake_cmds *b, const bk_bake_plan *p, int paired_known)
{
	if (b->sys_file)
		printf("# 0. the system prompt: %s stripped at both ends into %s\n", p->system_file,
		       b->sys_file);
	if (b->tmpl_file)
		printf("# 0. the corpus template%s into %s\n",
		       p->system_template_text && strcmp(p->system_template_text, BK_TOOL_CORPUS_TEMPLATE)
			       ? ""
			       : " (the tool's default wrapper)",
		       b->tmpl_file);
	printf("# 1. tokenize (the prompt count sets the steps)\n");
	print_pipe(stdout, &b->tok, 1, NULL);
	if (p->eval_data) {
		printf("#    the validation records (eval_strategy %s; pairs needed)\n",
		       p->eval_strategy);
		print_pipe(stdout, &b->evtok, 1, NULL);
	}
	if (!paired_known || !b->paired) {
		printf("# 2. prompts-only data: the epochs' prompt order, then one pipe\n");
		if (b->prompts > 0)
			printf("#    %s: %lld epoch%s of %lld prompts, each shuffled with seed %ld%s; "
			       "%lld steps\n", b->order, (long long)b->epochs_written,
			       b->epochs_written == 1 ? "" : "s", (long long)b->prompts, p->data_seed,
			       b->last_records >= 0 ? " (the last one cut)" : "", (long long)b->total);
		else
			printf("#    %s: ceil(epochs) epochs of the prompts, each shuffled with seed "
			       "%ld\n", b->order, p->data_seed);
		int no_teach = p->top_k < 0 || b->gen_scores;
		if (b->gen_scores)
			printf("#    bk-gen scores its trajectories (teacher_top_k %ld): no bk-teach\n",
			       p->top_k);
		else if (p->top_k >= 0)
			printf("#    bk-teach scores the trajectories (%s)\n", p->top_k == 0
			       ? "teacher_top_k 0: the full distribution"
			       : "retokenize_trajectories: ids that were not all sampled; false lets "
				 "bk-gen score them");
		if (b->sequential) {
			bk_bake_cmd v[] = {b->lens, b->gen}, t = b->teach, s = b->step;
			printf("#    the GPU stages one after another (the memory plan), through files\n");
			print_pipe(stdout, v, 2, b->gen_file);
			if (no_teach) { /* exact: bk-step runs the teacher; or bk-gen scored */
				s.in = b->gen_file;
			} else {
				t.in = b->gen_file;
				print_pipe(stdout, &t, 1, b->teach_file);
				s.in = b->teach_file;
			}
			print_pipe(stdout, &s, 1, b->metrics);
		} else {
			bk_bake_cmd v[] = {b->lens, b->gen, b->teach, b->step};
			if (no_teach) /* exact: bk-step runs the teacher; or bk-gen scored */
				v[2] = b->step;
			print_pipe(stdout, v, no_teach ? 3 : 4, b->metrics);
		}
		if (!paired_known)
			printf("#    STEPS = max_steps, or ceil(epochs x ceil(ceil(prompts / batch) / "
			       "accumulation))\n");
	}
	if (!paired_known || b->paired) {
		printf("# 2. paired data (responses given): teacher file, then epochs over it\n");
		bk_bake_cmd t = b->teach, s = b->step;
		if (p->top_k < 0) {
			printf("#    (exact KL: bk-step runs the teacher over %s)\n", b->tokens);
			if (paired_known)
				print_pipe(stdout, &s, 1, b->metrics);
			else
				printf("bk-step ... --epochs N %s >%s\n", b->tokens, b->metrics);
		} else if (!paired_known) {
			printf("bk-teach ... %s -o %s\nbk-step ... --epochs N %s >%s\n", b->tokens,
			       b->teach_file, b->teach_file, b->metrics);
		} else {
			print_pipe(stdout, &t, 1, NULL);
			print_pipe(stdout, &s, 1, b->metrics);
		}
	}
	if (b->has_eval) {
		printf("# 3. evaluate, then results.json in the tool's shape\n");
		print_pipe(stdout, &b->eval, 1, NULL);
	}
}

/* the checkpoint to resume from: a directory, or "true" for output_dir's last */
const char *bk_bake_resolve_resume(const bk_bake_plan *p, char **owned)
{
	*owned = NULL;
	if (!p->resume)
		return NULL;
	if (!strcmp(p->resume, "true")) {
		*owned = bk_bake_last_checkpoint(p->output_dir);
		if (!*owned)
			die("resume_from_checkpoint: true, but %s holds no checkpoint-N (HF: no valid "
			    "checkpoint found in the output directory)", p->output_dir);
		return *owned;
	}
	char *ts = bk_path_join(p->resume, "trainer_state.json");
	int ok = bk_file_exists(ts);
	free(ts);
	if (!ok)
		die("resume_from_checkpoint: %s is not a checkpoint directory (no "
		    "trainer_state.json)", p->resume);
	return p->resume;
}

/* the notes of the plan on stderr, in config line order (overrides after), stable */
void bk_bake_print_notes(const bk_bake_plan *p, const bk_cfg *cfg, const char *config)
{
	size_t *ord = xmalloc((p->n_notes + 1) * sizeof *ord);
	for (size_t i = 0; i < p->n_notes; i++) {
		size_t j = i;
		int li = p->notes[i].line ? p->notes[i].line : INT_MAX;
		while (j > 0 && (p->notes[ord[j - 1]].line ? p->notes[ord[j - 1]].line : INT_MAX) > li) {
			ord[j] = ord[j - 1];
			j--;
		}
		ord[j] = i;
	}
	for (size_t i = 0; i < p->n_notes; i++) {
		const bk_cfg_note *nt = &p->notes[ord[i]];
		char at[64] = "";
		if (nt->line)
			snprintf(at, sizeof at, ":%d", nt->line);
		else if (bk_cfg_get(cfg, nt->key))
			snprintf(at, sizeof at, " (override)");
		fprintf(stderr, "%s: %s%s: %s '%s': %s\n", bk_prog, config, at,
			bk_cfg_kind_name(nt->kind), nt->key, nt->text);
	}
	free(ord);
}
