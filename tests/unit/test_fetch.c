/* test_fetch.c - the fetch module's pure parts, with no network: the names
 * a source may hold, sources' forms and their digests, hosts and the
 * redirect rule, the header lines a download reads, part names, back-off,
 * temporary names. (The transfers themselves: test_fetch.py, against a hub
 * stand-in and moto's S3.) */
#include "testutil.h"

#include "fetch_impl.h"

static void test_path_ok(void **state)
{
    (void)state;
    const char *good[] = {"a.gguf", "dir/sub/a.gguf", "a b.gguf", "..a", "a..", ".hidden/x", "Q4_K_M/m-00001-of-00002.gguf"};
    const char *bad[] = {"", "/abs.gguf", "a//b", "./a", "a/./b", "../a", "a/../b", "a/..", "a/", "a\\b", "a\nb", "a\x7f"};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!fetch_path_ok(good[i]))
            fail_msg("refused: '%s'", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (fetch_path_ok(bad[i]))
            fail_msg("accepted: '%s'", bad[i]);
    char longp[FETCH_MAX_PATH + 8];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = 0;
    assert_false(fetch_path_ok(longp));
}

static llm_status check(const char *uri, const char *sha, char *msg, size_t n)
{
    llm_error err = {0};
    llm_status st = fetch_check(uri, &(fetch_options){.sha256 = sha}, &err);
    snprintf(msg, n, "%s", err.msg);
    return st;
}

/* Every form a source may take, and each way one is refused, before a
 * request: the names confined, the digests one per file. */
static void test_sources(void **state)
{
    (void)state;
    char msg[LLM_ERROR_MSG_MAX];
    const char *sha = "abababababababababababababababababababababababababababababababab";
    const char *ok[] = {"hf://org/repo/m.gguf", "hf://org/repo/sub/m.gguf@v1.0", "hf://o-r/r.e_p:Q4_K_M",
                        "hf://org/repo:q8_0@0123456789abcdef0123456789abcdef01234567", "s3://my.bucket/a/b.gguf",
                        "https://host:8443/d/m.gguf?X-Amz-Signature=a/b", "http://127.0.0.1/m.gguf", "/local/m.gguf"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        if (check(ok[i], NULL, msg, sizeof msg))
            fail_msg("refused %s: %s", ok[i], msg);
    const struct { const char *uri, *why; } bad[] = {
        {"hf://org/repo/../x.gguf", "segment"}, {"hf://org/repo//x.gguf", "segment"}, {"hf://../r/x.gguf", "not hf://"},
        {"hf://org--x/repo/x.gguf", "not hf://"}, {"hf://org/repo", "name a file"}, {"hf://org/repo:", "name a file"},
        {"hf://org/repo:Q4@a/b", "revision"}, {"s3://Bad_Bucket/k.gguf", "s3://BUCKET/KEY"},
        {"s3://bucket/../k.gguf", "s3://BUCKET/KEY"}, {"s3://bucket/dir/", "s3://BUCKET/KEY"},
        {"https://h/a/../b.gguf", "segment"}, {"https://h/a/%2E%2E/b.gguf", "encoded"},
        {"https://u@h/b.gguf", "not an http(s) URL"}, {"https://h/a b.gguf", "no spaces"},
        {"https://h/a\r\nX: y", "no spaces"}, {"https://.h/b.gguf", "not an http(s) URL"},
        {"s3://bucket/m-00001-of-99999.gguf", "over 512 parts"}};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (check(bad[i].uri, NULL, msg, sizeof msg) != LLM_ERR_INVALID_ARG || !strstr(msg, bad[i].why))
            fail_msg("%s: wanted '%s', got: %s", bad[i].uri, bad[i].why, msg);
    }
    /* digests: one per file, 64 hex digits each (either case) */
    assert_int_equal(check("hf://org/repo/m.gguf", sha, msg, sizeof msg), LLM_OK);
    assert_int_equal(check("s3://bucket/m-00001-of-00002.gguf", "ABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABAB,"
                           "abababababababababababababababababababababababababababababababab", msg, sizeof msg), LLM_OK);
    assert_int_equal(check("s3://bucket/m-00001-of-00002.gguf", sha, msg, sizeof msg), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(msg, "1 sha256 digest for 2 files"));
    assert_int_equal(check("/m/x-00001-of-00003.gguf", sha, msg, sizeof msg), LLM_ERR_INVALID_ARG);
    assert_int_equal(check("hf://org/repo/m.gguf", "abc", msg, sizeof msg), LLM_ERR_INVALID_ARG);
    char longsha[80];
    snprintf(longsha, sizeof longsha, "%sAB", sha);
    assert_int_equal(check("hf://org/repo/m.gguf", longsha, msg, sizeof msg), LLM_ERR_INVALID_ARG);
    assert_int_equal(check("hf://org/repo:Q4_K_M", sha, msg, sizeof msg), LLM_OK); /* its files: known from the list */
}

static void test_hosts_and_redirects(void **state)
{
    (void)state;
    char host[64], to[4096];
    assert_int_equal(fetch_http_host("https://CDN.example.com:443/x?y", host, sizeof host), 0);
    assert_string_equal(host, "cdn.example.com:443");
    assert_int_equal(fetch_http_host("http://[::1]:8080/x", host, sizeof host), 0);
    assert_int_equal(fetch_http_host("https://user:pw@h/x", host, sizeof host), -1);
    assert_int_equal(fetch_http_host("ftp://h/x", host, sizeof host), -1);
    assert_int_equal(fetch_http_host("https:///x", host, sizeof host), -1);
    llm_error err = {0};
    fetch_options o = {0};
    fetch_ctx c = {.o = &o, .err = &err};
    snprintf(to, sizeof to, "/other/path");
    assert_int_equal(fetch_http_redirect_ok(&c, "https://hub.example/a", to, sizeof to), 0);
    assert_string_equal(to, "https://hub.example/other/path");
    const char *refused[] = {"ftp://h/x", "file:///etc/passwd", "//evil/x", "gopher://h/", "relative/x", "https://u@h/x"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        snprintf(to, sizeof to, "%s", refused[i]);
        if (!fetch_http_redirect_ok(&c, "https://hub.example/a", to, sizeof to))
            fail_msg("redirect to %s allowed", refused[i]);
    }
    snprintf(to, sizeof to, "http://cdn/x"); /* no downgrade from https */
    assert_int_equal(fetch_http_redirect_ok(&c, "https://hub.example/a", to, sizeof to), -1);
    snprintf(to, sizeof to, "http://cdn/x");
    assert_int_equal(fetch_http_redirect_ok(&c, "http://hub.example/a", to, sizeof to), 0);
}

static void header(fetch_resp *r, const char *line)
{
    fetch_http_header_line(r, line, strlen(line));
}

static void test_header_lines(void **state)
{
    (void)state;
    fetch_resp r = {.retry_after = -1};
    header(&r, "HTTP/1.1 302 Found\r\n");
    header(&r, "X-Repo-Commit:  0123456789abcdef0123456789abcdef01234567 \r\n");
    header(&r, "x-linked-etag: \"abc\"\r\n");
    header(&r, "X-Linked-Size: 123456789012\r\n");
    header(&r, "Content-Length: nope\r\n");
    header(&r, "Retry-After: 99999999\r\n");
    header(&r, "Link: <https://h/api?cursor=2>; rel=\"next\", <https://h/api?cursor=9>; rel=\"last\"\r\n");
    header(&r, "no colon here\r\n");
    assert_string_equal(r.commit, "0123456789abcdef0123456789abcdef01234567");
    assert_string_equal(r.linked_etag, "\"abc\"");
    assert_true(r.has_linked_size && r.linked_size == 123456789012ULL);
    assert_false(r.has_length);
    assert_int_equal(r.retry_after, 300); /* capped */
    assert_string_equal(r.next, "https://h/api?cursor=2");
    header(&r, "Retry-After: Wed, 21 Oct 2026 07:28:00 GMT\r\n");
    assert_int_equal(r.retry_after, 5); /* a date: a short wait */
    header(&r, "HTTP/1.1 200 OK\r\n"); /* a new answer forgets the last one's headers */
    assert_string_equal(r.commit, "");
    char big[9000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    memcpy(big, "Location: ", 10);
    header(&r, big);
    assert_true(strlen(r.location) < sizeof r.location);
}

static void test_names(void **state)
{
    (void)state;
    char out[64], a[256], b[256];
    assert_int_equal(fetch_part_name("m-00001-of-00003.gguf", 3, out, sizeof out), 0);
    assert_string_equal(out, "m-00003-of-00003.gguf");
    assert_int_equal(fetch_part_name("m-00001-of-00003.gguf", 4, out, sizeof out), -1);
    assert_int_equal(fetch_part_name("plain.gguf", 1, out, sizeof out), 0);
    assert_string_equal(out, "plain.gguf");
    assert_int_equal(fetch_backoff_s(1, -1), 1);
    assert_int_equal(fetch_backoff_s(3, -1), 4);
    assert_int_equal(fetch_backoff_s(30, -1), 32);
    assert_int_equal(fetch_backoff_s(3, 7), 7);
    fetch_tmp_name("/c/x", ".tmp", a, sizeof a);
    fetch_tmp_name("/c/x", ".tmp", b, sizeof b);
    assert_string_not_equal(a, b);
    char enc[64];
    assert_int_equal(fetch_encode_path(enc, sizeof enc, "d/a b?#%.gguf"), 0);
    assert_string_equal(enc, "d/a%20b%3F%23%25.gguf");
    assert_int_equal(fetch_encode_path(enc, 8, "abcdefghijk"), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_path_ok), cmocka_unit_test(test_sources), cmocka_unit_test(test_hosts_and_redirects),
        cmocka_unit_test(test_header_lines), cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
