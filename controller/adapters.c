/* adapters.c - spec.adapters applied to the running pods; see adapters.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/json.h"
#include "adapters.h"
#include "http_client.h"
#include "kube_json.h"
#include "plan.h"

#define BUDGET_MS 3000           /* every pod's answer to one call, together */
#define ANSWER_MAX (256u << 10)  /* a pod's /admin/lora: 32 adapters and their sources */

/* One round's working state: the pods' lists and the calls' bookkeeping. */
typedef struct round {
    json_t *d;
    char (*urls)[128];
    char (*names)[ADAPTERS_POD_NAME];
    int n;
    const char *token;
    json_t **have;   /* (n) each pod's "adapters" list, NULL: it did not answer */
    int *loads_ok;   /* (n * spec adapters) loads answered 200 this round */
    int calls, pending;
    adapters_view *v;
} round;

static const char *want_source(json_t *w)
{
    const char *u = json_string_value(json_object_get(w, "uri"));
    return u ? u : json_string_value(json_object_get(w, "path"));
}

static double want_scale(json_t *w)
{
    json_t *s = json_object_get(w, "scale");
    return s ? json_number_value(s) : 1.0;
}

/* Pod i's entry named name, or NULL. */
static json_t *entry(const round *r, int i, const char *name)
{
    json_t *e;
    size_t k;
    json_array_foreach(r->have[i], k, e)
        if (!strcmp(kube_json_str(e, "name", NULL) ?: "", name))
            return e;
    return NULL;
}

/* A pod's entry (may be NULL) says the adapter is ready to serve. */
static int entry_ready(json_t *e)
{
    return e && !strcmp(kube_json_str(e, "state", NULL) ?: "", "ready");
}

/* The pod's entry is the spec's adapter as it stands (source, digest, scale). */
static int same(json_t *e, json_t *w)
{
    const char *sha = json_string_value(json_object_get(w, "sha256"));
    return !strcmp(kube_json_str(e, "source", NULL) ?: "", want_source(w) ?: "") &&
           !strcmp(kube_json_str(e, "sha256", NULL) ?: "", sha ? sha : "") &&
           (float)json_number_value(json_object_get(e, "scale")) == (float)want_scale(w);
}

static json_t *spec_entry(json_t *d, const char *name)
{
    json_t *w;
    size_t k;
    json_array_foreach(kube_json_get(json_object_get(d, "spec"), "adapters", NULL), k, w)
        if (!strcmp(json_string_value(json_object_get(w, "name")) ?: "", name))
            return w;
    return NULL;
}

/* The pods' lists, read at once. */
static void read_lists(round *r)
{
    const char **up = calloc((size_t)r->n, sizeof *up);
    char(*full)[160] = calloc((size_t)r->n, sizeof *full);
    long *codes = calloc((size_t)r->n, sizeof *codes);
    char **bodies = calloc((size_t)r->n, sizeof *bodies);
    for (int i = 0; up && full && codes && bodies && i < r->n; i++) {
        snprintf(full[i], sizeof full[i], "%s/admin/lora", r->urls[i]);
        up[i] = full[i];
    }
    if (up && full && codes && bodies)
        http_client_many(up, (size_t)r->n, r->token, NULL, BUDGET_MS, ANSWER_MAX, codes, bodies);
    for (int i = 0; codes && bodies && i < r->n; i++) {
        json_t *j = codes[i] == 200 ? llm_json_loads(bodies[i], 0, NULL) : NULL;
        json_t *list = json_object_get(j, "adapters");
        size_t nl = json_array_size(list);
        r->have[i] = json_is_array(list) && nl <= ADAPTERS_POD_LIST ? json_incref(list) : NULL;
        if (!r->have[i] && !r->v->message[0] && nl > ADAPTERS_POD_LIST)
            snprintf(r->v->message, sizeof r->v->message, "pod %.60s: /admin/lora listed %zu adapters (at most %d)",
                     r->urls[i] + 7, nl, ADAPTERS_POD_LIST);
        else if (!r->have[i] && !r->v->message[0])
            snprintf(r->v->message, sizeof r->v->message, "pod %.60s: /admin/lora answered %ld", r->urls[i] + 7, codes[i]);
        json_decref(j);
        free(bodies[i]);
    }
    free(up);
    free(full);
    free(codes);
    free(bodies);
}

/* The error message of a refused call's answer. */
static void refusal(const round *r, int i, const char *what, long code, const char *body)
{
    if (r->v->failed)
        return;
    json_t *j = body ? llm_json_loads(body, 0, NULL) : NULL;
    const char *m = kube_json_str(json_object_get(j, "error"), "message", NULL);
    snprintf(r->v->message, sizeof r->v->message, "%.200s on pod %.60s: %.300s", what, r->urls[i] + 7,
             m ? m : code ? "refused" : "no answer in time");
    r->v->failed = code != 0; /* a pod that did not answer (a slow download) is tried again, not failed */
    json_decref(j);
}

/* One call (body) to the pods marked in pick; *ok[i] set where it answered 200. */
static void call(round *r, const char *path, const char *body, const int *pick, int *ok, const char *what)
{
    const char **up = calloc((size_t)r->n, sizeof *up);
    char(*full)[200] = calloc((size_t)r->n, sizeof *full);
    long *codes = calloc((size_t)r->n, sizeof *codes);
    char **bodies = calloc((size_t)r->n, sizeof *bodies);
    int *at = calloc((size_t)r->n, sizeof *at), m = 0;
    for (int i = 0; up && full && codes && bodies && at && i < r->n; i++)
        if (pick[i]) {
            snprintf(full[m], sizeof full[m], "%s%s", r->urls[i], path);
            up[m] = full[m];
            at[m++] = i;
        }
    if (m > 0 && body) {
        http_client_many(up, (size_t)m, r->token, body, BUDGET_MS, ANSWER_MAX, codes, bodies);
        r->calls++;
    }
    for (int k = 0; k < m; k++) {
        if (codes[k] == 200)
            ok[at[k]] = 1;
        else
            refusal(r, at[k], what, codes[k], bodies[k]);
        free(bodies[k]);
    }
    r->pending = 1;
    free(up);
    free(full);
    free(codes);
    free(bodies);
    free(at);
}

/* Pod i holds name, ready, and not as the spec has it (w NULL: not at all). */
static int stale(const round *r, int i, const char *name, json_t *w)
{
    json_t *o = r->have[i] ? entry(r, i, name) : NULL;
    return entry_ready(o) && !(w && same(o, w));
}

/* Unloads what a pod has that the spec does not (or not so): one call per
 * name, to every pod holding it so. */
static void unloads(round *r)
{
    json_t *called = json_object();
    int *pick = calloc((size_t)r->n, sizeof *pick), *ok = calloc((size_t)r->n, sizeof *ok);
    for (int i = 0; called && pick && ok && i < r->n; i++) {
        json_t *e;
        size_t k;
        json_array_foreach(r->have[i], k, e) {
            const char *name = kube_json_str(e, "name", NULL);
            json_t *w = name ? spec_entry(r->d, name) : NULL;
            if (!name || json_object_get(called, name) || !stale(r, i, name, w) ||
                r->calls >= ADAPTERS_CALLS_PER_ROUND)
                continue;
            json_object_set_new(called, name, json_true());
            for (int j = 0; j < r->n; j++) pick[j] = stale(r, j, name, w);
            json_t *req = json_pack("{s:s}", "lora_name", name);
            char *body = req ? json_dumps(req, JSON_COMPACT) : NULL, what[200];
            snprintf(what, sizeof what, "unloading adapter %.128s", name);
            call(r, "/v1/unload_lora_adapter", body, pick, ok, what);
            free(body);
            json_decref(req);
        }
    }
    json_decref(called);
    free(pick);
    free(ok);
}

/* Loads what a pod lacks, one adapter (every pod lacking it) per call. */
static void loads(round *r)
{
    json_t *w;
    size_t a;
    int *pick = calloc((size_t)r->n, sizeof *pick);
    json_array_foreach(kube_json_get(json_object_get(r->d, "spec"), "adapters", NULL), a, w) {
        const char *name = json_string_value(json_object_get(w, "name"));
        int any = 0;
        for (int i = 0; pick && i < r->n; i++) any |= pick[i] = r->have[i] && !entry(r, i, name);
        if (!any || r->calls >= ADAPTERS_CALLS_PER_ROUND)
            continue;
        json_t *req = json_pack("{s:s,s:s,s:f}", "lora_name", name, "lora_path", want_source(w) ?: "", "scale",
                                want_scale(w));
        if (req && json_object_get(w, "sha256"))
            json_object_set(req, "sha256", json_object_get(w, "sha256"));
        char *body = req ? json_dumps(req, JSON_COMPACT) : NULL, what[200];
        snprintf(what, sizeof what, "adapter %.128s", name);
        call(r, "/v1/load_lora_adapter", body, pick, r->loads_ok + a * (size_t)r->n, what);
        free(body);
        json_decref(req);
    }
    free(pick);
}

/* Pod i's ready names (bounded, adapters.h) and how many more it named. */
static json_t *pod_entry(const round *r, int i)
{
    json_t *names = json_array(), *e;
    int more = 0;
    size_t k;
    json_array_foreach(r->have[i], k, e) {
        const char *name = json_string_value(json_object_get(e, "name"));
        size_t len = name ? strlen(name) : 0;
        if (!entry_ready(e))
            continue;
        if (len < 1 || len > ADAPTERS_NAME_MAX || json_array_size(names) >= ADAPTERS_STATUS_NAMES ||
            json_array_append_new(names, json_string(name)))
            more++;
    }
    return names ? json_pack("{s:s,s:b,s:o,s:i}", "pod", r->names[i], "answered", r->have[i] != NULL, "loaded", names,
                             "more", more)
                 : NULL;
}

/* status.podAdapters for the first ADAPTERS_STATUS_PODS pods; NULL (and
 * the view's message) without memory. */
static json_t *pod_lists(round *r)
{
    json_t *pods = json_array();
    int listed = r->n < ADAPTERS_STATUS_PODS ? r->n : ADAPTERS_STATUS_PODS;
    for (int i = 0; pods && i < listed; i++)
        if (json_array_append_new(pods, pod_entry(r, i))) {
            json_decref(pods);
            pods = NULL;
        }
    json_t *out = pods ? json_pack("{s:o,s:i}", "pods", pods, "omitted", r->n - listed) : NULL;
    if (!out && !r->v->failed)
        snprintf(r->v->message, sizeof r->v->message, "no memory for status.podAdapters");
    return out;
}

/* status.adapters: each spec adapter's pods, counting this round's loads. */
static void tally(round *r)
{
    json_t *w, *list = json_array();
    size_t a;
    int done = !r->pending;
    json_array_foreach(kube_json_get(json_object_get(r->d, "spec"), "adapters", NULL), a, w) {
        const char *name = json_string_value(json_object_get(w, "name"));
        int loaded = 0;
        for (int i = 0; i < r->n; i++) {
            json_t *e = r->have[i] ? entry(r, i, name) : NULL;
            int ready = e && same(e, w) && entry_ready(e);
            loaded += ready || r->loads_ok[a * (size_t)r->n + (size_t)i];
            done &= ready;
        }
        json_array_append_new(list, json_pack("{s:s,s:i,s:i}", "name", name, "loaded", loaded, "pods", r->n));
    }
    for (int i = 0; i < r->n; i++)
        done &= r->have[i] != NULL && json_array_size(r->have[i]) == json_array_size(list);
    r->v->list = list;
    r->v->done = done && list;
    r->v->pods = pod_lists(r);
    if (!r->v->failed && !r->v->done && !r->v->message[0])
        snprintf(r->v->message, sizeof r->v->message, "loading and unloading adapters on %d pod%s", r->n,
                 r->n == 1 ? "" : "s");
}

void adapters_sync(json_t *d, char (*urls)[128], char (*names)[ADAPTERS_POD_NAME], int n, const char *token,
                   adapters_view *v)
{
    size_t na = json_array_size(kube_json_get(json_object_get(d, "spec"), "adapters", NULL));
    round r = {d, urls, names, n, token, calloc((size_t)(n ? n : 1), sizeof(json_t *)),
               calloc((size_t)(n ? n : 1) * (na ? na : 1), sizeof(int)), 0, 0, v};
    memset(v, 0, sizeof *v);
    if (!r.have || !r.loads_ok) {
        snprintf(v->message, sizeof v->message, "no memory to read the pods' adapters");
    } else {
        read_lists(&r);
        unloads(&r);
        loads(&r);
        tally(&r);
    }
    for (int i = 0; r.have && i < n; i++) json_decref(r.have[i]);
    free(r.have);
    free(r.loads_ok);
}

void adapters_status(json_t *d, const adapters_view *v, json_t *status, const char *now)
{
    json_int_t gen = json_integer_value(kube_json_get(d, "metadata", "generation"));
    const char *reason = v->done ? "AllLoaded" : v->failed ? "AdapterFailed" : "Applying";
    json_t *c = plan_condition("AdaptersReady", v->done, reason,
                               v->done ? "every serving pod has the spec's adapters" : v->message, gen);
    json_t *conds = json_object_get(status, "conditions"), *old, *prev = NULL;
    size_t i;
    json_array_foreach(kube_json_get(d, "status", "conditions"), i, old)
        if (!strcmp(kube_json_str(old, "type", NULL) ?: "", "AdaptersReady"))
            prev = old;
    const char *was = kube_json_str(prev, "lastTransitionTime", NULL);
    int kept = was && json_equal(json_object_get(prev, "status"), json_object_get(c, "status"));
    if (c)
        json_object_set_new(c, "lastTransitionTime", json_string(kept ? was : now));
    if (c && json_is_array(conds))
        json_array_append_new(conds, c);
    else
        json_decref(c);
    json_object_set(status, "adapters", v->list ? v->list : json_null());
    json_object_set(status, "podAdapters", v->pods ? v->pods : json_null());
}

void adapters_view_free(adapters_view *v)
{
    json_decref(v->list);
    json_decref(v->pods);
    v->list = v->pods = NULL;
}
