/* kernels.h - the CPU backend's inner loops, as swappable kernel sets.
 *
 * A weight row of type T is multiplied with an activation row that was first
 * converted to cpu_act_type(T): float32 for float weights, Q8_0 blocks for
 * Q8_0/Q4_0 weights, Q8_K blocks for K-quants. Integer dot products over
 * 8-bit activations are what makes quantized matmuls fast on CPUs.
 * The scalar set is the reference; a SIMD set must agree with it within
 * float rounding. All functions are pure and thread-safe. */
#ifndef LLM_CPU_KERNELS_H
#define LLM_CPU_KERNELS_H

#include "llm/quant.h"

typedef float (*cpu_dot_fn)(const void *w, const void *x, int n);
typedef void (*cpu_quant_fn)(const float *x, void *dst, int n);
/* One weight row against four activation rows (x, x + stride, ...): the
 * weight is loaded and decoded once for all four (prefill). */
typedef void (*cpu_dot4_fn)(const void *w, const void *x, size_t stride, int n, float *out);

typedef struct cpu_kernels {
    const char *name;
    cpu_dot_fn dot[QT_COUNT];          /* by weight type */
    cpu_dot4_fn dot4[QT_COUNT];        /* optional, by weight type */
    cpu_quant_fn quantize[QT_COUNT];   /* by activation type */
    float (*dot_f32)(const float *a, const float *b, int n);
    /* y += a * x */
    void (*axpy)(float *y, float a, const float *x, int n);
} cpu_kernels;

quant_type cpu_act_type(quant_type weight);
const cpu_kernels *cpu_kernels_scalar(void);
/* NULL when not compiled in or the CPU lacks AVX2/FMA/F16C. */
const cpu_kernels *cpu_kernels_avx2(void);
const cpu_kernels *cpu_kernels_best(void);

#endif
