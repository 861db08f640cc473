/* heap.h - giving memory back after large requests.
 *
 * glibc keeps what a request freed in its arenas (one per thread, up to
 * eight per core) for the next allocation, and grows its mmap threshold
 * after each large free: a burst of 1 MiB JSON bodies left llm-server at
 * 4 GB and llm-router at 2 GB long after it ended. llm_heap_tune keeps one
 * arena (malloc_trim cannot give back the top of the others), fixes the
 * threshold (large buffers are always mapped, so freeing them unmaps them)
 * and starts a thread that trims the heap shortly after large requests
 * end: at most every 200 ms, and always once after the last of a burst.
 *
 * Thread-safety: any thread. */
#ifndef LLM_HEAP_H
#define LLM_HEAP_H

#include <stddef.h>

#include "llm/status.h"

/* A request of at least this many bytes of input is large: its end asks
 * for a trim. */
#define LLM_HEAP_TRIM_AT ((size_t)256 << 10)

/* Call once, at the start of a program that serves requests (before its
 * other threads). LLM_ERR_INTERNAL naming the cause when glibc refuses a
 * setting or the trimming thread cannot start. */
llm_status llm_heap_tune(llm_error *err);
/* A request with bytes of input has ended and freed its memory: asks for
 * a trim when bytes >= LLM_HEAP_TRIM_AT (nothing before llm_heap_tune). */
void llm_heap_after(size_t bytes);

#endif
