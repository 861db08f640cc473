/* rt_routes.h - llm-router's gateway mode: several deployments behind one
 * endpoint. A route is one deployment: its name, the model names it serves
 * (its base model's; the LoRA adapters its pods list count too), its pool
 * (stable and canary revisions, the canary's weight, its own policy state:
 * rt_pool.h), and where its backends come from: static URLs, or Services
 * whose EndpointSlices the router follows (rt_main.c), and the ConfigMap
 * whose canaryWeight it follows.
 *
 * The table, as JSON (a file, or a ConfigMap's routes.json that
 * llm-controller writes for an LLMGateway):
 *   {"routes": [{"name": "gemma", "models": ["gemma-3"],
 *                "service": "gemma", "canaryService": "gemma-canary-backends",
 *                "weightConfigMap": "gemma-router",
 *                "backends": ["http://..."], "canaryBackends": [], "weight": 0,
 *                "metricsPort": 8081, "holdSeconds": 60}]}
 * name: 1-63 of [A-Za-z0-9._-]; models: 1-64 names of 1-256 bytes, no
 * control characters, each served by one route only; services and
 * ConfigMaps: names of 1-253 of [a-z0-9.-]; backends: at most
 * RT_MAX_BACKENDS URLs ("NAME=URL" names them); weight: 0..100 (without
 * weightConfigMap); metricsPort: where its pods' /metrics are polled (their
 * health listener), 1..65535; holdSeconds: 0..3600, how long a request
 * waits while the route has no backend (its deployment scaled to zero).
 * At most RT_MAX_ROUTES routes.
 *
 * A request's model picks its route: the route that lists the name, else
 * (a table from a file) the first route one of whose pods lists it as a
 * loaded adapter; none: the caller answers 404 naming what is served
 * (rt_routes_not_served).
 *
 * The table is replaced whole (rt_routes_load); a route that stays (same
 * name) keeps its pool and its backends' state; a bad table changes
 * nothing (memory running out while static backends are set, after the
 * table changed, is logged). A request holds its route (rt_routes_find .. rt_routes_put):
 * a route dropped from the table is freed when its last request ends.
 *
 * Thread-safety: every function may be called from any thread. Locks: a
 * caller's (rt_gateway's) lock, then the table's, then a pool's; never the
 * other way round. */
#ifndef RT_ROUTES_H
#define RT_ROUTES_H

#include <stddef.h>

#include "llm/status.h"
#include "llm/strbuf.h"
#include "rt_pool.h"

#define RT_MAX_ROUTES 1024
#define RT_ROUTE_MAX_MODELS 64
#define RT_ROUTE_NAME_MAX 63
#define RT_MODEL_NAME_MAX 256
#define RT_OBJECT_NAME_MAX 253

typedef struct rt_route rt_route;
typedef struct rt_routes rt_routes; /* (also declared by rt_proxy.h) */

/* An empty table whose routes' pools are made with pc. */
llm_status rt_routes_new(const rt_pool_config *pc, rt_routes **out, llm_error *err);
/* Frees the table and its routes; no request may hold one any more. */
void rt_routes_free(rt_routes *t);

/* Replaces the table with the one in json[0..n) (format above). An error
 * names the entry and field; the table is then unchanged. */
llm_status rt_routes_load(rt_routes *t, const char *json, size_t n, llm_error *err);
/* Routes in the table now. */
int rt_routes_count(rt_routes *t);

/* The route serving model (held), or NULL. */
rt_route *rt_routes_find(rt_routes *t, const char *model);
/* The table's only route (held), or NULL when it has none or several: a
 * request naming no model goes there. */
rt_route *rt_routes_sole(rt_routes *t);
/* Lets go of a route found or listed (NULL: nothing). */
void rt_routes_put(rt_routes *t, rt_route *r);
/* Every route of the table, held, into out (at most max); the count. */
int rt_routes_list(rt_routes *t, rt_route **out, int max);

rt_pool *rt_route_pool(const rt_route *r);
const char *rt_route_name(const rt_route *r);
/* The port its pods' /metrics are polled on (0: their API port). */
int rt_route_metrics_port(rt_routes *t, const rt_route *r);

/* Backends from discovery: sets revision rev of every route whose
 * (canary when rev is 1) service is named service. */
void rt_routes_publish(rt_routes *t, const char *service, int rev, const char *const *urls, int n);
/* Whether some route holds requests while it has no backend (holdSeconds)
 * and knows that it has none: its Service's endpoints were listed once
 * (or it has no Service). A gateway with such a route is ready with no
 * backend: a request must reach it to wake a deployment scaled to zero. */
int rt_routes_wakeable(rt_routes *t);
/* Whether some route follows this Service (as its stable or canary one). */
int rt_routes_uses_service(rt_routes *t, const char *service);
/* Tables come from a ConfigMap from now on: they must name Services (and
 * weight ConfigMaps), not backend URLs or weights, and a name no route
 * lists is not looked for among the adapters its pods report (the table
 * lists every adapter). A table from a file is the other way round. */
void rt_routes_from_kube(rt_routes *t);
/* The canary weight of every route that follows ConfigMap cm. */
void rt_routes_set_weight(rt_routes *t, const char *cm, int weight);

/* The models served, as an OpenAI model list ({"object": "list", "data":
 * [{"id", "object": "model", "owned_by": ROUTE}]}): every route's names,
 * then (a table from a file) the adapters its pods list; malloc'd, the caller frees it. NULL
 * without memory. */
char *rt_routes_models_json(rt_routes *t);
/* The 404 message for model: what is served (the first names, then how
 * many more), into msg. */
void rt_routes_not_served(rt_routes *t, const char *model, char *msg, size_t n);

#endif
