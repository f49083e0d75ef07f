/* bk-step - trains the LoRA adapter on a record stream: micro-batches, epochs over a
 * file (a single pass over a pipe), checkpoints, resume, metrics on stdout.
 * The step itself (forward, loss, backward, AdamW) and the checkpoint files are
 * gpu/train.c's; this file is the data plan and the wiring. */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/rng.h"
#include "formats/peft.h"
#include "formats/inputs.h"
#include "formats/stream.h"
#include "formats/teacher.h"
#include "gpu/device.h"
#include "gpu/load.h"
#include "gpu/train.h"

#include <math.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
	"usage: bk-step --model DIR --out DIR [--device D] [--batch-size N] [--grad-accum N]\n"
	"               [--epochs N] [--max-steps N] [--lr X] [--schedule NAME]\n"
	"               [--warmup-ratio X | --warmup-steps N] [--weight-decay X]\n"
	"               [--max-grad-norm X] [--lora-r N] [--lora-alpha X] [--lora-dropout X]\n"
	"               [--target-modules LIST] [--temperature T] [--seed N]\n"
	"               [--save-steps N] [--logging-steps N] [--resume DIR]\n"
	"               [--base-model-name NAME] [--vocab-chunk N] [--optim NAME]\n"
	"               [--grad-checkpoint] [--system TEXT | --system-file FILE] [STREAM]\n"
	"Trains a LoRA adapter (the student: adapter on, no system prompt) to match the\n"
	"teacher distribution of each record (its 'teacher' field, or the base model with\n"
	"the system prompt when records carry none).  Writes DIR/checkpoint-N/ and\n"
	"DIR/final/ (PEFT adapter + trainer state) and a metrics stream on stdout.\n"
	"  --model DIR          HF model directory (the base model)\n"
	"  --out DIR            output directory\n"
	"  --device D           cpu, cuda or auto (default auto)\n"
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
	"  --save-steps N       a checkpoint every N optimizer steps (default 0 = epochs only)\n"
	"  --logging-steps N    a metrics record every N optimizer steps (default 1)\n"
	"  --resume DIR         continue from a checkpoint directory\n"
	"  --base-model-name NAME  base_model_name_or_path of the adapter (default: --model)\n"
	"  --vocab-chunk N      vocabulary chunk of the loss (default 4096)\n"
	"  --optim NAME         adamw (fp32 moments) or adamw8bit (8-bit block-wise moments)\n"
	"                       (default adamw)\n"
	"  --grad-checkpoint    recompute each layer's activations in the backward (less\n"
	"                       memory, same result, about one more forward per step)\n";

typedef struct {
	const char *model, *out, *device, *schedule, *targets, *resume, *base_name, *optim;
	int grad_checkpoint;
	long batch_size, grad_accum, epochs, max_steps, warmup_steps, lora_r, seed;
	long save_steps, logging_steps, vocab_chunk;
	double lr, warmup_ratio, weight_decay, max_grad_norm, lora_alpha, lora_dropout,
		temperature;
} step_opts;

/* ---- records ---- */

/* one record's training data (buffers reused from record to record) */
typedef struct {
	int32_t *s, *t, *r;
	size_t cap_s, cap_t, cap_r, ns, nt, nr;
	bk_teacher tc;
	int has_tc, has_batch;
	int64_t batch;
} slot;

typedef struct {
	slot *v;
	int n, cap;
	bk_train_sample *smp;
} mbatch;

static int mode = -1; /* 1: records carry a teacher field, 0: exact mode */

static void load_slot(const bk_reader *in, const msgpack_object *rec, slot *sl, float temp)
{
	size_t n;
	sl->ns = bk_rec_ids(in, rec, "s_prompt", &sl->s, &sl->cap_s);
	if (!bk_rec_ids_opt(in, rec, "resp", &sl->r, &sl->cap_r, &sl->nr))
		bk_reader_die(in, "no 'resp' field (prompts-only records need bk-gen first)");
	sl->has_tc = bk_teacher_read(in, rec, &sl->tc);
	if (mode < 0)
		mode = sl->has_tc;
	else if (mode != sl->has_tc)
		bk_reader_die(in, "%s 'teacher' field, unlike the records before it",
			      sl->has_tc ? "has a" : "has no");
	if (sl->has_tc && fabsf(sl->tc.temperature - temp) > 1e-6f * fmaxf(1, temp))
		bk_reader_die(in, "teacher temperature %g differs from --temperature %g",
			      (double)sl->tc.temperature, (double)temp);
	if (sl->has_tc && sl->tc.n != (int)sl->nr)
		bk_reader_die(in, "field 'teacher' has %d positions, 'resp' has %zu tokens",
			      sl->tc.n, sl->nr);
	sl->nt = 0;
	if (!sl->has_tc)
		sl->nt = bk_rec_ids(in, rec, "t_prompt", &sl->t, &sl->cap_t);
	else if (bk_rec_ids_opt(in, rec, "t_prompt", &sl->t, &sl->cap_t, &n))
		sl->nt = n;
	if (sl->nr && (!sl->ns || (!sl->has_tc && !sl->nt)))
		bk_reader_die(in, "empty prompt: no position predicts the first response token");
	sl->has_batch = bk_rec_int_opt(in, rec, "batch", &sl->batch);
}

static slot *mb_slot(mbatch *mb, int i)
{
	if (i >= mb->cap) {
		int c = mb->cap ? mb->cap * 2 : 16;
		while (c <= i)
			c *= 2;
		mb->v = xrealloc(mb->v, (size_t)c * sizeof(*mb->v));
		mb->smp = xrealloc(mb->smp, (size_t)c * sizeof(*mb->smp));
		memset(mb->v + mb->cap, 0, (size_t)(c - mb->cap) * sizeof(*mb->v));
		mb->cap = c;
	}
	return &mb->v[i];
}

static void mb_free(mbatch *mb)
{
	for (int i = 0; i < mb->cap; i++) {
		free(mb->v[i].s), free(mb->v[i].t), free(mb->v[i].r);
		bk_teacher_free(&mb->v[i].tc);
	}
	free(mb->v);
	free(mb->smp);
}

/* ---- the run ---- */

static volatile sig_atomic_t stop_signal;
static void on_stop(int sig) { stop_signal = sig; }
static void install_stop_handlers(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	sa.sa_flags = SA_RESTART; /* a blocked read of the stream goes on */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
	step_opts *o;
	bk_loaded_model lm;
	bk_trainer *tr;
	bk_writer *w;
	bk_train_progress prog;  /* committed at the last optimizer step */
	bk_train_setting *set;
	int n_set;
	int64_t total;           /* optimizer steps of the run; 0 = unknown */
	double nmb_epoch;        /* micro-batches per epoch (file), for the epoch number */
	/* the step being accumulated */
	double step_loss;
	int64_t step_records, step_tokens;
	/* since the last metrics record */
	double log_loss, log_t0;
	int64_t log_steps, log_tokens;
	double t0, elapsed0;      /* this process's start, elapsed before it */
	int64_t step0;            /* step at this process's start */
	int64_t last_saved;
	BK_VEC(char *) ckpts;
	int tty, interrupted;
} run;

static void save(run *R, const char *name)
{
	char *dir = bk_path_join(R->o->out, name);
	R->prog.elapsed = R->elapsed0 + (now_s() - R->t0);
	/* SIGINT/SIGTERM wait until the checkpoint is complete; the first atomic write
	 * installs files.c's handlers, so ours go back before the signals do */
	sigset_t block, old;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, &old);
	bk_trainer_save(R->tr, R->lm.cfg, R->o->base_name ? R->o->base_name : R->o->model,
			&R->prog, R->set, R->n_set, dir);
	install_stop_handlers();
	sigprocmask(SIG_SETMASK, &old, NULL);
	if (strcmp(name, "final"))
		bk_vec_push(&R->ckpts, dir);
	else
		free(dir);
	R->last_saved = R->tr->step;
}

static void save_checkpoint(run *R)
{
	if (R->last_saved == R->tr->step)
		return;
	char name[64];
	snprintf(name, sizeof name, "checkpoint-%lld", (long long)R->tr->step);
	save(R, name);
}

/* die() after optimizer steps: the stream ended truncated (Ctrl-C reached the whole
 * pipeline and the upstream stage died mid-record, or it crashed) or a later record
 * was bad.  The steps already taken are sound: save them (dropping the partial
 * accumulation) before exiting, so no finished step is lost. */
static run *g_run;
static void save_on_die(void)
{
	run *R = g_run;
	g_run = NULL; /* a die() inside the save must not come back here */
	if (!R || !R->tr || R->tr->step == R->last_saved)
		return;
	bk_trainer_drop(R->tr);
	save_checkpoint(R);
	fprintf(stderr, "%s: saved the %lld steps done in %s (continue with --resume %s)\n",
		bk_prog, (long long)R->tr->step, R->ckpts.v[R->ckpts.n - 1],
		R->ckpts.v[R->ckpts.n - 1]);
}

static void fmt_eta(double s, char *buf, size_t n)
{
	long t = (long)(s + 0.5);
	snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

/* ends the optimizer step: AdamW, progress, metrics record, progress line, save */
static void finish_step(run *R, double epoch_pos)
{
	int n_micro = R->tr->n_micro;
	double lr, norm = bk_trainer_step(R->tr, &lr), loss = R->step_loss / n_micro;
	bk_train_progress *p = &R->prog;
	p->micro_in_epoch += n_micro;
	p->records_in_epoch += R->step_records;
	p->records += R->step_records;
	p->tokens += R->step_tokens;
	p->loss_sum += loss;
	R->log_loss += loss;
	R->log_steps++;
	R->log_tokens += R->step_tokens;
	R->step_loss = 0;
	R->step_records = R->step_tokens = 0;
	int64_t step = R->tr->step;
	double t = now_s();
	if (step % R->o->logging_steps == 0) {
		double dt = t - R->log_t0;
		msgpack_packer *pk = bk_rec_begin(R->w);
		bk_rec_key(R->w, "step");
		msgpack_pack_int64(pk, step);
		bk_rec_key(R->w, "epoch");
		msgpack_pack_double(pk, epoch_pos);
		bk_rec_key(R->w, "loss");
		msgpack_pack_double(pk, R->log_loss / R->log_steps);
		bk_rec_key(R->w, "lr");
		msgpack_pack_double(pk, lr);
		bk_rec_key(R->w, "grad_norm");
		msgpack_pack_double(pk, norm);
		bk_rec_key(R->w, "tokens");
		msgpack_pack_int64(pk, R->log_tokens);
		bk_rec_key(R->w, "tokens_per_s");
		msgpack_pack_double(pk, dt > 0 ? R->log_tokens / dt : 0);
		bk_rec_key(R->w, "elapsed");
		msgpack_pack_double(pk, R->elapsed0 + (t - R->t0));
		bk_rec_end(R->w);
		fflush(stdout);
		R->log_loss = 0;
		R->log_steps = R->log_tokens = 0;
		R->log_t0 = t;
	}
	if (R->tty) {
		char eta[32] = "?";
		double per = (t - R->t0) / (double)(step - R->step0);
		if (R->total)
			fmt_eta(per * (double)(R->total - step), eta, sizeof eta);
		fprintf(stderr, "\r%s: step %lld/%lld  loss %.4f  %.0f tok/s  ETA %s   ", bk_prog,
			(long long)step, (long long)R->total, loss,
			(double)(p->tokens) / (R->elapsed0 + t - R->t0 > 0 ? R->elapsed0 + t - R->t0 : 1),
			eta);
	}
	if (R->o->save_steps > 0 && step % R->o->save_steps == 0)
		save_checkpoint(R);
}

/* one micro-batch of mb->n records; steps when the accumulation is full or when
 * force_step (the last micro-batch of an epoch or of the stream) */
static void train_micro(run *R, mbatch *mb, int force_step, double epoch_pos)
{
	for (int i = 0; i < mb->n; i++) {
		slot *s = &mb->v[i];
		mb->smp[i] = (bk_train_sample){s->s, s->t, s->r, (int)s->ns, (int)s->nt,
					       (int)s->nr, s->has_tc ? &s->tc : NULL};
	}
	bk_train_micro_info info;
	bk_trainer_micro(R->tr, mb->smp, mb->n, &info);
	R->step_loss += info.loss;
	R->step_records += mb->n;
	R->step_tokens += info.tokens;
	if (R->tr->n_micro >= R->o->grad_accum || force_step)
		finish_step(R, epoch_pos);
}

/* after a micro-batch: stop for a signal (dropping a partial accumulation) or at
 * --max-steps; returns 1 to stop */
static int should_stop(run *R)
{
	if (R->total && R->tr->step >= R->total)
		return 1; /* done: a signal now changes nothing, final/ is written */
	if (stop_signal) {
		bk_trainer_drop(R->tr);
		R->step_loss = 0;
		R->step_records = R->step_tokens = 0;
		R->interrupted = 1;
		return 1;
	}
	return 0;
}

/* ---- file: epochs with a shuffled micro-batch order ---- */

typedef struct {
	bk_map map;
	BK_VEC(size_t) off;   /* record byte offsets in the file */
	BK_VEC(size_t) len;
	BK_VEC(size_t) group; /* first record of each bk-lens batch, + nrec at the end */
	size_t nrec;
	int max_T;
} file_index;

/* pass 1: validates every record, notes offsets, groups and the largest batch */
static void index_file(bk_reader *in, const char *path, const step_opts *o, file_index *fx)
{
	fx->map = bk_map_file(path);
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	size_t off = 0;
	if (msgpack_unpack_next(&up, (const char *)fx->map.data, fx->map.len, &off) !=
	    MSGPACK_UNPACK_SUCCESS)
		die("%s: header does not parse", path);
	msgpack_unpacked_destroy(&up);
	slot sl = {0};
	const msgpack_object *rec;
	BK_VEC(long) ls = {0}, lt = {0};
	int64_t prev_batch = 0;
	long sum_s = 0, sum_t = 0, max_T = 1;
	while ((rec = bk_reader_next(in))) {
		load_slot(in, rec, &sl, (float)o->temperature);
		size_t len;
		const char *raw = bk_reader_raw(in, &len);
		if (off + len > fx->map.len || memcmp(fx->map.data + off, raw, len))
			die("%s: changed while being read", path);
		if (!o->batch_size && !sl.has_batch)
			bk_reader_die(in, "no 'batch' field: plan batches with bk-lens or give "
				      "--batch-size");
		if (!o->batch_size && (!fx->nrec || sl.batch != prev_batch)) {
			bk_vec_push(&fx->group, fx->nrec);
			if (sum_s > max_T)
				max_T = sum_s;
			if (sum_t > max_T)
				max_T = sum_t;
			sum_s = sum_t = 0;
		}
		prev_batch = sl.batch;
		long s = (long)(sl.ns + sl.nr), t = sl.has_tc ? 0 : (long)(sl.nt + sl.nr);
		if (sl.nr) { /* empty responses are dropped from the forward */
			sum_s += s, sum_t += t;
			bk_vec_push(&ls, s);
			bk_vec_push(&lt, t);
		}
		bk_vec_push(&fx->off, off);
		bk_vec_push(&fx->len, len);
		off += len;
		fx->nrec++;
	}
	if (sum_s > max_T)
		max_T = sum_s;
	if (sum_t > max_T)
		max_T = sum_t;
	bk_vec_push(&fx->group, fx->nrec);
	if (o->batch_size) { /* any N records can meet: the N longest of each side */
		for (int side = 0; side < 2; side++) {
			long *v = side ? lt.v : ls.v, sum = 0;
			size_t n = side ? lt.n : ls.n;
			for (long k = 0; k < o->batch_size && k < (long)n; k++) {
				size_t best = (size_t)k;
				for (size_t i = (size_t)k + 1; i < n; i++)
					if (v[i] > v[best])
						best = i;
				long x = v[best];
				v[best] = v[k], v[k] = x;
				sum += x;
			}
			if (sum > max_T)
				max_T = sum;
		}
	}
	if (max_T > (1L << 30))
		die("%s: a micro-batch of %ld tokens is too large", path, max_T);
	fx->max_T = (int)max_T;
	free(ls.v), free(lt.v);
	free(sl.s), free(sl.t), free(sl.r);
	bk_teacher_free(&sl.tc);
}

static size_t micro_per_epoch(const file_index *fx, const step_opts *o)
{
	if (o->batch_size)
		return (fx->nrec + (size_t)o->batch_size - 1) / (size_t)o->batch_size;
	return fx->group.n - 1;
}

static void shuffle(size_t *v, size_t n, bk_rng *rng)
{
	for (size_t i = n; i > 1; i--) {
		size_t j = (size_t)bk_rng_below(rng, i), t = v[i - 1];
		v[i - 1] = v[j], v[j] = t;
	}
}

/* the epoch's record order and micro-batch bounds: a pure function of (seed, epoch) */
static void plan_epoch(const file_index *fx, const step_opts *o, uint64_t seed, int64_t ep,
		       size_t *order, size_t *bounds)
{
	bk_rng rng;
	bk_rng_seed(&rng, bk_crng_key(seed, (uint64_t)ep, 0x65706f6368 /* "epoch" */, 0));
	size_t nmb = micro_per_epoch(fx, o), k = 0;
	if (o->batch_size) {
		for (size_t i = 0; i < fx->nrec; i++)
			order[i] = i;
		shuffle(order, fx->nrec, &rng);
		for (size_t b = 0; b <= nmb; b++) {
			size_t e = b * (size_t)o->batch_size;
			bounds[b] = e < fx->nrec ? e : fx->nrec;
		}
		return;
	}
	size_t *g = xmalloc((nmb ? nmb : 1) * sizeof *g);
	for (size_t b = 0; b < nmb; b++)
		g[b] = b;
	shuffle(g, nmb, &rng);
	for (size_t b = 0; b < nmb; b++) {
		bounds[b] = k;
		for (size_t i = fx->group.v[g[b]]; i < fx->group.v[g[b] + 1]; i++)
			order[k++] = i;
	}
	bounds[nmb] = k;
	free(g);
}

static void train_file(run *R, bk_reader *in, file_index *fx, int64_t n_epochs)
{
	const step_opts *o = R->o;
	size_t nmb = micro_per_epoch(fx, o);
	size_t *order = xmalloc((fx->nrec ? fx->nrec : 1) * sizeof *order);
	size_t *bounds = xmalloc((nmb + 1) * sizeof *bounds);
	mbatch mb = {0};
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	int stop = 0;
	for (int64_t ep = R->prog.epoch; ep < n_epochs && !stop; ep++) {
		plan_epoch(fx, o, R->prog.order_seed, ep, order, bounds);
		for (size_t b = (size_t)R->prog.micro_in_epoch; b < nmb && !stop; b++) {
			mb.n = 0;
			for (size_t k = bounds[b]; k < bounds[b + 1]; k++) {
				size_t i = order[k], pos = 0;
				if (msgpack_unpack_next(&up, (const char *)fx->map.data + fx->off.v[i],
							fx->len.v[i], &pos) != MSGPACK_UNPACK_SUCCESS)
					BUG("indexed record %zu does not parse", i);
				load_slot(in, &up.data, mb_slot(&mb, mb.n), (float)o->temperature);
				mb.n++;
			}
			train_micro(R, &mb, b + 1 == nmb, (double)ep + (double)(b + 1) / (double)nmb);
			stop = should_stop(R);
		}
		if (!stop || (!R->interrupted && R->prog.micro_in_epoch == (int64_t)nmb)) {
			/* the epoch is complete: its end is a checkpoint */
			R->prog.epoch = ep + 1;
			R->prog.micro_in_epoch = 0;
			R->prog.records_in_epoch = 0;
			save_checkpoint(R);
		}
	}
	msgpack_unpacked_destroy(&up);
	mb_free(&mb);
	free(order);
	free(bounds);
}

/* ---- pipe: one pass, micro-batches formed as records arrive ---- */

static void train_pipe(run *R, bk_reader *in)
{
	const step_opts *o = R->o;
	mbatch mb = {0};
	const msgpack_object *rec;
	int64_t skip = R->prog.records, epoch_field = 0;
	while (skip > 0 && (rec = bk_reader_next(in)))
		skip--;
	if (skip > 0)
		die("%s: --resume: the stream ends before the %lld records the checkpoint "
		    "consumed", bk_reader_name(in), (long long)R->prog.records);
	int stop = 0;
	while (!stop) {
		rec = bk_reader_next(in);
		if (rec) {
			slot *s = mb_slot(&mb, mb.n);
			load_slot(in, rec, s, (float)o->temperature);
			if (!o->batch_size && !s->has_batch)
				bk_reader_die(in, "no 'batch' field: plan batches with bk-lens or "
					      "give --batch-size");
			bk_rec_int_opt(in, rec, "epoch", &epoch_field);
			int full = o->batch_size ? mb.n + 1 == o->batch_size
						 : mb.n > 0 && s->batch != mb.v[0].batch;
			if (!o->batch_size && full) { /* s starts the next batch */
				train_micro(R, &mb, 0, (double)epoch_field);
				slot t = mb.v[0];
				mb.v[0] = *s, *s = t;
				mb.n = 1;
				stop = should_stop(R);
				continue;
			}
			mb.n++;
			if (!full)
				continue;
			train_micro(R, &mb, 0, (double)epoch_field);
			mb.n = 0;
		} else {
			/* the end of the stream: a partial accumulation still steps */
			if (mb.n)
				train_micro(R, &mb, 1, (double)epoch_field);
			else if (R->tr->n_micro)
				finish_step(R, (double)epoch_field);
			break;
		}
		stop = should_stop(R);
	}
	mb_free(&mb);
}

/* ---- main ---- */

static void add_setting(run *R, const char *key, char *value)
{
	R->set = xrealloc(R->set, (size_t)(R->n_set + 1) * sizeof(*R->set));
	R->set[R->n_set++] = (bk_train_setting){key, value};
}

int main(int argc, char **argv)
{
	const char *sys_text = NULL, *sys_file = NULL;
	step_opts o = {.device = "auto", .schedule = "linear", .targets = "all-linear",
		       .grad_accum = 1, .epochs = 1, .lora_r = 64, .logging_steps = 1,
		       .vocab_chunk = 4096, .lr = 5e-5, .max_grad_norm = 1.0, .lora_alpha = 128,
		       .lora_dropout = 0.05, .temperature = 1.0, .optim = "adamw"};
	bk_opt opts[] = {
		{"system", 0, BK_OPT_STR, &sys_text, 0, 0},
		{"system-file", 0, BK_OPT_STR, &sys_file, 0, 0},
		{"model", 0, BK_OPT_STR, &o.model, 0, 0},
		{"out", 0, BK_OPT_STR, &o.out, 0, 0},
		{"device", 0, BK_OPT_STR, &o.device, 0, 0},
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
		{"logging-steps", 0, BK_OPT_INT, &o.logging_steps, 1, 1L << 40},
		{"resume", 0, BK_OPT_STR, &o.resume, 0, 0},
		{"base-model-name", 0, BK_OPT_STR, &o.base_name, 0, 0},
		{"vocab-chunk", 0, BK_OPT_INT, &o.vocab_chunk, 1, 1L << 30},
		{"optim", 0, BK_OPT_STR, &o.optim, 0, 0},
		{"grad-checkpoint", 0, BK_OPT_FLAG, &o.grad_checkpoint, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	bk_stdout_init();
	/* not a filter: a metrics reader that goes away must not end training quietly;
	 * the write error dies through save_on_die, which keeps the steps done */
	signal(SIGPIPE, SIG_IGN);
	int n = bk_flags_parse(argc, argv, opts, usage);
	if (n > 1)
		die_usage("too many arguments");
	if (!o.model || !o.out)
		die_usage("--model DIR and --out DIR are required");
	bk_sched_kind sched;
	if (bk_sched_parse(o.schedule, &sched))
		die_usage("--schedule: unknown schedule '%s' (linear, cosine, constant, "
			  "constant_with_warmup)", o.schedule);
	bk_optim_kind optim;
	if (bk_optim_parse(o.optim, &optim))
		die_usage("--optim: unknown optimizer '%s' (adamw, adamw8bit)", o.optim);
	if (bk_flag_given("warmup-ratio") && bk_flag_given("warmup-steps"))
		die_usage("give --warmup-ratio or --warmup-steps, not both");
	if (!(o.warmup_ratio >= 0 && o.warmup_ratio <= 1))
		die_usage("--warmup-ratio %g is not in [0, 1]", o.warmup_ratio);
	if (!(o.lr >= 0) || !(o.weight_decay >= 0) || !(o.max_grad_norm >= 0) ||
	    !(o.temperature > 0) || !(o.lora_alpha > 0) ||
	    !(o.lora_dropout >= 0 && o.lora_dropout < 1))
		die_usage("--lr, --weight-decay and --max-grad-norm must be >= 0, --temperature "
			  "and --lora-alpha > 0, --lora-dropout in [0, 1)");
	unsigned targets = bk_peft_targets_parse("--target-modules", o.targets);
	const char *path = n ? argv[0] : "-";
	struct stat sb;
	int is_file = strcmp(path, "-") && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
	if (!is_file && o.epochs > 1)
		die_usage("--epochs %ld needs a STREAM file; a pipe is read once (bk-gen "
			  "--epochs makes fresh trajectories per epoch)", o.epochs);

	const bk_ops *ops = bk_device_select(o.device);
	bk_reader *in = bk_reader_open(path);
	char *tok = bk_path_join(o.model, "tokenizer.model");
	if (bk_file_exists(tok))
		bk_reader_expect_file(in, "tokenizer", tok, "tokenizer");
	free(tok);
	run R = {.o = &o, .last_saved = -1};
	R.lm = bk_model_load(ops, o.model);
	bk_reader_expect(in, "model", R.lm.fingerprint, "model");
	if (sys_text || sys_file) {
		char *sys = bk_system_prompt(sys_text, sys_file, NULL, NULL, NULL);
		bk_reader_expect_system(in, sys);
		free(sys);
	}
	const msgpack_object *pt = bk_reader_prov(in, "temperature");
	if (pt && (pt->type == MSGPACK_OBJECT_FLOAT64 || pt->type == MSGPACK_OBJECT_FLOAT32 ||
		   pt->type == MSGPACK_OBJECT_POSITIVE_INTEGER)) {
		double t = pt->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (double)pt->via.u64
								       : pt->via.f64;
		if (fabs(t - o.temperature) > 1e-6 * fmax(1, o.temperature))
			die("%s: stream was made with teacher temperature %g, given --temperature %g",
			    bk_reader_name(in), t, o.temperature);
	}

	/* the plan: micro-batches per epoch and optimizer steps */
	file_index fx = {0};
	int64_t n_epochs = 1, spe = 0;
	if (is_file) {
		index_file(in, path, &o, &fx);
		size_t nmb = micro_per_epoch(&fx, &o);
		if (!nmb)
			die("%s: no records to train on", path);
		spe = (int64_t)((nmb + (size_t)o.grad_accum - 1) / (size_t)o.grad_accum);
		n_epochs = o.max_steps ? (o.max_steps + spe - 1) / spe : o.epochs;
		R.total = o.max_steps ? o.max_steps : o.epochs * spe;
		R.nmb_epoch = (double)nmb;
	} else {
		R.total = o.max_steps;
		if (!R.total && (sched == BK_SCHED_LINEAR || sched == BK_SCHED_COSINE))
			die("a %s schedule over a pipe needs --max-steps (the number of steps is "
			    "not known before the stream ends); give a STREAM file or --schedule "
			    "constant", o.schedule);
		if (!R.total && o.warmup_ratio > 0)
			die("--warmup-ratio over a pipe needs --max-steps; or give --warmup-steps");
	}
	bk_train_opts to = {
		.r = (int)o.lora_r, .alpha = (float)o.lora_alpha, .dropout = (float)o.lora_dropout,
		.targets = targets, .lr = o.lr, .weight_decay = o.weight_decay,
		.max_grad_norm = o.max_grad_norm, .sched = sched,
		.warmup = bk_warmup_steps(o.warmup_steps, o.warmup_ratio, R.total),
		.total = R.total, .temperature = (float)o.temperature, .seed = (uint64_t)o.seed,
		.vocab_chunk = (int)o.vocab_chunk, .optim = optim,
		.grad_checkpoint = o.grad_checkpoint};
	R.tr = bk_trainer_create(R.lm.model, &to);
	if (is_file)
		bk_trainer_reserve(R.tr, fx.max_T);

	/* the flags that change the result must not change on --resume */
	add_setting(&R, "model", xstrdup(R.lm.fingerprint));
	add_setting(&R, "input", xstrdup(is_file ? "file" : "pipe"));
	add_setting(&R, "records", is_file ? xasprintf("%zu", fx.nrec) : xstrdup("-"));
	add_setting(&R, "batch-size", o.batch_size ? xasprintf("%ld", o.batch_size)
						   : xstrdup("bk-lens"));
	add_setting(&R, "grad-accum", xasprintf("%ld", o.grad_accum));
	add_setting(&R, "total-steps", xasprintf("%lld", (long long)R.total));
	add_setting(&R, "warmup-steps", xasprintf("%lld", (long long)to.warmup));
	add_setting(&R, "lr", xasprintf("%.17g", o.lr));
	add_setting(&R, "schedule", xstrdup(o.schedule));
	add_setting(&R, "weight-decay", xasprintf("%.17g", o.weight_decay));
	add_setting(&R, "max-grad-norm", xasprintf("%.17g", o.max_grad_norm));
	add_setting(&R, "lora-r", xasprintf("%ld", o.lora_r));
	add_setting(&R, "lora-alpha", xasprintf("%.17g", o.lora_alpha));
	add_setting(&R, "lora-dropout", xasprintf("%.17g", o.lora_dropout));
	add_setting(&R, "target-modules", xasprintf("%#x", targets));
	add_setting(&R, "temperature", xasprintf("%.17g", o.temperature));
	add_setting(&R, "seed", xasprintf("%ld", o.seed));
	add_setting(&R, "vocab-chunk", xasprintf("%ld", o.vocab_chunk));
	R.prog.order_seed = (uint64_t)o.seed;
	g_run = &R;
	bk_die_hook = save_on_die;
	if (o.resume) {
		bk_trainer_resume(R.tr, R.lm.cfg, o.resume, &R.prog, R.set, R.n_set);
		fprintf(stderr, "%s: resuming from %s at step %lld\n", bk_prog, o.resume,
			(long long)R.tr->step);
		R.last_saved = R.tr->step;
	}

	bk_mkdir_p(o.out);
	R.w = bk_writer_open("-");
	bk_kv kv[] = {BK_KV_S("model", R.lm.fingerprint), BK_KV_D("temperature", o.temperature),
		      BK_KV_D("lr", o.lr), BK_KV_S("schedule", o.schedule),
		      BK_KV_I("lora_r", o.lora_r), BK_KV_D("lora_alpha", o.lora_alpha),
		      BK_KV_I("seed", o.seed), BK_KV_I("total_steps", R.total)};
	bk_writer_header(R.w, in, kv, 8);
	install_stop_handlers();
	R.tty = isatty(2);
	R.t0 = R.log_t0 = now_s();
	R.elapsed0 = R.prog.elapsed;
	R.step0 = R.tr->step;

	if (!R.total || R.tr->step < R.total) {
		if (is_file)
			train_file(&R, in, &fx, n_epochs);
		else
			train_pipe(&R, in);
	}
	if (R.tty)
		fputc('\n', stderr);
	char *final = NULL;
	if (R.interrupted) {
		save_checkpoint(&R);
	} else {
		save(&R, "final");
		final = bk_path_join(o.out, "final");
	}
	msgpack_packer *pk = bk_rec_begin(R.w);
	bk_rec_key(R.w, "checkpoints");
	msgpack_pack_array(pk, R.ckpts.n);
	for (size_t i = 0; i < R.ckpts.n; i++)
		bk_pack_str(pk, R.ckpts.v[i]);
	bk_rec_key(R.w, "final");
	if (final)
		bk_pack_str(pk, final);
	else
		msgpack_pack_nil(pk);
	bk_rec_end(R.w);
	bk_writer_close(R.w);

	double el = now_s() - R.t0;
	int64_t steps = R.tr->step - R.step0;
	/* the checkpoint holding the current step: the last one saved, or the one this
	 * run resumed from when it was stopped before its first new step */
	const char *here = R.ckpts.n ? R.ckpts.v[R.ckpts.n - 1] : o.resume;
	if (R.interrupted && here)
		fprintf(stderr, "%s: interrupted by signal %d at step %lld; saved %s (continue with "
			"--resume %s)\n", bk_prog, (int)stop_signal, (long long)R.tr->step, here,
			here);
	else if (R.interrupted)
		fprintf(stderr, "%s: interrupted by signal %d before the first step; nothing to "
			"save\n", bk_prog, (int)stop_signal);
	else
		fprintf(stderr, "%s: %lld steps in %.1f s, mean loss %.4f, %.0f tokens/s; adapter "
			"in %s\n", bk_prog, (long long)steps, el,
			R.tr->step ? R.prog.loss_sum / (double)R.tr->step : 0.0,
			R.prog.elapsed > 0 ? (double)R.prog.tokens / R.prog.elapsed : 0.0, final);
	free(final);
	for (size_t i = 0; i < R.ckpts.n; i++)
		free(R.ckpts.v[i]);
	free(R.ckpts.v);
	for (int i = 0; i < R.n_set; i++)
		free(R.set[i].value);
	free(R.set);
	bk_trainer_free(R.tr);
	bk_model_unload(&R.lm);
	bk_reader_close(in);
	if (is_file) {
		bk_unmap(&fx.map);
		free(fx.off.v), free(fx.len.v), free(fx.group.v);
	}
	bk_stdout_close();
	return 0;
}
