/* ctl_loop.c - informers, work queue and worker; see ctl_loop.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl_loop.h"
#include "ctl_obs.h"
#include "kube_watch.h"
#include "reconcile.h"

#define KEY_MAX 320
/* Watches last this long before they are renewed (a stop is noticed within
 * a second regardless): at rest the controller makes about one request per
 * informer per WATCH_TIMEOUT_S. */
#define WATCH_TIMEOUT_S 300
#define QUEUE_MAX 65536

typedef struct qitem {
    char key[KEY_MAX];
    double not_before;   /* back-off: not before this time */
    int failures;
    int queued;          /* waiting to be processed */
} qitem;

typedef struct queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    qitem *items;        /* every key seen (failure counts live here) */
    int n;
    int active;          /* 0 while another replica leads: keys wait */
} queue;

/* Keys waiting (due or backing off), for the queue-depth gauge; under mu. */
static void q_gauge(queue *q)
{
    long depth = 0;
    for (int i = 0; i < q->n; i++) depth += q->items[i].queued;
    ctl_obs_set_queue(depth);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Queues key (once, however often it is added). */
static void q_add(queue *q, const char *key, double delay)
{
    pthread_mutex_lock(&q->mu);
    int i = 0;
    while (i < q->n && strcmp(q->items[i].key, key)) i++;
    if (i == q->n && q->n < QUEUE_MAX) {
        snprintf(q->items[q->n].key, KEY_MAX, "%s", key);
        q->items[q->n].failures = 0;
        q->n++;
    }
    if (i < q->n && (!q->items[i].queued || now_s() + delay < q->items[i].not_before)) {
        q->items[i].queued = 1;
        q->items[i].not_before = now_s() + delay;
        pthread_cond_signal(&q->cv);
    }
    q_gauge(q);
    pthread_mutex_unlock(&q->mu);
}

/* The next due key (copied to key); 0 when stopping. */
static int q_next(queue *q, char *key, volatile int *stop)
{
    pthread_mutex_lock(&q->mu);
    while (!*stop) {
        ctl_obs_heartbeat();
        double now = now_s(), soonest = now + 1;
        for (int i = 0; i < q->n && q->active; i++) {
            if (!q->items[i].queued)
                continue;
            if (q->items[i].not_before <= now) {
                q->items[i].queued = 0;
                snprintf(key, KEY_MAX, "%s", q->items[i].key);
                q_gauge(q);
                pthread_mutex_unlock(&q->mu);
                return 1;
            }
            soonest = q->items[i].not_before < soonest ? q->items[i].not_before : soonest;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double wait = soonest - now;
        ts.tv_sec += (time_t)wait;
        ts.tv_nsec += (long)((wait - (double)(time_t)wait) * 1e9);
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&q->cv, &q->mu, &ts);
    }
    pthread_mutex_unlock(&q->mu);
    return 0;
}

/* Back-off bookkeeping after a reconcile. */
static void q_done(queue *q, const char *key, int failed)
{
    pthread_mutex_lock(&q->mu);
    for (int i = 0; i < q->n; i++)
        if (!strcmp(q->items[i].key, key)) {
            q->items[i].failures = failed ? q->items[i].failures + 1 : 0;
            break;
        }
    pthread_mutex_unlock(&q->mu);
}

static double q_backoff(queue *q, const char *key)
{
    double d = 0.2;
    pthread_mutex_lock(&q->mu);
    for (int i = 0; i < q->n; i++)
        if (!strcmp(q->items[i].key, key))
            for (int f = 1; f < q->items[i].failures && d < 30; f++) d *= 2;
    pthread_mutex_unlock(&q->mu);
    return d < 30 ? d : 30;
}

/* Leadership won: every known key is looked at again; lost: keys wait. */
static void q_activate(void *arg, int active)
{
    queue *q = arg;
    pthread_mutex_lock(&q->mu);
    q->active = active;
    for (int i = 0; active && i < q->n; i++) {
        q->items[i].queued = 1;
        q->items[i].not_before = 0;
    }
    q_gauge(q);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

typedef struct ctl {
    kube_config *cfg;
    queue q;
    volatile int *stop;
} ctl;

/* What an LLMDeployment was last seen as, less its status. */
typedef struct seen {
    char key[KEY_MAX];
    uint64_t fp;
} seen;

typedef struct informer {
    ctl *c;
    int index;
    const char *path;
    int owned;           /* children: the key is their LLMDeployment owner's */
    seen *seen;          /* the owners' fingerprints (informer thread only) */
    int n_seen, cap_seen;
} informer;

/* A hash of the object without what changes on every status write:
 * status, resourceVersion, managedFields. 0 when it cannot be made. */
static uint64_t fingerprint(json_t *obj)
{
    json_t *c = json_deep_copy(obj);
    json_object_del(c, "status");
    json_object_del(json_object_get(c, "metadata"), "resourceVersion");
    json_object_del(json_object_get(c, "metadata"), "managedFields");
    char *text = c ? json_dumps(c, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(c);
    uint64_t h = 1469598103934665603ull;
    for (const char *p = text; p && *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    free(text);
    return text ? h : 0;
}

/* 1 when key was seen before as fp (a write to its status only: the
 * controller's own, which needs no second look); records fp otherwise. */
static int only_status_changed(informer *in, const char *key, uint64_t fp)
{
    int i = 0;
    while (i < in->n_seen && strcmp(in->seen[i].key, key)) i++;
    if (i < in->n_seen && fp && in->seen[i].fp == fp)
        return 1;
    if (i == in->n_seen) {
        if (in->n_seen == in->cap_seen) {
            int cap = in->cap_seen ? in->cap_seen * 2 : 16;
            seen *p = realloc(in->seen, (size_t)cap * sizeof *p);
            if (!p)
                return 0; /* no room to remember: look at it anyway */
            in->seen = p, in->cap_seen = cap;
        }
        snprintf(in->seen[in->n_seen++].key, KEY_MAX, "%s", key);
    }
    in->seen[i].fp = fp;
    return 0;
}

/* One informer's events: readiness after its first full list, relists
 * counted, and the LLMDeployment concerned queued. */
static int on_event(void *arg, const char *type, json_t *obj)
{
    informer *in = arg;
    if (!strcmp(type, "SYNCED"))
        ctl_obs_set_synced(in->index, 1);
    else if (!strcmp(type, "RELIST"))
        ctl_obs_count(CTL_M_RELISTS);
    json_t *md = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    char key[KEY_MAX];
    if (!in->owned && obj && ns && strcmp(type, "DELETED")) {
        snprintf(key, sizeof key, "%s/%s", ns, json_string_value(json_object_get(md, "name")));
        /* a status write (ours) would otherwise queue a reconcile that writes the status again */
        if (!(only_status_changed(in, key, fingerprint(obj)) && !strcmp(type, "MODIFIED")))
            q_add(&in->c->q, key, 0);
    }
    json_t *owners = in->owned ? json_object_get(md, "ownerReferences") : NULL;
    for (size_t i = 0; ns && i < json_array_size(owners); i++) {
        json_t *o = json_array_get(owners, i);
        const char *kind = json_string_value(json_object_get(o, "kind"));
        if (kind && !strcmp(kind, "LLMDeployment") && json_string_value(json_object_get(o, "name"))) {
            snprintf(key, sizeof key, "%s/%s", ns, json_string_value(json_object_get(o, "name")));
            q_add(&in->c->q, key, 0); /* a child changed or went: look at its owner again */
        }
    }
    return *in->c->stop;
}

/* Runs one informer until stop. Errors retrying cannot fix by itself (RBAC
 * not bound yet, a token being rotated, the CRD not installed yet) are
 * retried too, slowly: they are fixed from outside, and the controller must
 * then work without a restart; /readyz stays 503 meanwhile. */
static void *inform(void *arg)
{
    informer *in = arg;
    double backoff = 1;
    while (!*in->c->stop) {
        kube_client *k = NULL;
        llm_error err = {0};
        llm_status st = kube_client_new(in->c->cfg, &k, &err);
        if (!st)
            st = kube_list_watch(k, in->c->cfg, in->path, WATCH_TIMEOUT_S, on_event, in, in->c->stop, &err);
        kube_client_free(k);
        if (!st)
            break;
        char retry[32];
        snprintf(retry, sizeof retry, "%.0f", backoff);
        ctl_log(backoff >= 16 ? CTL_ERROR : CTL_WARN, "watch failed, will retry", "path", in->path, "error", err.msg, "retry_s", retry,
                (const char *)NULL);
        for (double t = 0; t < backoff && !*in->c->stop; t += 0.1) usleep(100000);
        backoff = backoff < 30 ? backoff * 2 : 30;
    }
    return NULL;
}

static void work(ctl *c, kube_client *k)
{
    char key[KEY_MAX];
    while (q_next(&c->q, key, c->stop)) {
        char ns[KEY_MAX];
        snprintf(ns, sizeof ns, "%s", key);
        char *name = strchr(ns, '/');
        if (!name)
            continue;
        *name++ = 0;
        llm_error err = {0};
        double t0 = now_s();
        double again = 0;
        llm_status st = rec_reconcile(k, ns, name, &again, &err);
        double took = now_s() - t0;
        q_done(&c->q, key, st != LLM_OK);
        ctl_obs_reconcile_seconds(took);
        ctl_obs_count(st ? CTL_M_RECONCILE_ERR : CTL_M_RECONCILE_OK);
        if (!st && again > 0)
            q_add(&c->q, key, again);
        char ms[32], retry[32];
        snprintf(ms, sizeof ms, "%.1f", took * 1e3);
        if (st) {
            double d = q_backoff(&c->q, key);
            snprintf(retry, sizeof retry, "%.1f", d);
            ctl_log(st == LLM_ERR_CONFLICT ? CTL_INFO : CTL_WARN, "reconcile failed, will retry", "key", key, "error",
                    err.msg, "retry_s", retry, (const char *)NULL);
            q_add(&c->q, key, d);
        } else {
            ctl_log(CTL_DEBUG, "reconciled", "key", key, "ms", ms, (const char *)NULL);
        }
    }
}

llm_status ctl_run(kube_config *cfg, const ctl_options *opt, volatile int *stop, llm_error *err)
{
    ctl c = {.cfg = cfg, .stop = stop, .q.active = !opt->leader_elect};
    ctl_lease *lease = NULL;
    ctl_obs_set_leader(!opt->leader_elect);
    pthread_mutex_init(&c.q.mu, NULL);
    pthread_cond_init(&c.q.cv, NULL);
    c.q.items = calloc(QUEUE_MAX, sizeof *c.q.items);
    kube_client *k = NULL;
    llm_status st = c.q.items ? kube_client_new(cfg, &k, err) : llm_errf(err, LLM_ERR_NOMEM, "no memory");
#define OWNED "?labelSelector=" REC_MANAGED_BY "%3D" REC_CONTROLLER
    informer in[] = {{.c = &c, .index = 0, .path = "/apis/llmk8s.io/v1alpha1/llmdeployments"},
                     {.c = &c, .index = 1, .path = "/apis/apps/v1/deployments" OWNED, .owned = 1},
                     {.c = &c, .index = 2, .path = "/api/v1/services" OWNED, .owned = 1},
                     {.c = &c, .index = 3, .path = "/api/v1/configmaps" OWNED, .owned = 1},
                     {.c = &c, .index = 4, .path = "/apis/policy/v1/poddisruptionbudgets" OWNED, .owned = 1},
                     {.c = &c, .index = 5, .path = "/apis/autoscaling/v2/horizontalpodautoscalers" OWNED, .owned = 1}};
    enum { N_INFORMERS = sizeof in / sizeof *in };
    ctl_obs_expect_informers(N_INFORMERS);
    pthread_t th[N_INFORMERS];
    int started = 0;
    while (!st && started < N_INFORMERS)
        if (pthread_create(&th[started], NULL, inform, &in[started]))
            st = llm_errf(err, LLM_ERR_INTERNAL, "cannot start an informer thread");
        else
            started++;
    if (!st && opt->leader_elect) {
        ctl_lease_config lc = opt->lease;
        lc.on_change = q_activate;
        lc.ctx = &c.q;
        st = ctl_lease_start(cfg, &lc, &lease, err);
    }
    if (!st)
        work(&c, k);
    ctl_lease_stop(lease); /* gives the lease up for a standby */
    *stop = 1;
    pthread_cond_broadcast(&c.q.cv);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < N_INFORMERS; i++) free(in[i].seen);
    kube_client_free(k);
    free(c.q.items);
    pthread_mutex_destroy(&c.q.mu);
    pthread_cond_destroy(&c.q.cv);
    return st;
}
