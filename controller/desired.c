/* desired.c - an LLMDeployment's children from its spec; see desired.h. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "desired.h"
#include "kube_json.h"
#include "kube_meta.h"
#include "llm/strbuf.h"

static long long spec_int(json_t *spec, const char *sect, const char *key, long long def)
{
    json_t *v = kube_json_get(spec, sect, key);
    return json_is_integer(v) ? json_integer_value(v) : def;
}

static const char *name_of(json_t *d)
{
    return json_string_value(kube_json_get(d, "metadata", "name"));
}

void desired_base_hash(json_t *d, char out[17])
{
    json_t *bare = json_deep_copy(d), *model = json_object_get(json_object_get(bare, "spec"), "model");
    json_object_del(model, "path");
    json_object_del(model, "sha256");
    char msg[256], cfg[17];
    json_t *cm = bare ? desired_configmap(bare, msg, sizeof msg) : NULL;
    kube_meta_hash(json_object_get(cm, "data"), cfg);
    /* the node cache is the operator's, the same for both revisions: any
     * site that offers it hashes them alike */
    static const desired_site any = {"/base-hash", "base-hash"};
    json_t *dep = cm ? desired_deployment(bare, cfg, NULL, &any, msg, sizeof msg) : NULL;
    kube_meta_hash(json_object_get(json_object_get(dep, "spec"), "template"), out);
    json_decref(dep);
    json_decref(cm);
    json_decref(bare);
}

long long desired_quantity(const char *q)
{
    static const struct { const char *sfx; double mul; } units[] = {
        {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
        {"k", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12}, {"", 1}};
    if (!q || !*q || !(isdigit((unsigned char)*q) || *q == '.'))
        return -1;
    char *end;
    double v = strtod(q, &end);
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (!strcmp(end, units[i].sfx))
            return v * units[i].mul < 9e18 ? (long long)(v * units[i].mul) : -1;
    return -1;
}

static json_t *labels(const char *name)
{
    return json_pack("{s:s,s:s,s:s}", "app.kubernetes.io/name", "llm-server", DESIRED_INSTANCE, name, DESIRED_MANAGED_BY,
                     DESIRED_CONTROLLER);
}

static json_t *meta(json_t *d, const char *name)
{
    json_t *md = json_object_get(d, "metadata");
    return json_pack("{s:s,s:O,s:o,s:[{s:s,s:s,s:O,s:O,s:b,s:b}],s:{}}", "name", name, "namespace",
                     json_object_get(md, "namespace"), "labels", labels(name_of(d)), "ownerReferences", "apiVersion",
                     "llmk8s.io/v1alpha1", "kind", "LLMDeployment", "name", json_object_get(md, "name"), "uid",
                     json_object_get(md, "uid"), "controller", 1, "blockOwnerDeletion", 1, "annotations");
}

int desired_adapters(json_t *d) { return json_is_array(kube_json_get(json_object_get(d, "spec"), "adapters", NULL)); }

int desired_quality(json_t *d)
{
    return json_is_object(kube_json_get(json_object_get(d, "spec"), "canary", "analysis", "quality", NULL));
}

int desired_admin(json_t *d) { return desired_colocated(d) || desired_adapters(d) || desired_quality(d); }

int desired_colocated(json_t *d)
{
    const char *m = json_string_value(json_object_get(json_object_get(json_object_get(d, "spec"), "canary"), "mode"));
    return m && !strcmp(m, "colocated");
}

json_t *desired_admin_secret(json_t *d, const char *name, const char *token)
{
    char b64[96];
    size_t len = strlen(token);
    if (len > 64 || EVP_EncodeBlock((unsigned char *)b64, (const unsigned char *)token, (int)len) < 0)
        return NULL;
    json_t *out = json_pack("{s:s,s:s,s:o,s:s,s:b,s:{s:s}}", "apiVersion", "v1", "kind", "Secret", "metadata",
                            meta(d, name), "type", "Opaque", "immutable", 1, "data", DESIRED_ADMIN_KEY, b64);
    OPENSSL_cleanse(b64, sizeof b64);
    return out;
}

/* ---- ConfigMap: llm-server's YAML ---------------------------------------------------- */

/* spec.adapters as llm-server's lora_file (the same members; malloc'd). */
static char *adapters_json(json_t *spec)
{
    json_t *list = json_array(), *a;
    size_t i;
    json_array_foreach(json_object_get(spec, "adapters"), i, a) {
        json_t *e = json_pack("{s:O}", "name", json_object_get(a, "name"));
        static const char *const keys[] = {"uri", "path", "sha256", "scale"};
        for (size_t k = 0; e && k < 4; k++)
            if (json_object_get(a, keys[k]))
                json_object_set(e, keys[k], json_object_get(a, keys[k]));
        if (!e || json_array_append_new(list, e)) {
            json_decref(list);
            return NULL;
        }
    }
    char *text = list ? json_dumps(list, JSON_COMPACT) : NULL;
    json_decref(list);
    return text;
}

/* One "key: value" line of the configuration (the buffer grows: a
 * 4,096-character model path fits; a failed allocation shows at the end). */
#define yaml_line(b, key, ...)                   \
    do {                                         \
        llm_strbuf_printf((b), "%s: ", (key));   \
        llm_strbuf_printf((b), __VA_ARGS__);     \
        llm_strbuf_printf((b), "\n");            \
    } while (0)

/* A YAML double-quoted scalar of s (JSON strings are valid YAML ones). */
static char *yaml_str(const char *s)
{
    json_t *j = json_string(s ? s : "");
    char *out = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    json_decref(j);
    return out;
}

/* spec.tracing's sample ratio (1 when not given). */
static double trace_ratio(json_t *spec)
{
    json_t *ratio = kube_json_get(spec, "tracing", "sampleRatio");
    return json_is_number(ratio) ? json_number_value(ratio) : 1.0;
}

/* spec.chatTemplate.key (absent: the default): a file name in the
 * template's folder, never a path out of it nor a line of the YAML. */
static int template_key_ok(json_t *key)
{
    const char *k = json_string_value(key);
    if (!key)
        return 1;
    if (!k || !*k || *k == '.' || strlen(k) > 253)
        return 0;
    for (; *k; k++)
        if (!isalnum((unsigned char)*k) && !strchr("-_.", *k))
            return 0;
    return 1;
}

json_t *desired_configmap(json_t *d, char *msg, size_t mn)
{
    json_t *spec = json_object_get(d, "spec");
    long long kv_mb = 0;
    json_t *kvm = kube_json_get(spec, "engine", "kvCacheMemory");
    if (!template_key_ok(kube_json_get(spec, "chatTemplate", "key"))) { /* (a file name, and a line of the YAML) */
        snprintf(msg, mn, "spec.chatTemplate.key: want a ConfigMap key (letters, digits, '-', '_', '.'; not first '.')");
        return NULL;
    }
    if (kvm) {
        long long bytes = json_is_integer(kvm) ? json_integer_value(kvm) : desired_quantity(json_string_value(kvm));
        if (bytes <= 0) {
            snprintf(msg, mn, "spec.engine.kvCacheMemory: %s is not a quantity like 2Gi",
                     json_is_string(kvm) ? json_string_value(kvm) : "value");
            return NULL;
        }
        kv_mb = (bytes + (1 << 20) - 1) >> 20;
    }
    const char *mname = json_string_value(kube_json_get(spec, "model", "name"));
    const char *uri = json_string_value(kube_json_get(spec, "model", "uri"));
    char *model = yaml_str(uri ? uri : json_string_value(kube_json_get(spec, "model", "path")));
    char *served = yaml_str(mname ? mname : name_of(d));
    const char *kv = json_string_value(kube_json_get(spec, "engine", "kvCacheType"));
    const char *sha = json_string_value(kube_json_get(spec, "model", "sha256"));
    llm_strbuf yb = {0}, *y = &yb;
    llm_strbuf_printf(y, "# llm-server configuration, written by llm-controller from the LLMDeployment spec\n");
    yaml_line(y, "model", "%s", model ? model : "\"\"");
    yaml_line(y, "model_name", "%s", served ? served : "\"\"");
    yaml_line(y, "port", "%lld", desired_server_port(d));
    yaml_line(y, "health_port", "%lld", desired_health_port(d));
    yaml_line(y, "threads", "%lld", spec_int(spec, "engine", "threads", 0));
    yaml_line(y, "n_ctx", "%lld", spec_int(spec, "engine", "contextLength", 0));
    yaml_line(y, "max_seqs", "%lld", spec_int(spec, "engine", "maxSeqs", 64));
    yaml_line(y, "max_batch_tokens", "%lld", spec_int(spec, "engine", "maxBatchTokens", 512));
    yaml_line(y, "max_waiting", "%lld", spec_int(spec, "engine", "maxWaiting", 256));
    yaml_line(y, "kv_type", "%s", kv ? kv : "f16");
    yaml_line(y, "kv_cache_mb", "%lld", kv_mb);
    yaml_line(y, "shutdown_delay_s", "%lld", spec_int(spec, "probes", "shutdownDelaySeconds", 5));
    yaml_line(y, "drain_timeout_s", "%lld", spec_int(spec, "probes", "drainSeconds", 30));
    if (sha)
        yaml_line(y, "model_sha256", "%s", sha);
    if (uri)
        yaml_line(y, "model_cache", "%s", DESIRED_CACHE_DIR);
    if (uri && kube_json_get(spec, "model", "cache", "hostPath")) /* written by other deployments, kept for years */
        yaml_line(y, "model_cache_verify", "true");
    long long tp = spec_int(spec, "engine", "tensorParallelSize", 1);
    const char *be = desired_backend(spec);
    if (strcmp(be, "cpu")) /* only when not the default, so CPU deployments keep their config (and pods) */
        yaml_line(y, "backend", "%s", be);
    if (tp > 1)
        yaml_line(y, "tensor_parallel", "%lld", tp);
    if (json_is_false(kube_json_get(spec, "engine", "prefixCache"))) /* only when off: others keep their config (and pods) */
        yaml_line(y, "prefix_cache", "%s", "false");
    const char *traces = json_string_value(kube_json_get(spec, "tracing", "endpoint"));
    char *tq = traces ? yaml_str(traces) : NULL;
    if (tq) { /* only when set: others keep their config (and pods) */
        yaml_line(y, "otlp_endpoint", "%s", tq);
        yaml_line(y, "trace_sample_ratio", "%g", trace_ratio(spec));
    }
    free(tq);
    const char *tkey = json_string_value(kube_json_get(spec, "chatTemplate", "key"));
    if (kube_json_get(spec, "chatTemplate", "configMap")) /* only when set: others keep their config (and pods) */
        yaml_line(y, "chat_template_file", "%s/%s", DESIRED_TEMPLATE_DIR, tkey ? tkey : DESIRED_TEMPLATE_KEY);
    if (desired_adapters(d)) { /* the list itself is in DESIRED_ADAPTERS_KEY, outside the configuration's hash */
        yaml_line(y, "lora_file", "%s", DESIRED_CONFIG_DIR "/" DESIRED_ADAPTERS_KEY);
        /* a changed list's paths, loaded through the admin route (whose token only the controller has): anywhere
         * in the pod's own files, as lora_file's are at start */
        yaml_line(y, "lora_dir", "%s", "/");
        yaml_line(y, "max_loras", "%d", DESIRED_MAX_ADAPTERS);
    }
    free(model);
    free(served);
    char cmname[300], *text = llm_strbuf_take(y);
    snprintf(cmname, sizeof cmname, "%s-config", name_of(d));
    json_t *out = text ? json_pack("{s:s,s:s,s:o,s:{s:s}}", "apiVersion", "v1", "kind", "ConfigMap", "metadata",
                                   meta(d, cmname), "data", "config.yaml", text) : NULL;
    char *list = out && desired_adapters(d) ? adapters_json(spec) : NULL;
    if (out && desired_adapters(d) && (!list || json_object_set_new(json_object_get(out, "data"), DESIRED_ADAPTERS_KEY,
                                                                    json_string(list)))) {
        json_decref(out);
        out = NULL;
    }
    if (!out)
        snprintf(msg, mn, "no memory for the ConfigMap");
    free(list);
    free(text);
    return out;
}

/* ---- Deployment ------------------------------------------------------------------------ */

/* A source's settings as the server's environment: the endpoint (for
 * hf:// HF_ENDPOINT, for s3:// AWS_ENDPOINT_URL_S3) and, from
 * spec.model.credentialsSecret, the keys the fetch reads - each optional,
 * so one Secret serves either kind of source. Only these keys: a Secret's
 * other keys must not reach the server's settings. */
static void source_env(json_t *spec, json_t *env)
{
    static const char *const keys[] = {"HF_TOKEN", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                                       "AWS_REGION", "LLM_FETCH_BEARER_TOKEN"};
    const char *uri = json_string_value(kube_json_get(spec, "model", "uri"));
    json_t *ep = kube_json_get(spec, "model", "endpoint"), *secret = kube_json_get(spec, "model", "credentialsSecret");
    if (!uri)
        return;
    if (json_is_string(ep) && (!strncmp(uri, "hf://", 5) || !strncmp(uri, "s3://", 5)))
        json_array_append_new(env, json_pack("{s:s,s:O}", "name", uri[0] == 'h' ? "HF_ENDPOINT" : "AWS_ENDPOINT_URL_S3",
                                             "value", ep));
    for (size_t i = 0; json_is_string(json_object_get(secret, "name")) && i < sizeof keys / sizeof *keys; i++)
        json_array_append_new(env, json_pack("{s:s,s:{s:{s:O,s:s,s:b}}}", "name", keys[i], "valueFrom", "secretKeyRef",
                                             "name", json_object_get(secret, "name"), "key", keys[i], "optional", 1));
}

/* The download cache of a source: a PVC (shared by the replicas) or an
 * emptyDir (per pod, the default); the node folder is host_cache's. */
static json_t *cache_volume(json_t *spec)
{
    json_t *c = kube_json_get(spec, "model", "cache");
    if (!kube_json_get(spec, "model", "uri") || json_object_get(c, "hostPath"))
        return NULL;
    if (json_object_get(c, "pvc"))
        return json_pack("{s:s,s:{s:O}}", "name", "model-cache", "persistentVolumeClaim", "claimName",
                         kube_json_get(json_object_get(c, "pvc"), "claimName", NULL));
    json_t *limit = kube_json_get(c, "emptyDir", "sizeLimit");
    return limit ? json_pack("{s:s,s:{s:O}}", "name", "model-cache", "emptyDir", "sizeLimit", limit)
                 : json_pack("{s:s,s:{}}", "name", "model-cache", "emptyDir");
}

/* Whether the node path p is root or under it, read as the kernel would
 * ("//" and "/./" as "/"); a ".." segment counts as under (the API server
 * refuses it in a hostPath anyway). */
static int under_root(const char *p, const char *root)
{
    char n[1024];
    size_t k = 0;
    for (const char *s = p; *s && k + 2 < sizeof n;) {
        size_t seg = strcspn(s, "/");
        if (seg == 2 && s[0] == '.' && s[1] == '.')
            return 1;
        if (seg && !(seg == 1 && s[0] == '.') && k + seg + 2 < sizeof n) {
            n[k++] = '/';
            memcpy(n + k, s, seg);
            k += seg;
        }
        s += seg + (s[seg] == '/');
    }
    n[k] = 0;
    size_t rn = strlen(root);
    return !strncmp(n, root, rn) && (n[rn] == 0 || n[rn] == '/');
}

/* spec.model.cache.hostPath: whether the spec asks for the node folder;
 * -1 (msg says why) when it cannot have it: none offered, no namespace to
 * name the folder by, or a model volume reaching into the folders. */
static int host_cache_wanted(json_t *d, const desired_site *site, char *msg, size_t mn)
{
    json_t *spec = json_object_get(d, "spec");
    const char *root = site ? site->cache_host_root : NULL;
    const char *mv = json_string_value(kube_json_get(spec, "model", "volume", "hostPath", "path"));
    if (mv && root && under_root(mv, root)) {
        snprintf(msg, mn, "spec.model.volume.hostPath.path: %.200s reaches into the operator's node cache folder %s", mv,
                 root);
        return -1;
    }
    if (!kube_json_get(spec, "model", "uri") || !kube_json_get(spec, "model", "cache", "hostPath"))
        return 0;
    if (!root || !site->cache_owner_image) {
        snprintf(msg, mn, "spec.model.cache.hostPath: this operator offers no node folder for caches (its chart "
                          "value modelCache.hostRoot, llm-controller --model-cache-host-root, is unset): use pvc or emptyDir");
        return -1;
    }
    if (!json_string_value(kube_json_get(d, "metadata", "namespace"))) {
        snprintf(msg, mn, "spec.model.cache.hostPath: the object has no namespace to name the node folder by");
        return -1;
    }
    return 1;
}

/* The node folder ROOT/NAMESPACE (shared by the namespace's pods on that
 * node; ROOT is the platform team's, --model-cache-host-root) and the init
 * container that gives it to the pods' user: the kubelet makes a missing
 * folder root's, mode 0755, which uid 65532 cannot write. The container is
 * root with CAP_CHOWN alone, runs the operator's image (never the spec's:
 * a tenant's chown as root could leave a set-uid file on the node) and
 * changes the folder itself (nothing in it, no link followed). Put in
 * after spec.podTemplate is merged, over anything of the same names, so
 * no spec points the folder elsewhere or changes what runs as root. */
static int host_cache_pin(json_t *pod, json_t *d, const desired_site *site)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", site->cache_host_root,
             json_string_value(kube_json_get(d, "metadata", "namespace")));
    json_t *vol = json_pack("{s:s,s:{s:s,s:s}}", "name", "model-cache", "hostPath", "path", path, "type",
                            "DirectoryOrCreate");
    json_t *init = json_pack("{s:s,s:s,s:[s,s,s,s],s:[{s:s,s:s}],s:{s:b,s:i,s:b,s:b,s:{s:[s],s:[s]}}}", "name",
                             "cache-owner", "image", site->cache_owner_image, "command", "chown", "-h", "65532:65532",
                             DESIRED_CACHE_DIR, "volumeMounts", "name", "model-cache", "mountPath", DESIRED_CACHE_DIR,
                             "securityContext", "runAsNonRoot", 0, "runAsUser", 0, "allowPrivilegeEscalation", 0,
                             "readOnlyRootFilesystem", 1, "capabilities", "drop", "ALL", "add", "CHOWN");
    static const char *const lists[] = {"volumes", "initContainers"};
    json_t *ours[] = {vol, init};
    int bad = !vol || !init;
    for (int i = 0; i < 2 && !bad; i++) {
        json_t *l = json_object_get(pod, lists[i]);
        if (!json_is_array(l) && json_object_set_new(pod, lists[i], l = json_array()))
            bad = 1;
        for (size_t k = json_array_size(l); k-- > 0;) /* a same-named item of the spec's goes */
            if (json_equal(json_object_get(json_array_get(l, k), "name"), json_object_get(ours[i], "name")))
                json_array_remove(l, k);
        bad |= !l || json_array_insert(l, 0, ours[i]); /* the init container first: before any of the spec's */
    }
    json_decref(vol);
    json_decref(init);
    return bad ? -1 : 0;
}

/* The model volume: pvc, hostPath or image; none when not given. */
static json_t *model_volume(json_t *spec)
{
    json_t *v = kube_json_get(spec, "model", "volume");
    if (json_object_get(v, "pvc"))
        return json_pack("{s:s,s:{s:O,s:b}}", "name", "model", "persistentVolumeClaim", "claimName",
                         kube_json_get(json_object_get(v, "pvc"), "claimName", NULL), "readOnly", 1);
    if (json_object_get(v, "hostPath"))
        return json_pack("{s:s,s:{s:O,s:s}}", "name", "model", "hostPath", "path",
                         kube_json_get(json_object_get(v, "hostPath"), "path", NULL), "type", "Directory");
    if (json_object_get(v, "image"))
        return json_pack("{s:s,s:O}", "name", "model", "image", json_object_get(v, "image"));
    return NULL;
}

long long desired_server_port(json_t *llmd)
{
    return spec_int(json_object_get(llmd, "spec"), "server", "port", 8080);
}

long long desired_health_port(json_t *llmd)
{
    long long p = desired_server_port(llmd);
    return p < 65535 ? p + 1 : p - 1;
}

static json_t *probe(const char *path, long long port, long long period, long long failures)
{
    return json_pack("{s:{s:s,s:I},s:I,s:I,s:I}", "httpGet", "path", path, "port", (json_int_t)port, "periodSeconds",
                     (json_int_t)period, "failureThreshold", (json_int_t)failures, "timeoutSeconds", (json_int_t)2);
}

/* 1 when the container's limits ask for an NVIDIA GPU of any kind: whole
 * (nvidia.com/gpu), shared (nvidia.com/gpu.shared, time-slicing's
 * renamed resource) or a MIG slice (nvidia.com/mig-1g.10gb), nonzero. */
static int asks_gpu(json_t *spec)
{
    json_t *limits = kube_json_get(json_object_get(spec, "resources"), "limits", NULL), *v;
    const char *key;
    json_object_foreach(limits, key, v) {
        int gpu = !strncmp(key, "nvidia.com/gpu", 14) || !strncmp(key, "nvidia.com/mig-", 15);
        int zero = (json_is_integer(v) && json_integer_value(v) == 0) || (json_is_string(v) && !strcmp(json_string_value(v), "0"));
        if (gpu && !zero)
            return 1;
    }
    return 0;
}

/* spec.engine.backend, auto resolved: cuda when the container asks for
 * GPUs (asks_gpu, or tensor parallelism, which asks for them in
 * resources() below), else cpu. */
const char *desired_backend(json_t *spec)
{
    const char *be = json_string_value(kube_json_get(spec, "engine", "backend"));
    if (be && strcmp(be, "auto"))
        return be;
    return asks_gpu(spec) || spec_int(spec, "engine", "tensorParallelSize", 1) > 1 ? "cuda" : "cpu";
}

/* Container resources; a CUDA replica split over tensorParallelSize GPUs
 * asks for that many unless the spec names GPUs of its own (a CPU one
 * splits over thread groups: no GPU). */
static json_t *resources(json_t *spec)
{
    json_t *r = json_object_get(spec, "resources");
    r = r ? json_deep_copy(r) : json_object();
    long long tp = spec_int(spec, "engine", "tensorParallelSize", 1);
    if (r && tp > 1 && !strcmp(desired_backend(spec), "cuda") && !asks_gpu(spec)) {
        if (!json_object_get(r, "limits"))
            json_object_set_new(r, "limits", json_object());
        char n[24];
        snprintf(n, sizeof n, "%lld", tp);
        json_object_set_new(json_object_get(r, "limits"), "nvidia.com/gpu", json_string(n));
    }
    return r;
}

static json_t *container(json_t *d, const char *admin_secret)
{
    json_t *spec = json_object_get(d, "spec");
    long long port = spec_int(spec, "server", "port", 8080);
    json_t *args = json_pack("[s,s,s,s]", "--config", DESIRED_CONFIG_DIR "/config.yaml", "--host", "$(POD_IP)");
    if (admin_secret) { /* the controller's key to the pods' /admin/canary, a mounted Secret */
        json_array_append_new(args, json_string("--admin_token_file"));
        json_array_append_new(args, json_string(DESIRED_ADMIN_DIR "/" DESIRED_ADMIN_KEY));
    }
    json_t *extra = kube_json_get(spec, "server", "extraArgs");
    if (json_is_array(extra))
        json_array_extend(args, extra);
    json_t *env = json_pack("[{s:s,s:{s:{s:s}}}]", "name", "POD_IP", "valueFrom", "fieldRef", "fieldPath", "status.podIP");
    json_t *secret = kube_json_get(spec, "server", "apiKeySecret");
    if (secret) {
        const char *key = json_string_value(json_object_get(secret, "key"));
        json_array_append_new(env, json_pack("{s:s,s:{s:{s:O,s:s}}}", "name", "LLM_SERVER_API_KEYS", "valueFrom",
                                             "secretKeyRef", "name", json_object_get(secret, "name"), "key",
                                             key ? key : "api-keys"));
    }
    source_env(spec, env);
    json_t *mounts = json_pack("[{s:s,s:s,s:b}]", "name", "config", "mountPath", DESIRED_CONFIG_DIR, "readOnly", 1);
    if (kube_json_get(spec, "model", "uri"))
        json_array_append_new(mounts, json_pack("{s:s,s:s}", "name", "model-cache", "mountPath", DESIRED_CACHE_DIR));
    const char *mp = json_string_value(kube_json_get(kube_json_get(spec, "model", "volume"), "mountPath", NULL));
    if (kube_json_get(spec, "model", "volume"))
        json_array_append_new(mounts, json_pack("{s:s,s:s,s:b}", "name", "model", "mountPath", mp ? mp : "/models",
                                                "readOnly", 1));
    if (admin_secret)
        json_array_append_new(mounts, json_pack("{s:s,s:s,s:b}", "name", "admin", "mountPath", DESIRED_ADMIN_DIR, "readOnly", 1));
    if (kube_json_get(spec, "chatTemplate", "configMap"))
        json_array_append_new(mounts, json_pack("{s:s,s:s,s:b}", "name", DESIRED_TEMPLATE_VOLUME, "mountPath", DESIRED_TEMPLATE_DIR,
                                                "readOnly", 1));
    long long startup = spec_int(spec, "probes", "startupTimeoutSeconds", 600), hp = desired_health_port(d);
    return json_pack("{s:s,s:O,s:o,s:o,s:[{s:s,s:I},{s:s,s:I}],s:o,s:o,s:o,s:o,s:o,s:{s:b,s:b,s:{s:[s]}}}", "name",
                     "llm-server", "image", json_object_get(spec, "image"), "args", args, "env", env, "ports", "name",
                     "http", "containerPort", (json_int_t)port, "name", "health", "containerPort", (json_int_t)hp,
                     "startupProbe", probe("/startupz", hp, 2, startup / 2 + 1), "readinessProbe", probe("/readyz", hp, 2, 3),
                     "livenessProbe", probe("/livez", hp, 10, 3),
                     "resources", resources(spec), "volumeMounts", mounts, "securityContext",
                     "allowPrivilegeEscalation", 0, "readOnlyRootFilesystem", 1, "capabilities", "drop", "ALL");
}

/* Kubernetes refuses maxSurge 0 with maxUnavailable 0: replacing in place
 * means taking one pod down at a time. */
static json_t *rolling(json_t *spec)
{
    json_t *ro = json_object_get(spec, "rollout");
    json_t *surge = json_object_get(ro, "maxSurge"), *unavail = json_object_get(ro, "maxUnavailable");
    int surge0 = surge && ((json_is_integer(surge) && json_integer_value(surge) == 0) ||
                           (json_is_string(surge) && !strcmp(json_string_value(surge), "0%")));
    int unavail0 = !unavail || (json_is_integer(unavail) && json_integer_value(unavail) == 0) ||
                   (json_is_string(unavail) && !strcmp(json_string_value(unavail), "0%"));
    return json_pack("{s:o,s:o}", "maxSurge", surge ? json_incref(surge) : json_integer(1), "maxUnavailable",
                     surge0 && unavail0 ? json_integer(1) : unavail ? json_incref(unavail) : json_integer(0));
}

/* spec.podTemplate over the generated template, as kubectl's strategic
 * merge patch treats a PodTemplateSpec: objects merge by key; the lists
 * Kubernetes merges do so by their merge key - containers,
 * initContainers, ephemeralContainers, volumes, imagePullSecrets and a
 * container's env by name, a container's volumeMounts by mountPath and
 * ports by containerPort (an item without its key is appended); every
 * other list (args, command, tolerations, envFrom, ...) is replaced whole. */
static const char *merge_key(const char *list)
{
    static const struct { const char *list, *key; } keys[] = {
        {"containers", "name"}, {"initContainers", "name"}, {"ephemeralContainers", "name"}, {"volumes", "name"},
        {"imagePullSecrets", "name"}, {"env", "name"}, {"volumeMounts", "mountPath"}, {"ports", "containerPort"}};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(list, keys[i].list))
            return keys[i].key;
    return NULL;
}

/* The item of list whose key equals item's, or NULL. */
static json_t *same_key(json_t *list, json_t *item, const char *key)
{
    json_t *want = json_object_get(item, key), *cur;
    size_t j;
    json_array_foreach(list, j, cur) {
        json_t *have = json_object_get(cur, key);
        if (want && have && json_equal(want, have))
            return cur;
    }
    return NULL;
}

static void merge(json_t *dst, json_t *src)
{
    const char *k;
    json_t *v;
    json_object_foreach(src, k, v) {
        json_t *cur = json_object_get(dst, k);
        const char *key = merge_key(k);
        if (json_is_object(cur) && json_is_object(v)) {
            merge(cur, v);
        } else if (json_is_array(cur) && json_is_array(v) && key) {
            size_t i;
            json_t *item;
            json_array_foreach(v, i, item) {
                json_t *match = json_is_object(item) ? same_key(cur, item, key) : NULL;
                if (match)
                    merge(match, item);
                else
                    json_array_append(cur, item);
            }
        } else {
            json_object_set(dst, k, v);
        }
    }
}

json_t *desired_deployment(json_t *d, const char *config_hash, const char *admin_secret, const desired_site *site,
                           char *msg, size_t mn)
{
    json_t *spec = json_object_get(d, "spec");
    const char *name = name_of(d);
    int host_cache = host_cache_wanted(d, site, msg, mn);
    if (host_cache < 0)
        return NULL;
    char cmname[300];
    snprintf(cmname, sizeof cmname, "%s-config", name);
    long long grace = spec_int(spec, "probes", "shutdownDelaySeconds", 5) + spec_int(spec, "probes", "drainSeconds", 30) + 10;
    json_t *volumes = json_pack("[{s:s,s:{s:s}}]", "name", "config", "configMap", "name", cmname);
    json_t *vol = model_volume(spec);
    if (vol)
        json_array_append_new(volumes, vol);
    if ((vol = cache_volume(spec)))
        json_array_append_new(volumes, vol);
    if (admin_secret) /* 0440 with fsGroup: the server's user reads it, nobody else's */
        json_array_append_new(volumes, json_pack("{s:s,s:{s:s,s:i}}", "name", "admin", "secret", "secretName",
                                                 admin_secret, "defaultMode", 0440));
    json_t *tcm = kube_json_get(spec, "chatTemplate", "configMap");
    const char *tkey = json_string_value(kube_json_get(spec, "chatTemplate", "key"));
    if (tcm) /* only the template's key: the ConfigMap's others stay out of the pod */
        json_array_append_new(volumes, json_pack("{s:s,s:{s:O,s:[{s:s,s:s}]}}", "name", DESIRED_TEMPLATE_VOLUME, "configMap", "name",
                                                 tcm, "items", "key", tkey ? tkey : DESIRED_TEMPLATE_KEY, "path",
                                                 tkey ? tkey : DESIRED_TEMPLATE_KEY));
    json_t *ctr = container(d, admin_secret);
    if (spec_int(spec, "engine", "tensorParallelSize", 1) > 1 && ctr) {
        /* NCCL's peers on one node talk through /dev/shm, which a container gets at 64 MiB */
        json_array_append_new(volumes, json_pack("{s:s,s:{s:s}}", "name", "dshm", "emptyDir", "medium", "Memory"));
        json_array_append_new(json_object_get(ctr, "volumeMounts"), json_pack("{s:s,s:s}", "name", "dshm", "mountPath", "/dev/shm"));
    }
    /* Pod Security "restricted": non-root, the runtime's seccomp profile (and, in the container, no
     * privilege escalation, no capabilities) */
    json_t *pod = json_pack("{s:I,s:{s:b,s:I,s:I,s:{s:s}},s:[o],s:o,s:b}", "terminationGracePeriodSeconds", (json_int_t)grace,
                            "securityContext", "runAsNonRoot", 1, "runAsUser", (json_int_t)65532, "fsGroup",
                            (json_int_t)65532, "seccompProfile", "type", "RuntimeDefault", "containers", ctr, "volumes",
                            volumes, "automountServiceAccountToken", 0);
    static const char *const copied[] = {"nodeSelector", "tolerations", "affinity", "priorityClassName"};
    for (size_t i = 0; pod && i < sizeof copied / sizeof *copied; i++)
        if (json_object_get(spec, copied[i]))
            json_object_set(pod, copied[i], json_object_get(spec, copied[i]));
    json_t *tmpl = json_pack("{s:{s:o,s:{s:s}},s:o}", "metadata", "labels", labels(name), "annotations",
                             DESIRED_CONFIG_HASH, config_hash, "spec", pod);
    json_t *over = json_object_get(spec, "podTemplate");
    if (tmpl && json_is_object(over)) {
        merge(tmpl, over);
        json_t *lab = kube_json_get(tmpl, "metadata", "labels"), *ours = labels(name);
        if (json_is_object(lab)) /* the spec's labels merge; the selector's stay ours */
            json_object_update(lab, ours);
        else
            json_object_set(json_object_get(tmpl, "metadata"), "labels", ours);
        json_decref(ours);
        json_object_set_new(json_object_get(json_object_get(tmpl, "metadata"), "annotations"), DESIRED_CONFIG_HASH,
                            json_string(config_hash));
    }
    if (tmpl && host_cache && host_cache_pin(json_object_get(tmpl, "spec"), d, site)) {
        json_decref(tmpl);
        tmpl = NULL;
    }
    json_t *out = json_pack("{s:s,s:s,s:o,s:{s:I,s:{s:{s:s,s:s}},s:{s:s,s:o},s:o}}", "apiVersion", "apps/v1", "kind",
                            "Deployment", "metadata", meta(d, name), "spec", "replicas",
                            (json_int_t)spec_int(d, "spec", "replicas", 1), "selector", "matchLabels", DESIRED_INSTANCE,
                            name, DESIRED_MANAGED_BY, DESIRED_CONTROLLER, "strategy", "type", "RollingUpdate", "rollingUpdate",
                            rolling(spec), "template", tmpl);
    if (!out)
        snprintf(msg, mn, "cannot build the Deployment from the spec");
    return out;
}

int desired_canary_enabled(json_t *d)
{
    json_t *cn = json_object_get(json_object_get(d, "spec"), "canary");
    return cn && !json_is_null(cn);
}

int desired_router_enabled(json_t *d)
{
    return desired_canary_enabled(d) || /* the split between revisions happens in the router */
           json_is_true(json_object_get(json_object_get(json_object_get(d, "spec"), "router"), "enabled"));
}

/* A Service named svc selecting the pods of instance inst. */
static json_t *service_for(json_t *d, const char *svc, const char *inst, json_int_t port, json_int_t target)
{
    return json_pack("{s:s,s:s,s:o,s:{s:{s:s,s:s},s:[{s:s,s:I,s:I}]}}", "apiVersion", "v1", "kind", "Service",
                     "metadata", meta(d, svc), "spec", "selector", DESIRED_INSTANCE, inst, DESIRED_MANAGED_BY, DESIRED_CONTROLLER,
                     "ports", "name", "http", "port", port, "targetPort", target);
}

json_t *desired_service(json_t *d)
{
    const char *name = name_of(d);
    json_int_t port = spec_int(json_object_get(d, "spec"), "server", "port", 8080);
    if (!desired_router_enabled(d))
        return service_for(d, name, name, port, port);
    char inst[300];
    snprintf(inst, sizeof inst, "%s-router", name);
    return service_for(d, name, inst, port, DESIRED_ROUTER_PORT); /* clients reach the router */
}

json_t *desired_backend_service(json_t *d)
{
    char svc[300];
    snprintf(svc, sizeof svc, "%s-backends", name_of(d));
    json_int_t port = spec_int(json_object_get(d, "spec"), "server", "port", 8080);
    return service_for(d, svc, name_of(d), port, port);
}

/* The router's identity: a ServiceAccount allowed to read EndpointSlices
 * in this namespace (its Role and RoleBinding). which: 0, 1, 2. */
json_t *desired_router_rbac(json_t *d, int which)
{
    char n[300];
    snprintf(n, sizeof n, "%s-router", name_of(d));
    if (which == 0)
        return json_pack("{s:s,s:s,s:o}", "apiVersion", "v1", "kind", "ServiceAccount", "metadata", meta(d, n));
    if (which == 1) {
        json_t *role = json_pack("{s:s,s:s,s:o,s:[{s:[s],s:[s],s:[s,s,s]}]}", "apiVersion", "rbac.authorization.k8s.io/v1",
                                 "kind", "Role", "metadata", meta(d, n), "rules", "apiGroups", "discovery.k8s.io",
                                 "resources", "endpointslices", "verbs", "get", "list", "watch");
        if (role && desired_canary_enabled(d)) /* the canary weight's ConfigMap */
            json_array_append_new(json_object_get(role, "rules"),
                                  json_pack("{s:[s],s:[s],s:[s,s,s]}", "apiGroups", "", "resources", "configmaps",
                                            "verbs", "get", "list", "watch"));
        return role;
    }
    return json_pack("{s:s,s:s,s:o,s:{s:s,s:s,s:s},s:[{s:s,s:s,s:O}]}", "apiVersion", "rbac.authorization.k8s.io/v1",
                     "kind", "RoleBinding", "metadata", meta(d, n), "roleRef", "apiGroup", "rbac.authorization.k8s.io",
                     "kind", "Role", "name", n, "subjects", "kind", "ServiceAccount", "name", n, "namespace",
                     kube_json_get(json_object_get(d, "metadata"), "namespace", NULL));
}

/* Scheduling of router pods (instance inst) from sched (spec.router, an LLMGateway's spec):
 * its nodeSelector, tolerations, affinity, priorityClassName and
 * topologySpreadConstraints; absent those, a preferred anti-affinity
 * across nodes and a soft spread across zones, so that one node (or zone)
 * lost does not take every router with it, while a one-node cluster still
 * runs them all. 0, or -1 without memory. */
int desired_spread(json_t *pod, json_t *sched, const char *inst)
{
    static const char *const copied[] = {"nodeSelector", "tolerations", "affinity", "priorityClassName",
                                         "topologySpreadConstraints"};
    int bad = 0;
    for (size_t i = 0; i < sizeof copied / sizeof *copied; i++)
        if (json_object_get(sched, copied[i]))
            bad |= json_object_set(pod, copied[i], json_object_get(sched, copied[i]));
    if (!json_object_get(pod, "affinity"))
        bad |= json_object_set_new(pod, "affinity",
                                   json_pack("{s:{s:[{s:i,s:{s:s,s:{s:{s:s}}}}]}}", "podAntiAffinity",
                                             "preferredDuringSchedulingIgnoredDuringExecution", "weight", 100,
                                             "podAffinityTerm", "topologyKey", "kubernetes.io/hostname", "labelSelector",
                                             "matchLabels", DESIRED_INSTANCE, inst));
    if (!json_object_get(pod, "topologySpreadConstraints"))
        bad |= json_object_set_new(pod, "topologySpreadConstraints",
                                   json_pack("[{s:i,s:s,s:s,s:{s:{s:s}}}]", "maxSkew", 1, "topologyKey",
                                             "topology.kubernetes.io/zone", "whenUnsatisfiable", "ScheduleAnyway",
                                             "labelSelector", "matchLabels", DESIRED_INSTANCE, inst));
    return bad ? -1 : 0;
}

int desired_trace_args(json_t *spec, json_t *args)
{
    const char *url = json_string_value(kube_json_get(spec, "tracing", "endpoint"));
    char r[32];
    snprintf(r, sizeof r, "%g", trace_ratio(spec));
    const char *a[] = {"--otlp-endpoint", url, "--trace-sample-ratio", r};
    return url ? desired_append_args(args, a, 4) : 0;
}

int desired_append_args(json_t *args, const char *const *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (json_array_append_new(args, json_string(a[i])))
            return -1;
    return 0;
}

/* llm-router pods in front of the llm-server pods: they follow the
 * NAME-backends Service's EndpointSlices. */
json_t *desired_router(json_t *d)
{
    json_t *spec = json_object_get(d, "spec"), *rt = json_object_get(spec, "router");
    const char *name = name_of(d), *ns = json_string_value(kube_json_get(json_object_get(d, "metadata"), "namespace", NULL));
    const char *image = json_string_value(json_object_get(rt, "image")), *policy = json_string_value(json_object_get(rt, "policy"));
    char n[300], svc[600], port[16], hold[32];
    snprintf(n, sizeof n, "%s-router", name);
    snprintf(svc, sizeof svc, "%s/%s-backends", ns ? ns : "default", name);
    snprintf(port, sizeof port, "%d", DESIRED_ROUTER_PORT);
    snprintf(hold, sizeof hold, "%lld", spec_int(spec, "router", "holdSeconds", 0));
    json_t *lab = json_pack("{s:s,s:s,s:s}", "app.kubernetes.io/name", "llm-router", DESIRED_INSTANCE, n, DESIRED_MANAGED_BY,
                            DESIRED_CONTROLLER);
    /* SIGTERM: not ready, still routing while endpoints drop the pod, then streams drain (as the servers do) */
    long long delay = spec_int(spec, "probes", "shutdownDelaySeconds", 5), drain = spec_int(spec, "probes", "drainSeconds", 30);
    char sdelay[24], sdrain[24];
    snprintf(sdelay, sizeof sdelay, "%lld", delay);
    snprintf(sdrain, sizeof sdrain, "%lld", drain);
    json_t *live = json_pack("{s:{s:s,s:i},s:i}", "httpGet", "path", "/healthz", "port", DESIRED_ROUTER_PORT, "periodSeconds", 5);
    json_t *ready = json_pack("{s:{s:s,s:i},s:i,s:i}", "httpGet", "path", "/readyz", "port", DESIRED_ROUTER_PORT,
                              "periodSeconds", 2, "failureThreshold", 2);
    /* --host $(POD_IP), as the servers: the pod's address only (and pods that share a network, as kubesim's, coexist) */
    json_t *ctr = json_pack("{s:s,s:s,s:[s,s,s,s,s,s,s,s,s,s,s,s,s,s],s:[{s:s,s:{s:{s:s}}}],s:[{s:s,s:i}],s:o,s:o,"
                            "s:{s:b,s:b,s:{s:[s]}}}", "name",
                            "llm-router", "image", image ? image : DESIRED_ROUTER_IMAGE, "args", "--host", "$(POD_IP)", "--port", port,
                            "--service", svc, "--policy", policy ? policy : "cache-aware", "--hold-seconds", hold,
                            "--shutdown-delay-s", sdelay, "--drain-timeout-s", sdrain, "env", "name", "POD_IP",
                            "valueFrom", "fieldRef", "fieldPath", "status.podIP", "ports", "name", "http",
                            "containerPort", DESIRED_ROUTER_PORT, "livenessProbe", live, "readinessProbe", ready,
                            "securityContext", "allowPrivilegeEscalation", 0, "readOnlyRootFilesystem", 1, "capabilities",
                            "drop", "ALL");
    json_t *res = json_object_get(rt, "resources"); /* a proxy: small, but never unbounded */
    json_object_set_new(ctr, "resources", res ? json_deep_copy(res)
                                              : json_pack("{s:{s:s,s:s},s:{s:s}}", "requests", "cpu", "100m", "memory",
                                                          "64Mi", "limits", "memory", "256Mi"));
    json_t *args = json_object_get(ctr, "args");
    char mport[24]; /* the load poll reads the pods' health listener, which no API flood can fill */
    snprintf(mport, sizeof mport, "%lld", desired_health_port(d));
    json_array_append_new(args, json_string("--metrics-port"));
    json_array_append_new(args, json_string(mport));
    if (ctr && json_is_true(kube_json_get(rt, "affinityUser", NULL)))
        json_array_append_new(args, json_string("--affinity-user"));
    if (ctr && desired_trace_args(spec, args)) { /* the router's span between the client's and the servers' */
        json_decref(ctr);
        ctr = NULL;
    }
    if (ctr && desired_canary_enabled(d)) {
        char csvc[700], wcm[600];
        snprintf(csvc, sizeof csvc, "%s/%s-canary-backends", ns ? ns : "default", name);
        snprintf(wcm, sizeof wcm, "%s/%s-router", ns ? ns : "default", name);
        json_array_append_new(args, json_string("--canary-service"));
        json_array_append_new(args, json_string(csvc));
        json_array_append_new(args, json_string("--weight-configmap"));
        json_array_append_new(args, json_string(wcm));
    }
    json_t *pod = json_pack("{s:s,s:I,s:{s:b,s:I,s:{s:s}},s:[o]}", "serviceAccountName", n,
                            "terminationGracePeriodSeconds", (json_int_t)(delay + drain + 10), "securityContext",
                            "runAsNonRoot", 1, "runAsUser", (json_int_t)65532, "seccompProfile", "type", "RuntimeDefault",
                            "containers", ctr);
    if (pod && desired_spread(pod, rt, n)) {
        json_decref(pod);
        pod = NULL;
    }
    return json_pack("{s:s,s:s,s:o,s:{s:I,s:{s:{s:s,s:s}},s:{s:{s:o},s:o}}}", "apiVersion", "apps/v1", "kind", "Deployment",
                     "metadata", meta(d, n), "spec", "replicas", (json_int_t)spec_int(spec, "router", "replicas", 2),
                     "selector", "matchLabels", DESIRED_INSTANCE, n, DESIRED_MANAGED_BY, DESIRED_CONTROLLER, "template",
                     "metadata", "labels", lab, "spec", pod);
}

json_t *desired_router_weight(json_t *d, int weight)
{
    char n[300], w[16];
    snprintf(n, sizeof n, "%s-router", name_of(d));
    snprintf(w, sizeof w, "%d", weight);
    return json_pack("{s:s,s:s,s:o,s:{s:s}}", "apiVersion", "v1", "kind", "ConfigMap", "metadata", meta(d, n), "data",
                     "canaryWeight", w);
}

json_t *desired_canary_configmap(json_t *d, json_t *cm)
{
    char n[300];
    snprintf(n, sizeof n, "%s-canary-config", name_of(d));
    json_t *out = json_deep_copy(cm);
    if (out)
        json_object_set_new(json_object_get(out, "metadata"), "name", json_string(n));
    return out;
}

json_t *desired_canary_service(json_t *d)
{
    char svc[300], inst[300];
    snprintf(svc, sizeof svc, "%s-canary-backends", name_of(d));
    snprintf(inst, sizeof inst, "%s-canary", name_of(d));
    json_int_t port = spec_int(json_object_get(d, "spec"), "server", "port", 8080);
    return service_for(d, svc, inst, port, port);
}

json_t *desired_canary_deployment(json_t *d, json_t *dep, int replicas)
{
    char n[300], cm[300];
    snprintf(n, sizeof n, "%s-canary", name_of(d));
    snprintf(cm, sizeof cm, "%s-canary-config", name_of(d));
    json_t *out = json_deep_copy(dep), *spec = json_object_get(out, "spec");
    json_t *tmeta = kube_json_get(json_object_get(spec, "template"), "metadata", NULL);
    if (!out || !tmeta)
        return json_decref(out), NULL;
    json_object_set_new(json_object_get(out, "metadata"), "name", json_string(n));
    json_object_set_new(spec, "replicas", json_integer(replicas));
    json_object_set_new(kube_json_get(spec, "selector", "matchLabels"), DESIRED_INSTANCE, json_string(n));
    json_object_set_new(json_object_get(tmeta, "labels"), DESIRED_INSTANCE, json_string(n));
    json_t *vols = kube_json_get(kube_json_get(json_object_get(spec, "template"), "spec", NULL), "volumes", NULL);
    for (size_t i = 0; i < json_array_size(vols); i++) { /* its own copy of the new configuration */
        json_t *v = json_array_get(vols, i);
        if (!strcmp(json_string_value(json_object_get(v, "name")) ?: "", "config"))
            json_object_set_new(json_object_get(v, "configMap"), "name", json_string(cm));
    }
    return out;
}

/* At most one pod of instance name down at a time in voluntary
 * disruptions (node drains), so a drain never takes the whole service away. */
static json_t *pdb_for(json_t *d, const char *name)
{
    return json_pack("{s:s,s:s,s:o,s:{s:i,s:{s:{s:s,s:s}}}}", "apiVersion", "policy/v1", "kind", "PodDisruptionBudget",
                     "metadata", meta(d, name), "spec", "maxUnavailable", 1, "selector", "matchLabels", DESIRED_INSTANCE,
                     name, DESIRED_MANAGED_BY, DESIRED_CONTROLLER);
}

json_t *desired_pdb(json_t *d)
{
    return pdb_for(d, name_of(d));
}

json_t *desired_router_pdb(json_t *d)
{
    char n[300];
    snprintf(n, sizeof n, "%s-router", name_of(d));
    return pdb_for(d, n);
}
