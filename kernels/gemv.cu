/* gemv.cu - y (n_tok, rows) = x (n_tok, cols) . W^T for small batches
 * (decode, n_tok <= 8) straight from the weights' storage type: one warp
 * per output row, every token of the batch against each weight read once.
 * F32, F16, BF16 and Q8_0 (dequantized on the fly, activations stay
 * float); Q4_K/Q6_K and the cuBLAS path for larger batches are to come. */
#include "common.cuh"
#include "llm_kernels.h"

#define GEMV_WARPS 4

template <int T>
__device__ static void gemv_row(int type, const uint8_t *w, int cols, const float *x, float *acc, int lane)
{
    if (type == 8) { /* Q8_0: a lane per 32-value block */
        for (int b = lane; b < cols / 32; b += 32) {
            const uint8_t *blk = w + (size_t)b * 34;
            float d = lk_f16((uint16_t)(blk[0] | (blk[1] << 8)));
            float part[T];
            for (int t = 0; t < T; t++) part[t] = 0.f;
            for (int i = 0; i < 32; i++) {
                float q = (float)(int8_t)blk[2 + i];
                for (int t = 0; t < T; t++) part[t] += q * x[(size_t)t * cols + b * 32 + i];
            }
            for (int t = 0; t < T; t++) acc[t] += d * part[t];
        }
        return;
    }
    for (int c = lane; c < cols; c += 32) { /* a lane per column: coalesced */
        float v = type == 0 ? ((const float *)w)[c] : type == 1 ? lk_f16(((const uint16_t *)w)[c])
                                                                : lk_bf16(((const uint16_t *)w)[c]);
        for (int t = 0; t < T; t++) acc[t] += v * x[(size_t)t * cols + c];
    }
}

template <int T>
__global__ static void gemv_kernel(int type, const uint8_t *W, size_t row_bytes, int rows, int cols, const float *x,
                                   float *y)
{
    int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= rows)
        return;
    float acc[T];
    for (int t = 0; t < T; t++) acc[t] = 0.f;
    gemv_row<T>(type, W + (size_t)row * row_bytes, cols, x, acc, lane);
    for (int t = 0; t < T; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0)
            y[(size_t)t * rows + row] = v;
    }
}

template <int T>
static void launch(int type, const void *W, size_t row_bytes, int rows, int cols, const float *x, float *y,
                   cudaStream_t s)
{
    unsigned int blocks = (unsigned int)((rows + GEMV_WARPS - 1) / GEMV_WARPS);
    gemv_kernel<T><<<blocks, GEMV_WARPS * 32, 0, s>>>(type, (const uint8_t *)W, row_bytes, rows, cols, x, y);
}

extern "C" int lk_gemv(int type, const void *W, size_t row_bytes, int rows, int cols, const float *x, int n_tok,
                       float *y, void *stream)
{
    if ((type != 0 && type != 1 && type != 8 && type != 30) || (type == 8 && cols % 32) || n_tok < 1 || n_tok > 8)
        return LK_UNSUPPORTED;
    if (rows <= 0 || cols <= 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    switch (n_tok) {
    case 1: launch<1>(type, W, row_bytes, rows, cols, x, y, s); break;
    case 2: launch<2>(type, W, row_bytes, rows, cols, x, y, s); break;
    case 3: launch<3>(type, W, row_bytes, rows, cols, x, y, s); break;
    case 4: launch<4>(type, W, row_bytes, rows, cols, x, y, s); break;
    case 5: launch<5>(type, W, row_bytes, rows, cols, x, y, s); break;
    case 6: launch<6>(type, W, row_bytes, rows, cols, x, y, s); break;
    case 7: launch<7>(type, W, row_bytes, rows, cols, x, y, s); break;
    default: launch<8>(type, W, row_bytes, rows, cols, x, y, s); break;
    }
    return lk_status();
}
