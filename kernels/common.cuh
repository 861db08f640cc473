/* common.cuh - helpers shared by the kernel files: launch geometry and
 * half/bfloat16 conversions that match the CPU backend's. */
#ifndef LK_COMMON_CUH
#define LK_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define LK_THREADS 256

static inline unsigned int lk_blocks(size_t n, unsigned int per)
{
    size_t b = (n + per - 1) / per;
    return (unsigned int)(b > 65535u * 32u ? 65535u * 32u : b); /* grid-stride loops cover the rest */
}

static inline int lk_status(void)
{
    return (int)cudaGetLastError();
}

__device__ static inline float lk_f16(uint16_t h)
{
    return __half2float(__ushort_as_half(h));
}

__device__ static inline float lk_bf16(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

#endif
