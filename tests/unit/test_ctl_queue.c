/* test_ctl_queue.c - the controller's work queue: a key queued once
 * however often added, the earlier due time winning; due keys in due
 * order; a key added while in flight comes back after done; failures back
 * off 0.2 s doubling to 30 s; forgotten keys leave (also from flight); the
 * key limit refuses with an error; nothing before activation; and 100,000
 * create/delete cycles of distinct names leave it empty (the queue held
 * every name ever seen before). Against a model: random operations on
 * the queue and on a plain array must agree. */
#include "testutil.h"

#include <stdatomic.h>

#include "ctl_queue.h"

static ctl_queue *new_active(size_t max)
{
    ctl_queue *q = NULL;
    llm_error err = {0};
    assert_int_equal(ctl_queue_new(max, &q, &err), LLM_OK);
    ctl_queue_activate(q, 1);
    return q;
}

static size_t known(ctl_queue *q, size_t *waiting)
{
    size_t k, w;
    ctl_queue_stats(q, &k, &w);
    if (waiting)
        *waiting = w;
    return k;
}

/* The next key, when one is waiting (0 otherwise); the tests queue only
 * keys due at once, so next does not wait. */
static int take(ctl_queue *q, char *key)
{
    static atomic_int stop;
    size_t w;
    known(q, &w);
    if (!w)
        return 0;
    atomic_store(&stop, 0);
    return ctl_queue_next(q, key, &stop, NULL);
}

/* Seconds until the soonest queued key is due: next is asked with a
 * thread that sets the stop flag after 50 ms; it returns 0 if nothing was
 * due by then. */
#include <pthread.h>
static atomic_int g_stop;
static void *stopper(void *arg)
{
    usleep(50000);
    atomic_store(&g_stop, 1);
    ctl_queue_wake(arg);
    return NULL;
}

static double due_in(ctl_queue *q)
{
    char key[CTL_KEY_MAX];
    pthread_t th;
    atomic_store(&g_stop, 0);
    assert_int_equal(pthread_create(&th, NULL, stopper, q), 0);
    int got = ctl_queue_next(q, key, &g_stop, NULL);
    pthread_join(th, NULL);
    if (got) /* it was due: put it back as it was */
        ctl_queue_done(q, key, CTL_DONE_OK), ctl_queue_add(q, key, 0, NULL);
    return got ? 0 : 1;
}

static void test_dedup_order_flight(void **st)
{
    (void)st;
    ctl_queue *q = new_active(16);
    char key[CTL_KEY_MAX];
    llm_error err = {0};
    assert_int_equal(ctl_queue_add(q, "ns/b", 0, &err), LLM_OK);
    assert_int_equal(ctl_queue_add(q, "ns/a", 0, &err), LLM_OK);
    assert_int_equal(ctl_queue_add(q, "ns/b", 0, &err), LLM_OK); /* once */
    size_t w;
    assert_int_equal(known(q, &w), 2);
    assert_int_equal(w, 2);
    assert_true(take(q, key));
    assert_string_equal(key, "ns/b"); /* due first */
    assert_int_equal(ctl_queue_add(q, "ns/b", 0, &err), LLM_OK); /* in flight: after done */
    assert_true(take(q, key));
    assert_string_equal(key, "ns/a");
    assert_int_equal(take(q, key), 0); /* b is still in flight */
    assert_true(ctl_queue_done(q, "ns/b", CTL_DONE_OK) == 0);
    assert_true(take(q, key));
    assert_string_equal(key, "ns/b");
    ctl_queue_done(q, "ns/b", CTL_DONE_OK);
    ctl_queue_done(q, "ns/a", CTL_DONE_OK);
    known(q, &w);
    assert_int_equal(w, 0);
    /* the earlier due time wins */
    assert_int_equal(ctl_queue_add(q, "ns/c", 3600, &err), LLM_OK);
    assert_int_equal(ctl_queue_add(q, "ns/c", 0, &err), LLM_OK);
    assert_true(take(q, key));
    assert_string_equal(key, "ns/c");
    ctl_queue_done(q, "ns/c", CTL_DONE_OK);
    char big[CTL_KEY_MAX + 8];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    assert_int_equal(ctl_queue_add(q, big, 0, &err), LLM_ERR_TOO_LONG);
    ctl_queue_free(q);
}

static void test_backoff_forget_limit(void **st)
{
    (void)st;
    ctl_queue *q = new_active(3);
    char key[CTL_KEY_MAX];
    llm_error err = {0};
    ctl_queue_add(q, "a/x", 0, &err);
    double want = 0.2;
    for (int i = 0; i < 12; i++) {
        assert_true(take(q, key) || (ctl_queue_forget(q, "a/x"), 0)); /* due: the back-off is asked below */
        double d = ctl_queue_done(q, "a/x", CTL_DONE_FAILED);
        assert_true(d > want * 0.999 && d < want * 1.001);
        want = want * 2 < 30 ? want * 2 : 30;
        ctl_queue_add(q, "a/x", 0, &err); /* an event: sooner than the back-off */
    }
    assert_true(take(q, key));
    ctl_queue_done(q, "a/x", CTL_DONE_FAILED);
    size_t w;
    known(q, &w);
    assert_int_equal(w, 1); /* queued, but held back by its back-off: next would wait, not hand it out */
    assert_true(due_in(q) > 0.1);
    ctl_queue_add(q, "a/x", 0, &err);
    assert_true(take(q, key));
    assert_true(ctl_queue_done(q, "a/x", CTL_DONE_OK) == 0); /* success resets it */
    assert_true(take(q, key) == 0);
    ctl_queue_add(q, "a/x", 0, &err);
    assert_true(ctl_queue_done(q, "a/x", CTL_DONE_FAILED) > 0.19); /* (done without next: fine) */
    /* forget: queued or in flight */
    ctl_queue_add(q, "a/y", 0, &err);
    ctl_queue_forget(q, "a/y");
    assert_int_equal(known(q, NULL), 1);
    assert_true(take(q, key));
    assert_string_equal(key, "a/x");
    ctl_queue_forget(q, "a/x");
    assert_int_equal(known(q, NULL), 1); /* in flight: it goes when done */
    ctl_queue_done(q, "a/x", CTL_DONE_FAILED);
    assert_int_equal(known(q, NULL), 0);
    /* gone while a new object of the name was added meanwhile (delete, then apply again): kept */
    ctl_queue_add(q, "a/z", 0, &err);
    assert_true(take(q, key));
    ctl_queue_forget(q, "a/z"); /* DELETED */
    ctl_queue_add(q, "a/z", 0, &err); /* ADDED */
    ctl_queue_done(q, "a/z", CTL_DONE_GONE); /* the reconcile saw 404 */
    assert_true(take(q, key));
    assert_string_equal(key, "a/z");
    ctl_queue_done(q, "a/z", CTL_DONE_GONE); /* and really gone now */
    assert_int_equal(known(q, NULL), 0);
    /* the limit refuses, naming the key */
    ctl_queue_add(q, "n/1", 0, &err);
    ctl_queue_add(q, "n/2", 0, &err);
    ctl_queue_add(q, "n/3", 0, &err);
    assert_int_equal(ctl_queue_add(q, "n/4", 0, &err), LLM_ERR_QUEUE_FULL);
    assert_non_null(strstr(err.msg, "n/4"));
    ctl_queue_forget(q, "n/2");
    assert_int_equal(ctl_queue_add(q, "n/4", 0, &err), LLM_OK); /* room again */
    ctl_queue_free(q);
}

static void test_inactive_and_fingerprint(void **st)
{
    (void)st;
    ctl_queue *q = NULL;
    llm_error err = {0};
    char key[CTL_KEY_MAX];
    assert_int_equal(ctl_queue_new(8, &q, &err), LLM_OK);
    atomic_int stop = 1;
    ctl_queue_add(q, "s/a", 0, &err);
    assert_int_equal(ctl_queue_next(q, key, &stop, NULL), 0); /* not leading: keys wait */
    int skipped;
    assert_int_equal(ctl_queue_add_changed(q, "s/a", 42, &skipped, &err), LLM_OK);
    assert_false(skipped);
    assert_int_equal(ctl_queue_add_changed(q, "s/a", 42, &skipped, &err), LLM_OK);
    assert_true(skipped);
    ctl_queue_activate(q, 1);
    assert_true(take(q, key));
    ctl_queue_done(q, key, CTL_DONE_OK);
    assert_int_equal(ctl_queue_add_changed(q, "s/a", 42, &skipped, &err), LLM_OK);
    assert_true(skipped); /* same object: not queued */
    assert_false(take(q, key));
    assert_int_equal(ctl_queue_add_changed(q, "s/a", 43, &skipped, &err), LLM_OK);
    assert_false(skipped);
    ctl_queue_forget(q, "s/a");
    assert_int_equal(ctl_queue_add_changed(q, "s/a", 43, &skipped, &err), LLM_OK);
    assert_false(skipped); /* forgotten with its key: a new object of the name is looked at */
    ctl_queue_free(q);
}

/* 100,000 names created and deleted (informer events, some reconciled in
 * between), with random operations checked against a model array. */
static void test_churn_against_model(void **st)
{
    (void)st;
    enum { N = 100000, LIVE = 512 };
    ctl_queue *q = new_active(LIVE);
    llm_error err = {0};
    char key[CTL_KEY_MAX], name[64];
    uint64_t rng = 7;
    static char model[LIVE][64];
    int n_model = 0;
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof name, "ns-%d/llmd-%d", i % 97, i);
        assert_int_equal(ctl_queue_add(q, name, 0, &err), LLM_OK);
        if (n_model < LIVE)
            snprintf(model[n_model++], 64, "%s", name);
        else
            fail_msg("model full");
        if (test_rng(&rng) % 3 == 0 && take(q, key)) { /* the worker gets one, reconciles it, it is gone */
            ctl_queue_done(q, key, CTL_DONE_OK);
            ctl_queue_forget(q, key);
            for (int j = 0; j < n_model; j++)
                if (!strcmp(model[j], key)) {
                    memcpy(model[j], model[--n_model], 64);
                    break;
                }
        }
        while (n_model > (int)(test_rng(&rng) % 64)) { /* deleted */
            int j = (int)(test_rng(&rng) % (uint64_t)n_model);
            ctl_queue_forget(q, model[j]);
            memcpy(model[j], model[--n_model], 64);
        }
        assert_int_equal(known(q, NULL), (size_t)n_model);
    }
    for (int j = 0; j < n_model; j++) ctl_queue_forget(q, model[j]);
    size_t w;
    assert_int_equal(known(q, &w), 0);
    assert_int_equal(w, 0);
    ctl_queue_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dedup_order_flight),
        cmocka_unit_test(test_backoff_forget_limit),
        cmocka_unit_test(test_inactive_and_fingerprint),
        cmocka_unit_test(test_churn_against_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
