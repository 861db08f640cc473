/* pod_diag.c - reasons pods are not ready; see pod_diag.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pod_diag.h"

#include "kube_json.h"

enum {
    S_LOADING = 1,
    S_DOWNLOADING,
    S_WAIT_GPU,
    S_UNSCHEDULABLE,
    S_CRASHLOOP,
    S_IMAGE,
    S_CONFIG,
    S_ENGINE,
    S_DOWNLOAD_FAILED,
    S_DENIED,
    S_CHECKSUM,
    S_NOT_FOUND,
    S_DEGRADED_FROM = S_CRASHLOOP
};

static void offer(pod_diag *d, int severity, const char *reason, const char *pod, const char *fmt, const char *x,
                  const char *y)
{
    if (severity <= d->severity)
        return;
    d->severity = severity;
    d->degraded = severity >= S_DEGRADED_FROM;
    d->unscheduled = severity == S_WAIT_GPU || severity == S_UNSCHEDULABLE;
    snprintf(d->reason, sizeof d->reason, "%s", reason);
    int n = snprintf(d->message, sizeof d->message, "pod %s: ", pod);
    if (n > 0 && (size_t)n < sizeof d->message)
        snprintf(d->message + n, sizeof d->message - (size_t)n, fmt, x ? x : "", y ? y : "");
}

static void scheduling(json_t *pod, const char *name, pod_diag *d)
{
    json_t *conds = kube_json_get(pod, "status", "conditions");
    for (size_t i = 0; i < json_array_size(conds); i++) {
        json_t *c = json_array_get(conds, i);
        const char *type = json_string_value(json_object_get(c, "type"));
        const char *st = json_string_value(json_object_get(c, "status"));
        const char *msg = json_string_value(json_object_get(c, "message"));
        if (type && st && !strcmp(type, "PodScheduled") && !strcmp(st, "False")) {
            int gpu = msg && strstr(msg, "nvidia.com/gpu");
            offer(d, gpu ? S_WAIT_GPU : S_UNSCHEDULABLE, gpu ? "WaitingForGPU" : "Unschedulable", name,
                  "not scheduled: %s", msg ? msg : "no node fits", NULL);
        }
    }
}

/* Image pulls and restarts, from the first container's status. */
static void container(json_t *pod, const char *name, pod_diag *d)
{
    json_t *cs = json_array_get(kube_json_get(pod, "status", "containerStatuses"), 0);
    const char *wait = kube_json_str(json_object_get(cs, "state"), "waiting", "reason");
    const char *wmsg = kube_json_str(json_object_get(cs, "state"), "waiting", "message");
    if (wait && (!strcmp(wait, "ErrImagePull") || !strcmp(wait, "ImagePullBackOff") || !strcmp(wait, "InvalidImageName")))
        offer(d, S_IMAGE, "ImagePullFailed", name, "%s: %s", wait, wmsg);
    if (wait && (!strcmp(wait, "CreateContainerConfigError") || !strcmp(wait, "ContainerCreating")) && wmsg)
        offer(d, S_CONFIG, "ConfigError", name, "%s: %s", wait, wmsg); /* a missing Secret or ConfigMap */
    json_int_t restarts = json_integer_value(json_object_get(cs, "restartCount"));
    json_t *last = kube_json_get(cs, "lastState", "terminated");
    if (restarts > 0 && last && !json_is_true(json_object_get(cs, "ready"))) {
        char what[512];
        snprintf(what, sizeof what, "restarted %lld times; last exit: %s (exit code %lld)", (long long)restarts,
                 json_string_value(json_object_get(last, "reason")) ? json_string_value(json_object_get(last, "reason")) : "unknown",
                 (long long)json_integer_value(json_object_get(last, "exitCode")));
        const char *m = json_string_value(json_object_get(last, "message"));
        offer(d, S_CRASHLOOP, "CrashLooping", name, m ? "%s: %s" : "%s", what, m);
    }
}

/* What llm-server says of its load (/startupz; any status: a failed load
 * answers 503). */
static void engine(json_t *st, const char *name, pod_diag *d)
{
    static const struct { const char *reason; int severity; } fetch[] = {
        {"ModelNotFound", S_NOT_FOUND}, {"ModelChecksumMismatch", S_CHECKSUM}, {"ModelAccessDenied", S_DENIED},
        {"ModelDownloadFailed", S_DOWNLOAD_FAILED}};
    const char *phase = json_string_value(json_object_get(st, "phase"));
    const char *detail = json_string_value(json_object_get(st, "detail"));
    const char *reason = json_string_value(json_object_get(st, "reason")); /* a download's failure */
    for (size_t i = 0; phase && detail && reason && !strcmp(phase, "failed") && i < sizeof fetch / sizeof *fetch; i++)
        if (!strcmp(reason, fetch[i].reason)) {
            offer(d, fetch[i].severity, fetch[i].reason, name, "%s", detail, NULL);
            return;
        }
    if (phase && detail && !strcmp(phase, "downloading")) {
        offer(d, S_DOWNLOADING, "Downloading", name, "%s", detail, NULL);
    } else if (phase && detail && !strcmp(phase, "failed")) {
        int missing = strstr(detail, "No such file") || strstr(detail, "cannot open");
        int checksum = strstr(detail, "sha256") != NULL;
        offer(d, missing ? S_NOT_FOUND : checksum ? S_CHECKSUM : S_ENGINE,
              missing ? "ModelNotFound" : checksum ? "ModelChecksumMismatch" : "EngineFailed", name, "%s", detail, NULL);
    } else if (phase && detail && !strcmp(phase, "loading")) {
        offer(d, S_LOADING, "EngineLoading", name, "%s", detail, NULL);
    }
}

int pod_diag_wants_startupz(json_t *pod)
{
    json_t *cs = json_array_get(kube_json_get(pod, "status", "containerStatuses"), 0);
    return kube_json_str(pod, "status", "podIP") && kube_json_str(pod, "metadata", "name") && !kube_json_get(pod, "metadata", "deletionTimestamp") &&
           json_object_get(json_object_get(cs, "state"), "running");
}

void pod_diag_judge(json_t *pods, json_t *startupz, pod_diag *out)
{
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < json_array_size(pods); i++) {
        json_t *p = json_array_get(pods, i);
        const char *name = kube_json_str(p, "metadata", "name");
        if (!name || kube_json_get(p, "metadata", "deletionTimestamp"))
            continue;
        scheduling(p, name, out);
        container(p, name, out);
    }
    const char *name;
    json_t *body;
    json_object_foreach(startupz, name, body)
        if (out->severity < S_ENGINE)
            engine(body, name, out);
}

int pod_diag_is_engine_failure(const char *reason)
{
    return reason && (!strcmp(reason, "ModelNotFound") || !strcmp(reason, "ModelChecksumMismatch") ||
                      !strcmp(reason, "ModelAccessDenied") || !strcmp(reason, "ModelDownloadFailed") ||
                      !strcmp(reason, "EngineFailed"));
}
