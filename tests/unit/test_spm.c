/* test_spm.c - the sentencepiece shim against ids from the Python sentencepiece library
 * (tests/golden/spm.json, from tests/ref/make_spm_golden.py): encode, bare encode,
 * decode, special ids, vocabulary sizes, piece lookup, file hash, refusals. */
#include "formats/spm.h"
#include "tests/harness.h"

#include "common/diag.h"
#include "common/files.h"
#include "common/hash.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs fn(arg) in a child with stderr captured; returns the exit status (-1: killed). */

static int same(const int32_t *ids, size_t n, json_t *want, const char *what, const char *text)
{
	size_t wn = json_array_size(want), i;
	for (i = 0; i < n && i < wn; i++)
		if (ids[i] != (int32_t)json_integer_value(json_array_get(want, i)))
			break;
	if (i == n && i == wn)
		return 1;
	fprintf(stderr, "  %s of \"%s\": first difference at %zu (got %zu ids, want %zu): got %d, want %d\n",
		what, text, i, n, wn, i < n ? (int)ids[i] : -1,
		i < wn ? (int)json_integer_value(json_array_get(want, i)) : -1);
	return 0;
}

static void check_model(json_t *m, uint64_t *hash)
{
	const char *path = json_string_value(json_object_get(m, "path"));
	CHECK(path != NULL, "model without a path");
	if (!path)
		return;
	bk_spm *s = bk_spm_load(path);
	CHECK(bk_spm_vocab_size(s) == json_integer_value(json_object_get(m, "vocab_size")),
	      "%s: vocab size %d", path, bk_spm_vocab_size(s));
	CHECK(bk_spm_bos(s) == json_integer_value(json_object_get(m, "bos")), "%s: bos %d", path,
	      bk_spm_bos(s));
	CHECK(bk_spm_eos(s) == json_integer_value(json_object_get(m, "eos")), "%s: eos %d", path,
	      bk_spm_eos(s));
	CHECK(bk_spm_unk(s) == json_integer_value(json_object_get(m, "unk")), "%s: unk %d", path,
	      bk_spm_unk(s));
	CHECK(bk_spm_pad(s) == json_integer_value(json_object_get(m, "pad")), "%s: pad %d", path,
	      bk_spm_pad(s));
	*hash = bk_spm_file_hash(s);
	CHECK(*hash == bk_hash_file(path), "%s: file hash", path);
	CHECK(!strcmp(bk_spm_path(s), path), "%s: path", path);

	size_t i;
	json_t *c;
	json_t *cases = json_object_get(m, "cases");
	CHECK(json_array_size(cases) >= 10, "%s: %zu cases", path, json_array_size(cases));
	json_array_foreach(cases, i, c) {
		const char *text = json_string_value(json_object_get(c, "text"));
		const char *decoded = json_string_value(json_object_get(c, "decoded"));
		size_t len = strlen(text), n;
		int32_t *ids;
		unsigned long calls = bk_spm_encode_calls;
		bk_spm_encode(s, text, len, &ids, &n);
		CHECK(bk_spm_encode_calls == calls + 1, "encode counted %lu calls",
		      bk_spm_encode_calls - calls);
		CHECK(same(ids, n, json_object_get(c, "ids"), "encode", text), "%s: encode \"%s\"",
		      path, text);
		char *back = bk_spm_decode(s, ids, n);
		CHECK(!strcmp(back, decoded), "%s: decode \"%s\" gave \"%s\", want \"%s\"", path, text,
		      back, decoded);
		free(back);
		free(ids);
		bk_spm_encode_bare(s, text, len, &ids, &n);
		CHECK(bk_spm_encode_calls == calls + 2, "bare encode not counted");
		CHECK(same(ids, n, json_object_get(c, "bare_ids"), "bare encode", text),
		      "%s: bare encode \"%s\"", path, text);
		/* decoding drops a leading space (the model's dummy prefix); stories260K
		 * (remove_extra_whitespaces) drops all leading spaces */
		const char *bare_decoded = json_string_value(json_object_get(c, "bare_decoded"));
		back = bk_spm_decode(s, ids, n);
		CHECK(bare_decoded && !strcmp(back, bare_decoded),
		      "%s: bare round trip \"%s\" gave \"%s\"", path, text, back);
		if (strstr(path, "llama2-tokenizer"))
			CHECK(!strcmp(back, text) || (text[0] == ' ' && !strcmp(back, text + 1)),
			      "%s: bare round trip \"%s\" gave \"%s\"", path, text, back);
		free(back);
		free(ids);
	}
	json_t *pieces = json_object_get(m, "pieces");
	CHECK(json_array_size(pieces) >= 10, "%s: pieces", path);
	json_array_foreach(pieces, i, c) {
		const char *piece = json_string_value(json_object_get(c, "piece"));
		int32_t want = (int32_t)json_integer_value(json_object_get(c, "id"));
		int32_t id = bk_spm_piece_to_id(s, piece);
		CHECK(id == want, "%s: piece '%s' id %d, want %d", path, piece, id, want);
		if (id >= 0) {
			const char *p = bk_spm_id_to_piece(s, id);
			CHECK(p && !strcmp(p, piece), "%s: id %d piece '%s'", path, id, p ? p : "(null)");
		}
	}
	CHECK(bk_spm_id_to_piece(s, -1) == NULL, "id -1 has a piece");
	CHECK(bk_spm_id_to_piece(s, bk_spm_vocab_size(s)) == NULL, "id vocab_size has a piece");
	CHECK(bk_spm_id_to_piece(s, bk_spm_vocab_size(s) - 1) != NULL, "last id has no piece");
	bk_spm_free(s);
}

static void load_child(void *arg)
{
	const char *path = arg;
	bk_spm_load(path);
}

static void decode_child(void *arg)
{
	const char *path = arg;
	bk_spm *s = bk_spm_load(path);
	int32_t bad[2] = {5, 1 << 20};
	free(bk_spm_decode(s, bad, 2));
}

static size_t count_lines(const char *s)
{
	size_t n = 0;
	for (; *s; s++)
		n += *s == '\n';
	return n;
}

static void test_refusals(void)
{
	char err[4096];
	/* a JSON file, an empty file, a missing file */
	int st = bk_run_child(load_child, (void *)"tests/golden/spm.json", err, sizeof err);
	CHECK(st == BK_EXIT_FAIL && strstr(err, "tests/golden/spm.json: not a sentencepiece model") &&
		      count_lines(err) == 1,
	      "json file: exit %d: %s", st, err);
	char tmp[] = "/tmp/bk-test-spm-XXXXXX";
	int fd = mkstemp(tmp);
	CHECK(fd >= 0, "mkstemp");
	close(fd);
	st = bk_run_child(load_child, tmp, err, sizeof err);
	CHECK(st == BK_EXIT_FAIL && strstr(err, "not a sentencepiece model") && strstr(err, tmp),
	      "empty file: exit %d: %s", st, err);
	unlink(tmp);
	st = bk_run_child(load_child, (void *)"tests/data/spm/no-such.model", err, sizeof err);
	CHECK(st == BK_EXIT_FAIL && strstr(err, "tests/data/spm/no-such.model") &&
		      count_lines(err) == 1,
	      "missing file: exit %d: %s", st, err);
	st = bk_run_child(decode_child, (void *)"models/stories260K/tokenizer.model", err, sizeof err);
	CHECK(st == BK_EXIT_FAIL && strstr(err, "cannot decode id 1048576"),
	      "decode of an out-of-range id: exit %d: %s", st, err);
}

int main(void)
{
	json_error_t jerr;
	json_t *doc = json_load_file("tests/golden/spm.json", 0, &jerr);
	CHECK(doc != NULL, "tests/golden/spm.json: %s", jerr.text);
	if (!doc)
		return bk_test_done("test_spm");
	CHECK(json_is_string(json_object_get(doc, "generated_by")), "no generated_by");
	json_t *models = json_object_get(doc, "models");
	CHECK(json_array_size(models) == 3, "%zu models", json_array_size(models));
	uint64_t hashes[3] = {0};
	for (size_t i = 0; i < json_array_size(models) && i < 3; i++)
		check_model(json_array_get(models, i), &hashes[i]);
	CHECK(hashes[0] != hashes[1] && hashes[1] != hashes[2] && hashes[0] != hashes[2],
	      "file hashes not distinct");
	json_decref(doc);
	test_refusals();
	return bk_test_done("test_spm");
}
