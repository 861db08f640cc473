/* kube_watch.c - see kube_watch.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "llm/json.h"
#include "kube_watch.h"
#include "llm/clock.h"

typedef struct wstate {
    char *line;            /* the partial line being assembled */
    size_t len, cap;
    char rv[64];           /* last resourceVersion seen */
    kube_watch_event_fn fn;
    void *ctx;
    int stopped, gone, too_long;
    long error_code;       /* an ERROR event other than 410: the server is in trouble */
    char error_msg[256];
    long events;           /* delivered by the current stream */
    double retry_after;    /* the answer's Retry-After (seconds; 0 none) */
    atomic_int *stop;      /* the caller's: ends a quiet stream at once */
} wstate;

/* libcurl calls this about once a second even on a quiet stream. */
static int on_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    wstate *w = arg;
    (void)a, (void)b, (void)c, (void)d;
    return w->stop && atomic_load(w->stop);
}

static void set_rv(wstate *w, json_t *obj)
{
    const char *rv = json_string_value(json_object_get(json_object_get(obj, "metadata"), "resourceVersion"));
    if (rv)
        snprintf(w->rv, sizeof w->rv, "%s", rv);
}

/* An event whose object cannot be read within llm_json's bounds (a
 * tenant's custom resource nested or sized past them) as the DELETED event
 * of that object, from its metadata alone: unreadable reads as absent, as
 * a list read an item at a time leaves it out, so the cache and the lists
 * agree and a stale copy does not linger. NULL when not even that can be
 * read (the line is not an event). */
static json_t *unreadable_event(const char *s, size_t n)
{
    llm_json_span line = {s, n}, type, obj, meta;
    char t[16];
    if (!llm_json_member(line, "type", &type) || llm_json_string(type, t, sizeof t) < 0 ||
        (strcmp(t, "ADDED") && strcmp(t, "MODIFIED") && strcmp(t, "DELETED")) || !llm_json_member(line, "object", &obj) ||
        !llm_json_member(obj, "metadata", &meta))
        return NULL;
    json_t *m = llm_json_load(meta.p, meta.n, 0, NULL, NULL);
    json_t *ev = m ? json_pack("{s:s,s:{s:o}}", "type", "DELETED", "object", "metadata", m) : NULL;
    if (ev)
        kube_client_unreadable();
    return ev;
}

/* One complete line: a watch event. */
static void on_line(wstate *w, const char *s, size_t n)
{
    json_t *ev = llm_json_load(s, n, 0, NULL, NULL);
    if (!ev)
        ev = unreadable_event(s, n);
    const char *type = json_string_value(json_object_get(ev, "type"));
    json_t *obj = json_object_get(ev, "object");
    if (type && !strcmp(type, "ERROR")) {
        json_int_t code = json_integer_value(json_object_get(obj, "code"));
        w->gone = code == 410;
        if (!w->gone) { /* 500, 429...: the stream ends here and the next one waits */
            w->error_code = code ? (long)code : 500;
            snprintf(w->error_msg, sizeof w->error_msg, "%s",
                     json_string_value(json_object_get(obj, "message")) ?: "(no message)");
        }
    } else if (type && obj) {
        w->events++;
        set_rv(w, obj);
        if (strcmp(type, "BOOKMARK") && w->fn(w->ctx, type, obj))
            w->stopped = 1;
    }
    json_decref(ev);
}

static size_t on_data(char *d, size_t sz, size_t n, void *arg)
{
    wstate *w = arg;
    size_t len = sz * n;
    for (size_t i = 0; i < len && !w->stopped && !w->error_code; i++) {
        if (d[i] == '\n') {
            on_line(w, w->line ? w->line : "", w->len);
            w->len = 0;
            continue;
        }
        if (w->len + 1 >= w->cap) {
            size_t cap = w->cap ? w->cap * 2 : 65536;
            char *p = cap <= KUBE_WATCH_MAX_LINE ? realloc(w->line, cap) : NULL;
            if (!p) {
                w->too_long = 1;
                return 0;
            }
            w->line = p;
            w->cap = cap;
        }
        w->line[w->len++] = d[i];
    }
    return w->stopped || w->error_code ? 0 : len;
}

static size_t on_header(char *line, size_t size, size_t n, void *arg)
{
    double v = kube_client_retry_after_header(line, size * n);
    if (v >= 0)
        ((wstate *)arg)->retry_after = v;
    return size * n;
}

/* One watch request from w->rv; returns when the stream ends. */
static llm_status watch_once(kube_config *cfg, const char *path, int timeout_s, wstate *w, llm_error *err)
{
    char url[4096];
    snprintf(url, sizeof url, "%s%s%swatch=1&allowWatchBookmarks=true&timeoutSeconds=%d&resourceVersion=%s", cfg->server,
             path, strchr(path, '?') ? "&" : "?", timeout_s, w->rv);
    CURL *c = curl_easy_init();
    if (!c)
        return llm_errf(err, LLM_ERR_NOMEM, "watch: no curl handle");
    struct curl_slist *h = kube_client_curl_login(cfg, c); /* client certificates too, as for requests */
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, w);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, w);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, (long)timeout_s + 30);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, w);
    /* a peer that vanished without closing is noticed by keepalive probes */
    curl_easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPIDLE, 30L);
    curl_easy_setopt(c, CURLOPT_TCP_KEEPINTVL, 10L);
    w->retry_after = 0;
    w->error_code = 0;
    w->events = 0;
    CURLcode rc = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    w->len = 0;
    if (code == 410)
        w->gone = 1;
    if (w->gone || w->stopped || (w->stop && atomic_load(w->stop)))
        return LLM_OK;
    if (code == 401 || code == 403 || code == 404)
        return llm_errf(err, code == 404 ? LLM_ERR_NOT_FOUND : KUBE_ERR_FORBIDDEN, "watch %s: HTTP %ld", path, code);
    if (code && (code < 200 || code > 299)) /* 429, 5xx: the server asks us to wait (or is in trouble) */
        return llm_errf(err, LLM_ERR_IO, "watch %s: HTTP %ld", path, code);
    if (w->error_code)
        return llm_errf(err, LLM_ERR_IO, "watch %s: ERROR event %ld: %s", path, w->error_code, w->error_msg);
    if (rc != CURLE_OK && rc != CURLE_OPERATION_TIMEDOUT)
        return llm_errf(err, LLM_ERR_IO, "watch %s: %s%s", path, curl_easy_strerror(rc),
                        w->too_long ? " (an event over 16 MiB)" : "");
    return LLM_OK;
}

/* Lists the collection: SYNC for each object, then SYNCED; rv from the list. */
static llm_status relist(kube_client *k, const char *path, wstate *w, llm_error *err)
{
    json_t *list = NULL;
    llm_status st = kube_client_request(k, "GET", path, NULL, NULL, &list, err);
    if (st)
        return st;
    json_t *items = json_object_get(list, "items");
    for (size_t i = 0; i < json_array_size(items) && !w->stopped; i++)
        w->stopped = w->fn(w->ctx, "SYNC", json_array_get(items, i));
    if (!w->stopped)
        w->stopped = w->fn(w->ctx, "SYNCED", NULL);
    set_rv(w, list);
    json_decref(list);
    return LLM_OK;
}

/* Waits s seconds, or until *stop. */
static void pause_s(double s, atomic_int *stop)
{
    for (double end = llm_clock_mono_s() + s; llm_clock_mono_s() < end && !(stop && atomic_load(stop));) usleep(50000);
}

llm_status kube_watch_run(kube_client *k, kube_config *cfg, const char *path, int timeout_s, kube_watch_event_fn fn,
                           void *ctx, atomic_int *stop, llm_error *err)
{
    wstate w = {.fn = fn, .ctx = ctx, .stop = stop};
    llm_status st = LLM_OK;
    double backoff = 0.2;
    int listed = 0;
    unsigned seed = (unsigned)(llm_clock_mono_s() * 1e6) ^ (unsigned)(uintptr_t)&w;
    while (!w.stopped && !(stop && atomic_load(stop))) {
        double t0 = llm_clock_mono_s(), retry_after = 0;
        int quick = 0;
        if (!listed) {
            if (w.gone)
                w.stopped = fn(ctx, "RELIST", NULL);
            w.gone = 0;
            st = relist(k, path, &w, err);
            retry_after = kube_client_retry_after(k);
        } else {
            st = watch_once(cfg, path, timeout_s, &w, err);
            retry_after = w.retry_after;
            /* a stream the server ends at once with nothing in it, again and again, is trouble too */
            quick = !st && !w.gone && !w.events && llm_clock_mono_s() - t0 < 1;
        }
        if (st == KUBE_ERR_FORBIDDEN || st == LLM_ERR_NOT_FOUND)
            break;
        if (st || quick) { /* back off: doubling to 30 s, jittered (replicas do not come back in step), at
                            * least what Retry-After asks */
            double d = backoff * (0.5 + 0.5 * (double)rand_r(&seed) / RAND_MAX);
            pause_s(d > retry_after ? d : retry_after, stop);
            backoff = backoff < 15 ? backoff * 2 : 30;
            continue;
        }
        backoff = 0.2;
        listed = !w.gone;
    }
    free(w.line);
    return st == KUBE_ERR_FORBIDDEN || st == LLM_ERR_NOT_FOUND ? st : LLM_OK;
}
