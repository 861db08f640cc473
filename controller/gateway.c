/* gateway.c - an LLMGateway's desired objects; see gateway.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "desired.h"
#include "gateway.h"
#include "kube_json.h"

static const char *name_of(json_t *o) { return json_string_value(kube_json_get(o, "metadata", "name", NULL)); }

static const char *ns_of(json_t *o) { return json_string_value(kube_json_get(o, "metadata", "namespace", NULL)); }

int gateway_selects(json_t *gw, json_t *d)
{
    const char *a = ns_of(gw), *b = ns_of(d);
    if (!a || !b || strcmp(a, b) || kube_json_get(d, "metadata", "deletionTimestamp", NULL))
        return 0;
    json_t *want = kube_json_get(gw, "spec", "selector", "matchLabels", NULL), *have = kube_json_get(d, "metadata", "labels", NULL);
    const char *k;
    json_t *v;
    json_object_foreach(want, k, v)
        if (!json_is_string(v) || !json_equal(v, json_object_get(have, k)))
            return 0;
    return 1;
}

static int by_name(const void *a, const void *b)
{
    const char *x = name_of(*(json_t *const *)a), *y = name_of(*(json_t *const *)b);
    return strcmp(x ? x : "", y ? y : "");
}

/* The names deployment d serves: its model's, then its adapters' (an
 * adapter named as the model, which the pod would shadow, is not listed
 * twice: a route's names are distinct). */
static json_t *served(json_t *d)
{
    const char *model = json_string_value(kube_json_get(d, "spec", "model", "name", NULL));
    json_t *names = json_array(), *ads = kube_json_get(d, "spec", "adapters", NULL);
    if (!names || json_array_append_new(names, json_string(model ? model : name_of(d)))) {
        json_decref(names);
        return NULL;
    }
    for (size_t i = 0; i < json_array_size(ads); i++) {
        json_t *n = json_object_get(json_array_get(ads, i), "name");
        int dup = !json_is_string(n);
        for (size_t k = 0; !dup && k < json_array_size(names); k++) dup = json_equal(n, json_array_get(names, k));
        if (!dup && json_array_append(names, n)) {
            json_decref(names);
            return NULL;
        }
    }
    return names;
}

/* Deployment d's route (rt_routes.h's format). */
static json_t *route_of(json_t *d, json_t *names)
{
    const char *n = name_of(d);
    char svc[300], csvc[320], wcm[300];
    snprintf(svc, sizeof svc, desired_router_enabled(d) ? "%s-backends" : "%s", n);
    json_t *r = json_pack("{s:s,s:O,s:s,s:I}", "name", n, "models", names, "service", svc, "metricsPort",
                          (json_int_t)desired_health_port(d));
    json_t *spec = json_object_get(d, "spec");
    json_int_t hold = json_integer_value(kube_json_get(spec, "router", "holdSeconds", NULL));
    json_t *min = kube_json_get(spec, "autoscaling", "minReplicas", NULL);
    if (r && hold > 0 && json_is_integer(min) && json_integer_value(min) == 0 &&
        json_is_true(kube_json_get(spec, "autoscaling", "enabled", NULL))) /* scales to zero: its requests wait at the
                                                                         * gateway as at its router, and wake it */
        json_object_set_new(r, "holdSeconds", json_integer(hold));
    if (r && desired_canary_enabled(d) && !desired_colocated(d)) { /* a canary of its own pods, behind its router */
        snprintf(csvc, sizeof csvc, "%s-canary-backends", n);
        snprintf(wcm, sizeof wcm, "%s-router", n);
        json_object_set_new(r, "canaryService", json_string(csvc));
        json_object_set_new(r, "weightConfigMap", json_string(wcm));
    }
    return r;
}

static void conflict(gateway_table *t, const char *d, const char *why)
{
    char line[600];
    snprintf(line, sizeof line, "%s: %s", d, why);
    if (json_array_size(t->conflicts) < GATEWAY_MAX_CONFLICTS)
        json_array_append_new(t->conflicts, json_string(line));
}

/* Deployment d into the table (routes, models, seen names), or into the
 * conflicts. 0, or -1 without memory. */
static int add_route(gateway_table *t, json_t *routes, json_t *seen, json_t *d, size_t *bytes)
{
    json_t *names = served(d), *r = names ? route_of(d, names) : NULL;
    const char *dn = name_of(d);
    int bad = !names || !r;
    const char *clash = NULL;
    for (size_t i = 0; !bad && i < json_array_size(names) && !clash; i++)
        if (json_object_get(seen, json_string_value(json_array_get(names, i))))
            clash = json_string_value(json_array_get(names, i));
    char *text = bad ? NULL : json_dumps(r, JSON_COMPACT);
    if (clash) {
        char why[400];
        snprintf(why, sizeof why, "%.256s is served by %s", clash,
                 json_string_value(json_object_get(seen, clash)));
        conflict(t, dn, why);
    } else if (!bad && json_array_size(routes) >= GATEWAY_MAX_ROUTES) {
        char why[80];
        snprintf(why, sizeof why, "the gateway holds %d deployments at most", GATEWAY_MAX_ROUTES);
        conflict(t, dn, why);
    } else if (!bad && (!text || *bytes + strlen(text) + 1 > GATEWAY_MAX_TABLE)) {
        bad = !text;
        if (text) {
            char why[80];
            snprintf(why, sizeof why, "the route table would pass %d KiB", GATEWAY_MAX_TABLE >> 10);
            conflict(t, dn, why);
        }
    } else if (!bad) {
        *bytes += strlen(text) + 1;
        bad |= json_array_append(routes, r);
        for (size_t i = 0; !bad && i < json_array_size(names); i++) {
            const char *m = json_string_value(json_array_get(names, i));
            bad |= json_object_set_new(seen, m, json_string(dn)) ||
                   json_array_append_new(t->models, json_pack("{s:s,s:s,s:b}", "name", m, "deployment", dn, "adapter", i > 0));
        }
        t->deployments += !bad;
    }
    free(text);
    json_decref(names);
    json_decref(r);
    return bad ? -1 : 0;
}

int gateway_table_make(json_t *gw, json_t *deployments, gateway_table *out)
{
    *out = (gateway_table){.models = json_array(), .conflicts = json_array()};
    size_t n = json_array_size(deployments), k = 0, bytes = 0;
    json_t **sel = calloc(n + 1, sizeof *sel), *routes = json_array(), *seen = json_object();
    int bad = !sel || !routes || !seen || !out->models || !out->conflicts;
    for (size_t i = 0; !bad && i < n; i++)
        if (gateway_selects(gw, json_array_get(deployments, i)) && name_of(json_array_get(deployments, i)))
            sel[k++] = json_array_get(deployments, i);
    if (!bad)
        qsort(sel, k, sizeof *sel, by_name);
    for (size_t i = 0; !bad && i < k; i++) bad = add_route(out, routes, seen, sel[i], &bytes);
    json_t *doc = bad ? NULL : json_pack("{s:O}", "routes", routes);
    out->routes = doc ? json_dumps(doc, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(doc);
    json_decref(routes);
    json_decref(seen);
    free(sel);
    if (!out->routes) {
        gateway_table_free(out);
        return -1;
    }
    return 0;
}

void gateway_table_free(gateway_table *t)
{
    free(t->routes);
    json_decref(t->models);
    json_decref(t->conflicts);
    *t = (gateway_table){0};
}

/* ---- children ------------------------------------------------------------------------------- */

static json_t *labels(const char *inst)
{
    return json_pack("{s:s,s:s,s:s}", "app.kubernetes.io/name", GATEWAY_APP, DESIRED_INSTANCE, inst, DESIRED_MANAGED_BY,
                     DESIRED_CONTROLLER);
}

static json_t *meta(json_t *gw, const char *name)
{
    return json_pack("{s:s,s:s,s:o,s:[{s:s,s:s,s:s,s:O,s:b,s:b}],s:{}}", "name", name, "namespace", ns_of(gw), "labels",
                     labels(name_of(gw)), "ownerReferences", "apiVersion", "llmk8s.io/v1alpha1", "kind", "LLMGateway",
                     "name", name_of(gw), "uid", kube_json_get(gw, "metadata", "uid", NULL), "controller", 1,
                     "blockOwnerDeletion", 1, "annotations");
}

static json_t *rbac(json_t *gw, const char *n, int which)
{
    if (which == 0)
        return json_pack("{s:s,s:s,s:o,s:b}", "apiVersion", "v1", "kind", "ServiceAccount", "metadata", meta(gw, n),
                         "automountServiceAccountToken", 1);
    if (which == 1) /* the routes' pods and canary weights, and the table: read-only, this namespace */
        return json_pack("{s:s,s:s,s:o,s:[{s:[s],s:[s],s:[s,s,s]},{s:[s],s:[s],s:[s,s,s]}]}", "apiVersion",
                         "rbac.authorization.k8s.io/v1", "kind", "Role", "metadata", meta(gw, n), "rules", "apiGroups",
                         "discovery.k8s.io", "resources", "endpointslices", "verbs", "get", "list", "watch", "apiGroups", "",
                         "resources", "configmaps", "verbs", "get", "list", "watch");
    return json_pack("{s:s,s:s,s:o,s:{s:s,s:s,s:s},s:[{s:s,s:s,s:s}]}", "apiVersion", "rbac.authorization.k8s.io/v1", "kind",
                     "RoleBinding", "metadata", meta(gw, n), "roleRef", "apiGroup", "rbac.authorization.k8s.io", "kind", "Role",
                     "name", n, "subjects", "kind", "ServiceAccount", "name", n, "namespace", ns_of(gw));
}

static json_t *routes_configmap(json_t *gw, const char *n, const gateway_table *t)
{
    char cm[320];
    snprintf(cm, sizeof cm, "%s-routes", n);
    return json_pack("{s:s,s:s,s:o,s:{s:s}}", "apiVersion", "v1", "kind", "ConfigMap", "metadata", meta(gw, cm), "data",
                     "routes.json", t->routes);
}

/* spec.replicas (the CRD's default, 2, when the object has none). */
static json_int_t replicas_of(json_t *gw)
{
    json_t *r = kube_json_get(gw, "spec", "replicas", NULL);
    return json_is_integer(r) ? json_integer_value(r) : 2;
}

static json_t *container(json_t *gw, const char *n)
{
    json_t *spec = json_object_get(gw, "spec");
    const char *image = json_string_value(json_object_get(spec, "image")), *policy = json_string_value(json_object_get(spec, "policy"));
    char port[16], hport[16], table[600];
    snprintf(port, sizeof port, "%d", GATEWAY_PORT);
    snprintf(hport, sizeof hport, "%d", GATEWAY_HEALTH_PORT);
    snprintf(table, sizeof table, "%s/%s-routes", ns_of(gw), n);
    /* probes on the health port: API traffic cannot delay them there */
    json_t *live = json_pack("{s:{s:s,s:i},s:i}", "httpGet", "path", "/healthz", "port", GATEWAY_HEALTH_PORT,
                             "periodSeconds", 5);
    json_t *ready = json_pack("{s:{s:s,s:i},s:i,s:i}", "httpGet", "path", "/readyz", "port", GATEWAY_HEALTH_PORT,
                              "periodSeconds", 2, "failureThreshold", 2);
    json_t *c = json_pack("{s:s,s:s,s:[s,s,s,s,s,s,s,s,s,s,s,s,s,s],s:[{s:s,s:{s:{s:s}}}],s:[{s:s,s:i},{s:s,s:i}],s:o,s:o,"
                          "s:{s:b,s:b,s:{s:[s]}}}", "name", "llm-router", "image", image ? image : GATEWAY_IMAGE,
                          "args", "--host", "$(POD_IP)", "--port", port, "--health-port", hport, "--routes-configmap",
                          table, "--policy", policy ? policy : "cache-aware", "--hold-seconds", "0", "--shutdown-delay-s",
                          "5", "env", "name", "POD_IP", "valueFrom", "fieldRef", "fieldPath", "status.podIP", "ports",
                          "name", "http", "containerPort", GATEWAY_PORT, "name", "health", "containerPort",
                          GATEWAY_HEALTH_PORT, "livenessProbe", live, "readinessProbe", ready, "securityContext",
                          "allowPrivilegeEscalation", 0, "readOnlyRootFilesystem", 1, "capabilities", "drop", "ALL");
    json_t *res = json_object_get(spec, "resources"); /* tables and pools of many deployments: more than a router's */
    if (c)
        json_object_set_new(c, "resources", res ? json_deep_copy(res)
                                                : json_pack("{s:{s:s,s:s},s:{s:s}}", "requests", "cpu", "100m", "memory",
                                                            "64Mi", "limits", "memory", "512Mi"));
    return c;
}

/* A Secret's key as a file: the volume on pod, its mount on ctr at dir
 * (0440: with the pod's fsGroup the router's user reads it, no other). */
static int secret_file(json_t *pod, json_t *ctr, const char *vol, const char *secret, const char *key, const char *dir)
{
    json_t *v = json_pack("{s:s,s:{s:s,s:[{s:s,s:s}],s:i}}", "name", vol, "secret", "secretName", secret, "items", "key",
                          key, "path", key, "defaultMode", 0440);
    json_t *m = json_pack("{s:s,s:s,s:b}", "name", vol, "mountPath", dir, "readOnly", 1);
    json_t *vs = json_object_get(pod, "volumes"), *ms = json_object_get(ctr, "volumeMounts");
    if (!vs)
        json_object_set_new(pod, "volumes", vs = json_array());
    if (!ms)
        json_object_set_new(ctr, "volumeMounts", ms = json_array());
    return v && m && vs && ms && !json_array_append_new(vs, v) && !json_array_append_new(ms, m) ? 0 : -1;
}

/* spec.auth and spec.quotas as the router's tenant flags (rt_quota.h):
 * the keys, the upstream key and Redis's password from Secrets, mounted
 * read-only; Redis when named, else each of the replicas its share. */
static int tenant_flags(json_t *gw, json_t *pod, json_t *ctr, json_int_t replicas)
{
    json_t *spec = json_object_get(gw, "spec"), *auth = json_object_get(spec, "auth"), *q = json_object_get(spec, "quotas");
    const char *keys = json_string_value(json_object_get(auth, "secretName"));
    const char *up = json_string_value(json_object_get(auth, "upstreamKeySecret"));
    const char *redis = json_string_value(json_object_get(q, "redis")), *mode = json_string_value(json_object_get(q, "failMode"));
    const char *pw = json_string_value(json_object_get(q, "passwordSecret")), *user = json_string_value(json_object_get(q, "user"));
    json_int_t ms = json_integer_value(json_object_get(q, "timeoutMs"));
    char share[32], timeout[32], prefix[600];
    snprintf(share, sizeof share, "%lld", (long long)replicas);
    snprintf(timeout, sizeof timeout, "%lld", (long long)(ms > 0 ? ms : 100));
    snprintf(prefix, sizeof prefix, "%s/%s", ns_of(gw), name_of(gw));
    const char *k[] = {"--api-keys-file", "/etc/llm-gateway/keys/keys"};
    const char *u[] = {"--upstream-key-file", "/etc/llm-gateway/upstream/key"};
    /* the share too with Redis: what each pod holds while Redis is down and the mode is open */
    const char *r[] = {"--quota-share", share, "--quota-redis", redis, "--quota-fail", mode ? mode : "closed",
                       "--quota-timeout-ms", timeout, "--quota-prefix", prefix};
    if (!keys)
        return 0;
    int bad = secret_file(pod, ctr, "keys", keys, "keys", "/etc/llm-gateway/keys") || desired_append_args(json_object_get(ctr, "args"), k, 2);
    if (!bad && up)
        bad = secret_file(pod, ctr, "upstream", up, "key", "/etc/llm-gateway/upstream") || desired_append_args(json_object_get(ctr, "args"), u, 2);
    if (!bad)
        bad = desired_append_args(json_object_get(ctr, "args"), r, redis ? 10 : 2);
    const char *p[] = {"--quota-redis-password-file", "/etc/llm-gateway/redis/password", "--quota-redis-user", user};
    if (!bad && redis && pw)
        bad = secret_file(pod, ctr, "redis", pw, "password", "/etc/llm-gateway/redis") || desired_append_args(json_object_get(ctr, "args"), p, user ? 4 : 2);
    return bad;
}

static json_t *deployment(json_t *gw, const char *n)
{
    json_t *spec = json_object_get(gw, "spec"), *ctr = container(gw, n);
    json_int_t nrep = replicas_of(gw);
    json_t *pod = json_pack("{s:s,s:i,s:{s:b,s:I,s:I,s:{s:s}},s:[o]}", "serviceAccountName", n,
                            "terminationGracePeriodSeconds", 45, "securityContext", "runAsNonRoot", 1, "runAsUser",
                            (json_int_t)65532, "fsGroup", (json_int_t)65532, "seccompProfile", "type", "RuntimeDefault",
                            "containers", ctr);
    if (pod && (desired_spread(pod, spec, n) || tenant_flags(gw, pod, ctr, nrep) ||
                desired_trace_args(spec, json_object_get(ctr, "args")))) {
        json_decref(pod);
        pod = NULL;
    }
    return json_pack("{s:s,s:s,s:o,s:{s:I,s:{s:{s:s,s:s}},s:{s:{s:o},s:o}}}", "apiVersion", "apps/v1", "kind", "Deployment",
                     "metadata", meta(gw, n), "spec", "replicas", nrep,
                     "selector", "matchLabels", DESIRED_INSTANCE, n, DESIRED_MANAGED_BY, DESIRED_CONTROLLER, "template",
                     "metadata", "labels", labels(n), "spec", pod);
}

json_t *gateway_children(json_t *gw, const gateway_table *t)
{
    const char *name = name_of(gw);
    char n[300];
    snprintf(n, sizeof n, "%s-gateway", name);
    json_t *out = json_array();
    for (int i = 0; i < 3; i++) json_array_append_new(out, rbac(gw, n, i));
    json_array_append_new(out, routes_configmap(gw, n, t));
    json_array_append_new(out, deployment(gw, n));
    json_array_append_new(out, json_pack("{s:s,s:s,s:o,s:{s:{s:s,s:s},s:[{s:s,s:i,s:i}]}}", "apiVersion", "v1", "kind",
                                         "Service", "metadata", meta(gw, name), "spec", "selector", DESIRED_INSTANCE, n,
                                         DESIRED_MANAGED_BY, DESIRED_CONTROLLER, "ports", "name", "http", "port",
                                         GATEWAY_PORT, "targetPort", GATEWAY_PORT));
    json_array_append_new(out, json_pack("{s:s,s:s,s:o,s:{s:i,s:{s:{s:s,s:s}}}}", "apiVersion", "policy/v1", "kind",
                                         "PodDisruptionBudget", "metadata", meta(gw, n), "spec", "maxUnavailable", 1,
                                         "selector", "matchLabels", DESIRED_INSTANCE, n, DESIRED_MANAGED_BY,
                                         DESIRED_CONTROLLER));
    for (size_t i = 0; out && i < json_array_size(out); i++)
        if (!json_is_object(json_array_get(out, i))) { /* a json_pack that ran out of memory */
            json_decref(out);
            return NULL;
        }
    return json_array_size(out) == 7 ? out : (json_decref(out), NULL);
}

/* ---- status ----------------------------------------------------------------------------------- */

/* How the tenants' limits are held, in words (status.quotas). */
static void quota_mode(json_t *gw, char *out, size_t n)
{
    json_t *spec = json_object_get(gw, "spec"), *q = json_object_get(spec, "quotas");
    const char *redis = json_string_value(json_object_get(q, "redis")), *mode = json_string_value(json_object_get(q, "failMode"));
    json_int_t r = replicas_of(gw);
    if (!json_string_value(kube_json_get(spec, "auth", "secretName", NULL)))
        snprintf(out, n, "none: no API keys at the gateway (spec.auth)");
    else if (redis)
        snprintf(out, n, "shared: each tenant's limits hold across the gateway's pods through Redis %s; with Redis "
                 "unusable the pods fail %s", redis, mode && !strcmp(mode, "open") ? "open (each holds its share)"
                                                                               : "closed (503 for tenants with limits)");
    else
        snprintf(out, n, "each pod its share: each of the %lld gateway pods holds 1/%lld of each limit (no Redis in "
                 "spec.quotas)", (long long)r, (long long)r);
}

json_t *gateway_status(json_t *gw, json_t *dep, const gateway_table *t, time_t now_s)
{
    json_int_t ready = json_integer_value(kube_json_get(dep, "status", "readyReplicas", NULL));
    json_int_t replicas = json_integer_value(kube_json_get(dep, "status", "replicas", NULL));
    int ok = ready > 0;
    const char *reason = ok ? "Serving" : dep ? "PodsNotReady" : "Created";
    char msg[300], ep[600], now[32];
    snprintf(msg, sizeof msg, ok ? "%lld of %lld gateway pods ready, %d deployments behind it"
                                 : "no gateway pod ready yet (%lld of %lld), %d deployments behind it",
             (long long)ready, (long long)replicas, t->deployments);
    snprintf(ep, sizeof ep, "http://%s.%s.svc:%d", name_of(gw), ns_of(gw), GATEWAY_PORT);
    /* the condition's time moves only when its status does */
    json_t *old = json_array_get(kube_json_get(gw, "status", "conditions", NULL), 0);
    const char *was = json_string_value(json_object_get(old, "lastTransitionTime"));
    struct tm tm;
    if (!gmtime_r(&now_s, &tm) || !strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm))
        snprintf(now, sizeof now, "1970-01-01T00:00:00Z");
    int same = was && !strcmp(json_string_value(json_object_get(old, "status")) ?: "", ok ? "True" : "False");
    json_t *shown = json_array();
    for (size_t i = 0; shown && i < json_array_size(t->models) && i < GATEWAY_MAX_MODELS_SHOWN; i++)
        json_array_append(shown, json_array_get(t->models, i));
    char quota[400];
    quota_mode(gw, quota, sizeof quota);
    return json_pack("{s:O,s:I,s:I,s:s,s:s,s:i,s:I,s:o,s:O,s:s,s:[{s:s,s:s,s:s,s:s,s:s}]}", "observedGeneration",
                     kube_json_get(gw, "metadata", "generation", NULL), "replicas", replicas, "readyReplicas", ready, "phase",
                     ok ? "Ready" : "Pending", "endpoint", ep, "deployments", t->deployments, "modelCount",
                     (json_int_t)json_array_size(t->models), "models", shown, "conflicts", t->conflicts, "quotas", quota,
                     "conditions", "type",
                     "Ready", "status", ok ? "True" : "False", "reason", reason, "message", msg, "lastTransitionTime",
                     same ? was : now);
}
