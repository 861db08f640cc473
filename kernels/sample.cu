/* sample.cu - sampling on the device, so only token ids cross PCIe:
 * greedy argmax per row (ties to the lowest id, as the CPU sampler), and
 * temperature sampling with top-k, min-p and top-p truncation. The
 * truncation thresholds are found by bisection on the logit value (no
 * sort); the token is the one where the cumulative weight, in id order,
 * passes u times the total: the same distribution as the CPU sampler's,
 * though not the same draw for a given seed. Edge rules shared with the
 * host sampler: a NaN logit picks LK_SAMPLE_NAN, an infinite largest
 * logit or a total that is not finite and positive picks the argmax. */
#include <math.h>

#include "common.cuh"
#include "llm_kernels.h"

/* The better of two (value, id) pairs: larger value, then lower id. */
__device__ static inline void better(float *v, int *i, float v2, int i2)
{
    if (v2 > *v || (v2 == *v && i2 < *i))
        *v = v2, *i = i2;
}

/* The block's argmax of one row into *out (any block size up to 1024);
 * LK_SAMPLE_NAN when the row holds a NaN (no distribution to pick
 * from: the engine fails the request). Every thread of the block calls it. */
__device__ static void row_argmax(const float *row, int n_vocab, int32_t *out)
{
    __shared__ float sv[32];
    __shared__ int si[32];
    float v = -INFINITY;
    int id = 0x7fffffff, nan = 0;
    for (int i = threadIdx.x; i < n_vocab; i += blockDim.x) {
        nan |= row[i] != row[i];
        better(&v, &id, row[i], i);
    }
    for (int o = 16; o > 0; o >>= 1)
        better(&v, &id, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, id, o));
    if ((threadIdx.x & 31) == 0)
        sv[threadIdx.x >> 5] = v, si[threadIdx.x >> 5] = id;
    nan = __syncthreads_or(nan);
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / 32); w++) better(&v, &id, sv[w], si[w]);
        *out = nan ? LK_SAMPLE_NAN : id == 0x7fffffff ? 0 : id;
    }
}

__global__ static void argmax_kernel(const float *logits, int n_vocab, int32_t *out)
{
    row_argmax(logits + (size_t)blockIdx.x * n_vocab, n_vocab, out + blockIdx.x);
}

extern "C" int lk_argmax(const float *logits, int n_rows, int n_vocab, int32_t *out, void *stream)
{
    if (n_rows <= 0 || n_vocab <= 0)
        return 0;
    LK_LAUNCH(argmax_kernel, n_rows, LK_THREADS, 0, (cudaStream_t)stream)(logits, n_vocab, out);
    return lk_status();
}

/* ---- temperature / top-k / min-p / top-p ---------------------------------- */

#define SMP_THREADS 1024
#define SMP_ITERS 32

__device__ static float smp_sum(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.f;
    for (int w = 0; w < SMP_THREADS / 32; w++) t += sh[w];
    return t;
}

__device__ static float smp_max(float v, float *sh)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int w = 0; w < SMP_THREADS / 32; w++) t = fmaxf(t, sh[w]);
    return t;
}

/* Logit i, NaN read as -inf (never sampled). */
__device__ static inline float logit_at(const float *row, int i)
{
    float v = row[i];
    return v == v ? v : -INFINITY;
}

/* How many logits are >= tau, and their weight exp((l - M) / T). */
__device__ static void above(const float *row, int n, float tau, float M, float T, float *sh, float *count, float *mass)
{
    float c = 0.f, s = 0.f;
    for (int i = threadIdx.x; i < n; i += SMP_THREADS) {
        float l = logit_at(row, i);
        if (l >= tau)
            c += 1.f, s += expf((l - M) / T);
    }
    *count = smp_sum(c, sh);
    *mass = smp_sum(s, sh);
}

/* The threshold tau over the candidates: the k-th largest logit (top-k),
 * raised to M + T ln(min_p) (min-p), then the largest value whose weight
 * above still reaches top_p of the candidates' (top-p). Bisection on the
 * value, SMP_ITERS halvings of [lo, M]. */
__device__ static float threshold(const float *row, int n, const lk_sample_params *p, float M, float lo, float *sh)
{
    float T = p->temperature, tau = lo, c, m;
    if (p->top_k > 0 && p->top_k < n) {
        float a = lo, b = M;
        for (int it = 0; it < SMP_ITERS; it++) {
            float mid = 0.5f * (a + b);
            above(row, n, mid, M, T, sh, &c, &m);
            if (c >= (float)p->top_k)
                a = mid;
            else
                b = mid;
        }
        tau = a;
    }
    if (p->min_p > 0.f)
        tau = fmaxf(tau, M + T * logf(p->min_p));
    if (p->top_p < 1.f) {
        float z;
        above(row, n, tau, M, T, sh, &c, &z);
        float a = tau, b = M;
        for (int it = 0; it < SMP_ITERS; it++) {
            float mid = 0.5f * (a + b);
            above(row, n, mid, M, T, sh, &c, &m);
            if (m >= p->top_p * z)
                a = mid;
            else
                b = mid;
        }
        tau = a;
    }
    return tau;
}

__global__ static void sample_kernel(const float *logits, int n_vocab, const lk_sample_params *params, int32_t *out)
{
    __shared__ float sh[SMP_THREADS / 32];
    __shared__ float prefix[SMP_THREADS];
    __shared__ int pick, last_any;
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    lk_sample_params p = params[blockIdx.x];
    if (!(p.temperature >= LK_SAMPLE_GREEDY_BELOW)) { /* the host's rule: tiny (or NaN) T is greedy, ties to the lowest id */
        row_argmax(row, n_vocab, out + blockIdx.x);
        return;
    }
    float mx = -INFINITY, mn = INFINITY;
    int nan = 0;
    for (int i = threadIdx.x; i < n_vocab; i += SMP_THREADS) {
        float l = row[i];
        nan |= l != l;
        mx = fmaxf(mx, logit_at(row, i));
        if (l > -INFINITY)
            mn = fminf(mn, l);
    }
    float M = smp_max(mx, sh), lo = -smp_max(-mn, sh);
    /* a NaN (-1 out), an infinite largest logit (weights NaN) or nothing
     * finite at all: the argmax's rules, as on the host */
    if (__syncthreads_or(nan) || !(M < INFINITY) || !(M > -INFINITY)) {
        row_argmax(row, n_vocab, out + blockIdx.x);
        return;
    }
    float tau = threshold(row, n_vocab, &p, M, lo, sh), T = p.temperature;
    /* contiguous chunks per thread, so the id order of the cumulative sum
     * follows the thread order */
    int chunk = (n_vocab + SMP_THREADS - 1) / SMP_THREADS, i0 = threadIdx.x * chunk, i1 = min(n_vocab, i0 + chunk);
    float part = 0.f;
    int last = -1;
    for (int i = i0; i < i1; i++) {
        float l = logit_at(row, i);
        if (l >= tau)
            part += expf((l - M) / T), last = i;
    }
    prefix[threadIdx.x] = part;
    if (threadIdx.x == 0)
        pick = -1, last_any = -1;
    __syncthreads();
    if (last >= 0)
        atomicMax(&last_any, last);
    if (threadIdx.x == 0) { /* exclusive scan: 1024 adds */
        float acc = 0.f;
        for (int t = 0; t < SMP_THREADS; t++) {
            float v = prefix[t];
            prefix[t] = acc;
            acc += v;
        }
        sh[0] = acc;
    }
    __syncthreads();
    float target = p.u * sh[0], start = prefix[threadIdx.x];
    if (part > 0.f && target >= start && target < start + part) {
        float acc = start;
        for (int i = i0; i < i1; i++) {
            float l = logit_at(row, i);
            if (l >= tau && (acc += expf((l - M) / T)) > target) {
                pick = i;
                break;
            }
        }
        if (pick < 0)
            pick = last; /* rounding at the chunk's end */
    }
    __syncthreads();
    if (!(sh[0] > 0.f) || !(sh[0] < INFINITY)) { /* no finite positive total (T tiny, overflow): the argmax */
        row_argmax(row, n_vocab, out + blockIdx.x);
        return;
    }
    if (threadIdx.x == 0) /* target at the very end (u near 1, rounding): the last candidate */
        out[blockIdx.x] = pick >= 0 ? pick : last_any >= 0 ? last_any : 0;
}

extern "C" int lk_sample(const float *logits, int n_rows, int n_vocab, const lk_sample_params *params, int32_t *out,
                         void *stream)
{
    if (n_rows <= 0 || n_vocab <= 0)
        return 0;
    LK_LAUNCH(sample_kernel, n_rows, SMP_THREADS, 0, (cudaStream_t)stream)(logits, n_vocab, params, out);
    return lk_status();
}
