/* test_stream.c - record streams: round trip, pass-through, provenance, and every
 * kind of damage (truncation at each byte, flipped bytes, bad trailer). */
#include "common/diag.h"
#include "formats/stream.h"
#include "tests/harness.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/bk-test-stream.XXXXXX";

static char *path_of(const char *name) { return xasprintf("%s/%s", tmpdir, name); }

static void write_stream(const char *path, int nrec)
{
	bk_writer *w = bk_writer_open(path);
	bk_kv kv[] = {BK_KV_S("tokenizer", "00112233aabbccdd"), BK_KV_D("temperature", 1.5)};
	bk_writer_header(w, NULL, kv, 2);
	for (int i = 0; i < nrec; i++) {
		msgpack_packer *pk = bk_rec_begin(w);
		bk_rec_key(w, "id");
		msgpack_pack_int(pk, i);
		bk_rec_key(w, "t_prompt");
		int32_t ids[5] = {1, 2, i, 40000, 7};
		bk_pack_ids(pk, ids, (size_t)(i % 5) + 1);
		bk_rec_key(w, "user");
		bk_pack_str(pk, "héllo wörld");
		bk_rec_key(w, "blob");
		msgpack_pack_bin(pk, 3);
		msgpack_pack_bin_body(pk, "\x00\x01\x02", 3);
		bk_rec_end(w);
	}
	bk_writer_close(w);
}

/* Reads the whole stream in a child; returns its exit status and stderr text. */
static int read_child(const char *path, char *err, size_t errcap)
{
	int p[2];
	if (pipe(p))
		abort();
	pid_t pid = fork();
	if (pid == 0) {
		dup2(p[1], 2);
		close(p[0]);
		bk_reader *r = bk_reader_open(path);
		while (bk_reader_next(r))
			;
		bk_reader_close(r);
		_exit(0);
	}
	close(p[1]);
	size_t n = 0;
	ssize_t k;
	while (n + 1 < errcap && (k = read(p[0], err + n, errcap - 1 - n)) > 0)
		n += (size_t)k;
	err[n] = 0;
	close(p[0]);
	int st;
	waitpid(pid, &st, 0);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void test_roundtrip(void)
{
	char *p = path_of("a.bk");
	write_stream(p, 1000);
	bk_reader *r = bk_reader_open(p);
	const msgpack_object *rec;
	int i = 0;
	int32_t *ids = NULL;
	size_t cap = 0;
	while ((rec = bk_reader_next(r))) {
		CHECK(bk_rec_int(r, rec, "id") == i, "id %d", i);
		size_t n = bk_rec_ids(r, rec, "t_prompt", &ids, &cap);
		CHECK(n == (size_t)(i % 5) + 1 && ids[0] == 1 && (n < 4 || ids[3] == 40000),
		      "ids of record %d", i);
		char *u = bk_rec_str_opt(r, rec, "user");
		CHECK(u && !strcmp(u, "héllo wörld"), "user text");
		free(u);
		i++;
	}
	CHECK(i == 1000, "read %d records", i);
	char *tok = bk_reader_prov_str(r, "tokenizer");
	CHECK(tok && !strcmp(tok, "00112233aabbccdd"), "provenance tokenizer");
	free(tok);
	bk_reader_close(r);
	free(ids);
	free(p);
}

static void test_passthrough(void)
{
	char *a = path_of("a.bk"), *b = path_of("b.bk");
	bk_reader *r = bk_reader_open(a);
	bk_writer *w = bk_writer_open(b);
	bk_kv kv[] = {BK_KV_I("window", 8)};
	bk_writer_header(w, r, kv, 1);
	const msgpack_object *rec;
	static const char *const skip[] = {"user", NULL};
	while ((rec = bk_reader_next(r))) {
		msgpack_packer *pk = bk_rec_begin(w);
		bk_rec_copy(w, rec, skip);
		bk_rec_key(w, "user");
		bk_pack_str(pk, "replaced");
		bk_rec_key(w, "new_field");
		msgpack_pack_true(pk);
		bk_rec_end(w);
	}
	bk_reader_close(r);
	bk_writer_close(w);
	r = bk_reader_open(b);
	CHECK(bk_reader_provenance(r)->size == 2, "two provenance entries, got %u",
	      bk_reader_provenance(r)->size);
	int n = 0;
	while ((rec = bk_reader_next(r))) {
		const msgpack_object *blob = bk_obj_get(rec, "blob");
		CHECK(blob && blob->type == MSGPACK_OBJECT_BIN && blob->via.bin.size == 3,
		      "unknown field passed through");
		CHECK(bk_obj_is(bk_obj_get(rec, "user"), "replaced"), "replaced field");
		CHECK(bk_obj_get(rec, "new_field") != NULL, "new field");
		n++;
	}
	CHECK(n == 1000, "count %d", n);
	bk_reader_close(r);
	free(a);
	free(b);
}

static void test_damage(void)
{
	char *p = path_of("small.bk"), *d = path_of("damaged.bk");
	write_stream(p, 20);
	size_t len;
	FILE *f = fopen(p, "rb");
	char *buf = xmalloc(1 << 16);
	len = fread(buf, 1, 1 << 16, f);
	fclose(f);
	char err[4096];
	/* every truncation point fails with a message */
	int trunc_ok = 1, flip_ok = 1;
	for (size_t cut = 0; cut < len; cut++) {
		f = fopen(d, "wb");
		fwrite(buf, 1, cut, f);
		fclose(f);
		int st = read_child(d, err, sizeof err);
		if (st != 1 || !(strstr(err, "truncated") || strstr(err, "empty stream") ||
				 strstr(err, "not a bakery stream") || strstr(err, "corrupt"))) {
			trunc_ok = 0;
			fprintf(stderr, "cut at %zu: status %d: %s\n", cut, st, err);
			break;
		}
	}
	CHECK(trunc_ok, "every truncation detected");
	/* every single flipped byte (bit 0x10) fails; never crashes */
	for (size_t pos = 0; pos < len; pos++) {
		char save = buf[pos];
		buf[pos] ^= 0x10;
		f = fopen(d, "wb");
		fwrite(buf, 1, len, f);
		fclose(f);
		buf[pos] = save;
		int st = read_child(d, err, sizeof err);
		if (st != 1 || strchr(err, '\n') != err + strlen(err) - 1) {
			flip_ok = 0;
			fprintf(stderr, "flip at %zu: status %d: %s\n", pos, st, err);
			break;
		}
	}
	CHECK(flip_ok, "every flipped byte detected with a one-line error");
	/* trailing garbage */
	f = fopen(d, "wb");
	fwrite(buf, 1, len, f);
	fputc(0xc0, f);
	fclose(f);
	CHECK(read_child(d, err, sizeof err) == 1 && strstr(err, "after the trailer"), "%s", err);
	/* the intact file reads */
	CHECK(read_child(p, err, sizeof err) == 0, "intact: %s", err);
	free(buf);
	free(p);
	free(d);
}

static void test_expect(void)
{
	char *p = path_of("small.bk");
	bk_reader *r = bk_reader_open(p);
	bk_reader_expect(r, "tokenizer", "00112233aabbccdd", "tokenizer"); /* same: passes */
	bk_reader_expect(r, "model", "whatever", "model");                 /* absent: passes */
	bk_reader_close(r);
	int pfd[2];
	if (pipe(pfd))
		abort();
	pid_t pid = fork();
	if (pid == 0) {
		dup2(pfd[1], 2);
		bk_reader *r2 = bk_reader_open(p);
		bk_reader_expect(r2, "tokenizer", "ffff", "tokenizer");
		_exit(0);
	}
	close(pfd[1]);
	char err[512] = {0};
	ssize_t k = read(pfd[0], err, sizeof err - 1);
	(void)k;
	int st;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(err, "another tokenizer"), "%s",
	      err);
	close(pfd[0]);
	free(p);
}

int main(void)
{
	if (!mkdtemp(tmpdir))
		abort();
	test_roundtrip();
	test_passthrough();
	test_damage();
	test_expect();
	char *cmd = xasprintf("rm -rf %s", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "cleanup failed\n");
	free(cmd);
	return bk_test_done("test_stream");
}
