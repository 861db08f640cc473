/* sim_runtime.c - the CUDA runtime calls of the emulator (cuda_runtime.h):
 * devices, device memory, copies, streams, errors (capture and graphs:
 * sim_graph.c). Semantics follow NVIDIA's documentation ("API synchronization
 * behavior", stream capture rules):
 *
 *  - Device memory comes from one arena per device, mapped PROT_NONE
 *    whenever no device work runs: host code that dereferences a device
 *    pointer gets SIGSEGV (and sim_check.c's report), as it would with a GPU.
 *    New allocations up to 64 MiB are filled with 0xff bytes (a NaN in
 *    every float); larger ones read as zero where their pages are fresh.
 *    Freed memory is quarantined a while, so late use is caught.
 *  - Work is queued per stream and runs only when the host has to wait for
 *    it (stream or device synchronisation, a copy to pageable host memory,
 *    cudaFree), in order. A synchronous copy from pageable host memory
 *    leaves its DMA pending, as documented; non-blocking streams are not
 *    ordered with the NULL stream, and a kernel that touches memory a
 *    queued copy on another stream will write is a reported hazard.
 *  - During a thread-local or global capture the capturing thread may not
 *    make unsafe calls (allocation, synchronous copies, synchronisation):
 *    they fail and invalidate the capture.
 *  - A device fault is sticky: every later call returns it (until
 *    cudaDeviceReset, which the emulator's tests use). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "sim.h"

sim_state sim = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
static __thread int tl_dev;
static __thread cudaError_t tl_err;

void sim_lock(void) { pthread_mutex_lock(&sim.mu); }
void sim_unlock(void) { pthread_mutex_unlock(&sim.mu); }
int sim_cur_dev(void) { return tl_dev; }

static void inject_parse(void);

static void print_stats(void)
{
    fprintf(stderr, "cudasim: %llu kernels (%llu graph launches), %llu blocks, %llu GPU threads, %llu fiber switches, "
                    "%llu checked accesses\n",
            sim.stats.kernels, sim.stats.graphs, sim.stats.blocks, sim.stats.threads, sim.stats.switches,
            sim.stats.accesses);
}

static long env_long(const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) {
        fprintf(stderr, "cudasim: %s=%s is not in [%ld, %ld]; using %ld\n", name, v, lo, hi, dflt);
        return dflt;
    }
    return x;
}

/* Reserves each device's arena (address space only: pages are touched by
 * use) and reads the settings:
 *   CUSIM_DEVICES  devices (1-8, default 2)
 *   CUSIM_MEM_MB   memory per device (default 4096)
 *   CUSIM_MATH     "exact": math without the device's error
 *   CUSIM_POISON   0: new allocations are not filled
 *   CUSIM_QUIET    1: fault reports are kept, not printed */
static void sim_init(void)
{
    sim.n_devs = (int)env_long("CUSIM_DEVICES", 2, 1, SIM_MAX_DEVS);
    sim.mem_bytes = (size_t)env_long("CUSIM_MEM_MB", 4096, 64, 1 << 20) << 20;
    const char *m = getenv("CUSIM_MATH");
    sim.math_exact = m && !strcmp(m, "exact");
    sim.poison = env_long("CUSIM_POISON", 1, 0, 1) != 0;
    sim.quiet = env_long("CUSIM_QUIET", 0, 0, 1) != 0;
    inject_parse();
    if (env_long("CUSIM_STATS", 0, 0, 1))
        atexit(print_stats);
    for (int d = 0; d < sim.n_devs; d++) {
        sim_dev *dv = &sim.dev[d];
        dv->total = sim.mem_bytes;
        dv->arena_bytes = sim.mem_bytes + ((size_t)64 << 20);
        void *p = mmap(NULL, dv->arena_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        dv->arena = p == MAP_FAILED ? NULL : p;
        if (!dv->arena) /* every cudaMalloc on it will say out of memory: say why once */
            fprintf(stderr, "cudasim: device %d: cannot reserve %zu MiB of address space: %s\n", d, dv->arena_bytes >> 20,
                    strerror(errno));
        dv->legacy = (sim_stream){.dev = d, .legacy = 1};
    }
    sim_check_init();
    sim.init = 1;
}

cudaError_t sim_set_error(cudaError_t e)
{
    if (e != cudaSuccess)
        tl_err = e;
    return e;
}

/* ---- injected failures ----------------------------------------------------- */

/* CUSIM_FAIL=NAME:N[,NAME:N...]: the Nth call (1: the first) of NAME
 * fails, with the error that call would plausibly give, so the error
 * paths of the code under test can be driven; other calls are untouched.
 * NAME is any emulated call (cudaStreamBeginCapture, cudaGraphLaunch,
 * cudaMalloc, cublasGemmEx, ncclAllReduce, cusim_launch for a kernel
 * launch...). */
static struct {
    char name[48];
    long nth, seen;
} inject[8];
static int n_inject;

static void inject_parse(void)
{
    const char *v = getenv("CUSIM_FAIL");
    while (v && *v && n_inject < 8) {
        const char *colon = strchr(v, ':'), *comma = strchr(v, ',');
        if (!colon || (comma && comma < colon) || colon - v >= 48) {
            fprintf(stderr, "cudasim: CUSIM_FAIL=%s: want NAME:N[,NAME:N]\n", getenv("CUSIM_FAIL"));
            return;
        }
        memcpy(inject[n_inject].name, v, (size_t)(colon - v));
        inject[n_inject].name[colon - v] = 0;
        char *end;
        long nth = strtol(colon + 1, &end, 10);
        if (nth < 1 || (*end && *end != ',')) {
            fprintf(stderr, "cudasim: CUSIM_FAIL=%s: the call number must be 1 or more\n", getenv("CUSIM_FAIL"));
            return;
        }
        inject[n_inject++].nth = nth;
        v = comma ? comma + 1 : NULL;
    }
}

cudaError_t sim_injected(const char *name)
{
    for (int i = 0; i < n_inject; i++)
        if (!strcmp(inject[i].name, name) && ++inject[i].seen == inject[i].nth) {
            if (!sim.quiet)
                fprintf(stderr, "cudasim: call %ld of %s fails (CUSIM_FAIL)\n", inject[i].nth, name);
            if (!strcmp(name, "cudaMalloc") || !strcmp(name, "cudaMallocHost"))
                return cudaErrorMemoryAllocation;
            if (!strcmp(name, "cudaStreamBeginCapture"))
                return cudaErrorStreamCaptureUnsupported;
            if (!strcmp(name, "cudaGraphLaunch") || !strcmp(name, "cusim_launch"))
                return cudaErrorLaunchFailure;
            return cudaErrorUnknown;
        }
    return cudaSuccess;
}

/* Every call starts here (lock held): first use sets up; a device fault
 * answers every call. */
cudaError_t sim_prologue(void)
{
    if (!sim.init)
        sim_init();
    return sim.sticky;
}

/* ---- errors ---------------------------------------------------------------- */

static const struct {
    cudaError_t e;
    const char *name, *text;
} errs[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration", "invalid configuration argument"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction", "invalid device function"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorLaunchOutOfResources, "cudaErrorLaunchOutOfResources", "too many resources requested for launch"},
    {cudaErrorHardwareStackError, "cudaErrorHardwareStackError", "hardware stack error"},
    {cudaErrorIllegalInstruction, "cudaErrorIllegalInstruction", "an illegal instruction was encountered"},
    {cudaErrorMisalignedAddress, "cudaErrorMisalignedAddress", "misaligned address"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureUnmatched, "cudaErrorStreamCaptureUnmatched", "capture was not initiated in this stream"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char *cudaGetErrorString(cudaError_t e)
{
    for (size_t i = 0; i < sizeof errs / sizeof *errs; i++)
        if (errs[i].e == e)
            return errs[i].text;
    return "unrecognized error code";
}

const char *cudaGetErrorName(cudaError_t e)
{
    for (size_t i = 0; i < sizeof errs / sizeof *errs; i++)
        if (errs[i].e == e)
            return errs[i].name;
    return "cudaErrorUnknown";
}

cudaError_t cudaGetLastError(void)
{
    sim_lock();
    cudaError_t e = sim.sticky ? sim.sticky : tl_err;
    tl_err = cudaSuccess;
    sim_unlock();
    return e;
}

cudaError_t cudaPeekAtLastError(void)
{
    sim_lock();
    cudaError_t e = sim.sticky ? sim.sticky : tl_err;
    sim_unlock();
    return e;
}

/* ---- the allocation table ------------------------------------------------- */

static int alloc_index(uintptr_t a) /* first allocation with base > a */
{
    int lo = 0, hi = sim.n_allocs;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (sim.allocs[mid]->base <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

sim_alloc *sim_find(uintptr_t a)
{
    int i = alloc_index(a) - 1;
    if (i < 0)
        return NULL;
    sim_alloc *al = sim.allocs[i];
    return a - al->base < (al->bytes ? al->bytes : 1) ? al : NULL;
}

sim_alloc *sim_nearest(uintptr_t a, long *dist)
{
    int i = alloc_index(a);
    sim_alloc *before = i > 0 ? sim.allocs[i - 1] : NULL, *after = i < sim.n_allocs ? sim.allocs[i] : NULL;
    long db = before ? (long)(a - (before->base + before->bytes)) : -1, da = after ? (long)(after->base - a) : -1;
    if (before && (!after || db <= da)) {
        *dist = db; /* bytes past the end */
        return before;
    }
    *dist = -da; /* bytes before the start */
    return after;
}

int sim_was_freed(uintptr_t a, size_t *bytes)
{
    for (int i = 0; i < SIM_FREED_RING; i++)
        if (sim.freed[i].bytes && a - sim.freed[i].base < sim.freed[i].bytes) {
            *bytes = sim.freed[i].bytes;
            return 1;
        }
    return 0;
}

static int table_add(sim_alloc *al)
{
    if (sim.n_allocs == sim.cap_allocs) {
        int cap = sim.cap_allocs ? 2 * sim.cap_allocs : 64;
        if (cap > SIM_MAX_TABLE)
            return -1;
        sim_alloc **t = realloc(sim.allocs, sizeof *t * (size_t)cap);
        if (!t)
            return -1;
        sim.allocs = t;
        sim.cap_allocs = cap;
    }
    int i = alloc_index(al->base);
    memmove(sim.allocs + i + 1, sim.allocs + i, sizeof *sim.allocs * (size_t)(sim.n_allocs - i));
    sim.allocs[i] = al;
    sim.n_allocs++;
    return 0;
}

static void table_remove(sim_alloc *al)
{
    sim_check_forget(al);
    int i = alloc_index(al->base) - 1;
    memmove(sim.allocs + i, sim.allocs + i + 1, sizeof *sim.allocs * (size_t)(sim.n_allocs - i - 1));
    sim.n_allocs--;
    sim.freed[sim.freed_next].base = al->base;
    sim.freed[sim.freed_next].bytes = al->bytes ? al->bytes : 1;
    sim.freed_next = (sim.freed_next + 1) % SIM_FREED_RING;
}

/* ---- arenas ------------------------------------------------------------------ */

static void pinned_apply(sim_alloc *al);

static void pinned_apply_all(void)
{
    for (int i = 0; i < sim.n_allocs; i++)
        if (sim.allocs[i]->dev < 0)
            pinned_apply(sim.allocs[i]);
}

/* Every device arena readable and writable (device work runs), or not at
 * all (host code runs). A failure is a fault: device work would crash, or
 * host code touching device memory would go unseen. */
static void arenas_protect(int prot)
{
    for (int d = 0; d < sim.n_devs; d++)
        if (sim.dev[d].arena && mprotect(sim.dev[d].arena, sim.dev[d].arena_bytes, prot))
            sim_fault(cudaErrorUnknown, "mprotect of device %d's memory: %s", d, strerror(errno));
}

void sim_exec_enter(void)
{
    if (sim.exec_depth++ == 0) {
        arenas_protect(PROT_READ | PROT_WRITE);
        pinned_apply_all();
    }
}

void sim_exec_leave(void)
{
    if (--sim.exec_depth == 0) {
        arenas_protect(PROT_NONE);
        pinned_apply_all();
    }
}

/* First fit in the sorted free list; the arena's tail is free from the
 * start (the list's one initial extent). */
static int arena_take(sim_dev *dv, size_t span, size_t *off)
{
    if (!dv->n_free && !dv->used && !dv->quar_bytes) {
        if (!dv->cap_free) {
            dv->free_list = malloc(sizeof *dv->free_list * 16);
            if (!dv->free_list)
                return -1;
            dv->cap_free = 16;
        }
        dv->free_list[0].off = 0;
        dv->free_list[0].len = dv->total;
        dv->n_free = 1;
    }
    for (int i = 0; i < dv->n_free; i++)
        if (dv->free_list[i].len >= span) {
            *off = dv->free_list[i].off;
            dv->free_list[i].off += span;
            dv->free_list[i].len -= span;
            if (!dv->free_list[i].len) {
                memmove(dv->free_list + i, dv->free_list + i + 1, sizeof *dv->free_list * (size_t)(dv->n_free - i - 1));
                dv->n_free--;
            }
            return 0;
        }
    return -1;
}

static void arena_give(sim_dev *dv, size_t off, size_t len)
{
    if (len >= ((size_t)1 << 20))
        madvise(dv->arena + off, len, MADV_DONTNEED); /* the pages go back; they read as zero later */
    int i = 0;
    while (i < dv->n_free && dv->free_list[i].off < off) i++;
    if (i > 0 && dv->free_list[i - 1].off + dv->free_list[i - 1].len == off) {
        dv->free_list[i - 1].len += len;
        if (i < dv->n_free && off + len == dv->free_list[i].off) {
            dv->free_list[i - 1].len += dv->free_list[i].len;
            memmove(dv->free_list + i, dv->free_list + i + 1, sizeof *dv->free_list * (size_t)(dv->n_free - i - 1));
            dv->n_free--;
        }
        return;
    }
    if (i < dv->n_free && off + len == dv->free_list[i].off) {
        dv->free_list[i].off = off;
        dv->free_list[i].len += len;
        return;
    }
    if (dv->n_free == dv->cap_free) {
        int cap = 2 * dv->cap_free;
        if (cap > SIM_MAX_TABLE)
            return; /* the extent is lost to this run: memory never handed out twice */
        void *p = realloc(dv->free_list, sizeof *dv->free_list * (size_t)cap);
        if (!p)
            return; /* the extent is lost to this run: memory never handed out twice */
        dv->free_list = p;
        dv->cap_free = cap;
    }
    memmove(dv->free_list + i + 1, dv->free_list + i, sizeof *dv->free_list * (size_t)(dv->n_free - i));
    dv->free_list[i].off = off;
    dv->free_list[i].len = len;
    dv->n_free++;
}

/* Freed extents wait in a FIFO (up to an eighth of the device, 256 MiB at
 * most) before they are reused, so a late access finds no allocation. */
static void arena_quarantine(sim_dev *dv, size_t off, size_t len)
{
    size_t limit = dv->total / 8 < ((size_t)256 << 20) ? dv->total / 8 : ((size_t)256 << 20);
    if (dv->n_quar == dv->cap_quar) {
        int cap = dv->cap_quar ? 2 * dv->cap_quar : 64;
        if (cap > SIM_MAX_TABLE) {
            arena_give(dv, off, len);
            return;
        }
        void *p = realloc(dv->quarantine, sizeof *dv->quarantine * (size_t)cap);
        if (!p) {
            arena_give(dv, off, len);
            return;
        }
        dv->quarantine = p;
        dv->cap_quar = cap;
    }
    dv->quarantine[dv->n_quar].off = off;
    dv->quarantine[dv->n_quar].len = len;
    dv->n_quar++;
    dv->quar_bytes += len;
    while (dv->quar_bytes > limit && dv->n_quar) {
        arena_give(dv, dv->quarantine[0].off, dv->quarantine[0].len);
        dv->quar_bytes -= dv->quarantine[0].len;
        memmove(dv->quarantine, dv->quarantine + 1, sizeof *dv->quarantine * (size_t)(dv->n_quar - 1));
        dv->n_quar--;
    }
}

/* ---- devices --------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *n)
{
    ENTER();
    *n = sim.n_devs;
    LEAVE(cudaSuccess);
}

cudaError_t cudaSetDevice(int dev)
{
    ENTER();
    if (dev < 0 || dev >= sim.n_devs)
        LEAVE(cudaErrorInvalidDevice);
    tl_dev = dev;
    LEAVE(cudaSuccess);
}

cudaError_t cudaGetDevice(int *dev)
{
    ENTER();
    *dev = tl_dev;
    LEAVE(cudaSuccess);
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev)
{
    ENTER();
    if (!p)
        LEAVE(cudaErrorInvalidValue);
    if (dev < 0 || dev >= sim.n_devs)
        LEAVE(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "NVIDIA H200 (cudasim)");
    p->totalGlobalMem = sim.dev[dev].total;
    p->sharedMemPerBlock = SIM_SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SIM_SMEM_OPTIN;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->memoryBusWidth = 6144;
    p->l2CacheSize = 50 * 1024 * 1024;
    p->unifiedAddressing = 1;
    LEAVE(cudaSuccess);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    ENTER();
    sim_dev *dv = &sim.dev[tl_dev];
    *total_bytes = dv->total;
    *free_bytes = dv->total - dv->used;
    LEAVE(cudaSuccess);
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    ENTER();
    if (!func || attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > SIM_SMEM_OPTIN)
        LEAVE(cudaErrorInvalidValue);
    for (int i = 0; i < sim.n_attrs; i++)
        if (sim.attrs[i].fn == func) {
            sim.attrs[i].max_dyn = value;
            LEAVE(cudaSuccess);
        }
    if (sim.n_attrs == 64)
        LEAVE(cudaErrorMemoryAllocation);
    sim.attrs[sim.n_attrs].fn = func;
    sim.attrs[sim.n_attrs++].max_dyn = value;
    LEAVE(cudaSuccess);
}

/* ---- work queues ------------------------------------------------------------- */

sim_stream *sim_stream_of(cudaStream_t s)
{
    return s ? (sim_stream *)s : &sim.dev[tl_dev].legacy;
}

sim_op *sim_op_new(const sim_op_kind *k, size_t payload)
{
    sim_op *op = calloc(1, sizeof *op + payload);
    if (op) {
        op->k = k;
        op->size = sizeof *op + payload;
    }
    return op;
}

void sim_op_free(sim_op *op)
{
    if (op->k->drop)
        op->k->drop(op);
    free(op);
}

/* Counts a queued copy (add 1) or its completion (-1) on the allocations
 * it writes and reads, with the stream it is queued on. */
static void pending_one(int *count, sim_stream **on, sim_stream *s, int add)
{
    *count += add;
    if (*count <= 0)
        *on = NULL;
    else if (add > 0)
        *on = !*on || *on == s ? s : SIM_STREAMS;
}

/* Pinned host memory that queued work will write is not the host's to
 * read, nor to write while queued work will read it: it is protected
 * until the work has run (while device work runs, the emulator itself
 * reads and writes it). A host that reads results before synchronising
 * gets a SIGSEGV naming the mistake, where a device would hand it stale
 * data. */
static void pinned_apply(sim_alloc *al)
{
    if (al->dev >= 0)
        return;
    int want = sim.exec_depth > 0 ? 0 : al->pend_w > 0 ? 2 : al->pend_r > 0 ? 1 : 0;
    if (want == al->prot)
        return;
    if (!mprotect((void *)al->base, al->span, want == 0 ? PROT_READ | PROT_WRITE : want == 1 ? PROT_READ : PROT_NONE))
        al->prot = want;
}

void sim_pending_note(sim_op *op, int add)
{
    if (op->w) {
        pending_one(&op->w->pend_w, &op->w->pend_ws, op->stream, add);
        pinned_apply(op->w);
    }
    if (op->r) {
        pending_one(&op->r->pend_r, &op->r->pend_rs, op->stream, add);
        pinned_apply(op->r);
    }
}

void sim_enqueue(sim_stream *s, sim_op *op)
{
    op->stream = s;
    op->seq = ++sim.seq;
    if (s->capturing) {
        if (s->capture_bad || sim_graph_add(s->graph, op)) {
            sim_capture_invalidate(s, "out of memory while capturing");
            sim_op_free(op);
        }
        return;
    }
    sim_pending_note(op, 1);
    if (s->tail)
        s->tail->next = op;
    else
        s->head = op;
    s->tail = op;
    pthread_cond_broadcast(&sim.cv);
}

static void drop_queue(sim_stream *s)
{
    while (s->head) {
        sim_op *op = s->head;
        s->head = op->next;
        sim_pending_note(op, -1);
        sim_op_free(op);
    }
    s->tail = NULL;
}

static int flush_until(sim_stream *s, uint64_t seq);

/* The legacy stream waits for the blocking streams' earlier work, and
 * they for its (the NULL stream's implicit synchronisation). */
static void order_with_legacy(sim_stream *s, uint64_t seq)
{
    sim_dev *dv = &sim.dev[s->dev];
    if (s->legacy) {
        for (int i = 0; i < dv->n_streams; i++)
            if (!(dv->streams[i]->flags & cudaStreamNonBlocking))
                flush_until(dv->streams[i], seq);
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        flush_until(&dv->legacy, seq);
    }
}

/* Runs the head op of s: 0 ran (and removed), 1 it is a collective that
 * contributed and waits for its peers (left at the head), -1 nothing to
 * run. The arenas must be readable. */
int sim_run_head(sim_stream *s)
{
    sim_op *op = s->head;
    if (!op || sim.sticky)
        return -1;
    if (op->state == 0) {
        order_with_legacy(s, op->seq);
        sim_pending_note(op, -1);
        sim_stream *prev = sim.cur_stream;
        sim.cur_stream = s;
        op->k->run(op);
        sim.cur_stream = prev;
    }
    if (op->state == 1)
        return 1;
    s->head = op->next;
    if (!s->head)
        s->tail = NULL;
    sim_op_free(op);
    return 0;
}

/* Runs the ops of s enqueued before seq (all: UINT64_MAX). A collective
 * that waits for its peers makes this thread run the peers' queued work,
 * then wait for more work to be enqueued. */
static int flush_until(sim_stream *s, uint64_t seq)
{
    /* another thread runs this queue: a synchronisation must not return
     * before the work ran, so wait for it (it holds the queue only while
     * running ops, or while its own collective waits for peers) */
    while (s->executing && !pthread_equal(s->exec_owner, pthread_self()))
        pthread_cond_wait(&sim.cv, &sim.mu);
    if (s->executing)
        return 0; /* this thread runs it already, further up the call */
    s->executing = 1;
    s->exec_owner = pthread_self();
    sim_exec_enter();
    while (s->head && s->head->seq < seq && !sim.sticky)
        if (sim_run_head(s) == 1 && sim_nccl_progress(s->head))
            pthread_cond_wait(&sim.cv, &sim.mu);
    if (sim.sticky)
        drop_queue(s);
    sim_exec_leave();
    s->executing = 0;
    pthread_cond_broadcast(&sim.cv);
    return sim.sticky ? -1 : 0;
}

int sim_flush(sim_stream *s) { return flush_until(s, UINT64_MAX); }

static int flush_device(int dev)
{
    sim_dev *dv = &sim.dev[dev];
    flush_until(&dv->legacy, UINT64_MAX);
    for (int i = 0; i < dv->n_streams; i++) flush_until(dv->streams[i], UINT64_MAX);
    return sim.sticky ? -1 : 0;
}

/* ---- memory ----------------------------------------------------------------- */

static sim_alloc *alloc_new(uintptr_t base, size_t bytes, size_t span, int dev, void *caller)
{
    sim_alloc *al = calloc(1, sizeof *al);
    if (!al)
        return NULL;
    *al = (sim_alloc){base, bytes, span, dev, ++sim.serial, caller, 0, 0, NULL, NULL, 0};
    if (table_add(al)) {
        free(al);
        return NULL;
    }
    return al;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    void *caller = __builtin_return_address(0);
    ENTER();
    REFUSE_IN_CAPTURE("cudaMalloc");
    if (!p)
        LEAVE(cudaErrorInvalidValue);
    *p = NULL;
    sim_dev *dv = &sim.dev[tl_dev];
    size_t span = (bytes + SIM_ALIGN - 1) / SIM_ALIGN * SIM_ALIGN + SIM_GUARD, off;
    if (!dv->arena || bytes > dv->total || arena_take(dv, span, &off))
        LEAVE(cudaErrorMemoryAllocation);
    sim_alloc *al = alloc_new((uintptr_t)dv->arena + off, bytes, span, tl_dev, caller);
    if (!al) {
        arena_give(dv, off, span);
        LEAVE(cudaErrorMemoryAllocation);
    }
    dv->used += span;
    if (sim.poison && bytes && bytes <= SIM_POISON_MAX) {
        sim_exec_enter();
        memset((void *)al->base, 0xff, bytes);
        sim_exec_leave();
    }
    *p = (void *)al->base;
    LEAVE(cudaSuccess);
}

/* cudaFree synchronises with the allocation's device (its queued work may
 * still use the memory), then quarantines the extent. */
cudaError_t cudaFree(void *p)
{
    ENTER();
    REFUSE_IN_CAPTURE("cudaFree");
    if (!p)
        LEAVE(cudaSuccess);
    sim_alloc *al = sim_find((uintptr_t)p);
    if (!al || al->base != (uintptr_t)p || al->dev < 0)
        LEAVE(cudaErrorInvalidValue);
    flush_device(al->dev); /* its device's work only: other devices' queues may wait on collectives */
    if (sim.sticky)
        LEAVE(sim.sticky);
    sim_dev *dv = &sim.dev[al->dev];
    table_remove(al);
    dv->used -= al->span;
    arena_quarantine(dv, al->base - (uintptr_t)dv->arena, al->span);
    free(al);
    LEAVE(cudaSuccess);
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    void *caller = __builtin_return_address(0);
    ENTER();
    REFUSE_IN_CAPTURE("cudaMallocHost");
    if (!p)
        LEAVE(cudaErrorInvalidValue);
    *p = NULL;
    size_t span = (bytes + 4095) / 4096 * 4096;
    void *h = mmap(NULL, span ? span : 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED)
        LEAVE(cudaErrorMemoryAllocation);
    sim_alloc *al = alloc_new((uintptr_t)h, bytes, span ? span : 4096, -1, caller);
    if (!al) {
        munmap(h, span ? span : 4096);
        LEAVE(cudaErrorMemoryAllocation);
    }
    *p = h;
    LEAVE(cudaSuccess);
}

cudaError_t cudaFreeHost(void *p)
{
    ENTER();
    REFUSE_IN_CAPTURE("cudaFreeHost");
    if (!p)
        LEAVE(cudaSuccess);
    sim_alloc *al = sim_find((uintptr_t)p);
    if (!al || al->base != (uintptr_t)p || al->dev >= 0)
        LEAVE(cudaErrorInvalidValue);
    for (int d = 0; d < sim.n_devs; d++) flush_device(d);
    if (al->pend_w || al->pend_r) /* queued on a stream that could not run (a sticky fault dropped it) */
        LEAVE(sim.sticky ? sim.sticky : cudaErrorIllegalState);
    table_remove(al);
    munmap((void *)al->base, al->span);
    free(al);
    LEAVE(sim.sticky);
}

/* 0 when [p, p + bytes) lies in one allocation of device dev (-1 pinned,
 * -2 any device); else prints why (what: the argument) and returns -1. */
int sim_device_ptr(const void *p, size_t bytes, int dev, const char *what)
{
    sim_alloc *al = sim_find((uintptr_t)p);
    const char *why = NULL;
    if (!al)
        why = "is not memory from cudaMalloc";
    else if (dev == -2 ? al->dev < 0 : al->dev != dev)
        why = al->dev < 0 ? "is pinned host memory, not device memory" : "belongs to another device";
    else if ((uintptr_t)p - al->base + bytes > al->bytes)
        why = "runs past the end of its allocation";
    if (!why)
        return 0;
    if (!sim.quiet)
        fprintf(stderr, "cudasim: %s %p (%zu bytes) %s\n", what, p, bytes, why);
    return -1;
}

/* ---- copies and sets ------------------------------------------------------------- */

enum { AT_PAGEABLE, AT_PINNED, AT_DEVICE };

typedef struct copy_op {
    char *dst;
    const char *src;
    size_t bytes;
    int value;        /* memset: the byte; copy: -1 */
    char *snapshot;   /* pageable host source, copied at the call */
    int dst_at, src_at; /* AT_*: what the pointers were when the op was made */
} copy_op;

static int is_pinned(const void *p, size_t bytes);

/* A pointer still what it was when the op was made (a graph replays its
 * copies long after capture: the memory may be gone by then). */
static int still_there(const void *p, size_t bytes, int at)
{
    if (at == AT_DEVICE)
        return !sim_device_ptr(p, bytes, -2, "memcpy/memset at replay");
    return at != AT_PINNED || is_pinned(p, bytes);
}

static void copy_run(sim_op *op)
{
    copy_op *c = SIM_PAYLOAD(op, copy_op);
    if (!still_there(c->dst, c->bytes, c->dst_at) || (!c->snapshot && !still_there(c->src, c->bytes, c->src_at))) {
        sim_fault(cudaErrorIllegalAddress, "%s of %zu bytes: %p or %p is no longer the memory it was when queued "
                  "(freed after a graph captured it?)", op->k->name, c->bytes, (void *)c->dst, (const void *)c->src);
        return;
    }
    if (c->value >= 0)
        memset(c->dst, c->value, c->bytes);
    else
        memcpy(c->dst, c->snapshot ? c->snapshot : c->src, c->bytes);
}

static void copy_drop(sim_op *op) { free(SIM_PAYLOAD(op, copy_op)->snapshot); }

static int copy_clone(const sim_op *op, sim_op *to)
{
    const copy_op *c = SIM_PAYLOAD(op, copy_op);
    copy_op *d = SIM_PAYLOAD(to, copy_op);
    if (c->snapshot) {
        d->snapshot = malloc(c->bytes);
        if (!d->snapshot)
            return -1;
        memcpy(d->snapshot, c->snapshot, c->bytes);
    }
    return 0;
}

/* What it will write and read when it runs: device memory and pinned host
 * memory (pageable sources are snapshots; pageable destinations are
 * written before the call returns). Looked up again for each graph launch. */
static void copy_targets(sim_op *op)
{
    const copy_op *c = SIM_PAYLOAD(op, copy_op);
    op->w = c->dst_at != AT_PAGEABLE ? sim_find((uintptr_t)c->dst) : NULL;
    op->r = c->value < 0 && !c->snapshot && c->src_at != AT_PAGEABLE ? sim_find((uintptr_t)c->src) : NULL;
}

static const sim_op_kind copy_kind = {"memcpy", copy_run, copy_drop, copy_clone, copy_targets};
static const sim_op_kind set_kind = {"memset", copy_run, NULL, copy_clone, copy_targets};

static int where(const void *p, size_t bytes)
{
    sim_alloc *al = sim_find((uintptr_t)p);
    return !al ? AT_PAGEABLE : al->dev >= 0 ? AT_DEVICE : is_pinned(p, bytes) ? AT_PINNED : AT_PAGEABLE;
}

/* Where a host pointer points: pinned (an allocation of cudaMallocHost)
 * or pageable. */
static int is_pinned(const void *p, size_t bytes)
{
    sim_alloc *al = sim_find((uintptr_t)p);
    return al && al->dev < 0 && (uintptr_t)p - al->base + bytes <= al->bytes;
}

/* Checks a copy's pointers against its kind; 0 ok. */
static cudaError_t copy_check(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    int d_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    int s_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDeviceToDevice)
        return cudaErrorInvalidMemcpyDirection; /* cudaMemcpyDefault: not used here, so not emulated */
    if ((d_dev && sim_device_ptr(dst, bytes, -2, "memcpy destination")) ||
        (s_dev && sim_device_ptr(src, bytes, -2, "memcpy source")))
        return cudaErrorInvalidValue;
    if ((!d_dev && sim_find((uintptr_t)dst) && sim_find((uintptr_t)dst)->dev >= 0) ||
        (!s_dev && sim_find((uintptr_t)src) && sim_find((uintptr_t)src)->dev >= 0)) {
        if (!sim.quiet)
            fprintf(stderr, "cudasim: memcpy kind %d names a device pointer as host memory\n", (int)kind);
        return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

static cudaError_t copy_enqueue(sim_stream *s, void *dst, const void *src, size_t bytes, int snapshot)
{
    sim_op *op = sim_op_new(&copy_kind, sizeof(copy_op));
    if (!op)
        return cudaErrorMemoryAllocation;
    copy_op *c = SIM_PAYLOAD(op, copy_op);
    *c = (copy_op){dst, src, bytes, -1, NULL, where(dst, bytes), where(src, bytes)};
    if (snapshot) {
        c->snapshot = malloc(bytes ? bytes : 1);
        if (!c->snapshot) {
            free(op);
            return cudaErrorMemoryAllocation;
        }
        memcpy(c->snapshot, src, bytes);
    }
    copy_targets(op);
    sim_enqueue(s, op);
    return cudaSuccess;
}

/* cudaMemcpy: H2D from pageable memory syncs the NULL stream, stages the
 * bytes and returns with the DMA pending; from pinned memory and D2H it
 * completes; D2D is only queued. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind)
{
    ENTER();
    REFUSE_IN_CAPTURE("cudaMemcpy");
    cudaError_t e = copy_check(dst, src, bytes, kind);
    if (e)
        LEAVE(e);
    sim_stream *s = &sim.dev[tl_dev].legacy;
    if (kind == cudaMemcpyHostToHost) {
        memmove(dst, src, bytes);
        LEAVE(cudaSuccess);
    }
    if (kind != cudaMemcpyDeviceToDevice && sim_flush(s))
        LEAVE(sim.sticky);
    int pinned = kind == cudaMemcpyHostToDevice && is_pinned(src, bytes);
    e = copy_enqueue(s, dst, src, bytes, kind == cudaMemcpyHostToDevice && !pinned);
    if (!e && (kind == cudaMemcpyDeviceToHost || pinned) && sim_flush(s))
        e = sim.sticky;
    LEAVE(e);
}

/* cudaMemcpyAsync: pageable host memory is staged at the call (H2D) or
 * the copy completes before returning (D2H); pinned memory is read or
 * written when the stream gets to it. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t st)
{
    ENTER();
    cudaError_t e = copy_check(dst, src, bytes, kind);
    if (e)
        LEAVE(e);
    sim_stream *s = sim_stream_of(st);
    if (kind == cudaMemcpyHostToHost) {
        memmove(dst, src, bytes);
        LEAVE(cudaSuccess);
    }
    int host_pageable = (kind == cudaMemcpyHostToDevice && !is_pinned(src, bytes)) ||
                        (kind == cudaMemcpyDeviceToHost && !is_pinned(dst, bytes));
    if (s->capturing && host_pageable) {
        sim_capture_invalidate(s, "cudaMemcpyAsync with pageable host memory");
        LEAVE(cudaErrorStreamCaptureUnsupported);
    }
    e = copy_enqueue(s, dst, src, bytes, kind == cudaMemcpyHostToDevice && host_pageable);
    if (!e && kind == cudaMemcpyDeviceToHost && host_pageable && sim_flush(s))
        e = sim.sticky;
    LEAVE(e);
}

static cudaError_t set_enqueue(sim_stream *s, void *p, int value, size_t bytes)
{
    if (sim_device_ptr(p, bytes, -2, "memset destination"))
        return cudaErrorInvalidValue;
    sim_op *op = sim_op_new(&set_kind, sizeof(copy_op));
    if (!op)
        return cudaErrorMemoryAllocation;
    *SIM_PAYLOAD(op, copy_op) = (copy_op){p, NULL, bytes, value & 0xff, NULL, AT_DEVICE, AT_PAGEABLE};
    copy_targets(op);
    sim_enqueue(s, op);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int value, size_t bytes)
{
    ENTER();
    REFUSE_IN_CAPTURE("cudaMemset");
    LEAVE(set_enqueue(&sim.dev[tl_dev].legacy, p, value, bytes));
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t bytes, cudaStream_t s)
{
    ENTER();
    LEAVE(set_enqueue(sim_stream_of(s), p, value, bytes));
}

/* ---- synchronisation ----------------------------------------------------------- */

cudaError_t cudaDeviceSynchronize(void)
{
    ENTER();
    REFUSE_IN_CAPTURE("cudaDeviceSynchronize");
    LEAVE(flush_device(tl_dev) ? sim.sticky : cudaSuccess);
}

/* A capturing stream cannot be waited for or queried: the capture fails. */
static int capturing_refused(sim_stream *s, const char *call)
{
    if (!s->capturing)
        return 0;
    sim_capture_invalidate(s, call);
    return 1;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st)
{
    ENTER();
    sim_stream *s = sim_stream_of(st);
    if (capturing_refused(s, "cudaStreamSynchronize"))
        LEAVE(cudaErrorStreamCaptureUnsupported);
    REFUSE_IN_CAPTURE("cudaStreamSynchronize");
    LEAVE(sim_flush(s) ? sim.sticky : cudaSuccess);
}

/* Work is run when waited for, so queued work is "not ready". */
cudaError_t cudaStreamQuery(cudaStream_t st)
{
    ENTER();
    sim_stream *s = sim_stream_of(st);
    if (capturing_refused(s, "cudaStreamQuery"))
        LEAVE(cudaErrorStreamCaptureUnsupported);
    LEAVE(s->head ? cudaErrorNotReady : cudaSuccess);
}

/* ---- streams ------------------------------------------------------------------- */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *out, unsigned int flags)
{
    ENTER();
    if (!out || (flags & ~(unsigned)cudaStreamNonBlocking))
        LEAVE(cudaErrorInvalidValue);
    sim_dev *dv = &sim.dev[tl_dev];
    sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        LEAVE(cudaErrorMemoryAllocation);
    if (dv->n_streams == dv->cap_streams) {
        int cap = dv->cap_streams ? 2 * dv->cap_streams : 8;
        if (cap > SIM_MAX_TABLE) {
            free(s);
            LEAVE(cudaErrorMemoryAllocation);
        }
        sim_stream **n = realloc(dv->streams, sizeof *n * (size_t)cap);
        if (!n) {
            free(s);
            LEAVE(cudaErrorMemoryAllocation);
        }
        dv->streams = n;
        dv->cap_streams = cap;
    }
    s->dev = tl_dev;
    s->flags = flags;
    dv->streams[dv->n_streams++] = s;
    *out = (cudaStream_t)s;
    LEAVE(cudaSuccess);
}

cudaError_t cudaStreamCreate(cudaStream_t *out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

static int stream_known(sim_stream *s)
{
    for (int d = 0; d < sim.n_devs; d++)
        for (int i = 0; i < sim.dev[d].n_streams; i++)
            if (sim.dev[d].streams[i] == s)
                return 1;
    return 0;
}

cudaError_t cudaStreamDestroy(cudaStream_t st)
{
    ENTER();
    sim_stream *s = (sim_stream *)st;
    if (!s || !stream_known(s))
        LEAVE(cudaErrorInvalidResourceHandle);
    if (s->capturing)
        LEAVE(cudaErrorStreamCaptureUnsupported);
    sim_flush(s); /* its work completes first, as documented */
    sim_dev *dv = &sim.dev[s->dev];
    for (int i = 0; i < dv->n_streams; i++)
        if (dv->streams[i] == s) {
            dv->streams[i] = dv->streams[--dv->n_streams];
            break;
        }
    drop_queue(s);
    free(s);
    LEAVE(sim.sticky);
}

const char *cusim_last_report(void) { return sim.report; }

/* ---- reset --------------------------------------------------------------------- */

/* The emulator's tests seed one fault after another: a reset forgets the
 * fault, drops every queue and frees every allocation (device and
 * pinned), as a context's destruction would. Streams made before are
 * gone. */
cudaError_t cudaDeviceReset(void)
{
    sim_lock();
    if (!sim.init)
        sim_init();
    for (int d = 0; d < sim.n_devs; d++) {
        sim_dev *dv = &sim.dev[d];
        drop_queue(&dv->legacy);
        for (int i = 0; i < dv->n_streams; i++) {
            drop_queue(dv->streams[i]);
            free(dv->streams[i]);
        }
        dv->n_streams = 0;
    }
    while (sim.n_allocs) {
        sim_alloc *al = sim.allocs[sim.n_allocs - 1];
        table_remove(al);
        if (al->dev < 0) {
            munmap((void *)al->base, al->span);
        } else {
            sim_dev *dv = &sim.dev[al->dev];
            dv->used -= al->span;
            arena_quarantine(dv, al->base - (uintptr_t)dv->arena, al->span);
        }
        free(al);
    }
    sim.sticky = cudaSuccess;
    sim.report[0] = 0;
    tl_err = cudaSuccess;
    sim_capture_forget();
    sim_unlock();
    return cudaSuccess;
}
