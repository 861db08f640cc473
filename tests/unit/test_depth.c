/* test_depth.c - every recursive routine that request or model-output code
 * reaches, at its depth limit, on a thread with an eighth of the stack such
 * code runs on (LLM_THREAD_STACK), under a guard page: a routine whose
 * limit does not fit crashes the test. Each case also goes one level past
 * its limit and wants a clean error naming it, and prints the stack it
 * used at the limit (the stack is filled with a pattern first, so what is
 * left of it shows the deepest point). `make asan` runs it with ASan's
 * larger frames too. */
#include "testutil.h"

#include <sys/mman.h>

#include "llm/gmatch.h"
#include "llm/grammar.h"
#include "llm/jinja.h"
#include "llm/json.h"
#include "llm/thread.h"
#include "srv.h"
#include "srv_chat.h"
#include "llm/regex.h"
#include "llm/schema.h"
#include "llm/tools.h"

#define SMALL_STACK (LLM_THREAD_STACK / 8)
#define FILL 0xA5

/* Runs fn(arg) on a thread whose stack is SMALL_STACK bytes over a guard
 * page; the bytes of it that fn used. */
static size_t run_measured(void *(*fn)(void *), void *arg)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *base = mmap(NULL, SMALL_STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(base != MAP_FAILED);
    assert_int_equal(mprotect(base, page, PROT_NONE), 0);
    unsigned char *stack = base + page;
    memset(stack, FILL, SMALL_STACK);
    pthread_attr_t a;
    pthread_t t;
    pthread_attr_init(&a);
    assert_int_equal(pthread_attr_setstack(&a, stack, SMALL_STACK), 0);
    assert_int_equal(pthread_create(&t, &a, fn, arg), 0);
    pthread_join(t, NULL);
    pthread_attr_destroy(&a);
    size_t i = 0;
    while (i < SMALL_STACK && stack[i] == FILL) i++;
    munmap(base, SMALL_STACK + page);
    return SMALL_STACK - i;
}

/* What a case reports: at the limit it worked (ok), past it the error
 * named the limit (refused); why says what failed. */
typedef struct outcome {
    int ok, refused;
    char why[3 * 1024];
} outcome;

static void check(const char *name, void *(*fn)(void *))
{
    outcome o = {0};
    size_t used = run_measured(fn, &o);
    print_message("%-34s %7zu bytes of stack at its limit (%zu KiB here, %zu MiB in production)\n", name, used,
                  (size_t)SMALL_STACK >> 10, LLM_THREAD_STACK >> 20);
    if (!o.ok || !o.refused)
        fail_msg("%s: at the limit %s; past it %s (%s)", name, o.ok ? "ok" : "FAILED", o.refused ? "refused" : "NOT refused",
                 o.why);
}

/* s repeated n times, then mid, then t repeated n times (malloc'd). */
static char *wrap(const char *s, int n, const char *mid, const char *t)
{
    size_t len = (strlen(s) + strlen(t)) * (size_t)n + strlen(mid) + 1;
    char *out = malloc(len), *p = out;
    for (int i = 0; i < n; i++) p += sprintf(p, "%s", s);
    p += sprintf(p, "%s", mid);
    for (int i = 0; i < n; i++) p += sprintf(p, "%s", t);
    return out;
}

/* ---- JSON (jansson behind llm_json_load) ------------------------------------------ */

static void *json_case(void *arg)
{
    outcome *o = arg;
    char *at = wrap("{\"a\":[", LLM_JSON_MAX_DEPTH / 2, "1", "]}"), *past = wrap("[", LLM_JSON_MAX_DEPTH + 1, "1", "]");
    llm_error err = {0};
    json_t *v = llm_json_loads(at, 0, &err);
    json_t *w = json_pack("{s:[{s:{s:O}}]}", "choices", "message", "content", v); /* dumped inside our own levels */
    char *text = json_dumps(w, JSON_COMPACT);
    json_t *copy = json_deep_copy(w);
    o->ok = v && text && json_equal(copy, w);
    snprintf(o->why, sizeof o->why, "%s", err.msg);
    json_t *p = llm_json_loads(past, 0, &err);
    o->refused = !p && strstr(err.msg, "deeper than 64");
    json_decref(p);
    json_decref(copy);
    free(text);
    json_decref(w);
    json_decref(v);
    free(at);
    free(past);
    return NULL;
}

/* ---- JSON Schema and patterns to grammar ------------------------------------------ */

/* A schema nested depth levels: array of object of array ... of string. */
static json_t *deep_schema(int depth)
{
    json_t *s = json_pack("{s:s}", "type", "string");
    for (int i = 0; i < depth; i++)
        s = i % 2 ? json_pack("{s:s,s:o}", "type", "array", "items", s)
                  : json_pack("{s:s,s:{s:o},s:[s]}", "type", "object", "properties", "k", s, "required", "k");
    return s;
}

static void *schema_case(void *arg)
{
    outcome *o = arg;
    int depth = 1;
    char *g = NULL;
    llm_error e = {0};
    /* the deepest schema that converts, then one level more */
    for (;; depth++) {
        json_t *s = deep_schema(depth);
        llm_status st = llm_schema_grammar(s, &g, &e);
        json_decref(s);
        if (st)
            break;
        free(g);
    }
    /* each level deep_schema adds is one subschema, over the innermost one: 63 of them make the limit's 64
     * (a body's JSON holds ~30 within its own 64 levels) */
    o->ok = depth - 1 == LLM_SCHEMA_MAX_DEPTH - 1;
    o->refused = strstr(e.msg, "nested deeper") != NULL;
    snprintf(o->why, sizeof o->why, "deepest %d: %s", depth - 1, e.msg);
    return NULL;
}

static void *regex_case(void *arg)
{
    outcome *o = arg;
    char why[200] = "";
    llm_strbuf out = {0};
    int depth = 1;
    for (;; depth++) {
        char *p = wrap("(", depth, "a|b", ")*");
        int rc = llm_regex_grammar(p, strlen(p), &out, why, sizeof why);
        llm_strbuf_free(&out);
        free(p);
        if (rc)
            break;
    }
    o->ok = depth - 1 == LLM_REGEX_MAX_DEPTH;
    o->refused = strstr(why, "nested deeper than") != NULL;
    snprintf(o->why, sizeof o->why, "deepest %d: %s", depth - 1, why);
    return NULL;
}

/* ---- grammars: the compiler and the matcher ---------------------------------------- */

static void *grammar_case(void *arg)
{
    outcome *o = arg;
    llm_grammar *g = NULL;
    llm_error err = {0};
    char *at = wrap("(\"x\" ", LLM_GRAMMAR_MAX_NESTING, "\"a\" | \"b\"", ")+"), *past = wrap("(", LLM_GRAMMAR_MAX_NESTING + 1, "\"a\"", ")");
    char *t1 = malloc(strlen(at) + 16), *t2 = malloc(strlen(past) + 16);
    sprintf(t1, "root ::= %s", at);
    sprintf(t2, "root ::= %s", past);
    o->ok = llm_grammar_compile(t1, strlen(t1), NULL, &g, &err) == LLM_OK;
    snprintf(o->why, sizeof o->why, "%s", err.msg);
    llm_grammar_free(g);
    g = NULL;
    o->refused = llm_grammar_compile(t2, strlen(t2), NULL, &g, &err) != LLM_OK && strstr(err.msg, "nested");
    llm_grammar_free(g);
    free(at), free(past), free(t1), free(t2);
    return NULL;
}

static test_tiny g_tiny;

/* A chain of n rules, each only the next, the last "a": every push walks
 * the whole chain at once. */
static char *chain_grammar(int n)
{
    char *t = malloc((size_t)n * 32 + 64), *p = t;
    p += sprintf(p, "root ::= r0\n");
    for (int i = 0; i < n; i++) p += sprintf(p, "r%d ::= r%d\n", i, i + 1);
    sprintf(p, "r%d ::= \"a\"\n", n);
    return t;
}

/* The matcher of grammar text t at its start; its status, err set. */
static llm_status match_start(const char *t, llm_error *err)
{
    llm_grammar *g = NULL;
    llm_gmatch_vocab *gv = NULL;
    llm_gmatch *m = NULL;
    llm_gmatch_cache *cache = llm_gmatch_cache_new(llm_vocab_n(g_tiny.m->vocab), 1 << 20);
    uint32_t *allow = calloc((size_t)(llm_vocab_n(g_tiny.m->vocab) + 31) / 32, sizeof *allow);
    llm_status st = llm_grammar_compile(t, strlen(t), NULL, &g, err);
    if (!st)
        st = llm_gmatch_vocab_new(g_tiny.m->vocab, &gv, err);
    if (!st)
        st = llm_gmatch_new(g, gv, cache, 0, &m, err);
    if (!st)
        st = llm_gmatch_mask(m, allow, err);
    llm_gmatch_free(m);
    llm_gmatch_vocab_free(gv);
    llm_gmatch_cache_free(cache);
    llm_grammar_free(g);
    free(allow);
    return st;
}

static void *gmatch_case(void *arg)
{
    outcome *o = arg;
    llm_error err = {0};
    char *at = chain_grammar(LLM_GMATCH_MAX_EXPAND - 2), *past = chain_grammar(LLM_GMATCH_MAX_EXPAND + 2);
    o->ok = match_start(at, &err) == LLM_OK;
    snprintf(o->why, sizeof o->why, "%s", err.msg);
    o->refused = match_start(past, &err) == LLM_ERR_GRAMMAR && strstr(err.msg, "expansion deeper");
    free(at);
    free(past);
    return NULL;
}

/* ---- Jinja: parse, evaluation, macros, values ---------------------------------------- */

/* Compiles and renders src; 0 with the text's first bytes in out, or the
 * status with err set. */
static llm_status jinja_run(const char *src, char *out, size_t n, llm_error *err)
{
    llm_jinja *t = NULL;
    llm_status st = llm_jinja_compile(src, strlen(src), &t, err);
    llm_jctx *c = st ? NULL : llm_jctx_new(NULL);
    llm_jv *vars = c ? llm_jv_dict(c) : NULL;
    size_t len = 0;
    char *text = vars ? llm_jinja_render(t, c, vars, &len, NULL, NULL, err) : NULL;
    if (!st && !text)
        st = err->code ? err->code : LLM_ERR_NOMEM;
    if (text)
        snprintf(out, n, "%s", text);
    free(text);
    llm_jctx_free(c);
    llm_jinja_free(t);
    return st;
}

/* The deepest nesting of (open, mid, close) between pre and post that
 * compiles and renders; why gets the refusal one past it. */
static int jinja_deepest(const char *pre, const char *open, const char *mid, const char *close, const char *post,
                         char *why, size_t why_n)
{
    int d = 1;
    for (;; d++) {
        char *inner = wrap(open, d, mid, close), out[64];
        char *src = malloc(strlen(inner) + strlen(pre) + strlen(post) + 1);
        sprintf(src, "%s%s%s", pre, inner, post);
        llm_error err = {0};
        llm_status st = jinja_run(src, out, sizeof out, &err);
        free(inner);
        free(src);
        if (st) {
            snprintf(why, why_n, "%s", err.msg);
            return d - 1;
        }
    }
}

/* The deepest nesting of each kind the Jinja parser takes (its JX_MAX_DEPTH, 256, in its own units). */
enum { EXPR_DEEPEST = 84, BLOCK_DEEPEST = 253 };

static void *jinja_case(void *arg)
{
    outcome *o = arg;
    char w1[LLM_ERROR_MSG_MAX] = "", w2[LLM_ERROR_MSG_MAX] = "", w3[LLM_ERROR_MSG_MAX] = "", w4[LLM_ERROR_MSG_MAX] = "";
    char out[64] = "";
    int expr = jinja_deepest("{{ ", "(", "1", ")", " }}", w1, sizeof w1);
    int list = jinja_deepest("{{ ", "[", "1", "]", " | tojson }}", w2, sizeof w2);
    int eq = jinja_deepest("{{ ", "[", "1", "]", " == [[1]] }}", w3, sizeof w3);
    int blocks = jinja_deepest("", "{% if true %}", "x", "{% endif %}", "", w4, sizeof w4);
    llm_error err = {0};
    /* a macro that calls itself: 64 deep, then 65 */
    const char *rec = "{%% macro f(n) %%}{%% for i in [1] %%}{%% if n > 0 %%}{{ f(n - 1) }}{%% else %%}end{%% endif %%}"
                      "{%% endfor %%}{%% endmacro %%}{{ f(%d) }}";
    char src[300];
    snprintf(src, sizeof src, rec, 63);
    int macro_ok = jinja_run(src, out, sizeof out, &err) == LLM_OK && !strcmp(out, "end");
    snprintf(src, sizeof src, rec, 64);
    int macro_refused = jinja_run(src, out, sizeof out, &err) != LLM_OK && strstr(err.msg, "macro calls nested");
    /* the parser counts JX_MAX_DEPTH (256) levels: a parenthesis or list costs 3 of them (expression, primary,
     * postfix), a block 1 and its body's statement 1 more; macros are counted apart (JX_MACRO_DEPTH) */
    o->ok = expr == EXPR_DEEPEST && list == EXPR_DEEPEST && eq == EXPR_DEEPEST && blocks == BLOCK_DEEPEST && macro_ok;
    o->refused = strstr(w1, "nested") && strstr(w2, "nested") && strstr(w3, "nested") && strstr(w4, "nested") &&
                 macro_refused;
    snprintf(o->why, sizeof o->why, "expr %d (%s), list %d (%s), eq %d (%s), blocks %d (%s), macro %d/%d (%s)", expr, w1,
             list, w2, eq, w3, blocks, w4, macro_ok, macro_refused, err.msg);
    return NULL;
}

/* ---- the chat layer and tool calls ------------------------------------------------------- */

static json_t *deep_array(int depth)
{
    json_t *v = json_integer(1);
    for (int i = 0; i < depth; i++) v = json_pack("[o]", v);
    return v;
}

static void *chat_value_case(void *arg)
{
    outcome *o = arg;
    llm_jctx *c = llm_jctx_new(NULL);
    llm_error err = {0};
    json_t *at = deep_array(SRV_CHAT_DEPTH), *past = deep_array(SRV_CHAT_DEPTH + 1);
    o->ok = srv_chat_value(c, at, 1, &err) != NULL;
    snprintf(o->why, sizeof o->why, "%s", err.msg);
    o->refused = !srv_chat_value(c, past, 1, &err) && strstr(err.msg, "nested more than");
    json_decref(at);
    json_decref(past);
    llm_jctx_free(c);
    return NULL;
}

/* An answer in format f calling "f" with arguments {"a": <depth levels>}. */
static int extract_deep(llm_tool_format f, int depth, json_t **calls)
{
    json_t *body = json_pack("{s:[{s:s,s:{s:s,s:{s:s}}}]}", "tools", "type", "function", "function", "name", "f",
                             "parameters", "type", "object");
    llm_tools t;
    llm_error e = {0};
    char *content = NULL, *text;
    if (llm_tools_parse(body, f, &t, &e)) { /* (not fail_msg: this runs on a thread of its own) */
        json_decref(body);
        return -100;
    }
    text = wrap("[", depth, "1", "]");
    char *answer = malloc(strlen(text) + 128);
    if (f == LLM_TOOLS_GEMMA4)
        sprintf(answer, "<|tool_call>call:f{a:%s}<tool_call|>", text);
    else
        sprintf(answer, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": %s}}</tool_call>", text);
    int rc = llm_tools_extract(&t, NULL, answer, strlen(answer), calls, &content);
    free(content);
    free(answer);
    free(text);
    json_decref(body);
    return rc;
}

static void *tools_case(void *arg)
{
    outcome *o = arg;
    json_t *c1 = NULL, *c2 = NULL, *c3 = NULL, *c4 = NULL;
    /* hermes: the call object (1) and its arguments (2) hold the array's levels */
    int h_at = extract_deep(LLM_TOOLS_HERMES, LLM_JSON_MAX_DEPTH - 2, &c1);
    int h_past = extract_deep(LLM_TOOLS_HERMES, LLM_JSON_MAX_DEPTH - 1, &c2);
    /* gemma4: its own reader; the arguments object is the first level */
    int g_at = extract_deep(LLM_TOOLS_GEMMA4, LLM_JSON_MAX_DEPTH - 1, &c3);
    int g_past = extract_deep(LLM_TOOLS_GEMMA4, LLM_JSON_MAX_DEPTH, &c4);
    o->ok = h_at == 0 && json_array_size(c1) == 1 && g_at == 0 && json_array_size(c3) == 1;
    o->refused = h_past == LLM_ERR_TOO_LONG && g_past == LLM_ERR_TOO_LONG;
    snprintf(o->why, sizeof o->why, "hermes %d/%d, gemma4 %d/%d", h_at, h_past, g_at, g_past);
    json_decref(c1), json_decref(c2), json_decref(c3), json_decref(c4);
    return NULL;
}

static void test_json_at_limit(void **s) { (void)s, check("JSON load and dump", json_case); }
static void test_schema_at_limit(void **s) { (void)s, check("JSON Schema to grammar", schema_case); }
static void test_regex_at_limit(void **s) { (void)s, check("pattern to grammar", regex_case); }
static void test_grammar_at_limit(void **s) { (void)s, check("grammar compiler", grammar_case); }
static void test_gmatch_at_limit(void **s) { (void)s, check("grammar matcher (rule expansion)", gmatch_case); }
static void test_jinja_at_limit(void **s) { (void)s, check("Jinja parse, render, macros", jinja_case); }
static void test_chat_value_at_limit(void **s) { (void)s, check("request values to Jinja", chat_value_case); }
static void test_tools_at_limit(void **s) { (void)s, check("tool calls from model output", tools_case); }

static int setup(void **st)
{
    (void)st;
    llm_json_init();
    return test_tiny_open(&g_tiny, "depth", QT_Q8_0, 3, 1);
}

static int teardown(void **st)
{
    (void)st;
    test_tiny_close(&g_tiny);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_at_limit),     cmocka_unit_test(test_schema_at_limit),
        cmocka_unit_test(test_regex_at_limit),    cmocka_unit_test(test_grammar_at_limit),
        cmocka_unit_test(test_gmatch_at_limit),   cmocka_unit_test(test_jinja_at_limit),
        cmocka_unit_test(test_chat_value_at_limit), cmocka_unit_test(test_tools_at_limit),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
