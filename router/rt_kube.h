/* rt_kube.h - what llm-router reads from the API server, shared by its
 * single-deployment discovery (rt_main.c) and the gateway's (rt_gateway.c):
 * a watch that starts again until told to stop, and an EndpointSlice's
 * ready endpoints as backend entries.
 * Thread-safety: reentrant; each watch runs on its caller's thread. */
#ifndef RT_KUBE_H
#define RT_KUBE_H

#include <jansson.h>
#include <stdatomic.h>

#include "kube_config.h"
#include "kube_watch.h"

/* Lists and watches path (the API server's collection URL with its
 * selectors) until *stop, starting again after 5 s when a watch fails for
 * good (RBAC not yet bound, say); fn as kube_watch_run's. */
void rt_kube_watch(kube_config *cfg, const char *path, kube_watch_event_fn fn, void *ctx, atomic_int *stop);

/* rt_kube_watch of the one ConfigMap ns/name (a fieldSelector on its name). */
void rt_kube_watch_configmap(kube_config *cfg, const char *ns, const char *name, kube_watch_event_fn fn, void *ctx,
                             atomic_int *stop);

/* The ready endpoints of one EndpointSlice as "POD=http://IP:PORT" lines
 * (its port named http, else its first), newline-separated; malloc'd
 * (NULL without memory). */
char *rt_kube_slice_urls(json_t *slice);

#endif
