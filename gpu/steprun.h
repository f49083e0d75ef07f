/* steprun.h - the life cycle of one bk-step run: the checks made before anything is
 * trained, resume, the data plan (epochs over a file, one pass over a pipe), the
 * checkpoint schedule, signals, the metrics stream and the final save.
 * Not the step (gpu/train.h: forward, loss, backward, AdamW, checkpoint files) and not
 * the command line (cmd/bk-step.c parses and validates flags into bk_step_opts).
 *
 * Invariants of a run:
 *  1. Checks come first.  Before the first step the run has refused, with one line
 *     naming the flag, file or record: an --out that cannot hold checkpoints (not a
 *     directory, not writable) or that holds another run's checkpoints (unless
 *     --resume or --overwrite); a --resume whose settings differ from the flags (each
 *     difference named as "--lora-r 8 differs from the checkpoint's 16"), whose
 *     optimizer differs, or whose stream is of another kind (teacher field vs exact
 *     mode), whose data files do not have the checksums it recorded, or whose
 *     progress is not the one this run's plan reaches at its step (train.c checks
 *     each field, check_progress the plan); a damaged input file (stream.c verifies
 *     a regular file whole at open);
 *     sequences longer than the model's context; an --eval file with no response
 *     token (its eval_loss would be a meaningless 0).
 *  2. Nothing is saved unless a step was taken in this process: a refusal, or a
 *     signal before the first step, leaves --out as it was.
 *  3. A checkpoint directory is complete or absent: train.c writes DIR.tmp.PID and
 *     renames it; a save that fails removes its temporary and reports once (a die()
 *     inside a save is not followed by a second save attempt).
 *  4. A die() after steps were taken in this process (a truncated upstream, a bad later
 *     record) saves the steps done (dropping a partial accumulation) and names the
 *     checkpoint to resume from.
 *  5. Metrics are a view: a metrics reader that goes away stops the metrics stream
 *     (one warning), never the training; the exit status is then still 0.
 *  6. --save-total-limit N keeps the newest N checkpoint-* directories of this run
 *     (final/ is not counted), as HF's save_total_limit does.
 *  7. The exit status is 0 iff the run's result was written: final/ after the last
 *     step, or after a signal the checkpoint holding every step taken (nothing when
 *     the signal came before the first step).  A stream with no records to train on
 *     is an error.  A run whose
 *     every step was skipped (non-finite gradients) writes nothing and exits 1.
 *  8. Data parallel (mpirun -np N, common/dist.h): every rank reads the same STREAM
 *     file and plans the same epochs; a step is a window of N x G micro-batches of
 *     which rank r trains r, r+N, ...; gradients, counts, losses and stop requests
 *     are summed in rank order before clipping and AdamW, so all ranks hold the same
 *     adapter and N ranks with G equal one process with N x G within fp32 rounding of
 *     the sum order.  Rank 0 alone writes checkpoints, metrics and progress; a
 *     resume needs the same N (the setting 'ranks'); a die() on any rank aborts the
 *     job. */
#ifndef BK_STEPRUN_H
#define BK_STEPRUN_H

#include "gpu/optim.h"
#include "gpu/optim8.h"
#include "gpu/quant4.h"

typedef struct {
	const char *model, *out, *device, *schedule, *targets, *resume, *base_name, *optim;
	const char *input;       /* a STREAM file, or "-" */
	const char *system;      /* the system prompt to expect in the stream, or NULL */
	const char *eval;        /* --eval: a STREAM file of validation records, or NULL */
	long eval_steps, eval_batch, eval_delay; /* every N steps (0: none), per batch,
						  * not before step eval_delay */
	int eval_final;          /* evaluate after the last step too */
	bk_sched_kind sched;
	bk_optim_kind optim_kind;
	unsigned target_mask;
	int grad_checkpoint, overwrite;
	long grad_ckpt_every;    /* --grad-checkpoint-every K (>= 2): checkpoints in segments
				  * of K layers (gpu/model.c invariant 9); 0: every layer */
	long batch_size, grad_accum, epochs, max_steps, warmup_steps, lora_r, seed;
	long save_steps, logging_steps, vocab_chunk, save_total_limit;
	double lr, warmup_ratio, weight_decay, max_grad_norm, lora_alpha, lora_dropout,
		temperature, log_every;
	bk_q4_config q4;         /* --load-in-4bit ...: the base linears in 4 bits */
} bk_step_opts;

/* Runs the whole bake step; returns the exit status (invariant 7) or dies. */
int bk_step_run(const bk_step_opts *o);

#endif
