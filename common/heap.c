/* heap.c - glibc's allocator told to give memory back; see llm/heap.h. */
#include "llm/heap.h"

#include <malloc.h>

/* Allocations from this size on are mapped on their own: the default
 * threshold, but fixed (glibc raises it after each large free otherwise,
 * and the next large buffers then stay in the arena). */
enum { MMAP_AT = 128 << 10 };

static int large; /* atomic: large requests between llm_heap_before and llm_heap_after */

void llm_heap_tune(void)
{
    /* one arena: glibc's malloc_trim gives back the free pages inside every
     * arena but the top of a thread's own arena, which is where all of a
     * freed request ends up once its thread's cache is flushed (64 parses of
     * 1 MiB at once left ~29 MB in each of 16 arenas; with one, none). The
     * threads' caches keep most allocations off the arena's lock: 16
     * clients of small chat requests ran 2,305-2,356 req/s with the default
     * arenas, 2,383-2,607 with one. */
    mallopt(M_ARENA_MAX, 1);
    mallopt(M_MMAP_THRESHOLD, MMAP_AT);
}

void llm_heap_before(size_t bytes)
{
    if (bytes >= LLM_HEAP_TRIM_AT)
        __atomic_add_fetch(&large, 1, __ATOMIC_ACQ_REL);
}

void llm_heap_after(size_t bytes)
{
    /* the last large request of a burst trims: a trim holds the arena's lock while it walks it, so one in the
     * middle of a burst would stall every other request's allocations */
    if (bytes >= LLM_HEAP_TRIM_AT && !__atomic_sub_fetch(&large, 1, __ATOMIC_ACQ_REL))
        malloc_trim(0); /* the arena's free pages, and its top */
}
