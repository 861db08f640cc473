/* rt_gateway.c - the gateway's watches; see rt_gateway.h. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kube_json.h"
#include "llm/log.h"
#include "rt_gateway.h"
#include "rt_kube.h"

#define logf_(...) llm_log("llm-router", __VA_ARGS__)
#define SLICES_PER_SERVICE 64 /* read of one Service (100 endpoints a slice: far more than RT_MAX_BACKENDS) */

typedef struct slice {
    char name[254], service[254];
    char *urls; /* rt_kube_slice_urls's lines */
} slice;

typedef struct weight {
    char cm[254];
    int w;
} weight;

struct rt_gateway {
    kube_config *cfg;
    char ns[254], routes_cm[254];
    rt_routes *t;
    atomic_int *stop;
    pthread_mutex_t mu;       /* slices and weights: written by their watches, read after each table load */
    slice *slices;
    int n_slices;
    weight *weights;
    int n_weights;
    pthread_t th[3];
    int started;
};

/* ---- EndpointSlices ------------------------------------------------------------------------ */

/* Every ready endpoint of service's slices, to the routes that follow it
 * (both revisions: the routes know which Service is which). Under mu. */
static void publish(rt_gateway *g, const char *service)
{
    const char *urls[RT_MAX_BACKENDS] = {0};
    char *copies[SLICES_PER_SERVICE] = {0};
    int n = 0, c = 0;
    for (int s = 0; s < g->n_slices && c < SLICES_PER_SERVICE; s++) {
        if (strcmp(g->slices[s].service, service) || !g->slices[s].urls || !(copies[c] = strdup(g->slices[s].urls)))
            continue;
        for (char *save = NULL, *tok = strtok_r(copies[c], "\n", &save); tok && n < RT_MAX_BACKENDS;
             tok = strtok_r(NULL, "\n", &save))
            urls[n++] = tok;
        c++;
    }
    rt_routes_publish(g->t, service, 0, urls, n);
    rt_routes_publish(g->t, service, 1, urls, n);
    for (int k = 0; k < c; k++) free(copies[k]);
}

static void drop_slice(rt_gateway *g, int s)
{
    free(g->slices[s].urls);
    g->slices[s] = g->slices[--g->n_slices];
}

/* Slice obj changed (or went): the book, then its Service's routes. Under mu. */
static void slice_event(rt_gateway *g, const char *type, json_t *obj)
{
    json_t *md = json_object_get(obj, "metadata");
    const char *name = json_string_value(json_object_get(md, "name"));
    const char *svc = json_string_value(json_object_get(json_object_get(md, "labels"), "kubernetes.io/service-name"));
    if (!name || !svc || strlen(name) >= 254 || strlen(svc) >= 254)
        return;
    int s = 0;
    while (s < g->n_slices && strcmp(g->slices[s].name, name)) s++;
    if (s < g->n_slices)
        drop_slice(g, s);
    if (strcmp(type, "DELETED")) {
        if (g->n_slices == GW_MAX_SLICES) {
            logf_("EndpointSlice %s/%s left out: more than %d in the namespace", g->ns, name, GW_MAX_SLICES);
            return;
        }
        slice *n = &g->slices[g->n_slices];
        snprintf(n->name, sizeof n->name, "%s", name);
        snprintf(n->service, sizeof n->service, "%s", svc);
        if (!(n->urls = rt_kube_slice_urls(obj)))
            logf_("EndpointSlice %s/%s: no memory for its endpoints", g->ns, name);
        g->n_slices++;
    }
    if (strcmp(type, "SYNC"))
        publish(g, svc);
}

/* Every Service's endpoints again (after a table load or a relist). Under mu. */
static void publish_all(rt_gateway *g)
{
    for (int s = 0; s < g->n_slices; s++) {
        int first = 1;
        for (int k = 0; k < s && first; k++) first = strcmp(g->slices[k].service, g->slices[s].service) != 0;
        if (first && rt_routes_uses_service(g->t, g->slices[s].service))
            publish(g, g->slices[s].service);
    }
}

static int on_slice(void *arg, const char *type, json_t *obj)
{
    rt_gateway *g = arg;
    pthread_mutex_lock(&g->mu);
    if (!strcmp(type, "RELIST"))
        while (g->n_slices) drop_slice(g, g->n_slices - 1);
    else if (!strcmp(type, "SYNCED"))
        publish_all(g);
    else
        slice_event(g, type, obj);
    pthread_mutex_unlock(&g->mu);
    return *g->stop;
}

/* ---- canary weights ---------------------------------------------------------------------- */

static int on_weight(void *arg, const char *type, json_t *obj)
{
    rt_gateway *g = arg;
    if (!strcmp(type, "RELIST")) { /* what the relist brings is all there is: a ConfigMap gone meanwhile is no weight */
        pthread_mutex_lock(&g->mu);
        g->n_weights = 0;
        pthread_mutex_unlock(&g->mu);
        return *g->stop;
    }
    const char *name = json_string_value(kube_json_get(obj, "metadata", "name", NULL));
    const char *v = json_string_value(kube_json_get(obj, "data", "canaryWeight", NULL));
    if (!name || strlen(name) >= 254 || (!v && strcmp(type, "DELETED")))
        return *g->stop;
    char *end = NULL;
    long w = v ? strtol(v, &end, 10) : 0;
    if (v && (*end || w < 0 || w > 100)) {
        logf_("ConfigMap %s/%s: canaryWeight %s is not 0..100; weight unchanged", g->ns, name, v);
        return *g->stop;
    }
    pthread_mutex_lock(&g->mu);
    int k = 0;
    while (k < g->n_weights && strcmp(g->weights[k].cm, name)) k++;
    if (!strcmp(type, "DELETED")) {
        w = 0; /* no canary any more */
        if (k < g->n_weights)
            g->weights[k] = g->weights[--g->n_weights];
    } else if (k < g->n_weights || g->n_weights < GW_MAX_WEIGHTS) {
        snprintf(g->weights[k].cm, sizeof g->weights[k].cm, "%s", name);
        g->weights[k].w = (int)w;
        g->n_weights += k == g->n_weights;
    } else {
        logf_("ConfigMap %s/%s: canaryWeight not remembered (more than %d weight ConfigMaps); applied now only", g->ns,
              name, GW_MAX_WEIGHTS);
    }
    rt_routes_set_weight(g->t, name, (int)w);
    pthread_mutex_unlock(&g->mu);
    return *g->stop;
}

/* ---- the table ------------------------------------------------------------------------------ */

static int on_table(void *arg, const char *type, json_t *obj)
{
    rt_gateway *g = arg;
    if (!strcmp(type, "SYNCED") || !strcmp(type, "RELIST"))
        return *g->stop;
    static const char empty[] = "{\"routes\":[]}";
    const char *text = !strcmp(type, "DELETED") ? empty : json_string_value(kube_json_get(obj, "data", GW_ROUTES_KEY, NULL));
    llm_error err = {0};
    if (!text) {
        logf_("ConfigMap %s/%s has no %s: the route table is unchanged", g->ns, g->routes_cm, GW_ROUTES_KEY);
    } else if (rt_routes_load(g->t, text, strlen(text), &err)) {
        logf_("ConfigMap %s/%s: %s; the last good route table is kept", g->ns, g->routes_cm, err.msg);
    } else {
        logf_("route table: %d routes (ConfigMap %s/%s)", rt_routes_count(g->t), g->ns, g->routes_cm);
        pthread_mutex_lock(&g->mu);
        publish_all(g);
        for (int k = 0; k < g->n_weights; k++) rt_routes_set_weight(g->t, g->weights[k].cm, g->weights[k].w);
        pthread_mutex_unlock(&g->mu);
    }
    return *g->stop;
}

/* ---- threads --------------------------------------------------------------------------------- */

static void *follow_slices(void *arg)
{
    rt_gateway *g = arg;
    char path[400];
    snprintf(path, sizeof path, "/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices", g->ns);
    rt_kube_watch(g->cfg, path, on_slice, g, g->stop);
    return NULL;
}

static void *follow_weights(void *arg)
{
    rt_gateway *g = arg;
    char path[400];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/configmaps?labelSelector=app.kubernetes.io%%2Fmanaged-by%%3D"
                                "llm-controller", g->ns);
    rt_kube_watch(g->cfg, path, on_weight, g, g->stop);
    return NULL;
}

static void *follow_table(void *arg)
{
    rt_gateway *g = arg;
    rt_kube_watch_configmap(g->cfg, g->ns, g->routes_cm, on_table, g, g->stop);
    return NULL;
}

llm_status rt_gateway_start(kube_config *cfg, const char *ns, const char *routes_cm, rt_routes *t, atomic_int *stop,
                            rt_gateway **out, llm_error *err)
{
    if (strlen(ns) >= 254 || strlen(routes_cm) >= 254)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "namespace and ConfigMap names are at most 253 bytes");
    rt_gateway *g = calloc(1, sizeof *g);
    if (!g || !(g->slices = calloc(GW_MAX_SLICES, sizeof *g->slices)) ||
        !(g->weights = calloc(GW_MAX_WEIGHTS, sizeof *g->weights))) {
        if (g)
            free(g->slices);
        free(g);
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the gateway's watches");
    }
    g->cfg = cfg, g->t = t, g->stop = stop;
    snprintf(g->ns, sizeof g->ns, "%s", ns);
    snprintf(g->routes_cm, sizeof g->routes_cm, "%s", routes_cm);
    pthread_mutex_init(&g->mu, NULL);
    void *(*fn[3])(void *) = {follow_table, follow_slices, follow_weights};
    while (g->started < 3 && pthread_create(&g->th[g->started], NULL, fn[g->started], g) == 0) g->started++;
    *out = g;
    if (g->started < 3)
        return llm_errf(err, LLM_ERR_NOMEM, "could not start the gateway's watch threads");
    return LLM_OK;
}

void rt_gateway_join(rt_gateway *g)
{
    if (!g)
        return;
    for (int k = 0; k < g->started; k++) pthread_join(g->th[k], NULL);
    for (int s = 0; s < g->n_slices; s++) free(g->slices[s].urls);
    free(g->slices);
    free(g->weights);
    pthread_mutex_destroy(&g->mu);
    free(g);
}
