/* reconcile.c - desired children of an LLMDeployment and its status; see
 * reconcile.h. */
#include <curl/curl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "reconcile.h"

#define API "/apis/llmk8s.io/v1alpha1"
#define HASH_ANN "llmk8s.io/desired-hash"

static json_t *get_path(json_t *o, const char *a, const char *b)
{
    json_t *x = json_object_get(o, a);
    return b ? json_object_get(x, b) : x;
}

static long long spec_int(json_t *spec, const char *sect, const char *key, long long def)
{
    json_t *v = get_path(spec, sect, key);
    return json_is_integer(v) ? json_integer_value(v) : def;
}

static json_t *labels(const char *name)
{
    return json_pack("{s:s,s:s,s:s}", "app.kubernetes.io/name", "llm-server", REC_INSTANCE, name, REC_MANAGED_BY,
                     REC_CONTROLLER);
}

static json_t *owner_ref(json_t *d)
{
    json_t *md = json_object_get(d, "metadata");
    return json_pack("[{s:s,s:s,s:O,s:O,s:b,s:b}]", "apiVersion", "llmk8s.io/v1alpha1", "kind", "LLMDeployment", "name",
                     json_object_get(md, "name"), "uid", json_object_get(md, "uid"), "controller", 1,
                     "blockOwnerDeletion", 1);
}

/* The model volume: pvc, hostPath or image; none when not given. */
static json_t *model_volume(json_t *spec)
{
    json_t *v = get_path(spec, "model", "volume");
    if (json_object_get(v, "pvc"))
        return json_pack("{s:s,s:{s:O,s:b}}", "name", "model", "persistentVolumeClaim", "claimName",
                         get_path(v, "pvc", "claimName"), "readOnly", 1);
    if (json_object_get(v, "hostPath"))
        return json_pack("{s:s,s:{s:O}}", "name", "model", "hostPath", "path", get_path(v, "hostPath", "path"));
    if (json_object_get(v, "image"))
        return json_pack("{s:s,s:O}", "name", "model", "image", json_object_get(v, "image"));
    return NULL;
}

static json_t *env_var(const char *name, long long v)
{
    char buf[32];
    snprintf(buf, sizeof buf, "%lld", v);
    return json_pack("{s:s,s:s}", "name", name, "value", buf);
}

/* llm-server's settings as environment variables (LLM_SERVER_*). */
static json_t *server_env(json_t *spec)
{
    json_t *e = json_pack("[{s:s,s:{s:{s:s}}},{s:s,s:O}]", "name", "POD_IP", "valueFrom", "fieldRef", "fieldPath",
                          "status.podIP", "name", "LLM_SERVER_MODEL", "value", get_path(spec, "model", "path"));
    json_array_append_new(e, env_var("LLM_SERVER_PORT", spec_int(spec, "server", "port", 8080)));
    json_array_append_new(e, env_var("LLM_SERVER_N_CTX", spec_int(spec, "engine", "contextLength", 0)));
    json_array_append_new(e, env_var("LLM_SERVER_MAX_SEQS", spec_int(spec, "engine", "maxSeqs", 64)));
    json_array_append_new(e, env_var("LLM_SERVER_MAX_BATCH_TOKENS", spec_int(spec, "engine", "maxBatchTokens", 512)));
    json_array_append_new(e, env_var("LLM_SERVER_MAX_WAITING", spec_int(spec, "engine", "maxWaiting", 256)));
    json_array_append_new(e, env_var("LLM_SERVER_THREADS", spec_int(spec, "engine", "threads", 0)));
    json_array_append_new(e, env_var("LLM_SERVER_DRAIN_TIMEOUT_S", spec_int(spec, "probes", "drainSeconds", 30)));
    const char *kv = json_string_value(get_path(spec, "engine", "kvCacheType"));
    json_array_append_new(e, json_pack("{s:s,s:s}", "name", "LLM_SERVER_KV_TYPE", "value", kv ? kv : "f16"));
    return e;
}

static json_t *probe(const char *path, long long port, long long period, long long failures)
{
    return json_pack("{s:{s:s,s:I},s:I,s:I}", "httpGet", "path", path, "port", (json_int_t)port, "periodSeconds",
                     (json_int_t)period, "failureThreshold", (json_int_t)failures);
}

static json_t *container(json_t *d)
{
    json_t *spec = json_object_get(d, "spec");
    const char *name = json_string_value(get_path(d, "metadata", "name"));
    long long port = spec_int(spec, "server", "port", 8080);
    json_t *args = json_pack("[s,s,s,s]", "--host", "$(POD_IP)", "--model_name",
                             json_string_value(get_path(spec, "model", "name")) ? json_string_value(get_path(spec, "model", "name")) : name);
    json_t *extra = get_path(spec, "server", "extraArgs");
    if (json_is_array(extra))
        json_array_extend(args, extra);
    json_t *c = json_pack("{s:s,s:O,s:o,s:o,s:[{s:s,s:I}],s:o,s:o,s:o,s:{s:b,s:b,s:{s:[s]}}}", "name", "llm-server",
                          "image", json_object_get(spec, "image"), "args", args, "env", server_env(spec), "ports", "name",
                          "http", "containerPort", (json_int_t)port, "startupProbe",
                          probe("/startupz", port, 2, spec_int(spec, "probes", "startupTimeoutSeconds", 600) / 2 + 1),
                          "readinessProbe", probe("/readyz", port, 2, 1), "livenessProbe", probe("/livez", port, 10, 3),
                          "securityContext", "allowPrivilegeEscalation", 0, "readOnlyRootFilesystem", 1, "capabilities",
                          "drop", "ALL");
    if (json_object_get(spec, "resources"))
        json_object_set(c, "resources", json_object_get(spec, "resources"));
    json_t *vol = model_volume(spec);
    const char *mount = json_string_value(json_object_get(get_path(spec, "model", "volume"), "mountPath"));
    if (vol)
        json_object_set_new(c, "volumeMounts", json_pack("[{s:s,s:s,s:b}]", "name", "model", "mountPath",
                                                         mount ? mount : "/models", "readOnly", 1));
    json_decref(vol);
    return c;
}

static json_t *meta(json_t *d, const char *name)
{
    return json_pack("{s:s,s:O,s:o,s:o,s:{}}", "name", name, "namespace", get_path(d, "metadata", "namespace"), "labels",
                     labels(name), "ownerReferences", owner_ref(d), "annotations");
}

static json_t *deployment(json_t *d)
{
    json_t *spec = json_object_get(d, "spec");
    const char *name = json_string_value(get_path(d, "metadata", "name"));
    json_t *rollout = json_object_get(spec, "rollout");
    json_t *surge = json_object_get(rollout, "maxSurge"), *unavail = json_object_get(rollout, "maxUnavailable");
    json_t *pod = json_pack("{s:I,s:{s:b,s:I},s:[o]}", "terminationGracePeriodSeconds",
                            (json_int_t)spec_int(spec, "probes", "drainSeconds", 30) + 10, "securityContext",
                            "runAsNonRoot", 1, "runAsUser", (json_int_t)65532, "containers", container(d));
    json_t *vol = model_volume(spec);
    if (vol)
        json_object_set_new(pod, "volumes", json_pack("[o]", vol));
    static const char *const copied[] = {"nodeSelector", "tolerations", "affinity", "priorityClassName"};
    for (size_t i = 0; i < sizeof copied / sizeof *copied; i++)
        if (json_object_get(spec, copied[i]))
            json_object_set(pod, copied[i], json_object_get(spec, copied[i]));
    surge = surge ? json_incref(surge) : json_integer(1);
    unavail = unavail ? json_incref(unavail) : json_integer(0);
    return json_pack("{s:s,s:s,s:o,s:{s:I,s:{s:{s:s,s:s}},s:{s:s,s:{s:o,s:o}},s:{s:{s:o},s:o}}}", "apiVersion", "apps/v1",
                     "kind", "Deployment", "metadata", meta(d, name), "spec", "replicas",
                     (json_int_t)spec_int(d, "spec", "replicas", 1), "selector", "matchLabels", REC_INSTANCE, name,
                     REC_MANAGED_BY, REC_CONTROLLER, "strategy", "type", "RollingUpdate", "rollingUpdate", "maxSurge",
                     surge, "maxUnavailable", unavail, "template",
                     "metadata", "labels", labels(name), "spec", pod);
}

static json_t *service(json_t *d)
{
    const char *name = json_string_value(get_path(d, "metadata", "name"));
    return json_pack("{s:s,s:s,s:o,s:{s:{s:s,s:s},s:[{s:s,s:I,s:I}]}}", "apiVersion", "v1", "kind", "Service", "metadata",
                     meta(d, name), "spec", "selector", REC_INSTANCE, name, REC_MANAGED_BY, REC_CONTROLLER, "ports",
                     "name", "http", "port", (json_int_t)spec_int(json_object_get(d, "spec"), "server", "port", 8080),
                     "targetPort", (json_int_t)spec_int(json_object_get(d, "spec"), "server", "port", 8080));
}

/* At most one pod down at a time in voluntary disruptions (node drains),
 * so a drain never takes the whole service away. */
static json_t *pdb(json_t *d)
{
    const char *name = json_string_value(get_path(d, "metadata", "name"));
    return json_pack("{s:s,s:s,s:o,s:{s:i,s:{s:{s:s,s:s}}}}", "apiVersion", "policy/v1", "kind", "PodDisruptionBudget",
                     "metadata", meta(d, name), "spec", "maxUnavailable", 1, "selector", "matchLabels", REC_INSTANCE, name,
                     REC_MANAGED_BY, REC_CONTROLLER);
}

/* FNV-1a of the object's canonical JSON: the annotation that says the
 * child already is what this spec wants. */
static void hash_of(json_t *o, char out[17])
{
    char *s = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
    unsigned long long h = 1469598103934665603ULL;
    for (const char *p = s ? s : ""; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ULL;
    free(s);
    snprintf(out, 17, "%016llx", h);
}

/* Creates or replaces a child unless it already carries the desired hash. */
static llm_status apply(kube_client *k, const char *coll, json_t *want, llm_error *err)
{
    char hash[17], path[1024];
    hash_of(want, hash);
    json_object_set_new(get_path(want, "metadata", "annotations"), HASH_ANN, json_string(hash));
    const char *name = json_string_value(get_path(want, "metadata", "name"));
    snprintf(path, sizeof path, "%s/%s", coll, name);
    json_t *cur = NULL;
    llm_status st = kube_request(k, "GET", path, NULL, NULL, &cur, err);
    if (st == LLM_ERR_NOT_FOUND)
        return kube_request(k, "POST", coll, want, NULL, NULL, err);
    if (st)
        return st;
    const char *have = json_string_value(json_object_get(get_path(cur, "metadata", "annotations"), HASH_ANN));
    if (!have || strcmp(have, hash)) { /* merge, at the version read: a conflict is retried */
        json_object_set(json_object_get(want, "metadata"), "resourceVersion", get_path(cur, "metadata", "resourceVersion"));
        st = kube_request(k, "PATCH", path, want, "application/merge-patch+json", NULL, err);
    }
    json_decref(cur);
    return st;
}


/* ---- what the pods say --------------------------------------------------------- */

static size_t sink(char *d, size_t sz, size_t n, void *arg)
{
    char *buf = arg;
    size_t have = strlen(buf), add = sz * n, room = 4095 - have;
    memcpy(buf + have, d, add < room ? add : room);
    buf[have + (add < room ? add : room)] = 0;
    return sz * n;
}

/* GET http://ip:port/startupz (1 s budget): the server's load phase and
 * detail; NULL when the pod does not answer. */
static json_t *pod_startup(const char *ip, long long port)
{
    char url[256], body[4096] = "";
    snprintf(url, sizeof url, "http://%s:%lld/startupz", ip, port);
    CURL *c = curl_easy_init();
    if (!c)
        return NULL;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 1000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, (void *)body);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_cleanup(c);
    return rc == CURLE_OK ? json_loads(body, 0, NULL) : NULL;
}

/* When pods are not all ready, why: a failed load (reason ModelNotFound
 * when the file is missing, else EngineFailed) or loading progress
 * (EngineLoading), from the pods' own /startupz. 1 when a reason was set. */
static int pods_reason(kube_client *k, json_t *d, char *reason, size_t rn, char *msg, size_t mn)
{
    char path[768];
    const char *ns = json_string_value(get_path(d, "metadata", "namespace"));
    const char *name = json_string_value(get_path(d, "metadata", "name"));
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods?labelSelector=" REC_INSTANCE "%%3D%s", ns, name);
    json_t *pods = NULL;
    if (kube_request(k, "GET", path, NULL, NULL, &pods, NULL))
        return 0;
    int found = 0;
    json_t *items = json_object_get(pods, "items");
    for (size_t i = 0; i < json_array_size(items) && found < 2; i++) {
        const char *ip = json_string_value(get_path(json_array_get(items, i), "status", "podIP"));
        json_t *st = ip ? pod_startup(ip, spec_int(json_object_get(d, "spec"), "server", "port", 8080)) : NULL;
        const char *phase = json_string_value(json_object_get(st, "phase"));
        const char *detail = json_string_value(json_object_get(st, "detail"));
        if (phase && detail && (!strcmp(phase, "failed") || (!strcmp(phase, "loading") && !found))) {
            int failed = !strcmp(phase, "failed");
            snprintf(reason, rn, "%s", !failed ? "EngineLoading"
                     : strstr(detail, "No such file") || strstr(detail, "cannot open") ? "ModelNotFound" : "EngineFailed");
            snprintf(msg, mn, "pod %s: %s", json_string_value(get_path(json_array_get(items, i), "metadata", "name")), detail);
            found = failed ? 2 : 1;
        }
        json_decref(st);
    }
    json_decref(pods);
    return found;
}

/* ---- status ------------------------------------------------------------------- */

static json_t *condition(const char *status, const char *reason, const char *msg, json_int_t gen)
{
    return json_pack("{s:s,s:s,s:s,s:s,s:I}", "type", "Ready", "status", status, "reason", reason, "message", msg,
                     "observedGeneration", gen);
}

/* The status the LLMDeployment should show, from its Deployment's (and,
 * while not ready, from what its pods say). */
static json_t *desired_status(kube_client *k, json_t *d, json_t *dep)
{
    json_t *spec = json_object_get(d, "spec"), *ds = json_object_get(dep, "status");
    const char *name = json_string_value(get_path(d, "metadata", "name"));
    const char *ns = json_string_value(get_path(d, "metadata", "namespace"));
    json_int_t want = spec_int(d, "spec", "replicas", 1), gen = json_integer_value(get_path(d, "metadata", "generation"));
    json_int_t have = json_integer_value(json_object_get(ds, "replicas"));
    json_int_t ready = json_integer_value(json_object_get(ds, "readyReplicas"));
    json_int_t updated = json_integer_value(json_object_get(ds, "updatedReplicas"));
    int rolled = json_integer_value(json_object_get(ds, "observedGeneration")) >= json_integer_value(get_path(dep, "metadata", "generation"));
    const char *phase = ready >= want && rolled && updated >= want ? "Ready" : ready > 0 ? "Progressing" : have > 0 ? "Loading" : "Pending";
    char msg[256], sel[256], ep[512];
    snprintf(msg, sizeof msg, "%lld of %lld replicas ready", (long long)ready, (long long)want);
    snprintf(sel, sizeof sel, REC_INSTANCE "=%s," REC_MANAGED_BY "=" REC_CONTROLLER, name);
    snprintf(ep, sizeof ep, "http://%s.%s.svc:%lld", name, ns, spec_int(spec, "server", "port", 8080));
    char reason[64];
    snprintf(reason, sizeof reason, "%s", !strcmp(phase, "Ready") ? "AllReplicasReady" : !strcmp(phase, "Pending")
                                          ? "WaitingForPods" : "EngineLoading");
    if (strcmp(phase, "Ready") && pods_reason(k, d, reason, sizeof reason, msg, sizeof msg) == 2)
        phase = "Degraded";
    return json_pack("{s:I,s:I,s:I,s:s,s:s,s:s,s:[o]}", "observedGeneration", gen, "replicas", have, "readyReplicas",
                     ready, "phase", phase, "selector", sel, "endpoint", ep, "conditions",
                     condition(!strcmp(phase, "Ready") ? "True" : "False", reason, msg, gen));
}

/* Writes the status when it differs (conditions keep their transition
 * time while their status stays). */
static llm_status update_status(kube_client *k, const char *path, json_t *d, json_t *want, llm_error *err)
{
    json_t *cur = json_object_get(d, "status");
    json_t *cc = json_array_get(json_object_get(cur, "conditions"), 0), *wc = json_array_get(json_object_get(want, "conditions"), 0);
    const char *t = json_string_value(json_object_get(cc, "lastTransitionTime"));
    if (t && json_equal(json_object_get(cc, "status"), json_object_get(wc, "status")))
        json_object_set_new(wc, "lastTransitionTime", json_string(t));
    else {
        char now[32];
        time_t tt = time(NULL);
        struct tm tm;
        strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&tt, &tm));
        json_object_set_new(wc, "lastTransitionTime", json_string(now));
    }
    if (cur && json_equal(cur, want))
        return LLM_OK;
    char sp[1100];
    snprintf(sp, sizeof sp, "%s/status", path);
    json_t *patch = json_pack("{s:O}", "status", want);
    llm_status st = kube_request(k, "PATCH", sp, patch, "application/merge-patch+json", NULL, err);
    json_decref(patch);
    return st;
}

llm_status rec_reconcile(kube_client *k, const char *ns, const char *name, double *requeue_s, llm_error *err)
{
    *requeue_s = 0;
    char path[1024], deps[512], svcs[512], pdbs[512];
    snprintf(path, sizeof path, API "/namespaces/%s/llmdeployments/%s", ns, name);
    snprintf(deps, sizeof deps, "/apis/apps/v1/namespaces/%s/deployments", ns);
    snprintf(svcs, sizeof svcs, "/api/v1/namespaces/%s/services", ns);
    snprintf(pdbs, sizeof pdbs, "/apis/policy/v1/namespaces/%s/poddisruptionbudgets", ns);
    json_t *d = NULL, *dep = NULL, *want_dep = NULL, *want_svc = NULL, *want_pdb = NULL, *status = NULL;
    llm_status st = kube_request(k, "GET", path, NULL, NULL, &d, err);
    if (st == LLM_ERR_NOT_FOUND)
        return LLM_OK; /* deleted: its children go with it (ownerReferences) */
    if (!st && get_path(d, "metadata", "deletionTimestamp"))
        goto out;
    if (!st && !(want_dep = deployment(d)))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "%s/%s: cannot build the Deployment from its spec", ns, name);
    if (!st && !(want_svc = service(d)))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "%s/%s: cannot build the Service from its spec", ns, name);
    if (!st)
        st = apply(k, deps, want_dep, err);
    if (!st)
        st = apply(k, svcs, want_svc, err);
    if (!st && !(want_pdb = pdb(d)))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "%s/%s: cannot build the PodDisruptionBudget", ns, name);
    if (!st)
        st = apply(k, pdbs, want_pdb, err);
    snprintf(deps + strlen(deps), sizeof deps - strlen(deps), "/%s", name);
    if (!st)
        st = kube_request(k, "GET", deps, NULL, NULL, &dep, err);
    if (!st && (status = desired_status(k, d, dep)))
        st = update_status(k, path, d, status, err);
    if (!st && status && strcmp(json_string_value(json_object_get(status, "phase")), "Ready"))
        *requeue_s = 5; /* not ready: look again for progress or failure (nothing polls at rest) */
out:
    json_decref(d);
    json_decref(dep);
    json_decref(want_dep);
    json_decref(want_svc);
    json_decref(want_pdb);
    json_decref(status);
    return st;
}
