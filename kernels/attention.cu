/* attention.cu - causal attention over the paged KV cache, decode-style:
 * one block per (query row, head); its warps take interleaved positions,
 * each keeping an online softmax (running max, sum and weighted V in
 * registers, head_dim / 32 values per lane), and the warps' partial results
 * are merged at the end (the flash-decoding combine, within a block).
 * Correct for prefill rows too (each row its own causal length); a tiled
 * tensor-core prefill kernel is still to come. K/V in F32, F16 or Q8_0,
 * dequantized as the CPU backend does; grouped-query heads. */
#include <math.h>

#include "common.cuh"
#include "llm_kernels.h"

#define ATT_WARPS 4
#define ATT_MAX_D 256

/* Element i of a K/V row slice in the cache's type. */
__device__ static inline float kv_elem(int type, const uint8_t *row, int i)
{
    if (type == 0)
        return ((const float *)row)[i];
    if (type == 1)
        return __half2float(((const __half *)row)[i]);
    const uint8_t *blk = row + (size_t)(i / 32) * 34; /* Q8_0 */
    return lk_f16((uint16_t)(blk[0] | (blk[1] << 8))) * (float)(int8_t)blk[2 + i % 32];
}

__global__ static void attention_kernel(const float *q, float *out, int n_head, int n_head_kv, int head_dim, float scale,
                                        const int32_t *row_pos, const int32_t *row_table, const int32_t *tables,
                                        int type, const uint8_t *kc, const uint8_t *vc, size_t row_bytes,
                                        int block_size, size_t head_bytes)
{
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS], s_acc[ATT_WARPS][ATT_MAX_D];
    int row = blockIdx.x, h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, per = head_dim / 32;
    int g = h / (n_head / n_head_kv), last = row_pos[row];
    const int32_t *table = tables + row_table[row];
    const float *qr = q + ((size_t)row * n_head + h) * head_dim;
    float qv[ATT_MAX_D / 32], acc[ATT_MAX_D / 32], m = -INFINITY, l = 0.f;
    for (int j = 0; j < per; j++) qv[j] = qr[lane + 32 * j], acc[j] = 0.f;
    for (int p = warp; p <= last; p += ATT_WARPS) {
        size_t off = ((size_t)table[p / block_size] * block_size + (size_t)(p % block_size)) * row_bytes + g * head_bytes;
        float dot = 0.f;
        for (int j = 0; j < per; j++) dot += qv[j] * kv_elem(type, kc + off, lane + 32 * j);
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float s = dot * scale, mn = fmaxf(m, s), corr = expf(m - mn), w = expf(s - mn);
        l = l * corr + w;
        for (int j = 0; j < per; j++) acc[j] = acc[j] * corr + w * kv_elem(type, vc + off, lane + 32 * j);
        m = mn;
    }
    if (lane == 0)
        s_m[warp] = m, s_l[warp] = l;
    for (int j = 0; j < per; j++) s_acc[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    if (warp)
        return;
    float big = -INFINITY, sum = 0.f;
    for (int w = 0; w < ATT_WARPS; w++) big = fmaxf(big, s_m[w]);
    for (int w = 0; w < ATT_WARPS; w++) sum += s_m[w] == -INFINITY ? 0.f : s_l[w] * expf(s_m[w] - big);
    float *o = out + ((size_t)row * n_head + h) * head_dim;
    for (int j = 0; j < per; j++) {
        float v = 0.f;
        for (int w = 0; w < ATT_WARPS; w++)
            v += s_m[w] == -INFINITY ? 0.f : s_acc[w][lane + 32 * j] * expf(s_m[w] - big);
        o[lane + 32 * j] = v / sum;
    }
}

extern "C" int lk_attention(const float *q, float *out, int n_rows, int n_head, int n_head_kv, int head_dim,
                            float scale, const int32_t *row_pos, const int32_t *row_table, const int32_t *tables,
                            int type, const void *k_cache, const void *v_cache, size_t row_bytes, int block_size,
                            void *stream)
{
    if (head_dim % 32 || head_dim > ATT_MAX_D || n_head_kv <= 0 || n_head % n_head_kv ||
        (type != 0 && type != 1 && type != 8))
        return LK_UNSUPPORTED;
    if (n_rows <= 0)
        return 0;
    size_t head_bytes = type == 0 ? (size_t)head_dim * 4 : type == 1 ? (size_t)head_dim * 2 : (size_t)head_dim / 32 * 34;
    dim3 grid((unsigned int)n_rows, (unsigned int)n_head);
    attention_kernel<<<grid, ATT_WARPS * 32, 0, (cudaStream_t)stream>>>(
        q, out, n_head, n_head_kv, head_dim, scale, row_pos, row_table, tables, type, (const uint8_t *)k_cache,
        (const uint8_t *)v_cache, row_bytes, block_size, head_bytes);
    return lk_status();
}
