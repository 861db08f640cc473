/* reconcile.c - one LLMDeployment observed, planned (plan.h) and acted on;
 * see reconcile.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/crypto.h>

#include "llm/json.h"
#include "adapters.h"
#include "admin_secret.h"
#include "chat_template.h"
#include "ctl_obs.h"
#include "desired.h"
#include "http_client.h"
#include "kube_apply.h"
#include "ctl_event.h"
#include "kube_json.h"
#include "kube_meta.h"
#include "llm/clock.h"
#include "plan.h"
#include "ctl_status.h"
#include "judge_texts.h"
#include "reconcile.h"

#define API "/apis/llmk8s.io/v1alpha1"
#define ADMIN_BUDGET_MS 3000 /* every pod's /admin/canary answer together */
#define ADMIN_PODS 1024
#define ADMIN_ANSWER_MAX 4096 /* {"state","model","weight","message"}: a pod's longer answer is no answer */
#define REFUSED_LOOK_S 15     /* a spec refused for what others hold (a child's name, the template's ConfigMap):
                               * looked at again after this long */

/* ---- observe ------------------------------------------------------------------------------ */

typedef struct seen {
    json_t *d, *stable, *canary;
    char admin_name[300], token[65];
    podsig_reading pods;
    judge_result quality;
} seen;

static void seen_free(seen *o)
{
    json_decref(o->d);
    json_decref(o->stable);
    json_decref(o->canary);
}

/* A read whose "not there" is an answer. */
static llm_status read_opt(kube_client *k, const char *path, json_t **out, llm_error *err)
{
    llm_status st = kube_apply_read(k, path, out, err);
    return st == LLM_ERR_NOT_FOUND ? LLM_OK : st;
}

/* Everything the plan reads besides the LLMDeployment: its Deployments
 * (the informers' copies: no request at rest), the colocated canary's key,
 * the pods' signals (the last round's: no wait). */
static llm_status observe(kube_client *k, podsig *ps, judge *jg, const char *key, seen *o, llm_error *err)
{
    const char *ns = kube_json_str(o->d, "metadata", "namespace"), *name = kube_json_str(o->d, "metadata", "name");
    char path[1024];
    snprintf(path, sizeof path, "/apis/apps/v1/namespaces/%s/deployments/%s", ns, name);
    llm_status st = read_opt(k, path, &o->stable, err);
    snprintf(path, sizeof path, "/apis/apps/v1/namespaces/%s/deployments/%s-canary", ns, name);
    if (!st && desired_canary_enabled(o->d)) /* a failed read is not "no canary pods": the analysis would judge none */
        st = read_opt(k, path, &o->canary, err);
    if (!st && desired_admin(o->d) && (st = admin_secret_derive(k, o->d, o->admin_name, o->token, err)) == LLM_ERR_INVALID_ARG) {
        /* the key Secret spoilt: said, and retried with back-off until it is mended (INVALID_ARG would stop
         * retries until the spec changes) */
        ctl_event(k, o->d, "Warning", "AdminKeyInvalid", "%s", err->msg);
        st = KUBE_ERR_FORBIDDEN;
    }
    podsig_read(ps, key, &o->pods);
    if (jg)
        judge_read(jg, key, &o->quality);
    return st;
}

/* ---- act ---------------------------------------------------------------------------------- */

static void post_events(kube_client *k, json_t *d, json_t *events)
{
    for (size_t i = 0; i < json_array_size(events); i++) {
        json_t *e = json_array_get(events, i);
        ctl_event(k, d, kube_json_str(e, "type", NULL), kube_json_str(e, "reason", NULL), "%s", kube_json_str(e, "message", NULL));
    }
}

/* The answers, counted. */
static void admin_answers(podsig_admin *a, char (*urls)[128], size_t n, const long *codes, char **bodies)
{
    for (size_t i = 0; i < n; i++) {
        json_t *j = codes[i] ? llm_json_loads(bodies[i], 0, NULL) : NULL;
        const char *state = kube_json_str(j, "state", NULL), *msg = kube_json_str(j, "message", NULL);
        int ok = codes[i] == 200 && state;
        a->answered += codes[i] == 200;
        a->ready += ok && !strcmp(state, "ready");
        a->failed += ok && !strcmp(state, "failed");
        a->misfit += ok && !strcmp(state, "does_not_fit");
        if (ok && msg && (!strcmp(state, "failed") || !strcmp(state, "does_not_fit")))
            snprintf(a->message, sizeof a->message, "pod %.100s: %.400s", urls[i] + 7, msg);
        else if (codes[i] != 200 && !a->message[0])
            snprintf(a->message, sizeof a->message, "pod %.100s: /admin/canary answered %ld", urls[i] + 7, codes[i]);
        json_decref(j);
        free(bodies[i]);
    }
}

/* The controlling entry of o's ownerReferences ({kind, name, uid}), or NULL. */
static json_t *controller_of(json_t *o)
{
    json_t *refs = kube_json_get(o, "metadata", "ownerReferences", NULL), *r;
    size_t i;
    json_array_foreach(refs, i, r) if (json_is_true(json_object_get(r, "controller"))) return r;
    return NULL;
}

/* 1 when o's controller is the kind kind of uid uid. */
static int controlled_by(json_t *o, const char *kind, const char *uid)
{
    json_t *r = controller_of(o);
    const char *k = json_string_value(json_object_get(r, "kind")), *u = json_string_value(json_object_get(r, "uid"));
    return k && u && uid && !strcmp(k, kind) && !strcmp(u, uid);
}

/* dep's uid when the LLMDeployment d controls it, else NULL. */
static const char *ours(json_t *d, json_t *dep)
{
    return controlled_by(dep, "LLMDeployment", kube_json_str(d, "metadata", "uid")) ? kube_json_str(dep, "metadata", "uid")
                                                                                     : NULL;
}

/* 1 when pod belongs to the Deployment of uid dep_uid: controlled by a
 * ReplicaSet that it controls (read here; the pod's reference must name
 * that ReplicaSet's uid).
 * Labels alone are anyone's who may create pods in the namespace: the
 * admin token goes only where this chain leads. */
static int pod_of(kube_client *k, json_t *pod, const char *ns, const char *dep_uid, json_t *seen_rs)
{
    json_t *by = controller_of(pod);
    const char *kind = json_string_value(json_object_get(by, "kind")), *uid = json_string_value(json_object_get(by, "uid"));
    const char *rs_name = json_string_value(json_object_get(by, "name"));
    if (!kind || !uid || !dep_uid) /* (a pod a Deployment itself claims is none of its: ownerReferences are anyone's) */
        return 0;
    char path[700], memo[600];
    if (strcmp(kind, "ReplicaSet") || !rs_name ||
        snprintf(memo, sizeof memo, "%s/%s", rs_name, uid) >= (int)sizeof memo ||
        snprintf(path, sizeof path, "/apis/apps/v1/namespaces/%s/replicasets/%s", ns, rs_name) >= (int)sizeof path)
        return 0;
    json_t *known = json_object_get(seen_rs, memo), *rs = NULL; /* one read per ReplicaSet and call */
    if (known)
        return json_is_true(known);
    llm_error err = {0};
    int ok = !kube_client_request(k, "GET", path, NULL, NULL, &rs, &err) &&
             !strcmp(kube_json_str(rs, "metadata", "uid") ?: "", uid) && controlled_by(rs, "Deployment", dep_uid);
    json_decref(rs);
    json_object_set_new(seen_rs, memo, json_boolean(ok));
    return ok;
}

/* The base URLs ("http://IP:PORT") of the serving pods of instance
 * NAME+suffix (suffix "" or "-canary") that belong to the Deployment of
 * uid dep_uid (pod_of; NULL: none do), at most max of them: 0 and the
 * count, or -1 with msg saying why. */
static int serving_pods(kube_client *k, json_t *d, const char *suffix, const char *dep_uid, char (*urls)[128],
                        char (*names)[ADAPTERS_POD_NAME], int max, int *n, char *msg, size_t mn)
{
    char path[768];
    /* the servers of this LLMDeployment alone: LLMDeployment NAME's routers are instance NAME-router too */
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/pods?labelSelector=" DESIRED_INSTANCE "%%3D%s%s%%2C" DESIRED_MANAGED_BY
             "%%3D" DESIRED_CONTROLLER "%%2C" DESIRED_APP "%%3Dllm-server", kube_json_str(d, "metadata", "namespace"),
             kube_json_str(d, "metadata", "name"), suffix);
    json_t *pods = NULL;
    llm_error err = {0};
    *n = 0;
    if (kube_client_request(k, "GET", path, NULL, NULL, &pods, &err)) {
        snprintf(msg, mn, "cannot list the pods: %.400s", err.msg);
        return -1;
    }
    json_t *items = json_object_get(pods, "items"), *seen_rs = json_object();
    for (size_t i = 0; seen_rs && i < json_array_size(items) && *n < max; i++) {
        json_t *pod = json_array_get(items, i);
        const char *ip = kube_json_str(pod, "status", "podIP");
        int v6 = ip && strchr(ip, ':');
        /* not a host-network pod: its IP is the node's, whatever listens there would get the token */
        if (podsig_pod_serving(pod) && !json_is_true(kube_json_get(json_object_get(pod, "spec"), "hostNetwork", NULL)) &&
            pod_of(k, pod, kube_json_str(d, "metadata", "namespace"), dep_uid, seen_rs) &&
            snprintf(urls[*n], 128, "http://%s%s%s:%lld", v6 ? "[" : "", ip, v6 ? "]" : "", desired_server_port(d)) < 100) {
            if (names) /* a pod's name is at most 253 bytes (a DNS subdomain) */
                snprintf(names[*n], ADAPTERS_POD_NAME, "%s", kube_json_str(pod, "metadata", "name") ?: "");
            (*n)++;
        }
    }
    json_decref(seen_rs);
    json_decref(pods);
    return 0;
}

/* The plan's /admin/canary call on every ready stable pod at once; their
 * answers are remembered for the next plan. */
static void admin_call(kube_client *k, podsig *ps, const char *key, seen *o, const plan *p)
{
    json_t *d = o->d, *m = kube_json_get(d, "spec", "model");
    podsig_admin a = {.valid = 1, .weight = p->ro.admin_weight, .unload = p->ro.admin == 2};
    snprintf(a.rev, sizeof a.rev, "%s", kube_json_str(p->ro.state, "revision", NULL) ?: "");
    json_t *req = json_pack("{s:o,s:i}", "model", a.unload ? json_null() : json_incref(json_object_get(m, "path")),
                            "weight", a.weight);
    if (req && !a.unload && json_is_string(json_object_get(m, "sha256")))
        json_object_set(req, "sha256", json_object_get(m, "sha256"));
    char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
    json_decref(req);
    char(*urls)[128] = calloc(ADMIN_PODS, 128);
    const char **up = calloc(ADMIN_PODS, sizeof *up);
    long *codes = calloc(ADMIN_PODS, sizeof *codes);
    char **bodies = calloc(ADMIN_PODS, sizeof *bodies);
    if (!o->token[0]) { /* colocation turned off meanwhile: no key derived, nothing to say it with */
        snprintf(a.message, sizeof a.message, "no admin key: spec.canary.mode is no longer colocated");
    } else if (!body || !urls || !up || !codes || !bodies) {
        snprintf(a.message, sizeof a.message, "no memory to call the pods");
    } else if (!serving_pods(k, d, "", ours(o->d, o->stable), urls, NULL, ADMIN_PODS, &a.pods, a.message, sizeof a.message)) {
        for (int i = 0; i < a.pods; i++) {
            size_t len = strlen(urls[i]); /* under 100: serving_pods keeps them so */
            snprintf(urls[i] + len, 128 - len, "/admin/canary");
            up[i] = urls[i];
        }
        http_client_many(up, (size_t)a.pods, o->token, body, ADMIN_BUDGET_MS, ADMIN_ANSWER_MAX, codes, bodies);
        admin_answers(&a, urls, (size_t)a.pods, codes, bodies);
    }
    podsig_note_admin(ps, key, &a);
    free(body);
    free(urls);
    free(up);
    free(codes);
    free(bodies);
}

/* The texts the quality gate reads: the spec's ConfigMap's, else the
 * built-in set; NULL with why. */
static json_t *quality_texts(kube_client *k, json_t *d, const canary_quality *q, char *why, size_t wn)
{
    if (!q->config_map[0]) {
        json_t *t = judge_texts_builtin();
        if (!t)
            snprintf(why, wn, "no memory for the texts");
        return t;
    }
    char path[600], w[300] = "";
    json_t *cm = NULL;
    llm_error err = {0};
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/configmaps/%s", kube_json_str(d, "metadata", "namespace"), q->config_map);
    json_t *t = kube_client_request(k, "GET", path, NULL, NULL, &cm, &err) ? NULL : judge_texts_from_configmap(cm, w, sizeof w);
    if (!t)
        snprintf(why, wn, "ConfigMap %.200s (spec.canary.analysis.quality.texts): %.200s", q->config_map, err.msg[0] ? err.msg : w);
    json_decref(cm);
    return t;
}

/* The first serving pod of instance NAME+suffix owned by dep_uid's
 * Deployment into url: 0, or -1 with why (the listing's own words, or
 * that none serves). */
static int one_pod(kube_client *k, json_t *d, const char *suffix, const char *dep_uid, char url[128], char *why, size_t wn)
{
    char urls[1][128];
    int n = 0;
    if (serving_pods(k, d, suffix, dep_uid, urls, NULL, 1, &n, why, wn))
        return -1;
    if (!n) {
        snprintf(why, wn, "no %s pod serves", *suffix ? "canary" : "stable");
        return -1;
    }
    snprintf(url, 128, "%s", urls[0]);
    return 0;
}

/* The plan's quality judgement (rollout.h): one serving stable pod and one
 * canary pod (the same pod for a colocated canary) read the texts. Asked
 * again each turn while it waits, with the pods that serve now: a job
 * whose pods went is replaced (judge_want), so the token never follows an
 * address a gone pod left; the texts are read (a ConfigMap GET) only for a
 * job the judge takes. What cannot start (no pod, no key, no texts) is
 * a failed read, tried again. */
static void quality_ask(kube_client *k, judge *jg, const char *key, seen *o, const plan *p)
{
    const canary_quality *q = &p->ro.cn.quality;
    int colocated = !strcmp(kube_json_str(p->ro.state, "mode", NULL) ?: "", "colocated");
    judge_job job = {.stage = p->ro.need_quality, .top = q->top, .min_positions = q->min_positions, .timeout_s = q->timeout_s};
    char why[512] = "";
    snprintf(job.rev, sizeof job.rev, "%s", kube_json_str(p->ro.state, "revision", NULL) ?: "");
    snprintf(job.token, sizeof job.token, "%s", o->token);
    snprintf(job.side[0].revision, sizeof job.side[0].revision, "stable");
    snprintf(job.side[1].revision, sizeof job.side[1].revision, "%s", colocated ? "canary" : "stable");
    if (!o->token[0])
        snprintf(why, sizeof why, "no admin key to read the pods with");
    else if (!one_pod(k, o->d, "", ours(o->d, o->stable), job.side[0].url, why, sizeof why)) {
        if (colocated)
            snprintf(job.side[1].url, sizeof job.side[1].url, "%s", job.side[0].url);
        else
            one_pod(k, o->d, "-canary", ours(o->d, o->canary), job.side[1].url, why, sizeof why);
    }
    if (!why[0] && !judge_wants(jg, key, &job)) { /* asked again while it waits: the texts' ConfigMap is not read */
        OPENSSL_cleanse(job.token, sizeof job.token);
        return;
    }
    if (!why[0])
        job.texts = quality_texts(k, o->d, q, why, sizeof why);
    llm_error err = {0};
    if (why[0])
        judge_refuse(jg, key, job.rev, job.stage, why);
    else if (judge_want(jg, key, &job, &err))
        ctl_obs_log(CTL_ERROR, "cannot judge a canary", "key", key, "error", err.msg, (const char *)NULL);
    OPENSSL_cleanse(job.token, sizeof job.token);
}

/* spec.adapters applied to the serving pods (adapters.h), its status into
 * status; *requeue_s set while pods differ from the spec. Without
 * spec.adapters, status.adapters goes (null in the merge patch). */
static llm_status adapters_round(kube_client *k, seen *o, json_t *status, double now, double *requeue_s, llm_error *err)
{
    if (!desired_adapters(o->d)) {
        int was = kube_json_get(o->d, "status", "adapters") || kube_json_get(o->d, "status", "podAdapters");
        return was && (json_object_set_new(status, "adapters", json_null()) ||
                       json_object_set_new(status, "podAdapters", json_null()))
                   ? llm_errf(err, LLM_ERR_NOMEM, "no memory for the status")
                   : LLM_OK;
    }
    adapters_view v = {0};
    char(*urls)[128] = calloc(ADMIN_PODS, 128), ts[32];
    char(*names)[ADAPTERS_POD_NAME] = calloc(ADMIN_PODS, ADAPTERS_POD_NAME);
    int n = 0;
    if (!urls || !names)
        snprintf(v.message, sizeof v.message, "no memory to call the pods");
    else if (!o->token[0])
        snprintf(v.message, sizeof v.message, "no admin key yet");
    else if (!serving_pods(k, o->d, "", ours(o->d, o->stable), urls, names, ADMIN_PODS, &n, v.message, sizeof v.message))
        adapters_sync(o->d, urls, names, n, o->token, &v);
    llm_clock_rfc3339(now, ts);
    adapters_status(o->d, &v, status, ts);
    if (!v.done)
        *requeue_s = 10;
    adapters_view_free(&v);
    free(urls);
    free(names);
    return LLM_OK;
}

/* The one-shot canary action is removed once done (pause stays until
 * resumed). A failure fails the reconcile: the lever stays, and the next
 * plan asks again. */
static llm_status clear_action(kube_client *k, const char *path, llm_error *err)
{
    json_t *patch = json_pack("{s:{s:{s:n}}}", "metadata", "annotations", ROLLOUT_ACTION_ANN);
    llm_status st = patch ? kube_client_request(k, "PATCH", path, patch, "application/merge-patch+json", NULL, err)
                          : llm_errf(err, LLM_ERR_NOMEM, "no memory to remove %s", ROLLOUT_ACTION_ANN);
    json_decref(patch);
    return st;
}

/* The plan's steps in order; *dep_now: the Deployment NAME as the apply
 * left it. */
static llm_status act(kube_client *k, seen *o, const plan *p, json_t **dep_now, llm_error *err)
{
    const char *uid = kube_json_str(o->d, "metadata", "uid");
    llm_status st = LLM_OK;
    for (size_t i = 0; i < json_array_size(p->steps) && !st; i++) {
        json_t *s = json_array_get(p->steps, i);
        const char *op = kube_json_str(s, "op", NULL);
        kube_applied did = KUBE_SAME;
        if (!strcmp(op, "adminSecret")) {
            st = admin_secret_ensure(k, o->d, err);
        } else if (!strcmp(op, "remove")) {
            st = kube_apply_remove_ours(k, kube_json_str(s, "path", NULL), uid, err);
        } else if (json_is_true(json_object_get(s, "stable"))) {
            st = kube_apply_over(k, kube_json_str(s, "collection", NULL), json_object_get(s, "object"), o->stable, &did, dep_now, err);
        } else {
            st = kube_apply(k, kube_json_str(s, "collection", NULL), json_object_get(s, "object"), &did, err);
        }
        if (!st && did == KUBE_CREATED && kube_json_str(s, "created", NULL))
            ctl_event(k, o->d, "Normal", "Created", "%s", kube_json_str(s, "created", NULL));
        else if (!st && (did == KUBE_UPDATED || did == KUBE_TAKEN_BACK))
            post_events(k, o->d, json_object_get(s, "updated"));
        if (!st && did == KUBE_TAKEN_BACK) /* whose edit was undone, in the API server's words */
            ctl_event(k, o->d, "Warning", "FieldsTakenBack", "%s %s: %s",
                      kube_json_str(json_object_get(s, "object"), "kind", NULL) ?: "object",
                      kube_json_str(kube_json_get(json_object_get(s, "object"), "metadata", NULL), "name", NULL) ?: "?", err->msg);
    }
    return st;
}

/* A child that cannot be written - a spec the API server refused for it
 * (InvalidSpec), an object of its name that is not ours (ChildConflict):
 * say so in the status. */
static llm_status child_refused(kube_client *k, const char *path, const plan_input *in, const char *reason,
                                const char *why, llm_error *err)
{
    json_t *events = json_array();
    json_t *want = events ? plan_refused(in, reason, why, events) : NULL;
    llm_status st = want ? ctl_status_write(k, path, in->llmd, want, err) : llm_errf(err, LLM_ERR_NOMEM, "no memory");
    if (!st)
        post_events(k, in->llmd, events);
    json_decref(want);
    json_decref(events);
    return st;
}

/* spec.chatTemplate's ConfigMap admitted (chat_template.h) when a revision
 * would mount one no Deployment mounts yet: LLM_OK, LLM_ERR_INVALID_ARG
 * with why it is refused, or the read's error (tried again). */
static llm_status template_admitted(kube_client *k, const seen *o, llm_error *err)
{
    json_t *deps[] = {o->stable, o->canary}, *cm = NULL;
    const char *name, *key;
    if (!chat_template_wanted(o->d, deps, 2) || !chat_template_of(o->d, &name, &key))
        return LLM_OK;
    if (!kube_meta_name_ok(name)) /* (the CRD's pattern says so too; it goes into the path) */
        return llm_errf(err, LLM_ERR_INVALID_ARG, "spec.chatTemplate.configMap: not a ConfigMap's name (a DNS subdomain)");
    char path[600], why[1024];
    snprintf(path, sizeof path, "/api/v1/namespaces/%s/configmaps/%s", kube_json_str(o->d, "metadata", "namespace"), name);
    llm_status st = kube_client_request(k, "GET", path, NULL, NULL, &cm, err);
    if (st && st != LLM_ERR_NOT_FOUND)
        return st;
    st = chat_template_admit(st ? NULL : cm, name, key, why, sizeof why) ? llm_errf(err, LLM_ERR_INVALID_ARG, "%s", why)
                                                                          : LLM_OK;
    json_decref(cm);
    return st;
}

/* Plan, act, and the status the result gives. */
static llm_status plan_and_act(kube_client *k, podsig *ps, judge *jg, const desired_site *site, const char *key,
                               const char *path, seen *o, double *requeue_s, llm_error *err)
{
    plan_input in = {.llmd = o->d, .stable = o->stable, .canary = o->canary,
                     .admin_secret = o->admin_name[0] ? o->admin_name : NULL, .site = site,
                     .pods = &o->pods, .quality = jg ? &o->quality : NULL, .now = (double)time(NULL)};
    plan p;
    json_t *dep_now = NULL, *status = NULL;
    double adapter_requeue = 0;
    llm_status st = template_admitted(k, o, err);
    if (st == LLM_ERR_INVALID_ARG) { /* the old revision goes on serving; looked at again until it passes */
        *requeue_s = REFUSED_LOOK_S;
        return child_refused(k, path, &in, "ChatTemplateRefused", err->msg, err);
    }
    if (st)
        return st;
    st = plan_children(&in, &p, err);
    if (!st)
        st = act(k, o, &p, &dep_now, err);
    if (st == LLM_ERR_INVALID_ARG) { /* the spec, not the moment: no retry until it changes */
        st = child_refused(k, path, &in, "InvalidSpec", err->msg, err);
    } else if (st == KUBE_ERR_EXISTS) { /* a foreign object holds a child's name */
        st = child_refused(k, path, &in, "ChildConflict", err->msg, err);
        *requeue_s = REFUSED_LOOK_S; /* until its owner removes it */
    } else if (!st && !(status = plan_status(&in, &p, dep_now ? dep_now : o->stable))) {
        st = llm_errf(err, LLM_ERR_NOMEM, "%s: cannot build the status", key);
    } else if (!st && !(st = adapters_round(k, o, status, in.now, &adapter_requeue, err)) &&
               !(st = ctl_status_write(k, path, o->d, status, err))) {
        /* once the decisions are recorded (a failed write makes them again): their events, the pods' part,
         * the lever's removal */
        post_events(k, o->d, p.events);
        if (p.ro.admin)
            admin_call(k, ps, key, o, &p);
        if (jg && p.ro.need_quality)
            quality_ask(k, jg, key, o, &p);
        else if (jg && !rollout_in_flight(p.ro.state)) /* no canary: its judgement's memory goes (one in flight keeps
                                                        * a job running between two turns that do not ask) */
            judge_forget(jg, key);
        *requeue_s = p.requeue_s;
        if (adapter_requeue > 0 && (*requeue_s <= 0 || *requeue_s > adapter_requeue))
            *requeue_s = adapter_requeue;
        st = podsig_want(ps, key, &p.need, err);
        if (!st && p.ro.clear_action)
            st = clear_action(k, path, err);
    }
    json_decref(status);
    json_decref(dep_now);
    plan_free(&p);
    return st;
}

llm_status reconcile_run(kube_client *k, podsig *ps, judge *jg, const desired_site *site, const char *ns, const char *name,
                         double *requeue_s, llm_error *err)
{
    *requeue_s = 0;
    char path[1024], key[640];
    snprintf(path, sizeof path, API "/namespaces/%s/llmdeployments/%s", ns, name);
    snprintf(key, sizeof key, "%s/%s", ns, name);
    seen o = {0};
    llm_status st = kube_apply_read(k, path, &o.d, err); /* (the informers' copies: no request at rest) */
    if (st == LLM_ERR_NOT_FOUND) {
        podsig_forget(ps, key);
        if (jg)
            judge_forget(jg, key);
        return st; /* deleted: its children go with it (ownerReferences) */
    }
    if (!st && !kube_json_get(o.d, "metadata", "deletionTimestamp") && !(st = observe(k, ps, jg, key, &o, err)))
        st = plan_and_act(k, ps, jg, site, key, path, &o, requeue_s, err);
    if (st == LLM_ERR_NOT_FOUND) /* a 404 past the first read is a failure (an API not served), not "gone" */
        st = llm_errf(err, LLM_ERR_UNSUPPORTED, "%s", err->msg);
    seen_free(&o);
    return st;
}
