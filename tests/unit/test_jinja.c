/* test_jinja.c - the Jinja interpreter's contract beyond what jinja2 can
 * judge (tests/integration/test_jinja_oracle.py holds the output to
 * jinja2): compile errors name the line; every bound (steps, memory,
 * macro depth, range size, value depth, template size) ends a render
 * with LLM_ERR_TEMPLATE and a message instead of running away; tenant
 * bytes come out as spans through string operations; the value API
 * takes NULLs; a compiled template renders from several threads at once. */
#include <pthread.h>

#include "testutil.h"

#include "llm/jinja.h"

/* Renders src with {"x": x_text (tenant)}; returns the text or NULL (err). */
static char *render(const char *src, const char *x, const llm_jinja_limits *lim, llm_span **sp, int *n_sp,
                    llm_error *err)
{
    llm_jinja *t = NULL;
    if (llm_jinja_compile(src, strlen(src), &t, err))
        return NULL;
    llm_jctx *c = llm_jctx_new(lim);
    assert_non_null(c);
    llm_jv *vars = llm_jv_dict(c);
    assert_int_equal(llm_jv_set(c, vars, "x", 1, 0, llm_jv_str(c, x, strlen(x), 1)), LLM_OK);
    char *text = llm_jinja_render(t, c, vars, NULL, sp, n_sp, err);
    llm_jctx_free(c);
    llm_jinja_free(t);
    return text;
}

static void expect_error(const char *src, const llm_jinja_limits *lim, const char *want)
{
    llm_error err = {0};
    llm_span *sp = NULL;
    int n = 0;
    char *text = render(src, "x", lim, &sp, &n, &err);
    if (text)
        fail_msg("%s rendered %s; expected an error with '%s'", src, text, want);
    assert_int_equal(err.code, LLM_ERR_TEMPLATE);
    if (!strstr(err.msg, want))
        fail_msg("%s: error '%s' lacks '%s'", src, err.msg, want);
    assert_null(sp);
}

static void test_compile_errors_name_the_line(void **state)
{
    (void)state;
    expect_error("a\nb\n{% if x %}\nno end", NULL, "line 3");
    expect_error("{{ 1 +* 2 }}", NULL, "line 1");
    expect_error("\n\n{{ x | nosuchfilter }}", NULL, "line 3: no filter named 'nosuchfilter'");
    expect_error("{% include 'x' %}", NULL, "unsupported tag 'include'");
    expect_error("{{ 'unterminated }}", NULL, "closing quote");
    llm_jinja *t = NULL;
    llm_error err = {0};
    size_t big = (1u << 20) + 1;
    char *src = malloc(big + 1);
    memset(src, 'a', big);
    src[big] = 0;
    assert_int_equal(llm_jinja_compile(src, big, &t, &err), LLM_ERR_TOO_LONG);
    free(src);
    assert_null(t);
}

static void test_bounds_end_a_render(void **state)
{
    (void)state;
    llm_jinja_limits few_steps = {.max_steps = 10000}, little_mem = {.max_bytes = 1u << 20};
    expect_error("{% for i in range(100000) %}{{ i }}{% endfor %}", &few_steps, "steps");
    expect_error("{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 &little_mem, "memory");
    expect_error("{{ 'x' * 100000000000 }}", &little_mem, "memory");
    expect_error("{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", NULL, "nested more than");
    expect_error("{{ range(100001) | length }}", NULL, "Range too big");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, "overflow");
    expect_error("{{ raise_exception('no ' ~ x) }}", NULL, "no x");
    /* a value nested past 256 levels, built by the template itself */
    expect_error("{% set ns = namespace(v=[]) %}{% for i in range(300) %}{% set ns.v = [ns.v] %}{% endfor %}"
                 "{{ ns.v | tojson }}", NULL, "nested more than 256");
    /* expressions nested past 256 levels are refused when compiling */
    char deep[2100];
    size_t k = 0;
    k += (size_t)snprintf(deep + k, sizeof deep - k, "{{ ");
    for (int i = 0; i < 300; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 300; i++) deep[k++] = ')';
    snprintf(deep + k, sizeof deep - k, " }}");
    expect_error(deep, NULL, "nested more than 256");
}

static void test_tenant_bytes_become_spans(void **state)
{
    (void)state;
    llm_error err = {0};
    llm_span *sp = NULL;
    int n = 0;
    /* markup around, then the tenant text trimmed, upper-cased, sliced, replaced, JSON-quoted */
    char *text = render("<a>{{ x | trim }}</a><b>{{ x.strip().upper()[1:3] }}</b>{{ x.replace('b', '<q>') }}|{{ x | tojson }}",
                        "  abc  ", NULL, &sp, &n, &err);
    assert_non_null(text);
    assert_string_equal(text, "<a>abc</a><b>BC</b>  a<q>c  |\"  abc  \"");
    /* the '<q>' the template put in is markup: not a span */
    const char *want[] = {"abc", "BC", "  a", "c  ", "\"  abc  \""};
    assert_int_equal(n, 5);
    for (int i = 0; i < n; i++) {
        size_t len = sp[i].end - sp[i].start;
        if (len != strlen(want[i]) || memcmp(text + sp[i].start, want[i], len))
            fail_msg("span %d is '%.*s', expected '%s'", i, (int)len, text + sp[i].start, want[i]);
    }
    free(text);
    free(sp);
}

static void test_value_api_takes_nulls(void **state)
{
    (void)state;
    llm_jinja_limits tiny = {.max_bytes = 4096};
    llm_jctx *c = llm_jctx_new(&tiny);
    assert_non_null(c);
    llm_jv *l = llm_jv_list(c);
    assert_non_null(l);
    assert_int_equal(llm_jv_append(c, l, NULL), LLM_ERR_NOMEM);
    assert_int_equal(llm_jv_append(c, NULL, llm_jv_int(c, 1)), LLM_ERR_NOMEM);
    assert_int_equal(llm_jv_set(c, l, "k", 1, 0, llm_jv_none(c)), LLM_ERR_INVALID_ARG); /* not a dict */
    assert_null(llm_jv_str(c, NULL, 0, 0));
    /* the context's memory runs out: constructors give NULL, never unwind */
    int got_null = 0;
    for (int i = 0; i < 10000 && !got_null; i++) got_null = llm_jv_str(c, "0123456789abcdef", 16, 1) == NULL;
    assert_true(got_null);
    llm_jctx_free(c);
    llm_jctx_free(NULL);
    llm_jinja_free(NULL);
}

typedef struct shared_tmpl {
    const llm_jinja *t;
    int ok; /* this thread's own result */
} shared_tmpl;

static void *render_many(void *arg)
{
    shared_tmpl *s = arg;
    for (int i = 0; i < 200; i++) {
        llm_jctx *c = llm_jctx_new(NULL);
        llm_jv *vars = llm_jv_dict(c);
        llm_jv *l = llm_jv_list(c);
        for (int k = 0; k < 5; k++) llm_jv_append(c, l, llm_jv_int(c, k + i));
        llm_jv_set(c, vars, "l", 1, 0, l);
        llm_error err = {0};
        char *text = llm_jinja_render(s->t, c, vars, NULL, NULL, NULL, &err);
        char want[64];
        snprintf(want, sizeof want, "%d", 5 * i + 10);
        if (!text || strcmp(text, want))
            s->ok = 0;
        free(text);
        llm_jctx_free(c);
    }
    return NULL;
}

static void test_one_template_many_threads(void **state)
{
    (void)state;
    llm_jinja *t = NULL;
    llm_error err = {0};
    const char *src = "{% set ns = namespace(n=0) %}{% for v in l %}{% set ns.n = ns.n + v %}{% endfor %}{{ ns.n }}";
    assert_int_equal(llm_jinja_compile(src, strlen(src), &t, &err), LLM_OK);
    shared_tmpl s[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (shared_tmpl){t, 1};
        assert_int_equal(pthread_create(&th[i], NULL, render_many, &s[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(s[i].ok);
    }
    llm_jinja_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_errors_name_the_line),
        cmocka_unit_test(test_bounds_end_a_render),
        cmocka_unit_test(test_tenant_bytes_become_spans),
        cmocka_unit_test(test_value_api_takes_nulls),
        cmocka_unit_test(test_one_template_many_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
