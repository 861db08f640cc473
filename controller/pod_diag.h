/* pod_diag.h - why an LLMDeployment's pods are not all ready, in words a
 * human can act on: read from the pods' own status (scheduler, image pull,
 * restarts) and from llm-server's /startupz on the running pods (load
 * progress, or the load error naming the file).
 *
 * Reasons, most serious first: ModelNotFound, ModelChecksumMismatch,
 * ModelAccessDenied, ModelDownloadFailed (a source's download: the
 * reason /startupz names), EngineFailed, ConfigError (a missing Secret or
 * ConfigMap), ImagePullFailed, CrashLooping (all "degraded": they will
 * not fix themselves), then Unschedulable, WaitingForGPU, Downloading
 * (with the progress), EngineLoading.
 *
 * Pure: the pods and their pages are read by podsig.h's thread; this
 * only judges them. Ownership: fills a caller-owned struct; inputs are
 * borrowed. Thread-safety: reentrant. */
#ifndef POD_DIAG_H
#define POD_DIAG_H

#include <jansson.h>

typedef struct pod_diag {
    int severity;        /* 0: nothing found */
    int degraded;        /* the reason will not go away by waiting */
    int unscheduled;     /* pods wait for a node (GPU or otherwise) */
    char reason[48];
    char message[1024];  /* "pod NAME: ..." */
} pod_diag;

/* 1 when pod's /startupz is worth reading: it has an IP, a running
 * container and is not terminating. */
int pod_diag_wants_startupz(json_t *pod);

/* The most serious reason among pods (a list's items) and the /startupz
 * answers of some of them (startupz: pod name -> its parsed body; may be
 * NULL or empty). */
void pod_diag_judge(json_t *pods, json_t *startupz, pod_diag *out);

/* 1 when reason is one the engine itself reported (load failures); such a
 * reason outlives the restarts that follow it. */
int pod_diag_is_engine_failure(const char *reason);

#endif
