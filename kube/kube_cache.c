/* kube_cache.c - a chained hash table of objects by namespace/name behind
 * a mutex; see kube_cache.h. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kube_cache.h"

typedef struct entry {
    char *key;          /* "namespace/name" */
    json_t *obj;
    int stale;          /* not seen since a RELIST */
    struct entry *next;
} entry;

struct kube_cache {
    pthread_mutex_t mu;
    char plural[64];
    int complete, listed;
    entry **buckets;
    size_t n_buckets, n;
};

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

llm_status kube_cache_new(const char *plural, int complete, kube_cache **out, llm_error *err)
{
    kube_cache *c = calloc(1, sizeof *c);
    if (c)
        c->buckets = calloc(64, sizeof *c->buckets);
    if (!c || !c->buckets) {
        free(c);
        return llm_errf(err, LLM_ERR_NOMEM, "cache of %s: no memory", plural);
    }
    c->n_buckets = 64;
    c->complete = complete;
    snprintf(c->plural, sizeof c->plural, "%s", plural);
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return LLM_OK;
}

static void drop(entry *e)
{
    json_decref(e->obj);
    free(e->key);
    free(e);
}

void kube_cache_free(kube_cache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->n_buckets; i++)
        for (entry *e = c->buckets[i], *next; e; e = next) {
            next = e->next;
            drop(e);
        }
    free(c->buckets);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static entry **slot(kube_cache *c, const char *key)
{
    entry **p = &c->buckets[hash(key) & (c->n_buckets - 1)];
    while (*p && strcmp((*p)->key, key)) p = &(*p)->next;
    return p;
}

/* Twice the buckets once there is more than an object per bucket. */
static void grow(kube_cache *c)
{
    if (c->n < c->n_buckets)
        return;
    entry **b = calloc(2 * c->n_buckets, sizeof *b);
    if (!b)
        return; /* longer chains, still correct */
    for (size_t i = 0; i < c->n_buckets; i++)
        for (entry *e = c->buckets[i], *next; e; e = next) {
            next = e->next;
            entry **p = &b[hash(e->key) & (2 * c->n_buckets - 1)];
            e->next = *p;
            *p = e;
        }
    free(c->buckets);
    c->buckets = b;
    c->n_buckets *= 2;
}

static int key_of(json_t *obj, char *key, size_t n)
{
    json_t *md = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    const char *name = json_string_value(json_object_get(md, "name"));
    return name && snprintf(key, n, "%s/%s", ns ? ns : "", name) < (int)n ? 0 : -1;
}

static llm_status store(kube_cache *c, json_t *obj, const char *key)
{
    entry **p = slot(c, key);
    if (*p) {
        json_decref((*p)->obj);
        (*p)->obj = json_incref(obj);
        (*p)->stale = 0;
        return LLM_OK;
    }
    entry *e = calloc(1, sizeof *e);
    if (!e || !(e->key = strdup(key))) {
        free(e);
        return LLM_ERR_NOMEM;
    }
    e->obj = json_incref(obj);
    *p = e;
    c->n++;
    grow(c);
    return LLM_OK;
}

/* SYNCED: objects a relist did not bring back are gone. */
static void sweep(kube_cache *c)
{
    for (size_t i = 0; i < c->n_buckets; i++)
        for (entry **p = &c->buckets[i]; *p;) {
            entry *e = *p;
            if (e->stale) {
                *p = e->next;
                drop(e);
                c->n--;
            } else {
                p = &e->next;
            }
        }
}

llm_status kube_cache_event(kube_cache *c, const char *type, json_t *obj)
{
    char key[600];
    llm_status st = LLM_OK;
    pthread_mutex_lock(&c->mu);
    if (!strcmp(type, "RELIST")) {
        for (size_t i = 0; i < c->n_buckets; i++)
            for (entry *e = c->buckets[i]; e; e = e->next) e->stale = 1;
    } else if (!strcmp(type, "SYNCED")) {
        sweep(c);
        c->listed = 1;
    } else if (obj && !key_of(obj, key, sizeof key)) {
        if (!strcmp(type, "DELETED")) {
            entry **p = slot(c, key), *e = *p;
            if (e) {
                *p = e->next;
                drop(e);
                c->n--;
            }
        } else if ((st = store(c, obj, key))) {
            c->listed = 0; /* an object we could not keep: answer nothing rather than "absent" */
        }
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

kube_cached kube_cache_get(kube_cache *c, const char *ns, const char *name, json_t **out)
{
    char key[600];
    *out = NULL;
    if (snprintf(key, sizeof key, "%s/%s", ns ? ns : "", name) >= (int)sizeof key)
        return KUBE_CACHE_UNKNOWN;
    pthread_mutex_lock(&c->mu);
    kube_cached r = KUBE_CACHE_UNKNOWN;
    if (c->listed) {
        entry *e = *slot(c, key);
        if (!e)
            r = KUBE_CACHE_ABSENT;
        else if ((*out = json_deep_copy(e->obj))) /* the caller may change its copy; ours stays as seen */
            r = KUBE_CACHE_HIT;
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

kube_cached kube_cache_list(kube_cache *c, const char *ns, json_t **out)
{
    *out = NULL;
    pthread_mutex_lock(&c->mu);
    kube_cached r = KUBE_CACHE_UNKNOWN;
    json_t *all = c->listed ? json_array() : NULL;
    for (size_t i = 0; all && i < c->n_buckets; i++)
        for (entry *e = c->buckets[i]; all && e; e = e->next) {
            const char *ens = json_string_value(json_object_get(json_object_get(e->obj, "metadata"), "namespace"));
            if (ns && (!ens || strcmp(ens, ns)))
                continue;
            if (json_array_append_new(all, json_deep_copy(e->obj))) {
                json_decref(all);
                all = NULL;
            }
        }
    if (all) {
        *out = all;
        r = KUBE_CACHE_HIT;
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

int kube_cache_is_complete(kube_cache *c) { return c->complete; }
const char *kube_cache_plural(kube_cache *c) { return c->plural; }

size_t kube_cache_size(kube_cache *c)
{
    pthread_mutex_lock(&c->mu);
    size_t n = c->n;
    pthread_mutex_unlock(&c->mu);
    return n;
}

kube_cache *kube_cache_find(const kube_cache_set *set, const char *plural)
{
    for (int i = 0; set && i < set->n; i++)
        if (!strcmp(set->caches[i]->plural, plural))
            return set->caches[i];
    return NULL;
}
