/* desired.h - the children an LLMDeployment should have, computed from its
 * spec alone (no API calls): the ConfigMap holding llm-server's YAML
 * configuration, the Deployment of llm-server pods, the Service and the
 * PodDisruptionBudget (and, with spec.router, llm-router pods in front),
 * each labelled as managed by llm-controller and
 * owned by the LLMDeployment (so deleting it deletes them).
 *
 * The Deployment's pods: llm-server with --config from the ConfigMap
 * (whose hash is in the pod template, so a config change rolls the pods),
 * --host $(POD_IP), API keys from the named Secret (and with a colocated
 * canary --admin_token_file from the admin Secret), probes on /startupz,
 * /readyz and /livez sized to the spec, a shutdown delay and grace period
 * that let endpoints drop a pod before it stops taking requests, non-root,
 * read-only root filesystem, no capabilities, the model volume read-only,
 * spec.podTemplate merged last (objects by key, lists of named items by
 * name).
 *
 * Ownership: every function returns a new reference (NULL when the spec
 * cannot be turned into the object; msg says why). Thread-safety: pure. */
#ifndef DESIRED_H
#define DESIRED_H

#include <jansson.h>

#include "kube_meta.h" /* kube_meta_hash: the revisions */

/* The labels every object and pod of ours carries: the controller's
 * watches, the pod signals' list and the admin calls select by them. */
#define DESIRED_MANAGED_BY "app.kubernetes.io/managed-by"
#define DESIRED_INSTANCE "app.kubernetes.io/instance"
#define DESIRED_CONTROLLER "llm-controller"
#define DESIRED_APP "app.kubernetes.io/name" /* llm-server or llm-router */

#define DESIRED_CONFIG_DIR "/etc/llm-server"
/* spec.adapters as llm-server's lora_file: a key of the configuration's
 * ConfigMap left out of its hash, so a changed list restarts no pod (the
 * controller applies it through the pods' admin routes); loaded at start. */
#define DESIRED_ADAPTERS_KEY "adapters.json"
#define DESIRED_MAX_ADAPTERS 32 /* the CRD's maxItems: the servers' max_loras */
/* Where a model source (spec.model.uri) is downloaded: the volume of
 * spec.model.cache (a PVC the replicas share, a node folder per namespace,
 * or an emptyDir per pod), in huggingface_hub's layout. */
#define DESIRED_CACHE_DIR "/var/cache/llm-models"
#define DESIRED_CONFIG_HASH "llmk8s.io/config-hash"
/* spec.chatTemplate's ConfigMap key, mounted here (chat_template_file) by
 * the volume DESIRED_TEMPLATE_VOLUME; the key when the spec names none */
#define DESIRED_TEMPLATE_DIR "/etc/llm-chat-template"
#define DESIRED_TEMPLATE_VOLUME "chat-template"
#define DESIRED_TEMPLATE_KEY "template.jinja"
/* on Deployments: the revision (hash) of their pod template */
#define DESIRED_TEMPLATE_ANN "llmk8s.io/template-hash"
/* on Deployments: the revision without the admin token's mount - equal for
 * two templates that serve alike, differing only in the operator's key
 * (turning on a colocated canary, adapters or the quality gate; a key made
 * anew): such a change rolls the pods once, with no canary */
#define DESIRED_SERVING_ANN "llmk8s.io/serving-hash"

json_t *desired_configmap(json_t *llmd, char *msg, size_t mn);
/* What the platform team set for every LLMDeployment (llm-controller's
 * flags, the chart's values); the strings are borrowed for as long as the
 * controller runs. */
typedef struct desired_site {
    /* spec.model.cache.hostPath: the node folder under which each
     * namespace's cache is a folder of its own; NULL: none offered (such a
     * spec is refused) */
    const char *cache_host_root;
    /* the image of the init container that gives that folder to the pods'
     * user: the operator's own (it runs as root), never the spec's */
    const char *cache_owner_image;
} desired_site;

/* admin_secret: the colocated canary's Secret to mount (NULL: none). site
 * (may be NULL: nothing offered). NULL when the spec cannot give the
 * Deployment (msg says why: InvalidSpec). */
json_t *desired_deployment(json_t *llmd, const char *config_hash, const char *admin_secret, const desired_site *site,
                           char *msg, size_t mn);
/* The Service NAME clients call: the llm-server pods, or the llm-router
 * pods when spec.router.enabled. */
json_t *desired_service(json_t *llmd);
/* spec.router.enabled, or a canary (whose split the router makes). */
int desired_router_enabled(json_t *llmd);
int desired_canary_enabled(json_t *llmd);
#define DESIRED_ROUTER_PORT 8000
/* The router image when the object names none (the CRD's default, which the
 * API server fills in, names it first; test_chart holds the two equal). */
#define DESIRED_ROUTER_IMAGE "llm-router:0.1.0"
/* The llm-server pods' ports: the API (spec.server.port, 8080) and the
 * health listener's (probes and /metrics on threads of their own, which no
 * API traffic can delay): the API port + 1 (- 1 at 65535). */
long long desired_server_port(json_t *llmd);
long long desired_health_port(json_t *llmd);
/* With the router: NAME-router Deployment (its pods spread over nodes and
 * zones unless spec.router's scheduling fields say otherwise), its
 * ServiceAccount/Role/RoleBinding (which 0..2: EndpointSlices read access
 * in the namespace), its PodDisruptionBudget (one router down at a time),
 * and NAME-backends, the Service of the llm-server pods it follows. */
json_t *desired_router(json_t *llmd);
/* Router pods' scheduling into pod (a pod spec): sched's nodeSelector,
 * tolerations, affinity, priorityClassName and topologySpreadConstraints,
 * or a preferred anti-affinity across nodes and a soft spread across zones
 * among the pods of instance inst. 0, or -1 without memory. */
int desired_spread(json_t *pod, json_t *sched, const char *inst);
/* Strings a[0..n) appended to the JSON array args. 0, or -1 without memory. */
int desired_append_args(json_t *args, const char *const *a, size_t n);
/* spec.tracing (an LLMDeployment's or an LLMGateway's) as llm-router's
 * --otlp-endpoint and --trace-sample-ratio, appended to args (nothing
 * without an endpoint). 0, or -1 without memory. */
int desired_trace_args(json_t *spec, json_t *args);
json_t *desired_router_rbac(json_t *llmd, int which);
json_t *desired_router_pdb(json_t *llmd);
json_t *desired_backend_service(json_t *llmd);
json_t *desired_pdb(json_t *llmd);

/* A canary revision beside the stable one (spec.canary): NAME-router, the
 * ConfigMap whose canaryWeight the routers follow; NAME-canary-config,
 * NAME-canary (the new revision's Deployment, from the desired one, its
 * pods labelled instance NAME-canary) and NAME-canary-backends. */
json_t *desired_router_weight(json_t *llmd, int weight);
json_t *desired_canary_configmap(json_t *llmd, json_t *configmap);
json_t *desired_canary_deployment(json_t *llmd, json_t *deployment, int replicas);
json_t *desired_canary_service(json_t *llmd);

/* on Deployments: the revision with the model left out - equal for two
 * specs that differ only in model.path/sha256 (a colocated canary's case) */
#define DESIRED_BASE_ANN "llmk8s.io/base-hash"
void desired_base_hash(json_t *llmd, char out[17]);
/* The bearer token of the pods' /admin/canary (spec.canary.mode
 * colocated) lives in a Secret of the name admin_secret.c derives
 * (NAME-admin-H), key "token", mounted at DESIRED_ADMIN_DIR; the pods' args
 * name the file (--admin_token_file). desired_admin_secret: that Secret named
 * name, holding token (at most 64 characters; NULL otherwise). */
int desired_colocated(json_t *llmd); /* spec.canary.mode is colocated */
int desired_adapters(json_t *llmd);  /* spec.adapters is set (even empty) */
int desired_quality(json_t *llmd);   /* spec.canary.analysis.quality is set: the pods are read by the gate */
int desired_admin(json_t *llmd);     /* the pods need the admin token: a colocated canary, adapters or the gate */
#define DESIRED_ADMIN_SUFFIX "-admin"
#define DESIRED_ADMIN_KEY "token"
#define DESIRED_ADMIN_DIR "/etc/llm-admin"
json_t *desired_admin_secret(json_t *llmd, const char *name, const char *token);
/* The llm-server backend for a spec: spec.engine.backend, or for auto (the
 * default) cuda when the container asks for GPUs, else cpu. */
const char *desired_backend(json_t *spec);


/* A Kubernetes quantity ("2Gi", "512M", "1073741824") in bytes; -1 when
 * it is not one. */
long long desired_quantity(const char *q);

#endif
