/* test_rt_quota.c - the gateway's tenant limits (router/rt_quota.c):
 * the sliding minute's arithmetic against values worked by hand; one
 * replica alone holding its share of rpm, tpm and max_inflight; two
 * replicas sharing a real redis-server (Debian's; skipped where there is
 * none) holding the tenant's whole limit between them; Redis stopped
 * (fail closed: 503's limit, fail open: each its share), Redis that
 * answers junk, and Redis that never answers (the call ends within its
 * timeout). */
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "llm/clock.h"
#include "rt_quota.h"

static api_keys keys_of(const char *text)
{
    api_keys k;
    llm_error err = {0};
    if (api_keys_parse(text, strlen(text), "\n", &k, &err))
        fail_msg("%s", err.msg);
    return k;
}

static rt_quota *open_q(const api_keys *k, int share, const char *redis, const char *prefix, int fail_open)
{
    rt_quota_config c = {.keys = k, .share = share, .redis = redis, .prefix = prefix, .fail_open = fail_open,
                         .timeout_ms = 200, .lease_s = 30};
    rt_quota *q;
    llm_error err = {0};
    if (rt_quota_open(&c, &q, &err))
        fail_msg("%s", err.msg);
    return q;
}

/* Admits until refused (at most max); returns how many were let in. */
static int admit_all(rt_quota *q, const api_key *key, double now, int max, rt_quota_limit *why, rt_quota_ticket *keep)
{
    int n = 0;
    char msg[512];
    double retry;
    for (; n < max; n++) {
        rt_quota_ticket t;
        *why = rt_quota_admit(q, key, now, 0, &t, &retry, msg, sizeof msg);
        if (*why)
            break;
        if (keep)
            keep[n] = t;
        else
            rt_quota_done(q, &t, 0, now);
    }
    return n;
}

static void test_arithmetic(void **st)
{
    (void)st;
    double c[RT_QUOTA_SECONDS] = {0};
    c[0] = 30, c[10] = 20, c[60] = 5; /* 55 in the window; room 29 */
    /* the oldest second (30) is out at the next second: 0.25 s from 0.75 s into this one -> at least 1 */
    assert_true(rt_quota_retry(c, 0.75, 29) == 1);
    /* room 5: the 20 of 50 s ago must go too: 11 seconds on, less the 0.25 s gone */
    assert_true(fabs(rt_quota_retry(c, 0.25, 5) - 10.75) < 1e-9);
    /* room 0: this second's 5 as well, 61 seconds on */
    assert_true(fabs(rt_quota_retry(c, 0.5, 0) - 60.5) < 1e-9);
    assert_true(rt_quota_retry(c, 0.5, 100) == 1); /* already within: never under 1 s */
}

/* One replica of two, alone: it holds half of each limit, over any 60 s. */
static void test_alone_share(void **st)
{
    (void)st;
    api_keys k = keys_of("ka tenant=A rpm=10\nkb tenant=B tpm=100\nkc tenant=C max_inflight=4\nfree\n");
    rt_quota *q = open_q(&k, 2, NULL, NULL, 0);
    double now = 1000000.5;
    rt_quota_limit why;
    assert_int_equal(admit_all(q, &k.k[0], now, 100, &why, NULL), 5);
    assert_int_equal(why, RT_QUOTA_RPM);
    char msg[512];
    double retry = 0;
    rt_quota_ticket t;
    assert_int_equal(rt_quota_admit(q, &k.k[0], now + 1, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_RPM);
    assert_non_null(strstr(msg, "tenant 'A' is over its rpm of 10 requests per minute"));
    assert_non_null(strstr(msg, "share"));
    assert_true(fabs(retry - 59.5) < 1e-9); /* the 5 of second 1000000 leave the window at second 1000061 */
    assert_int_equal(admit_all(q, &k.k[0], now + 60, 100, &why, NULL), 0); /* 59.5 s on: still inside */
    assert_int_equal(admit_all(q, &k.k[0], now + 60.6, 100, &why, NULL), 5);
    /* a steady client over the limit: in any 60 s, at most the limit (the share, 5) */
    int got[400] = {0};
    for (int i = 0; i < 400; i++) got[i] = admit_all(q, &k.k[0], now + 200 + i * 0.5, 1, &why, NULL);
    int all = 0;
    for (int s0 = 0; s0 + 120 <= 400; s0++) {
        int n = 0;
        for (int i = s0; i < s0 + 120; i++) n += got[i];
        assert_true(n <= 5);
    }
    for (int i = 0; i < 400; i++) all += got[i];
    assert_true(all >= 15 && all <= 20); /* and over 200 s, its limit per 61 s: 4 bursts of 5 (0, 61, 122, 183 s) */
    /* tpm: tokens counted as answers end; refused once the count reaches the share (50) */
    assert_int_equal(rt_quota_admit(q, &k.k[1], now, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_OK);
    rt_quota_done(q, &t, 49, now);
    assert_int_equal(rt_quota_admit(q, &k.k[1], now, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_OK);
    rt_quota_done(q, &t, 1, now);
    assert_int_equal(rt_quota_admit(q, &k.k[1], now, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_TPM);
    assert_non_null(strstr(msg, "tpm of 100 tokens per minute"));
    /* tpm with reservations (tenant E, alone): two requests that may use 60 each are let in (the count under
     * 100 each time), a third is not; the first ends having used 10: 50 back, and one more goes in */
    api_keys ke = keys_of("ke tenant=E tpm=100\n");
    rt_quota *qe = open_q(&ke, 1, NULL, NULL, 0);
    rt_quota_ticket r1, r2, r3;
    assert_int_equal(rt_quota_admit(qe, &ke.k[0], now, 60, &r1, &retry, msg, sizeof msg), RT_QUOTA_OK);
    assert_int_equal(rt_quota_admit(qe, &ke.k[0], now, 60, &r2, &retry, msg, sizeof msg), RT_QUOTA_OK);
    assert_int_equal(rt_quota_admit(qe, &ke.k[0], now, 60, &r3, &retry, msg, sizeof msg), RT_QUOTA_TPM);
    rt_quota_done(qe, &r1, 10, now);
    assert_int_equal(rt_quota_admit(qe, &ke.k[0], now, 60, &r3, &retry, msg, sizeof msg), RT_QUOTA_OK);
    rt_quota_done(qe, &r2, 0, now); /* never reached a pod: all back */
    rt_quota_done(qe, &r3, 60, now);
    assert_int_equal(rt_quota_admit(qe, &ke.k[0], now, 60, &r1, &retry, msg, sizeof msg), RT_QUOTA_OK); /* 70 < 100 */
    rt_quota_done(qe, &r1, 60, now);
    rt_quota_close(qe);
    api_keys_free(&ke);
    /* max_inflight: 2 here, given back when they end */
    rt_quota_ticket held[4];
    assert_int_equal(admit_all(q, &k.k[2], now, 10, &why, held), 2);
    assert_int_equal(why, RT_QUOTA_INFLIGHT);
    rt_quota_done(q, &held[0], 0, now);
    assert_int_equal(admit_all(q, &k.k[2], now, 10, &why, held), 1);
    /* no limits: never refused */
    assert_int_equal(admit_all(q, &k.k[3], now, 1000, &why, NULL), 1000);
    unsigned long long refused[RT_QUOTA_N], errors;
    int shared;
    rt_quota_stats(q, refused, &errors, &shared);
    print_message("refused: rpm %llu tpm %llu inflight %llu\n", refused[RT_QUOTA_RPM], refused[RT_QUOTA_TPM],
                  refused[RT_QUOTA_INFLIGHT]);
    assert_true(refused[RT_QUOTA_TPM] == 1 && refused[RT_QUOTA_INFLIGHT] == 2 && refused[RT_QUOTA_RPM] > 300);
    assert_false(shared);
    rt_quota_close(q);
    api_keys_free(&k);
}

/* ---- a real redis-server ----------------------------------------------------------------- */

static pid_t redis_pid;
static char redis_addr[64];

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &n))
        return -1;
    close(s);
    return ntohs(a.sin_port);
}

/* Starts redis-server on a free port; 0 when there is none to run. */
static int redis_start(void)
{
    if (access("/usr/bin/redis-server", X_OK))
        return 0;
    int port = free_port();
    char p[16];
    snprintf(p, sizeof p, "%d", port);
    snprintf(redis_addr, sizeof redis_addr, "127.0.0.1:%d", port);
    redis_pid = fork();
    if (redis_pid == 0) {
        if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr))
            _exit(126);
        execl("/usr/bin/redis-server", "redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
              "--appendonly", "no", "--loglevel", "warning", (char *)NULL);
        _exit(127);
    }
    /* ready when a quota can count in it: wait for that, however long */
    api_keys k = keys_of("probe rpm=1000000\n");
    for (int i = 0; i < 3000; i++) {
        rt_quota *q = open_q(&k, 1, redis_addr, "probe", 0);
        rt_quota_ticket t;
        char msg[512];
        double retry;
        rt_quota_limit l = rt_quota_admit(q, &k.k[0], (double)time(NULL), 0, &t, &retry, msg, sizeof msg);
        rt_quota_close(q);
        if (!l) {
            api_keys_free(&k);
            return 1;
        }
        usleep(10000);
    }
    api_keys_free(&k);
    fail_msg("redis-server did not come up on %s", redis_addr);
    return 0;
}

static void redis_stop(void)
{
    if (redis_pid > 0) {
        kill(redis_pid, SIGTERM);
        waitpid(redis_pid, NULL, 0);
        redis_pid = 0;
    }
}

/* Two replicas on one Redis hold the tenant's whole limit between them. */
static void test_shared(void **st)
{
    (void)st;
    if (!redis_start()) {
        print_message("skipped: no /usr/bin/redis-server (Debian's redis-server package)\n");
        skip();
    }
    api_keys k = keys_of("ka tenant=A rpm=10 tpm=100\nkc tenant=C max_inflight=3\n");
    rt_quota *q1 = open_q(&k, 2, redis_addr, "gw1", 0), *q2 = open_q(&k, 2, redis_addr, "gw1", 0);
    double now = (double)time(NULL) + 0.5;
    rt_quota_limit why;
    int a = 0;
    for (int i = 0; i < 20; i++) a += admit_all(i % 2 ? q2 : q1, &k.k[0], now, 1, &why, NULL);
    assert_int_equal(a, 10); /* the whole limit, not each replica's share */
    assert_int_equal(why, RT_QUOTA_RPM);
    char msg[512];
    double retry;
    rt_quota_ticket t, held[6];
    assert_int_equal(rt_quota_admit(q2, &k.k[0], now, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_RPM);
    assert_non_null(strstr(msg, "across the gateway's replicas (Redis)"));
    /* another gateway's prefix counts apart: its requests and its tokens */
    rt_quota *other = open_q(&k, 1, redis_addr, "gw2", 0);
    assert_int_equal(rt_quota_admit(other, &k.k[0], now, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_OK);
    rt_quota_done(other, &t, 100, now);
    assert_int_equal(rt_quota_admit(other, &k.k[0], now, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_TPM); /* gw2 is full */
    rt_quota_close(other);
    /* in flight across replicas: 3 in all, a slot back when one ends */
    assert_int_equal(admit_all(q1, &k.k[1], now, 2, &why, held), 2);
    assert_int_equal(admit_all(q2, &k.k[1], now, 5, &why, held + 2), 1);
    assert_int_equal(why, RT_QUOTA_INFLIGHT);
    rt_quota_done(q1, &held[0], 0, now);
    assert_int_equal(admit_all(q2, &k.k[1], now, 5, &why, held + 3), 1);
    for (int i = 1; i < 4; i++) rt_quota_done(i == 1 ? q1 : q2, &held[i], 0, now);
    /* tokens from one replica's answers hold the other's requests (a minute on: the requests are forgotten) */
    double later = now + 61;
    assert_int_equal(rt_quota_admit(q1, &k.k[0], later, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_OK);
    rt_quota_done(q1, &t, 100, later);
    assert_int_equal(rt_quota_admit(q2, &k.k[0], later, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_TPM);
    /* reservations count across replicas too (a fresh minute): 96 reserved at one, 5 more at the other (96 < 100),
     * then none (101); the 96 given back (it never reached a pod): in again */
    double fresh = later + 200;
    assert_int_equal(rt_quota_admit(q1, &k.k[0], fresh, 96, &t, &retry, msg, sizeof msg), RT_QUOTA_OK);
    assert_int_equal(rt_quota_admit(q2, &k.k[0], fresh, 5, &held[0], &retry, msg, sizeof msg), RT_QUOTA_OK);
    assert_int_equal(rt_quota_admit(q2, &k.k[0], fresh, 5, &held[1], &retry, msg, sizeof msg), RT_QUOTA_TPM);
    rt_quota_done(q1, &t, 0, fresh);
    assert_int_equal(rt_quota_admit(q2, &k.k[0], fresh, 5, &held[1], &retry, msg, sizeof msg), RT_QUOTA_OK);
    rt_quota_done(q2, &held[0], 5, fresh);
    rt_quota_done(q2, &held[1], 5, fresh);
    /* an answer settled in a later second than its reservation, with fewer tokens than reserved: that second's
     * count goes below 0 (the window's sum is what counts) - an answer the admission must read as counts, not
     * as junk that marks the store down for every tenant (it did, under load: seconds pass between the two) */
    double next = fresh + 200;
    assert_int_equal(rt_quota_admit(q1, &k.k[0], next, 50, &t, &retry, msg, sizeof msg), RT_QUOTA_OK);
    rt_quota_done(q1, &t, 10, next + 1); /* -40 in second next + 1 */
    assert_int_equal(rt_quota_admit(q2, &k.k[0], next + 1.5, 20, &held[0], &retry, msg, sizeof msg), RT_QUOTA_OK);
    assert_int_equal(rt_quota_admit(q2, &k.k[0], next + 1.5, 80, &held[1], &retry, msg, sizeof msg), RT_QUOTA_OK);
    assert_int_equal(rt_quota_admit(q1, &k.k[0], next + 1.5, 1, &held[2], &retry, msg, sizeof msg), RT_QUOTA_TPM);
    unsigned long long refused[RT_QUOTA_N], errors = 0;
    int shared = 0;
    rt_quota_stats(q1, refused, &errors, &shared);
    assert_int_equal(errors, 0);
    rt_quota_done(q2, &held[0], 20, next + 2);
    rt_quota_done(q2, &held[1], 80, next + 2);
    /* Redis stopped: closed refuses tenants with limits (naming the store); open holds each replica's share */
    redis_stop();
    double t0 = llm_clock_mono_s();
    assert_int_equal(rt_quota_admit(q1, &k.k[1], later, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_STORE);
    assert_true(llm_clock_mono_s() - t0 < 2);
    assert_non_null(strstr(msg, "fails closed"));
    rt_quota *open1 = open_q(&k, 2, redis_addr, "gw1", 1);
    assert_int_equal(admit_all(open1, &k.k[0], later + 61, 20, &why, NULL), 5);
    assert_int_equal(rt_quota_admit(open1, &k.k[0], later + 61, 0, &t, &retry, msg, sizeof msg), RT_QUOTA_RPM);
    assert_non_null(strstr(msg, "fail open"));
    rt_quota_stats(q1, refused, &errors, &shared);
    assert_true(errors >= 1 && refused[RT_QUOTA_STORE] == 1);
    assert_false(shared); /* marked down: not counting in Redis now */
    rt_quota_close(open1);
    rt_quota_close(q1);
    rt_quota_close(q2);
    api_keys_free(&k);
}

/* ---- Redis impostors: junk answers, no answer ------------------------------------------- */

typedef struct fake {
    int fd, mode; /* 0: "+OK" to anything; 1: read and never answer */
} fake;

static void *fake_serve(void *arg)
{
    fake *f = arg;
    for (;;) {
        int c = accept(f->fd, NULL, NULL);
        if (c < 0)
            return NULL;
        char buf[8192];
        ssize_t n = read(c, buf, sizeof buf);
        if (n > 0 && f->mode == 0 && write(c, "+OK\r\n", 5) != 5)
            n = 0;
        if (f->mode == 1)
            while (read(c, buf, sizeof buf) > 0) {}
        close(c);
    }
}

static void impostor(int mode)
{
    static fake fakes[2]; /* one per mode: its detached thread reads it after this returns, until accept fails */
    fake *fp = &fakes[mode];
    *fp = (fake){.fd = socket(AF_INET, SOCK_STREAM, 0), .mode = mode};
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof a;
    assert_true(fp->fd >= 0 && !bind(fp->fd, (struct sockaddr *)&a, sizeof a) && !listen(fp->fd, 16) &&
                !getsockname(fp->fd, (struct sockaddr *)&a, &n));
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fake_serve, fp), 0);
    pthread_detach(th);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", ntohs(a.sin_port));
    api_keys k = keys_of("ka tenant=A rpm=10\n");
    rt_quota *q = open_q(&k, 1, addr, "gw", 0);
    rt_quota_ticket t;
    char msg[512];
    double retry, t0 = llm_clock_mono_s();
    assert_int_equal(rt_quota_admit(q, &k.k[0], (double)time(NULL), 0, &t, &retry, msg, sizeof msg), RT_QUOTA_STORE);
    double took = llm_clock_mono_s() - t0;
    print_message("mode %d: refused in %.3f s\n", mode, took);
    assert_true(took < 1.5); /* within the 200 ms timeout, with room for a loaded machine */
    /* marked down: the next request does not wait on it again */
    t0 = llm_clock_mono_s();
    assert_int_equal(rt_quota_admit(q, &k.k[0], (double)time(NULL), 0, &t, &retry, msg, sizeof msg), RT_QUOTA_STORE);
    assert_true(llm_clock_mono_s() - t0 < 0.1);
    rt_quota_close(q);
    api_keys_free(&k);
    shutdown(fp->fd, SHUT_RDWR);
    close(fp->fd);
}

static void test_junk_and_silence(void **st)
{
    (void)st;
    impostor(0);
    impostor(1);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arithmetic),
        cmocka_unit_test(test_alone_share),
        cmocka_unit_test(test_shared),
        cmocka_unit_test(test_junk_and_silence),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    redis_stop();
    return rc;
}
