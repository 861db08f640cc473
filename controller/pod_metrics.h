/* pod_metrics.h - the /metrics of a set of ready pods: a serving signal
 * (llm_requests_waiting, KV usage, tokens/s) of an LLMDeployment's
 * llm-server pods for the built-in autoscaler, or each router pod's whole
 * text for the canary analysis.
 *
 * Thread-safety: reentrant; one list request (pods with the instance and
 * our managed-by label), then every ready pod's /metrics at once (64 at a
 * time) within 2 s in all, up to 1,024 pods, 512 KiB a page and 16 MiB for
 * all pages together (each page's share of it when there are many). */
#ifndef POD_METRICS_H
#define POD_METRICS_H

#include "autoscale.h"
#include "kube_client.h"

/* Calls fn with the IP of each ready pod of instance (not terminating);
 * fn returns nonzero when it got what it wanted. Returns how many did - 0
 * also when the pods cannot be listed: callers read 0 as "no reading"
 * (no recommendation, no scale to zero), never as "no load". */
typedef int (*pm_pod_fn)(void *ctx, const char *ip);
int pm_each_ready_pod(kube_client *k, const char *ns, const char *instance, pm_pod_fn fn, void *ctx);

/* Calls fn with each ready pod's /metrics text (borrowed for the call);
 * fn returns 1 when the text was of use. Returns how many were. */
typedef int (*pm_text_fn)(void *ctx, const char *text);
int pm_scrape_each(kube_client *k, const char *ns, const char *instance, long long port, pm_text_fn fn, void *ctx);

/* The mean of metric (an autoscaling signal name: queueDepth, ...) over the
 * ready pods of instance that answered (*n_pods of them); -1 when none did. */
double pm_read_signal(kube_client *k, const char *ns, const char *instance, long long port, const char *metric,
                      int *n_pods);

/* What the llm-router pods of LLMDeployment name saw (scale to zero):
 * requests held, proxied in all, in flight. */
void pm_router_activity(kube_client *k, const char *ns, const char *name, as_activity *out);

#endif
