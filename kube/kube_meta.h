/* kube_meta.h - an object's identity the way the API server and we mean
 * it: its name's form, its controlling owner (the one ownerReference with
 * controller: true) and the hash of what we last applied. Pure helpers, shared by the
 * apply (which writes only what we control and skips what is unchanged)
 * and the planner (which refuses to adopt, and names revisions).
 *
 * Ownership: returned values are borrowed from o. Thread-safety:
 * reentrant. */
#ifndef KUBE_META_H
#define KUBE_META_H

#include <jansson.h>

/* 1 when s is a DNS-1123 subdomain (what the API server takes as most
 * objects' names: 1-253 of [a-z0-9.-], alphanumeric at both ends, no
 * ".."), so a name from a spec or a reference can go into a request path. */
int kube_meta_name_ok(const char *s);

/* The controlling ownerReference of o; NULL when none. */
json_t *kube_meta_controller_ref(json_t *o);

/* Its uid; NULL when none. */
const char *kube_meta_controller_uid(json_t *o);

/* FNV-1a of the object's canonical JSON (sorted keys), as 16 hex digits. */
void kube_meta_hash(json_t *o, char out[17]);

#endif
