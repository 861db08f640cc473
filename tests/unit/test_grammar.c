/* test_grammar.c - token masks against a brute force: on real vocabularies
 * (../shared's Qwen2 byte-level BPE, 151k tokens, and Llama's SentencePiece
 * with byte tokens), along random walks through a grammar, every bit of
 * llm_gmatch_mask equals "this token's bytes keep the output viable"
 * asked of the matcher token by token (llm_gmatch_viable), and the end
 * tokens are allowed exactly when the output is complete. Also the
 * accept rules and the mask's cost per step (printed for the notes). */
#include <time.h>

#include "testutil.h"

#include "llm/gguf.h"
#include "llm/gmatch.h"
#include "llm/tokenizer.h"

typedef struct tvocab {
    gguf_file *f;
    llm_vocab *v;
    llm_gmatch_vocab *gv;
    llm_gmatch_cache *cache; /* shared by every walk: grammars must not see each other's masks */
} tvocab;

static int open_vocab(const char *rel, tvocab *t)
{
    char buf[512];
    const char *path = shared_path(rel, buf, sizeof buf);
    if (!path) {
        print_message("skipped: ../shared/%s not present\n", rel);
        return 0;
    }
    llm_error err = {0};
    if (gguf_open(path, &t->f, &err) || llm_vocab_load(t->f, &t->v, &err) || llm_gmatch_vocab_new(t->v, &t->gv, &err))
        fail_msg("%s: %s", rel, err.msg);
    assert_non_null(t->cache = llm_gmatch_cache_new(llm_vocab_n(t->v), 8u << 20));
    return 1;
}

static void close_vocab(tvocab *t)
{
    llm_gmatch_vocab_free(t->gv);
    llm_gmatch_cache_free(t->cache);
    llm_vocab_free(t->v);
    gguf_close(t->f);
}

static llm_grammar *compile(const char *text, const char *root)
{
    llm_grammar *g;
    llm_error err = {0};
    if (llm_grammar_compile(text, strlen(text), root, &g, &err))
        fail_msg("%s", err.msg);
    return g;
}

#define PIECE_MAX 512

/* Token id's text into piece (PIECE_MAX bytes) and its length, or -1 for
 * a token that is no text: an end, a control, unused or unknown token, or
 * one with no piece. */
static int text_piece(const tvocab *t, int id, char piece[PIECE_MAX])
{
    int len = llm_token_to_piece(t->v, id, 0, piece, PIECE_MAX), type = llm_vocab_token_type(t->v, id);
    if (llm_vocab_is_eog(t->v, id) || len <= 0 || len > PIECE_MAX || type == LLM_TOKEN_CONTROL ||
        type == LLM_TOKEN_UNUSED || type == LLM_TOKEN_UNKNOWN)
        return -1;
    return len;
}

/* Every token's bit against the brute force; returns how many are allowed. */
static int check_mask(const tvocab *t, llm_gmatch *m, const uint32_t *allow)
{
    int n = llm_vocab_n(t->v), n_allowed = 0;
    char piece[PIECE_MAX];
    for (int id = 0; id < n; id++) {
        int bit = (int)(allow[id >> 5] >> (id & 31)) & 1, want = 0;
        int len = text_piece(t, id, piece);
        if (llm_vocab_is_eog(t->v, id))
            want = llm_gmatch_complete(m);
        else if (len > 0)
            want = llm_gmatch_viable(m, piece, (size_t)len) == 1;
        if (bit != want)
            fail_msg("token %d (%.*s): mask %d, brute force %d", id, len > 0 ? len : 0, piece, bit, want);
        n_allowed += bit;
    }
    return n_allowed;
}

/* A random walk of steps tokens (seeded), checking each step's mask. */
static void walk(const tvocab *t, const char *grammar, const char *root, uint64_t seed, int steps)
{
    llm_grammar *g = compile(grammar, root);
    llm_gmatch *m;
    llm_error err = {0};
    assert_int_equal(llm_gmatch_new(g, t->gv, t->cache, 0, &m, &err), LLM_OK);
    int n = llm_vocab_n(t->v);
    uint32_t *allow = malloc(sizeof(uint32_t) * (size_t)(n + 31) / 32);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    assert_non_null(allow);
    assert_non_null(ids);
    for (int s = 0; s < steps; s++) {
        assert_int_equal(llm_gmatch_mask(m, allow, &err), LLM_OK);
        int k = check_mask(t, m, allow), c = 0;
        assert_true(k > 0);
        for (int id = 0; id < n; id++)
            if ((allow[id >> 5] >> (id & 31)) & 1 && !llm_vocab_is_eog(t->v, id))
                ids[c++] = id;
        if (!c)
            break; /* finished: only an end may come */
        int32_t pick = ids[test_rng(&seed) % (uint64_t)c];
        assert_int_equal(llm_gmatch_accept(m, pick, &err), LLM_OK);
    }
    free(allow);
    free(ids);
    llm_gmatch_free(m);
    llm_grammar_free(g);
}

static const char *const multibyte =
    "root ::= ( [\\u00e0-\\u00ff] | [\\u4e00-\\u9fff] | \"ab\" | [\\U0001F600-\\U0001F64F] )+ \"!\"\n";
static const char *const numbers = "root ::= \"[\" ( n ( \", \" n ){0,3} )? \"]\"\nn ::= \"-\"? [1-9] [0-9]{0,2}\n";

static void test_masks_qwen2(void **state)
{
    (void)state;
    tvocab t = {0};
    if (!open_vocab("testdata/tokenizer/ggml-vocab-qwen2.gguf", &t))
        skip();
    for (uint64_t seed = 1; seed <= 3; seed++) walk(&t, llm_gbnf_json, "jsonobject", seed, 12);
    walk(&t, multibyte, NULL, 9, 12);
    walk(&t, numbers, NULL, 4, 20);
    close_vocab(&t);
}

static void test_masks_spm(void **state)
{
    (void)state;
    tvocab t = {0};
    if (!open_vocab("testdata/tokenizer/ggml-vocab-llama-spm.gguf", &t))
        skip();
    for (uint64_t seed = 1; seed <= 3; seed++) walk(&t, llm_gbnf_json, "jsonobject", seed, 15);
    walk(&t, multibyte, NULL, 2, 15);
    walk(&t, numbers, NULL, 4, 20);
    close_vocab(&t);
}

/* The end comes only when the output is complete; once nothing can
 * follow, only the end is allowed; a refused token changes nothing. */
static void test_accept_rules(void **state)
{
    (void)state;
    tvocab t = {0};
    if (!open_vocab("testdata/tokenizer/ggml-vocab-qwen2.gguf", &t))
        skip();
    llm_grammar *g = compile("root ::= \"ok\" | \"okay\"\n", NULL);
    llm_gmatch *m;
    llm_error err = {0};
    assert_int_equal(llm_gmatch_new(g, t.gv, NULL, 0, &m, &err), LLM_OK);
    int32_t eos = llm_vocab_eos(t.v), ok = llm_vocab_find(t.v, "ok", 2), ay = llm_vocab_find(t.v, "ay", 2);
    int32_t x = llm_vocab_find(t.v, "x", 1);
    assert_true(eos >= 0 && ok >= 0 && ay >= 0 && x >= 0);
    assert_int_equal(llm_gmatch_accept(m, eos, &err), LLM_ERR_GRAMMAR);
    assert_int_equal(llm_gmatch_accept(m, x, &err), LLM_ERR_GRAMMAR);
    assert_int_equal(llm_gmatch_accept(m, ok, &err), LLM_OK);
    assert_true(llm_gmatch_complete(m) && !llm_gmatch_finished(m));
    assert_int_equal(llm_gmatch_accept(m, ay, &err), LLM_OK);
    assert_true(llm_gmatch_finished(m));
    uint32_t *allow = malloc(sizeof(uint32_t) * (size_t)(llm_vocab_n(t.v) + 31) / 32);
    assert_non_null(allow);
    assert_int_equal(llm_gmatch_mask(m, allow, &err), LLM_OK);
    int n = 0;
    for (int id = 0; id < llm_vocab_n(t.v); id++)
        if ((allow[id >> 5] >> (id & 31)) & 1) {
            assert_true(llm_vocab_is_eog(t.v, id));
            n++;
        }
    assert_true(n >= 1);
    assert_int_equal(llm_gmatch_accept(m, eos, &err), LLM_OK);
    free(allow);
    llm_gmatch_free(m);
    llm_grammar_free(g);
    close_vocab(&t);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Cost of a mask on 151k tokens: a fresh state (walk) and a cached one,
 * along a JSON object's text. Printed, not asserted (machines differ);
 * the notes quote it. */
static void test_mask_cost(void **state)
{
    (void)state;
    tvocab t = {0};
    if (!open_vocab("testdata/tokenizer/ggml-vocab-qwen2.gguf", &t))
        skip();
    llm_gmatch_cache_free(t.cache); /* a fresh one: the walks above filled it */
    assert_non_null(t.cache = llm_gmatch_cache_new(llm_vocab_n(t.v), 8u << 20));
    llm_grammar *g = compile(llm_gbnf_json, "jsonobject");
    const char *text = "{\"name\": \"Ada Lovelace\", \"born\": 1815, \"tags\": [\"math\", \"poetry\"], \"ok\": true}";
    int32_t *ids = NULL, n = 0;
    llm_error err = {0};
    assert_int_equal(llm_tokenize(t.v, text, strlen(text), 0, 0, &ids, &n, &err), LLM_OK);
    uint32_t *allow = malloc(sizeof(uint32_t) * (size_t)(llm_vocab_n(t.v) + 31) / 32);
    assert_non_null(allow);
    for (int pass = 0; pass < 2; pass++) { /* a fresh shared cache, then the same text again: a second request */
        double walk_ms = 0, max_ms = 0;
        uint64_t masks, cached;
        long max_work;
        llm_gmatch *m;
        assert_int_equal(llm_gmatch_new(g, t.gv, t.cache, 0, &m, &err), LLM_OK);
        for (int i = 0; i < n; i++) {
            double t0 = now_ms();
            assert_int_equal(llm_gmatch_mask(m, allow, &err), LLM_OK);
            double dt = now_ms() - t0;
            walk_ms += dt;
            max_ms = dt > max_ms ? dt : max_ms;
            assert_true((allow[ids[i] >> 5] >> (ids[i] & 31)) & 1);
            assert_int_equal(llm_gmatch_accept(m, ids[i], &err), LLM_OK);
        }
        assert_true(llm_gmatch_finished(m));
        llm_gmatch_stats(m, &masks, &cached, &max_work);
        print_message("grammar mask cost (jsonobject, qwen2 151k vocab, %d tokens, %s): %.2f ms mean, %.2f ms max, %llu of "
                      "%llu from the cache, at most %ld stack operations (budget %ld)\n", n,
                      pass ? "second request" : "first request", walk_ms / n, max_ms, (unsigned long long)cached,
                      (unsigned long long)masks, max_work, LLM_GMATCH_MAX_WORK);
        assert_true(max_work * 4 < LLM_GMATCH_MAX_WORK); /* room for grammars that branch more than JSON */
        if (pass)
            assert_int_equal(cached, masks); /* the shared cache held every state */
        llm_gmatch_free(m);
    }
    free(allow);
    free(ids);
    llm_grammar_free(g);
    close_vocab(&t);
}

/* ---- budgets ---- */

#define GRAMMAR_TEST_INF (1 << 29) /* grammar_impl.h's GRAMMAR_COST_INF */

static int mask_has(const uint32_t *allow, int32_t id) { return (int)(allow[id >> 5] >> (id & 31)) & 1; }

/* Whether m's mask under a budget of `tokens` is its plain mask (the
 * brute force's: check_mask fails the test where a bit differs). */
static int budget_plain(const tvocab *t, llm_gmatch *m, long tokens, uint32_t *allow)
{
    llm_error err = {0};
    llm_gmatch_set_budget(m, tokens);
    assert_int_equal(llm_gmatch_mask(m, allow, &err), LLM_OK);
    int n = llm_vocab_n(t->v), bent = 0;
    char piece[PIECE_MAX];
    for (int id = 0; id < n && !bent; id++) {
        int len = text_piece(t, id, piece);
        if (len > 0)
            bent = mask_has(allow, id) != (llm_gmatch_viable(m, piece, (size_t)len) == 1);
    }
    if (!bent)
        check_mask(t, m, allow);
    return !bent;
}

/* The fewest bytes that finish a grammar, found exactly: a budget of that
 * many tokens (the end included, so one short) leaves the first mask
 * plain; one more bends it (the grammars start with "x"*, and "x" leaves
 * as much to finish as before it: no room for that). */
static void expect_cost(const tvocab *t, const char *text, int cost)
{
    llm_grammar *g = compile(text, NULL);
    llm_gmatch *m;
    llm_error err = {0};
    uint32_t *allow = malloc(sizeof(uint32_t) * (size_t)(llm_vocab_n(t->v) + 31) / 32);
    assert_non_null(allow);
    assert_int_equal(llm_gmatch_new(g, t->gv, NULL, 0, &m, &err), LLM_OK);
    if (!budget_plain(t, m, cost, allow))
        fail_msg("%s: bent at a budget of %d tokens (it needs %d bytes and an end)", text, cost, cost);
    if (cost + 1 < GRAMMAR_TEST_INF && budget_plain(t, m, cost + 1, allow))
        fail_msg("%s: not bent at a budget of %d tokens", text, cost + 1);
    if (!budget_plain(t, m, -1, allow))
        fail_msg("%s: bent without a budget", text);
    free(allow);
    llm_gmatch_free(m);
    llm_grammar_free(g);
}

/* The mask of a matcher that has just walked it: a fresh cache, the
 * output so far (picks) accepted, the budget set. */
static void fresh_mask(const tvocab *t, const llm_grammar *g, const int32_t *picks, int n, long budget, uint32_t *allow)
{
    llm_gmatch_cache *c = llm_gmatch_cache_new(llm_vocab_n(t->v), 0);
    llm_gmatch *m;
    llm_error err = {0};
    assert_non_null(c);
    assert_int_equal(llm_gmatch_new(g, t->gv, c, 0, &m, &err), LLM_OK);
    for (int i = 0; i < n; i++) assert_int_equal(llm_gmatch_accept(m, picks[i], &err), LLM_OK);
    llm_gmatch_set_budget(m, budget);
    assert_int_equal(llm_gmatch_mask(m, allow, &err), LLM_OK);
    llm_gmatch_free(m);
    llm_gmatch_cache_free(c);
}

/* One output under a budget of `budget` tokens, the end included: random
 * picks among what the mask allows (the end by chance once allowed, or
 * when nothing else is). It must end within the budget. Three matchers
 * give the same masks: one on the shared cache, one on its own, and one
 * made afresh each step (so its mask is always walked: the cached masks'
 * token lists must give exactly what a walk gives); each mask a subset of
 * the plain one. Returns the tokens it took. */
static int budget_walk(const tvocab *t, const llm_grammar *g, uint64_t seed, int budget)
{
    llm_gmatch *a, *b;
    llm_error err = {0};
    int n = llm_vocab_n(t->v), words = (n + 31) / 32, c = 0, used = 0, ended = 0;
    uint32_t *allow = malloc(sizeof(uint32_t) * (size_t)words), *other = malloc(sizeof(uint32_t) * (size_t)words);
    uint32_t *plain = malloc(sizeof(uint32_t) * (size_t)words);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n), eog = -1, *picks = malloc(sizeof(int32_t) * (size_t)budget);
    assert_true(allow && other && plain && ids && picks);
    assert_int_equal(llm_gmatch_new(g, t->gv, t->cache, 0, &a, &err), LLM_OK);
    assert_int_equal(llm_gmatch_new(g, t->gv, NULL, 0, &b, &err), LLM_OK);
    for (; used < budget && !ended; used++) {
        llm_gmatch_set_budget(a, budget - used);
        llm_gmatch_set_budget(b, budget - used);
        assert_int_equal(llm_gmatch_mask(a, allow, &err), LLM_OK);
        assert_int_equal(llm_gmatch_mask(b, other, &err), LLM_OK);
        assert_memory_equal(allow, other, sizeof(uint32_t) * (size_t)words);
        fresh_mask(t, g, picks, used, budget - used, other);
        assert_memory_equal(allow, other, sizeof(uint32_t) * (size_t)words);
        llm_gmatch_set_budget(a, -1);
        assert_int_equal(llm_gmatch_mask(a, plain, &err), LLM_OK);
        c = 0, eog = -1;
        for (int id = 0; id < n; id++) {
            if (!mask_has(allow, id))
                continue;
            assert_true(mask_has(plain, id));
            if (llm_vocab_is_eog(t->v, id))
                eog = id;
            else
                ids[c++] = id;
        }
        int32_t pick = eog >= 0 && (!c || test_rng(&seed) % 8 == 0) ? eog : c ? ids[test_rng(&seed) % (uint64_t)c] : -1;
        if (pick < 0)
            fail_msg("seed %llu: no token allowed after %d of %d", (unsigned long long)seed, used, budget);
        ended = pick == eog;
        picks[used] = pick;
        assert_int_equal(llm_gmatch_accept(a, pick, &err), LLM_OK);
        assert_int_equal(llm_gmatch_accept(b, pick, &err), LLM_OK);
    }
    if (!ended)
        fail_msg("seed %llu: the output did not end within %d tokens", (unsigned long long)seed, budget);
    assert_true(llm_gmatch_complete(a));
    free(allow), free(other), free(plain), free(ids), free(picks);
    llm_gmatch_free(a);
    llm_gmatch_free(b);
    return used;
}

static const char *const nested =
    "root ::= \"{\\\"k\\\": \" v \"}\"\nv ::= \"[\" ( v ( \",\" v )* )? \"]\" | \"\\\"\" [a-z ]* \"\\\"\" | [0-9]+\n";

/* Budgets the output keeps: each walk ends within its budget, from the
 * least a grammar needs (its bytes and an end) up; costs found exactly. */
static void budgets_on(const char *vocab, int seeds)
{
    tvocab t = {0};
    if (!open_vocab(vocab, &t))
        skip();
    expect_cost(&t, "root ::= \"x\"* ( a | b )\na ::= \"xx\" a | \"yyyy\"\nb ::= c c\nc ::= \"z\" | \"zzz\"\n", 2);
    expect_cost(&t, "root ::= \"x\"* \"{\\\"id\\\": \" [0-9]+ \"}\"\n", 9);
    expect_cost(&t, "root ::= \"x\"* ( [\\u00e0-\\u00ff] | [\\u4e00-\\u9fff] )\n", 2);
    struct { const char *text, *root; int least; } gs[] = {
        {llm_gbnf_json, "jsonobject", 3}, {numbers, NULL, 3}, {multibyte, NULL, 4}, {nested, NULL, 9}};
    for (size_t i = 0; i < sizeof gs / sizeof gs[0]; i++) {
        llm_grammar *g = compile(gs[i].text, gs[i].root);
        uint64_t r = 77 + i;
        for (int s = 0; s < seeds; s++) {
            int budget = gs[i].least + (int)(test_rng(&r) % 30);
            budget_walk(&t, g, 1000 * i + (uint64_t)s, s == 0 ? gs[i].least : budget);
        }
        llm_grammar_free(g);
    }
    close_vocab(&t);
}

static void test_budget_qwen2(void **state)
{
    (void)state;
    budgets_on("testdata/tokenizer/ggml-vocab-qwen2.gguf", 8);
}

static void test_budget_spm(void **state)
{
    (void)state;
    budgets_on("testdata/tokenizer/ggml-vocab-llama-spm.gguf", 8);
}

/* A grammar whose shortest string is past any count (2^41 bytes) is
 * never bent. */
static void test_budget_saturates(void **state)
{
    (void)state;
    tvocab t = {0};
    if (!open_vocab("testdata/tokenizer/ggml-vocab-qwen2.gguf", &t))
        skip();
    char text[4096];
    size_t n = (size_t)snprintf(text, sizeof text, "root ::= r0 r0\n");
    for (int i = 0; i < 40; i++) n += (size_t)snprintf(text + n, sizeof text - n, "r%d ::= r%d r%d\n", i, i + 1, i + 1);
    snprintf(text + n, sizeof text - n, "r40 ::= \"ab\"\n");
    llm_grammar *g = compile(text, NULL);
    llm_gmatch *m;
    llm_error err = {0};
    uint32_t *allow = malloc(sizeof(uint32_t) * (size_t)(llm_vocab_n(t.v) + 31) / 32);
    assert_non_null(allow);
    assert_int_equal(llm_gmatch_new(g, t.gv, NULL, 0, &m, &err), LLM_OK);
    assert_true(budget_plain(&t, m, 1000000, allow));
    assert_true(budget_plain(&t, m, 3, allow));
    free(allow);
    llm_gmatch_free(m);
    llm_grammar_free(g);
    close_vocab(&t);
}

static llm_status compile_err(const char *text, size_t n, llm_error *err)
{
    llm_grammar *g = NULL;
    llm_status st = llm_grammar_compile(text, n, NULL, &g, err);
    llm_grammar_free(g);
    return st;
}

/* Every declared bound is an error naming it (no vocabulary needed). */
static void test_limits(void **state)
{
    (void)state;
    llm_error err = {0};
    size_t big = LLM_GBNF_MAX_BYTES + 1;
    char *text = malloc(big + 64);
    assert_non_null(text);
    memset(text, ' ', big);
    assert_int_equal(compile_err(text, big, &err), LLM_ERR_GRAMMAR);
    assert_non_null(strstr(err.msg, "bytes"));
    size_t n = (size_t)snprintf(text, 64, "root ::= ");
    for (int i = 0; i < 250; i++) n += (size_t)snprintf(text + n, 64, "\"a\"{10000} ");
    assert_int_equal(compile_err(text, n, &err), LLM_ERR_GRAMMAR);
    assert_non_null(strstr(err.msg, "elements"));
    assert_int_equal(compile_err("root ::= x", 10, &err), LLM_ERR_GRAMMAR);
    assert_string_equal(err.msg, "grammar: line 1, column 10: rule 'x' is used but never defined");
    assert_int_equal(compile_err("root ::= (\"a\"?)*", 17, &err), LLM_ERR_GRAMMAR);
    assert_non_null(strstr(err.msg, "line 1, column 1")); /* where the group was made, not the end */

    llm_grammar *g = compile("root ::= \"(\" root \")\" | \"x\"\n", NULL);
    llm_gmatch *m;
    assert_int_equal(llm_gmatch_new(g, NULL, NULL, 0, &m, &err), LLM_OK);
    memset(text, '(', LLM_GMATCH_MAX_DEPTH + 8);
    assert_int_equal(llm_gmatch_feed(m, text, LLM_GMATCH_MAX_DEPTH + 8, &err), LLM_ERR_GRAMMAR);
    assert_non_null(strstr(err.msg, "nested deeper"));
    assert_int_equal(llm_gmatch_feed(m, "(x)", 3, &err), LLM_OK); /* a refused feed changed nothing */
    assert_true(llm_gmatch_finished(m));
    uint32_t allow[4];
    assert_int_equal(llm_gmatch_mask(m, allow, &err), LLM_ERR_GRAMMAR); /* no vocabulary index */
    llm_gmatch_free(m);
    llm_grammar_free(g);

    g = compile("root ::= x\nx ::= \"a\" x \"b\" | \"a\" x | \"\"\n", NULL); /* ~3n parses after n a's */
    assert_int_equal(llm_gmatch_new(g, NULL, NULL, 0, &m, &err), LLM_OK);
    memset(text, 'a', LLM_GMATCH_MAX_STACKS);
    assert_int_equal(llm_gmatch_feed(m, text, LLM_GMATCH_MAX_STACKS / 8, &err), LLM_OK);
    assert_int_equal(llm_gmatch_feed(m, text, LLM_GMATCH_MAX_STACKS, &err), LLM_ERR_GRAMMAR);
    assert_non_null(strstr(err.msg, "ambiguous"));
    llm_gmatch_free(m);
    llm_grammar_free(g);
    free(text);
}

/* Compiling is linear: a chain of 50,000 rules that only the last makes
 * nullable (a fixed point over all rules took a pass per rule: minutes). */
static void test_compile_linear(void **state)
{
    (void)state;
    size_t cap = 50000 * 24 + 256, n = 0;
    char *text = malloc(cap);
    assert_non_null(text);
    n += (size_t)snprintf(text + n, cap - n, "root ::= r0 \"x\"\n");
    for (int i = 0; i < 50000; i++) n += (size_t)snprintf(text + n, cap - n, "r%d ::= r%d\n", i, i + 1);
    n += (size_t)snprintf(text + n, cap - n, "r50000 ::= \"\"\n");
    double t0 = now_ms();
    llm_grammar *g = compile(text, NULL);
    double ms = now_ms() - t0;
    llm_gmatch *m;
    llm_error err = {0};
    /* expanding 50,000 nested rules before the first character is past a bound of its own */
    assert_int_equal(llm_gmatch_new(g, NULL, NULL, 0, &m, &err), LLM_ERR_GRAMMAR);
    assert_non_null(strstr(err.msg, "expansion deeper"));
    print_message("compile of a 50,000-rule chain: %.0f ms\n", ms);
    assert_true(ms < 5000);
    llm_grammar_free(g);
    free(text);
}

/* Bytes after a prefix, and whether a fresh matcher takes them (1) or not. */
typedef struct viable_case {
    const char *prefix, *bytes;
    int want;
} viable_case;

/* Each case against a matcher of grammar text (root may be NULL) without a
 * vocabulary: llm_gmatch_viable asks the matcher byte by byte. */
static void expect_viable(const char *text, const char *root, const viable_case *c, size_t n)
{
    llm_grammar *g = compile(text, root);
    for (size_t i = 0; i < n; i++) {
        llm_gmatch *m;
        llm_error err = {0};
        assert_int_equal(llm_gmatch_new(g, NULL, NULL, 0, &m, &err), LLM_OK);
        assert_int_equal(llm_gmatch_feed(m, c[i].prefix, strlen(c[i].prefix), &err), LLM_OK);
        if (llm_gmatch_viable(m, c[i].bytes, strlen(c[i].bytes)) != c[i].want)
            fail_msg("%.40s...: case %zu: viable %d expected", text, i, c[i].want);
        llm_gmatch_free(m);
    }
    llm_grammar_free(g);
}

#define EXPECT_VIABLE(text, root, ...)                                                                                \
    do {                                                                                                              \
        static const viable_case cases_[] = {__VA_ARGS__};                                                            \
        expect_viable(text, root, cases_, sizeof cases_ / sizeof *cases_);                                            \
    } while (0)

/* A character begun but not ended is alive only while some ending of it is
 * a code point the grammar takes and UTF-8 may encode: the surrogates
 * D800-DFFF are not, so after 0xED only 0x80-0x9F may come. (A trace once
 * sampled byte 0xED, then 0xB8 inside a JSON string: both bytes passed the
 * mask, and the next mask allowed no token at all.) */
static void test_partial_utf8(void **state)
{
    (void)state;
    EXPECT_VIABLE(llm_gbnf_json, "jsonobject", {"{\"", "\xED", 1},
                  {"{\"", "\xED\x9F", 1},         /* U+D7C0..U+D7FF */
                  {"{\"", "\xED\x9F\xBF", 1},     /* U+D7FF */
                  {"{\"", "\xED\xA0", 0},         /* only surrogates follow */
                  {"{\"", "\xED\xB8", 0}, {"{\"", "\xED\xA0\x80", 0}, /* U+D800 */
                  {"{\"\xED", "\xB8", 0},         /* the same, a byte at a time */
                  {"{\"", "\xEE\x80\x80", 1});    /* U+E000 */
    /* a class beside the surrogates on either side: what remains of a begun
     * character is met only outside them */
    EXPECT_VIABLE("root ::= [\\ue000]\n", NULL, {"", "\xED", 0}, {"", "\xEE\x80", 1}, {"", "\xEE\x81", 0});
    EXPECT_VIABLE("root ::= [\\ud7ff]\n", NULL, {"", "\xED", 1}, {"", "\xED\x9F", 1}, {"", "\xED\xA0", 0});
}

/* Grammar text whose class or literal holds only surrogates, or nothing,
 * is refused at compile time: such an element can never match, so a mask
 * would allow the token that reaches it and the next mask no token at all. */
static void test_no_surrogates(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "root ::= \"a\" \"\\ud800\"\n", "root ::= [\\ud800-\\udfff]\n", "root ::= [\\udc00]\n",
        "root ::= [^\\x00-\\ud7ff\\ue000-\\U0010ffff]\n", "root ::= \"a\" [^\\x00-\\U0010FFFF]\n"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        llm_grammar *g = NULL;
        llm_error err = {0};
        if (llm_grammar_compile(bad[i], strlen(bad[i]), NULL, &g, &err) != LLM_ERR_GRAMMAR)
            fail_msg("%s compiled", bad[i]);
        if (!strstr(err.msg, "surrogate"))
            fail_msg("%s: %s", bad[i], err.msg);
    }
    /* ranges across the gap, and classes that leave something beside it, stay */
    EXPECT_VIABLE("root ::= [\\ud7ff-\\ue000]\n", NULL, {"", "\xED\x9F\xBF", 1}, {"", "\xEE\x80\x80", 1},
                  {"", "\xED\xA0", 0});
    EXPECT_VIABLE("root ::= [^\\x00-\\ud7fe\\ue000-\\U0010ffff]\n", NULL, {"", "\xED\x9F\xBF", 1});
    /* a surrogate may end a range or stand in a negated class: the class keeps its characters */
    EXPECT_VIABLE("root ::= [^\\ud800-\\udfff]\n", NULL, {"", "\xED\x9F\xBF", 1}, {"", "\xED\xA0", 0},
                  {"", "\xF0\x9F\x98\x80", 1});
    EXPECT_VIABLE("root ::= [\\x20-\\udfff]\n", NULL, {"", "\xED\x9F\xBF", 1}, {"", "\xEE", 0});
}

/* Feeds text through a matcher of g in partition, counting masks and hits. */
static void run_text(tvocab *t, const llm_grammar *g, uint64_t partition, const int32_t *ids, int n, uint64_t *masks,
                     uint64_t *cached)
{
    llm_gmatch *m;
    llm_error err = {0};
    long work;
    uint32_t *allow = malloc(sizeof(uint32_t) * (size_t)(llm_vocab_n(t->v) + 31) / 32);
    assert_non_null(allow);
    assert_int_equal(llm_gmatch_new(g, t->gv, t->cache, partition, &m, &err), LLM_OK);
    for (int i = 0; i < n; i++) {
        assert_int_equal(llm_gmatch_mask(m, allow, &err), LLM_OK);
        assert_int_equal(llm_gmatch_accept(m, ids[i], &err), LLM_OK);
    }
    llm_gmatch_stats(m, masks, cached, &work);
    llm_gmatch_free(m);
    free(allow);
}

/* The shared cache serves a partition and a compiled grammar only its own
 * masks: another tenant, or another compilation of the same text, finds
 * none of them (it walks as a fresh cache would), the same one finds all. */
static void test_cache_isolation(void **state)
{
    (void)state;
    tvocab t = {0};
    if (!open_vocab("testdata/tokenizer/ggml-vocab-qwen2.gguf", &t))
        skip();
    const char *text = "{\"a\": [1, 22, 333], \"b\": {\"c\": \"d e f\"}}";
    int32_t *ids = NULL, n = 0;
    llm_error err = {0};
    assert_int_equal(llm_tokenize(t.v, text, strlen(text), 0, 0, &ids, &n, &err), LLM_OK);
    llm_grammar *g = compile(llm_gbnf_json, "jsonobject"), *g2 = compile(llm_gbnf_json, "jsonobject");
    uint64_t m1, c1, m2, c2, m3, c3, m4, c4;
    run_text(&t, g, 7, ids, n, &m1, &c1);  /* a fresh cache: hits only on states this text repeats */
    run_text(&t, g, 8, ids, n, &m2, &c2);  /* another partition */
    run_text(&t, g2, 7, ids, n, &m3, &c3); /* the same text compiled again */
    run_text(&t, g, 7, ids, n, &m4, &c4);  /* the first again */
    assert_true(c1 < m1);
    assert_int_equal(c2, c1);
    assert_int_equal(c3, c1);
    assert_int_equal(c4, m4);
    llm_grammar_free(g);
    llm_grammar_free(g2);
    free(ids);
    close_vocab(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_limits), cmocka_unit_test(test_compile_linear),
        cmocka_unit_test(test_masks_qwen2), cmocka_unit_test(test_masks_spm), cmocka_unit_test(test_accept_rules),
        cmocka_unit_test(test_mask_cost), cmocka_unit_test(test_cache_isolation), cmocka_unit_test(test_partial_utf8),
        cmocka_unit_test(test_no_surrogates), cmocka_unit_test(test_budget_qwen2), cmocka_unit_test(test_budget_spm),
        cmocka_unit_test(test_budget_saturates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
