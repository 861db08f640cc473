/* pod_metrics.c - a serving signal read off an LLMDeployment's ready pods'
 * /metrics; see pod_metrics.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autoscale.h"
#include "desired.h"
#include "http_get.h"
#include "pod_metrics.h"
#include "reconcile.h"

/* A pod's page, and all pages of one scrape together: the pods are the
 * tenant's, and the controller (128 MiB in the chart) holds every answer
 * of a scrape at once. llm-server's and llm-router's pages are tens of KiB. */
#define SCRAPE_MAX (512u << 10)
#define SCRAPE_TOTAL (16u << 20)

static json_t *get2(json_t *o, const char *a, const char *b)
{
    return json_object_get(json_object_get(o, a), b);
}

static int pod_ready(json_t *pod)
{
    json_t *cs = get2(pod, "status", "conditions");
    for (size_t i = 0; i < json_array_size(cs); i++) {
        json_t *c = json_array_get(cs, i);
        const char *t = json_string_value(json_object_get(c, "type"));
        const char *s = json_string_value(json_object_get(c, "status"));
        if (t && s && !strcmp(t, "Ready"))
            return !strcmp(s, "True");
    }
    return 0;
}

int pm_each_ready_pod(kube_client *k, const char *ns, const char *instance, pm_pod_fn fn, void *ctx)
{
    char path[768];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods?labelSelector=" REC_INSTANCE "%%3D%s%%2C" REC_MANAGED_BY
             "%%3D" REC_CONTROLLER, ns, instance);
    json_t *pods = NULL;
    if (kube_request(k, "GET", path, NULL, NULL, &pods, NULL))
        return 0;
    int n = 0;
    json_t *items = json_object_get(pods, "items");
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *p = json_array_get(items, i);
        const char *ip = json_string_value(get2(p, "status", "podIP"));
        if (ip && pod_ready(p) && !get2(p, "metadata", "deletionTimestamp"))
            n += fn(ctx, ip) != 0;
    }
    json_decref(pods);
    return n;
}

#define SCRAPE_BUDGET_MS 2000 /* every pod together: pods that never answer cost this once */
#define SCRAPE_PODS_MAX 1024

typedef struct ips {
    char (*ip)[64];
    size_t n;
} ips;

static int collect(void *arg, const char *ip)
{
    ips *s = arg;
    if (s->n >= SCRAPE_PODS_MAX || strlen(ip) >= 64)
        return 0;
    snprintf(s->ip[s->n++], 64, "%s", ip);
    return 1;
}

int pm_scrape_each(kube_client *k, const char *ns, const char *instance, long long port, pm_text_fn fn, void *ctx)
{
    ips s = {calloc(SCRAPE_PODS_MAX, 64), 0};
    char(*urls)[128] = calloc(SCRAPE_PODS_MAX, 128);
    const char **up = calloc(SCRAPE_PODS_MAX, sizeof *up);
    long *codes = calloc(SCRAPE_PODS_MAX, sizeof *codes);
    char **bodies = calloc(SCRAPE_PODS_MAX, sizeof *bodies);
    int n = 0;
    if (s.ip && urls && up && codes && bodies) {
        pm_each_ready_pod(k, ns, instance, collect, &s);
        for (size_t i = 0; i < s.n; i++) {
            snprintf(urls[i], 128, "http://%s:%lld/metrics", s.ip[i], port);
            up[i] = urls[i];
        }
        size_t each = s.n && SCRAPE_TOTAL / s.n < SCRAPE_MAX ? SCRAPE_TOTAL / s.n : SCRAPE_MAX;
        http_get_many(up, s.n, SCRAPE_BUDGET_MS, each, codes, bodies);
        for (size_t i = 0; i < s.n; i++) {
            n += codes[i] == 200 && fn(ctx, bodies[i]);
            free(bodies[i]);
        }
    }
    free(s.ip);
    free(urls);
    free(up);
    free(codes);
    free(bodies);
    return n;
}

typedef struct signal_sum {
    const char *name;
    double sum;
} signal_sum;

static int add_signal(void *ctx, const char *text)
{
    signal_sum *s = ctx;
    int found = 0;
    double v = as_prom_value(text, s->name, &found);
    if (found)
        s->sum += v;
    return found;
}

double pm_read_signal(kube_client *k, const char *ns, const char *instance, long long port, const char *metric,
                      int *n_pods)
{
    signal_sum s = {as_metric_name(metric), 0};
    *n_pods = pm_scrape_each(k, ns, instance, port, add_signal, &s);
    return *n_pods ? s.sum / *n_pods : -1;
}

static int add_activity(void *ctx, const char *text)
{
    as_activity *a = ctx;
    int f1 = 0, f2 = 0, f3 = 0;
    a->held += as_prom_value(text, "llm_router_held_requests", &f1);
    a->requests += as_prom_value(text, "llm_router_revision_requests_total", &f2) +
                   as_prom_value(text, "llm_router_held_total", &f3);
    a->inflight += as_prom_value(text, "llm_router_backend_inflight", &f3);
    return f1 && f2;
}

void pm_router_activity(kube_client *k, const char *ns, const char *name, as_activity *out)
{
    char inst[300];
    snprintf(inst, sizeof inst, "%s-router", name);
    memset(out, 0, sizeof *out);
    out->routers = pm_scrape_each(k, ns, inst, DES_ROUTER_PORT, add_activity, out);
}
