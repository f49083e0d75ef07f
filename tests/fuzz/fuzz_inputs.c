/* fuzz_inputs.c - libFuzzer target for the training-data parsers (formats/inputs.c).
 * The first byte picks the format and the name (so auto mode sees an extension or
 * sniffs the content); the rest is the file.  A die() (bad data) ends the run through
 * bk_die_hook; a crash, a sanitizer report or a broken promise of inputs.h (abort) is
 * a finding.  Not the system-prompt sources: those read files by path. */
#include "formats/inputs.h"
#include "tests/fuzz/reclaim.h"

#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	bk_diag_init("fuzz_inputs");
	reclaim_init();
	return 0;
}

static const struct {
	bk_input_format fmt;
	const char *name;
} modes[8] = {
	{BK_FMT_AUTO, "data"},        /* sniffed from the content */
	{BK_FMT_JSON, "data"},        {BK_FMT_JSONL, "data"},       {BK_FMT_TEXT, "data"},
	{BK_FMT_AUTO, "d/data.JSONL"}, {BK_FMT_AUTO, "data.ndjson"},
	{BK_FMT_AUTO, "data.txt"},    {BK_FMT_AUTO, "x.y/data.json"},
};

/* Strict UTF-8 (no overlongs, surrogates or code points past U+10FFFF). */
static int utf8_valid(const unsigned char *s)
{
	while (*s) {
		unsigned c = *s++;
		int more;
		unsigned cp, min;
		if (c < 0x80)
			continue;
		else if ((c & 0xe0) == 0xc0)
			more = 1, cp = c & 0x1f, min = 0x80;
		else if ((c & 0xf0) == 0xe0)
			more = 2, cp = c & 0x0f, min = 0x800;
		else if ((c & 0xf8) == 0xf0)
			more = 3, cp = c & 0x07, min = 0x10000;
		else
			return 0;
		for (int i = 0; i < more; i++, s++) {
			if ((*s & 0xc0) != 0x80)
				return 0;
			cp = cp << 6 | (*s & 0x3f);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return 0;
	}
	return 1;
}

/* The promises of inputs.h about a dataset that loaded. */
static void check_dataset(const bk_dataset *ds)
{
	int paired = 0;
	if (ds->n == 0)
		abort(); /* "a file that yields no sample is an error" */
	for (size_t i = 0; i < ds->n; i++) {
		const bk_sample *s = &ds->v[i];
		if (!s->prompt) /* "never NULL" */
			abort();
		if (!utf8_valid((const unsigned char *)s->prompt) ||
		    (s->response && !utf8_valid((const unsigned char *)s->response)) ||
		    (s->system && !utf8_valid((const unsigned char *)s->system)))
			abort();
		if (s->response && *s->response)
			paired = 1;
	}
	if (paired != ds->paired) /* "paired iff at least one response is non-empty" */
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	unsigned mode = data[0] & 7u;
	size_t len = size - 1;
	/* exactly len bytes, no NUL after them: "buf need not be NUL-terminated" */
	char *buf = malloc(len ? len : 1);
	if (!buf)
		return 0;
	memcpy(buf, data + 1, len);
	static bk_dataset ds; /* static: still consistent after a longjmp out of a parse */
	reclaim_begin();
	if (setjmp(reclaim_jmp) == 0) {
		bk_dataset_parse(&ds, modes[mode].name, buf, len, modes[mode].fmt);
		check_dataset(&ds);
		bk_dataset_free(&ds);
		reclaim_end(0);
	} else {
		reclaim_end(1); /* frees ds's strings and array too */
		memset(&ds, 0, sizeof ds);
	}
	free(buf);
	return 0;
}
