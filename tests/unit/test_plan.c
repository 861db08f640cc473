/* test_plan.c - the planner (plan.h) held to tables of cases: an
 * LLMDeployment, its Deployments as observed and the pods' signals in; the
 * steps, events, pod call, replicas, status and next reads out. And what
 * makes it a planner: the same inputs give the same plan, and the inputs
 * are left as they were. */
#include "testutil.h"

#include <jansson.h>

#include "desired.h"
#include "kube_json.h"
#include "kube_status.h"
#include "plan.h"

#define NOW 1700000000.0

static json_t *merge(json_t *into, json_t *from) /* from's members over into's, recursively; consumes from */
{
    const char *k;
    json_t *v;
    json_object_foreach(from, k, v) {
        json_t *old = json_object_get(into, k);
        if (json_is_object(old) && json_is_object(v))
            merge(old, json_incref(v));
        else
            json_object_set(into, k, v);
    }
    json_decref(from);
    return into;
}

static json_t *parse(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);
    if (!j)
        fail_msg("bad test JSON (%s): %s", e.text, text);
    return j;
}

/* LLMDeployment m in ns with spec/status merged over a minimal one. */
static json_t *llmd(const char *spec, const char *status)
{
    json_t *d = parse("{\"apiVersion\":\"llmk8s.io/v1alpha1\",\"kind\":\"LLMDeployment\","
                      "\"metadata\":{\"name\":\"m\",\"namespace\":\"ns\",\"uid\":\"u-1\",\"generation\":1,"
                      "\"resourceVersion\":\"7\"},"
                      "\"spec\":{\"model\":{\"path\":\"/models/a.gguf\",\"volume\":{\"pvc\":{\"claimName\":\"models\"}}},"
                      "\"image\":\"llm-server:1\",\"replicas\":2}}");
    if (spec)
        merge(json_object_get(d, "spec"), parse(spec));
    if (status)
        json_object_set_new(d, "status", parse(status));
    return d;
}

typedef struct result {
    llm_status st;
    char err[512];
    plan p;
    json_t *status;
    char steps[4096];   /* "apply configmaps m-config; remove deployments m-router; ..." */
    char events[2048];  /* reasons, "; "-separated */
} result;

static void describe(result *r)
{
    size_t n = 0;
    for (size_t i = 0; i < json_array_size(r->p.steps); i++) {
        json_t *s = json_array_get(r->p.steps, i);
        const char *op = json_string_value(json_object_get(s, "op"));
        const char *coll = json_string_value(json_object_get(s, "collection"));
        const char *path = json_string_value(json_object_get(s, "path"));
        const char *name = json_string_value(json_object_get(json_object_get(json_object_get(s, "object"), "metadata"), "name"));
        const char *where = coll ? strrchr(coll, '/') + 1 : path ? path : "";
        char what[512];
        if (path) { /* .../plural/name */
            const char *slash = strrchr(path, '/');
            const char *prev = slash;
            while (prev > path && prev[-1] != '/') prev--;
            snprintf(what, sizeof what, "%.*s %s", (int)(slash - prev), prev, slash + 1);
        } else {
            snprintf(what, sizeof what, "%s%s%s", where, name ? " " : "", name ? name : "");
        }
        n += (size_t)snprintf(r->steps + n, sizeof r->steps - n, "%s%s %s", n ? "; " : "", op, what);
    }
    n = 0;
    for (size_t i = 0; i < json_array_size(r->p.events); i++)
        n += (size_t)snprintf(r->events + n, sizeof r->events - n, "%s%s", n ? "; " : "",
                              json_string_value(json_object_get(json_array_get(r->p.events, i), "reason")));
}

static void run(const plan_input *in, result *r)
{
    memset(r, 0, sizeof *r);
    llm_error err = {0};
    r->st = plan_children(in, &r->p, &err);
    snprintf(r->err, sizeof r->err, "%s", err.msg);
    if (r->st)
        print_message("plan: %d %s\n", r->st, err.msg);
    if (!r->st) {
        json_t *stable = NULL;
        for (size_t i = 0; i < json_array_size(r->p.steps); i++)
            if (json_is_true(json_object_get(json_array_get(r->p.steps, i), "stable")))
                stable = json_object_get(json_array_get(r->p.steps, i), "object");
        json_t *dep = in->stable ? in->stable : stable; /* as the apply left it: what was there, or new */
        r->status = plan_status(in, &r->p, dep);
        assert_non_null(r->status);
    }
    describe(r);
}

static void done(result *r)
{
    plan_free(&r->p);
    json_decref(r->status);
}

/* The planned object of a step whose description contains what. */
static json_t *object_of(result *r, const char *plural, const char *name)
{
    for (size_t i = 0; i < json_array_size(r->p.steps); i++) {
        json_t *s = json_array_get(r->p.steps, i), *o = json_object_get(s, "object");
        const char *c = json_string_value(json_object_get(s, "collection"));
        const char *n = json_string_value(json_object_get(json_object_get(o, "metadata"), "name"));
        if (c && n && !strcmp(strrchr(c, '/') + 1, plural) && !strcmp(n, name))
            return o;
    }
    return NULL;
}

/* The step of the Deployment NAME (flagged stable). */
static json_t *stable_step(result *r)
{
    json_t *found = NULL;
    for (size_t i = 0; i < json_array_size(r->p.steps); i++)
        if (json_is_true(json_object_get(json_array_get(r->p.steps, i), "stable"))) {
            assert_null(found); /* one */
            found = json_array_get(r->p.steps, i);
        }
    assert_non_null(found);
    return found;
}

static const char *cond_reason(json_t *status, const char *type)
{
    json_t *cs = json_object_get(status, "conditions");
    for (size_t i = 0; i < json_array_size(cs); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(cs, i), "type")), type))
            return json_string_value(json_object_get(json_array_get(cs, i), "reason"));
    return NULL;
}

static const char *phase(result *r)
{
    return json_string_value(json_object_get(r->status, "phase"));
}

static long long replicas_of(json_t *dep)
{
    return (long long)json_integer_value(json_object_get(json_object_get(dep, "spec"), "replicas"));
}

/* The Deployment NAME as the planner wants it for d, rolled out with
 * `ready` of its pods ready: what the cache holds at rest. */
static json_t *settled(json_t *d, int ready)
{
    plan_input in = {.llmd = d, .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    json_t *dep = json_deep_copy(object_of(&r, "deployments", "m"));
    done(&r);
    json_int_t want = (json_int_t)replicas_of(dep);
    json_object_set_new(json_object_get(dep, "metadata"), "generation", json_integer(1));
    json_object_set_new(dep, "status", json_pack("{s:I,s:I,s:I,s:i}", "replicas", want, "readyReplicas",
                                                 ready < 0 ? want : (json_int_t)ready, "updatedReplicas", want,
                                                 "observedGeneration", 1));
    return dep;
}

static podsig_reading reading(const char *metric)
{
    podsig_reading r = {.age_s = 0.5, .signal = -1};
    if (metric)
        snprintf(r.need.metric, sizeof r.need.metric, "%s", metric);
    return r;
}

/* ---- children ---------------------------------------------------------------------------- */

static void test_fresh_and_at_rest(void **st)
{
    (void)st;
    /* nothing there yet: every child in dependency order, the router's removal looked for */
    json_t *d = llmd(NULL, NULL);
    plan_input in = {.llmd = d, .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    assert_string_equal(r.steps, "apply configmaps m-config; apply deployments m; apply services m; "
                                 "apply poddisruptionbudgets m; remove horizontalpodautoscalers m; "
                                 "remove deployments m-router; remove poddisruptionbudgets m-router; "
                                 "remove rolebindings m-router; remove roles m-router; remove serviceaccounts m-router; "
                                 "remove services m-backends"); /* a router turned off leaves nothing (its identity too) */
    assert_string_equal(r.events, "");
    assert_string_equal(phase(&r), "Pending");
    assert_true(r.p.need.diag); /* why not ready: the pods are read */
    assert_true(r.p.requeue_s > 0 && r.p.requeue_s <= 5);
    done(&r);
    /* at rest: ready, its phase already said - no event, nothing to read, no requeue */
    json_t *dep = settled(d, -1);
    json_t *d2 = llmd(NULL, "{\"phase\":\"Ready\"}");
    plan_input rest = {.llmd = d2, .stable = dep, .now = NOW};
    run(&rest, &r);
    assert_string_equal(phase(&r), "Ready");
    assert_string_equal(r.events, "");
    assert_false(r.p.need.diag || r.p.need.metric[0] || r.p.need.canary || r.p.need.activity);
    assert_true(r.p.requeue_s == 0);
    assert_true(json_equal(object_of(&r, "deployments", "m"), json_object_get(json_array_get(r.p.steps, 1), "object")));
    done(&r);
    /* first time Ready: one event */
    plan_input first = {.llmd = d, .stable = dep, .now = NOW};
    run(&first, &r);
    assert_string_equal(r.events, "Ready");
    done(&r);
    json_decref(dep);
    json_decref(d);
    json_decref(d2);
}

static void test_router_and_hpa_steps(void **st)
{
    (void)st;
    json_t *d = llmd("{\"router\":{\"enabled\":true,\"image\":\"r:1\"},"
                     "\"autoscaling\":{\"enabled\":true,\"mode\":\"hpa\",\"minReplicas\":1,\"maxReplicas\":4}}", NULL);
    plan_input in = {.llmd = d, .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    assert_string_equal(r.steps, "apply configmaps m-config; apply deployments m; apply services m; "
                                 "apply poddisruptionbudgets m; apply horizontalpodautoscalers m; "
                                 "apply serviceaccounts m-router; apply roles m-router; apply rolebindings m-router; "
                                 "apply services m-backends; apply deployments m-router; "
                                 "apply poddisruptionbudgets m-router");
    assert_false(r.p.need.metric[0]); /* the HPA reads the signal, not us */
    /* maxScaleUpStep (4) pods per intervalSeconds (15): the HPA's scale-up policy, not dropped */
    json_t *up = kube_json_get(object_of(&r, "horizontalpodautoscalers", "m"), "spec", "behavior", "scaleUp", NULL);
    json_t *pol = json_array_get(json_object_get(up, "policies"), 0);
    assert_string_equal(json_string_value(json_object_get(pol, "type")), "Pods");
    assert_int_equal(json_integer_value(json_object_get(pol, "value")), 4);
    assert_int_equal(json_integer_value(json_object_get(pol, "periodSeconds")), 15);
    /* the routers: spread over nodes and zones by default (soft: a one-node cluster runs them all), one down at a
     * time in a drain */
    json_t *pod = kube_json_get(object_of(&r, "deployments", "m-router"), "spec", "template", "spec", NULL);
    json_t *anti = json_array_get(kube_json_get(pod, "affinity", "podAntiAffinity",
                                                "preferredDuringSchedulingIgnoredDuringExecution", NULL), 0);
    assert_string_equal(json_string_value(kube_json_get(anti, "podAffinityTerm", "topologyKey", NULL)),
                        "kubernetes.io/hostname");
    json_t *spread = json_array_get(json_object_get(pod, "topologySpreadConstraints"), 0);
    assert_string_equal(json_string_value(json_object_get(spread, "whenUnsatisfiable")), "ScheduleAnyway");
    assert_string_equal(json_string_value(kube_json_get(spread, "labelSelector", "matchLabels", DESIRED_INSTANCE, NULL)),
                        "m-router");
    assert_null(json_object_get(pod, "nodeSelector"));
    json_t *pdb = object_of(&r, "poddisruptionbudgets", "m-router");
    assert_int_equal(json_integer_value(kube_json_get(pdb, "spec", "maxUnavailable", NULL)), 1);
    assert_string_equal(json_string_value(kube_json_get(pdb, "spec", "selector", "matchLabels", DESIRED_INSTANCE, NULL)),
                        "m-router");
    done(&r);
    json_decref(d);
    /* the router's own scheduling fields replace the defaults; the servers' stay the servers' */
    d = llmd("{\"router\":{\"enabled\":true,\"nodeSelector\":{\"pool\":\"edge\"},\"affinity\":{},"
             "\"priorityClassName\":\"front\",\"topologySpreadConstraints\":[]},\"nodeSelector\":{\"pool\":\"gpu\"}}", NULL);
    in.llmd = d;
    run(&in, &r);
    pod = kube_json_get(object_of(&r, "deployments", "m-router"), "spec", "template", "spec", NULL);
    assert_string_equal(json_string_value(kube_json_get(pod, "nodeSelector", "pool", NULL)), "edge");
    assert_string_equal(json_string_value(json_object_get(pod, "priorityClassName")), "front");
    assert_int_equal(json_object_size(json_object_get(pod, "affinity")), 0);
    assert_int_equal(json_array_size(json_object_get(pod, "topologySpreadConstraints")), 0);
    assert_string_equal(json_string_value(kube_json_get(object_of(&r, "deployments", "m"), "spec", "template", "spec",
                                                        "nodeSelector", "pool", NULL)), "gpu");
    done(&r);
    json_decref(d);
}

/* spec.engine.backend auto and the GPUs asked: any NVIDIA GPU resource
 * (whole, shared, a MIG slice) means CUDA; tensor parallelism asks for
 * GPUs only on CUDA (a CPU replica splits over thread groups). */
static void test_backend_and_gpus(void **st)
{
    (void)st;
    static const struct {
        const char *spec, *backend, *gpus; /* the config's backend line ("": none, cpu); the container's GPU limit */
    } cases[] = {
        {"{}", "", NULL},
        {"{\"resources\":{\"limits\":{\"nvidia.com/gpu\":1}}}", "cuda", "1"},
        {"{\"resources\":{\"limits\":{\"nvidia.com/gpu\":\"0\"}}}", "", "0"},
        {"{\"resources\":{\"limits\":{\"nvidia.com/mig-1g.10gb\":1}}}", "cuda", NULL},
        {"{\"resources\":{\"limits\":{\"nvidia.com/gpu.shared\":1}}}", "cuda", NULL},
        {"{\"engine\":{\"tensorParallelSize\":2}}", "cuda", "2"},
        {"{\"engine\":{\"tensorParallelSize\":2,\"backend\":\"cpu\"}}", "", NULL},
        {"{\"engine\":{\"tensorParallelSize\":2},\"resources\":{\"limits\":{\"nvidia.com/mig-3g.40gb\":2}}}", "cuda",
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *d = llmd(cases[i].spec, NULL);
        plan_input in = {.llmd = d, .now = NOW};
        result r;
        run(&in, &r);
        assert_int_equal(r.st, LLM_OK);
        const char *yaml = json_string_value(kube_json_get(object_of(&r, "configmaps", "m-config"), "data", "config.yaml", NULL));
        char line[64] = "";
        const char *b = strstr(yaml, "\nbackend: ");
        if (b)
            sscanf(b + 10, "%63s", line);
        json_t *ctr = json_array_get(kube_json_get(object_of(&r, "deployments", "m"), "spec", "template", "spec",
                                                   "containers", NULL), 0);
        json_t *gpu = kube_json_get(ctr, "resources", "limits", "nvidia.com/gpu", NULL);
        char got[24] = "";
        if (json_is_integer(gpu))
            snprintf(got, sizeof got, "%lld", (long long)json_integer_value(gpu));
        else if (json_is_string(gpu))
            snprintf(got, sizeof got, "%s", json_string_value(gpu));
        print_message("case %zu: backend '%s' gpus '%s'\n", i, line, got);
        assert_string_equal(line, cases[i].backend);
        assert_string_equal(got, cases[i].gpus ? cases[i].gpus : "");
        done(&r);
        json_decref(d);
    }
}

/* spec.podTemplate, merged as a strategic merge patch: each list kind. */
static void test_pod_template_lists(void **st)
{
    (void)st;
    json_t *d = llmd("{\"server\":{\"extraArgs\":[\"--a\"]},\"tolerations\":[{\"key\":\"old\"}],\"podTemplate\":{\"spec\":{"
                     "\"containers\":[{\"name\":\"llm-server\",\"args\":[\"--only\"],"
                     "\"env\":[{\"name\":\"POD_IP\",\"value\":\"1.2.3.4\"},{\"name\":\"EXTRA\",\"value\":\"1\"}],"
                     "\"volumeMounts\":[{\"name\":\"other\",\"mountPath\":\"/models\"},{\"name\":\"x\",\"mountPath\":\"/x\"}],"
                     "\"ports\":[{\"containerPort\":8080,\"name\":\"api\"}]},"
                     "{\"name\":\"sidecar\",\"image\":\"s:1\"}],"
                     "\"volumes\":[{\"name\":\"model\",\"emptyDir\":{}},{\"name\":\"x\",\"emptyDir\":{}}],"
                     "\"tolerations\":[{\"key\":\"new\"}],\"imagePullSecrets\":[{\"name\":\"reg\"}]}}}", NULL);
    plan_input in = {.llmd = d, .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    json_t *pod = kube_json_get(object_of(&r, "deployments", "m"), "spec", "template", "spec", NULL);
    json_t *ctrs = json_object_get(pod, "containers"), *c0 = json_array_get(ctrs, 0);
    assert_int_equal(json_array_size(ctrs), 2); /* by name: ours merged, the sidecar added */
    assert_string_equal(kube_json_str(json_array_get(ctrs, 1), "name", NULL), "sidecar");
    assert_int_equal(json_array_size(json_object_get(c0, "args")), 1); /* args: replaced */
    assert_string_equal(json_string_value(json_array_get(json_object_get(c0, "args"), 0)), "--only");
    json_t *env = json_object_get(c0, "env");
    assert_string_equal(kube_json_str(json_array_get(env, 0), "name", NULL), "POD_IP"); /* env by name: one POD_IP */
    assert_string_equal(kube_json_str(json_array_get(env, 0), "value", NULL), "1.2.3.4");
    assert_string_equal(kube_json_str(json_array_get(env, json_array_size(env) - 1), "name", NULL), "EXTRA");
    json_t *mounts = json_object_get(c0, "volumeMounts"), *m;
    size_t i, at_models = 0;
    json_array_foreach(mounts, i, m) at_models += !strcmp(kube_json_str(m, "mountPath", NULL) ?: "", "/models");
    assert_int_equal(at_models, 1); /* volumeMounts by mountPath: /models once, renamed */
    json_t *ports = json_object_get(c0, "ports");
    assert_int_equal(json_array_size(ports), 2); /* by containerPort: 8080 merged (named api), the health port kept */
    assert_string_equal(kube_json_str(json_array_get(ports, 0), "name", NULL), "api");
    json_t *vols = json_object_get(pod, "volumes");
    size_t models = 0;
    json_array_foreach(vols, i, m) models += !strcmp(kube_json_str(m, "name", NULL) ?: "", "model");
    assert_int_equal(models, 1); /* volumes by name */
    assert_int_equal(json_array_size(json_object_get(pod, "tolerations")), 1); /* tolerations: replaced */
    assert_string_equal(kube_json_str(json_array_get(json_object_get(pod, "tolerations"), 0), "key", NULL), "new");
    assert_string_equal(kube_json_str(json_array_get(json_object_get(pod, "imagePullSecrets"), 0), "name", NULL), "reg");
    done(&r);
    json_decref(d);
}

static void test_refusals(void **st)
{
    (void)st;
    static const struct { const char *spec, *want; llm_status st; } cases[] = {
        {"{\"autoscaling\":{\"enabled\":true,\"minReplicas\":5,\"maxReplicas\":2}}", "minReplicas", LLM_ERR_INVALID_ARG},
        {"{\"autoscaling\":{\"enabled\":true,\"metric\":\"cpu\"}}", "cpu", LLM_ERR_INVALID_ARG},
        {"{\"canary\":{\"mode\":\"sideways\"}}", "spec.canary.mode", LLM_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *d = llmd(cases[i].spec, NULL);
        plan_input in = {.llmd = d, .now = NOW};
        result r;
        run(&in, &r);
        assert_int_equal(r.st, cases[i].st);
        assert_non_null(strstr(r.err, cases[i].want));
        done(&r);
        json_decref(d);
    }
    /* NAME-canary that is another's: never adopted */
    json_t *d = llmd("{\"canary\":{\"steps\":[{\"weight\":50}]}}", NULL);
    json_t *foreign = parse("{\"metadata\":{\"name\":\"m-canary\",\"ownerReferences\":[{\"controller\":true,\"uid\":\"u-2\"}]}}");
    plan_input in = {.llmd = d, .canary = foreign, .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(r.st, KUBE_ERR_EXISTS);
    done(&r);
    /* the refusal's status: Degraded with the reason, its event once */
    json_t *events = json_array();
    json_t *s = plan_refused(&in, "ChildConflict", "Service m exists and is not ours", events);
    assert_string_equal(json_string_value(json_object_get(s, "phase")), "Degraded");
    assert_string_equal(cond_reason(s, "Degraded"), "ChildConflict");
    assert_int_equal(json_array_size(events), 1);
    json_decref(s);
    json_decref(events);
    json_decref(foreign);
    json_decref(d);
}

/* ---- status from the pods' diagnosis ------------------------------------------------------- */

static void test_diagnosis_table(void **st)
{
    (void)st;
    static const struct {
        const char *prev;       /* status before */
        int diag, severity, degraded;
        const char *reason;     /* the pods' reason (diag) */
        const char *phase, *degraded_reason, *events;
    } cases[] = {
        /* no round yet: the Deployment's own words */
        {NULL, 0, 0, 0, "", "Loading", "AsExpected", ""},
        {NULL, 1, 9, 1, "ModelNotFound", "Degraded", "ModelNotFound", "ModelNotFound"},
        {NULL, 1, 1, 0, "EngineLoading", "Loading", "AsExpected", ""},
        /* said before: no second event */
        {"{\"conditions\":[{\"type\":\"Degraded\",\"status\":\"True\",\"reason\":\"ModelNotFound\",\"observedGeneration\":1,"
         "\"message\":\"pod p: gone\"}]}", 1, 9, 1, "ModelNotFound", "Degraded", "ModelNotFound", ""},
        /* an engine failure stands while its pod restarts (a crash loop is not news) */
        {"{\"conditions\":[{\"type\":\"Degraded\",\"status\":\"True\",\"reason\":\"EngineFailed\",\"observedGeneration\":1,"
         "\"message\":\"pod p: bad\"}]}", 1, 4, 1, "CrashLooping", "Degraded", "EngineFailed", ""},
        /* ... and while no round has read the pods yet */
        {"{\"conditions\":[{\"type\":\"Degraded\",\"status\":\"True\",\"reason\":\"EngineFailed\",\"observedGeneration\":1,"
         "\"message\":\"pod p: bad\"}]}", 0, 0, 0, "", "Degraded", "EngineFailed", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *d = llmd(NULL, cases[i].prev), *dep = settled(d, 0);
        json_object_set_new(json_object_get(dep, "status"), "readyReplicas", json_integer(0));
        podsig_reading pods = reading(NULL);
        pods.age_s = cases[i].diag ? 0.5 : -1; /* no round yet: nothing read */
        pods.need.diag = cases[i].diag;
        pods.diag.severity = cases[i].severity;
        pods.diag.degraded = cases[i].degraded;
        snprintf(pods.diag.reason, sizeof pods.diag.reason, "%s", cases[i].reason);
        snprintf(pods.diag.message, sizeof pods.diag.message, "pod p: %s", cases[i].reason);
        plan_input in = {.llmd = d, .stable = dep, .pods = &pods, .now = NOW};
        result r;
        run(&in, &r);
        print_message("case %zu: %s %s [%s]\n", i, phase(&r), cond_reason(r.status, "Degraded"), r.events);
        assert_string_equal(phase(&r), cases[i].phase);
        assert_string_equal(cond_reason(r.status, "Degraded"), cases[i].degraded_reason);
        assert_string_equal(r.events, cases[i].events);
        assert_true(r.p.need.diag);
        done(&r);
        json_decref(dep);
        json_decref(d);
    }
}

/* ---- the built-in autoscaler ------------------------------------------------------------- */

#define AS "{\"autoscaling\":{\"enabled\":true,\"minReplicas\":1,\"maxReplicas\":10,\"target\":4,\"intervalSeconds\":3," \
           "\"scaleUpStabilizationSeconds\":0}}"

static void test_autoscale_table(void **st)
{
    (void)st;
    static const struct {
        const char *metric;  /* the reading's (NULL: no reading) */
        double age, signal;
        int pods;
        long long want;      /* replicas planned (2 now) */
        const char *events;
    } cases[] = {
        {"queueDepth", 0.5, 12, 2, 6, "Autoscaled"},  /* 2 * 12 / 4 */
        {"queueDepth", 0.5, 4, 2, 2, ""},             /* on target */
        {"queueDepth", 0.5, 12, 0, 2, ""},            /* no pod answered: hold */
        {"queueDepth", 60, 12, 2, 2, ""},             /* stale (3 intervals and more): hold */
        {"kvCacheUsage", 0.5, 12, 2, 2, ""},          /* read for another metric: hold */
        {NULL, 0, 0, 0, 2, ""},                       /* never read: hold */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *d = llmd(AS, "{\"phase\":\"Ready\"}"), *dep = settled(d, -1);
        podsig_reading pods = reading(cases[i].metric);
        pods.age_s = cases[i].metric ? cases[i].age : -1;
        pods.signal = cases[i].signal;
        pods.signal_pods = cases[i].pods;
        plan_input in = {.llmd = d, .stable = dep, .pods = &pods, .now = NOW};
        result r;
        run(&in, &r);
        print_message("case %zu: %lld replicas [%s]\n", i, replicas_of(object_of(&r, "deployments", "m")), r.events);
        assert_int_equal(r.st, LLM_OK);
        assert_int_equal(replicas_of(object_of(&r, "deployments", "m")), cases[i].want);
        /* what the Desired column shows: the planned count, not spec.replicas (1 here) */
        assert_int_equal(json_integer_value(json_object_get(r.status, "desiredReplicas")), cases[i].want);
        assert_string_equal(r.events, cases[i].events);
        assert_string_equal(r.p.need.metric, "queueDepth"); /* what to read next */
        assert_true(r.p.need.every_s == 3 && r.p.requeue_s == 3);
        assert_non_null(json_object_get(r.status, "autoscaling"));
        /* the autoscaler's event, not a second "Scaled" one, when the apply changes the Deployment */
        json_t *upd = json_object_get(stable_step(&r), "updated");
        assert_non_null(upd);
        for (size_t j = 0; j < json_array_size(upd); j++)
            assert_string_not_equal(json_string_value(json_object_get(json_array_get(upd, j), "reason")), "Scaled");
        done(&r);
        json_decref(dep);
        json_decref(d);
    }
}

/* kubectl scale while the autoscaler decides: not applied, said once in a
 * ScaleIgnored event, kept in status.autoscaling with why. */
static void test_scale_while_autoscaled(void **st)
{
    (void)st;
    json_t *d = llmd(AS, "{\"phase\":\"Ready\"}"), *dep = settled(d, -1);
    podsig_reading pods = reading("queueDepth");
    pods.signal = 4, pods.signal_pods = 2;
    plan_input in = {.llmd = d, .stable = dep, .pods = &pods, .now = NOW};
    result r;
    run(&in, &r); /* first sight: spec.replicas 2 recorded, nothing said */
    assert_string_equal(r.events, "");
    json_t *as = json_deep_copy(json_object_get(r.status, "autoscaling"));
    assert_int_equal(json_integer_value(json_object_get(as, "specReplicas")), 2);
    done(&r);
    json_object_set_new(json_object_get(d, "status"), "autoscaling", as);
    json_object_set_new(json_object_get(d, "spec"), "replicas", json_integer(7)); /* kubectl scale --replicas 7 */
    run(&in, &r);
    assert_int_equal(replicas_of(object_of(&r, "deployments", "m")), 2); /* the autoscaler's count stays */
    assert_string_equal(r.events, "ScaleIgnored");
    const char *why = json_string_value(json_object_get(json_object_get(r.status, "autoscaling"), "message"));
    assert_non_null(why);
    assert_non_null(strstr(why, "spec.replicas 7 is not applied while spec.autoscaling is enabled"));
    json_object_set(json_object_get(d, "status"), "autoscaling", json_object_get(r.status, "autoscaling"));
    done(&r);
    run(&in, &r); /* said once */
    assert_string_equal(r.events, "");
    done(&r);
    json_decref(dep);
    json_decref(d);
}

/* The Deployment was patched (3 -> 1) but the status that records the step
 * was lost (a 409 on a stale copy): the next turn counts from the record,
 * takes the step again and records it. Autoscaling turned off drops the
 * record, so turning it on again starts from what runs then. */
static void test_autoscale_lost_status(void **st)
{
    (void)st;
    json_t *d = llmd(AS, "{\"phase\":\"Ready\",\"autoscaling\":{\"desiredReplicas\":3,"
                         "\"history\":[{\"time\":\"t\",\"from\":1,\"to\":3,\"reason\":\"over\"}]}}");
    json_t *dep = settled(d, -1);
    json_object_set_new(json_object_get(dep, "spec"), "replicas", json_integer(1)); /* patched before the loss */
    podsig_reading pods = reading("queueDepth");
    pods.signal = 0;
    pods.signal_pods = 1;
    plan_input in = {.llmd = d, .stable = dep, .pods = &pods, .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    assert_int_equal(replicas_of(object_of(&r, "deployments", "m")), 1);
    assert_string_equal(r.events, "Autoscaled");
    json_t *as = json_object_get(r.status, "autoscaling"), *hist = json_object_get(as, "history");
    json_t *last = json_array_get(hist, json_array_size(hist) - 1);
    assert_int_equal(json_array_size(hist), 2);
    assert_int_equal(json_integer_value(json_object_get(last, "from")), 3);
    assert_int_equal(json_integer_value(json_object_get(last, "to")), 1);
    assert_int_equal(json_integer_value(json_object_get(as, "desiredReplicas")), 1);
    done(&r);
    /* a record outside [0, maxReplicas] (the status is writable by others): from the Deployment's 1, held */
    json_object_set_new(json_object_get(json_object_get(d, "status"), "autoscaling"), "desiredReplicas",
                        json_integer((json_int_t)1 << 40));
    pods.signal = 4; /* on target */
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    assert_int_equal(replicas_of(object_of(&r, "deployments", "m")), 1);
    assert_string_equal(r.events, "");
    done(&r);
    /* off: the record is removed (a merge patch's null) */
    json_object_set_new(json_object_get(json_object_get(d, "spec"), "autoscaling"), "enabled", json_false());
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    assert_true(json_is_null(json_object_get(r.status, "autoscaling")));
    done(&r);
    json_decref(dep);
    json_decref(d);
}

static void test_scale_to_zero(void **st)
{
    (void)st;
    const char *spec = "{\"router\":{\"enabled\":true,\"image\":\"r:1\",\"holdSeconds\":30},"
                       "\"autoscaling\":{\"enabled\":true,\"minReplicas\":0,\"maxReplicas\":2,\"intervalSeconds\":1,"
                       "\"scaleToZeroAfterSeconds\":5}}";
    /* idle since long ago (state says so): to zero; routers unknown: hold */
    static const struct { int routers; double held; long long want; } cases[] = {{1, 0, 0}, {0, 0, 2}, {1, 3, 2}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char status[256];
        snprintf(status, sizeof status, "{\"autoscaling\":{\"desiredReplicas\":2,\"lastActivityTime\":%.0f,"
                 "\"routerRequests\":10}}", NOW - 600);
        json_t *d = llmd(spec, status), *dep = settled(d, -1);
        podsig_reading pods = reading("queueDepth");
        pods.need.activity = 1;
        pods.signal = 4; /* on target: the signal holds 2, scale to zero decides */
        pods.signal_pods = 2;
        pods.activity = (autoscale_activity){.routers = cases[i].routers, .held = cases[i].held, .requests = 10};
        plan_input in = {.llmd = d, .stable = dep, .pods = &pods, .now = NOW};
        result r;
        run(&in, &r);
        print_message("case %zu: %lld [%s]\n", i, replicas_of(object_of(&r, "deployments", "m")), r.events);
        assert_int_equal(replicas_of(object_of(&r, "deployments", "m")), cases[i].want);
        assert_true(r.p.need.activity);
        done(&r);
        json_decref(dep);
        json_decref(d);
    }
    /* a wake (0 -> 1) whose record was lost: the record says 0, a pod runs and serves; the idle timer,
     * not the zero branch, decides about it */
    char status[256];
    snprintf(status, sizeof status, "{\"autoscaling\":{\"desiredReplicas\":0,\"lastActivityTime\":%.0f,"
             "\"routerRequests\":10}}", NOW - 1);
    json_t *d = llmd(spec, status), *dep = settled(d, -1);
    json_object_set_new(json_object_get(dep, "spec"), "replicas", json_integer(1));
    podsig_reading pods = reading("queueDepth");
    pods.need.activity = 1;
    pods.signal = 4;
    pods.signal_pods = 1;
    pods.activity = (autoscale_activity){.routers = 1, .inflight = 1, .requests = 10};
    plan_input in = {.llmd = d, .stable = dep, .pods = &pods, .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(replicas_of(object_of(&r, "deployments", "m")), 1);
    assert_string_equal(r.events, "");
    done(&r);
    /* the same wake while the routers still hold requests (its status write met a 409 and the retry
     * comes before the pod is ready): taken again from 0, so recorded, with its Event */
    pods.activity = (autoscale_activity){.routers = 1, .held = 4, .requests = 10};
    run(&in, &r);
    assert_int_equal(replicas_of(object_of(&r, "deployments", "m")), 1);
    assert_string_equal(r.events, "Autoscaled");
    json_t *as = json_object_get(r.status, "autoscaling"), *hist = json_object_get(as, "history");
    json_t *last = json_array_get(hist, json_array_size(hist) - 1);
    assert_int_equal(json_integer_value(json_object_get(last, "from")), 0);
    assert_int_equal(json_integer_value(json_object_get(last, "to")), 1);
    assert_non_null(strstr(json_string_value(json_object_get(last, "reason")), "waking"));
    assert_int_equal(json_integer_value(json_object_get(as, "desiredReplicas")), 1);
    done(&r);
    json_decref(dep);
    json_decref(d);
}

/* spec.tracing reaches the server's configuration; without it the
 * configuration is as before (no key: the pods of every deployment made
 * before it keep their config hash). */
static void test_tracing_config(void **st)
{
    (void)st;
    json_t *d = llmd("{\"tracing\":{\"endpoint\":\"http://otel.obs:4318/v1/traces\",\"sampleRatio\":0.25}}", NULL);
    plan_input in = {.llmd = d, .now = NOW};
    result r;
    run(&in, &r);
    const char *cfg = json_string_value(kube_json_get(object_of(&r, "configmaps", "m-config"), "data", "config.yaml"));
    assert_non_null(cfg);
    assert_non_null(strstr(cfg, "otlp_endpoint: \"http://otel.obs:4318/v1/traces\"\n"));
    assert_non_null(strstr(cfg, "trace_sample_ratio: 0.25\n"));
    done(&r);
    json_t *router = desired_router(d); /* its router's span too: the same flags as a gateway's */
    char *args = json_dumps(kube_json_get(router, "spec", "template", "spec", "containers", NULL), JSON_COMPACT);
    assert_non_null(args);
    assert_non_null(strstr(args, "\"--otlp-endpoint\",\"http://otel.obs:4318/v1/traces\",\"--trace-sample-ratio\",\"0.25\""));
    free(args);
    json_decref(router);
    json_decref(d);
    d = llmd(NULL, NULL);
    in.llmd = d;
    run(&in, &r);
    cfg = json_string_value(kube_json_get(object_of(&r, "configmaps", "m-config"), "data", "config.yaml"));
    assert_null(strstr(cfg, "otlp"));
    assert_null(strstr(cfg, "trace_"));
    done(&r);
    json_decref(d);
}

/* ---- the canary ----------------------------------------------------------------------------- */

#define CANARY(mode) "{\"router\":{\"image\":\"r:1\"},\"canary\":{\"mode\":\"" mode "\",\"intervalSeconds\":2," \
                     "\"steps\":[{\"weight\":30,\"pause\":0},{\"weight\":70,\"pause\":0}],\"analysis\":{\"minRequests\":10}}}"

/* The stable Deployment of the old spec, and d of the new one with
 * status.canary as given: a colocated canary's revision changes the model
 * alone, a canary in pods an engine setting. */
static const char *change(const char *mode, int now)
{
    if (strstr(mode, "colocated"))
        return now ? "{\"model\":{\"path\":\"/models/b.gguf\"}}" : "{\"model\":{\"path\":\"/models/a.gguf\"}}";
    return now ? "{\"engine\":{\"maxSeqs\":8}}" : "{\"engine\":{\"maxSeqs\":4}}";
}

static json_t *old_stable(const char *mode)
{
    json_t *old = llmd(mode, NULL);
    merge(json_object_get(old, "spec"), parse(change(mode, 0)));
    json_t *dep = settled(old, -1);
    json_decref(old);
    return dep;
}

static json_t *new_llmd(const char *mode, const char *canary_status)
{
    json_t *d = llmd(mode, "{\"phase\":\"Ready\"}");
    merge(json_object_get(d, "spec"), parse(change(mode, 1)));
    if (canary_status)
        json_object_set_new(json_object_get(d, "status"), "canary", parse(canary_status));
    return d;
}

static const char *canary_phase(result *r)
{
    return json_string_value(json_object_get(json_object_get(r->status, "canary"), "phase"));
}

static json_t *ready_canary(int n)
{
    return json_pack("{s:{s:s,s:i,s:[{s:b,s:s}]},s:{s:i},s:{s:i,s:i,s:i,s:i}}", "metadata", "name", "m-canary",
                     "generation", 1, "ownerReferences", "controller", 1, "uid", "u-1", "spec", "replicas", n, "status",
                     "replicas", n, "readyReplicas", n, "updatedReplicas", n, "observedGeneration", 1);
}

static const char *canary_str(result *r, const char *key);

static void test_canary_pods_table(void **st)
{
    (void)st;
    json_t *stable = old_stable(CANARY("pods"));
    const char *stable_rev = json_string_value(json_object_get(json_object_get(json_object_get(stable, "metadata"),
                                                                                "annotations"), DESIRED_TEMPLATE_ANN));
    /* a new revision starts: the canary's objects, the stable keeps its template */
    json_t *d = new_llmd(CANARY("pods"), NULL);
    podsig_reading pods = reading(NULL);
    plan_input in = {.llmd = d, .stable = stable, .pods = &pods, .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    assert_string_equal(canary_phase(&r), "Starting");
    assert_string_equal(r.events, "CanaryStarted");
    assert_non_null(strstr(r.steps, "apply configmaps m-router; apply configmaps m-canary-config; "
                                    "apply services m-canary-backends; apply deployments m-canary; apply deployments m"));
    assert_null(strstr(r.steps, "apply configmaps m-config")); /* the stable keeps its config */
    json_t *dep = object_of(&r, "deployments", "m");
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_object_get(dep, "metadata"), "annotations"),
                                                          DESIRED_TEMPLATE_ANN)), stable_rev);
    /* and what it serves: the spec's serving revision there would read, next turn, as a change of the key alone */
    assert_string_equal(json_string_value(json_object_get(json_object_get(json_object_get(dep, "metadata"), "annotations"),
                                                          DESIRED_SERVING_ANN)), stable_rev);
    assert_int_equal(r.p.need.canary, 1);
    assert_true(r.p.need.diag); /* the canary's pods are diagnosed while it starts, the stable being Ready */
    assert_string_equal(phase(&r), "Ready");
    json_t *state = json_deep_copy(json_object_get(r.status, "canary"));
    done(&r);
    json_decref(d);

    /* its pods ready, but no round has read the routers' counters yet: wait (no window from nothing) */
    char *st_text = json_dumps(state, JSON_COMPACT);
    d = new_llmd(CANARY("pods"), st_text);
    json_t *can = ready_canary(1);
    pods = reading(NULL);
    pods.age_s = -1;
    in = (plan_input){.llmd = d, .stable = stable, .canary = can, .pods = &pods, .now = NOW + 2};
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Starting");
    assert_string_equal(r.events, "");
    done(&r);
    /* its pods crash-looping (a round diagnosed them): rolled back, naming why */
    {
        json_t *sick = ready_canary(1);
        json_object_set_new(json_object_get(sick, "status"), "readyReplicas", json_integer(0));
        podsig_reading diag = reading(NULL);
        diag.need.diag = 1;
        diag.canary_diag = (pod_diag){.severity = 4, .degraded = 1, .reason = "CrashLooping", .message = "pod c: restarted"};
        plan_input bad = {.llmd = d, .stable = stable, .canary = sick, .pods = &diag, .now = NOW + 2};
        run(&bad, &r);
        assert_string_equal(canary_phase(&r), "RolledBack");
        assert_string_equal(json_string_value(json_object_get(json_object_get(r.status, "canary"), "signal")), "CrashLooping");
        done(&r);
        json_decref(sick);
    }
    /* ... once read: step 1 at 30% */
    pods = reading(NULL);
    pods.need.canary = 1;
    pods.canary_pods = 1;
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Progressing");
    assert_string_equal(r.events, "CanaryStep");
    assert_int_equal(json_integer_value(json_object_get(r.status, "canaryWeight")), 30);
    json_t *progressing = json_deep_copy(json_object_get(r.status, "canary"));
    done(&r);
    json_decref(d);
    free(st_text);

    /* Progressing: the window decides */
    static const struct {
        double req[2], err[2];
        const char *action;
        const char *phase, *events;
        int clear, weight;       /* canaryWeight after */
    } cases[] = {
        {{100, 50}, {0, 0}, NULL, "Progressing", "CanaryStep", 0, 70},       /* passes: step 2 */
        {{100, 50}, {0, 40}, NULL, "RolledBack", "CanaryRolledBack", 0, 0}, /* errors: back */
        {{100, 5}, {0, 0}, NULL, "Progressing", "", 0, 30},                  /* too few requests: hold */
        {{100, 50}, {0, 0}, "pause", "Paused", "", 0, 30},
        {{100, 50}, {0, 0}, "abort", "RolledBack", "CanaryRolledBack", 1, 0},
        {{100, 50}, {0, 0}, "promote", "Promoting", "CanaryPromoting", 1, 30},
    };
    st_text = json_dumps(progressing, JSON_COMPACT);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        d = new_llmd(CANARY("pods"), st_text);
        if (cases[i].action)
            json_object_set_new(json_object_get(d, "metadata"), "annotations",
                                json_pack("{s:s}", ROLLOUT_ACTION_ANN, cases[i].action));
        pods = reading(NULL);
        pods.need.canary = 1;
        pods.canary_pods = 1;
        for (int k = 0; k < 2; k++) pods.canary.requests[k] = cases[i].req[k], pods.canary.errors[k] = cases[i].err[k];
        in = (plan_input){.llmd = d, .stable = stable, .canary = can, .pods = &pods, .now = NOW + 10};
        run(&in, &r);
        print_message("case %zu: %s [%s] %s\n", i, canary_phase(&r), r.events, r.steps);
        assert_string_equal(canary_phase(&r), cases[i].phase);
        assert_string_equal(r.events, cases[i].events);
        assert_int_equal(r.p.ro.clear_action, cases[i].clear);
        assert_int_equal(json_integer_value(json_object_get(r.status, "canaryWeight")), cases[i].weight);
        assert_int_equal(r.p.ro.admin, 0); /* pods of its own: no pod is driven */
        if (cases[i].weight == 70) /* 70% of 2 replicas: 2 canary pods, 1 stable */
            assert_int_equal(replicas_of(object_of(&r, "deployments", "m-canary")), 2);
        /* whether the spec runs: a rollback leaves the pods Ready on the old revision, which must show */
        assert_string_equal(cond_reason(r.status, "SpecServed"), !strcmp(cases[i].phase, "RolledBack") ? "RolledBack"
                                                                 : !strcmp(cases[i].phase, "Promoting") || cases[i].weight
                                                                     ? "CanaryInProgress" : "SpecApplied");
        if (!strcmp(cases[i].phase, "RolledBack"))
            assert_string_equal(cond_reason(r.status, "Progressing"), "SpecRolledBack");
        if (!strcmp(cases[i].phase, "RolledBack")) /* the canary goes, traffic first */
            assert_non_null(strstr(r.steps, "apply configmaps m-router; remove deployments m-canary; "
                                            "remove services m-canary-backends; remove configmaps m-canary-config"));
        done(&r);
        json_decref(d);
    }
    /* a window that would pass, read from 2 of its 4 routers: no verdict (the silent two may hold the errors) */
    d = new_llmd(CANARY("pods"), st_text);
    pods = reading(NULL);
    pods.need.canary = 1;
    pods.canary_pods = 2, pods.canary_asked = 4, pods.canary_own = 2;
    pods.canary.requests[0] = 100, pods.canary.requests[1] = 50;
    in = (plan_input){.llmd = d, .stable = stable, .canary = can, .pods = &pods, .now = NOW + 10};
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Progressing");
    assert_int_equal(json_integer_value(json_object_get(r.status, "canaryWeight")), 30);
    assert_non_null(strstr(json_string_value(json_object_get(json_object_get(json_object_get(r.status, "canary"),
                                                                             "lastAnalysis"), "message")),
                           "only 2 of 4 router pages answered"));
    done(&r);
    pods.canary_own = 3; /* 3 of 4: enough */
    run(&in, &r);
    assert_int_equal(json_integer_value(json_object_get(r.status, "canaryWeight")), 70);
    done(&r);
    json_decref(d);
    /* too few requests for inconclusiveTimeoutSeconds (1800): held as Paused, saying why, once */
    d = new_llmd(CANARY("pods"), st_text);
    pods = reading(NULL);
    pods.need.canary = 1;
    pods.canary_pods = 1;
    pods.canary.requests[0] = 100, pods.canary.requests[1] = 3;
    in = (plan_input){.llmd = d, .stable = stable, .canary = can, .pods = &pods, .now = NOW + 1812};
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Paused");
    assert_string_equal(r.events, "CanaryInconclusive");
    assert_non_null(strstr(canary_str(&r, "message"), "no verdict in 1810 s at step 1"));
    done(&r);
    json_decref(d);
    /* a canary cancelled (the spec went back), then the same revision again: it starts over */
    json_t *cancelled = json_deep_copy(progressing);
    json_object_set_new(cancelled, "phase", json_string("Cancelled"));
    char *c_text = json_dumps(cancelled, JSON_COMPACT);
    d = new_llmd(CANARY("pods"), c_text);
    pods = reading(NULL);
    pods.age_s = -1; /* its counters not read again yet: it waits in Starting */
    in = (plan_input){.llmd = d, .stable = stable, .canary = can, .pods = &pods, .now = NOW + 20};
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Starting");
    assert_string_equal(r.events, "CanaryStarted");
    assert_int_equal(json_integer_value(json_object_get(json_object_get(r.status, "canary"), "step")), -1);
    done(&r);
    json_decref(d);
    free(c_text);
    json_decref(cancelled);
    /* promoting: an abort is too late - said, and the lever removed */
    json_t *promoting = json_deep_copy(progressing);
    json_object_set_new(promoting, "phase", json_string("Promoting"));
    char *p_text = json_dumps(promoting, JSON_COMPACT);
    d = new_llmd(CANARY("pods"), p_text);
    json_object_set_new(json_object_get(d, "metadata"), "annotations", json_pack("{s:s}", ROLLOUT_ACTION_ANN, "abort"));
    in.llmd = d;
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Promoting");
    assert_string_equal(r.events, "CanaryActionIgnored");
    assert_true(r.p.ro.clear_action);
    done(&r);
    json_decref(d);
    free(p_text);
    json_decref(promoting);
    free(st_text);
    json_decref(progressing);
    json_decref(state);
    json_decref(can);
    json_decref(stable);
}

static void test_canary_colocated_table(void **st)
{
    (void)st;
    json_t *stable = old_stable(CANARY("colocated"));
    json_t *d = new_llmd(CANARY("colocated"), NULL);
    plan_input in = {.llmd = d, .stable = stable, .admin_secret = "m-admin-0123456789", .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    assert_string_equal(canary_phase(&r), "Starting");
    assert_string_equal(json_string_value(json_object_get(json_object_get(r.status, "canary"), "mode")), "colocated");
    assert_int_equal(r.p.ro.admin, 1); /* load it, at weight 0 */
    assert_int_equal(r.p.ro.admin_weight, 0);
    assert_null(strstr(r.steps, "apply deployments m-canary")); /* no pods of its own */
    assert_string_equal(json_string_value(json_object_get(json_array_get(r.p.steps, 0), "op")), "adminSecret");
    char *starting = json_dumps(json_object_get(r.status, "canary"), JSON_COMPACT);
    const char *rev = json_string_value(json_object_get(json_object_get(r.status, "canary"), "revision"));
    char revision[17];
    snprintf(revision, sizeof revision, "%s", rev);
    done(&r);
    json_decref(d);

    static const struct {
        int valid, pods, ready, failed, misfit, weight;
        int counters;             /* a round read the pods' counters */
        const char *phase, *mode, *events;
        int admin, admin_weight;
    } cases[] = {
        {0, 0, 0, 0, 0, 0, 1, "Starting", "colocated", "", 1, 0},                              /* not asked yet */
        {1, 2, 1, 0, 0, 0, 1, "Starting", "colocated", "", 1, 0},                              /* loading */
        {1, 2, 2, 0, 0, 0, 1, "Progressing", "colocated", "CanaryStep", 1, 30},                /* step 1 */
        {1, 2, 2, 0, 0, 0, 0, "Starting", "colocated", "", 1, 0},                              /* no counters yet */
        {1, 2, 0, 0, 1, 0, 1, "Starting", "pods", "ColocationDoesNotFit", 2, 0},               /* own pods */
        {1, 2, 1, 1, 0, 0, 1, "RolledBack", "colocated", "CanaryRolledBack", 2, 0},            /* failed: unload */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        d = new_llmd(CANARY("colocated"), starting);
        podsig_reading pods = reading(NULL);
        pods.need.canary = cases[i].counters ? 2 : 0;
        pods.admin = (podsig_admin){.valid = cases[i].valid, .pods = cases[i].pods, .ready = cases[i].ready,
                                    .failed = cases[i].failed, .misfit = cases[i].misfit, .weight = cases[i].weight};
        snprintf(pods.admin.rev, sizeof pods.admin.rev, "%s", revision);
        snprintf(pods.admin.message, sizeof pods.admin.message, "pod 10.0.0.1: %s", "it said so");
        in = (plan_input){.llmd = d, .stable = stable, .admin_secret = "m-admin-0123456789", .pods = &pods, .now = NOW + 2};
        run(&in, &r);
        print_message("case %zu: %s %s [%s] admin %d/%d\n", i, canary_phase(&r),
                      json_string_value(json_object_get(json_object_get(r.status, "canary"), "mode")), r.events,
                      r.p.ro.admin, r.p.ro.admin_weight);
        assert_string_equal(canary_phase(&r), cases[i].phase);
        assert_string_equal(json_string_value(json_object_get(json_object_get(r.status, "canary"), "mode")), cases[i].mode);
        assert_string_equal(r.events, cases[i].events);
        assert_int_equal(r.p.ro.admin, cases[i].admin);
        assert_int_equal(r.p.ro.admin_weight, cases[i].admin_weight);
        done(&r);
        json_decref(d);
    }
    /* Progressing inside the stable pods: each turn keeps every pod on the step's weight; a pass moves
     * it, a failure takes the model out of them */
    {
        json_t *prog = parse(starting);
        json_object_set_new(prog, "phase", json_string("Progressing"));
        json_object_set_new(prog, "step", json_integer(0));
        json_object_set_new(prog, "weight", json_integer(30));
        json_object_set_new(prog, "stepStartTime", json_integer((json_int_t)NOW));
        canary_sample zero = {0};
        json_object_set_new(prog, "window", canary_sample_to_json(&zero));
        char *text = json_dumps(prog, JSON_COMPACT);
        static const struct { double err; const char *phase, *events; int admin, weight; } rows[] = {
            {0, "Progressing", "CanaryStep", 1, 70},
            {40, "RolledBack", "CanaryRolledBack", 2, 0},
        };
        for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
            d = new_llmd(CANARY("colocated"), text);
            podsig_reading pods = reading(NULL);
            pods.need.canary = 2;
            pods.canary_pods = 2;
            pods.canary.requests[0] = 100, pods.canary.requests[1] = 50, pods.canary.errors[1] = rows[i].err;
            in = (plan_input){.llmd = d, .stable = stable, .admin_secret = "m-admin-0123456789", .pods = &pods, .now = NOW + 10};
            run(&in, &r);
            assert_string_equal(canary_phase(&r), rows[i].phase);
            assert_string_equal(r.events, rows[i].events);
            assert_int_equal(r.p.ro.admin, rows[i].admin);
            assert_int_equal(r.p.ro.admin_weight, rows[i].weight);
            assert_int_equal(r.p.need.canary, rows[i].admin == 1 ? 2 : 0); /* the pods' own counters, while it runs */
            done(&r);
            json_decref(d);
        }
        free(text);
        json_decref(prog);
    }
    /* rolled back: the unload is asked again until every pod said it let the model go */
    {
        json_t *back = parse(starting);
        json_object_set_new(back, "phase", json_string("RolledBack"));
        json_object_set_new(back, "rolledBackRevision", json_string(revision));
        char *text = json_dumps(back, JSON_COMPACT);
        static const struct { int valid, unload, pods, answered, admin; } rows[] = {
            {0, 0, 0, 0, 2},  /* nothing known (a new leader): unload */
            {1, 1, 2, 1, 2},  /* one pod did not answer: again */
            {1, 1, 2, 2, 0},  /* all did: done */
            {1, 0, 2, 2, 2},  /* the last call was not an unload */
        };
        for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
            d = new_llmd(CANARY("colocated"), text);
            podsig_reading pods = reading(NULL);
            pods.admin = (podsig_admin){.valid = rows[i].valid, .unload = rows[i].unload, .pods = rows[i].pods,
                                        .answered = rows[i].answered};
            snprintf(pods.admin.rev, sizeof pods.admin.rev, "%s", revision);
            in = (plan_input){.llmd = d, .stable = stable, .admin_secret = "m-admin-0123456789", .pods = &pods, .now = NOW + 30};
            run(&in, &r);
            assert_string_equal(canary_phase(&r), "RolledBack");
            assert_int_equal(r.p.ro.admin, rows[i].admin);
            assert_true(rows[i].admin ? r.p.requeue_s > 0 : 1);
            done(&r);
            json_decref(d);
        }
        free(text);
        json_decref(back);
    }
    /* answers for another revision are not this one's */
    d = new_llmd(CANARY("colocated"), starting);
    podsig_reading pods = reading(NULL);
    pods.need.canary = 2;
    pods.admin = (podsig_admin){.valid = 1, .pods = 2, .ready = 2};
    snprintf(pods.admin.rev, sizeof pods.admin.rev, "0000000000000000");
    in = (plan_input){.llmd = d, .stable = stable, .admin_secret = "m-admin-0123456789", .pods = &pods, .now = NOW + 2};
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Starting");
    done(&r);
    json_decref(d);

    /* Promoting: every pod on the new model at 100 first, then the stable rolls to it */
    json_t *promoting = parse(starting);
    json_object_set_new(promoting, "phase", json_string("Promoting"));
    char *ptext = json_dumps(promoting, JSON_COMPACT);
    for (int w = 30; w <= 100; w += 70) {
        d = new_llmd(CANARY("colocated"), ptext);
        pods = reading(NULL);
        pods.admin = (podsig_admin){.valid = 1, .pods = 2, .ready = 2, .weight = w};
        snprintf(pods.admin.rev, sizeof pods.admin.rev, "%s", revision);
        in = (plan_input){.llmd = d, .stable = stable, .admin_secret = "m-admin-0123456789", .pods = &pods, .now = NOW + 4};
        run(&in, &r);
        json_t *dep = object_of(&r, "deployments", "m");
        const char *t = json_string_value(json_object_get(json_object_get(json_object_get(dep, "metadata"), "annotations"),
                                                          DESIRED_TEMPLATE_ANN));
        assert_int_equal(r.p.ro.admin, 1);
        assert_int_equal(r.p.ro.admin_weight, 100);
        if (w == 100)
            assert_string_equal(t, revision); /* the stable rolls to the new revision */
        else
            assert_string_not_equal(t, revision);
        done(&r);
        json_decref(d);
    }
    free(ptext);
    json_decref(promoting);
    free(starting);
    json_decref(stable);
}

/* ---- what makes it a planner ---------------------------------------------------------------- */


/* The quality gate (rollout.h): judged once the canary's pods serve, before
 * any traffic, and again before promotion; each verdict from a result of
 * the judge (judge.h) for this revision and stage. */
#define CANARY_Q(extra) "{\"router\":{\"image\":\"r:1\"},\"canary\":{\"mode\":\"pods\",\"intervalSeconds\":2," \
                        "\"steps\":[{\"weight\":30,\"pause\":0}],\"analysis\":{\"minRequests\":10," \
                        "\"quality\":{\"maxKLDivergence\":0.05,\"minTop1Agreement\":0.9" extra "}}}}"

static judge_result judged(const char *rev, int stage, int outcome, double kl, long positions, long same)
{
    judge_result j = {.state = JUDGE_DONE, .stage = stage, .outcome = outcome, .texts = 3,
                      .sum = {.kl = kl * (double)positions, .kl_max = 2 * kl, .positions = positions, .top1_same = same}};
    snprintf(j.rev, sizeof j.rev, "%s", rev);
    snprintf(j.message, sizeof j.message, "%s", outcome ? "3 texts" : "text a: the vocabularies differ (512 and 600 tokens)");
    return j;
}

static const char *canary_str(result *r, const char *key)
{
    return json_string_value(json_object_get(json_object_get(r->status, "canary"), key));
}

static void test_canary_quality_gate(void **st)
{
    (void)st;
    json_t *stable = old_stable(CANARY_Q(""));
    json_t *d = new_llmd(CANARY_Q(""), NULL), *can = ready_canary(1);
    podsig_reading pods = reading(NULL);
    plan_input in = {.llmd = d, .stable = stable, .pods = &pods, .now = NOW};
    result r;
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Starting");
    assert_int_equal(r.p.ro.need_quality, 0); /* no pods yet: nothing to judge */
    char rev[17], *start = json_dumps(json_object_get(r.status, "canary"), JSON_COMPACT);
    snprintf(rev, sizeof rev, "%s", r.p.template_hash);
    done(&r);
    json_decref(d);
    static const struct {
        int stage, outcome;
        const char *rev, *extra;  /* the result's revision ("": this one); spec fields */
        double kl;
        long positions, same;
        const char *phase, *events, *signal, *message; /* after; signal: a rollback's */
        int need;
    } cases[] = {
        {0, 0, NULL, "", 0, 0, 0, "Starting", "", NULL, "judging the canary's answers", 1},         /* asked */
        {1, 1, "0123456789abcdef", "", 0.01, 1000, 990, "Starting", "", NULL, "judging", 1},          /* another's */
        {2, 1, "", "", 0.01, 1000, 990, "Starting", "", NULL, "judging", 1},                          /* another stage */
        {1, 1, "", "", 0.01, 1000, 990, "Progressing", "QualityPassed; CanaryStep", NULL, "step 1 began", 0},
        {1, 1, "", "", 0.30, 1000, 990, "RolledBack", "CanaryRolledBack", "QualityRegression",
         "mean KL divergence 0.3000 (max 0.0500), top-1 agreement 0.990 (min 0.900) over 1000 positions", 0},
        {1, 1, "", "", 0.01, 1000, 700, "RolledBack", "CanaryRolledBack", "QualityRegression", "top-1 agreement 0.700", 0},
        {1, 0, "", "", 0, 0, 0, "Starting", "QualityIncomparable", NULL, "the vocabularies differ", 1}, /* held */
        {1, 0, "", ",\"onIncomparable\":\"fail\"", 0, 0, 0, "RolledBack", "CanaryRolledBack", "QualityIncomparable",
         "cannot be compared: text a: the vocabularies differ", 0},
        {1, -1, "", "", 0, 0, 0, "Starting", "QualityReadFailed", NULL, "the quality reads failed", 1}, /* asked again */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char spec[1024];
        snprintf(spec, sizeof spec, CANARY_Q("%s"), cases[i].extra);
        d = new_llmd(spec, start);
        judge_result j = judged(cases[i].rev ? (*cases[i].rev ? cases[i].rev : rev) : "", cases[i].stage, cases[i].outcome,
                                cases[i].kl, cases[i].positions, cases[i].same);
        pods = reading(NULL);
        pods.need.canary = 1;
        pods.canary_pods = 1;
        in = (plan_input){.llmd = d, .stable = stable, .canary = can, .pods = &pods, .quality = cases[i].stage ? &j : NULL,
                          .now = NOW + 2};
        run(&in, &r);
        print_message("case %zu: %s [%s] %s\n", i, canary_phase(&r), r.events, canary_str(&r, "message"));
        assert_string_equal(canary_phase(&r), cases[i].phase);
        assert_string_equal(r.events, cases[i].events);
        assert_int_equal(r.p.ro.need_quality, cases[i].need);
        assert_non_null(strstr(canary_str(&r, "message"), cases[i].message));
        if (cases[i].signal)
            assert_string_equal(canary_str(&r, "signal"), cases[i].signal);
        json_t *rec = json_object_get(json_object_get(json_object_get(r.status, "canary"), "quality"), "start");
        if (cases[i].stage == 1 && cases[i].rev && !strcmp(cases[i].rev, "")) { /* the figures kept */
            assert_string_equal(json_string_value(json_object_get(rec, "revision")), rev);
            assert_int_equal(json_integer_value(json_object_get(rec, "positions")), cases[i].positions);
        }
        done(&r);
        json_decref(d);
    }
    /* passed at the start, at the last step with a good window: judged again before promotion */
    d = new_llmd(CANARY_Q(""), start);
    judge_result j = judged(rev, 1, 1, 0.01, 1000, 990);
    in = (plan_input){.llmd = d, .stable = stable, .canary = can, .pods = &pods, .quality = &j, .now = NOW + 2};
    run(&in, &r);
    char *progressing = json_dumps(json_object_get(r.status, "canary"), JSON_COMPACT);
    done(&r);
    json_decref(d);
    d = new_llmd(CANARY_Q(""), progressing);
    for (int k = 0; k < 2; k++) pods.canary.requests[k] = 100;
    in = (plan_input){.llmd = d, .stable = stable, .canary = can, .pods = &pods, .quality = &j, .now = NOW + 10};
    run(&in, &r); /* the start's result is no answer for the promotion */
    assert_string_equal(canary_phase(&r), "Progressing");
    assert_int_equal(r.p.ro.need_quality, 2);
    assert_non_null(strstr(canary_str(&r, "message"), "again before promotion"));
    done(&r);
    j = judged(rev, 2, 1, 0.01, 1000, 990);
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Promoting");
    assert_string_equal(r.events, "QualityPassed; CanaryPromoting");
    assert_int_equal(r.p.ro.need_quality, 0);
    done(&r);
    json_decref(d);
    /* a state whose start passed for this revision is not judged again (a new leader, a restart) */
    d = new_llmd(CANARY_Q(""), progressing);
    json_t *cs = json_object_get(json_object_get(d, "status"), "canary");
    json_object_set_new(cs, "phase", json_string("Starting"));
    in = (plan_input){.llmd = d, .stable = stable, .canary = can, .pods = &pods, .now = NOW + 12};
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Progressing");
    assert_int_equal(r.p.ro.need_quality, 0);
    done(&r);
    json_decref(d);
    free(progressing);
    free(start);
    json_decref(can);
    json_decref(stable);
}

/* A change of the operator's key alone (turning on the gate, adapters or a
 * colocated canary adds the admin token's mount) rolls the stable pods
 * once: no canary of a revision that serves alike. */
static void test_key_change_is_no_canary(void **st)
{
    (void)st;
    json_t *stable = old_stable(CANARY("pods"));
    json_t *d = llmd(CANARY_Q(""), "{\"phase\":\"Ready\"}");
    merge(json_object_get(d, "spec"), parse(change("pods", 0))); /* the stable's engine settings */
    podsig_reading pods = reading(NULL);
    plan_input in = {.llmd = d, .stable = stable, .admin_secret = "m-admin-0123456789", .pods = &pods, .now = NOW};
    result r;
    run(&in, &r);
    assert_int_equal(r.st, LLM_OK);
    assert_null(strstr(r.steps, "apply deployments m-canary"));
    assert_string_equal(r.events, "");
    json_t *dep = object_of(&r, "deployments", "m");
    const char *want = json_string_value(json_object_get(json_object_get(json_object_get(dep, "metadata"), "annotations"),
                                                         DESIRED_TEMPLATE_ANN));
    assert_string_equal(want, r.p.template_hash); /* the stable rolls to the new template */
    char *text = json_dumps(dep, JSON_COMPACT);
    assert_non_null(strstr(text, "admin_token_file"));
    free(text);
    done(&r);
    /* with a model change besides: a canary as ever */
    merge(json_object_get(d, "spec"), parse(change("pods", 1)));
    run(&in, &r);
    assert_string_equal(canary_phase(&r), "Starting");
    done(&r);
    json_decref(d);
    json_decref(stable);
}

static void test_same_input_same_plan_inputs_untouched(void **st)
{
    (void)st;
    const char *specs[] = {NULL, AS, CANARY("pods"), CANARY("colocated"),
                           "{\"router\":{\"enabled\":true,\"image\":\"r:1\"}}"};
    for (size_t i = 0; i < sizeof specs / sizeof *specs; i++) {
        json_t *stable = old_stable(specs[i] ? specs[i] : "{}");
        json_t *d = new_llmd(specs[i] ? specs[i] : "{}", NULL);
        json_t *d0 = json_deep_copy(d), *s0 = json_deep_copy(stable);
        podsig_reading pods = reading("queueDepth");
        pods.signal = 9;
        pods.signal_pods = 2;
        plan_input in = {.llmd = d, .stable = stable, .pods = &pods, .admin_secret = "m-admin-x", .now = NOW};
        result a, b;
        run(&in, &a);
        run(&in, &b);
        assert_int_equal(a.st, LLM_OK);
        assert_true(json_equal(a.p.steps, b.p.steps));
        assert_true(json_equal(a.p.events, b.p.events));
        assert_true(json_equal(a.status, b.status));
        assert_true(a.p.requeue_s == b.p.requeue_s && a.p.ro.admin == b.p.ro.admin);
        assert_true(a.p.ro.admin_weight == b.p.ro.admin_weight && a.p.ro.clear_action == b.p.ro.clear_action);
        assert_memory_equal(&a.p.need, &b.p.need, sizeof a.p.need);
        assert_string_equal(a.p.template_hash, b.p.template_hash);
        /* its time is the input's, not the clock's: NOW is 2023-11-14T22:13:20Z */
        json_t *c0 = json_array_get(json_object_get(a.status, "conditions"), 0);
        assert_string_equal(json_string_value(json_object_get(c0, "lastTransitionTime")), "2023-11-14T22:13:20Z");
        assert_true(json_equal(d, d0)); /* nothing written into the observed objects */
        assert_true(json_equal(stable, s0));
        done(&a);
        done(&b);
        json_decref(d);
        json_decref(d0);
        json_decref(s0);
        json_decref(stable);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_and_at_rest),
        cmocka_unit_test(test_tracing_config),
        cmocka_unit_test(test_router_and_hpa_steps),
        cmocka_unit_test(test_backend_and_gpus),
        cmocka_unit_test(test_pod_template_lists),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_diagnosis_table),
        cmocka_unit_test(test_autoscale_table),
        cmocka_unit_test(test_scale_while_autoscaled),
        cmocka_unit_test(test_autoscale_lost_status),
        cmocka_unit_test(test_scale_to_zero),
        cmocka_unit_test(test_canary_pods_table),
        cmocka_unit_test(test_canary_colocated_table),
        cmocka_unit_test(test_canary_quality_gate),
        cmocka_unit_test(test_key_change_is_no_canary),
        cmocka_unit_test(test_same_input_same_plan_inputs_untouched),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
