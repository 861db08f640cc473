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

/* One weight of a group, with x already converted to its activation type. */
typedef struct mm_part {
    const cpu_kernels *k; /* the set's, or the scalar set where it lacks the type */
    const cpu_pack *pk;   /* the set's tiles, when w was packed by this backend */
    const llm_weight *w;
    float *y;
    const void *act;
    size_t act_row;
} mm_part;

typedef struct mm_job {
    mm_part parts[LLM_MATMUL_MAX_GROUP];
    int n_parts, n_tok;
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
static void mm_packed(const mm_part *p, int n_tok, long r0, long r1)
{
    long gs = p->pk->group, g0 = (r0 + gs - 1) / gs, g1 = (r1 + gs - 1) / gs;
    if (g1 > g0)
        p->pk->gemm(p->w->packed, p->w->rows, p->w->cols, g0, g1, p->act, p->act_row, n_tok, p->y, (size_t)p->w->rows);
}

/* Rows [r0, r1) of one weight against every token; tokens go 16, 8 or 4
 * at a time through the tile kernels when the set has them. */
static void mm_rows(const mm_part *p, int n_tok, long r0, long r1)
{
    const cpu_kernels *k = p->k;
    cpu_dot_fn dot = k->dot[p->w->type];
    cpu_dot4_fn dot4 = k->dot4[p->w->type], dot8 = k->dot8[p->w->type], dot16 = k->dot16[p->w->type];
    const char *wd = p->w->data;
    int cols = (int)p->w->cols;
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

/* Rows [lo, hi) of the group's concatenated rows, in chunks small enough
 * that a chunk's weights stay in cache while every token uses them (a
 * packed weight's tile loops its groups that way itself). */
static void mm_range(const mm_job *j, long lo, long hi)
{
    long base = 0;
    for (int i = 0; i < j->n_parts; i++) {
        const mm_part *p = &j->parts[i];
        long a = lo > base ? lo - base : 0, b = hi - base < p->w->rows ? hi - base : p->w->rows;
        if (p->pk) {
            if (a < b)
                mm_packed(p, j->n_tok, a, b);
        } else {
            for (long r0 = a; r0 < b; r0 += CPU_ROW_CHUNK)
                mm_rows(p, j->n_tok, r0, r0 + CPU_ROW_CHUNK < b ? r0 + CPU_ROW_CHUNK : b);
        }
        base += p->w->rows;
    }
}

/* Decode (few tokens) gives each thread one contiguous range, so its
 * weight stream stays sequential for the prefetcher. Prefill hands out
 * chunks on demand: compute-bound work then finishes together even when a
 * thread starts late or its vCPU is preempted. */
static void mm_worker(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    if (j->n_tok < 8) {
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

typedef struct q_job {
    const cpu_act *a;
    const float *x;
    void *dst;
    size_t dst_row;
    int cols, n_tok;
} q_job;

/* Work units: 8-token tiles first (when the format has them), then single
 * rows; a tile occupies the bytes of its 8 rows. */
static void q_worker(void *arg, int ith, int nth)
{
    q_job *j = arg;
    int tiles = cpu_act_tiled(j->a, j->n_tok) / 8, tiled = tiles * 8;
    long lo, hi;
    tp_range(tiles + (j->n_tok > tiled ? j->n_tok - tiled : 0), ith, nth, &lo, &hi);
    for (long u = lo; u < hi; u++) {
        long t = u < tiles ? 8 * u : tiled + (u - tiles);
        const float *x = j->x + (size_t)t * (size_t)j->cols;
        char *dst = (char *)j->dst + (size_t)t * j->dst_row;
        if (u < tiles)
            j->a->quantize8(x, (size_t)j->cols, j->n_tok - t < 8 ? (int)(j->n_tok - t) : 8, dst, j->cols);
        else
            j->a->quantize(x, dst, j->cols);
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

/* Converts x to format a at dst; few tokens are converted on this thread,
 * since waking the pool costs more than the work. */
static void convert_x(cpu_ctx *c, const cpu_act *a, const float *x, int cols, int n_tok, void *dst)
{
    q_job q = {a, x, dst, a->row_bytes(cols), cols, n_tok};
    if (n_tok < 4)
        q_worker(&q, 0, 1);
    else
        tp_run(c->pool, q_worker, &q);
}

/* Sets every part's activation: x itself for float formats, else one
 * conversion per format kind, all sized first so that one reservation
 * holds them (a second reservation could move the first conversion). */
static llm_status group_acts(cpu_ctx *c, mm_job *j, const float *x, int n_tok)
{
    const cpu_act *fmt[LLM_MATMUL_MAX_GROUP];
    size_t off[LLM_MATMUL_MAX_GROUP], total = 0;
    int n_fmt = 0, which[LLM_MATMUL_MAX_GROUP], cols = (int)j->parts[0].w->cols;
    for (int i = 0; i < j->n_parts; i++) {
        const cpu_act *a = j->parts[i].pk ? j->parts[i].pk->act : j->parts[i].k->act[j->parts[i].w->type];
        which[i] = -1;
        for (int m = 0; a->kind && m < n_fmt && which[i] < 0; m++)
            if (fmt[m]->kind == a->kind)
                which[i] = m;
        if (a->kind && which[i] < 0) {
            fmt[n_fmt] = a;
            off[n_fmt] = total;
            total += act_bytes(a, cols, n_tok);
            which[i] = n_fmt++;
        }
    }
    if (act_reserve(c, total))
        return LLM_ERR_NOMEM;
    for (int m = 0; m < n_fmt; m++) convert_x(c, fmt[m], x, cols, n_tok, (char *)c->act + off[m]);
    for (int i = 0; i < j->n_parts; i++) {
        mm_part *p = &j->parts[i];
        p->act = which[i] < 0 ? (const void *)x : (const char *)c->act + off[which[i]];
        p->act_row = which[i] < 0 ? (size_t)cols * sizeof(float) : fmt[which[i]]->row_bytes(cols);
    }
    return LLM_OK;
}

static llm_status cpu_matmul(llm_backend *b, const llm_matmul *ops, int n_ops, const float *x, int n_tok)
{
    cpu_ctx *c = ctx_of(b);
    if (n_ops < 1 || n_ops > LLM_MATMUL_MAX_GROUP)
        return LLM_ERR_INVALID_ARG;
    for (int i = 0; i < n_ops; i++)
        if (!quant_supported(ops[i].w->type) || !cpu_kernels_scalar()->dot[ops[i].w->type])
            return LLM_ERR_UNSUPPORTED;
    mm_job j = {{{0}}, n_ops, n_tok, 0, 0};
    for (int i = 0; i < n_ops; i++) {
        if (ops[i].w->cols != ops[0].w->cols)
            return LLM_ERR_INVALID_ARG;
        j.parts[i].k = c->k->dot[ops[i].w->type] ? c->k : cpu_kernels_scalar();
        j.parts[i].pk = ops[i].w->packed ? c->k->pack[ops[i].w->type] : NULL;
        j.parts[i].w = ops[i].w;
        j.parts[i].y = ops[i].y;
        j.total_rows += ops[i].w->rows;
    }
    double t0 = llm_clock_mono_s();
    llm_status st = group_acts(c, &j, x, n_tok);
    if (st)
        return st;
    tp_run(c->pool, mm_worker, &j);
    atomic_fetch_add_explicit(&c->matmul_ns, (uint64_t)((llm_clock_mono_s() - t0) * 1e9), memory_order_relaxed);
    return LLM_OK;
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
