/* test_template.c - chat template ids against HF's apply_chat_template golden ids
 * (the JSON files in tests/golden/templates, from tests/ref/make_template_golden.py), template
 * detection on every model dir in tests/data/hf-configs, refusals, stop ids, raw. */
#include "formats/template.h"
#include "tests/harness.h"

#include "common/files.h"

#include <dirent.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *goldens[] = {"llama2",  "zephyr",        "mistral-v0.1", "mistral-v0.2",
				"chatml",  "gemma",         "qwen2.5",      "qwen3",
				"qwen3-nothink", "smollm2", "llama3",       "llama3.1",
				"llama3.2", "mistral-v3-tekken", "mistral-v3"};

/* A golden's tokenizer: a tokenizer.model, or a compressed tokenizer.json of
 * tests/golden/bpe (or a compressed NAME.model.xz: a tokenizer.model) unpacked (with the
 * golden's tokenizer_config.json) into a temporary directory, removed by the caller
 * with rm_dir. */
static bk_tok *golden_tokenizer(const char *tok, const char *config, char *dir, size_t dirlen)
{
	dir[0] = 0;
	size_t n = strlen(tok);
	if (n < 3 || strcmp(tok + n - 3, ".xz"))
		return bk_tok_open(tok);
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, dirlen, "%s/test_template.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	CHECK(mkdtemp(dir) != NULL, "mkdtemp %s", dir);
	const char *file = n > 9 && !strcmp(tok + n - 9, ".model.xz") ? "tokenizer.model"
								       : "tokenizer.json";
	char *cmd = xasprintf("xz -dc '%s' > '%s/%s' && cp '%s' '%s/tokenizer_config.json'", tok,
			      dir, file, config ? config : "/dev/null", dir);
	CHECK(system(cmd) == 0, "%s", cmd);
	free(cmd);
	return bk_tok_open(dir);
}

static void rm_dir(const char *dir)
{
	if (!*dir)
		return;
	char *cmd = xasprintf("rm -rf '%s'", dir);
	CHECK(system(cmd) == 0, "%s", cmd);
	free(cmd);
}

/* Runs fn(arg) in a child with stderr captured; returns the exit status (-1: killed). */

static size_t count_lines(const char *s)
{
	size_t n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

/* Compares ids with a golden JSON array; prints the first differing position. */
static int same_ids(const bk_tok *spm, const int32_t *ids, size_t n, json_t *want,
		    const char *what)
{
	size_t wn = json_array_size(want), i;
	for (i = 0; i < n && i < wn; i++)
		if (ids[i] != (int32_t)json_integer_value(json_array_get(want, i)))
			break;
	if (i == n && i == wn)
		return 1;
	int32_t got = i < n ? ids[i] : -1;
	int32_t exp = i < wn ? (int32_t)json_integer_value(json_array_get(want, i)) : -1;
	const char *gp = got >= 0 ? bk_tok_id_to_piece(spm, got) : "(end)";
	const char *ep = exp >= 0 ? bk_tok_id_to_piece(spm, exp) : "(end)";
	fprintf(stderr, "  %s: first difference at position %zu of %zu (golden %zu): got %d '%s', want %d '%s'\n",
		what, i, n, wn, (int)got, gp ? gp : "?", (int)exp, ep ? ep : "?");
	return 0;
}

static const char *opt_string(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static void test_goldens(void)
{
	int n_split = 0, n_student = 0;
	for (size_t g = 0; g < sizeof goldens / sizeof *goldens; g++) {
		char *path = xasprintf("tests/golden/templates/%s.json", goldens[g]);
		json_error_t jerr;
		json_t *doc = json_load_file(path, 0, &jerr);
		CHECK(doc != NULL, "%s: %s", path, jerr.text);
		if (!doc) {
			free(path);
			continue;
		}
		CHECK(opt_string(doc, "generated_by") != NULL, "%s: no generated_by", path);
		const char *tname = opt_string(doc, "template");
		int tmpl = tname ? bk_template_from_name(tname) : -1;
		CHECK(tmpl >= 0, "%s: template '%s'", path, tname ? tname : "(none)");
		const char *tok = opt_string(doc, "tokenizer");
		if (tmpl < 0 || !tok) {
			json_decref(doc);
			free(path);
			continue;
		}
		char dir[256];
		bk_tok *spm = golden_tokenizer(tok, opt_string(doc, "tokenizer_config"), dir, sizeof dir);
		json_t *th = json_object_get(doc, "thinking");
		bk_template_set_thinking(!json_is_false(th));
		bk_template_set_date(opt_string(doc, "date"));
		int want_split = 0, got_split = 0;
		json_t *cases = json_object_get(doc, "cases");
		CHECK(json_array_size(cases) >= 8, "%s: %zu cases", path, json_array_size(cases));
		size_t i;
		json_t *c;
		json_array_foreach(cases, i, c) {
			const char *name = opt_string(c, "name");
			const char *system = opt_string(c, "system");
			const char *user = opt_string(c, "user");
			const char *response = opt_string(c, "response");
			char *what = xasprintf("%s/%s", goldens[g], name ? name : "?");
			bk_ids ids = {0};
			bk_template_prompt(tmpl, spm, system, user ? user : "", &ids);
			CHECK(same_ids(spm, ids.v, ids.n, json_object_get(c, "prompt_ids"), what),
			      "%s: prompt ids differ from HF", what);
			json_t *student = json_object_get(c, "student_ids");
			if (student) { /* the same user turn without the system prompt */
				bk_ids s = {0};
				bk_template_prompt(tmpl, spm, NULL, user ? user : "", &s);
				CHECK(same_ids(spm, s.v, s.n, student, what),
				      "%s: student prompt ids differ from HF", what);
				free(s.v);
				n_student++;
			}
			json_t *split = json_object_get(c, "split_ids");
			if (response && split) {
				/* HF merged across the prompt/response boundary (its prompt is
				 * not a prefix of its full ids); ours are HF's prompt ids + the
				 * response tokenized alone, and must not equal HF's joint ids */
				bk_template_response(tmpl, spm, response, &ids);
				CHECK(same_ids(spm, ids.v, ids.n, split, what),
				      "%s: prompt + response ids differ from the split golden", what);
				CHECK(!json_equal(split, json_object_get(c, "full_ids")),
				      "%s: split_ids equal full_ids", what);
				if (tmpl == BK_TMPL_MISTRAL || tmpl == BK_TMPL_MISTRAL_V01)
					n_split++;
				got_split++;
			} else if (response) {
				bk_template_response(tmpl, spm, response, &ids);
				CHECK(same_ids(spm, ids.v, ids.n, json_object_get(c, "full_ids"), what),
				      "%s: prompt + response ids differ from HF", what);
			}
			free(ids.v);
			free(what);
		}
		want_split = (int)json_integer_value(json_object_get(doc, "boundary_merges"));
		if (json_object_get(doc, "boundary_merges"))
			CHECK(got_split == want_split, "%s: %d boundary-merge cases, want %d", path,
			      got_split, want_split);
		bk_tok_free(spm);
		rm_dir(dir);
		json_decref(doc);
		free(path);
	}
	bk_template_set_thinking(1);
	bk_template_set_date(NULL);
	/* mistral v0.1 and v0.2 "[/INST]" + "], he said." */
	CHECK(n_split == 2, "%d boundary-merge cases, want 2", n_split);
	CHECK(n_student >= 115, "%d student prompts compared", n_student);
}

static void test_detect(void)
{
	static const struct {
		const char *dir, *want;
	} expect[] = {
		{"Llama-2-7b-chat-hf", "llama2"},
		{"Mistral-7B-Instruct-v0.1", "mistral-v0.1"},
		{"Mistral-7B-Instruct-v0.1/rev-2dcff66e", "mistral"},
		{"Mistral-7B-Instruct-v0.2", "mistral"},
		{"Qwen2.5-0.5B-Instruct", "qwen2.5"},
		{"Qwen3-0.6B", "qwen3"},
		{"SmolLM2-135M-Instruct", "smollm2"},
		{"TinyLlama-1.1B-Chat-v1.0", "zephyr"},
		{"gemma-2b-it", "gemma"},
	};
	size_t n = sizeof expect / sizeof *expect, seen = 0;
	for (size_t i = 0; i < n; i++) {
		char *dir = xasprintf("tests/data/hf-configs/%s", expect[i].dir);
		int t = bk_template_detect(dir);
		CHECK(t == bk_template_from_name(expect[i].want), "%s: detected '%s', want '%s'", dir,
		      t >= 0 ? bk_template_name(t) : "?", expect[i].want);
		free(dir);
	}
	/* every model dir there is in the table above */
	DIR *d = opendir("tests/data/hf-configs");
	CHECK(d != NULL, "cannot open tests/data/hf-configs");
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		int found = 0;
		for (size_t i = 0; i < n; i++)
			found |= !strcmp(expect[i].dir, e->d_name);
		CHECK(found, "tests/data/hf-configs/%s: not in the detection table", e->d_name);
		seen++;
	}
	if (d)
		closedir(d);
	CHECK(seen >= 8, "only %zu model dirs", seen);
	/* the templates of tests/data/templates (llama.cpp's copies of the real ones) */
	static const struct {
		const char *file, *want;
	} texts[] = {
		{"meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3.1"},
		{"meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3.2"},
		{"google-gemma-2-2b-it.jinja", "gemma"},
		{"Qwen-Qwen2.5-7B-Instruct.jinja", "qwen2.5"},
		{"Qwen-Qwen3-0.6B.jinja", "qwen3"},
		{"mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral-v3-tekken"},
		{"mistralai-Mistral-7B-Instruct-v0.3.jinja", "mistral-v3"},
	};
	for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
		char *path = xasprintf("tests/data/templates/%s", texts[i].file);
		char *text = bk_read_file(path, NULL);
		int t = bk_template_detect_text(path, text);
		CHECK(t == bk_template_from_name(texts[i].want), "%s: detected '%s', want '%s'", path,
		      bk_template_name(t), texts[i].want);
		free(text);
		free(path);
	}
	/* the GGUF Qwen2 template: chatml with "You are a helpful assistant" */
	CHECK(bk_template_detect_text("qwen2", "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}") ==
		      BK_TMPL_QWEN2,
	      "qwen2 default system prompt");
	CHECK(bk_template_detect_text("x", "{{ '<|start_header_id|>' + m + '<|end_header_id|>' }}") ==
		      BK_TMPL_LLAMA3,
	      "llama3.0");
	/* Mistral V3 variants: the system prompt put into the last user message by
	 * (message == user_messages[-1]) instead of loop.last; single quotes; mistral-common's
	 * chat_templates/v3_spm.jinja ('[INST] ' and '[/INST]' written apart) */
	static const char *const v3[] = {
		"{%- if (message == user_messages[-1]) and system_message is defined %}{{- \"[INST] \" + "
		"system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}",
		"{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m['content'] + '[/INST]' }}{% endfor %}",
		"{{- '[INST] ' }}{{- message['content']}}{{- '[/INST]' }}",
	};
	for (size_t i = 0; i < sizeof v3 / sizeof *v3; i++) {
		int t = bk_template_detect_text("x", v3[i]);
		CHECK(t == BK_TMPL_MISTRAL_V3, "Mistral V3 variant %zu: detected '%s'", i,
		      bk_template_name(t));
	}
	/* a base model without a chat template, and a dir without tokenizer_config.json */
	CHECK(bk_template_detect("models/stories260K") == BK_TMPL_RAW, "stories260K not raw");
	CHECK(bk_template_detect("models/llama2-tokenizer") == BK_TMPL_RAW, "llama2-tokenizer");
}

static void detect_unknown(void *dir)
{
	bk_template_detect(dir);
}

struct refusal {
	int tmpl;
	const bk_tok *spm;
};

static void prompt_child(void *arg)
{
	struct refusal *r = arg;
	bk_ids ids = {0};
	bk_template_prompt(r->tmpl, r->spm, "sys", "hi", &ids);
}

static void test_refusals(const bk_tok *llama)
{
	char err[4096];
	static const struct {
		const char *tmpl, *token;
	} cases[] = {{"chatml", "'<|im_start|>'"}, {"gemma", "'<start_of_turn>'"},
		     {"mistral-v3", "'[INST]'"}};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		struct refusal r = {bk_template_from_name(cases[i].tmpl), llama};
		int st = bk_run_child(prompt_child, &r, err, sizeof err);
		CHECK(st == BK_EXIT_FAIL, "%s on the llama vocabulary: exit %d", cases[i].tmpl, st);
		CHECK(strstr(err, cases[i].token) && strstr(err, cases[i].tmpl) &&
			      count_lines(err) == 1,
		      "%s refusal message: %s", cases[i].tmpl, err);
	}
	/* an unrecognised chat template is refused too */
	char dir[] = "/tmp/bk-test-template-XXXXXX";
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	char *cfg = bk_path_join(dir, "tokenizer_config.json");
	const char *json = "{\"chat_template\": \"{{ '<|user|>' }}\"}";
	bk_write_file_atomic(cfg, json, strlen(json));
	int st = bk_run_child(detect_unknown, dir, err, sizeof err);
	CHECK(st == BK_EXIT_FAIL && strstr(err, "none of the known templates") &&
		      count_lines(err) == 1,
	      "unknown template: exit %d: %s", st, err);
	/* a chatml template with a default system prompt bakery does not know */
	json = "{\"chat_template\": \"{{ '<|im_start|>system\\\\nYou are Bob.<|im_end|>' }}\"}";
	bk_write_file_atomic(cfg, json, strlen(json));
	st = bk_run_child(detect_unknown, dir, err, sizeof err);
	CHECK(st == BK_EXIT_FAIL && strstr(err, "You are Bob.") && count_lines(err) == 1,
	      "unknown default system prompt: exit %d: %s", st, err);
	/* Mistral V7's [SYSTEM_PROMPT] blocks are not written here: refused, not "mistral" */
	json = "{\"chat_template\": \"{{ bos_token }}[SYSTEM_PROMPT]{{ s }}[/SYSTEM_PROMPT][INST]{{ u }}[/INST]\"}";
	bk_write_file_atomic(cfg, json, strlen(json));
	st = bk_run_child(detect_unknown, dir, err, sizeof err);
	CHECK(st == BK_EXIT_FAIL && strstr(err, "[SYSTEM_PROMPT]") && count_lines(err) == 1,
	      "Mistral V7 template: exit %d: %s", st, err);
	/* a list of named templates */
	json = "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"},"
	       " {\"name\": \"default\", \"template\": \"<|im_start|>\"}]}";
	bk_write_file_atomic(cfg, json, strlen(json));
	CHECK(bk_template_detect(dir) == BK_TMPL_CHATML, "named template list");
	unlink(cfg);
	rmdir(dir);
	free(cfg);
}

static void set_date_child(void *date)
{
	bk_template_set_date(date);
}

static void test_names(void)
{
	for (int t = 0; t < BK_TMPL_COUNT; t++) {
		CHECK(bk_template_from_name(bk_template_name(t)) == t, "name round trip %d", t);
		CHECK(strstr(bk_template_names(), bk_template_name(t)) != NULL, "names list %d", t);
	}
	CHECK(bk_template_from_name("llama4") == -1, "unknown name");
	/* the Llama-3.1/3.2 date: HF's defaults, then the flag; qwen3's thinking mode */
	bk_template_set_date(NULL);
	CHECK(!strcmp(bk_template_date(BK_TMPL_LLAMA31), "26 Jul 2024"), "3.1 default date");
	char today[32];
	time_t now = time(NULL);
	struct tm tm;
	localtime_r(&now, &tm);
	strftime(today, sizeof today, "%d %b %Y", &tm); /* the C locale: English months */
	CHECK(!strcmp(bk_template_date(BK_TMPL_LLAMA32), today), "3.2 default date %s, want %s",
	      bk_template_date(BK_TMPL_LLAMA32), today);
	CHECK(bk_template_date(BK_TMPL_CHATML) == NULL, "chatml has no date");
	bk_template_set_date("05 Mar 2025");
	CHECK(!strcmp(bk_template_variant(BK_TMPL_LLAMA32), "llama3.2 date=05 Mar 2025"), "variant %s",
	      bk_template_variant(BK_TMPL_LLAMA32));
	bk_template_set_date(NULL);
	bk_template_set_thinking(0);
	CHECK(!strcmp(bk_template_variant(BK_TMPL_QWEN3), "qwen3 thinking=0"), "qwen3 variant");
	bk_template_set_thinking(1);
	CHECK(!strcmp(bk_template_variant(BK_TMPL_CHATML), "chatml"), "chatml variant");
	CHECK(bk_template_default_system(BK_TMPL_SMOLLM2) != NULL &&
		      bk_template_default_system(BK_TMPL_CHATML) == NULL,
	      "default system prompts");
	char err[512];
	static const char *bad_dates[] = {"2025-03-05", "5 Mar 2025", "05 March 2025", "05 Xyz 2025", ""};
	for (size_t i = 0; i < sizeof bad_dates / sizeof *bad_dates; i++) {
		int st = bk_run_child(set_date_child, (void *)bad_dates[i], err, sizeof err);
		CHECK(st == BK_EXIT_FAIL && strstr(err, "DD Mon YYYY"), "date '%s': exit %d: %s",
		      bad_dates[i], st, err);
	}
	CHECK(bk_template_from_name("") == -1, "empty name");
}

static void test_stop_ids(const bk_tok *llama, const bk_tok *chat)
{
	bk_ids s = {0};
	bk_template_stop_ids(BK_TMPL_LLAMA2, llama, &s);
	CHECK(s.n == 1 && s.v[0] == 2, "llama2 stop ids");
	s.n = 0;
	bk_template_stop_ids(BK_TMPL_CHATML, chat, &s);
	CHECK(s.n == 2 && s.v[0] == bk_tok_eos(chat) &&
		      s.v[1] == bk_tok_piece_to_id(chat, "<|im_end|>"),
	      "chatml stop ids (n %zu)", s.n);
	s.n = 0;
	bk_template_stop_ids(BK_TMPL_GEMMA, chat, &s);
	CHECK(s.n == 2 && s.v[1] == bk_tok_piece_to_id(chat, "<end_of_turn>"), "gemma stop ids");
	free(s.v);
}

/* raw: BOS + text; "" system = no system; response continues the text, then EOS */
static void test_raw(void)
{
	bk_tok *spm = bk_tok_open("models/stories260K/tokenizer.model");
	bk_ids t = {0}, s = {0}, e = {0}, r = {0};
	bk_template_prompt(BK_TMPL_RAW, spm, "", "Once upon a time", &t);
	bk_template_prompt(BK_TMPL_RAW, spm, NULL, "Once upon a time", &s);
	CHECK(t.n == s.n && t.n > 1 && !memcmp(t.v, s.v, t.n * sizeof *t.v),
	      "raw: empty system differs from none");
	int32_t *ids;
	size_t n;
	bk_tok_encode(spm, "Once upon a time", 16, &ids, &n);
	CHECK(s.v[0] == bk_tok_bos(spm) && s.n == n + 1 && !memcmp(s.v + 1, ids, n * sizeof *ids),
	      "raw student is BOS + encode(user)");
	free(ids);
	t.n = 0;
	bk_template_prompt(BK_TMPL_RAW, spm, "Lily was sad.", "Once upon a time", &t);
	bk_tok_encode(spm, "Lily was sad. Once upon a time", 30, &ids, &n);
	CHECK(t.n == n + 1 && !memcmp(t.v + 1, ids, n * sizeof *ids),
	      "raw teacher is BOS + encode(system + \" \" + user)");
	free(ids);
	/* prompt + response == BOS + encode of the whole text, then EOS */
	bk_template_prompt(BK_TMPL_RAW, spm, NULL, "Lily saw a cat.", &e);
	bk_template_response(BK_TMPL_RAW, spm, "The cat was happy.", &e);
	bk_tok_encode(spm, "Lily saw a cat. The cat was happy.", 34, &ids, &n);
	CHECK(e.n == n + 2 && !memcmp(e.v + 1, ids, n * sizeof *ids) && e.v[e.n - 1] == bk_tok_eos(spm),
	      "raw prompt + response (n %zu, want %zu)", e.n, n + 2);
	free(ids);
	bk_template_response(BK_TMPL_RAW, spm, "", &r);
	CHECK(r.n == 1 && r.v[0] == bk_tok_eos(spm), "raw empty response is EOS");
	free(t.v);
	free(s.v);
	free(e.v);
	free(r.v);
	bk_tok_free(spm);
}

int main(void)
{
	bk_tok *llama = bk_tok_open("models/llama2-tokenizer/tokenizer.model");
	bk_tok *chat = bk_tok_open("tests/data/spm/chat-test.model");
	unsigned long calls = bk_tok_encode_calls;
	test_names();
	test_goldens();
	CHECK(bk_tok_encode_calls > calls, "templates made no sentencepiece calls");
	test_detect();
	test_refusals(llama);
	test_stop_ids(llama, chat);
	test_raw();
	bk_tok_free(llama);
	bk_tok_free(chat);
	return bk_test_done("test_template");
}
