/* test_json.c - llm_json (common/json.c): the nesting scan at and past its
 * limit; loads at the limit on a thread with an eighth of the request
 * stack (LLM_THREAD_STACK), and far past it without a crash; the memory
 * budget against measured costs; and the field readers (member, item,
 * string) against jansson's own parse of random documents it wrote. */
#include "testutil.h"

#include <jansson.h>
#include <pthread.h>

#include "llm/json.h"
#include "llm/thread.h"

/* "[[[...]]]" with depth levels (k: '[' or '{"a":'), NUL-terminated; caller frees. */
static char *nested(int depth, int objects)
{
    char *s = malloc((size_t)depth * 6 + 8), *p = s;
    for (int i = 0; i < depth; i++) p += sprintf(p, objects && i % 2 ? "{\"a\":" : "[");
    *p++ = '1';
    for (int i = depth - 1; i >= 0; i--) *p++ = objects && i % 2 ? '}' : ']';
    *p = 0;
    return s;
}

static void test_scan(void **state)
{
    (void)state;
    static const struct { const char *text; llm_status want; size_t end; } cases[] = {
        {"[1, 2, {\"a\": [\"]}\"]}]", LLM_OK, 21},
        {"  \"a\\\"]\" tail", LLM_OK, 8},
        {"123 456", LLM_OK, 3},
        {"true]", LLM_OK, 4},
        {"{\"a\":1}{", LLM_OK, 7},
        {"[}", LLM_ERR_FORMAT, 0},
        {"[\"abc", LLM_ERR_FORMAT, 0},
        {"[[1]", LLM_ERR_FORMAT, 0},
        {"   ", LLM_ERR_FORMAT, 0},
        {"]", LLM_ERR_FORMAT, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t end = 0;
        llm_error err = {0};
        llm_status st = llm_json_scan(cases[i].text, strlen(cases[i].text), LLM_JSON_MAX_DEPTH, &end, &err);
        if (st != cases[i].want || (!st && end != cases[i].end))
            fail_msg("%s: status %d end %zu (%s), expected %d end %zu", cases[i].text, st, end, err.msg, cases[i].want,
                     cases[i].end);
    }
    for (int objects = 0; objects < 2; objects++) {
        char *at = nested(LLM_JSON_MAX_DEPTH, objects), *past = nested(LLM_JSON_MAX_DEPTH + 1, objects);
        llm_error err = {0};
        assert_int_equal(llm_json_scan(at, strlen(at), LLM_JSON_MAX_DEPTH, NULL, &err), LLM_OK);
        assert_int_equal(llm_json_scan(past, strlen(past), LLM_JSON_MAX_DEPTH, NULL, &err), LLM_ERR_TOO_LONG);
        assert_non_null(strstr(err.msg, "deeper than 64"));
        free(at);
        free(past);
    }
}

/* Run on a small stack: loads and dumps at the limit, and deep texts refused. */
static void *deep_work(void *arg)
{
    int *ok = arg;
    for (int objects = 0; objects < 2; objects++) {
        char *at = nested(LLM_JSON_MAX_DEPTH, objects);
        llm_error err = {0};
        json_t *v = llm_json_loads(at, 0, &err);
        /* a value read at the limit, inside a few levels of our own, dumped */
        json_t *wrap = json_pack("{s:[{s:o}]}", "choices", "message", v);
        char *text = json_dumps(wrap, JSON_COMPACT);
        *ok &= v && text && strlen(text) > strlen(at);
        free(text);
        json_decref(wrap);
        free(at);
        for (int depth = LLM_JSON_MAX_DEPTH + 1; depth <= 100000; depth *= 10) {
            char *past = nested(depth, objects);
            json_t *w = llm_json_loads(past, 0, &err);
            *ok &= !w && err.code == LLM_ERR_TOO_LONG;
            json_decref(w);
            free(past);
        }
    }
    return NULL;
}

static void test_deep_on_a_small_stack(void **state)
{
    (void)state;
    int ok = 1;
    pthread_t t;
    assert_int_equal(llm_thread_create(&t, LLM_THREAD_STACK / 8, deep_work, &ok), 0);
    pthread_join(t, NULL);
    assert_true(ok);
}

/* A text of about n bytes: open, then unit repeated, then close. */
static char *repeat(const char *open, const char *unit, const char *last, const char *close, size_t n, size_t *len)
{
    char *s = malloc(n + 64), *p = s;
    p += sprintf(p, "%s", open);
    while ((size_t)(p - s) + strlen(unit) + strlen(last) + strlen(close) < n) p += sprintf(p, "%s", unit);
    p += sprintf(p, "%s%s", last, close);
    *len = (size_t)(p - s);
    return s;
}

static void test_memory_budget(void **state)
{
    (void)state;
    /* costs per byte measured with glibc (mallinfo2): [{},...] 70, [[],...] 60, ["",...] 31, [1,...] 20,
     * messages 14, token ids 7, one long string 1 */
    static const struct { const char *open, *unit, *last, *close; int ok; } cases[] = {
        {"[", "{},", "{}", "]", 0},
        {"[", "[],", "[]", "]", 0},
        {"[", "1,", "1", "]", 1},
        {"[", "15043,", "1", "]", 1},
        {"{\"messages\":[", "{\"role\":\"user\",\"content\":\"hi there\"},", "{}", "]}", 1},
        {"{\"prompt\":\"", "abcdefgh", "", "\"}", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t len;
        char *s = repeat(cases[i].open, cases[i].unit, cases[i].last, cases[i].close, 1 << 20, &len);
        llm_error err = {0};
        json_t *v = llm_json_load(s, len, JSON_REJECT_DUPLICATES, NULL, &err);
        if (!v != !cases[i].ok || (!v && (err.code != LLM_ERR_TOO_LONG || !strstr(err.msg, "bytes of memory"))))
            fail_msg("%s%s...: %s (%s)", cases[i].open, cases[i].unit, v ? "parsed" : "refused", err.msg);
        json_decref(v);
        free(s);
    }
    /* a small text has the floor: a little amplification is fine */
    size_t len;
    char *s = repeat("[", "{},", "{}", "]", 600, &len);
    llm_error err = {0};
    json_t *v = llm_json_load(s, len, 0, NULL, &err);
    assert_non_null(v);
    json_decref(v);
    free(s);
}

/* A parse that fills the shared cap again and again, until told to stop. */
typedef struct filler {
    const char *text;
    size_t len;
    int stop; /* atomic */
} filler;

static void *fill(void *arg)
{
    filler *f = arg;
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE))
        json_decref(llm_json_load(f->text, f->len, 0, NULL, NULL));
    return NULL;
}

/* The shared cap: while another thread's parse holds part of it, a parse
 * beyond the floor that would pass it is refused as "retry" (QUEUE_FULL);
 * a small one never is; the model's (LLM_JSON_OWN) is not counted; alone,
 * a text the cap cannot hold is bounded by its own budget only. */
static void test_shared_cap(void **state)
{
    (void)state;
    size_t big_len, huge_len;
    llm_error err = {0};
    llm_json_set_shared_cap((size_t)2 << 20);
    char *big = repeat("[", "15043,", "1", "]", 200 << 10, &big_len); /* ~1.5 MiB to parse */
    char *huge = repeat("[", "15043,", "1", "]", 1 << 20, &huge_len); /* ~7 MiB: more than the cap */
    json_t *v = llm_json_load(huge, huge_len, 0, NULL, &err);
    assert_non_null(v); /* alone */
    json_decref(v);
    filler f = {big, big_len, 0};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fill, &f), 0);
    int crowded = 0, small_refused = 0, own_refused = 0;
    for (int i = 0; i < 5000 && !crowded; i++) { /* until the two parses overlap (they do within a few rounds) */
        v = llm_json_load(big, big_len, 0, NULL, &err);
        crowded = !v && err.code == LLM_ERR_QUEUE_FULL && strstr(err.msg, "retry");
        json_decref(v);
        v = llm_json_loads("{\"prompt\": \"small\", \"max_tokens\": 4}", 0, NULL);
        small_refused += !v;
        json_decref(v);
        v = llm_json_load(big, big_len, LLM_JSON_OWN, NULL, NULL);
        own_refused += !v;
        json_decref(v);
    }
    __atomic_store_n(&f.stop, 1, __ATOMIC_RELEASE);
    pthread_join(t, NULL);
    llm_json_set_shared_cap(LLM_JSON_SHARED_CAP);
    assert_true(crowded);
    assert_int_equal(small_refused, 0);
    assert_int_equal(own_refused, 0);
    free(big);
    free(huge);
}

/* jansson 2.14 reads past its lexer's buffer when an allocation is
 * refused part way (a long string after many objects): the reader never
 * refuses one for a budget, it estimates first. With the old way, 2,000
 * objects and a 7,979-byte string (14 KB) crashed this test. */
static void test_budget_never_fails_jansson_part_way(void **state)
{
    (void)state;
    int ok = 0, refused = 0;
    for (int objs = 1000; objs <= 4000; objs += 1000)
        for (int len = 1000; len < 60000; len += 997) {
            char *s = malloc((size_t)objs * 3 + (size_t)len + 8), *p = s;
            *p++ = '[';
            for (int i = 0; i < objs; i++, p += 3) memcpy(p, "{},", 3);
            *p++ = '"';
            memset(p, 'x', (size_t)len);
            p += len;
            memcpy(p, "\"]", 2);
            p += 2;
            llm_error err = {0};
            json_t *v = llm_json_load(s, (size_t)(p - s), 0, NULL, &err);
            ok += v != NULL;
            refused += !v && err.code == LLM_ERR_TOO_LONG;
            json_decref(v);
            free(s);
        }
    print_message("long strings after many objects: %d parsed, %d refused for their budget\n", ok, refused);
    assert_true(ok > 0 && refused > 0 && ok + refused == 4 * 60);
}

static void test_load_errors(void **state)
{
    (void)state;
    llm_error err = {0};
    assert_null(llm_json_loads("{\"a\":", 0, &err));
    assert_int_equal(err.code, LLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "line 1"));
    assert_null(llm_json_loads("{\"a\":1,\"a\":2}", JSON_REJECT_DUPLICATES, &err));
    assert_int_equal(err.code, LLM_ERR_FORMAT);
    size_t used = 0;
    json_t *v = llm_json_load("{\"a\":[1]} and more", 18, LLM_JSON_PREFIX, &used, &err);
    assert_non_null(v);
    assert_int_equal(used, 9);
    json_decref(v);
}

/* ---- the field readers against jansson ------------------------------------------------ */

static json_t *random_value(uint64_t *rng, int depth);

static json_t *random_string(uint64_t *rng)
{
    static const char *const pieces[] = {"a", "é", "日本", "😀", "\"", "\\", "/", "\n", "\t", "\x01", " ", "]", "}", "{",
                                         "user", "stream", "prompt", ",", ":"};
    char buf[128] = "";
    for (int k = (int)(test_rng(rng) % 8); k > 0; k--) strcat(buf, pieces[test_rng(rng) % (sizeof pieces / sizeof *pieces)]);
    return json_string(buf);
}

static json_t *random_value(uint64_t *rng, int depth)
{
    int kind = (int)(test_rng(rng) % (depth > 6 ? 4 : 6));
    switch (kind) {
    case 0: return json_integer((json_int_t)(test_rng(rng) % 100000) - 50000);
    case 1: return test_rng(rng) & 1 ? json_true() : json_null();
    case 2: return json_real((double)(test_rng(rng) % 1000) / 7.0);
    case 3: return random_string(rng);
    case 4: {
        json_t *a = json_array();
        for (int k = (int)(test_rng(rng) % 5); k > 0; k--) json_array_append_new(a, random_value(rng, depth + 1));
        return a;
    }
    default: {
        json_t *o = json_object();
        for (int k = (int)(test_rng(rng) % 5); k > 0; k--) {
            json_t *key = random_string(rng);
            json_object_set_new(o, json_string_value(key), random_value(rng, depth + 1));
            json_decref(key);
        }
        return o;
    }
    }
}

/* The span parsed by jansson equals want. */
static int span_is(llm_json_span v, json_t *want)
{
    llm_error err = {0};
    json_t *got = llm_json_load(v.p, v.n, JSON_DECODE_ANY, NULL, &err);
    int same = got && json_equal(got, want);
    json_decref(got);
    return same;
}

static void check_member_and_items(const char *text, json_t *doc)
{
    llm_json_span all = {text, strlen(text)}, val;
    const char *key;
    json_t *v;
    json_object_foreach(doc, key, v) {
        if (!llm_json_member(all, key, &val) || !span_is(val, v))
            fail_msg("member '%s' of %s", key, text);
        if (json_is_array(v)) {
            size_t pos = 0, k = 0;
            llm_json_span item;
            while (llm_json_item(val, &pos, &item)) {
                if (k >= json_array_size(v) || !span_is(item, json_array_get(v, k)))
                    fail_msg("item %zu of '%s' in %s", k, key, text);
                k++;
            }
            assert_int_equal(k, json_array_size(v));
        }
        if (json_is_string(v)) {
            char out[256];
            long n = llm_json_string(val, out, sizeof out);
            assert_int_equal(n, (long)json_string_length(v));
            assert_memory_equal(out, json_string_value(v), (size_t)n);
            /* cut short: a prefix of whole characters */
            for (size_t cap = 1; cap <= json_string_length(v); cap++) {
                long m = llm_json_string(val, out, cap);
                assert_true(m >= 0 && (size_t)m < cap && !memcmp(out, json_string_value(v), (size_t)m));
                json_t *js = json_stringn(out, (size_t)m); /* NULL: not valid UTF-8 */
                assert_true(m == 0 || js);
                json_decref(js);
            }
        }
    }
    assert_false(llm_json_member(all, "no such key", &val));
}

static void test_readers_against_jansson(void **state)
{
    (void)state;
    uint64_t rng = 42;
    static const size_t flags[] = {JSON_COMPACT, JSON_INDENT(2), JSON_ENSURE_ASCII, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_ESCAPE_SLASH};
    for (int i = 0; i < 2000; i++) {
        json_t *doc = json_object();
        for (int k = (int)(test_rng(&rng) % 6); k >= 0; k--) {
            json_t *key = random_string(&rng);
            json_object_set_new(doc, json_string_value(key), random_value(&rng, 1));
            json_decref(key);
        }
        char *text = json_dumps(doc, flags[i % 4]);
        check_member_and_items(text, doc);
        free(text);
        json_decref(doc);
    }
    /* an escaped key matches as decoded; a key that repeats gives its first value */
    llm_json_span val;
    const char *t = "{\"\\u0073tream\": true, \"a\": 1, \"a\": 2}";
    assert_true(llm_json_member((llm_json_span){t, strlen(t)}, "stream", &val) && val.n == 4);
    assert_true(llm_json_member((llm_json_span){t, strlen(t)}, "a", &val) && val.p[0] == '1');
    /* not an object, or malformed: no member */
    assert_false(llm_json_member((llm_json_span){"[1]", 3}, "a", &val));
    assert_false(llm_json_member((llm_json_span){"{\"a\" 1}", 7}, "a", &val));
    char *deep = nested(200, 1);
    char *body = malloc(strlen(deep) + 32);
    sprintf(body, "{\"x\":%s,\"stream\":true}", deep);
    /* a reader steps over a value too deep to parse (a list's other items stay readable) */
    assert_true(llm_json_member((llm_json_span){body, strlen(body)}, "stream", &val) && val.n == 4);
    assert_true(llm_json_member((llm_json_span){body, strlen(body)}, "x", &val) && val.n == strlen(deep));
    free(body);
    free(deep);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_scan),
        cmocka_unit_test(test_deep_on_a_small_stack),
        cmocka_unit_test(test_memory_budget),
        cmocka_unit_test(test_shared_cap),
        cmocka_unit_test(test_budget_never_fails_jansson_part_way),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_readers_against_jansson),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
