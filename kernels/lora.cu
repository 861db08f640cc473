/* lora.cu - LoRA adapters' low-rank products over a segment list
 * (llm_backend_i.lora): shrink, t = A x for every adapted row, then
 * expand, y += s * (B t), A and B each float or half (read as float).
 * Each row's arithmetic is fixed (a warp's lanes and shuffle tree for
 * each of A's rows, k = 0 .. rank-1 in order for each output), so a row's
 * result does not depend on the other rows. */
#include "common.cuh"
#include "llm_kernels.h"

#define LORA_WARPS 4
#define LORA_EXPAND 256

__device__ static inline const void *lora_ptr(int32_t lo, int32_t hi)
{
    return (const void *)(((uint64_t)(uint32_t)hi << 32) | (uint32_t)lo);
}

/* Element i of a float or half matrix, as float (exact either way). */
__device__ static inline float lora_ld(const void *p, int half, size_t i)
{
    return half ? __half2float(((const __half *)p)[i]) : ((const float *)p)[i];
}

/* Block i: row rows[2i] of segment rows[2i + 1]; warp w takes A's rows
 * k = w, w + LORA_WARPS, ... */
__global__ static void lora_shrink(const int32_t *segs, const int32_t *rows, const float *x, int in, float *t,
                                   int t_stride)
{
    const int32_t *sg = segs + 8 * rows[2 * blockIdx.x + 1];
    int row = rows[2 * blockIdx.x], rank = sg[2] & LK_LORA_RANK_MASK, half = (sg[2] & LK_LORA_A_HALF) != 0;
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const void *a = lora_ptr(sg[4], sg[5]);
    const float *xr = x + (size_t)row * in;
    for (int k = w; k < rank; k += LORA_WARPS) {
        size_t ak = (size_t)k * in;
        float v = 0;
        for (int i = lane; i < in; i += 32) v += lora_ld(a, half, ak + i) * xr[i];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0)
            t[(size_t)blockIdx.x * t_stride + k] = v;
    }
}

/* Block (i, j): outputs [j * LORA_EXPAND, ...) of row rows[2i]. */
__global__ static void lora_expand(const int32_t *segs, const int32_t *rows, const float *t, int t_stride, float *y,
                                   int out)
{
    const int32_t *sg = segs + 8 * rows[2 * blockIdx.x + 1];
    int o = blockIdx.y * LORA_EXPAND + threadIdx.x, rank = sg[2] & LK_LORA_RANK_MASK, half = (sg[2] & LK_LORA_B_HALF) != 0;
    if (o >= out)
        return;
    const void *bt = lora_ptr(sg[6], sg[7]);
    const float *tr = t + (size_t)blockIdx.x * t_stride;
    float acc = 0;
    for (int k = 0; k < rank; k++) acc += tr[k] * lora_ld(bt, half, (size_t)k * out + o);
    y[(size_t)rows[2 * blockIdx.x] * out + o] += __int_as_float(sg[3]) * acc;
}

extern "C" int lk_lora(const int32_t *segs, const int32_t *rows, int n_rows, const float *x, int in, float *y, int out,
                       float *t, int t_stride, void *stream)
{
    if (n_rows <= 0 || in <= 0 || out <= 0)
        return 0;
    if (n_rows > 65535 * 32 || (out + LORA_EXPAND - 1) / LORA_EXPAND > 65535)
        return LK_UNSUPPORTED;
    LK_LAUNCH(lora_shrink, n_rows, 32 * LORA_WARPS, 0, (cudaStream_t)stream)(segs, rows, x, in, t, t_stride);
    dim3 grid((unsigned int)n_rows, (unsigned int)((out + LORA_EXPAND - 1) / LORA_EXPAND));
    LK_LAUNCH(lora_expand, grid, LORA_EXPAND, 0, (cudaStream_t)stream)(segs, rows, t, t_stride, y, out);
    return lk_status();
}
