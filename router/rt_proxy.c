/* rt_proxy.c - proxying one request with retries and streaming; see rt_proxy.h. */
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "http_guard.h"
#include "http_reply.h"
#include "rt_proxy.h"
#include "rt_quota.h"
#include "rt_routes.h"
#include "llm/clock.h"
#include "llm/heap.h"
#include "llm/json.h"

#define ERR_BODY_MAX 65536
/* An answer's usage object is in its last bytes: a whole answer's last
 * member, a stream's last event before [DONE] (stream_options.include_usage). */
#define TAIL_MAX 1024

/* An OpenAI error answer of type and code ecode (NULL: null), with the
 * extra head lines (NULL: none). */
static int send_error(struct mg_connection *c, int code, const char *type, const char *ecode, const char *msg,
                      const char *extra)
{
    json_t *j = json_pack("{s:{s:s,s:s,s:n,s:o}}", "error", "message", msg, "type", type, "param", "code",
                          ecode ? json_string(ecode) : json_null());
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    const char *b = body ? body : "{\"error\":{\"message\":\"router error\"}}";
    http_reply_text(c, code, "application/json", b, extra);
    free(body);
    json_decref(j);
    return code;
}

/* An OpenAI error answer whose type follows from its status; a 503 says
 * when to retry. */
static int reply_error(struct mg_connection *c, int code, const char *ecode, const char *msg)
{
    const char *type = code == 503 ? "service_unavailable"
                       : code == 413 || code == 408 || code == 400 || code == 415 || code == 404 || code == 401
                           ? "invalid_request_error"
                           : "server_error";
    return send_error(c, code, type, ecode, msg, code == 503 ? "Retry-After: 1\r\n" : NULL);
}

static int reply(struct mg_connection *c, int code, const char *msg)
{
    return reply_error(c, code, NULL, msg);
}

/* Writes one piece of a chunked answer in one write when it is small
 * (each write is a packet with tcp_nodelay); 1, or 0 when the client is
 * gone. HTTP/1.0: the bytes as they are. */
static int chunk_put(struct mg_connection *c, const char *d, size_t len)
{
    if (http_reply_unchunked(c))
        return mg_write(c, d, len) == (int)len;
    char buf[16384];
    int h = snprintf(buf, sizeof buf, "%zx\r\n", len);
    if (len + (size_t)h + 2 <= sizeof buf) { /* a short write (a timeout midway) breaks the framing: gone */
        memcpy(buf + h, d, len);
        memcpy(buf + h + len, "\r\n", 2);
        return mg_write(c, buf, (size_t)h + len + 2) == (int)((size_t)h + len + 2);
    }
    return mg_write(c, buf, (size_t)h) == h && mg_write(c, d, len) == (int)len && mg_write(c, "\r\n", 2) == 2;
}

/* chunk_put under the send deadline. */
static int chunk_write(struct mg_connection *c, const char *d, size_t len)
{
    http_guard_sending(c, len); /* a client that does not take its answer is cut */
    int ok = chunk_put(c, d, len);
    http_guard_disarm(c);
    return ok;
}

/* One attempt's state. */
typedef struct attempt {
    struct mg_connection *c;
    const int *cutting;        /* the proxy's: shutting down past the drain timeout */
    const char *name;          /* the backend's name for the X-Backend header; NULL: none (rt_proxy.expose_backend) */
    const char *revision;      /* "stable" or "canary", for the X-Revision header */
    const char *tenant;        /* sent as X-LLM-Tenant (with the gateway's own key); NULL: none */
    const char *upstream_auth; /* the Authorization sent instead of the client's; NULL: the client's */
    const char *traceparent;   /* sent to the backend; NULL: none */
    long events;               /* "data:" lines of a stream (its tokens, when it carries no usage) */
    double t0, first, last;    /* start, first and latest body byte (0: none yet) */
    rt_pool *pool;             /* the backend's, and its index there: */
    int idx;                   /* its pending bytes go at the first byte (rt_pool_started) */
    rt_result res;             /* inter-token gaps of a stream, counted here */
    long status;
    char ctype[128];
    int retry_after;           /* the answer has Retry-After: the backend says "not now" (full, loading, draining) */
    int has_session;           /* a session key chose the backend: its 429 is held, and the next one tried */
    const char *body;          /* the request's body, as curl reads it (read_body) */
    size_t body_len, body_at;
    int body_sent;             /* curl took the whole body to send: the backend may have acted on it */
    int started;               /* the response head went to the client */
    int client_gone;
    char *err_body;            /* a 5xx body held back (a retry may follow) */
    size_t err_len;
    char tail[TAIL_MAX];       /* the answer's last bytes (its usage is there) */
    size_t tail_n;
} attempt;

static size_t on_header(char *d, size_t sz, size_t n, void *arg)
{
    attempt *a = arg;
    size_t len = sz * n;
    if (len > 5 && !strncmp(d, "HTTP/", 5)) {
        const char *sp = memchr(d, ' ', len);
        a->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        a->ctype[0] = 0;
        a->retry_after = 0;
    } else if (len > 12 && !strncasecmp(d, "Retry-After:", 12)) {
        a->retry_after = 1;
    } else if (len > 13 && !strncasecmp(d, "Content-Type:", 13)) {
        size_t k = 13;
        while (k < len && d[k] == ' ') k++;
        size_t m = len - k;
        while (m && (d[k + m - 1] == '\r' || d[k + m - 1] == '\n')) m--;
        snprintf(a->ctype, sizeof a->ctype, "%.*s", (int)m, d + k);
    }
    return len;
}

/* The last TAIL_MAX bytes of what went to the client. */
static void keep_tail(attempt *a, const char *d, size_t len)
{
    if (len >= TAIL_MAX) {
        memcpy(a->tail, d + len - TAIL_MAX, TAIL_MAX);
        a->tail_n = TAIL_MAX;
        return;
    }
    size_t keep = a->tail_n + len > TAIL_MAX ? TAIL_MAX - len : a->tail_n;
    memmove(a->tail, a->tail + a->tail_n - keep, keep);
    memcpy(a->tail + keep, d, len);
    a->tail_n = keep + len;
}

/* A non-negative integer member of obj: its value, or -1. */
static int int_member(llm_json_span obj, const char *key)
{
    llm_json_span v;
    if (!llm_json_member(obj, key, &v) || v.n == 0 || v.n > 9)
        return -1;
    int x = 0;
    for (size_t k = 0; k < v.n; k++) {
        if (v.p[k] < '0' || v.p[k] > '9')
            return -1;
        x = x * 10 + (v.p[k] - '0');
    }
    return x;
}

/* The usage in an answer's tail: prompt_tokens, total_tokens and
 * prompt_tokens_details.cached_tokens of its last "usage" object (-1 each
 * when there is none). The model's text cannot forge one: a quote in it
 * is escaped. The backend can, and rt_pool's trust bounds what it gains. */
static void usage_of(const attempt *a, int *prompt, int *cached, int *total)
{
    static const char key[] = "\"usage\"";
    const char *at = NULL;
    for (const char *p = a->tail; (p = memmem(p, a->tail_n - (size_t)(p - a->tail), key, sizeof key - 1)); p++) at = p;
    *prompt = *cached = *total = -1;
    if (!at)
        return;
    const char *obj = at + sizeof key - 1, *end = a->tail + a->tail_n;
    while (obj < end && (*obj == ' ' || *obj == ':')) obj++;
    if (obj == end || *obj != '{') /* "usage": null, or cut */
        return;
    llm_json_span u = {obj, a->tail_n - (size_t)(obj - a->tail)}, d;
    *prompt = int_member(u, "prompt_tokens");
    *total = int_member(u, "total_tokens");
    *cached = llm_json_member(u, "prompt_tokens_details", &d) ? int_member(d, "cached_tokens") : -1;
}

static size_t on_body(char *d, size_t sz, size_t n, void *arg)
{
    attempt *a = arg;
    size_t len = sz * n;
    double now = llm_clock_mono_s();
    if (!a->first) {
        a->first = now;
        if (a->res.pending > 0) /* (its prompt is computed; cache-aware picks alone count bytes) */
            rt_pool_started(a->pool, a->idx, a->res.pending);
        a->res.pending = 0;
    } else if (strstr(a->ctype, "event-stream")) { /* one chunk per token: the gap is the inter-token latency */
        a->res.itl[rt_pool_bucket(now - a->last)]++;
        a->res.itl_sum += now - a->last;
        a->res.itl_n++;
    }
    a->last = now;
    if ((a->status >= 500 || (a->status == 429 && a->has_session)) && !a->started) { /* hold it: another backend may
                                                                                    * answer instead */
        if (a->err_len + len <= ERR_BODY_MAX) {
            char *p = realloc(a->err_body, a->err_len + len + 1);
            if (p) {
                memcpy(p + a->err_len, d, len);
                a->err_len += len;
                p[a->err_len] = 0;
                a->err_body = p;
            }
        }
        return len;
    }
    if (!a->started) {
        a->started = 1;
        char extra[400];
        snprintf(extra, sizeof extra, "%s%s%sX-Revision: %s\r\n", a->name ? "X-Backend: " : "", a->name ? a->name : "",
                 a->name ? "\r\n" : "", a->revision);
        if (http_reply_stream_head(a->c, (int)a->status, a->ctype[0] ? a->ctype : "application/json", extra) <= 0) {
            a->client_gone = 1;
            return 0;
        }
    }
    if (strstr(a->ctype, "event-stream")) /* (a "data:" cut between two pieces is missed: an estimate) */
        for (const char *p = d; (p = memmem(p, len - (size_t)(p - d), "data:", 5)); p += 5) a->events++;
    if (len && !chunk_write(a->c, d, len)) { /* the client left: abort, the backend cancels */
        a->client_gone = 1;
        return 0;
    }
    keep_tail(a, d, len);
    return len;
}

/* Headers passed on to the backend: the session's too (a colocated canary
 * keeps a session on one revision by it), and the trace context. Never
 * the client's X-LLM-Tenant
 * (not in the list): with the gateway's own key (upstream_auth) the
 * tenant the gateway found for the client's key goes instead. */
static struct curl_slist *forward_headers(struct mg_connection *c, const char *affinity, const attempt *a)
{
    static const char *const keep[] = {"Content-Type", "Authorization", "Accept", "OpenAI-Organization",
                                       "X-Request-Id", "X-Session-Id", "traceparent", "tracestate", NULL};
    struct curl_slist *h = curl_slist_append(NULL, "Expect:"); /* no 100-continue round trip */
    char line[8192];
    if (h && a->upstream_auth && snprintf(line, sizeof line, "Authorization: %s", a->upstream_auth) < (int)sizeof line)
        h = curl_slist_append(h, line);
    if (h && a->upstream_auth && a->tenant && snprintf(line, sizeof line, "X-LLM-Tenant: %s", a->tenant) < (int)sizeof line)
        h = curl_slist_append(h, line);
    if (h && a->traceparent && snprintf(line, sizeof line, "traceparent: %s", a->traceparent) < (int)sizeof line)
        h = curl_slist_append(h, line);
    for (size_t i = 0; h && i < sizeof keep / sizeof *keep; i++) {
        const char *name = keep[i] ? keep[i] : affinity;
        if (!name || (!keep[i] && !strcasecmp(name, "X-Session-Id")) || (a->upstream_auth && !strcasecmp(name, "Authorization")) ||
            !strcasecmp(name, "X-LLM-Tenant") || (a->traceparent && !strncasecmp(name, "trace", 5)))
            continue; /* (tracing here: the router's own span's traceparent went instead; not tracing: the
                       * client's passes on as it is, for the pods to validate) */
        const char *v = mg_get_header(c, name);
        if (v && snprintf(line, sizeof line, "%s: %s", name, v) < (int)sizeof line)
            h = curl_slist_append(h, line);
    }
    return h;
}

/* One curl handle per worker thread (cleaned up when the thread ends); the
 * backend connections they keep alive are one pool shared by every thread,
 * KEEP_CONNS at most. A pool per thread kept an idle connection per thread
 * and backend: with 512 worker threads, one client's requests one after
 * another (each on the next thread) filled a backend's own connection limit
 * with the router's idle keep-alives, and it refused everyone (503).
 * RT_PROXY_KEEP_CONNS at most. */
static pthread_key_t curl_key;
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLSH *conn_pool; /* NULL: could not be made (each thread keeps its own, a few) */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;

static void drop_curl(void *h)
{
    curl_easy_cleanup(h);
}

static void pool_lock(CURL *h, curl_lock_data d, curl_lock_access a, void *u)
{
    (void)h, (void)d, (void)a, (void)u;
    pthread_mutex_lock(&pool_mu);
}

static void pool_unlock(CURL *h, curl_lock_data d, void *u)
{
    (void)h, (void)d, (void)u;
    pthread_mutex_unlock(&pool_mu);
}

static void make_key(void)
{
    pthread_key_create(&curl_key, drop_curl);
    CURLSH *sh = curl_share_init();
    if (sh && (curl_share_setopt(sh, CURLSHOPT_LOCKFUNC, pool_lock) != CURLSHE_OK ||
               curl_share_setopt(sh, CURLSHOPT_UNLOCKFUNC, pool_unlock) != CURLSHE_OK ||
               curl_share_setopt(sh, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT) != CURLSHE_OK)) {
        curl_share_cleanup(sh);
        sh = NULL;
    }
    conn_pool = sh; /* lives as long as the process */
}

static CURL *thread_curl(void)
{
    pthread_once(&curl_once, make_key);
    CURL *h = pthread_getspecific(curl_key);
    if (!h && (h = curl_easy_init()))
        pthread_setspecific(curl_key, h);
    return h;
}

/* curl's progress callback (about once a second, and on each transfer):
 * a client that left while a whole answer is made upstream (nothing is
 * written to it until the end) aborts the transfer; the backend cancels.
 * So does the drain timeout: the answer ends with an error, not a reset. */
static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
    attempt *a = arg;
    (void)dt, (void)dn, (void)ut, (void)un;
    if (!a->client_gone && http_guard_client_gone(a->c))
        a->client_gone = 1;
    return a->client_gone || __atomic_load_n(a->cutting, __ATOMIC_RELAXED);
}

/* curl's read function: the body, and when it is all taken, body_sent. */
static size_t read_body(char *buf, size_t sz, size_t n, void *arg)
{
    attempt *a = arg;
    size_t k = a->body_len - a->body_at < sz * n ? a->body_len - a->body_at : sz * n;
    memcpy(buf, a->body + a->body_at, k);
    a->body_at += k;
    if (a->body_at == a->body_len)
        a->body_sent = 1;
    return k;
}

/* curl's seek function: a send on a reused connection that died is tried
 * again on a new one from the start (body_sent stays set: it went out). */
static int seek_body(void *arg, curl_off_t off, int origin)
{
    attempt *a = arg;
    if (origin != SEEK_SET || off < 0 || (size_t)off > a->body_len)
        return CURL_SEEKFUNC_CANTSEEK;
    a->body_at = (size_t)off;
    return CURL_SEEKFUNC_OK;
}

/* One attempt at backend url; returns the curl result. */
static CURLcode send_to(rt_proxy *px, struct mg_connection *c, const char *url, const char *body, size_t len,
                        attempt *a)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    char full[4096];
    snprintf(full, sizeof full, "%s%s%s%s", url, ri->local_uri, ri->query_string ? "?" : "",
             ri->query_string ? ri->query_string : "");
    CURL *h = thread_curl();
    if (!h)
        return CURLE_FAILED_INIT;
    curl_easy_reset(h);
    if (conn_pool)
        curl_easy_setopt(h, CURLOPT_SHARE, conn_pool);
    curl_easy_setopt(h, CURLOPT_MAXCONNECTS, (long)RT_PROXY_KEEP_CONNS);
    struct curl_slist *hdr = forward_headers(c, px->affinity_header, a);
    curl_easy_setopt(h, CURLOPT_URL, full);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, ri->request_method);
    a->body = body ? body : "";
    a->body_len = len;
    if (len || !strcmp(ri->request_method, "POST")) { /* read by curl through read_body, which tells when it went out */
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, read_body);
        curl_easy_setopt(h, CURLOPT_READDATA, a);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_body);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, a);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
        a->body_sent = len == 0;
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, a);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, a);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, px->timeout_s);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, a);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdr);
    return rc;
}

static const char WAITING[] = ": waiting for a backend\n\n";
static const char NO_BACKEND_EVENT[] =
    "data: {\"error\":{\"message\":\"no backend could take the request\",\"type\":\"service_unavailable\"}}\n\n";

static const char CUT_EVENT[] =
    "data: {\"error\":{\"message\":\"the backend failed midway\",\"type\":\"server_error\"}}\n\n";

/* A backend's 5xx answer held back while others are tried. */
typedef struct held_err {
    char *body;
    size_t len;
    long status;
    char type[128];
} held_err;

/* Sends a backend's answer that was held back whole (status, type, body);
 * a 429 or 503 says when to retry (the backend's own words are gone). */
static int send_held(struct mg_connection *c, long status, const char *type, const char *body, size_t len)
{
    return http_reply(c, (int)status, type && *type ? type : "application/json", body, len,
                      status == 429 || status == 503 ? "Retry-After: 1\r\n" : NULL);
}

/* Holds a request while no backend is known (scaled to zero). 1 when one
 * appeared; 0 when the hold timed out or the client left (*answered set
 * when a response was already begun: a stream's head and comments). */
static int hold(rt_proxy *px, rt_pool *pool, struct mg_connection *c, int stream, int *answered)
{
    *answered = 0;
    double hold_s = px->routes ? rt_pool_hold(pool) : px->hold_s; /* at a gateway: the route's */
    if (hold_s <= 0 || rt_pool_size(pool) > 0)
        return rt_pool_size(pool) > 0;
    if (__atomic_add_fetch(&px->held, 1, __ATOMIC_RELAXED) > px->hold_max) {
        __atomic_sub_fetch(&px->held, 1, __ATOMIC_RELAXED);
        return 0;
    }
    __atomic_add_fetch(&px->held_total, 1, __ATOMIC_RELAXED);
    /* one route (its deployment's pods never coming) may hold half of the slots, no more: the others' requests
     * still wait, and are counted, so their deployments wake; a refused one still counts toward its total */
    if (rt_pool_held(pool, 1) > (px->routes && px->hold_max > 1 ? px->hold_max / 2 : px->hold_max)) {
        rt_pool_held(pool, -1);
        __atomic_sub_fetch(&px->held, 1, __ATOMIC_RELAXED);
        return 0;
    }
    double end = llm_clock_mono_s() + hold_s, next_comment = 0;
    int ok = 0;
    while (!ok && llm_clock_mono_s() < end && !__atomic_load_n(&px->cutting, __ATOMIC_RELAXED)) {
        if (stream && llm_clock_mono_s() >= next_comment) {
            if (!*answered && http_reply_stream_head(c, 200, "text/event-stream", NULL) <= 0)
                break;
            *answered = 1;
            if (!chunk_write(c, WAITING, sizeof WAITING - 1))
                break; /* the client left */
            next_comment = llm_clock_mono_s() + 2;
        }
        usleep(100000);
        ok = rt_pool_size(pool) > 0;
    }
    rt_pool_held(pool, -1);
    __atomic_sub_fetch(&px->held, 1, __ATOMIC_RELAXED);
    return ok;
}

/* The start of the prompt: a completion's prompt, or the chat messages'
 * contents in order, up to n-1 bytes ("p:" first, apart from user keys).
 * Read from the body's text, not parsed: at most n bytes are decoded. */
static void prompt_prefix(llm_json_span body, char *out, size_t n)
{
    size_t k = (size_t)snprintf(out, n, "p:");
    llm_json_span p, msgs, m, ct;
    if (llm_json_member(body, "prompt", &p) && llm_json_string(p, out + k, n - k) >= 0)
        return;
    out[k] = 0;
    size_t pos = 0;
    int chat = llm_json_member(body, "messages", &msgs);
    while (chat && k + 1 < n && llm_json_item(msgs, &pos, &m)) {
        long got = llm_json_member(m, "content", &ct) ? llm_json_string(ct, out + k, n - k) : -1;
        k += got > 0 ? (size_t)got : 0;
        if (k + 1 < n)
            out[k++] = '\x1f';
        out[k] = 0;
    }
    if (k <= 2)
        out[0] = 0;
}

/* The session key: the affinity header, else the body's "user", else
 * (with prefix affinity) the prompt's first bytes, so requests sharing a
 * long prefix land on the pod that has it cached. body: the request's. */
static void session_of(rt_proxy *px, struct mg_connection *c, llm_json_span body, char *out, size_t n)
{
    llm_json_span u;
    out[0] = 0;
    const char *h = px->affinity_header ? mg_get_header(c, px->affinity_header) : NULL;
    if (h) {
        snprintf(out, n, "%s", h);
        return;
    }
    if (px->affinity_user && llm_json_member(body, "user", &u) && llm_json_string(u, out, n) >= 0)
        return;
    out[0] = 0;
    if (px->prefix_affinity > 0 && body.n)
        prompt_prefix(body, out, (size_t)px->prefix_affinity + 3 < n ? (size_t)px->prefix_affinity + 3 : n);
}

/* How a failed transfer (rc) ended, for the breaker and for a retry. */
enum { XFER_OURS = 0, XFER_UNREACHED, XFER_DROPPED, XFER_FULL };

/* XFER_UNREACHED: the backend could not be reached, or went away before
 * the request's body went out: the backend's fault, and another backend
 * may take the request. XFER_DROPPED: the backend dropped the connection
 * once it had the whole request: its fault too, but the request may be
 * what broke it, so it goes nowhere else (one request must not take out
 * every backend). XFER_OURS: a timeout once the request was sent (the
 * request's own: a long generation), or ours (a URL curl refuses, no
 * memory), or the client's (it left): not the backend's fault. XFER_FULL:
 * the router itself is out of descriptors (or memory): nobody's fault but
 * its load's, 503 to the client. */
static int xfer_fault(CURL *h, CURLcode rc, const attempt *a)
{
    curl_off_t sent = 0;
    long os_errno = 0;
    if (curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &os_errno) == CURLE_OK &&
        (os_errno == EMFILE || os_errno == ENFILE || os_errno == ENOBUFS || os_errno == ENOMEM))
        return XFER_FULL; /* the router ran out of descriptors or memory: no backend's fault */
    switch (rc) {
    case CURLE_OPERATION_TIMEDOUT:
        return curl_easy_getinfo(h, CURLINFO_PRETRANSFER_TIME_T, &sent) != CURLE_OK || sent == 0 ? XFER_UNREACHED
                                                                                                  : XFER_OURS;
    case CURLE_COULDNT_RESOLVE_HOST: case CURLE_COULDNT_CONNECT: case CURLE_SEND_ERROR: case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING: case CURLE_PARTIAL_FILE:
        return a->body_sent || a->started ? XFER_DROPPED : XFER_UNREACHED;
    default:
        return XFER_OURS;
    }
}

/* The end of an answer that went out: its last chunk; or, when the
 * backend failed midway, an error event (a stream) and a close without
 * the last chunk, so the client sees the answer cut rather than whole. */
static int finish(struct mg_connection *c, const attempt *a, CURLcode rc)
{
    if (rc == CURLE_OK) {
        http_reply_stream_end(c);
        return a->status ? (int)a->status : 200;
    }
    if (strstr(a->ctype, "event-stream"))
        chunk_write(c, CUT_EVENT, sizeof CUT_EVENT - 1);
    mg_disable_connection_keep_alive(c);
    return 502;
}

/* The answer after an attempt not to be retried. */
static int last_attempt(struct mg_connection *c, attempt *a, CURLcode rc, int xfer)
{
    int code;
    if (a->client_gone)
        code = 499;
    else if (a->started)
        code = finish(c, a, rc);
    else if (rc == CURLE_OPERATION_TIMEDOUT)
        code = reply(c, 504, "the backend did not answer within the router's timeout_s");
    else if (xfer == XFER_FULL)
        code = reply(c, 503, "the router is out of descriptors or memory; retry shortly");
    else if (xfer == XFER_DROPPED)
        code = reply(c, 502, "the backend dropped the connection after it had the request; "
                                                 "not retried elsewhere (the request may be what broke it)");
    else if (rc != CURLE_OK)
        code = reply(c, 502, "the router could not pass the request on");
    else /* an answer held back (its 503 or 504), or one without a body: the head still goes out */
        code = send_held(c, a->status, a->ctype, a->err_body, a->err_len);
    free(a->err_body);
    a->err_body = NULL;
    return code;
}

/* Who sent the request (the gateway's keys on) and what its answer used. */
typedef struct caller {
    const api_key *key;        /* NULL: keys are off */
    rt_quota_ticket ticket;    /* what its tenant's limits let in (rt_quota_done gives it back) */
    otlp_ctx span;             /* its span (traces on) */
    char traceparent[56];      /* the span's, for the backend; "": not traced */
    char model[RT_MODEL_NAME_MAX + 1], backend[256]; /* for the span (a URL: its first 255 bytes) */
    char route[64];            /* at a gateway: the route's name */
    int prompt_tokens, cached_tokens;
    long tokens;               /* the answer's total_tokens, else its stream's events and the request body's bytes / 4 */
} caller;

/* The tokens a 200 answer used, for its tenant's tpm: its usage's, else
 * an estimate (the body's bytes stand for the prompt's tokens, 4 each). */
static long tokens_of(const attempt *a, int total, size_t body_len)
{
    return total >= 0 ? total : a->events + (long)(body_len / 4);
}

/* What attempt a ended with, for the pool (its times, status and usage)
 * and the caller (its tokens); len: the request body's bytes. */
static void settle(attempt *a, CURLcode rc, size_t len, caller *who)
{
    a->res.seconds = llm_clock_mono_s() - a->t0;
    a->res.ttfb = a->first ? a->first - a->t0 : -1;
    a->res.status = rc == CURLE_OK || a->started ? (int)a->status : rc == CURLE_OPERATION_TIMEDOUT ? 504 : 0;
    a->res.prompt_tokens = a->res.cached_tokens = a->res.completion_tokens = -1;
    int total = -1;
    if (rc == CURLE_OK && a->status == 200)
        usage_of(a, &a->res.prompt_tokens, &a->res.cached_tokens, &total);
    if (total >= 0 && a->res.prompt_tokens >= 0 && total >= a->res.prompt_tokens)
        a->res.completion_tokens = total - a->res.prompt_tokens;
    who->prompt_tokens = a->res.prompt_tokens, who->cached_tokens = a->res.cached_tokens;
    if (a->body_sent) /* the pod had the prompt: charged, whatever came of it (a client gone, a 4xx) */
        who->tokens = tokens_of(a, rc == CURLE_OK && a->status == 200 ? total : -1, len);
}

/* One pass over the backends: the answer is sent here unless none could
 * take it. Returns the status sent, or 0 (*held* keeps the last 5xx, owned
 * by the caller). */
static int attempts(rt_proxy *px, rt_pool *pool, struct mg_connection *c, const rt_request *req, const char *body,
                    size_t len, int answered, held_err *held, caller *who)
{
    unsigned char avoid[RT_MAX_BACKENDS / 8] = {0};
    char url[256];
    rt_request q = *req;
    const char *session = q.session;
    q.avoid = avoid;
    for (int attempt_no = 0; attempt_no <= px->retries; attempt_no++) {
        rt_pick pick = {0};
        int idx = rt_pool_pick(pool, &q, url, sizeof url, &pick);
        if (idx < 0)
            return 0;
        char name[128];
        attempt a = {.c = c, .cutting = &px->cutting, .t0 = llm_clock_mono_s(), .started = answered, /* a held stream has its head */
                     .revision = rt_pool_revision(pool, idx) ? "canary" : "stable", .upstream_auth = px->upstream_auth,
                     .tenant = who->key ? who->key->tenant : NULL,
                     .traceparent = who->traceparent[0] ? who->traceparent : NULL, .pool = pool, .idx = idx,
                     .res = {.pending = pick.pending}};
        snprintf(who->backend, sizeof who->backend, "%.255s", url);
        if (px->expose_backend && rt_pool_name(pool, idx, name, sizeof name))
            a.name = name;
        a.has_session = *session != 0;
        CURLcode rc = send_to(px, c, url, body, len, &a);
        /* the backend's fault: unreachable, dropped, 5xx before a byte went out - but for a 503 with Retry-After,
         * "not now" (its connections full, loading, draining: another backend is tried, the breaker not told),
         * a 503 without (one request's error: the client gets it) and its own 504 (the request ran past the
         * backend's deadline: another would run it again) */
        int xfer = rc == CURLE_OK || a.client_gone ? XFER_OURS : xfer_fault(thread_curl(), rc, &a);
        int busy = rc == CURLE_OK && a.status == 503 && a.retry_after && !a.started && !a.client_gone;
        int answer5xx = rc == CURLE_OK && a.status >= 500 && a.status != 503 && a.status != 504 && !a.started;
        int fault = !a.client_gone && ((xfer != XFER_OURS && xfer != XFER_FULL) || answer5xx);
        /* a session's pod at its limit (429) sends that request on along the ring; the pod is not marked busy:
         * the limit may be one tenant's, and must not turn others away */
        int moved = rc == CURLE_OK && a.status == 429 && *session && !a.started && !a.client_gone;
        int retry = (xfer == XFER_UNREACHED || answer5xx || busy || moved) && !a.started && !a.client_gone;
        a.res.ok = !fault; /* the breaker counts only the backend's faults */
        a.res.busy = busy;
        a.res.dropped = xfer == XFER_DROPPED;
        a.res.predicted = pick.predicted;
        settle(&a, rc, len, who);
        rt_pool_release(pool, idx, &a.res);
        avoid[idx / 8] |= (unsigned char)(1u << (idx % 8));
        if (!retry)
            return last_attempt(c, &a, rc, xfer);
        if (rc == CURLE_OK) { /* a 5xx before any byte: keep it in case no one else answers */
            free(held->body);
            held->body = a.err_body, held->len = a.err_len, held->status = a.status;
            snprintf(held->type, sizeof held->type, "%s", a.ctype);
            a.err_body = NULL;
        }
        free(a.err_body);
    }
    return 0;
}

/* civetweb hands handlers the path percent-decoded: forwarding it as is
 * would let "%20" make curl refuse the URL and "%252e%252e" reach the
 * backend's other routes. API paths are plain: anything else is refused. */
static int plain_path(const char *p)
{
    if (!p || *p != '/')
        return 0;
    for (const char *q = p; *q; q++)
        if (*q <= ' ' || *q > '~' || *q == '%' || *q == '\\' || (*q == '.' && q[-1] == '/'))
            return 0;
    return 1;
}

/* The request's body, read and checked: 0 with *body and *len, or the
 * status of the refusal sent. */
static int take_body(rt_proxy *px, struct mg_connection *c, char **body, size_t *len)
{
    llm_error err = {0};
    char msg[LLM_ERROR_MSG_MAX + 16];
    if (!plain_path(mg_get_request_info(c)->local_uri))
        return reply(c, 400, "the path is not a plain API path (printable ASCII, no '%', no dot segments)");
    if (!strcmp(mg_get_request_info(c)->request_method, "POST") && !http_guard_json_body(c))
        return reply(c, 415, "a POST body must be Content-Type: application/json");
    int bad = http_guard_read_body(c, (size_t)px->max_body, px->body_timeout_s, body, len);
    if (bad) { /* the setting named, so that a client can tell this hop from the pod's */
        char why[200];
        snprintf(msg, sizeof msg, "%s%s", http_guard_body_msg(bad, (size_t)px->max_body, px->body_timeout_s, why, sizeof why),
                 bad == 413 ? " (llm-router --max-body-bytes)" : bad == 408 ? " (llm-router --body-timeout-s)" : "");
        return reply(c, bad, msg);
    }
    /* the few fields the router needs are read from the text (no tree is built); a body nested too deep for
     * any backend to take is refused here rather than carried to one */
    if (*len && llm_json_scan(*body, *len, LLM_JSON_MAX_DEPTH, NULL, &err) == LLM_ERR_TOO_LONG) {
        free(*body);
        *body = NULL;
        snprintf(msg, sizeof msg, "the body: %s", err.msg);
        return reply(c, 400, msg);
    }
    return 0;
}

/* The request after attempts found no backend to answer (code 0), or the
 * code it was answered with. */
static int no_answer(rt_proxy *px, rt_pool *pool, struct mg_connection *c, int answered, const held_err *held)
{
    if (answered) { /* a held stream: its head is out; the error goes as an event */
        chunk_write(c, NO_BACKEND_EVENT, sizeof NO_BACKEND_EVENT - 1);
        http_reply_stream_end(c);
        return 503;
    }
    if (held->body)
        return send_held(c, held->status, held->type, held->body, held->len);
    __atomic_add_fetch(&px->no_backend, 1, __ATOMIC_RELAXED);
    return reply(c, 503, rt_pool_size(pool) ? "no backend could take the request"
                                                                       : "no backends known yet");
}

/* At a gateway: the request's route, held in *route (its pool serves the
 * request), or the refusal sent (its status). */
static int gateway_route(rt_proxy *px, struct mg_connection *c, const char *model, int has_model, rt_route **route)
{
    char msg[1200];
    *route = has_model ? rt_routes_find(px->routes, model) : rt_routes_sole(px->routes);
    if (*route)
        return 0;
    if (has_model) {
        rt_routes_not_served(px->routes, model, msg, sizeof msg);
        return reply_error(c, 404, "model_not_found", msg);
    }
    rt_routes_not_served(px->routes, "", msg, sizeof msg);
    char why[1400];
    snprintf(why, sizeof why, "this gateway serves several deployments: the body's \"model\" chooses one (%s)",
             strstr(msg, "served:") ? strstr(msg, "served:") : msg);
    return reply(c, 400, why);
}

/* GET /v1/models at a gateway: every model and adapter behind it. */
static int gateway_models(rt_proxy *px, struct mg_connection *c)
{
    char *list = rt_routes_models_json(px->routes);
    if (!list)
        return reply(c, 503, "no memory for the model list");
    int code = http_reply_text(c, 200, "application/json", list, NULL);
    free(list);
    return code;
}

/* The gateway's keys: the caller's key; 0, or the refusal's status (sent). */
static int authenticate(rt_proxy *px, struct mg_connection *c, caller *who)
{
    who->key = api_keys_find(px->keys, mg_get_header(c, "Authorization"));
    if (who->key)
        return 0;
    __atomic_add_fetch(&px->unauthorized, 1, __ATOMIC_RELAXED);
    return reply_error(c, 401, "invalid_api_key", "an API key of this gateway is needed: Authorization: Bearer KEY");
}

/* The tokens a request may use, reserved against its tenant's tpm: its
 * body's bytes / 4 for the prompt, and n * max_tokens (256 when it gives
 * none) for the answer. */
static long may_use(llm_json_span b)
{
    long n = int_member(b, "n"), max = int_member(b, "max_tokens");
    if (max < 0)
        max = int_member(b, "max_completion_tokens");
    return (long)(b.n / 4) + (n > 0 ? n : 1) * (max >= 0 ? max : 256);
}

/* The key's rate= and its tenant's limits: 0 (let in, who->ticket
 * taken), or the refusal's status (sent). */
static int limit(rt_proxy *px, struct mg_connection *c, caller *who, llm_json_span body)
{
    char msg[1024], head[64];
    double retry = 1;
    rt_quota_limit l = RT_QUOTA_OK;
    if (!api_keys_admit(px->keys, who->key, llm_clock_mono_s(), &retry)) { /* the key's own rate= (requests/s) */
        snprintf(msg, sizeof msg, "this API key (tenant '%s') is over its rate of %g requests/s; retry in %.1f s",
                 who->key->tenant, who->key->rate, retry);
        l = RT_QUOTA_RPM;
    } else if (px->quota) {
        l = rt_quota_admit(px->quota, who->key, llm_clock_wall_s(), may_use(body), &who->ticket, &retry, msg, sizeof msg);
    }
    if (!l)
        return 0;
    static const char *const ecode[RT_QUOTA_N] = {NULL, "rate_limit_exceeded", "tokens_limit_exceeded",
                                                  "concurrency_limit_exceeded", "quota_store_unavailable"};
    snprintf(head, sizeof head, "Retry-After: %.0f\r\n", ceil(retry < 1 ? 1 : retry));
    return send_error(c, l == RT_QUOTA_STORE ? 503 : 429,
                      l == RT_QUOTA_TPM ? "tokens" : l == RT_QUOTA_STORE ? "service_unavailable" : "requests", ecode[l],
                      msg, head);
}

/* The request, past the gateway's keys: to the backend its route and the
 * policy choose. */
static int serve(rt_proxy *px, struct mg_connection *c, caller *who)
{
    size_t len = 0;
    char *body = NULL, session[4200];
    const struct mg_request_info *ri = mg_get_request_info(c);
    llm_json_span none = {"", 0};
    int code;
    if (px->routes && !strcmp(ri->request_method, "GET") && ri->local_uri && !strcmp(ri->local_uri, "/v1/models"))
        return who->key && (code = limit(px, c, who, none)) ? code : gateway_models(px, c);
    __atomic_add_fetch(&px->active, 1, __ATOMIC_RELAXED);
    if (!(code = take_body(px, c, &body, &len)) && who->key && (code = limit(px, c, who, (llm_json_span){body ? body : "", len})))
        free(body); /* (take_body frees its own on a refusal) */
    if (code) {
        __atomic_sub_fetch(&px->active, 1, __ATOMIC_RELAXED);
        return code;
    }
    llm_json_span b = {body ? body : "", len}, v, m;
    session_of(px, c, b, session, sizeof session);
    /* room for a name over the limit by a whole UTF-8 character: a cut name must not pass for another */
    char model[RT_MODEL_NAME_MAX + 5] = ""; /* an adapter's requests go to the pods that have it (rt_pool.h) */
    long mlen = llm_json_member(b, "model", &m) ? llm_json_string(m, model, sizeof model) : -1;
    if (mlen < 0)
        model[0] = 0;
    rt_route *route = NULL;
    rt_pool *pool = px->pool;
    if (px->routes && (mlen > RT_MODEL_NAME_MAX || (mlen >= 0 && (size_t)mlen != strlen(model))))
        code = reply(c, 400, "model: at most 256 bytes, no NUL (no deployment serves such a name)");
    if (px->routes && (code || (code = gateway_route(px, c, model, mlen >= 0, &route)))) {
        free(body);
        __atomic_sub_fetch(&px->active, 1, __ATOMIC_RELAXED);
        return code;
    }
    if (route) {
        pool = rt_route_pool(route);
        snprintf(who->route, sizeof who->route, "%s", rt_route_name(route));
    }
    snprintf(who->model, sizeof who->model, "%.*s", (int)sizeof who->model - 1, model); /* (checked: at most 256) */
    /* cache-aware: the prompt's chain (8 KiB: on the heap, not the worker's small stack; none without memory) */
    rt_prefix_chain *chain = px->cache_aware ? malloc(sizeof *chain) : NULL;
    char partition[API_KEY_MAX_LEN + 16]; /* as the pods partition: by tenant with keys on, else by the key sent */
    if (who->key)
        snprintf(partition, sizeof partition, "tenant %s", who->key->tenant);
    if (chain)
        rt_prefix_chain_of(b, who->key ? partition : mg_get_header(c, "Authorization"), chain);
    int stream = llm_json_member(b, "stream", &v) && v.n == 4 && !memcmp(v.p, "true", 4), answered = 0;
    rt_request q = {.session = session, .model = model, .chain = chain, .streamed = stream};
    held_err held = {0};
    if (rt_pool_size(pool) == 0 && !hold(px, pool, c, stream, &answered) && answered)
        code = 0; /* held, and no backend came: no_answer ends the stream */
    else
        code = attempts(px, pool, c, &q, body, len, answered, &held, who);
    free(body);
    free(chain);
    if (!code)
        code = no_answer(px, pool, c, answered, &held);
    rt_routes_put(px->routes, route);
    free(held.body);
    llm_heap_after(len);
    __atomic_sub_fetch(&px->active, 1, __ATOMIC_RELAXED);
    return code;
}

/* The request's span (traces on): under the client's traceparent when it
 * is valid. */
static void trace_request(rt_proxy *px, const caller *who, const otlp_ctx *in, int has_in, uint64_t start_ns, int code)
{
    /* nothing of the request's text but the model's name (the path and the prompt stay out); the token counts
     * only when the answer said them */
    otlp_attr a[] = {{"gen_ai.request.model", who->model, 0}, {"llm.route", who->route, 0},
                     {"llm.tenant", who->key ? who->key->tenant : "", 0}, {"llm.backend", who->backend, 0},
                     {"http.response.status_code", NULL, code},
                     {who->prompt_tokens >= 0 ? "gen_ai.usage.input_tokens" : NULL, NULL, who->prompt_tokens},
                     {who->cached_tokens >= 0 ? "gen_ai.usage.cached_tokens" : NULL, NULL, who->cached_tokens}};
    otlp_span(px->traces, &who->span, has_in ? in->span_id : NULL, "llm-router request", OTLP_SERVER, start_ns,
              otlp_now_ns(), a, (int)(sizeof a / sizeof *a), code >= 500);
}

int rt_proxy_handle(struct mg_connection *c, void *cbdata)
{
    rt_proxy *px = cbdata;
    caller who = {.prompt_tokens = -1, .cached_tokens = -1};
    otlp_ctx in;
    uint64_t start_ns = px->traces ? otlp_now_ns() : 0;
    int has_in = px->traces && otlp_traceparent_parse(mg_get_header(c, "traceparent"), &in);
    if (px->traces) {
        otlp_child(px->traces, &in, has_in, &who.span);
        otlp_traceparent_format(&who.span, who.traceparent);
    }
    int code = px->keys ? authenticate(px, c, &who) : 0;
    if (code) /* refused before its body was read: read (a little of) it, so the client gets the answer, not a reset */
        http_guard_discard(c, 2 * px->max_body, 2);
    else
        code = serve(px, c, &who);
    if (px->quota)
        rt_quota_done(px->quota, &who.ticket, who.tokens, llm_clock_wall_s());
    if (px->traces && (!px->keys || who.key)) /* no span for a caller without a key: anyone could fill the queue */
        trace_request(px, &who, &in, has_in, start_ns, code);
    return code;
}
