/* srv_canary.c - a colocated canary: a second revision's model loaded in
 * this server beside the stable one, when both fit in the memory budget,
 * taking a share of the completions; see srv.h. It lets a canary run on
 * the GPUs (or memory) the stable pods already hold. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "llm/chat.h"
#include "fetch.h"
#include "srv.h"

void srv_canary_init(srv *s)
{
    srv_canary *c = &s->canary;
    pthread_mutex_init(&c->mu, NULL);
    snprintf(c->state, sizeof c->state, "none");
}

static void rev_free(srv_rev *r)
{
    if (!r)
        return;
    llm_engine_close(r->engine);
    srv_load_close_backends(r->backends, r->n_backends);
    srv_chat_free(r->chat);
    llm_model_free(r->model);
    free(r);
}

/* Frees a retired revision whose last request has ended. Under mu. */
static void reap(srv_canary *c)
{
    if (c->retired && atomic_load(&c->retired->users) == 0) {
        rev_free(c->retired);
        c->retired = NULL;
    }
}

void srv_canary_abort(srv *s) { atomic_store(&s->canary.abort, 1); }

int srv_canary_free(srv *s)
{
    srv_canary *c = &s->canary;
    atomic_store(&c->abort, 1); /* a digest check in progress stops */
    for (int ms = 0; c->loader_started && ms < 2000; ms += 20) {
        pthread_mutex_lock(&c->mu);
        int loading = c->loading;
        pthread_mutex_unlock(&c->mu);
        if (!loading)
            break;
        usleep(20000);
    }
    pthread_mutex_lock(&c->mu);
    int left = c->loading; /* paging a big file in: the process exits without it */
    pthread_mutex_unlock(&c->mu);
    if (left) {
        fprintf(stderr, "llm-server: the canary %s is still loading; not waiting for it\n", c->path);
        return 1;
    }
    if (c->loader_started)
        pthread_join(c->loader, NULL);
    rev_free(c->rev);
    rev_free(c->retired);
    c->rev = c->retired = NULL;
    pthread_mutex_destroy(&c->mu);
    return 0;
}

static unsigned int hash32(const char *p)
{
    unsigned int h = 2166136261u;
    for (; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    return h ^ (h >> 15);
}

srv_rev *srv_canary_pick(srv *s, const char *session)
{
    srv_canary *c = &s->canary;
    srv_rev *r = NULL;
    pthread_mutex_lock(&c->mu);
    reap(c);
    if (c->rev && c->weight > 0) {
        int go;
        if (session && *session) {
            go = (int)(hash32(session) % 100) < c->weight; /* a session keeps its revision */
        } else {
            c->split += c->weight;
            go = c->split >= 100;
            if (go)
                c->split -= 100;
        }
        if (go) {
            r = c->rev;
            atomic_fetch_add(&r->users, 1);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return r;
}

srv_rev *srv_canary_hold(srv *s)
{
    srv_canary *c = &s->canary;
    pthread_mutex_lock(&c->mu);
    reap(c);
    srv_rev *r = c->rev;
    if (r)
        atomic_fetch_add(&r->users, 1);
    pthread_mutex_unlock(&c->mu);
    return r;
}

void srv_canary_release(srv_rev *r)
{
    if (r)
        atomic_fetch_sub(&r->users, 1);
}

/* ---- fitting and loading ---------------------------------------------------------- */

static long long read_ll(const char *path)
{
    FILE *f = fopen(path, "r");
    long long v = -1;
    if (f && fscanf(f, "%lld", &v) != 1)
        v = -1; /* "max": no limit */
    if (f)
        fclose(f);
    return v;
}

/* The memory this server may use: memory_budget_mb, else its cgroup's
 * limit (v2, then v1); -1 when nothing limits it. */
static long long budget_bytes(const srv *s)
{
    if (s->cfg.memory_budget_mb > 0)
        return (long long)s->cfg.memory_budget_mb << 20;
    long long v = read_ll("/sys/fs/cgroup/memory.max");
    if (v <= 0)
        v = read_ll("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    return v > 0 && v < (1LL << 60) ? v : -1;
}

/* LLM_ERR_NOMEM (message with the numbers) when the model at path and its
 * KV cache would not fit beside what this server already holds. */
static llm_status fits(const srv *s, const char *path, llm_error *err)
{
    struct stat st;
    if (stat(path, &st))
        return llm_errf(err, LLM_ERR_IO, "%s: %s", path, strerror(errno));
    long long budget = budget_bytes(s), used = srv_rss_bytes();
    long long need = (long long)st.st_size + ((long long)s->cfg.kv_cache_mb << 20);
    if (budget > 0 && used + need > budget)
        return llm_errf(err, LLM_ERR_NOMEM,
                        "the canary needs %lld MiB (model %lld MiB + KV cache %ld MiB) but only %lld MiB of the "
                        "%lld MiB budget are free", need >> 20, (long long)st.st_size >> 20, s->cfg.kv_cache_mb,
                        (budget - used) >> 20, budget >> 20);
    return LLM_OK;
}

typedef struct load_job {
    srv *s;
    char path[4096], sha256[72];
    int fd;                /* the file, opened and checked by open_model */
    char fd_path[64];      /* /proc/self/fd/N: what is loaded (the file checked, whatever the path names now) */
    unsigned long gen;
} load_job;

static void quiet(void *ctx, double done)
{
    (void)ctx, (void)done;
}

/* What an admin caller is told of a file that would not load: the path
 * and the kind of failure; the details (they may quote the file's bytes)
 * go to the log. */
static llm_status load_failed(const load_job *j, llm_status st, llm_error *err)
{
    fprintf(stderr, "llm-server: canary %s: %s\n", j->path, err->msg);
    return llm_errf(err, st, "%s is not a model this server can load (the server log says why)", j->path);
}

/* A digest mismatch as an admin caller is told it: the expected digest,
 * not the file's (a caller naming any file of the model directory must not
 * learn its digest: a guess of its content would be confirmed); the whole
 * message goes to the log. */
static llm_status mismatch(const load_job *j, llm_error *err)
{
    fprintf(stderr, "llm-server: canary %s: %s\n", j->path, err->msg);
    return llm_errf(err, LLM_ERR_FORMAT, "%.300s: sha256 mismatch: the file is not the one expected (%s; the server log "
                    "has the file's digest)", j->path, j->sha256);
}

static llm_status load(srv *s, const load_job *j, srv_rev *r, llm_error *err)
{
    snprintf(r->path, sizeof r->path, "%s", j->path);
    llm_status st = fits(s, j->fd_path, err);
    /* its digest on what is mapped, before it is parsed; a stop ends it (LLM_ERR_CANCELLED) */
    if (!st && (st = srv_load_model(j->fd_path, j->sha256, quiet, NULL, &s->canary.abort, &r->model, err)) &&
        st != LLM_ERR_CANCELLED)
        st = strstr(err->msg, "sha256 mismatch") ? mismatch(j, err) : load_failed(j, st, err);
    if (!st)
        st = srv_load_page_in(r->model, quiet, NULL, &s->canary.abort, err);
    if (!st)
        st = srv_load_backends(s, r->backends, &r->n_backends, err); /* its own: the engines step independently */
    if (!st)
        st = srv_load_engine(s, r->model, NULL, r->backends, r->n_backends, &r->engine, err);
    if (!st)
        st = srv_load_warm_up(r->engine, r->model, err);
    if (!st && !(r->chat = srv_chat_new(r->model, s->cfg.chat_template, s->cfg.chat_template_file, err)))
        st = err->code;
    return st;
}

static void *loader(void *arg)
{
    load_job *j = arg;
    srv_canary *c = &j->s->canary;
    llm_error err = {0};
    srv_rev *r = calloc(1, sizeof *r);
    llm_status st = r ? load(j->s, j, r, &err) : llm_errf(&err, LLM_ERR_NOMEM, "no memory for the canary");
    pthread_mutex_lock(&c->mu);
    if (j->gen == c->gen) { /* still what is asked for */
        snprintf(c->state, sizeof c->state, "%s", st == LLM_ERR_NOMEM && r ? "does_not_fit" : st ? "failed" : "ready");
        snprintf(c->message, sizeof c->message, "%s", st ? err.msg : "serving beside the stable model");
        if (!st) {
            c->rev = r;
            r = NULL;
        }
        srv_metrics_canary(&j->s->metrics, c->rev != NULL, c->weight);
    }
    c->loading = 0;
    pthread_mutex_unlock(&c->mu);
    fprintf(stderr, "llm-server: canary %s: %s\n", j->path, st ? err.msg : "loaded");
    rev_free(r);
    close(j->fd);
    free(j);
    return NULL;
}

/* ---- the admin request -------------------------------------------------------------- */

json_t *srv_canary_state(srv *s)
{
    srv_canary *c = &s->canary;
    pthread_mutex_lock(&c->mu);
    json_t *o = json_pack("{s:s,s:s,s:i,s:s,s:i}", "state", c->state, "model", c->path, "weight", c->weight, "message",
                          c->message, "requests", c->rev ? atomic_load(&c->rev->users) : 0);
    pthread_mutex_unlock(&c->mu);
    return o;
}

/* The loaded canary steps aside (freed once its requests end). Under mu;
 * 0, or 409 while an earlier one still serves requests. */
static int retire(srv_canary *c, srv_err *e)
{
    reap(c);
    if (c->rev && c->retired) {
        srv_err_set(e, 409, "model", "the previous canary still has %d requests; try again",
                    atomic_load(&c->retired->users));
        return 409;
    }
    if (c->rev)
        c->retired = c->rev, c->rev = NULL;
    reap(c);
    return 0;
}

/* The directory canary models must lie in (model_dir, else the stable
 * model's), resolved; 0 or a 500 naming it. */
static int model_dir(const srv *s, char *out, srv_err *e)
{
    char dir[PATH_MAX];
    int own = s->cfg.model_dir[0] != 0;
    if (own)
        snprintf(dir, sizeof dir, "%s", s->cfg.model_dir);
    else if (fetch_is_remote(s->cfg.model)) { /* a source's files are links into the cache's blobs/: the cache */
        fetch_cache_dir(&(fetch_options){.cache_dir = s->cfg.model_cache[0] ? s->cfg.model_cache : NULL}, dir,
                        sizeof dir);
        own = 1;
    } else
        snprintf(dir, sizeof dir, "%s", s->model_path);
    const char *d = own ? dir : dirname(dir);
    if (!realpath(d, out)) {
        srv_err_set(e, 500, NULL, "the model directory %s cannot be resolved: %s", d, strerror(errno));
        return 500;
    }
    return 0;
}

/* Opens the canary's model file inside the model directory (srv_load_open_inside). */
static int open_model(const srv *s, const char *path, int *fd, srv_err *e)
{
    char dir[PATH_MAX];
    if (model_dir(s, dir, e))
        return e->status;
    return srv_load_open_inside(dir, path, "model", fd, e);
}

static int start_load(srv *s, const char *path, const char *sha, srv_err *e)
{
    srv_canary *c = &s->canary;
    int fd;
    if (open_model(s, path, &fd, e))
        return e->status;
    load_job *j = calloc(1, sizeof *j);
    if (!j) {
        close(fd);
        srv_err_set(e, 503, NULL, "no memory");
        return 503;
    }
    if (c->loader_started)
        pthread_join(c->loader, NULL); /* finished: loading is 0 */
    c->loader_started = 0;
    snprintf(c->path, sizeof c->path, "%s", path);
    snprintf(c->sha256, sizeof c->sha256, "%s", sha);
    *j = (load_job){.s = s, .gen = ++c->gen, .fd = fd};
    atomic_store(&c->abort, 0);
    snprintf(j->fd_path, sizeof j->fd_path, "/proc/self/fd/%d", fd);
    snprintf(j->path, sizeof j->path, "%s", path);
    snprintf(j->sha256, sizeof j->sha256, "%s", sha);
    if (pthread_create(&c->loader, NULL, loader, j)) {
        close(fd);
        free(j);
        snprintf(c->state, sizeof c->state, "failed");
        snprintf(c->message, sizeof c->message, "cannot start the loader thread");
        return 0;
    }
    c->loader_started = c->loading = 1;
    snprintf(c->state, sizeof c->state, "loading");
    snprintf(c->message, sizeof c->message, "loading %s", path);
    return 0;
}

int srv_canary_admin(srv *s, json_t *req, json_t **out, srv_err *e)
{
    srv_canary *c = &s->canary;
    const char *path, *sha;
    int weight;
    *out = NULL;
    if (srv_parse_admin(req, &path, &sha, &weight, e))
        return e->status;
    pthread_mutex_lock(&c->mu);
    int status = 0;
    if (!path) { /* unload */
        if (c->loading) {
            c->gen++; /* the load in progress is dropped when it ends */
            atomic_store(&c->abort, 1); /* and stops early when it can */
        }
        if (!(status = retire(c, e))) {
            snprintf(c->state, sizeof c->state, "none");
            c->path[0] = c->sha256[0] = c->message[0] = 0;
            c->weight = 0;
        }
    } else if (strcmp(path, c->path) || strcmp(sha ? sha : "", c->sha256)) { /* another model */
        if (c->loading) {
            srv_err_set(e, 409, "model", "the canary %s is still loading; try again", c->path);
            status = 409;
        } else if (!(status = retire(c, e))) {
            status = start_load(s, path, sha ? sha : "", e);
        }
    }
    if (!status && weight >= 0 && path)
        c->weight = weight;
    srv_metrics_canary(&s->metrics, c->rev != NULL, c->weight);
    pthread_mutex_unlock(&c->mu);
    if (status)
        return status;
    *out = srv_canary_state(s);
    return 200;
}
