/* template.c - the chat templates of template.h written out as sequences of text and
 * special ids, tokenized the way HF's fast Llama tokenizer tokenizes a rendered template.
 * Not a general Jinja renderer; detection reads markers from the template text only.
 *
 * How HF tokenizes a rendered template (transformers 5, LlamaTokenizer / GemmaTokenizer):
 * special tokens are split out first; each run of text between them (a "segment") is
 * encoded alone, spaces as U+2581; a segment gets a leading U+2581 (unless it already
 * starts with a space) when the tokenizer's Metaspace prepend scheme says so: "first"
 * (legacy=false: only a segment at offset 0 of the whole string), "always"
 * (legacy=true: every segment), "never" (Gemma; Qwen's byte-level BPE). */
#include "formats/template.h"

#include "common/files.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

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
};

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
	return "raw, llama2, zephyr, mistral, mistral-v0.1, chatml, gemma";
}

/* ---- detection ---- */

static int detect_text(const char *dir, const char *t)
{
	if (strstr(t, "<start_of_turn>"))
		return BK_TMPL_GEMMA;
	if (strstr(t, "<|im_start|>"))
		return BK_TMPL_CHATML;
	if (strstr(t, "<<SYS>>"))
		return BK_TMPL_LLAMA2;
	if (strstr(t, "[INST]"))
		return strstr(t, "eos_token + ' '") ? BK_TMPL_MISTRAL_V01 : BK_TMPL_MISTRAL;
	if (strstr(t, "<|system|>") || strstr(t, "<|assistant|>"))
		return BK_TMPL_ZEPHYR;
	die("%s: chat template matches none of the known templates (%s); name one", dir,
	    bk_template_names());
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
	json_t *root = json_load_file(path, 0, &err);
	if (!root)
		die("%s: line %d: %s", path, err.line, err.text);
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
	int32_t bos, eos, im_start, im_end, sot, eot;
};

static int32_t need_piece(int tmpl, const bk_spm *spm, const char *piece)
{
	int32_t id = bk_spm_piece_to_id(spm, piece);
	if (id < 0)
		die("template '%s': %s has no '%s' token", bk_template_name(tmpl), bk_spm_path(spm),
		    piece);
	return id;
}

static int32_t need_id(int tmpl, const bk_spm *spm, int32_t id, const char *what)
{
	if (id < 0)
		die("template '%s': %s has no %s token", bk_template_name(tmpl), bk_spm_path(spm),
		    what);
	return id;
}

static struct specials specials_of(int tmpl, const bk_spm *spm)
{
	struct specials s = {-1, -1, -1, -1, -1, -1};
	BUG_ON(tmpl < 0 || tmpl >= BK_TMPL_COUNT);
	switch (tmpl) {
	case BK_TMPL_RAW:
	case BK_TMPL_LLAMA2:
	case BK_TMPL_MISTRAL:
	case BK_TMPL_MISTRAL_V01:
		s.bos = need_id(tmpl, spm, bk_spm_bos(spm), "bos");
		s.eos = need_id(tmpl, spm, bk_spm_eos(spm), "eos");
		break;
	case BK_TMPL_ZEPHYR:
		s.eos = need_id(tmpl, spm, bk_spm_eos(spm), "eos");
		break;
	case BK_TMPL_CHATML:
		s.im_start = need_piece(tmpl, spm, "<|im_start|>");
		s.im_end = need_piece(tmpl, spm, "<|im_end|>");
		s.eos = bk_spm_eos(spm);
		break;
	case BK_TMPL_GEMMA:
		s.bos = need_id(tmpl, spm, bk_spm_bos(spm), "bos");
		s.sot = need_piece(tmpl, spm, "<start_of_turn>");
		s.eot = need_piece(tmpl, spm, "<end_of_turn>");
		s.eos = bk_spm_eos(spm);
		break;
	}
	return s;
}

void bk_template_check(int tmpl, const bk_spm *spm)
{
	(void)specials_of(tmpl, spm);
}

/* ---- the segment builder ---- */

struct builder {
	const bk_spm *spm;
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
		bk_spm_encode_bare(b->spm, b->text.v, b->text.n, &ids, &n);
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

static struct builder builder_new(int tmpl, const bk_spm *spm, bk_ids *out, int continuation)
{
	struct builder b = {spm, templates[tmpl].prepend, out, {0}, !continuation, continuation};
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

void bk_template_prompt(int tmpl, const bk_spm *spm, const char *system, const char *user,
			bk_ids *out)
{
	struct specials sp = specials_of(tmpl, spm);
	struct builder b = builder_new(tmpl, spm, out, 0);
	int has_system = system && *system;
	char *content;
	switch (tmpl) {
	case BK_TMPL_RAW:
		/* HF's tokenizer(text) adds BOS after tokenizing: the text is at offset 0 */
		bk_vec_push(out, sp.bos);
		if (has_system) {
			put_text(&b, system);
			put_text(&b, " ");
		}
		put_text(&b, user);
		break;
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
	case BK_TMPL_CHATML:
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
	default:
		BUG("template %d", tmpl);
	}
	builder_end(&b);
}

void bk_template_response(int tmpl, const bk_spm *spm, const char *response, bk_ids *out)
{
	struct specials sp = specials_of(tmpl, spm);
	/* every prompt above ends in text, which the response continues */
	struct builder b = builder_new(tmpl, spm, out, 1);
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
		put_text(&b, response);
		put_id(&b, sp.eos);
		break;
	case BK_TMPL_MISTRAL_V01:
		put_text(&b, response);
		put_id(&b, sp.eos);
		put_text(&b, " ");
		break;
	case BK_TMPL_CHATML:
		put_text(&b, response);
		put_id(&b, sp.im_end);
		put_text(&b, "\n");
		break;
	case BK_TMPL_GEMMA:
		put_stripped(&b, response);
		put_id(&b, sp.eot);
		put_text(&b, "\n");
		break;
	default:
		BUG("template %d", tmpl);
	}
	builder_end(&b);
}

void bk_template_stop_ids(int tmpl, const bk_spm *spm, bk_ids *out)
{
	struct specials sp = specials_of(tmpl, spm);
	int32_t marker = tmpl == BK_TMPL_CHATML ? sp.im_end : tmpl == BK_TMPL_GEMMA ? sp.eot : -1;
	if (sp.eos >= 0)
		bk_vec_push(out, sp.eos);
	if (marker >= 0 && marker != sp.eos)
		bk_vec_push(out, marker);
}
