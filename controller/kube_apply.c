/* kube_apply.c - create, merge or delete a child; see kube_apply.h. */
#include <stdio.h>
#include <string.h>

#include "desired.h"
#include "kube_apply.h"
#include "reconcile.h"

static json_t *get2(json_t *o, const char *a, const char *b)
{
    return json_object_get(json_object_get(o, a), b);
}

/* Sets want's hash annotation (out: the hash) and path (coll/name). */
static void stamp(const char *coll, json_t *want, char hash[17], char path[1024])
{
    json_object_del(get2(want, "metadata", "annotations"), KUBE_HASH_ANN); /* not part of its own hash */
    des_hash(want, hash);
    json_object_set_new(get2(want, "metadata", "annotations"), KUBE_HASH_ANN, json_string(hash));
    snprintf(path, 1024, "%s/%s", coll, json_string_value(get2(want, "metadata", "name")));
}

static int same_hash(json_t *cur, const char *hash)
{
    const char *have = json_string_value(json_object_get(get2(cur, "metadata", "annotations"), KUBE_HASH_ANN));
    return have && !strcmp(have, hash);
}

/* Reads the object and creates or merges it; *now (optional): the
 * object afterwards. */
static llm_status write_fresh(kube_client *k, const char *coll, const char *path, const char *hash, json_t *want,
                              kube_applied *did, json_t **now, llm_error *err)
{
    json_t *cur = NULL;
    *did = KUBE_SAME;
    llm_status st = kube_request(k, "GET", path, NULL, NULL, &cur, err);
    if (st == LLM_ERR_NOT_FOUND) {
        *did = KUBE_CREATED;
        return kube_request(k, "POST", coll, want, NULL, now, err);
    }
    if (!st && !same_hash(cur, hash)) {
        json_object_set(json_object_get(want, "metadata"), "resourceVersion", get2(cur, "metadata", "resourceVersion"));
        st = kube_request(k, "PATCH", path, want, "application/merge-patch+json", now, err);
        json_object_del(json_object_get(want, "metadata"), "resourceVersion");
        *did = KUBE_UPDATED;
    } else if (!st && now) {
        *now = json_incref(cur);
    }
    json_decref(cur);
    return st;
}

llm_status kube_apply_over(kube_client *k, const char *coll, json_t *want, json_t *cur, kube_applied *did, json_t **now,
                           llm_error *err)
{
    char hash[17], path[1024];
    if (now)
        *now = NULL;
    stamp(coll, want, hash, path);
    if (cur && same_hash(cur, hash)) { /* the common case: nothing to write, nothing more to read */
        *did = KUBE_SAME;
        if (now)
            *now = json_incref(cur);
        return LLM_OK;
    }
    return write_fresh(k, coll, path, hash, want, did, now, err);
}

llm_status kube_apply(kube_client *k, const char *coll, json_t *want, kube_applied *did, llm_error *err)
{
    return kube_apply_over(k, coll, want, NULL, did, NULL, err);
}

llm_status kube_remove_ours(kube_client *k, const char *path, llm_error *err)
{
    json_t *cur = NULL;
    llm_status st = LLM_OK;
    if (kube_request(k, "GET", path, NULL, NULL, &cur, NULL) == LLM_OK) {
        const char *by = json_string_value(json_object_get(get2(cur, "metadata", "labels"), REC_MANAGED_BY));
        if (by && !strcmp(by, REC_CONTROLLER))
            st = kube_request(k, "DELETE", path, NULL, NULL, NULL, err);
    }
    json_decref(cur);
    return st == LLM_ERR_NOT_FOUND ? LLM_OK : st;
}
