/* hash.h - xxHash helpers: content keys, stream checksums, file fingerprints. */
#ifndef BK_HASH_H
#define BK_HASH_H

#include <stddef.h>
#include <stdint.h>

uint64_t bk_hash(const void *data, size_t len, uint64_t seed); /* XXH3-64 */
/* 16 lowercase hex digits + NUL */
void bk_hash_hex(uint64_t h, char out[17]);
/* XXH3-64 of a whole file's bytes (mmapped); dies naming the path on failure. */
uint64_t bk_hash_file(const char *path);

#endif
