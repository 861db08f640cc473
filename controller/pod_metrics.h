/* pod_metrics.h - a serving signal (llm_requests_waiting, KV usage,
 * tokens/s) read off the /metrics of an LLMDeployment's ready pods, for
 * the built-in autoscaler.
 *
 * Thread-safety: reentrant; one list request and one HTTP GET (1 s
 * budget, 4 MiB at most) per ready pod. */
#ifndef POD_METRICS_H
#define POD_METRICS_H

#include "kube_client.h"

/* The mean of metric (an autoscaling signal name: queueDepth, ...) over the
 * ready pods of instance that answered (*n_pods of them); -1 when none did. */
double pm_read_signal(kube_client *k, const char *ns, const char *instance, long long port, const char *metric,
                      int *n_pods);

#endif
