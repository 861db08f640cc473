/* gw_reconcile.c - an LLMGateway reconciled; see gw_reconcile.h. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctl_event.h"
#include "ctl_status.h"
#include "gateway.h"
#include "gw_reconcile.h"
#include "kube_apply.h"
#include "kube_json.h"

#define API "/apis/llmk8s.io/v1alpha1"

/* The collection path of child o ("/apis/apps/v1/namespaces/NS/deployments"). */
static void collection(json_t *o, const char *ns, char *out, size_t n)
{
    const char *av = json_string_value(json_object_get(o, "apiVersion")), *kind = json_string_value(json_object_get(o, "kind"));
    static const struct { const char *kind, *plural; } plurals[] = {
        {"ServiceAccount", "serviceaccounts"}, {"Role", "roles"}, {"RoleBinding", "rolebindings"},
        {"ConfigMap", "configmaps"}, {"Deployment", "deployments"}, {"Service", "services"},
        {"PodDisruptionBudget", "poddisruptionbudgets"}};
    const char *plural = "";
    for (size_t i = 0; kind && i < sizeof plurals / sizeof *plurals; i++)
        if (!strcmp(kind, plurals[i].kind))
            plural = plurals[i].plural;
    snprintf(out, n, "%s%s/namespaces/%s/%s", av && strchr(av, '/') ? "/apis/" : "/api/", av ? av : "v1", ns, plural);
}

/* The children applied in order; *dep: the gateway's Deployment as the API
 * server has it afterwards. */
static llm_status apply_children(kube_client *k, json_t *gw, json_t *children, const char *ns, json_t **dep,
                                 llm_error *err)
{
    llm_status st = LLM_OK;
    for (size_t i = 0; i < json_array_size(children) && !st; i++) {
        json_t *o = json_array_get(children, i);
        char coll[600];
        collection(o, ns, coll, sizeof coll);
        kube_applied did = KUBE_SAME;
        int is_dep = !strcmp(json_string_value(json_object_get(o, "kind")) ?: "", "Deployment");
        st = kube_apply_over(k, coll, o, NULL, &did, is_dep ? dep : NULL, err);
        if (!st && did == KUBE_CREATED && is_dep)
            ctl_event(k, gw, "Normal", "Created", "created gateway %s-gateway in front of %s",
                      json_string_value(kube_json_get(gw, "metadata", "name", NULL)), "its deployments");
    }
    return st;
}

/* A child refused (InvalidSpec: the API server's 422; ChildConflict: its
 * name is another owner's): Ready False, saying so. */
static llm_status refused(kube_client *k, const char *path, json_t *gw, const gateway_table *t, const char *reason,
                          const char *why, llm_error *err)
{
    json_t *status = gateway_status(gw, NULL, t, time(NULL));
    json_t *c = json_array_get(json_object_get(status, "conditions"), 0);
    json_object_set_new(c, "reason", json_string(reason));
    json_object_set_new(c, "message", json_string(why));
    llm_status st = status ? ctl_status_write(k, path, gw, status, err) : llm_errf(err, LLM_ERR_NOMEM, "no memory");
    json_decref(status);
    return st;
}

llm_status gw_reconcile_run(kube_client *k, kube_cache *deployments, const char *ns, const char *name, double *requeue_s,
                            llm_error *err)
{
    char path[1024];
    snprintf(path, sizeof path, API "/namespaces/%s/llmgateways/%s", ns, name);
    *requeue_s = 0;
    json_t *gw = NULL, *all = NULL, *children = NULL, *dep = NULL, *status = NULL;
    llm_status st = kube_apply_read(k, path, &gw, err);
    if (st || kube_json_get(gw, "metadata", "deletionTimestamp", NULL)) {
        json_decref(gw);
        return st;
    }
    gateway_table t = {0};
    if (kube_cache_list(deployments, ns, &all) != KUBE_CACHE_HIT)
        st = llm_errf(err, LLM_ERR_BACKEND, "the LLMDeployments are not listed yet");
    else if (gateway_table_make(gw, all, &t) || !(children = gateway_children(gw, &t)))
        st = llm_errf(err, LLM_ERR_NOMEM, "no memory for gateway %s/%s", ns, name);
    if (!st)
        st = apply_children(k, gw, children, ns, &dep, err);
    if (st == LLM_ERR_INVALID_ARG || st == KUBE_ERR_EXISTS) { /* the spec or a foreign object, not the moment */
        char why[LLM_ERROR_MSG_MAX];
        snprintf(why, sizeof why, "%s", err->msg);
        st = refused(k, path, gw, &t, st == KUBE_ERR_EXISTS ? "ChildConflict" : "InvalidSpec", why, err);
        *requeue_s = 15;
    } else if (!st && !(status = gateway_status(gw, dep, &t, time(NULL)))) {
        st = llm_errf(err, LLM_ERR_NOMEM, "no memory for the status of gateway %s/%s", ns, name);
    } else if (!st) {
        st = ctl_status_write(k, path, gw, status, err);
        if (!st && strcmp(json_string_value(json_object_get(status, "phase")) ?: "", "Ready"))
            *requeue_s = 2; /* until its pods are ready (their Deployment's changes queue it too) */
    }
    if (st == LLM_ERR_NOT_FOUND) /* a 404 past the first read: an API not served, not "gone" */
        st = llm_errf(err, LLM_ERR_UNSUPPORTED, "%s", err->msg);
    gateway_table_free(&t);
    json_decref(status);
    json_decref(dep);
    json_decref(children);
    json_decref(all);
    json_decref(gw);
    return st;
}
