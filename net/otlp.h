/* otlp.h - request traces: W3C trace context in and out, and spans
 * exported as OpenTelemetry's OTLP/HTTP (protobuf: POST
 * application/x-protobuf of an ExportTraceServiceRequest to the traces
 * endpoint), for llm-router and llm-server.
 *
 * A request's context comes from its `traceparent` header (version 00;
 * anything else - malformed, all-zero ids, another version - starts a new
 * trace: a client's garbage costs it its parent, nothing more). A new
 * trace is sampled by ratio (from its trace id, so every hop of one trace
 * agrees); a propagated one keeps its parent's sampled flag. Only sampled
 * spans are recorded.
 *
 * Export never blocks a request: otlp_span copies the span into a bounded
 * queue (queue_max spans; a full queue drops it, counted) and a thread of
 * the exporter's own sends batches (up to 512 spans, at least every
 * second) with a timeout; a batch the collector does not take (down, slow,
 * an error status) is dropped and counted, not retried.
 *
 * Ownership: otlp_open's exporter is the caller's until otlp_close (which
 * sends one more batch, within the timeout, drops the rest and stops).
 * Thread-safety: otlp_span, otlp_child, otlp_stats and otlp_metrics may
 * be called from any thread, but none may run once otlp_close has begun
 * (close after the servers that record spans have stopped); the
 * traceparent functions are pure. */
#ifndef OTLP_H
#define OTLP_H

#include <stddef.h>
#include <stdint.h>

#include "llm/status.h"
#include "llm/strbuf.h"

/* A span's place in its trace. */
typedef struct otlp_ctx {
    uint8_t trace_id[16], span_id[8];
    int sampled;
} otlp_ctx;

/* Parses a traceparent header value: 1 with *out filled, or 0. */
int otlp_traceparent_parse(const char *h, otlp_ctx *out);
/* The traceparent of c ("00-TRACE-SPAN-FLAGS", 55 characters and a NUL). */
void otlp_traceparent_format(const otlp_ctx *c, char out[56]);

typedef struct otlp otlp;

typedef struct otlp_config {
    const char *endpoint;      /* the traces URL (e.g. http://collector:4318/v1/traces) */
    const char *service;       /* resource attribute service.name */
    double ratio;              /* new traces sampled: 0..1 */
    int queue_max;             /* spans waiting at most (default 4096) */
    double timeout_s;          /* per batch sent (default 2) */
} otlp_config;

llm_status otlp_open(const otlp_config *cfg, otlp **out, llm_error *err);
/* An exporter to url, else to the environment's endpoint
 * (otlp_env_endpoint); *out NULL (and LLM_OK) when neither names one. */
llm_status otlp_open_configured(const char *url, const char *service, double ratio, otlp **out, llm_error *err);
void otlp_close(otlp *o); /* NULL: nothing */

/* The endpoint the environment names: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
 * else OTEL_EXPORTER_OTLP_ENDPOINT + "/v1/traces"; "" when neither. */
void otlp_env_endpoint(char *out, size_t n);

/* A new span's context under parent (NULL or !has_parent: a new trace,
 * sampled by ratio). o may be NULL (nothing exported: never sampled). */
void otlp_child(const otlp *o, const otlp_ctx *parent, int has_parent, otlp_ctx *out);

/* A span attribute: a string (s non-NULL) or an integer. */
typedef struct otlp_attr {
    const char *key, *s;
    long long i;
} otlp_attr;

enum { OTLP_INTERNAL = 1, OTLP_SERVER = 2, OTLP_CLIENT = 3 };

/* Records a finished span of ctx (its parent: parent_span, NULL for a
 * root), times in Unix nanoseconds; error: its status is ERROR. Nothing
 * when ctx is not sampled or o is NULL; copied, so the caller's strings
 * may go at once. */
void otlp_span(otlp *o, const otlp_ctx *ctx, const uint8_t *parent_span, const char *name, int kind, uint64_t start_ns,
               uint64_t end_ns, const otlp_attr *attrs, int n_attrs, int error);

/* Spans sent (taken by the collector) and dropped (queue full, or their
 * batch not taken). */
void otlp_stats(otlp *o, unsigned long long *exported, unsigned long long *dropped);

/* Appends llm_traces_exported_total and llm_traces_dropped_total to a
 * Prometheus exposition (o NULL: nothing). */
void otlp_metrics(otlp *o, llm_strbuf *out);

/* Unix time in nanoseconds now. */
uint64_t otlp_now_ns(void);

#endif
