/* http_reply.c - HTTP answers on civetweb connections (http_reply.h). */
#include "http_reply.h"

#include <string.h>

#include "http_guard.h"

/* civetweb's phrase for status; asked without the connection, so a code it
 * does not know (a backend's, passed on) gives its class and no log line. */
static const char *reason(int status) { return mg_get_response_code_text(NULL, status); }

/* A whole answer: head and body. */
static void whole(struct mg_connection *c, int status, const char *type, const char *body, size_t n, const char *extra,
                  const char *cors, const char *connection)
{
    mg_printf(c, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%s%sConnection: %s\r\n\r\n", status,
              reason(status), type, n, extra ? extra : "", cors, connection);
    if (n)
        mg_write(c, body, n);
}

int http_reply(struct mg_connection *c, int status, const char *type, const char *body, size_t n, const char *extra)
{
    int guarded = http_guard_owns(c);
    if (guarded)
        http_guard_sending(c, n); /* a client that does not take its answer is cut */
    whole(c, status, type, body, n, extra, guarded ? http_guard_cors(c) : "", guarded ? http_guard_connection(c) : "close");
    if (guarded)
        http_guard_disarm(c);
    return status;
}

int http_reply_close(struct mg_connection *c, int status, const char *body, const char *extra)
{
    mg_disable_connection_keep_alive(c);
    whole(c, status, "application/json", body, strlen(body), extra, "", "close");
    return status;
}

int http_reply_text(struct mg_connection *c, int status, const char *type, const char *body, const char *extra)
{
    return http_reply(c, status, type, body, body ? strlen(body) : 0, extra);
}

int http_reply_unchunked(struct mg_connection *c)
{
    const char *v = mg_get_request_info(c)->http_version;
    return !v || strcmp(v, "1.1");
}

int http_reply_stream_head(struct mg_connection *c, int status, const char *type, const char *extra)
{
    int old = http_reply_unchunked(c), guarded = http_guard_owns(c);
    if (old)
        mg_disable_connection_keep_alive(c);
    return mg_printf(c, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nCache-Control: no-cache\r\n%s%s%sConnection: %s\r\n\r\n",
                     status, reason(status), type, extra ? extra : "",
                     old ? "" : "Transfer-Encoding: chunked\r\n", guarded ? http_guard_cors(c) : "",
                     old || !guarded ? "close" : http_guard_connection(c));
}

void http_reply_stream_end(struct mg_connection *c)
{
    if (!http_reply_unchunked(c))
        mg_printf(c, "0\r\n\r\n");
}
