/* heap.h - giving memory back after large requests.
 *
 * glibc keeps what a request freed in its arenas (one per thread, up to
 * eight per core) for the next allocation, and grows its mmap threshold
 * after each large free: a burst of 1 MiB JSON bodies left llm-server at
 * 4 GB and llm-router at 2 GB long after it ended. llm_heap_tune keeps one
 * arena (malloc_trim cannot give back the top of the others) and fixes the
 * threshold (large buffers are always mapped, so freeing them unmaps
 * them); llm_heap_after gives the freed pages back once a large request is
 * done.
 *
 * Thread-safety: any thread. */
#ifndef LLM_HEAP_H
#define LLM_HEAP_H

#include <stddef.h>

/* A request of at least this many bytes of input is large: the last large
 * one of a burst to end trims the heap. */
#define LLM_HEAP_TRIM_AT ((size_t)256 << 10)

/* Call once at the start of a program that serves requests. */
void llm_heap_tune(void);
/* A request with bytes of input begins, and (after) ends with its memory
 * freed; every before needs its after, with the same bytes. */
void llm_heap_before(size_t bytes);
void llm_heap_after(size_t bytes);

#endif
