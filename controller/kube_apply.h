/* kube_apply.h - desired children written to the API server: created when
 * missing, merged in (at the version read, so a conflict is retried) when
 * their content changed, left alone when not - a hash of the desired
 * object is kept in an annotation, so an unchanged spec writes nothing -
 * and deleted again only when they carry llm-controller's managed-by
 * label.
 *
 * Ownership: want and cur are borrowed (want's hash annotation is added
 * in place); *now, when asked for, is a new reference for the caller.
 * Thread-safety: as the client's. */
#ifndef KUBE_APPLY_H
#define KUBE_APPLY_H

#include "kube_client.h"

#define KUBE_HASH_ANN "llmk8s.io/desired-hash"

typedef enum kube_applied { KUBE_SAME, KUBE_CREATED, KUBE_UPDATED } kube_applied;

/* coll: the collection path (".../namespaces/x/deployments"); want must
 * have metadata.name and metadata.annotations. */
llm_status kube_apply(kube_client *k, const char *coll, json_t *want, kube_applied *did, llm_error *err);

/* As kube_apply, for a caller that has read the object already: cur
 * (borrowed) saves the GET when it shows nothing to change; NULL (not
 * read, or not there) and any write read it first, so a write is at the
 * latest resourceVersion. *now, when asked for (now may be NULL), is the object
 * as the API server holds it afterwards (new reference). */
llm_status kube_apply_over(kube_client *k, const char *coll, json_t *want, json_t *cur, kube_applied *did, json_t **now,
                           llm_error *err);

/* Deletes path when the object is ours; LLM_OK when gone or not ours. */
llm_status kube_remove_ours(kube_client *k, const char *path, llm_error *err);

#endif
