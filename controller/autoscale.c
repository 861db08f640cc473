/* autoscale.c - the built-in autoscaler and the HPA child; see autoscale.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autoscale.h"
#include "llm/clock.h"
#include "desired.h" /* label names */
#include "kube_json.h"

#define HISTORY_MAX 5

const char *autoscale_metric_name(const char *metric)
{
    if (!strcmp(metric, "kvCacheUsage"))
        return "llm_kv_cache_usage_ratio";
    if (!strcmp(metric, "tokensPerSecond"))
        return "llm_generation_tokens_per_second";
    return "llm_requests_waiting";
}

llm_status autoscale_config_from_spec(json_t *spec, autoscale_config *c, llm_error *err)
{
    json_t *a = json_object_get(spec, "autoscaling");
    memset(c, 0, sizeof *c);
    c->enabled = json_is_true(json_object_get(a, "enabled"));
    const char *mode = json_string_value(json_object_get(a, "mode"));
    c->hpa = mode && !strcmp(mode, "hpa");
    const char *metric = json_string_value(json_object_get(a, "metric"));
    snprintf(c->metric, sizeof c->metric, "%s", metric ? metric : "queueDepth");
    c->min = kube_json_int(a, "minReplicas", 1);
    c->max = kube_json_int(a, "maxReplicas", 4);
    c->max_up_step = kube_json_int(a, "maxScaleUpStep", 4);
    c->interval_s = kube_json_int(a, "intervalSeconds", 15);
    c->up_window_s = kube_json_int(a, "scaleUpStabilizationSeconds", 0);
    c->down_window_s = kube_json_int(a, "scaleDownStabilizationSeconds", 300);
    c->tolerance = kube_json_num(a, "tolerance", 0.1);
    c->zero_after_s = kube_json_int(a, "scaleToZeroAfterSeconds", 300);
    double def = !strcmp(c->metric, "kvCacheUsage") ? 0.7 : !strcmp(c->metric, "tokensPerSecond") ? 100
                 : !strcmp(c->metric, "cpu") ? 80 : 4;
    c->target = kube_json_num(a, "target", def);
    if (!c->enabled)
        return LLM_OK;
    if (c->min < 0 || c->max < 1 || c->max < c->min)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.autoscaling: minReplicas %d and maxReplicas %d: need 0 <= min <= max, max >= 1",
                        c->min, c->max);
    json_t *rt = json_object_get(spec, "router");
    int routed = json_is_true(json_object_get(rt, "enabled")) || json_is_object(json_object_get(spec, "canary"));
    if (c->min == 0 && (c->hpa || !routed || kube_json_int(rt, "holdSeconds", 0) < 1))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.autoscaling.minReplicas 0 needs mode builtin and spec.router "
                                                  "(enabled, holdSeconds >= 1): requests wait in the router while the "
                                                  "first pod starts");
    if (c->zero_after_s < 1)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.autoscaling.scaleToZeroAfterSeconds: %d must be at least 1",
                        c->zero_after_s);
    if (!(c->target > 0))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.autoscaling.target: %g must be above 0", c->target);
    if (!c->hpa && !strcmp(c->metric, "cpu"))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.autoscaling.metric: cpu needs mode hpa (the built-in "
                                                  "autoscaler reads the serving signals)");
    if (c->hpa && fabs(c->tolerance - 0.1) > 1e-9) /* autoscaling/v2 has no tolerance but an alpha field (1.33) */
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.autoscaling.tolerance: %g: an HPA scales within the cluster's "
                        "tolerance (kube-controller-manager --horizontal-pod-autoscaler-tolerance, 0.1 by default); "
                        "leave it at 0.1 in mode hpa, or use mode builtin", c->tolerance);
    if (c->interval_s < 1 || c->max_up_step < 1 || c->tolerance < 0)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.autoscaling: intervalSeconds, maxScaleUpStep >= 1, tolerance >= 0");
    return LLM_OK;
}

/* ---- deciding ------------------------------------------------------------------------ */

/* A decision at the end of the history, which keeps the last HISTORY_MAX. */
static void record_decision(json_t *hist, const char *when, int from, int to, const char *why)
{
    json_array_append_new(hist, json_pack("{s:s,s:i,s:i,s:s}", "time", when, "from", from, "to", to, "reason", why));
    while (json_array_size(hist) > HISTORY_MAX) json_array_remove(hist, 0);
}

/* What the reading alone asks for. Unready pods count as idle when scaling
 * up (their share of the signal is 0) and are left out when scaling down,
 * as the HPA does, so a loading pod neither triggers nor blocks a step. */
static int raw_recommendation(const autoscale_config *c, int current, double value, int n_pods, char *why, size_t wn)
{
    if (n_pods <= 0 || current <= 0) {
        snprintf(why, wn, "no ready pod to read %s from", c->metric);
        return current > 0 ? current : c->min;
    }
    double up = value * n_pods / current / c->target, down = value / c->target;
    int want = current;
    if (up > 1 + c->tolerance)
        want = (int)ceil(value * n_pods / c->target - 1e-9);
    else if (down < 1 - c->tolerance)
        want = (int)ceil(current * down - 1e-9);
    snprintf(why, wn, "%s %.2f per pod (%d ready) %s target %.2f", c->metric, value, n_pods,
             want > current ? "over" : want < current ? "under" : "near", c->target);
    return want < c->min ? c->min : want > c->max ? c->max : want;
}

json_t *autoscale_decide(const autoscale_config *c, int current, double value, int n_pods, json_t *prev, double now_unix,
                  autoscale_decision *out)
{
    memset(out, 0, sizeof *out);
    char why[200];
    int raw = raw_recommendation(c, current, value, n_pods, why, sizeof why);
    /* recommendations within the longer window, plus this one */
    int keep_s = c->up_window_s > c->down_window_s ? c->up_window_s : c->down_window_s;
    json_t *recs = json_array();
    json_t *old = json_object_get(prev, "recommendations");
    for (size_t i = 0; i < json_array_size(old); i++) {
        json_t *r = json_array_get(old, i);
        double t = json_number_value(json_array_get(r, 0));
        if (json_array_size(r) == 2 && now_unix - t <= keep_s && t < floor(now_unix)) /* this second's: replaced */
            json_array_append(recs, r);
    }
    json_array_append_new(recs, json_pack("[f,i]", floor(now_unix), raw));
    int up_rec = raw, down_rec = raw;
    for (size_t i = 0; i < json_array_size(recs); i++) {
        double t = json_number_value(json_array_get(json_array_get(recs, i), 0));
        int r = (int)json_number_value(json_array_get(json_array_get(recs, i), 1));
        if (now_unix - t <= c->up_window_s && r < up_rec)
            up_rec = r;
        if (now_unix - t <= c->down_window_s && r > down_rec)
            down_rec = r;
    }
    int desired = current;
    if (desired < up_rec)
        desired = up_rec;
    if (desired > down_rec)
        desired = down_rec;
    if (desired > current + c->max_up_step)
        desired = current + c->max_up_step;
    desired = desired < c->min ? c->min : desired > c->max ? c->max : desired;
    out->desired = desired;
    out->changed = desired != current;
    snprintf(out->reason, sizeof out->reason, "%s", why);
    json_t *hist = json_array();
    json_t *oh = json_object_get(prev, "history");
    for (size_t i = json_array_size(oh) > HISTORY_MAX - 1 ? json_array_size(oh) - (HISTORY_MAX - 1) : 0;
         i < json_array_size(oh); i++)
        json_array_append(hist, json_array_get(oh, i));
    char when[32];
    llm_clock_rfc3339(now_unix, when);
    json_t *last = json_object_get(prev, "lastScaleTime");
    if (out->changed) {
        record_decision(hist, when, current, desired, why);
        last = NULL;
    }
    json_t *st = json_pack("{s:i,s:f,s:i,s:o,s:o}", "desiredReplicas", desired, "currentValue",
                           n_pods > 0 ? round(value * 1000) / 1000 : 0.0, "readyPods", n_pods, "recommendations", recs,
                           "history", hist);
    if (st)
        json_object_set_new(st, "lastScaleTime", out->changed ? json_string(when)
                                                 : last ? json_incref(last) : json_null());
    if (st && json_is_null(json_object_get(st, "lastScaleTime")))
        json_object_del(st, "lastScaleTime");
    return st;
}

/* autoscale_decide's last decision replaced by `desired` for `why`. */
static void override(json_t *state, int current, int desired, const char *why, double now_unix, autoscale_decision *out)
{
    json_t *hist = json_object_get(state, "history");
    if (out->changed) /* autoscale_decide recorded a change that is not happening */
        json_array_remove(hist, json_array_size(hist) - 1);
    out->desired = desired;
    out->changed = desired != current;
    snprintf(out->reason, sizeof out->reason, "%s", why);
    json_object_set_new(state, "desiredReplicas", json_integer(desired));
    if (out->changed) {
        char when[32];
        llm_clock_rfc3339(now_unix, when);
        record_decision(hist, when, current, desired, why);
        json_object_set_new(state, "lastScaleTime", json_string(when));
    }
}

/* Whether prev records a scale to zero in the last STALE_READ_S: a turn
 * then counting pods reads a Deployment older than that scale-down (its
 * watch event not in yet, seconds on a loaded node) and goes to zero again
 * without a second decision or Event. Later, pods running under a record
 * of zero are a wake whose record was lost: their sleep is recorded. */
#define STALE_READ_S 30
static int just_zeroed(json_t *prev, double now_unix)
{
    json_t *rec = json_object_get(prev, "desiredReplicas"), *h = json_object_get(prev, "history");
    json_t *last = json_array_get(h, json_array_size(h) - 1);
    const char *at = json_string_value(json_object_get(last, "time"));
    char since[32];
    llm_clock_rfc3339(now_unix - STALE_READ_S, since);
    return json_is_integer(rec) && json_integer_value(rec) == 0 && json_integer_value(json_object_get(last, "to")) == 0 &&
           at && strlen(at) == strlen(since) && strcmp(at, since) >= 0; /* RFC 3339 UTC: text order is time order */
}

void autoscale_zero(const autoscale_config *c, int current, const autoscale_activity *a, json_t *prev, json_t *state, double now_unix,
             autoscale_decision *out)
{
    json_t *lt = json_object_get(prev, "lastActivityTime"), *rq = json_object_get(prev, "routerRequests");
    double last = json_is_number(lt) ? json_number_value(lt) : now_unix; /* the idle clock starts now */
    double seen = json_is_number(rq) ? json_number_value(rq) : -1;
    if (a->routers > 0) {
        if (a->requests != seen || a->held > 0 || a->inflight > 0)
            last = now_unix;
        seen = a->requests;
    }
    json_object_set_new(state, "lastActivityTime", json_real(floor(last)));
    json_object_set_new(state, "routerRequests", json_real(seen));
    char why[200];
    if (current == 0 && a->held > 0) {
        snprintf(why, sizeof why, "%.0f requests held by the router: waking", a->held);
        override(state, current, 1, why, now_unix, out);
    } else if (current == 0) {
        override(state, 0, 0, "scaled to zero: no request waiting", now_unix, out);
    } else if (a->routers > 0 && a->own >= a->asked && a->held <= 0 && a->inflight <= 0 &&
               now_unix - last >= c->zero_after_s) {
        snprintf(why, sizeof why, "no request for %.0f s: scaled to zero", now_unix - last);
        override(state, just_zeroed(prev, now_unix) ? 0 : current, 0, why, now_unix, out);
    }
}

/* ---- HPA mode ------------------------------------------------------------------------- */

/* A quantity for a target value: "4", or "700m" for fractions. */
static void quantity(double v, char out[32])
{
    if (fabs(v - round(v)) < 1e-9)
        snprintf(out, 32, "%.0f", v);
    else
        snprintf(out, 32, "%.0fm", v * 1000);
}

json_t *autoscale_hpa(json_t *d, const autoscale_config *c)
{
    json_t *md = json_object_get(d, "metadata");
    const char *name = json_string_value(json_object_get(md, "name"));
    json_t *metric;
    if (!strcmp(c->metric, "cpu")) {
        metric = json_pack("{s:s,s:{s:s,s:{s:s,s:i}}}", "type", "Resource", "resource", "name", "cpu", "target", "type",
                           "Utilization", "averageUtilization", (int)c->target);
    } else {
        char q[32];
        quantity(c->target, q);
        metric = json_pack("{s:s,s:{s:{s:s},s:{s:s,s:s}}}", "type", "Pods", "pods", "metric", "name",
                           autoscale_metric_name(c->metric), "target", "type", "AverageValue", "averageValue", q);
    }
    return json_pack("{s:s,s:s,s:{s:s,s:O,s:{s:s,s:s,s:s},s:[{s:s,s:s,s:O,s:O,s:b,s:b}],s:{}},"
                     "s:{s:{s:s,s:s,s:s},s:i,s:i,s:[o],s:{s:{s:i,s:[{s:s,s:i,s:i}]},s:{s:i}}}}",
                     "apiVersion", "autoscaling/v2", "kind", "HorizontalPodAutoscaler", "metadata", "name", name,
                     "namespace", json_object_get(md, "namespace"), "labels", "app.kubernetes.io/name", "llm-server",
                     DESIRED_INSTANCE, name, DESIRED_MANAGED_BY, DESIRED_CONTROLLER, "ownerReferences", "apiVersion",
                     "llmk8s.io/v1alpha1", "kind", "LLMDeployment", "name", json_object_get(md, "name"), "uid",
                     json_object_get(md, "uid"), "controller", 1, "blockOwnerDeletion", 1, "annotations", "spec",
                     "scaleTargetRef", "apiVersion", "llmk8s.io/v1alpha1", "kind", "LLMDeployment", "name", name,
                     "minReplicas", c->min, "maxReplicas", c->max, "metrics", metric, "behavior", "scaleUp",
                     "stabilizationWindowSeconds", c->up_window_s, "policies", "type", "Pods", "value", c->max_up_step,
                     "periodSeconds", c->interval_s, "scaleDown", "stabilizationWindowSeconds", c->down_window_s);
}
