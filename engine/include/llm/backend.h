/* backend.h - the compute backend interface: a const table of operations plus
 * an instance pointer. The model code and the scheduler call only the
 * llm_backend_* wrappers below and never know which backend runs.
 *
 * Memory: activations, KV pages and every `float *` an operation takes live
 * in the backend's memory (llm_backend_buffer_alloc: host memory for the
 * CPU backend, device memory for CUDA). Small index arrays (ids, positions,
 * block tables, llm_batch_seq) are host memory; a device backend uploads
 * them. Weights are used through the backend's copy of the model
 * (llm_backend_i.model_upload; the CPU backend reads the mapping in place
 * and adds packed copies of the matrices its kernel set tiles).
 * llm_backend_read brings results (logits) to the host.
 *
 * Tensor conventions: activations are row-major float32, one row per token.
 * A weight matrix W has `rows` output features and `cols` input features
 * (GGUF ne[1] and ne[0]); rows are stored one after another in W's type.
 *
 * KV layout (shared by every backend so the cache manager stays
 * backend-free): per layer, K and V are arrays of blocks of `block_size`
 * token rows, each row kv_dim values of the cache's type; a sequence's
 * logical position p lives in block block_table[p / block_size], row
 * p % block_size. A batch is the rows of several sequences back to back.
 *
 * Errors: operations returning void cannot fail on the CPU; a device
 * backend keeps the first failure of one and returns it from the next
 * operation that returns a status (matmul, attention, read).
 *
 * Ownership: the caller owns every buffer passed in; a backend never keeps a
 * pointer past the call. Thread-safety: one thread drives a backend at a time
 * (the backend may use its own worker threads inside a call). */
#ifndef LLM_BACKEND_H
#define LLM_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "llm/quant.h"
#include "llm/status.h"

typedef struct llm_weight {
    quant_type type;
    int64_t rows, cols;
    size_t row_bytes;
    const void *data; /* rows * row_bytes bytes, not owned */
    /* The backend's own layout of the same weight, set only in a backend's
     * copy of a model (model_upload; the CPU backend's packed tiles), else
     * NULL. Not owned. */
    const void *packed;
} llm_weight;

/* One layer's K/V storage: n_blocks blocks of block_size token rows; a row
 * holds kv_dim values in `type` (F32, F16, or Q8_0 when every head's
 * slice starts on a block of 32) and takes row_bytes. */
typedef struct llm_kv_layer {
    void *k, *v;        /* (n_blocks, block_size, row_bytes) each */
    quant_type type;
    int block_size, kv_dim;
    size_t row_bytes;
} llm_kv_layer;

/* One sequence's rows of a batch: rows [tok0, tok0 + n_tok) sit at
 * positions [pos0, pos0 + n_tok); logical position p lives in physical
 * block block_table[p / block_size]. local_table, when set, is the table
 * of the sliding-window layers' own pool (kv_cache.h): its entries before
 * the first block a window reaches are -1 and never read. */
typedef struct llm_batch_seq {
    int tok0, n_tok, pos0;
    const int32_t *block_table;
    const int32_t *local_table; /* NULL: every layer uses block_table */
} llm_batch_seq;

/* Causal attention for every row of a batch: row t of sequence s attends
 * to positions [0, pos0 + t] of that sequence's K/V (which must already
 * hold them, the batch's own rows included); with a sliding window w > 0,
 * to the last w of them only: [max(0, pos0 + t - w + 1), pos0 + t]. */
typedef struct llm_attn_args {
    const float *q;   /* (n_rows, n_head * head_dim) */
    float *out;       /* (n_rows, n_head * head_dim) */
    int n_head, n_head_kv, head_dim;
    float scale;
    const llm_batch_seq *seqs;
    int n_seqs;
    const llm_kv_layer *kv;
    int window;       /* sliding window in positions; 0: none */
} llm_attn_args;

/* The first position a row at position pos attends to. */
static inline int llm_attn_first(int pos, int window) { return window > 0 && pos >= window ? pos - window + 1 : 0; }

/* Largest rot_dim a backend must handle; model loading rejects more. */
#define LLM_MAX_ROT_DIM 1024

typedef struct llm_rope_args {
    float *x;          /* (n_tok, n_head * head_dim), rotated in place */
    int n_tok, n_head, head_dim;
    int rot_dim;       /* leading dims of each head that rotate */
    const int32_t *pos; /* (n_tok) position of each row */
    float theta;       /* frequency base */
    float freq_scale;  /* 1 / linear scaling factor */
    int neox;          /* 0: adjacent pairs (llama); 1: halves (qwen2, neox) */
    const float *freq_factors; /* (rot_dim / 2) divisors of each frequency (Llama 3.1+), or NULL */
} llm_rope_args;

/* The rotary frequency of each of the rot_dim / 2 pairs into freq (room
 * for rot_dim / 2 floats, at most LLM_MAX_ROT_DIM / 2):
 * theta^(-2i / rot_dim) / factors[i] (factors NULL: 1). Every backend
 * computes the table with this on the host, so all rotate by the same
 * angles (a device's powf is not correctly rounded, and at positions of
 * thousands a few ulps of a frequency move an angle by ~1e-3). */
static inline void llm_backend_rope_freqs(float theta, int rot_dim, const float *factors, float *freq)
{
    for (int i = 0; i < rot_dim / 2; i++)
        freq[i] = powf(theta, -2.0f * (float)i / (float)rot_dim) / (factors ? factors[i] : 1.0f);
}

/* One output of a matmul group: y (n_tok, w->rows). */
typedef struct llm_matmul {
    const llm_weight *w;
    float *y;
} llm_matmul;

#define LLM_MATMUL_MAX_GROUP 4

/* One LoRA adapter's low-rank update of a matmul's output (lora.h) for
 * rows [row0, row0 + n_rows) of a batch: y[r] += s * (B (A x[r])). A and
 * B are in backend memory, A as (rank, in) and B transposed, (rank, out),
 * both row-major, each of type QT_F32 or QT_F16 (an F16 adapter is read
 * as it is stored: half the bytes per step; the products are float). */
#define LLM_LORA_SEG_MAX_RANK 1024 /* the largest rank a backend must take */
typedef struct llm_lora_seg {
    int row0, n_rows;
    const void *a, *bt;
    int rank;
    float s;
    quant_type a_type, b_type;
} llm_lora_seg;

typedef struct llm_backend llm_backend;
struct llm_comm;
struct llm_model;

/* The id a device pick gives for a row with a NaN logit (there is no
 * distribution to pick from): the engine fails that request. */
#define LLM_SAMPLE_NAN (-1)

/* How one row's token is picked on a device: temperature <= 0 is the
 * argmax; top_k <= 0, top_p >= 1, min_p <= 0 are off; u in [0, 1) is the
 * row's uniform draw (the token where the cumulative truncated weight, in
 * id order, passes u of the total). An infinite largest logit, or nothing
 * left to draw from, picks the argmax; a row with a NaN logit picks
 * LLM_SAMPLE_NAN. Layout shared with the kernels' lk_sample_params. */
typedef struct llm_sample_params {
    float temperature;
    int top_k;
    float top_p, min_p, u;
} llm_sample_params;

/* The shape of a forward pass, announced before its operations. */
typedef struct llm_step_info {
    int n_rows, n_seqs, n_logits;
    int max_len;   /* longest sequence's positions after the step */
    int decode;    /* 1: every sequence adds one row */
    int pick;      /* 1: the step ends with sample (ids only), 0: with read (logits) */
    int host_sync; /* 1: the pass reads results back midway (expert routing, embeddings' hidden rows), so it
                    * cannot be replayed as a whole */
    int adapters;  /* 1: LoRA adapters run (which, and on which rows, changes step to step: not replayed) */
} llm_step_info;

/* What a backend's memory holds, for /metrics. */
typedef struct llm_backend_mem {
    char device[96];   /* "NVIDIA H200 (cuda:0)", "host" */
    size_t total;      /* the device's memory */
    size_t used;       /* allocated by this backend: weights, KV, activations */
    size_t free;       /* what the device could still give */
} llm_backend_mem;

struct llm_backend_i {
    const char *name;
    void (*free)(llm_backend *b);
    /* For each of n_ops (1..LLM_MATMUL_MAX_GROUP) weights sharing the same
     * input: ops[i].y (n_tok, w->rows) = x (n_tok, w->cols) . W^T. A group
     * (Q/K/V, gate/up) lets the backend convert x once and split all rows
     * over its workers in one pass. */
    llm_status (*matmul)(llm_backend *b, const llm_matmul *ops, int n_ops, const float *x, int n_tok);
    /* Optional (NULL: the backend runs no adapters): every segment's rows
     * of y (n rows of `out` floats) get their low-rank update from the
     * same rows of x (rows of `in` floats); segments do not overlap. Each
     * row is computed on its own, the same way whatever else the call
     * holds (batch invariance), and the backend may take the segments in
     * any order. */
    llm_status (*lora)(llm_backend *b, const llm_lora_seg *segs, int n_segs, const float *x, int in, float *y, int out);
    /* out[t] = x[t] / rms(x[t]) * w, row length dim */
    void (*rmsnorm)(llm_backend *b, const float *x, const float *w, int n_tok, int dim, float eps, float *out);
    void (*rope)(llm_backend *b, const llm_rope_args *a);
    /* out = silu(gate) * up, n elements */
    void (*swiglu)(llm_backend *b, const float *gate, const float *up, size_t n, float *out);
    /* out = gelu(gate) * up, n elements; GELU with the tanh approximation
     * 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (gemma) */
    void (*geglu)(llm_backend *b, const float *gate, const float *up, size_t n, float *out);
    /* y += x, n elements */
    void (*add)(llm_backend *b, float *y, const float *x, size_t n);
    /* x *= s, n elements */
    void (*scale)(llm_backend *b, float *x, float s, size_t n);
    /* x[t] += bias for each of n_tok rows of dim */
    void (*add_bias)(llm_backend *b, float *x, const float *bias, int n_tok, int dim);
    /* y[rows[i]] = w[i] * x[i] (set 1) or y[rows[i]] += w[i] * x[i] (set
     * 0) for n rows of dim: an expert's outputs into the rows it served
     * (rows distinct; rows and w are host arrays) */
    void (*add_rows)(llm_backend *b, float *y, const int32_t *rows, const float *w, const float *x, int n, int dim,
                     int set);
    /* out (n, emb->cols) = rows ids of emb, dequantized; ids already checked */
    void (*get_rows)(llm_backend *b, const llm_weight *emb, const int32_t *ids, int n, float *out);
    /* Stores the float K/V rows (n_rows, kv_dim) of a batch at their
     * sequences' positions, converted to kv->type. */
    void (*kv_write)(llm_backend *b, const llm_kv_layer *kv, const llm_batch_seq *seqs, int n_seqs, const float *k,
                     const float *v);
    llm_status (*attention)(llm_backend *b, const llm_attn_args *a);
    /* Copies K/V block src[i] to dst[i] in each of n_layers layers
     * (copy-on-write of shared blocks). */
    void (*kv_copy)(llm_backend *b, const llm_kv_layer *layers, int n_layers, const int32_t *src, const int32_t *dst,
                    int n);
    /* Memory on the backend's device (KV pages): alloc returns NULL when
     * out of memory; available is what could still be allocated. */
    void *(*buffer_alloc)(llm_backend *b, size_t bytes);
    void (*buffer_free)(llm_backend *b, void *p);
    size_t (*mem_available)(llm_backend *b);
    /* Optional: an all-reduce between n backends of this kind (ranks[i] is
     * rank i) for tensor parallelism (tp.h); NULL: the threads all-reduce
     * over host memory. */
    llm_status (*comm_new)(llm_backend *const *ranks, int n, struct llm_comm **out, llm_error *err);
    /* Optional (NULL: the model is used in place): *dev gets the backend's
     * copy of m's weights (same hparams, pointers into the backend's
     * memory), released with model_release; *dev NULL with LLM_OK: the
     * model is used in place. Errors name the bytes asked for and the
     * bytes free. */
    llm_status (*model_upload)(llm_backend *b, const struct llm_model *m, struct llm_model **dev, llm_error *err);
    void (*model_release)(llm_backend *b, struct llm_model *dev);
    /* Optional (NULL: backend memory is host memory, read in place): copies
     * bytes from backend memory src to host dst once every queued operation
     * is done; returns the first failure since the last status. */
    llm_status (*read)(llm_backend *b, void *dst, const void *src, size_t bytes);
    /* Required where read is set (a device backend): copies bytes from
     * host src to backend memory dst (after every queued operation; src
     * may be reused on return). */
    llm_status (*write)(llm_backend *b, void *dst, const void *src, size_t bytes);
    /* Optional (a device backend): out[r] (host) = the token picked from
     * row r of logits with p[r] (temperature <= 0: the largest logit, ties
     * to the lowest id; LLM_SAMPLE_NAN for a row with a NaN), so only ids
     * cross to the host. The engine range-checks every id it gets. */
    llm_status (*sample)(llm_backend *b, const float *logits, int n_rows, int n_vocab, const llm_sample_params *p,
                         int32_t *out);
    /* Optional: the next operations, up to the sample or read that ends
     * them, are one forward pass of this shape (a device backend may
     * capture it once and replay it as a graph). */
    void (*step_begin)(llm_backend *b, const llm_step_info *info);
    /* Optional: what the backend's memory holds (zeros when NULL). Unlike
     * the other operations, callable from any thread at any time. */
    void (*mem_stats)(llm_backend *b, llm_backend_mem *out);
};

struct llm_backend {
    const struct llm_backend_i *iface;
    void *ctx;
};

/* Whether the CPU backend packs a model's matrices into its kernel set's
 * tiled layout when it takes the model (sets without one never do).
 * Packed and unpacked results differ in their last bits, so a deployment
 * that wants the same answers on every pod sets on or off. */
typedef enum llm_cpu_pack {
    LLM_CPU_PACK_AUTO = 0, /* pack when the copies fit the memory left, else run unpacked (a log line says why) */
    LLM_CPU_PACK_OFF = 1,  /* never pack */
    LLM_CPU_PACK_ON = 2,   /* pack, or fail the load (LLM_ERR_NOMEM, naming the sizes) when the copies do not fit
                            * or the file's matrices overlap */
} llm_cpu_pack;

typedef struct llm_cpu_config {
    int n_threads;  /* 0: number of online CPUs */
    int force_scalar; /* 1: skip the SIMD kernels (tests, debugging) */
    const char *kernels; /* NULL: the set the environment's LLM_KERNELS names, else the best for this CPU;
                            a set's name ("avx512", "avx512vnni", "avx2", "scalar"): that set. A set that
                            is unknown or unusable here is an error (LLM_ERR_UNSUPPORTED) */
    llm_cpu_pack pack;
} llm_cpu_config;

/* Creates the CPU backend with its thread pool. Caller frees with
 * llm_backend_free (accepts NULL). */
llm_status llm_backend_cpu_new(const llm_cpu_config *cfg, llm_backend **out, llm_error *err);
/* Name of the CPU kernel set in use ("avx512", "avx2", "scalar"). */
const char *llm_backend_cpu_kernels(const llm_backend *b);
/* Nanoseconds the CPU backend b has spent in matmuls and in attention since
 * it was made (monotonic clock, all threads of a call counted once): how
 * llm-bench splits a step. Zeros where b is not the CPU backend. Any thread. */
void llm_backend_cpu_times(const llm_backend *b, uint64_t *matmul_ns, uint64_t *attn_ns);
/* The kernel set's int8 multiply-add rate with every pool thread busy at
 * once, in operations (a multiply and an add each) per second, from a
 * ~0.3 s register-only loop: the ceiling int8 matmuls are measured
 * against. 0 for a set without int8 instructions (scalar) or a CUDA b. */
double llm_backend_cpu_int8_peak(llm_backend *b);

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
static inline void llm_backend_geglu(llm_backend *b, const float *g, const float *u, size_t n, float *out)
{ b->iface->geglu(b, g, u, n, out); }
static inline void llm_backend_add(llm_backend *b, float *y, const float *x, size_t n) { b->iface->add(b, y, x, n); }
static inline void llm_backend_scale(llm_backend *b, float *x, float s, size_t n) { b->iface->scale(b, x, s, n); }
static inline void llm_backend_add_bias(llm_backend *b, float *x, const float *bias, int n_tok, int dim)
{ b->iface->add_bias(b, x, bias, n_tok, dim); }
static inline void llm_backend_add_rows(llm_backend *b, float *y, const int32_t *rows, const float *w, const float *x,
                                        int n, int dim, int set)
{
    b->iface->add_rows(b, y, rows, w, x, n, dim, set);
}
static inline void llm_backend_get_rows(llm_backend *b, const llm_weight *emb, const int32_t *ids, int n, float *out)
{ b->iface->get_rows(b, emb, ids, n, out); }
static inline void llm_backend_kv_write(llm_backend *b, const llm_kv_layer *kv, const llm_batch_seq *seqs, int n_seqs,
                                        const float *k, const float *v)
{ b->iface->kv_write(b, kv, seqs, n_seqs, k, v); }
static inline llm_status llm_backend_attention(llm_backend *b, const llm_attn_args *a) { return b->iface->attention(b, a); }
static inline void llm_backend_kv_copy(llm_backend *b, const llm_kv_layer *layers, int n_layers, const int32_t *src,
                                       const int32_t *dst, int n)
{ if (n > 0) b->iface->kv_copy(b, layers, n_layers, src, dst, n); }
static inline void *llm_backend_buffer_alloc(llm_backend *b, size_t bytes) { return b->iface->buffer_alloc(b, bytes); }
static inline void llm_backend_buffer_free(llm_backend *b, void *p) { if (p) b->iface->buffer_free(b, p); }
static inline size_t llm_backend_mem_available(llm_backend *b) { return b->iface->mem_available(b); }
/* Whether the backend's memory is the host's (results are read in place). */
static inline int llm_backend_host_memory(const llm_backend *b) { return b->iface->read == NULL; }
static inline llm_status llm_backend_read(llm_backend *b, void *dst, const void *src, size_t bytes)
{ return b->iface->read ? b->iface->read(b, dst, src, bytes) : LLM_OK; }
/* Host src into backend memory dst (a plain copy on a host-memory
 * backend); LLM_ERR_UNSUPPORTED on a device backend without write. */
static inline llm_status llm_backend_write(llm_backend *b, void *dst, const void *src, size_t bytes)
{
    if (b->iface->write)
        return b->iface->write(b, dst, src, bytes);
    if (!llm_backend_host_memory(b))
        return LLM_ERR_UNSUPPORTED;
    memcpy(dst, src, bytes);
    return LLM_OK;
}
/* The low-rank updates of segs (llm_backend_i.lora): LLM_ERR_UNSUPPORTED
 * without the op, LLM_ERR_INVALID_ARG for a rank outside
 * [1, LLM_LORA_SEG_MAX_RANK], a negative row count or a type other than
 * QT_F32 and QT_F16. */
static inline llm_status llm_backend_lora(llm_backend *b, const llm_lora_seg *segs, int n_segs, const float *x, int in,
                                          float *y, int out)
{
    if (!b->iface->lora)
        return LLM_ERR_UNSUPPORTED;
    for (int i = 0; i < n_segs; i++)
        if (segs[i].rank < 1 || segs[i].rank > LLM_LORA_SEG_MAX_RANK || segs[i].n_rows < 0 ||
            (segs[i].a_type != QT_F32 && segs[i].a_type != QT_F16) || (segs[i].b_type != QT_F32 && segs[i].b_type != QT_F16))
            return LLM_ERR_INVALID_ARG;
    return b->iface->lora(b, segs, n_segs, x, in, y, out);
}
static inline void llm_backend_mem_stats(llm_backend *b, llm_backend_mem *out)
{
    *out = (llm_backend_mem){"host", 0, 0, 0};
    if (b->iface->mem_stats)
        b->iface->mem_stats(b, out);
}

/* The CUDA backend (engine/backend/cuda/backend_cuda.c, loaded from libllm_cuda.so at
 * run time so that binaries built with nvcc still run where no CUDA is
 * installed). device: the CUDA device index. Errors: LLM_ERR_UNSUPPORTED
 * when the library or a device is missing (the message says which). */
typedef struct llm_cuda_config {
    int device;
} llm_cuda_config;
llm_status llm_backend_cuda_new(const llm_cuda_config *cfg, llm_backend **out, llm_error *err);

/* Most backends one process drives together (tensor parallelism). */
#define LLM_MAX_RANKS 8

/* Which backends to open: n_ranks of kind "cpu" (cpu.n_threads shared
 * among them: each gets an equal part, at least 1) or "cuda" (devices
 * first_device, first_device + 1, ...). */
typedef struct llm_backend_spec {
    const char *kind;     /* NULL: "cpu" */
    int n_ranks;          /* 0: 1 */
    llm_cpu_config cpu;
    int first_device;
} llm_backend_spec;

/* Opens them into out[0 .. n_ranks); on failure none stays open. Errors
 * name the kind, the rank count, or the backend's own failure. */
llm_status llm_backends_open(const llm_backend_spec *spec, llm_backend **out, llm_error *err);

#endif
