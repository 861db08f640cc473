/* test_api_keys.c - the API keys of llm-server and the gateway, against values
 * worked by hand: the keys file's settings and its errors (naming the line
 * and the setting), lookups by Authorization header, the rate bucket's
 * refill and Retry-After, a tenant's max_inflight shared by its keys
 * (and refused when two keys give different values), rpm and tpm kept
 * the same way, gateway keys, lookups by tenant. */
#include "testutil.h"

#include "api_keys.h"

static void parse_ok(const char *text, api_keys *k)
{
    llm_error err = {0};
    if (api_keys_parse(text, strlen(text), "\n", k, &err))
        fail_msg("%s", err.msg);
}

static void parse_bad(const char *text, const char *words)
{
    api_keys k;
    llm_error err = {0};
    assert_int_equal(api_keys_parse(text, strlen(text), "\n", &k, &err), LLM_ERR_INVALID_ARG);
    if (!strstr(err.msg, words))
        fail_msg("'%s': error '%s' does not say '%s'", text, err.msg, words);
    assert_null(k.k); /* nothing left allocated */
}

static void test_settings_and_lookup(void **st)
{
    (void)st;
    api_keys k;
    parse_ok("# team\nka1 tenant=A max_priority=7 rate=2.5\n\n  kb1\tmax_inflight=4  \nka2 tenant=A\n", &k);
    assert_int_equal(k.n, 3);
    assert_string_equal(k.k[0].tenant, "A");
    assert_int_equal(k.k[0].max_priority, 7);
    assert_true(k.k[0].rate == 2.5);
    assert_string_equal(k.k[1].tenant, "key-ef7a30aa80d5"); /* a key alone: its own tenant, named by its digest */
    assert_int_equal(k.k[1].max_inflight, 4);
    assert_int_equal(k.k[2].tenant_ix, 0);       /* A's counters live on its first key */
    assert_ptr_equal(api_keys_find(&k, "Bearer ka2"), &k.k[2]);
    assert_null(api_keys_find(&k, "Bearer ka"));  /* a prefix is no key */
    assert_null(api_keys_find(&k, "ka1"));        /* the scheme is needed */
    assert_null(api_keys_find(&k, NULL));
    api_keys_free(&k);
    parse_bad("k1 tenant=\n", "line 1");
    parse_bad("k1\nk2\nk1\n", "line 3: a key given twice");
    parse_bad("k1 max_priority=2000000\n", "a bad value for 'max_priority'");
    parse_bad("k1 rate=-1\n", "a bad value for 'rate'");
    parse_bad("k1 max_inflight=0\n", "a bad value for 'max_inflight'");
    parse_bad("k1 color=red\n", "line 1: word 1 after the key is no setting");
    parse_bad("k1 tenant=key-ef7a30aa80d5\n", "a bad value for 'tenant'"); /* kb1's implicit name: refused */
    llm_error e2 = {0};
    assert_int_equal(api_keys_parse("sk-one tenant=T sk-two\n", 22, "\n", &k, &e2), LLM_ERR_INVALID_ARG);
    assert_null(strstr(e2.msg, "sk-two")); /* a second key on the line is never echoed */
    assert_non_null(strstr(e2.msg, "word 2"));
    parse_bad("a tenant=T max_inflight=2\nb tenant=T\nc tenant=T max_inflight=3\n",
              "line 3: tenant 'T' has max_inflight=2 on an earlier line, not 3");
    parse_bad("a tenant=T rpm=60\nb tenant=T rpm=61\n", "line 2: tenant 'T' has rpm=60 on an earlier line, not 61");
    parse_bad("a tenant=T tpm=60\nb tenant=T tpm=6\n", "tenant 'T' has tpm=60");
    parse_bad("a rpm=0\n", "a bad value for 'rpm'");
    parse_bad("a tpm=1000000001\n", "a bad value for 'tpm'");
    parse_bad("a gateway=yes\n", "a bad value for 'gateway'");
}

/* rpm and tpm are the tenant's, kept on its first key whichever line gave
 * them; gateway is the key's own; a tenant is found by its name. */
static void test_tenant_limits(void **st)
{
    (void)st;
    api_keys k;
    parse_ok("a1 tenant=A\ngw tenant=front gateway=1\na2 tenant=A rpm=120 tpm=5000 max_inflight=3\nb1 rpm=7\n", &k);
    assert_int_equal(k.k[0].rpm, 120);
    assert_int_equal(k.k[0].tpm, 5000);
    assert_int_equal(k.k[0].max_inflight, 3);
    assert_int_equal(k.k[2].tenant_ix, 0);
    assert_true(k.k[1].gateway);
    assert_false(k.k[0].gateway);
    assert_int_equal(k.k[3].rpm, 7);
    assert_ptr_equal(api_keys_tenant(&k, "A"), &k.k[0]);
    assert_ptr_equal(api_keys_tenant(&k, "front"), &k.k[1]);
    assert_null(api_keys_tenant(&k, "a"));
    assert_null(api_keys_tenant(&k, NULL));
    assert_true(api_keys_tenant_ok("team-b", 6));
    assert_false(api_keys_tenant_ok("team b", 6));
    assert_false(api_keys_tenant_ok("", 0));
    assert_false(api_keys_tenant_ok("key-ef7a30aa80d5", 16)); /* a key's implicit name */
    api_keys_free(&k);
}

static void test_rate_bucket(void **st)
{
    (void)st;
    api_keys k;
    parse_ok("slow rate=0.5\nfast rate=4\nfree\n", &k);
    double retry = 0;
    assert_true(api_keys_admit(&k, &k.k[0], 100.0, &retry)); /* a full bucket of one */
    assert_false(api_keys_admit(&k, &k.k[0], 100.5, &retry));
    assert_true(retry > 1.49 && retry < 1.51);                 /* 0.25 of a token left to fill at 0.5/s */
    assert_true(api_keys_admit(&k, &k.k[0], 102.0, &retry));
    for (int i = 0; i < 4; i++) assert_true(api_keys_admit(&k, &k.k[1], 10.0, &retry)); /* one second's worth */
    assert_false(api_keys_admit(&k, &k.k[1], 10.0, &retry));
    assert_true(retry > 0.249 && retry < 0.251);
    assert_true(api_keys_admit(&k, &k.k[1], 10.25, &retry));
    for (int i = 0; i < 100; i++) assert_true(api_keys_admit(&k, &k.k[2], 0, &retry)); /* no rate */
    assert_true(api_keys_admit(&k, NULL, 0, &retry));
    api_keys_free(&k);
}

static void test_inflight(void **st)
{
    (void)st;
    api_keys k;
    parse_ok("a1 tenant=A\na2 tenant=A max_inflight=5\nb tenant=B\n", &k);
    assert_int_equal(api_keys_cap(&k, &k.k[0], 0), 5); /* A's cap comes from a2, shared with a1 */
    assert_int_equal(api_keys_cap(&k, &k.k[2], 7), 7);  /* B gives none: the default */
    assert_true(api_keys_take(&k, &k.k[0], 3, 0));
    assert_false(api_keys_take(&k, &k.k[1], 3, 0));
    assert_true(api_keys_take(&k, &k.k[1], 2, 0));
    assert_false(api_keys_take(&k, &k.k[0], 1, 0));
    assert_true(api_keys_take(&k, &k.k[2], 100, 0));   /* B: no cap of its own and no default */
    assert_false(api_keys_take(&k, &k.k[2], 1, 100)); /* the default applies to B */
    api_keys_give(&k, &k.k[0], 3);
    assert_true(api_keys_take(&k, &k.k[0], 3, 0));
    assert_true(api_keys_take(&k, NULL, 1000, 1)); /* anonymous: no tenant */
    api_keys_free(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_settings_and_lookup),
        cmocka_unit_test(test_tenant_limits),
        cmocka_unit_test(test_rate_bucket),
        cmocka_unit_test(test_inflight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
