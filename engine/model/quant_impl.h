/* quant_impl.h - the packed fields of the block formats, shared by the
 * reference decoders (quant.c) and the CPU kernels (engine/backend/cpu/): the
 * K-quants' 6-bit scales, Q3_K's signed scales, the Q5 types' fifth bits
 * and the 2-bit fields of Q2_K/Q3_K. Pure static inlines; byte order
 * independent (fields are read byte by byte, as the files store them
 * little-endian). Internal to the engine. */
#ifndef LLM_QUANT_IMPL_H
#define LLM_QUANT_IMPL_H

#include <stdint.h>

/* The j-th (0..7) 6-bit (scale, min) pair of a Q4_K/Q5_K block's 12
 * scale bytes. */
static inline void quant_k4_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* The 16 scales (-32..31) of a Q3_K block into out[16]: a low nibble from
 * scales[j % 8] (low half for j < 8), two high bits at bit 2 * (j / 4) of
 * scales[8 + j % 4]. */
static inline void quant_k3_scales(const uint8_t *s, int *out)
{
    for (int j = 0; j < 16; j++) {
        int lo = j < 8 ? s[j] & 0xf : s[j - 8] >> 4, hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = (lo | hi << 4) - 32;
    }
}

/* Element e (0..255) of a Q2_K/Q3_K block's 2-bit quants: byte
 * 32 * (e / 128) + e % 32 of qs, bits 2k..2k+1 with k = (e % 128) / 32. */
static inline int quant_k2_byte(int e) { return 32 * (e / 128) + e % 32; }
static inline int quant_k2_shift(int e) { return 2 * ((e % 128) / 32); }
static inline int quant_k2_bits(const uint8_t *qs, int e) { return (qs[quant_k2_byte(e)] >> quant_k2_shift(e)) & 3; }

/* The 6-bit quant (0..63; the weight is d * scale * (q - 32)) of element
 * e (0..255) of a Q6_K block: in each 128-element half h, element
 * 32 k + l (k 0..3) takes nibble k / 2 of ql[64 h + 32 (k % 2) + l] and
 * bits 2k..2k+1 of qh[32 h + l] as its top two bits. */
static inline int quant_k6_quant(const uint8_t *ql, const uint8_t *qh, int e)
{
    int h = e / 128, k = e % 128 / 32, l = e % 32;
    int lo = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0xf;
    return lo | ((qh[32 * h + l] >> (2 * k)) & 3) << 4;
}

/* The 32 quants of a Q4_0/Q4_1 block (nibbles; low ones are elements
 * 0..15) into q, plus 16 times bit j of qh (4 bytes, little-endian) when
 * qh is not NULL (Q5_0/Q5_1). */
static inline void quant_unpack32(const uint8_t *qs, const uint8_t *qh, int *q)
{
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0xf;
        q[j + 16] = qs[j] >> 4;
    }
    for (int j = 0; qh && j < 32; j++) q[j] |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
}

#endif
