/* rollout.h - canary upgrades of an LLMDeployment (spec.canary).
 *
 * When the pod template's revision (its hash) changes and spec.canary is
 * set, the stable Deployment keeps its template and the new revision runs
 * beside it as NAME-canary; llm-router (which a canary turns on) sends it
 * the weight of the current step, read from the NAME-router ConfigMap.
 * Every analysis interval the controller reads the routers' per-revision
 * counters (canary.h), compares the window since the step began, and
 * holds, moves to the next step, promotes or rolls back. Promotion scales
 * the canary to the full replica count, sends it all traffic, rolls the
 * stable Deployment to the new template (a rolling update, lossless), then
 * returns the traffic and removes the canary. Rollback sets the weight to
 * 0 and removes the canary; the rolled-back revision is remembered, so
 * the same spec does not start it again.
 *
 * State lives in status.canary (so a new leader continues): revision,
 * stableRevision, phase (Starting, Progressing, Paused, Promoting,
 * Promoted, RolledBack, Cancelled), step, weight, stepStartTime, window (the counters
 * at the step's start), lastAnalysis, rolledBackRevision, signal, message.
 *
 * kubectl's levers, the annotation llmk8s.io/canary-action: pause (holds
 * the step; failures still roll back), resume, promote, abort; the
 * controller removes resume/promote/abort once done.
 *
 * With spec.canary.analysis.quality the canary is also judged on its
 * answers (judge.h) once its pods serve, before it takes traffic, and
 * again before promotion: the plan asks for a judgement (need_quality)
 * and holds until the result for this revision and stage comes; its
 * figures go to status.canary.quality.{start,promotion}. A mean KL over
 * maxKLDivergence or a top-1 agreement under minTop1Agreement rolls back
 * (QualityRegression); revisions that cannot be compared hold, or roll
 * back (QualityIncomparable) with onIncomparable: fail.
 *
 * A colocated canary is driven through the stable pods' /admin/canary:
 * the plan asks for a call (ro.admin), the controller makes it, and the
 * next plan reads the pods' answers (podsig_admin).
 *
 * Pure: rollout_plan reads only its arguments (the time among them) and asks
 * for everything else it wants done through the rollout it fills (events,
 * the pod call, the annotation to clear, what to read next). Ownership:
 * rollout_plan fills a caller-owned struct whose JSON members are new
 * references (rollout_free). Thread-safety: reentrant. */
#ifndef ROLLOUT_H
#define ROLLOUT_H

#include <jansson.h>

#include "canary.h"
#include "judge.h"
#include "podsig.h"

#define ROLLOUT_ACTION_ANN "llmk8s.io/canary-action"

typedef enum rollout_mode {
    ROLLOUT_NONE,        /* no canary: the stable Deployment follows the spec */
    ROLLOUT_CANARY,      /* both revisions run; the stable keeps its template */
    ROLLOUT_ROLLED_BACK, /* the spec's revision failed: the stable keeps its template */
    ROLLOUT_PROMOTING    /* all traffic on the canary while the stable rolls to it */
} rollout_mode;

typedef struct rollout {
    canary_config cn;
    rollout_mode mode;
    int weight;              /* the routers' canary share */
    char stable_rev[17];     /* what the stable pods run */
    json_t *state;           /* status.canary; NULL without spec.canary */
    json_t *weight_cm;       /* NAME-router (with spec.canary) */
    json_t *canary_cm, *canary_dep, *canary_svc; /* NULL: none wanted */
    int keep_config;         /* NAME-config keeps its data (the stable's) */
    double requeue_s;        /* > 0: look again after this long */
    json_t *events;          /* [{type, reason, message}] of the decisions made (plan_event) */
    int admin, admin_weight; /* /admin/canary on the stable pods: 0 none, 1 serve at admin_weight, 2 unload */
    int clear_action;        /* remove the one-shot ROLLOUT_ACTION_ANN (resume, promote, abort: done) */
    int need_counters;       /* read next: 1 the routers' counters, 2 the stable pods' own */
    int need_diag;           /* read next: why NAME-canary's pods are not ready */
    int need_quality;        /* judge next (judge.h): 1 before the first step, 2 before promotion; 0 none */
} rollout;

/* What rollout_plan reads besides the LLMDeployment and its stable Deployment. */
typedef struct rollout_seen {
    json_t *canary;               /* NAME-canary as read (NULL: none); refused unless ours */
    const podsig_reading *pods;   /* counters, NAME-canary's diagnosis, /admin/canary answers (NULL: none) */
    const judge_result *quality;  /* the quality judge's last result for this LLMDeployment (NULL: none) */
    double now;                   /* unix seconds */
} rollout_seen;

/* Decides the canary's next state from status.canary, the stable and
 * canary Deployments and (while it is analysed) the pods' counters.
 * stable: the stable Deployment as read (borrowed; NULL when not created
 * yet). new_rev: the desired template's revision; total: the replicas
 * wanted in all; cm, dep: the desired ConfigMap and Deployment, dep
 * rewritten in place to keep the stable template and take the stable
 * share of pods. LLM_ERR_INVALID_ARG when spec.canary is unusable,
 * KUBE_ERR_EXISTS when NAME-canary is not this LLMDeployment's. */
llm_status rollout_plan(json_t *d, json_t *stable, const char *new_rev, int total, json_t *cm, json_t *dep,
                   const rollout_seen *seen, rollout *ro, llm_error *err);

/* Conditions CanaryProgressing, CanaryPromoted and CanaryRolledBack
 * (only with spec.canary), appended to conds. */
void rollout_conditions(const rollout *ro, json_t *conds, json_int_t generation);

void rollout_free(rollout *ro);

/* 1 while the canary of status.canary (may be NULL) is in flight:
 * Starting, Progressing, Paused or Promoting. */
int rollout_in_flight(json_t *canary_status);

#endif
