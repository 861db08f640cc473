/* quant.c - block layouts, reference dequantization/quantization and
 * half-precision conversion for the tensor types the engine loads.
 *
 * These scalar routines are the definition the SIMD kernels are tested
 * against; they favour clarity over speed (except f16->f32, a table). */
#include "llm/quant.h"
#include "llm/status.h"
#include "quant_impl.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>

static float f16_table[1 << 16];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static float f16_to_f32_exact(quant_f16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do { e++; man <<= 1; } while (!(man & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static void build_f16_table(void)
{
    for (uint32_t i = 0; i < (1u << 16); i++)
        f16_table[i] = f16_to_f32_exact((quant_f16)i);
}

void quant_init(void) { pthread_once(&f16_once, build_f16_table); }

float quant_f16_to_f32(quant_f16 h)
{
    quant_init();
    return f16_table[h];
}

quant_f16 quant_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan: keep nan quiet */
        return (quant_f16)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (quant_f16)(sign | 0x7c00);
    if (absx < 0x38800000u) { /* result is subnormal or zero */
        if (absx < 0x33000000u)
            return (quant_f16)sign;
        uint32_t e = absx >> 23, man = (absx & 0x7fffff) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = man >> shift, rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (quant_f16)(sign | r);
    }
    uint32_t r = (absx - 0x38000000u) >> 13; /* rebias exponent 127 -> 15 */
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1)))
        r++;
    return (quant_f16)(sign | r);
}

float quant_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

uint16_t quant_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 64);
    return (uint16_t)((x + (0x7fff + ((x >> 16) & 1))) >> 16);
}

int quant_supported(quant_type t)
{
    switch (t) {
    case QT_F32: case QT_F16: case QT_BF16: case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1:
    case QT_Q8_0: case QT_Q2_K: case QT_Q3_K: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K:
        return 1;
    default:
        return 0;
    }
}

const char *quant_type_name(unsigned t)
{
    static const char *names[QT_COUNT] = {
        [0] = "F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [6] = "Q5_0",
        [7] = "Q5_1", [8] = "Q8_0", [9] = "Q8_1", [10] = "Q2_K", [11] = "Q3_K",
        [12] = "Q4_K", [13] = "Q5_K", [14] = "Q6_K", [15] = "Q8_K",
        [16] = "IQ2_XXS", [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S",
        [20] = "IQ4_NL", [21] = "IQ3_S", [22] = "IQ2_S", [23] = "IQ4_XS",
        [24] = "I8", [25] = "I16", [26] = "I32", [27] = "I64", [28] = "F64",
        [29] = "IQ1_M", [30] = "BF16", [34] = "TQ1_0", [35] = "TQ2_0",
    };
    return t < QT_COUNT ? names[t] : NULL;
}

size_t quant_block_elems(quant_type t)
{
    switch (t) {
    case QT_F32: case QT_F16: case QT_BF16: return 1;
    case QT_Q4_0: case QT_Q4_1: case QT_Q5_0: case QT_Q5_1: return QK4_0;
    case QT_Q8_0: return QK8_0;
    case QT_Q2_K: case QT_Q3_K: case QT_Q4_K: case QT_Q5_K: case QT_Q6_K: case QT_Q8_K: return QK_K;
    default: return 0;
    }
}

size_t quant_block_bytes(quant_type t)
{
    switch (t) {
    case QT_F32: return 4;
    case QT_F16: case QT_BF16: return 2;
    case QT_Q4_0: return sizeof(block_q4_0);
    case QT_Q4_1: return sizeof(block_q4_1);
    case QT_Q5_0: return sizeof(block_q5_0);
    case QT_Q5_1: return sizeof(block_q5_1);
    case QT_Q8_0: return sizeof(block_q8_0);
    case QT_Q2_K: return sizeof(block_q2_K);
    case QT_Q3_K: return sizeof(block_q3_K);
    case QT_Q4_K: return sizeof(block_q4_K);
    case QT_Q5_K: return sizeof(block_q5_K);
    case QT_Q6_K: return sizeof(block_q6_K);
    case QT_Q8_K: return sizeof(block_q8_K);
    default: return 0;
    }
}

/* ---- finiteness ---------------------------------------------------------- */

/* First index i < n whose 16-bit value has all the exponent bits of mask
 * set (NaN or infinity), or n. The |= pass is branch-free so the compiler
 * can vectorize it; the index is searched for only when something was
 * found. */
static size_t first_exp16(const uint16_t *h, size_t n, uint16_t mask)
{
    uint16_t any = 0;
    for (size_t i = 0; i < n; i++) any |= (uint16_t)((h[i] & mask) == mask);
    if (!any)
        return n;
    size_t i = 0;
    while ((h[i] & mask) != mask) i++;
    return i;
}

static size_t first_f32(const uint32_t *x, size_t n)
{
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++) any |= (x[i] & 0x7f800000u) == 0x7f800000u;
    if (!any)
        return n;
    size_t i = 0;
    while ((x[i] & 0x7f800000u) != 0x7f800000u) i++;
    return i;
}

/* Where a block type keeps its half-precision scale and its second one
 * (min or dmin; -1 for none). */
static int scale_offsets(quant_type t, int *d, int *m)
{
    *m = -1;
    switch (t) {
    case QT_Q4_0: *d = offsetof(block_q4_0, d); return 1;
    case QT_Q5_0: *d = offsetof(block_q5_0, d); return 1;
    case QT_Q8_0: *d = offsetof(block_q8_0, d); return 1;
    case QT_Q3_K: *d = offsetof(block_q3_K, d); return 1;
    case QT_Q6_K: *d = offsetof(block_q6_K, d); return 1;
    case QT_Q4_1: *d = offsetof(block_q4_1, d); *m = offsetof(block_q4_1, m); return 1;
    case QT_Q5_1: *d = offsetof(block_q5_1, d); *m = offsetof(block_q5_1, m); return 1;
    case QT_Q2_K: *d = offsetof(block_q2_K, d); *m = offsetof(block_q2_K, dmin); return 1;
    case QT_Q4_K: *d = offsetof(block_q4_K, d); *m = offsetof(block_q4_K, dmin); return 1;
    case QT_Q5_K: *d = offsetof(block_q5_K, d); *m = offsetof(block_q5_K, dmin); return 1;
    default: return 0;
    }
}

/* The half-precision scales of the block at blk are finite. */
static int block_ok(quant_type t, const uint8_t *blk)
{
    int od, om;
    quant_f16 d, m = 0;
    if (!scale_offsets(t, &od, &om))
        return 1;
    memcpy(&d, blk + od, 2);
    if (om >= 0)
        memcpy(&m, blk + om, 2);
    return (d & 0x7c00) != 0x7c00 && (m & 0x7c00) != 0x7c00;
}

size_t quant_find_nonfinite(quant_type t, const void *data, size_t n)
{
    size_t be = quant_block_elems(t), bb = quant_block_bytes(t), nb = be ? n / be : 0;
    switch (t) {
    case QT_F32: return first_f32(data, n);
    case QT_F16: return first_exp16(data, n, 0x7c00);
    case QT_BF16: return first_exp16(data, n, 0x7f80);
    default: break;
    }
    for (size_t b = 0; b < nb; b++)
        if (!block_ok(t, (const uint8_t *)data + b * bb))
            return b * be;
    return n;
}

size_t quant_row_bytes(quant_type t, size_t n)
{
    size_t be = quant_block_elems(t);
    if (be == 0 || n % be != 0)
        return 0;
    return n / be * quant_block_bytes(t);
}

/* ---- dequantization ---------------------------------------------------- */

static void deq_q8_0(const block_q8_0 *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        float d = quant_f16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++)
            y[i * QK8_0 + j] = d * b[i].qs[j];
    }
}

static void deq_q4_0(const block_q4_0 *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++) {
        float d = quant_f16_to_f32(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            y[i * QK4_0 + j] = d * ((b[i].qs[j] & 0xf) - 8);
            y[i * QK4_0 + j + 16] = d * ((b[i].qs[j] >> 4) - 8);
        }
    }
}

/* Q4_1, Q5_0, Q5_1: x = d * q + m (Q5_0: m = -16 d); qh NULL for Q4_1. */
static void deq_affine32(const uint8_t *blk, size_t bb, int qh_off, int qs_off, int has_m, float *y, size_t nb)
{
    int q[QK4_0];
    for (size_t i = 0; i < nb; i++, blk += bb, y += QK4_0) {
        quant_f16 d16, m16 = 0;
        memcpy(&d16, blk, 2);
        if (has_m)
            memcpy(&m16, blk + 2, 2);
        float d = quant_f16_to_f32(d16), m = has_m ? quant_f16_to_f32(m16) : -16.0f * d;
        quant_unpack32(blk + qs_off, qh_off ? blk + qh_off : NULL, q);
        for (int j = 0; j < QK4_0; j++) y[j] = has_m ? d * (float)q[j] + m : d * (float)(q[j] - 16);
    }
}

/* Q2_K: a half of 128 takes 32 bytes of qs; its quarter j is bits 2j..2j+1. */
static void deq_q2_K(const block_q2_K *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, b++) {
        float d = quant_f16_to_f32(b->d), dmin = quant_f16_to_f32(b->dmin);
        for (int e = 0; e < QK_K; e++) {
            int sc = b->scales[e / 16];
            *y++ = d * (float)(sc & 0xf) * (float)quant_k2_bits(b->qs, e) - dmin * (float)(sc >> 4);
        }
    }
}

static void deq_q3_K(const block_q3_K *b, float *y, size_t nb)
{
    int sc[16];
    for (size_t i = 0; i < nb; i++, b++) {
        float d = quant_f16_to_f32(b->d);
        quant_k3_scales(b->scales, sc);
        for (int e = 0; e < QK_K; e++) {
            /* the quant loses 4 unless bit e / 32 of hmask[e % 32] is set */
            int q = quant_k2_bits(b->qs, e) - ((b->hmask[e % 32] >> (e / 32)) & 1 ? 0 : 4);
            *y++ = d * (float)sc[e / 16] * (float)q;
        }
    }
}

/* Q4_K and Q5_K (qh: the fifth bits, NULL for Q4_K): sub-block sb (32
 * values) takes the low (even sb) or high (odd sb) nibbles of qs[32 *
 * (sb / 2) ...], plus 16 where bit sb of qh[l] is set. */
static void deq_k4(quant_f16 d16, quant_f16 dmin16, const uint8_t *scales, const uint8_t *qs, const uint8_t *qh,
                   float *y)
{
    float d = quant_f16_to_f32(d16), dmin = quant_f16_to_f32(dmin16);
    for (int sb = 0; sb < 8; sb++) {
        int sc, m;
        quant_k4_scale_min(sb, scales, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        const uint8_t *ql = qs + 32 * (sb / 2);
        for (int l = 0; l < 32; l++) {
            int q = (sb & 1 ? ql[l] >> 4 : ql[l] & 0xf) | (qh ? ((qh[l] >> sb) & 1) << 4 : 0);
            *y++ = d1 * (float)q - m1;
        }
    }
}

static void deq_q6_K(const block_q6_K *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++, b++) {
        float d = quant_f16_to_f32(b->d);
        for (int e = 0; e < QK_K; e++) *y++ = d * b->scales[e / 16] * (quant_k6_quant(b->ql, b->qh, e) - 32);
    }
}

static void deq_q8_K(const block_q8_K *b, float *y, size_t nb)
{
    for (size_t i = 0; i < nb; i++)
        for (int j = 0; j < QK_K; j++)
            y[i * QK_K + j] = b[i].d * b[i].qs[j];
}

void quant_dequantize_row(quant_type t, const void *src, float *dst, size_t n)
{
    size_t nb = n / (quant_block_elems(t) ? quant_block_elems(t) : 1);
    switch (t) {
    case QT_F32: memcpy(dst, src, n * 4); break;
    case QT_F16:
        for (size_t i = 0; i < n; i++) dst[i] = quant_f16_to_f32(((const quant_f16 *)src)[i]);
        break;
    case QT_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = quant_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case QT_Q4_0: deq_q4_0(src, dst, nb); break;
    case QT_Q4_1: deq_affine32(src, sizeof(block_q4_1), 0, offsetof(block_q4_1, qs), 1, dst, nb); break;
    case QT_Q5_0:
        deq_affine32(src, sizeof(block_q5_0), offsetof(block_q5_0, qh), offsetof(block_q5_0, qs), 0, dst, nb);
        break;
    case QT_Q5_1:
        deq_affine32(src, sizeof(block_q5_1), offsetof(block_q5_1, qh), offsetof(block_q5_1, qs), 1, dst, nb);
        break;
    case QT_Q8_0: deq_q8_0(src, dst, nb); break;
    case QT_Q2_K: deq_q2_K(src, dst, nb); break;
    case QT_Q3_K: deq_q3_K(src, dst, nb); break;
    case QT_Q4_K:
        for (size_t i = 0; i < nb; i++) {
            const block_q4_K *b = (const block_q4_K *)src + i;
            deq_k4(b->d, b->dmin, b->scales, b->qs, NULL, dst + i * QK_K);
        }
        break;
    case QT_Q5_K:
        for (size_t i = 0; i < nb; i++) {
            const block_q5_K *b = (const block_q5_K *)src + i;
            deq_k4(b->d, b->dmin, b->scales, b->qs, b->qh, dst + i * QK_K);
        }
        break;
    case QT_Q6_K: deq_q6_K(src, dst, nb); break;
    case QT_Q8_K: deq_q8_K(src, dst, nb); break;
    default: LLM_ASSERT(!"dequantize: unsupported type");
    }
}

/* ---- quantization -------------------------------------------------------- */

static float absmax(const float *x, int n)
{
    float m = 0;
    for (int i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

static void q_q8_0(const float *x, block_q8_0 *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += QK8_0) {
        float d = absmax(x, QK8_0) / 127.f, id = d ? 1.f / d : 0.f;
        b[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) b[i].qs[j] = (int8_t)lrintf(x[j] * id);
    }
}

static void q_q4_0(const float *x, block_q4_0 *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += QK4_0) {
        float amax = 0, max = 0; /* max keeps its sign: it maps to -8 */
        for (int j = 0; j < QK4_0; j++)
            if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
        float d = max / -8.f, id = d ? 1.f / d : 0.f;
        b[i].d = quant_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            int q0 = (int)fminf(15.f, fmaxf(0.f, x[j] * id + 8.5f));
            int q1 = (int)fminf(15.f, fmaxf(0.f, x[j + 16] * id + 8.5f));
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Q4_1/Q5_1: x = d * q + m over [min, max] in `levels` steps; the quants
 * are rounded against the scales as they decode (f16). */
static void q_affine32(const float *x, quant_f16 *d16, quant_f16 *m16, int *q, int levels)
{
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) {
        lo = fminf(lo, x[j]);
        hi = fmaxf(hi, x[j]);
    }
    *d16 = quant_f32_to_f16((hi - lo) / (float)levels);
    *m16 = quant_f32_to_f16(lo);
    float d = quant_f16_to_f32(*d16), m = quant_f16_to_f32(*m16);
    for (int j = 0; j < 32; j++) q[j] = d ? clampi((int)lrintf((x[j] - m) / d), 0, levels) : 0;
}

static void q5_pack(const int *q, uint8_t *qs, uint8_t *qh8)
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 0xf) | (q[j + 16] & 0xf) << 4);
        qh |= (uint32_t)(q[j] >> 4) << j | (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++) qh8[k] = (uint8_t)(qh >> (8 * k));
}

static void q_q4_1(const float *x, block_q4_1 *b, size_t nb)
{
    int q[32];
    for (size_t i = 0; i < nb; i++, x += 32) {
        q_affine32(x, &b[i].d, &b[i].m, q, 15);
        for (int j = 0; j < 16; j++) b[i].qs[j] = (uint8_t)(q[j] | q[j + 16] << 4);
    }
}

static void q_q5_1(const float *x, block_q5_1 *b, size_t nb)
{
    int q[32];
    for (size_t i = 0; i < nb; i++, x += 32) {
        q_affine32(x, &b[i].d, &b[i].m, q, 31);
        q5_pack(q, b[i].qs, b[i].qh);
    }
}

/* Q5_0: the largest magnitude maps to -16 (as Q4_0's to -8). */
static void q_q5_0(const float *x, block_q5_0 *b, size_t nb)
{
    int q[32];
    for (size_t i = 0; i < nb; i++, x += 32) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; j++)
            if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
        b[i].d = quant_f32_to_f16(max / -16.f);
        float d = quant_f16_to_f32(b[i].d), id = d ? 1.f / d : 0.f;
        for (int j = 0; j < 32; j++) q[j] = clampi((int)lrintf(x[j] * id) + 16, 0, 31);
        q5_pack(q, b[i].qs, b[i].qh);
    }
}

/* The K-quants with mins (Q2_K, Q4_K, Q5_K): for each of n_sub runs of
 * len values, the step of `levels` levels over [min(lo, 0), hi] and the
 * min to subtract, and the largest of each over the block. */
static void k_ranges(const float *x, int n_sub, int len, int levels, float *scale, float *mins, float *maxs,
                     float *maxm)
{
    *maxs = *maxm = 0;
    for (int j = 0; j < n_sub; j++) {
        float lo = x[len * j], hi = x[len * j];
        for (int l = 1; l < len; l++) {
            lo = fminf(lo, x[len * j + l]);
            hi = fmaxf(hi, x[len * j + l]);
        }
        lo = fminf(lo, 0.f);
        scale[j] = (hi - lo) / (float)levels;
        mins[j] = -lo;
        *maxs = fmaxf(*maxs, scale[j]);
        *maxm = fmaxf(*maxm, mins[j]);
    }
}

/* Q2_K: per 16 values a 4-bit scale and min over d and dmin; 2-bit quants. */
static void q_q2_K_block(const float *x, block_q2_K *b)
{
    float scale[16], mins[16], maxs, maxm;
    k_ranges(x, 16, 16, 3, scale, mins, &maxs, &maxm);
    b->d = quant_f32_to_f16(maxs / 15.f);
    b->dmin = quant_f32_to_f16(maxm / 15.f);
    float d = quant_f16_to_f32(b->d), dmin = quant_f16_to_f32(b->dmin);
    memset(b->qs, 0, sizeof b->qs);
    for (int j = 0; j < 16; j++) {
        int ls = d ? clampi((int)lrintf(scale[j] / d), 0, 15) : 0, lm = dmin ? clampi((int)lrintf(mins[j] / dmin), 0, 15) : 0;
        b->scales[j] = (uint8_t)(ls | lm << 4);
        float de = d * ls, me = dmin * lm;
        for (int l = 0; l < 16; l++) {
            int e = 16 * j + l, q = de ? clampi((int)lrintf((x[e] + me) / de), 0, 3) : 0;
            b->qs[quant_k2_byte(e)] |= (uint8_t)(q << quant_k2_shift(e));
        }
    }
}

/* Q3_K: per 16 values a signed 6-bit scale over d; quants -4..3 stored as
 * 2 bits plus an hmask bit that is set for the upper four. */
static void q_q3_K_block(const float *x, block_q3_K *b)
{
    float scale[16], amax = 0;
    for (int j = 0; j < 16; j++) {
        scale[j] = absmax(x + 16 * j, 16) / 4.f;
        amax = fmaxf(amax, scale[j]);
    }
    b->d = quant_f32_to_f16(amax / 31.f);
    float d = quant_f16_to_f32(b->d);
    memset(b->scales, 0, sizeof b->scales);
    memset(b->hmask, 0, sizeof b->hmask);
    memset(b->qs, 0, sizeof b->qs);
    for (int j = 0; j < 16; j++) {
        int ls = d ? clampi((int)lrintf(scale[j] / d), -32, 31) : 0, u = ls + 32;
        b->scales[j % 8] |= (uint8_t)((u & 0xf) << (j < 8 ? 0 : 4));
        b->scales[8 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
        float de = d * ls;
        for (int l = 0; l < 16; l++) {
            int e = 16 * j + l, q = de ? clampi((int)lrintf(x[e] / de), -4, 3) + 4 : 4;
            if (q > 3)
                b->hmask[e % 32] |= (uint8_t)(1 << (e / 32));
            b->qs[quant_k2_byte(e)] |= (uint8_t)((q & 3) << quant_k2_shift(e));
        }
    }
}

/* Packs 8 6-bit scales and mins the way quant_k4_scale_min unpacks them. */
static void q4k_pack_scales(const int *ls, const int *lm, uint8_t *s)
{
    memset(s, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] |= (uint8_t)ls[j];
            s[j + 4] |= (uint8_t)lm[j];
        } else {
            s[j + 4] = (uint8_t)((ls[j] & 0xf) | ((lm[j] & 0xf) << 4));
            s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            s[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* Q4_K and Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins, quants
 * 0..levels (15 or 31) into L. */
static void q_k4_scales(const float *x, int levels, quant_f16 *d16, quant_f16 *dmin16, uint8_t *scales, uint8_t *L)
{
    float scale[8], mins[8], maxs, maxm;
    k_ranges(x, 8, 32, levels, scale, mins, &maxs, &maxm);
    float d = maxs / 63.f, dmin = maxm / 63.f;
    int ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        ls[j] = d ? clampi((int)lrintf(scale[j] / d), 0, 63) : 0;
        lm[j] = dmin ? clampi((int)lrintf(mins[j] / dmin), 0, 63) : 0;
    }
    *d16 = quant_f32_to_f16(d);
    *dmin16 = quant_f32_to_f16(dmin);
    q4k_pack_scales(ls, lm, scales);
    /* quantize against the scales as they will be decoded */
    float dd = quant_f16_to_f32(*d16), dm = quant_f16_to_f32(*dmin16);
    for (int j = 0; j < 8; j++) {
        float de = dd * ls[j], me = dm * lm[j];
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)(de ? clampi((int)lrintf((x[32 * j + l] + me) / de), 0, levels) : 0);
    }
}

static void q_q4_K_block(const float *x, block_q4_K *b)
{
    uint8_t L[QK_K];
    q_k4_scales(x, 15, &b->d, &b->dmin, b->scales, L);
    for (int j = 0; j < QK_K; j += 64)
        for (int l = 0; l < 32; l++)
            b->qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

static void q_q5_K_block(const float *x, block_q5_K *b)
{
    uint8_t L[QK_K];
    q_k4_scales(x, 31, &b->d, &b->dmin, b->scales, L);
    memset(b->qh, 0, sizeof b->qh);
    for (int sb = 0; sb < 8; sb++)
        for (int l = 0; l < 32; l++) {
            uint8_t q = L[32 * sb + l];
            if (sb & 1)
                b->qs[32 * (sb / 2) + l] |= (uint8_t)((q & 0xf) << 4);
            else
                b->qs[32 * (sb / 2) + l] = q & 0xf;
            b->qh[l] |= (uint8_t)((q >> 4) << sb);
        }
}

static void q_q6_K_block(const float *x, block_q6_K *b)
{
    float scale[16], maxs = 0;
    for (int j = 0; j < 16; j++) {
        scale[j] = absmax(x + 16 * j, 16) / 31.f;
        maxs = fmaxf(maxs, scale[j]);
    }
    float d = maxs / 127.f;
    b->d = quant_f32_to_f16(d);
    float dd = quant_f16_to_f32(b->d);
    uint8_t L[QK_K];
    for (int j = 0; j < 16; j++) {
        b->scales[j] = (int8_t)(dd ? clampi((int)lrintf(scale[j] / dd), -128, 127) : 0);
        float de = dd * b->scales[j];
        for (int l = 0; l < 16; l++)
            L[16 * j + l] = (uint8_t)(de ? clampi((int)lrintf(x[16 * j + l] / de), -32, 31) + 32 : 32);
    }
    uint8_t *ql = b->ql, *qh = b->qh;
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            const uint8_t *p = L + j + l;
            ql[l] = (uint8_t)((p[0] & 0xf) | ((p[64] & 0xf) << 4));
            ql[l + 32] = (uint8_t)((p[32] & 0xf) | ((p[96] & 0xf) << 4));
            qh[l] = (uint8_t)((p[0] >> 4) | ((p[32] >> 4) << 2) | ((p[64] >> 4) << 4) | ((p[96] >> 4) << 6));
        }
    }
}

static void q_q8_K(const float *x, block_q8_K *b, size_t nb)
{
    for (size_t i = 0; i < nb; i++, x += QK_K) {
        float d = absmax(x, QK_K) / 127.f, id = d ? 1.f / d : 0.f;
        b[i].d = d;
        for (int j = 0; j < QK_K; j++) b[i].qs[j] = (int8_t)lrintf(x[j] * id);
        for (int j = 0; j < QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++) s += b[i].qs[16 * j + l];
            b[i].bsums[j] = (int16_t)s;
        }
    }
}

void quant_quantize_row(quant_type t, const float *src, void *dst, size_t n)
{
    size_t nb = n / (quant_block_elems(t) ? quant_block_elems(t) : 1);
    switch (t) {
    case QT_F32: memcpy(dst, src, n * 4); break;
    case QT_F16:
        for (size_t i = 0; i < n; i++) ((quant_f16 *)dst)[i] = quant_f32_to_f16(src[i]);
        break;
    case QT_BF16:
        for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = quant_f32_to_bf16(src[i]);
        break;
    case QT_Q4_0: q_q4_0(src, dst, nb); break;
    case QT_Q4_1: q_q4_1(src, dst, nb); break;
    case QT_Q5_0: q_q5_0(src, dst, nb); break;
    case QT_Q5_1: q_q5_1(src, dst, nb); break;
    case QT_Q8_0: q_q8_0(src, dst, nb); break;
    case QT_Q2_K:
        for (size_t i = 0; i < nb; i++) q_q2_K_block(src + i * QK_K, (block_q2_K *)dst + i);
        break;
    case QT_Q3_K:
        for (size_t i = 0; i < nb; i++) q_q3_K_block(src + i * QK_K, (block_q3_K *)dst + i);
        break;
    case QT_Q4_K:
        for (size_t i = 0; i < nb; i++) q_q4_K_block(src + i * QK_K, (block_q4_K *)dst + i);
        break;
    case QT_Q5_K:
        for (size_t i = 0; i < nb; i++) q_q5_K_block(src + i * QK_K, (block_q5_K *)dst + i);
        break;
    case QT_Q6_K:
        for (size_t i = 0; i < nb; i++) q_q6_K_block(src + i * QK_K, (block_q6_K *)dst + i);
        break;
    case QT_Q8_K: q_q8_K(src, dst, nb); break;
    default: LLM_ASSERT(!"quantize: unsupported type");
    }
}
