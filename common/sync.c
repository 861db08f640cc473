/* sync.c - monotonic waits and the stoppable worker (llm/sync.h). */
#include "llm/sync.h"

#include "llm/thread.h"

int llm_sync_cond_init(pthread_cond_t *c)
{
    pthread_condattr_t a;
    int rc = pthread_condattr_init(&a);
    if (rc)
        return rc;
    if (!(rc = pthread_condattr_setclock(&a, CLOCK_MONOTONIC)))
        rc = pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
    return rc;
}

struct timespec llm_sync_after_ms(long ms)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

struct timespec llm_sync_at(double mono_s)
{
    if (mono_s < 0)
        mono_s = 0;
    time_t s = (time_t)mono_s;
    long ns = (long)((mono_s - (double)s) * 1e9);
    return (struct timespec){s, ns < 0 ? 0 : ns > 999999999L ? 999999999L : ns};
}

int llm_sync_worker_init(llm_sync_worker *w)
{
    w->stop = w->started = 0;
    int rc = pthread_mutex_init(&w->mu, NULL);
    if (rc)
        return rc;
    if ((rc = llm_sync_cond_init(&w->cv)))
        pthread_mutex_destroy(&w->mu);
    return rc;
}

int llm_sync_worker_start(llm_sync_worker *w, size_t stack, void *(*fn)(void *), void *arg)
{
    int rc = llm_thread_create(&w->th, stack, fn, arg);
    w->started = !rc;
    return rc;
}

int llm_sync_worker_wait(llm_sync_worker *w, double at_s)
{
    if (w->stop)
        return 1;
    if (at_s > 0) {
        struct timespec t = llm_sync_at(at_s);
        pthread_cond_timedwait(&w->cv, &w->mu, &t);
    } else {
        pthread_cond_wait(&w->cv, &w->mu);
    }
    return w->stop;
}

void llm_sync_worker_stop(llm_sync_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    if (w->started)
        pthread_join(w->th, NULL);
    w->started = 0;
}

void llm_sync_worker_free(llm_sync_worker *w)
{
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
}
