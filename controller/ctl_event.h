/* ctl_event.h - Kubernetes Events (core/v1) about an object, so
 * `kubectl describe` and `kubectl get events` show what the controller did
 * and what went wrong: creations, rollouts, scaling, failures.
 *
 * Ownership: obj is borrowed. Thread-safety: as the client's. */
#ifndef CTL_EVENT_H
#define CTL_EVENT_H

#include "kube_client.h"

/* type: "Normal" or "Warning"; reason: CamelCase; message formatted.
 * Failures are logged, never returned: an event is never worth a retry. */
void ctl_event(kube_client *k, json_t *obj, const char *type, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
