/* test_kube_apply.c - kube_apply_covers, the judge of "the child already says
 * what we want": defaults and other managers' fields are allowed; a field
 * of ours missing or changed is not; keyed lists match by the API server's
 * merge keys (a volumeMount by mountPath); atomic lists whole; quantities
 * under resources by amount (as the API server rewrites them) and nowhere
 * else. And kube_meta_name_ok, the form of a name that may go into a path. */
#include "testutil.h"

#include <jansson.h>

#include "kube_apply.h"
#include "kube_meta.h"

static int covers(const char *want, const char *cur)
{
    json_t *w = json_loads(want, 0, NULL), *c = json_loads(cur, 0, NULL);
    assert_non_null(w);
    assert_non_null(c);
    int r = kube_apply_covers(w, c);
    json_decref(w);
    json_decref(c);
    return r;
}

static void test_fields_and_lists(void **st)
{
    (void)st;
    assert_true(covers("{\"a\":1,\"b\":{\"c\":\"x\"}}", "{\"a\":1,\"b\":{\"c\":\"x\",\"d\":2},\"e\":3}"));
    assert_false(covers("{\"a\":1,\"b\":{\"c\":\"x\"}}", "{\"a\":1,\"b\":{\"d\":2}}"));
    assert_false(covers("{\"image\":\"a:1\"}", "{\"image\":\"evil:1\"}"));
    /* named items: by name, others' items and defaulted fields allowed */
    assert_true(covers("{\"env\":[{\"name\":\"A\",\"value\":\"1\"}]}",
                       "{\"env\":[{\"name\":\"B\",\"value\":\"2\"},{\"name\":\"A\",\"value\":\"1\"}]}"));
    assert_false(covers("{\"env\":[{\"name\":\"A\",\"value\":\"1\"}]}", "{\"env\":[{\"name\":\"A\",\"value\":\"2\"}]}"));
    /* one volume mounted twice: matched by mountPath, not by its (shared) name */
    assert_true(covers("{\"m\":[{\"name\":\"v\",\"mountPath\":\"/b\",\"readOnly\":true}]}",
                       "{\"m\":[{\"name\":\"v\",\"mountPath\":\"/a\"},{\"name\":\"v\",\"mountPath\":\"/b\",\"readOnly\":true}]}"));
    /* atomic lists (args): whole, in order */
    assert_true(covers("{\"args\":[\"--x\",\"1\"]}", "{\"args\":[\"--x\",\"1\"]}"));
    assert_false(covers("{\"args\":[\"--x\",\"1\"]}", "{\"args\":[\"--x\",\"1\",\"--evil\"]}"));
    assert_false(covers("{\"args\":[\"--x\",\"1\"]}", "{\"args\":[\"1\",\"--x\"]}"));
}

static void test_quantities(void **st)
{
    (void)st;
    assert_true(covers("{\"resources\":{\"limits\":{\"memory\":\"1024Mi\"}}}", "{\"resources\":{\"limits\":{\"memory\":\"1Gi\"}}}"));
    assert_true(covers("{\"resources\":{\"requests\":{\"cpu\":1}}}", "{\"resources\":{\"requests\":{\"cpu\":\"1\"}}}"));
    assert_true(covers("{\"resources\":{\"requests\":{\"cpu\":\"0.5\"}}}", "{\"resources\":{\"requests\":{\"cpu\":\"500m\"}}}"));
    assert_false(covers("{\"resources\":{\"requests\":{\"cpu\":\"1\"}}}", "{\"resources\":{\"requests\":{\"cpu\":\"2\"}}}"));
    /* outside resources a string is a string: "1k" is not "1000" */
    assert_false(covers("{\"env\":[{\"name\":\"N\",\"value\":\"1k\"}]}", "{\"env\":[{\"name\":\"N\",\"value\":\"1000\"}]}"));
}

/* kube_meta_name_ok: what goes into a request path as an object's name. */
static void test_names(void **st)
{
    (void)st;
    static const char *const good[] = {"a", "tmpl-1", "a.b-c", "0x"};
    static const char *const bad[] = {"", "A", "-a", "a-", "a..b", "../x", "a/b", "a b", ".a", "a.", NULL};
    for (size_t i = 0; i < sizeof good / sizeof *good; i++) assert_true(kube_meta_name_ok(good[i]));
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) assert_false(kube_meta_name_ok(bad[i]));
    char long_name[256];
    memset(long_name, 'a', 254), long_name[254] = 0;
    assert_false(kube_meta_name_ok(long_name)); /* 254 */
    long_name[253] = 0;
    assert_true(kube_meta_name_ok(long_name)); /* 253 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fields_and_lists),
        cmocka_unit_test(test_quantities),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
