/* bk-bake - a whole bake from the reference tool's flat YAML config: maps its fields
 * onto the stages (formats/config_yaml.c), runs bk-tokenize, writes the epochs'
 * prompt order, runs bk-lens | bk-gen | bk-teach | bk-step as processes joined by
 * pipes, then bk-eval, and leaves output_dir in the tool's layout (formats/bakeout.c).
 * No model code here: only processes, files and a summary. */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/progress.h"
#include "formats/bakeout.h"
#include "formats/config_yaml.h"
#include "formats/stream.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <msgpack.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
	"usage: bk-bake [--dry-run] [-v] CONFIG [--FIELD VALUE]...\n"
	"       bk-bake --fields\n"
	"Bakes the system prompt of CONFIG (the Python tool's flat YAML config) into a\n"
	"LoRA adapter: bk-tokenize, then bk-lens | bk-gen | bk-teach | bk-step in one pipe,\n"
	"then bk-eval when eval files are given.  Writes output_dir as the tool does:\n"
	"final_model/ (adapter, tokenizer files, README.md), checkpoint-*, results.json; and\n"
	"metrics.bk and logs/; prints a summary.\n"
	"Any config field can be overridden: --learning_rate 5e-5 (or --learning-rate=5e-5).\n"
	"Fields bakery cannot honour are listed with the reason; unknown ones refuse the bake.\n"
	"  --dry-run      check the config and print the commands it would run\n"
	"  --fields       list every field bk-bake knows: origin, what is done, default, why\n"
	"  -v, --verbose  stage messages on stderr instead of output_dir/logs/\n";

/* ---- commands ---- */

typedef struct {
	BK_VEC(char *) a; /* argv, NULL-terminated when run */
	const char *name; /* bk-gen, ... */
	const char *out;  /* stdout to this file (NULL: the pipe) */
	pid_t pid;
	int status;
} cmd;

static char bindir[PATH_MAX];

static void cmd_init(cmd *c, const char *tool)
{
	memset(c, 0, sizeof *c);
	c->name = tool;
	char *p = xasprintf("%s/%s", bindir, tool);
	if (*bindir && access(p, X_OK) == 0) {
		bk_vec_push(&c->a, p);
	} else {
		free(p);
		bk_vec_push(&c->a, xstrdup(tool)); /* from PATH */
	}
}

static void arg(cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void arg(cmd *c, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	char *s;
	if (vasprintf(&s, fmt, ap) < 0)
		die("out of memory");
	va_end(ap);
	bk_vec_push(&c->a, s);
}

static void arg2(cmd *c, const char *flag, const char *value)
{
	arg(c, "%s", flag);
	arg(c, "%s", value);
}

/* a flag and its number: "--lr" 2e-3 */
static void arg_long(cmd *c, const char *flag, long v)
{
	arg(c, "%s", flag);
	arg(c, "%ld", v);
}
static void arg_num(cmd *c, const char *flag, double v)
{
	arg(c, "%s", flag);
	arg(c, "%g", v);
}

static void cmd_free(cmd *c)
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
static void print_pipe(FILE *f, cmd *v, int n, const char *last_out)
{
	for (int i = 0; i < n; i++) {
		if (i)
			fputs(" |\n    ", f);
		fputs(v[i].name, f);
		for (size_t k = 1; k < v[i].a.n; k++) {
			fputc(' ', f);
			print_word(f, v[i].a.v[k]);
		}
	}
	if (last_out) {
		fputs(" >", f);
		print_word(f, last_out);
	}
	fputc('\n', f);
}

/* ---- running ---- */

static int verbose;
static const char *logdir;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *log_path(const char *tool)
{
	return xasprintf("%s/%s.log", logdir, tool);
}

/* Starts v[0] | v[1] | ... | v[n-1]; the last one's stdout is returned as a readable
 * fd (or goes to v[n-1].out).  stderr of each goes to logdir/TOOL.log. */
/* Ctrl-C reaches every stage (one process group): bk-step saves a checkpoint and the
 * others stop.  bk-bake itself keeps reading bk-step's metrics (so bk-step's writes do
 * not fail) and waits for the stages; a SIGTERM sent to bk-bake alone is passed on.
 * Caught signals reset to the default in the exec'd stages. */
#define MAX_KIDS 8
static pid_t kids[MAX_KIDS];
static volatile sig_atomic_t n_kids, interrupted;
static void on_interrupt(int sig)
{
	interrupted = sig;
	if (sig == SIGTERM)
		for (int i = 0; i < n_kids; i++)
			kill(kids[i], SIGTERM);
}
static void catch_interrupts(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_interrupt;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESTART;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

static int pipe_start(cmd *v, int n)
{
	catch_interrupts();
	n_kids = 0;
	int in = -1, result = -1;
	for (int i = 0; i < n; i++) {
		int fds[2] = {-1, -1};
		if (!v[i].out && pipe(fds))
			die("pipe: %s", strerror(errno));
		char **av = xcalloc(v[i].a.n + 1, sizeof *av);
		memcpy(av, v[i].a.v, v[i].a.n * sizeof *av);
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0)
			die("fork: %s", strerror(errno));
		if (!pid) {
			if (in >= 0 && dup2(in, 0) < 0)
				_exit(127);
			if (v[i].out) {
				int fd = open(v[i].out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
				if (fd < 0 || dup2(fd, 1) < 0)
					_exit(127);
			} else if (dup2(fds[1], 1) < 0) {
				_exit(127);
			}
			if (!verbose) {
				char *lp = log_path(v[i].name);
				int fd = open(lp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
				if (fd < 0 || dup2(fd, 2) < 0)
					_exit(127);
			}
			for (int fd = 3; fd < 256; fd++)
				close(fd);
			signal(SIGPIPE, SIG_DFL);
			execvp(av[0], av);
			fprintf(stderr, "%s: cannot run '%s': %s\n", bk_prog, av[0], strerror(errno));
			_exit(127);
		}
		free(av);
		v[i].pid = pid;
		if (n_kids < MAX_KIDS) {
			kids[n_kids] = pid;
			n_kids = n_kids + 1;
		}
		if (in >= 0)
			close(in);
		if (fds[1] >= 0)
			close(fds[1]);
		in = fds[0];
		if (i == n - 1)
			result = in;
	}
	return result;
}

/* Waits for every stage; dies naming the first failing one (pipe order) with the
 * tail of its log. */
static void pipe_wait(cmd *v, int n)
{
	for (int i = 0; i < n; i++)
		while (waitpid(v[i].pid, &v[i].status, 0) < 0)
			if (errno != EINTR)
				die("waitpid: %s", strerror(errno));
	n_kids = 0;
	if (interrupted) {
		/* the stages have stopped; bk-step said on its log which checkpoint it saved */
		error("interrupted by signal %d; the checkpoint bk-step saved is named in its "
		      "log (logs/bk-step.log)", (int)interrupted);
		exit(128 + interrupted);
	}
	for (int i = 0; i < n; i++) {
		int st = v[i].status;
		if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
			continue;
		if (!verbose) {
			char *lp = log_path(v[i].name);
			size_t len;
			char *text = bk_try_read_file(lp, &len);
			if (text) {
				/* the last 12 lines of the log */
				int lines = 0;
				char *p = text + len;
				while (p > text && lines <= 12)
					if (*(p -= 1) == '\n' && p + 1 < text + len)
						lines++;
				if (p > text)
					p++;
				fputs(p, stderr);
				if (len && text[len - 1] != '\n')
					fputc('\n', stderr);
				free(text);
			}
			free(lp);
		}
		if (WIFSIGNALED(st))
			die("stage %s was killed by signal %d", v[i].name, WTERMSIG(st));
		die("stage %s failed (exit %d)%s%s", v[i].name, WEXITSTATUS(st),
		    verbose ? "" : "; its log: ", verbose ? "" : log_path(v[i].name));
	}
}

/* Reads bk-step's metrics stream from fd into path (a byte copy), drawing progress
 * from its step records. */
static void metrics_copy(int fd, const char *path, int64_t total)
{
	FILE *out = fopen(path, "wb");
	if (!out)
		die("%s: %s", path, strerror(errno));
	msgpack_unpacker up;
	msgpack_unpacked res;
	if (!msgpack_unpacker_init(&up, 1 << 16))
		die("out of memory");
	msgpack_unpacked_init(&res);
	bk_progress pg;
	bk_progress_start(&pg, "steps", (uint64_t)(total > 0 ? total : 0));
	uint64_t step = 0, tokens = 0;
	for (;;) {
		if (msgpack_unpacker_buffer_capacity(&up) < 4096 &&
		    !msgpack_unpacker_reserve_buffer(&up, 1 << 16))
			die("out of memory");
		ssize_t r = read(fd, msgpack_unpacker_buffer(&up), msgpack_unpacker_buffer_capacity(&up));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("reading bk-step's metrics: %s", strerror(errno));
		if (r == 0)
			break;
		if (fwrite(msgpack_unpacker_buffer(&up), 1, (size_t)r, out) != (size_t)r)
			die("%s: write error", path);
		msgpack_unpacker_buffer_consumed(&up, (size_t)r);
		while (msgpack_unpacker_next(&up, &res) == MSGPACK_UNPACK_SUCCESS) {
			const msgpack_object *s = bk_obj_get(&res.data, "step"),
					     *t = bk_obj_get(&res.data, "tokens");
			if (s && s->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
				step = s->via.u64;
				if (t && t->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
					tokens += t->via.u64;
				bk_progress_update(&pg, step, tokens);
			}
		}
	}
	bk_progress_end(&pg, step, tokens);
	close(fd);
	msgpack_unpacked_destroy(&res);
	msgpack_unpacker_destroy(&up);
	if (fclose(out))
		die("%s: write error", path);
}

/* ---- the bake ---- */

static int is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* the bk-step features some fields need, from its usage text */
static bk_bake_caps probe_caps(void)
{
	bk_bake_caps caps = {0, 0, 0};
	cmd c;
	cmd_init(&c, "bk-step");
	arg(&c, "--help");
	int saved = verbose;
	verbose = 1; /* no log directory yet; a --help has nothing to log */
	int fd = pipe_start(&c, 1);
	char buf[16384];
	size_t n = 0;
	ssize_t r;
	while (n < sizeof buf - 1 && ((r = read(fd, buf + n, sizeof buf - 1 - n)) > 0 ||
				      (r < 0 && errno == EINTR)))
		if (r > 0)
			n += (size_t)r;
	buf[n] = 0;
	close(fd);
	while (waitpid(c.pid, &c.status, 0) < 0 && errno == EINTR)
		;
	verbose = saved;
	if (!WIFEXITED(c.status) || WEXITSTATUS(c.status))
		die("cannot run bk-step --help (is bakery built? bk-step is looked for next to "
		    "bk-bake, then on PATH)");
	caps.grad_checkpoint = strstr(buf, "--grad-checkpoint") != NULL;
	caps.optim_8bit = strstr(buf, "--optim") && strstr(buf, "adamw8bit");
	caps.save_total_limit = strstr(buf, "--save-total-limit") != NULL;
	cmd_free(&c);
	return caps;
}

typedef struct {
	cmd tok, lens, gen, teach, step, eval;
	int paired, has_eval;
	char *tokens, *order, *teach_file, *metrics, *tmpl_file, *sys_file, *eval_json;
	const char *resume; /* the checkpoint bk-step resumes from, or NULL */
	/* the plan of steps (known after tokenizing; 0 before) */
	int64_t prompts, epochs_written, last_records, order_records, total, per_epoch;
} bake;

static void add_system(cmd *c, const bk_bake_plan *p, const bake *b)
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

static void add_model(cmd *c, const bk_bake_plan *p)
{
	arg2(c, "--model", p->model);
	arg2(c, "--device", p->device);
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
static void plan_steps(bake *b, const bk_bake_plan *p, int64_t n)
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
static void build_step(bake *b, const bk_bake_plan *p)
{
	cmd *c = &b->step;
	cmd_init(c, "bk-step");
	add_model(c, p);
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
	} else if (p->warmup_ratio > 0) {
		arg_num(c, "--warmup-ratio", p->warmup_ratio);
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
	if (p->save_total_limit > 0)
		arg_long(c, "--save-total-limit", p->save_total_limit);
	if (p->grad_checkpoint)
		arg(c, "--grad-checkpoint");
	if (p->optim_8bit)
		arg2(c, "--optim", "adamw8bit");
	if (b->resume)
		arg2(c, "--resume", b->resume);
	else
		arg(c, "--overwrite"); /* the tool writes into an output_dir that holds a run */
	if (b->paired)
		arg(c, "%s", b->teach_file);
}

static void build(bake *b, const bk_bake_plan *p)
{
	const char *od = p->output_dir;
	b->tokens = bk_path_join(od, "tokens.bk");
	b->order = bk_path_join(od, "order.bk");
	b->teach_file = bk_path_join(od, "teach.bk");
	b->metrics = bk_path_join(od, "metrics.bk");
	b->tmpl_file = p->corpus ? bk_path_join(od, "system_template.txt") : NULL;
	b->sys_file = p->system_file ? bk_path_join(od, "system_prompt.txt") : NULL;
	b->eval_json = bk_path_join(od, "logs/bk-eval.json");

	cmd *c = &b->tok;
	cmd_init(c, "bk-tokenize");
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

	/* prompts-only: B prompts x T trajectories a micro-batch, as the tool; the order
	 * stream is already shuffled per epoch, bk-lens only cuts it into batches that
	 * do not cross an epoch's end (one window per epoch) */
	c = &b->lens;
	cmd_init(c, "bk-lens");
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
	cmd_init(c, "bk-gen");
	add_model(c, p);
	arg_long(c, "--num-trajectories", p->num_trajectories);
	arg_num(c, "--temperature", p->sampling_temperature);
	arg_num(c, "--top-p", p->top_p);
	arg_long(c, "--max-new-tokens", p->trajectory_length);
	arg_long(c, "--seed", p->seed);

	c = &b->teach;
	cmd_init(c, "bk-teach");
	add_model(c, p);
	arg_long(c, "--top-k", p->top_k);
	arg_num(c, "--temperature", p->temperature);
	if (b->paired) {
		arg(c, "%s", b->tokens);
		arg2(c, "-o", b->teach_file);
	}
	build_step(b, p);

	b->has_eval = p->eval_file || p->held_out_file || p->kl_prompts;
	c = &b->eval;
	cmd_init(c, "bk-eval");
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

static void bake_free(bake *b)
{
	cmd *all[] = {&b->tok, &b->lens, &b->gen, &b->teach, &b->step, &b->eval};
	for (int i = 0; i < 6; i++)
		cmd_free(all[i]);
	free(b->tokens), free(b->order), free(b->teach_file), free(b->metrics);
	free(b->tmpl_file), free(b->sys_file), free(b->eval_json);
}

static void rebuild(bake *b, const bk_bake_plan *p)
{
	cmd *all[] = {&b->tok, &b->lens, &b->gen, &b->teach, &b->step, &b->eval};
	for (int i = 0; i < 6; i++)
		cmd_free(all[i]);
	free(b->tokens), free(b->order), free(b->teach_file), free(b->metrics);
	free(b->tmpl_file), free(b->sys_file), free(b->eval_json);
	build(b, p);
}

static void print_plan(bake *b, const bk_bake_plan *p, int paired_known)
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
		cmd v[] = {b->lens, b->gen, b->teach, b->step};
		print_pipe(stdout, v, 4, b->metrics);
		if (!paired_known)
			printf("#    STEPS = max_steps, or ceil(epochs x ceil(ceil(prompts / batch) / "
			       "accumulation))\n");
	}
	if (!paired_known || b->paired) {
		printf("# 2. paired data (responses given): teacher file, then epochs over it\n");
		cmd t = b->teach, s = b->step;
		if (!paired_known) {
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

/* count, 'paired' and 'system_tokens' of the tokens stream */
static int64_t scan_tokens(const char *path, int *paired, int64_t *sys_tokens)
{
	bk_reader *r = bk_reader_open(path);
	const msgpack_object *o = bk_reader_prov(r, "paired");
	*paired = o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64;
	o = bk_reader_prov(r, "system_tokens");
	*sys_tokens = o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int64_t)o->via.u64 : -1;
	while (bk_reader_next(r))
		;
	int64_t n = (int64_t)bk_reader_count(r);
	bk_reader_close(r);
	return n;
}

/* warnings the stages wrote into their logs, shown once the bake is done */
static void show_log_warnings(const char *tool)
{
	if (verbose)
		return;
	char *lp = log_path(tool);
	FILE *f = fopen(lp, "r");
	free(lp);
	if (!f)
		return;
	char line[1024];
	while (fgets(line, sizeof line, f))
		if (strstr(line, "warning:"))
			fputs(line, stderr);
	fclose(f);
}

static double jnum(json_t *o, const char *path)
{
	/* "a.b.c" */
	char *p = xstrdup(path), *save = NULL;
	for (char *k = strtok_r(p, ".", &save); k && o; k = strtok_r(NULL, ".", &save))
		o = json_object_get(o, k);
	free(p);
	return o && json_is_number(o) ? json_number_value(o) : NAN;
}

/* the last step record and the checkpoints, from the metrics stream */
typedef struct {
	double loss;
	int64_t step;
	BK_VEC(char *) ckpts;
} last_logged;

static void read_metrics(const char *path, last_logged *m)
{
	memset(m, 0, sizeof *m);
	m->loss = NAN;
	bk_reader *r = bk_reader_open(path);
	const msgpack_object *rec;
	while ((rec = bk_reader_next(r))) {
		const msgpack_object *s = bk_obj_get(rec, "step"), *l = bk_obj_get(rec, "loss"),
				     *c = bk_obj_get(rec, "checkpoints");
		if (s && s->type == MSGPACK_OBJECT_POSITIVE_INTEGER && l &&
		    l->type == MSGPACK_OBJECT_FLOAT64) {
			m->step = (int64_t)s->via.u64;
			m->loss = l->via.f64;
		}
		if (c && c->type == MSGPACK_OBJECT_ARRAY)
			for (uint32_t i = 0; i < c->via.array.size; i++)
				if (c->via.array.ptr[i].type == MSGPACK_OBJECT_STR)
					bk_vec_push(&m->ckpts, xstrndup(c->via.array.ptr[i].via.str.ptr,
									c->via.array.ptr[i].via.str.size));
	}
	bk_reader_close(r);
}

static void summary(const bk_bake_plan *p, const bake *b, const bk_bake_train *tr,
		    const last_logged *lg, json_t *res, double t_tok, double t_train, double t_eval)
{
	const char *od = p->output_dir;
	printf("\n======================== bakery: bake summary ========================\n");
	printf("%-20s %s\n", "model", p->model);
	int64_t pt = (int64_t)jnum(res, "prompt_tokens");
	if (p->system)
		printf("%-20s %lld tokens: \"%.60s%s\"\n", "system prompt", (long long)pt, p->system,
		       strlen(p->system) > 60 ? "..." : "");
	else
		printf("%-20s %lld tokens, from %s\n", "system prompt", (long long)pt,
		       p->system_file ? p->system_file : p->corpus);
	if (b->paired)
		printf("%-20s %lld prompt/response pairs, %g epoch%s\n", "data",
		       (long long)b->prompts, p->epochs, p->epochs == 1 ? "" : "s");
	else
		printf("%-20s %lld prompts x %ld trajectories (up to %ld tokens) x %g epoch%s\n",
		       "data", (long long)b->prompts, p->num_trajectories, p->trajectory_length,
		       p->epochs, p->epochs == 1 ? "" : "s");
	printf("%-20s %lld samples, %lld tokens\n", "trained on", (long long)tr->records,
	       (long long)tr->tokens);
	printf("%-20s %lld (batch %ld x accumulation %ld, lr %g %s)\n", "optimizer steps",
	       (long long)tr->steps, p->batch_size, p->grad_accum, p->lr, p->schedule);
	printf("%-20s %.4f over %lld steps", "mean loss", tr->mean_loss, (long long)tr->steps);
	if (lg->step > 0)
		printf(" (last logged: %.4f at step %lld)\n", lg->loss, (long long)lg->step);
	else
		printf("\n");
	printf("%-20s %.1f s (tokenize %.1f s, train %.1f s%s", "time", t_tok + t_train + t_eval,
	       t_tok, t_train, b->has_eval ? "" : ")\n");
	if (b->has_eval)
		printf(", evaluate %.1f s)\n", t_eval);
	printf("%-20s %s/final_model (PEFT adapter, tokenizer files, README.md)\n", "adapter", od);
	printf("%-20s", "checkpoints");
	for (size_t i = 0; i < lg->ckpts.n; i++)
		printf(" %s", lg->ckpts.v[i]);
	printf("%s\n", lg->ckpts.n ? "" : " none");
	printf("%-20s %s (bk-dump; pipelines/bk-plot %s)\n", "metrics", b->metrics, b->metrics);
	printf("%-20s %s/results.json\n", "results", od);
	static const char *const sets[][4] = {
		{"eval accuracy", "baseline_none", "baseline_discrete", "baked_eval"},
		{"held-out accuracy", NULL, "heldout_discrete", "baked_heldout"}};
	for (int i = 0; i < 2; i++) {
		json_t *baked = json_object_get(res, sets[i][3]);
		if (!baked)
			continue;
		printf("%-20s %.0f samples:", sets[i][0], jnum(baked, "total"));
		char k[64];
		if (sets[i][1] && json_object_get(res, sets[i][1]))
			snprintf(k, sizeof k, "%s.accuracy", sets[i][1]),
				printf(" baseline %.1f%%,", 100 * jnum(res, k));
		if (json_object_get(res, sets[i][2]))
			snprintf(k, sizeof k, "%s.accuracy", sets[i][2]),
				printf(" prompted %.1f%%,", 100 * jnum(res, k));
		printf(" baked %.1f%%\n", 100 * jnum(baked, "accuracy"));
	}
	if (json_object_get(json_object_get(res, "bakery"), "kl"))
		printf("%-20s base %.4f, baked %.4f per token (%.1f%% of base)\n",
		       "KL(teacher||model)", jnum(res, "bakery.kl.base.per_token"),
		       jnum(res, "bakery.kl.baked.per_token"),
		       100 * jnum(res, "bakery.kl.baked_over_base"));
	printf("======================================================================\n");
}

static void copy_file(const char *src, const char *dst)
{
	size_t len;
	char *data = bk_read_file(src, &len);
	bk_write_file_atomic(dst, data, len);
	free(data);
}

/* the tokenizer files next to the adapter, as the tool's tokenizer.save_pretrained */
static void copy_tokenizer(const char *model, const char *dst)
{
	static const char *const files[] = {"tokenizer.model", "tokenizer.json",
					    "tokenizer_config.json", "special_tokens_map.json",
					    "added_tokens.json", "chat_template.jinja", NULL};
	for (int i = 0; files[i]; i++) {
		char *s = bk_path_join(model, files[i]), *d = bk_path_join(dst, files[i]);
		if (bk_file_exists(s))
			copy_file(s, d);
		free(s);
		free(d);
	}
}

/* the earlier bake's outputs (overwrite_output_dir), except keep (a checkpoint resumed
 * from) */
static void clear_outputs(const char *od, const char *keep)
{
	DIR *d = opendir(od);
	if (!d)
		return;
	struct dirent *e;
	BK_VEC(char *) rm = {0};
	while ((e = readdir(d))) {
		const char *n = e->d_name;
		if (!strncmp(n, "checkpoint-", 11) || !strcmp(n, "final_model") || !strcmp(n, "final"))
			bk_vec_push(&rm, bk_path_join(od, n));
	}
	closedir(d);
	for (size_t i = 0; i < rm.n; i++) {
		if (!keep || strcmp(rm.v[i], keep))
			if (bk_remove_flat_dir(rm.v[i]))
				die("overwrite_output_dir: cannot remove %s: %s", rm.v[i], strerror(errno));
		free(rm.v[i]);
	}
	free(rm.v);
	static const char *const files[] = {"results.json", "metrics.bk", "tokens.bk", "order.bk",
					    "teach.bk", NULL};
	for (int i = 0; files[i]; i++) {
		char *p = bk_path_join(od, files[i]);
		unlink(p);
		free(p);
	}
}

static char *model_card(const bk_bake_plan *p, const bake *b, const bk_bake_train *tr,
			int64_t prompt_tokens)
{
	char *per = b->paired ? xstrdup("")
			      : xasprintf(" x %ld teacher trajectories per epoch", p->num_trajectories);
	char *card = xasprintf(
		"A LoRA adapter for `%s` that behaves as the model does with its system prompt "
		"(%lld tokens), without the prompt: prompt baking by KL distillation "
		"(arXiv:2409.13697), made by bakery's bk-bake.\n\n"
		"## Training\n\n"
		"- data: %lld %s%s\n"
		"- %lld optimizer steps, batch %ld x accumulation %ld, learning rate %g (%s)\n"
		"- LoRA r %ld, alpha %g, dropout %g, targets %s\n"
		"- KL temperature %g; mean loss over the bake %.6f\n\n"
		"## Use\n\n"
		"Load with PEFT on the base model (`PeftModel.from_pretrained(base, DIR)`), or "
		"merge it with `bk-merge`.\n",
		p->model, (long long)prompt_tokens, (long long)b->prompts,
		b->paired ? "prompt/response pairs" : "prompts",
		per, (long long)tr->steps, p->batch_size, p->grad_accum, p->lr, p->schedule,
		p->lora_r, p->lora_alpha, p->lora_dropout, p->target_modules, p->temperature,
		tr->mean_loss);
	free(per);
	return card;
}

static void list_fields(void)
{
	size_t n;
	const bk_cfg_known *k = bk_cfg_fields(&n);
	printf("# field\torigin\thow\tdefault\twhy\n");
	for (size_t i = 0; i < n; i++)
		printf("%s\t%s\t%s\t%s\t%s\n", k[i].key, k[i].origin, k[i].how,
		       k[i].def ? k[i].def : "null", k[i].text);
}

/* the checkpoint to resume from: a directory, or "true" for output_dir's last */
static const char *resolve_resume(const bk_bake_plan *p, char **owned)
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

int main(int argc, char **argv)
{
	int dry_run = 0, fields = 0;
	bk_opt opts[] = {
		{"dry-run", 0, BK_OPT_FLAG, &dry_run, 0, 0},
		{"fields", 0, BK_OPT_FLAG, &fields, 0, 0},
		{"verbose", 'v', BK_OPT_FLAG, &verbose, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	bk_stdout_init();
	/* split: bk-bake's own flags, config overrides (--FIELD VALUE), the config */
	char **own = xcalloc((size_t)argc + 1, sizeof *own);
	int n_own = 1;
	own[0] = argv[0];
	BK_VEC(char *) ov = {0}; /* key, value pairs */
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int is_own = !strcmp(a, "--dry-run") || !strcmp(a, "-v") || !strcmp(a, "--verbose") ||
			     !strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "--version") ||
			     !strcmp(a, "--fields") || !strncmp(a, "--dry-run=", 10) || a[0] != '-' ||
			     !strcmp(a, "-");
		if (is_own) {
			own[n_own++] = argv[i];
			continue;
		}
		if (strncmp(a, "--", 2) || !a[2])
			die_usage("unknown option '%s' (overrides are --FIELD VALUE)", a);
		const char *eq = strchr(a, '=');
		char *key = eq ? xstrndup(a + 2, (size_t)(eq - a - 2)) : xstrdup(a + 2);
		for (char *k = key; *k; k++)
			if (*k == '-')
				*k = '_';
		const char *val = eq ? eq + 1 : NULL;
		if (!val) {
			if (i + 1 >= argc)
				die_usage("override --%s needs a value", key);
			val = argv[++i];
		}
		bk_vec_push(&ov, key);
		bk_vec_push(&ov, xstrdup(val));
	}
	int npos = bk_flags_parse(n_own, own, opts, usage);
	if (fields) {
		if (npos)
			die_usage("--fields takes no CONFIG");
		list_fields();
		free(own);
		bk_stdout_close();
		return 0;
	}
	if (npos != 1)
		die_usage(npos ? "one CONFIG file, please" : "no CONFIG file given");
	const char *config = own[0];

	ssize_t len = readlink("/proc/self/exe", bindir, sizeof bindir - 1);
	if (len > 0) {
		bindir[len] = 0;
		char *sl = strrchr(bindir, '/');
		if (sl)
			*sl = 0;
	} else {
		bindir[0] = 0;
	}
	/* 4 model processes on few cores: OpenMP threads that spin starve each other */
	setenv("OMP_WAIT_POLICY", "passive", 0);

	bk_cfg cfg;
	bk_cfg_load(&cfg, config);
	for (size_t i = 0; i < ov.n; i += 2)
		bk_cfg_set(&cfg, ov.v[i], ov.v[i + 1]);
	bk_bake_caps caps = probe_caps();
	bk_bake_plan p;
	bk_bake_plan_make(&p, &cfg, &caps);
	/* in config line order (overrides after), stable */
	size_t *ord = xmalloc((p.n_notes + 1) * sizeof *ord);
	for (size_t i = 0; i < p.n_notes; i++) {
		size_t j = i;
		int li = p.notes[i].line ? p.notes[i].line : INT_MAX;
		while (j > 0 && (p.notes[ord[j - 1]].line ? p.notes[ord[j - 1]].line : INT_MAX) > li) {
			ord[j] = ord[j - 1];
			j--;
		}
		ord[j] = i;
	}
	for (size_t i = 0; i < p.n_notes; i++) {
		const bk_cfg_note *nt = &p.notes[ord[i]];
		char at[64] = "";
		if (nt->line)
			snprintf(at, sizeof at, ":%d", nt->line);
		else if (bk_cfg_get(&cfg, nt->key))
			snprintf(at, sizeof at, " (override)");
		fprintf(stderr, "%s: %s%s: %s '%s': %s\n", bk_prog, config, at,
			bk_cfg_kind_name(nt->kind), nt->key, nt->text);
	}
	free(ord);
	if (p.n_refused)
		die("%s: %d field%s cannot be baked as given (listed above)", config, p.n_refused,
		    p.n_refused == 1 ? "" : "s");

	bake b;
	memset(&b, 0, sizeof b);
	const char *od = p.output_dir;
	if (dry_run) {
		if (p.resume)
			b.resume = strcmp(p.resume, "true") ? p.resume : "LAST_CHECKPOINT";
		build(&b, &p);
		print_plan(&b, &p, 0);
		bake_free(&b);
		goto done;
	}

	char *resume_owned;
	b.resume = resolve_resume(&p, &resume_owned);
	if (p.overwrite)
		clear_outputs(od, b.resume);
	char *fm = bk_path_join(od, "final_model");
	bk_mkdir_p(od);
	char *ld = bk_path_join(od, "logs");
	bk_mkdir_p(ld);
	logdir = ld;
	double t0 = now_s();
	build(&b, &p);
	if (b.tmpl_file)
		bk_write_file_atomic(b.tmpl_file, p.system_template_text,
				     strlen(p.system_template_text));
	if (b.sys_file) {
		size_t n;
		char *text = bk_read_file(p.system_file, &n), *st = bk_bake_strip(text);
		if (!*st)
			die("%s: empty system prompt", p.system_file);
		bk_write_file_atomic(b.sys_file, st, strlen(st));
		free(text);
		free(st);
	}
	pipe_start(&b.tok, 1);
	pipe_wait(&b.tok, 1);
	show_log_warnings("bk-tokenize");
	int paired;
	int64_t sys_tokens, prompts = scan_tokens(b.tokens, &paired, &sys_tokens);
	if (!prompts)
		die("%s: no samples to train on", b.tokens);
	b.paired = paired;
	plan_steps(&b, &p, prompts);
	rebuild(&b, &p);
	double t1 = now_s();
	if (!paired) {
		int64_t n = bk_bake_epoch_order(b.tokens, b.order, b.epochs_written, b.last_records,
						(uint64_t)p.data_seed);
		if (n != b.order_records)
			BUG("order stream: %lld records, planned %lld", (long long)n,
			    (long long)b.order_records);
	}
	if (verbose)
		print_plan(&b, &p, 1);

	if (paired) {
		b.teach.out = "/dev/null"; /* it writes -o teach.bk */
		pipe_start(&b.teach, 1);
		pipe_wait(&b.teach, 1);
		int fd = pipe_start(&b.step, 1);
		metrics_copy(fd, b.metrics, b.total);
		pipe_wait(&b.step, 1);
	} else {
		cmd v[] = {b.lens, b.gen, b.teach, b.step};
		int fd = pipe_start(v, 4);
		metrics_copy(fd, b.metrics, b.total);
		pipe_wait(v, 4);
		show_log_warnings("bk-gen");
	}
	show_log_warnings("bk-teach");
	double t2 = now_s();
	char *fin = bk_path_join(od, "final");
	if (is_dir(fm) && bk_remove_flat_dir(fm))
		die("%s: cannot replace the previous final_model: %s", fm, strerror(errno));
	if (rename(fin, fm))
		die("%s -> %s: %s", fin, fm, strerror(errno));
	bk_bake_metrics_final(b.metrics, fin, fm);
	free(fin);
	last_logged lg;
	read_metrics(b.metrics, &lg);
	if (!strcmp(p.save_strategy, "no")) {
		/* bk-step saves at epoch ends over a file: not wanted here */
		for (size_t i = 0; i < lg.ckpts.n; i++)
			if (bk_remove_flat_dir(lg.ckpts.v[i]))
				warn("cannot remove %s: %s", lg.ckpts.v[i], strerror(errno));
		lg.ckpts.n = 0;
	}
	copy_tokenizer(p.model, fm);
	bk_bake_train tr;
	bk_bake_train_read(fm, &tr);
	int64_t prompt_tokens = bk_bake_prompt_tokens(p.model, sys_tokens);
	json_t *bkeval = NULL;
	if (b.has_eval) {
		pipe_start(&b.eval, 1);
		pipe_wait(&b.eval, 1);
		json_error_t err;
		bkeval = json_load_file(b.eval_json, 0, &err);
		if (!bkeval)
			die("%s:%d: %s", b.eval_json, err.line, err.text);
	}
	double t3 = now_s();
	json_t *train = json_pack("{s:I, s:f, s:I, s:I, s:f, s:s?}", "steps", (json_int_t)tr.steps,
				  "mean_loss", tr.steps ? tr.mean_loss : 0.0, "samples",
				  (json_int_t)tr.records, "tokens", (json_int_t)tr.tokens,
				  "train_seconds", t2 - t1, "resumed_from", b.resume);
	json_t *res = bk_bake_results(bkeval, b.eval_json, prompt_tokens, p.eval_file != NULL,
				      p.held_out_file != NULL, train);
	char *rp = bk_path_join(od, "results.json");
	char *text = json_dumps(res, JSON_INDENT(2) | JSON_REAL_PRECISION(6));
	size_t tl = strlen(text);
	text = xrealloc(text, tl + 2);
	text[tl] = '\n', text[tl + 1] = 0;
	bk_write_file_atomic(rp, text, tl + 1);
	free(text);
	free(rp);
	char *card = model_card(&p, &b, &tr, prompt_tokens);
	bk_bake_model_card(fm, p.model, card);
	free(card);
	summary(&p, &b, &tr, &lg, res, t1 - t0, t2 - t1, t3 - t2);
	json_decref(train);
	json_decref(res);
	json_decref(bkeval);
	for (size_t i = 0; i < lg.ckpts.n; i++)
		free(lg.ckpts.v[i]);
	free(lg.ckpts.v);
	bake_free(&b);
	free(resume_owned);
	free(fm);
	free(ld);
done:
	bk_bake_plan_free(&p);
	bk_cfg_free(&cfg);
	for (size_t i = 0; i < ov.n; i++)
		free(ov.v[i]);
	free(ov.v);
	free(own);
	bk_stdout_close();
	return 0;
}
