/* chat_template.h - spec.chatTemplate's ConfigMap, admitted before a
 * revision that mounts it rolls out.
 *
 * Pods read the template when they start, so a ConfigMap edited in place
 * would reach every new pod (a scale-up, a restart) with no new revision:
 * no canary, no quality gate, and a fleet serving two templates at once.
 * A revision's template must therefore be fixed: the ConfigMap must be
 * immutable (its `immutable: true`, which the API server enforces), exist
 * and hold the key. A new template is a new ConfigMap (or key), so a new
 * revision, judged like any other.
 *
 * The check is asked only when a revision would mount a ConfigMap and key
 * that no Deployment of the LLMDeployment mounts yet (a reconcile at rest
 * reads nothing); the reconcile reads the ConfigMap and refuses the spec
 * (its old revision goes on serving) until it passes. Not caught: an
 * immutable ConfigMap deleted and made again under its name (Kubernetes
 * allows it), and one that Deployments mounted before this check.
 *
 * Ownership: nothing kept; the arguments are borrowed. Thread-safety:
 * reentrant. */
#ifndef CHAT_TEMPLATE_H
#define CHAT_TEMPLATE_H

#include <jansson.h>
#include <stddef.h>

/* The ConfigMap (name) and key spec.chatTemplate names, the key's default
 * filled in (both point into llmd: valid while it lives); 0 when the spec
 * has none. */
int chat_template_of(json_t *llmd, const char **name, const char **key);

/* Whether llmd's template must be checked: it names one, and none of the
 * n Deployments (NULL entries skipped) mounts that ConfigMap and key. */
int chat_template_wanted(json_t *llmd, json_t *const *deps, size_t n);

/* The ConfigMap as read (NULL: not found) admitted for key: 0, or -1 with
 * why (what is wrong and what to do). */
int chat_template_admit(json_t *configmap, const char *name, const char *key, char *why, size_t why_n);

#endif
