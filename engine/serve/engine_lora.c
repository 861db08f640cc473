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

/* Slot s (under the lock) made ready for the pass with the lock released:
 * only this thread drives the backend, and a submit or read must not wait
 * for a device copy. A removal meanwhile (the state no longer PREPARING)
 * gets the handle freed at once. */
static void prepare(llm_engine *e, eng_lora *s)
{
    const llm_lora *l = s->l;
    uint64_t uid = s->uid;
    llm_forward_lora *fl = NULL;
    llm_error err = {0};
    s->state = ENG_LORA_PREPARING;
    pthread_mutex_unlock(&e->w.mu);
    llm_status st = llm_forward_lora_add(e->fwd, l, &fl, &err);
    pthread_mutex_lock(&e->w.mu);
    if (s->uid == uid && s->state == ENG_LORA_PREPARING) {
        s->fl = fl;
        s->err = err;
        s->state = st ? ENG_LORA_FAILED : ENG_LORA_READY;
        return;
    }
    llm_forward_lora_free(e->fwd, fl);
    if (s->uid == uid) /* removed while preparing: no request ever named it */
        *s = (eng_lora){0};
}

void eng_lora_service(llm_engine *e)
{
    int changed = 0;
    for (int i = 0; i < e->cfg.max_loras; i++) {
        eng_lora *s = &e->loras[i];
        if (s->state == ENG_LORA_ADDING) {
            prepare(e, s);
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

/* Under the lock: waits while slot s still holds adapter uid in one of
 * the states adding leaves from. */
static void wait_added(llm_engine *e, const eng_lora *s, uint64_t uid)
{
    while (s->uid == uid && (s->state == ENG_LORA_ADDING || s->state == ENG_LORA_PREPARING) && !e->w.stop)
        pthread_cond_wait(&e->step_done, &e->w.mu);
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
        uint64_t uid = ++e->lora_clock;
        *s = (eng_lora){.l = l, .state = ENG_LORA_ADDING, .uid = uid};
        pthread_cond_signal(&e->w.cv);
        wait_added(e, s, uid);
        if (s->uid != uid)
            st = llm_errf(err, LLM_ERR_INVALID_ARG, "engine: the adapter was removed while it was being added");
        else if (s->state == ENG_LORA_FAILED) {
            st = s->err.code ? s->err.code : LLM_ERR_INTERNAL;
            if (err)
                *err = s->err;
            *s = (eng_lora){0};
        } else if (s->state != ENG_LORA_READY) /* stopped */
            st = llm_errf(err, LLM_ERR_SHUTDOWN, "engine: shutting down");
    }
    pthread_mutex_unlock(&e->w.mu);
    return st;
}

void llm_engine_lora_remove(llm_engine *e, const llm_lora *l)
{
    pthread_mutex_lock(&e->w.mu);
    eng_lora *s = slot_of(e, l);
    if (s) {
        uint64_t uid = s->uid;
        s->state = ENG_LORA_REMOVING; /* eng_lora_take refuses it from now on; a preparation in flight is undone */
        pthread_cond_signal(&e->w.cv);
        while (s->uid == uid && !e->w.stop) pthread_cond_wait(&e->step_done, &e->w.mu);
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

void llm_engine_lora_counts(llm_engine *e, const llm_lora *const *ls, int n, int *running, int *waiting)
{
    for (int i = 0; i < n; i++) running[i] = waiting[i] = 0;
    pthread_mutex_lock(&e->w.mu);
    for (const eng_req *r = e->reqs; r; r = r->next)
        for (int i = 0; r->lora && i < n; i++)
            if (r->lora->l == ls[i]) {
                ++*(r->t_sched > 0 ? &running[i] : &waiting[i]);
                break;
            }
    pthread_mutex_unlock(&e->w.mu);
}
