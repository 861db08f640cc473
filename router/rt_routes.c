/* rt_routes.c - the gateway's table of routes; see rt_routes.h. */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/json.h"
#include "llm/log.h"
#include "llm/strmap.h"
#include "rt_routes.h"

struct rt_route {
    char name[RT_ROUTE_NAME_MAX + 1];
    char *models[RT_ROUTE_MAX_MODELS]; /* under the table's mu (a reload may change them) */
    int n_models;
    char service[2][RT_OBJECT_NAME_MAX + 1]; /* stable, canary; "": none */
    char weight_cm[RT_OBJECT_NAME_MAX + 1];
    int metrics_port;                        /* its pods' /metrics port; 0: their API port (or --metrics-port) */
    rt_pool *pool;                           /* the route's for its life */
    int refs;                                /* the table's one while listed, and each request's */
    int listed;                              /* its Service's endpoints were published once (discovery ran) */
};

struct rt_routes {
    pthread_mutex_t mu;      /* the table and the routes' refs, models and sources */
    pthread_mutex_t load_mu; /* one load at a time */
    rt_pool_config pc;
    rt_route *r[RT_MAX_ROUTES];
    int n;
    llm_strmap names;        /* model name -> index in r (keys: the routes' own strings); e NULL: scan */
    int from_kube;           /* tables come from a ConfigMap (rt_routes_from_kube) */
};

llm_status rt_routes_new(const rt_pool_config *pc, rt_routes **out, llm_error *err)
{
    rt_routes *t = calloc(1, sizeof *t);
    if (!t)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the route table");
    t->pc = *pc;
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->load_mu, NULL);
    *out = t;
    return LLM_OK;
}

static void clear_models(rt_route *r)
{
    for (int k = 0; k < r->n_models; k++) free(r->models[k]);
    r->n_models = 0;
}

static void route_free(rt_route *r)
{
    clear_models(r);
    rt_pool_free(r->pool);
    free(r);
}

/* Under mu. */
static void unref(rt_route *r)
{
    if (--r->refs == 0)
        route_free(r);
}

void rt_routes_free(rt_routes *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n; i++) unref(t->r[i]);
    llm_strmap_free(&t->names);
    pthread_mutex_destroy(&t->mu);
    pthread_mutex_destroy(&t->load_mu);
    free(t);
}

/* ---- the table's JSON ------------------------------------------------------------------- */

/* One entry, checked; its strings point into the parsed document. */
typedef struct spec {
    const char *name;
    json_t *models, *backends[2];
    const char *service[2], *weight_cm;
    int weight;                   /* -1: none given */
    int metrics_port;             /* 0: none given */
    int hold_s;                   /* holdSeconds; 0: none given */
} spec;

static int name_ok(const char *s, size_t max, const char *extra)
{
    size_t n = strlen(s);
    if (n == 0 || n > max)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || strchr(extra, *s)))
            return 0;
    return 1;
}

static int model_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > RT_MODEL_NAME_MAX)
        return 0;
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return 0;
    return 1;
}

/* An optional object name member: 0 and *out (NULL when absent), or an error. */
static llm_status object_name(json_t *e, const char *key, int i, const char **out, llm_error *err)
{
    json_t *v = json_object_get(e, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return LLM_OK;
    if (!json_is_string(v) || !name_ok(json_string_value(v), RT_OBJECT_NAME_MAX, ".-"))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d].%s: a name of 1-%d of a-z, 0-9, '.', '-'", i, key,
                        RT_OBJECT_NAME_MAX);
    *out = json_string_value(v);
    return LLM_OK;
}

static llm_status urls(json_t *e, const char *key, int i, json_t **out, llm_error *err)
{
    json_t *v = json_object_get(e, key);
    *out = NULL;
    if (!v || json_is_null(v))
        return LLM_OK;
    if (!json_is_array(v) || json_array_size(v) > RT_MAX_BACKENDS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d].%s: an array of at most %d URLs", i, key, RT_MAX_BACKENDS);
    for (size_t k = 0; k < json_array_size(v); k++) {
        const char *u = json_string_value(json_array_get(v, k));
        const char *url = u && strstr(u, "=http") ? strstr(u, "=http") + 1 : u;
        if (!u || strlen(u) > 255 || (strncmp(url, "http://", 7) && strncmp(url, "https://", 8)))
            return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d].%s[%zu]: an http(s) URL (or NAME=URL) of at most 255 "
                            "bytes", i, key, k);
    }
    *out = v;
    return LLM_OK;
}

/* What a table may name, by where it comes from: a ConfigMap's (anyone who
 * may edit it) names Services of the namespace, never URLs; a file's names
 * URLs (nothing would follow a Service). */
static llm_status origin_ok(const spec *s, int i, int from_kube, llm_error *err)
{
    if (from_kube && (s->backends[0] || s->backends[1] || s->weight >= 0))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d] (%s): a table from a ConfigMap names Services, not "
                        "backends or a weight", i, s->name);
    if (!from_kube && (s->service[0] || s->service[1] || s->weight_cm))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d] (%s): names a Service or weightConfigMap, which only a "
                        "table from a ConfigMap (--routes-configmap) follows", i, s->name);
    return LLM_OK;
}

/* Entry i of the document into s; seen: the models named so far (model ->
 * route index), for uniqueness. */
static llm_status one_spec(json_t *e, int i, json_t *seen, int from_kube, spec *s, llm_error *err)
{
    json_t *name = json_object_get(e, "name"), *models = json_object_get(e, "models"), *w = json_object_get(e, "weight");
    if (!json_is_object(e))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d]: an object", i);
    if (!json_is_string(name) || !name_ok(json_string_value(name), RT_ROUTE_NAME_MAX, "._-ABCDEFGHIJKLMNOPQRSTUVWXYZ"))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d].name: 1-%d of A-Z, a-z, 0-9, '.', '_', '-'", i,
                        RT_ROUTE_NAME_MAX);
    s->name = json_string_value(name);
    if (!json_is_array(models) || json_array_size(models) == 0 || json_array_size(models) > RT_ROUTE_MAX_MODELS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d] (%s).models: 1-%d names", i, s->name, RT_ROUTE_MAX_MODELS);
    for (size_t k = 0; k < json_array_size(models); k++) {
        const char *m = json_string_value(json_array_get(models, k));
        if (!m || !model_ok(m))
            return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d] (%s).models[%zu]: 1-%d bytes, no control characters", i,
                            s->name, k, RT_MODEL_NAME_MAX);
        json_t *other = json_object_get(seen, m);
        if (other)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d] (%s).models[%zu]: %s is served by routes[%d] too", i,
                            s->name, k, m, (int)json_integer_value(other));
        if (json_object_set_new(seen, m, json_integer(i)))
            return llm_errf(err, LLM_ERR_NOMEM, "no memory to check the routes' models");
    }
    s->models = models;
    llm_status st = object_name(e, "service", i, &s->service[0], err);
    if (!st)
        st = object_name(e, "canaryService", i, &s->service[1], err);
    if (!st)
        st = object_name(e, "weightConfigMap", i, &s->weight_cm, err);
    if (!st)
        st = urls(e, "backends", i, &s->backends[0], err);
    if (!st)
        st = urls(e, "canaryBackends", i, &s->backends[1], err);
    if (st)
        return st;
    if (json_array_size(s->backends[0]) + json_array_size(s->backends[1]) > RT_MAX_BACKENDS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d] (%s): more than %d backends in both revisions", i,
                        s->name, RT_MAX_BACKENDS);
    s->weight = -1;
    if (w && (!json_is_integer(w) || json_integer_value(w) < 0 || json_integer_value(w) > 100 || s->weight_cm))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d] (%s).weight: an integer 0..100, without weightConfigMap", i,
                        s->name);
    if (w)
        s->weight = (int)json_integer_value(w);
    json_t *mp = json_object_get(e, "metricsPort");
    if (mp && (!json_is_integer(mp) || json_integer_value(mp) < 1 || json_integer_value(mp) > 65535))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d] (%s).metricsPort: a port 1..65535", i, s->name);
    s->metrics_port = mp ? (int)json_integer_value(mp) : 0;
    json_t *hs = json_object_get(e, "holdSeconds");
    if (hs && (!json_is_integer(hs) || json_integer_value(hs) < 0 || json_integer_value(hs) > 3600))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d] (%s).holdSeconds: an integer 0..3600", i, s->name);
    s->hold_s = hs ? (int)json_integer_value(hs) : 0;
    return origin_ok(s, i, from_kube, err);
}

/* The document's entries into specs (n of them, calloc'd). */
static llm_status parse(json_t *doc, int from_kube, spec **specs, int *n, llm_error *err)
{
    json_t *routes = json_object_get(doc, "routes");
    if (!json_is_array(routes) || json_array_size(routes) > RT_MAX_ROUTES)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "the route table: {\"routes\": [...]} with at most %d routes", RT_MAX_ROUTES);
    *n = (int)json_array_size(routes);
    *specs = calloc((size_t)*n + 1, sizeof **specs);
    json_t *seen = json_object(), *names = json_object();
    llm_status st = *specs && seen && names ? LLM_OK : llm_errf(err, LLM_ERR_NOMEM, "no memory for the route table");
    for (int i = 0; i < *n && !st; i++) {
        st = one_spec(json_array_get(routes, (size_t)i), i, seen, from_kube, &(*specs)[i], err);
        if (!st && json_object_get(names, (*specs)[i].name))
            st = llm_errf(err, LLM_ERR_INVALID_ARG, "routes[%d].name: %s is taken", i, (*specs)[i].name);
        if (!st && json_object_set_new(names, (*specs)[i].name, json_true()))
            st = llm_errf(err, LLM_ERR_NOMEM, "no memory for the route table");
    }
    json_decref(seen);
    json_decref(names);
    if (st) {
        free(*specs);
        *specs = NULL;
    }
    return st;
}

/* ---- loading ------------------------------------------------------------------------------- */

/* The route of the table named name, or NULL. Under mu. */
static rt_route *named(rt_routes *t, const char *name)
{
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->r[i]->name, name))
            return t->r[i];
    return NULL;
}

/* A copy of spec s's names (models, sources) for route r, made before the
 * table changes: 0, or -1 without memory. */
typedef struct staged {
    rt_route *r;      /* the table's route of that name, or a new one */
    int fresh;        /* r is new (its pool too) */
    char *models[RT_ROUTE_MAX_MODELS];
    int n_models;
} staged;

static int stage(rt_routes *t, const spec *s, staged *g)
{
    for (size_t k = 0; k < json_array_size(s->models); k++)
        if (!(g->models[g->n_models++] = strdup(json_string_value(json_array_get(s->models, k)))))
            return -1;
    pthread_mutex_lock(&t->mu);
    g->r = named(t, s->name);
    pthread_mutex_unlock(&t->mu); /* loads are one at a time: the route stays listed until this one commits */
    if (g->r)
        return 0;
    llm_error err = {0};
    g->fresh = 1;
    if (!(g->r = calloc(1, sizeof *g->r)) || rt_pool_new(&t->pc, &g->r->pool, &err))
        return -1;
    snprintf(g->r->name, sizeof g->r->name, "%s", s->name);
    g->r->refs = 1;
    return 0;
}

static void unstage(staged *g)
{
    for (int k = 0; k < g->n_models; k++) free(g->models[k]);
    if (g->fresh && g->r)
        route_free(g->r);
}

/* Route r takes spec s's names and sources. Under mu. */
static void take(rt_route *r, const spec *s, staged *g)
{
    clear_models(r);
    memcpy(r->models, g->models, sizeof g->models);
    r->n_models = g->n_models;
    g->n_models = 0;
    for (int rev = 0; rev < 2; rev++) snprintf(r->service[rev], sizeof r->service[rev], "%s", s->service[rev] ? s->service[rev] : "");
    snprintf(r->weight_cm, sizeof r->weight_cm, "%s", s->weight_cm ? s->weight_cm : "");
    r->metrics_port = s->metrics_port;
    rt_pool_set_hold(r->pool, s->hold_s);
}

/* The new table: staged routes in order; the old ones not kept lose the
 * table's hold. Under mu. */
static void commit(rt_routes *t, const spec *specs, staged *g, int n)
{
    rt_route *keep[RT_MAX_ROUTES];
    for (int i = 0; i < n; i++) {
        take(g[i].r, &specs[i], &g[i]);
        keep[i] = g[i].r;
        g[i].fresh = 0; /* the table owns it now */
    }
    for (int i = 0; i < t->n; i++) {
        int kept = 0;
        for (int k = 0; k < n && !kept; k++) kept = keep[k] == t->r[i];
        if (!kept)
            unref(t->r[i]);
    }
    memcpy(t->r, keep, (size_t)n * sizeof *keep);
    t->n = n;
    /* the names' map, over the routes' strings (freed with them: rebuilt here, under mu, every time) */
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (size_t)t->r[i]->n_models;
    llm_strmap_free(&t->names);
    if (llm_strmap_init(&t->names, total ? total : 1))
        t->names = (llm_strmap){0}; /* no memory: lookups scan */
    for (int i = 0; t->names.e && i < n; i++)
        for (int k = 0; k < t->r[i]->n_models; k++)
            llm_strmap_put(&t->names, t->r[i]->models[k], strlen(t->r[i]->models[k]), i);
}

/* Static backends and weights of the new table's routes (counts checked:
 * only memory can fail here, after the table changed; that is logged, the
 * route keeps the backends it had). */
static void statics(const spec *specs, staged *g, int n)
{
    for (int i = 0; i < n; i++) {
        rt_pool *p = g[i].r->pool;
        for (int rev = 0; rev < 2; rev++) {
            json_t *b = specs[i].backends[rev];
            const char *u[RT_MAX_BACKENDS];
            int m = (int)json_array_size(b);
            for (int k = 0; k < m; k++) u[k] = json_string_value(json_array_get(b, (size_t)k));
            llm_error err = {0};
            if (b && rt_pool_set(p, rev, u, m, &err))
                llm_log("llm-router", "route %s: %s", specs[i].name, err.msg);
        }
        if (specs[i].weight >= 0)
            rt_pool_set_weight(p, specs[i].weight);
    }
}

llm_status rt_routes_load(rt_routes *t, const char *json, size_t n, llm_error *err)
{
    json_t *doc = llm_json_load(json, n, 0, NULL, err);
    if (!doc)
        return LLM_ERR_INVALID_ARG;
    spec *specs = NULL;
    int ns = 0;
    pthread_mutex_lock(&t->load_mu);
    pthread_mutex_lock(&t->mu);
    int from_kube = t->from_kube;
    pthread_mutex_unlock(&t->mu);
    llm_status st = parse(doc, from_kube, &specs, &ns, err);
    staged *g = st ? NULL : calloc((size_t)ns + 1, sizeof *g);
    if (!st && !g)
        st = llm_errf(err, LLM_ERR_NOMEM, "no memory for the route table");
    for (int i = 0; i < ns && !st; i++)
        if (stage(t, &specs[i], &g[i]))
            st = llm_errf(err, LLM_ERR_NOMEM, "no memory for route %s", specs[i].name);
    if (!st) {
        pthread_mutex_lock(&t->mu);
        commit(t, specs, g, ns);
        pthread_mutex_unlock(&t->mu);
        statics(specs, g, ns);
    }
    for (int i = 0; g && i < ns; i++) unstage(&g[i]);
    pthread_mutex_unlock(&t->load_mu);
    free(g);
    free(specs);
    json_decref(doc);
    return st;
}

int rt_routes_count(rt_routes *t)
{
    pthread_mutex_lock(&t->mu);
    int n = t->n;
    pthread_mutex_unlock(&t->mu);
    return n;
}

/* ---- requests -------------------------------------------------------------------------------- */

rt_route *rt_routes_find(rt_routes *t, const char *model)
{
    rt_route *found = NULL;
    pthread_mutex_lock(&t->mu);
    if (t->names.e) {
        int32_t i = llm_strmap_get(&t->names, model, strlen(model));
        found = i >= 0 && i < t->n ? t->r[i] : NULL;
    }
    for (int i = 0; !t->names.e && i < t->n && !found; i++)
        for (int k = 0; k < t->r[i]->n_models && !found; k++)
            if (!strcmp(t->r[i]->models[k], model))
                found = t->r[i];
    /* an adapter some pod of the route has loaded - the pods' word, so only for a table from a file: a
     * ConfigMap's lists every adapter, and a pod must not draw names no route gave it */
    for (int i = 0; i < t->n && !found && *model && !t->from_kube; i++)
        if (rt_pool_has_adapter(t->r[i]->pool, model))
            found = t->r[i];
    if (found)
        found->refs++;
    pthread_mutex_unlock(&t->mu);
    return found;
}

rt_route *rt_routes_sole(rt_routes *t)
{
    pthread_mutex_lock(&t->mu);
    rt_route *r = t->n == 1 ? t->r[0] : NULL;
    if (r)
        r->refs++;
    pthread_mutex_unlock(&t->mu);
    return r;
}

void rt_routes_put(rt_routes *t, rt_route *r)
{
    if (!t || !r)
        return;
    pthread_mutex_lock(&t->mu);
    unref(r);
    pthread_mutex_unlock(&t->mu);
}

int rt_routes_list(rt_routes *t, rt_route **out, int max)
{
    pthread_mutex_lock(&t->mu);
    int n = t->n < max ? t->n : max;
    for (int i = 0; i < n; i++) {
        out[i] = t->r[i];
        out[i]->refs++;
    }
    pthread_mutex_unlock(&t->mu);
    return n;
}

rt_pool *rt_route_pool(const rt_route *r) { return r->pool; }

const char *rt_route_name(const rt_route *r) { return r->name; }

int rt_route_metrics_port(rt_routes *t, const rt_route *r)
{
    pthread_mutex_lock(&t->mu);
    int port = r->metrics_port;
    pthread_mutex_unlock(&t->mu);
    return port;
}

/* ---- discovery --------------------------------------------------------------------------------- */

void rt_routes_publish(rt_routes *t, const char *service, int rev, const char *const *urls, int n)
{
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->r[i]->service[rev ? 1 : 0], service)) {
            llm_error err = {0};
            rt_pool_set(t->r[i]->pool, rev ? 1 : 0, urls, n, &err); /* past RT_MAX_BACKENDS the rest wait */
            t->r[i]->listed |= !rev;
        }
    pthread_mutex_unlock(&t->mu);
}

int rt_routes_wakeable(rt_routes *t)
{
    int yes = 0;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n && !yes; i++)
        yes = rt_pool_hold(t->r[i]->pool) > 0 && (t->r[i]->listed || !t->r[i]->service[0][0]);
    pthread_mutex_unlock(&t->mu);
    return yes;
}

void rt_routes_from_kube(rt_routes *t)
{
    pthread_mutex_lock(&t->mu);
    t->from_kube = 1;
    pthread_mutex_unlock(&t->mu);
}

int rt_routes_uses_service(rt_routes *t, const char *service)
{
    int used = 0;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n && !used; i++) used = !strcmp(t->r[i]->service[0], service) || !strcmp(t->r[i]->service[1], service);
    pthread_mutex_unlock(&t->mu);
    return used;
}

void rt_routes_set_weight(rt_routes *t, const char *cm, int weight)
{
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n; i++)
        if (!strcmp(t->r[i]->weight_cm, cm))
            rt_pool_set_weight(t->r[i]->pool, weight);
    pthread_mutex_unlock(&t->mu);
}

/* ---- what is served ------------------------------------------------------------------------------ */

typedef struct listing {
    json_t *data, *seen;
    const char *route;
    int failed;
} listing;

static void list_one(void *ctx, const char *id)
{
    listing *l = ctx;
    if (json_object_get(l->seen, id))
        return;
    json_t *m = json_pack("{s:s,s:s,s:s}", "id", id, "object", "model", "owned_by", l->route);
    if (!m) /* a pod's adapter name that is no UTF-8 (its /metrics are its word): left out, not the whole list */
        return;
    l->failed |= json_array_append_new(l->data, m) || json_object_set_new(l->seen, id, json_true());
}

char *rt_routes_models_json(rt_routes *t)
{
    listing l = {json_array(), json_object(), NULL, 0};
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n && l.data && l.seen; i++) {
        l.route = t->r[i]->name;
        for (int k = 0; k < t->r[i]->n_models; k++) list_one(&l, t->r[i]->models[k]);
        if (!t->from_kube) /* a file's table: the adapters the pods loaded at run time are served too */
            rt_pool_adapters(t->r[i]->pool, list_one, &l);
    }
    pthread_mutex_unlock(&t->mu);
    json_t *doc = l.data && l.seen && !l.failed ? json_pack("{s:s,s:O}", "object", "list", "data", l.data) : NULL;
    char *out = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    json_decref(l.data);
    json_decref(l.seen);
    return out;
}

void rt_routes_not_served(rt_routes *t, const char *model, char *msg, size_t n)
{
    char shown[80]; /* the name as asked, cut and printable (it is the client's) */
    size_t k = 0;
    for (const char *c = model; *c && k + 4 < sizeof shown; c++) shown[k++] = *c >= 0x20 && *c < 0x7f ? *c : '?';
    if (strlen(model) > k)
        shown[k++] = '.', shown[k++] = '.', shown[k++] = '.';
    shown[k] = 0;
    size_t at = (size_t)snprintf(msg, n, "model '%s' is not served here; served:", shown);
    int listed = 0, more = 0;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n; i++)
        for (int m = 0; m < t->r[i]->n_models; m++) {
            const char *name = t->r[i]->models[m];
            if (listed < 16 && at + strlen(name) + 40 < n) {
                at += (size_t)snprintf(msg + at, n - at, "%s %s", listed ? "," : "", name);
                listed++;
            } else {
                more++;
            }
        }
    pthread_mutex_unlock(&t->mu);
    if (!listed && at < n)
        snprintf(msg + at, n - at, " nothing yet");
    else if (more && at < n)
        snprintf(msg + at, n - at, " and %d more (GET /v1/models)", more);
}
