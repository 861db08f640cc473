/* sim_check.c - what the emulator checks on every access of kernel code, and
 * how it reports a fault.
 *
 * Kernel code is compiled with GCC's -fsanitize=thread instrumentation
 * but linked without its runtime: the __tsan_* hooks below receive every
 * load and store (address, size, whether the compiler knew it aligned).
 * An access is allowed when it falls in
 *   - the running thread's own stack (locals, spilled registers);
 *   - the launch's copy of the arguments and the thread coordinates
 *     (reads only);
 *   - shared memory: a __shared__ variable (found with its extent in the
 *     module's symbol table; the red zone before each, and bytes just past
 *     the last, are out of bounds) or the launch's dynamic shared memory.
 *     Atomics count as reads and writes. Each byte has a
 *     shadow cell holding, for the current block, the last writer and the
 *     readers with the barrier epoch (and warp epoch) they were at: a read
 *     of a byte no thread of the block wrote (uninitialised) and two
 *     threads' conflicting accesses in one barrier interval (a race) are
 *     faults;
 *   - one device allocation of the kernel's device, naturally aligned
 *     where the type says so, with no copy queued on another stream that
 *     will write it (or read it, for a store);
 *   - pinned host memory (in the device's address space through UVA);
 *   - the module's read-only data (constants the compiler placed).
 * Anything else (past an allocation, freed memory, pageable host memory,
 * another thread's stack) is an illegal address.
 *
 * A report names the kernel, block, thread, the address and what it is
 * near, and the source line (addr2line; the symbol table and c++filt for
 * shared variables); the first fault is the sticky error. Also here, as
 * the runtime half of the dialect: atomics (checked, then done under the
 * emulator's lock) and the math error model (cusim_ulp_err). */
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim.h"

/* ---- the module: paths and read-only ranges ---------------------------------- */

static uintptr_t mod_lo, mod_hi, mod_bias; /* our module's range; runtime - link-time address */
static char mod_path[512];
static struct {
    uintptr_t lo, hi;
} ro[16];
static int n_ro;

static int phdr_cb(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    uintptr_t me = (uintptr_t)arg, lo = UINTPTR_MAX, hi = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD)
            continue;
        uintptr_t a = info->dlpi_addr + ph->p_vaddr, b = a + ph->p_memsz;
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
    }
    if (me < lo || me >= hi)
        return 0;
    mod_lo = lo, mod_hi = hi, mod_bias = info->dlpi_addr;
    for (int i = 0; i < info->dlpi_phnum && n_ro < 16; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type == PT_LOAD && !(ph->p_flags & PF_W)) {
            ro[n_ro].lo = info->dlpi_addr + ph->p_vaddr;
            ro[n_ro++].hi = info->dlpi_addr + ph->p_vaddr + ph->p_memsz;
        }
    }
    Dl_info di;
    if (dladdr(arg, &di) && di.dli_fname && di.dli_fname[0])
        snprintf(mod_path, sizeof mod_path, "%s", di.dli_fname);
    else
        snprintf(mod_path, sizeof mod_path, "/proc/self/exe");
    return 1;
}

/* "function at file:line" for a code address of this module (addr2line;
 * empty when it cannot tell). */
static void resolve_pc(void *pc, char *out, size_t n)
{
    out[0] = 0;
    if (!pc || !mod_path[0] || (uintptr_t)pc < mod_lo || (uintptr_t)pc >= mod_hi || strchr(mod_path, '\''))
        return;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "addr2line -f -C -i -e '%s' 0x%lx 2>/dev/null", mod_path,
             (unsigned long)((uintptr_t)pc - 1 - mod_bias));
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    char fn[256] = "", line[300] = "";
    if (fgets(fn, sizeof fn, p) && fgets(line, sizeof line, p)) {
        fn[strcspn(fn, "\n")] = 0;
        line[strcspn(line, "\n")] = 0;
        const char *file = strstr(line, "kernels/") ? strstr(line, "kernels/") : line;
        snprintf(out, n, "%s (%s)", file, fn);
    }
    pclose(p);
}

/* ---- reports ------------------------------------------------------------------- */

void sim_fault(cudaError_t e, const char *fmt, ...)
{
    if (sim.sticky)
        return;
    char msg[sizeof sim.report];
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(msg, sizeof msg, "cudasim: %s: ", cudaGetErrorName(e));
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    sim.sticky = e;
    snprintf(sim.report, sizeof sim.report, "%s", msg);
    if (!sim.quiet)
        fprintf(stderr, "%s\n", msg);
}

void sim_fault_in_kernel(cudaError_t e, void *pc, const char *fmt, ...)
{
    if (sim.sticky)
        return;
    char msg[1600], where[400] = "";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    resolve_pc(pc, where, sizeof where);
    const sim_kernel *k = sim_x.k;
    uint3 b = k ? k->block : (uint3){1, 1, 1};
    unsigned t = (unsigned)sim_x.cur_tid;
    sim_fault(e, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u) [warp %u lane %u]: %s%s%s", k ? k->name : "?",
              sim_x.bid.x, sim_x.bid.y, sim_x.bid.z, t % b.x, t / b.x % b.y, t / (b.x * b.y), t / 32, t % 32, msg,
              where[0] ? "\n  at " : "", where);
}

/* ---- shared memory ----------------------------------------------------------------- */

enum { C_WRITTEN = 1, C_ATOMIC = 2, C_MANY = 4, C_MULTIWARP = 8, C_PENDING = 16 };
#define NOBODY 0xffffu

typedef struct cell {
    uint32_t stamp;             /* block serial the fields below belong to */
    uint16_t w_tid, w_bar, w_we; /* last writer, its barrier and warp epochs */
    uint16_t r_tid, r_bar, r_we; /* a reader since (C_MANY: and others) */
    uint8_t flags;
    void *w_pc;
} cell;

/* The kernels' __shared__ variables and their red zones (cusim_device.h),
 * from the module's symbol table: local statics of C++ code ("_ZZ"
 * names); only the kernels are C++ here. Sorted by address. */
typedef struct shvar {
    uintptr_t lo, hi;
    int pad;
    char name[160]; /* mangled */
} shvar;
static shvar *vars;
static int n_vars;
static uintptr_t sh_lo, sh_hi; /* from the first variable to the end of the last */
static cell *sh_cells, *dyn_cells;
static size_t dyn_cap;

static int by_lo(const void *a, const void *b)
{
    const shvar *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static int add_var(const char *name, uintptr_t lo, size_t size)
{
    if (n_vars % 64 == 0) {
        shvar *v = realloc(vars, sizeof *v * (size_t)(n_vars + 64));
        if (!v)
            return -1;
        vars = v;
    }
    shvar *v = &vars[n_vars++];
    v->lo = lo, v->hi = lo + size, v->pad = strstr(name, "cusim_rz_") != NULL;
    snprintf(v->name, sizeof v->name, "%s", name);
    return 0;
}

static void symtab_scan(const unsigned char *f, size_t len)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)f;
    if (len < sizeof *eh || memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_ident[EI_CLASS] != ELFCLASS64 ||
        eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > len)
        return;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(f + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum ||
            sh[i].sh_offset + sh[i].sh_size > len)
            continue;
        const Elf64_Shdr *st = &sh[sh[i].sh_link];
        const Elf64_Sym *sym = (const Elf64_Sym *)(f + sh[i].sh_offset);
        size_t n = sh[i].sh_size / sizeof *sym;
        for (size_t j = 0; j < n; j++) {
            if (ELF64_ST_TYPE(sym[j].st_info) != STT_OBJECT || !sym[j].st_size || sym[j].st_name >= st->sh_size ||
                st->sh_offset + st->sh_size > len)
                continue;
            const char *name = (const char *)f + st->sh_offset + sym[j].st_name;
            /* writable ones only: a device function's static const table
             * (read-only data) is not shared memory */
            int writable = sym[j].st_shndx < eh->e_shnum && (sh[sym[j].st_shndx].sh_flags & SHF_WRITE);
            if (writable && !strncmp(name, "_ZZ", 3) && add_var(name, mod_bias + sym[j].st_value, sym[j].st_size))
                return;
        }
    }
}

static void shared_init(void)
{
    int fd = open(mod_path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb)) {
        if (fd >= 0)
            close(fd);
        return;
    }
    void *f = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f == MAP_FAILED)
        return;
    symtab_scan(f, (size_t)sb.st_size);
    munmap(f, (size_t)sb.st_size);
    if (!n_vars)
        return;
    qsort(vars, (size_t)n_vars, sizeof *vars, by_lo);
    sh_lo = vars[0].lo;
    sh_hi = vars[n_vars - 1].hi;
    sh_cells = calloc(sh_hi - sh_lo, sizeof *sh_cells);
    if (!sh_cells)
        sh_lo = sh_hi = 0;
}

/* The variable (or red zone) holding a, or NULL. */
static const shvar *shared_var(uintptr_t a)
{
    int lo = 0, hi = n_vars;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (vars[mid].hi <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n_vars && vars[lo].lo <= a ? &vars[lo] : NULL;
}

/* The last variable ending at or before a (or NULL). */
static const shvar *shared_var_below(uintptr_t a)
{
    const shvar *best = NULL;
    int lo = 0, hi = n_vars;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (vars[mid].hi <= a)
            best = &vars[mid], lo = mid + 1;
        else
            hi = mid;
    }
    while (best && best > vars && best->pad)
        best--;
    return best && !best->pad ? best : NULL;
}

/* A shared variable's C++ name (c++filt) and the offset, as " (name+off)". */
static void describe_shared(uintptr_t a, char *out, size_t n)
{
    const shvar *v = shared_var(a);
    out[0] = 0;
    if (!v || v->pad)
        return;
    char cmd[256], dm[300] = "";
    snprintf(cmd, sizeof cmd, "c++filt '%s' 2>/dev/null", v->name);
    FILE *p = popen(cmd, "r");
    if (p) {
        if (!fgets(dm, sizeof dm, p))
            dm[0] = 0;
        pclose(p);
    }
    dm[strcspn(dm, "\n")] = 0;
    if (a == v->lo)
        snprintf(out, n, " (__shared__ %s, %lu bytes)", dm[0] ? dm : v->name, (unsigned long)(v->hi - v->lo));
    else
        snprintf(out, n, " (__shared__ %s+%lu)", dm[0] ? dm : v->name, (unsigned long)(a - v->lo));
}

void sim_shadow_dyn(size_t bytes)
{
    if (bytes <= dyn_cap)
        return;
    cell *c = realloc(dyn_cells, bytes * sizeof *c);
    if (!c) {
        sim_fault(cudaErrorLaunchOutOfResources, "no memory for the shadow of %zu bytes of shared memory", bytes);
        return;
    }
    memset(c + dyn_cap, 0, (bytes - dyn_cap) * sizeof *c);
    dyn_cells = c;
    dyn_cap = bytes;
}

/* Is an earlier access by (tid, bar, we) ordered before the running
 * thread's? The same thread; a __syncthreads since; or the same warp and
 * a __syncwarp since. */
static int ordered(unsigned tid, unsigned bar, unsigned we)
{
    if (tid == (unsigned)sim_x.cur_tid || bar != (sim_x.bar_epoch & 0xffffu))
        return 1;
    return (int)tid / 32 == sim_x.cur_warp && we != (sim_x.warp_epoch[sim_x.cur_warp] & 0xffffu);
}

static int readers_ordered(const cell *c)
{
    if (c->r_tid == NOBODY)
        return 1;
    if (!(c->flags & C_MANY))
        return ordered(c->r_tid, c->r_bar, c->r_we);
    if (c->r_bar != (sim_x.bar_epoch & 0xffffu))
        return 1;
    return !(c->flags & C_MULTIWARP) && (int)c->r_tid / 32 == sim_x.cur_warp &&
           c->r_we != (sim_x.warp_epoch[sim_x.cur_warp] & 0xffffu);
}

static void race(const cell *c, int kind, int w_conflict, uintptr_t a, size_t n, void *pc)
{
    char other[400] = "", var[450];
    if (w_conflict && c->w_pc)
        resolve_pc(c->w_pc, other, sizeof other);
    describe_shared(a, var, sizeof var);
    sim_block_faultf(-1, cudaErrorLaunchFailure, pc,
           "shared-memory race: this thread %s %zu byte(s) at %p%s that thread %u %s%s in the same barrier interval "
           "(no __syncthreads or __syncwarp between)%s%s",
           kind == 0 ? "reads" : "writes", n, (void *)a, var, w_conflict ? c->w_tid : c->r_tid,
           w_conflict ? "wrote" : "read", !w_conflict && (c->flags & C_MANY) ? " (with others)" : "",
           other[0] ? "\n  the write: " : "", other);
}

/* Reads of bytes no thread of the block had written yet. Not a fault at
 * once: another thread may write them later in the same barrier interval
 * (then it is a race, reported at that write). What is still pending when
 * the interval ends (a __syncthreads, the block's end) read uninitialised
 * memory. */
#define MAX_PENDING 64
static struct {
    uintptr_t a;
    size_t n;
    int tid;
    void *pc;
} pending[MAX_PENDING];
static int n_pending;

static void report_uninit(int k)
{
    char var[450];
    describe_shared(pending[k].a, var, sizeof var);
    sim_x.cur_tid = pending[k].tid;
    sim_x.cur_warp = pending[k].tid / 32;
    sim_in_kernel = 0;
    sim_fault_in_kernel(cudaErrorLaunchFailure, pending[k].pc,
                        "read of %zu byte(s) of shared memory at %p%s that no thread of this block wrote", pending[k].n,
                        (void *)pending[k].a, var);
}

int sim_check_interval_end(void)
{
    int any = n_pending > 0;
    if (any)
        report_uninit(0);
    n_pending = 0;
    return any;
}

void sim_check_block_begin(void) { n_pending = 0; }

static void uninit(cell *c, uintptr_t a, size_t n, void *pc)
{
    if (c->flags & C_PENDING)
        return;
    c->flags |= C_PENDING;
    if (n_pending == MAX_PENDING) { /* plenty: say so now */
        report_uninit(0);
        sim_block_abort();
    }
    pending[n_pending].a = a, pending[n_pending].n = n, pending[n_pending].tid = sim_x.cur_tid;
    pending[n_pending++].pc = pc;
}

/* kind: 0 read, 1 write, 2 atomic. */
static void shared_access(cell *cells, uintptr_t base, uintptr_t a, size_t n, int kind, void *pc)
{
    uint32_t serial = sim_x.block_serial;
    uint16_t me = (uint16_t)sim_x.cur_tid, bar = (uint16_t)sim_x.bar_epoch,
             we = (uint16_t)sim_x.warp_epoch[sim_x.cur_warp];
    for (size_t i = 0; i < n; i++) {
        size_t off = a - base + i;
        cell *c = &cells[off];
        if (c->stamp != serial)
            *c = (cell){serial, NOBODY, 0, 0, NOBODY, 0, 0, 0, NULL};
        if (kind != 1 && !(c->flags & C_WRITTEN)) /* plain reads, and atomics, which read the old value */
            uninit(c, a, n, pc);
        int atomic = kind == 2;
        int w_conflict = c->w_tid != NOBODY && !ordered(c->w_tid, c->w_bar, c->w_we) &&
                         !(atomic && (c->flags & C_ATOMIC));
        if (w_conflict || (kind != 0 && !readers_ordered(c)))
            race(c, kind, w_conflict, a, n, pc);
        if (kind == 0) {
            if (c->r_tid == NOBODY || c->r_bar != bar) {
                c->r_tid = me, c->r_bar = bar, c->r_we = we;
                c->flags &= (uint8_t)~(C_MANY | C_MULTIWARP);
            } else if (c->r_tid != me) {
                c->flags |= (uint8_t)(C_MANY | (c->r_tid / 32 != me / 32 ? C_MULTIWARP : 0));
            }
        } else {
            c->w_tid = me, c->w_bar = bar, c->w_we = we, c->w_pc = pc;
            c->flags = (uint8_t)(C_WRITTEN | (atomic ? C_ATOMIC : 0) | (c->flags & C_PENDING));
            c->r_tid = NOBODY;
        }
    }
}

/* ---- global memory -------------------------------------------------------------- */

static sim_alloc *last; /* the last allocation hit: most accesses repeat it */

void sim_check_forget(const sim_alloc *al)
{
    if (last == al)
        last = NULL;
}

static int in_ro(uintptr_t a, size_t n)
{
    for (int i = 0; i < n_ro; i++)
        if (a >= ro[i].lo && a + n <= ro[i].hi)
            return 1;
    return 0;
}

/* Says what an illegal address is near. */
static void illegal(uintptr_t a, size_t n, int kind, void *pc)
{
    const char *op = kind == 0 ? "read" : kind == 1 ? "write" : "atomic";
    size_t fb = 0;
    long dist = 0;
    sim_alloc *near = sim_nearest(a, &dist);
    if (sim_was_freed(a, &fb))
        sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "%s of %zu byte(s) at %p: memory of a %zu-byte allocation already freed (cudaFree)",
               op, n, (void *)a, fb);
    if (near && near->dev >= 0 && dist >= 0 && dist < (long)SIM_GUARD + SIM_ALIGN)
        sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "%s of %zu byte(s) at %p: %ld byte(s) past the end of a %zu-byte device allocation",
               op, n, (void *)a, dist, near->bytes);
    if (near && near->dev >= 0 && dist < 0 && -dist <= (long)SIM_GUARD + SIM_ALIGN)
        sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "%s of %zu byte(s) at %p: %ld byte(s) before the start of a %zu-byte device allocation",
               op, n, (void *)a, -dist, near->bytes);
    for (int d = 0; d < sim.n_devs; d++)
        if (sim.dev[d].arena && a >= (uintptr_t)sim.dev[d].arena && a < (uintptr_t)sim.dev[d].arena + sim.dev[d].arena_bytes)
            sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "%s of %zu byte(s) at %p: device memory no allocation holds", op, n,
                   (void *)a);
    if (a >= mod_lo && a < mod_hi)
        sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "%s of %zu byte(s) at %p: a host variable of the program", op, n, (void *)a);
    sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "%s of %zu byte(s) at %p: host memory, not device memory%s", op, n, (void *)a,
           /* the 1,024 thread stacks (64 KiB + a guard page each) lie within 80 MiB of any of them */
           a >= (uintptr_t)sim_x.stk_lo - ((size_t)80 << 20) && a < sim_x.stk_hi + ((size_t)80 << 20)
               ? " (another GPU thread's stack?)"
               : "");
}

static void global_access(uintptr_t a, size_t n, int kind, void *pc)
{
    sim_alloc *al = last && a - last->base < last->bytes ? last : sim_find(a);
    if (!al) {
        if (kind == 0 && in_ro(a, n))
            return;
        illegal(a, n, kind, pc);
    }
    last = al;
    const sim_stream *s = sim.cur_stream;
    if (a + n > al->base + al->bytes)
        sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "%s of %zu byte(s) at %p runs %zu byte(s) past the end of a %zu-byte allocation",
               kind == 0 ? "read" : "write", n, (void *)a, (size_t)(a + n - al->base - al->bytes), al->bytes);
    if (al->dev >= 0 && s && al->dev != s->dev)
        sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "access at %p to memory of device %d from a kernel on device %d", (void *)a,
               al->dev, s->dev);
    if (al->pend_w > 0 && al->pend_ws != s)
        sim_block_faultf(-1, cudaErrorLaunchFailure, pc,
               "%s of device memory at %p while a copy to its allocation is still queued on another stream (%s): "
               "nothing orders them (a synchronous cudaMemcpy from pageable memory returns before its DMA ends)",
               kind == 0 ? "read" : "write", (void *)a,
               al->pend_ws == SIM_STREAMS ? "several streams" : al->pend_ws->legacy ? "the NULL stream" : "a stream");
    if (kind != 0 && al->pend_r > 0 && al->pend_rs != s)
        sim_block_faultf(-1, cudaErrorLaunchFailure, pc, "write of device memory at %p that a copy queued on another stream has yet to read",
               (void *)a);
}

void sim_check_access(uintptr_t a, size_t n, int kind, int aligned, void *pc)
{
    sim.stats.accesses++;
    if (a >= sim_x.stk_lo && a + n <= sim_x.stk_hi)
        return;
    if (aligned && (n & (n - 1)) == 0 && (a & (n - 1)))
        sim_block_faultf(-1, cudaErrorMisalignedAddress, pc, "misaligned %zu-byte %s at %p", n, kind == 0 ? "read" : "write", (void *)a);
    if (a >= (uintptr_t)&cusim_r && a + n <= (uintptr_t)(&cusim_r + 1)) {
        if (kind)
            sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "write to threadIdx/blockIdx/blockDim/gridDim");
        return;
    }
    if (a >= sim_x.closure_lo && a + n <= sim_x.closure_hi) {
        if (kind)
            sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "write into the launch's argument buffer at %p", (void *)a);
        return;
    }
    if (a >= sh_lo && a < sh_hi + 64) {
        const shvar *v = a < sh_hi ? shared_var(a) : NULL;
        if (v && !v->pad) {
            if (a + n > v->hi) {
                char var[450];
                describe_shared(a, var, sizeof var);
                sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "%s of %zu byte(s) at %p runs past the end of a __shared__ variable%s",
                       kind == 0 ? "read" : "write", n, (void *)a, var);
            }
            shared_access(sh_cells, sh_lo, a, n, kind, pc);
            return;
        }
        /* a red zone, or bytes right after the last variable of a file */
        const shvar *prev = shared_var_below(a);
        if (prev && (v || a - prev->hi < 64)) {
            char var[450];
            describe_shared(prev->lo, var, sizeof var);
            sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "%s of %zu byte(s) at %p: %lu byte(s) past the end of a __shared__ variable%s",
                   kind == 0 ? "read" : "write", n, (void *)a, (unsigned long)(a - prev->hi), var);
        }
    }
    if (a >= sim_x.dyn_lo && a < sim_x.dyn_hi) {
        if (a + n > sim_x.dyn_hi)
            sim_block_faultf(-1, cudaErrorIllegalAddress, pc, "access of %zu byte(s) at %p runs past the %zu bytes of dynamic shared memory",
                   n, (void *)a, (size_t)(sim_x.dyn_hi - sim_x.dyn_lo));
        shared_access(dyn_cells, sim_x.dyn_lo, a, n, kind, pc);
        return;
    }
    global_access(a, n, kind, pc);
}

/* ---- the instrumentation's hooks (GCC -fsanitize=thread ABI) ------------------------ */

#define HOOK(name, n, kind, aligned)                                                                   \
    void name(void *p);                                                                                \
    void name(void *p)                                                                                 \
    {                                                                                                  \
        if (sim_in_kernel)                                                                           \
            sim_check_access((uintptr_t)p, n, kind, aligned, __builtin_return_address(0));             \
    }
HOOK(__tsan_read1, 1, 0, 1)
HOOK(__tsan_read2, 2, 0, 1)
HOOK(__tsan_read4, 4, 0, 1)
HOOK(__tsan_read8, 8, 0, 1)
HOOK(__tsan_read16, 16, 0, 1)
HOOK(__tsan_write1, 1, 1, 1)
HOOK(__tsan_write2, 2, 1, 1)
HOOK(__tsan_write4, 4, 1, 1)
HOOK(__tsan_write8, 8, 1, 1)
HOOK(__tsan_write16, 16, 1, 1)
HOOK(__tsan_unaligned_read2, 2, 0, 0)
HOOK(__tsan_unaligned_read4, 4, 0, 0)
HOOK(__tsan_unaligned_read8, 8, 0, 0)
HOOK(__tsan_unaligned_read16, 16, 0, 0)
HOOK(__tsan_unaligned_write2, 2, 1, 0)
HOOK(__tsan_unaligned_write4, 4, 1, 0)
HOOK(__tsan_unaligned_write8, 8, 1, 0)
HOOK(__tsan_unaligned_write16, 16, 1, 0)
HOOK(__tsan_volatile_read1, 1, 0, 1)
HOOK(__tsan_volatile_read2, 2, 0, 1)
HOOK(__tsan_volatile_read4, 4, 0, 1)
HOOK(__tsan_volatile_read8, 8, 0, 1)
HOOK(__tsan_volatile_read16, 16, 0, 1)
HOOK(__tsan_volatile_write1, 1, 1, 1)
HOOK(__tsan_volatile_write2, 2, 1, 1)
HOOK(__tsan_volatile_write4, 4, 1, 1)
HOOK(__tsan_volatile_write8, 8, 1, 1)
HOOK(__tsan_volatile_write16, 16, 1, 1)

void __tsan_read_range(void *p, unsigned long n);
void __tsan_read_range(void *p, unsigned long n)
{
    if (sim_in_kernel && n)
        sim_check_access((uintptr_t)p, n, 0, 0, __builtin_return_address(0));
}

void __tsan_write_range(void *p, unsigned long n);
void __tsan_write_range(void *p, unsigned long n)
{
    if (sim_in_kernel && n)
        sim_check_access((uintptr_t)p, n, 1, 0, __builtin_return_address(0));
}

void __tsan_init(void);
void __tsan_init(void) {}
void __tsan_func_entry(void *pc);
void __tsan_func_entry(void *pc) { (void)pc; }
void __tsan_func_exit(void);
void __tsan_func_exit(void) {}
void __tsan_vptr_update(void **p, void *v);
void __tsan_vptr_update(void **p, void *v) { (void)p, (void)v; }
void __tsan_vptr_read(void **p);
void __tsan_vptr_read(void **p) { (void)p; }

/* ---- atomics and math called from kernel code ------------------------------------- */

uint64_t cusim_atomic(void *p, int size, int op, uint64_t v, uint64_t cmp, const char *site)
{
    (void)site;
    sim_check_access((uintptr_t)p, (size_t)size, 2, 1, __builtin_return_address(0));
    uint64_t old = 0;
    memcpy(&old, p, (size_t)size);
    uint64_t nw = old;
    float fo, fv;
    switch (op) {
    case CUSIM_A_ADD_I:
    case CUSIM_A_ADD_U: nw = old + v; break;
    case CUSIM_A_ADD_F:
        memcpy(&fo, &old, 4), memcpy(&fv, &v, 4), fo += fv;
        memcpy(&nw, &fo, 4);
        break;
    case CUSIM_A_MAX_I: nw = (int32_t)v > (int32_t)old ? v : old; break;
    case CUSIM_A_MIN_I: nw = (int32_t)v < (int32_t)old ? v : old; break;
    case CUSIM_A_MAX_U: nw = (uint32_t)v > (uint32_t)old ? v : old; break;
    case CUSIM_A_EXCH: nw = v; break;
    case CUSIM_A_CAS: nw = old == cmp ? v : old; break;
    }
    memcpy(p, &nw, (size_t)size);
    return old;
}

/* The result moved by k ulps, k in [-max_ulp, max_ulp] from a hash of the
 * input (deterministic, so runs repeat). */
float cusim_ulp_err(float exact, float x, int max_ulp)
{
    if (sim.math_exact || !isfinite(exact) || exact == 0.f || !max_ulp)
        return exact;
    uint32_t h;
    memcpy(&h, &x, sizeof h);
    h ^= h >> 16, h *= 0x7feb352du, h ^= h >> 15, h *= 0x846ca68bu, h ^= h >> 16;
    int k = (int)(h % (uint32_t)(2 * max_ulp + 1)) - max_ulp;
    float r = exact;
    for (; k > 0; k--) r = nextafterf(r, INFINITY);
    for (; k < 0; k++) r = nextafterf(r, -INFINITY);
    return isfinite(r) ? r : exact;
}

/* ---- host code touching device memory ----------------------------------------------- */

static struct sigaction prev_segv;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    uintptr_t a = (uintptr_t)si->si_addr;
    sim_alloc *al = sim_find(a); /* no lock: the faulting thread may hold it; the process is going down */
    if (al && al->dev < 0 && al->prot) {
        static const char msg[] = "cudasim: host code touched pinned memory that queued device work has yet to read or "
                                  "write (synchronize the stream before using it)\n";
        (void)!write(2, msg, sizeof msg - 1);
    }
    for (int d = 0; d < sim.n_devs; d++)
        if (sim.dev[d].arena && a >= (uintptr_t)sim.dev[d].arena && a < (uintptr_t)sim.dev[d].arena + sim.dev[d].arena_bytes) {
            static const char msg[] = "cudasim: host code dereferenced a device pointer (memory of cudaMalloc is not "
                                      "host memory; copy it with cudaMemcpy)\n";
            (void)!write(2, msg, sizeof msg - 1);
            break;
        }
    sigaction(SIGSEGV, &prev_segv, NULL);
    if (prev_segv.sa_flags & SA_SIGINFO && prev_segv.sa_sigaction)
        prev_segv.sa_sigaction(sig, si, uc);
    else
        raise(sig);
}

void sim_check_init(void)
{
    dl_iterate_phdr(phdr_cb, (void *)&cusim_r);
    shared_init();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, &prev_segv)) /* the crash would still happen, only unexplained */
        fprintf(stderr, "cudasim: no SIGSEGV handler (%s): host access to device memory will not be named\n",
                strerror(errno));
}
