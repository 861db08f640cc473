/* rt_pool.h - llm-router's backends: the set (replaced whole by discovery),
 * what each says about its load (polled from its /metrics) and what the
 * router knows itself (requests in flight), a circuit breaker per backend,
 * and the choice of backend for a request:
 *   - least loaded: fewest (in flight + waiting) over the healthy backends,
 *     ties broken by fewer running, then round robin;
 *   - round robin (for comparison);
 *   - affinity: a session key (header or the request's "user") is hashed
 *     onto a ring of virtual nodes, so a session stays on one backend while
 *     the set changes little (consistent hashing), unless that backend
 *     carries more than 1.25 times the average load plus one request:
 *     then the next one on the ring takes it (bounded loads), so one
 *     session cannot pin a flood to one pod.
 *   - cache-aware: the backend whose expected cost is lowest, the cost
 *     being its load (in flight + waiting) times a request's worth in
 *     prompt bytes, plus the prompt bytes it would compute: the request's,
 *     less those it is believed to hold (rt_prefix.h: the prefixes sent
 *     there lately, times its trust), plus the prompt bytes it is still
 *     computing for streamed requests sent there that have no answer byte
 *     yet (a request's first token waits behind them: the cost is the
 *     time to it, in bytes of prefill; RT_POOL_PENDING_MAX each at most). So a conversation stays where its
 *     history is, a hot prefix spreads once its pod is busier than a
 *     prefill elsewhere costs, a request does not queue behind another's
 *     long prefill when a pod with less to compute can take it, and with
 *     no prefix known the choice is the pod of least load and pending
 *     bytes. Trust: each answer's usage (cached_tokens over
 *     prompt_tokens) against the share predicted, averaged, at most 1: a
 *     pod that says it had more than predicted gains nothing, one that
 *     had less (restarted, evicted) is believed less.
 * Adapters: a request whose model is a LoRA adapter that some backends
 * have loaded (llm-server's llm_lora_loaded series, polled) goes only to
 * those (by the policy among them); none usable: no backend (the client
 * gets 503 and retries), never one that would answer 404. A model no
 * backend lists (the base model's name) does not narrow the choice.
 * Revisions: each backend is of the stable (0) or the canary (1) revision;
 * a request goes to the canary with probability weight/100 - exactly that
 * share, by a smooth counter, or by the session key's hash so a session
 * stays on one revision - and then to a backend of that revision by the
 * policy (the other revision when that one has none usable). A retry
 * (after a failed attempt) goes to stable first and does not count in the
 * split. Per-revision
 * counts, time-to-first-byte and inter-token histograms feed the canary
 * analysis.
 *
 * Breaker: after `threshold` consecutive failures (no connection, or a 5xx
 * before any byte reached the client) a backend is ejected for `eject_s`;
 * then one trial request is let through (half open): success closes it,
 * failure ejects it again.
 *
 * Ownership: the pool copies URLs and owns the prefix indexes. rt_pool_pick returns an index valid until
 * rt_pool_release. Thread-safety: every function may be called from any thread. */
#ifndef RT_POOL_H
#define RT_POOL_H

#include <stddef.h>

#include "llm/status.h"
#include "llm/strbuf.h"
#include "rt_prefix.h"

#define RT_MAX_BACKENDS 256
/* The most requests a pod's reported load counts for (its waiting and
 * running sequences are its own word, clamped to 0..this). */
#define RT_POOL_MAX_LOAD 100000.0
/* The adapters a backend's report may list (llm-server loads at most 1024;
 * the operator's spec at most 32). */
#define RT_POOL_MAX_ADAPTERS 64

/* prefix-hash is least-loaded in the pool: the proxy makes the prompt's
 * first bytes the session key (rt_proxy.h). */
typedef enum rt_policy { RT_LEAST_LOADED, RT_ROUND_ROBIN, RT_PREFIX_HASH, RT_CACHE_AWARE } rt_policy;

/* The policy's name ("least-loaded", ...), and the policy of a name (-1: none). */
const char *rt_policy_name(rt_policy p);
int rt_policy_of(const char *name);

typedef struct rt_pool rt_pool;

typedef struct rt_pool_config {
    rt_policy policy;
    int threshold;     /* consecutive failures that eject (default 3) */
    double eject_s;    /* how long an ejected backend rests (default 10) */
    double balance;    /* cache-aware: a queued request is worth this many mean prompts' bytes (default 0.25) */
} rt_pool_config;

llm_status rt_pool_new(const rt_pool_config *c, rt_pool **out, llm_error *err);
void rt_pool_free(rt_pool *p);

/* Replaces the backends of revision rev (0 stable, 1 canary) with urls
 * ("http://10.0.0.5:8080", or "NAME=http://..." to name it, e.g. its pod);
 * backends that stay keep their state. */
llm_status rt_pool_set(rt_pool *p, int rev, const char *const *urls, int n, llm_error *err);
/* Share of requests for the canary, 0..100. */
void rt_pool_set_weight(rt_pool *p, int weight);
int rt_pool_weight(rt_pool *p);
int rt_pool_size(rt_pool *p);
/* A gateway route's hold: how long a request waits while the pool has no
 * backend (its deployment scaled to zero; 0: none); held counts the
 * requests waiting (+1 / -1), shown per route in the metrics
 * (llm_router_route_held_requests, _total). */
void rt_pool_set_hold(rt_pool *p, double seconds);
double rt_pool_hold(rt_pool *p);
int rt_pool_held(rt_pool *p, int delta); /* the requests held now */

/* What the choice knows of a request. */
typedef struct rt_request {
    const char *session;          /* session key; NULL or "": none */
    const char *model;            /* NULL or "": any backend */
    const rt_prefix_chain *chain; /* its prompt (cache-aware); NULL: unknown */
    const unsigned char *avoid;   /* bitmap over indexes to skip (retries); NULL: none */
    int streamed;                 /* its answer is streamed: the first byte follows the prefill, so its pending
                                   * bytes count on the backend until then (a whole answer's first byte is its
                                   * last: its bytes never count) */
} rt_request;

/* The most pending bytes one request counts for (about 32k tokens: more
 * than a prompt's real prefill, for one made of padding). */
#define RT_POOL_PENDING_MAX 131072.0

/* What the choice believed of the backend it chose. */
typedef struct rt_pick {
    double predicted; /* the share of the prompt's bytes it holds (for rt_result.predicted) */
    double pending;   /* cache-aware: the prompt bytes it is to compute (for rt_pool_started / rt_result.pending) */
} rt_pick;

/* Chooses a backend for a request; -1 when none is usable. The URL is
 * copied to url; *out (may be NULL) gets what the choice believed.
 * Counts the request in flight and, cache-aware, its chain as sent there
 * and its pending bytes on the backend (until rt_pool_started, or
 * rt_pool_release with them in rt_result.pending). */
int rt_pool_pick(rt_pool *p, const rt_request *q, char *url, size_t un, rt_pick *out);
/* The first byte of backend idx's answer came: the prompt is computed,
 * its pending bytes (rt_pick.pending) no longer count there. At most once
 * per pick, between it and rt_pool_release, whose rt_result.pending must
 * then be 0 (bytes given back twice are a bug: an assertion). */
void rt_pool_started(rt_pool *p, int idx, double pending);
/* Latency histograms' bucket bounds (seconds), shared by the request
 * duration, time-to-first-byte and inter-token histograms. */
#define RT_N_BUCKETS 16
extern const double rt_pool_bucket_le[RT_N_BUCKETS];
/* The bucket of a duration: 0..RT_N_BUCKETS (the last is +Inf). */
int rt_pool_bucket(double seconds);

/* What one attempt saw. */
typedef struct rt_result {
    int ok;              /* 0 counts a failure toward the breaker */
    int busy;            /* a 503 ("not now"): neither a failure nor a success for the breaker */
    int dropped;         /* the backend dropped the connection after it had the request (not retried) */
    double seconds;      /* pick to last byte */
    double ttfb;         /* to the first byte; < 0: none came */
    int status;          /* HTTP status; 0: no answer */
    /* gaps between a stream's successive chunks (inter-token latency) */
    unsigned int itl[RT_N_BUCKETS + 1];
    double itl_sum;
    unsigned int itl_n;
    int prompt_tokens;   /* the answer's usage; -1: none seen */
    int cached_tokens;
    int completion_tokens; /* (total_tokens - prompt_tokens); -1: none seen */
    double predicted;    /* rt_pick.predicted */
    double pending;      /* rt_pick.pending, unless rt_pool_started has given it back */
} rt_result;

/* The request ended. */
void rt_pool_release(rt_pool *p, int idx, const rt_result *r);
/* Revision of backend idx (0 stable, 1 canary). */
int rt_pool_revision(rt_pool *p, int idx);

/* The poller's reading of backend i's own signals (clamped: waiting and
 * running to 0..RT_POOL_MAX_LOAD, kv_usage to 0..1); reachable 0 counts as
 * a failure. */
void rt_pool_report(rt_pool *p, int idx, int reachable, double waiting, double running, double kv_usage);
/* The KV cache size backend i reports (token rows; its
 * llm_kv_cache_tokens; <= 0: none said): its prefix index holds about as
 * many prompt bytes as that many tokens take. prompt_total: its
 * llm_prompt_tokens_total (< 0: none said); lower than the last one, the
 * pod restarted (counters start again at 0) with an empty cache: its index
 * is emptied and its trust starts again. */
void rt_pool_report_cache(rt_pool *p, int idx, double kv_tokens, double prompt_total);
/* The adapters backend i has loaded (names, n of them: those past
 * RT_POOL_MAX_ADAPTERS are left out), from its /metrics; replaces the last
 * report. */
void rt_pool_report_adapters(rt_pool *p, int idx, const char *const *names, const size_t *lens, int n);
/* fn(ctx, name) for each adapter a live backend lists (a name once per
 * backend that lists it), under the pool's lock: fn must not call the pool. */
void rt_pool_adapters(rt_pool *p, void (*fn)(void *ctx, const char *name), void *ctx);
/* 1 when a live backend lists adapter model. */
int rt_pool_has_adapter(rt_pool *p, const char *model);
/* Name of backend i (its pod's, or its URL) into name; 0 when i is out of range. */
int rt_pool_name(rt_pool *p, int idx, char *name, size_t n);
/* URL of backend i into url (for the poller); 0 when i is out of range. */
int rt_pool_url(rt_pool *p, int idx, char *url, size_t un);

/* Appends the Prometheus text of n pools for the router's /metrics to out
 * (out->failed set when memory ran out): each family once, each pool's
 * samples labelled route="routes[k]" when routes is set (a gateway). */
void rt_pool_metrics(rt_pool *const *p, const char *const *routes, int n, llm_strbuf *out);

#endif
