/* rt_gateway.h - llm-router as a gateway in Kubernetes (rt_routes.h): it
 * follows, in one namespace, the ConfigMap that holds its route table
 * (key routes.json, written by llm-controller for an LLMGateway), the
 * EndpointSlices of the Services its routes name, and the ConfigMaps whose
 * canaryWeight its routes follow. Three watches in all however many routes
 * (the namespace's EndpointSlices; llm-controller's ConfigMaps by label;
 * the table's by name): a thousand deployments cost three connections,
 * not two thousand.
 *
 * A table that does not load (rt_routes_load's error) is logged and the
 * last good one kept; a deleted table is an empty one. After each load
 * every Service's endpoints and every weight are published again, so a
 * route that appears gets its backends at once.
 *
 * Bounds: at most GW_MAX_SLICES EndpointSlices and GW_MAX_WEIGHTS weight
 * ConfigMaps are remembered (past that, the rest are logged and left out).
 *
 * Ownership: cfg and the table are borrowed until rt_gateway_join.
 * Thread-safety: its threads are its own; start and join from one thread. */
#ifndef RT_GATEWAY_H
#define RT_GATEWAY_H

#include <stdatomic.h>

#include "kube_config.h"
#include "llm/status.h"
#include "rt_routes.h"

#define GW_MAX_SLICES 8192
#define GW_MAX_WEIGHTS 4096
#define GW_ROUTES_KEY "routes.json"

typedef struct rt_gateway rt_gateway;

/* Starts following namespace ns (its ConfigMap routes_cm holds the
 * table) until *stop. On an error after *out was made (a thread that did
 * not start), *out is set all the same: set *stop and join it. */
llm_status rt_gateway_start(kube_config *cfg, const char *ns, const char *routes_cm, rt_routes *t, atomic_int *stop,
                            rt_gateway **out, llm_error *err);
/* Waits for its threads (after *stop was set) and frees it. */
void rt_gateway_join(rt_gateway *g);

#endif
