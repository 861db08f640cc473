/* ctl_loop.h - the controller's run loop: informers on LLMDeployments and
 * on the Deployments it manages feed a de-duplicating work queue of
 * namespace/name keys; one worker reconciles them (reconcile.h), retrying
 * failures with per-key exponential back-off (0.2 s doubling to 30 s).
 * Runs until *stop. Thread-safety: call once. */
#ifndef CTL_LOOP_H
#define CTL_LOOP_H

#include "kube_client.h"

llm_status ctl_run(kube_config *cfg, volatile int *stop, llm_error *err);

#endif
