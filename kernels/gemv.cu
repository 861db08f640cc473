/* gemv.cu - y (n_tok, rows) = x (n_tok, cols) . W^T for small batches
 * (decode, n_tok <= 8) straight from the weights' storage type: one warp
 * per output row, every token of the batch against each weight read once.
 * F32, F16, BF16, Q8_0, Q4_K and Q6_K (dequantized on the fly exactly as
 * the CPU dequantizer does; activations stay float); the cuBLAS path for
 * larger batches is to come. */
#include "common.cuh"
#include "llm_kernels.h"

#define GEMV_WARPS 4

__device__ static inline float f16_at(const uint8_t *p)
{
    return lk_f16((uint16_t)(p[0] | (p[1] << 8)));
}

/* Q4_K's 6-bit (scale, min) pair j of 8, as the CPU dequantizer reads it. */
__device__ static inline void q4k_scale_min(int j, const uint8_t *q, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* One 256-value super-block (144 bytes: d, dmin, scales[12], qs[128])
 * against the T activation rows at column col0. */
template <int T>
__device__ static void dot_q4_K(const uint8_t *b, const float *x, int cols, int col0, float *acc)
{
    float d = f16_at(b), dmin = f16_at(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0; j < 256; j += 64, q += 32) {
        int sc, m;
        q4k_scale_min(j / 32, scales, &sc, &m);
        float d1 = d * sc, m1 = dmin * m;
        q4k_scale_min(j / 32 + 1, scales, &sc, &m);
        float d2 = d * sc, m2 = dmin * m;
        for (int l = 0; l < 32; l++) {
            float lo = d1 * (q[l] & 0xf) - m1, hi = d2 * (q[l] >> 4) - m2;
            for (int t = 0; t < T; t++)
                acc[t] += lo * x[(size_t)t * cols + col0 + j + l] + hi * x[(size_t)t * cols + col0 + j + 32 + l];
        }
    }
}

/* One Q6_K super-block (210 bytes: ql[128], qh[64], scales[16], d). */
template <int T>
__device__ static void dot_q6_K(const uint8_t *b, const float *x, int cols, int col0, float *acc)
{
    float d = f16_at(b + 208);
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int n = 0; n < 256; n += 128, ql += 64, qh += 32, sc += 8)
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            float v[4] = {d * sc[is] * (((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32),
                          d * sc[is + 2] * (((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32),
                          d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32),
                          d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32)};
            for (int k = 0; k < 4; k++)
                for (int t = 0; t < T; t++) acc[t] += v[k] * x[(size_t)t * cols + col0 + n + l + 32 * k];
        }
}

template <int T>
__device__ static void gemv_row(int type, const uint8_t *w, int cols, const float *x, float *acc, int lane)
{
    if (type == 12 || type == 14) { /* Q4_K, Q6_K: a lane per 256-value super-block */
        for (int b = lane; b < cols / 256; b += 32) {
            if (type == 12)
                dot_q4_K<T>(w + (size_t)b * 144, x, cols, b * 256, acc);
            else
                dot_q6_K<T>(w + (size_t)b * 210, x, cols, b * 256, acc);
        }
        return;
    }
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
    int kq = type == 12 || type == 14;
    if ((type != 0 && type != 1 && type != 8 && type != 30 && !kq) || (type == 8 && cols % 32) || (kq && cols % 256) ||
        n_tok < 1 || n_tok > 8)
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
