/* engine_step.c - the serving engine's step loop, on the engine thread:
 * plan (scheduler) -> copy-on-write copies and one batched forward pass
 * without the lock -> sampling without the lock -> events, finishing and
 * stats under the lock. The caller's side is engine.c; the state both
 * share is engine_impl.h. See docs/internals/scheduler.md. */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "llm/engine.h"
#include "llm/forward.h"
#include "llm/gmatch.h"
#include "llm/scheduler.h"
#include "llm/sync.h"
#include "llm/thread.h"
#include "llm/utf8.h"
#include "engine_impl.h"
#include "textout.h"

/* ---- the step loop (engine thread) ----------------------------------------- */

/* Pool's queued copies into e->cp_src/cp_dst from index at; how many. */
static int take_copies(llm_engine *e, kv_pool_id pool, int at)
{
    const int32_t *src, *dst;
    int n = kv_cache_copies(e->kv, pool, &src, &dst);
    if (n > 0) {
        memcpy(e->cp_src + at, src, sizeof(int32_t) * (size_t)n);
        memcpy(e->cp_dst + at, dst, sizeof(int32_t) * (size_t)n);
    }
    return n;
}

/* Whether plan item i samples a token this step: its prompt is through and
 * it generates (an embedding request pools instead). */
static int item_samples(const llm_engine *e, int i)
{
    return e->s.items[i].logits && !((const eng_seq *)e->s.items[i].seq->user)->r->pooling;
}

/* The rows of item it (from batch row `row`) that embedding sequence q
 * pools, appended to e->b_hidden_rows from *n: every position not pooled
 * yet (mean), or the prompt's last (last). */
static void eng_hidden_rows(llm_engine *e, const sched_item *it, eng_seq *q, int row, int *n)
{
    q->h0 = *n;
    if (q->r->pooling == LLM_POOL_MEAN) {
        for (int t = 0; t < it->n; t++)
            if (it->pos0 + t >= q->n_pooled)
                e->b_hidden_rows[(*n)++] = row + t;
    } else if (q->r->pooling == LLM_POOL_LAST && it->logits) {
        e->b_hidden_rows[(*n)++] = row + it->n - 1;
    }
    q->hn = *n - q->h0;
}

/* The logit rows of plan item i (batch rows from `row`) for q, appended
 * to e->b_logit_rows from *n: its prompt positions without an entry yet
 * that another prompt token follows (prompt_logprobs: the scheduler left
 * room for them), then its sampling rows (its last token's, then one per
 * guess). */
static void eng_logit_rows(llm_engine *e, int i, eng_seq *q, int row, int *n)
{
    const sched_item *it = &e->s.items[i];
    q->l0 = *n, q->ln = 0, q->ls = -1;
    if (q->plp) {
        int end = it->pos0 + it->n, last = q->q.n_prompt - 1;
        q->l_pos = it->pos0 > q->n_plp ? it->pos0 : q->n_plp;
        for (int p = q->l_pos; p < end && p < last; p++) e->b_logit_rows[(*n)++] = row + p - it->pos0;
        q->ln = *n - q->l0;
    }
    q->ns = 1 + it->n_draft;
    q->n_out = 0;
    if (item_samples(e, i)) { /* its last token's row, then one per guess */
        q->ls = *n;
        for (int j = it->n - q->ns; j < it->n; j++) e->b_logit_rows[(*n)++] = row + j;
    }
}

/* Under the lock: the plan as a forward batch; copies to make; requests
 * marked in flight so cancel waits for them. */
static void step_prepare(llm_engine *e, llm_forward_batch *bt)
{
    const sched *s = &e->s;
    int row = 0, n_logits = 0, n_hidden = 0, adapted = 0;
    double now = eng_now_ms();
    e->step_t0 = now;
    for (int i = 0; i < s->n_items; i++) {
        const sched_item *it = &s->items[i];
        eng_seq *q = it->seq->user;
        memcpy(e->b_tokens + row, q->tokens + it->pos0, sizeof(int32_t) * (size_t)it->n);
        e->b_seqs[i] = (llm_batch_seq){row, it->n, it->pos0, it->seq->kv.blocks, it->seq->kv.lblocks};
        e->b_loras[i] = (llm_forward_seq_lora){q->r->lora ? q->r->lora->fl : NULL, q->r->lora_scale};
        adapted |= q->r->lora != NULL;
        eng_hidden_rows(e, it, q, row, &n_hidden);
        eng_logit_rows(e, i, q, row, &n_logits);
        row += it->n;
        q->r->in_flight++;
        if (q->r->t_sched == 0)
            q->r->t_sched = now;
    }
    *bt = (llm_forward_batch){e->b_tokens, row, e->b_seqs, s->n_items, e->b_logit_rows, n_logits,
                              e->b_hidden_rows, n_hidden, adapted ? e->b_loras : NULL};
    e->n_copies = take_copies(e, KV_POOL_GLOBAL, 0);
    e->n_local_copies = take_copies(e, KV_POOL_LOCAL, e->n_copies);
    kv_cache_copies_done(e->kv);
}

/* On a device backend, when no sequence sampling this step needs a host
 * pass over its logits (penalties, logprobs), the device picks every token
 * and only ids come back. Fills e->b_params (the draws are taken only then:
 * a step that falls back leaves the generators untouched). */
static int all_on_device(llm_engine *e)
{
    if (!llm_forward_device_sample(e->fwd))
        return 0;
    for (int i = 0; i < e->s.n_items; i++) {
        const eng_seq *q = e->s.items[i].seq->user;
        if (q->ln || q->ns > 1 || (item_samples(e, i) && (!llm_sampler_device_ok(q->smp) || q->gm)))
            return 0; /* prompt logprobs, guesses (picked one row at a time, each draw only when its row is
                       * reached), a penalty, logprobs or a grammar's mask: the host samples this step */
    }
    for (int i = 0, k = 0; i < e->s.n_items; i++)
        if (item_samples(e, i))
            llm_sampler_device_params(((eng_seq *)e->s.items[i].seq->user)->smp, &e->b_params[k++]);
    return 1;
}

/* q's token for this step is id, checked: a NaN row or an id outside the
 * vocabulary (a device or kernel fault) fails q's request instead of
 * indexing past the embedding table or the vocabulary. */
static void seq_take(llm_engine *e, eng_seq *q, int32_t id)
{
    int n_vocab = e->m->hp.n_vocab;
    q->res.id = id;
    if (id == LLM_SAMPLE_NAN)
        llm_errf(&q->fail, LLM_ERR_NUMERIC, "the model produced a NaN logit: no token can be sampled");
    else if (id < 0 || id >= n_vocab)
        llm_errf(&q->fail, LLM_ERR_BACKEND, "sampled token id %d is outside the vocabulary [0, %d)", id, n_vocab);
    else
        llm_sampler_accept(q->smp, id);
}

static llm_status step_on_device(llm_engine *e, const llm_forward_batch *bt)
{
    const int32_t *ids;
    double t0 = eng_now_ms();
    llm_status st = llm_forward_eval_sample(e->fwd, bt, kv_cache_layers(e->kv), e->b_params, &ids);
    e->forward_ms = eng_now_ms() - t0;
    if (st)
        return st;
    for (int i = 0; i < e->s.n_items; i++) {
        eng_seq *q = e->s.items[i].seq->user;
        if (q->ls < 0)
            continue;
        q->res = (llm_sample_result){0};
        seq_take(e, q, ids[q->ls]);
    }
    return LLM_OK;
}

/* Tells q's grammar the tokens its output may still take: this pick and
 * those after it (gmatch.h: the output closes within them). Before every
 * mask or mask_cached, since picks move it. */
static void seq_grammar_budget(const llm_engine *e, const eng_seq *q)
{
    llm_gmatch_set_budget(q->gm, e->cfg.no_grammar_close ? -1 : q->r->max_gen - q->n_gen - q->n_out);
}

/* Whether q's next mask is cheap (llm_gmatch_mask_cached under its budget). */
static int seq_mask_cached(const llm_engine *e, const eng_seq *q)
{
    seq_grammar_budget(e, q);
    return llm_gmatch_mask_cached(q->gm);
}

/* q's pick from its logits row: within its grammar's mask, which then
 * advances by the pick (an end token leaves it as it is). The grammar's
 * work is counted against the round's budget. */
static llm_status sample_one(llm_engine *e, eng_seq *q, const float *row)
{
    if (!q->gm)
        return llm_sampler_sample(q->smp, row, &q->res, &q->fail);
    double t0 = eng_now_ms();
    seq_grammar_budget(e, q);
    llm_status st = llm_gmatch_mask(q->gm, e->b_mask, &q->fail);
    e->mask_work += llm_gmatch_work(q->gm);
    double t1 = eng_now_ms();
    if (!st)
        st = llm_sampler_sample_masked(q->smp, row, e->b_mask, &q->res, &q->fail);
    double t2 = eng_now_ms();
    if (!st) { /* an end token too: it is accepted only where the text is whole, whatever the mask said */
        st = llm_gmatch_accept(q->gm, q->res.id, &q->fail);
        e->mask_work += llm_gmatch_work(q->gm);
    }
    e->grammar_ms += t1 - t0 + eng_now_ms() - t2;
    return st;
}

/* Whether q's pick waits for a later round: the round's grammar work is
 * spent and q's mask would have to be walked. Then its row is kept
 * (`row` may be q->held itself) and the token comes from it later, as it
 * would have now: a mask depends only on the grammar's state, and the
 * sampler's draws only on its own sequence. So many costly grammars slow
 * their own sequences, not every other request's steps. Without memory
 * for the row, q is picked now. */
static int pick_held(llm_engine *e, eng_seq *q, const float *row)
{
    if (!q->gm || e->mask_work < e->cfg.mask_step_work || seq_mask_cached(e, q))
        return 0;
    size_t n = (size_t)e->m->hp.n_vocab;
    int fresh = !q->held;
    if (fresh) /* kept only while the hold lasts (hold_end) */
        q->held = malloc(sizeof(float) * n);
    if (!q->held)
        return 0;
    if (q->held != row)
        memcpy(q->held, row, sizeof(float) * n);
    if (fresh) {
        q->hold_no = ++e->hold_clock;
        e->n_holding++;
        e->new_holds++;
    }
    return 1;
}

/* q's prompt rows of this pass into its prompt_logprobs entries (a NaN
 * row fails q as a sampling failure would). */
static void prompt_entries(llm_engine *e, eng_seq *q, const float *logits)
{
    int n_vocab = e->m->hp.n_vocab;
    for (int j = 0; j < q->ln && !q->fail.code; j++) {
        int p = q->l_pos + j;
        const float *row = logits + (size_t)(q->l0 + j) * n_vocab;
        if (llm_prompt_logprob_of(row, n_vocab, q->tokens[p + 1], q->r->prompt_top, &q->plp[p], &q->fail) == LLM_OK)
            q->n_plp = p + 1;
    }
}

/* Pick j of a speculating q, from its row: made exactly as a step
 * without guesses would make it (mask, sampler, draw). Returns 1 when
 * row j + 1 may be picked too: this pick equals the guess after it and
 * ends nothing (no end of generation, the grammar not ended). A later row
 * whose mask the round's grammar budget cannot pay for is not picked (it
 * never holds); a first pick may be held, as any. */
static int spec_pick(llm_engine *e, eng_seq *q, int j, const float *row)
{
    const int32_t *guess = q->tokens + q->q.n_tokens;
    if (j == 0 ? pick_held(e, q, row)
               : q->gm && e->mask_work >= e->cfg.mask_step_work && !seq_mask_cached(e, q))
        return 0;
    if (sample_one(e, q, row))
        return 0;
    seq_take(e, q, q->res.id);
    if (q->fail.code) /* seq_take's checks failed it: as in a plain step, no event for that pick */
        return 0;
    q->res_at[q->n_out++] = q->res;
    return j + 1 < q->ns && q->res.id == guess[j] && !llm_vocab_is_eog(e->m->vocab, q->res.id) &&
           !(q->gm && llm_gmatch_finished(q->gm)); /* (only the last pick may end the text) */
}

/* The rest of a speculating q's picks, after its first went on (rows
 * from `row`, the first pick's); its item keeps K/V of its last token
 * and of each guess taken. */
static void spec_rest(llm_engine *e, sched_item *it, eng_seq *q, const float *row, int go)
{
    size_t n_vocab = (size_t)e->m->hp.n_vocab;
    for (int j = 1; go && j < q->ns; j++) go = spec_pick(e, q, j, row + (size_t)j * n_vocab);
    it->n_commit = q->n_out > 1 ? q->n_out : 1;
    /* guesses taken: each pick but the last equals its guess; the last
     * too when it ended the text (an end token, the grammar's end) */
    int last = q->n_out - 1;
    q->n_taken = last > 0 ? last : 0;
    q->n_taken += last >= 0 && last < q->ns - 1 && q->res_at[last].id == q->tokens[q->q.n_tokens + last];
}

static llm_status step_on_host(llm_engine *e, const llm_forward_batch *bt)
{
    const float *logits;
    double t0 = eng_now_ms();
    llm_status st = llm_forward_eval(e->fwd, bt, kv_cache_layers(e->kv), &logits);
    e->forward_ms = eng_now_ms() - t0;
    if (st)
        return st;
    int n_vocab = e->m->hp.n_vocab;
    for (int i = 0; i < e->s.n_items; i++) { /* every sequence's first pick before any guess's: guesses take
                                              * only the grammar budget the first picks leave */
        eng_seq *q = e->s.items[i].seq->user;
        prompt_entries(e, q, logits);
        q->spec_go = 0;
        if (q->ls < 0 || q->fail.code)
            continue;
        const float *row = logits + (size_t)q->ls * n_vocab;
        if (q->ns > 1)
            q->spec_go = spec_pick(e, q, 0, row);
        else if (!pick_held(e, q, row) && sample_one(e, q, row) == LLM_OK)
            seq_take(e, q, q->res.id);
    }
    for (int i = 0; i < e->s.n_items; i++) {
        eng_seq *q = e->s.items[i].seq->user;
        if (q->ns > 1 && q->ls >= 0)
            spec_rest(e, &e->s.items[i], q, logits + (size_t)q->ls * n_vocab, q->spec_go);
    }
    return LLM_OK;
}

/* After a pass: each embedding sequence's hidden rows into its pool, summed
 * in double (a mean's division cancels in the normalisation) or, for the
 * last position, copied. */
static void pool_rows(llm_engine *e)
{
    const float *h = llm_forward_hidden(e->fwd);
    int d = e->m->hp.n_embd;
    for (int i = 0; h && i < e->s.n_items; i++) {
        eng_seq *q = e->s.items[i].seq->user;
        for (int j = 0; j < q->hn; j++) {
            const float *row = h + (size_t)(q->h0 + j) * d;
            for (int k = 0; k < d; k++) q->pool[k] = q->r->pooling == LLM_POOL_LAST ? row[k] : q->pool[k] + row[k];
        }
        q->n_pooled += q->hn;
    }
}

/* Without the lock: copies, the forward pass, sampling and pooling
 * (samplers, pools and the plan's items are only touched by this thread).
 * A sequence whose sampling fails keeps the error in q->fail; the others
 * go on. */
static llm_status step_run(llm_engine *e, const llm_forward_batch *bt)
{
    e->forward_ms = 0;
    for (int i = 0; i < e->s.n_items; i++) ((eng_seq *)e->s.items[i].seq->user)->fail.code = LLM_OK;
    const llm_kv_layer *kv = kv_cache_layers(e->kv);
    int local = kv_cache_window(e->kv) > 0;
    if (e->n_copies > 0)
        llm_forward_kv_copy(e->fwd, kv, local ? LLM_KV_COPY_GLOBAL : LLM_KV_COPY_ALL, e->cp_src, e->cp_dst, e->n_copies);
    if (e->n_local_copies > 0)
        llm_forward_kv_copy(e->fwd, kv, LLM_KV_COPY_LOCAL, e->cp_src + e->n_copies, e->cp_dst + e->n_copies,
                            e->n_local_copies);
    llm_status st = all_on_device(e) ? step_on_device(e, bt) : step_on_host(e, bt);
    if (!st && bt->n_hidden > 0)
        pool_rows(e);
    return st;
}

static void usage_of(const eng_seq *q, double now, llm_usage *u)
{
    const eng_req *r = q->r;
    *u = (llm_usage){q->q.n_prompt, q->n_gen, q->q.cached_tokens, q->q.n_preempted, r->t_sched - r->t_submit,
                     q->t_first - r->t_submit, now - r->t_submit};
}

/* A request that cannot go on: ERROR (why) for its reader, sequences
 * dropped. */
static void req_fail(llm_engine *e, eng_req *r, const llm_error *why)
{
    if (r->failed || r->cancelled)
        return;
    r->failed = 1;
    llm_errf(&r->error, why->code, "engine: %s", why->msg);
    eng_req_drop_seqs(e, r);
    pthread_cond_broadcast(&r->cond);
}

static void req_fail_nomem(llm_engine *e, eng_req *r, const char *what)
{
    llm_error why;
    llm_errf(&why, LLM_ERR_NOMEM, "no memory for %s", what);
    req_fail(e, r, &why);
}

/* Under the lock: q is over and its blocks go back; ev, its DONE (usage
 * filled in here), is queued when it was built whole (ok), else the request
 * fails for want of memory for what. */
static void seq_done(llm_engine *e, eng_seq *q, llm_event *ev, int ok, const char *what)
{
    usage_of(q, eng_now_ms(), &ev->usage);
    q->finished = 1;
    sched_remove(&e->s, &q->q);
    eng_draft_release(e->draft, q);
    if (!ok) {
        llm_event_clear(ev);
        req_fail_nomem(e, q->r, what);
        return;
    }
    eng_req_push(q->r, ev);
    if (!q->r->failed && ++q->r->n_done == q->r->n) /* a DONE that could not be queued failed the request */
        e->st.requests_done++;
}

/* The completion is over: DONE (with any text held back, unless a stop
 * string ended it), blocks released. */
static void seq_finish(llm_engine *e, eng_seq *q, llm_finish why)
{
    llm_event ev = {.type = LLM_EVENT_DONE, .index = q->index, .finish = why};
    const char *t;
    size_t n;
    textout_flush(&q->out, &t, &n);
    if (q->plp && q->n_plp != q->q.n_prompt - 1) {
        llm_error bug;
        llm_errf(&bug, LLM_ERR_INTERNAL, "prompt logprobs of %d of %d positions", q->n_plp, q->q.n_prompt - 1);
        req_fail(e, q->r, &bug);
        return;
    }
    ev.prompt_lp = q->plp, ev.n_prompt_lp = q->plp ? q->n_plp : 0;
    q->plp = NULL; /* the event's now */
    ev.text = llm_utf8_dup_valid(t, n, &ev.text_len);
    seq_done(e, q, &ev, ev.text != NULL, "the generated text"); /* the held-back text would be lost: no DONE without it */
}

/* Under the lock: an embedding request's prompt is through: DONE with its
 * pool at unit length (an all-zero one stays zero). */
static void embed_finish(llm_engine *e, eng_seq *q)
{
    int d = e->m->hp.n_embd;
    llm_event ev = {.type = LLM_EVENT_DONE, .index = q->index, .finish = LLM_FINISH_STOP, .n_embedding = d};
    double ss = 0;
    for (int k = 0; k < d; k++) ss += q->pool[k] * q->pool[k];
    llm_error why = {0};
    if (q->r->pooling == LLM_POOL_MEAN ? q->n_pooled != q->q.n_prompt : q->n_pooled < 1)
        llm_errf(&why, LLM_ERR_INTERNAL, "pooled %d of %d positions", q->n_pooled, q->q.n_prompt);
    else if (!(ss == ss) || ss > 1e300)
        llm_errf(&why, LLM_ERR_NUMERIC, "the model produced a NaN or infinite hidden state");
    if (why.code) {
        req_fail(e, q->r, &why);
        return;
    }
    double scale = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    ev.embedding = malloc(sizeof(float) * (size_t)d);
    ev.text = calloc(1, 1);
    for (int k = 0; ev.embedding && k < d; k++) ev.embedding[k] = (float)(q->pool[k] * scale);
    q->t_first = eng_now_ms(); /* its one answer is its first */
    seq_done(e, q, &ev, ev.embedding && ev.text, "an embedding");
}

/* Text of one token: a piece through the stop/UTF-8 filter. Returns the
 * textout status (1: a stop string matched). */
static int token_text(const llm_engine *e, eng_seq *q, int32_t tok, llm_event *ev)
{
    char small[256], *buf = small;
    int special = 0;
    for (int i = 0; i < q->r->n_shown; i++) special |= q->r->shown[i] == tok;
    int n = llm_token_to_piece(e->m->vocab, tok, special, small, sizeof small);
    if (n > (int)sizeof small && (buf = malloc((size_t)n)))
        llm_token_to_piece(e->m->vocab, tok, special, buf, (size_t)n);
    if (!buf)
        return -1; /* no memory for a long piece: the request fails rather than lose text */
    const char *out;
    size_t len;
    int rc = textout_push(&q->out, buf, n > 0 ? (size_t)n : 0, &out, &len);
    if (buf != small)
        free(buf);
    ev->text = llm_utf8_dup_valid(out, len, &ev->text_len);
    return ev->text ? rc : -1;
}

/* Under the lock: the token sampled for q becomes events. last: q's
 * grammar is in the state this token left (a speculating step's earlier
 * picks see the state after its last). */
static void seq_emit(llm_engine *e, eng_seq *q, int last)
{
    int32_t tok = q->res.id;
    eng_req *r = q->r;
    if (q->n_gen++ == 0)
        q->t_first = eng_now_ms();
    e->st.generated_tokens++;
    if ((!r->ignore_eos || q->gm) && llm_vocab_is_eog(e->m->vocab, tok)) {
        seq_finish(e, q, LLM_FINISH_STOP);
        return;
    }
    q->tokens[q->q.n_tokens++] = tok;
    llm_event ev = {.type = LLM_EVENT_TOKEN, .index = q->index, .token = tok, .sample = q->res};
    int stop = token_text(e, q, tok, &ev);
    if (stop < 0) { /* no event with its text missing */
        llm_event_clear(&ev);
        req_fail_nomem(e, r, "the generated text");
        return;
    }
    eng_req_push(r, &ev);
    if (stop || (last && q->gm && llm_gmatch_finished(q->gm))) { /* a grammar nothing can extend ends the text */
        seq_finish(e, q, LLM_FINISH_STOP);
    } else if (q->n_gen == r->max_gen) {
        seq_finish(e, q, LLM_FINISH_LENGTH);
    }
}

/* Under the lock: a speculating step's picks become events in order,
 * until one ends the completion; then its request's failure, if the
 * pick after them failed. */
static void spec_emit(llm_engine *e, eng_seq *q)
{
    for (int j = 0; j < q->n_out && !q->finished && !q->r->failed; j++) {
        q->res = q->res_at[j];
        seq_emit(e, q, j == q->n_out - 1);
    }
    if (q->fail.code && !q->finished)
        req_fail(e, q->r, &q->fail);
}

/* Under the lock: q's pick (or pooled state) this round becomes its
 * events, or its request's failure. */
static void seq_result(llm_engine *e, eng_seq *q)
{
    if (q->r->cancelled || q->r->failed || q->finished)
        return;
    if (q->ns > 1)
        spec_emit(e, q);
    else if (q->fail.code)
        req_fail(e, q->r, &q->fail);
    else if (q->r->pooling)
        embed_finish(e, q);
    else
        seq_emit(e, q, 1);
}

/* Under the lock: r has one sequence fewer in the round; once none is,
 * a request failed or cancelled meanwhile drops its sequences (before
 * the next plan can pick them again). */
static void req_leave(llm_engine *e, eng_req *r)
{
    if (--r->in_flight == 0 && (r->failed || r->cancelled))
        eng_req_drop_seqs(e, r);
}

/* Under the lock again: commit, events, stats; wake cancel waiters. */
static void step_finish(llm_engine *e, llm_status st, int n_rows)
{
    sched *s = &e->s;
    if (st) {
        llm_error why;
        llm_errf(&why, st, "forward pass failed: %s", llm_status_str(st));
        for (int i = 0; i < s->n_items; i++) req_fail(e, ((eng_seq *)s->items[i].seq->user)->r, &why);
        for (int i = 0; i < s->n_items; i++) ((eng_seq *)s->items[i].seq->user)->r->in_flight--;
        sched_abort(s);
    } else {
        sched_commit(s);
        for (int i = 0; i < s->n_items; i++) {
            eng_seq *q = s->items[i].seq->user;
            if (q->plp && q->n_plp == q->q.n_prompt - 1) /* its entries are whole: a recomputation after a
                                                            * preemption needs K/V alone, cache hits too */
                q->q.all_logits = q->q.no_reuse = 0;
            if (s->items[i].n_draft > 0 && q->n_out > 0) /* (a held or failed first pick checked nothing) */
                eng_spec_account(e, q, s->items[i].n_draft, q->n_taken);
            if ((s->items[i].logits && !q->held) || q->fail.code) /* a held pick comes in a later round; a prompt
                                                                     * row's failure fails it now */
                seq_result(e, q);
            q->ns = 1; /* (a held pick made in a later round is a plain one) */
        }
        for (int i = 0; i < s->n_items; i++) req_leave(e, ((eng_seq *)s->items[i].seq->user)->r);
        e->st.steps++;
        e->st.step_ms += eng_now_ms() - e->step_t0;
        e->st.forward_ms += e->forward_ms;
        e->st.computed_tokens += (uint64_t)n_rows;
        int b = 0;
        while (b < LLM_BATCH_BUCKETS - 1 && n_rows > LLM_BATCH_BUCKET(b)) b++;
        e->st.batch_hist[b]++;
    }
    e->gen_t[e->gen_i] = eng_now_ms();
    e->gen_n[e->gen_i] = e->st.generated_tokens;
    e->gen_i = (e->gen_i + 1) % GEN_WINDOW;
    e->step_t0 = 0;
    pthread_cond_broadcast(&e->step_done);
}

/* Under the lock, between steps (no plan holds them): requests with a
 * sequence the scheduler marked oom fail with LLM_ERR_NOMEM rather than
 * wait for a deadline. */
static void fail_oom(llm_engine *e)
{
    if (e->s.stats.oom == e->oom_seen)
        return;
    e->oom_seen = e->s.stats.oom;
    for (int i = 0; i < e->s.n_waiting; i++) {
        eng_seq *q = e->s.waiting[i]->user;
        if (e->s.waiting[i]->oom && !q->r->failed && !q->r->cancelled) {
            req_fail_nomem(e, q->r, "a sequence's block table");
            i = -1; /* its sequences left the list: rescan */
        }
    }
}

/* q's hold is over: its row goes. */
static void hold_end(eng_seq *q)
{
    free(q->held);
    q->held = NULL;
}

/* Adds q to the round's held picks (b_held, oldest first, at most
 * max_seqs: a newer one past them waits for a later round). */
static void held_add(llm_engine *e, eng_seq *q)
{
    int j = e->n_held;
    if (j == e->cfg.max_seqs && e->b_held[j - 1]->hold_no < q->hold_no)
        return;
    if (j < e->cfg.max_seqs)
        e->n_held++;
    else
        j--;
    for (; j > 0 && e->b_held[j - 1]->hold_no > q->hold_no; j--) e->b_held[j] = e->b_held[j - 1];
    e->b_held[j] = q;
}

/* Under the lock, after the plan: the held picks this round makes. One
 * whose sequence is in the plan gets fresh logits there instead (the same
 * row: outputs do not depend on the batch); one whose request is over is
 * let go. Their requests are marked in flight so cancel waits for them. */
static void picks_prepare(llm_engine *e)
{
    e->n_held = 0;
    if (e->n_holding == 0)
        return;
    e->n_holding = 0;
    for (eng_req *r = e->reqs; r; r = r->next)
        for (int i = 0; i < r->n; i++) {
            eng_seq *q = &r->seqs[i];
            if (q->held && (q->q.in_plan || r->cancelled || r->failed || q->finished))
                hold_end(q);
            if (q->held) {
                e->n_holding++;
                held_add(e, q);
            }
        }
    for (int i = 0; i < e->n_held; i++) e->b_held[i]->r->in_flight++;
}

/* Without the lock: the held picks, oldest first; the first is always
 * made (every round makes progress), the others while the budget lasts. */
static void picks_run(llm_engine *e)
{
    e->mask_work = 0;
    for (int i = 0; i < e->n_held; i++) {
        eng_seq *q = e->b_held[i];
        q->fail.code = LLM_OK;
        q->picked = 0;
        if (i > 0 && pick_held(e, q, q->held))
            continue;
        q->picked = 1;
        e->n_holding--;
        if (sample_one(e, q, q->held) == LLM_OK)
            seq_take(e, q, q->res.id);
        hold_end(q);
    }
}

/* Under the lock: the picks made become events, as a step's do. */
static void picks_finish(llm_engine *e)
{
    for (int i = 0; i < e->n_held; i++)
        if (e->b_held[i]->picked)
            seq_result(e, e->b_held[i]);
    for (int i = 0; i < e->n_held; i++) req_leave(e, e->b_held[i]->r);
    e->n_held = 0;
    e->st.held_picks += e->new_holds;
    e->new_holds = 0;
    e->st.grammar_ms += e->grammar_ms;
    e->grammar_ms = 0;
}

/* Marks every planned sequence's request in flight (by = 1) or takes
 * the marks back (-1; a request cancelled meanwhile is dropped by the
 * step, which marks it again before the lock goes). */
static void plan_hold(llm_engine *e, int by)
{
    for (int i = 0; i < e->s.n_items; i++) ((eng_seq *)e->s.items[i].seq->user)->r->in_flight += by;
}

/* Under the lock, after the plan: this step's guesses, n-gram or the
 * caller's, or the draft model's, whose passes run without the lock: it
 * is let go and taken again here, every planned request marked in flight
 * meanwhile so that a cancel waits (the plan points at its sequences).
 * Returns whether any sequence guessed. */
static int guesses(llm_engine *e)
{
    if (!e->draft)
        return eng_spec_propose(e);
    if (!eng_draft_begin(e))
        return 0;
    plan_hold(e, 1);
    double t0 = eng_now_ms();
    e->step_t0 = t0; /* (busy: liveness sees a pass that hangs) */
    pthread_mutex_unlock(&e->w.mu);
    llm_status st = eng_draft_run(e);
    double ms = eng_now_ms() - t0;
    pthread_mutex_lock(&e->w.mu);
    plan_hold(e, -1);
    e->st.spec_draft_ms += ms;
    e->st.spec_draft_failures += st != LLM_OK;
    return eng_draft_end(e, st);
}

/* One round: the plan's step and the picks held from earlier rounds
 * (made first: they have waited). */
void *eng_step_main(void *arg)
{
    llm_engine *e = arg;
    (void)pthread_setname_np(pthread_self(), "llm-engine"); /* bench-load's CPU split by thread; a name is only a label */
    pthread_mutex_lock(&e->w.mu);
    while (!e->w.stop) {
        fail_oom(e);
        eng_lora_service(e);
        int planned = sched_plan(&e->s) > 0;
        if (planned && eng_spec_step_guesses(e) && guesses(e))
            sched_plan_drafts(&e->s);
        picks_prepare(e);
        if (!planned && e->n_held == 0) {
            if (e->s.stats.oom == e->oom_seen) /* else: fail those first */
                pthread_cond_wait(&e->w.cv, &e->w.mu);
            continue;
        }
        llm_forward_batch bt = {0};
        if (planned)
            step_prepare(e, &bt);
        else
            e->step_t0 = eng_now_ms(); /* a round of held picks alone: busy all the same (liveness) */
        pthread_mutex_unlock(&e->w.mu);
        picks_run(e);
        llm_status st = planned ? step_run(e, &bt) : LLM_OK;
        pthread_mutex_lock(&e->w.mu);
        if (planned) /* the plan is committed first: a held pick that fails drops its request's sequences, which
                      * may be in the plan (a sibling, n > 1) */
            step_finish(e, st, bt.n_rows);
        else
            e->st.step_ms += eng_now_ms() - e->step_t0;
        picks_finish(e);
        e->step_t0 = 0;
        pthread_cond_broadcast(&e->step_done);
    }
    pthread_cond_broadcast(&e->step_done); /* an adapter's add or remove waiting on this thread sees the stop */
    pthread_mutex_unlock(&e->w.mu);
    return NULL;
}
