/* srv_metrics.h - the server's Prometheus metrics: request counters by
 * route and status, latency histograms, and (at scrape time) the engine's
 * gauges and counters, also under the vLLM names (vllm:*, with a
 * model_name label) that dashboards, alerts, KEDA and the Gateway API
 * inference extension's endpoint picker read unchanged.
 *
 * Ownership: caller-owned struct (srv_metrics_init cannot fail); text from
 * srv_metrics_render is malloc'd, the caller frees it. Thread-safety:
 * every function may be called from any thread. */
#ifndef SRV_METRICS_H
#define SRV_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "llm/engine.h"

#define SRV_N_ROUTES 11
#define SRV_HIST_BUCKETS 16

/* Per-request histograms: seconds (time to first token, between tokens,
 * queued, end to end, prefill = first scheduled to first token, decode =
 * first token to the last), then token counts (prompt, generated, the
 * max_tokens asked for). */
typedef enum srv_hist_id {
    H_TTFT, H_ITL, H_QUEUE, H_E2E, H_PREFILL, H_DECODE, H_PROMPT_TOKENS, H_GEN_TOKENS, H_MAX_TOKENS, H_COUNT
} srv_hist_id;

typedef struct srv_hist {
    uint64_t counts[SRV_HIST_BUCKETS + 1]; /* the last is +Inf */
    double sum;
    uint64_t n;
} srv_hist;

typedef struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t requests[SRV_N_ROUTES][6]; /* by status class: 2xx 4xx 429 499 5xx 503 */
    srv_hist hist[H_COUNT];
    uint64_t finished[3];               /* stop, length, abort */
    /* per revision (0 stable, 1 colocated canary): completions by status
     * class 2xx 3xx 4xx 5xx, time to first token and between tokens - the
     * canary analysis's input, named as llm-router's */
    uint64_t rev_codes[2][4];
    srv_hist rev_ttft[2], rev_itl[2];
    int canary_weight, canary_loaded;   /* gauges, set by the canary */
    long long conns[4];                 /* API connections: open; accepted, refused, cut (http_guard.h) */
    uint64_t stream_events, stream_writes; /* SSE events streamed, and the writes that carried them (under mu) */
} srv_metrics;

extern const char *const srv_route_names[SRV_N_ROUTES];

void srv_metrics_init(srv_metrics *m);
void srv_metrics_free(srv_metrics *m);
/* Counts one finished HTTP request of route (an index of srv_route_names). */
void srv_metrics_request(srv_metrics *m, int route, int status);
/* A value (seconds, or tokens for the token histograms) into a histogram. */
void srv_metrics_observe(srv_metrics *m, srv_hist_id h, double v);
/* reason: 0 stop, 1 length, 2 abort */
void srv_metrics_finished(srv_metrics *m, int reason);
/* A completion's status, and its latencies (itl 0: time to first token,
 * 1: a gap between tokens), by revision. */
void srv_metrics_revision(srv_metrics *m, int rev, int status);
void srv_metrics_rev_observe(srv_metrics *m, int rev, int itl, double seconds);
void srv_metrics_canary(srv_metrics *m, int loaded, int weight);
/* One write of a stream that carried `events` SSE events (> 0); takes
 * m->mu, from any HTTP thread. */
void srv_metrics_stream_write(srv_metrics *m, int events);
/* The API listener's connection counts (http_guard_stats: open, accepted,
 * refused, cut), set before a render. */
void srv_metrics_connections(srv_metrics *m, const long long conns[4]);
/* This process's resident memory in bytes (0 when unknown). */
long srv_rss_bytes(void);
/* The exposition text (Prometheus text format 0.0.4; a counter's # TYPE
 * line names its sample, NAME_total, so that Go's expfmt and Python's
 * prometheus_client both read it as a counter). engine may be NULL while
 * loading (and the n backends, whose memory is shown per rank, then 0).
 * model_name labels the vLLM-named series, as vLLM labels them. */
char *srv_metrics_render(srv_metrics *m, llm_engine *e, int phase, llm_backend *const *backends, int n,
                         const char *model_name);

#endif
