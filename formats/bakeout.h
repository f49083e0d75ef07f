/* bakeout.h - output_dir as the reference tool (bakery-py) leaves it, for bk-bake:
 * results.json with the tool's keys and shapes (bakery's own figures under "bakery"),
 * a model card for final_model/, the metrics stream's final path after final/ is
 * renamed to final_model/, the last checkpoint-N for resume_from_checkpoint: true,
 * the training figures of the summary, computed from the trainer state; the run's
 * own files (metrics copy, token scan, tokenizer files, overwrite_output_dir) and the
 * summary it prints.  No model code and no processes here. */
#ifndef BK_BAKEOUT_H
#define BK_BAKEOUT_H

#include "formats/bakeplan.h"

#include <jansson.h>
#include <stdint.h>

/* Python's str.strip(): leading and trailing whitespace (ASCII, \x1c-\x1f and the
 * Unicode spaces) removed; a malloc'd copy. */
char *bk_bake_strip(const char *s);

/* Python's str.lower() for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic
 * letters (other code points kept), in place on UTF-8. */
void bk_bake_lower(char *s);

/* The tool's per-question response text: <think>...</think> removed, stripped,
 * lower-cased, at most 200 code points.  malloc'd. */
char *bk_bake_response_text(const char *answer);

/* The number of tokens the tool reports for the system prompt, HF's
 * len(tokenizer.encode(system_prompt)): the bare count plus the ids the model's
 * tokenizer adds around one sequence (bk_tok_added_ids: tokenizer.json's
 * post-processor; for tokenizer.model the BOS unless add_bos_token is false). */
int64_t bk_bake_prompt_tokens(const char *model_dir, int64_t sp_tokens);

/* results.json as the tool writes it, from bk-eval's JSON (NULL without evaluation):
 * {"prompt_tokens": N, "baseline_none", "baseline_discrete", "heldout_discrete",
 *  "baked_eval", "baked_heldout": {accuracy, correct, total, results: [{question,
 *  response, correct}]}} with the keys the tool would write, then "bakery": bk-eval's
 * output (KL, examples) and train (may be NULL).  Dies naming bkeval_path when its
 * shape is not bk-eval's.  Returns a new reference. */
json_t *bk_bake_results(const json_t *bkeval, const char *bkeval_path, int64_t prompt_tokens,
			int has_eval, int has_held_out, json_t *train);

/* Training figures from DIR/trainer_state.json (bk-step's): steps, the mean loss over
 * every step, records and tokens.  Dies when the file is missing or malformed. */
typedef struct {
	int64_t steps, records, tokens;
	double loss_sum, mean_loss, elapsed;
} bk_bake_train;
void bk_bake_train_read(const char *dir, bk_bake_train *t);

/* Rewrites the metrics stream at path with every "final" field equal to from set to
 * to (bk-step names output_dir/final; bk-bake renames it to final_model). */
void bk_bake_metrics_final(const char *path, const char *from, const char *to);

/* output_dir/checkpoint-N with the largest N, or NULL (malloc'd). */
char *bk_bake_last_checkpoint(const char *output_dir);

/* README.md of final_model/: YAML front matter (base_model, library_name: peft, tags)
 * and what was baked; text is the body after the title (may be NULL). */
void bk_bake_model_card(const char *dir, const char *base_model, const char *body);

/* Writes out: the records of the tokens stream, epochs times, each epoch in a fresh
 * seeded order (epoch-major, as HF's sampler); the last epoch keeps only its first
 * last_epoch_records (< 0: all).  Returns the number of records written. */
int64_t bk_bake_epoch_order(const char *tokens, const char *out, int64_t epochs,
			    int64_t last_epoch_records, uint64_t seed);

/* A resumed bake's metrics: path (the earlier run's metrics.bk, if any) is rewritten
 * atomically as its step records up to the step of checkpoint dir resume (its
 * trainer_state.json) followed by every record of part (the resumed bk-step's stream,
 * whose header it takes); part is removed.  So metrics.bk keeps the steps before the
 * resume, as HF's log_history does. */
void bk_bake_metrics_join(const char *path, const char *part, const char *resume);

/* Copies bk-step's metrics stream from fd into path byte for byte, drawing a progress
 * line (total steps, 0 = unknown) from its step records; closes fd. */
void bk_bake_metrics_copy(int fd, const char *path, int64_t total);

/* The record count of the tokens stream at path, and its provenance's 'paired' and
 * 'system_tokens' (-1 when absent). */
int64_t bk_bake_scan_tokens(const char *path, int *paired, int64_t *sys_tokens);

/* The last step record (loss, step; step 0 = none) and the checkpoints named in the
 * metrics stream at path. */
typedef struct {
	double loss;
	int64_t step;
	BK_VEC(char *) ckpts;
} bk_bake_logged;
void bk_bake_read_metrics(const char *path, bk_bake_logged *m);

/* HF's log_history in the trainer_state.json of each directory of dirs (bk-step's
 * checkpoints and final_model): the metrics records of steps up to the directory's
 * 'step', training ones as {epoch, grad_norm, learning_rate, loss, step} and
 * validation ones as {epoch, eval_loss, eval_runtime, eval_samples_per_second,
 * eval_steps_per_second, step}, in stream order; with global_step and epoch beside
 * them.  per_epoch > 0: epoch = step / per_epoch (a pipe's records carry no epoch
 * position); else the records' own.  Rewritten atomically; a directory without the
 * file is skipped. */
void bk_bake_log_history(const char *metrics, char *const *dirs, size_t n, int64_t per_epoch);

/* The summary on stdout: model, prompt, data, steps, the computed mean loss, times
 * (seconds), files, and the accuracies and KL of res (results.json). */
void bk_bake_summary(const bk_bake_plan *p, const bk_bake_cmds *b, const bk_bake_train *tr,
		     const bk_bake_logged *lg, json_t *res, double t_tok, double t_train,
		     double t_eval);

/* The model's tokenizer files copied into dst, as the tool's tokenizer.save_pretrained. */
void bk_bake_copy_tokenizer(const char *model, const char *dst);

/* overwrite_output_dir: removes an earlier bake's checkpoint-*, final_model, final and
 * its stream files and results.json from od, except keep (a checkpoint resumed from;
 * may be NULL). */
void bk_bake_clear_outputs(const char *od, const char *keep);

/* The body of final_model/README.md for this bake (malloc'd). */
char *bk_bake_model_card_text(const bk_bake_plan *p, const bk_bake_cmds *b,
			      const bk_bake_train *tr, int64_t prompt_tokens);

#endif
