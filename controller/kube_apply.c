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

llm_status kube_apply(kube_client *k, const char *coll, json_t *want, kube_applied *did, json_t **old, llm_error *err)
{
    char hash[17], path[1024];
    if (old)
        *old = NULL;
    json_object_del(get2(want, "metadata", "annotations"), KUBE_HASH_ANN); /* not part of its own hash */
    des_hash(want, hash);
    json_object_set_new(get2(want, "metadata", "annotations"), KUBE_HASH_ANN, json_string(hash));
    snprintf(path, sizeof path, "%s/%s", coll, json_string_value(get2(want, "metadata", "name")));
    json_t *cur = NULL;
    *did = KUBE_SAME;
    llm_status st = kube_request(k, "GET", path, NULL, NULL, &cur, err);
    if (st == LLM_ERR_NOT_FOUND) {
        *did = KUBE_CREATED;
        return kube_request(k, "POST", coll, want, NULL, NULL, err);
    }
    if (st)
        return st;
    const char *have = json_string_value(json_object_get(get2(cur, "metadata", "annotations"), KUBE_HASH_ANN));
    if (!have || strcmp(have, hash)) {
        json_object_set(json_object_get(want, "metadata"), "resourceVersion", get2(cur, "metadata", "resourceVersion"));
        st = kube_request(k, "PATCH", path, want, "application/merge-patch+json", NULL, err);
        json_object_del(json_object_get(want, "metadata"), "resourceVersion");
        *did = KUBE_UPDATED;
    }
    if (old)
        *old = cur;
    else
        json_decref(cur);
    return st;
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
