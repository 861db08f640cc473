/* fetch.c - fetch_model: the options and their environment defaults, the
 * cache folder, names checked before they touch a path, progress, and
 * the s3:// and https:// sources (hf:// is fetch_hf.c's). */
#include <errno.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fetch_impl.h"
#include "llm/clock.h"
#include "llm/split_name.h"

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

int fetch_hex_ok(const char *s, size_t len)
{
    if (strlen(s) != len)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
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
    for (char *s = d + 1; ; s++) {
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

/* ---- options --------------------------------------------------------------------------------- */

static void pick(char *dst, size_t n, const char *opt, const char *env1, const char *env2, const char *dflt)
{
    const char *v = opt && *opt ? opt : env1 && getenv(env1) && *getenv(env1) ? getenv(env1)
                                       : env2 && getenv(env2) && *getenv(env2) ? getenv(env2) : dflt;
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

static llm_status ctx_init(fetch_ctx *c, const fetch_options *o, llm_error *err)
{
    static const fetch_options none;
    memset(c, 0, sizeof *c);
    c->o = o ? o : &none;
    c->err = err;
    o = c->o;
    const char *home = getenv("HOME") && *getenv("HOME") ? getenv("HOME") : "/root";
    char dflt[PATH_MAX];
    if (getenv("HF_HOME") && *getenv("HF_HOME"))
        snprintf(dflt, sizeof dflt, "%s/hub", getenv("HF_HOME"));
    else
        snprintf(dflt, sizeof dflt, "%s/.cache/huggingface/hub", home);
    pick(c->cache, sizeof c->cache, o->cache_dir, "HF_HUB_CACHE", NULL, dflt);
    pick(c->hf_endpoint, sizeof c->hf_endpoint, o->hf_endpoint, "HF_ENDPOINT", NULL, "https://huggingface.co");
    size_t e = strlen(c->hf_endpoint);
    while (e && c->hf_endpoint[e - 1] == '/') c->hf_endpoint[--e] = 0;
    pick(c->hf_token, sizeof c->hf_token, o->hf_token, "HF_TOKEN", NULL, NULL);
    if (!c->hf_token[0]) {
        char tf[PATH_MAX];
        if (getenv("HF_TOKEN_PATH") && *getenv("HF_TOKEN_PATH"))
            snprintf(tf, sizeof tf, "%s", getenv("HF_TOKEN_PATH"));
        else if (getenv("HF_HOME") && *getenv("HF_HOME"))
            snprintf(tf, sizeof tf, "%s/token", getenv("HF_HOME"));
        else
            snprintf(tf, sizeof tf, "%s/.cache/huggingface/token", home);
        token_file(c->hf_token, sizeof c->hf_token, tf);
    }
    pick(c->bearer, sizeof c->bearer, o->bearer_token, "LLM_FETCH_BEARER_TOKEN", NULL, NULL);
    pick(c->s3_endpoint, sizeof c->s3_endpoint, o->s3_endpoint, "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", NULL);
    pick(c->s3_region, sizeof c->s3_region, o->s3_region, "AWS_REGION", "AWS_DEFAULT_REGION", "us-east-1");
    const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
    if (id && *id && secret && *secret)
        snprintf(c->s3_user, sizeof c->s3_user, "%s:%s", id, secret);
    pick(c->s3_session, sizeof c->s3_session, NULL, "AWS_SESSION_TOKEN", NULL, NULL);
    c->stall_s = o->stall_s > 0 ? o->stall_s : 30;
    c->max_retries = o->max_retries > 0 ? o->max_retries : 6;
    c->lock_stale_s = o->lock_stale_s > 0 ? o->lock_stale_s : 120;
    if (o->sha256 && *o->sha256 && !fetch_hex_ok(o->sha256, 64)) {
        char low[65] = "";
        for (int i = 0; i < 64 && o->sha256[i]; i++) low[i] = (char)(o->sha256[i] | 0x20);
        if (!fetch_hex_ok(low, 64))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "sha256: expected 64 hex digits");
    }
    if (!c->cache[0] || c->cache[0] != '/')
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "the cache folder '%s' is not an absolute path",
                          c->cache);
    return LLM_OK;
}

/* ---- s3:// and https:// ---------------------------------------------------------------------- */

/* A URL's path segment, percent-encoded (unreserved characters kept). */
static int encode_path(char *dst, size_t n, const char *p)
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

static int bucket_ok(const char *b, size_t n)
{
    if (n < 3 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' || b[i] == '.'))
            return 0;
    return 1;
}

/* The URL of name (a key, or the path of an https URL) in the source. */
typedef struct url_src {
    fetch_auth auth;
    char base[2048];   /* the URL up to the folder of the file, with its trailing '/' */
    char query[2048];  /* "?..." of an https URL, or "" */
    char folder[2048]; /* the key's or path's folder, for the cache key */
    char name[256];    /* the file's last segment */
} url_src;

static llm_status parse_s3(fetch_ctx *c, const char *uri, url_src *u)
{
    const char *b = uri + 5, *slash = strchr(b, '/');
    if (!slash || !bucket_ok(b, (size_t)(slash - b)) || !fetch_path_ok(slash + 1))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG,
                          "%.300s: not s3://BUCKET/KEY (a bucket of 3-63 of a-z 0-9 . -; a key without empty, . or .. "
                          "segments)", uri);
    const char *key = slash + 1, *last = strrchr(key, '/');
    char enc[FETCH_MAX_PATH * 3];
    snprintf(u->folder, sizeof u->folder, "%.*s", last ? (int)(last - key + 1) : 0, key);
    snprintf(u->name, sizeof u->name, "%s", last ? last + 1 : key);
    if (encode_path(enc, sizeof enc, u->folder))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: key too long", uri);
    int w = c->s3_endpoint[0]
                ? snprintf(u->base, sizeof u->base, "%s%s%.*s/%s", c->s3_endpoint,
                           c->s3_endpoint[strlen(c->s3_endpoint) - 1] == '/' ? "" : "/", (int)(slash - b), b, enc)
                : snprintf(u->base, sizeof u->base, "https://%.*s.s3.%s.amazonaws.com/%s", (int)(slash - b), b,
                           c->s3_region, enc);
    if (w >= (int)sizeof u->base)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: URL too long", uri);
    if (strncmp(u->base, "https://", 8) && strncmp(u->base, "http://", 7))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "S3 endpoint %.200s: not an http(s) URL", c->s3_endpoint);
    u->auth = FETCH_AUTH_S3;
    return LLM_OK;
}

static llm_status parse_https(fetch_ctx *c, const char *uri, url_src *u)
{
    char host[512];
    const char *q = uri + strcspn(uri, "?#");
    size_t plen = (size_t)(q - uri);
    const char *path = strchr(uri + (uri[4] == 's' ? 8 : 7), '/');
    if (fetch_url_host(uri, host, sizeof host) || !path || path > q || plen >= sizeof u->base ||
        strlen(q) >= sizeof u->query)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: not an http(s) URL with a host and a path", uri);
    for (const char *s = uri; *s; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f)
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: a URL has no spaces, control or "
                              "non-ASCII characters (percent-encode them)", uri);
    char p[FETCH_MAX_PATH];
    snprintf(p, sizeof p, "%.*s", (int)(q - path - 1), path + 1);
    if (!fetch_path_ok(p) || strstr(p, "%2e") || strstr(p, "%2E") || strstr(p, "%2f") || strstr(p, "%2F"))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: the path has an empty, . or .. segment "
                          "(or an encoded one)", uri);
    const char *last = strrchr(path, '/');
    snprintf(u->base, sizeof u->base, "%.*s", (int)(last - uri + 1), uri);
    snprintf(u->folder, sizeof u->folder, "%s", u->base);
    snprintf(u->name, sizeof u->name, "%.*s", (int)(q - last - 1), last + 1);
    snprintf(u->query, sizeof u->query, "%s", *q == '?' ? q : "");
    if (!strncmp(uri, "http://", 7))
        fprintf(stderr, "llm-fetch: %.300s: plain http: the bytes are checked only against a given sha256\n", uri);
    u->auth = FETCH_AUTH_BEARER;
    return LLM_OK;
}

/* CACHE/urls/KEY: KEY the first 32 hex digits of sha256(source folder,
 * file name, expected digest), so another source or digest never shares
 * a file. */
static int url_dir(fetch_ctx *c, const char *uri_folder, const char *name, char *out, size_t n)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    char in[4400], hex[65] = "";
    int len = snprintf(in, sizeof in, "%s\n%s\n%s", uri_folder, name, c->o->sha256 ? c->o->sha256 : "");
    EVP_Digest(in, (size_t)(len < (int)sizeof in ? len : (int)sizeof in - 1), d, &dn, EVP_sha256(), NULL);
    for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", d[i]);
    return snprintf(out, n, "%s/urls/%s", c->cache, hex) >= (int)n ? -1 : 0;
}

static llm_status url_source(fetch_ctx *c, const char *uri, int s3, url_src *u)
{
    llm_status st = s3 ? parse_s3(c, uri, u) : parse_https(c, uri, u);
    if (!st && (!u->name[0] || !fetch_path_ok(u->name)))
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: no file name at the end", uri);
    return st;
}

static llm_status fetch_url(fetch_ctx *c, const char *uri, int s3, char *path, size_t n)
{
    url_src u;
    llm_status st = url_source(c, uri, s3, &u);
    if (st)
        return st;
    int parts = llm_split_path(u.name, 1, NULL, 0);
    c->n_parts = parts ? parts : 1;
    char dir[PATH_MAX];
    if (url_dir(c, u.folder, u.name, dir, sizeof dir))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: the cache path is too long", c->cache);
    for (int k = 1; k <= c->n_parts && !st; k++) {
        fetch_file f = {.auth = u.auth};
        char enc[1024];
        if (parts)
            llm_split_path(u.name, (uint32_t)k, f.name, sizeof f.name);
        else
            snprintf(f.name, sizeof f.name, "%s", u.name);
        if (k == 1 && parts && (c->o->sha256 && *c->o->sha256))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: a split set has one digest per part; "
                              "a single sha256 cannot check it", uri);
        snprintf(f.want, sizeof f.want, "%s", c->o->sha256 ? c->o->sha256 : "");
        if (encode_path(enc, sizeof enc, f.name) ||
            snprintf(f.url, sizeof f.url, "%s%s%s", u.base, s3 ? enc : f.name, u.query) >= (int)sizeof f.url ||
            snprintf(f.dest, sizeof f.dest, "%s/%s", dir, f.name) >= (int)sizeof f.dest ||
            snprintf(f.lock, sizeof f.lock, "%s.lock", f.dest) >= (int)sizeof f.lock)
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: name too long", uri);
        c->file = f.name;
        c->part = k;
        c->total = 0;
        st = fetch_file_get(c, &f);
        if (!st && k == 1 && snprintf(path, n, "%s", f.dest) >= (int)n)
            st = fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: path too long", f.dest);
        struct stat sb;
        if (!st && !stat(f.dest, &sb))
            c->done_before += (uint64_t)sb.st_size;
    }
    return st;
}

llm_status fetch_check(const char *uri, llm_error *err)
{
    fetch_ctx c;
    llm_error local;
    url_src u;
    fetch_options o = {.cache_dir = "/"}; /* no folder is touched */
    llm_status st = ctx_init(&c, &o, err ? err : &local);
    if (!st && !strncmp(uri, "hf://", 5))
        st = fetch_hf_check(&c, uri);
    else if (!st && fetch_is_remote(uri))
        st = url_source(&c, uri, !strncmp(uri, "s3://", 5), &u);
    return st;
}

llm_status fetch_model(const char *uri, const fetch_options *o, char *path, size_t n, fetch_reason *why,
                       llm_error *err)
{
    fetch_ctx c;
    llm_error local;
    llm_status st = ctx_init(&c, o, err ? err : &local);
    if (!st && !fetch_is_remote(uri) && snprintf(path, n, "%s", uri) >= (int)n)
        st = fetch_fail(&c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: path too long", uri);
    else if (!st && !strncmp(uri, "hf://", 5))
        st = fetch_hf(&c, uri, path, n);
    else if (!st && fetch_is_remote(uri))
        st = fetch_url(&c, uri, !strncmp(uri, "s3://", 5), path, n);
    c.file = uri; /* the files' names were the sources' own, gone now */
    if (!st)
        fetch_report(&c, "done", 0, 1);
    if (why)
        *why = st ? c.why : FETCH_OK;
    return st;
}
