/* fetch_impl.h - what the fetch module's files share (not an API): one
 * fetch's context, the answers a download reads, a file to bring into the
 * cache, and the checks every name from a URI or a server passes before
 * it becomes part of a path.
 *
 * fetch.c        the context (options, environment), progress, log,
 *                back-off, names, fetch_model and fetch_check
 * fetch_http.c   one HTTP exchange: settings, credentials, header lines,
 *                hosts, the redirect rule
 * fetch_xfer.c   one file's locked, resumable, verified transfer
 * fetch_hf.c     hf:// (resolve, file list, QUANT, snapshots)
 * fetch_url.c    s3:// and https://
 * Thread-safety: a fetch_ctx belongs to one fetch_model call (one thread). */
#ifndef FETCH_IMPL_H
#define FETCH_IMPL_H

#include <curl/curl.h>
#include <limits.h>

#include "fetch.h"

#define FETCH_MAX_REDIRECTS 5
#define FETCH_MAX_PATH 1024      /* a file's name inside a source */
#define FETCH_MAX_PARTS 512      /* files of one source (a split set's parts) */
#define FETCH_STALL_BYTES_PER_S 1024
/* An attempt that moved fewer bytes is not progress: a server that
 * trickles a few bytes per connection must not retry forever. */
#define FETCH_PROGRESS_BYTES ((uint64_t)1 << 20)

/* One fetch_model call. */
typedef struct fetch_ctx {
    const fetch_options *o;
    char cache[PATH_MAX];
    char hf_endpoint[512];
    char hf_token[1024];
    char bearer[1024];
    char s3_endpoint[512], s3_region[64], s3_user[512], s3_session[2048];
    char wants[FETCH_MAX_PARTS][65]; /* expected digests, one per part (lower-case hex), n_wants of them */
    int n_wants;
    long stall_s, lock_stale_s;
    int max_retries;
    fetch_reason why;
    int no_answer;       /* the last exchange got no HTTP answer at all (network down) */
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
    long retry_after;          /* seconds (at most 300), -1: absent */
    char next[4096];           /* a Link header's rel="next" */
} fetch_resp;

/* ---- fetch_http.c ---- */

/* A request of url on h with every fetch's settings (redirects not
 * followed, HTTP(S) only, the stall limit, the abort flag) and auth's
 * credentials; the header lines go to r (cleared). The header list to
 * free after the transfer, or NULL with c->err set. */
struct curl_slist *fetch_http_prepare(fetch_ctx *c, CURL *h, const char *url, fetch_auth auth, fetch_resp *r);
/* One GET (or HEAD when head) of url; the body (at most max bytes,
 * NUL-terminated, malloc'd) in *body when body is not NULL. LLM_OK when
 * an answer came (any status), else the transport's error in c->err
 * (c->no_answer set when no HTTP answer came at all). */
llm_status fetch_http_request(fetch_ctx *c, const char *url, fetch_auth auth, int head, size_t max, char **body,
                              fetch_resp *r);
/* One header line of a response into r (libcurl's header callback's
 * work; fuzzed). */
void fetch_http_header_line(fetch_resp *r, const char *data, size_t n);
/* The host[:port] of an http(s) URL, lower-cased, into out; 0, or -1 when
 * url is not one (or its host has a user part or other characters). */
int fetch_http_host(const char *url, char *out, size_t n);
/* Where a redirect from `from` to `to` may go: 0 when allowed (https, or
 * http from http), -1 with c->err set. A location relative to the host is
 * made absolute in `to` (n bytes). */
int fetch_http_redirect_ok(fetch_ctx *c, const char *from, char *to, size_t n);

/* ---- fetch_xfer.c ---- */

/* A file to bring into the cache. */
typedef struct fetch_file {
    char name[FETCH_MAX_PATH]; /* in the source, for messages and progress */
    char url[4096];            /* where its bytes are (after the hub's redirect) */
    fetch_auth auth;           /* what url gets: the credentials go only to its host */
    char dest[PATH_MAX];       /* the verified file's place */
    char lock[PATH_MAX];       /* its lock file */
    char want[72];             /* expected sha256 (lower-case hex), "" none */
    int verify_hit;            /* a file already in place is hashed against want (the caller's own digest);
                                * with verify_cached every file in place is */
    uint64_t size;             /* expected size, 0 unknown */
} fetch_file;

/* Brings f into f->dest unless it is there: takes the lock (waiting while
 * another process holds it, reported as "waiting"), transfers, verifies
 * and renames. */
llm_status fetch_xfer_get(fetch_ctx *c, fetch_file *f);

/* ---- fetch_hf.c, fetch_url.c: the sources ---- */

/* The source's files into the cache; path: the model's (a split set's
 * first part). The _check forms: the reference's form only, no request. */
llm_status fetch_hf_get(fetch_ctx *c, const char *uri, char *path, size_t n);
llm_status fetch_hf_check(fetch_ctx *c, const char *uri);
llm_status fetch_url_get(fetch_ctx *c, const char *uri, char *path, size_t n);
llm_status fetch_url_check(fetch_ctx *c, const char *uri);

/* ---- fetch.c: shared helpers ---- */

/* Sets c->why and c->err; returns the status. */
llm_status fetch_fail(fetch_ctx *c, fetch_reason why, llm_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A line for the log (the options' log function, else stderr). */
void fetch_log(fetch_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Reports progress (at most twice a second unless force). phase: a
 * string literal. */
void fetch_report(fetch_ctx *c, const char *phase, uint64_t done_in_file, int force);
/* 1 when the caller asked the fetch to stop. */
int fetch_aborted(fetch_ctx *c);
/* Waits s seconds, or until aborted (-1). */
int fetch_sleep(fetch_ctx *c, long s);
/* Seconds before retry k (1-based): the server's Retry-After when given
 * (>= 0), else 1, 2, 4 ... 32. */
long fetch_backoff_s(int k, long retry_after);
/* Part k's (1-based) name of a split set named like name, or name itself
 * when it is not one; -1 when it does not fit. */
int fetch_part_name(const char *name, int k, char *out, size_t n);
/* The expected digest of part k (1-based), "" for none. */
const char *fetch_want(const fetch_ctx *c, int k);
/* Checks that the digests given (o->sha256) fit a source of n_parts
 * files: none, or one per part. */
llm_status fetch_wants_fit(fetch_ctx *c, const char *uri, int n_parts);
/* A path segment list from a source: no empty, "." or ".." segment, no
 * leading "/", no backslash or control character, at most FETCH_MAX_PATH
 * bytes. 1 when it is one. */
int fetch_path_ok(const char *p);
/* A URL path, percent-encoded (unreserved characters and '/' kept); -1
 * when it does not fit. */
int fetch_encode_path(char *dst, size_t n, const char *p);
/* How much of url a message shows: up to its query (which may carry a
 * signature or a token), at most 200 bytes. For "%.*s". */
int fetch_shown(const char *url);
/* Lower-case hex of length len exactly: 1 when it is. */
int fetch_hex_ok(const char *s, size_t len);
/* mkdir -p of the folder that holds path. 0 or -1 (errno). */
int fetch_mkdirs_for(const char *path);
/* A unique temporary name beside path (process, thread and a counter):
 * two fetches, in one process or two, never share one. */
void fetch_tmp_name(const char *path, const char *suffix, char *out, size_t n);

#endif
