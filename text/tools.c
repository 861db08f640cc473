/* tools.c - tool calling (llm/tools.h). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm/json.h"
#include "llm/schema.h"
#include "llm/strbuf.h"
#include "llm/tools.h"

#define TOOLS_MAX 128

/* ---- formats ------------------------------------------------------------------------------ */

static int has(const char *t, size_t n, const char *what)
{
    return t && memmem(t, n, what, strlen(what)) != NULL;
}

llm_tool_format llm_tools_format(const char *t, size_t n)
{
    if (!t || !has(t, n, "tools"))
        return LLM_TOOLS_GENERIC; /* a template that never shows the tools */
    if (has(t, n, "[TOOL_CALLS]"))
        return has(t, n, "[ARGS]") ? LLM_TOOLS_MISTRAL_ARGS : LLM_TOOLS_MISTRAL;
    if (has(t, n, "<|tool_call>call:"))
        return LLM_TOOLS_GEMMA4;
    if (has(t, n, "<function=") && has(t, n, "<parameter="))
        return LLM_TOOLS_XML;
    if (has(t, n, "<tool_call>") && !has(t, n, "<function="))
        return LLM_TOOLS_HERMES;
    if (has(t, n, "<|start_header_id|>") && has(t, n, "parameters"))
        return LLM_TOOLS_LLAMA3;
    return LLM_TOOLS_GENERIC; /* a format not built here: the generic one, described to the model */
}

const char *llm_tools_format_name(llm_tool_format f)
{
    static const char *const n[] = {"generic", "hermes", "llama3", "mistral", "mistral-args", "xml", "gemma4"};
    return (unsigned)f < sizeof n / sizeof *n ? n[f] : "?";
}

/* ---- the request --------------------------------------------------------------------------- */

#define TOOL_NAME_MAX 64

static int name_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == '-' || c == '.';
}

/* The end of the tool name characters from p. */
static const char *name_span(const char *p, const char *end)
{
    while (p < end && name_char(*p)) p++;
    return p;
}


static int name_ok(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n > 0 && n <= TOOL_NAME_MAX && name_span(s, s + n) == s + n;
}

static json_t *tool_fn(json_t *tool)
{
    return json_object_get(tool, "function");
}

static const char *tool_name(json_t *tool)
{
    return json_string_value(json_object_get(tool_fn(tool), "name"));
}

static llm_status check_tools(json_t *tools, llm_error *err)
{
    if (!json_is_array(tools) || json_array_size(tools) > TOOLS_MAX)
        return llm_errf_at(err, LLM_ERR_INVALID_ARG, "tools", "'tools' must be an array of at most %d tools", TOOLS_MAX);
    size_t i, k;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *fn = tool_fn(t), *params = json_object_get(fn, "parameters");
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!type || strcmp(type, "function") || !json_is_object(fn))
            return llm_errf_at(err, LLM_ERR_INVALID_ARG, "tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {...}}", i);
        if (!name_ok(tool_name(t)))
            return llm_errf_at(err, LLM_ERR_INVALID_ARG, "tools", "tools[%zu].function.name must be 1-64 of a-z, A-Z, 0-9, '_', '-', '.'", i);
        if (params && !json_is_object(params) && !json_is_null(params))
            return llm_errf_at(err, LLM_ERR_INVALID_ARG, "tools", "tools[%zu].function.parameters must be a JSON Schema object", i);
        for (k = 0; k < i; k++)
            if (!strcmp(tool_name(json_array_get(tools, k)), tool_name(t)))
                return llm_errf_at(err, LLM_ERR_INVALID_ARG, "tools", "tools[%zu]: a second function named '%s'", i, tool_name(t));
    }
    return LLM_OK;
}

static json_t *find_tool(const llm_tools *t, const char *name)
{
    size_t i;
    json_t *x;
    json_array_foreach(t->tools, i, x) if (name && !strcmp(tool_name(x), name)) return x;
    return NULL;
}

llm_status llm_tools_parse(json_t *body, llm_tool_format fmt, llm_tools *t, llm_error *err)
{
    memset(t, 0, sizeof *t);
    t->fmt = t->out = fmt;
    json_t *tools = json_object_get(body, "tools"), *tc = json_object_get(body, "tool_choice");
    json_t *par = json_object_get(body, "parallel_tool_calls");
    if (par && !json_is_null(par) && !json_is_boolean(par))
        return llm_errf_at(err, LLM_ERR_INVALID_ARG, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    t->parallel = !json_is_false(par);
    int any = tools && !json_is_null(tools) && !(json_is_array(tools) && json_array_size(tools) == 0);
    llm_status st = any ? check_tools(tools, err) : LLM_OK;
    if (st)
        return st;
    const char *s = json_string_value(tc);
    if (!tc || json_is_null(tc) || (s && !strcmp(s, "auto")))
        t->choice = any ? LLM_TOOL_AUTO : LLM_TOOL_NONE;
    else if (s && !strcmp(s, "none"))
        t->choice = LLM_TOOL_NONE;
    else if (s && !strcmp(s, "required"))
        t->choice = LLM_TOOL_REQUIRED;
    else if (json_is_object(tc) && !strcmp(json_string_value(json_object_get(tc, "type")) ? json_string_value(json_object_get(tc, "type")) : "", "function")) {
        t->choice = LLM_TOOL_NAMED;
        t->named = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
    } else
        return llm_errf_at(err, LLM_ERR_INVALID_ARG, "tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                                               "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    if (t->choice >= LLM_TOOL_REQUIRED && !any)
        return llm_errf_at(err, LLM_ERR_INVALID_ARG, "tool_choice", "'tool_choice' asks for a tool call but there are no 'tools'");
    t->tools = any ? tools : NULL;
    if (t->choice == LLM_TOOL_NAMED && !find_tool(t, t->named))
        return llm_errf_at(err, LLM_ERR_INVALID_ARG, "tool_choice", "'tool_choice' names function '%.64s', which is not in 'tools'",
                        t->named ? t->named : "(none)");
    return LLM_OK;
}

/* ---- forcing a call ---------------------------------------------------------------------------- */

/* Tool x's parameters schema (a new reference); none given: an empty object. */
static json_t *params_schema(json_t *x)
{
    json_t *params = json_object_get(tool_fn(x), "parameters");
    return json_is_object(params) ? json_incref(params) : json_pack("{s:s,s:{}}", "type", "object", "properties");
}

/* {"type": "object", "properties": {name: {"const": N}, args: P}, ...}: one
 * call to tool x in the order the format writes it. */
static json_t *call_schema(json_t *x, const char *args_key)
{
    json_t *p = params_schema(x);
    return json_pack("{s:s,s:{s:{s:s},s:o},s:[s,s],s:b}", "type", "object", "properties", "name", "const",
                     tool_name(x), args_key, p, "required", "name", args_key, "additionalProperties", 0);
}

/* Any of the calls the choice allows. */
static json_t *calls_schema(const llm_tools *t, const char *args_key)
{
    json_t *any = json_array();
    size_t i;
    json_t *x;
    json_array_foreach(t->tools, i, x) {
        if (t->choice == LLM_TOOL_NAMED && strcmp(tool_name(x), t->named))
            continue;
        if (json_array_append_new(any, call_schema(x, args_key))) {
            json_decref(any);
            return NULL;
        }
    }
    return any ? json_pack("{s:o}", "anyOf", any) : NULL;
}

static json_t *list_of(const llm_tools *t, json_t *item)
{
    json_t *s = item ? json_pack("{s:s,s:o,s:i}", "type", "array", "items", item, "minItems", 1) : NULL;
    if (s && !t->parallel && json_object_set_new(s, "maxItems", json_integer(1))) {
        json_decref(s);
        return NULL;
    }
    return s;
}

llm_status llm_tools_forced(llm_tools *t, char **prefill, char **grammar, llm_error *err)
{
    *prefill = *grammar = NULL;
    json_t *schema = NULL;
    const char *pre = "";
    char named_pre[128];
    llm_tool_format f = t->fmt;
    if (f == LLM_TOOLS_MISTRAL_ARGS && t->choice != LLM_TOOL_NAMED && json_array_size(t->tools) > 1)
        f = LLM_TOOLS_GENERIC; /* the name and [ARGS] (a control token) cannot both be in one grammar */
    if (f == LLM_TOOLS_XML || f == LLM_TOOLS_GEMMA4)
        f = LLM_TOOLS_GENERIC; /* raw parameter text, or control-token quotes: no grammar can hold them */
    switch (f) {
    case LLM_TOOLS_HERMES:
        pre = "<tool_call>\n"; /* one call: the closing tag may be a control token */
        schema = calls_schema(t, "arguments");
        break;
    case LLM_TOOLS_LLAMA3: schema = calls_schema(t, "parameters"); break;
    case LLM_TOOLS_MISTRAL:
        pre = "[TOOL_CALLS]";
        schema = list_of(t, calls_schema(t, "arguments"));
        break;
    case LLM_TOOLS_MISTRAL_ARGS: {
        json_t *x = t->choice == LLM_TOOL_NAMED ? find_tool(t, t->named) : json_array_get(t->tools, 0);
        snprintf(named_pre, sizeof named_pre, "[TOOL_CALLS]%s[ARGS]", tool_name(x));
        pre = named_pre;
        schema = params_schema(x);
        break;
    }
    default: schema = json_pack("{s:s,s:{s:o},s:[s],s:b}", "type", "object", "properties", "tool_calls",
                                list_of(t, calls_schema(t, "arguments")), "required", "tool_calls",
                                "additionalProperties", 0);
    }
    t->out = f;
    if (!schema || !(*prefill = strdup(pre))) {
        json_decref(schema);
        return llm_errf(err, LLM_ERR_NOMEM, "out of memory");
    }
    llm_status st = llm_schema_grammar_compact(schema, grammar, err);
    json_decref(schema);
    if (st) {
        free(*prefill);
        *prefill = NULL;
        if (err) /* the schema is a tool's parameters */
            snprintf(err->field, sizeof err->field, "tools");
        return st;
    }
    return LLM_OK;
}

char *llm_tools_instructions(const llm_tools *t)
{
    llm_strbuf b = {0};
    static const char head[] = "You can call these tools (each function's arguments as a JSON Schema):\n";
    llm_strbuf_append(&b, head, sizeof head - 1);
    size_t i;
    json_t *x;
    json_array_foreach(t->tools, i, x) {
        json_t *fn = tool_fn(x), *params = json_object_get(fn, "parameters");
        const char *desc = json_string_value(json_object_get(fn, "description"));
        json_t *d = json_pack("{s:O,s:s,s:o}", "name", json_object_get(fn, "name"), "description", desc ? desc : "",
                              "parameters", json_is_object(params) ? json_incref(params) : json_object());
        char *s = d ? json_dumps(d, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        json_decref(d);
        if (!s) {
            llm_strbuf_free(&b);
            return NULL;
        }
        llm_strbuf_append(&b, s, strlen(s));
        llm_strbuf_append(&b, "\n", 1);
        free(s);
    }
    static const char tail[] = "To call tools, answer with only this JSON and nothing else: "
                               "{\"tool_calls\": [{\"name\": \"<tool name>\", \"arguments\": {<its arguments>}}]}\n"
                               "Otherwise answer normally.";
    llm_strbuf_append(&b, tail, sizeof tail - 1);
    return llm_strbuf_take(&b);
}

/* ---- reading calls back -------------------------------------------------------------------------- */

/* "call_" and 24 random letters and digits; for Mistral's formats 9 of
 * them alone (its templates refuse any other id). */
static void call_id(llm_tool_format f, char out[32])
{
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    int mistral = f == LLM_TOOLS_MISTRAL || f == LLM_TOOLS_MISTRAL_ARGS;
    size_t n = mistral ? 9 : 24, at = mistral ? 0 : 5;
    unsigned char r[24];
    if (getentropy(r, sizeof r))
        for (size_t i = 0; i < sizeof r; i++) r[i] = (unsigned char)rand();
    memcpy(out, "call_", at);
    for (size_t i = 0; i < n; i++) out[at + i] = abc[r[i] % (sizeof abc - 1)];
    out[at + n] = 0;
}

/* What reading calls ran into, beside calls that are not valid (*fault
 * bits): memory ran out; a value nested past LLM_JSON_MAX_DEPTH (or too
 * costly to hold), which ends the request rather than pass as text. */
enum { TOOLS_OOM = 1, TOOLS_DEEP = 2 };

/* The fault bit of a failed llm_json_load. */
static int load_fault(const llm_error *err)
{
    return err->code == LLM_ERR_NOMEM ? TOOLS_OOM : err->code == LLM_ERR_TOO_LONG ? TOOLS_DEEP : 0;
}

/* One OpenAI tool call for name(args), or NULL when name is not a tool or
 * args not an object (a JSON text of one counts), or a fault (*fault). */
static json_t *make_call(const llm_tools *t, const char *name, json_t *args, int *fault)
{
    json_t *parsed = NULL;
    llm_error err = {0};
    if (json_is_string(args) &&
        !(args = parsed = llm_json_loads(json_string_value(args), JSON_REJECT_DUPLICATES | LLM_JSON_OWN, &err)))
        *fault |= load_fault(&err);
    if (!find_tool(t, name) || !json_is_object(args)) {
        json_decref(parsed);
        return NULL;
    }
    char *a = json_dumps(args, JSON_COMPACT | JSON_PRESERVE_ORDER), id[32];
    json_decref(parsed);
    call_id(t->fmt, id);
    json_t *c = a ? json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function", "name", name,
                              "arguments", a)
                  : NULL;
    free(a);
    *fault |= c ? 0 : TOOLS_OOM;
    return c;
}

/* A JSON value at the start of s (after blanks); *used gets the bytes it
 * took. NULL when none parses (*fault says when it was too deep). */
static json_t *json_at(const char *s, size_t n, size_t *used, int *fault)
{
    size_t k = 0, took = 0;
    while (k < n && isspace((unsigned char)s[k])) k++;
    llm_error err = {0};
    json_t *v = llm_json_load(s + k, n - k, LLM_JSON_PREFIX | JSON_DECODE_ANY | LLM_JSON_OWN, &took, &err);
    if (!v)
        *fault |= load_fault(&err);
    *used = v ? k + took : 0;
    return v;
}

static int push(json_t *calls, json_t *c, int *fault)
{
    if (!c)
        return -1;
    if (json_array_append_new(calls, c)) {
        *fault |= TOOLS_OOM;
        return -1;
    }
    return 0;
}

/* {"name": ..., args_key: {...}} -> a call, or -1. */
static int object_call(const llm_tools *t, json_t *o, const char *args_key, json_t *calls, int *fault)
{
    json_t *args = json_object_get(o, args_key);
    if (!args && !strcmp(args_key, "parameters"))
        args = json_object_get(o, "arguments");
    return json_is_object(o) ? push(calls, make_call(t, json_string_value(json_object_get(o, "name")), args, fault), fault)
                             : -1;
}

#define G4_QUOTE "<|\"|>"
#define G4_DEPTH LLM_JSON_MAX_DEPTH /* nesting of a gemma4 value: as JSON's */

/* The bytes [a, b) as a tool name in out; -1 when empty or too long. */
static int copy_name(const char *a, const char *b, char out[TOOL_NAME_MAX + 1])
{
    if (b <= a || b - a > TOOL_NAME_MAX)
        return -1;
    memcpy(out, a, (size_t)(b - a));
    out[b - a] = 0;
    return 0;
}

static void blanks(const char **p, const char *end)
{
    while (*p < end && isspace((unsigned char)**p)) (*p)++;
}

static int starts(const char *p, const char *end, const char *lit)
{
    size_t k = strlen(lit);
    return (size_t)(end - p) >= k && !memcmp(p, lit, k);
}

/* Past blanks and marker at *p, when it is there (1); else *p is past the blanks (0). */
static int skip(const char **p, const char *end, const char *marker)
{
    blanks(p, end);
    if (!starts(*p, end, marker))
        return 0;
    *p += strlen(marker);
    return 1;
}

static int blank(const char *p, const char *end)
{
    blanks(&p, end);
    return p == end;
}

/* Reads the call whose opening tag is at *pp and moves *pp past it. 0, or
 * -1 when it is not a valid call. */
typedef int (*call_reader)(const llm_tools *t, const char **pp, const char *end, json_t *calls, int *fault);

/* Where a wrapper (one of wraps, NULL-terminated; NULL: none) that ends
 * in blanks just before at starts; at when there is none. */
static const char *wrapper_start(const char *s, const char *at, const char *const *wraps)
{
    const char *p = at;
    while (p > s && isspace((unsigned char)p[-1])) p--;
    for (size_t i = 0; wraps && wraps[i]; i++) {
        size_t k = strlen(wraps[i]);
        if ((size_t)(p - s) >= k && !memcmp(p - k, wraps[i], k))
            return p - k;
    }
    return at;
}

/* The formats whose calls open with tag anywhere in the answer (hermes,
 * xml, gemma4): each read by read; the text around them is content, less
 * a wrapper before a tag. */
static int tagged_calls(const llm_tools *t, const char *s, size_t n, const char *tag, const char *const *wraps,
                        call_reader read, json_t *calls, llm_strbuf *content, int *fault)
{
    const char *p = s, *end = s + n;
    for (;;) {
        const char *at = memmem(p, (size_t)(end - p), tag, strlen(tag));
        if (!at) {
            llm_strbuf_append(content, p, (size_t)(end - p));
            return json_array_size(calls) ? 0 : -1;
        }
        llm_strbuf_append(content, p, (size_t)(wrapper_start(p, at, wraps) - p));
        if (read(t, &at, end, calls, fault))
            return -1;
        p = at;
    }
}

/* ---- hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call> ------------------------ */

static int hermes_call(const llm_tools *t, const char **pp, const char *end, json_t *calls, int *fault)
{
    const char *p = *pp;
    size_t used;
    skip(&p, end, "<tool_call>");
    json_t *o = json_at(p, (size_t)(end - p), &used, fault);
    int bad = object_call(t, o, "arguments", calls, fault);
    json_decref(o);
    p += used;
    skip(&p, end, "</tool_call>");
    *pp = p;
    return bad;
}

/* ---- mistral: [TOOL_CALLS] then [{...}, ...] or name[ARGS]{...} (markers optional) ------------- */

/* name[CALL_ID]id[ARGS]{...} at *pp (the markers optional). */
static int mistral_named(const llm_tools *t, const char **pp, const char *end, json_t *calls, int *fault)
{
    const char *p = *pp, *name = p;
    char nm[TOOL_NAME_MAX + 1];
    p = name_span(p, end);
    if (copy_name(name, p, nm))
        return -1;
    if (starts(p, end, "[CALL_ID]")) /* Mistral Small 3.2's templates write the call's id there */
        p = name_span(p + strlen("[CALL_ID]"), end);
    if (starts(p, end, "[ARGS]")) { /* written out (a forced call's prefill): blanks may follow */
        p += strlen("[ARGS]");
        blanks(&p, end);
    }
    if (p >= end || *p != '{') /* else the arguments right after the name, as streaming holds them */
        return -1;
    size_t used;
    json_t *args = json_at(p, (size_t)(end - p), &used, fault);
    int bad = push(calls, make_call(t, nm, args, fault), fault);
    json_decref(args);
    *pp = p + used;
    return bad;
}

static int mistral_calls(const llm_tools *t, const char *s, size_t n, json_t *calls, int *fault)
{
    const char *p = s, *end = s + n;
    while (skip(&p, end, "[TOOL_CALLS]") || !blank(p, end)) {
        blanks(&p, end);
        if (p >= end || *p != '[') {
            if (mistral_named(t, &p, end, calls, fault))
                return -1;
            continue;
        }
        size_t used, i;
        json_t *a = json_at(p, (size_t)(end - p), &used, fault), *o;
        int bad = !json_is_array(a) || json_array_size(a) == 0;
        json_array_foreach(a, i, o) bad |= object_call(t, o, "arguments", calls, fault);
        json_decref(a);
        if (bad)
            return -1;
        p += used;
    }
    return json_array_size(calls) ? 0 : -1;
}

/* A Python literal (True, False, None as templates print them) or a JSON
 * text as JSON; NULL when it is neither (*fault: or too deep). */
static json_t *literal(const char *v, size_t n, int *fault)
{
    if (n == 4 && !memcmp(v, "True", 4))
        return json_true();
    if (n == 5 && !memcmp(v, "False", 5))
        return json_false();
    if (n == 4 && !memcmp(v, "None", 4))
        return json_null();
    llm_error err = {0};
    json_t *j = llm_json_load(v, n, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES | LLM_JSON_OWN, NULL, &err);
    if (!j)
        *fault |= load_fault(&err);
    return j;
}

/* ---- xml: <function=name><parameter=key>value</parameter>...</function> ---------------------- */

#define XML_PARAM_END "</parameter>"

/* The type tool's schema gives parameter key ("" when it says none). */
static const char *param_type(json_t *tool, const char *key)
{
    json_t *props = json_object_get(json_object_get(tool_fn(tool), "parameters"), "properties");
    const char *ty = json_string_value(json_object_get(json_object_get(props, key), "type"));
    return ty ? ty : "";
}

/* Parameter text as its value (the newline the templates put on each
 * side dropped): the text for a string parameter, else what it parses to,
 * or the text when it parses to nothing. NULL: not UTF-8, or no memory. */
static json_t *xml_value(json_t *tool, const char *key, const char *v, size_t n, int *fault)
{
    if (n && v[0] == '\n')
        v++, n--;
    if (n && v[n - 1] == '\n')
        n--;
    json_t *j = strcmp(param_type(tool, key), "string") ? literal(v, n, fault) : NULL;
    return j ? j : json_stringn(v, n);
}

/* The </parameter> that ends a value starting at v: the first one that
 * another parameter or </function> follows (the templates write a value
 * raw, so the tag may be in it). NULL: none (the call was cut short). */
static const char *param_close(const char *v, const char *end)
{
    size_t k = strlen(XML_PARAM_END);
    for (const char *c = v; (c = memmem(c, (size_t)(end - c), XML_PARAM_END, k)) != NULL; c += k) {
        const char *p = c + k;
        blanks(&p, end);
        if (starts(p, end, "<parameter=") || starts(p, end, "</function>"))
            return c;
    }
    return NULL;
}

/* The parameters from *pp (just past <function=name>) through
 * </function> into args; *pp moves past them. 0, or -1 when they are
 * not parameters, one repeats, or the call is cut short. */
static int xml_params(json_t *tool, const char **pp, const char *end, json_t *args, int *fault)
{
    const char *p = *pp;
    while (!skip(&p, end, "</function>")) {
        char key[128];
        if (!skip(&p, end, "<parameter="))
            return -1;
        const char *gt = memchr(p, '>', (size_t)(end - p));
        if (!gt || gt == p || gt - p >= (long)sizeof key)
            return -1;
        snprintf(key, sizeof key, "%.*s", (int)(gt - p), p);
        const char *v = gt + 1, *close = param_close(v, end);
        json_t *val = close && !json_object_get(args, key) ? xml_value(tool, key, v, (size_t)(close - v), fault) : NULL;
        if (!val || json_object_set_new(args, key, val))
            return -1;
        p = close + strlen(XML_PARAM_END);
    }
    *pp = p;
    return 0;
}

/* One <function=name>...</function> block at *pp, and the wrapper's end. */
static int xml_call(const llm_tools *t, const char **pp, const char *end, json_t *calls, int *fault)
{
    const char *p = *pp;
    char name[TOOL_NAME_MAX + 1];
    skip(&p, end, "<function=");
    const char *gt = memchr(p, '>', (size_t)(end - p));
    if (!gt || copy_name(p, gt, name))
        return -1;
    json_t *tool = find_tool(t, name), *args = json_object();
    p = gt + 1;
    int bad = !tool || !args || xml_params(tool, &p, end, args, fault);
    if (!bad)
        bad = push(calls, make_call(t, name, args, fault), fault);
    *fault |= args ? 0 : TOOLS_OOM;
    json_decref(args);
    if (!skip(&p, end, "</tool_call>"))
        skip(&p, end, "</seed:tool_call>");
    *pp = p;
    return bad ? -1 : 0;
}

/* ---- gemma4: <|tool_call>call:name{key:value,...}<tool_call|> --------------------------------- */

static json_t *g4_value(const char **pp, const char *end, int depth, int *fault);

/* <|"|>text<|"|> at *pp. */
static json_t *g4_string(const char **pp, const char *end)
{
    size_t q = strlen(G4_QUOTE);
    const char *v = *pp + q, *close = memmem(v, (size_t)(end - v), G4_QUOTE, q);
    if (!close)
        return NULL;
    *pp = close + q;
    return json_stringn(v, (size_t)(close - v));
}

/* A key: bare (name characters or '$') or quoted; NULL when there is none. */
static json_t *g4_key(const char **pp, const char *end)
{
    if (starts(*pp, end, G4_QUOTE))
        return g4_string(pp, end);
    const char *k = *pp, *p = k;
    while (p < end && (name_char(*p) || *p == '$')) p++;
    *pp = p;
    return p > k ? json_stringn(k, (size_t)(p - k)) : NULL;
}

/* One member (key:value) or item of container c at *p; -1 when none. */
static int g4_member(json_t *c, const char **p, const char *end, int depth, int *fault)
{
    json_t *k = NULL;
    if (json_is_object(c)) {
        k = g4_key(p, end);
        blanks(p, end);
        if (!k || *p >= end || **p != ':') {
            json_decref(k);
            return -1;
        }
        (*p)++;
    }
    json_t *v = g4_value(p, end, depth + 1, fault);
    int bad = !v || (k && json_object_get(c, json_string_value(k))); /* a repeated key is no call */
    if (bad)
        json_decref(v);
    else /* (json_*_new free the value they could not take) */
        bad = k ? json_object_set_new(c, json_string_value(k), v) : json_array_append_new(c, v);
    json_decref(k);
    return bad ? -1 : 0;
}

/* {key:value,...} or [value,...] at *pp; closing is '}' or ']'. */
static json_t *g4_container(const char **pp, const char *end, int depth, char closing, int *fault)
{
    const char *p = *pp + 1;
    json_t *c = closing == '}' ? json_object() : json_array();
    int bad = !c;
    for (int first = 1; !bad; first = 0) {
        blanks(&p, end);
        if (p < end && *p == closing) {
            p++;
            break;
        }
        if (!first && !skip(&p, end, ","))
            bad = 1;
        else
            bad = g4_member(c, &p, end, depth, fault);
    }
    if (bad) {
        json_decref(c);
        return NULL;
    }
    *pp = p;
    return c;
}

/* A value: a quoted string, an object, an array, or a bare literal
 * (numbers, true/false/null, Python's True/False/None) up to , } or ]. */
static json_t *g4_value(const char **pp, const char *end, int depth, int *fault)
{
    blanks(pp, end);
    if (depth > G4_DEPTH)
        *fault |= TOOLS_DEEP;
    if (depth > G4_DEPTH || *pp >= end)
        return NULL;
    if (starts(*pp, end, G4_QUOTE))
        return g4_string(pp, end);
    if (**pp == '{' || **pp == '[')
        return g4_container(pp, end, depth, **pp == '{' ? '}' : ']', fault);
    const char *v = *pp, *p = v;
    while (p < end && *p != ',' && *p != '}' && *p != ']' && *p != '<') p++;
    size_t n = (size_t)(p - v);
    while (n && isspace((unsigned char)v[n - 1])) n--;
    json_t *j = n ? literal(v, n, fault) : NULL;
    if (j && (json_is_string(j) || json_is_object(j) || json_is_array(j))) { /* bare text is not a value here */
        json_decref(j);
        return NULL;
    }
    *pp = p;
    return j;
}

/* <|tool_call>call:name{...}<tool_call|> at *pp. */
static int gemma4_call(const llm_tools *t, const char **pp, const char *end, json_t *calls, int *fault)
{
    const char *p = *pp;
    char nm[TOOL_NAME_MAX + 1];
    skip(&p, end, "<|tool_call>");
    if (!skip(&p, end, "call:"))
        return -1;
    const char *name = p;
    p = name_span(p, end);
    if (copy_name(name, p, nm) || p >= end || *p != '{')
        return -1;
    json_t *args = g4_container(&p, end, 0, '}', fault);
    int bad = push(calls, make_call(t, nm, args, fault), fault);
    json_decref(args);
    skip(&p, end, "<tool_call|>");
    skip(&p, end, "<|tool_response>"); /* where the template has the tool's answer come */
    *pp = p;
    return bad;
}

const char *const *llm_tools_markers(llm_tool_format f)
{
    static const char *const gemma4[] = {"<|tool_call>", "<tool_call|>", G4_QUOTE, "<|tool_response>", NULL};
    static const char *const none[] = {NULL};
    return f == LLM_TOOLS_GEMMA4 ? gemma4 : none;
}

int llm_tools_shows_markers(const llm_tools *t)
{
    return t->choice != LLM_TOOL_NONE && t->out == t->fmt && *llm_tools_markers(t->out);
}

llm_status llm_tools_extract(const llm_tools *t, const char *prefill, const char *text, size_t n, json_t **out,
                             char **content)
{
    *content = NULL;
    *out = NULL;
    int fault = 0;
    llm_strbuf all = {0}, rest = {0};
    llm_strbuf_append(&all, prefill ? prefill : "", prefill ? strlen(prefill) : 0);
    llm_strbuf_append(&all, text, n);
    json_t *calls = json_array();
    const char *s = all.p ? all.p : "", *end = s + all.len, *p = s;
    int bad = !calls || all.failed;
    fault = bad ? TOOLS_OOM : 0;
    static const char *const xml_wraps[] = {"<tool_call>", "<seed:tool_call>", NULL};
    if (!bad && t->out == LLM_TOOLS_HERMES)
        bad = tagged_calls(t, s, all.len, "<tool_call>", NULL, hermes_call, calls, &rest, &fault);
    else if (!bad && t->out == LLM_TOOLS_XML)
        bad = tagged_calls(t, s, all.len, "<function=", xml_wraps, xml_call, calls, &rest, &fault);
    else if (!bad && t->out == LLM_TOOLS_GEMMA4)
        bad = tagged_calls(t, s, all.len, "<|tool_call>", NULL, gemma4_call, calls, &rest, &fault);
    else if (!bad && (t->out == LLM_TOOLS_MISTRAL || t->out == LLM_TOOLS_MISTRAL_ARGS))
        bad = mistral_calls(t, s, all.len, calls, &fault);
    else if (!bad) { /* one JSON object is the whole answer */
        size_t used;
        skip(&p, end, "<|python_tag|>");
        json_t *o = json_at(p, (size_t)(end - p), &used, &fault);
        if (t->out == LLM_TOOLS_LLAMA3)
            bad = object_call(t, o, "parameters", calls, &fault);
        else {
            json_t *list = json_object_get(o, "tool_calls"), *c;
            size_t i;
            bad = !json_is_array(list) || json_array_size(list) == 0;
            json_array_foreach(list, i, c) bad |= object_call(t, c, "arguments", calls, &fault);
        }
        json_decref(o);
        bad |= !blank(p + used, end);
    }
    if (bad) { /* no valid call: all of it is content */
        json_decref(calls);
        calls = NULL;
        llm_strbuf_free(&rest);
        llm_strbuf_append(&rest, text, n);
    }
    fault |= rest.failed ? TOOLS_OOM : 0;
    if (!fault && rest.len && !blank(rest.p, rest.p + rest.len) && !(*content = llm_strbuf_take(&rest)))
        fault |= TOOLS_OOM;
    llm_strbuf_free(&rest);
    llm_strbuf_free(&all);
    if (fault) {
        json_decref(calls);
        return fault & TOOLS_OOM ? LLM_ERR_NOMEM : LLM_ERR_TOO_LONG;
    }
    *out = calls;
    return LLM_OK;
}

/* Formats whose calls may follow content: what may go out is the text
 * before the first opening tag at or past from (text before from held
 * none), and a tail that may be a tag's start waits. */
static size_t held_from(const char *text, size_t n, size_t from, const char *const *tags)
{
    size_t cut = n;
    for (size_t i = 0; tags[i]; i++) { /* a later tag only counts where it starts before the cut: a stream holding a
                                         * call back looks at a few bytes per tag, not the whole call each time */
        size_t len = strlen(tags[i]), lim = cut == n ? n : cut + len - 1 < n ? cut + len - 1 : n;
        const char *open = memmem(text + from, lim - from, tags[i], len);
        if (open && (size_t)(open - text) < cut)
            cut = (size_t)(open - text);
    }
    size_t tail = n;
    for (size_t i = 0; cut == n && tags[i]; i++) {
        size_t len = strlen(tags[i]);
        for (size_t k = n - from < len - 1 ? n - from : len - 1; k > 0; k--)
            if (!memcmp(text + n - k, tags[i], k)) {
                tail = n - k < tail ? n - k : tail;
                break; /* the longest tail of this tag */
            }
    }
    return cut < n ? cut : tail;
}

size_t llm_tools_releasable(const llm_tools *t, const char *text, size_t n, size_t from)
{
    if (n == 0 || from > n)
        return n;
    if (t->choice == LLM_TOOL_NONE)
        return n;
    if (t->choice != LLM_TOOL_AUTO)
        return 0; /* a forced answer is all call */
    static const char *const hermes[] = {"<tool_call>", NULL}, *const gemma4[] = {"<|tool_call>", NULL};
    static const char *const xml[] = {"<tool_call>", "<seed:tool_call>", "<function=", NULL};
    if (t->out == LLM_TOOLS_HERMES || t->out == LLM_TOOLS_XML || t->out == LLM_TOOLS_GEMMA4)
        return held_from(text, n, from, t->out == LLM_TOOLS_HERMES ? hermes : t->out == LLM_TOOLS_XML ? xml : gemma4);
    if (from > 0) /* the other formats put the call first: once content went out, all of it is content */
        return n;
    size_t k = 0;
    while (k < n && isspace((unsigned char)text[k])) k++;
    if (k == n)
        return 0;
    char c = text[k];
    int mistral = t->out == LLM_TOOLS_MISTRAL || t->out == LLM_TOOLS_MISTRAL_ARGS;
    if (c == '{' || c == '<' || (mistral && c == '['))
        return 0;
    size_t j = (size_t)(name_span(text + k, text + n) - text);
    if (t->out == LLM_TOOLS_MISTRAL_ARGS && j > k) { /* name[ARGS]{...}: a name, then {[ */
        if (j == n || text[j] == '{' || text[j] == '[')
            return 0;
    }
    return n;
}
