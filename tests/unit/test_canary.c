/* test_canary.c - the canary's arithmetic against values worked by hand:
 * spec parsing (steps, durations, thresholds, errors naming the field),
 * the router's /metrics text summed over routers, p99 from cumulative
 * buckets (Prometheus' interpolation), windows across a router restart,
 * the analysis verdicts and messages, the step decisions and the replica
 * split between revisions. */
#include "testutil.h"

#include <jansson.h>
#include <math.h>

#include "canary.h"

#define assert_double_close(a, b, eps)                                               \
    do {                                                                             \
        double a_ = (a), b_ = (b);                                                   \
        if (!(fabs(a_ - b_) <= (eps)))                                               \
            fail_msg("%s = %.9g, want %.9g", #a, a_, b_);                            \
    } while (0)

static canary_config cfg_of(const char *json, llm_status want, const char *msg)
{
    json_t *spec = json_loads(json, 0, NULL);
    assert_non_null(spec);
    canary_config c;
    llm_error err = {0};
    assert_int_equal(canary_config_from_spec(spec, &c, &err), want);
    if (msg)
        assert_non_null(strstr(err.msg, msg));
    json_decref(spec);
    return c;
}

static void test_config(void **st)
{
    (void)st;
    canary_config c = cfg_of("{}", LLM_OK, NULL);
    assert_int_equal(c.enabled, 0);
    c = cfg_of("{\"canary\":{\"steps\":[{\"weight\":10,\"pause\":\"2m\"},{\"weight\":50,\"pause\":\"1m30s\"},"
               "{\"weight\":50,\"pause\":45}],\"intervalSeconds\":3,\"analysis\":{\"maxErrorRatio\":0.1}}}",
               LLM_OK, NULL);
    assert_int_equal(c.enabled, 1);
    assert_int_equal(c.n_steps, 3);
    assert_int_equal(c.steps[0].weight, 10);
    assert_true(c.steps[0].pause_s == 120 && c.steps[1].pause_s == 90 && c.steps[2].pause_s == 45);
    assert_true(c.interval_s == 3 && c.max_error_ratio == 0.1);
    assert_true(c.max_ttft_ratio == 1.5 && c.max_itl_ratio == 1.5 && c.tolerance_s == 0.05 && c.min_requests == 20);
    cfg_of("{\"canary\":{\"steps\":[{\"weight\":50},{\"weight\":20}]}}", LLM_ERR_INVALID_ARG,
           "spec.canary.steps[1].weight");
    cfg_of("{\"canary\":{\"steps\":[{\"weight\":50,\"pause\":\"2x\"}]}}", LLM_ERR_INVALID_ARG,
           "spec.canary.steps[0].pause");
    cfg_of("{\"canary\":{\"steps\":[]}}", LLM_ERR_INVALID_ARG, "spec.canary.steps");
    cfg_of("{\"canary\":{\"mode\":\"sidecar\",\"steps\":[{\"weight\":5}]}}", LLM_ERR_INVALID_ARG, "spec.canary.mode");
    c = cfg_of("{\"canary\":{\"mode\":\"colocated\",\"steps\":[{\"weight\":5}]}}", LLM_OK, NULL);
    assert_int_equal(c.colocated, 1);
    cfg_of("{\"canary\":{\"steps\":[{\"weight\":5}],\"analysis\":{\"maxTTFTRatio\":0.5}}}", LLM_ERR_INVALID_ARG,
           "spec.canary.analysis.maxTTFTRatio");
    cfg_of("{\"canary\":{\"steps\":[{\"weight\":5}],\"intervalSeconds\":0}}", LLM_ERR_INVALID_ARG,
           "spec.canary.intervalSeconds");
}

static const char router_a[] =
    "# HELP llm_router_revision_requests_total x\n"
    "llm_router_requests_total{backend=\"http://1\",code=\"5xx\"} 99\n"
    "llm_router_revision_requests_total{revision=\"stable\",code=\"2xx\"} 90\n"
    "llm_router_revision_requests_total{revision=\"stable\",code=\"5xx\"} 1\n"
    "llm_router_revision_requests_total{revision=\"canary\",code=\"2xx\"} 8\n"
    "llm_router_revision_requests_total{revision=\"canary\",code=\"none\"} 2\n"
    "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"0.1\"} 50\n"
    "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"0.2\"} 90\n"
    "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"0.5\"} 100\n"
    "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"+Inf\"} 100\n"
    "llm_router_revision_ttfb_seconds_sum{revision=\"stable\"} 12.5\n"
    "llm_router_revision_itl_seconds_bucket{revision=\"canary\",le=\"0.1\"} 0\n"
    "llm_router_revision_itl_seconds_bucket{revision=\"canary\",le=\"0.2\"} 0\n"
    "llm_router_revision_itl_seconds_bucket{revision=\"canary\",le=\"0.5\"} 0\n"
    "llm_router_revision_itl_seconds_bucket{revision=\"canary\",le=\"+Inf\"} 10\n";

static void test_sample_and_quantile(void **st)
{
    (void)st;
    canary_sample s = {0};
    canary_sample_add(&s, router_a);
    canary_sample_add(&s, router_a); /* two routers: every counter doubles */
    assert_true(s.requests[0] == 182 && s.errors[0] == 2);
    assert_true(s.requests[1] == 20 && s.errors[1] == 4); /* "none": no answer counts as an error */
    assert_int_equal(s.n_le, 3);
    assert_true(s.ttft[0][0] == 100 && s.ttft[0][1] == 180 && s.ttft[0][2] == 200 && s.ttft[0][CANARY_MAX_BUCKETS] == 200);
    /* p99: rank 198 lies in (0.2, 0.5] with 180 below and 20 inside: 0.2 + 0.3 * 18/20 = 0.47 */
    assert_double_close(canary_quantile(s.le, s.n_le, s.ttft[0], 0.99), 0.47, 1e-9);
    /* p50: rank 100 ends the first bucket: 0.1 */
    assert_double_close(canary_quantile(s.le, s.n_le, s.ttft[0], 0.5), 0.1, 1e-9);
    assert_double_close(canary_quantile(s.le, s.n_le, s.ttft[1], 0.99), -1, 0); /* no data */
    /* all in +Inf: the highest bound is all a histogram can say */
    assert_double_close(canary_quantile(s.le, s.n_le, s.itl[1], 0.99), 0.5, 0);
    /* a gateway's page holds every route's series: only the route asked for is taken (a prefix of its
     * name or another route's is not), and a page without it takes nothing */
    static const char gw[] =
        "llm_router_revision_requests_total{route=\"story\",revision=\"canary\",code=\"5xx\"} 3\n"
        "llm_router_revision_requests_total{route=\"story\",revision=\"stable\",code=\"2xx\"} 9\n"
        "llm_router_revision_requests_total{route=\"story-b\",revision=\"canary\",code=\"2xx\"} 50\n"
        "llm_router_revision_requests_total{route=\"stor\",revision=\"canary\",code=\"2xx\"} 70\n"
        "llm_router_revision_ttfb_seconds_bucket{route=\"story\",revision=\"canary\",le=\"+Inf\"} 3\n";
    canary_sample g = {0};
    assert_int_equal(canary_sample_add_route(&g, gw, "story"), 3);
    assert_true(g.requests[1] == 3 && g.errors[1] == 3 && g.requests[0] == 9 && g.ttft[1][CANARY_MAX_BUCKETS] == 3);
    canary_sample none = {0};
    assert_int_equal(canary_sample_add_route(&none, gw, "other"), 0);
    assert_int_equal(canary_sample_add_route(&none, router_a, "story"), 0); /* a router's own page: no route label */
    assert_true(none.requests[0] == 0 && none.requests[1] == 0);
    /* a bound appearing out of order is put in place with its counts */
    canary_sample u = {0};
    canary_sample_add(&u, "llm_router_revision_itl_seconds_bucket{revision=\"stable\",le=\"0.5\"} 7\n"
                      "llm_router_revision_itl_seconds_bucket{revision=\"stable\",le=\"0.1\"} 3\n");
    assert_true(u.n_le == 2 && u.le[0] == 0.1 && u.le[1] == 0.5 && u.itl[0][0] == 3 && u.itl[0][1] == 7);
    /* llm-server's series of a colocated canary read alike; others not */
    canary_sample v = {0};
    canary_sample_add(&v, "llm_revision_requests_total{revision=\"canary\",code=\"5xx\"} 4\n"
                      "llm_revision_requests_total{revision=\"canary\",code=\"2xx\"} 6\n"
                      "xllm_revision_requests_total{revision=\"canary\",code=\"2xx\"} 100\n");
    assert_true(v.requests[1] == 10 && v.errors[1] == 4);
    /* +Inf however spelled goes to the +Inf count, never into the bounds */
    canary_sample w = {0};
    canary_sample_add(&w, "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"+InF\"} 5\n"
                      "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"inf\"} 2\n"
                      "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"x\"} 9\n");
    assert_true(w.n_le == 0 && w.ttft[0][CANARY_MAX_BUCKETS] == 7);
}

static void test_window_and_json(void **st)
{
    (void)st;
    canary_sample then = {0}, now = {0}, w;
    canary_sample_add(&then, router_a);
    canary_sample_add(&now, router_a);
    canary_sample_add(&now, "llm_router_revision_requests_total{revision=\"canary\",code=\"2xx\"} 5\n");
    canary_sample_diff(&now, &then, &w);
    assert_true(w.requests[1] == 5 && w.errors[1] == 0 && w.requests[0] == 0 && w.ttft[0][CANARY_MAX_BUCKETS] == 0);
    canary_sample diff_back; /* a router restarted: counters went down, the window starts over */
    canary_sample_diff(&then, &now, &diff_back);
    assert_true(diff_back.requests[1] == then.requests[1]);
    json_t *j = canary_sample_to_json(&now);
    assert_non_null(j);
    canary_sample back;
    assert_int_equal(canary_sample_from_json(j, &back), 1);
    assert_true(back.n_le == 3 && back.requests[1] == 15 && back.errors[1] == 2 && back.ttft[0][2] == 100 &&
                back.ttft[0][CANARY_MAX_BUCKETS] == 100 && back.itl[1][CANARY_MAX_BUCKETS] == 10);
    json_decref(j);
    assert_int_equal(canary_sample_from_json(json_null(), &back), 0);
}

/* A window with stable at p99 ~0.047 s and the canary as given. */
static canary_sample window(double creq, double cerr, double cttft_bucket)
{
    canary_sample w = {0};
    canary_sample_add(&w, "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"0.05\"} 100\n"
                      "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"0.1\"} 100\n"
                      "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"0.5\"} 100\n"
                      "llm_router_revision_ttfb_seconds_bucket{revision=\"stable\",le=\"+Inf\"} 100\n"
                      "llm_router_revision_requests_total{revision=\"stable\",code=\"2xx\"} 100\n");
    w.requests[1] = creq;
    w.errors[1] = cerr;
    int b = cttft_bucket <= 0.05 ? 0 : cttft_bucket <= 0.1 ? 1 : 2;
    for (int i = b; i < 3; i++) w.ttft[1][i] = creq;
    w.ttft[1][CANARY_MAX_BUCKETS] = creq;
    return w;
}

static void test_analysis(void **st)
{
    (void)st;
    canary_config c = cfg_of("{\"canary\":{\"steps\":[{\"weight\":10}],\"analysis\":{\"minRequests\":10}}}", LLM_OK, NULL);
    canary_analysis a;
    canary_sample w = window(5, 5, 0.05);
    canary_analyse(&c, &w, &a);
    assert_int_equal(a.verdict, CANARY_INCONCLUSIVE);
    assert_non_null(strstr(a.message, "5 of the 10 canary requests"));
    w = window(20, 4, 0.05); /* 0.2 > 0 + 0.05 */
    canary_analyse(&c, &w, &a);
    assert_int_equal(a.verdict, CANARY_FAIL);
    assert_string_equal(a.signal, "ErrorRatio");
    assert_non_null(strstr(a.message, "canary error ratio 0.200 (4 of 20 requests) exceeds stable's 0.000"));
    w = window(20, 1, 0.05); /* 0.05 is not more than 0.05 */
    canary_analyse(&c, &w, &a);
    assert_int_equal(a.verdict, CANARY_PASS);
    /* canary p99 in (0.1, 0.5]: 0.1 + 0.4 * 0.99 = 0.496 s against stable 0.0495 s: 10x */
    w = window(20, 0, 0.5);
    canary_analyse(&c, &w, &a);
    assert_int_equal(a.verdict, CANARY_FAIL);
    assert_string_equal(a.signal, "TimeToFirstToken");
    assert_string_equal(a.message, "canary p99 time to first token 0.496 s is 10.02x stable's 0.050 s (limit 1.50x)");
    assert_double_close(a.ttft_p99[1], 0.496, 1e-9);
    assert_double_close(a.ttft_p99[0], 0.0495, 1e-9);
    /* in (0.05, 0.1]: 0.0995 is 2x stable but only 0.05 s more: within the tolerance */
    w = window(20, 0, 0.1);
    canary_analyse(&c, &w, &a);
    assert_int_equal(a.verdict, CANARY_PASS);
    c.tolerance_s = 0.01;
    canary_analyse(&c, &w, &a);
    assert_int_equal(a.verdict, CANARY_FAIL);
    /* inter-token latency alone */
    w = window(20, 0, 0.05);
    w.itl[0][0] = w.itl[0][1] = w.itl[0][2] = w.itl[0][CANARY_MAX_BUCKETS] = 100;
    w.itl[1][2] = w.itl[1][CANARY_MAX_BUCKETS] = 100;
    canary_analyse(&c, &w, &a);
    assert_int_equal(a.verdict, CANARY_FAIL);
    assert_string_equal(a.signal, "InterTokenLatency");
    assert_non_null(strstr(a.message, "canary p99 inter-token latency"));
}

static void test_decide_and_split(void **st)
{
    (void)st;
    canary_config c = cfg_of("{\"canary\":{\"steps\":[{\"weight\":10,\"pause\":60},{\"weight\":50,\"pause\":30}]}}",
                         LLM_OK, NULL);
    assert_int_equal(canary_decide(&c, 0, 100, 100, CANARY_FAIL, 1), CANARY_ROLLBACK); /* failing rolls back even when paused */
    assert_int_equal(canary_decide(&c, 0, 100, 100, CANARY_PASS, 1), CANARY_HOLD);
    assert_int_equal(canary_decide(&c, 0, 59, 59, CANARY_PASS, 0), CANARY_HOLD);
    assert_int_equal(canary_decide(&c, 0, 60, 60, CANARY_INCONCLUSIVE, 0), CANARY_HOLD);
    assert_int_equal(canary_decide(&c, 0, 60, 60, CANARY_PASS, 0), CANARY_ADVANCE);
    assert_int_equal(canary_decide(&c, 1, 30, 30, CANARY_PASS, 0), CANARY_PROMOTE);
    /* no verdict for inconclusiveTimeoutSeconds (default 1800): held saying so, or rolled back */
    assert_int_equal(canary_decide(&c, 0, 1799, 1799, CANARY_INCONCLUSIVE, 0), CANARY_HOLD);
    assert_int_equal(canary_decide(&c, 0, 1800, 1800, CANARY_INCONCLUSIVE, 0), CANARY_STALLED);
    assert_int_equal(canary_decide(&c, 0, 1800, 1800, CANARY_INCONCLUSIVE, 1), CANARY_HOLD); /* paused by hand: as asked */
    /* a window begun again (a router restarted) 100 s ago in a step 2,000 s old: no verdict yet, no stall */
    assert_int_equal(canary_decide(&c, 0, 2000, 100, CANARY_INCONCLUSIVE, 0), CANARY_HOLD);
    canary_config r = cfg_of("{\"canary\":{\"steps\":[{\"weight\":10}],\"analysis\":{\"inconclusiveTimeoutSeconds\":30,"
                             "\"onInconclusive\":\"rollback\"}}}", LLM_OK, NULL);
    assert_int_equal(canary_decide(&r, 0, 30, 30, CANARY_INCONCLUSIVE, 0), CANARY_ROLLBACK);
    cfg_of("{\"canary\":{\"steps\":[{\"weight\":10}],\"analysis\":{\"onInconclusive\":\"promote\"}}}", LLM_ERR_INVALID_ARG,
           "onInconclusive");
    /* the texts' ConfigMap name goes into an API path: a name, never a path out of the namespace */
    cfg_of("{\"canary\":{\"steps\":[{\"weight\":10}],\"analysis\":{\"quality\":{\"texts\":{\"configMap\":"
           "\"../../kube-system/configmaps/x\"}}}}}", LLM_ERR_INVALID_ARG, "texts.configMap");
    cfg_of("{\"canary\":{\"steps\":[{\"weight\":10}],\"analysis\":{\"quality\":{\"texts\":{\"configMap\":\"a..b\"}}}}}",
           LLM_ERR_INVALID_ARG, "texts.configMap");
    canary_config q = cfg_of("{\"canary\":{\"steps\":[{\"weight\":10}],\"analysis\":{\"quality\":{\"texts\":"
                             "{\"configMap\":\"texts.v2\"}}}}}", LLM_OK, NULL);
    assert_string_equal(q.quality.config_map, "texts.v2");
    int s, k;
    canary_split(1, 30, &s, &k);
    assert_true(s == 1 && k == 1);
    canary_split(4, 50, &s, &k);
    assert_true(s == 2 && k == 2);
    canary_split(10, 10, &s, &k);
    assert_true(s == 9 && k == 1);
    canary_split(3, 100, &s, &k);
    assert_true(s == 3 && k == 3);
    canary_split(0, 0, &s, &k);
    assert_true(s == 1 && k == 1);
}

static void test_durations(void **st)
{
    (void)st;
    json_t *v;
    static const struct { const char *s; double want; } cases[] = {
        {"90", 90}, {"90s", 90}, {"2m", 120}, {"1h", 3600}, {"1m30s", 90}, {"", -1}, {"m", -1}, {"5d", -1}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        v = json_string(cases[i].s);
        assert_double_close(canary_duration(v), cases[i].want, 0);
        json_decref(v);
    }
    v = json_integer(-3);
    assert_double_close(canary_duration(v), -1, 0);
    json_decref(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config),         cmocka_unit_test(test_sample_and_quantile),
        cmocka_unit_test(test_window_and_json), cmocka_unit_test(test_analysis),
        cmocka_unit_test(test_decide_and_split), cmocka_unit_test(test_durations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
