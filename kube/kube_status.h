/* kube_status.h - the API server's refusals as statuses, in the values the
 * project's enum keeps free for the Kubernetes client (llm/status.h): the
 * engine's codes carry no Kubernetes meaning, and these pass through
 * llm_status unchanged. Header only. */
#ifndef KUBE_STATUS_H
#define KUBE_STATUS_H

#include "llm/status.h"

#define KUBE_ERR_CONFLICT ((llm_status)15)  /* 409: stale resourceVersion, or already exists */
#define KUBE_ERR_GONE ((llm_status)16)      /* 410: resourceVersion too old (relist) */
#define KUBE_ERR_FORBIDDEN ((llm_status)17) /* 401/403: credentials or RBAC */
#define KUBE_ERR_EXISTS ((llm_status)19)    /* the name is taken by an object that is not ours (kube_apply.h) */

#endif
