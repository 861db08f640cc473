/* test_chat_template.c - spec.chatTemplate's ConfigMap admitted
 * (chat_template.h): asked only when no Deployment mounts the ConfigMap
 * and key yet; refused when missing, without the key or mutable (the
 * message says what to do); admitted when immutable with the key. */
#include "testutil.h"

#include <jansson.h>

#include "chat_template.h"
#include "desired.h"

static json_t *llmd(const char *chat_template)
{
    char text[512];
    snprintf(text, sizeof text, "{\"metadata\": {\"name\": \"a\", \"namespace\": \"ns\"}, \"spec\": {%s}}",
             chat_template ? chat_template : "");
    json_t *d = json_loads(text, 0, NULL);
    assert_non_null(d);
    return d;
}

/* A Deployment whose pods mount ConfigMap name's key as desired.c does. */
static json_t *deployment(const char *name, const char *key)
{
    json_t *d = json_pack("{s:{s:{s:{s:[{s:s,s:{s:s,s:[{s:s,s:s}]}}]}}}}", "spec", "template", "spec", "volumes", "name",
                          DESIRED_TEMPLATE_VOLUME, "configMap", "name", name, "items", "key", key, "path", key);
    assert_non_null(d);
    return d;
}

static void test_asked_only_for_a_new_mount(void **st)
{
    (void)st;
    json_t *none = llmd(NULL), *d = llmd("\"chatTemplate\": {\"configMap\": \"t1\"}");
    json_t *same = deployment("t1", "template.jinja"), *other = deployment("t0", "template.jinja");
    json_t *other_key = deployment("t1", "other.jinja");
    json_t *deps[2] = {NULL, NULL};
    assert_false(chat_template_wanted(none, deps, 2)); /* no template: nothing to read */
    assert_true(chat_template_wanted(d, deps, 2));      /* no Deployment yet */
    deps[0] = other;
    assert_true(chat_template_wanted(d, deps, 2));      /* the stable pods mount another: a new revision */
    deps[1] = other_key;
    assert_true(chat_template_wanted(d, deps, 2));      /* another key of it is another template */
    deps[1] = same;
    assert_false(chat_template_wanted(d, deps, 2));     /* the canary has it already: admitted then */
    deps[0] = same, deps[1] = NULL;
    assert_false(chat_template_wanted(d, deps, 2));     /* at rest */
    const char *name, *key;
    assert_true(chat_template_of(d, &name, &key));
    assert_string_equal(name, "t1");
    assert_string_equal(key, "template.jinja"); /* the default */
    json_decref(none), json_decref(d), json_decref(same), json_decref(other), json_decref(other_key);
}

static void test_admitted_when_fixed(void **st)
{
    (void)st;
    char why[1024];
    json_t *mutable = json_pack("{s:{s:s}}", "data", "template.jinja", "{{ messages }}");
    json_t *fixed = json_pack("{s:b,s:{s:s}}", "immutable", 1, "data", "template.jinja", "{{ messages }}");
    json_t *keyless = json_pack("{s:b,s:{s:s}}", "immutable", 1, "data", "other", "x");
    assert_int_equal(chat_template_admit(NULL, "t1", "template.jinja", why, sizeof why), -1);
    assert_non_null(strstr(why, "ConfigMap t1 not found"));
    assert_int_equal(chat_template_admit(keyless, "t1", "template.jinja", why, sizeof why), -1);
    assert_non_null(strstr(why, "has no key template.jinja"));
    assert_int_equal(chat_template_admit(mutable, "t1", "template.jinja", why, sizeof why), -1);
    assert_non_null(strstr(why, "not immutable"));
    assert_non_null(strstr(why, "set immutable: true"));
    assert_int_equal(chat_template_admit(fixed, "t1", "template.jinja", why, sizeof why), 0);
    json_decref(mutable), json_decref(fixed), json_decref(keyless);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_asked_only_for_a_new_mount),
                                       cmocka_unit_test(test_admitted_when_fixed)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
