/* plan.h - what one LLMDeployment's children and status should be,
 * decided from what was observed: the planner of reconcile.h's
 * observe -> plan -> act.
 *
 * Pure: no API call, no pod call, no clock, no global state. Its inputs are
 * the LLMDeployment, its Deployments as the informers' caches hold them,
 * the admin Secret's name (a colocated canary), the pods' signals as the
 * last round read them (podsig.h) and the time; its outputs are the steps
 * to take in order (objects to apply, objects of ours to remove), the
 * events to post, the /admin/canary call to make, the annotation to clear,
 * what to read of the pods next and when to look again. The built-in
 * autoscaler's and the canary's decisions are made here (autoscale.h,
 * rollout.h); the same inputs give the same plan, which
 * tests/unit/test_plan.c holds to tables of cases.
 *
 * Steps: {"op": "apply", "collection": C, "object": O} (server-side apply
 * into collection C; "stable": true for the Deployment NAME, whose answer
 * the status is judged from; "created": a message for a Normal/Created
 * event when the apply creates it; "updated": events to post when it
 * changes it), {"op": "remove", "path": P} (only when ours), and
 * {"op": "adminSecret"} (the colocated canary's key Secret, before the
 * pods that mount it). The first step that fails ends the reconcile.
 *
 * Ownership: plan_children fills a caller-owned plan (plan_free);
 * returned JSON is a new reference; inputs are borrowed.
 * Thread-safety: reentrant. */
#ifndef PLAN_H
#define PLAN_H

#include <jansson.h>
#include <stdarg.h>

#include "autoscale.h"
#include "desired.h"
#include "podsig.h"
#include "rollout.h"

typedef struct plan_input {
    json_t *llmd;                 /* the LLMDeployment */
    json_t *stable;               /* its Deployment NAME; NULL: none yet */
    json_t *canary;               /* NAME-canary (read with spec.canary); NULL: none */
    const char *admin_secret;     /* the pods' admin token Secret's name (admin_secret.h: a colocated canary, adapters,
                                   * the quality gate); NULL otherwise */
    const desired_site *site;     /* the platform's settings (borrowed); NULL: none */
    const podsig_reading *pods;   /* the pods' signals; NULL or age_s < 0: none */
    const judge_result *quality;  /* the canary's quality judgement (judge.h); NULL: none */
    double now;                   /* unix seconds */
} plan_input;

typedef struct plan {
    json_t *steps;                /* in order (above) */
    json_t *events;               /* [{type, reason, message}]: post once the status is written */
    rollout ro;                   /* the canary's decision: admin call, clear_action, state */
    autoscale_config as;
    json_t *autoscaling;          /* status.autoscaling when the built-in autoscaler decided; else NULL */
    char template_hash[17];       /* the spec's pod template revision */
    podsig_need need;             /* what to read of the pods next (plan_status adds diag) */
    double requeue_s;             /* > 0: look again after this long */
} plan;

/* The children. LLM_ERR_INVALID_ARG with the reason when the spec cannot
 * give them (InvalidSpec), KUBE_ERR_EXISTS when NAME-canary is not ours
 * (ChildConflict). */
llm_status plan_children(const plan_input *in, plan *p, llm_error *err);

/* The status once the steps are done: dep is the Deployment NAME as the
 * apply left it (the API's answer, or as read). Appends its events to
 * p->events and sets p->need.diag and p->requeue_s from the verdict. NULL
 * without memory. */
json_t *plan_status(const plan_input *in, plan *p, json_t *dep);

/* The status saying why a child cannot be written (reason InvalidSpec or
 * ChildConflict), its event appended to events. */
json_t *plan_refused(const plan_input *in, const char *reason, const char *why, json_t *events);

void plan_free(plan *p);

/* A status condition {type, status True/False, reason, message,
 * observedGeneration, no transition time} (new reference). */
json_t *plan_condition(const char *type, int on, const char *reason, const char *msg, json_int_t generation);

/* Appends {type, reason, message} to events (a JSON array). */
void plan_event(json_t *events, const char *type, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void plan_eventv(json_t *events, const char *type, const char *reason, const char *fmt, va_list ap);

#endif
