/* rng.c - see rng.h. */
#include "rng.h"

uint64_t bk_mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

void bk_rng_seed(bk_rng *r, uint64_t seed)
{
	uint64_t x = seed;
	for (int i = 0; i < 4; i++) {
		x = bk_mix64(x);
		r->s[i] = x;
	}
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t bk_rng_u64(bk_rng *r)
{
	uint64_t *s = r->s;
	uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return out;
}

double bk_rng_uniform(bk_rng *r) { return (double)(bk_rng_u64(r) >> 11) * 0x1.0p-53; }

uint64_t bk_rng_below(bk_rng *r, uint64_t n)
{
	if (n <= 1)
		return 0;
	uint64_t lim = -n % n; /* 2^64 mod n */
	for (;;) {
		uint64_t x = bk_rng_u64(r);
		if (x >= lim)
			return x % n;
	}
}

uint64_t bk_crng_key(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
	uint64_t h = bk_mix64(a);
	h = bk_mix64(h ^ b);
	h = bk_mix64(h ^ c);
	return bk_mix64(h ^ d);
}

double bk_crng_uniform(uint64_t key, uint64_t counter)
{
	uint64_t x = bk_mix64(bk_mix64(key ^ bk_mix64(counter)) + counter);
	return (double)(x >> 11) * 0x1.0p-53;
}
