/* admin_secret.h - the bearer token of llm-server's admin routes
 * (/admin/canary, the adapter routes) for an LLMDeployment with a
 * colocated canary or spec.adapters, without the controller holding a
 * cluster-wide right to read Secrets.
 *
 * The controller keeps one random 32-byte key in a Secret of its own
 * namespace (admin_secret_key: "NS/NAME", made on first use; a namespaced
 * Role lets it get and create only there). For an LLMDeployment with uid U
 * the token is HMAC-SHA256(key, "token/" U) in hex and it lives in Secret
 * NAME-admin-H, H = 10 hex digits of HMAC-SHA256(key, "name/" U), owned
 * by the LLMDeployment, which the controller creates (create is all it may
 * do with Secrets elsewhere) and the pods mount (desired.c). No one who can
 * read the LLMDeployment, a ConfigMap or the controller's environment can
 * derive the token, and no one can plant a Secret under a name they
 * cannot predict before the controller makes it. The controller never
 * reads the per-deployment Secret back: it derives the token again.
 * The per-deployment Secret is immutable (a swap needs delete and
 * create rights in the namespace). The key is read again every minute: a
 * deleted key Secret is made anew and every colocated deployment's Secret
 * name, and so its pods, change once. The key Secret must carry our
 * managed-by label; whoever may create Secrets in the controller's
 * namespace could still plant one - that right is as good as the key.
 *
 * Ownership: llmd is borrowed. Thread-safety: the key is loaded under a
 * lock and copied out per call. */
#ifndef ADMIN_SECRET_H
#define ADMIN_SECRET_H

#include "kube_client.h"

/* Where the key lives ("NS/NAME"); before the first reconcile. */
void admin_secret_key(const char *ns, const char *name);

/* The per-deployment Secret's name into name (NAME-admin-H) and token into
 * token (either may be NULL). */
llm_status admin_secret_derive(kube_client *k, json_t *llmd, char name[300], char token[65], llm_error *err);

/* Creates the per-deployment Secret when missing (409: it is there). */
llm_status admin_secret_ensure(kube_client *k, json_t *llmd, llm_error *err);

#endif
