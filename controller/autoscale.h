/* autoscale.h - the built-in autoscaler: an LLMDeployment's replicas from
 * a per-pod serving signal read off its ready pods' /metrics (requests
 * waiting, KV cache usage, generated tokens/s), decided as the HPA does:
 * desired = ceil(current * value / target), nothing within the tolerance,
 * scale-up to the lowest and scale-down to the highest recommendation of
 * their stabilisation windows, at most max_up_step pods added at once,
 * clamped to [min, max]; optionally down to zero pods when idle, woken by
 * the requests the router holds meanwhile. Its state (recent recommendations, the last
 * decisions) lives in the LLMDeployment's status.autoscaling, so a new
 * leader carries on where the old one stopped - no flap to min.
 *
 * Also the HorizontalPodAutoscaler child for mode "hpa".
 *
 * Reading the signal is podsig.h's job. Ownership: returned JSON
 * belongs to the caller. Thread-safety: pure functions. */
#ifndef AUTOSCALE_H
#define AUTOSCALE_H

#include <jansson.h>

#include "llm/status.h"

typedef struct autoscale_config {
    int enabled, hpa;        /* hpa: mode "hpa" (a HorizontalPodAutoscaler child) */
    int min, max, max_up_step; /* min 0: scale to zero (builtin mode, behind the router) */
    int zero_after_s;        /* with min 0: idle this long before sleeping */
    char metric[32];         /* queueDepth, kvCacheUsage, tokensPerSecond, cpu */
    double target, tolerance;
    int interval_s, up_window_s, down_window_s;
} autoscale_config;

/* From spec.autoscaling (defaults as the CRD's); LLM_ERR_INVALID_ARG with
 * the field when it cannot work (min > max, cpu in builtin mode). */
llm_status autoscale_config_from_spec(json_t *spec, autoscale_config *c, llm_error *err);

/* The server metric behind a signal name ("llm_requests_waiting", ...). */
const char *autoscale_metric_name(const char *metric);

typedef struct autoscale_decision {
    int desired;             /* replicas to run */
    int changed;             /* desired != current */
    char reason[256];        /* "queueDepth 12.0 per pod over target 4.0" */
} autoscale_decision;

/* Decides from the current replicas, the reading (value per pod over
 * n_pods ready pods; n_pods 0: no reading, hold) and the previous state
 * (status.autoscaling or NULL); returns the new state to store. */
json_t *autoscale_decide(const autoscale_config *c, int current, double value, int n_pods, json_t *prev, double now_unix,
                  autoscale_decision *out);

/* What the routers in front saw, for scale to zero. */
typedef struct autoscale_activity {
    int routers;             /* routers that answered; 0: nothing is known */
    double held;             /* requests held now for want of a pod */
    double requests;         /* requests proxied, all time (a change is activity) */
    double inflight;         /* requests in flight */
    int asked, own;          /* its own routers' pages asked, and answered: sleep needs every one (one not heard
                              * from may be the one taking the requests; gateways add what they answer) */
} autoscale_activity;

/* Scale to zero (min 0), after autoscale_decide (run with min 1): a deployment at
 * zero wakes to one pod when the routers hold requests, and one idle -
 * no request seen, held or in flight - for zero_after_s sleeps. Rewrites
 * out and the state autoscale_decide returned (desiredReplicas, the last
 * decision, lastActivityTime and routerRequests, carried from prev). */
void autoscale_zero(const autoscale_config *c, int current, const autoscale_activity *a, json_t *prev, json_t *state, double now_unix,
             autoscale_decision *out);

/* The HorizontalPodAutoscaler (autoscaling/v2) for mode "hpa", targeting
 * the LLMDeployment's scale subresource. */
json_t *autoscale_hpa(json_t *llmd, const autoscale_config *c);

#endif
