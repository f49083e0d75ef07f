/* inputs.c - training data readers (JSON, JSON Lines, plain text) and the system
 * prompt sources; see inputs.h for the accepted shapes and the key precedence.
 * JSON goes through jansson; this file only walks the decoded values. */
#include "inputs.h"
#include "common/diag.h"
#include "common/files.h"
#include "formats/bakeout.h"
#include "formats/msgjson.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const prompt_keys[] = {
	"prompt", "user_message", "input", "question", "text", "instruction", NULL,
};
static const char *const response_keys[] = {
	"response", "completion", "output", "answer", "target", NULL,
};
static const char *const wrapper_keys[] = {
	"pairs", "data", "samples", "completions", "training_samples", "training_prompts",
	"prompts", "questions", NULL,
};

/* Data files: any value at the top (checked here), and numbers never fail to decode
 * (they are not used; a huge integer "id" column must not reject the file). */
#define DATA_FLAGS (JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL)

/* Where a row came from, for messages: "data.jsonl: line 7" / "data.json: record 3". */
typedef struct {
	const char *name;
	const char *unit; /* "line" or "record" */
	size_t no;        /* from 1 */
} bk_loc;

static _Noreturn void die_at(const bk_loc *l, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void die_at(const bk_loc *l, const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	die("%s: %s %zu: %s", l->name, l->unit, l->no, msg);
}

/* "a, b, c" (static buffer: the lists are short and constant) */
static const char *key_list(const char *const *keys)
{
	static char buf[256];
	size_t n = 0;
	buf[0] = 0;
	for (size_t i = 0; keys[i]; i++)
		n += snprintf(buf + n, sizeof buf - n, "%s%s", i ? ", " : "", keys[i]);
	return buf;
}

/* ---- small string builder ---- */

typedef BK_VEC(char) bk_sb;

static void sb_add(bk_sb *sb, const char *s, size_t n)
{
	bk_vec_reserve(sb, sb->n + n + 1);
	memcpy(sb->v + sb->n, s, n);
	sb->n += n;
	sb->v[sb->n] = 0;
}

static void sb_adds(bk_sb *sb, const char *s) { sb_add(sb, s, strlen(s)); }

static char *sb_take(bk_sb *sb)
{
	if (!sb->v)
		return xstrdup("");
	char *s = sb->v;
	sb->v = NULL;
	sb->n = sb->cap = 0;
	return s;
}

/* ---- text checks ---- */

static int is_blank(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!strchr(" \t\r\n\v\f", s[i]) || !s[i])
			return 0;
	return 1;
}

/* Python's s.strip() == "": the bake's strip (bakeout.c), not a copy of it */
int bk_text_blank(const char *s)
{
	char *t = bk_bake_strip(s);
	int blank = !*t;
	free(t);
	return blank;
}

/* valid UTF-8 without NUL bytes (jansson's checker, through json_stringn) */
static int utf8_ok(const char *s, size_t n)
{
	if (memchr(s, 0, n))
		return 0;
	json_t *j = json_stringn(s, n);
	if (!j)
		return 0;
	json_decref(j);
	return 1;
}

static void skip_bom(const char **buf, size_t *len)
{
	if (*len >= 3 && !memcmp(*buf, "\xef\xbb\xbf", 3)) {
		*buf += 3;
		*len -= 3;
	}
}

/* A whole text file must be UTF-8: dies naming the first bad line. */
static void check_text(const char *name, const char *buf, size_t len)
{
	if (utf8_ok(buf, len))
		return;
	size_t line = 1;
	for (const char *p = buf, *end = buf + len; p < end; line++) {
		const char *nl = memchr(p, '\n', end - p);
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		if (memchr(p, 0, n))
			die("%s: line %zu: nul byte", name, line);
		if (!utf8_ok(p, n))
			die("%s: line %zu: invalid utf-8", name, line);
		p += n + 1;
	}
	BUG("%s: utf-8 check disagrees with itself", name);
}

/* ---- dataset ---- */

void bk_dataset_add(bk_dataset *ds, const char *prompt, const char *response,
		    const char *system)
{
	BUG_ON(!prompt);
	bk_sample s = {
		.prompt = xstrdup(prompt),
		.response = response ? xstrdup(response) : NULL,
		.system = system ? xstrdup(system) : NULL,
	};
	bk_vec_push(ds, s);
	if (response && *response)
		ds->paired = 1;
}

void bk_dataset_free(bk_dataset *ds)
{
	for (size_t i = 0; i < ds->n; i++) {
		free(ds->v[i].prompt);
		free(ds->v[i].response);
		free(ds->v[i].system);
	}
	free(ds->v);
	memset(ds, 0, sizeof *ds);
}

bk_input_format bk_input_format_parse(const char *name)
{
	if (name && !strcmp(name, "auto"))
		return BK_FMT_AUTO;
	if (name && !strcmp(name, "json"))
		return BK_FMT_JSON;
	if (name && (!strcmp(name, "jsonl") || !strcmp(name, "ndjson")))
		return BK_FMT_JSONL;
	if (name && !strcmp(name, "text"))
		return BK_FMT_TEXT;
	die_usage("--format: unknown input format '%s' (expected auto, json, jsonl or text)",
		  name ? name : "(null)");
}

const char *bk_input_format_name(bk_input_format f)
{
	switch (f) {
	case BK_FMT_AUTO: return "auto";
	case BK_FMT_JSON: return "json";
	case BK_FMT_JSONL: return "jsonl";
	case BK_FMT_TEXT: return "text";
	}
	BUG("bad input format %d", (int)f);
}

/* ---- rows ---- */

/* obj[key] when present and not null, else NULL */
static json_t *get(json_t *obj, const char *key)
{
	json_t *v = json_object_get(obj, key);
	return json_is_null(v) ? NULL : v;
}

/* the first key of keys present with a non-null value; *val gets the value */
static const char *first_key(json_t *obj, const char *const *keys, json_t **val)
{
	for (size_t i = 0; keys[i]; i++)
		if ((*val = get(obj, keys[i])))
			return keys[i];
	*val = NULL;
	return NULL;
}

/* the first key of keys present in obj, null or not (Python's nested
 * item.get(k1, item.get(k2, ...))); *val gets its value (json null included) */
static const char *present_key(json_t *obj, const char *const *keys, json_t **val)
{
	for (size_t i = 0; keys[i]; i++)
		if ((*val = json_object_get(obj, keys[i])))
			return keys[i];
	*val = NULL;
	return NULL;
}

static const char *opt_string(const bk_loc *l, json_t *obj, const char *key)
{
	json_t *v = get(obj, key);
	if (!v)
		return NULL;
	if (!json_is_string(v))
		die_at(l, "key '%s' is not a string", key);
	return json_string_value(v);
}

/* A message's text: a string, null/absent (""), or a list of parts whose text
 * parts are concatenated.  Returns a malloc'd string. */
static char *message_text(const bk_loc *l, json_t *m, const char *where)
{
	const char *key = json_object_get(m, "content") ? "content" : "value";
	json_t *c = get(m, key);
	if (!c)
		return xstrdup("");
	if (json_is_string(c))
		return xstrdup(json_string_value(c));
	if (!json_is_array(c))
		die_at(l, "%s: key '%s' is not a string or a list of parts", where, key);
	bk_sb sb = {0};
	size_t i;
	json_t *part;
	json_array_foreach(c, i, part) {
		if (json_is_string(part)) {
			sb_adds(&sb, json_string_value(part));
			continue;
		}
		if (!json_is_object(part))
			die_at(l, "%s: %s[%zu] is not a string or an object", where, key, i);
		json_t *type = get(part, "type");
		if (type && !json_is_string(type))
			die_at(l, "%s: %s[%zu]: key 'type' is not a string", where, key, i);
		if (type && strcmp(json_string_value(type), "text"))
			continue; /* images, audio, ...: not text */
		json_t *text = get(part, "text");
		if (!text || !json_is_string(text))
			die_at(l, "%s: %s[%zu]: key 'text' is %s", where, key, i,
			       text ? "not a string" : "missing");
		sb_adds(&sb, json_string_value(text));
	}
	return sb_take(&sb);
}

enum { ROLE_OTHER, ROLE_USER, ROLE_ASSISTANT, ROLE_SYSTEM };

static int role_of(const char *r)
{
	if (!strcmp(r, "user") || !strcmp(r, "human"))
		return ROLE_USER;
	if (!strcmp(r, "assistant") || !strcmp(r, "gpt"))
		return ROLE_ASSISTANT;
	if (!strcmp(r, "system"))
		return ROLE_SYSTEM;
	return ROLE_OTHER;
}

static void add_chat_row(bk_dataset *ds, const bk_loc *l, json_t *row, json_t *msgs,
			 const char *msgs_key)
{
	if (!json_is_array(msgs))
		die_at(l, "key '%s' is not a list", msgs_key);
	const char *row_system = opt_string(l, row, "system");
	char *user = NULL, *system = NULL;
	size_t pairs = 0, i;
	json_t *m;
	json_array_foreach(msgs, i, m) {
		char where[64];
		snprintf(where, sizeof where, "%s[%zu]", msgs_key, i);
		if (!json_is_object(m))
			die_at(l, "%s is not an object", where);
		const char *rkey = json_object_get(m, "role") ? "role" : "from";
		json_t *r = get(m, rkey);
		if (!r)
			die_at(l, "%s: no role key (tried role, from)", where);
		if (!json_is_string(r))
			die_at(l, "%s: key '%s' is not a string", where, rkey);
		int role = role_of(json_string_value(r));
		if (role == ROLE_OTHER)
			continue;
		char *text = message_text(l, m, where);
		if (role == ROLE_USER) {
			free(user);
			user = text;
		} else if (role == ROLE_SYSTEM) {
			free(system);
			system = text;
		} else {
			/* the tool: an assistant turn with stripped content, and the nearest
			 * user turn before it non-empty (no further look back) */
			if (!bk_text_blank(text) && user && *user) {
				bk_dataset_add(ds, user, text, system ? system : row_system);
				pairs++;
			}
			free(text);
		}
	}
	if (!pairs) {
		if (user && *user)
			bk_dataset_add(ds, user, NULL, system ? system : row_system);
		else
			ds->skipped++;
	}
	free(user);
	free(system);
}

static void add_columns(bk_dataset *ds, const bk_loc *l, json_t *row, const char *pk,
			json_t *pv, const char *rk, json_t *rv);

static void add_row(bk_dataset *ds, const bk_loc *l, json_t *row)
{
	if (json_is_string(row)) {
		bk_dataset_add(ds, json_string_value(row), NULL, NULL);
		return;
	}
	if (!json_is_object(row))
		die_at(l, "not a string or an object");
	json_t *msgs;
	if ((msgs = get(row, "messages"))) {
		add_chat_row(ds, l, row, msgs, "messages");
		return;
	}
	if ((msgs = get(row, "conversations"))) {
		add_chat_row(ds, l, row, msgs, "conversations");
		return;
	}
	json_t *pv, *rv;
	const char *pk = present_key(row, prompt_keys, &pv);
	if (!pk)
		die_at(l, "no prompt key (tried %s)", key_list(prompt_keys));
	const char *rk = present_key(row, response_keys, &rv);
	add_columns(ds, l, row, pk, pv, rk, rv);
}

/* a row's prompt pk = pv and response rk = rv (rk may be NULL): the tool skips the row
 * when the prompt is null or empty (`if p:`); a null response is none */
static void add_columns(bk_dataset *ds, const bk_loc *l, json_t *row, const char *pk,
			json_t *pv, const char *rk, json_t *rv)
{
	if (json_is_null(pv) || (json_is_string(pv) && !*json_string_value(pv))) {
		ds->skipped++;
		return;
	}
	if (!json_is_string(pv))
		die_at(l, "key '%s' is not a string", pk);
	if (rk && json_is_null(rv))
		rk = NULL;
	if (rk && !json_is_string(rv))
		die_at(l, "key '%s' is not a string", rk);
	bk_dataset_add(ds, json_string_value(pv), rk ? json_string_value(rv) : NULL,
		       opt_string(l, row, "system"));
}

/* ---- rows from elsewhere (hub datasets) ---- */

void bk_dataset_add_row(bk_dataset *ds, const char *name, const char *unit, size_t no,
			json_t *row)
{
	bk_loc l = {name, unit, no};
	add_row(ds, &l, row);
}

static const char *const hub_prompt_cols[] = {
	"prompt", "input", "question", "text", "instruction", NULL,
};

int bk_row_columns_pick(const char *const *names, size_t n, bk_row_columns *out)
{
	memset(out, 0, sizeof *out);
	int have[16] = {0};
	const char *const *lists[] = {hub_prompt_cols, response_keys};
	for (size_t i = 0; i < n; i++) {
		if (!strcmp(names[i], "messages"))
			out->messages = 1;
		for (int k = 0, base = 0; k < 2; base += 8, k++)
			for (int j = 0; lists[k][j]; j++)
				if (!strcmp(names[i], lists[k][j]))
					have[base + j] = 1;
	}
	if (out->messages)
		return 0;
	for (int j = 0; hub_prompt_cols[j] && !out->prompt; j++)
		if (have[j])
			out->prompt = hub_prompt_cols[j];
	for (int j = 0; response_keys[j] && !out->response; j++)
		if (have[8 + j])
			out->response = response_keys[j];
	return out->prompt ? 0 : -1;
}

const char *bk_row_columns_tried(void) { return key_list(hub_prompt_cols); }

void bk_dataset_add_hub_row(bk_dataset *ds, const char *name, const char *unit, size_t no,
			    const bk_row_columns *cols, json_t *row)
{
	bk_loc l = {name, unit, no};
	if (!json_is_object(row))
		die_at(&l, "not an object");
	if (cols->messages) {
		json_t *msgs = json_object_get(row, "messages");
		if (json_is_null(msgs) || !msgs) {
			ds->skipped++;
			return;
		}
		add_chat_row(ds, &l, row, msgs, "messages");
		return;
	}
	json_t *pv = json_object_get(row, cols->prompt), *rv = NULL;
	if (!pv)
		pv = json_null(); /* a column the row lacks: null, as datasets fills it */
	if (cols->response) {
		rv = json_object_get(row, cols->response);
		if (!rv)
			rv = json_null();
	}
	add_columns(ds, &l, row, cols->prompt, pv, cols->response, rv);
}

/* ---- formats ---- */

static void parse_jsonl(bk_dataset *ds, const char *name, const char *buf, size_t len)
{
	bk_loc l = {name, "line", 0};
	for (const char *p = buf, *end = buf + len; p < end;) {
		const char *nl = memchr(p, '\n', end - p);
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		l.no++;
		if (!is_blank(p, n)) {
			json_error_t err;
			json_t *row = json_loadb(p, n, DATA_FLAGS, &err);
			if (!row)
				die("%s: line %zu: column %d: %s", name, l.no, err.column,
				    bk_json_error_text(&err));
			add_row(ds, &l, row);
			json_decref(row);
		}
		p += n + 1;
	}
}

/* Does the first non-blank line hold one complete JSON value on its own? */
static int first_line_is_value(const char *buf, size_t len)
{
	for (const char *p = buf, *end = buf + len; p < end;) {
		const char *nl = memchr(p, '\n', end - p);
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		if (!is_blank(p, n)) {
			json_error_t err;
			json_t *v = json_loadb(p, n, DATA_FLAGS, &err);
			json_decref(v);
			return v != NULL;
		}
		p += n + 1;
	}
	return 0;
}

static void add_json_doc(bk_dataset *ds, const char *name, json_t *root)
{
	json_t *list = root;
	if (json_is_object(root)) {
		json_t *v;
		const char *k = first_key(root, wrapper_keys, &v);
		if (!k)
			die("%s: no list of samples in the top-level object (tried %s)", name,
			    key_list(wrapper_keys));
		if (!json_is_array(v))
			die("%s: key '%s' is not a list", name, k);
		list = v;
	} else if (!json_is_array(root)) {
		die("%s: the top level is not a list or an object", name);
	}
	bk_loc l = {name, "record", 0};
	size_t i;
	json_t *row;
	json_array_foreach(list, i, row) {
		l.no = i + 1;
		add_row(ds, &l, row);
	}
}

/* jsonl_fallback: in auto mode by content, a document that is one value per line
 * is read as JSON Lines. */
static void parse_json(bk_dataset *ds, const char *name, const char *buf, size_t len,
		       int jsonl_fallback)
{
	json_error_t err;
	json_t *root = json_loadb(buf, len, DATA_FLAGS, &err);
	if (!root) {
		int more = json_error_code(&err) == json_error_end_of_input_expected;
		if (more && jsonl_fallback && first_line_is_value(buf, len)) {
			parse_jsonl(ds, name, buf, len);
			return;
		}
		die("%s: %s%s", name, bk_json_error(&err),
		    more ? " (JSON Lines? use format jsonl or a .jsonl name)" : "");
	}
	add_json_doc(ds, name, root);
	json_decref(root);
}

static int has_ext(const char *name, const char *ext);

json_t *bk_dataset_json_rows(const char *name, const char *buf, size_t len)
{
	skip_bom(&buf, &len);
	json_t *rows = json_array();
	if (!rows)
		die("%s: out of memory", name);
	json_error_t err;
	int jsonl = has_ext(name, ".jsonl") || has_ext(name, ".ndjson");
	json_t *root = jsonl ? NULL : json_loadb(buf, len, DATA_FLAGS, &err);
	if (!root && !jsonl && (json_error_code(&err) != json_error_end_of_input_expected ||
				!first_line_is_value(buf, len)))
		die("%s: %s", name, bk_json_error(&err));
	if (root) { /* a list of rows, or one wrapped under a known key */
		json_t *list = root, *v;
		if (json_is_object(root)) {
			const char *k = first_key(root, wrapper_keys, &v);
			if (!k)
				die("%s: no list of samples in the top-level object (tried %s)",
				    name, key_list(wrapper_keys));
			list = v;
		}
		if (!json_is_array(list))
			die("%s: the top level is not a list or an object", name);
		json_array_extend(rows, list);
		json_decref(root);
		return rows;
	}
	size_t line = 0;
	for (const char *p = buf, *end = buf + len; p < end;) {
		const char *nl = memchr(p, '\n', end - p);
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		line++;
		if (!is_blank(p, n)) {
			json_t *row = json_loadb(p, n, DATA_FLAGS, &err);
			if (!row)
				die("%s: line %zu: column %d: %s", name, line, err.column,
				    bk_json_error_text(&err));
			json_array_append_new(rows, row);
		}
		p += n + 1;
	}
	return rows;
}

static void parse_text(bk_dataset *ds, const char *name, const char *buf, size_t len)
{
	size_t line = 0;
	for (const char *p = buf, *end = buf + len; p < end;) {
		const char *nl = memchr(p, '\n', end - p);
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		const char *next = p + n + 1;
		line++;
		if (n && p[n - 1] == '\r')
			n--;
		if (memchr(p, 0, n))
			die("%s: line %zu: nul byte", name, line);
		if (!is_blank(p, n)) {
			if (!utf8_ok(p, n))
				die("%s: line %zu: invalid utf-8", name, line);
			char *s = xstrndup(p, n);
			bk_dataset_add(ds, s, NULL, NULL);
			free(s);
		}
		p = next;
	}
}

static int has_ext(const char *name, const char *ext)
{
	const char *slash = strrchr(name, '/');
	const char *dot = strrchr(slash ? slash + 1 : name, '.');
	return dot && !strcasecmp(dot, ext);
}

void bk_dataset_parse(bk_dataset *ds, const char *name, const char *buf, size_t len,
		      bk_input_format fmt)
{
	size_t n0 = ds->n, s0 = ds->skipped;
	skip_bom(&buf, &len);
	if (is_blank(buf, len))
		die("%s: no samples", name);
	int fallback = 0;
	if (fmt == BK_FMT_AUTO) {
		if (has_ext(name, ".jsonl") || has_ext(name, ".ndjson"))
			fmt = BK_FMT_JSONL;
		else if (has_ext(name, ".txt"))
			fmt = BK_FMT_TEXT;
		else if (has_ext(name, ".json"))
			fmt = BK_FMT_JSON;
		else {
			size_t i = 0;
			while (strchr(" \t\r\n\v\f", buf[i]) && buf[i])
				i++;
			fmt = buf[i] == '[' || buf[i] == '{' ? BK_FMT_JSON : BK_FMT_TEXT;
			fallback = 1;
		}
	}
	switch (fmt) {
	case BK_FMT_JSON: parse_json(ds, name, buf, len, fallback); break;
	case BK_FMT_JSONL: parse_jsonl(ds, name, buf, len); break;
	case BK_FMT_TEXT: parse_text(ds, name, buf, len); break;
	default: BUG("bad input format %d", (int)fmt);
	}
	if (ds->n == n0)
		die("%s: no samples%s", name,
		    ds->skipped > s0 ? " (every row skipped: null or empty prompt, or no user/assistant "
				  "pair)" : "");
}

void bk_dataset_load(bk_dataset *ds, const char *path, bk_input_format fmt)
{
	size_t len;
	char *buf = bk_read_file(path, &len);
	bk_dataset_parse(ds, strcmp(path, "-") ? path : "stdin", buf, len, fmt);
	free(buf);
}

/* ---- system prompt ---- */

/* A UTF-8 text file, without its BOM and trailing newlines. */
static char *read_text(const char *path, int strip_newlines)
{
	size_t len;
	char *buf = bk_read_file(path, &len);
	const char *p = buf;
	skip_bom(&p, &len);
	check_text(path, p, len);
	while (strip_newlines && len && (p[len - 1] == '\n' || p[len - 1] == '\r'))
		len--;
	char *s = xstrndup(p, len);
	free(buf);
	return s;
}

char *bk_read_text(const char *path) { return read_text(path, 0); }

static json_t *read_json(const char *path)
{
	size_t len;
	char *buf = bk_read_file(path, &len);
	const char *p = buf;
	skip_bom(&p, &len);
	json_error_t err;
	json_t *root = json_loadb(p, len, JSON_DECODE_ANY, &err);
	if (!root)
		die("%s: %s", path, bk_json_error(&err));
	free(buf);
	return root;
}

static char *render_corpus(const char *path, const char *format)
{
	if (!strcmp(format, "text"))
		return read_text(path, 1);
	json_t *root = read_json(path);
	bk_sb sb = {0};
	size_t i;
	json_t *v;
	if (!strcmp(format, "papers") || !strcmp(format, "list")) {
		int papers = !strcmp(format, "papers");
		if (!json_is_array(root))
			die("%s: a %s corpus must be a list", path, format);
		json_array_foreach(root, i, v) {
			bk_loc l = {path, "record", i + 1};
			if (i)
				sb_adds(&sb, "\n\n");
			if (!papers) {
				if (!json_is_string(v))
					die_at(&l, "not a string");
				sb_adds(&sb, json_string_value(v));
				continue;
			}
			if (!json_is_object(v))
				die_at(&l, "not an object");
			const char *keys[] = {"title", "abstract"}, *val[2];
			for (int k = 0; k < 2; k++) {
				json_t *f = json_object_get(v, keys[k]);
				if (!f)
					die_at(&l, "no key '%s'", keys[k]);
				if (!json_is_string(f))
					die_at(&l, "key '%s' is not a string", keys[k]);
				val[k] = json_string_value(f);
			}
			char head[32];
			snprintf(head, sizeof head, "Paper %zu: ", i + 1);
			sb_adds(&sb, head);
			sb_adds(&sb, val[0]);
			sb_adds(&sb, "\n");
			sb_adds(&sb, val[1]);
		}
	} else {
		char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
		if (!s)
			die("%s: cannot print the corpus as JSON", path);
		sb_adds(&sb, s);
		free(s);
	}
	json_decref(root);
	return sb_take(&sb);
}

/* every "{corpus}" in tmpl replaced by corpus */
static char *fill_template(const char *tmpl, const char *corpus)
{
	static const char mark[] = "{corpus}";
	bk_sb sb = {0};
	const char *p = tmpl, *q;
	while ((q = strstr(p, mark))) {
		sb_add(&sb, p, q - p);
		sb_adds(&sb, corpus);
		p = q + sizeof mark - 1;
	}
	sb_adds(&sb, p);
	return sb_take(&sb);
}

char *bk_system_prompt(const char *system, const char *system_file, const char *corpus_file,
		       const char *corpus_format, const char *system_template_file)
{
	int nsrc = !!system + !!system_file + !!corpus_file;
	/* flag combinations: usage errors */
	if (nsrc > 1)
		die_usage("give only one of --system, --system-file and --corpus");
	if (!corpus_file && system_template_file)
		die_usage("--system-template needs --corpus");
	if (!corpus_file && corpus_format)
		die_usage("--corpus-format needs --corpus");
	if (!nsrc)
		return NULL;
	if (system) {
		if (!utf8_ok(system, strlen(system)))
			die("--system: invalid utf-8");
		if (!*system)
			die("--system: empty system prompt");
		return xstrdup(system);
	}
	if (system_file) {
		char *s = read_text(system_file, 1);
		if (!*s)
			die("%s: empty system prompt", system_file);
		return s;
	}
	if (corpus_format && strcmp(corpus_format, "papers") && strcmp(corpus_format, "text") &&
	    strcmp(corpus_format, "list") && strcmp(corpus_format, "json"))
		warn("corpus format '%s' is not papers, text, list or json: reading %s as JSON "
		     "and pretty-printing it, as the reference tool does",
		     corpus_format, corpus_file);
	char *corpus = render_corpus(corpus_file, corpus_format ? corpus_format : "text");
	if (!*corpus)
		die("%s: empty corpus", corpus_file);
	char *tmpl = system_template_file ? read_text(system_template_file, 1)
					  : xstrdup(BK_DEFAULT_SYSTEM_TEMPLATE);
	if (!strstr(tmpl, "{corpus}"))
		die("%s: no '{corpus}' in the system template", system_template_file);
	char *out = fill_template(tmpl, corpus);
	free(tmpl);
	free(corpus);
	return out;
}
