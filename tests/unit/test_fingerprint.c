/* test_fingerprint.c - the model fingerprint cache (gpu/load.c): the cached fingerprint
 * equals the full read's; a hit reads no tensor byte (a planted entry is returned); a
 * new mtime, a changed byte or another file make a new key; an HF cache blob is keyed by
 * its content name, so touching it keeps the entry; a file modified in the last 2 s is
 * not cached (git's racy case). */
#include "tests/harness.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "gpu/load.h"

static char tmp[256];

static void copy(const char *from, const char *to)
{
	size_t n;
	char *d = bk_read_file(from, &n);
	bk_write_file_atomic(to, d, n);
	free(d);
}

static void set_mtime(const char *path, time_t ago)
{
	struct timespec ts[2];
	clock_gettime(CLOCK_REALTIME, &ts[0]);
	ts[0].tv_sec -= ago;
	ts[1] = ts[0];
	if (utimensat(AT_FDCWD, path, ts, 0))
		die("utimensat %s", path);
}

/* the cache's entries: their count, and the path of the last one */
static int entries(char *last, size_t size)
{
	char *dir = xasprintf("%s/cache/bakery/fingerprints", tmp);
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.') {
			n++;
			snprintf(last, size, "%s/%s", dir, e->d_name);
		}
	if (d)
		closedir(d);
	free(dir);
	return n;
}

static void plant(const char *entry)
{
	bk_write_file_atomic(entry, "0123456789abcdef\n", 17);
}

int main(void)
{
	snprintf(tmp, sizeof tmp, "%s/bk-fp.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp))
		die("mkdtemp");
	char *cache = xasprintf("%s/cache", tmp), *m = xasprintf("%s/m", tmp);
	setenv("XDG_CACHE_HOME", cache, 1);
	bk_mkdir_p(m);
	char *cfg = xasprintf("%s/config.json", m), *st = xasprintf("%s/model.safetensors", m);
	copy("models/stories260K/config.json", cfg);
	copy("models/stories260K/model.safetensors", st);
	char full[17], fp[17], last[512];

	/* just written: racy, computed but not cached */
	bk_model_fingerprint_full(m, full);
	bk_model_fingerprint(m, fp);
	CHECK(!strcmp(fp, full) && entries(last, sizeof last) == 0,
	      "a file modified now is not cached (%s, %d entries)", fp, entries(last, sizeof last));
	/* older: cached, the same value; a hit reads nothing (the planted entry comes back) */
	set_mtime(st, 10);
	bk_model_fingerprint(m, fp);
	CHECK(!strcmp(fp, full) && entries(last, sizeof last) == 1, "cached fingerprint %s, full %s",
	      fp, full);
	plant(last);
	bk_model_fingerprint(m, fp);
	CHECK(!strcmp(fp, "0123456789abcdef"), "a cache hit is used: %s", fp);
	bk_model_fingerprint_full(m, fp);
	CHECK(!strcmp(fp, full), "the full read ignores the cache");
	/* a new mtime: a new key, the true value again */
	set_mtime(st, 20);
	bk_model_fingerprint(m, fp);
	CHECK(!strcmp(fp, full) && entries(last, sizeof last) == 2, "new mtime: %s", fp);
	/* one changed byte (the last one, inside a tensor): another fingerprint */
	size_t n;
	char *d = bk_read_file(st, &n);
	d[n - 1] ^= 1;
	bk_write_file_atomic(st, d, n);
	free(d);
	set_mtime(st, 30);
	bk_model_fingerprint(m, fp);
	char full2[17];
	bk_model_fingerprint_full(m, full2);
	CHECK(strcmp(fp, full) && !strcmp(fp, full2), "a changed weight: %s (was %s, full %s)", fp,
	      full, full2);
	/* config.json is part of the key */
	char *cfgtext = bk_read_file(cfg, &n);
	char *cfg2 = xasprintf("%s\n", cfgtext);
	bk_write_file_atomic(cfg, cfg2, n + 1);
	bk_model_fingerprint(m, fp);
	CHECK(strcmp(fp, full2), "config.json changed: %s", fp);
	free(cfgtext), free(cfg2);

	/* an HF cache layout: snapshots/rev/model.safetensors -> ../../blobs/<sha256> */
	char *hf = xasprintf("%s/hf", tmp), *blobs = xasprintf("%s/hf/blobs", tmp),
	     *snap = xasprintf("%s/hf/snapshots/abc", tmp);
	bk_mkdir_p(blobs), bk_mkdir_p(snap);
	const char *sha = "c58cf7822d476404e18b2855c6c6ab4063711abd7d0a7922bd175e51264e5b44";
	char *blob = xasprintf("%s/%s", blobs, sha), *link = xasprintf("%s/model.safetensors", snap),
	     *target = xasprintf("../../blobs/%s", sha), *scfg = xasprintf("%s/config.json", snap);
	copy("models/stories260K/model.safetensors", blob);
	copy("models/stories260K/config.json", scfg);
	if (symlink(target, link))
		die("symlink");
	int before = entries(last, sizeof last);
	bk_model_fingerprint(snap, fp); /* the blob is just written, but content-named */
	CHECK(!strcmp(fp, full) && entries(last, sizeof last) == before + 1,
	      "an HF blob is cached by its name at once: %s", fp);
	/* find the new entry: plant it; touching the blob keeps the key */
	char *dir = xasprintf("%s/cache/bakery/fingerprints", tmp);
	DIR *dd = opendir(dir);
	struct dirent *e;
	while ((e = readdir(dd))) {
		if (e->d_name[0] == '.')
			continue;
		char *p = xasprintf("%s/%s", dir, e->d_name);
		char *v = bk_read_file(p, &n);
		if (!strncmp(v, full, 16)) /* the entries holding the original fingerprint */
			plant(p);
		free(v), free(p);
	}
	closedir(dd);
	set_mtime(blob, 40);
	bk_model_fingerprint(snap, fp);
	CHECK(!strcmp(fp, "0123456789abcdef"), "a touched blob keeps its entry: %s", fp);
	free(dir), free(hf), free(blobs), free(snap), free(blob), free(link), free(target), free(scfg);

	char *rm = xasprintf("rm -rf '%s'", tmp);
	if (system(rm))
		warn("cannot remove %s", tmp);
	free(rm), free(cache), free(m), free(cfg), free(st);
	return bk_test_done("test_fingerprint");
}
