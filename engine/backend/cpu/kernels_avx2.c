/* kernels_avx2.c - AVX2/FMA/F16C kernels. This file alone is compiled with
 * -mavx2 -mfma -mf16c; cpu_kernels_avx2() checks the CPU at run time, so the
 * binary still runs (on the scalar set) where these are missing. */
#include "kernels.h"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "tiles_avx2.h"

#define KQ_ACC(acc, p, s) _mm256_add_epi32((acc), _mm256_madd_epi16((p), (s)))
#include "x86_kquant.h"

static float dot_f32(const float *a, const float *b, int n)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = hsum8(_mm256_add_ps(s0, s1));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* The one-row weight kernels accumulate exactly as their tile versions
 * (one 8-lane sum, reduced, then the tail in order): a token's result must
 * not depend on how many other tokens share its batch, or batching would
 * change greedy outputs. */
static float w_f32(const void *w, const void *x, int n)
{
    const float *a = w, *f = x;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(f + i), acc);
    float s = hsum8(acc);
    for (; i < n; i++) s += a[i] * f[i];
    return s;
}

static float w_f16(const void *w, const void *x, int n)
{
    const quant_f16 *h = w;
    const float *f = x;
    __m256 acc = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm_prefetch((const char *)(h + i) + CPU_PREFETCH, _MM_HINT_T0);
        acc = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))), _mm256_loadu_ps(f + i), acc);
    }
    float s = hsum8(acc);
    for (; i < n; i++) s += h2f(h[i]) * f[i];
    return s;
}

static float w_bf16(const void *w, const void *x, int n)
{
    const uint16_t *h = w;
    const float *f = x;
    __m256 s0 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        s0 = _mm256_fmadd_ps(a, _mm256_loadu_ps(f + i), s0);
    }
    float s = hsum8(s0);
    for (; i < n; i++) s += quant_bf16_to_f32(h[i]) * f[i];
    return s;
}

/* Signed int8 x int8 products summed in pairs to int16, then to int32. */
static inline __m256i dot_i8(__m256i a, __m256i b)
{
    __m256i ax = _mm256_sign_epi8(a, a);
    __m256i sy = _mm256_sign_epi8(b, a);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1));
}

/* Q8_0, Q4_0 and Q5_0 weights against Q8_0 activations: block i's 32
 * quants as signed bytes (Q8_0 as stored, Q4_0 nibble - 8, Q5_0 q - 16)
 * and its scale. The kernels below are written once for the three; t is a
 * constant at each call, so each compiles to its own loop. */
static inline __attribute__((always_inline)) const uint8_t *i8_block(quant_type t, const void *w, int i, __m256i *q,
                                                                      float *d)
{
    if (t == QT_Q8_0) {
        const block_q8_0 *b = (const block_q8_0 *)w + i;
        *q = _mm256_loadu_si256((const __m256i *)b->qs);
        *d = h2f(b->d);
        return (const uint8_t *)b;
    }
    if (t == QT_Q5_0) {
        const block_q5_0 *b = (const block_q5_0 *)w + i;
        *q = q5_0_quants(b);
        *d = h2f(b->d);
        return (const uint8_t *)b;
    }
    const block_q4_0 *b = (const block_q4_0 *)w + i;
    __m128i raw = _mm_loadu_si128((const __m128i *)b->qs);
    *q = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0xf)),
                         _mm256_set1_epi8(8));
    *d = h2f(b->d);
    return (const uint8_t *)b;
}

static inline __attribute__((always_inline)) float i8_dot(quant_type t, const void *w, const void *x, int n)
{
    const block_q8_0 *b = x;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK8_0; i++) {
        __m256i q;
        float da;
        _mm_prefetch((const char *)i8_block(t, w, i, &q, &da) + CPU_PREFETCH, _MM_HINT_T0);
        __m256i qb = _mm256_loadu_si256((const __m256i *)b[i].qs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(da * h2f(b[i].d)), _mm256_cvtepi32_ps(dot_i8(q, qb)), acc);
    }
    return hsum8(acc);
}

static float w_q8_0(const void *w, const void *x, int n) { return i8_dot(QT_Q8_0, w, x, n); }
static float w_q4_0(const void *w, const void *x, int n) { return i8_dot(QT_Q4_0, w, x, n); }
static float w_q5_0(const void *w, const void *x, int n) { return i8_dot(QT_Q5_0, w, x, n); }


/* ---- Q4_1, Q5_0, Q5_1 against Q8_0 activations (one row) ------------------ */

/* Unsigned quants q (0..31) times signed activations: (sum q*y, sum y). */
static inline void udot(__m256i q, __m256i y, __m256i *qy, __m256i *sy)
{
    const __m256i ones16 = _mm256_set1_epi16(1);
    *qy = _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones16);
    *sy = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), y), ones16);
}


/* Q4_1/Q5_1: d * dy * sum(q y) + m * dy * sum(y) per block. */
static float affine_dot(const void *w, size_t bb, int has_qh, const void *x, int n)
{
    const block_q8_0 *b = x;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK8_0; i++) {
        const uint8_t *blk = (const uint8_t *)w + (size_t)i * bb;
        _mm_prefetch((const char *)blk + CPU_PREFETCH, _MM_HINT_T0);
        quant_f16 d, m;
        memcpy(&d, blk, 2);
        memcpy(&m, blk + 2, 2);
        __m256i q = nibbles32(blk + 4 + 4 * has_qh);
        if (has_qh)
            q = _mm256_or_si256(q, _mm256_and_si256(bits32(blk + 4), _mm256_set1_epi8(0x10)));
        __m256i qy, sy;
        udot(q, _mm256_loadu_si256((const __m256i *)b[i].qs), &qy, &sy);
        float dy = h2f(b[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(d) * dy), _mm256_cvtepi32_ps(qy), acc);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(h2f(m) * dy), _mm256_cvtepi32_ps(sy), acc);
    }
    return hsum8(acc);
}

static float w_q4_1(const void *w, const void *x, int n) { return affine_dot(w, sizeof(block_q4_1), 0, x, n); }
static float w_q5_1(const void *w, const void *x, int n) { return affine_dot(w, sizeof(block_q5_1), 1, x, n); }

/* ---- four activation rows per weight row (prefill) ----------------------- */


/* As i8_dot for four activation rows: each weight block decoded once. */
static inline __attribute__((always_inline)) void i8_dot4(quant_type t, const void *w, const void *x, size_t stride,
                                                           int n, float *out)
{
    const block_q8_0 *b[4] = {X4(x, stride, 0), X4(x, stride, 1), X4(x, stride, 2), X4(x, stride, 3)};
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int i = 0; i < n / QK8_0; i++) {
        __m256i q;
        float da;
        i8_block(t, w, i, &q, &da);
        __m256i ax = _mm256_sign_epi8(q, q);
        _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {
            __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)b[k][i].qs), q);
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), ones);
            acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(da * h2f(b[k][i].d)), _mm256_cvtepi32_ps(p), acc[k]);
        }
    }
    for (int k = 0; k < 4; k++) out[k] = hsum8(acc[k]);
}

static void w_q8_0_x4(const void *w, const void *x, size_t stride, int n, float *out)
{
    i8_dot4(QT_Q8_0, w, x, stride, n, out);
}

static void w_q4_0_x4(const void *w, const void *x, size_t stride, int n, float *out)
{
    i8_dot4(QT_Q4_0, w, x, stride, n, out);
}

static void w_q5_0_x4(const void *w, const void *x, size_t stride, int n, float *out)
{
    i8_dot4(QT_Q5_0, w, x, stride, n, out);
}




static void w_f16_x4(const void *w, const void *x, size_t stride, int n, float *out)
{
    const quant_f16 *h = w;
    const float *f[4] = {X4(x, stride, 0), X4(x, stride, 1), X4(x, stride, 2), X4(x, stride, 3)};
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i)));
        for (int t = 0; t < 4; t++) acc[t] = _mm256_fmadd_ps(a, _mm256_loadu_ps(f[t] + i), acc[t]);
    }
    for (int t = 0; t < 4; t++) {
        out[t] = hsum8(acc[t]);
        for (int k = i; k < n; k++) out[t] += h2f(h[k]) * f[t][k];
    }
}

static void w_f32_x4(const void *w, const void *x, size_t stride, int n, float *out)
{
    const float *a = w, *f[4] = {X4(x, stride, 0), X4(x, stride, 1), X4(x, stride, 2), X4(x, stride, 3)};
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 va = _mm256_loadu_ps(a + i);
        for (int t = 0; t < 4; t++) acc[t] = _mm256_fmadd_ps(va, _mm256_loadu_ps(f[t] + i), acc[t]);
    }
    for (int t = 0; t < 4; t++) {
        out[t] = hsum8(acc[t]);
        for (int k = i; k < n; k++) out[t] += a[k] * f[t][k];
    }
}

static inline float absmax8(const float *x, int n)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rounds 32 floats times id to int8 (nearest, ties to even like lrintf). */
static inline __m256i round32(const float *x, __m256 id)
{
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    __m256i s01 = _mm256_packs_epi32(i0, i1), s23 = _mm256_packs_epi32(i2, i3);
    __m256i b = _mm256_packs_epi16(s01, s23);
    /* packs interleaves 128-bit lanes: restore element order */
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void quant_q8_0(const float *x, void *dst, int n)
{
    block_q8_0 *b = dst;
    for (int i = 0; i < n / QK8_0; i++, x += QK8_0) {
        float d = absmax8(x, QK8_0) / 127.f;
        b[i].d = _cvtss_sh(d, 0);
        _mm256_storeu_si256((__m256i *)b[i].qs, round32(x, _mm256_set1_ps(d ? 1.f / d : 0.f)));
    }
}

static void quant_q8_K(const float *x, void *dst, int n)
{
    block_q8_K *b = dst;
    for (int i = 0; i < n / QK_K; i++, x += QK_K) {
        float d = absmax8(x, QK_K) / 127.f;
        __m256 id = _mm256_set1_ps(d ? 1.f / d : 0.f);
        b[i].d = d;
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q = round32(x + j, id);
            _mm256_storeu_si256((__m256i *)(b[i].qs + j), q);
            __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
            /* s holds 8 sums of 4; the first 16 quants are lanes 0-3 */
            __m128i lo = _mm256_castsi256_si128(s), hi = _mm256_extracti128_si256(s, 1);
            lo = _mm_hadd_epi32(lo, hi);
            lo = _mm_hadd_epi32(lo, lo);
            b[i].bsums[j / 16] = (int16_t)_mm_cvtsi128_si32(lo);
            b[i].bsums[j / 16 + 1] = (int16_t)_mm_extract_epi32(lo, 1);
        }
    }
}

static size_t q8_0_row(int n) { return quant_row_bytes(QT_Q8_0, (size_t)n); }
static size_t q8_K_row(int n) { return quant_row_bytes(QT_Q8_K, (size_t)n); }
static void q8_0_deq(const void *a, float *dst, int n) { quant_dequantize_row(QT_Q8_0, a, dst, (size_t)n); }
static void q8_K_deq(const void *a, float *dst, int n) { quant_dequantize_row(QT_Q8_K, a, dst, (size_t)n); }
static const cpu_act act_q8_0 = {1, q8_0_row, quant_q8_0, q8_0_deq, NULL};
static const cpu_act act_q8_K = {2, q8_K_row, quant_q8_K, q8_K_deq, NULL};

static void axpy(float *y, float a, const float *x, int n)
{
    __m256 va = _mm256_set1_ps(a);
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

/* The attention kernels exist for float K/V and for K/V rows read in
 * place in their stored type (decode: no conversion pass). All are stamped
 * from one body with a different load, LD(row, d): dimensions [d, d + 8)
 * of a row as floats, the same floats the to_f32 conversion gives (a Q8_0
 * value d * q is exact in float). So for the same values they round
 * identically: a row's result does not depend on which path its batch
 * took. */
#define LD_F32(r, d) _mm256_loadu_ps((const float *)(r) + (d))
#define LD_F16(r, d) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const quant_f16 *)(r) + (d))))
#define LD_Q8(r, d) q8_load((const block_q8_0 *)(r) + (d) / QK8_0, (d) % QK8_0)

/* 8 quants at qs as floats times the block's scale d (exact). */
static inline __m256 q8_part(__m256 d, const int8_t *qs)
{
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)qs))));
}

static inline __m256 q8_load(const block_q8_0 *b, int o) { return q8_part(_mm256_set1_ps(h2f(b->d)), b->qs + o); }

/* q . row over hd dims (a multiple of 8): two accumulators by 16, one by
 * 8; dot_f32's order for the same values. */
#define DEF_DOT(name, LD)                                                           \
    static float name(const float *a, const char *r, int hd)                        \
    {                                                                               \
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();                  \
        int i = 0;                                                                  \
        for (; i + 16 <= hd; i += 16) {                                             \
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LD(r, i), s0);             \
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), LD(r, i + 8), s1);     \
        }                                                                           \
        for (; i + 8 <= hd; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), LD(r, i), s0); \
        return hsum8(_mm256_add_ps(s0, s1));                                        \
    }
DEF_DOT(dot_row_f16, LD_F16)
DEF_DOT(dot_row_q8, LD_Q8)

static float dot_row_f32(const float *a, const char *r, int hd) { return dot_f32(a, (const float *)r, hd); }

/* Four keys' 8-lane sums reduced and scaled into out[0..3]; every 4-key
 * dot kernel reduces by this one tree, so their scores agree bit for bit. */
static inline void store_scores4(float *out, __m256 s0, __m256 s1, __m256 s2, __m256 s3, float scale)
{
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(out, _mm_mul_ps(r, _mm_set1_ps(scale)));
}

/* Four keys at a time share each load of q; one horizontal reduction for
 * all four. With hd not a multiple of 8 (float and F16 rows only) every
 * key goes through dot_f32 (dimensions in order past the last 8). */
#define DEF_ATTN_DOTS(name, LD, DOT1)                                                               \
    static void name(const float *q, const void *k, size_t row_bytes, int n, int hd, float scale, float *out) \
    {                                                                                               \
        const char *kr = k;                                                                         \
        int i = 0;                                                                                  \
        for (; i + 4 <= n && hd % 8 == 0; i += 4) {                                                 \
            const char *k0 = kr + (size_t)i * row_bytes, *k1 = k0 + row_bytes, *k2 = k1 + row_bytes, \
                       *k3 = k2 + row_bytes;                                                        \
            __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                             \
            for (int d = 0; d < hd; d += 8) {                                                       \
                __m256 vq = _mm256_loadu_ps(q + d);                                                 \
                s0 = _mm256_fmadd_ps(vq, LD(k0, d), s0);                                            \
                s1 = _mm256_fmadd_ps(vq, LD(k1, d), s1);                                            \
                s2 = _mm256_fmadd_ps(vq, LD(k2, d), s2);                                            \
                s3 = _mm256_fmadd_ps(vq, LD(k3, d), s3);                                            \
            }                                                                                       \
            store_scores4(out + i, s0, s1, s2, s3, scale);                                          \
        }                                                                                           \
        for (; i < n; i++) out[i] = scale * DOT1(q, kr + (size_t)i * row_bytes, hd);                \
    }

static float dot_f16_any(const float *q, const char *r, int hd);
DEF_ATTN_DOTS(attn_dots_rows, LD_F32, dot_row_f32)
DEF_ATTN_DOTS(attn_dots_f16, LD_F16, dot_f16_any)

static void attn_dots(const float *q, const float *k, size_t stride, int n, int hd, float scale, float *out)
{
    attn_dots_rows(q, k, stride * sizeof(float), n, hd, scale, out);
}

/* An F16 row with any hd, as dot_f32 on its floats: by 16, by 8, then the
 * rest in order. */
static float dot_f16_any(const float *q, const char *r, int hd)
{
    const quant_f16 *h = (const quant_f16 *)r;
    int d8 = hd & ~7;
    float s = d8 ? dot_row_f16(q, r, d8) : 0.0f;
    for (int i = d8; i < hd; i++) s += q[i] * h2f(h[i]);
    return s;
}

/* o stays in registers, 64 dimensions at a time, across all rows; the
 * rest of the dimensions go as in axpy. */
#define DEF_ATTN_WSUM(name, LD, SC)                                                             \
    static void name(float *o, const float *w, const void *v, size_t row_bytes, int n, int hd) \
    {                                                                                           \
        const char *vr = v;                                                                     \
        int d = 0;                                                                              \
        for (; d + 64 <= hd; d += 64) {                                                         \
            __m256 a[8]; /* unrolled, or a[] lives on the stack: a store-forward per multiply-add */ \
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) a[c] = _mm256_loadu_ps(o + d + 8 * c); \
            for (int i = 0; i < n; i++) {                                                       \
                __m256 wi = _mm256_broadcast_ss(w + i);                                         \
                const char *vi = vr + (size_t)i * row_bytes;                                    \
                _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++)                             \
                    a[c] = _mm256_fmadd_ps(wi, LD(vi, d + 8 * c), a[c]);                        \
            }                                                                                   \
            _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++) _mm256_storeu_ps(o + d + 8 * c, a[c]); \
        }                                                                                       \
        for (int i = 0; d < hd && i < n; i++) {                                                 \
            const char *vi = vr + (size_t)i * row_bytes;                                        \
            __m256 wi = _mm256_set1_ps(w[i]);                                                   \
            int e = d;                                                                          \
            for (; e + 8 <= hd; e += 8)                                                         \
                _mm256_storeu_ps(o + e, _mm256_fmadd_ps(wi, LD(vi, e), _mm256_loadu_ps(o + e)));  \
            for (; e < hd; e++) o[e] += w[i] * SC(vi, e);                                       \
        }                                                                                       \
    }
#define SC_F32(r, e) (((const float *)(r))[e])
#define SC_F16(r, e) h2f(((const quant_f16 *)(r))[e])
DEF_ATTN_WSUM(attn_wsum_rows, LD_F32, SC_F32)
DEF_ATTN_WSUM(attn_wsum_f16, LD_F16, SC_F16)

static void attn_wsum(float *o, const float *w, const float *v, size_t stride, int n, int hd)
{
    attn_wsum_rows(o, w, v, stride * sizeof(float), n, hd);
}

/* The Q8_0 kernels are attn_dots_q8_0/attn_wsum_q8_0 as DEF_ATTN_DOTS and
 * DEF_ATTN_WSUM would stamp them with LD_Q8 (the same multiply-adds in the
 * same order), but take a block's scale once per row and block rather than
 * once per 8 values: seven vector operations per 8 values came down to
 * about four, where a decode step's attention over Q8_0 K/V was bound by
 * them, not by reading the rows. */
static void attn_dots_q8_0(const float *q, const void *k, size_t row_bytes, int n, int hd, float scale, float *out)
{
    const char *kr = k;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const block_q8_0 *k0 = (const block_q8_0 *)(kr + (size_t)i * row_bytes);
        const block_q8_0 *k1 = (const block_q8_0 *)((const char *)k0 + row_bytes);
        const block_q8_0 *k2 = (const block_q8_0 *)((const char *)k1 + row_bytes);
        const block_q8_0 *k3 = (const block_q8_0 *)((const char *)k2 + row_bytes);
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (int b = 0; b < hd / QK8_0; b++) {
            __m256 d0 = _mm256_set1_ps(h2f(k0[b].d)), d1 = _mm256_set1_ps(h2f(k1[b].d));
            __m256 d2 = _mm256_set1_ps(h2f(k2[b].d)), d3 = _mm256_set1_ps(h2f(k3[b].d));
            _Pragma("GCC unroll 4") for (int e = 0; e < QK8_0; e += 8) {
                __m256 vq = _mm256_loadu_ps(q + b * QK8_0 + e);
                s0 = _mm256_fmadd_ps(vq, q8_part(d0, k0[b].qs + e), s0);
                s1 = _mm256_fmadd_ps(vq, q8_part(d1, k1[b].qs + e), s1);
                s2 = _mm256_fmadd_ps(vq, q8_part(d2, k2[b].qs + e), s2);
                s3 = _mm256_fmadd_ps(vq, q8_part(d3, k3[b].qs + e), s3);
            }
        }
        store_scores4(out + i, s0, s1, s2, s3, scale);
    }
    for (; i < n; i++) out[i] = scale * dot_row_q8(q, kr + (size_t)i * row_bytes, hd);
}

/* Dimensions [d, d + 32 * nb) (nb: 1 or 2 blocks) of o += sum_i w[i] v_i,
 * in registers across the rows. */
static inline void wsum_q8_blocks(float *o, const float *w, const char *v, size_t row_bytes, int n, int d, int nb)
{
    __m256 a[8];
    _Pragma("GCC unroll 8") for (int c = 0; c < 8; c++)
        a[c] = c < 4 * nb ? _mm256_loadu_ps(o + d + 8 * c) : _mm256_setzero_ps();
    for (int i = 0; i < n; i++) {
        __m256 wi = _mm256_broadcast_ss(w + i);
        const block_q8_0 *b = (const block_q8_0 *)(v + (size_t)i * row_bytes) + d / QK8_0;
        __m256 d0 = _mm256_set1_ps(h2f(b[0].d));
        _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
            a[c] = _mm256_fmadd_ps(wi, q8_part(d0, b[0].qs + 8 * c), a[c]);
        if (nb == 2) {
            __m256 d1 = _mm256_set1_ps(h2f(b[1].d));
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
                a[4 + c] = _mm256_fmadd_ps(wi, q8_part(d1, b[1].qs + 8 * c), a[4 + c]);
        }
    }
    _Pragma("GCC unroll 8") for (int c = 0; c < 4 * nb; c++) _mm256_storeu_ps(o + d + 8 * c, a[c]);
}

static void attn_wsum_q8_0(float *o, const float *w, const void *v, size_t row_bytes, int n, int hd)
{
    int d = 0;
    for (; d + 64 <= hd; d += 64) wsum_q8_blocks(o, w, v, row_bytes, n, d, 2);
    if (d < hd)
        wsum_q8_blocks(o, w, v, row_bytes, n, d, 1);
}

static void f16_to_f32(const void *src, float *dst, int n)
{
    const quant_f16 *h = src;
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) dst[i] = h2f(h[i]);
}

static void q8_0_to_f32(const void *src, float *dst, int n)
{
    const block_q8_0 *b = src;
    for (int i = 0; i < n / QK8_0; i++) {
        __m256 d = _mm256_set1_ps(h2f(b[i].d));
        for (int k = 0; k < QK8_0; k += 8) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b[i].qs + k)));
            _mm256_storeu_ps(dst + QK8_0 * i + k, _mm256_mul_ps(d, _mm256_cvtepi32_ps(q)));
        }
    }
}

static void f32_to_f16(const float *src, quant_f16 *dst, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) dst[i] = quant_f32_to_f16(src[i]);
}

/* e^x for x in [-87, 88] (clamped), Cephes' degree-5 polynomial on
 * x - n ln 2 with ln 2 split in two: within 2 ulp of expf. */
static inline __m256 exp8(__m256 x)
{
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* Eight lanes of gelu(g) u, as g u / (1 + e^(-2v)) (= 0.5 g (1 + tanh v)
 * without the cancellation of 1 + tanh v in the negative tail; e^(-2v) is
 * clamped, so no inf / inf). */
static inline __m256 geglu8(__m256 x, __m256 u)
{
    const __m256 k = _mm256_set1_ps(-2.0f * 0.7978845608028654f), c = _mm256_set1_ps(0.044715f);
    __m256 v2 = _mm256_mul_ps(k, _mm256_fmadd_ps(_mm256_mul_ps(c, x), _mm256_mul_ps(x, x), x)); /* -2v */
    return _mm256_div_ps(_mm256_mul_ps(x, u), _mm256_add_ps(exp8(v2), _mm256_set1_ps(1.0f)));
}

/* Every element through f8, the tail too (zero-padded), so a value's
 * result does not depend on where a thread's range starts or how long the
 * row is (batch invariance). Inlined with f8 a constant. */
static inline __attribute__((always_inline)) void gated_rows(const float *g, const float *u, float *out, int n,
                                                              __m256 (*f8)(__m256, __m256))
{
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
    if (i < n) {
        float gt[8] = {0}, ut[8] = {0}, ot[8];
        memcpy(gt, g + i, sizeof(float) * (size_t)(n - i));
        memcpy(ut, u + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(ot, f8(_mm256_loadu_ps(gt), _mm256_loadu_ps(ut)));
        memcpy(out + i, ot, sizeof(float) * (size_t)(n - i));
    }
}

static void geglu(const float *g, const float *u, float *out, int n) { gated_rows(g, u, out, n, geglu8); }

/* Eight lanes of silu(g) u = g / (1 + e^(-g)) u, in the scalar order (g u
 * first could overflow where the result is finite). Below g = -87 the true
 * value is under 87 e^-87 ~ 1.4e-36 |u|, but exp8's clamp would make it
 * g e^-88 u (g = -1e30: -6e-9 u), so those lanes give (g 0) u: +-0, or
 * NaN where g or u is NaN or infinite, as glibc's expf overflow gives. */
static inline __m256 swiglu8(__m256 g, __m256 u)
{
    const __m256 z = _mm256_setzero_ps();
    __m256 s = _mm256_div_ps(g, _mm256_add_ps(exp8(_mm256_sub_ps(z, g)), _mm256_set1_ps(1.0f)));
    s = _mm256_blendv_ps(s, _mm256_mul_ps(g, z), _mm256_cmp_ps(g, _mm256_set1_ps(-87.0f), _CMP_LT_OQ));
    return _mm256_mul_ps(s, u);
}

/* The scalar loop's glibc expf was 3.5% of a tinyllama-1.1b Q4_K
 * llm-bench profile (load, prefill and decode), and a decode step runs it
 * on one thread (5,632 elements per layer are below the pool's threshold)
 * while the other waits. */
static void swiglu(const float *g, const float *u, float *out, int n) { gated_rows(g, u, out, n, swiglu8); }

/* Softmax with exp8: the max and the exponentials 8 lanes at a time (the
 * last partial vector padded, each element computed as in a full one),
 * the sum in one 8-lane chain then the tail in order, and one division.
 * The scalar loop's glibc expf calls, dependent max and sum chains and a
 * division per element were about a quarter of attention's time at 64
 * sequences x 1,024 positions (perf, llama-110m). */
static void softmax(float *x, int n)
{
    __m256 m8 = _mm256_set1_ps(-INFINITY), s8 = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= n; i += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(x + i));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float mx = _mm_cvtss_f32(m4);
    for (int p = i; p < n; p++) mx = x[p] > mx ? x[p] : mx;
    const __m256 vm = _mm256_set1_ps(mx);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
        _mm256_storeu_ps(x + i, e);
        s8 = _mm256_add_ps(s8, e);
    }
    float sum = hsum8(s8);
    if (i < n) {
        float t[8] = {0};
        memcpy(t, x + i, sizeof(float) * (size_t)(n - i));
        _mm256_storeu_ps(t, exp8(_mm256_sub_ps(_mm256_loadu_ps(t), vm)));
        for (int p = 0; p < n - i; p++) sum += (x[i + p] = t[p]);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / sum);
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
    for (; i < n; i++) x[i] *= 1.0f / sum;
}

/* The peak estimate's loop: 12 chains of vpmaddubsw (32 multiply-adds
 * into int16 pairs) and vpaddw, the step the packed tiles repeat for
 * nibble quants (tiles_avx2.c). */
static double spin_avx2(long iters, int seed)
{
    __m256i a[12], w = _mm256_set1_epi8((char)(seed | 1)), x = _mm256_set1_epi8((char)(seed + 3));
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi16((short)(seed + i));
    for (long it = 0; it < iters; it++)
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) {
            __asm__("" : "+x"(w)); /* w "changes": no product is shared or hoisted, at no instruction's cost */
            a[i] = _mm256_add_epi16(a[i], _mm256_maddubs_epi16(w, x));
        }
    volatile int sink = 0;
    for (int i = 0; i < 12; i++) sink += hsum8i(a[i]);
    (void)sink;
    return 12.0 * 64.0 * (double)iters;
}

/* The set as compiled; avx2_init adds the packed tiles. */
static const cpu_kernels avx2_rows = {
    .name = "avx2",
    .dot = {[QT_F32] = w_f32, [QT_F16] = w_f16, [QT_BF16] = w_bf16, [QT_Q8_0] = w_q8_0,
            [QT_Q4_0] = w_q4_0, [QT_Q4_1] = w_q4_1, [QT_Q5_0] = w_q5_0, [QT_Q5_1] = w_q5_1,
            [QT_Q2_K] = w_q2_K, [QT_Q3_K] = w_q3_K, [QT_Q4_K] = w_q4_K, [QT_Q5_K] = w_q5_K, [QT_Q6_K] = w_q6_K},
    .dot4 = {[QT_F32] = w_f32_x4, [QT_F16] = w_f16_x4, [QT_Q8_0] = w_q8_0_x4, [QT_Q4_0] = w_q4_0_x4,
             [QT_Q5_0] = w_q5_0_x4, [QT_Q2_K] = w_q2_K_x4, [QT_Q3_K] = w_q3_K_x4, [QT_Q4_K] = w_q4_K_x4,
             [QT_Q5_K] = w_q5_K_x4, [QT_Q6_K] = w_q6_K_x4},
    .act = {[QT_F32] = &cpu_act_f32, [QT_F16] = &cpu_act_f32, [QT_BF16] = &cpu_act_f32, [QT_Q8_0] = &act_q8_0,
            [QT_Q4_0] = &act_q8_0, [QT_Q4_1] = &act_q8_0, [QT_Q5_0] = &act_q8_0, [QT_Q5_1] = &act_q8_0,
            [QT_Q2_K] = &act_q8_K, [QT_Q3_K] = &act_q8_K, [QT_Q4_K] = &act_q8_K, [QT_Q5_K] = &act_q8_K,
            [QT_Q6_K] = &act_q8_K},
    .dot_f32 = dot_f32,
    .axpy = axpy,
    .attn_dots = attn_dots,
    .attn_wsum = attn_wsum,
    .attn_dots_kv = {[QT_F16] = attn_dots_f16, [QT_Q8_0] = attn_dots_q8_0},
    .attn_wsum_kv = {[QT_F16] = attn_wsum_f16, [QT_Q8_0] = attn_wsum_q8_0},
    .to_f32 = {[QT_F16] = f16_to_f32, [QT_Q8_0] = q8_0_to_f32},
    .to_f16 = f32_to_f16,
    .geglu = geglu,
    .swiglu = swiglu,
    .softmax = softmax,
    .int8_spin = spin_avx2,
};

static cpu_kernels avx2, avxvnni;
static pthread_once_t avx2_once = PTHREAD_ONCE_INIT;

static void avx2_init(void)
{
    static const quant_type packed[] = {QT_Q8_0, QT_Q4_0, QT_Q4_1, QT_Q5_0, QT_Q5_1, QT_Q2_K, QT_Q3_K, QT_Q4_K, QT_Q5_K, QT_Q6_K};
    avx2 = avx2_rows;
    avxvnni = avx2_rows;
    avxvnni.name = "avxvnni";
    avxvnni.int8_spin = tiles_avx2_spin_vnni;
    for (size_t i = 0; i < sizeof packed / sizeof *packed; i++) {
        avx2.pack[packed[i]] = tiles_avx2_pack(packed[i], 0);
        avxvnni.pack[packed[i]] = tiles_avx2_pack(packed[i], 1);
    }
}

const cpu_kernels *cpu_kernels_avx2(void)
{
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return NULL;
    pthread_once(&avx2_once, avx2_init);
    return &avx2;
}

const cpu_kernels *cpu_kernels_avxvnni(void)
{
    if (!cpu_kernels_avx2() || !__builtin_cpu_supports("avxvnni"))
        return NULL;
    return &avxvnni;
}
#else
const cpu_kernels *cpu_kernels_avx2(void) { return NULL; }
const cpu_kernels *cpu_kernels_avxvnni(void) { return NULL; }
#endif
