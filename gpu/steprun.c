/* steprun.c - the life cycle of a bk-step run (see steprun.h for its invariants):
 * up-front checks, resume, epochs over a file or one pass over a pipe, checkpoints,
 * signals, metrics, the final save and the summary. */
#include "gpu/steprun.h"
#include "common/diag.h"
#include "common/dist.h"
#include "common/files.h"
#include "common/hash.h"
#include "common/progress.h"
#include "common/rng.h"
#include "formats/msgjson.h"
#include "formats/peft.h"
#include "formats/stream.h"
#include "formats/teacher.h"
#include "formats/tokenizer.h"
#include "gpu/device.h"
#include "gpu/load.h"
#include "gpu/nccl.h"
#include "gpu/train.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

typedef struct run run;
static void kind_seen(run *R, const bk_reader *in, const char *kind);

static const char *slot_kind(const slot *sl)
{
	return !sl->has_tc ? "exact" : sl->tc.k ? "top-k" : "full";
}

static const char *kind_words(const char *kind)
{
	if (!strcmp(kind, "exact"))
		return "records without a teacher field (exact mode)";
	if (!strcmp(kind, "top-k"))
		return "records with a top-k teacher field";
	if (!strcmp(kind, "full"))
		return "records with a full-distribution teacher field";
	return kind;
}

/* ---- the run ---- */

typedef struct {
	int64_t n;  /* records chained */
	uint64_t h; /* the chain after them */
} chain_mark;

struct run {
	const bk_step_opts *o;
	bk_dist dist;            /* data-parallel ranks (invariant 8): rank 0 writes */
	float *gbuf;             /* host copy of the gradients for the reduction */
	bk_nccl *nccl;           /* NCCL sums the gradients on the GPUs; NULL: over MPI */
	bk_loaded_model lm;
	bk_trainer *tr;
	bk_writer *w;
	bk_train_progress prog;  /* committed at the last optimizer step */
	bk_train_setting *set;
	int n_set;
	int64_t total;           /* optimizer steps of the run; 0 = unknown */
	const char *kind;        /* exact, top-k or full: fixed by the first record */
	char *resume_kind;       /* the checkpoint's kind (a pipe checks it at record 1) */
	/* the step being accumulated */
	double step_loss;
	int64_t step_records, step_tokens;
	/* since the last metrics record */
	double log_loss, log_t0;
	int64_t log_steps, log_tokens;
	double t0, elapsed0;      /* this process's start, elapsed before it */
	int64_t step0, adam0;     /* step and applied updates at this process's start */
	int64_t last_saved;
	double last_line;         /* when the last plain progress line was printed */
	char *saving;             /* the temporary of a save in progress (invariant 3) */
	int stop_agreed;          /* data parallel: a stop all ranks agreed on */
	BK_VEC(char *) ckpts;     /* checkpoint-* written by this run, still present */
	BK_VEC(char *) stale;     /* --overwrite: another run's checkpoints, removed at
				   * this run's first save */
	int tty, interrupted;
	/* --eval: the validation records, loaded whole before the first step */
	mbatch ev;
	int64_t last_eval;        /* the step last evaluated, -1 none */
	double last_epoch_pos;    /* the epoch position of the last step */
	bk_q4_config q4;          /* --load-in-4bit's, with the thread count quantised with */
	/* the stream's identity (--resume: the same records): a chained XXH3-64 of the
	 * records' bytes in stream order; a file's over all of them, a pipe's over the
	 * records of the committed steps (marks: the chain after each record read and
	 * not yet committed) */
	uint64_t chain;
	int64_t chained;
	BK_VEC(chain_mark) marks;
	char *resume_stream;      /* a pipe's checkpoint's, compared after its records */
	int pipe;                 /* STREAM is read once (a pipe, a FIFO) */
};

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

static const char *plural(int64_t n, const char *one, const char *many)
{
	return n == 1 ? one : many;
}

/* ---- --out: checked before anything is trained (invariant 1) ---- */

/* "checkpoint-N" (N digits) or "final": a checkpoint directory name of ours */
static int is_ckpt_name(const char *name, long *step)
{
	if (!strcmp(name, "final")) {
		*step = -1;
		return 1;
	}
	if (strncmp(name, "checkpoint-", 11) || !name[11])
		return 0;
	char *end;
	long v = strtol(name + 11, &end, 10);
	if (*end || v < 0)
		return 0;
	*step = v;
	return 1;
}

typedef struct {
	char *name;
	long step;
} ckpt_ent;

static int cmp_ckpt(const void *a, const void *b)
{
	long x = ((const ckpt_ent *)a)->step, y = ((const ckpt_ent *)b)->step;
	return x < y ? -1 : x > y;
}

/* the checkpoint directories (with a trainer_state.json) in out, oldest first;
 * final/ (step -1) comes first */
static size_t list_ckpts(const char *out, ckpt_ent **v)
{
	*v = NULL;
	DIR *d = opendir(out);
	if (!d)
		return 0;
	size_t n = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		long step;
		if (!is_ckpt_name(e->d_name, &step))
			continue;
		char *dir = bk_path_join(out, e->d_name);
		char *st = bk_path_join(dir, "trainer_state.json");
		int ours = bk_file_exists(st);
		free(st);
		if (!ours) {
			free(dir);
			continue;
		}
		if (n == cap) {
			cap = cap ? 2 * cap : 8;
			*v = xrealloc(*v, cap * sizeof **v);
		}
		(*v)[n++] = (ckpt_ent){dir, step};
	}
	closedir(d);
	if (n)
		qsort(*v, n, sizeof **v, cmp_ckpt);
	return n;
}

static void free_ckpts(ckpt_ent *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(v[i].name);
	free(v);
}

/* the directory must be one we can create files in: probe with a file made and
 * removed at once (access(2) says yes to root on a read-only file system) */
static void probe_writable(const char *dir)
{
	char *p = bk_path_join(dir, ".bk-step-probe.XXXXXX");
	int fd = mkstemp(p);
	if (fd < 0)
		die("--out %s: cannot write there: %s", dir, strerror(errno));
	close(fd);
	unlink(p);
	free(p);
}

static void check_out(run *R)
{
	const bk_step_opts *o = R->o;
	struct stat st;
	if (stat(o->out, &st) == 0) {
		if (!S_ISDIR(st.st_mode))
			die("--out %s: exists and is not a directory", o->out);
		probe_writable(o->out);
	} else if (errno != ENOENT) {
		die("--out %s: %s", o->out, strerror(errno));
	} else {
		/* the nearest existing ancestor must take the new directories */
		char *p = xstrdup(o->out);
		for (;;) {
			char *slash = strrchr(p, '/');
			while (slash && slash > p && slash[1] == 0) { /* trailing slashes */
				*slash = 0;
				slash = strrchr(p, '/');
			}
			if (!slash) {
				strcpy(p, ".");
			} else if (slash == p) {
				p[1] = 0;
			} else {
				*slash = 0;
			}
			if (stat(p, &st) == 0) {
				if (!S_ISDIR(st.st_mode))
					die("--out %s: %s is not a directory", o->out, p);
				probe_writable(p);
				break;
			}
			if (errno != ENOENT)
				die("--out %s: %s: %s", o->out, p, strerror(errno));
			if (!strcmp(p, ".") || !strcmp(p, "/"))
				break;
		}
		free(p);
		return;
	}
	ckpt_ent *v;
	size_t n = list_ckpts(o->out, &v);
	if (n && !o->resume && !o->overwrite) {
		char names[256] = "";
		for (size_t i = n; i-- > 0;) { /* newest first, final/ last */
			size_t l = strlen(names);
			if (l > 200) {
				snprintf(names + l, sizeof names - l, ", ...");
				break;
			}
			snprintf(names + l, sizeof names - l, "%s%s", l ? ", " : "",
				 strrchr(v[i].name, '/') + 1);
		}
		const char *newest = v[n - 1].step >= 0 ? v[n - 1].name : v[0].name;
		die("--out %s already holds another run's checkpoints (%s): give --resume %s to "
		    "continue that run, or --overwrite to replace them", o->out, names, newest);
	}
	if (o->overwrite && !o->resume)
		for (size_t i = 0; i < n; i++) {
			bk_vec_push(&R->stale, v[i].name);
			v[i].name = NULL;
		}
	free_ckpts(v, n);
}

/* --save-total-limit: the newest N checkpoint-* of --out stay (invariant 6) */
static void rotate(run *R)
{
	long limit = R->o->save_total_limit;
	if (limit <= 0)
		return;
	ckpt_ent *v;
	size_t n = list_ckpts(R->o->out, &v), first = n && v[0].step < 0; /* final/ */
	for (size_t i = first; n - i > (size_t)limit; i++) {
		if (bk_remove_flat_dir(v[i].name) != 0)
			warn("--save-total-limit: cannot remove %s: %s", v[i].name, strerror(errno));
		for (size_t k = 0; k < R->ckpts.n; k++)
			if (!strcmp(R->ckpts.v[k], v[i].name)) {
				free(R->ckpts.v[k]);
				memmove(R->ckpts.v + k, R->ckpts.v + k + 1,
					(R->ckpts.n - k - 1) * sizeof *R->ckpts.v);
				R->ckpts.n--;
				break;
			}
	}
	free_ckpts(v, n);
}

/* ---- saving (invariants 2, 3) ---- */

static void save(run *R, const char *name)
{
	const bk_step_opts *o = R->o;
	if (R->dist.rank > 0) { /* rank 0 alone writes (invariant 8) */
		R->last_saved = R->tr->step;
		return;
	}
	char *dir = bk_path_join(o->out, name);
	R->prog.elapsed = R->elapsed0 + (now_s() - R->t0);
	/* SIGINT/SIGTERM wait until the checkpoint is complete; the first atomic write
	 * installs files.c's handlers, so ours go back before the signals do */
	sigset_t block, old;
	sigemptyset(&block);
	sigaddset(&block, SIGINT);
	sigaddset(&block, SIGTERM);
	sigprocmask(SIG_BLOCK, &block, &old);
	bk_mkdir_p(o->out);
	R->saving = xasprintf("%s.tmp.%ld", dir, (long)getpid()); /* train.c's name */
	bk_trainer_save(R->tr, R->lm.cfg, o->base_name ? o->base_name : o->model, &R->prog,
			R->set, R->n_set, dir);
	free(R->saving);
	R->saving = NULL;
	install_stop_handlers();
	sigprocmask(SIG_SETMASK, &old, NULL);
	R->last_saved = R->tr->step;
	for (size_t i = 0; i < R->stale.n; i++) { /* --overwrite: the old run goes now */
		if (strcmp(R->stale.v[i], dir) && bk_remove_flat_dir(R->stale.v[i]) != 0)
			warn("--overwrite: cannot remove %s: %s", R->stale.v[i], strerror(errno));
		free(R->stale.v[i]);
	}
	R->stale.n = 0;
	if (strcmp(name, "final")) {
		int known = 0;
		for (size_t i = 0; i < R->ckpts.n && !known; i++)
			known = !strcmp(R->ckpts.v[i], dir);
		if (!known)
			bk_vec_push(&R->ckpts, dir);
		else
			free(dir);
		rotate(R);
	} else {
		free(dir);
	}
}

static void save_checkpoint(run *R)
{
	if (R->last_saved == R->tr->step)
		return;
	char name[64];
	snprintf(name, sizeof name, "checkpoint-%lld", (long long)R->tr->step);
	save(R, name);
}

/* die() hook (invariants 3, 4): a failed save removes its temporary and is not tried
 * again; a die() after steps of this process saves them (dropping the partial
 * accumulation) and says where they are. */
static run *g_run;
static void on_die(void)
{
	run *R = g_run;
	g_run = NULL; /* a die() inside the save must not come back here */
	if (!R)
		return;
	if (R->saving) {
		bk_remove_flat_dir(R->saving);
		return;
	}
	if (!R->tr || R->tr->step == R->step0 || R->tr->step == R->last_saved ||
	    R->dist.rank > 0)
		return;
	bk_trainer_drop(R->tr);
	save_checkpoint(R);
	const char *here = R->ckpts.n ? R->ckpts.v[R->ckpts.n - 1] : "?";
	fprintf(stderr, "%s: saved the %lld %s done in %s (continue with --resume %s)\n",
		bk_prog, (long long)R->tr->step, plural(R->tr->step, "step", "steps"), here, here);
}

/* ---- resume: settings compared before anything is loaded (invariant 1) ---- */

static void add_setting(run *R, const char *key, char *value)
{
	R->set = xrealloc(R->set, (size_t)(R->n_set + 1) * sizeof(*R->set));
	R->set[R->n_set++] = (bk_train_setting){key, value};
}

static void set_setting(run *R, const char *key, const char *value)
{
	for (int i = 0; i < R->n_set; i++)
		if (!strcmp(R->set[i].key, key)) {
			free(R->set[i].value);
			R->set[i].value = xstrdup(value);
			return;
		}
	add_setting(R, key, xstrdup(value));
}

/* a target mask as "q_proj,k_proj,..." */
static void mask_names(const char *hex, char *buf, size_t n)
{
	unsigned m = (unsigned)strtoul(hex, NULL, 0);
	buf[0] = 0;
	for (int i = 0; i < BK_PEFT_NMOD; i++)
		if (m & (1u << i)) {
			size_t l = strlen(buf);
			snprintf(buf + l, n - l, "%s%s", l ? "," : "", bk_peft_mod_names[i]);
		}
}

static _Noreturn void differs(const char *dir, const char *key, const char *given,
			      const char *was)
{
	if (!strcmp(key, "model"))
		die("--resume %s: the model (%s) is not the checkpoint's (%s)", dir, given, was);
	if (!strcmp(key, "input"))
		die("--resume %s: the input is a %s, the checkpoint was trained from a %s", dir,
		    given, was);
	if (!strcmp(key, "records"))
		die("--resume %s: the stream has %s records, the checkpoint's had %s", dir, given,
		    was);
	if (!strcmp(key, "total-steps"))
		die("--resume %s: this run has %s optimizer steps (from --epochs, --max-steps "
		    "and the stream), the checkpoint's had %s", dir, given, was);
	if (!strcmp(key, "warmup-steps"))
		die("--resume %s: --warmup-steps/--warmup-ratio give %s warmup steps, the "
		    "checkpoint's %s", dir, given, was);
	if (!strcmp(key, "ranks"))
		die("--resume %s: this run has %s data-parallel ranks, the checkpoint's had %s "
		    "(resume with the same mpirun -np)", dir, given, was);
	if (!strcmp(key, "teacher"))
		die("--resume %s: the stream has %s; the checkpoint was trained on %s", dir,
		    kind_words(given), kind_words(was));
	if (!strcmp(key, "target-modules")) {
		char g[256], w[256];
		mask_names(given, g, sizeof g);
		mask_names(was, w, sizeof w);
		die("--resume %s: --target-modules %s differs from the checkpoint's %s", dir, g, w);
	}
	die("--resume %s: --%s %s differs from the checkpoint's %s", dir, key, given, was);
}

static _Noreturn void other_stream(const run *R, const char *name, const char *given,
				   const char *was)
{
	die("--resume %s: %s holds other records than the stream the checkpoint was trained "
	    "on (records hash %s, the checkpoint's %s)", R->o->resume, name, given, was);
}

static void check_resume(run *R)
{
	const char *dir = R->o->resume;
	struct stat st;
	if (stat(dir, &st) != 0)
		die("--resume %s: %s", dir, strerror(errno));
	char *path = bk_path_join(dir, "trainer_state.json");
	if (!bk_file_exists(path))
		die("--resume %s: not a checkpoint directory (no trainer_state.json)", dir);
	json_error_t err;
	json_t *js = json_load_file(path, 0, &err);
	if (!js)
		die("%s: %s", path, bk_json_error(&err));
	json_t *set = json_object_get(js, "settings");
	if (!json_is_object(set))
		die("%s: key 'settings' is missing or not an object", path);
	for (int i = 0; i < R->n_set; i++) {
		json_t *v = json_object_get(set, R->set[i].key);
		const char *was = json_is_string(v) ? json_string_value(v) : NULL;
		if (!was) /* a checkpoint from before the setting existed */
			continue;
		if (strcmp(was, R->set[i].value) && !strcmp(R->set[i].key, "stream"))
			other_stream(R, R->o->input, R->set[i].value, was);
		if (strcmp(was, R->set[i].value))
			differs(dir, R->set[i].key, R->set[i].value, was);
	}
	json_t *sh = json_object_get(set, "stream"); /* a pipe's: after its records */
	if (R->pipe && json_is_string(sh))
		R->resume_stream = xstrdup(json_string_value(sh));
	json_t *jo = json_object_get(js, "optim");
	const char *was = jo ? json_string_value(jo) : "adamw";
	if (was && strcmp(was, R->o->optim))
		die("--resume %s: --optim %s differs from the checkpoint's %s", dir, R->o->optim,
		    was);
	json_t *tk = json_object_get(set, "teacher");
	if (json_is_string(tk)) {
		if (R->kind && strcmp(R->kind, json_string_value(tk)))
			differs(dir, "teacher", R->kind, json_string_value(tk));
		R->resume_kind = xstrdup(json_string_value(tk));
	}
	json_decref(js);
	free(path);
}

/* a stream with teacher fields: the teacher's 4-bit setting (bk-teach's or bk-gen's
 * provenance load_in_4bit; a stream from before it was recorded passes) is the
 * student's, whose base must be the teacher's */
static void check_teacher_q4(run *R, const bk_reader *in)
{
	char *s = bk_reader_prov_str(in, "load_in_4bit");
	const char *mine = bk_q4_config_str(&R->o->q4);
	if (s && strcmp(s, mine))
		die("%s: the teacher field was made with the 4-bit setting %s, this run's is %s "
		    "(the student trains on the teacher's base: give the teacher's "
		    "--load-in-4bit and --bnb-4bit-* flags)", bk_reader_name(in), s, mine);
	free(s);
}

/* the stream's kind is fixed by its first record; a resumed pipe checks it there */
static void kind_seen(run *R, const bk_reader *in, const char *kind)
{
	if (!R->kind) {
		if (strcmp(kind, "exact"))
			check_teacher_q4(R, in);
		R->kind = kind;
		if (R->resume_kind && strcmp(R->resume_kind, kind))
			differs(R->o->resume, "teacher", kind, R->resume_kind);
		set_setting(R, "teacher", kind);
	} else if (strcmp(R->kind, kind)) {
		bk_reader_die(in, "%s 'teacher' field, unlike the records before it",
			      strcmp(kind, "exact") ? "has a" : "has no");
	}
}

/* ---- the stream's identity (--resume: the same records) ---- */

static void chain_record(run *R, const bk_reader *in, int mark)
{
	size_t len;
	const char *raw = bk_reader_raw(in, &len);
	R->chain = bk_hash(raw, len, R->chain);
	R->chained++;
	if (mark)
		bk_vec_push(&R->marks, ((chain_mark){R->chained, R->chain}));
}

/* a pipe: the setting 'stream' is the chain over the records of the committed steps */
static void chain_commit(run *R)
{
	size_t k = 0;
	while (k < R->marks.n && R->marks.v[k].n < R->prog.records)
		k++;
	if (k == R->marks.n || R->marks.v[k].n != R->prog.records)
		BUG("stream chain: no mark at record %lld", (long long)R->prog.records);
	char hex[17];
	bk_hash_hex(R->marks.v[k].h, hex);
	set_setting(R, "stream", hex);
	memmove(R->marks.v, R->marks.v + k + 1, (R->marks.n - k - 1) * sizeof *R->marks.v);
	R->marks.n -= k + 1;
}

static void check_ids(const bk_reader *in, const char *key, const int32_t *ids, size_t n, int V)
{
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= V)
			bk_reader_die(in, "key '%s' holds id %d, outside the vocabulary [0, %d)", key,
				      (int)ids[i], V);
}

/* train: a training record (its kind is the run's); else an --eval record */
static void load_any(run *R, const bk_reader *in, const msgpack_object *rec, slot *sl,
		     int train)
{
	size_t n;
	float temp = (float)R->o->temperature;
	sl->ns = bk_rec_ids(in, rec, "s_prompt", &sl->s, &sl->cap_s);
	if (!bk_rec_ids_opt(in, rec, "resp", &sl->r, &sl->cap_r, &sl->nr))
		bk_reader_die(in, "no 'resp' field (prompts-only records need bk-gen first)");
	sl->has_tc = bk_teacher_read(in, rec, &sl->tc);
	/* the model's vocabulary, before any step (a file, --eval) or this record's (a
	 * pipe): the ids and the teacher's distribution */
	int V = R->lm.cfg->vocab_size;
	check_ids(in, "s_prompt", sl->s, sl->ns, V);
	check_ids(in, "resp", sl->r, sl->nr, V);
	if (sl->has_tc && sl->tc.v != V)
		bk_reader_die(in, "key 'teacher' is over a vocabulary of %d, the model's is %d",
			      sl->tc.v, V);
	if (train)
		kind_seen(R, in, slot_kind(sl));
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
	check_ids(in, "t_prompt", sl->t, sl->nt, V);
	if (sl->nr && (!sl->ns || (!sl->has_tc && !sl->nt)))
		bk_reader_die(in, "empty prompt: no position predicts the first response token");
	char buf[160];
	const char *msg = bk_config_check_len(R->lm.cfg, (long)(sl->ns + sl->nr),
					      "student sequence", buf, sizeof buf);
	if (!msg && !sl->has_tc)
		msg = bk_config_check_len(R->lm.cfg, (long)(sl->nt + sl->nr), "teacher sequence",
					  buf, sizeof buf);
	if (msg)
		bk_reader_die(in, "%s", msg);
	sl->has_batch = bk_rec_int_opt(in, rec, "batch", &sl->batch);
}

static void load_slot(run *R, const bk_reader *in, const msgpack_object *rec, slot *sl)
{
	load_any(R, in, rec, sl, 1);
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

/* ---- steps ---- */

/* the progress line: live on a terminal, a plain line every --log-every seconds
 * otherwise (a log file or a batch system's output) */
static void progress_line(run *R, double loss, double t)
{
	int64_t step = R->tr->step;
	int plain = !R->tty;
	if (R->dist.rank > 0)
		return;
	if (plain && (R->o->log_every <= 0 || t - R->last_line < R->o->log_every))
		return;
	char eta[32] = "?";
	double per = (t - R->t0) / (double)(step - R->step0);
	if (R->total)
		bk_progress_hms(per * (double)(R->total - step), eta, sizeof eta);
	double el = R->elapsed0 + t - R->t0;
	fprintf(stderr, "%s%s: step %lld/%lld  loss %.4f  %.0f tok/s  ETA %s%s",
		plain ? "" : "\r", bk_prog, (long long)step, (long long)R->total, loss,
		(double)R->prog.tokens / (el > 0 ? el : 1), eta, plain ? "\n" : "   ");
	R->last_line = t;
}

/* data parallel: the step's gradients, micro-batch count, loss, records, tokens and
 * stop requests summed over the ranks, so every rank takes the same step (invariant 8):
 * the gradients by NCCL on the devices (its order, the same on every rank) or over MPI
 * through host memory in rank order; the five counters always over MPI */
static void reduce_step(run *R)
{
	bk_trainer *tr = R->tr;
	const bk_ops *ops = tr->m->ops;
	size_t n = tr->grads->n_flat;
	if (R->nccl) {
		bk_nccl_sum_f32(R->nccl, tr->grads->flat, n);
	} else {
		if (!R->gbuf)
			R->gbuf = xmalloc(n * sizeof(float));
		ops->download(R->gbuf, tr->grads->flat, n * sizeof(float));
		bk_dist_sum_f32(&R->dist, R->gbuf, n);
		ops->upload(tr->grads->flat, R->gbuf, n * sizeof(float));
	}
	double c[5] = {tr->n_micro, R->step_loss, (double)R->step_records,
		       (double)R->step_tokens, stop_signal ? 1 : 0};
	bk_dist_sum_f64(&R->dist, c, 5);
	tr->n_micro = (int)c[0];
	R->step_loss = c[1];
	R->step_records = (int64_t)c[2];
	R->step_tokens = (int64_t)c[3];
	/* every rank stops after this step if any was asked to; a signal that arrives
	 * later counts at the next step, so no rank waits in a reduction alone */
	R->stop_agreed = c[4] > 0;
	if (R->stop_agreed && !stop_signal)
		stop_signal = SIGTERM;
}

/* ---- validation loss (--eval) ---- */

/* the --eval records, checked as the training stream is (model, system prompt,
 * temperature) and of one kind, before anything is trained (invariant 1) */
static void check_stream(run *R, bk_reader *in);
static void load_eval(run *R)
{
	const bk_step_opts *o = R->o;
	bk_reader *in = bk_reader_open(o->eval);
	check_stream(R, in);
	const msgpack_object *rec;
	const char *kind = NULL;
	while ((rec = bk_reader_next(in))) {
		slot *sl = mb_slot(&R->ev, R->ev.n);
		load_any(R, in, rec, sl, 0);
		if (kind && strcmp(kind, slot_kind(sl)))
			bk_reader_die(in, "%s, unlike the records before it (--eval records are "
				      "of one kind)", kind_words(slot_kind(sl)));
		kind = slot_kind(sl);
		R->ev.n++;
	}
	if (!R->ev.n)
		die("--eval %s: no records", o->eval);
	int64_t resp = 0;
	for (int i = 0; i < R->ev.n; i++)
		resp += (int64_t)R->ev.v[i].nr;
	if (!resp) /* every batch's loss would be 0: an eval_loss of 0 that means nothing */
		die("--eval %s: no response tokens in its %d %s (every 'resp' is empty): nothing "
		    "to evaluate", o->eval, R->ev.n, plural(R->ev.n, "record", "records"));
	if (strcmp(kind, "exact"))
		check_teacher_q4(R, in);
	bk_reader_close(in);
}

/* The validation loss as HF's evaluation loop takes it with the tool's loss: the
 * records in file order in batches of --eval-batch-size, each batch's loss the mean
 * over its records with a response of their per-token KL (0 when none has one), and
 * eval_loss the mean over the batches (HF repeats each batch's loss batch-size times,
 * the last partial batch too).  No dropout, no gradient.  One metrics record; rank 0
 * alone (every rank holds the same adapter). */
static void evaluate(run *R, double epoch_pos)
{
	const bk_step_opts *o = R->o;
	R->last_eval = R->tr->step;
	if (R->dist.rank > 0)
		return;
	double t0 = now_s(), sum = 0;
	int64_t nb = 0;
	for (int b = 0; b < R->ev.n; b += (int)o->eval_batch) {
		int n = R->ev.n - b < o->eval_batch ? R->ev.n - b : (int)o->eval_batch;
		for (int i = b; i < b + n; i++) {
			slot *sl = &R->ev.v[i];
			R->ev.smp[i] = (bk_train_sample){sl->s, sl->t, sl->r, (int)sl->ns, (int)sl->nt,
							 (int)sl->nr, sl->has_tc ? &sl->tc : NULL};
		}
		bk_train_micro_info info;
		bk_trainer_eval(R->tr, R->ev.smp + b, n, &info);
		sum += info.loss;
		nb++;
	}
	double loss = sum / (double)nb, dt = now_s() - t0;
	R->log_t0 += dt; /* tokens_per_s counts training time */
	if (!bk_writer_dead(R->w)) {
		msgpack_packer *pk = bk_rec_begin(R->w);
		bk_rec_key(R->w, "step");
		msgpack_pack_int64(pk, R->tr->step);
		bk_rec_key(R->w, "epoch");
		msgpack_pack_double(pk, epoch_pos);
		bk_rec_key(R->w, "eval_loss");
		msgpack_pack_double(pk, loss);
		bk_rec_key(R->w, "eval_samples");
		msgpack_pack_int64(pk, R->ev.n);
		bk_rec_key(R->w, "eval_runtime");
		msgpack_pack_double(pk, dt);
		bk_rec_key(R->w, "eval_samples_per_second");
		msgpack_pack_double(pk, dt > 0 ? R->ev.n / dt : 0);
		bk_rec_key(R->w, "eval_steps_per_second");
		msgpack_pack_double(pk, dt > 0 ? nb / dt : 0);
		bk_rec_end(R->w);
	}
	fprintf(stderr, "%s%s: step %lld  eval_loss %.6g  (%d records, %.1f s)\n",
		R->tty ? "\n" : "", bk_prog, (long long)R->tr->step, loss, R->ev.n, dt);
}

/* ends the optimizer step: AdamW, progress, metrics record, progress line, save */
static void finish_step(run *R, double epoch_pos)
{
	if (R->dist.size > 1 || R->nccl)
		reduce_step(R);
	int n_micro = R->tr->n_micro;
	double lr, norm = bk_trainer_step(R->tr, &lr), loss = R->step_loss / n_micro;
	bk_train_progress *p = &R->prog;
	p->micro_in_epoch += n_micro;
	p->records_in_epoch += R->step_records;
	p->records += R->step_records;
	p->tokens += R->step_tokens;
	p->loss_sum += loss;
	if (R->pipe)
		chain_commit(R);
	R->log_loss += loss;
	R->log_steps++;
	R->log_tokens += R->step_tokens;
	R->step_loss = 0;
	R->step_records = R->step_tokens = 0;
	int64_t step = R->tr->step;
	double t = now_s();
	if (step % R->o->logging_steps == 0 && !bk_writer_dead(R->w)) {
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
	}
	if (step % R->o->logging_steps == 0) { /* trainer_state.json's, as HF's */
		if (!p->log_history)
			p->log_history = json_array();
		json_array_append_new(p->log_history,
				      json_pack("{s:f, s:f, s:f, s:f, s:I}", "epoch", epoch_pos,
						"grad_norm", norm, "learning_rate", lr, "loss",
						R->log_loss / R->log_steps, "step", (json_int_t)step));
		R->log_loss = 0;
		R->log_steps = R->log_tokens = 0;
		R->log_t0 = t;
	}
	progress_line(R, loss, t);
	R->last_epoch_pos = epoch_pos;
	/* as HF's _maybe_log_save_evaluate: log, evaluate, save */
	if (R->ev.n && R->o->eval_steps > 0 && step % R->o->eval_steps == 0 &&
	    step >= R->o->eval_delay)
		evaluate(R, epoch_pos);
	if (R->o->save_steps > 0 && step % R->o->save_steps == 0)
		save_checkpoint(R);
}

/* forward + backward of one micro-batch of mb->n records into the accumulation */
static void micro_only(run *R, mbatch *mb)
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
}

/* one micro-batch; steps when the accumulation is full or when force_step (the last
 * micro-batch of the stream) */
static void train_micro(run *R, mbatch *mb, int force_step, double epoch_pos)
{
	micro_only(R, mb);
	if (R->tr->n_micro >= R->o->grad_accum || force_step)
		finish_step(R, epoch_pos);
}

/* after a micro-batch: stop for a signal (dropping a partial accumulation) or at
 * --max-steps; returns 1 to stop */
static int should_stop(run *R)
{
	if (R->total && R->tr->step >= R->total)
		return 1; /* done: a signal now changes nothing, final/ is written */
	if (R->dist.size > 1 ? R->stop_agreed : stop_signal != 0) {
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

static void longest_sum(long *v, size_t n, long k_max, long *max_T)
{
	long sum = 0;
	for (long k = 0; k < k_max && k < (long)n; k++) {
		size_t best = (size_t)k;
		for (size_t i = (size_t)k + 1; i < n; i++)
			if (v[i] > v[best])
				best = i;
		long x = v[best];
		v[best] = v[k], v[k] = x;
		sum += x;
	}
	if (sum > *max_T)
		*max_T = sum;
}

/* pass 1: validates every record, notes offsets, groups and the largest batch (the
 * file was verified whole when it was opened: stream.c invariant 5) */
static void index_file(run *R, bk_reader *in, file_index *fx)
{
	const bk_step_opts *o = R->o;
	fx->map = bk_map_file(o->input);
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	size_t off = 0;
	if (msgpack_unpack_next(&up, (const char *)fx->map.data, fx->map.len, &off) !=
	    MSGPACK_UNPACK_SUCCESS)
		die("%s: header does not parse", o->input);
	msgpack_unpacked_destroy(&up);
	slot sl = {0};
	const msgpack_object *rec;
	BK_VEC(long) ls = {0};
	int64_t prev_batch = 0;
	long sum_s = 0, max_T = 1; /* the student's micro-batch, or one teacher sequence
				    * (exact mode: gpu/train.c teacher_rows) */
	bk_batch_order bo = {0};
	while ((rec = bk_reader_next(in))) {
		load_slot(R, in, rec, &sl);
		if (!o->batch_size) /* a batch that comes back is refused */
			bk_batch_next(&bo, in, rec, &sl.batch);
		size_t len;
		const char *raw = bk_reader_raw(in, &len);
		if (off + len > fx->map.len || memcmp(fx->map.data + off, raw, len))
			die("%s: changed while being read", o->input);
		chain_record(R, in, 0);
		if (!o->batch_size && !sl.has_batch)
			bk_reader_die(in, "no 'batch' field: plan batches with bk-lens or give "
				      "--batch-size");
		if (!o->batch_size && (!fx->nrec || sl.batch != prev_batch)) {
			bk_vec_push(&fx->group, fx->nrec);
			if (sum_s > max_T)
				max_T = sum_s;
			sum_s = 0;
		}
		prev_batch = sl.batch;
		long s = (long)(sl.ns + sl.nr), t = sl.has_tc ? 0 : (long)(sl.nt + sl.nr);
		if (sl.nr) { /* empty responses are dropped from the forward */
			sum_s += s;
			bk_vec_push(&ls, s);
			if (t > max_T)
				max_T = t;
		}
		bk_vec_push(&fx->off, off);
		bk_vec_push(&fx->len, len);
		off += len;
		fx->nrec++;
	}
	if (sum_s > max_T)
		max_T = sum_s;
	bk_vec_push(&fx->group, fx->nrec);
	if (o->batch_size) /* any N records can meet: the N longest */
		longest_sum(ls.v, ls.n, o->batch_size, &max_T);
	if (max_T > (1L << 30))
		die("%s: a micro-batch of %ld tokens is too large", o->input, max_T);
	fx->max_T = (int)max_T;
	free(ls.v);
	free(sl.s), free(sl.t), free(sl.r);
	bk_teacher_free(&sl.tc);
	bk_batch_order_free(&bo);
}

static size_t micro_per_epoch(const file_index *fx, const bk_step_opts *o)
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
static void plan_epoch(const file_index *fx, const bk_step_opts *o, uint64_t seed,
		       int64_t ep, size_t *order, size_t *bounds)
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
	const bk_step_opts *o = R->o;
	size_t nmb = micro_per_epoch(fx, o);
	size_t *order = xmalloc((fx->nrec ? fx->nrec : 1) * sizeof *order);
	size_t *bounds = xmalloc((nmb + 1) * sizeof *bounds);
	mbatch mb = {0};
	msgpack_unpacked up;
	msgpack_unpacked_init(&up);
	int stop = 0;
	/* a step is a window of N x G micro-batches (N ranks, G = --grad-accum); rank r
	 * trains micro-batches r, r+N, ... of it (invariant 8; N = 1: all of them) */
	size_t N = (size_t)R->dist.size, win = N * (size_t)o->grad_accum;
	R->tr->micro_base = R->dist.rank;
	R->tr->micro_stride = R->dist.size;
	for (int64_t ep = R->prog.epoch; ep < n_epochs && !stop; ep++) {
		plan_epoch(fx, o, R->prog.order_seed, ep, order, bounds);
		size_t b = (size_t)R->prog.micro_in_epoch;
		while (b < nmb && !stop) {
			size_t e = nmb - b > win ? b + win : nmb;
			for (size_t j = b + (size_t)R->dist.rank; j < e && !stop; j += N) {
				mb.n = 0;
				for (size_t k = bounds[j]; k < bounds[j + 1]; k++) {
					size_t i = order[k], pos = 0;
					if (msgpack_unpack_next(&up, (const char *)fx->map.data +
								     fx->off.v[i],
								fx->len.v[i], &pos) != MSGPACK_UNPACK_SUCCESS)
						BUG("indexed record %zu does not parse", i);
					load_slot(R, in, &up.data, mb_slot(&mb, mb.n));
					mb.n++;
				}
				micro_only(R, &mb);
				if (N == 1) /* one process: a signal drops the partial step */
					stop = should_stop(R);
			}
			if (stop)
				break;
			finish_step(R, (double)ep + (double)e / (double)nmb);
			b = e;
			stop = should_stop(R);
		}
		if (!stop || (!R->interrupted && R->prog.micro_in_epoch == (int64_t)nmb)) {
			/* the epoch is complete: without --save-steps its end is a checkpoint
			 * (HF's save_strategy epoch; a partial last one's: bk_step_run's at the
			 * end of the run); with it, not (HF's steps: every N steps and the end
			 * of training only) */
			R->prog.epoch = ep + 1;
			R->prog.micro_in_epoch = 0;
			R->prog.records_in_epoch = 0;
			if (!o->save_steps)
				save_checkpoint(R);
		}
	}
	msgpack_unpacked_destroy(&up);
	mb_free(&mb);
	free(order);
	free(bounds);
}

/* ---- resume: the checkpoint's progress against this run's plan ---- */

/* a resumed run's progress (train.c checked each field on its own) must be the one
 * this run reaches at the checkpoint's step: the epoch order's seed, and over a file
 * the epoch, its micro-batches and records under the plan (fx; NULL: a pipe) */
static void check_progress(run *R, const file_index *fx)
{
	const bk_step_opts *o = R->o;
	const bk_train_progress *p = &R->prog;
	char *path = bk_path_join(o->resume, "trainer_state.json");
	long long step = (long long)R->tr->step;
	if (p->order_seed != (uint64_t)o->seed)
		die("%s: key 'progress.order_seed' is %llu, this run's (--seed) %ld", path,
		    (unsigned long long)p->order_seed, o->seed);
	if (!fx) { /* a pipe: one pass, grad_accum micro-batches a step but the last */
		long long ga = o->grad_accum, m = p->micro_in_epoch;
		if (p->epoch != 0)
			die("%s: key 'progress.epoch' is %lld, a run over a pipe has epoch 0", path,
			    (long long)p->epoch);
		if (p->records_in_epoch != p->records)
			die("%s: key 'progress.records_in_epoch' is %lld, over a pipe it is "
			    "'progress.records' %lld", path, (long long)p->records_in_epoch,
			    (long long)p->records);
		if (m > step * ga || (step > 0 && m <= (step - 1) * ga)) {
			char also[64] = "";
			if (ga > 1 && step > 0) /* the step at the end of the stream */
				snprintf(also, sizeof also, " (the last of them %lld to %lld)",
					 (step - 1) * ga + 1, step * ga);
			die("%s: key 'progress.micro_in_epoch' is %lld, %lld %s at --grad-accum %lld "
			    "train %lld micro-batches%s", path, m, step, plural(step, "step", "steps"),
			    ga, step * ga, also);
		}
		if (p->records < m || (o->batch_size && p->records > m * o->batch_size))
			die("%s: key 'progress.records' is %lld, not what %lld micro-batches hold",
			    path, (long long)p->records, m);
		free(path);
		return;
	}
	size_t nmb = micro_per_epoch(fx, o), win = (size_t)o->grad_accum * (size_t)R->dist.size;
	long long spe = (long long)((nmb + win - 1) / win), ep = step / spe, k = step % spe;
	if (k == 0 && step > 0 && p->epoch == ep - 1)
		ep--, k = spe; /* stopped at the end of an epoch before it was closed */
	if (p->epoch != ep)
		die("%s: key 'progress.epoch' is %lld, step %lld is in epoch %lld (%lld %s an "
		    "epoch)", path, (long long)p->epoch, step, ep, spe, plural(spe, "step", "steps"));
	size_t want = (size_t)k * win < nmb ? (size_t)k * win : nmb;
	if (p->micro_in_epoch != (int64_t)want)
		die("%s: key 'progress.micro_in_epoch' is %lld, step %lld has trained %zu of epoch "
		    "%lld's %zu micro-batches", path, (long long)p->micro_in_epoch, step, want, ep,
		    nmb);
	size_t *order = xmalloc((fx->nrec ? fx->nrec : 1) * sizeof *order);
	size_t *bounds = xmalloc((nmb + 1) * sizeof *bounds);
	plan_epoch(fx, o, p->order_seed, p->epoch, order, bounds);
	int64_t recs = (int64_t)bounds[want];
	free(order);
	free(bounds);
	if (p->records_in_epoch != recs)
		die("%s: key 'progress.records_in_epoch' is %lld, the first %zu micro-batches of "
		    "epoch %lld hold %lld records", path, (long long)p->records_in_epoch, want, ep,
		    (long long)recs);
	if (p->records != p->epoch * (int64_t)fx->nrec + recs)
		die("%s: key 'progress.records' is %lld, %lld %s of %zu records and %lld make %lld",
		    path, (long long)p->records, (long long)p->epoch,
		    plural(p->epoch, "epoch", "epochs"), fx->nrec, (long long)recs,
		    (long long)(p->epoch * (int64_t)fx->nrec + recs));
	free(path);
}

/* ---- pipe: one pass, micro-batches formed as records arrive ---- */

static void train_pipe(run *R, bk_reader *in)
{
	const bk_step_opts *o = R->o;
	mbatch mb = {0};
	bk_batch_order bo = {0};
	const msgpack_object *rec;
	int64_t skip = R->prog.records, epoch_field = 0;
	while (skip > 0 && (rec = bk_reader_next(in))) {
		chain_record(R, in, 0);
		skip--;
	}
	if (skip > 0)
		die("--resume %s: the stream ends before the %lld records the checkpoint "
		    "consumed", o->resume, (long long)R->prog.records);
	if (R->resume_stream && R->prog.records) { /* the records the checkpoint trained on */
		char hex[17];
		bk_hash_hex(R->chain, hex);
		if (strcmp(hex, R->resume_stream))
			other_stream(R, bk_reader_name(in), hex, R->resume_stream);
	}
	if (o->resume)
		fprintf(stderr, "%s: resuming from %s at step %lld\n", bk_prog, o->resume,
			(long long)R->tr->step);
	int stop = 0;
	while (!stop) {
		rec = bk_reader_next(in);
		if (rec) {
			chain_record(R, in, 1);
			slot *s = mb_slot(&mb, mb.n);
			load_slot(R, in, rec, s);
			if (!o->batch_size && !s->has_batch)
				bk_reader_die(in, "no 'batch' field: plan batches with bk-lens or "
					      "give --batch-size");
			if (!o->batch_size) /* a batch that comes back is refused */
				bk_batch_next(&bo, in, rec, &s->batch);
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
	bk_batch_order_free(&bo);
}

/* ---- the whole run ---- */

static void check_stream(run *R, bk_reader *in)
{
	const bk_step_opts *o = R->o;
	char *tok = bk_tok_file(o->model); /* tokenizer.json, else tokenizer.model */
	if (bk_file_exists(tok))
		bk_reader_expect_file(in, "tokenizer", tok, "tokenizer");
	free(tok);
	bk_reader_expect(in, "model", R->lm.fingerprint, "model");
	if (o->system)
		bk_reader_expect_system(in, o->system);
	double t;
	if (bk_obj_number(bk_reader_prov(in, "temperature"), &t)) {
		if (fabs(t - o->temperature) > 1e-6 * fmax(1, o->temperature))
			die("%s: stream was made with teacher temperature %g, given --temperature %g",
			    bk_reader_name(in), t, o->temperature);
	}
}

static void add_settings(run *R, int is_file, size_t nrec, int64_t warmup)
{
	const bk_step_opts *o = R->o;
	/* the flags that change the result must not change on --resume */
	add_setting(R, "model", xstrdup(R->lm.fingerprint));
	/* the base's family, for bk-merge and bk-eval (bk_adapter_check_base) */
	add_setting(R, "model-type", xstrdup(R->lm.cfg->model_type ? R->lm.cfg->model_type : "-"));
	add_setting(R, "input", xstrdup(is_file ? "file" : "pipe"));
	add_setting(R, "ranks", xasprintf("%d", R->dist.size)); /* before what it changes */
	add_setting(R, "records", is_file ? xasprintf("%zu", nrec) : xstrdup("-"));
	if (is_file) { /* a pipe's is set at each step (chain_commit) */
		char hex[17];
		bk_hash_hex(R->chain, hex);
		add_setting(R, "stream", xstrdup(hex));
	}
	add_setting(R, "batch-size", o->batch_size ? xasprintf("%ld", o->batch_size)
						   : xstrdup("bk-lens"));
	add_setting(R, "grad-accum", xasprintf("%ld", o->grad_accum));
	add_setting(R, "total-steps", xasprintf("%lld", (long long)R->total));
	add_setting(R, "warmup-steps", xasprintf("%lld", (long long)warmup));
	add_setting(R, "lr", xasprintf("%.17g", o->lr));
	add_setting(R, "schedule", xstrdup(o->schedule));
	add_setting(R, "weight-decay", xasprintf("%.17g", o->weight_decay));
	add_setting(R, "max-grad-norm", xasprintf("%.17g", o->max_grad_norm));
	add_setting(R, "lora-r", xasprintf("%ld", o->lora_r));
	add_setting(R, "lora-alpha", xasprintf("%.17g", o->lora_alpha));
	add_setting(R, "lora-dropout", xasprintf("%.17g", o->lora_dropout));
	add_setting(R, "target-modules", xasprintf("%#x", o->target_mask));
	add_setting(R, "temperature", xasprintf("%.17g", o->temperature));
	add_setting(R, "seed", xasprintf("%ld", o->seed));
	add_setting(R, "vocab-chunk", xasprintf("%ld", o->vocab_chunk));
	add_setting(R, "load-in-4bit", xstrdup(bk_q4_config_str(&o->q4)));
	/* double quantisation's torch thread count (0: none): a resume adopts it, so it
	 * quantises as the checkpoint's run did on any machine (bk_step_run) */
	add_setting(R, "torch-threads", xasprintf("%d", bk_q4_config_threads(&R->q4)));
	if (R->kind)
		add_setting(R, "teacher", xstrdup(R->kind));
}

static void write_final_record(run *R, const char *final)
{
	if (bk_writer_dead(R->w))
		return;
	msgpack_packer *pk = bk_rec_begin(R->w);
	bk_rec_key(R->w, "checkpoints");
	msgpack_pack_array(pk, R->ckpts.n);
	for (size_t i = 0; i < R->ckpts.n; i++)
		bk_pack_str(pk, R->ckpts.v[i]);
	bk_rec_key(R->w, "final");
	if (final)
		bk_pack_str(pk, final);
	else
		msgpack_pack_nil(pk);
	bk_rec_end(R->w);
}

/* one GPU per rank of a machine: the local rank's entry of CUDA_VISIBLE_DEVICES (or
 * GPU local_rank when it is unset), set before the CUDA runtime starts */
static void pick_gpu(int local_rank)
{
	const char *vis = getenv("CUDA_VISIBLE_DEVICES");
	char buf[32];
	if (!vis || !*vis) {
		snprintf(buf, sizeof buf, "%d", local_rank);
		setenv("CUDA_VISIBLE_DEVICES", buf, 1);
		return;
	}
	const char *p = vis;
	for (int i = 0; i < local_rank && p; i++) {
		p = strchr(p, ',');
		if (p)
			p++;
	}
	if (!p)
		return; /* fewer GPUs than ranks: the launcher's choice stands */
	size_t n = strcspn(p, ",");
	char *one = xstrndup(p, n);
	setenv("CUDA_VISIBLE_DEVICES", one, 1);
	free(one);
}

int bk_step_run(const bk_step_opts *o)
{
	run R = {.o = o, .last_saved = -1, .last_eval = -1};
	bk_dist_init(&R.dist);
	int is_file = strcmp(o->input, "-") != 0;
	struct stat sb;
	if (is_file && stat(o->input, &sb) == 0 && !S_ISREG(sb.st_mode))
		is_file = 0; /* a FIFO or /dev/stdin: read once, like a pipe */
	if (R.dist.size > 1 && !is_file)
		die("%d ranks need a STREAM file that every rank reads (a launcher gives standard "
		    "input to rank 0 only)", R.dist.size);
	if (R.dist.size > 1)
		pick_gpu(R.dist.local_rank);
	if (!is_file && o->epochs > 1)
		die_usage("--epochs %ld needs a STREAM file; a pipe is read once (bk-gen "
			  "--epochs makes fresh trajectories per epoch)", o->epochs);
	check_out(&R);
	if (!R.dist.rank) /* one run at a time in --out (rank 0 alone writes there) */
		bk_dir_lock(o->out, "bk-step", "--out");

	R.pipe = !is_file;
	const bk_ops *ops = bk_device_select(o->device);
	bk_reader *in = bk_reader_open(o->input); /* a file: verified whole here */
	/* double quantisation's thread count: a resume's checkpoint's, else the stage's
	 * before this one (its stream's provenance), else this machine's (gpu/load.h) */
	R.q4 = o->q4;
	if (!o->resume || !bk_q4_adopt_dir(&R.q4, o->resume))
		bk_q4_adopt_stream(&R.q4, in);
	R.lm = bk_model_load_q4(ops, o->model, &R.q4);
	check_stream(&R, in);
	if (o->eval)
		load_eval(&R);
	R.nccl = bk_nccl_open(&R.dist, ops); /* the path of the gradient sum; says which */

	/* the plan: micro-batches per epoch and optimizer steps */
	file_index fx = {0};
	int64_t n_epochs = 1;
	if (is_file) {
		index_file(&R, in, &fx);
		size_t nmb = micro_per_epoch(&fx, o);
		if (!nmb)
			die("%s: no records to train on", o->input);
		size_t win = (size_t)o->grad_accum * (size_t)R.dist.size; /* invariant 8 */
		int64_t spe = (int64_t)((nmb + win - 1) / win);
		n_epochs = o->max_steps ? (o->max_steps + spe - 1) / spe : o->epochs;
		R.total = o->max_steps ? o->max_steps : o->epochs * spe;
	} else {
		R.total = o->max_steps;
		if (!R.total && (o->sched == BK_SCHED_LINEAR || o->sched == BK_SCHED_COSINE))
			die("a %s schedule over a pipe needs --max-steps (the number of steps is "
			    "not known before the stream ends); give a STREAM file or --schedule "
			    "constant", o->schedule);
		if (!R.total && o->warmup_ratio > 0)
			die("--warmup-ratio over a pipe needs --max-steps; or give --warmup-steps");
	}
	bk_train_opts to = {
		.r = (int)o->lora_r, .alpha = (float)o->lora_alpha,
		.dropout = (float)o->lora_dropout, .targets = o->target_mask, .lr = o->lr,
		.weight_decay = o->weight_decay, .max_grad_norm = o->max_grad_norm,
		.sched = o->sched, .warmup = bk_warmup_steps(o->warmup_steps, o->warmup_ratio, R.total),
		.total = R.total, .temperature = (float)o->temperature, .seed = (uint64_t)o->seed,
		.vocab_chunk = (int)o->vocab_chunk, .optim = o->optim_kind,
		.grad_checkpoint = o->grad_ckpt_every >= 2 ? (int)o->grad_ckpt_every
							   : o->grad_checkpoint};
	add_settings(&R, is_file, fx.nrec, to.warmup);
	R.prog.order_seed = (uint64_t)o->seed;
	if (o->resume)
		check_resume(&R); /* before anything is loaded (invariant 1) */
	R.tr = bk_trainer_create(R.lm.model, &to);
	if (is_file)
		bk_trainer_reserve(R.tr, fx.max_T);
	if (o->resume) {
		bk_trainer_resume(R.tr, R.lm.cfg, o->resume, &R.prog, R.set, R.n_set);
		check_progress(&R, is_file ? &fx : NULL);
		/* a pipe's once its records are checked, unless nothing is left to train */
		if (!R.dist.rank && (is_file || (R.total && R.tr->step >= R.total)))
			fprintf(stderr, "%s: resuming from %s at step %lld\n", bk_prog, o->resume,
				(long long)R.tr->step);
		R.last_saved = R.tr->step;
	}
	R.step0 = R.tr->step;
	R.adam0 = R.tr->opt.step;
	g_run = &R;
	bk_die_hook = on_die;

	R.w = bk_writer_open(R.dist.rank ? "/dev/null" : "-"); /* rank 0 writes metrics */
	bk_writer_optional(R.w, "metrics stream");
	bk_kv kv[] = {BK_KV_S("model", R.lm.fingerprint), BK_KV_D("temperature", o->temperature),
		      BK_KV_D("lr", o->lr), BK_KV_S("schedule", o->schedule),
		      BK_KV_I("lora_r", o->lora_r), BK_KV_D("lora_alpha", o->lora_alpha),
		      BK_KV_I("seed", o->seed), BK_KV_I("total_steps", R.total)};
	bk_writer_header(R.w, in, kv, 8);
	install_stop_handlers();
	R.tty = isatty(2);
	R.t0 = R.log_t0 = R.last_line = now_s();
	R.elapsed0 = R.prog.elapsed;

	if (!R.total || R.tr->step < R.total) {
		if (is_file)
			train_file(&R, in, &fx, n_epochs);
		else
			train_pipe(&R, in);
	}
	if (R.tty && R.tr->step > R.step0)
		fputc('\n', stderr);
	int64_t steps = R.tr->step - R.step0, applied = R.tr->opt.step - R.adam0;
	if (steps > 0 && applied == 0) {
		g_run = NULL; /* invariant 7: nothing of this run is a result */
		die("all %lld %s had a non-finite gradient norm: no update was applied, nothing "
		    "saved", (long long)steps, plural(steps, "step", "steps"));
	}
	if (applied < steps && !R.dist.rank)
		warn("%lld of %lld steps were skipped (non-finite gradient norm)",
		     (long long)(steps - applied), (long long)steps);
	if (!R.interrupted && steps == 0 && !o->resume)
		die("%s: no records to train on", bk_reader_name(in)); /* nothing to save */
	/* --eval-final: after the last step, unless it was just evaluated (HF's epoch
	 * strategy evaluates at the end of every epoch, the last partial one too) */
	if (!R.interrupted && R.ev.n && o->eval_final && steps > 0 &&
	    R.last_eval != R.tr->step && R.tr->step >= o->eval_delay)
		evaluate(&R, R.last_epoch_pos);
	/* the end of the run is a checkpoint too, after its evaluation, as HF's Trainer
	 * saves at the end of training (save_strategy steps: --save-steps) and at the end
	 * of the last epoch, a partial one (--max-steps) included (epoch): over a file
	 * always; over a pipe, with --save-steps */
	if (!R.interrupted && steps > 0 && (is_file || o->save_steps > 0))
		save_checkpoint(&R);
	char *final = NULL;
	if (R.interrupted) {
		save_checkpoint(&R);
	} else {
		save(&R, "final");
		final = bk_path_join(o->out, "final");
	}
	g_run = NULL;
	write_final_record(&R, final);
	bk_writer_close(R.w);

	double el = now_s() - R.t0;
	if (R.dist.rank > 0)
		goto done; /* rank 0 speaks for the run */
	/* the checkpoint holding the current step: the last one saved, or the one this
	 * run resumed from when it was stopped before its first new step */
	const char *here = R.ckpts.n ? R.ckpts.v[R.ckpts.n - 1] : o->resume;
	if (R.interrupted && steps == 0)
		fprintf(stderr, "%s: interrupted by signal %d before the first step; nothing "
			"saved%s%s\n", bk_prog, (int)stop_signal, here ? "; resume with --resume " : "",
			here ? here : "");
	else if (R.interrupted)
		fprintf(stderr, "%s: interrupted by signal %d at step %lld; saved %s (continue "
			"with --resume %s)\n", bk_prog, (int)stop_signal, (long long)R.tr->step,
			here, here);
	else
		fprintf(stderr, "%s: %lld %s in %.1f s, mean loss %.4f, %.0f tokens/s; adapter "
			"in %s\n", bk_prog, (long long)steps, plural(steps, "step", "steps"), el,
			R.tr->step ? R.prog.loss_sum / (double)R.tr->step : 0.0,
			R.prog.elapsed > 0 ? (double)R.prog.tokens / R.prog.elapsed : 0.0, final);
	if (R.dist.size > 1)
		fprintf(stderr, "%s: %d data-parallel ranks\n", bk_prog, R.dist.size);
done:
	free(final);
	free(R.gbuf);
	bk_nccl_close(R.nccl);
	for (size_t i = 0; i < R.ckpts.n; i++)
		free(R.ckpts.v[i]);
	free(R.ckpts.v);
	for (size_t i = 0; i < R.stale.n; i++)
		free(R.stale.v[i]);
	free(R.stale.v);
	for (int i = 0; i < R.n_set; i++)
		free(R.set[i].value);
	free(R.set);
	free(R.resume_kind);
	free(R.resume_stream);
	free(R.marks.v);
	json_decref(R.prog.log_history);
	mb_free(&R.ev);
	bk_trainer_free(R.tr);
	bk_model_unload(&R.lm);
	bk_reader_close(in);
	if (is_file) {
		bk_unmap(&fx.map);
		free(fx.off.v), free(fx.len.v), free(fx.group.v);
	}
	bk_dist_barrier(&R.dist); /* rank 0's final/ is complete when any rank exits */
	bk_dist_finish(&R.dist);
	return 0;
}
