/* kernels_vnni.c - the AVX2 set with AVX512-VNNI dot products on 256-bit
 * registers: vpdpbusd for Q8_0 weights, vpdpwssd for the K-quants' scaled
 * sums, Q5_0 weights decoded to the same bytes as Q8_0's. Compiled with
 * the AVX512 VNNI/VL flags; cpu_kernels_vnni() checks
 * the CPU at run time.
 *
 * vpdpbusd multiplies unsigned by signed bytes. Activations are stored
 * offset by +128 as unsigned bytes (row layout: n bytes, then n/32 float
 * scales), so w . x = w . (x + 128) - 128 * sum(w); the correction is the
 * dot of the weights with a vector of 128s, computed once per weight block
 * (the one-row kernel starts its accumulator there, the tiles subtract it
 * from every token's block sum). */
#include "kernels.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* K-quants: vpdpwssd adds the scaled pair sums in one instruction */
#define KQ_ACC(acc, p, s) _mm256_dpwssd_epi32((acc), (p), (s))
#include "x86_kquant.h"

static size_t u8_row(int n) { return (size_t)n + (size_t)n / QK8_0 * sizeof(float); }

/* Rounds 32 floats times id to int8 in element order (ties to even). */
static inline __m256i round32(const float *x, __m256 id)
{
    __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
    __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
    __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
    __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

static void u8_quant(const float *x, void *dst, int n)
{
    uint8_t *q = dst;
    float *d = (float *)(q + n);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < n / QK8_0; i++, x += QK8_0) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK8_0; j += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        float s = amax / 127.f;
        d[i] = s;
        /* +128 on a two's-complement byte is a flip of its top bit */
        __m256i v = _mm256_xor_si256(round32(x, _mm256_set1_ps(s ? 1.f / s : 0.f)), _mm256_set1_epi8((char)0x80));
        _mm256_storeu_si256((__m256i *)(q + QK8_0 * i), v);
    }
}

static void u8_deq(const void *a, float *dst, int n)
{
    const uint8_t *q = a;
    const float *d = (const float *)(q + n);
    for (int i = 0; i < n; i++) dst[i] = d[i / QK8_0] * (float)((int)q[i] - 128);
}

/* Tile of 8 rows: for each block of 32, eight groups of 4 quants, each
 * group holding tokens 0..7 side by side (4 bytes each), so one 32-byte
 * load gives lane t token t's 4 quants; then each block's 8 scales.
 *   bytes: (n/32 blocks, 8 groups, 8 tokens, 4), then floats: (n/32, 8) */
static void u8_quant8(const float *x, size_t x_stride, int rows, void *dst, int n)
{
    cpu_tile8(u8_quant, 1, x, x_stride, rows, dst, n);
}

static const cpu_act act_u8 = {3, u8_row, u8_quant, u8_deq, u8_quant8};

/* -128 * (sum of each 4 consecutive weights), per int32 lane. */
static inline __m256i minus_offset(__m256i w)
{
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), w));
}

/* Block i's 32 signed weights and its scale: Q8_0's as stored, Q5_0's
 * decoded (q - 16). Everything below is written once for both types;
 * q5 is a constant at each call, so each kernel compiles to its own loop. */
static inline __attribute__((always_inline)) __m256i wblock(int q5, const void *w, int i, float *d)
{
    if (q5) {
        const block_q5_0 *b = (const block_q5_0 *)w + i;
        *d = _cvtsh_ss(b->d);
        return q5_0_quants(b);
    }
    const block_q8_0 *b = (const block_q8_0 *)w + i;
    *d = _cvtsh_ss(b->d);
    return _mm256_loadu_si256((const __m256i *)b->qs);
}

static inline __m256i u8_block(__m256i wq, const uint8_t *xq, int i)
{
    return _mm256_dpbusd_epi32(minus_offset(wq), _mm256_loadu_si256((const __m256i *)(xq + QK8_0 * i)), wq);
}

/* Each block's integer sum is reduced exactly, then block i is added (one
 * fma) to float chain i % 4, and the chains are summed as
 * (c0 + c1) + (c2 + c3): exactly what u8_dot8 does in each of its lanes,
 * so a token gives bit-identical results alone or in a tile (batch
 * invariance). Four chains also keep fma latency off the critical path. */
static inline __attribute__((always_inline)) float u8_dot(int q5, const void *w, const void *x, int n)
{
    const uint8_t *xq = x;
    const float *xd = (const float *)(xq + n);
    size_t bb = q5 ? sizeof(block_q5_0) : sizeof(block_q8_0);
    __m128 acc = _mm_setzero_ps();
    int nb = n / QK8_0, i = 0;
    float d[4];
    for (; i + 4 <= nb; i += 4) {
        /* decode streams weights once: fetch ahead, past page ends (CPU_PREFETCH) */
        _mm_prefetch((const char *)w + (size_t)i * bb + CPU_PREFETCH, _MM_HINT_T0);
        _mm_prefetch((const char *)w + (size_t)i * bb + CPU_PREFETCH + 64, _MM_HINT_T0);
        __m256i s0 = u8_block(wblock(q5, w, i, &d[0]), xq, i), s1 = u8_block(wblock(q5, w, i + 1, &d[1]), xq, i + 1);
        __m256i s2 = u8_block(wblock(q5, w, i + 2, &d[2]), xq, i + 2), s3 = u8_block(wblock(q5, w, i + 3, &d[3]), xq, i + 3);
        __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(s2, s3));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
        __m128 dd = _mm_mul_ps(_mm_loadu_ps(d), _mm_loadu_ps(xd + i));
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(s4), dd, acc);
    }
    float c[4];
    _mm_storeu_ps(c, acc);
    for (; i < nb; i++) {
        __m256i wq = wblock(q5, w, i, &d[0]);
        c[i & 3] = fmaf((float)hsum8i(u8_block(wq, xq, i)), d[0] * xd[i], c[i & 3]);
    }
    return (c[0] + c[1]) + (c[2] + c[3]);
}

/* 128 * the sum of a block's 32 weights, in every lane. */
static inline __m256i offset_all(__m256i wq)
{
    __m256i off = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), wq);
    __m128i o4 = _mm_add_epi32(_mm256_castsi256_si128(off), _mm256_extracti128_si256(off, 1));
    o4 = _mm_add_epi32(o4, _mm_shuffle_epi32(o4, 0x4e));
    o4 = _mm_add_epi32(o4, _mm_shuffle_epi32(o4, 0xb1));
    return _mm256_broadcastd_epi32(o4);
}

/* One weight row against an 8-token tile (see u8_quant8): each 4 weights
 * are broadcast to all lanes and vpdpbusd adds lane t's token t products,
 * so the 8 lanes end as the 8 tokens' block sums: one instruction per 4
 * weights for all eight tokens, and one scale multiply per block. */
static inline __attribute__((always_inline)) void u8_dot8(int q5, const void *w, const void *x, int n, float *out)
{
    const uint8_t *xq = x;
    const float *xd = (const float *)(xq + 8 * (size_t)n);
    size_t bb = q5 ? sizeof(block_q5_0) : sizeof(block_q8_0);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int i = 0; i < n / QK8_0; i++) {
        /* small batches stream weights from DRAM: fetch ahead as the one-row kernel does */
        _mm_prefetch((const char *)w + (size_t)i * bb + CPU_PREFETCH, _MM_HINT_T0);
        const uint8_t *tile = xq + (size_t)i * 256;
        float dw;
        __m256i wq = wblock(q5, w, i, &dw);
        int32_t wg[8];
        _mm256_storeu_si256((__m256i *)wg, wq);
        /* two exact integer chains halve the dpbusd latency chain */
        __m256i s = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        _Pragma("GCC unroll 4") for (int g = 0; g < 8; g += 2) {
            s = _mm256_dpbusd_epi32(s, _mm256_loadu_si256((const __m256i *)(tile + 32 * g)), _mm256_set1_epi32(wg[g]));
            s1 = _mm256_dpbusd_epi32(s1, _mm256_loadu_si256((const __m256i *)(tile + 32 * g + 32)),
                                     _mm256_set1_epi32(wg[g + 1]));
        }
        /* remove the +128 offset: 128 * sum of the block's weights, same for every token */
        s = _mm256_sub_epi32(_mm256_add_epi32(s, s1), offset_all(wq));
        __m256 dd = _mm256_mul_ps(_mm256_set1_ps(dw), _mm256_loadu_ps(xd + 8 * (size_t)i));
        acc[i & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd, acc[i & 3]); /* chain i % 4, as u8_dot */
    }
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
}

/* Two 8-token tiles (x and x + 8 * stride) against one weight row: each
 * broadcast weight group, offset correction and weight scale serves 16
 * tokens. Every lane computes exactly what u8_dot8 computes for it. */
static inline __attribute__((always_inline)) void u8_dot16(int q5, const void *w, const void *x, size_t stride, int n,
                                                             float *out)
{
    const uint8_t *xa = x, *xb = xa + 8 * stride;
    const float *da = (const float *)(xa + 8 * (size_t)n), *db = (const float *)(xb + 8 * (size_t)n);
    size_t bb = q5 ? sizeof(block_q5_0) : sizeof(block_q8_0);
    __m256 acc_a[4], acc_b[4];
    for (int c = 0; c < 4; c++) acc_a[c] = acc_b[c] = _mm256_setzero_ps();
    for (int i = 0; i < n / QK8_0; i++) {
        _mm_prefetch((const char *)w + (size_t)i * bb + CPU_PREFETCH, _MM_HINT_T0);
        const uint8_t *ta = xa + (size_t)i * 256, *tb = xb + (size_t)i * 256;
        float dwf;
        __m256i wq = wblock(q5, w, i, &dwf);
        int32_t wg[8];
        _mm256_storeu_si256((__m256i *)wg, wq);
        __m256i sa = _mm256_setzero_si256(), sa1 = sa, sb = sa, sb1 = sa;
        _Pragma("GCC unroll 4") for (int g = 0; g < 8; g += 2) {
            __m256i w0 = _mm256_set1_epi32(wg[g]), w1 = _mm256_set1_epi32(wg[g + 1]);
            sa = _mm256_dpbusd_epi32(sa, _mm256_loadu_si256((const __m256i *)(ta + 32 * g)), w0);
            sa1 = _mm256_dpbusd_epi32(sa1, _mm256_loadu_si256((const __m256i *)(ta + 32 * g + 32)), w1);
            sb = _mm256_dpbusd_epi32(sb, _mm256_loadu_si256((const __m256i *)(tb + 32 * g)), w0);
            sb1 = _mm256_dpbusd_epi32(sb1, _mm256_loadu_si256((const __m256i *)(tb + 32 * g + 32)), w1);
        }
        __m256i o8 = offset_all(wq);
        sa = _mm256_sub_epi32(_mm256_add_epi32(sa, sa1), o8);
        sb = _mm256_sub_epi32(_mm256_add_epi32(sb, sb1), o8);
        __m256 dw = _mm256_set1_ps(dwf);
        __m256 dda = _mm256_mul_ps(dw, _mm256_loadu_ps(da + 8 * (size_t)i));
        __m256 ddb = _mm256_mul_ps(dw, _mm256_loadu_ps(db + 8 * (size_t)i));
        acc_a[i & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sa), dda, acc_a[i & 3]);
        acc_b[i & 3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sb), ddb, acc_b[i & 3]);
    }
    _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(acc_a[0], acc_a[1]), _mm256_add_ps(acc_a[2], acc_a[3])));
    _mm256_storeu_ps(out + 8, _mm256_add_ps(_mm256_add_ps(acc_b[0], acc_b[1]), _mm256_add_ps(acc_b[2], acc_b[3])));
}

static float q8_0_dot(const void *w, const void *x, int n) { return u8_dot(0, w, x, n); }
static float q5_0_dot(const void *w, const void *x, int n) { return u8_dot(1, w, x, n); }
static void q8_0_dot8(const void *w, const void *x, size_t stride, int n, float *out)
{
    (void)stride;
    u8_dot8(0, w, x, n, out);
}
static void q5_0_dot8(const void *w, const void *x, size_t stride, int n, float *out)
{
    (void)stride;
    u8_dot8(1, w, x, n, out);
}
static void q8_0_dot16(const void *w, const void *x, size_t stride, int n, float *out) { u8_dot16(0, w, x, stride, n, out); }
static void q5_0_dot16(const void *w, const void *x, size_t stride, int n, float *out) { u8_dot16(1, w, x, stride, n, out); }

/* The peak estimate's loop: 12 vpdpbusd (256-bit) chains of 32 multiply-adds. */
static double spin256(long iters, int seed)
{
    __m256i a[12], w = _mm256_set1_epi8((char)(seed | 1)), x = _mm256_set1_epi8((char)(seed + 3));
    for (int i = 0; i < 12; i++) a[i] = _mm256_set1_epi32(seed + i); /* distinct: no chain merges with another */
    for (long it = 0; it < iters; it++)
        _Pragma("GCC unroll 12") for (int i = 0; i < 12; i++) a[i] = _mm256_dpbusd_epi32(a[i], w, x);
    volatile int sink = 0;
    for (int i = 0; i < 12; i++) sink += hsum8i(a[i]);
    (void)sink;
    return 12.0 * 64.0 * (double)iters;
}

static cpu_kernels vnni;
static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;

static void vnni_init(void)
{
    vnni = *cpu_kernels_avx2();
    vnni.name = "avx512vnni";
    /* the row kernels, not the avx2 set's vpmaddubsw tiles (the avx512 set adds its own) */
    memset(vnni.pack, 0, sizeof vnni.pack);
    vnni.dot[QT_Q8_0] = q8_0_dot;
    vnni.dot4[QT_Q8_0] = NULL; /* tokens past the last tile of 8 go one by one */
    vnni.dot8[QT_Q8_0] = q8_0_dot8;
    vnni.dot16[QT_Q8_0] = q8_0_dot16;
    /* the K-quants: the shared kernels compiled with vpdpwssd */
    vnni.dot[QT_Q2_K] = w_q2_K;
    vnni.dot4[QT_Q2_K] = w_q2_K_x4;
    vnni.dot[QT_Q3_K] = w_q3_K;
    vnni.dot4[QT_Q3_K] = w_q3_K_x4;
    vnni.dot[QT_Q4_K] = w_q4_K;
    vnni.dot4[QT_Q4_K] = w_q4_K_x4;
    vnni.dot[QT_Q5_K] = w_q5_K;
    vnni.dot4[QT_Q5_K] = w_q5_K_x4;
    vnni.dot[QT_Q6_K] = w_q6_K;
    vnni.dot4[QT_Q6_K] = w_q6_K_x4;
    vnni.act[QT_Q8_0] = &act_u8;
    vnni.dot[QT_Q5_0] = q5_0_dot; /* Q5_0 weights decoded to the same signed bytes */
    vnni.dot4[QT_Q5_0] = NULL;
    vnni.dot8[QT_Q5_0] = q5_0_dot8;
    vnni.dot16[QT_Q5_0] = q5_0_dot16;
    vnni.act[QT_Q5_0] = &act_u8;
    vnni.int8_spin = spin256;
}

const cpu_kernels *cpu_kernels_vnni(void)
{
    __builtin_cpu_init();
    if (!cpu_kernels_avx2() || !__builtin_cpu_supports("avx512vnni") || !__builtin_cpu_supports("avx512vl"))
        return NULL;
    pthread_once(&vnni_once, vnni_init);
    return &vnni;
}
#else
const cpu_kernels *cpu_kernels_vnni(void) { return NULL; }
#endif
