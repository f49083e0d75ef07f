/* bpe.h - the BPE tokenizer of an HF tokenizer.json, exact to HF `tokenizers`: byte-level
 * BPE (GPT-2, Llama-3, Qwen2/2.5/3, SmolLM2, Mistral's Tekken) and SentencePiece-style BPE
 * (Llama-2, TinyLlama: Prepend/Replace normalizers or Metaspace, byte fallback).  Not a general
 * tokenizer.json engine: an unsupported component dies naming it (formats/tokenizer.h
 * is the interface the tools use). */
#ifndef BK_BPE_H
#define BK_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bk_bpe bk_bpe;

/* Loads a tokenizer.json; dies "PATH: key 'model.merges[12]': ..." (one line). */
bk_bpe *bk_bpe_load(const char *path);
void bk_bpe_free(bk_bpe *b);

/* HF's encode(text, add_special_tokens=False): added tokens split out, then normalizer,
 * pre-tokenizer and model on each piece between them.  bare: skip the normalizer's
 * Prepend and Metaspace's prefix (SentencePiece-style files; the chat templates add the
 * prefix themselves, as for tokenizer.model).  *ids malloc'd. */
void bk_bpe_encode(const bk_bpe *b, const char *text, size_t len, int bare, int32_t **ids,
		   size_t *n);
/* The post-processor's ids around one sequence (TemplateProcessing's single): what
 * add_special_tokens=True adds before and after. */
void bk_bpe_post(const bk_bpe *b, const int32_t **prefix, size_t *np, const int32_t **suffix,
		 size_t *ns);
/* HF's decode(ids, skip_special_tokens=True); malloc'd, NUL-terminated. */
char *bk_bpe_decode(const bk_bpe *b, const int32_t *ids, size_t n);

int32_t bk_bpe_piece_to_id(const bk_bpe *b, const char *piece); /* added tokens, then vocab */
const char *bk_bpe_id_to_piece(const bk_bpe *b, int32_t id);     /* NULL: no such id */
int32_t bk_bpe_vocab_size(const bk_bpe *b);                      /* largest id + 1 */
int32_t bk_bpe_unk(const bk_bpe *b);                             /* -1: none */
/* 1: SentencePiece-style (spaces as U+2581), 0: byte-level. */
int bk_bpe_metaspace(const bk_bpe *b);

#endif
