/* threadpool.c - spin-then-sleep worker pool (see threadpool.h). Workers
 * are named llm-cpu-1..N-1 (thread 0 is the caller). */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

/* About 50-100 us of spinning: long enough to bridge the gap between two ops
 * of one forward pass, short enough not to burn a core while idle. */
#define TP_SPIN 20000

typedef struct tp_worker {
    tp_pool *pool;
    int ith;
    pthread_t thread;
} tp_worker;

struct tp_pool {
    int n;
    tp_worker *workers; /* n - 1 of them: the caller is thread 0 */
    int n_started;
    _Atomic unsigned gen;
    _Atomic int done;
    _Atomic int stop;
    tp_fn fn;
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static int wait_for_work(tp_pool *p, unsigned seen)
{
    for (int i = 0; i < TP_SPIN; i++) {
        if (atomic_load_explicit(&p->gen, memory_order_acquire) != seen)
            return 1;
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
    return 1;
}

static void *worker_main(void *a)
{
    tp_worker *w = a;
    tp_pool *p = w->pool;
    unsigned seen = 0;
    char name[16];
    snprintf(name, sizeof name, "llm-cpu-%d", w->ith); /* bench-load's CPU split by thread */
    (void)pthread_setname_np(pthread_self(), name);     /* a name is only a label: a failure changes nothing */
    for (;;) {
        wait_for_work(p, seen);
        if (atomic_load(&p->stop))
            return NULL;
        seen = atomic_load_explicit(&p->gen, memory_order_acquire);
        p->fn(p->arg, w->ith, p->n);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

llm_status tp_new(int n_threads, tp_pool **out, llm_error *err)
{
    *out = NULL;
    if (n_threads < 1 || n_threads > 1024)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "threads: %d not in 1..1024", n_threads);
    tp_pool *p = calloc(1, sizeof *p);
    if (!p)
        return llm_errf(err, LLM_ERR_NOMEM, "threads: no memory for pool");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->workers = calloc((size_t)n_threads, sizeof *p->workers);
    if (!p->workers) {
        tp_free(p);
        return llm_errf(err, LLM_ERR_NOMEM, "threads: no memory for %d workers", n_threads);
    }
    for (int i = 1; i < n_threads; i++) {
        p->workers[i].pool = p;
        p->workers[i].ith = i;
        int rc = pthread_create(&p->workers[i].thread, NULL, worker_main, &p->workers[i]);
        if (rc) {
            tp_free(p);
            return llm_errf(err, LLM_ERR_BACKEND, "threads: pthread_create failed: %s", strerror(rc));
        }
        p->n_started = i;
    }
    *out = p;
    return LLM_OK;
}

int tp_size(const tp_pool *p) { return p->n; }

void tp_run(tp_pool *p, tp_fn fn, void *arg)
{
    if (p->n == 1) {
        fn(arg, 0, 1);
        return;
    }
    p->fn = fn;
    p->arg = arg;
    atomic_store(&p->done, 0);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->gen, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(arg, 0, p->n);
    while (atomic_load_explicit(&p->done, memory_order_acquire) != p->n - 1)
        cpu_relax();
}

void tp_free(tp_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i <= p->n_started; i++)
        pthread_join(p->workers[i].thread, NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p->workers);
    free(p);
}
