/* ctl_main.c - llm-controller: connects to the API server (kubeconfig or
 * in-cluster credentials) and runs the reconcile loop (ctl_loop.h), with
 * optional leader election and its health/metrics endpoints. Two
 * diagnostics: --check lists the LLMDeployments it would manage; --watch
 * PATH prints a collection's events as the informer sees them. */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "admin_secret.h"
#include "ctl_loop.h"
#include "llm/json.h"
#include "ctl_obs.h"
#include "kube_apply.h"
#include "kube_watch.h"

#define API_PATH "/apis/llmk8s.io/v1alpha1"

/* The flags, into f. */
static void usage_to(FILE *f)
{
    fprintf(f,
            "usage: llm-controller [--kubeconfig FILE] [--http-addr [HOST:]PORT] [--leader-elect]\n"
            "                      [--leader-elect-namespace NS] [--leader-elect-name NAME] [--lease-duration S]\n"
            "                      [--renew-deadline S] [--retry-period S] [--admin-key-secret NAME]\n"
            "                      [--namespace NS] [--model-cache-host-root DIR --model-cache-owner-image IMAGE]\n"
            "       llm-controller [--kubeconfig FILE] [--namespace NS] --check\n"
            "       llm-controller [--kubeconfig FILE] --watch PATH [--max-events N]\n"
            "  --namespace      manage (or list) the LLMDeployments of NS only (default: every namespace)\n"
            "  --http-addr      /healthz, /readyz and /metrics (default 8081; \"\" for none)\n"
            "  --leader-elect   run as one of several replicas: only the holder of the Lease\n"
            "                   (default llm-controller in the pod's namespace) reconciles\n"
            "  --admin-key-secret  the Secret, in the pod's namespace, holding the key the colocated\n"
            "                   canaries' admin tokens derive from (default llm-controller-admin-key;\n"
            "                   made on first use)\n"
            "  --model-cache-host-root  the node folder under which spec.model.cache.hostPath\n"
            "                   downloads go, one folder per namespace (default: none; such specs\n"
            "                   are refused)\n"
            "  --model-cache-owner-image  the image (with chown) of the init container that gives a\n"
            "                   new node folder to the pods' user, as root: the operator's own\n");
}

/* An unknown or incomplete flag: the usage on stderr, exit status 2. */
static int usage(void)
{
    usage_to(stderr);
    return 2;
}

/* --model-cache-host-root: an absolute folder other than /, in letters,
 * digits and ._-, no segment empty or starting with "." (so no . or ..),
 * as the chart's schema says (it is joined with a namespace, a DNS label,
 * into the pods' hostPath). 0: fine. */
static int bad_host_root(const char *p)
{
    size_t n = strlen(p);
    if (n < 2 || n > 512 || p[0] != '/' || p[n - 1] == '/' ||
        strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/") != n)
        return 1;
    return strstr(p, "//") || strstr(p, "/.");
}

/* The name this replica takes in the Lease: pod (or host) name and pid. */
static void identity(char *out, size_t n)
{
    char host[256] = "";
    const char *pod = getenv("POD_NAME");
    if (!pod && gethostname(host, sizeof host - 1) == 0)
        pod = host;
    snprintf(out, n, "%s_%ld", pod && *pod ? pod : "llm-controller", (long)getpid());
}

static int parse_seconds(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return *end || *out <= 0;
}

static atomic_int g_stop; /* set by the signal handler (lock-free: async-signal-safe), read by every thread */

static void on_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

typedef struct watch_print {
    long left; /* events still to print; < 0: no limit */
} watch_print;

static int print_event(void *ctx, const char *type, json_t *obj)
{
    watch_print *w = ctx;
    json_t *md = json_object_get(obj, "metadata");
    const char *ns = json_string_value(json_object_get(md, "namespace"));
    printf("%s %s%s%s %s\n", type, ns ? ns : "", ns ? "/" : "", obj ? json_string_value(json_object_get(md, "name")) : "-",
           obj ? json_string_value(json_object_get(md, "resourceVersion")) : "-");
    fflush(stdout);
    return w->left > 0 && --w->left == 0;
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
    llm_status st = kube_client_request(k, "GET", path, NULL, NULL, &list, &err);
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

#define CTL_JSON_CAP ((size_t)80 << 20)

int main(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { /* asked for: stdout, status 0 */
        usage_to(stdout);
        return 0;
    }
    const char *kubeconfig = NULL, *ns = NULL, *watch = NULL, *http = "8081", *lease_ns = NULL;
    const char *admin_key = "llm-controller-admin-key";
    int do_check = 0, bad = 0;
    watch_print wp = {-1};
    char id[512];
    identity(id, sizeof id);
    /* what every JSON parse at once may hold: the pods' pages and the quality gate's answers are the tenants',
     * and the chart gives this process 256 MiB */
    llm_json_set_shared_cap(CTL_JSON_CAP);
    ctl_options opt = {.lease = {.name = "llm-controller", .identity = id, .duration_s = 15, .renew_deadline_s = 10,
                                 .retry_s = 2}};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--leader-elect"))
            opt.leader_elect = 1;
        else if (!strcmp(argv[i], "--http-addr") && i + 1 < argc)
            http = argv[++i];
        else if (!strcmp(argv[i], "--leader-elect-namespace") && i + 1 < argc)
            lease_ns = argv[++i];
        else if (!strcmp(argv[i], "--leader-elect-name") && i + 1 < argc)
            opt.lease.name = argv[++i];
        else if (!strcmp(argv[i], "--lease-duration") && i + 1 < argc)
            bad |= parse_seconds(argv[++i], &opt.lease.duration_s);
        else if (!strcmp(argv[i], "--renew-deadline") && i + 1 < argc)
            bad |= parse_seconds(argv[++i], &opt.lease.renew_deadline_s);
        else if (!strcmp(argv[i], "--retry-period") && i + 1 < argc)
            bad |= parse_seconds(argv[++i], &opt.lease.retry_s);
        else if (!strcmp(argv[i], "--check"))
            do_check = 1;
        else if (!strcmp(argv[i], "--watch") && i + 1 < argc)
            watch = argv[++i];
        else if (!strcmp(argv[i], "--max-events") && i + 1 < argc)
            wp.left = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--kubeconfig") && i + 1 < argc)
            kubeconfig = argv[++i];
        else if (!strcmp(argv[i], "--namespace") && i + 1 < argc)
            ns = argv[++i];
        else if (!strcmp(argv[i], "--admin-key-secret") && i + 1 < argc)
            admin_key = argv[++i];
        else if (!strcmp(argv[i], "--model-cache-host-root") && i + 1 < argc)
            opt.site.cache_host_root = argv[++i];
        else if (!strcmp(argv[i], "--model-cache-owner-image") && i + 1 < argc)
            opt.site.cache_owner_image = argv[++i];
        else
            return usage();
    }
    if ((do_check && watch) || bad)
        return usage();
    if (opt.site.cache_host_root && !*opt.site.cache_host_root) /* the chart's empty value: none */
        opt.site.cache_host_root = NULL;
    if (opt.site.cache_host_root && bad_host_root(opt.site.cache_host_root)) {
        fprintf(stderr, "llm-controller: --model-cache-host-root %s: need an absolute folder other than /, without a "
                        "trailing /, in letters, digits and ._-/, no part empty or starting with '.'\n",
                opt.site.cache_host_root);
        return 2;
    }
    if (opt.site.cache_host_root && (!opt.site.cache_owner_image || !*opt.site.cache_owner_image)) {
        fprintf(stderr, "llm-controller: --model-cache-host-root needs --model-cache-owner-image (the operator's image, "
                        "which runs chown as root in the pods' init container)\n");
        return 2;
    }
    kube_config cfg;
    kube_client *k = NULL;
    llm_error err = {0};
    llm_status loaded = kube_config_load(kubeconfig, &cfg, &err);
    if (!loaded) /* our writes carry this name in managedFields (applies name it as their fieldManager) */
        snprintf(cfg.agent, sizeof cfg.agent, KUBE_FIELD_MANAGER "/0.1 (%s)", id); /* the replica, for audit logs */
    if (loaded || kube_client_new(&cfg, &k, &err)) {
        fprintf(stderr, "llm-controller: %s\n", err.msg);
        return 1;
    }
    int rc = 0;
    if (!do_check && !watch) { /* the controller proper */
        signal(SIGTERM, on_signal);
        signal(SIGINT, on_signal);
        const char *own_ns = getenv("POD_NAMESPACE") ? getenv("POD_NAMESPACE") : cfg.ns ? cfg.ns : "default";
        opt.lease.ns = lease_ns ? lease_ns : own_ns;
        opt.ns = ns;
        admin_secret_key(own_ns, admin_key); /* the colocated canaries' key: a Secret in our own namespace */
        ctl_obs_log(CTL_INFO, "managing LLMDeployments", "server", cfg.server, "credentials", cfg.source, "identity",
                opt.leader_elect ? id : NULL, "lease_namespace", opt.leader_elect ? opt.lease.ns : NULL,
                "http", *http ? http : NULL, "namespace", ns && *ns ? ns : "(all)", "model_cache_host_root",
                opt.site.cache_host_root, "model_cache_owner_image", opt.site.cache_host_root ? opt.site.cache_owner_image : NULL,
                (const char *)NULL);
        llm_status st = ctl_obs_http_start(http, &err);
        if (!st)
            st = ctl_loop_run(&cfg, &opt, &g_stop, &err);
        ctl_obs_http_stop();
        if (st)
            ctl_obs_log(CTL_ERROR, "stopped", "error", err.msg, (const char *)NULL);
        else
            ctl_obs_log(CTL_INFO, "stopped", (const char *)NULL);
        rc = st ? 1 : 0;
    } else if (watch) {
        signal(SIGTERM, on_signal);
        signal(SIGINT, on_signal);
        llm_status st = kube_watch_run(k, &cfg, watch, 2, print_event, &wp, &g_stop, &err);
        if (st)
            fprintf(stderr, "llm-controller: %s\n", err.msg);
        rc = st ? 1 : 0;
    } else {
        rc = check(k, &cfg, ns);
    }
    kube_client_free(k);
    kube_config_free(&cfg);
    return rc;
}
