/* dequant.cuh - one weight of a row in its storage type, read exactly as
 * the CPU dequantizer (engine/quant.c) reads it, for the kernels that
 * gather or convert weights (get_rows, dequant_f16). Types are
 * quant_type values: F32 0, F16 1, Q4_0 2, Q8_0 8, Q4_K 12, Q6_K 14,
 * BF16 30. */
#ifndef LK_DEQUANT_CUH
#define LK_DEQUANT_CUH

#include "common.cuh"

__device__ static inline float lk_f16_at(const uint8_t *p)
{
    return lk_f16((uint16_t)(p[0] | (p[1] << 8)));
}

/* Element j (0..255) of a Q4_K super-block (d, dmin, scales[12], qs[128]). */
__device__ static inline float lk_q4_K_at(const uint8_t *b, int j)
{
    int g = j / 64, l = j % 64, s = 2 * g + (l >= 32);
    const uint8_t *q = b + 16 + g * 32, *sc = b + 4;
    int scale, min;
    if (s < 4) {
        scale = sc[s] & 63;
        min = sc[s + 4] & 63;
    } else {
        scale = (sc[s + 4] & 0xf) | ((sc[s - 4] >> 6) << 4);
        min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
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

/* Column c of a row; the type must be one lk_weight_type accepts. */
__device__ static inline float lk_weight_at(int type, const uint8_t *row, int c)
{
    switch (type) {
    case 0: return ((const float *)row)[c];
    case 1: return lk_f16(((const uint16_t *)row)[c]);
    case 30: return lk_bf16(((const uint16_t *)row)[c]);
    case 2: { /* Q4_0: d, 16 bytes; element i < 16 the low nibble of byte i, else the high nibble of byte i - 16 */
        const uint8_t *blk = row + (size_t)(c / 32) * 18;
        int i = c % 32, q = i < 16 ? blk[2 + i] & 0xf : blk[2 + i - 16] >> 4;
        return lk_f16_at(blk) * (float)(q - 8);
    }
    case 8: return lk_f16_at(row + (size_t)(c / 32) * 34) * (float)(int8_t)row[(size_t)(c / 32) * 34 + 2 + c % 32];
    case 12: return lk_q4_K_at(row + (size_t)(c / 256) * 144, c % 256);
    default: return lk_q6_K_at(row + (size_t)(c / 256) * 210, c % 256);
    }
}

/* 1 when lk_weight_at reads rows of `cols` values of this type. */
static inline int lk_weight_type(int type, int cols)
{
    switch (type) {
    case 0: case 1: case 30: return 1;
    case 2: case 8: return cols % 32 == 0;
    case 12: case 14: return cols % 256 == 0;
    default: return 0;
    }
}

#endif
