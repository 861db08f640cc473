/* rollout.c - canary upgrades: state, analysis turns and the objects they
 * need; see rollout.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "desired.h"
#include "llm/clock.h"
#include "kube_json.h"
#include "kube_meta.h"
#include "kube_status.h"
#include "plan.h"
#include "rollout.h"

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
    json_int_t want = json_integer_value(kube_json_get(dep, "spec", "replicas"));
    return dep && json_integer_value(json_object_get(s, "observedGeneration")) >= json_integer_value(kube_json_get(dep, "metadata", "generation")) &&
           json_integer_value(json_object_get(s, "updatedReplicas")) == want &&
           json_integer_value(json_object_get(s, "readyReplicas")) == want &&
           json_integer_value(json_object_get(s, "replicas")) == want;
}

static int ready_pods(json_t *dep)
{
    return (int)json_integer_value(kube_json_get(dep, "status", "readyReplicas"));
}

static int colocated(const rollout *ro)
{
    return same(kube_json_str(ro->state, "mode"), "colocated");
}

static void event(rollout *ro, const char *type, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void event(rollout *ro, const char *type, const char *reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    plan_eventv(ro->events, type, reason, fmt, ap);
    va_end(ap);
}

/* The counters the analysis reads - the routers', or the stable pods' own
 * for a canary colocated in them - as the last round read them; 0 when no
 * round has read them for this mode yet (nothing to start a window from). */
static int sample(const rollout *ro, const rollout_seen *seen, canary_sample *s)
{
    const podsig_reading *r = seen->pods;
    memset(s, 0, sizeof *s);
    if (!r || r->age_s < 0 || r->need.canary != (colocated(ro) ? 2 : 1))
        return 0;
    *s = r->canary;
    return 1;
}

/* The pods' answers to the last /admin/canary call for this revision
 * (serving it, not unloading); NULL when there are none. */
static const podsig_admin *answers(const rollout *ro, const rollout_seen *seen)
{
    const podsig_admin *a = seen->pods ? &seen->pods->admin : NULL;
    return a && a->valid && !a->unload && same(a->rev, kube_json_str(ro->state, "revision")) ? a : NULL;
}

/* 1 when the last /admin/canary call unloaded this revision from every
 * pod asked. */
static int unloaded(const rollout *ro, const rollout_seen *seen)
{
    const podsig_admin *a = seen->pods ? &seen->pods->admin : NULL;
    return a && a->valid && a->unload && same(a->rev, kube_json_str(ro->state, "revision")) && a->answered == a->pods;
}

/* The next /admin/canary call: every ready stable pod serves the spec's
 * model as the canary at weight (or unloads it); the latest wish wins. */
static void admin(rollout *ro, int unload, int weight)
{
    ro->admin = unload ? 2 : 1;
    ro->admin_weight = unload ? 0 : weight;
}

/* ---- transitions ---------------------------------------------------------------- */

/* A new revision: colocated in the stable pods when asked for and only the
 * model changed (base hashes equal), else in its own pods. */
static void start(rollout *ro, const char *new_rev, const char *stable_rev, int same_base)
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
    event(ro, "Normal", "CanaryStarted", "revision %.10s starts beside stable %.10s%s", new_rev, stable_rev,
               col ? " inside the stable pods" : "");
}

static void rollback(rollout *ro, const char *signal, const char *msg)
{
    json_t *st = ro->state;
    char rev[17];
    snprintf(rev, sizeof rev, "%s", kube_json_str(st, "revision") ?: "");
    json_object_set_new(st, "phase", json_string("RolledBack"));
    json_object_set_new(st, "weight", json_integer(0));
    set_str(st, "rolledBackRevision", rev);
    set_str(st, "signal", signal);
    set_str(st, "message", msg);
    event(ro, "Warning", "CanaryRolledBack", "revision %.10s rolled back: %s: %s", rev, signal, msg);
    ro->mode = ROLLOUT_ROLLED_BACK;
}

static void promote(rollout *ro, const char *why)
{
    json_object_set_new(ro->state, "phase", json_string("Promoting"));
    set_str(ro->state, "message", why);
    event(ro, "Normal", "CanaryPromoting", "revision %.10s: %s", kube_json_str(ro->state, "revision") ?: "", why);
}

static void begin_step(rollout *ro, int step, const canary_sample *now, double now_unix)
{
    json_object_set_new(ro->state, "step", json_integer(step));
    json_object_set_new(ro->state, "weight", json_integer(ro->cn.steps[step].weight));
    json_object_set_new(ro->state, "stepStartTime", json_integer((json_int_t)now_unix));
    json_object_set_new(ro->state, "window", canary_sample_to_json(now));
    json_object_set_new(ro->state, "windowStartTime", json_integer((json_int_t)now_unix));
    json_object_set_new(ro->state, "phase", json_string("Progressing"));
}

static void record(rollout *ro, const canary_analysis *a, double now_unix)
{
    static const char *const verdicts[] = {"Inconclusive", "Pass", "Fail"};
    char now[32];
    llm_clock_rfc3339(now_unix, now);
    json_object_set_new(ro->state, "lastAnalysis",
                        json_pack("{s:s,s:s,s:s,s:f,s:f,s:f,s:f}", "time", now, "result", verdicts[a->verdict], "message",
                                  a->message, "canaryRequests", a->requests[1], "canaryErrorRatio", a->error_ratio[1],
                                  "canaryTTFTp99", a->ttft_p99[1], "stableTTFTp99", a->ttft_p99[0]));
}

/* ---- the quality gate ----------------------------------------------------------------- */

/* The judge's result as status.canary.quality.<stage> (a new object). */
static json_t *quality_record(const judge_result *r, const char *result, double kl, double top1, double now_unix)
{
    char now[32];
    llm_clock_rfc3339(now_unix, now);
    return json_pack("{s:s,s:s,s:s,s:f,s:f,s:f,s:I,s:i,s:s}", "time", now, "revision", r->rev, "result", result,
                     "meanKL", kl, "maxKL", r->sum.kl_max, "top1Agreement", top1, "positions",
                     (json_int_t)r->sum.positions, "texts", r->texts, "message", r->message);
}

/* The quality gate at stage (1 before the first step, 2 before
 * promotion): 1 when it passed (or there is none); 0 while it waits (a
 * judgement asked for, held, or rolled back). */
static int quality_gate(rollout *ro, const rollout_seen *seen, int stage)
{
    const canary_quality *q = &ro->cn.quality;
    const char *rev = kube_json_str(ro->state, "revision") ?: "", *slot = stage == 1 ? "start" : "promotion";
    json_t *all = json_object_get(ro->state, "quality");
    json_t *done = json_object_get(all, slot);
    if (!q->enabled || (same(kube_json_str(done, "revision"), rev) && same(kube_json_str(done, "result"), "Pass")))
        return 1;
    const judge_result *r = seen->quality;
    if (!r || r->state != JUDGE_DONE || r->stage != stage || strcmp(r->rev, rev)) {
        ro->need_quality = stage;
        set_str(ro->state, "message", stage == 1 ? "judging the canary's answers against the stable revision's before "
                                                   "it takes traffic" : "judging the canary's answers again before promotion");
        return 0;
    }
    double kl = r->sum.positions ? r->sum.kl / (double)r->sum.positions : 0;
    double top1 = r->sum.positions ? (double)r->sum.top1_same / (double)r->sum.positions : 0;
    int pass = r->outcome == 1 && kl <= q->max_kl && top1 >= q->min_top1;
    const char *result = r->outcome < 0 ? "ReadFailed" : !r->outcome ? "Incomparable" : pass ? "Pass" : "Fail";
    char msg[900];
    if (r->outcome == 1)
        snprintf(msg, sizeof msg, "mean KL divergence %.4f (max %.4f), top-1 agreement %.3f (min %.3f) over %ld positions "
                 "of %d texts", kl, q->max_kl, top1, q->min_top1, r->sum.positions, r->texts);
    else
        snprintf(msg, sizeof msg, "%s: %s", r->outcome < 0 ? "the quality reads failed (tried again)"
                                            : "the revisions cannot be compared", r->message);
    int news = !same(kube_json_str(done, "revision"), rev) || !same(kube_json_str(done, "result"), result);
    if (!json_is_object(all))
        json_object_set_new(ro->state, "quality", all = json_object());
    json_object_set_new(all, slot, quality_record(r, result, kl, top1, seen->now)); /* (done goes with it) */
    if (pass) {
        event(ro, "Normal", "QualityPassed", "revision %.10s %s: %s", rev, stage == 1 ? "may take traffic" : "may be promoted", msg);
        return 1;
    }
    if (r->outcome == 1 || (r->outcome == 0 && q->fail_incomparable)) {
        rollback(ro, r->outcome == 1 ? "QualityRegression" : "QualityIncomparable", msg);
        return 0;
    }
    set_str(ro->state, "message", msg);
    ro->need_quality = stage; /* held: a failed read is asked again (the judge waits JUDGE_RETRY_S) */
    if (news) /* said once per result, not once per analysis */
        event(ro, "Warning", r->outcome ? "QualityReadFailed" : "QualityIncomparable", "revision %.10s: %s", rev, msg);
    return 0;
}

/* Starting, colocated: the stable pods load the canary's model (at weight
 * 0); its first step begins once they all serve it. One that does not fit
 * goes back to pods of its own; one that fails to load is rolled back. */
static void starting_colocated(rollout *ro, const rollout_seen *seen)
{
    const podsig_admin *a = answers(ro, seen);
    canary_sample now;
    if (a && a->misfit) { /* back to pods of its own, saying why */
        admin(ro, 1, 0);
        char why[600];
        snprintf(why, sizeof why, "ColocationDoesNotFit: %s; the canary runs in its own pods", a->message);
        json_object_set_new(ro->state, "mode", json_string("pods"));
        set_str(ro->state, "colocation", why);
        set_str(ro->state, "message", "waiting for the canary's pods");
        event(ro, "Warning", "ColocationDoesNotFit", "%s", why);
    } else if (a && a->failed) {
        rollback(ro, "CanaryFailed", a->message);
    } else if (a && a->pods > 0 && a->ready == a->pods && sample(ro, seen, &now)) {
        if (!quality_gate(ro, seen, 1)) {
            if (ro->mode != ROLLOUT_ROLLED_BACK)
                admin(ro, 0, 0); /* every pod keeps it loaded (a restarted one too) at weight 0 */
            return;
        }
        begin_step(ro, 0, &now, seen->now);
        set_str(ro->state, "message", "step 1 began");
        admin(ro, 0, ro->cn.steps[0].weight);
        event(ro, "Normal", "CanaryStep", "revision %.10s takes %d%% of requests inside the stable pods "
              "(step 1 of %d)", kube_json_str(ro->state, "revision") ?: "", ro->cn.steps[0].weight, ro->cn.n_steps);
    } else { /* loading, or not asked yet: ask (again) */
        admin(ro, 0, 0);
        if (a && !a->pods && a->message[0]) /* no pod asked (no ready pod, the admin key unreadable): say why */
            set_str(ro->state, "message", a->message);
    }
}

static void starting(rollout *ro, const rollout_seen *seen)
{
    if (colocated(ro)) {
        starting_colocated(ro, seen);
        return;
    }
    canary_sample now;
    if (ready_pods(seen->canary) > 0 && sample(ro, seen, &now)) {
        if (!quality_gate(ro, seen, 1))
            return;
        begin_step(ro, 0, &now, seen->now);
        set_str(ro->state, "message", "step 1 began");
        event(ro, "Normal", "CanaryStep", "revision %.10s takes %d%% of requests (step 1 of %d)",
              kube_json_str(ro->state, "revision") ?: "", ro->cn.steps[0].weight, ro->cn.n_steps);
        return;
    }
    const podsig_reading *r = seen->pods;
    if (r && r->age_s >= 0 && r->need.diag && r->canary_diag.degraded)
        rollback(ro, r->canary_diag.reason, r->canary_diag.message);
}

/* Progressing: one analysis of the window since the step began. */
static void analyse(rollout *ro, const rollout_seen *seen, int paused)
{
    canary_sample now, base, win;
    canary_analysis a;
    if (colocated(ro)) /* keep every pod (a restarted one too) on the step's weight */
        admin(ro, 0, (int)json_integer_value(json_object_get(ro->state, "weight")));
    const podsig_reading *pr = seen->pods;
    if (!sample(ro, seen, &now) || !pr->canary_pods) {
        memset(&a, 0, sizeof a);
        snprintf(a.message, sizeof a.message, "no %s answered on /metrics", colocated(ro) ? "pod" : "router");
    } else if (pr->canary_own < PODSIG_VERDICT_SHARE * pr->canary_asked) {
        /* the silent ones may hold the canary's errors: no verdict on the rest (and no window moved) */
        memset(&a, 0, sizeof a);
        snprintf(a.message, sizeof a.message, "only %d of %d %s pages answered on /metrics; a verdict needs %.0f%%",
                 pr->canary_own, pr->canary_asked, colocated(ro) ? "pod" : "router", 100 * PODSIG_VERDICT_SHARE);
    } else {
        if (!canary_sample_from_json(json_object_get(ro->state, "window"), &base))
            json_object_set_new(ro->state, "window", canary_sample_to_json(&now)), base = now;
        if (canary_sample_diff(&now, &base, &win)) {
            /* the pages read are not the ones the window began with (a router or gateway restarted, or did
             * not answer): their counters are their lifetimes', earlier rollouts' too - the window starts
             * again here, with nothing in it yet */
            json_object_set_new(ro->state, "window", canary_sample_to_json(&now));
            json_object_set_new(ro->state, "windowStartTime", json_integer((json_int_t)seen->now));
            memset(&win, 0, sizeof win);
        }
        canary_analyse(&ro->cn, &win, &a);
    }
    record(ro, &a, seen->now);
    int step = (int)json_integer_value(json_object_get(ro->state, "step"));
    double age = seen->now - (double)json_integer_value(json_object_get(ro->state, "stepStartTime"));
    json_t *ws = json_object_get(ro->state, "windowStartTime"); /* (a state from before it: the step's start) */
    double wage = json_is_integer(ws) ? seen->now - (double)json_integer_value(ws) : age;
    canary_action act = canary_decide(&ro->cn, step, age, wage, a.verdict, paused);
    char why[700];
    if (a.verdict == CANARY_INCONCLUSIVE && act != CANARY_HOLD) /* no verdict in time: the wait is the reason */
        snprintf(why, sizeof why, "no verdict in %.0f s at step %d (inconclusiveTimeoutSeconds): %s", wage, step + 1, a.message);
    switch (act) {
    case CANARY_ROLLBACK:
        if (a.verdict == CANARY_INCONCLUSIVE)
            rollback(ro, "Inconclusive", why);
        else
            rollback(ro, a.signal, a.message);
        break;
    case CANARY_STALLED:
        if (!same(kube_json_str(ro->state, "phase"), "Paused"))
            event(ro, "Warning", "CanaryInconclusive", "revision %.10s: %s; held until it has a verdict, or the %s "
                  "annotation says promote or abort", kube_json_str(ro->state, "revision") ?: "", why, ROLLOUT_ACTION_ANN);
        json_object_set_new(ro->state, "phase", json_string("Paused"));
        set_str(ro->state, "message", why);
        break;
    case CANARY_ADVANCE:
        begin_step(ro, step + 1, &now, seen->now);
        set_str(ro->state, "message", a.message);
        if (colocated(ro))
            admin(ro, 0, ro->cn.steps[step + 1].weight);
        event(ro, "Normal", "CanaryStep", "revision %.10s takes %d%% of requests (step %d of %d): %s",
              kube_json_str(ro->state, "revision") ?: "", ro->cn.steps[step + 1].weight, step + 2, ro->cn.n_steps, a.message);
        break;
    case CANARY_PROMOTE:
        if (quality_gate(ro, seen, 2))
            promote(ro, a.message);
        else if (ro->mode != ROLLOUT_ROLLED_BACK)
            json_object_set_new(ro->state, "phase", json_string(paused ? "Paused" : "Progressing"));
        break;
    case CANARY_HOLD:
        json_object_set_new(ro->state, "phase", json_string(paused ? "Paused" : "Progressing"));
        break;
    }
}

/* Promoting: every stable pod serves the canary's model at weight 100
 * (colocated), or the canary's own pods can carry all replicas; then the
 * stable rolls to the new template. */
static void promoting(rollout *ro, const rollout_seen *seen, int total)
{
    if (colocated(ro)) {
        const podsig_admin *a = answers(ro, seen);
        admin(ro, 0, 100);
        if (a && a->weight == 100 && a->pods > 0 && a->ready == a->pods)
            ro->mode = ROLLOUT_PROMOTING;
    } else if (ready_pods(seen->canary) >= total && dep_done(seen->canary)) {
        ro->mode = ROLLOUT_PROMOTING; /* the canary can carry it all: shift, then roll the stable */
    }
    ro->requeue_s = 2;
}

/* A canary in flight: the kubectl levers, then its phase's turn. */
static void progress(json_t *d, rollout *ro, const rollout_seen *seen, int total)
{
    const char *action = kube_json_str(kube_json_get(d, "metadata", "annotations"), ROLLOUT_ACTION_ANN);
    ro->clear_action = same(action, "resume") || same(action, "promote") || same(action, "abort");
    ro->mode = ROLLOUT_CANARY;
    ro->requeue_s = ro->cn.interval_s;
    if (same(kube_json_str(ro->state, "phase"), "Promoting")) {
        if (ro->clear_action && !same(action, "promote")) /* past the point of return: said, not done */
            event(ro, "Warning", "CanaryActionIgnored", "%s: the canary is being promoted; the %s annotation is removed",
                  action, ROLLOUT_ACTION_ANN);
        promoting(ro, seen, total);
    } else if (same(action, "abort")) {
        rollback(ro, "Aborted", "aborted through the " ROLLOUT_ACTION_ANN " annotation");
    } else if (same(action, "promote")) {
        promote(ro, "promoted through the " ROLLOUT_ACTION_ANN " annotation");
        ro->requeue_s = 1;
    } else if (same(kube_json_str(ro->state, "phase"), "Starting")) {
        starting(ro, seen);
        ro->requeue_s = ro->mode == ROLLOUT_CANARY ? 2 : 0;
    } else {
        analyse(ro, seen, same(action, "pause"));
    }
    if (ro->mode == ROLLOUT_ROLLED_BACK && colocated(ro)) /* out of the stable pods again */
        admin(ro, 1, 0);
}

/* The template is the stable's again (a canary went back to it, or it was
 * promoted): finish a promotion once the stable pods all run it. */
static void settle(rollout *ro, json_t *stable, const char *new_rev)
{
    const char *phase = kube_json_str(ro->state, "phase");
    int promoting = same(phase, "Promoting") && same(kube_json_str(ro->state, "revision"), new_rev);
    ro->mode = ROLLOUT_NONE;
    if (promoting && !dep_done(stable)) {
        ro->mode = ROLLOUT_PROMOTING;
        ro->requeue_s = 2;
    } else if (promoting) {
        json_object_set_new(ro->state, "phase", json_string("Promoted"));
        json_object_set_new(ro->state, "weight", json_integer(0));
        set_str(ro->state, "message", "the new revision serves all traffic from the stable Deployment");
        event(ro, "Normal", "CanaryPromoted", "revision %.10s is stable", new_rev);
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
    int col = colocated(ro) && (ro->mode == ROLLOUT_CANARY || ro->mode == ROLLOUT_PROMOTING);
    ro->weight = ro->mode == ROLLOUT_PROMOTING ? 100 : ro->mode == ROLLOUT_CANARY ? w : 0;
    if (ro->mode == ROLLOUT_CANARY && !col && !same(kube_json_str(ro->state, "phase"), "Promoting"))
        canary_split(total, w, &s_rep, &c_rep);
    ro->weight_cm = desired_router_weight(d, col ? 0 : ro->weight); /* colocated: the pods split, not the routers */
    if (!col && (ro->mode == ROLLOUT_CANARY || ro->mode == ROLLOUT_PROMOTING) &&
        (!(ro->canary_cm = desired_canary_configmap(d, cm)) || !(ro->canary_dep = desired_canary_deployment(d, dep, c_rep)) ||
         !(ro->canary_svc = desired_canary_service(d))))
        return llm_errf(err, LLM_ERR_NOMEM, "cannot build the canary's objects");
    if (ro->mode == ROLLOUT_CANARY || ro->mode == ROLLOUT_ROLLED_BACK) { /* the stable pods keep what they run */
        json_t *tmpl = json_deep_copy(kube_json_get(stable, "spec", "template"));
        if (!tmpl)
            return llm_errf(err, LLM_ERR_NOMEM, "cannot copy the stable pod template");
        json_object_set_new(json_object_get(dep, "spec"), "template", tmpl);
        json_object_set_new(kube_json_get(dep, "metadata", "annotations"), DESIRED_TEMPLATE_ANN, json_string(ro->stable_rev));
        static const char *const kept[] = {DESIRED_BASE_ANN, DESIRED_SERVING_ANN};
        for (size_t i = 0; i < 2; i++) { /* what the stable pods run, not the spec's */
            const char *v = kube_json_str(kube_json_get(stable, "metadata", "annotations"), kept[i]);
            if (v)
                json_object_set_new(kube_json_get(dep, "metadata", "annotations"), kept[i], json_string(v));
            else
                json_object_del(kube_json_get(dep, "metadata", "annotations"), kept[i]);
        }
        json_object_set_new(json_object_get(dep, "spec"), "replicas", json_integer(s_rep));
        ro->keep_config = 1;
    }
    return ro->weight_cm ? LLM_OK : llm_errf(err, LLM_ERR_NOMEM, "cannot build the router's weight ConfigMap");
}

llm_status rollout_plan(json_t *d, json_t *stable, const char *new_rev, int total, json_t *cm, json_t *dep,
                   const rollout_seen *seen, rollout *ro, llm_error *err)
{
    memset(ro, 0, sizeof *ro);
    if (!(ro->events = json_array()))
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the canary's events");
    llm_status st = canary_config_from_spec(json_object_get(d, "spec"), &ro->cn, err);
    if (st || !ro->cn.enabled)
        return st;
    const char *name = kube_json_str(json_object_get(d, "metadata"), "name"), *uid = kube_json_str(json_object_get(d, "metadata"), "uid");
    const char *by = kube_meta_controller_uid(seen->canary);
    if (seen->canary && (!uid || !by || strcmp(uid, by))) /* e.g. the Deployment of an LLMDeployment named NAME-canary */
        return llm_errf(err, KUBE_ERR_EXISTS, "Deployment %s-canary exists and is not this LLMDeployment's (uid %s): "
                        "rename or delete it", name, uid ? uid : "?");
    const char *srev = kube_json_str(kube_json_get(stable, "metadata", "annotations"), DESIRED_TEMPLATE_ANN);
    snprintf(ro->stable_rev, sizeof ro->stable_rev, "%s", srev ? srev : new_rev);
    json_t *prev = kube_json_get(d, "status", "canary");
    ro->state = json_is_object(prev) ? json_deep_copy(prev) : json_object();
    if (!ro->state)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the canary's state");
    const char *sserve = kube_json_str(kube_json_get(stable, "metadata", "annotations"), DESIRED_SERVING_ANN);
    if (!srev || !strcmp(srev, new_rev))
        settle(ro, stable, new_rev);
    else if (same(sserve, kube_json_str(kube_json_get(dep, "metadata", "annotations"), DESIRED_SERVING_ANN)))
        settle(ro, stable, new_rev); /* only the operator's key changed: one rolling restart, nothing to judge */
    else if (same(kube_json_str(ro->state, "rolledBackRevision"), new_rev)) {
        ro->mode = ROLLOUT_ROLLED_BACK;
        if (colocated(ro) && !unloaded(ro, seen)) { /* until every pod said it let the model go */
            admin(ro, 1, 0);
            ro->requeue_s = 5;
        }
    }
    else {
        /* a new revision, or one whose canary ended (cancelled by a spec that went back): from the start */
        if (!same(kube_json_str(ro->state, "revision"), new_rev) || !rollout_in_flight(ro->state))
            start(ro, new_rev, srev,
                  same(kube_json_str(kube_json_get(stable, "metadata", "annotations"), DESIRED_BASE_ANN),
                       kube_json_str(kube_json_get(dep, "metadata", "annotations"), DESIRED_BASE_ANN)));
        if (!ro->state)
            return llm_errf(err, LLM_ERR_NOMEM, "no memory for the canary's state");
        progress(d, ro, seen, total);
    }
    const char *lever = kube_json_str(kube_json_get(d, "metadata", "annotations"), ROLLOUT_ACTION_ANN);
    if (same(lever, "resume") || same(lever, "promote") || same(lever, "abort"))
        ro->clear_action = 1; /* done, or nothing left to do it to: a lever left behind would act on the next canary */
    const char *phase = kube_json_str(ro->state, "phase");
    if (same(phase, "Starting") || same(phase, "Progressing") || same(phase, "Paused")) { /* read for the next turn */
        ro->need_counters = colocated(ro) ? 2 : 1;
        ro->need_diag = same(phase, "Starting") && !colocated(ro);
    }
    return objects(d, ro, stable, total, cm, dep, err);
}

int rollout_in_flight(json_t *canary_status)
{
    const char *phase = kube_json_str(canary_status, "phase");
    return same(phase, "Starting") || same(phase, "Progressing") || same(phase, "Paused") || same(phase, "Promoting");
}

void rollout_conditions(const rollout *ro, json_t *conds, json_int_t gen)
{
    if (!ro->state)
        return;
    const char *phase = kube_json_str(ro->state, "phase") ?: "None", *msg = kube_json_str(ro->state, "message") ?: "";
    const char *analysis = kube_json_str(json_object_get(ro->state, "lastAnalysis"), "message");
    int live = rollout_in_flight(ro->state);
    char text[1024];
    snprintf(text, sizeof text, "step %lld of %d at %lld%%: %s", (long long)json_integer_value(json_object_get(ro->state, "step")) + 1,
             ro->cn.n_steps, (long long)json_integer_value(json_object_get(ro->state, "weight")), analysis ? analysis : msg);
    json_array_append_new(conds, plan_condition("CanaryProgressing", live, live ? phase : "NoCanary",
                                           live ? (same(phase, "Progressing") || same(phase, "Paused") ? text : msg)
                                                : "no canary in progress", gen));
    json_array_append_new(conds, plan_condition("CanaryPromoted", same(phase, "Promoted"),
                                           same(phase, "Promoted") ? "Promoted" : "NotPromoted",
                                           same(phase, "Promoted") ? msg : "the last canary was not promoted", gen));
    const char *col = kube_json_str(ro->state, "colocation");
    if (ro->cn.colocated && col && *col) { /* "Reason: message" */
        const char *colon = strchr(col, ':');
        char reason[48];
        snprintf(reason, sizeof reason, "%.*s", colon ? (int)(colon - col) : (int)strlen(col), col);
        json_array_append_new(conds, plan_condition("CanaryColocated", same(reason, "Colocated"), reason,
                                               colon ? colon + 2 : col, gen));
    }
    int back = same(phase, "RolledBack");
    json_array_append_new(conds, plan_condition("CanaryRolledBack", back, back ? (kube_json_str(ro->state, "signal") ?: "RolledBack") : "NotRolledBack",
                                           back ? msg : "no rollback", gen));
}

void rollout_free(rollout *ro)
{
    json_decref(ro->events);
    json_decref(ro->state);
    json_decref(ro->weight_cm);
    json_decref(ro->canary_cm);
    json_decref(ro->canary_dep);
    json_decref(ro->canary_svc);
    memset(ro, 0, sizeof *ro);
}
