/* test_bpe.c - the BPE of tokenizer.json (formats/bpe.c through formats/tokenizer.h)
 * against HF tokenizers' ids on real vocabularies (tests/golden/bpe/NAME.json, written by
 * tests/ref/make_bpe_golden.py): Qwen2/2.5/3, Llama-3, GPT-2, SmolLM2 and their variants
 * with added-token flags, Mistral's Tekken (Mistral-Nemo; 300 random strings among its
 * cases); decode; the SentencePiece-style file of TinyLlama against its tokenizer.model;
 * refusals of what is not supported. */
#include "formats/bakeout.h"
#include "formats/tokenizer.h"
#include "tests/harness.h"

#include "common/diag.h"
#include "common/files.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

static int same(const int32_t *ids, size_t n, json_t *want, const char *what, const char *text)
{
	size_t wn = json_array_size(want), i;
	for (i = 0; i < n && i < wn; i++)
		if (ids[i] != (int32_t)json_integer_value(json_array_get(want, i)))
			break;
	if (i == n && i == wn)
		return 1;
	fprintf(stderr, "  %s of \"%.60s\": first difference at %zu (got %zu ids, want %zu): got %d, want %d\n",
		what, text, i, n, wn, i < n ? (int)ids[i] : -1,
		i < wn ? (int)json_integer_value(json_array_get(want, i)) : -1);
	return 0;
}

/* tests/golden/bpe/NAME.tokenizer.json.xz unpacked to TMPDIR/NAME/tokenizer.json */
static char *unpack(const char *xz, const char *name)
{
	char *dir = xasprintf("%s/%s", tmpdir, name);
	bk_mkdir_p(dir);
	char *out = xasprintf("%s/tokenizer.json", dir);
	char *cmd = xasprintf("xz -dc '%s' > '%s'", xz, out);
	int rc = system(cmd);
	CHECK(rc == 0, "%s: exit %d", cmd, rc);
	free(cmd);
	free(dir);
	return out;
}

/* A copy of tokenizer.json with the golden's "variant" applied (extra added tokens, a
 * normalizer, pre-tokenizer or decoder), written next to it as NAME-variant/tokenizer.json. */
static char *make_variant(const char *json_path, json_t *variant, const char *name)
{
	json_error_t err;
	json_t *root = json_load_file(json_path, 0, &err);
	CHECK(root != NULL, "%s: %s", json_path, err.text);
	json_t *extra = json_object_get(variant, "added_tokens");
	size_t i;
	json_t *e;
	json_array_foreach(extra, i, e) json_array_append(json_object_get(root, "added_tokens"), e);
	static const char *const parts[] = {"normalizer", "pre_tokenizer", "decoder"};
	for (size_t k = 0; k < 3; k++)
		if (json_object_get(variant, parts[k]))
			json_object_set(root, parts[k], json_object_get(variant, parts[k]));
	char *dir = xasprintf("%s/%s-variant", tmpdir, name);
	bk_mkdir_p(dir);
	char *out = xasprintf("%s/tokenizer.json", dir);
	CHECK(json_dump_file(root, out, JSON_COMPACT) == 0, "writing %s", out);
	json_decref(root);
	free(dir);
	return out;
}

static size_t check_cases(const bk_tok *t, json_t *cases, const char *name)
{
	size_t i, ok = 0;
	json_t *c;
	const int32_t *pre, *suf;
	size_t np, ns;
	bk_tok_added_ids(t, &pre, &np, &suf, &ns);
	json_array_foreach(cases, i, c) {
		const char *text = json_string_value(json_object_get(c, "text"));
		size_t len = strlen(text);
		int32_t *ids;
		size_t n;
		bk_tok_encode(t, text, len, &ids, &n);
		int good = same(ids, n, json_object_get(c, "ids"), name, text);
		CHECK(good, "%s: case %zu: ids differ from HF", name, i);
		/* add_special_tokens=True: the post-processor's ids around them */
		int32_t *all = xmalloc((n + np + ns + 1) * sizeof *all);
		if (np)
			memcpy(all, pre, np * sizeof *all);
		if (n)
			memcpy(all + np, ids, n * sizeof *all);
		if (ns)
			memcpy(all + np + n, suf, ns * sizeof *all);
		CHECK(same(all, n + np + ns, json_object_get(c, "ids_special"), name, text),
		      "%s: case %zu: ids with special tokens differ from HF", name, i);
		free(all);
		json_t *dec = json_object_get(c, "decoded");
		if (json_is_string(dec)) {
			char *back = bk_tok_decode(t, ids, n);
			CHECK(!strcmp(back, json_string_value(dec)), "%s: case %zu: decode '%s', want '%s'",
			      name, i, back, json_string_value(dec));
			free(back);
		}
		ok += good;
		free(ids);
	}
	return ok;
}

/* results.json's prompt_tokens, the tool's len(tokenizer.encode(system_prompt)), for a
 * model directory of this tokenizer.json and the family's real tokenizer_config.json
 * (tests/data/hf-configs/FAMILY; none: the tokenizer alone): HF's ids_special count. */
static void check_prompt_tokens(const char *name, const char *tj, const char *family,
				json_t *cases)
{
	char *dir = xasprintf("%s/%s-model", tmpdir, name);
	char *cmd = family ? xasprintf("mkdir -p '%s' && cp '%s' '%s/' && cp "
				       "tests/data/hf-configs/%s/tokenizer_config.json '%s/'",
				       dir, tj, dir, family, dir)
			   : xasprintf("mkdir -p '%s' && cp '%s' '%s/'", dir, tj, dir);
	CHECK(system(cmd) == 0, "%s", cmd);
	size_t i, bad = 0;
	json_t *c;
	int64_t added = bk_bake_prompt_tokens(dir, 0); /* opens the tokenizer: once */
	json_array_foreach(cases, i, c) {
		int64_t got = (int64_t)json_array_size(json_object_get(c, "ids")) + added;
		int64_t want = (int64_t)json_array_size(json_object_get(c, "ids_special"));
		if (got != want && bad++ < 3)
			fprintf(stderr, "  %s (%s): prompt_tokens %lld, HF's len(encode) %lld\n", name,
				family ? family : "no tokenizer_config.json", (long long)got,
				(long long)want);
	}
	CHECK(!bad, "%s: prompt_tokens differs from HF on %zu cases", name, bad);
	free(cmd);
	free(dir);
}

static void test_golden(const char *name, size_t want_llamacpp, const char *family)
{
	char *path = xasprintf("tests/golden/bpe/%s.json", name);
	json_error_t err;
	json_t *doc = json_load_file(path, 0, &err);
	CHECK(doc != NULL, "%s: %s", path, err.text);
	if (!doc) {
		free(path);
		return;
	}
	const char *xz = json_string_value(json_object_get(doc, "tokenizer"));
	char *tj = unpack(xz, name);
	bk_tok *t = bk_tok_open(tj);
	CHECK(bk_tok_kind(t) == BK_TOK_BPE, "%s: not BPE", tj);
	json_t *cases = json_object_get(doc, "cases");
	size_t n_llamacpp = 0, i;
	json_t *c;
	json_array_foreach(cases, i, c) n_llamacpp +=
		!strcmp(json_string_value(json_object_get(c, "kind")), "llama.cpp");
	CHECK(n_llamacpp == want_llamacpp, "%s: %zu llama.cpp strings, want %zu", name, n_llamacpp,
	      want_llamacpp);
	size_t ok = check_cases(t, cases, name);
	check_prompt_tokens(name, tj, family, cases);
	printf("%s: %zu/%zu cases equal to HF\n", name, ok, json_array_size(cases));
	/* vocab: every id of the goldens has a piece that maps back to it */
	json_array_foreach(cases, i, c) {
		size_t k;
		json_t *id;
		json_array_foreach(json_object_get(c, "ids"), k, id) {
			const char *p = bk_tok_id_to_piece(t, (int32_t)json_integer_value(id));
			CHECK(p && bk_tok_piece_to_id(t, p) == (int32_t)json_integer_value(id),
			      "%s: piece of id %d", name, (int)json_integer_value(id));
		}
	}
	json_t *variant = json_object_get(doc, "variant");
	if (variant) {
		char *vj = make_variant(tj, variant, name);
		bk_tok *v = bk_tok_open(vj);
		json_t *vc = json_object_get(variant, "cases");
		size_t vok = check_cases(v, vc, name);
		printf("%s variant: %zu/%zu cases equal to HF\n", name, vok, json_array_size(vc));
		CHECK(json_array_size(vc) > 0, "%s: empty variant", name);
		bk_tok_free(v);
		free(vj);
	}
	bk_tok_free(t);
	free(tj);
	json_decref(doc);
	free(path);
}

/* TinyLlama's two files: the tokenizer.model gives the sentencepiece library's ids
 * (spm_ids), which equal the tokenizer.json's HF ids except on some runs of whitespace
 * (HF's converted merges and sentencepiece's scores disagree there); bakery, as
 * AutoTokenizer, uses the tokenizer.json when a directory has both.  The template ids of
 * both are compared end to end in tests/t0010-tokenize-bpe.sh. */
static void test_spm_same(const char *name, const char *model)
{
	char *path = xasprintf("tests/golden/bpe/%s.json", name);
	json_error_t err;
	json_t *doc = json_load_file(path, 0, &err);
	CHECK(doc != NULL, "%s: %s", path, err.text);
	bk_tok *t = bk_tok_open(model);
	CHECK(bk_tok_kind(t) == BK_TOK_SPM, "%s: not sentencepiece", model);
	json_t *cases = json_object_get(doc, "cases");
	size_t i, ok = 0;
	json_t *c;
	json_array_foreach(cases, i, c) {
		const char *text = json_string_value(json_object_get(c, "text"));
		int32_t *ids;
		size_t n;
		bk_tok_encode(t, text, strlen(text), &ids, &n);
		CHECK(same(ids, n, json_object_get(c, "spm_ids"), model, text),
		      "%s: case %zu: ids differ from the sentencepiece library's", model, i);
		int hf = json_equal(json_object_get(c, "spm_ids"), json_object_get(c, "ids"));
		ok += hf;
		free(ids);
	}
	printf("%s: sentencepiece's ids on all %zu cases; %zu of them equal HF's tokenizer.json ids\n",
	       model, json_array_size(cases), ok);
	CHECK(ok >= json_array_size(cases) - 6, "%s: only %zu cases equal HF's", model, ok);
	bk_tok_free(t);
	json_decref(doc);
	free(path);
}

/* tokenizer.model alone (HF's slow LlamaTokenizer): BOS unless add_bos_token is false,
 * EOS when add_eos_token is true.  "Once upon a time" is 4 ids on stories260K. */
static void test_spm_prompt_tokens(void)
{
	CHECK(bk_bake_prompt_tokens("models/stories260K", 4) == 5, "stories260K: BOS not counted");
	static const char *const cfgs[] = {"{\"add_bos_token\": false}", "{\"add_eos_token\": true}",
					   "{}"};
	static const int64_t want[] = {4, 6, 5};
	for (int k = 0; k < 3; k++) {
		char *dir = xasprintf("%s/spm-%d", tmpdir, k);
		char *cmd = xasprintf("mkdir -p '%s' && cp models/stories260K/tokenizer.model '%s/' && "
				      "printf '%%s' '%s' >'%s/tokenizer_config.json'",
				      dir, dir, cfgs[k], dir);
		CHECK(system(cmd) == 0, "%s", cmd);
		int64_t got = bk_bake_prompt_tokens(dir, 4);
		CHECK(got == want[k], "tokenizer.model with %s: prompt_tokens %lld, want %lld", cfgs[k],
		      (long long)got, (long long)want[k]);
		free(cmd);
		free(dir);
	}
}

int main(void)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(tmpdir, sizeof tmpdir, "%s/test_bpe.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(tmpdir)) {
		perror(tmpdir);
		return 1;
	}
	test_golden("qwen", 46, "Qwen2.5-0.5B-Instruct");
	test_golden("llama-bpe", 46, NULL);
	test_golden("gpt-2", 46, NULL);
	test_golden("smollm2", 0, "SmolLM2-135M-Instruct");
	test_golden("llama-spm", 0, "TinyLlama-1.1B-Chat-v1.0");
	test_golden("tekken", 0, NULL);
	/* Gemma: Replace normalizer, Split(" ") pre-tokenizer */
	test_golden("spm-gemma", 0, NULL);
	test_spm_prompt_tokens();
	test_spm_same("llama-spm", "models/llama2-tokenizer/tokenizer.model");
	char *cmd = xasprintf("rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmpdir);
	free(cmd);
	return bk_test_done("test_bpe");
}
