/* wshare.c - see wshare.h.
 *
 * The exchange, on a stream socket: the client sends "BKWS" u32 key_len, the key; the
 * server answers a header {"BKWR", u32 status (0 ok, 1 another key), i64 pid, u64
 * blob_len} with the descriptor attached (SCM_RIGHTS) when ok, then the blob. */
#include "gpu/wshare.h"
#include "common/diag.h"
#include "common/hash.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int bk_wshare_off;

int bk_wshare_enabled(void)
{
	const char *e = getenv("BK_SHARE_WEIGHTS");
	return !bk_wshare_off && !(e && !strcmp(e, "0"));
}

typedef struct {
	char magic[4];
	uint32_t status;
	int64_t pid;
	uint64_t len;
} reply_hdr;

/* one key's state in this process (a process may hold several copies) */
typedef struct share {
	struct share *next;
	char *key;
	char *sock, *lock;
	int lockfd;  /* the lock file, or -1 */
	int locked;  /* this process holds the flock (between LOAD and serve) */
	int fd;      /* the copy's descriptor once this process holds it, else -1 */
	void *blob;
	size_t len;
	int conn;    /* held open to the server while this process lives, or -1 */
} share;

static share *g_shares;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;

/* $XDG_RUNTIME_DIR/bakery or /tmp/bakery-UID, made 0700; NULL (why) when not private */
static char *share_dir(const char **why)
{
	const char *x = getenv("XDG_RUNTIME_DIR");
	char *d = x && *x ? xasprintf("%s/bakery", x) : xasprintf("/tmp/bakery-%ld", (long)getuid());
	struct stat sb;
	if ((mkdir(d, 0700) && errno != EEXIST) || lstat(d, &sb)) {
		*why = "cannot make the rendezvous directory ($XDG_RUNTIME_DIR/bakery or /tmp/bakery-UID)";
	} else if (!S_ISDIR(sb.st_mode) || sb.st_uid != getuid() || (sb.st_mode & 077)) {
		*why = "the rendezvous directory ($XDG_RUNTIME_DIR/bakery or /tmp/bakery-UID) is not "
		       "a private directory of this user";
	} else {
		return d;
	}
	free(d);
	return NULL;
}

/* the state of key, made on first use; NULL (why) without a rendezvous directory */
static share *share_of(const char *key, const char **why)
{
	pthread_mutex_lock(&g_mu);
	share *s = g_shares;
	while (s && strcmp(s->key, key))
		s = s->next;
	pthread_mutex_unlock(&g_mu);
	if (s)
		return s;
	char *dir = share_dir(why);
	if (!dir)
		return NULL;
	char h[17];
	bk_hash_hex(bk_hash(key, strlen(key), 0), h);
	s = xcalloc(1, sizeof *s);
	s->key = xstrdup(key);
	s->sock = xasprintf("%s/w-%s.sock", dir, h);
	s->lock = xasprintf("%s/w-%s.lock", dir, h);
	s->lockfd = s->fd = s->conn = -1;
	free(dir);
	if (strlen(s->sock) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		*why = "the rendezvous socket's path is too long ($XDG_RUNTIME_DIR)";
		free(s->key), free(s->sock), free(s->lock), free(s);
		return NULL;
	}
	pthread_mutex_lock(&g_mu);
	s->next = g_shares;
	g_shares = s;
	pthread_mutex_unlock(&g_mu);
	return s;
}

static int write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		c += w, n -= (size_t)w;
	}
	return 0;
}

static int read_all(int fd, void *p, size_t n)
{
	char *c = p;
	while (n) {
		ssize_t r = recv(fd, c, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		c += r, n -= (size_t)r;
	}
	return 0;
}

static void set_timeout(int fd, int seconds)
{
	struct timeval tv = {seconds, 0};
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static struct sockaddr_un addr_of(const share *s)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	memcpy(a.sun_path, s->sock, strlen(s->sock) + 1);
	return a;
}

/* one request on connection c: 1 when the descriptor went out */
static int answer(const share *s, int c)
{
	set_timeout(c, 5);
	char magic[4];
	uint32_t klen;
	if (read_all(c, magic, 4) || memcmp(magic, "BKWS", 4) || read_all(c, &klen, 4) ||
	    klen > 4096)
		return 0;
	char key[4097];
	if (read_all(c, key, klen))
		return 0;
	key[klen] = 0;
	reply_hdr h = {{'B', 'K', 'W', 'R'}, strcmp(key, s->key) != 0, (int64_t)getpid(), s->len};
	struct iovec iov = {&h, sizeof h};
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;
	memset(&cm, 0, sizeof cm);
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
	if (!h.status) {
		m.msg_control = cm.buf;
		m.msg_controllen = sizeof cm.buf;
		struct cmsghdr *ch = CMSG_FIRSTHDR(&m);
		ch->cmsg_level = SOL_SOCKET;
		ch->cmsg_type = SCM_RIGHTS;
		ch->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(ch), &s->fd, sizeof(int));
	}
	ssize_t w;
	do
		w = sendmsg(c, &m, MSG_NOSIGNAL);
	while (w < 0 && errno == EINTR);
	return w == (ssize_t)sizeof h && !h.status && !write_all(c, s->blob, s->len);
}

/* seconds a holder with no process attached waits for one (BK_SHARE_LINGER) */
static int linger_s(void)
{
	const char *e = getenv("BK_SHARE_LINGER");
	return e && *e ? atoi(e) : 10;
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The holder: a process of its own that keeps the copy's descriptor and the lock and
 * answers joiners, so the copy outlives the stage that loaded it (bk-gen may exit before
 * bk-step loads).  Each process it served (and the loader, by link) keeps a connection
 * open while it lives; the holder exits when none is open and either no process of the
 * loader's process group (its pipe) is left or none came for BK_SHARE_LINGER seconds.
 * After fork in a threaded process: no allocation, no stdio, _exit only. */
static _Noreturn void holder_main(share *s, int lst, int link, pid_t pgid, int linger)
{
	setsid(); /* out of the pipe's group: its signals, and the test of it below */
	prctl(PR_SET_NAME, "bk-wshare");
	int keep[4] = {s->lockfd, s->fd, lst, link}, nul = open("/dev/null", O_RDWR);
	for (int i = 0; i < 4; i++)
		if (keep[i] < 3)
			keep[i] = fcntl(keep[i], F_DUPFD, 3);
	s->lockfd = keep[0], s->fd = keep[1], lst = keep[2], link = keep[3];
	for (int i = 0; i < 3; i++)
		dup2(nul, i); /* the pipe's ends and the terminal are not the holder's */
	for (int fd = 3; fd < 1024; fd++) /* nothing else: a held pipe end never sees EOF */
		if (fd != keep[0] && fd != keep[1] && fd != keep[2] && fd != keep[3])
			close(fd);
	if (close_range(1024, ~0u, 0))
		for (int fd = 1024; fd < 65536; fd++)
			close(fd);
	enum { MAXC = 256 };
	struct pollfd p[1 + MAXC];
	int n = 1;
	p[0] = (struct pollfd){.fd = lst, .events = POLLIN};
	p[n++] = (struct pollfd){.fd = link, .events = POLLIN};
	double idle = now_s();
	for (;;) {
		int r = poll(p, (nfds_t)n, 250);
		if (r > 0 && (p[0].revents & POLLIN)) {
			int c = accept4(lst, NULL, NULL, SOCK_CLOEXEC);
			if (c >= 0 && answer(s, c) && n < 1 + MAXC)
				p[n++] = (struct pollfd){.fd = c, .events = POLLIN};
			else if (c >= 0)
				close(c);
		}
		for (int i = 1; r > 0 && i < n; i++)
			if (p[i].revents) { /* EOF: that process has exited */
				char b;
				if (recv(p[i].fd, &b, 1, MSG_DONTWAIT) <= 0) {
					close(p[i].fd);
					p[i--] = p[--n];
					if (n == 1)
						idle = now_s();
				}
			}
		if (n == 1 && ((kill(-pgid, 0) && errno == ESRCH) || now_s() - idle >= linger)) {
			unlink(s->sock); /* then exit releases the lock: joiners load their own */
			_exit(0);
		}
	}
}

/* serves from a thread of this process (when no holder can be forked) */
static void *serve_main(void *arg)
{
	share *s = arg;
	int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = addr_of(s);
	unlink(s->sock);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 64)) {
		if (l >= 0)
			close(l);
		return NULL; /* the lock stays ours: joiners wait, then load when we exit */
	}
	for (;;) {
		int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
		if (c >= 0) {
			answer(s, c);
			close(c);
		} else if (errno != EINTR && errno != ECONNABORTED) {
			struct timespec ts = {0, 100 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
	}
	return NULL;
}

/* forks the holder: 0, or -1 when it could not (nothing changed) */
static int start_holder(share *s)
{
	int link[2], lst = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un a = addr_of(s);
	if (lst < 0)
		return -1;
	unlink(s->sock); /* a dead server's: the lock is ours */
	if (bind(lst, (struct sockaddr *)&a, sizeof a) || listen(lst, 64) ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, link)) {
		close(lst);
		return -1;
	}
	pid_t pgid = getpgrp();
	int linger = linger_s();
	pid_t c = fork();
	if (c == 0) { /* twice, so that the holder is no child of this stage's */
		if (fork() == 0)
			holder_main(s, lst, link[1], pgid, linger);
		_exit(0);
	}
	close(lst);
	close(link[1]);
	if (c < 0) {
		close(link[0]);
		unlink(s->sock);
		return -1;
	}
	while (waitpid(c, NULL, 0) < 0 && errno == EINTR)
		;
	s->conn = link[0];
	/* the holder has the lock now (the same open file); were it killed, our copy of the
	 * descriptor must not keep joiners waiting for a server that never comes */
	close(s->lockfd);
	s->lockfd = -1;
	s->locked = 0;
	return 0;
}

void bk_wshare_serve(const char *key, int fd, const void *blob, size_t len)
{
	const char *why = NULL;
	share *s = share_of(key, &why);
	if (!s || s->fd >= 0 || !s->locked) /* no rendezvous, served already, or not ours */
		return;
	s->fd = fd;
	s->blob = xmalloc(len ? len : 1);
	memcpy(s->blob, blob, len);
	s->len = len;
	const char *h = getenv("BK_SHARE_HOLDER");
	if ((!h || strcmp(h, "0")) && !start_holder(s))
		return;
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 256 << 10);
	if (pthread_create(&t, &at, serve_main, s))
		warn("cannot start the thread that shares the weights: later stages load their own");
	pthread_attr_destroy(&at);
}

void bk_wshare_abandon(const char *key)
{
	const char *why = NULL;
	share *s = share_of(key, &why);
	if (s && s->locked && s->fd < 0 && !flock(s->lockfd, LOCK_UN))
		s->locked = 0;
}

/* asks the server of s: 1 imported, 0 no server, -1 a server that refused (why) */
static int ask(share *s, int *fd, void **blob, size_t *len, long *pid, const char **why)
{
	int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c < 0)
		return 0;
	struct sockaddr_un a = addr_of(s);
	if (connect(c, (struct sockaddr *)&a, sizeof a)) {
		close(c);
		return 0;
	}
	set_timeout(c, 30);
	uint32_t klen = (uint32_t)strlen(s->key);
	reply_hdr h;
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} cm;
	memset(&cm, 0, sizeof cm);
	struct iovec iov = {&h, sizeof h};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
			   .msg_controllen = sizeof cm.buf};
	ssize_t r = -1;
	if (!write_all(c, "BKWS", 4) && !write_all(c, &klen, 4) && !write_all(c, s->key, klen))
		do
			r = recvmsg(c, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL);
		while (r < 0 && errno == EINTR);
	int got = -1;
	struct cmsghdr *ch = r > 0 ? CMSG_FIRSTHDR(&m) : NULL;
	if (ch && ch->cmsg_level == SOL_SOCKET && ch->cmsg_type == SCM_RIGHTS &&
	    ch->cmsg_len == CMSG_LEN(sizeof(int)))
		memcpy(&got, CMSG_DATA(ch), sizeof(int));
	int ok = r == (ssize_t)sizeof h && !memcmp(h.magic, "BKWR", 4) && !h.status && got >= 0 &&
		 !(m.msg_flags & MSG_CTRUNC) && h.len <= ((uint64_t)1 << 30);
	void *b = NULL;
	if (ok) {
		b = xmalloc(h.len ? h.len : 1);
		ok = !read_all(c, b, h.len);
	}
	if (!ok) {
		close(c);
		if (got >= 0)
			close(got);
		free(b);
		/* a server that died mid-answer looks the same: the caller retries */
		*why = r == (ssize_t)sizeof h && h.status ? "the rendezvous socket serves another key"
							  : NULL;
		return *why ? -1 : 0;
	}
	s->conn = c; /* open while this process lives: the holder counts it */
	*fd = got;
	*blob = b;
	*len = h.len;
	*pid = (long)h.pid;
	return 1;
}

int bk_wshare_join(const char *key, int *fd, void **blob, size_t *len, long *pid,
		   const char **why)
{
	*fd = -1;
	*blob = NULL;
	*len = 0;
	*pid = 0;
	share *s = share_of(key, why);
	if (!s)
		return BK_WSHARE_FAILED;
	if (s->fd >= 0) { /* this process holds it already: a second load of the same copy */
		int d = fcntl(s->fd, F_DUPFD_CLOEXEC, 0);
		if (d < 0) {
			*why = "cannot duplicate the shared copy's descriptor";
			return BK_WSHARE_FAILED;
		}
		*fd = d;
		*blob = xmalloc(s->len ? s->len : 1);
		memcpy(*blob, s->blob, s->len);
		*len = s->len;
		*pid = (long)getpid();
		return BK_WSHARE_IMPORTED;
	}
	if (s->lockfd < 0)
		s->lockfd = open(s->lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (s->lockfd < 0) {
		*why = "cannot open the rendezvous lock file";
		return BK_WSHARE_FAILED;
	}
	for (int tries = 0;; tries++) {
		int r = ask(s, fd, blob, len, pid, why);
		if (r > 0) { /* kept for another load of it in this process */
			s->fd = fcntl(*fd, F_DUPFD_CLOEXEC, 0);
			s->blob = xmalloc(*len ? *len : 1);
			memcpy(s->blob, *blob, *len);
			s->len = *len;
		}
		if (r)
			return r > 0 ? BK_WSHARE_IMPORTED : BK_WSHARE_FAILED;
		if (!flock(s->lockfd, LOCK_EX | LOCK_NB)) { /* invariant 2 */
			s->locked = 1;
			return BK_WSHARE_LOAD;
		}
		if (errno != EWOULDBLOCK && errno != EINTR) {
			*why = "cannot lock the rendezvous lock file";
			return BK_WSHARE_FAILED;
		}
		if (tries == 50)
			note("waiting for the shared copy of the weights (another stage loads it)");
		struct timespec ts = {0, 20 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
}
