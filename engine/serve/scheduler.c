/* scheduler.c - the continuous-batching policy described in scheduler.h:
 * urgency order, decode-first token budget, chunked prefill, admission
 * with prefix matching or forking, and preemption by recompute. See
 * docs/internals/scheduler.md. */
#include <string.h>

#include "llm/scheduler.h"

llm_status sched_init(sched *s, const sched_config *cfg, kv_cache *kv, llm_error *err)
{
    memset(s, 0, sizeof *s);
    if (cfg->max_seqs < 1 || cfg->max_batch_tokens < 1 || cfg->aging_ms < 1)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "scheduler: max_seqs %d, max_batch_tokens %d and aging_ms %d must be >= 1",
                        cfg->max_seqs, cfg->max_batch_tokens, cfg->aging_ms);
    s->cfg = *cfg;
    int least = cfg->max_seqs < cfg->max_batch_tokens ? cfg->max_seqs : cfg->max_batch_tokens;
    s->cfg.max_logits = cfg->max_logits > least ? cfg->max_logits : least;
    s->kv = kv;
    s->running = malloc(sizeof(sched_seq *) * (size_t)cfg->max_seqs);
    s->items = malloc(sizeof(sched_item) * (size_t)cfg->max_seqs);
    if (!s->running || !s->items) {
        sched_free(s);
        return llm_errf(err, LLM_ERR_NOMEM, "scheduler: no memory");
    }
    return LLM_OK;
}

void sched_free(sched *s)
{
    for (int i = 0; i < s->n_running; i++) kv_seq_release(s->kv, &s->running[i]->kv);
    for (int i = 0; i < s->n_waiting; i++) kv_seq_release(s->kv, &s->waiting[i]->kv);
    free(s->running);
    free(s->waiting);
    free(s->items);
    memset(s, 0, sizeof *s);
}

/* Queues new q as waiting. The waiting list always has room for every
 * sequence in the scheduler plus q (running ones included): a preemption
 * moves a running sequence back to it without allocating. */
static llm_status waiting_push(sched *s, sched_seq *q)
{
    if (s->n_waiting + s->n_running + 1 > s->cap_waiting) {
        int cap = s->cap_waiting ? 2 * s->cap_waiting : 64;
        while (cap < s->n_waiting + s->n_running + 1) cap *= 2;
        sched_seq **p = realloc(s->waiting, sizeof *p * (size_t)cap);
        if (!p)
            return LLM_ERR_NOMEM;
        s->waiting = p;
        s->cap_waiting = cap;
    }
    s->waiting[s->n_waiting++] = q;
    q->state = SCHED_WAITING;
    return LLM_OK;
}

llm_status sched_add(sched *s, sched_seq *q)
{
    q->key = q->arrival_ms - (int64_t)q->priority * s->cfg.aging_ms;
    q->order = s->next_order++;
    kv_seq_init(&q->kv);
    return waiting_push(s, q);
}

/* Removes q from list (n entries); returns 1 when it was there. */
static int list_remove(sched_seq **list, int *n, const sched_seq *q)
{
    for (int i = 0; i < *n; i++)
        if (list[i] == q) {
            memmove(list + i, list + i + 1, sizeof *list * (size_t)(*n - i - 1));
            (*n)--;
            return 1;
        }
    return 0;
}

void sched_remove(sched *s, sched_seq *q)
{
    if (!list_remove(s->running, &s->n_running, q))
        list_remove(s->waiting, &s->n_waiting, q);
    kv_seq_release(s->kv, &q->kv);
    q->state = SCHED_DONE;
}

static int urgency_cmp(const void *a, const void *b)
{
    const sched_seq *x = *(sched_seq *const *)a, *y = *(sched_seq *const *)b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* The least urgent running sequence (the preemption victim), or NULL. */
static sched_seq *least_urgent(const sched *s)
{
    sched_seq *v = NULL;
    for (int i = 0; i < s->n_running; i++)
        if (!v || urgency_cmp(&s->running[i], &v) > 0)
            v = s->running[i];
    return v;
}

/* Drops q's item from the plan, if it has one. */
static void plan_drop(sched *s, sched_seq *q)
{
    for (int i = 0; q->in_plan && i < s->n_items; i++)
        if (s->items[i].seq == q) {
            s->n_rows -= s->items[i].n;
            s->n_logits -= s->items[i].logit_rows;
            memmove(s->items + i, s->items + i + 1, sizeof *s->items * (size_t)(s->n_items - i - 1));
            s->n_items--;
        }
    q->in_plan = 0;
}

/* Back to waiting, K/V released: it is recomputed from its tokens when
 * admitted again. The waiting list has room (waiting_push keeps it large
 * enough for every sequence in the scheduler). */
static void preempt(sched *s, sched_seq *q)
{
    plan_drop(s, q);
    list_remove(s->running, &s->n_running, q);
    kv_seq_release(s->kv, &q->kv);
    q->n_preempted++;
    s->stats.preemptions++;
    LLM_ASSERT(s->n_waiting < s->cap_waiting);
    s->waiting[s->n_waiting++] = q;
    q->state = SCHED_WAITING;
}

/* Prompt rows of q from its next position on that need a logits row of
 * their own (all_logits: each prompt position followed by another). */
static int prompt_logit_rows(const sched_seq *q)
{
    int left = q->n_prompt - 1 - q->kv.n_tokens;
    return q->all_logits && left > 0 ? left : 0;
}

/* How many of q's need tokens go into this step: within the token budget
 * B and, for an all_logits q, so that the plan's logit rows stay within
 * L = max_logits whatever follows. Its n rows take at most n logit rows
 * (prompt rows, or its sampling row); each later item takes at most one,
 * and at most min(S, B - n) follow (S: the sequence slots left after it).
 * So n fits when used + n + min(S, B - n) <= L: every n <= B when used + B
 * <= L, else n <= L - used - S. 0: none fits now. */
static int chunk_of(const sched *s, const sched_seq *q, int need)
{
    int budget = s->cfg.max_batch_tokens - s->n_rows, n = need < budget ? need : budget;
    if (!prompt_logit_rows(q) || s->n_logits + budget <= s->cfg.max_logits)
        return n;
    int cap = s->cfg.max_logits - s->n_logits - (s->cfg.max_seqs - s->n_items - 1);
    return cap < n ? (cap > 0 ? cap : 0) : n;
}

/* Whether waiting q may start now: an all_logits prompt only with a real
 * chunk (the step's rows beyond one per sequence, or all it has left), so
 * many of them cannot each hold a sequence slot and its K/V while creeping
 * a row a step. */
static int admits(const sched *s, const sched_seq *q)
{
    int rows = prompt_logit_rows(q), extra = s->cfg.max_logits - s->cfg.max_seqs;
    int want = rows < extra ? rows : extra;
    want = want < s->cfg.max_batch_tokens ? want : s->cfg.max_batch_tokens; /* (what a step can ever give) */
    want = want > 1 ? want : 1;
    return chunk_of(s, q, q->n_tokens - q->kv.n_tokens) >= want;
}

static void plan_add(sched *s, sched_seq *q, int n)
{
    int rows = prompt_logit_rows(q), samples = q->kv.n_tokens + n == q->n_tokens;
    int logit_rows = (rows < n ? rows : n) + samples;
    s->n_logits += logit_rows;
    s->items[s->n_items++] = (sched_item){.seq = q, .pos0 = q->kv.n_tokens, .n = n, .logits = samples,
                                          .logit_rows = logit_rows, .n_commit = n};
    s->n_rows += n;
    q->in_plan = 1;
}

/* q cannot get memory for its block table: it waits, is skipped by
 * admission, and the caller fails its request (stats.oom tells it). */
static void mark_oom(sched *s, sched_seq *q)
{
    q->oom = 1;
    s->stats.oom++;
}

/* Reserves n tokens for running q, preempting the least urgent running
 * sequences (q itself when it is the least urgent). 0: q was preempted. */
static int reserve_running(sched *s, sched_seq *q, int n)
{
    for (;;) {
        llm_status st = kv_seq_reserve(s->kv, &q->kv, n);
        if (st == LLM_OK)
            return 1;
        if (st == LLM_ERR_NOMEM) { /* its table could not grow: others' blocks would not help */
            preempt(s, q);
            mark_oom(s, q);
            return 0;
        }
        sched_seq *v = least_urgent(s);
        preempt(s, v);
        if (v == q)
            return 0;
    }
}

/* One pass over running sequences not yet planned: those decoding (need
 * one token) or those still prefilling. */
static void plan_running(sched *s, int decode)
{
    for (int i = 0; i < s->n_running; i++) {
        sched_seq *q = s->running[i];
        int need = q->n_tokens - q->kv.n_tokens, budget = s->cfg.max_batch_tokens - s->n_rows;
        if (q->in_plan || need < 1 || (need == 1) != decode)
            continue;
        if (budget < 1)
            return;
        int n = chunk_of(s, q, need);
        if (n < 1)
            continue; /* logit rows are short: its prompt waits for the next step */
        uint64_t preempted = s->stats.preemptions;
        if (reserve_running(s, q, n))
            plan_add(s, q, n);
        if (s->stats.preemptions != preempted)
            i = -1; /* the list changed: rescan, skipping planned ones */
    }
}

/* 1: q can share its sibling's prompt K/V now; 0: no sibling to share
 * with (use the prefix cache); -1: wait until the sibling has it. */
static int fork_state(const sched_seq *q)
{
    const sched_seq *p = q->fork_of;
    if (!p || q->admitted || p->state == SCHED_DONE)
        return 0;
    return p->state == SCHED_RUNNING && p->kv.n_tokens >= q->n_prompt - 1 ? 1 : -1;
}

/* Gives waiting q the K/V it can reuse: its sibling's, else the cache's.
 * Returns how many of its tokens that covers and sets *forked. Nothing is
 * counted yet: the admission may still fail for want of blocks. */
static int attach(sched *s, sched_seq *q, int fork, int *forked)
{
    q->kv.salt = q->salt;
    *forked = 0;
    if (q->no_reuse)
        return 0;
    *forked = fork && kv_seq_fork(s->kv, &q->kv, &q->fork_of->kv, q->n_prompt - 1) == LLM_OK;
    if (*forked)
        return q->kv.n_tokens;
    return kv_seq_match(s->kv, &q->kv, q->tokens, q->n_tokens - 1);
}

/* q was admitted with hit tokens reused: each sequence's prompt counts
 * once (its first admission); a preempted one's later admissions count
 * what it computes again. */
static void count_admission(sched *s, sched_seq *q, int hit, int forked)
{
    if (q->admitted) {
        s->stats.recomputed_tokens += (uint64_t)(q->n_tokens - hit);
        return;
    }
    s->stats.prompt_tokens += (uint64_t)q->n_prompt;
    q->cached_tokens = hit;
    if (forked)
        s->stats.forked_tokens += (uint64_t)hit;
    else
        s->stats.cached_tokens += (uint64_t)hit;
}

/* Makes room for waiting q by preempting the least urgent running
 * sequence, when that one has a strictly lower priority and is less
 * urgent. Returns 1 when it did. */
static int preempt_for(sched *s, const sched_seq *q)
{
    sched_seq *v = least_urgent(s);
    if (!v || v->priority >= q->priority || urgency_cmp(&v, &q) <= 0)
        return 0;
    preempt(s, v);
    return 1;
}

/* Reserves n tokens for waiting q, preempting less urgent running
 * sequences of lower priority while the pool is what is short. LLM_OK,
 * LLM_ERR_KV_FULL or LLM_ERR_NOMEM (its table could not grow). */
static llm_status admit_reserve(sched *s, sched_seq *q, int n)
{
    for (;;) {
        llm_status st = kv_seq_reserve(s->kv, &q->kv, n);
        if (st != LLM_ERR_KV_FULL || !preempt_for(s, q))
            return st;
    }
}

/* Admits waiting sequences in urgency order while budget, the sequence
 * limit and the KV pool allow. Stops at the first that does not fit, so a
 * large request is not overtaken forever by small ones. */
static void plan_admit(sched *s)
{
    if (s->n_waiting > 1)
        qsort(s->waiting, (size_t)s->n_waiting, sizeof *s->waiting, urgency_cmp);
    for (int i = 0; i < s->n_waiting;) {
        sched_seq *q = s->waiting[i];
        int budget = s->cfg.max_batch_tokens - s->n_rows, fork = fork_state(q);
        if (budget < 1)
            return;
        if (fork < 0 || q->oom || !admits(s, q)) { /* (its sibling first; logit rows short) */
            i++;
            continue;
        }
        if (s->n_running == s->cfg.max_seqs && !preempt_for(s, q))
            return;
        int forked, hit = attach(s, q, fork, &forked);
        int n = chunk_of(s, q, q->n_tokens - q->kv.n_tokens);
        if (n < 1) { /* a preemption for it left fewer logit rows (it took a slot's row) */
            kv_seq_release(s->kv, &q->kv);
            i++;
            continue;
        }
        llm_status st = admit_reserve(s, q, n);
        if (st) {
            kv_seq_release(s->kv, &q->kv); /* its matched blocks stay cached */
            if (st != LLM_ERR_NOMEM)
                return;
            mark_oom(s, q); /* the others may still fit */
            i++;
            continue;
        }
        count_admission(s, q, hit, forked);
        list_remove(s->waiting, &s->n_waiting, q);
        s->running[s->n_running++] = q;
        q->state = SCHED_RUNNING;
        q->admitted = 1;
        plan_add(s, q, n);
    }
}

/* How many of a decoding item's proposals fit in what the plan left:
 * rows, logit rows, the step's draft rows, and free blocks beyond one per
 * running sequence (proposals never make another sequence wait for K/V). */
static int draft_fit(const sched *s, const sched_item *it, int drafted)
{
    int k = it->seq->n_draft, left[3] = {s->cfg.max_batch_tokens - s->n_rows,
                                         s->cfg.max_logits + s->cfg.max_draft_rows - s->n_logits,
                                         s->cfg.max_draft_rows - drafted};
    for (int j = 0; j < 3; j++) k = left[j] < k ? left[j] : k;
    if (k < 1)
        return 0;
    int need = kv_seq_blocks_needed(s->kv, &it->seq->kv, 1 + k);
    return need == 0 || need + s->n_running <= kv_cache_available(s->kv) ? k : 0;
}

int sched_plan_drafts(sched *s)
{
    int drafted = 0;
    for (int i = 0; i < s->n_items && drafted < s->cfg.max_draft_rows; i++) {
        sched_item *it = &s->items[i];
        int k = sched_item_decodes(it) && !it->seq->all_logits ? draft_fit(s, it, drafted) : 0;
        if (k < 1 || kv_seq_reserve(s->kv, &it->seq->kv, 1 + k) != LLM_OK)
            continue; /* (a failed reserve changes nothing) */
        it->n = 1 + k;
        it->n_commit = 1; /* the caller raises it to the guesses it takes */
        it->n_draft = k;
        it->logit_rows += k;
        s->n_rows += k;
        s->n_logits += k;
        drafted += k;
    }
    return drafted;
}

int sched_plan(sched *s)
{
    s->n_items = s->n_rows = s->n_logits = 0;
    if (s->n_running > 1)
        qsort(s->running, (size_t)s->n_running, sizeof *s->running, urgency_cmp);
    plan_running(s, 1);
    plan_running(s, 0);
    plan_admit(s);
    return s->n_items;
}

void sched_commit(sched *s)
{
    for (int i = 0; i < s->n_items; i++) {
        sched_item *it = &s->items[i];
        LLM_ASSERT(it->n_commit >= 1 && it->n_commit <= it->n); /* else K/V of refused guesses would stand */
        kv_seq_commit(s->kv, &it->seq->kv, it->seq->tokens, it->n_commit);
        if (it->n_commit < it->n) /* blocks of refused guesses alone go back: they would sit unaccounted for (the
                                   * local pool is sized for a step's rows, not for rows kept between steps) */
            kv_seq_truncate(s->kv, &it->seq->kv, it->seq->kv.n_tokens);
        it->seq->in_plan = 0;
    }
}

void sched_abort(sched *s)
{
    for (int i = 0; i < s->n_items; i++) s->items[i].seq->in_plan = 0;
    s->n_items = s->n_rows = s->n_logits = 0;
}
