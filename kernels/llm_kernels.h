/* llm_kernels.h - the CUDA kernels' C API, for the CUDA backend (issue 8;
 * engine/backend/cuda/backend_cuda.c). Each function enqueues its
 * kernel on `stream` (a cudaStream_t; NULL: the default stream) and returns
 * the launch's cudaError_t as an int (0: launched); errors of the kernel
 * itself surface at the next synchronisation.
 *
 * Every pointer is device memory; tensor conventions are the backend
 * interface's (llm/backend.h): activations row-major float32, one row per
 * token; weights rows of `row_bytes` in their quant_type. Each kernel
 * computes what the CPU backend's operation of the same name computes (the
 * GPU check script compares them).
 *
 * Thread-safety: as CUDA's (one stream per thread). */
#ifndef LLM_KERNELS_H
#define LLM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The weight and cache types the kernels take: engine/include/llm/quant.h's
 * quant_type values (backend_cuda.c asserts they agree). */
enum {
    LK_T_F32 = 0,
    LK_T_F16 = 1,
    LK_T_Q4_0 = 2,
    LK_T_Q4_1 = 3,
    LK_T_Q5_0 = 6,
    LK_T_Q5_1 = 7,
    LK_T_Q8_0 = 8,
    LK_T_Q2_K = 10,
    LK_T_Q3_K = 11,
    LK_T_Q4_K = 12,
    LK_T_Q5_K = 13,
    LK_T_Q6_K = 14,
    LK_T_BF16 = 30
};

/* out[t] = x[t] / rms(x[t]) * w, rows of dim (sum of squares in double,
 * as the CPU backend). */
int lk_rmsnorm(const float *x, const float *w, int n_tok, int dim, float eps, float *out, void *stream);

/* Rotates the first rot_dim dims of each head of x (n_tok, n_head *
 * head_dim) in place: pair i of row t by the angle pos[t] * freq_scale *
 * freq[i] (freq: rot_dim / 2 frequencies computed on the host, as the CPU
 * backend computes them); neox 0: adjacent pairs (llama), 1: halves. */
int lk_rope(float *x, int n_tok, int n_head, int head_dim, int rot_dim, const int32_t *pos, const float *freq,
            float freq_scale, int neox, void *stream);

/* out = silu(gate) * up; y += x (n elements). */
int lk_swiglu(const float *gate, const float *up, size_t n, float *out, void *stream);
/* out = gelu_tanh(gate) * up (llm_backend_i.geglu) */
int lk_geglu(const float *gate, const float *up, size_t n, float *out, void *stream);
int lk_add(float *y, const float *x, size_t n, void *stream);
/* x *= s */
int lk_scale(float *x, float s, size_t n, void *stream);
/* y[rows[i]] = w[i] * x[i] (set) or += (not set), n rows of dim (rows and
 * w in device memory; rows distinct) */
int lk_add_rows(float *y, const int32_t *rows, const float *w, const float *x, int n, int dim, int set, void *stream);

/* out (n, cols) = rows ids of the embedding table, dequantized as the CPU
 * does; type is a quant_type: F32 (0), F16 (1), BF16 (30), Q4_0 (2),
 * Q8_0 (8) (cols a multiple of 32), Q4_K (12), Q6_K (14) (cols a multiple
 * of 256); others return LK_UNSUPPORTED. */
#define LK_UNSUPPORTED (-1)
int lk_get_rows(int type, const void *emb, size_t row_bytes, int cols, const int32_t *ids, int n, float *out,
                void *stream);

/* Stores a batch's K and V rows (n_rows, kv_dim floats) into the paged
 * cache of one layer: row r goes to physical row slot[r] (block *
 * block_size + offset) of k_cache / v_cache, rows of row_bytes in type
 * F32 (0), F16 (1) or Q8_0 (8, kv_dim a multiple of 32). */
int lk_kv_write(int type, void *k_cache, void *v_cache, size_t row_bytes, int kv_dim, const int32_t *slot, int n_rows,
                const float *k, const float *v, void *stream);

/* Causal attention of each query row over its sequence's cached K/V:
 * row r (of q and out, (n_rows, n_head * head_dim)) attends to positions
 * [0, row_pos[r]] through the block table at tables + row_table[r];
 * query head h reads KV head h / (n_head / n_head_kv). K/V rows of
 * row_bytes in type F32 (0), F16 (1) or Q8_0 (8, head_dim a multiple of
 * 32); head_dim at most 256 (else LK_UNSUPPORTED). max_len: the longest
 * row's length (max row_pos + 1, at least 1 when there are rows, else
 * LK_UNSUPPORTED); window > 0: a row at p sees only positions
 * [max(0, p - window + 1), p] (sliding-window layers); long rows are split over several blocks
 * when there are few rows, their partial results kept in `work`, of
 * lk_attention_work(...) floats (NULL when that is 0). */
size_t lk_attention_work(int n_rows, int n_head, int head_dim, int max_len);
int lk_attention(const float *q, float *out, int n_rows, int n_head, int n_head_kv, int head_dim, float scale,
                 const int32_t *row_pos, const int32_t *row_table, const int32_t *tables, int type,
                 const void *k_cache, const void *v_cache, size_t row_bytes, int block_size, int max_len, int window,
                 float *work, void *stream);

/* The same attention for prefill rows on the tensor cores (F16 K/V only,
 * head_dim a multiple of 16 up to 256): tiles (n_tiles x 4 int32) are
 * {first row, rows (1-16), position of the first row, offset of its
 * sequence's block table in tables}; a tile's rows are consecutive rows of
 * one sequence at consecutive positions. Q is rounded to half after the
 * scale, so results differ from lk_attention's by half-precision rounding. */
int lk_attention_tc(const float *q, float *out, int n_tiles, const int32_t *tiles, int n_head, int n_head_kv,
                    int head_dim, float scale, const int32_t *tables, const void *k_cache, const void *v_cache,
                    size_t row_bytes, int block_size, int window, void *stream);

/* y (n_tok, rows) = x (n_tok, cols) . W^T for 1 <= n_tok <= 8 (decode),
 * W rows of row_bytes in type F32 (0), F16 (1), BF16 (30), Q4_0 (2) or
 * Q8_0 (8) (cols a multiple of 32), Q4_K (12) or Q6_K (14) (cols a
 * multiple of 256); activations stay float. */
int lk_gemv(int type, const void *W, size_t row_bytes, int rows, int cols, const float *x, int n_tok, float *y,
            void *stream);

/* out (rows, cols) = W dequantized to float exactly as the CPU does
 * (types as lk_gemv's), for cuBLAS; LK_UNSUPPORTED for other types or
 * cols off the block. */
int lk_dequant_f32(int type, const void *W, size_t row_bytes, int rows, int cols, float *out, void *stream);
/* out (n) = x rounded to bfloat16 (bf16 1) or half (bf16 0). */
int lk_to_half(const float *x, size_t n, int bf16, void *out, void *stream);
/* x[t] += bias for n_tok rows of dim. */
int lk_add_bias(float *x, const float *bias, int n_tok, int dim, void *stream);

/* LoRA adapters' low-rank products (llm_backend_i.lora): for each of
 * n_rows entries of rows (pairs: a batch row, its segment's index),
 * y[row] (rows of `out`) += s * (B (A x[row])) (x rows of `in`), with the
 * segment's A (rank, in) and B transposed (rank, out) in device memory,
 * each float or half. A segment is 8 int32 words: row0, n_rows, rank |
 * LK_LORA_A_HALF | LK_LORA_B_HALF where those are half, s's float bits,
 * A's address (low word, high word), B's. t: n_rows rows of t_stride >= rank
 * floats of scratch. Each row's arithmetic is the same whatever the other
 * rows (batch invariance). */
#define LK_LORA_RANK_MASK 0xffff
#define LK_LORA_A_HALF (1 << 16)
#define LK_LORA_B_HALF (1 << 17)
/* A segment's third word. */
static inline int32_t lk_lora_rank_word(int rank, int a_half, int b_half)
{
    return (rank & LK_LORA_RANK_MASK) | (a_half ? LK_LORA_A_HALF : 0) | (b_half ? LK_LORA_B_HALF : 0);
}
int lk_lora(const int32_t *segs, const int32_t *rows, int n_rows, const float *x, int in, float *y, int out,
            float *t, int t_stride, void *stream);

/* What a row with a NaN logit picks (no distribution to pick from); the
 * engine's LLM_SAMPLE_NAN, the same value. */
#define LK_SAMPLE_NAN (-1)

/* out[r] = the id of the largest of row r's n_vocab logits (ties: the
 * lowest id); LK_SAMPLE_NAN when the row holds a NaN. */
int lk_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, void *stream);

/* Temperatures below this are argmax (the engine's
 * LLM_SAMPLING_GREEDY_BELOW): sampling at T -> 0 would pick among tied
 * maxima where the host picks the lowest id. */
#define LK_SAMPLE_GREEDY_BELOW 1e-5f

/* Per-row sampling settings (the layout of llm_sample_params in
 * llm/backend.h): temperature below LK_SAMPLE_GREEDY_BELOW (or NaN) is
 * argmax; top_k <= 0, top_p >= 1 and min_p <= 0 are off; u in [0, 1) is
 * the row's uniform draw. */
typedef struct lk_sample_params {
    float temperature;
    int top_k;
    float top_p, min_p, u;
} lk_sample_params;

/* out[r] = a token drawn from row r's softmax(logits / temperature) after
 * truncation; params (n_rows) in device memory. The argmax instead when
 * the largest logit is infinite or no candidate keeps a finite positive
 * weight (a temperature so small that logits / T overflows);
 * LK_SAMPLE_NAN for a row with a NaN. */
int lk_sample(const float *logits, int n_rows, int n_vocab, const lk_sample_params *params, int32_t *out,
              void *stream);

#ifdef __cplusplus
}
#endif

#endif
