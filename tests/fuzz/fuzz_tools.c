/* fuzz_tools.c - libFuzzer target for reading tool calls back out of a
 * model's answer (server/llm_tools.c): the answer is text a tenant's
 * prompt can steer, so every format's parser meets arbitrary bytes. The
 * first byte picks the format and tool_choice; the rest is the answer.
 * Checked: calls come back as a non-empty array of calls to the request's
 * tools with object arguments as JSON text, or none; streaming never
 * releases more than it was given, nor less than it released before.
 * Answers are nested deep by deep.h's mutator (the model's output is a
 * tenant's input too) and read on a thread with the production stack. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deep.h"
#include "llm/tools.h"

static json_t *g_body;

static void check_calls(json_t *calls)
{
    size_t i;
    json_t *c;
    if (calls && (!json_is_array(calls) || json_array_size(calls) == 0))
        abort();
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        json_t *args = json_loads(json_string_value(json_object_get(fn, "arguments")), JSON_ALLOW_NUL, NULL);
        if (!name || (strcmp(name, "get_weather") && strcmp(name, "add")) || !json_is_object(args))
            abort();
        json_decref(args);
    }
}

static void one(const uint8_t *data, size_t size)
{
    if (size < 1)
        return;
    if (!g_body)
        g_body = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
                            "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": "
                            "{\"type\": \"integer\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": \"add\"}}]}",
                            0, NULL);
    llm_tools t;
    llm_error e = {0};
    if (!g_body || llm_tools_parse(g_body, (llm_tool_format)(data[0] % 7), &t, &e))
        abort();
    t.choice = data[0] & 0x80 ? LLM_TOOL_REQUIRED : LLM_TOOL_AUTO;
    const char *text = (const char *)data + 1;
    size_t n = size - 1, went = 0;
    json_t *calls = NULL;
    char *content = NULL;
    if (llm_tools_extract(&t, data[0] & 0x40 ? "<tool_call>" : NULL, text, n, &calls, &content) == 0)
        check_calls(calls);
    for (size_t k = 0; k <= n; k += 1 + k / 4) { /* a stream growing by pieces */
        size_t r = llm_tools_releasable(&t, text, k, went);
        if (r > k || r < went)
            abort();
        went = r;
    }
    json_decref(calls);
    free(content);
}

DEEP_FUZZ_TARGET(one)
