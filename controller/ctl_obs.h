/* ctl_obs.h - what llm-controller tells the outside: structured log lines
 * (one JSON object per line on stderr, so log pipelines can index them),
 * its Prometheus metrics, and its own HTTP endpoints (/healthz, /readyz,
 * /metrics) on a civetweb server.
 *
 * Metrics: llm_controller_reconciles_total{result}, the reconcile latency
 * histogram, queue depth, watch relists, events posted, leader (0/1), the
 * pod signals' rounds and pages {result="answered"|"unanswered"}.
 * /healthz fails when the worker or the pod signals' thread has not come
 * round its loop for 60 s (stuck on something): each call the worker makes
 * is bounded (30 s), so a long reconcile of many calls is not "stuck"; /readyz when the informers have not listed yet.
 *
 * Ownership: one process-wide state (ctl_obs_*), started with
 * ctl_obs_http_start and stopped with ctl_obs_http_stop. Thread-safety:
 * every function may be called from any thread. */
#ifndef CTL_OBS_H
#define CTL_OBS_H

#include "llm/status.h"

typedef enum ctl_level { CTL_DEBUG, CTL_INFO, CTL_WARN, CTL_ERROR } ctl_level;

/* One JSON log line: {"ts","level","msg", then key/value pairs}; the
 * variable arguments alternate key and value strings and end with NULL (a
 * NULL value skips its key). Minimum level from LLM_CONTROLLER_LOG_LEVEL
 * (debug, info, warn, error; default info). */
void ctl_obs_log(ctl_level lvl, const char *msg, ...) __attribute__((sentinel));

typedef enum ctl_counter {
    CTL_M_RECONCILE_OK,
    CTL_M_RECONCILE_ERR,
    CTL_M_RELISTS,
    CTL_M_EVENTS,
    CTL_M_SIGNAL_ROUNDS,     /* the pod signals' rounds (podsig.h) */
    CTL_M_PAGES_ANSWERED,    /* pod pages they read, answered */
    CTL_M_PAGES_UNANSWERED,  /* ... and not (timed out, refused, too big) */
    CTL_M_COUNTERS
} ctl_counter;

void ctl_obs_count(ctl_counter c);
void ctl_obs_reconcile_seconds(double s);
void ctl_obs_set_queue(long depth);
void ctl_obs_set_queue_keys(long keys); /* keys the work queue knows (live LLMDeployments) */
void ctl_obs_set_leader(int leader);
/* Readiness: n informers must have listed; informer i (0..n-1) has. */
void ctl_obs_expect_informers(int n);
void ctl_obs_set_synced(int informer, int synced);
void ctl_obs_heartbeat(void);                       /* the worker moved: came round its loop, finished a call */
void ctl_obs_heartbeat_signals(void);               /* the pod signals' thread came round (podsig.h) */

/* The exposition text (malloc'd; the caller frees it); NULL without memory. */
char *ctl_obs_render(void);

/* Serves /healthz /readyz /metrics on addr ("8081" or "127.0.0.1:8081");
 * "" or NULL serves nothing. */
llm_status ctl_obs_http_start(const char *addr, llm_error *err);
void ctl_obs_http_stop(void);

#endif
