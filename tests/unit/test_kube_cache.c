/* test_kube_cache.c - the informers' store: nothing answered before the
 * first list is complete; hits are copies the caller may change; DELETED
 * drops; a relist sweeps what it did not bring back; 10,000 objects
 * (growth) found again; a complete cache's misses are "absent" as much
 * as an ours-only one's, and callers tell them apart by
 * kube_cache_is_complete. */
#include "testutil.h"

#include <jansson.h>

#include "kube_cache.h"

static json_t *obj(const char *ns, const char *name, int v)
{
    return json_pack("{s:{s:s,s:s},s:i}", "metadata", "namespace", ns, "name", name, "v", v);
}

static void event(kube_cache *c, const char *type, json_t *o)
{
    assert_int_equal(kube_cache_event(c, type, o), LLM_OK);
    json_decref(o);
}

static void test_events(void **st)
{
    (void)st;
    kube_cache *c = NULL;
    llm_error err = {0};
    json_t *got = NULL;
    assert_int_equal(kube_cache_new("deployments", 0, &c, &err), LLM_OK);
    event(c, "SYNC", obj("a", "x", 1));
    assert_int_equal(kube_cache_get(c, "a", "x", &got), KUBE_CACHE_UNKNOWN); /* not listed yet */
    assert_int_equal(kube_cache_event(c, "SYNCED", NULL), LLM_OK);
    assert_int_equal(kube_cache_get(c, "a", "x", &got), KUBE_CACHE_HIT);
    json_object_set_new(got, "v", json_integer(99)); /* a copy: the cache keeps what it saw */
    json_decref(got);
    assert_int_equal(kube_cache_get(c, "a", "x", &got), KUBE_CACHE_HIT);
    assert_int_equal(json_integer_value(json_object_get(got, "v")), 1);
    json_decref(got);
    assert_int_equal(kube_cache_get(c, "b", "x", &got), KUBE_CACHE_ABSENT);
    event(c, "MODIFIED", obj("a", "x", 2));
    assert_int_equal(kube_cache_get(c, "a", "x", &got), KUBE_CACHE_HIT);
    assert_int_equal(json_integer_value(json_object_get(got, "v")), 2);
    json_decref(got);
    event(c, "ADDED", obj("a", "y", 1));
    event(c, "DELETED", obj("a", "x", 2));
    assert_int_equal(kube_cache_get(c, "a", "x", &got), KUBE_CACHE_ABSENT);
    assert_int_equal(kube_cache_size(c), 1);
    /* a relist brings back z only: y was deleted while the watch was down */
    kube_cache_event(c, "RELIST", NULL);
    event(c, "SYNC", obj("a", "z", 1));
    kube_cache_event(c, "SYNCED", NULL);
    assert_int_equal(kube_cache_get(c, "a", "y", &got), KUBE_CACHE_ABSENT);
    assert_int_equal(kube_cache_get(c, "a", "z", &got), KUBE_CACHE_HIT);
    json_decref(got);
    assert_false(kube_cache_is_complete(c));
    kube_cache_free(c);
}

static void test_many_and_set(void **st)
{
    (void)st;
    kube_cache *c = NULL, *d = NULL;
    llm_error err = {0};
    assert_int_equal(kube_cache_new("configmaps", 1, &c, &err), LLM_OK);
    assert_int_equal(kube_cache_new("services", 0, &d, &err), LLM_OK);
    char name[32];
    for (int i = 0; i < 10000; i++) {
        snprintf(name, sizeof name, "cm-%d", i);
        event(c, "SYNC", obj(i % 2 ? "a" : "b", name, i));
    }
    kube_cache_event(c, "SYNCED", NULL);
    assert_int_equal(kube_cache_size(c), 10000);
    for (int i = 0; i < 10000; i += 997) {
        json_t *got = NULL;
        snprintf(name, sizeof name, "cm-%d", i);
        assert_int_equal(kube_cache_get(c, i % 2 ? "a" : "b", name, &got), KUBE_CACHE_HIT);
        assert_int_equal(json_integer_value(json_object_get(got, "v")), i);
        json_decref(got);
    }
    kube_cache_set set = {{c, d}, 2};
    assert_ptr_equal(kube_cache_find(&set, "services"), d);
    assert_null(kube_cache_find(&set, "pods"));
    assert_true(kube_cache_is_complete(c));
    kube_cache_free(c);
    kube_cache_free(d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events),
        cmocka_unit_test(test_many_and_set),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
