/* test_tokenizer.c - every llama.cpp test vector of every vocab whose type
 * we support must give exactly llama.cpp's ids (../shared/testdata/
 * tokenizer), detokenization must give the text back, and unsupported
 * vocabs must fail with an error naming the type. Plus the pre-tokenizers
 * that have no vocab file here (llama3, qwen2) on hand-checked splits. */
#include "testutil.h"

#include "llm/gguf.h"
#include "llm/tokenizer.h"

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

/* Splits s in place on sep; returns the pieces (NULL-terminated). */
static char **split(char *s, const char *sep, int *n)
{
    char **out = calloc(1024, sizeof(char *));
    *n = 0;
    for (char *p = s; p && *n < 1023;) {
        char *q = strstr(p, sep);
        if (q) *q = 0;
        out[(*n)++] = p;
        p = q ? q + strlen(sep) : NULL;
    }
    return out;
}

static int check_vocab(const char *name)
{
    char rel[256], buf[512], pin[600], pout[600];
    snprintf(rel, sizeof rel, "testdata/tokenizer/ggml-vocab-%s.gguf", name);
    const char *path = shared_path(rel, buf, sizeof buf);
    if (!path) {
        print_message("skipped: ../shared/%s not present\n", rel);
        return -1;
    }
    snprintf(pin, sizeof pin, "%s.inp", path);
    snprintf(pout, sizeof pout, "%s.out", path);
    size_t ni, no;
    char *inp = slurp(pin, &ni), *outp = slurp(pout, &no);
    assert_non_null(inp);
    assert_non_null(outp);
    int n_in, n_out;
    char **texts = split(inp, "\n__ggml_vocab_test__\n", &n_in), **exp = split(outp, "\n", &n_out);
    if (n_in && !texts[n_in - 1][0]) n_in--;
    gguf_file *g;
    llm_vocab *v;
    llm_error err = {0};
    if (gguf_open(path, &g, &err) || llm_vocab_load(g, &v, &err))
        fail_msg("%s: %s", name, err.msg);
    int fails = 0;
    for (int i = 0; i < n_in; i++) {
        int32_t *ids;
        int n;
        assert_int_equal(llm_tokenize(v, texts[i], strlen(texts[i]), 0, 0, &ids, &n, &err), LLM_OK);
        char got[8192] = "";
        size_t at = 0;
        for (int k = 0; k < n && at < sizeof got - 16; k++) at += (size_t)snprintf(got + at, sizeof got - at, " %d", ids[k]);
        const char *e = i < n_out ? exp[i] : "";
        while (*e == ' ') e++;
        if (strcmp(got[0] ? got + 1 : got, e)) {
            print_message("%s vector %d: got [%s] want [%s]\n", name, i, got, e);
            fails++;
        }
        size_t len;
        char *back = llm_detokenize(v, ids, n, 0, &len, &err);
        assert_non_null(back);
        if (strcmp(back, texts[i])) {
            print_message("%s vector %d: detokenized '%s' != '%s'\n", name, i, back, texts[i]);
            fails++;
        }
        free(back);
        free(ids);
    }
    print_message("%s: %d vectors, %d failures\n", name, n_in, fails);
    llm_vocab_free(v);
    gguf_close(g);
    free(texts); free(exp); free(inp); free(outp);
    return fails;
}

static void run_vocab(const char *name)
{
    int r = check_vocab(name);
    if (r < 0)
        skip();
    assert_int_equal(r, 0);
}

static void test_llama_spm(void **s) { (void)s; run_vocab("llama-spm"); }
static void test_phi3(void **s) { (void)s; run_vocab("phi-3"); }
static void test_gpt2(void **s) { (void)s; run_vocab("gpt-2"); }
static void test_mpt(void **s) { (void)s; run_vocab("mpt"); }
static void test_starcoder(void **s) { (void)s; run_vocab("starcoder"); }
static void test_refact(void **s) { (void)s; run_vocab("refact"); }

static void expect_unsupported(const char *name, const char *needle)
{
    char rel[256], buf[512];
    snprintf(rel, sizeof rel, "testdata/tokenizer/ggml-vocab-%s.gguf", name);
    const char *path = shared_path(rel, buf, sizeof buf);
    if (!path)
        return;
    gguf_file *g;
    llm_vocab *v = (llm_vocab *)1;
    llm_error err = {0};
    assert_int_equal(gguf_open(path, &g, &err), LLM_OK);
    assert_int_equal(llm_vocab_load(g, &v, &err), LLM_ERR_UNSUPPORTED);
    assert_null(v);
    if (!strstr(err.msg, needle))
        fail_msg("'%s' lacks '%s'", err.msg, needle);
    gguf_close(g);
}

static void test_unsupported(void **s)
{
    (void)s;
    expect_unsupported("bert-bge", "tokenizer.ggml.model 'bert'");
    expect_unsupported("falcon", "pre-tokenizer 'falcon'");
}

/* Special tokens: parsed only when asked; BOS added by the vocab's flag. */
static void test_special(void **state)
{
    (void)state;
    char buf[512];
    SKIP_UNLESS_SHARED(path, "testdata/tokenizer/ggml-vocab-llama-spm.gguf", buf);
    gguf_file *g;
    llm_vocab *v;
    assert_int_equal(gguf_open(path, &g, NULL), LLM_OK);
    assert_int_equal(llm_vocab_load(g, &v, NULL), LLM_OK);
    int32_t *ids;
    int n;
    const char *t = "Hi</s>";
    assert_int_equal(llm_tokenize(v, t, strlen(t), 1, 1, &ids, &n, NULL), LLM_OK);
    assert_true(n >= 3);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[n - 1], 2);
    assert_true(llm_vocab_is_eog(v, ids[n - 1]));
    free(ids);
    assert_int_equal(llm_tokenize(v, t, strlen(t), 0, 0, &ids, &n, NULL), LLM_OK);
    for (int i = 0; i < n; i++) assert_int_not_equal(ids[i], 2);
    free(ids);
    llm_vocab_free(v);
    gguf_close(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_spm), cmocka_unit_test(test_phi3), cmocka_unit_test(test_gpt2),
        cmocka_unit_test(test_mpt), cmocka_unit_test(test_starcoder), cmocka_unit_test(test_refact),
        cmocka_unit_test(test_unsupported), cmocka_unit_test(test_special),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
