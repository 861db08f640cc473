/* srv_load.c - what llm-server and its colocated canary (srv_canary.c)
 * use to bring a model up: the model file's digest check, the backends,
 * the engine from the configuration, and a warm-up token. Kept apart
 * from srv_main.c (the process: signals, loader thread, drain) so tests
 * can run the server in-process. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fetch.h"
#include "llm/split_name.h"
#include "srv.h"

llm_status srv_load_backends(srv *s, llm_backend **out, int *n, llm_error *err)
{
    llm_backend_spec spec = {s->cfg.backend, (int)s->cfg.tensor_parallel,
                             {(int)s->cfg.threads, 0, NULL, (llm_cpu_pack)srv_config_cpu_pack(&s->cfg)},
                             (int)s->cfg.device};
    llm_status st = llm_backends_open(&spec, out, err);
    *n = st ? 0 : (int)s->cfg.tensor_parallel;
    return st;
}

void srv_load_close_backends(llm_backend **b, int n)
{
    for (int i = 0; i < n; i++) {
        llm_backend_free(b[i]);
        b[i] = NULL;
    }
}

llm_status srv_load_engine(srv *s, llm_model *m, llm_backend *const *b, int n, llm_engine **out, llm_error *err)
{
    llm_kv_type kt;
    llm_status st = llm_kv_type_parse(s->cfg.kv_type, &kt, err);
    if (st)
        return st;
    llm_engine_config ec = {.model = m, .backend = b[0], .tensor_parallel = n, .tp_backends = b, .n_ctx = (int)s->cfg.n_ctx,
                            .max_seqs = (int)s->cfg.max_seqs, .max_batch_tokens = (int)s->cfg.max_batch_tokens,
                            .max_waiting = (int)s->cfg.max_waiting, .block_size = (int)s->cfg.block_size, .kv_type = kt,
                            .kv_cache_bytes = (size_t)s->cfg.kv_cache_mb << 20,
                            .kv_cache_fraction = (float)s->cfg.kv_cache_fraction,
                            .no_prefix_cache = !s->cfg.prefix_cache, .max_loras = (int)s->cfg.max_loras,
                            .prompt_logit_rows = s->cfg.prompt_logprob_rows ? (int)s->cfg.prompt_logprob_rows : -1};
    return llm_engine_open(&ec, out, err);
}

/* One token through the engine before ready: the first real request then
 * finds every buffer allocated and every kernel path warm. */
llm_status srv_load_warm_up(llm_engine *e, llm_model *m, llm_error *err)
{
    int32_t tok = llm_vocab_bos(m->vocab) >= 0 ? llm_vocab_bos(m->vocab) : 0;
    llm_request rq = {.tokens = &tok, .n_tokens = 1, .sampling = llm_sampling_default(), .max_tokens = 1,
                      .ignore_eos = 1};
    llm_request_id id;
    llm_status st = llm_engine_submit(e, &rq, &id, err);
    for (llm_event ev; !st;) {
        st = llm_engine_next(e, id, &ev, -1);
        llm_event_clear(&ev);
        if (!st && ev.type != LLM_EVENT_TOKEN)
            return ev.type == LLM_EVENT_ERROR ? llm_errf(err, ev.error.code, "warm-up: %s", ev.error.msg) : LLM_OK;
    }
    return st;
}

static llm_status verify_one(const char *path, const char *want, const _Atomic int *abort, llm_error *err);

/* model_sha256: the file's digest before anything trusts it (a truncated
 * or swapped file on a shared volume is caught here, by name). A split
 * set's parts have one digest each, comma-separated in part order. Both
 * digests whole in the error (it reaches the pod's /startupz and the
 * operator's status, and the admin routes' callers, who hold the token):
 * a platform team compares them with what it published. */
llm_status srv_load_verify_sha256(const char *path, const char *want, const _Atomic int *abort, llm_error *err)
{
    if (!want || !*want)
        return LLM_OK;
    int parts = llm_split_path(path, 1, NULL, 0), given = 1;
    for (const char *c = want; (c = strchr(c, ',')); c++) given++;
    if (given != (parts ? parts : 1))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%s: model_sha256 has %d digests for %d file%s (a split set: one "
                        "per part, comma-separated in part order)", path, given, parts ? parts : 1, parts > 1 ? "s" : "");
    if (!parts)
        return verify_one(path, want, abort, err);
    const char *d = want;
    for (int k = 1; k <= parts; k++) {
        char part[4096], one[72];
        size_t len = strcspn(d, ",");
        snprintf(one, sizeof one, "%.*s", (int)(len < 71 ? len : 71), d);
        d += len + (d[len] == ',');
        llm_status st = !llm_split_path(path, (uint32_t)k, part, sizeof part)
                            ? llm_errf(err, LLM_ERR_INVALID_ARG, "%s: path too long", path)
                            : verify_one(part, one, abort, err);
        if (st)
            return st;
    }
    return LLM_OK;
}

static llm_status verify_one(const char *path, const char *want, const _Atomic int *abort, llm_error *err)
{
    char hex[FETCH_SHA256_HEX];
    llm_status st = fetch_file_sha256(path, 0, abort, hex, err);
    if (!st && strcasecmp(hex, want)) {
        st = llm_errf(err, LLM_ERR_FORMAT, "%.200s: sha256 mismatch: the file's is %s, expected %s", path, hex, want);
    }
    return st;
}

int srv_load_open_inside(const char *dir, const char *path, const char *param, int *fd, srv_err *e)
{
    char real[PATH_MAX];
    struct stat st;
    size_t n = strlen(dir) == 1 ? 0 : strlen(dir); /* dir "/": any file (real[0] is '/') */
    *fd = -1;
    if (!realpath(path, real) || strncmp(real, dir, n) || real[n] != '/') {
        srv_err_set(e, 400, param, "'%s' %s is not a file inside the directory %s", param, path, dir);
        return 400;
    }
    char opened[PATH_MAX + 1], link[64];
    ssize_t k = -1;
    if ((*fd = open(real, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW)) >= 0) { /* what was opened, not what was named */
        snprintf(link, sizeof link, "/proc/self/fd/%d", *fd);
        k = readlink(link, opened, sizeof opened - 1);
    }
    if (k >= 0)
        opened[k] = 0;
    if (*fd < 0 || k < 0 || strncmp(opened, dir, n) || opened[n] != '/' || fstat(*fd, &st) || !S_ISREG(st.st_mode) ||
        st.st_size <= 0) {
        srv_err_set(e, 400, param, "'%s' %s is not a regular file with data (in %s)", param, path, dir);
        if (*fd >= 0)
            close(*fd);
        *fd = -1;
        return 400;
    }
    return 0;
}
