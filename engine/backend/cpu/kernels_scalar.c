/* kernels_scalar.c - portable reference kernels and run-time selection. */
#include "kernels.h"
#include "llm/status.h"
#include "quant_impl.h"

#include <math.h>
#include <stddef.h>
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

/* One Q4_K/Q5_K block (qh NULL for Q4_K) against a Q8_K block: the
 * 6-bit scales times each 32-value sub-block's integer dot, minus the mins
 * times the activation sums (bsums). */
static float k4_block(quant_f16 d, quant_f16 dmin, const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                      const block_q8_K *b)
{
    int isum = 0, msum = 0;
    for (int j = 0; j < 8; j++) {
        int sc, m, acc = 0;
        quant_k4_scale_min(j, scales, &sc, &m);
        const uint8_t *q = qs + (j / 2) * 32;
        const int8_t *y = b->qs + j * 32;
        for (int l = 0; l < 32; l++)
            acc += (((j & 1) ? (q[l] >> 4) : (q[l] & 0xf)) | (qh ? ((qh[l] >> j) & 1) << 4 : 0)) * y[l];
        isum += sc * acc;
        msum += m * (b->bsums[2 * j] + b->bsums[2 * j + 1]);
    }
    return b->d * (quant_f16_to_f32(d) * (float)isum - quant_f16_to_f32(dmin) * (float)msum);
}

static float w_q4_K(const void *w, const void *x, int n)
{
    const block_q4_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int i = 0; i < n / QK_K; i++) s += k4_block(a[i].d, a[i].dmin, a[i].scales, a[i].qs, NULL, &b[i]);
    return s;
}

static float w_q5_K(const void *w, const void *x, int n)
{
    const block_q5_K *a = w;
    const block_q8_K *b = x;
    float s = 0;
    for (int i = 0; i < n / QK_K; i++) s += k4_block(a[i].d, a[i].dmin, a[i].scales, a[i].qs, a[i].qh, &b[i]);
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

/* Q4_1, Q5_0, Q5_1 blocks (bb bytes, qh at qh_off or none, qs at qs_off,
 * a min after d when has_m) against Q8_0 activations: per block
 * d * dy * sum(q y) + m * dy * sum(y), Q5_0's m being -16 d. */
static float affine_dot(const uint8_t *w, size_t bb, int qh_off, int qs_off, int has_m, const block_q8_0 *b, int n)
{
    float s = 0;
    int q[QK8_0];
    for (int i = 0; i < n / QK8_0; i++, w += bb) {
        quant_f16 d16, m16 = 0;
        memcpy(&d16, w, 2);
        if (has_m)
            memcpy(&m16, w + 2, 2);
        quant_unpack32(w + qs_off, qh_off ? w + qh_off : NULL, q);
        int qy = 0, sy = 0;
        for (int j = 0; j < QK8_0; j++) {
            qy += q[j] * b[i].qs[j];
            sy += b[i].qs[j];
        }
        float d = quant_f16_to_f32(d16), dy = quant_f16_to_f32(b[i].d);
        s += has_m ? d * dy * (float)qy + quant_f16_to_f32(m16) * dy * (float)sy : d * dy * (float)(qy - 16 * sy);
    }
    return s;
}

static float w_q4_1(const void *w, const void *x, int n)
{
    return affine_dot(w, sizeof(block_q4_1), 0, offsetof(block_q4_1, qs), 1, x, n);
}

static float w_q5_0(const void *w, const void *x, int n)
{
    return affine_dot(w, sizeof(block_q5_0), offsetof(block_q5_0, qh), offsetof(block_q5_0, qs), 0, x, n);
}

static float w_q5_1(const void *w, const void *x, int n)
{
    return affine_dot(w, sizeof(block_q5_1), offsetof(block_q5_1, qh), offsetof(block_q5_1, qs), 1, x, n);
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
            for (int l = 0; l < 16; l++) acc += quant_k2_bits(a[i].qs, 16 * j + l) * b[i].qs[16 * j + l];
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
        quant_k3_scales(a[i].scales, sc);
        int isum = 0;
        for (int j = 0; j < 16; j++) {
            int acc = 0;
            for (int l = 0; l < 16; l++) {
                int e = 16 * j + l, q = quant_k2_bits(a[i].qs, e) - ((a[i].hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
                acc += q * b[i].qs[e];
            }
            isum += sc[j] * acc;
        }
        s += b[i].d * quant_f16_to_f32(a[i].d) * (float)isum;
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

/* As attn_dots and attn_wsum on rows read in place: each value converted
 * exactly as the to_f32 conversion does, then the same order and rounding. */
static float kv_value(quant_type t, const char *row, int d)
{
    if (t == QT_F16)
        return quant_f16_to_f32(((const quant_f16 *)row)[d]);
    LLM_ASSERT(t == QT_Q8_0);
    const block_q8_0 *b = (const block_q8_0 *)row + d / QK8_0;
    return quant_f16_to_f32(b->d) * (float)b->qs[d % QK8_0];
}

static void dots_kv(quant_type t, const float *q, const void *k, size_t row_bytes, int n, int hd, float scale,
                    float *out)
{
    for (int i = 0; i < n; i++) {
        const char *r = (const char *)k + (size_t)i * row_bytes;
        float s = 0;
        for (int d = 0; d < hd; d++) s += q[d] * kv_value(t, r, d);
        out[i] = scale * s;
    }
}

static void wsum_kv(quant_type t, float *o, const float *w, const void *v, size_t row_bytes, int n, int hd)
{
    for (int i = 0; i < n; i++)
        for (int d = 0; d < hd; d++) o[d] += w[i] * kv_value(t, (const char *)v + (size_t)i * row_bytes, d);
}

static void attn_dots_f16(const float *q, const void *k, size_t row_bytes, int n, int hd, float scale, float *out)
{
    dots_kv(QT_F16, q, k, row_bytes, n, hd, scale, out);
}

static void attn_dots_q8_0(const float *q, const void *k, size_t row_bytes, int n, int hd, float scale, float *out)
{
    dots_kv(QT_Q8_0, q, k, row_bytes, n, hd, scale, out);
}

static void attn_wsum_f16(float *o, const float *w, const void *v, size_t row_bytes, int n, int hd)
{
    wsum_kv(QT_F16, o, w, v, row_bytes, n, hd);
}

static void attn_wsum_q8_0(float *o, const float *w, const void *v, size_t row_bytes, int n, int hd)
{
    wsum_kv(QT_Q8_0, o, w, v, row_bytes, n, hd);
}

static void f16_to_f32(const void *src, float *dst, int n) { quant_dequantize_row(QT_F16, src, dst, (size_t)n); }
static void q8_0_to_f32(const void *src, float *dst, int n) { quant_dequantize_row(QT_Q8_0, src, dst, (size_t)n); }

static void f32_to_f16(const float *src, quant_f16 *dst, int n)
{
    for (int i = 0; i < n; i++) dst[i] = quant_f32_to_f16(src[i]);
}

/* gelu(g) u = g u / (1 + e^(-2v)), v = sqrt(2/pi) (g + 0.044715 g^3): the
 * tanh form without its cancellation in the negative tail. */
static void geglu(const float *g, const float *u, float *out, int n)
{
    const float k = -2.0f * 0.7978845608028654f;
    for (int i = 0; i < n; i++) out[i] = g[i] * u[i] / (1.0f + expf(k * (g[i] + 0.044715f * g[i] * g[i] * g[i])));
}

static void swiglu(const float *g, const float *u, float *out, int n)
{
    for (int i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void softmax(float *x, int n)
{
    float mx = -INFINITY, sum = 0;
    for (int p = 0; p < n; p++) mx = x[p] > mx ? x[p] : mx; /* fmaxf's value (mx is never NaN), without its call */
    for (int p = 0; p < n; p++) sum += (x[p] = expf(x[p] - mx));
    for (int p = 0; p < n; p++) x[p] /= sum;
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
    .attn_dots_kv = {[QT_F16] = attn_dots_f16, [QT_Q8_0] = attn_dots_q8_0},
    .attn_wsum_kv = {[QT_F16] = attn_wsum_f16, [QT_Q8_0] = attn_wsum_q8_0},
    .to_f32 = {[QT_F16] = f16_to_f32, [QT_Q8_0] = q8_0_to_f32},
    .to_f16 = f32_to_f16,
    .geglu = geglu,
    .swiglu = swiglu,
    .softmax = softmax,
};

void cpu_q8q_quantize(const float *x, cpu_q8q *dst, int n)
{
    for (int b = 0; b < n / QK8_0; b++, x += QK8_0) {
        float amax = 0;
        int finite = 1;
        for (int j = 0; j < QK8_0; j++) {
            finite &= isfinite(x[j]) != 0;
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        }
        float d = finite ? amax / 127.0f : NAN;
        dst[b].d = d;
        for (int j = 0; j < QK8_0; j++) { /* a quotient, not times 1 / d: that overflows for a subnormal d */
            long v = finite && d > 0 ? lrintf(x[j] / d) : 0;
            dst[b].qs[j] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
}

const cpu_kernels *cpu_kernels_scalar(void) { return &scalar; }

void cpu_tile8(cpu_quant_fn quant, int n_words, const float *x, size_t x_stride, int rows, void *dst, int n)
{
    enum { CHUNK = 4096, MAX_WORDS = 4 }; /* columns converted at a time into the row scratch; word arrays */
    static const float zeros[CHUNK];
    _Alignas(64) uint8_t row[CHUNK + CHUNK / QK8_0 * 4 * MAX_WORDS];
    LLM_ASSERT(n_words <= MAX_WORDS); /* a format this scratch cannot hold: a programming error */
    uint8_t *q = dst;
    uint32_t *words = (uint32_t *)(q + 8 * (size_t)n);
    size_t nb = (size_t)n / QK8_0;
    for (int t = 0; t < 8; t++)
        for (int c0 = 0; c0 < n; c0 += CHUNK) {
            int cn = n - c0 < CHUNK ? n - c0 : CHUNK;
            size_t b0 = (size_t)c0 / QK8_0;
            quant(t < rows ? x + (size_t)t * x_stride + c0 : zeros, row, cn);
            for (size_t b = 0; b < (size_t)cn / QK8_0; b++) {
                for (int j = 0; j < QK8_0 / 4; j++) memcpy(q + 256 * (b0 + b) + 32 * j + 4 * t, row + 32 * b + 4 * j, 4);
                for (int w = 0; w < n_words; w++)
                    memcpy(words + (size_t)w * nb * 8 + 8 * (b0 + b) + t, row + cn + 4 * ((size_t)w * cn / QK8_0 + b), 4);
            }
        }
}

const cpu_kernels *const *cpu_kernels_all(void)
{
    static const cpu_kernels *all[6];
    int n = 0;
    if (cpu_kernels_avx512()) all[n++] = cpu_kernels_avx512();
    if (cpu_kernels_vnni()) all[n++] = cpu_kernels_vnni();
    if (cpu_kernels_avxvnni()) all[n++] = cpu_kernels_avxvnni();
    if (cpu_kernels_avx2()) all[n++] = cpu_kernels_avx2();
    all[n++] = &scalar;
    all[n] = NULL;
    return all;
}

const cpu_kernels *cpu_kernels_best(void) { return cpu_kernels_all()[0]; }
