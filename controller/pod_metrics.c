/* pod_metrics.c - a serving signal read off an LLMDeployment's ready pods'
 * /metrics; see pod_metrics.h. */
#include <curl/curl.h>
#include <stdlib.h>
#include <string.h>

#include "autoscale.h"
#include "pod_metrics.h"
#include "reconcile.h"

#define SCRAPE_MAX (4u << 20)

static json_t *get2(json_t *o, const char *a, const char *b)
{
    return json_object_get(json_object_get(o, a), b);
}

typedef struct sbuf {
    char *p;
    size_t n;
    int over;
} sbuf;

static size_t collect(char *d, size_t sz, size_t nm, void *arg)
{
    sbuf *b = arg;
    size_t add = sz * nm;
    if (b->over || b->n + add + 1 > SCRAPE_MAX) {
        b->over = 1;
        return 0;
    }
    char *p = realloc(b->p, b->n + add + 1);
    if (!p) {
        b->over = 1;
        return 0;
    }
    memcpy(p + b->n, d, add);
    b->n += add;
    p[b->n] = 0;
    b->p = p;
    return add;
}

/* One pod's reading of name; 0 when it did not answer. */
static int scrape(const char *ip, long long port, const char *name, double *out)
{
    char url[256];
    snprintf(url, sizeof url, "http://%s:%lld/metrics", ip, port);
    sbuf b = {0};
    CURL *c = curl_easy_init();
    if (!c)
        return 0;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    int found = 0;
    if (rc == CURLE_OK && code == 200 && b.p)
        *out = as_prom_value(b.p, name, &found);
    free(b.p);
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

