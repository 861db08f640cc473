/* fuzz_json.c - libFuzzer target for the bounded JSON reader
 * (common/json.c) against jansson, the parser behind it: whatever jansson
 * takes within the bounds llm_json_load takes too and the scan passes; a
 * text llm_json_load refuses is refused with a named reason; and the
 * readers llm-router uses instead of a parse (member, item, string) find
 * what jansson's tree holds. Deep nesting through deep.h's mutator, on a
 * thread with the production stack. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deep.h"
#include "llm/json.h"

/* A span's value parsed equals want. */
static int same(llm_json_span s, json_t *want)
{
    json_t *got = llm_json_load(s.p, s.n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL, NULL);
    int eq = got && json_equal(got, want);
    json_decref(got);
    return eq;
}

static void readers(const char *text, size_t n, json_t *v)
{
    llm_json_span all = {text, n}, val;
    const char *key;
    json_t *x;
    json_object_foreach(v, key, x) if (!llm_json_member(all, key, &val) || !same(val, x)) abort();
    size_t pos = 0, i = 0;
    while (json_is_array(v) && llm_json_item(all, &pos, &val))
        if (!same(val, json_array_get(v, i++)))
            abort();
    if (json_is_array(v) && i != json_array_size(v))
        abort();
    char out[64];
    while (all.n && strchr(" \t\r\n", *all.p)) all.p++, all.n--;
    long k = json_is_string(v) ? llm_json_string(all, out, sizeof out) : 0;
    if (k < 0 || (json_is_string(v) && memcmp(out, json_string_value(v), (size_t)k)))
        abort();
}

static void one(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    llm_error err = {0};
    size_t end = 0;
    json_t *v = llm_json_load(text, size, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, NULL, &err);
    llm_status scan = llm_json_scan(text, size, LLM_JSON_MAX_DEPTH, &end, NULL);
    if (v && scan != LLM_OK)
        abort(); /* what loads, scans */
    if (!v && err.code != LLM_ERR_TOO_LONG && err.code != LLM_ERR_FORMAT && err.code != LLM_ERR_NOMEM &&
        err.code != LLM_ERR_QUEUE_FULL)
        abort();
    if (!v && scan == LLM_ERR_TOO_LONG && err.code != LLM_ERR_TOO_LONG)
        abort(); /* too deep is said so, never a parse attempt */
    if (v)
        readers(text, size, v);
    json_decref(v);
}

DEEP_FUZZ_TARGET(one)
