/* http_guard.c - a connection limit and keep-alive for a civetweb
 * context (see http_guard.h for what and why).
 *
 * Each connection gets a record (civetweb's per-connection user data)
 * from init_connection to connection_close; mu guards the counts. The
 * header deadline is civetweb's own: in 1.15 (Debian bookworm, what we
 * build against) request_timeout_ms bounds a request's headers in all,
 * checked after every read, and keep_alive_timeout_ms those of a kept-alive
 * connection's next request (tests/integration/test_hostile.py holds it to
 * that: a newer civetweb that timed each read instead would fail there).
 *
 * A body is another matter: civetweb's mg_read fills the buffer it is
 * given, so a client sending a byte every second keeps one call going for
 * hours. A handler arms a deadline for such a phase; a watchdog thread
 * shuts the connection's socket when it passes, which ends the read.
 * civetweb hands out no descriptor: the handler's thread finds it once per
 * connection among the process's descriptors by its two addresses (known
 * once the headers are in; sock_of). An armed record is unlinked in
 * connection_close, which takes mu and runs before civetweb closes the
 * socket, so the watchdog (under mu) never shuts a reused number. The same
 * descriptor tells a handler whether its client has gone (client_gone). */
#include "http_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <errno.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include "llm/clock.h"
#include "llm/sync.h"
#include "llm/thread.h"
#include "http_reply.h"

#define GUARD_RETRY_1 "Retry-After: 1\r\n"

typedef struct guard_conn {
    struct guard_conn *prev, *next; /* armed ones, under mu */
    int over;         /* opened above the limit: refused */
    int body_read;    /* the current request's body was read whole */
    double deadline;  /* CLOCK_MONOTONIC seconds, while armed */
    int shut;         /* the watchdog shut its socket */
    int fd, fd_known; /* the socket (sock_of), once looked up; -1: not found */
} guard_conn;

enum { GUARD_RESERVE = 32, WATCH_MS = 100 };

/* A handler set with http_guard_route. */
typedef struct guard_route {
    mg_request_handler fn;
    void *cbdata;
} guard_route;

struct http_guard {
    http_guard_cfg cfg;
    struct mg_context *mg;
    llm_sync_worker w;             /* the watchdog; w.mu guards what follows */
    guard_conn armed;         /* sentinel of the circular list of armed connections */
    int n, closing;
    int serving;              /* the caller's handlers are set (http_guard_serve); atomic */
    http_guard_stats stats;   /* accepted, refused, cut (open is n) */
    guard_route routes[HTTP_GUARD_ROUTES];
    int n_routes;
    char cors[300];           /* http_guard_cors's headers */
};

int http_guard_threads(int max_connections) { return max_connections + GUARD_RESERVE; }

static http_guard *guard_of(const struct mg_connection *c) { return mg_get_user_data(mg_get_context(c)); }

static guard_conn *rec_of(const struct mg_connection *c) { return mg_get_user_connection_data(c); }

/* ---- civetweb callbacks ----------------------------------------------------- */

static int on_init(const struct mg_connection *c, void **data)
{
    http_guard *g = guard_of(c);
    guard_conn *k = calloc(1, sizeof *k); /* NULL: refused in on_begin (it cannot be counted) */
    if (k) {
        pthread_mutex_lock(&g->w.mu);
        k->over = ++g->n > g->cfg.max_connections;
        g->stats.accepted++;
        pthread_mutex_unlock(&g->w.mu);
    }
    *data = k;
    return 0;
}

/* Before civetweb closes the socket; always takes mu (see the top). */
static void on_close(const struct mg_connection *c)
{
    http_guard *g = guard_of(c);
    guard_conn *k = rec_of(c);
    pthread_mutex_lock(&g->w.mu);
    if (k && k->next) { /* still armed: a handler that left early */
        k->prev->next = k->next;
        k->next->prev = k->prev;
    }
    g->n -= k != NULL;
    pthread_mutex_unlock(&g->w.mu);
    free(k);
}

/* What makes the body's length two things, or NULL: two Content-Length
 * values that differ (civetweb takes the first), or Content-Length with
 * Transfer-Encoding (civetweb reads it chunked, and keeps the connection). */
static const char *bad_framing(const struct mg_request_info *ri)
{
    const char *cl = NULL;
    int te = 0;
    for (int i = 0; i < ri->num_headers; i++) {
        const char *name = ri->http_headers[i].name, *value = ri->http_headers[i].value;
        if (!strcasecmp(name, "Content-Length") && cl && strcmp(cl, value))
            return "two Content-Length headers that differ";
        if (!strcasecmp(name, "Content-Length"))
            cl = value;
        te |= !strcasecmp(name, "Transfer-Encoding");
    }
    return cl && te ? "both Content-Length and Transfer-Encoding" : NULL;
}

/* Headers are in. A connection above the limit, or a request before the
 * handlers are set (civetweb listens from mg_start on: it would answer
 * 404), is answered here, before any handler, and closed. */
static int on_begin(struct mg_connection *c)
{
    http_guard *g = guard_of(c);
    guard_conn *k = rec_of(c);
    if (!__atomic_load_n(&g->serving, __ATOMIC_ACQUIRE)) {
        return http_reply_close(c, 503, "{\"error\":{\"message\":\"starting; retry shortly\",\"type\":\"server_error\"}}",
                                GUARD_RETRY_1);
    }
    const char *bad = bad_framing(mg_get_request_info(c));
    if (bad) {
        char body[200];
        snprintf(body, sizeof body, "{\"error\":{\"message\":\"the request has %s\",\"type\":\"invalid_request_error\"}}",
                 bad);
        return http_reply_close(c, 400, body, NULL);
    }
    if (k && !k->over) {
        k->body_read = 0; /* only this connection's thread touches k */
        return 0;
    }
    pthread_mutex_lock(&g->w.mu);
    g->stats.refused++;
    pthread_mutex_unlock(&g->w.mu);
    char body[200];
    snprintf(body, sizeof body, "{\"error\":{\"message\":\"too many connections (limit %d); retry shortly\","
             "\"type\":\"server_error\",\"code\":\"too_many_connections\"}}", g->cfg.max_connections);
    return http_reply_close(c, 503, body, GUARD_RETRY_1);
}

/* ---- the connection's socket ------------------------------------------------------ */

/* Whether socket fd connects the client addr:port to our port sport. */
static int sock_is(int fd, const char *addr, int port, int sport)
{
    struct sockaddr_storage peer, self;
    socklen_t pl = sizeof peer, sl = sizeof self;
    if (getpeername(fd, (struct sockaddr *)&peer, &pl) || getsockname(fd, (struct sockaddr *)&self, &sl))
        return 0; /* not a connected socket */
    char a[INET6_ADDRSTRLEN] = "";
    int p, sp;
    if (peer.ss_family == AF_INET && self.ss_family == AF_INET) {
        inet_ntop(AF_INET, &((struct sockaddr_in *)&peer)->sin_addr, a, sizeof a);
        p = ntohs(((struct sockaddr_in *)&peer)->sin_port);
        sp = ntohs(((struct sockaddr_in *)&self)->sin_port);
    } else if (peer.ss_family == AF_INET6 && self.ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&peer)->sin6_addr, a, sizeof a);
        p = ntohs(((struct sockaddr_in6 *)&peer)->sin6_port);
        sp = ntohs(((struct sockaddr_in6 *)&self)->sin6_port);
    } else {
        return 0;
    }
    return p == port && sp == sport && !strcmp(a, addr);
}

/* The descriptor of c's socket, looked up once per connection (civetweb
 * does not hand it out): the one whose addresses are the request's. Called
 * by the handler's thread: civetweb closes the socket only after the
 * handler returns, and no other socket can have its two addresses, so the
 * scan needs no lock. -1 when not found. */
static int sock_of(struct mg_connection *c, guard_conn *k)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    if (k->fd_known)
        return k->fd;
    k->fd_known = 1;
    k->fd = -1;
    DIR *d = ri ? opendir("/proc/self/fd") : NULL;
    for (struct dirent *e; d && k->fd < 0 && (e = readdir(d));) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);
        if (!*end && fd >= 0 && fd != dirfd(d) && sock_is((int)fd, ri->remote_addr, ri->remote_port, ri->server_port))
            k->fd = (int)fd;
    }
    if (d)
        closedir(d);
    return k->fd;
}

/* ---- the watchdog ------------------------------------------------------------- */

/* Shuts the sockets of the armed connections past their deadlines. Under
 * mu: an armed connection's socket stays open until on_close, which takes mu. */
static void shut_expired(http_guard *g, double now)
{
    for (guard_conn *k = g->armed.next; k != &g->armed; k = k->next)
        if (!k->shut && k->deadline < now && k->fd >= 0 && !shutdown(k->fd, SHUT_RDWR)) {
            k->shut = 1;
            g->stats.cut++;
        }
}

static void *watch(void *arg)
{
    http_guard *g = arg;
    pthread_mutex_lock(&g->w.mu);
    while (!llm_sync_worker_wait(&g->w, llm_clock_mono_s() + WATCH_MS / 1e3))
        shut_expired(g, llm_clock_mono_s());
    pthread_mutex_unlock(&g->w.mu);
    return NULL;
}

/* ---- the API ------------------------------------------------------------------ */

/* Each connection is a descriptor: the soft limit goes up to the hard one
 * when it is below what max_connections needs (plus the model files, the
 * backends' and the health listener's); LLM_ERR_INVALID_ARG naming both
 * when even the hard limit is too low. */
static llm_status fd_room(const http_guard_cfg *cfg, llm_error *err)
{
    struct rlimit rl;
    int max_connections = cfg->max_connections, per = cfg->fds_per_connection > 0 ? cfg->fds_per_connection : 1;
    rlim_t need = ((rlim_t)max_connections + GUARD_RESERVE) * (rlim_t)per + (rlim_t)cfg->fds_extra + 256;
    if (getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur >= need)
        return LLM_OK;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "max_connections %d needs %llu open files; the limit is %llu "
                        "(raise it, or lower max_connections)", max_connections, (unsigned long long)need,
                        (unsigned long long)rl.rlim_max);
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl))
        return llm_errf(err, LLM_ERR_IO, "cannot raise the open files limit to %llu: %s", (unsigned long long)rl.rlim_cur,
                        strerror(errno));
    return LLM_OK;
}

static void guard_free(http_guard *g)
{
    llm_sync_worker_free(&g->w);
    free(g);
}

llm_status http_guard_start(const http_guard_cfg *cfg, const char *const *opts, http_guard **out, llm_error *err)
{
    http_guard *g = calloc(1, sizeof *g);
    const char *all[64];
    char threads[16], req_ms[24], ka_ms[24], ports[300] = "";
    size_t n = 0;
    if (!g)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the HTTP guard");
    g->cfg = *cfg;
    if (cfg->cors_origin && strpbrk(cfg->cors_origin, "\r\n")) {
        free(g);
        return llm_errf(err, LLM_ERR_INVALID_ARG, "cors_origin: a line break in it");
    }
    if (cfg->cors_origin && *cfg->cors_origin)
        snprintf(g->cors, sizeof g->cors, "Access-Control-Allow-Origin: %.250s\r\nVary: Origin\r\n", cfg->cors_origin);
    g->armed.next = g->armed.prev = &g->armed;
    if (llm_sync_worker_init(&g->w)) {
        free(g);
        return llm_errf(err, LLM_ERR_INTERNAL, "cannot make the connection guard's condition variable");
    }
    snprintf(threads, sizeof threads, "%d", http_guard_threads(cfg->max_connections));
    snprintf(req_ms, sizeof req_ms, "%.0f", cfg->header_timeout_s * 1e3);
    snprintf(ka_ms, sizeof ka_ms, "%.0f", (cfg->keep_alive_s + cfg->header_timeout_s) * 1e3);
    for (; opts[n]; n += 2) {
        if (n + 18 >= sizeof all / sizeof *all) {
            guard_free(g);
            return llm_errf(err, LLM_ERR_INVALID_ARG, "HTTP guard: more than %zu civetweb options",
                            sizeof all / sizeof *all / 2 - 9);
        }
        all[n] = opts[n];
        all[n + 1] = opts[n + 1];
        if (!strcmp(opts[n], "listening_ports"))
            snprintf(ports, sizeof ports, "%s", opts[n + 1]);
    }
    /* tcp_nodelay: a response goes out in more than one write; with Nagle on,
     * a kept-alive client would wait on its delayed ACK for the rest */
    int cors = cfg->cors_origin && *cfg->cors_origin;
    const char *mine[] = {"tcp_nodelay", "1", "num_threads", threads, "request_timeout_ms", req_ms, "enable_keep_alive",
                          cfg->keep_alive_s > 0 ? "yes" : "no", "keep_alive_timeout_ms", ka_ms,
                          "access_control_allow_origin", cors ? cfg->cors_origin : "",
                          "access_control_allow_methods", cors ? "GET, POST" : "",
                          "access_control_allow_headers", cors ? "Authorization, Content-Type, X-Session-Id" : "", NULL};
    for (size_t i = 0; mine[i]; i++) all[n++] = mine[i];
    all[n] = NULL;
    if (fd_room(cfg, err)) {
        guard_free(g);
        return err->code;
    }
    struct mg_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.init_connection = on_init;
    cb.connection_close = on_close;
    cb.begin_request = on_begin;
    if (!(g->mg = mg_start(&cb, g, all))) {
        guard_free(g);
        return llm_errf(err, LLM_ERR_IO, "cannot listen on %s (in use, or not an address of this machine)", ports);
    }
    int rc = llm_sync_worker_start(&g->w, LLM_THREAD_STACK, watch, g);
    if (rc) {
        mg_stop(g->mg);
        guard_free(g);
        return llm_errf(err, LLM_ERR_IO, "cannot start the HTTP watchdog thread: %s", strerror(rc));
    }
    *out = g;
    return LLM_OK;
}

struct mg_context *http_guard_mg(const http_guard *g) { return g->mg; }

void http_guard_stop(http_guard *g)
{
    if (!g)
        return;
    mg_stop(g->mg); /* every connection closes (on_close) before this returns */
    llm_sync_worker_stop(&g->w);
    guard_free(g);
}

void http_guard_closing(http_guard *g)
{
    pthread_mutex_lock(&g->w.mu);
    g->closing = 1;
    pthread_mutex_unlock(&g->w.mu);
}

void http_guard_stats_get(http_guard *g, http_guard_stats *out)
{
    pthread_mutex_lock(&g->w.mu);
    *out = g->stats;
    out->open = g->n;
    pthread_mutex_unlock(&g->w.mu);
}

/* Whether the client lets the connection stay open (civetweb's rule:
 * its Connection header when present, else HTTP/1.1). */
static int client_keeps(const struct mg_request_info *ri, const char *conn_hdr)
{
    if (!conn_hdr)
        return ri->http_version && !strcmp(ri->http_version, "1.1");
    for (const char *p = conn_hdr; (p = strcasestr(p, "keep-alive")); p++)
        if ((p == conn_hdr || p[-1] == ' ' || p[-1] == ',') && (!p[10] || p[10] == ',' || p[10] == ' '))
            return 1;
    return 0;
}

const char *http_guard_connection(struct mg_connection *c)
{
    http_guard *g = guard_of(c);
    guard_conn *k = rec_of(c);
    const struct mg_request_info *ri = mg_get_request_info(c);
    /* a body left unread would be taken for the next request: civetweb closes then */
    int body_done = ri->content_length == 0 || (ri->content_length < 0 && !mg_get_header(c, "Transfer-Encoding")) ||
                    (k && k->body_read);
    pthread_mutex_lock(&g->w.mu);
    /* HEAD: civetweb writes our bodies anyway; a kept-alive client would read one as the next answer */
    int keep = k && !g->closing && g->cfg.keep_alive_s > 0 && body_done && strcmp(ri->request_method, "HEAD") &&
               client_keeps(ri, mg_get_header(c, "Connection"));
    pthread_mutex_unlock(&g->w.mu);
    if (!keep)
        mg_disable_connection_keep_alive(c);
    return keep ? "keep-alive" : "close";
}

/* After a failed read of a chunked body: whether civetweb refused a chunk
 * line (the socket still open and not cut by the deadline) rather than the
 * client going away or its time running out. */
static int chunk_fault(struct mg_connection *c)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    guard_conn *k = rec_of(c);
    const char *te = mg_get_header(c, "Transfer-Encoding");
    return ri->content_length < 0 && te && strcasestr(te, "chunked") && k && !k->shut && !http_guard_client_gone(c);
}

/* The body into buf as it arrives; 0 or the status (see the header). */
static int read_all(struct mg_connection *c, size_t max, double deadline, char **buf, size_t *n)
{
    size_t cap = 4096;
    if (!(*buf = malloc(cap + 1)))
        return 503;
    for (;;) {
        if (llm_clock_mono_s() > deadline)
            return 408;
        if (*n == cap) { /* grows to max + 1 at most: one byte past max tells a body too large */
            size_t next = 2 * cap < max + 1 ? 2 * cap : max + 1;
            char *p = cap <= max ? realloc(*buf, next + 1) : NULL;
            if (!p)
                return cap <= max ? 503 : 413;
            *buf = p;
            cap = next;
        }
        int r = mg_read(c, *buf + *n, cap - *n);
        if (r < 0 && chunk_fault(c))
            return 400;
        if (r <= 0)
            return r < 0 ? 408 : 0; /* < 0: cut (the deadline) or broken: not a body to act on */
        *n += (size_t)r;
        if (*n > max)
            return 413;
    }
}

int http_guard_read_body(struct mg_connection *c, size_t max, double seconds, char **out, size_t *len)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    char *buf = NULL;
    size_t n = 0;
    if (ri->content_length > (long long)max)
        return 413;
    http_guard_arm(c, seconds); /* mg_read would wait for a trickled body to fill its buffer */
    int st = read_all(c, max, llm_clock_mono_s() + seconds, &buf, &n);
    http_guard_disarm(c);
    if (!st && ri->content_length >= 0 && (long long)n < ri->content_length)
        st = 408; /* the client left, or its time ran out, before the body was in */
    if (st) {
        free(buf);
        return st;
    }
    buf[n] = 0;
    http_guard_body_read(c);
    *out = buf;
    *len = n;
    return 0;
}

void http_guard_body_read(struct mg_connection *c)
{
    guard_conn *k = rec_of(c);
    if (k)
        k->body_read = 1; /* only this connection's thread reads or writes it */
}

void http_guard_discard(struct mg_connection *c, long long max, double seconds)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    guard_conn *k = rec_of(c);
    if ((k && k->body_read) || ri->content_length <= 0 || ri->content_length > max)
        return;
    char buf[16384];
    http_guard_arm(c, seconds);
    for (long long left = ri->content_length; left > 0;) {
        int r = mg_read(c, buf, sizeof buf);
        if (r <= 0)
            break;
        left -= r;
    }
    http_guard_disarm(c);
}

void http_guard_arm(struct mg_connection *c, double seconds)
{
    http_guard *g = guard_of(c);
    guard_conn *k = rec_of(c);
    if (!k || sock_of(c, k) < 0)
        return; /* not found: civetweb's per-read timeout is all there is */
    pthread_mutex_lock(&g->w.mu);
    if (!k->next) {
        k->next = g->armed.next;
        k->prev = &g->armed;
        g->armed.next->prev = k;
        g->armed.next = k;
    }
    k->deadline = llm_clock_mono_s() + seconds;
    pthread_mutex_unlock(&g->w.mu);
}

/* One request on a big stack: what the civetweb worker hands over. */
typedef struct route_job {
    const guard_route *r;
    struct mg_connection *c;
    int status;
} route_job;

static void *route_run(void *arg)
{
    route_job *j = arg;
    j->status = j->r->fn(j->c, j->r->cbdata);
    return NULL;
}

/* civetweb's handler for every routed uri: the job on a thread of its own;
 * the connection is used by that thread alone until it is joined. */
static int route_trampoline(struct mg_connection *c, void *cbdata)
{
    route_job j = {.r = cbdata, .c = c};
    pthread_t t;
    if (llm_thread_create(&t, LLM_THREAD_STACK, route_run, &j)) {
        return http_reply_close(c, 503, "{\"error\":{\"message\":\"no thread for the request; retry shortly\","
                                "\"type\":\"server_error\"}}", GUARD_RETRY_1);
    }
    LLM_ASSERT(pthread_join(t, NULL) == 0); /* (a thread made here, joinable, joined once: cannot fail) */
    return j.status;
}

llm_status http_guard_route(http_guard *g, const char *uri, mg_request_handler fn, void *cbdata)
{
    if (g->n_routes == HTTP_GUARD_ROUTES)
        return LLM_ERR_TOO_LONG;
    guard_route *r = &g->routes[g->n_routes++];
    *r = (guard_route){fn, cbdata};
    mg_set_request_handler(g->mg, uri, route_trampoline, r);
    return LLM_OK;
}

const char *http_guard_body_msg(int status, size_t max, double seconds, char *buf, size_t cap)
{
    if (status == 413)
        snprintf(buf, cap, "request body is over the limit of %zu bytes", max);
    else if (status == 408)
        snprintf(buf, cap, "the request body did not arrive whole within %g s", seconds);
    else if (status == 400)
        snprintf(buf, cap, "the chunked body cannot be read: each chunk line must be its size in hex (chunk "
                           "extensions are not taken here); or send Content-Length");
    else if (status == 503)
        snprintf(buf, cap, "out of memory");
    else
        snprintf(buf, cap, "the request body could not be read (status %d)", status);
    return buf;
}

int http_guard_json_body(struct mg_connection *c)
{
    const char *t = mg_get_header(c, "Content-Type");
    size_t n = strlen("application/json");
    return t && !strncasecmp(t, "application/json", n) && (!t[n] || t[n] == ';' || t[n] == ' ');
}

const char *http_guard_cors(struct mg_connection *c) { return guard_of(c)->cors; }

int http_guard_owns(const struct mg_connection *c) { return guard_of(c) != NULL; }

void http_guard_serve(http_guard *g)
{
    __atomic_store_n(&g->serving, 1, __ATOMIC_RELEASE);
}

void http_guard_sending(struct mg_connection *c, size_t n)
{
    double t = guard_of(c)->cfg.send_timeout_s;
    if (t > 0)
        http_guard_arm(c, t + (double)n / 16384.0);
}

void http_guard_disarm(struct mg_connection *c)
{
    http_guard *g = guard_of(c);
    guard_conn *k = rec_of(c);
    if (!k)
        return;
    pthread_mutex_lock(&g->w.mu);
    if (k->next) {
        k->prev->next = k->next;
        k->next->prev = k->prev;
        k->next = k->prev = NULL;
    }
    pthread_mutex_unlock(&g->w.mu);
}

int http_guard_client_gone(struct mg_connection *c)
{
    guard_conn *k = rec_of(c);
    int fd = k ? sock_of(c, k) : -1;
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (fd < 0 || poll(&p, 1, 0) <= 0)
        return 0;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP))
        return 1;
    char b; /* readable: a pipelined request (not gone), or the end of the stream */
    return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

int http_guard_bearer_ok(const char *authorization, const char *token)
{
    unsigned char a[32], b[32];
    unsigned int na = 0, nb = 0;
    if (!authorization || !token || strncmp(authorization, "Bearer ", 7))
        return 0;
    if (!EVP_Digest(authorization + 7, strlen(authorization + 7), a, &na, EVP_sha256(), NULL) ||
        !EVP_Digest(token, strlen(token), b, &nb, EVP_sha256(), NULL) || na != 32 || nb != 32)
        return 0;
    return CRYPTO_memcmp(a, b, 32) == 0;
}

int http_guard_token_file(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    setvbuf(f, NULL, _IONBF, 0); /* a secret: no stdio buffer keeps a copy */
    char line[1024];
    int ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    char *p = line, *end;
    while (ok && (*p == ' ' || *p == '\t'))
        p++;
    for (end = p + (ok ? strlen(p) : 0); end > p && strchr(" \t\r\n", end[-1]); end--) {}
    ok = ok && end > p && (size_t)(end - p) < cap;
    if (ok) {
        memcpy(out, p, (size_t)(end - p));
        out[end - p] = 0;
    }
    explicit_bzero(line, sizeof line);
    return ok ? 0 : -1;
}
