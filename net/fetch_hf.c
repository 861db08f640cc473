/* fetch_hf.c - hf:// sources: the reference parsed, QUANT chosen from the
 * repository's file list, each file resolved (commit, sha256, size, where
 * its bytes are), brought into huggingface_hub's cache layout, and its
 * snapshot link and ref written. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fetch_impl.h"
#include "llm/json.h"
#include "llm/split_name.h"

/* a file list page: the hub sends ~1000 entries of ~250 bytes; read in
 * place, one page at a time, so its bytes are all it costs */
#define LIST_MAX ((size_t)4 << 20)
#define LIST_PAGES 50

typedef struct hf_ref {
    char org[96], repo[96], rev[128], path[FETCH_MAX_PATH], quant[64];
    char dir[PATH_MAX]; /* CACHE/models--ORG--REPO */
} hf_ref;

static int name_ok(const char *s, size_t n, size_t max)
{
    if (!n || n >= max || s[0] == '.' || s[0] == '-')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("._-", s[i]))
            return 0;
    return !memmem(s, n, "--", 2) && !memmem(s, n, "..", 2);
}

static llm_status hf_parse(fetch_ctx *c, const char *uri, hf_ref *r)
{
    const char *s = uri + 5, *slash = strchr(s, '/'), *at = strrchr(s, '@');
    memset(r, 0, sizeof *r);
    snprintf(r->rev, sizeof r->rev, "main");
    if (at && slash && at > slash) {
        if (!name_ok(at + 1, strlen(at + 1), sizeof r->rev))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: revision '%.100s' is not a branch, tag "
                              "or commit name (letters, digits, . _ -)", uri, at + 1);
        snprintf(r->rev, sizeof r->rev, "%s", at + 1);
    }
    size_t end = at && slash && at > slash ? (size_t)(at - s) : strlen(s);
    const char *rest = slash ? slash + 1 : NULL;
    size_t rlen = rest ? end - (size_t)(rest - s) : 0;
    size_t repo_len = rest ? strcspn(rest, "/:") : 0;
    if (!slash || !name_ok(s, (size_t)(slash - s), sizeof r->org) || repo_len > rlen ||
        !name_ok(rest, repo_len, sizeof r->repo))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG,
                          "%.300s: not hf://ORG/REPO/PATH.gguf[@REV] or hf://ORG/REPO:QUANT[@REV]", uri);
    snprintf(r->org, sizeof r->org, "%.*s", (int)(slash - s), s);
    snprintf(r->repo, sizeof r->repo, "%.*s", (int)repo_len, rest);
    const char *tail = rest + repo_len;
    size_t tlen = rlen - repo_len;
    if (tlen > 1 && *tail == ':' && name_ok(tail + 1, tlen - 1, sizeof r->quant))
        snprintf(r->quant, sizeof r->quant, "%.*s", (int)tlen - 1, tail + 1);
    else if (tlen > 1 && *tail == '/' && tlen - 1 < sizeof r->path) {
        snprintf(r->path, sizeof r->path, "%.*s", (int)tlen - 1, tail + 1);
        if (!fetch_path_ok(r->path))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: the path has an empty, . or .. segment",
                              uri);
    } else
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: name a file (hf://ORG/REPO/PATH.gguf) or a "
                          "quantization (hf://ORG/REPO:Q4_K_M)", uri);
    if (snprintf(r->dir, sizeof r->dir, "%s/models--%s--%s", c->cache, r->org, r->repo) >= (int)sizeof r->dir)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: the cache path is too long", c->cache);
    return LLM_OK;
}

/* An answer from the hub's API host that is not 2xx, as a reason. */
static llm_status hub_error(fetch_ctx *c, const hf_ref *r, const char *what, const fetch_resp *a)
{
    const char *ec = a->error_code;
    if (!strcmp(ec, "GatedRepo") || a->code == 403)
        return fetch_fail(c, FETCH_DENIED, LLM_ERR_INVALID_ARG, "%s/%s: access denied (HTTP %ld %s): the repository "
                          "is gated or private; %s", r->org, r->repo, a->code, ec,
                          c->hf_token[0] ? "the token given (HF_TOKEN) is not allowed to read it"
                                         : "set HF_TOKEN to a token allowed to read it");
    if (!strcmp(ec, "RepoNotFound") || !strcmp(ec, "RepositoryNotFound"))
        return fetch_fail(c, FETCH_NOT_FOUND, LLM_ERR_NOT_FOUND, "%s/%s: no such repository at %s (or a private one: "
                          "HF_TOKEN)", r->org, r->repo, c->hf_endpoint);
    if (!strcmp(ec, "RevisionNotFound"))
        return fetch_fail(c, FETCH_NOT_FOUND, LLM_ERR_NOT_FOUND, "%s/%s: no revision '%s'", r->org, r->repo, r->rev);
    if (a->code == 404)
        return fetch_fail(c, FETCH_NOT_FOUND, LLM_ERR_NOT_FOUND, "%s/%s: %s not found at revision %s", r->org, r->repo,
                          what, r->rev);
    if (a->code == 401)
        return fetch_fail(c, FETCH_DENIED, LLM_ERR_INVALID_ARG, "%s/%s: HTTP 401 %s: %s", r->org, r->repo, ec,
                          c->hf_token[0] ? "the token is not accepted" : "set HF_TOKEN");
    return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s/%s: %s: HTTP %ld %s", r->org, r->repo, what, a->code, ec);
}

/* A GET or HEAD of the API host with the token, retrying 429/5xx and
 * transport errors a few times; LLM_OK with a non-error answer in *a. */
static llm_status hub_call(fetch_ctx *c, const hf_ref *r, const char *url, const char *what, int head, char **body,
                           fetch_resp *a)
{
    for (int k = 1;; k++) {
        c->no_answer = 0;
        llm_status st = fetch_http_request(c, url, FETCH_AUTH_HF, head, LIST_MAX, body, a);
        if (st == LLM_ERR_CANCELLED)
            return st;
        if (!st && a->code < 400 && a->code != 0)
            return LLM_OK;
        int retry = st == LLM_ERR_IO || (!st && (a->code == 429 || a->code >= 500));
        if (!st && !retry) {
            if (body) {
                free(*body);
                *body = NULL;
            }
            return hub_error(c, r, what, a);
        }
        if (!st)
            fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s/%s: %s: HTTP %ld", r->org, r->repo, what, a->code);
        if (body) {
            free(*body);
            *body = NULL;
        }
        if (!retry || k > c->max_retries)
            return c->err->code ? c->err->code : LLM_ERR_IO;
        long wait = fetch_backoff_s(k, !st ? a->retry_after : -1);
        fetch_log(c, "%s; retrying in %ld s", c->err->msg, wait);
        if (fetch_sleep(c, wait))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_CANCELLED, "%s/%s: abandoned", r->org, r->repo);
    }
}

/* ---- QUANT: which .gguf of the file list ------------------------------------------------------- */

/* q appears in name's last segment as a whole token (Q4_K does not match Q4_K_M). */
static int carries_quant(const char *name, const char *q)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    size_t n = strlen(base), qn = strlen(q);
    if (n < 5 || strcasecmp(base + n - 5, ".gguf") || strcasestr(base, "mmproj"))
        return 0;
    for (const char *p = base; (p = strcasestr(p, q)); p++) {
        int before = p == base || !isalnum((unsigned char)p[-1]);
        int after = !isalnum((unsigned char)p[qn]) && p[qn] != '_';
        if (before && after)
            return 1;
    }
    return 0;
}

/* The choice so far: one file, or one split set (named by its first part). */
typedef struct quant_pick { char first[FETCH_MAX_PATH]; char others[1024]; int n; } quant_pick;

/* s after the list in buf[cap] (", " between), when it fits whole; else
 * the list stays as it is (it names files in a message). */
static void list_add(char *buf, size_t cap, const char *s)
{
    size_t bl = strlen(buf), sl = strlen(s);
    if (bl + sl + 3 > cap)
        return;
    if (bl)
        memcpy(buf + bl, ", ", 2), bl += 2;
    memcpy(buf + bl, s, sl + 1);
}

static void consider(quant_pick *q, const char *path)
{
    char first[FETCH_MAX_PATH];
    if (!llm_split_path(path, 1, first, sizeof first))
        snprintf(first, sizeof first, "%.*s", (int)sizeof first - 1, path);
    if (q->n && !strcmp(first, q->first))
        return;
    if (!q->n)
        memcpy(q->first, first, sizeof first);
    else
        list_add(q->others, sizeof q->others, first);
    q->n++;
}

/* One page of the file list, walked in place (llm_json_item/member): a
 * hostile hub's page costs no memory beyond its bytes, where a jansson
 * tree of `[{},{},...]` takes ~75 bytes per byte. */
static llm_status list_page(fetch_ctx *c, const hf_ref *r, const char *body, quant_pick *q, char *seen, size_t seen_n)
{
    llm_error jerr = {0};
    size_t n = strlen(body), end = 0, pos = 0;
    while (n && strchr(" \t\r\n", body[n - 1]))
        n--;
    llm_json_span arr = {body, n}, e, v;
    while (arr.n && strchr(" \t\r\n", *arr.p))
        arr.p++, arr.n--;
    if (!arr.n || *arr.p != '[' || llm_json_scan(arr.p, arr.n, LLM_JSON_MAX_DEPTH, &end, &jerr) || end != arr.n)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s/%s: the file list is not a JSON array%s%s", r->org,
                          r->repo, jerr.msg[0] ? ": " : "", jerr.msg);
    while (llm_json_item(arr, &pos, &e)) {
        /* room past the longest path: a longer one is cut (at a whole
         * UTF-8 character) to at least FETCH_MAX_PATH bytes, and refused */
        char p[FETCH_MAX_PATH + 4], t[16] = "file";
        long len = llm_json_member(e, "path", &v) ? llm_json_string(v, p, sizeof p) : -1;
        if (len < 0 || (size_t)len >= FETCH_MAX_PATH || strlen(p) != (size_t)len) /* cut, or a \u0000 inside */
            continue;
        if (llm_json_member(e, "type", &v) && llm_json_string(v, t, sizeof t) >= 0 && strcmp(t, "file"))
            continue;
        if (!fetch_path_ok(p))
            continue;
        if (len > 5 && !strcasecmp(p + len - 5, ".gguf"))
            list_add(seen, seen_n, p);
        if (carries_quant(p, r->quant))
            consider(q, p);
    }
    return LLM_OK;
}

static llm_status choose_quant(fetch_ctx *c, hf_ref *r)
{
    char url[4096], seen[1024] = "";
    quant_pick q = {0};
    c->file = "the file list";
    c->part = c->n_parts = 1;
    snprintf(url, sizeof url, "%s/api/models/%s/%s/tree/%s?recursive=true", c->hf_endpoint, r->org, r->repo, r->rev);
    fetch_report(c, "resolving", 0, 1);
    for (int page = 0; url[0]; page++) {
        char *body = NULL;
        fetch_resp a;
        if (page == LIST_PAGES)
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_TOO_LONG, "%s/%s: the file list has over %d pages", r->org,
                              r->repo, LIST_PAGES);
        llm_status st = hub_call(c, r, url, "file list", 0, &body, &a);
        if (!st)
            st = list_page(c, r, body, &q, seen, sizeof seen);
        free(body);
        if (st)
            return st;
        size_t ep = strlen(c->hf_endpoint);
        url[0] = 0; /* the next page only from the endpoint itself, scheme and all: it gets the token */
        if (a.next[0] && !strncmp(a.next, c->hf_endpoint, ep) && a.next[ep] == '/')
            snprintf(url, sizeof url, "%s", a.next);
    }
    if (q.n == 0)
        return fetch_fail(c, FETCH_NOT_FOUND, LLM_ERR_NOT_FOUND, "%s/%s: no .gguf file carries '%s' at revision %s "
                          "(the .gguf files: %s)", r->org, r->repo, r->quant, r->rev, seen[0] ? seen : "none");
    if (q.n > 1)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s/%s: '%s' names %d files: %s, %s; name one with "
                          "hf://%s/%s/PATH", r->org, r->repo, r->quant, q.n, q.first, q.others, r->org, r->repo);
    snprintf(r->path, sizeof r->path, "%s", q.first);
    return LLM_OK;
}

/* ---- one file ---------------------------------------------------------------------------------- */

/* An ETag's value: quotes and a weak prefix off; a blob name only if hex. */
static void etag_value(const char *in, char *out, size_t n)
{
    if (!strncmp(in, "W/", 2))
        in += 2;
    size_t len = strlen(in);
    if (len >= 2 && in[0] == '"' && in[len - 1] == '"')
        in++, len -= 2;
    snprintf(out, n, "%.*s", (int)(len < n - 1 ? len : n - 1), in);
}

/* HEADs path's resolve URL (following same-host redirects with the
 * token) and fills f: where the bytes are, the commit, sha256 or git oid,
 * size. */
static llm_status resolve(fetch_ctx *c, const hf_ref *r, const char *rev, const char *path, fetch_file *f,
                          char commit[48])
{
    char url[4096], host[512], api_host[512], etag[80], enc[FETCH_MAX_PATH * 3];
    fetch_resp a;
    if (fetch_encode_path(enc, sizeof enc, path) ||
        snprintf(url, sizeof url, "%s/%s/%s/resolve/%s/%s", c->hf_endpoint, r->org, r->repo, rev, enc) >=
            (int)sizeof url || fetch_http_host(c->hf_endpoint, api_host, sizeof api_host))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: the URL is too long or the endpoint %s is not "
                          "an http(s) URL", path, c->hf_endpoint);
    for (int hop = 0;; hop++) {
        llm_status st = hub_call(c, r, url, path, 1, NULL, &a);
        if (st)
            return st;
        if (a.code < 300 || a.code >= 400 || !a.location[0])
            break;
        if (hop == FETCH_MAX_REDIRECTS)
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s: more than %d redirects", path, FETCH_MAX_REDIRECTS);
        if (fetch_http_redirect_ok(c, url, a.location, sizeof a.location))
            return c->err->code;
        fetch_http_host(a.location, host, sizeof host);
        if (strcmp(host, api_host)) { /* the CDN: the bytes are there, the token is not sent */
            snprintf(f->url, sizeof f->url, "%s", a.location);
            f->auth = FETCH_AUTH_NONE;
            break;
        }
        snprintf(url, sizeof url, "%s", a.location);
    }
    if (!f->url[0]) {
        snprintf(f->url, sizeof f->url, "%s", url);
        f->auth = FETCH_AUTH_HF;
    }
    etag_value(a.linked_etag[0] ? a.linked_etag : a.etag, etag, sizeof etag);
    snprintf(commit, 48, "%s", a.commit);
    if (!fetch_hex_ok(commit, 40) || !(fetch_hex_ok(etag, 64) || fetch_hex_ok(etag, 40)))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s/%s/%s: the hub's answer lacks a commit (X-Repo-Commit "
                          "'%.48s') or an ETag ('%.80s') of hex digits", r->org, r->repo, path, commit, etag);
    f->size = a.has_linked_size ? a.linked_size : a.has_length ? a.length : 0;
    if (fetch_hex_ok(etag, 64))
        snprintf(f->want, sizeof f->want, "%.64s", etag);
    else if (!c->n_wants) /* a git object id: nothing this side could check the bytes against */
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_FORMAT, "%s/%s/%s: the hub gives no sha256 for it (not an LFS "
                          "file): give its sha256 to fetch it", r->org, r->repo, path);
    snprintf(f->name, sizeof f->name, "%s", path);
    if (snprintf(f->dest, sizeof f->dest, "%s/blobs/%s", r->dir, etag) >= (int)sizeof f->dest ||
        snprintf(f->lock, sizeof f->lock, "%s/.locks/models--%s--%s/%s.lock", c->cache, r->org, r->repo, etag) >=
            (int)sizeof f->lock)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: the cache path is too long", c->cache);
    return LLM_OK;
}

/* Writes content to path through a temporary file and a rename. */
static int write_atomic(const char *path, const char *content, int symlink_to)
{
    char tmp[PATH_MAX + 96];
    fetch_tmp_name(path, ".tmp", tmp, sizeof tmp);
    if (fetch_mkdirs_for(path))
        return -1;
    if (symlink_to) {
        if (symlink(content, tmp))
            return -1;
    } else {
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        size_t len = strlen(content);
        if (fd < 0)
            return -1;
        int bad = write(fd, content, len) != (ssize_t)len;
        if (close(fd) || bad) {
            unlink(tmp);
            return -1;
        }
    }
    if (rename(tmp, path)) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* snapshots/COMMIT/PATH -> ../../blobs/ETAG (one more ../ per folder in
 * PATH), and refs/REV when REV is a name. */
static llm_status link_snapshot(fetch_ctx *c, const hf_ref *r, const char *commit, const fetch_file *f, char *out,
                                size_t n)
{
    char ptr[PATH_MAX], target[PATH_MAX] = "";
    if (snprintf(ptr, sizeof ptr, "%s/snapshots/%s/%s", r->dir, commit, f->name) >= (int)sizeof ptr)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: the cache path is too long", f->name);
    size_t t = 0;
    for (const char *s = f->name; (s = strchr(s, '/')) && t + 3 < sizeof target; s++) t += (size_t)snprintf(target + t, 4, "../");
    snprintf(target + t, sizeof target - t, "../../blobs/%s", strrchr(f->dest, '/') + 1);
    char have[PATH_MAX];
    ssize_t len = readlink(ptr, have, sizeof have - 1);
    if ((len < 0 || (size_t)len != strlen(target) || memcmp(have, target, (size_t)len)) && write_atomic(ptr, target, 1))
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "%s: cannot link %s: %s", f->name, ptr, strerror(errno));
    if (strcmp(r->rev, commit)) {
        char ref[PATH_MAX + 160];
        snprintf(ref, sizeof ref, "%s/refs/%s", r->dir, r->rev);
        if (write_atomic(ref, commit, 0))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_IO, "cannot write %s: %s", ref, strerror(errno));
    }
    if (out && snprintf(out, n, "%s", ptr) >= (int)n)
        return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%s: path too long", ptr);
    return LLM_OK;
}

/* No answer from the hub at all (the network is down): the snapshot REV
 * names in the cache, if it holds every file, each a link into blobs/ and,
 * where the caller gave digests, to the blob of that digest (huggingface_hub
 * does the same offline, without the digests). */
static int cached_snapshot(fetch_ctx *c, const hf_ref *r, char *out, size_t n)
{
    char ref[PATH_MAX + 160], commit[48] = "", p[PATH_MAX + FETCH_MAX_PATH], link[PATH_MAX];
    snprintf(ref, sizeof ref, "%s/refs/%s", r->dir, r->rev);
    FILE *f = fopen(ref, "r");
    if (f) {
        if (!fgets(commit, sizeof commit, f))
            commit[0] = 0;
        fclose(f);
    } else
        snprintf(commit, sizeof commit, "%.47s", r->rev);
    if (!fetch_hex_ok(commit, 40))
        return -1;
    for (int k = 1; k <= c->n_parts; k++) {
        char name[FETCH_MAX_PATH];
        struct stat sb;
        ssize_t len;
        if (fetch_part_name(r->path, k, name, sizeof name) ||
            snprintf(p, sizeof p, "%s/snapshots/%s/%s", r->dir, commit, name) >= (int)sizeof p || stat(p, &sb) ||
            !S_ISREG(sb.st_mode) || (len = readlink(p, link, sizeof link - 1)) < 0)
            return -1;
        link[len] = 0;
        const char *blob = strstr(link, "blobs/");
        if (!blob || !fetch_hex_ok(blob + 6, 64) || (fetch_want(c, k)[0] && strcmp(blob + 6, fetch_want(c, k))))
            return -1;
        char hex[FETCH_SHA256_HEX];
        llm_error e = {0};
        if (c->o->verify_cached && (fetch_file_sha256(p, 0, c->o->abort, hex, &e) || strcmp(hex, blob + 6)))
            return -1; /* a blob is its name's bytes, or not used */
        if (k == 1 && snprintf(out, n, "%s", p) >= (int)n)
            return -1;
    }
    fetch_log(c, "%s (%s); using the cached snapshot %s", c->err->msg, c->hf_endpoint, commit);
    return 0;
}

llm_status fetch_hf_check(fetch_ctx *c, const char *uri)
{
    hf_ref r;
    llm_status st = hf_parse(c, uri, &r);
    int parts = st || r.quant[0] ? 0 : llm_split_path(r.path, 1, NULL, 0);
    if (!st && parts > FETCH_MAX_PARTS)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: over %d parts", uri, FETCH_MAX_PARTS);
    if (!st && !r.quant[0]) /* a QUANT's part count is known from the file list only */
        st = fetch_wants_fit(c, uri, parts ? parts : 1);
    return st;
}

/* Resolves every part, each at the commit the first resolved to (a push
 * meanwhile cannot mix two revisions); the caller's digests must be the
 * hub's. commit: the snapshot's. */
static llm_status resolve_all(fetch_ctx *c, const hf_ref *r, fetch_file *files, char commit[48])
{
    llm_status st = fetch_wants_fit(c, r->path, c->n_parts);
    for (int k = 1; k <= c->n_parts && !st; k++) {
        char name[FETCH_MAX_PATH], got[48] = "";
        if (fetch_part_name(r->path, k, name, sizeof name))
            return fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: name too long", r->path);
        c->file = name;
        c->part = k;
        fetch_report(c, "resolving", 0, 1);
        st = resolve(c, r, k == 1 ? r->rev : commit, name, &files[k - 1], got);
        c->file = NULL; /* name is this loop's */
        if (!st && k == 1)
            snprintf(commit, 48, "%s", got);
        const char *want = fetch_want(c, k);
        if (!st && want[0] && files[k - 1].want[0] && strcmp(want, files[k - 1].want))
            st = fetch_fail(c, FETCH_CHECKSUM, LLM_ERR_FORMAT, "%s: the hub's file has sha256 %.12s..., expected "
                            "%.12s...: not downloaded", files[k - 1].name, files[k - 1].want, want);
        if (!st && want[0]) {
            snprintf(files[k - 1].want, sizeof files[k - 1].want, "%s", want);
            files[k - 1].verify_hit = 1;
        }
        c->total += files[k - 1].size;
    }
    return st;
}

llm_status fetch_hf_get(fetch_ctx *c, const char *uri, char *path, size_t n)
{
    hf_ref r;
    char commit[48] = "";
    llm_status st = hf_parse(c, uri, &r);
    if (!st && r.quant[0])
        st = choose_quant(c, &r);
    int parts = st ? 0 : llm_split_path(r.path, 1, NULL, 0);
    if (!st && parts > FETCH_MAX_PARTS)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_INVALID_ARG, "%.300s: over %d parts", uri, FETCH_MAX_PARTS);
    c->n_parts = parts ? parts : 1;
    fetch_file *files = st ? NULL : calloc((size_t)c->n_parts, sizeof *files);
    if (!st && !files)
        st = fetch_fail(c, FETCH_FAILED, LLM_ERR_NOMEM, "no memory");
    if (!st)
        st = resolve_all(c, &r, files, commit);
    if (st && c->no_answer && !cached_snapshot(c, &r, path, n)) {
        free(files);
        return LLM_OK;
    }
    for (int k = 1; k <= c->n_parts && !st; k++) {
        c->file = files[k - 1].name;
        c->part = k;
        st = fetch_xfer_get(c, &files[k - 1]);
        if (!st)
            st = link_snapshot(c, &r, commit, &files[k - 1], k == 1 ? path : NULL, n);
        c->done_before += files[k - 1].size;
    }
    c->file = NULL;
    free(files);
    return st;
}
