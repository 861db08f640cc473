/* kv.cu - K/V rows of a batch written into the paged cache (llm/backend.h's
 * layout), converted to the cache's type exactly as the CPU backend does:
 * F16 round to nearest even; Q8_0 per 32 values d = absmax / 127 stored as
 * F16, q = lrint(x / d). */
#include "common.cuh"
#include "llm_kernels.h"

__device__ static void store_row(int type, const float *x, int kv_dim, uint8_t *dst, int lane_base, int stride)
{
    if (type == LK_T_F32) {
        for (int i = lane_base; i < kv_dim; i += stride) ((float *)dst)[i] = x[i];
    } else if (type == LK_T_F16) {
        for (int i = lane_base; i < kv_dim; i += stride) ((__half *)dst)[i] = __float2half_rn(x[i]);
    }
}

/* F32/F16: one block per row. */
__global__ static void kv_write_plain(int type, uint8_t *kc, uint8_t *vc, size_t row_bytes, int kv_dim,
                                      const int32_t *slot, const float *k, const float *v)
{
    size_t r = blockIdx.x;
    store_row(type, k + r * kv_dim, kv_dim, kc + (size_t)slot[r] * row_bytes, threadIdx.x, blockDim.x);
    store_row(type, v + r * kv_dim, kv_dim, vc + (size_t)slot[r] * row_bytes, threadIdx.x, blockDim.x);
}

/* Q8_0: one warp per group of 32 values (blockIdx.y: 0 K, 1 V). */
__global__ static void kv_write_q8_0(uint8_t *kc, uint8_t *vc, size_t row_bytes, int kv_dim, const int32_t *slot,
                                     const float *k, const float *v, int n_rows)
{
    int groups = kv_dim / 32, lane = threadIdx.x & 31;
    size_t g = (size_t)blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
    if (g >= (size_t)n_rows * groups)
        return;
    size_t r = g / groups;
    int grp = (int)(g % groups);
    const float *x = (blockIdx.y ? v : k) + r * kv_dim + grp * 32;
    uint8_t *blk = (blockIdx.y ? vc : kc) + (size_t)slot[r] * row_bytes + (size_t)grp * 34;
    float val = x[lane], amax = fabsf(val);
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    if (lane == 0) {
        uint16_t h = __half_as_ushort(__float2half_rn(d));
        blk[0] = (uint8_t)(h & 0xff);
        blk[1] = (uint8_t)(h >> 8);
    }
    blk[2 + lane] = (uint8_t)(int8_t)__float2int_rn(val * id);
}

extern "C" int lk_kv_write(int type, void *k_cache, void *v_cache, size_t row_bytes, int kv_dim, const int32_t *slot,
                           int n_rows, const float *k, const float *v, void *stream)
{
    if (n_rows <= 0)
        return 0;
    cudaStream_t s = (cudaStream_t)stream;
    if (type == LK_T_F32 || type == LK_T_F16) {
        LK_LAUNCH(kv_write_plain, n_rows, LK_THREADS, 0, s)(type, (uint8_t *)k_cache, (uint8_t *)v_cache, row_bytes, kv_dim,
                                                     slot, k, v);
    } else if (type == LK_T_Q8_0 && kv_dim % 32 == 0) {
        size_t warps = (size_t)n_rows * (kv_dim / 32);
        dim3 grid((unsigned int)((warps + LK_THREADS / 32 - 1) / (LK_THREADS / 32)), 2);
        LK_LAUNCH(kv_write_q8_0, grid, LK_THREADS, 0, s)((uint8_t *)k_cache, (uint8_t *)v_cache, row_bytes, kv_dim, slot, k,
                                                  v, n_rows);
    } else {
        return LK_UNSUPPORTED;
    }
    return lk_status();
}
