/* test_inputs.c - data readers (JSON, JSON Lines, text, chat, ShareGPT) and system
 * prompt sources against the small files in tests/data/inputs/.  Error cases run in a
 * fork()ed child and check its exit status (1) and its one-line message. */
#include "common/diag.h"
#include "formats/inputs.h"
#include "formats/msgjson.h"
#include "tests/harness.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define LSAN_OFF() __lsan_disable() /* a child that die()s exits with live memory */
#else
#define LSAN_OFF() ((void)0)
#endif

#define D "tests/data/inputs/"

static int str_eq(const char *a, const char *b)
{
	return (!a && !b) || (a && b && !strcmp(a, b));
}

static const char *show(const char *s) { return s ? s : "(null)"; }

/* sample i of ds is (prompt, response, system); NULL means "none" */
static void check_sample(const bk_dataset *ds, size_t i, const char *p, const char *r,
			 const char *s, const char *what)
{
	CHECK(i < ds->n, "%s: sample %zu of %zu", what, i, ds->n);
	if (i >= ds->n)
		return;
	const bk_sample *x = &ds->v[i];
	CHECK(str_eq(x->prompt, p), "%s[%zu]: prompt '%s' want '%s'", what, i, show(x->prompt), p);
	CHECK(str_eq(x->response, r), "%s[%zu]: response '%s' want '%s'", what, i,
	      show(x->response), show(r));
	CHECK(str_eq(x->system, s), "%s[%zu]: system '%s' want '%s'", what, i, show(x->system),
	      show(s));
}

static void load(bk_dataset *ds, const char *path, bk_input_format fmt)
{
	memset(ds, 0, sizeof *ds);
	bk_dataset_load(ds, path, fmt);
}

/* ---- death tests ---- */

typedef void (*bk_die_fn)(const void *ctx);

/* Runs fn(ctx) in a child; checks that it exits with status (1: die, 2: die_usage) and
 * that its stderr is one line containing want. */
static void expect_exit(const char *what, int status, bk_die_fn fn, const void *ctx,
			const char *want)
{
	int fd[2];
	if (pipe(fd) < 0)
		die("pipe failed");
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid < 0)
		die("fork failed");
	if (pid == 0) {
		LSAN_OFF();
		close(fd[0]);
		dup2(fd[1], 2);
		close(fd[1]);
		fn(ctx);
		_exit(0); /* returned: did not die */
	}
	close(fd[1]);
	char buf[4096];
	size_t n = 0;
	ssize_t r;
	while ((r = read(fd[0], buf + n, sizeof buf - 1 - n)) > 0)
		n += r;
	buf[n] = 0;
	close(fd[0]);
	int st;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == status, "%s: exit status %d (want %d); stderr: %s",
	      what, WIFEXITED(st) ? WEXITSTATUS(st) : -1, status, buf);
	CHECK(strstr(buf, want) != NULL, "%s: stderr '%s' lacks '%s'", what, buf, want);
	char *nl = strchr(buf, '\n');
	CHECK(nl && nl[1] == 0, "%s: not exactly one line: '%s'", what, buf);
}

static void expect_die(const char *what, bk_die_fn fn, const void *ctx, const char *want)
{
	expect_exit(what, 1, fn, ctx, want);
}

typedef struct {
	const char *path;
	bk_input_format fmt;
	const char *stdin_path; /* when set, this file becomes stdin first */
} load_ctx;

static void do_load(const void *p)
{
	const load_ctx *c = p;
	if (c->stdin_path) {
		int f = open(c->stdin_path, O_RDONLY);
		if (f < 0 || dup2(f, 0) < 0)
			_exit(9);
	}
	bk_dataset ds = {0};
	bk_dataset_load(&ds, c->path, c->fmt);
}

static void load_dies(const char *path, bk_input_format fmt, const char *want)
{
	load_ctx c = {path, fmt, NULL};
	expect_die(path, do_load, &c, want);
}

static void do_format(const void *p) { bk_input_format_parse(p); }

typedef struct {
	const char *system, *file, *corpus, *format, *tmpl;
} sys_ctx;

static void do_system(const void *p)
{
	const sys_ctx *c = p;
	free(bk_system_prompt(c->system, c->file, c->corpus, c->format, c->tmpl));
}

static void system_dies(const char *what, sys_ctx c, const char *want)
{
	expect_die(what, do_system, &c, want);
}

/* a combination of flags: a usage error */
static void system_usage(const char *what, sys_ctx c, const char *want)
{
	expect_exit(what, 2, do_system, &c, want);
}

/* ---- shapes ---- */

static void test_json_shapes(void)
{
	bk_dataset ds;
	load(&ds, D "strings.json", BK_FMT_AUTO);
	CHECK(ds.n == 4 && !ds.paired, "strings: n %zu paired %d", ds.n, ds.paired);
	check_sample(&ds, 0, "What is 2+2?", NULL, NULL, "strings");
	check_sample(&ds, 1, "  Tell me a joke.  ", NULL, NULL, "strings"); /* no stripping */
	check_sample(&ds, 2, "\xc3\x9cn\xc3\xaf\x63\xc3\xb6\x64\xc3\xa9 \xe2\x80\x94 "
			     "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e prompt",
		     NULL, NULL, "strings");
	check_sample(&ds, 3, "line one\nline two", NULL, NULL, "strings");
	bk_dataset_free(&ds);
	CHECK(ds.n == 0 && ds.v == NULL, "free leaves the dataset empty");

	load(&ds, D "objects.json", BK_FMT_JSON);
	CHECK(ds.n == 4 && ds.paired, "objects: n %zu paired %d", ds.n, ds.paired);
	check_sample(&ds, 0, "p1", "r1", NULL, "objects");
	check_sample(&ds, 1, "p2", "r2", NULL, "objects");
	check_sample(&ds, 2, "p3", "r3", NULL, "objects");
	check_sample(&ds, 3, "p4", NULL, NULL, "objects"); /* its huge "id" is no error */
	bk_dataset_free(&ds);

	/* the first present key wins, null or not (the tool's nested item.get); both
	 * lists in their documented order; a null prompt skips the row (record 3) */
	load(&ds, D "precedence.json", BK_FMT_AUTO);
	CHECK(ds.n == 4 && ds.paired && ds.skipped == 1, "precedence: n %zu skipped %zu", ds.n,
	      ds.skipped);
	check_sample(&ds, 0, "p", "r", NULL, "precedence");
	check_sample(&ds, 1, "u", "c", NULL, "precedence");
	check_sample(&ds, 2, "t", "an", NULL, "precedence");
	check_sample(&ds, 3, "ins", NULL, "row system", "precedence");
	bk_dataset_free(&ds);

	/* rows the tool's _load_json skips: null or empty prompt (not the next key);
	 * a white-space response is kept here (bk-tokenize drops it, as the trainer) */
	load(&ds, D "skip.json", BK_FMT_AUTO);
	CHECK(ds.n == 2 && ds.paired && ds.skipped == 3, "skip: n %zu skipped %zu", ds.n,
	      ds.skipped);
	check_sample(&ds, 0, "P", " ", NULL, "skip");
	check_sample(&ds, 1, "Q5", NULL, NULL, "skip");
	bk_dataset_free(&ds);
	/* chat rows: the nearest user turn must be non-empty, the answer non-blank */
	load(&ds, D "skip_chat.jsonl", BK_FMT_AUTO);
	CHECK(ds.n == 3 && ds.paired && ds.skipped == 2, "skip_chat: n %zu skipped %zu", ds.n,
	      ds.skipped);
	check_sample(&ds, 0, "A", "B", NULL, "skip_chat");
	check_sample(&ds, 1, "F", NULL, NULL, "skip_chat");
	check_sample(&ds, 2, " ", "H", NULL, "skip_chat");
	bk_dataset_free(&ds);
	CHECK(bk_text_blank("") && bk_text_blank(" \t\r\n\v\f\x1c\xc2\x85\xc2\xa0\xe3\x80\x80"),
	      "blank: Python's white space");
	CHECK(!bk_text_blank("\xe2\x80\x8b") && !bk_text_blank(" x "), "blank: others");
}

static void test_wrappers(void)
{
	bk_dataset ds;
	load(&ds, D "wrap_pairs.json", BK_FMT_AUTO); /* pairs before data and prompts */
	CHECK(ds.n == 1 && ds.paired, "wrap_pairs: n %zu", ds.n);
	check_sample(&ds, 0, "wp", "wr", NULL, "wrap_pairs");
	bk_dataset_free(&ds);

	load(&ds, D "wrap_prompts.json", BK_FMT_AUTO); /* training_prompts before prompts */
	CHECK(ds.n == 2 && !ds.paired, "wrap_prompts: n %zu", ds.n);
	check_sample(&ds, 0, "a", NULL, NULL, "wrap_prompts");
	check_sample(&ds, 1, "b", NULL, NULL, "wrap_prompts");
	bk_dataset_free(&ds);

	load(&ds, D "wrap_questions.json", BK_FMT_AUTO);
	CHECK(ds.n == 1 && ds.paired, "wrap_questions: n %zu", ds.n);
	check_sample(&ds, 0, "why?", "because", NULL, "wrap_questions");
	bk_dataset_free(&ds);
}

static void test_paired(void)
{
	bk_dataset ds;
	load(&ds, D "paired_one.json", BK_FMT_AUTO);
	CHECK(ds.n == 3 && ds.paired == 1, "paired_one: n %zu paired %d", ds.n, ds.paired);
	check_sample(&ds, 0, "a", NULL, NULL, "paired_one");
	check_sample(&ds, 1, "b", "yes", NULL, "paired_one");
	check_sample(&ds, 2, "c", "", NULL, "paired_one"); /* empty kept as "" */
	bk_dataset_free(&ds);

	load(&ds, D "unpaired.json", BK_FMT_AUTO); /* only empty responses: not paired */
	CHECK(ds.n == 3 && ds.paired == 0, "unpaired: n %zu paired %d", ds.n, ds.paired);
	check_sample(&ds, 0, "a", "", NULL, "unpaired");
	check_sample(&ds, 2, "c", NULL, NULL, "unpaired");

	/* appending: inline prompts, then a paired file */
	bk_dataset_add(&ds, "inline", NULL, "sys");
	CHECK(ds.n == 4 && !ds.paired, "add without response keeps unpaired");
	check_sample(&ds, 3, "inline", NULL, "sys", "add");
	bk_dataset_load(&ds, D "objects.json", BK_FMT_AUTO);
	CHECK(ds.n == 8 && ds.paired, "load appends: n %zu paired %d", ds.n, ds.paired);
	check_sample(&ds, 4, "p1", "r1", NULL, "append");
	bk_dataset_free(&ds);
}

static void test_chat(void)
{
	bk_dataset ds;
	load(&ds, D "chat.json", BK_FMT_AUTO);
	CHECK(ds.paired, "chat is paired");
	CHECK(ds.n == 6, "chat: n %zu want 6", ds.n);
	/* several assistant turns; the empty one is skipped; two answers to one user */
	check_sample(&ds, 0, "u1", "a1", "Be terse.", "chat");
	check_sample(&ds, 1, "u2", "a2", "Be terse.", "chat");
	check_sample(&ds, 2, "u2", "a2b", "Be terse.", "chat");
	/* greeting before any user skipped; tool ignored; null content skipped */
	check_sample(&ds, 3, "u4", "a4", "row sys", "chat");
	/* a user-only row is a prompt */
	check_sample(&ds, 4, "only a question", NULL, NULL, "chat");
	/* content parts: text parts concatenated, images ignored; messages beat prompt */
	check_sample(&ds, 5, "look here", "seen", NULL, "chat");
	bk_dataset_free(&ds);

	load(&ds, D "sharegpt.json", BK_FMT_AUTO);
	CHECK(ds.n == 3 && ds.paired, "sharegpt: n %zu", ds.n);
	check_sample(&ds, 0, "h1", "g1", "S", "sharegpt");
	check_sample(&ds, 1, "h2", "g2", "S", "sharegpt");
	check_sample(&ds, 2, "u", "a", "rowsys", "sharegpt");
	bk_dataset_free(&ds);
}

static void test_jsonl_text(void)
{
	bk_dataset ds;
	load(&ds, D "mixed.jsonl", BK_FMT_AUTO);
	CHECK(ds.n == 5 && ds.paired, "mixed: n %zu", ds.n);
	check_sample(&ds, 0, "plain string prompt", NULL, NULL, "mixed");
	check_sample(&ds, 1, "col p", "col r", NULL, "mixed");
	check_sample(&ds, 2, "mu", "ma", NULL, "mixed");
	check_sample(&ds, 3, "sh", "sg", NULL, "mixed");
	check_sample(&ds, 4, "do it", "done", NULL, "mixed");
	bk_dataset_free(&ds);

	load(&ds, D "crlf_bom.jsonl", BK_FMT_JSONL);
	CHECK(ds.n == 2, "crlf_bom: n %zu", ds.n);
	check_sample(&ds, 0, "bom p", NULL, NULL, "crlf_bom");
	check_sample(&ds, 1, "crlf p", "crlf r\r\n", NULL, "crlf_bom"); /* escapes kept */
	bk_dataset_free(&ds);

	/* blank and white-space-only lines skipped, other spaces kept */
	load(&ds, D "prompts.txt", BK_FMT_AUTO);
	CHECK(ds.n == 4 && !ds.paired, "prompts.txt: n %zu", ds.n);
	check_sample(&ds, 0, "first prompt", NULL, NULL, "text");
	check_sample(&ds, 1, "  indented prompt  ", NULL, NULL, "text");
	check_sample(&ds, 2, "\t\xc3\xbc\xc3\xb1\xc3\xad\xe6\x97\xa5\xe6\x9c\xac", NULL, NULL,
		     "text");
	check_sample(&ds, 3, "last without newline", NULL, NULL, "text");
	bk_dataset_free(&ds);

	load(&ds, D "crlf.txt", BK_FMT_TEXT);
	CHECK(ds.n == 3, "crlf.txt: n %zu", ds.n);
	check_sample(&ds, 0, "one", NULL, NULL, "crlf");
	check_sample(&ds, 1, "two", NULL, NULL, "crlf");
	check_sample(&ds, 2, "three", NULL, NULL, "crlf");
	bk_dataset_free(&ds);

	/* a JSON file read as text: one prompt per line, verbatim */
	load(&ds, D "objects.json", BK_FMT_TEXT);
	CHECK(ds.n == 6, "json as text: n %zu", ds.n);
	check_sample(&ds, 1, "  {\"prompt\": \"p1\", \"response\": \"r1\"},", NULL, NULL, "as text");
	bk_dataset_free(&ds);

	/* JSON Lines forced on a one-line JSON list: the list is not a row */
	load_dies(D "strings.json", BK_FMT_JSONL, "strings.json: line 1: not a string or an object");
}

static void test_sniff(void)
{
	bk_dataset ds;
	load(&ds, D "noext_json", BK_FMT_AUTO);
	CHECK(ds.n == 2, "noext_json: n %zu", ds.n);
	check_sample(&ds, 1, "y", NULL, NULL, "noext_json");
	bk_dataset_free(&ds);

	load(&ds, D "noext_jsonl", BK_FMT_AUTO);
	CHECK(ds.n == 2 && ds.paired, "noext_jsonl: n %zu", ds.n);
	check_sample(&ds, 1, "l2", "r2", NULL, "noext_jsonl");
	bk_dataset_free(&ds);

	load(&ds, D "noext_text", BK_FMT_AUTO);
	CHECK(ds.n == 2 && !ds.paired, "noext_text: n %zu", ds.n);
	check_sample(&ds, 1, "[bracket later] is fine", NULL, NULL, "noext_text");
	bk_dataset_free(&ds);

	/* sniffed as JSON Lines: errors name the line */
	load_dies(D "noext_jsonl_bad", BK_FMT_AUTO, "noext_jsonl_bad: line 2: column");

	/* from memory, name decides the extension */
	static const char mem[] = "[\"m1\", {\"question\": \"m2\", \"target\": \"t\"}]";
	memset(&ds, 0, sizeof ds);
	bk_dataset_parse(&ds, "mem.json", mem, sizeof mem - 1, BK_FMT_AUTO);
	CHECK(ds.n == 2 && ds.paired, "parse from memory: n %zu", ds.n);
	check_sample(&ds, 1, "m2", "t", NULL, "mem");
	bk_dataset_free(&ds);

	/* stdin: "-" sniffs the content and is called "stdin" in messages */
	load_ctx c = {"-", BK_FMT_AUTO, D "err_type.jsonl"};
	expect_die("stdin", do_load, &c, "stdin: line 3: key 'prompt' is not a string");

	CHECK(bk_input_format_parse("auto") == BK_FMT_AUTO, "parse auto");
	CHECK(bk_input_format_parse("json") == BK_FMT_JSON, "parse json");
	CHECK(bk_input_format_parse("jsonl") == BK_FMT_JSONL, "parse jsonl");
	CHECK(bk_input_format_parse("ndjson") == BK_FMT_JSONL, "parse ndjson");
	CHECK(bk_input_format_parse("text") == BK_FMT_TEXT, "parse text");
	CHECK(!strcmp(bk_input_format_name(BK_FMT_JSONL), "jsonl"), "format name");
	expect_exit("format", 2, do_format, "yaml", "--format: unknown input format 'yaml'");
}

static void test_data_errors(void)
{
	load_dies(D "err_syntax.json", BK_FMT_AUTO, "err_syntax.json: line 2: column 17: ");
	load_dies(D "err_type.jsonl", BK_FMT_AUTO,
		  "err_type.jsonl: line 3: key 'prompt' is not a string");
	load_dies(D "err_nokey.json", BK_FMT_AUTO,
		  "err_nokey.json: record 3: no prompt key (tried prompt, user_message, input, "
		  "question, text, instruction)");
	load_dies(D "err_resptype.json", BK_FMT_AUTO,
		  "err_resptype.json: record 1: key 'response' is not a string");
	load_dies(D "err_utf8.json", BK_FMT_AUTO, "err_utf8.json: line 3: column");
	load_dies(D "err_utf8.json", BK_FMT_AUTO, "0xff");
	load_dies(D "err_utf8.jsonl", BK_FMT_AUTO, "err_utf8.jsonl: line 2: column");
	load_dies(D "err_utf8.txt", BK_FMT_AUTO, "err_utf8.txt: line 3: invalid utf-8");
	load_dies(D "err_nul.txt", BK_FMT_AUTO, "err_nul.txt: line 2: nul byte");
	load_dies(D "err_empty.json", BK_FMT_AUTO, "err_empty.json: no samples");
	load_dies(D "err_blank.txt", BK_FMT_AUTO, "err_blank.txt: no samples");
	load_dies(D "err_emptylist.json", BK_FMT_AUTO, "err_emptylist.json: no samples");
	load_dies(D "err_nowrap.json", BK_FMT_AUTO,
		  "err_nowrap.json: no list of samples in the top-level object (tried pairs, data, "
		  "samples, completions, training_samples, training_prompts, prompts, questions)");
	load_dies(D "err_wrapnotlist.json", BK_FMT_AUTO,
		  "err_wrapnotlist.json: key 'data' is not a list");
	load_dies(D "err_row.json", BK_FMT_AUTO, "err_row.json: record 2: not a string or an object");
	load_dies(D "err_scalar.json", BK_FMT_AUTO, "err_scalar.json: the top level is not a list");
	load_dies(D "err_nouser.jsonl", BK_FMT_AUTO,
		  "err_nouser.jsonl: no samples (every row skipped: null or empty prompt, or no "
		  "user/assistant pair)");
	load_dies(D "err_role.json", BK_FMT_AUTO,
		  "err_role.json: record 1: messages[0]: key 'role' is not a string");
	load_dies(D "err_content.json", BK_FMT_AUTO,
		  "err_content.json: record 1: messages[0]: key 'content' is not a string");
	load_dies(D "err_convlist.json", BK_FMT_AUTO,
		  "err_convlist.json: record 1: key 'conversations' is not a list");
	load_dies(D "err_jsonl_as.json", BK_FMT_AUTO, "err_jsonl_as.json: line 2: column");
	load_dies(D "err_jsonl_as.json", BK_FMT_AUTO, "use format jsonl");
	load_dies(D "err_jsonl_syntax.jsonl", BK_FMT_AUTO, "err_jsonl_syntax.jsonl: line 2: column");
	load_dies(D "err_systype.json", BK_FMT_AUTO,
		  "err_systype.json: record 1: key 'system' is not a string");
	load_dies(D "no_such_file.json", BK_FMT_AUTO, "no_such_file.json: No such file");
}

/* ---- system prompt ---- */

static void check_system(const char *what, sys_ctx c, const char *want)
{
	char *s = bk_system_prompt(c.system, c.file, c.corpus, c.format, c.tmpl);
	CHECK(str_eq(s, want), "%s: got '%s' want '%s'", what, show(s), show(want));
	free(s);
}

#define PRE "You are a helpful assistant with the following knowledge base:\n\n"
#define POST "\n\nUse this knowledge to answer questions accurately."

static void test_system(void)
{
	check_system("none", (sys_ctx){0}, NULL);
	check_system("text", (sys_ctx){.system = " Be \xc3\xa9 nice.\n"}, " Be \xc3\xa9 nice.\n");
	check_system("file", (sys_ctx){.file = D "system.txt"},
		     "You are a pirate.\n  Speak like one.");

	const char *papers = "Paper 1: T1\nA1\n\nPaper 2: \xc3\x9c" "2\nA2\nmore";
	const char *text = "Line one\nLine two";
	const char *list = "fact a\n\nfact b\n\nfact \xc3\xa9";
	const char *json = "{\n  \"name\": \"bakery\",\n  \"items\": [\n    1,\n    2\n  ],\n"
			   "  \"\xc3\xbc\": \"x\",\n  \"nested\": {\n    \"t\": true,\n"
			   "    \"n\": null\n  }\n}";
	struct {
		const char *file, *format, *body;
	} corp[] = {
		{D "papers.json", "papers", papers},
		{D "corpus.txt", "text", text},
		{D "corpus.txt", NULL, text},
		{D "corpus_list.json", "list", list},
		{D "corpus_obj.json", "json", json},
		{D "corpus_obj.json", "other", json},
		{D "papers.json", "json",
		 "[\n  {\n    \"title\": \"T1\",\n    \"abstract\": \"A1\"\n  },\n  {\n"
		 "    \"title\": \"\xc3\x9c" "2\",\n    \"abstract\": \"A2\\nmore\"\n  }\n]"},
	};
	for (size_t i = 0; i < sizeof corp / sizeof corp[0]; i++) {
		char want[1024];
		snprintf(want, sizeof want, PRE "%s" POST, corp[i].body);
		check_system(corp[i].file, (sys_ctx){.corpus = corp[i].file, .format = corp[i].format},
			     want);
		snprintf(want, sizeof want, "Knowledge:\n%s\nAgain: %s", corp[i].body, corp[i].body);
		check_system(corp[i].file,
			     (sys_ctx){.corpus = corp[i].file, .format = corp[i].format,
				       .tmpl = D "template.txt"},
			     want);
	}

	system_usage("two sources", (sys_ctx){.system = "x", .file = D "system.txt"},
		    "give only one of --system, --system-file and --corpus");
	system_usage("text and corpus", (sys_ctx){.system = "x", .corpus = D "corpus.txt"},
		    "give only one of");
	system_usage("file and corpus", (sys_ctx){.file = D "system.txt", .corpus = D "corpus.txt"},
		    "give only one of");
	system_usage("template alone", (sys_ctx){.system = "x", .tmpl = D "template.txt"},
		    "--system-template needs --corpus");
	system_usage("format alone", (sys_ctx){.format = "papers"}, "--corpus-format needs --corpus");
	system_dies("no placeholder",
		    (sys_ctx){.corpus = D "corpus.txt", .tmpl = D "template_bad.txt"},
		    "template_bad.txt: no '{corpus}' in the system template");
	system_dies("empty text", (sys_ctx){.system = ""}, "--system: empty system prompt");
	system_dies("empty file", (sys_ctx){.file = D "system_empty.txt"},
		    "system_empty.txt: empty system prompt");
	system_dies("bad utf-8 file", (sys_ctx){.file = D "system_bad.txt"},
		    "system_bad.txt: line 1: invalid utf-8");
	system_dies("bad utf-8 text", (sys_ctx){.system = "a\xff"}, "--system: invalid utf-8");
	system_dies("missing file", (sys_ctx){.file = D "nope.txt"}, "nope.txt: No such file");
	system_dies("no abstract", (sys_ctx){.corpus = D "papers_noabs.json", .format = "papers"},
		    "papers_noabs.json: record 2: no key 'abstract'");
	system_dies("abstract type", (sys_ctx){.corpus = D "papers_badtype.json", .format = "papers"},
		    "papers_badtype.json: record 1: key 'abstract' is not a string");
	system_dies("papers not list",
		    (sys_ctx){.corpus = D "papers_notlist.json", .format = "papers"},
		    "papers_notlist.json: a papers corpus must be a list");
	system_dies("list element", (sys_ctx){.corpus = D "list_bad.json", .format = "list"},
		    "list_bad.json: record 2: not a string");
	system_dies("empty list", (sys_ctx){.corpus = D "list_empty.json", .format = "list"},
		    "list_empty.json: empty corpus");
	system_dies("bad corpus json", (sys_ctx){.corpus = D "err_syntax.json", .format = "json"},
		    "err_syntax.json: line 2: column");
	system_dies("bad corpus text", (sys_ctx){.corpus = D "err_utf8.txt", .format = "text"},
		    "err_utf8.txt: line 3: invalid utf-8");
}

/* jansson's errors as users read them: no flag names, no "line -1" */
static void test_json_error_text(void)
{
	json_error_t err;
	CHECK(!json_loads("[\"a\\u0000b\"]", 0, &err), "NUL accepted");
	const char *m = bk_json_error(&err);
	CHECK(!strstr(m, "JSON_ALLOW_NUL") && strstr(m, "NUL characters cannot be read") &&
		      !strncmp(m, "line 1: column ", 15),
	      "NUL: '%s' (jansson: '%s')", m, err.text);
	CHECK(!json_load_file("tests/no-such-file.json", 0, &err), "missing file loaded");
	m = bk_json_error(&err);
	CHECK(err.line == -1 && !strstr(m, "line") && strstr(m, "no-such-file.json"),
	      "missing file: '%s' (jansson line %d)", m, err.line);
	CHECK(!json_loads("{\n\"a\": }", 0, &err), "bad JSON accepted");
	m = bk_json_error(&err);
	CHECK(!strncmp(m, "line 2: column ", 15), "bad JSON: '%s'", m);
}

int main(void)
{
	test_json_error_text();
	test_json_shapes();
	test_wrappers();
	test_paired();
	test_chat();
	test_jsonl_text();
	test_sniff();
	test_data_errors();
	test_system();
	return bk_test_done("test_inputs");
}
