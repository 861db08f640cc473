/* heap.c - glibc's allocator told to give memory back; see llm/heap.h.
 *
 * The trim runs on a thread of its own, TRIM_AFTER_MS after a large
 * request ends (the requests ending meanwhile share it): a burst is
 * trimmed once, just after it, and a steady run of large requests at most
 * every TRIM_AFTER_MS, whatever the number of requests in flight (a trim
 * holds the arena's lock while it walks it). */
#include "llm/heap.h"
#include "llm/sync.h"

#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

/* Allocations from this size on are mapped on their own: the default
 * threshold, but fixed (glibc raises it after each large free otherwise,
 * and the next large buffers then stay in the arena). */
enum { MMAP_AT = 128 << 10, TRIM_AFTER_MS = 200 };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake;  /* CLOCK_MONOTONIC; set up by llm_heap_tune */
static int pending;          /* under mu: a large request ended since the last trim began */
static int running;          /* the trimming thread is started */

static void *trimmer(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    for (;;) {
        while (!pending)
            pthread_cond_wait(&wake, &mu);
        struct timespec at = llm_sync_after_ms(TRIM_AFTER_MS);
        while (pthread_cond_timedwait(&wake, &mu, &at) != ETIMEDOUT) {} /* the others ending meanwhile join this one */
        pending = 0;
        pthread_mutex_unlock(&mu);
        malloc_trim(0); /* the arena's free pages, and its top */
        pthread_mutex_lock(&mu);
    }
    return NULL;
}

llm_status llm_heap_tune(llm_error *err)
{
    /* one arena: glibc's malloc_trim gives back the free pages inside every
     * arena but the top of a thread's own arena, which is where all of a
     * freed request ends up once its thread's cache is flushed (64 parses of
     * 1 MiB at once left ~29 MB in each of 16 arenas; with one, none). The
     * threads' caches keep most allocations off the arena's lock: 16
     * clients of small chat requests ran 2,305-2,356 req/s with the default
     * arenas, 2,383-2,607 with one. */
    if (!mallopt(M_ARENA_MAX, 1) || !mallopt(M_MMAP_THRESHOLD, MMAP_AT))
        return llm_errf(err, LLM_ERR_INTERNAL, "mallopt refused the heap's settings");
    pthread_t t;
    int rc = llm_sync_cond_init(&wake);
    if (!rc && !(rc = pthread_create(&t, NULL, trimmer, NULL)))
        rc = pthread_detach(t); /* it lives as long as the process */
    if (rc)
        return llm_errf(err, LLM_ERR_INTERNAL, "cannot start the heap trimmer: %s", strerror(rc));
    __atomic_store_n(&running, 1, __ATOMIC_RELEASE);
    return LLM_OK;
}

void llm_heap_after(size_t bytes)
{
    if (bytes < LLM_HEAP_TRIM_AT || !__atomic_load_n(&running, __ATOMIC_ACQUIRE))
        return;
    pthread_mutex_lock(&mu);
    pending = 1;
    pthread_cond_signal(&wake);
    pthread_mutex_unlock(&mu);
}
