/* adapters.h - spec.adapters on the running pods. New pods load the list
 * at start (the configuration's lora_file, desired.h); this applies a
 * changed list to the pods already running, through their admin routes
 * (llm-server's GET /admin/lora, POST /v1/unload_lora_adapter and
 * /v1/load_lora_adapter, bearer: the deployment's admin token), so no pod
 * restarts, and gives the status that results: status.adapters (on how
 * many serving pods each adapter is loaded), status.podAdapters (what
 * each pod has loaded, as it answered at the start of the round; the
 * first ADAPTERS_STATUS_PODS pods, the rest counted) and the
 * AdaptersReady condition, which names an adapter that fails and why
 * while the model keeps serving.
 *
 * One round per reconcile: every pod's list is read at once; an adapter
 * a pod has with another source, digest or scale is unloaded this round
 * and loaded the next; at most ADAPTERS_CALLS_PER_ROUND load or unload
 * calls are made (each to every pod that needs it, at once), the rest in
 * later rounds.
 *
 * Ownership: d is borrowed; the view's status list is the caller's (free
 * with adapters_view_free). Thread-safety: reentrant. */
#ifndef ADAPTERS_H
#define ADAPTERS_H

#include <jansson.h>

#define ADAPTERS_CALLS_PER_ROUND 8
/* A pod's answer is hostile (a compromised pod): a list of more than
 * ADAPTERS_POD_LIST entries is taken as no answer, and status.podAdapters
 * shows at most ADAPTERS_STATUS_NAMES names per pod (strings of 1 to
 * ADAPTERS_NAME_MAX bytes; the rest counted in "more") for the first
 * ADAPTERS_STATUS_PODS pods: at most ~290 KB of status (an etcd object,
 * 1.5 MiB at most) whatever the pods say. */
#define ADAPTERS_POD_LIST 64
#define ADAPTERS_STATUS_PODS 64
#define ADAPTERS_STATUS_NAMES 32
#define ADAPTERS_NAME_MAX 128
#define ADAPTERS_POD_NAME 254 /* a pod's name (a DNS subdomain, 253 bytes) and its NUL */

typedef struct adapters_view {
    json_t *list;        /* status.adapters: [{"name", "loaded", "pods"}] */
    json_t *pods;        /* status.podAdapters: {"pods": [{"pod", "answered", "loaded": [names], "more"}], "omitted"} */
    int done;            /* every serving pod has exactly the spec's adapters */
    int failed;          /* a load was refused: message says which and why */
    char message[640];
} adapters_view;

/* One round over the n serving pods named names[i], at base URLs urls[i]
 * ("http://IP:PORT"). */
void adapters_sync(json_t *d, char (*urls)[128], char (*names)[ADAPTERS_POD_NAME], int n, const char *token,
                   adapters_view *v);
/* status.adapters, status.podAdapters and the AdaptersReady condition into
 * status (the condition keeps its transition time from d's status while it
 * holds). */
void adapters_status(json_t *d, const adapters_view *v, json_t *status, const char *now);
void adapters_view_free(adapters_view *v);

#endif
