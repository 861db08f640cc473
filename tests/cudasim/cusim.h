/* cusim.h - what the device dialect (include/cusim_device.h) calls from
 * kernel code (coordinates, launches, collectives, atomics, math), and the
 * emulator's own tests' hooks. The code under test sees only the CUDA,
 * cuBLAS and NCCL names; the emulator's files share sim.h.
 *
 * The model (docs/internals/cudasim.md):
 *  - device memory lives in one arena per device, readable by the host
 *    only while the emulator executes device work (host code that
 *    dereferences a device pointer faults, as on a GPU);
 *  - work goes into per-stream queues and runs when the host must wait
 *    for it (a stream or device synchronisation, a copy back), in stream
 *    order, so a host that reads results without waiting reads stale data;
 *  - a kernel's blocks run one after another; a block's threads are fibers
 *    switched at barriers and warp operations; every load and store of
 *    kernel code is checked (bounds, alignment, shared-memory races and
 *    uninitialised reads, copies pending on other streams);
 *  - the first fault is reported (kernel, block, thread, address, source
 *    line) and is sticky, as on a device.
 *
 * Thread-safety: every entry takes the emulator's lock; device work runs
 * under it on the thread that waits for it. */
#ifndef CUSIM_H
#define CUSIM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cuda_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- half and bfloat16 bits to float --------------------------------------- */
/* Exact. The emulator's one copy (kernel dialect, wmma, cuBLAS), written
 * apart from engine/model/quant.c on purpose: a mistake shared with the CPU
 * backend could hide a host/device difference. */
static inline float cusim_half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 31)
        x = sign | 0x7f800000u | (m << 13);
    else if (e)
        x = sign | ((e + 112u) << 23) | (m << 13);
    else if (!m)
        x = sign;
    else { /* subnormal: m * 2^-24, normalised */
        int sh = 0;
        while (!(m & 0x400u)) m <<= 1, sh++;
        x = sign | ((uint32_t)(113 - sh) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static inline float cusim_bf16_to_float(uint16_t b)
{
    uint32_t x = (uint32_t)b << 16;
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

/* ---- what kernel code reads: the current thread's coordinates ---------- */
typedef struct cusim_regs {
    uint3 tid, bid, bdim, gdim;
} cusim_regs;
extern cusim_regs cusim_r;

/* ---- launches ------------------------------------------------------------ */
/* Enqueues a kernel launch: `invoke(closure)` runs one GPU thread (the
 * closure, copied here, holds the kernel and its arguments). Checks the
 * configuration as a device does; returns the launch error (also kept for
 * cudaGetLastError). */
cudaError_t cusim_launch(const char *name, const void *fn, uint3 grid, uint3 block, size_t smem, cudaStream_t s,
                         void (*invoke)(const void *closure), const void *closure, size_t closure_bytes);

/* ---- collectives, called from kernel code (site: "file:line") ----------- */
enum { CUSIM_BAR = 0, CUSIM_BAR_OR, CUSIM_BAR_AND, CUSIM_BAR_COUNT };
/* __syncthreads and its reductions; returns the reduction (or 0). */
int cusim_syncthreads(const char *site, int kind, int pred);

enum {
    CUSIM_W_SYNC = 0, /* __syncwarp: orders memory among the lanes */
    CUSIM_W_SHFL_IDX,
    CUSIM_W_SHFL_UP,
    CUSIM_W_SHFL_DOWN,
    CUSIM_W_SHFL_XOR,
    CUSIM_W_BALLOT,
    CUSIM_W_WMMA,     /* wmma load/store/fill: convergence only */
    CUSIM_W_MMA       /* wmma::mma_sync: data is a cusim_mma_args */
};
/* A warp collective: every lane of `mask` must reach the same one.
 * Shuffles return the source lane's bits; ballot the lanes' predicate
 * bits; the others 0. */
uint64_t cusim_warp(const char *site, int op, unsigned mask, uint64_t value, int param, int width, void *data);

/* One lane's operands of a 16x16x16 mma: row-major 16x16 tiles (A: m x
 * k, B: k x n, C/D: m x n), 8 elements per lane at [lane * 8, lane * 8 +
 * 8); a and b are half bits, c and d floats (d may be c). */
typedef struct cusim_mma_args {
    const uint16_t *a, *b;
    const float *c;
    float *d;
} cusim_mma_args;

/* The block's dynamic shared memory (extern __shared__). */
void *cusim_dynamic_shared(void);

/* Atomics on global or shared memory (checked like any access):
 * op CUSIM_A_*, 4- or 8-byte operands; returns the old value's bits. */
enum { CUSIM_A_ADD_I = 0, CUSIM_A_ADD_U, CUSIM_A_ADD_F, CUSIM_A_MAX_I, CUSIM_A_MIN_I, CUSIM_A_MAX_U, CUSIM_A_EXCH, CUSIM_A_CAS };
uint64_t cusim_atomic(void *p, int size, int op, uint64_t value, uint64_t compare, const char *site);

/* A kernel-side fault the dialect detects itself (a bad wmma pointer or
 * stride, a shuffle width). Does not return. */
void cusim_device_fault(const char *site, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));

/* Math with the device's documented error: the correctly rounded result
 * moved by a deterministic amount within max_ulp (CUSIM_MATH=exact: not
 * moved). */
float cusim_ulp_err(float exact, float x, int max_ulp);

/* ---- for the emulator's own tests -------------------------------------- */
/* The last fault's report ("" after cudaDeviceReset). */
const char *cusim_last_report(void);

#ifdef __cplusplus
}
#endif

#endif
