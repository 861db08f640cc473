/* test_quality.c - the canary's quality estimate (quality.h) against the
 * exact KL divergence over whole distributions: random peaked
 * distributions over 4,096 tokens and canaries of them moved by noise of
 * rising size (as a coarser quantization moves logits), each revision
 * listing its 20 most likely tokens (with ranks) and a prompt token drawn
 * from the stable's distribution; the mean estimate below the mean exact
 * KL by less than 40% (the tails' share), 0 where nothing moved, rising
 * with the noise; top-1 agreement exact; entries that are not entries
 * refused. */
#include "testutil.h"

#include <jansson.h>
#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "judge.h"
#include "quality.h"

enum { V = 4096, K = 20, POSITIONS = 1000 };

/* A standard normal draw (Box-Muller over test_rng's uniforms). */
static double normal(uint64_t *s)
{
    double u = ((double)(test_rng(s) >> 11) + 0.5) / 9007199254740992.0;
    double v = (double)(test_rng(s) >> 11) / 9007199254740992.0;
    return sqrt(-2 * log(u)) * cos(2 * M_PI * v);
}

static void log_softmax(const double *x, double *out)
{
    double mx = x[0], sum = 0;
    for (int i = 1; i < V; i++) mx = x[i] > mx ? x[i] : mx;
    for (int i = 0; i < V; i++) sum += exp(x[i] - mx);
    for (int i = 0; i < V; i++) out[i] = x[i] - mx - log(sum);
}

/* What a revision lists: its K most likely (ties: lower id) and the prompt token. */
static void list_of(const double *lp, int32_t prompt, quality_pos *out)
{
    static int taken[V];
    memset(taken, 0, sizeof taken);
    out->n = 0;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int i = 0; i < V; i++)
            if (!taken[i] && (best < 0 || lp[i] > lp[best]))
                best = i;
        taken[best] = 1;
        out->t[out->n++] = (quality_tok){best, lp[best], k + 1};
    }
    if (!taken[prompt]) {
        int above = 0;
        for (int i = 0; i < V; i++) above += lp[i] > lp[prompt];
        out->t[out->n++] = (quality_tok){prompt, lp[prompt], above + 1};
    }
}

/* A token drawn from lp's distribution. */
static int32_t draw(const double *lp, uint64_t *s)
{
    double u = (double)(test_rng(s) >> 11) / 9007199254740992.0, acc = 0;
    for (int i = 0; i < V; i++)
        if ((acc += exp(lp[i])) > u)
            return i;
    return V - 1;
}

typedef struct trial {
    double exact, est, top1_exact, top1_est;
} trial;

/* POSITIONS positions: the stable's logits of scale 2.5 to 6 (peaked, as a
 * language model's), the canary's the same plus noise of size sigma. */
static trial run(double sigma, uint64_t seed)
{
    static double a[V], b[V], p[V], q[V];
    uint64_t s = seed;
    trial t = {0};
    for (int pos = 0; pos < POSITIONS; pos++) {
        double scale = 2.5 + 3.5 * (double)(test_rng(&s) % 1000) / 1000;
        for (int i = 0; i < V; i++) a[i] = scale * normal(&s), b[i] = a[i] + sigma * normal(&s);
        log_softmax(a, p);
        log_softmax(b, q);
        double kl = 0;
        int ta = 0, tb = 0;
        for (int i = 0; i < V; i++) {
            kl += exp(p[i]) * (p[i] - q[i]);
            ta = p[i] > p[ta] ? i : ta;
            tb = q[i] > q[tb] ? i : tb;
        }
        int32_t prompt = draw(p, &s);
        quality_pos lp, lq;
        list_of(p, prompt, &lp);
        list_of(q, prompt, &lq);
        t.exact += kl / POSITIONS;
        t.est += quality_kl(&lp, &lq) / POSITIONS;
        t.top1_exact += ta == tb;
        t.top1_est += quality_top1(&lp) == quality_top1(&lq);
    }
    return t;
}

static void test_estimate_against_exact(void **st)
{
    (void)st;
    const double sigmas[] = {0, 0.05, 0.15, 0.4, 1.0};
    double last = -1;
    for (int k = 0; k < 5; k++) {
        trial t = run(sigmas[k], 11 + (uint64_t)k);
        print_message("noise %.2f: mean KL exact %.5f, estimated %.5f (%+.1f%%); top-1 agreement %.0f of %d\n",
                      sigmas[k], t.exact, t.est, t.exact > 0 ? 100 * (t.est - t.exact) / t.exact : 0.0, t.top1_est,
                      POSITIONS);
        assert_true(t.top1_est == t.top1_exact); /* both lists hold their true most likely token */
        if (sigmas[k] == 0) /* nothing moved: nothing is guessed, and the tails are equal */
            assert_true(t.est < 1e-12 && t.exact < 1e-12);
        else /* an underestimate by about the tails' share (~20% of the mass here) */
            assert_true(t.est <= t.exact && t.est >= 0.6 * t.exact);
        assert_true(t.est > last);
        last = t.est;
    }
}

static void test_entries_and_sums(void **st)
{
    (void)st;
    quality_pos p;
    const char *bad[] = {"[]", "{\"x\": {\"logprob\": -1}}", "{\"-3\": {\"logprob\": -1}}", "{\"5\": {\"logprob\": 0.5}}",
                         "{\"5\": {\"logprob\": \"-1\"}}", "{\"5\": {}}", "{\"5x\": {\"logprob\": -1}}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *j = json_loads(bad[i], JSON_DECODE_ANY, NULL);
        assert_non_null(j);
        assert_int_equal(quality_pos_from_json(j, &p), -1);
        json_decref(j);
    }
    json_t *big = json_object();
    for (int i = 0; i < QUALITY_MAX_LIST + 1; i++) {
        char key[16];
        snprintf(key, sizeof key, "%d", i);
        json_object_set_new(big, key, json_pack("{s:f}", "logprob", -1.0 - i));
    }
    assert_int_equal(quality_pos_from_json(big, &p), -1);
    json_decref(big);
    /* two texts' lists: identical ones add 0 and full agreement; a length mismatch adds nothing */
    json_t *a = json_loads("[null, {\"7\": {\"logprob\": -0.1, \"rank\": 1}, \"9\": {\"logprob\": -2.5, \"rank\": 2}},"
                           " {\"3\": {\"logprob\": -0.7}}]", 0, NULL);
    json_t *b = json_loads("[null, {\"9\": {\"logprob\": -0.1}, \"7\": {\"logprob\": -2.5}}, {\"3\": {\"logprob\": -0.7}}]",
                           0, NULL);
    json_t *c = json_loads("[null, {\"9\": {\"logprob\": -0.1}}]", 0, NULL);
    assert_non_null(a);
    assert_non_null(b);
    assert_non_null(c);
    quality_sum s = {0};
    char why[256];
    assert_int_equal(quality_add(&s, a, a, why, sizeof why), 0);
    assert_int_equal(s.positions, 2);
    assert_int_equal(s.top1_same, 2);
    assert_true(s.kl < 1e-12);
    assert_int_equal(quality_add(&s, a, b, why, sizeof why), 0);
    assert_int_equal(s.positions, 4);
    assert_int_equal(s.top1_same, 3); /* 7 against 9 at the first position */
    assert_true(s.kl > 1 && s.kl_max > 1);
    quality_sum before = s;
    assert_int_equal(quality_add(&s, a, c, why, sizeof why), -1);
    assert_non_null(strstr(why, "3 and 2 positions"));
    assert_memory_equal(&s, &before, sizeof s);
    json_decref(a);
    json_decref(b);
    json_decref(c);
}

/* The judge's pure parts: a chat's renderings compared over the tokens
 * they end with alike; an answer's last n positions taken from each side. */
static void test_judge_suffix_and_answers(void **st)
{
    (void)st;
    int32_t sys[] = {2, 50, 51, 52, 60, 61, 70, 71, 72, 1}, bare[] = {2, 60, 61, 70, 71, 72, 1}, other[] = {3, 4};
    assert_int_equal(judge_common_suffix(sys, 10, bare, 7), 6);  /* the system turn dropped: the rest compared */
    assert_int_equal(judge_common_suffix(sys, 10, sys, 10), 10);
    assert_int_equal(judge_common_suffix(sys, 10, other, 2), 0);
    assert_int_equal(judge_common_suffix(sys, 0, sys, 10), 0);
    /* stable's answer has 4 positions, canary's 3: their last 2 compared (the same lists there) */
    json_t *a = json_loads("{\"choices\": [{\"prompt_logprobs\": [null, {\"1\": {\"logprob\": -3}},"
                           " {\"7\": {\"logprob\": -0.1}}, {\"8\": {\"logprob\": -0.2}}]}]}", 0, NULL);
    json_t *b = json_loads("{\"choices\": [{\"prompt_logprobs\": [null, {\"7\": {\"logprob\": -0.1}},"
                           " {\"8\": {\"logprob\": -0.2}}]}]}", 0, NULL);
    assert_non_null(a);
    assert_non_null(b);
    quality_sum s = {0};
    char why[256];
    assert_int_equal(judge_add_answers(&s, a, b, 2, why, sizeof why), 0);
    assert_int_equal(s.positions, 2);
    assert_int_equal(s.top1_same, 2);
    assert_true(s.kl < 1e-12);
    assert_int_equal(judge_add_answers(&s, a, b, 3, why, sizeof why), -1); /* the canary's first is null: no entry */
    assert_int_equal(judge_add_answers(&s, a, b, 4, why, sizeof why), -1); /* more than it has */
    assert_non_null(strstr(why, "last 4 positions"));
    assert_int_equal(s.positions, 2);
    json_decref(a);
    json_decref(b);
}

/* A job for key on pods at url (both sides), texts of one prompt. */
static judge_job job_for(const char *url, double timeout_s)
{
    judge_job job = {.stage = 1, .top = 5, .min_positions = 10, .timeout_s = timeout_s};
    snprintf(job.rev, sizeof job.rev, "abc");
    snprintf(job.token, sizeof job.token, "t");
    for (int k = 0; k < 2; k++) {
        snprintf(job.side[k].url, sizeof job.side[k].url, "%s", url);
        snprintf(job.side[k].revision, sizeof job.side[k].revision, "stable");
    }
    job.texts = json_pack("[{s:s,s:s}]", "name", "t", "prompt", "hello");
    return job;
}

/* judge_wants: a job the judge already has (queued, running, or failed
 * less than JUDGE_RETRY_S ago) is not news, so its texts are not read
 * again; another revision, stage or pod is. (The pods here do not answer:
 * the job ends a failed read, which is not retried within the test.) */
static void test_judge_wants_only_news(void **st)
{
    (void)st;
    judge *j = NULL;
    llm_error err = {0};
    assert_int_equal(judge_new(&j, &err), LLM_OK);
    judge_job job = job_for("http://127.0.0.1:1", 5), taken = job_for("http://127.0.0.1:1", 5);
    json_decref(job.texts);
    job.texts = NULL; /* (judge_wants reads no texts) */
    assert_true(judge_wants(j, "ns/a", &job)); /* nothing yet */
    assert_int_equal(judge_want(j, "ns/a", &taken, &err), LLM_OK);
    assert_null(taken.texts); /* taken */
    assert_false(judge_wants(j, "ns/a", &job));
    judge_job other = job;
    other.stage = 2;
    assert_true(judge_wants(j, "ns/a", &other));
    other = job;
    snprintf(other.rev, sizeof other.rev, "abd");
    assert_true(judge_wants(j, "ns/a", &other));
    other = job;
    snprintf(other.side[1].url, sizeof other.side[1].url, "http://127.0.0.1:2");
    assert_true(judge_wants(j, "ns/a", &other));
    assert_true(judge_wants(j, "ns/b", &job));
    judge_forget(j, "ns/a");
    assert_true(judge_wants(j, "ns/a", &job));
    judge_free(j);
}

static judge_state state_of(judge *j, const char *key)
{
    judge_result r;
    judge_read(j, key, &r);
    return r.state;
}

/* Workers: a job whose pods never answer (a socket that is listened on and
 * never accepted) holds one worker; another namespace's job runs and ends
 * meanwhile, its own namespace's next one waits. And a forgotten entry's
 * slot, reused by a new key, does not let go of the texts of the entry
 * moved out of it. */
static void test_judge_workers(void **st)
{
    (void)st;
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    assert_int_equal(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(ls, 16), 0);
    assert_int_equal(getsockname(ls, (struct sockaddr *)&a, &al), 0);
    char hang[64];
    snprintf(hang, sizeof hang, "http://127.0.0.1:%d", ntohs(a.sin_port));
    judge *j = NULL;
    llm_error err = {0};
    assert_int_equal(judge_new(&j, &err), LLM_OK);
    judge_job x1 = job_for(hang, 60), x2 = job_for(hang, 60), x3 = job_for(hang, 60), y = job_for("http://127.0.0.1:1", 60);
    json_t *texts3 = json_incref(x3.texts); /* the test's own reference to x/3's texts */
    assert_int_equal(judge_want(j, "x/1", &x1, &err), LLM_OK);
    for (int i = 0; i < 500 && state_of(j, "x/1") != JUDGE_RUNNING; i++) usleep(10000);
    assert_int_equal(state_of(j, "x/1"), JUDGE_RUNNING);
    assert_int_equal(judge_want(j, "x/2", &x2, &err), LLM_OK);
    assert_int_equal(judge_want(j, "y/1", &y, &err), LLM_OK);
    assert_int_equal(judge_want(j, "x/3", &x3, &err), LLM_OK); /* the last entry */
    /* y's pods refuse at once: its job ends while x/1 still hangs, on another worker */
    for (int i = 0; i < 500 && state_of(j, "y/1") != JUDGE_DONE; i++) usleep(10000);
    assert_int_equal(state_of(j, "y/1"), JUDGE_DONE);
    assert_int_equal(state_of(j, "x/1"), JUDGE_RUNNING);
    assert_int_equal(state_of(j, "x/2"), JUDGE_QUEUED); /* one job of a namespace at a time */
    assert_int_equal(state_of(j, "x/3"), JUDGE_QUEUED);
    /* x/2 goes (x/3, the last, moves into its slot); a new key takes the freed last slot */
    judge_forget(j, "x/2");
    judge_job z = job_for("http://127.0.0.1:1", 60);
    assert_int_equal(judge_want(j, "z/1", &z, &err), LLM_OK);
    assert_true(texts3->refcount >= 2); /* the judge still holds x/3's texts (queued, or running) */
    /* x/1 forgotten: its worker's request ends now (not at its 60 s timeout), and x/3 gets a worker */
    judge_forget(j, "x/1");
    for (int i = 0; i < 500 && state_of(j, "x/3") != JUDGE_RUNNING; i++) usleep(10000);
    assert_int_equal(state_of(j, "x/3"), JUDGE_RUNNING);
    judge_free(j); /* the hanging requests end with it */
    assert_int_equal(texts3->refcount, 1);
    json_decref(texts3);
    close(ls);
}

/* One namespace fills JUDGE_KEYS_PER_NS entries at most: the next of its
 * keys is refused, another namespace's is taken. */
static void test_judge_keys_per_namespace(void **st)
{
    (void)st;
    judge *j = NULL;
    llm_error err = {0};
    assert_int_equal(judge_new(&j, &err), LLM_OK);
    char key[64];
    for (int i = 0; i <= JUDGE_KEYS_PER_NS; i++) {
        judge_job job = job_for("http://127.0.0.1:1", 5);
        snprintf(key, sizeof key, "flood/d%d", i);
        assert_int_equal(judge_want(j, key, &job, &err), i < JUDGE_KEYS_PER_NS ? LLM_OK : LLM_ERR_NOMEM);
    }
    assert_non_null(strstr(err.msg, "of a namespace at most"));
    judge_job other = job_for("http://127.0.0.1:1", 5), bare = job_for("http://127.0.0.1:1", 5);
    assert_int_equal(judge_want(j, "calm/d0", &other, &err), LLM_OK);
    assert_int_equal(judge_want(j, "no-namespace", &bare, &err), LLM_ERR_NOMEM); /* (a key is ns/name) */
    judge_free(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_estimate_against_exact),
                                       cmocka_unit_test(test_entries_and_sums),
                                       cmocka_unit_test(test_judge_suffix_and_answers),
                                       cmocka_unit_test(test_judge_wants_only_news),
                                       cmocka_unit_test(test_judge_workers),
                                       cmocka_unit_test(test_judge_keys_per_namespace)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
