/* train.h - one LoRA training step of prompt baking and the trainer's checkpoint
 * state: packs a micro-batch of student sequences (s_prompt + resp), gathers the
 * response rows, takes the KL loss against the record's teacher distribution (top-k
 * or full) or against the frozen teacher run here (exact mode, t_prompt + resp,
 * adapter off), scatters dLoss/dhidden back and runs the backward into LoRA gradients;
 * then averages, clips and takes an AdamW step (fp32 or 8-bit moments) at the
 * scheduled learning rate, all through the op table: per step only the gradient norm
 * comes back to the host.
 * Not the data plan (cmd/bk-step.c reads streams and forms micro-batches) and not the
 * math of its parts (gpu/model.h, gpu/host/loss.h, gpu/optim.h, gpu/optim8.h).
 *
 * Invariants of a bk_trainer:
 *  1. step = optimizer steps taken = the schedule position: the lr of the next step is
 *     bk_sched_lr(kind, lr, step, warmup, total).  opt.step (AdamW bias correction)
 *     counts the updates actually applied (a step with a non-finite gradient norm is
 *     skipped: it advances step, not opt.step).
 *  2. n_micro = micro-batches whose gradients are summed in grads since the last step;
 *     bk_trainer_step divides by it (HF: loss / gradient_accumulation_steps, fewer
 *     for the last step of an epoch).  Between steps n_micro = 0 and grads = 0.
 *  3. The optimizer state lives on the device next to lora->flat: fp32 m and v laid
 *     out like lora->flat (adamw), or per-value codes laid out like lora->flat plus
 *     one absmax per block of each LoRA tensor (adamw8bit: blocks never straddle two
 *     tensors; tensor i's blocks start at opt.tensors[i].block0).
 *  4. Everything random is a pure function of (seed, step, micro index): the LoRA init
 *     (seed) and the dropout mask key of micro-batch i of step s (i counted over all
 *     data-parallel ranks: micro_base, micro_stride); so a run resumed
 *     from a checkpoint at a step boundary repeats the uninterrupted run bit for bit.
 *  5. The gradient norm is summed in a fixed order (ops->grad_sumsq), so the clipping
 *     coefficient does not depend on thread scheduling. */
#ifndef BK_TRAIN_H
#define BK_TRAIN_H

#include <stdint.h>

#include "formats/hfconfig.h"
#include "formats/teacher.h"
#include "gpu/model.h"
#include "gpu/optim.h"
#include "gpu/optim8.h"

typedef struct {
	int r;              /* LoRA rank */
	float alpha;        /* lora_alpha (scale alpha / r) */
	float dropout;      /* lora_dropout */
	unsigned targets;   /* enum bk_lora_module bits */
	double lr, weight_decay, max_grad_norm; /* max_grad_norm <= 0: no clipping */
	bk_sched_kind sched;
	int64_t warmup;     /* warmup steps (resolved by the caller, bk_warmup_steps) */
	int64_t total;      /* schedule length in optimizer steps; 0 = unknown */
	float temperature;  /* KL temperature */
	uint64_t seed;      /* LoRA init and dropout */
	int vocab_chunk;    /* LM-head chunk of the loss (0: 4096) */
	bk_optim_kind optim; /* adamw (fp32 moments) or adamw8bit */
	int optim_block;    /* adamw8bit block: 256 (0 = 256) or 2048 */
	int grad_checkpoint; /* recompute each layer's activations in the backward; K >= 2:
			      * keep every K-th layer's input (gpu/model.c invariant 9) */
} bk_train_opts;

/* One record of a micro-batch: ids point into the caller's arrays. */
typedef struct {
	const int32_t *s_prompt; /* [s_len] student prompt */
	const int32_t *t_prompt; /* [t_len] teacher prompt (read in exact mode only) */
	const int32_t *resp;     /* [n_resp] response ids (incl. end of turn) */
	int s_len, t_len, n_resp;
	const bk_teacher *teacher; /* its 'teacher' field, or NULL: exact mode */
} bk_train_sample;

/* What one micro-batch did. */
typedef struct {
	double loss;       /* batch loss (mean over non-empty samples of the per-token mean) */
	int samples;       /* samples with a response */
	int64_t tokens;    /* student tokens packed (prompt + response) */
	int64_t teacher_tokens; /* teacher tokens run here (exact mode), else 0 */
	int64_t rows;      /* response rows in the loss */
} bk_train_micro_info;

typedef struct bk_trainer {
	const bk_model *m;
	bk_train_opts o;
	bk_lora *lora, *grads; /* device */
	struct {               /* the optimizer state (invariant 3), device buffers */
		int64_t step;      /* AdamW updates applied (bias correction; invariant 1) */
		float *m, *v;      /* adamw: [n_flat] */
		uint8_t *qm, *qv;  /* adamw8bit: [n_flat] codes */
		float *am, *av;    /* adamw8bit: [n_blocks] absmax of m, v */
		size_t n_blocks;
		struct { size_t off, n, block0; } *tensors; /* [n_tensors] LoRA tensors in flat */
		int n_tensors;
	} opt;
	bk_acts *acts;
	int acts_T;            /* tokens the acts (and hid/dhid) hold */
	float *hid, *dhid;     /* [acts_T,H] device: final hidden states, their gradient; one
			        * buffer, the acts' (bk_acts_hidden), not allocated here */
	int64_t step;          /* invariant 1 */
	int n_micro;           /* invariant 2 */
	/* data-parallel ranks (gpu/steprun.c): this rank's micro-batch k of a step is
	 * micro-batch micro_base + micro_stride * k of the whole step, and that index keys
	 * its dropout mask (invariant 4), so N ranks draw the masks one process would
	 * (defaults 0 and 1) */
	int micro_base, micro_stride;
	/* host scratch, grown as needed */
	int32_t *ids, *pos, *cu, *sample_of, *rows;
	size_t cap_T, cap_S, cap_N;
	/* device scratch of the loss (ops.h), grown as needed: cap_rows_d rows, cap_tk_d
	 * teacher numbers; the hidden rows never leave the device */
	int32_t *rows_d, *tk_ids_d;          /* [N] [N,K] */
	float *hrows_d, *trows_d, *drows_d;  /* [N,H] student, teacher, dLoss/d rows; with
					      * rows_in_acts in the acts (bk_acts_spare) */
	int rows_in_acts;                    /* 3 H <= I: [acts_T,H] each fit the spare */
	float *tk_logp_d, *tk_rest_d;        /* [N,K|V] [N] */
	size_t cap_rows_d, cap_tk_d;
} bk_trainer;

/* The LoRA is created with o->r/alpha/dropout/targets and PEFT-initialised from
 * o->seed (bk_lora_init_peft); grads zero; AdamW torch defaults with o->weight_decay. */
bk_trainer *bk_trainer_create(const bk_model *m, const bk_train_opts *o);
void bk_trainer_free(bk_trainer *t);
/* Size the activations for batches of up to max_T tokens (student or teacher);
 * a micro-batch needing more grows them. */
void bk_trainer_reserve(bk_trainer *t, int max_T);

/* Forward + loss + backward of one micro-batch; the LoRA gradients are ADDED into
 * t->grads and n_micro is incremented.  Samples with an empty response are dropped;
 * none left gives loss 0 and no gradient.  All samples must be of one kind (all
 * top-k with one K, all full, or all exact); a teacher field must have n = n_resp,
 * v = V and the trainer's temperature.  Dies naming the sample index otherwise. */
void bk_trainer_micro(bk_trainer *t, const bk_train_sample *s, int n,
		      bk_train_micro_info *info);
/* The same loss without training (a validation loss): the adapter as it is, no
 * dropout, no gradient; grads and n_micro are untouched.  info->loss is the batch
 * loss as above (0 when no sample has a response). */
void bk_trainer_eval(bk_trainer *t, const bk_train_sample *s, int n,
		     bk_train_micro_info *info);
/* Ends an optimizer step: average over n_micro, clip at max_grad_norm, AdamW at the
 * scheduled lr, zero the gradients.  Returns the gradient norm before clipping;
 * *lr gets the lr used.  n_micro must be > 0. */
double bk_trainer_step(bk_trainer *t, double *lr);
/* Forget the partial accumulation (SIGINT between steps): grads = 0, n_micro = 0. */
void bk_trainer_drop(bk_trainer *t);
/* The lr the next step will use. */
double bk_trainer_lr(const bk_trainer *t);

/* ---- checkpoints ----
 * A checkpoint directory holds adapter_model.safetensors + adapter_config.json (PEFT,
 * base_model_name_or_path = base_model exactly), trainer_state.safetensors and
 * trainer_state.json: {format: "bakery-trainer-state", version: 2, step, adam_step,
 * n_flat, optim, optim_block, progress: {...}, settings: {...}, checksums: {FILE:
 * "xxh3-64:HEX"} of adapter_model.safetensors, adapter_config.json and
 * trainer_state.safetensors as written (version 1 had no checksums).  The moments, laid
 * out like the LoRA's flat buffer: adamw: exp_avg, exp_avg_sq [n_flat] F32; adamw8bit:
 * exp_avg.code, exp_avg_sq.code [n_flat] (the uint8 codes, stored as F16 integers
 * 0..255, exact: safetensors.h writes no U8) and exp_avg.absmax, exp_avg_sq.absmax
 * [n_blocks] F32 (each tensor's blocks in flat order, invariant 3), so a resume
 * restores the 8-bit state bit for bit.  A state without
 * 'optim' is adamw.  It is written into DIR.tmp.PID and renamed to DIR (an existing
 * DIR is replaced), so DIR is always complete. */

/* The caller's position in its data, saved and restored verbatim. */
typedef struct {
	int64_t epoch;            /* epoch in progress (0-based) */
	int64_t micro_in_epoch;   /* micro-batches of that epoch already trained */
	int64_t records_in_epoch; /* records of that epoch already trained */
	int64_t records;          /* records trained over the whole run */
	int64_t tokens;           /* student tokens trained over the whole run */
	double loss_sum;          /* sum of step losses over the whole run */
	double elapsed;           /* training seconds over the whole run */
	uint64_t order_seed;      /* seed of the per-epoch micro-batch order */
	/* HF's log_history: a JSON array of {epoch, grad_norm, learning_rate, loss, step}
	 * per logged step (owned; NULL: none yet).  Saved in trainer_state.json and
	 * restored by bk_trainer_resume, so a resumed run keeps the steps before it. */
	struct json_t *log_history;
} bk_train_progress;

/* settings: n_settings (key, value) string pairs that must be equal on resume (the
 * flags that change the result); compared by bk_trainer_resume. */
typedef struct {
	const char *key;
	char *value;
} bk_train_setting;

void bk_trainer_save(const bk_trainer *t, const bk_config *cfg, const char *base_model,
		     const bk_train_progress *p, const bk_train_setting *settings,
		     int n_settings, const char *dir);
/* Loads a checkpoint into t (adapter, optimizer moments, step) and p; dies naming
 * the directory and the setting when a setting it holds differs from the given one
 * (one it does not hold, from an older bakery, is not compared), or when
 * its optimizer (optim, optim_block) is not the trainer's; dies naming the file when a
 * data file's checksum is not the recorded one (version 1: a warning, not verified),
 * and naming the key when a progress field is out of range (negative counts, a loss
 * sum or elapsed time below 0, records_in_epoch above records, step past t's total,
 * a log_history entry past step).  The caller checks p against its plan. */
void bk_trainer_resume(bk_trainer *t, const bk_config *cfg, const char *dir,
		       bk_train_progress *p, const bk_train_setting *settings,
		       int n_settings);

#endif
