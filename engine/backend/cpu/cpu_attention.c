/* cpu_attention.c - the CPU backend's paged KV cache operations: storing
 * K/V rows in the cache's type, copying blocks (copy-on-write), and causal
 * attention for a batch of sequences through their block tables.
 *
 * Attention work items are (chunk of query rows, KV head) pairs, handed out
 * on demand since their cost grows with position. An item serves every
 * query head of its GQA group and several rows of one sequence, so a block
 * of F16 or Q8_0 K/V is converted to float once for all of them. A kernel
 * set with integer Q8_0 scores (attn_dots_q8q) reads Q8_0 K in place for
 * every row of the model instead, scoring it in 8-bit integers with the
 * query rounded to 8 bits per 32 values (as llama.cpp does); V is still
 * summed in floats. Every item runs the same code whatever else is in the
 * batch, so a row's result does not depend on batch composition. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_impl.h"

/* Bytes of row p's K (or V) in layer storage `base`. */
static char *kv_row(const llm_kv_layer *kv, void *base, const int32_t *table, int p)
{
    size_t blk = (size_t)table[p / kv->block_size];
    return (char *)base + (blk * (size_t)kv->block_size + (size_t)(p % kv->block_size)) * kv->row_bytes;
}

static void kv_store(const cpu_kernels *k, const llm_kv_layer *kv, const float *x, void *dst)
{
    if (kv->type == QT_F16)
        k->to_f16(x, dst, kv->kv_dim);
    else
        quant_quantize_row(kv->type, x, dst, (size_t)kv->kv_dim);
}

void cpu_kv_write(llm_backend *b, const llm_kv_layer *kv, const llm_batch_seq *seqs, int n_seqs, const float *k,
                  const float *v)
{
    const cpu_kernels *kn = ((cpu_ctx *)b->ctx)->k;
    for (int s = 0; s < n_seqs; s++)
        for (int t = 0; t < seqs[s].n_tok; t++) {
            size_t row = (size_t)(seqs[s].tok0 + t) * (size_t)kv->kv_dim;
            int p = seqs[s].pos0 + t;
            kv_store(kn, kv, k + row, kv_row(kv, kv->k, seqs[s].block_table, p));
            kv_store(kn, kv, v + row, kv_row(kv, kv->v, seqs[s].block_table, p));
        }
}

void cpu_kv_copy(llm_backend *b, const llm_kv_layer *layers, int n_layers, const int32_t *src, const int32_t *dst,
                 int n)
{
    (void)b;
    for (int l = 0; l < n_layers; l++) {
        const llm_kv_layer *kv = &layers[l];
        size_t bb = (size_t)kv->block_size * kv->row_bytes;
        for (int i = 0; i < n; i++) {
            memcpy((char *)kv->k + (size_t)dst[i] * bb, (char *)kv->k + (size_t)src[i] * bb, bb);
            memcpy((char *)kv->v + (size_t)dst[i] * bb, (char *)kv->v + (size_t)src[i] * bb, bb);
        }
    }
}

/* Query rows per work item: rows of one sequence share each converted K/V
 * block (with integer Q8_0 scores, each prepared K tile); bounded so the
 * scores of (rows x heads) stay small. */
#define ATTN_ROWS_HEADS 64

typedef struct attn_job {
    const llm_attn_args *a;
    cpu_ctx *c;
    int group;      /* query heads per KV head */
    int rows;       /* query rows per item */
    int whole;      /* a one-row sequence is one item over every KV head (see seq_heads) */
    size_t per_row; /* score rows an item may need: group x rows, or every query head (whole) */
    int q8q;        /* Q8_0 K scored in integers (attn_dots_q8q): every row of this shape */
    size_t q8_floats; /* the scratch's room for an item's rounded query rows (q8q), in floats, 64-byte multiple */
    long n_items;
    _Atomic long next;
} attn_job;

/* Thread scratch: one float K/V block (tile), the item's query rows as
 * cpu_q8q blocks (q8q: q8_row blocks a row, heads g0's first), then scores
 * (rows * group, sc_stride). */
typedef struct attn_scratch {
    float *sc, *tile;
    size_t sc_stride;
    cpu_q8q *q8;
    size_t q8_row;
} attn_scratch;

/* Rows [p0, p0 + n) of KV head g as floats: in place for F32 storage,
 * else converted into the tile. *stride gets the float distance of rows. */
static const float *kv_block(const cpu_kernels *k, const llm_kv_layer *kv, void *base, const int32_t *table, int p0,
                             int n, int g, int hd, float *tile, size_t *stride)
{
    const char *row = kv_row(kv, base, table, p0) + quant_row_bytes(kv->type, (size_t)g * hd);
    if (kv->type == QT_F32) {
        *stride = kv->row_bytes / sizeof(float);
        return (const float *)row;
    }
    for (int i = 0; i < n; i++) k->to_f32[kv->type](row + (size_t)i * kv->row_bytes, tile + (size_t)i * hd, hd);
    *stride = (size_t)hd;
    return tile;
}

/* The positions [*a0, *a1) of block [p0, p0 + n) that row t of s sees
 * (its window, up to itself); 0 when none. */
static int row_span(const llm_attn_args *a, const llm_batch_seq *s, int t, int p0, int n, int *a0, int *a1)
{
    int pos = s->pos0 + t, lo = llm_attn_first(pos, a->window);
    *a0 = lo > p0 ? lo : p0;
    *a1 = pos + 1 < p0 + n ? pos + 1 : p0 + n;
    return *a1 > *a0;
}

/* Scores of rows [t0, t1) against the rows [p0, p0 + n) of KV block kb
 * (floats `stride` apart; NULL: rows read in place from kh). */
static void block_dots(const attn_job *j, const llm_batch_seq *s, int t0, int t1, int p0, int n, const float *kb,
                       size_t stride, const void *kh, int g, const attn_scratch *w)
{
    const llm_attn_args *a = j->a;
    int hd = a->head_dim, h0 = g * j->group, a0, a1;
    size_t rb = a->kv->row_bytes;
    for (int t = t0; t < t1; t++) {
        if (!row_span(a, s, t, p0, n, &a0, &a1))
            continue;
        const float *q = a->q + ((size_t)(s->tok0 + t) * a->n_head + h0) * hd;
        float *sc = w->sc + (size_t)(t - t0) * j->group * w->sc_stride + a0;
        for (int h = 0; h < j->group; h++)
            if (kb)
                j->c->k->attn_dots(q + (size_t)h * hd, kb + (size_t)(a0 - p0) * stride, stride, a1 - a0, hd, a->scale,
                                   sc + h * w->sc_stride);
            else
                j->c->k->attn_dots_kv[a->kv->type](q + (size_t)h * hd, (const char *)kh + (size_t)(a0 - p0) * rb, rb,
                                                   a1 - a0, hd, a->scale, sc + h * w->sc_stride);
    }
}

/* block_dots on Q8_0 K rows read in place, in integers, the query rows
 * rounded (the item's, w->q8), never given converted rows (kb). Rows
 * that see the same span of the block go in one call, their heads one
 * after another (so the kernel flips each 8-row K tile once for all of
 * them), where the item holds one KV head: its rows' query heads and
 * score rows are then equally spaced. Each (row, head) score is the same
 * whichever rows share a call (attn_dots_q8q's contract). */
static void block_dots_q8q(const attn_job *j, const llm_batch_seq *s, int t0, int t1, int p0, int n, const float *kb,
                           size_t stride, const void *kh, int g, const attn_scratch *w)
{
    (void)stride;
    (void)g;
    LLM_ASSERT(!kb);
    const llm_attn_args *a = j->a;
    int a0, a1, b0, b1;
    size_t rb = a->kv->row_bytes, heads_q8 = (size_t)j->group * (size_t)(a->head_dim / QK8_0);
    for (int t = t0; t < t1;) {
        if (!row_span(a, s, t, p0, n, &a0, &a1)) {
            t++;
            continue;
        }
        int u = t + 1;
        while (w->q8_row == heads_q8 && u < t1 && row_span(a, s, u, p0, n, &b0, &b1) && b0 == a0 && b1 == a1) u++;
        float *sc = w->sc + (size_t)(t - t0) * j->group * w->sc_stride + a0;
        j->c->k->attn_dots_q8q(w->q8 + (size_t)(t - t0) * w->q8_row, (u - t) * j->group,
                               (const char *)kh + (size_t)(a0 - p0) * rb, rb, a1 - a0, a->head_dim, a->scale, sc,
                               w->sc_stride);
        t = u;
    }
}

/* Outputs of rows [t0, t1) += scores . rows [p0, p0 + n) of V block vb. */
static void block_wsum(const attn_job *j, const llm_batch_seq *s, int t0, int t1, int p0, int n, const float *vb,
                       size_t stride, const void *vh, int g, const attn_scratch *w)
{
    const llm_attn_args *a = j->a;
    int hd = a->head_dim, h0 = g * j->group, a0, a1;
    size_t rb = a->kv->row_bytes;
    for (int t = t0; t < t1; t++) {
        if (!row_span(a, s, t, p0, n, &a0, &a1))
            continue;
        float *o = a->out + ((size_t)(s->tok0 + t) * a->n_head + h0) * hd;
        const float *sc = w->sc + (size_t)(t - t0) * j->group * w->sc_stride + a0;
        if (vb && j->c->k->attn_wsum_heads) { /* the group's heads in one pass over the rows */
            j->c->k->attn_wsum_heads(o, (size_t)hd, sc, w->sc_stride, j->group, vb + (size_t)(a0 - p0) * stride, stride,
                                     a1 - a0, hd);
            continue;
        }
        for (int h = 0; h < j->group; h++)
            if (vb)
                j->c->k->attn_wsum(o + (size_t)h * hd, sc + h * w->sc_stride, vb + (size_t)(a0 - p0) * stride, stride,
                                   a1 - a0, hd);
            else
                j->c->k->attn_wsum_kv[a->kv->type](o + (size_t)h * hd, sc + h * w->sc_stride,
                                                   (const char *)vh + (size_t)(a0 - p0) * rb, rb, a1 - a0, hd);
    }
}

/* A line into L2. As asm: gcc deletes a loop whose body is only
 * __builtin_prefetch (a loop without effects), and did here. (Elsewhere
 * than x86 the builtin stays: not checked there.) */
static inline void prefetch_l2(const char *p)
{
#if defined(__x86_64__) || defined(__i386__)
    __asm__ volatile("prefetcht1 %0" ::"m"(*p));
#else
    __builtin_prefetch(p, 0, 2);
#endif
}

/* Asks for slice k of n_slices of rows [p0, p0 + n) (one block's,
 * contiguous) ahead of their use: an item over every head reads a block
 * whole, and at the row stride, slice by slice, the hardware's prefetch
 * does not follow. A slice per head rather than the block in one burst of
 * some 400 prefetches, which gained almost nothing (our guess, not
 * measured: more than the core's miss queue holds). llama-110m Q8_0, 32
 * sequences at 512, F16 K/V, 2 threads, Zen 4: step 64-84 ms with no
 * prefetch, 63-68 with the burst, 40-48 with slices; same results. */
static void prefetch_slice(const llm_kv_layer *kv, void *base, const int32_t *table, int p0, int n, int k, int n_slices)
{
    const char *r = kv_row(kv, base, table, p0);
    size_t all = (size_t)n * kv->row_bytes, per = (all / (size_t)n_slices + 63) / 64 * 64;
    size_t end = (size_t)(k + 1) * per < all ? (size_t)(k + 1) * per : all;
    for (size_t o = (size_t)k * per; o < end; o += 64) prefetch_l2(r + o);
}

/* The scratch of KV head g's scores (and rounded query rows) in an item
 * from g0 over rows [t0, t1). */
static attn_scratch head_scratch(const attn_job *j, const attn_scratch *w, int t0, int t1, int g, int g0)
{
    attn_scratch wg = *w;
    wg.sc += (size_t)(g - g0) * (size_t)(t1 - t0) * (size_t)j->group * w->sc_stride;
    wg.q8 += (size_t)(g - g0) * (size_t)j->group * (size_t)(j->a->head_dim / QK8_0);
    return wg;
}

/* block_dots, block_dots_q8q or block_wsum. */
typedef void (*block_fn)(const attn_job *j, const llm_batch_seq *s, int t0, int t1, int p0, int n, const float *fb,
                         size_t stride, const void *raw, int g, const attn_scratch *w);

/* fn over K (or V: base) blocks [first, n_kv) of rows [t0, t1), block by
 * block and within a block KV head by head, each head's scores in its part
 * of the scratch; direct: rows read in place, else converted. */
static void kv_pass(const attn_job *j, const llm_batch_seq *s, int t0, int t1, int g0, int g1, int first, int direct,
                    void *base, block_fn fn, const attn_scratch *w)
{
    const llm_attn_args *a = j->a;
    int hd = a->head_dim, bs = a->kv->block_size, n_kv = s->pos0 + t1;
    size_t stride = 0;
    for (int p0 = first; p0 < n_kv; p0 += bs) {
        int n = n_kv - p0 < bs ? n_kv - p0 : bs, next = n_kv - p0 - bs < bs ? n_kv - p0 - bs : bs;
        for (int g = g0; g < g1; g++) {
            if (g1 - g0 > 1 && next > 0) /* the next block, a slice per head */
                prefetch_slice(a->kv, base, s->block_table, p0 + bs, next, g - g0, g1 - g0);
            attn_scratch wg = head_scratch(j, w, t0, t1, g, g0);
            const float *fb = direct ? NULL : kv_block(j->c->k, a->kv, base, s->block_table, p0, n, g, hd, w->tile, &stride);
            fn(j, s, t0, t1, p0, n, fb, stride, kv_row(a->kv, base, s->block_table, p0) + quant_row_bytes(a->kv->type, (size_t)g * hd),
               g, &wg);
        }
    }
}

/* w with rows [t0, t1)'s query heads of KV heads [g0, g1) rounded into
 * its q8 area (whole blocks: hd is a multiple of 32). */
static attn_scratch query_q8q(const attn_job *j, const llm_batch_seq *s, int t0, int t1, int g0, int g1,
                              const attn_scratch *w)
{
    const llm_attn_args *a = j->a;
    size_t hd = (size_t)a->head_dim;
    attn_scratch wq = *w;
    wq.q8_row = (size_t)(g1 - g0) * (size_t)j->group * (hd / QK8_0);
    for (int t = t0; t < t1; t++)
        cpu_q8q_quantize(a->q + ((size_t)(s->tok0 + t) * a->n_head + (size_t)g0 * j->group) * hd,
                         wq.q8 + (size_t)(t - t0) * wq.q8_row, (int)(wq.q8_row * QK8_0));
    return wq;
}

/* Rows [t0, t1) of sequence s, every query head of KV heads [g0, g1),
 * block by block and within a block head by head (so a block's rows are
 * read while they are near). Each row sees positions [first, pos0 + t]
 * (llm_attn_first: its sliding window) and each (row, head) is computed
 * the same way whichever rows and heads share its item. Q8_0 K with
 * integer scores (q8q) is always read in place; otherwise, and for V, F16
 * and Q8_0 blocks used by one or two (row, head) pairs of a KV head are
 * read in place, else converted once for all of them (the same floats
 * either way).
 * Blocks before the first row's window are not read. */
static void attn_item(const attn_job *j, const llm_batch_seq *s, int t0, int t1, int g0, int g1, const attn_scratch *w)
{
    const llm_attn_args *a = j->a;
    int hd = a->head_dim, bs = a->kv->block_size;
    const cpu_kernels *k = j->c->k;
    int direct = k->attn_dots_kv[a->kv->type] && k->attn_wsum_kv[a->kv->type] && (t1 - t0) * j->group <= 2;
    int first = llm_attn_first(s->pos0 + t0, a->window) / bs * bs;
    if (j->q8q) {
        attn_scratch wq = query_q8q(j, s, t0, t1, g0, g1, w);
        kv_pass(j, s, t0, t1, g0, g1, first, 1 /* in place */, a->kv->k, block_dots_q8q, &wq);
    } else
        kv_pass(j, s, t0, t1, g0, g1, first, direct, a->kv->k, block_dots, w);
    for (int g = g0; g < g1; g++) {
        attn_scratch wg = head_scratch(j, w, t0, t1, g, g0);
        for (int t = t0; t < t1; t++)
            for (int h = 0; h < j->group; h++) {
                int lo = llm_attn_first(s->pos0 + t, a->window);
                j->c->k->softmax(wg.sc + ((size_t)(t - t0) * j->group + h) * w->sc_stride + lo, s->pos0 + t + 1 - lo);
                memset(a->out + ((size_t)(s->tok0 + t) * a->n_head + g * j->group + h) * hd, 0, sizeof(float) * (size_t)hd);
            }
    }
    kv_pass(j, s, t0, t1, g0, g1, first, direct, a->kv->v, block_wsum, w);
}

/* KV heads per item of sequence s. Decoding many sequences, one item takes
 * a sequence's every head: a position's K (then V) row is read whole, heads
 * after each other, where items of one head each read a 1/n_head_kv slice
 * of every row at the row stride, a pattern the prefetchers follow poorly
 * (llama-110m Q8_0, 64 sequences at 512: the step spent 3x the KV bytes'
 * read time in attention). Each (row, head) is computed by the same code
 * either way, so the results do not change. */
static int seq_heads(const attn_job *j, const llm_batch_seq *s)
{
    return j->whole && s->n_tok == 1 ? j->a->n_head_kv : 1;
}

/* Items of a sequence: (row chunk, KV head range) pairs. */
static long seq_items(const attn_job *j, const llm_batch_seq *s)
{
    return (long)((s->n_tok + j->rows - 1) / j->rows) * (j->a->n_head_kv / seq_heads(j, s));
}

static void attn_worker(void *arg, int ith, int nth)
{
    (void)nth;
    attn_job *j = arg;
    const llm_attn_args *a = j->a;
    float *base = j->c->scratch + (size_t)ith * j->c->scratch_per_thread;
    size_t tile = (size_t)a->kv->block_size * (size_t)a->head_dim;
    /* the q8 area is floats reused as cpu_q8q blocks (4-byte aligned, as they need) */
    attn_scratch w = {.sc = base + tile + j->q8_floats, .tile = base,
                      .sc_stride = (j->c->scratch_per_thread - tile - j->q8_floats) / j->per_row,
                      .q8 = (cpu_q8q *)(void *)(base + tile)};
    int s = 0;
    long s_first = 0; /* first item of sequence s; a thread's items only grow */
    for (;;) {
        long i = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed);
        if (i >= j->n_items)
            return;
        while (i >= s_first + seq_items(j, &a->seqs[s])) s_first += seq_items(j, &a->seqs[s++]);
        const llm_batch_seq *sq = &a->seqs[s];
        int hs = seq_heads(j, sq), per = a->n_head_kv / hs;
        int chunk = (int)((i - s_first) / per), g = (int)((i - s_first) % per) * hs;
        int t0 = chunk * j->rows, t1 = t0 + j->rows < sq->n_tok ? t0 + j->rows : sq->n_tok;
        attn_item(j, sq, t0, t1, g, g + hs, &w);
    }
}

/* Grows the per-thread scratch to hold `need` floats. */
static llm_status scratch_reserve(cpu_ctx *c, size_t need)
{
    if (need <= c->scratch_per_thread)
        return LLM_OK;
    float *s = malloc(need * sizeof(float) * (size_t)tp_size(c->pool));
    if (!s)
        return LLM_ERR_NOMEM;
    free(c->scratch);
    c->scratch = s;
    c->scratch_per_thread = need;
    return LLM_OK;
}

llm_status cpu_attention(llm_backend *b, const llm_attn_args *a)
{
    cpu_ctx *c = b->ctx;
    if (a->n_head_kv <= 0 || a->n_head % a->n_head_kv)
        return LLM_ERR_INVALID_ARG;
    if ((unsigned)a->kv->type >= QT_COUNT || (a->kv->type != QT_F32 && !c->k->to_f32[a->kv->type]))
        return LLM_ERR_UNSUPPORTED;
    /* Q8_0 rows go by whole blocks per head (kv_cache refuses other head sizes; the kernels rely on it) */
    if (a->kv->type == QT_Q8_0 && a->head_dim % QK8_0)
        return LLM_ERR_UNSUPPORTED;
    int group = a->n_head / a->n_head_kv, max_pos = 0;
    /* whole sequences per item once there are enough of them to share out */
    attn_job j = {.a = a, .c = c, .group = group, .rows = ATTN_ROWS_HEADS / group > 1 ? ATTN_ROWS_HEADS / group : 1,
                  .whole = a->n_seqs >= 4 * tp_size(c->pool)};
    j.per_row = (size_t)group * (size_t)j.rows;
    if (j.whole && (size_t)a->n_head > j.per_row)
        j.per_row = (size_t)a->n_head;
    /* by shape only, so every row of the model takes the same path */
    j.q8q = a->kv->type == QT_Q8_0 && c->k->attn_dots_q8q && a->head_dim <= CPU_ATTN_Q8Q_HD;
    if (j.q8q)
        j.q8_floats = (j.per_row * (size_t)(a->head_dim / QK8_0) * sizeof(cpu_q8q) + 63) / 64 * 16;
    for (int s = 0; s < a->n_seqs; s++) {
        j.n_items += seq_items(&j, &a->seqs[s]);
        if (a->seqs[s].pos0 + a->seqs[s].n_tok > max_pos)
            max_pos = a->seqs[s].pos0 + a->seqs[s].n_tok;
    }
    size_t sc = ((size_t)max_pos + 15) / 16 * 16;
    if (scratch_reserve(c, (size_t)a->kv->block_size * a->head_dim + j.q8_floats + sc * j.per_row))
        return LLM_ERR_NOMEM;
    if (j.n_items < 2)
        attn_worker(&j, 0, 1);
    else
        tp_run(c->pool, attn_worker, &j);
    return LLM_OK;
}
