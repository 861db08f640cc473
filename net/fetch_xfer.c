/* fetch_xfer.c - one file's transfer into the cache: locked against other
 * processes, resumed with Range, retried with back-off, hashed as it
 * arrives, verified and renamed into place. (fetch_impl.h states the
 * rules.)
 *
 * The cache is written by whoever shares it, so nothing found there is
 * trusted by name: a partial file is opened without following links and
 * must be a regular file; one this process did not write is resumed only
 * when a digest will judge the whole (and a mismatch then retries once
 * from byte 0); a file in place is hashed when the caller gave a digest. */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "fetch_impl.h"
#include "llm/clock.h"

/* What a transfer leaves free on the cache's file system: 1% of it (at
 * most 1 GiB) plus 16 MiB, so a download cannot fill a node's disk. */
#define RESERVE_MAX ((uint64_t)1 << 30)
#define RESERVE_MIN ((uint64_t)16 << 20)

typedef struct sink {
    fetch_ctx *c;
    CURL *h;                /* the request in flight, and what its headers said */
    const fetch_resp *r;
    int decided, discard, bad_range;
    uint64_t discarded;
    int fd;
    EVP_MD_CTX *md;
    uint64_t have, limit;   /* bytes in the file; the most it may hold */
    int err_no, over, not_gguf, aborted, no_space;
    unsigned char head[4];
    int nhead;              /* bytes of head seen */
    const char *part;
    int sized;              /* limit came from the expected size */
} sink;

/* Free bytes on the file system of path's folder, less the reserve
 * (UINT64_MAX / 2 when unknown). */
static uint64_t free_bytes(const char *path)
{
    struct statvfs vs;
    char dir[PATH_MAX + 64];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        *slash = 0;
    if (statvfs(slash ? dir : ".", &vs))
        return UINT64_MAX / 2;
    uint64_t total = (uint64_t)vs.f_blocks * vs.f_frsize, avail = (uint64_t)vs.f_bavail * vs.f_frsize;
    uint64_t reserve = (total / 100 < RESERVE_MAX ? total / 100 : RESERVE_MAX) + RESERVE_MIN;
    return avail > reserve ? avail - reserve : 0;
}

static int restart_file(sink *s)
{
    s->have = 0;
    s->nhead = 0;
    return ftruncate(s->fd, 0) || lseek(s->fd, 0, SEEK_SET) < 0 || !EVP_DigestInit_ex(s->md, EVP_sha256(), NULL) ? -1 : 0;
}

/* A file of no announced size (https, s3): its Content-Length bounds it
 * and must fit on the disk; without one, the disk's free space does. */
static int size_from_answer(sink *s)
{
    uint64_t free_b = free_bytes(s->part);
    uint64_t rest = s->r->has_length ? s->r->length : free_b;
    s->limit = s->have + rest;
    if (rest > free_b) {
        s->no_space = 1;
        return -1;
    }
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
    s->decided = 1;
    if (curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &code))
        code = 0;
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
    if (n > s->limit - s->have) {
        s->over = 1;
        return 0;
    }
    for (size_t i = 0; i < n && s->have + i < 4; i++) s->head[s->have + i] = (unsigned char)data[i];
    s->nhead = s->have + n < 4 ? (int)(s->have + n) : 4;
    if (s->nhead == 4 && memcmp(s->head, "GGUF", 4)) {
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
    if (fetch_aborted(s->c)) {
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

/* Refuses before writing when the rest of the file cannot fit. */
static llm_status check_space(fetch_ctx *c, const fetch_file *f, const char *part, uint64_t have)
{
    uint64_t free_b = free_bytes(part);
    if (f->size && f->size - have > free_b)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: needs %llu more bytes, the cache has %llu free (less its "
                          "reserve): nothing written", f->name, (unsigned long long)(f->size - have),
                          (unsigned long long)free_b);
    return LLM_OK;
}

/* ---- one GET, redirects followed by hand -------------------------------------------------------- */

/* What a status ends in: 0 go on (2xx), 1 retry, -1 fail (c->err set). */
static int judge(fetch_ctx *c, const fetch_file *f, long code, const char *url)
{
    if (code >= 200 && code < 300)
        return 0;
    if (code == 429 || code == 408 || code >= 500) {
        fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: HTTP %ld at %.*s", f->name, code, fetch_shown(url), url);
        return 1;
    }
    if (code == 404 || code == 410)
        fetch_fail(c, FETCH_NOT_FOUND, LLM_ERR_NOT_FOUND, "%s: not found (HTTP %ld at %.*s)", f->name, code,
                   fetch_shown(url), url);
    else if (code == 401 || code == 403)
        fetch_fail(c, FETCH_DENIED, LLM_ERR_INVALID_ARG, "%s: access denied (HTTP %ld): the credentials are missing "
                   "or not allowed to read it", f->name, code);
    else
        fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: HTTP %ld at %.*s", f->name, code, fetch_shown(url), url);
    return -1;
}

/* A GET of url from s->have on, writing into s; the credentials only when
 * url's host is the first one's. */
static CURLcode get(fetch_ctx *c, const fetch_file *f, sink *s, const char *url, int same_host, fetch_resp *r)
{
    char range[64];
    CURL *h = curl_easy_init();
    struct curl_slist *hs = h ? fetch_http_prepare(c, h, url, same_host ? f->auth : FETCH_AUTH_NONE, r) : NULL;
    snprintf(range, sizeof range, "%llu-", (unsigned long long)s->have);
    CURLcode rc = !hs ? CURLE_FAILED_INIT : CURLE_OK;
    if (!rc && ((s->have && curl_easy_setopt(h, CURLOPT_RANGE, range)) ||
                curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data) || curl_easy_setopt(h, CURLOPT_WRITEDATA, s) ||
                curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_xferinfo) ||
                curl_easy_setopt(h, CURLOPT_XFERINFODATA, s) ||
                curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L << 10))) /* fewer, larger writes and digest updates */
        rc = CURLE_FAILED_INIT;
    s->h = h;
    s->r = r;
    s->decided = s->discard = 0;
    s->discarded = 0;
    if (!rc)
        rc = curl_easy_perform(h);
    if (!h || curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->code))
        r->code = 0;
    curl_easy_cleanup(h);
    curl_slist_free_all(hs);
    if (rc == CURLE_FAILED_INIT && !c->err->code)
        fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "%s: cannot set up the request", f->name);
    return rc;
}

/* What one answer ends in: 0 done, 1 retry, -1 failed, 2 a redirect to
 * follow (to r->location, checked). */
static int outcome(fetch_ctx *c, const fetch_file *f, sink *s, CURLcode rc, fetch_resp *r, const char *url,
                   uint64_t from)
{
    if (s->aborted || fetch_aborted(c)) {
        fetch_fail(c, FETCH_FAILED, LLM_ERR_CANCELLED, "%s: the download was abandoned", f->name);
        return -1;
    }
    if (rc == CURLE_FAILED_INIT || s->not_gguf || s->over || s->err_no || s->bad_range || s->no_space)
        return -1; /* the caller says which */
    if (r->code >= 300 && r->code < 400 && r->location[0])
        return fetch_http_redirect_ok(c, url, r->location, sizeof r->location) ? -1 : 2;
    if (r->code == 416 && f->size && s->have == f->size)
        return 0;
    if (rc != CURLE_OK && !r->code) {
        fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: %.*s: %s", f->name, fetch_shown(url), url, curl_easy_strerror(rc));
        return 1;
    }
    int j = judge(c, f, r->code, url);
    if (j || rc == CURLE_OK)
        return j;
    fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: %s after %llu bytes", f->name, curl_easy_strerror(rc),
               (unsigned long long)(s->have - from)); /* cut or stalled: resumed from what arrived */
    return 1;
}

/* One attempt: a GET and its redirects. 0 done, 1 retry, -1 failed. */
static int get_once(fetch_ctx *c, const fetch_file *f, sink *s, long *retry_after)
{
    char url[4096], first_host[512] = "", host[512];
    snprintf(url, sizeof url, "%s", f->url);
    fetch_http_host(url, first_host, sizeof first_host);
    for (int hop = 0; hop <= FETCH_MAX_REDIRECTS; hop++) {
        fetch_resp r;
        uint64_t from = s->have;
        int same = !fetch_http_host(url, host, sizeof host) && !strcmp(host, first_host);
        CURLcode rc = get(c, f, s, url, same, &r);
        *retry_after = r.retry_after;
        int o = outcome(c, f, s, rc, &r, url, from);
        if (o != 2)
            return o;
        snprintf(url, sizeof url, "%s", r.location);
    }
    fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: more than %d redirects", f->name, FETCH_MAX_REDIRECTS);
    return -1;
}

/* ---- the file ---------------------------------------------------------------------------------- */

/* The end of a transfer that stopped for a reason of the bytes' own (not
 * the network's): nothing of the file is kept. */
static llm_status refuse_bytes(fetch_ctx *c, const fetch_file *f, sink *s, const char *part)
{
    char first[16] = "";
    for (int i = 0; i < s->nhead; i++) snprintf(first + 3 * i, 4, "%02x ", s->head[i]);
    unlink(part);
    if (s->no_space)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: %llu bytes announced do not fit in the cache's free space "
                          "(less its reserve): nothing kept", f->name, (unsigned long long)(s->limit - s->have));
    if (s->not_gguf)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: not a GGUF file (it starts with %s): deleted", f->name,
                          first[0] ? first : "nothing");
    if (s->over)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: the server sent more than the %llu bytes it announced",
                          f->name, (unsigned long long)s->limit);
    return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: writing %s failed: %s (the partial file is deleted)", f->name,
                      part, strerror(s->err_no));
}

/* Verifies what is complete in the partial file and renames it into place. */
static llm_status finish(fetch_ctx *c, const fetch_file *f, sink *s, const char *part)
{
    unsigned char dig[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    fetch_report(c, "verifying", s->have, 1);
    if (s->nhead < 4 || memcmp(s->head, "GGUF", 4)) {
        s->not_gguf = 1;
        return refuse_bytes(c, f, s, part);
    }
    if (!EVP_DigestFinal_ex(s->md, dig, &n))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INTERNAL, "SHA-256 final failed");
    fetch_hex(dig, n, hex);
    if (f->want[0] && strcmp(hex, f->want)) {
        unlink(part);
        return fetch_fail(c, FETCH_CHECKSUM, LLM_ERR_FORMAT, "%s: sha256 mismatch: got %s, expected %s: "
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
        fails = s->have >= before + FETCH_PROGRESS_BYTES ? 1 : fails + 1;
        if (fails > c->max_retries)
            return fetch_fail(c, c->why, c->err->code ? c->err->code : LLM_ERR_IO,
                              "%s: gave up after %d attempts without progress; the last: %.300s", f->name, fails,
                              c->err->msg);
        long wait = fetch_backoff_s(fails, ra);
        fetch_log(c, "%s; retrying in %ld s from byte %llu", c->err->msg, wait, (unsigned long long)s->have);
        if (fetch_sleep(c, wait))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_CANCELLED, "%s: the download was abandoned", f->name);
    }
}

/* The partial file, never through a link and only a regular file (a FIFO
 * would block the writes for good): anything else found there is
 * removed and the file made anew. -1 with errno. */
static int open_part(const char *part)
{
    for (int k = 0; k < 2; k++) {
        int fd = open(part, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
        struct stat sb;
        if (fd >= 0 && !fstat(fd, &sb) && S_ISREG(sb.st_mode) && !fcntl(fd, F_SETFL, 0))
            return fd;
        if (fd >= 0)
            close(fd);
        if (k || (fd < 0 && errno != ELOOP && errno != ENXIO && errno != EISDIR) || unlink(part))
            return -1;
    }
    return -1;
}

/* Opens the partial file and takes what it holds as a start when a
 * digest will judge the whole (*resumed); else it starts empty. */
static llm_status start_sink(fetch_ctx *c, const fetch_file *f, const char *part, sink *s, int *resumed)
{
    struct stat sb;
    *resumed = 0;
    if ((s->fd = open_part(part)) < 0 || fstat(s->fd, &sb))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot open %s: %s", f->name, part, strerror(errno));
    if (!(s->md = EVP_MD_CTX_new()) || !EVP_DigestInit_ex(s->md, EVP_sha256(), NULL))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "cannot set up SHA-256");
    s->have = (uint64_t)sb.st_size;
    s->limit = f->size;
    int keep = s->have && f->want[0] && (!f->size || s->have <= f->size);
    if (keep ? hash_prefix(s) : s->have ? restart_file(s) : 0)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot read %s: %s", f->name, part, strerror(errno));
    if (keep) {
        *resumed = 1;
        fetch_log(c, "%s: resuming at byte %llu of %llu", f->name, (unsigned long long)s->have,
                  (unsigned long long)f->size);
    }
    if (f->size && !c->total)
        c->total = c->done_before + f->size;
    return check_space(c, f, part, s->have);
}

/* Transfers f into the partial file part, then verifies and renames it to
 * f->dest. A resumed start that ends in a digest mismatch (someone's bytes
 * planted in the partial file) is tried once more from byte 0. */
static llm_status transfer(fetch_ctx *c, const fetch_file *f, const char *part)
{
    for (int round = 0;; round++) {
        sink s = {.c = c, .fd = -1, .part = part, .sized = f->size != 0};
        int resumed = 0;
        llm_status st = start_sink(c, f, part, &s, &resumed);
        if (!st)
            st = transfer_loop(c, f, &s, part);
        struct stat sb;
        if (st && s.fd >= 0 && !fstat(s.fd, &sb) && sb.st_size == 0)
            unlink(part); /* nothing to resume */
        if (s.fd >= 0)
            close(s.fd);
        EVP_MD_CTX_free(s.md);
        if (!(st && resumed && c->why == FETCH_CHECKSUM && round == 0))
            return st;
        fetch_log(c, "%s: the resumed file did not verify; downloading it again from byte 0", f->name);
    }
}

static int file_size(const char *path, uint64_t *size)
{
    struct stat sb;
    if (lstat(path, &sb) || !S_ISREG(sb.st_mode))
        return -1;
    *size = (uint64_t)sb.st_size;
    return 0;
}

/* Whether f is in place already: a regular file of the expected size and,
 * when the caller gave a digest or the options verify_cached, of want. */
static int in_place(fetch_ctx *c, const fetch_file *f)
{
    uint64_t sz;
    char hex[FETCH_SHA256_HEX];
    llm_error e = {0};
    if (file_size(f->dest, &sz) || (f->size && sz != f->size))
        return 0;
    if (!f->verify_hit && !c->o->verify_cached)
        return 1;
    if (!f->want[0]) /* to be judged, with nothing to judge it by: fetched again */
        return 0;
    fetch_report(c, "verifying", 0, 1);
    llm_status st = fetch_file_sha256(f->dest, 1, c->o->abort, hex, &e);
    if (!st && !strcmp(hex, f->want))
        return 1;
    if (st == LLM_ERR_CANCELLED) /* not judged: kept; the caller checks fetch_aborted next */
        return 0;
    if (st)
        fetch_log(c, "%s: %s: fetched again", f->name, e.msg);
    else
        fetch_log(c, "%s: the file in the cache is not the one expected (sha256 %.12s...): fetched again", f->name, hex);
    unlink(f->dest);
    return 0;
}

/* Takes f's lock, waiting while another process holds it and its partial
 * file grows. 1: held; 0: not held, the holder moved less than the stall
 * rate for lock_stale_s (the caller goes alone); -1: failed, or f arrived
 * meanwhile (*arrived set). */
static int take_lock(fetch_ctx *c, fetch_file *f, int fd, const char *part, int *arrived)
{
    uint64_t mark = 0, sz;
    double since = llm_clock_mono_s();
    *arrived = 0;
    if (file_size(part, &mark))
        mark = 0;
    while (flock(fd, LOCK_EX | LOCK_NB)) {
        if (errno != EWOULDBLOCK && errno != EINTR) {
            fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot lock %s: %s", f->name, f->lock, strerror(errno));
            return -1;
        }
        if (in_place(c, f)) {
            *arrived = 1;
            return -1;
        }
        if (file_size(part, &sz))
            sz = 0;
        fetch_report(c, "waiting", sz, 0);
        double waited = llm_clock_mono_s() - since;
        if (waited > (double)c->lock_stale_s) {
            if (sz < mark + (uint64_t)(FETCH_STALL_BYTES_PER_S * waited)) {
                fetch_log(c, "%s: the process holding %s moved %llu bytes in %.0f s: downloading alone", f->name,
                          f->lock, (unsigned long long)(sz > mark ? sz - mark : 0), waited);
                return 0;
            }
            mark = sz, since = llm_clock_mono_s();
        }
        usleep(200000);
        if (fetch_aborted(c)) {
            fetch_fail(c, FETCH_FAILED, LLM_ERR_CANCELLED, "%s: the wait was abandoned", f->name);
            return -1;
        }
    }
    return 1;
}

llm_status fetch_xfer_get(fetch_ctx *c, fetch_file *f)
{
    if (in_place(c, f))
        return LLM_OK;
    if (fetch_aborted(c)) /* in_place may have stopped hashing for it */
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_CANCELLED, "%s: abandoned", f->name);
    if (fetch_mkdirs_for(f->dest) || fetch_mkdirs_for(f->lock))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot make the cache's folders for %s: %s", f->name, f->dest,
                          strerror(errno));
    char part[PATH_MAX + 96];
    snprintf(part, sizeof part, "%s.incomplete", f->dest);
    int fd = open(f->lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644), arrived = 0;
    if (fd < 0)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot open the lock %s: %s", f->name, f->lock,
                          strerror(errno));
    int held = take_lock(c, f, fd, part, &arrived);
    llm_status st = held < 0 ? (arrived ? LLM_OK : c->err->code) : LLM_OK;
    if (held >= 0 && !in_place(c, f)) {
        if (!held) /* alone beside a stuck holder: a partial file of our own */
            fetch_tmp_name(f->dest, ".incomplete", part, sizeof part);
        st = transfer(c, f, part);
        if (st && !held)
            unlink(part);
    }
    close(fd); /* releases the lock */
    return st;
}
