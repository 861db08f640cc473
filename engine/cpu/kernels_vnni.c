/* kernels_vnni.c - the AVX2 set with AVX512-VNNI dot products (vpdpbusd on
 * 256-bit registers) for Q8_0 weights. Compiled with the AVX512 VNNI/VL
 * flags; cpu_kernels_vnni() checks the CPU at run time.
 *
 * vpdpbusd multiplies unsigned by signed bytes. Activations are stored
 * offset by +128 as unsigned bytes (row layout: n bytes, then n/32 float
 * scales), so w . x = w . (x + 128) - 128 * sum(w); the correction is the
 * dot of the weights with a vector of 128s, computed once per weight block
 * and used as the accumulator's starting value for every token. */
#include "kernels.h"

#if defined(__x86_64__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

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

static const cpu_act act_u8 = {3, u8_row, u8_quant, u8_deq};

/* -128 * (sum of each 4 consecutive weights), per int32 lane. */
static inline __m256i minus_offset(__m256i w)
{
    return _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8((char)0x80), w));
}

static float q8_0_dot(const void *w, const void *x, int n)
{
    const block_q8_0 *a = w;
    const uint8_t *xq = x;
    const float *xd = (const float *)(xq + n);
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < n / QK8_0; i++) {
        /* decode streams weights once: fetch ahead, past page ends (CPU_PREFETCH) */
        _mm_prefetch((const char *)(a + i) + 4096, _MM_HINT_T0);
        __m256i wq = _mm256_loadu_si256((const __m256i *)a[i].qs);
        __m256i p = _mm256_dpbusd_epi32(minus_offset(wq), _mm256_loadu_si256((const __m256i *)(xq + QK8_0 * i)), wq);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(a[i].d) * xd[i]), _mm256_cvtepi32_ps(p), acc);
    }
    return hsum8(acc);
}

/* acc_t += (dw * dx_t[i]) * (w . x_t) for the four tokens of a tile. */
#define Q8_TOKEN(t, acc)                                                                             \
    do {                                                                                             \
        __m256i p = _mm256_dpbusd_epi32(c, _mm256_loadu_si256((const __m256i *)(xq##t + QK8_0 * i)), wq); \
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_broadcast_ss(xd##t + i)), _mm256_cvtepi32_ps(p), acc); \
    } while (0)

static void q8_0_dot4(const void *w, const void *x, size_t stride, int n, float *out)
{
    const block_q8_0 *a = w;
    const uint8_t *xq0 = x, *xq1 = xq0 + stride, *xq2 = xq1 + stride, *xq3 = xq2 + stride;
    const float *xd0 = (const float *)(xq0 + n), *xd1 = (const float *)(xq1 + n), *xd2 = (const float *)(xq2 + n),
                *xd3 = (const float *)(xq3 + n);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < n / QK8_0; i++) {
        __m256i wq = _mm256_loadu_si256((const __m256i *)a[i].qs), c = minus_offset(wq);
        __m256 dw = _mm256_set1_ps(_cvtsh_ss(a[i].d));
        Q8_TOKEN(0, a0);
        Q8_TOKEN(1, a1);
        Q8_TOKEN(2, a2);
        Q8_TOKEN(3, a3);
    }
    out[0] = hsum8(a0);
    out[1] = hsum8(a1);
    out[2] = hsum8(a2);
    out[3] = hsum8(a3);
}

/* Eight tokens per weight block: the offset correction and weight scale are
 * shared by twice as many tokens (32 registers with AVX512VL). */
static void q8_0_dot8(const void *w, const void *x, size_t stride, int n, float *out)
{
    const block_q8_0 *a = w;
    const uint8_t *xq0 = x, *xq1 = xq0 + stride, *xq2 = xq1 + stride, *xq3 = xq2 + stride, *xq4 = xq3 + stride,
                  *xq5 = xq4 + stride, *xq6 = xq5 + stride, *xq7 = xq6 + stride;
#define XD(t) const float *xd##t = (const float *)(xq##t + n)
    XD(0); XD(1); XD(2); XD(3); XD(4); XD(5); XD(6); XD(7);
#undef XD
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int i = 0; i < n / QK8_0; i++) {
        __m256i wq = _mm256_loadu_si256((const __m256i *)a[i].qs), c = minus_offset(wq);
        __m256 dw = _mm256_set1_ps(_cvtsh_ss(a[i].d));
        Q8_TOKEN(0, a0); Q8_TOKEN(1, a1); Q8_TOKEN(2, a2); Q8_TOKEN(3, a3);
        Q8_TOKEN(4, a4); Q8_TOKEN(5, a5); Q8_TOKEN(6, a6); Q8_TOKEN(7, a7);
    }
    out[0] = hsum8(a0); out[1] = hsum8(a1); out[2] = hsum8(a2); out[3] = hsum8(a3);
    out[4] = hsum8(a4); out[5] = hsum8(a5); out[6] = hsum8(a6); out[7] = hsum8(a7);
}

static cpu_kernels vnni;
static pthread_once_t vnni_once = PTHREAD_ONCE_INIT;

static void vnni_init(void)
{
    vnni = *cpu_kernels_avx2();
    vnni.name = "avx512vnni";
    vnni.dot[QT_Q8_0] = q8_0_dot;
    vnni.dot4[QT_Q8_0] = q8_0_dot4;
    vnni.dot8[QT_Q8_0] = q8_0_dot8;
    vnni.act[QT_Q8_0] = &act_u8;
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
