/* hub.h - the Hugging Face hub through its shared cache, laid out as huggingface_hub
 * lays it out, so a model transformers downloaded is used offline with no copy and one
 * bakery downloaded is found by transformers.  Downloads with libcurl.  Not an
 * uploader, not a git client; only the resolve/ and api/ endpoints huggingface_hub uses.
 *
 * The cache (CACHE = HF_HUB_CACHE, else HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub):
 *   CACHE/models--Org--Name/            (datasets--Org--Name for datasets)
 *     refs/REVISION                     the 40-hex commit, no newline
 *     blobs/ETAG                        a file's bytes, named by its unquoted etag
 *                                       (git sha1, or sha256 for LFS files)
 *     snapshots/COMMIT/FILE             relative symlink -> ../../blobs/ETAG
 *     .no_exist/COMMIT/FILE             empty: the hub has no such (optional) file
 *     .bakery-listing/COMMIT.json       bakery's own: the files of COMMIT as the hub
 *                                       listed them (written by every listing), so a
 *                                       read offline knows what the whole snapshot holds
 *   CACHE/.locks/models--Org--Name/ETAG.lock   held while ETAG is downloaded
 * Invariants: a blob is renamed into place only whole and checked (sha256 against an
 * LFS etag, git's blob sha1 against a small file's etag); a snapshot link is made only
 * after its blob is in place; refs are written with a temp name and rename.
 *
 * Environment, as huggingface_hub reads it: HF_ENDPOINT (default https://huggingface.co),
 * HF_TOKEN, else the token file (HF_TOKEN_PATH, else HF_HOME/token), HF_HUB_CACHE,
 * HF_HOME, XDG_CACHE_HOME, and offline mode (cache only): HF_HUB_OFFLINE, else (when it
 * is unset or empty) TRANSFORMERS_OFFLINE, true when 1, true, yes or on in any case
 * (huggingface_hub's constants.py); for datasets also HF_DATASETS_OFFLINE (datasets'
 * config.py; a false value of it does not undo the other two, as huggingface_hub
 * would refuse the requests anyway).  Every failure dies with one line
 * (gated or private: the page where the licence is accepted and HF_TOKEN; unknown repo,
 * revision or file; no network; disk full). */
#ifndef BK_HUB_H
#define BK_HUB_H

#include <stddef.h>
#include <stdint.h>

typedef enum { BK_HUB_MODEL, BK_HUB_DATASET } bk_hub_kind;

/* "Org/Name" (or "Name"): letters, digits, '-', '_', '.'; no "..", not "./x" or "~/x".
 * Callers check for a local path first (a directory of that name wins). */
int bk_hub_is_id(const char *s);
/* The cache root (malloc'd), from the environment as above. */
char *bk_hub_cache_dir(void);
/* Offline for a kind of repo, as above: the variable that makes it so, or NULL. */
const char *bk_hub_offline_var(bk_hub_kind kind);
int bk_hub_offline(bk_hub_kind kind);

typedef struct {
	char *path;   /* the repo path ("data/train-00000-of-00001.parquet") */
	int64_t size; /* bytes, -1 when the hub did not say */
} bk_hub_entry;

typedef struct {
	char *commit; /* 40 hex: what revision pointed to */
	bk_hub_entry *v;
	size_t n;
} bk_hub_listing;

/* The files of a repo at revision (NULL: "main"): GET
 * {HF_ENDPOINT}/api/{models,datasets}/ID/revision/REV.  Writes refs/REVISION.  Needs the
 * network: dies offline (HF_HUB_OFFLINE or no connection) and on any hub error. */
void bk_hub_list(bk_hub_kind kind, const char *id, const char *revision, bk_hub_listing *out);
/* The same, but -1 (and *why, malloc'd) when offline or the hub cannot be reached. */
int bk_hub_list_try(bk_hub_kind kind, const char *id, const char *revision,
		    bk_hub_listing *out, char **why);
/* The listing recorded in the cache for the commit revision points to: 0 with *out
 * filled; -1 when there is none (out->commit is then the cached commit, or NULL when
 * the cache does not know revision).  Free *out either way. */
int bk_hub_listing_cached(bk_hub_kind kind, const char *id, const char *revision,
			  bk_hub_listing *out);
void bk_hub_listing_free(bk_hub_listing *l);
/* CACHE/{models,datasets}--Org--Name/snapshots/COMMIT (malloc'd; may not exist). */
char *bk_hub_snapshot_dir(bk_hub_kind kind, const char *id, const char *commit);

/* One file of the repo at revision: its path in the snapshot (malloc'd), downloaded
 * first when the cache does not have it (HEAD on resolve/, then the bytes, from the
 * CDN the hub redirects to for LFS files).  Offline (or no connection): from the cache
 * only.  optional: NULL when the hub has no such file (.no_exist is written and read);
 * otherwise that dies.  The bytes are capped at the size HEAD announced (a transfer
 * that grows past it is stopped, the partial file removed); only a 200 or 206 body is
 * written to the partial file (blobs/ETAG.incomplete): any other answer leaves it as it
 * was and dies naming the URL (no query) and the status. */
char *bk_hub_file(bk_hub_kind kind, const char *id, const char *revision, const char *file,
		  int optional);

/* The same, for a file of listing l (bk_hub_list): the size l gives it (when it gives
 * one) caps the download: an answer that announces more is refused before downloading,
 * and the transfer stops at that size; without one, the size HEAD announced. */
char *bk_hub_file_listed(bk_hub_kind kind, const char *id, const char *revision,
			 const char *file, int optional, const bk_hub_listing *l);

/* The snapshot directory (malloc'd) of the repo at revision, holding at least every
 * file whose repo path matches one of patterns (NULL-terminated, Python fnmatch as
 * huggingface_hub's allow_patterns: '*' also matches '/'; NULL patterns: every file).
 * Online: lists the repo and downloads what is missing.  Offline or with no connection:
 * the snapshot refs/REVISION points to, as it is; dies when there is none. */
char *bk_hub_snapshot(bk_hub_kind kind, const char *id, const char *revision,
		      const char *const *patterns);

/* For --model and model_name_or_path, as transformers resolves them: a local directory
 * as it is (a malloc'd copy), else a hub id's snapshot with the files a bake reads
 * (config and generation config, tokenizer files, chat template, *.safetensors and
 * their index; never .bin or .pth).  Dies naming arg when it is neither. */
char *bk_hub_model_dir(const char *arg, const char *revision);

/* SHA-256 / SHA-1 of a file as lowercase hex (65 / 41 bytes with the NUL); git's blob
 * sha1 ("blob SIZE\0" then the bytes) when git_blob.  -1 when it cannot be read. */
int bk_sha256_file(const char *path, char out[65]);
int bk_sha1_file(const char *path, int git_blob, char out[41]);

#endif
