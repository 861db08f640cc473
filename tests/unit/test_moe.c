/* test_moe.c - mixture-of-experts routing against a float64 reference
 * written from the rule (softmax over every expert, the k most probable,
 * renormalised), and the plan's grouping: every (row, expert) pair once,
 * rows ascending within each group, each row's lowest expert in that
 * expert's "first" part. */
#include "testutil.h"

#include <math.h>

#include "llm/moe.h"

/* The reference: row t's experts (descending probability, ties to the
 * lower id) and weights, in double. */
static void ref_route(const float *x, int ne, int k, double scale, int *sel, double *w)
{
    double p[512], mx = x[0], sum = 0, s = 0;
    for (int e = 1; e < ne; e++) mx = fmax(mx, x[e]);
    for (int e = 0; e < ne; e++) sum += p[e] = exp((double)x[e] - mx);
    for (int e = 0; e < ne; e++) p[e] /= sum;
    int used[512] = {0};
    for (int j = 0; j < k; j++) {
        int best = -1;
        for (int e = 0; e < ne; e++)
            if (!used[e] && (best < 0 || p[e] > p[best]))
                best = e;
        used[best] = 1;
        sel[j] = best;
        s += w[j] = p[best];
    }
    for (int j = 0; j < k; j++) w[j] = w[j] / fmax(s, 6.103515625e-5) * scale;
}

/* Row t's (expert, weight) pairs as the plan has them. */
static int plan_pairs(const llm_moe_plan *p, int t, int *sel, float *w)
{
    int n = 0;
    for (int e = 0; e < p->n_expert; e++)
        for (int i = p->off[e]; i < p->off[e + 1]; i++)
            if (p->rows[i] == t) {
                sel[n] = e;
                w[n++] = p->weight[i];
            }
    return n;
}

static void check_groups(const llm_moe_plan *p, int n_rows)
{
    assert_int_equal(p->off[0], 0);
    assert_int_equal(p->off[p->n_expert], n_rows * p->n_used);
    for (int e = 0; e < p->n_expert; e++) {
        int o = p->off[e], nf = p->n_first[e];
        assert_true(p->off[e + 1] >= o && nf <= p->off[e + 1] - o);
        for (int i = o; i < p->off[e + 1]; i++) {
            int first = i < o + nf, t = p->rows[i];
            assert_true(t >= 0 && t < n_rows);
            if (i > o && i != o + nf)
                assert_true(p->rows[i - 1] < t); /* ascending within each part */
            int sel[64];
            float w[64];
            int n = plan_pairs(p, t, sel, w), lo = sel[0];
            for (int j = 1; j < n; j++) lo = sel[j] < lo ? sel[j] : lo;
            assert_int_equal(first, lo == e);
        }
    }
}

static void route_case(int ne, int k, int n_rows, float spread, float scale, uint64_t seed)
{
    llm_moe_plan p;
    llm_error err = {0};
    assert_int_equal(llm_moe_plan_alloc(&p, ne, k, n_rows, &err), LLM_OK);
    float *x = malloc(sizeof(float) * (size_t)n_rows * ne);
    assert_non_null(x);
    for (int i = 0; i < n_rows * ne; i++)
        x[i] = spread * (float)((double)(test_rng(&seed) >> 11) / 9007199254740992.0 - 0.5);
    llm_moe_route(&p, x, n_rows, scale);
    check_groups(&p, n_rows);
    double worst = 0;
    for (int t = 0; t < n_rows; t++) {
        int rs[64], ps[64];
        double rw[64];
        float pw[64];
        ref_route(x + (size_t)t * ne, ne, k, scale, rs, rw);
        assert_int_equal(plan_pairs(&p, t, ps, pw), k);
        for (int j = 0; j < k; j++) { /* the same set; each expert's weight within float rounding */
            int at = -1;
            for (int i = 0; i < k; i++) at = ps[i] == rs[j] ? i : at;
            assert_true(at >= 0);
            worst = fmax(worst, fabs(pw[at] - rw[j]) / rw[j]);
        }
    }
    print_message("%d of %d experts, %d rows: weights within %.1e of float64\n", k, ne, n_rows, worst);
    assert_true(worst < 1e-5);
    free(x);
    llm_moe_plan_free(&p);
}

static void test_route_vs_float64(void **st)
{
    (void)st;
    route_case(8, 2, 37, 4.0f, 1.0f, 1);
    route_case(128, 8, 64, 8.0f, 1.0f, 2);   /* Qwen3-30B-A3B's counts */
    route_case(64, 6, 5, 2.0f, 2.5f, 3);     /* a scale */
    route_case(16, 16, 9, 1.0f, 1.0f, 4);    /* every expert */
    route_case(4, 1, 1, 50.0f, 1.0f, 5);     /* one expert, peaked logits */
}

/* Ties go to the lower id; a NaN row still gets k distinct experts, with
 * NaN weights (its output is NaN, as the row's would be anyway). */
static void test_ties_and_nan(void **st)
{
    (void)st;
    llm_moe_plan p;
    llm_error err = {0};
    assert_int_equal(llm_moe_plan_alloc(&p, 4, 2, 2, &err), LLM_OK);
    float x[8] = {1, 3, 3, 3, 0, NAN, 0, 0};
    llm_moe_route(&p, x, 2, 1.0f);
    int sel[4];
    float w[4];
    assert_int_equal(plan_pairs(&p, 0, sel, w), 2);
    assert_int_equal(sel[0], 1);
    assert_int_equal(sel[1], 2);
    assert_true(fabsf(w[0] - 0.5f) < 1e-6f && fabsf(w[1] - 0.5f) < 1e-6f);
    assert_int_equal(plan_pairs(&p, 1, sel, w), 2);
    assert_true(sel[0] != sel[1] && isnan(w[0]) && isnan(w[1]));
    check_groups(&p, 2);
    llm_moe_plan_free(&p);
}

static void test_plan_errors(void **st)
{
    (void)st;
    llm_moe_plan p;
    llm_error err = {0};
    assert_int_equal(llm_moe_plan_alloc(&p, 4, 5, 8, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "5 of 4 experts"));
    assert_int_equal(llm_moe_plan_alloc(&p, 0, 1, 8, &err), LLM_ERR_INVALID_ARG);
    llm_moe_plan_free(&p); /* a failed alloc leaves nothing to free; freeing is still safe */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_route_vs_float64),
        cmocka_unit_test(test_ties_and_nan),
        cmocka_unit_test(test_plan_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
