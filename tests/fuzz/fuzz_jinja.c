/* fuzz_jinja.c - libFuzzer target for the Jinja interpreter: the input is
 * a template (up to a NUL byte) and, after it, the text of one message.
 * Every template must compile or be refused with a message, and every
 * render must give text whose tenant spans are ordered and in bounds, or
 * an error with a message; never a crash, leak, hang or UB (ASan +
 * UBSan), within a small memory and step budget. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "srv_chat.h"

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\","
    " \"function\": {\"name\": \"f\", \"arguments\": {\"x\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"{\\\"ok\\\": 1}\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"x\": {\"type\": \"array\"}}}}}]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *nul = memchr(data, 0, size);
    size_t tlen = nul ? (size_t)(nul - (const char *)data) : size;
    llm_jinja *t = NULL;
    llm_error err = {0};
    if (llm_jinja_compile((const char *)data, tlen, &t, &err)) {
        if (!err.msg[0] || (err.code != LLM_ERR_TEMPLATE && err.code != LLM_ERR_TOO_LONG))
            abort();
        return 0;
    }
    json_t *ctx = json_loads(CONTEXT, 0, NULL);
    const char *msg = nul ? nul + 1 : "";
    size_t mlen = nul ? size - tlen - 1 : 0;
    json_t *ms = json_object_get(ctx, "messages");
    json_object_set_new(json_array_get(ms, 1), "content", json_stringn_nocheck(msg, mlen));
    llm_jinja_limits lim = {.max_bytes = 8u << 20, .max_steps = 200000, .now = 1764720000};
    llm_jctx *c = llm_jctx_new(&lim);
    llm_jv *vars = c ? srv_chat_vars(c, ms, json_object_get(ctx, "tools"), 1, "<s>", "</s>", NULL, &err) : NULL;
    size_t len = 0;
    llm_span *sp = NULL;
    int n = 0;
    char *text = vars ? llm_jinja_render(t, c, vars, &len, &sp, &n, &err) : NULL;
    if (!text && !err.msg[0])
        abort();
    for (int i = 0; text && i < n; i++)
        if (sp[i].start >= sp[i].end || sp[i].end > len || (i && sp[i].start <= sp[i - 1].end - 1))
            abort();
    free(text);
    free(sp);
    llm_jctx_free(c);
    json_decref(ctx);
    llm_jinja_free(t);
    return 0;
}
