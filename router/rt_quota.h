/* rt_quota.h - tenants' limits at llm-router's gateway: requests per
 * minute (rpm), tokens per minute (tpm) and requests in flight
 * (max_inflight), each the tenant's in the keys file (api_keys.h).
 *
 * Per minute means any 60 s: the counts are kept per second, and the
 * last minute's count is the sum of the last RT_QUOTA_SECONDS seconds
 * (this one whole, so never less than the true count: in no 60 s does a
 * tenant get more than its limit; at a steady rate over it, it gets its
 * limit per 61 s). A request is let in when that count plus one stays
 * within rpm and the tokens' count is below tpm. A request's tokens are
 * reserved when it is let in (what it may use: its prompt and max_tokens,
 * the caller's estimate) and settled when it ends (its usage's
 * total_tokens; rt_quota_done), so many requests at once cannot run past
 * tpm on tokens not yet counted; a request let in while the count was
 * under tpm may take it over by its own reservation, no more.
 *
 * Shared: with a Redis address (one server; AUTH with the password, and
 * the ACL user when given, on each new connection), every gateway replica counts
 * in the same Redis keys (llm-quota:PREFIX:TENANT:r|t:SECOND and
 * llm-quota:PREFIX:TENANT:c), one
 * server-side script per admission, so the limits hold across replicas. A request in
 * flight is a sorted-set member whose score is its lease's end
 * (lease_s): a replica that dies mid-request holds the tenant's slot
 * until then, no longer. Each Redis call has timeout_ms; a failure (down,
 * slow, AUTH refused, an answer not of the script's shape) marks Redis unusable for a
 * second, and meanwhile `fail_open` says what happens: 0 (the default):
 * requests of tenants with limits are refused (503, Retry-After: 1);
 * 1: the replica enforces its own share, as below. Keys without limits
 * never touch Redis.
 *
 * A request's end that cannot reach Redis leaves its slot taken until the
 * lease ends, and its tokens uncounted.
 *
 * Alone: without Redis, each replica enforces its share of every limit:
 * the limit divided by `share` (the gateway's replica count; at least 1
 * per replica), so the tenant's total holds while the load spreads evenly
 * over the replicas.
 *
 * Ownership: the keys are borrowed for the quota's life; the config's
 * strings are copied by rt_quota_open. The password is held only while a
 * connection authenticates (then wiped). Thread-safety:
 * every function may be called from any thread (a mutex guards the
 * counters; each Redis call takes a connection of its own). */
#ifndef RT_QUOTA_H
#define RT_QUOTA_H

#include <stddef.h>

#include "api_keys.h"
#include "llm/status.h"

typedef struct rt_quota rt_quota;

#define RT_QUOTA_USER_MAX 127     /* bytes of a Redis ACL user's name */
#define RT_QUOTA_PASSWORD_MAX 255 /* bytes of its password */

typedef struct rt_quota_config {
    const api_keys *keys;
    int share;                 /* gateway replicas (>= 1): each enforces 1/share of a limit without Redis */
    const char *redis;         /* "HOST:PORT" or NULL */
    const char *user;          /* Redis ACL user for AUTH (NULL: the default user) */
    const char *password_file; /* AUTH with its first line on every new connection, read anew each time (a
                                * rotated Secret is followed without a restart); NULL: no AUTH */
    const char *prefix;        /* the Redis keys' prefix (e.g. the gateway's namespace/name) */
    int fail_open;             /* Redis unusable: 1: the replica's share holds; 0: 503 */
    int timeout_ms;            /* per Redis connect and call */
    double lease_s;            /* a request in flight counts at most this long (its deadline) */
} rt_quota_config;

/* A request let in: what rt_quota_done gives back. */
typedef struct rt_quota_ticket {
    const api_key *key;        /* NULL: nothing was taken */
    int shared;                /* counted in Redis */
    char member[48];           /* the request's member in the tenant's in-flight set */
    long reserved;             /* tokens counted at admission, settled at the end */
} rt_quota_ticket;

/* The refusal's limit. */
typedef enum rt_quota_limit {
    RT_QUOTA_OK = 0, RT_QUOTA_RPM, RT_QUOTA_TPM, RT_QUOTA_INFLIGHT, RT_QUOTA_STORE, RT_QUOTA_N
} rt_quota_limit;

/* A quota of cfg (its strings copied) in *out. LLM_ERR_INVALID_ARG: a bad
 * Redis address, a prefix over 588 bytes, a user too long or without a
 * password file, a password file that does not give one line of 1 to
 * RT_QUOTA_PASSWORD_MAX characters (read once here to say so early);
 * LLM_ERR_NOMEM; LLM_ERR_IO (no random id). Redis is not reached here: it
 * may come up later. */
llm_status rt_quota_open(const rt_quota_config *cfg, rt_quota **out, llm_error *err);
void rt_quota_close(rt_quota *q); /* NULL: nothing */

/* Lets key's request, which may use up to `reserve` tokens, in at time
 * now (seconds, CLOCK_REALTIME: replicas share minutes): RT_QUOTA_OK with
 * *t filled (the reservation counted when the tenant has a tpm), or the
 * limit it is over, with msg naming it and *retry_s when a retry may pass
 * (>= 1). */
rt_quota_limit rt_quota_admit(rt_quota *q, const api_key *key, double now, long reserve, rt_quota_ticket *t,
                              double *retry_s, char *msg, size_t msg_n);
/* The request ended having used `tokens` (prompt and generated; 0: none,
 * it never reached a pod): its slot is given back and its reservation
 * settled to that. */
void rt_quota_done(rt_quota *q, rt_quota_ticket *t, long tokens, double now);

/* Counters for /metrics: refusals by limit, Redis failures, whether Redis
 * is in use now (configured and not marked down). */
void rt_quota_stats(rt_quota *q, unsigned long long refused[RT_QUOTA_N], unsigned long long *store_errors, int *shared);
/* The Redis failures so far, and the last one's cause in why (for the
 * operator's log: never the password; "" before the first). */
unsigned long long rt_quota_last_error(rt_quota *q, char *why, size_t n);

#define RT_QUOTA_SECONDS 61
/* Seconds until the count of the per-second counts c (oldest first, the
 * last being the current second, `into` seconds into it) is at most room
 * with nothing added: at least 1 (exposed for tests). */
double rt_quota_retry(const double c[RT_QUOTA_SECONDS], double into, double room);

#endif
