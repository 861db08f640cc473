/* test_http_guard.c - the guard's token helpers against values worked by
 * hand: bearer tokens (exact text, scheme needed) and token files (first
 * line, trimmed; empty, missing or too long refused). */
#include "testutil.h"

#include <stdio.h>
#include <unistd.h>

#include "http_guard.h"

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void test_bearer_and_token_file(void **st)
{
    (void)st;
    assert_true(http_guard_bearer_ok("Bearer s3cret", "s3cret"));
    assert_false(http_guard_bearer_ok("Bearer s3cret2", "s3cret"));
    assert_false(http_guard_bearer_ok("Bearer s3cre", "s3cret"));
    assert_false(http_guard_bearer_ok("bearer s3cret", "s3cret"));
    assert_false(http_guard_bearer_ok(NULL, "s3cret"));
    char path[] = "/tmp/test_api_keys_XXXXXX", out[16];
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs("  tok-1 \nsecond line\n", f);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(http_guard_token_file(path, out, sizeof out), 0);
    assert_string_equal(out, "tok-1");
    write_file(path, " \n");
    assert_int_equal(http_guard_token_file(path, out, sizeof out), -1); /* empty */
    write_file(path, "0123456789abcdef\n"); /* 16 characters: no room for the NUL in 16 */
    assert_int_equal(http_guard_token_file(path, out, sizeof out), -1);
    unlink(path);
    assert_int_equal(http_guard_token_file(path, out, sizeof out), -1); /* gone */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bearer_and_token_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
