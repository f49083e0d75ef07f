/* template.c - the chat templates of template.h written out as sequences of text and
 * special ids, tokenized the way HF's fast Llama tokenizer tokenizes a rendered template.
 * Not a general Jinja renderer; detection reads markers from the template text only.
 *
 * How HF tokenizes a rendered template (transformers 5, LlamaTokenizer / GemmaTokenizer):
 * special tokens are split out first; each run of text between them (a "segment") is
 * encoded alone, spaces as U+2581; a segment gets a leading U+2581 (unless it already
 * starts with a space) when the tokenizer's Metaspace prepend scheme says so: "first"
 * (legacy=false: only a segment at offset 0 of the whole string), "always"
 * (legacy=true: every segment), "never" (Gemma; Qwen's byte-level BPE).  A byte-level
 * tokenizer.json (Qwen, Llama-3, SmolLM2) never gets a prefix: each segment is encoded as
 * HF encodes the text between two special tokens, added tokens such as <think> split out.
 *
 * The templates beyond those: chatml with a default system prompt (qwen2, qwen2.5,
 * smollm2), qwen3 (think blocks, enable_thinking), Llama-3.0/3.1/3.2 (headers; the
 * date line of 3.1/3.2), Mistral's V3-Tekken (Mistral-Nemo: [INST] and [/INST] are
 * special tokens, no spaces around the text) and V3 (Mistral-7B-Instruct-v0.3: the
 * same special tokens, "[INST] " + text + "[/INST]", " " + response|trim + "</s>"). */
#include "formats/template.h"

#include "common/files.h"
#include "formats/msgjson.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum prepend { PREPEND_FIRST, PREPEND_ALWAYS, PREPEND_NEVER };

static const struct {
	const char *name;
	enum prepend prepend;
} templates[BK_TMPL_COUNT] = {
	[BK_TMPL_RAW] = {"raw", PREPEND_FIRST},
	[BK_TMPL_LLAMA2] = {"llama2", PREPEND_FIRST},
	[BK_TMPL_ZEPHYR] = {"zephyr", PREPEND_FIRST},
	[BK_TMPL_MISTRAL] = {"mistral", PREPEND_ALWAYS},
	[BK_TMPL_MISTRAL_V01] = {"mistral-v0.1", PREPEND_ALWAYS},
	[BK_TMPL_CHATML] = {"chatml", PREPEND_NEVER},
	[BK_TMPL_GEMMA] = {"gemma", PREPEND_NEVER},
	[BK_TMPL_QWEN2] = {"qwen2", PREPEND_NEVER},
	[BK_TMPL_QWEN25] = {"qwen2.5", PREPEND_NEVER},
	[BK_TMPL_SMOLLM2] = {"smollm2", PREPEND_NEVER},
	[BK_TMPL_QWEN3] = {"qwen3", PREPEND_NEVER},
	[BK_TMPL_LLAMA3] = {"llama3", PREPEND_NEVER},
	[BK_TMPL_LLAMA31] = {"llama3.1", PREPEND_NEVER},
	[BK_TMPL_LLAMA32] = {"llama3.2", PREPEND_NEVER},
	[BK_TMPL_MISTRAL_TEKKEN] = {"mistral-v3-tekken", PREPEND_NEVER},
	/* legacy=false on the hub; every segment starts with a space, so "always" is the same */
	[BK_TMPL_MISTRAL_V3] = {"mistral-v3", PREPEND_FIRST},
};

/* the default system prompts, as the real templates write them */
static const char *const default_system[BK_TMPL_COUNT] = {
	[BK_TMPL_QWEN2] = "You are a helpful assistant",
	[BK_TMPL_QWEN25] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
	[BK_TMPL_SMOLLM2] = "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
};

static int opt_thinking = 1;
static char opt_date[32];
static const char *const month[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
				    "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

void bk_template_set_thinking(int on)
{
	opt_thinking = !!on;
}

void bk_template_set_date(const char *date)
{
	if (!date) {
		opt_date[0] = 0;
		return;
	}
	int ok = strlen(date) == 11 && date[0] >= '0' && date[0] <= '3' && date[1] >= '0' &&
		 date[1] <= '9' && date[2] == ' ' && date[6] == ' ';
	int m = 0;
	for (; ok && m < 12; m++)
		if (!strncmp(date + 3, month[m], 3))
			break;
	for (int i = 7; ok && i < 11; i++)
		ok = date[i] >= '0' && date[i] <= '9';
	if (!ok || m == 12)
		die("date '%s' is not \"DD Mon YYYY\" (as \"26 Jul 2024\")", date);
	strcpy(opt_date, date);
}

const char *bk_template_date(int tmpl)
{
	static char today[32];
	if (tmpl != BK_TMPL_LLAMA31 && tmpl != BK_TMPL_LLAMA32)
		return NULL;
	if (opt_date[0])
		return opt_date;
	if (tmpl == BK_TMPL_LLAMA31)
		return "26 Jul 2024";
	/* HF's strftime_now("%d %b %Y"): datetime.now(), local time, C-locale month */
	time_t now = time(NULL);
	struct tm tm;
	localtime_r(&now, &tm);
	snprintf(today, sizeof today, "%02d %s %04d", tm.tm_mday, month[tm.tm_mon],
		 tm.tm_year + 1900);
	return today;
}

const char *bk_template_variant(int tmpl)
{
	static char buf[64];
	BUG_ON(tmpl < 0 || tmpl >= BK_TMPL_COUNT);
	if (tmpl == BK_TMPL_QWEN3)
		snprintf(buf, sizeof buf, "qwen3 thinking=%d", opt_thinking);
	else if (bk_template_date(tmpl))
		snprintf(buf, sizeof buf, "%s date=%s", templates[tmpl].name, bk_template_date(tmpl));
	else
		return templates[tmpl].name;
	return buf;
}

const char *bk_template_default_system(int tmpl)
{
	BUG_ON(tmpl < 0 || tmpl >= BK_TMPL_COUNT);
	return default_system[tmpl];
}

int bk_template_from_name(const char *name)
{
	for (int i = 0; i < BK_TMPL_COUNT; i++)
		if (!strcmp(name, templates[i].name))
			return i;
	return -1;
}

const char *bk_template_name(int tmpl)
{
	BUG_ON(tmpl < 0 || tmpl >= BK_TMPL_COUNT);
	return templates[tmpl].name;
}

const char *bk_template_names(void)
{
	return "raw, llama2, zephyr, mistral, mistral-v0.1, chatml, gemma, qwen2, qwen2.5, smollm2, "
	       "qwen3, llama3, llama3.1, llama3.2, mistral-v3, mistral-v3-tekken";
}

/* ---- detection ---- */

/* The default system prompt of a chatml template: the first string literal
 * '<|im_start|>system\n...<|im_end|>' with no expression in it (jinja escapes undone);
 * NULL when there is none. */
static char *chatml_default_system(const char *t)
{
	static const char *const head[] = {"<|im_start|>system\\n", "<|im_start|>system\n"};
	for (const char *p = t; (p = strstr(p, "<|im_start|>system"));) {
		const char *q = NULL;
		for (int h = 0; h < 2 && !q; h++)
			if (!strncmp(p, head[h], strlen(head[h])))
				q = p + strlen(head[h]);
		p += strlen("<|im_start|>system");
		if (!q)
			continue;
		const char *end = strstr(q, "<|im_end|>");
		if (!end)
			return NULL;
		if (memchr(q, '\'', (size_t)(end - q)) || memchr(q, '"', (size_t)(end - q)) ||
		    memchr(q, '{', (size_t)(end - q)) || memchr(q, '+', (size_t)(end - q)) || end == q)
			continue;
		BK_VEC(char) s = {0};
		for (const char *c = q; c < end; c++) {
			if (*c == '\\' && c + 1 < end) {
				c++;
				bk_vec_push(&s, *c == 'n' ? '\n' : *c == 't' ? '\t' : *c);
			} else {
				bk_vec_push(&s, *c);
			}
		}
		bk_vec_push(&s, 0);
		return s.v;
	}
	return NULL;
}

static int detect_text(const char *dir, const char *t)
{
	if (strstr(t, "<start_of_turn>"))
		return BK_TMPL_GEMMA;
	if (strstr(t, "<|start_header_id|>")) {
		if (!strstr(t, "Cutting Knowledge Date"))
			return BK_TMPL_LLAMA3;
		return strstr(t, "strftime_now") ? BK_TMPL_LLAMA32 : BK_TMPL_LLAMA31;
	}
	if (strstr(t, "<|im_start|>")) {
		if (strstr(t, "<think>"))
			return BK_TMPL_QWEN3;
		char *def = chatml_default_system(t);
		if (!def)
			return BK_TMPL_CHATML;
		for (int i = 0; i < BK_TMPL_COUNT; i++)
			if (default_system[i] && !strcmp(def, default_system[i])) {
				free(def);
				return i;
			}
		die("%s: chatml template with a default system prompt bakery does not know ('%.60s'); name a template (%s)",
		    dir, def, bk_template_names());
	}
	if (strstr(t, "<<SYS>>"))
		return BK_TMPL_LLAMA2;
	if (strstr(t, "[SYSTEM_PROMPT]")) /* Mistral V7 (Mistral-Small-2501 ...): not written here */
		die("%s: chat template with [SYSTEM_PROMPT] blocks (Mistral V7) is not one bakery knows; name one (%s)",
		    dir, bk_template_names());
	/* "[INST]" closing a string literal: V3-Tekken, no space after it */
	if (strstr(t, "\"[INST]\"") || strstr(t, "'[INST]'"))
		return BK_TMPL_MISTRAL_TEKKEN;
	/* "[/INST]" opening a string literal: V3, no space before it (v0.1/v0.2: ' [/INST]') */
	if (strstr(t, "\"[/INST]") || strstr(t, "'[/INST]"))
		return BK_TMPL_MISTRAL_V3;
	if (strstr(t, "[INST]"))
		return strstr(t, "eos_token + ' '") ? BK_TMPL_MISTRAL_V01 : BK_TMPL_MISTRAL;
	if (strstr(t, "<|system|>") || strstr(t, "<|assistant|>"))
		return BK_TMPL_ZEPHYR;
	die("%s: chat template matches none of the known templates (%s); name one", dir,
	    bk_template_names());
}

int bk_template_detect_text(const char *where, const char *text)
{
	return detect_text(where, text);
}

int bk_template_detect(const char *model_dir)
{
	char *jinja = bk_path_join(model_dir, "chat_template.jinja");
	char *text = bk_try_read_file(jinja, NULL);
	free(jinja);
	if (text) {
		int t = detect_text(model_dir, text);
		free(text);
		return t;
	}
	char *path = bk_path_join(model_dir, "tokenizer_config.json");
	if (!bk_file_exists(path)) {
		free(path);
		return BK_TMPL_RAW;
	}
	json_error_t err;
	/* integers as reals: model_max_length 1000000000000000019884624838656 (HF's
	 * VERY_LARGE_INTEGER) does not fit json_int_t; only chat_template is read */
	json_t *root = json_load_file(path, JSON_DECODE_INT_AS_REAL, &err);
	if (!root)
		die("%s: %s", path, bk_json_error(&err));
	json_t *ct = json_is_object(root) ? json_object_get(root, "chat_template") : NULL;
	const char *s = NULL;
	if (json_is_string(ct)) {
		s = json_string_value(ct);
	} else if (json_is_array(ct)) { /* [{"name": "default", "template": "..."}, ...] */
		size_t i;
		json_t *e;
		json_array_foreach(ct, i, e) {
			json_t *name = json_object_get(e, "name");
			if (json_is_string(name) && !strcmp(json_string_value(name), "default") &&
			    json_is_string(json_object_get(e, "template")))
				s = json_string_value(json_object_get(e, "template"));
		}
		if (!s)
			die("%s: key 'chat_template' has no template named 'default'", path);
	} else if (ct && !json_is_null(ct)) {
		die("%s: key 'chat_template' is not a string or a list", path);
	}
	int t = s ? detect_text(model_dir, s) : BK_TMPL_RAW;
	json_decref(root);
	free(path);
	return t;
}

/* ---- special tokens ---- */

struct specials {
	int32_t bos, eos, im_start, im_end, sot, eot, sh, eh, inst, einst;
};

static int32_t need_piece(int tmpl, const bk_tok *tok, const char *piece)
{
	int32_t id = bk_tok_piece_to_id(tok, piece);
	if (id < 0)
		die("template '%s': %s has no '%s' token", bk_template_name(tmpl), bk_tok_path(tok),
		    piece);
	return id;
}

static int32_t need_id(int tmpl, const bk_tok *tok, int32_t id, const char *what)
{
	if (id < 0)
		die("template '%s': %s has no %s token", bk_template_name(tmpl), bk_tok_path(tok),
		    what);
	return id;
}

static int is_chatml(int tmpl)
{
	return tmpl == BK_TMPL_CHATML || tmpl == BK_TMPL_QWEN2 || tmpl == BK_TMPL_QWEN25 ||
	       tmpl == BK_TMPL_SMOLLM2 || tmpl == BK_TMPL_QWEN3;
}

static int is_llama3(int tmpl)
{
	return tmpl == BK_TMPL_LLAMA3 || tmpl == BK_TMPL_LLAMA31 || tmpl == BK_TMPL_LLAMA32;
}

static struct specials specials_of(int tmpl, const bk_tok *tok)
{
	struct specials s = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
	BUG_ON(tmpl < 0 || tmpl >= BK_TMPL_COUNT);
	switch (tmpl) {
	case BK_TMPL_RAW:
		if (bk_tok_kind(tok) == BK_TOK_SPM)
			s.bos = need_id(tmpl, tok, bk_tok_bos(tok), "bos");
		s.eos = need_id(tmpl, tok, bk_tok_eos(tok), "eos");
		break;
	case BK_TMPL_LLAMA2:
	case BK_TMPL_MISTRAL:
	case BK_TMPL_MISTRAL_V01:
		s.bos = need_id(tmpl, tok, bk_tok_bos(tok), "bos");
		s.eos = need_id(tmpl, tok, bk_tok_eos(tok), "eos");
		break;
	case BK_TMPL_ZEPHYR:
		s.eos = need_id(tmpl, tok, bk_tok_eos(tok), "eos");
		break;
	case BK_TMPL_MISTRAL_TEKKEN:
	case BK_TMPL_MISTRAL_V3:
		s.bos = need_id(tmpl, tok, bk_tok_bos(tok), "bos");
		s.eos = need_id(tmpl, tok, bk_tok_eos(tok), "eos");
		s.inst = need_piece(tmpl, tok, "[INST]");
		s.einst = need_piece(tmpl, tok, "[/INST]");
		break;
	case BK_TMPL_CHATML:
	case BK_TMPL_QWEN2:
	case BK_TMPL_QWEN25:
	case BK_TMPL_SMOLLM2:
	case BK_TMPL_QWEN3:
		s.im_start = need_piece(tmpl, tok, "<|im_start|>");
		s.im_end = need_piece(tmpl, tok, "<|im_end|>");
		s.eos = bk_tok_eos(tok);
		if (tmpl == BK_TMPL_QWEN3) {
			(void)need_piece(tmpl, tok, "<think>");
			(void)need_piece(tmpl, tok, "</think>");
		}
		break;
	case BK_TMPL_GEMMA:
		s.bos = need_id(tmpl, tok, bk_tok_bos(tok), "bos");
		s.sot = need_piece(tmpl, tok, "<start_of_turn>");
		s.eot = need_piece(tmpl, tok, "<end_of_turn>");
		s.eos = bk_tok_eos(tok);
		break;
	case BK_TMPL_LLAMA3:
	case BK_TMPL_LLAMA31:
	case BK_TMPL_LLAMA32:
		s.bos = need_id(tmpl, tok, bk_tok_bos(tok), "bos");
		s.sh = need_piece(tmpl, tok, "<|start_header_id|>");
		s.eh = need_piece(tmpl, tok, "<|end_header_id|>");
		s.eot = need_piece(tmpl, tok, "<|eot_id|>");
		s.eos = bk_tok_eos(tok);
		break;
	}
	return s;
}

void bk_template_check(int tmpl, const bk_tok *tok)
{
	(void)specials_of(tmpl, tok);
}

/* ---- the segment builder ---- */

struct builder {
	const bk_tok *tok;
	enum prepend prepend;
	bk_ids *out;
	BK_VEC(char) text; /* the current segment */
	int at_offset0;    /* the current segment starts the whole string */
	int continuation;  /* the current segment continues text encoded elsewhere */
};

static void flush(struct builder *b)
{
	if (b->text.n) {
		int prefix = !b->continuation && (b->prepend == PREPEND_ALWAYS ||
						  (b->prepend == PREPEND_FIRST && b->at_offset0));
		int32_t *ids;
		size_t n;
		if (prefix && b->text.v[0] != ' ') {
			bk_vec_reserve(&b->text, b->text.n + 1);
			memmove(b->text.v + 1, b->text.v, b->text.n);
			b->text.v[0] = ' ';
			b->text.n++;
		}
		bk_tok_encode_segment(b->tok, b->text.v, b->text.n, &ids, &n);
		if (n) {
			bk_vec_reserve(b->out, b->out->n + n);
			memcpy(b->out->v + b->out->n, ids, n * sizeof *ids);
			b->out->n += n;
		}
		free(ids);
	}
	b->text.n = 0;
	b->at_offset0 = 0;
	b->continuation = 0;
}

static void put_text_n(struct builder *b, const char *s, size_t n)
{
	if (!n)
		return;
	bk_vec_reserve(&b->text, b->text.n + n);
	memcpy(b->text.v + b->text.n, s, n);
	b->text.n += n;
}

static void put_text(struct builder *b, const char *s)
{
	put_text_n(b, s, strlen(s));
}

static void put_id(struct builder *b, int32_t id)
{
	flush(b);
	bk_vec_push(b->out, id);
}

static struct builder builder_new(int tmpl, const bk_tok *tok, bk_ids *out, int continuation)
{
	/* byte-level BPE: no U+2581 prefix, whatever the template */
	enum prepend p = bk_tok_metaspace(tok) ? templates[tmpl].prepend : PREPEND_NEVER;
	struct builder b = {tok, p, out, {0}, !continuation, continuation};
	return b;
}

static void builder_end(struct builder *b)
{
	flush(b);
	free(b->text.v);
}

/* Python's str.isspace() for one code point (what str.strip() and Jinja's trim use). */
static int py_space(uint32_t c)
{
	return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202f || c == 0x205f || c == 0x3000;
}

/* The code point at s[i..n) and its length in bytes (an invalid byte counts as itself). */
static uint32_t utf8_at(const unsigned char *s, size_t i, size_t n, size_t *len)
{
	unsigned char c = s[i];
	size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
	if (i + k > n)
		k = 1;
	uint32_t cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
	for (size_t j = 1; j < k; j++) {
		if ((s[i + j] & 0xc0) != 0x80) {
			*len = 1;
			return c;
		}
		cp = cp << 6 | (s[i + j] & 0x3f);
	}
	*len = k;
	return cp;
}

/* Python's s.strip(): the span [*start, *end) of s without leading/trailing spaces. */
static void py_strip(const char *str, size_t *start, size_t *end)
{
	const unsigned char *s = (const unsigned char *)str;
	size_t n = strlen(str), a = 0, b = n, len;
	while (a < n && py_space(utf8_at(s, a, n, &len)))
		a += len;
	while (b > a) {
		size_t p = b - 1;
		while (p > a && (s[p] & 0xc0) == 0x80 && b - p < 4)
			p--;
		uint32_t c = utf8_at(s, p, n, &len);
		if (p + len != b || !py_space(c))
			break;
		b = p;
	}
	*start = a;
	*end = b;
}

static void put_stripped(struct builder *b, const char *s)
{
	size_t a, e;
	py_strip(s, &a, &e);
	put_text_n(b, s + a, e - a);
}

/* system + "\n\n" + user, or user (mistral and gemma fold the system prompt in). */
static char *fold_system(const char *system, const char *user)
{
	return system && *system ? xasprintf("%s\n\n%s", system, user) : xstrdup(user);
}

/* Python's s.strip('\n') / lstrip / rstrip of newlines only, as spans */
static void nl_strip(const char *s, size_t n, int left, int right, size_t *a, size_t *e)
{
	*a = 0;
	*e = n;
	while (left && *a < *e && s[*a] == '\n')
		(*a)++;
	while (right && *e > *a && s[*e - 1] == '\n')
		(*e)--;
}

/* Qwen3's reading of an assistant message: the reasoning before '</think>' (after
 * '<think>', newlines stripped) and the content after the last '</think>'. */
static void qwen3_split(const char *resp, const char **r, size_t *rn, const char **c, size_t *cn)
{
	const char *close = strstr(resp, "</think>");
	size_t n = strlen(resp), a, e;
	if (!close) {
		*r = resp;
		*rn = 0;
		nl_strip(resp, n, 1, 0, &a, &e);
		*c = resp + a;
		*cn = e - a;
		return;
	}
	/* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
	size_t head = (size_t)(close - resp);
	nl_strip(resp, head, 0, 1, &a, &e);
	const char *start = resp;
	for (const char *p = resp; (p = strstr(p, "<think>")) && p < resp + e; p++)
		start = p + strlen("<think>");
	size_t ra = (size_t)(start - resp);
	while (ra < e && resp[ra] == '\n')
		ra++;
	*r = resp + ra;
	*rn = e > ra ? e - ra : 0;
	/* content = content.split('</think>')[-1].lstrip('\n') */
	const char *last = close;
	for (const char *p = close; (p = strstr(p + 1, "</think>"));)
		last = p;
	const char *tail = last + strlen("</think>");
	nl_strip(tail, strlen(tail), 1, 0, &a, &e);
	*c = tail + a;
	*cn = e - a;
}

void bk_template_prompt(int tmpl, const bk_tok *tok, const char *system, const char *user,
			bk_ids *out)
{
	struct specials sp = specials_of(tmpl, tok);
	struct builder b = builder_new(tmpl, tok, out, 0);
	int has_system = system && *system;
	char *content;
	if (!has_system && default_system[tmpl]) {
		system = default_system[tmpl];
		has_system = 1;
	}
	switch (tmpl) {
	case BK_TMPL_RAW: {
		/* HF's tokenizer(text): the post-processor's ids (BOS for Llama; none for
		 * Qwen) around the text, which is at offset 0 */
		const int32_t *pre, *suf;
		size_t np, ns;
		bk_tok_added_ids(tok, &pre, &np, &suf, &ns);
		for (size_t i = 0; i < np; i++)
			bk_vec_push(out, pre[i]);
		if (has_system) {
			put_text(&b, system);
			put_text(&b, " ");
		}
		put_text(&b, user);
		break;
	}
	case BK_TMPL_LLAMA2:
		content = has_system ? xasprintf("<<SYS>>\n%s\n<</SYS>>\n\n%s", system, user)
				     : xstrdup(user);
		put_id(&b, sp.bos);
		put_text(&b, "[INST] ");
		put_stripped(&b, content);
		put_text(&b, " [/INST]");
		free(content);
		break;
	case BK_TMPL_ZEPHYR:
		if (has_system) {
			put_text(&b, "<|system|>\n");
			put_text(&b, system);
			put_id(&b, sp.eos);
			put_text(&b, "\n");
		}
		put_text(&b, "<|user|>\n");
		put_text(&b, user);
		put_id(&b, sp.eos);
		put_text(&b, "\n<|assistant|>\n");
		break;
	case BK_TMPL_MISTRAL:
	case BK_TMPL_MISTRAL_V01:
		content = fold_system(system, user);
		put_id(&b, sp.bos);
		put_text(&b, "[INST] ");
		put_text(&b, content);
		put_text(&b, " [/INST]");
		free(content);
		break;
	case BK_TMPL_MISTRAL_TEKKEN:
	case BK_TMPL_MISTRAL_V3:
		content = fold_system(system, user);
		put_id(&b, sp.bos);
		put_id(&b, sp.inst);
		if (tmpl == BK_TMPL_MISTRAL_V3)
			put_text(&b, " ");
		put_text(&b, content);
		put_id(&b, sp.einst);
		free(content);
		break;
	case BK_TMPL_CHATML:
	case BK_TMPL_QWEN2:
	case BK_TMPL_QWEN25:
	case BK_TMPL_SMOLLM2:
	case BK_TMPL_QWEN3:
		if (has_system) {
			put_id(&b, sp.im_start);
			put_text(&b, "system\n");
			put_text(&b, system);
			put_id(&b, sp.im_end);
			put_text(&b, "\n");
		}
		put_id(&b, sp.im_start);
		put_text(&b, "user\n");
		put_text(&b, user);
		put_id(&b, sp.im_end);
		put_text(&b, "\n");
		put_id(&b, sp.im_start);
		put_text(&b, "assistant\n");
		if (tmpl == BK_TMPL_QWEN3 && !opt_thinking)
			put_text(&b, "<think>\n\n</think>\n\n");
		break;
	case BK_TMPL_GEMMA:
		content = fold_system(system, user);
		put_id(&b, sp.bos);
		put_id(&b, sp.sot);
		put_text(&b, "user\n");
		put_stripped(&b, content);
		put_id(&b, sp.eot);
		put_text(&b, "\n");
		put_id(&b, sp.sot);
		put_text(&b, "model\n");
		free(content);
		break;
	case BK_TMPL_LLAMA3:
	case BK_TMPL_LLAMA31:
	case BK_TMPL_LLAMA32:
		put_id(&b, sp.bos);
		if (tmpl != BK_TMPL_LLAMA3 || has_system) {
			put_id(&b, sp.sh);
			put_text(&b, "system");
			put_id(&b, sp.eh);
			put_text(&b, "\n\n");
			if (tmpl != BK_TMPL_LLAMA3) {
				put_text(&b, "Cutting Knowledge Date: December 2023\nToday Date: ");
				put_text(&b, bk_template_date(tmpl));
				put_text(&b, "\n\n");
			}
			if (has_system)
				put_stripped(&b, system);
			put_id(&b, sp.eot);
		}
		put_id(&b, sp.sh);
		put_text(&b, "user");
		put_id(&b, sp.eh);
		put_text(&b, "\n\n");
		put_stripped(&b, user);
		put_id(&b, sp.eot);
		put_id(&b, sp.sh);
		put_text(&b, "assistant");
		put_id(&b, sp.eh);
		put_text(&b, "\n\n");
		break;
	default:
		BUG("template %d", tmpl);
	}
	builder_end(&b);
}

void bk_template_response(int tmpl, const bk_tok *tok, const char *response, bk_ids *out)
{
	struct specials sp = specials_of(tmpl, tok);
	/* every prompt above ends in text, which the response continues (mistral-v3 and
	 * mistral-v3-tekken: in [/INST], a special token: the response is a segment of its
	 * own either way) */
	struct builder b = builder_new(tmpl, tok, out, 1);
	switch (tmpl) {
	case BK_TMPL_RAW:
		if (*response && !py_space((unsigned char)response[0]))
			put_text(&b, " ");
		put_text(&b, response);
		put_id(&b, sp.eos);
		break;
	case BK_TMPL_LLAMA2:
		put_text(&b, " ");
		put_stripped(&b, response);
		put_text(&b, " ");
		put_id(&b, sp.eos);
		break;
	case BK_TMPL_ZEPHYR:
		put_text(&b, response);
		put_id(&b, sp.eos);
		put_text(&b, "\n");
		break;
	case BK_TMPL_MISTRAL:
	case BK_TMPL_MISTRAL_TEKKEN:
		put_text(&b, response);
		put_id(&b, sp.eos);
		break;
	case BK_TMPL_MISTRAL_V01:
		put_text(&b, response);
		put_id(&b, sp.eos);
		put_text(&b, " ");
		break;
	case BK_TMPL_MISTRAL_V3:
		put_text(&b, " ");
		put_stripped(&b, response);
		put_id(&b, sp.eos);
		break;
	case BK_TMPL_CHATML:
	case BK_TMPL_QWEN2:
	case BK_TMPL_QWEN25:
	case BK_TMPL_SMOLLM2:
		put_text(&b, response);
		put_id(&b, sp.im_end);
		put_text(&b, "\n");
		break;
	case BK_TMPL_QWEN3: {
		/* '<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') */
		const char *r, *c;
		size_t rn, cn, a, e;
		qwen3_split(response, &r, &rn, &c, &cn);
		if (opt_thinking) {
			nl_strip(r, rn, 1, 1, &a, &e);
			put_text(&b, "<think>\n");
			put_text_n(&b, r + a, e - a);
			put_text(&b, "\n</think>\n\n");
		}
		put_text_n(&b, c, cn);
		put_id(&b, sp.im_end);
		put_text(&b, "\n");
		break;
	}
	case BK_TMPL_GEMMA:
		put_stripped(&b, response);
		put_id(&b, sp.eot);
		put_text(&b, "\n");
		break;
	case BK_TMPL_LLAMA3:
	case BK_TMPL_LLAMA31:
	case BK_TMPL_LLAMA32:
		put_stripped(&b, response);
		put_id(&b, sp.eot);
		break;
	default:
		BUG("template %d", tmpl);
	}
	builder_end(&b);
}

void bk_template_stop_ids(int tmpl, const bk_tok *tok, bk_ids *out)
{
	struct specials sp = specials_of(tmpl, tok);
	int32_t marker = is_chatml(tmpl)			 ? sp.im_end
			 : tmpl == BK_TMPL_GEMMA || is_llama3(tmpl) ? sp.eot
								  : -1;
	if (sp.eos >= 0)
		bk_vec_push(out, sp.eos);
	if (marker >= 0 && marker != sp.eos)
		bk_vec_push(out, marker);
}
