/* norm.cu - RMSNorm: one block per row; the sum of squares is reduced in
 * double (as the CPU backend does: long rows lose bits in float). */
#include "common.cuh"
#include "llm_kernels.h"

__global__ static void rmsnorm_kernel(const float *x, const float *w, int dim, float eps, float *out)
{
    __shared__ double part[LK_THREADS / 32];
    const float *row = x + (size_t)blockIdx.x * dim;
    float *o = out + (size_t)blockIdx.x * dim;
    double ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += (double)row[i] * row[i];
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = ss;
    __syncthreads();
    if (threadIdx.x < 32) {
        ss = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0;
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if (threadIdx.x == 0)
            part[0] = ss;
    }
    __syncthreads();
    float s = (float)(1.0 / sqrt(part[0] / dim + eps));
    for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = row[i] * s * w[i];
}

extern "C" int lk_rmsnorm(const float *x, const float *w, int n_tok, int dim, float eps, float *out, void *stream)
{
    if (n_tok <= 0 || dim <= 0)
        return 0;
    LK_LAUNCH(rmsnorm_kernel, n_tok, LK_THREADS, 0, (cudaStream_t)stream)(x, w, dim, eps, out);
    return lk_status();
}
