/* kube_client.h - requests to the Kubernetes API server over libcurl with
 * JSON bodies (jansson): get, list, create, replace, patch, delete, and the
 * status subresource, with the API's errors as typed statuses:
 * 404 LLM_ERR_NOT_FOUND, 409 KUBE_ERR_CONFLICT, 410 KUBE_ERR_GONE, 422 and
 * 400 LLM_ERR_INVALID_ARG, 401/403 KUBE_ERR_FORBIDDEN; the message carries
 * the server's own Status message.
 *
 * Ownership: kube_client_new copies what it needs from the config (which
 * it keeps borrowing for token rotation: the config must outlive it).
 * Returned JSON belongs to the caller (json_decref). Thread-safety: calls
 * are serialised by an internal lock; use one client per watch. */
#ifndef KUBE_CLIENT_H
#define KUBE_CLIENT_H

#include <curl/curl.h>
#include <jansson.h>
#include <stdatomic.h>

#include "kube_config.h"
#include "kube_status.h"

typedef struct kube_client kube_client;

llm_status kube_client_new(kube_config *cfg, kube_client **out, llm_error *err);
void kube_client_free(kube_client *k);

/* Each request's whole time (default 60 s; the leader lease's client arms
 * each call within its renew deadline). Call it between requests: it waits
 * for the one in flight. */
void kube_client_set_timeout(kube_client *k, long timeout_ms);
/* cancel (borrowed; NULL: none): once set, the request in flight ends
 * within a moment and later ones fail at once (LLM_ERR_CANCELLED) - how a
 * replica that stopped leading stops writing. Set it before first use. */
void kube_client_set_cancel(kube_client *k, atomic_int *cancel);
/* The informers' caches (borrowed; NULL: none) that kube_apply_read answers
 * from (kube_apply.h). Set before the client is shared. */
struct kube_cache_set;
void kube_client_set_caches(kube_client *k, const struct kube_cache_set *caches);
const struct kube_cache_set *kube_client_caches(kube_client *k);
/* fn (NULL: none) is called after each request this client completes,
 * answered or not: the controller's worker ticks its heartbeat with it, so
 * /healthz says the loop moves, however long one reconcile takes. Set it
 * before first use. */
void kube_client_set_progress(kube_client *k, void (*fn)(void));
/* The Retry-After of this client's last answer, in seconds (0: none; at
 * most 60). Per client: one client per thread that needs it. */
double kube_client_retry_after(kube_client *k);
/* The seconds of a "Retry-After: N" header line (any case), -1 when the
 * line is not one. */
double kube_client_retry_after_header(const char *line, size_t n);

/* method: GET, POST, PUT, PATCH, DELETE; path from the API root
 * ("/api/v1/namespaces/x/pods"); body may be NULL; content_type for PATCH
 * ("application/merge-patch+json"). *out (may be NULL) gets the response
 * body on success. */
llm_status kube_client_request(kube_client *k, const char *method, const char *path, json_t *body, const char *content_type,
                        json_t **out, llm_error *err);

/* Requests kube_client_request made in this process, every client together, by
 * method and outcome (watch streams are not requests here): what
 * /metrics shows as the API load. Any thread. */
enum { KUBE_GET, KUBE_POST, KUBE_PUT, KUBE_PATCH, KUBE_DELETE, KUBE_N_METHODS };
enum { KUBE_2XX, KUBE_3XX, KUBE_4XX, KUBE_5XX, KUBE_NO_ANSWER, KUBE_N_OUTCOMES };
unsigned long long kube_client_request_count(int method, int outcome);
/* Objects left out because they cannot be read within llm_json's bounds
 * (a custom resource a tenant nested past 64 levels: the API server takes
 * 10,000): the rest of their list is read without them, a watch event
 * holding one is dropped (kube_client_unreadable counts one). Any thread. */
unsigned long long kube_client_unreadable_count(void);
void kube_client_unreadable(void);
const char *kube_client_method_name(int method);   /* "GET", ... */
const char *kube_client_outcome_name(int outcome); /* "2xx", ..., "error" */

/* Sets how curl handle c logs in to the API server (CA, client
 * certificate and key) and returns the request headers it needs (Accept,
 * bearer token, re-read if it rotated); the caller frees them with
 * curl_slist_free_all after the request. Shared by requests and watches. */
struct curl_slist *kube_client_curl_login(kube_config *cfg, CURL *c);

#endif
