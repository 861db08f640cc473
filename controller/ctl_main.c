/* ctl_main.c - llm-controller. This first version connects to the API
 * server (kubeconfig or in-cluster credentials) and, with --check, lists
 * the LLMDeployments it would manage and exits: the reconcile loop builds
 * on this client (see issue notes).
 *   llm-controller [--kubeconfig FILE] [--namespace NS] --check */
#include <stdio.h>
#include <string.h>

#include "kube_client.h"

#define API_PATH "/apis/llmk8s.io/v1alpha1"

static int usage(void)
{
    fprintf(stderr, "usage: llm-controller [--kubeconfig FILE] [--namespace NS] --check\n");
    return 2;
}

/* Lists LLMDeployments (all namespaces, or ns) and prints one line each. */
static int check(kube_client *k, const kube_config *cfg, const char *ns)
{
    char path[512];
    if (ns)
        snprintf(path, sizeof path, API_PATH "/namespaces/%s/llmdeployments", ns);
    else
        snprintf(path, sizeof path, API_PATH "/llmdeployments");
    llm_error err = {0};
    json_t *list = NULL;
    llm_status st = kube_request(k, "GET", path, NULL, NULL, &list, &err);
    if (st == LLM_ERR_NOT_FOUND && !ns) {
        fprintf(stderr, "llm-controller: the LLMDeployment CRD is not installed (%s); apply manifests/crd first\n", err.msg);
        return 1;
    }
    if (st) {
        fprintf(stderr, "llm-controller: %s (credentials from %s)\n", err.msg, cfg->source);
        return 1;
    }
    json_t *items = json_object_get(list, "items");
    printf("connected to %s (%s)\nllmdeployments: %zu\n", cfg->server, cfg->source, json_array_size(items));
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *o = json_array_get(items, i), *md = json_object_get(o, "metadata"), *sp = json_object_get(o, "spec");
        printf("  %s/%s model=%s replicas=%lld\n", json_string_value(json_object_get(md, "namespace")),
               json_string_value(json_object_get(md, "name")),
               json_string_value(json_object_get(json_object_get(sp, "model"), "path")),
               (long long)json_integer_value(json_object_get(sp, "replicas")));
    }
    json_decref(list);
    return 0;
}

int main(int argc, char **argv)
{
    const char *kubeconfig = NULL, *ns = NULL;
    int do_check = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--check"))
            do_check = 1;
        else if (!strcmp(argv[i], "--kubeconfig") && i + 1 < argc)
            kubeconfig = argv[++i];
        else if (!strcmp(argv[i], "--namespace") && i + 1 < argc)
            ns = argv[++i];
        else
            return usage();
    }
    if (!do_check)
        return usage();
    kube_config cfg;
    kube_client *k = NULL;
    llm_error err = {0};
    if (kube_config_load(kubeconfig, &cfg, &err) || kube_client_new(&cfg, &k, &err)) {
        fprintf(stderr, "llm-controller: %s\n", err.msg);
        return 1;
    }
    int rc = check(k, &cfg, ns);
    kube_client_free(k);
    kube_config_free(&cfg);
    return rc;
}
