/* x86_kquant.h - x86 SIMD helpers and the K-quant (Q2_K..Q6_K) kernels,
 * shared by the AVX2 and AVX512-VNNI kernel sets. Each including file
 * defines KQ_ACC(acc, p, s) - add to int32 lanes acc the products of int16
 * lanes p and s summed in pairs - as madd + add (AVX2) or as one vpdpwssd
 * (VNNI), and gets its own static copies compiled for its instruction set.
 * Not a public header: include only from engine/backend/cpu/kernels_*.c. */
#ifndef LLM_CPU_X86_KQUANT_H
#define LLM_CPU_X86_KQUANT_H

#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#include "kernels.h"

#ifndef KQ_ACC
#error "define KQ_ACC before including x86_kquant.h"
#endif

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum8i(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline float h2f(quant_f16 h) { return _cvtsh_ss(h); }

/* The 32 nibbles of a block in element order (low nibbles: 0..15). */
static inline __m256i nibbles32(const uint8_t *qs)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0xf));
}

/* Byte j = 0xff where bit j of the little-endian 32 bits at p is set. */
static inline __m256i bits32(const uint8_t *p)
{
    uint32_t x;
    memcpy(&x, p, 4);
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    return _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
}

/* Q5_0's 32 quants minus 16 as signed bytes: nibble | 0xf0 where the
 * fifth bit is clear is nibble - 16 as int8, and where it is set the
 * nibble is (nibble + 16) - 16. */
static inline __m256i q5_0_quants(const block_q5_0 *b)
{
    return _mm256_or_si256(nibbles32(b->qs), _mm256_andnot_si256(bits32(b->qh), _mm256_set1_epi8((char)0xf0)));
}

/* Bytes ahead of the current block that the decode kernels prefetch: one
 * page, enough requests in flight to cover DRAM latency (measured: 1 KiB
 * ahead gave ~15, 4 KiB ~21, 8 KiB ~21 tok/s, tinyllama Q8_0, 2 threads).
 * The packed tiles, which serve decode wherever a type has them, ask 8 KiB
 * ahead (PK_LAYOUT_PF, measured on a Zen 5); these row kernels were not
 * measured again there. */
#define CPU_PREFETCH 4096

#define X4(x, stride, t) ((const void *)((const char *)(x) + (size_t)(t) * (stride)))

/* The 8 6-bit scales and 8 6-bit mins of a Q4_K block as int16 vectors.
 * Layout: bytes 0-3 hold scales 0-3 (low 6 bits) and the top bits of scales
 * 4-7; bytes 4-7 the same for the mins; bytes 8-11 the low nibbles of
 * scales 4-7 and mins 4-7. Worked on as three 32-bit words. */
static inline void q4k_scales(const uint8_t *q, __m128i *sc16, __m128i *m16)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, q, 4);
    memcpy(&w1, q + 4, 4);
    memcpy(&w2, q + 8, 4);
    uint32_t s_lo = w0 & 0x3f3f3f3f, m_lo = w1 & 0x3f3f3f3f;
    uint32_t s_hi = (w2 & 0x0f0f0f0f) | (((w0 >> 6) & 0x03030303) << 4);
    uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0f) | (((w1 >> 6) & 0x03030303) << 4);
    *sc16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)s_hi, (int)s_lo));
    *m16 = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, (int)m_hi, (int)m_lo));
}

/* Every int16 lane = scale k of the 8 held twice in scv. */
static inline __m256i q4k_scale_k(__m256i scv, int k)
{
    return _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(((2 * k + 1) << 8) | (2 * k))));
}

static inline float hsum4(__m128 s)
{
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The 8 mins times the 8 sub-block sums of a Q8_K block, as 4 int32 lanes. */
static inline __m128i q4k_min_dot(__m128i m16, const block_q8_K *y)
{
    __m256i bs = _mm256_loadu_si256((const __m256i *)y->bsums);
    return _mm_madd_epi16(m16, _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1)));
}

/* Q4_K and Q5_K blocks as bytes: where their fields sit (Q5_K adds the
 * fifth bits, qh, before the nibbles). */
#define K4_BB(q5) ((q5) ? sizeof(block_q5_K) : sizeof(block_q4_K))
#define K4_QS(q5) ((q5) ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs))

/* The 64 quants of group j (0..3) of a Q4_K/Q5_K block as two 32-byte
 * vectors (elements 64j..64j+31, then the next 32): nibbles, with Q5_K's
 * fifth bit (bits 2j and 2j + 1 of each qh byte) on top. */
static inline __attribute__((always_inline)) void k4_quants(int q5, const uint8_t *blk, int j, __m256i *q0, __m256i *q1)
{
    const __m256i lo = _mm256_set1_epi8(0xf), one = _mm256_set1_epi8(1);
    __m256i q = _mm256_loadu_si256((const __m256i *)(blk + K4_QS(q5) + 32 * j));
    *q0 = _mm256_and_si256(q, lo);
    *q1 = _mm256_and_si256(_mm256_srli_epi16(q, 4), lo);
    if (q5) {
        __m256i hb = _mm256_loadu_si256((const __m256i *)(blk + offsetof(block_q5_K, qh)));
        __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j)), one);
        __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j + 1)), one);
        *q0 = _mm256_or_si256(*q0, _mm256_slli_epi16(b0, 4));
        *q1 = _mm256_or_si256(*q1, _mm256_slli_epi16(b1, 4));
    }
}

static inline __attribute__((always_inline)) float k4_dot(int q5, const void *w, const void *x, int n)
{
    const uint8_t *a = w;
    const block_q8_K *b = x;
    __m256 acc = _mm256_setzero_ps();
    __m128 mins = _mm_setzero_ps();
    for (int i = 0; i < n / QK_K; i++, a += K4_BB(q5)) {
        /* decode streams weights once: fetch well ahead, past page ends where
         * the hardware prefetcher stops */
        _mm_prefetch((const char *)a + CPU_PREFETCH, _MM_HINT_T0);
        _mm_prefetch((const char *)a + CPU_PREFETCH + 64, _MM_HINT_T0);
        if (q5)
            _mm_prefetch((const char *)a + CPU_PREFETCH + 128, _MM_HINT_T0);
        const block_q4_K *h = (const block_q4_K *)a; /* d, dmin and scales sit alike in both */
        __m128i sc16, m16;
        q4k_scales(h->scales, &sc16, &m16);
        __m256i scv = _mm256_broadcastsi128_si256(sc16);
        __m256i is0 = _mm256_setzero_si256(), is1 = is0; /* two exact chains, as in w_q3_K */
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m256i q0, q1;
            k4_quants(q5, a, j, &q0, &q1);
            __m256i y0 = _mm256_loadu_si256((const __m256i *)(b[i].qs + 64 * j));
            __m256i y1 = _mm256_loadu_si256((const __m256i *)(b[i].qs + 64 * j + 32));
            is0 = KQ_ACC(is0, _mm256_maddubs_epi16(q0, y0), q4k_scale_k(scv, 2 * j));
            is1 = KQ_ACC(is1, _mm256_maddubs_epi16(q1, y1), q4k_scale_k(scv, 2 * j + 1));
        }
        __m256i isum = _mm256_add_epi32(is0, is1);
        float d = b[i].d * h2f(h->d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum), acc);
        mins = _mm_fmadd_ps(_mm_set1_ps(b[i].d * h2f(h->dmin)), _mm_cvtepi32_ps(q4k_min_dot(m16, &b[i])), mins);
    }
    return hsum8(acc) - hsum4(mins);
}

static float w_q4_K(const void *w, const void *x, int n) { return k4_dot(0, w, x, n); }
static float w_q5_K(const void *w, const void *x, int n) { return k4_dot(1, w, x, n); }

/* A half block's 8 scales as int16, in both 128-bit lanes. */
static inline __m256i q6k_scales(const int8_t *sc)
{
    return _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
}

/* int16 lanes: the first 8 carry scale 2k of scv, the last 8 scale 2k + 1
 * (the two 16-quant groups of 32 quants), by one in-lane shuffle. */
static inline __m256i scale_pair16(__m256i scv, int k)
{
    return _mm256_shuffle_epi8(scv, _mm256_set_m128i(_mm_set1_epi16((short)(((4 * k + 3) << 8) | (4 * k + 2))),
                                                     _mm_set1_epi16((short)(((4 * k + 1) << 8) | (4 * k)))));
}

/* Decodes one half (128 quants, unsigned 0..63) of a Q6_K block. */
static inline void q6k_half(const uint8_t *ql, const uint8_t *qh, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0xf), m2 = _mm256_set1_epi8(3);
    __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
}

/* sc16[j] * bsums[j] over a Q8_K block's 16 sub-blocks, in 8 int32
 * lanes: the share of a per-sub-block constant (an offset or a min). */
static inline __m256i bsum_dot(__m256i sc16, const block_q8_K *y)
{
    return _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)y->bsums));
}

/* 32 * scales[j] * bsums[j] over the 16 sub-blocks, in 8 int32 lanes:
 * the -32 offset's share, subtracted from the block's integer sum before
 * it is scaled (exact: every term fits int32 with room). */
static inline __m256i q6k_bias(const block_q6_K *a, const block_q8_K *y)
{
    return _mm256_slli_epi32(bsum_dot(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)a->scales)), y), 5);
}

static float w_q6_K(const void *w, const void *x, int n)
{
    const block_q6_K *a = w;
    const block_q8_K *b = x;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        _mm_prefetch((const char *)(a + i) + CPU_PREFETCH, _MM_HINT_T0);
        _mm_prefetch((const char *)(a + i) + CPU_PREFETCH + 64, _MM_HINT_T0);
        _mm_prefetch((const char *)(a + i) + CPU_PREFETCH + 128, _MM_HINT_T0);
        __m256i is[2] = {_mm256_sub_epi32(_mm256_setzero_si256(), q6k_bias(&a[i], &b[i])), _mm256_setzero_si256()};
        for (int h = 0; h < 2; h++) {
            __m256i q[4], scv = q6k_scales(a[i].scales + 8 * h);
            q6k_half(a[i].ql + 64 * h, a[i].qh + 32 * h, q);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) { /* two exact chains, as in w_q3_K */
                __m256i p = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256((const __m256i *)(b[i].qs + 128 * h + 32 * k)));
                is[k & 1] = KQ_ACC(is[k & 1], p, scale_pair16(scv, k));
            }
        }
        __m256i isum = _mm256_add_epi32(is[0], is[1]);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b[i].d * h2f(a[i].d)), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum8(acc);
}

/* The four tokens of a tile: is##t += s . (q x token t's 32 quants at off). */
#define KX4_DOT(q, off, s)                                                                                   \
    do {                                                                                                     \
        const __m256i q_ = (q), s_ = (s); /* decoded once for the four tokens */                            \
        is0 = KQ_ACC(is0, _mm256_maddubs_epi16(q_, _mm256_loadu_si256((const __m256i *)(b0[i].qs + (off)))), s_); \
        is1 = KQ_ACC(is1, _mm256_maddubs_epi16(q_, _mm256_loadu_si256((const __m256i *)(b1[i].qs + (off)))), s_); \
        is2 = KQ_ACC(is2, _mm256_maddubs_epi16(q_, _mm256_loadu_si256((const __m256i *)(b2[i].qs + (off)))), s_); \
        is3 = KQ_ACC(is3, _mm256_maddubs_epi16(q_, _mm256_loadu_si256((const __m256i *)(b3[i].qs + (off)))), s_); \
    } while (0)

/* One token's block into its float sums, rounded as the one-row kernels
 * round: (y d * w d), then one FMA per block. */
#define K4X4_FINISH(t)                                                                                       \
    do {                                                                                                     \
        acc##t = _mm256_fmadd_ps(_mm256_set1_ps(b##t[i].d * d), _mm256_cvtepi32_ps(is##t), acc##t);           \
        mn##t = _mm_fmadd_ps(_mm_set1_ps(b##t[i].d * dmin), _mm_cvtepi32_ps(q4k_min_dot(m16, &b##t[i])), mn##t); \
    } while (0)

/* Each weight group is decoded once for the four tokens. */
static inline __attribute__((always_inline)) void k4_dot_x4(int q5, const void *w, const void *x, size_t stride,
                                                             int n, float *out)
{
    const uint8_t *a = w;
    const block_q8_K *b0 = X4(x, stride, 0), *b1 = X4(x, stride, 1), *b2 = X4(x, stride, 2), *b3 = X4(x, stride, 3);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    __m128 mn0 = _mm_setzero_ps(), mn1 = mn0, mn2 = mn0, mn3 = mn0;
    for (int i = 0; i < n / QK_K; i++, a += K4_BB(q5)) {
        const block_q4_K *h = (const block_q4_K *)a;
        __m128i sc16, m16;
        q4k_scales(h->scales, &sc16, &m16);
        __m256i scv = _mm256_broadcastsi128_si256(sc16);
        __m256i is0 = _mm256_setzero_si256(), is1 = is0, is2 = is0, is3 = is0;
        for (int j = 0; j < 4; j++) {
            __m256i q0, q1;
            k4_quants(q5, a, j, &q0, &q1);
            KX4_DOT(q0, 64 * j, q4k_scale_k(scv, 2 * j));
            KX4_DOT(q1, 64 * j + 32, q4k_scale_k(scv, 2 * j + 1));
        }
        float d = h2f(h->d), dmin = h2f(h->dmin);
        K4X4_FINISH(0);
        K4X4_FINISH(1);
        K4X4_FINISH(2);
        K4X4_FINISH(3);
    }
    out[0] = hsum8(acc0) - hsum4(mn0);
    out[1] = hsum8(acc1) - hsum4(mn1);
    out[2] = hsum8(acc2) - hsum4(mn2);
    out[3] = hsum8(acc3) - hsum4(mn3);
}

static void w_q4_K_x4(const void *w, const void *x, size_t stride, int n, float *out) { k4_dot_x4(0, w, x, stride, n, out); }
static void w_q5_K_x4(const void *w, const void *x, size_t stride, int n, float *out) { k4_dot_x4(1, w, x, stride, n, out); }

/* One token's block into its float sum, for the kernels whose offset is
 * in the integer sum (Q3_K, Q6_K): (y d * w d), then one FMA, as the
 * one-row kernels round. */
#define KX4_FINISH(t) (acc##t = _mm256_fmadd_ps(_mm256_set1_ps(b##t[i].d * d), _mm256_cvtepi32_ps(is##t), acc##t))

static void w_q6_K_x4(const void *w, const void *x, size_t stride, int n, float *out)
{
    const block_q6_K *a = w;
    const block_q8_K *b0 = X4(x, stride, 0), *b1 = X4(x, stride, 1), *b2 = X4(x, stride, 2), *b3 = X4(x, stride, 3);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int i = 0; i < n / QK_K; i++) {
        const __m256i z = _mm256_setzero_si256();
        __m256i is0 = _mm256_sub_epi32(z, q6k_bias(&a[i], &b0[i])), is1 = _mm256_sub_epi32(z, q6k_bias(&a[i], &b1[i]));
        __m256i is2 = _mm256_sub_epi32(z, q6k_bias(&a[i], &b2[i])), is3 = _mm256_sub_epi32(z, q6k_bias(&a[i], &b3[i]));
        for (int h = 0; h < 2; h++) {
            __m256i q[4], scv = q6k_scales(a[i].scales + 8 * h);
            q6k_half(a[i].ql + 64 * h, a[i].qh + 32 * h, q);
            for (int k = 0; k < 4; k++) KX4_DOT(q[k], 128 * h + 32 * k, scale_pair16(scv, k));
        }
        float d = h2f(a[i].d);
        KX4_FINISH(0);
        KX4_FINISH(1);
        KX4_FINISH(2);
        KX4_FINISH(3);
    }
    out[0] = hsum8(acc0);
    out[1] = hsum8(acc1);
    out[2] = hsum8(acc2);
    out[3] = hsum8(acc3);
}

/* ---- Q2_K and Q3_K ----------------------------------------------------------
 * Both hold 2-bit quants: element 32k + l of half h of a block is bits 2k
 * of byte 32h + l of qs, so each 32-element group is one shift of one load.
 * Sub-block scales (16 elements each) pair as Q6_K's do. */

/* The 2-bit quants 32k..32k+31 of a half block whose bytes start at qs. */
static inline __m256i k2_quants(const uint8_t *qs, int k)
{
    __m256i v = _mm256_loadu_si256((const __m256i *)qs);
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
}

/* Q2_K's 16 4-bit scales and 16 4-bit mins as int16 vectors. */
static inline void q2k_scales(const uint8_t *s, __m256i *sc16, __m256i *m16)
{
    __m128i v = _mm_loadu_si128((const __m128i *)s), lo = _mm_set1_epi8(0xf);
    *sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(v, lo));
    *m16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), lo));
}

/* Half h's 8 scales of a 16-scale int16 vector, in both 128-bit lanes. */
static inline __m256i half_scales(__m256i sc16, int h)
{
    return h ? _mm256_permute2x128_si256(sc16, sc16, 0x11) : _mm256_permute2x128_si256(sc16, sc16, 0x00);
}

/* One Q2_K block against one Q8_K block: the integer sum of
 * scale * (q . y) in 8 lanes (q2k_msum has the mins' share). */
static inline __m256i q2k_isum(const block_q2_K *a, const block_q8_K *y, __m256i sc16)
{
    __m256i is[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}; /* two chains, as in w_q3_K */
    for (int h = 0; h < 2; h++) {
        __m256i scv = half_scales(sc16, h);
#pragma GCC unroll 4
        for (int k = 0; k < 4; k++) {
            __m256i p = _mm256_maddubs_epi16(k2_quants(a->qs + 32 * h, k),
                                             _mm256_loadu_si256((const __m256i *)(y->qs + 128 * h + 32 * k)));
            is[k & 1] = KQ_ACC(is[k & 1], p, scale_pair16(scv, k));
        }
    }
    return _mm256_add_epi32(is[0], is[1]);
}

static inline __m256i q2k_msum(__m256i m16, const block_q8_K *y) { return bsum_dot(m16, y); }

static float w_q2_K(const void *w, const void *x, int n)
{
    const block_q2_K *a = w;
    const block_q8_K *b = x;
    __m256 acc = _mm256_setzero_ps(), mins = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        _mm_prefetch((const char *)(a + i) + CPU_PREFETCH, _MM_HINT_T0);
        _mm_prefetch((const char *)(a + i) + CPU_PREFETCH + 64, _MM_HINT_T0);
        __m256i sc16, m16;
        q2k_scales(a[i].scales, &sc16, &m16);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b[i].d * h2f(a[i].d)), _mm256_cvtepi32_ps(q2k_isum(&a[i], &b[i], sc16)), acc);
        mins = _mm256_fmadd_ps(_mm256_set1_ps(b[i].d * h2f(a[i].dmin)), _mm256_cvtepi32_ps(q2k_msum(m16, &b[i])), mins);
    }
    return hsum8(acc) - hsum8(mins);
}

#define K2X4_FINISH(t)                                                                                          \
    do {                                                                                                        \
        acc##t = _mm256_fmadd_ps(_mm256_set1_ps(b##t[i].d * d), _mm256_cvtepi32_ps(is##t), acc##t);              \
        mn##t = _mm256_fmadd_ps(_mm256_set1_ps(b##t[i].d * dmin), _mm256_cvtepi32_ps(q2k_msum(m16, &b##t[i])), mn##t); \
    } while (0)

static void w_q2_K_x4(const void *w, const void *x, size_t stride, int n, float *out)
{
    const block_q2_K *a = w;
    const block_q8_K *b0 = X4(x, stride, 0), *b1 = X4(x, stride, 1), *b2 = X4(x, stride, 2), *b3 = X4(x, stride, 3);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0, mn0 = acc0, mn1 = acc0, mn2 = acc0,
           mn3 = acc0;
    for (int i = 0; i < n / QK_K; i++) {
        __m256i sc16, m16, is0 = _mm256_setzero_si256(), is1 = is0, is2 = is0, is3 = is0;
        q2k_scales(a[i].scales, &sc16, &m16);
        for (int h = 0; h < 2; h++) {
            __m256i scv = half_scales(sc16, h);
            for (int k = 0; k < 4; k++) KX4_DOT(k2_quants(a[i].qs + 32 * h, k), 128 * h + 32 * k, scale_pair16(scv, k));
        }
        float d = h2f(a[i].d), dmin = h2f(a[i].dmin);
        K2X4_FINISH(0);
        K2X4_FINISH(1);
        K2X4_FINISH(2);
        K2X4_FINISH(3);
    }
    out[0] = hsum8(acc0) - hsum8(mn0);
    out[1] = hsum8(acc1) - hsum8(mn1);
    out[2] = hsum8(acc2) - hsum8(mn2);
    out[3] = hsum8(acc3) - hsum8(mn3);
}

/* Q3_K's 16 signed 6-bit scales (-32..31) as int16: low nibbles from
 * bytes 0-7 (low halves for scales 0-7, high halves for 8-15), two high
 * bits from bytes 8-11 (bits 2 (j / 4) of byte 8 + j % 4). Worked on as
 * three 32-bit words, four scales per word. */
static inline __m256i q3k_scales(const uint8_t *s)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, s, 4);
    memcpy(&w1, s + 4, 4);
    memcpy(&w2, s + 8, 4);
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    uint32_t v0 = (w0 & m4) | (w2 & m2) << 4, v1 = (w1 & m4) | ((w2 >> 2) & m2) << 4;
    uint32_t v2 = ((w0 >> 4) & m4) | ((w2 >> 4) & m2) << 4, v3 = ((w1 >> 4) & m4) | ((w2 >> 6) & m2) << 4;
    __m128i u = _mm_sub_epi8(_mm_set_epi32((int)v3, (int)v2, (int)v1, (int)v0), _mm_set1_epi8(32));
    return _mm256_cvtepi8_epi16(u);
}

/* Q3_K's quants of group (h, k) taken as q + 4 (0..7): the hmask bit
 * (4h + k of each byte) adds the 4, so the -4 offset's share, 4 * scale *
 * bsum per sub-block, comes off the integer sum exactly (q3k_bias). */
static inline __m256i q3k_quants(const block_q3_K *a, __m256i hm, int h, int k)
{
    __m256i hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + k)), _mm256_set1_epi8(1));
    return _mm256_or_si256(k2_quants(a->qs + 32 * h, k), _mm256_slli_epi16(hb, 2));
}

static inline __m256i q3k_bias(__m256i sc16, const block_q8_K *y) { return _mm256_slli_epi32(bsum_dot(sc16, y), 2); }

static float w_q3_K(const void *w, const void *x, int n)
{
    const block_q3_K *a = w;
    const block_q8_K *b = x;
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK_K; i++) {
        _mm_prefetch((const char *)(a + i) + CPU_PREFETCH, _MM_HINT_T0);
        _mm_prefetch((const char *)(a + i) + CPU_PREFETCH + 64, _MM_HINT_T0);
        __m256i sc16 = q3k_scales(a[i].scales), hm = _mm256_loadu_si256((const __m256i *)a[i].hmask);
        /* two integer chains (even and odd groups) halve the dependency
         * chain; integer sums are exact, so the tile kernel's one chain
         * gives the same numbers */
        __m256i is[2] = {_mm256_sub_epi32(_mm256_setzero_si256(), q3k_bias(sc16, &b[i])), _mm256_setzero_si256()};
        for (int h = 0; h < 2; h++) {
            __m256i scv = half_scales(sc16, h);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                __m256i p = _mm256_maddubs_epi16(q3k_quants(&a[i], hm, h, k),
                                                 _mm256_loadu_si256((const __m256i *)(b[i].qs + 128 * h + 32 * k)));
                is[k & 1] = KQ_ACC(is[k & 1], p, scale_pair16(scv, k));
            }
        }
        __m256i isum = _mm256_add_epi32(is[0], is[1]);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(b[i].d * h2f(a[i].d)), _mm256_cvtepi32_ps(isum), acc);
    }
    return hsum8(acc);
}

static void w_q3_K_x4(const void *w, const void *x, size_t stride, int n, float *out)
{
    const block_q3_K *a = w;
    const block_q8_K *b0 = X4(x, stride, 0), *b1 = X4(x, stride, 1), *b2 = X4(x, stride, 2), *b3 = X4(x, stride, 3);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int i = 0; i < n / QK_K; i++) {
        const __m256i z = _mm256_setzero_si256();
        __m256i sc16 = q3k_scales(a[i].scales), hm = _mm256_loadu_si256((const __m256i *)a[i].hmask);
        __m256i is0 = _mm256_sub_epi32(z, q3k_bias(sc16, &b0[i])), is1 = _mm256_sub_epi32(z, q3k_bias(sc16, &b1[i]));
        __m256i is2 = _mm256_sub_epi32(z, q3k_bias(sc16, &b2[i])), is3 = _mm256_sub_epi32(z, q3k_bias(sc16, &b3[i]));
        for (int h = 0; h < 2; h++) {
            __m256i scv = half_scales(sc16, h);
            for (int k = 0; k < 4; k++) KX4_DOT(q3k_quants(&a[i], hm, h, k), 128 * h + 32 * k, scale_pair16(scv, k));
        }
        float d = h2f(a[i].d);
        KX4_FINISH(0);
        KX4_FINISH(1);
        KX4_FINISH(2);
        KX4_FINISH(3);
    }
    out[0] = hsum8(acc0);
    out[1] = hsum8(acc1);
    out[2] = hsum8(acc2);
    out[3] = hsum8(acc3);
}

#endif
