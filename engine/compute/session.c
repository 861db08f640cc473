/* session.c - one sequence evaluated token chunk by token chunk: a thin
 * layer over the batched forward pass (forward.h) and a private paged KV
 * cache (kv_cache.h) sized for the session's context. */
#include <math.h>
#include <string.h>

#include "llm/forward.h"
#include "llm/kv_cache.h"

struct llm_session {
    const llm_model *m;
    llm_backend *b;
    int n_ctx, max_batch, logit_rows;
    llm_forward *fwd;
    llm_forward_lora *lora; /* NULL: none */
    float lora_scale;
    kv_cache *kv;
    kv_seq seq;
    int32_t *tokens; /* (n_ctx) evaluated so far, for the cache's bookkeeping */
};

llm_status llm_session_new(const llm_model *m, llm_backend *b, const llm_session_config *cfg, llm_session **out,
                           llm_error *err)
{
    *out = NULL;
    int n_ctx = cfg && cfg->n_ctx > 0 ? cfg->n_ctx : m->hp.n_ctx_train;
    int max_batch = cfg && cfg->max_batch > 0 ? cfg->max_batch : 512;
    int logit_rows = cfg && cfg->logit_rows > 0 ? cfg->logit_rows : 1;
    if (n_ctx > (1 << 24) || max_batch > (1 << 16))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "session: n_ctx %d or batch %d too large", n_ctx, max_batch);
    if (logit_rows > max_batch)
        logit_rows = max_batch; /* a step has at most max_batch rows to give logits for */
    llm_session *s = calloc(1, sizeof *s);
    if (!s)
        return llm_errf(err, LLM_ERR_NOMEM, "session: no memory");
    s->m = m;
    s->b = b;
    s->n_ctx = n_ctx;
    s->max_batch = max_batch;
    s->logit_rows = logit_rows;
    kv_seq_init(&s->seq);
    int nr = cfg && cfg->tensor_parallel > 1 ? cfg->tensor_parallel : 1;
    llm_backend *const *ranks = nr > 1 ? cfg->tp_backends : &s->b;
    /* sliding-window layers keep what one sequence's windows and chunk read */
    unsigned char *local = calloc((size_t)m->hp.n_layer, 1);
    int bs = KV_DEFAULT_BLOCK, window = local ? llm_model_windows(m, local) : 0;
    kv_cache_config kc = {.type = cfg ? (llm_kv_type)cfg->kv_type : LLM_KV_F16, .n_blocks = (n_ctx + bs - 1) / bs,
                          .ranks = ranks, .n_ranks = nr, .window = window, .local = local,
                          .n_local_blocks = (int)kv_cache_local_need(window, bs, 1, max_batch)};
    llm_status st = LLM_OK;
    if (!local)
        st = llm_errf(err, LLM_ERR_NOMEM, "session: no memory");
    else if (nr > 1 && (!ranks || ranks[0] != b))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "session: tensor_parallel %d needs its backends", nr);
    if (!st)
        st = llm_forward_new_tp(m, ranks, nr, max_batch, logit_rows, &s->fwd, err);
    if (!st && cfg && cfg->lora) {
        s->lora_scale = cfg->lora_scale;
        st = isfinite(cfg->lora_scale) ? llm_forward_lora_add(s->fwd, cfg->lora, &s->lora, err)
                                       : llm_errf(err, LLM_ERR_INVALID_ARG, "session: adapter scale is not finite");
    }
    if (!st)
        st = kv_cache_new(&kc, b, m->hp.n_layer, m->hp.n_head_kv / nr, m->hp.head_dim, &s->kv, err);
    free(local);
    if (!st && !(s->tokens = malloc(sizeof(int32_t) * (size_t)n_ctx)))
        st = llm_errf(err, LLM_ERR_NOMEM, "session: no memory");
    if (st) {
        llm_session_free(s);
        return st;
    }
    *out = s;
    return LLM_OK;
}

void llm_session_free(llm_session *s)
{
    if (!s)
        return;
    if (s->kv)
        kv_seq_release(s->kv, &s->seq);
    kv_cache_free(s->kv);
    llm_forward_lora_free(s->fwd, s->lora);
    llm_forward_free(s->fwd);
    free(s->tokens);
    free(s);
}

int llm_session_pos(const llm_session *s) { return s->seq.n_tokens; }
int llm_session_n_ctx(const llm_session *s) { return s->n_ctx; }
void llm_session_reset(llm_session *s) { kv_seq_release(s->kv, &s->seq); }

/* One chunk of at most max_batch tokens: logits for its last token, or
 * (rows set, n <= logit_rows) for rows[0 .. n) = every token. */
static llm_status eval_chunk(llm_session *s, const int32_t *tokens, int n, const int32_t *rows, const float **logits)
{
    llm_status st = kv_seq_reserve(s->kv, &s->seq, n);
    if (st)
        return st;
    llm_batch_seq bs = {0, n, s->seq.n_tokens, s->seq.blocks, s->seq.lblocks};
    int32_t last = n - 1;
    llm_forward_seq_lora sl = {s->lora, s->lora_scale};
    llm_forward_batch bt = {tokens, n, &bs, 1, rows ? rows : &last, rows ? n : 1, NULL, 0, s->lora ? &sl : NULL};
    if ((st = llm_forward_eval(s->fwd, &bt, kv_cache_layers(s->kv), logits)))
        return st;
    memcpy(s->tokens + s->seq.n_tokens, tokens, sizeof(int32_t) * (size_t)n);
    kv_seq_commit(s->kv, &s->seq, s->tokens, n);
    return LLM_OK;
}

/* Checks a call's tokens against the context and vocabulary. */
static llm_status check_input(const llm_session *s, const int32_t *tokens, int n, llm_error *err)
{
    int pos = s->seq.n_tokens;
    if (n <= 0)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "eval: no tokens");
    if (n > s->n_ctx - pos)
        return llm_errf(err, LLM_ERR_TOO_LONG, "eval: %d tokens at position %d exceed the context of %d", n, pos,
                        s->n_ctx);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= s->m->hp.n_vocab)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "eval: token id %d at index %d not in [0, %d)", tokens[i], i,
                            s->m->hp.n_vocab);
    return LLM_OK;
}

/* A failed step: forget the partial input (positions past pos are
 * overwritten next time), or everything when sliding-window layers had
 * already dropped K/V that position pos's window reads. */
static llm_status rewind_to(llm_session *s, int pos, llm_status st, llm_error *err)
{
    if (kv_seq_truncate(s->kv, &s->seq, pos) != pos)
        return llm_errf(err, st, "eval: backend %s failed: %s; the session was reset (its sliding-window K/V for "
                        "position %d was already dropped): evaluate again from the start", s->b->iface->name,
                        llm_status_str(st), pos);
    return llm_errf(err, st, "eval: backend %s failed: %s", s->b->iface->name, llm_status_str(st));
}

llm_status llm_session_eval(llm_session *s, const int32_t *tokens, int n, const float **logits, llm_error *err)
{
    int pos = s->seq.n_tokens;
    llm_status st = check_input(s, tokens, n, err);
    for (int i = 0; !st && i < n; i += s->max_batch) {
        int c = n - i < s->max_batch ? n - i : s->max_batch;
        if ((st = eval_chunk(s, tokens + i, c, NULL, logits)))
            return rewind_to(s, pos, st, err);
    }
    return st;
}

llm_status llm_session_eval_each(llm_session *s, const int32_t *tokens, int n, llm_logits_fn fn, void *ctx,
                                 llm_error *err)
{
    int pos = s->seq.n_tokens, step = s->logit_rows;
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)step);
    llm_status st = rows ? check_input(s, tokens, n, err) : llm_errf(err, LLM_ERR_NOMEM, "eval: no memory");
    for (int r = 0; rows && r < step; r++) rows[r] = r;
    for (int i = 0; !st && i < n; i += step) {
        int c = n - i < step ? n - i : step;
        const float *lg;
        if ((st = eval_chunk(s, tokens + i, c, rows, &lg))) {
            st = rewind_to(s, pos, st, err);
            break;
        }
        for (int r = 0; r < c && !st; r++)
            if (fn(ctx, i + r, lg + (size_t)r * (size_t)s->m->hp.n_vocab))
                st = llm_errf(err, LLM_ERR_CANCELLED, "eval: stopped by the caller at token %d", i + r);
    }
    free(rows);
    return st;
}
