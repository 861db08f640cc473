/* pod_diag.h - why an LLMDeployment's pods are not all ready, in words a
 * human can act on: read from the pods' own status (scheduler, image pull,
 * restarts) and from llm-server's /startupz on the running pods (load
 * progress, or the load error naming the file).
 *
 * Reasons, most serious first: ModelNotFound, ModelChecksumMismatch,
 * EngineFailed, ConfigError (a missing Secret or ConfigMap),
 * ImagePullFailed, CrashLooping (all "degraded": they will not fix
 * themselves), then Unschedulable, WaitingForGPU, EngineLoading.
 *
 * Ownership: fills a caller-owned struct. Thread-safety: reentrant; it
 * makes one list request (pods with the instance and our managed-by
 * label), then asks up to 64 running pods' /startupz at once, within 1 s
 * for all of them. */
#ifndef POD_DIAG_H
#define POD_DIAG_H

#include "kube_client.h"

typedef struct pod_diag {
    int severity;        /* 0: nothing found */
    int degraded;        /* the reason will not go away by waiting */
    int unscheduled;     /* pods wait for a node (GPU or otherwise) */
    char reason[48];
    char message[1024];  /* "pod NAME: ..." */
} pod_diag;

void pod_diag_examine(kube_client *k, const char *ns, const char *instance, long long port, pod_diag *out);

/* 1 when reason is one the engine itself reported (load failures); such a
 * reason outlives the restarts that follow it. */
int pod_diag_is_engine_failure(const char *reason);

#endif
