/* bugs.cu - kernels for the emulator's own tests (test_cudasim.c): each
 * seeded bug next to its correct twin, plus the pieces of the dialect the
 * tests compare with oracles (half/bfloat16 rounding, wmma, the math
 * error). Compiled like kernels/ (the emulator's dialect, instrumented);
 * the launchers are C functions returning the launch's error. */
#include <mma.h>
#include <stdint.h>

#include "common.cuh" /* kernels/: LK_LAUNCH, as the kernels launch */

using namespace nvcuda;

/* out[i] = in[(i + 1) % n] through shared memory; barrier: whether the
 * block synchronises between the write and the read. */
__global__ static void rotate_kernel(const float *in, float *out, int barrier)
{
    __shared__ float s[64];
    int t = threadIdx.x, n = blockDim.x;
    s[t] = in[t];
    if (barrier)
        __syncthreads();
    out[t] = s[(t + 1) % n];
}

/* out[i * stride] = i for blockDim.x threads. */
__global__ static void stride_kernel(float *out, int stride) { out[threadIdx.x * stride] = (float)threadIdx.x; }

/* A warp sum by xor shuffles over the mask (full: right; half: lanes
 * 0-15 read lanes 16-31 at offset 16, which the mask leaves out). */
__global__ static void warp_sum_kernel(const float *in, float *out, unsigned mask)
{
    int lane = threadIdx.x;
    if (!(mask >> lane & 1u))
        return;
    float v = in[lane];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o);
    out[lane] = v;
}

/* __syncthreads in code only threads below `upto` reach. */
__global__ static void divergent_kernel(float *out, int upto)
{
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = (float)t;
    if (t < upto)
        __syncthreads();
    out[t] = s[t];
}

/* Reads shared memory no thread wrote (written: 1 writes it first). */
__global__ static void uninit_kernel(float *out, int written)
{
    __shared__ float s[32];
    if (written)
        s[threadIdx.x] = 1.f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

/* Writes s[threadIdx.x + off] of a 32-float shared array. */
__global__ static void shared_oob_kernel(float *out, int off)
{
    __shared__ float s[32];
    s[threadIdx.x + off] = 1.f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

/* Lanes 0-15 shuffle with the full mask while lanes 16-31 wait at a
 * barrier: neither can complete. */
__global__ static void deadlock_kernel(float *out)
{
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16)
        v = __shfl_xor_sync(0xffffffffu, v, 1);
    else
        __syncthreads();
    out[threadIdx.x] = v;
}

/* D (16 x 16) = A (16 x 16, row-major halves) B (16 x 16, row-major
 * halves) + C, one warp; off moves A's pointer by that many halves. */
__global__ static void mma_kernel(const __half *A, const __half *B, const float *C, float *D, int off)
{
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c;
    wmma::load_matrix_sync(a, A + off, 16);
    wmma::load_matrix_sync(b, B, 16);
    wmma::load_matrix_sync(c, C, 16, wmma::mem_row_major);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(D, c, 16, wmma::mem_row_major);
}

/* A float4 read at in + off floats. */
__global__ static void vec_kernel(const float *in, float *out, int off)
{
    float4 v = *(const float4 *)(in + off);
    out[0] = v.x + v.y + v.z + v.w;
}

__global__ static void count_kernel(int *counter)
{
    if (counter)
        atomicAdd(counter, 1);
}

/* out = in + 1, to watch the order of work on streams. */
__global__ static void inc_kernel(const float *in, float *out, int n)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = in[i] + 1.f;
}

extern "C" {
cudaError_t bug_rotate(const float *in, float *out, int n, int barrier)
{
    LK_LAUNCH(rotate_kernel, 1, n, 0, NULL)(in, out, barrier);
    return cudaGetLastError();
}
cudaError_t bug_stride(float *out, int n, int stride)
{
    LK_LAUNCH(stride_kernel, 1, n, 0, NULL)(out, stride);
    return cudaGetLastError();
}
cudaError_t bug_warp_sum(const float *in, float *out, unsigned mask)
{
    LK_LAUNCH(warp_sum_kernel, 1, 32, 0, NULL)(in, out, mask);
    return cudaGetLastError();
}
cudaError_t bug_divergent(float *out, int n, int upto)
{
    LK_LAUNCH(divergent_kernel, 1, n, 0, NULL)(out, upto);
    return cudaGetLastError();
}
cudaError_t bug_uninit(float *out, int written)
{
    LK_LAUNCH(uninit_kernel, 1, 32, 0, NULL)(out, written);
    return cudaGetLastError();
}
cudaError_t bug_shared_oob(float *out, int off)
{
    LK_LAUNCH(shared_oob_kernel, 1, 32, 0, NULL)(out, off);
    return cudaGetLastError();
}
cudaError_t bug_deadlock(float *out)
{
    LK_LAUNCH(deadlock_kernel, 1, 32, 0, NULL)(out);
    return cudaGetLastError();
}
cudaError_t bug_mma(const uint16_t *A, const uint16_t *B, const float *C, float *D, int off)
{
    LK_LAUNCH(mma_kernel, 1, 32, 0, NULL)((const __half *)A, (const __half *)B, C, D, off);
    return cudaGetLastError();
}
cudaError_t bug_vec(const float *in, float *out, int off)
{
    LK_LAUNCH(vec_kernel, 1, 1, 0, NULL)(in, out, off);
    return cudaGetLastError();
}
cudaError_t bug_count(int *counter, unsigned blocks, unsigned threads)
{
    LK_LAUNCH(count_kernel, blocks, threads, 0, NULL)(counter);
    return cudaGetLastError();
}
cudaError_t bug_inc(const float *in, float *out, int n, cudaStream_t s)
{
    LK_LAUNCH(inc_kernel, 1, 128, 0, s)(in, out, n);
    return cudaGetLastError();
}
/* A launch with this configuration (the kernel does nothing wrong). */
cudaError_t bug_config(unsigned gx, unsigned bx, size_t smem)
{
    LK_LAUNCH(count_kernel, gx, bx, smem, NULL)((int *)NULL);
    return cudaGetLastError();
}
cudaError_t bug_allow_smem(int bytes) { return cudaFuncSetAttribute(count_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes); }

/* The dialect's conversions and math, for the oracles. */
uint16_t bug_f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
float bug_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
uint16_t bug_f2bf(float f) { return __float2bfloat16_rn(f).__x; }
float bug_expf(float x) { return expf(x); }
float bug_powf(float x, float y) { return powf(x, y); }
float bug_logf(float x) { return logf(x); }
void bug_sincosf(float x, float *s, float *c) { sincosf(x, s, c); }
}
