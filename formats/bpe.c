/* bpe.c - HF tokenizer.json BPE (see bpe.h), written from the behaviour of HF tokenizers
 * 0.23 and checked against it by tests/unit/test_bpe.c.  Not a regex engine: the four
 * pre-tokenizer regexes in use (Qwen2, Llama-3, GPT-2, Mistral's Tekken) are hand-written
 * matchers over the Unicode 16 tables of formats/unicode_tables.c (Oniguruma's \p{L},
 * \p{N}, \p{Lu} .. \p{M}; \s = the 25 White_Space points).
 *
 * Encoding one string, as HF does it:
 *  1. added tokens with normalized=false are split out of the raw text (leftmost-longest,
 *     honouring single_word, lstrip, rstrip);
 *  2. each piece between them is normalized (NFC, Prepend, Replace), then the added
 *     tokens with normalized=true are split out of it;
 *  3. each remaining piece is pre-tokenized (Split / ByteLevel / Digits / Metaspace,
 *     in sequence) into words;
 *  4. each word goes through the BPE model: ignore_merges (a word in the vocabulary is
 *     one token), else symbols (bytes for byte-level, characters otherwise, byte fallback
 *     or unk for characters not in the vocabulary) merged lowest rank first, leftmost
 *     first among equal ranks.
 * Byte-level pieces are kept as their raw bytes (the U+0100.. alphabet is undone at
 * load), so no text is ever mapped to that alphabet while encoding. */
#include "formats/bpe.h"

#include "common/diag.h"
#include "common/files.h"
#include "common/hash.h"
#include "formats/unicode_tables.h"

#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- character classes (Unicode 16) ---- */

/* C_UP, C_LO: Tekken's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
enum { C_L = 1, C_N = 2, C_WS = 4, C_UP = 8, C_LO = 16 };
static uint8_t *cls_tab; /* 0x110000 entries, built once, never freed */
static pthread_once_t cls_once = PTHREAD_ONCE_INIT;

static void cls_set(const uint32_t (*r)[2], size_t n, uint8_t bits)
{
	for (size_t i = 0; i < n; i++)
		for (uint32_t c = r[i][0]; c <= r[i][1]; c++)
			cls_tab[c] |= bits;
}

static void cls_init(void)
{
	static const uint32_t ws[][2] = {{0x09, 0x0d}, {0x20, 0x20}, {0x85, 0x85},
					 {0xa0, 0xa0}, {0x1680, 0x1680}, {0x2000, 0x200a},
					 {0x2028, 0x2029}, {0x202f, 0x202f}, {0x205f, 0x205f},
					 {0x3000, 0x3000}};
	cls_tab = xcalloc(0x110000, 1);
	cls_set(bk_uni_letter, bk_uni_letter_n, C_L);
	cls_set(bk_uni_number, bk_uni_number_n, C_N);
	cls_set(bk_uni_lu, bk_uni_lu_n, C_UP);
	cls_set(bk_uni_lt, bk_uni_lt_n, C_UP);
	cls_set(bk_uni_ll, bk_uni_ll_n, C_LO);
	cls_set(bk_uni_lm, bk_uni_lm_n, C_UP | C_LO);
	cls_set(bk_uni_lo, bk_uni_lo_n, C_UP | C_LO);
	cls_set(bk_uni_mark, bk_uni_mark_n, C_UP | C_LO);
	cls_set(ws, sizeof ws / sizeof *ws, C_WS);
}

#define BAD_CP 0xffffffffu /* an invalid byte: a character of no class */

static inline int cls_of(uint32_t c)
{
	return c < 0x110000 ? cls_tab[c] : 0;
}

/* The code point at s[i..n) and its length (an invalid byte: BAD_CP, length 1). */
static inline uint32_t u8_at(const unsigned char *s, size_t n, size_t i, size_t *len)
{
	unsigned c = s[i];
	if (c < 0x80) {
		*len = 1;
		return c;
	}
	size_t k = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
	uint32_t cp = k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
	if (!k || i + k > n)
		goto bad;
	for (size_t j = 1; j < k; j++) {
		if ((s[i + j] & 0xc0) != 0x80)
			goto bad;
		cp = cp << 6 | (s[i + j] & 0x3f);
	}
	if ((k == 2 && cp < 0x80) || (k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000) ||
	    cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		goto bad;
	*len = k;
	return cp;
bad:
	*len = 1;
	return BAD_CP;
}

/* ---- hash maps ---- */

/* bytes -> id, open addressing; keys point into storage owned elsewhere */
struct smap {
	struct sent {
		const char *k;
		uint32_t len;
		int32_t val;
	} *e;
	size_t mask, n;
};

static void smap_init(struct smap *m, size_t want)
{
	size_t cap = 64;
	while (cap < want * 2)
		cap *= 2;
	m->e = xcalloc(cap, sizeof *m->e);
	m->mask = cap - 1;
	m->n = 0;
}

static inline uint64_t bytes_hash(const char *k, size_t len)
{
	return bk_hash(k, len, 0x62706531);
}

static void smap_put(struct smap *m, const char *k, size_t len, int32_t val);

static void smap_grow(struct smap *m)
{
	struct smap g;
	smap_init(&g, (m->mask + 1));
	for (size_t i = 0; i <= m->mask; i++)
		if (m->e[i].k)
			smap_put(&g, m->e[i].k, m->e[i].len, m->e[i].val);
	free(m->e);
	*m = g;
}

/* inserts or overwrites */
static void smap_put(struct smap *m, const char *k, size_t len, int32_t val)
{
	if ((m->n + 1) * 2 > m->mask + 1)
		smap_grow(m);
	size_t i = bytes_hash(k, len) & m->mask;
	while (m->e[i].k) {
		if (m->e[i].len == len && !memcmp(m->e[i].k, k, len)) {
			m->e[i].val = val;
			return;
		}
		i = (i + 1) & m->mask;
	}
	m->e[i] = (struct sent){k, (uint32_t)len, val};
	m->n++;
}

static inline int32_t smap_get(const struct smap *m, const char *k, size_t len)
{
	size_t i = bytes_hash(k, len) & m->mask;
	while (m->e[i].k) {
		if (m->e[i].len == len && !memcmp(m->e[i].k, k, len))
			return m->e[i].val;
		i = (i + 1) & m->mask;
	}
	return -1;
}

/* (left id, right id) -> (rank, merged id) */
struct pmap {
	uint64_t *key; /* UINT64_MAX: empty */
	int32_t *rank, *id;
	size_t mask;
};

static inline size_t pair_slot(uint64_t k, size_t mask)
{
	return (size_t)((k * 0x9e3779b97f4a7c15ull) >> 17) & mask;
}

static void pmap_init(struct pmap *m, size_t want)
{
	size_t cap = 64;
	while (cap < want * 2)
		cap *= 2;
	m->key = xmalloc(cap * sizeof *m->key);
	memset(m->key, 0xff, cap * sizeof *m->key);
	m->rank = xmalloc(cap * sizeof *m->rank);
	m->id = xmalloc(cap * sizeof *m->id);
	m->mask = cap - 1;
}

static void pmap_put(struct pmap *m, int32_t a, int32_t b, int32_t rank, int32_t id)
{
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	size_t i = pair_slot(k, m->mask);
	while (m->key[i] != UINT64_MAX && m->key[i] != k)
		i = (i + 1) & m->mask;
	m->key[i] = k; /* a repeated merge: the later rank wins, as in HF's HashMap */
	m->rank[i] = rank;
	m->id[i] = id;
}

static inline int32_t pmap_get(const struct pmap *m, int32_t a, int32_t b, int32_t *id)
{
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	size_t i = pair_slot(k, m->mask);
	while (m->key[i] != UINT64_MAX) {
		if (m->key[i] == k) {
			*id = m->id[i];
			return m->rank[i];
		}
		i = (i + 1) & m->mask;
	}
	return INT32_MAX;
}

/* ---- the tokenizer ---- */

struct added {
	char *content;
	size_t len;
	int32_t id;
	int single_word, lstrip, rstrip, normalized, special;
};

enum norm_kind { N_NFC, N_PREPEND, N_REPLACE };
struct norm {
	enum norm_kind kind;
	char *a, *b; /* Prepend: a; Replace: a -> b */
	size_t alen, blen;
};

enum pre_kind { P_SPLIT_QWEN, P_SPLIT_LLAMA3, P_SPLIT_TEKKEN, P_BYTELEVEL, P_DIGITS, P_METASPACE, P_SPLIT_STR };
enum prepend_scheme { PS_ALWAYS, PS_FIRST, PS_NEVER };
struct pre {
	enum pre_kind kind;
	int prefix_space; /* ByteLevel add_prefix_space */
	int use_regex;    /* ByteLevel: the GPT-2 regex */
	int individual;   /* Digits */
	enum prepend_scheme scheme; /* Metaspace */
	int split;                  /* Metaspace */
	char repl[8];               /* Metaspace replacement; Split: the String pattern */
	size_t repl_len;
	int merged_prev;            /* Split of a String: MergedWithPrevious, else Isolated */
};

typedef BK_VEC(uint16_t) u16vec;
typedef BK_VEC(int32_t) ivec;
typedef BK_VEC(char) cvec;
typedef BK_VEC(struct norm) normvec;
typedef BK_VEC(struct pre) prevec;

struct bk_bpe {
	char *path;
	int byte_level, metaspace;
	int32_t nid;       /* largest id + 1 */
	char **piece;      /* id -> the token's string in the file (NULL: no such id) */
	char **raw;        /* id -> its bytes (byte-level: alphabet undone; else = piece) */
	uint32_t *raw_len; /* also for added tokens: their content */
	unsigned char *is_special; /* id -> special added token (dropped by decode) */
	struct smap vocab;   /* piece -> id (the model's vocabulary) */
	struct smap vbytes;  /* byte-level: raw bytes -> id */
	int32_t byte_id[256]; /* byte-level: the one-byte tokens; else byte-fallback <0xXX> */
	struct pmap merges;
	int ignore_merges, byte_fallback, fuse_unk;
	int32_t unk;
	struct added *added;
	size_t nadded;
	u16vec first[256]; /* added tokens by first byte, longest first */
	int any_normalized_added;
	struct norm *norm;
	size_t nnorm;
	struct pre *pre;
	size_t npre;
	ivec post_prefix, post_suffix;
	int dec_replace, dec_byte_fallback, dec_strip;
	struct smap added_by_content;
	char *arena; /* the vocabulary's pieces and raw bytes (one allocation) */
	size_t arena_len, arena_used;
};

static int in_arena(const bk_bpe *b, const char *p)
{
	return b->arena && p >= b->arena && p < b->arena + b->arena_len;
}

static char *arena_dup(bk_bpe *b, const char *s, size_t n)
{
	if (b->arena_used + n + 1 > b->arena_len)
		return xstrndup(s, n);
	char *p = b->arena + b->arena_used;
	memcpy(p, s, n);
	p[n] = 0;
	b->arena_used += n + 1;
	return p;
}

/* ---- loading ---- */

static const char *path_of;
static _Noreturn void bad(const char *key, const char *what)
{
	die("%s: key '%s': %s", path_of, key, what);
}

static json_t *get(json_t *o, const char *k)
{
	return json_is_object(o) ? json_object_get(o, k) : NULL;
}

static int get_bool(json_t *o, const char *k, int dflt)
{
	json_t *v = get(o, k);
	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static const char *get_str(json_t *o, const char *k)
{
	json_t *v = get(o, k);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

/* GPT-2's byte <-> character alphabet */
static uint32_t byte_char[256];
static int16_t char_byte[0x144];

static void alphabet_init(void)
{
	int n = 0;
	for (int i = 0; i < 0x144; i++)
		char_byte[i] = -1;
	for (int b = 0; b < 256; b++) {
		int self = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
		byte_char[b] = self ? (uint32_t)b : (uint32_t)(256 + n++);
		char_byte[byte_char[b]] = (int16_t)b;
	}
}
static pthread_once_t alpha_once = PTHREAD_ONCE_INIT;

/* The bytes a byte-level piece stands for; 0 when it has characters outside the alphabet. */
static int undo_alphabet(bk_bpe *b, const char *piece, char **out, uint32_t *out_len)
{
	size_t n = strlen(piece), i = 0, k = 0, len;
	char tmp[256] = {0}, *r = n < sizeof tmp ? tmp : xmalloc(n + 1);
	while (i < n) {
		uint32_t c = u8_at((const unsigned char *)piece, n, i, &len);
		if (c >= 0x144 || char_byte[c] < 0) {
			if (r != tmp)
				free(r);
			return 0;
		}
		r[k++] = (char)char_byte[c];
		i += len;
	}
	*out = arena_dup(b, r, k);
	*out_len = (uint32_t)k;
	if (r != tmp)
		free(r);
	return 1;
}

static void set_piece(bk_bpe *b, int32_t id, const char *piece)
{
	if (id < 0 || id >= b->nid)
		BUG("id %d out of %d", (int)id, (int)b->nid);
	if (b->piece[id])
		die("%s: token id %d is used twice ('%s', '%s')", path_of, (int)id, b->piece[id], piece);
	b->piece[id] = arena_dup(b, piece, strlen(piece));
}

static void load_norm(bk_bpe *b, json_t *n, normvec *out)
{
	const char *type = get_str(n, "type");
	if (!type)
		bad("normalizer", "no type");
	if (!strcmp(type, "Sequence")) {
		json_t *list = get(n, "normalizers");
		size_t i;
		json_t *e;
		if (!json_is_array(list))
			bad("normalizer.normalizers", "not a list");
		json_array_foreach(list, i, e) load_norm(b, e, out);
	} else if (!strcmp(type, "NFC")) {
		bk_vec_push(out, ((struct norm){N_NFC, NULL, NULL, 0, 0}));
	} else if (!strcmp(type, "Prepend")) {
		const char *p = get_str(n, "prepend");
		if (!p)
			bad("normalizer.prepend", "not a string");
		bk_vec_push(out, ((struct norm){N_PREPEND, xstrdup(p), NULL, strlen(p), 0}));
	} else if (!strcmp(type, "Replace")) {
		const char *p = get_str(get(n, "pattern"), "String"), *c = get_str(n, "content");
		if (!p || !c)
			bad("normalizer.pattern", "only Replace of a String pattern is supported");
		if (!*p)
			bad("normalizer.pattern", "empty pattern");
		bk_vec_push(out, ((struct norm){N_REPLACE, xstrdup(p), xstrdup(c), strlen(p),
						strlen(c)}));
	} else {
		die("%s: normalizer '%s' is not supported (NFC, Prepend, Replace, Sequence are)",
		    path_of, type);
	}
}

static const char *const qwen_re =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const llama3_re =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Mistral's Tekken (Mistral-Nemo, Ministral, Pixtral): the tekken.json "pattern" */
static const char *const tekken_re =
	"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+|"
	"[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*|"
	"\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char *const gpt2_re =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static void load_pre(bk_bpe *b, json_t *p, prevec *out)
{
	const char *type = get_str(p, "type");
	struct pre s = {0};
	if (!type)
		bad("pre_tokenizer", "no type");
	if (!strcmp(type, "Sequence")) {
		json_t *list = get(p, "pretokenizers");
		size_t i;
		json_t *e;
		if (!json_is_array(list))
			bad("pre_tokenizer.pretokenizers", "not a list");
		json_array_foreach(list, i, e) load_pre(b, e, out);
		return;
	} else if (!strcmp(type, "Split")) {
		const char *re = get_str(get(p, "pattern"), "Regex");
		const char *str = get_str(get(p, "pattern"), "String");
		const char *beh = get_str(p, "behavior");
		if (!re && str) { /* Gemma: Split(" ", MergedWithPrevious) */
			if (!*str || strlen(str) >= sizeof s.repl)
				bad("pre_tokenizer.pattern", "a String pattern must be 1 to 7 bytes");
			if (!beh || get_bool(p, "invert", 0) ||
			    (strcmp(beh, "MergedWithPrevious") && strcmp(beh, "Isolated")))
				bad("pre_tokenizer.behavior",
				    "a String pattern needs MergedWithPrevious or Isolated, not inverted");
			s.kind = P_SPLIT_STR;
			strcpy(s.repl, str);
			s.repl_len = strlen(str);
			s.merged_prev = !strcmp(beh, "MergedWithPrevious");
			bk_vec_push(out, s);
			return;
		}
		if (!re)
			bad("pre_tokenizer.pattern", "only a Regex or a String pattern is supported");
		if (!beh || strcmp(beh, "Isolated") || get_bool(p, "invert", 0))
			bad("pre_tokenizer.behavior", "only Isolated, not inverted, is supported");
		if (!strcmp(re, qwen_re))
			s.kind = P_SPLIT_QWEN;
		else if (!strcmp(re, llama3_re))
			s.kind = P_SPLIT_LLAMA3;
		else if (!strcmp(re, tekken_re))
			s.kind = P_SPLIT_TEKKEN;
		else if (!strcmp(re, gpt2_re))
			s.kind = P_BYTELEVEL; /* GPT-2's regex alone: ByteLevel's split, no alphabet */
		else
			die("%s: pre-tokenizer regex '%s' is not one of the supported (Qwen2, Llama-3, "
			    "GPT-2, Tekken)",
			    path_of, re);
		s.use_regex = 1;
	} else if (!strcmp(type, "ByteLevel")) {
		s.kind = P_BYTELEVEL;
		s.prefix_space = get_bool(p, "add_prefix_space", 1);
		s.use_regex = get_bool(p, "use_regex", 1);
		b->byte_level = 1;
	} else if (!strcmp(type, "Digits")) {
		s.kind = P_DIGITS;
		s.individual = get_bool(p, "individual_digits", 0);
	} else if (!strcmp(type, "Metaspace")) {
		const char *r = get_str(p, "replacement"), *ps = get_str(p, "prepend_scheme");
		s.kind = P_METASPACE;
		if (!r || strlen(r) >= sizeof s.repl)
			bad("pre_tokenizer.replacement", "not a short string");
		strcpy(s.repl, r);
		s.repl_len = strlen(r);
		s.split = get_bool(p, "split", 1);
		if (ps)
			s.scheme = !strcmp(ps, "always") ? PS_ALWAYS
				   : !strcmp(ps, "first") ? PS_FIRST
				   : !strcmp(ps, "never") ? PS_NEVER
							  : (bad("pre_tokenizer.prepend_scheme", "unknown"), PS_NEVER);
		else
			s.scheme = get_bool(p, "add_prefix_space", 1) ? PS_ALWAYS : PS_NEVER;
		b->metaspace = 1;
	} else {
		die("%s: pre-tokenizer '%s' is not supported (Split, ByteLevel, Digits, Metaspace, Sequence are)",
		    path_of, type);
	}
	bk_vec_push(out, s);
}

static void ids_of_special(bk_bpe *b, json_t *specials, const char *name, ivec *out)
{
	json_t *ids = get(get(specials, name), "ids");
	size_t i;
	json_t *e;
	if (!json_is_array(ids))
		die("%s: post_processor: special token '%s' has no ids", path_of, name);
	json_array_foreach(ids, i, e) {
		if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= b->nid)
			die("%s: post_processor: special token '%s': bad id", path_of, name);
		bk_vec_push(out, (int32_t)json_integer_value(e));
	}
}

static void load_post(bk_bpe *b, json_t *p)
{
	const char *type = get_str(p, "type");
	if (!type)
		bad("post_processor", "no type");
	if (!strcmp(type, "ByteLevel"))
		return;
	if (!strcmp(type, "Sequence")) {
		json_t *list = get(p, "processors");
		size_t i;
		json_t *e;
		if (!json_is_array(list))
			bad("post_processor.processors", "not a list");
		json_array_foreach(list, i, e) load_post(b, e);
		return;
	}
	if (!strcmp(type, "TemplateProcessing")) {
		json_t *single = get(p, "single"), *specials = get(p, "special_tokens");
		size_t i;
		json_t *e;
		int seen_a = 0;
		if (!json_is_array(single))
			bad("post_processor.single", "not a list");
		b->post_prefix.n = b->post_suffix.n = 0;
		json_array_foreach(single, i, e) {
			const char *name = get_str(get(e, "SpecialToken"), "id");
			if (name)
				ids_of_special(b, specials, name, seen_a ? &b->post_suffix : &b->post_prefix);
			else if (get(e, "Sequence"))
				seen_a = 1;
			else
				bad("post_processor.single", "an item neither SpecialToken nor Sequence");
		}
		return;
	}
	if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing")) {
		json_t *cls = get(p, "cls"), *sep = get(p, "sep");
		if (!json_is_integer(json_array_get(cls, 1)) || !json_is_integer(json_array_get(sep, 1)))
			bad("post_processor.cls", "not a [token, id] pair");
		b->post_prefix.n = b->post_suffix.n = 0;
		bk_vec_push(&b->post_prefix, (int32_t)json_integer_value(json_array_get(cls, 1)));
		bk_vec_push(&b->post_suffix, (int32_t)json_integer_value(json_array_get(sep, 1)));
		return;
	}
	die("%s: post-processor '%s' is not supported", path_of, type);
}

static void load_decoder(bk_bpe *b, json_t *d)
{
	const char *type = get_str(d, "type");
	if (!type)
		bad("decoder", "no type");
	if (!strcmp(type, "Sequence")) {
		json_t *list = get(d, "decoders");
		size_t i;
		json_t *e;
		if (!json_is_array(list))
			bad("decoder.decoders", "not a list");
		json_array_foreach(list, i, e) load_decoder(b, e);
	} else if (!strcmp(type, "ByteLevel")) {
		if (!b->byte_level)
			bad("decoder", "ByteLevel decoder without a ByteLevel pre-tokenizer");
	} else if (!strcmp(type, "Replace")) {
		const char *p = get_str(get(d, "pattern"), "String"), *c = get_str(d, "content");
		if (!p || !c || strcmp(p, "\xe2\x96\x81") || strcmp(c, " "))
			bad("decoder", "only Replace of U+2581 by ' ' is supported");
		b->dec_replace = 1;
	} else if (!strcmp(type, "ByteFallback")) {
		b->dec_byte_fallback = 1;
	} else if (!strcmp(type, "Fuse")) {
	} else if (!strcmp(type, "Strip")) {
		const char *c = get_str(d, "content");
		json_t *start = get(d, "start"), *stop = get(d, "stop");
		if (!c || strcmp(c, " ") || !json_is_integer(start) || json_integer_value(stop) != 0)
			bad("decoder", "only Strip of leading spaces is supported");
		b->dec_strip = (int)json_integer_value(start);
	} else if (!strcmp(type, "Metaspace")) {
		const char *ps = get_str(d, "prepend_scheme");
		b->dec_replace = 1;
		b->dec_strip = ps ? strcmp(ps, "never") != 0 : get_bool(d, "add_prefix_space", 1);
	} else {
		die("%s: decoder '%s' is not supported", path_of, type);
	}
}

static int cmp_len_desc(const void *x, const void *y, void *ctx)
{
	const struct added *a = ctx;
	size_t lx = a[*(const uint16_t *)x].len, ly = a[*(const uint16_t *)y].len;
	return lx < ly ? 1 : lx > ly ? -1 : 0;
}

static void load_added(bk_bpe *b, json_t *list)
{
	size_t i;
	json_t *e;
	if (!list || json_is_null(list))
		return;
	if (!json_is_array(list))
		bad("added_tokens", "not a list");
	b->added = xcalloc(json_array_size(list) + 1, sizeof *b->added);
	json_array_foreach(list, i, e) {
		const char *c = get_str(e, "content");
		json_t *id = get(e, "id");
		if (!c || !*c || !json_is_integer(id) || json_integer_value(id) < 0 ||
		    json_integer_value(id) > INT32_MAX - 1)
			die("%s: key 'added_tokens[%zu]': needs a non-empty content and an id", path_of, i);
		struct added *a = &b->added[b->nadded++];
		a->content = xstrdup(c);
		a->len = strlen(c);
		a->id = (int32_t)json_integer_value(id);
		a->single_word = get_bool(e, "single_word", 0);
		a->lstrip = get_bool(e, "lstrip", 0);
		a->rstrip = get_bool(e, "rstrip", 0);
		a->normalized = get_bool(e, "normalized", 1);
		a->special = get_bool(e, "special", 0);
		b->any_normalized_added |= a->normalized;
	}
	if (b->nadded > 65535)
		bad("added_tokens", "more than 65535");
}

/* Returns the id of `tok` in the vocab; dies when absent. */
static int32_t vocab_id(const bk_bpe *b, const char *tok, size_t len, size_t merge)
{
	int32_t id = smap_get(&b->vocab, tok, len);
	if (id < 0)
		die("%s: key 'model.merges[%zu]': token '%.*s' is not in the vocabulary", path_of,
		    merge, (int)len, tok);
	return id;
}

bk_bpe *bk_bpe_load(const char *path)
{
	pthread_once(&cls_once, cls_init);
	pthread_once(&alpha_once, alphabet_init);
	json_error_t err;
	size_t flen;
	char *text = bk_read_file(path, &flen); /* json_loadb: much faster than json_load_file */
	json_t *root = json_loadb(text, flen, 0, &err);
	free(text);
	if (!root)
		die("%s: line %d: %s", path, err.line, err.text);
	path_of = path;
	bk_bpe *b = xcalloc(1, sizeof *b);
	b->path = xstrdup(path);
	json_t *model = get(root, "model");
	const char *mtype = get_str(model, "type");
	if (!json_is_object(model))
		bad("model", "not an object");
	if (mtype && strcmp(mtype, "BPE"))
		die("%s: model type '%s' is not supported (BPE is)", path, mtype);
	const char *cs = get_str(model, "continuing_subword_prefix"),
		   *ew = get_str(model, "end_of_word_suffix");
	if ((cs && *cs) || (ew && *ew))
		bad("model", "continuing_subword_prefix / end_of_word_suffix are not supported");
	json_t *dropout = get(model, "dropout");
	if (json_is_number(dropout) && json_number_value(dropout) > 0)
		bad("model.dropout", "BPE dropout is not supported");
	b->ignore_merges = get_bool(model, "ignore_merges", 0);
	b->byte_fallback = get_bool(model, "byte_fallback", 0);
	b->fuse_unk = get_bool(model, "fuse_unk", 0);

	/* pre-tokenizer first: it says whether the vocabulary is byte-level */
	prevec pre = {0};
	json_t *pt = get(root, "pre_tokenizer");
	if (pt && !json_is_null(pt))
		load_pre(b, pt, &pre);
	b->pre = pre.v;
	b->npre = pre.n;
	normvec norm = {0};
	json_t *nt = get(root, "normalizer");
	if (nt && !json_is_null(nt))
		load_norm(b, nt, &norm);
	b->norm = norm.v;
	b->nnorm = norm.n;
	for (size_t i = 0; i < b->nnorm; i++)
		if (b->norm[i].kind == N_PREPEND || (b->norm[i].kind == N_REPLACE &&
						     !strcmp(b->norm[i].b, "\xe2\x96\x81")))
			b->metaspace = 1;
	if (b->metaspace && b->byte_level)
		bad("pre_tokenizer", "both ByteLevel and Metaspace");

	json_t *vocab = get(model, "vocab"), *added = get(root, "added_tokens");
	if (!json_is_object(vocab))
		bad("model.vocab", "not an object");
	load_added(b, added);
	int64_t maxid = -1;
	const char *k;
	json_t *v;
	json_object_foreach(vocab, k, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 ||
		    json_integer_value(v) > INT32_MAX - 1)
			die("%s: key 'model.vocab.%s': not a token id", path, k);
		if (json_integer_value(v) > maxid)
			maxid = json_integer_value(v);
	}
	for (size_t i = 0; i < b->nadded; i++)
		if (b->added[i].id > maxid)
			maxid = b->added[i].id;
	b->nid = (int32_t)(maxid + 1);
	b->piece = xcalloc((size_t)b->nid, sizeof *b->piece);
	b->raw = xcalloc((size_t)b->nid, sizeof *b->raw);
	b->raw_len = xcalloc((size_t)b->nid, sizeof *b->raw_len);
	b->is_special = xcalloc((size_t)b->nid, 1);
	smap_init(&b->vocab, json_object_size(vocab));
	smap_init(&b->vbytes, b->byte_level ? json_object_size(vocab) : 1);
	json_object_foreach(vocab, k, v) b->arena_len += 2 * (strlen(k) + 1);
	b->arena = xmalloc(b->arena_len + 1);
	json_object_foreach(vocab, k, v) {
		int32_t id = (int32_t)json_integer_value(v);
		set_piece(b, id, k);
		smap_put(&b->vocab, b->piece[id], strlen(k), id);
	}
	for (int i = 0; i < 256; i++)
		b->byte_id[i] = -1;
	for (int32_t id = 0; id < b->nid; id++) {
		if (!b->piece[id])
			continue;
		if (b->byte_level) {
			if (undo_alphabet(b, b->piece[id], &b->raw[id], &b->raw_len[id])) {
				smap_put(&b->vbytes, b->raw[id], b->raw_len[id], id);
				if (b->raw_len[id] == 1)
					b->byte_id[(unsigned char)b->raw[id][0]] = id;
			}
		} else {
			unsigned x;
			char tail;
			b->raw_len[id] = (uint32_t)strlen(b->piece[id]);
			b->raw[id] = arena_dup(b, b->piece[id], b->raw_len[id]);
			if (strlen(b->piece[id]) == 6 && sscanf(b->piece[id], "<0x%2X%c", &x, &tail) == 2 &&
			    tail == '>')
				b->byte_id[x & 0xff] = id;
		}
	}
	/* added tokens: content as their text (also for decode), special flag */
	smap_init(&b->added_by_content, b->nadded + 1);
	for (size_t i = 0; i < b->nadded; i++) {
		struct added *a = &b->added[i];
		if (!b->piece[a->id])
			set_piece(b, a->id, a->content);
		/* decoded as HF's ByteLevel decoder does any token: through the alphabet
		 * when every character is in it, else as its UTF-8 */
		if (!b->raw[a->id] &&
		    !(b->byte_level && undo_alphabet(b, a->content, &b->raw[a->id], &b->raw_len[a->id]))) {
			b->raw[a->id] = xstrdup(a->content);
			b->raw_len[a->id] = (uint32_t)a->len;
		}
		b->is_special[a->id] = (unsigned char)a->special;
		smap_put(&b->added_by_content, a->content, a->len, a->id);
		bk_vec_push(&b->first[(unsigned char)a->content[0]], (uint16_t)i);
	}
	for (int c = 0; c < 256; c++)
		if (b->first[c].n > 1)
			qsort_r(b->first[c].v, b->first[c].n, sizeof *b->first[c].v, cmp_len_desc,
				b->added);

	const char *unk = get_str(model, "unk_token");
	b->unk = unk ? smap_get(&b->vocab, unk, strlen(unk)) : -1;
	if (unk && b->unk < 0)
		bad("model.unk_token", "not in the vocabulary");

	json_t *merges = get(model, "merges");
	if (!json_is_array(merges))
		bad("model.merges", "not a list");
	pmap_init(&b->merges, json_array_size(merges));
	size_t i;
	json_t *m;
	BK_VEC(char) cat = {0};
	json_array_foreach(merges, i, m) {
		const char *l, *r;
		size_t ll, rl;
		if (json_is_string(m)) { /* "a b" */
			l = json_string_value(m);
			const char *sp = strchr(l, ' ');
			if (!sp)
				die("%s: key 'model.merges[%zu]': no space in '%s'", path, i, l);
			ll = (size_t)(sp - l);
			r = sp + 1;
			rl = strlen(r);
		} else if (json_is_array(m) && json_array_size(m) == 2 &&
			   json_is_string(json_array_get(m, 0)) && json_is_string(json_array_get(m, 1))) {
			l = json_string_value(json_array_get(m, 0));
			r = json_string_value(json_array_get(m, 1));
			ll = strlen(l);
			rl = strlen(r);
		} else {
			die("%s: key 'model.merges[%zu]': not \"a b\" or [\"a\", \"b\"]", path, i);
		}
		int32_t a = vocab_id(b, l, ll, i), c = vocab_id(b, r, rl, i);
		bk_vec_reserve(&cat, ll + rl);
		memcpy(cat.v, l, ll);
		memcpy(cat.v + ll, r, rl);
		int32_t ab = vocab_id(b, cat.v, ll + rl, i);
		pmap_put(&b->merges, a, c, (int32_t)i, ab);
	}
	free(cat.v);

	json_t *post = get(root, "post_processor");
	if (post && !json_is_null(post))
		load_post(b, post);
	json_t *dec = get(root, "decoder");
	if (dec && !json_is_null(dec))
		load_decoder(b, dec);
	json_decref(root);
	path_of = NULL;
	return b;
}

void bk_bpe_free(bk_bpe *b)
{
	if (!b)
		return;
	for (int32_t i = 0; i < b->nid; i++) {
		if (!in_arena(b, b->piece[i]))
			free(b->piece[i]);
		if (!in_arena(b, b->raw[i]))
			free(b->raw[i]);
	}
	free(b->arena);
	free(b->piece);
	free(b->raw);
	free(b->raw_len);
	free(b->is_special);
	free(b->vocab.e);
	free(b->vbytes.e);
	free(b->added_by_content.e);
	free(b->merges.key);
	free(b->merges.rank);
	free(b->merges.id);
	for (size_t i = 0; i < b->nadded; i++)
		free(b->added[i].content);
	free(b->added);
	for (int c = 0; c < 256; c++)
		free(b->first[c].v);
	for (size_t i = 0; i < b->nnorm; i++) {
		free(b->norm[i].a);
		free(b->norm[i].b);
	}
	free(b->norm);
	free(b->pre);
	free(b->post_prefix.v);
	free(b->post_suffix.v);
	free(b->path);
	free(b);
}

/* ---- encoding ---- */

typedef struct {
	size_t off, len;
} span;
typedef BK_VEC(span) svec;

struct ctx {
	const bk_bpe *b;
	int bare;
	ivec *out;
	cvec norm, pbuf, pbuf2; /* normalized text; pre-tokenizer text buffers */
	svec sp, sp2;
	BK_VEC(uint32_t) cp;   /* code points of a piece */
	BK_VEC(uint8_t) cls;   /* their classes */
	BK_VEC(uint32_t) cpo;  /* their byte offsets (+ the end) */
	ivec sym;
	ivec rank;
};

static void push_ids(ivec *out, const int32_t *v, size_t n)
{
	if (!n)
		return;
	bk_vec_reserve(out, out->n + n);
	memcpy(out->v + out->n, v, n * sizeof *v);
	out->n += n;
}

/* A long word: the same merges through a heap of (rank, position) and a linked list,
 * O(n log n) instead of O(n^2). */
struct hent {
	int32_t rank;
	uint32_t pos, right;
	int32_t l, r;
};

typedef BK_VEC(struct hent) hvec;

static int hless(const struct hent *x, const struct hent *y)
{
	return x->rank < y->rank || (x->rank == y->rank && x->pos < y->pos);
}

static void hpush(hvec *h, struct hent e)
{
	bk_vec_push(h, e);
	size_t i = h->n - 1;
	while (i > 0 && hless(&h->v[i], &h->v[(i - 1) / 2])) {
		struct hent t = h->v[i];
		h->v[i] = h->v[(i - 1) / 2];
		h->v[(i - 1) / 2] = t;
		i = (i - 1) / 2;
	}
}

static struct hent hpop(hvec *h)
{
	struct hent top = h->v[0];
	h->v[0] = h->v[--h->n];
	for (size_t i = 0;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < h->n && hless(&h->v[l], &h->v[m]))
			m = l;
		if (r < h->n && hless(&h->v[r], &h->v[m]))
			m = r;
		if (m == i)
			break;
		struct hent t = h->v[i];
		h->v[i] = h->v[m];
		h->v[m] = t;
		i = m;
	}
	return top;
}

static size_t merge_long(struct ctx *c, size_t n)
{
	const bk_bpe *b = c->b;
	int32_t *s = c->sym.v, dummy;
	uint32_t *next = xmalloc(n * sizeof *next), *prev = xmalloc(n * sizeof *prev);
	hvec h = {0};
	for (size_t i = 0; i < n; i++) {
		next[i] = (uint32_t)(i + 1);
		prev[i] = (uint32_t)(i ? i - 1 : UINT32_MAX);
	}
#define PUSH_PAIR(p, q)                                                                    \
	do {                                                                               \
		int32_t rk_ = pmap_get(&b->merges, s[p], s[q], &dummy);                      \
		if (rk_ != INT32_MAX)                                                       \
			hpush(&h, (struct hent){rk_, (uint32_t)(p), (uint32_t)(q), s[p], s[q]}); \
	} while (0)
	for (size_t i = 0; i + 1 < n; i++)
		PUSH_PAIR(i, i + 1);
	while (h.n) {
		struct hent e = hpop(&h);
		/* stale: either side merged since, or no longer neighbours */
		if (s[e.pos] != e.l || next[e.pos] != e.right || e.right >= n || s[e.right] != e.r)
			continue;
		int32_t id = -1;
		(void)pmap_get(&b->merges, e.l, e.r, &id);
		s[e.pos] = id;
		uint32_t gone = e.right, after = next[gone];
		s[gone] = -1;
		next[e.pos] = after;
		if (after < n)
			prev[after] = e.pos;
		if (prev[e.pos] != UINT32_MAX)
			PUSH_PAIR(prev[e.pos], e.pos);
		if (after < n)
			PUSH_PAIR(e.pos, after);
	}
#undef PUSH_PAIR
	size_t k = 0;
	for (uint32_t i = 0; i < n; i = next[i])
		s[k++] = s[i];
	free(next);
	free(prev);
	free(h.v);
	return k;
}

/* Merges sym[0..n) in place (lowest rank first, leftmost among equals); returns the new n. */
static size_t merge_word(struct ctx *c, size_t n)
{
	const bk_bpe *b = c->b;
	if (n < 2)
		return n;
	if (n > 48)
		return merge_long(c, n);
	int32_t *s = c->sym.v;
	bk_vec_reserve(&c->rank, n);
	int32_t *r = c->rank.v, dummy;
	for (size_t i = 0; i + 1 < n; i++)
		r[i] = pmap_get(&b->merges, s[i], s[i + 1], &dummy);
	for (;;) {
		size_t best = 0;
		int32_t br = INT32_MAX;
		for (size_t i = 0; i + 1 < n; i++)
			if (r[i] < br) {
				br = r[i];
				best = i;
			}
		if (br == INT32_MAX)
			break;
		int32_t id = -1;
		(void)pmap_get(&b->merges, s[best], s[best + 1], &id);
		s[best] = id;
		memmove(s + best + 1, s + best + 2, (n - best - 2) * sizeof *s);
		if (best + 2 < n)
			memmove(r + best + 1, r + best + 2, (n - best - 3) * sizeof *r);
		n--;
		if (best > 0)
			r[best - 1] = pmap_get(&b->merges, s[best - 1], s[best], &dummy);
		if (best + 1 < n)
			r[best] = pmap_get(&b->merges, s[best], s[best + 1], &dummy);
	}
	return n;
}

/* One pre-tokenized word through the model. */
static void model_word(struct ctx *c, const char *w, size_t len)
{
	const bk_bpe *b = c->b;
	if (!len)
		return;
	if (b->byte_level) {
		if (b->ignore_merges) {
			int32_t id = smap_get(&b->vbytes, w, len);
			if (id >= 0) {
				bk_vec_push(c->out, id);
				return;
			}
		}
		/* a byte with no token (SmolLM2 has none for 0x04, 0xf1, ...): unk when the
		 * model has one, else dropped, as HF drops it */
		bk_vec_reserve(&c->sym, len);
		size_t n = 0;
		int last_unk = 0;
		for (size_t i = 0; i < len; i++) {
			int32_t id = b->byte_id[(unsigned char)w[i]];
			if (id >= 0) {
				c->sym.v[n++] = id;
				last_unk = 0;
			} else if (b->unk >= 0) {
				if (!(b->fuse_unk && last_unk))
					c->sym.v[n++] = b->unk;
				last_unk = 1;
			}
		}
		n = merge_word(c, n);
		push_ids(c->out, c->sym.v, n);
		return;
	}
	if (b->ignore_merges) {
		int32_t id = smap_get(&b->vocab, w, len);
		if (id >= 0) {
			bk_vec_push(c->out, id);
			return;
		}
	}
	/* characters as symbols; byte fallback or unk for those not in the vocabulary */
	size_t n = 0, i = 0, cl;
	int last_unk = 0;
	bk_vec_reserve(&c->sym, len);
	while (i < len) {
		(void)u8_at((const unsigned char *)w, len, i, &cl);
		int32_t id = smap_get(&b->vocab, w + i, cl);
		if (id >= 0) {
			c->sym.v[n++] = id;
			last_unk = 0;
		} else {
			int all = b->byte_fallback;
			for (size_t k = 0; all && k < cl; k++)
				all = b->byte_id[(unsigned char)w[i + k]] >= 0;
			if (all) {
				for (size_t k = 0; k < cl; k++)
					c->sym.v[n++] = b->byte_id[(unsigned char)w[i + k]];
				last_unk = 0;
			} else if (b->unk >= 0) {
				if (!(b->fuse_unk && last_unk))
					c->sym.v[n++] = b->unk;
				last_unk = 1;
			} /* else dropped, as HF drops a character it has no token for */
		}
		i += cl;
	}
	n = merge_word(c, n);
	push_ids(c->out, c->sym.v, n);
}

/* decodes buf[off..off+len) into c->cp/cls/cpo */
static void decode_cps(struct ctx *c, const char *s, size_t len)
{
	bk_vec_reserve(&c->cp, len + 1);
	bk_vec_reserve(&c->cls, len + 1);
	bk_vec_reserve(&c->cpo, len + 1);
	size_t i = 0, n = 0, l;
	while (i < len) {
		uint32_t cp = u8_at((const unsigned char *)s, len, i, &l);
		c->cp.v[n] = cp;
		c->cls.v[n] = (uint8_t)cls_of(cp);
		c->cpo.v[n] = (uint32_t)i;
		n++;
		i += l;
	}
	c->cpo.v[n] = (uint32_t)len;
	c->cp.n = c->cls.n = n;
}

static inline int is_other(uint8_t k)
{
	return !(k & (C_L | C_N | C_WS));
}

static inline uint32_t fold(uint32_t c)
{
	if (c >= 'A' && c <= 'Z')
		return c + 32;
	if (c == 0x17f) /* LATIN SMALL LETTER LONG S folds to s */
		return 's';
	if (c == 0x212a) /* KELVIN SIGN folds to k */
		return 'k';
	return c;
}

/* \s*[\r\n]+|\s+(?!\S)|\s+ at i, a white space character (Qwen2, Llama-3, Tekken). */
static size_t match_ws(const uint32_t *c, const uint8_t *k, size_t i, size_t n)
{
	size_t j = i + 1, last_nl = SIZE_MAX;
	if (c[i] == '\r' || c[i] == '\n')
		last_nl = i;
	while (j < n && (k[j] & C_WS)) {
		if (c[j] == '\r' || c[j] == '\n')
			last_nl = j;
		j++;
	}
	if (last_nl != SIZE_MAX)
		return last_nl + 1;
	if (j == n || j - i == 1)
		return j;
	return j - 1;
}

/* End (code point index) of the match of the Qwen2 / Llama-3 regex at i (ndig: 1 or 3). */
static size_t match_qwen(const uint32_t *c, const uint8_t *k, size_t i, size_t n, size_t ndig)
{
	if (c[i] == '\'' && i + 1 < n) {
		uint32_t x = fold(c[i + 1]);
		if (x == 's' || x == 't' || x == 'm' || x == 'd')
			return i + 2;
		if (i + 2 < n) {
			uint32_t y = fold(c[i + 2]);
			if ((x == 'r' && y == 'e') || (x == 'v' && y == 'e') || (x == 'l' && y == 'l'))
				return i + 3;
		}
	}
	if (!(k[i] & (C_L | C_N)) && c[i] != '\r' && c[i] != '\n' && i + 1 < n && (k[i + 1] & C_L)) {
		size_t j = i + 2;
		while (j < n && (k[j] & C_L))
			j++;
		return j;
	}
	if (k[i] & C_L) {
		size_t j = i + 1;
		while (j < n && (k[j] & C_L))
			j++;
		return j;
	}
	if (k[i] & C_N) {
		size_t j = i + 1;
		while (j < n && j - i < ndig && (k[j] & C_N))
			j++;
		return j;
	}
	size_t p = i + (c[i] == ' ');
	if (p < n && is_other(k[p])) {
		size_t j = p + 1;
		while (j < n && is_other(k[j]))
			j++;
		while (j < n && (c[j] == '\r' || c[j] == '\n'))
			j++;
		return j;
	}
	return match_ws(c, k, i, n); /* whitespace: the only class left */
}

/* Tekken's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+ at s (0: no match).
 * The first class is taken greedily, then given back one at a time until the second
 * class can start: after the longest run u of the first, a character only of the second
 * (Ll) extends the match over the second class; else the match ends just after the last
 * character in [s, u) that is of both (Lm Lo M), if there is one. */
static size_t tekken_upper_lower(const uint8_t *k, size_t s, size_t n)
{
	size_t u = s;
	while (u < n && (k[u] & C_UP))
		u++;
	if (u < n && (k[u] & C_LO)) {
		while (u < n && (k[u] & C_LO))
			u++;
		return u;
	}
	for (size_t j = u; j > s; j--)
		if (k[j - 1] & C_LO)
			return j;
	return 0;
}

/* Tekken's [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]* at s (0: no match). */
static size_t tekken_upper_then(const uint8_t *k, size_t s, size_t n)
{
	size_t u = s;
	while (u < n && (k[u] & C_UP))
		u++;
	if (u == s)
		return 0;
	while (u < n && (k[u] & C_LO))
		u++;
	return u;
}

/* End of the match of Mistral's Tekken regex at i, its alternatives in Oniguruma's order
 * (each with its optional prefix first taken, then not):
 *   P?[Up]*[Lo]+ | P?[Up]+[Lo]* | \p{N} | ' '?O+[\r\n/]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 * where P = [^\r\n\p{L}\p{N}] (marks and white space included) and O = [^\s\p{L}\p{N}]. */
static size_t match_tekken(const uint32_t *c, const uint8_t *k, size_t i, size_t n)
{
	int pre = !(k[i] & (C_L | C_N)) && c[i] != '\r' && c[i] != '\n';
	size_t e;
	if (pre && i + 1 < n && (e = tekken_upper_lower(k, i + 1, n)))
		return e;
	if ((e = tekken_upper_lower(k, i, n)))
		return e;
	if (pre && i + 1 < n && (e = tekken_upper_then(k, i + 1, n)))
		return e;
	if ((e = tekken_upper_then(k, i, n)))
		return e;
	if (k[i] & C_N)
		return i + 1;
	size_t p = i + (c[i] == ' ' && i + 1 < n && is_other(k[i + 1]));
	if (is_other(k[p])) {
		size_t j = p + 1;
		while (j < n && is_other(k[j]))
			j++;
		while (j < n && (c[j] == '\r' || c[j] == '\n' || c[j] == '/'))
			j++;
		return j;
	}
	return match_ws(c, k, i, n);
}

/* GPT-2's regex (ByteLevel's own). */
static size_t match_gpt2(const uint32_t *c, const uint8_t *k, size_t i, size_t n)
{
	if (c[i] == '\'' && i + 1 < n) {
		uint32_t x = c[i + 1];
		if (x == 's' || x == 't' || x == 'm' || x == 'd')
			return i + 2;
		if (i + 2 < n) {
			uint32_t y = c[i + 2];
			if ((x == 'r' && y == 'e') || (x == 'v' && y == 'e') || (x == 'l' && y == 'l'))
				return i + 3;
		}
	}
	size_t p = i + (c[i] == ' ');
	if (p < n) {
		uint8_t want = (k[p] & C_L) ? C_L : (k[p] & C_N) ? C_N : is_other(k[p]) ? 0xff : 0;
		if (want) {
			size_t j = p + 1;
			if (want == 0xff)
				while (j < n && is_other(k[j]))
					j++;
			else
				while (j < n && (k[j] & want))
					j++;
			return j;
		}
	}
	size_t j = i + 1;
	while (j < n && (k[j] & C_WS))
		j++;
	if (j == n || j - i == 1)
		return j;
	return j - 1;
}

/* One pre-tokenizer step: pieces (c->sp into buf) -> c->sp2 into *nbuf (which may be buf). */
static void pre_step(struct ctx *c, const struct pre *p, const char *buf, cvec *nbuf,
		     int first_segment)
{
	c->sp2.n = 0;
	for (size_t pi = 0; pi < c->sp.n; pi++) {
		const char *s = buf + c->sp.v[pi].off;
		size_t len = c->sp.v[pi].len, base = c->sp.v[pi].off;
		if (p->kind == P_METASPACE ||
		    (p->kind == P_BYTELEVEL && p->prefix_space && !(len && s[0] == ' '))) {
			/* rewrite the piece into nbuf */
			size_t start = nbuf->n;
			if (p->kind == P_BYTELEVEL) {
				bk_vec_reserve(nbuf, nbuf->n + len + 1);
				nbuf->v[nbuf->n++] = ' ';
				memcpy(nbuf->v + nbuf->n, s, len);
				nbuf->n += len;
			} else {
				int pre = !c->bare && (p->scheme == PS_ALWAYS ||
						       (p->scheme == PS_FIRST && first_segment && pi == 0));
				if (pre && len && (s[0] == ' ' || (len >= p->repl_len &&
								   !memcmp(s, p->repl, p->repl_len))))
					pre = 0;
				bk_vec_reserve(nbuf, nbuf->n + (len + 1) * p->repl_len);
				if (pre) {
					memcpy(nbuf->v + nbuf->n, p->repl, p->repl_len);
					nbuf->n += p->repl_len;
				}
				for (size_t i = 0; i < len; i++) {
					if (s[i] == ' ') {
						memcpy(nbuf->v + nbuf->n, p->repl, p->repl_len);
						nbuf->n += p->repl_len;
					} else {
						nbuf->v[nbuf->n++] = s[i];
					}
				}
			}
			s = nbuf->v + start;
			len = nbuf->n - start;
			base = start;
			if (p->kind == P_METASPACE) {
				if (!p->split) {
					bk_vec_push(&c->sp2, ((span){base, len}));
					continue;
				}
				/* MergedWithNext: each replacement starts a new piece */
				size_t a = 0;
				for (size_t i = 1; i + p->repl_len <= len; i++)
					if (!memcmp(s + i, p->repl, p->repl_len)) {
						bk_vec_push(&c->sp2, ((span){base + a, i - a}));
						a = i;
					}
				if (len > a)
					bk_vec_push(&c->sp2, ((span){base + a, len - a}));
				continue;
			}
		} else if (nbuf->v != buf) {
			/* copy through so every span of this step points into nbuf */
			size_t start = nbuf->n;
			bk_vec_reserve(nbuf, nbuf->n + len);
			memcpy(nbuf->v + nbuf->n, s, len);
			nbuf->n += len;
			s = nbuf->v + start;
			base = start;
		}
		if (p->kind == P_SPLIT_STR && len) {
			/* HF's Split of a String: non-overlapping matches left to right; with
			 * MergedWithPrevious a match joins the piece before it unless that
			 * piece is a match too (or there is none); Isolated: its own piece */
			size_t a = 0, i = 0;
			int prev_match = 0;
			while (i < len) {
				if (i + p->repl_len <= len && !memcmp(s + i, p->repl, p->repl_len)) {
					size_t e = i + p->repl_len;
					if (p->merged_prev && !prev_match && i > a) {
						bk_vec_push(&c->sp2, ((span){base + a, e - a}));
					} else {
						if (i > a)
							bk_vec_push(&c->sp2, ((span){base + a, i - a}));
						bk_vec_push(&c->sp2, ((span){base + i, e - i}));
					}
					prev_match = 1;
					a = i = e;
				} else {
					prev_match = 0;
					i++;
				}
			}
			if (len > a)
				bk_vec_push(&c->sp2, ((span){base + a, len - a}));
			continue;
		}
		if ((p->kind == P_BYTELEVEL && !p->use_regex) || !len) {
			if (len)
				bk_vec_push(&c->sp2, ((span){base, len}));
			continue;
		}
		decode_cps(c, s, len);
		const uint32_t *cp = c->cp.v, *off = c->cpo.v;
		const uint8_t *k = c->cls.v;
		size_t n = c->cp.n, i = 0;
		if (p->kind == P_DIGITS) {
			while (i < n) {
				size_t j = i + 1;
				if (k[i] & C_N) {
					if (!p->individual)
						while (j < n && (k[j] & C_N))
							j++;
				} else {
					while (j < n && !(k[j] & C_N))
						j++;
				}
				bk_vec_push(&c->sp2, ((span){base + off[i], off[j] - off[i]}));
				i = j;
			}
			continue;
		}
		while (i < n) {
			size_t j = p->kind == P_SPLIT_QWEN     ? match_qwen(cp, k, i, n, 1)
				   : p->kind == P_SPLIT_LLAMA3 ? match_qwen(cp, k, i, n, 3)
				   : p->kind == P_SPLIT_TEKKEN ? match_tekken(cp, k, i, n)
							       : match_gpt2(cp, k, i, n);
			bk_vec_push(&c->sp2, ((span){base + off[i], off[j] - off[i]}));
			i = j;
		}
	}
}

/* A piece of text with no added tokens in it: pre-tokenizer, model. */
static void encode_plain(struct ctx *c, const char *s, size_t len, int first_segment)
{
	const bk_bpe *b = c->b;
	if (!len)
		return;
	c->sp.n = 0;
	bk_vec_push(&c->sp, ((span){0, len}));
	const char *buf = s;
	int which = 0;
	for (size_t i = 0; i < b->npre; i++) {
		const struct pre *p = &b->pre[i];
		int rewrites = p->kind == P_METASPACE || (p->kind == P_BYTELEVEL && p->prefix_space);
		cvec *nb = which ? &c->pbuf2 : &c->pbuf;
		if (rewrites) {
			nb->n = 0;
			pre_step(c, p, buf, nb, first_segment);
			buf = nb->v;
			which ^= 1;
		} else {
			cvec same = {(char *)buf, 0, 0};
			pre_step(c, p, buf, &same, first_segment);
		}
		svec t = c->sp;
		c->sp = c->sp2;
		c->sp2 = t;
	}
	for (size_t i = 0; i < c->sp.n; i++)
		model_word(c, buf + c->sp.v[i].off, c->sp.v[i].len);
}

/* Python-free `char::is_whitespace` over UTF-8, backwards / forwards (lstrip, rstrip). */
static size_t ws_before(const char *s, size_t end)
{
	size_t i = end;
	while (i > 0) {
		size_t p = i - 1, l;
		while (p > 0 && ((unsigned char)s[p] & 0xc0) == 0x80 && i - p < 4)
			p--;
		uint32_t cp = u8_at((const unsigned char *)s, i, p, &l);
		if (p + l != i || !(cls_of(cp) & C_WS))
			break;
		i = p;
	}
	return i;
}

static size_t ws_after(const char *s, size_t start, size_t n)
{
	size_t i = start, l;
	while (i < n && (cls_of(u8_at((const unsigned char *)s, n, i, &l)) & C_WS))
		i += l;
	return i;
}

static int word_char_before(const char *s, size_t end)
{
	if (!end)
		return 0;
	size_t p = end - 1, l;
	while (p > 0 && ((unsigned char)s[p] & 0xc0) == 0x80 && end - p < 4)
		p--;
	uint32_t cp = u8_at((const unsigned char *)s, end, p, &l);
	return cp == '_' || (cls_of(cp) & (C_L | C_N));
}

static int word_char_at(const char *s, size_t i, size_t n)
{
	size_t l;
	if (i >= n)
		return 0;
	uint32_t cp = u8_at((const unsigned char *)s, n, i, &l);
	return cp == '_' || (cls_of(cp) & (C_L | C_N));
}

/* Splits s on the added tokens whose normalized flag is `normalized`: ids of the tokens
 * go out, each gap goes to gap(). */
static void split_added(struct ctx *c, const char *s, size_t n, int normalized,
			void (*gap)(struct ctx *, const char *, size_t, size_t), size_t origin)
{
	const bk_bpe *b = c->b;
	size_t start = 0, i = 0;
	while (i < n) {
		const u16vec *cand = &b->first[(unsigned char)s[i]];
		const struct added *hit = NULL;
		for (size_t k = 0; k < cand->n; k++) {
			const struct added *a = &b->added[cand->v[k]];
			if (a->normalized == normalized && a->len <= n - i &&
			    !memcmp(s + i, a->content, a->len)) {
				hit = a;
				break;
			}
		}
		if (!hit || (hit->single_word && (word_char_before(s, i) ||
						   word_char_at(s, i + hit->len, n)))) {
			i++;
			continue;
		}
		size_t a = i, e = i + hit->len;
		if (hit->lstrip) {
			size_t w = ws_before(s, a);
			a = w > start ? w : start;
		}
		if (hit->rstrip)
			e = ws_after(s, e, n);
		if (a > start)
			gap(c, s + start, a - start, origin + start);
		bk_vec_push(c->out, hit->id);
		start = i = e;
	}
	if (n > start)
		gap(c, s + start, n - start, origin + start);
}

static void gap_normalized(struct ctx *c, const char *s, size_t n, size_t origin)
{
	encode_plain(c, s, n, origin == 0);
}

/* NFC of s into out (when anything changes); returns 0 when s is already NFC. */
/* utf8proc's NFC of s[0..n) appended to out; 0 on invalid UTF-8. */
static int nfc_append(const char *s, size_t n, cvec *out)
{
	utf8proc_uint8_t *dst = NULL;
	utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst,
					  UTF8PROC_STABLE | UTF8PROC_COMPOSE);
	if (r < 0)
		return 0;
	bk_vec_reserve(out, out->n + (size_t)r + 1);
	memcpy(out->v + out->n, dst, (size_t)r);
	out->n += (size_t)r;
	free(dst);
	return 1;
}

/* NFC of s into out (when anything changes); returns 0 when s is left as it is.
 * HF's NFC (Rust unicode-normalization) does not compose U+11935 U+11930 into U+11938
 * as Unicode 16 (and utf8proc) do: the text is normalized in two parts around each such
 * pair (U+11930 is a starter, so nothing else composes across the cut). */
static int nfc(const char *s, size_t n, cvec *out)
{
	static const char a[] = "\xf0\x91\xa4\xb5", b[] = "\xf0\x91\xa4\xb0"; /* U+11935, U+11930 */
	size_t i = 0;
	while (i < n && (unsigned char)s[i] < 0xcc) /* below U+0300: nothing composes */
		i++;
	if (i == n)
		return 0;
	out->n = 0;
	size_t start = 0;
	for (size_t k = i; k + 8 <= n; k++)
		if (!memcmp(s + k, a, 4) && !memcmp(s + k + 4, b, 4)) {
			if (!nfc_append(s + start, k + 4 - start, out))
				return 0;
			start = k + 4;
		}
	return nfc_append(s + start, n - start, out);
}

static void gap_raw(struct ctx *c, const char *s, size_t n, size_t origin)
{
	const bk_bpe *b = c->b;
	cvec cur = {0}, tmp = {0};
	const char *t = s;
	size_t tn = n;
	for (size_t i = 0; i < b->nnorm; i++) {
		const struct norm *m = &b->norm[i];
		if (m->kind == N_NFC) {
			if (nfc(t, tn, &tmp)) {
				cvec x = cur;
				cur = tmp;
				tmp = x;
				t = cur.v;
				tn = cur.n;
			}
		} else if (m->kind == N_PREPEND) {
			if (c->bare || !tn)
				continue;
			tmp.n = 0;
			bk_vec_reserve(&tmp, tn + m->alen);
			memcpy(tmp.v, m->a, m->alen);
			memcpy(tmp.v + m->alen, t, tn);
			tmp.n = tn + m->alen;
			cvec x = cur;
			cur = tmp;
			tmp = x;
			t = cur.v;
			tn = cur.n;
		} else { /* Replace */
			tmp.n = 0;
			for (size_t j = 0; j < tn;) {
				if (tn - j >= m->alen && !memcmp(t + j, m->a, m->alen)) {
					bk_vec_reserve(&tmp, tmp.n + m->blen);
					memcpy(tmp.v + tmp.n, m->b, m->blen);
					tmp.n += m->blen;
					j += m->alen;
				} else {
					bk_vec_push(&tmp, t[j]);
					j++;
				}
			}
			cvec x = cur;
			cur = tmp;
			tmp = x;
			t = cur.v;
			tn = cur.n;
		}
	}
	if (b->any_normalized_added)
		split_added(c, t, tn, 1, gap_normalized, origin);
	else
		encode_plain(c, t, tn, origin == 0);
	free(cur.v);
	free(tmp.v);
}

void bk_bpe_encode(const bk_bpe *b, const char *text, size_t len, int bare, int32_t **ids,
		   size_t *n)
{
	ivec out = {0};
	struct ctx c = {.b = b, .bare = bare, .out = &out};
	split_added(&c, text, len, 0, gap_raw, 0);
	free(c.norm.v);
	free(c.pbuf.v);
	free(c.pbuf2.v);
	free(c.sp.v);
	free(c.sp2.v);
	free(c.cp.v);
	free(c.cls.v);
	free(c.cpo.v);
	free(c.sym.v);
	free(c.rank.v);
	if (!out.v)
		out.v = xmalloc(sizeof *out.v);
	*ids = out.v;
	*n = out.n;
}

void bk_bpe_post(const bk_bpe *b, const int32_t **prefix, size_t *np, const int32_t **suffix,
		 size_t *ns)
{
	*prefix = b->post_prefix.v;
	*np = b->post_prefix.n;
	*suffix = b->post_suffix.v;
	*ns = b->post_suffix.n;
}

/* ---- decoding ---- */

/* Appends s[0..n) to out with invalid UTF-8 replaced by U+FFFD, one per maximal invalid
 * subpart (as Rust's String::from_utf8_lossy, which HF's decode uses). */
static void append_lossy(cvec *out, const unsigned char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		unsigned c = s[i];
		size_t need = 0;
		unsigned lo = 0x80, hi = 0xbf;
		if (c < 0x80) {
			bk_vec_push(out, (char)c);
			i++;
			continue;
		}
		if (c >= 0xc2 && c <= 0xdf)
			need = 1;
		else if (c >= 0xe0 && c <= 0xef) {
			need = 2;
			if (c == 0xe0)
				lo = 0xa0;
			if (c == 0xed)
				hi = 0x9f;
		} else if (c >= 0xf0 && c <= 0xf4) {
			need = 3;
			if (c == 0xf0)
				lo = 0x90;
			if (c == 0xf4)
				hi = 0x8f;
		}
		size_t k = 1;
		if (need) {
			for (; k <= need && i + k < n; k++) {
				unsigned d = s[i + k];
				if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xbf))
					break;
			}
			if (k == need + 1) {
				bk_vec_reserve(out, out->n + k);
				memcpy(out->v + out->n, s + i, k);
				out->n += k;
				i += k;
				continue;
			}
		}
		bk_vec_reserve(out, out->n + 3);
		memcpy(out->v + out->n, "\xef\xbf\xbd", 3);
		out->n += 3;
		i += k;
	}
}

char *bk_bpe_decode(const bk_bpe *b, const int32_t *ids, size_t n)
{
	cvec bytes = {0}, out = {0};
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if (id < 0 || id >= b->nid || !b->raw[id] || b->is_special[id])
			continue;
		const char *r = b->raw[id];
		size_t rl = b->raw_len[id];
		unsigned x;
		char tail;
		if (!b->byte_level && b->dec_byte_fallback && rl == 6 &&
		    sscanf(r, "<0x%2X%c", &x, &tail) == 2 && tail == '>') {
			bk_vec_push(&bytes, (char)x);
			continue;
		}
		if (!b->byte_level && b->dec_replace) {
			for (size_t k = 0; k < rl;) {
				if (rl - k >= 3 && !memcmp(r + k, "\xe2\x96\x81", 3)) {
					bk_vec_push(&bytes, ' ');
					k += 3;
				} else {
					bk_vec_push(&bytes, r[k++]);
				}
			}
			continue;
		}
		bk_vec_reserve(&bytes, bytes.n + rl);
		memcpy(bytes.v + bytes.n, r, rl);
		bytes.n += rl;
	}
	size_t skip = 0;
	while ((int)skip < b->dec_strip && skip < bytes.n && bytes.v[skip] == ' ')
		skip++;
	append_lossy(&out, (const unsigned char *)bytes.v + skip, bytes.n - skip);
	bk_vec_push(&out, 0);
	free(bytes.v);
	return out.v;
}

/* ---- lookups ---- */

int32_t bk_bpe_piece_to_id(const bk_bpe *b, const char *piece)
{
	size_t n = strlen(piece);
	int32_t id = smap_get(&b->added_by_content, piece, n);
	return id >= 0 ? id : smap_get(&b->vocab, piece, n);
}

const char *bk_bpe_id_to_piece(const bk_bpe *b, int32_t id)
{
	return id >= 0 && id < b->nid ? b->piece[id] : NULL;
}

int32_t bk_bpe_vocab_size(const bk_bpe *b)
{
	return b->nid;
}

int32_t bk_bpe_unk(const bk_bpe *b)
{
	return b->unk;
}

int bk_bpe_metaspace(const bk_bpe *b)
{
	return b->metaspace;
}
