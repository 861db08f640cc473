/* threadpool.h - persistent worker threads for the CPU backend.
 *
 * tp_run hands one function to every thread (the caller is thread 0) and
 * returns when all have finished. Workers spin briefly between runs, since
 * a forward pass issues runs back to back, then sleep on a condition variable.
 * Workers are named llm-cpu-1..N-1 (per-thread CPU time in bench-load).
 * Ownership: caller frees with tp_free (accepts NULL). Thread-safety: one
 * thread at a time may call tp_run on a pool. */
#ifndef LLM_CPU_THREADPOOL_H
#define LLM_CPU_THREADPOOL_H

#include "llm/status.h"

typedef void (*tp_fn)(void *arg, int ith, int nth);
typedef struct tp_pool tp_pool;

llm_status tp_new(int n_threads, tp_pool **out, llm_error *err);
int tp_size(const tp_pool *p);
void tp_run(tp_pool *p, tp_fn fn, void *arg);
void tp_free(tp_pool *p);

/* Splits [0, n) into nth near-equal ranges; range ith is [*lo, *hi). */
static inline void tp_range(long n, int ith, int nth, long *lo, long *hi)
{
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

#endif
