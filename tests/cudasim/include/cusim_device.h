/* cusim_device.h - the CUDA device dialect as host C++, so the kernels
 * (kernels/, the .cu files) compile unchanged for the emulator
 * (tests/cudasim): qualifiers, thread coordinates, barriers and warp
 * intrinsics (runtime calls that switch fibers), atomics, half/bfloat16
 * with CUDA's rounding, the math the kernels use with the device's
 * documented error, vector types with the device's alignment, and the
 * launch template behind LK_LAUNCH.
 *
 * Kernel code is compiled with GCC's ThreadSanitizer instrumentation
 * (tests/cudasim/sim_check.c implements its hooks): every load and store it
 * makes is seen by the emulator. This header's own helpers touch only
 * the calling thread's locals, so they add no accesses of their own.
 *
 * Static __shared__ variables become function-local statics, each after a
 * red zone (see __shared__ below). */
#ifndef CUSIM_DEVICE_H
#define CUSIM_DEVICE_H

#ifndef __cplusplus
#error "cusim_device.h is the device dialect: C++ only"
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

#include "cuda_runtime.h"
#include "../cusim.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __CUDA_ARCH__ 900

#define CUSIM_STR2(x) #x
#define CUSIM_STR(x) CUSIM_STR2(x)
#define CUSIM_SITE __FILE__ ":" CUSIM_STR(__LINE__)
#define CUSIM_CAT2(a, b) a##b
#define CUSIM_CAT(a, b) CUSIM_CAT2(a, b)

/* __shared__: a function-local static (one block runs at a time, so one
 * copy is the block's), after a 64-byte zero-initialised red zone. The
 * emulator finds both in the module's symbol table (local statics of the
 * kernels' C++ code: "_ZZ" names; red zones named cusim_rz_N), which
 * gives each shared variable its exact extent; an access that runs past
 * one lands in the next red zone. */
typedef struct cusim_redzone {
    uint32_t w[16];
} cusim_redzone;
#define __shared__                                                                                    \
    static __attribute__((used, aligned(16))) cusim_redzone CUSIM_CAT(cusim_rz_, __COUNTER__);        \
    static __attribute__((aligned(16)))

/* ---- coordinates --------------------------------------------------------- */
#define threadIdx (cusim_r.tid)
#define blockIdx (cusim_r.bid)
#define blockDim (cusim_r.bdim)
#define gridDim (cusim_r.gdim)
#define warpSize 32

/* ---- barriers and warp operations ---------------------------------------- */
#define __syncthreads() ((void)cusim_syncthreads(CUSIM_SITE, CUSIM_BAR, 0))
#define __syncthreads_or(p) cusim_syncthreads(CUSIM_SITE, CUSIM_BAR_OR, (p) != 0)
#define __syncthreads_and(p) cusim_syncthreads(CUSIM_SITE, CUSIM_BAR_AND, (p) != 0)
#define __syncthreads_count(p) cusim_syncthreads(CUSIM_SITE, CUSIM_BAR_COUNT, (p) != 0)
#define __syncwarp(...) cusim_syncwarp(CUSIM_SITE, ##__VA_ARGS__)

static inline void cusim_syncwarp(const char *site, unsigned mask = 0xffffffffu)
{
    (void)cusim_warp(site, CUSIM_W_SYNC, mask, 0, 0, 32, NULL);
}

template <class T> static inline T cusim_shfl(const char *site, int op, unsigned mask, T v, int param, int width)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffles move up to 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = cusim_warp(site, op, mask, bits, param, width, NULL);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}
#define __shfl_sync(m, v, ...) cusim_shfl_n(CUSIM_SITE, CUSIM_W_SHFL_IDX, m, v, __VA_ARGS__)
#define __shfl_up_sync(m, v, ...) cusim_shfl_n(CUSIM_SITE, CUSIM_W_SHFL_UP, m, v, __VA_ARGS__)
#define __shfl_down_sync(m, v, ...) cusim_shfl_n(CUSIM_SITE, CUSIM_W_SHFL_DOWN, m, v, __VA_ARGS__)
#define __shfl_xor_sync(m, v, ...) cusim_shfl_n(CUSIM_SITE, CUSIM_W_SHFL_XOR, m, v, __VA_ARGS__)
template <class T>
static inline T cusim_shfl_n(const char *site, int op, unsigned mask, T v, int param, int width = warpSize)
{
    return cusim_shfl<T>(site, op, mask, v, param, width);
}

#define __ballot_sync(m, p) ((unsigned)cusim_warp(CUSIM_SITE, CUSIM_W_BALLOT, m, (p) != 0, 0, 32, NULL))
#define __any_sync(m, p) (__ballot_sync(m, p) != 0u)
#define __all_sync(m, p) cusim_all(CUSIM_SITE, m, (p) != 0)
static inline int cusim_all(const char *site, unsigned mask, int p)
{
    return (unsigned)cusim_warp(site, CUSIM_W_BALLOT, mask, p, 0, 32, NULL) == mask;
}

/* ---- atomics --------------------------------------------------------------- */
template <class T> static inline uint64_t cusim_bits(T v)
{
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    return b;
}
template <class T> static inline T cusim_from_bits(uint64_t b)
{
    T v;
    memcpy(&v, &b, sizeof v);
    return v;
}
#define CUSIM_ATOMIC(name, T, op)                                                                    \
    static inline T name(T *p, T v)                                                                  \
    {                                                                                                \
        return cusim_from_bits<T>(cusim_atomic(p, sizeof(T), op, cusim_bits(v), 0, #name));          \
    }
CUSIM_ATOMIC(atomicAdd, int, CUSIM_A_ADD_I)
CUSIM_ATOMIC(atomicAdd, unsigned int, CUSIM_A_ADD_U)
CUSIM_ATOMIC(atomicAdd, unsigned long long, CUSIM_A_ADD_U)
CUSIM_ATOMIC(atomicAdd, float, CUSIM_A_ADD_F)
CUSIM_ATOMIC(atomicMax, int, CUSIM_A_MAX_I)
CUSIM_ATOMIC(atomicMax, unsigned int, CUSIM_A_MAX_U)
CUSIM_ATOMIC(atomicMin, int, CUSIM_A_MIN_I)
CUSIM_ATOMIC(atomicExch, int, CUSIM_A_EXCH)
CUSIM_ATOMIC(atomicExch, unsigned int, CUSIM_A_EXCH)
CUSIM_ATOMIC(atomicExch, float, CUSIM_A_EXCH)
static inline int atomicCAS(int *p, int compare, int v)
{
    return cusim_from_bits<int>(cusim_atomic(p, 4, CUSIM_A_CAS, cusim_bits(v), cusim_bits(compare), "atomicCAS"));
}

/* ---- vector types (the device's alignment) ---------------------------------- */
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
struct __attribute__((aligned(16))) uint4 { unsigned int x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned int x, y; };

/* ---- bit casts and integer rounding ------------------------------------------ */
static inline float __uint_as_float(unsigned int u) { return cusim_from_bits<float>(u); }
static inline unsigned int __float_as_uint(float f) { return (unsigned int)cusim_bits(f); }
static inline float __int_as_float(int i) { return cusim_from_bits<float>((uint32_t)i); }
static inline int __float_as_int(float f) { return (int)(uint32_t)cusim_bits(f); }
/* cvt.rni.s32.f32: nearest even, saturated, NaN 0 */
static inline int __float2int_rn(float f)
{
    if (f != f)
        return 0;
    float r = __builtin_rintf(f);
    return r >= 2147483648.0f ? 2147483647 : r < -2147483648.0f ? (-2147483647 - 1) : (int)r;
}
/* Operations the compiler must not contract into an FMA (nvcc's _rn
 * intrinsics): the empty asm makes the product opaque. */
static inline float __fmul_rn(float a, float b)
{
    float r = a * b;
    __asm__ volatile("" : "+x"(r));
    return r;
}
static inline float __fadd_rn(float a, float b)
{
    float r = a + b;
    __asm__ volatile("" : "+x"(r));
    return r;
}
static inline float __fsub_rn(float a, float b)
{
    float r = a - b;
    __asm__ volatile("" : "+x"(r));
    return r;
}
static inline float __fmaf_rn(float a, float b, float c) { return __builtin_fmaf(a, b, c); }

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned int min(unsigned int a, unsigned int b) { return a < b ? a : b; }
static inline unsigned int max(unsigned int a, unsigned int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }

/* ---- half and bfloat16 ------------------------------------------------------ */
struct __half {
    unsigned short __x;
};
struct __nv_bfloat16 {
    unsigned short __x;
};
typedef __half half;

/* float -> binary16, round to nearest even (cvt.rn.f16.f32): NaN is
 * 0x7fff, values from 65520 up are infinite, subnormals kept. */
static inline unsigned short cusim_f2h(float f)
{
    uint32_t x = (uint32_t)cusim_bits(f), u = x & 0x7fffffffu, sign = (x >> 16) & 0x8000u;
    if (u > 0x7f800000u)
        return 0x7fff;
    if (u >= 0x477ff000u) /* 65520 and up, and inf */
        return (unsigned short)(sign | 0x7c00u);
    uint32_t h, rem, halfway;
    if (u >= 0x38800000u) { /* normal half */
        uint32_t m = u - 0x38000000u;
        h = m >> 13, rem = m & 0x1fffu, halfway = 0x1000u;
    } else {
        uint32_t e = u >> 23, shift = 126u - e; /* value = mant * 2^(e - 150), unit 2^-24 */
        if (e == 0 || shift > 24)
            return (unsigned short)sign; /* below half the smallest subnormal (float subnormals too) */
        uint32_t mant = (u & 0x7fffffu) | 0x800000u;
        h = mant >> shift, rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    }
    if (rem > halfway || (rem == halfway && (h & 1u)))
        h++;
    return (unsigned short)(sign | h);
}

/* float -> bfloat16, round to nearest even (cvt.rn.bf16.f32); NaN 0x7fff. */
static inline unsigned short cusim_f2bf(float f)
{
    uint32_t x = (uint32_t)cusim_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return 0x7fff;
    return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

static inline __half __float2half_rn(float f) { return __half{cusim_f2h(f)}; }
static inline __half __float2half(float f) { return __half{cusim_f2h(f)}; }
static inline float __half2float(__half h) { return cusim_half_to_float(h.__x); }
static inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{cusim_f2bf(f)}; }
static inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16{cusim_f2bf(f)}; }
static inline float __bfloat162float(__nv_bfloat16 b) { return cusim_bf16_to_float(b.__x); }

/* ---- math with the device's error ------------------------------------------- */
/* Maximum ulp errors of CUDA's single-precision functions (CUDA C++
 * Programming Guide, "Mathematical Functions"): the emulator moves each
 * result within them, so a check that only passes on the host's libm
 * fails here as it could on a device. */
static inline float cusim_expf(float x) { return x == 0.f ? 1.f : cusim_ulp_err((expf)(x), x, 2); }
static inline float cusim_logf(float x) { return x == 1.f ? 0.f : cusim_ulp_err((logf)(x), x, 1); }
static inline float cusim_powf(float x, float y)
{
    return y == 0.f || x == 1.f ? 1.f : cusim_ulp_err((powf)(x, y), x * 0.5f + y, 4);
}
static inline void cusim_sincosf(float x, float *s, float *c)
{
    float sv, cv;
    (sincosf)(x, &sv, &cv);
    *s = x == 0.f ? x : cusim_ulp_err(sv, x, 2);
    *c = x == 0.f ? 1.f : cusim_ulp_err(cv, -x, 2);
}
static inline float cusim_sinf(float x) { return x == 0.f ? x : cusim_ulp_err((sinf)(x), x, 2); }
static inline float cusim_cosf(float x) { return x == 0.f ? 1.f : cusim_ulp_err((cosf)(x), -x, 2); }
static inline float cusim_tanhf(float x) { return x == 0.f ? x : cusim_ulp_err((tanhf)(x), x, 2); }
static inline float cusim_exp2f(float x) { return x == 0.f ? 1.f : cusim_ulp_err((exp2f)(x), x, 2); }
#define expf(x) cusim_expf(x)
#define logf(x) cusim_logf(x)
#define powf(x, y) cusim_powf(x, y)
#define sincosf(x, s, c) cusim_sincosf(x, s, c)
#define sinf(x) cusim_sinf(x)
#define cosf(x) cusim_cosf(x)
#define tanhf(x) cusim_tanhf(x)
#define exp2f(x) cusim_exp2f(x)

/* ---- launches ----------------------------------------------------------------- */
template <class F> static void cusim_invoke(const void *closure) { (*(const F *)closure)(); }

template <class... P> struct cusim_launcher {
    void (*fn)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    template <class... A> void operator()(A... args) const
    {
        void (*k)(P...) = fn;
        auto body = [=]() { k(args...); };
        static_assert(std::is_trivially_copyable<decltype(body)>::value, "kernel arguments are copied bytewise");
        (void)cusim_launch(name, (const void *)fn, grid, block, smem, stream, cusim_invoke<decltype(body)>, &body,
                           sizeof body);
    }
};

template <class... P>
static inline cusim_launcher<P...> cusim_launch_of(void (*fn)(P...), const char *name, dim3 grid, dim3 block,
                                                   size_t smem, cudaStream_t stream)
{
    return cusim_launcher<P...>{fn, name, grid, block, smem, stream};
}

#endif
