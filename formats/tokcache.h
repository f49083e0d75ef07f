/* tokcache.h - content-addressed cache of tokenized samples for bk-tokenize.
 * Key: XXH3-64 of (tokenizer file hash, template, system, user, response).  Value:
 * the teacher prompt, student prompt and response ids.  One file per tokenizer under
 * $XDG_CACHE_HOME/bakery (else ~/.cache/bakery); loaded whole at open, rewritten
 * atomically at close, so a crash never leaves a torn cache.  Close merges under a
 * lock (PATH.lock): the entries of runs that closed meanwhile are kept, so concurrent
 * runs sharing a cache (make -j) lose none.
 * A damaged cache file is reported once and ignored (it is only a cache); every entry
 * carries a checksum, and a damaged entry is dropped, reported once and rebuilt. */
#ifndef BK_TOKCACHE_H
#define BK_TOKCACHE_H

#include <stddef.h>
#include <stdint.h>

typedef struct bk_tokcache bk_tokcache;

typedef struct {
	const int32_t *t, *s, *r; /* point into the cache; valid until close */
	size_t nt, ns, nr;
	int has_resp;
} bk_tokcache_entry;

/* NULL (after one warning) when the cache directory cannot be made: run without it. */
bk_tokcache *bk_tokcache_open(uint64_t tokenizer_hash);
uint64_t bk_tokcache_key(uint64_t tokenizer_hash, const char *tmpl, const char *system,
			 const char *user, const char *response);
int bk_tokcache_get(const bk_tokcache *c, uint64_t key, bk_tokcache_entry *e);
void bk_tokcache_put(bk_tokcache *c, uint64_t key, const bk_tokcache_entry *e);
/* Writes the file if anything was added; frees c.  Returns entries added. */
size_t bk_tokcache_close(bk_tokcache *c);
const char *bk_tokcache_path(const bk_tokcache *c);

#endif
