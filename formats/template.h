/* template.h - chat templates as token ids: the prompt [system?, user] up to the
 * assistant header, and a response with the template's end-of-turn ids, equal to what
 * HF transformers' apply_chat_template(..., tokenize=True) gives.  Not a Jinja engine:
 * the templates are written out in template.c, and detection only looks for markers.
 *
 * Conventions (tests/golden/templates proves them against HF):
 * - system NULL or "" means no system message;
 * - mistral and gemma take no system role: the system prompt is folded into the user
 *   turn as system + "\n\n" + user (as Mistral v0.3 and Gemma 3 templates do);
 * - chatml without a system prompt has no system block (Qwen2.5's own template would
 *   insert its default system prompt);
 * - prompt ids + response ids == HF's ids of [system?, user, assistant=response]; the
 *   response is tokenized once as the continuation of the prompt's last text;
 * - raw (base models): prompt = BOS + text, text = system + " " + user (or user);
 *   response = the text continued: " " + response (no space added when the response
 *   is empty or starts with whitespace) then EOS, so that a base model learns to stop.
 * Functions append to *out (they do not clear it). */
#ifndef BK_TEMPLATE_H
#define BK_TEMPLATE_H

#include "common/diag.h"
#include "formats/spm.h"

#include <stdint.h>

typedef BK_VEC(int32_t) bk_ids;

enum bk_template_id {
	BK_TMPL_RAW,
	BK_TMPL_LLAMA2,
	BK_TMPL_ZEPHYR,
	BK_TMPL_MISTRAL,     /* Mistral-7B-Instruct v0.2 and later: "...[/INST]" resp "</s>" */
	BK_TMPL_MISTRAL_V01, /* Mistral-7B-Instruct v0.1: the same, then " " after "</s>" */
	BK_TMPL_CHATML,
	BK_TMPL_GEMMA,
	BK_TMPL_COUNT
};

int bk_template_from_name(const char *name); /* -1 when unknown */
const char *bk_template_name(int tmpl);       /* "raw", "llama2", ... */
/* A comma-separated list of the names, for usage text. */
const char *bk_template_names(void);
/* From MODEL_DIR/chat_template.jinja, else the "chat_template" of
 * MODEL_DIR/tokenizer_config.json: raw when there is none; dies when there is one
 * whose markers match no template here. */
int bk_template_detect(const char *model_dir);
/* Dies "template 'chatml': TOKENIZER has no '<|im_start|>' token" (one line) when the
 * tokenizer lacks a special token the template needs. */
void bk_template_check(int tmpl, const bk_spm *spm);

void bk_template_prompt(int tmpl, const bk_spm *spm, const char *system, const char *user,
			bk_ids *out);
void bk_template_response(int tmpl, const bk_spm *spm, const char *response, bk_ids *out);
/* The ids that end a generated turn: EOS and the template's end-of-turn marker. */
void bk_template_stop_ids(int tmpl, const bk_spm *spm, bk_ids *out);

#endif
