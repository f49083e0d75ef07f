/* bakeout.c - output_dir in the reference tool's layout (see bakeout.h): results.json
 * keys and shapes, model card, metrics final path, last checkpoint, trainer figures. */
#include "formats/bakeout.h"
#include "common/diag.h"
#include "common/files.h"
#include "common/progress.h"
#include "formats/stream.h"
#include "formats/tokenizer.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- text as Python sees it ---- */

/* one UTF-8 code point at s (n bytes in *len); invalid bytes are one-byte points */
static uint32_t utf8_at(const unsigned char *s, int *len)
{
	if (s[0] < 0x80) {
		*len = 1;
		return s[0];
	}
	int n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc0 ? 2 : 1;
	uint32_t c = n == 1 ? s[0] : s[0] & (0x7f >> n);
	for (int i = 1; i < n; i++) {
		if ((s[i] & 0xc0) != 0x80) {
			*len = 1;
			return s[0];
		}
		c = (c << 6) | (s[i] & 0x3f);
	}
	*len = n;
	return c;
}

/* Python's str.isspace() */
static int py_space(uint32_t c)
{
	return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
	       c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
	       c == 0x202f || c == 0x205f || c == 0x3000;
}

char *bk_bake_strip(const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *start = NULL, *end = p;
	while (*p) {
		int n;
		uint32_t c = utf8_at(p, &n);
		if (!py_space(c)) {
			if (!start)
				start = p;
			end = p + n;
		}
		p += n;
	}
	if (!start)
		return xstrdup("");
	return xstrndup((const char *)start, (size_t)(end - start));
}

static uint32_t py_lower(uint32_t c)
{
	if ((c >= 'A' && c <= 'Z') || (c >= 0xc0 && c <= 0xde && c != 0xd7) ||
	    (c >= 0x391 && c <= 0x3ab && c != 0x3a2) || (c >= 0x410 && c <= 0x42f))
		return c + 0x20;
	if (c >= 0x400 && c <= 0x40f)
		return c + 0x50;
	if (c >= 0x100 && c <= 0x17f && c != 0x130 && c != 0x138 && c != 0x149 && c != 0x17f) {
		/* pairs: even upper / odd lower in 0100-0137 and 014a-0177; odd upper / even
		 * lower in 0139-0148 and 0179-017e; 0178 is Ÿ -> ÿ */
		if (c == 0x178)
			return 0xff;
		if ((c <= 0x137 || (c >= 0x14a && c <= 0x177)) && !(c & 1))
			return c + 1;
		if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) && (c & 1))
			return c + 1;
	}
	return c;
}

static int utf8_put(uint32_t c, char *out)
{
	if (c < 0x80) {
		out[0] = (char)c;
		return 1;
	}
	if (c < 0x800) {
		out[0] = (char)(0xc0 | (c >> 6));
		out[1] = (char)(0x80 | (c & 0x3f));
		return 2;
	}
	if (c < 0x10000) {
		out[0] = (char)(0xe0 | (c >> 12));
		out[1] = (char)(0x80 | ((c >> 6) & 0x3f));
		out[2] = (char)(0x80 | (c & 0x3f));
		return 3;
	}
	out[0] = (char)(0xf0 | (c >> 18));
	out[1] = (char)(0x80 | ((c >> 12) & 0x3f));
	out[2] = (char)(0x80 | ((c >> 6) & 0x3f));
	out[3] = (char)(0x80 | (c & 0x3f));
	return 4;
}

void bk_bake_lower(char *s)
{
	/* every mapping above keeps the UTF-8 length (all within one length class) */
	unsigned char *p = (unsigned char *)s;
	while (*p) {
		int n;
		uint32_t c = utf8_at(p, &n);
		uint32_t l = py_lower(c);
		if (l != c) {
			char buf[4];
			if (utf8_put(l, buf) == n)
				memcpy(p, buf, (size_t)n);
		}
		p += n;
	}
}

char *bk_bake_response_text(const char *answer)
{
	/* re.sub(r"<think>.*?</think>", "", response, flags=re.DOTALL) */
	size_t len = strlen(answer);
	char *cut = xmalloc(len + 1), *o = cut;
	const char *p = answer;
	for (;;) {
		const char *a = strstr(p, "<think>");
		const char *b = a ? strstr(a + 7, "</think>") : NULL;
		if (!b) {
			strcpy(o, p);
			break;
		}
		memcpy(o, p, (size_t)(a - p));
		o += a - p;
		p = b + 8;
	}
	char *s = bk_bake_strip(cut);
	free(cut);
	bk_bake_lower(s);
	/* [:200] in code points */
	unsigned char *q = (unsigned char *)s;
	for (int i = 0; *q && i < 200; i++) {
		int n;
		utf8_at(q, &n);
		q += n;
	}
	*q = 0;
	return s;
}

int64_t bk_bake_prompt_tokens(const char *model_dir, int64_t sp_tokens)
{
	/* what the tokenizer itself puts around one sequence (its post-processor, or
	 * SentencePiece's BOS as tokenizer_config.json's add_bos_token says), as the
	 * RAW template and bk-tokenize use it: no guess from the config alone */
	bk_tok *t = bk_tok_open(model_dir);
	const int32_t *pre, *suf;
	size_t np, ns;
	bk_tok_added_ids(t, &pre, &np, &suf, &ns);
	bk_tok_free(t);
	return sp_tokens + (int64_t)(np + ns);
}

/* ---- results.json ---- */

static void bad_shape(const char *path, const char *what)
{
	die("%s: not bk-eval's output: %s", path, what);
}

/* {accuracy, correct, total, results} of one configuration of one Q&A set: the
 * examples of that set are ex[first .. first + 3 * n), config-major */
static json_t *tool_set(const json_t *ex, size_t first, size_t n, const char *config,
			const char *path)
{
	json_t *results = json_array();
	size_t correct = 0;
	for (size_t i = first; i < first + 3 * n; i++) {
		json_t *e = json_array_get(ex, i);
		const char *c = json_string_value(json_object_get(e, "config"));
		const char *q = json_string_value(json_object_get(e, "question"));
		const char *a = json_string_value(json_object_get(e, "answer"));
		json_t *ok = json_object_get(e, "correct");
		if (!c || !q || !a || !json_is_boolean(ok))
			bad_shape(path, "an example without config, question, answer and correct");
		if (strcmp(c, config))
			continue;
		char *r = bk_bake_response_text(a);
		json_array_append_new(results, json_pack("{s:s, s:s, s:b}", "question", q, "response",
							 r, "correct", json_is_true(ok)));
		free(r);
		correct += json_is_true(ok);
	}
	if (json_array_size(results) != n)
		bad_shape(path, "the examples do not cover every question (bk-eval --show)");
	return json_pack("{s:f, s:I, s:I, s:o}", "accuracy", n ? (double)correct / (double)n : 0.0,
			 "correct", (json_int_t)correct, "total", (json_int_t)n, "results", results);
}

json_t *bk_bake_results(const json_t *bkeval, const char *bkeval_path, int64_t prompt_tokens,
			int has_eval, int has_held_out, json_t *train)
{
	json_t *res = json_pack("{s:I}", "prompt_tokens", (json_int_t)prompt_tokens);
	json_t *ours = json_object();
	if (bkeval) {
		const json_t *ex = json_object_get(bkeval, "examples");
		if (!json_is_array(ex))
			bad_shape(bkeval_path, "no examples");
		size_t ne = 0, nh = 0;
		json_t *e = json_object_get(bkeval, "eval"), *h = json_object_get(bkeval, "held_out");
		if (has_eval) {
			if (!json_is_integer(json_object_get(e, "samples")))
				bad_shape(bkeval_path, "no eval.samples");
			ne = (size_t)json_integer_value(json_object_get(e, "samples"));
		}
		if (has_held_out) {
			if (!json_is_integer(json_object_get(h, "samples")))
				bad_shape(bkeval_path, "no held_out.samples");
			nh = (size_t)json_integer_value(json_object_get(h, "samples"));
		}
		if (json_array_size(ex) != 3 * (ne + nh))
			bad_shape(bkeval_path, "the examples do not cover every question (bk-eval --show)");
		/* as the tool: baselines only with an eval set; held-out discrete only then */
		if (has_eval) {
			json_object_set_new(res, "baseline_none", tool_set(ex, 0, ne, "baseline", bkeval_path));
			json_object_set_new(res, "baseline_discrete",
					    tool_set(ex, 0, ne, "discrete", bkeval_path));
			if (has_held_out)
				json_object_set_new(res, "heldout_discrete",
						    tool_set(ex, 3 * ne, nh, "discrete", bkeval_path));
			json_object_set_new(res, "baked_eval", tool_set(ex, 0, ne, "baked", bkeval_path));
		}
		if (has_held_out)
			json_object_set_new(res, "baked_heldout",
					    tool_set(ex, 3 * ne, nh, "baked", bkeval_path));
		json_object_update(ours, (json_t *)bkeval);
		/* the held-out baseline (no prompt) the tool does not run, and the held-out
		 * discrete figure without an eval set, stay in bakery's part */
	}
	if (train)
		json_object_set(ours, "train", train);
	json_object_set_new(res, "bakery", ours);
	return res;
}

/* ---- trainer state ---- */

static double num_at(json_t *o, const char *k, const char *path)
{
	json_t *v = json_object_get(o, k);
	if (!json_is_number(v))
		die("%s: no number '%s'", path, k);
	return json_number_value(v);
}

void bk_bake_train_read(const char *dir, bk_bake_train *t)
{
	char *p = bk_path_join(dir, "trainer_state.json");
	json_error_t err;
	json_t *st = json_load_file(p, 0, &err);
	if (!st)
		die("%s:%d: %s", p, err.line, err.text);
	json_t *pr = json_object_get(st, "progress");
	if (!json_is_object(pr))
		die("%s: no 'progress'", p);
	t->steps = (int64_t)num_at(st, "step", p);
	t->records = (int64_t)num_at(pr, "records", p);
	t->tokens = (int64_t)num_at(pr, "tokens", p);
	t->loss_sum = num_at(pr, "loss_sum", p);
	t->elapsed = num_at(pr, "elapsed", p);
	t->mean_loss = t->steps > 0 ? t->loss_sum / (double)t->steps : NAN;
	json_decref(st);
	free(p);
}

/* ---- metrics ---- */

void bk_bake_metrics_final(const char *path, const char *from, const char *to)
{
	bk_reader *r = bk_reader_open(path);
	char *tmp = xasprintf("%s.final", path);
	bk_writer *w = bk_writer_open(tmp);
	bk_writer_header_obj(w, bk_reader_provenance(r), NULL, 0);
	const msgpack_object *rec;
	static const char *const skip[] = {"final", NULL};
	while ((rec = bk_reader_next(r))) {
		const msgpack_object *f = bk_obj_get(rec, "final");
		if (f && bk_obj_is(f, from)) {
			msgpack_packer *pk = bk_rec_begin(w);
			bk_rec_copy(w, rec, skip);
			bk_rec_key(w, "final");
			bk_pack_str(pk, to);
			bk_rec_end(w);
		} else {
			size_t len;
			const char *raw = bk_reader_raw(r, &len);
			bk_writer_raw(w, raw, len);
		}
	}
	bk_reader_close(r);
	bk_writer_close(w);
	if (rename(tmp, path))
		die("%s -> %s: %s", tmp, path, strerror(errno));
	free(tmp);
}

void bk_bake_metrics_join(const char *path, const char *part, const char *resume)
{
	char *ts = bk_path_join(resume, "trainer_state.json");
	json_error_t err;
	json_t *st = json_load_file(ts, 0, &err);
	if (!st || !json_is_integer(json_object_get(st, "step")))
		die("%s: %s", ts, st ? "key 'step' is missing or not an integer" : err.text);
	int64_t step0 = (int64_t)json_integer_value(json_object_get(st, "step"));
	json_decref(st);
	free(ts);
	bk_reader *np = bk_reader_open(part);
	char *tmp = xasprintf("%s.join", path);
	bk_writer *w = bk_writer_open(tmp);
	bk_writer_header_obj(w, bk_reader_provenance(np), NULL, 0);
	const msgpack_object *rec;
	if (bk_file_exists(path)) {
		bk_reader *old = bk_reader_open(path);
		while ((rec = bk_reader_next(old))) {
			int64_t s;
			if (!bk_rec_int_opt(old, rec, "step", &s) || s > step0)
				continue; /* its summary (checkpoints, final) and later steps */
			size_t len;
			const char *raw = bk_reader_raw(old, &len);
			bk_writer_raw(w, raw, len);
		}
		bk_reader_close(old);
	}
	while ((rec = bk_reader_next(np))) {
		size_t len;
		const char *raw = bk_reader_raw(np, &len);
		bk_writer_raw(w, raw, len);
	}
	bk_reader_close(np);
	bk_writer_close(w);
	if (rename(tmp, path))
		die("%s -> %s: %s", tmp, path, strerror(errno));
	unlink(part);
	free(tmp);
}

/* ---- output_dir ---- */

char *bk_bake_last_checkpoint(const char *output_dir)
{
	DIR *d = opendir(output_dir);
	if (!d)
		return NULL;
	struct dirent *e;
	long best = -1;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, "checkpoint-", 11))
			continue;
		char *end;
		const char *n = e->d_name + 11;
		long v = strtol(n, &end, 10);
		if (end == n || *end || v < 0)
			continue;
		char *p = bk_path_join(output_dir, e->d_name), *ts = bk_path_join(p, "trainer_state.json");
		if (bk_file_exists(ts) && v > best)
			best = v;
		free(ts);
		free(p);
	}
	closedir(d);
	return best < 0 ? NULL : xasprintf("%s/checkpoint-%ld", output_dir, best);
}

void bk_bake_model_card(const char *dir, const char *base_model, const char *body)
{
	char *text = xasprintf("---\nbase_model: %s\nlibrary_name: peft\ntags:\n- lora\n"
			       "- prompt-baking\n- bakery\n---\n\n# Prompt-baked LoRA adapter\n\n"
			       "%s",
			       base_model, body ? body : "");
	char *p = bk_path_join(dir, "README.md");
	bk_write_file_atomic(p, text, strlen(text));
	free(p);
	free(text);
}

/* ---- the epochs' prompt order ---- */

static uint64_t splitmix(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int64_t bk_bake_epoch_order(const char *tokens, const char *out, int64_t epochs,
			    int64_t last_epoch_records, uint64_t seed)
{
	bk_reader *r = bk_reader_open(tokens);
	BK_VEC(char *) raw = {0};
	BK_VEC(size_t) len = {0};
	while (bk_reader_next(r)) {
		size_t n;
		const char *p = bk_reader_raw(r, &n);
		char *c = xmalloc(n);
		memcpy(c, p, n);
		bk_vec_push(&raw, c);
		bk_vec_push(&len, n);
	}
	size_t n = raw.n;
	bk_writer *w = bk_writer_open(out);
	bk_kv kv[] = {BK_KV_I("epochs", epochs), BK_KV_I("seed", (int64_t)seed)};
	bk_writer_header(w, r, kv, 2);
	size_t *perm = xmalloc((n ? n : 1) * sizeof *perm);
	int64_t written = 0;
	for (int64_t e = 0; e < epochs; e++) {
		/* a fresh permutation each epoch, as a RandomSampler draws (Fisher-Yates
		 * from the seed and the epoch) */
		uint64_t s = seed * 0x100000001b3ull + (uint64_t)e;
		for (size_t i = 0; i < n; i++)
			perm[i] = i;
		for (size_t i = n; i > 1; i--) {
			size_t j = (size_t)(splitmix(&s) % i);
			size_t t = perm[i - 1];
			perm[i - 1] = perm[j];
			perm[j] = t;
		}
		size_t take = e == epochs - 1 && last_epoch_records >= 0 &&
				      (size_t)last_epoch_records < n
				      ? (size_t)last_epoch_records
				      : n;
		for (size_t i = 0; i < take; i++) {
			if (!e) {
				bk_writer_raw(w, raw.v[perm[i]], len.v[perm[i]]);
				continue;
			}
			/* bk-gen keys its sampling by 'id': another id each epoch gives fresh
			 * trajectories, as the tool samples anew every step */
			msgpack_unpacked up;
			msgpack_unpacked_init(&up);
			size_t off = 0;
			if (msgpack_unpack_next(&up, raw.v[perm[i]], len.v[perm[i]], &off) !=
			    MSGPACK_UNPACK_SUCCESS)
				BUG("stored record does not parse");
			const msgpack_object *id = bk_obj_get(&up.data, "id");
			if (!id || id->type != MSGPACK_OBJECT_STR)
				die("%s: record %zu: no string 'id'", tokens, perm[i] + 1);
			static const char *const skip[] = {"id", NULL};
			msgpack_packer *pk = bk_rec_begin(w);
			bk_rec_copy(w, &up.data, skip);
			bk_rec_key(w, "id");
			char *nid = xasprintf("%.*s.e%lld", (int)id->via.str.size, id->via.str.ptr,
					      (long long)e);
			bk_pack_str(pk, nid);
			free(nid);
			bk_rec_end(w);
			msgpack_unpacked_destroy(&up);
		}
		written += (int64_t)take;
	}
	bk_writer_close(w);
	bk_reader_close(r);
	for (size_t i = 0; i < n; i++)
		free(raw.v[i]);
	free(raw.v);
	free(len.v);
	free(perm);
	return written;
}

/* ---- the run's files and summary (moved from cmd/bk-bake.c) ---- */

/* Reads bk-step's metrics stream from fd into path (a byte copy), drawing progress
 * from its step records. */
void bk_bake_metrics_copy(int fd, const char *path, int64_t total)
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

/* count, 'paired' and 'system_tokens' of the tokens stream */
int64_t bk_bake_scan_tokens(const char *path, int *paired, int64_t *sys_tokens)
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

static double jnum(json_t *o, const char *path)
{
	/* "a.b.c" */
	char *p = xstrdup(path), *save = NULL;
	for (char *k = strtok_r(p, ".", &save); k && o; k = strtok_r(NULL, ".", &save))
		o = json_object_get(o, k);
	free(p);
	return o && json_is_number(o) ? json_number_value(o) : NAN;
}

void bk_bake_read_metrics(const char *path, bk_bake_logged *m)
{
	memset(m, 0, sizeof *m);
	m->loss = NAN;
	bk_reader *r = bk_reader_open(path);
	const msgpack_object *rec;
	while ((rec = bk_reader_next(r))) {
		const msgpack_object *s = bk_obj_get(rec, "step"), *l = bk_obj_get(rec, "loss"),
				     *c = bk_obj_get(rec, "checkpoints");
		double loss;
		if (s && s->type == MSGPACK_OBJECT_POSITIVE_INTEGER && bk_obj_number(l, &loss)) {
			m->step = (int64_t)s->via.u64;
			m->loss = loss;
		}
		if (c && c->type == MSGPACK_OBJECT_ARRAY)
			for (uint32_t i = 0; i < c->via.array.size; i++)
				if (c->via.array.ptr[i].type == MSGPACK_OBJECT_STR)
					bk_vec_push(&m->ckpts, xstrndup(c->via.array.ptr[i].via.str.ptr,
									c->via.array.ptr[i].via.str.size));
	}
	bk_reader_close(r);
}

/* a number field of a metrics record, or NAN */
static double rec_num(const msgpack_object *rec, const char *k)
{
	const msgpack_object *v = bk_obj_get(rec, k);
	if (!v)
		return NAN;
	if (v->type == MSGPACK_OBJECT_FLOAT64 || v->type == MSGPACK_OBJECT_FLOAT32)
		return v->via.f64;
	if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
		return (double)v->via.u64;
	if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
		return (double)v->via.i64;
	return NAN;
}

void bk_bake_log_history(const char *metrics, char *const *dirs, size_t n, int64_t per_epoch)
{
	/* the entries, once: (step, HF's entry) */
	json_t *all = json_array();
	bk_reader *r = bk_reader_open(metrics);
	const msgpack_object *rec;
	static const char *const train_keys[][2] = {
		{"grad_norm", "grad_norm"}, {"lr", "learning_rate"}, {"loss", "loss"}};
	static const char *const eval_keys[] = {"eval_loss", "eval_runtime",
						"eval_samples_per_second",
						"eval_steps_per_second"};
	while ((rec = bk_reader_next(r))) {
		double step = rec_num(rec, "step");
		int is_eval = !isnan(rec_num(rec, "eval_loss")), is_train = !isnan(rec_num(rec, "loss"));
		if (isnan(step) || (!is_eval && !is_train))
			continue;
		json_t *e = json_object();
		double ep = per_epoch > 0 ? step / (double)per_epoch : rec_num(rec, "epoch");
		if (!isnan(ep))
			json_object_set_new(e, "epoch", json_real(ep));
		json_object_set_new(e, "step", json_integer((json_int_t)step));
		if (is_eval) {
			for (size_t i = 0; i < sizeof eval_keys / sizeof *eval_keys; i++)
				if (!isnan(rec_num(rec, eval_keys[i])))
					json_object_set_new(e, eval_keys[i],
							    json_real(rec_num(rec, eval_keys[i])));
		} else {
			for (size_t i = 0; i < sizeof train_keys / sizeof *train_keys; i++)
				if (!isnan(rec_num(rec, train_keys[i][0])))
					json_object_set_new(e, train_keys[i][1],
							    json_real(rec_num(rec, train_keys[i][0])));
		}
		json_array_append_new(all, e);
	}
	bk_reader_close(r);
	for (size_t d = 0; d < n; d++) {
		char *path = bk_path_join(dirs[d], "trainer_state.json");
		json_error_t err;
		json_t *st = bk_file_exists(path) ? json_load_file(path, 0, &err) : NULL;
		if (!st) {
			free(path);
			continue;
		}
		json_t *js = json_object_get(st, "step");
		if (!json_is_integer(js))
			die("%s: no integer 'step'", path);
		json_int_t at = json_integer_value(js);
		json_t *h = json_array(), *last = NULL;
		size_t i;
		json_t *e;
		json_array_foreach(all, i, e) {
			if (json_integer_value(json_object_get(e, "step")) > at)
				continue;
			json_array_append(h, e);
			last = e;
		}
		json_object_set_new(st, "global_step", json_integer(at));
		json_t *ep = last ? json_object_get(last, "epoch") : NULL;
		if (per_epoch > 0)
			json_object_set_new(st, "epoch", json_real((double)at / (double)per_epoch));
		else if (ep)
			json_object_set(st, "epoch", ep);
		json_object_set_new(st, "log_history", h);
		char *text = json_dumps(st, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
		if (!text)
			die("out of memory");
		size_t len = strlen(text);
		text = xrealloc(text, len + 2);
		text[len] = '\n', text[len + 1] = 0;
		bk_write_file_atomic(path, text, len + 1);
		free(text);
		json_decref(st);
		free(path);
	}
	json_decref(all);
}

void bk_bake_summary(const bk_bake_plan *p, const bk_bake_cmds *b, const bk_bake_train *tr,
		    const bk_bake_logged *lg, json_t *res, double t_tok, double t_train, double t_eval)
{
	const char *od = p->output_dir;
	printf("\n======================== bakery: bake summary ========================\n");
	if (b->base_name) /* a hub id, read from its cache snapshot */
		printf("%-20s %s (%s)\n", "model", b->base_name, p->model);
	else
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
void bk_bake_copy_tokenizer(const char *model, const char *dst)
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
void bk_bake_clear_outputs(const char *od, const char *keep)
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

char *bk_bake_model_card_text(const bk_bake_plan *p, const bk_bake_cmds *b, const bk_bake_train *tr,
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
