/* http_probe.c - the probes' listener: one thread over epoll; see
 * http_probe.h for what and why.
 *
 * A connection lives in a fixed slot (HTTP_PROBE_MAX_CONNS of them) from
 * its accept to its close; epoll's data is the slot's index (the listening
 * socket and the stop event take the two indexes past them). A slot reads
 * until its request's head is in, then writes its answer; seq (the order
 * of accepts) tells which unanswered connection is the oldest when a new
 * one needs its slot. Why a listener of our own and not civetweb's: see
 * the header; it speaks only what probes need. */
#include "http_probe.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "llm/clock.h"

enum { HEAD_MAX = 8192, EVENTS = 64, TICK_MS = 100 };
#define HEAD_S 2.0 /* a connection's time to send its request and take its answer */

typedef struct pconn {
    int fd;                /* -1: the slot is free */
    unsigned long long seq;
    double deadline;
    int answering;         /* the request is in; out is being written */
    size_t got;
    char in[HEAD_MAX];
    char *out;
    size_t out_len, out_at;
} pconn;

struct http_probe {
    int lfd, ep, stop_fd;
    pthread_t th;
    http_probe_fn fn;
    void *ctx;
    unsigned long long next_seq;
    int open;
    int stop;              /* atomic: the thread ends at its next wake-up (stop_fd's, or a tick) */
    int paused;            /* accepting is off until the next tick (no descriptor was left) */
    pthread_mutex_t mu;    /* stats */
    http_probe_stats stats;
    pconn c[HTTP_PROBE_MAX_CONNS];
};

static void count(http_probe *p, long long *field, long long by)
{
    pthread_mutex_lock(&p->mu);
    *field += by;
    pthread_mutex_unlock(&p->mu);
}

static void conn_close(http_probe *p, pconn *c, int answered)
{
    close(c->fd); /* (closing takes it out of the epoll set too: it is never dup'ed) */
    free(c->out);
    c->fd = -1;
    c->out = NULL;
    p->open--;
    pthread_mutex_lock(&p->mu);
    p->stats.open = p->open;
    if (answered)
        p->stats.answered++;
    else
        p->stats.dropped++;
    pthread_mutex_unlock(&p->mu);
}

/* ---- answering ------------------------------------------------------------------ */

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
    }
}

/* c's answer (status, type, body; the body left out for HEAD) into c->out;
 * no memory for it: the connection closes unanswered. */
static void reply(pconn *c, int status, const char *type, const char *body, int head_only)
{
    char head[256];
    size_t n = body ? strlen(body) : 0;
    int h = snprintf(head, sizeof head, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                                        "Connection: close\r\n\r\n", status, reason(status), type, n);
    if (head_only)
        n = 0;
    if ((c->out = malloc((size_t)h + n))) {
        memcpy(c->out, head, (size_t)h);
        if (n)
            memcpy(c->out + h, body, n);
        c->out_len = (size_t)h + n;
    }
    c->answering = 1;
}

/* The answer to the request head in c->in (NUL-terminated). */
static void answer(http_probe *p, pconn *c)
{
    char method[8], path[1024], version[16], *body = NULL;
    const char *type = "text/plain";
    int head_only = 0;
    if (sscanf(c->in, "%7s %1023s %15s", method, path, version) != 3 || strncmp(version, "HTTP/1.", 7)) {
        reply(c, 400, type, NULL, 0);
    } else if (strcmp(method, "GET") && !(head_only = !strcmp(method, "HEAD"))) {
        reply(c, 405, type, NULL, 0);
    } else {
        char *query = path + strcspn(path, "?");
        if (*query)
            *query++ = 0;
        int status = p->fn(p->ctx, path, query, &body, &type);
        reply(c, status, type, body, head_only);
        free(body);
    }
}

/* Writes what is left of c's answer; closes c when it is out (or the client is gone). */
static void conn_write(http_probe *p, pconn *c)
{
    while (c->out && c->out_at < c->out_len) {
        ssize_t w = send(c->fd, c->out + c->out_at, c->out_len - c->out_at, MSG_NOSIGNAL);
        if (w < 0 && (errno == EAGAIN || errno == EINTR))
            return; /* EPOLLOUT brings us back */
        if (w <= 0)
            break;
        c->out_at += (size_t)w;
    }
    conn_close(p, c, c->out && c->out_at == c->out_len);
}

/* Reads what c has sent; answers once its head is in. */
static void conn_read(http_probe *p, pconn *c)
{
    for (;;) {
        ssize_t r = recv(c->fd, c->in + c->got, HEAD_MAX - 1 - c->got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        if (r <= 0) {
            conn_close(p, c, 0);
            return;
        }
        size_t from = c->got > 3 ? c->got - 3 : 0;
        c->got += (size_t)r;
        c->in[c->got] = 0;
        if (strstr(c->in + from, "\r\n\r\n") || strstr(c->in + from, "\n\n")) {
            answer(p, c);
            break;
        }
        if (c->got == HEAD_MAX - 1) {
            reply(c, 431, "text/plain", NULL, 0);
            break;
        }
    }
    struct epoll_event ev = {.events = EPOLLOUT, .data.u32 = (uint32_t)(c - p->c)};
    if (epoll_ctl(p->ep, EPOLL_CTL_MOD, c->fd, &ev)) {
        conn_close(p, c, 0);
        return;
    }
    conn_write(p, c);
}

/* ---- accepting ------------------------------------------------------------------- */

/* A slot made free by closing the oldest connection still sending its
 * request (answers in progress are left to finish); NULL when there is
 * none such. */
static pconn *evict_oldest_waiting(http_probe *p)
{
    pconn *oldest = NULL;
    for (int i = 0; i < HTTP_PROBE_MAX_CONNS; i++)
        if (p->c[i].fd >= 0 && !p->c[i].answering && (!oldest || p->c[i].seq < oldest->seq))
            oldest = &p->c[i];
    if (oldest)
        conn_close(p, oldest, 0);
    return oldest;
}

/* A free slot, made by eviction when there is none; NULL when every slot is answering. */
static pconn *free_slot(http_probe *p)
{
    for (int i = 0; i < HTTP_PROBE_MAX_CONNS; i++)
        if (p->c[i].fd < 0)
            return &p->c[i];
    return evict_oldest_waiting(p);
}

/* Out of descriptors: the oldest connection still sending its request
 * makes room, else accepting pauses until the next tick (the listening
 * socket would otherwise wake the loop at once, forever). */
static void out_of_fds(http_probe *p)
{
    struct epoll_event off = {.events = 0, .data.u32 = HTTP_PROBE_MAX_CONNS};
    if (!evict_oldest_waiting(p) && !epoll_ctl(p->ep, EPOLL_CTL_MOD, p->lfd, &off))
        p->paused = 1;
}

static void accept_all(http_probe *p)
{
    for (int tries = 0; tries < HTTP_PROBE_MAX_CONNS; tries++) {
        int fd = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0 && errno == EINTR)
            continue;
        if (fd < 0 && (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)) {
            out_of_fds(p);
            if (p->paused)
                return;
            continue;
        }
        if (fd < 0)
            return; /* EAGAIN: all taken */
        pconn *c = free_slot(p);
        struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.u32 = (uint32_t)(c ? c - p->c : 0)};
        if (!c || epoll_ctl(p->ep, EPOLL_CTL_ADD, fd, &ev)) {
            close(fd);
            count(p, &p->stats.dropped, 1);
            continue;
        }
        *c = (pconn){.fd = fd, .seq = p->next_seq++, .deadline = llm_clock_mono_s() + HEAD_S};
        p->open++;
        pthread_mutex_lock(&p->mu);
        p->stats.accepted++;
        p->stats.open = p->open;
        pthread_mutex_unlock(&p->mu);
        conn_read(p, c); /* a probe's request is often in already */
    }
}

static void expire(http_probe *p, double now)
{
    for (int i = 0; i < HTTP_PROBE_MAX_CONNS; i++)
        if (p->c[i].fd >= 0 && p->c[i].deadline < now)
            conn_close(p, &p->c[i], 0);
}

static void *run(void *arg)
{
    http_probe *p = arg;
    struct epoll_event evs[EVENTS];
    while (!__atomic_load_n(&p->stop, __ATOMIC_ACQUIRE)) {
        int n = epoll_wait(p->ep, evs, EVENTS, TICK_MS);
        for (int i = 0; i < n; i++) {
            uint32_t k = evs[i].data.u32;
            if (k == HTTP_PROBE_MAX_CONNS + 1)
                continue; /* the stop's wake-up: the loop's test ends it */
            if (k == HTTP_PROBE_MAX_CONNS)
                accept_all(p);
            else if (p->c[k].fd >= 0 && p->c[k].answering)
                conn_write(p, &p->c[k]);
            else if (p->c[k].fd >= 0)
                conn_read(p, &p->c[k]);
        }
        expire(p, llm_clock_mono_s());
        struct epoll_event on = {.events = EPOLLIN, .data.u32 = HTTP_PROBE_MAX_CONNS};
        if (p->paused && !epoll_ctl(p->ep, EPOLL_CTL_MOD, p->lfd, &on))
            p->paused = 0;
    }
    return NULL;
}

/* ---- start and stop ------------------------------------------------------------ */

static int listen_on(const char *host, long port, llm_error *err)
{
    char ps[16];
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
    snprintf(ps, sizeof ps, "%ld", port);
    int rc = getaddrinfo(host, ps, &hints, &ai), fd = -1, one = 1;
    for (struct addrinfo *a = rc ? NULL : ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) || bind(fd, a->ai_addr, a->ai_addrlen) ||
                        listen(fd, 1024))) {
            close(fd);
            fd = -1;
        }
    }
    if (ai)
        freeaddrinfo(ai);
    if (fd < 0)
        llm_errf(err, LLM_ERR_IO, "cannot listen on %s:%ld (%s)", host, port, rc ? gai_strerror(rc) : strerror(errno));
    return fd;
}

static void probe_free(http_probe *p)
{
    if (p->lfd >= 0)
        close(p->lfd);
    if (p->ep >= 0)
        close(p->ep);
    if (p->stop_fd >= 0)
        close(p->stop_fd);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

llm_status http_probe_start(const char *host, long port, http_probe_fn fn, void *ctx, http_probe **out, llm_error *err)
{
    http_probe *p = calloc(1, sizeof *p);
    if (!p)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the probe listener");
    for (int i = 0; i < HTTP_PROBE_MAX_CONNS; i++) p->c[i].fd = -1;
    p->fn = fn;
    p->ctx = ctx;
    int mu_rc = pthread_mutex_init(&p->mu, NULL);
    if (mu_rc) {
        free(p);
        return llm_errf(err, LLM_ERR_INTERNAL, "probe listener: pthread_mutex_init: %s", strerror(mu_rc));
    }
    p->ep = epoll_create1(EPOLL_CLOEXEC);
    p->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    p->lfd = listen_on(host, port, err);
    struct epoll_event l = {.events = EPOLLIN, .data.u32 = HTTP_PROBE_MAX_CONNS},
                       s = {.events = EPOLLIN, .data.u32 = HTTP_PROBE_MAX_CONNS + 1};
    int bad = p->lfd < 0 || p->ep < 0 || p->stop_fd < 0 || epoll_ctl(p->ep, EPOLL_CTL_ADD, p->lfd, &l) ||
              epoll_ctl(p->ep, EPOLL_CTL_ADD, p->stop_fd, &s);
    *out = p; /* before the thread starts: its answer function may read it (http_probe_stats_get) */
    int e = errno, rc = bad ? 0 : pthread_create(&p->th, NULL, run, p);
    if (bad || rc) {
        llm_status st = p->lfd < 0 ? LLM_ERR_IO /* (err names the address) */
                        : llm_errf(err, LLM_ERR_IO, "probe listener on %s:%ld: %s", host, port, strerror(rc ? rc : e));
        *out = NULL;
        probe_free(p);
        return st;
    }
    return LLM_OK;
}

void http_probe_stop(http_probe *p)
{
    if (!p)
        return;
    uint64_t one = 1;
    __atomic_store_n(&p->stop, 1, __ATOMIC_RELEASE);
    if (write(p->stop_fd, &one, sizeof one) != sizeof one) {
        /* no wake-up: the thread sees stop within a tick */
    }
    pthread_join(p->th, NULL);
    for (int i = 0; i < HTTP_PROBE_MAX_CONNS; i++)
        if (p->c[i].fd >= 0)
            conn_close(p, &p->c[i], 0);
    probe_free(p);
}

void http_probe_stats_get(http_probe *p, http_probe_stats *out)
{
    pthread_mutex_lock(&p->mu);
    *out = p->stats;
    pthread_mutex_unlock(&p->mu);
}
