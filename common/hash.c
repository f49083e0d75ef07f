/* hash.c - see hash.h. */
#include "hash.h"
#include "files.h"

#include <stdio.h>
#include <xxhash.h>

uint64_t bk_hash(const void *data, size_t len, uint64_t seed)
{
	return XXH3_64bits_withSeed(data, len, seed);
}

void bk_hash_hex(uint64_t h, char out[17])
{
	snprintf(out, 17, "%016llx", (unsigned long long)h);
}

uint64_t bk_hash_file(const char *path)
{
	bk_map m = bk_map_file(path);
	uint64_t h = XXH3_64bits(m.data, m.len);
	bk_unmap(&m);
	return h;
}
