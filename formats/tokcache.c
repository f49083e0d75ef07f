/* tokcache.c - see tokcache.h.
 * File layout (little-endian): "BKTOKC03", u64 tokenizer hash, u64 entry count, then
 * per entry: u64 key, u32 nt, u32 ns, u32 nr, u32 has_resp, u64 check, i32 ids[nt + ns
 * + nr]; check is XXH3-64 of the entry's other bytes (key, counts, ids), so a damaged
 * entry is found and dropped (the run that needs it tokenizes it again and puts it back).
 * In memory: the entries back to back in one buffer (the loaded file body plus new
 * entries) and an open-addressing table key -> offset.
 * Concurrency: runs that share a cache (make -j) merge on write.  Close takes an
 * exclusive flock on PATH.lock, reads the file as it is now (other runs may have
 * written since this one loaded it), adds its entries that this run lacks, and writes
 * the union (temporary + rename) before unlocking; so no run's entries are lost.
 * Readers never lock: rename makes every file they open complete. */
#include "tokcache.h"
#include "common/diag.h"
#include "common/files.h"
#include "common/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <string.h>
#include <xxhash.h>

#define MAGIC "BKTOKC03" /* 02: keys carry BK_TOKCACHE_CODE (below); 03: entry checks */
#define HDR 24
#define ENT 32
#define CHK 24 /* offset of the entry's check */

struct bk_tokcache {
	char *path;
	uint64_t tok_hash;
	char *buf; /* entries */
	size_t len, cap;
	size_t *slot; /* offset + 1; 0 = empty */
	size_t nslot, count, added;
	size_t dropped; /* damaged entries left out at load: the file is rewritten */
};

static uint64_t rd64(const char *p)
{
	uint64_t v;
	memcpy(&v, p, 8);
	return v;
}
static uint32_t rd32(const char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

/* the check of the entry at p with tot ids: its bytes but the check itself */
static uint64_t entry_check(const char *p, uint64_t tot)
{
	return XXH3_64bits_withSeed(p + ENT, 4 * (size_t)tot, XXH3_64bits(p, CHK));
}

static void table_insert(bk_tokcache *c, uint64_t key, size_t off);

static void table_grow(bk_tokcache *c)
{
	size_t old = c->nslot;
	size_t *os = c->slot;
	c->nslot = old ? old * 2 : 1024;
	c->slot = xcalloc(c->nslot, sizeof *c->slot);
	c->count = 0;
	for (size_t i = 0; i < old; i++)
		if (os[i])
			table_insert(c, rd64(c->buf + os[i] - 1), os[i] - 1);
	free(os);
}

static void table_insert(bk_tokcache *c, uint64_t key, size_t off)
{
	if ((c->count + 1) * 2 > c->nslot)
		table_grow(c);
	size_t i = (size_t)(key & (c->nslot - 1));
	while (c->slot[i]) {
		if (rd64(c->buf + c->slot[i] - 1) == key) {
			c->slot[i] = off + 1;
			return;
		}
		i = (i + 1) & (c->nslot - 1);
	}
	c->slot[i] = off + 1;
	c->count++;
}

/* raw append of one entry (no "added" count): an entry read from a file */
static void append_entry(bk_tokcache *c, const char *p, size_t need)
{
	if (c->len + need > c->cap) {
		c->cap = (c->len + need) * 2;
		c->buf = xrealloc(c->buf, c->cap);
	}
	memcpy(c->buf + c->len, p, need);
	table_insert(c, rd64(p), c->len);
	c->len += need;
}

/* Walks a body of n entries: returns 0 if its framing is damaged (counts that overrun
 * the body, a wrong entry count), else 1, with *bad the entries whose check fails.
 * With keep, the good entries are appended to c (those c has already are skipped). */
static int scan_body(bk_tokcache *c, const char *body, size_t blen, uint64_t n, int keep,
		     size_t *bad)
{
	size_t off = 0;
	*bad = 0;
	for (uint64_t k = 0; k < n; k++) {
		if (blen - off < ENT)
			return 0;
		uint64_t tot = (uint64_t)rd32(body + off + 8) + rd32(body + off + 12) +
			       rd32(body + off + 16);
		if (tot > (blen - off - ENT) / 4)
			return 0;
		off += ENT + 4 * (size_t)tot;
	}
	if (off != blen)
		return 0;
	for (off = 0; off < blen;) {
		const char *p = body + off;
		uint64_t tot = (uint64_t)rd32(p + 8) + rd32(p + 12) + rd32(p + 16);
		size_t need = ENT + 4 * (size_t)tot;
		off += need;
		if (entry_check(p, tot) != rd64(p + CHK)) {
			(*bad)++;
			continue;
		}
		bk_tokcache_entry e;
		if (keep && !bk_tokcache_get(c, rd64(p), &e))
			append_entry(c, p, need);
	}
	return 1;
}

/* Version of the code that turns texts into ids (templates, the sentencepiece shim, the
 * BPE of tokenizer.json): part of every key, so a change of that code never serves ids
 * made by the old one.  Bump it with any change to formats/template.c, formats/spm.cc,
 * formats/bpe.c or formats/tokenizer.c that changes ids.  (The template part of a key is
 * bk_template_variant(): qwen3's thinking mode and the Llama-3.x date are in it.) */
#define BK_TOKCACHE_CODE "bakery-0.1.0/templates-3/bpe-1" /* 3: spm add_bos_token */

/* mkdir -p that reports failure instead of dying (it is only a cache) */
static int try_mkdir_p(const char *path)
{
	char *p = xstrdup(path);
	int ok = 1;
	for (char *s = p + 1; ok && *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		ok = mkdir(p, 0777) == 0 || errno == EEXIST;
		*s = '/';
	}
	ok = ok && (mkdir(p, 0777) == 0 || errno == EEXIST);
	free(p);
	return ok;
}

bk_tokcache *bk_tokcache_open(uint64_t tokenizer_hash)
{
	bk_tokcache *c = xcalloc(1, sizeof *c);
	c->tok_hash = tokenizer_hash;
	const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	char *dir = xdg && *xdg ? xasprintf("%s/bakery", xdg)
				: xasprintf("%s/.cache/bakery", home && *home ? home : "/tmp");
	if (!try_mkdir_p(dir)) {
		warn("cache directory %s: %s; tokenizing without the cache", dir, strerror(errno));
		free(dir);
		free(c);
		return NULL;
	}
	char hex[17];
	bk_hash_hex(tokenizer_hash, hex);
	c->path = xasprintf("%s/tokenize-%s.cache", dir, hex);
	free(dir);
	table_grow(c);
	size_t flen;
	char *file = bk_try_read_file(c->path, &flen);
	if (!file)
		return c; /* no cache yet */
	if (flen >= 8 && !memcmp(file, MAGIC, 6) && memcmp(file, MAGIC, 8)) {
		/* BKTOKC01/02: another version of this code; replaced at close */
		warn("%s: a cache of another bakery version (%.8s); rebuilding it", c->path, file);
		c->dropped = 1;
		free(file);
		return c;
	}
	if (flen < HDR || memcmp(file, MAGIC, 8) || rd64(file + 8) != tokenizer_hash) {
		warn("%s: not a cache for this tokenizer; ignoring it", c->path);
		free(file);
		return c;
	}
	size_t bad;
	c->cap = flen - HDR + 1;
	c->buf = xmalloc(c->cap);
	if (!scan_body(c, file + HDR, flen - HDR, rd64(file + 16), 1, &bad)) {
		warn("%s: damaged cache file; ignoring it", c->path);
		free(c->slot);
		c->slot = NULL;
		c->nslot = c->count = 0;
		c->len = 0;
		table_grow(c);
		c->dropped = 1;
	} else if (bad) {
		warn("%s: %zu damaged entr%s dropped (failed checksum); tokenizing %s again",
		     c->path, bad, bad == 1 ? "y" : "ies", bad == 1 ? "it" : "them");
		c->dropped = bad;
	}
	free(file);
	return c;
}

uint64_t bk_tokcache_key(uint64_t tokenizer_hash, const char *tmpl, const char *system,
			 const char *user, const char *response)
{
	XXH3_state_t *st = XXH3_createState();
	if (!st)
		die("out of memory");
	XXH3_64bits_reset_withSeed(st, tokenizer_hash);
	XXH3_64bits_update(st, BK_TOKCACHE_CODE, sizeof BK_TOKCACHE_CODE);
	const char *parts[4] = {tmpl, system, user, response};
	for (int i = 0; i < 4; i++) {
		/* a presence byte and the length make the encoding unambiguous */
		uint8_t present = parts[i] != NULL;
		uint64_t len = parts[i] ? strlen(parts[i]) : 0;
		XXH3_64bits_update(st, &present, 1);
		XXH3_64bits_update(st, &len, 8);
		if (parts[i])
			XXH3_64bits_update(st, parts[i], len);
	}
	uint64_t h = XXH3_64bits_digest(st);
	XXH3_freeState(st);
	return h;
}

int bk_tokcache_get(const bk_tokcache *c, uint64_t key, bk_tokcache_entry *e)
{
	size_t i = (size_t)(key & (c->nslot - 1));
	while (c->slot[i]) {
		const char *p = c->buf + c->slot[i] - 1;
		if (rd64(p) == key) {
			e->nt = rd32(p + 8);
			e->ns = rd32(p + 12);
			e->nr = rd32(p + 16);
			e->has_resp = (int)rd32(p + 20);
			e->t = (const int32_t *)(p + ENT);
			e->s = e->t + e->nt;
			e->r = e->s + e->ns;
			return 1;
		}
		i = (i + 1) & (c->nslot - 1);
	}
	return 0;
}

void bk_tokcache_put(bk_tokcache *c, uint64_t key, const bk_tokcache_entry *e)
{
	size_t need = ENT + 4 * (e->nt + e->ns + e->nr);
	if (c->len + need > c->cap) {
		c->cap = (c->len + need) * 2;
		c->buf = xrealloc(c->buf, c->cap);
	}
	char *p = c->buf + c->len;
	uint32_t h[4] = {(uint32_t)e->nt, (uint32_t)e->ns, (uint32_t)e->nr, (uint32_t)e->has_resp};
	memcpy(p, &key, 8);
	memcpy(p + 8, h, 16);
	if (e->nt)
		memcpy(p + ENT, e->t, 4 * e->nt);
	if (e->ns)
		memcpy(p + ENT + 4 * e->nt, e->s, 4 * e->ns);
	if (e->nr)
		memcpy(p + ENT + 4 * (e->nt + e->ns), e->r, 4 * e->nr);
	uint64_t check = entry_check(p, e->nt + e->ns + e->nr);
	memcpy(p + CHK, &check, 8);
	/* ids are int32 aligned: ENT and every entry size are multiples of 4 */
	table_insert(c, key, c->len);
	c->len += need;
	c->added++;
}

const char *bk_tokcache_path(const bk_tokcache *c) { return c->path; }

/* adds the entries of the file on disk now that c lacks; a damaged or foreign file
 * adds nothing (it is replaced), a damaged entry is left out */
static void merge_from_disk(bk_tokcache *c)
{
	size_t flen, bad;
	char *file = bk_try_read_file(c->path, &flen);
	if (!file)
		return;
	if (flen >= HDR && !memcmp(file, MAGIC, 8) && rd64(file + 8) == c->tok_hash)
		scan_body(c, file + HDR, flen - HDR, rd64(file + 16), 1, &bad);
	free(file);
}

size_t bk_tokcache_close(bk_tokcache *c)
{
	size_t added = c->added;
	if (added || c->dropped) { /* a damaged file or entry is rewritten without it */
		/* the lock: other runs sharing this cache merge one at a time (a lock that
		 * cannot be had, e.g. on a file system without flock, only loses the merge) */
		char *lock_path = xasprintf("%s.lock", c->path);
		int lfd = open(lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
		while (lfd >= 0 && flock(lfd, LOCK_EX) != 0 && errno == EINTR)
			;
		free(lock_path);
		merge_from_disk(c);
		/* count entries actually in the body (a re-put key appears twice; harmless) */
		uint64_t n = 0;
		for (size_t off = 0; off < c->len; n++)
			off += ENT + 4 * ((size_t)rd32(c->buf + off + 8) + rd32(c->buf + off + 12) +
					  rd32(c->buf + off + 16));
		/* temporary + rename by hand: a failure here is a warning, not an error (the
		 * output the cache served is already written) */
		char *tmp = xasprintf("%s.tmp.%ld", c->path, (long)getpid());
		FILE *f = fopen(tmp, "wb");
		int ok = f && fwrite(MAGIC, 1, 8, f) == 8 && fwrite(&c->tok_hash, 8, 1, f) == 1 &&
			 fwrite(&n, 8, 1, f) == 1 && fwrite(c->buf, 1, c->len, f) == c->len;
		ok = (f && fclose(f) == 0) && ok;
		if (!ok || rename(tmp, c->path) != 0) {
			warn("%s: cannot write the cache (%s); the next run tokenizes again", c->path,
			     strerror(errno));
			unlink(tmp);
		}
		free(tmp);
		if (lfd >= 0)
			close(lfd); /* releases the lock */
	}
	free(c->buf);
	free(c->slot);
	free(c->path);
	free(c);
	return added;
}
