/* reconcile.h - one LLMDeployment brought to its desired state: the
 * Deployment of llm-server pods, the Service in front of them and a
 * PodDisruptionBudget (all owned by it, so deleting it deletes them), then
 * its status (replicas, ready replicas, phase, Ready condition, endpoint)
 * through the status subresource. Level-based: it reads the current
 * objects and changes only what differs (a hash of each desired child is
 * kept in an annotation, so an unchanged spec writes nothing), and it is
 * safe to run any number of times. Thread-safety: one reconcile per key at
 * a time (the work queue's job); the client serialises its requests. */
#ifndef RECONCILE_H
#define RECONCILE_H

#include "kube_client.h"

/* LLM_OK when done or when the object is gone; an error to retry later.
 * *requeue_s > 0 asks for another look after that many seconds (while
 * pods load or fail, whose /startupz the status reports). */
llm_status rec_reconcile(kube_client *k, const char *ns, const char *name, double *requeue_s, llm_error *err);

#define REC_MANAGED_BY "app.kubernetes.io/managed-by"
#define REC_INSTANCE "app.kubernetes.io/instance"
#define REC_CONTROLLER "llm-controller"

#endif
