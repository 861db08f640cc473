/* judge.h - the canary quality gate's reads: threads that, per job,
 * have one stable and one canary pod read the same texts and compares their
 * next-token distributions (quality.h), apart from the reconciles (a job
 * takes seconds to minutes; no reconcile waits for it).
 *
 * A job reads each text on both sides through llm-server's admin routes
 * (the controller's admin token; X-LLM-Revision picks a colocated
 * canary): POST /admin/tokenize gives each revision's ids and vocabulary
 * size; the two must have the same vocabulary size, a plain text the same
 * ids (else the revisions cannot be compared token by token: the result
 * says so), and a chat text (rendered by each revision's own template) is
 * compared over the tokens its two renderings end with alike - a template
 * that drops or changes a turn changes what the model predicts there.
 * Then POST /admin/completions with those ids and prompt_logprobs gives
 * both lists, which quality_add sums. Fewer positions than the job's
 * min_positions is incomparable too (the texts are too short to judge).
 *
 * Bounds: JUDGE_MAX_KEYS deployments with a job at a time (a newer want
 * past it is refused; JUDGE_KEYS_PER_NS of a namespace), JUDGE_WORKERS
 * jobs running at once and at most one of a namespace (the others queue,
 * oldest first: a tenant whose pods answer slowly holds one worker at
 * most; two such tenants hold both, each job within its timeout), texts
 * of at most 1,024 tokens, an answer at most what its ids and top-k need
 * (~80 bytes an entry), parsed one at a time across the workers (a tree
 * is many times its text, and the controller's parses share one cap) and
 * read into compact positions before the other side's is fetched, every request within the job's
 * timeout; a job replaced (other pods, revision or stage) or forgotten
 * ends its request in flight, as judge_free does.
 *
 * Ownership: the judge owns its threads and jobs; judge_want takes the
 * job's texts (a new reference the judge frees). Thread-safety: every
 * function but new/free may be called from any thread. */
#ifndef JUDGE_H
#define JUDGE_H

#include <jansson.h>

#include "llm/status.h"
#include "quality.h"

#define JUDGE_MAX_KEYS 256
#define JUDGE_KEYS_PER_NS 32 /* of them, one namespace's at most */
#define JUDGE_WORKERS 2     /* jobs run at once, one per namespace at most; one answer is parsed at a time */
#define JUDGE_RETRY_S 15    /* a job that failed to read (not a verdict) runs again when asked after this long */

typedef struct judge_side {
    char url[128];          /* "http://IP:PORT" of the pod */
    char revision[8];       /* its X-LLM-Revision: "stable" or "canary" (a colocated canary) */
} judge_side;

typedef struct judge_job {
    char rev[17];           /* the canary revision judged */
    int stage;              /* 1 before the first traffic step, 2 before promotion */
    judge_side side[2];     /* 0 the stable revision, 1 the canary */
    char token[65];         /* the admin token */
    json_t *texts;          /* [{"name", "prompt": TEXT} or {"name", "messages": [...]}] */
    int top;                /* prompt_logprobs: alternatives listed per position (1..20) */
    long min_positions;
    double timeout_s;       /* the whole job */
} judge_job;

typedef enum judge_state { JUDGE_NONE, JUDGE_QUEUED, JUDGE_RUNNING, JUDGE_DONE } judge_state;

typedef struct judge_result {
    judge_state state;
    char rev[17];
    int stage;
    int outcome;            /* when done: 1 measured, 0 incomparable (message says why), -1 a read failed */
    quality_sum sum;
    int texts;              /* texts compared */
    char url[2][128];       /* the pods read (a job for others is another job) */
    double finished_mono;   /* llm_clock_mono_s() when done */
    char message[512];
} judge_result;

typedef struct judge judge;

llm_status judge_new(judge **out, llm_error *err);
void judge_free(judge *j);

/* Asks for job under key ("ns/name"). Nothing changes when the same
 * revision and stage on the same pods is queued, running or done (unless
 * done with a read failure JUDGE_RETRY_S ago or more); otherwise it
 * replaces what key had (a running one is stopped: its pods may be gone,
 * and their addresses another's).
 * job->texts is taken whatever the answer. LLM_ERR_NOMEM past
 * JUDGE_MAX_KEYS keys. */
llm_status judge_want(judge *j, const char *key, judge_job *job, llm_error *err);
/* Whether judge_want would take job now (its texts unread: a caller
 * builds them only then). */
int judge_wants(judge *j, const char *key, const judge_job *job);
/* A job that could not start (no pod serves, no texts): a failed read
 * for rev and stage saying why, asked again JUDGE_RETRY_S later. */
void judge_refuse(judge *j, const char *key, const char *rev, int stage, const char *why);
/* What key has (state JUDGE_NONE: nothing). */
void judge_read(judge *j, const char *key, judge_result *out);
/* key's LLMDeployment is gone or needs no judgement now. */
void judge_forget(judge *j, const char *key);

/* The pure parts, for tests. The positions two renderings of one chat
 * compare: how many tokens a and b end with alike. */
int judge_common_suffix(const int32_t *a, int na, const int32_t *b, int nb);
/* Adds one text's two answers (completions bodies with prompt_logprobs)
 * to s, only the last n positions of each: 0, or -1 with why. */
int judge_add_answers(quality_sum *s, json_t *stable, json_t *canary, int n, char *why, size_t why_n);

#endif
