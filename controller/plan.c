/* plan.c - an LLMDeployment's children and status, decided from what was
 * observed; see plan.h. */
#include <stdio.h>
#include <limits.h>
#include <string.h>
#include <time.h>

#include "desired.h"
#include "llm/clock.h"
#include "kube_json.h"
#include "plan.h"

static const char *ann(json_t *o, const char *key)
{
    return json_string_value(json_object_get(kube_json_get(o, "metadata", "annotations"), key));
}

void plan_eventv(json_t *events, const char *type, const char *reason, const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    json_array_append_new(events, json_pack("{s:s,s:s,s:s}", "type", type, "reason", reason, "message", msg));
}

void plan_event(json_t *events, const char *type, const char *reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    plan_eventv(events, type, reason, fmt, ap);
    va_end(ap);
}

json_t *plan_condition(const char *type, int on, const char *reason, const char *msg, json_int_t gen)
{
    return json_pack("{s:s,s:s,s:s,s:s,s:I}", "type", type, "status", on ? "True" : "False", "reason", reason, "message",
                     msg, "observedGeneration", gen);
}

void plan_free(plan *p)
{
    rollout_free(&p->ro);
    json_decref(p->steps);
    json_decref(p->events);
    json_decref(p->autoscaling);
    memset(p, 0, sizeof *p);
}

/* ---- steps ------------------------------------------------------------------------------ */

/* Appends an apply of obj (a new reference, consumed; NULL: no memory)
 * into ns's collection of kind ("deployments", ...). */
static json_t *step_apply(plan *p, const char *group, const char *ns, const char *plural, json_t *obj)
{
    char coll[512];
    snprintf(coll, sizeof coll, "%s/namespaces/%s/%s", group, ns, plural);
    json_t *s = obj ? json_pack("{s:s,s:s,s:o}", "op", "apply", "collection", coll, "object", obj) : NULL;
    if (s && !json_array_append_new(p->steps, s))
        return s;
    return NULL;
}

static int step_remove(plan *p, const char *group, const char *ns, const char *plural, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/namespaces/%s/%s/%s", group, ns, plural, name);
    return json_array_append_new(p->steps, json_pack("{s:s,s:s}", "op", "remove", "path", path));
}

#define CORE "/api/v1"
#define APPS "/apis/apps/v1"
#define RBAC "/apis/rbac.authorization.k8s.io/v1"
#define HPAS "/apis/autoscaling/v2"
#define PDBS "/apis/policy/v1"

/* ---- the built-in autoscaler -------------------------------------------------------------- */

/* The reading's answer for what the autoscaler needs, when fresh: no older
 * than three intervals (a stalled reader holds the replicas, it does not
 * steer them). */
static const podsig_reading *fresh(const plan_input *in, double interval_s)
{
    const podsig_reading *r = in->pods;
    return r && r->age_s >= 0 && r->age_s <= 3 * (interval_s > 1 ? interval_s : 1) ? r : NULL;
}

/* The replicas a turn starts from: the autoscaler's own record
 * (status.autoscaling.desiredReplicas). The Deployment is patched before
 * the status that records the step, so when that write is lost (a 409 on a
 * stale copy) the next turn, counting from the record, takes the step
 * again and records it; counting from the Deployment it would see nothing
 * to do. So a Deployment scaled by hand is put back (it is the
 * controller's field). The Deployment's count (or, while a canary splits
 * it, the spec's) is the start when there is no record, when the record
 * is outside [0, maxReplicas] (the status is writable by others), and when
 * the record says 0 but pods run and no request is held: a wake whose
 * record was lost, whose pod the idle timer, not the zero branch, decides
 * about. While the routers still hold requests, a record of 0 is the start
 * whatever the Deployment says: the wake is taken (again) and recorded,
 * with its Event - a wake whose status write met a 409 is otherwise never
 * recorded, and a stale Deployment of 1 after a scale to zero is a wake
 * all the same when requests wait. */
static int autoscale_start(const plan_input *in, json_t *prev, json_t *spec, int split, const autoscale_config *as,
                           int held)
{
    json_t *rec = json_object_get(prev, "desiredReplicas");
    json_int_t dep = !split && in->stable ? json_integer_value(kube_json_get(json_object_get(in->stable, "spec"), "replicas", NULL))
                                          : -1;
    json_int_t r = json_is_integer(rec) ? json_integer_value(rec) : -1;
    int lost_wake = r == 0 && dep > 0 && !(held && as->min == 0); /* pods run; no request waits for them */
    if (r >= 0 && r <= as->max && !lost_wake)
        return (int)r;
    if (dep >= 0 && dep <= INT_MAX)
        return (int)dep;
    json_int_t want = json_integer_value(json_object_get(spec, "replicas"));
    return want >= 0 && want <= INT_MAX ? (int)want : 0;
}

/* spec.replicas while the built-in autoscaler decides: a change of it
 * (kubectl scale, an edit) is not applied, and says so once in an event;
 * the status keeps what it was and why it is not what runs. */
static void scale_ignored(json_t *spec, json_t *prev, plan *p, int desired)
{
    json_t *r = json_object_get(spec, "replicas"), *was = json_object_get(prev, "specReplicas");
    json_int_t asked = json_is_integer(r) ? json_integer_value(r) : 1;
    char msg[400];
    snprintf(msg, sizeof msg, "spec.replicas %lld is not applied while spec.autoscaling is enabled: the autoscaler holds "
             "%d (minReplicas %d, maxReplicas %d); change those, or turn autoscaling off", (long long)asked, desired,
             p->as.min, p->as.max);
    if (json_is_integer(was) && json_integer_value(was) != asked && asked != desired)
        plan_event(p->events, "Warning", "ScaleIgnored", "%s", msg);
    json_object_set_new(p->autoscaling, "specReplicas", json_integer(asked));
    json_object_set_new(p->autoscaling, "message", asked == desired ? json_null() : json_string(msg));
}

/* Its turn: the replicas to run, from the pods' signal and the state kept
 * in status.autoscaling; written into our copy of the spec so the desired
 * Deployment carries them. */
static llm_status autoscale(const plan_input *in, json_t *d, plan *p, llm_error *err)
{
    json_t *spec = json_object_get(d, "spec");
    json_t *prev = kube_json_get(d, "status", "autoscaling");
    int split = rollout_in_flight(kube_json_get(d, "status", "canary")); /* the Deployment holds only the stable share */
    const podsig_reading *r = fresh(in, p->as.interval_s);
    int held = r && r->need.activity && r->activity.routers > 0 && r->activity.held > 0;
    int current = autoscale_start(in, prev, spec, split, &p->as, held);
    int have = r && !strcmp(r->need.metric, p->as.metric);
    autoscale_decision dec;
    autoscale_config running = p->as; /* zero is scale to zero's call, not the signal's */
    if (running.min < 1)
        running.min = 1;
    /* the mean is a sample's (podsig shares its pages out); the load it stands for is every serving pod's */
    int pods = !have || !r->signal_pods ? 0 : r->serving_pods > r->signal_pods ? r->serving_pods : r->signal_pods;
    if (!(p->autoscaling = autoscale_decide(&running, current, have ? r->signal : -1, pods, prev, in->now, &dec)))
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the autoscaler's state");
    if (p->as.min == 0 && !split) {
        autoscale_activity none = {0}; /* routers 0: nothing known, no sleep and no wake */
        autoscale_zero(&p->as, current, r && r->need.activity ? &r->activity : &none, prev, p->autoscaling, in->now, &dec);
    }
    scale_ignored(spec, prev, p, dec.desired);
    json_object_set_new(spec, "replicas", json_integer(dec.desired));
    if (dec.changed)
        plan_event(p->events, "Normal", "Autoscaled", "%d -> %d replicas: %s", current, dec.desired, dec.reason);
    snprintf(p->need.metric, sizeof p->need.metric, "%s", p->as.metric);
    p->need.activity = p->as.min == 0;
    return LLM_OK;
}

/* ---- children ----------------------------------------------------------------------------- */

/* Events for what changes in the Deployment NAME (posted when the apply
 * changes it). */
static json_t *deployment_events(json_t *old, json_t *want, int autoscaled)
{
    json_t *ev = json_array();
    json_int_t was = json_integer_value(kube_json_get(json_object_get(old, "spec"), "replicas", NULL));
    json_int_t now = json_integer_value(kube_json_get(json_object_get(want, "spec"), "replicas", NULL));
    if (was != now && !autoscaled) /* the autoscaler posts its own, with the reason */
        plan_event(ev, "Normal", "Scaled", "scaled from %lld to %lld replicas", (long long)was, (long long)now);
    const char *t0 = ann(old, DESIRED_TEMPLATE_ANN), *t1 = ann(want, DESIRED_TEMPLATE_ANN);
    if (!t0 || !t1 || strcmp(t0, t1))
        plan_event(ev, "Normal", "RollingUpdate", "rolling the pods to revision %.10s (was %.10s)", t1 ? t1 : "?",
                   t0 ? t0 : "?");
    return ev;
}

/* The canary's objects: the routers' weight first (traffic leaves a
 * canary before it goes, and reaches it before the stable rolls), then the
 * canary's own, or their removal. */
static int canary_steps(json_t *d, plan *p, const char *ns, const char *name)
{
    rollout *ro = &p->ro;
    char n[320];
    int bad = 0;
    if (ro->weight_cm) {
        bad |= !step_apply(p, CORE, ns, "configmaps", json_incref(ro->weight_cm));
    } else if (json_is_object(kube_json_get(d, "status", "canary"))) { /* spec.canary was removed */
        snprintf(n, sizeof n, "%s-router", name);
        bad |= step_remove(p, CORE, ns, "configmaps", n);
    }
    if (ro->canary_dep) {
        bad |= !step_apply(p, CORE, ns, "configmaps", json_incref(ro->canary_cm));
        bad |= !step_apply(p, CORE, ns, "services", json_incref(ro->canary_svc));
        bad |= !step_apply(p, APPS, ns, "deployments", json_incref(ro->canary_dep));
        return bad;
    }
    if (!ro->state && !json_is_object(kube_json_get(d, "status", "canary")))
        return bad; /* never had a canary: nothing to look for */
    snprintf(n, sizeof n, "%s-canary", name);
    bad |= step_remove(p, APPS, ns, "deployments", n);
    snprintf(n, sizeof n, "%s-canary-backends", name);
    bad |= step_remove(p, CORE, ns, "services", n);
    snprintf(n, sizeof n, "%s-canary-config", name);
    bad |= step_remove(p, CORE, ns, "configmaps", n);
    return bad;
}

/* The router and what it needs, or their removal when turned off. */
static int router_steps(json_t *d, plan *p, const char *ns, const char *name)
{
    char n[320];
    int bad = 0;
    if (!desired_router_enabled(d)) {
        snprintf(n, sizeof n, "%s-router", name);
        bad |= step_remove(p, APPS, ns, "deployments", n);
        bad |= step_remove(p, PDBS, ns, "poddisruptionbudgets", n);
        static const char *const rgroup[3] = {RBAC, RBAC, CORE}, *const rplural[3] = {"rolebindings", "roles", "serviceaccounts"};
        for (int i = 0; i < 3; i++) /* its identity after its pods (the binding first: no grant outlives its use) */
            bad |= step_remove(p, rgroup[i], ns, rplural[i], n);
        snprintf(n, sizeof n, "%s-backends", name);
        return bad | step_remove(p, CORE, ns, "services", n);
    }
    static const char *const group[3] = {CORE, RBAC, RBAC}, *const plural[3] = {"serviceaccounts", "roles", "rolebindings"};
    for (int i = 0; i < 3; i++) bad |= !step_apply(p, group[i], ns, plural[i], desired_router_rbac(d, i));
    bad |= !step_apply(p, CORE, ns, "services", desired_backend_service(d));
    json_t *s = step_apply(p, APPS, ns, "deployments", desired_router(d));
    bad |= !step_apply(p, PDBS, ns, "poddisruptionbudgets", desired_router_pdb(d));
    char msg[400];
    snprintf(msg, sizeof msg, "created llm-router %s-router in front of the pods", name);
    return bad | !s | json_object_set_new(s, "created", json_string(msg));
}

/* The stable Deployment NAME, with its events. */
static int stable_step(const plan_input *in, plan *p, json_t *dep, const char *ns, const char *name, int autoscaled)
{
    json_t *s = step_apply(p, APPS, ns, "deployments", json_incref(dep));
    char msg[400];
    snprintf(msg, sizeof msg, "created Deployment, ConfigMap, Service and PodDisruptionBudget %s", name);
    return !s || json_object_set_new(s, "stable", json_true()) || json_object_set_new(s, "created", json_string(msg)) ||
           (in->stable && json_object_set_new(s, "updated", deployment_events(in->stable, dep, autoscaled)));
}

/* The stable ConfigMap and Deployment (their hashes; the revision). */
static llm_status server_objects(const plan_input *in, json_t *d, plan *p, json_t **cm, json_t **dep, llm_error *err)
{
    char msg[512] = "", cfg_hash[17];
    if (!(*cm = desired_configmap(d, msg, sizeof msg)))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%s", msg[0] ? msg : "cannot build the ConfigMap");
    json_t *hashed = json_deep_copy(json_object_get(*cm, "data")); /* without the adapters' list: applied live */
    if (!hashed)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the configuration's hash");
    json_object_del(hashed, DESIRED_ADAPTERS_KEY);
    kube_meta_hash(hashed, cfg_hash);
    json_decref(hashed);
    if (!(*dep = desired_deployment(d, cfg_hash, in->admin_secret, in->site, msg, sizeof msg)))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%s", msg);
    kube_meta_hash(kube_json_get(json_object_get(*dep, "spec"), "template", NULL), p->template_hash);
    json_object_set_new(kube_json_get(*dep, "metadata", "annotations"), DESIRED_TEMPLATE_ANN, json_string(p->template_hash));
    char serving[17];
    json_t *bare = in->admin_secret ? desired_deployment(d, cfg_hash, NULL, in->site, msg, sizeof msg) : NULL;
    if (in->admin_secret && !bare)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the serving revision's hash");
    kube_meta_hash(kube_json_get(json_object_get(bare ? bare : *dep, "spec"), "template", NULL), serving);
    json_decref(bare);
    json_object_set_new(kube_json_get(*dep, "metadata", "annotations"), DESIRED_SERVING_ANN, json_string(serving));
    if (desired_colocated(d)) { /* only a colocated canary compares it: no second build otherwise */
        char base[17];
        desired_base_hash(d, base);
        json_object_set_new(kube_json_get(*dep, "metadata", "annotations"), DESIRED_BASE_ANN, json_string(base));
    }
    return LLM_OK;
}

/* Every step, in the order the objects depend on each other. */
static llm_status steps(const plan_input *in, json_t *d, plan *p, json_t *cm, json_t *dep, llm_error *err)
{
    const char *ns = kube_json_str(d, "metadata", "namespace"), *name = kube_json_str(d, "metadata", "name");
    int bad = 0;
    if (desired_admin(d)) /* before the pods that mount it */
        bad |= json_array_append_new(p->steps, json_pack("{s:s}", "op", "adminSecret"));
    if (!p->ro.keep_config)
        bad |= !step_apply(p, CORE, ns, "configmaps", json_incref(cm));
    bad |= canary_steps(d, p, ns, name); /* before the stable Deployment: the weight moves before its pods do */
    bad |= stable_step(in, p, dep, ns, name, p->autoscaling != NULL);
    bad |= !step_apply(p, CORE, ns, "services", desired_service(d));
    bad |= !step_apply(p, PDBS, ns, "poddisruptionbudgets", desired_pdb(d));
    if (p->as.enabled && p->as.hpa) {
        json_t *s = step_apply(p, HPAS, ns, "horizontalpodautoscalers", autoscale_hpa(d, &p->as));
        char msg[300];
        snprintf(msg, sizeof msg, "created HorizontalPodAutoscaler on %s", p->as.metric);
        bad |= !s || json_object_set_new(s, "created", json_string(msg));
    } else { /* autoscaling off or built-in: an HPA of ours would fight it */
        bad |= step_remove(p, HPAS, ns, "horizontalpodautoscalers", name);
    }
    bad |= router_steps(d, p, ns, name);
    return bad ? llm_errf(err, LLM_ERR_NOMEM, "no memory for the plan of %s/%s", ns, name) : LLM_OK;
}

llm_status plan_children(const plan_input *in, plan *p, llm_error *err)
{
    memset(p, 0, sizeof *p);
    json_t *d = json_deep_copy(in->llmd), *cm = NULL, *dep = NULL; /* our copy: the autoscaler writes its replicas */
    if (!d || !(p->steps = json_array()) || !(p->events = json_array())) {
        json_decref(d);
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for a plan");
    }
    p->need.port = desired_health_port(d);
    llm_status st = autoscale_config_from_spec(json_object_get(d, "spec"), &p->as, err);
    if (!st && p->as.enabled && !p->as.hpa)
        st = autoscale(in, d, p, err);
    if (!st)
        st = server_objects(in, d, p, &cm, &dep, err);
    rollout_seen seen = {.canary = in->canary, .pods = in->pods, .quality = in->quality, .now = in->now};
    if (!st)
        st = rollout_plan(d, in->stable, p->template_hash,
                     (int)json_integer_value(kube_json_get(json_object_get(dep, "spec"), "replicas", NULL)), cm, dep, &seen, &p->ro, err);
    if (!st)
        st = steps(in, d, p, cm, dep, err);
    if (!st && json_array_extend(p->events, p->ro.events))
        st = llm_errf(err, LLM_ERR_NOMEM, "no memory for the plan's events");
    p->need.canary = p->ro.need_counters;
    p->need.diag = p->ro.need_diag; /* NAME-canary's pods, while it starts (plan_status adds NAME's) */
    if (p->ro.requeue_s > 0)
        p->requeue_s = p->ro.requeue_s; /* the canary's analysis interval */
    if (p->autoscaling && (p->requeue_s == 0 || p->as.interval_s < p->requeue_s))
        p->requeue_s = p->as.interval_s; /* the autoscaler reads its signal every interval */
    /* read as often as it is looked at */
    p->need.every_s = p->autoscaling ? p->as.interval_s : 0;
    double c = p->ro.requeue_s > 0 ? p->ro.requeue_s : 2;
    if (p->need.canary && (p->need.every_s == 0 || c < p->need.every_s))
        p->need.every_s = c;
    json_decref(cm);
    json_decref(dep);
    json_decref(d);
    return st;
}

/* ---- status ----------------------------------------------------------------------------- */

typedef struct verdict {
    const char *phase;
    int ready, progressing, degraded;
    char reason[48], message[1024];
} verdict;

/* The previous condition of a type, for sticky engine failures and
 * transition times. */
static json_t *old_condition(json_t *d, const char *type)
{
    json_t *cs = kube_json_get(d, "status", "conditions");
    for (size_t i = 0; i < json_array_size(cs); i++) {
        const char *t = json_string_value(json_object_get(json_array_get(cs, i), "type"));
        if (t && !strcmp(t, type))
            return json_array_get(cs, i);
    }
    return NULL;
}

/* What the pods say of why they are not ready: the last round's
 * diagnosis when it was read for that. */
static const pod_diag *diagnosis(const plan_input *in)
{
    const podsig_reading *r = in->pods;
    return r && r->age_s >= 0 && r->need.diag ? &r->diag : NULL;
}

/* Phase and reasons from the Deployment's status and, while not ready,
 * from what the pods say. */
static void phase_of(const plan_input *in, json_t *dep, verdict *v)
{
    json_t *d = in->llmd, *ds = json_object_get(dep, "status");
    json_int_t want = json_integer_value(kube_json_get(json_object_get(dep, "spec"), "replicas", NULL)); /* autoscaled, canary share */
    json_int_t have = json_integer_value(json_object_get(ds, "replicas"));
    json_int_t ready = json_integer_value(json_object_get(ds, "readyReplicas"));
    json_int_t updated = json_integer_value(json_object_get(ds, "updatedReplicas"));
    int rolled = json_integer_value(json_object_get(ds, "observedGeneration")) >=
                 json_integer_value(kube_json_get(dep, "metadata", "generation"));
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
    const pod_diag *pd = diagnosis(in);
    json_t *prev = old_condition(d, "Degraded");
    const char *pr = json_string_value(json_object_get(prev, "reason"));
    int same_gen = json_integer_value(json_object_get(prev, "observedGeneration")) ==
                   json_integer_value(kube_json_get(d, "metadata", "generation"));
    if (pod_diag_is_engine_failure(pr) && same_gen && ready == 0 &&
        (!pd || (pd->severity > 0 && !pod_diag_is_engine_failure(pd->reason)))) {
        /* the server that reported the failure is being restarted (or no
         * round has read the pods yet): until a pod says otherwise, the
         * failure stands */
        snprintf(v->reason, sizeof v->reason, "%s", pr);
        snprintf(v->message, sizeof v->message, "%s", json_string_value(json_object_get(prev, "message")) ?: "");
        v->degraded = 1;
    } else if (pd && pd->severity > 0) {
        snprintf(v->reason, sizeof v->reason, "%s", pd->reason);
        snprintf(v->message, sizeof v->message, "%s", pd->message);
        v->degraded = pd->degraded;
        if (pd->unscheduled && ready == 0)
            v->phase = "Pending";
        else if (!strcmp(pd->reason, "Downloading") && ready == 0)
            v->phase = "Downloading";
    }
    if (v->degraded)
        v->phase = "Degraded";
}

static json_t *status_of(json_t *d, const verdict *v, const char *revision, json_t *dep)
{
    json_t *ds = json_object_get(dep, "status");
    const char *name = kube_json_str(d, "metadata", "name"), *ns = kube_json_str(d, "metadata", "namespace");
    json_int_t gen = json_integer_value(kube_json_get(d, "metadata", "generation"));
    char sel[256], ep[512], rev[11];
    snprintf(sel, sizeof sel, DESIRED_INSTANCE "=%s," DESIRED_MANAGED_BY "=" DESIRED_CONTROLLER, name);
    snprintf(ep, sizeof ep, "http://%s.%s.svc:%lld", name, ns,
             (long long)(json_integer_value(kube_json_get(kube_json_get(d, "spec", "server"), "port", NULL)) ?: 8080));
    snprintf(rev, sizeof rev, "%.10s", revision);
    return json_pack("{s:I,s:I,s:I,s:s,s:s,s:s,s:s,s:[o,o,o]}", "observedGeneration", gen, "replicas",
                     json_integer_value(json_object_get(ds, "replicas")), "readyReplicas",
                     json_integer_value(json_object_get(ds, "readyReplicas")), "phase", v->phase, "selector", sel,
                     "endpoint", ep, "stableRevision", rev, "conditions",
                     plan_condition("Ready", v->ready, v->reason, v->message, gen),
                     plan_condition("Progressing", v->progressing, v->progressing ? v->reason : "RolloutComplete",
                                    v->progressing ? v->message : "all replicas run the current revision", gen),
                     plan_condition("Degraded", v->degraded, v->degraded ? v->reason : "AsExpected",
                                    v->degraded ? v->message : "no failure seen", gen));
}

/* Conditions keep their transition time while their status stays. */
static void keep_transition_times(json_t *d, json_t *want, double now_unix)
{
    char now[32];
    llm_clock_rfc3339(now_unix, now);
    json_t *cs = json_object_get(want, "conditions");
    for (size_t i = 0; i < json_array_size(cs); i++) {
        json_t *c = json_array_get(cs, i);
        json_t *o = old_condition(d, json_string_value(json_object_get(c, "type")));
        const char *was = json_string_value(json_object_get(o, "lastTransitionTime"));
        int same = was && json_equal(json_object_get(o, "status"), json_object_get(c, "status"));
        json_object_set_new(c, "lastTransitionTime", json_string(same ? was : now));
    }
}

/* Events when the phase or the failure reason changes. */
static void status_events(json_t *d, const verdict *v, json_t *events)
{
    const char *was = kube_json_str(d, "status", "phase");
    const char *why = json_string_value(json_object_get(old_condition(d, "Degraded"), "reason"));
    if (v->degraded && (!why || strcmp(why, v->reason)))
        plan_event(events, "Warning", v->reason, "%s", v->message);
    else if (v->ready && (!was || strcmp(was, v->phase))) /* Ready, or Idle at zero pods */
        plan_event(events, "Normal", v->phase, "%s", v->message);
}

/* status.canary and its conditions; null members remove what a canary
 * that is gone left behind. */
static void canary_status(json_t *d, const rollout *ro, json_t *status)
{
    int live = rollout_in_flight(ro->state);
    if (ro->state) {
        json_object_set(status, "canary", ro->state);
        rollout_conditions(ro, json_object_get(status, "conditions"), json_integer_value(kube_json_get(d, "metadata", "generation")));
    } else if (kube_json_get(d, "status", "canary")) {
        json_object_set_new(status, "canary", json_null());
    }
    char rev[11];
    snprintf(rev, sizeof rev, "%.10s", json_string_value(json_object_get(ro->state, "revision")) ?: "");
    json_object_set_new(status, "canaryRevision", live ? json_string(rev) : json_null());
    json_object_set_new(status, "canaryWeight", ro->state ? json_integer(ro->weight) : json_null());
}

/* Condition SpecServed: whether the pods run the spec's revision. After
 * a rollback they run the stable one until the spec changes, though Ready
 * (so Progressing says so too, naming both revisions). */
static void spec_served(json_t *d, const plan *p, json_t *status)
{
    json_int_t gen = json_integer_value(kube_json_get(d, "metadata", "generation"));
    json_t *conds = json_object_get(status, "conditions"), *st = p->ro.state;
    const char *sig = kube_json_str(st, "signal") ?: "RolledBack", *msg = kube_json_str(st, "message") ?: "";
    char text[1200];
    if (p->ro.mode == ROLLOUT_ROLLED_BACK) {
        snprintf(text, sizeof text, "the spec's revision %.10s was rolled back (%s: %.900s); the pods run revision %.10s "
                 "until the spec changes", p->template_hash, sig, msg, p->ro.stable_rev);
        for (size_t i = 0; i < json_array_size(conds); i++) {
            json_t *c = json_array_get(conds, i);
            if (!strcmp(kube_json_str(c, "type", NULL) ?: "", "Progressing")) {
                json_object_set_new(c, "reason", json_string("SpecRolledBack"));
                json_object_set_new(c, "message", json_string(text));
            }
        }
        json_array_append_new(conds, plan_condition("SpecServed", 0, "RolledBack", text, gen));
    } else if (rollout_in_flight(st)) {
        snprintf(text, sizeof text, "the spec's revision %.10s is a canary beside revision %.10s", p->template_hash,
                 p->ro.stable_rev);
        json_array_append_new(conds, plan_condition("SpecServed", 0, "CanaryInProgress", text, gen));
    } else {
        snprintf(text, sizeof text, "the pods are given the spec's revision %.10s", p->template_hash);
        json_array_append_new(conds, plan_condition("SpecServed", 1, "SpecApplied", text, gen));
    }
}

/* The stable Deployment's pods the plan wants: its step's replicas (the
 * spec's, or the autoscaler's; a canary's share taken out), else what it
 * has (an HPA's); -1 when neither says. */
static json_int_t wanted_replicas(const plan *p, json_t *dep)
{
    for (size_t i = 0; i < json_array_size(p->steps); i++) {
        json_t *step = json_array_get(p->steps, i);
        json_t *r = kube_json_get(json_object_get(step, "object"), "spec", "replicas", NULL);
        if (json_is_true(json_object_get(step, "stable")) && json_is_integer(r))
            return json_integer_value(r);
    }
    json_t *r = kube_json_get(dep, "spec", "replicas", NULL);
    return json_is_integer(r) ? json_integer_value(r) : -1;
}

json_t *plan_status(const plan_input *in, plan *p, json_t *dep)
{
    verdict v;
    phase_of(in, dep, &v);
    json_t *status = status_of(in->llmd, &v, p->ro.state ? p->ro.stable_rev : p->template_hash, dep);
    if (!status)
        return NULL;
    json_int_t want = wanted_replicas(p, dep); /* (the Desired column: spec.replicas is not what autoscaling wants) */
    if (want >= 0)
        json_object_set_new(status, "desiredReplicas", json_integer(want));
    /* off (or HPA mode): the record goes, so turning it on again starts from what runs then */
    json_object_set_new(status, "autoscaling", p->autoscaling ? json_incref(p->autoscaling) : json_null());
    canary_status(in->llmd, &p->ro, status);
    spec_served(in->llmd, p, status);
    keep_transition_times(in->llmd, status, in->now);
    status_events(in->llmd, &v, p->events);
    if (!v.ready) {
        p->need.diag = 1; /* why not: read for the next turn */
        if (p->need.every_s == 0 || p->need.every_s > 5)
            p->need.every_s = 5;
        if (p->requeue_s == 0 || p->requeue_s > 5)
            p->requeue_s = 5; /* look again for progress or failure (nothing polls at rest) */
    }
    return status;
}

json_t *plan_refused(const plan_input *in, const char *reason, const char *why, json_t *events)
{
    verdict v = {.phase = "Degraded", .degraded = 1};
    snprintf(v.reason, sizeof v.reason, "%s", reason);
    snprintf(v.message, sizeof v.message, "%s", why);
    status_events(in->llmd, &v, events);
    json_t *st = status_of(in->llmd, &v, kube_json_str(in->llmd, "status", "stableRevision") ?: "", NULL);
    if (st)
        keep_transition_times(in->llmd, st, in->now);
    return st;
}
