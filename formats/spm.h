/* spm.h - a small C interface to a SentencePiece tokenizer (tokenizer.model).
 * Encoding, decoding, piece lookup and the special ids; not a chat template
 * (formats/template.h) and not a cache (bk-tokenize keeps its own). */
#ifndef BK_SPM_H
#define BK_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bk_spm bk_spm;

/* Every bk_spm_encode / bk_spm_encode_bare call adds one (a cache test checks
 * that a warm run makes none). */
extern unsigned long bk_spm_encode_calls;

/* Loads PATH; dies "PATH: not a sentencepiece model" (or the read error). */
bk_spm *bk_spm_load(const char *path);
void bk_spm_free(bk_spm *s);

/* SentencePiece's own encoding of text[0..len), as the Python library's
 * encode(text) gives it: the model's normalizer (dummy prefix, whitespace
 * rules), no BOS/EOS.  *ids is malloc'd (free it), *n its length. */
void bk_spm_encode(const bk_spm *s, const char *text, size_t len, int32_t **ids, size_t *n);
/* The encoding HF's fast Llama tokenizer applies to one piece of text between
 * special tokens: spaces become U+2581, then the model's pieces; no dummy prefix
 * and no removal of extra whitespace, whatever the model's normalizer says.
 * Callers add the prefix themselves (a leading " ") where HF would. */
void bk_spm_encode_bare(const bk_spm *s, const char *text, size_t len, int32_t **ids,
			size_t *n);
/* The text of ids (control pieces dropped, byte pieces joined); malloc'd. */
char *bk_spm_decode(const bk_spm *s, const int32_t *ids, size_t n);

int32_t bk_spm_piece_to_id(const bk_spm *s, const char *piece); /* -1: not in vocab */
const char *bk_spm_id_to_piece(const bk_spm *s, int32_t id);     /* NULL: out of range */
int32_t bk_spm_vocab_size(const bk_spm *s);
int32_t bk_spm_bos(const bk_spm *s); /* -1 when the model has none */
int32_t bk_spm_eos(const bk_spm *s);
int32_t bk_spm_unk(const bk_spm *s);
int32_t bk_spm_pad(const bk_spm *s);
/* XXH3-64 of the model file's bytes (for stream headers). */
uint64_t bk_spm_file_hash(const bk_spm *s);
const char *bk_spm_path(const bk_spm *s);

#ifdef __cplusplus
}
#endif
#endif
