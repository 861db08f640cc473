/* test_tools.c - tool calls read back from model text, per format:
 * what each template family writes (with and without the control-token
 * markers the engine's text leaves out) gives the calls, arguments as a
 * JSON string, and the rest as content; text that is not a valid call
 * (unknown tool, bad JSON, arguments not an object, trailing text where
 * the format allows none) is all content; streaming holds back exactly
 * the text that may start a call; formats are told from real templates. */
#include "testutil.h"

#include "srv.h"
#include "srv_chat.h"
#include "llm/tools.h"

static json_t *g_body;

static llm_tools tools_for(llm_tool_format f, const char *choice)
{
    llm_error e = {0};
    llm_tools t;
    json_t *body = json_deep_copy(g_body);
    if (choice)
        json_object_set_new(body, "tool_choice", json_string(choice));
    if (llm_tools_parse(body, f, &t, &e))
        fail_msg("tools: %s", e.msg);
    t.tools = json_incref(t.tools);
    json_decref(body);
    return t;
}

/* The calls in text as "name(args);..." and the content, or "none". */
static void expect(llm_tool_format f, const char *text, const char *want_calls, const char *want_content)
{
    llm_tools t = tools_for(f, NULL);
    char *content = NULL, got[512] = "";
    json_t *calls = NULL;
    assert_int_equal(llm_tools_extract(&t, NULL, text, strlen(text), &calls, &content), 0);
    size_t i;
    json_t *c;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function");
        const char *id = json_string_value(json_object_get(c, "id"));
        assert_non_null(id);
        if (f == LLM_TOOLS_MISTRAL || f == LLM_TOOLS_MISTRAL_ARGS)
            assert_int_equal(strlen(id), 9);
        else
            assert_true(!strncmp(id, "call_", 5) && strlen(id) == 29);
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s(%s);", json_string_value(json_object_get(fn, "name")),
                 json_string_value(json_object_get(fn, "arguments")));
    }
    if (!calls)
        snprintf(got, sizeof got, "none");
    if (strcmp(got, want_calls))
        fail_msg("%s on %s: calls %s, expected %s", llm_tools_format_name(f), text, got, want_calls);
    if ((content || want_content) && (!content || !want_content || strcmp(content, want_content)))
        fail_msg("%s on %s: content '%s', expected '%s'", llm_tools_format_name(f), text, content ? content : "(null)",
                 want_content ? want_content : "(null)");
    free(content);
    json_decref(calls);
    json_decref(t.tools);
}

static void test_hermes(void **state)
{
    (void)state;
    expect(LLM_TOOLS_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
           "get_weather({\"city\":\"Paris\"});", NULL);
    expect(LLM_TOOLS_HERMES, "Let me check.\n<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>\n"
                             "<tool_call>{\"name\":\"add\",\"arguments\":\"{\\\"a\\\": 3, \\\"b\\\": 4}\"}</tool_call>",
           "add({\"a\":1,\"b\":2});add({\"a\":3,\"b\":4});", "Let me check.\n\n");
    /* unclosed at the end of the answer still counts */
    expect(LLM_TOOLS_HERMES, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}", "add({\"a\":1,\"b\":2});",
           NULL);
    expect(LLM_TOOLS_HERMES, "just text", "none", "just text");
    expect(LLM_TOOLS_HERMES, "<tool_call>{\"name\":\"rm_rf\",\"arguments\":{}}</tool_call>", "none",
           "<tool_call>{\"name\":\"rm_rf\",\"arguments\":{}}</tool_call>");
    expect(LLM_TOOLS_HERMES, "<tool_call>{\"name\":\"add\",\"arguments\":[1]}</tool_call>", "none",
           "<tool_call>{\"name\":\"add\",\"arguments\":[1]}</tool_call>");
    expect(LLM_TOOLS_HERMES, "<tool_call>{\"name\":\"add\",", "none", "<tool_call>{\"name\":\"add\",");
}

static void test_llama3_mistral_generic(void **state)
{
    (void)state;
    expect(LLM_TOOLS_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}",
           "get_weather({\"city\":\"Rome\"});", NULL);
    expect(LLM_TOOLS_LLAMA3, "<|python_tag|>{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}",
           "add({\"a\":1,\"b\":2});", NULL);
    expect(LLM_TOOLS_LLAMA3, "{\"name\": \"add\", \"parameters\": {\"a\": 1}} and more", "none",
           "{\"name\": \"add\", \"parameters\": {\"a\": 1}} and more");
    expect(LLM_TOOLS_LLAMA3, "The answer is 4.", "none", "The answer is 4.");
    expect(LLM_TOOLS_MISTRAL, "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}, "
                              "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}, \"id\": \"abcdefghi\"}]",
           "add({\"a\":1,\"b\":2});get_weather({\"city\":\"Oslo\"});", NULL);
    expect(LLM_TOOLS_MISTRAL, "[{\"name\": \"add\", \"arguments\": {\"a\": 5, \"b\": 6}}]", "add({\"a\":5,\"b\":6});", NULL);
    expect(LLM_TOOLS_MISTRAL, "[1, 2, 3] are numbers", "none", "[1, 2, 3] are numbers");
    expect(LLM_TOOLS_MISTRAL_ARGS, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Lima\"}", "get_weather({\"city\":\"Lima\"});",
           NULL);
    expect(LLM_TOOLS_MISTRAL_ARGS, "add{\"a\": 1, \"b\": 2}add{\"a\": 3, \"b\": 4}", "add({\"a\":1,\"b\":2});add({\"a\":3,\"b\":4});",
           NULL);
    expect(LLM_TOOLS_MISTRAL_ARGS, "[TOOL_CALLS]add[ARGS] {\"a\": 1}", "add({\"a\":1});", NULL); /* a forced call's */
    expect(LLM_TOOLS_MISTRAL_ARGS, "Hello there", "none", "Hello there");
    expect(LLM_TOOLS_MISTRAL_ARGS, "add {\"a\": 1}", "none", "add {\"a\": 1}"); /* streamed as content: not a call */
    expect(LLM_TOOLS_GENERIC, " {\"tool_calls\": [{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}]}\n",
           "add({\"a\":1,\"b\":2});", NULL);
    expect(LLM_TOOLS_GENERIC, "{\"answer\": 4}", "none", "{\"answer\": 4}");
    expect(LLM_TOOLS_GENERIC, "{\"tool_calls\": []}", "none", "{\"tool_calls\": []}");
}

static void test_xml(void **state)
{
    (void)state;
    expect(LLM_TOOLS_XML, "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
                          "</tool_call>",
           "get_weather({\"city\":\"Paris\"});", NULL);
    /* add has no schema: values are read as literals, else kept as text */
    expect(LLM_TOOLS_XML, "Let me add.\n\n<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n<parameter=b>\n"
                          "True\n</parameter>\n<parameter=c>\n[1, {\"x\": null}]\n</parameter>\n<parameter=d>\ntwo words\n"
                          "</parameter>\n</function>\n</tool_call>",
           "add({\"a\":1,\"b\":true,\"c\":[1,{\"x\":null}],\"d\":\"two words\"});", "Let me add.\n\n");
    /* a string parameter stays text, lines and all; Seed-OSS's wrapper, values without newlines */
    expect(LLM_TOOLS_XML, "<seed:tool_call>\n<function=get_weather>\n<parameter=city>5\nSt </parameter>\n</function>\n"
                          "</seed:tool_call><function=add>\n<parameter=a>2</parameter>\n</function>",
           "get_weather({\"city\":\"5\\nSt \"});add({\"a\":2});", NULL);
    /* cut short (max_tokens): not a call, as the other formats refuse a call whose JSON is not closed */
    expect(LLM_TOOLS_XML, "<tool_call>\n<function=add>\n<parameter=a>\n1", "none", "<tool_call>\n<function=add>\n<parameter=a>\n1");
    expect(LLM_TOOLS_XML, "<function=add>\n<parameter=a>\n1\n</parameter>\n", "none",
           "<function=add>\n<parameter=a>\n1\n</parameter>\n");
    expect(LLM_TOOLS_XML, "<function=rm_rf>\n</function>", "none", "<function=rm_rf>\n</function>");
    expect(LLM_TOOLS_XML, "<function=add>\nhello\n</function>", "none", "<function=add>\nhello\n</function>");
    expect(LLM_TOOLS_XML, "<function=add>\n<parameter=a>1</parameter><parameter=a>2</parameter></function>", "none",
           "<function=add>\n<parameter=a>1</parameter><parameter=a>2</parameter></function>");
    expect(LLM_TOOLS_XML, "plain answer", "none", "plain answer");
}

static void test_gemma4(void **state)
{
    (void)state;
    expect(LLM_TOOLS_GEMMA4, "<|tool_call>call:get_weather{city:<|\"|>Paris, \"FR\" {x}<|\"|>}<tool_call|>",
           "get_weather({\"city\":\"Paris, \\\"FR\\\" {x}\"});", NULL);
    expect(LLM_TOOLS_GEMMA4, "Checking.<|tool_call>call:add{a:1,b:2.5}<tool_call|><|tool_response>",
           "add({\"a\":1,\"b\":2.5});", "Checking.");
    expect(LLM_TOOLS_GEMMA4, "<|tool_call>call:add{a:{x:[1,<|\"|>y]<|\"|>,true],<|\"|>k k<|\"|>:None},b:false}<tool_call|>"
                             "<|tool_call>call:add{}<tool_call|>",
           "add({\"a\":{\"x\":[1,\"y]\",true],\"k k\":null},\"b\":false});add({});", NULL);
    static const char *const bad[] = {
        "<|tool_call>call:add{a:1", "<|tool_call>call:add{a:hello}<tool_call|>", "<|tool_call>call:nope{}<tool_call|>",
        "<|tool_call>call:add{a:1,a:2}<tool_call|>", "<|tool_call>call:add{a:<|\"|>open}<tool_call|>",
        "<|tool_call>call:add[1]<tool_call|>", "<|tool_call>add{a:1}<tool_call|>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) expect(LLM_TOOLS_GEMMA4, bad[i], "none", bad[i]);
    char deep[400] = "<|tool_call>call:add{a:";
    for (int i = 0; i < 80; i++) strcat(deep, "[");
    /* nesting past the bound (LLM_JSON_MAX_DEPTH): no answer can carry it, the request ends with an error */
    llm_tools t = tools_for(LLM_TOOLS_GEMMA4, NULL);
    json_t *calls = NULL;
    char *content = NULL;
    assert_int_equal(llm_tools_extract(&t, NULL, deep, strlen(deep), &calls, &content), LLM_ERR_TOO_LONG);
    assert_null(calls);
    assert_null(content);
    json_decref(t.tools);
}

static void test_streaming_holds_back_calls(void **state)
{
    (void)state;
    llm_tools h = tools_for(LLM_TOOLS_HERMES, NULL), l = tools_for(LLM_TOOLS_LLAMA3, NULL);
    llm_tools req = tools_for(LLM_TOOLS_HERMES, "required"), none = tools_for(LLM_TOOLS_HERMES, "none");
    const char *t1 = "Sure, <tool_c";
    assert_int_equal(llm_tools_releasable(&h, t1, strlen(t1), 0), 6); /* "<tool_c" may be the tag */
    const char *t2 = "Sure, <tool_cab> is not it";
    assert_int_equal(llm_tools_releasable(&h, t2, strlen(t2), 0), strlen(t2));
    const char *t3 = "Sure.<tool_call>{\"na";
    assert_int_equal(llm_tools_releasable(&h, t3, strlen(t3), 0), 5);
    assert_int_equal(llm_tools_releasable(&l, "  {\"name", 8, 0), 0);
    assert_int_equal(llm_tools_releasable(&l, "The", 3, 0), 3);
    assert_int_equal(llm_tools_releasable(&req, "The", 3, 0), 0); /* a forced answer is all call */
    assert_int_equal(llm_tools_releasable(&none, "<tool_call>", 11, 0), 11);
    /* past what went out: a later tag is found, earlier text is not looked at again */
    const char *t4 = "Hi there. More<tool_call>{";
    assert_int_equal(llm_tools_releasable(&h, t4, strlen(t4), 9), 14);
    assert_int_equal(llm_tools_releasable(&l, "The {\"name\"", 12, 3), 12); /* content went out: no call now */
    llm_tools ma = tools_for(LLM_TOOLS_MISTRAL_ARGS, NULL);
    assert_int_equal(llm_tools_releasable(&ma, "get_weather", 11, 0), 0);
    assert_int_equal(llm_tools_releasable(&ma, "get_weather{", 12, 0), 0);
    assert_int_equal(llm_tools_releasable(&ma, "get_weather is", 14, 0), 14); /* and then parsed as content */
    llm_tools x = tools_for(LLM_TOOLS_XML, NULL), g = tools_for(LLM_TOOLS_GEMMA4, NULL);
    assert_int_equal(llm_tools_releasable(&x, "Sure <seed:tool", 15, 0), 5);
    assert_int_equal(llm_tools_releasable(&x, "Sure <func", 10, 0), 5);
    assert_int_equal(llm_tools_releasable(&x, "Sure <function=add>", 19, 0), 5);
    assert_int_equal(llm_tools_releasable(&x, "a <b> c", 7, 0), 7);
    assert_int_equal(llm_tools_releasable(&g, "Hi <|tool", 9, 0), 3);
    assert_int_equal(llm_tools_releasable(&g, "Hi <|tool_call>call:", 20, 0), 3);
    assert_int_equal(llm_tools_releasable(&g, "Hi <tool_call>", 14, 0), 14);
    assert_false(llm_tools_shows_markers(&x));
    assert_true(llm_tools_shows_markers(&g));
    llm_tools gr = tools_for(LLM_TOOLS_GEMMA4, "required");
    char *pre = NULL, *gram = NULL;
    llm_error e = {0};
    assert_int_equal(llm_tools_forced(&gr, &pre, &gram, &e), LLM_OK);
    assert_false(llm_tools_shows_markers(&gr)); /* a forced call takes the generic shape: plain text */
    free(pre);
    free(gram);
    json_decref(gr.tools);
    json_decref(x.tools);
    json_decref(g.tools);
    json_decref(ma.tools);
    json_decref(h.tools);
    json_decref(l.tools);
    json_decref(req.tools);
    json_decref(none.tools);
}

static void test_formats_of_real_templates(void **state)
{
    (void)state;
    static const struct { const char *file; llm_tool_format f; } cases[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", LLM_TOOLS_HERMES},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", LLM_TOOLS_HERMES},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", LLM_TOOLS_LLAMA3},
        {"meta-llama-Llama-3.2-3B-Instruct.jinja", LLM_TOOLS_LLAMA3},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", LLM_TOOLS_MISTRAL},
        {"Mistral-Small-3.2-24B-Instruct-2506.jinja", LLM_TOOLS_MISTRAL_ARGS},
        {"google-gemma-2-2b-it.jinja", LLM_TOOLS_GENERIC},
        {"Qwen3-Coder.jinja", LLM_TOOLS_XML},
        {"Qwen3.5-4B.jinja", LLM_TOOLS_XML},
        {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", LLM_TOOLS_XML},
        {"ByteDance-Seed-OSS.jinja", LLM_TOOLS_XML},
        {"StepFun3.5-Flash.jinja", LLM_TOOLS_XML},
        {"google-gemma-4-31B-it.jinja", LLM_TOOLS_GEMMA4},
        {"Qwen-Qwen3-0.6B.jinja", LLM_TOOLS_HERMES},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char rel[256], buf[512];
        snprintf(rel, sizeof rel, "testdata/chat-templates/%s", cases[i].file);
        SKIP_UNLESS_SHARED(path, rel, buf);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        static char text[1 << 17];
        size_t n = fread(text, 1, sizeof text, f);
        fclose(f);
        if (llm_tools_format(text, n) != cases[i].f)
            fail_msg("%s: format %s, expected %s", cases[i].file, llm_tools_format_name(llm_tools_format(text, n)),
                     llm_tools_format_name(cases[i].f));
    }
    assert_int_equal(llm_tools_format(NULL, 0), LLM_TOOLS_GENERIC);
}

static void test_bad_requests(void **state)
{
    (void)state;
    static const char *bad[] = {
        "{\"tools\": {}}",
        "{\"tools\": [{\"type\": \"code\", \"function\": {\"name\": \"a\"}}]}",
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]}",
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": 3}}]}",
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}, {\"type\": \"function\", \"function\": {\"name\": \"a\"}}]}",
        "{\"tool_choice\": \"required\"}",
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}], \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"b\"}}}",
        "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\"}}], \"tool_choice\": \"sometimes\"}",
        "{\"parallel_tool_calls\": \"yes\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *body = json_loads(bad[i], 0, NULL);
        llm_tools t;
        llm_error e = {0};
        assert_non_null(body);
        if (!llm_tools_parse(body, LLM_TOOLS_HERMES, &t, &e))
            fail_msg("accepted %s", bad[i]);
        assert_int_equal(e.code, LLM_ERR_INVALID_ARG);
        assert_true(e.field[0] && e.msg[0]);
        json_decref(body);
    }
    /* a named call's parameters with a keyword the schema compiler does not build: a 400 naming it */
    json_t *body = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": "
                              "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"string\", \"contentMediaType\": "
                              "\"text/html\"}}}}}], \"tool_choice\": \"required\"}", 0, NULL);
    llm_tools t;
    llm_error e = {0};
    char *pre = NULL, *g = NULL;
    assert_int_equal(llm_tools_parse(body, LLM_TOOLS_HERMES, &t, &e), LLM_OK);
    assert_int_equal(llm_tools_forced(&t, &pre, &g, &e), LLM_ERR_INVALID_ARG);
    assert_string_equal(e.field, "tools");
    assert_non_null(strstr(e.msg, "contentMediaType"));
    json_decref(body);
    /* a forced call's grammar allows one space per gap and no line break:
     * a small model would spend max_tokens on indentation otherwise */
    body = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a\", \"parameters\": "
                      "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"string\"}}}}}], "
                      "\"tool_choice\": \"required\"}", 0, NULL);
    assert_int_equal(llm_tools_parse(body, LLM_TOOLS_HERMES, &t, &e), 0);
    assert_int_equal(llm_tools_forced(&t, &pre, &g, &e), 0);
    const char *ws = strstr(g, "\nws ");
    assert_non_null(ws);
    assert_string_equal(ws, "\nws ::= \" \"?\n");
    free(pre);
    free(g);
    json_decref(body);
}

/* Assistant tool_calls reach a template with their arguments as objects
 * (a JSON text of one parsed), and a tool's result as it was sent; in the
 * generic format (a template without tools) the calls become the JSON
 * text the model is told to write and the result a user turn. */
static void test_history_reaches_the_template(void **state)
{
    (void)state;
    static const char tmpl[] =
        "{% for m in messages %}[{{ m.role }}]{% for c in m.tool_calls | default([]) %}"
        "{{ c.function.name }}:{{ c.function.arguments is mapping }}:{{ c.function.arguments.city }};"
        "{% endfor %}{{ m.content }}{% endfor %}{{ tools | length }}";
    static char none[] = "";
    srv_chat chat = {.bos = none, .eos = none, .tools = LLM_TOOLS_HERMES}, fam = {.bos = none, .eos = none};
    llm_error err = {0};
    assert_int_equal(llm_jinja_compile(tmpl, strlen(tmpl), &chat.tmpl, &err), LLM_OK);
    json_t *body = json_loads(
        "{\"messages\": [{\"role\": \"user\", \"content\": \"weather?\"}, {\"role\": \"assistant\", \"content\": null, "
        "\"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
        "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"call_1\", "
        "\"content\": \"21 C\"}]}", 0, NULL);
    assert_non_null(body);
    json_object_set(body, "tools", json_object_get(g_body, "tools"));
    llm_tools t;
    srv_err e = {0};
    llm_error le = {0};
    assert_int_equal(llm_tools_parse(body, LLM_TOOLS_HERMES, &t, &le), LLM_OK);
    llm_span *sp = NULL;
    int n = 0;
    char *text = srv_chat_render(&chat, body, 1000, &t, &sp, &n, &e);
    if (!text)
        fail_msg("render: %s", e.msg);
    assert_string_equal(text, "[user]weather?[assistant]get_weather:True:Paris;[tool]21 C2");
    free(text);
    free(sp);
    fam.family = LLM_CHAT_CHATML; /* the built-in renderer: generic */
    text = srv_chat_render(&fam, body, 1000, &t, &sp, &n, &e);
    if (!text)
        fail_msg("render: %s", e.msg);
    assert_non_null(strstr(text, "You can call these tools"));
    assert_non_null(strstr(text, "<|im_start|>assistant\n{\"tool_calls\":[{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}]}"));
    assert_non_null(strstr(text, "<|im_start|>user\nTool result for call_1: 21 C"));
    free(text);
    free(sp);
    /* a call without a name is the client's mistake: a 400 */
    json_t *asst = json_array_get(json_object_get(body, "messages"), 1);
    json_object_del(json_object_get(json_array_get(json_object_get(asst, "tool_calls"), 0), "function"), "name");
    assert_null(srv_chat_render(&chat, body, 1000, &t, &sp, &n, &e));
    assert_int_equal(e.status, 400);
    assert_non_null(strstr(e.msg, "tool_calls[0]"));
    json_decref(body);
    llm_jinja_free(chat.tmpl);
}

/* ---- calls as real templates write them, read back ---------------------------------- */

/* Template file (../shared) as text; NULL when it is absent. */
static char *template_text(const char *file)
{
    char rel[256], buf[512];
    snprintf(rel, sizeof rel, "testdata/chat-templates/%s", file);
    const char *path = shared_path(rel, buf, sizeof buf);
    FILE *f = path ? fopen(path, "rb") : NULL;
    if (!f)
        return NULL;
    static char text[1 << 17];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    return text;
}

/* The conversation rendered with the template: the user's turn alone with
 * the generation prompt (agp 1), or with the assistant's calls after it. */
static char *render_turns(srv_chat *chat, const llm_tools *t, json_t *calls, int agp)
{
    json_t *body = json_pack("{s:[{s:s,s:s}],s:O,s:b}", "messages", "role", "user", "content", "Weather?", "tools",
                             json_object_get(g_body, "tools"), "add_generation_prompt", agp);
    if (calls)
        json_array_append_new(json_object_get(body, "messages"),
                              json_pack("{s:s,s:s,s:O}", "role", "assistant", "content", "", "tool_calls", calls));
    llm_span *sp = NULL;
    int n = 0;
    srv_err e = {0};
    char *text = srv_chat_render(chat, body, 1000, t, &sp, &n, &e);
    if (!text)
        fail_msg("render: %s", e.msg);
    free(sp);
    json_decref(body);
    return text;
}

/* What the model would have written for the calls: the text the
 * assistant's turn adds past the generation prompt, up to its end marker
 * (the token that stops generation, not part of the answer). */
static char *answer_of(const char *prompt, const char *whole)
{
    static const char *const ends[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "</s>", "<turn|>", "<|endoftext|>"};
    size_t k = 0;
    while (prompt[k] && prompt[k] == whole[k]) k++;
    while (prompt[k] && k > 0 && whole[k - 1] != '\n') /* the generation prompt holds more (Gemma 4's empty thought) */
        k--;
    const char *a = whole + k, *cut = a + strlen(a);
    for (size_t i = 0; i < sizeof ends / sizeof *ends; i++) {
        const char *at = strstr(a, ends[i]);
        cut = at && at < cut ? at : cut;
    }
    return strndup(a, (size_t)(cut - a));
}

/* For each template that writes calls its own way: an assistant turn with
 * calls (strings holding the formats' own delimiters, numbers, booleans,
 * nested values where the template writes them as JSON) rendered by the
 * template itself (our Jinja, held to jinja2 by test_jinja_oracle), then
 * read back by the format's parser: the same names and arguments. */
static void test_calls_round_trip(void **state)
{
    (void)state;
    static const struct { const char *file; llm_tool_format f; int nested; } cases[] = {
        {"Qwen-Qwen2.5-7B-Instruct.jinja", LLM_TOOLS_HERMES, 1},
        {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", LLM_TOOLS_HERMES, 1},
        {"meta-llama-Llama-3.1-8B-Instruct.jinja", LLM_TOOLS_LLAMA3, 1},
        {"mistralai-Mistral-Nemo-Instruct-2407.jinja", LLM_TOOLS_MISTRAL, 1},
        {"Mistral-Small-3.2-24B-Instruct-2506.jinja", LLM_TOOLS_MISTRAL_ARGS, 1},
        {"Qwen3-Coder.jinja", LLM_TOOLS_XML, 1},
        {"Qwen3.5-4B.jinja", LLM_TOOLS_XML, 1},
        {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", LLM_TOOLS_XML, 1},
        {"StepFun3.5-Flash.jinja", LLM_TOOLS_XML, 1},
        {"ByteDance-Seed-OSS.jinja", LLM_TOOLS_XML, 0}, /* writes a nested value as Python's str() */
        {"google-gemma-4-31B-it.jinja", LLM_TOOLS_GEMMA4, 1},
    };
    static const char *const args[] = {
        "{\"city\": \"Paris, \\\"FR\\\" {x} </parameter> [y]\", \"days\": 3, \"metric\": true}",
        "{\"city\": \"two\\nlines\", \"opts\": {\"units\": \"C\", \"alts\": [1, 2.5, null]}}",
    };
    int checked = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *text = template_text(cases[i].file);
        if (!text) {
            print_message("skipped: %s not in ../shared\n", cases[i].file);
            continue;
        }
        static char none[] = "", eos[] = "</s>";
        srv_chat chat = {.bos = none, .eos = eos, .tools = cases[i].f};
        llm_error err = {0};
        assert_int_equal(llm_jinja_compile(text, strlen(text), &chat.tmpl, &err), LLM_OK);
        assert_int_equal(llm_tools_format(text, strlen(text)), cases[i].f);
        llm_tools t = tools_for(cases[i].f, NULL);
        for (int a = 0; a < 1 + cases[i].nested; a++) {
            json_t *want = json_loads(args[a], 0, NULL);
            assert_non_null(want);
            json_t *calls = json_pack("[{s:s,s:s,s:{s:s,s:s}}]", "id", "abcdefghi", "type", "function", "function",
                                      "name", "get_weather", "arguments", args[a]);
            char *prompt = render_turns(&chat, &t, NULL, 1), *whole = render_turns(&chat, &t, calls, 0);
            char *answer = answer_of(prompt, whole), *content = NULL;
            json_t *got = NULL;
            assert_int_equal(llm_tools_extract(&t, NULL, answer, strlen(answer), &got, &content), 0);
            json_t *fn = json_object_get(json_array_get(got, 0), "function");
            json_t *got_args = json_loads(json_string_value(json_object_get(fn, "arguments")), 0, NULL);
            if (json_array_size(got) != 1 || strcmp(json_string_value(json_object_get(fn, "name")), "get_weather") ||
                !json_equal(got_args, want))
                fail_msg("%s: the call the template wrote, read back, differs:\n%s\n", cases[i].file, answer);
            json_decref(got_args);
            json_decref(got);
            json_decref(want);
            json_decref(calls);
            free(content);
            free(answer);
            free(prompt);
            free(whole);
            checked++;
        }
        json_decref(t.tools);
        llm_jinja_free(chat.tmpl);
    }
    print_message("round trip: %d calls written by real templates read back\n", checked);
    if (checked == 0)
        skip(); /* no template in ../shared: nothing was checked */
}

int main(void)
{
    g_body = json_loads("{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
                        "\"The weather\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": "
                        "\"string\", \"description\": \"A city\"}}}}}, {\"type\": \"function\", \"function\": {\"name\": "
                        "\"add\", \"description\": \"Adds\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}}]}",
                        0, NULL);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes),
        cmocka_unit_test(test_llama3_mistral_generic),
        cmocka_unit_test(test_xml),
        cmocka_unit_test(test_gemma4),
        cmocka_unit_test(test_streaming_holds_back_calls),
        cmocka_unit_test(test_formats_of_real_templates),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_history_reaches_the_template),
        cmocka_unit_test(test_calls_round_trip),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    json_decref(g_body);
    return rc;
}
