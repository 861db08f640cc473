/* engine_lora.c - the serving engine's LoRA adapters: a fixed table of
 * slots (cfg.max_loras) under the engine's lock. The caller's side adds
 * and removes; the engine thread, between steps, makes an added adapter
 * ready for its backend (llm_forward_lora_add: on a device that is a copy,
 * so it must not race a pass) and frees a removed one once no request
 * names it. A request holds a ref on its slot from enqueue to unlink.
 *
 * Prefix caching: a request with an adapter runs its sequences under a
 * salt made of its own salt, the slot's uid (never reused, so an adapter
 * loaded again under the same address starts cold) and the scale's bits:
 * K/V computed under one adapter or scale are never matched by another,
 * nor by the base. */
#include <string.h>

#include "engine_impl.h"

static eng_lora *slot_of(llm_engine *e, const llm_lora *l)
{
    for (int i = 0; i < e->cfg.max_loras; i++)
        if (e->loras[i].state != ENG_LORA_FREE && e->loras[i].l == l)
            return &e->loras[i];
    return NULL;
}

/* 63 bits (kv_cache's salt) of a mix of the three: splitmix64's finaliser
 * over each in turn. */
static uint64_t lora_salt(uint64_t salt, uint64_t uid, float scale)
{
    uint32_t bits;
    memcpy(&bits, &scale, sizeof bits);
    uint64_t v[3] = {salt, uid, bits}, h = 0x6c6f7261ULL; /* "lora" */
    for (int i = 0; i < 3; i++) {
        h ^= v[i] + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
        h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
        h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
        h ^= h >> 31;
    }
    return h & ~(1ULL << 63);
}

llm_status eng_lora_take(llm_engine *e, eng_req *r, const llm_lora *l, uint64_t cache_salt, llm_error *err)
{
    eng_lora *s = slot_of(e, l);
    if (!s || s->state != ENG_LORA_READY)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: the request's adapter is not loaded%s",
                        s ? " (it is being added or removed)" : "");
    s->refs++;
    r->lora = s;
    uint64_t salt = lora_salt(cache_salt, s->uid, r->lora_scale);
    for (int i = 0; i < r->n; i++) r->seqs[i].q.salt = salt;
    return LLM_OK;
}

void eng_lora_drop(llm_engine *e, eng_req *r)
{
    eng_lora *s = r->lora;
    r->lora = NULL;
    if (s && --s->refs == 0 && s->state == ENG_LORA_REMOVING)
        pthread_cond_signal(&e->w.cv); /* the engine thread frees it */
}

void eng_lora_service(llm_engine *e)
{
    int changed = 0;
    for (int i = 0; i < e->cfg.max_loras; i++) {
        eng_lora *s = &e->loras[i];
        if (s->state == ENG_LORA_ADDING) {
            llm_status st = llm_forward_lora_add(e->fwd, s->l, &s->fl, &s->err);
            s->state = st ? ENG_LORA_FAILED : ENG_LORA_READY;
            changed = 1;
        } else if (s->state == ENG_LORA_REMOVING && s->refs == 0) {
            llm_forward_lora_free(e->fwd, s->fl);
            *s = (eng_lora){0};
            changed = 1;
        }
    }
    if (changed)
        pthread_cond_broadcast(&e->step_done);
}

void eng_lora_free_all(llm_engine *e)
{
    for (int i = 0; e->loras && i < e->cfg.max_loras; i++) llm_forward_lora_free(e->fwd, e->loras[i].fl);
    free(e->loras);
}

llm_status llm_engine_lora_add(llm_engine *e, const llm_lora *l, llm_error *err)
{
    if (!l)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "engine: no adapter");
    pthread_mutex_lock(&e->w.mu);
    eng_lora *s = NULL;
    llm_status st = LLM_OK;
    if (e->w.stop)
        st = llm_errf(err, LLM_ERR_SHUTDOWN, "engine: shutting down");
    else if (slot_of(e, l))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "engine: the adapter is already added");
    for (int i = 0; !st && !s && i < e->cfg.max_loras; i++)
        if (e->loras[i].state == ENG_LORA_FREE)
            s = &e->loras[i];
    if (!st && !s)
        st = llm_errf(err, LLM_ERR_QUEUE_FULL, "engine: %d adapters are loaded, the most it holds; remove one first",
                      e->cfg.max_loras);
    if (!st) {
        *s = (eng_lora){.l = l, .state = ENG_LORA_ADDING, .uid = ++e->lora_clock};
        pthread_cond_signal(&e->w.cv);
        while (s->state == ENG_LORA_ADDING && !e->w.stop) pthread_cond_wait(&e->step_done, &e->w.mu);
        if (s->state != ENG_LORA_READY) {
            st = s->state == ENG_LORA_FAILED ? s->err.code : LLM_ERR_SHUTDOWN;
            if (s->state == ENG_LORA_FAILED && err)
                *err = s->err;
            else
                llm_errf(err, LLM_ERR_SHUTDOWN, "engine: shutting down");
            *s = (eng_lora){0};
        }
    }
    pthread_mutex_unlock(&e->w.mu);
    return st;
}

void llm_engine_lora_remove(llm_engine *e, const llm_lora *l)
{
    pthread_mutex_lock(&e->w.mu);
    eng_lora *s = slot_of(e, l);
    if (s) {
        s->state = ENG_LORA_REMOVING; /* eng_lora_take refuses it from now on */
        pthread_cond_signal(&e->w.cv);
        while (s->l == l && !e->w.stop) pthread_cond_wait(&e->step_done, &e->w.mu);
    }
    pthread_mutex_unlock(&e->w.mu);
}

int llm_engine_lora_requests(llm_engine *e, const llm_lora *l)
{
    pthread_mutex_lock(&e->w.mu);
    eng_lora *s = slot_of(e, l);
    int n = s ? s->refs : -1;
    pthread_mutex_unlock(&e->w.mu);
    return n;
}

void llm_engine_lora_counts(llm_engine *e, const llm_lora *l, int *running, int *waiting)
{
    *running = *waiting = 0;
    pthread_mutex_lock(&e->w.mu);
    for (const eng_req *r = e->reqs; r; r = r->next)
        if (r->lora && r->lora->l == l)
            ++*(r->t_sched > 0 ? running : waiting);
    pthread_mutex_unlock(&e->w.mu);
}
