/* test_scheduler.c - the continuous-batching policy without a model: a
 * simulated step loop generates a token per sampled sequence, and the
 * tests check decode-first budgets, chunked prefill, priorities and aging,
 * preemption under KV pressure, forks for n > 1 and prefix-cache hits. */
#include "testutil.h"

#include "llm/scheduler.h"

enum { MAXTOK = 256 };

typedef struct sim_seq {
    sched_seq q;
    int32_t toks[MAXTOK];
    int want;       /* tokens to generate */
    int gen;
    int first_step; /* step that produced its first token, -1 before */
    int done_step;
} sim_seq;

typedef struct sim {
    llm_backend *b;
    kv_cache *kv;
    sched s;
    int step;
} sim;

static void sim_init(sim *m, int n_blocks, int max_seqs, int budget)
{
    llm_error err = {0};
    memset(m, 0, sizeof *m);
    assert_int_equal(llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 1, .force_scalar = 0, .kernels = NULL}, &m->b, &err), LLM_OK);
    kv_cache_config kc = {.block_size = 4, .type = LLM_KV_F32, .n_blocks = n_blocks, .prefix_cache = 1};
    assert_int_equal(kv_cache_new(&kc, m->b, 1, 1, 32, &m->kv, &err), LLM_OK);
    sched_config sc = {.max_seqs = max_seqs, .max_batch_tokens = budget, .aging_ms = 1000, .max_logits = max_seqs + 5}; /* 5 logit rows beyond one per sequence */
    assert_int_equal(sched_init(&m->s, &sc, m->kv, &err), LLM_OK);
}

static void sim_free(sim *m)
{
    kv_cache_stats st;
    assert_int_equal(m->s.n_running + m->s.n_waiting, 0);
    kv_cache_get_stats(m->kv, &st);
    assert_int_equal(st.used, 0); /* nothing leaked */
    sched_free(&m->s);
    kv_cache_free(m->kv);
    llm_backend_free(m->b);
}

static void seq_make(sim_seq *x, const int32_t *prompt, int n, int want, int prio, int64_t t)
{
    memset(x, 0, sizeof *x);
    memcpy(x->toks, prompt, sizeof(int32_t) * (size_t)n);
    x->q.tokens = x->toks;
    x->q.n_tokens = x->q.n_prompt = n;
    x->q.priority = prio;
    x->q.arrival_ms = t;
    x->q.user = x;
    x->want = want;
    x->first_step = x->done_step = -1;
}

/* One engine step: plan, check the plan's invariants, commit, then give
 * every sampled sequence its next token. Returns the plan's size. */
static int sim_step(sim *m)
{
    int n = sched_plan(&m->s), logit_rows = 0;
    assert_true(m->s.n_rows <= m->s.cfg.max_batch_tokens);
    assert_true(m->s.n_running <= m->s.cfg.max_seqs);
    for (int i = 0; i < n; i++) {
        const sched_item *it = &m->s.items[i];
        assert_int_equal(it->pos0, it->seq->kv.n_tokens);
        assert_true(it->n >= 1);
        assert_true(it->seq->kv.n_blocks * 4 >= it->pos0 + it->n); /* room reserved */
        int end = it->pos0 + it->n < it->seq->n_prompt - 1 ? it->pos0 + it->n : it->seq->n_prompt - 1;
        logit_rows += (it->seq->all_logits && end > it->pos0 ? end - it->pos0 : 0) + it->logits + it->n_draft;
    }
    assert_true(logit_rows <= m->s.cfg.max_logits);
    kv_cache_copies_done(m->kv);
    sched_commit(&m->s);
    for (int i = 0; i < n; i++) {
        const sched_item *it = &m->s.items[i];
        sim_seq *x = it->seq->user;
        if (!it->logits)
            continue;
        if (x->first_step < 0)
            x->first_step = m->step;
        x->toks[x->q.n_tokens] = (int32_t)(x->q.n_tokens % 7);
        x->q.n_tokens++;
        if (++x->gen == x->want) {
            x->done_step = m->step;
            sched_remove(&m->s, &x->q);
        }
    }
    m->step++;
    return n;
}

static void run_all(sim *m)
{
    for (int guard = 0; m->s.n_running + m->s.n_waiting > 0; guard++) {
        assert_true(guard < 10000);
        sim_step(m);
    }
}

static int32_t P[200];

static void fill_prompts(void)
{
    for (int i = 0; i < 200; i++) P[i] = 100 + i;
}

/* Decoding never waits behind a long prompt: it is prefilled in chunks
 * that use what the decode tokens leave of the budget. */
static void test_chunked_prefill(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 128, 8, 16);
    sim_seq a, b, c;
    seq_make(&a, P, 3, 40, 0, 0);
    seq_make(&b, P + 10, 3, 40, 0, 0);
    assert_int_equal(sched_add(&m.s, &a.q), LLM_OK);
    assert_int_equal(sched_add(&m.s, &b.q), LLM_OK);
    sim_step(&m); /* both prefill and sample */
    seq_make(&c, P + 50, 100, 5, 0, 1);
    assert_int_equal(sched_add(&m.s, &c.q), LLM_OK);
    for (int k = 0; k < 8; k++) { /* 100 prompt tokens at 14 per step */
        assert_int_equal(sim_step(&m), 3);
        assert_int_equal(m.s.n_rows, k < 7 ? 16 : 2 + 100 - 7 * 14); /* 2 decode + the chunk */
        assert_true(a.gen == k + 2 && b.gen == k + 2);
    }
    assert_int_equal(c.first_step, 8);
    run_all(&m);
    assert_true(a.done_step > 0 && b.done_step > 0 && c.done_step > 0);
    sim_free(&m);
}

/* Prompts whose every row needs a logits row (prompt logprobs) are cut
 * so that a step's logit rows stay within max_logits (13 here: 8
 * sequences + 5) whatever comes after them (sim_step checks the sum every
 * step), read no cached prefix, and start only with a real chunk (the 5
 * rows, or all they have left) rather than hold a slot a row a step; a
 * plain prompt beside them takes the rest of the budget as before; all
 * finish. Where max_batch_tokens is
 * max_seqs (and so max_logits), a step of such a prompt alone takes the
 * whole budget: its rows are all the logit rows there can be. */
static void test_all_logits_prompts(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 256, 8, 16);
    sim_seq warm, a, b, c;
    seq_make(&warm, P, 40, 1, 0, 0); /* caches P's first blocks */
    assert_int_equal(sched_add(&m.s, &warm.q), LLM_OK);
    run_all(&m);
    seq_make(&a, P, 40, 3, 0, 1);
    seq_make(&b, P + 100, 12, 3, 0, 1);
    seq_make(&c, P + 150, 30, 3, 0, 1);
    a.q.all_logits = a.q.no_reuse = b.q.all_logits = b.q.no_reuse = 1;
    assert_int_equal(sched_add(&m.s, &a.q), LLM_OK);
    assert_int_equal(sched_add(&m.s, &b.q), LLM_OK);
    assert_int_equal(sched_add(&m.s, &c.q), LLM_OK);
    sim_step(&m);
    assert_int_equal(m.s.n_items, 2);
    assert_int_equal(m.s.items[0].n, 6); /* 13 - 7 rows kept for the 7 sequences that may follow */
    assert_int_equal(m.s.items[1].seq, &c.q); /* b would get 1 row of its 11, under the 5 a step gives: it waits */
    assert_int_equal(m.s.items[1].n, 10);     /* the plain prompt: the budget's rest */
    assert_int_equal(b.q.state, SCHED_WAITING);
    assert_int_equal(a.q.cached_tokens, 0); /* no_reuse: P's cached blocks are not read */
    run_all(&m);
    assert_true(a.done_step > 0 && b.done_step > 0 && c.done_step > 0);
    sim_free(&m);
    sim_init(&m, 256, 4, 4);
    seq_make(&a, P, 40, 3, 0, 0);
    a.q.all_logits = a.q.no_reuse = 1;
    assert_int_equal(sched_add(&m.s, &a.q), LLM_OK);
    sim_step(&m);
    assert_int_equal(m.s.items[0].n, 4);
    run_all(&m);
    assert_true(a.done_step > 0);
    sim_free(&m);
}

/* Under saturation a later, higher-priority request starts before the
 * lower-priority ones waiting since before it, and takes a running slot
 * from the least urgent. */
static void test_priority(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 256, 2, 64);
    sim_seq lo[5], hi;
    for (int i = 0; i < 5; i++) {
        seq_make(&lo[i], P + i, 8, 30, 0, i);
        assert_int_equal(sched_add(&m.s, &lo[i].q), LLM_OK);
    }
    sim_step(&m);
    sim_step(&m);
    seq_make(&hi, P + 100, 8, 5, 5, 10);
    assert_int_equal(sched_add(&m.s, &hi.q), LLM_OK);
    run_all(&m);
    assert_int_equal(hi.first_step, 2); /* admitted at once by preemption */
    assert_true(m.s.stats.preemptions >= 1);
    for (int i = 2; i < 5; i++) assert_true(lo[i].first_step > hi.first_step);
    assert_true(lo[1].q.n_preempted == 1); /* the newest running low one made room */
    for (int i = 0; i < 5; i++) assert_int_equal(lo[i].gen, 30);
    sim_free(&m);
}

/* Aging: a priority-1 request arriving 5 s after a priority-0 one counts
 * as 4 s later, so the old one goes first and nothing starves. */
static void test_aging(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 256, 1, 64);
    sim_seq run, old, young;
    seq_make(&run, P, 4, 3, 9, 0);
    assert_int_equal(sched_add(&m.s, &run.q), LLM_OK);
    sim_step(&m);
    seq_make(&old, P + 20, 4, 3, 0, 0);
    seq_make(&young, P + 40, 4, 3, 1, 5000);
    assert_int_equal(sched_add(&m.s, &young.q), LLM_OK);
    assert_int_equal(sched_add(&m.s, &old.q), LLM_OK);
    run_all(&m);
    assert_true(old.first_step < young.first_step);
    assert_int_equal(m.s.stats.preemptions, 0); /* no preemption of the more urgent running one */
    sim_free(&m);
}

/* A pool too small for everyone: the least urgent running sequence is
 * preempted, recomputed later, and every sequence completes. */
static void test_kv_preemption(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 12, 8, 64);
    sim_seq x[4];
    for (int i = 0; i < 4; i++) {
        seq_make(&x[i], P + 30 * i, 6, 14, 0, i);
        assert_int_equal(sched_add(&m.s, &x[i].q), LLM_OK);
    }
    run_all(&m);
    assert_true(m.s.stats.preemptions > 0);
    assert_int_equal(x[0].q.n_preempted, 0); /* the oldest is never the victim */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(x[i].gen, 14);
        for (int k = 0; k < 14; k++) assert_int_equal(x[i].toks[6 + k], (6 + k) % 7); /* tokens intact */
    }
    assert_true(m.s.stats.recomputed_tokens > 0);
    sim_free(&m);
}

/* n > 1: siblings wait for the first one's prompt, then share its blocks
 * and compute only the last prompt token themselves. */
static void test_fork(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 64, 8, 8);
    sim_seq a, b, c;
    seq_make(&a, P, 18, 4, 0, 0);
    seq_make(&b, P, 18, 4, 0, 0);
    seq_make(&c, P, 18, 4, 0, 0);
    b.q.fork_of = c.q.fork_of = &a.q;
    assert_int_equal(sched_add(&m.s, &a.q), LLM_OK);
    assert_int_equal(sched_add(&m.s, &b.q), LLM_OK);
    assert_int_equal(sched_add(&m.s, &c.q), LLM_OK);
    assert_int_equal(sim_step(&m), 1); /* only a: 8 of 18 */
    assert_int_equal(sim_step(&m), 1);
    assert_int_equal(sim_step(&m), 1); /* a done with its prompt, samples */
    assert_int_equal(a.first_step, 2);
    assert_int_equal(sim_step(&m), 3); /* a decodes, b and c fork and compute 1 token */
    assert_int_equal(m.s.stats.forked_tokens, 34);
    assert_int_equal(b.q.kv.blocks[0], a.q.kv.blocks[0]);
    assert_true(b.q.kv.blocks[4] != a.q.kv.blocks[4]); /* position 17's block was copied */
    assert_int_equal(b.first_step, 3);
    run_all(&m);
    sim_free(&m);
}

/* A second request with the same prefix gets its full blocks from the
 * cache and prefills only the rest. */
static void test_prefix_hits(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 64, 4, 64);
    sim_seq a, b;
    seq_make(&a, P, 30, 2, 0, 0);
    assert_int_equal(sched_add(&m.s, &a.q), LLM_OK);
    run_all(&m);
    int32_t pb[34];
    memcpy(pb, P, sizeof(int32_t) * 30);
    for (int i = 30; i < 34; i++) pb[i] = 5;
    seq_make(&b, pb, 34, 2, 0, 1);
    assert_int_equal(sched_add(&m.s, &b.q), LLM_OK);
    assert_int_equal(sim_step(&m), 1);
    assert_int_equal(b.q.cached_tokens, 28);
    assert_int_equal(m.s.stats.cached_tokens, 28);
    assert_int_equal(b.first_step, m.step - 1);
    run_all(&m);
    sim_free(&m);
}

/* A sequence that waits for blocks across many plans counts its prompt
 * and its cache hits once, when it is admitted: the hit rate stays a
 * ratio of admitted tokens. */
static void test_stats_count_once(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 10, 4, 64); /* 40 tokens of KV: a and b do not fit together */
    sim_seq a, b;
    seq_make(&a, P, 30, 8, 0, 0);
    int32_t pb[30];
    memcpy(pb, P, sizeof pb);
    for (int i = 8; i < 30; i++) pb[i] = 7; /* shares a's first two blocks */
    seq_make(&b, pb, 30, 2, 0, 1);
    assert_int_equal(sched_add(&m.s, &a.q), LLM_OK);
    assert_int_equal(sched_add(&m.s, &b.q), LLM_OK);
    for (int i = 0; i < 4; i++) sim_step(&m); /* b is turned away every time */
    assert_int_equal(b.q.state, SCHED_WAITING);
    run_all(&m);
    assert_int_equal(m.s.stats.prompt_tokens, 60);
    assert_int_equal(b.q.cached_tokens, 8);
    assert_int_equal(m.s.stats.cached_tokens, 8);
    sim_free(&m);
}

/* A preemption when the waiting list is exactly at its first capacity
 * (64 waiting, one running, a higher priority arriving): the preempted
 * sequence goes back without an allocation and nothing aborts (the list
 * used to be sized for the waiting ones only). */
static void test_preempt_full_waiting_list(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 256, 1, 64);
    static sim_seq low, high[64];
    seq_make(&low, P, 4, 50, 0, 0);
    assert_int_equal(sched_add(&m.s, &low.q), LLM_OK);
    sim_step(&m); /* low runs alone (max_seqs 1) */
    assert_int_equal(low.q.state, SCHED_RUNNING);
    for (int i = 0; i < 64; i++) {
        seq_make(&high[i], P + i, 4, 1, 1, 0);
        assert_int_equal(sched_add(&m.s, &high[i].q), LLM_OK);
    }
    assert_int_equal(m.s.n_waiting, 64);
    sim_step(&m); /* high priority preempts low onto a waiting list of 64 */
    assert_int_equal(low.q.state, SCHED_WAITING);
    assert_int_equal(m.s.n_waiting, 64);
    run_all(&m);
    sim_free(&m);
}

/* Removing a waiting or running sequence frees its blocks at once. */
static void test_remove(void **st)
{
    (void)st;
    sim m;
    sim_init(&m, 32, 1, 64);
    sim_seq a, b;
    seq_make(&a, P, 10, 50, 0, 0);
    seq_make(&b, P + 50, 10, 50, 0, 1);
    assert_int_equal(sched_add(&m.s, &a.q), LLM_OK);
    assert_int_equal(sched_add(&m.s, &b.q), LLM_OK);
    sim_step(&m);
    kv_cache_stats cs;
    kv_cache_get_stats(m.kv, &cs);
    assert_int_equal(cs.used, 3);
    sched_remove(&m.s, &a.q);
    sched_remove(&m.s, &b.q);
    kv_cache_get_stats(m.kv, &cs);
    assert_int_equal(cs.used, 0);
    sim_free(&m);
}

/* Guesses (sched_seq.n_draft) take what the plan leaves: decoding items
 * grow by them up to max_draft_rows, most urgent first; a step whose
 * budget a prompt fills takes none; sched_commit keeps n_commit rows (1
 * unless raised) and gives back blocks holding only refused guesses;
 * guesses never preempt (a pool too tight for them leaves them out). */
/* test_drafts' set-up: a and b (n_prompt tokens, want to generate, a's
 * priority a_prio) past their prompts in a pool of n_blocks, each then
 * with 5 guesses, and both planned to decode. */
static void drafts_start(sim *m, int n_blocks, sim_seq *a, sim_seq *b, int n_prompt, int want, int a_prio)
{
    sim_init(m, n_blocks, 4, 16);
    m->s.cfg.max_draft_rows = 6;
    m->s.cfg.max_logits = 16;
    seq_make(a, P, n_prompt, want, a_prio, 0);
    seq_make(b, P + 20, n_prompt, want, 0, 0);
    assert_int_equal(sched_add(&m->s, &a->q), LLM_OK);
    assert_int_equal(sched_add(&m->s, &b->q), LLM_OK);
    sim_step(m); /* prefill and first tokens */
    a->q.n_draft = b->q.n_draft = 5;
    assert_int_equal(sched_plan(&m->s), 2);
}

/* Drops the plan and the guesses, runs everything out, frees the sim. */
static void drafts_end(sim *m, sim_seq *a, sim_seq *b)
{
    sched_abort(&m->s);
    a->q.n_draft = b->q.n_draft = 0;
    run_all(m);
    sim_free(m);
}

static void test_drafts(void **st)
{
    (void)st;
    sim m;
    sim_seq a, b, c;
    drafts_start(&m, 64, &a, &b, 5, 40, 1);
    assert_int_equal(sched_plan_drafts(&m.s), 6);
    assert_ptr_equal(m.s.items[0].seq, &a.q); /* the more urgent one first: 5 guesses, the other the 1 left */
    assert_int_equal(m.s.items[0].n, 6);
    assert_int_equal(m.s.items[0].n_draft, 5);
    assert_int_equal(m.s.items[1].n_draft, 1);
    assert_int_equal(m.s.n_rows, 8);
    assert_int_equal(m.s.n_logits, 8);
    int a0 = a.q.kv.n_tokens, b0 = b.q.kv.n_tokens;
    m.s.items[0].n_commit = 3; /* its last token and two guesses taken */
    kv_cache_copies_done(m.kv);
    sched_commit(&m.s);
    assert_int_equal(a.q.kv.n_tokens, a0 + 3);
    assert_int_equal(b.q.kv.n_tokens, b0 + 1); /* its guess refused */
    assert_true(a.q.kv.n_blocks <= a.q.kv.n_tokens / 4 + 1 && b.q.kv.n_blocks <= b.q.kv.n_tokens / 4 + 1);
    a.q.n_tokens += 3; /* (the picks) */
    b.q.n_tokens += 1;
    seq_make(&c, P + 50, 100, 5, 0, 1); /* a prompt that fills what decoding leaves */
    assert_int_equal(sched_add(&m.s, &c.q), LLM_OK);
    assert_int_equal(sched_plan(&m.s), 3);
    assert_int_equal(sched_plan_drafts(&m.s), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(m.s.items[i].n_draft, 0);
    assert_int_equal(m.s.n_rows, 16);
    drafts_end(&m, &a, &b);
    /* a pool with a block per running sequence to spare at most: no guesses, no preemption */
    drafts_start(&m, 6, &a, &b, 7, 3, 0);
    assert_int_equal(sched_plan_drafts(&m.s), 0);
    assert_int_equal(m.s.items[0].n_draft + m.s.items[1].n_draft, 0);
    assert_int_equal(m.s.stats.preemptions, 0);
    drafts_end(&m, &a, &b);
}

int main(void)
{
    fill_prompts();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_drafts),
        cmocka_unit_test(test_chunked_prefill), cmocka_unit_test(test_priority),
        cmocka_unit_test(test_aging),           cmocka_unit_test(test_kv_preemption),
        cmocka_unit_test(test_fork),            cmocka_unit_test(test_prefix_hits), cmocka_unit_test(test_stats_count_once),
        cmocka_unit_test(test_preempt_full_waiting_list),
        cmocka_unit_test(test_remove),          cmocka_unit_test(test_all_logits_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
