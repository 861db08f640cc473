/* kube_meta.h - reading an object's metadata the way the API server means
 * it: its controlling owner (the one ownerReference with controller:
 * true). Pure helpers, shared by the apply (which writes only what we
 * control) and the planner (which refuses to adopt).
 *
 * Ownership: returned values are borrowed from o. Thread-safety:
 * reentrant. */
#ifndef KUBE_META_H
#define KUBE_META_H

#include <jansson.h>

/* The controlling ownerReference of o; NULL when none. */
json_t *kube_controller_ref(json_t *o);

/* Its uid; NULL when none. */
const char *kube_controller_uid(json_t *o);

#endif
