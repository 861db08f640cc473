/* kernels.h - the CPU backend's inner loops, as swappable kernel sets.
 *
 * A weight row of type T is multiplied with an activation row that was first
 * converted to the set's activation format for T (act[T]): float32 for
 * float weights, 8-bit blocks with a scale for quantized weights (integer
 * dot products over 8-bit activations are what makes quantized matmuls
 * fast on CPUs). Each set chooses its formats: the scalar and AVX2 sets use
 * ggml's Q8_0/Q8_K blocks; the VNNI set stores Q8_0- and Q5_0-weight activations
 * offset to unsigned bytes with float scales, which its instruction needs;
 * the avx512 set's packed tiles (cpu_pack) read signed bytes with a float
 * scale and the block's negated sum.
 * The scalar set is the reference and has every loadable type; a SIMD set
 * must agree with float64 sums of the same decoded operands (for
 * attn_dots_q8q the operands include the query's rounding), and may
 * leave a type out (dot[T] NULL): the backend then uses the scalar set's
 * kernel and activation format for it. Activation-format kind numbers are
 * global across sets (the same kind is the same bytes), since one
 * conversion may feed kernels of two sets in a group. All functions are
 * pure and thread-safe. */
#ifndef LLM_CPU_KERNELS_H
#define LLM_CPU_KERNELS_H

#include "llm/quant.h"

/* The widest head attn_dots_q8q takes (its 8-row tiles keep a head's K
 * blocks on the stack: 8 x 16 vectors of 64 bytes at most). */
#define CPU_ATTN_Q8Q_HD 512

/* A query block for attn_dots_q8q: 32 values as d * qs. Unlike Q8_0's f16
 * d (llama.cpp rounds the query into Q8_0 here), a float: a query block
 * whose largest value is past f16's range (~8.3e6) or below its normal
 * range (~7.6e-6 x 127) keeps its scale, where an f16 d would make every
 * score infinite or drop the block. */
typedef struct cpu_q8q {
    float d;
    int8_t qs[QK8_0];
} cpu_q8q;

/* x (n, a multiple of 32) into n / 32 blocks: d = max |x| / 127, qs =
 * x / d rounded to nearest even (0 when d is 0); a block holding a value
 * that is not finite gets d = NaN, so its scores are NaN as float scores
 * would be. Pure; any thread. */
void cpu_q8q_quantize(const float *x, cpu_q8q *dst, int n);

typedef float (*cpu_dot_fn)(const void *w, const void *x, int n);
typedef void (*cpu_quant_fn)(const float *x, void *dst, int n);
/* A gated MLP's activation: out[i] = act(g[i]) * u[i]; out may be g (the
 * forward pass writes over the gate); each element's result depends only
 * on its own g, u (no position-dependent tail path). */
typedef void (*cpu_gated_fn)(const float *g, const float *u, float *out, int n);
/* One weight row against four activation rows (x, x + stride, ...): the
 * weight is loaded and decoded once for all four (prefill). */
typedef void (*cpu_dot4_fn)(const void *w, const void *x, size_t stride, int n, float *out);
/* o += sum_i w[i] * v_i over n rows v_i of a stored type, row_bytes apart,
 * hd values each (attention's weighted sum of V rows; LoRA's B t). */
typedef void (*cpu_wsum_kv_fn)(float *o, const float *w, const void *v, size_t row_bytes, int n, int hd);

/* An activation format. Weights whose formats have the same kind share one
 * conversion of x; kind 0 is float32 (x is used as it is). */
typedef struct cpu_act {
    int kind;
    size_t (*row_bytes)(int n);
    cpu_quant_fn quantize;
    void (*dequant)(const void *a, float *dst, int n); /* the values the dots use (tests) */
    /* Optional: converts `rows` (1..8) rows x_stride floats apart into one
     * tile of 8 * row_bytes bytes, the layout the set's dot8 kernels (or
     * its packed tiles, for a cpu_pack's act) read;
     * missing rows are zeros (a tile for the last 4..7 tokens, whose
     * lanes are computed and thrown away). Each row's values are exactly
     * those quantize gives; only the order differs. When NULL, dot8 reads
     * 8 rows in row format. */
    void (*quantize8)(const float *x, size_t x_stride, int rows, void *dst, int n);
} cpu_act;

extern const cpu_act cpu_act_f32;

/* A quantize8 made of a row format's quantize: `rows` (1..8) rows, x_stride
 * floats apart (missing rows: zeros), each converted by quant to n bytes
 * followed by n_words (at most 4) 4-byte arrays of n/32 values (scales, sums), are
 * scattered into the 8-row tile: per block of 32, eight groups of 4 bytes
 * token by token (token t's group j of block b at 256 b + 32 j + 4 t),
 * then each word array as (n/32 blocks, 8 tokens). */
void cpu_tile8(cpu_quant_fn quant, int n_words, const float *x, size_t x_stride, int rows, void *dst, int n);

/* How many of n_tok rows a conversion to a puts in 8-row tiles (the rest
 * follow in row format): whole tiles, plus a zero-padded one for a
 * remainder of 4..7 (its wasted lanes cost less than the one-row path);
 * 0 without a tile format. */
static inline int cpu_act_tiled(const cpu_act *a, int n_tok)
{
    if (!a->quantize8)
        return 0;
    return n_tok % 8 >= 4 ? (n_tok + 7) / 8 * 8 : n_tok / 8 * 8;
}

/* Packed weights: a set may keep a weight type in its own layout, made
 * once when the backend takes a model (llm_weight.packed), which its tile
 * kernel reads: rows in groups of `group`, each group packed on its own
 * and padded with zero rows. gemm computes rows of groups [g0, g1) for
 * n_tok activations x in format act (the first cpu_act_tiled(act, n_tok)
 * in 8-row tiles, then rows; x_row = act->row_bytes(cols)) into
 * y[t * y_stride + r], writing no row >= rows and no token >= n_tok; a
 * token's results do not depend on n_tok or on the groups asked for
 * (batch invariance). pack and gemm are pure and thread-safe; disjoint
 * group ranges may run at once. */
typedef struct cpu_pack {
    int group;
    size_t (*bytes)(int64_t rows, int64_t cols);
    void (*pack)(const void *w, size_t row_bytes, int64_t rows, int64_t cols, int64_t g0, int64_t g1, void *dst);
    void (*gemm)(const void *packed, int64_t rows, int64_t cols, int64_t g0, int64_t g1, const void *x, size_t x_row,
                 int n_tok, float *y, size_t y_stride);
    const cpu_act *act;
} cpu_pack;

typedef struct cpu_kernels {
    const char *name;
    cpu_dot_fn dot[QT_COUNT];          /* by weight type */
    cpu_dot4_fn dot4[QT_COUNT];        /* optional, by weight type */
    cpu_dot4_fn dot8[QT_COUNT];        /* optional: eight activation rows */
    cpu_dot4_fn dot16[QT_COUNT];       /* optional: two 8-row tiles, 8 * stride bytes apart */
    const cpu_act *act[QT_COUNT];      /* by weight type */
    const cpu_pack *pack[QT_COUNT];    /* optional, by weight type */
    float (*dot_f32)(const float *a, const float *b, int n);
    /* y += a * x */
    void (*axpy)(float *y, float a, const float *x, int n);
    /* Attention over n key/value rows `stride` floats apart (one KV block):
     * out[i] = scale * (q . k_i), and o += sum_i w[i] * v_i; hd floats each. */
    void (*attn_dots)(const float *q, const float *k, size_t stride, int n, int hd, float scale, float *out);
    void (*attn_wsum)(float *o, const float *w, const float *v, size_t stride, int n, int hd);
    /* The same on K/V rows read in place in their stored type, by type
     * (F16; Q8_0 with hd a multiple of 32; a set fills both entries of a
     * type or neither, NULL: rows are converted first), rows row_bytes
     * apart: bit for bit what attn_dots/attn_wsum give on the converted
     * rows. */
    void (*attn_dots_kv[QT_COUNT])(const float *q, const void *k, size_t row_bytes, int n, int hd, float scale,
                                   float *out);
    cpu_wsum_kv_fn attn_wsum_kv[QT_COUNT];
    /* Optional: scores against Q8_0 K rows in 8-bit integers, as llama.cpp
     * scores them: the query rounded to 8 bits per 32 values too
     * (cpu_q8q_quantize), each block an exact integer dot, then scaled by
     * both blocks' d. For nh query heads (q + h * hd / 32 blocks) and n K
     * rows row_bytes apart: out[h * out_stride + i] = scale * q_h . k_i;
     * hd a multiple of 32, at most CPU_ATTN_Q8Q_HD. A set with it scores
     * Q8_0 K this way for every query row of that shape (cpu_attention),
     * so a row's scores never depend on its batch; a score depends only on
     * (q_h, k_i, hd, scale), not on n, nh or where k_i sits among the n.
     * Such a set's Q8_0 attention differs from the float sets' by the
     * query's rounding (test_model: 8.2e-4 against 7.8e-4 relative to
     * float64 on the tiny model). */
    void (*attn_dots_q8q)(const cpu_q8q *q, int nh, const void *k, size_t row_bytes, int n, int hd, float scale,
                          float *out, size_t out_stride);
    /* Optional: attn_wsum for nh heads over the same float rows, each row
     * read once for all of them (a GQA group): o + h * o_stride +=
     * sum_i w[h * w_stride + i] v_i, bit for bit what attn_wsum gives
     * head by head. */
    void (*attn_wsum_heads)(float *o, size_t o_stride, const float *w, size_t w_stride, int nh, const float *v,
                            size_t stride, int n, int hd);
    /* KV rows stored as F16 or Q8_0 back to float (n values; n a multiple
     * of 32 for Q8_0). Exact, so every set gives the same floats. */
    void (*to_f32[QT_COUNT])(const void *src, float *dst, int n);
    /* float -> F16, round to nearest even (as quant_f32_to_f16) */
    void (*to_f16)(const float *src, quant_f16 *dst, int n);
    /* gelu(g) u, GELU's tanh form (llm_backend_i.geglu) computed as
     * g u / (1 + e^(-2v)) */
    cpu_gated_fn geglu;
    /* silu(g) u = g u / (1 + e^(-g)) (llm_backend_i.swiglu; the AVX2 set
     * gives 0 for g < -87, where the true value is under 1.4e-36 |u|) */
    cpu_gated_fn swiglu;
    /* x[i] = e^(x[i] - max) / sum over the n (>= 1) values: attention's
     * score rows (the AVX2 set's exponential stops at e^-87 ~ 1.6e-38
     * where the true value is smaller). A row's result depends only on its
     * own values and n. */
    void (*softmax)(float *x, int n);
    /* Optional: iters rounds of the set's widest int8 multiply-add on 12
     * independent registers (no memory traffic); returns the int8
     * operations done, a multiply and an add each: what the int8 peak
     * estimate (llm_backend_cpu_int8_peak) times. */
    double (*int8_spin)(long iters, int seed);
} cpu_kernels;

const cpu_kernels *cpu_kernels_scalar(void);
/* NULL when not compiled in or the CPU lacks AVX2/FMA/F16C. Packed
 * 256-bit tiles (vpmaddubsw) for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K. */
const cpu_kernels *cpu_kernels_avx2(void);
/* The AVX2 set with its tiles multiplying by AVX-VNNI's vpdpbusd; NULL
 * when the CPU lacks AVX-VNNI. */
const cpu_kernels *cpu_kernels_avxvnni(void);
/* The AVX2 set with AVX512-VNNI (256-bit) dot products for Q8_0 weights;
 * NULL when the CPU lacks AVX512-VNNI/VL. */
const cpu_kernels *cpu_kernels_vnni(void);
/* The AVX512-VNNI set with packed 512-bit tiles (cpu_pack) for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K;
 * NULL when the CPU lacks AVX-512 F/BW/VL/VNNI. */
const cpu_kernels *cpu_kernels_avx512(void);
/* Every set usable on this CPU, best first, NULL-terminated. */
const cpu_kernels *const *cpu_kernels_all(void);
const cpu_kernels *cpu_kernels_best(void);

#endif
