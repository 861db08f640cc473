/* http_client.c - a bounded GET or JSON POST; see http_client.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http_client.h"
#include "llm/clock.h"

#define CONNECT_MS 500 /* in-cluster: a pod that takes longer to accept is not there */

static size_t append(http_client_body *b, const char *d, size_t add);

/* One whole line (without its newline) through the filter. 0, or -1 to
 * abort (over the bound, no memory). */
static int filter_line(http_client_body *b, const char *l, size_t n)
{
    for (const char *const *k = b->keep; *k; k++) {
        size_t kn = strlen(*k);
        if (n >= kn && !memcmp(l, *k, kn))
            return append(b, l, n) == n && append(b, "\n", 1) == 1 ? 0 : -1;
    }
    return 0;
}

/* The filtered writer: lines cut from the stream as they come. */
static size_t write_lines(http_client_body *b, const char *d, size_t add)
{
    if ((b->read += add) > b->read_max) {
        b->over = 1;
        return 0;
    }
    if (!b->line && !(b->line = malloc(HTTP_CLIENT_LINE_MAX))) {
        b->nomem = 1;
        return 0;
    }
    for (size_t i = 0; i < add; i++) {
        if (d[i] == '\n') {
            if (!b->line_long && filter_line(b, b->line, b->line_n))
                return 0;
            b->line_n = 0;
            b->line_long = 0;
        } else if (b->line_n < HTTP_CLIENT_LINE_MAX) {
            b->line[b->line_n++] = d[i];
        } else {
            b->line_long = 1; /* no series the plans read is this long: dropped whole */
        }
    }
    return add;
}

size_t http_client_body_write(char *d, size_t sz, size_t nm, void *arg)
{
    http_client_body *b = arg;
    size_t add = sz * nm;
    if (b->keep)
        return write_lines(b, d, add);
    return append(b, d, add);
}

static size_t append(http_client_body *b, const char *d, size_t add)
{
    if (b->n + add > b->max) {
        b->over = 1;
        return 0; /* aborts the transfer */
    }
    if (b->n + add + 1 > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + add + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->nomem = 1;
            return 0;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, add);
    b->n += add;
    b->p[b->n] = 0;
    return add;
}

long http_client_get(CURL *h, const char *url, long timeout_ms, size_t max, char **body)
{
    return http_client_request(h, url, NULL, NULL, timeout_ms, max, body);
}

long http_client_request(CURL *h, const char *url, const char *bearer, const char *json, long timeout_ms, size_t max,
                  char **body)
{
    *body = NULL;
    CURL *c = h ? h : curl_easy_init();
    if (!c)
        return 0;
    if (h)
        curl_easy_reset(c);
    http_client_body b = {.max = max};
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_PROXY, ""); /* pods directly, whatever *_proxy the environment has */
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, http_client_body_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    struct curl_slist *hdr = NULL;
    char auth[600];
    if (bearer && snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer) < (int)sizeof auth)
        hdr = curl_slist_append(hdr, auth);
    if (json) {
        struct curl_slist *t = curl_slist_append(hdr, "Content-Type: application/json");
        hdr = t ? t : hdr;
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, json);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdr);
    long code = 0;
    if (curl_easy_perform(c) != CURLE_OK || curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code) != CURLE_OK)
        code = 0;
    curl_slist_free_all(hdr);
    if (!h)
        curl_easy_cleanup(c);
    if (!code) {
        free(b.p);
        return 0;
    }
    *body = b.p ? b.p : calloc(1, 1);
    return *body ? code : 0;
}

void http_client_get_many(const char *const *urls, size_t n, long budget_ms, size_t max, long *codes, char **bodies)
{
    http_client_many(urls, n, NULL, NULL, budget_ms, max, codes, bodies);
}

/* One transfer of a multi request: the url, the bearer and a JSON body. */
static CURL *many_handle(const char *url, struct curl_slist *hdr, const char *json, long budget_ms, http_client_body *b, size_t i)
{
    CURL *h = curl_easy_init();
    if (!h)
        return NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, budget_ms);
    /* a pod that drops the connection frees its slot soon: the others queued behind it get their turn */
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, budget_ms < CONNECT_MS ? budget_ms : (long)CONNECT_MS);
    curl_easy_setopt(h, CURLOPT_PROXY, ""); /* pods directly: a bearer token never goes through an *_proxy of the environment */
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, http_client_body_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(h, CURLOPT_PRIVATE, (void *)(uintptr_t)i); /* its index, when it is done */
    if (hdr)
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    if (json)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, json);
    return h;
}

/* The headers every transfer shares: the bearer, the JSON content type.
 * NULL also when there are none. */
static struct curl_slist *many_headers(const char *bearer, const char *json, int *ok)
{
    struct curl_slist *hdr = NULL, *t;
    char auth[600];
    *ok = 1;
    if (bearer && (snprintf(auth, sizeof auth, "Authorization: Bearer %s", bearer) >= (int)sizeof auth ||
                   !(hdr = curl_slist_append(hdr, auth))))
        *ok = 0;
    if (*ok && json) {
        if ((t = curl_slist_append(hdr, "Content-Type: application/json")))
            hdr = t;
        else
            *ok = 0;
    }
    return hdr;
}

static void many(const char *const *urls, size_t n, const char *bearer, const char *json, long budget_ms, size_t max,
                 size_t read_max, const char *const *keep, const unsigned char *filtered, long *codes, char **bodies);

void http_client_many(const char *const *urls, size_t n, const char *bearer, const char *json, long budget_ms, size_t max,
               long *codes, char **bodies)
{
    many(urls, n, bearer, json, budget_ms, max, 0, NULL, NULL, codes, bodies);
}

void http_client_get_many_lines(const char *const *urls, size_t n, long budget_ms, size_t max, size_t read_max,
                                const char *const *keep, const unsigned char *filtered, long *codes, char **bodies)
{
    many(urls, n, NULL, NULL, budget_ms, max, read_max, keep, filtered, codes, bodies);
}

static void many(const char *const *urls, size_t n, const char *bearer, const char *json, long budget_ms, size_t max,
                 size_t read_max, const char *const *keep, const unsigned char *filtered, long *codes, char **bodies)
{
    CURLM *m = curl_multi_init();
    CURL **hs = calloc(n ? n : 1, sizeof *hs);
    http_client_body *bs = calloc(n ? n : 1, sizeof *bs);
    int hdr_ok = 0;
    struct curl_slist *hdr = many_headers(bearer, json, &hdr_ok);
    for (size_t i = 0; i < n; i++) codes[i] = 0, bodies[i] = NULL;
    if (!m || !hs || !bs || !hdr_ok)
        goto out; /* no memory: nobody answered */
    curl_multi_setopt(m, CURLMOPT_MAX_TOTAL_CONNECTIONS, 64L); /* the rest wait their turn (within the budget) */
    for (size_t i = 0; i < n; i++) {
        bs[i].max = max;
        if (keep && filtered && filtered[i])
            bs[i].keep = keep, bs[i].read_max = read_max;
        if ((hs[i] = many_handle(urls[i], hdr, json, budget_ms, &bs[i], i)) && curl_multi_add_handle(m, hs[i]) != CURLM_OK) {
            curl_easy_cleanup(hs[i]);
            hs[i] = NULL;
        }
    }
    long long end = (long long)(llm_clock_mono_s() * 1000) + budget_ms;
    int running = 1;
    while (running && (long long)(llm_clock_mono_s() * 1000) < end) {
        if (curl_multi_perform(m, &running) != CURLM_OK)
            break;
        long left = (long)(end - (long long)(llm_clock_mono_s() * 1000));
        if (running && left > 0 && curl_multi_poll(m, NULL, 0, (int)(left < 100 ? left : 100), NULL) != CURLM_OK)
            break;
    }
    CURLMsg *msg;
    int queued;
    while ((msg = curl_multi_info_read(m, &queued))) {
        void *priv = NULL;
        if (msg->msg == CURLMSG_DONE && msg->data.result == CURLE_OK &&
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&priv) == CURLE_OK && (uintptr_t)priv < n)
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &codes[(uintptr_t)priv]);
    }
    for (size_t i = 0; i < n; i++) {
        /* (a filtered page's last line may lack its newline: it is whole) */
        if (codes[i] && bs[i].keep && bs[i].line_n && !bs[i].line_long && filter_line(&bs[i], bs[i].line, bs[i].line_n))
            codes[i] = 0;
        if (codes[i] && !(bodies[i] = bs[i].p ? bs[i].p : calloc(1, 1)))
            codes[i] = 0;
        if (!codes[i])
            free(bs[i].p);
        free(bs[i].line);
    }
out:
    for (size_t i = 0; hs && i < n; i++)
        if (hs[i]) {
            curl_multi_remove_handle(m, hs[i]);
            curl_easy_cleanup(hs[i]);
        }
    curl_slist_free_all(hdr);
    free(hs);
    free(bs);
    if (m)
        curl_multi_cleanup(m);
}
