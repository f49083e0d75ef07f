/* files.h - reading whole files, mmap, and atomic output (temporary name + rename).
 * Not a buffered I/O layer: callers use stdio on the FILE* they get. */
#ifndef BK_FILES_H
#define BK_FILES_H

#include <stdint.h>
#include <stdio.h>

/* Read a whole file ("-" = stdin) into a NUL-terminated buffer; dies naming the path. */
char *bk_read_file(const char *path, size_t *len);
/* Same but returns NULL (errno set) instead of dying. */
char *bk_try_read_file(const char *path, size_t *len);

/* Read-only mapping of a whole file; dies naming the path on failure. */
typedef struct {
	const uint8_t *data;
	size_t len;
} bk_map;
bk_map bk_map_file(const char *path);
void bk_unmap(bk_map *m);

/* A check of a file's whole bytes as a reader read them, before it parses any of them
 * (a checksum that dies naming the path on a mismatch): one read serves both. */
typedef void (*bk_bytes_check)(const char *path, const void *data, size_t len, void *ctx);

/* Atomic output file.  bk_out_open("-") gives stdout.  Otherwise the data go to
 * "PATH.tmp.PID" which bk_out_commit() fsyncs and renames to PATH; if the process
 * dies (die(), SIGINT, SIGTERM) before that, the temporary file is removed, so PATH
 * is either the old file or the complete new one.  A PATH that exists and is not a
 * regular file (/dev/null, a FIFO) is written in place. */
typedef struct bk_out bk_out;
bk_out *bk_out_open(const char *path);
FILE *bk_out_file(bk_out *o);
const char *bk_out_path(const bk_out *o);
void bk_out_commit(bk_out *o); /* flush, check errors, rename; frees o */

/* Write a whole buffer atomically to path (temporary + rename). */
void bk_write_file_atomic(const char *path, const void *data, size_t len);

/* Flush and check stdout at exit: an EPIPE means the reader went away (quiet
 * exit 0 for a filter); other errors die.  Installs SIGPIPE -> quiet exit too. */
void bk_stdout_init(void);
void bk_stdout_close(void);

/* Removes a flat directory (regular files only, as checkpoints are) and its files;
 * 0 when done or absent, -1 with errno set otherwise (never dies: safe in cleanup). */
int bk_remove_flat_dir(const char *dir);

/* One run at a time in an output directory: an exclusive flock on DIR/.NAME.lock
 * (NAME: the tool), held until the process exits, the file holding our pid.  DIR is
 * made when missing (and removed at exit when the run left it empty).  Another run
 * holding it: dies "WHAT DIR is in use by another NAME run (pid P)".  The lock file is
 * removed at exit. */
void bk_dir_lock(const char *dir, const char *name, const char *what);

/* mkdir -p; dies on failure. */
void bk_mkdir_p(const char *path);
int bk_file_exists(const char *path);
/* path joined: dir + "/" + name (malloc'd) */
char *bk_path_join(const char *dir, const char *name);

#endif
