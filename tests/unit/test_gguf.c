/* test_gguf.c - the GGUF reader: round trip through the writer, every value
 * type, and malformed files (truncations at every byte, corrupted counts,
 * sizes, offsets, types) that must fail with a message and never crash. */
#include "testutil.h"

#include "llm/gguf.h"
#include "llm/gguf_writer.h"

typedef struct blob { uint8_t *p; size_t n; } blob;

static int fill_ramp(void *ctx, int i, void *dst, size_t n)
{
    (void)ctx;
    for (size_t k = 0; k < n; k++) ((uint8_t *)dst)[k] = (uint8_t)(k + (size_t)i);
    return 0;
}

/* A small valid file with every metadata type and two tensors. */
static blob make_file(void)
{
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    const char *strs[] = {"a", "bc", ""};
    int32_t ints[] = {1, -2, 3};
    assert_int_equal(gguf_writer_u32(w, "k.u32", 7), LLM_OK);
    assert_int_equal(gguf_writer_i32(w, "k.i32", -7), LLM_OK);
    assert_int_equal(gguf_writer_f32(w, "k.f32", 1.5f), LLM_OK);
    assert_int_equal(gguf_writer_bool(w, "k.bool", 1), LLM_OK);
    assert_int_equal(gguf_writer_str(w, "k.str", "hello"), LLM_OK);
    assert_int_equal(gguf_writer_arr(w, "k.arr", GGUF_TYPE_INT32, ints, 3), LLM_OK);
    assert_int_equal(gguf_writer_arr_str(w, "k.strs", strs, 3), LLM_OK);
    uint64_t ne1[2] = {32, 3}, ne2[1] = {5};
    assert_int_equal(gguf_writer_tensor(w, "t.q8", QT_Q8_0, 2, ne1), LLM_OK);
    assert_int_equal(gguf_writer_tensor(w, "t.f32", QT_F32, 1, ne2), LLM_OK);
    char path[256];
    test_tmpfile("gguf", path, sizeof path);
    llm_error err = {0};
    assert_int_equal(gguf_writer_write(w, path, fill_ramp, NULL, &err), LLM_OK);
    gguf_writer_free(w);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    blob b = {malloc(1 << 16), 0};
    b.n = fread(b.p, 1, 1 << 16, f);
    fclose(f);
    remove(path);
    return b;
}

static void test_roundtrip(void **state)
{
    (void)state;
    blob b = make_file();
    gguf_file *g;
    llm_error err = {0};
    assert_int_equal(gguf_open_buffer(b.p, b.n, "mem", &g, &err), LLM_OK);
    assert_int_equal(gguf_version(g), 3);
    uint64_t u;
    double d;
    int bo;
    gguf_str s;
    assert_int_equal(gguf_get_u64(g, "k.u32", &u, &err), LLM_OK);
    assert_int_equal(u, 7);
    assert_int_equal(gguf_get_f64(g, "k.i32", &d, &err), LLM_OK);
    assert_true(d == -7.0);
    assert_int_equal(gguf_get_f64(g, "k.f32", &d, &err), LLM_OK);
    assert_true(d == 1.5);
    assert_int_equal(gguf_get_bool(g, "k.bool", &bo, &err), LLM_OK);
    assert_int_equal(bo, 1);
    assert_int_equal(gguf_get_str(g, "k.str", &s, &err), LLM_OK);
    assert_true(gguf_str_eq(s, "hello"));
    /* wrong type: an error naming the key */
    assert_int_equal(gguf_get_str(g, "k.u32", &s, &err), LLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "k.u32"));
    assert_int_equal(gguf_get_u64(g, "k.i32", &u, &err), LLM_ERR_FORMAT);
    assert_int_equal(gguf_get_u64(g, "absent", &u, &err), LLM_ERR_INVALID_ARG);
    const gguf_kv *a = gguf_find(g, "k.strs");
    assert_non_null(a);
    assert_int_equal(a->arr_n, 3);
    assert_true(gguf_str_eq(a->strs[1], "bc"));
    assert_true(gguf_str_eq(a->strs[2], ""));
    const gguf_tensor *t = gguf_find_tensor(g, "t.q8");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 3 * 34);
    assert_int_equal(((const uint8_t *)t->data)[5], 5);
    t = gguf_find_tensor(g, "t.f32");
    assert_int_equal(t->nbytes, 20);
    assert_int_equal(((const uint8_t *)t->data)[0], 1);
    assert_int_equal((uintptr_t)t->data % 32, (uintptr_t)b.p % 32);
    gguf_close(g);
    free(b.p);
}

/* Every truncation that cuts into the data must be rejected cleanly; cuts in
 * the trailing alignment padding leave a valid file. */
static void test_truncations(void **state)
{
    (void)state;
    blob b = make_file();
    gguf_file *full;
    assert_int_equal(gguf_open_buffer(b.p, b.n, "full", &full, NULL), LLM_OK);
    const gguf_tensor *last = gguf_find_tensor(full, "t.f32");
    size_t need = (size_t)((const uint8_t *)last->data - b.p) + last->nbytes;
    gguf_close(full);
    assert_true(need <= b.n);
    for (size_t n = 0; n < b.n; n++) {
        uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan sees overreads */
        memcpy(copy, b.p, n);
        gguf_file *g = (gguf_file *)1;
        llm_error err = {0};
        llm_status st = gguf_open_buffer(copy, n, "trunc", &g, &err);
        if (n >= need) {
            assert_int_equal(st, LLM_OK);
            gguf_close(g);
        } else {
            assert_int_not_equal(st, LLM_OK);
            assert_null(g);
            assert_true(err.msg[0] != 0);
        }
        free(copy);
    }
    free(b.p);
}

static void expect_fail(blob b, size_t off, const void *bytes, size_t n, const char *needle)
{
    uint8_t *copy = malloc(b.n);
    memcpy(copy, b.p, b.n);
    memcpy(copy + off, bytes, n);
    gguf_file *g;
    llm_error err = {0};
    assert_int_not_equal(gguf_open_buffer(copy, b.n, "bad", &g, &err), LLM_OK);
    if (!strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
    free(copy);
}

static size_t find(blob b, const char *s)
{
    for (size_t i = 0; i + strlen(s) <= b.n; i++)
        if (!memcmp(b.p + i, s, strlen(s)))
            return i;
    fail_msg("'%s' not in file", s);
    return 0;
}

static void test_corruptions(void **state)
{
    (void)state;
    blob b = make_file();
    uint32_t u32;
    uint64_t u64;
    expect_fail(b, 0, "GGUX", 4, "not a GGUF file");
    u32 = 1;
    expect_fail(b, 4, &u32, 4, "version 1");
    u64 = 1ull << 40;
    expect_fail(b, 8, &u64, 8, "implausible counts");
    u64 = 1ull << 40; /* a string length far beyond the file */
    expect_fail(b, find(b, "k.u32") - 8, &u64, 8, "metadata key");
    u32 = 99; /* value type */
    expect_fail(b, find(b, "k.u32") + 5, &u32, 4, "invalid value type 99");
    u64 = 1ull << 60; /* array count */
    expect_fail(b, find(b, "k.arr") + 5 + 4 + 4, &u64, 8, "k.arr");
    size_t t = find(b, "t.q8") + 4; /* n_dims, ne[0], ne[1], type, offset */
    u32 = 5;
    expect_fail(b, t, &u32, 4, "n_dims 5");
    u64 = 33;
    expect_fail(b, t + 4, &u64, 8, "not a multiple");
    u64 = 1ull << 40;
    expect_fail(b, t + 12, &u64, 8, "t.q8: data [");
    u32 = 16; /* IQ2_XXS: a real type we do not load */
    expect_fail(b, t + 20, &u32, 4, "type IQ2_XXS is not supported");
    u32 = 200;
    expect_fail(b, t + 20, &u32, 4, "invalid type id 200");
    u64 = 3;
    expect_fail(b, t + 24, &u64, 8, "not aligned");
    u64 = 1ull << 62;
    expect_fail(b, t + 24, &u64, 8, "beyond end of file");
    free(b.p);
}

static void test_open_errors(void **state)
{
    (void)state;
    gguf_file *g;
    llm_error err = {0};
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &g, &err), LLM_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/x.gguf"));
    assert_int_equal(gguf_open("/", &g, &err), LLM_ERR_IO);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_corruptions),
        cmocka_unit_test(test_open_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
