/* attention_tc.cu - causal attention for prefill on the tensor cores: one
 * warp per (tile of up to 16 consecutive query rows of one sequence, head).
 * Q (pre-scaled, rounded to half) times K^T over 16-position tiles of the
 * F16 paged cache with wmma 16x16x16 (FP32 accumulation), an online softmax
 * per row in shared memory, and P (half) times V accumulated into the
 * output tile in FP32; the output is divided by the row sums at the end.
 * Each tile's K/V is read once for its 16 rows, where the decode kernel
 * reads it once per row. F16 K/V only, head_dim a multiple of 16 up to
 * 256. With a sliding window each row sees its last `window` positions;
 * tiles before the first row's window are skipped and never looked up. */
#include <math.h>
#include <mma.h>

#include "common.cuh"
#include "llm_kernels.h"

using namespace nvcuda;

#define TC_ROWS 16
#define TC_MAX_D 256

typedef struct tc_args {
    const float *q;
    float *out;
    int n_head, n_head_kv, head_dim;
    float scale;
    const int32_t *tiles; /* (n_tiles, 4): first row, rows, position of the first row, offset of its block table */
    const int32_t *tables;
    const __half *kc, *vc;
    size_t row_elems, head_elems; /* a cache row and a KV head's slice, in halves */
    int block_size;
    int window; /* 0: none */
} tc_args;


/* Dynamic shared memory: Q, K, V tiles (half), O (float), S (float), P
 * (half), per-row max, sum and rescale. */
__global__ static void attention_tc_kernel(tc_args a)
{
    LK_DYNAMIC_SHARED(unsigned char, smem);
    const int D = a.head_dim, lane = threadIdx.x;
    __half *sQ = (__half *)smem, *sK = sQ + TC_ROWS * D, *sV = sK + TC_ROWS * D;
    float *sO = (float *)(sV + TC_ROWS * D), *sS = sO + TC_ROWS * D;
    __half *sP = (__half *)(sS + TC_ROWS * TC_ROWS);
    float *sM = (float *)(sP + TC_ROWS * TC_ROWS), *sL = sM + TC_ROWS, *sC = sL + TC_ROWS;
    const int32_t *tile = a.tiles + 4 * blockIdx.x;
    int row0 = tile[0], n = tile[1], pos0 = tile[2], h = blockIdx.y;
    const int32_t *table = a.tables + tile[3];
    int g = h / (a.n_head / a.n_head_kv), last = pos0 + n - 1, first = lk_attn_first(pos0, a.window);
    for (int i = lane; i < TC_ROWS * D; i += 32) {
        int r = i / D, d = i % D;
        sQ[i] = __float2half_rn(r < n ? a.q[((size_t)(row0 + r) * a.n_head + h) * D + d] * a.scale : 0.f);
        sO[i] = 0.f;
    }
    if (lane < TC_ROWS)
        sM[lane] = -INFINITY, sL[lane] = 0.f;
    __syncwarp();
    for (int t0 = first / TC_ROWS * TC_ROWS; t0 <= last; t0 += TC_ROWS) {
        for (int i = lane; i < TC_ROWS * D; i += 32) {
            int c = i / D, d = i % D, p = t0 + c;
            __half k = __float2half(0.f), v = k;
            if (p >= first && p <= last) { /* positions past the sequence or before every window: not looked up */
                size_t off = ((size_t)table[p / a.block_size] * a.block_size + (size_t)(p % a.block_size)) *
                                 a.row_elems + (size_t)g * a.head_elems + d;
                k = a.kc[off];
                v = a.vc[off];
            }
            sK[i] = k;
            sV[i] = v;
        }
        __syncwarp();
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> s;
        wmma::fill_fragment(s, 0.f);
        for (int k = 0; k < D; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> qa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> kb; /* K row-major = K^T col-major */
            wmma::load_matrix_sync(qa, sQ + k, D);
            wmma::load_matrix_sync(kb, sK + k, D);
            wmma::mma_sync(s, qa, kb, s);
        }
        wmma::store_matrix_sync(sS, s, TC_ROWS, wmma::mem_row_major);
        __syncwarp();
        if (lane < TC_ROWS) { /* lane r: row r's online softmax over this tile */
            int r = lane, qp = pos0 + r, lo = lk_attn_first(qp, a.window);
            float mx = sM[r];
            for (int c = 0; c < TC_ROWS; c++)
                if (r < n && t0 + c <= qp && t0 + c >= lo)
                    mx = fmaxf(mx, sS[r * TC_ROWS + c]);
            /* a tile wholly before this row's window leaves mx at -inf: nothing to add */
            float corr = sM[r] == -INFINITY ? 0.f : expf(sM[r] - mx), sum = 0.f;
            for (int c = 0; c < TC_ROWS; c++) {
                float pv = r < n && t0 + c <= qp && t0 + c >= lo ? expf(sS[r * TC_ROWS + c] - mx) : 0.f;
                sP[r * TC_ROWS + c] = __float2half_rn(pv);
                sum += pv;
            }
            sM[r] = mx;
            sL[r] = sL[r] * corr + sum;
            sC[r] = corr;
        }
        __syncwarp();
        for (int i = lane; i < TC_ROWS * D; i += 32) sO[i] *= sC[i / D];
        __syncwarp();
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> pa;
        wmma::load_matrix_sync(pa, sP, TC_ROWS);
        for (int j = 0; j < D; j += 16) {
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> vb;
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
            wmma::load_matrix_sync(vb, sV + j, D);
            wmma::load_matrix_sync(o, sO + j, D, wmma::mem_row_major);
            wmma::mma_sync(o, pa, vb, o);
            wmma::store_matrix_sync(sO + j, o, D, wmma::mem_row_major);
        }
        __syncwarp();
    }
    for (int i = lane; i < n * D; i += 32) {
        int r = i / D, d = i % D;
        a.out[((size_t)(row0 + r) * a.n_head + h) * D + d] = sO[i] / sL[r];
    }
}

static size_t tc_smem(int D)
{
    return (size_t)3 * TC_ROWS * D * 2 + (size_t)TC_ROWS * D * 4 + TC_ROWS * TC_ROWS * 4 + TC_ROWS * TC_ROWS * 2 +
           3 * TC_ROWS * 4;
}

extern "C" int lk_attention_tc(const float *q, float *out, int n_tiles, const int32_t *tiles, int n_head,
                               int n_head_kv, int head_dim, float scale, const int32_t *tables, const void *k_cache,
                               const void *v_cache, size_t row_bytes, int block_size, int window, void *stream)
{
    if (head_dim % 16 || head_dim > TC_MAX_D || n_head_kv <= 0 || n_head % n_head_kv || row_bytes % 2)
        return LK_UNSUPPORTED;
    if (n_tiles <= 0)
        return 0;
    size_t smem = tc_smem(head_dim);
    if (smem > 48 * 1024) {
        cudaError_t e = cudaFuncSetAttribute(attention_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess)
            return (int)e;
    }
    tc_args a;
    a.q = q, a.out = out, a.n_head = n_head, a.n_head_kv = n_head_kv, a.head_dim = head_dim, a.scale = scale;
    a.tiles = tiles, a.tables = tables, a.kc = (const __half *)k_cache, a.vc = (const __half *)v_cache;
    a.row_elems = row_bytes / 2, a.head_elems = (size_t)head_dim, a.block_size = block_size, a.window = window;
    dim3 grid((unsigned int)n_tiles, (unsigned int)n_head);
    LK_LAUNCH(attention_tc_kernel, grid, 32, smem, (cudaStream_t)stream)(a);
    return lk_status();
}
