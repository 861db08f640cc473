/* sample.cu - sampling on the device, so only token ids cross PCIe:
 * greedy argmax per row (ties to the lowest id, as the CPU sampler), and
 * temperature sampling with top-k, min-p and top-p truncation. The
 * truncation thresholds are found by bisection over the floats' ordered
 * keys (no sort, exact values); top-k keeps exactly k, ties at the k-th
 * value broken by the lowest id as the host does; the token is the one
 * where the cumulative weight, in id order, passes u times the total:
 * the same distribution as the CPU sampler's (top-p's boundary ties
 * aside), though not the same draw for a given seed. Edge rules shared with the
 * host sampler: a NaN logit picks LK_SAMPLE_NAN, an infinite largest
 * logit or a total that is not finite and positive picks the argmax. */
#include <limits.h>
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

/* Block-wide sum and max (every thread gets the result). */
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

/* Floats as unsigned keys in the same order, so thresholds are found by
 * bisection over keys: 32 steps reach the exact value whatever the range
 * of the logits (bisection on the value itself stops at a resolution). */
__device__ static inline unsigned key_of(float f)
{
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : u | 0x80000000u;
}

__device__ static inline float float_of(unsigned k)
{
    return __uint_as_float((k & 0x80000000u) ? k & 0x7fffffffu : ~k);
}

/* The candidates: logits above kth, the first `ties` (by id) equal to it,
 * and only those at or above tau. Each thread walks its own contiguous
 * chunk of ids [i0, i1), whose ties start at index tie0, so "first by id"
 * and the cumulative sum in id order follow the thread order. */
typedef struct smp_set {
    float kth, tau, M, T;
    int ties;
} smp_set;

typedef struct smp_chunk {
    int i0, i1, tie0;
} smp_chunk;

__device__ static inline int smp_in(const smp_set *cs, float l, int *tie)
{
    int in = l > cs->kth || (l == cs->kth && (*tie)++ < cs->ties);
    return in && l >= cs->tau;
}

/* This thread's count and weight (exp((l - M) / T)) of candidates >= x. */
__device__ static void chunk_mass(const float *row, const smp_chunk *ch, const smp_set *cs, float x, float *count,
                                  float *mass)
{
    float c = 0.f, m = 0.f;
    int tie = ch->tie0;
    for (int i = ch->i0; i < ch->i1; i++) {
        float l = logit_at(row, i);
        if (smp_in(cs, l, &tie) && l >= x)
            c += 1.f, m += expf((l - cs->M) / cs->T);
    }
    *count = c;
    *mass = m;
}

/* The exclusive prefix over threads of v (in thread order) and the total. */
__device__ static float smp_scan(float v, float *prefix, float *total)
{
    __syncthreads();
    prefix[threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.x == 0) { /* serial, in thread order: the prefix must follow id order exactly (1024 adds per scan) */
        float acc = 0.f;
        for (int t = 0; t < SMP_THREADS; t++) {
            float x = prefix[t];
            prefix[t] = acc;
            acc += x;
        }
        prefix[SMP_THREADS] = acc;
    }
    __syncthreads();
    *total = prefix[SMP_THREADS];
    return prefix[threadIdx.x];
}

/* Top-k: the k-th largest value and how many of the values equal to it are
 * kept (exactly k candidates, ties broken by the lowest id, as the host
 * sampler breaks them); off: every candidate. */
__device__ static void top_k(const float *row, const smp_chunk *ch, int k, int n, float lo, float M, float *sh,
                             float *prefix, smp_set *cs, int *tie0)
{
    cs->kth = -INFINITY;
    cs->ties = INT_MAX; /* off: every tie */
    *tie0 = 0;
    if (k <= 0 || k >= n)
        return;
    unsigned a = key_of(lo), b = key_of(M);
    while (a < b) { /* the largest key x with count(l >= x) >= k */
        unsigned mid = a + (b - a + 1) / 2;
        float x = float_of(mid), c = 0.f;
        for (int i = ch->i0; i < ch->i1; i++) c += logit_at(row, i) >= x ? 1.f : 0.f;
        if (smp_sum(c, sh) >= (float)k)
            a = mid;
        else
            b = mid - 1;
    }
    cs->kth = float_of(a);
    float gt = 0.f, eq = 0.f;
    for (int i = ch->i0; i < ch->i1; i++) {
        float l = logit_at(row, i);
        gt += l > cs->kth ? 1.f : 0.f;
        eq += l == cs->kth ? 1.f : 0.f;
    }
    cs->ties = k - (int)smp_sum(gt, sh);
    float total;
    *tie0 = (int)smp_scan(eq, prefix, &total);
}

/* Top-p: the largest value x such that the candidates >= x keep top_p of
 * the candidates' weight (ties at x are all kept: rounding aside, the
 * host keeps them in id order until the mass is reached). */
__device__ static float top_p(const float *row, const smp_chunk *ch, const smp_set *cs, float p, float lo, float *sh)
{
    float c, m;
    chunk_mass(row, ch, cs, -INFINITY, &c, &m);
    float want = p * smp_sum(m, sh);
    unsigned a = key_of(lo), b = key_of(cs->M);
    while (a < b) {
        unsigned mid = a + (b - a + 1) / 2;
        chunk_mass(row, ch, cs, float_of(mid), &c, &m);
        if (smp_sum(m, sh) >= want)
            a = mid;
        else
            b = mid - 1;
    }
    return float_of(a);
}

__global__ static void sample_kernel(const float *logits, int n_vocab, const lk_sample_params *params, int32_t *out)
{
    __shared__ float sh[SMP_THREADS / 32];
    __shared__ float prefix[SMP_THREADS + 1];
    __shared__ int pick, last_any;
    const float *row = logits + (size_t)blockIdx.x * n_vocab;
    lk_sample_params p = params[blockIdx.x];
    if (!(p.temperature >= LK_SAMPLE_GREEDY_BELOW)) { /* the host's rule: tiny (or NaN) T is greedy, ties to the lowest id */
        row_argmax(row, n_vocab, out + blockIdx.x);
        return;
    }
    int chunk = (n_vocab + SMP_THREADS - 1) / SMP_THREADS, i0 = min(n_vocab, (int)threadIdx.x * chunk);
    smp_chunk ch = {i0, min(n_vocab, i0 + chunk), 0};
    float mx = -INFINITY, mn = INFINITY;
    int nan = 0;
    for (int i = ch.i0; i < ch.i1; i++) {
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
    smp_set cs;
    top_k(row, &ch, p.top_k, n_vocab, lo, M, sh, prefix, &cs, &ch.tie0);
    cs.M = M, cs.T = p.temperature, cs.tau = p.min_p > 0.f ? M + p.temperature * logf(p.min_p) : -INFINITY;
    if (p.top_p < 1.f)
        cs.tau = fmaxf(cs.tau, top_p(row, &ch, &cs, p.top_p, lo, sh));
    float part, count, total;
    int last = -1, tie = ch.tie0;
    chunk_mass(row, &ch, &cs, -INFINITY, &count, &part);
    for (int i = ch.i0; i < ch.i1; i++) /* the chunk's last candidate with a weight (not a -inf or underflowed logit) */
        if (smp_in(&cs, logit_at(row, i), &tie) && expf((logit_at(row, i) - M) / p.temperature) > 0.f)
            last = i;
    if (threadIdx.x == 0)
        pick = -1, last_any = -1;
    float start = smp_scan(part, prefix, &total); /* its barriers order the two writes above too */
    if (last >= 0)
        atomicMax(&last_any, last);
    float target = p.u * total;
    if (part > 0.f && target >= start && target < start + part) {
        /* summed from 0 as part was (from start, weights below half an
         * ulp of start would vanish and the draw would fall off the end) */
        float acc = 0.f, want = target - start;
        tie = ch.tie0;
        for (int i = ch.i0; i < ch.i1; i++) {
            float l = logit_at(row, i);
            if (smp_in(&cs, l, &tie) && (acc += expf((l - M) / p.temperature)) > want) {
                pick = i;
                break;
            }
        }
        if (pick < 0)
            pick = last; /* rounding at the chunk's end */
    }
    __syncthreads();
    if (!(total > 0.f) || !(total < INFINITY)) { /* no finite positive total (T tiny, overflow): the argmax */
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
