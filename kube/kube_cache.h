/* kube_cache.h - what the informers have seen, kept: a store per watched
 * collection (objects by namespace/name, updated by the informer's events
 * before the object's key is queued), so a reconcile reads its
 * LLMDeployment and its children without asking the API server. At rest a
 * reconcile then makes no request at all.
 *
 * A cache is complete (every object of the collection is watched: a miss
 * means "not there") or ours (only objects carrying llm-controller's
 * managed-by label are watched: a miss may be someone else's object of
 * that name, which the caller must read from the API server before it
 * writes). Until its first list is complete a cache answers nothing.
 * Reads may lag the API server by a watch event; writes carry
 * resourceVersions or are idempotent applies, so a stale read costs a
 * retry, never a wrong write.
 *
 * kube_cache_set: the caches of a process, by resource plural, which a
 * kube_client can carry (kube_client_set_caches) for kube_apply_read.
 *
 * Ownership: the cache keeps its own references to stored objects; reads
 * return deep copies the caller owns. Thread-safety: every call takes the
 * cache's lock; any thread. */
#ifndef KUBE_CACHE_H
#define KUBE_CACHE_H

#include <jansson.h>
#include <stddef.h>

#include "llm/status.h"

typedef struct kube_cache kube_cache;

llm_status kube_cache_new(const char *plural, int complete, kube_cache **out, llm_error *err);
void kube_cache_free(kube_cache *c);

/* An informer's event (kube_watch.h's types): SYNC, ADDED, MODIFIED store
 * obj; DELETED drops it; RELIST marks every object stale and SYNCED drops
 * the stale ones and marks the cache listed. LLM_ERR_NOMEM when it cannot
 * be stored (the cache then answers nothing until the next list). */
llm_status kube_cache_event(kube_cache *c, const char *type, json_t *obj);

typedef enum kube_cached { KUBE_CACHE_HIT, KUBE_CACHE_ABSENT, KUBE_CACHE_UNKNOWN } kube_cached;
/* Looks ns/name up: HIT (*out: a deep copy), ABSENT (a complete cache
 * without it, or an ours-only cache without an object of ours by that
 * name - see kube_cache_is_complete), UNKNOWN (not listed yet, or out of
 * memory: ask the API server). */
kube_cached kube_cache_get(kube_cache *c, const char *ns, const char *name, json_t **out);
/* Every object of namespace ns (NULL: all) as a JSON array of deep copies
 * in *out: HIT, or UNKNOWN (not listed yet, or out of memory). */
kube_cached kube_cache_list(kube_cache *c, const char *ns, json_t **out);
int kube_cache_is_complete(kube_cache *c);
const char *kube_cache_plural(kube_cache *c);
size_t kube_cache_size(kube_cache *c);

#define KUBE_CACHE_SET_MAX 16
typedef struct kube_cache_set {
    kube_cache *caches[KUBE_CACHE_SET_MAX];
    int n;
} kube_cache_set;
/* The cache of plural in set (NULL: none). */
kube_cache *kube_cache_find(const kube_cache_set *set, const char *plural);

#endif
