/* ctl_status.h - an object's status written through its status
 * subresource, only when it differs from what the object shows (an
 * unchanged status writes nothing), at the resourceVersion the caller
 * read: a status computed from an older spec, or sent by a replica that has
 * stopped leading, is refused (409) rather than written over a newer one.
 * Thread-safety: as the client's. */
#ifndef CTL_STATUS_H
#define CTL_STATUS_H

#include <jansson.h>

#include "kube_client.h"

/* path: the object's (.../NAME); obj: it as read; want: its new status
 * (null members remove keys, as in a merge patch). */
llm_status ctl_status_write(kube_client *k, const char *path, json_t *obj, json_t *want, llm_error *err);

#endif
