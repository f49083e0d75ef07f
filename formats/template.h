/* template.h - chat templates as token ids: the prompt [system?, user] up to the
 * assistant header, and a response with the template's end-of-turn ids, equal to what
 * HF transformers' apply_chat_template(..., tokenize=True) gives.  Not a Jinja engine:
 * the templates are written out in template.c, and detection only looks for markers.
 *
 * Conventions (tests/golden/templates proves them against HF):
 * - system NULL or "" means no system message; templates with a default system prompt
 *   (qwen2, qwen2.5, smollm2) then insert theirs, as HF does: the student sees it;
 * - mistral, mistral-v3, mistral-v3-tekken and gemma take no system role: the system
 *   prompt is folded into the user turn as system + "\n\n" + user (as Mistral v0.3,
 *   Mistral-Nemo and Gemma 3 templates do; the hub's v0.3 and Nemo templates fold it
 *   into the last message only, so HF's render of [system, user, assistant] has no
 *   system prompt: prompt + response ids here are HF's ids of [user: system + "\n\n" +
 *   user, assistant=response]);
 * - chatml (the generic template) without a system prompt has no system block;
 * - qwen3: the generation prompt is "<|im_start|>assistant\n" (enable_thinking left
 *   undefined, HF's default), and the response carries the think block an assistant
 *   turn renders ("<think>\n\n</think>\n\n" + response); with thinking off
 *   (bk_template_set_thinking(0): enable_thinking=false) the prompt ends with that
 *   block and the response is the text alone;
 * - llama3.1 / llama3.2 always have the system header with "Cutting Knowledge Date:
 *   December 2023\nToday Date: DATE"; DATE is bk_template_set_date()'s, else HF's
 *   default: "26 Jul 2024" for 3.1, today (strftime "%d %b %Y", local time) for 3.2;
 * - a tokenizer that adds no BOS (Qwen, SmolLM2) gets none: raw uses the tokenizer's
 *   post-processor ids (add_special_tokens=True); templates write bos_token as HF does;
 * - prompt ids + response ids == HF's ids of [system?, user, assistant=response]; the
 *   response is tokenized once as the continuation of the prompt's last text;
 * - raw (base models): prompt = BOS + text, text = system + " " + user (or user);
 *   response = the text continued: " " + response (no space added when the response
 *   is empty or starts with whitespace) then EOS, so that a base model learns to stop.
 * Functions append to *out (they do not clear it). */
#ifndef BK_TEMPLATE_H
#define BK_TEMPLATE_H

#include "common/diag.h"
#include "formats/tokenizer.h"

#include <stdint.h>

typedef BK_VEC(int32_t) bk_ids;

enum bk_template_id {
	BK_TMPL_RAW,
	BK_TMPL_LLAMA2,
	BK_TMPL_ZEPHYR,
	BK_TMPL_MISTRAL,     /* Mistral-7B-Instruct v0.2 and later: "...[/INST]" resp "</s>" */
	BK_TMPL_MISTRAL_V01, /* Mistral-7B-Instruct v0.1: the same, then " " after "</s>" */
	BK_TMPL_CHATML,
	BK_TMPL_GEMMA,       /* Gemma 1/2/3: <start_of_turn> ids from the tokenizer */
	BK_TMPL_QWEN2,       /* chatml + "You are a helpful assistant" when no system */
	BK_TMPL_QWEN25,      /* chatml + Qwen2.5's default system prompt */
	BK_TMPL_SMOLLM2,     /* chatml + SmolLM2's default system prompt */
	BK_TMPL_QWEN3,       /* chatml with think blocks */
	BK_TMPL_LLAMA3,      /* Llama-3.0: headers, no date */
	BK_TMPL_LLAMA31,     /* Llama-3.1/3.3: date header, fixed default date */
	BK_TMPL_LLAMA32,     /* Llama-3.2: date header, today's date by default */
	BK_TMPL_MISTRAL_TEKKEN, /* Mistral-Nemo (V3-Tekken): "<s>[INST]...[/INST]" resp "</s>" */
	BK_TMPL_MISTRAL_V3,  /* Mistral-7B-Instruct-v0.3 (V3): "<s>[INST] ...[/INST]" " resp" "</s>" */
	BK_TMPL_COUNT
};

int bk_template_from_name(const char *name); /* -1 when unknown */
const char *bk_template_name(int tmpl);       /* "raw", "llama2", ... */
/* A comma-separated list of the names, for usage text. */
const char *bk_template_names(void);
/* From MODEL_DIR/chat_template.jinja, else the "chat_template" of
 * MODEL_DIR/tokenizer_config.json: raw when there is none; dies when there is one
 * whose markers match no template here (or a chatml one with a default system prompt
 * that is not one of the known ones). */
int bk_template_detect(const char *model_dir);
/* The template from the text of a chat template (what bk_template_detect reads); WHERE
 * names it in the error. */
int bk_template_detect_text(const char *where, const char *text);
/* Dies "template 'chatml': TOKENIZER has no '<|im_start|>' token" (one line) when the
 * tokenizer lacks a special token the template needs. */
void bk_template_check(int tmpl, const bk_tok *tok);

/* Process-wide rendering options, set once from flags before rendering: thinking
 * (qwen3's enable_thinking: 1, the default, or 0) and the Llama-3.1/3.2 date ("26 Jul
 * 2024"; NULL: HF's default).  A date that is not "DD Mon YYYY" dies. */
void bk_template_set_thinking(int on);
void bk_template_set_date(const char *date);
/* The date a llama3.1/3.2 prompt carries (NULL for other templates): static storage. */
const char *bk_template_date(int tmpl);
/* What besides the name decides a template's ids, for stream headers and cache keys:
 * "qwen3 thinking=1", "llama3.2 date=01 Dec 2026", else the name.  Static storage. */
const char *bk_template_variant(int tmpl);
/* The system prompt used when none is given (NULL when the template has none). */
const char *bk_template_default_system(int tmpl);

void bk_template_prompt(int tmpl, const bk_tok *tok, const char *system, const char *user,
			bk_ids *out);
void bk_template_response(int tmpl, const bk_tok *tok, const char *response, bk_ids *out);
/* The ids that end a generated turn: EOS and the template's end-of-turn marker. */
void bk_template_stop_ids(int tmpl, const bk_tok *tok, bk_ids *out);

#endif
