/* kube_apply.h - desired children written to the API server by
 * server-side apply (application/apply-patch+yaml, fieldManager
 * llm-controller; unforced first, then forced over the fields other
 * managers took, which the result names): the server merges what we send with what other
 * managers wrote, puts our fields back where someone changed them, and
 * drops fields we stopped sending (a nodeSelector taken out of the spec
 * leaves the Deployment). Nothing is written when the object already
 * says what we want (read from the informers' caches when the client
 * carries them: at rest a reconcile makes no request): the hash of the
 * last applied object is kept in an
 * annotation, and the object must still carry every field of it (a hand
 * edit of one is put back).
 *
 * Ownership of the objects themselves: want names its owner in
 * metadata.ownerReferences[0]; an existing object that is not controlled
 * by that owner (uid) is never written (KUBE_ERR_EXISTS, the message
 * says whose it is), and kube_apply_remove_ours deletes only what the owner
 * controls.
 *
 * Ownership: want and cur are borrowed (want's hash annotation is added
 * in place); *now, when asked for, is a new reference for the caller.
 * Thread-safety: as the client's. */
#ifndef KUBE_APPLY_H
#define KUBE_APPLY_H

#include "kube_client.h"
#include "kube_meta.h" /* kube_meta_controller_uid, for its callers */

#define KUBE_HASH_ANN "llmk8s.io/desired-hash"
#define KUBE_FIELD_MANAGER "llm-controller"

/* KUBE_TAKEN_BACK: updated, after the API server refused the unforced
 * apply because other managers held fields of it (a hand edit, another
 * controller); they were taken back with force, and err->msg (the call
 * returning LLM_OK) names them, for an event. */
typedef enum kube_applied { KUBE_SAME, KUBE_CREATED, KUBE_UPDATED, KUBE_TAKEN_BACK } kube_applied;

/* coll: the collection path (".../namespaces/x/deployments"); want must
 * have apiVersion, kind, metadata.name, metadata.annotations and an
 * ownerReference. */
llm_status kube_apply(kube_client *k, const char *coll, json_t *want, kube_applied *did, llm_error *err);

/* As kube_apply, for a caller that has read the object already: cur
 * (borrowed; NULL: not read, or not there - it is read then) saves the
 * GET. *now, when asked for (now may be NULL), is the object as the API
 * server holds it afterwards (new reference). */
llm_status kube_apply_over(kube_client *k, const char *coll, json_t *want, json_t *cur, kube_applied *did, json_t **now,
                           llm_error *err);

/* Reads the object at path from the informers' caches the client carries
 * (kube_cache.h) when they can answer, else from the API server: a hit is
 * a copy; a complete cache's miss is LLM_ERR_NOT_FOUND; an ours-only
 * cache's miss, an uncached collection or a cache not listed yet is a GET
 * (an object of that name may exist that is not ours). *out: new
 * reference. */
llm_status kube_apply_read(kube_client *k, const char *path, json_t **out, llm_error *err);

/* Deletes path when the object there is controlled by owner_uid; LLM_OK
 * when gone or not ours (an ours-only cache's miss is enough: our objects
 * carry the label); a failed read is the read's error. */
llm_status kube_apply_remove_ours(kube_client *k, const char *path, const char *owner_uid, llm_error *err);

/* 1 when cur carries every field of want with the same value (maps by
 * key; lists of named items by name, port or mountPath, other lists item
 * by item; quantities under resources by amount: "1Gi" is "1024Mi"),
 * whatever else it has (defaults, other managers' fields). */
int kube_apply_covers(json_t *want, json_t *cur);

#endif
