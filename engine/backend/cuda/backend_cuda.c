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
 * operation selects the backend's device for the calling thread. */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifndef LLM_NO_NCCL
#include <nccl.h>
#endif
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/backend.h"
#include "llm/model.h"
#include "llm/sampler.h"
#include "llm/tp.h"
#include "llm_kernels.h"

_Static_assert(LK_SAMPLE_NAN == LLM_SAMPLE_NAN, "a NaN row picks the same id on host and device");
_Static_assert(LK_SAMPLE_GREEDY_BELOW == LLM_SAMPLING_GREEDY_BELOW, "host and device agree on what is greedy");
_Static_assert((int)LK_T_F32 == (int)QT_F32 && (int)LK_T_F16 == (int)QT_F16 && (int)LK_T_BF16 == (int)QT_BF16 &&
                   (int)LK_T_Q4_0 == (int)QT_Q4_0 && (int)LK_T_Q8_0 == (int)QT_Q8_0 && (int)LK_T_Q4_K == (int)QT_Q4_K &&
                   (int)LK_T_Q6_K == (int)QT_Q6_K && (int)LK_T_Q4_1 == (int)QT_Q4_1 && (int)LK_T_Q5_0 == (int)QT_Q5_0 &&
                   (int)LK_T_Q5_1 == (int)QT_Q5_1 && (int)LK_T_Q2_K == (int)QT_Q2_K && (int)LK_T_Q3_K == (int)QT_Q3_K &&
                   (int)LK_T_Q5_K == (int)QT_Q5_K,
               "the kernels' type numbers are quant_type's");

enum { ST_IDS, ST_POS, ST_SLOT, ST_ATTN, ST_SAMPLE, ST_TILES, ST_FREQ, ST_ROWS, ST_KINDS };

typedef struct cu_alloc {
    void *p;
    size_t bytes;
} cu_alloc;

typedef struct cu_stage {
    int32_t *dev;        /* device copy */
    int32_t *host;       /* what was last uploaded */
    size_t n, cap;       /* elements */
} cu_stage;

/* Decode steps replayed as CUDA graphs, one per shape (rows, logit rows,
 * sequences, context bucket). A shape's first step runs eagerly (sizing
 * every buffer), its second is captured, later ones replay: the operations
 * then only pack their index arrays into a pinned arena (same offsets
 * every time: same calls, same sizes, contexts padded to the bucket), which
 * goes up in one copy before the graph launches. Any buffer freed or grown
 * drops every graph (they hold its address). */
enum { CU_EAGER, CU_CAPTURE, CU_REPLAY };
#define CU_MAX_GRAPHS 64
#define CU_ARENA_INTS ((size_t)1 << 20)

typedef struct cu_graph {
    int key[4];
    int state;                /* 1: seen once (ran eagerly); 2: captured; -1: runs eagerly (capture failed, or too big) */
    size_t need;              /* arena entries its steps use (counted in the eager step) */
    cudaGraphExec_t exec;
} cu_graph;

typedef struct cu_graphs {
    int on;                   /* LLM_CUDA_GRAPHS unset or 1 */
    int mode;                 /* CU_EAGER, CU_CAPTURE or CU_REPLAY for the current step */
    cu_graph *cur;
    cu_graph list[CU_MAX_GRAPHS];
    int n;
    int32_t *h_arena, *d_arena; /* pinned host and device, CU_ARENA_INTS each */
    size_t used;
    size_t last_off[ST_KINDS], last_n[ST_KINDS]; /* per staging kind: this step's last region */
    const int32_t *last_src[ST_KINDS];    /* ... and the host array it came from (reused for the same array, unchanged) */
    cu_graph *warm;           /* the shape whose first (eager) step runs: its arena use is counted */
    size_t count_used, count_n[ST_KINDS];
    const int32_t *count_src[ST_KINDS];
    uint64_t count_hash[ST_KINDS];
    int pad;                  /* this step's attention pads its tables to max_len (a graph's shape, or its warm-up) */
    int32_t *h_ids, *d_ids;   /* the picked ids: pinned host, device (512 rows) */
    int max_len;              /* the step's context bucket (attention pads to it) */
} cu_graphs;

/* The uploaded model: a copy of the host model whose pointers lead into
 * one device allocation. */
typedef struct cu_model {
    llm_model m;       /* first: the forward pass sees this */
    void *base;
    float *rope_host;  /* host copy of m.rope_freqs' values (cuda_rope computes the table), or NULL */
    llm_weight *experts; /* the layers' expert views (gate, up, down per layer), pointing at device copies */
    struct cu_model *next;
} cu_model;

typedef struct cu_ctx {
    int dev;
    char name[96];
    cudaStream_t stream;
    cublasHandle_t blas;
    llm_status failed;   /* first failure since the last status returned */
    char why[LLM_ERROR_MSG_MAX];
    cu_alloc *allocs;
    int n_allocs, cap_allocs;
    _Atomic size_t used; /* read by /metrics threads */
    cu_stage stage[ST_KINDS];
    int32_t *pack;       /* host packing buffer */
    size_t pack_cap;
    void *scratch;       /* cuBLAS path: half activations + dequantized weights */
    size_t scratch_cap;
    void *att_work;      /* attention's split partial results */
    size_t att_cap;
    void *blas_ws;       /* cuBLAS workspace (no allocation inside a capture) */
    cu_graphs g;         /* decode steps as CUDA graphs */
    int in_comm;         /* a tensor-parallel rank: steps are not captured */
    cu_model *models;    /* uploaded and not released (their host copies of the RoPE factors) */
    int32_t freq_bits[LLM_MAX_ROT_DIM / 2]; /* the RoPE table as staged: float bits */
} cu_ctx;

static cu_ctx *ctx_of(llm_backend *b) { return b->ctx; }
static void graphs_drop(cu_ctx *c);

/* Keeps the first failure since the last status returned (later ones are
 * its consequences). */
__attribute__((format(printf, 3, 4))) static void keep_failure(cu_ctx *c, llm_status st, const char *fmt, ...)
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
static int fail_cuda(cu_ctx *c, cudaError_t e, const char *call)
{
    if (e == cudaSuccess)
        return 0;
    (void)cudaGetLastError();
    keep_failure(c, e == cudaErrorMemoryAllocation ? LLM_ERR_NOMEM : LLM_ERR_BACKEND, "%.*s on %s: %.200s", fn_len(call),
                 call, c->name, cudaGetErrorString(e));
    return 1;
}

static int fail_blas(cu_ctx *c, cublasStatus_t s, const char *call)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 0;
    keep_failure(c, LLM_ERR_BACKEND, "%.*s on %s: %.200s", fn_len(call), call, c->name, cublasGetStatusString(s));
    return 1;
}

/* A kernel wrapper's return: a launch error, or LK_UNSUPPORTED. */
static int fail_kernel(cu_ctx *c, int rc, const char *kernel)
{
    if (rc == 0)
        return 0;
    if (rc == LK_UNSUPPORTED) {
        keep_failure(c, LLM_ERR_UNSUPPORTED, "%.*s on %s: shape or type not supported", fn_len(kernel), kernel,
                     c->name);
        return 1;
    }
    return fail_cuda(c, (cudaError_t)rc, kernel);
}

#define CU(c, call) fail_cuda((c), (call), #call)
/* Work that a graph replays is not launched again while replaying. */
#define BLAS(c, call) ((c)->g.mode == CU_REPLAY ? 0 : fail_blas((c), (call), #call))
#define LK(c, call) ((c)->g.mode == CU_REPLAY ? 0 : fail_kernel((c), (call), #call))

static void use_device(cu_ctx *c) { CU(c, cudaSetDevice(c->dev)); }

/* The kept failure as a status (and the message in the log line the
 * engine writes for it), cleared for the next step. */
static void graph_abort(cu_ctx *c);

static llm_status take_status(cu_ctx *c)
{
    llm_status st = c->failed;
    if (st)
        graph_abort(c);
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
    cu_ctx *c = ctx_of(b);
    use_device(c);
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
    cu_ctx *c = ctx_of(b);
    use_device(c);
    graphs_drop(c);
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
    cu_ctx *c = ctx_of(b);
    use_device(c);
    size_t fr = 0, total = 0;
    if (CU(c, cudaMemGetInfo(&fr, &total)))
        return 0;
    return fr > CU_RESERVE ? fr - CU_RESERVE : 0;
}

/* Called from other threads than the driving one: touches no sticky
 * state (a failure leaves total and free 0). */
static void cuda_mem_stats(llm_backend *b, llm_backend_mem *out)
{
    cu_ctx *c = ctx_of(b);
    snprintf(out->device, sizeof out->device, "%s", c->name);
    out->used = c->used;
    if (cudaSetDevice(c->dev) != cudaSuccess || cudaMemGetInfo(&out->free, &out->total) != cudaSuccess) {
        (void)cudaGetLastError();
        out->free = out->total = 0;
    }
}

/* A device buffer of at least `bytes` (grown, never shrunk; cudaFree
 * waits for the kernels that used the old one). */
static void *grow(cu_ctx *c, void **buf, size_t *cap, size_t bytes)
{
    if (bytes <= *cap)
        return *buf;
    if (c->g.mode != CU_EAGER) { /* a capture that would allocate: the warm-up step did not size it */
        keep_failure(c, LLM_ERR_BACKEND, "cuda backend: a buffer grew during graph capture");
        return NULL;
    }
    graphs_drop(c);
    if (*buf)
        CU(c, cudaFree(*buf));
    *buf = NULL;
    *cap = 0;
    if (CU(c, cudaMalloc(buf, bytes)))
        return NULL;
    *cap = bytes;
    return *buf;
}

static void *scratch(cu_ctx *c, size_t bytes) { return grow(c, &c->scratch, &c->scratch_cap, bytes); }

/* Keeps an out-of-memory failure for n host indices; NULL for the caller. */
static int32_t *no_host_memory(cu_ctx *c, size_t n)
{
    keep_failure(c, LLM_ERR_NOMEM, "cuda backend: no host memory for %zu indices", n);
    return NULL;
}

/* Host packing buffer of n int32. */
static int32_t *pack(cu_ctx *c, size_t n)
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
        keep_failure(c, LLM_ERR_BACKEND, "cuda backend: a graph step's indices exceed the %zu-entry arena",
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
static const int32_t *stage(cu_ctx *c, int kind, const int32_t *h, size_t n)
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
        if (!grow(c, (void **)&s->dev, &dev_bytes, cap * sizeof *h)) {
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

/* ---- graphs of decode steps --------------------------------------------- */

static void graphs_drop(cu_ctx *c)
{
    for (int i = 0; i < c->g.n; i++)
        if (c->g.list[i].state == 2)
            cudaGraphExecDestroy(c->g.list[i].exec);
    c->g.n = 0;
    c->g.cur = NULL;
    c->g.warm = NULL;
}

/* A failed or abandoned step: an open capture is closed and its shape is
 * not captured again. */
static void graph_abort(cu_ctx *c)
{
    if (c->g.mode == CU_CAPTURE) {
        cudaGraph_t gr = NULL;
        cudaStreamEndCapture(c->stream, &gr);
        if (gr)
            cudaGraphDestroy(gr);
        (void)cudaGetLastError();
        if (c->g.cur)
            c->g.cur->state = -1;
    }
    c->g.mode = CU_EAGER;
}

static cu_graph *graph_find(cu_graphs *g, const int key[4])
{
    for (int i = 0; i < g->n; i++)
        if (!memcmp(g->list[i].key, key, sizeof g->list[i].key))
            return &g->list[i];
    if (g->n == CU_MAX_GRAPHS)
        return NULL;
    cu_graph *e = &g->list[g->n++];
    memcpy(e->key, key, sizeof e->key);
    e->state = 0;
    e->need = 0;
    return e;
}

static void cuda_step_begin(llm_backend *b, const llm_step_info *si)
{
    cu_ctx *c = ctx_of(b);
    cu_graphs *g = &c->g;
    use_device(c);
    if (g->mode != CU_EAGER)
        graph_abort(c); /* the last step ended without its pick */
    g->pad = 0;
    g->warm = NULL;
    if (c->in_comm || !si->pick || !si->decode || si->host_sync || si->n_rows > 512 || c->failed)
        return;
    /* a graph's shape: padded attention whether or not graphs are on, so
     * LLM_CUDA_GRAPHS=0 runs the very same kernels, eagerly */
    int bucket = 256;
    while (bucket < si->max_len) bucket *= 2;
    g->max_len = bucket;
    g->pad = 1;
    int key[4] = {si->n_rows, si->n_logits, si->n_seqs, bucket};
    cu_graph *e = g->on ? graph_find(g, key) : NULL;
    if (!e || e->state < 0)
        return;
    if (e->state == 0) { /* first of its shape: eager, sizing the buffers as the graph will use them */
        e->state = 1;
        g->warm = e;
        g->count_used = 0;
        memset(g->count_src, 0, sizeof g->count_src);
        return;
    }
    if (e->state == 1 && e->need > CU_ARENA_INTS) {
        e->state = -1; /* e.g. 512 sequences at a 32768 bucket: the tables alone are 2^20 entries */
        return;
    }
    if (e->state == 1 && cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError(); /* not the step's failure: this shape runs eagerly from now on */
        e->state = -1;
        return;
    }
    g->mode = e->state == 1 ? CU_CAPTURE : CU_REPLAY;
    g->cur = e;
    g->used = 0;
    memset(g->last_n, 0, sizeof g->last_n);
    memset(g->last_src, 0, sizeof g->last_src);
}

/* The end of a captured or replayed step: (capture: instantiate), indices
 * up, the graph launched, the ids back. */
static llm_status graph_finish(cu_ctx *c, const int32_t *dp, int n_rows, int n_vocab, const float *logits, int32_t *out)
{
    cu_graphs *g = &c->g;
    if (g->mode == CU_CAPTURE) {
        cudaGraph_t gr = NULL;
        LK(c, lk_sample(logits, n_rows, n_vocab, (const lk_sample_params *)dp, g->d_ids, c->stream));
        CU(c, cudaMemcpyAsync(g->h_ids, g->d_ids, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyDeviceToHost, c->stream));
        if (c->failed)
            return take_status(c);
        g->mode = CU_EAGER; /* the capture is closed either way */
        if (CU(c, cudaStreamEndCapture(c->stream, &gr)) || CU(c, cudaGraphInstantiate(&g->cur->exec, gr, 0))) {
            g->cur->state = -1;
            if (gr)
                cudaGraphDestroy(gr);
            return take_status(c);
        }
        cudaGraphDestroy(gr);
        g->cur->state = 2;
    }
    g->mode = CU_EAGER;
    int launched = !CU(c, cudaMemcpyAsync(g->d_arena, g->h_arena, g->used * sizeof(int32_t), cudaMemcpyHostToDevice,
                                          c->stream)) &&
                   !CU(c, cudaGraphLaunch(g->cur->exec, c->stream));
    /* synchronised even when the launch failed: the queued arena copy reads
     * the pinned arena, which the next step rewrites */
    if (!CU(c, cudaStreamSynchronize(c->stream)) && launched)
        memcpy(out, g->h_ids, sizeof(int32_t) * (size_t)n_rows);
    if (!launched) { /* this shape's graph is not used again */
        cudaGraphExecDestroy(g->cur->exec);
        g->cur->state = -1;
    }
    return take_status(c);
}

static void graphs_init(cu_ctx *c)
{
    const char *env = getenv("LLM_CUDA_GRAPHS");
    cu_graphs *g = &c->g;
    g->on = !env || strtol(env, NULL, 10) != 0;
    if (g->on && (cudaMallocHost((void **)&g->h_arena, CU_ARENA_INTS * sizeof(int32_t)) != cudaSuccess ||
                  cudaMalloc((void **)&g->d_arena, CU_ARENA_INTS * sizeof(int32_t)) != cudaSuccess ||
                  cudaMallocHost((void **)&g->h_ids, 512 * sizeof(int32_t)) != cudaSuccess ||
                  cudaMalloc((void **)&g->d_ids, 512 * sizeof(int32_t)) != cudaSuccess)) {
        (void)cudaGetLastError();
        g->on = 0; /* eager steps still work */
    }
}

static void graphs_free(cu_ctx *c)
{
    graphs_drop(c);
    cudaFreeHost(c->g.h_arena);
    cudaFree(c->g.d_arena);
    cudaFreeHost(c->g.h_ids);
    cudaFree(c->g.d_ids);
}

/* ---- operations ---------------------------------------------------------- */

static int gemv_type(quant_type t)
{
    return quant_supported(t) && t != QT_Q8_K; /* lk_weight_type: every loadable type */
}

/* Quantized weights are dequantized to F32 in slabs of at most this many
 * bytes per cuBLAS call (the scratch stays this size whatever the matrix:
 * an 8B model's output matrix would be 2 GiB). */
#define CU_SLAB_BYTES ((size_t)64 << 20)

/* y (n_tok, rows) = x . W^T through cuBLAS (column-major: C = A^T B with
 * A = W as (cols, rows), B = x as (cols, n_tok)). F32 weights as they are;
 * F16/BF16 weights with the activations rounded to that type (F16: finite
 * only while |x| < 65504); quantized weights dequantized to F32, slab by
 * slab of rows, against float activations with TF32 tensor-core math
 * (float range: activations above 65504 stay finite). */
static void gemm(cu_ctx *c, const llm_weight *w, const float *x, int n_tok, float *y)
{
    int rows = (int)w->rows, cols = (int)w->cols;
    float one = 1.f, zero = 0.f;
    if (w->type == QT_F32) {
        BLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tok, cols, &one, w->data, CUDA_R_32F, cols, x,
                             CUDA_R_32F, cols, &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    if (w->type == QT_F16 || w->type == QT_BF16) {
        int bf16 = w->type == QT_BF16;
        char *s = scratch(c, (size_t)n_tok * cols * 2);
        if (!s || LK(c, lk_to_half(x, (size_t)n_tok * cols, bf16, s, c->stream)))
            return;
        cudaDataType ht = bf16 ? CUDA_R_16BF : CUDA_R_16F;
        BLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tok, cols, &one, w->data, ht, cols, s, ht, cols,
                             &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    int slab = (int)(CU_SLAB_BYTES / ((size_t)cols * sizeof(float)));
    slab = slab < 1 ? 1 : slab > rows ? rows : slab;
    float *s = scratch(c, (size_t)slab * cols * sizeof(float));
    for (int r0 = 0; s && r0 < rows && !c->failed; r0 += slab) {
        int n = rows - r0 < slab ? rows - r0 : slab;
        if (LK(c, lk_dequant_f32((int)w->type, (const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes, n, cols,
                                 s, c->stream)))
            return;
        BLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n_tok, cols, &one, s, CUDA_R_32F, cols, x, CUDA_R_32F,
                             cols, &zero, y + r0, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
    }
}

static llm_status cuda_matmul(llm_backend *b, const llm_matmul *ops, int n_ops, const float *x, int n_tok)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    for (int i = 0; i < n_ops && !c->failed; i++) {
        const llm_weight *w = ops[i].w;
        if (!gemv_type(w->type))
            keep_failure(c, LLM_ERR_UNSUPPORTED, "cuda backend: weights of type %s are not supported",
                         quant_type_name(w->type));
        else if (n_tok <= 8)
            LK(c, lk_gemv((int)w->type, w->data, w->row_bytes, (int)w->rows, (int)w->cols, x, n_tok, ops[i].y, c->stream));
        else
            gemm(c, w, x, n_tok, ops[i].y);
    }
    return take_status(c);
}

static void cuda_rmsnorm(llm_backend *b, const float *x, const float *w, int n_tok, int dim, float eps, float *out)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    LK(c, lk_rmsnorm(x, w, n_tok, dim, eps, out, c->stream));
}

/* The host copy of the factors an uploaded model's device pointer holds
 * (NULL: not one of this backend's models). */
static const float *rope_host_factors(const cu_ctx *c, const float *dev)
{
    for (const cu_model *m = c->models; m; m = m->next)
        if (m->m.rope_freqs == dev)
            return m->rope_host;
    return NULL;
}

/* The frequencies are computed here, as the CPU backend does, and staged
 * like the indices (unchanged tables are not sent again). */
static void cuda_rope(llm_backend *b, const llm_rope_args *a)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    int half = a->rot_dim / 2;
    const float *factors = a->freq_factors ? rope_host_factors(c, a->freq_factors) : NULL;
    if (a->freq_factors && !factors) {
        keep_failure(c, LLM_ERR_UNSUPPORTED, "cuda backend: RoPE factors that this backend did not upload");
        return;
    }
    LLM_ASSERT(half >= 0 && half <= LLM_MAX_ROT_DIM / 2); /* model load refuses larger rot_dim */
    float freq[LLM_MAX_ROT_DIM / 2];
    llm_backend_rope_freqs(a->theta, a->rot_dim, factors, freq);
    memcpy(c->freq_bits, freq, sizeof(float) * (size_t)half); /* staged as int32 objects, not floats read as ints */
    const int32_t *pos = stage(c, ST_POS, a->pos, (size_t)a->n_tok);
    const int32_t *fr = pos ? stage(c, ST_FREQ, c->freq_bits, (size_t)half) : NULL;
    if (fr)
        LK(c, lk_rope(a->x, a->n_tok, a->n_head, a->head_dim, a->rot_dim, pos, (const float *)fr, a->freq_scale,
                      a->neox, c->stream));
}

static void cuda_swiglu(llm_backend *b, const float *g, const float *u, size_t n, float *out)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    LK(c, lk_swiglu(g, u, n, out, c->stream));
}

static void cuda_geglu(llm_backend *b, const float *g, const float *u, size_t n, float *out)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    LK(c, lk_geglu(g, u, n, out, c->stream));
}

static void cuda_scale(llm_backend *b, float *x, float s, size_t n)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    LK(c, lk_scale(x, s, n, c->stream));
}

static void cuda_add(llm_backend *b, float *y, const float *x, size_t n)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    LK(c, lk_add(y, x, n, c->stream));
}

static void cuda_add_bias(llm_backend *b, float *x, const float *bias, int n_tok, int dim)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    LK(c, lk_add_bias(x, bias, n_tok, dim, c->stream));
}

static void cuda_get_rows(llm_backend *b, const llm_weight *emb, const int32_t *ids, int n, float *out)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    const int32_t *d = stage(c, ST_IDS, ids, (size_t)n);
    if (d)
        LK(c, lk_get_rows((int)emb->type, emb->data, emb->row_bytes, (int)emb->cols, d, n, out, c->stream));
}

/* rows and weights go up as one array: [rows (n) | weights' bits (n)]. */
static void cuda_add_rows(llm_backend *b, float *y, const int32_t *rows, const float *w, const float *x, int n, int dim,
                          int set)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    int32_t *p = n > 0 ? pack(c, 2 * (size_t)n) : NULL;
    if (!p)
        return;
    memcpy(p, rows, sizeof(int32_t) * (size_t)n);
    memcpy(p + n, w, sizeof(float) * (size_t)n);
    const int32_t *d = stage(c, ST_ROWS, p, 2 * (size_t)n);
    if (d)
        LK(c, lk_add_rows(y, d, (const float *)(d + n), x, n, dim, set, c->stream));
}

static void cuda_kv_write(llm_backend *b, const llm_kv_layer *kv, const llm_batch_seq *seqs, int n_seqs, const float *k,
                          const float *v)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    size_t n_rows = 0;
    for (int s = 0; s < n_seqs; s++) n_rows += (size_t)seqs[s].n_tok;
    int32_t *slot = pack(c, n_rows);
    if (!slot)
        return;
    for (int s = 0; s < n_seqs; s++)
        for (int t = 0; t < seqs[s].n_tok; t++) {
            int p = seqs[s].pos0 + t;
            slot[seqs[s].tok0 + t] = seqs[s].block_table[p / kv->block_size] * kv->block_size + p % kv->block_size;
        }
    const int32_t *d = stage(c, ST_SLOT, slot, n_rows);
    if (d)
        LK(c, lk_kv_write((int)kv->type, kv->k, kv->v, kv->row_bytes, kv->kv_dim, d, (int)n_rows, k, v, c->stream));
}

/* Prefill-shaped batches (F16 K/V, at least 16 rows, 4 or more rows per
 * sequence on average) go to the tensor-core kernel. */
static int use_tc(const llm_attn_args *a, size_t n_rows)
{
    return a->kv->type == QT_F16 && a->head_dim % 16 == 0 && n_rows >= 16 && n_rows >= 4 * (size_t)a->n_seqs;
}

/* Tiles of up to 16 consecutive rows of each sequence: {first row, rows,
 * first position, table offset}. */
static size_t pack_tiles(const llm_attn_args *a, const int32_t *tab_off, int32_t *t)
{
    size_t n = 0;
    for (int s = 0; s < a->n_seqs; s++)
        for (int r = 0; r < a->seqs[s].n_tok; r += 16, n++) {
            int rows = a->seqs[s].n_tok - r < 16 ? a->seqs[s].n_tok - r : 16;
            t[4 * n] = a->seqs[s].tok0 + r, t[4 * n + 1] = rows, t[4 * n + 2] = a->seqs[s].pos0 + r;
            t[4 * n + 3] = tab_off[s];
        }
    return n;
}

/* Packs [row_pos (n_rows) | row_table (n_rows) | tables...] for lk_attention
 * (and the tiles for lk_attention_tc). */
static llm_status cuda_attention(llm_backend *b, const llm_attn_args *a)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    int bs = a->kv->block_size, max_len = 0, graph = c->g.pad;
    size_t n_rows = 0, n_tab = 0, n_tiles = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        int len = graph ? c->g.max_len : a->seqs[s].pos0 + a->seqs[s].n_tok; /* a graph pads every table to its bucket */
        n_rows += (size_t)a->seqs[s].n_tok;
        n_tab += (size_t)((len + bs - 1) / bs);
        n_tiles += (size_t)((a->seqs[s].n_tok + 15) / 16);
        max_len = len > max_len ? len : max_len;
    }
    int tc = !graph && use_tc(a, n_rows);
    int32_t *p = pack(c, 2 * n_rows + n_tab + (size_t)a->n_seqs + (tc ? 4 * n_tiles : 0));
    if (!p)
        return take_status(c);
    int32_t *tab = p + 2 * n_rows, *tab_off = tab + n_tab;
    size_t t0 = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        const llm_batch_seq *q = &a->seqs[s];
        int used = (q->pos0 + q->n_tok + bs - 1) / bs, nb = graph ? (c->g.max_len + bs - 1) / bs : used;
        memcpy(tab + t0, q->block_table, sizeof(int32_t) * (size_t)used);
        memset(tab + t0 + used, 0, sizeof(int32_t) * (size_t)(nb - used)); /* never read: past the row's position */
        for (int t = 0; t < q->n_tok; t++) {
            p[q->tok0 + t] = q->pos0 + t;
            p[n_rows + (size_t)q->tok0 + t] = (int32_t)t0;
        }
        tab_off[s] = (int32_t)t0;
        t0 += (size_t)nb;
    }
    if (tc) {
        pack_tiles(a, tab_off, tab_off + a->n_seqs);
        const int32_t *d = stage(c, ST_ATTN, p, 2 * n_rows + n_tab);
        const int32_t *dt = d ? stage(c, ST_TILES, tab_off + a->n_seqs, 4 * n_tiles) : NULL;
        if (dt)
            LK(c, lk_attention_tc(a->q, a->out, (int)n_tiles, dt, a->n_head, a->n_head_kv, a->head_dim, a->scale,
                                  d + 2 * n_rows, a->kv->k, a->kv->v, a->kv->row_bytes, bs, a->window, c->stream));
        return take_status(c);
    }
    size_t wf = lk_attention_work((int)n_rows, a->n_head, a->head_dim, max_len);
    float *work = wf ? grow(c, &c->att_work, &c->att_cap, wf * sizeof(float)) : NULL;
    if (wf && !work)
        return take_status(c);
    const int32_t *d = stage(c, ST_ATTN, p, 2 * n_rows + n_tab);
    if (d)
        LK(c, lk_attention(a->q, a->out, (int)n_rows, a->n_head, a->n_head_kv, a->head_dim, a->scale, d, d + n_rows,
                           d + 2 * n_rows, (int)a->kv->type, a->kv->k, a->kv->v, a->kv->row_bytes, bs, max_len,
                           a->window, work, c->stream));
    return take_status(c);
}

static void cuda_kv_copy(llm_backend *b, const llm_kv_layer *layers, int n_layers, const int32_t *src,
                         const int32_t *dst, int n)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    for (int l = 0; l < n_layers; l++) {
        size_t blk = (size_t)layers[l].block_size * layers[l].row_bytes;
        for (int i = 0; i < n && !c->failed; i++) {
            char *k = layers[l].k, *v = layers[l].v;
            CU(c, cudaMemcpyAsync(k + (size_t)dst[i] * blk, k + (size_t)src[i] * blk, blk, cudaMemcpyDeviceToDevice, c->stream));
            CU(c, cudaMemcpyAsync(v + (size_t)dst[i] * blk, v + (size_t)src[i] * blk, blk, cudaMemcpyDeviceToDevice, c->stream));
        }
    }
}

static llm_status cuda_read(llm_backend *b, void *dst, const void *src, size_t bytes)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    if (!c->failed && !CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream)))
        CU(c, cudaStreamSynchronize(c->stream));
    return take_status(c);
}

/* Token ids picked on the device; only n_rows ids are read back. */
static llm_status cuda_sample(llm_backend *b, const float *logits, int n_rows, int n_vocab, const llm_sample_params *p,
                              int32_t *out)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
    _Static_assert(sizeof(llm_sample_params) == sizeof(lk_sample_params) && sizeof(llm_sample_params) % 4 == 0,
                   "llm_sample_params and lk_sample_params share a layout");
    const int32_t *dp = stage(c, ST_SAMPLE, (const int32_t *)p, (size_t)n_rows * sizeof *p / 4);
    if (c->g.mode != CU_EAGER)
        return dp ? graph_finish(c, dp, n_rows, n_vocab, logits, out) : take_status(c);
    if (c->g.warm) { /* the shape's eager step ends here: what a capture would take */
        c->g.warm->need = c->g.count_used;
        c->g.warm = NULL;
    }
    int32_t *d = (int32_t *)scratch(c, sizeof(int32_t) * (size_t)n_rows);
    if (dp && d && !LK(c, lk_sample(logits, n_rows, n_vocab, (const lk_sample_params *)dp, d, c->stream)) &&
        !CU(c, cudaMemcpyAsync(out, d, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyDeviceToHost, c->stream)))
        CU(c, cudaStreamSynchronize(c->stream));
    return take_status(c);
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
    if (!gemv_type(*t = m->output.type))
        return "output";
    if (!gemv_type(*t = m->tok_embd.type))
        return "token_embd";
    for (int l = 0; l < m->hp.n_layer; l++) {
        const llm_layer *L = &m->layers[l];
        const llm_weight *w[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof w / sizeof *w; i++)
            if (!gemv_type(*t = w[i]->type))
                return names[i];
        if (m->hp.n_expert && !gemv_type(*t = L->w_router.type))
            return "ffn_gate_inp";
        if (m->hp.n_expert && (!gemv_type(*t = L->exp_gate[0].type) || !gemv_type(*t = L->exp_up[0].type) ||
                               !gemv_type(*t = L->exp_down[0].type)))
            return "ffn_*_exps";
    }
    return NULL;
}

/* One device allocation for every tensor (sized by a first walk), the
 * copies queued on the stream and waited for (they read the host model,
 * which may go once this returns). */
static llm_status cuda_model_upload(llm_backend *b, const llm_model *m, llm_model **dev, llm_error *err)
{
    cu_ctx *c = ctx_of(b);
    use_device(c);
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
    st = take_status(c);
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
    cu_ctx *c = ctx_of(b);
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
    use_device(c);
    if (nc->aborted)
        return LLM_ERR_CANCELLED;
    ncclResult_t r = ncclAllReduce(buf, buf, n, ncclFloat, ncclSum, nc->comm[rank], c->stream);
    if (r != ncclSuccess) {
        keep_failure(c, LLM_ERR_BACKEND, "ncclAllReduce on %s: %s", c->name, ncclGetErrorString(r));
        return take_status(c);
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
        nc->rank[r] = ctx_of(ranks[r]);
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
    cu_ctx *c = ctx_of(b);
    use_device(c);
    for (int k = 0; k < ST_KINDS; k++) {
        cudaFree(c->stage[k].dev);
        free(c->stage[k].host);
    }
    graphs_free(c);
    cudaFree(c->scratch);
    cudaFree(c->att_work);
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
    graphs_init(c);
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
