/* test_gguf.c - the GGUF reader: round trip through the writer, every value
 * type, and malformed files (truncations at every byte, corrupted counts,
 * sizes, offsets, types) that must fail with a message and never crash. */
#include "testutil.h"

#include "llm/gguf.h"
#include "llm/gguf_writer.h"
#include "llm/split_name.h"

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

typedef struct checked {
    const void *want;
    size_t n;
    int calls;
} checked;

static llm_status bytes_are(void *ctx, const void *bytes, size_t n, llm_error *err)
{
    checked *c = ctx;
    c->calls++;
    if (!c->want || n != c->n || memcmp(bytes, c->want, n))
        return llm_errf(err, LLM_ERR_FORMAT, "not the bytes written");
    return LLM_OK;
}

/* gguf_read: the same file as gguf_open gives, held in memory, so the file
 * truncated after the read cannot fault a reader (a mapping would: SIGBUS);
 * gguf_read_checked's check sees the bytes parsed and its failure is the
 * read's; a file over max_size and the open errors are refused by name. */
static void test_read_copy(void **state)
{
    (void)state;
    blob b = make_file();
    char path[256];
    test_tmpfile("gguf-read", path, sizeof path);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(b.p, 1, b.n, fp), b.n);
    assert_int_equal(fclose(fp), 0);
    gguf_file *g, *m;
    llm_error err = {0};
    assert_int_equal(gguf_read(path, b.n, &g, &err), LLM_OK);
    assert_int_equal(gguf_open_buffer(b.p, b.n, "mem", &m, &err), LLM_OK);
    assert_int_equal(truncate(path, 0), 0);
    assert_int_equal(gguf_n_tensors(g), gguf_n_tensors(m));
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i), *u = gguf_tensor_at(m, i);
        assert_int_equal(t->nbytes, u->nbytes);
        assert_memory_equal(t->data, u->data, t->nbytes);
        assert_int_equal((uintptr_t)t->data % 32, 0);
    }
    gguf_close(g);
    gguf_close(m);
    assert_int_equal(gguf_read(path, b.n, &g, &err), LLM_ERR_FORMAT); /* now empty */
    fp = fopen(path, "wb");
    assert_int_equal(fwrite(b.p, 1, b.n, fp), b.n);
    assert_int_equal(fclose(fp), 0);
    checked ck = {b.p, b.n, 0};
    assert_int_equal(gguf_read_checked(path, b.n, bytes_are, &ck, &g, &err), LLM_OK); /* the check sees the bytes */
    assert_int_equal(ck.calls, 1);
    gguf_close(g);
    ck.want = NULL; /* a check that fails: its status, nothing opened */
    assert_int_equal(gguf_read_checked(path, b.n, bytes_are, &ck, &g, &err), LLM_ERR_FORMAT);
    assert_null(g);
    assert_non_null(strstr(err.msg, "not the bytes"));
    assert_int_equal(gguf_read(path, b.n - 1, &g, &err), LLM_ERR_INVALID_ARG);
    assert_null(g);
    assert_non_null(strstr(err.msg, "allowed"));
    remove(path);
    assert_int_equal(gguf_read(path, b.n, &g, &err), LLM_ERR_IO);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(gguf_read("/", b.n, &g, &err), LLM_ERR_IO);
    free(b.p);
}

/* A split set written by hand the way llama.cpp's gguf-split lays one out:
 * metadata in the first part, split.no / split.count / split.tensors.count
 * in every part, part k's tensors named "t.K.J" and filled with k. */
typedef struct split_spec {
    uint32_t no, count, tensors; /* the keys the part carries */
    int n_tensors, first_tensor; /* which of the set's tensors it holds */
} split_spec;

static int fill_part(void *ctx, int i, void *dst, size_t n)
{
    memset(dst, *(int *)ctx + i, n);
    return 0;
}

static void write_part(const char *prefix, uint32_t k, uint32_t n, split_spec sp)
{
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    if (sp.no == 0)
        assert_int_equal(gguf_writer_str(w, "general.architecture", "llama"), LLM_OK);
    assert_int_equal(gguf_writer_u32(w, "split.no", sp.no), LLM_OK);
    assert_int_equal(gguf_writer_u32(w, "split.count", sp.count), LLM_OK);
    assert_int_equal(gguf_writer_i32(w, "split.tensors.count", (int32_t)sp.tensors), LLM_OK);
    for (int j = 0; j < sp.n_tensors; j++) {
        char name[32];
        uint64_t ne[1] = {64};
        snprintf(name, sizeof name, "t.%d", sp.first_tensor + j);
        assert_int_equal(gguf_writer_tensor(w, name, QT_F32, 1, ne), LLM_OK);
    }
    char path[512];
    snprintf(path, sizeof path, "%s-%05u-of-%05u.gguf", prefix, k, n);
    llm_error err = {0};
    int base = sp.first_tensor;
    assert_int_equal(gguf_writer_write(w, path, fill_part, &base, &err), LLM_OK);
    gguf_writer_free(w);
}

static void split_cleanup(const char *prefix, uint32_t n)
{
    for (uint32_t k = 1; k <= n; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s-%05u-of-%05u.gguf", prefix, k, n);
        remove(path);
    }
}

/* Three parts holding 2 + 1 + 3 tensors. */
static void write_set(const char *prefix)
{
    write_part(prefix, 1, 3, (split_spec){0, 3, 6, 2, 0});
    write_part(prefix, 2, 3, (split_spec){1, 3, 6, 1, 2});
    write_part(prefix, 3, 3, (split_spec){2, 3, 6, 3, 3});
}

static llm_status open_part_k(const char *prefix, uint32_t k, uint32_t n, gguf_file **g, llm_error *err)
{
    char path[512];
    snprintf(path, sizeof path, "%s-%05u-of-%05u.gguf", prefix, k, n);
    return gguf_open(path, g, err);
}

/* Any part opens the whole set: the first part's metadata, every tensor
 * once, each one's bytes those of the part that holds it. */
static void test_split_set(void **state)
{
    (void)state;
    char prefix[256], name[600];
    snprintf(prefix, sizeof prefix, "%s/llm-test-split-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    write_set(prefix);
    for (uint32_t k = 1; k <= 3; k++) {
        gguf_file *g;
        llm_error err = {0};
        assert_int_equal(open_part_k(prefix, k, 3, &g, &err), LLM_OK);
        assert_int_equal(gguf_n_parts(g), 3);
        assert_int_equal(gguf_n_tensors(g), 6);
        snprintf(name, sizeof name, "%s-00001-of-00003.gguf", prefix);
        assert_string_equal(gguf_name(g), name);
        snprintf(name, sizeof name, "%s-00003-of-00003.gguf", prefix);
        assert_string_equal(gguf_part_name(g, 2), name);
        assert_null(gguf_part_name(g, 3));
        assert_non_null(gguf_find(g, "general.architecture"));
        for (int j = 0; j < 6; j++) {
            char tn[16];
            snprintf(tn, sizeof tn, "t.%d", j);
            const gguf_tensor *t = gguf_find_tensor(g, tn);
            assert_non_null(t);
            assert_int_equal(t->nbytes, 256);
            /* fill_part wrote (first tensor of the part + index in the part) */
            assert_int_equal(((const uint8_t *)t->data)[0], j);
            assert_int_equal(((const uint8_t *)t->data)[255], j);
        }
        gguf_close(g);
    }
    assert_int_equal(llm_split_path("a/m-00002-of-00003.gguf", 3, name, sizeof name), 3);
    assert_string_equal(name, "a/m-00003-of-00003.gguf");
    assert_int_equal(llm_split_path("a/m-00004-of-00003.gguf", 1, NULL, 0), 0);
    assert_int_equal(llm_split_path("m-00001-of-00003.gguff", 1, NULL, 0), 0);
    assert_int_equal(llm_split_path("m-0000x-of-00003.gguf", 1, NULL, 0), 0);
    assert_int_equal(llm_split_path("-00001-of-00001.gguf", 1, name, sizeof name), 1);
    assert_int_equal(llm_split_path("m-00001-of-00003.gguf", 4, name, sizeof name), 0);
    assert_int_equal(llm_split_path("m-00001-of-00003.gguf", 1, name, 8), 0);
    split_cleanup(prefix, 3);
}

static void expect_set_error(const char *prefix, uint32_t k, uint32_t n, llm_status want, const char *msg)
{
    gguf_file *g = (gguf_file *)1;
    llm_error err = {0};
    assert_int_equal(open_part_k(prefix, k, n, &g, &err), want);
    assert_null(g);
    if (!strstr(err.msg, msg))
        fail_msg("expected '%s' in: %s", msg, err.msg);
}

/* A set missing a part, holding a part of another split, a tensor twice,
 * fewer tensors than declared, or a part not named as llama.cpp names
 * them: each refused with what is wrong, and nothing leaks (ASan). */
static void test_split_errors(void **state)
{
    (void)state;
    char prefix[256], other[300];
    snprintf(prefix, sizeof prefix, "%s/llm-test-spliterr-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    write_set(prefix);
    split_cleanup(prefix, 3);
    write_part(prefix, 1, 3, (split_spec){0, 3, 6, 2, 0});
    write_part(prefix, 3, 3, (split_spec){2, 3, 6, 3, 3});
    expect_set_error(prefix, 3, 3, LLM_ERR_IO, "incomplete: part 2 of 3");
    write_part(prefix, 2, 3, (split_spec){1, 3, 7, 1, 2}); /* from a split of 7 tensors */
    expect_set_error(prefix, 1, 3, LLM_ERR_FORMAT, "parts of different splits");
    write_part(prefix, 2, 3, (split_spec){1, 4, 6, 1, 2}); /* from a split into 4 */
    expect_set_error(prefix, 1, 3, LLM_ERR_FORMAT, "parts of different splits");
    write_part(prefix, 2, 3, (split_spec){2, 3, 6, 1, 2}); /* says it is part 3 */
    expect_set_error(prefix, 1, 3, LLM_ERR_FORMAT, "parts of different splits");
    write_part(prefix, 2, 3, (split_spec){1, 3, 6, 1, 1}); /* t.1 again, t.2 missing */
    expect_set_error(prefix, 2, 3, LLM_ERR_FORMAT, "tensor t.1 appears twice");
    write_part(prefix, 2, 3, (split_spec){1, 3, 6, 0, 2}); /* holds nothing */
    expect_set_error(prefix, 1, 3, LLM_ERR_FORMAT, "hold 5 tensors, the set declares 6");
    split_cleanup(prefix, 3);
    /* a part renamed away from llama.cpp's naming */
    write_part(prefix, 1, 3, (split_spec){0, 3, 6, 2, 0});
    snprintf(other, sizeof other, "%s.gguf", prefix);
    char first[512];
    snprintf(first, sizeof first, "%s-00001-of-00003.gguf", prefix);
    assert_int_equal(rename(first, other), 0);
    gguf_file *g;
    llm_error err = {0};
    assert_int_equal(gguf_open(other, &g, &err), LLM_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "part 1 of 3 of a split GGUF whose name does not end in -00001-of-00003.gguf"));
    remove(other);
    /* one part alone (split.count 1, as gguf-split writes a small model) is a plain file */
    write_part(prefix, 1, 1, (split_spec){0, 1, 2, 2, 0});
    assert_int_equal(open_part_k(prefix, 1, 1, &g, &err), LLM_OK);
    assert_int_equal(gguf_n_parts(g), 1);
    assert_string_equal(gguf_part_name(g, 0), gguf_name(g));
    gguf_close(g);
    split_cleanup(prefix, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_corruptions),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_read_copy),
        cmocka_unit_test(test_split_set),
        cmocka_unit_test(test_split_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
