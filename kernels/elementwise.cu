/* elementwise.cu - SwiGLU, GELU-gated MLP, scaling, residual add and embedding rows (any weight
 * type lk_weight_at reads): memory-bound grid-stride loops. */
#include "common.cuh"
#include "dequant.cuh"
#include "llm_kernels.h"

__global__ static void swiglu_kernel(const float *g, const float *u, size_t n, float *out)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

__global__ static void geglu_kernel(const float *g, const float *u, size_t n, float *out)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float x = g[i];
        out[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x))) * u[i];
    }
}

__global__ static void scale_kernel(float *x, float s, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] *= s;
}

__global__ static void add_kernel(float *y, const float *x, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        y[i] += x[i];
}

/* One block per expert output row: y[rows[i]] (=, or +=) w[i] * x[i].
 * The product is rounded before the add (no FMA), as the CPU does. */
__global__ static void add_rows_kernel(float *y, const int32_t *rows, const float *w, const float *x, int dim, int set)
{
    float *yr = y + (size_t)rows[blockIdx.x] * dim, s = w[blockIdx.x];
    const float *xr = x + (size_t)blockIdx.x * dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x)
        yr[c] = set ? __fmul_rn(s, xr[c]) : __fadd_rn(yr[c], __fmul_rn(s, xr[c]));
}

/* One block per output row; type as in llm_kernels.h. */
__global__ static void get_rows_kernel(int type, const uint8_t *emb, size_t row_bytes, int cols, const int32_t *ids,
                                       float *out)
{
    const uint8_t *row = emb + (size_t)ids[blockIdx.x] * row_bytes;
    float *o = out + (size_t)blockIdx.x * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) o[c] = lk_weight_at(type, row, c);
}

extern "C" int lk_swiglu(const float *gate, const float *up, size_t n, float *out, void *stream)
{
    if (!n)
        return 0;
    LK_LAUNCH(swiglu_kernel, lk_blocks(n, LK_THREADS), LK_THREADS, 0, (cudaStream_t)stream)(gate, up, n, out);
    return lk_status();
}

extern "C" int lk_geglu(const float *gate, const float *up, size_t n, float *out, void *stream)
{
    if (!n)
        return 0;
    LK_LAUNCH(geglu_kernel, lk_blocks(n, LK_THREADS), LK_THREADS, 0, (cudaStream_t)stream)(gate, up, n, out);
    return lk_status();
}

extern "C" int lk_scale(float *x, float s, size_t n, void *stream)
{
    if (!n)
        return 0;
    LK_LAUNCH(scale_kernel, lk_blocks(n, LK_THREADS), LK_THREADS, 0, (cudaStream_t)stream)(x, s, n);
    return lk_status();
}

extern "C" int lk_add(float *y, const float *x, size_t n, void *stream)
{
    if (!n)
        return 0;
    LK_LAUNCH(add_kernel, lk_blocks(n, LK_THREADS), LK_THREADS, 0, (cudaStream_t)stream)(y, x, n);
    return lk_status();
}

extern "C" int lk_add_rows(float *y, const int32_t *rows, const float *w, const float *x, int n, int dim, int set,
                           void *stream)
{
    if (n <= 0 || dim <= 0)
        return 0;
    LK_LAUNCH(add_rows_kernel, n, LK_THREADS, 0, (cudaStream_t)stream)(y, rows, w, x, dim, set);
    return lk_status();
}

extern "C" int lk_get_rows(int type, const void *emb, size_t row_bytes, int cols, const int32_t *ids, int n,
                           float *out, void *stream)
{
    if (!lk_weight_type(type, cols))
        return LK_UNSUPPORTED;
    if (n <= 0 || cols <= 0)
        return 0;
    LK_LAUNCH(get_rows_kernel, n, LK_THREADS, 0, (cudaStream_t)stream)(type, (const uint8_t *)emb, row_bytes, cols, ids, out);
    return lk_status();
}
