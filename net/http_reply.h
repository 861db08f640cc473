/* http_reply.h - the one writer of HTTP answers on civetweb connections,
 * for llm-server, llm-router and llm-controller: a whole answer (status
 * line, type, length, the caller's extra headers, the guard's CORS and
 * Connection headers, the body), or the head and end of a streamed one
 * (chunked; for an HTTP/1.0 client unchunked and ended by the close).
 * (The health port's own epoll server, http_probe, writes its few fixed
 * answers itself: it has no civetweb connection.)
 *
 * On a connection an http_guard serves, a whole answer is sent under the
 * guard's send deadline and the connection is kept alive when the guard
 * says so; elsewhere (a plain civetweb context) it is closed after.
 * http_reply_close is the exception: the guard's own refusals, before any
 * handler, which always close. (http_guard.c uses this file and this file
 * asks http_guard whether it owns a connection: both are net/.)
 * A client gone mid-answer is not reported here: the write fails quietly
 * and the connection ends; a handler that streams asks
 * http_guard_client_gone.
 * Thread-safety: any handler thread, on its own connection. */
#ifndef HTTP_REPLY_H
#define HTTP_REPLY_H

#include <civetweb.h>
#include <stddef.h>

/* Sends status with n bytes of body of content type type; extra holds
 * whole header lines ("Retry-After: 1\r\n"), NULL for none. Returns status. */
int http_reply(struct mg_connection *c, int status, const char *type, const char *body, size_t n, const char *extra);
/* The same with a NUL-terminated body (NULL: empty). */
int http_reply_text(struct mg_connection *c, int status, const char *type, const char *body, const char *extra);
/* A JSON answer that ends the connection, for answers given before any
 * handler (the guard's refusals): no keep-alive, no CORS header, no send
 * deadline. body is NUL-terminated. Returns status. */
int http_reply_close(struct mg_connection *c, int status, const char *body, const char *extra);
/* 1 when the client speaks HTTP/1.0 (no chunks: a stream is the rest of the connection). */
int http_reply_unchunked(struct mg_connection *c);
/* The head of a streamed answer (Cache-Control: no-cache; chunked, or for
 * HTTP/1.0 with keep-alive off). The bytes written: <= 0 when the client is gone. */
int http_reply_stream_head(struct mg_connection *c, int status, const char *type, const char *extra);
/* The end of a streamed answer: the last chunk (nothing for HTTP/1.0). */
void http_reply_stream_end(struct mg_connection *c);

#endif
