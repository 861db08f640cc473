/* rt_proxy.h - llm-router's request path: the client's request (body read
 * whole, bounded) goes to a backend chosen by the pool; the answer streams
 * back as it arrives (SSE included: nothing is buffered), and a client that
 * goes away aborts the upstream request, so the backend cancels it. A
 * backend that cannot be reached (or drops the connection before
 * answering), or answers 5xx before anything was sent to the client, counts
 * as a failure and the request is tried on another backend (at most
 * `retries` more times); once bytes have gone out it is never retried. A
 * request that runs past timeout_s once sent is the request's own doing:
 * 504, no retry, and no failure counted toward the breaker. Answers go to
 * the client chunked (keep-alive; http_guard.h).
 *
 * Scale from zero: while no backend is known at all, a request is held for
 * up to hold_s (at most hold_max at once; beyond that 503 with
 * Retry-After) until one appears; a held streaming request gets its 200 and
 * SSE comments (": waiting for a backend") every 2 s meanwhile, so clients
 * and proxies do not time out.
 *
 * Tenants (keys set): every request needs one of the keys (401 without);
 * its tenant's limits (rt_quota.h) let it in or answer 429 (503 when the
 * quota store is down and the gateway fails closed) with Retry-After and
 * an OpenAI error naming the limit; its answer's tokens count toward the
 * tenant's tpm. With upstream_auth, the pods get the gateway's own key
 * instead of the client's and the tenant in X-LLM-Tenant (a pod trusts
 * that header from its gateway=1 keys alone); without, the client's key.
 * A client's X-LLM-Tenant is never passed on.
 *
 * Traces (traces set): each request gets a span "llm-router request" (its
 * parent the client's traceparent when valid) with the model, route,
 * tenant, backend chosen, status and token counts; the backend gets a
 * traceparent whose parent is that span. Without traces, the client's
 * traceparent and tracestate pass on as they are.
 *
 * Ownership: the config and pool are borrowed for the server's life.
 * Thread-safety: called from civetweb's worker threads; each keeps one
 * curl handle (connection reuse to the backends). */
#ifndef RT_PROXY_H
#define RT_PROXY_H

#include <civetweb.h>

#include "api_keys.h"
#include "otlp.h"
#include "rt_pool.h"

typedef struct rt_proxy rt_proxy;
typedef struct rt_routes rt_routes;
typedef struct rt_quota rt_quota;

struct rt_proxy {
    rt_pool *pool;             /* the backends; NULL at a gateway */
    rt_routes *routes;         /* a gateway (rt_routes.h): the body's model picks the route, whose pool serves;
                                * GET /v1/models lists what every route serves */
    api_keys *keys;            /* the gateway's keys (NULL: anyone may call; the pods check theirs); a key's
                                * rate= holds here too, its max_priority and gateway= are the pods' business */
    rt_quota *quota;           /* the tenants' limits (with keys) */
    otlp *traces;              /* spans (otlp.h): each request's, its traceparent passed on; NULL: none */
    const char *upstream_auth; /* "Bearer KEY": the gateway's own key at the pods (NULL: the client's goes) */
    unsigned long long unauthorized; /* 401s (atomic) */
    int retries;               /* more attempts after a failed one */
    long max_body;             /* 413 above */
    long timeout_s;            /* whole request, upstream */
    const char *affinity_header; /* e.g. "X-Session-Id" (forwarded to the backend); NULL: none */
    int expose_backend;        /* answers carry X-Backend: the backend's name (its pod's, or its URL as given) */
    int affinity_user;         /* also the request body's "user" */
    int prefix_affinity;       /* > 0: else the first this many bytes of the prompt (policy prefix-hash) */
    int cache_aware;           /* the pool's policy is cache-aware: each request's prompt chain goes to the pick */
    unsigned long long no_backend; /* 503s for want of a backend (under the pool's say-so) */
    double hold_s;             /* no backend at all (scaled to zero): hold a request this long */
    int hold_max;              /* at most this many held at once; beyond, 503 + Retry-After */
    int held;                  /* requests being held now */
    unsigned long long held_total;
    double body_timeout_s;     /* a request body must arrive within this, in all */
    int active;                /* requests in the handler now (the drain waits for 0) */
    int cutting;               /* set past the drain timeout: transfers still running end now (atomic) */
};

/* Backend connections kept alive between requests (one pool for all threads). */
#define RT_PROXY_KEEP_CONNS 64

/* The civetweb handler for the proxied routes (cbdata: rt_proxy *). */
int rt_proxy_handle(struct mg_connection *c, void *cbdata);

#endif
