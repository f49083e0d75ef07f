/* hubdata.h - training data from a Hugging Face hub dataset, as the `datasets` library
 * reads it: the split syntax ("train_sft[:1000]"), the files of a split in the repo's
 * layout, and their rows (parquet through parquet.h, JSON / JSON Lines) into a
 * bk_dataset by the row rules of inputs.h.  The repo comes from the HF cache or is
 * downloaded into it (hub.h).  Not a loader of datasets with scripts, not the README's
 * `configs:` YAML (the default layouts below only).
 *
 * Split specs (datasets' ReadInstruction.from_spec): PART ("+" PART)*, blanks allowed
 * around "+"; PART = NAME ("[" [FROM] ":" [TO] "]")? ("(" ROUNDING ")")?, NAME =
 * \w+(\.\w+)*, FROM/TO = -?digits (single '_' between digits allowed) with an optional
 * "%", ROUNDING = closest (the default) or pct1_dropremainder (percent slices only).
 * Bounds over a split of n rows: percent p -> round(p * n / 100.0) (Python's round: half
 * to even), or p * trunc(n / 100.0) with pct1_dropremainder (refused when n < 100);
 * a negative bound counts from the end (n + b, at least 0); both are then capped at n;
 * FROM >= TO selects nothing.  |percent| over 100 is refused.
 *
 * Split files (repo paths, data files only: .parquet .jsonl .ndjson .json):
 *   - when any file is named data/NAME-DDDDD-of-DDDDD*, the repo is sharded by split
 *     (datasets' SPLIT_PATTERN_SHARDED) and split S is exactly data/S-DDDDD-of-DDDDD*;
 *   - otherwise the files with a directory named S in their path, or whose file name
 *     has S at its start or after one of "-._ 0123456789" and followed by one of them
 *     (datasets' default split patterns, for any split name).
 * Files are read in sorted path order; the rows of a split are their concatenation.
 *
 * Rows: the columns the tool reads of a hub dataset (bakery-py's _load_hf), through the
 * row rules of inputs.h: messages (user/assistant pairs), else the first non-null of
 * prompt input question text instruction, with response completion output answer
 * target.  A row's system column, conversations, user_message and the system messages
 * of a chat are not read (the tool reads them in local files only, or never). */
#ifndef BK_HUBDATA_H
#define BK_HUBDATA_H

#include "formats/inputs.h"

#include <stddef.h>
#include <stdint.h>

enum { BK_ROUND_CLOSEST, BK_ROUND_PCT1 };

typedef struct {
	char *split;
	int has_from, has_to, pct, rounding;
	int64_t from, to;
} bk_split_part;

typedef struct {
	bk_split_part *v;
	size_t n;
} bk_split_spec;

/* 0, or -1 with a one-line reason in err (the spec is not quoted there). */
int bk_split_parse(const char *spec, bk_split_spec *out, char *err, size_t errlen);
void bk_split_free(bk_split_spec *s);
/* [*from, *to) of part p over n rows; -1 with a reason in err (pct1 under 100 rows). */
int bk_split_bounds(const bk_split_part *p, int64_t n, int64_t *from, int64_t *to, char *err,
		    size_t errlen);

/* The repo paths of split `split` among paths[0..n) (sorted, malloc'd strings in a
 * malloc'd array, *nout of them; NULL when none).  When the repo is sharded by split,
 * *names gets the split names found ("a, b, c", malloc'd; else NULL) for messages. */
char **bk_split_files(const char *const *paths, size_t n, const char *split, size_t *nout,
		      char **names);

/* Does a data argument that is no local path name a hub dataset?  Org/Name as
 * bk_hub_is_id takes it, with the Org part (a missing "train.jsonl" or
 * "data/x.parquet" is a missing file, not a repo: no data-file extension either). */
int bk_hub_dataset_id(const char *s);

/* Appends the rows of spec from the dataset files under dir (a snapshot directory or
 * any local directory laid out as a hub repo) to ds.  what names the dataset in
 * messages.  Dies on an unknown split, a bad spec, a bad file or row. */
void bk_dataset_load_dir(bk_dataset *ds, const char *what, const char *dir, const char *spec);
/* The same for a hub id: the HF cache's snapshot of repo id at revision (NULL: main),
 * with the split's files downloaded first unless HF_HUB_OFFLINE is set. */
void bk_dataset_load_hub(bk_dataset *ds, const char *id, const char *revision,
			 const char *spec);

#endif
