/* fetch_xfer.c - one HTTP exchange with the headers a download reads, and
 * one file's transfer into the cache: locked against other processes,
 * resumed with Range, retried with back-off, hashed as it arrives,
 * verified and renamed into place. (fetch_impl.h states the rules.) */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "fetch_impl.h"
#include "http_client.h"
#include "llm/clock.h"

#define STALL_BYTES_PER_S 1024
#define MAX_BACKOFF_S 60
#define MAX_RETRY_AFTER_S 300
/* An attempt that moved fewer bytes is not progress: a server that
 * trickles a few bytes per connection must not retry forever. */
#define PROGRESS_BYTES ((uint64_t)1 << 20)

/* ---- one exchange ------------------------------------------------------------------------------ */

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
    fetch_header_line(ud, data, size * nmemb);
    return size * nmemb;
}

void fetch_header_line(fetch_resp *r, const char *data, size_t n)
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
#define IS(k) (klen == sizeof(k) - 1 && !strncasecmp(data, k, klen))
    if (IS("location"))
        copy_value(r->location, sizeof r->location, v, vlen);
    else if (IS("x-repo-commit"))
        copy_value(r->commit, sizeof r->commit, v, vlen);
    else if (IS("etag"))
        copy_value(r->etag, sizeof r->etag, v, vlen);
    else if (IS("x-linked-etag"))
        copy_value(r->linked_etag, sizeof r->linked_etag, v, vlen);
    else if (IS("x-error-code"))
        copy_value(r->error_code, sizeof r->error_code, v, vlen);
    else if (IS("content-range"))
        copy_value(r->content_range, sizeof r->content_range, v, vlen);
    else if (IS("link"))
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

static struct curl_slist *auth_headers(fetch_ctx *c, CURL *h, fetch_auth auth)
{
    struct curl_slist *hs = NULL, *t;
    char line[2200];
    const char *token = auth == FETCH_AUTH_BEARER ? c->bearer : auth == FETCH_AUTH_HF ? c->hf_token : "";
    if (token[0]) {
        snprintf(line, sizeof line, "Authorization: Bearer %s", token);
        if (!(t = curl_slist_append(hs, line)))
            return NULL;
        hs = t;
    } else if (auth == FETCH_AUTH_S3 && c->s3_user[0]) {
        char sig[128];
        snprintf(sig, sizeof sig, "aws:amz:%s:s3", c->s3_region);
        curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sig);
        curl_easy_setopt(h, CURLOPT_USERPWD, c->s3_user);
        /* S3 wants the payload's hash in a header, signed: libcurl before 8.x does not add it. A GET's payload
         * is empty. */
        if (!(t = curl_slist_append(hs, "x-amz-content-sha256: "
                                        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")))
            return NULL;
        hs = t;
        if (c->s3_session[0]) {
            snprintf(line, sizeof line, "x-amz-security-token: %s", c->s3_session);
            if (!(t = curl_slist_append(hs, line)))
                return NULL;
            hs = t;
        }
    }
    /* a list that is never empty: NULL means out of memory (the agent is no custom header: a signer may
     * leave it out, as AWS's own do) */
    t = curl_slist_append(hs, "Accept: */*");
    if (!t)
        curl_slist_free_all(hs);
    return t;
}

/* The settings every request of a fetch has: no redirects followed, the
 * header reader, connect and stall limits, HTTP(S) only. */
static void base_opts(fetch_ctx *c, CURL *h, const char *url, fetch_resp *r)
{
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "llm-fetch/0.1");
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, (long)STALL_BYTES_PER_S);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, c->stall_s);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
}

llm_status fetch_http(fetch_ctx *c, const char *url, fetch_auth auth, int head, size_t max, char **body, fetch_resp *r)
{
    memset(r, 0, sizeof *r);
    r->retry_after = -1;
    if (body)
        *body = NULL;
    CURL *h = curl_easy_init();
    http_client_body b = {.max = max};
    struct curl_slist *hs = h ? auth_headers(c, h, auth) : NULL;
    if (!h || !hs) {
        curl_easy_cleanup(h);
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "%s: cannot set up the request", url);
    }
    base_opts(c, h, url, r);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
    curl_easy_setopt(h, CURLOPT_NOBODY, head ? 1L : 0L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, http_client_body_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->code);
    curl_easy_cleanup(h);
    curl_slist_free_all(hs);
    llm_status st = LLM_OK;
    if (b.over)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_TOO_LONG, "%s: the answer is over %zu bytes", url, max);
    else if (b.nomem)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "%s: no memory for the answer", url);
    else if (rc != CURLE_OK)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: %s", url, curl_easy_strerror(rc));
    if (st || !body)
        free(b.p);
    else
        *body = b.p ? b.p : calloc(1, 1);
    if (!st && body && !*body)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "%s: no memory for the answer", url);
    return st;
}

int fetch_url_host(const char *url, char *out, size_t n)
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

int fetch_redirect_ok(fetch_ctx *c, const char *from, char *to, size_t n)
{
    char host[512], abs[4096];
    if (to[0] == '/' && to[1] != '/') { /* relative to the same host */
        size_t scheme = !strncmp(from, "https://", 8) ? 8 : 7;
        if (fetch_url_host(from, host, sizeof host) ||
            snprintf(abs, sizeof abs, "%.*s%s%s", (int)scheme, from, host, to) >= (int)sizeof abs || strlen(abs) >= n) {
            fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: redirect to %.200s: too long", from, to);
            return -1;
        }
        snprintf(to, n, "%s", abs);
    }
    int https = !strncmp(to, "https://", 8), http = !strncmp(to, "http://", 7);
    if (!https && !(http && !strncmp(from, "http://", 7))) {
        fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: redirect to %.200s refused: only https (or http from http)",
                   from, to);
        return -1;
    }
    if (fetch_url_host(to, host, sizeof host)) {
        fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: redirect to %.200s: not a URL with a host", from, to);
        return -1;
    }
    return 0;
}

/* ---- one file's transfer ----------------------------------------------------------------------- */

typedef struct sink {
    fetch_ctx *c;
    CURL *h;          /* the request in flight, and what its headers said */
    const fetch_resp *r;
    int decided, discard, bad_range;
    uint64_t discarded;
    int fd;
    EVP_MD_CTX *md;
    uint64_t have, limit; /* bytes in the file; the most it may hold (0: the disk's free space) */
    int err_no, over, not_gguf, aborted, no_space;
    unsigned char head[4];
    int nhead;        /* bytes of head seen */
    const char *part;
    int sized;        /* limit came from the expected size */
} sink;

static int restart_file(sink *s);

/* Free bytes on the file system of path's folder (UINT64_MAX / 2 when
 * unknown). */
static uint64_t free_bytes(const char *path)
{
    struct statvfs vs;
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    return statvfs(slash ? dir : ".", &vs) ? UINT64_MAX / 2 : (uint64_t)vs.f_bavail * vs.f_frsize;
}

/* A file of no announced size (https, s3): its Content-Length bounds it
 * and must fit on the disk; without one, the disk's free space does. */
static int size_from_answer(sink *s)
{
    uint64_t free_b = free_bytes(s->part);
    uint64_t rest = s->r->has_length ? s->r->length : free_b;
    if (rest > free_b) {
        s->no_space = 1;
        s->limit = s->have + rest;
        return -1;
    }
    s->limit = s->have + rest;
    if (s->r->has_length)
        s->c->total = s->c->done_before + s->limit;
    return 0;
}

/* Before a response's first byte: whose bytes these are. A 206 must start
 * where the file ends; a 200 to a Range request restarts the file; the
 * body of anything else (a redirect, an error page) is not the file. */
static int decide(sink *s)
{
    long code = 0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &code);
    s->decided = 1;
    if (code == 206) {
        unsigned long long a = 0;
        if (sscanf(s->r->content_range, "bytes %llu-", &a) != 1 || a != s->have) {
            s->bad_range = 1;
            return -1;
        }
    } else if (code == 200) {
        if (s->have && restart_file(s)) {
            s->err_no = errno ? errno : EIO;
            return -1;
        }
    } else {
        s->discard = 1;
        return 0;
    }
    return s->sized ? 0 : size_from_answer(s);
}

static size_t on_data(char *data, size_t size, size_t nmemb, void *ud)
{
    sink *s = ud;
    size_t n = size * nmemb;
    if (!s->decided && decide(s))
        return 0;
    if (s->discard) {
        s->discarded += n;
        return s->discarded > (1u << 20) ? 0 : n;
    }
    if (s->limit && n > s->limit - s->have) {
        s->over = 1;
        return 0;
    }
    for (size_t i = 0; i < n && s->have + i < 4; i++) s->head[s->have + i] = (unsigned char)data[i];
    s->nhead = s->have + n < 4 ? (int)(s->have + n) : 4;
    if (s->have < 4 && s->have + n >= 4 && memcmp(s->head, "GGUF", 4)) {
        s->not_gguf = 1; /* a page of HTML, an error document: not a model */
        return 0;
    }
    for (size_t off = 0; off < n;) {
        ssize_t w = write(s->fd, data + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            s->err_no = w < 0 ? errno : EIO;
            return 0;
        }
        off += (size_t)w;
    }
    if (!EVP_DigestUpdate(s->md, data, n)) {
        s->err_no = EIO;
        return 0;
    }
    s->have += n;
    return n;
}

static int on_xferinfo(void *ud, curl_off_t dlt, curl_off_t dln, curl_off_t ult, curl_off_t uln)
{
    (void)dlt, (void)dln, (void)ult, (void)uln;
    sink *s = ud;
    if (s->c->o->abort && atomic_load(s->c->o->abort)) {
        s->aborted = 1;
        return 1;
    }
    fetch_report(s->c, "downloading", s->have, 0);
    return 0;
}

/* The digest of what the partial file already holds: read once, when a
 * transfer resumes a file another attempt or process began. */
static int hash_prefix(sink *s)
{
    unsigned char buf[1 << 16];
    uint64_t left = s->have;
    s->nhead = s->have < 4 ? (int)s->have : 4;
    if (pread(s->fd, s->head, (size_t)s->nhead, 0) != s->nhead || lseek(s->fd, 0, SEEK_SET) < 0)
        return -1;
    while (left) {
        ssize_t r = read(s->fd, buf, left < sizeof buf ? left : sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || !EVP_DigestUpdate(s->md, buf, (size_t)r))
            return -1;
        left -= (uint64_t)r;
    }
    return lseek(s->fd, 0, SEEK_END) < 0 ? -1 : 0;
}

static int restart_file(sink *s)
{
    s->have = 0;
    return ftruncate(s->fd, 0) || lseek(s->fd, 0, SEEK_SET) < 0 || !EVP_DigestInit_ex(s->md, EVP_sha256(), NULL) ? -1 : 0;
}

/* Refuses before writing when the rest of the file cannot fit. */
static llm_status check_space(fetch_ctx *c, const fetch_file *f, const char *part, uint64_t have)
{
    uint64_t free_b = free_bytes(part);
    if (f->size && f->size - have > free_b)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: needs %llu more bytes, the cache has %llu free: nothing "
                          "written", f->name, (unsigned long long)(f->size - have), (unsigned long long)free_b);
    return LLM_OK;
}

/* Seconds to wait before attempt k (1-based), or what the server asked. */
static long backoff_s(int k, long retry_after)
{
    if (retry_after >= 0)
        return retry_after;
    long s = 1L << (k < 6 ? k - 1 : 5);
    return s > MAX_BACKOFF_S ? MAX_BACKOFF_S : s;
}

static int sleep_s(fetch_ctx *c, long s)
{
    for (long ms = 0; ms < s * 1000; ms += 100) {
        if (c->o->abort && atomic_load(c->o->abort))
            return -1;
        usleep(100000);
    }
    return 0;
}

/* What a status ends in: 0 go on (2xx), 1 retry, -1 fail (c->err set). */
static int judge(fetch_ctx *c, const fetch_file *f, long code, const char *url)
{
    if (code >= 200 && code < 300)
        return 0;
    if (code == 429 || code == 408 || code >= 500) {
        fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: HTTP %ld at %.200s", f->name, code, url);
        return 1;
    }
    if (code == 404 || code == 410)
        fetch_fail(c, FETCH_NOT_FOUND, LLM_ERR_NOT_FOUND, "%s: not found (HTTP %ld at %.200s)", f->name, code, url);
    else if (code == 401 || code == 403)
        fetch_fail(c, FETCH_DENIED, LLM_ERR_INVALID_ARG, "%s: access denied (HTTP %ld): the credentials are missing "
                   "or not allowed to read it", f->name, code);
    else
        fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: HTTP %ld at %.200s", f->name, code, url);
    return -1;
}

/* One GET of url from s->have on; follows redirects by hand (the
 * credentials only to the first host). 0 done, 1 retry, -1 failed. */
static int get_once(fetch_ctx *c, const fetch_file *f, sink *s, long *retry_after)
{
    char url[4096], first_host[512] = "", host[512];
    snprintf(url, sizeof url, "%s", f->url);
    fetch_url_host(url, first_host, sizeof first_host);
    *retry_after = -1;
    for (int hop = 0; hop <= FETCH_MAX_REDIRECTS; hop++) {
        fetch_resp r;
        memset(&r, 0, sizeof r);
        r.retry_after = -1;
        CURL *h = curl_easy_init();
        fetch_auth auth = !fetch_url_host(url, host, sizeof host) && !strcmp(host, first_host) ? f->auth : FETCH_AUTH_NONE;
        struct curl_slist *hs = h ? auth_headers(c, h, auth) : NULL;
        if (!h || !hs) {
            curl_easy_cleanup(h);
            fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "%s: cannot set up the request", f->name);
            return -1;
        }
        char range[64];
        snprintf(range, sizeof range, "%llu-", (unsigned long long)s->have);
        base_opts(c, h, url, &r);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
        if (s->have)
            curl_easy_setopt(h, CURLOPT_RANGE, range);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_xferinfo);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, s);
        s->h = h;
        s->r = &r;
        s->decided = s->discard = 0;
        s->discarded = 0;
        uint64_t from = s->have;
        /* A body is written only under a 200/206 whose range starts where the file ends. */
        CURLcode rc = curl_easy_perform(h);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.code);
        curl_easy_cleanup(h);
        curl_slist_free_all(hs);
        *retry_after = r.retry_after;
        if (s->aborted) {
            fetch_fail(c, FETCH_FAILED, LLM_ERR_CANCELLED, "%s: the download was abandoned", f->name);
            return -1;
        }
        if (s->not_gguf || s->over || s->err_no || s->bad_range || s->no_space)
            return -1; /* the caller says which */
        if (r.code >= 300 && r.code < 400 && r.location[0]) {
            if (fetch_redirect_ok(c, url, r.location, sizeof r.location))
                return -1;
            snprintf(url, sizeof url, "%s", r.location);
            continue;
        }
        if (r.code == 416 && f->size && s->have == f->size)
            return 0;
        if (rc != CURLE_OK && !r.code) {
            fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: %.200s: %s", f->name, url, curl_easy_strerror(rc));
            return 1;
        }
        int j = judge(c, f, r.code, url);
        if (j)
            return j;
        if (rc == CURLE_OK)
            return 0;
        /* cut, stalled: resume from what arrived */
        fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: %s after %llu bytes", f->name, curl_easy_strerror(rc),
                   (unsigned long long)(s->have - from));
        return 1;
    }
    fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: more than %d redirects", f->name, FETCH_MAX_REDIRECTS);
    return -1;
}

/* The end of a transfer that stopped for a reason of the bytes' own (not
 * the network's): nothing of the file is kept. */
static llm_status refuse_bytes(fetch_ctx *c, const fetch_file *f, sink *s, const char *part)
{
    char first[16] = "";
    for (int i = 0; i < s->nhead; i++)
        snprintf(first + 3 * i, 4, "%02x ", s->head[i]);
    unlink(part);
    if (s->no_space)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: %llu bytes announced do not fit in the cache's free space: "
                          "nothing kept", f->name, (unsigned long long)(s->limit - s->have));
    if (s->not_gguf)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: not a GGUF file (it starts with %s): deleted", f->name,
                          first[0] ? first : "nothing");
    if (s->over)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: the server sent more than the %llu bytes it announced",
                          f->name, (unsigned long long)s->limit);
    return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: writing %s failed: %s%s", f->name, part, strerror(s->err_no),
                      s->err_no == ENOSPC ? " (the partial file is deleted)" : "");
}

/* Verifies what is complete in the partial file and renames it into place. */
static llm_status finish(fetch_ctx *c, const fetch_file *f, sink *s, const char *part)
{
    unsigned char dig[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    char hex[2 * EVP_MAX_MD_SIZE + 1] = "";
    fetch_report(c, "verifying", s->have, 1);
    if (s->have < 4 || memcmp(s->head, "GGUF", 4)) {
        s->not_gguf = 1;
        return refuse_bytes(c, f, s, part);
    }
    if (!EVP_DigestFinal_ex(s->md, dig, &n))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INTERNAL, "SHA-256 final failed");
    for (unsigned int i = 0; i < n; i++) snprintf(hex + 2 * i, 3, "%02x", dig[i]);
    if (f->want[0] && strcasecmp(hex, f->want)) {
        unlink(part);
        return fetch_fail(c, FETCH_CHECKSUM, LLM_ERR_FORMAT, "%s: sha256 mismatch: got %.12s..., expected %.12s...: "
                          "deleted, nothing kept", f->name, hex, f->want);
    }
    if (fsync(s->fd) || rename(part, f->dest))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot put it in place at %s: %s", f->name, f->dest,
                          strerror(errno));
    return LLM_OK;
}

static llm_status transfer_loop(fetch_ctx *c, const fetch_file *f, sink *s, const char *part)
{
    for (int fails = 0;;) {
        uint64_t before = s->have;
        long ra = -1;
        int g = get_once(c, f, s, &ra);
        if (g == 0 && f->size && s->have < f->size)
            g = 1; /* ended early without an error: resume */
        if (g == 0)
            return finish(c, f, s, part);
        if (g < 0 && s->bad_range) { /* a range that is not the one asked for: start the file over */
            s->bad_range = 0;
            if (restart_file(s))
                return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: %s: %s", f->name, part, strerror(errno));
            g = 1;
        }
        if (g < 0)
            return s->not_gguf || s->over || s->err_no || s->no_space ? refuse_bytes(c, f, s, part) : c->err->code;
        fails = s->have >= before + PROGRESS_BYTES ? 1 : fails + 1;
        if (fails > c->max_retries)
            return fetch_fail(c, c->why, c->err->code ? c->err->code : LLM_ERR_IO,
                              "%s: gave up after %d attempts without progress; the last: %.300s", f->name, fails,
                              c->err->msg);
        long wait = backoff_s(fails, ra);
        fprintf(stderr, "llm-fetch: %s; retrying in %ld s from byte %llu\n", c->err->msg, wait,
                (unsigned long long)s->have);
        if (sleep_s(c, wait))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_CANCELLED, "%s: the download was abandoned", f->name);
    }
}

/* Transfers f into the partial file part (resuming what it holds), then
 * verifies and renames it to f->dest. */
static llm_status transfer(fetch_ctx *c, const fetch_file *f, const char *part)
{
    sink s = {.c = c, .fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC, 0644), .md = EVP_MD_CTX_new(), .part = part,
              .sized = f->size != 0};
    struct stat sb;
    llm_status st = LLM_OK;
    if (s.fd < 0 || fstat(s.fd, &sb))
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot open %s: %s", f->name, part, strerror(errno));
    else if (!s.md || !EVP_DigestInit_ex(s.md, EVP_sha256(), NULL))
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "cannot set up SHA-256");
    if (!st) {
        s.have = (uint64_t)sb.st_size;
        s.limit = f->size;
        if (f->size)
            c->total = c->total ? c->total : c->done_before + f->size;
        if ((f->size && s.have > f->size) ? restart_file(&s) : s.have ? hash_prefix(&s) : 0)
            st = fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot read %s: %s", f->name, part, strerror(errno));
    }
    if (!st && s.have)
        fprintf(stderr, "llm-fetch: %s: resuming at byte %llu of %llu\n", f->name, (unsigned long long)s.have,
                (unsigned long long)f->size);
    if (!st)
        st = check_space(c, f, part, s.have);
    if (!st)
        st = transfer_loop(c, f, &s, part);
    if (st && s.fd >= 0 && !fstat(s.fd, &sb) && sb.st_size == 0)
        unlink(part); /* nothing to resume */
    if (s.fd >= 0)
        close(s.fd);
    EVP_MD_CTX_free(s.md);
    return st;
}

static int file_size(const char *path, uint64_t *size)
{
    struct stat sb;
    if (stat(path, &sb) || !S_ISREG(sb.st_mode))
        return -1;
    *size = (uint64_t)sb.st_size;
    return 0;
}

/* Whether f is in place already (a file of the expected size). */
static int in_place(const fetch_file *f)
{
    uint64_t sz;
    return !file_size(f->dest, &sz) && (!f->size || sz == f->size);
}

/* Takes f's lock, waiting while another process holds it. 1: held;
 * 0: not held, the holder made no progress for lock_stale_s (the caller
 * goes alone); -1 failed or f arrived meanwhile (*arrived set). */
static int take_lock(fetch_ctx *c, fetch_file *f, int fd, const char *part, int *arrived)
{
    uint64_t last = UINT64_MAX, sz;
    double since = llm_clock_mono_s();
    *arrived = 0;
    while (flock(fd, LOCK_EX | LOCK_NB)) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot lock %s: %s", f->name, f->lock, strerror(errno));
            return -1;
        }
        if (in_place(f)) {
            *arrived = 1;
            return -1;
        }
        sz = file_size(part, &sz) ? 0 : sz;
        if (sz != last)
            last = sz, since = llm_clock_mono_s();
        fetch_report(c, "waiting", sz, 0);
        if (llm_clock_mono_s() - since > (double)c->lock_stale_s) {
            fprintf(stderr, "llm-fetch: %s: the process holding %s made no progress for %ld s: downloading alone\n",
                    f->name, f->lock, c->lock_stale_s);
            return 0;
        }
        usleep(200000);
        if (c->o->abort && atomic_load(c->o->abort)) {
            fetch_fail(c, FETCH_FAILED, LLM_ERR_CANCELLED, "%s: the wait was abandoned", f->name);
            return -1;
        }
    }
    return 1;
}

llm_status fetch_file_get(fetch_ctx *c, fetch_file *f)
{
    if (in_place(f))
        return LLM_OK;
    if (fetch_mkdirs_for(f->dest) || fetch_mkdirs_for(f->lock))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot make the cache's folders for %s: %s", f->name, f->dest,
                          strerror(errno));
    char part[PATH_MAX + 32];
    snprintf(part, sizeof part, "%s.incomplete", f->dest);
    int fd = open(f->lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644), arrived = 0;
    if (fd < 0)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot open the lock %s: %s", f->name, f->lock,
                          strerror(errno));
    int held = take_lock(c, f, fd, part, &arrived);
    llm_status st = held < 0 ? (arrived ? LLM_OK : c->err->code) : LLM_OK;
    if (held >= 0 && !in_place(f)) {
        if (!held) /* alone beside a stuck holder: a partial file of our own */
            snprintf(part, sizeof part, "%s.%ld.incomplete", f->dest, (long)getpid());
        st = transfer(c, f, part);
        if (st && !held)
            unlink(part);
    }
    close(fd); /* releases the lock */
    return st;
}
