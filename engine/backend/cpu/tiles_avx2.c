/* tiles_avx2.c - 256-bit tiles over packed weights (pk_layout.h) for the
 * avx2 and avxvnni kernel sets. Compiled with the AVX2 flags only; the
 * avxvnni tiles issue vpdpbusd through inline assembly (VEX form), so that
 * nothing else in this file can be compiled to an instruction the avx2
 * set's CPUs lack. The sets check the CPU at run time.
 *
 * A 16-row group is two halves of 8 rows, a ymm of 8 int32 lanes each (a
 * lane per row); per 4 columns a 32-byte load gives a half's quants, a
 * token's 4 activations are broadcast, and the multiply-add is:
 *   avxvnni: one vpdpbusd (unsigned quants x signed activations, int32);
 *   avx2:    vpmaddubsw (pairs to int16) then vpaddw into an int16 sum,
 *            made int32 by one vpmaddwd per 32 columns (nibble quants:
 *            8 x 2 x 15 x 127 = 30,480 fits int16), per 16 (5-bit quants:
 *            4 x 2 x 31 x 127 = 31,496) or per 8 (Q6_K: 2 x 2 x 63 x 127
 *            = 32,004; Q2_K's and Q3_K's 2- and 3-bit quants take the
 *            nibbles' 32); Q8_0 quants would
 *            saturate vpmaddubsw, so they go signed and unsigned by the
 *            sign trick (|w| times x with w's sign) into int32 per step.
 * A tile is one group x 4 tokens (or 1), so each weight load serves 4
 * tokens and each broadcast 16 rows.
 *
 * Batch invariance: a (row, token) lane sees the same operations in the
 * same order whatever the tile: an exact integer block sum, then
 * f = ((float)s * dx) * dw + f in block order. */
#include "tiles_avx2.h"

#include "pk_layout.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

/* acc += w (unsigned bytes) . x (signed bytes), per int32 lane: AVX-VNNI's
 * vpdpbusd (VEX), which no flag of this file lets the compiler emit. */
AI __m256i t2_dpbusd(__m256i acc, __m256i w, __m256i x)
{
    __asm__("%{vex%} vpdpbusd %2, %1, %0" : "+x"(acc) : "x"(w), "x"(x));
    return acc;
}

/* The unsigned quants of columns 4j..4j+3 of half h (rows 8h..8h+7) of a
 * block whose vectors are at q. */
AI __m256i t2_quants(const int kind, const uint8_t *q, int j, int h)
{
    if (kind == PK_Q8)
        return _mm256_loadu_si256((const __m256i *)(q + 64 * j + 32 * h));
    __m256i v;
    if (pk_layout_2bit(kind)) /* bits 2 (j % 4) of plane j / 4 */
        v = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(q + 64 * (j / 4) + 32 * h)), 2 * (j % 4)),
                             _mm256_set1_epi8(3));
    else {
        v = _mm256_loadu_si256((const __m256i *)(q + 64 * (j & 3) + 32 * h));
        v = _mm256_and_si256(j < 4 ? v : _mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0f));
    }
    if (pk_layout_fifth(kind) || kind == PK_Q3K) { /* the half's 32 fifth (Q3_K: third) bits, bit i for byte i,
                                                  * made bytes of 16 (Q3_K: of 4) */
        uint32_t bits;
        memcpy(&bits, q + PK_ROWS * (kind == PK_Q3K ? 8 : 16) + 8 * j + 4 * h, 4);
        __m256i m = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
                                        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2,
                                                         2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
        const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        m = _mm256_cmpeq_epi8(_mm256_and_si256(m, bit), bit);
        v = _mm256_or_si256(v, _mm256_and_si256(m, _mm256_set1_epi8(kind == PK_Q3K ? 0x04 : 0x10)));
    }
    if (kind == PK_Q6K) { /* the top two bits: bits 2 (j % 4) of plane j / 4, moved to bits 4..5 */
        __m256i top = _mm256_loadu_si256((const __m256i *)(q + PK_ROWS * 16 + 64 * (j / 4) + 32 * h));
        int sh = 2 * (j % 4);
        top = sh < 4 ? _mm256_slli_epi16(top, 4 - sh) : sh == 4 ? top : _mm256_srli_epi16(top, 2);
        v = _mm256_or_si256(v, _mm256_and_si256(top, _mm256_set1_epi8(0x30)));
    }
    return v;
}

/* Half h's per-row scale of q . x for block b (Q6_K: its part p's 16
 * columns) of the group at g, and for the kinds with mins what the
 * block's dequantized activation sum is taken times (*mn: Q4_K/Q5_K
 * dmin m, Q4_1/Q5_1 -m; all products exact in float: an f16 times a 6- or
 * 8-bit integer). K-quants: hd is the block's super-block header, kd its
 * d and dmin for the half (t2_super). */
AI __m256 t2_scale(const int kind, const uint8_t *g, const uint8_t *hd, const __m256 kd[2], int b, int p, int h,
                   __m256 *mn)
{
    if (kind == PK_Q2K) { /* the file's scale byte: scale low nibble, min high */
        __m256i sm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(hd + pk_layout_q2k_sc(2 * (b % 8) + p) + 8 * h)));
        *mn = _mm256_mul_ps(kd[1], _mm256_cvtepi32_ps(_mm256_srli_epi32(sm, 4)));
        return _mm256_mul_ps(kd[0], _mm256_cvtepi32_ps(_mm256_and_si256(sm, _mm256_set1_epi32(15))));
    }
    if (kind == PK_Q6K || kind == PK_Q3K) {
        __m256 sc = _mm256_cvtepi32_ps(
            _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(hd + pk_layout_q6k_sc(2 * (b % 8) + p) + 8 * h))));
        return _mm256_mul_ps(kd[0], sc);
    }
    if (kind == PK_Q41 || kind == PK_Q51) {
        const uint8_t *q = pk_layout_qs(kind, g, b);
        *mn = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q - 32 + 16 * h))));
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(q - 64 + 16 * h)));
    }
    if (!pk_layout_k4(kind))
        return _mm256_cvtph_ps(
            _mm_loadu_si128((const __m128i *)(pk_layout_qs(kind, g, b) - PK_ROWS * sizeof(quant_f16) + 16 * h)));
    __m256 d = kd[0], dmin = kd[1];
    __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(hd + pk_layout_k4_sc(b % 8) + 8 * h))));
    __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(hd + pk_layout_k4_min(b % 8) + 8 * h))));
    *mn = _mm256_mul_ps(dmin, m);
    return _mm256_mul_ps(d, sc);
}

/* A K-quant super-block's header (at hd): half h's d and (Q4_K/Q5_K)
 * dmin as floats, converted once for its 8 blocks. */
AI void t2_super(const int kind, const uint8_t *hd, int h, __m256 kd[2])
{
    kd[0] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd + 16 * h)));
    kd[1] = pk_layout_k4(kind) || kind == PK_Q2K ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd + 32 + 16 * h)))
                               : _mm256_setzero_ps();
}

/* What a token's block sum starts from: -offset * sum(x) (the offset the
 * unsigned quants carry; the avx2 Q8_0 path uses signed quants). */
AI int t2_shift(const int kind, const int vnni)
{
    return kind == PK_Q8 && !vnni ? -1 : pk_layout_offset_log2(kind);
}

/* Steps (4 columns each) of an int16 sum before it is made int32 (avx2):
 * 8 x 2 x 15 x 127 fits int16, so do 4 x 2 x 31 x 127 and 2 x 2 x 63 x 127. */
AI int t2_flush(const int kind) { return pk_layout_fifth(kind) ? 4 : kind == PK_Q6K ? 2 : 8; }

/* Token t's starting integer sum for part p of block i (its index in
 * the view): -offset * sum(x) over the columns the part covers. */
AI __m256i t2_start(const int kind, const int vnni, pk_layout_view x, size_t i, int p)
{
    int sh = t2_shift(kind, vnni);
    int32_t ns = pk_layout_part_nsum(kind, x, i, p);
    return sh < 0 ? _mm256_setzero_si256() : _mm256_set1_epi32(ns * (1 << sh));
}

/* The exact integer sums s[h][t] of steps [j0, j1) (4 columns each) of
 * the block whose quants are at q, against T tokens' quants at xq (step j
 * of token t at xq + qj j + 4 t); s holds the starting values. */
AI void t2_sums(const int kind, const int vnni, const int T, const uint8_t *q, const int8_t *xq, const int qj,
                const int j0, const int j1, __m256i s[2][4])
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s16[2][4];
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) s16[0][t] = s16[1][t] = _mm256_setzero_si256();
    _Pragma("GCC unroll 8") for (int j = j0; j < j1; j++) {
        __m256i wq[2], aw[2];
        _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
            wq[h] = t2_quants(kind, q, j, h);
            if (!vnni && kind == PK_Q8) { /* signed quants and their magnitudes */
                wq[h] = _mm256_xor_si256(wq[h], _mm256_set1_epi8((char)0x80));
                aw[h] = _mm256_abs_epi8(wq[h]);
            }
        }
        _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
            int32_t x4;
            memcpy(&x4, xq + qj * j + 4 * t, 4);
            __m256i xb = _mm256_set1_epi32(x4);
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                if (vnni)
                    s[h][t] = t2_dpbusd(s[h][t], wq[h], xb);
                else if (kind == PK_Q8)
                    s[h][t] = _mm256_add_epi32(
                        s[h][t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw[h], _mm256_sign_epi8(xb, wq[h])), ones));
                else { /* the empty asm keeps each sum a running register: left alone, the compiler
                        * re-associated the adds and spilled every product to the stack first */
                    s16[h][t] = _mm256_add_epi16(s16[h][t], _mm256_maddubs_epi16(wq[h], xb));
                    __asm__("" : "+x"(s16[h][t]));
                }
            }
        }
        if (!vnni && kind != PK_Q8 && ((j + 1) % t2_flush(kind) == 0 || j + 1 == j1))
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++)
            {
                s[h][t] = _mm256_add_epi32(s[h][t], _mm256_madd_epi16(s16[h][t], ones));
                s16[h][t] = _mm256_setzero_si256();
            }
    }
}

/* One group (two halves) x T tokens (4 of a tile's 8, or a row's 1):
 * y gets token t's rows at y + t * y_stride, tokens past n_valid and rows
 * past `valid` (1..16) left alone. kind, vnni and T are constants. */
AI void t2_tile(const int kind, const int vnni, const int T, const uint8_t *w, int nb, pk_layout_view x,
                const int sb, const int qb, const int qj, float *y, size_t y_stride, int n_valid, int valid)
{
    /* Q6_K's, Q3_K's and Q2_K's scales are per 16 columns: two parts of a block, each its own integer sum */
    const int np = pk_layout_halves(kind) ? 2 : 1, jn = QK8_0 / 4 / np;
    __m256 f[2][4];
    _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) f[0][t] = f[1][t] = _mm256_setzero_ps();
    /* K-quants: the current super-block's header and its d, dmin per half, set at
     * its first block (the zeros only quiet gcc's maybe-uninitialized) */
    const uint8_t *hd = w;
    __m256 kd[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
    for (int b = 0; b < nb; b++) {
        const uint8_t *q = pk_layout_qs(kind, w, b);
        if (pk_layout_kquant(kind) && b % 8 == 0) {
            hd = pk_layout_super_at(kind, w, b);
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) t2_super(kind, hd, h, kd[h]);
        }
        if (T == 1)
            pk_layout_prefetch(kind, w, b, PK_LAYOUT_PF);
        _Pragma("GCC unroll 2") for (int p = 0; p < np; p++) {
            __m256i s[2][4];
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) s[0][t] = s[1][t] = t2_start(kind, vnni, x, (size_t)sb * b + t, p);
            t2_sums(kind, vnni, T, q, x.q + (size_t)qb * b, qj, p * jn, (p + 1) * jn, s);
            __m256 dw[2], mn[2];
            _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) dw[h] = t2_scale(kind, w, hd, kd[h], b, p, h, &mn[h]);
            _Pragma("GCC unroll 4") for (int t = 0; t < T; t++) {
                size_t i = (size_t)sb * b + t;
                __m256 dx = _mm256_set1_ps(x.d[i]);
                /* kinds with mins: the dequantized sum of the part, dx * sum(xq) */
                __m256 xs = _mm256_set1_ps(pk_layout_mins(kind) ? x.d[i] * (float)-pk_layout_part_nsum(kind, x, i, p) : 0.0f);
                _Pragma("GCC unroll 2") for (int h = 0; h < 2; h++) {
                    f[h][t] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s[h][t]), dx), dw[h], f[h][t]);
                    if (pk_layout_mins(kind))
                        f[h][t] = _mm256_fnmadd_ps(mn[h], xs, f[h][t]);
                }
            }
        }
    }
    for (int t = 0; t < T && t < n_valid; t++) {
        float *yt = y + (size_t)t * y_stride;
        if (valid == PK_ROWS) {
            _mm256_storeu_ps(yt, f[0][t]);
            _mm256_storeu_ps(yt + 8, f[1][t]);
        } else {
            float tmp[PK_ROWS];
            _mm256_storeu_ps(tmp, f[0][t]);
            _mm256_storeu_ps(tmp + 8, f[1][t]);
            memcpy(yt, tmp, sizeof(float) * (size_t)valid);
        }
    }
}

/* Groups [g0, g1), every token: the 8-token tiles as two 4-token halves,
 * then the rows. */
AI void t2_gemm(const int kind, const int vnni, const void *pw, int64_t rows, int64_t cols, int64_t g0, int64_t g1,
                const void *x, size_t x_row, int n_tok, float *y, size_t y_stride)
{
    int nb = (int)(cols / QK8_0), n = (int)cols, tiled = cpu_act_tiled(&pk_layout_act, n_tok);
    size_t gstride = pk_layout_group_bytes(kind, cols);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *w = (const uint8_t *)pw + (size_t)g * gstride;
        float *yg = y + (size_t)g * PK_ROWS;
        int64_t end = (g + 1) * PK_ROWS;
        int valid = end <= rows ? PK_ROWS : (int)(rows - g * PK_ROWS);
        int t = 0;
        for (; t < tiled; t += 8) {
            pk_layout_view v = pk_layout_tile_view((const char *)x + (size_t)t * x_row, n);
            for (int t0 = 0; t0 < 8 && t + t0 < n_tok; t0 += 4) {
                pk_layout_view h = {v.q + 4 * t0, v.d + t0, v.nsa + t0, v.nsb + t0};
                t2_tile(kind, vnni, 4, w, nb, h, 8, 256, 32, yg + (size_t)(t + t0) * y_stride, y_stride,
                        n_tok - t - t0, valid);
            }
        }
        for (; t < n_tok; t++)
            t2_tile(kind, vnni, 1, w, nb, pk_layout_row_view((const char *)x + (size_t)t * x_row, n), 1, 32, 4,
                    yg + (size_t)t * y_stride, y_stride, 1, valid);
    }
}

/* A type's cpu_pack for one multiply-add: its size, pack and gemm entry
 * points, each the shared code with kind and vnni constants. */
#define T2_TYPE(name, kind, vnni)                                                                                \
    static size_t name##_bytes(int64_t rows, int64_t cols)                                                       \
    {                                                                                                            \
        return pk_layout_groups(rows) * pk_layout_group_bytes(kind, cols);                                       \
    }                                                                                                            \
    static void name##_pack(const void *w, size_t row_bytes, int64_t rows, int64_t cols, int64_t g0, int64_t g1, \
                            void *dst)                                                                           \
    {                                                                                                            \
        pk_layout_pack(kind, w, row_bytes, rows, cols, g0, g1, dst);                                             \
    }                                                                                                            \
    static void name##_gemm(const void *pw, int64_t rows, int64_t cols, int64_t g0, int64_t g1, const void *x,   \
                            size_t x_row, int n_tok, float *y, size_t y_stride)                                  \
    {                                                                                                            \
        t2_gemm(kind, vnni, pw, rows, cols, g0, g1, x, x_row, n_tok, y, y_stride);                               \
    }                                                                                                            \
    static const cpu_pack name = {PK_ROWS, name##_bytes, name##_pack, name##_gemm, &pk_layout_act};

T2_TYPE(t2_q8_0, PK_Q8, 0)
T2_TYPE(t2_q4_0, PK_Q4, 0)
T2_TYPE(t2_q5_0, PK_Q5, 0)
T2_TYPE(t2_q4_K, PK_Q4K, 0)
T2_TYPE(t2_q6_K, PK_Q6K, 0)
T2_TYPE(t2_q5_K, PK_Q5K, 0)
T2_TYPE(t2_q4_1, PK_Q41, 0)
T2_TYPE(t2_q5_1, PK_Q51, 0)
T2_TYPE(t2_q2_K, PK_Q2K, 0)
T2_TYPE(t2_q3_K, PK_Q3K, 0)
T2_TYPE(t2v_q8_0, PK_Q8, 1)
T2_TYPE(t2v_q4_0, PK_Q4, 1)
T2_TYPE(t2v_q5_0, PK_Q5, 1)
T2_TYPE(t2v_q4_K, PK_Q4K, 1)
T2_TYPE(t2v_q6_K, PK_Q6K, 1)
T2_TYPE(t2v_q5_K, PK_Q5K, 1)
T2_TYPE(t2v_q4_1, PK_Q41, 1)
T2_TYPE(t2v_q5_1, PK_Q51, 1)
T2_TYPE(t2v_q2_K, PK_Q2K, 1)
T2_TYPE(t2v_q3_K, PK_Q3K, 1)

const cpu_pack *tiles_avx2_pack(quant_type t, int vnni)
{
    switch (t) {
    case QT_Q8_0: return vnni ? &t2v_q8_0 : &t2_q8_0;
    case QT_Q4_0: return vnni ? &t2v_q4_0 : &t2_q4_0;
    case QT_Q5_0: return vnni ? &t2v_q5_0 : &t2_q5_0;
    case QT_Q4_K: return vnni ? &t2v_q4_K : &t2_q4_K;
    case QT_Q6_K: return vnni ? &t2v_q6_K : &t2_q6_K;
    case QT_Q5_K: return vnni ? &t2v_q5_K : &t2_q5_K;
    case QT_Q4_1: return vnni ? &t2v_q4_1 : &t2_q4_1;
    case QT_Q5_1: return vnni ? &t2v_q5_1 : &t2_q5_1;
    case QT_Q2_K: return vnni ? &t2v_q2_K : &t2_q2_K;
    case QT_Q3_K: return vnni ? &t2v_q3_K : &t2_q3_K;
    default: return NULL;
    }
}

/* The avxvnni set's peak estimate: 12 vpdpbusd chains of 32 multiply-adds. */
double tiles_avx2_spin_vnni(long iters, int seed)
{
    __m256i a[12], w = _mm256_set1_epi8((char)(seed | 1)), x = _mm256_set1_epi8((char)(seed + 3));
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi32(seed + i); /* distinct: no chain merges with another */
    for (long it = 0; it < iters; it++)
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = t2_dpbusd(a[i], w, x);
    volatile int sink = 0;
    for (int i = 0; i < 12; i++) {
        int32_t v[8];
        _mm256_storeu_si256((__m256i *)v, a[i]);
        sink += v[0];
    }
    (void)sink;
    return 12.0 * 64.0 * (double)iters;
}
#else
const cpu_pack *tiles_avx2_pack(quant_type t, int vnni)
{
    (void)t;
    (void)vnni;
    return NULL;
}
double tiles_avx2_spin_vnni(long iters, int seed)
{
    (void)iters;
    (void)seed;
    return 0;
}
#endif
