/* ctl_status.c - writing an object's status; see ctl_status.h. */
#include <stdio.h>

#include "ctl_status.h"
#include "kube_json.h"

/* o without its null members, at any depth (a merge patch's nulls delete
 * keys, so the stored status never has them). New reference. */
static json_t *without_nulls(json_t *o)
{
    if (!json_is_object(o))
        return json_incref(o);
    json_t *out = json_object();
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v)
        if (!json_is_null(v))
            json_object_set_new(out, key, without_nulls(v));
    return out;
}

llm_status ctl_status_write(kube_client *k, const char *path, json_t *d, json_t *want, llm_error *err)
{
    json_t *cur = json_object_get(d, "status"), *cmp = without_nulls(want);
    int same = cur && cmp && json_equal(cur, cmp);
    json_decref(cmp);
    if (same)
        return LLM_OK;
    char sp[1100];
    snprintf(sp, sizeof sp, "%s/status", path);
    /* at the version this reconcile read: a status computed from an older spec, or sent by a replica
     * that has stopped leading and was overtaken, is refused (409) rather than written over a newer one */
    json_t *patch = json_pack("{s:{s:O},s:O}", "metadata", "resourceVersion", kube_json_get(d, "metadata", "resourceVersion"),
                              "status", want);
    llm_status st = patch ? kube_client_request(k, "PATCH", sp, patch, "application/merge-patch+json", NULL, err)
                          : llm_errf(err, LLM_ERR_NOMEM, "no memory for the status of %s (or no resourceVersion)", sp);
    json_decref(patch);
    return st;
}

