/* backend_cuda.c - the CUDA backend: the backend interface over the kernels
 * in kernels/ and cuBLAS, on one device with one stream. Built into
 * libllm_cuda.so (loaded by backend_cuda_load.c) only when nvcc is present.
 *
 * Memory: weights are uploaded once per model (model_upload) into one
 * allocation; activations and KV pages come from buffer_alloc (cudaMalloc,
 * counted for /metrics). Index arrays arrive in host memory and go up
 * through a device staging area per kind (ids, positions, slots, attention
 * tables); an upload is skipped when the bytes equal the last ones of that
 * kind, which is the case for every layer after the first of a step.
 *
 * Matmul: batches of 1-8 rows read the weights in their own type (lk_gemv);
 * larger ones go to cuBLAS (cublasGemmEx, FP32 accumulation): F32 weights
 * as they are, F16/BF16 weights with the activations rounded to that type,
 * quantized weights dequantized to F16 first.
 *
 * Errors: every CUDA and cuBLAS return is checked; the first failure is
 * kept with the call's name and returned by the next operation that
 * returns a status. Thread-safety: one thread at a time per backend; each
 * operation selects the backend's device for the calling thread.
 *
 * This file: errors, memory, weights, NCCL, lifecycle and the interface
 * table; the operations and graphs are cuda_ops.c; what both share is
 * cuda_impl.h. */
#include "cuda_impl.h"

_Static_assert(LK_SAMPLE_NAN == LLM_SAMPLE_NAN, "a NaN row picks the same id on host and device");
_Static_assert(LK_SAMPLE_GREEDY_BELOW == LLM_SAMPLING_GREEDY_BELOW, "host and device agree on what is greedy");
_Static_assert((int)LK_T_F32 == (int)QT_F32 && (int)LK_T_F16 == (int)QT_F16 && (int)LK_T_BF16 == (int)QT_BF16 &&
                   (int)LK_T_Q4_0 == (int)QT_Q4_0 && (int)LK_T_Q8_0 == (int)QT_Q8_0 && (int)LK_T_Q4_K == (int)QT_Q4_K &&
                   (int)LK_T_Q6_K == (int)QT_Q6_K && (int)LK_T_Q4_1 == (int)QT_Q4_1 && (int)LK_T_Q5_0 == (int)QT_Q5_0 &&
                   (int)LK_T_Q5_1 == (int)QT_Q5_1 && (int)LK_T_Q2_K == (int)QT_Q2_K && (int)LK_T_Q3_K == (int)QT_Q3_K &&
                   (int)LK_T_Q5_K == (int)QT_Q5_K,
               "the kernels' type numbers are quant_type's");

/* Keeps the first failure since the last status returned (later ones are
 * its consequences). */
__attribute__((format(printf, 3, 4))) void cu_keep_failure(cu_ctx *c, llm_status st, const char *fmt, ...)
{
    if (c->failed)
        return;
    c->failed = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
}

/* The function's name in a stringified call, at most 64 characters. */
static int fn_len(const char *call)
{
    size_t n = strcspn(call, "(");
    return n < 64 ? (int)n : 64;
}

/* Keeps the first failure; returns 1 when `e` is one. The runtime's
 * last-error slot is cleared too: a failure that is not sticky would
 * otherwise be reported again by the next kernel launch's check
 * (lk_status reads cudaGetLastError) and fail an unrelated step. */
int cu_fail_cuda(cu_ctx *c, cudaError_t e, const char *call)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    cu_keep_failure(c, e == cudaErrorMemoryAllocation ? LLM_ERR_NOMEM : LLM_ERR_BACKEND, "%.*s on %s: %.200s", fn_len(call),
                 call, c->name, cudaGetErrorString(e));
    return 1;
}

int cu_fail_blas(cu_ctx *c, cublasStatus_t s, const char *call)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    cu_keep_failure(c, LLM_ERR_BACKEND, "%.*s on %s: %.200s", fn_len(call), call, c->name, cublasGetStatusString(s));
    return 1;
}

/* A kernel wrapper's return: a launch error, or LK_UNSUPPORTED. */
int cu_fail_kernel(cu_ctx *c, int rc, const char *kernel)
{
    if (rc == 0)
        return 0;
    if (rc == LK_UNSUPPORTED) {
        cu_keep_failure(c, LLM_ERR_UNSUPPORTED, "%.*s on %s: shape or type not supported", fn_len(kernel), kernel,
                     c->name);
        return 1;
    }
    return cu_fail_cuda(c, (cudaError_t)rc, kernel);
}


void cu_use_device(cu_ctx *c) { CU(c, cudaSetDevice(c->dev)); }

/* The kept failure as a status (and the message in the log line the
 * engine writes for it), cleared for the next step. */

llm_status cu_take_status(cu_ctx *c)
{
    llm_status st = c->failed;
    if (st)
        cu_graph_abort(c);
    if (st)
        fprintf(stderr, "cuda backend: %s\n", c->why);
    c->failed = LLM_OK;
    return st;
}

/* ---- memory -------------------------------------------------------------- */

static int track(cu_ctx *c, void *p, size_t bytes)
{
    if (c->n_allocs == c->cap_allocs) {
        int cap = c->cap_allocs ? 2 * c->cap_allocs : 32;
        cu_alloc *a = realloc(c->allocs, sizeof *a * (size_t)cap);
        if (!a)
            return -1;
        c->allocs = a;
        c->cap_allocs = cap;
    }
    c->allocs[c->n_allocs++] = (cu_alloc){p, bytes};
    c->used += bytes;
    return 0;
}

static void *cuda_buffer_alloc(llm_backend *b, size_t bytes)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is the caller's to report, not sticky */
        return NULL;
    }
    if (track(c, p, bytes)) {
        cudaFree(p);
        return NULL;
    }
    return p;
}

static void cuda_buffer_free(llm_backend *b, void *p)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    cu_graphs_drop(c);
    for (int i = 0; i < c->n_allocs; i++)
        if (c->allocs[i].p == p) {
            c->used -= c->allocs[i].bytes;
            c->allocs[i] = c->allocs[--c->n_allocs];
            break;
        }
    CU(c, cudaFree(p));
}

/* Kept back from the KV budget: cuBLAS workspaces, the scratch, graphs. */
#define CU_RESERVE ((size_t)1 << 30)

static size_t cuda_mem_available(llm_backend *b)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    size_t fr = 0, total = 0;
    if (CU(c, cudaMemGetInfo(&fr, &total)))
        return 0;
    return fr > CU_RESERVE ? fr - CU_RESERVE : 0;
}

/* Called from other threads than the driving one: touches no sticky
 * state (a failure leaves total and free 0). */
static void cuda_mem_stats(llm_backend *b, llm_backend_mem *out)
{
    cu_ctx *c = cu_ctx_of(b);
    snprintf(out->device, sizeof out->device, "%s", c->name);
    out->used = c->used;
    if (cudaSetDevice(c->dev) != cudaSuccess || cudaMemGetInfo(&out->free, &out->total) != cudaSuccess) {
        (void)cudaGetLastError();
        out->free = out->total = 0;
    }
}

/* A device buffer of at least `bytes` (grown, never shrunk; cudaFree
 * waits for the kernels that used the old one). */
void *cu_grow(cu_ctx *c, void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return *buf;
    if (c->g.mode != CU_EAGER) { /* a capture that would allocate: the warm-up step did not size it */
        cu_keep_failure(c, LLM_ERR_BACKEND, "cuda backend: a buffer grew during graph capture");
        return NULL;
    }
    cu_graphs_drop(c);
    if (*buf)
        CU(c, cudaFree(*buf));
    *buf = NULL;
    *cap = 0;
    if (CU(c, cudaMalloc(buf, bytes)))
        return NULL;
    *cap = bytes;
    return *buf;
}

void *cu_scratch_get(cu_ctx *c, size_t bytes) { return cu_grow(c, &c->scratch, &c->scratch_cap, bytes); }

/* Keeps an out-of-memory failure for n host indices; NULL for the caller. */
static int32_t *no_host_memory(cu_ctx *c, size_t n)
{
    cu_keep_failure(c, LLM_ERR_NOMEM, "cuda backend: no host memory for %zu indices", n);
    return NULL;
}

/* Host packing buffer of n int32. */
int32_t *cu_pack_get(cu_ctx *c, size_t n)
{
    if (n > c->pack_cap) {
        int32_t *p = realloc(c->pack, n * sizeof *p);
        if (!p)
            return no_host_memory(c, n);
        c->pack = p;
        c->pack_cap = n;
    }
    return c->pack;
}

/* The offset of the next arena region after `used` entries: 32-byte aligned. */
static size_t arena_next(size_t used) { return (used + 7) / 8 * 8; }

/* In a captured or replayed step: the arena region of this kind's last
 * array when it is the same host array, unchanged (positions for Q and K,
 * every layer's slots and tables), else the next region. Equality is by
 * the forward pass's structure, so every step of a shape makes the same
 * decisions and uses the same offsets. */
static const int32_t *stage_arena(cu_ctx *c, int kind, const int32_t *h, size_t n)
{
    cu_graphs *g = &c->g;
    if (g->last_src[kind] == h && g->last_n[kind] == n && n &&
        !memcmp(g->h_arena + g->last_off[kind], h, n * sizeof *h))
        return g->d_arena + g->last_off[kind];
    size_t off = arena_next(g->used);
    if (off + n > CU_ARENA_INTS) {
        cu_keep_failure(c, LLM_ERR_BACKEND, "cuda backend: a graph step's indices exceed the %zu-entry arena",
                     CU_ARENA_INTS);
        return NULL;
    }
    memcpy(g->h_arena + off, h, n * sizeof *h);
    g->used = off + n;
    g->last_off[kind] = off;
    g->last_n[kind] = n;
    g->last_src[kind] = h;
    return g->d_arena + off;
}

/* FNV-1a over the bytes of n indices. */
static uint64_t hash_ints(const int32_t *h, size_t n)
{
    const unsigned char *p = (const unsigned char *)h;
    uint64_t x = 1469598103934665603ull;
    for (size_t i = 0; i < n * sizeof *h; i++) x = (x ^ p[i]) * 1099511628211ull;
    return x;
}

/* What stage_arena would take for this array in a captured step of the
 * shape whose eager first step runs now: the same regions (arena_next),
 * reused on the same terms (same array, same contents), so a shape whose
 * indices cannot fit is never captured (it runs eagerly) instead of
 * failing its steps. The contents are compared by hash: in an eager step
 * there is no arena copy to compare with. */
static void arena_count(cu_graphs *g, int kind, const int32_t *h, size_t n)
{
    uint64_t hs = hash_ints(h, n);
    if (g->count_src[kind] == h && g->count_n[kind] == n && n && g->count_hash[kind] == hs)
        return;
    g->count_used = arena_next(g->count_used) + n;
    g->count_src[kind] = h;
    g->count_n[kind] = n;
    g->count_hash[kind] = hs;
}

/* The device copy of n host int32 of one kind; uploaded only when they
 * differ from the last ones (the stream orders the copy before later
 * kernels, and the host side is copied before cudaMemcpyAsync returns
 * because it is pageable). */
const int32_t *cu_stage_upload(cu_ctx *c, int kind, const int32_t *h, size_t n)
{
    if (c->g.mode != CU_EAGER)
        return stage_arena(c, kind, h, n);
    if (c->g.warm)
        arena_count(&c->g, kind, h, n);
    cu_stage *s = &c->stage[kind];
    if (n == s->n && s->dev && !memcmp(h, s->host, n * sizeof *h))
        return s->dev;
    if (n > s->cap) {
        size_t cap = n < 1024 ? 1024 : 2 * n, dev_bytes = s->cap * sizeof *h;
        int32_t *hp = realloc(s->host, cap * sizeof *hp);
        if (!hp)
            return no_host_memory(c, n);
        s->host = hp;
        s->n = 0; /* the device copy is new: nothing to reuse */
        if (!cu_grow(c, (void **)&s->dev, &dev_bytes, cap * sizeof *h)) {
            s->cap = 0;
            return NULL;
        }
        s->cap = cap;
    }
    if (CU(c, cudaMemcpyAsync(s->dev, h, n * sizeof *h, cudaMemcpyHostToDevice, c->stream)))
        return NULL;
    memcpy(s->host, h, n * sizeof *h);
    s->n = n;
    return s->dev;
}

/* ---- weights ------------------------------------------------------------- */

typedef struct up_state {
    cu_ctx *c;
    char *base;        /* NULL: only sum the sizes */
    size_t off;
} up_state;

/* Reserves room for bytes at the next 256-byte offset and, with base set,
 * queues the copy of src there on the backend's stream (so every kernel
 * that reads it is ordered after it); returns the device address. */
static const void *put(up_state *u, const void *src, size_t bytes)
{
    size_t at = u->off;
    u->off += (bytes + 255) / 256 * 256;
    if (!u->base || !src)
        return NULL;
    CU(u->c, cudaMemcpyAsync(u->base + at, src, bytes, cudaMemcpyHostToDevice, u->c->stream));
    return u->base + at;
}

static void put_weight(up_state *u, const llm_weight *src, llm_weight *dst)
{
    dst->data = put(u, src->data, (size_t)src->rows * src->row_bytes);
}

static const float *put_vec(up_state *u, const float *v, size_t n) { return v ? put(u, v, n * sizeof(float)) : NULL; }

/* Walks every tensor of the host model m, setting d's pointers to their
 * device copies (with u->base NULL: only the sizes are summed). */
static void upload_all(up_state *u, const llm_model *m, llm_model *d)
{
    const llm_hparams *hp = &m->hp;
    size_t E = (size_t)hp->n_embd, qd = (size_t)hp->n_head * hp->head_dim, kvd = (size_t)hp->n_head_kv * hp->head_dim;
    int tied = m->output.data == m->tok_embd.data;
    put_weight(u, &m->tok_embd, &d->tok_embd);
    if (tied)
        d->output.data = d->tok_embd.data;
    else
        put_weight(u, &m->output, &d->output);
    d->output_norm = put_vec(u, m->output_norm, E);
    d->rope_freqs = put_vec(u, m->rope_freqs, (size_t)hp->rot_dim / 2);
    for (int l = 0; l < hp->n_layer; l++) {
        const llm_layer *L = &m->layers[l];
        llm_layer *D = &d->layers[l];
        D->attn_norm = put_vec(u, L->attn_norm, E);
        D->ffn_norm = put_vec(u, L->ffn_norm, E);
        D->attn_q_norm = put_vec(u, L->attn_q_norm, (size_t)hp->head_dim);
        D->attn_k_norm = put_vec(u, L->attn_k_norm, (size_t)hp->head_dim);
        D->attn_post_norm = put_vec(u, L->attn_post_norm, E);
        D->ffn_post_norm = put_vec(u, L->ffn_post_norm, E);
        D->bq = put_vec(u, L->bq, qd);
        D->bk = put_vec(u, L->bk, kvd);
        D->bv = put_vec(u, L->bv, kvd);
        const llm_weight *ms[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->w_router};
        llm_weight *ds[] = {&D->wq, &D->wk, &D->wv, &D->wo, &D->w_gate, &D->w_up, &D->w_down, &D->w_router};
        for (size_t i = 0; i < sizeof ds / sizeof *ds; i++) put_weight(u, ms[i], ds[i]);
        for (int e = 0; e < hp->n_expert; e++) { /* D's expert arrays are the upload's own (experts_copy) */
            put_weight(u, &L->exp_gate[e], &D->exp_gate[e]);
            put_weight(u, &L->exp_up[e], &D->exp_up[e]);
            put_weight(u, &L->exp_down[e], &D->exp_down[e]);
        }
    }
}

/* The device model's own expert views (the host model's arrays must not
 * be written): one array of 3 * n_expert per layer, copied from m's. */
static llm_weight *experts_copy(const llm_model *m, llm_layer *layers)
{
    size_t ne = (size_t)m->hp.n_expert;
    if (!ne)
        return NULL;
    llm_weight *x = malloc(sizeof *x * 3 * ne * (size_t)m->hp.n_layer);
    for (int l = 0; x && l < m->hp.n_layer; l++) {
        llm_weight *g = x + 3 * ne * (size_t)l;
        memcpy(g, m->layers[l].exp_gate, sizeof *g * ne);
        memcpy(g + ne, m->layers[l].exp_up, sizeof *g * ne);
        memcpy(g + 2 * ne, m->layers[l].exp_down, sizeof *g * ne);
        layers[l].exp_gate = g;
        layers[l].exp_up = g + ne;
        layers[l].exp_down = g + 2 * ne;
    }
    return x;
}

static void model_free(cu_model *cm)
{
    if (cm) {
        free(cm->m.layers);
        free(cm->rope_host);
        free(cm->experts);
        free(cm);
    }
}

/* The first matrix of m whose type this backend's matmul cannot use, or NULL. */
static const char *unsupported_matrix(const llm_model *m, quant_type *t)
{
    static const char *const names[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    if (!cu_gemv_type(*t = m->output.type))
        return "output";
    if (!cu_gemv_type(*t = m->tok_embd.type))
        return "token_embd";
    for (int l = 0; l < m->hp.n_layer; l++) {
        const llm_layer *L = &m->layers[l];
        const llm_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof w / sizeof *w; i++)
            if (!cu_gemv_type(*t = w[i]->type))
                return names[i];
        if (m->hp.n_expert && !cu_gemv_type(*t = L->w_router.type))
            return "ffn_gate_inp";
        if (m->hp.n_expert && (!cu_gemv_type(*t = L->exp_gate[0].type) || !cu_gemv_type(*t = L->exp_up[0].type) ||
                               !cu_gemv_type(*t = L->exp_down[0].type)))
            return "ffn_*_exps";
    }
    return NULL;
}

/* One device allocation for every tensor (sized by a first walk), the
 * copies queued on the stream and waited for (they read the host model,
 * which may go once this returns). */
static llm_status cuda_model_upload(llm_backend *b, const llm_model *m, llm_model **dev, llm_error *err)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    *dev = NULL;
    quant_type bad;
    const char *which = unsupported_matrix(m, &bad);
    if (which) /* refused at load, not at every request's first matmul */
        return llm_errf(err, LLM_ERR_UNSUPPORTED, "cuda backend: %s has %s weights (%s): not supported on CUDA",
                        m->name, quant_type_name(bad), which);
    llm_status st = LLM_ERR_NOMEM;
    size_t nf = m->rope_freqs ? (size_t)m->hp.rot_dim / 2 : 0, need = 0, fr = 0, total = 0;
    cu_model *cm = calloc(1, sizeof *cm);
    llm_layer *layers = calloc((size_t)m->hp.n_layer + 1, sizeof *layers); /* + 1: never a zero-size request */
    float *rope = nf ? malloc(sizeof *rope * nf) : NULL;
    if (!cm || !layers || (nf && !rope)) {
        free(layers);
        free(rope);
        llm_errf(err, st, "cuda backend: no host memory to upload %s", m->name);
        goto out;
    }
    cm->m = *m;
    memcpy(layers, m->layers, sizeof *layers * (size_t)m->hp.n_layer);
    cm->m.layers = layers;
    if (m->hp.n_expert && !(cm->experts = experts_copy(m, layers))) {
        llm_errf(err, st, "cuda backend: no host memory to upload %s", m->name);
        cm->rope_host = rope;
        goto out;
    }
    cm->m.owned = NULL;
    cm->m.n_owned = 0;
    if (nf)
        memcpy(rope, m->rope_freqs, sizeof *rope * nf);
    cm->rope_host = rope;
    up_state u = {c, NULL, 0};
    upload_all(&u, m, &cm->m); /* sizes only */
    need = u.off;
    CU(c, cudaMemGetInfo(&fr, &total));
    if (c->failed || need > fr || cudaMalloc(&cm->base, need) != cudaSuccess) {
        (void)cudaGetLastError();
        c->failed = LLM_OK;
        cm->base = NULL;
        llm_errf(err, st, "cuda backend: the weights of %s need %zu MiB on %s; %zu MiB of %zu MiB are free", m->name,
                 need >> 20, c->name, fr >> 20, total >> 20);
        goto out;
    }
    u = (up_state){c, cm->base, 0};
    upload_all(&u, m, &cm->m);
    if (!c->failed)
        CU(c, cudaStreamSynchronize(c->stream));
    st = cu_take_status(c);
    if (st || track(c, cm->base, need)) {
        llm_errf(err, st ? st : LLM_ERR_NOMEM, "cuda backend: uploading the weights of %s to %s failed", m->name, c->name);
        st = st ? st : LLM_ERR_NOMEM;
        goto out;
    }
    cm->next = c->models;
    c->models = cm;
    *dev = &cm->m;
    return LLM_OK;
out:
    if (cm && cm->base)
        cudaFree(cm->base);
    model_free(cm);
    return st;
}

static void cuda_model_release(llm_backend *b, llm_model *dev)
{
    cu_model *cm = (cu_model *)dev;
    cu_ctx *c = cu_ctx_of(b);
    for (cu_model **p = &c->models; *p; p = &(*p)->next)
        if (*p == cm) {
            *p = cm->next;
            break;
        }
    cuda_buffer_free(b, cm->base);
    model_free(cm);
}

/* ---- NCCL all-reduce ----------------------------------------------------- */
#ifndef LLM_NO_NCCL

typedef struct nccl_comm {
    int n;
    ncclComm_t comm[LLM_MAX_RANKS];
    cu_ctx *rank[LLM_MAX_RANKS];
    int devs[LLM_MAX_RANKS];
    int aborted;
    pthread_mutex_t mu;
} nccl_comm;

static llm_status nccl_allreduce(llm_comm *cm, int rank, float *buf, size_t n)
{
    nccl_comm *nc = cm->ctx;
    cu_ctx *c = nc->rank[rank];
    cu_use_device(c);
    if (nc->aborted)
        return LLM_ERR_CANCELLED;
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, nc->comm[rank], c->stream);
    if (r != ncclSuccess) {
        cu_keep_failure(c, LLM_ERR_BACKEND, "ncclAllReduce on %s: %s", c->name, ncclGetErrorString(r));
        return cu_take_status(c);
    }
    return LLM_OK;
}

/* A rank failed: the others' pending collectives would wait forever, so
 * the communicators are torn down and built again at reset. */
static void nccl_abort(llm_comm *cm)
{
    nccl_comm *nc = cm->ctx;
    pthread_mutex_lock(&nc->mu);
    if (!nc->aborted)
        for (int r = 0; r < nc->n; r++) ncclCommAbort(nc->comm[r]);
    nc->aborted = 1;
    pthread_mutex_unlock(&nc->mu);
}

static void nccl_reset(llm_comm *cm)
{
    nccl_comm *nc = cm->ctx;
    if (nc->aborted && ncclCommInitAll(nc->comm, nc->n, nc->devs) == ncclSuccess)
        nc->aborted = 0;
}

static void nccl_free(llm_comm *cm)
{
    nccl_comm *nc = cm->ctx;
    if (!nc->aborted)
        for (int r = 0; r < nc->n; r++) ncclCommDestroy(nc->comm[r]);
    pthread_mutex_destroy(&nc->mu);
    free(nc);
    free(cm);
}

static const struct llm_comm_i nccl_iface = {"nccl", nccl_allreduce, nccl_abort, nccl_reset, nccl_free};

static llm_status cuda_comm_new(llm_backend *const *ranks, int n, llm_comm **out, llm_error *err)
{
    *out = NULL;
    llm_comm *cm = calloc(1, sizeof *cm);
    nccl_comm *nc = calloc(1, sizeof *nc);
    if (!cm || !nc || n > LLM_MAX_RANKS) {
        free(cm);
        free(nc);
        return llm_errf(err, LLM_ERR_NOMEM, "nccl: no memory for %d ranks", n);
    }
    nc->n = n;
    for (int r = 0; r < n; r++) {
        nc->rank[r] = cu_ctx_of(ranks[r]);
        nc->devs[r] = nc->rank[r]->dev;
        nc->rank[r]->in_comm = 1; /* collectives are not captured into graphs here */
    }
    ncclResult_t res = ncclCommInitAll(nc->comm, n, nc->devs);
    if (res != ncclSuccess || pthread_mutex_init(&nc->mu, NULL)) {
        free(cm);
        free(nc);
        return llm_errf(err, LLM_ERR_BACKEND, "nccl: ncclCommInitAll over %d devices: %s", n, ncclGetErrorString(res));
    }
    *cm = (llm_comm){&nccl_iface, nc, n};
    *out = cm;
    return LLM_OK;
}
#else
static llm_status cuda_comm_new(llm_backend *const *ranks, int n, llm_comm **out, llm_error *err)
{
    (void)ranks;
    *out = NULL;
    return llm_errf(err, LLM_ERR_UNSUPPORTED, "cuda backend: built without NCCL (nccl.h not found): no tensor parallel %d",
                    n);
}
#endif

/* ---- lifecycle ----------------------------------------------------------- */

static void cuda_free(llm_backend *b)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    for (int k = 0; k < ST_KINDS; k++) {
        cudaFree(c->stage[k].dev);
        free(c->stage[k].host);
    }
    cu_graphs_free(c);
    cudaFree(c->scratch);
    cudaFree(c->att_work);
    cudaFree(c->lora_work);
    cudaFree(c->blas_ws);
    for (int i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i].p); /* whatever callers leaked */
    if (c->blas)
        cublasDestroy(c->blas);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    free(c->allocs);
    free(c->pack);
    while (c->models) { /* models a caller did not release */
        cu_model *cm = c->models;
        c->models = cm->next;
        model_free(cm);
    }
    free(c);
    free(b);
}

static const struct llm_backend_i cuda_iface = {
    .name = "cuda",
    .free = cuda_free,
    .matmul = cuda_matmul,
    .lora = cuda_lora,
    .rmsnorm = cuda_rmsnorm,
    .rope = cuda_rope,
    .swiglu = cuda_swiglu,
    .geglu = cuda_geglu,
    .add = cuda_add,
    .scale = cuda_scale,
    .add_bias = cuda_add_bias,
    .add_rows = cuda_add_rows,
    .get_rows = cuda_get_rows,
    .kv_write = cuda_kv_write,
    .attention = cuda_attention,
    .kv_copy = cuda_kv_copy,
    .buffer_alloc = cuda_buffer_alloc,
    .buffer_free = cuda_buffer_free,
    .mem_available = cuda_mem_available,
    .comm_new = cuda_comm_new,
    .model_upload = cuda_model_upload,
    .model_release = cuda_model_release,
    .read = cuda_read,
    .write = cuda_write,
    .sample = cuda_sample,
    .step_begin = cuda_step_begin,
    .mem_stats = cuda_mem_stats,
};

static llm_status open_device(cu_ctx *c, llm_error *err)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0)
        return llm_errf(err, LLM_ERR_UNSUPPORTED, "cuda backend: no CUDA device (%s)",
                        e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    if (c->dev < 0 || c->dev >= n)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "cuda backend: device %d asked for; this machine has %d", c->dev, n);
    struct cudaDeviceProp p;
    if ((e = cudaSetDevice(c->dev)) || (e = cudaGetDeviceProperties(&p, c->dev)))
        return llm_errf(err, LLM_ERR_BACKEND, "cuda backend: device %d: %s", c->dev, cudaGetErrorString(e));
    snprintf(c->name, sizeof c->name, "%.80s (cuda:%d)", p.name, c->dev);
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)))
        return llm_errf(err, LLM_ERR_BACKEND, "cuda backend: cudaStreamCreate on %s: %s", c->name, cudaGetErrorString(e));
    cublasStatus_t s = cublasCreate(&c->blas);
    if (s == CUBLAS_STATUS_SUCCESS)
        s = cublasSetStream(c->blas, c->stream);
    if (s != CUBLAS_STATUS_SUCCESS)
        return llm_errf(err, LLM_ERR_BACKEND, "cuda backend: cublasCreate on %s: %s", c->name, cublasGetStatusString(s));
    size_t ws = (size_t)32 << 20;
    if ((e = cudaMalloc(&c->blas_ws, ws)) || (s = cublasSetWorkspace(c->blas, c->blas_ws, ws)) != CUBLAS_STATUS_SUCCESS)
        return llm_errf(err, LLM_ERR_BACKEND, "cuda backend: the cuBLAS workspace on %s: %s", c->name,
                        e ? cudaGetErrorString(e) : cublasGetStatusString(s));
    cu_graphs_init(c);
    return LLM_OK;
}

/* The plugin's entry point (backend_cuda_load.c finds it by name). */
__attribute__((visibility("default"))) llm_status llm_cuda_plugin_new(const llm_cuda_config *cfg, llm_backend **out,
                                                                       llm_error *err);
llm_status llm_cuda_plugin_new(const llm_cuda_config *cfg, llm_backend **out, llm_error *err)
{
    *out = NULL;
    quant_init();
    llm_backend *b = calloc(1, sizeof *b);
    cu_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return llm_errf(err, LLM_ERR_NOMEM, "cuda backend: no memory");
    }
    c->dev = cfg ? cfg->device : 0;
    b->iface = &cuda_iface;
    b->ctx = c;
    llm_status st = open_device(c, err);
    if (st) {
        if (c->stream)
            cuda_free(b);
        else {
            free(c);
            free(b);
        }
        return st;
    }
    *out = b;
    return LLM_OK;
}
