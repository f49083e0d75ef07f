/* bench_stream.c - stream write and read throughput (MB/s) on records shaped like
 * bk-tokenize's: an id, a text, and three id arrays.  Usage: bench_stream FILE [N] */
#include "common/diag.h"
#include "formats/stream.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	if (argc < 2)
		die_usage("usage: bench_stream FILE [N]");
	long n = argc > 2 ? atol(argv[2]) : 200000;
	int32_t ids[512];
	for (int i = 0; i < 512; i++)
		ids[i] = (i * 7919) % 32000;
	double t0 = now();
	bk_writer *w = bk_writer_open(argv[1]);
	bk_writer_header(w, NULL, NULL, 0);
	for (long i = 0; i < n; i++) {
		msgpack_packer *pk = bk_rec_begin(w);
		bk_rec_key(w, "id");
		bk_pack_str(pk, "0123456789abcdef");
		bk_rec_key(w, "user");
		bk_pack_str(pk, "Once upon a time there was a little dragon who lived in a castle.");
		bk_rec_key(w, "t_prompt");
		bk_pack_ids(pk, ids, 64 + (size_t)(i % 128));
		bk_rec_key(w, "s_prompt");
		bk_pack_ids(pk, ids, 16 + (size_t)(i % 32));
		bk_rec_key(w, "resp");
		bk_pack_ids(pk, ids, 128);
		bk_rec_end(w);
	}
	bk_writer_close(w);
	double t1 = now();
	bk_reader *r = bk_reader_open(argv[1]);
	int32_t *buf = NULL;
	size_t cap = 0, tok = 0, k;
	const msgpack_object *rec;
	while ((rec = bk_reader_next(r))) {
		tok += bk_rec_ids(r, rec, "t_prompt", &buf, &cap);
		tok += bk_rec_ids(r, rec, "resp", &buf, &cap);
		bk_rec_ids_opt(r, rec, "s_prompt", &buf, &cap, &k);
		tok += k;
	}
	bk_reader_close(r);
	double t2 = now();
	struct stat st;
	stat(argv[1], &st);
	double mb = (double)st.st_size / 1e6;
	printf("stream: %ld records, %.1f MB, %zu ids: write %.0f MB/s, read+validate %.0f MB/s\n", n,
	       mb, tok, mb / (t1 - t0), mb / (t2 - t1));
	free(buf);
	return 0;
}
