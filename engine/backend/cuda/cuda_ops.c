/* cuda_ops.c - the CUDA backend's operations (matmul through lk_gemv or
 * cuBLAS, norms, RoPE, activations, attention, KV writes and copies,
 * reads, sampling) and the graphs that replay a decode step's launches.
 * The state and helpers are cuda_impl.h's; see backend_cuda.c's file
 * comment for memory, matmul choice and error rules. */
#include "cuda_impl.h"

/* ---- graphs of decode steps --------------------------------------------- */

void cu_graphs_drop(cu_ctx *c)
{
    for (int i = 0; i < c->g.n; i++)
        if (c->g.list[i].state == 2)
            cudaGraphExecDestroy(c->g.list[i].exec);
    c->g.n = 0;
    c->g.cur = NULL;
    c->g.warm = NULL;
}

/* A failed or abandoned step: an open capture is closed and its shape is
 * not captured again. */
void cu_graph_abort(cu_ctx *c)
{
    if (c->g.mode == CU_CAPTURE) {
        cudaGraph_t gr = NULL;
        cudaStreamEndCapture(c->stream, &gr);
        if (gr)
            cudaGraphDestroy(gr);
        (void)cudaGetLastError();
        if (c->g.cur)
            c->g.cur->state = -1;
    }
    c->g.mode = CU_EAGER;
}

static cu_graph *graph_find(cu_graphs *g, const int key[4])
{
    for (int i = 0; i < g->n; i++)
        if (!memcmp(g->list[i].key, key, sizeof g->list[i].key))
            return &g->list[i];
    if (g->n == CU_MAX_GRAPHS)
        return NULL;
    cu_graph *e = &g->list[g->n++];
    memcpy(e->key, key, sizeof e->key);
    e->state = 0;
    e->need = 0;
    return e;
}

void cuda_step_begin(llm_backend *b, const llm_step_info *si)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_graphs *g = &c->g;
    cu_use_device(c);
    if (g->mode != CU_EAGER)
        cu_graph_abort(c); /* the last step ended without its pick */
    g->pad = 0;
    g->warm = NULL;
    if (c->in_comm || !si->pick || !si->decode || si->host_sync || si->adapters || si->n_rows > 512 || c->failed)
        return;
    /* a graph's shape: padded attention whether or not graphs are on, so
     * LLM_CUDA_GRAPHS=0 runs the very same kernels, eagerly */
    int bucket = 256;
    while (bucket < si->max_len) bucket *= 2;
    g->max_len = bucket;
    g->pad = 1;
    int key[4] = {si->n_rows, si->n_logits, si->n_seqs, bucket};
    cu_graph *e = g->on ? graph_find(g, key) : NULL;
    if (!e || e->state < 0)
        return;
    if (e->state == 0) { /* first of its shape: eager, sizing the buffers as the graph will use them */
        e->state = 1;
        g->warm = e;
        g->count_used = 0;
        memset(g->count_src, 0, sizeof g->count_src);
        return;
    }
    if (e->state == 1 && e->need > CU_ARENA_INTS) {
        e->state = -1; /* e.g. 512 sequences at a 32768 bucket: the tables alone are 2^20 entries */
        return;
    }
    if (e->state == 1 && cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
        (void)cudaGetLastError(); /* not the step's failure: this shape runs eagerly from now on */
        e->state = -1;
        return;
    }
    g->mode = e->state == 1 ? CU_CAPTURE : CU_REPLAY;
    g->cur = e;
    g->used = 0;
    memset(g->last_n, 0, sizeof g->last_n);
    memset(g->last_src, 0, sizeof g->last_src);
}

/* The end of a captured or replayed step: (capture: instantiate), indices
 * up, the graph launched, the ids back. */
static llm_status graph_finish(cu_ctx *c, const int32_t *dp, int n_rows, int n_vocab, const float *logits, int32_t *out)
{
    cu_graphs *g = &c->g;
    if (g->mode == CU_CAPTURE) {
        cudaGraph_t gr = NULL;
        LK(c, lk_sample(logits, n_rows, n_vocab, (const lk_sample_params *)dp, g->d_ids, c->stream));
        CU(c, cudaMemcpyAsync(g->h_ids, g->d_ids, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyDeviceToHost, c->stream));
        if (c->failed)
            return cu_take_status(c);
        g->mode = CU_EAGER; /* the capture is closed either way */
        if (CU(c, cudaStreamEndCapture(c->stream, &gr)) || CU(c, cudaGraphInstantiate(&g->cur->exec, gr, 0))) {
            g->cur->state = -1;
            if (gr)
                cudaGraphDestroy(gr);
            return cu_take_status(c);
        }
        cudaGraphDestroy(gr);
        g->cur->state = 2;
    }
    g->mode = CU_EAGER;
    int launched = !CU(c, cudaMemcpyAsync(g->d_arena, g->h_arena, g->used * sizeof(int32_t), cudaMemcpyHostToDevice,
                                          c->stream)) &&
                   !CU(c, cudaGraphLaunch(g->cur->exec, c->stream));
    /* synchronised even when the launch failed: the queued arena copy reads
     * the pinned arena, which the next step rewrites */
    if (!CU(c, cudaStreamSynchronize(c->stream)) && launched)
        memcpy(out, g->h_ids, sizeof(int32_t) * (size_t)n_rows);
    if (!launched) { /* this shape's graph is not used again */
        cudaGraphExecDestroy(g->cur->exec);
        g->cur->state = -1;
    }
    return cu_take_status(c);
}

void cu_graphs_init(cu_ctx *c)
{
    const char *env = getenv("LLM_CUDA_GRAPHS");
    cu_graphs *g = &c->g;
    g->on = !env || strtol(env, NULL, 10) != 0;
    if (g->on && (cudaMallocHost((void **)&g->h_arena, CU_ARENA_INTS * sizeof(int32_t)) != cudaSuccess ||
                  cudaMalloc((void **)&g->d_arena, CU_ARENA_INTS * sizeof(int32_t)) != cudaSuccess ||
                  cudaMallocHost((void **)&g->h_ids, 512 * sizeof(int32_t)) != cudaSuccess ||
                  cudaMalloc((void **)&g->d_ids, 512 * sizeof(int32_t)) != cudaSuccess)) {
        (void)cudaGetLastError();
        g->on = 0; /* eager steps still work */
    }
}

void cu_graphs_free(cu_ctx *c)
{
    cu_graphs_drop(c);
    cudaFreeHost(c->g.h_arena);
    cudaFree(c->g.d_arena);
    cudaFreeHost(c->g.h_ids);
    cudaFree(c->g.d_ids);
}

/* ---- operations ---------------------------------------------------------- */

int cu_gemv_type(quant_type t)
{
    return quant_supported(t) && t != QT_Q8_K; /* lk_weight_type: every loadable type */
}

/* Quantized weights are dequantized to F32 in slabs of at most this many
 * bytes per cuBLAS call (the scratch stays this size whatever the matrix:
 * an 8B model's output matrix would be 2 GiB). */
#define CU_SLAB_BYTES ((size_t)64 << 20)

/* y (n_tok, rows) = x . W^T through cuBLAS (column-major: C = A^T B with
 * A = W as (cols, rows), B = x as (cols, n_tok)). F32 weights as they are;
 * F16/BF16 weights with the activations rounded to that type (F16: finite
 * only while |x| < 65504); quantized weights dequantized to F32, slab by
 * slab of rows, against float activations with TF32 tensor-core math
 * (float range: activations above 65504 stay finite). */
static void gemm(cu_ctx *c, const llm_weight *w, const float *x, int n_tok, float *y)
{
    int rows = (int)w->rows, cols = (int)w->cols;
    float one = 1.f, zero = 0.f;
    if (w->type == QT_F32) {
        BLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tok, cols, &one, w->data, CUDA_R_32F, cols, x,
                             CUDA_R_32F, cols, &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    if (w->type == QT_F16 || w->type == QT_BF16) {
        int bf16 = w->type == QT_BF16;
        char *s = cu_scratch_get(c, (size_t)n_tok * cols * 2);
        if (!s || LK(c, lk_to_half(x, (size_t)n_tok * cols, bf16, s, c->stream)))
            return;
        cudaDataType ht = bf16 ? CUDA_R_16BF : CUDA_R_16F;
        BLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, rows, n_tok, cols, &one, w->data, ht, cols, s, ht, cols,
                             &zero, y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        return;
    }
    int slab = (int)(CU_SLAB_BYTES / ((size_t)cols * sizeof(float)));
    slab = slab < 1 ? 1 : slab > rows ? rows : slab;
    float *s = cu_scratch_get(c, (size_t)slab * cols * sizeof(float));
    for (int r0 = 0; s && r0 < rows && !c->failed; r0 += slab) {
        int n = rows - r0 < slab ? rows - r0 : slab;
        if (LK(c, lk_dequant_f32((int)w->type, (const char *)w->data + (size_t)r0 * w->row_bytes, w->row_bytes, n, cols,
                                 s, c->stream)))
            return;
        BLAS(c, cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n_tok, cols, &one, s, CUDA_R_32F, cols, x, CUDA_R_32F,
                             cols, &zero, y + r0, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
    }
}

llm_status cuda_matmul(llm_backend *b, const llm_matmul *ops, int n_ops, const float *x, int n_tok)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    for (int i = 0; i < n_ops && !c->failed; i++) {
        const llm_weight *w = ops[i].w;
        if (!cu_gemv_type(w->type))
            cu_keep_failure(c, LLM_ERR_UNSUPPORTED, "cuda backend: weights of type %s are not supported",
                         quant_type_name(w->type));
        else if (n_tok <= 8)
            LK(c, lk_gemv((int)w->type, w->data, w->row_bytes, (int)w->rows, (int)w->cols, x, n_tok, ops[i].y, c->stream));
        else
            gemm(c, w, x, n_tok, ops[i].y);
    }
    return cu_take_status(c);
}

/* The segments as lk_lora's words (8 each), then a (row, segment) pair
 * per adapted row, staged in one upload. */
_Static_assert(LLM_LORA_SEG_MAX_RANK <= LK_LORA_RANK_MASK, "a rank fits lk_lora's rank word beside its flags");
llm_status cuda_lora(llm_backend *b, const llm_lora_seg *segs, int n_segs, const float *x, int in, float *y, int out)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    size_t rows = 0;
    int max_rank = 0;
    for (int i = 0; i < n_segs; i++) { /* ranks and counts checked by llm_backend_lora */
        rows += (size_t)segs[i].n_rows;
        max_rank = segs[i].rank > max_rank ? segs[i].rank : max_rank;
    }
    if (rows == 0)
        return cu_take_status(c);
    int32_t *p = cu_pack_get(c, 8 * (size_t)n_segs + 2 * rows);
    for (int i = 0; p && i < n_segs; i++) {
        const llm_lora_seg *s = &segs[i];
        uint64_t a = (uint64_t)(uintptr_t)s->a, bt = (uint64_t)(uintptr_t)s->bt;
        int32_t sb;
        memcpy(&sb, &s->s, sizeof sb);
        int32_t *w = p + 8 * (size_t)i;
        w[0] = s->row0, w[1] = s->n_rows, w[3] = sb;
        w[2] = lk_lora_rank_word(s->rank, s->a_type == QT_F16, s->b_type == QT_F16);
        w[4] = (int32_t)(uint32_t)a, w[5] = (int32_t)(uint32_t)(a >> 32);
        w[6] = (int32_t)(uint32_t)bt, w[7] = (int32_t)(uint32_t)(bt >> 32);
    }
    int32_t *pr = p ? p + 8 * (size_t)n_segs : NULL;
    for (int i = 0, k = 0; pr && i < n_segs; i++)
        for (int r = 0; r < segs[i].n_rows; r++, k++) pr[2 * k] = segs[i].row0 + r, pr[2 * k + 1] = i;
    const int32_t *d = p ? cu_stage_upload(c, ST_LORA, p, 8 * (size_t)n_segs + 2 * rows) : NULL;
    float *t = d ? cu_grow(c, &c->lora_work, &c->lora_cap, rows * (size_t)max_rank * sizeof(float)) : NULL;
    if (t)
        LK(c, lk_lora(d, d + 8 * (size_t)n_segs, (int)rows, x, in, y, out, t, max_rank, c->stream));
    return cu_take_status(c);
}

void cuda_rmsnorm(llm_backend *b, const float *x, const float *w, int n_tok, int dim, float eps, float *out)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    LK(c, lk_rmsnorm(x, w, n_tok, dim, eps, out, c->stream));
}

/* The host copy of the factors an uploaded model's device pointer holds
 * (NULL: not one of this backend's models). */
static const float *rope_host_factors(const cu_ctx *c, const float *dev)
{
    for (const cu_model *m = c->models; m; m = m->next)
        if (m->m.rope_freqs == dev)
            return m->rope_host;
    return NULL;
}

/* The frequencies are computed here, as the CPU backend does, and staged
 * like the indices (unchanged tables are not sent again). */
void cuda_rope(llm_backend *b, const llm_rope_args *a)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    int half = a->rot_dim / 2;
    const float *factors = a->freq_factors ? rope_host_factors(c, a->freq_factors) : NULL;
    if (a->freq_factors && !factors) {
        cu_keep_failure(c, LLM_ERR_UNSUPPORTED, "cuda backend: RoPE factors that this backend did not upload");
        return;
    }
    LLM_ASSERT(half >= 0 && half <= LLM_MAX_ROT_DIM / 2); /* model load refuses larger rot_dim */
    float freq[LLM_MAX_ROT_DIM / 2];
    llm_backend_rope_freqs(a->theta, a->rot_dim, factors, freq);
    memcpy(c->freq_bits, freq, sizeof(float) * (size_t)half); /* staged as int32 objects, not floats read as ints */
    const int32_t *pos = cu_stage_upload(c, ST_POS, a->pos, (size_t)a->n_tok);
    const int32_t *fr = pos ? cu_stage_upload(c, ST_FREQ, c->freq_bits, (size_t)half) : NULL;
    if (fr)
        LK(c, lk_rope(a->x, a->n_tok, a->n_head, a->head_dim, a->rot_dim, pos, (const float *)fr, a->freq_scale,
                      a->neox, c->stream));
}

void cuda_swiglu(llm_backend *b, const float *g, const float *u, size_t n, float *out)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    LK(c, lk_swiglu(g, u, n, out, c->stream));
}

void cuda_geglu(llm_backend *b, const float *g, const float *u, size_t n, float *out)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    LK(c, lk_geglu(g, u, n, out, c->stream));
}

void cuda_scale(llm_backend *b, float *x, float s, size_t n)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    LK(c, lk_scale(x, s, n, c->stream));
}

void cuda_add(llm_backend *b, float *y, const float *x, size_t n)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    LK(c, lk_add(y, x, n, c->stream));
}

void cuda_add_bias(llm_backend *b, float *x, const float *bias, int n_tok, int dim)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    LK(c, lk_add_bias(x, bias, n_tok, dim, c->stream));
}

void cuda_get_rows(llm_backend *b, const llm_weight *emb, const int32_t *ids, int n, float *out)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    const int32_t *d = cu_stage_upload(c, ST_IDS, ids, (size_t)n);
    if (d)
        LK(c, lk_get_rows((int)emb->type, emb->data, emb->row_bytes, (int)emb->cols, d, n, out, c->stream));
}

/* rows and weights go up as one array: [rows (n) | weights' bits (n)]. */
void cuda_add_rows(llm_backend *b, float *y, const int32_t *rows, const float *w, const float *x, int n, int dim,
                          int set)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    int32_t *p = n > 0 ? cu_pack_get(c, 2 * (size_t)n) : NULL;
    if (!p)
        return;
    memcpy(p, rows, sizeof(int32_t) * (size_t)n);
    memcpy(p + n, w, sizeof(float) * (size_t)n);
    const int32_t *d = cu_stage_upload(c, ST_ROWS, p, 2 * (size_t)n);
    if (d)
        LK(c, lk_add_rows(y, d, (const float *)(d + n), x, n, dim, set, c->stream));
}

void cuda_kv_write(llm_backend *b, const llm_kv_layer *kv, const llm_batch_seq *seqs, int n_seqs, const float *k,
                          const float *v)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    size_t n_rows = 0;
    for (int s = 0; s < n_seqs; s++) n_rows += (size_t)seqs[s].n_tok;
    int32_t *slot = cu_pack_get(c, n_rows);
    if (!slot)
        return;
    for (int s = 0; s < n_seqs; s++)
        for (int t = 0; t < seqs[s].n_tok; t++) {
            int p = seqs[s].pos0 + t;
            slot[seqs[s].tok0 + t] = seqs[s].block_table[p / kv->block_size] * kv->block_size + p % kv->block_size;
        }
    const int32_t *d = cu_stage_upload(c, ST_SLOT, slot, n_rows);
    if (d)
        LK(c, lk_kv_write((int)kv->type, kv->k, kv->v, kv->row_bytes, kv->kv_dim, d, (int)n_rows, k, v, c->stream));
}

/* Prefill-shaped batches (F16 K/V, at least 16 rows, 4 or more rows per
 * sequence on average) go to the tensor-core kernel. */
static int use_tc(const llm_attn_args *a, size_t n_rows)
{
    return a->kv->type == QT_F16 && a->head_dim % 16 == 0 && n_rows >= 16 && n_rows >= 4 * (size_t)a->n_seqs;
}

/* Tiles of up to 16 consecutive rows of each sequence: {first row, rows,
 * first position, table offset}. */
static size_t pack_tiles(const llm_attn_args *a, const int32_t *tab_off, int32_t *t)
{
    size_t n = 0;
    for (int s = 0; s < a->n_seqs; s++)
        for (int r = 0; r < a->seqs[s].n_tok; r += 16, n++) {
            int rows = a->seqs[s].n_tok - r < 16 ? a->seqs[s].n_tok - r : 16;
            t[4 * n] = a->seqs[s].tok0 + r, t[4 * n + 1] = rows, t[4 * n + 2] = a->seqs[s].pos0 + r;
            t[4 * n + 3] = tab_off[s];
        }
    return n;
}

/* Packs [row_pos (n_rows) | row_table (n_rows) | tables...] for lk_attention
 * (and the tiles for lk_attention_tc). */
llm_status cuda_attention(llm_backend *b, const llm_attn_args *a)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    int bs = a->kv->block_size, max_len = 0, graph = c->g.pad;
    size_t n_rows = 0, n_tab = 0, n_tiles = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        int len = graph ? c->g.max_len : a->seqs[s].pos0 + a->seqs[s].n_tok; /* a graph pads every table to its bucket */
        n_rows += (size_t)a->seqs[s].n_tok;
        n_tab += (size_t)((len + bs - 1) / bs);
        n_tiles += (size_t)((a->seqs[s].n_tok + 15) / 16);
        max_len = len > max_len ? len : max_len;
    }
    int tc = !graph && use_tc(a, n_rows);
    int32_t *p = cu_pack_get(c, 2 * n_rows + n_tab + (size_t)a->n_seqs + (tc ? 4 * n_tiles : 0));
    if (!p)
        return cu_take_status(c);
    int32_t *tab = p + 2 * n_rows, *tab_off = tab + n_tab;
    size_t t0 = 0;
    for (int s = 0; s < a->n_seqs; s++) {
        const llm_batch_seq *q = &a->seqs[s];
        int used = (q->pos0 + q->n_tok + bs - 1) / bs, nb = graph ? (c->g.max_len + bs - 1) / bs : used;
        memcpy(tab + t0, q->block_table, sizeof(int32_t) * (size_t)used);
        memset(tab + t0 + used, 0, sizeof(int32_t) * (size_t)(nb - used)); /* never read: past the row's position */
        for (int t = 0; t < q->n_tok; t++) {
            p[q->tok0 + t] = q->pos0 + t;
            p[n_rows + (size_t)q->tok0 + t] = (int32_t)t0;
        }
        tab_off[s] = (int32_t)t0;
        t0 += (size_t)nb;
    }
    if (tc) {
        pack_tiles(a, tab_off, tab_off + a->n_seqs);
        const int32_t *d = cu_stage_upload(c, ST_ATTN, p, 2 * n_rows + n_tab);
        const int32_t *dt = d ? cu_stage_upload(c, ST_TILES, tab_off + a->n_seqs, 4 * n_tiles) : NULL;
        if (dt)
            LK(c, lk_attention_tc(a->q, a->out, (int)n_tiles, dt, a->n_head, a->n_head_kv, a->head_dim, a->scale,
                                  d + 2 * n_rows, a->kv->k, a->kv->v, a->kv->row_bytes, bs, a->window, c->stream));
        return cu_take_status(c);
    }
    size_t wf = lk_attention_work((int)n_rows, a->n_head, a->head_dim, max_len);
    float *work = wf ? cu_grow(c, &c->att_work, &c->att_cap, wf * sizeof(float)) : NULL;
    if (wf && !work)
        return cu_take_status(c);
    const int32_t *d = cu_stage_upload(c, ST_ATTN, p, 2 * n_rows + n_tab);
    if (d)
        LK(c, lk_attention(a->q, a->out, (int)n_rows, a->n_head, a->n_head_kv, a->head_dim, a->scale, d, d + n_rows,
                           d + 2 * n_rows, (int)a->kv->type, a->kv->k, a->kv->v, a->kv->row_bytes, bs, max_len,
                           a->window, work, c->stream));
    return cu_take_status(c);
}

void cuda_kv_copy(llm_backend *b, const llm_kv_layer *layers, int n_layers, const int32_t *src,
                         const int32_t *dst, int n)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    for (int l = 0; l < n_layers; l++) {
        size_t blk = (size_t)layers[l].block_size * layers[l].row_bytes;
        for (int i = 0; i < n && !c->failed; i++) {
            char *k = layers[l].k, *v = layers[l].v;
            CU(c, cudaMemcpyAsync(k + (size_t)dst[i] * blk, k + (size_t)src[i] * blk, blk, cudaMemcpyDeviceToDevice, c->stream));
            CU(c, cudaMemcpyAsync(v + (size_t)dst[i] * blk, v + (size_t)src[i] * blk, blk, cudaMemcpyDeviceToDevice, c->stream));
        }
    }
}

llm_status cuda_read(llm_backend *b, void *dst, const void *src, size_t bytes)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    if (!c->failed && !CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream)))
        CU(c, cudaStreamSynchronize(c->stream));
    return cu_take_status(c);
}

llm_status cuda_write(llm_backend *b, void *dst, const void *src, size_t bytes)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    if (!c->failed && !CU(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream)))
        CU(c, cudaStreamSynchronize(c->stream)); /* src is the caller's again on return */
    return cu_take_status(c);
}

/* Token ids picked on the device; only n_rows ids are read back. */
llm_status cuda_sample(llm_backend *b, const float *logits, int n_rows, int n_vocab, const llm_sample_params *p,
                              int32_t *out)
{
    cu_ctx *c = cu_ctx_of(b);
    cu_use_device(c);
    _Static_assert(sizeof(llm_sample_params) == sizeof(lk_sample_params) && sizeof(llm_sample_params) % 4 == 0,
                   "llm_sample_params and lk_sample_params share a layout");
    if (n_rows <= 0) /* no rows: no 0-byte copies to a staging buffer never allocated */
        return cu_take_status(c);
    const int32_t *dp = cu_stage_upload(c, ST_SAMPLE, (const int32_t *)p, (size_t)n_rows * sizeof *p / 4);
    if (c->g.mode != CU_EAGER)
        return dp ? graph_finish(c, dp, n_rows, n_vocab, logits, out) : cu_take_status(c);
    if (c->g.warm) { /* the shape's eager step ends here: what a capture would take */
        c->g.warm->need = c->g.count_used;
        c->g.warm = NULL;
    }
    int32_t *d = (int32_t *)cu_scratch_get(c, sizeof(int32_t) * (size_t)n_rows);
    if (dp && d && !LK(c, lk_sample(logits, n_rows, n_vocab, (const lk_sample_params *)dp, d, c->stream)) &&
        !CU(c, cudaMemcpyAsync(out, d, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyDeviceToHost, c->stream)))
        CU(c, cudaStreamSynchronize(c->stream));
    return cu_take_status(c);
}
