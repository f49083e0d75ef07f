/* qa.h - evaluation Q&A files and the reference tool's keyword scoring.
 * A file is a JSON list (or an object wrapping one under the first present key of
 * evaluation_samples test_samples eval qa_pairs) of {question|input, answer|expected|
 * target}, where an answer is a string or a list of accepted strings.  JSON Lines of
 * such objects work too.  Not generation (gpu/gen.h) and not the report (bk-eval). */
#ifndef BK_QA_H
#define BK_QA_H

#include <stddef.h>

typedef struct {
	char *question;
	char **answers; /* n_answers accepted keywords */
	size_t n_answers;
} bk_qa;

typedef struct {
	bk_qa *v;
	size_t n;
} bk_qa_set;

/* Dies naming the file, record and key on bad input; an empty set is an error. */
void bk_qa_load(bk_qa_set *set, const char *path);
void bk_qa_free(bk_qa_set *set);

/* The reference's scoring: remove <think>...</think> blocks (and an unclosed <think>
 * to the end), lower-case (ASCII), correct iff some answer (lower-cased) is a
 * substring.  An empty answer never matches. */
int bk_qa_correct(const char *generated, const bk_qa *qa);
/* The cleaned text as scored (malloc'd): think blocks removed, lower-cased. */
char *bk_qa_clean(const char *generated);

#endif
