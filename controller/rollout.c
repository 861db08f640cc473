/* rollout.c - canary upgrades: state, analysis turns and the objects they
 * need; see rollout.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "admin_secret.h"
#include "desired.h"
#include "http_get.h"
#include "kube_apply.h"
#include "ctl_obs.h"
#include "kube_event.h"
#include "pod_diag.h"
#include "pod_metrics.h"
#include "reconcile.h"
#include "rollout.h"

static json_t *get2(json_t *o, const char *a, const char *b)
{
    return json_object_get(json_object_get(o, a), b);
}

static const char *str(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static int same(const char *a, const char *b)
{
    return a && b && !strcmp(a, b);
}

static void set_str(json_t *o, const char *key, const char *v)
{
    json_object_set_new(o, key, v ? json_string(v) : json_null());
}

/* A Deployment rolled out to its spec with every pod ready. */
static int dep_done(json_t *dep)
{
    json_t *s = json_object_get(dep, "status");
    json_int_t want = json_integer_value(get2(dep, "spec", "replicas"));
    return dep && json_integer_value(json_object_get(s, "observedGeneration")) >= json_integer_value(get2(dep, "metadata", "generation")) &&
           json_integer_value(json_object_get(s, "updatedReplicas")) == want &&
           json_integer_value(json_object_get(s, "readyReplicas")) == want &&
           json_integer_value(json_object_get(s, "replicas")) == want;
}

static int ready_pods(json_t *dep)
{
    return (int)json_integer_value(get2(dep, "status", "readyReplicas"));
}

static int add_router(void *ctx, const char *text)
{
    cn_sample_add(ctx, text);
    return strstr(text, "revision_requests_total{") != NULL; /* a router's, or a pod's (colocated) */
}

/* The routers' counters, summed; 0 when no router answered. */
static int sample_routers(kube_client *k, json_t *d, cn_sample *s)
{
    char inst[300];
    snprintf(inst, sizeof inst, "%s-router", str(json_object_get(d, "metadata"), "name"));
    memset(s, 0, sizeof *s);
    return pm_scrape_each(k, str(json_object_get(d, "metadata"), "namespace"), inst, DES_ROUTER_PORT, add_router, s);
}

static int colocated(const rollout *ro)
{
    return same(str(ro->state, "mode"), "colocated");
}

/* The counters the analysis reads: the routers', or the stable pods'
 * own for a canary colocated in them. */
static int sample(kube_client *k, json_t *d, const rollout *ro, cn_sample *s)
{
    if (!colocated(ro))
        return sample_routers(k, d, s);
    memset(s, 0, sizeof *s);
    return pm_scrape_each(k, str(json_object_get(d, "metadata"), "namespace"),
                          str(json_object_get(d, "metadata"), "name"), des_health_port(d), add_router, s);
}

/* ---- a canary colocated in the stable pods ------------------------------------------ */

typedef struct coloc {
    json_t *d;
    char body[8400], token[65];
    int pods, ready, failed, misfit; /* pods asked; serving the canary; failed to load; could not fit it */
    char message[512];
} coloc;

static int ask_pod(void *arg, const char *ip)
{
    coloc *c = arg;
    char url[300], *resp = NULL;
    snprintf(url, sizeof url, "http://%s:%lld/admin/canary", ip, des_server_port(c->d));
    long code = http_request(NULL, url, c->token, c->body, 3000, 1 << 16, &resp);
    ctl_obs_heartbeat(); /* pod by pod: the loop moves */
    json_t *j = resp ? json_loads(resp, 0, NULL) : NULL;
    const char *state = str(j, "state"), *msg = str(j, "message");
    c->pods++;
    c->ready += code == 200 && same(state, "ready");
    c->failed += code == 200 && same(state, "failed");
    c->misfit += code == 200 && same(state, "does_not_fit");
    if ((same(state, "failed") || same(state, "does_not_fit")) && msg)
        snprintf(c->message, sizeof c->message, "pod %s: %s", ip, msg);
    else if (code != 200 && !c->message[0])
        snprintf(c->message, sizeof c->message, "pod %s: /admin/canary answered %ld", ip, code);
    json_decref(j);
    free(resp);
    return 1;
}

/* Every ready stable pod asked to serve the spec's model as the canary
 * at weight (unload: none); what they said. */
static void colocate(kube_client *k, json_t *d, int unload, int weight, coloc *c)
{
    memset(c, 0, sizeof *c);
    c->d = d;
    llm_error err = {0};
    if (admin_secret_derive(k, d, NULL, c->token, &err)) { /* no pod asked: the caller sees none answered; an unload
                                                      * too, so the event says it (the pods keep the canary) */
        snprintf(c->message, sizeof c->message, "%s", err.msg);
        kube_event(k, d, "Warning", "AdminKeyUnreadable", "cannot %s the colocated canary: %s",
                   unload ? "unload" : "set", err.msg);
        return;
    }
    json_t *m = json_object_get(json_object_get(d, "spec"), "model");
    json_t *req = json_pack("{s:o,s:i}", "model", unload ? json_null() : json_incref(json_object_get(m, "path")),
                            "weight", weight);
    if (req && !unload && json_is_string(json_object_get(m, "sha256")))
        json_object_set(req, "sha256", json_object_get(m, "sha256"));
    char *b = req ? json_dumps(req, JSON_COMPACT) : NULL;
    snprintf(c->body, sizeof c->body, "%s", b ? b : "{}");
    free(b);
    json_decref(req);
    pm_each_ready_pod(k, str(json_object_get(d, "metadata"), "namespace"), str(json_object_get(d, "metadata"), "name"),
                      ask_pod, c);
}

/* ---- transitions ---------------------------------------------------------------- */

/* A new revision: colocated in the stable pods when asked for and only the
 * model changed (base hashes equal), else in its own pods. */
static void start(kube_client *k, json_t *d, rollout *ro, const char *new_rev, const char *stable_rev, int same_base)
{
    json_decref(ro->state);
    int col = ro->cn.colocated && same_base;
    ro->state = json_pack("{s:s,s:s,s:s,s:i,s:i,s:n,s:n,s:n,s:n,s:n,s:s,s:s,s:s}", "revision", new_rev,
                          "stableRevision", stable_rev, "phase", "Starting", "step", -1, "weight", 0, "stepStartTime",
                          "window", "lastAnalysis", "rolledBackRevision", "signal", "message",
                          col ? "loading the new model in the stable pods" : "waiting for the canary's pods", "mode",
                          col ? "colocated" : "pods", "colocation",
                          !ro->cn.colocated ? "" : col ? "Colocated: the new model loads beside the stable one"
                          : "TemplateChanged: more than the model changed, so the canary runs in its own pods");
    kube_event(k, d, "Normal", "CanaryStarted", "revision %.10s starts beside stable %.10s%s", new_rev, stable_rev,
               col ? " inside the stable pods" : "");
}

static void rollback(kube_client *k, json_t *d, rollout *ro, const char *signal, const char *msg)
{
    json_t *st = ro->state;
    char rev[17];
    snprintf(rev, sizeof rev, "%s", str(st, "revision") ?: "");
    json_object_set_new(st, "phase", json_string("RolledBack"));
    json_object_set_new(st, "weight", json_integer(0));
    set_str(st, "rolledBackRevision", rev);
    set_str(st, "signal", signal);
    set_str(st, "message", msg);
    kube_event(k, d, "Warning", "CanaryRolledBack", "revision %.10s rolled back: %s: %s", rev, signal, msg);
    ro->mode = RO_ROLLED_BACK;
}

static void promote(kube_client *k, json_t *d, rollout *ro, const char *why)
{
    json_object_set_new(ro->state, "phase", json_string("Promoting"));
    set_str(ro->state, "message", why);
    kube_event(k, d, "Normal", "CanaryPromoting", "revision %.10s: %s", str(ro->state, "revision") ?: "", why);
}

static void begin_step(rollout *ro, int step, const cn_sample *now)
{
    json_object_set_new(ro->state, "step", json_integer(step));
    json_object_set_new(ro->state, "weight", json_integer(ro->cn.steps[step].weight));
    json_object_set_new(ro->state, "stepStartTime", json_integer((json_int_t)time(NULL)));
    json_object_set_new(ro->state, "window", cn_sample_to_json(now));
    json_object_set_new(ro->state, "phase", json_string("Progressing"));
}

static void record(rollout *ro, const cn_analysis *a)
{
    static const char *const verdicts[] = {"Inconclusive", "Pass", "Fail"};
    char now[32];
    time_t t = time(NULL);
    struct tm tm;
    strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&t, &tm));
    json_object_set_new(ro->state, "lastAnalysis",
                        json_pack("{s:s,s:s,s:s,s:f,s:f,s:f,s:f}", "time", now, "result", verdicts[a->verdict], "message",
                                  a->message, "canaryRequests", a->requests[1], "canaryErrorRatio", a->error_ratio[1],
                                  "canaryTTFTp99", a->ttft_p99[1], "stableTTFTp99", a->ttft_p99[0]));
}

/* Starting: the canary's pods load; its first step begins once one is
 * ready, and a canary that cannot start is rolled back. */
static void starting_colocated(kube_client *k, json_t *d, rollout *ro)
{
    coloc c;
    colocate(k, d, 0, 0, &c);
    if (c.misfit) { /* back to pods of its own, saying why */
        coloc undo;
        colocate(k, d, 1, 0, &undo);
        char why[600];
        snprintf(why, sizeof why, "ColocationDoesNotFit: %s; the canary runs in its own pods", c.message);
        json_object_set_new(ro->state, "mode", json_string("pods"));
        set_str(ro->state, "colocation", why);
        set_str(ro->state, "message", "waiting for the canary's pods");
        kube_event(k, d, "Warning", "ColocationDoesNotFit", "%s", why);
    } else if (c.failed) {
        rollback(k, d, ro, "CanaryFailed", c.message);
    } else if (c.pods > 0 && c.ready == c.pods) {
        cn_sample now;
        sample(k, d, ro, &now);
        begin_step(ro, 0, &now);
        set_str(ro->state, "message", "step 1 began");
        coloc w;
        colocate(k, d, 0, ro->cn.steps[0].weight, &w);
        kube_event(k, d, "Normal", "CanaryStep", "revision %.10s takes %d%% of requests inside the stable pods "
                   "(step 1 of %d)", str(ro->state, "revision") ?: "", ro->cn.steps[0].weight, ro->cn.n_steps);
    } else if (!c.pods && c.message[0]) { /* no pod asked (the admin key unreadable): say why while waiting */
        set_str(ro->state, "message", c.message);
    }
}

static void starting(kube_client *k, json_t *d, rollout *ro, json_t *canary)
{
    if (colocated(ro)) {
        starting_colocated(k, d, ro);
        return;
    }
    if (ready_pods(canary) > 0) {
        cn_sample now;
        sample_routers(k, d, &now);
        begin_step(ro, 0, &now);
        set_str(ro->state, "message", "step 1 began");
        kube_event(k, d, "Normal", "CanaryStep", "revision %.10s takes %d%% of requests (step 1 of %d)",
                   str(ro->state, "revision") ?: "", ro->cn.steps[0].weight, ro->cn.n_steps);
        return;
    }
    pod_diag pd;
    char inst[300];
    snprintf(inst, sizeof inst, "%s-canary", str(json_object_get(d, "metadata"), "name"));
    pod_diag_examine(k, str(json_object_get(d, "metadata"), "namespace"), inst,
                     des_health_port(d), &pd);
    if (pd.degraded)
        rollback(k, d, ro, pd.reason, pd.message);
}

/* Progressing: one analysis of the window since the step began. */
static void analyse(kube_client *k, json_t *d, rollout *ro, int paused)
{
    cn_sample now, base, win;
    cn_analysis a;
    if (colocated(ro)) { /* keep every pod (a restarted one too) on the step's weight */
        coloc c;
        colocate(k, d, 0, (int)json_integer_value(json_object_get(ro->state, "weight")), &c);
    }
    if (!sample(k, d, ro, &now)) {
        memset(&a, 0, sizeof a);
        snprintf(a.message, sizeof a.message, "no %s answered on /metrics", colocated(ro) ? "pod" : "router");
    } else {
        if (!cn_sample_from_json(json_object_get(ro->state, "window"), &base))
            json_object_set_new(ro->state, "window", cn_sample_to_json(&now)), base = now;
        cn_sample_diff(&now, &base, &win);
        cn_analyse(&ro->cn, &win, &a);
    }
    record(ro, &a);
    int step = (int)json_integer_value(json_object_get(ro->state, "step"));
    double age = (double)time(NULL) - (double)json_integer_value(json_object_get(ro->state, "stepStartTime"));
    switch (cn_decide(&ro->cn, step, age, a.verdict, paused)) {
    case CN_ROLLBACK:
        rollback(k, d, ro, a.signal, a.message);
        break;
    case CN_ADVANCE:
        begin_step(ro, step + 1, &now);
        set_str(ro->state, "message", a.message);
        if (colocated(ro)) {
            coloc c;
            colocate(k, d, 0, ro->cn.steps[step + 1].weight, &c);
        }
        kube_event(k, d, "Normal", "CanaryStep", "revision %.10s takes %d%% of requests (step %d of %d): %s",
                   str(ro->state, "revision") ?: "", ro->cn.steps[step + 1].weight, step + 2, ro->cn.n_steps, a.message);
        break;
    case CN_PROMOTE:
        promote(k, d, ro, a.message);
        break;
    case CN_HOLD:
        json_object_set_new(ro->state, "phase", json_string(paused ? "Paused" : "Progressing"));
        break;
    }
}

/* The one-shot actions are removed once done (pause stays until resumed). */
static void clear_action(kube_client *k, json_t *d)
{
    char path[1024];
    snprintf(path, sizeof path, "/apis/llmk8s.io/v1alpha1/namespaces/%s/llmdeployments/%s",
             str(json_object_get(d, "metadata"), "namespace"), str(json_object_get(d, "metadata"), "name"));
    json_t *patch = json_pack("{s:{s:{s:n}}}", "metadata", "annotations", RO_ACTION_ANN), *now = NULL;
    llm_error e = {0};
    if (kube_request(k, "PATCH", path, patch, "application/merge-patch+json", &now, &e))
        fprintf(stderr, "llm-controller: cannot remove %s from %s: %s\n", RO_ACTION_ANN, path, e.msg);
    else /* our own write: the status written at the end of this reconcile is at its version */
        json_object_set(json_object_get(d, "metadata"), "resourceVersion", get2(now, "metadata", "resourceVersion") ?: json_null());
    json_decref(now);
    json_decref(patch);
}

/* A canary in flight: the kubectl levers, then its phase's turn. */
static void progress(kube_client *k, json_t *d, rollout *ro, json_t *canary, int total)
{
    const char *action = str(get2(d, "metadata", "annotations"), RO_ACTION_ANN);
    int one_shot = same(action, "resume") || same(action, "promote") || same(action, "abort");
    ro->mode = RO_CANARY;
    ro->requeue_s = ro->cn.interval_s;
    if (same(str(ro->state, "phase"), "Promoting")) {
        coloc c;
        if (colocated(ro))
            colocate(k, d, 0, 100, &c); /* every pod on the new model, then the stable rolls to it */
        if (colocated(ro) ? c.pods > 0 && c.ready == c.pods : ready_pods(canary) >= total && dep_done(canary))
            ro->mode = RO_PROMOTING; /* the canary can carry it all: shift, then roll the stable */
        ro->requeue_s = 2;
    } else if (same(action, "abort")) {
        rollback(k, d, ro, "Aborted", "aborted through the " RO_ACTION_ANN " annotation");
    } else if (same(action, "promote")) {
        promote(k, d, ro, "promoted through the " RO_ACTION_ANN " annotation");
        ro->requeue_s = 1;
    } else if (same(str(ro->state, "phase"), "Starting")) {
        starting(k, d, ro, canary);
        ro->requeue_s = ro->mode == RO_CANARY ? 2 : 0;
    } else {
        analyse(k, d, ro, same(action, "pause"));
    }
    if (one_shot)
        clear_action(k, d);
    if (ro->mode == RO_ROLLED_BACK && colocated(ro)) { /* out of the stable pods again */
        coloc c;
        colocate(k, d, 1, 0, &c);
    }
}

/* The template is the stable's again (a canary went back to it, or it was
 * promoted): finish a promotion once the stable pods all run it. */
static void settle(kube_client *k, json_t *d, rollout *ro, json_t *stable, const char *new_rev)
{
    const char *phase = str(ro->state, "phase");
    int promoting = same(phase, "Promoting") && same(str(ro->state, "revision"), new_rev);
    ro->mode = RO_NONE;
    if (promoting && !dep_done(stable)) {
        ro->mode = RO_PROMOTING;
        ro->requeue_s = 2;
    } else if (promoting) {
        json_object_set_new(ro->state, "phase", json_string("Promoted"));
        json_object_set_new(ro->state, "weight", json_integer(0));
        set_str(ro->state, "message", "the new revision serves all traffic from the stable Deployment");
        kube_event(k, d, "Normal", "CanaryPromoted", "revision %.10s is stable", new_rev);
    } else if (same(phase, "Starting") || same(phase, "Progressing") || same(phase, "Paused")) {
        json_object_set_new(ro->state, "phase", json_string("Cancelled"));
        json_object_set_new(ro->state, "weight", json_integer(0));
        set_str(ro->state, "message", "the spec went back to the stable revision");
    }
}

/* ---- plan ------------------------------------------------------------------------ */

/* The objects the mode wants; dep becomes the stable's while it is kept. */
static llm_status objects(json_t *d, rollout *ro, json_t *stable, int total, json_t *cm, json_t *dep, llm_error *err)
{
    int w = (int)json_integer_value(json_object_get(ro->state, "weight")), s_rep = total, c_rep = total;
    int col = colocated(ro) && (ro->mode == RO_CANARY || ro->mode == RO_PROMOTING);
    ro->weight = ro->mode == RO_PROMOTING ? 100 : ro->mode == RO_CANARY ? w : 0;
    if (ro->mode == RO_CANARY && !col && !same(str(ro->state, "phase"), "Promoting"))
        cn_split(total, w, &s_rep, &c_rep);
    ro->weight_cm = des_router_weight(d, col ? 0 : ro->weight); /* colocated: the pods split, not the routers */
    if (!col && (ro->mode == RO_CANARY || ro->mode == RO_PROMOTING) &&
        (!(ro->canary_cm = des_canary_configmap(d, cm)) || !(ro->canary_dep = des_canary_deployment(d, dep, c_rep)) ||
         !(ro->canary_svc = des_canary_service(d))))
        return llm_errf(err, LLM_ERR_NOMEM, "cannot build the canary's objects");
    if (ro->mode == RO_CANARY || ro->mode == RO_ROLLED_BACK) { /* the stable pods keep what they run */
        json_t *tmpl = json_deep_copy(get2(stable, "spec", "template"));
        if (!tmpl)
            return llm_errf(err, LLM_ERR_NOMEM, "cannot copy the stable pod template");
        json_object_set_new(json_object_get(dep, "spec"), "template", tmpl);
        json_object_set_new(get2(dep, "metadata", "annotations"), DES_TEMPLATE_ANN, json_string(ro->stable_rev));
        const char *base = str(get2(stable, "metadata", "annotations"), DES_BASE_ANN);
        if (base) /* what the stable pods run, not the spec's */
            json_object_set_new(get2(dep, "metadata", "annotations"), DES_BASE_ANN, json_string(base));
        else
            json_object_del(get2(dep, "metadata", "annotations"), DES_BASE_ANN);
        json_object_set_new(json_object_get(dep, "spec"), "replicas", json_integer(s_rep));
        ro->keep_config = 1;
    }
    return ro->weight_cm ? LLM_OK : llm_errf(err, LLM_ERR_NOMEM, "cannot build the router's weight ConfigMap");
}

llm_status ro_plan(kube_client *k, json_t *d, json_t *stable, const char *new_rev, int total, json_t *cm, json_t *dep,
                   rollout *ro, llm_error *err)
{
    memset(ro, 0, sizeof *ro);
    llm_status st = cn_config_from_spec(json_object_get(d, "spec"), &ro->cn, err);
    if (st || !ro->cn.enabled)
        return st;
    const char *ns = str(json_object_get(d, "metadata"), "namespace"), *name = str(json_object_get(d, "metadata"), "name");
    char path[1024];
    json_t *canary = NULL;
    snprintf(path, sizeof path, "/apis/apps/v1/namespaces/%s/deployments/%s-canary", ns, name);
    st = kube_read(k, path, &canary, err);
    if (st && st != LLM_ERR_NOT_FOUND) /* a failed read is not "no canary pods": the analysis would judge none */
        return st;
    const char *uid = str(json_object_get(d, "metadata"), "uid"), *by = kube_controller_uid(canary);
    if (canary && (!uid || !by || strcmp(uid, by))) { /* e.g. the Deployment of an LLMDeployment named NAME-canary */
        json_decref(canary);
        return llm_errf(err, LLM_ERR_EXISTS, "Deployment %s-canary exists and is not this LLMDeployment's (uid %s): "
                        "rename or delete it", name, uid ? uid : "?");
    }
    st = LLM_OK;
    const char *srev = str(get2(stable, "metadata", "annotations"), DES_TEMPLATE_ANN);
    snprintf(ro->stable_rev, sizeof ro->stable_rev, "%s", srev ? srev : new_rev);
    json_t *prev = get2(d, "status", "canary");
    ro->state = json_is_object(prev) ? json_deep_copy(prev) : json_object();
    if (!ro->state)
        st = llm_errf(err, LLM_ERR_NOMEM, "no memory for the canary's state");
    else if (!srev || !strcmp(srev, new_rev))
        settle(k, d, ro, stable, new_rev);
    else if (same(str(ro->state, "rolledBackRevision"), new_rev))
        ro->mode = RO_ROLLED_BACK;
    else {
        if (!same(str(ro->state, "revision"), new_rev))
            start(k, d, ro, new_rev, srev,
                  same(str(get2(stable, "metadata", "annotations"), DES_BASE_ANN),
                       str(get2(dep, "metadata", "annotations"), DES_BASE_ANN)));
        progress(k, d, ro, canary, total);
    }
    if (!st)
        st = objects(d, ro, stable, total, cm, dep, err);
    json_decref(canary);
    return st;
}

/* ---- apply ----------------------------------------------------------------------- */

llm_status ro_apply(kube_client *k, json_t *d, rollout *ro, llm_error *err)
{
    const char *ns = str(json_object_get(d, "metadata"), "namespace"), *name = str(json_object_get(d, "metadata"), "name");
    const char *uid = str(json_object_get(d, "metadata"), "uid");
    char cms[512], deps[512], svcs[512], path[1024];
    snprintf(cms, sizeof cms, "/api/v1/namespaces/%s/configmaps", ns);
    snprintf(deps, sizeof deps, "/apis/apps/v1/namespaces/%s/deployments", ns);
    snprintf(svcs, sizeof svcs, "/api/v1/namespaces/%s/services", ns);
    kube_applied did;
    llm_status st = LLM_OK;
    if (ro->weight_cm) /* first: traffic leaves a canary before it goes, and reaches it before the stable rolls */
        st = kube_apply(k, cms, ro->weight_cm, &did, err);
    else if (json_is_object(get2(d, "status", "canary"))) { /* spec.canary was removed */
        snprintf(path, sizeof path, "%s/%s-router", cms, name);
        st = kube_remove_ours(k, path, uid, err);
    }
    if (ro->canary_dep) {
        if (!st)
            st = kube_apply(k, cms, ro->canary_cm, &did, err);
        if (!st)
            st = kube_apply(k, svcs, ro->canary_svc, &did, err);
        if (!st)
            st = kube_apply(k, deps, ro->canary_dep, &did, err);
        return st;
    }
    if (!ro->state && !json_is_object(get2(d, "status", "canary")))
        return st; /* never had a canary: nothing to look for */
    snprintf(path, sizeof path, "%s/%s-canary", deps, name);
    if (!st)
        st = kube_remove_ours(k, path, uid, err);
    snprintf(path, sizeof path, "%s/%s-canary-backends", svcs, name);
    if (!st)
        st = kube_remove_ours(k, path, uid, err);
    snprintf(path, sizeof path, "%s/%s-canary-config", cms, name);
    if (!st)
        st = kube_remove_ours(k, path, uid, err);
    return st;
}

int ro_in_flight(json_t *canary_status)
{
    const char *phase = str(canary_status, "phase");
    return same(phase, "Starting") || same(phase, "Progressing") || same(phase, "Paused") || same(phase, "Promoting");
}

void ro_conditions(const rollout *ro, json_t *conds, json_int_t gen)
{
    if (!ro->state)
        return;
    const char *phase = str(ro->state, "phase") ?: "None", *msg = str(ro->state, "message") ?: "";
    const char *analysis = str(json_object_get(ro->state, "lastAnalysis"), "message");
    int live = ro_in_flight(ro->state);
    char text[1024];
    snprintf(text, sizeof text, "step %lld of %d at %lld%%: %s", (long long)json_integer_value(json_object_get(ro->state, "step")) + 1,
             ro->cn.n_steps, (long long)json_integer_value(json_object_get(ro->state, "weight")), analysis ? analysis : msg);
    json_array_append_new(conds, rec_condition("CanaryProgressing", live, live ? phase : "NoCanary",
                                           live ? (same(phase, "Progressing") || same(phase, "Paused") ? text : msg)
                                                : "no canary in progress", gen));
    json_array_append_new(conds, rec_condition("CanaryPromoted", same(phase, "Promoted"),
                                           same(phase, "Promoted") ? "Promoted" : "NotPromoted",
                                           same(phase, "Promoted") ? msg : "the last canary was not promoted", gen));
    const char *col = str(ro->state, "colocation");
    if (ro->cn.colocated && col && *col) { /* "Reason: message" */
        const char *colon = strchr(col, ':');
        char reason[48];
        snprintf(reason, sizeof reason, "%.*s", colon ? (int)(colon - col) : (int)strlen(col), col);
        json_array_append_new(conds, rec_condition("CanaryColocated", same(reason, "Colocated"), reason,
                                               colon ? colon + 2 : col, gen));
    }
    int back = same(phase, "RolledBack");
    json_array_append_new(conds, rec_condition("CanaryRolledBack", back, back ? (str(ro->state, "signal") ?: "RolledBack") : "NotRolledBack",
                                           back ? msg : "no rollback", gen));
}

void ro_free(rollout *ro)
{
    json_decref(ro->state);
    json_decref(ro->weight_cm);
    json_decref(ro->canary_cm);
    json_decref(ro->canary_dep);
    json_decref(ro->canary_svc);
    memset(ro, 0, sizeof *ro);
}
