/* quant.h - tensor element types (ggml's numbering, as stored in GGUF), their
 * block layouts, reference (scalar) dequantization and quantization, and
 * half-precision conversions.
 *
 * The block structs match ggml's byte layout exactly, so files written by
 * llama.cpp and by llm-mkmodel are interchangeable. Everything here is pure
 * and thread-safe; quant_init() fills a lookup table once and is idempotent.
 * The fast SIMD dot products live in the CPU backend (engine/backend/cpu/). */
#ifndef LLM_QUANT_H
#define LLM_QUANT_H

#include <stddef.h>
#include <stdint.h>

typedef enum quant_type {
    QT_F32 = 0,
    QT_F16 = 1,
    QT_Q4_0 = 2,
    QT_Q4_1 = 3,
    QT_Q5_0 = 6,
    QT_Q5_1 = 7,
    QT_Q8_0 = 8,
    QT_Q2_K = 10,
    QT_Q3_K = 11,
    QT_Q4_K = 12,
    QT_Q5_K = 13,
    QT_Q6_K = 14,
    QT_Q8_K = 15, /* activations only: never stored in files we read */
    QT_BF16 = 30,
    QT_COUNT = 40 /* bound for table lookups; not a type */
} quant_type;

#define QK8_0 32
#define QK4_0 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef uint16_t quant_f16;

typedef struct { quant_f16 d; int8_t qs[QK8_0]; } block_q8_0;
typedef struct { quant_f16 d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
/* x = d * q + m, q in 0..15 (low nibbles: elements 0..15, high: 16..31) */
typedef struct { quant_f16 d, m; uint8_t qs[QK4_0 / 2]; } block_q4_1;
/* q = nibble | bit j of qh (little-endian u32) << 4; Q5_0: x = d * (q - 16),
 * Q5_1: x = d * q + m */
typedef struct { quant_f16 d; uint8_t qh[4]; uint8_t qs[QK4_0 / 2]; } block_q5_0;
typedef struct { quant_f16 d, m; uint8_t qh[4]; uint8_t qs[QK4_0 / 2]; } block_q5_1;
/* 16 sub-blocks of 16: scales low nibble (scale), high nibble (min);
 * x = d * scale * q - dmin * min, q 2 bits */
typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    quant_f16 d, dmin;
} block_q2_K;
/* 16 sub-blocks of 16 with 6-bit signed scales (offset 32); q = 2 low
 * bits, minus 4 where the hmask bit is clear: x = d * (scale - 32) * q */
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[K_SCALE_SIZE];
    quant_f16 d;
} block_q3_K;
typedef struct {
    quant_f16 d;    /* super-block scale for the 6-bit scales */
    quant_f16 dmin; /* super-block scale for the 6-bit mins */
    uint8_t scales[K_SCALE_SIZE]; /* 8 (scale, min) pairs, 6 bits each */
    uint8_t qs[QK_K / 2];         /* 4-bit quants */
} block_q4_K;
/* Q4_K's scales and mins with a fifth bit per quant in qh */
typedef struct {
    quant_f16 d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
typedef struct {
    uint8_t ql[QK_K / 2];      /* low 4 bits */
    uint8_t qh[QK_K / 4];      /* high 2 bits */
    int8_t scales[QK_K / 16];  /* 8-bit sub-block scales */
    quant_f16 d;
} block_q6_K;
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16]; /* sums of each 16 quants: for the K-quant mins */
} block_q8_K;

_Static_assert(sizeof(block_q8_0) == 34, "q8_0 layout");
_Static_assert(sizeof(block_q4_0) == 18, "q4_0 layout");
_Static_assert(sizeof(block_q4_1) == 20, "q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "q5_1 layout");
_Static_assert(sizeof(block_q2_K) == 84, "q2_K layout");
_Static_assert(sizeof(block_q3_K) == 110, "q3_K layout");
_Static_assert(sizeof(block_q4_K) == 144, "q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "q6_K layout");
_Static_assert(sizeof(block_q8_K) == 292, "q8_K layout");

/* 1 for a type this engine can load, 0 otherwise. */
int quant_supported(quant_type t);
/* "F32", "Q4_K", ... or NULL for an unknown id. */
const char *quant_type_name(unsigned t);
/* Elements per block (1 for float types); 0 for unknown types. */
size_t quant_block_elems(quant_type t);
size_t quant_block_bytes(quant_type t);
/* The first of n elements that is not finite, or n: F32/F16/BF16 values
 * that are NaN or infinite, and for block types the first element of a
 * block whose half-precision scale (d, and m or dmin where the type has
 * one) is not finite (their quants are integers: only scales can be). Only types quant_supported() accepts are
 * checked; others return n. n is a multiple of the block (a partial
 * trailing block is not read); data is aligned as the type's scalars (2
 * or 4 bytes; GGUF tensor data always is). */
size_t quant_find_nonfinite(quant_type t, const void *data, size_t n);
/* Bytes of a row of n elements; 0 when n is not a multiple of the block. */
size_t quant_row_bytes(quant_type t, size_t n);

void quant_init(void);
float quant_f16_to_f32(quant_f16 h);
quant_f16 quant_f32_to_f16(float f);
float quant_bf16_to_f32(uint16_t h);
uint16_t quant_f32_to_bf16(float f);

/* Dequantizes n elements (a multiple of the type's block) from src to dst. */
void quant_dequantize_row(quant_type t, const void *src, float *dst, size_t n);
/* Quantizes n floats into type t (a multiple of its block). Reference
 * quality: used by llm-mkmodel and the activation path of the scalar kernels. */
void quant_quantize_row(quant_type t, const float *src, void *dst, size_t n);

#endif
