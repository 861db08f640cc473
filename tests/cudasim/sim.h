/* sim.h - the emulator's module header: what its files share
 * (sim_runtime.c: memory, streams, errors; sim_graph.c: capture and
 * graphs; sim_exec.c: kernel execution on fibers; sim_check.c: the access
 * checks and reports; blas.c, nccl.c: the library stand-ins, named by the
 * APIs they implement). Not seen by the code under test.
 *
 * Locking: one mutex (sim.mu) guards everything here; device work runs
 * with it held, on the thread that waits for the work. */
#ifndef CUSIM_SIM_H
#define CUSIM_SIM_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "cusim.h"

#define SIM_MAX_DEVS 8
#define SIM_MAX_THREADS 1024 /* per block */
#define SIM_ALIGN 256        /* cudaMalloc's alignment */
#define SIM_GUARD 512        /* unallocated bytes after each allocation */
#define SIM_STREAMS ((sim_stream *)1) /* pending copies on more than one stream */
#define SIM_SMEM_DEFAULT (48 * 1024)  /* dynamic shared memory a kernel may use without the attribute */
#define SIM_SMEM_OPTIN (227 * 1024)   /* the most it may ask for (an H200's opt-in limit) */
#define SIM_FREED_RING 256            /* recent frees remembered, to name use after free */
#define SIM_POISON_MAX ((size_t)64 << 20) /* larger allocations are not filled (pages would all be touched) */
#define SIM_MAX_TABLE (1 << 20)       /* allocations, streams, free extents, graph nodes: beyond, out of memory */

/* ---- allocations (device memory and pinned host memory) ---------------- */
typedef struct sim_stream sim_stream;

typedef struct sim_alloc {
    uintptr_t base;
    size_t bytes;        /* asked for */
    size_t span;         /* taken from the arena, guard included */
    int dev;             /* -1: pinned host memory */
    uint64_t serial;
    void *caller;        /* return address of cudaMalloc's caller */
    int pend_w, pend_r;  /* queued copies that will write / read it */
    sim_stream *pend_ws, *pend_rs; /* the stream they are on (SIM_STREAMS: several) */
    int prot;            /* pinned: 0 read-write, 1 read-only (a queued copy reads it), 2 none (one writes it) */
} sim_alloc;

/* ---- work ---------------------------------------------------------------- */
typedef struct sim_op sim_op;
typedef struct sim_op_kind {
    const char *name;
    void (*run)(sim_op *op);              /* under sim.mu; may fault */
    void (*drop)(sim_op *op);             /* frees what the op owns (not op) */
    int (*clone)(const sim_op *op, sim_op *to); /* deep copy for a graph; 0 ok */
    void (*targets)(sim_op *op);          /* (optional) sets op->w, op->r: what it writes and reads */
} sim_op_kind;

struct sim_op {
    const sim_op_kind *k;
    sim_op *next;
    uint64_t seq;             /* enqueue order, for legacy-stream ordering */
    sim_stream *stream;       /* where it runs (graph nodes: the launching stream) */
    sim_alloc *w, *r;         /* copies: the allocations written / read (hazards) */
    int state;                /* collectives: 0 new, 1 contributed, 2 done */
    size_t size;              /* bytes of the whole op (payload follows) */
};
/* The payload right after the op header. */
#define SIM_PAYLOAD(op, T) ((T *)((char *)(op) + sizeof(sim_op)))

struct sim_stream {
    int dev;
    unsigned flags;       /* cudaStreamNonBlocking */
    int legacy;           /* the device's NULL stream */
    sim_op *head, *tail;  /* queued, not yet run */
    /* capture */
    int capturing, capture_bad;
    const char *capture_why;
    struct sim_graph *graph;
    pthread_t capture_thread;
    int capture_mode;
    int executing;        /* exec_owner is running this stream's queue */
    pthread_t exec_owner;
};

typedef struct sim_graph {
    sim_op **nodes;
    int n, cap;
} sim_graph;

/* ---- the emulator's state ----------------------------------------------- */
typedef struct sim_dev {
    char *arena;          /* PROT_NONE outside device work */
    size_t arena_bytes, used, total;
    struct { size_t off, len; } *free_list;
    int n_free, cap_free;
    struct { size_t off, len; } *quarantine;
    int n_quar, cap_quar;
    size_t quar_bytes;
    sim_stream legacy;
    sim_stream **streams;
    int n_streams, cap_streams;
} sim_dev;

typedef struct sim_state {
    pthread_mutex_t mu;
    pthread_cond_t cv;    /* work enqueued, a collective advanced */
    int init, n_devs;
    size_t mem_bytes;     /* per device */
    sim_dev dev[SIM_MAX_DEVS];
    sim_alloc **allocs;   /* sorted by base */
    int n_allocs, cap_allocs;
    struct { uintptr_t base; size_t bytes; } freed[SIM_FREED_RING]; /* recent frees, for reports */
    int freed_next;
    uint64_t serial, seq;
    cudaError_t sticky;   /* a device fault: every later call returns it */
    int exec_depth;       /* arenas readable while > 0 */
    int math_exact, poison, quiet;
    struct { const void *fn; int max_dyn; } attrs[64];
    int n_attrs;
    sim_stream *cur_stream; /* the stream whose work is running */
    char report[4096];    /* the last fault report */
    struct {
        unsigned long long kernels, graphs, blocks, threads, switches, accesses;
    } stats;              /* CUSIM_STATS=1 prints them at exit */
} sim_state;

extern sim_state sim;

/* sim_runtime.c */
void sim_lock(void);
void sim_unlock(void);
sim_alloc *sim_find(uintptr_t a);          /* the allocation holding a (or NULL) */
sim_alloc *sim_nearest(uintptr_t a, long *dist); /* the closest one (for reports) */
int sim_was_freed(uintptr_t a, size_t *bytes);
void sim_exec_enter(void);                 /* arenas readable */
void sim_exec_leave(void);
/* A new op of kind k with `payload` zeroed bytes after its header; NULL
 * when out of memory. The caller hands it to sim_enqueue or frees it
 * with sim_op_free. */
sim_op *sim_op_new(const sim_op_kind *k, size_t payload);
void sim_op_free(sim_op *op);              /* its kind's drop, then the op; NULL ok */
/* Queues op on s (or records it in s's capture); takes op in every case
 * (a capture that cannot record it frees it and is invalidated). */
void sim_enqueue(sim_stream *s, sim_op *op);
sim_stream *sim_stream_of(cudaStream_t s);  /* NULL: the current device's legacy stream */
cudaError_t sim_prologue(void);              /* init; the sticky error */
cudaError_t sim_injected(const char *name);  /* CUSIM_FAIL: this call of name fails */
cudaError_t sim_set_error(cudaError_t e);    /* the thread's last error */
int sim_flush(sim_stream *s);                /* runs s's queue; 0 ok */
int sim_run_head(sim_stream *s);             /* one op: 0 ran, 1 a waiting collective, -1 none */
int sim_device_ptr(const void *p, size_t bytes, int dev, const char *what); /* 0: whole range in one allocation of dev */
int sim_cur_dev(void);
void sim_pending_note(sim_op *op, int add);  /* hazard counts of a copy */

/* The body of every emulated runtime call: the lock, first-use set-up,
 * the sticky fault and CUSIM_FAIL (ENTER); the unlock and the thread's
 * last error (LEAVE). */
#define ENTER()                                  \
    sim_lock();                                  \
    do {                                         \
        cudaError_t e_ = sim_prologue();         \
        if (!e_)                                 \
            e_ = sim_injected(__func__);         \
        if (e_) {                                \
            sim_unlock();                        \
            return sim_set_error(e_);            \
        }                                        \
    } while (0)
#define LEAVE(e)                                 \
    do {                                         \
        cudaError_t r_ = (e);                    \
        sim_unlock();                            \
        return sim_set_error(r_);                \
    } while (0)

/* sim_graph.c: capture rules */
void sim_capture_invalidate(sim_stream *s, const char *why); /* s's capture fails at its end, saying why */
int sim_capture_refuses(const char *call); /* 1: this thread captures and call is unsafe (the capture is invalidated) */
void sim_capture_forget(void);             /* cudaDeviceReset: this thread captures nothing */
int sim_graph_add(sim_graph *g, sim_op *op); /* appends (g owns op); -1 when out of memory (op not taken) */
#define REFUSE_IN_CAPTURE(call)                          \
    do {                                                 \
        if (sim_capture_refuses(call))                 \
            LEAVE(cudaErrorStreamCaptureUnsupported);    \
    } while (0)

/* nccl.c: runs the peers' queued work for the collective op; 0 when it
 * completed. */
int sim_nccl_progress(sim_op *op);

/* sim_check.c */
/* A device fault outside kernel code (a library call, a copy): reported,
 * kept as the sticky error (the first one only). */
void sim_fault(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The same from kernel code: kernel, block, thread and (pc != NULL) the
 * source line are added. */
void sim_fault_in_kernel(cudaError_t e, void *pc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void sim_check_init(void);
void sim_check_forget(const sim_alloc *al); /* al is being freed */
void sim_check_block_begin(void);
/* A barrier interval (or the block) ended: reports a read of shared memory
 * no thread wrote; 1 when it did (the block is to be abandoned). */
int sim_check_interval_end(void);
void sim_shadow_dyn(size_t bytes);    /* shadow cells for a launch's dynamic shared memory */
/* Checks one access of kernel code (write: 0 read, 1 write, 2 atomic);
 * faults (does not return) when it is not allowed. */
void sim_check_access(uintptr_t a, size_t n, int write, int aligned, void *pc);

/* sim_exec.c */
typedef struct sim_kernel {
    const char *name;
    const void *fn;
    uint3 grid, block;
    size_t smem;
    void (*invoke)(const void *closure);
    size_t closure_bytes;
    /* closure bytes follow */
} sim_kernel;
void sim_run_kernel(sim_kernel *k); /* under sim.mu, arenas readable */
/* A fault in the running block: reported (as thread tid's; -1: the
 * running thread; pc: the access, for its source line), the block and the
 * launch abandoned. Called from a GPU thread; does not return. */
void sim_block_faultf(int tid, cudaError_t e, void *pc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));
/* The same without a report (the caller made it). */
void sim_block_abort(void) __attribute__((noreturn));

/* What the checks need to know about the running GPU thread. */
typedef struct sim_exec {
    const sim_kernel *k;       /* the kernel whose blocks run (NULL: none) */
    int cur_tid, cur_warp;     /* linear thread index in the block, its warp */
    uint3 bid;
    uintptr_t stk_lo, stk_hi;  /* the running thread's stack */
    uintptr_t closure_lo, closure_hi; /* the launch's arguments */
    uintptr_t dyn_lo, dyn_hi;  /* dynamic shared memory */
    unsigned bar_epoch;        /* __syncthreads passed by the block */
    unsigned warp_epoch[SIM_MAX_THREADS / 32]; /* __syncwarp passed by each warp */
    uint32_t block_serial;     /* increases with every block run */
} sim_exec;
extern sim_exec sim_x;
/* 1 while kernel code runs on this OS thread. Per thread: other host
 * threads run instrumented code too (the kernels' launchers build their
 * arguments there) while one thread executes device work. Initial-exec:
 * the hooks read it on every access, also inside a dlopen'ed plugin. */
extern __thread int sim_in_kernel __attribute__((tls_model("initial-exec")));

#endif
