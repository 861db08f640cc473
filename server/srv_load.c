/* srv_load.c - what llm-server and its colocated canary (srv_canary.c)
 * use to bring a model up: the model file's digest check, the backends,
 * the engine from the configuration, and a warm-up token. Kept apart
 * from srv_main.c (the process: signals, loader thread, drain) so tests
 * can run the server in-process. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

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

/* The engine's speculation mode for the configuration, with or without a
 * draft model at hand. */
static llm_spec_mode spec_mode(const srv *s, const llm_model *draft)
{
    if (!strcmp(s->cfg.speculative, "draft"))
        return draft ? LLM_SPEC_DRAFT : LLM_SPEC_NGRAM;
    return strcmp(s->cfg.speculative, "ngram") ? LLM_SPEC_OFF : LLM_SPEC_NGRAM;
}

llm_status srv_load_engine(srv *s, llm_model *m, const llm_model *draft, llm_backend *const *b, int n,
                           llm_engine **out, llm_error *err)
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
                            .no_prefix_cache = !s->cfg.prefix_cache,
                            .no_grammar_close = !s->cfg.grammar_close, .max_loras = (int)s->cfg.max_loras,
                            .prompt_logit_rows = s->cfg.prompt_logprob_rows ? (int)s->cfg.prompt_logprob_rows : -1,
                            .speculative = spec_mode(s, draft), .spec_draft_model = draft,
                            .spec_draft_kv_bytes = (size_t)s->cfg.spec_draft_kv_mb << 20,
                            .spec_tokens = (int)s->cfg.spec_tokens, .spec_ngram_min = (int)s->cfg.spec_ngram_min,
                            .spec_ngram_max = (int)s->cfg.spec_ngram_max, .spec_step_rows = (int)s->cfg.spec_step_rows,
                            .spec_max_seqs = (int)s->cfg.spec_max_seqs};
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

/* ---- the model's bytes, as mapped ---------------------------------------------------- */

/* A page of a mapping whose file was cut short since raises SIGBUS. On the
 * thread reading a model in (bus_at set) it ends that read as a failed
 * load; anywhere else the process cannot go on (the mapping is the
 * model's weights): it says why and exits, and its pod restarts. */
static __thread sigjmp_buf *bus_at;

static void on_bus(int sig)
{
    (void)sig;
    if (bus_at)
        siglongjmp(*bus_at, 1);
    static const char msg[] = "llm-server: SIGBUS: a model file was truncated or rewritten while mapped; exiting\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(75);
}

int srv_load_catch_bus(void)
{
    struct sigaction sa = {.sa_handler = on_bus};
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, NULL);
}

/* What a page-in does to one part: hash it (md set) or touch each page. */
typedef struct page_in {
    const unsigned char *p;
    size_t n;
    EVP_MD_CTX *md;                 /* NULL: touch only */
    const _Atomic int *abort;
    void (*progress)(void *ctx, double done);
    void *ctx;
    size_t done, total;             /* over every part, for progress */
} page_in;

/* How reading a part ended. */
enum part_end { PART_READ = 0, PART_STOPPED = 1, PART_DIGEST_FAILED = -1, PART_FAULTED = 2 };

/* PART_READ, PART_STOPPED (abort set) or PART_DIGEST_FAILED. Runs under
 * the SIGBUS guard. */
static int read_part(page_in *pi)
{
    enum { CHUNK = 1 << 20 };
    volatile unsigned char sink = 0;
    for (size_t off = 0; off < pi->n; off += CHUNK) {
        size_t len = pi->n - off < CHUNK ? pi->n - off : CHUNK;
        if (pi->abort && atomic_load(pi->abort))
            return PART_STOPPED;
        if (pi->md && !EVP_DigestUpdate(pi->md, pi->p + off, len))
            return PART_DIGEST_FAILED;
        if (!pi->md)
            for (size_t i = 0; i < len; i += 4096) sink ^= pi->p[off + i];
        pi->done += len;
        if (pi->progress && (off / CHUNK) % 64 == 0)
            pi->progress(pi->ctx, pi->total ? (double)pi->done / (double)pi->total : 1.0);
    }
    (void)sink;
    return PART_READ;
}

/* read_part with SIGBUS caught: what read_part returns, or PART_FAULTED
 * when a page faulted. A guard set before (srv_load_model's) is restored
 * after. */
static int read_part_caught(page_in *pi)
{
    sigjmp_buf jb, *outer = bus_at;
    if (sigsetjmp(jb, 1)) {
        bus_at = outer;
        return PART_FAULTED;
    }
    bus_at = &jb;
    int rc = read_part(pi);
    bus_at = outer;
    return rc;
}

static llm_status bus_error(const char *name, llm_error *err)
{
    return llm_errf(err, LLM_ERR_IO, "%.300s: the file was truncated while it was read in (SIGBUS)", name);
}

/* read_part_caught as a status: LLM_OK, LLM_ERR_CANCELLED or LLM_ERR_IO. */
static llm_status read_part_guarded(page_in *pi, const char *name, llm_error *err)
{
    int rc = read_part_caught(pi);
    return rc == PART_FAULTED   ? bus_error(name, err)
           : rc == PART_STOPPED ? llm_errf(err, LLM_ERR_CANCELLED, "%.300s: loading was stopped", name)
           : rc == PART_DIGEST_FAILED ? llm_errf(err, LLM_ERR_INTERNAL, "%.300s: SHA-256 update failed", name)
                                      : LLM_OK;
}

/* Part k's digest of want ("" when want has none for it). */
static void digest_of(const char *want, uint32_t k, char one[72])
{
    const char *d = want;
    for (uint32_t i = 0; i < k && d; i++) d = strchr(d, ',') ? strchr(d, ',') + 1 : NULL;
    size_t len = d ? strcspn(d, ",") : 0;
    snprintf(one, 72, "%.*s", (int)(len < 71 ? len : 71), d ? d : "");
}

/* The digests model_sha256 pins for the model at path: how many parts its
 * name says and the bytes to come, checked against want's count. */
typedef struct digest_check {
    const char *model, *want;
    uint32_t parts;
    page_in pi;
} digest_check;

/* gguf_part_check_fn: part path's mapped bytes hashed against its digest,
 * before the parser reads them. */
static llm_status check_digest(void *ctx, const char *path, const void *bytes, size_t n, llm_error *err)
{
    digest_check *d = ctx;
    uint32_t k = 0;
    char name[4096], one[72], hex[FETCH_SHA256_HEX];
    while (d->parts > 1 && k < d->parts && (!llm_split_path(d->model, k + 1, name, sizeof name) || strcmp(name, path)))
        k++;
    if (k == d->parts)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%.300s: no digest in model_sha256 for this part", path);
    unsigned char dig[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    d->pi.p = bytes, d->pi.n = n;
    if (!EVP_DigestInit_ex(d->pi.md, EVP_sha256(), NULL))
        return llm_errf(err, LLM_ERR_INTERNAL, "SHA-256 init failed");
    /* caught here, not by srv_load_model's guard: a failed check unwinds through the loader, which
     * unmaps and closes what it opened (the guard's jump past it would leak both) */
    int rc = read_part_caught(&d->pi);
    if (rc != PART_READ)
        return rc == PART_FAULTED   ? bus_error(path, err)
               : rc == PART_STOPPED ? llm_errf(err, LLM_ERR_CANCELLED, "%.300s: the sha256 check was abandoned", path)
                                    : llm_errf(err, LLM_ERR_INTERNAL, "%.300s: SHA-256 update failed", path);
    if (!EVP_DigestFinal_ex(d->pi.md, dig, &dn) || dn != 32)
        return llm_errf(err, LLM_ERR_INTERNAL, "SHA-256 final failed");
    fetch_hex(dig, 32, hex);
    digest_of(d->want, k, one);
    if (strcasecmp(hex, one))
        return llm_errf(err, LLM_ERR_FORMAT, "%.200s: sha256 mismatch: the file's is %s, expected %s", path, hex, one);
    return LLM_OK;
}

/* The sizes of the parts path's name gives (for progress); 0 when unknown. */
static size_t parts_size(const char *path, uint32_t parts)
{
    size_t total = 0;
    char name[4096];
    struct stat sb;
    for (uint32_t k = 1; k <= parts; k++)
        if ((parts == 1 || llm_split_path(path, k, name, sizeof name)) && !stat(parts == 1 ? path : name, &sb))
            total += (size_t)sb.st_size;
    return total;
}

llm_status srv_load_model(const char *path, const char *want, void (*progress)(void *ctx, double done), void *ctx,
                          const _Atomic int *abort, llm_model **out, llm_error *err)
{
    int hashing = want && *want;
    uint32_t given = 1, named = (uint32_t)llm_split_path(path, 1, NULL, 0), parts = named ? named : 1;
    for (const char *c = want; hashing && (c = strchr(c, ',')); c++) given++;
    *out = NULL;
    if (hashing && given != parts)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%.300s: model_sha256 has %u digests for %u file%s (a split set: one "
                        "per part, comma-separated in part order)", path, given, parts, parts > 1 ? "s" : "");
    digest_check d = {.model = path, .want = want, .parts = parts,
                      .pi = {.abort = abort, .progress = progress, .ctx = ctx, .md = hashing ? EVP_MD_CTX_new() : NULL}};
    if (hashing && !d.pi.md)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for a SHA-256 context");
    d.pi.total = hashing ? parts_size(path, parts) : 0;
    sigjmp_buf jb;
    llm_status st;
    /* (a fault in the parse itself - the header cut between the open and its read, rarer still - loses
     * what the loader had opened: the mapping and its fd; the digest check catches its own) */
    if (sigsetjmp(jb, 1)) {
        bus_at = NULL;
        st = bus_error(path, err);
    } else {
        bus_at = &jb;
        st = llm_model_load_checked(path, hashing ? check_digest : NULL, &d, out, err);
        bus_at = NULL;
    }
    EVP_MD_CTX_free(d.pi.md);
    return st;
}

llm_status srv_load_page_in(const llm_model *m, void (*progress)(void *ctx, double done), void *ctx,
                            const _Atomic int *abort, llm_error *err)
{
    const gguf_file *g = m->gguf;
    page_in pi = {.abort = abort, .progress = progress, .ctx = ctx};
    for (uint32_t k = 0; k < gguf_n_parts(g); k++) {
        size_t n;
        gguf_part_bytes(g, k, &n);
        pi.total += n;
    }
    llm_status st = LLM_OK;
    for (uint32_t k = 0; k < gguf_n_parts(g) && !st; k++) {
        pi.p = gguf_part_bytes(g, k, &pi.n);
        st = read_part_guarded(&pi, gguf_part_name(g, k) ? gguf_part_name(g, k) : gguf_name(g), err);
    }
    if (!st && progress) /* (the loop reports every 64 MiB; the end always) */
        progress(ctx, 1.0);
    /* what was checked must be what is mapped from now on: a file rewritten in place meanwhile is refused */
    return st ? st : gguf_unchanged(g, err);
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
