/* engine_draft.c - speculation's draft model (LLM_SPEC_DRAFT): a second,
 * smaller model with the target's vocabulary guesses each decoding
 * sequence's next tokens, greedily, from K/V pages of its own.
 *
 * Its guesses are checked exactly as n-gram guesses are (engine_step.c):
 * the target picks each row as a plain step would and keeps the picks
 * while they equal the guesses. A greedy draft is a one-hot proposal, for
 * which that is speculative sampling's accept/resample rule, so answers
 * stay the same token for token and seed for seed whatever the draft
 * says; a better draft only takes fewer steps.
 *
 * A sequence's draft K/V holds its true tokens alone: a step computes the
 * tokens the sequence gained since its last guesses (its prompt the first
 * time, less what the draft's prefix cache holds), then one row per guess;
 * only the true tokens' positions are committed, so the guesses' K/V is
 * written over next time, whatever the target took.
 *
 * Thread rules: the draft's cache and block tables change only under the
 * engine's lock (eng_draft_begin and eng_draft_end on the engine thread,
 * eng_draft_release on any thread, or without the lock for a sequence
 * that never reached the engine); its passes (eng_draft_run) run on the
 * engine thread without the lock, while the engine holds every planned
 * request in flight (engine_step.c's guesses): a cancel waits, so nothing
 * else touches those sequences, their tables or the plan meanwhile. */
#include <string.h>

#include "engine_impl.h"
#include "llm/kv_cache.h"

struct eng_draft {
    const llm_model *m;
    llm_forward *fwd;
    kv_cache *kv;
    int max_rows;          /* rows per pass */
    int max_q;             /* sequences per step: spec_max_seqs, at most max_seqs */
    int32_t *b_tokens;     /* (max_rows) */
    int32_t *b_rows;       /* (max_q) logit rows */
    llm_batch_seq *b_seqs; /* (max_q) */
    int32_t *cp_src, *cp_dst; /* (n_blocks) copy-on-write copies queued by begin */
    int n_cp;
    eng_seq **q;           /* (max_q) this step's drafting sequences */
    int *k;                /* (max_q) guesses each asked for; then made */
    int *next, *end;       /* (max_q) the positions [next, end) its catch-up computes this step */
    int *want;             /* (max_seqs) the guesses each plan item asks for */
    int *who;              /* (max_q) a pass's logit rows' sequences */
    int n_q;
};

/* The first id whose token text differs between two vocabularies of the
 * same size, or -1 when they are the same token for token: a guess is an
 * id, and the target must read it as the draft meant it. */
static int32_t vocab_differs(const llm_vocab *a, const llm_vocab *b)
{
    for (int32_t id = 0; id < llm_vocab_n(a); id++) {
        gguf_str x = llm_vocab_text(a, id), y = llm_vocab_text(b, id);
        if (x.len != y.len || (x.len && memcmp(x.data, y.data, (size_t)x.len)))
            return id;
    }
    return -1;
}

static llm_status vocab_check(const llm_model *draft, const llm_model *m, llm_error *err)
{
    if (draft->hp.n_vocab != m->hp.n_vocab || llm_vocab_n(draft->vocab) != llm_vocab_n(m->vocab))
        return llm_errf(err, LLM_ERR_INVALID_ARG,
                        "engine: the draft model's vocabulary has %d tokens, the model's %d: its guesses would name "
                        "other tokens", llm_vocab_n(draft->vocab), llm_vocab_n(m->vocab));
    int32_t id = vocab_differs(draft->vocab, m->vocab);
    if (id < 0)
        return LLM_OK;
    gguf_str x = llm_vocab_text(draft->vocab, id), y = llm_vocab_text(m->vocab, id);
    return llm_errf(err, LLM_ERR_INVALID_ARG,
                    "engine: the draft model's vocabulary is not the model's: token %d is '%.*s' there, '%.*s' here",
                    (int)id, (int)(x.len < 40 ? x.len : 40), x.data, (int)(y.len < 40 ? y.len : 40), y.data);
}

/* Blocks for the draft's pool: spec_draft_kv_bytes, or by default room for
 * every drafting sequence's full context but at most 256 MiB, and never
 * less than one full context (a set budget under that is an error). */
static llm_status draft_blocks(const llm_engine_config *c, const llm_model *m, int max_q, int *out, llm_error *err)
{
    const llm_hparams *hp = &m->hp;
    size_t per = kv_cache_block_bytes(c->kv_type, c->block_size, hp->n_layer, hp->n_head_kv * hp->head_dim);
    size_t per_seq = (size_t)(c->n_ctx + c->block_size - 1) / (size_t)c->block_size, n = per_seq * (size_t)max_q;
    if (c->spec_draft_kv_bytes) {
        n = c->spec_draft_kv_bytes / per;
        if (n < per_seq)
            return llm_errf(err, LLM_ERR_INVALID_ARG,
                            "engine: spec_draft_kv_bytes %zu holds %zu blocks of %zu bytes; one sequence of n_ctx %d "
                            "needs %zu", c->spec_draft_kv_bytes, n, per, c->n_ctx, per_seq);
    } else if (n * per > (size_t)256 << 20) {
        n = ((size_t)256 << 20) / per > per_seq ? ((size_t)256 << 20) / per : per_seq;
    }
    *out = n > (size_t)1 << 30 ? 1 << 30 : (int)n;
    return LLM_OK;
}

static llm_status draft_buffers(eng_draft *d, int n_blocks, int max_seqs, llm_error *err)
{
    d->b_tokens = malloc(sizeof(int32_t) * (size_t)d->max_rows);
    d->b_rows = malloc(sizeof(int32_t) * (size_t)d->max_q);
    d->b_seqs = malloc(sizeof(llm_batch_seq) * (size_t)d->max_q);
    d->cp_src = malloc(sizeof(int32_t) * (size_t)n_blocks);
    d->cp_dst = malloc(sizeof(int32_t) * (size_t)n_blocks);
    d->q = malloc(sizeof(eng_seq *) * (size_t)d->max_q);
    d->k = malloc(sizeof(int) * (size_t)d->max_q);
    d->next = malloc(sizeof(int) * (size_t)d->max_q);
    d->who = malloc(sizeof(int) * (size_t)d->max_q);
    d->end = malloc(sizeof(int) * (size_t)d->max_q);
    d->want = malloc(sizeof(int) * (size_t)max_seqs);
    if (!d->b_tokens || !d->b_rows || !d->b_seqs || !d->cp_src || !d->cp_dst || !d->q || !d->k || !d->next ||
        !d->who || !d->end || !d->want)
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for the draft model's buffers");
    return LLM_OK;
}

llm_status eng_draft_new(const llm_engine_config *c, llm_backend *b, eng_draft **out, llm_error *err)
{
    *out = NULL;
    const llm_model *m = c->spec_draft_model;
    if (!m)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: speculative LLM_SPEC_DRAFT needs spec_draft_model");
    llm_status st = vocab_check(m, c->model, err);
    if (st)
        return st;
    if (c->n_ctx > m->hp.n_ctx_train)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: n_ctx %d is beyond the draft model's training context %d",
                        c->n_ctx, m->hp.n_ctx_train);
    eng_draft *d = calloc(1, sizeof *d);
    if (!d)
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for the draft model");
    d->m = m;
    d->max_rows = c->max_batch_tokens;
    d->max_q = c->spec_max_seqs < c->max_seqs ? c->spec_max_seqs : c->max_seqs;
    int n_blocks = 0;
    /* one pool, every position kept (no sliding-window pool): a draft's
     * windowed layers read fewer positions of it, nothing more */
    st = draft_blocks(c, m, d->max_q, &n_blocks, err);
    if (!st)
        st = llm_forward_new(m, b, d->max_rows, d->max_q, &d->fwd, err);
    if (!st) {
        kv_cache_config kc = {.block_size = c->block_size, .type = c->kv_type, .n_blocks = n_blocks,
                              .prefix_cache = !c->no_prefix_cache};
        st = kv_cache_new(&kc, b, m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim, &d->kv, err);
    }
    if (!st)
        st = draft_buffers(d, n_blocks, c->max_seqs, err);
    if (st) {
        eng_draft_free(d);
        return st;
    }
    *out = d;
    return LLM_OK;
}

void eng_draft_free(eng_draft *d)
{
    if (!d)
        return;
    llm_forward_free(d->fwd);
    kv_cache_free(d->kv);
    free(d->b_tokens);
    free(d->b_rows);
    free(d->b_seqs);
    free(d->cp_src);
    free(d->cp_dst);
    free(d->q);
    free(d->k);
    free(d->next);
    free(d->who);
    free(d->end);
    free(d->want);
    free(d);
}

void eng_draft_release(eng_draft *d, eng_seq *q)
{
    if (d)
        kv_seq_release(d->kv, &q->dkv);
}

/* The tokens q's draft has yet to compute: a new table first takes what
 * the prefix cache holds of its tokens (all but the last, whose row gives
 * the first guess). */
static int draft_behind(eng_draft *d, eng_seq *q)
{
    int n = q->q.n_tokens;
    if (q->dkv.n_tokens == 0)
        kv_seq_match(d->kv, &q->dkv, q->tokens, n - 1);
    LLM_ASSERT(q->dkv.n_tokens < n); /* only true tokens are committed, and a step adds one at least */
    return n - q->dkv.n_tokens;
}

/* Adds q to the step: `rows` of its catch-up, then k - 1 guess rows (k 0:
 * it catches up only, `rows` short of its tokens). Returns 0 when the pool
 * has no room (then q's blocks go back, for others). */
static int draft_add(llm_engine *e, eng_seq *q, int rows, int k)
{
    eng_draft *d = e->draft;
    if (kv_seq_reserve(d->kv, &q->dkv, rows + (k > 0 ? k - 1 : 0)) != LLM_OK) {
        kv_seq_release(d->kv, &q->dkv);
        e->st.spec_draft_full++;
        return 0;
    }
    d->q[d->n_q] = q;
    d->k[d->n_q] = k;
    d->next[d->n_q] = q->dkv.n_tokens;
    d->end[d->n_q++] = q->dkv.n_tokens + rows;
    return 1;
}

/* A step's catch-up is one pass of at most max_rows rows (a prompt's
 * first catch-up is spread over steps, as the target's prompts are, so a
 * long one does not hold every sequence's step): sequences a few tokens
 * behind (decoding) take their rows first, then the others what is left;
 * one that cannot catch up whole this step guesses nothing yet. */
int eng_draft_begin(llm_engine *e)
{
    eng_draft *d = e->draft;
    const sched *s = &e->s;
    int left = d->max_rows;
    d->n_q = 0;
    for (int i = 0; i < s->n_items; i++) d->want[i] = eng_spec_want(&s->items[i]);
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < s->n_items && d->n_q < d->max_q && left > 0; i++) {
            eng_seq *q = s->items[i].seq->user;
            if (d->want[i] < 1)
                continue;
            int behind = draft_behind(d, q), k = d->want[i];
            if ((behind <= LLM_SPEC_MAX_TOKENS + 1) != (round == 0))
                continue; /* (round 0: the few tokens a decoding sequence gained; round 1: the rest) */
            d->want[i] = 0; /* (taken, or refused: once a step) */
            int rows = behind < left ? behind : left;
            if (draft_add(e, q, rows, rows == behind ? k : 0))
                left -= rows;
        }
    const int32_t *src, *dst;
    d->n_cp = kv_cache_copies(d->kv, KV_POOL_GLOBAL, &src, &dst);
    if (d->n_cp > 0) {
        memcpy(d->cp_src, src, sizeof(int32_t) * (size_t)d->n_cp);
        memcpy(d->cp_dst, dst, sizeof(int32_t) * (size_t)d->n_cp);
    }
    kv_cache_copies_done(d->kv);
    return d->n_q;
}

/* One draft pass over b_seqs[0, ns) (rows b_tokens[0, rows)); logit row l's
 * argmax is guess j of sequence who[l]. */
static llm_status draft_pass(eng_draft *d, int rows, int ns, int nl, int j)
{
    llm_forward_batch bt = {d->b_tokens, rows, d->b_seqs, ns, d->b_rows, nl, NULL, 0, NULL};
    const int32_t *ids;
    llm_status st = llm_forward_eval_sample(d->fwd, &bt, kv_cache_layers(d->kv), NULL, &ids);
    if (st)
        return st;
    for (int l = 0; l < nl; l++) {
        eng_seq *q = d->q[d->who[l]];
        int32_t id = ids[l];
        if (id < 0 || id >= d->m->hp.n_vocab) /* a NaN row: no guess from here on */
            d->k[d->who[l]] = j;
        else
            q->tokens[q->q.n_tokens + j] = id;
    }
    return LLM_OK;
}

/* The step's catch-up rows, every sequence's in one pass (begin kept
 * them within max_rows); a sequence's last row gives its first guess
 * when it caught up whole and guesses. */
static llm_status draft_catch_up(eng_draft *d)
{
    int rows = 0, ns = 0, nl = 0;
    for (int i = 0; i < d->n_q; i++) {
        eng_seq *q = d->q[i];
        int m = d->end[i] - d->next[i];
        if (m <= 0)
            continue;
        memcpy(d->b_tokens + rows, q->tokens + d->next[i], sizeof(int32_t) * (size_t)m);
        d->b_seqs[ns++] = (llm_batch_seq){rows, m, d->next[i], q->dkv.blocks, NULL};
        rows += m;
        if (d->k[i] > 0) {
            d->b_rows[nl] = rows - 1;
            d->who[nl++] = i;
        }
    }
    return rows > 0 ? draft_pass(d, rows, ns, nl, 0) : LLM_OK;
}

llm_status eng_draft_run(llm_engine *e)
{
    eng_draft *d = e->draft;
    if (d->n_cp > 0)
        llm_forward_kv_copy(d->fwd, kv_cache_layers(d->kv), LLM_KV_COPY_ALL, d->cp_src, d->cp_dst, d->n_cp);
    llm_status st = draft_catch_up(d);
    for (int j = 1; !st; j++) { /* guess j from guess j - 1, for the sequences that asked for more */
        int ns = 0;
        for (int i = 0; i < d->n_q; i++) {
            eng_seq *q = d->q[i];
            int pos = q->q.n_tokens + j - 1;
            if (d->k[i] <= j || llm_vocab_is_eog(e->m->vocab, q->tokens[pos])) { /* (the model's end: where
                                                                                   * its checking stops) */
                d->k[i] = d->k[i] < j ? d->k[i] : j; /* (a guess after an end would never be checked) */
                continue;
            }
            d->b_tokens[ns] = q->tokens[pos];
            d->b_seqs[ns] = (llm_batch_seq){ns, 1, pos, q->dkv.blocks, NULL};
            d->b_rows[ns] = ns;
            d->who[ns++] = i;
        }
        if (ns == 0)
            break;
        st = draft_pass(d, ns, ns, ns, j);
    }
    return st;
}

int eng_draft_end(llm_engine *e, llm_status st)
{
    eng_draft *d = e->draft;
    int any = 0;
    for (int i = 0; i < d->n_q; i++) {
        eng_seq *q = d->q[i];
        if (st) { /* a failed pass: no guesses, and its K/V is unknown */
            kv_seq_release(d->kv, &q->dkv);
            continue;
        }
        kv_seq_commit(d->kv, &q->dkv, q->tokens, d->end[i] - q->dkv.n_tokens);
        kv_seq_truncate(d->kv, &q->dkv, q->dkv.n_tokens); /* the guesses' blocks go back */
        q->q.n_draft = d->k[i];
        any |= d->k[i] > 0;
    }
    d->n_q = 0;
    return any;
}
