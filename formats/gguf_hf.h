/* gguf_hf.h - a llama.cpp GGUF model as an HF model directory.  Architecture "llama"
 * (tokenizer "gpt2" with the "smollm" pre-tokenizer): config.json (LlamaForCausalLM),
 * model.safetensors (dequantized, q/k rows back in HF's rotate_half order),
 * tokenizer.json rebuilt from the GGUF vocabulary, merges and token types.  Architecture
 * "gemma3" (tokenizer "llama", i.e. SentencePiece): config.json (Gemma3ForCausalLM,
 * gemma3_text), model.safetensors (norm weights back from llama.cpp's 1 + w to HF's w),
 * tokenizer.model (a SentencePiece BPE ModelProto from the tokens, scores and types).
 * Both: tokenizer_config.json (with the chat template when the file has one),
 * special_tokens_map.json and generation_config.json.
 * Not a general converter: any other architecture, tokenizer or tensor is refused up
 * front, naming it. */
#ifndef BK_GGUF_HF_H
#define BK_GGUF_HF_H

#include <jansson.h>

#include "formats/gguf.h"
#include "formats/safetensors.h"

typedef struct {
	int tensors;       /* written */
	size_t bytes;      /* of weights written */
	int vocab, merges, added;
} bk_gguf_hf_stats;

/* Writes out_dir (which must not exist, or be an empty directory) atomically: the files
 * go to out_dir.tmp.PID, renamed to out_dir once complete.  dt: BK_DT_F32 or BK_DT_BF16.
 * Dies naming the file and key or tensor on anything unsupported. */
bk_gguf_hf_stats bk_gguf_to_hf(const char *gguf_path, const char *out_dir, bk_dtype dt);

/* The pieces, for tests: new references, dying on unsupported input. */
json_t *bk_gguf_hf_config(const bk_gguf *g, bk_dtype dt);
json_t *bk_gguf_hf_tokenizer(const bk_gguf *g);
json_t *bk_gguf_hf_tokenizer_config(const bk_gguf *g);
/* The tokenizer.model of a SentencePiece ("llama") vocabulary: malloc'd bytes, *len. */
char *bk_gguf_hf_spm(const bk_gguf *g, size_t *len);
/* HF name of a GGUF tensor ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight");
 * malloc'd, or NULL when the tensor is not one of a Llama's (gemma3 0) or a Gemma-3's
 * (gemma3 1).  *perm_heads is set to the head count to unpermute rows by (Llama q: heads,
 * k: kv heads), else 0; *minus_one to 1 for a Gemma-3 norm weight (stored as 1 + w). */
char *bk_gguf_hf_name(const char *gguf_name, int gemma3, int n_head, int n_kv,
		      int *perm_heads, int *minus_one);

#endif
