/* backend.h - the compute backend interface: a const table of operations plus
 * an instance pointer. The model code and (later) the scheduler call only the
 * llm_backend_* wrappers below and never know which backend runs.
 *
 * Tensor conventions: activations are row-major float32, one row per token.
 * A weight matrix W has `rows` output features and `cols` input features
 * (GGUF ne[1] and ne[0]); rows are stored one after another in W's type.
 *
 * KV layout (shared by every backend so the cache manager stays
 * backend-free): per layer, K and V are arrays of blocks of `block_size`
 * token rows, each row kv_dim floats; a sequence's logical position p lives
 * in block block_table[p / block_size], row p % block_size.
 *
 * Ownership: the caller owns every buffer passed in; a backend never keeps a
 * pointer past the call. Thread-safety: one thread drives a backend at a time
 * (the backend may use its own worker threads inside a call). */
#ifndef LLM_BACKEND_H
#define LLM_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "llm/quant.h"
#include "llm/status.h"

typedef struct llm_weight {
    quant_type type;
    int64_t rows, cols;
    size_t row_bytes;
    const void *data; /* rows * row_bytes bytes, not owned */
} llm_weight;

/* One layer's view of one sequence's paged K/V. */
typedef struct llm_kv_view {
    float *k, *v;                /* (n_blocks_total, block_size, kv_dim) */
    const int32_t *block_table;  /* logical block -> physical block */
    int block_size;
    int kv_dim;
} llm_kv_view;

/* Attention for n_tok query rows of one sequence. Query row t sits at
 * position pos0 + t and attends causally to positions [0, pos0 + t]. */
typedef struct llm_attn_args {
    const float *q;   /* (n_tok, n_head * head_dim) */
    float *out;       /* (n_tok, n_head * head_dim) */
    int n_tok, pos0;
    int n_head, n_head_kv, head_dim;
    float scale;
    llm_kv_view kv;
} llm_attn_args;

/* Largest rot_dim a backend must handle; model loading rejects more. */
#define LLM_MAX_ROT_DIM 1024

typedef struct llm_rope_args {
    float *x;          /* (n_tok, n_head * head_dim), rotated in place */
    int n_tok, n_head, head_dim;
    int rot_dim;       /* leading dims of each head that rotate */
    int pos0;          /* row t has position pos0 + t */
    float theta;       /* frequency base */
    float freq_scale;  /* 1 / linear scaling factor */
    int neox;          /* 0: adjacent pairs (llama); 1: halves (qwen2, neox) */
    const float *freq_factors; /* (rot_dim / 2) divisors of each frequency (Llama 3.1+), or NULL */
} llm_rope_args;

/* One output of a matmul group: y (n_tok, w->rows). */
typedef struct llm_matmul {
    const llm_weight *w;
    float *y;
} llm_matmul;

#define LLM_MATMUL_MAX_GROUP 4

typedef struct llm_backend llm_backend;

struct llm_backend_i {
    const char *name;
    void (*free)(llm_backend *b);
    /* For each of n_ops (1..LLM_MATMUL_MAX_GROUP) weights sharing the same
     * input: ops[i].y (n_tok, w->rows) = x (n_tok, w->cols) . W^T. A group
     * (Q/K/V, gate/up) lets the backend convert x once and split all rows
     * over its workers in one pass. */
    llm_status (*matmul)(llm_backend *b, const llm_matmul *ops, int n_ops, const float *x, int n_tok);
    /* out[t] = x[t] / rms(x[t]) * w, row length dim */
    void (*rmsnorm)(llm_backend *b, const float *x, const float *w, int n_tok, int dim, float eps, float *out);
    void (*rope)(llm_backend *b, const llm_rope_args *a);
    /* out = silu(gate) * up, n elements */
    void (*swiglu)(llm_backend *b, const float *gate, const float *up, size_t n, float *out);
    /* y += x, n elements */
    void (*add)(llm_backend *b, float *y, const float *x, size_t n);
    /* out (n, emb->cols) = rows ids of emb, dequantized; ids already checked */
    void (*get_rows)(llm_backend *b, const llm_weight *emb, const int32_t *ids, int n, float *out);
    /* writes n_tok K/V rows at positions [pos0, pos0 + n_tok) */
    void (*kv_write)(llm_backend *b, const llm_kv_view *kv, int pos0, int n_tok, const float *k, const float *v);
    llm_status (*attention)(llm_backend *b, const llm_attn_args *a);
};

struct llm_backend {
    const struct llm_backend_i *iface;
    void *ctx;
};

typedef struct llm_cpu_config {
    int n_threads;  /* 0: number of online CPUs */
    int force_scalar; /* 1: skip the SIMD kernels (tests, debugging) */
    const char *kernels; /* NULL: the best set for this CPU; else a set's name
                            ("avx512vnni", "avx2", "scalar"), an error if unusable */
} llm_cpu_config;

/* Creates the CPU backend with its thread pool. Caller frees with
 * llm_backend_free (accepts NULL). */
llm_status llm_backend_cpu_new(const llm_cpu_config *cfg, llm_backend **out, llm_error *err);
/* Name of the CPU kernel set in use ("avx2", "scalar"). */
const char *llm_backend_cpu_kernels(const llm_backend *b);

void llm_backend_free(llm_backend *b);

static inline llm_status llm_backend_matmul(llm_backend *b, const llm_weight *w, const float *x, int n_tok, float *y)
{
    llm_matmul op = {w, y};
    return b->iface->matmul(b, &op, 1, x, n_tok);
}
static inline llm_status llm_backend_matmul_group(llm_backend *b, const llm_matmul *ops, int n_ops, const float *x, int n_tok)
{ return b->iface->matmul(b, ops, n_ops, x, n_tok); }
static inline void llm_backend_rmsnorm(llm_backend *b, const float *x, const float *w, int n_tok, int dim, float eps, float *out)
{ b->iface->rmsnorm(b, x, w, n_tok, dim, eps, out); }
static inline void llm_backend_rope(llm_backend *b, const llm_rope_args *a) { b->iface->rope(b, a); }
static inline void llm_backend_swiglu(llm_backend *b, const float *g, const float *u, size_t n, float *out)
{ b->iface->swiglu(b, g, u, n, out); }
static inline void llm_backend_add(llm_backend *b, float *y, const float *x, size_t n) { b->iface->add(b, y, x, n); }
static inline void llm_backend_get_rows(llm_backend *b, const llm_weight *emb, const int32_t *ids, int n, float *out)
{ b->iface->get_rows(b, emb, ids, n, out); }
static inline void llm_backend_kv_write(llm_backend *b, const llm_kv_view *kv, int pos0, int n_tok, const float *k, const float *v)
{ b->iface->kv_write(b, kv, pos0, n_tok, k, v); }
static inline llm_status llm_backend_attention(llm_backend *b, const llm_attn_args *a) { return b->iface->attention(b, a); }

#endif
