/* cuda_impl.h - the CUDA backend's state and the helpers its two files
 * share: backend_cuda.c (errors, memory, weights, NCCL, lifecycle and the
 * interface table) and cuda_ops.c (the operations and the graphs of decode
 * steps). Private to engine/backend/cuda/; hidden in libllm_cuda.so
 * (-fvisibility=hidden). Thread-safety: as backend_cuda.c's. */
#ifndef CUDA_IMPL_H
#define CUDA_IMPL_H

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

enum { ST_IDS, ST_POS, ST_SLOT, ST_ATTN, ST_SAMPLE, ST_TILES, ST_FREQ, ST_ROWS, ST_LORA, ST_KINDS };

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
    void *lora_work;     /* adapters' A x rows */
    size_t lora_cap;
    void *blas_ws;       /* cuBLAS workspace (no allocation inside a capture) */
    cu_graphs g;         /* decode steps as CUDA graphs */
    int in_comm;         /* a tensor-parallel rank: steps are not captured */
    cu_model *models;    /* uploaded and not released (their host copies of the RoPE factors) */
    int32_t freq_bits[LLM_MAX_ROT_DIM / 2]; /* the RoPE table as staged: float bits */
} cu_ctx;

static inline cu_ctx *cu_ctx_of(llm_backend *b) { return b->ctx; }

#define CU(c, call) cu_fail_cuda((c), (call), #call)
/* Work that a graph replays is not launched again while replaying. */
#define BLAS(c, call) ((c)->g.mode == CU_REPLAY ? 0 : cu_fail_blas((c), (call), #call))
#define LK(c, call) ((c)->g.mode == CU_REPLAY ? 0 : cu_fail_kernel((c), (call), #call))

/* Keeps the first failure (status and message) until cu_take_status. */
void cu_keep_failure(cu_ctx *c, llm_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A CUDA, cuBLAS or kernel-wrapper return checked: 1 (and the failure kept) when it is one. */
int cu_fail_blas(cu_ctx *c, cublasStatus_t s, const char *call);
int cu_fail_cuda(cu_ctx *c, cudaError_t e, const char *call);
int cu_fail_kernel(cu_ctx *c, int rc, const char *kernel);
/* (cuda_ops.c) the graphs of decode steps, and the kernels' type for lk_gemv. */
int cu_gemv_type(quant_type t);
void cu_graph_abort(cu_ctx *c);
void cu_graphs_drop(cu_ctx *c);
void cu_graphs_free(cu_ctx *c);
void cu_graphs_init(cu_ctx *c);
/* (backend_cuda.c) device buffers grown to at least bytes, the host packing
 * buffer, index arrays staged to the device, the device selected, the kept
 * failure taken. */
void *cu_grow(cu_ctx *c, void **buf, size_t *cap, size_t bytes);
int32_t *cu_pack_get(cu_ctx *c, size_t n);
void *cu_scratch_get(cu_ctx *c, size_t bytes);
const int32_t *cu_stage_upload(cu_ctx *c, int kind, const int32_t *h, size_t n);
llm_status cu_take_status(cu_ctx *c);
void cu_use_device(cu_ctx *c);
/* (cuda_ops.c) the backend interface's operations (llm/backend.h). */
void cuda_add(llm_backend *b, float *y, const float *x, size_t n);
void cuda_add_bias(llm_backend *b, float *x, const float *bias, int n_tok, int dim);
void cuda_add_rows(llm_backend *b, float *y, const int32_t *rows, const float *w, const float *x, int n, int dim, int set);
llm_status cuda_attention(llm_backend *b, const llm_attn_args *a);
void cuda_geglu(llm_backend *b, const float *g, const float *u, size_t n, float *out);
void cuda_get_rows(llm_backend *b, const llm_weight *emb, const int32_t *ids, int n, float *out);
void cuda_kv_copy(llm_backend *b, const llm_kv_layer *layers, int n_layers, const int32_t *src, const int32_t *dst, int n);
llm_status cuda_lora(llm_backend *b, const llm_lora_seg *segs, int n_segs, const float *x, int in, float *y, int out);
void cuda_kv_write(llm_backend *b, const llm_kv_layer *kv, const llm_batch_seq *seqs, int n_seqs, const float *k, const float *v);
llm_status cuda_matmul(llm_backend *b, const llm_matmul *ops, int n_ops, const float *x, int n_tok);
llm_status cuda_read(llm_backend *b, void *dst, const void *src, size_t bytes);
llm_status cuda_write(llm_backend *b, void *dst, const void *src, size_t bytes);
void cuda_rmsnorm(llm_backend *b, const float *x, const float *w, int n_tok, int dim, float eps, float *out);
void cuda_rope(llm_backend *b, const llm_rope_args *a);
llm_status cuda_sample(llm_backend *b, const float *logits, int n_rows, int n_vocab, const llm_sample_params *p, int32_t *out);
void cuda_scale(llm_backend *b, float *x, float s, size_t n);
void cuda_step_begin(llm_backend *b, const llm_step_info *si);
void cuda_swiglu(llm_backend *b, const float *g, const float *u, size_t n, float *out);

#endif
