/* gateway.h - what an LLMGateway should be, from it and the LLMDeployments
 * of its namespace (pure: no I/O; gw_reconcile.h carries it out).
 *
 * Its route table (llm-router's, rt_routes.h): one route per LLMDeployment
 * it selects (spec.selector.matchLabels, a subset of the deployment's
 * labels), in name order, serving the deployment's model name
 * (spec.model.name, else its name) and its adapters (spec.adapters), its
 * backends the pods themselves (the NAME-backends Service when the
 * deployment has its own router, else NAME; the canary's
 * NAME-canary-backends and the NAME-router ConfigMap's weight when a
 * separate canary runs), polled on their health port. A deployment one of
 * whose names an earlier one (by name) serves is left out, as are those
 * past GATEWAY_MAX_ROUTES or a table over GATEWAY_MAX_TABLE bytes (a
 * ConfigMap holds 1 MiB): each is named in the status' conflicts.
 *
 * Its children, in apply order: ServiceAccount, Role (EndpointSlices and
 * ConfigMaps of the namespace, read-only) and RoleBinding NAME-gateway;
 * ConfigMap NAME-gateway-routes (routes.json); Deployment NAME-gateway
 * (llm-router --routes-configmap, spread over nodes and zones unless the
 * spec's scheduling fields say otherwise); Service NAME (port 8000, the
 * endpoint); PodDisruptionBudget NAME-gateway (one pod down at a time).
 *
 * Ownership: returned objects are new references. */
#ifndef GATEWAY_H
#define GATEWAY_H

#include <jansson.h>
#include <time.h>

#define GATEWAY_PORT 8000
#define GATEWAY_HEALTH_PORT 8001 /* probes and /metrics (without a key: not in the Service) */
#define GATEWAY_APP "llm-gateway"         /* its pods' app.kubernetes.io/name */
#define GATEWAY_MAX_ROUTES 1024       /* llm-router's RT_MAX_ROUTES */
#define GATEWAY_MAX_TABLE (900 << 10) /* bytes of routes.json */
#define GATEWAY_MAX_MODELS_SHOWN 256  /* status.models */
#define GATEWAY_MAX_CONFLICTS 32      /* status.conflicts */
#define GATEWAY_IMAGE "llm-router:0.1.0"

/* What the table came to. */
typedef struct gateway_table {
    char *routes;      /* routes.json (malloc'd) */
    json_t *models;    /* [{name, deployment, adapter}] of every route */
    json_t *conflicts; /* ["DEPLOYMENT: why"] of those left out */
    int deployments;   /* routes in the table */
} gateway_table;

/* The table of gw from deployments (a JSON array of LLMDeployments, any
 * order). 0, or -1 without memory. */
int gateway_table_make(json_t *gw, json_t *deployments, gateway_table *out);
void gateway_table_free(gateway_table *t);

/* Whether gw selects deployment d (same namespace, matchLabels held). */
int gateway_selects(json_t *gw, json_t *d);

/* The children in apply order (a JSON array of objects); NULL without memory. */
json_t *gateway_children(json_t *gw, const gateway_table *t);

/* The status: dep is the gateway's Deployment as the API server has it
 * (NULL: not yet); now_s: the time a changed condition says. */
json_t *gateway_status(json_t *gw, json_t *dep, const gateway_table *t, time_t now_s);

#endif
