/* http_probe.h - a small HTTP listener for probes and /metrics that no
 * number of idle or trickling connections can hold.
 *
 * civetweb gives every connection a thread until its headers are in (or
 * its header deadline passes): 100 connections that never finish their
 * headers held every thread of the health port, and each kubelet probe
 * waited behind them until it timed out. This listener is one thread over
 * epoll: a connection costs a buffer, not a thread; each has HEAD_S
 * seconds in all to send its request and take its answer; at
 * HTTP_PROBE_MAX_CONNS open the oldest connection that has not yet sent a
 * whole request is closed to make room, so a probe that sends its request
 * at once (as kubelet's and Prometheus' do) is always read.
 *
 * Requests: GET or HEAD, headers at most 8 KiB, no body; every answer
 * closes its connection. The caller's answer function runs on the
 * listener's thread, one request at a time, and must not block. The
 * program's open files limit should leave room for HTTP_PROBE_MAX_CONNS
 * (llm-server and llm-router count them in their API listener's,
 * http_guard_cfg.fds_extra);
 * short of it, the oldest waiting connection is closed to make room.
 *
 * Thread-safety: start and stop from one thread; the answer function is
 * called from the listener's thread only. */
#ifndef HTTP_PROBE_H
#define HTTP_PROBE_H

#include <stddef.h>

#include "llm/status.h"

#define HTTP_PROBE_MAX_CONNS 1024

typedef struct http_probe http_probe;

/* The answer to a GET of path (query: what followed its '?', "" when
 * nothing did): its HTTP status, with *body (malloc'd; the listener frees
 * it; NULL: an empty body) and *type (static) set. */
typedef int (*http_probe_fn)(void *ctx, const char *path, const char *query, char **body, const char **type);

/* Listens on host:port (host "0.0.0.0", "::" or an address) and answers
 * with fn(ctx, ...). *out is set before the listener's thread starts (fn
 * may read it), and NULL again on failure. LLM_ERR_IO naming the address
 * when it cannot listen or start its thread, LLM_ERR_NOMEM. */
llm_status http_probe_start(const char *host, long port, http_probe_fn fn, void *ctx, http_probe **out, llm_error *err);
/* Stops the thread and closes every connection; frees p. NULL is a no-op. */
void http_probe_stop(http_probe *p);

/* What the listener has seen: connections open now, and since the start
 * accepted, answered, and closed unanswered (their time ran out, or they
 * made room for newer ones). */
typedef struct http_probe_stats {
    long long open, accepted, answered, dropped;
} http_probe_stats;
void http_probe_stats_get(http_probe *p, http_probe_stats *out);

#endif
