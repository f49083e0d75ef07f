/* tokenizer.c - bk_tok (see tokenizer.h): dispatch to the SentencePiece shim or the BPE of
 * tokenizer.json, and the special tokens of tokenizer_config.json for the latter. */
#include "formats/tokenizer.h"

#include "common/diag.h"
#include "common/files.h"
#include "common/hash.h"
#include "formats/bpe.h"
#include "formats/spm.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

unsigned long bk_tok_encode_calls;

struct bk_tok {
	int kind;
	bk_spm *spm;
	bk_bpe *bpe;
	char *path;
	uint64_t hash;
	int32_t bos, eos, unk, pad;
	int32_t spm_prefix[1], spm_suffix[1];
	size_t spm_np, spm_ns;
};

char *bk_tok_file(const char *dir)
{
	char *json = bk_path_join(dir, "tokenizer.json");
	if (bk_file_exists(json))
		return json;
	free(json);
	return bk_path_join(dir, "tokenizer.model");
}

static int is_dir(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

/* The id of a special token of tokenizer_config.json (a string or {"content": ...}). */
static int32_t config_token(const bk_tok *t, const char *cfg_path, json_t *cfg, const char *key)
{
	json_t *v = json_object_get(cfg, key);
	const char *s = json_is_string(v) ? json_string_value(v)
			: json_is_string(json_object_get(v, "content"))
				? json_string_value(json_object_get(v, "content"))
				: NULL;
	if (!v || json_is_null(v))
		return -1;
	if (!s)
		die("%s: key '%s' is not a token string", cfg_path, key);
	int32_t id = bk_bpe_piece_to_id(t->bpe, s);
	if (id < 0)
		die("%s: key '%s': token '%s' is not in %s", cfg_path, key, s, t->path);
	return id;
}

static void bpe_specials(bk_tok *t)
{
	const int32_t *pre, *suf;
	size_t np, ns;
	bk_bpe_post(t->bpe, &pre, &np, &suf, &ns);
	t->bos = np ? pre[0] : -1;
	t->eos = ns ? suf[ns - 1] : -1;
	t->unk = bk_bpe_unk(t->bpe);
	t->pad = -1;
	char *dir = xstrdup(t->path);
	char *slash = strrchr(dir, '/');
	char *cfg_path;
	if (slash) {
		*slash = 0;
		cfg_path = bk_path_join(dir, "tokenizer_config.json");
	} else {
		cfg_path = xstrdup("tokenizer_config.json");
	}
	free(dir);
	if (bk_file_exists(cfg_path)) {
		json_error_t err;
		/* integers as reals: HF writes model_max_length as 1e30 written out, which
		 * jansson's json_int_t cannot hold; no integer of this file is read */
		json_t *cfg = json_load_file(cfg_path, JSON_DECODE_INT_AS_REAL, &err);
		if (!cfg)
			die("%s: line %d: %s", cfg_path, err.line, err.text);
		if (!json_is_object(cfg))
			die("%s: not a JSON object", cfg_path);
		/* present keys win, as in transformers (bos_token: null means none) */
		if (json_object_get(cfg, "bos_token"))
			t->bos = config_token(t, cfg_path, cfg, "bos_token");
		if (json_object_get(cfg, "eos_token"))
			t->eos = config_token(t, cfg_path, cfg, "eos_token");
		if (json_object_get(cfg, "unk_token"))
			t->unk = config_token(t, cfg_path, cfg, "unk_token");
		t->pad = config_token(t, cfg_path, cfg, "pad_token");
		json_decref(cfg);
	}
	free(cfg_path);
}

/* the JSON object of FILE in DIR, or NULL (missing, unreadable, not an object) */
static json_t *load_json_in(const char *dir, const char *file)
{
	char *path = bk_path_join(dir, file);
	json_t *j = NULL;
	if (bk_file_exists(path)) {
		size_t len;
		char *text = bk_read_file(path, &len); /* json_loadb: faster than json_load_file */
		j = json_loadb(text, len, JSON_DECODE_INT_AS_REAL, NULL);
		free(text);
	}
	free(path);
	if (j && !json_is_object(j)) {
		json_decref(j);
		j = NULL;
	}
	return j;
}

static int is_class(const char *cls, const char *name)
{
	size_t n = strlen(name);
	return cls && !strncmp(cls, name, n) && (!cls[n] || !strcmp(cls + n, "Fast"));
}

char *bk_tok_hf5_pretokenizer(const char *dir, int *kind)
{
	json_t *cfg = load_json_in(dir, "tokenizer_config.json");
	const char *cls = json_string_value(json_object_get(cfg, "tokenizer_class"));
	int k = is_class(cls, "GPT2Tokenizer")	  ? BK_TOK_HF5_BYTELEVEL
		: is_class(cls, "LlamaTokenizer") ? BK_TOK_HF5_METASPACE
						  : 0;
	json_decref(cfg);
	*kind = 0;
	if (!k)
		return NULL;
	json_t *tj = load_json_in(dir, "tokenizer.json");
	json_t *pt = json_object_get(tj, "pre_tokenizer");
	const char *type = json_string_value(json_object_get(pt, "type"));
	json_t *re = json_object_get(pt, "use_regex");
	int regex = !re || json_is_true(re);
	/* its types, ", "-separated: "Digits, ByteLevel" */
	char *desc = NULL;
	size_t dlen;
	FILE *f = open_memstream(&desc, &dlen);
	if (!f)
		die("out of memory");
	json_t *list = json_object_get(pt, "pretokenizers"), *e;
	size_t i;
	if (type && !strcmp(type, "Sequence") && json_is_array(list))
		json_array_foreach(list, i, e) {
			const char *t = json_string_value(json_object_get(e, "type"));
			fprintf(f, "%s%s", i ? ", " : "", t ? t : "?");
		}
	else if (type)
		fputs(!strcmp(type, "ByteLevel") && !regex ? "ByteLevel, use_regex false" : type, f);
	fclose(f);
	json_decref(tj);
	int same = !type ||
		   (k == BK_TOK_HF5_BYTELEVEL
			    /* transformers 5's own: ByteLevel with the GPT-2 regex */
			    ? !strcmp(desc, "ByteLevel")
			    /* its Metaspace over a byte-level vocabulary is wrong; over a
			     * SentencePiece-style one it is (nearly) the file's */
			    : !strstr(desc, "ByteLevel"));
	if (same) {
		free(desc);
		return NULL;
	}
	*kind = k;
	return desc;
}

/* What HF's slow tokenizers (LlamaTokenizer, GemmaTokenizer) put around one sequence:
 * BOS unless tokenizer_config.json next to the model says add_bos_token: false, EOS
 * when it says add_eos_token: true. */
static void spm_added(bk_tok *t)
{
	t->spm_np = t->bos >= 0;
	t->spm_ns = 0;
	char *dir = xstrdup(t->path), *slash = strrchr(dir, '/');
	if (slash)
		*slash = 0;
	json_t *cfg = load_json_in(slash ? dir : ".", "tokenizer_config.json");
	free(dir);
	json_t *ab = json_object_get(cfg, "add_bos_token"), *ae = json_object_get(cfg, "add_eos_token");
	if (json_is_false(ab))
		t->spm_np = 0;
	if (json_is_true(ae) && t->eos >= 0)
		t->spm_ns = 1;
	json_decref(cfg);
}

bk_tok *bk_tok_open(const char *path)
{
	bk_tok *t = xcalloc(1, sizeof *t);
	t->path = is_dir(path) ? bk_tok_file(path) : xstrdup(path);
	if (!bk_file_exists(t->path)) {
		if (is_dir(path))
			die("%s: no tokenizer.json or tokenizer.model", path);
		die("%s: no such file (a model directory needs tokenizer.json or tokenizer.model)",
		    t->path);
	}
	if (ends_with(t->path, ".json")) {
		t->kind = BK_TOK_BPE;
		t->bpe = bk_bpe_load(t->path);
		t->hash = bk_hash_file(t->path);
		bpe_specials(t);
	} else {
		t->kind = BK_TOK_SPM;
		t->spm = bk_spm_load(t->path);
		t->hash = bk_spm_file_hash(t->spm);
		t->bos = bk_spm_bos(t->spm);
		t->eos = bk_spm_eos(t->spm);
		t->unk = bk_spm_unk(t->spm);
		t->pad = bk_spm_pad(t->spm);
		t->spm_prefix[0] = t->bos;
		t->spm_suffix[0] = t->eos;
		spm_added(t);
	}
	return t;
}

void bk_tok_free(bk_tok *t)
{
	if (!t)
		return;
	bk_spm_free(t->spm);
	bk_bpe_free(t->bpe);
	free(t->path);
	free(t);
}

int bk_tok_kind(const bk_tok *t) { return t->kind; }
const char *bk_tok_path(const bk_tok *t) { return t->path; }
uint64_t bk_tok_hash(const bk_tok *t) { return t->hash; }
int bk_tok_metaspace(const bk_tok *t) { return t->spm ? 1 : bk_bpe_metaspace(t->bpe); }

void bk_tok_encode(const bk_tok *t, const char *text, size_t len, int32_t **ids, size_t *n)
{
	bk_tok_encode_calls++;
	if (t->spm)
		bk_spm_encode(t->spm, text, len, ids, n);
	else
		bk_bpe_encode(t->bpe, text, len, 0, ids, n);
}

void bk_tok_encode_segment(const bk_tok *t, const char *text, size_t len, int32_t **ids,
			   size_t *n)
{
	bk_tok_encode_calls++;
	if (t->spm)
		bk_spm_encode_bare(t->spm, text, len, ids, n);
	else
		bk_bpe_encode(t->bpe, text, len, 1, ids, n);
}

void bk_tok_added_ids(const bk_tok *t, const int32_t **prefix, size_t *np,
		      const int32_t **suffix, size_t *ns)
{
	if (t->bpe) {
		bk_bpe_post(t->bpe, prefix, np, suffix, ns);
		return;
	}
	*prefix = t->spm_prefix;
	*np = t->spm_np;
	*suffix = t->spm_suffix;
	*ns = t->spm_ns;
}

char *bk_tok_decode(const bk_tok *t, const int32_t *ids, size_t n)
{
	return t->spm ? bk_spm_decode(t->spm, ids, n) : bk_bpe_decode(t->bpe, ids, n);
}

int32_t bk_tok_piece_to_id(const bk_tok *t, const char *piece)
{
	return t->spm ? bk_spm_piece_to_id(t->spm, piece) : bk_bpe_piece_to_id(t->bpe, piece);
}

const char *bk_tok_id_to_piece(const bk_tok *t, int32_t id)
{
	return t->spm ? bk_spm_id_to_piece(t->spm, id) : bk_bpe_id_to_piece(t->bpe, id);
}

int32_t bk_tok_vocab_size(const bk_tok *t)
{
	return t->spm ? bk_spm_vocab_size(t->spm) : bk_bpe_vocab_size(t->bpe);
}

int32_t bk_tok_bos(const bk_tok *t) { return t->bos; }
int32_t bk_tok_eos(const bk_tok *t) { return t->eos; }
int32_t bk_tok_unk(const bk_tok *t) { return t->unk; }
int32_t bk_tok_pad(const bk_tok *t) { return t->pad; }
