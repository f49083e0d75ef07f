/* hubdata.h - training data from a Hugging Face hub dataset, as the `datasets` library
 * reads it: the split syntax ("train_sft[:1000]"), the files of a split in the repo's
 * layout, and their rows (parquet through parquet.h, JSON / JSON Lines) into a
 * bk_dataset by the row rules of inputs.h.  The repo comes from the HF cache or is
 * downloaded into it (hub.h).  Not a loader of datasets with scripts.
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
 * Split files, as datasets' data_files.py picks them in a repo without a README
 * `configs:` section (datasets 5.2.0; tests/golden/hubdata/split_files.json):
 *   - left out first: hidden paths (a part starting with "."), directories starting
 *     with "__", README.md config.json dataset_info(s).json dummy_data.zip
 *     dataset_dict.json;
 *   - when any file is data/NAME-DDDDD-of-DDDDD*.* the repo is sharded by split
 *     (SPLIT_PATTERN_SHARDED): its splits are those NAMEs, split S its files;
 *   - else the first pattern group that matches a file gives the splits: NAME.eval
 *     (logs), task.toml / instruction.md (test), directories named after a split,
 *     file names with a split's name, every file (train).  A name "has" keyword K
 *     when K is the whole name (directories only) or K is at its start or after one
 *     of "-._ 0123456789", and at its end (directories only) or followed by one of
 *     them.  Keywords: train training / validation valid dev val / test testing eval
 *     evaluation; other split names exist only in sharded repos;
 *   - a split's files: pattern by pattern (per keyword, in the order above), each
 *     pattern's matches sorted, repeats kept, only names with a datasets data-file
 *     extension (any dot part of the name; .csv .txt .jsonl.gz ... count and are
 *     refused by the reader: bakery reads .parquet .jsonl .ndjson .json).
 * The rows of a split are the concatenation of its files' rows.
 *
 * README configs (datasets 5.2.0 load.py / utils/metadata.py; the README cases of
 * split_files.json): README.md's YAML front matter (huggingface_hub's block: blanks,
 * "---", a line end, the YAML, a line end, "---"), read by libyaml with PyYAML's
 * implicit types, must be a mapping.  A non-empty `configs:` is a list of mappings,
 * each with config_name, and optional data_files, data_dir, default.  data_files is
 * a string or a list of strings (split train), or a list of {split, path} (path a
 * string or a list of them; split names \w+(.\w+)*, each once); null in the first
 * config is refused.  Every config is checked, and one without data_files must have
 * data files by the default patterns (under its data_dir).  The config read: the one
 * named, else the only one, the one named "default" or with a true `default` (two are
 * refused), else the one config a README `dataset_info` describes; else refused (the
 * tool cannot name a config).  Its files: without data_files the default patterns
 * under data_dir; else, split by split (all are resolved: a path without wildcards
 * that matches no data file is refused anywhere), each pattern relative to data_dir
 * as fsspec's glob takes it ('*' one name, '**' alone any number of names, else
 * fnmatch within a name; '**' inside a name refused), matches sorted, repeats kept,
 * data-file extensions only, a hidden or "__" part only when the pattern has as many,
 * README.md and the other FILES_TO_IGNORE only when the pattern's last part names
 * them.  A split the data_files does not list is refused.  Not modelled: datasets'
 * choice of a builder from the first config's files (it refuses a first config whose
 * splits infer different formats, or one split without files), .huggingface.yaml,
 * the legacy dataset_infos.json, Python's literal '^' in "[^...]".
 *
 * Rows: the columns the tool reads of a hub dataset (bakery-py's _load_hf): chosen
 * once from the first file read (a parquet schema, the keys of a JSON file's rows):
 * messages (user/assistant pairs), else the first of prompt input question text
 * instruction present, with the first of response completion output answer target;
 * then inputs.h's bk_dataset_add_hub_row (a null or empty prompt skips the row).  A
 * row's system column, conversations, user_message and the system messages of a chat
 * are not read (the tool reads them in local files only, or never).
 *
 * Offline (bk_hub_offline(BK_HUB_DATASET)) or with the hub out of reach, a hub
 * dataset is read from its cached snapshot with the split files that the listing
 * recorded by the last online read (hub.h) gives; files the rows asked for that are
 * not there are named in one line, and no listing at all is refused. */
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

/* The repo paths of split `split` among paths[0..n), in datasets' order (malloc'd
 * strings in a malloc'd array, *nout of them; NULL when none).  *names gets the
 * repo's split names ("a, b, c", malloc'd; NULL when it has none) for messages. */
char **bk_split_files(const char *const *paths, size_t n, const char *split, size_t *nout,
		      char **names);

/* The same, as datasets.load_dataset(repo) / load_dataset(repo, config) picks them when
 * the repo's README.md (readme, len bytes; NULL: the repo has none) has YAML front
 * matter with a `configs:` section (see README configs above); without one, exactly
 * bk_split_files.  0 with *files (*nf of them; none when the split matches no file, or
 * the split is unknown to datasets' default patterns) and *names; -1 with a one-line
 * reason in err naming README.md and the field (malformed front matter, a configs
 * entry datasets refuses, no default config, a data_files pattern without wildcards
 * that matches no file, a split the chosen config's data_files does not list). */
int bk_split_files_card(const char *readme, size_t len, const char *config,
			const char *const *paths, size_t n, const char *split, char ***files,
			size_t *nf, char **names, char *err, size_t errlen);

/* Does a data argument that is no local path name a hub dataset?  Org/Name as
 * bk_hub_is_id takes it, with the Org part (a missing "train.jsonl" or
 * "data/x.parquet" is a missing file, not a repo: no data-file extension either). */
int bk_hub_dataset_id(const char *s);

/* Appends the rows of spec from the dataset files under dir (a snapshot directory or
 * any local directory laid out as a hub repo) to ds.  what names the dataset in
 * messages.  Dies on an unknown split, a bad spec, a bad file or row. */
void bk_dataset_load_dir(bk_dataset *ds, const char *what, const char *dir, const char *spec);
/* The same for a hub id: the HF cache's snapshot of repo id at revision (NULL: main),
 * with the split's files downloaded first when online (see Offline above). */
void bk_dataset_load_hub(bk_dataset *ds, const char *id, const char *revision,
			 const char *spec);

#endif
