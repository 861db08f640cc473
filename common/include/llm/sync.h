/* sync.h - waiting done one way: condition variables whose timed waits
 * count on the monotonic clock (a wait must not end early or late when the
 * time of day is stepped), deadlines on that clock, and the stoppable
 * worker thread (a loop that sleeps until woken, stopped or due, and is
 * stopped and joined by its owner).
 *
 * Ownership: caller-owned structs. Thread-safety: an llm_sync_worker's fields
 * other than its lock are read and written under w->mu; llm_sync_worker_stop
 * from one thread (the owner), once. */
#ifndef LLM_SYNC_H
#define LLM_SYNC_H

#include <pthread.h>
#include <stddef.h>
#include <time.h>

/* pthread_cond_init for waits on CLOCK_MONOTONIC: 0, or an errno value. */
int llm_sync_cond_init(pthread_cond_t *c);
/* The monotonic time ms milliseconds from now, for pthread_cond_timedwait on such a condition. */
struct timespec llm_sync_after_ms(long ms);
/* A llm_clock_mono_s() time as the same. */
struct timespec llm_sync_at(double mono_s);

typedef struct llm_sync_worker {
    pthread_mutex_t mu;
    pthread_cond_t cv;  /* monotonic */
    pthread_t th;
    int stop;           /* under mu: the owner asked the loop to end */
    int started;
} llm_sync_worker;

/* The lock and the condition: 0, or an errno value (nothing to free then). */
int llm_sync_worker_init(llm_sync_worker *w);
/* Starts fn(arg) on a thread of stack bytes (llm_thread_create): 0 or an errno value. */
int llm_sync_worker_start(llm_sync_worker *w, size_t stack, void *(*fn)(void *), void *arg);
/* Called with w->mu held: sleeps until woken, stopped or the monotonic time
 * at_s (<= 0: no deadline). Returns w->stop. */
int llm_sync_worker_wait(llm_sync_worker *w, double at_s);
/* Asks the loop to end, wakes it and joins the thread (when started). The
 * loop must see w->stop within its waits. */
void llm_sync_worker_stop(llm_sync_worker *w);
/* Destroys the lock and the condition (after llm_sync_worker_stop). */
void llm_sync_worker_free(llm_sync_worker *w);

#endif
