/* merge.h - folding a LoRA adapter into a model's weights, W' = W + (alpha / r) B A for
 * every targeted module (computed in fp32, rounded once to the output dtype), and
 * writing the result as a complete HF model directory.
 * Not the LoRA of training (gpu/model.h) and not a general checkpoint converter:
 * tensors other than the targeted projections are copied unchanged (or only
 * converted, with an explicit dtype). */
#ifndef BK_MERGE_H
#define BK_MERGE_H

#include "formats/peft.h"
#include "formats/safetensors.h"

/* The output dtype: keep every tensor's own dtype, or convert all of them. */
#define BK_MERGE_AUTO (-1)

/* w [out,in] += scale * b [out,r] a [r,in], in fp32. */
void bk_merge_fold(float *w, const float *a, const float *b, int out, int in, int r,
		   float scale);

/* Parses "auto", "f32", "bf16", "f16" (any case); -2 when unknown. */
int bk_merge_dtype_parse(const char *s);

typedef struct {
	int tensors;      /* tensors written */
	int merged;       /* of which folded with the adapter */
	size_t bytes;     /* model.safetensors data bytes */
} bk_merge_stats;

/* Writes out_dir: model.safetensors (one file, base tensors merged with ad, each in
 * its own dtype or in dtype), config.json (its dtype / torch_dtype key set when dtype is
 * not BK_MERGE_AUTO), and the tokenizer and generation files of model_dir that
 * exist (tokenizer.model, tokenizer.json, tokenizer_config.json,
 * special_tokens_map.json, added_tokens.json, chat_template.jinja,
 * generation_config.json).  The directory is written as out_dir.tmp.PID and renamed,
 * so out_dir is either absent or complete; an existing non-empty out_dir is refused.
 * ad must have been loaded against model_dir's config (bk_adapter_load). */
bk_merge_stats bk_merge_model(const char *model_dir, const bk_adapter *ad, const char *out_dir,
			      int dtype);

#endif
