/* rt_kube.c - watches and EndpointSlices for llm-router; see rt_kube.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kube_client.h"
#include "llm/log.h"
#include "rt_kube.h"

void rt_kube_watch(kube_config *cfg, const char *path, kube_watch_event_fn fn, void *ctx, atomic_int *stop)
{
    while (!*stop) {
        kube_client *k = NULL;
        llm_error err = {0};
        llm_status st = kube_client_new(cfg, &k, &err);
        if (!st)
            st = kube_watch_run(k, cfg, path, 300, fn, ctx, stop, &err);
        kube_client_free(k);
        if (!st)
            break;
        llm_log("llm-router", "watching %s: %s (retrying)", path, err.msg);
        for (int i = 0; i < 50 && !*stop; i++) usleep(100000);
    }
}

void rt_kube_watch_configmap(kube_config *cfg, const char *ns, const char *name, kube_watch_event_fn fn, void *ctx,
                             atomic_int *stop)
{
    char path[800];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/configmaps?fieldSelector=metadata.name%%3D%s", ns, name);
    rt_kube_watch(cfg, path, fn, ctx, stop);
}

char *rt_kube_slice_urls(json_t *slice)
{
    json_t *ports = json_object_get(slice, "ports");
    long long port = 0;
    for (size_t i = 0; i < json_array_size(ports); i++) {
        json_t *p = json_array_get(ports, i);
        const char *name = json_string_value(json_object_get(p, "name"));
        if (!port || (name && !strcmp(name, "http")))
            port = json_integer_value(json_object_get(p, "port"));
    }
    size_t cap = 64, n = 0;
    char *out = calloc(1, cap);
    json_t *eps = json_object_get(slice, "endpoints");
    for (size_t i = 0; out && port && i < json_array_size(eps); i++) {
        json_t *e = json_array_get(eps, i);
        json_t *ready = json_object_get(json_object_get(e, "conditions"), "ready");
        const char *ip = json_string_value(json_array_get(json_object_get(e, "addresses"), 0));
        const char *pod = json_string_value(json_object_get(json_object_get(e, "targetRef"), "name"));
        if (!ip || (ready && !json_is_true(ready)))
            continue;
        char line[600]; /* "POD=URL" (rt_pool_set): X-Backend names the pod, not its address */
        int k = snprintf(line, sizeof line, "%s%shttp://%s:%lld\n", pod && !strchr(pod, '=') ? pod : "",
                         pod && !strchr(pod, '=') ? "=" : "", ip, port);
        if (k >= (int)sizeof line)
            continue;
        if (n + (size_t)k + 1 > cap) {
            char *p = realloc(out, cap = (n + (size_t)k + 1) * 2);
            if (!p)
                break;
            out = p;
        }
        memcpy(out + n, line, (size_t)k + 1);
        n += (size_t)k;
    }
    return out;
}

