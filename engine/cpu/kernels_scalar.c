/* kernels_scalar.c - portable reference kernels and run-time selection. */
#include "kernels.h"

#include <string.h>

static size_t f32_row(int n) { return (size_t)n * sizeof(float); }
static void f32_copy(const void *a, float *dst, int n) { memcpy(dst, a, (size_t)n * sizeof(float)); }
static void f32_quant(const float *x, void *dst, int n) { memcpy(dst, x, (size_t)n * sizeof(float)); }
const cpu_act cpu_act_f32 = {0, f32_row, f32_quant, f32_copy, NULL};

static size_t q8_0_row(int n) { return quant_row_bytes(QT_Q8_0, (size_t)n); }
static size_t q8_K_row(int n) { return quant_row_bytes(QT_Q8_K, (size_t)n); }
static void q8_0_deq(const void *a, float *dst, int n) { quant_dequantize_row(QT_Q8_0, a, dst, (size_t)n); }
static void q8_K_deq(const void *a, float *dst, int n) { quant_dequantize_row(QT_Q8_K, a, dst, (size_t)n); }

static float dot_f32(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static float w_f32(const void *w, const void *x, int n) { return dot_f32(w, x, n); }

static float w_f16(const void *w, const void *x, int n)
{
    const quant_f16 *h = w;
    const float *f = x;
    float s = 0;
    for (int i = 0; i < n; i++) s += quant_f16_to_f32(h[i]) * f[i];
    return s;
}

static float w_bf16(const void *w, const void *x, int n)
{
    const uint16_t *h = w;
    const float *f = x;
    float s = 0;
    for (int i = 0; i < n; i++) s += quant_bf16_to_f32(h[i]) * f[i];
    return s;
}

static float w_q8_0(const void *w, const void *x, int n)
{
    const block_q8_0 *a = w, *b = x;
    float s = 0;
    for (int i = 0; i < n / QK8_0; i++) {
        int acc = 0;
        for (int j = 0; j < QK8_0; j++) acc += a[i].qs[j] * b[i].qs[j];
        s += quant_f16_to_f32(a[i].d) * quant_f16_to_f32(b[i].d) * (float)acc;
    }
    return s;
}

static float w_q4_0(const void *w, const void *x, int n)
{
    const block_q4_0 *a = w;
    const block_q8_0 *b = x;
    float s = 0;
    for (int i = 0; i < n / QK4_0; i++) {
        int acc = 0;
        for (int j = 0; j < QK4_0 / 2; j++) {
            acc += ((a[i].qs[j] & 0xf) - 8) * b[i].qs[j];
            acc += ((a[i].qs[j] >> 4) - 8) * b[i].qs[j + 16];
        }
        s += quant_f16_to_f32(a[i].d) * quant_f16_to_f32(b[i].d) * (float)acc;
    }
    return s;
}

/* Same unpacking as quant.c's q4k_scale_min (kept local: hot loop). */
static void scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static float w_q4_K(const void *w, const void *x, int n)
{
    const block_q4_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, acc = 0;
            scale_min(j, a[i].scales, &sc, &m);
            const uint8_t *q = a[i].qs + (j / 2) * 32;
            const int8_t *y = b[i].qs + j * 32;
            for (int l = 0; l < 32; l++) acc += ((j & 1) ? (q[l] >> 4) : (q[l] & 0xf)) * y[l];
            isum += sc * acc;
            msum += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        s += b[i].d * (quant_f16_to_f32(a[i].d) * isum - quant_f16_to_f32(a[i].dmin) * msum);
    }
    return s;
}

static float w_q6_K(const void *w, const void *x, int n)
{
    const block_q6_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        const uint8_t *ql = a[i].ql, *qh = a[i].qh;
        for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
            int8_t *o = q + 128 * h;
            for (int l = 0; l < 32; l++) {
                o[l] = (int8_t)(((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32);
                o[l + 32] = (int8_t)(((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32);
                o[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                o[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
            }
        }
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int acc = 0;
            for (int l = 0; l < 16; l++) acc += q[16 * j + l] * b[i].qs[16 * j + l];
            isum += a[i].scales[j] * acc;
        }
        s += b[i].d * quant_f16_to_f32(a[i].d) * isum;
    }
    return s;
}

/* Q4_1/Q5_1/Q5_0: quants q[32] of one weight block against an activation
 * block: (sum q*y, sum y). */
static void dot32(const int *q, const block_q8_0 *b, int *qy, int *sy)
{
    *qy = *sy = 0;
    for (int j = 0; j < QK8_0; j++) {
        *qy += q[j] * b->qs[j];
        *sy += b->qs[j];
    }
}

static void unpack4(const uint8_t *qs, int *q)
{
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0xf;
        q[j + 16] = qs[j] >> 4;
    }
}

static void unpack5(const uint8_t *qs, const uint8_t *qh8, int *q)
{
    uint32_t qh;
    memcpy(&qh, qh8, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (qs[j] & 0xf) | (int)((qh >> j) & 1) << 4;
        q[j + 16] = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
    }
}

static float w_q4_1(const void *w, const void *x, int n)
{
    const block_q4_1 *a = w;
    const block_q8_0 *b = x;
    float s = 0;
    int q[QK8_0], qy, sy;
    for (int i = 0; i < n / QK8_0; i++) {
        unpack4(a[i].qs, q);
        dot32(q, &b[i], &qy, &sy);
        float dy = quant_f16_to_f32(b[i].d);
        s += quant_f16_to_f32(a[i].d) * dy * (float)qy + quant_f16_to_f32(a[i].m) * dy * (float)sy;
    }
    return s;
}

static float w_q5_0(const void *w, const void *x, int n)
{
    const block_q5_0 *a = w;
    const block_q8_0 *b = x;
    float s = 0;
    int q[QK8_0], qy, sy;
    for (int i = 0; i < n / QK8_0; i++) {
        unpack5(a[i].qs, a[i].qh, q);
        dot32(q, &b[i], &qy, &sy);
        s += quant_f16_to_f32(a[i].d) * quant_f16_to_f32(b[i].d) * (float)(qy - 16 * sy);
    }
    return s;
}

static float w_q5_1(const void *w, const void *x, int n)
{
    const block_q5_1 *a = w;
    const block_q8_0 *b = x;
    float s = 0;
    int q[QK8_0], qy, sy;
    for (int i = 0; i < n / QK8_0; i++) {
        unpack5(a[i].qs, a[i].qh, q);
        dot32(q, &b[i], &qy, &sy);
        float dy = quant_f16_to_f32(b[i].d);
        s += quant_f16_to_f32(a[i].d) * dy * (float)qy + quant_f16_to_f32(a[i].m) * dy * (float)sy;
    }
    return s;
}

/* Q2_K: sum over 16 sub-blocks of scale * (q . y) minus min * bsum. */
static float w_q2_K(const void *w, const void *x, int n)
{
    const block_q2_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int isum = 0, msum = 0;
        for (int j = 0; j < 16; j++) {
            int acc = 0;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l, q = (a[i].qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
                acc += q * b[i].qs[e];
            }
            isum += (a[i].scales[j] & 0xf) * acc;
            msum += (a[i].scales[j] >> 4) * b[i].bsums[j];
        }
        s += b[i].d * (quant_f16_to_f32(a[i].d) * (float)isum - quant_f16_to_f32(a[i].dmin) * (float)msum);
    }
    return s;
}

static float w_q3_K(const void *w, const void *x, int n)
{
    const block_q3_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    int sc[16];
    for (int i = 0; i < n / QK_K; i++) {
        quant_q3k_scales(a[i].scales, sc);
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int acc = 0;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l, half = e / 128, k = (e % 128) / 32;
                int q = ((a[i].qs[32 * half + e % 32] >> (2 * k)) & 3) - (a[i].hmask[e % 32] >> (4 * half + k) & 1 ? 0 : 4);
                acc += q * b[i].qs[e];
            }
            isum += sc[j] * acc;
        }
        s += b[i].d * quant_f16_to_f32(a[i].d) * (float)isum;
    }
    return s;
}

static float w_q5_K(const void *w, const void *x, int n)
{
    const block_q5_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int i = 0; i < n / QK_K; i++) {
        int isum = 0, msum = 0;
        for (int j = 0; j < 8; j++) {
            int sc, m, acc = 0;
            scale_min(j, a[i].scales, &sc, &m);
            const uint8_t *q = a[i].qs + (j / 2) * 32;
            const int8_t *y = b[i].qs + j * 32;
            for (int l = 0; l < 32; l++)
                acc += (((j & 1) ? (q[l] >> 4) : (q[l] & 0xf)) | ((a[i].qh[l] >> j) & 1) << 4) * y[l];
            isum += sc * acc;
            msum += m * (b[i].bsums[2 * j] + b[i].bsums[2 * j + 1]);
        }
        s += b[i].d * (quant_f16_to_f32(a[i].d) * (float)isum - quant_f16_to_f32(a[i].dmin) * (float)msum);
    }
    return s;
}

static void quant_q8_0(const float *x, void *dst, int n) { quant_quantize_row(QT_Q8_0, x, dst, (size_t)n); }
static void quant_q8_K(const float *x, void *dst, int n) { quant_quantize_row(QT_Q8_K, x, dst, (size_t)n); }
static const cpu_act act_q8_0 = {1, q8_0_row, quant_q8_0, q8_0_deq, NULL};
static const cpu_act act_q8_K = {2, q8_K_row, quant_q8_K, q8_K_deq, NULL};

static void axpy(float *y, float a, const float *x, int n)
{
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static void attn_dots(const float *q, const float *k, size_t stride, int n, int hd, float scale, float *out)
{
    for (int i = 0; i < n; i++) out[i] = scale * dot_f32(q, k + (size_t)i * stride, hd);
}

static void attn_wsum(float *o, const float *w, const float *v, size_t stride, int n, int hd)
{
    for (int i = 0; i < n; i++) axpy(o, w[i], v + (size_t)i * stride, hd);
}

/* As attn_dots and attn_wsum, on F16 rows: same order, same rounding. */
static void attn_dots_f16(const float *q, const quant_f16 *k, size_t stride, int n, int hd, float scale, float *out)
{
    for (int i = 0; i < n; i++) {
        float s = 0;
        for (int d = 0; d < hd; d++) s += q[d] * quant_f16_to_f32(k[(size_t)i * stride + d]);
        out[i] = scale * s;
    }
}

static void attn_wsum_f16(float *o, const float *w, const quant_f16 *v, size_t stride, int n, int hd)
{
    for (int i = 0; i < n; i++)
        for (int d = 0; d < hd; d++) o[d] += w[i] * quant_f16_to_f32(v[(size_t)i * stride + d]);
}

static void f16_to_f32(const void *src, float *dst, int n) { quant_dequantize_row(QT_F16, src, dst, (size_t)n); }
static void q8_0_to_f32(const void *src, float *dst, int n) { quant_dequantize_row(QT_Q8_0, src, dst, (size_t)n); }

static void f32_to_f16(const float *src, quant_f16 *dst, int n)
{
    for (int i = 0; i < n; i++) dst[i] = quant_f32_to_f16(src[i]);
}

static const cpu_kernels scalar = {
    .name = "scalar",
    .dot = {[QT_F32] = w_f32, [QT_F16] = w_f16, [QT_BF16] = w_bf16, [QT_Q8_0] = w_q8_0,
            [QT_Q4_0] = w_q4_0, [QT_Q4_1] = w_q4_1, [QT_Q5_0] = w_q5_0, [QT_Q5_1] = w_q5_1,
            [QT_Q2_K] = w_q2_K, [QT_Q3_K] = w_q3_K, [QT_Q4_K] = w_q4_K, [QT_Q5_K] = w_q5_K, [QT_Q6_K] = w_q6_K},
    .act = {[QT_F32] = &cpu_act_f32, [QT_F16] = &cpu_act_f32, [QT_BF16] = &cpu_act_f32, [QT_Q8_0] = &act_q8_0,
            [QT_Q4_0] = &act_q8_0, [QT_Q4_1] = &act_q8_0, [QT_Q5_0] = &act_q8_0, [QT_Q5_1] = &act_q8_0,
            [QT_Q2_K] = &act_q8_K, [QT_Q3_K] = &act_q8_K, [QT_Q4_K] = &act_q8_K, [QT_Q5_K] = &act_q8_K,
            [QT_Q6_K] = &act_q8_K},
    .dot_f32 = dot_f32,
    .axpy = axpy,
    .attn_dots = attn_dots,
    .attn_wsum = attn_wsum,
    .attn_dots_f16 = attn_dots_f16,
    .attn_wsum_f16 = attn_wsum_f16,
    .to_f32 = {[QT_F16] = f16_to_f32, [QT_Q8_0] = q8_0_to_f32},
    .to_f16 = f32_to_f16,
};

const cpu_kernels *cpu_kernels_scalar(void) { return &scalar; }

const cpu_kernels *const *cpu_kernels_all(void)
{
    static const cpu_kernels *all[4];
    int n = 0;
    if (cpu_kernels_vnni()) all[n++] = cpu_kernels_vnni();
    if (cpu_kernels_avx2()) all[n++] = cpu_kernels_avx2();
    all[n++] = &scalar;
    all[n] = NULL;
    return all;
}

const cpu_kernels *cpu_kernels_best(void) { return cpu_kernels_all()[0]; }
