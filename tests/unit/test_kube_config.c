/* test_kube_config.c - a kubeconfig's inline credentials ("-data" keys)
 * decoded as kubectl takes them: base64 with or without padding, across
 * lines; anything else refused with LLM_ERR_FORMAT naming the key. The
 * decoder is OpenSSL's (the one codec the programs share); these cases hold
 * the leniency the hand-written one had. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kube_config.h"

/* Loads a kubeconfig whose CA is `ca` as written; LLM_OK with *out its bytes. */
static llm_status load_ca(const char *ca, kube_config *c, llm_error *err)
{
    char path[] = "/tmp/test_kube_config_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fprintf(f, "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:6443\n"
               "    certificate-authority-data: \"%s\"\ncontexts:\n- name: k\n  context: {cluster: k, user: u}\n"
               "current-context: k\nusers:\n- name: u\n  user: {token: t}\n", ca);
    fclose(f);
    llm_status st = kube_config_load(path, c, err);
    unlink(path);
    return st;
}

static void test_inline_base64(void **state)
{
    (void)state;
    static const struct { const char *in, *want; } ok[] = {
        {"aGVsbG8=", "hello"}, {"aGVsbG8", "hello"}, {"aGVs\\nbG8=", "hello"}, {"YQ==", "a"}, {"YQ", "a"},
        {"YQ=", "a"}, {"YWJj", "abc"}, {" YW Jj ", "abc"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        kube_config c;
        llm_error err = {0};
        if (load_ca(ok[i].in, &c, &err))
            fail_msg("%s: %s", ok[i].in, err.msg);
        assert_int_equal(c.ca_len, strlen(ok[i].want));
        assert_memory_equal(c.ca_pem, ok[i].want, c.ca_len);
        kube_config_free(&c);
    }
    static const char *const bad[] = {"Y", "aGVsbG8==", "a=GVs", "aGVsbG8=x", "!!!!", "YQ==="};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kube_config c;
        llm_error err = {0};
        if (load_ca(bad[i], &c, &err) == LLM_OK) {
            kube_config_free(&c);
            fail_msg("accepted %s", bad[i]);
        }
        assert_int_equal(err.code, LLM_ERR_FORMAT);
        assert_non_null(strstr(err.msg, "certificate-authority-data"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inline_base64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
