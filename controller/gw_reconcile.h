/* gw_reconcile.h - one LLMGateway brought to its desired state
 * (gateway.h): it and its namespace's LLMDeployments are read from the
 * informers' caches, its children applied in order (server-side apply: an
 * unchanged spec writes nothing), then its status (the Deployment's
 * replicas, the models served and by which deployment, the conflicts) and
 * a Created event the first time. A child the API server refuses (422)
 * or that another owner holds shows as Ready False with the reason and
 * the server's words, not as an endless retry.
 *
 * Thread-safety: one reconcile per key at a time (the work queue's job). */
#ifndef GW_RECONCILE_H
#define GW_RECONCILE_H

#include "kube_cache.h"
#include "kube_client.h"

/* LLM_OK when done; LLM_ERR_NOT_FOUND when the gateway is gone (its
 * children go with it); another error to retry. deployments: the
 * informer's LLMDeployment cache. *requeue_s > 0: look again after that
 * long (while its pods are not ready). */
llm_status gw_reconcile_run(kube_client *k, kube_cache *deployments, const char *ns, const char *name, double *requeue_s,
                            llm_error *err);

#endif
