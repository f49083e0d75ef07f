/* rng.h - deterministic random numbers.
 * bk_rng: a seeded sequential generator (xoshiro256**) for shuffles and init.
 * bk_crng: counter-based: the value for (key, counter) is a pure function, so a
 * sampled trajectory does not depend on batch composition or order. */
#ifndef BK_RNG_H
#define BK_RNG_H

#include <stdint.h>

typedef struct {
	uint64_t s[4];
} bk_rng;

void bk_rng_seed(bk_rng *r, uint64_t seed);
uint64_t bk_rng_u64(bk_rng *r);
double bk_rng_uniform(bk_rng *r);             /* [0, 1) with 53 bits */
uint64_t bk_rng_below(bk_rng *r, uint64_t n); /* uniform in [0, n), unbiased */

uint64_t bk_mix64(uint64_t x); /* splitmix64 finaliser */
/* Key from up to four words, e.g. (seed, record id, trajectory, epoch). */
uint64_t bk_crng_key(uint64_t a, uint64_t b, uint64_t c, uint64_t d);
/* Uniform [0,1) for (key, counter): a pure function of its arguments. */
double bk_crng_uniform(uint64_t key, uint64_t counter);

#endif
