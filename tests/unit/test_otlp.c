/* test_otlp.c - W3C trace context (net/otlp.c) against the spec's
 * examples and hostile headers, sampling by ratio, and the exporter's
 * bounded queue: spans past it dropped and counted, a collector that
 * takes the connection and never answers costing a request nothing
 * (otlp_span returns at once; the batch times out, counted). The
 * protobuf itself is checked by tests/integration/test_traces.py with the
 * official opentelemetry-proto decoder. */
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "llm/clock.h"
#include "otlp.h"

static void test_traceparent(void **st)
{
    (void)st;
    otlp_ctx c;
    /* the W3C spec's example */
    const char *ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    assert_true(otlp_traceparent_parse(ok, &c));
    assert_true(c.sampled && c.trace_id[0] == 0x4b && c.trace_id[15] == 0x36 && c.span_id[7] == 0xb7);
    char out[56];
    otlp_traceparent_format(&c, out);
    assert_string_equal(out, ok);
    assert_true(otlp_traceparent_parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", &c) && !c.sampled);
    static const char *const bad[] = {
        NULL, "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",        /* short */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",              /* long */
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",                /* another version */
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",                /* uppercase */
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",                /* zero trace id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",                /* zero span id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",                /* bad flags */
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",                /* bad separator */
        "00-4bf92f3577b34da6a3ce929d0e0e473\n-00f067aa0ba902b7-01",               /* a control character */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_false(otlp_traceparent_parse(bad[i], &c));
}

static void test_sampling_and_queue(void **st)
{
    (void)st;
    /* a port nobody listens on: every batch fails, fast */
    otlp_config none = {.endpoint = "http://127.0.0.1:9/v1/traces", .ratio = 0, .queue_max = 4, .timeout_s = 0.2};
    otlp *o;
    llm_error err = {0};
    assert_int_equal(otlp_open(&none, &o, &err), LLM_OK);
    otlp_ctx parent, c;
    int sampled = 0;
    for (int i = 0; i < 200; i++) {
        otlp_child(o, NULL, 0, &c);
        sampled += c.sampled;
    }
    assert_int_equal(sampled, 0); /* ratio 0: no new trace */
    assert_true(otlp_traceparent_parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", &parent));
    otlp_child(o, &parent, 1, &c); /* a sampled parent is followed whatever the ratio */
    assert_true(c.sampled && !memcmp(c.trace_id, parent.trace_id, 16) && memcmp(c.span_id, parent.span_id, 8));
    /* 1000 spans at once into a queue of 4: each returns at once; the rest dropped and counted */
    double t0 = llm_clock_mono_s();
    otlp_attr a[] = {{"k", "v", 0}, {"n", NULL, -5}};
    for (int i = 0; i < 1000; i++) otlp_span(o, &c, parent.span_id, "s", OTLP_SERVER, 1, 2, a, 2, 0);
    assert_true(llm_clock_mono_s() - t0 < 0.5);
    unsigned long long sent, dropped;
    otlp_stats(o, &sent, &dropped);
    assert_true(dropped >= 996 && sent == 0);
    otlp_close(o); /* the queued ones: tried, within the timeout */
    otlp_config half = {.endpoint = "http://127.0.0.1:9/v1/traces", .ratio = 0.5};
    assert_int_equal(otlp_open(&half, &o, &err), LLM_OK);
    for (int i = 0; i < 4000; i++) {
        otlp_child(o, NULL, 0, &c);
        sampled += c.sampled;
    }
    assert_true(sampled > 1800 && sampled < 2200); /* about half, from the trace ids */
    otlp_close(o);
    otlp_config bad = {.endpoint = "file:///etc/passwd", .ratio = 1};
    assert_int_equal(otlp_open(&bad, &o, &err), LLM_ERR_INVALID_ARG);
    bad.endpoint = "http://x", bad.ratio = 2;
    assert_int_equal(otlp_open(&bad, &o, &err), LLM_ERR_INVALID_ARG);
    /* no exporter: never sampled, nothing recorded */
    otlp_child(NULL, &parent, 1, &c);
    assert_false(c.sampled);
    otlp_span(NULL, &c, NULL, "s", OTLP_SERVER, 1, 2, NULL, 0, 0);
}

/* A collector that accepts (the kernel's backlog does) and never answers. */
static void test_silent_collector(void **st)
{
    (void)st;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    assert_true(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) && !listen(fd, 16) &&
                !getsockname(fd, (struct sockaddr *)&a, &n));
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/traces", ntohs(a.sin_port));
    otlp_config cfg = {.endpoint = url, .ratio = 1, .timeout_s = 0.3};
    otlp *o;
    llm_error err = {0};
    assert_int_equal(otlp_open(&cfg, &o, &err), LLM_OK);
    otlp_ctx c;
    double t0 = llm_clock_mono_s(), slowest = 0;
    for (int i = 0; i < 10; i++) {
        otlp_child(o, NULL, 0, &c);
        double t = llm_clock_mono_s();
        otlp_span(o, &c, NULL, "s", OTLP_SERVER, 1, 2, NULL, 0, 0);
        if (llm_clock_mono_s() - t > slowest)
            slowest = llm_clock_mono_s() - t;
    }
    assert_true(slowest < 0.2); /* queued, never sent on the caller's time (a send waits its 0.3 s timeout) */
    unsigned long long sent = 0, dropped = 0;
    while (dropped < 10 && llm_clock_mono_s() - t0 < 30) { /* (the wait is for the count, however long) */
        usleep(20000);
        otlp_stats(o, &sent, &dropped);
    }
    assert_true(dropped == 10 && sent == 0);
    otlp_close(o);
    close(fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_traceparent), cmocka_unit_test(test_sampling_and_queue),
                                       cmocka_unit_test(test_silent_collector)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
