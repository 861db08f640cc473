/* session.c - the forward pass of one sequence: embeddings -> n_layer x
 * (RMSNorm, attention with RoPE and GQA over the KV cache, residual, RMSNorm,
 * SwiGLU MLP, residual) -> final norm -> logits of the last token.
 *
 * The KV cache here is one contiguous run of blocks with an identity block
 * table, so the attention code is already the paged one. */
#include <math.h>
#include <string.h>

#include "llm/model.h"

#define SESSION_BLOCK 16

struct llm_session {
    const llm_model *m;
    llm_backend *b;
    int n_ctx, max_batch, pos;
    float *k_cache, *v_cache;  /* (n_layer, n_ctx_blocks * SESSION_BLOCK, kv_dim) */
    int32_t *block_table;      /* identity */
    /* scratch, each sized for max_batch rows */
    float *x, *xb, *q, *k, *v, *att, *hb, *hb2, *logits;
};

static void *xcalloc(size_t n, size_t sz, int *fail)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p)
        *fail = 1;
    return p;
}

llm_status llm_session_new(const llm_model *m, llm_backend *b, int n_ctx, int max_batch, llm_session **out,
                           llm_error *err)
{
    *out = NULL;
    const llm_hparams *hp = &m->hp;
    if (n_ctx <= 0)
        n_ctx = hp->n_ctx_train;
    if (max_batch <= 0)
        max_batch = 512;
    if (n_ctx > (1 << 24) || max_batch > (1 << 16))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "session: n_ctx %d or batch %d too large", n_ctx, max_batch);
    llm_session *s = calloc(1, sizeof *s);
    if (!s)
        return llm_errf(err, LLM_ERR_NOMEM, "session: no memory");
    s->m = m;
    s->b = b;
    s->max_batch = max_batch;
    int n_blocks = (n_ctx + SESSION_BLOCK - 1) / SESSION_BLOCK;
    s->n_ctx = n_ctx;
    size_t kvd = (size_t)hp->n_head_kv * hp->head_dim, qd = (size_t)hp->n_head * hp->head_dim;
    size_t kv_elems = (size_t)hp->n_layer * n_blocks * SESSION_BLOCK * kvd, B = (size_t)max_batch;
    int fail = 0;
    s->k_cache = xcalloc(kv_elems, sizeof(float), &fail);
    s->v_cache = xcalloc(kv_elems, sizeof(float), &fail);
    s->block_table = xcalloc((size_t)n_blocks, sizeof(int32_t), &fail);
    s->x = xcalloc(B * hp->n_embd, sizeof(float), &fail);
    s->xb = xcalloc(B * (qd > (size_t)hp->n_embd ? qd : (size_t)hp->n_embd), sizeof(float), &fail);
    s->q = xcalloc(B * qd, sizeof(float), &fail);
    s->k = xcalloc(B * kvd, sizeof(float), &fail);
    s->v = xcalloc(B * kvd, sizeof(float), &fail);
    s->att = xcalloc(B * qd, sizeof(float), &fail);
    s->hb = xcalloc(B * hp->n_ff, sizeof(float), &fail);
    s->hb2 = xcalloc(B * hp->n_ff, sizeof(float), &fail);
    s->logits = xcalloc((size_t)hp->n_vocab, sizeof(float), &fail);
    if (fail) {
        llm_session_free(s);
        return llm_errf(err, LLM_ERR_NOMEM, "session: no memory for a %d-token KV cache (%zu MiB)", n_ctx,
                        kv_elems * 8 >> 20);
    }
    for (int i = 0; i < n_blocks; i++) s->block_table[i] = i;
    *out = s;
    return LLM_OK;
}

void llm_session_free(llm_session *s)
{
    if (!s)
        return;
    float *bufs[] = {s->k_cache, s->v_cache, s->x, s->xb, s->q, s->k, s->v, s->att, s->hb, s->hb2, s->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) free(bufs[i]);
    free(s->block_table);
    free(s);
}

int llm_session_pos(const llm_session *s) { return s->pos; }
int llm_session_n_ctx(const llm_session *s) { return s->n_ctx; }
void llm_session_reset(llm_session *s) { s->pos = 0; }

static void add_bias(float *x, const float *bias, int n_tok, int dim)
{
    if (!bias)
        return;
    for (int t = 0; t < n_tok; t++)
        for (int i = 0; i < dim; i++) x[(size_t)t * dim + i] += bias[i];
}

static llm_status attention_block(llm_session *s, int il, int n)
{
    const llm_hparams *hp = &s->m->hp;
    const llm_layer *l = &s->m->layers[il];
    llm_backend *b = s->b;
    int qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
    llm_status st;
    llm_backend_rmsnorm(b, s->x, l->attn_norm, n, hp->n_embd, hp->eps, s->xb);
    llm_matmul qkv[3] = {{&l->wq, s->q}, {&l->wk, s->k}, {&l->wv, s->v}};
    if ((st = llm_backend_matmul_group(b, qkv, 3, s->xb, n)))
        return st;
    add_bias(s->q, l->bq, n, qd);
    add_bias(s->k, l->bk, n, kvd);
    add_bias(s->v, l->bv, n, kvd);
    llm_rope_args r = {s->q, n, hp->n_head, hp->head_dim, hp->rot_dim, s->pos, hp->rope_theta,
                       hp->rope_freq_scale, hp->rope_neox, s->m->rope_freqs};
    llm_backend_rope(b, &r);
    r.x = s->k;
    r.n_head = hp->n_head_kv;
    llm_backend_rope(b, &r);
    size_t layer_off = (size_t)il * (size_t)((s->n_ctx + SESSION_BLOCK - 1) / SESSION_BLOCK) * SESSION_BLOCK * kvd;
    llm_kv_view kv = {s->k_cache + layer_off, s->v_cache + layer_off, s->block_table, SESSION_BLOCK, kvd};
    llm_backend_kv_write(b, &kv, s->pos, n, s->k, s->v);
    llm_attn_args a = {s->q, s->att, n, s->pos, hp->n_head, hp->n_head_kv, hp->head_dim,
                       1.0f / sqrtf((float)hp->head_dim), kv};
    if ((st = llm_backend_attention(b, &a)) || (st = llm_backend_matmul(b, &l->wo, s->att, n, s->xb)))
        return st;
    llm_backend_add(b, s->x, s->xb, (size_t)n * hp->n_embd);
    return LLM_OK;
}

static llm_status mlp_block(llm_session *s, int il, int n)
{
    const llm_hparams *hp = &s->m->hp;
    const llm_layer *l = &s->m->layers[il];
    llm_backend *b = s->b;
    llm_status st;
    llm_backend_rmsnorm(b, s->x, l->ffn_norm, n, hp->n_embd, hp->eps, s->xb);
    llm_matmul gate_up[2] = {{&l->w_gate, s->hb}, {&l->w_up, s->hb2}};
    if ((st = llm_backend_matmul_group(b, gate_up, 2, s->xb, n)))
        return st;
    llm_backend_swiglu(b, s->hb, s->hb2, (size_t)n * hp->n_ff, s->hb);
    if ((st = llm_backend_matmul(b, &l->w_down, s->hb, n, s->xb)))
        return st;
    llm_backend_add(b, s->x, s->xb, (size_t)n * hp->n_embd);
    return LLM_OK;
}

/* One chunk of at most max_batch tokens; logits only for its last token. */
static llm_status eval_chunk(llm_session *s, const int32_t *tokens, int n)
{
    const llm_hparams *hp = &s->m->hp;
    llm_status st;
    llm_backend_get_rows(s->b, &s->m->tok_embd, tokens, n, s->x);
    for (int il = 0; il < hp->n_layer; il++)
        if ((st = attention_block(s, il, n)) || (st = mlp_block(s, il, n)))
            return st;
    const float *last = s->x + (size_t)(n - 1) * hp->n_embd;
    llm_backend_rmsnorm(s->b, last, s->m->output_norm, 1, hp->n_embd, hp->eps, s->xb);
    if ((st = llm_backend_matmul(s->b, &s->m->output, s->xb, 1, s->logits)))
        return st;
    s->pos += n;
    return LLM_OK;
}

llm_status llm_session_eval(llm_session *s, const int32_t *tokens, int n, const float **logits, llm_error *err)
{
    if (n <= 0)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "eval: no tokens");
    if (n > s->n_ctx - s->pos)
        return llm_errf(err, LLM_ERR_TOO_LONG, "eval: %d tokens at position %d exceed the context of %d", n, s->pos,
                        s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->m->hp.n_vocab)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "eval: token id %d at index %d not in [0, %d)", tokens[i], i,
                            s->m->hp.n_vocab);
    int start = s->pos;
    for (int i = 0; i < n; i += s->max_batch) {
        int c = n - i < s->max_batch ? n - i : s->max_batch;
        llm_status st = eval_chunk(s, tokens + i, c);
        if (st) {
            s->pos = start;
            return llm_errf(err, st, "eval: backend %s failed: %s", s->b->iface->name, llm_status_str(st));
        }
    }
    *logits = s->logits;
    return LLM_OK;
}
