/* dequant.cuh - one weight of a row in its storage type, read exactly as
 * the CPU dequantizer (engine/quant.c) reads it, for the kernels that
 * gather, convert or multiply weights (get_rows, dequant_f32, gemv). A
 * header of device helpers shared by several kernel files, like
 * common.cuh, not one op's launcher. Types are the LK_T_* values. */
#ifndef LK_DEQUANT_CUH
#define LK_DEQUANT_CUH

#include "common.cuh"
#include "llm_kernels.h"

__device__ static inline float lk_f16_at(const uint8_t *p)
{
    return lk_f16((uint16_t)(p[0] | (p[1] << 8)));
}

/* Q4_K's 6-bit (scale, min) pair j of 8 from the 12 scale bytes. */
__device__ static inline void lk_q4_K_scale_min(int j, const uint8_t *sc, int *scale, int *min)
{
    if (j < 4) {
        *scale = sc[j] & 63;
        *min = sc[j + 4] & 63;
    } else {
        *scale = (sc[j + 4] & 0xf) | ((sc[j - 4] >> 6) << 4);
        *min = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

/* Element j (0..255) of a Q4_K super-block (d, dmin, scales[12], qs[128]). */
__device__ static inline float lk_q4_K_at(const uint8_t *b, int j)
{
    int g = j / 64, l = j % 64, scale, min;
    lk_q4_K_scale_min(2 * g + (l >= 32), b + 4, &scale, &min);
    const uint8_t *q = b + 16 + g * 32;
    int nib = l < 32 ? q[l] & 0xf : q[l - 32] >> 4;
    /* (d * scale) * nib and dmin * min are exact in float (21 and 17
     * significant bits), so nvcc's contraction into an FMA rounds as
     * quant.c does */
    return lk_f16_at(b) * scale * nib - lk_f16_at(b + 2) * min;
}

/* Element j of a Q6_K super-block (ql[128], qh[64], scales[16], d). */
__device__ static inline float lk_q6_K_at(const uint8_t *b, int j)
{
    int h = j / 128, r = j % 128, k = r / 32, l = r % 32;
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
    int lo = (k & 1) ? ql[l + 32] : ql[l];
    lo = k < 2 ? lo & 0xf : lo >> 4;
    int q = lo | (((qh[l] >> (2 * k)) & 3) << 4);
    return lk_f16_at(b + 208) * sc[l / 16 + 2 * k] * (q - 32);
}

/* Element i (0..31) of a Q4_1/Q5_0/Q5_1 block: the nibble (low ones are
 * elements 0..15) plus 16 times bit i of qh (little-endian, 5-bit types). */
__device__ static inline int lk_q32_at(const uint8_t *qs, const uint8_t *qh, int i)
{
    int q = i < 16 ? qs[i] & 0xf : qs[i - 16] >> 4;
    return qh ? q | ((qh[i / 8] >> (i % 8)) & 1) << 4 : q;
}

/* Element e (0..255) of Q2_K/Q3_K's 2-bit quants (qs[64]). */
__device__ static inline int lk_k2_at(const uint8_t *qs, int e)
{
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

/* Element e of a Q2_K block (scales[16], qs[64], d, dmin): every product
 * is exact in float, so a contraction rounds as quant.c does. */
__device__ static inline float lk_q2_K_at(const uint8_t *b, int e)
{
    int sc = b[e / 16];
    return lk_f16_at(b + 80) * (float)(sc & 0xf) * (float)lk_k2_at(b + 16, e) - lk_f16_at(b + 82) * (float)(sc >> 4);
}

/* Element e of a Q3_K block (hmask[32], qs[64], scales[12], d): scale
 * e / 16 (6 bits, minus 32); the quant loses 4 unless bit e / 32 of
 * hmask[e % 32] is set. */
__device__ static inline float lk_q3_K_at(const uint8_t *b, int e)
{
    const uint8_t *s = b + 96;
    int j = e / 16, lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    int q = lk_k2_at(b + 32, e) - ((b[e % 32] >> (e / 32)) & 1 ? 0 : 4);
    return lk_f16_at(b + 108) * (float)((lo | hi << 4) - 32) * (float)q;
}

/* Element e of a Q5_K block (d, dmin, scales[12], qh[32], qs[128]). */
__device__ static inline float lk_q5_K_at(const uint8_t *b, int e)
{
    int sb = e / 32, l = e % 32, scale, min;
    lk_q4_K_scale_min(sb, b + 4, &scale, &min);
    const uint8_t *ql = b + 48 + 32 * (sb / 2);
    int q = (sb & 1 ? ql[l] >> 4 : ql[l] & 0xf) | ((b[16 + l] >> sb) & 1) << 4;
    return lk_f16_at(b) * (float)scale * (float)q - lk_f16_at(b + 2) * (float)min;
}

/* Column c of a row; the type must be one lk_weight_type accepts. */
__device__ static inline float lk_weight_at(int type, const uint8_t *row, int c)
{
    switch (type) {
    case LK_T_F32: return ((const float *)row)[c];
    case LK_T_F16: return lk_f16(((const uint16_t *)row)[c]);
    case LK_T_BF16: return lk_bf16(((const uint16_t *)row)[c]);
    case LK_T_Q4_0: { /* d, 16 bytes; element i < 16 the low nibble of byte i, else the high nibble of byte i - 16 */
        const uint8_t *blk = row + (size_t)(c / 32) * 18;
        int i = c % 32, q = i < 16 ? blk[2 + i] & 0xf : blk[2 + i - 16] >> 4;
        return lk_f16_at(blk) * (float)(q - 8);
    }
    case LK_T_Q8_0: return lk_f16_at(row + (size_t)(c / 32) * 34) * (float)(int8_t)row[(size_t)(c / 32) * 34 + 2 + c % 32];
    case LK_T_Q4_1: { /* d, m, qs[16] */
        const uint8_t *blk = row + (size_t)(c / 32) * 20;
        return lk_f16_at(blk) * (float)lk_q32_at(blk + 4, NULL, c % 32) + lk_f16_at(blk + 2);
    }
    case LK_T_Q5_0: { /* d, qh[4], qs[16] */
        const uint8_t *blk = row + (size_t)(c / 32) * 22;
        return lk_f16_at(blk) * (float)(lk_q32_at(blk + 6, blk + 2, c % 32) - 16);
    }
    case LK_T_Q5_1: { /* d, m, qh[4], qs[16] */
        const uint8_t *blk = row + (size_t)(c / 32) * 24;
        return lk_f16_at(blk) * (float)lk_q32_at(blk + 8, blk + 4, c % 32) + lk_f16_at(blk + 2);
    }
    case LK_T_Q2_K: return lk_q2_K_at(row + (size_t)(c / 256) * 84, c % 256);
    case LK_T_Q3_K: return lk_q3_K_at(row + (size_t)(c / 256) * 110, c % 256);
    case LK_T_Q4_K: return lk_q4_K_at(row + (size_t)(c / 256) * 144, c % 256);
    case LK_T_Q5_K: return lk_q5_K_at(row + (size_t)(c / 256) * 176, c % 256);
    default: return lk_q6_K_at(row + (size_t)(c / 256) * 210, c % 256);
    }
}

/* 1 when lk_weight_at reads rows of `cols` values of this type (host). */
static inline int lk_weight_type(int type, int cols)
{
    switch (type) {
    case LK_T_F32: case LK_T_F16: case LK_T_BF16: return 1;
    case LK_T_Q4_0: case LK_T_Q4_1: case LK_T_Q5_0: case LK_T_Q5_1: case LK_T_Q8_0: return cols % 32 == 0;
    case LK_T_Q2_K: case LK_T_Q3_K: case LK_T_Q4_K: case LK_T_Q5_K: case LK_T_Q6_K: return cols % 256 == 0;
    default: return 0;
    }
}

#endif
