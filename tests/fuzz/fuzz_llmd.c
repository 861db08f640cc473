/* fuzz_llmd.c - libFuzzer target for llm-controller's desired state: any
 * JSON as an LLMDeployment's spec (the API server guarantees only the
 * metadata; a schema can be changed or bypassed) must give children or a
 * clear refusal, never a crash, leak or UB (ASan + UBSan); the same for the
 * canary's configuration and objects, and the whole plan (plan.h) with the
 * input's "status" member as the status a previous leader wrote, its
 * "annotations" as kubectl's levers and pod signals made of its bytes: a
 * plan or a refusal with a message (a quality judgement made of its bytes
 * too). Also Kubernetes quantities and the
 * canary analysis's reading of router /metrics from arbitrary text. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "canary.h"
#include "desired.h"
#include "plan.h"

/* a node cache offered, as the chart sets it */
static const desired_site site = {"/var/lib/llm-cache", "llm-controller:0.1.0"};

static void check(json_t *o)
{
    if (o && !json_is_string(json_object_get(json_object_get(o, "metadata"), "name")))
        abort();
    json_decref(o);
}

/* Plans d against its own desired Deployment (what a cache would hold once
 * applied) and against none, with pod signals made of the input. */
static void plan_twice(json_t *d, json_t *dep, const canary_sample *smp, const uint8_t *data, size_t size)
{
    json_t *spec = json_object_get(d, "spec");
    if (json_is_object(json_object_get(spec, "status")))
        json_object_set(d, "status", json_object_get(spec, "status"));
    if (json_is_object(json_object_get(spec, "annotations")))
        json_object_set(json_object_get(d, "metadata"), "annotations", json_object_get(spec, "annotations"));
    podsig_reading r = {.age_s = size % 7, .signal = size ? data[0] : -1, .signal_pods = size > 1 ? data[1] % 5 : 0,
                        .canary_pods = size > 2 ? data[2] % 3 : 0, .canary = *smp};
    snprintf(r.need.metric, sizeof r.need.metric, "%s", size % 2 ? "queueDepth" : "kvCacheUsage");
    r.need.canary = (int)(size % 3);
    r.need.diag = 1;
    r.need.activity = 1;
    r.activity = (autoscale_activity){.routers = (int)(size % 2), .held = size % 5, .requests = (double)size,
                                      .asked = (int)(size % 3), .own = (int)(size % 2)};
    r.canary_asked = (int)(size % 4), r.canary_own = size > 4 ? data[4] % 4 : 0;
    /* a quality judgement made of the input: any revision, stage, outcome and figures (NaN among them) */
    judge_result jr = {.state = size > 5 ? (judge_state)(data[5] % 4) : JUDGE_DONE, .stage = (int)(size % 3),
                       .outcome = (int)(size % 3) - 1, .texts = (int)(size % 9),
                       .sum = {.kl = size > 6 ? (double)data[6] / (data[6] % 3 ? 7.0 : 0.0) : 0, .kl_max = (double)size,
                               .positions = (long)(size % 2000), .top1_same = (long)(size % 1500)}};
    snprintf(jr.rev, sizeof jr.rev, "%s", json_string_value(json_object_get(json_object_get(json_object_get(spec,
             "status"), "canary"), "revision")) ?: "");
    r.admin = (podsig_admin){.valid = 1, .pods = 2, .ready = (int)(size % 3), .failed = size % 11 == 0,
                             .misfit = size % 13 == 0, .weight = (int)(size % 101)};
    snprintf(r.admin.rev, sizeof r.admin.rev, "%s",
             json_string_value(json_object_get(json_object_get(spec, "status"), "canaryRevision")) ?: "");
    /* the Deployments as a cache would hold them: the stable with a status made of the input, a canary
     * that is ours or another's, ready or not */
    json_t *stable = dep ? json_deep_copy(dep) : NULL;
    int n = size > 3 ? data[3] % 4 : 0;
    if (stable)
        json_object_set_new(stable, "status", json_pack("{s:i,s:i,s:i,s:i}", "replicas", n, "readyReplicas", n / 2,
                                                        "updatedReplicas", n, "observedGeneration", (int)(size % 3)));
    json_t *canary = json_pack("{s:{s:s,s:[{s:b,s:s}]},s:{s:i},s:{s:i,s:i,s:i}}", "metadata", "name", "fz-canary",
                               "ownerReferences", "controller", 1, "uid", size % 5 ? "u-1" : "u-2", "spec", "replicas", n,
                               "status", "replicas", n, "readyReplicas", n, "updatedReplicas", n);
    for (int i = 0; i < 3; i++) {
        plan_input in = {.llmd = d, .stable = i ? stable : NULL, .canary = i == 2 ? canary : NULL, .pods = &r,
                         .quality = i ? &jr : NULL,
                         .admin_secret = desired_colocated(d) ? "fz-admin-x" : NULL,
                         .site = i == 1 ? &site : NULL, .now = 1.7e9 + (double)size};
        plan p;
        llm_error err = {0};
        llm_status st = plan_children(&in, &p, &err);
        if (st && !err.msg[0])
            abort(); /* a refusal says why */
        json_t *status = st ? NULL : plan_status(&in, &p, in.stable);
        if (!st && (!status || !json_is_array(p.steps) || !json_array_size(p.steps)))
            abort();
        if (st == LLM_OK && p.requeue_s < 0)
            abort();
        json_decref(status);
        plan_free(&p);
    }
    json_decref(stable);
    json_decref(canary);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    long long q = desired_quantity(text);
    if (q < -1)
        abort();
    canary_sample smp = {0}, win;
    canary_sample_add(&smp, text);
    canary_sample_add(&smp, text);
    canary_sample_add_route(&smp, text, "story"); /* a gateway's page: one route's series */
    canary_sample_diff(&smp, &(canary_sample){0}, &win);
    if (win.n_le > CANARY_MAX_BUCKETS)
        abort();
    json_t *sj = canary_sample_to_json(&smp);
    canary_sample back;
    if (sj && !canary_sample_from_json(sj, &back))
        abort(); /* what it writes, it reads */
    json_decref(sj);
    json_t *spec = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    free(text);
    if (!spec)
        return 0;
    json_t *d = json_pack("{s:s,s:s,s:{s:s,s:s,s:s,s:i},s:o}", "apiVersion", "llmk8s.io/v1alpha1", "kind",
                          "LLMDeployment", "metadata", "name", "fz", "namespace", "default", "uid", "u-1", "generation",
                          1, "spec", spec);
    if (!d)
        return 0;
    char msg[512] = "", hash[17];
    json_t *cm = desired_configmap(d, msg, sizeof msg);
    if (!cm && !msg[0])
        abort(); /* a refusal says why */
    kube_meta_hash(cm, hash);
    check(cm);
    msg[0] = 0;
    json_t *dep = desired_deployment(d, "0123456789abcdef", "x-admin-0123456789", &site, msg, sizeof msg);
    if (!dep && !msg[0])
        abort();
    check(desired_service(d));
    check(desired_pdb(d));
    canary_config cn;
    llm_error err = {0};
    if (canary_config_from_spec(spec, &cn, &err) != LLM_OK && !err.msg[0])
        abort();
    if (cn.enabled && cn.n_steps > 0) {
        canary_analysis a;
        canary_analyse(&cn, &win, &a);
        (void)canary_decide(&cn, 0, 1e9, size % 2 ? 1e9 : 0, a.verdict, 0);
    }
    if (dep && desired_canary_enabled(d)) {
        check(desired_canary_deployment(d, dep, 2));
        check(desired_router(d));
        check(desired_router_weight(d, 50));
    }
    plan_twice(d, dep, &smp, data, size);
    check(dep);
    json_decref(d);
    return 0;
}
