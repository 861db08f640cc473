/* ctl_lease.c - Lease-based leader election; see ctl_lease.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctl_lease.h"
#include "ctl_obs.h"
#include "llm/clock.h"
#include "llm/sync.h"
#include "llm/thread.h"

struct ctl_lease {
    ctl_lease_config c;
    char ns[254], name[254], identity[256], path[768];
    kube_client *k;
    llm_sync_worker w;         /* the election loop; w.mu also guards leader */
    int leader;
    double renewed;       /* when this replica last renewed (monotonic) */
    char seen[512];       /* holder + renewTime + resourceVersion last seen */
    char holder[256];     /* holderIdentity last seen */
    double seen_at;       /* when that last changed */
    double call_s;        /* a lease call's time at most */
};

static void micro_time(char out[40])
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    char s[32];
    strftime(s, sizeof s, "%Y-%m-%dT%H:%M:%S", gmtime_r(&ts.tv_sec, &tm));
    snprintf(out, 40, "%.20s.%06dZ", s, (int)(ts.tv_nsec / 1000));
}

static void set_leader(ctl_lease *l, int leader, const char *why)
{
    pthread_mutex_lock(&l->w.mu);
    int changed = l->leader != leader;
    l->leader = leader;
    pthread_mutex_unlock(&l->w.mu);
    if (!changed)
        return;
    ctl_obs_set_leader(leader);
    ctl_obs_log(leader ? CTL_INFO : CTL_WARN, leader ? "became leader" : "stopped leading", "lease", l->path,
            "identity", l->identity, "why", why, (const char *)NULL);
    if (l->c.on_change)
        l->c.on_change(l->c.ctx, leader);
}

static json_t *lease_spec(ctl_lease *l, const char *holder, json_t *old, int takeover)
{
    char now[40];
    micro_time(now);
    json_int_t transitions = json_integer_value(json_object_get(old, "leaseTransitions")) + (takeover ? 1 : 0);
    json_t *spec = json_pack("{s:s,s:i,s:s,s:I}", "holderIdentity", holder, "leaseDurationSeconds",
                             (int)(l->c.duration_s + 0.999), "renewTime", now, "leaseTransitions", transitions);
    json_object_set_new(spec, "acquireTime", takeover || !json_object_get(old, "acquireTime")
                                                 ? json_string(now) : json_incref(json_object_get(old, "acquireTime")));
    return spec;
}

/* Arms the next lease call: at most call_s, and while leading never past
 * the renew deadline (a leader that cannot renew by then must have stopped
 * before a candidate may take over - every call in flight ends by it).
 * 0 when no time is left. */
static int arm(ctl_lease *l)
{
    double left = l->call_s;
    if (ctl_lease_is_leader(l)) {
        double to_deadline = l->renewed + l->c.renew_deadline_s - llm_clock_mono_s();
        left = to_deadline < left ? to_deadline : left;
    }
    if (left < 0.05)
        return 0;
    kube_client_set_timeout(l->k, (long)(left * 1000));
    return 1;
}

/* One round: create, renew or take over the lease. 1 when this replica
 * holds it afterwards. */
static int try_hold(ctl_lease *l)
{
    json_t *cur = NULL;
    llm_error err = {0};
    if (!arm(l))
        return 0;
    llm_status st = kube_client_request(l->k, "GET", l->path, NULL, NULL, &cur, &err);
    if (st == LLM_ERR_NOT_FOUND) {
        char coll[512];
        snprintf(coll, sizeof coll, "/apis/coordination.k8s.io/v1/namespaces/%s/leases", l->ns);
        json_t *obj = json_pack("{s:s,s:s,s:{s:s,s:s},s:o}", "apiVersion", "coordination.k8s.io/v1", "kind", "Lease",
                                "metadata", "name", l->name, "namespace", l->ns, "spec", lease_spec(l, l->identity, NULL, 1));
        st = arm(l) ? kube_client_request(l->k, "POST", coll, obj, NULL, NULL, &err) : LLM_ERR_TIMEOUT;
        json_decref(obj);
        return st == LLM_OK;
    }
    if (st) {
        ctl_obs_log(CTL_WARN, "cannot read the leader lease", "lease", l->path, "error", err.msg, (const char *)NULL);
        return 0;
    }
    json_t *spec = json_object_get(cur, "spec");
    const char *holder = json_string_value(json_object_get(spec, "holderIdentity"));
    const char *renew = json_string_value(json_object_get(spec, "renewTime"));
    const char *rv = json_string_value(json_object_get(json_object_get(cur, "metadata"), "resourceVersion"));
    char seen[512];
    snprintf(seen, sizeof seen, "%s|%s|%s", holder ? holder : "", renew ? renew : "", rv ? rv : "");
    double now = llm_clock_mono_s();
    if (strcmp(seen, l->seen)) {
        snprintf(l->seen, sizeof l->seen, "%s", seen);
        l->seen_at = now;
    }
    snprintf(l->holder, sizeof l->holder, "%s", holder ? holder : "");
    int mine = holder && !strcmp(holder, l->identity);
    /* the holder's own promise (its leaseDurationSeconds), not ours: replicas may be configured apart */
    json_int_t held = json_integer_value(json_object_get(spec, "leaseDurationSeconds"));
    double duration = held > 0 ? (double)held : l->c.duration_s;
    int free_now = !holder || !*holder || now - l->seen_at >= duration;
    if (!mine && !free_now) {
        json_decref(cur);
        return 0;
    }
    json_t *want = json_pack("{s:O,s:o}", "metadata", json_object_get(cur, "metadata"), "spec",
                             lease_spec(l, l->identity, spec, !mine));
    json_object_set_new(want, "apiVersion", json_string("coordination.k8s.io/v1"));
    json_object_set_new(want, "kind", json_string("Lease"));
    st = arm(l) ? kube_client_request(l->k, "PUT", l->path, want, NULL, NULL, &err)
                : llm_errf(&err, LLM_ERR_TIMEOUT, "no time left before the renew deadline");
    json_decref(want);
    json_decref(cur);
    if (st && st != KUBE_ERR_CONFLICT)
        ctl_obs_log(CTL_WARN, "cannot write the leader lease", "lease", l->path, "error", err.msg, (const char *)NULL);
    return st == LLM_OK;
}

/* Gives the lease up (holder ""), so a standby need not wait it out. */
static void release(ctl_lease *l)
{
    json_t *cur = NULL;
    if (kube_client_request(l->k, "GET", l->path, NULL, NULL, &cur, NULL))
        return;
    json_t *spec = json_object_get(cur, "spec");
    const char *holder = json_string_value(json_object_get(spec, "holderIdentity"));
    if (holder && !strcmp(holder, l->identity)) {
        json_t *ns = lease_spec(l, "", spec, 0);
        json_object_set_new(ns, "leaseDurationSeconds", json_integer(1));
        json_object_set_new(cur, "spec", ns);
        llm_error err = {0};
        if (kube_client_request(l->k, "PUT", l->path, cur, NULL, NULL, &err))
            ctl_obs_log(CTL_WARN, "cannot release the leader lease", "error", err.msg, (const char *)NULL);
        else
            ctl_obs_log(CTL_INFO, "released the leader lease", "lease", l->path, (const char *)NULL);
    }
    json_decref(cur);
}

static void *run(void *arg)
{
    ctl_lease *l = arg;
    pthread_mutex_lock(&l->w.mu);
    while (!l->w.stop) {
        pthread_mutex_unlock(&l->w.mu);
        double t0 = llm_clock_mono_s();
        if (try_hold(l)) {
            l->renewed = t0;
            set_leader(l, 1, "lease acquired or renewed");
        } else if (ctl_lease_is_leader(l) && llm_clock_mono_s() + l->c.retry_s >= l->renewed + l->c.renew_deadline_s) {
            /* the next round would start past the deadline: stop now, not a retry period late */
            set_leader(l, 0, "could not renew the lease within the renew deadline");
        } else if (ctl_lease_is_leader(l) && *l->holder && strcmp(l->holder, l->identity)) {
            set_leader(l, 0, "another replica holds the lease");
        }
        pthread_mutex_lock(&l->w.mu);
        llm_sync_worker_wait(&l->w, t0 + l->c.retry_s);
    }
    pthread_mutex_unlock(&l->w.mu);
    if (ctl_lease_is_leader(l)) {
        set_leader(l, 0, "shutting down");
        release(l);
    }
    return NULL;
}

llm_status ctl_lease_start(kube_config *cfg, const ctl_lease_config *lc, ctl_lease **out, llm_error *err)
{
    *out = NULL;
    if (lc->duration_s <= lc->renew_deadline_s || lc->renew_deadline_s <= lc->retry_s || lc->retry_s <= 0)
        return llm_errf(err, LLM_ERR_INVALID_ARG,
                        "leader election needs lease duration (%.1f s) > renew deadline (%.1f s) > retry period (%.1f s) > 0",
                        lc->duration_s, lc->renew_deadline_s, lc->retry_s);
    ctl_lease *l = calloc(1, sizeof *l);
    if (!l)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the leader lease");
    l->c = *lc;
    snprintf(l->ns, sizeof l->ns, "%s", lc->ns);
    snprintf(l->name, sizeof l->name, "%s", lc->name);
    snprintf(l->identity, sizeof l->identity, "%s", lc->identity);
    snprintf(l->path, sizeof l->path, "/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s", l->ns, l->name);
    if (llm_sync_worker_init(&l->w)) {
        free(l);
        return llm_errf(err, LLM_ERR_INTERNAL, "cannot make the leader lease's lock");
    }
    llm_status st = kube_client_new(cfg, &l->k, err);
    /* a round (a GET and a PUT) ends within the renew deadline less a retry period: a call the API server
     * stalls cannot keep us leading past the deadline (curl's 60 s would) */
    double call_s = (lc->renew_deadline_s - lc->retry_s) / 2;
    l->call_s = call_s > 0.5 ? call_s : 0.5;
    if (!st && llm_sync_worker_start(&l->w, LLM_THREAD_STACK, run, l))
        st = llm_errf(err, LLM_ERR_INTERNAL, "cannot start the leader-election thread");
    if (st) {
        kube_client_free(l->k);
        llm_sync_worker_free(&l->w);
        free(l);
        return st;
    }
    *out = l;
    return LLM_OK;
}

int ctl_lease_is_leader(ctl_lease *l)
{
    pthread_mutex_lock(&l->w.mu);
    int v = l->leader;
    pthread_mutex_unlock(&l->w.mu);
    return v;
}

void ctl_lease_stop(ctl_lease *l)
{
    if (!l)
        return;
    llm_sync_worker_stop(&l->w);
    kube_client_free(l->k);
    llm_sync_worker_free(&l->w);
    free(l);
}
