/* http_client.h - one small plain-HTTP GET to a pod (its /startupz or
 * /metrics) with a deadline and a bounded body; shared by the controller's
 * pod diagnostics and autoscaler and by llm-router's load poller.
 *
 * Ownership: *body is malloc'd (NUL-terminated) for the caller, NULL on
 * failure. Thread-safety: reentrant; h, when given, is the caller's handle
 * (reused for its kept-alive connections) and must not be shared. */
#ifndef HTTP_CLIENT_H
#define HTTP_CLIENT_H

#include <curl/curl.h>
#include <stddef.h>

#define HTTP_CLIENT_LINE_MAX 1024

/* A response body collected by libcurl: NUL-terminated, grown
 * geometrically, at most max bytes. http_client_body_write is the
 * CURLOPT_WRITEFUNCTION (CURLOPT_WRITEDATA: the http_client_body); it aborts the
 * transfer with over set past max, or nomem set when memory runs out. The
 * caller frees p. */
typedef struct http_client_body {
    char *p;
    size_t n, cap, max;
    int over, nomem;
    /* A line filter (http_client_get_many_lines): only the lines that start
     * with one of keep's prefixes are kept, so max bounds what is kept,
     * read_max what is read; a line longer than HTTP_CLIENT_LINE_MAX is
     * dropped whole. NULL keep: the body as it comes. */
    const char *const *keep;
    size_t read, read_max;
    char *line;             /* HTTP_CLIENT_LINE_MAX bytes, malloc'd on the first data (the caller frees) */
    size_t line_n;
    int line_long;
} http_client_body;
size_t http_client_body_write(char *data, size_t size, size_t nmemb, void *body);

/* The HTTP status, or 0 when the pod did not answer in timeout_ms or the
 * body exceeded max bytes. h may be NULL (a handle just for this call). */
long http_client_get(CURL *h, const char *url, long timeout_ms, size_t max, char **body);
/* The same with a bearer token (may be NULL) and, when json is not NULL,
 * as a POST of that body (the controller driving a pod's /admin/canary). */
long http_client_request(CURL *h, const char *url, const char *bearer, const char *json, long timeout_ms, size_t max,
                  char **body);

/* GETs n urls at once (libcurl's multi interface), every transfer within
 * budget_ms of the call together: a pod that never answers costs the
 * budget once, not once per pod. codes[i]: the HTTP status, 0 when url i
 * did not answer in time or its body exceeded max bytes; bodies[i]: the
 * body (malloc'd, the caller frees) or NULL. */
void http_client_get_many(const char *const *urls, size_t n, long budget_ms, size_t max, long *codes, char **bodies);
/* The same for line-based pages (Prometheus text): for url i with
 * filtered[i] set, only the lines that start with one of keep's prefixes
 * (NULL-terminated) are kept, at most max bytes of them, of at most
 * read_max bytes read (past either: no answer); the others as above. A
 * page is read whole however large, while memory holds only what is kept. */
void http_client_get_many_lines(const char *const *urls, size_t n, long budget_ms, size_t max, size_t read_max,
                                const char *const *keep, const unsigned char *filtered, long *codes, char **bodies);
/* The same with a bearer token (may be NULL) and, when json is not NULL, as
 * POSTs of that body: the controller driving every pod's /admin/canary at
 * once. */
void http_client_many(const char *const *urls, size_t n, const char *bearer, const char *json, long budget_ms, size_t max,
               long *codes, char **bodies);

#endif
