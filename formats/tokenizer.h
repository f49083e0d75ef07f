/* tokenizer.h - the one tokenizer interface of the tools: SentencePiece (tokenizer.model,
 * formats/spm.h) or BPE (tokenizer.json, formats/bpe.h) behind it, chosen the way HF's
 * AutoTokenizer chooses: tokenizer.json when the model directory has one, else
 * tokenizer.model.  Not a chat template (formats/template.h) and not a cache. */
#ifndef BK_TOKENIZER_H
#define BK_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct bk_tok bk_tok;

enum bk_tok_kind { BK_TOK_SPM, BK_TOK_BPE };

/* Every bk_tok_encode / bk_tok_encode_segment call adds one (a cache test checks that a
 * warm run makes none). */
extern unsigned long bk_tok_encode_calls;

/* The tokenizer file of a model directory: DIR/tokenizer.json when it exists, else
 * DIR/tokenizer.model (malloc'd; it need not exist). */
char *bk_tok_file(const char *dir);
/* PATH is a model directory (see bk_tok_file) or a file: *.json is a tokenizer.json,
 * anything else a SentencePiece model.  Special tokens (bos, eos, pad, unk) of a
 * tokenizer.json come from tokenizer_config.json next to it when there is one.  Dies
 * with a one-line message naming the file. */
bk_tok *bk_tok_open(const char *path);
void bk_tok_free(bk_tok *t);

int bk_tok_kind(const bk_tok *t);
const char *bk_tok_path(const bk_tok *t); /* the file read */
/* XXH3-64 of the tokenizer file's bytes: the fingerprint in stream headers and cache keys
 * (bk_reader_expect_file on bk_tok_path() checks it). */
uint64_t bk_tok_hash(const bk_tok *t);

/* The text alone, no special tokens added: HF's encode(text, add_special_tokens=False)
 * for tokenizer.json; SentencePiece's own encode(text) for tokenizer.model.  *ids is
 * malloc'd (free it). */
void bk_tok_encode(const bk_tok *t, const char *text, size_t len, int32_t **ids, size_t *n);
/* One run of text between special tokens of a rendered chat template.  When
 * bk_tok_metaspace() (SentencePiece and SentencePiece-style tokenizer.json) no U+2581
 * prefix is added: the template adds " " itself where HF would; byte-level BPE encodes
 * the run as HF does. */
void bk_tok_encode_segment(const bk_tok *t, const char *text, size_t len, int32_t **ids,
			   size_t *n);
int bk_tok_metaspace(const bk_tok *t);
/* What add_special_tokens=True puts around one sequence (the post-processor's ids; for
 * tokenizer.model, as HF's slow LlamaTokenizer: BOS when the model has one unless
 * tokenizer_config.json next to it says add_bos_token: false; EOS after when it says
 * add_eos_token: true). */
void bk_tok_added_ids(const bk_tok *t, const int32_t **prefix, size_t *np,
		      const int32_t **suffix, size_t *ns);
/* The text of ids, special tokens dropped (HF's skip_special_tokens=True); malloc'd. */
char *bk_tok_decode(const bk_tok *t, const int32_t *ids, size_t n);

/* Whether the tool (transformers 5) tokenizes the model directory DIR otherwise than its
 * tokenizer.json.  transformers 5 builds the tokenizer_class of tokenizer_config.json
 * with a pre-tokenizer of its own and drops tokenizer.json's (transformers PRs 44254 and
 * 48219):
 *   BK_TOK_HF5_BYTELEVEL  GPT2Tokenizer(Fast): ByteLevel alone.  SmolLM2's Digits +
 *       ByteLevel then splits white space before a digit otherwise ("\n\n1": two newline
 *       tokens there, one here).
 *   BK_TOK_HF5_METASPACE  LlamaTokenizer(Fast) over a byte-level tokenizer.json (e.g.
 *       deepseek-math-7b-rl, per PR 48219): Metaspace, under which nearly every text
 *       comes out wrong ("Hello world" is not the model's two tokens).
 * bakery keeps tokenizer.json's, as the model was trained.  Returns tokenizer.json's
 * pre-tokenizer as "Digits, ByteLevel" (malloc'd) and sets *kind when it differs so, else
 * NULL and *kind 0 (also when a file is missing or unreadable: bk_tok_open says what is
 * wrong with them). */
enum { BK_TOK_HF5_BYTELEVEL = 1, BK_TOK_HF5_METASPACE };
char *bk_tok_hf5_pretokenizer(const char *dir, int *kind);

int32_t bk_tok_piece_to_id(const bk_tok *t, const char *piece); /* -1: none */
const char *bk_tok_id_to_piece(const bk_tok *t, int32_t id);     /* NULL: out of range */
int32_t bk_tok_vocab_size(const bk_tok *t);
int32_t bk_tok_bos(const bk_tok *t); /* -1 when the tokenizer has none */
int32_t bk_tok_eos(const bk_tok *t);
int32_t bk_tok_unk(const bk_tok *t);
int32_t bk_tok_pad(const bk_tok *t);

#endif
