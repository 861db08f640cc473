/* srv_lora.c - llm-server's LoRA adapters (srv_lora.h): the table, the
 * `lora` setting, the load and unload routes, /v1/models entries and
 * metrics. An adapter's file is read and checked by the engine's lora
 * module against the served model; the engine keeps its own prefix cache
 * per adapter. The table's lock is never held across a load, an unload's
 * wait or the engine's own calls that wait. */
#include <errno.h>
#include <limits.h>
#include <strings.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "fetch.h"
#include "llm/json.h"
#include "llm/prom.h"
#include "srv.h"
#include "srv_lora.h"

int srv_lora_init(srv_loras *t, int max, int max_rank)
{
    memset(t, 0, sizeof *t);
    t->max = max, t->max_rank = max_rank;
    if (!(t->ents = calloc((size_t)max, sizeof *t->ents)))
        return -1;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    return 0;
}

static void ent_free(srv_lora_ent *p)
{
    if (p)
        llm_lora_free(p->l);
    free(p);
}

void srv_lora_free(srv_loras *t)
{
    if (!t->ents)
        return;
    for (int i = 0; i < t->max; i++) ent_free(t->ents[i]);
    free(t->ents);
    t->ents = NULL;
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

/* A name is 1 to SRV_LORA_NAME_MAX bytes of letters, digits and ._-:/@+
 * (what vLLM's and KubeAI's adapter names use): safe in a log line, a
 * JSON string and a Prometheus label. */
static int name_ok(const char *n)
{
    size_t len = strlen(n);
    return len >= 1 && len <= SRV_LORA_NAME_MAX &&
           strspn(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:/@+") == len;
}

static srv_lora_ent *find(srv_loras *t, const char *name)
{
    for (int i = 0; i < t->max; i++)
        if (t->ents[i] && !strcmp(t->ents[i]->name, name))
            return t->ents[i];
    return NULL;
}

srv_lora_ent *srv_lora_pin(srv_loras *t, const char *name)
{
    if (!t->ents)
        return NULL;
    pthread_mutex_lock(&t->mu);
    srv_lora_ent *p = find(t, name);
    if (p && (!p->l || p->unloading))
        p = NULL;
    if (p) {
        p->pins++;
        p->used = ++t->clock;
    }
    pthread_mutex_unlock(&t->mu);
    return p;
}

void srv_lora_count_request(srv_lora_ent *p)
{
    if (p)
        atomic_fetch_add(&p->requests, 1);
}

void srv_lora_count(srv_lora_ent *p, int prompt_tokens, int gen_tokens)
{
    if (!p)
        return;
    atomic_fetch_add(&p->prompt_tokens, (unsigned long long)(prompt_tokens > 0 ? prompt_tokens : 0));
    atomic_fetch_add(&p->gen_tokens, (unsigned long long)(gen_tokens > 0 ? gen_tokens : 0));
}

void srv_lora_unpin(srv_loras *t, srv_lora_ent *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&t->mu);
    if (--p->pins == 0)
        pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* ---- loading ------------------------------------------------------------------- */

/* Under the lock: a free slot for a new adapter, unloading the idle one
 * used least recently when the table is full (no request holds it and the
 * engine has none naming it). Returns the slot's index, -1 when every
 * loaded adapter is in use (or evict is 0). *evicted gets the entry taken
 * out (the caller removes it from the engine and frees it, unlocked). */
static int slot_take(srv *s, int evict, srv_lora_ent **evicted)
{
    srv_loras *t = &s->loras;
    int lru = -1;
    *evicted = NULL;
    for (int i = 0; i < t->max; i++) {
        srv_lora_ent *p = t->ents[i];
        if (!p)
            return i;
        if (evict && p->l && !p->unloading && p->pins == 0 && llm_engine_lora_requests(s->engine, p->l) == 0 &&
            (lru < 0 || p->used < t->ents[lru]->used))
            lru = i;
    }
    if (lru >= 0) {
        *evicted = t->ents[lru];
        t->ents[lru] = NULL;
    }
    return lru;
}

/* The local file of source: a remote source fetched into model_cache, or
 * a path opened inside lora_dir (restricted: a path from a request) or as
 * it is (the operator's setting). *fd (-1: none) is held open while the
 * file is read through *path. 0, or the status with msg/param set. */
static int adapter_file(srv *s, const char *source, const char *sha, int restricted, char *path, size_t n, int *fd,
                        srv_err *e)
{
    *fd = -1;
    if (fetch_is_remote(source)) {
        llm_error err = {0};
        fetch_options o = {.cache_dir = s->cfg.model_cache[0] ? s->cfg.model_cache : NULL, .sha256 = sha,
                           .verify_cached = (int)s->cfg.model_cache_verify, .abort = &s->stopping};
        llm_status st = fetch_model(source, &o, path, n, NULL, &err);
        if (st)
            srv_err_set(e, st == LLM_ERR_NOMEM ? 503 : 400, "lora_path", "%s", err.msg);
        return st ? e->status : 0;
    }
    if (!restricted) {
        snprintf(path, n, "%s", source);
        return 0;
    }
    char dir[PATH_MAX];
    if (!s->cfg.lora_dir[0]) {
        srv_err_set(e, 400, "lora_path", "a local lora_path needs lora_dir set on the server (or use an hf://, s3:// "
                                         "or https:// source)");
        return 400;
    }
    if (!realpath(s->cfg.lora_dir, dir)) {
        srv_err_set(e, 500, NULL, "lora_dir %s cannot be resolved: %s", s->cfg.lora_dir, strerror(errno));
        return 500;
    }
    if (srv_load_open_inside(dir, source, "lora_path", fd, e))
        return e->status;
    snprintf(path, n, "/proc/self/fd/%d", *fd); /* what was checked is what is read */
    return 0;
}

/* Under the lock: whether name is taken (loaded, or being loaded). */
static int taken(srv_loras *t, const char *name) { return find(t, name) != NULL; }

/* gguf_check_fn: the bytes' SHA-256 against the expected hex digest (ctx). */
static llm_status sha256_is(void *ctx, const void *bytes, size_t n, llm_error *err)
{
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    if (!EVP_Digest(bytes, n, d, &dn, EVP_sha256(), NULL) || dn != 32)
        return llm_errf(err, LLM_ERR_INTERNAL, "SHA-256 failed");
    char hex[FETCH_SHA256_HEX];
    fetch_hex(d, 32, hex);
    if (strcasecmp(hex, ctx))
        return llm_errf(err, LLM_ERR_FORMAT, "sha256 mismatch: the bytes read hash to %s, not the %s expected", hex,
                        (const char *)ctx);
    return LLM_OK;
}

/* The adapter read from source and checked against the served model
 * before anything loaded is touched: 0 with *out, or the status. The
 * digest is of the bytes read for the load (not of the file before it:
 * a file rewritten in between cannot pass). */
static int read_adapter(srv *s, const char *name, const char *source, const char *sha, int restricted, llm_lora **out,
                        srv_err *e)
{
    char path[4096];
    int fd, st = adapter_file(s, source, sha, restricted, path, sizeof path, &fd, e);
    llm_error err = {0};
    llm_status ls = LLM_OK;
    int pinned = sha && *sha;
    if (!st)
        ls = llm_lora_load_checked(path, s->model, s->loras.max_rank, pinned ? sha256_is : NULL, (void *)sha, out,
                                   &err);
    if (fd >= 0)
        close(fd);
    if (ls) /* the message names /proc/self/fd/N for a file opened in lora_dir: the source is named first */
        st = srv_fail(e, ls == LLM_ERR_NOMEM ? 503 : 400, "lora_path", "adapter '%s' (%s): %s", name, source, err.msg);
    return st;
}

/* Loads an adapter: the file is read and checked first (a bad one changes
 * nothing), then a slot is taken (the idle adapter used least recently
 * unloaded when the table is full: evict 0 refuses that) and the engine
 * makes it ready. 0, or the status with e set. */
static int load(srv *s, const char *name, const char *source, const char *sha, float scale, int restricted, int evict,
                srv_err *e)
{
    srv_loras *t = &s->loras;
    if (!name_ok(name))
        return srv_fail(e, 400, "lora_name", "'lora_name' must be 1 to %d letters, digits or ._-:/@+", SRV_LORA_NAME_MAX);
    if (!strcmp(name, s->name))
        return srv_fail(e, 400, "lora_name", "'%s' is the base model's name", name);
    pthread_mutex_lock(&t->mu);
    int dup = taken(t, name);
    pthread_mutex_unlock(&t->mu);
    if (dup)
        return srv_fail(e, 400, "lora_name", "an adapter named '%s' is loaded already", name);
    llm_lora *l = NULL;
    srv_lora_ent *p = calloc(1, sizeof *p), *old = NULL;
    int st = !p ? srv_fail(e, 503, NULL, "out of memory") : read_adapter(s, name, source, sha, restricted, &l, e);
    if (st) {
        free(p);
        return st;
    }
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->source, sizeof p->source, "%s", source);
    snprintf(p->sha256, sizeof p->sha256, "%s", sha ? sha : "");
    p->scale = scale;
    pthread_mutex_lock(&t->mu);
    int i = taken(t, name) ? -2 : slot_take(s, evict, &old); /* a load of the same name may have won meanwhile */
    if (i >= 0)
        t->ents[i] = p; /* reserved: pins see no adapter yet */
    pthread_mutex_unlock(&t->mu);
    if (i < 0) {
        llm_lora_free(l);
        free(p);
        return i == -2 ? srv_fail(e, 400, "lora_name", "an adapter named '%s' is loaded already", name)
                       : srv_fail(e, 429, NULL, "all %d adapter slots (max_loras) hold adapters in use; retry later",
                                  t->max);
    }
    if (old) { /* idle: nothing waits */
        fprintf(stderr, "llm-server: adapter '%s' unloaded to make room for '%s'\n", old->name, name);
        llm_engine_lora_remove(s->engine, old->l);
        ent_free(old);
    }
    llm_error err = {0};
    llm_status ls = llm_engine_lora_add(s->engine, l, &err);
    if (ls) {
        llm_lora_free(l);
        st = srv_fail(e, srv_status_of(ls), NULL, "adapter '%s': %s", name, err.msg);
    }
    pthread_mutex_lock(&t->mu);
    if (st)
        t->ents[i] = NULL;
    else
        p->l = l, p->used = ++t->clock;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (st)
        free(p);
    return st;
}

/* NAME=SOURCE[:SCALE]: the scale is what follows the last ':' when all of
 * it is a number (hf://ORG/REPO:QUANT keeps its ':'). */
static int parse_entry(char *e, char **name, char **source, float *scale)
{
    char *eq = strchr(e, '='), *colon = strrchr(e, ':'), *end;
    if (!eq || eq == e || !eq[1])
        return -1;
    *eq = 0;
    *name = e, *source = eq + 1, *scale = 1;
    if (colon && colon > eq) {
        float v = strtof(colon + 1, &end);
        if (colon[1] && !*end) {
            *colon = 0;
            *scale = v;
        }
    }
    return 0;
}

/* A string member of req (shorter than 4096 bytes, no NUL inside), or NULL. */
static const char *str_field(json_t *req, const char *k)
{
    json_t *v = json_object_get(req, k);
    return json_is_string(v) && json_string_length(v) < 4096 && strlen(json_string_value(v)) == json_string_length(v)
               ? json_string_value(v)
               : NULL;
}

/* One lora_file entry: {"name", "uri" | "path", "sha256", "scale"}. */
static llm_status file_entry(srv *s, json_t *it, size_t i, llm_error *err)
{
    const char *name = str_field(it, "name"), *uri = str_field(it, "uri"), *path = str_field(it, "path");
    const char *sha = str_field(it, "sha256");
    json_t *sc = json_object_get(it, "scale");
    srv_err e = {0};
    if (!json_is_object(it) || !name || !uri == !path)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "lora_file: entry %zu needs a name and one of uri and path", i);
    if (sc && !(json_is_number(sc) && fabs(json_number_value(sc)) <= 1000))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "lora_file: %s: scale is not a number in [-1000, 1000]", name);
    if (load(s, name, uri ? uri : path, sha, sc ? (float)json_number_value(sc) : 1.0f, 0, 0, &e))
        return llm_errf(err, e.status == 503 ? LLM_ERR_NOMEM : LLM_ERR_INVALID_ARG, "lora_file: %s", e.msg);
    fprintf(stderr, "llm-server: adapter '%s' loaded from %s\n", name, uri ? uri : path);
    return LLM_OK;
}

/* lora_file's adapters (at most max_loras, with the `lora` setting's). */
static llm_status file_startup(srv *s, int already, llm_error *err)
{
    FILE *f = fopen(s->cfg.lora_file, "rb");
    if (!f)
        return llm_errf(err, LLM_ERR_IO, "lora_file: cannot open %s: %s", s->cfg.lora_file, strerror(errno));
    char *text = malloc(1 << 20);
    size_t n = text ? fread(text, 1, (1 << 20) - 1, f) : 0;
    int big = text && n == (1 << 20) - 1;
    fclose(f);
    if (!text || big) {
        free(text);
        return llm_errf(err, text ? LLM_ERR_TOO_LONG : LLM_ERR_NOMEM, "lora_file: %s is over 1 MiB", s->cfg.lora_file);
    }
    text[n] = 0;
    json_t *arr = llm_json_load(text, n, 0, NULL, err);
    free(text);
    llm_status st = !arr ? llm_errf(err, err->code ? err->code : LLM_ERR_FORMAT, "lora_file: %s: %s", s->cfg.lora_file, err->msg)
                    : !json_is_array(arr) ? llm_errf(err, LLM_ERR_INVALID_ARG, "lora_file: %s is not a JSON array", s->cfg.lora_file)
                    : already + (int)json_array_size(arr) > s->loras.max
                        ? llm_errf(err, LLM_ERR_INVALID_ARG, "lora_file: %d adapters in all, more than max_loras %d",
                                   already + (int)json_array_size(arr), s->loras.max)
                        : LLM_OK;
    for (size_t i = 0; !st && i < json_array_size(arr); i++) st = file_entry(s, json_array_get(arr, i), i, err);
    json_decref(arr);
    return st;
}

llm_status srv_lora_startup(srv *s, llm_error *err)
{
    char *list = strdup(s->cfg.lora), *save = NULL;
    if (!list)
        return llm_errf(err, LLM_ERR_NOMEM, "lora: no memory");
    llm_status st = LLM_OK;
    int n = *list ? 1 : 0;
    for (const char *c = list; (c = strchr(c, ',')); c++) n++;
    if (n > s->loras.max)
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "lora: %d adapters, more than max_loras %d", n, s->loras.max);
    for (char *tok = st ? NULL : strtok_r(list, ",", &save); tok && !st; tok = strtok_r(NULL, ",", &save)) {
        char *name, *source;
        float scale;
        srv_err e = {0};
        if (parse_entry(tok, &name, &source, &scale))
            st = llm_errf(err, LLM_ERR_INVALID_ARG, "lora: '%s' is not NAME=PATH[:SCALE]", tok);
        else if (!(fabsf(scale) <= 1000.0f))
            st = llm_errf(err, LLM_ERR_INVALID_ARG, "lora: %s: scale %g is not in [-1000, 1000]", name, (double)scale);
        else if (load(s, name, source, NULL, scale, 0, 0, &e))
            st = llm_errf(err, e.status == 503 ? LLM_ERR_NOMEM : LLM_ERR_INVALID_ARG, "lora: %s", e.msg);
        else
            fprintf(stderr, "llm-server: adapter '%s' loaded from %s (scale %g)\n", name, source, (double)scale);
    }
    free(list);
    if (!st && s->cfg.lora_file[0])
        st = file_startup(s, n, err);
    return st;
}

/* ---- the routes -------------------------------------------------------------------- */


int srv_lora_load_req(srv *s, json_t *req, srv_err *e)
{
    const char *name = str_field(req, "lora_name"), *path = str_field(req, "lora_path"), *sha = str_field(req, "sha256");
    json_t *sc = json_object_get(req, "scale"), *shaj = json_object_get(req, "sha256");
    if (!json_is_object(req) || !name)
        return srv_fail(e, 400, "lora_name", "'lora_name' must be a string");
    if (shaj && !json_is_null(shaj) && (!sha || strlen(sha) != 64 || strspn(sha, "0123456789abcdefABCDEF") != 64))
        return srv_fail(e, 400, "sha256", "'sha256' must be 64 hex digits");
    if (!path)
        return srv_fail(e, 400, "lora_path", "'lora_path' must be a path or an hf://, s3:// or https:// source");
    if (sc && !json_is_null(sc) && !(json_is_number(sc) && fabs(json_number_value(sc)) <= 1000))
        return srv_fail(e, 400, "scale", "'scale' must be a number in [-1000, 1000]");
    float scale = sc && json_is_number(sc) ? (float)json_number_value(sc) : 1.0f;
    int st = load(s, name, path, sha, scale, 1, 1, e);
    if (!st)
        fprintf(stderr, "llm-server: adapter '%s' loaded from %s (scale %g)\n", name, path, (double)scale);
    return st ? st : 200;
}

int srv_lora_unload_req(srv *s, json_t *req, srv_err *e)
{
    srv_loras *t = &s->loras;
    const char *name = json_is_object(req) ? str_field(req, "lora_name") : NULL;
    if (!name)
        return srv_fail(e, 400, "lora_name", "'lora_name' must be a string");
    pthread_mutex_lock(&t->mu);
    srv_lora_ent *p = find(t, name);
    int status = !p || !p->l || p->unloading ? 404 : 0;
    if (!status) {
        p->unloading = 1; /* no new pins; those held end with their requests */
        while (p->pins > 0) pthread_cond_wait(&t->cv, &t->mu);
    }
    pthread_mutex_unlock(&t->mu);
    if (status)
        return srv_fail(e, 404, "lora_name", "no adapter named '%s' is loaded", name);
    llm_engine_lora_remove(s->engine, p->l); /* no request names it any more: returns at once */
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->max; i++)
        if (t->ents[i] == p)
            t->ents[i] = NULL;
    pthread_mutex_unlock(&t->mu);
    fprintf(stderr, "llm-server: adapter '%s' unloaded\n", name);
    ent_free(p);
    return 200;
}

/* ---- listing and metrics -------------------------------------------------------------- */

json_t *srv_lora_state(srv_loras *t)
{
    json_t *list = json_array(), *out = list ? json_pack("{s:o,s:i}", "adapters", list, "max_loras", t->max) : NULL;
    if (!out)
        return NULL;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->max; i++) {
        const srv_lora_ent *p = t->ents[i];
        if (p && json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:f,s:s,s:i}", "name", p->name, "source",
                                                       p->source, "sha256", p->sha256, "scale", (double)p->scale,
                                                       "state", !p->l ? "loading" : p->unloading ? "unloading" : "ready",
                                                       "requests", p->pins))) {
            json_decref(out); /* never a list with an adapter missing */
            out = NULL;
            break;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return out;
}

/* Where an adapter came from, as /v1/models shows it to every caller: a
 * URL without its user part or query (a pre-signed URL's signature). */
static void shown_source(const char *src, char *out, size_t n)
{
    const char *host = strstr(src, "://"), *at = host ? strchr(host + 3, '@') : NULL, *slash = host ? strchr(host + 3, '/') : NULL;
    if (host && at && (!slash || at < slash))
        snprintf(out, n, "%.*s%s", (int)(host + 3 - src), src, at + 1);
    else
        snprintf(out, n, "%s", src);
    out[strcspn(out, "?#")] = 0;
}

void srv_lora_models(srv_loras *t, const char *base, long created, json_t *data)
{
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->max; i++) {
        const srv_lora_ent *p = t->ents[i];
        char root[sizeof p->source];
        if (!p || !p->l || p->unloading)
            continue;
        shown_source(p->source, root, sizeof root);
        json_array_append_new(data, json_pack("{s:s,s:s,s:I,s:s,s:s,s:s}", "id", p->name, "object", "model", "created",
                                              (json_int_t)created, "owned_by", "llm-k8s", "root", root, "parent", base));
    }
    pthread_mutex_unlock(&t->mu);
}

/* A copy of what the metrics show of one adapter, taken under the lock. */
typedef struct lora_row {
    char name[SRV_LORA_NAME_MAX + 1];
    const llm_lora *l; /* compared, never read: it may be unloaded meanwhile */
    unsigned long long v[3];
    int unloading;
} lora_row;

/* One sample of name labelled with the adapter and the served model. */
static void adapter_sample(llm_strbuf *b, const char *name, const char *adapter, const char *model_name, double v)
{
    llm_strbuf l = {0};
    llm_prom_label(&l, "adapter", adapter);
    llm_prom_label(&l, "model_name", model_name);
    b->failed |= l.failed;
    if (!l.failed)
        llm_prom_sample(b, name, l.p, v);
    llm_strbuf_free(&l);
}

void srv_lora_metrics(srv_loras *t, llm_engine *e, const char *model_name, llm_strbuf *b)
{
    int n = 0;
    lora_row *rows = calloc((size_t)(t->max > 0 ? t->max : 1), sizeof *rows);
    const llm_lora **ls = calloc((size_t)(t->max > 0 ? t->max : 1), sizeof *ls);
    int *run = calloc((size_t)(t->max > 0 ? t->max : 1), sizeof *run), *wait = calloc((size_t)(t->max > 0 ? t->max : 1), sizeof *wait);
    if (!rows || !ls || !run || !wait) {
        b->failed = 1; /* the scrape fails whole: never a text with series missing */
        goto out;
    }
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->max; i++) {
        const srv_lora_ent *p = t->ents[i];
        if (!p || !p->l)
            continue;
        snprintf(rows[n].name, sizeof rows[n].name, "%s", p->name);
        ls[n] = rows[n].l = p->l;
        rows[n].v[0] = atomic_load(&p->requests), rows[n].v[1] = atomic_load(&p->prompt_tokens);
        rows[n].v[2] = atomic_load(&p->gen_tokens);
        rows[n].unloading = p->unloading;
        n++;
    }
    pthread_mutex_unlock(&t->mu);
    llm_engine_lora_counts(e, ls, n, run, wait); /* the engine's lock, not the table's */
    llm_strbuf rs = {0}, ws = {0}, lab = {0};
    for (int i = 0; i < n; i++) {
        if (run[i])
            llm_strbuf_printf(&rs, "%s%s", rs.len ? "," : "", rows[i].name);
        if (wait[i])
            llm_strbuf_printf(&ws, "%s%s", ws.len ? "," : "", rows[i].name);
    }
    char max[16];
    snprintf(max, sizeof max, "%d", t->max);
    llm_prom_label(&lab, "running_lora_adapters", rs.p ? rs.p : "");
    llm_prom_label(&lab, "waiting_lora_adapters", ws.p ? ws.p : "");
    llm_prom_label(&lab, "max_lora", max);
    llm_prom_label(&lab, "model_name", model_name); /* every vllm: series has it: dashboards select by it */
    b->failed |= rs.failed || ws.failed || lab.failed;
    /* vLLM's gauge: its value is when it was taken, the labels say which adapters run and wait */
    llm_prom_gauge(b, "vllm:lora_requests_info", "Running and waiting LoRA adapters (vLLM's labels)", lab.p,
                   (double)time(NULL));
    if (n > 0) /* a family without samples: Go's parser keeps it, Python's drops it - none at all then */
        llm_prom_head(b, "llm_lora_loaded", "gauge", "1 for each LoRA adapter loaded here (what llm-router routes by)");
    for (int i = 0; i < n; i++) adapter_sample(b, "llm_lora_loaded", rows[i].name, model_name, rows[i].unloading ? 0 : 1);
    static const char *const names[3] = {"llm_lora_requests_total", "llm_lora_prompt_tokens_total",
                                         "llm_lora_generation_tokens_total"};
    static const char *const help[3] = {"Requests naming the adapter", "Prompt tokens of its requests",
                                        "Tokens its requests generated"};
    for (int k = 0; k < 3 && n > 0; k++) {
        llm_prom_head(b, names[k], "counter", help[k]);
        for (int i = 0; i < n; i++) adapter_sample(b, names[k], rows[i].name, model_name, (double)rows[i].v[k]);
    }
    llm_strbuf_free(&rs);
    llm_strbuf_free(&ws);
    llm_strbuf_free(&lab);
out:
    free(rows);
    free(ls);
    free(run);
    free(wait);
}
