/* sample.cu - sampling on the device, so only token ids cross PCIe:
 * greedy argmax per row (ties to the lowest id, as the CPU sampler).
 * Temperature / top-k / top-p are to come. */
#include <math.h>

#include "common.cuh"
#include "llm_kernels.h"

/* The better of two (value, id) pairs: larger value, then lower id. */
__device__ static inline void better(float *v, int *i, float v2, int i2)
{
    if (v2 > *v || (v2 == *v && i2 < *i))
        *v = v2, *i = i2;
}

__global__ static void argmax_kernel(const float *logits, int n_vocab, int32_t *out)
{
    __shared__ float sv[LK_THREADS / 32];
    __shared__ int si[LK_THREADS / 32];
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    float v = -INFINITY;
    int id = 0x7fffffff;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) better(&v, &id, row[i], i);
    for (int o = 16; o > 0; o >>= 1)
        better(&v, &id, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, id, o));
    if ((threadIdx.x & 31) == 0)
        sv[threadIdx.x >> 5] = v, si[threadIdx.x >> 5] = id;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / 32); w++) better(&v, &id, sv[w], si[w]);
        out[blockIdx.x] = id == 0x7fffffff ? 0 : id;
    }
}

extern "C" int lk_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, void *stream)
{
    if (n_rows <= 0 || n_vocab <= 0)
        return 0;
    argmax_kernel<<<n_rows, LK_THREADS, 0, (cudaStream_t)stream>>>(logits, n_vocab, out);
    return lk_status();
}
