/* inputs.h - reading training data (prompts, pairs, chat rows) and the system prompt
 * (text, file, or a knowledge corpus placed into a template) into plain C strings.
 * Not tokenization or chat templating: see the tokenizer/template modules for those.
 *
 * Data files (all UTF-8; a leading UTF-8 byte-order mark is skipped):
 *   json   a list of rows, or an object wrapping the list under the first present key
 *          of: pairs data samples completions training_samples training_prompts
 *          prompts questions.  Anything else at the top is an error.
 *   jsonl  one row per non-blank line (JSON Lines / NDJSON); blank lines are skipped.
 *   text   one prompt per line; lines that are empty or only white space are skipped;
 *          a line's trailing "\r" (CRLF files) is removed; nothing else is stripped.
 *   auto   by extension: .jsonl .ndjson -> jsonl, .txt -> text, .json -> json (case
 *          does not matter); otherwise by content: a first non-space character '[' or
 *          '{' means JSON, or JSON Lines when the first line is a complete value
 *          followed by more values; any other first character means text.
 *
 * A row is (precedence from top to bottom; the first rule that applies wins):
 *   1. a string: a prompt without a response;
 *   2. an object with "messages" (list of {role, content}) or, else, "conversations"
 *      (ShareGPT: list of {from, value}); each message's role is read from "role" else
 *      "from", its text from "content" else "value".  Roles user/human, assistant/gpt
 *      and system count; other roles (tool, function, ...) are ignored.  Content is a
 *      string, null (empty) or a list of parts whose "text" members of parts with
 *      "type": "text" are concatenated.  Every assistant message with non-empty
 *      content that is not only white space (Python's str.strip()), paired with the
 *      nearest preceding user message when that one is not empty, is one sample (the
 *      tool's _load_hf: an empty nearest user turn loses the pair, nothing further
 *      back is looked at); its system is the nearest preceding system message, else
 *      the row's "system" key.  A row that gives no pair but whose last user message
 *      is not empty gives one prompt-only sample (that message), so user-only chat
 *      rows work as prompts; any other row (no user message, or an empty one) is
 *      skipped.
 *   3. any other object: columns.  Prompt = the first key present (null or not, as
 *      the tool's nested item.get) of: prompt user_message input question text
 *      instruction; the row is skipped when its value is null or "" (the tool's
 *      `if p:`).  Response = the first key present of: response completion output
 *      answer target (none, or null: NULL).  An optional string "system" key becomes
 *      the sample's system.
 * (The reference's JSON-object key lists, prompt/user_message/input/question and
 * response/completion/output, are prefixes of these merged lists, in the same order.)
 * Skipped rows are counted in ds->skipped (bk-tokenize reports them).  Texts are kept
 * byte for byte as JSON decodes them; an empty response is kept as "" (bk-tokenize
 * drops a paired sample whose response is empty or only white space, as the tool's
 * trainer does).  The dataset is paired iff at least one response is non-empty.
 *
 * Errors die() with one line naming the file ("-" is shown as "stdin"), the place and
 * the key: "data.jsonl: line 7: key 'prompt' is not a string", "data.json: record 3:
 * no prompt key (tried prompt, ...)", "x.json: line 2: column 5: <jansson's message>",
 * "a.txt: line 4: invalid utf-8", "data.json: no samples".  Records count from 1
 * (the first element of the list is record 1); lines count from 1. */
#ifndef BK_INPUTS_H
#define BK_INPUTS_H

#include <stddef.h>

typedef struct {
	char *prompt;   /* never NULL */
	char *response; /* NULL when the row has none */
	char *system;   /* per-row system message when the row carries one, else NULL */
} bk_sample;

typedef struct {
	bk_sample *v;
	size_t n, cap;
	int paired;     /* 1 iff at least one response is non-empty */
	size_t skipped; /* rows skipped by the rules above (null/empty prompt, no pair) */
} bk_dataset;

/* Python's `not s.strip()`: s is empty or only white space (str.isspace). */
int bk_text_blank(const char *s);

typedef enum { BK_FMT_AUTO, BK_FMT_JSON, BK_FMT_JSONL, BK_FMT_TEXT } bk_input_format;

/* "auto" "json" "jsonl" (also "ndjson") "text"; die()s (exit 1) on anything else. */
bk_input_format bk_input_format_parse(const char *name);
const char *bk_input_format_name(bk_input_format f);

/* Load a whole data file ("-" = stdin), appending its samples to ds (a zeroed ds
 * starts empty).  Dies on any error; a file that yields no sample is an error. */
void bk_dataset_load(bk_dataset *ds, const char *path, bk_input_format fmt);
/* The same from memory; name is used in messages and, in auto mode, for the
 * extension.  buf need not be NUL-terminated. */
void bk_dataset_parse(bk_dataset *ds, const char *name, const char *buf, size_t len,
		      bk_input_format fmt);
/* Append one sample (strings are copied; response and system may be NULL), e.g. for
 * an inline training_prompts list; updates ds->paired. */
void bk_dataset_add(bk_dataset *ds, const char *prompt, const char *response,
		    const char *system);
void bk_dataset_free(bk_dataset *ds); /* frees every string; leaves ds zeroed */

/* Rows from other sources (hub datasets: formats/hubdata.c).  A row is a jansson
 * value (struct json_t); the rules above apply, and messages name the row as
 * "NAME: UNIT NO" (e.g. "Org/Name: data/train-00000-of-00001.parquet: row 7"). */
struct json_t;
void bk_dataset_add_row(bk_dataset *ds, const char *name, const char *unit, size_t no,
			struct json_t *row);

/* A hub dataset's rows as the tool's _load_hf reads them: the columns are chosen once,
 * from the dataset's column names, by presence: "messages" (chat rows, rule 2), else
 * the first of prompt input question text instruction and the first of response
 * completion output answer target (none: prompts only).  A row whose prompt is null
 * or "" (or absent) is skipped; a null response is none. */
typedef struct {
	int messages;
	const char *prompt, *response; /* static strings; response may be NULL */
} bk_row_columns;
/* 0, or -1 when there is neither messages nor a prompt column */
int bk_row_columns_pick(const char *const *names, size_t n, bk_row_columns *out);
const char *bk_row_columns_tried(void); /* "prompt, input, ..." for messages */
void bk_dataset_add_hub_row(bk_dataset *ds, const char *name, const char *unit, size_t no,
			    const bk_row_columns *cols, struct json_t *row);
/* The rows of a JSON document (a list, or a list under a wrapper key as above) or, for a
 * .jsonl/.ndjson name or a document of one value per line, of JSON Lines, as a new
 * jansson array; dies naming name and the line on bad JSON. */
struct json_t *bk_dataset_json_rows(const char *name, const char *buf, size_t len);

/* The default knowledge-base preamble used when a corpus comes without a template. */
#define BK_DEFAULT_SYSTEM_TEMPLATE                                             \
	"You are a helpful assistant with the following knowledge base:\n\n"   \
	"{corpus}\n\n"                                                         \
	"Use this knowledge to answer questions accurately."

/* The system prompt from at most one of three sources (NULL = not given):
 *   system         the text itself (--system), kept exactly;
 *   system_file    a UTF-8 file (--system-file), kept exactly except that trailing
 *                  newlines ("\n", "\r\n") at its end are removed;
 *   corpus_file    a knowledge corpus (--corpus) rendered by corpus_format
 *                  (--corpus-format; NULL means "text"):
 *                    papers  JSON list of {title, abstract} (strings) rendered
 *                            "Paper N: title\nabstract", N from 1, joined by "\n\n";
 *                    text    the file as is (trailing newlines removed);
 *                    list    JSON list of strings joined by "\n\n";
 *                    json or any other name: the JSON pretty-printed by jansson with
 *                            JSON_INDENT(2), non-ASCII kept as UTF-8, key order kept;
 *                  then placed into system_template_file (--system-template, a UTF-8
 *                  file, trailing newlines removed) at every "{corpus}", or into
 *                  BK_DEFAULT_SYSTEM_TEMPLATE when no template is given.
 * Returns a malloc'd string, or NULL when no source is given.  Dies when two sources
 * are given, when a template or a corpus format comes without a corpus, when the
 * template has no "{corpus}", on unreadable/invalid files, or on an empty result. */
/* A whole UTF-8 text file ("-" = stdin) without its BOM: dies naming the file and line
 * on a NUL byte or invalid UTF-8 (text with a NUL cannot reach a tokenizer whole). */
char *bk_read_text(const char *path);

char *bk_system_prompt(const char *system, const char *system_file, const char *corpus_file,
		       const char *corpus_format, const char *system_template_file);

#endif
