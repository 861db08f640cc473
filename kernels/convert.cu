/* convert.cu - the conversions the cuBLAS path needs (quantized weights
 * to float, activations to the weights' half type) and the per-row bias
 * add. Dequantization reads blocks exactly as the CPU dequantizer does. */
#include "common.cuh"
#include "dequant.cuh"
#include "llm_kernels.h"

__global__ static void dequant_f32_kernel(int type, const uint8_t *W, size_t row_bytes, int rows, int cols, float *out)
{
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols;
        out[i] = lk_weight_at(type, W + r * row_bytes, (int)(i - r * cols));
    }
}

extern "C" int lk_dequant_f32(int type, const void *W, size_t row_bytes, int rows, int cols, float *out, void *stream)
{
    if (!lk_weight_type(type, cols))
        return LK_UNSUPPORTED;
    size_t n = (size_t)rows * cols;
    if (!n)
        return 0;
    LK_LAUNCH(dequant_f32_kernel, lk_blocks(n, LK_THREADS), LK_THREADS, 0, (cudaStream_t)stream)(
        type, (const uint8_t *)W, row_bytes, rows, cols, out);
    return lk_status();
}

__global__ static void to_half_kernel(const float *x, size_t n, int bf16, void *out)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (bf16)
            ((__nv_bfloat16 *)out)[i] = __float2bfloat16_rn(x[i]);
        else
            ((__half *)out)[i] = __float2half_rn(x[i]);
    }
}

extern "C" int lk_to_half(const float *x, size_t n, int bf16, void *out, void *stream)
{
    LK_LAUNCH(to_half_kernel, lk_blocks(n, LK_THREADS), LK_THREADS, 0, (cudaStream_t)stream)(x, n, bf16, out);
    return lk_status();
}

__global__ static void add_bias_kernel(float *x, const float *bias, int n_tok, int dim)
{
    size_t n = (size_t)n_tok * dim;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += bias[i % dim];
}

extern "C" int lk_add_bias(float *x, const float *bias, int n_tok, int dim, void *stream)
{
    size_t n = (size_t)n_tok * dim;
    LK_LAUNCH(add_bias_kernel, lk_blocks(n, LK_THREADS), LK_THREADS, 0, (cudaStream_t)stream)(x, bias, n_tok, dim);
    return lk_status();
}
