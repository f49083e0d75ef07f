/* wshare.h - one copy of the frozen weights per GPU, the host half: the processes that
 * want the same copy (a key naming the device, the model's fingerprint, the dtype and
 * the layout version) meet at a Unix socket, and whoever holds the copy passes its file
 * descriptor (SCM_RIGHTS) and a description of it (an opaque blob: gpu/load.c writes
 * the layout) to the others.  No CUDA here: gpu/cuda/cuda_vmm.h makes and maps the
 * descriptor; any file descriptor passes.
 *
 * Rendezvous: in $XDG_RUNTIME_DIR/bakery, else /tmp/bakery-UID (a directory of mode
 * 0700 owned by the user; anything else and sharing is off), per key a lock file
 * w-HASH.lock and a socket w-HASH.sock.  The server holds flock on the lock file.
 *
 * The server is a holder process the loader forks (twice: no child of the stage's), with
 * nothing of the stage's open but the copy's descriptor, the lock and its sockets: the
 * copy outlives the stage that loaded it, for the next stage of the pipe (bk-gen exits
 * before bk-step loads: bk-step reads its input first).  Every process it served, and
 * the loader, keeps a connection to it open while it lives; the holder exits when none
 * is open and either no process of the loader's process group (the pipe, or the script)
 * is left or none has come for BK_SHARE_LINGER seconds (default 10).  BK_SHARE_HOLDER=0,
 * or a failed fork: the loader serves from a thread while it lives.
 *
 * Invariants:
 *  1. Whoever holds the lock serves the copy or is loading it; a joiner that finds no
 *     server and gets the lock loads its own copy and serves it (none is held, or the
 *     holder was killed: the processes mapping the old copy keep it); one that finds
 *     the lock held and no server waits (the holder is loading).
 *  2. A mapping never depends on the server: the driver counts every mapping, handle and
 *     descriptor, so a kill -9 of the loader, the holder or any stage breaks no other.
 *  3. The key is checked by the server on every request: a stale or foreign socket
 *     never hands out another model's copy.  Descriptors are close-on-exec. */
#ifndef BK_WSHARE_H
#define BK_WSHARE_H

#include <stddef.h>

enum bk_wshare_role {
	BK_WSHARE_FAILED = 0, /* cannot share: load an own copy (why says why) */
	BK_WSHARE_IMPORTED,   /* *fd and *blob from the server */
	BK_WSHARE_LOAD,       /* no one holds a copy: load it, then bk_wshare_serve */
};

/* Joins the copy of key (text without NUL bytes).  IMPORTED: *fd (the caller's) and the
 * server's blob (*blob malloc'd, *len bytes), *pid the server's process.  LOAD: this
 * process holds the lock.  FAILED: *why (static text). */
int bk_wshare_join(const char *key, int *fd, void **blob, size_t *len, long *pid,
		   const char **why);
/* After LOAD: serves fd (kept open) and blob (copied) under key, from the holder or a
 * thread.  Nothing after an import or when the lock is not this process's. */
void bk_wshare_serve(const char *key, int fd, const void *blob, size_t len);

/* Gives up the lock after LOAD when this process could not make the copy after all
 * (the others then load their own). */
void bk_wshare_abandon(const char *key);

/* Is sharing on?  Off with bk_wshare_off set (a tool's --no-share-weights) or the
 * environment BK_SHARE_WEIGHTS=0. */
extern int bk_wshare_off;
int bk_wshare_enabled(void);

#endif
