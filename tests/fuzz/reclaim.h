/* reclaim.h - lets a libFuzzer target end a run that die()d without leaking it.
 * die() calls bk_die_hook, which longjmp()s back to the fuzz entry; everything the
 * abandoned run had allocated is then unreachable.  Through AddressSanitizer's malloc
 * hooks this file records the blocks the fuzz thread allocates during a run and, on
 * the die() path only, frees the ones still live, so a long campaign does not grow
 * until it hits -rss_limit_mb.  Not a leak checker: a successful run's leftovers are
 * only forgotten (LeakSanitizer judges those).  Header-only; one include per target. */
#ifndef BK_FUZZ_RECLAIM_H
#define BK_FUZZ_RECLAIM_H

#include "common/diag.h"

#include <pthread.h>
#include <sanitizer/allocator_interface.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>

#define RECLAIM_SLOTS (1u << 18) /* live blocks one run may own; more: stop tracking */

static const void *reclaim_ptr[RECLAIM_SLOTS]; /* open addressing; tombstone below */
static uint32_t reclaim_used[RECLAIM_SLOTS];   /* slots touched this run, for clearing */
static size_t reclaim_nused;
static int reclaim_active, reclaim_overflow;
static pthread_t reclaim_thread;
static jmp_buf reclaim_jmp;
static const char reclaim_tomb;

static uint32_t reclaim_slot(const void *p)
{
	uint64_t h = (uint64_t)(uintptr_t)p * 0x9e3779b97f4a7c15ull;
	return (uint32_t)(h >> 40) & (RECLAIM_SLOTS - 1);
}

static void reclaim_on_malloc(const volatile void *vp, size_t size)
{
	(void)size;
	if (!reclaim_active || !pthread_equal(pthread_self(), reclaim_thread) || !vp)
		return;
	const void *p = (const void *)vp;
	if (reclaim_nused + 1 >= RECLAIM_SLOTS / 2) {
		reclaim_overflow = 1;
		return;
	}
	uint32_t i = reclaim_slot(p);
	while (reclaim_ptr[i] && reclaim_ptr[i] != &reclaim_tomb)
		i = (i + 1) & (RECLAIM_SLOTS - 1);
	if (!reclaim_ptr[i])
		reclaim_used[reclaim_nused++] = i;
	reclaim_ptr[i] = p;
}

static void reclaim_on_free(const volatile void *vp)
{
	if (!reclaim_active || !pthread_equal(pthread_self(), reclaim_thread) || !vp)
		return;
	const void *p = (const void *)vp;
	uint32_t i = reclaim_slot(p);
	while (reclaim_ptr[i] && reclaim_ptr[i] != p)
		i = (i + 1) & (RECLAIM_SLOTS - 1);
	if (reclaim_ptr[i] == p)
		reclaim_ptr[i] = &reclaim_tomb; /* a block from before the run is simply absent */
}

static void reclaim_die_hook(void) { longjmp(reclaim_jmp, 1); }

/* From LLVMFuzzerInitialize: main thread, before libFuzzer starts others. */
static void reclaim_init(void)
{
	reclaim_thread = pthread_self();
	if (!__sanitizer_install_malloc_and_free_hooks(reclaim_on_malloc, reclaim_on_free))
		abort();
	bk_die_hook = reclaim_die_hook;
}

static void reclaim_begin(void)
{
	reclaim_nused = 0;
	reclaim_overflow = 0;
	reclaim_active = 1;
}

/* End of a run.  died: free every block the run allocated and did not free (call it
 * after closing anything registered globally, such as a FILE from fmemopen). */
static void reclaim_end(int died)
{
	reclaim_active = 0;
	for (size_t k = 0; k < reclaim_nused; k++) {
		uint32_t i = reclaim_used[k];
		if (died && !reclaim_overflow && reclaim_ptr[i] != &reclaim_tomb)
			free((void *)reclaim_ptr[i]);
		reclaim_ptr[i] = NULL;
	}
	reclaim_nused = 0;
}

#endif
