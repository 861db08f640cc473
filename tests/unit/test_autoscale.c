/* test_autoscale.c - the built-in autoscaler's decisions, against the HPA
 * algorithm worked by hand: proportional desired count, tolerance, unready
 * pods, stabilisation windows both ways, the step limit, the bounds, state
 * carried through status (a new leader does not flap), and the Prometheus
 * text reader. */
#include "testutil.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "autoscale.h"
#include "prom_text.h"

static autoscale_config cfg(void)
{
    json_t *spec = json_pack("{s:{s:b,s:i,s:i,s:s,s:f,s:i,s:i,s:i}}", "autoscaling", "enabled", 1, "minReplicas", 1,
                             "maxReplicas", 10, "metric", "queueDepth", "target", 4.0, "scaleUpStabilizationSeconds", 0,
                             "scaleDownStabilizationSeconds", 60, "maxScaleUpStep", 4);
    autoscale_config c;
    llm_error err = {0};
    assert_int_equal(autoscale_config_from_spec(spec, &c, &err), LLM_OK);
    json_decref(spec);
    return c;
}

/* The labels llm-router reads off a pod's page (the adapters it has): a
 * key's value where the sample is above 0; escaped, open or overlong
 * values are skipped, and no more than max are taken. */
static char g_labels[512];

static void label_seen(void *ctx, const char *v, size_t n)
{
    (void)ctx;
    size_t at = strlen(g_labels);
    snprintf(g_labels + at, sizeof g_labels - at, "%.*s;", (int)n, v);
}

static void test_proportional_and_tolerance(void **st)
{
    (void)st;
    autoscale_config c = cfg();
    autoscale_decision d;
    json_t *s = autoscale_decide(&c, 2, 12.0, 2, NULL, 1000, &d); /* 2 pods x 12 waiting / 4 = 6 */
    assert_int_equal(d.desired, 6);
    assert_true(d.changed);
    assert_non_null(strstr(d.reason, "queueDepth 12.00 per pod (2 ready) over target 4.00"));
    assert_int_equal(json_integer_value(json_object_get(s, "desiredReplicas")), 6);
    assert_int_equal(json_array_size(json_object_get(s, "history")), 1);
    json_decref(s);
    s = autoscale_decide(&c, 3, 4.3, 3, NULL, 1000, &d); /* within 10% */
    assert_int_equal(d.desired, 3);
    assert_false(d.changed);
    assert_int_equal(json_array_size(json_object_get(s, "history")), 0);
    json_decref(s);
}

static void test_unready_pods_and_no_reading(void **st)
{
    (void)st;
    autoscale_config c = cfg();
    autoscale_decision d;
    /* 4 replicas, 1 ready with 8 waiting: counting the loading pods as idle
     * it is 2 per pod (no scale-up); per ready pod it is 8 (no scale-down) */
    json_t *s = autoscale_decide(&c, 4, 8.0, 1, NULL, 1000, &d);
    assert_int_equal(d.desired, 4);
    assert_non_null(strstr(d.reason, "near target"));
    json_decref(s);
    s = autoscale_decide(&c, 4, 0, 0, NULL, 1000, &d);
    assert_int_equal(d.desired, 4);
    assert_non_null(strstr(d.reason, "no ready pod"));
    json_decref(s);
}

static void test_step_and_bounds(void **st)
{
    (void)st;
    autoscale_config c = cfg();
    autoscale_decision d;
    json_t *s = autoscale_decide(&c, 1, 100.0, 1, NULL, 1000, &d); /* wants 25: +4 at most, then max 10 later */
    assert_int_equal(d.desired, 5);
    json_decref(s);
    s = autoscale_decide(&c, 9, 100.0, 9, NULL, 1000, &d);
    assert_int_equal(d.desired, 10);
    json_decref(s);
    c.min = 3;
    s = autoscale_decide(&c, 1, 0.0, 1, NULL, 1000, &d); /* below min: up to min at once */
    assert_int_equal(d.desired, 3);
    json_decref(s);
}

/* Scale-down waits for the highest recommendation of the last 60 s; the
 * state passes through status, as across a leader change. */
static void test_down_window_survives_restart(void **st)
{
    (void)st;
    autoscale_config c = cfg();
    autoscale_decision d;
    json_t *s = autoscale_decide(&c, 6, 4.0, 6, NULL, 1000, &d); /* steady at 6 */
    assert_int_equal(d.desired, 6);
    char *stored = json_dumps(s, 0); /* written to status, read back by the next leader */
    json_decref(s);
    json_t *prev = json_loads(stored, 0, NULL);
    free(stored);
    s = autoscale_decide(&c, 6, 0.0, 6, prev, 1030, &d); /* load gone: wants 1, but 6 was recommended 30 s ago */
    json_decref(prev);
    assert_int_equal(d.desired, 6);
    json_t *s2 = autoscale_decide(&c, 6, 0.0, 6, s, 1061, &d); /* the 6 left the window; the 1 from t=1030 remains */
    assert_int_equal(d.desired, 1);
    assert_true(d.changed);
    json_t *h = json_array_get(json_object_get(s2, "history"), 0);
    assert_int_equal(json_integer_value(json_object_get(h, "from")), 6);
    assert_int_equal(json_integer_value(json_object_get(h, "to")), 1);
    assert_non_null(json_object_get(s2, "lastScaleTime"));
    json_decref(s);
    json_decref(s2);
}

static void test_up_window(void **st)
{
    (void)st;
    autoscale_config c = cfg();
    c.up_window_s = 30;
    autoscale_decision d;
    json_t *s = autoscale_decide(&c, 2, 4.0, 2, NULL, 1000, &d);
    json_t *s2 = autoscale_decide(&c, 2, 16.0, 2, s, 1010, &d); /* a spike: lowest of the window is 2 */
    assert_int_equal(d.desired, 2);
    json_t *s3 = autoscale_decide(&c, 2, 16.0, 2, s2, 1031, &d); /* sustained past the window */
    assert_int_equal(d.desired, 6);                      /* 8 wanted, +4 at most */
    json_decref(s);
    json_decref(s2);
    json_decref(s3);
}

static void test_history_is_bounded(void **st)
{
    (void)st;
    autoscale_config c = cfg();
    c.down_window_s = 0;
    autoscale_decision d;
    json_t *s = NULL;
    int cur = 1;
    for (int i = 0; i < 12; i++) {
        json_t *n = autoscale_decide(&c, cur, i % 2 ? 0.0 : 40.0, cur, s, 1000 + i, &d);
        json_decref(s);
        s = n;
        cur = d.desired;
    }
    assert_int_equal(json_array_size(json_object_get(s, "history")), 5);
    json_decref(s);
}

/* Reconciles come as often as events do; the window keeps one
 * recommendation per second (the latest), so status stays bounded. */
static void test_one_recommendation_per_second(void **st)
{
    (void)st;
    autoscale_config c = cfg();
    autoscale_decision d;
    json_t *s = NULL;
    const double at[] = {1000.1, 1000.5, 1000.9, 1001.2};
    const double load[] = {40.0, 4.0, 8.0, 4.0};
    for (int i = 0; i < 4; i++) {
        json_t *n = autoscale_decide(&c, 2, load[i], 2, s, at[i], &d);
        json_decref(s);
        s = n;
        json_t *recs = json_object_get(s, "recommendations");
        assert_int_equal(json_array_size(recs), i < 3 ? 1 : 2);
    }
    json_t *first = json_array_get(json_object_get(s, "recommendations"), 0);
    assert_int_equal((int)json_number_value(json_array_get(first, 0)), 1000);
    assert_int_equal((int)json_number_value(json_array_get(first, 1)), 4); /* 2 pods x 8 / 4: the last of t=1000 */
    json_decref(s);
}

static void test_config_errors_and_prom(void **st)
{
    (void)st;
    llm_error err = {0};
    autoscale_config c;
    json_t *spec = json_pack("{s:{s:b,s:i,s:i}}", "autoscaling", "enabled", 1, "minReplicas", 5, "maxReplicas", 2);
    assert_int_equal(autoscale_config_from_spec(spec, &c, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "minReplicas 5 and maxReplicas 2"));
    json_decref(spec);
    spec = json_pack("{s:{s:b,s:s}}", "autoscaling", "enabled", 1, "metric", "cpu");
    assert_int_equal(autoscale_config_from_spec(spec, &c, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "cpu needs mode hpa"));
    json_decref(spec);
    /* an HPA has no tolerance of its own (the cluster's): another value is refused, not dropped */
    spec = json_pack("{s:{s:b,s:s,s:f}}", "autoscaling", "enabled", 1, "mode", "hpa", "tolerance", 0.3);
    assert_int_equal(autoscale_config_from_spec(spec, &c, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "horizontal-pod-autoscaler-tolerance"));
    json_object_set_new(json_object_get(spec, "autoscaling"), "tolerance", json_real(0.1));
    assert_int_equal(autoscale_config_from_spec(spec, &c, &err), LLM_OK);
    json_decref(spec);
    int found;
    const char *text = "# HELP llm_requests_waiting x\n# TYPE llm_requests_waiting gauge\nllm_requests_waiting 3\n"
                       "llm_requests_waiting_other 100\nvllm:num_requests_waiting{model=\"m\"} 7\n"
                       "x{a=\"1\"} 2\nx{a=\"2\"} 5.5\n";
    assert_true(prom_text_value(text, "llm_requests_waiting", &found) == 3.0 && found);
    assert_true(prom_text_value(text, "x", &found) == 7.5 && found);
    assert_true(prom_text_value(text, "vllm:num_requests_waiting", &found) == 7.0 && found);
    assert_true(prom_text_value(text, "absent", &found) == 0.0 && !found);
    /* a label set left open: nothing read, and nothing taken off the next line */
    assert_true(prom_text_value("x{a=\"1\"\n9\nx 2\n", "x", &found) == 2.0 && found);
    assert_true(prom_text_value("x{a=\"1\"}\n9\n", "x", &found) == 0.0 && !found);
    /* a 4 MiB page of such lines (a pod's answer) is read in one pass: it took minutes when the search
     * for '}' ran down the page from every line */
    size_t lines = (4u << 20) / 8;
    char *page = malloc(lines * 8 + 1);
    assert_non_null(page);
    for (size_t i = 0; i < lines; i++) memcpy(page + i * 8, "x{a=\"1\n", 8);
    page[lines * 8] = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_true(prom_text_value(page, "x", &found) == 0.0 && !found);
    assert_int_equal(prom_text_labels(page, "x", "a", 64, label_seen, NULL), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    assert_true((double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9 < 2.0);
    free(page);
}

static void test_prom_labels(void **st)
{
    (void)st;
    const char *text = "# TYPE llm_lora_loaded gauge\n"
                       "llm_lora_loaded{adapter=\"sql\",model_name=\"m\"} 1\n"
                       "llm_lora_loaded{model_name=\"m, x\", adapter=\"chat-v2\"} 1\n"
                       "llm_lora_loaded{adapter=\"gone\"} 0\n"
                       "llm_lora_loaded{adapter=\"a\\\"b\"} 1\n"
                       "llm_lora_loaded{adapter=\"open 1\n"
                       "llm_lora_loaded_other{adapter=\"no\"} 1\n"
                       "llm_lora_loaded{adapterx=\"no\"} 1\n";
    g_labels[0] = 0;
    assert_int_equal(prom_text_labels(text, "llm_lora_loaded", "adapter", 64, label_seen, NULL), 2);
    assert_string_equal(g_labels, "sql;chat-v2;");
    g_labels[0] = 0;
    assert_int_equal(prom_text_labels(text, "llm_lora_loaded", "adapter", 1, label_seen, NULL), 1);
    assert_string_equal(g_labels, "sql;");
    /* one route's series of a gateway's page: exactly that route (not a prefix, not a label named like it) */
    const char *gw = "llm_router_route_held_requests{route=\"story\"} 3\n"
                     "llm_router_route_held_requests{route=\"story-b\"} 5\n"
                     "llm_router_route_held_requests{route=\"stor\"} 7\n"
                     "llm_router_route_held_requests{xroute=\"story\"} 11\n"
                     "llm_router_route_held_requests{backend=\"a\",route=\"story\"} 2\n"
                     "llm_router_route_held_requests 13\n";
    int found = 0;
    assert_true(prom_text_value_where(gw, "llm_router_route_held_requests", "route", "story", &found) == 5 && found);
    assert_true(prom_text_value_where(gw, "llm_router_route_held_requests", "route", "other", &found) == 0 && !found);
    assert_true(prom_text_value(gw, "llm_router_route_held_requests", &found) == 41 && found);
}

/* Scale to zero: minReplicas 0 behind a holding router. */
static void test_scale_to_zero(void **st)
{
    (void)st;
    llm_error err = {0};
    autoscale_config c;
    json_t *spec = json_pack("{s:{s:b,s:i,s:i}}", "autoscaling", "enabled", 1, "minReplicas", 0, "maxReplicas", 3);
    assert_int_equal(autoscale_config_from_spec(spec, &c, &err), LLM_ERR_INVALID_ARG); /* no router to hold requests */
    assert_non_null(strstr(err.msg, "minReplicas 0 needs mode builtin and spec.router"));
    json_decref(spec);
    spec = json_pack("{s:{s:b,s:i,s:i,s:i},s:{s:b,s:i}}", "autoscaling", "enabled", 1, "minReplicas", 0, "maxReplicas",
                     3, "scaleToZeroAfterSeconds", 60, "router", "enabled", 1, "holdSeconds", 30);
    assert_int_equal(autoscale_config_from_spec(spec, &c, &err), LLM_OK);
    json_decref(spec);
    assert_int_equal(c.zero_after_s, 60);
    autoscale_config running = c;
    running.min = 1;
    autoscale_decision d;
    /* t=1000, one idle pod, the routers have seen 5 requests: the idle clock starts */
    autoscale_activity idle = {1, 0, 5, 0, 0, 0};
    json_t *s1 = autoscale_decide(&running, 1, 0, 1, NULL, 1000, &d);
    autoscale_zero(&c, 1, &idle, NULL, s1, 1000, &d);
    assert_int_equal(d.desired, 1);
    assert_true(json_number_value(json_object_get(s1, "lastActivityTime")) == 1000);
    /* t=1030: a request came (6): activity at 1030 */
    autoscale_activity busy = {1, 0, 6, 0, 0, 0};
    json_t *s2 = autoscale_decide(&running, 1, 0, 1, s1, 1030, &d);
    autoscale_zero(&c, 1, &busy, s1, s2, 1030, &d);
    assert_int_equal(d.desired, 1);
    /* t=1089: 59 s idle: stays; t=1090: 60 s: sleeps, recorded once */
    autoscale_activity quiet = {1, 0, 6, 0, 0, 0};
    json_t *s3 = autoscale_decide(&running, 1, 0, 1, s2, 1089, &d);
    autoscale_zero(&c, 1, &quiet, s2, s3, 1089, &d);
    assert_int_equal(d.desired, 1);
    json_t *s4 = autoscale_decide(&running, 1, 0, 1, s3, 1090, &d);
    /* ... unless one of its own routers was asked and did not answer: it may be the one taking requests */
    autoscale_activity partial = {.routers = 1, .requests = 6, .asked = 2, .own = 1};
    autoscale_zero(&c, 1, &partial, s3, s4, 1090, &d);
    assert_int_equal(d.desired, 1);
    json_decref(s4);
    s4 = autoscale_decide(&running, 1, 0, 1, s3, 1090, &d);
    autoscale_zero(&c, 1, &quiet, s3, s4, 1090, &d);
    assert_int_equal(d.desired, 0);
    assert_true(d.changed);
    assert_non_null(strstr(d.reason, "no request for 60 s"));
    assert_int_equal(json_integer_value(json_object_get(s4, "desiredReplicas")), 0);
    json_t *h = json_object_get(s4, "history");
    assert_int_equal(json_integer_value(json_object_get(json_array_get(h, json_array_size(h) - 1), "to")), 0);
    /* the next turn reads a Deployment older than that scale-down (1 pod):
     * zero again, but no second decision or Event (CI saw 1 -> 0 twice) */
    json_t *s4b = autoscale_decide(&running, 1, 0, 1, s4, 1091, &d);
    autoscale_zero(&c, 1, &quiet, s4, s4b, 1091, &d);
    assert_int_equal(d.desired, 0);
    assert_false(d.changed);
    assert_int_equal(json_array_size(json_object_get(s4b, "history")), json_array_size(h));
    assert_string_equal(json_string_value(json_object_get(s4b, "lastScaleTime")),
                        json_string_value(json_object_get(s4, "lastScaleTime")));
    json_decref(s4b);
    /* a minute later pods run under that record of zero (a wake whose record
     * was lost) and go idle: a real sleep, recorded */
    json_t *s4c = autoscale_decide(&running, 1, 0, 1, s4, 1150, &d);
    autoscale_zero(&c, 1, &quiet, s4, s4c, 1150, &d);
    assert_int_equal(d.desired, 0);
    assert_true(d.changed);
    assert_int_equal(json_array_size(json_object_get(s4c, "history")), json_array_size(h) + 1);
    json_decref(s4c);
    /* at zero, no router answering or nothing held: stays asleep, no decision recorded */
    autoscale_activity none = {0, 0, 0, 0, 0, 0};
    json_t *s5 = autoscale_decide(&running, 0, 0, 0, s4, 1100, &d);
    autoscale_zero(&c, 0, &none, s4, s5, 1100, &d);
    assert_int_equal(d.desired, 0);
    assert_false(d.changed);
    assert_int_equal(json_array_size(json_object_get(s5, "history")), json_array_size(h));
    /* three requests held: wakes to one pod */
    autoscale_activity held = {1, 3, 9, 0, 0, 0};
    json_t *s6 = autoscale_decide(&running, 0, 0, 0, s5, 1110, &d);
    autoscale_zero(&c, 0, &held, s5, s6, 1110, &d);
    assert_int_equal(d.desired, 1);
    assert_true(d.changed);
    assert_non_null(strstr(d.reason, "3 requests held by the router: waking"));
    /* in flight counts as activity even with an unchanged count */
    autoscale_activity streaming = {1, 0, 9, 2, 0, 0};
    json_t *s7 = autoscale_decide(&running, 1, 0, 1, s6, 1500, &d);
    autoscale_zero(&c, 1, &streaming, s6, s7, 1500, &d);
    assert_int_equal(d.desired, 1);
    assert_true(json_number_value(json_object_get(s7, "lastActivityTime")) == 1500);
    json_t *all[] = {s1, s2, s3, s4, s5, s6, s7};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) json_decref(all[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_proportional_and_tolerance), cmocka_unit_test(test_unready_pods_and_no_reading),
        cmocka_unit_test(test_step_and_bounds),            cmocka_unit_test(test_down_window_survives_restart),
        cmocka_unit_test(test_up_window),                  cmocka_unit_test(test_history_is_bounded),
        cmocka_unit_test(test_one_recommendation_per_second),
        cmocka_unit_test(test_config_errors_and_prom),     cmocka_unit_test(test_scale_to_zero),
        cmocka_unit_test(test_prom_labels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
