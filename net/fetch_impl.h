/* fetch_impl.h - what the fetch module's files share (not an API): one
 * fetch's context, the HTTP request with the headers a download reads,
 * a file to bring into the cache, and the checks every name from a URI or
 * a server passes before it becomes part of a path.
 *
 * fetch.c: sources, options, the cache's folders, progress, fetch_model.
 * fetch_hf.c: the hub (resolve, file list, QUANT choice, snapshots).
 * fetch_xfer.c: one HTTP exchange; one file's locked, resumable, verified
 * transfer. */
#ifndef FETCH_IMPL_H
#define FETCH_IMPL_H

#include <curl/curl.h>
#include <limits.h>

#include "fetch.h"

#define FETCH_MAX_REDIRECTS 5
#define FETCH_MAX_PATH 1024  /* a file's name inside a source */
#define FETCH_MAX_PARTS 512  /* files of one source (a split set's parts) */

/* One fetch_model call. */
typedef struct fetch_ctx {
    const fetch_options *o;
    char cache[PATH_MAX];
    char hf_endpoint[512];
    char hf_token[1024];
    char bearer[1024];
    char s3_endpoint[512], s3_region[64], s3_user[512], s3_session[2048];
    long stall_s, lock_stale_s;
    int max_retries;
    fetch_reason why;
    llm_error *err;
    /* progress over the whole source */
    const char *file;
    int part, n_parts;
    uint64_t done_before, total;
    double t_report, rate, rate_t;
    uint64_t rate_bytes;
} fetch_ctx;

/* Authorization of a request: none, the https bearer token, the hub's
 * token (also a bearer), or AWS SigV4. */
typedef enum fetch_auth { FETCH_AUTH_NONE, FETCH_AUTH_BEARER, FETCH_AUTH_HF, FETCH_AUTH_S3 } fetch_auth;

/* What a response said, of what a download reads. */
typedef struct fetch_resp {
    long code;                 /* 0: no answer (err says why) */
    char location[4096];
    char commit[48], etag[80], linked_etag[80], error_code[64], content_range[96];
    uint64_t linked_size, length; /* X-Linked-Size, Content-Length (0: absent) */
    int has_linked_size, has_length;
    long retry_after;          /* seconds, -1: absent */
    char next[4096];           /* a Link header's rel="next" */
} fetch_resp;

/* One request of url (GET, or HEAD when head), redirects not followed;
 * the body (at most max bytes, NUL-terminated, malloc'd) in *body when
 * body is not NULL. LLM_OK when an answer came (any status), else the
 * transport's error in c->err. */
llm_status fetch_http(fetch_ctx *c, const char *url, fetch_auth auth, int head, size_t max, char **body,
                      fetch_resp *r);

/* The host[:port] of an http(s) URL into out; 0, or -1 when url is not one. */
int fetch_url_host(const char *url, char *out, size_t n);
/* Where a redirect from `from` to `to` may go: 0 when allowed (https, or
 * http from http), -1 with c->err set. Relative locations are resolved
 * into `to` (n bytes). */
int fetch_redirect_ok(fetch_ctx *c, const char *from, char *to, size_t n);

/* A file to bring into the cache. */
typedef struct fetch_file {
    char name[FETCH_MAX_PATH]; /* in the source, for messages and progress */
    char url[4096];            /* where its bytes are (after the hub's redirect) */
    fetch_auth auth;           /* what url gets: the token goes only to its host */
    char dest[PATH_MAX];       /* the verified file's place */
    char lock[PATH_MAX];       /* its lock file */
    char want[72];             /* expected sha256 (hex), "" none */
    uint64_t size;             /* expected size, 0 unknown */
} fetch_file;

/* Brings f into f->dest unless it is there: takes the lock (waiting while
 * another process holds it, reported as "waiting"), transfers, verifies
 * and renames. */
llm_status fetch_file_get(fetch_ctx *c, fetch_file *f);

/* A path segment list from a source: no empty, "." or ".." segment, no
 * leading "/", no backslash or control character, at most FETCH_MAX_PATH
 * bytes. 0 or -1. */
int fetch_path_ok(const char *p);
/* Lower-case hex of length len exactly. */
int fetch_hex_ok(const char *s, size_t len);
/* mkdir -p of the folder that holds path. 0 or -1 (errno). */
int fetch_mkdirs_for(const char *path);
/* Sets c->why and c->err; returns the status. */
llm_status fetch_fail(fetch_ctx *c, fetch_reason why, llm_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Reports progress (rate-limited unless force). */
void fetch_report(fetch_ctx *c, const char *phase, uint64_t done_in_file, int force);

/* hf:// (fetch_hf.c): the source's files into the cache; path: the model.
 * fetch_hf_check: the reference's form only. */
llm_status fetch_hf(fetch_ctx *c, const char *uri, char *path, size_t n);
llm_status fetch_hf_check(fetch_ctx *c, const char *uri);

/* One header line of a response into r (libcurl's header callback's
 * work; fuzzed). */
void fetch_header_line(fetch_resp *r, const char *data, size_t n);

#endif
