/* files.c - see files.h. */
#include "files.h"
#include "diag.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

char *bk_try_read_file(const char *path, size_t *len)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	if (!f)
		return NULL;
	size_t cap = 1 << 16, n = 0;
	char *buf = xmalloc(cap + 1);
	for (;;) {
		if (n == cap) {
			cap *= 2;
			buf = xrealloc(buf, cap + 1);
		}
		size_t r = fread(buf + n, 1, cap - n, f);
		n += r;
		if (r == 0)
			break;
	}
	int err = ferror(f) ? (errno ? errno : EIO) : 0;
	if (f != stdin)
		fclose(f);
	if (err) {
		free(buf);
		errno = err;
		return NULL;
	}
	buf[n] = 0;
	if (len)
		*len = n;
	return buf;
}

char *bk_read_file(const char *path, size_t *len)
{
	char *p = bk_try_read_file(path, len);
	if (!p)
		die("%s: %s", path, strerror(errno));
	return p;
}

bk_map bk_map_file(const char *path)
{
	bk_map m = {0};
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		die("%s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0)
		die("%s: %s", path, strerror(errno));
	if (!S_ISREG(st.st_mode))
		die("%s: not a regular file", path);
	m.len = (size_t)st.st_size;
	if (m.len) {
		void *p = mmap(NULL, m.len, PROT_READ, MAP_PRIVATE, fd, 0);
		if (p == MAP_FAILED)
			die("%s: mmap: %s", path, strerror(errno));
		m.data = p;
	}
	close(fd);
	return m;
}

void bk_unmap(bk_map *m)
{
	if (m->data)
		munmap((void *)m->data, m->len);
	m->data = NULL;
	m->len = 0;
}

/* ---- atomic outputs ---- */

struct bk_out {
	FILE *f;
	char *path, *tmp;
	int direct; /* not a regular file: written in place */
};

#define BK_MAX_TMP 16
static char *live_tmp[BK_MAX_TMP]; /* temporaries to remove if we die */
static int cleanup_installed;

static void remove_tmps(void)
{
	for (int i = 0; i < BK_MAX_TMP; i++)
		if (live_tmp[i])
			unlink(live_tmp[i]);
}

static void on_fatal_signal(int sig)
{
	remove_tmps(); /* unlink is async-signal-safe */
	signal(sig, SIG_DFL);
	raise(sig);
}

static void track_tmp(char *tmp, int add)
{
	if (!cleanup_installed) {
		cleanup_installed = 1;
		bk_atexit(remove_tmps);
		/* tools that save on SIGINT install their own handlers after this */
		if (signal(SIGINT, SIG_IGN) != SIG_IGN)
			signal(SIGINT, on_fatal_signal);
		if (signal(SIGTERM, SIG_IGN) != SIG_IGN)
			signal(SIGTERM, on_fatal_signal);
		signal(SIGHUP, on_fatal_signal);
	}
	for (int i = 0; i < BK_MAX_TMP; i++) {
		if (add && !live_tmp[i]) {
			live_tmp[i] = tmp;
			return;
		}
		if (!add && live_tmp[i] == tmp) {
			live_tmp[i] = NULL;
			return;
		}
	}
	if (add)
		BUG("too many open output files");
}

bk_out *bk_out_open(const char *path)
{
	bk_out *o = xcalloc(1, sizeof *o);
	o->path = xstrdup(path);
	if (!strcmp(path, "-")) {
		o->f = stdout;
		return o;
	}
	struct stat st;
	if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
		/* a device or a FIFO (-o /dev/null, -o /dev/stdout, -o >(cmd)): write in
		 * place, never rename a temporary over it */
		o->f = fopen(path, "wb");
		if (!o->f)
			die("%s: %s", path, strerror(errno));
		o->direct = 1;
		return o;
	}
	struct stat lst;
	if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode)) {
		/* a symlink: write the file it points to (made if absent), keep the link */
		char *real = realpath(path, NULL);
		if (!real) { /* dangling: its target, relative to the link's folder */
			char target[4096];
			ssize_t k = readlink(path, target, sizeof target - 1);
			if (k <= 0)
				die("%s: %s", path, strerror(errno));
			target[k] = 0;
			const char *slash = strrchr(path, '/');
			real = target[0] == '/' || !slash
				       ? xstrdup(target)
				       : xasprintf("%.*s/%s", (int)(slash - path), path, target);
		}
		free(o->path);
		o->path = real;
		path = real;
	}
	o->tmp = xasprintf("%s.tmp.%ld", path, (long)getpid());
	track_tmp(o->tmp, 1);
	o->f = fopen(o->tmp, "wb");
	if (!o->f)
		die("%s: %s", o->tmp, strerror(errno));
	return o;
}

FILE *bk_out_file(bk_out *o) { return o->f; }
const char *bk_out_path(const bk_out *o) { return o->path; }

void bk_out_commit(bk_out *o)
{
	if (o->direct) {
		if (fclose(o->f) != 0 && errno != EPIPE)
			die("write error on %s: %s", o->path, strerror(errno));
	} else if (!o->tmp) {
		if (fflush(o->f) != 0 && errno != EPIPE)
			die("write error on %s: %s", o->path, strerror(errno));
	} else {
		if (fflush(o->f) != 0 || ferror(o->f))
			die("%s: write error: %s", o->tmp, strerror(errno));
		if (fsync(fileno(o->f)) != 0 && errno != EINVAL)
			die("%s: fsync: %s", o->tmp, strerror(errno));
		if (fclose(o->f) != 0)
			die("%s: close: %s", o->tmp, strerror(errno));
		if (rename(o->tmp, o->path) != 0)
			die("rename %s -> %s: %s", o->tmp, o->path, strerror(errno));
		track_tmp(o->tmp, 0);
		free(o->tmp);
	}
	free(o->path);
	free(o);
}

void bk_write_file_atomic(const char *path, const void *data, size_t len)
{
	bk_out *o = bk_out_open(path);
	if (len && fwrite(data, 1, len, bk_out_file(o)) != len)
		die("%s: write error: %s", path, strerror(errno));
	bk_out_commit(o);
}

/* ---- stdout of filters ---- */

static void on_sigpipe(int sig)
{
	(void)sig;
	remove_tmps();
	_exit(BK_EXIT_OK); /* the reader went away: a filter ends quietly */
}

void bk_stdout_init(void)
{
	signal(SIGPIPE, on_sigpipe);
}

void bk_stdout_close(void)
{
	if (fflush(stdout) != 0 || ferror(stdout)) {
		if (errno == EPIPE)
			exit(BK_EXIT_OK);
		die("write error on standard output: %s", strerror(errno));
	}
	if (fclose(stdout) != 0 && errno != EPIPE)
		die("write error on standard output: %s", strerror(errno));
}

int bk_remove_flat_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : -1;
	struct dirent *e;
	int rc = 0;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char *p = bk_path_join(dir, e->d_name);
		if (unlink(p) != 0 && errno != ENOENT)
			rc = -1;
		free(p);
	}
	closedir(d);
	if (rmdir(dir) != 0 && errno != ENOENT)
		rc = -1;
	return rc;
}

/* ---- directory locks ---- */

#define BK_MAX_LOCKS 4
static struct {
	char *path, *dir;
	int made_dir;
} locks[BK_MAX_LOCKS];
static int n_locks;

static void release_locks(void)
{
	/* unlinked while still held (the fds close at exit): a run that opened the old
	 * file and locks it after us sees it is gone and takes the new one */
	for (int i = 0; i < n_locks; i++) {
		unlink(locks[i].path);
		if (locks[i].made_dir)
			rmdir(locks[i].dir); /* only when the run left it empty */
	}
	n_locks = 0;
}

void bk_dir_lock(const char *dir, const char *name, const char *what)
{
	if (n_locks == BK_MAX_LOCKS)
		BUG("too many directory locks");
	struct stat st;
	int made = 0;
	if (stat(dir, &st) != 0) {
		if (errno != ENOENT)
			die("%s %s: %s", what, dir, strerror(errno));
		bk_mkdir_p(dir);
		made = 1;
	} else if (!S_ISDIR(st.st_mode)) {
		die("%s %s: exists and is not a directory", what, dir);
	}
	char *path = xasprintf("%s/.%s.lock", dir, name);
	int fd;
	for (;;) {
		fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
		if (fd < 0)
			die("%s %s: cannot make the lock file %s: %s", what, dir, path, strerror(errno));
		if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
			int e = errno;
			if (e == EINTR) {
				close(fd);
				continue;
			}
			if (e != EWOULDBLOCK)
				die("%s %s: cannot lock %s: %s", what, dir, path, strerror(e));
			char pid[32];
			ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
			pid[n > 0 ? n : 0] = 0;
			pid[strcspn(pid, "\n")] = 0;
			die("%s %s is in use by another %s run (pid %s): wait for it to end, or give "
			    "another directory",
			    what, dir, name, *pid ? pid : "unknown");
		}
		struct stat a, b; /* still the file at path (not unlinked by a run that ended)? */
		if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
		    a.st_ino == b.st_ino)
			break;
		close(fd);
	}
	char pid[32];
	int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
	if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
		die("%s: cannot write: %s", path, strerror(errno));
	if (!n_locks)
		atexit(release_locks); /* die() exits through exit() too */
	locks[n_locks].path = path;
	locks[n_locks].dir = xstrdup(dir);
	locks[n_locks].made_dir = made;
	n_locks++;
}

void bk_mkdir_p(const char *path)
{
	char *p = xstrdup(path);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0777) != 0 && errno != EEXIST)
			die("mkdir %s: %s", p, strerror(errno));
		*s = '/';
	}
	if (mkdir(p, 0777) != 0 && errno != EEXIST)
		die("mkdir %s: %s", p, strerror(errno));
	free(p);
}

int bk_file_exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

char *bk_path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir);
	return xasprintf("%s%s%s", dir, (n && dir[n - 1] == '/') ? "" : "/", name);
}
