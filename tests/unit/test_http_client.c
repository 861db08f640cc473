/* test_http_client.c - http_client_get_many_lines against a plain socket
 * server: a /metrics page of 24 MiB (far past what a page may keep) is
 * read whole and only the lines with the wanted prefixes are kept, the
 * last line without its newline too; a line longer than
 * HTTP_CLIENT_LINE_MAX is dropped whole; a page past read_max, or whose
 * kept lines pass max, is no answer; an unfiltered page comes as it is. */
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>

#include "http_client.h"

enum { PAGES = 6 };

typedef struct server {
    int fd;
    int port;
} server;

static void send_all(int c, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(c, p, n, MSG_NOSIGNAL); /* the client may leave mid-page */
        if (w <= 0)
            return;
        p += w, n -= (size_t)w;
    }
}

/* The page for path: junk lines around the wanted ones. */
static void answer(int c, const char *path)
{
    char head[256], junk[128];
    size_t junk_lines = strstr(path, "/big") ? 200000 : 10; /* 200,000 lines of 127 bytes: 24 MiB */
    memset(junk, 'x', sizeof junk);
    memcpy(junk, "other_series{a=\"", 16);
    junk[126] = '\n';
    snprintf(head, sizeof head, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n");
    send_all(c, head, strlen(head));
    const char *top = "# HELP llm_requests_waiting x\nllm_requests_waiting 3\n";
    send_all(c, top, strlen(top));
    for (size_t i = 0; i < junk_lines; i++) send_all(c, junk, 127);
    if (strstr(path, "/long")) { /* a wanted prefix on a line too long to keep */
        send_all(c, "llm_revision_requests_total{", 28);
        for (int i = 0; i < HTTP_CLIENT_LINE_MAX; i++) send_all(c, "y", 1);
        send_all(c, "} 1\n", 4);
    }
    const char *end = "llm_revision_requests_total{revision=\"canary\",code=\"2xx\"} 7"; /* no newline: the end */
    send_all(c, end, strlen(end));
}

static void *serve(void *arg)
{
    server *s = arg;
    for (int k = 0; k < PAGES; k++) {
        int c = accept(s->fd, NULL, NULL);
        if (c < 0)
            return NULL;
        char req[2048];
        ssize_t n = read(c, req, sizeof req - 1);
        req[n > 0 ? n : 0] = 0;
        char path[256] = "";
        sscanf(req, "GET %255s", path);
        answer(c, path);
        close(c);
    }
    return NULL;
}

static void test_lines_kept_from_a_huge_page(void **st)
{
    (void)st;
    server s = {.fd = socket(AF_INET, SOCK_STREAM, 0)};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_true(s.fd >= 0);
    assert_int_equal(bind(s.fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(s.fd, 16), 0);
    assert_int_equal(getsockname(s.fd, (struct sockaddr *)&a, &al), 0);
    s.port = ntohs(a.sin_port);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, serve, &s), 0);
    char u[PAGES][64];
    const char *urls[PAGES];
    static const char *const paths[PAGES] = {"/big", "/long", "/small", "/big", "/small", "/small"};
    for (int i = 0; i < PAGES; i++) {
        snprintf(u[i], sizeof u[i], "http://127.0.0.1:%d%s", s.port, paths[i]);
        urls[i] = u[i];
    }
    /* 0-2 filtered within bounds; 3 read past read_max (16 MiB of 24); 4 unfiltered (its 1,382 bytes whole);
     * 5 kept lines past max (60 bytes) */
    static const char *const keep[] = {"llm_requests_waiting", "llm_revision_", NULL};
    unsigned char filtered[PAGES] = {1, 1, 1, 1, 0, 1};
    long codes[PAGES];
    char *bodies[PAGES];
    /* read_max 32 MiB for all but page 3's turn: two calls share the server */
    http_client_get_many_lines(urls, 3, 60000, 4096, 32u << 20, keep, filtered, codes, bodies);
    const char *want = "llm_requests_waiting 3\nllm_revision_requests_total{revision=\"canary\",code=\"2xx\"} 7\n";
    for (int i = 0; i < 3; i++) {
        assert_int_equal(codes[i], 200);
        assert_string_equal(bodies[i], want); /* the long line dropped whole, the junk and the comment too */
        free(bodies[i]);
    }
    http_client_get_many_lines(urls + 3, 2, 60000, 4096, 16u << 20, keep, filtered + 3, codes + 3, bodies + 3);
    assert_int_equal(codes[3], 0); /* past read_max: no answer */
    assert_null(bodies[3]);
    assert_int_equal(codes[4], 200);
    assert_true(strlen(bodies[4]) == 53 + 10 * 127 + 59 && !strncmp(bodies[4], "# HELP", 6) && strstr(bodies[4], "other_series"));
    free(bodies[4]);
    http_client_get_many_lines(urls + 5, 1, 60000, 60, 16u << 20, keep, filtered + 5, codes + 5, bodies + 5);
    assert_int_equal(codes[5], 0); /* what is kept is bounded too */
    pthread_join(th, NULL);
    close(s.fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_lines_kept_from_a_huge_page)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
