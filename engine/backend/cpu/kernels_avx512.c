/* kernels_avx512.c - the "avx512" kernel set: the AVX512-VNNI set plus
 * packed weights with 512-bit tiles (cpu_pack) for Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K and Q6_K, and two attention kernels
 * (below). Compiled with the
 * AVX-512 F/BW/VL/VNNI flags; cpu_kernels_avx512() checks the CPU at run
 * time.
 *
 * Why a packed layout: the row kernels (one weight row against 8 or 16
 * tokens) spend most of their instructions on loads, offsets and scale
 * handling per 32 weights, and reach about a third of the cores' vpdpbusd
 * rate. Here a group of 16 rows is interleaved (pk_layout.h) so that one
 * 64-byte load holds 4 consecutive weights of each of the 16 rows, a zmm
 * lane per row;
 * a token's 4 activations are broadcast (vpdpbusd's signed operand) and
 * one instruction adds 64 products. A tile keeps 2 groups x 8 tokens of
 * accumulators in registers, so each weight load serves 8 tokens and each
 * activation broadcast 32 rows.
 *
 * vpdpbusd multiplies unsigned by signed bytes: packed Q8_0 weights are
 * stored + 128 (a flip of the top bit) and activations stay signed, so
 * w . x = (w + 128) . x - 128 * sum(x); the activation format carries each
 * block's sum, and every token's integer chain starts at -128 * sum.
 *
 * Batch invariance: a (row, token) lane sees the same operations in the
 * same order whatever the tile (2 or 1 groups, 8, 4 or 1 tokens): per
 * block an exact integer sum, then f = ((float)s * dx) * dw + f in block
 * order. So a token's result does not depend on its batch.
 *
 * Attention: Q8_0 K scored in 8-bit integers (attn_dots_q8q) and V summed
 * for up to 4 heads of a GQA group at once (attn_wsum_heads); each keeps a
 * row's result independent of the rows and heads beside it (see there). */
#include "kernels.h"
#include "llm/status.h"
#include "pk_layout.h"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* Block b's (Q6_K: its part p's 16 columns') per-row scale of q . x (dw)
 * and, for the kinds with mins, what the block's dequantized activation
 * sum is taken times (*mn: Q4_K/Q5_K dmin m, Q4_1/Q5_1 -m). Q4_K/Q5_K
 * take their super-block's d and dmin from k4 (avx512_k4), read once per
 * super-block rather than per block. */
static inline __attribute__((always_inline)) __m512 avx512_scale(int kind, const uint8_t *g, int b, int p, __m512 *mn,
                                                                  const __m512 k4[2])
{
    if (kind == PK_Q2K) { /* d sc and dmin m, per 16 columns: exact, f16s times 4-bit integers */
        const uint8_t *h = pk_layout_super_at(kind, g, b);
        __m512i sm = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(h + pk_layout_q2k_sc(2 * (b % 8) + p))));
        __m512 sc = _mm512_cvtepi32_ps(_mm512_and_si512(sm, _mm512_set1_epi32(15)));
        __m512 m = _mm512_cvtepi32_ps(_mm512_srli_epi32(sm, 4));
        *mn = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 32))), m);
        return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)), sc);
    }
    if (kind == PK_Q6K || kind == PK_Q3K) { /* d sc: exact, an f16 times an 8-bit integer */
        const uint8_t *h = pk_layout_super_at(kind, g, b);
        __m512 sc = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(h + pk_layout_q6k_sc(2 * (b % 8) + p)))));
        return _mm512_mul_ps(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)), sc);
    }
    if (kind == PK_Q41 || kind == PK_Q51) {
        const uint8_t *q = pk_layout_qs(kind, g, b);
        *mn = _mm512_sub_ps(_mm512_setzero_ps(), _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q - 32))));
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(q - 64)));
    }
    if (!pk_layout_k4(kind))
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(pk_layout_qs(kind, g, b) - PK_ROWS * sizeof(quant_f16))));
    const uint8_t *h = pk_layout_super_at(kind, g, b);
    __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(h + pk_layout_k4_sc(b % 8)))));
    __m512 m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(h + pk_layout_k4_min(b % 8)))));
    *mn = _mm512_mul_ps(k4[1], m); /* both exact: an f16 times a 6-bit integer */
    return _mm512_mul_ps(k4[0], sc);
}

/* The quants of columns 4j..4j+3 of a block whose vectors are at q, as
 * unsigned bytes (16 rows x 4). */
static inline __attribute__((always_inline)) __m512i avx512_quants(int kind, const uint8_t *q, int j)
{
    if (kind == PK_Q8)
        return _mm512_loadu_si512(q + 64 * j);
    if (pk_layout_2bit(kind)) { /* bits 2 (j % 4) of plane j / 4; Q3_K: 4 more where its third bit is set */
        __m512i v = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512(q + 64 * (j / 4)), 2 * (j % 4)),
                                     _mm512_set1_epi8(3));
        if (kind == PK_Q3K) {
            uint64_t bits;
            memcpy(&bits, q + PK_ROWS * 8 + 8 * j, 8);
            v = _mm512_or_si512(v, _mm512_and_si512(_mm512_movm_epi8(bits), _mm512_set1_epi8(4)));
        }
        return v;
    }
    __m512i v = _mm512_loadu_si512(q + 64 * (j & 3));
    v = _mm512_and_si512(j < 4 ? v : _mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0f));
    if (pk_layout_fifth(kind)) { /* the fifth bits: a 64-bit mask made bytes of 16 */
        uint64_t bits;
        memcpy(&bits, q + PK_ROWS * 16 + 8 * j, 8);
        v = _mm512_or_si512(v, _mm512_and_si512(_mm512_movm_epi8(bits), _mm512_set1_epi8(0x10)));
    }
    if (kind == PK_Q6K) { /* the top two bits: bits 2 (j % 4) of plane j / 4, moved to bits 4..5 */
        __m512i top = _mm512_loadu_si512(q + PK_ROWS * 16 + 64 * (j / 4));
        int sh = 2 * (j % 4);
        top = sh < 4 ? _mm512_slli_epi16(top, 4 - sh) : sh == 4 ? top : _mm512_srli_epi16(top, 2);
        v = _mm512_or_si512(v, _mm512_and_si512(top, _mm512_set1_epi8(0x30)));
    }
    return v;
}

/* Token t's starting integer sum for part p of block i (its index in
 * the view): -offset * sum(x) over the part's columns (offset 128, 8, 16,
 * Q6_K's 32 or Q3_K's 4; Q4_K, Q2_K: none, their mins come in the float
 * step). */
static inline __attribute__((always_inline)) __m512i avx512_start(const int kind, pk_layout_view x, size_t i, int p)
{
    if (pk_layout_mins(kind))
        return _mm512_setzero_si512();
    int32_t ns = pk_layout_part_nsum(kind, x, i, p);
    return _mm512_slli_epi32(_mm512_set1_epi32(ns), pk_layout_offset_log2(kind));
}

/* The exact integer sums s[r][t] of steps [j0, j1) (4 columns each) of
 * block b of R groups (gstride bytes apart) against T tokens' quants at
 * xq (step j of token t at xq + qj j + 4 t); s holds the starting values. */
static inline __attribute__((always_inline)) void avx512_sums(const int kind, const int R, const int T, const uint8_t *w,
                                                           size_t gstride, int b, const int8_t *xq, const int qj,
                                                           const int j0, const int j1, __m512i s[2][8])
{
    _Pragma("GCC unroll 8") for (int j = j0; j < j1; j++) {
        __m512i wq[2];
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
            wq[r] = avx512_quants(kind, pk_layout_qs(kind, w + (size_t)r * gstride, b), j);
        _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
            int32_t x4;
            memcpy(&x4, xq + qj * j + 4 * t, 4);
            __m512i xb = _mm512_set1_epi32(x4);
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) s[r][t] = _mm512_dpbusd_epi32(s[r][t], wq[r], xb);
        }
    }
}

/* Kinds of plain 4-bit nibbles (no fifth or top bits). */
static inline int avx512_nibbles(int kind) { return kind == PK_Q4 || kind == PK_Q41 || kind == PK_Q4K; }

/* avx512_sums for one token (T == 1) over a whole block of a nibble kind
 * (one part: np == 1, so j runs over all of it), into s[r][0], with fewer
 * instructions: alone, a token's tile runs little faster than the memory
 * it reads, so any stall shows (one Q4_K matrix in L2 - 256x2048, then
 * 512x4096 - timed alone over thousands of calls, one thread, best run:
 * 42-45 -> 50-53 GB/s on a Zen 4 EPYC whose memory reads 25-32 GB/s; 80 ->
 * 88 GB/s on a Zen 5 EPYC reading 40). The high nibbles are masked in place (v & 0xf0
 * = 16 q) instead of shifted down, and summed in a chain of their own
 * that is divided by 16 at the end (exact: an integer multiple of 16),
 * which also halves the chains' latency. Same sums as avx512_sums. */
static inline __attribute__((always_inline)) void avx512_sums_split(const int kind, const int R, const uint8_t *w,
                                                                 size_t gstride, int b, const int8_t *xq,
                                                                 __m512i s[2][8])
{
    __m512i hi[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {
        int32_t lo4, hi4;
        memcpy(&lo4, xq + 4 * j, 4);
        memcpy(&hi4, xq + 4 * (j + 4), 4);
        __m512i xl = _mm512_set1_epi32(lo4), xh = _mm512_set1_epi32(hi4);
        _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
            __m512i v = _mm512_loadu_si512(pk_layout_qs(kind, w + (size_t)r * gstride, b) + 64 * j);
            s[r][0] = _mm512_dpbusd_epi32(s[r][0], _mm512_and_si512(v, _mm512_set1_epi8(0x0f)), xl);
            hi[r] = _mm512_dpbusd_epi32(hi[r], _mm512_and_si512(v, _mm512_set1_epi8((char)0xf0)), xh);
        }
    }
    _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) s[r][0] = _mm512_add_epi32(s[r][0], _mm512_srai_epi32(hi[r], 4));
}

/* A Q4_K/Q5_K group's d and dmin (16 rows each) of the super-block
 * holding block b, as floats. */
static inline __attribute__((always_inline)) void avx512_k4(int kind, const uint8_t *g, int b, __m512 k4[2])
{
    const uint8_t *h = pk_layout_super_at(kind, g, b);
    k4[0] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h));
    k4[1] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + 32)));
}

/* R groups (gstride bytes apart) x T tokens (a tile's 8, or a row's 1)
 * of one tile; y gets token t's rows at y + t * y_stride, tokens past
 * n_valid and the last group's rows past `valid` (1..16) left alone.
 * kind, R and T are constants at every call. */
static inline __attribute__((always_inline)) void avx512_tile(const int kind, const int R, const int T, const uint8_t *w,
                                                           size_t gstride, int nb, pk_layout_view x, float *y,
                                                           size_t y_stride, int n_valid, int valid)
{
    const int qb = T == 8 ? 256 : 32, qj = T == 8 ? 32 : 4, sb = T == 8 ? 8 : 1;
    /* Q6_K's, Q3_K's and Q2_K's scales are per 16 columns: two parts of a block, each its own integer sum */
    const int np = pk_layout_halves(kind) ? 2 : 1, jn = QK8_0 / 4 / np;
    __m512 f[2][8];
    _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
        f[r][t] = _mm512_setzero_ps();
    /* Q4_K/Q5_K: the super-block's d and dmin per group, set at its first
     * block (the zeros only quiet gcc's maybe-uninitialized) */
    __m512 k4[2][2] = {{_mm512_setzero_ps(), _mm512_setzero_ps()}, {_mm512_setzero_ps(), _mm512_setzero_ps()}};
    for (int b = 0; b < nb; b++) {
        if (pk_layout_k4(kind) && b % 8 == 0)
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) avx512_k4(kind, w + (size_t)r * gstride, b, k4[r]);
        if (T == 1) /* the stream PK_LAYOUT_PF bytes ahead in each group */
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                pk_layout_prefetch(kind, w + (size_t)r * gstride, b, PK_LAYOUT_PF);
        _Pragma("GCC unroll 2") for (int p = 0; p < np; p++) {
            __m512i s[2][8];
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                s[r][t] = avx512_start(kind, x, (size_t)sb * b + t, p);
            if (T == 1 && avx512_nibbles(kind))
                avx512_sums_split(kind, R, w, gstride, b, x.q + (size_t)qb * b, s);
            else
                avx512_sums(kind, R, T, w, gstride, b, x.q + (size_t)qb * b, qj, p * jn, (p + 1) * jn, s);
            __m512 dw[2], mn[2];
            _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
                dw[r] = avx512_scale(kind, w + (size_t)r * gstride, b, p, &mn[r], k4[r]);
            _Pragma("GCC unroll 8") for (int t = 0; t < T; t++) {
                size_t i = (size_t)sb * b + t;
                __m512 dx = _mm512_set1_ps(x.d[i]);
                /* kinds with mins: the dequantized sum of the part, dx * sum(xq) */
                __m512 xs = _mm512_set1_ps(pk_layout_mins(kind) ? x.d[i] * (float)-pk_layout_part_nsum(kind, x, i, p) : 0.0f);
                _Pragma("GCC unroll 2") for (int r = 0; r < R; r++) {
                    f[r][t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s[r][t]), dx), dw[r], f[r][t]);
                    if (pk_layout_mins(kind))
                        f[r][t] = _mm512_fnmadd_ps(mn[r], xs, f[r][t]);
                }
            }
        }
    }
    __mmask16 last = (__mmask16)((1u << valid) - 1);
    _Pragma("GCC unroll 8") for (int t = 0; t < T && t < n_valid; t++) _Pragma("GCC unroll 2") for (int r = 0; r < R; r++)
    {
        float *yt = y + (size_t)t * y_stride + PK_ROWS * r;
        if (r == R - 1 && valid < PK_ROWS)
            _mm512_mask_storeu_ps(yt, last, f[r][t]);
        else
            _mm512_storeu_ps(yt, f[r][t]);
    }
}

/* One R-group column of the output, every token: the tiles, then the rows. */
static inline __attribute__((always_inline)) void avx512_col(const int kind, const int R, const uint8_t *w, size_t gstride,
                                                          int nb, const char *x, size_t x_row, int n_tok, int n,
                                                          float *y, size_t y_stride, int valid)
{
    int t = 0, tiled = cpu_act_tiled(&pk_layout_act, n_tok);
    for (; t < tiled; t += 8)
        avx512_tile(kind, R, 8, w, gstride, nb, pk_layout_tile_view(x + (size_t)t * x_row, n), y + (size_t)t * y_stride,
                y_stride, n_tok - t, valid);
    for (; t < n_tok; t++)
        avx512_tile(kind, R, 1, w, gstride, nb, pk_layout_row_view(x + (size_t)t * x_row, n), y + (size_t)t * y_stride, y_stride,
                1, valid);
}

/* Groups [g0, g1) two at a time (one at the end); for one token, one at a
 * time: a thread then reads one stream of weights, not two a group apart,
 * and decode ran faster on a Zen 4 EPYC (tinyllama-1.1b, 2 threads,
 * medians of 7-9 alternating runs: Q4_K 36.0 -> 46.0 tok/s, Q4_0 49.7 ->
 * 55.0, Q6_K 29.6 -> 32.3, Q8_0 25.3 -> 26.4). What it is not: the
 * vpdpbusd chains (split 2 or 4 ways: no gain) or the scale and float
 * work (dropped altogether: +2%). */
static inline __attribute__((always_inline)) void avx512_gemm(const int kind, const void *pw, int64_t rows, int64_t cols,
                                                           int64_t g0, int64_t g1, const void *x, size_t x_row,
                                                           int n_tok, float *y, size_t y_stride)
{
    int nb = (int)(cols / QK8_0);
    size_t gstride = pk_layout_group_bytes(kind, cols);
    for (int64_t g = g0; g < g1;) {
        const uint8_t *w = (const uint8_t *)pw + (size_t)g * gstride;
        float *yg = y + (size_t)g * PK_ROWS;
        int R = g + 1 < g1 && n_tok > 1 ? 2 : 1;
        int64_t end = (g + R) * PK_ROWS;
        int valid = end <= rows ? PK_ROWS : (int)(rows - (end - PK_ROWS));
        if (R == 2)
            avx512_col(kind, 2, w, gstride, nb, x, x_row, n_tok, (int)cols, yg, y_stride, valid);
        else
            avx512_col(kind, 1, w, gstride, nb, x, x_row, n_tok, (int)cols, yg, y_stride, valid);
        g += R;
    }
}

/* A type's cpu_pack: its size, pack and gemm entry points, each the
 * shared code with the kind a constant (the tile is compiled per kind). */
#define AVX512_TYPE(name, kind)                                                                                       \
    static size_t name##_bytes(int64_t rows, int64_t cols) { return pk_layout_groups(rows) * pk_layout_group_bytes(kind, cols); } \
    static void name##_pack(const void *w, size_t row_bytes, int64_t rows, int64_t cols, int64_t g0, int64_t g1,    \
                            void *dst)                                                                            \
    {                                                                                                             \
        pk_layout_pack(kind, w, row_bytes, rows, cols, g0, g1, dst);                                                     \
    }                                                                                                             \
    static void name##_gemm(const void *pw, int64_t rows, int64_t cols, int64_t g0, int64_t g1, const void *x,     \
                            size_t x_row, int n_tok, float *y, size_t y_stride)                                   \
    {                                                                                                             \
        avx512_gemm(kind, pw, rows, cols, g0, g1, x, x_row, n_tok, y, y_stride);                                      \
    }                                                                                                             \
    static const cpu_pack name = {PK_ROWS, name##_bytes, name##_pack, name##_gemm, &pk_layout_act};

AVX512_TYPE(pack_q8_0, PK_Q8)
AVX512_TYPE(pack_q4_0, PK_Q4)
AVX512_TYPE(pack_q4_K, PK_Q4K)
AVX512_TYPE(pack_q5_0, PK_Q5)
AVX512_TYPE(pack_q6_K, PK_Q6K)
AVX512_TYPE(pack_q5_K, PK_Q5K)
AVX512_TYPE(pack_q4_1, PK_Q41)
AVX512_TYPE(pack_q5_1, PK_Q51)
AVX512_TYPE(pack_q2_K, PK_Q2K)
AVX512_TYPE(pack_q3_K, PK_Q3K)

/* The peak estimate's loop: 12 vpdpbusd chains of 64 multiply-adds. */
static double spin512(long iters, int seed)
{
    __m512i a[12], w = _mm512_set1_epi8((char)(seed | 1)), x = _mm512_set1_epi8((char)(seed + 3));
    for (int i = 0; i < 12; i++) a[i] = _mm512_set1_epi32(seed + i); /* distinct: no chain merges with another */
    for (long it = 0; it < iters; it++)
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm512_dpbusd_epi32(a[i], w, x);
    volatile int sink = 0;
    for (int i = 0; i < 12; i++) sink += _mm512_reduce_add_epi32(a[i]);
    (void)sink;
    return 12.0 * 128.0 * (double)iters;
}

/* ---- attention scores on Q8_0 K rows in 8-bit integers ------------------------ */

/* Why: a decode step's attention over Q8_0 K/V spent as long on q . k as
 * on reading the rows, converting K to floats and multiplying in 256-bit
 * floats. Here 64 products take one vpdpbusd. K's bytes are flipped to
 * K + 128 (unsigned, vpdpbusd's first operand) and every lane's chain
 * starts at -128 * the sum of its 4 query bytes, so the chain ends at
 * q . k exactly (|chain| < 2^18); each lane (4 bytes of one block) is then
 * scaled by its two blocks' d's product (exact: an f16 times a float
 * rounded once) and added to the row's float sums in block order. A tile
 * is 8 K rows flipped and given their lane scales once for every head of
 * the GQA group. Batch invariance: a (row, head) score takes the same
 * operations whatever the tile's other rows, n or nh (q8q_reduce8). */

enum { Q8Q_ROWS = 8, Q8Q_PAIRS = CPU_ATTN_Q8Q_HD / (2 * QK8_0) };
_Static_assert(Q8Q_ROWS == 8, "the tile's sums are a0..a7 and its store mask 8 bits");

/* 32 bytes at lo and at hi (NULL: zeros) as one vector. */
static inline __m512i avx512_q8q_join(const int8_t *lo, const int8_t *hi)
{
    __m256i h = hi ? _mm256_loadu_si256((const __m256i *)hi) : _mm256_setzero_si256();
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)), h, 1);
}

/* Lanes 0-7 d0, lanes 8-15 d1: a joined pair's block scales. */
static inline __m512 avx512_q8q_lanes(float d0, float d1)
{
    return _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(d0), _mm512_set1_ps(d1));
}

/* One 256-bit half sum of a row's 16 lanes. */
static inline __m256 avx512_q8q_half(__m512 a)
{
    return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

/* Eight rows' 16 lanes each to one sum per row, every row by the same
 * tree whatever the other seven hold. */
static inline __m256 avx512_q8q_reduce8(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5, __m512 a6,
                                        __m512 a7)
{
    __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(avx512_q8q_half(a0), avx512_q8q_half(a1)),
                               _mm256_hadd_ps(avx512_q8q_half(a2), avx512_q8q_half(a3)));
    __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(avx512_q8q_half(a4), avx512_q8q_half(a5)),
                               _mm256_hadd_ps(avx512_q8q_half(a6), avx512_q8q_half(a7)));
    return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

/* K rows [i0, i0 + 8) flipped to unsigned bytes, with their lane scales,
 * pair by pair; rows past n repeat row i0 (computed, never stored). */
static void avx512_q8q_rows(const void *k, size_t row_bytes, int i0, int n, int nb, __m512i ku[][Q8Q_PAIRS],
                            __m512 dk[][Q8Q_PAIRS])
{
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    for (int r = 0; r < Q8Q_ROWS; r++) {
        const block_q8_0 *kr = (const block_q8_0 *)((const char *)k + (size_t)(i0 + (i0 + r < n ? r : 0)) * row_bytes);
        for (int p = 0; 2 * p < nb; p++) {
            int two = 2 * p + 1 < nb;
            ku[r][p] = _mm512_xor_si512(avx512_q8q_join(kr[2 * p].qs, two ? kr[2 * p + 1].qs : NULL), flip);
            dk[r][p] = avx512_q8q_lanes(_cvtsh_ss(kr[2 * p].d), two ? _cvtsh_ss(kr[2 * p + 1].d) : 0.0f);
        }
    }
}

/* Row r's chain over pair p: the exact integer dot, scaled per lane. */
#define Q8Q_ROW(r)                                                                               \
    a##r = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, ku[r][p], qs)),          \
                           _mm512_mul_ps(dk[r][p], dq), a##r)

static void attn_dots_q8q(const cpu_q8q *q, int nh, const void *k, size_t row_bytes, int n, int hd, float scale,
                          float *out, size_t out_stride)
{
    LLM_ASSERT(hd % QK8_0 == 0 && hd <= CPU_ATTN_Q8Q_HD); /* the tile's arrays hold CPU_ATTN_Q8Q_HD */
    int nb = hd / QK8_0;
    __m512i ku[Q8Q_ROWS][Q8Q_PAIRS];
    __m512 dk[Q8Q_ROWS][Q8Q_PAIRS];
    for (int i0 = 0; i0 < n; i0 += Q8Q_ROWS) {
        avx512_q8q_rows(k, row_bytes, i0, n, nb, ku, dk);
        __mmask8 keep = n - i0 >= Q8Q_ROWS ? 0xff : (__mmask8)((1u << (n - i0)) - 1);
        for (int h = 0; h < nh; h++) {
            const cpu_q8q *qh = q + (size_t)h * (size_t)nb;
            __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (int p = 0; 2 * p < nb; p++) {
                int two = 2 * p + 1 < nb;
                __m512i qs = avx512_q8q_join(qh[2 * p].qs, two ? qh[2 * p + 1].qs : NULL);
                __m512i bias = _mm512_sub_epi32(_mm512_setzero_si512(),
                                                _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80), qs));
                __m512 dq = avx512_q8q_lanes(qh[2 * p].d, two ? qh[2 * p + 1].d : 0.0f);
                Q8Q_ROW(0); Q8Q_ROW(1); Q8Q_ROW(2); Q8Q_ROW(3);
                Q8Q_ROW(4); Q8Q_ROW(5); Q8Q_ROW(6); Q8Q_ROW(7);
            }
            __m256 sc = _mm256_mul_ps(avx512_q8q_reduce8(a0, a1, a2, a3, a4, a5, a6, a7), _mm256_set1_ps(scale));
            _mm256_mask_storeu_ps(out + (size_t)h * out_stride + i0, keep, sc);
        }
    }
}
#undef Q8Q_ROW

/* ---- attention's weighted sum for a GQA group --------------------------------- */

/* Why: attn_wsum keeps 8 256-bit sums of one head in registers, each a
 * chain of dependent multiply-adds, one link per row: the chains' latency,
 * not the adds, set its pace, and every head of a group read the block
 * again. Here up to WSUM_HEADS heads' WSUM_DIMS dimensions (16 zmm sums)
 * take each row's values once: 16 independent chains. Each value still
 * gets o = fma(w_i, v_i, o) row after row, so the sums equal attn_wsum's. */

enum { WSUM_HEADS = 4, WSUM_VECS = 4, WSUM_DIMS = 16 * WSUM_VECS };

/* Dimensions [d, d + WSUM_DIMS) (lanes past hd8 masked off) of HN heads;
 * HN is a constant once inlined, so the sums stay in registers. */
static inline __attribute__((always_inline)) void avx512_wsum_heads_tile(float *o, size_t o_stride, const float *w,
                                                                         size_t w_stride, const float *v, size_t stride,
                                                                         int n, int d, int hd8, const int HN)
{
    __mmask16 m[WSUM_VECS];
    __m512 a[WSUM_HEADS][WSUM_VECS];
    _Pragma("GCC unroll 4") for (int c = 0; c < WSUM_VECS; c++) {
        int left = hd8 - d - 16 * c;
        m[c] = left >= 16 ? 0xffff : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
    }
    _Pragma("GCC unroll 4") for (int h = 0; h < HN; h++)
        _Pragma("GCC unroll 4") for (int c = 0; c < WSUM_VECS; c++)
            a[h][c] = _mm512_maskz_loadu_ps(m[c], o + (size_t)h * o_stride + d + 16 * c);
    for (int i = 0; i < n; i++) {
        const float *vi = v + (size_t)i * stride + d;
        __m512 x[WSUM_VECS];
        _Pragma("GCC unroll 4") for (int c = 0; c < WSUM_VECS; c++) x[c] = _mm512_maskz_loadu_ps(m[c], vi + 16 * c);
        _Pragma("GCC unroll 4") for (int h = 0; h < HN; h++) {
            __m512 wi = _mm512_set1_ps(w[(size_t)h * w_stride + (size_t)i]);
            _Pragma("GCC unroll 4") for (int c = 0; c < WSUM_VECS; c++) a[h][c] = _mm512_fmadd_ps(wi, x[c], a[h][c]);
        }
    }
    _Pragma("GCC unroll 4") for (int h = 0; h < HN; h++)
        _Pragma("GCC unroll 4") for (int c = 0; c < WSUM_VECS; c++)
            _mm512_mask_storeu_ps(o + (size_t)h * o_stride + d + 16 * c, m[c], a[h][c]);
}

static void attn_wsum_heads(float *o, size_t o_stride, const float *w, size_t w_stride, int nh, const float *v,
                            size_t stride, int n, int hd)
{
    int hd8 = hd & ~7;
    for (int d = 0; d < hd8; d += WSUM_DIMS)
        for (int h = 0; h < nh;) {
            float *oh = o + (size_t)h * o_stride;
            const float *wh = w + (size_t)h * w_stride;
            if (nh - h >= WSUM_HEADS)
                avx512_wsum_heads_tile(oh, o_stride, wh, w_stride, v, stride, n, d, hd8, WSUM_HEADS), h += WSUM_HEADS;
            else if (nh - h >= 2)
                avx512_wsum_heads_tile(oh, o_stride, wh, w_stride, v, stride, n, d, hd8, 2), h += 2;
            else
                avx512_wsum_heads_tile(oh, o_stride, wh, w_stride, v, stride, n, d, hd8, 1), h += 1;
        }
    /* the last hd % 8 dimensions as attn_wsum's tail: multiply, then add */
    for (int h = 0; hd8 < hd && h < nh; h++)
        for (int i = 0; i < n; i++)
            for (int e = hd8; e < hd; e++)
                o[(size_t)h * o_stride + e] += w[(size_t)h * w_stride + i] * v[(size_t)i * stride + e];
}

/* ---- the set ------------------------------------------------------------------- */

static cpu_kernels avx512;
static pthread_once_t avx512_once = PTHREAD_ONCE_INIT;

static void avx512_init(void)
{
    avx512 = *cpu_kernels_vnni();
    avx512.name = "avx512";
    avx512.pack[QT_Q8_0] = &pack_q8_0;
    avx512.pack[QT_Q4_0] = &pack_q4_0;
    avx512.pack[QT_Q5_0] = &pack_q5_0;
    avx512.pack[QT_Q4_K] = &pack_q4_K;
    avx512.pack[QT_Q6_K] = &pack_q6_K;
    avx512.pack[QT_Q5_K] = &pack_q5_K;
    avx512.pack[QT_Q4_1] = &pack_q4_1;
    avx512.pack[QT_Q5_1] = &pack_q5_1;
    avx512.pack[QT_Q2_K] = &pack_q2_K;
    avx512.pack[QT_Q3_K] = &pack_q3_K;
    avx512.int8_spin = spin512;
    avx512.attn_dots_q8q = attn_dots_q8q;
    avx512.attn_wsum_heads = attn_wsum_heads;
}

const cpu_kernels *cpu_kernels_avx512(void)
{
    __builtin_cpu_init();
    if (!cpu_kernels_vnni() || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw"))
        return NULL;
    pthread_once(&avx512_once, avx512_init);
    return &avx512;
}
#else
const cpu_kernels *cpu_kernels_avx512(void) { return NULL; }
#endif
