/* ctl_queue.c - the work queue: items in an array (a free list reuses
 * the slots of forgotten keys), a chained hash index over them and a
 * binary heap of the queued ones by due time; see ctl_queue.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "ctl_queue.h"
#include "llm/clock.h"
#include "llm/sync.h"

#define NONE ((size_t)-1)

typedef struct qitem {
    char key[CTL_KEY_MAX];
    double due;        /* monotonic seconds */
    int failures;
    uint64_t fp;       /* fingerprint of the object as last queued (0: none) */
    int live;          /* a known key (0: a free slot) */
    int in_flight;     /* with the worker */
    int again;         /* added while in flight: queued when done */
    int forget;        /* its object went while in flight */
    size_t heap;       /* position in the heap, NONE when not queued */
    size_t next;       /* hash chain, or the free list */
} qitem;

struct ctl_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qitem *items;
    size_t n_items, cap_items, free_head, live, max_keys;
    size_t *buckets, n_buckets; /* heads of the hash chains */
    size_t *heap, n_heap;       /* item indices, soonest first */
    int active;
    uint64_t seed;
};

/* FNV-1a from a random start, mixed: the keys are tenants' names, which
 * must not be choosable to fall into one chain. */
static uint64_t hash(const ctl_queue *q, const char *s)
{
    uint64_t h = q->seed;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

/* ---- heap ------------------------------------------------------------------------ */

static int before(ctl_queue *q, size_t a, size_t b)
{
    return q->items[q->heap[a]].due < q->items[q->heap[b]].due;
}

static void heap_swap(ctl_queue *q, size_t a, size_t b)
{
    size_t t = q->heap[a];
    q->heap[a] = q->heap[b];
    q->heap[b] = t;
    q->items[q->heap[a]].heap = a;
    q->items[q->heap[b]].heap = b;
}

static void sift(ctl_queue *q, size_t i)
{
    while (i > 0 && before(q, i, (i - 1) / 2)) {
        heap_swap(q, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < q->n_heap && before(q, l, m))
            m = l;
        if (r < q->n_heap && before(q, r, m))
            m = r;
        if (m == i)
            return;
        heap_swap(q, i, m);
        i = m;
    }
}

static void heap_remove(ctl_queue *q, size_t idx)
{
    size_t i = q->items[idx].heap;
    if (i == NONE)
        return;
    heap_swap(q, i, --q->n_heap);
    q->items[idx].heap = NONE;
    if (i < q->n_heap)
        sift(q, i);
}

/* Queues item idx due at t (an earlier due time stands). The heap has room
 * for every item (it grows with them). */
static void enqueue(ctl_queue *q, size_t idx, double t)
{
    qitem *it = &q->items[idx];
    if (it->heap != NONE) {
        if (t < it->due) {
            it->due = t;
            sift(q, it->heap);
        }
        return;
    }
    it->due = t;
    it->heap = q->n_heap;
    q->heap[q->n_heap++] = idx;
    sift(q, it->heap);
    pthread_cond_signal(&q->cv);
}

/* ---- index ----------------------------------------------------------------------- */

static size_t find(ctl_queue *q, const char *key)
{
    for (size_t i = q->buckets[hash(q, key) & (q->n_buckets - 1)]; i != NONE; i = q->items[i].next)
        if (!strcmp(q->items[i].key, key))
            return i;
    return NONE;
}

static void link_item(ctl_queue *q, size_t idx)
{
    size_t b = hash(q, q->items[idx].key) & (q->n_buckets - 1);
    q->items[idx].next = q->buckets[b];
    q->buckets[b] = idx;
}

/* Twice the buckets when the chains would grow past one item on average. */
static int grow_index(ctl_queue *q)
{
    if (q->live < q->n_buckets)
        return 0;
    size_t *b = malloc(2 * q->n_buckets * sizeof *b);
    if (!b)
        return -1;
    free(q->buckets);
    q->buckets = b;
    q->n_buckets *= 2;
    for (size_t i = 0; i < q->n_buckets; i++) b[i] = NONE;
    for (size_t i = 0; i < q->n_items; i++)
        if (q->items[i].live)
            link_item(q, i);
    return 0;
}

/* A slot for a new key: a freed one, or the array grown (with the heap). */
static size_t new_slot(ctl_queue *q)
{
    if (q->free_head != NONE) {
        size_t i = q->free_head;
        q->free_head = q->items[i].next;
        return i;
    }
    if (q->n_items == q->cap_items) {
        size_t cap = q->cap_items ? q->cap_items * 2 : 64;
        qitem *it = realloc(q->items, cap * sizeof *it);
        if (!it)
            return NONE;
        q->items = it;
        size_t *h = realloc(q->heap, cap * sizeof *h);
        if (!h)
            return NONE;
        q->heap = h;
        q->cap_items = cap;
    }
    return q->n_items++;
}

static void unlink_item(ctl_queue *q, size_t idx)
{
    size_t *p = &q->buckets[hash(q, q->items[idx].key) & (q->n_buckets - 1)];
    while (*p != idx) p = &q->items[*p].next;
    *p = q->items[idx].next;
    heap_remove(q, idx);
    q->items[idx].live = 0;
    q->items[idx].next = q->free_head;
    q->free_head = idx;
    q->live--;
}

/* ---- API ------------------------------------------------------------------------- */

llm_status ctl_queue_new(size_t max_keys, ctl_queue **out, llm_error *err)
{
    ctl_queue *q = calloc(1, sizeof *q);
    if (q)
        q->buckets = malloc(64 * sizeof *q->buckets);
    /* waits on the monotonic clock: a wall-clock jump must not stall or spin them */
    int bad = !q || !q->buckets || llm_sync_cond_init(&q->cv);
    if (bad) {
        if (q)
            free(q->buckets);
        free(q);
        return llm_errf(err, LLM_ERR_NOMEM, "work queue: no memory, or no monotonic condition variable");
    }
    pthread_mutex_init(&q->mu, NULL);
    q->n_buckets = 64;
    for (size_t i = 0; i < q->n_buckets; i++) q->buckets[i] = NONE;
    q->free_head = NONE;
    q->max_keys = max_keys;
    if (getrandom(&q->seed, sizeof q->seed, GRND_NONBLOCK) != (ssize_t)sizeof q->seed)
        q->seed = (uint64_t)llm_clock_mono_s() * 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)q; /* (entropy not ready: still varied) */
    *out = q;
    return LLM_OK;
}

void ctl_queue_free(ctl_queue *q)
{
    if (!q)
        return;
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
    free(q->items);
    free(q->heap);
    free(q->buckets);
    free(q);
}

/* Adds key (fp: its object's fingerprint, 0 for none); *skipped when fp
 * matched the one recorded. */
static llm_status add(ctl_queue *q, const char *key, double delay_s, uint64_t fp, int *skipped, llm_error *err)
{
    *skipped = 0;
    if (strlen(key) >= CTL_KEY_MAX)
        return llm_errf(err, LLM_ERR_TOO_LONG, "work queue: key of %zu bytes (at most %d)", strlen(key), CTL_KEY_MAX - 1);
    llm_status st = LLM_OK;
    pthread_mutex_lock(&q->mu);
    size_t i = find(q, key);
    if (i == NONE) {
        if (q->live >= q->max_keys) {
            st = llm_errf(err, LLM_ERR_QUEUE_FULL, "work queue: %zu keys known already; %s not queued", q->live, key);
        } else if (grow_index(q) || (i = new_slot(q)) == NONE) {
            st = llm_errf(err, LLM_ERR_NOMEM, "work queue: no memory for %s", key);
        } else {
            memset(&q->items[i], 0, sizeof q->items[i]);
            snprintf(q->items[i].key, CTL_KEY_MAX, "%s", key);
            q->items[i].live = 1;
            q->items[i].heap = NONE;
            link_item(q, i);
            q->live++;
        }
    } else if (fp && q->items[i].fp == fp) {
        *skipped = 1;
    }
    if (!st && !*skipped) {
        qitem *it = &q->items[i];
        double t = llm_clock_mono_s() + (delay_s > 0 ? delay_s : 0);
        if (fp)
            it->fp = fp;
        if (it->in_flight) { /* after the worker is done with it */
            it->forget = 0;
            it->due = it->again && it->due < t ? it->due : t;
            it->again = 1;
        } else {
            enqueue(q, i, t);
        }
    }
    pthread_mutex_unlock(&q->mu);
    return st;
}

llm_status ctl_queue_add(ctl_queue *q, const char *key, double delay_s, llm_error *err)
{
    int skipped;
    return add(q, key, delay_s, 0, &skipped, err);
}

llm_status ctl_queue_add_changed(ctl_queue *q, const char *key, uint64_t fp, int *skipped, llm_error *err)
{
    return add(q, key, 0, fp, skipped, err);
}

void ctl_queue_forget(ctl_queue *q, const char *key)
{
    pthread_mutex_lock(&q->mu);
    size_t i = find(q, key);
    if (i != NONE && q->items[i].in_flight) {
        q->items[i].forget = 1;
        q->items[i].again = 0;
    } else if (i != NONE) {
        unlink_item(q, i);
    }
    pthread_mutex_unlock(&q->mu);
}

int ctl_queue_next(ctl_queue *q, char *key, atomic_int *stop, void (*tick)(void))
{
    pthread_mutex_lock(&q->mu);
    while (!atomic_load(stop)) {
        if (tick)
            tick();
        double now = llm_clock_mono_s(), wake = now + 1;
        if (q->active && q->n_heap) {
            size_t top = q->heap[0];
            if (q->items[top].due <= now) {
                heap_remove(q, top);
                q->items[top].in_flight = 1;
                memcpy(key, q->items[top].key, CTL_KEY_MAX);
                pthread_mutex_unlock(&q->mu);
                return 1;
            }
            wake = q->items[top].due < wake ? q->items[top].due : wake;
        }
        struct timespec ts = llm_sync_at(wake);
        pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    }
    pthread_mutex_unlock(&q->mu);
    return 0;
}

double ctl_queue_done(ctl_queue *q, const char *key, int outcome)
{
    int failed = outcome == CTL_DONE_FAILED;
    double delay = 0;
    pthread_mutex_lock(&q->mu);
    size_t i = find(q, key);
    if (i != NONE) {
        qitem *it = &q->items[i];
        it->in_flight = 0;
        it->failures = failed ? it->failures + 1 : 0;
        if (failed) {
            delay = 0.2;
            for (int f = 1; f < it->failures && delay < 30; f++) delay *= 2;
            delay = delay < 30 ? delay : 30;
        }
        if (it->forget || (outcome == CTL_DONE_GONE && !it->again)) {
            unlink_item(q, i);
        } else {
            int again = it->again;
            it->again = 0;
            if (again) /* changed meanwhile: look again at once (failed or not) */
                enqueue(q, i, it->due);
            else if (failed)
                enqueue(q, i, llm_clock_mono_s() + delay);
        }
    }
    pthread_mutex_unlock(&q->mu);
    return delay;
}

void ctl_queue_activate(ctl_queue *q, int active)
{
    pthread_mutex_lock(&q->mu);
    q->active = active;
    double now = llm_clock_mono_s();
    for (size_t i = 0; active && i < q->n_items; i++)
        if (q->items[i].live && !q->items[i].in_flight)
            enqueue(q, i, now);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void ctl_queue_wake(ctl_queue *q)
{
    pthread_mutex_lock(&q->mu);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

void ctl_queue_stats(ctl_queue *q, size_t *known, size_t *waiting)
{
    pthread_mutex_lock(&q->mu);
    *known = q->live;
    *waiting = q->n_heap;
    pthread_mutex_unlock(&q->mu);
}
