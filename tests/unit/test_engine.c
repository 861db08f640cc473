/* test_engine.c - the serving engine end to end on real models: batching,
 * chunking, preemption and the prefix cache change no output (greedy
 * tokens equal those of each request alone and of a plain session); n > 1
 * completions equal separate requests with their seeds; cancellation frees
 * blocks at once; priorities cut time to first token; bad requests and a
 * full queue fail with clear errors and change nothing; stop strings and
 * text; embeddings (mean and last pooling) equal a direct pass over the
 * whole prompt bit for bit under batching, chunking and preemption. Every
 * test ends with the KV pool fully free. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>

#include "testutil.h"

#include "llm/engine.h"
#include "llm/forward.h"
#include "llm/kv_cache.h"
#include "llm/lora.h"
#include "llm/mkmodel.h"

static llm_model *g_tiny;   /* synthetic "tiny" Q8_0: quantized kernels, 8-token tiles */
static llm_model *g_story;  /* stories260K (real vocabulary), NULL when ../shared is absent */
static llm_backend *g_b;
static char g_path[256];

static int setup(void **st)
{
    (void)st;
    llm_error err = {0};
    test_tmpfile("engine-tiny", g_path, sizeof g_path);
    if (llm_mkmodel(llm_shape_find("tiny"), QT_Q8_0, 11, g_path, &err) || llm_model_load(g_path, &g_tiny, &err) ||
        llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 2, .force_scalar = 0, .kernels = NULL}, &g_b, &err))
        return -1;
    char buf[512];
    const char *p = shared_path("models/stories260K.gguf", buf, sizeof buf);
    if (p && llm_model_load(p, &g_story, &err))
        return -1;
    return 0;
}

static int teardown(void **st)
{
    (void)st;
    llm_model_free(g_tiny);
    llm_model_free(g_story);
    llm_backend_free(g_b);
    remove(g_path);
    return 0;
}

static llm_engine *open_engine(const llm_model *m, llm_engine_config c)
{
    llm_error err = {0};
    llm_engine *e = NULL;
    c.model = m;
    c.backend = g_b;
    if (llm_engine_open(&c, &e, &err))
        fail_msg("engine open: %s", err.msg);
    return e;
}

/* Closes after checking that no block is still referenced. */
static void close_engine(llm_engine *e)
{
    llm_stats s;
    llm_engine_stats(e, &s);
    assert_int_equal(s.kv_blocks_used, 0);
    assert_int_equal(s.running + s.waiting, 0);
    llm_engine_close(e);
}

enum { MAXGEN = 160 };

typedef struct result {
    int32_t tok[LLM_MAX_N][MAXGEN];
    int n_tok[LLM_MAX_N];
    char text[LLM_MAX_N][2048];
    size_t text_len[LLM_MAX_N];
    llm_finish finish[LLM_MAX_N];
    llm_usage usage[LLM_MAX_N];
} result;

/* Reads every event of id into r (completions by index). */
static void collect(llm_engine *e, llm_request_id id, int n, result *r)
{
    memset(r, 0, sizeof *r);
    for (int done = 0; done < n;) {
        llm_event ev;
        llm_status st = llm_engine_next(e, id, &ev, 60000);
        if (st)
            fail_msg("next: %s", llm_status_str(st));
        if (ev.type == LLM_EVENT_ERROR)
            fail_msg("request failed: %s", ev.error.msg);
        int i = ev.index;
        if (ev.type == LLM_EVENT_TOKEN) {
            assert_true(r->n_tok[i] < MAXGEN);
            r->tok[i][r->n_tok[i]++] = ev.token;
        }
        assert_true(r->text_len[i] + ev.text_len < sizeof r->text[i]);
        memcpy(r->text[i] + r->text_len[i], ev.text, ev.text_len);
        r->text_len[i] += ev.text_len;
        if (ev.type == LLM_EVENT_DONE) {
            r->finish[i] = ev.finish;
            r->usage[i] = ev.usage;
            done++;
        }
        llm_event_clear(&ev);
    }
    llm_event ev;
    assert_int_equal(llm_engine_next(e, id, &ev, 0), LLM_ERR_NOT_FOUND); /* gone after its last event */
}

static llm_request_id submit(llm_engine *e, const llm_request *rq)
{
    llm_error err = {0};
    llm_request_id id = 0;
    if (llm_engine_submit(e, rq, &id, &err))
        fail_msg("submit: %s", err.msg);
    return id;
}

/* Prompt k of a family: distinct lengths (5..40) and contents. */
static int make_prompt(const llm_model *m, int k, int32_t *p)
{
    int n = 5 + (k * 7) % 36;
    uint64_t s = 1000 + (uint64_t)k;
    for (int i = 0; i < n; i++) p[i] = (int32_t)(test_rng(&s) % (uint64_t)m->hp.n_vocab);
    return n;
}

static llm_request greedy(const int32_t *p, int n, int max_tokens)
{
    llm_request rq = {.tokens = p, .n_tokens = n, .sampling = llm_sampling_default(), .max_tokens = max_tokens,
                      .ignore_eos = 1};
    return rq;
}

enum { NP = 32, GEN = 40 };

/* Greedy tokens of every prompt alone (one request at a time), K/V kv. */
static void alone(const llm_model *m, llm_kv_type kv, result *ref)
{
    llm_engine *e = open_engine(m, (llm_engine_config){.n_ctx = 128, .kv_type = kv});
    for (int k = 0; k < NP; k++) {
        int32_t p[64];
        int n = make_prompt(m, k, p);
        llm_request rq = greedy(p, n, GEN);
        collect(e, submit(e, &rq), 1, &ref[k]);
        assert_int_equal(ref[k].n_tok[0], GEN);
    }
    close_engine(e);
}

/* All prompts at once; returns the engine's stats at the end. */
static void together(const llm_model *m, llm_engine_config c, const result *ref, llm_stats *out)
{
    llm_engine *e = open_engine(m, c);
    llm_request_id ids[NP];
    int32_t p[NP][64];
    for (int k = 0; k < NP; k++) {
        int n = make_prompt(m, k, p[k]);
        llm_request rq = greedy(p[k], n, GEN);
        ids[k] = submit(e, &rq);
    }
    static result r;
    for (int k = 0; k < NP; k++) {
        collect(e, ids[k], 1, &r);
        assert_int_equal(r.n_tok[0], GEN);
        if (memcmp(r.tok[0], ref[k].tok[0], sizeof(int32_t) * GEN))
            fail_msg("prompt %d: batched output differs from its output alone", k);
    }
    llm_engine_stats(e, out);
    close_engine(e);
}

static void check_batching(const llm_model *m)
{
    static result ref[NP];
    alone(m, LLM_KV_F16, ref);
    /* a plain session (one sequence, whole-prompt batch) agrees too */
    llm_session *s;
    llm_error err = {0};
    assert_int_equal(llm_session_new(m, g_b, &(llm_session_config){.n_ctx = 128, .max_batch = 512, .kv_type = LLM_KV_F16}, &s, &err), LLM_OK);
    for (int k = 0; k < 4; k++) {
        int32_t p[64];
        int n = make_prompt(m, k, p);
        llm_session_reset(s);
        const float *lg;
        assert_int_equal(llm_session_eval(s, p, n, &lg, &err), LLM_OK);
        for (int i = 0; i < GEN; i++) {
            int32_t best = 0;
            for (int v = 1; v < m->hp.n_vocab; v++) best = lg[v] > lg[best] ? v : best;
            assert_int_equal(best, ref[k].tok[0][i]);
            assert_int_equal(llm_session_eval(s, &best, 1, &lg, &err), LLM_OK);
        }
    }
    llm_session_free(s);
    llm_stats st;
    together(m, (llm_engine_config){.n_ctx = 128}, ref, &st);
    print_message("32 together: %llu steps, %llu preemptions\n", (unsigned long long)st.steps,
                  (unsigned long long)st.preemptions);
    assert_true(st.steps < NP * GEN / 4); /* really batched */
    /* chunked prefill (8 tokens a step) and a pool of 12 blocks (2 sequences
     * of 96 tokens): preemption and recompute all the way */
    size_t blk = kv_cache_block_bytes(LLM_KV_F16, 16, m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim);
    together(m, (llm_engine_config){.n_ctx = 96, .max_seqs = 8, .max_batch_tokens = 8, .kv_cache_bytes = 12 * blk}, ref, &st);
    print_message("tiny pool: %llu steps, %llu preemptions\n", (unsigned long long)st.steps,
                  (unsigned long long)st.preemptions);
    assert_true(st.preemptions > 0);
}

static void test_batching_tiny(void **st)
{
    (void)st;
    check_batching(g_tiny);
}

/* Q8_0 K/V (on the avx512 set: integer scores, the query rounded): 32
 * prompts decoding at once (an attention item per sequence over every
 * KV head) equal each alone (items per KV head, every row converted or
 * read in place by the same rule). */
static void test_batching_q8_kv(void **st)
{
    (void)st;
    static result ref[NP];
    alone(g_tiny, LLM_KV_Q8_0, ref);
    llm_stats s;
    together(g_tiny, (llm_engine_config){.n_ctx = 128, .kv_type = LLM_KV_Q8_0}, ref, &s);
    assert_true(s.steps < NP * GEN / 4); /* really batched */
}

static void test_batching_stories(void **st)
{
    (void)st;
    if (!g_story) {
        print_message("skipped: ../shared/models/stories260K.gguf not present\n");
        skip();
    }
    check_batching(g_story);
}


/* A second request with the same long prefix computes only the new
 * tokens; its output equals the uncached output. */
static void test_prefix_cache(void **st)
{
    (void)st;
    const llm_model *m = g_tiny;
    int32_t a[140], b[140];
    uint64_t seed = 5;
    for (int i = 0; i < 140; i++) a[i] = b[i] = (int32_t)(test_rng(&seed) % (uint64_t)m->hp.n_vocab);
    for (int i = 120; i < 140; i++) b[i] = (int32_t)((b[i] + 1) % m->hp.n_vocab); /* shared prefix: 120 tokens */
    static result ra, rb, rb_cold;
    llm_engine *cold = open_engine(m, (llm_engine_config){.n_ctx = 256, .no_prefix_cache = 1});
    llm_request rq = greedy(b, 140, 20);
    collect(cold, submit(cold, &rq), 1, &rb_cold);
    close_engine(cold);
    llm_engine *e = open_engine(m, (llm_engine_config){.n_ctx = 256});
    rq = greedy(a, 140, 20);
    collect(e, submit(e, &rq), 1, &ra);
    llm_stats s0, s1;
    llm_engine_stats(e, &s0);
    rq = greedy(b, 140, 20);
    collect(e, submit(e, &rq), 1, &rb);
    llm_engine_stats(e, &s1);
    assert_int_equal(rb.usage[0].cached_tokens, 112); /* 7 whole blocks of the 120 shared tokens */
    assert_int_equal(s1.cached_tokens - s0.cached_tokens, 112);
    /* computed: 28 prompt tokens + 19 decode steps (the 20th token needs none) */
    assert_int_equal(s1.computed_tokens - s0.computed_tokens, 140 - 112 + 19);
    assert_memory_equal(rb.tok[0], rb_cold.tok[0], sizeof(int32_t) * 20);
    assert_true(s1.prefix_hit_rate > 0.39 && s1.prefix_hit_rate < 0.41); /* 112 of 280 */
    assert_int_equal(s1.generated_tokens - s0.generated_tokens, 20);
    assert_int_equal(s1.requests_done - s0.requests_done, 1);
    assert_true(s1.gen_tokens_per_s > 0); /* measured over the last seconds */
    assert_int_equal(s1.kv_block_size, 16);
    assert_true(s1.kv_blocks_cached > 0 && s1.kv_blocks_used == 0);
    close_engine(e);
}

/* Cancel in the middle of generation frees the request's blocks before it
 * returns; the id is gone. */
static void test_cancel(void **st)
{
    (void)st;
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 512});
    int32_t p[64];
    int n = make_prompt(g_tiny, 3, p);
    llm_request rq = greedy(p, n, 400);
    llm_request_id id = submit(e, &rq), other = submit(e, &rq);
    llm_event ev;
    for (int i = 0; i < 5; i++) {
        assert_int_equal(llm_engine_next(e, id, &ev, 60000), LLM_OK);
        assert_int_equal(ev.type, LLM_EVENT_TOKEN);
        llm_event_clear(&ev);
    }
    llm_stats s;
    llm_engine_stats(e, &s);
    assert_true(s.kv_blocks_used > 0);
    llm_engine_cancel(e, id);
    llm_engine_cancel(e, other); /* never read: cancel works at any point */
    llm_engine_stats(e, &s);
    assert_int_equal(s.kv_blocks_used, 0);
    assert_int_equal(llm_engine_next(e, id, &ev, 0), LLM_ERR_NOT_FOUND);
    llm_engine_cancel(e, id); /* twice: ignored */
    llm_engine_cancel(e, 12345);
    close_engine(e);
}

/* Under saturation (2 running at once) a high-priority request that
 * arrives last gets its first token before the low-priority requests that
 * arrived earlier and were still waiting. */
static void test_priority(void **st)
{
    (void)st;
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 256, .max_seqs = 2});
    enum { NL = 6 };
    int32_t p[NL + 1][64];
    llm_request_id lo[NL];
    for (int k = 0; k < NL; k++) {
        int n = make_prompt(g_tiny, k, p[k]);
        llm_request rq = greedy(p[k], n, 60);
        lo[k] = submit(e, &rq);
    }
    llm_event ev; /* the first two are running once they have a token */
    for (int k = 0; k < 2; k++) {
        assert_int_equal(llm_engine_next(e, lo[k], &ev, 60000), LLM_OK);
        llm_event_clear(&ev);
    }
    int n = make_prompt(g_tiny, 40, p[NL]);
    llm_request rq = greedy(p[NL], n, 5);
    rq.priority = 10;
    llm_request_id hi = submit(e, &rq);
    static result rh, rl;
    collect(e, hi, 1, &rh);
    for (int k = 0; k < NL; k++) {
        collect(e, lo[k], 1, &rl);
        print_message("low %d: ttft %.1f ms (high: %.1f ms)\n", k, rl.usage[0].ttft_ms, rh.usage[0].ttft_ms);
        if (k >= 2) /* these were waiting when the high one came */
            assert_true(rh.usage[0].ttft_ms < rl.usage[0].ttft_ms);
    }
    llm_stats s;
    llm_engine_stats(e, &s);
    assert_true(s.preemptions >= 1); /* it took a running slot */
    close_engine(e);
}

/* Bad requests fail with a message naming the field; nothing is queued. */
static void test_bad_requests(void **st)
{
    (void)st;
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 64, .max_waiting = 3, .max_seqs = 1});
    llm_error err = {0};
    llm_request_id id;
    int32_t p[100] = {0};
    llm_request rq = greedy(p, 10, 5);
    p[3] = g_tiny->hp.n_vocab;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "index 3"));
    p[3] = 0;
    rq = greedy(p, 70, 5);
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_TOO_LONG);
    rq = greedy(p, 30, 40);
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_TOO_LONG);
    assert_non_null(strstr(err.msg, "max_tokens 40"));
    rq = greedy(p, 10, 5);
    rq.n = 17;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    rq.n = 1;
    rq.sampling.top_p = 2;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "top_p"));
    rq.sampling.top_p = 1;
    const char *stops[] = {""};
    rq.stop = stops;
    rq.n_stop = 1;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    rq.n_stop = 0;
    rq.tokens = NULL;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    llm_stats s;
    llm_engine_stats(e, &s);
    assert_int_equal(s.waiting + s.running + s.requests, 0);
    /* the waiting limit: 1 running, 3 waiting, the next one fails fast */
    rq = greedy(p, 10, 50);
    llm_request_id ids[4];
    llm_event ev;
    ids[0] = submit(e, &rq);
    assert_int_equal(llm_engine_next(e, ids[0], &ev, 60000), LLM_OK); /* running */
    llm_event_clear(&ev);
    for (int i = 1; i < 4; i++) ids[i] = submit(e, &rq);
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_QUEUE_FULL);
    assert_non_null(strstr(err.msg, "limit is 3"));
    for (int i = 0; i < 4; i++) llm_engine_cancel(e, ids[i]);
    close_engine(e);
}

/* n > 1: completion i equals a separate request with seed + i, with the
 * prompt computed once and shared (forked, copy-on-write). */
static void test_n_completions(void **st)
{
    (void)st;
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 256});
    int32_t p[64];
    int n = make_prompt(g_tiny, 9, p);
    llm_request rq = greedy(p, n, 30);
    rq.sampling.temperature = 0.9f;
    rq.sampling.seed = 77;
    rq.n = 4;
    static result all, one;
    collect(e, submit(e, &rq), 4, &all);
    rq.n = 1;
    int distinct = 0;
    for (int i = 0; i < 4; i++) {
        rq.sampling.seed = 77 + (uint64_t)i;
        collect(e, submit(e, &rq), 1, &one);
        assert_int_equal(all.n_tok[i], 30);
        if (memcmp(all.tok[i], one.tok[0], sizeof(int32_t) * 30))
            fail_msg("completion %d of n=4 differs from a request with seed %d", i, 77 + i);
        distinct += i > 0 && memcmp(all.tok[i], all.tok[0], sizeof(int32_t) * 30) != 0;
    }
    assert_true(distinct > 0);
    llm_stats s;
    llm_engine_stats(e, &s);
    assert_true(s.cached_tokens >= (uint64_t)(3 * (n - 1))); /* the three siblings shared the prompt */
    close_engine(e);
}

/* A control token's text is left out of the output unless the request
 * shows it (a tool format's markers): BOS, forced by a bias, three times. */
static void test_shown_controls(void **st)
{
    (void)st;
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 64});
    int32_t p[64], bos = llm_vocab_bos(g_tiny->vocab);
    assert_true(bos >= 0 && llm_vocab_token_type(g_tiny->vocab, bos) == LLM_TOKEN_CONTROL);
    llm_logit_bias up = {bos, 100.0f};
    llm_request rq = greedy(p, make_prompt(g_tiny, 3, p), 3);
    rq.sampling.bias = &up;
    rq.sampling.n_bias = 1;
    static result hidden, shown;
    collect(e, submit(e, &rq), 1, &hidden);
    rq.shown[0] = bos;
    rq.n_shown = 1;
    collect(e, submit(e, &rq), 1, &shown);
    gguf_str t = llm_vocab_text(g_tiny->vocab, bos);
    char want[256];
    snprintf(want, sizeof want, "%.*s%.*s%.*s", (int)t.len, t.data, (int)t.len, t.data, (int)t.len, t.data);
    assert_int_equal(hidden.n_tok[0], 3);
    assert_int_equal(hidden.tok[0][0], bos);
    assert_int_equal(hidden.text_len[0], 0);
    assert_true(t.len > 0);
    assert_int_equal(shown.text_len[0], strlen(want));
    assert_memory_equal(shown.text[0], want, strlen(want));
    llm_error err = {0};
    llm_request_id id;
    rq.shown[0] = g_tiny->hp.n_vocab;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    rq.n_shown = LLM_MAX_SHOWN + 1;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    close_engine(e);
}

enum { NG = 6 };

/* NG constrained requests (each its own cache partition, a counted
 * repetition: every mask a walk) beside an unconstrained one, sampled at
 * temperature 1, all at once under mask_step_work; returns held picks. */
static uint64_t constrained_round(long budget, result *out)
{
    llm_engine *e = open_engine(g_story, (llm_engine_config){.n_ctx = 128, .max_seqs = 8, .mask_step_work = budget});
    static const char *g = "root ::= [a-z ]{1,40} \".\"\n";
    int32_t p[NG + 1][64];
    llm_request_id ids[NG + 1];
    for (int k = 0; k <= NG; k++) {
        llm_request rq = greedy(p[k], make_prompt(g_story, k, p[k]), 30);
        rq.sampling.temperature = 1.0f;
        rq.sampling.seed = 5 + (uint64_t)k;
        rq.cache_salt = (uint64_t)k + 1;
        if (k < NG) {
            rq.grammar = g;
            rq.grammar_len = strlen(g);
        }
        ids[k] = submit(e, &rq);
    }
    for (int k = 0; k <= NG; k++) collect(e, ids[k], 1, &out[k]);
    llm_stats s;
    llm_engine_stats(e, &s);
    close_engine(e);
    return s.held_picks;
}

/* A step's grammar work is bounded: with the least budget, picks past the
 * first that need a walk wait for later rounds, and every output is still
 * what it is when none waits (the budget decides when, never what). */
static void test_mask_budget(void **st)
{
    (void)st;
    if (!g_story)
        skip();
    static result free_run[NG + 1], held_run[NG + 1];
    assert_int_equal(constrained_round(0, free_run), 0); /* the default budget is far above these masks */
    uint64_t held = constrained_round(1, held_run);
    print_message("mask budget: %llu picks held to a later round\n", (unsigned long long)held);
    assert_true(held >= NG);
    for (int k = 0; k <= NG; k++) {
        assert_true(held_run[k].n_tok[0] > 0);
        assert_int_equal(held_run[k].n_tok[0], free_run[k].n_tok[0]);
        assert_memory_equal(held_run[k].tok[0], free_run[k].tok[0], sizeof(int32_t) * (size_t)free_run[k].n_tok[0]);
        assert_int_equal(held_run[k].finish[0], free_run[k].finish[0]);
    }
}

/* A held pick that fails (its grammar and biases leave no token) fails
 * its request, whose other completions are in the step being committed:
 * the engine commits the step first (it used to release a sibling's K/V
 * under the plan and trip the KV cache's assert; found by review). Every
 * request ends, with its error or its answer. */
static void test_held_pick_fails(void **st)
{
    (void)st;
    if (!g_story)
        skip();
    static llm_logit_bias ban[4096];
    int nb = 0, errors = 0;
    for (int t = 0; t < g_story->hp.n_vocab && nb < 4096; t++) {
        char piece[64];
        if (llm_token_to_piece(g_story->vocab, t, 0, piece, sizeof piece) > 0 && piece[0] == 'Q')
            ban[nb++] = (llm_logit_bias){t, -100.0f};
    }
    static const char *g = "root ::= \"a\" A | \"e\" E | \"i\" I\nA ::= [a-z] [a-z] [a-z] \"Q\"\n"
                           "E ::= [a-z] [a-z] \"Q\"\nI ::= [a-z] \"Q\"\n";
    for (int seed = 0; seed < 12; seed++) {
        llm_engine *e = open_engine(g_story, (llm_engine_config){.n_ctx = 64, .max_seqs = 8, .mask_step_work = 1});
        int32_t p[64];
        llm_request rq = greedy(p, make_prompt(g_story, seed, p), 20);
        rq.n = 4;
        rq.sampling.temperature = 1.5f;
        rq.sampling.seed = (uint64_t)seed;
        rq.sampling.bias = ban;
        rq.sampling.n_bias = nb;
        rq.grammar = g;
        rq.grammar_len = strlen(g);
        llm_request_id id = submit(e, &rq);
        for (int done = 0; done < rq.n;) { /* its four DONEs, or its ERROR */
            llm_event ev;
            assert_int_equal(llm_engine_next(e, id, &ev, 60000), LLM_OK);
            done += ev.type == LLM_EVENT_DONE ? 1 : ev.type == LLM_EVENT_ERROR ? rq.n : 0;
            errors += ev.type == LLM_EVENT_ERROR;
            llm_event_clear(&ev);
        }
        close_engine(e);
    }
    print_message("held picks that fail: %d of 12 requests ended with their error\n", errors);
    assert_true(errors > 0);
}

/* Text: the concatenated event text is the detokenized output; a stop
 * string ends it just before the match; logprobs come with tokens. */
static void test_text_and_stop(void **st)
{
    (void)st;
    if (!g_story) {
        print_message("skipped: ../shared/models/stories260K.gguf not present\n");
        skip();
    }
    llm_engine *e = open_engine(g_story, (llm_engine_config){.n_ctx = 128});
    llm_request rq = {.text = "Once upon a time", .sampling = llm_sampling_default(), .max_tokens = 60};
    rq.sampling.n_logprobs = 3;
    static result r, rs;
    collect(e, submit(e, &rq), 1, &r);
    llm_error err = {0};
    size_t len;
    char *want = llm_detokenize(g_story->vocab, r.tok[0], r.n_tok[0], 0, &len, &err);
    assert_non_null(want);
    print_message("text: \"%s\"\n", r.text[0]);
    assert_true(r.text_len[0] == len || (len > 0 && want[0] != ' ' && r.text_len[0] == len + 1));
    assert_non_null(strstr(r.text[0], want[0] == ' ' ? want + 1 : want));
    assert_true(r.text_len[0] > 20);
    /* stop at a word from the middle of the text */
    char stop[16] = {0};
    const char *mid = strchr(r.text[0] + r.text_len[0] / 2, ' ');
    assert_non_null(mid);
    memcpy(stop, mid, 6);
    const char *stops[] = {"\x01never", stop};
    rq.stop = stops;
    rq.n_stop = 2;
    collect(e, submit(e, &rq), 1, &rs);
    assert_int_equal(rs.finish[0], LLM_FINISH_STOP);
    assert_int_equal(rs.text_len[0], (size_t)(strstr(r.text[0], stop) - r.text[0]));
    assert_memory_equal(rs.text[0], r.text[0], rs.text_len[0]);
    free(want);
    /* logprobs: the chosen token's is the largest of the top 3 (greedy) */
    llm_event ev;
    rq.n_stop = 0;
    rq.max_tokens = 3;
    llm_request_id id = submit(e, &rq);
    assert_int_equal(llm_engine_next(e, id, &ev, 60000), LLM_OK);
    assert_int_equal(ev.sample.n_top, 3);
    assert_int_equal(ev.sample.top[0].id, ev.token);
    assert_true(ev.sample.logprob <= 0 && ev.sample.top[1].logprob <= ev.sample.top[0].logprob);
    llm_event_clear(&ev);
    llm_engine_cancel(e, id);
    close_engine(e);
}

/* Several client threads submit, read partly, cancel or drain at random
 * against a small pool (preemptions, forks, chunking all at once); a
 * thread polls stats. Nothing may crash, leak or deadlock, and greedy
 * outputs read to the end must still equal their output alone. */
typedef struct stress_arg {
    llm_engine *e;
    uint64_t seed;
    int mismatches, completed;
    const result *ref;
} stress_arg;

static void *stress_client(void *p)
{
    stress_arg *a = p;
    for (int it = 0; it < 12; it++) {
        int k = (int)(test_rng(&a->seed) % NP), op = (int)(test_rng(&a->seed) % 3);
        int32_t pr[64];
        int n = make_prompt(g_tiny, k, pr);
        llm_request rq = greedy(pr, n, GEN);
        rq.priority = (int)(test_rng(&a->seed) % 3);
        rq.n = 1 + (int)(test_rng(&a->seed) % 3);
        llm_error err = {0};
        llm_request_id id;
        llm_status st = llm_engine_submit(a->e, &rq, &id, &err);
        if (st == LLM_ERR_QUEUE_FULL)
            continue;
        if (st)
            return NULL;
        int32_t got[LLM_MAX_N][GEN];
        int cnt[LLM_MAX_N] = {0}, done = 0, stop_at = op == 0 ? (int)(test_rng(&a->seed) % 20) : -1;
        for (int ev_n = 0; done < rq.n; ev_n++) {
            llm_event ev;
            if (ev_n == stop_at) {
                llm_engine_cancel(a->e, id);
                break;
            }
            if (llm_engine_next(a->e, id, &ev, 60000) != LLM_OK)
                break;
            if (ev.type == LLM_EVENT_TOKEN && cnt[ev.index] < GEN)
                got[ev.index][cnt[ev.index]++] = ev.token;
            done += ev.type == LLM_EVENT_DONE;
            llm_event_clear(&ev);
        }
        if (done == rq.n) {
            a->completed++;
            for (int i = 0; i < rq.n; i++)
                a->mismatches += cnt[i] != GEN || memcmp(got[i], a->ref[k].tok[0], sizeof(int32_t) * GEN) != 0;
        }
    }
    return NULL;
}

static void test_stress(void **st)
{
    (void)st;
    static result ref[NP];
    alone(g_tiny, LLM_KV_F16, ref);
    size_t blk = kv_cache_block_bytes(LLM_KV_F16, 16, g_tiny->hp.n_layer, g_tiny->hp.n_head_kv * g_tiny->hp.head_dim);
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 96, .max_seqs = 6, .max_batch_tokens = 24,
                                                            .max_waiting = 12, .kv_cache_bytes = 14 * blk});
    enum { NT = 4 };
    pthread_t th[NT];
    stress_arg args[NT];
    for (int i = 0; i < NT; i++) {
        args[i] = (stress_arg){e, 100 + (uint64_t)i, 0, 0, ref};
        assert_int_equal(pthread_create(&th[i], NULL, stress_client, &args[i]), 0);
    }
    int completed = 0;
    for (int i = 0; i < NT; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].mismatches, 0);
        completed += args[i].completed;
    }
    llm_stats s;
    llm_engine_stats(e, &s);
    print_message("stress: %d requests completed, %llu preemptions, %llu steps\n", completed,
                  (unsigned long long)s.preemptions, (unsigned long long)s.steps);
    assert_true(completed > 0);
    close_engine(e);
}

/* ---- numeric faults ---------------------------------------------------- */

/* The CPU backend with faults on demand: NaN in the logits (the output
 * matmul's first row), or a device pick of a given id. */
static struct llm_backend_i g_fault_iface;
static int g_fault_nan, g_fault_pick = -2; /* -2: no device pick */

static llm_status fault_matmul(llm_backend *b, const llm_matmul *ops, int n_ops, const float *x, int n_tok)
{
    llm_status st = g_b->iface->matmul(b, ops, n_ops, x, n_tok);
    if (!st && g_fault_nan && ops[0].w->data == g_tiny->output.data) /* the backend's copy of it, maybe */
        ops[0].y[0] = NAN;
    return st;
}

static llm_status fault_sample(llm_backend *b, const float *lg, int n_rows, int n_vocab, const llm_sample_params *p,
                               int32_t *out)
{
    (void)b, (void)lg, (void)n_vocab, (void)p;
    for (int r = 0; r < n_rows; r++) out[r] = g_fault_pick;
    return LLM_OK;
}

/* The single event a failed request leaves: its error. */
static llm_error read_error(llm_engine *e, llm_request_id id)
{
    llm_event ev;
    for (;;) {
        assert_int_equal(llm_engine_next(e, id, &ev, 60000), LLM_OK);
        if (ev.type == LLM_EVENT_ERROR)
            return ev.error;
        assert_int_not_equal(ev.type, LLM_EVENT_DONE);
        llm_event_clear(&ev);
    }
}

static void check_fault(int nan, int pick, int sample_op, llm_status want, const char *msg)
{
    g_fault_iface = *g_b->iface;
    g_fault_iface.matmul = fault_matmul;
    g_fault_iface.sample = sample_op ? fault_sample : NULL;
    llm_backend fb = {&g_fault_iface, g_b->ctx};
    llm_engine_config c = {.model = g_tiny, .backend = &fb, .n_ctx = 128};
    llm_engine *e = NULL;
    llm_error err = {0};
    assert_int_equal(llm_engine_open(&c, &e, &err), LLM_OK);
    int32_t p[64];
    int n = make_prompt(g_tiny, 3, p);
    llm_request rq = greedy(p, n, 8);
    g_fault_nan = nan;
    g_fault_pick = pick;
    llm_error got = read_error(e, submit(e, &rq));
    assert_int_equal(got.code, want);
    if (!strstr(got.msg, msg))
        fail_msg("error '%s' does not say '%s'", got.msg, msg);
    g_fault_nan = 0; /* the engine goes on serving */
    g_fault_iface.sample = NULL;
    result r;
    collect(e, submit(e, &rq), 1, &r);
    assert_int_equal(r.n_tok[0], 8);
    close_engine(e);
}

/* NaN logits fail the request with a clear error (host sampler and device
 * pick alike); a device pick outside the vocabulary fails it too instead
 * of indexing past the embedding table; the engine serves the next
 * request and every block is free. */
static void test_numeric_faults(void **st)
{
    (void)st;
    check_fault(1, -2, 0, LLM_ERR_NUMERIC, "NaN logit (token id 0)");
    check_fault(0, LLM_SAMPLE_NAN, 1, LLM_ERR_NUMERIC, "NaN logit");
    check_fault(0, 512 + 7, 1, LLM_ERR_BACKEND, "sampled token id 519 is outside the vocabulary [0, 512)");
    check_fault(0, -5, 1, LLM_ERR_BACKEND, "sampled token id -5");
}

/* ---- embeddings ----------------------------------------------------------- */

enum { EP = 12, ELEN = 200, EGEN = 150, E_DIM_MAX = 4096 }; /* E_DIM_MAX: widest n_embd the tests take */

/* The oracle: the whole prompt in one forward pass of its own (no engine,
 * no chunks), every row's hidden state pooled in double in position order
 * and scaled to unit length. */
static void embed_direct(const llm_model *m, const int32_t *p, int n, llm_pooling pool, float *out)
{
    llm_error err = {0};
    kv_cache *kv;
    kv_cache_config kc = {.type = LLM_KV_F16, .n_blocks = (n + 15) / 16 + 1};
    llm_forward *f;
    if (kv_cache_new(&kc, g_b, m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim, &kv, &err) ||
        llm_forward_new(m, g_b, n, 1, &f, &err))
        fail_msg("direct: %s", err.msg);
    kv_seq s;
    kv_seq_init(&s);
    assert_int_equal(kv_seq_reserve(kv, &s, n), LLM_OK);
    int32_t rows[ELEN], last = n - 1;
    for (int i = 0; i < n; i++) rows[i] = i;
    llm_batch_seq bs = {0, n, 0, s.blocks, NULL};
    llm_forward_batch bt = {p, n, &bs, 1, &last, 1, rows, n, NULL};
    const float *lg;
    assert_int_equal(llm_forward_eval(f, &bt, kv_cache_layers(kv), &lg), LLM_OK);
    const float *h = llm_forward_hidden(f);
    int d = m->hp.n_embd;
    double acc[E_DIM_MAX] = {0}, ss = 0;
    assert_true(d <= E_DIM_MAX);
    for (int i = pool == LLM_POOL_LAST ? n - 1 : 0; i < n; i++)
        for (int k = 0; k < d; k++) acc[k] += h[(size_t)i * d + k];
    for (int k = 0; k < d; k++) ss += acc[k] * acc[k];
    for (int k = 0; k < d; k++) out[k] = (float)(acc[k] / sqrt(ss));
    kv_seq_release(kv, &s);
    llm_forward_free(f);
    kv_cache_free(kv);
}

/* Reads an embedding request's single DONE into out; returns its usage. */
static llm_usage embed_collect(llm_engine *e, llm_request_id id, float *out, int d)
{
    llm_event ev;
    if (llm_engine_next(e, id, &ev, 60000))
        fail_msg("embedding: next timed out");
    if (ev.type == LLM_EVENT_ERROR)
        fail_msg("embedding failed: %s", ev.error.msg);
    assert_int_equal(ev.type, LLM_EVENT_DONE);
    assert_int_equal(ev.n_embedding, d);
    assert_non_null(ev.embedding);
    memcpy(out, ev.embedding, sizeof(float) * (size_t)d);
    llm_usage u = ev.usage;
    llm_event_clear(&ev);
    assert_int_equal(llm_engine_next(e, id, &ev, 0), LLM_ERR_NOT_FOUND);
    return u;
}

static int embed_prompt(const llm_model *m, int k, int32_t *p)
{
    int n = 3 + (k * 37) % (ELEN - 3);
    uint64_t s = 77 + (uint64_t)k;
    for (int i = 0; i < n; i++) p[i] = (int32_t)(test_rng(&s) % (uint64_t)m->hp.n_vocab);
    if (k % 3 == 1) /* a shared prefix: a cache hit for last pooling, never read for mean */
        for (int i = 0; i < n && i < 40; i++) p[i] = (int32_t)(i + 1);
    return n;
}

/* One round of test_embeddings: the requests at once, each checked; how
 * many times its embedding requests were preempted. */
static int embed_round(llm_engine *e, int32_t (*p)[ELEN], const int *n, float (*want)[E_DIM_MAX], const result *gen_ref)
{
    int d = g_tiny->hp.n_embd, preempted = 0;
    llm_request_id ids[EP], gids[2];
    int32_t gp[2][64];
    static float got[E_DIM_MAX];
    static result gen;
    for (int g = 0; g < 2; g++) {
        int gn = make_prompt(g_tiny, g, gp[g]);
        llm_request rq = greedy(gp[g], gn, EGEN);
        gids[g] = submit(e, &rq);
    }
    for (int k = 0; k < EP; k++) {
        llm_request rq = {.tokens = p[k], .n_tokens = n[k], .sampling = llm_sampling_default(),
                          .pooling = k % 2 ? LLM_POOL_LAST : LLM_POOL_MEAN, .priority = k % 3 - 2};
        ids[k] = submit(e, &rq);
    }
    for (int k = 0; k < EP; k++) {
        llm_usage u = embed_collect(e, ids[k], got, d);
        assert_int_equal(u.prompt_tokens, n[k]);
        assert_int_equal(u.completion_tokens, 0);
        preempted += u.preemptions;
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)got[i] * got[i];
        assert_true(fabs(ss - 1) < 1e-5);
        if (memcmp(got, want[k], sizeof(float) * (size_t)d))
            fail_msg("input %d (%d tokens, %s pooling, preempted %d times): differs from the direct pass", k, n[k],
                     k % 2 ? "last" : "mean", u.preemptions);
    }
    for (int g = 0; g < 2; g++) {
        collect(e, gids[g], 1, &gen);
        assert_memory_equal(gen.tok[0], gen_ref[g].tok[0], sizeof(int32_t) * EGEN);
    }
    return preempted;
}

/* Embedding requests of both poolings, submitted all at once beside two
 * long generations of higher priority, chunked 24 rows a step, in a KV
 * pool of 16 blocks (the generations alone outgrow it), so embedding
 * sequences are preempted and recomputed: each equals its prompt's
 * embedding computed alone in one pass (bit for bit: the kernels are
 * batch-invariant and the pool sums in position order), is unit length,
 * and the generations equal theirs alone. Rounds repeat (at most 8) until
 * an embedding was preempted, so the test does not rest on timing. */
static void test_embeddings(void **st)
{
    (void)st;
    const llm_model *m = g_tiny;
    static int32_t p[EP][ELEN];
    static float want[EP][E_DIM_MAX];
    int n[EP];
    for (int k = 0; k < EP; k++) {
        n[k] = embed_prompt(m, k, p[k]);
        embed_direct(m, p[k], n[k], k % 2 ? LLM_POOL_LAST : LLM_POOL_MEAN, want[k]);
    }
    static result gen_ref[2];
    llm_engine *e = open_engine(m, (llm_engine_config){.n_ctx = 256});
    for (int g = 0; g < 2; g++) {
        int32_t gp[64];
        int gn = make_prompt(m, g, gp);
        llm_request rq = greedy(gp, gn, EGEN);
        collect(e, submit(e, &rq), 1, &gen_ref[g]);
    }
    close_engine(e);
    e = open_engine(m, (llm_engine_config){.n_ctx = 256, .max_batch_tokens = 24, .max_seqs = 6,
                                           .kv_cache_bytes = 16 * 16384}); /* 16 blocks of the tiny model */
    int preempted = 0, rounds = 0;
    while (rounds < 8 && !preempted) {
        preempted = embed_round(e, p, n, want, gen_ref);
        rounds++;
    }
    print_message("embeddings: %d rounds, the last preempted embeddings %d times\n", rounds, preempted);
    assert_true(preempted > 0);
    close_engine(e);
}

/* The prefix cache: a last-pooled input whose prefix is cached reads it
 * and gives the same embedding as the first time; a mean-pooled one never
 * reads it (every position must be computed to be pooled). */
static void test_embedding_cache(void **st)
{
    (void)st;
    int d = g_tiny->hp.n_embd;
    int32_t p[ELEN];
    static float a[E_DIM_MAX], b[E_DIM_MAX];
    int n = embed_prompt(g_tiny, 5, p);
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 256});
    for (int pool = LLM_POOL_MEAN; pool <= LLM_POOL_LAST; pool++) {
        llm_request rq = {.tokens = p, .n_tokens = n, .sampling = llm_sampling_default(), .pooling = pool};
        llm_usage u1 = embed_collect(e, submit(e, &rq), a, d);
        llm_usage u2 = embed_collect(e, submit(e, &rq), b, d);
        /* mean goes first: the cache is empty, then holds what it wrote */
        int hit = pool == LLM_POOL_LAST ? (n - 1) / 16 * 16 : 0;
        assert_int_equal(u1.cached_tokens, hit);
        assert_int_equal(u2.cached_tokens, hit);
        assert_memory_equal(a, b, sizeof(float) * (size_t)d);
    }
    close_engine(e);
}

/* An embedding request may fill the whole context (nothing is generated);
 * longer ones, n > 1, a grammar or an unknown pooling are refused. */
static void test_embedding_limits(void **st)
{
    (void)st;
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 64});
    llm_error err = {0};
    llm_request_id id;
    int32_t p[65] = {0};
    float v[E_DIM_MAX];
    llm_request rq = {.tokens = p, .n_tokens = 64, .sampling = llm_sampling_default(), .pooling = LLM_POOL_MEAN};
    embed_collect(e, submit(e, &rq), v, g_tiny->hp.n_embd);
    rq.n_tokens = 65;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_TOO_LONG);
    rq.n_tokens = 10;
    rq.n = 2;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    rq.n = 1;
    rq.grammar = "root ::= \"a\"";
    rq.grammar_len = strlen(rq.grammar);
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    rq.grammar = NULL;
    rq.pooling = (llm_pooling)7;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "pooling 7"));
    close_engine(e);
}

/* ---- LoRA adapters ---------------------------------------------------------- */

/* An adapter of g_tiny (rank 8, alpha 16, F32, seeded). */
static llm_lora *tiny_lora(uint64_t seed)
{
    char path[256];
    llm_error err = {0};
    llm_lora *l = NULL;
    test_tmpfile("engine-lora", path, sizeof path);
    if (llm_mklora(g_path, 8, 16, QT_F32, seed, path, &err) || llm_lora_load(path, g_tiny, 0, &l, &err))
        fail_msg("adapter: %s", err.msg);
    remove(path);
    return l;
}

/* The prefix cache keeps each adapter's (and scale's) K/V apart: the same
 * prompt under the base, adapter A, A again, B, and A at another scale
 * reuses only A's own blocks, and each answer equals its own alone. */
static void test_lora_prefix_cache(void **st)
{
    (void)st;
    llm_lora *la = tiny_lora(1), *lb = tiny_lora(2);
    int32_t p[100];
    uint64_t seed = 9;
    for (int i = 0; i < 100; i++) p[i] = (int32_t)(test_rng(&seed) % (uint64_t)g_tiny->hp.n_vocab);
    struct {
        const llm_lora *l;
        float scale;
        int cached;
    } runs[] = {{NULL, 0, 0}, {la, 1, 0}, {la, 1, 96}, {lb, 1, 0}, {la, 0.5f, 0}, {NULL, 0, 96}};
    static result got[6], want;
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 256, .max_loras = 2});
    llm_error err = {0};
    assert_int_equal(llm_engine_lora_add(e, la, &err), LLM_OK);
    assert_int_equal(llm_engine_lora_add(e, lb, &err), LLM_OK);
    for (int i = 0; i < 6; i++) {
        llm_request rq = greedy(p, 100, 8);
        rq.lora = runs[i].l, rq.lora_scale = runs[i].scale;
        collect(e, submit(e, &rq), 1, &got[i]);
        assert_int_equal(got[i].usage[0].cached_tokens, runs[i].cached); /* 6 whole blocks, or nothing */
        llm_engine *cold = open_engine(g_tiny, (llm_engine_config){.n_ctx = 256, .no_prefix_cache = 1});
        if (runs[i].l)
            assert_int_equal(llm_engine_lora_add(cold, runs[i].l, &err), LLM_OK);
        collect(cold, submit(cold, &rq), 1, &want);
        close_engine(cold);
        assert_memory_equal(got[i].tok[0], want.tok[0], sizeof(int32_t) * 8);
    }
    /* the adapters answer differently from the base and from each other */
    assert_true(memcmp(got[0].tok[0], got[1].tok[0], sizeof(int32_t) * 8) != 0);
    assert_true(memcmp(got[1].tok[0], got[3].tok[0], sizeof(int32_t) * 8) != 0);
    assert_true(memcmp(got[1].tok[0], got[4].tok[0], sizeof(int32_t) * 8) != 0);
    close_engine(e);
    llm_lora_free(la);
    llm_lora_free(lb);
}

typedef struct remover {
    llm_engine *e;
    const llm_lora *l;
    _Atomic int done;
} remover;

static void *remove_main(void *arg)
{
    remover *r = arg;
    llm_engine_lora_remove(r->e, r->l);
    atomic_store(&r->done, 1);
    return NULL;
}

/* Adding and removing: twice, past max_loras, a request naming an adapter
 * not added or with a bad scale are refused and change nothing; removing
 * refuses new requests at once but waits until the last request naming
 * it is read; then it may be added again (cold cache). */
static void test_lora_add_remove(void **st)
{
    (void)st;
    llm_lora *la = tiny_lora(1), *lb = tiny_lora(2);
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 256, .max_loras = 1});
    llm_error err = {0};
    llm_request_id id;
    int32_t p[40];
    int n = make_prompt(g_tiny, 3, p);
    assert_int_equal(llm_engine_lora_requests(e, la), -1);
    assert_int_equal(llm_engine_lora_add(e, la, &err), LLM_OK);
    assert_int_equal(llm_engine_lora_add(e, la, &err), LLM_ERR_INVALID_ARG);
    assert_int_equal(llm_engine_lora_add(e, lb, &err), LLM_ERR_QUEUE_FULL);
    assert_non_null(strstr(err.msg, "1 adapters are loaded"));
    llm_request rq = greedy(p, n, 100);
    rq.lora = lb, rq.lora_scale = 1;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "adapter is not loaded"));
    rq.lora = la;
    const float bad[] = {NAN, INFINITY, 1001.0f, -2000.0f};
    for (int i = 0; i < 4; i++) {
        rq.lora_scale = bad[i];
        assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
        assert_string_equal(err.field, "lora_scale");
    }
    rq.lora_scale = 1;
    llm_request_id busy = submit(e, &rq);
    llm_event ev;
    assert_int_equal(llm_engine_next(e, busy, &ev, 60000), LLM_OK); /* it runs */
    llm_event_clear(&ev);
    assert_int_equal(llm_engine_lora_requests(e, la), 1);
    remover r = {e, la, 0};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, remove_main, &r), 0);
    while (llm_engine_submit(e, &rq, &id, &err) == LLM_OK) /* refused as soon as the removal starts */
        collect(e, id, 1, &(result){0});
    assert_non_null(strstr(err.msg, "being added or removed"));
    assert_int_equal(atomic_load(&r.done), 0); /* the request naming it is not over */
    static result rest;
    collect(e, busy, 1, &rest);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(atomic_load(&r.done), 1);
    assert_int_equal(llm_engine_lora_requests(e, la), -1);
    assert_int_equal(llm_engine_lora_add(e, lb, &err), LLM_OK); /* the slot is free again */
    llm_engine_lora_remove(e, lb);
    assert_int_equal(llm_engine_lora_add(e, la, &err), LLM_OK);
    rq.max_tokens = 4;
    static result again;
    collect(e, submit(e, &rq), 1, &again);
    assert_int_equal(again.usage[0].cached_tokens, 0); /* a new uid: the old adapter's blocks are not its own */
    /* an adapter checked against another model of the same depth (one K/V head, not two) does not fit: refused */
    char qpath[256], lpath[256];
    llm_model *q = NULL;
    llm_lora *lq = NULL;
    test_tmpfile("engine-llama3", qpath, sizeof qpath);
    test_tmpfile("engine-llama3-lora", lpath, sizeof lpath);
    assert_int_equal(llm_mkmodel(llm_shape_find("tiny-llama3"), QT_F32, 3, qpath, &err), LLM_OK);
    assert_int_equal(llm_model_load(qpath, &q, &err), LLM_OK);
    assert_int_equal(llm_mklora(qpath, 8, 16, QT_F32, 4, lpath, &err), LLM_OK);
    assert_int_equal(llm_lora_load(lpath, q, 0, &lq, &err), LLM_OK);
    assert_int_equal(q->hp.n_layer, g_tiny->hp.n_layer);
    llm_engine_lora_remove(e, la);
    assert_int_equal(llm_engine_lora_add(e, lq, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "not this model's"));
    llm_lora_free(lq);
    llm_model_free(q);
    remove(qpath);
    remove(lpath);
    close_engine(e);
    llm_lora_free(la);
    llm_lora_free(lb);
}

/* ---- prompt logprobs ------------------------------------------------------- */

enum { PL = 6, PLEN = 120, PGEN = 6 };

typedef struct plp_ref {
    int n;
    llm_prompt_logprob *lp;
} plp_ref;

static int plp_fill(void *ctx, int i, const float *logits)
{
    plp_ref *r = ctx;
    llm_error err = {0};
    if (i < r->n && llm_prompt_logprob_of(logits, g_tiny->hp.n_vocab, r->lp[i].id, 5, &r->lp[i], &err))
        fail_msg("prompt logprob: %s", err.msg);
    return 0;
}

/* What a plain session's logits give for prompt p: entry i for token i + 1. */
static void plp_direct(const int32_t *p, int n, llm_prompt_logprob *out)
{
    llm_session *s;
    llm_error err = {0};
    assert_int_equal(llm_session_new(g_tiny, g_b, &(llm_session_config){.n_ctx = 256, .max_batch = 512, .logit_rows = 16},
                                     &s, &err), LLM_OK);
    for (int i = 0; i + 1 < n; i++) out[i].id = p[i + 1];
    plp_ref r = {n - 1, out};
    assert_int_equal(llm_session_eval_each(s, p, n - 1, plp_fill, &r, &err), LLM_OK);
    llm_session_free(s);
}

/* Reads id to its end: completion 0's tokens into tok and its prompt entries into *lp (the caller frees). */
static int plp_collect(llm_engine *e, llm_request_id id, int32_t *tok, llm_prompt_logprob **lp, int *n_lp, int *preempted)
{
    int n_tok = 0;
    for (;;) {
        llm_event ev;
        assert_int_equal(llm_engine_next(e, id, &ev, 60000), LLM_OK);
        if (ev.type == LLM_EVENT_ERROR)
            fail_msg("request failed: %s", ev.error.msg);
        if (ev.type == LLM_EVENT_TOKEN && n_tok < PGEN)
            tok[n_tok++] = ev.token;
        if (ev.type == LLM_EVENT_DONE) {
            *lp = ev.prompt_lp, *n_lp = ev.n_prompt_lp, *preempted = ev.usage.preemptions;
            ev.prompt_lp = NULL;
            llm_event_clear(&ev);
            return n_tok;
        }
        llm_event_clear(&ev);
    }
}

/* prompt_logprobs: each prompt token's entry (log-probability, rank and
 * the 5 most likely) equals what a plain session's logits give through
 * llm_prompt_logprob_of, bit for bit, for requests submitted together
 * with plain generations of higher priority in steps of 24 rows (2 of
 * them prompt rows with logits: such a prompt runs for many steps) and a
 * pool small enough that the generations preempt them; each one's generated tokens equal the same request's
 * without prompt_logprobs; the entries are self-consistent (the top list
 * ordered, the prompt token's rank matching it). Rounds repeat (at most
 * 8) until a prompt_logprobs request was preempted. */
static void test_prompt_logprobs(void **st)
{
    (void)st;
    static int32_t p[PL][PLEN];
    static llm_prompt_logprob want[PL][PLEN];
    static int32_t plain[PL][PGEN];
    int n[PL];
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 256});
    for (int k = 0; k < PL; k++) {
        n[k] = 20 + (k * 37) % (PLEN - 20); /* 20 to 119 tokens: several steps of logit rows */
        uint64_t sd = 5 + (uint64_t)k;
        for (int i = 0; i < n[k]; i++) p[k][i] = (int32_t)(test_rng(&sd) % (uint64_t)g_tiny->hp.n_vocab);
        plp_direct(p[k], n[k], want[k]);
        static result r;
        llm_request rq = greedy(p[k], n[k], PGEN);
        collect(e, submit(e, &rq), 1, &r);
        memcpy(plain[k], r.tok[0], sizeof plain[k]);
    }
    close_engine(e);
    size_t blk = kv_cache_block_bytes(LLM_KV_F16, 16, g_tiny->hp.n_layer, g_tiny->hp.n_head_kv * g_tiny->hp.head_dim);
    e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 128, .max_batch_tokens = 24, .max_seqs = 6,
                                               .kv_cache_bytes = 12 * blk, .prompt_logit_rows = 2});
    int preempted = 0, rounds = 0;
    for (; rounds < 8 && !preempted; rounds++) {
        llm_request_id ids[PL];
        for (int j = 0; j < PL; j++) { /* the prompt_logprobs ones first, least urgent: the others preempt them */
            int k = (j * 2) % PL + (j * 2 >= PL);
            llm_request rq = greedy(p[k], n[k], PGEN);
            rq.prompt_logprobs = k % 2 == 0, rq.prompt_top = 5, rq.priority = k % 2 ? 1 : -1;
            for (llm_stats es; k == 1;) { /* the plain ones once a prompt_logprobs prompt is under way */
                llm_engine_stats(e, &es);
                if (es.running > 0)
                    break;
                nanosleep(&(struct timespec){0, 100000}, NULL);
            }
            ids[k] = submit(e, &rq);
        }
        for (int k = 0; k < PL; k++) {
            int32_t tok[PGEN];
            llm_prompt_logprob *lp = NULL;
            int n_lp = -1, pre = 0;
            assert_int_equal(plp_collect(e, ids[k], tok, &lp, &n_lp, &pre), PGEN);
            assert_memory_equal(tok, plain[k], sizeof tok);
            if (k % 2) {
                assert_null(lp);
                assert_int_equal(n_lp, 0);
                continue;
            }
            preempted += pre;
            assert_int_equal(n_lp, n[k] - 1);
            for (int i = 0; i < n_lp; i++) {
                const llm_prompt_logprob *g = &lp[i], *w = &want[k][i];
                if (memcmp(g, w, sizeof *g))
                    fail_msg("request %d position %d: logprob %g rank %d, alone %g rank %d", k, i, (double)g->logprob,
                             g->rank, (double)w->logprob, w->rank);
                assert_int_equal(g->id, p[k][i + 1]);
                assert_int_equal(g->n_top, 5);
                assert_true(g->logprob <= 0 && g->rank >= 1);
                for (int t = 1; t < 5; t++) assert_true(g->top[t - 1].logprob >= g->top[t].logprob);
                assert_true(g->rank > 5 ? g->logprob <= g->top[4].logprob : g->top[g->rank - 1].logprob == g->logprob);
            }
            free(lp);
        }
    }
    llm_stats es;
    llm_engine_stats(e, &es);
    print_message("prompt logprobs: %d rounds, preempted %d times (the engine: %llu preemptions, %d blocks)\n", rounds,
                  preempted, (unsigned long long)es.preemptions, es.kv_blocks_total);
    assert_true(preempted > 0);
    close_engine(e);
}

/* Refused: with pooling, a prompt_top out of range, and where the engine
 * gives them no logit rows (prompt_logit_rows -1). */
static void test_prompt_logprobs_refused(void **st)
{
    (void)st;
    int32_t p[4] = {1, 2, 3, 4};
    llm_request_id id;
    llm_error err = {0};
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 64});
    llm_request rq = greedy(p, 4, 2);
    rq.prompt_logprobs = 1, rq.prompt_top = LLM_MAX_LOGPROBS + 1;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    assert_string_equal(err.field, "prompt_logprobs");
    rq.prompt_top = 0, rq.pooling = LLM_POOL_LAST;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_INVALID_ARG);
    close_engine(e);
    e = open_engine(g_tiny, (llm_engine_config){.n_ctx = 64, .prompt_logit_rows = -1});
    rq.pooling = LLM_POOL_NONE;
    assert_int_equal(llm_engine_submit(e, &rq, &id, &err), LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "prompt logprobs are off here"));
    close_engine(e);
}

/* One request on a fresh engine; its result and the engine's stats. */
static void spec_run(llm_engine_config c, const llm_request *rq, result *r, llm_stats *st)
{
    const llm_model *m = g_story ? g_story : g_tiny;
    llm_engine *e = open_engine(m, c);
    collect(e, submit(e, rq), rq->n ? rq->n : 1, r);
    llm_engine_stats(e, st);
    close_engine(e);
}

/* Speculative decoding (n-gram guesses) on a prompt that repeats itself:
 * greedy and seeded sampled answers (n = 3) equal those without it token
 * for token and byte for byte, with guesses taken and fewer steps; a
 * request that opts out guesses nothing. */
static void test_speculation(void **st)
{
    (void)st;
    static const char story[] = "Tom had a red ball. He liked to play with it. "
                                "The ball went up. Tom was sad. ";
    char text[1024];
    snprintf(text, sizeof text, "%s%s%s", story, story, "Tom had a red");
    llm_engine_config off = {0}, on = off;
    on.speculative = LLM_SPEC_NGRAM;
    for (int sampled = 0; sampled < 2; sampled++) {
        llm_request rq = {.text = text, .sampling = llm_sampling_default(), .max_tokens = 40, .ignore_eos = 1,
                          .n = sampled ? 3 : 1};
        if (sampled) {
            rq.sampling.temperature = 0.7f;
            rq.sampling.seed = 41;
        }
        static result a, b;
        llm_stats sa, sb;
        spec_run(off, &rq, &a, &sa);
        spec_run(on, &rq, &b, &sb);
        for (int i = 0; i < rq.n; i++) {
            assert_int_equal(a.n_tok[i], b.n_tok[i]);
            assert_memory_equal(a.tok[i], b.tok[i], sizeof(int32_t) * (size_t)a.n_tok[i]);
            assert_int_equal(a.text_len[i], b.text_len[i]);
            assert_memory_equal(a.text[i], b.text[i], a.text_len[i]);
            assert_int_equal(a.finish[i], b.finish[i]);
        }
        print_message("speculation (%s): %llu guessed, %llu taken, steps %llu -> %llu\n", sampled ? "sampled" : "greedy",
                      (unsigned long long)sb.spec_draft_tokens, (unsigned long long)sb.spec_accepted_tokens,
                      (unsigned long long)sa.steps, (unsigned long long)sb.steps);
        assert_int_equal(sa.spec_draft_tokens, 0);
        assert_true(sb.spec_accepted_tokens > 0 && sb.spec_accepted_tokens <= sb.spec_draft_tokens);
        assert_true(sb.steps < sa.steps);
        rq.no_speculate = 1;
        spec_run(on, &rq, &b, &sb);
        assert_int_equal(sb.spec_draft_tokens, 0);
        for (int i = 0; i < rq.n; i++) {
            assert_int_equal(a.n_tok[i], b.n_tok[i]);
            assert_memory_equal(a.tok[i], b.tok[i], sizeof(int32_t) * (size_t)a.n_tok[i]);
        }
    }
}

/* Answers of rq on m with speculation on (c) and off are the same, token
 * for token and byte for byte; *on gets the speculating engine's stats. */
static void spec_same(const llm_model *m, llm_engine_config c, const llm_request *rq, llm_stats *on)
{
    static result a, b;
    llm_stats off;
    llm_engine *e = open_engine(m, (llm_engine_config){0});
    collect(e, submit(e, rq), rq->n ? rq->n : 1, &a);
    llm_engine_stats(e, &off);
    close_engine(e);
    e = open_engine(m, c);
    collect(e, submit(e, rq), rq->n ? rq->n : 1, &b);
    llm_engine_stats(e, on);
    close_engine(e);
    for (int i = 0; i < (rq->n ? rq->n : 1); i++) {
        assert_int_equal(a.n_tok[i], b.n_tok[i]);
        assert_memory_equal(a.tok[i], b.tok[i], sizeof(int32_t) * (size_t)a.n_tok[i]);
        assert_int_equal(a.text_len[i], b.text_len[i]);
        assert_memory_equal(a.text[i], b.text[i], a.text_len[i]);
        assert_int_equal(a.finish[i], b.finish[i]);
    }
    print_message("draft: %llu guessed, %llu taken, steps %llu -> %llu\n", (unsigned long long)on->spec_draft_tokens,
                  (unsigned long long)on->spec_accepted_tokens, (unsigned long long)off.steps,
                  (unsigned long long)on->steps);
    assert_int_equal(on->spec_draft_failures, 0);
    assert_true(on->spec_accepted_tokens <= on->spec_draft_tokens);
}

/* Opening with LLM_SPEC_DRAFT and draft d fails naming what. */
static void draft_refused(const llm_model *m, const llm_model *d, size_t kv_bytes, const char *what)
{
    llm_engine_config c = {.model = m, .backend = g_b, .speculative = LLM_SPEC_DRAFT, .spec_draft_model = d,
                           .spec_draft_kv_bytes = kv_bytes};
    llm_engine *e = NULL;
    llm_error err = {0};
    assert_int_equal(llm_engine_open(&c, &e, &err), LLM_ERR_INVALID_ARG);
    assert_null(e);
    if (!strstr(err.msg, what))
        fail_msg("'%s' does not say '%s'", err.msg, what);
}

/* Speculation with a draft model. The model drafting for itself: its
 * greedy guesses are its own greedy picks, so a greedy answer takes every
 * guess it is given (a draft K/V one position off, or a guess row fed the
 * wrong token, would miss) in fewer steps; seeded sampled answers (n = 3),
 * with a draft pool of one context (the siblings find it full), are the
 * same as without guesses. A draft of other weights (the tiny shape at
 * Q4_0) too. Refused: no draft, a vocabulary of other token texts (same
 * size), a pool under one context. */
static void test_speculation_draft(void **st)
{
    (void)st;
    const llm_model *m = g_story ? g_story : g_tiny;
    llm_request rq = {.text = "Once upon a time, there was a little girl", .sampling = llm_sampling_default(),
                      .max_tokens = 48, .n = 1};
    llm_engine_config on = {.speculative = LLM_SPEC_DRAFT, .spec_draft_model = m, .n_ctx = 128};
    llm_stats s;
    spec_same(m, on, &rq, &s);
    assert_true(s.spec_draft_tokens > 0);
    assert_int_equal(s.spec_accepted_tokens, s.spec_draft_tokens);
    rq.n = 3;
    rq.sampling.temperature = 0.8f;
    rq.sampling.seed = 7;
    size_t per = kv_cache_block_bytes(LLM_KV_F16, KV_DEFAULT_BLOCK, m->hp.n_layer, m->hp.n_head_kv * m->hp.head_dim);
    on.spec_draft_kv_bytes = per * (128 / KV_DEFAULT_BLOCK);
    spec_same(m, on, &rq, &s);
    assert_true(s.spec_accepted_tokens > 0 && s.spec_draft_full > 0);

    char path[256];
    llm_model *q4 = NULL, *other = NULL;
    llm_error err = {0};
    test_tmpfile("engine-draft", path, sizeof path);
    if (llm_mkmodel(llm_shape_find("tiny"), QT_Q4_0, 11, path, &err) || llm_model_load(path, &q4, &err))
        fail_msg("draft: %s", err.msg);
    remove(path);
    if (llm_mkmodel(llm_shape_find("tiny"), QT_Q8_0, 12, path, &err) || llm_model_load(path, &other, &err))
        fail_msg("draft: %s", err.msg);
    remove(path);
    on = (llm_engine_config){.speculative = LLM_SPEC_DRAFT, .spec_draft_model = q4};
    rq.text = NULL;
    int32_t prompt[64];
    rq.tokens = prompt;
    rq.n_tokens = make_prompt(g_tiny, 5, prompt);
    spec_same(g_tiny, on, &rq, &s);
    rq.n = 1;
    rq.sampling = llm_sampling_default();
    spec_same(g_tiny, on, &rq, &s);
    assert_true(s.spec_accepted_tokens > 0);

    draft_refused(g_tiny, NULL, 0, "needs spec_draft_model");
    draft_refused(g_tiny, other, 0, "vocabulary is not the model's: token");
    if (g_story)
        draft_refused(g_tiny, g_story, 0, "vocabulary");
    draft_refused(g_tiny, q4, 4096, "spec_draft_kv_bytes 4096 holds 0 blocks");
    llm_model_free(q4);
    llm_model_free(other);
}

/* Cancels while the draft model's passes run without the engine's lock:
 * requests beside a drafting one (prompts in the plan, some opted out of
 * guessing) are cancelled at random points; the drafting answer stays
 * the same and no block is left referenced (under ASan, make asan, a
 * sequence freed while the plan still held it fails here). */
static void test_speculation_draft_cancel(void **st)
{
    (void)st;
    int32_t prompt[64], other[64];
    llm_request rq = {.tokens = prompt, .n_tokens = make_prompt(g_tiny, 2, prompt), .sampling = llm_sampling_default(),
                      .max_tokens = 120, .ignore_eos = 1};
    llm_request side = {.tokens = other, .n_tokens = make_prompt(g_tiny, 4, other), .sampling = llm_sampling_default(),
                        .max_tokens = 3};
    static result want, got;
    llm_engine *e = open_engine(g_tiny, (llm_engine_config){0});
    collect(e, submit(e, &rq), 1, &want);
    close_engine(e);
    e = open_engine(g_tiny, (llm_engine_config){.speculative = LLM_SPEC_DRAFT, .spec_draft_model = g_tiny});
    llm_request_id id = submit(e, &rq);
    uint64_t rng = 5;
    for (int i = 0; i < 300; i++) {
        side.no_speculate = i % 2;
        llm_request_id b = submit(e, &side);
        nanosleep(&(struct timespec){0, (long)(test_rng(&rng) % 300000)}, NULL);
        llm_engine_cancel(e, b);
    }
    collect(e, id, 1, &got);
    llm_stats s;
    llm_engine_stats(e, &s);
    close_engine(e);
    assert_int_equal(want.n_tok[0], got.n_tok[0]);
    assert_memory_equal(want.tok[0], got.tok[0], sizeof(int32_t) * (size_t)want.n_tok[0]);
    assert_true(s.spec_draft_tokens > 0);
}

/* The speculation distribution test's guesser: after the first token,
 * when that is g_t1, it guesses g_guess. */
static int32_t g_t1, g_guess;
static int fixed_guess(void *ctx, const int32_t *tok, int n, int n_prompt, int k, int32_t *out)
{
    (void)ctx;
    (void)k;
    if (n != n_prompt + 1 || tok[n - 1] != g_t1)
        return 0;
    out[0] = g_guess;
    return 1;
}

/* Pearson's chi-square of counts against probabilities p (n bins, the last
 * one "every other token"), over bins expected at least 5 times, the rest
 * merged into the last; *df its degrees of freedom. */
static double chi_square(const int *count, const double *p, int n, int total, int *df)
{
    double x2 = 0, rest_e = 0, rest_o = 0;
    *df = -1;
    for (int i = 0; i < n; i++) {
        double want = p[i] * total;
        if (want >= 5 && i < n - 1) {
            x2 += (count[i] - want) * (count[i] - want) / want;
            ++*df;
        } else {
            rest_e += want;
            rest_o += count[i];
        }
    }
    if (rest_e > 0) {
        x2 += (rest_o - rest_e) * (rest_o - rest_e) / rest_e;
        ++*df;
    }
    return x2;
}

/* The chi-square value a df-degree statistic exceeds with probability
 * 0.001 (Wilson and Hilferty's cube-root approximation). */
static double chi_square_bound(int df)
{
    double v = 2.0 / (9.0 * df), c = 1 - v + 3.09 * sqrt(v);
    return df * c * c * c;
}

/* Sampled tokens follow the model's distribution with guesses checked:
 * the token after a fixed first one, under a guess that is sometimes
 * right, is drawn N times at temperature 1 (seeds 0..N-1) and its counts
 * are held against the model's probabilities there (the top 20 of a
 * plain request for the prompt and that token: the same logits, batch
 * invariance) by a chi-square bound at p = 0.001. The guess was taken
 * and refused both; the counts a rule that always took the guess, or never
 * kept it, would give exceed the bound (the test can fail). */
static void test_speculation_distribution(void **st)
{
    (void)st;
    const llm_model *m = g_story ? g_story : g_tiny;
    enum { N = 4000, TOP = LLM_MAX_LOGPROBS, WAVE = 100 };
    int32_t p[64];
    int n = make_prompt(m, 3, p);
    llm_engine *e = open_engine(m, (llm_engine_config){0});
    llm_request rq = greedy(p, n, 1);
    static result r;
    collect(e, submit(e, &rq), 1, &r);
    g_t1 = r.tok[0][0];
    p[n] = g_t1; /* the prompt and that token: the distribution of the token after it */
    rq = greedy(p, n + 1, 1);
    rq.sampling.temperature = 1.0f;
    rq.sampling.n_logprobs = TOP;
    llm_request_id id = submit(e, &rq);
    llm_event ev;
    assert_int_equal(llm_engine_next(e, id, &ev, 60000), LLM_OK);
    assert_int_equal(ev.type, LLM_EVENT_TOKEN);
    llm_sample_result dist = ev.sample;
    llm_event_clear(&ev);
    while (llm_engine_next(e, id, &ev, 60000) == LLM_OK) llm_event_clear(&ev);
    close_engine(e);
    double prob[TOP + 1], mass = 0;
    for (int i = 0; i < dist.n_top; i++) mass += prob[i] = exp(dist.top[i].logprob);
    prob[dist.n_top] = 1 - mass > 0 ? 1 - mass : 0;
    g_guess = dist.top[1].id; /* likely enough to be taken often, and refused more often */
    llm_engine_config c = {.speculative = LLM_SPEC_CALLER, .spec_guess = fixed_guess, .spec_tokens = 1,
                           .max_seqs = WAVE, .spec_max_seqs = WAVE, .spec_step_rows = WAVE}; /* every wave guesses */
    e = open_engine(m, c);
    int count[TOP + 1] = {0}, total = 0;
    for (int w = 0; w < N; w += WAVE) {
        llm_request_id ids[WAVE];
        for (int i = 0; i < WAVE; i++) {
            rq = greedy(p, n, 3);
            rq.sampling.temperature = 1.0f;
            rq.sampling.seed = (uint64_t)(w + i);
            ids[i] = submit(e, &rq);
        }
        for (int i = 0; i < WAVE; i++) {
            collect(e, ids[i], 1, &r);
            if (r.n_tok[0] < 2 || r.tok[0][0] != g_t1)
                continue;
            int b = 0;
            while (b < dist.n_top && dist.top[b].id != r.tok[0][1]) b++;
            count[b]++;
            total++;
        }
    }
    llm_stats sst;
    llm_engine_stats(e, &sst);
    close_engine(e);
    int df;
    double x2 = chi_square(count, prob, dist.n_top + 1, total, &df);
    print_message("speculation distribution: %d draws after token %d, guess %d taken %llu of %llu times, chi-square "
                  "%.1f (df %d, bound %.1f)\n", total, g_t1, g_guess, (unsigned long long)sst.spec_accepted_tokens,
                  (unsigned long long)sst.spec_draft_tokens, x2, df, chi_square_bound(df));
    assert_true(total >= 200 && df >= 2);
    assert_true(sst.spec_accepted_tokens > 0 && sst.spec_accepted_tokens < sst.spec_draft_tokens);
    assert_true(x2 < chi_square_bound(df));
    int always[TOP + 1] = {0}, never[TOP + 1];
    always[1] = total; /* every guess taken */
    memcpy(never, count, sizeof never);
    never[0] += never[1]; /* the guess never kept: its draws go elsewhere */
    never[1] = 0;
    assert_true(chi_square(always, prob, dist.n_top + 1, total, &df) > chi_square_bound(df));
    assert_true(chi_square(never, prob, dist.n_top + 1, total, &df) > chi_square_bound(df));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batching_tiny),
        cmocka_unit_test(test_batching_q8_kv),
        cmocka_unit_test(test_batching_stories),
        cmocka_unit_test(test_prefix_cache),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_priority),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_n_completions),
        cmocka_unit_test(test_text_and_stop),
        cmocka_unit_test(test_mask_budget),
        cmocka_unit_test(test_shown_controls),
        cmocka_unit_test(test_held_pick_fails),
        cmocka_unit_test(test_stress),
        cmocka_unit_test(test_numeric_faults),
        cmocka_unit_test(test_embeddings),
        cmocka_unit_test(test_embedding_cache),
        cmocka_unit_test(test_embedding_limits), cmocka_unit_test(test_lora_prefix_cache),
        cmocka_unit_test(test_lora_add_remove),
        cmocka_unit_test(test_prompt_logprobs),
        cmocka_unit_test(test_prompt_logprobs_refused),
        cmocka_unit_test(test_speculation),
        cmocka_unit_test(test_speculation_draft),
        cmocka_unit_test(test_speculation_draft_cancel),
        cmocka_unit_test(test_speculation_distribution),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
