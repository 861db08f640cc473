/* convert.cu - the conversions the cuBLAS path needs (weights to half
 * precision, activations to the weights' half type) and the per-row bias
 * add. Dequantization reads blocks exactly as the CPU dequantizer does. */
#include "common.cuh"
#include "llm_kernels.h"

__device__ static inline float byte_f16(const uint8_t *p)
{
    return lk_f16((uint16_t)(p[0] | (p[1] << 8)));
}

/* Element j (0..255) of a Q4_K super-block. */
__device__ static float q4_K_at(const uint8_t *b, int j)
{
    int g = j / 64, l = j % 64, s = 2 * g + (l >= 32);
    const uint8_t *q = b + 16 + g * 32, *sc = b + 4;
    int scale, min;
    if (s < 4) {
        scale = sc[s] & 63;
        min = sc[s + 4] & 63;
    } else {
        scale = (sc[s + 4] & 0xf) | ((sc[s - 4] >> 6) << 4);
        min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
    }
    int nib = l < 32 ? q[l] & 0xf : q[l - 32] >> 4;
    return byte_f16(b) * scale * nib - byte_f16(b + 2) * min;
}

/* Element j of a Q6_K super-block. */
__device__ static float q6_K_at(const uint8_t *b, int j)
{
    int h = j / 128, r = j % 128, k = r / 32, l = r % 32;
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
    int lo = (k & 1) ? ql[l + 32] : ql[l];
    lo = k < 2 ? lo & 0xf : lo >> 4;
    int q = lo | (((qh[l] >> (2 * k)) & 3) << 4);
    return byte_f16(b + 208) * sc[l / 16 + 2 * k] * (q - 32);
}

__device__ static float weight_at(int type, const uint8_t *row, int c)
{
    switch (type) {
    case 0: return ((const float *)row)[c];
    case 1: return lk_f16(((const uint16_t *)row)[c]);
    case 30: return lk_bf16(((const uint16_t *)row)[c]);
    case 8: return byte_f16(row + (size_t)(c / 32) * 34) * (float)(int8_t)row[(size_t)(c / 32) * 34 + 2 + c % 32];
    case 12: return q4_K_at(row + (size_t)(c / 256) * 144, c % 256);
    default: return q6_K_at(row + (size_t)(c / 256) * 210, c % 256);
    }
}

__global__ static void dequant_kernel(int type, const uint8_t *W, size_t row_bytes, int rows, int cols, __half *out)
{
    size_t n = (size_t)rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t r = i / cols;
        out[i] = __float2half_rn(weight_at(type, W + r * row_bytes, (int)(i - r * cols)));
    }
}

extern "C" int lk_dequant_f16(int type, const void *W, size_t row_bytes, int rows, int cols, void *out, void *stream)
{
    int ok = type == 0 || type == 1 || type == 30 || (type == 8 && cols % 32 == 0) ||
             ((type == 12 || type == 14) && cols % 256 == 0);
    if (!ok)
        return LK_UNSUPPORTED;
    size_t n = (size_t)rows * cols;
    LK_LAUNCH(dequant_kernel, lk_blocks(n, LK_THREADS), LK_THREADS, 0, (cudaStream_t)stream)(type, (const uint8_t *)W, row_bytes,
                                                                                      rows, cols, (__half *)out);
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
