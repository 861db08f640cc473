/* http_guard.h - the limits civetweb lacks for a server that hostile
 * clients can reach, shared by llm-server and llm-router.
 *
 * civetweb gives each connection a worker thread; connections above the
 * thread count wait unseen in its accept queue, and it counts nothing. The
 * guard, installed through civetweb's callbacks:
 *  - counts connections and answers those above max_connections at once
 *    with 503 and Retry-After (the context gets http_guard_threads() worker
 *    threads: the connections plus a reserve that answers the refused);
 *  - bounds a request's headers to header_timeout_s in all (civetweb's
 *    request_timeout_ms) and a kept-alive connection's wait for its next
 *    request to keep_alive_s more;
 *  - says per response whether the connection stays open (keep-alive,
 *    unless the client asked otherwise, the body was left unread or the
 *    guard is closing for a drain);
 *  - refuses with 400, and closes, a request whose body's length is not
 *    one thing: two Content-Length values that differ, or Content-Length
 *    with Transfer-Encoding (a proxy in front may frame it the other way);
 *  - answers no CORS preflight unless cors_origin is set (civetweb's
 *    default answered every one with "*").
 * A handler gives a phase of its own a deadline (http_guard_arm: reading a
 * body, which civetweb does not bound) and disarms it after; past it, the
 * guard's watchdog shuts the connection's socket, so the read fails.
 * civetweb's worker threads have 100 KiB stacks (compiled in): a handler
 * set with http_guard_route runs on a thread of LLM_THREAD_STACK instead
 * (llm/thread.h), where the depth limits of request and model-output code
 * hold with a wide margin.
 *
 * Thread-safety: every function may be called from any thread; the
 * per-connection calls only from the thread serving that connection. */
#ifndef HTTP_GUARD_H
#define HTTP_GUARD_H

#include <civetweb.h>

#include "llm/status.h"

typedef struct http_guard http_guard;

typedef struct http_guard_cfg {
    int max_connections;     /* above it: 503 at once */
    double header_timeout_s; /* a request's headers, from its first byte */
    double keep_alive_s;     /* idle time for a kept-alive connection's next request; 0: no keep-alive */
    double send_timeout_s;   /* a response write may wait this long for the client to take it (plus 1 s per
                              * 16 KiB); 0: no bound (see http_guard_sending) */
    int fds_per_connection;  /* descriptors one connection costs the program (a proxy: its own and its upstream's);
                              * 0: 1. The open files limit is raised to fit them all. */
    int fds_extra;           /* descriptors held besides (pools, pollers) */
    const char *cors_origin; /* answer CORS preflights for this origin ("*": any); NULL or "": none (a web page
                              * elsewhere can then send only what needs no preflight, and POST bodies must be
                              * application/json: so it can send nothing); no line breaks (LLM_ERR_INVALID_ARG) */
} http_guard_cfg;

/* Worker threads a context guarded for max_connections needs: the
 * connections plus a reserve that answers the ones above the limit. */
int http_guard_threads(int max_connections);

/* Starts civetweb with opts (NULL-terminated pairs; the guard adds
 * num_threads, request_timeout_ms, enable_keep_alive and keep_alive_timeout_ms)
 * (tcp_nodelay too) and the guard's watchdog thread; the open files
 * limit is raised to fit max_connections. *out gets the guard; http_guard_mg(*out) the
 * context, whose request handlers are the caller's to set (its user data
 * is the guard's: handlers get theirs as cbdata). LLM_ERR_IO when
 * civetweb cannot listen (err names the ports), LLM_ERR_INVALID_ARG when
 * the open files limit cannot fit max_connections, LLM_ERR_NOMEM. */
llm_status http_guard_start(const http_guard_cfg *cfg, const char *const *opts, http_guard **out, llm_error *err);
struct mg_context *http_guard_mg(const http_guard *g);
/* Stops civetweb (connections are closed), then the watchdog; frees g.
 * NULL is a no-op. */
void http_guard_stop(http_guard *g);

/* From now on every response says Connection: close (a drain: clients
 * move to other pods). */
void http_guard_closing(http_guard *g);
/* What the guard has seen: connections open now (those above the limit
 * included) and, since the start, accepted, refused above the limit and
 * cut at an armed deadline. */
typedef struct http_guard_stats {
    long long open, accepted, refused, cut;
} http_guard_stats;
void http_guard_stats_get(http_guard *g, http_guard_stats *out);

/* The Connection header value for the response being written on c,
 * "keep-alive" or "close"; with "close" civetweb is told to close it
 * after the response. */
const char *http_guard_connection(struct mg_connection *c);
/* Reads the request's whole body, at most max bytes, within seconds in
 * all (armed: a client that trickles it is cut; also checked after each
 * read). 0 with *out (malloc'd, NUL-terminated; caller frees) and *len,
 * and the connection may be kept alive after it; else 413 (over max), 408
 * (not whole in time, or the client left), 400 (a chunked body civetweb
 * cannot read: malformed, or with chunk extensions, which civetweb 1.15
 * does not take) or 503 (no memory). */
int http_guard_read_body(struct mg_connection *c, size_t max, double seconds, char **out, size_t *len);
/* What to tell the client for a status http_guard_read_body returned with
 * those max and seconds (for 400: how to send a chunked body it can read),
 * written into buf (cap bytes; 160 hold any); returns buf. */
const char *http_guard_body_msg(int status, size_t max, double seconds, char *buf, size_t cap);
/* The request's body was read to its end (keep-alive may follow). */
void http_guard_body_read(struct mg_connection *c);
/* After an answer sent without reading the request's body: reads and
 * drops the body (when it is declared and at most max bytes) within
 * seconds, so that a client still sending it reads the answer rather than
 * a reset. The connection closes after it in any case. */
void http_guard_discard(struct mg_connection *c, long long max, double seconds);
/* Gives the request a deadline seconds from now (again: moves it), after
 * which its socket is shut and a read or write on it fails; disarm ends
 * it. For a handler, about its connection. When the socket cannot be
 * found (no /proc), nothing is armed: civetweb's per-read timeout
 * (header_timeout_s) is then the only bound. */
void http_guard_arm(struct mg_connection *c, double seconds);
void http_guard_disarm(struct mg_connection *c);
/* Sets fn (with cbdata) as the handler of uri, as mg_set_request_handler
 * does, run on a thread of its own with a stack of LLM_THREAD_STACK while
 * civetweb's worker waits for it (so a request costs a thread more, and
 * a recursion in it has the room its limit was sized for). When no thread
 * can be made the request gets 503 with Retry-After. At most
 * HTTP_GUARD_ROUTES routes: LLM_ERR_TOO_LONG past them. */
#define HTTP_GUARD_ROUTES 32
llm_status http_guard_route(http_guard *g, const char *uri, mg_request_handler fn, void *cbdata);
/* Whether the request's body is declared JSON (application/json, any
 * parameters): a web page elsewhere cannot send that without a CORS
 * preflight, which is not answered unless cors_origin is set. */
int http_guard_json_body(struct mg_connection *c);
/* The headers every answer on c carries for CORS ("Access-Control-Allow-
 * Origin: ...\r\nVary: Origin\r\n"), or "" without cors_origin. */
const char *http_guard_cors(struct mg_connection *c);
/* 1 when an http_guard serves c's context (0: a plain civetweb one). */
int http_guard_owns(const struct mg_connection *c);
/* The handlers are set: requests reach them from now on (before, each
 * gets 503 and Retry-After: civetweb listens from its start). */
void http_guard_serve(http_guard *g);
/* Arms the send deadline for a write of n bytes (send_timeout_s + n /
 * 16 KiB s): a client that stops reading (or reads a byte now and then,
 * which civetweb counts as progress) cannot hold its connection, and the
 * request behind it, for longer. Disarm after the write. */
void http_guard_sending(struct mg_connection *c, size_t n);
/* Whether an Authorization header value is "Bearer TOKEN" with token's
 * text, compared in constant time (digests of both: neither the content
 * nor the length leaks through timing). */
int http_guard_bearer_ok(const char *authorization, const char *token);
/* Reads a token from a file (a mounted Secret): its first line, without
 * surrounding white space, into out; 0, or -1 when it cannot be read or is
 * empty or longer than cap - 1. */
int http_guard_token_file(const char *path, char *out, size_t cap);

/* 1 when the client has closed its connection (a handler's check while it
 * computes an answer without writing: a non-streamed completion); 0 while
 * it is open or cannot be told. Never blocks. */
int http_guard_client_gone(struct mg_connection *c);

#endif
