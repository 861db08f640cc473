/* podsig.h - what an LLMDeployment's pods say, read apart from its
 * reconciles: one thread lists the controller's pods (one request for all
 * of them: our managed-by label), then reads every page the reconciles
 * asked for - llm-server's /metrics for the autoscaler's signal or a
 * colocated canary's counters, llm-router's /metrics for scale to zero
 * and the canary analysis (and the LLMGateway pods of its namespace: their
 * route's counters), /startupz of pods that are not ready - all at
 * once, within PODSIG_BUDGET_MS per round for every page together. A pod
 * that never answers costs that budget once per round, and no reconcile
 * waits for it: they read the last round's results without waiting
 * (podsig_read) and say what they need next (podsig_want, from the
 * planner's plan.need). The thread ticks ctl_obs_heartbeat_signals each
 * round.
 *
 * Rounds run as often as the most frequent need asks (1 s to 30 s); with
 * nothing needed, no request is made. Bounds, since pods are the tenants':
 * 4,096 pages per round, each LLMDeployment's /metrics pages per kind at
 * most its share of them (4,096 / LLMDeployments read, 4 to 1,024: a
 * sample of the pods), 64 /startupz per instance. A /metrics page is read
 * whole (up to 64 MiB, within the round's time) keeping only the lines of
 * the series the plans read, so what a page costs in memory is those
 * lines: 512 KiB of them a page (a /startupz answer the same) and 16 MiB
 * for every page of a round together. A canary's window is judged only
 * when PODSIG_VERDICT_SHARE of its own routers' (or, colocated, pods')
 * pages answered with the counters, and scale to zero needs every one of
 * its routers' pages (canary_asked, activity.asked). Pages are taken in the pod
 * list's order up to the round's 4,096: past that (over 512
 * LLMDeployments read at once, or many diagnosed), those later in the
 * list are not read that round. Pods are told apart by
 * instance and app name (llm-server, llm-router), so LLMDeployment
 * NAME-router's servers are not NAME's routers.
 *
 * Ownership: the podsig owns its thread and state (podsig_free stops
 * them). Thread-safety: every function but new/free may be called from
 * any thread. */
#ifndef PODSIG_H
#define PODSIG_H

#include <stdatomic.h>

#include "autoscale.h"
#include "canary.h"
#include "kube_config.h"
#include "pod_diag.h"

#define PODSIG_BUDGET_MS 2000
/* the share of a canary's counter pages that must answer before its window
 * is judged: the rest may hold the errors (a gateway or router not heard from) */
#define PODSIG_VERDICT_SHARE 0.75

/* What one LLMDeployment wants read (all zero: nothing; it is dropped). */
typedef struct podsig_need {
    long long port;          /* llm-server's health port: /metrics and /startupz */
    char metric[32];         /* the autoscaler's signal (autoscale_metric_name's input); "": none */
    int activity;            /* the routers' activity (scale to zero) */
    int canary;              /* 1: the routers' per-revision counters; 2: the pods' own (a colocated canary) */
    int diag;                /* why its pods, and NAME-canary's, are not ready */
    double every_s;          /* how fresh it must be (a round at least this often) */
} podsig_need;

/* The pods' answers to the controller's last /admin/canary call (a
 * colocated canary), which the next plan reads. */
typedef struct podsig_admin {
    int valid;               /* 0: no call made yet (or none remembered) */
    char rev[17];            /* the canary revision the call was for */
    int weight, unload;      /* what it asked */
    int pods, answered;      /* pods asked; those that answered 200 */
    int ready, failed, misfit; /* serving it; failed to load; could not fit it */
    char message[512];       /* a failure's words, "pod IP: ..." */
} podsig_admin;

typedef struct podsig_reading {
    podsig_need need;        /* what this reading was read for */
    double age_s;            /* since its round ended; < 0: no round yet for this need */
    double signal;           /* the mean of need.metric over signal_pods pods that had it (a sample) */
    int signal_pods;
    int serving_pods;        /* NAME's pods serving (ready, with an IP, not terminating): what the mean is of */
    autoscale_activity activity;    /* need.activity */
    int canary_pods;         /* pages of need.canary that had the counters (0: none answered) */
    int canary_asked, canary_own; /* its own routers' (or, colocated, pods') counter pages asked, and answered with
                              * the counters: a verdict needs PODSIG_VERDICT_SHARE of them */
    canary_sample canary;
    pod_diag diag, canary_diag; /* need.diag: NAME's and NAME-canary's pods */
    podsig_admin admin;
} podsig_reading;

typedef struct podsig podsig;

/* ns: the one namespace watched (NULL or "": every namespace); beat (may
 * be NULL) is called each time the thread comes round (at least once a
 * second while it waits). The thread starts at once and ends by
 * podsig_free; cfg must outlive it. */
llm_status podsig_new(kube_config *cfg, const char *ns, void (*beat)(void), podsig **out, llm_error *err);
void podsig_free(podsig *s);

/* The last reading for key ("ns/name"); age_s < 0 when none. */
void podsig_read(podsig *s, const char *key, podsig_reading *out);
/* What key needs from the next rounds; a changed need starts its reading
 * afresh (and a new one wakes the thread). An all-zero need drops the key
 * (its admin answers too). LLM_ERR_NOMEM when it cannot be kept. */
llm_status podsig_want(podsig *s, const char *key, const podsig_need *need, llm_error *err);
/* Remembers the pods' answers to an /admin/canary call for key. */
void podsig_note_admin(podsig *s, const char *key, const podsig_admin *a);
/* key's LLMDeployment is gone. */
void podsig_forget(podsig *s, const char *key);

/* 1 when pod (a list's item) serves: Ready, with an IP, not terminating. */
int podsig_pod_serving(json_t *pod);

/* The parts of one reading (pure): adds a server pod's /metrics text to r
 * for its need, or a router pod's. */
void podsig_add_server_page(podsig_reading *r, const char *text);
void podsig_add_router_page(podsig_reading *r, const char *text);
/* A gateway pod's page: its route `route`'s revision counters, for a
 * canary judged from routers' counters, and its held and sent requests
 * (scale to zero). */
void podsig_add_gateway_page(podsig_reading *r, const char *text, const char *route);

#endif
