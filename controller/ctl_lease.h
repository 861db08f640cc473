/* ctl_lease.h - leader election through a coordination.k8s.io/v1 Lease, so
 * two or more llm-controller replicas can run and exactly one reconciles.
 *
 * The holder renews the lease every retry_s; a candidate takes it over
 * when the holder has not renewed it for the lease's leaseDurationSeconds
 * (the holder's promise; duration_s when absent) as measured on the
 * candidate's own monotonic clock (from when it last saw the lease change,
 * so clock skew between machines does not matter). A holder that cannot
 * renew for renew_deadline_s stops leading before anyone else may start:
 * each lease call is cut at (renew_deadline_s - retry_s) / 2 and, while
 * leading, at the renew deadline itself, so a stalled API server cannot
 * hold a round past it (and the loss is seen by then).
 * Writes carry the resourceVersion read, so two candidates racing for an
 * expired lease cannot both win. On stop the holder releases the lease
 * (empty holderIdentity) so a standby takes over at once.
 *
 * Ownership: ctl_lease_start returns a handle the caller stops with
 * ctl_lease_stop (which joins the thread); the config must outlive it.
 * Thread-safety: ctl_lease_is_leader may be called from any thread;
 * on_change runs on the lease thread. */
#ifndef CTL_LEASE_H
#define CTL_LEASE_H

#include "kube_client.h"

typedef struct ctl_lease_config {
    const char *ns, *name, *identity;
    double duration_s, renew_deadline_s, retry_s;
    void (*on_change)(void *ctx, int leader);
    void *ctx;
} ctl_lease_config;

typedef struct ctl_lease ctl_lease;

llm_status ctl_lease_start(kube_config *cfg, const ctl_lease_config *lc, ctl_lease **out, llm_error *err);
int ctl_lease_is_leader(ctl_lease *l);
void ctl_lease_stop(ctl_lease *l);

#endif
