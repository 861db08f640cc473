/* fetch.c - fetch_model and fetch_check: the context of one fetch (the
 * options and their environment defaults, the expected digests), and the
 * helpers every source shares: failure and log lines, progress, back-off,
 * names checked before they touch a path, temporary names. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <openssl/evp.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fetch_impl.h"
#include "llm/clock.h"
#include "llm/split_name.h"

#define MAX_BACKOFF_S 32

const char *fetch_reason_name(fetch_reason r)
{
    static const char *n[] = {"", "ModelNotFound", "ModelAccessDenied", "ModelChecksumMismatch", "ModelDownloadFailed"};
    return (unsigned)r < sizeof n / sizeof *n ? n[r] : "ModelDownloadFailed";
}

int fetch_is_remote(const char *uri)
{
    return !strncmp(uri, "hf://", 5) || !strncmp(uri, "s3://", 5) || !strncmp(uri, "https://", 8) ||
           !strncmp(uri, "http://", 7);
}

llm_status fetch_fail(fetch_ctx *c, fetch_reason why, llm_status st, const char *fmt, ...)
{
    char msg[LLM_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    c->why = why;
    return llm_errf(c->err, st, "%s", msg);
}

void fetch_log(fetch_ctx *c, const char *fmt, ...)
{
    char line[LLM_ERROR_MSG_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (c->o->log)
        c->o->log(c->o->ctx, line);
    else
        fprintf(stderr, "llm-fetch: %s\n", line);
}

int fetch_aborted(fetch_ctx *c)
{
    return c->o->abort && atomic_load(c->o->abort);
}

int fetch_sleep(fetch_ctx *c, long s)
{
    for (long ms = 0; ms < s * 1000; ms += 100) {
        if (fetch_aborted(c))
            return -1;
        usleep(100000);
    }
    return fetch_aborted(c) ? -1 : 0;
}

long fetch_backoff_s(int k, long retry_after)
{
    if (retry_after >= 0)
        return retry_after;
    long s = 1L << (k < 6 ? k - 1 : 5);
    return s > MAX_BACKOFF_S ? MAX_BACKOFF_S : s;
}

void fetch_hex(const unsigned char *d, unsigned int n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (unsigned int i = 0; i < n; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[2 * n] = 0;
}

int fetch_shown(const char *url)
{
    size_t n = strcspn(url, "?");
    return (int)(n < 200 ? n : 200);
}

int fetch_hex_ok(const char *s, size_t len)
{
    if (strlen(s) != len)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

llm_status fetch_file_sha256(const char *path, int nofollow, const _Atomic int *abort, char hex[FETCH_SHA256_HEX],
                             llm_error *err)
{
    enum { CHUNK = 1 << 22 };
    hex[0] = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC | (nofollow ? O_NOFOLLOW : 0));
    if (fd < 0)
        return llm_errf(err, LLM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    unsigned char *buf = malloc(CHUNK), dig[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    llm_status st = md && buf && EVP_DigestInit_ex(md, EVP_sha256(), NULL) ? LLM_OK
                    : llm_errf(err, LLM_ERR_NOMEM, "%s: cannot set up SHA-256", path);
    for (ssize_t r; !st && (r = read(fd, buf, CHUNK)) != 0;) {
        if (abort && atomic_load(abort))
            st = llm_errf(err, LLM_ERR_CANCELLED, "%s: the sha256 check was abandoned", path);
        else if (r < 0 && errno != EINTR)
            st = llm_errf(err, LLM_ERR_IO, "%s: read error while checking sha256: %s", path, strerror(errno));
        else if (r > 0 && !EVP_DigestUpdate(md, buf, (size_t)r))
            st = llm_errf(err, LLM_ERR_INTERNAL, "%s: SHA-256 update failed", path);
    }
    if (!st && (!EVP_DigestFinal_ex(md, dig, &n) || n != 32))
        st = llm_errf(err, LLM_ERR_INTERNAL, "%s: SHA-256 final failed", path);
    if (!st)
        fetch_hex(dig, n, hex);
    EVP_MD_CTX_free(md);
    free(buf);
    close(fd);
    return st;
}

int fetch_path_ok(const char *p)
{
    size_t n = strlen(p);
    if (!n || n >= FETCH_MAX_PATH || p[0] == '/')
        return 0;
    for (const char *s = p; *s;) {
        size_t seg = strcspn(s, "/");
        if (!seg || (seg == 1 && s[0] == '.') || (seg == 2 && s[0] == '.' && s[1] == '.'))
            return 0;
        for (size_t i = 0; i < seg; i++)
            if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f || s[i] == '\\')
                return 0;
        s += seg;
        if (*s == '/' && !*++s)
            return 0; /* a trailing slash: an empty last segment */
    }
    return 1;
}

int fetch_encode_path(char *dst, size_t n, const char *p)
{
    size_t o = 0;
    for (; *p; p++) {
        unsigned char ch = (unsigned char)*p;
        int keep = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') ||
                   strchr("-._~/", ch);
        if (o + 4 >= n)
            return -1;
        o += (size_t)(keep ? snprintf(dst + o, n - o, "%c", ch) : snprintf(dst + o, n - o, "%%%02X", ch));
    }
    dst[o] = 0;
    return 0;
}

int fetch_part_name(const char *name, int k, char *out, size_t n)
{
    if (llm_split_path(name, 1, NULL, 0))
        return llm_split_path(name, (uint32_t)k, out, n) ? 0 : -1;
    return snprintf(out, n, "%s", name) >= (int)n ? -1 : 0;
}

int fetch_mkdirs_for(const char *path)
{
    char d[PATH_MAX];
    if (snprintf(d, sizeof d, "%s", path) >= (int)sizeof d) {
        errno = ENAMETOOLONG;
        return -1;
    }
    char *last = strrchr(d, '/');
    if (!last || last == d)
        return 0;
    *last = 0;
    for (char *s = d + 1;; s++) {
        if (*s == '/' || !*s) {
            char keep = *s;
            *s = 0;
            if (mkdir(d, 0755) && errno != EEXIST)
                return -1;
            if (!(*s = keep))
                return 0;
        }
    }
}

void fetch_tmp_name(const char *path, const char *suffix, char *out, size_t n)
{
    static _Atomic unsigned long counter;
    snprintf(out, n, "%s.%ld.%lx.%lu%s", path, (long)getpid(), (unsigned long)pthread_self(),
             atomic_fetch_add(&counter, 1), suffix);
}

void fetch_report(fetch_ctx *c, const char *phase, uint64_t done_in_file, int force)
{
    double now = llm_clock_mono_s();
    if (!force && now - c->t_report < 0.5)
        return;
    uint64_t done = c->done_before + done_in_file;
    if (now - c->rate_t >= 2.0) { /* the rate over the last two seconds or more */
        if (c->rate_t > 0 && done >= c->rate_bytes)
            c->rate = (double)(done - c->rate_bytes) / (now - c->rate_t);
        c->rate_t = now;
        c->rate_bytes = done;
    }
    c->t_report = now;
    if (c->o->progress) {
        fetch_progress p = {phase, c->file ? c->file : "", c->part, c->n_parts, done, c->total, c->rate};
        c->o->progress(c->o->ctx, &p);
    }
}

/* ---- the expected digests ---------------------------------------------------------------------- */

/* o->sha256 into c->wants: 64 hex digits each (either case), comma-separated. */
static llm_status parse_wants(fetch_ctx *c, const char *list)
{
    for (const char *d = list; d && *d; c->n_wants++) {
        size_t len = strcspn(d, ",");
        if (c->n_wants == FETCH_MAX_PARTS || len != 64)
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "sha256: expected 64 hex digits per file, "
                              "comma-separated (at most %d)", FETCH_MAX_PARTS);
        for (size_t i = 0; i < 64; i++) c->wants[c->n_wants][i] = (char)(d[i] | (d[i] >= 'A' && d[i] <= 'F' ? 0x20 : 0));
        c->wants[c->n_wants][64] = 0;
        if (!fetch_hex_ok(c->wants[c->n_wants], 64))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "sha256: '%.64s' is not 64 hex digits", d);
        d += len + (d[len] == ',');
    }
    return LLM_OK;
}

const char *fetch_want(const fetch_ctx *c, int k)
{
    return k >= 1 && k <= c->n_wants ? c->wants[k - 1] : "";
}

llm_status fetch_wants_fit(fetch_ctx *c, const char *uri, int n_parts)
{
    if (c->n_wants && c->n_wants != n_parts)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: %d sha256 digest%s for %d file%s (a split "
                          "set: one per part, comma-separated in part order)", uri, c->n_wants,
                          c->n_wants > 1 ? "s" : "", n_parts, n_parts > 1 ? "s" : "");
    return LLM_OK;
}

/* ---- the context: options over the environment ------------------------------------------------- */

static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void pick(char *dst, size_t n, const char *opt, const char *env1, const char *env2, const char *dflt)
{
    const char *v = opt && *opt ? opt : env1 && env(env1) ? env(env1) : env2 && env(env2) ? env(env2) : dflt;
    snprintf(dst, n, "%s", v ? v : "");
}

/* A token from a file (HF_TOKEN_PATH, HF_HOME/token): its first line. */
static void token_file(char *dst, size_t n, const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    if (!fgets(dst, (int)n, f))
        dst[0] = 0;
    dst[strcspn(dst, "\r\n")] = 0;
    fclose(f);
}

void fetch_cache_dir(const fetch_options *o, char *out, size_t n)
{
    char dflt[PATH_MAX];
    if (env("HF_HOME"))
        snprintf(dflt, sizeof dflt, "%s/hub", env("HF_HOME"));
    else
        snprintf(dflt, sizeof dflt, "%s/.cache/huggingface/hub", env("HOME") ? env("HOME") : "/root");
    pick(out, n, o ? o->cache_dir : NULL, "HF_HUB_CACHE", NULL, dflt);
}

static void ctx_tokens(fetch_ctx *c)
{
    pick(c->hf_token, sizeof c->hf_token, c->o->hf_token, "HF_TOKEN", NULL, NULL);
    if (!c->hf_token[0]) {
        char tf[PATH_MAX];
        if (env("HF_TOKEN_PATH"))
            snprintf(tf, sizeof tf, "%s", env("HF_TOKEN_PATH"));
        else if (env("HF_HOME"))
            snprintf(tf, sizeof tf, "%s/token", env("HF_HOME"));
        else
            snprintf(tf, sizeof tf, "%s/.cache/huggingface/token", env("HOME") ? env("HOME") : "/root");
        token_file(c->hf_token, sizeof c->hf_token, tf);
    }
    pick(c->bearer, sizeof c->bearer, c->o->bearer_token, "LLM_FETCH_BEARER_TOKEN", NULL, NULL);
    if (!c->bearer[0] && env("LLM_FETCH_BEARER_TOKEN_FILE")) /* a mounted Secret */
        token_file(c->bearer, sizeof c->bearer, env("LLM_FETCH_BEARER_TOKEN_FILE"));
    const char *id = env("AWS_ACCESS_KEY_ID"), *secret = env("AWS_SECRET_ACCESS_KEY");
    if (id && secret)
        snprintf(c->s3_user, sizeof c->s3_user, "%s:%s", id, secret);
    pick(c->s3_session, sizeof c->s3_session, NULL, "AWS_SESSION_TOKEN", NULL, NULL);
}

/* A credential is a header's value: a control character in it would
 * start another header (its value is never named). */
static llm_status tokens_ok(fetch_ctx *c)
{
    const char *const vals[] = {c->hf_token, c->bearer, c->s3_user, c->s3_session};
    const char *const names[] = {"HF_TOKEN", "LLM_FETCH_BEARER_TOKEN", "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY",
                                 "AWS_SESSION_TOKEN"};
    for (size_t i = 0; i < sizeof vals / sizeof *vals; i++)
        for (const char *s = vals[i]; *s; s++)
            if ((unsigned char)*s < 0x20 || *s == 0x7f)
                return fetch_fail(c, FETCH_DENIED, LLM_ERR_INVALID_ARG, "%s has a control character", names[i]);
    return LLM_OK;
}

static llm_status ctx_init(fetch_ctx *c, const fetch_options *o, llm_error *err)
{
    static const fetch_options none;
    memset(c, 0, sizeof *c);
    c->o = o ? o : &none;
    c->err = err;
    fetch_cache_dir(c->o, c->cache, sizeof c->cache);
    pick(c->hf_endpoint, sizeof c->hf_endpoint, c->o->hf_endpoint, "HF_ENDPOINT", NULL, "https://huggingface.co");
    for (size_t e = strlen(c->hf_endpoint); e && c->hf_endpoint[e - 1] == '/';) c->hf_endpoint[--e] = 0;
    pick(c->s3_endpoint, sizeof c->s3_endpoint, c->o->s3_endpoint, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", NULL);
    pick(c->s3_region, sizeof c->s3_region, c->o->s3_region, "AWS_REGION", "AWS_DEFAULT_REGION", "us-east-1");
    ctx_tokens(c);
    c->stall_s = c->o->stall_s > 0 ? c->o->stall_s : 30;
    c->max_retries = c->o->max_retries > 0 ? c->o->max_retries : 6;
    c->lock_stale_s = c->o->lock_stale_s > 0 ? c->o->lock_stale_s : 120;
    llm_status st = parse_wants(c, c->o->sha256);
    if (!st)
        st = tokens_ok(c);
    if (!st && c->cache[0] != '/')
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "the cache folder '%s' is not an absolute path", c->cache);
    return st;
}

llm_status fetch_check(const char *uri, const fetch_options *o, llm_error *err)
{
    fetch_ctx *c = calloc(1, sizeof *c); /* a fetch_ctx is large for a stack */
    llm_error local;
    fetch_options ck = o ? *o : (fetch_options){0};
    ck.cache_dir = "/"; /* no folder is touched */
    if (!c)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory");
    llm_status st = ctx_init(c, &ck, err ? err : &local);
    if (!st && !strncmp(uri, "hf://", 5))
        st = fetch_hf_check(c, uri);
    else if (!st && fetch_is_remote(uri))
        st = fetch_url_check(c, uri);
    else if (!st)
        st = fetch_wants_fit(c, uri, llm_split_path(uri, 1, NULL, 0) ? llm_split_path(uri, 1, NULL, 0) : 1);
    free(c);
    return st;
}

llm_status fetch_model(const char *uri, const fetch_options *o, char *path, size_t n, fetch_reason *why,
                       llm_error *err)
{
    fetch_ctx *c = calloc(1, sizeof *c);
    llm_error local;
    if (!c)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory");
    llm_status st = ctx_init(c, o, err ? err : &local);
    if (!st && !fetch_is_remote(uri) && snprintf(path, n, "%s", uri) >= (int)n)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: path too long", uri);
    else if (!st && !strncmp(uri, "hf://", 5))
        st = fetch_hf_get(c, uri, path, n);
    else if (!st && fetch_is_remote(uri))
        st = fetch_url_get(c, uri, path, n);
    c->file = uri; /* the files' names were the sources' own, gone now */
    if (!st)
        fetch_report(c, "done", 0, 1);
    if (why)
        *why = st ? c->why : FETCH_OK;
    free(c);
    return st;
}
