/* backend_cpu.c - the CPU implementation of the backend interface.
 *
 * Matmuls quantize the activations once (per call, to the weight type's
 * activation type), then split the weight rows across the thread pool; each
 * thread streams its rows once and applies them to every token, so a batch
 * costs little more memory traffic than one token. Paged KV and attention
 * live in cpu/cpu_attention.c. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "cpu_impl.h"
#include "llm/clock.h"

#define CPU_ROW_CHUNK 16  /* weight rows kept hot in cache while tokens loop */
#define CPU_WORK_ROWS 32  /* prefill work unit: two 16-row packed groups, one tile's rows */

static cpu_ctx *ctx_of(llm_backend *b) { return b->ctx; }

/* ---- matmul -------------------------------------------------------------- */

/* One weight of a call, with its input converted to its activation type. */
typedef struct mm_part {
    const cpu_kernels *k; /* the set's, or the scalar set where it lacks the type */
    const cpu_pack *pk;   /* the set's tiles, when w was packed by this backend */
    const llm_weight *w;
    float *y;
    const float *x;       /* n_tok rows of w->cols */
    int n_tok;
    int conv;             /* its conversion (mm_conv), -1: x itself (float formats) */
    long base;            /* its first row among the call's rows, all parts' in order */
    const void *act;
    size_t act_row;
} mm_part;

typedef struct mm_job {
    mm_part *parts;
    int n_parts, max_tok;
    long total_rows;
    _Atomic long next_chunk; /* prefill: chunks handed out on demand */
} mm_job;

/* Tokens [t, t + width) of rows [r0, r1) through a tile kernel. */
static void mm_tile(const mm_part *p, cpu_dot4_fn fn, int width, int t, long r0, long r1)
{
    const char *x = (const char *)p->act + (size_t)t * p->act_row;
    size_t rows = (size_t)p->w->rows;
    for (long r = r0; r < r1; r++) {
        float out[16];
        fn((const char *)p->w->data + (size_t)r * p->w->row_bytes, x, p->act_row, (int)p->w->cols, out);
        for (int i = 0; i < width; i++) p->y[(size_t)(t + i) * rows + (size_t)r] = out[i];
    }
}

/* A packed weight's groups that start in rows [r0, r1), every token:
 * ranges that split the rows give each group to exactly one of them. */
static void mm_packed(const mm_part *p, long r0, long r1)
{
    long gs = p->pk->group, g0 = (r0 + gs - 1) / gs, g1 = (r1 + gs - 1) / gs;
    if (g1 > g0)
        p->pk->gemm(p->w->packed, p->w->rows, p->w->cols, g0, g1, p->act, p->act_row, p->n_tok, p->y, (size_t)p->w->rows);
}

/* Rows [r0, r1) of one weight against every token; tokens go 16, 8 or 4
 * at a time through the tile kernels when the set has them. */
static void mm_rows(const mm_part *p, long r0, long r1)
{
    const cpu_kernels *k = p->k;
    cpu_dot_fn dot = k->dot[p->w->type];
    cpu_dot4_fn dot4 = k->dot4[p->w->type], dot8 = k->dot8[p->w->type], dot16 = k->dot16[p->w->type];
    const char *wd = p->w->data;
    int cols = (int)p->w->cols, n_tok = p->n_tok;
    size_t rows = (size_t)p->w->rows;
    int t = 0;
    for (; dot16 && t + 16 <= n_tok; t += 16) mm_tile(p, dot16, 16, t, r0, r1);
    for (; dot8 && t + 8 <= n_tok; t += 8) mm_tile(p, dot8, 8, t, r0, r1);
    if (dot8 && n_tok - t >= 4 && k->act[p->w->type]->quantize8) { /* the padded tile */
        mm_tile(p, dot8, n_tok - t, t, r0, r1);
        t = n_tok;
    }
    for (; dot4 && t + 4 <= n_tok; t += 4) mm_tile(p, dot4, 4, t, r0, r1);
    for (; t < n_tok; t++) {
        const char *x = (const char *)p->act + (size_t)t * p->act_row;
        for (long r = r0; r < r1; r++) p->y[(size_t)t * rows + (size_t)r] = dot(wd + (size_t)r * p->w->row_bytes, x, cols);
    }
}

/* Rows [lo, hi) of the call's concatenated rows, in chunks small enough
 * that a chunk's weights stay in cache while every token uses them (a
 * packed weight's tile loops its groups that way itself). The first part
 * is found by bisection: a grouped call may hold hundreds (experts). */
static void mm_range(const mm_job *j, long lo, long hi)
{
    int i = 0, top = j->n_parts - 1;
    while (i < top) { /* the last part starting at or before lo */
        int mid = (i + top + 1) / 2;
        if (j->parts[mid].base <= lo)
            i = mid;
        else
            top = mid - 1;
    }
    for (; i < j->n_parts && j->parts[i].base < hi; i++) {
        const mm_part *p = &j->parts[i];
        long a = lo > p->base ? lo - p->base : 0, b = hi - p->base < p->w->rows ? hi - p->base : p->w->rows;
        if (p->pk) {
            if (a < b)
                mm_packed(p, a, b);
        } else {
            for (long r0 = a; r0 < b; r0 += CPU_ROW_CHUNK) mm_rows(p, r0, r0 + CPU_ROW_CHUNK < b ? r0 + CPU_ROW_CHUNK : b);
        }
    }
}

/* Decode (few tokens) gives each thread one contiguous range, so its
 * weight stream stays sequential for the prefetcher. Prefill hands out
 * chunks on demand: compute-bound work then finishes together even when a
 * thread starts late or its vCPU is preempted. */
static void mm_worker(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    if (j->max_tok < 8) {
        long lo, hi;
        tp_range(j->total_rows, ith, nth, &lo, &hi);
        mm_range(j, lo, hi);
        return;
    }
    for (;;) {
        long c = atomic_fetch_add_explicit(&j->next_chunk, 1, memory_order_relaxed);
        long lo = c * CPU_WORK_ROWS;
        if (lo >= j->total_rows)
            return;
        mm_range(j, lo, lo + CPU_WORK_ROWS < j->total_rows ? lo + CPU_WORK_ROWS : j->total_rows);
    }
}

/* One input converted to an activation format: units [unit0, unit0 +
 * units) of the call's conversion work. */
typedef struct mm_conv {
    const cpu_act *a;
    const float *x;
    size_t off;       /* bytes into the activation buffer */
    void *dst;
    size_t dst_row;
    int cols, n_tok;
    long unit0, units;
} mm_conv;

typedef struct q_job {
    const mm_conv *cv;
    int n;
    long units;
} q_job;

/* Work units of one conversion: 8-token tiles first (when the format has
 * them), then single rows; a tile occupies the bytes of its 8 rows. */
static long q_units(const cpu_act *a, int n_tok)
{
    int tiled = cpu_act_tiled(a, n_tok);
    return tiled / 8 + (n_tok > tiled ? n_tok - tiled : 0);
}

static void q_unit(const mm_conv *c, long u)
{
    int tiles = cpu_act_tiled(c->a, c->n_tok) / 8, tiled = tiles * 8;
    long t = u < tiles ? 8 * u : tiled + (u - tiles);
    const float *x = c->x + (size_t)t * (size_t)c->cols;
    char *dst = (char *)c->dst + (size_t)t * c->dst_row;
    if (u < tiles)
        c->a->quantize8(x, (size_t)c->cols, c->n_tok - t < 8 ? (int)(c->n_tok - t) : 8, dst, c->cols);
    else
        c->a->quantize(x, dst, c->cols);
}

static void q_worker(void *arg, int ith, int nth)
{
    q_job *j = arg;
    long lo, hi;
    tp_range(j->units, ith, nth, &lo, &hi);
    int i = 0;
    for (long u = lo; u < hi; u++) {
        while (u >= j->cv[i].unit0 + j->cv[i].units) i++;
        q_unit(&j->cv[i], u - j->cv[i].unit0);
    }
}

static llm_status act_reserve(cpu_ctx *c, size_t bytes)
{
    if (bytes <= c->act_cap)
        return LLM_OK;
    void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p)
        return LLM_ERR_NOMEM;
    free(c->act);
    c->act = p;
    c->act_cap = bytes;
    return LLM_OK;
}

/* Bytes one conversion of n_tok rows of cols values to format a takes
 * (whole 8-row tiles where the format has them), rounded to 64. */
static size_t act_bytes(const cpu_act *a, int cols, int n_tok)
{
    size_t rows = (size_t)(n_tok > cpu_act_tiled(a, n_tok) ? n_tok : cpu_act_tiled(a, n_tok));
    return (a->row_bytes(cols) * rows + 63) / 64 * 64;
}

/* Sets every part's activation: x itself for float formats, else one
 * conversion per (input, format kind), all sized first so that one
 * reservation holds them (a second could move the first conversion),
 * then made in one pass of the pool - or on this thread when every input
 * is a few tokens, since waking the pool costs more than the work. cv has
 * room for one conversion per part. */
static llm_status mm_acts(cpu_ctx *c, mm_part *parts, int n, mm_conv *cv)
{
    int n_cv = 0, small = 1;
    size_t total = 0;
    long units = 0;
    for (int i = 0; i < n; i++) {
        mm_part *p = &parts[i];
        const cpu_act *a = p->pk ? p->pk->act : p->k->act[p->w->type];
        p->conv = -1;
        for (int m = n_cv - 1; a->kind && m >= 0 && p->conv < 0; m--)
            if (cv[m].a->kind == a->kind && cv[m].x == p->x && cv[m].n_tok == p->n_tok && cv[m].cols == (int)p->w->cols)
                p->conv = m;
        if (a->kind && p->conv < 0) {
            cv[n_cv] = (mm_conv){a, p->x, total, NULL, a->row_bytes((int)p->w->cols), (int)p->w->cols, p->n_tok, units,
                                 q_units(a, p->n_tok)};
            total += act_bytes(a, (int)p->w->cols, p->n_tok);
            units += cv[n_cv].units;
            small &= p->n_tok < 4;
            p->conv = n_cv++;
        }
    }
    if (act_reserve(c, total))
        return LLM_ERR_NOMEM;
    for (int m = 0; m < n_cv; m++) cv[m].dst = (char *)c->act + cv[m].off;
    for (int i = 0; i < n; i++) {
        mm_part *p = &parts[i];
        p->act = p->conv < 0 ? (const void *)p->x : cv[p->conv].dst;
        p->act_row = p->conv < 0 ? (size_t)p->w->cols * sizeof(float) : cv[p->conv].dst_row;
    }
    q_job q = {cv, n_cv, units};
    if (n_cv && small)
        q_worker(&q, 0, 1);
    else if (n_cv)
        tp_run(c->pool, q_worker, &q);
    return LLM_OK;
}

/* parts[i] (w, y, x, n_tok set) with kernels chosen and rows numbered;
 * LLM_ERR_UNSUPPORTED for a type no kernel computes. */
static llm_status mm_prepare(cpu_ctx *c, mm_part *parts, int n, mm_job *j)
{
    *j = (mm_job){parts, n, 0, 0, 0};
    for (int i = 0; i < n; i++) {
        mm_part *p = &parts[i];
        if (!quant_supported(p->w->type) || !cpu_kernels_scalar()->dot[p->w->type])
            return LLM_ERR_UNSUPPORTED;
        p->k = c->k->dot[p->w->type] ? c->k : cpu_kernels_scalar();
        p->pk = p->w->packed ? c->k->pack[p->w->type] : NULL;
        p->base = j->total_rows;
        j->total_rows += p->w->rows;
        j->max_tok = p->n_tok > j->max_tok ? p->n_tok : j->max_tok;
    }
    return LLM_OK;
}

/* Converts the inputs, then every part's rows in one pass of the pool. */
static llm_status mm_run(cpu_ctx *c, mm_part *parts, int n, mm_conv *cv)
{
    mm_job j;
    llm_status st = mm_prepare(c, parts, n, &j);
    if (st)
        return st;
    double t0 = llm_clock_mono_s();
    if ((st = mm_acts(c, parts, n, cv)))
        return st;
    if (j.total_rows > 0)
        tp_run(c->pool, mm_worker, &j);
    atomic_fetch_add_explicit(&c->matmul_ns, (uint64_t)((llm_clock_mono_s() - t0) * 1e9), memory_order_relaxed);
    return LLM_OK;
}

static llm_status cpu_matmul(llm_backend *b, const llm_matmul *ops, int n_ops, const float *x, int n_tok)
{
    mm_part parts[LLM_MATMUL_MAX_GROUP];
    mm_conv cv[LLM_MATMUL_MAX_GROUP];
    if (n_ops < 1 || n_ops > LLM_MATMUL_MAX_GROUP)
        return LLM_ERR_INVALID_ARG;
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].w->cols != ops[0].w->cols)
            return LLM_ERR_INVALID_ARG;
        parts[i] = (mm_part){.w = ops[i].w, .y = ops[i].y, .x = x, .n_tok = n_tok};
    }
    return mm_run(ctx_of(b), parts, n_ops, cv);
}

/* Grouped matmuls with inputs of their own (a MoE layer's experts): the
 * parts and conversions live in scratch kept between calls. */
static llm_status cpu_matmul_segs(llm_backend *b, const llm_matmul_seg *segs, int n_segs)
{
    cpu_ctx *c = ctx_of(b);
    if (n_segs < 0 || n_segs > LLM_MATMUL_MAX_SEGS)
        return LLM_ERR_INVALID_ARG;
    if (n_segs > c->seg_cap) {
        mm_part *p = realloc(c->seg_parts, sizeof *p * (size_t)n_segs); /* lint: realloc checked */
        if (!p)
            return LLM_ERR_NOMEM;
        c->seg_parts = p;
        mm_conv *v = realloc(c->seg_convs, sizeof *v * (size_t)n_segs); /* lint: realloc checked */
        if (!v)
            return LLM_ERR_NOMEM;
        c->seg_convs = v;
        c->seg_cap = n_segs;
    }
    mm_part *parts = c->seg_parts;
    int n = 0;
    for (int i = 0; i < n_segs; i++) {
        if (segs[i].n_tok < 0)
            return LLM_ERR_INVALID_ARG;
        if (segs[i].n_tok > 0) /* (an empty segment has nothing to compute) */
            parts[n++] = (mm_part){.w = segs[i].w, .y = segs[i].y, .x = segs[i].x, .n_tok = segs[i].n_tok};
    }
    return n ? mm_run(c, parts, n, c->seg_convs) : LLM_OK;
}

/* ---- element-wise ops ------------------------------------------------------ */

/* Below this many elements an op runs on the calling thread: waking the
 * pool costs more than the work (decode steps). */
#define CPU_PAR_MIN 16384

typedef struct ew_job {
    const float *a, *b, *w;
    float *out;
    size_t n;       /* elements, or rows for row ops */
    int dim;
    float eps;
    float s;        /* scale's factor */
    const llm_rope_args *rope;
    cpu_gated_fn gated; /* swiglu's or geglu's kernel */
} ew_job;

static void rmsnorm_rows(const ew_job *j, long lo, long hi)
{
    for (long t = lo; t < hi; t++) {
        const float *x = j->a + (size_t)t * j->dim;
        float *o = j->out + (size_t)t * j->dim;
        double ss = 0; /* double: dim-long sums of squares lose bits in float */
        for (int i = 0; i < j->dim; i++) ss += (double)x[i] * x[i];
        float s = (float)(1.0 / sqrt(ss / j->dim + j->eps));
        for (int i = 0; i < j->dim; i++) o[i] = x[i] * s * j->w[i];
    }
}

static void rmsnorm_worker(void *arg, int ith, int nth)
{
    long lo, hi;
    tp_range((long)((ew_job *)arg)->n, ith, nth, &lo, &hi);
    rmsnorm_rows(arg, lo, hi);
}

/* swiglu and geglu: the set's kernel over this thread's range, in calls
 * of at most 2^30 elements (its count is an int; where a call starts
 * does not change an element's result) */
static void gated_worker(void *arg, int ith, int nth)
{
    ew_job *j = arg;
    long lo, hi;
    tp_range((long)j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i += 1L << 30)
        j->gated(j->a + i, j->b + i, j->out + i, (int)(hi - i < 1L << 30 ? hi - i : 1L << 30));
}

static void scale_worker(void *arg, int ith, int nth)
{
    ew_job *j = arg;
    long lo, hi;
    tp_range((long)j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) j->out[i] *= j->s;
}

static void add_worker(void *arg, int ith, int nth)
{
    ew_job *j = arg;
    long lo, hi;
    tp_range((long)j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++) j->out[i] += j->a[i];
}

static void run_ew(cpu_ctx *c, tp_fn fn, ew_job *j, size_t elems)
{
    if (elems < CPU_PAR_MIN)
        fn(j, 0, 1);
    else
        tp_run(c->pool, fn, j);
}

static void cpu_rmsnorm(llm_backend *b, const float *x, const float *w, int n_tok, int dim, float eps, float *out)
{
    ew_job j = {.a = x, .w = w, .out = out, .n = (size_t)n_tok, .dim = dim, .eps = eps};
    run_ew(ctx_of(b), rmsnorm_worker, &j, (size_t)n_tok * (size_t)dim);
}

static void rope_rows(const llm_rope_args *a, long lo, long hi)
{
    int half = a->rot_dim / 2;
    float freq[LLM_MAX_ROT_DIM / 2]; /* the frequencies do not depend on the token */
    LLM_ASSERT(half <= LLM_MAX_ROT_DIM / 2);
    llm_backend_rope_freqs(a->theta, a->rot_dim, a->freq_factors, freq);
    for (long t = lo; t < hi; t++) {
        float p = (float)a->pos[t] * a->freq_scale;
        for (int i = 0; i < half; i++) {
            float ang = p * freq[i], cs = cosf(ang), sn = sinf(ang);
            for (int h = 0; h < a->n_head; h++) {
                float *v = a->x + ((size_t)t * a->n_head + h) * a->head_dim;
                int i0 = a->neox ? i : 2 * i, i1 = a->neox ? i + half : 2 * i + 1;
                float x0 = v[i0], x1 = v[i1];
                v[i0] = x0 * cs - x1 * sn;
                v[i1] = x0 * sn + x1 * cs;
            }
        }
    }
}

static void rope_worker(void *arg, int ith, int nth)
{
    const llm_rope_args *a = ((ew_job *)arg)->rope;
    long lo, hi;
    tp_range(a->n_tok, ith, nth, &lo, &hi);
    rope_rows(a, lo, hi);
}

static void cpu_rope(llm_backend *b, const llm_rope_args *a)
{
    ew_job j = {.rope = a};
    run_ew(ctx_of(b), rope_worker, &j, (size_t)a->n_tok * (size_t)a->n_head * (size_t)a->head_dim);
}

static void cpu_swiglu(llm_backend *b, const float *g, const float *u, size_t n, float *out)
{
    ew_job j = {.a = g, .b = u, .out = out, .n = n, .gated = ctx_of(b)->k->swiglu};
    run_ew(ctx_of(b), gated_worker, &j, n);
}

static void cpu_geglu(llm_backend *b, const float *g, const float *u, size_t n, float *out)
{
    ew_job j = {.a = g, .b = u, .out = out, .n = n, .gated = ctx_of(b)->k->geglu};
    run_ew(ctx_of(b), gated_worker, &j, n);
}

static void cpu_scale(llm_backend *b, float *x, float s, size_t n)
{
    ew_job j = {.out = x, .n = n, .s = s};
    run_ew(ctx_of(b), scale_worker, &j, n);
}

static void cpu_add(llm_backend *b, float *y, const float *x, size_t n)
{
    ew_job j = {.a = x, .out = y, .n = n};
    run_ew(ctx_of(b), add_worker, &j, n);
}

static void cpu_add_bias(llm_backend *b, float *x, const float *bias, int n_tok, int dim)
{
    (void)b;
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < dim; i++) x[(size_t)t * dim + i] += bias[i];
}

static void cpu_add_rows(llm_backend *b, float *y, const int32_t *rows, const float *w, const float *x, int n, int dim,
                         int set)
{
    (void)b;
    for (int i = 0; i < n; i++) {
        float *yr = y + (size_t)rows[i] * dim;
        const float *xr = x + (size_t)i * dim;
        if (set)
            for (int j = 0; j < dim; j++) yr[j] = w[i] * xr[j];
        else
            for (int j = 0; j < dim; j++) yr[j] += w[i] * xr[j];
    }
}

static void cpu_get_rows(llm_backend *b, const llm_weight *emb, const int32_t *ids, int n, float *out)
{
    (void)b;
    for (int i = 0; i < n; i++)
        quant_dequantize_row(emb->type, (const char *)emb->data + (size_t)ids[i] * emb->row_bytes,
                             out + (size_t)i * emb->cols, (size_t)emb->cols);
}

/* ---- memory ---------------------------------------------------------------- */

/* Each buffer starts 64 bytes into its allocation; the size sits before it
 * (for the count /metrics shows). */
static void *cpu_buffer_alloc(llm_backend *b, size_t bytes)
{
    size_t n = (bytes + 63) / 64 * 64;
    if (n < bytes || n > SIZE_MAX - 64)
        return NULL;
    char *p = aligned_alloc(64, n + 64);
    if (!p)
        return NULL;
    *(size_t *)p = n;
    atomic_fetch_add(&ctx_of(b)->used, n);
    return p + 64;
}

static void cpu_buffer_free(llm_backend *b, void *p)
{
    char *base = (char *)p - 64;
    atomic_fetch_sub(&ctx_of(b)->used, *(size_t *)base);
    free(base);
}

/* A value of /proc/meminfo in bytes (0 when missing). */
static size_t meminfo(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    unsigned long long kb = 0;
    size_t klen = strlen(key);
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ':' && sscanf(line + klen + 1, "%llu", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (size_t)kb * 1024;
}

static void cpu_mem_stats(llm_backend *b, llm_backend_mem *out)
{
    snprintf(out->device, sizeof out->device, "host");
    out->used = atomic_load(&ctx_of(b)->used);
    out->total = meminfo("MemTotal");
    out->free = meminfo("MemAvailable");
}

/* MemAvailable from /proc/meminfo: what the kernel could give without
 * swapping; free pages where that file is missing. */
size_t cpu_mem_available(llm_backend *b)
{
    (void)b;
    size_t avail = meminfo("MemAvailable");
    if (avail)
        return avail;
    long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (size_t)pages * (size_t)page : 0;
}

/* ---- lifecycle ----------------------------------------------------------- */

static void cpu_free(llm_backend *b)
{
    cpu_ctx *c = ctx_of(b);
    tp_free(c->pool);
    free(c->act);
    free(c->seg_parts);
    free(c->seg_convs);
    free(c->scratch);
    free(c);
    free(b);
}

static llm_status cpu_attention_timed(llm_backend *b, const llm_attn_args *a)
{
    double t0 = llm_clock_mono_s();
    llm_status st = cpu_attention(b, a);
    atomic_fetch_add_explicit(&ctx_of(b)->attn_ns, (uint64_t)((llm_clock_mono_s() - t0) * 1e9), memory_order_relaxed);
    return st;
}

static const struct llm_backend_i cpu_iface = {
    .name = "cpu",
    .free = cpu_free,
    .matmul = cpu_matmul,
    .matmul_segs = cpu_matmul_segs,
    .lora = cpu_lora,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .geglu = cpu_geglu,
    .add = cpu_add,
    .scale = cpu_scale,
    .add_bias = cpu_add_bias,
    .add_rows = cpu_add_rows,
    .get_rows = cpu_get_rows,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention_timed,
    .kv_copy = cpu_kv_copy,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .mem_available = cpu_mem_available,
    .mem_stats = cpu_mem_stats,
    .model_upload = cpu_pack_model,
    .model_release = cpu_pack_release,
};

llm_status llm_backend_cpu_new(const llm_cpu_config *cfg, llm_backend **out, llm_error *err)
{
    *out = NULL;
    quant_init();
    llm_backend *b = calloc(1, sizeof *b);
    cpu_ctx *c = calloc(1, sizeof *c);
    if (!b || !c) {
        free(b);
        free(c);
        return llm_errf(err, LLM_ERR_NOMEM, "cpu backend: no memory");
    }
    int n = cfg && cfg->n_threads > 0 ? cfg->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    llm_status st = tp_new(n > 0 ? n : 1, &c->pool, err);
    if (st) {
        free(b);
        free(c);
        return st;
    }
    c->k = cfg && cfg->force_scalar ? cpu_kernels_scalar() : cpu_kernels_best();
    c->pack = cfg ? cfg->pack : LLM_CPU_PACK_AUTO;
    if (c->pack != LLM_CPU_PACK_AUTO && c->pack != LLM_CPU_PACK_OFF && c->pack != LLM_CPU_PACK_ON) {
        tp_free(c->pool);
        free(c);
        free(b);
        return llm_errf(err, LLM_ERR_INVALID_ARG, "cpu backend: pack %d is not auto, off or on", (int)cfg->pack);
    }
    /* the one place LLM_KERNELS is read, so every program honours it */
    const char *want = cfg && cfg->kernels ? cfg->kernels : cfg && cfg->force_scalar ? NULL : getenv("LLM_KERNELS");
    if (want && *want) {
        const cpu_kernels *const *all = cpu_kernels_all();
        while (*all && strcmp((*all)->name, want)) all++;
        if (!*all) {
            tp_free(c->pool);
            free(c);
            free(b);
            return llm_errf(err, LLM_ERR_UNSUPPORTED, "cpu backend: kernel set '%s'%s is unknown or not usable on this CPU",
                            want, cfg && cfg->kernels ? "" : " (LLM_KERNELS)");
        }
        c->k = *all;
    }
    b->iface = &cpu_iface;
    b->ctx = c;
    *out = b;
    return LLM_OK;
}

const char *llm_backend_cpu_kernels(const llm_backend *b) { return ((const cpu_ctx *)b->ctx)->k->name; }

void llm_backend_cpu_times(const llm_backend *b, uint64_t *matmul_ns, uint64_t *attn_ns)
{
    cpu_ctx *c = b && b->iface == &cpu_iface ? b->ctx : NULL;
    *matmul_ns = c ? atomic_load_explicit(&c->matmul_ns, memory_order_relaxed) : 0;
    *attn_ns = c ? atomic_load_explicit(&c->attn_ns, memory_order_relaxed) : 0;
}

typedef struct peak_job {
    const cpu_kernels *k;
    long iters;
    double each; /* one thread's operations (all run the same loop) */
    int nth;
} peak_job;

static void peak_worker(void *arg, int ith, int nth)
{
    peak_job *j = arg;
    double ops = j->k->int8_spin(j->iters, ith);
    if (ith == 0)
        j->each = ops, j->nth = nth;
}

double llm_backend_cpu_int8_peak(llm_backend *b)
{
    if (!b || b->iface != &cpu_iface || !ctx_of(b)->k->int8_spin)
        return 0;
    cpu_ctx *c = ctx_of(b);
    peak_job j = {c->k, 200000, 0, 0};
    tp_run(c->pool, peak_worker, &j); /* wakes the cores to their working clock */
    double best = 0;
    for (int rep = 0; rep < 3; rep++) { /* the best of three: a shared machine's noise only slows */
        j.iters = 2000000;
        double t0 = llm_clock_mono_s();
        tp_run(c->pool, peak_worker, &j);
        double dt = llm_clock_mono_s() - t0, ops = j.each * j.nth;
        if (dt > 0 && ops / dt > best)
            best = ops / dt;
    }
    return best;
}

void llm_backend_free(llm_backend *b)
{
    if (b)
        b->iface->free(b);
}
