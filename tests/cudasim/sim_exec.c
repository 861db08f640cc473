/* sim_exec.c - kernel launches on the emulator: configuration checks at the
 * launch (as a device makes them), then, when the stream runs, the grid's
 * blocks one after another; a block's threads are fibers on one OS
 * thread, each run until it waits (a barrier, a warp operation) or ends.
 *
 * Barriers and warp operations are checked as the programming model
 * requires: every thread of the block reaches the same __syncthreads (a
 * thread that exits first, or waits at another one, is a fault); every
 * lane a mask names reaches the same warp operation (a lane that exited,
 * one that is not in its own mask, lanes at different operations, are
 * faults); a shuffle that reads a lane outside the mask is a fault. The
 * block's barrier epoch and each warp's __syncwarp epoch are what sim_check.c
 * orders shared-memory accesses by.
 *
 * wmma::mma_sync completes when the warp's last lane arrives: that lane
 * gathers every lane's fragment elements and computes D = A B + C with
 * FP32 accumulation in k order. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "fiber.h"
#include "sim.h"

cusim_regs cusim_r;
__thread int sim_in_kernel __attribute__((tls_model("initial-exec")));

enum { T_RUN, T_BAR, T_WARP, T_DONE };
#define STACK_BYTES ((size_t)64 << 10)
#define PAGE 4096

typedef struct gthread {
    fiber f;
    int tid, warp, lane, state;
    uint3 idx;
    uint64_t wval, wres;
    int wparam, wwidth;
    void *wdata;
} gthread;

typedef struct warp_op {
    int active, op;
    unsigned mask, arrived;
    const char *site;
} warp_op;

typedef struct block {
    gthread th[SIM_MAX_THREADS];
    int n, n_done, aborted;
    int stacks_dirty; /* a fiber was abandoned mid-call (AddressSanitizer's shadow of its stack is stale) */
    fiber sched;
    /* __syncthreads */
    int bar_arrived, bar_kind, bar_acc;
    const char *bar_site;
    unsigned bar_epoch;
    unsigned warp_epoch[SIM_MAX_THREADS / 32];
    warp_op wop[SIM_MAX_THREADS / 32];
    const sim_kernel *k;
    const void *closure;
    gthread *running;  /* the fiber that runs now (reports may name another thread) */
} block;

static block B;
static char *stacks; /* SIM_MAX_THREADS stacks, a guard page below each */
sim_exec sim_x;

/* ---- launch --------------------------------------------------------------- */

static void kernel_run(sim_op *op) { sim_run_kernel(SIM_PAYLOAD(op, sim_kernel)); }
static const sim_op_kind kernel_kind = {"kernel", kernel_run, NULL, NULL, NULL};

static int max_dynamic_smem(const void *fn)
{
    for (int i = 0; i < sim.n_attrs; i++)
        if (sim.attrs[i].fn == fn)
            return sim.attrs[i].max_dyn > SIM_SMEM_DEFAULT ? sim.attrs[i].max_dyn : SIM_SMEM_DEFAULT;
    return SIM_SMEM_DEFAULT;
}

static cudaError_t launch_check(const char *name, const void *fn, uint3 g, uint3 b, size_t smem)
{
    unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
    const char *why = NULL;
    cudaError_t e = cudaErrorInvalidConfiguration;
    if (!g.x || !g.y || !g.z)
        why = "a grid dimension is 0";
    else if (g.x > 0x7fffffffu || g.y > 65535u || g.z > 65535u)
        why = "the grid is larger than the device allows";
    else if (!b.x || !b.y || !b.z || b.x > SIM_MAX_THREADS || b.y > SIM_MAX_THREADS || b.z > 64u || threads > SIM_MAX_THREADS)
        why = "the block shape is not between 1 and 1,024 threads";
    else if (smem > (size_t)max_dynamic_smem(fn))
        why = "the dynamic shared memory is over the kernel's limit", e = cudaErrorInvalidValue;
    if (!why)
        return cudaSuccess;
    if (!sim.quiet)
        fprintf(stderr, "cudasim: launch of %s refused: %s (grid %u,%u,%u block %u,%u,%u smem %zu)\n", name, why, g.x,
                g.y, g.z, b.x, b.y, b.z, smem);
    return e;
}

cudaError_t cusim_launch(const char *name, const void *fn, uint3 grid, uint3 blk, size_t smem, cudaStream_t st,
                         void (*invoke)(const void *closure), const void *closure, size_t closure_bytes)
{
    sim_lock();
    cudaError_t e = sim_prologue();
    if (!e)
        e = sim_injected("cusim_launch");
    if (!e)
        e = launch_check(name, fn, grid, blk, smem);
    sim_op *op = e ? NULL : sim_op_new(&kernel_kind, sizeof(sim_kernel) + closure_bytes);
    if (!e && !op)
        e = cudaErrorMemoryAllocation;
    if (!e) {
        sim_kernel *k = SIM_PAYLOAD(op, sim_kernel);
        *k = (sim_kernel){name, fn, grid, blk, smem, invoke, closure_bytes};
        memcpy(k + 1, closure, closure_bytes);
        sim_enqueue(sim_stream_of(st), op);
    }
    sim_unlock();
    return sim_set_error(e);
}

/* ---- threads ----------------------------------------------------------------- */

static int stacks_init(void)
{
    if (stacks)
        return 0;
    size_t per = STACK_BYTES + PAGE;
    void *p = mmap(NULL, per * SIM_MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED)
        return -1;
    for (int i = 0; i < SIM_MAX_THREADS; i++)
        if (mprotect((char *)p + per * (size_t)i, PAGE, PROT_NONE)) { /* a guard page: an overflow must fault */
            munmap(p, per * SIM_MAX_THREADS);
            return -1;
        }
    stacks = p;
    return 0;
}

/* Makes t the running GPU thread (what kernel code and the checks see). */
static void enter_thread(gthread *t)
{
    B.running = t;
    sim_x.cur_tid = t->tid;
    sim_x.cur_warp = t->warp;
    sim_x.stk_lo = (uintptr_t)t->f.stack;
    sim_x.stk_hi = (uintptr_t)t->f.stack + t->f.size;
    sim_in_kernel = 1;
    cusim_r.tid = t->idx;
}

static void thread_main(void *arg)
{
    gthread *t = arg;
    fiber_started(&B.sched);
    B.k->invoke(B.closure);
    sim_in_kernel = 0;
    if (B.bar_arrived)
        sim_block_faultf(-1, cudaErrorIllegalInstruction, NULL, "thread (%u,%u,%u) exited while %d others wait at __syncthreads (%s)",
                        t->idx.x, t->idx.y, t->idx.z, B.bar_arrived, B.bar_site);
    warp_op *o = &B.wop[t->warp];
    if (o->active && (o->mask >> t->lane & 1u))
        sim_block_faultf(-1, cudaErrorIllegalInstruction, NULL, "lane %d exited; lanes 0x%08x wait for it at %s (mask 0x%08x)",
                        t->lane, o->arrived, o->site, o->mask);
    t->state = T_DONE;
    B.n_done++;
    fiber_switch(&t->f, &B.sched, 1);
}

/* Back to the scheduler until this thread may go on. */
static void wait_here(gthread *t)
{
    sim_in_kernel = 0;
    fiber_switch(&t->f, &B.sched, 0);
}

static gthread *cur(void) { return &B.th[sim_x.cur_tid]; }

/* A fault in the running block: reported (sim_check.c), the block abandoned
 * (the current fiber is never resumed). */
void sim_block_abort(void)
{
    sim_in_kernel = 0;
    B.aborted = 1;
    B.stacks_dirty = 1;
    fiber_switch(&B.running->f, &B.sched, 1);
    abort(); /* not reached: an abandoned fiber is never resumed */
}

/* The one way a block is abandoned for a fault: the report names thread
 * tid (-1: the running one; a collective that the last lane completes may
 * find another lane at fault) and, with pc, the source line. */
void sim_block_faultf(int tid, cudaError_t e, void *pc, const char *fmt, ...)
{
    char msg[1600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sim_in_kernel = 0;
    if (tid >= 0) {
        sim_x.cur_tid = tid;
        sim_x.cur_warp = tid / 32;
    }
    sim_fault_in_kernel(e, pc, "%s", msg);
    sim_block_abort();
}

void cusim_device_fault(const char *site, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    sim_block_faultf(-1, cudaErrorMisalignedAddress, NULL, "%s at %s", msg, site);
}

/* ---- __syncthreads --------------------------------------------------------- */

int cusim_syncthreads(const char *site, int kind, int pred)
{
    gthread *t = cur();
    sim_in_kernel = 0;
    if (B.n_done)
        sim_block_faultf(-1, cudaErrorIllegalInstruction, NULL, "__syncthreads at %s: %d thread(s) of the block already exited",
                        site, B.n_done);
    if (!B.bar_arrived) {
        B.bar_site = site;
        B.bar_kind = kind;
        B.bar_acc = kind == CUSIM_BAR_AND ? 1 : 0;
    } else if (strcmp(B.bar_site, site) || B.bar_kind != kind) {
        sim_block_faultf(-1, cudaErrorIllegalInstruction, NULL,
                        "thread (%u,%u,%u) reached __syncthreads at %s while %d thread(s) wait at the one at %s",
                        t->idx.x, t->idx.y, t->idx.z, site, B.bar_arrived, B.bar_site);
    }
    if (kind == CUSIM_BAR_OR)
        B.bar_acc |= pred;
    else if (kind == CUSIM_BAR_AND)
        B.bar_acc &= pred;
    else if (kind == CUSIM_BAR_COUNT)
        B.bar_acc += pred;
    if (++B.bar_arrived == B.n) { /* the last one releases the block */
        for (int i = 0; i < B.n; i++)
            if (B.th[i].state == T_BAR)
                B.th[i].state = T_RUN;
        if (sim_check_interval_end())
            sim_block_abort();
        B.bar_epoch++;
        sim_x.bar_epoch = B.bar_epoch;
        B.bar_arrived = 0;
        t->wres = (uint64_t)B.bar_acc;
        for (int i = 0; i < B.n; i++) B.th[i].wres = (uint64_t)B.bar_acc;
    } else {
        t->state = T_BAR;
        wait_here(t);
    }
    enter_thread(t);
    return (int)t->wres;
}

/* ---- warp operations ---------------------------------------------------------- */

static const char *wop_name(int op)
{
    static const char *n[] = {"__syncwarp", "__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                              "__shfl_xor_sync", "__ballot_sync", "a wmma operation", "wmma::mma_sync"};
    return op >= 0 && op < 8 ? n[op] : "a warp operation";
}

/* Source lane of lane l for a shuffle (CUDA's width rules); l itself when
 * the source lies in a later group. */
static int shfl_src(int op, int l, int param, int width)
{
    int base = l / width * width, src;
    switch (op) {
    case CUSIM_W_SHFL_IDX: return base + ((param % width) + width) % width;
    case CUSIM_W_SHFL_UP: src = l - param; return src < base ? l : src;
    case CUSIM_W_SHFL_DOWN: src = l + param; return src >= base + width ? l : src;
    default: src = l ^ param; return src >= base + width || src > 31 ? l : src;
    }
}

/* D = A B + C over the warp's fragments (row-major tiles, lane l holds
 * elements [8l, 8l + 8)). */
static void mma_complete(int w)
{
    float A[256], Bm[256], C[256];
    for (int l = 0; l < 32; l++) {
        const cusim_mma_args *m = B.th[w * 32 + l].wdata;
        for (int e = 0; e < 8; e++) {
            A[l * 8 + e] = cusim_half_to_float(m->a[e]);
            Bm[l * 8 + e] = cusim_half_to_float(m->b[e]);
            C[l * 8 + e] = m->c[e];
        }
    }
    for (int l = 0; l < 32; l++) {
        cusim_mma_args *m = B.th[w * 32 + l].wdata;
        for (int e = 0; e < 8; e++) {
            int i = (l * 8 + e) / 16, j = (l * 8 + e) % 16;
            float acc = C[i * 16 + j];
            for (int k = 0; k < 16; k++) acc += A[i * 16 + k] * Bm[k * 16 + j];
            m->d[e] = acc;
        }
    }
}

static void warp_complete(int w, warp_op *o)
{
    unsigned mask = o->mask;
    if (o->op == CUSIM_W_SYNC) {
        B.warp_epoch[w]++;
    } else if (o->op == CUSIM_W_BALLOT) {
        unsigned bits = 0;
        for (int l = 0; l < 32; l++)
            if ((mask >> l & 1u) && B.th[w * 32 + l].wval)
                bits |= 1u << l;
        for (int l = 0; l < 32; l++) B.th[w * 32 + l].wres = bits;
    } else if (o->op == CUSIM_W_MMA) {
        mma_complete(w);
    } else if (o->op != CUSIM_W_WMMA) {
        for (int l = 0; l < 32; l++) {
            if (!(mask >> l & 1u))
                continue;
            gthread *t = &B.th[w * 32 + l];
            int width = t->wwidth;
            if (width < 1 || width > 32 || (width & (width - 1)))
                sim_block_faultf(t->tid, cudaErrorIllegalInstruction, NULL, "%s at %s: width %d is not a power of two up to 32",
                                wop_name(o->op), o->site, width);
            int src = shfl_src(o->op, l, t->wparam, width);
            if (!(mask >> src & 1u))
                sim_block_faultf(t->tid, cudaErrorIllegalInstruction, NULL,
                                "%s at %s: lane %d reads lane %d, which is not in the mask 0x%08x", wop_name(o->op),
                                o->site, l, src, mask);
            t->wres = B.th[w * 32 + src].wval;
        }
    }
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1u) && B.th[w * 32 + l].state == T_WARP)
            B.th[w * 32 + l].state = T_RUN;
    o->active = 0;
    sim_x.warp_epoch[w] = B.warp_epoch[w];
}

uint64_t cusim_warp(const char *site, int op, unsigned mask, uint64_t value, int param, int width, void *data)
{
    gthread *t = cur();
    sim_in_kernel = 0;
    int w = t->warp, lanes = B.n - w * 32 < 32 ? B.n - w * 32 : 32;
    unsigned exist = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    if (!(mask >> t->lane & 1u))
        sim_block_faultf(-1, cudaErrorIllegalInstruction, NULL, "%s at %s: lane %d of warp %d is not in its own mask 0x%08x",
                        wop_name(op), site, t->lane, w, mask);
    if (mask & ~exist)
        sim_block_faultf(-1, cudaErrorIllegalInstruction, NULL, "%s at %s: mask 0x%08x names lanes the warp does not have (0x%08x)",
                        wop_name(op), site, mask, exist);
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1u) && B.th[w * 32 + l].state == T_DONE)
            sim_block_faultf(-1, cudaErrorIllegalInstruction, NULL, "%s at %s: mask 0x%08x names lane %d of warp %d, which exited",
                            wop_name(op), site, mask, l, w);
    warp_op *o = &B.wop[w];
    if (!o->active) {
        *o = (warp_op){1, op, mask, 0, site};
    } else if (o->mask != mask || o->op != op || strcmp(o->site, site)) {
        sim_block_faultf(-1, cudaErrorIllegalInstruction, NULL,
                        "warp %d: lane %d reached %s at %s (mask 0x%08x) while lanes 0x%08x wait at %s at %s (mask 0x%08x)",
                        w, t->lane, wop_name(op), site, mask, o->arrived, wop_name(o->op), o->site, o->mask);
    }
    t->wval = value;
    t->wparam = param;
    t->wwidth = width;
    t->wdata = data;
    o->arrived |= 1u << t->lane;
    if (o->arrived == mask)
        warp_complete(w, o);
    else {
        t->state = T_WARP;
        wait_here(t);
    }
    enter_thread(t);
    return t->wres;
}

/* ---- blocks ------------------------------------------------------------------- */

/* No thread can run and some have not finished: say who waits for what. */
static void deadlock(void)
{
    char msg[768] = "";
    if (B.bar_arrived) {
        snprintf(msg, sizeof msg, "%d of %d threads wait at __syncthreads (%s); the others wait at warp operations",
                 B.bar_arrived, B.n, B.bar_site);
    } else {
        for (int w = 0; w < (B.n + 31) / 32; w++)
            if (B.wop[w].active) {
                snprintf(msg, sizeof msg, "warp %d: lanes 0x%08x wait at %s (%s, mask 0x%08x) for lanes that never come",
                         w, B.wop[w].arrived, wop_name(B.wop[w].op), B.wop[w].site, B.wop[w].mask);
                break;
            }
    }
    sim_fault_in_kernel(cudaErrorIllegalInstruction, NULL, "deadlock: %s", msg[0] ? msg : "no thread can go on");
    B.aborted = 1;
}

static void run_block(sim_kernel *k, uint3 bid)
{
    uint3 bd = k->block;
    B.n = (int)(bd.x * bd.y * bd.z);
    sim.stats.blocks++;
    sim.stats.threads += (unsigned long long)B.n;
    B.n_done = B.aborted = B.bar_arrived = 0;
    B.bar_epoch = 0;
    memset(B.warp_epoch, 0, sizeof B.warp_epoch);
    memset(B.wop, 0, sizeof B.wop);
    B.k = k;
    B.closure = k + 1;
    sim_x.bar_epoch = 0;
    memset(sim_x.warp_epoch, 0, sizeof sim_x.warp_epoch);
    sim_x.block_serial++;
    sim_x.bid = bid;
    sim_check_block_begin();
    cusim_r.bid = bid;
    for (int i = 0; i < B.n; i++) {
        gthread *t = &B.th[i];
        t->tid = i, t->warp = i / 32, t->lane = i % 32, t->state = T_RUN;
        t->idx = (uint3){(unsigned)i % bd.x, (unsigned)i / bd.x % bd.y, (unsigned)i / (bd.x * bd.y)};
        t->f.stack = stacks + (STACK_BYTES + PAGE) * (size_t)i + PAGE;
        t->f.size = STACK_BYTES;
        fiber_make(&t->f, thread_main, t);
    }
    while (B.n_done < B.n && !B.aborted) {
        int ran = 0;
        for (int i = 0; i < B.n && !B.aborted; i++)
            if (B.th[i].state == T_RUN) {
                sim.stats.switches++;
                enter_thread(&B.th[i]);
                fiber_switch(&B.sched, &B.th[i].f, 0);
                sim_in_kernel = 0;
                ran = 1;
            }
        if (!ran && !B.aborted && B.n_done < B.n)
            deadlock();
    }
    if (!B.aborted && sim_check_interval_end())
        B.aborted = 1;
}

void sim_run_kernel(sim_kernel *k)
{
    if (stacks_init()) {
        sim_fault(cudaErrorLaunchOutOfResources, "no memory for the emulator's thread stacks");
        return;
    }
    sim.stats.kernels++;
    B.sched.stack = NULL; /* the scheduler runs on this OS thread's stack (fiber_started records it for ASan) */
    sim_x.k = k;
    sim_x.closure_lo = (uintptr_t)(k + 1);
    sim_x.closure_hi = sim_x.closure_lo + k->closure_bytes;
    /* dynamic shared memory starts 128-byte aligned, as after a device's static shared memory */
    char *dyn = k->smem ? aligned_alloc(128, (k->smem + 127) / 128 * 128) : NULL;
    if (k->smem && !dyn) {
        sim_fault(cudaErrorLaunchOutOfResources, "no memory for %zu bytes of dynamic shared memory", k->smem);
        return;
    }
    sim_x.dyn_lo = (uintptr_t)dyn;
    sim_x.dyn_hi = (uintptr_t)dyn + k->smem;
    sim_shadow_dyn(k->smem);
    cusim_r.bdim = k->block;
    cusim_r.gdim = k->grid;
    for (unsigned z = 0; z < k->grid.z && !sim.sticky; z++)
        for (unsigned y = 0; y < k->grid.y && !sim.sticky; y++)
            for (unsigned x = 0; x < k->grid.x && !sim.sticky; x++) run_block(k, (uint3){x, y, z});
    free(dyn);
    sim_x.dyn_lo = sim_x.dyn_hi = 0;
    sim_x.k = NULL;
}

/* With no dynamic shared memory, a pointer that is no memory the kernel
 * may touch (just past the launch's arguments): any access through it is
 * an illegal address. */
void *cusim_dynamic_shared(void) { return (void *)(sim_x.dyn_lo ? sim_x.dyn_lo : sim_x.closure_hi); }
