/* engine.c - the serving engine (engine.h), the caller's side: request
 * validation and queues, reading events, cancel and stats, open and
 * close. The step loop on the engine thread is engine_step.c; the state
 * both share is engine_impl.h. See docs/internals/scheduler.md. */
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

double eng_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- requests ------------------------------------------------------------- */

static void req_free(llm_engine *e, eng_req *r)
{
    if (!r)
        return;
    for (int i = 0; r->seqs && i < r->n; i++) {
        eng_draft_release(e->draft, &r->seqs[i]);
        free(r->seqs[i].tokens);
        llm_sampler_free(r->seqs[i].smp);
        llm_gmatch_free(r->seqs[i].gm);
        textout_free(&r->seqs[i].out);
        free(r->seqs[i].pool);
        free(r->seqs[i].held);
        free(r->seqs[i].plp);
        free(r->seqs[i].res_at);
    }
    free(r->seqs);
    if (r->slot)
        atomic_fetch_sub(&r->slot->refs, 1);
    else
        llm_grammar_free(r->grammar);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    free(r->stops);
    for (ev_node *n = r->head, *nx; n; n = nx) {
        nx = n->next;
        llm_event_clear(&n->ev);
        free(n);
    }
    pthread_cond_destroy(&r->cond);
    free(r);
}

void llm_event_clear(llm_event *ev)
{
    if (!ev)
        return;
    free(ev->text);
    free(ev->embedding);
    free(ev->prompt_lp);
    ev->text = NULL;
    ev->text_len = 0;
    ev->embedding = NULL;
    ev->n_embedding = 0;
    ev->prompt_lp = NULL;
    ev->n_prompt_lp = 0;
}

static eng_req *req_find(llm_engine *e, llm_request_id id)
{
    for (eng_req *r = e->reqs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

static void req_unlink(llm_engine *e, eng_req *r)
{
    for (eng_req **p = &e->reqs; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            e->n_reqs--;
            break;
        }
    eng_lora_drop(e, r);
}

/* Takes every sequence of r out of the scheduler (blocks freed). */
void eng_req_drop_seqs(llm_engine *e, eng_req *r)
{
    for (int i = 0; i < r->n; i++) {
        if (r->seqs[i].q.state != SCHED_DONE && r->seqs[i].q.state != SCHED_NEW)
            sched_remove(&e->s, &r->seqs[i].q);
        eng_draft_release(e->draft, &r->seqs[i]);
    }
}

/* Queues an event; on allocation failure the request fails instead, and
 * once it has failed nothing more is queued: the reader gets the events
 * before the loss, then the ERROR, never a DONE with a token missing. */
void eng_req_push(eng_req *r, const llm_event *ev)
{
    ev_node *n = r->failed ? NULL : malloc(sizeof *n);
    if (!n) {
        llm_event tmp = *ev;
        llm_event_clear(&tmp);
        if (!r->failed)
            llm_errf(&r->error, LLM_ERR_NOMEM, "engine: no memory for an event");
        r->failed = 1;
    } else {
        n->ev = *ev;
        n->next = NULL;
        if (r->tail) r->tail->next = n; else r->head = n;
        r->tail = n;
    }
    pthread_cond_signal(&r->cond);
}

/* ---- submit ----------------------------------------------------------------- */

static llm_status check_fields(const llm_engine *e, const llm_request *rq, llm_error *err)
{
    llm_status st = llm_sampling_check(&rq->sampling, err);
    if (st)
        return st;
    if (rq->n < 0 || rq->n > LLM_MAX_N)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "n %d not in [1, %d]", rq->n, LLM_MAX_N);
    if (rq->max_tokens < 0)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "max_tokens %d is negative", rq->max_tokens);
    if (rq->n_stop < 0 || rq->n_stop > LLM_MAX_STOPS || (rq->n_stop && !rq->stop))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%d stop strings (at most %d)", rq->n_stop, LLM_MAX_STOPS);
    for (int i = 0; i < rq->n_stop; i++) {
        size_t n = rq->stop[i] ? strlen(rq->stop[i]) : 0;
        if (n == 0 || n > LLM_MAX_STOP_LEN)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "stop string %d has %zu bytes (1 to %d)", i, n, LLM_MAX_STOP_LEN);
    }
    if (!rq->tokens && !rq->text)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "request has neither prompt tokens nor text");
    if (rq->pooling != LLM_POOL_NONE && rq->pooling != LLM_POOL_MEAN && rq->pooling != LLM_POOL_LAST)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "pooling %d is not one of none, mean, last", (int)rq->pooling);
    if (rq->pooling && rq->n > 1)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "an embedding request has one sequence, not n %d", rq->n);
    if (rq->pooling && rq->grammar)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "an embedding request generates nothing: no grammar applies");
    if (rq->prompt_logprobs && rq->pooling)
        return llm_errf_at(err, LLM_ERR_INVALID_ARG, "prompt_logprobs", "an embedding request has no prompt logprobs");
    if (rq->prompt_logprobs && e->cfg.prompt_logit_rows < 0)
        return llm_errf_at(err, LLM_ERR_UNSUPPORTED, "prompt_logprobs", "prompt logprobs are off here (no logit rows "
                           "are given to them: prompt_logit_rows)");
    if (rq->prompt_logprobs && (rq->prompt_top < 0 || rq->prompt_top > LLM_MAX_LOGPROBS))
        return llm_errf_at(err, LLM_ERR_INVALID_ARG, "prompt_logprobs", "prompt_logprobs %d not in [0, %d]",
                           rq->prompt_top, LLM_MAX_LOGPROBS);
    if (rq->lora && !(fabsf(rq->lora_scale) <= 1000.0f))
        return llm_errf_at(err, LLM_ERR_INVALID_ARG, "lora_scale", "adapter scale %g is not a number in [-1000, 1000]",
                           (double)rq->lora_scale);
    if (rq->n_shown < 0 || rq->n_shown > LLM_MAX_SHOWN)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%d shown control tokens (at most %d)", rq->n_shown, LLM_MAX_SHOWN);
    for (int i = 0; i < rq->n_shown; i++)
        if (rq->shown[i] < 0 || rq->shown[i] >= e->m->hp.n_vocab)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "shown token %d is outside the vocabulary", rq->shown[i]);
    return LLM_OK;
}

/* The prompt as ids (malloc'd): copied and checked, or tokenized. */
static llm_status prompt_ids(const llm_engine *e, const llm_request *rq, int32_t **ids, int *n, llm_error *err)
{
    int n_vocab = e->m->hp.n_vocab;
    if (!rq->tokens) {
        size_t len = strlen(rq->text), least = llm_vocab_min_tokens(e->m->vocab, len);
        if (least > (size_t)e->cfg.n_ctx) /* refused before the tokenizer spends time on it */
            return llm_errf(err, LLM_ERR_TOO_LONG, "a prompt of %zu bytes is at least %zu tokens; the context holds %d",
                            len, least, e->cfg.n_ctx);
        return llm_tokenize(e->m->vocab, rq->text, len, 1, 1, ids, n, err);
    }
    if (rq->n_tokens < 1)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "prompt has %d tokens", rq->n_tokens);
    for (int i = 0; i < rq->n_tokens; i++)
        if (rq->tokens[i] < 0 || rq->tokens[i] >= n_vocab)
            return llm_errf(err, LLM_ERR_INVALID_ARG, "prompt token %d at index %d not in [0, %d)", rq->tokens[i], i, n_vocab);
    if (!(*ids = malloc(sizeof(int32_t) * (size_t)rq->n_tokens)))
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for the prompt");
    memcpy(*ids, rq->tokens, sizeof(int32_t) * (size_t)rq->n_tokens);
    *n = rq->n_tokens;
    return LLM_OK;
}

/* How many tokens each completion may generate (an embedding request:
 * none, and its prompt may fill the context); errors when the prompt or
 * one sequence's blocks do not fit. */
static llm_status gen_limit(const llm_engine *e, const llm_request *rq, int n_prompt, int *max_gen, llm_error *err)
{
    int n_ctx = e->cfg.n_ctx, bs = kv_cache_block_size(e->kv);
    if (n_prompt < 1)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "the prompt is empty");
    if (rq->pooling && n_prompt > n_ctx)
        return llm_errf(err, LLM_ERR_TOO_LONG, "input of %d tokens does not fit the context of %d", n_prompt, n_ctx);
    if (!rq->pooling && n_prompt >= n_ctx)
        return llm_errf(err, LLM_ERR_TOO_LONG, "prompt of %d tokens does not fit the context of %d (one token must be left to generate)",
                        n_prompt, n_ctx);
    *max_gen = rq->pooling ? 0 : rq->max_tokens ? rq->max_tokens : n_ctx - n_prompt;
    if (n_prompt + *max_gen > n_ctx)
        return llm_errf(err, LLM_ERR_TOO_LONG, "prompt of %d tokens plus max_tokens %d exceeds the context of %d", n_prompt,
                        *max_gen, n_ctx);
    int need = (n_prompt + *max_gen + bs - 1) / bs;
    if (need > kv_cache_n_blocks(e->kv))
        return llm_errf(err, LLM_ERR_KV_FULL, "one sequence of %d tokens needs %d KV blocks; the pool has %d",
                        n_prompt + *max_gen, need, kv_cache_n_blocks(e->kv));
    return LLM_OK;
}

static uint64_t grammar_hash(const char *text, size_t len, const char *root)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)text[i]) * 0x100000001b3ull;
    for (const char *c = root; *c; c++) h = (h ^ (unsigned char)*c) * 0x100000001b3ull;
    return h;
}

/* Under gv_mu: the slot holding this exact text and root (taken), or NULL. */
static eng_grammar *grammar_find(llm_engine *e, const char *text, size_t len, const char *root, uint64_t h)
{
    for (int i = 0; i < ENG_GRAMMARS; i++) {
        eng_grammar *x = &e->grammars[i];
        if (x->g && x->hash == h && x->len == len && !memcmp(x->text, text, len) && !strcmp(x->text + len + 1, root)) {
            atomic_fetch_add(&x->refs, 1);
            x->used = ++e->grammar_clock;
            return x;
        }
    }
    return NULL;
}

/* Under gv_mu: g kept in a free slot or the least recently used idle one
 * (taken), or NULL when every slot is in use or memory ran out (the
 * request then owns g). */
static eng_grammar *grammar_keep(llm_engine *e, const char *text, size_t len, const char *root, uint64_t h, llm_grammar *g)
{
    eng_grammar *best = NULL;
    for (int i = 0; i < ENG_GRAMMARS; i++) {
        eng_grammar *x = &e->grammars[i];
        if (!x->g) {
            best = x;
            break;
        }
        if (atomic_load(&x->refs) == 0 && (!best || x->used < best->used))
            best = x;
    }
    char *copy = best ? malloc(len + strlen(root) + 2) : NULL;
    if (!copy)
        return NULL;
    memcpy(copy, text, len);
    copy[len] = 0;
    memcpy(copy + len + 1, root, strlen(root) + 1);
    llm_grammar_free(best->g);
    free(best->text);
    best->text = copy, best->len = len, best->hash = h, best->g = g, best->used = ++e->grammar_clock;
    atomic_store(&best->refs, 1);
    return best;
}

/* The request's grammar: a compiled one that another request sent the same
 * text for, or compiled here (on the submitting thread: the engine's steps
 * never wait for it); and the vocabulary index built once for all requests. */
static llm_status grammar_prepare(llm_engine *e, const llm_request *rq, eng_req *r, llm_error *err)
{
    const char *root = rq->grammar_root ? rq->grammar_root : "";
    int share = rq->grammar_len <= ENG_GRAMMAR_SHARE_MAX;
    uint64_t h = grammar_hash(rq->grammar, rq->grammar_len, root);
    llm_status st = LLM_OK;
    pthread_mutex_lock(&e->gv_mu);
    r->slot = share ? grammar_find(e, rq->grammar, rq->grammar_len, root, h) : NULL;
    pthread_mutex_unlock(&e->gv_mu);
    if (r->slot) {
        r->grammar = r->slot->g;
    } else {
        st = llm_grammar_compile(rq->grammar, rq->grammar_len, rq->grammar_root, &r->grammar, err);
        pthread_mutex_lock(&e->gv_mu);
        if (!st && share && !(r->slot = grammar_find(e, rq->grammar, rq->grammar_len, root, h)))
            r->slot = grammar_keep(e, rq->grammar, rq->grammar_len, root, h, r->grammar);
        else if (!st && r->slot) /* another request compiled it meanwhile */
            llm_grammar_free(r->grammar);
        if (r->slot)
            r->grammar = r->slot->g;
        pthread_mutex_unlock(&e->gv_mu);
    }
    pthread_mutex_lock(&e->gv_mu);
    if (!st && !e->gv) { /* each piece once: a failed attempt leaves what it made for the next one */
        int n_words = (e->m->hp.n_vocab + 31) / 32;
        if (!e->b_mask)
            e->b_mask = malloc(sizeof(uint32_t) * (size_t)n_words);
        if (!e->gcache)
            e->gcache = llm_gmatch_cache_new(e->m->hp.n_vocab, ENG_GRAMMAR_CACHE_BYTES);
        st = e->b_mask && e->gcache ? llm_gmatch_vocab_new(e->m->vocab, &e->gv, err)
                                    : llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for token masks");
    }
    pthread_mutex_unlock(&e->gv_mu);
    return st;
}

static llm_status seq_init(llm_engine *e, eng_req *r, int i, const llm_request *rq, const int32_t *prompt, int n_prompt,
                           llm_error *err)
{
    eng_seq *s = &r->seqs[i];
    s->r = r;
    s->index = i;
    if (!(s->tokens = malloc(sizeof(int32_t) * (size_t)(n_prompt + r->max_gen))))
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for a sequence");
    memcpy(s->tokens, prompt, sizeof(int32_t) * (size_t)n_prompt);
    llm_sampling sp = rq->sampling;
    sp.seed += (uint64_t)i;
    llm_status st = llm_sampler_new(&sp, e->m->hp.n_vocab, &s->smp, err);
    if (st)
        return st;
    for (int k = 0; k < n_prompt; k++) llm_sampler_accept(s->smp, prompt[k]);
    if (r->grammar && (st = llm_gmatch_new(r->grammar, e->gv, e->gcache, rq->cache_salt, &s->gm, err)))
        return st;
    if (r->pooling && !(s->pool = calloc((size_t)e->m->hp.n_embd, sizeof *s->pool)))
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for an embedding");
    int plp = rq->prompt_logprobs && i == 0; /* the siblings share its prompt K/V */
    if (plp && n_prompt > 1 && !(s->plp = calloc((size_t)n_prompt - 1, sizeof *s->plp)))
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for %d prompt logprobs", n_prompt - 1);
    int guesses = e->cfg.speculative != LLM_SPEC_OFF && !rq->no_speculate && !r->pooling && !plp;
    if (guesses && !(s->res_at = malloc(sizeof *s->res_at * (size_t)(e->cfg.spec_tokens + 1))))
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for a sequence's guessed picks");
    s->spec_k = e->cfg.spec_tokens / 2 > 1 ? e->cfg.spec_tokens / 2 : 1;
    kv_seq_init(&s->dkv);
    s->dkv.salt = rq->cache_salt; /* a tenant's draft prefixes are its own too */
    s->ns = 1;
    textout_init(&s->out, (const char *const *)r->stops, r->n_stops);
    s->q = (sched_seq){.tokens = s->tokens, .n_tokens = n_prompt, .n_prompt = n_prompt, .priority = rq->priority,
                       .arrival_ms = (int64_t)r->t_submit, .fork_of = i ? &r->seqs[0].q : NULL,
                       .salt = rq->cache_salt, .no_reuse = r->pooling == LLM_POOL_MEAN || plp,
                       .all_logits = plp, .user = s};
    return LLM_OK;
}

static llm_status req_new(llm_engine *e, const llm_request *rq, const int32_t *prompt, int n_prompt, int max_gen,
                          eng_req **out, llm_error *err)
{
    eng_req *r = calloc(1, sizeof *r);
    if (!r)
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for a request");
    if (llm_sync_cond_init(&r->cond)) { /* a reader's timeout must not move with the time of day */
        free(r);
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no condition variable for a request");
    }
    r->n = rq->n ? rq->n : 1;
    r->max_gen = max_gen;
    r->ignore_eos = rq->ignore_eos;
    memcpy(r->shown, rq->shown, sizeof r->shown);
    r->n_shown = rq->n_shown;
    r->pooling = rq->pooling;
    r->prompt_top = rq->prompt_logprobs ? rq->prompt_top : 0;
    r->lora_scale = rq->lora_scale;
    r->t_submit = eng_now_ms();
    r->seqs = calloc((size_t)r->n, sizeof *r->seqs);
    r->stops = calloc((size_t)rq->n_stop + 1, sizeof *r->stops);
    llm_status st = r->seqs && r->stops ? LLM_OK : llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for a request");
    for (int i = 0; !st && i < rq->n_stop; i++, r->n_stops++)
        if (!(r->stops[i] = strdup(rq->stop[i])))
            st = llm_errf(err, LLM_ERR_NOMEM, "engine: no memory for a stop string");
    if (!st && rq->grammar)
        st = grammar_prepare(e, rq, r, err);
    for (int i = 0; !st && i < r->n; i++) st = seq_init(e, r, i, rq, prompt, n_prompt, err);
    if (st) {
        req_free(e, r);
        return st;
    }
    *out = r;
    return LLM_OK;
}

/* Under the lock: queue r's sequences (with its adapter's ref and salt),
 * or fail when the queue is full or the adapter is gone. */
static llm_status req_enqueue(llm_engine *e, eng_req *r, const llm_request *rq, llm_error *err)
{
    if (e->w.stop)
        return llm_errf(err, LLM_ERR_SHUTDOWN, "engine: shutting down");
    if (e->s.n_waiting + r->n > e->cfg.max_waiting)
        return llm_errf(err, LLM_ERR_QUEUE_FULL, "engine: %d sequences waiting, the limit is %d; retry later",
                        e->s.n_waiting, e->cfg.max_waiting);
    llm_status st = rq->lora ? eng_lora_take(e, r, rq->lora, rq->cache_salt, err) : LLM_OK;
    if (st)
        return st;
    for (int i = 0; i < r->n; i++)
        if (sched_add(&e->s, &r->seqs[i].q)) {
            eng_req_drop_seqs(e, r);
            eng_lora_drop(e, r);
            return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory to queue a request");
        }
    r->id = ++e->next_id;
    r->next = e->reqs;
    e->reqs = r;
    e->n_reqs++;
    pthread_cond_signal(&e->w.cv);
    return LLM_OK;
}

llm_status llm_engine_submit(llm_engine *e, const llm_request *rq, llm_request_id *id, llm_error *err)
{
    int32_t *prompt = NULL;
    int n_prompt = 0, max_gen = 0;
    eng_req *r = NULL;
    llm_status st = check_fields(e, rq, err);
    if (!st)
        st = prompt_ids(e, rq, &prompt, &n_prompt, err);
    if (!st)
        st = gen_limit(e, rq, n_prompt, &max_gen, err);
    if (!st)
        st = req_new(e, rq, prompt, n_prompt, max_gen, &r, err);
    free(prompt);
    if (st)
        return st;
    pthread_mutex_lock(&e->w.mu);
    st = req_enqueue(e, r, rq, err);
    if (!st)
        *id = r->id;
    pthread_mutex_unlock(&e->w.mu);
    if (st)
        req_free(e, r);
    return st;
}

/* ---- reading events ------------------------------------------------------- */

/* Unlinks r; frees it unless a reader is still waiting on it (the last
 * reader frees it then). Its sequences must be out of the scheduler. */
static void req_release(llm_engine *e, eng_req *r)
{
    req_unlink(e, r);
    r->gone = 1;
    pthread_cond_broadcast(&r->cond);
    if (r->readers == 0)
        req_free(e, r);
}

/* Pops r's next event into ev (or its error); releases r after its last. */
static void req_pop(llm_engine *e, eng_req *r, llm_event *ev)
{
    if (r->head) {
        ev_node *n = r->head;
        r->head = n->next;
        if (!r->head)
            r->tail = NULL;
        *ev = n->ev;
        free(n);
        if (ev->type == LLM_EVENT_DONE && ++r->n_read_done == r->n)
            req_release(e, r);
        return;
    }
    ev->type = LLM_EVENT_ERROR;
    ev->error = r->error;
    req_release(e, r);
}

static int wait_event(eng_req *r, pthread_mutex_t *mu, int timeout_ms, const struct timespec *deadline)
{
    if (timeout_ms == 0)
        return ETIMEDOUT;
    if (timeout_ms < 0)
        return pthread_cond_wait(&r->cond, mu);
    return pthread_cond_timedwait(&r->cond, mu, deadline);
}

llm_status llm_engine_next(llm_engine *e, llm_request_id id, llm_event *ev, int timeout_ms)
{
    memset(ev, 0, sizeof *ev);
    struct timespec dl = llm_sync_after_ms(timeout_ms); /* the clock r->cond's waits count on */
    pthread_mutex_lock(&e->w.mu);
    eng_req *r = req_find(e, id);
    llm_status st = LLM_OK;
    if (!r) {
        pthread_mutex_unlock(&e->w.mu);
        return LLM_ERR_NOT_FOUND;
    }
    r->readers++;
    while (!r->head && !r->failed && !r->cancelled && !r->gone && st == LLM_OK)
        if (wait_event(r, &e->w.mu, timeout_ms, &dl) == ETIMEDOUT)
            st = LLM_ERR_TIMEOUT;
    r->readers--;
    if (r->gone || r->cancelled) {
        st = LLM_ERR_NOT_FOUND;
        if (r->gone && r->readers == 0)
            req_free(e, r);
    } else if (r->head || r->failed) {
        st = LLM_OK;
        req_pop(e, r, ev);
    }
    pthread_mutex_unlock(&e->w.mu);
    return st;
}

/* ---- cancel and stats ------------------------------------------------------ */

void llm_engine_cancel(llm_engine *e, llm_request_id id)
{
    pthread_mutex_lock(&e->w.mu);
    eng_req *r = req_find(e, id);
    if (r && !r->cancelled) {
        r->cancelled = 1; /* the engine skips it from now on */
        while (r->in_flight) pthread_cond_wait(&e->step_done, &e->w.mu);
        eng_req_drop_seqs(e, r);
        req_release(e, r);
    }
    pthread_mutex_unlock(&e->w.mu);
}

static double gen_rate(const llm_engine *e, double now)
{
    int last = (e->gen_i + GEN_WINDOW - 1) % GEN_WINDOW, first = -1;
    if (e->gen_t[last] == 0 || now - e->gen_t[last] > 5000)
        return 0;
    for (int k = 1; k < GEN_WINDOW; k++) {
        int i = (e->gen_i + k) % GEN_WINDOW; /* oldest first */
        if (e->gen_t[i] > 0 && now - e->gen_t[i] <= 5000) {
            first = i;
            break;
        }
    }
    if (first < 0 || first == last || e->gen_t[last] <= e->gen_t[first])
        return 0;
    return (double)(e->gen_n[last] - e->gen_n[first]) * 1e3 / (e->gen_t[last] - e->gen_t[first]);
}

void llm_engine_stats(llm_engine *e, llm_stats *out)
{
    kv_cache_stats kc;
    pthread_mutex_lock(&e->w.mu);
    *out = e->st;
    kv_cache_get_stats(e->kv, &kc);
    out->running = e->s.n_running;
    out->waiting = e->s.n_waiting;
    out->requests = e->n_reqs;
    out->kv_blocks_total = kc.n_blocks;
    out->kv_blocks_used = kc.used;
    out->kv_blocks_cached = kc.cached;
    out->kv_local_blocks_total = kc.local_blocks;
    out->kv_local_blocks_used = kc.local_used;
    out->kv_window = kv_cache_window(e->kv);
    out->n_ctx = e->cfg.n_ctx;
    out->spec_tokens = e->cfg.speculative != LLM_SPEC_OFF ? e->cfg.spec_tokens : 0;
    out->kv_block_size = kv_cache_block_size(e->kv);
    out->preemptions = e->s.stats.preemptions;
    out->prompt_tokens = e->s.stats.prompt_tokens;
    out->cached_tokens = e->s.stats.cached_tokens + e->s.stats.forked_tokens;
    out->forked_tokens = e->s.stats.forked_tokens;
    out->prefix_hit_rate = out->prompt_tokens ? (double)out->cached_tokens / (double)out->prompt_tokens : 0;
    double now = eng_now_ms();
    out->gen_tokens_per_s = gen_rate(e, now);
    out->step_running_ms = e->step_t0 > 0 ? now - e->step_t0 : 0;
    pthread_mutex_unlock(&e->w.mu);
}

/* ---- open and close ----------------------------------------------------------- */

/* Speculation's settings: defaults, then each checked by name. */
static llm_status spec_defaults(llm_engine_config *c, llm_error *err)
{
    c->spec_tokens = c->spec_tokens ? c->spec_tokens : 16;
    c->spec_ngram_min = c->spec_ngram_min ? c->spec_ngram_min : 2;
    c->spec_ngram_max = c->spec_ngram_max ? c->spec_ngram_max : 8;
    c->spec_step_rows = c->spec_step_rows ? c->spec_step_rows : 32;
    c->spec_max_seqs = c->spec_max_seqs ? c->spec_max_seqs : 16;
    if ((unsigned)c->speculative > LLM_SPEC_DRAFT)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: speculative %d is no llm_spec_mode", (int)c->speculative);
    if (c->speculative == LLM_SPEC_CALLER && !c->spec_guess)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: speculative LLM_SPEC_CALLER needs spec_guess");
    if (c->spec_tokens < 1 || c->spec_tokens > LLM_SPEC_MAX_TOKENS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: spec_tokens %d not in [1, %d]", c->spec_tokens,
                        LLM_SPEC_MAX_TOKENS);
    if (c->spec_ngram_min < 1 || c->spec_ngram_max < c->spec_ngram_min || c->spec_ngram_max > LLM_SPEC_MAX_NGRAM)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: spec_ngram_min %d and spec_ngram_max %d must be in [1, %d], "
                        "min <= max", c->spec_ngram_min, c->spec_ngram_max, LLM_SPEC_MAX_NGRAM);
    if (c->spec_step_rows < 1 || c->spec_step_rows > LLM_SPEC_MAX_STEP_ROWS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: spec_step_rows %d not in [1, %d]", c->spec_step_rows,
                        LLM_SPEC_MAX_STEP_ROWS);
    if (c->spec_max_seqs < 1)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: spec_max_seqs %d is below 1", c->spec_max_seqs);
    if (c->speculative == LLM_SPEC_DRAFT && !c->spec_draft_model)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: speculative LLM_SPEC_DRAFT needs spec_draft_model");
    return LLM_OK;
}

static llm_status config_defaults(llm_engine_config *c, const llm_model *m, llm_error *err)
{
    if (!c->model || !c->backend)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: model and backend are required");
    if (c->n_ctx == 0)
        c->n_ctx = m->hp.n_ctx_train < 4096 ? m->hp.n_ctx_train : 4096;
    c->max_seqs = c->max_seqs ? c->max_seqs : 64;
    c->max_batch_tokens = c->max_batch_tokens ? c->max_batch_tokens : 512;
    c->max_waiting = c->max_waiting ? c->max_waiting : 256;
    c->block_size = c->block_size ? c->block_size : KV_DEFAULT_BLOCK;
    c->kv_cache_fraction = c->kv_cache_fraction > 0 ? c->kv_cache_fraction : 0.25f;
    c->aging_ms = c->aging_ms ? c->aging_ms : 1000;
    c->mask_step_work = c->mask_step_work ? c->mask_step_work : LLM_GMATCH_MAX_WORK / 4;
    c->max_loras = c->max_loras ? c->max_loras : 8;
    c->prompt_logit_rows = c->prompt_logit_rows ? c->prompt_logit_rows : 8;
    llm_status st = spec_defaults(c, err);
    if (st)
        return st;
    if (c->prompt_logit_rows < -1 || c->prompt_logit_rows > 4096)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: prompt_logit_rows %d not in [-1, 4096]", c->prompt_logit_rows);
    if (c->n_ctx < 2 || c->n_ctx > m->hp.n_ctx_train)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: n_ctx %d not in [2, %d] (the model's training context)", c->n_ctx,
                        m->hp.n_ctx_train);
    if (c->max_seqs < 1 || c->max_seqs > 4096 || c->max_batch_tokens < c->max_seqs || c->max_batch_tokens > 65536)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: max_seqs %d must be in [1, 4096] and max_batch_tokens %d in [max_seqs, 65536]",
                        c->max_seqs, c->max_batch_tokens);
    if (c->tensor_parallel > 1 && (!c->tp_backends || c->tp_backends[0] != c->backend))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: tensor_parallel %d needs its backends, the first being backend",
                        c->tensor_parallel);
    if (c->max_loras < 1 || c->max_loras > 1024)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: max_loras %d not in [1, 1024]", c->max_loras);
    if (c->max_waiting < 1 || c->aging_ms < 1 || c->kv_cache_fraction > 1 || c->mask_step_work < 1)
        return llm_errf(err, LLM_ERR_INVALID_ARG,
                        "engine: max_waiting %d, aging_ms %d, kv_cache_fraction %g or mask_step_work %ld out of range",
                        c->max_waiting, c->aging_ms, c->kv_cache_fraction, c->mask_step_work);
    return LLM_OK;
}

static int n_ranks(const llm_engine_config *c) { return c->tensor_parallel > 1 ? c->tensor_parallel : 1; }

/* The KV pools' shape: block counts of the global pool (n) and of the
 * sliding-window layers' pool (n_local; 0 without one), the window, and
 * which layers are local (flags, n_layer bytes, owned by the caller). */
typedef struct kv_shape {
    int n, n_local, window;
    unsigned char *local;
} kv_shape;

/* Blocks for the pools: the budget, at most max_seqs full contexts, at
 * least one full context (else the setting is an error). With
 * sliding-window layers the local pool takes what its sequences can use
 * (kv_cache_local_need) and the global layers the rest. */
static llm_status kv_blocks(const llm_engine_config *c, const llm_model *m, kv_shape *sh, llm_error *err)
{
    const llm_hparams *hp = &m->hp;
    int n_local_layers = 0;
    for (int l = 0; l < hp->n_layer; l++) n_local_layers += sh->local[l];
    size_t u = kv_cache_block_bytes(c->kv_type, c->block_size, 1, hp->n_head_kv / n_ranks(c) * hp->head_dim);
    size_t g = u * (size_t)(hp->n_layer - n_local_layers), l = u * (size_t)n_local_layers, per = g + l;
    size_t bytes = c->kv_cache_bytes ? c->kv_cache_bytes
                                     : (size_t)((double)llm_backend_mem_available(c->backend) * c->kv_cache_fraction);
    size_t per_seq = (size_t)(c->n_ctx + c->block_size - 1) / (size_t)c->block_size, n = bytes / per, nl = n;
    size_t need = sh->window > 0 ? kv_cache_local_need(sh->window, c->block_size, c->max_seqs, c->max_batch_tokens) : 0;
    if (sh->window > 0 && n > need) { /* local blocks beyond the need go to the global layers */
        nl = need;
        n = g ? (bytes - need * l) / g : SIZE_MAX;
    }
    if (n > per_seq * (size_t)c->max_seqs)
        n = per_seq * (size_t)c->max_seqs;
    if (n < per_seq)
        return llm_errf(err, LLM_ERR_INVALID_ARG,
                        "engine: the KV budget of %zu bytes holds %zu blocks of %zu bytes; one sequence of n_ctx %d needs %zu",
                        bytes, n, per, c->n_ctx, per_seq);
    sh->n = (int)n;
    sh->n_local = sh->window > 0 ? (int)(nl < n ? nl : n) : 0;
    return LLM_OK;
}

static llm_status engine_alloc(llm_engine *e, llm_error *err)
{
    const llm_engine_config *c = &e->cfg;
    int nr = n_ranks(c);
    llm_backend *const *ranks = nr > 1 ? c->tp_backends : &e->b;
    const llm_hparams *hp = &e->m->hp;
    kv_shape sh = {.local = calloc((size_t)hp->n_layer, 1)};
    if (!sh.local)
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory");
    sh.window = c->kv_keep_all ? 0 : llm_model_windows(e->m, sh.local);
    /* weights and activations first: on a device the KV pool is a share of
     * what they leave */
    /* a logits row per sequence, prompt_logprobs' rows and guesses' rows, as far as a step's rows allow */
    int guess_rows = c->speculative != LLM_SPEC_OFF ? c->spec_step_rows : 0;
    int plan_logits = c->max_seqs + (c->prompt_logit_rows > 0 ? c->prompt_logit_rows : 0);
    plan_logits = plan_logits < c->max_batch_tokens ? plan_logits : c->max_batch_tokens;
    e->max_logits = plan_logits + guess_rows < c->max_batch_tokens ? plan_logits + guess_rows : c->max_batch_tokens;
    llm_status st = llm_forward_new_tp(e->m, ranks, nr, c->max_batch_tokens, e->max_logits, &e->fwd, err);
    if (!st && c->speculative == LLM_SPEC_DRAFT) /* (the draft's pass and pool too: the KV budget is a share of
                                                  * what is left) */
        st = eng_draft_new(c, e->b, &e->draft, err);
    if (!st && !(st = kv_blocks(c, e->m, &sh, err))) {
        kv_cache_config kc = {c->block_size, c->kv_type, sh.n, 0, !c->no_prefix_cache, ranks, nr,
                              sh.window, sh.local, sh.n_local};
        st = kv_cache_new(&kc, e->b, hp->n_layer, hp->n_head_kv / nr, hp->head_dim, &e->kv, err);
    }
    free(sh.local);
    if (st)
        return st;
    int n_blocks = sh.n;
    sched_config sc = {.max_seqs = c->max_seqs, .max_batch_tokens = c->max_batch_tokens, .aging_ms = c->aging_ms,
                       .max_logits = plan_logits, .max_draft_rows = guess_rows}; /* (guesses' rows apart: they
                                                                                   * must not widen prompt_logprobs') */
    if ((st = sched_init(&e->s, &sc, e->kv, err)))
        return st;
    e->b_tokens = malloc(sizeof(int32_t) * (size_t)c->max_batch_tokens);
    e->b_logit_rows = malloc(sizeof(int32_t) * (size_t)e->max_logits);
    e->b_hidden_rows = malloc(sizeof(int32_t) * (size_t)c->max_batch_tokens);
    e->b_params = malloc(sizeof(llm_sample_params) * (size_t)c->max_seqs);
    e->b_seqs = malloc(sizeof(llm_batch_seq) * (size_t)c->max_seqs);
    e->b_loras = malloc(sizeof(llm_forward_seq_lora) * (size_t)c->max_seqs);
    e->loras = calloc((size_t)c->max_loras, sizeof *e->loras);
    e->b_held = malloc(sizeof(eng_seq *) * (size_t)c->max_seqs);
    e->cp_src = malloc(sizeof(int32_t) * 2 * (size_t)n_blocks); /* the local pool is never larger */
    e->cp_dst = malloc(sizeof(int32_t) * 2 * (size_t)n_blocks);
    if (!e->b_tokens || !e->b_logit_rows || !e->b_hidden_rows || !e->b_params || !e->b_seqs || !e->b_loras || !e->loras || !e->b_held || !e->cp_src || !e->cp_dst)
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory");
    return LLM_OK;
}

static void engine_free(llm_engine *e)
{
    while (e->reqs) {
        eng_req *r = e->reqs;
        eng_req_drop_seqs(e, r);
        req_unlink(e, r);
        req_free(e, r);
    }
    if (e->kv)
        sched_free(&e->s);
    eng_lora_free_all(e);
    eng_draft_free(e->draft);
    llm_forward_free(e->fwd);
    kv_cache_free(e->kv);
    free(e->b_tokens);
    free(e->b_logit_rows);
    free(e->b_hidden_rows);
    free(e->b_params);
    free(e->b_seqs);
    free(e->b_loras);
    free(e->b_held);
    free(e->b_mask);
    llm_gmatch_vocab_free(e->gv);
    llm_gmatch_cache_free(e->gcache);
    for (int i = 0; i < ENG_GRAMMARS; i++) {
        llm_grammar_free(e->grammars[i].g);
        free(e->grammars[i].text);
    }
    pthread_mutex_destroy(&e->gv_mu);
    free(e->cp_src);
    free(e->cp_dst);
    llm_sync_worker_free(&e->w);
    pthread_cond_destroy(&e->step_done);
    free(e);
}

llm_status llm_engine_open(const llm_engine_config *cfg, llm_engine **out, llm_error *err)
{
    *out = NULL;
    llm_engine *e = calloc(1, sizeof *e);
    if (!e)
        return llm_errf(err, LLM_ERR_NOMEM, "engine: no memory");
    if (llm_sync_worker_init(&e->w)) {
        free(e);
        return llm_errf(err, LLM_ERR_INTERNAL, "engine: cannot make its lock and condition variable");
    }
    pthread_mutex_init(&e->gv_mu, NULL);
    pthread_cond_init(&e->step_done, NULL);
    e->cfg = *cfg;
    e->m = cfg->model;
    e->b = cfg->backend;
    llm_status st = cfg->model ? config_defaults(&e->cfg, e->m, err) : llm_errf(err, LLM_ERR_INVALID_ARG, "engine: no model");
    if (!st)
        st = engine_alloc(e, err);
    if (!st && llm_sync_worker_start(&e->w, LLM_THREAD_STACK, eng_step_main, e)) /* grammar matching recurses there */
        st = llm_errf(err, LLM_ERR_BACKEND, "engine: cannot start the engine thread");
    if (st) {
        engine_free(e);
        return st;
    }
    *out = e;
    return LLM_OK;
}

void llm_engine_close(llm_engine *e)
{
    if (!e)
        return;
    llm_sync_worker_stop(&e->w);
    engine_free(e);
}
