/* canary.h - the canary's arithmetic, apart from any API call: its
 * configuration from spec.canary, the router's per-revision counters read
 * from /metrics text, the analysis of a window (canary against stable on
 * error ratio, p99 time to first token and p99 inter-token latency) and
 * the step decision (hold, next step, promote, roll back).
 *
 * The router (llm-router) exports, per revision "stable" and "canary",
 * llm_router_revision_requests_total{code}, llm_router_revision_ttfb_seconds
 * and llm_router_revision_itl_seconds histograms; llm-server the same
 * without "router_" for a canary colocated in its pods. A window is the
 * difference of two samples; samples are kept in the LLMDeployment's status
 * as JSON, so a new leader continues the same window.
 *
 * Ownership: canary_sample_to_json returns a new reference; nothing else
 * allocates. Thread-safety: pure functions. */
#ifndef CANARY_H
#define CANARY_H

#include <jansson.h>

#include "llm/status.h"

#define CANARY_MAX_STEPS 16
#define CANARY_MAX_BUCKETS 32

typedef struct canary_step {
    int weight;      /* percent of requests for the canary */
    double pause_s;  /* least time at this weight before the next step */
} canary_step;

/* spec.canary.analysis.quality: the canary's next-token distributions
 * against the stable's (judge.h) before its first step and before its
 * promotion. */
typedef struct canary_quality {
    int enabled;
    char config_map[254];    /* the texts' ConfigMap in the namespace; "": the built-in set */
    long min_positions;      /* positions a judgement needs */
    double max_kl;           /* mean KL(stable || canary) per position allowed */
    double min_top1;         /* share of positions whose most likely tokens agree, at least */
    int top;                 /* prompt_logprobs: alternatives read per position */
    int fail_incomparable;   /* revisions that cannot be compared: 1 roll back, 0 hold */
    double timeout_s;        /* one judgement's reads */
} canary_quality;

typedef struct canary_config {
    int enabled;
    int colocated;           /* mode colocated: the new model inside the stable pods */
    int n_steps;
    canary_step steps[CANARY_MAX_STEPS];
    double interval_s;       /* analysis period */
    double max_error_ratio;  /* canary's error ratio may exceed stable's by this much */
    double max_ttft_ratio;   /* p99 time to first token, canary over stable */
    double max_itl_ratio;    /* p99 inter-token latency, canary over stable */
    double tolerance_s;      /* latency differences below this never fail */
    int min_requests;        /* canary requests in a window before it is judged */
    double inconclusive_s;   /* a step without a verdict this long is paused, or rolled back */
    int rollback_inconclusive; /* 1: roll back then; 0: pause (a person decides) */
    canary_quality quality;
} canary_config;

/* From spec.canary (absent: enabled 0). LLM_ERR_INVALID_ARG naming the
 * field when it cannot be used. */
llm_status canary_config_from_spec(json_t *spec, canary_config *c, llm_error *err);

/* "90", "90s", "2m", "1h", "1m30s" or an integer, in seconds; -1 when not
 * a duration. */
double canary_duration(json_t *v);

/* Counters of both revisions (index 0 stable, 1 canary), summed over the
 * router pods. Histograms are cumulative by bucket as exported; the last
 * count is +Inf. */
typedef struct canary_sample {
    double requests[2], errors[2];
    int n_le;
    double le[CANARY_MAX_BUCKETS];
    double ttft[2][CANARY_MAX_BUCKETS + 1], itl[2][CANARY_MAX_BUCKETS + 1];
} canary_sample;

/* Adds one router's /metrics text to s (start from a zeroed sample). */
void canary_sample_add(canary_sample *s, const char *text);
/* The same for a gateway's page: only the series of route (an
 * LLMDeployment's name; NULL: every series). The lines taken. */
int canary_sample_add_route(canary_sample *s, const char *text, const char *route);
/* now - then, per counter: 0. A counter that went down (a router
 * restarted, or a page not read this round): 1, with *out = now (the
 * caller starts its window again from now). */
int canary_sample_diff(const canary_sample *now, const canary_sample *then, canary_sample *out);
json_t *canary_sample_to_json(const canary_sample *s);
/* 0 when j is not a sample (then s is zeroed). */
int canary_sample_from_json(json_t *j, canary_sample *s);
/* The q-quantile of a cumulative histogram (Prometheus' histogram_quantile:
 * linear within the bucket); -1 when it is empty. */
double canary_quantile(const double *le, int n_le, const double *cum, double q);

typedef enum canary_verdict { CANARY_INCONCLUSIVE, CANARY_PASS, CANARY_FAIL } canary_verdict;

typedef struct canary_analysis {
    canary_verdict verdict;
    char signal[32];     /* on failure: ErrorRatio, TimeToFirstToken, InterTokenLatency */
    char message[512];   /* what was measured, against what */
    double requests[2], error_ratio[2], ttft_p99[2], itl_p99[2]; /* -1: no data */
} canary_analysis;

void canary_analyse(const canary_config *c, const canary_sample *window, canary_analysis *a);

typedef enum canary_action { CANARY_HOLD, CANARY_ADVANCE, CANARY_PROMOTE, CANARY_ROLLBACK, CANARY_STALLED } canary_action;

/* What to do at step `step` (0-based) after step_age_s seconds there, its
 * window (the counters judged) begun window_age_s ago (a window starts
 * again when a router restarts). CANARY_STALLED: no verdict for
 * inconclusive_s of window (too little traffic) and onInconclusive pause:
 * hold, saying so; with rollback it is CANARY_ROLLBACK. */
canary_action canary_decide(const canary_config *c, int step, double step_age_s, double window_age_s, canary_verdict v,
                            int paused);

/* Pods per revision while the canary takes weight percent of total
 * replicas: each at least one, together about total. */
void canary_split(int total, int weight, int *stable, int *canary);

#endif
