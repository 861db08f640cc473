/* admin_secret.h - the bearer token of llm-server's /admin/canary for one
 * LLMDeployment with a colocated canary: 32 random bytes (64 hex digits,
 * OpenSSL's RAND_bytes) in Secret NAME-admin, key "token", owned by the
 * LLMDeployment (deleted with it). The controller makes it once, mounts it
 * into the pods (desired.c) and reads it back when it calls them, so no
 * one who can read the LLMDeployment, a ConfigMap or the controller's
 * environment can derive it. A Secret of that name that is not this
 * LLMDeployment's (managed-by label and a controller ownerReference to its
 * uid) or whose token is not 64 hex digits is refused, never used or
 * overwritten: LLM_ERR_INVALID_ARG naming the Secret and the rule (the
 * caller says so in an event and retries with back-off; the controller
 * does not watch Secrets).
 *
 * Ownership: llmd is borrowed. Thread-safety: as the client's. */
#ifndef ADMIN_SECRET_H
#define ADMIN_SECRET_H

#include "kube_client.h"

/* Creates the Secret when missing (a concurrent create is read back and
 * judged as any other). */
llm_status admin_secret_ensure(kube_client *k, json_t *llmd, llm_error *err);

/* The token of an existing Secret (LLM_ERR_NOT_FOUND when none yet). */
llm_status admin_secret_token(kube_client *k, json_t *llmd, char out[65], llm_error *err);

#endif
