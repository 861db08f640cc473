/* gemv.cu - y (n_tok, rows) = x (n_tok, cols) . W^T for small batches
 * (decode, n_tok <= 8) straight from the weights' storage type: one warp
 * per output row, every token of the batch against each weight read once.
 * F32/F16/BF16 rows are read with 16-byte loads, Q4_0 a lane per block,
 * Q8_0 four lanes per block (the warp reads contiguous bytes), Q4_K and
 * Q6_K eight lanes per 256-value super-block, a 32-value sub-block each
 * (dequantized on the fly as the CPU dequantizer does; activations stay
 * float); Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K a lane per column through
 * the element decoder (correct, not yet tuned). x rows must be 16-byte
 * aligned (cudaMalloc'd activations are).
 * Larger batches go to cuBLAS (backend_cuda.c). */
#include "common.cuh"
#include "dequant.cuh"
#include "llm_kernels.h"

#define GEMV_WARPS 4

/* Sub-block j (32 values) of a Q4_K super-block (144 bytes: d, dmin,
 * scales[12], qs[128]; sub-blocks 2g and 2g+1 share the 32 bytes
 * qs[32g..], low and high nibbles) against the T activation rows at column
 * col0, as the CPU dequantizer reads it. */
template <int T>
__device__ static void dot_q4_K_sub(const uint8_t *b, int j, const float *x, int cols, int col0, float *acc)
{
    int sc, m;
    lk_q4_K_scale_min(j, b + 4, &sc, &m);
    float d = lk_f16_at(b) * sc, mn = lk_f16_at(b + 2) * m;
    const uint8_t *q = b + 16 + (j / 2) * 32;
    int shift = (j & 1) * 4;
    float part[T], xs[T];
    for (int t = 0; t < T; t++) part[t] = 0.f, xs[t] = 0.f;
    for (int l = 0; l < 32; l++) {
        float v = (float)((q[l] >> shift) & 0xf);
        for (int t = 0; t < T; t++) {
            float xv = x[(size_t)t * cols + col0 + l];
            part[t] += v * xv;
            xs[t] += xv;
        }
    }
    for (int t = 0; t < T; t++) acc[t] += d * part[t] - mn * xs[t];
}

/* Sub-block j (32 values) of a Q6_K super-block (210 bytes: ql[128],
 * qh[64], scales[16], d). */
template <int T>
__device__ static void dot_q6_K_sub(const uint8_t *b, int j, const float *x, int cols, int col0, float *acc)
{
    int h = j / 4, k = j % 4;
    const uint8_t *ql = b + 64 * h + ((k & 1) ? 32 : 0), *qh = b + 128 + 32 * h;
    const int8_t *sc = (const int8_t *)(b + 192 + 8 * h);
    float d = lk_f16_at(b + 208);
    int lo_shift = k < 2 ? 0 : 4;
    for (int half = 0; half < 2; half++) { /* 16 values per scale */
        float s = d * sc[half + 2 * k], part[T];
        for (int t = 0; t < T; t++) part[t] = 0.f;
        for (int l = 16 * half; l < 16 * half + 16; l++) {
            int q = ((ql[l] >> lo_shift) & 0xf) | (((qh[l] >> (2 * k)) & 3) << 4);
            float v = (float)(q - 32);
            for (int t = 0; t < T; t++) part[t] += v * x[(size_t)t * cols + col0 + l];
        }
        for (int t = 0; t < T; t++) acc[t] += s * part[t];
    }
}

/* Q4_K, Q6_K: 8 lanes per super-block, one 32-value sub-block each. */
template <int T>
__device__ static void row_k_quant(int type, const uint8_t *w, int cols, const float *x, float *acc, int lane)
{
    int j = lane & 7;
    for (int b = lane >> 3; b < cols / 256; b += 4) {
        if (type == LK_T_Q4_K)
            dot_q4_K_sub<T>(w + (size_t)b * 144, j, x, cols, b * 256 + j * 32, acc);
        else
            dot_q6_K_sub<T>(w + (size_t)b * 210, j, x, cols, b * 256 + j * 32, acc);
    }
}

/* Q4_0: a lane per 18-byte block (d, 16 bytes: low nibbles values 0-15,
 * high 16-31). */
template <int T>
__device__ static void row_q4_0(const uint8_t *w, int cols, const float *x, float *acc, int lane)
{
    for (int b = lane; b < cols / 32; b += 32) {
        const uint8_t *blk = w + (size_t)b * 18;
        float d = lk_f16_at(blk), part[T];
        for (int t = 0; t < T; t++) part[t] = 0.f;
        for (int j = 0; j < 16; j++) {
            float lo = (float)((blk[2 + j] & 0xf) - 8), hi = (float)((blk[2 + j] >> 4) - 8);
            for (int t = 0; t < T; t++) {
                const float *xr = x + (size_t)t * cols + b * 32;
                part[t] += lo * xr[j] + hi * xr[j + 16];
            }
        }
        for (int t = 0; t < T; t++) acc[t] += d * part[t];
    }
}

/* Q8_0: 4 lanes per 34-byte block, 8 blocks per pass: the warp reads 272
 * contiguous bytes. */
template <int T>
__device__ static void row_q8_0(const uint8_t *w, int cols, const float *x, float *acc, int lane)
{
    int part = lane & 3;
    for (int b = lane >> 2; b < cols / 32; b += 8) {
        const uint8_t *blk = w + (size_t)b * 34;
        float d = lk_f16_at(blk);
        const uint16_t *q2 = (const uint16_t *)(blk + 2 + part * 8); /* 2-byte aligned: blocks are 34 bytes */
        float qv[8];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            uint16_t v = q2[k];
            qv[2 * k] = (float)(int8_t)(v & 0xff);
            qv[2 * k + 1] = (float)(int8_t)(v >> 8);
        }
        int c0 = b * 32 + part * 8;
        for (int t = 0; t < T; t++) {
            const float4 *xv = (const float4 *)(x + (size_t)t * cols + c0);
            float4 x0 = xv[0], x1 = xv[1];
            acc[t] += d * (qv[0] * x0.x + qv[1] * x0.y + qv[2] * x0.z + qv[3] * x0.w + qv[4] * x1.x + qv[5] * x1.y +
                           qv[6] * x1.z + qv[7] * x1.w);
        }
    }
}

/* F16/BF16 rows of a multiple of 256 on 16-byte boundaries: 16-byte
 * loads, 8 values per lane per pass. */
template <int T>
__device__ static void row_half(int type, const uint8_t *w, int cols, const float *x, float *acc, int lane)
{
    for (int c0 = lane * 8; c0 < cols; c0 += 256) {
        uint4 raw = *(const uint4 *)(w + (size_t)c0 * 2);
        const uint16_t *h = (const uint16_t *)&raw;
        float wv[8];
#pragma unroll
        for (int k = 0; k < 8; k++) wv[k] = type == LK_T_F16 ? lk_f16(h[k]) : lk_bf16(h[k]);
        for (int t = 0; t < T; t++) {
            const float4 *xv = (const float4 *)(x + (size_t)t * cols + c0);
            float4 x0 = xv[0], x1 = xv[1];
            acc[t] += wv[0] * x0.x + wv[1] * x0.y + wv[2] * x0.z + wv[3] * x0.w + wv[4] * x1.x + wv[5] * x1.y +
                      wv[6] * x1.z + wv[7] * x1.w;
        }
    }
}

/* F32 rows of a multiple of 128 on 16-byte boundaries: 16-byte loads. */
template <int T>
__device__ static void row_f32(const uint8_t *w, int cols, const float *x, float *acc, int lane)
{
    for (int c0 = lane * 4; c0 < cols; c0 += 128) {
        float4 wv = *(const float4 *)(w + (size_t)c0 * 4);
        for (int t = 0; t < T; t++) {
            float4 xv = *(const float4 *)(x + (size_t)t * cols + c0);
            acc[t] += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
        }
    }
}

/* Other rows: a lane per column (coalesced for float types). */
template <int T>
__device__ static void row_scalar(int type, const uint8_t *w, int cols, const float *x, float *acc, int lane)
{
    for (int c = lane; c < cols; c += 32) {
        float v = lk_weight_at(type, w, c);
        for (int t = 0; t < T; t++) acc[t] += v * x[(size_t)t * cols + c];
    }
}

template <int T>
__device__ static void gemv_row(int type, const uint8_t *w, int cols, const float *x, float *acc, int lane)
{
    int aligned = ((uintptr_t)w & 15) == 0;
    if (type == LK_T_Q4_K || type == LK_T_Q6_K)
        row_k_quant<T>(type, w, cols, x, acc, lane);
    else if (type == LK_T_Q4_0)
        row_q4_0<T>(w, cols, x, acc, lane);
    else if (type == LK_T_Q8_0)
        row_q8_0<T>(w, cols, x, acc, lane);
    else if ((type == LK_T_F16 || type == LK_T_BF16) && cols % 256 == 0 && aligned)
        row_half<T>(type, w, cols, x, acc, lane);
    else if (type == LK_T_F32 && cols % 128 == 0 && aligned)
        row_f32<T>(w, cols, x, acc, lane);
    else
        row_scalar<T>(type, w, cols, x, acc, lane);
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
    LK_LAUNCH(gemv_kernel<T>, blocks, GEMV_WARPS * 32, 0, s)(type, (const uint8_t *)W, row_bytes, rows, cols, x, y);
}

extern "C" int lk_gemv(int type, const void *W, size_t row_bytes, int rows, int cols, const float *x, int n_tok,
                       float *y, void *stream)
{
    if (!lk_weight_type(type, cols) || n_tok < 1 || n_tok > 8)
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
