/* ctl_loop.h - the controller's run loop: informers on LLMDeployments and
 * on the Deployments it manages feed a de-duplicating work queue of
 * namespace/name keys; one worker reconciles them (reconcile.h), retrying
 * failures with per-key exponential back-off (0.2 s doubling to 30 s).
 * A thread of its own reads the pods' pages for the reconciles
 * (podsig.h), so no reconcile waits for them; the one pod call a
 * reconcile makes is a colocated canary's /admin/canary (every pod at
 * once, 3 s for all).
 *
 * With leader election on, the informers run on every replica (so a new
 * leader starts with every key known) but the worker only reconciles
 * while this replica holds the lease; on winning it, every key is queued.
 *
 * Runs until *stop. Thread-safety: call once. */
#ifndef CTL_LOOP_H
#define CTL_LOOP_H

#include <stdatomic.h>

#include "ctl_lease.h"
#include "kube_client.h"
#include "reconcile.h"

typedef struct ctl_options {
    const char *ns;        /* manage LLMDeployments of this namespace only (NULL or "": every namespace) */
    int leader_elect;      /* 0: this replica always reconciles */
    ctl_lease_config lease; /* ns, name, identity, timings (on_change is set by ctl_loop_run) */
    desired_site site;     /* the platform's settings every reconcile applies; its strings are
                            * borrowed and must outlive ctl_loop_run */
} ctl_options;

llm_status ctl_loop_run(kube_config *cfg, const ctl_options *opt, atomic_int *stop, llm_error *err);

#endif
