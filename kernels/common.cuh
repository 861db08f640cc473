/* common.cuh - helpers shared by the kernel files: launch geometry,
 * half/bfloat16 conversions that match the CPU backend's, and the two
 * constructs the CUDA-on-CPU emulator (tests/cudasim) needs spelled as
 * macros: a launch (<<<>>> under nvcc, the emulator's launch on the
 * host) and the dynamic shared memory declaration. */
#ifndef LK_COMMON_CUH
#define LK_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#define LK_THREADS 256

/* LK_LAUNCH(kernel, grid, block, smem, stream)(args...) */
#ifdef CUSIM
#define LK_LAUNCH(k, grid, block, smem, stream) cusim_launch_of(k, #k, grid, block, smem, stream)
#define LK_DYNAMIC_SHARED(T, name) T *name = (T *)cusim_dynamic_shared()
#else
#define LK_LAUNCH(k, grid, block, smem, stream) k<<<grid, block, smem, stream>>>
#define LK_DYNAMIC_SHARED(T, name) extern __shared__ __align__(32) T name[]
#endif

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

/* The first position a row at pos attends to with a sliding window
 * (0: none); the engine's llm_attn_first. */
__device__ static inline int lk_attn_first(int pos, int window)
{
    return window > 0 && pos >= window ? pos - window + 1 : 0;
}

#endif
