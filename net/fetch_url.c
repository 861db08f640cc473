/* fetch_url.c - s3:// and https:// sources: the URL of each file (a split
 * set's parts beside the first), confined names, the cache folder keyed
 * by the source and its digests, and the files brought in one by one. */
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "fetch_impl.h"
#include "llm/split_name.h"

/* The URL of a file of the source (a key, or the path of an https URL). */
typedef struct url_src {
    fetch_auth auth;
    int s3;
    char base[2048];   /* the URL up to the folder of the file, with its trailing '/' */
    char query[2048];  /* "?..." of an https URL, or "" */
    char folder[2048]; /* the key's or path's folder, for the cache key */
    char name[FETCH_MAX_PATH]; /* the file's last segment */
} url_src;

static int bucket_ok(const char *b, size_t n)
{
    if (n < 3 || n > 63)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= '0' && b[i] <= '9') || b[i] == '-' || b[i] == '.'))
            return 0;
    return 1;
}

/* The folder and last segment of a checked path, each fitting its buffer. */
static int split_last(const char *p, size_t len, url_src *u)
{
    const char *last = memrchr(p, '/', len);
    size_t dir = last ? (size_t)(last - p + 1) : 0;
    return snprintf(u->folder, sizeof u->folder, "%.*s", (int)dir, p) >= (int)sizeof u->folder ||
                   snprintf(u->name, sizeof u->name, "%.*s", (int)(len - dir), p + dir) >= (int)sizeof u->name
               ? -1
               : 0;
}

static llm_status parse_s3(fetch_ctx *c, const char *uri, url_src *u)
{
    const char *b = uri + 5, *slash = strchr(b, '/');
    char enc[FETCH_MAX_PATH * 3];
    if (!slash || !bucket_ok(b, (size_t)(slash - b)) || !fetch_path_ok(slash + 1))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG,
                          "%.300s: not s3://BUCKET/KEY (a bucket of 3-63 of a-z 0-9 . -; a key of at most %d bytes "
                          "without empty, . or .. segments)", uri, FETCH_MAX_PATH - 1);
    if (split_last(slash + 1, strlen(slash + 1), u) || fetch_encode_path(enc, sizeof enc, u->folder))
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
    u->s3 = 1;
    return LLM_OK;
}

static llm_status parse_https(fetch_ctx *c, const char *uri, url_src *u)
{
    char host[512], p[FETCH_MAX_PATH];
    for (const char *s = uri; *s; s++)
        if ((unsigned char)*s <= 0x20 || (unsigned char)*s >= 0x7f)
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: a URL has no spaces, control or "
                              "non-ASCII characters (percent-encode them)", uri);
    const char *q = uri + strcspn(uri, "?#"), *path = strchr(uri + (uri[4] == 's' ? 8 : 7), '/');
    if (fetch_http_host(uri, host, sizeof host) || !path || path > q || (size_t)(q - uri) >= sizeof u->base ||
        strlen(q) >= sizeof u->query)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: not an http(s) URL with a host and a path "
                          "(at most %zu bytes)", uri, sizeof u->base - 1);
    if (snprintf(p, sizeof p, "%.*s", (int)(q - path - 1), path + 1) >= (int)sizeof p || !fetch_path_ok(p) ||
        strcasestr(p, "%2e") || strcasestr(p, "%2f") || split_last(p, strlen(p), u))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: the path is too long or has an empty, . or .. "
                          "segment (or an encoded one)", uri);
    snprintf(u->base, sizeof u->base, "%.*s", (int)(path + 1 + strlen(u->folder) - uri), uri);
    snprintf(u->folder, sizeof u->folder, "%s", u->base);
    snprintf(u->query, sizeof u->query, "%s", *q == '?' ? q : "");
    u->auth = FETCH_AUTH_BEARER;
    return LLM_OK;
}

static llm_status url_source(fetch_ctx *c, const char *uri, url_src *u)
{
    llm_status st = !strncmp(uri, "s3://", 5) ? parse_s3(c, uri, u) : parse_https(c, uri, u);
    if (!st && (!u->name[0] || !fetch_path_ok(u->name)))
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: no file name at the end", uri);
    int parts = st ? 0 : llm_split_path(u->name, 1, NULL, 0);
    if (!st && parts > FETCH_MAX_PARTS)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: over %d parts", uri, FETCH_MAX_PARTS);
    if (!st)
        c->n_parts = parts ? parts : 1;
    return st ? st : fetch_wants_fit(c, uri, c->n_parts);
}

llm_status fetch_url_check(fetch_ctx *c, const char *uri)
{
    url_src u;
    return url_source(c, uri, &u);
}

/* CACHE/urls/KEY: KEY the first 32 hex digits of sha256(source folder,
 * file name, expected digests), so another source or digest never shares
 * a file. */
static llm_status url_dir(fetch_ctx *c, const url_src *u, char *out, size_t n)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    char in[FETCH_MAX_PATH * 2 + 4096], hex[2 * EVP_MAX_MD_SIZE + 1];
    int len = snprintf(in, sizeof in, "%s\n%s\n", u->base, u->name); /* endpoint, bucket or host, folder */
    for (int k = 1; k <= c->n_wants && len < (int)sizeof in; k++)
        len += snprintf(in + len, sizeof in - (size_t)len, "%s,", c->wants[k - 1]);
    if (len >= (int)sizeof in || !EVP_Digest(in, (size_t)len, d, &dn, EVP_sha256(), NULL))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INTERNAL, "cannot key the cache folder of %.300s", u->name);
    fetch_hex(d, 16, hex);
    if (snprintf(out, n, "%s/urls/%s", c->cache, hex) >= (int)n)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: the cache path is too long", c->cache);
    return LLM_OK;
}

/* Part k's file: its URL, its place in dir, its lock, its digest. */
static llm_status url_file(fetch_ctx *c, const url_src *u, const char *dir, int k, fetch_file *f)
{
    char enc[FETCH_MAX_PATH * 3];
    memset(f, 0, sizeof *f);
    f->auth = u->auth;
    snprintf(f->want, sizeof f->want, "%s", fetch_want(c, k));
    f->verify_hit = f->want[0] != 0;
    if (fetch_part_name(u->name, k, f->name, sizeof f->name) || fetch_encode_path(enc, sizeof enc, f->name) ||
        snprintf(f->url, sizeof f->url, "%s%s%s", u->base, u->s3 ? enc : f->name, u->query) >= (int)sizeof f->url ||
        snprintf(f->dest, sizeof f->dest, "%s/%s", dir, f->name) >= (int)sizeof f->dest ||
        snprintf(f->lock, sizeof f->lock, "%s.lock", f->dest) >= (int)sizeof f->lock)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: a name is too long", u->name);
    return LLM_OK;
}

llm_status fetch_url_get(fetch_ctx *c, const char *uri, char *path, size_t n)
{
    url_src u;
    char dir[PATH_MAX];
    fetch_file f;
    llm_status st = url_source(c, uri, &u);
    if (!st)
        st = url_dir(c, &u, dir, sizeof dir);
    if (!st && !strncmp(uri, "http://", 7))
        fetch_log(c, "%.300s: plain http: the bytes are checked only against a given sha256", uri);
    for (int k = 1; k <= c->n_parts && !st; k++) {
        if ((st = url_file(c, &u, dir, k, &f)))
            break;
        c->file = f.name;
        c->part = k;
        c->total = 0; /* known from each answer */
        st = fetch_xfer_get(c, &f);
        if (!st && k == 1 && snprintf(path, n, "%s", f.dest) >= (int)n)
            st = fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: path too long", f.dest);
        struct stat sb;
        if (!st && !stat(f.dest, &sb))
            c->done_before += (uint64_t)sb.st_size;
    }
    c->file = NULL; /* f was this function's */
    return st;
}
