/* backend_cpu.c - the CPU implementation of the backend interface.
 *
 * Matmuls quantize the activations once (per call, to the weight type's
 * activation type), then split the weight rows across the thread pool; each
 * thread streams its rows once and applies them to every token, so a batch
 * costs little more memory traffic than one token. Attention splits
 * (token, head) pairs across threads. */
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "cpu/kernels.h"
#include "cpu/threadpool.h"
#include "llm/backend.h"

#define CPU_ROW_CHUNK 16 /* weight rows kept hot in cache while tokens loop */

typedef struct cpu_ctx {
    tp_pool *pool;
    const cpu_kernels *k;
    void *act;          /* quantized activations, grown on demand */
    size_t act_cap;
    float *scratch;     /* attention scores: per thread, max_ctx floats */
    size_t scratch_per_thread;
} cpu_ctx;

static cpu_ctx *ctx_of(llm_backend *b) { return b->ctx; }

/* ---- matmul -------------------------------------------------------------- */

typedef struct mm_job {
    const cpu_kernels *k;
    const llm_weight *w;
    const void *act;
    size_t act_row;
    int n_tok;
    float *y;
} mm_job;

static void mm_worker(void *arg, int ith, int nth)
{
    mm_job *j = arg;
    long lo, hi;
    tp_range((long)j->w->rows, ith, nth, &lo, &hi);
    cpu_dot_fn dot = j->k->dot[j->w->type];
    const char *wd = j->w->data;
    int cols = (int)j->w->cols;
    for (long r0 = lo; r0 < hi; r0 += CPU_ROW_CHUNK) {
        long r1 = r0 + CPU_ROW_CHUNK < hi ? r0 + CPU_ROW_CHUNK : hi;
        for (int t = 0; t < j->n_tok; t++) {
            const char *x = (const char *)j->act + (size_t)t * j->act_row;
            float *yt = j->y + (size_t)t * (size_t)j->w->rows;
            for (long r = r0; r < r1; r++)
                yt[r] = dot(wd + (size_t)r * j->w->row_bytes, x, cols);
        }
    }
}

typedef struct q_job {
    cpu_quant_fn q;
    const float *x;
    void *dst;
    size_t dst_row;
    int cols, n_tok;
} q_job;

static void q_worker(void *arg, int ith, int nth)
{
    q_job *j = arg;
    long lo, hi;
    tp_range(j->n_tok, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        j->q(j->x + (size_t)t * (size_t)j->cols, (char *)j->dst + (size_t)t * j->dst_row, j->cols);
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

static llm_status cpu_matmul(llm_backend *b, const llm_weight *w, const float *x, int n_tok, float *y)
{
    cpu_ctx *c = ctx_of(b);
    quant_type at = cpu_act_type(w->type);
    mm_job j = {c->k, w, x, (size_t)w->cols * sizeof(float), n_tok, y};
    if (at != QT_F32) {
        size_t row = quant_row_bytes(at, (size_t)w->cols);
        if (row == 0 || act_reserve(c, row * (size_t)n_tok))
            return row ? LLM_ERR_NOMEM : LLM_ERR_INVALID_ARG;
        q_job q = {c->k->quantize[at], x, c->act, row, (int)w->cols, n_tok};
        tp_run(c->pool, q_worker, &q);
        j.act = c->act;
        j.act_row = row;
    }
    tp_run(c->pool, mm_worker, &j);
    return LLM_OK;
}

/* ---- element-wise ops ---------------------------------------------------- */

static void cpu_rmsnorm(llm_backend *b, const float *x, const float *w, int n_tok, int dim, float eps, float *out)
{
    (void)b;
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (size_t)t * dim;
        float *o = out + (size_t)t * dim;
        double ss = 0; /* double: dim-long sums of squares lose bits in float */
        for (int i = 0; i < dim; i++) ss += (double)xt[i] * xt[i];
        float s = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++) o[i] = xt[i] * s * w[i];
    }
}

static void cpu_rope(llm_backend *b, const llm_rope_args *a)
{
    (void)b;
    int half = a->rot_dim / 2;
    for (int t = 0; t < a->n_tok; t++) {
        float p = (float)(a->pos0 + t) * a->freq_scale;
        for (int i = 0; i < half; i++) {
            float freq = powf(a->theta, -2.0f * (float)i / (float)a->rot_dim);
            if (a->freq_factors)
                freq /= a->freq_factors[i];
            float ang = p * freq, cs = cosf(ang), sn = sinf(ang);
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

static void cpu_swiglu(llm_backend *b, const float *g, const float *u, size_t n, float *out)
{
    (void)b;
    for (size_t i = 0; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void cpu_add(llm_backend *b, float *y, const float *x, size_t n)
{
    (void)b;
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

static void cpu_get_rows(llm_backend *b, const llm_weight *emb, const int32_t *ids, int n, float *out)
{
    (void)b;
    for (int i = 0; i < n; i++)
        quant_dequantize_row(emb->type, (const char *)emb->data + (size_t)ids[i] * emb->row_bytes,
                             out + (size_t)i * emb->cols, (size_t)emb->cols);
}

/* Pointer to the K (or V) row of logical position p. */
static float *kv_row(const llm_kv_view *kv, float *base, int p)
{
    size_t blk = (size_t)kv->block_table[p / kv->block_size];
    return base + (blk * kv->block_size + (size_t)(p % kv->block_size)) * kv->kv_dim;
}

static void cpu_kv_write(llm_backend *b, const llm_kv_view *kv, int pos0, int n_tok, const float *k, const float *v)
{
    (void)b;
    for (int t = 0; t < n_tok; t++) {
        memcpy(kv_row(kv, kv->k, pos0 + t), k + (size_t)t * kv->kv_dim, sizeof(float) * kv->kv_dim);
        memcpy(kv_row(kv, kv->v, pos0 + t), v + (size_t)t * kv->kv_dim, sizeof(float) * kv->kv_dim);
    }
}

/* ---- attention ----------------------------------------------------------- */

typedef struct attn_job {
    const llm_attn_args *a;
    cpu_ctx *c;
} attn_job;

static void attn_one(const llm_attn_args *a, const cpu_kernels *k, float *sc, int t, int h)
{
    int n_kv = a->pos0 + t + 1, hd = a->head_dim;
    int kvh = h / (a->n_head / a->n_head_kv);
    const float *q = a->q + ((size_t)t * a->n_head + h) * hd;
    float *o = a->out + ((size_t)t * a->n_head + h) * hd;
    float mx = -INFINITY;
    for (int p = 0; p < n_kv; p++) {
        sc[p] = k->dot_f32(q, kv_row(&a->kv, a->kv.k, p) + kvh * hd, hd) * a->scale;
        mx = fmaxf(mx, sc[p]);
    }
    float sum = 0;
    for (int p = 0; p < n_kv; p++) {
        sc[p] = expf(sc[p] - mx);
        sum += sc[p];
    }
    memset(o, 0, sizeof(float) * hd);
    for (int p = 0; p < n_kv; p++)
        k->axpy(o, sc[p] / sum, kv_row(&a->kv, a->kv.v, p) + kvh * hd, hd);
}

static void attn_worker(void *arg, int ith, int nth)
{
    attn_job *j = arg;
    const llm_attn_args *a = j->a;
    float *sc = j->c->scratch + (size_t)ith * j->c->scratch_per_thread;
    long lo, hi;
    tp_range((long)a->n_tok * a->n_head, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++)
        attn_one(a, j->c->k, sc, (int)(i / a->n_head), (int)(i % a->n_head));
}

static llm_status cpu_attention(llm_backend *b, const llm_attn_args *a)
{
    cpu_ctx *c = ctx_of(b);
    size_t need = (size_t)(a->pos0 + a->n_tok);
    if (need > c->scratch_per_thread) {
        float *s = malloc(need * sizeof(float) * (size_t)tp_size(c->pool));
        if (!s)
            return LLM_ERR_NOMEM;
        free(c->scratch);
        c->scratch = s;
        c->scratch_per_thread = need;
    }
    attn_job j = {a, c};
    tp_run(c->pool, attn_worker, &j);
    return LLM_OK;
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

static const struct llm_backend_i cpu_iface = {
    .name = "cpu",
    .free = cpu_free,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .rope = cpu_rope,
    .swiglu = cpu_swiglu,
    .add = cpu_add,
    .get_rows = cpu_get_rows,
    .kv_write = cpu_kv_write,
    .attention = cpu_attention,
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
    b->iface = &cpu_iface;
    b->ctx = c;
    *out = b;
    return LLM_OK;
}

const char *llm_backend_cpu_kernels(const llm_backend *b) { return ((const cpu_ctx *)b->ctx)->k->name; }

void llm_backend_free(llm_backend *b)
{
    if (b)
        b->iface->free(b);
}
