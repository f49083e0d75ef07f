/* bakeplan.h - the commands of a bk-bake run: each stage's argv (bk-tokenize, bk-lens,
 * bk-gen, bk-teach, bk-step, bk-eval) from the mapped config (config_yaml.h), the
 * step counts as HF computes them, and the plan printed as shell lines; the
 * checkpoint resume_from_checkpoint names, and the config's notes.  No processes
 * here: cmd/bk-bake.c runs the commands. */
#ifndef BK_BAKEPLAN_H
#define BK_BAKEPLAN_H

#include "common/diag.h"
#include "formats/config_yaml.h"

#include <stdint.h>
#include <sys/types.h>

/* one stage: its argv and, once started, its process */
typedef struct {
	BK_VEC(char *) a; /* argv, NULL-terminated when run */
	const char *name; /* bk-gen, ... */
	const char *out;  /* stdout to this file (NULL: the pipe) */
	const char *in;   /* stdin from this file (NULL: the pipe, or bk-bake's) */
	pid_t pid;
	int status;
} bk_bake_cmd;

/* argv[0] is bindir/tool when that is executable, else tool (found on PATH); bindir
 * may be NULL or "". */
void bk_bake_cmd_init(bk_bake_cmd *c, const char *bindir, const char *tool);
void bk_bake_cmd_free(bk_bake_cmd *c);

/* the commands of a bake and the files they pass on */
typedef struct {
	const char *bindir; /* where the stages are looked for first (set before building) */
	bk_bake_cmd tok, lens, gen, teach, step, eval;
	bk_bake_cmd evtok; /* the validation records (eval_strategy), when p->eval_data */
	int paired, has_eval;
	int gen_scores; /* bk-gen --teacher-top-k scores the trajectories: no bk-teach on
			 * sampled data (bk_bake_gen_scores) */
	char *tokens, *order, *teach_file, *metrics, *tmpl_file, *sys_file, *eval_json;
	char *eval_tokens; /* evtok's output, bk-step --eval */
	const char *resume; /* the checkpoint bk-step resumes from, or NULL */
	const char *base_name; /* bk-step --base-model-name: the hub id when the plan's model
				* is its cache snapshot, else NULL */
	/* the memory plan's choices (gpu/bakemem.c; 0: the stages' defaults): bk-gen's
	 * --max-batch and --max-prompt, bk-teach's --max-tokens, and the GPU stages one
	 * after another through gen_file and teach_file instead of one pipe */
	long gen_max_batch, gen_max_prompt, teach_max_tokens;
	int sequential;
	char *gen_file;
	/* the plan of steps (known after tokenizing; 0 before) */
	int64_t prompts, epochs_written, last_records, order_records, total, per_epoch;
} bk_bake_cmds;

/* 1 when bk-gen scores the trajectories it samples (bk-gen --teacher-top-k, set by
 * bk_bake_build): a top-k teacher (teacher_top_k >= 1) on the sampled ids
 * (retokenize_trajectories false).  Else bk-teach scores sampled data with a teacher
 * field: the full distribution (teacher_top_k 0) or retokenized trajectories, whose
 * ids were not all sampled (an end of turn after a cut one). */
int bk_bake_gen_scores(const bk_bake_plan *p);

/* The steps as HF counts them for n records (prompts, or pairs when b->paired): an
 * epoch is ceil(ceil(n / batch) / accumulation) steps, ceil(epochs x that) in all, or
 * max_steps; and the records of the epoch order stream (the last epoch cut). */
void bk_bake_plan_steps(bk_bake_cmds *b, const bk_bake_plan *p, int64_t n);
/* Builds every stage's argv (counts not yet planned print as STEPS, PROMPTS, ...). */
void bk_bake_build(bk_bake_cmds *b, const bk_bake_plan *p);
/* Frees the argv and builds them again (after bk_bake_plan_steps). */
void bk_bake_rebuild(bk_bake_cmds *b, const bk_bake_plan *p);
void bk_bake_cmds_free(bk_bake_cmds *b);
/* The plan on stdout: the files written and the commands as shell lines; without
 * paired_known, both the prompts-only and the paired variant. */
void bk_bake_print_plan(const bk_bake_cmds *b, const bk_bake_plan *p, int paired_known);

/* The checkpoint resume_from_checkpoint names: NULL without it, output_dir's last
 * checkpoint-N for "true" (then *owned holds it), else the directory, which must hold
 * trainer_state.json.  Dies with a one-line reason. */
const char *bk_bake_resolve_resume(const bk_bake_plan *p, char **owned);

/* The plan's notes on stderr, "PROG: CONFIG:LINE: KIND 'KEY': TEXT", in config line
 * order (overrides after). */
void bk_bake_print_notes(const bk_bake_plan *p, const bk_cfg *cfg, const char *config);

#endif
