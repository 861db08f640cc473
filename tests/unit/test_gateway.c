/* test_gateway.c - an LLMGateway's route table from LLMDeployments, worked
 * by hand: the selector (namespace, matchLabels), name order, the served
 * names (model, adapters), the pods' Service (NAME, or NAME-backends behind
 * the deployment's own router; the canary's), a name served twice (the
 * later deployment left out and named), and the bounds: 1024 routes, a
 * table under 900 KiB, 32 conflicts shown, 256 models in the status;
 * llm-router loading every table it makes; spec.auth and spec.quotas as
 * the router's tenant flags and Secret volumes, and the status saying how
 * the limits are held. */
#include "testutil.h"

#include <jansson.h>

#include "gateway.h"
#include "kube_json.h"
#include "rt_routes.h"

static json_t *dep(const char *name, const char *ns, const char *team, const char *served, const char *extra)
{
    char text[8192];
    snprintf(text, sizeof text,
             "{\"metadata\":{\"name\":\"%s\",\"namespace\":\"%s\",\"labels\":{\"team\":\"%s\"}},"
             "\"spec\":{\"model\":{\"name\":\"%s\"}%s%s}}", name, ns, team, served, extra ? "," : "", extra ? extra : "");
    json_t *d = json_loads(text, 0, NULL);
    assert_non_null(d);
    return d;
}

static json_t *gateway(const char *labels)
{
    char text[512];
    snprintf(text, sizeof text, "{\"metadata\":{\"name\":\"front\",\"namespace\":\"ns\",\"uid\":\"u1\",\"generation\":3},"
                                "\"spec\":{\"selector\":{\"matchLabels\":%s}}}", labels);
    json_t *g = json_loads(text, 0, NULL);
    assert_non_null(g);
    return g;
}

static void test_table(void **st)
{
    (void)st;
    json_t *gw = gateway("{\"team\":\"a\"}"), *all = json_array();
    json_array_append_new(all, dep("zeta", "ns", "a", "z-m", "\"router\":{\"enabled\":true}"));
    json_array_append_new(all, dep("alpha", "ns", "a", "a-m", "\"adapters\":[{\"name\":\"ad1\"},{\"name\":\"ad2\"}],"
                                                         "\"canary\":{\"steps\":[{\"weight\":10}]}"));
    json_array_append_new(all, dep("beta", "ns", "b", "b-m", NULL));     /* not selected: another team */
    json_array_append_new(all, dep("gamma", "other", "a", "g-m", NULL)); /* not selected: another namespace */
    json_array_append_new(all, dep("mid", "ns", "a", "ad2", NULL));      /* ad2 is alpha's adapter */
    gateway_table t;
    assert_int_equal(gateway_table_make(gw, all, &t), 0);
    assert_int_equal(t.deployments, 2);
    assert_string_equal(t.routes,
                        "{\"routes\":[{\"canaryService\":\"alpha-canary-backends\",\"metricsPort\":8081,\"models\":[\"a-m\","
                        "\"ad1\",\"ad2\"],\"name\":\"alpha\",\"service\":\"alpha-backends\",\"weightConfigMap\":\"alpha-router\"},"
                        "{\"metricsPort\":8081,\"models\":[\"z-m\"],\"name\":\"zeta\",\"service\":\"zeta-backends\"}]}");
    char *conflicts = json_dumps(t.conflicts, JSON_COMPACT);
    assert_string_equal(conflicts, "[\"mid: ad2 is served by alpha\"]");
    free(conflicts);
    assert_int_equal(json_array_size(t.models), 4);
    json_t *children = gateway_children(gw, &t);
    assert_int_equal(json_array_size(children), 7);
    static const char *const kinds[] = {"ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service",
                                        "PodDisruptionBudget"};
    for (int i = 0; i < 7; i++) {
        json_t *o = json_array_get(children, (size_t)i);
        assert_string_equal(json_string_value(json_object_get(o, "kind")), kinds[i]);
        json_t *owner = json_array_get(kube_json_get(o, "metadata", "ownerReferences", NULL), 0);
        assert_string_equal(json_string_value(json_object_get(owner, "kind")), "LLMGateway");
    }
    json_t *args = kube_json_get(json_array_get(children, 4), "spec", "template", "spec", "containers", NULL);
    char *a = json_dumps(json_object_get(json_array_get(args, 0), "args"), JSON_COMPACT);
    assert_non_null(strstr(a, "\"--routes-configmap\",\"ns/front-gateway-routes\",\"--policy\",\"cache-aware\""));
    free(a);
    json_t *status = gateway_status(gw, NULL, &t, 0);
    assert_string_equal(json_string_value(json_object_get(status, "phase")), "Pending");
    assert_int_equal(json_integer_value(json_object_get(status, "modelCount")), 4);
    json_decref(status);
    json_decref(children);
    gateway_table_free(&t);
    json_decref(all);
    json_decref(gw);
}

/* The gateway's pod container of a gateway built from text. */
static json_t *gateway_pod(const char *text, json_t **children, gateway_table *t)
{
    json_t *gw = json_loads(text, 0, NULL), *none = json_array();
    assert_non_null(gw);
    assert_int_equal(gateway_table_make(gw, none, t), 0);
    json_decref(none);
    *children = gateway_children(gw, t);
    assert_non_null(*children);
    json_decref(gw);
    return kube_json_get(json_array_get(*children, 4), "spec", "template", "spec", NULL);
}

/* The router container's args of a pod spec, as compact JSON (caller frees). */
static char *args_of(json_t *pod)
{
    char *a = json_dumps(json_object_get(json_array_get(json_object_get(pod, "containers"), 0), "args"), JSON_COMPACT);
    assert_non_null(a);
    return a;
}

static void test_tenants(void **st)
{
    (void)st;
    const char *base = "{\"metadata\":{\"name\":\"front\",\"namespace\":\"ns\",\"uid\":\"u1\",\"generation\":1},"
                       "\"spec\":{\"selector\":{},\"replicas\":3%s}}";
    char text[1024];
    json_t *children;
    gateway_table t;
    /* keys, the upstream key and Redis */
    snprintf(text, sizeof text, base, ",\"auth\":{\"secretName\":\"tk\",\"upstreamKeySecret\":\"up\"},"
             "\"quotas\":{\"redis\":\"redis.ns:6379\",\"failMode\":\"open\",\"timeoutMs\":50}");
    json_t *pod = gateway_pod(text, &children, &t);
    char *a = args_of(pod);
    /* the share with Redis too: what each pod holds while Redis is down (fail open) */
    assert_non_null(strstr(a, "\"--api-keys-file\",\"/etc/llm-gateway/keys/keys\",\"--upstream-key-file\","
                              "\"/etc/llm-gateway/upstream/key\",\"--quota-share\",\"3\",\"--quota-redis\",\"redis.ns:6379\","
                              "\"--quota-fail\",\"open\",\"--quota-timeout-ms\",\"50\",\"--quota-prefix\",\"ns/front\""));
    free(a);
    char *m = json_dumps(json_object_get(json_array_get(json_object_get(pod, "containers"), 0), "volumeMounts"),
                         JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(m, "[{\"mountPath\":\"/etc/llm-gateway/keys\",\"name\":\"keys\",\"readOnly\":true},"
                           "{\"mountPath\":\"/etc/llm-gateway/upstream\",\"name\":\"upstream\",\"readOnly\":true}]");
    free(m);
    /* 0440 files: the router's user reads them through the pod's group */
    assert_int_equal(json_integer_value(kube_json_get(pod, "securityContext", "fsGroup", NULL)), 65532);
    assert_int_equal(json_integer_value(kube_json_get(pod, "securityContext", "runAsUser", NULL)), 65532);
    char *v = json_dumps(json_object_get(pod, "volumes"), JSON_COMPACT | JSON_SORT_KEYS);
    assert_string_equal(v, "[{\"name\":\"keys\",\"secret\":{\"defaultMode\":288,\"items\":[{\"key\":\"keys\",\"path\":\"keys\"}],"
                           "\"secretName\":\"tk\"}},{\"name\":\"upstream\",\"secret\":{\"defaultMode\":288,\"items\":[{\"key\":"
                           "\"key\",\"path\":\"key\"}],\"secretName\":\"up\"}}]");
    free(v);
    json_t *gw = json_loads(text, 0, NULL), *status = gateway_status(gw, NULL, &t, 0);
    assert_non_null(strstr(json_string_value(json_object_get(status, "quotas")), "through Redis redis.ns:6379"));
    json_decref(status), json_decref(gw), json_decref(children);
    gateway_table_free(&t);
    /* Redis's password from a Secret (mounted like the keys), with an ACL user */
    snprintf(text, sizeof text, base, ",\"auth\":{\"secretName\":\"tk\"},\"quotas\":{\"redis\":\"redis.ns:6379\","
             "\"passwordSecret\":\"rpw\",\"user\":\"gw\"}");
    pod = gateway_pod(text, &children, &t);
    a = args_of(pod);
    assert_non_null(strstr(a, "\"--quota-redis-password-file\",\"/etc/llm-gateway/redis/password\","
                              "\"--quota-redis-user\",\"gw\"]"));
    free(a);
    v = json_dumps(json_object_get(pod, "volumes"), JSON_COMPACT | JSON_SORT_KEYS);
    assert_non_null(strstr(v, "{\"name\":\"redis\",\"secret\":{\"defaultMode\":288,\"items\":[{\"key\":\"password\","
                              "\"path\":\"password\"}],\"secretName\":\"rpw\"}}"));
    free(v);
    json_decref(children);
    gateway_table_free(&t);
    /* keys without Redis: each of the 3 replicas its share */
    snprintf(text, sizeof text, base, ",\"auth\":{\"secretName\":\"tk\"}");
    pod = gateway_pod(text, &children, &t);
    a = args_of(pod);
    assert_non_null(strstr(a, "\"--api-keys-file\",\"/etc/llm-gateway/keys/keys\",\"--quota-share\",\"3\"]"));
    free(a);
    gw = json_loads(text, 0, NULL), status = gateway_status(gw, NULL, &t, 0);
    assert_non_null(strstr(json_string_value(json_object_get(status, "quotas")), "each of the 3 gateway pods holds 1/3"));
    json_decref(status), json_decref(gw), json_decref(children);
    gateway_table_free(&t);
    /* spec.tracing: the router's trace flags */
    snprintf(text, sizeof text, base, ",\"tracing\":{\"endpoint\":\"http://otel:4318/v1/traces\",\"sampleRatio\":0.5}");
    pod = gateway_pod(text, &children, &t);
    a = args_of(pod);
    assert_non_null(strstr(a, "\"--otlp-endpoint\",\"http://otel:4318/v1/traces\",\"--trace-sample-ratio\",\"0.5\""));
    free(a);
    json_decref(children);
    gateway_table_free(&t);
    /* no keys: no tenant flags, no volumes */
    snprintf(text, sizeof text, base, "");
    pod = gateway_pod(text, &children, &t);
    a = args_of(pod);
    assert_null(strstr(a, "--api-keys-file"));
    assert_null(json_object_get(pod, "volumes"));
    free(a);
    json_decref(children);
    gateway_table_free(&t);
}

/* A deployment that scales to zero: its route holds requests as long as
 * its router does (so they wait, and wake it, at the gateway too). */
static void test_scale_to_zero_route(void **st)
{
    (void)st;
    json_t *gw = gateway("{}"), *all = json_array();
    json_array_append_new(all, dep("z", "ns", "a", "z-m", "\"router\":{\"enabled\":true,\"holdSeconds\":60},"
                                                     "\"autoscaling\":{\"enabled\":true,\"minReplicas\":0}"));
    json_array_append_new(all, dep("one", "ns", "a", "o-m", "\"router\":{\"enabled\":true,\"holdSeconds\":60},"
                                                       "\"autoscaling\":{\"enabled\":true,\"minReplicas\":1}"));
    gateway_table t;
    assert_int_equal(gateway_table_make(gw, all, &t), 0);
    assert_string_equal(t.routes,
                        "{\"routes\":[{\"metricsPort\":8081,\"models\":[\"o-m\"],\"name\":\"one\",\"service\":\"one-backends\"},"
                        "{\"holdSeconds\":60,\"metricsPort\":8081,\"models\":[\"z-m\"],\"name\":\"z\",\"service\":\"z-backends\"}]}");
    rt_routes *rt = NULL;
    llm_error err = {0};
    rt_pool_config pc = {RT_CACHE_AWARE, 3, 10, 0.25};
    assert_int_equal(rt_routes_new(&pc, &rt, &err), LLM_OK);
    rt_routes_from_kube(rt); /* as the gateway's pods take it */
    assert_int_equal(rt_routes_load(rt, t.routes, strlen(t.routes), &err), LLM_OK);
    rt_route *r = rt_routes_find(rt, "z-m");
    assert_non_null(r);
    assert_true(rt_pool_hold(rt_route_pool(r)) == 60);
    rt_routes_put(rt, r);
    r = rt_routes_find(rt, "o-m");
    assert_true(rt_pool_hold(rt_route_pool(r)) == 0);
    rt_routes_put(rt, r);
    const char *bad = "{\"routes\":[{\"name\":\"x\",\"models\":[\"m\"],\"service\":\"x\",\"holdSeconds\":4000}]}";
    assert_int_equal(rt_routes_load(rt, bad, strlen(bad), &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "holdSeconds"));
    rt_routes_free(rt);
    gateway_table_free(&t);
    json_decref(all);
    json_decref(gw);
}

/* A thousand models and more: the table stops at 1024 routes, the
 * conflicts at 32, the status' models at 256; and at 900 KiB of table. */
static void test_bounds(void **st)
{
    (void)st;
    json_t *gw = gateway("{}"), *all = json_array();
    for (int i = 0; i < 1100; i++) {
        char name[32], served[32];
        snprintf(name, sizeof name, "d%04d", i);
        snprintf(served, sizeof served, "m%04d", i);
        json_array_append_new(all, dep(name, "ns", "a", served, NULL));
    }
    gateway_table t;
    assert_int_equal(gateway_table_make(gw, all, &t), 0);
    assert_int_equal(t.deployments, GATEWAY_MAX_ROUTES);
    assert_int_equal(json_array_size(t.conflicts), GATEWAY_MAX_CONFLICTS);
    assert_non_null(strstr(json_string_value(json_array_get(t.conflicts, 0)), "d1024: the gateway holds 1024"));
    json_t *status = gateway_status(gw, NULL, &t, 0);
    assert_int_equal(json_array_size(json_object_get(status, "models")), GATEWAY_MAX_MODELS_SHOWN);
    assert_int_equal(json_integer_value(json_object_get(status, "modelCount")), GATEWAY_MAX_ROUTES);
    json_decref(status);
    gateway_table_free(&t);
    json_decref(all);
    /* long adapter lists: the table stops short of 900 KiB */
    all = json_array();
    char ads[8000];
    for (int i = 0; i < 400; i++) {
        char name[32], served[32];
        size_t at = (size_t)snprintf(ads, sizeof ads, "\"adapters\":[");
        for (int k = 0; k < 32; k++)
            at += (size_t)snprintf(ads + at, sizeof ads - at, "%s{\"name\":\"d%04d-adapter-with-a-long-name-%02d-%0100d\"}",
                                   k ? "," : "", i, k, 0);
        snprintf(ads + at, sizeof ads - at, "]");
        snprintf(name, sizeof name, "d%04d", i);
        snprintf(served, sizeof served, "m%04d", i);
        json_array_append_new(all, dep(name, "ns", "a", served, ads));
    }
    assert_int_equal(gateway_table_make(gw, all, &t), 0);
    assert_true(strlen(t.routes) <= GATEWAY_MAX_TABLE);
    assert_true(t.deployments > 100 && t.deployments < 400);
    assert_non_null(strstr(json_string_value(json_array_get(t.conflicts, 0)), "would pass 900 KiB"));
    gateway_table_free(&t);
    json_decref(all);
    json_decref(gw);
}

/* The contract with llm-router: every table the controller writes loads
 * there (rt_routes_load), an adapter named as its model included, and the
 * router answers each name with its deployment. */
static void test_router_takes_the_table(void **st)
{
    (void)st;
    json_t *gw = gateway("{}"), *all = json_array();
    json_array_append_new(all, dep("a", "ns", "x", "m-a", "\"adapters\":[{\"name\":\"m-a\"},{\"name\":\"ad\"}]"));
    json_array_append_new(all, dep("b", "ns", "x", "m-b", "\"canary\":{\"steps\":[{\"weight\":5}]}"));
    json_array_append_new(all, dep("c", "ns", "x", "ad", NULL)); /* a's adapter's name: left out */
    gateway_table t;
    assert_int_equal(gateway_table_make(gw, all, &t), 0);
    rt_routes *r;
    llm_error err = {0};
    rt_pool_config pc = {.policy = RT_CACHE_AWARE};
    assert_int_equal(rt_routes_new(&pc, &r, &err), LLM_OK);
    rt_routes_from_kube(r); /* as the gateway's pods take it: from the ConfigMap */
    if (rt_routes_load(r, t.routes, strlen(t.routes), &err))
        fail_msg("the router refuses the controller's table: %s\n%s", err.msg, t.routes);
    static const char *const want[][2] = {{"m-a", "a"}, {"ad", "a"}, {"m-b", "b"}};
    for (int i = 0; i < 3; i++) {
        rt_route *route = rt_routes_find(r, want[i][0]);
        assert_non_null(route);
        assert_string_equal(rt_route_name(route), want[i][1]);
        rt_routes_put(r, route);
    }
    assert_int_equal(rt_routes_count(r), 2);
    rt_routes_free(r);
    gateway_table_free(&t);
    json_decref(all);
    json_decref(gw);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_table), cmocka_unit_test(test_bounds), cmocka_unit_test(test_tenants),
                                       cmocka_unit_test(test_scale_to_zero_route),
                                       cmocka_unit_test(test_router_takes_the_table)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
