/* test_wshare.c - the rendezvous of gpu/wshare.h with any file descriptor (a memfd): the
 * first process gets the lock and serves, another process of the same key gets the same
 * file (same inode, same bytes) and the blob, one of another key loads its own, the
 * copy outlives its loader (the holder), a directory that is not private turns sharing
 * off, BK_SHARE_WEIGHTS=0 too. */
#include "tests/harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/diag.h"
#include "gpu/wshare.h"

static const char KEY[] = "test-wshare device=0 model=abc dtype=bf16 layout=1";

typedef struct {
	ino_t ino;
	const char *key;
	int want; /* enum bk_wshare_role */
} probe;

/* in a child: join p->key; exit 0 when the role is p->want and, imported, the file is
 * p->ino holding "weights" and the blob "layout" */
static void join_child(void *arg)
{
	const probe *p = arg;
	int fd;
	void *blob;
	size_t len;
	long pid;
	const char *why = NULL;
	int role = bk_wshare_join(p->key, &fd, &blob, &len, &pid, &why);
	if (role != p->want) {
		fprintf(stderr, "role %d, not %d (%s)\n", role, p->want, why ? why : "-");
		exit(1);
	}
	if (role == BK_WSHARE_IMPORTED) {
		struct stat sb;
		char buf[8] = {0};
		if (fstat(fd, &sb) || sb.st_ino != p->ino || pread(fd, buf, 7, 0) != 7 ||
		    strcmp(buf, "weights") || len != 7 || memcmp(blob, "layout", 7) ||
		    pid == getppid() || pid <= 0) {
			fprintf(stderr, "imported another file or blob (inode %lu, pid %ld)\n",
				(unsigned long)sb.st_ino, pid);
			exit(1);
		}
	}
	exit(0);
}

/* a loader in a child that serves and exits at once: the holder keeps the copy */
static void load_child(void *arg)
{
	const probe *p = arg;
	int fd;
	void *blob;
	size_t len;
	long pid;
	const char *why = NULL;
	if (bk_wshare_join(p->key, &fd, &blob, &len, &pid, &why) != BK_WSHARE_LOAD)
		exit(1);
	int m = memfd_create("test-wshare", MFD_CLOEXEC);
	if (m < 0 || pwrite(m, "weights", 7, 0) != 7)
		exit(1);
	bk_wshare_serve(p->key, m, "layout", 7);
	exit(0);
}

int main(void)
{
	char dir[] = "/tmp/bk-test-wshare.XXXXXX", err[4096];
	CHECK(mkdtemp(dir) != NULL, "mkdtemp");
	setenv("XDG_RUNTIME_DIR", dir, 1);
	setenv("BK_SHARE_LINGER", "2", 1);
	unsetenv("BK_SHARE_WEIGHTS");
	unsetenv("BK_SHARE_HOLDER");

	/* this process loads and serves; a child imports the same file */
	int fd;
	void *blob;
	size_t len;
	long pid;
	const char *why = NULL;
	CHECK(bk_wshare_join(KEY, &fd, &blob, &len, &pid, &why) == BK_WSHARE_LOAD,
	      "the first joiner loads (%s)", why ? why : "-");
	int m = memfd_create("test-wshare", MFD_CLOEXEC);
	CHECK(m >= 0 && pwrite(m, "weights", 7, 0) == 7, "memfd");
	struct stat sb;
	CHECK(!fstat(m, &sb), "fstat");
	bk_wshare_serve(KEY, m, "layout", 7);
	probe p = {sb.st_ino, KEY, BK_WSHARE_IMPORTED};
	int st = bk_run_child(join_child, &p, err, sizeof err);
	CHECK(st == 0, "a second process imports the same file: %s", err);
	st = bk_run_child(join_child, &p, err, sizeof err);
	CHECK(st == 0, "and a third: %s", err);
	probe other = {0, "test-wshare device=0 model=def dtype=bf16 layout=1", BK_WSHARE_LOAD};
	st = bk_run_child(join_child, &other, err, sizeof err);
	CHECK(st == 0, "another model: its own copy: %s", err);

	/* a loader that exits at once: its holder serves the next joiner */
	static const char KEY2[] = "test-wshare device=0 model=ghi dtype=bf16 layout=1";
	probe l = {0, KEY2, BK_WSHARE_LOAD};
	st = bk_run_child(load_child, &l, err, sizeof err);
	CHECK(st == 0, "a loader that exits: %s", err);
	/* the holder's memfd: its bytes and the blob */
	int cfd;
	void *cb;
	size_t cl;
	long cp;
	CHECK(bk_wshare_join(KEY2, &cfd, &cb, &cl, &cp, &why) == BK_WSHARE_IMPORTED,
	      "after its loader exited the copy is still served (%s)", why ? why : "-");
	char buf[8] = {0};
	CHECK(pread(cfd, buf, 7, 0) == 7 && !strcmp(buf, "weights") && cl == 7 &&
	      !memcmp(cb, "layout", 7), "the holder's copy");
	free(cb);
	close(cfd);

	/* sharing off: a directory that is not private, BK_SHARE_WEIGHTS=0 */
	char *open_dir = xasprintf("%s/open", dir), *bk = xasprintf("%s/open/bakery", dir);
	CHECK(!mkdir(open_dir, 0755) && !mkdir(bk, 0755), "mkdir");
	setenv("XDG_RUNTIME_DIR", open_dir, 1);
	why = NULL;
	CHECK(bk_wshare_join("test-wshare other", &fd, &blob, &len, &pid, &why) ==
		      BK_WSHARE_FAILED && why && strstr(why, "not a private directory"),
	      "a directory others may write: off (%s)", why ? why : "-");
	CHECK(bk_wshare_enabled(), "on by default");
	setenv("BK_SHARE_WEIGHTS", "0", 1);
	CHECK(!bk_wshare_enabled(), "BK_SHARE_WEIGHTS=0: off");
	unsetenv("BK_SHARE_WEIGHTS");
	bk_wshare_off = 1;
	CHECK(!bk_wshare_enabled(), "--no-share-weights: off");
	rmdir(bk);
	rmdir(open_dir);
	free(bk);
	free(open_dir);
	char *cmd = xasprintf("rm -rf '%s'", dir);
	CHECK(system(cmd) == 0, "cleanup");
	free(cmd);
	return bk_test_done("test_wshare");
}
