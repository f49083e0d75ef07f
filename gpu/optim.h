/* optim.h - the optimizer side of training on fp32 host arrays: AdamW exactly as
 * torch.optim.AdamW, global-norm clipping as torch.nn.utils.clip_grad_norm_, the HF
 * transformers learning-rate schedules, gradient-accumulation scaling, LoRA init.
 * Not the checkpoint writer (it reads the state through the hooks below) and not
 * 8-bit Adam.
 *
 * One training step, in the HF Trainer's order:
 *   bk_adamw_zero_grad;  for each micro-batch: backward, summing into grad;
 *   bk_adamw_average_grad(n_micro);  norm = bk_adamw_clip_grad_norm(max_norm);
 *   bk_adamw_step(bk_sched_lr(kind, base_lr, o->step, warmup, total)).
 *
 * Invariants of bk_adamw: step = number of bk_adamw_step calls (torch's per-parameter
 * state "step", the same for every group); m, v are zero before the first step; m and v
 * are owned by the optimizer, param and grad by the caller. */
#ifndef BK_OPTIM_H
#define BK_OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
	char *name;   /* owned copy, e.g. "layers.3.q_proj.lora_A" */
	float *param; /* [n] caller's */
	float *grad;  /* [n] caller's */
	float *m;     /* [n] owned: exp_avg */
	float *v;     /* [n] owned: exp_avg_sq */
	size_t n;
} bk_adamw_group;

typedef struct {
	double beta1, beta2, eps, weight_decay;
	int64_t step; /* optimizer steps taken */
	bk_adamw_group *groups;
	int n_groups, cap;
} bk_adamw;

/* torch defaults: betas (0.9, 0.999), eps 1e-8; HF adamw_torch weight decay 0.0. */
void bk_adamw_init(bk_adamw *o, double beta1, double beta2, double eps, double weight_decay);
/* Register a parameter array; m and v are allocated zeroed.  Names must be unique. */
void bk_adamw_add(bk_adamw *o, const char *name, float *param /* [n] */,
		  float *grad /* [n] */, size_t n);
void bk_adamw_free(bk_adamw *o);

/* One AdamW update at learning rate lr, per element (float arithmetic, scalars in
 * double as torch computes them in Python):
 *   step += 1;  p *= 1 - lr*wd;  m += (1-b1)(g - m);  v = b2 v + (1-b2) g^2;
 *   p -= lr/(1 - b1^step) * m / (sqrt(v)/sqrt(1 - b2^step) + eps). */
void bk_adamw_step(bk_adamw *o, double lr);

void bk_adamw_zero_grad(bk_adamw *o);
void bk_adamw_scale_grad(bk_adamw *o, double s);
/* Gradient accumulation: grads of n_micro micro-batches are SUMMED into grad (backward
 * accumulates), then this multiplies by 1/n_micro: the average, which is what the HF
 * Trainer gets by dividing each micro-batch loss by the number of micro-batches of
 * that optimizer step (gradient_accumulation_steps, fewer for an epoch's last step). */
void bk_adamw_average_grad(bk_adamw *o, int n_micro);
/* sqrt(sum g^2) over all groups, accumulated in double. */
double bk_adamw_grad_norm(const bk_adamw *o);
/* clip_grad_norm_: total = grad norm; coef = max_norm / (total + 1e-6); if coef < 1
 * every grad is multiplied by coef.  Returns the pre-clip total.  A non-finite total
 * leaves the grads alone (the caller decides to skip the step). */
double bk_adamw_clip_grad_norm(bk_adamw *o, double max_norm);

/* State hooks for checkpoints: the state is o->step plus, per group, (name, m, v, n).
 * A restore sets o->step and copies m and v into the groups found by name. */
bk_adamw_group *bk_adamw_find(bk_adamw *o, const char *name); /* NULL if absent */

/* Learning-rate schedules as transformers.get_scheduler.  The lr of the optimizer
 * step with 0-based index `step` is base_lr * factor(step) (LambdaLR, stepped after
 * each optimizer step; so with warmup the first step has lr 0, as in HF). */
typedef enum {
	BK_SCHED_LINEAR,               /* get_linear_schedule_with_warmup */
	BK_SCHED_COSINE,               /* get_cosine_schedule_with_warmup, num_cycles 0.5 */
	BK_SCHED_CONSTANT,             /* get_constant_schedule (warmup ignored) */
	BK_SCHED_CONSTANT_WITH_WARMUP, /* get_constant_schedule_with_warmup */
} bk_sched_kind;

/* "linear", "cosine", "constant", "constant_with_warmup" -> 0; unknown -> -1. */
int bk_sched_parse(const char *name, bk_sched_kind *kind);
const char *bk_sched_name(bk_sched_kind kind);
/* HF get_warmup_steps: warmup_steps if > 0, else ceil(warmup_ratio * total). */
int64_t bk_warmup_steps(int64_t warmup_steps, double warmup_ratio, int64_t total);
double bk_sched_factor(bk_sched_kind kind, int64_t step, int64_t warmup, int64_t total);
double bk_sched_lr(bk_sched_kind kind, double base_lr, int64_t step, int64_t warmup,
		   int64_t total);

/* LoRA init (PEFT): A ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in)),
 * B = 0.  A's values are a pure function of (seed, layer, module name, index), from
 * the counter-based generator of common/rng.h. */
void bk_lora_init(float *a /* [r, in] */, float *b /* [out, r] */, int r, int in, int out,
		  uint64_t seed, int layer, const char *module);

#endif
