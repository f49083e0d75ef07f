/* bk-step - trains the LoRA adapter on a record stream.  This file is the command
 * line: flags into bk_step_opts; the run's life cycle (checks, resume, epochs,
 * checkpoints, signals, metrics) is gpu/steprun.c's, the step gpu/train.c's. */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "formats/inputs.h"
#include "formats/peft.h"
#include "gpu/steprun.h"
#include "gpu/wshare.h"
#include "formats/hub.h"

#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
	"usage: bk-step --model DIR --out DIR [--device D] [--batch-size N] [--grad-accum N]\n"
	"               [--epochs N] [--max-steps N] [--lr X] [--schedule NAME]\n"
	"               [--warmup-ratio X | --warmup-steps N] [--weight-decay X]\n"
	"               [--max-grad-norm X] [--lora-r N] [--lora-alpha X] [--lora-dropout X]\n"
	"               [--target-modules LIST] [--temperature T] [--seed N]\n"
	"               [--save-steps N] [--save-total-limit N] [--logging-steps N]\n"
	"               [--log-every SECONDS] [--resume DIR] [--overwrite]\n"
	"               [--base-model-name NAME] [--vocab-chunk N] [--optim NAME]\n"
	"               [--grad-checkpoint] [--grad-checkpoint-every K]\n"
	"               [--system TEXT | --system-file FILE]\n"
	"               [--eval FILE [--eval-steps N] [--eval-final] [--eval-batch-size N]\n"
	"               [--eval-delay N]]\n"
	"               [--load-in-4bit [--bnb-4bit-quant-type T]\n"
	"                [--bnb-4bit-use-double-quant N] [--bnb-4bit-compute-dtype D]]\n"
	"               [STREAM]\n"
	"Trains a LoRA adapter (the student: adapter on, no system prompt) to match the\n"
	"teacher distribution of each record (its 'teacher' field, or the base model with\n"
	"the system prompt when records carry none).  Writes DIR/checkpoint-N/ and\n"
	"DIR/final/ (PEFT adapter + trainer state) and a metrics stream on stdout.\n"
	"  --model DIR          HF model directory or hub id Org/Name (the base model)\n"
	"  --out DIR            output directory\n"
	"  --device D           cpu, cuda or auto (default auto)\n"
	"  --no-share-weights   load an own copy of the weights on the GPU, not the one\n"
	"                       copy per GPU and model the stages share\n"
	"  --system TEXT        refuse a stream made with another system prompt\n"
	"  --system-file FILE   the same, the system prompt read from FILE\n"
	"  --batch-size N       N records per micro-batch (default: bk-lens's 'batch')\n"
	"  --grad-accum N       micro-batches per optimizer step (default 1)\n"
	"  --epochs N           passes over a STREAM file (default 1)\n"
	"  --max-steps N        stop after N optimizer steps; the schedule's length\n"
	"  --lr X               peak learning rate (default 5e-5)\n"
	"  --schedule NAME      linear, cosine, constant, constant_with_warmup (default linear)\n"
	"  --warmup-ratio X     warmup steps = ceil(X * total steps) (default 0)\n"
	"  --warmup-steps N     warmup steps\n"
	"  --weight-decay X     AdamW weight decay (default 0)\n"
	"  --max-grad-norm X    clip the global gradient norm (default 1.0; 0 = off)\n"
	"  --lora-r N           LoRA rank (default 64)\n"
	"  --lora-alpha X       LoRA alpha, scale alpha / r (default 128)\n"
	"  --lora-dropout X     LoRA dropout (default 0.05)\n"
	"  --target-modules LIST  q_proj,k_proj,... or all-linear (default all-linear)\n"
	"  --temperature T      KL temperature; must be the teacher's (default 1.0)\n"
	"  --seed N             LoRA init, dropout and epoch order seed (default 0)\n"
	"  --save-steps N       a checkpoint every N optimizer steps and at the last, none at\n"
	"                       epoch ends (HF's steps; default 0 = at epoch ends and the\n"
	"                       last step of a file only, HF's epoch)\n"
	"  --save-total-limit N keep only the newest N checkpoint-* in --out (default 0 =\n"
	"                       all; final/ is not counted)\n"
	"  --logging-steps N    a metrics record every N optimizer steps (default 1)\n"
	"  --log-every SECONDS  when stderr is not a terminal, a progress line every\n"
	"                       SECONDS (default 30; 0 = none)\n"
	"  --resume DIR         continue from a checkpoint directory\n"
	"  --overwrite          train into an --out that holds another run's checkpoints\n"
	"                       (they are removed at this run's first save)\n"
	"  --base-model-name NAME  base_model_name_or_path of the adapter (default: --model)\n"
	"  --vocab-chunk N      vocabulary chunk of the loss (default 4096)\n"
	"  --optim NAME         adamw (fp32 moments) or adamw8bit (8-bit block-wise moments)\n"
	"                       (default adamw)\n"
	"  --grad-checkpoint    recompute each layer's activations in the backward (less\n"
	"                       memory, same result, about one more forward per step)\n"
	"  --grad-checkpoint-every K  keep only every K-th layer's input (K >= 2; implies\n"
	"                       --grad-checkpoint): less memory again, same result, about\n"
	"                       two more forwards per step\n"
	"  --eval FILE          validation records (a STREAM file): eval_loss records in the\n"
	"                       metrics, the same KL without training (HF's eval loss)\n"
	"  --eval-steps N       evaluate after every N optimizer steps (default 0 = none)\n"
	"  --eval-final         evaluate after the last step too (HF's epoch strategy)\n"
	"  --eval-batch-size N  validation records per batch (default 8, HF's)\n"
	"  --eval-delay N       no evaluation before step N (default 0)\n"
	BK_Q4_USAGE;

/* a number flag outside its range is a usage error naming the flag */
static void need(int ok, const char *flag, double v, const char *range)
{
	if (!ok)
		die_usage("--%s %g: must be %s", flag, v, range);
}

int main(int argc, char **argv)
{
	const char *sys_text = NULL, *sys_file = NULL;
	bk_step_opts o = {.device = "auto", .schedule = "linear", .targets = "all-linear",
			  .grad_accum = 1, .epochs = 1, .lora_r = 64, .logging_steps = 1,
			  .vocab_chunk = 4096, .lr = 5e-5, .max_grad_norm = 1.0,
			  .lora_alpha = 128, .lora_dropout = 0.05, .temperature = 1.0,
			  .optim = "adamw", .log_every = 30, .eval_batch = 8};
	bk_q4_flags q4f = BK_Q4_FLAGS_INIT;
	bk_opt opts[] = {
		{"system", 0, BK_OPT_STR, &sys_text, 0, 0},
		{"system-file", 0, BK_OPT_STR, &sys_file, 0, 0},
		{"model", 0, BK_OPT_STR, &o.model, 0, 0},
		{"out", 0, BK_OPT_STR, &o.out, 0, 0},
		{"device", 0, BK_OPT_STR, &o.device, 0, 0},
		{"no-share-weights", 0, BK_OPT_FLAG, &bk_wshare_off, 0, 0},
		{"batch-size", 0, BK_OPT_INT, &o.batch_size, 1, 1L << 30},
		{"grad-accum", 0, BK_OPT_INT, &o.grad_accum, 1, 1L << 30},
		{"epochs", 0, BK_OPT_INT, &o.epochs, 1, 1L << 30},
		{"max-steps", 0, BK_OPT_INT, &o.max_steps, 1, 1L << 40},
		{"lr", 0, BK_OPT_DOUBLE, &o.lr, 0, 0},
		{"schedule", 0, BK_OPT_STR, &o.schedule, 0, 0},
		{"warmup-ratio", 0, BK_OPT_DOUBLE, &o.warmup_ratio, 0, 0},
		{"warmup-steps", 0, BK_OPT_INT, &o.warmup_steps, 0, 1L << 40},
		{"weight-decay", 0, BK_OPT_DOUBLE, &o.weight_decay, 0, 0},
		{"max-grad-norm", 0, BK_OPT_DOUBLE, &o.max_grad_norm, 0, 0},
		{"lora-r", 0, BK_OPT_INT, &o.lora_r, 1, 1L << 16},
		{"lora-alpha", 0, BK_OPT_DOUBLE, &o.lora_alpha, 0, 0},
		{"lora-dropout", 0, BK_OPT_DOUBLE, &o.lora_dropout, 0, 0},
		{"target-modules", 0, BK_OPT_STR, &o.targets, 0, 0},
		{"temperature", 0, BK_OPT_DOUBLE, &o.temperature, 0, 0},
		{"seed", 0, BK_OPT_INT, &o.seed, 0, 0},
		{"save-steps", 0, BK_OPT_INT, &o.save_steps, 0, 1L << 40},
		{"save-total-limit", 0, BK_OPT_INT, &o.save_total_limit, 0, 1L << 30},
		{"logging-steps", 0, BK_OPT_INT, &o.logging_steps, 1, 1L << 40},
		{"log-every", 0, BK_OPT_DOUBLE, &o.log_every, 0, 0},
		{"resume", 0, BK_OPT_STR, &o.resume, 0, 0},
		{"overwrite", 0, BK_OPT_FLAG, &o.overwrite, 0, 0},
		{"base-model-name", 0, BK_OPT_STR, &o.base_name, 0, 0},
		{"vocab-chunk", 0, BK_OPT_INT, &o.vocab_chunk, 1, 1L << 30},
		{"optim", 0, BK_OPT_STR, &o.optim, 0, 0},
		{"grad-checkpoint", 0, BK_OPT_FLAG, &o.grad_checkpoint, 0, 0},
		{"grad-checkpoint-every", 0, BK_OPT_INT, &o.grad_ckpt_every, 2, 1L << 20},
		{"eval", 0, BK_OPT_STR, &o.eval, 0, 0},
		{"eval-steps", 0, BK_OPT_INT, &o.eval_steps, 0, 1L << 40},
		{"eval-final", 0, BK_OPT_FLAG, &o.eval_final, 0, 0},
		{"eval-batch-size", 0, BK_OPT_INT, &o.eval_batch, 1, 1L << 20},
		{"eval-delay", 0, BK_OPT_INT, &o.eval_delay, 0, 1L << 40},
		{"load-in-4bit", 0, BK_OPT_FLAG, &q4f.load, 0, 0},
		{"bnb-4bit-quant-type", 0, BK_OPT_STR, &q4f.type, 0, 0},
		{"bnb-4bit-use-double-quant", 0, BK_OPT_INT, &q4f.double_quant, 0, 1},
		{"bnb-4bit-compute-dtype", 0, BK_OPT_STR, &q4f.dtype, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	bk_stdout_init();
	/* not a filter: the metrics stream is optional (steprun.h invariant 5), so a
	 * reader that goes away gives EPIPE, not SIGPIPE */
	signal(SIGPIPE, SIG_IGN);
	int n = bk_flags_parse(argc, argv, opts, usage);
	if (n > 1)
		die_usage("too many arguments");
	if (!o.model || !o.out)
		die_usage("--model DIR and --out DIR are required");
	o.q4 = bk_q4_flags_config(&q4f);
	/* a hub id: the adapter names it, as PEFT does, and the cache snapshot is read */
	char *model_dir = bk_hub_model_dir(o.model, NULL);
	if (!o.base_name && strcmp(model_dir, o.model))
		o.base_name = o.model;
	o.model = model_dir;
	if (bk_sched_parse(o.schedule, &o.sched))
		die_usage("--schedule: unknown schedule '%s' (linear, cosine, constant, "
			  "constant_with_warmup)", o.schedule);
	if (bk_optim_parse(o.optim, &o.optim_kind))
		die_usage("--optim: unknown optimizer '%s' (adamw, adamw8bit)", o.optim);
	if (bk_flag_given("warmup-ratio") && bk_flag_given("warmup-steps"))
		die_usage("give --warmup-ratio or --warmup-steps, not both");
	if (o.eval && !o.eval_steps && !o.eval_final)
		die_usage("--eval needs --eval-steps N or --eval-final (when to evaluate)");
	if (!o.eval && (o.eval_steps || o.eval_final || bk_flag_given("eval-batch-size") ||
			bk_flag_given("eval-delay")))
		die_usage("--eval-steps, --eval-final, --eval-batch-size and --eval-delay need "
			  "--eval FILE");
	if (bk_flag_given("resume") && o.overwrite)
		die_usage("give --resume or --overwrite, not both");
	need(o.warmup_ratio >= 0 && o.warmup_ratio <= 1, "warmup-ratio", o.warmup_ratio,
	     "in [0, 1]");
	need(o.lr >= 0 && isfinite(o.lr), "lr", o.lr, ">= 0");
	need(o.weight_decay >= 0 && isfinite(o.weight_decay), "weight-decay", o.weight_decay,
	     ">= 0");
	need(o.max_grad_norm >= 0 && isfinite(o.max_grad_norm), "max-grad-norm",
	     o.max_grad_norm, ">= 0 (0 = no clipping)");
	need(o.temperature > 0 && isfinite(o.temperature), "temperature", o.temperature, "> 0");
	need(o.lora_alpha > 0 && isfinite(o.lora_alpha), "lora-alpha", o.lora_alpha, "> 0");
	need(o.lora_dropout >= 0 && o.lora_dropout < 1, "lora-dropout", o.lora_dropout,
	     "in [0, 1)");
	need(o.log_every >= 0 && isfinite(o.log_every), "log-every", o.log_every,
	     ">= 0 seconds");
	o.target_mask = bk_peft_targets_parse("--target-modules", o.targets);
	o.input = n ? argv[0] : "-";
	char *sys = NULL;
	if (sys_text || sys_file)
		sys = bk_system_prompt(sys_text, sys_file, NULL, NULL, NULL);
	o.system = sys;
	int rc = bk_step_run(&o);
	free(sys);
	free(model_dir);
	bk_stdout_close();
	return rc;
}
