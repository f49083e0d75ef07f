/* bk-bake - a whole bake from the reference tool's flat YAML config: maps its fields
 * onto the stages (formats/config_yaml.c), runs bk-tokenize, writes the epochs'
 * prompt order, runs bk-lens | bk-gen | bk-step (bk-gen --teacher-top-k with
 * teacher_top_k; | bk-teach | before bk-step for the full distribution or retokenized
 * trajectories) as processes joined by
 * pipes, then bk-eval, and leaves output_dir in the tool's layout (formats/bakeout.c).
 * The commands are built in formats/bakeplan.c; here only the flags and the run:
 * processes, their logs, signals.  No model code. */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "formats/bakeout.h"
#include "formats/bakeplan.h"
#include "formats/config_yaml.h"
#include "formats/inputs.h"
#include "formats/template.h"
#include "formats/tokenizer.h"
#include "formats/hub.h"
#include "gpu/bakemem.h"
#include "gpu/device.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
	"usage: bk-bake [--dry-run] [--gpu-memory SIZE] [-v] [--config] CONFIG [--FIELD VALUE]...\n"
	"       bk-bake --fields\n"
	"Bakes the system prompt of CONFIG (the Python tool's flat YAML config) into a\n"
	"LoRA adapter: bk-tokenize, then bk-lens | bk-gen | bk-step in one pipe,\n"
	"then bk-eval when eval files are given.  Writes output_dir as the tool does:\n"
	"final_model/ (adapter, tokenizer files, README.md), checkpoint-*, results.json; and\n"
	"metrics.bk and logs/; prints a summary.\n"
	"Any config field can be overridden: --learning_rate 5e-5 (or --learning-rate=5e-5).\n"
	"Fields bakery cannot honour are listed with the reason; unknown ones refuse the bake.\n"
	"CONFIG may follow --config, as the tool's command line has it (bakery --config FILE).\n"
	"model_name_or_path may be a hub id (Org/Name): it is read from the HF cache, and\n"
	"downloaded into it when missing (HF_ENDPOINT, HF_TOKEN; HF_HUB_OFFLINE=1: cache only).\n"
	"  --dry-run      check the config and print the commands it would run and the\n"
	"                 memory plan of its GPU stages (tokenizes the data to measure it)\n"
	"  --gpu-memory SIZE  plan for a GPU of SIZE (24GiB, 80G, 24GB = 10^9): choose\n"
	"                 what makes the bake fit, or refuse it up front\n"
	"  --fields       list every field bk-bake knows: origin, what is done, default, why\n"
	"  -v, --verbose  stage messages on stderr instead of output_dir/logs/\n";

/* where bk-bake itself is: the stages are looked for there first */
static char bindir[PATH_MAX];

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
 * not fail) and waits for the stages; a SIGINT or SIGTERM sent to bk-bake alone is
 * passed on.
 * Caught signals reset to the default in the exec'd stages. */
#define MAX_KIDS 8
static pid_t kids[MAX_KIDS];
static volatile sig_atomic_t n_kids, interrupted;
static void on_interrupt(int sig)
{
	interrupted = sig;
	/* a signal sent to bk-bake alone (kill -INT PID, not the terminal's to the group)
	 * goes on: bk-step saves a checkpoint and stops; a second one is harmless */
	for (int i = 0; i < n_kids; i++)
		kill(kids[i], sig);
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

static int pipe_start(bk_bake_cmd *v, int n)
{
	catch_interrupts();
	n_kids = 0;
	int in = -1, result = -1;
	for (int i = 0; i < n; i++) {
		int fds[2] = {-1, -1};
		if (!v[i].out && pipe(fds))
			die("pipe: %s", strerror(errno));
		if (i == 0 && v[i].in && (in = open(v[i].in, O_RDONLY)) < 0)
			die("%s: %s", v[i].in, strerror(errno));
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

/* A resumed bake: bk-step's metrics go to metrics_part, joined to the earlier run's
 * metrics.bk (its steps up to the checkpoint) when bk-step ends, stopped or not. */
static const char *metrics_path, *metrics_part, *metrics_resume;
static void join_metrics(void)
{
	const char *part = metrics_part;
	metrics_part = NULL;
	bk_bake_metrics_join(metrics_path, part, metrics_resume);
}

/* Waits for every stage; dies naming the first failing one (pipe order) with the
 * tail of its log. */
static void pipe_wait(bk_bake_cmd *v, int n)
{
	for (int i = 0; i < n; i++)
		while (waitpid(v[i].pid, &v[i].status, 0) < 0)
			if (errno != EINTR)
				die("waitpid: %s", strerror(errno));
	n_kids = 0;
	if (interrupted) {
		/* the stages have stopped; bk-step said on its log which checkpoint it saved */
		if (metrics_part) /* the steps of this run stay in metrics.bk */
			join_metrics();
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


/* ---- the bake ---- */

static int is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* where the tool tokenizes otherwise: said once, not followed (the model was trained on
 * tokenizer.json's; transformers calls its own a bug) */
static void tokenizer_note(const char *model)
{
	int kind;
	char *pre = bk_tok_hf5_pretokenizer(model, &kind);
	if (kind == BK_TOK_HF5_BYTELEVEL)
		fprintf(stderr,
			"%s: %s: note: tokenized with tokenizer.json's pre-tokenizer (%s), as the "
			"model was trained; the tool under transformers 5 builds its GPT2Tokenizer "
			"with ByteLevel alone (transformers PR 44254) and splits some text otherwise "
			"(white space before a digit: \"\\n\\n1\" is 2 newline tokens there, 1 here)\n",
			bk_prog, model, pre);
	else if (kind == BK_TOK_HF5_METASPACE)
		fprintf(stderr,
			"%s: %s: note: tokenized with tokenizer.json's pre-tokenizer (%s), as the "
			"model was trained; the tool under transformers 5 builds its LlamaTokenizer "
			"with Metaspace over this byte-level vocabulary (transformers PR 48219), "
			"which gives other ids for nearly every text\n",
			bk_prog, model, pre);
	free(pre);
}

/* the bk-step features some fields need, from its usage text */
static bk_bake_caps probe_caps(void)
{
	bk_bake_caps caps = {0, 0, 0, 0, 0};
	bk_bake_cmd c;
	bk_bake_cmd_init(&c, bindir, "bk-step");
	bk_vec_push(&c.a, xstrdup("--help"));
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
	caps.grad_ckpt_every = strstr(buf, "--grad-checkpoint-every") != NULL;
	caps.optim_8bit = strstr(buf, "--optim") && strstr(buf, "adamw8bit");
	caps.save_total_limit = strstr(buf, "--save-total-limit") != NULL;
	caps.load_4bit = strstr(buf, "--load-in-4bit") != NULL;
	bk_bake_cmd_free(&c);
	return caps;
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

/* a field whose default is true or false */
static int is_bool_field(const char *key)
{
	size_t n;
	const bk_cfg_known *k = bk_cfg_fields(&n);
	for (size_t i = 0; i < n; i++)
		if (!strcmp(k[i].key, key))
			return k[i].def && (!strcmp(k[i].def, "true") || !strcmp(k[i].def, "false"));
	return 0;
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

/* ---- the memory plan ---- */

static char refusal[1024]; /* why the bake cannot fit (mem_plan returned 0) */

/* Plans the GPU stages (gpu/bakemem.h) for the tokens in path (NULL: lengths assumed)
 * and applies what it chose to p and b; the plan goes to out (the dry run), or with out
 * NULL the choices and the fits line are noted on stderr.  Returns 0 when the bake
 * cannot fit (refusal says why and what to change). */
static int mem_plan(bk_bake_plan *p, bk_bake_cmds *b, const bk_bake_caps *caps,
		    const char *tokens, size_t gpu, FILE *out)
{
	int print = out != NULL;
	if (!is_dir(p->model)) { /* a hub id in a dry run: nothing is downloaded for it */
		if (print)
			fprintf(out, "# memory plan: not made: %s is a hub id; the bake plans with "
				"its config.json once it is in the cache\n", p->model);
		return 1;
	}
	bk_config *mc = bk_config_load(p->model);
	bk_mem_model m = bk_mem_model_of(mc);
	m.q4 = p->q4_type != NULL; /* load_in_4bit: the linears in 4 bits on the GPU */
	m.q4_double_quant = p->q4_double_quant;
	bk_config_free(mc);
	int mt = 256, ms = 256, mr = 0, sys = 0, paired = b->paired;
	if (tokens) {
		bk_bake_token_lengths(tokens, &mt, &ms, &mr, &sys);
	} else if (print) {
		if (p->max_seq_length > 0)
			mt = ms = (int)p->max_seq_length;
		fprintf(out, "# memory plan: prompts assumed at most %d tokens (the data was not "
			"tokenized)\n", mt);
	}
	bk_mem_bake mb;
	bk_bake_mem_shape(&mb, p, caps, paired, mt, ms, mr ? mr : (int)p->trajectory_length, sys,
			  gpu);
	bk_mem_dev d = bk_mem_dev_cuda_env();
	bk_mem_fit f;
	bk_mem_fit_bake(&m, &d, &mb, &f);
	if (print) {
		fprintf(out, "# memory plan of the GPU stages: prompts up to %d tokens (teacher), %d "
			"(student), %s of up to %d tokens, sizes in MiB\n", mt, ms,
			paired ? "responses" : "trajectories", paired ? mb.max_resp : mb.max_new);
		bk_mem_fit_print(&f, &mb, out);
	} else if (f.fits) {
		/* said whatever -v: what changed the bake's shape, and the fit */
		if (f.chose[0])
			fprintf(stderr, "%s: memory plan: chose %s\n", bk_prog, f.chose);
		if (f.fits >= 0)
			fprintf(stderr, "%s: memory plan: fits, peak %.2f GiB of %.2f GiB\n", bk_prog,
				(double)f.peak / (1u << 30), (double)gpu / (1u << 30));
	}
	if (!f.fits) {
		snprintf(refusal, sizeof refusal, "%s", f.refuse);
		return 0;
	}
	bk_bake_mem_apply(&f, &mb, p, b);
	return 1;
}

/* the dry run's lengths: bk-tokenize into a temporary directory (NULL when it cannot
 * run, e.g. no tokenizer files); *dir gets the directory to remove */
static char *dry_tokens(const bk_bake_cmds *b, char **dir)
{
	const char *tmp = getenv("TMPDIR");
	char *tpl = xasprintf("%s/bk-bake-plan.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	*dir = mkdtemp(tpl) ? tpl : (free(tpl), NULL);
	if (!*dir)
		return NULL;
	char *out = xasprintf("%s/tokens.bk", *dir);
	bk_bake_cmd c = b->tok;
	memset(&c.a, 0, sizeof c.a);
	for (size_t i = 0; i < b->tok.a.n; i++)
		bk_vec_push(&c.a, i && !strcmp(b->tok.a.v[i - 1], "-o") ? out : b->tok.a.v[i]);
	char *lp = xasprintf("%s/bk-tokenize.log", *dir);
	const char *saved = logdir;
	logdir = *dir;
	int sv = verbose;
	verbose = 0;
	pipe_start(&c, 1);
	while (waitpid(c.pid, &c.status, 0) < 0 && errno == EINTR)
		;
	verbose = sv;
	logdir = saved;
	free(c.a.v);
	int ok = WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0;
	if (!ok) {
		size_t n;
		char *text = bk_try_read_file(lp, &n);
		char *nl = text ? strchr(text, '\n') : NULL;
		if (nl)
			*nl = 0;
		printf("# memory plan: the data could not be tokenized (%s)\n",
		       text && *text ? text : "bk-tokenize failed");
		free(text);
		free(out);
		out = NULL;
	}
	free(lp);
	return out;
}

static void remove_dir(char *dir)
{
	if (dir && bk_remove_flat_dir(dir))
		warn("cannot remove %s: %s", dir, strerror(errno));
	free(dir);
}

int main(int argc, char **argv)
{
	int dry_run = 0, fields = 0;
	const char *config_flag = NULL;
	const char *gpu_memory = NULL;
	bk_opt opts[] = {
		{"config", 0, BK_OPT_STR, &config_flag, 0, 0},
		{"dry-run", 0, BK_OPT_FLAG, &dry_run, 0, 0},
		{"gpu-memory", 0, BK_OPT_STR, &gpu_memory, 0, 0},
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
	int n_config = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int is_own = !strcmp(a, "--dry-run") || !strcmp(a, "-v") || !strcmp(a, "--verbose") ||
			     !strcmp(a, "--help") || !strcmp(a, "-h") || !strcmp(a, "--version") ||
			     !strcmp(a, "--fields") || !strncmp(a, "--dry-run=", 10) || a[0] != '-' ||
			     !strcmp(a, "-") || !strncmp(a, "--gpu-memory=", 13);
		if (is_own) {
			own[n_own++] = argv[i];
			continue;
		}
		/* the tool's own command line: bakery --config FILE [--field value ...] */
		if (!strcmp(a, "--config") || !strncmp(a, "--config=", 9)) {
			if (!a[8] && i + 1 >= argc)
				die_usage("--config needs a FILE");
			if (n_config++)
				die_usage("one --config FILE, please");
			own[n_own++] = argv[i];
			if (!a[8])
				own[n_own++] = argv[++i];
			continue;
		}
		if (!strcmp(a, "--gpu-memory")) {
			own[n_own++] = argv[i];
			if (i + 1 < argc)
				own[n_own++] = argv[++i];
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
		if (!val && (i + 1 >= argc || !strncmp(argv[i + 1], "--", 2)) && is_bool_field(key))
			val = "true"; /* HfArgumentParser: a bool field given bare is true */
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
		if (npos || config_flag)
			die_usage("--fields takes no CONFIG");
		list_fields();
		free(own);
		bk_stdout_close();
		return 0;
	}
	if (npos + (config_flag != NULL) != 1)
		die_usage(npos ? "one CONFIG file, please" : "no CONFIG file given");
	const char *config = config_flag ? config_flag : own[0];
	size_t gpu = 0;
	if (gpu_memory && !(gpu = bk_mem_parse_size(gpu_memory)))
		die_usage("--gpu-memory '%s' is not a size (e.g. 24GiB, 80G, 24GB)", gpu_memory);

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
	bk_bake_print_notes(&p, &cfg, config);
	if (p.n_refused)
		die("%s: %d field%s cannot be baked as given (listed above)", config, p.n_refused,
		    p.n_refused == 1 ? "" : "s");
	/* a model without a chat template: raw, where the tool fails; said once, here
	 * (the stages are told raw) */
	if (!p.template_name && is_dir(p.model) && bk_template_detect(p.model) == BK_TMPL_RAW) {
		warn("%s has no chat template (chat_template.jinja or tokenizer_config.json's "
		     "chat_template): baking with 'raw' (BOS, the system prompt, a space, the user "
		     "text), where the tool fails; 'template: raw' chooses it",
		     p.model);
		p.template_name = "raw";
	}
	if (is_dir(p.model))
		tokenizer_note(p.model);

	/* system_prompt_file is checked here, under the user's name for it (NUL bytes,
	 * UTF-8, empty), before anything is written: its copy is what bk-tokenize reads */
	char *sys_text = NULL;
	if (p.system_file) {
		char *text = bk_read_text(p.system_file);
		sys_text = bk_bake_strip(text);
		free(text);
		if (!*sys_text)
			die("%s: empty system prompt", p.system_file);
	}

	bk_bake_cmds b;
	memset(&b, 0, sizeof b);
	b.bindir = bindir;
	const char *od = p.output_dir;
	if (dry_run) {
		if (p.resume)
			b.resume = strcmp(p.resume, "true") ? p.resume : "LAST_CHECKPOINT";
		bk_bake_build(&b, &p);
		/* the data's lengths for the plan, tokenized by a local model only: a dry run
		 * downloads nothing */
		char *tdir = NULL, *tok = is_dir(p.model) ? dry_tokens(&b, &tdir) : NULL;
		int paired = 0;
		int64_t prompts = 0;
		if (tok) {
			int64_t st;
			prompts = bk_bake_scan_tokens(tok, &paired, &st);
		}
		b.paired = paired;
		/* the commands as they would run: the plan's choices applied first, the
		 * plan printed after them */
		char *mtext = NULL;
		size_t mlen = 0;
		FILE *mf = open_memstream(&mtext, &mlen);
		if (!mf)
			die("out of memory");
		int fits = mem_plan(&p, &b, &caps, tok, gpu, mf);
		fclose(mf);
		if (prompts > 0)
			bk_bake_plan_steps(&b, &p, prompts);
		bk_bake_rebuild(&b, &p);
		bk_bake_print_plan(&b, &p, tok != NULL);
		fputs(mtext, stdout);
		free(mtext);
		free(tok);
		remove_dir(tdir);
		bk_bake_cmds_free(&b);
		free(sys_text);
		if (!fits) {
			fflush(stdout);
			die("%s: the bake does not fit: %s", config, refusal);
		}
		goto done;
	}

	bk_dir_lock(od, "bk-bake", "output_dir"); /* one bake at a time in output_dir */
	/* a hub id: one snapshot (downloaded into the HF cache when missing) for every
	 * stage, so they all read one commit; the adapter names the id, as PEFT does */
	const char *hub_id = NULL;
	char *model_dir = bk_hub_model_dir(p.model, p.revision);
	if (strcmp(model_dir, p.model)) {
		hub_id = p.model;
		b.base_name = hub_id;
		p.model = model_dir;
		tokenizer_note(p.model);
	}
	char *resume_owned;
	b.resume = bk_bake_resolve_resume(&p, &resume_owned);
	if (p.overwrite)
		bk_bake_clear_outputs(od, b.resume);
	char *fm = bk_path_join(od, "final_model");
	bk_mkdir_p(od);
	char *ld = bk_path_join(od, "logs");
	bk_mkdir_p(ld);
	logdir = ld;
	double t0 = now_s();
	bk_bake_build(&b, &p);
	if (b.tmpl_file)
		bk_write_file_atomic(b.tmpl_file, p.system_template_text,
				     strlen(p.system_template_text));
	if (b.sys_file)
		bk_write_file_atomic(b.sys_file, sys_text, strlen(sys_text));
	free(sys_text);
	if (b.eval_tokens) { /* the validation records: pairs (the tool's loss is 0 else) */
		pipe_start(&b.evtok, 1);
		pipe_wait(&b.evtok, 1);
		show_log_warnings("bk-tokenize");
		int ep;
		int64_t st;
		if (!bk_bake_scan_tokens(b.eval_tokens, &ep, &st) || !ep)
			die("%s: no prompt/response pairs: the tool's validation loss over prompts "
			    "alone is 0 (it samples no trajectories to evaluate); give pairs",
			    p.eval_data);
	}
	pipe_start(&b.tok, 1);
	pipe_wait(&b.tok, 1);
	show_log_warnings("bk-tokenize");
	int paired;
	int64_t sys_tokens, prompts = bk_bake_scan_tokens(b.tokens, &paired, &sys_tokens);
	if (!prompts)
		die("%s: no samples to train on", b.tokens);
	b.paired = paired;
	{
		const char *why;
		if ((gpu || (strcmp(p.device, "cpu") && bk_cuda_device_count(&why) > 0)) &&
		    !mem_plan(&p, &b, &caps, b.tokens, gpu, NULL))
			die("%s: the bake does not fit: %s", config, refusal);
	}
	bk_bake_plan_steps(&b, &p, prompts);
	bk_bake_rebuild(&b, &p);
	double t1 = now_s();
	if (!paired) {
		int64_t n = bk_bake_epoch_order(b.tokens, b.order, b.epochs_written, b.last_records,
						(uint64_t)p.data_seed);
		if (n != b.order_records)
			BUG("order stream: %lld records, planned %lld", (long long)n,
			    (long long)b.order_records);
	}
	if (verbose)
		bk_bake_print_plan(&b, &p, 1);

	/* resumed: metrics.bk keeps the earlier run's steps up to the checkpoint */
	char *part = b.resume ? xasprintf("%s.resumed", b.metrics) : NULL;
	metrics_path = b.metrics, metrics_resume = b.resume;
	int exact = p.top_k < 0; /* the tool's exact KL: bk-step runs the teacher */
	/* bk-teach on sampled trajectories: not with the exact KL, nor when bk-gen scores */
	int teach_sampled = !exact && !b.gen_scores;
	if (paired) {
		b.teach.out = "/dev/null"; /* it writes -o teach.bk */
		if (!exact) {
			pipe_start(&b.teach, 1);
			pipe_wait(&b.teach, 1);
		}
		int fd = pipe_start(&b.step, 1);
		bk_bake_metrics_copy(fd, part ? part : b.metrics, b.total);
		metrics_part = part;
		pipe_wait(&b.step, 1);
	} else if (b.sequential) { /* the memory plan: one GPU stage at a time */
		bk_bake_cmd v[] = {b.lens, b.gen};
		v[1].out = b.gen_file;
		pipe_start(v, 2);
		pipe_wait(v, 2);
		show_log_warnings("bk-gen");
		if (!teach_sampled) { /* bk-step runs the teacher, or bk-gen scored */
			b.step.in = b.gen_file;
		} else {
			b.teach.in = b.gen_file;
			b.teach.out = b.teach_file;
			pipe_start(&b.teach, 1);
			pipe_wait(&b.teach, 1);
			b.step.in = b.teach_file;
		}
		int fd = pipe_start(&b.step, 1);
		bk_bake_metrics_copy(fd, part ? part : b.metrics, b.total);
		metrics_part = part;
		pipe_wait(&b.step, 1);
	} else {
		bk_bake_cmd v[] = {b.lens, b.gen, b.teach, b.step};
		if (!teach_sampled)
			v[2] = b.step;
		int fd = pipe_start(v, teach_sampled ? 4 : 3);
		bk_bake_metrics_copy(fd, part ? part : b.metrics, b.total);
		metrics_part = part;
		pipe_wait(v, teach_sampled ? 4 : 3);
		show_log_warnings("bk-gen");
	}
	if (metrics_part)
		join_metrics();
	free(part);
	if (paired ? !exact : teach_sampled)
		show_log_warnings("bk-teach");
	double t2 = now_s();
	char *fin = bk_path_join(od, "final");
	if (is_dir(fm) && bk_remove_flat_dir(fm))
		die("%s: cannot replace the previous final_model: %s", fm, strerror(errno));
	if (rename(fin, fm))
		die("%s -> %s: %s", fin, fm, strerror(errno));
	bk_bake_metrics_final(b.metrics, fin, fm);
	free(fin);
	bk_bake_logged lg;
	bk_bake_read_metrics(b.metrics, &lg);
	if (!strcmp(p.save_strategy, "no")) {
		/* bk-step saves at epoch ends over a file: not wanted here */
		for (size_t i = 0; i < lg.ckpts.n; i++)
			if (bk_remove_flat_dir(lg.ckpts.v[i]))
				warn("cannot remove %s: %s", lg.ckpts.v[i], strerror(errno));
		lg.ckpts.n = 0;
	}
	/* HF's log_history (losses and eval_loss) in every trainer_state.json */
	bk_vec_push(&lg.ckpts, xstrdup(fm));
	bk_bake_log_history(b.metrics, lg.ckpts.v, lg.ckpts.n, paired ? 0 : b.per_epoch);
	lg.ckpts.n -= 1;
	free(lg.ckpts.v[lg.ckpts.n]);
	bk_bake_copy_tokenizer(p.model, fm);
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
	char *card = bk_bake_model_card_text(&p, &b, &tr, prompt_tokens);
	bk_bake_model_card(fm, hub_id ? hub_id : p.model, card);
	free(card);
	bk_bake_summary(&p, &b, &tr, &lg, res, t1 - t0, t2 - t1, t3 - t2);
	json_decref(train);
	json_decref(res);
	json_decref(bkeval);
	for (size_t i = 0; i < lg.ckpts.n; i++)
		free(lg.ckpts.v[i]);
	free(lg.ckpts.v);
	bk_bake_cmds_free(&b);
	free(resume_owned);
	free(model_dir);
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
