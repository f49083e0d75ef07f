/* bench_bpe.c - tokenizer.json BPE throughput, single-threaded: every line of a text
 * file encoded as HF's encode(line, add_special_tokens=False) (bench/hf_tokenize.py does
 * the same with HF tokenizers).  Prints "bpe: N lines, B bytes, T tokens, S s encode,
 * L s load, X MB/s, Y tokens/s, ids C": C a checksum of all ids in order,
 * h = h * 1000003 + id (mod 2^64), which hf_tokenize.py prints too.
 * usage: bench_bpe TOKENIZER_JSON TEXT_FILE */
#include "common/diag.h"
#include "common/files.h"
#include "formats/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	bk_diag_init(argv[0]);
	if (argc != 3)
		die_usage("usage: bench_bpe TOKENIZER_JSON TEXT_FILE");
	double t0 = now();
	bk_tok *t = bk_tok_open(argv[1]);
	double t1 = now();
	size_t len;
	char *text = bk_read_file(argv[2], &len);
	size_t lines = 0, tokens = 0;
	uint64_t h = 0;
	double t2 = now();
	for (char *p = text, *end = text + len; p < end;) {
		char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		int32_t *ids;
		size_t k;
		bk_tok_encode(t, p, n, &ids, &k);
		for (size_t i = 0; i < k; i++)
			h = h * 1000003u + (uint64_t)ids[i];
		tokens += k;
		lines++;
		free(ids);
		p += n + 1;
	}
	double t3 = now();
	printf("bpe: %zu lines, %zu bytes, %zu tokens, %.3f s encode, %.3f s load, %.2f MB/s, %.0f tokens/s, ids %016llx\n",
	       lines, len, tokens, t3 - t2, t1 - t0, (double)len / 1e6 / (t3 - t2),
	       (double)tokens / (t3 - t2), (unsigned long long)h);
	free(text);
	bk_tok_free(t);
	return 0;
}
