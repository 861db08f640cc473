/* pod_metrics.c - a serving signal read off an LLMDeployment's ready pods'
 * /metrics; see pod_metrics.h. */
#include <stdlib.h>
#include <string.h>

#include "autoscale.h"
#include "http_get.h"
#include "pod_metrics.h"
#include "reconcile.h"

#define SCRAPE_MAX (4u << 20)

static json_t *get2(json_t *o, const char *a, const char *b)
{
    return json_object_get(json_object_get(o, a), b);
}

/* One pod's reading of name; 0 when it did not answer. */
static int scrape(const char *ip, long long port, const char *name, double *out)
{
    char url[256], *text;
    snprintf(url, sizeof url, "http://%s:%lld/metrics", ip, port);
    int found = 0;
    if (http_get(NULL, url, 1000, SCRAPE_MAX, &text) == 200)
        *out = as_prom_value(text, name, &found);
    free(text);
    return found;
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

double pm_read_signal(kube_client *k, const char *ns, const char *instance, long long port, const char *metric,
                      int *n_pods)
{
    char path[768];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods?labelSelector=" REC_INSTANCE "%%3D%s", ns, instance);
    json_t *pods = NULL;
    *n_pods = 0;
    if (kube_request(k, "GET", path, NULL, NULL, &pods, NULL))
        return -1;
    double sum = 0;
    json_t *items = json_object_get(pods, "items");
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *p = json_array_get(items, i);
        const char *ip = json_string_value(get2(p, "status", "podIP"));
        double v = 0;
        if (ip && pod_ready(p) && !get2(p, "metadata", "deletionTimestamp") &&
            scrape(ip, port, as_metric_name(metric), &v)) {
            sum += v;
            (*n_pods)++;
        }
    }
    json_decref(pods);
    return *n_pods ? sum / *n_pods : -1;
}

