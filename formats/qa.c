/* qa.c - see qa.h. */
#include "qa.h"
#include "common/diag.h"
#include "common/files.h"
#include "formats/msgjson.h"

#include <ctype.h>
#include <jansson.h>
#include <string.h>

static const char *const wrappers[] = {"evaluation_samples", "test_samples", "eval", "qa_pairs"};
static const char *const qkeys[] = {"question", "input"};
static const char *const akeys[] = {"answer", "expected", "target"};

static json_t *first_key(json_t *o, const char *const *keys, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_object_get(o, keys[i]);
		if (v && !json_is_null(v))
			return v;
	}
	return NULL;
}

static void add_row(bk_qa_set *set, json_t *row, const char *path, const char *where)
{
	if (!json_is_object(row))
		die("%s: %s: not an object with a question and an answer", path, where);
	json_t *q = first_key(row, qkeys, 2), *a = first_key(row, akeys, 3);
	if (!q || !json_is_string(q))
		die("%s: %s: no question string (tried question, input)", path, where);
	if (!a)
		die("%s: %s: no answer (tried answer, expected, target)", path, where);
	bk_qa qa = {xstrdup(json_string_value(q)), NULL, 0};
	if (json_is_string(a)) {
		qa.answers = xmalloc(sizeof *qa.answers);
		qa.answers[qa.n_answers++] = xstrdup(json_string_value(a));
	} else if (json_is_array(a) && json_array_size(a) > 0) {
		qa.answers = xmalloc(json_array_size(a) * sizeof *qa.answers);
		size_t i;
		json_t *e;
		json_array_foreach(a, i, e)
		{
			if (!json_is_string(e))
				die("%s: %s: answer item %zu is not a string", path, where, i);
			qa.answers[qa.n_answers++] = xstrdup(json_string_value(e));
		}
	} else {
		die("%s: %s: answer is not a string or a non-empty list of strings", path, where);
	}
	/* an empty answer is a substring of every response: the tool counts it always
	 * correct, which only inflates the accuracy; refused, as an empty list is */
	for (size_t i = 0; i < qa.n_answers; i++) {
		char *kw = bk_qa_clean(qa.answers[i]);
		int empty = !*kw;
		free(kw);
		if (empty && json_is_string(a))
			die("%s: %s: the answer is empty (it is in every response)", path, where);
		if (empty)
			die("%s: %s: answer item %zu is empty (it is in every response)", path, where,
			    i);
	}
	set->v = xrealloc(set->v, (set->n + 1) * sizeof *set->v);
	set->v[set->n++] = qa;
}

/* JSON Lines when the first non-blank line is a whole JSON value on its own; a
 * multi-line JSON document with a syntax error is not, and keeps jansson's message. */
static int first_line_is_value(const char *text)
{
	text += strspn(text, " \t\r\n");
	size_t n = strcspn(text, "\n");
	json_error_t e;
	json_t *v = json_loadb(text, n, JSON_DECODE_ANY, &e);
	json_decref(v);
	return v != NULL;
}

void bk_qa_load(bk_qa_set *set, const char *path)
{
	size_t len;
	char *file = bk_read_file(path, &len), *text = file;
	if (len >= 3 && !memcmp(text, "\xef\xbb\xbf", 3)) { /* a UTF-8 byte-order mark */
		text += 3;
		len -= 3;
	}
	json_error_t err;
	json_t *root = json_loadb(text, len, 0, &err);
	char where[64];
	if (root) {
		json_t *list = root;
		if (json_is_object(root)) {
			list = first_key(root, wrappers, 4);
			if (!list)
				die("%s: no list of samples (tried evaluation_samples, test_samples, eval, "
				    "qa_pairs)",
				    path);
		}
		if (!json_is_array(list))
			die("%s: the samples are not a list", path);
		size_t i;
		json_t *row;
		json_array_foreach(list, i, row)
		{
			snprintf(where, sizeof where, "record %zu", i + 1);
			add_row(set, row, path, where);
		}
		json_decref(root);
	} else if (first_line_is_value(text)) {
		/* JSON Lines */
		char *line = text, *next;
		for (long ln = 1; line && *line; line = next, ln++) {
			next = strchr(line, '\n');
			if (next)
				*next++ = 0;
			if (strspn(line, " \t\r") == strlen(line))
				continue;
			json_t *row = json_loads(line, 0, &err);
			if (!row)
				die("%s: line %ld: %s", path, ln, bk_json_error_text(&err));
			snprintf(where, sizeof where, "line %ld", ln);
			add_row(set, row, path, where);
			json_decref(row);
		}
	} else {
		die("%s: %s", path, bk_json_error(&err));
	}
	free(file);
	if (!set->n)
		die("%s: no evaluation samples", path);
}

void bk_qa_free(bk_qa_set *set)
{
	for (size_t i = 0; i < set->n; i++) {
		free(set->v[i].question);
		for (size_t k = 0; k < set->v[i].n_answers; k++)
			free(set->v[i].answers[k]);
		free(set->v[i].answers);
	}
	free(set->v);
	set->v = NULL;
	set->n = 0;
}

char *bk_qa_clean(const char *g)
{
	size_t n = strlen(g);
	char *out = xmalloc(n + 1), *o = out;
	while (*g) {
		const char *t = strstr(g, "<think>");
		if (!t) {
			size_t k = strlen(g);
			memcpy(o, g, k);
			o += k;
			break;
		}
		memcpy(o, g, (size_t)(t - g));
		o += t - g;
		const char *e = strstr(t, "</think>");
		if (!e)
			break; /* unclosed: drop to the end */
		g = e + strlen("</think>");
	}
	*o = 0;
	for (char *p = out; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	return out;
}

int bk_qa_correct(const char *generated, const bk_qa *qa)
{
	char *text = bk_qa_clean(generated);
	int ok = 0;
	for (size_t i = 0; i < qa->n_answers && !ok; i++) {
		char *kw = bk_qa_clean(qa->answers[i]);
		ok = strstr(text, kw) != NULL;
		free(kw);
	}
	free(text);
	return ok;
}
