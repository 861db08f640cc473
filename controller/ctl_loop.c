/* ctl_loop.c - informers, work queue and worker; see ctl_loop.h. */
#include <ctype.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctl_loop.h"
#include "ctl_obs.h"
#include "ctl_queue.h"
#include "kube_cache.h"
#include "kube_watch.h"
#include "judge.h"
#include "podsig.h"
#include "desired.h"
#include "gw_reconcile.h"
#include "reconcile.h"
#include "llm/clock.h"
#include "kube_meta.h"

/* Watches last this long before they are renewed (a stop is noticed within
 * a second regardless): at rest the controller makes about one request per
 * informer per WATCH_TIMEOUT_S. */
#define WATCH_TIMEOUT_S 300
/* Keys the work queue knows at most: live LLMDeployments (deleted ones
 * leave it); past it a new one is refused with an error log. */
#define QUEUE_MAX (1 << 20)
#define KEY_MAX CTL_KEY_MAX
/* An LLMGateway's key: "gw:NS/NAME" (an LLMDeployment's is "NS/NAME"). */
#define GW_PREFIX "gw:"

/* The queue gauges after a change. */
static void q_gauge(ctl_queue *q)
{
    size_t known, waiting;
    ctl_queue_stats(q, &known, &waiting);
    ctl_obs_set_queue((long)waiting);
    ctl_obs_set_queue_keys((long)known);
}

static void q_add(ctl_queue *q, const char *key, double delay)
{
    llm_error err = {0};
    if (ctl_queue_add(q, key, delay, &err))
        ctl_obs_log(CTL_ERROR, "cannot queue a reconcile", "key", key, "error", err.msg, (const char *)NULL);
    q_gauge(q);
}


typedef struct ctl {
    kube_config *cfg;
    ctl_queue *q;
    atomic_int *stop;
    atomic_int cancel;   /* the worker's requests end at once (the lease was lost) */
    atomic_int lost;
    int led;             /* this replica led once (lease thread only) */
    kube_cache *owners;  /* the LLMDeployments' cache */
    kube_cache *gateways; /* the LLMGateways' cache */
    podsig *signals;     /* the pods' signals, read off the worker's path */
    judge *judge;        /* canaries' quality reads, off it too */
    desired_site site;   /* the options' (its strings borrowed) */
} ctl;

typedef struct informer {
    ctl *c;
    int index;
    char path[512];
    int owned;           /* children: the key is their owner's (an LLMDeployment's or an LLMGateway's) */
    const char *prefix;  /* the key's for the objects it watches ("" LLMDeployments, GW_PREFIX LLMGateways) */
    int optional;        /* a resource an older install may not serve (its CRD): not served counts as synced */
    kube_cache *cache;   /* what it has seen (the reconciles read it) */
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

/* Queues a child's owner - when it is an LLMDeployment the informer knows
 * (deleted owners' children go with them and must not bring their keys
 * back; forged references to names that never existed queue nothing). */
static void queue_owner(informer *in, const char *ns, const char *kind, const char *name)
{
    char key[KEY_MAX];
    json_t *known = NULL;
    int gw = kind && !strcmp(kind, "LLMGateway");
    if (!kind || (strcmp(kind, "LLMDeployment") && !gw) || !kube_meta_name_ok(name) || !kube_meta_name_ok(ns) ||
        snprintf(key, sizeof key, "%s%s/%s", gw ? GW_PREFIX : "", ns, name) >= (int)sizeof key ||
        kube_cache_get(gw ? in->c->gateways : in->c->owners, ns, name, &known) == KUBE_CACHE_ABSENT)
        return;
    json_decref(known);
    q_add(in->c->q, key, 0);
}

/* Every LLMGateway of namespace ns, queued. */
static void queue_gateways(ctl *c, const char *ns)
{
    json_t *all = NULL;
    if (kube_cache_list(c->gateways, ns, &all) != KUBE_CACHE_HIT)
        return; /* not listed yet: their own list queues them */
    for (size_t i = 0; i < json_array_size(all); i++) {
        char key[KEY_MAX];
        const char *name = json_string_value(json_object_get(json_object_get(json_array_get(all, i), "metadata"), "name"));
        if (name && snprintf(key, sizeof key, GW_PREFIX "%s/%s", ns, name) < (int)sizeof key)
            q_add(c->q, key, 0);
    }
    json_decref(all);
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
    /* the cache first: the reconcile this event queues must read at least this */
    if (kube_cache_event(in->cache, type, obj))
        ctl_obs_log(CTL_ERROR, "cannot keep an object in the cache (its reads go to the API server until the next list)",
                "collection", in->path, (const char *)NULL);
    json_t *md = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    char key[KEY_MAX];
    if (!in->owned && obj && ns) {
        snprintf(key, sizeof key, "%s%s/%s", in->prefix, ns, json_string_value(json_object_get(md, "name")));
        llm_error err = {0};
        int skipped = 0;
        if (!strcmp(type, "DELETED")) { /* its children go with it (ownerReferences): nothing left to do */
            ctl_queue_forget(in->c->q, key);
            podsig_forget(in->c->signals, key);
            judge_forget(in->c->judge, key);
        }
        else if (ctl_queue_add_changed(in->c->q, key, fingerprint(obj), &skipped, &err))
            ctl_obs_log(CTL_ERROR, "cannot queue a reconcile", "key", key, "error", err.msg, (const char *)NULL);
        else if (skipped && strcmp(type, "MODIFIED")) /* ADDED, SYNC (a relist): looked at, whatever it was */
            q_add(in->c->q, key, 0);
        /* a deployment came, went or changed (not its status alone): the gateways of its namespace route it */
        if (!*in->prefix && (!skipped || strcmp(type, "MODIFIED")))
            queue_gateways(in->c, ns);
        q_gauge(in->c->q);
    }
    json_t *owners = in->owned ? json_object_get(md, "ownerReferences") : NULL;
    for (size_t i = 0; ns && i < json_array_size(owners); i++) {
        json_t *o = json_array_get(owners, i);
        if (json_is_true(json_object_get(o, "controller"))) /* one owner per child: a child changed or went */
            queue_owner(in, ns, json_string_value(json_object_get(o, "kind")), json_string_value(json_object_get(o, "name")));
    }
    return atomic_load(in->c->stop);
}

/* Runs one informer until stop. Errors retrying cannot fix by itself (RBAC
 * not bound yet, a token being rotated, the CRD not installed yet) are
 * retried too, slowly: they are fixed from outside, and the controller must
 * then work without a restart; /readyz stays 503 meanwhile. */
static void *inform(void *arg)
{
    informer *in = arg;
    double backoff = 1;
    while (!atomic_load(in->c->stop)) {
        kube_client *k = NULL;
        llm_error err = {0};
        llm_status st = kube_client_new(in->c->cfg, &k, &err);
        if (!st)
            st = kube_watch_run(k, in->c->cfg, in->path, WATCH_TIMEOUT_S, on_event, in, in->c->stop, &err);
        kube_client_free(k);
        if (!st)
            break;
        if (st == LLM_ERR_NOT_FOUND && in->optional) /* its CRD not installed: nothing of it to wait for */
            ctl_obs_set_synced(in->index, 1);
        char retry[32];
        snprintf(retry, sizeof retry, "%.0f", backoff);
        ctl_obs_log(backoff >= 16 ? CTL_ERROR : CTL_WARN, "watch failed, will retry", "path", in->path, "error", err.msg, "retry_s", retry,
                (const char *)NULL);
        for (double t = 0; t < backoff && !atomic_load(in->c->stop); t += 0.1) usleep(100000);
        backoff = backoff < 30 ? backoff * 2 : 30;
    }
    return NULL;
}

/* Leadership won: every known key is looked at again. Lost (other than by
 * our own stop): the reconcile in flight is cut at once - its requests are
 * cancelled, so nothing of ours is written once another replica may lead -
 * and the controller exits, to come back as a clean candidate. */
static void on_leader(void *arg, int leader)
{
    ctl *c = arg;
    ctl_queue_activate(c->q, leader);
    q_gauge(c->q);
    if (leader) {
        c->led = 1;
    } else if (c->led && !atomic_load(c->stop)) {
        atomic_store(&c->cancel, 1);
        atomic_store(&c->lost, 1);
        atomic_store(c->stop, 1);
        ctl_queue_wake(c->q);
    }
}

static void work(ctl *c, kube_client *k)
{
    char key[KEY_MAX];
    while (ctl_queue_next(c->q, key, c->stop, ctl_obs_heartbeat)) {
        q_gauge(c->q);
        char ns[KEY_MAX];
        snprintf(ns, sizeof ns, "%s", key);
        char *name = strchr(ns, '/');
        if (!name) {
            ctl_queue_done(c->q, key, CTL_DONE_GONE);
            continue;
        }
        *name++ = 0;
        llm_error err = {0};
        double t0 = llm_clock_mono_s(), again = 0;
        int gw = !strncmp(ns, GW_PREFIX, strlen(GW_PREFIX));
        llm_status st = gw ? gw_reconcile_run(k, c->owners, ns + strlen(GW_PREFIX), name, &again, &err)
                           : reconcile_run(k, c->signals, c->judge, &c->site, ns, name, &again, &err);
        double took = llm_clock_mono_s() - t0;
        int gone = st == LLM_ERR_NOT_FOUND; /* deleted: nothing more to do, nothing to remember */
        if (gone)
            st = LLM_OK;
        double retry = ctl_queue_done(c->q, key, gone ? CTL_DONE_GONE : st ? CTL_DONE_FAILED : CTL_DONE_OK);
        ctl_obs_reconcile_seconds(took);
        ctl_obs_count(st ? CTL_M_RECONCILE_ERR : CTL_M_RECONCILE_OK);
        if (!st && again > 0)
            q_add(c->q, key, again);
        q_gauge(c->q);
        char ms[32], rs[32];
        snprintf(ms, sizeof ms, "%.1f", took * 1e3);
        if (st) {
            snprintf(rs, sizeof rs, "%.1f", retry);
            ctl_obs_log(st == KUBE_ERR_CONFLICT ? CTL_INFO : CTL_WARN, "reconcile failed, will retry", "key", key, "error",
                    err.msg, "retry_s", rs, (const char *)NULL);
        } else {
            ctl_obs_log(CTL_DEBUG, "reconciled", "key", key, "ms", ms, (const char *)NULL);
        }
    }
}

llm_status ctl_loop_run(kube_config *cfg, const ctl_options *opt, atomic_int *stop, llm_error *err)
{
    ctl c = {.cfg = cfg, .stop = stop, .site = opt->site};
    ctl_lease *lease = NULL;
    ctl_obs_set_leader(!opt->leader_elect);
    kube_client *k = NULL;
    llm_status st = ctl_queue_new(QUEUE_MAX, &c.q, err);
    if (!st && !opt->leader_elect)
        ctl_queue_activate(c.q, 1);
    if (!st)
        st = kube_client_new(cfg, &k, err);
    if (!st) {
        kube_client_set_cancel(k, &c.cancel);
        /* the heartbeat moves with every request the worker completes, not only between reconciles */
        kube_client_set_progress(k, ctl_obs_heartbeat);
        kube_client_set_timeout(k, 30000);
    }
#define OWNED "?labelSelector=" DESIRED_MANAGED_BY "%3D" DESIRED_CONTROLLER
    static const struct { const char *prefix, *plural; } watched[] = {
        {"/apis/llmk8s.io/v1alpha1", "llmdeployments"}, {"/apis/apps/v1", "deployments"}, {"/api/v1", "services"},
        {"/api/v1", "configmaps"}, {"/apis/policy/v1", "poddisruptionbudgets"},
        {"/apis/autoscaling/v2", "horizontalpodautoscalers"}, {"/api/v1", "serviceaccounts"},
        {"/apis/rbac.authorization.k8s.io/v1", "roles"}, {"/apis/rbac.authorization.k8s.io/v1", "rolebindings"},
        {"/apis/llmk8s.io/v1alpha1", "llmgateways"}};
    enum { N_INFORMERS = sizeof watched / sizeof *watched };
    informer in[N_INFORMERS];
    kube_cache_set caches = {.n = 0};
    for (int i = 0; i < N_INFORMERS; i++) { /* the children: ours alone (the label), keyed by their owner */
        char ns[300] = "";
        if (opt->ns && *opt->ns)
            snprintf(ns, sizeof ns, "/namespaces/%s", opt->ns);
        int gw = i == N_INFORMERS - 1, top = i == 0 || gw; /* LLMDeployments and LLMGateways: all of them (complete) */
        in[i] = (informer){.c = &c, .index = i, .owned = !top, .prefix = gw ? GW_PREFIX : "", .optional = gw};
        snprintf(in[i].path, sizeof in[i].path, "%s%s/%s%s", watched[i].prefix, ns, watched[i].plural, top ? "" : OWNED);
        /* children: ours only (the label) */
        if (!st && !(st = kube_cache_new(watched[i].plural, top, &in[i].cache, err)))
            caches.caches[caches.n++] = in[i].cache;
    }
    if (!st) {
        kube_client_set_caches(k, &caches);
        c.owners = in[0].cache;
        c.gateways = in[N_INFORMERS - 1].cache;
        st = podsig_new(cfg, opt->ns, ctl_obs_heartbeat_signals, &c.signals, err);
    }
    if (!st)
        st = judge_new(&c.judge, err);
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
        lc.on_change = on_leader;
        lc.ctx = &c;
        st = ctl_lease_start(cfg, &lc, &lease, err);
    }
    if (!st)
        work(&c, k);
    ctl_lease_stop(lease); /* gives the lease up for a standby */
    atomic_store(stop, 1);
    if (c.q)
        ctl_queue_wake(c.q);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
    podsig_free(c.signals);
    judge_free(c.judge);
    kube_client_free(k);
    ctl_queue_free(c.q);
    for (int i = 0; i < caches.n; i++) kube_cache_free(caches.caches[i]);
    if (!st && atomic_load(&c.lost))
        st = llm_errf(err, LLM_ERR_CANCELLED, "lost the leader lease: exiting, to start again as a clean candidate");
    return st;
}
