/* tiles_avx2.h - 256-bit tiles over packed weights (pk_layout.h) for the
 * avx2 set (vpmaddubsw) and the avxvnni set (AVX-VNNI vpdpbusd). Internal
 * to the CPU backend; pure and thread-safe. */
#ifndef LLM_CPU_TILES_AVX2_H
#define LLM_CPU_TILES_AVX2_H

#include "kernels.h"

/* The tiles for weight type t (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
 * Q6_K; NULL for the others, or where not compiled in), a static table
 * that is never freed: vnni 0 multiplies with vpmaddubsw (AVX2), 1 with
 * vpdpbusd (the caller checks for AVX-VNNI). */
const cpu_pack *tiles_avx2_pack(quant_type t, int vnni);

/* The avxvnni set's int8_spin: 12 vpdpbusd chains (needs AVX-VNNI). */
double tiles_avx2_spin_vnni(long iters, int seed);

#endif
