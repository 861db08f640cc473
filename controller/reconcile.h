/* reconcile.h - one LLMDeployment brought to its desired state: its
 * children (desired.h: ConfigMap, Deployment, Service,
 * PodDisruptionBudget) created or patched, then its status through the
 * status subresource: replicas, ready replicas, phase, the revision being
 * served, endpoint, and conditions Ready, Progressing and Degraded whose
 * reasons say what is wrong (pod_diag.h). Events record creations,
 * rollouts, scaling and changes of condition.
 *
 * Observe -> plan -> act: it reads the LLMDeployment and its Deployments
 * (the informers' caches), the colocated canary's key and the pods'
 * signals (podsig.h: read by another thread, no wait here); plan.h decides
 * from them alone; then the plan's pod call, steps, status and events are
 * carried out, and podsig is told what to read for the next turn.
 *
 * Level-based: it reads the current objects and changes only what differs
 * (a hash of each desired child is kept in an annotation, so an unchanged
 * spec writes nothing), and it is safe to run any number of times. A spec
 * the API server refuses for a child (422) becomes Degraded/InvalidSpec
 * with the server's message, not an endless retry.
 *
 * Thread-safety: one reconcile per key at a time (the work queue's job);
 * the client serialises its requests. */
#ifndef RECONCILE_H
#define RECONCILE_H

#include <jansson.h>

#include "desired.h"
#include "kube_client.h"
#include "judge.h"
#include "podsig.h"

/* LLM_OK when done; LLM_ERR_NOT_FOUND when the object is gone (its
 * children go with it: nothing to retry, nothing to remember; ps forgets
 * it); another error to retry later.
 * *requeue_s > 0 asks for another look after that many seconds (while
 * pods load or fail, a canary is analysed, the autoscaler decides).
 * ps (may be NULL: no pod signals) gives the pods' signals and is told
 * what to read next; jg (may be NULL: no quality gate) is read for a
 * canary's quality judgement and asked for the next. site (borrowed, not NULL): the platform's settings
 * (desired.h). */
llm_status reconcile_run(kube_client *k, podsig *ps, judge *jg, const desired_site *site, const char *ns, const char *name,
                         double *requeue_s, llm_error *err);


#endif
