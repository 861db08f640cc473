/* test_sampler.c - the sampler's filters, penalties, seeding and logprobs on
 * fixed logits, with expectations computed here in double precision, and
 * stop-sequence matching. */
#include <math.h>

#include "testutil.h"

#include "llm/sampler.h"

#define V 8
static const float logits[V] = {1.0f, 3.0f, 2.5f, -1.0f, 0.0f, 2.9f, -3.0f, 0.5f};

static llm_sampler *make(llm_sampling p)
{
    llm_sampler *s;
    llm_error err = {0};
    if (llm_sampler_new(&p, V, &s, &err))
        fail_msg("%s", err.msg);
    return s;
}

static void softmax(const float *l, double t, double *p)
{
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, l[i] / t);
    for (int i = 0; i < V; i++) sum += (p[i] = exp(l[i] / t - mx));
    for (int i = 0; i < V; i++) p[i] /= sum;
}

/* Draws n samples and returns the counts per id. */
static void histogram(llm_sampling p, int n, int *counts)
{
    llm_sampler *s = make(p);
    memset(counts, 0, sizeof(int) * V);
    for (int i = 0; i < n; i++) {
        llm_sample_result r;
        assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
        assert_true(r.id >= 0 && r.id < V);
        counts[r.id]++;
    }
    llm_sampler_free(s);
}

static void test_greedy(void **state)
{
    (void)state;
    llm_sampler *s = make(llm_sampling_default());
    llm_sample_result r;
    assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
    assert_int_equal(r.id, 1);
    llm_sampler_free(s);
}

/* Empirical frequencies within 5 standard errors of softmax(l / T). */
static void test_temperature_distribution(void **state)
{
    (void)state;
    llm_sampling p = llm_sampling_default();
    p.temperature = 0.7f;
    p.seed = 99;
    enum { N = 40000 };
    int c[V];
    double want[V];
    histogram(p, N, c);
    softmax(logits, 0.7, want);
    for (int i = 0; i < V; i++) {
        double se = sqrt(want[i] * (1 - want[i]) / N);
        if (fabs(c[i] / (double)N - want[i]) > 5 * se + 1e-4)
            fail_msg("id %d: frequency %g, expected %g", i, c[i] / (double)N, want[i]);
    }
}

static void test_filters(void **state)
{
    (void)state;
    int c[V];
    llm_sampling p = llm_sampling_default();
    p.temperature = 1.0f;
    p.top_k = 2; /* ids 1 and 5 */
    histogram(p, 3000, c);
    assert_int_equal(c[1] + c[5], 3000);
    assert_true(c[1] > 0 && c[5] > 0);
    p.top_k = 0;
    p.top_p = 0.5f; /* p(1) = 0.33, p(5) = 0.30: the nucleus is {1, 5} */
    histogram(p, 3000, c);
    assert_int_equal(c[1] + c[5], 3000);
    p.top_p = 1.0f;
    p.min_p = 0.5f; /* keep p >= 0.5 p(1): ids 1, 5, 2 (e^-0.5 = 0.61) */
    histogram(p, 3000, c);
    assert_int_equal(c[1] + c[5] + c[2], 3000);
    assert_true(c[2] > 0);
}

static void test_seed(void **state)
{
    (void)state;
    llm_sampling p = llm_sampling_default();
    p.temperature = 1.5f;
    int a[64], b[64], d[64], same = 1, diff = 0;
    for (int run = 0; run < 3; run++) {
        p.seed = run == 2 ? 8 : 7;
        llm_sampler *s = make(p);
        for (int i = 0; i < 64; i++) {
            llm_sample_result r;
            assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
            (run == 0 ? a : run == 1 ? b : d)[i] = r.id;
        }
        llm_sampler_free(s);
    }
    for (int i = 0; i < 64; i++) {
        same &= a[i] == b[i];
        diff |= a[i] != d[i];
    }
    assert_true(same);
    assert_true(diff);
}

static void test_penalties(void **state)
{
    (void)state;
    llm_sampling p = llm_sampling_default();
    llm_sample_result r;
    p.presence_penalty = 0.2f; /* 3.0 - 0.2 < 2.9 */
    llm_sampler *s = make(p);
    llm_sampler_accept(s, 1);
    assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
    assert_int_equal(r.id, 5);
    llm_sampler_free(s);
    p.presence_penalty = 0;
    p.frequency_penalty = 0.04f; /* seen twice: 3.0 - 0.08 = 2.92 still beats 2.9 */
    s = make(p);
    llm_sampler_accept(s, 1);
    llm_sampler_accept(s, 1);
    assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
    assert_int_equal(r.id, 1);
    llm_sampler_accept(s, 1); /* three times: 3.0 - 0.12 = 2.88 < 2.9 */
    assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
    assert_int_equal(r.id, 5);
    llm_sampler_free(s);
    p.frequency_penalty = 0;
    p.repetition_penalty = 1.1f; /* 3.0 / 1.1 = 2.73 < 2.9 */
    p.penalty_last_n = 2;
    s = make(p);
    llm_sampler_accept(s, 1);
    assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
    assert_int_equal(r.id, 5);
    llm_sampler_accept(s, 4);
    llm_sampler_accept(s, 4); /* id 1 left the 2-token window */
    assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
    assert_int_equal(r.id, 1);
    llm_sampler_free(s);
}

static void test_logprobs(void **state)
{
    (void)state;
    llm_sampling p = llm_sampling_default();
    p.n_logprobs = 3;
    llm_sampler *s = make(p);
    llm_sample_result r;
    assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
    double want[V];
    softmax(logits, 1.0, want);
    assert_int_equal(r.n_top, 3);
    int order[3] = {1, 5, 2};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(r.top[i].id, order[i]);
        assert_true(fabs(r.top[i].logprob - log(want[order[i]])) < 1e-5);
    }
    assert_true(fabs(r.logprob - log(want[1])) < 1e-5);
    llm_sampler_free(s);
    /* the chosen token's alone, or nothing when not asked for */
    p.n_logprobs = 0;
    p.logprobs = 1;
    s = make(p);
    assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
    assert_int_equal(r.n_top, 0);
    assert_true(fabs(r.logprob - log(want[1])) < 1e-5);
    llm_sampler_free(s);
    p.logprobs = 0;
    s = make(p);
    assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
    assert_true(r.logprob == 0 && r.n_top == 0);
    llm_sampler_free(s);
}

static void test_check(void **state)
{
    (void)state;
    llm_error err = {0};
    llm_sampling p = llm_sampling_default();
    p.top_p = 0;
    assert_int_equal(llm_sampling_check(&p, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "top_p"));
    p = llm_sampling_default();
    p.temperature = NAN;
    assert_int_equal(llm_sampling_check(&p, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "temperature"));
    p = llm_sampling_default();
    p.n_logprobs = 21;
    assert_int_equal(llm_sampling_check(&p, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "logprobs"));
}

static void test_stop(void **state)
{
    (void)state;
    const char *stops[] = {"\n\n", "END", "xyz"};
    size_t hold;
    assert_int_equal(llm_stop_find("abc END d", 9, stops, 3, &hold), 4);
    assert_int_equal(hold, 0);
    assert_int_equal(llm_stop_find("line\n\nEND", 9, stops, 3, &hold), 4); /* earliest */
    assert_int_equal(llm_stop_find("the EN", 6, stops, 3, &hold), -1);
    assert_int_equal(hold, 2); /* "EN" may become "END" */
    assert_int_equal(llm_stop_find("a\n", 2, stops, 3, &hold), -1);
    assert_int_equal(hold, 1);
    assert_int_equal(llm_stop_find("plain", 5, stops, 3, &hold), -1);
    assert_int_equal(hold, 0);
}

/* A temperature so small that logits / T overflows (1e-40 is in the
 * accepted range) with a filter that needs a finite distribution: the pick
 * is the argmax, never a token outside the array (the old code read
 * c[-1] when no candidate survived). */
static void test_tiny_temperature(void **state)
{
    (void)state;
    const float filters[][3] = {{0, 0.5f, 0}, {0, 1, 0.1f}, {3, 1, 0}, {2, 0.9f, 0.05f}, {0, 1, 0}};
    const float temps[] = {1e-40f, 1e-30f, 1e-6f, 9e-6f};
    double want[V];
    softmax(logits, 1.0, want);
    for (size_t t = 0; t < sizeof temps / sizeof *temps; t++)
        for (size_t f = 0; f < sizeof filters / sizeof *filters; f++) {
            llm_sampling p = llm_sampling_default();
            p.temperature = temps[t];
            p.top_k = (int)filters[f][0];
            p.top_p = filters[f][1];
            p.min_p = filters[f][2];
            p.logprobs = 1;
            llm_sampler *s = make(p);
            for (int i = 0; i < 20; i++) {
                llm_sample_result r;
                assert_int_equal(llm_sampler_sample(s, logits, &r, NULL), LLM_OK);
                assert_int_equal(r.id, 1);
                assert_true(fabs(r.logprob - log(want[1])) < 1e-5); /* reported at temperature 1 */
            }
            llm_sample_params dp;
            llm_sampler_device_params(s, &dp);
            assert_true(temps[t] >= LLM_SAMPLING_GREEDY_BELOW || dp.temperature == 0);
            llm_sampler_free(s);
        }
}

/* A NaN logit is an error naming the token, never a random pick; infinite
 * logits are allowed (+inf: the certain tokens) and logprobs stay finite
 * and at least the floor. */
static void test_non_finite_logits(void **state)
{
    (void)state;
    llm_sampling p = llm_sampling_default();
    p.temperature = 0.8f;
    p.top_p = 0.9f;
    p.n_logprobs = 3;
    llm_sampler *s = make(p);
    llm_sample_result r;
    llm_error err = {0};
    float l[V];
    memcpy(l, logits, sizeof l);
    l[4] = NAN;
    assert_int_equal(llm_sampler_sample(s, l, &r, &err), LLM_ERR_NUMERIC);
    assert_non_null(strstr(err.msg, "NaN logit (token id 4)"));
    memcpy(l, logits, sizeof l);
    l[6] = INFINITY;
    l[3] = -INFINITY;
    for (int i = 0; i < 10; i++) {
        assert_int_equal(llm_sampler_sample(s, l, &r, NULL), LLM_OK);
        assert_int_equal(r.id, 6);
        assert_true(r.logprob == 0);
        assert_int_equal(r.n_top, 3);
        assert_int_equal(r.top[0].id, 6);
        assert_true(r.top[1].logprob == LLM_LOGPROB_FLOOR);
    }
    for (int i = 0; i < V; i++) l[i] = 3e38f; /* finite, but l / T overflows */
    assert_int_equal(llm_sampler_sample(s, l, &r, NULL), LLM_OK);
    assert_int_equal(r.id, 0);
    assert_true(isfinite(r.logprob) && r.logprob >= LLM_LOGPROB_FLOOR);
    for (int i = 0; i < V; i++) l[i] = -INFINITY; /* nothing possible: the argmax's id, floor logprobs */
    assert_int_equal(llm_sampler_sample(s, l, &r, NULL), LLM_OK);
    assert_true(r.id == 0 && r.logprob == LLM_LOGPROB_FLOOR);
    llm_sampler_free(s);
}

/* Random settings over hostile logits (infinities, huge and denormal
 * values, ties): the pick is always in range, never a -inf token while a
 * finite one exists, within top_k of the largest logits, and logprobs are
 * never NaN nor below the floor. */
static void test_random_edges(void **state)
{
    (void)state;
    static const float vals[] = {INFINITY, -INFINITY, 3e38f, -3e38f, 1e-45f, 0.f, 1.f, 88.f, -88.f, 1e30f};
    static const float temps[] = {0, 1e-40f, 1e-20f, 1e-5f, 0.5f, 1, 2, 100};
    uint64_t seed = 5;
    for (int it = 0; it < 20000; it++) {
        float l[V];
        for (int i = 0; i < V; i++)
            l[i] = test_rng(&seed) % 2 ? vals[test_rng(&seed) % 10] : 10 * test_randf(&seed);
        llm_sampling p = llm_sampling_default();
        p.temperature = temps[test_rng(&seed) % 8];
        p.top_k = (int)(test_rng(&seed) % (V + 1));
        p.top_p = test_rng(&seed) % 2 ? 1.f : 0.01f + 0.99f * (test_randf(&seed) + 1) / 2;
        p.min_p = test_rng(&seed) % 2 ? 0.f : (test_randf(&seed) + 1) / 2;
        p.n_logprobs = (int)(test_rng(&seed) % 3);
        p.seed = test_rng(&seed);
        llm_sampler *s = make(p);
        llm_sample_result r;
        assert_int_equal(llm_sampler_sample(s, l, &r, NULL), LLM_OK);
        assert_true(r.id >= 0 && r.id < V);
        int finite_exists = 0, above = 0;
        float t = p.temperature >= LLM_SAMPLING_GREEDY_BELOW ? p.temperature : 1; /* ties as the filters see them */
        for (int i = 0; i < V; i++) {
            finite_exists |= l[i] > -INFINITY;
            above += l[i] / t > l[r.id] / t;
        }
        assert_true(!finite_exists || l[r.id] > -INFINITY);
        assert_true(p.top_k == 0 || above < p.top_k);
        assert_true(r.logprob >= LLM_LOGPROB_FLOOR && r.logprob <= 0);
        for (int k = 0; k < r.n_top; k++) assert_true(r.top[k].logprob >= LLM_LOGPROB_FLOOR && r.top[k].logprob <= 0);
        llm_sampler_free(s);
    }
}

/* Top-k keeps exactly k candidates, ties at the k-th value broken by the
 * lowest id (the device sampler's rule too): 40 logits share the value at
 * ranks 5-44 of a 1000-token vocabulary, k = 8 keeps the 4 larger ones and
 * the 4 lowest-id ties, and nothing else is ever drawn. */
static void test_top_k_ties(void **state)
{
    (void)state;
    enum { NV = 1000 };
    float l[NV];
    int allowed[NV] = {0}, seen[NV] = {0};
    uint64_t rs = 7;
    for (int i = 0; i < NV; i++) l[i] = test_randf(&rs) - 2.f; /* below the ties */
    int big[4] = {900, 3, 512, 77}, tie = 0;
    for (int j = 0; j < 4; j++) l[big[j]] = 5.f + (float)j, allowed[big[j]] = 1;
    for (int i = 0; i < NV && tie < 40; i += 17, tie++) { /* ids 0, 17, ...: none of the four above */
        l[i] = 1.f;
        if (tie < 4)
            allowed[i] = 1; /* i increases: the first four ties have the lowest ids */
    }
    llm_sampling p = llm_sampling_default();
    p.temperature = 3.f, p.top_k = 8;
    for (uint64_t seed = 1; seed <= 300; seed++) {
        p.seed = seed;
        llm_sampler *sm;
        llm_error err = {0};
        assert_int_equal(llm_sampler_new(&p, NV, &sm, &err), LLM_OK);
        for (int k = 0; k < 20; k++) {
            llm_sample_result r;
            assert_int_equal(llm_sampler_sample(sm, l, &r, NULL), LLM_OK);
            if (!allowed[r.id])
                fail_msg("seed %llu: drew id %d (logit %g), not among the top 8 by (value, lowest id)",
                         (unsigned long long)seed, r.id, l[r.id]);
            seen[r.id]++;
        }
        llm_sampler_free(sm);
    }
    for (int i = 0; i < NV; i++)
        if (allowed[i])
            assert_true(seen[i] > 0); /* all eight are drawn */
}

/* A bias shifts the distribution exactly as if added to the logit: the
 * frequencies match softmax(l + b) within 5 standard errors. */
static void test_logit_bias(void **state)
{
    (void)state;
    llm_logit_bias b[2] = {{6, 5.5f}, {1, -2.0f}};
    llm_sampling p = llm_sampling_default();
    p.temperature = 1.f, p.seed = 7, p.bias = b, p.n_bias = 2;
    float lb[V];
    memcpy(lb, logits, sizeof lb);
    lb[6] += 5.5f, lb[1] -= 2.0f;
    double want[V];
    softmax(lb, 1.0, want);
    int counts[V], n = 20000;
    histogram(p, n, counts);
    for (int i = 0; i < V; i++) {
        double se = sqrt(want[i] * (1 - want[i]) / n);
        if (fabs((double)counts[i] / n - want[i]) > 5 * se + 1e-9)
            fail_msg("id %d: %d of %d, want p=%g", i, counts[i], n, want[i]);
    }
}

/* A banned token (-100) is never picked: not when it is the argmax, not
 * when every other logit is -inf (the fallback), not at any temperature;
 * and its logprob is not among the alternatives. */
static void test_logit_bias_ban(void **state)
{
    (void)state;
    float l[V];
    for (int i = 0; i < V; i++) l[i] = -INFINITY;
    l[1] = 10.f; /* the only finite logit, and banned */
    llm_logit_bias b[2] = {{1, -100.f}, {0, -100.f}};
    float temps[3] = {0.f, 1.f, 50.f};
    for (int t = 0; t < 3; t++) {
        llm_sampling p = llm_sampling_default();
        p.temperature = temps[t], p.seed = 3, p.bias = b, p.n_bias = 2, p.n_logprobs = 5;
        llm_sampler *s = make(p);
        assert_int_equal(llm_sampler_device_ok(s), 0);
        for (int k = 0; k < 50; k++) {
            llm_sample_result r;
            assert_int_equal(llm_sampler_sample(s, k & 1 ? logits : l, &r, NULL), LLM_OK);
            assert_true(r.id != 1 && r.id != 0);
            for (int j = 0; j < r.n_top; j++) assert_true(r.top[j].id != 1 && r.top[j].id != 0);
        }
        llm_sampler_free(s);
    }
}

static void test_logit_bias_errors(void **state)
{
    (void)state;
    llm_sampler *s = NULL;
    llm_error err = {0};
    llm_logit_bias all[V], bad = {V, 1.f}, big = {0, 101.f};
    for (int i = 0; i < V; i++) all[i] = (llm_logit_bias){i, -100.f};
    llm_sampling p = llm_sampling_default();
    p.bias = all, p.n_bias = V;
    assert_int_equal(llm_sampler_new(&p, V, &s, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "every token"));
    p.bias = &bad, p.n_bias = 1;
    assert_int_equal(llm_sampler_new(&p, V, &s, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "token 8"));
    p.bias = &big;
    assert_int_equal(llm_sampling_check(&p, &err), LLM_ERR_INVALID_ARG);
    assert_null(s);
}

/* Masked sampling draws only allowed ids, with the frequencies of the
 * distribution restricted to them, and logprobs normalised over them;
 * an empty mask is an error that does not advance the generator. */
static void test_masked(void **state)
{
    (void)state;
    uint32_t allow = (1u << 0) | (1u << 3) | (1u << 7), none = 0;
    llm_sampling p = llm_sampling_default();
    p.temperature = 1.f, p.seed = 11, p.logprobs = 1, p.n_logprobs = 3;
    llm_sampler *s = make(p);
    int counts[V] = {0}, n = 20000;
    double z = exp(logits[0]) + exp(logits[3]) + exp(logits[7]);
    for (int k = 0; k < n; k++) {
        llm_sample_result r;
        assert_int_equal(llm_sampler_sample_masked(s, logits, &allow, &r, NULL), LLM_OK);
        assert_true((allow >> r.id) & 1);
        counts[r.id]++;
        assert_true(fabs(r.logprob - (logits[r.id] - log(z))) < 1e-4);
        assert_int_equal(r.n_top, 3);
        assert_int_equal(r.top[0].id, 0);
    }
    for (int i = 0; i < V; i++) {
        double want = (allow >> i) & 1 ? exp(logits[i]) / z : 0, se = sqrt(want * (1 - want) / n);
        if (fabs((double)counts[i] / n - want) > 5 * se + 1e-9)
            fail_msg("id %d: %d of %d, want p=%g", i, counts[i], n, want);
    }
    llm_error err = {0};
    llm_sample_result r;
    assert_int_equal(llm_sampler_sample_masked(s, logits, &none, &r, &err), LLM_ERR_INVALID_ARG);
    llm_sampler_free(s);
    p.temperature = 0; /* greedy within the mask, and the fallback too */
    s = make(p);
    assert_int_equal(llm_sampler_sample_masked(s, logits, &allow, &r, NULL), LLM_OK);
    assert_int_equal(r.id, 0);
    float l[V];
    for (int i = 0; i < V; i++) l[i] = i == 2 ? 1.f : -INFINITY;
    assert_int_equal(llm_sampler_sample_masked(s, l, &allow, &r, NULL), LLM_OK);
    assert_int_equal(r.id, 0);
    llm_sampler_free(s);
}

/* llm_prompt_logprob_of against a float64 log-softmax, a count of the
 * more likely tokens and a full sort (ties: lower id first), on random
 * rows with repeated values; a NaN, a bad id and a bad k are refused. */
static void test_prompt_logprob(void **state)
{
    (void)state;
    enum { NV = 1000 };
    static float v[NV];
    uint64_t s = 42;
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < NV; i++) v[i] = (float)(int)(test_randf(&s) * 40) / 4; /* many ties */
        double mx = -1e30, sum = 0;
        for (int i = 0; i < NV; i++) mx = v[i] > mx ? v[i] : mx;
        for (int i = 0; i < NV; i++) sum += exp((double)v[i] - mx);
        int32_t id = (int32_t)(test_rng(&s) % NV);
        int k = round % (LLM_MAX_LOGPROBS + 1), above = 0;
        llm_prompt_logprob got;
        llm_error err = {0};
        assert_int_equal(llm_prompt_logprob_of(v, NV, id, k, &got, &err), LLM_OK);
        for (int i = 0; i < NV; i++) above += v[i] > v[id];
        assert_int_equal(got.id, id);
        assert_int_equal(got.rank, above + 1);
        assert_true(fabs(got.logprob - ((double)v[id] - mx - log(sum))) < 1e-5);
        assert_int_equal(got.n_top, k);
        for (int t = 0; t < k; t++) { /* the t-th of the order: larger value, then lower id */
            int best = -1;
            for (int i = 0; i < NV; i++) {
                int taken = 0;
                for (int u = 0; u < t; u++) taken |= got.top[u].id == i;
                if (!taken && (best < 0 || v[i] > v[best]))
                    best = i;
            }
            assert_int_equal(got.top[t].id, best);
            assert_true(fabs(got.top[t].logprob - ((double)v[best] - mx - log(sum))) < 1e-5);
        }
    }
    llm_prompt_logprob got;
    llm_error err = {0};
    assert_int_equal(llm_prompt_logprob_of(v, NV, NV, 1, &got, &err), LLM_ERR_INVALID_ARG);
    assert_int_equal(llm_prompt_logprob_of(v, NV, 0, LLM_MAX_LOGPROBS + 1, &got, &err), LLM_ERR_INVALID_ARG);
    v[7] = NAN;
    assert_int_equal(llm_prompt_logprob_of(v, NV, 0, 1, &got, &err), LLM_ERR_NUMERIC);
    assert_non_null(strstr(err.msg, "token id 7"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy), cmocka_unit_test(test_tiny_temperature),
        cmocka_unit_test(test_non_finite_logits), cmocka_unit_test(test_random_edges), cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_filters), cmocka_unit_test(test_seed), cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_logprobs), cmocka_unit_test(test_check), cmocka_unit_test(test_stop),
        cmocka_unit_test(test_top_k_ties), cmocka_unit_test(test_logit_bias), cmocka_unit_test(test_logit_bias_ban),
        cmocka_unit_test(test_logit_bias_errors), cmocka_unit_test(test_masked), cmocka_unit_test(test_prompt_logprob),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
