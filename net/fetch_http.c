/* fetch_http.c - one HTTP exchange of a fetch: the request's settings
 * (no redirect followed, HTTP(S) only, stall limit, the credentials of its
 * kind), the header lines a download reads, a small GET or HEAD, hosts
 * and the redirect rule. (fetch_impl.h states the API.) */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "fetch_impl.h"
#include "http_client.h"

#define MAX_RETRY_AFTER_S 300

static void copy_value(char *dst, size_t n, const char *v, size_t len)
{
    while (len && (*v == ' ' || *v == '\t')) v++, len--;
    while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' ')) len--;
    snprintf(dst, n, "%.*s", (int)(len < n - 1 ? len : n - 1), v);
}

/* rel="next" of a Link header: <URL>; rel="next" */
static void link_next(fetch_resp *r, const char *v, size_t len)
{
    char buf[4096];
    copy_value(buf, sizeof buf, v, len);
    for (char *s = buf, *lt; (lt = strchr(s, '<'));) {
        char *gt = strchr(lt, '>');
        if (!gt)
            return;
        char *end = strchr(gt, ',');
        if (end)
            *end = 0;
        if (strstr(gt, "rel=\"next\"") || strstr(gt, "rel=next")) {
            snprintf(r->next, sizeof r->next, "%.*s", (int)(gt - lt - 1), lt + 1);
            return;
        }
        if (!end)
            return;
        s = end + 1;
    }
}

static size_t on_header(char *data, size_t size, size_t nmemb, void *ud)
{
    fetch_http_header_line(ud, data, size * nmemb);
    return size * nmemb;
}

void fetch_http_header_line(fetch_resp *r, const char *data, size_t n)
{
    if (n >= 5 && !strncmp(data, "HTTP/", 5)) { /* a new response (after 100 Continue): start over */
        long code = r->code;
        memset(r, 0, sizeof *r);
        r->code = code;
        r->retry_after = -1;
        return;
    }
    const char *colon = memchr(data, ':', n);
    if (!colon)
        return;
    size_t klen = (size_t)(colon - data), vlen = n - klen - 1;
    const char *v = colon + 1;
    char num[32];
#define IS(k) (klen == strlen(k) && !strncasecmp(data, k, klen))
    /* the headers kept as text: name, field, its size */
    const struct { const char *name; char *dst; size_t n; } text[] = {
        {"location", r->location, sizeof r->location}, {"x-repo-commit", r->commit, sizeof r->commit},
        {"etag", r->etag, sizeof r->etag}, {"x-linked-etag", r->linked_etag, sizeof r->linked_etag},
        {"x-error-code", r->error_code, sizeof r->error_code},
        {"content-range", r->content_range, sizeof r->content_range}};
    for (size_t i = 0; i < sizeof text / sizeof *text; i++)
        if (IS(text[i].name)) {
            copy_value(text[i].dst, text[i].n, v, vlen);
            return;
        }
    if (IS("link"))
        link_next(r, v, vlen);
    else if (IS("x-linked-size") || IS("content-length") || IS("retry-after")) {
        copy_value(num, sizeof num, v, vlen);
        char *end;
        errno = 0;
        unsigned long long x = strtoull(num, &end, 10);
        int ok = num[0] >= '0' && num[0] <= '9' && !*end && !errno;
        if (IS("retry-after"))
            r->retry_after = ok ? (x > MAX_RETRY_AFTER_S ? MAX_RETRY_AFTER_S : (long)x) : 5; /* an HTTP date: a short wait */
        else if (IS("x-linked-size"))
            r->linked_size = x, r->has_linked_size = ok;
        else
            r->length = x, r->has_length = ok;
    }
#undef IS
}

/* Appends a header line to *hs; -1 without memory (*hs unchanged). */
static int append(struct curl_slist **hs, const char *line)
{
    struct curl_slist *t = curl_slist_append(*hs, line);
    if (!t)
        return -1;
    *hs = t;
    return 0;
}

/* The request's headers, and for S3 libcurl's SigV4 signing; NULL when
 * out of memory or an option is refused. */
static struct curl_slist *auth_headers(fetch_ctx *c, CURL *h, fetch_auth auth)
{
    struct curl_slist *hs = NULL;
    char line[2200], sig[128];
    const char *token = auth == FETCH_AUTH_BEARER ? c->bearer : auth == FETCH_AUTH_HF ? c->hf_token : "";
    int bad = 0;
    if (token[0]) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", token);
        bad = append(&hs, line);
    } else if (auth == FETCH_AUTH_S3 && c->s3_user[0]) {
        snprintf(sig, sizeof sig, "aws:amz:%s:s3", c->s3_region);
        snprintf(line, sizeof line, "x-amz-security-token: %s", c->s3_session);
        /* S3 wants the payload's hash in a signed header; libcurl before 8.x does not add it. A GET's payload
         * is empty. */
        bad = curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sig) || curl_easy_setopt(h, CURLOPT_USERPWD, c->s3_user) ||
              append(&hs, "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855") ||
              (c->s3_session[0] && append(&hs, line));
    }
    /* never an empty list: NULL means failure (the agent is no custom header: a signer may leave it out, as
     * AWS's own do) */
    if (bad || append(&hs, "Accept: */*")) {
        curl_slist_free_all(hs);
        return NULL;
    }
    return hs;
}

/* A request abandoned with the fetch (the server's SIGTERM). */
static int on_progress(void *ud, curl_off_t dlt, curl_off_t dln, curl_off_t ult, curl_off_t uln)
{
    (void)dlt, (void)dln, (void)ult, (void)uln;
    return fetch_aborted(ud);
}

struct curl_slist *fetch_http_prepare(fetch_ctx *c, CURL *h, const char *url, fetch_auth auth, fetch_resp *r)
{
    memset(r, 0, sizeof *r);
    r->retry_after = -1;
    struct curl_slist *hs = auth_headers(c, h, auth);
    /* no redirect followed (fetch_http_redirect_ok judges each), HTTP(S) only, connect and stall limits */
    if (!hs || curl_easy_setopt(h, CURLOPT_URL, url) || curl_easy_setopt(h, CURLOPT_USERAGENT, "llm-fetch/0.1") ||
        curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L) || curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https") ||
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header) || curl_easy_setopt(h, CURLOPT_HEADERDATA, r) ||
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L) ||
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, (long)FETCH_STALL_BYTES_PER_S) ||
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, c->stall_s) || curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L) ||
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs) || curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L) ||
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress) || curl_easy_setopt(h, CURLOPT_XFERINFODATA, c)) {
        curl_slist_free_all(hs);
        fetch_fail(c, FETCH_FAILED, LLM_ERR_INTERNAL, "%.*s: libcurl refused the request's settings (libcurl "
                   ">= 7.85 with http and https is needed)", fetch_shown(url), url);
        return NULL;
    }
    return hs;
}

llm_status fetch_http_request(fetch_ctx *c, const char *url, fetch_auth auth, int head, size_t max, char **body,
                              fetch_resp *r)
{
    if (body)
        *body = NULL;
    CURL *h = curl_easy_init();
    http_client_body b = {.max = max};
    struct curl_slist *hs = h ? fetch_http_prepare(c, h, url, auth, r) : NULL;
    if (!hs || curl_easy_setopt(h, CURLOPT_NOBODY, head ? 1L : 0L) || curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L) ||
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, http_client_body_write) ||
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &b)) {
        curl_easy_cleanup(h);
        curl_slist_free_all(hs);
        return c->err->code ? c->err->code : fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "%.*s: no memory", fetch_shown(url), url);
    }
    CURLcode rc = curl_easy_perform(h);
    if (curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->code))
        r->code = 0;
    curl_easy_cleanup(h);
    curl_slist_free_all(hs);
    llm_status st = LLM_OK;
    if (fetch_aborted(c))
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_CANCELLED, "%.*s: abandoned", fetch_shown(url), url);
    else if (b.over)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_TOO_LONG, "%.*s: the answer is over %zu bytes", fetch_shown(url), url, max);
    else if (b.nomem || (body && !b.p && !(b.p = calloc(1, 1))))
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "%.*s: no memory for the answer", fetch_shown(url), url);
    else if (rc != CURLE_OK) {
        c->no_answer = !r->code;
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%.*s: %s", fetch_shown(url), url, curl_easy_strerror(rc));
    }
    if (st || !body)
        free(b.p);
    else
        *body = b.p;
    return st;
}

int fetch_http_host(const char *url, char *out, size_t n)
{
    const char *p = !strncmp(url, "https://", 8) ? url + 8 : !strncmp(url, "http://", 7) ? url + 7 : NULL;
    if (!p)
        return -1;
    size_t len = strcspn(p, "/?#");
    if (!len || len >= n || p[0] == '.' || p[0] == '-')
        return -1;
    for (size_t i = 0; i < len; i++) /* a name, an IPv4 or a [IPv6] address, a port: no user part, no bytes else */
        if (!isalnum((unsigned char)p[i]) && !strchr(".-:[]_", p[i]))
            return -1;
    for (size_t i = 0; i < len; i++) out[i] = (char)tolower((unsigned char)p[i]);
    out[len] = 0;
    return 0;
}

int fetch_http_redirect_ok(fetch_ctx *c, const char *from, char *to, size_t n)
{
    char host[512], abs[4096];
    if (to[0] == '/' && to[1] != '/') { /* relative to the same host */
        size_t scheme = !strncmp(from, "https://", 8) ? 8 : 7;
        if (fetch_http_host(from, host, sizeof host) ||
            snprintf(abs, sizeof abs, "%.*s%s%s", (int)scheme, from, host, to) >= (int)sizeof abs || strlen(abs) >= n) {
            fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%.*s: redirect to %.*s: too long", fetch_shown(from), from, fetch_shown(to), to);
            return -1;
        }
        snprintf(to, n, "%s", abs);
    }
    int https = !strncmp(to, "https://", 8), http = !strncmp(to, "http://", 7);
    if (!https && !(http && !strncmp(from, "http://", 7))) {
        fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%.*s: redirect to %.*s refused: only https (or http from http)",
                   fetch_shown(from), from, fetch_shown(to), to);
        return -1;
    }
    if (fetch_http_host(to, host, sizeof host)) {
        fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%.*s: redirect to %.*s: not a URL with a host", fetch_shown(from), from, fetch_shown(to), to);
        return -1;
    }
    return 0;
}

