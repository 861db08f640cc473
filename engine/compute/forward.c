/* forward.c - the transformer forward pass over a batch of rows from
 * several sequences: embeddings (scaled, gemma3) -> n_layer x (RMSNorm,
 * Q/K/V (per-head Q/K RMSNorm: qwen3, gemma3) with RoPE at each row's
 * position, paged attention with GQA (a sliding window on local layers),
 * output RMSNorm (gemma3), residual, RMSNorm, SwiGLU or GELU-gated MLP,
 * output RMSNorm (gemma3), residual) -> final norm and logits for the
 * chosen rows only. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "forward_impl.h"
#include "llm/moe.h"

struct llm_forward {
    const llm_model *m;           /* the model, or the backend's copy of its weights (same hparams) */
    llm_model *dev_m;             /* the upload, when the backend made one */
    llm_backend *b;
    int max_rows, max_logits;
    int32_t *pos;                 /* (max_rows) */
    /* activations, one row per batch row */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2;
    float *last;                  /* (max_logits, n_embd) rows gathered for the output */
    float *logits;                /* (max_logits, n_vocab) */
    float *logits_host;           /* logits read back from a device; NULL on the host */
    float *hidden_host;           /* (max_rows, n_embd) hidden rows read back from a device, made on first use */
    const float *hidden;          /* the last pass's hidden rows (xb on the host); NULL: none asked for */
    int32_t *ids;                 /* (max_logits) picked ids */
    llm_sample_params *greedy;    /* (max_logits) argmax settings, for a device pick without p */
    llm_comm *comm;               /* tensor-parallel rank: sums partial outputs; NULL alone */
    int rank;
    tp_group *tp;                 /* a tensor-parallel driver: the fields above are unused */
    llm_batch_seq *lseqs;         /* (max_rows) the batch's sequences with their local tables, for sliding-window
                                   * layers (a batch has at most as many sequences as rows) */
    /* mixture of experts: router logits (on the backend, and read back to
     * the host when it is a device), one expert's input and output rows,
     * the layer's combined output, and the routing plan */
    float *router, *router_host, *xe, *ye, *moe;
    llm_moe_plan plan;
    llm_lora_seg *segs;           /* (max_rows) one projection's adapter segments (a batch has at most as many
                                   * sequences as rows) */
};

/* An adapter ready for the pass: on a host-memory backend its own
 * matrices; on a device, copies of them in the backend's memory. */
struct llm_forward_lora {
    const llm_lora *l;
    const llm_lora_mat *mats; /* (n_mats = n_layer * LLM_LORA_N_PROJ): l->mats, or own */
    llm_lora_mat *own;        /* the device copies' views (a, bt in backend memory), or NULL */
    int n_mats;
};

static float *act(llm_backend *b, size_t n, int *fail)
{
    float *p = llm_backend_buffer_alloc(b, (n ? n : 1) * sizeof(float));
    if (!p)
        *fail = 1;
    return p;
}

static llm_status alloc_acts(llm_forward *f, llm_error *err)
{
    const llm_hparams *hp = &f->m->hp;
    llm_backend *b = f->b;
    size_t R = (size_t)f->max_rows, kvd = (size_t)hp->n_head_kv * hp->head_dim, qd = (size_t)hp->n_head * hp->head_dim;
    size_t wide = qd > (size_t)hp->n_embd ? qd : (size_t)hp->n_embd;
    int fail = 0;
    f->x = act(b, R * hp->n_embd, &fail);
    f->xb = act(b, R * wide, &fail);
    f->q = act(b, R * qd, &fail);
    f->k = act(b, R * kvd, &fail);
    f->v = act(b, R * kvd, &fail);
    f->att = act(b, R * qd, &fail);
    size_t ff = hp->n_expert > 0 ? (size_t)hp->n_ff_exp : (size_t)hp->n_ff; /* a MoE model has no dense MLP */
    f->hb = act(b, R * ff, &fail);
    f->hb2 = act(b, R * ff, &fail);
    if (hp->n_expert > 0) {
        f->router = act(b, R * hp->n_expert, &fail);
        f->xe = act(b, R * hp->n_embd, &fail);
        f->ye = act(b, R * hp->n_embd, &fail);
        f->moe = act(b, R * hp->n_embd, &fail);
        if (!fail && !llm_backend_host_memory(b) && !(f->router_host = malloc(R * hp->n_expert * sizeof(float))))
            fail = 1;
        llm_status st = fail ? LLM_OK : llm_moe_plan_alloc(&f->plan, hp->n_expert, hp->n_expert_used, f->max_rows, err);
        if (st)
            return st;
    }
    f->last = act(b, (size_t)f->max_logits * hp->n_embd, &fail);
    f->logits = act(b, (size_t)f->max_logits * hp->n_vocab, &fail);
    if (!fail && !llm_backend_host_memory(b) &&
        !(f->logits_host = malloc((size_t)f->max_logits * hp->n_vocab * sizeof(float))))
        fail = 1;
    if (fail)
        return llm_errf(err, LLM_ERR_NOMEM, "forward: no %s memory for activations of a batch of %d rows",
                        b->iface->name, f->max_rows);
    return LLM_OK;
}

llm_status llm_forward_new(const llm_model *m, llm_backend *b, int max_rows, int max_logits, llm_forward **out,
                           llm_error *err)
{
    *out = NULL;
    if (max_rows < 1 || max_rows > (1 << 16) || max_logits < 1 || max_logits > max_rows)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "forward: batch of %d rows with %d logit rows is out of range",
                        max_rows, max_logits);
    llm_forward *f = calloc(1, sizeof *f);
    if (!f)
        return llm_errf(err, LLM_ERR_NOMEM, "forward: no memory");
    f->m = m;
    f->b = b;
    f->max_rows = max_rows;
    f->max_logits = max_logits;
    llm_status st = LLM_OK;
    if (b->iface->model_upload && !(st = b->iface->model_upload(b, m, &f->dev_m, err)) && f->dev_m)
        f->m = f->dev_m;
    if (!st && (!(f->pos = malloc(sizeof(int32_t) * (size_t)max_rows)) ||
                !(f->lseqs = malloc(sizeof *f->lseqs * (size_t)max_rows)) ||
                !(f->segs = malloc(sizeof *f->segs * (size_t)max_rows)) ||
                !(f->ids = malloc(sizeof(int32_t) * (size_t)max_logits)) ||
                !(f->greedy = calloc((size_t)max_logits, sizeof *f->greedy))))
        st = llm_errf(err, LLM_ERR_NOMEM, "forward: no memory");
    if (!st)
        st = alloc_acts(f, err);
    if (st) {
        llm_forward_free(f);
        return st;
    }
    *out = f;
    return LLM_OK;
}

llm_status llm_forward_new_tp(const llm_model *m, llm_backend *const *b, int n_ranks, int max_rows, int max_logits,
                              llm_forward **out, llm_error *err)
{
    *out = NULL;
    if (n_ranks <= 1)
        return llm_forward_new(m, b[0], max_rows, max_logits, out, err);
    llm_forward *f = calloc(1, sizeof *f);
    if (!f)
        return llm_errf(err, LLM_ERR_NOMEM, "forward: no memory");
    f->m = m;
    llm_status st = tp_group_new(m, b, n_ranks, max_rows, max_logits, &f->tp, err);
    if (st) {
        free(f);
        return st;
    }
    *out = f;
    return LLM_OK;
}

void forward_set_comm(llm_forward *f, llm_comm *c, int rank)
{
    f->comm = c;
    f->rank = rank;
}

void forward_kv_copy_on(llm_backend *b, const llm_model *m, const llm_kv_layer *layers, llm_kv_copy_layers which,
                        const int32_t *src, const int32_t *dst, int n)
{
    if (which == LLM_KV_COPY_ALL) {
        llm_backend_kv_copy(b, layers, m->hp.n_layer, src, dst, n);
        return;
    }
    for (int l = 0; l < m->hp.n_layer; l++) /* the two pools' layers interleave: one layer at a time */
        if ((m->layers[l].window > 0) == (which == LLM_KV_COPY_LOCAL))
            llm_backend_kv_copy(b, &layers[l], 1, src, dst, n);
}

void llm_forward_kv_copy(llm_forward *f, const llm_kv_layer *layers, llm_kv_copy_layers which, const int32_t *src,
                         const int32_t *dst, int n)
{
    if (f->tp)
        tp_group_kv_copy(f->tp, f->m, layers, which, src, dst, n);
    else
        forward_kv_copy_on(f->b, f->m, layers, which, src, dst, n);
}

void llm_forward_free(llm_forward *f)
{
    if (!f)
        return;
    tp_group_free(f->tp);
    float *bufs[] = {f->x, f->xb, f->q, f->k, f->v, f->att, f->hb, f->hb2, f->last, f->logits, f->router, f->xe, f->ye,
                     f->moe};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) llm_backend_buffer_free(f->b, bufs[i]);
    if (f->dev_m)
        f->b->iface->model_release(f->b, f->dev_m);
    free(f->logits_host);
    free(f->hidden_host);
    free(f->ids);
    free(f->greedy);
    free(f->pos);
    free(f->lseqs);
    free(f->segs);
    free(f->router_host);
    llm_moe_plan_free(&f->plan);
    free(f);
}

static void add_bias(llm_backend *b, float *x, const float *bias, int n_tok, int dim)
{
    if (bias)
        llm_backend_add_bias(b, x, bias, n_tok, dim);
}

/* A rank's row-parallel output is a partial sum: add the other ranks'. */
static llm_status reduce(llm_forward *f, float *buf, size_t n)
{
    return f->comm ? llm_comm_allreduce(f->comm, f->rank, buf, n) : LLM_OK;
}

void llm_forward_lora_free(llm_forward *f, llm_forward_lora *fl)
{
    if (!fl)
        return;
    for (int i = 0; fl->own && i < fl->n_mats; i++) {
        llm_backend_buffer_free(f->b, fl->own[i].a);
        llm_backend_buffer_free(f->b, fl->own[i].bt);
    }
    free(fl->own);
    free(fl);
}

/* One matrix's A and B into backend memory: dst holds their addresses. */
static llm_status lora_upload(llm_forward *f, const llm_lora_mat *m, llm_lora_mat *dst, llm_error *err)
{
    size_t na = llm_lora_mat_a_bytes(m), nb = llm_lora_mat_b_bytes(m);
    *dst = (llm_lora_mat){m->rank, m->in, m->out, m->a_type, m->b_type, llm_backend_buffer_alloc(f->b, na),
                          llm_backend_buffer_alloc(f->b, nb)};
    if (!dst->a || !dst->bt)
        return llm_errf(err, LLM_ERR_NOMEM, "forward: no %s memory for an adapter's %zu bytes", f->b->iface->name,
                        na + nb);
    llm_status st = llm_backend_write(f->b, dst->a, m->a, na);
    if (!st)
        st = llm_backend_write(f->b, dst->bt, m->bt, nb);
    return st ? llm_errf(err, st, "forward: copying an adapter to the %s backend failed", f->b->iface->name) : LLM_OK;
}

/* W of projection p of layer il (NULL: the layer has none: an MoE MLP). */
static const llm_weight *lora_weight(const llm_model *m, int il, llm_lora_proj p)
{
    const llm_layer *L = &m->layers[il];
    const llm_weight *w[LLM_LORA_N_PROJ] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return w[p]->data ? w[p] : NULL;
}

/* Every adapted matrix has W's shape in this model (the adapter may have
 * been checked against another model of the same depth). */
static llm_status lora_fits(const llm_forward *f, const llm_lora *l, llm_error *err)
{
    if (l->n_layer != f->m->hp.n_layer)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "forward: the adapter has %d layers, the model %d", l->n_layer,
                        f->m->hp.n_layer);
    for (int i = 0; i < l->n_layer * LLM_LORA_N_PROJ; i++) {
        const llm_lora_mat *m = &l->mats[i];
        const llm_weight *w = m->rank ? lora_weight(f->m, i / LLM_LORA_N_PROJ, (llm_lora_proj)(i % LLM_LORA_N_PROJ)) : NULL;
        if (m->rank && (!w || w->cols != m->in || w->rows != m->out))
            return llm_errf(err, LLM_ERR_INVALID_ARG, "forward: the adapter's matrix %d is %d x %d, not this model's",
                            i, m->out, m->in);
    }
    return LLM_OK;
}

llm_status llm_forward_lora_add(llm_forward *f, const llm_lora *l, llm_forward_lora **out, llm_error *err)
{
    *out = NULL;
    if (f->tp || f->comm)
        return llm_errf(err, LLM_ERR_UNSUPPORTED, "forward: LoRA adapters do not run with tensor parallelism");
    if (!f->b->iface->lora || (!llm_backend_host_memory(f->b) && !f->b->iface->write))
        return llm_errf(err, LLM_ERR_UNSUPPORTED, "forward: the %s backend runs no LoRA adapters", f->b->iface->name);
    llm_status st = lora_fits(f, l, err);
    if (st)
        return st;
    llm_forward_lora *fl = calloc(1, sizeof *fl);
    if (!fl)
        return llm_errf(err, LLM_ERR_NOMEM, "forward: no memory");
    *fl = (llm_forward_lora){l, l->mats, NULL, l->n_layer * LLM_LORA_N_PROJ};
    int n = fl->n_mats;
    if (!llm_backend_host_memory(f->b)) {
        fl->own = calloc((size_t)n, sizeof *fl->own);
        st = fl->own ? LLM_OK : llm_errf(err, LLM_ERR_NOMEM, "forward: no memory");
        for (int i = 0; !st && i < n; i++)
            if (l->mats[i].rank > 0)
                st = lora_upload(f, &l->mats[i], &fl->own[i], err);
        fl->mats = fl->own;
    }
    if (st) {
        llm_forward_lora_free(f, fl);
        return st;
    }
    *out = fl;
    return LLM_OK;
}

/* Adapter segments together (for the cache), then by row: a total order,
 * so the same batch always gives the same list. */
static int seg_cmp(const void *pa, const void *pb)
{
    const llm_lora_seg *a = pa, *b = pb;
    if (a->a != b->a)
        return (uintptr_t)a->a < (uintptr_t)b->a ? -1 : 1;
    return (a->row0 > b->row0) - (a->row0 < b->row0);
}

/* y += each sequence's adapter update of projection p of layer il from x
 * (a no-op without adapters; il < 0: an expert, never adapted, bt NULL). */
static llm_status lora_run(llm_forward *f, const llm_forward_batch *bt, int il, llm_lora_proj p, const float *x,
                           float *y)
{
    if (il < 0 || !bt->loras)
        return LLM_OK;
    int n = 0, in = 0, out = 0;
    for (int s = 0; s < bt->n_seqs; s++) {
        const llm_forward_lora *fl = bt->loras[s].lora;
        const llm_lora_mat *m = fl ? &fl->mats[il * LLM_LORA_N_PROJ + p] : NULL;
        if (!m || m->rank == 0)
            continue;
        f->segs[n++] = (llm_lora_seg){bt->seqs[s].tok0, bt->seqs[s].n_tok, m->a, m->bt, m->rank,
                                      llm_lora_factor(fl->l, m, bt->loras[s].scale), m->a_type, m->b_type};
        in = m->in, out = m->out; /* W's: the same for every adapter (checked at load) */
    }
    if (n == 0)
        return LLM_OK;
    qsort(f->segs, (size_t)n, sizeof *f->segs, seg_cmp);
    return llm_backend_lora(f->b, f->segs, n, x, in, y, out);
}

static llm_status attention_block(llm_forward *f, const llm_forward_batch *bt, const llm_batch_seq *seqs,
                                  const llm_kv_layer *kv, int il)
{
    const llm_hparams *hp = &f->m->hp;
    const llm_layer *l = &f->m->layers[il];
    llm_backend *b = f->b;
    int n = bt->n_rows, qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
    llm_status st;
    llm_backend_rmsnorm(b, f->x, l->attn_norm, n, hp->n_embd, hp->eps, f->xb);
    llm_matmul qkv[3] = {{&l->wq, f->q}, {&l->wk, f->k}, {&l->wv, f->v}};
    if ((st = llm_backend_matmul_group(b, qkv, 3, f->xb, n)) || (st = lora_run(f, bt, il, LLM_LORA_Q, f->xb, f->q)) ||
        (st = lora_run(f, bt, il, LLM_LORA_K, f->xb, f->k)) || (st = lora_run(f, bt, il, LLM_LORA_V, f->xb, f->v)))
        return st;
    add_bias(b, f->q, l->bq, n, qd);
    add_bias(b, f->k, l->bk, n, kvd);
    add_bias(b, f->v, l->bv, n, kvd);
    if (l->attn_q_norm && l->attn_k_norm) { /* each head's row normalised (in place) before RoPE; loading binds both or neither */
        llm_backend_rmsnorm(b, f->q, l->attn_q_norm, n * hp->n_head, hp->head_dim, hp->eps, f->q);
        llm_backend_rmsnorm(b, f->k, l->attn_k_norm, n * hp->n_head_kv, hp->head_dim, hp->eps, f->k);
    }
    llm_rope_args r = {f->q, n, hp->n_head, hp->head_dim, hp->rot_dim, f->pos, l->rope_theta,
                       l->rope_freq_scale, hp->rope_neox, f->m->rope_freqs};
    llm_backend_rope(b, &r);
    r.x = f->k;
    r.n_head = hp->n_head_kv;
    llm_backend_rope(b, &r);
    llm_backend_kv_write(b, kv, seqs, bt->n_seqs, f->k, f->v);
    llm_attn_args a = {f->q, f->att, hp->n_head, hp->n_head_kv, hp->head_dim, hp->attn_scale,
                       seqs, bt->n_seqs, kv, l->window};
    if ((st = llm_backend_attention(b, &a)) || (st = llm_backend_matmul(b, &l->wo, f->att, n, f->xb)) ||
        (st = lora_run(f, bt, il, LLM_LORA_O, f->att, f->xb)) || (st = reduce(f, f->xb, (size_t)n * hp->n_embd)))
        return st;
    if (l->attn_post_norm)
        llm_backend_rmsnorm(b, f->xb, l->attn_post_norm, n, hp->n_embd, hp->eps, f->xb);
    llm_backend_add(b, f->x, f->xb, (size_t)n * hp->n_embd);
    return LLM_OK;
}

/* A gated MLP on n rows of x into out: gate and up as one matmul group,
 * the family's activation (GELU for gemma3, else SiLU), down. The dense
 * MLP of layer il (adapted as bt says) and each expert (il -1). */
static llm_status gated_mlp(llm_forward *f, const llm_forward_batch *bt, int il, const llm_weight *gate,
                            const llm_weight *up, const llm_weight *down, const float *x, int n, float *out)
{
    llm_backend *b = f->b;
    llm_matmul gate_up[2] = {{gate, f->hb}, {up, f->hb2}};
    llm_status st = llm_backend_matmul_group(b, gate_up, 2, x, n);
    if (st || (st = lora_run(f, bt, il, LLM_LORA_GATE, x, f->hb)) || (st = lora_run(f, bt, il, LLM_LORA_UP, x, f->hb2)))
        return st;
    size_t m = (size_t)n * (size_t)gate->rows;
    if (f->m->hp.ffn_gelu)
        llm_backend_geglu(b, f->hb, f->hb2, m, f->hb);
    else
        llm_backend_swiglu(b, f->hb, f->hb2, m, f->hb);
    if ((st = llm_backend_matmul(b, down, f->hb, n, out)))
        return st;
    return lora_run(f, bt, il, LLM_LORA_DOWN, f->hb, out);
}

static llm_status mlp_block(llm_forward *f, const llm_forward_batch *bt, int il, int n)
{
    const llm_hparams *hp = &f->m->hp;
    const llm_layer *l = &f->m->layers[il];
    llm_backend *b = f->b;
    llm_status st;
    llm_backend_rmsnorm(b, f->x, l->ffn_norm, n, hp->n_embd, hp->eps, f->xb);
    if ((st = gated_mlp(f, bt, il, &l->w_gate, &l->w_up, &l->w_down, f->xb, n, f->xb)) ||
        (st = reduce(f, f->xb, (size_t)n * hp->n_embd)))
        return st;
    if (l->ffn_post_norm)
        llm_backend_rmsnorm(b, f->xb, l->ffn_post_norm, n, hp->n_embd, hp->eps, f->xb);
    llm_backend_add(b, f->x, f->xb, (size_t)n * hp->n_embd);
    return LLM_OK;
}

/* One expert over the rows the plan gave it: its gated MLP on those rows
 * of f->xb, weighted into f->moe (set for rows it is the first expert of,
 * added for the others). */
static llm_status expert_run(llm_forward *f, const llm_layer *l, int e, int n)
{
    const llm_hparams *hp = &f->m->hp;
    const llm_moe_plan *p = &f->plan;
    llm_backend *b = f->b;
    int o = p->off[e], cnt = p->off[e + 1] - o, nf = p->n_first[e];
    llm_weight rows = {QT_F32, n, hp->n_embd, sizeof(float) * (size_t)hp->n_embd, f->xb, NULL};
    llm_backend_get_rows(b, &rows, p->rows + o, cnt, f->xe);
    llm_status st = gated_mlp(f, NULL, -1, &l->exp_gate[e], &l->exp_up[e], &l->exp_down[e], f->xe, cnt, f->ye);
    if (st)
        return st;
    if (nf > 0)
        llm_backend_add_rows(b, f->moe, p->rows + o, p->weight + o, f->ye, nf, hp->n_embd, 1);
    if (cnt > nf)
        llm_backend_add_rows(b, f->moe, p->rows + o + nf, p->weight + o + nf, f->ye + (size_t)nf * hp->n_embd,
                             cnt - nf, hp->n_embd, 0);
    return LLM_OK;
}

/* The mixture-of-experts MLP: router logits (read back to the host, where
 * the plan is made), then each expert with rows, in ascending id, so each
 * row's output sums its experts in the same order whatever else is in the
 * batch. A rank of tensor parallelism holds a share of every expert's
 * hidden units: the partial sums are reduced like a dense MLP's. */
static llm_status moe_block(llm_forward *f, int il, int n)
{
    const llm_hparams *hp = &f->m->hp;
    const llm_layer *l = &f->m->layers[il];
    llm_backend *b = f->b;
    llm_status st;
    llm_backend_rmsnorm(b, f->x, l->ffn_norm, n, hp->n_embd, hp->eps, f->xb);
    if ((st = llm_backend_matmul(b, &l->w_router, f->xb, n, f->router)))
        return st;
    const float *logits = f->router;
    if (f->router_host) {
        if ((st = llm_backend_read(b, f->router_host, f->router, sizeof(float) * (size_t)n * hp->n_expert)))
            return st;
        logits = f->router_host;
    }
    llm_moe_route(&f->plan, logits, n, hp->expert_scale);
    for (int e = 0; e < hp->n_expert; e++)
        if (f->plan.off[e + 1] > f->plan.off[e] && (st = expert_run(f, l, e, n)))
            return st;
    if ((st = reduce(f, f->moe, (size_t)n * hp->n_embd)))
        return st;
    if (l->ffn_post_norm)
        llm_backend_rmsnorm(b, f->moe, l->ffn_post_norm, n, hp->n_embd, hp->eps, f->moe);
    llm_backend_add(b, f->x, f->moe, (size_t)n * hp->n_embd);
    return LLM_OK;
}

/* Positions of every row; checks the batch's shape. */
static int batch_positions(llm_forward *f, const llm_forward_batch *bt)
{
    if (bt->n_rows < 1 || bt->n_rows > f->max_rows || bt->n_logits < 0 || bt->n_logits > f->max_logits)
        return -1;
    int row = 0;
    for (int s = 0; s < bt->n_seqs; s++) {
        const llm_batch_seq *q = &bt->seqs[s];
        if (q->tok0 != row || q->n_tok < 1 || q->pos0 < 0 || row + q->n_tok > bt->n_rows ||
            !q->local_table != !bt->seqs[0].local_table) /* local tables for all or none */
            return -1;
        for (int t = 0; t < q->n_tok; t++) f->pos[row + t] = q->pos0 + t;
        row += q->n_tok;
    }
    for (int i = 0; i < bt->n_logits; i++)
        if (bt->logit_rows[i] < 0 || bt->logit_rows[i] >= bt->n_rows)
            return -1;
    if (bt->n_hidden < 0 || bt->n_hidden > bt->n_rows)
        return -1;
    for (int i = 0; i < bt->n_hidden; i++)
        if (bt->hidden_rows[i] < 0 || bt->hidden_rows[i] >= bt->n_rows)
            return -1;
    for (int i = 0; i < bt->n_rows; i++) /* ids index the embedding table: never past it */
        if (bt->tokens[i] < 0 || bt->tokens[i] >= f->m->hp.n_vocab)
            return -1;
    for (int s = 0; bt->loras && s < bt->n_seqs; s++) /* handles come from llm_forward_lora_add, which refuses the rest */
        if (bt->loras[s].lora && (!isfinite(bt->loras[s].scale) || !f->b->iface->lora || f->comm))
            return -1;
    return row == bt->n_rows ? 0 : -1;
}

/* The batch's sequences as sliding-window layers see them: with their
 * local tables, when the cache keeps those layers apart (NULL: it does
 * not, every layer reads bt->seqs). batch_positions checked the count. */
static const llm_batch_seq *local_seqs(llm_forward *f, const llm_forward_batch *bt)
{
    if (bt->n_seqs < 1 || !bt->seqs[0].local_table)
        return NULL;
    for (int s = 0; s < bt->n_seqs; s++) {
        f->lseqs[s] = bt->seqs[s];
        f->lseqs[s].block_table = bt->seqs[s].local_table;
    }
    return f->lseqs;
}

/* One layer: attention (a sliding-window layer through the local tables
 * when there are any), then its MLP, dense or experts. */
static llm_status layer_run(llm_forward *f, const llm_forward_batch *bt, const llm_batch_seq *lseqs,
                            const llm_kv_layer *kv, int il)
{
    const llm_batch_seq *seqs = lseqs && f->m->layers[il].window > 0 ? lseqs : bt->seqs;
    llm_status st = attention_block(f, bt, seqs, kv, il);
    if (st)
        return st;
    return f->m->hp.n_expert > 0 ? moe_block(f, il, bt->n_rows) : mlp_block(f, bt, il, bt->n_rows);
}

/* The longest sequence's length after the batch. */
static int step_len(const llm_forward_batch *bt)
{
    int m = 0;
    for (int s = 0; s < bt->n_seqs; s++)
        if (bt->seqs[s].pos0 + bt->seqs[s].n_tok > m)
            m = bt->seqs[s].pos0 + bt->seqs[s].n_tok;
    return m;
}

/* Rows of argmax over host logits, with the device kernel's rule (ties:
 * lowest id; a row with a NaN picks LLM_SAMPLE_NAN). */
static void host_argmax(const float *lg, int n_rows, int n_vocab, int32_t *out)
{
    for (int r = 0; r < n_rows; r++) {
        const float *v = lg + (size_t)r * n_vocab;
        int32_t best = 0;
        for (int i = 0; i < n_vocab && best >= 0; i++)
            if (v[i] != v[i])
                best = LLM_SAMPLE_NAN;
            else if (v[i] > v[best])
                best = i;
        out[r] = best;
    }
}

/* Rows of the last layer's output (f->x, all the batch's rows) gathered
 * into tmp, then through the output norm into out (tmp may be out). */
static void final_rows(llm_forward *f, const llm_forward_batch *bt, const int32_t *which, int n, float *tmp, float *out)
{
    const llm_hparams *hp = &f->m->hp;
    llm_weight rows = {QT_F32, bt->n_rows, hp->n_embd, sizeof(float) * (size_t)hp->n_embd, f->x, NULL};
    llm_backend_get_rows(f->b, &rows, which, n, tmp);
    llm_backend_rmsnorm(f->b, tmp, f->m->output_norm, n, hp->n_embd, hp->eps, out);
}

/* The hidden rows asked for, through the output norm into f->xb (free
 * once the logits are computed: the device queue keeps the order) and,
 * from a device, read back into host memory. */
static llm_status hidden_out(llm_forward *f, const llm_forward_batch *bt)
{
    const llm_hparams *hp = &f->m->hp;
    final_rows(f, bt, bt->hidden_rows, bt->n_hidden, f->xb, f->xb);
    if (llm_backend_host_memory(f->b)) {
        f->hidden = f->xb;
        return LLM_OK;
    }
    if (!f->hidden_host && !(f->hidden_host = malloc(sizeof(float) * (size_t)f->max_rows * hp->n_embd)))
        return LLM_ERR_NOMEM;
    llm_status st = llm_backend_read(f->b, f->hidden_host, f->xb, sizeof(float) * (size_t)bt->n_hidden * hp->n_embd);
    if (!st)
        f->hidden = f->hidden_host;
    return st;
}

llm_status forward_eval_mode(llm_forward *f, const llm_forward_batch *bt, const llm_kv_layer *layers, int pick,
                             const llm_sample_params *sp, const float **logits, const int32_t **ids)
{
    if (f->tp)
        return tp_group_eval(f->tp, bt, layers, pick, sp, logits, ids);
    if (sp && !f->b->iface->sample)
        return LLM_ERR_INVALID_ARG;
    const llm_hparams *hp = &f->m->hp;
    llm_status st = LLM_OK;
    f->hidden = NULL;
    if (batch_positions(f, bt))
        return LLM_ERR_INVALID_ARG;
    const llm_batch_seq *lseqs = local_seqs(f, bt);
    if (f->b->iface->step_begin)
        f->b->iface->step_begin(f->b, &(llm_step_info){bt->n_rows, bt->n_seqs, bt->n_logits, step_len(bt),
                                                         bt->n_rows == bt->n_seqs,
                                                         pick && f->b->iface->sample && bt->n_logits > 0,
                                                         hp->n_expert > 0 || bt->n_hidden > 0, bt->loras != NULL});
    llm_backend_get_rows(f->b, &f->m->tok_embd, bt->tokens, bt->n_rows, f->x);
    if (hp->embd_scale != 1.0f)
        llm_backend_scale(f->b, f->x, hp->embd_scale, (size_t)bt->n_rows * hp->n_embd);
    for (int il = 0; il < hp->n_layer; il++)
        if ((st = layer_run(f, bt, lseqs, &layers[il], il)))
            return st;
    if (bt->n_logits > 0) {
        final_rows(f, bt, bt->logit_rows, bt->n_logits, f->last, f->xb);
        if ((st = llm_backend_matmul(f->b, &f->m->output, f->xb, bt->n_logits, f->logits)))
            return st;
    }
    if (bt->n_hidden > 0 && (st = hidden_out(f, bt)))
        return st;
    if (bt->n_logits == 0) /* prompt chunks alone: nothing to pick or read (nor, above, a step to capture) */
        st = LLM_OK;
    else if (pick && f->b->iface->sample)
        st = f->b->iface->sample(f->b, f->logits, bt->n_logits, hp->n_vocab, sp ? sp : f->greedy, f->ids);
    else if (f->logits_host)
        st = llm_backend_read(f->b, f->logits_host, f->logits, sizeof(float) * (size_t)bt->n_logits * hp->n_vocab);
    if (st)
        return st;
    const float *lg = f->logits_host ? f->logits_host : f->logits;
    if (pick && !f->b->iface->sample)
        host_argmax(lg, bt->n_logits, hp->n_vocab, f->ids);
    if (logits)
        *logits = lg;
    if (ids)
        *ids = f->ids;
    return LLM_OK;
}

llm_status llm_forward_eval(llm_forward *f, const llm_forward_batch *bt, const llm_kv_layer *layers,
                            const float **logits)
{
    return forward_eval_mode(f, bt, layers, 0, NULL, logits, NULL);
}

llm_status llm_forward_eval_sample(llm_forward *f, const llm_forward_batch *bt, const llm_kv_layer *layers,
                                   const llm_sample_params *p, const int32_t **ids)
{
    return forward_eval_mode(f, bt, layers, 1, p, NULL, ids);
}

const float *llm_forward_hidden(const llm_forward *f)
{
    return f->tp ? tp_group_hidden(f->tp) : f->hidden;
}

int llm_forward_device_sample(const llm_forward *f)
{
    return f->tp ? tp_group_device_sample(f->tp) : f->b->iface->sample != NULL;
}
