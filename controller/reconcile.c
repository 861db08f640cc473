/* reconcile.c - children and status of one LLMDeployment; see reconcile.h. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "admin_secret.h"
#include "autoscale.h"
#include "desired.h"
#include "kube_apply.h"
#include "kube_event.h"
#include "pod_diag.h"
#include "pod_metrics.h"
#include "reconcile.h"
#include "rollout.h"

#define API "/apis/llmk8s.io/v1alpha1"

static json_t *get2(json_t *o, const char *a, const char *b)
{
    json_t *x = json_object_get(o, a);
    return b ? json_object_get(x, b) : x;
}

static const char *ann(json_t *o, const char *key)
{
    return json_string_value(json_object_get(get2(o, "metadata", "annotations"), key));
}

/* ---- children ------------------------------------------------------------------ */

typedef struct children {
    json_t *cm, *dep, *svc, *pdb, *hpa;
    json_t *router, *backends, *rrbac[3]; /* with spec.router */
    char template_hash[17];
    as_config as;
    int autoscaled;          /* the built-in autoscaler set the replicas */
    json_t *as_state;        /* its new state, for status.autoscaling */
    rollout ro;              /* spec.canary */
    json_t *cur;             /* the Deployment as read first (NULL: none yet) */
    json_t *now;             /* the Deployment after the apply (set whenever it succeeded) */
} children;

static void children_free(children *c)
{
    ro_free(&c->ro);
    json_decref(c->router);
    json_decref(c->backends);
    for (int i = 0; i < 3; i++) json_decref(c->rrbac[i]);
    json_decref(c->hpa);
    json_decref(c->as_state);
    json_decref(c->cm);
    json_decref(c->dep);
    json_decref(c->svc);
    json_decref(c->pdb);
    json_decref(c->cur);
    json_decref(c->now);
}

/* The built-in autoscaler's turn: the replicas to run, from the pods'
 * signal and the state kept in status.autoscaling; written into our copy
 * of the spec so the desired Deployment carries them. */
static void autoscale(kube_client *k, json_t *d, children *c)
{
    const char *ns = json_string_value(get2(d, "metadata", "namespace"));
    const char *name = json_string_value(get2(d, "metadata", "name"));
    json_t *spec = json_object_get(d, "spec");
    json_t *prev = get2(d, "status", "autoscaling");
    int current = json_is_integer(get2(prev, "desiredReplicas", NULL)) ? (int)json_integer_value(get2(prev, "desiredReplicas", NULL))
                  : (int)json_integer_value(json_object_get(spec, "replicas"));
    int split = ro_in_flight(get2(d, "status", "canary")); /* the Deployment holds only the stable share */
    if (!split && c->cur)
        current = (int)json_integer_value(get2(json_object_get(c->cur, "spec"), "replicas", NULL));
    int n = 0;
    double v = pm_read_signal(k, ns, name, des_health_port(d), c->as.metric, &n);
    as_decision dec;
    as_config running = c->as; /* zero is scale to zero's call, not the signal's */
    if (running.min < 1)
        running.min = 1;
    c->as_state = as_decide(&running, current, v, n, prev, (double)time(NULL), &dec);
    if (!c->as_state)
        return;
    if (c->as.min == 0 && !split) {
        as_activity act;
        pm_router_activity(k, ns, name, &act);
        as_zero(&c->as, current, &act, prev, c->as_state, (double)time(NULL), &dec);
    }
    c->autoscaled = 1;
    json_object_set_new(spec, "replicas", json_integer(dec.desired));
    if (dec.changed)
        kube_event(k, d, "Normal", "Autoscaled", "%d -> %d replicas: %s", current, dec.desired, dec.reason);
}

/* The desired children; LLM_ERR_INVALID_ARG with the reason when the spec
 * cannot give them. */
static llm_status build(kube_client *k, json_t *d, children *c, llm_error *err)
{
    char msg[512] = "", cfg_hash[17];
    llm_status st = as_config_from_spec(json_object_get(d, "spec"), &c->as, err);
    if (st)
        return st;
    if (c->as.enabled && c->as.hpa && !(c->hpa = as_hpa(d, &c->as)))
        return llm_errf(err, LLM_ERR_NOMEM, "cannot build the HorizontalPodAutoscaler");
    if (c->as.enabled && !c->as.hpa)
        autoscale(k, d, c);
    if (!(c->cm = des_configmap(d, msg, sizeof msg)))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%s", msg[0] ? msg : "cannot build the ConfigMap");
    des_hash(json_object_get(c->cm, "data"), cfg_hash);
    char admin[300];
    if (des_colocated(d) && (st = admin_secret_derive(k, d, admin, NULL, err)) == LLM_ERR_INVALID_ARG) {
        /* the key Secret spoilt: said, and retried with back-off until it is mended (INVALID_ARG would stop
         * retries until the spec changes) */
        kube_event(k, d, "Warning", "AdminKeyInvalid", "%s", err->msg);
        return LLM_ERR_FORBIDDEN;
    }
    if (st)
        return st;
    if (!(c->dep = des_deployment(d, cfg_hash, des_colocated(d) ? admin : NULL, msg, sizeof msg)))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%s", msg);
    des_hash(get2(json_object_get(c->dep, "spec"), "template", NULL), c->template_hash);
    json_object_set_new(get2(c->dep, "metadata", "annotations"), DES_TEMPLATE_ANN, json_string(c->template_hash));
    if (des_colocated(d)) { /* only a colocated canary compares it: no second build otherwise */
        char base[17];
        des_base_hash(d, base);
        json_object_set_new(get2(c->dep, "metadata", "annotations"), DES_BASE_ANN, json_string(base));
    }
    st = ro_plan(k, d, c->cur, c->template_hash, (int)json_integer_value(get2(json_object_get(c->dep, "spec"), "replicas", NULL)),
                 c->cm, c->dep, &c->ro, err);
    if (st)
        return st;
    if (!(c->svc = des_service(d)) || !(c->pdb = des_pdb(d)))
        return llm_errf(err, LLM_ERR_NOMEM, "cannot build the Service or PodDisruptionBudget");
    if (des_router_enabled(d)) {
        for (int i = 0; i < 3; i++)
            if (!(c->rrbac[i] = des_router_rbac(d, i)))
                return llm_errf(err, LLM_ERR_NOMEM, "cannot build the router's ServiceAccount or Role");
        if (!(c->router = des_router(d)) || !(c->backends = des_backend_service(d)))
            return llm_errf(err, LLM_ERR_NOMEM, "cannot build the router's Deployment or Service");
    }
    return LLM_OK;
}

/* Events for what changed in the Deployment. */
static void deployment_events(kube_client *k, json_t *d, kube_applied did, json_t *old, json_t *want, int autoscaled)
{
    const char *name = json_string_value(get2(want, "metadata", "name"));
    if (did == KUBE_CREATED) {
        kube_event(k, d, "Normal", "Created", "created Deployment, ConfigMap, Service and PodDisruptionBudget %s", name);
        return;
    }
    if (did != KUBE_UPDATED || !old)
        return;
    json_int_t was = json_integer_value(get2(json_object_get(old, "spec"), "replicas", NULL));
    json_int_t now = json_integer_value(get2(json_object_get(want, "spec"), "replicas", NULL));
    if (was != now && !autoscaled) /* the autoscaler posts its own, with the reason */
        kube_event(k, d, "Normal", "Scaled", "scaled from %lld to %lld replicas", (long long)was, (long long)now);
    const char *t0 = ann(old, DES_TEMPLATE_ANN), *t1 = ann(want, DES_TEMPLATE_ANN);
    if (!t0 || !t1 || strcmp(t0, t1))
        kube_event(k, d, "Normal", "RollingUpdate", "rolling the pods to revision %.10s (was %.10s)", t1 ? t1 : "?",
                   t0 ? t0 : "?");
}

/* The router and what it needs, or their removal when turned off. */
static llm_status apply_router(kube_client *k, json_t *d, children *c, llm_error *err)
{
    const char *ns = json_string_value(get2(d, "metadata", "namespace"));
    const char *name = json_string_value(get2(d, "metadata", "name"));
    const char *uid = json_string_value(get2(d, "metadata", "uid"));
    char deps[512], svcs[512], path[1024];
    snprintf(deps, sizeof deps, "/apis/apps/v1/namespaces/%s/deployments", ns);
    snprintf(svcs, sizeof svcs, "/api/v1/namespaces/%s/services", ns);
    if (!c->router) {
        snprintf(path, sizeof path, "%s/%s-router", deps, name);
        llm_status st = kube_remove_ours(k, path, uid, err);
        snprintf(path, sizeof path, "%s/%s-backends", svcs, name);
        return st ? st : kube_remove_ours(k, path, uid, err);
    }
    static const char *const colls[3] = {"/api/v1/namespaces/%s/serviceaccounts",
                                         "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/roles",
                                         "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/rolebindings"};
    kube_applied did;
    llm_status st = LLM_OK;
    for (int i = 0; i < 3 && !st; i++) {
        char coll[512];
        snprintf(coll, sizeof coll, colls[i], ns);
        st = kube_apply(k, coll, c->rrbac[i], &did, err);
    }
    if (!st)
        st = kube_apply(k, svcs, c->backends, &did, err);
    if (!st)
        st = kube_apply(k, deps, c->router, &did, err);
    if (!st && did == KUBE_CREATED)
        kube_event(k, d, "Normal", "Created", "created llm-router %s-router in front of the pods", name);
    return st;
}

static llm_status apply_children(kube_client *k, json_t *d, children *c, llm_error *err)
{
    const char *ns = json_string_value(get2(d, "metadata", "namespace"));
    const char *uid = json_string_value(get2(d, "metadata", "uid"));
    char cms[512], deps[512], svcs[512], pdbs[512];
    snprintf(cms, sizeof cms, "/api/v1/namespaces/%s/configmaps", ns);
    snprintf(deps, sizeof deps, "/apis/apps/v1/namespaces/%s/deployments", ns);
    snprintf(svcs, sizeof svcs, "/api/v1/namespaces/%s/services", ns);
    snprintf(pdbs, sizeof pdbs, "/apis/policy/v1/namespaces/%s/poddisruptionbudgets", ns);
    kube_applied did;
    llm_status st = des_colocated(d) ? admin_secret_ensure(k, d, err) : LLM_OK; /* before the pods that mount it */
    if (!st && !c->ro.keep_config)
        st = kube_apply(k, cms, c->cm, &did, err);
    if (!st) /* before the stable Deployment: the weight moves before its pods do */
        st = ro_apply(k, d, &c->ro, err);
    if (!st && !(st = kube_apply_over(k, deps, c->dep, c->cur, &did, &c->now, err)))
        deployment_events(k, d, did, c->cur, c->dep, c->autoscaled);
    if (!st)
        st = kube_apply(k, svcs, c->svc, &did, err);
    if (!st)
        st = kube_apply(k, pdbs, c->pdb, &did, err);
    char hpas[512], hpa[1024];
    snprintf(hpas, sizeof hpas, "/apis/autoscaling/v2/namespaces/%s/horizontalpodautoscalers", ns);
    snprintf(hpa, sizeof hpa, "%s/%s", hpas, json_string_value(get2(d, "metadata", "name")));
    if (!st && c->hpa) {
        st = kube_apply(k, hpas, c->hpa, &did, err);
        if (!st && did == KUBE_CREATED)
            kube_event(k, d, "Normal", "Created", "created HorizontalPodAutoscaler on %s", c->as.metric);
    } else if (!st) { /* autoscaling off or built-in: an HPA of ours would fight it */
        st = kube_remove_ours(k, hpa, uid, err);
    }
    return st ? st : apply_router(k, d, c, err);
}

/* ---- status -------------------------------------------------------------------- */

typedef struct verdict {
    const char *phase;
    int ready, progressing, degraded;
    char reason[48], message[1024];
} verdict;

json_t *rec_condition(const char *type, int on, const char *reason, const char *msg, json_int_t gen)
{
    return json_pack("{s:s,s:s,s:s,s:s,s:I}", "type", type, "status", on ? "True" : "False", "reason", reason, "message",
                     msg, "observedGeneration", gen);
}

/* The previous Ready condition's reason/message, for sticky engine failures. */
static json_t *old_condition(json_t *d, const char *type)
{
    json_t *cs = get2(d, "status", "conditions");
    for (size_t i = 0; i < json_array_size(cs); i++)
        if (json_string_value(json_object_get(json_array_get(cs, i), "type")) &&
            !strcmp(json_string_value(json_object_get(json_array_get(cs, i), "type")), type))
            return json_array_get(cs, i);
    return NULL;
}

/* Phase and reasons from the Deployment's status and, while not ready,
 * from what the pods say. */
static void judge(kube_client *k, json_t *d, json_t *dep, verdict *v)
{
    json_t *ds = json_object_get(dep, "status");
    json_int_t want = json_integer_value(get2(json_object_get(dep, "spec"), "replicas", NULL)); /* autoscaled, canary share */
    json_int_t have = json_integer_value(json_object_get(ds, "replicas"));
    json_int_t ready = json_integer_value(json_object_get(ds, "readyReplicas"));
    json_int_t updated = json_integer_value(json_object_get(ds, "updatedReplicas"));
    int rolled = json_integer_value(json_object_get(ds, "observedGeneration")) >=
                 json_integer_value(get2(dep, "metadata", "generation"));
    memset(v, 0, sizeof *v);
    v->ready = ready >= want && rolled && updated >= want && have == want;
    v->phase = v->ready ? (want == 0 ? "Idle" : "Ready") : ready > 0 ? "Progressing" : have > 0 ? "Loading" : "Pending";
    v->progressing = !v->ready;
    snprintf(v->reason, sizeof v->reason, "%s", v->ready ? (want == 0 ? "ScaledToZero" : "AllReplicasReady")
                                                : ready > 0 ? "RollingUpdate" : have > 0 ? "EngineLoading" : "WaitingForPods");
    snprintf(v->message, sizeof v->message, "%lld of %lld replicas ready, %lld updated", (long long)ready,
             (long long)want, (long long)updated);
    if (v->ready)
        return;
    pod_diag pd;
    pod_diag_examine(k, json_string_value(get2(d, "metadata", "namespace")),
                     json_string_value(get2(d, "metadata", "name")),
                     des_health_port(d), &pd);
    json_t *prev = old_condition(d, "Degraded");
    const char *pr = json_string_value(json_object_get(prev, "reason"));
    int same_gen = json_integer_value(json_object_get(prev, "observedGeneration")) ==
                   json_integer_value(get2(d, "metadata", "generation"));
    if (pod_diag_is_engine_failure(pr) && same_gen && !pod_diag_is_engine_failure(pd.reason) && ready == 0 &&
        pd.severity > 0) {
        /* the server that reported the failure is being restarted: until a
         * pod says otherwise, the failure stands */
        snprintf(v->reason, sizeof v->reason, "%s", pr);
        snprintf(v->message, sizeof v->message, "%s", json_string_value(json_object_get(prev, "message")));
        v->degraded = 1;
    } else if (pd.severity > 0) {
        snprintf(v->reason, sizeof v->reason, "%s", pd.reason);
        snprintf(v->message, sizeof v->message, "%s", pd.message);
        v->degraded = pd.degraded;
        if (pd.unscheduled && ready == 0)
            v->phase = "Pending";
    }
    if (v->degraded)
        v->phase = "Degraded";
}

static json_t *status_of(json_t *d, const verdict *v, const char *revision, json_t *dep)
{
    json_t *ds = json_object_get(dep, "status");
    const char *name = json_string_value(get2(d, "metadata", "name"));
    const char *ns = json_string_value(get2(d, "metadata", "namespace"));
    json_int_t gen = json_integer_value(get2(d, "metadata", "generation"));
    char sel[256], ep[512], rev[11];
    snprintf(sel, sizeof sel, REC_INSTANCE "=%s," REC_MANAGED_BY "=" REC_CONTROLLER, name);
    snprintf(ep, sizeof ep, "http://%s.%s.svc:%lld", name, ns,
             (long long)(json_integer_value(get2(get2(d, "spec", "server"), "port", NULL)) ?: 8080));
    snprintf(rev, sizeof rev, "%.10s", revision);
    return json_pack("{s:I,s:I,s:I,s:s,s:s,s:s,s:s,s:[o,o,o]}", "observedGeneration", gen, "replicas",
                     json_integer_value(json_object_get(ds, "replicas")), "readyReplicas",
                     json_integer_value(json_object_get(ds, "readyReplicas")), "phase", v->phase, "selector", sel,
                     "endpoint", ep, "stableRevision", rev, "conditions",
                     rec_condition("Ready", v->ready, v->reason, v->message, gen),
                     rec_condition("Progressing", v->progressing, v->progressing ? v->reason : "RolloutComplete",
                               v->progressing ? v->message : "all replicas run the current revision", gen),
                     rec_condition("Degraded", v->degraded, v->degraded ? v->reason : "AsExpected",
                               v->degraded ? v->message : "no failure seen", gen));
}

static void stamp_now(char out[32])
{
    time_t t = time(NULL);
    struct tm tm;
    strftime(out, 32, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
}

/* Conditions keep their transition time while their status stays. */
static void keep_transition_times(json_t *d, json_t *want)
{
    char now[32];
    stamp_now(now);
    json_t *cs = json_object_get(want, "conditions");
    for (size_t i = 0; i < json_array_size(cs); i++) {
        json_t *c = json_array_get(cs, i);
        json_t *o = old_condition(d, json_string_value(json_object_get(c, "type")));
        const char *t = json_string_value(json_object_get(o, "lastTransitionTime"));
        int same = t && json_equal(json_object_get(o, "status"), json_object_get(c, "status"));
        json_object_set_new(c, "lastTransitionTime", json_string(same ? t : now));
    }
}

/* Events when the phase or the failure reason changes. */
static void status_events(kube_client *k, json_t *d, const verdict *v)
{
    const char *was = json_string_value(get2(d, "status", "phase"));
    const char *why = json_string_value(json_object_get(old_condition(d, "Degraded"), "reason"));
    if (v->degraded && (!why || strcmp(why, v->reason)))
        kube_event(k, d, "Warning", v->reason, "%s", v->message);
    else if (v->ready && (!was || strcmp(was, v->phase))) /* Ready, or Idle at zero pods */
        kube_event(k, d, "Normal", v->phase, "%s", v->message);
}

/* o without its null members, at any depth (a merge patch's nulls delete
 * keys, so the stored status never has them). New reference. */
static json_t *without_nulls(json_t *o)
{
    if (!json_is_object(o))
        return json_incref(o);
    json_t *out = json_object();
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
        if (!json_is_null(v))
            json_object_set_new(out, key, without_nulls(v));
    return out;
}

static llm_status update_status(kube_client *k, const char *path, json_t *d, json_t *want, llm_error *err)
{
    keep_transition_times(d, want);
    json_t *cur = json_object_get(d, "status"), *cmp = without_nulls(want);
    int same = cur && cmp && json_equal(cur, cmp);
    json_decref(cmp);
    if (same)
        return LLM_OK;
    char sp[1100];
    snprintf(sp, sizeof sp, "%s/status", path);
    /* at the version this reconcile read: a status computed from an older spec, or sent by a replica
     * that has stopped leading and was overtaken, is refused (409) rather than written over a newer one */
    json_t *patch = json_pack("{s:{s:O},s:O}", "metadata", "resourceVersion", get2(d, "metadata", "resourceVersion"),
                              "status", want);
    llm_status st = kube_request(k, "PATCH", sp, patch, "application/merge-patch+json", NULL, err);
    json_decref(patch);
    return st;
}

/* status.canary and its conditions; null members remove what a canary
 * that is gone left behind. */
static void canary_status(json_t *d, const rollout *ro, json_t *status)
{
    int live = ro_in_flight(ro->state);
    if (ro->state) {
        json_object_set(status, "canary", ro->state);
        ro_conditions(ro, json_object_get(status, "conditions"), json_integer_value(get2(d, "metadata", "generation")));
    } else if (get2(d, "status", "canary")) {
        json_object_set_new(status, "canary", json_null());
    }
    char rev[11];
    snprintf(rev, sizeof rev, "%.10s", json_string_value(json_object_get(ro->state, "revision")) ?: "");
    json_object_set_new(status, "canaryRevision", live ? json_string(rev) : json_null());
    json_object_set_new(status, "canaryWeight", ro->state ? json_integer(ro->weight) : json_null());
}

/* A child that cannot be written - a spec the API server refused for it
 * (InvalidSpec), an object of its name that is not ours (ChildConflict):
 * say so in the status. */
static llm_status child_refused(kube_client *k, const char *path, json_t *d, const char *reason, const char *why,
                                llm_error *err)
{
    verdict v = {.phase = "Degraded", .degraded = 1};
    snprintf(v.reason, sizeof v.reason, "%s", reason);
    snprintf(v.message, sizeof v.message, "%s", why);
    status_events(k, d, &v);
    json_t *want = status_of(d, &v, json_string_value(get2(d, "status", "stableRevision")) ?: "", NULL);
    llm_status st = want ? update_status(k, path, d, want, err) : llm_errf(err, LLM_ERR_NOMEM, "no memory");
    json_decref(want);
    return st;
}

llm_status rec_reconcile(kube_client *k, const char *ns, const char *name, double *requeue_s, llm_error *err)
{
    *requeue_s = 0;
    char path[1024], dpath[1024];
    snprintf(path, sizeof path, API "/namespaces/%s/llmdeployments/%s", ns, name);
    snprintf(dpath, sizeof dpath, "/apis/apps/v1/namespaces/%s/deployments/%s", ns, name);
    json_t *d = NULL, *status = NULL;
    children c = {0};
    llm_status st = kube_read(k, path, &d, err); /* (the informers' copies: no request at rest) */
    if (st == LLM_ERR_NOT_FOUND)
        return st; /* deleted: its children go with it (ownerReferences) */
    if (st || get2(d, "metadata", "deletionTimestamp"))
        goto out;
    /* read once: the autoscaler, the canary's plan, the apply and the status all use it */
    st = kube_read(k, dpath, &c.cur, err);
    if (st == LLM_ERR_NOT_FOUND)
        st = LLM_OK;
    if (!st)
        st = build(k, d, &c, err);
    if (!st)
        st = apply_children(k, d, &c, err);
    if (st == LLM_ERR_INVALID_ARG) { /* the spec, not the moment: no retry until it changes */
        st = child_refused(k, path, d, "InvalidSpec", err->msg, err);
        goto out;
    }
    if (st == LLM_ERR_EXISTS) { /* a foreign object holds a child's name */
        st = child_refused(k, path, d, "ChildConflict", err->msg, err);
        *requeue_s = 15; /* until its owner removes it */
        goto out;
    }
    verdict v;
    if (!st) { /* judged from the Deployment as the apply left it (c.now: its answer, or cur unchanged) */
        judge(k, d, c.now, &v);
        if (!(status = status_of(d, &v, c.ro.state ? c.ro.stable_rev : c.template_hash, c.now)))
            st = llm_errf(err, LLM_ERR_NOMEM, "%s/%s: cannot build the status", ns, name);
        else if (c.as_state)
            json_object_set(status, "autoscaling", c.as_state);
        if (status)
            canary_status(d, &c.ro, status);
    }
    if (!st && !(st = update_status(k, path, d, status, err)))
        status_events(k, d, &v);
    if (!st && !v.ready)
        *requeue_s = 5; /* not ready: look again for progress or failure (nothing polls at rest) */
    if (!st && c.ro.requeue_s > 0 && (*requeue_s == 0 || c.ro.requeue_s < *requeue_s))
        *requeue_s = c.ro.requeue_s; /* the canary's analysis interval */
    if (!st && c.autoscaled && (*requeue_s == 0 || c.as.interval_s < *requeue_s))
        *requeue_s = c.as.interval_s; /* the autoscaler reads its signal every interval */
out:
    if (st == LLM_ERR_NOT_FOUND) /* a 404 past the first read is a failure (an API not served), not "gone" */
        st = llm_errf(err, LLM_ERR_UNSUPPORTED, "%s", err->msg);
    json_decref(d);
    json_decref(status);
    children_free(&c);
    return st;
}
