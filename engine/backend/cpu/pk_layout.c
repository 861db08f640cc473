/* pk_layout.c - packing weights into the tiles' layout, and the tiles'
 * activation format (pk_layout.h). Compiled with the AVX2 flags: only the
 * sets that need AVX2 call it. */
#include "pk_layout.h"

#include <string.h>

/* 16 bytes of nibble pairs (byte c: column c low, c + 16 high, as Q4_0's
 * and Q4_1's qs hold them; NULL: zeros) into row r of the block's 4
 * vectors at q (byte c of vector 4 j + k: row r's 4 bytes at 4 r). Value
 * by value through int arrays, packing was most of a model's load time. */
static void pk_layout_pairs(const uint8_t *pairs, int r, uint8_t *q)
{
    static const uint8_t zeros[16];
    for (int c = 0; c < 16; c += 4) memcpy(q + 64 * (c / 4) + 4 * r, (pairs ? pairs : zeros) + c, 4);
}

static void pk_layout_q8(const block_q8_0 *blk, int r, uint8_t *q)
{
    ((quant_f16 *)(q - PK_ROWS * sizeof(quant_f16)))[r] = blk ? blk->d : 0;
    for (int j = 0; j < QK8_0 / 4; j++) { /* 4 quants, each + 128 (the top bit flipped) */
        uint32_t w = 0;
        if (blk)
            memcpy(&w, blk->qs + 4 * j, 4);
        w ^= 0x80808080u;
        memcpy(q + 64 * j + 4 * r, &w, 4);
    }
}

static void pk_layout_q4(const block_q4_0 *blk, int r, uint8_t *q)
{
    ((quant_f16 *)(q - PK_ROWS * sizeof(quant_f16)))[r] = blk ? blk->d : 0;
    pk_layout_pairs(blk ? blk->qs : NULL, r, q);
}

/* Row r's fifth bits of a block (bit i: column i) into the block's 8
 * masks at `masks`, after its nibbles (Q3_K: its third bits, after its
 * 2-bit planes): mask j's 4 bits of row r are half of byte r / 2. */
static void pk_layout_bits_at(uint32_t bits, int r, uint8_t *masks)
{
    for (int j = 0; j < QK8_0 / 4; j++) {
        unsigned nib = (bits >> (4 * j)) & 0xf;
        uint8_t *byte = masks + 8 * j + r / 2;
        /* pk_layout_pack writes rows in order: an even row starts the byte, the odd one after it completes it */
        *byte = (uint8_t)(r % 2 ? (*byte & 0x0fu) | nib << 4 : nib);
    }
}

/* Bit j of each of the 32 bytes at src, as bit i for byte i: Q4_K's and
 * Q5_K's fifth bits of sub-block j, Q3_K's third bits of block j. */
static uint32_t pk_layout_bit_plane(const uint8_t *src, int j)
{
    uint32_t bits = 0;
    for (int i = 0; i < 32; i++) bits |= (uint32_t)((src[i] >> j) & 1) << i;
    return bits;
}

/* Q5_0's and Q5_1's qh: the 32 fifth bits, little-endian. */
static uint32_t pk_layout_qh32(const uint8_t *qh)
{
    return (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
}

/* Q4_1 (qh NULL) and Q5_1: row r's d and m, then the quants */
static void pk_layout_q51(int five, const void *blk, int r, uint8_t *q)
{
    quant_f16 *dm = (quant_f16 *)(q - 2 * PK_ROWS * sizeof(quant_f16));
    const block_q4_1 *b4 = blk;
    const block_q5_1 *b5 = blk;
    dm[r] = !blk ? 0 : five ? b5->d : b4->d;
    dm[PK_ROWS + r] = !blk ? 0 : five ? b5->m : b4->m;
    pk_layout_pairs(!blk ? NULL : five ? b5->qs : b4->qs, r, q);
    if (five)
        pk_layout_bits_at(blk ? pk_layout_qh32(b5->qh) : 0, r, q + PK_ROWS * 16);
}

static void pk_layout_q5(const block_q5_0 *blk, int r, uint8_t *q)
{
    ((quant_f16 *)(q - PK_ROWS * sizeof(quant_f16)))[r] = blk ? blk->d : 0;
    pk_layout_pairs(blk ? blk->qs : NULL, r, q);
    pk_layout_bits_at(blk ? pk_layout_qh32(blk->qh) : 0, r, q + PK_ROWS * 16);
}

/* The 16 pair bytes of 32 nibble quants held as bits sh..sh + 3 of the
 * 32 bytes at src (column c in byte c; NULL: zeros; a loop gcc makes 16
 * bytes at a time) into row r of the block's 4 vectors at q (Q4_K's and
 * Q6_K's low nibbles). One value at a time through int arrays, this was
 * 43% of loading tinyllama-1.1b Q4_K. */
static void pk_layout_nibbles_at(const uint8_t *src, int sh, int r, uint8_t *q)
{
    uint8_t pairs[16] = {0};
    for (int c = 0; src && c < 16; c++)
        pairs[c] = (uint8_t)(((src[c] >> sh) & 0xf) | ((src[16 + c] >> sh) & 0xf) << 4);
    pk_layout_pairs(pairs, r, q);
}

/* Sub-block j (0..7) of a Q4_K (five 0) or Q5_K (five 1) super-block
 * (its d, dmin, 12 scale bytes, qs and, for Q5_K, qh; scales NULL: a row
 * of zeros): the header's share of row r (h: the super-block's header),
 * and the quants. */
static void pk_layout_q45k(int five, quant_f16 d, quant_f16 dmin, const uint8_t *scales, const uint8_t *qs,
                          const uint8_t *qh, int j, int r, uint8_t *h, uint8_t *q)
{
    int sc = 0, m = 0;
    if (scales)
        quant_k4_scale_min(j, scales, &sc, &m);
    ((quant_f16 *)h)[r] = scales ? d : 0;
    ((quant_f16 *)h)[PK_ROWS + r] = scales ? dmin : 0;
    h[pk_layout_k4_sc(j) + (size_t)r] = (uint8_t)sc;
    h[pk_layout_k4_min(j) + (size_t)r] = (uint8_t)m;
    pk_layout_nibbles_at(qs ? qs + 32 * (j / 2) : NULL, 4 * (j % 2), r, q);
    if (!five)
        return;
    pk_layout_bits_at(scales ? pk_layout_bit_plane(qh, j) : 0, r, q + PK_ROWS * 16);
}

/* Sub-blocks 2j, 2j + 1 of a Q6_K super-block (row r's scales in the
 * header h) and block j's quants: nibbles as Q4_K's, then the top two
 * bits of each column 4i + k at bits 2 (i % 4) of byte 4r + k of plane
 * i / 4. */
static void pk_layout_q6k(const block_q6_K *blk, int j, int r, uint8_t *h, uint8_t *q)
{
    /* quant_k6_quant for elements 32j..32j+31, its indexing hoisted out of the loop */
    const uint8_t *ql = blk ? blk->ql + 64 * (j / 4) + 32 * (j % 2) : NULL, *qh = blk ? blk->qh + 32 * (j / 4) : NULL;
    int hsh = 2 * (j % 4);
    ((quant_f16 *)h)[r] = blk ? blk->d : 0;
    for (int s = 0; s < 2; s++) h[pk_layout_q6k_sc(2 * j + s) + (size_t)r] = blk ? (uint8_t)blk->scales[2 * j + s] : 0;
    pk_layout_nibbles_at(ql, 4 * ((j % 4) / 2), r, q);
    uint8_t *top = q + PK_ROWS * 16;
    for (int p = 0; p < 2; p++) /* byte 4r + k of plane p: steps 4p..4p+3 of column k, 2 bits each */
        for (int k = 0; k < 4; k++) {
            unsigned byte = 0;
            for (int s = 0; qh && s < 4; s++) byte |= (unsigned)((qh[4 * (4 * p + s) + k] >> hsh) & 3) << (2 * s);
            top[64 * p + 4 * r + k] = (uint8_t)byte;
        }
}

/* Block j (0..7, 32 columns) of a Q2_K or Q3_K super-block: row r's
 * 2-bit quants into the block's 2 planes at q (bits 2 (s % 4) of byte
 * 4r + k of plane s / 4 for step s, column 4s + k), and for Q3_K (third)
 * its third bits from hmask (set: the quant keeps its value; clear: it
 * loses 4) after them. qs NULL: zeros. */
static void pk_layout_k2(const uint8_t *qs, const uint8_t *hmask, int third, int j, int r, uint8_t *q)
{
    for (int p = 0; p < 2; p++)
        for (int k = 0; k < 4; k++) {
            unsigned byte = 0;
            for (int s = 0; qs && s < 4; s++) byte |= (unsigned)quant_k2_bits(qs, 32 * j + 4 * (4 * p + s) + k) << (2 * s);
            q[64 * p + 4 * r + k] = (uint8_t)byte;
        }
    if (third) /* element 32 j + i's third bit: bit j of hmask[i] */
        pk_layout_bits_at(hmask ? pk_layout_bit_plane(hmask, j) : 0, r, q + PK_ROWS * 8);
}

/* Sub-blocks 2j, 2j + 1 of a Q3_K super-block: row r's d and signed
 * scales into the header h (Q6_K's layout), block j's quants into q. */
static void pk_layout_q3k(const block_q3_K *blk, int j, int r, uint8_t *h, uint8_t *q)
{
    int sc[16] = {0};
    if (blk)
        quant_k3_scales(blk->scales, sc);
    ((quant_f16 *)h)[r] = blk ? blk->d : 0;
    for (int s = 0; s < 2; s++) h[pk_layout_q6k_sc(2 * j + s) + (size_t)r] = (uint8_t)(int8_t)sc[2 * j + s];
    pk_layout_k2(blk ? blk->qs : NULL, blk ? blk->hmask : NULL, 1, j, r, q);
}

/* Sub-blocks 2j, 2j + 1 of a Q2_K super-block: row r's d, dmin and scale
 * bytes into the header h, block j's quants into q. */
static void pk_layout_q2k(const block_q2_K *blk, int j, int r, uint8_t *h, uint8_t *q)
{
    ((quant_f16 *)h)[r] = blk ? blk->d : 0;
    ((quant_f16 *)h)[PK_ROWS + r] = blk ? blk->dmin : 0;
    for (int s = 0; s < 2; s++) h[pk_layout_q2k_sc(2 * j + s) + (size_t)r] = blk ? blk->scales[2 * j + s] : 0;
    pk_layout_k2(blk ? blk->qs : NULL, NULL, 0, j, r, q);
}

/* Row r (row `row` of the weight; past `rows`: zeros) of block b of the
 * group at g. */
static void pk_layout_row(int kind, const void *w, size_t row_bytes, int64_t row, int64_t rows, int b, int r,
                          uint8_t *g)
{
    const char *src = row < rows ? (const char *)w + (size_t)row * row_bytes : NULL;
    uint8_t *q = (uint8_t *)pk_layout_qs(kind, g, b);
    uint8_t *h = pk_layout_kquant(kind) ? (uint8_t *)pk_layout_super_at(kind, g, b) : NULL;
    switch (kind) {
    case PK_Q8: pk_layout_q8(src ? (const block_q8_0 *)src + b : NULL, r, q); break;
    case PK_Q4: pk_layout_q4(src ? (const block_q4_0 *)src + b : NULL, r, q); break;
    case PK_Q5: pk_layout_q5(src ? (const block_q5_0 *)src + b : NULL, r, q); break;
    case PK_Q41: pk_layout_q51(0, src ? (const block_q4_1 *)src + b : NULL, r, q); break;
    case PK_Q51: pk_layout_q51(1, src ? (const block_q5_1 *)src + b : NULL, r, q); break;
    case PK_Q6K: pk_layout_q6k(src ? (const block_q6_K *)src + b / 8 : NULL, b % 8, r, h, q); break;
    case PK_Q3K: pk_layout_q3k(src ? (const block_q3_K *)src + b / 8 : NULL, b % 8, r, h, q); break;
    case PK_Q2K: pk_layout_q2k(src ? (const block_q2_K *)src + b / 8 : NULL, b % 8, r, h, q); break;
    case PK_Q4K: {
        const block_q4_K *k = src ? (const block_q4_K *)src + b / 8 : NULL;
        pk_layout_q45k(0, k ? k->d : 0, k ? k->dmin : 0, k ? k->scales : NULL, k ? k->qs : NULL, NULL, b % 8, r, h, q);
        break;
    }
    case PK_Q5K: {
        const block_q5_K *k = src ? (const block_q5_K *)src + b / 8 : NULL;
        pk_layout_q45k(1, k ? k->d : 0, k ? k->dmin : 0, k ? k->scales : NULL, k ? k->qs : NULL, k ? k->qh : NULL,
                       b % 8, r, h, q);
        break;
    }
    default: LLM_ASSERT(!"pk_layout: unknown kind");
    }
}

void pk_layout_pack(int kind, const void *w, size_t row_bytes, int64_t rows, int64_t cols, int64_t g0, int64_t g1,
                    void *dst)
{
    int nb = (int)(cols / QK8_0);
    size_t gb = pk_layout_group_bytes(kind, cols);
    LLM_ASSERT(cols % (pk_layout_kquant(kind) ? QK_K : QK8_0) == 0);
    for (int64_t g = g0; g < g1; g++) {
        uint8_t *o = (uint8_t *)dst + (size_t)g * gb;
        for (int b = 0; b < nb; b++)
            for (int r = 0; r < PK_ROWS; r++) pk_layout_row(kind, w, row_bytes, g * PK_ROWS + r, rows, b, r, o);
    }
}

/* ---- activations: signed bytes, a float scale and the negated sum per block ---- */

#if defined(__x86_64__) && defined(__AVX2__)
#include <immintrin.h>

static size_t pk_layout_act_row(int n) { return (size_t)n + (size_t)n / QK8_0 * (sizeof(float) + 2 * sizeof(int32_t)); }

static int32_t pk_layout_hsum(__m256i v)
{
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    return _mm_cvtsi128_si32(s4);
}

static void pk_layout_act_quant(const float *x, void *dst, int n)
{
    int8_t *q = dst;
    float *d = (float *)(q + n);
    int32_t *nsa = (int32_t *)(d + n / QK8_0), *nsb = nsa + n / QK8_0;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < n / QK8_0; b++, x += QK8_0) {
        __m256 v[4];
        for (int i = 0; i < 4; i++) v[i] = _mm256_loadu_ps(x + 8 * i);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        float s = _mm_cvtss_f32(m4) / 127.f;
        __m256 id = _mm256_set1_ps(s ? 1.f / s : 0.f);
        /* round to nearest even, as the other sets' formats */
        __m256i i[4];
        /* clamped: a non-finite x (or a scale whose inverse overflows) would give INT_MIN, a -128 byte
         * the tiles' sign trick cannot take and sums that wrap */
        for (int k = 0; k < 4; k++)
            i[k] = _mm256_max_epi32(_mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[k], id)), _mm256_set1_epi32(127)),
                                    _mm256_set1_epi32(-127));
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256((__m256i *)(q + QK8_0 * b),
                            _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        d[b] = s;
        nsa[b] = -pk_layout_hsum(_mm256_add_epi32(i[0], i[1]));
        nsb[b] = -pk_layout_hsum(_mm256_add_epi32(i[2], i[3]));
    }
}

static void pk_layout_act_deq(const void *a, float *dst, int n)
{
    const int8_t *q = a;
    const float *d = (const float *)(q + n);
    for (int i = 0; i < n; i++) dst[i] = d[i / QK8_0] * (float)q[i];
}

static void pk_layout_act_quant8(const float *x, size_t x_stride, int rows, void *dst, int n)
{
    cpu_tile8(pk_layout_act_quant, 3, x, x_stride, rows, dst, n);
}

const cpu_act pk_layout_act = {4, pk_layout_act_row, pk_layout_act_quant, pk_layout_act_deq, pk_layout_act_quant8};
#endif
