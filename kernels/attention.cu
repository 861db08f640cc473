/* attention.cu - causal attention over the paged KV cache, flash-decoding
 * style: one block per (query row, head, split of the positions). A block's
 * warps take interleaved positions, each keeping an online softmax (running
 * max, sum and weighted V in registers: PER = ceil(head_dim / 32) values per
 * lane, a compile-time count so the arrays stay in registers); the warps
 * merge in shared memory. When one row's positions are split over several
 * blocks (long contexts with few rows: decode), each writes its partial
 * (max, sum, weighted V) to a workspace and a second kernel combines them.
 * Correct for prefill rows too (each row its own causal length); with a
 * sliding window a row sees only its last `window` positions. K/V in
 * F32, F16 or Q8_0, dequantized as the CPU backend does; grouped-query
 * heads; any head_dim up to 256. */
#include <math.h>

#include "common.cuh"
#include "dequant.cuh"
#include "llm_kernels.h"

#define ATT_WARPS 4
#define ATT_MAX_D 256
#define ATT_MIN_CHUNK 256  /* positions per split at least */
#define ATT_TARGET_BLOCKS 1024 /* enough blocks for every SM several times */

/* Element i of a K/V row slice in the cache's type. */
__device__ static inline float kv_elem(int type, const uint8_t *row, int i)
{
    if (type == LK_T_F32)
        return ((const float *)row)[i];
    if (type == LK_T_F16)
        return __half2float(((const __half *)row)[i]);
    const uint8_t *blk = row + (size_t)(i / 32) * 34; /* Q8_0 */
    return lk_f16_at(blk) * (float)(int8_t)blk[2 + i % 32];
}

typedef struct att_args {
    const float *q;
    float *out;
    int n_head, n_head_kv, head_dim;
    float scale;
    const int32_t *row_pos, *row_table, *tables;
    int type;
    const uint8_t *kc, *vc;
    size_t row_bytes, head_bytes;
    int block_size, chunk, splits;
    int window; /* 0: none */
    float *part; /* (rows, heads, splits, head_dim + 2) when splits > 1 */
} att_args;

template <int PER>
__global__ static void attention_kernel(att_args a)
{
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS], s_acc[ATT_WARPS][PER * 32];
    int row = blockIdx.x, h = blockIdx.y, split = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int g = h / (a.n_head / a.n_head_kv), last = a.row_pos[row];
    int first = lk_attn_first(last, a.window);
    int p0 = max(split * a.chunk, first), p1 = min(last + 1, split * a.chunk + a.chunk);
    const int32_t *table = a.tables + a.row_table[row];
    const float *qr = a.q + ((size_t)row * a.n_head + h) * a.head_dim;
    float qv[PER], acc[PER], m = -INFINITY, l = 0.f;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int d = lane + 32 * j;
        qv[j] = d < a.head_dim ? qr[d] : 0.f;
        acc[j] = 0.f;
    }
    for (int p = p0 + warp; p < p1; p += ATT_WARPS) {
        size_t off = ((size_t)table[p / a.block_size] * a.block_size + (size_t)(p % a.block_size)) * a.row_bytes +
                     (size_t)g * a.head_bytes;
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (lane + 32 * j < a.head_dim)
                dot += qv[j] * kv_elem(a.type, a.kc + off, lane + 32 * j);
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        float s = dot * a.scale, mn = fmaxf(m, s), corr = expf(m - mn), w = expf(s - mn);
        l = l * corr + w;
#pragma unroll
        for (int j = 0; j < PER; j++)
            if (lane + 32 * j < a.head_dim)
                acc[j] = acc[j] * corr + w * kv_elem(a.type, a.vc + off, lane + 32 * j);
        m = mn;
    }
    if (lane == 0)
        s_m[warp] = m, s_l[warp] = l;
#pragma unroll
    for (int j = 0; j < PER; j++) s_acc[warp][lane + 32 * j] = acc[j];
    __syncthreads();
    if (warp)
        return;
    float big = -INFINITY, sum = 0.f;
    for (int w = 0; w < ATT_WARPS; w++) big = fmaxf(big, s_m[w]);
    for (int w = 0; w < ATT_WARPS; w++) sum += s_m[w] == -INFINITY ? 0.f : s_l[w] * expf(s_m[w] - big);
    size_t rh = (size_t)row * a.n_head + h;
    float *part = a.splits > 1 ? a.part + (rh * a.splits + split) * (size_t)(a.head_dim + 2) : NULL;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        int d = lane + 32 * j;
        if (d >= a.head_dim)
            continue;
        float v = 0.f;
        for (int w = 0; w < ATT_WARPS; w++) v += s_m[w] == -INFINITY ? 0.f : s_acc[w][d] * expf(s_m[w] - big);
        if (part)
            part[2 + d] = v;
        else
            a.out[rh * a.head_dim + d] = v / sum;
    }
    if (part && lane == 0)
        part[0] = big, part[1] = sum; /* big is -inf for a split past the row's end */
}

/* Joins a row-head's splits: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M). */
__global__ static void combine_kernel(const float *part, float *out, int head_dim, int splits)
{
    size_t rh = blockIdx.x;
    const float *p = part + rh * splits * (size_t)(head_dim + 2);
    float big = -INFINITY, sum = 0.f;
    for (int s = 0; s < splits; s++) big = fmaxf(big, p[(size_t)s * (head_dim + 2)]);
    for (int s = 0; s < splits; s++) {
        const float *ps = p + (size_t)s * (head_dim + 2);
        sum += ps[0] == -INFINITY ? 0.f : ps[1] * expf(ps[0] - big);
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float v = 0.f;
        for (int s = 0; s < splits; s++) {
            const float *ps = p + (size_t)s * (head_dim + 2);
            v += ps[0] == -INFINITY ? 0.f : ps[2 + d] * expf(ps[0] - big);
        }
        out[rh * head_dim + d] = v / sum;
    }
}

/* Positions per split and the split count: one split when rows x heads
 * already fill the device, else chunks of at least ATT_MIN_CHUNK. */
static int att_splits(int n_rows, int n_head, int max_len, int *chunk)
{
    long blocks = (long)n_rows * n_head, want = blocks >= ATT_TARGET_BLOCKS ? 1 : ATT_TARGET_BLOCKS / blocks;
    long c = (max_len + want - 1) / want;
    if (c < ATT_MIN_CHUNK)
        c = ATT_MIN_CHUNK;
    if (c > max_len)
        c = max_len > 0 ? max_len : 1;
    *chunk = (int)c;
    return (int)((max_len + c - 1) / c);
}

extern "C" size_t lk_attention_work(int n_rows, int n_head, int head_dim, int max_len)
{
    int chunk, s = att_splits(n_rows, n_head, max_len, &chunk);
    return s > 1 ? (size_t)n_rows * n_head * s * (size_t)(head_dim + 2) : 0;
}

template <int PER>
static void launch(const att_args &a, int n_rows, cudaStream_t s)
{
    dim3 grid((unsigned int)n_rows, (unsigned int)a.n_head, (unsigned int)a.splits);
    LK_LAUNCH(attention_kernel<PER>, grid, ATT_WARPS * 32, 0, s)(a);
}

extern "C" int lk_attention(const float *q, float *out, int n_rows, int n_head, int n_head_kv, int head_dim,
                            float scale, const int32_t *row_pos, const int32_t *row_table, const int32_t *tables,
                            int type, const void *k_cache, const void *v_cache, size_t row_bytes, int block_size,
                            int max_len, int window, float *work, void *stream)
{
    if (head_dim < 1 || head_dim > ATT_MAX_D || n_head_kv <= 0 || n_head % n_head_kv ||
        (type != LK_T_F32 && type != LK_T_F16 && type != LK_T_Q8_0) || (type == LK_T_Q8_0 && head_dim % 32))
        return LK_UNSUPPORTED;
    if (n_rows <= 0)
        return 0;
    if (max_len < 1) /* rows attend to [0, row_pos]: at least one position (0 would be a grid of no splits) */
        return LK_UNSUPPORTED;
    att_args a;
    a.q = q, a.out = out, a.n_head = n_head, a.n_head_kv = n_head_kv, a.head_dim = head_dim, a.scale = scale;
    a.row_pos = row_pos, a.row_table = row_table, a.tables = tables, a.type = type;
    a.kc = (const uint8_t *)k_cache, a.vc = (const uint8_t *)v_cache, a.row_bytes = row_bytes;
    a.head_bytes = type == LK_T_F32 ? (size_t)head_dim * 4 : type == LK_T_F16 ? (size_t)head_dim * 2 : (size_t)head_dim / 32 * 34;
    a.block_size = block_size;
    a.window = window;
    a.splits = att_splits(n_rows, n_head, max_len, &a.chunk);
    a.part = work;
    if (a.splits > 1 && !work)
        return LK_UNSUPPORTED;
    cudaStream_t s = (cudaStream_t)stream;
    int per = (head_dim + 31) / 32;
    if (per <= 1)
        launch<1>(a, n_rows, s);
    else if (per <= 2)
        launch<2>(a, n_rows, s);
    else if (per <= 4)
        launch<4>(a, n_rows, s);
    else
        launch<8>(a, n_rows, s);
    if (a.splits > 1)
        LK_LAUNCH(combine_kernel, (unsigned int)(n_rows * n_head), 128, 0, s)(work, out, head_dim, a.splits);
    return lk_status();
}
