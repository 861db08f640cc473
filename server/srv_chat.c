/* srv_chat.c - chat requests as Jinja template variables (see srv_chat.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/json.h"
#include "llm/strbuf.h"
#include "srv.h"
#include "srv_chat.h"

static llm_jv *value(llm_jctx *c, json_t *v, int tenant, int depth, llm_error *err)
{
    if (depth > SRV_CHAT_DEPTH) {
        llm_errf(err, LLM_ERR_INVALID_ARG, "a value nested more than %d deep", SRV_CHAT_DEPTH);
        return NULL;
    }
    llm_jv *out = NULL;
    switch (json_typeof(v)) {
    case JSON_NULL: out = llm_jv_none(c); break;
    case JSON_TRUE: out = llm_jv_bool(c, 1); break;
    case JSON_FALSE: out = llm_jv_bool(c, 0); break;
    case JSON_INTEGER: out = llm_jv_int(c, (long long)json_integer_value(v)); break;
    case JSON_REAL: out = llm_jv_float(c, json_real_value(v)); break;
    case JSON_STRING: out = llm_jv_str(c, json_string_value(v), json_string_length(v), tenant); break;
    case JSON_ARRAY: {
        out = llm_jv_list(c);
        size_t i;
        json_t *x;
        json_array_foreach(v, i, x) {
            llm_jv *e = value(c, x, tenant, depth + 1, err);
            if (!e)
                return NULL;
            if (llm_jv_append(c, out, e))
                return llm_errf(err, LLM_ERR_NOMEM, "no memory for the chat template's values"), NULL;
        }
        break;
    }
    case JSON_OBJECT: {
        out = llm_jv_dict(c);
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            llm_jv *e = value(c, x, tenant, depth + 1, err);
            if (!e)
                return NULL;
            if (llm_jv_set(c, out, k, strlen(k), tenant, e))
                return llm_errf(err, LLM_ERR_NOMEM, "no memory for the chat template's values"), NULL;
        }
        break;
    }
    }
    if (!out)
        llm_errf(err, LLM_ERR_NOMEM, "no memory for the chat template's values");
    return out;
}

llm_jv *srv_chat_value(llm_jctx *c, json_t *v, int tenant, llm_error *err)
{
    err->code = LLM_OK;
    return value(c, v, tenant, 0, err);
}

static int role_ok(const char *r)
{
    size_t n = strlen(r);
    if (n == 0 || n > 32)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((r[i] >= 'a' && r[i] <= 'z') || r[i] == '_'))
            return 0;
    return 1;
}

/* One message: its members as tenant data, its role as markup. */
static llm_jv *message(llm_jctx *c, json_t *m, size_t i, llm_error *err)
{
    json_t *role = json_object_get(m, "role");
    if (!json_is_object(m) || !json_is_string(role) || !role_ok(json_string_value(role))) {
        llm_errf(err, LLM_ERR_INVALID_ARG,
                 "messages[%zu]: an object with a role of lower-case letters and '_' (at most 32) is needed", i);
        return NULL;
    }
    llm_jv *d = llm_jv_dict(c);
    const char *k;
    json_t *x;
    json_object_foreach(m, k, x) {
        int is_role = !strcmp(k, "role");
        llm_jv *e = is_role ? llm_jv_str(c, json_string_value(x), json_string_length(x), 0)
                            : srv_chat_value(c, x, 1, err);
        if (!e || llm_jv_set(c, d, k, strlen(k), !is_role, e)) {
            if (err->code == LLM_OK)
                llm_errf(err, LLM_ERR_NOMEM, "no memory for the chat template's values");
            return NULL;
        }
    }
    return d;
}

static int set(llm_jctx *c, llm_jv *d, const char *k, llm_jv *v, llm_error *err)
{
    if (v && !llm_jv_set(c, d, k, strlen(k), 0, v))
        return 0;
    if (err->code == LLM_OK)
        llm_errf(err, LLM_ERR_NOMEM, "no memory for the chat template's values");
    return -1;
}

llm_jv *srv_chat_vars(llm_jctx *c, json_t *messages, json_t *tools, int add_generation_prompt, const char *bos,
                      const char *eos, json_t *kwargs, llm_error *err)
{
    err->code = LLM_OK;
    llm_jv *vars = llm_jv_dict(c), *ms = llm_jv_list(c);
    if (!vars || !ms)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for the chat template's values"), NULL;
    if (json_is_object(kwargs)) {
        const char *k;
        json_t *x;
        json_object_foreach(kwargs, k, x) {
            if (set(c, vars, k, srv_chat_value(c, x, 1, err), err))
                return NULL;
        }
    }
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        llm_jv *e = message(c, m, i, err);
        if (!e || llm_jv_append(c, ms, e))
            return err->code ? NULL : (llm_errf(err, LLM_ERR_NOMEM, "no memory"), NULL);
    }
    if (set(c, vars, "messages", ms, err) ||
        (tools && set(c, vars, "tools", srv_chat_value(c, tools, 1, err), err)) ||
        set(c, vars, "add_generation_prompt", llm_jv_bool(c, add_generation_prompt), err) ||
        set(c, vars, "bos_token", llm_jv_str(c, bos ? bos : "", bos ? strlen(bos) : 0, 0), err) ||
        set(c, vars, "eos_token", llm_jv_str(c, eos ? eos : "", eos ? strlen(eos) : 0, 0), err))
        return NULL;
    return vars;
}

/* ---- the renderer ------------------------------------------------------------------------ */

static char *token_text(const llm_vocab *v, int32_t id)
{
    if (!v || id < 0)
        return strdup("");
    gguf_str t = llm_vocab_text(v, id);
    return strndup(t.data ? t.data : "", t.data ? (size_t)t.len : 0);
}

/* The tool format's markers that v has as control tokens (their text is
 * otherwise left out of answers). */
static void chat_markers(srv_chat *c, const llm_vocab *v)
{
    const char *const *mk = llm_tools_markers(c->tools);
    c->n_markers = 0;
    for (size_t i = 0; v && mk[i] && c->n_markers < (int)(sizeof c->markers / sizeof *c->markers); i++) {
        int32_t id = llm_vocab_find(v, mk[i], strlen(mk[i]));
        if (id >= 0 && llm_vocab_token_type(v, id) == LLM_TOKEN_CONTROL)
            c->markers[c->n_markers++] = id;
    }
}

/* The template in file (malloc'd, *n bytes), or NULL with err set. */
static char *read_template(const char *file, size_t *n, llm_error *err)
{
    FILE *f = fopen(file, "rb");
    char *buf = f ? malloc(LLM_JINJA_MAX_SRC + 1) : NULL;
    *n = buf ? fread(buf, 1, LLM_JINJA_MAX_SRC + 1, f) : 0;
    int bad = !f || !buf || ferror(f);
    if (f)
        fclose(f);
    if (bad || *n > LLM_JINJA_MAX_SRC) {
        free(buf);
        llm_errf(err, !buf && f ? LLM_ERR_NOMEM : bad ? LLM_ERR_IO : LLM_ERR_TOO_LONG, "chat_template_file %s: %s", file,
                 !f ? strerror(errno) : bad ? "cannot read it" : "over 1 MiB");
        return NULL;
    }
    return buf;
}

/* The built-in family for the model's tokenizer.chat_template. */
static llm_chat_template chat_family(const llm_model *m)
{
    gguf_str s;
    if (gguf_get_str(m->gguf, "tokenizer.chat_template", &s, NULL))
        /* a gemma3 file without its template (some conversions drop it)
         * was still trained on Gemma's turns, not chatml's */
        return m->hp.arch == LLM_ARCH_GEMMA3 ? LLM_CHAT_GEMMA : LLM_CHAT_CHATML;
    return llm_chat_detect(s.data, (size_t)s.len);
}

srv_chat *srv_chat_new(const llm_model *m, const char *mode, const char *file, llm_error *err)
{
    int builtin = mode && !strcmp(mode, "builtin");
    if (mode && *mode && !builtin && strcmp(mode, "auto")) {
        llm_errf(err, LLM_ERR_INVALID_ARG, "chat_template: '%s' is neither auto nor builtin", mode);
        return NULL;
    }
    srv_chat *c = calloc(1, sizeof *c);
    if (!c || !(c->bos = token_text(m->vocab, llm_vocab_bos(m->vocab))) ||
        !(c->eos = token_text(m->vocab, llm_vocab_eos(m->vocab)))) {
        srv_chat_free(c);
        llm_errf(err, LLM_ERR_NOMEM, "no memory for the chat template");
        return NULL;
    }
    c->drop_bos = m->vocab && llm_vocab_add_bos(m->vocab) && *c->bos;
    c->family = chat_family(m);
    if (!builtin && file && *file) { /* the operator's own template: it must work */
        size_t n;
        char *src = read_template(file, &n, err);
        if (!src || llm_jinja_compile(src, n, &c->tmpl, err)) {
            free(src);
            srv_chat_free(c);
            return NULL;
        }
        c->tools = llm_tools_format(src, n);
        chat_markers(c, m->vocab);
        free(src);
        snprintf(c->what, sizeof c->what, "the Jinja template of %.200s (%zu bytes; tool calls: %s)", file, n,
                 llm_tools_format_name(c->tools));
        return c;
    }
    gguf_str s;
    if (builtin || gguf_get_str(m->gguf, "tokenizer.chat_template", &s, NULL)) {
        snprintf(c->what, sizeof c->what, "built-in %s (%s)", llm_chat_name(c->family),
                 builtin ? "chat_template: builtin" : "the model has no tokenizer.chat_template");
        return c;
    }
    llm_error jerr = {0};
    if (llm_jinja_compile(s.data, (size_t)s.len, &c->tmpl, &jerr)) {
        if (jerr.code == LLM_ERR_NOMEM) {
            srv_chat_free(c);
            llm_errf(err, LLM_ERR_NOMEM, "no memory for the chat template");
            return NULL;
        }
        snprintf(c->what, sizeof c->what, "built-in %s: the model's template does not compile (%.160s)",
                 llm_chat_name(c->family), jerr.msg);
        return c;
    }
    c->tools = llm_tools_format(s.data, (size_t)s.len);
    chat_markers(c, m->vocab);
    snprintf(c->what, sizeof c->what, "the model's Jinja template (%zu bytes; tool calls: %s)", (size_t)s.len,
             llm_tools_format_name(c->tools));
    return c;
}

void srv_chat_free(srv_chat *c)
{
    if (!c)
        return;
    llm_jinja_free(c->tmpl);
    free(c->bos);
    free(c->eos);
    free(c);
}

/* A message's content as one string: a string, null (absent), or text
 * parts joined. NULL with e set otherwise; *owned holds a joined copy. */
static const char *content_text(json_t *m, size_t i, char **owned, srv_err *e)
{
    json_t *ct = json_object_get(m, "content");
    *owned = NULL;
    if (json_is_string(ct))
        return json_string_value(ct);
    if (!ct || json_is_null(ct))
        return "";
    if (!json_is_array(ct)) {
        srv_err_set(e, 400, "messages", "messages[%zu].content must be a string or an array of text parts", i);
        return NULL;
    }
    size_t total = 1, at = 0;
    for (size_t k = 0; k < json_array_size(ct); k++) {
        json_t *p = json_array_get(ct, k), *t = json_object_get(p, "text"), *ty = json_object_get(p, "type");
        if (!json_is_string(t) || !json_is_string(ty) || strcmp(json_string_value(ty), "text")) {
            srv_err_set(e, 400, "messages", "messages[%zu].content[%zu] must be a text part", i, k);
            return NULL;
        }
        total += json_string_length(t);
    }
    char *out = malloc(total);
    if (!out) {
        srv_err_set(e, 503, NULL, "out of memory");
        return NULL;
    }
    for (size_t k = 0; k < json_array_size(ct); k++) {
        json_t *t = json_object_get(json_array_get(ct, k), "text");
        memcpy(out + at, json_string_value(t), json_string_length(t));
        at += json_string_length(t);
    }
    out[at] = 0;
    return *owned = out;
}

/* A shallow copy of an object, or NULL: json_copy drops members whose
 * allocation fails (a message without its role) instead of failing. */
static json_t *copy_members(json_t *m)
{
    json_t *o = json_object(), *v;
    const char *k;
    json_object_foreach(m, k, v) {
        if (o && json_object_set(o, k, v)) {
            json_decref(o);
            o = NULL;
        }
    }
    return o;
}

/* An assistant message's tool_calls as the template gets them: each
 * call's function.arguments an object when it was a JSON text of one (as
 * transformers' templates expect; agents send OpenAI's strings). */
static json_t *calls_for_template(json_t *calls)
{
    json_t *out = json_array(), *c;
    size_t i;
    json_array_foreach(calls, i, c) {
        json_t *fn = json_object_get(c, "function"), *args = json_object_get(fn, "arguments");
        json_t *obj = json_is_string(args) ? llm_json_loads(json_string_value(args), JSON_REJECT_DUPLICATES, NULL) : NULL;
        json_t *nc = copy_members(c), *nfn = json_is_object(fn) ? copy_members(fn) : NULL;
        int bad = !out || !nc || (json_is_object(fn) && !nfn);
        if (!bad && nfn && json_is_object(obj))
            bad = json_object_set(nfn, "arguments", obj) != 0;
        if (!bad && nfn)
            bad = json_object_set(nc, "function", nfn) != 0;
        json_decref(obj);
        json_decref(nfn);
        if (bad || json_array_append_new(out, nc)) { /* append releases nc when it fails */
            if (bad)
                json_decref(nc);
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

/* Generic tool format: an assistant's calls as the JSON text it was told
 * to write, and a tool's result as a user turn (templates without tools
 * know neither). */
static int generic_history(json_t *copy, json_t *m, const char *text, srv_err *e)
{
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *calls = json_object_get(m, "tool_calls");
    llm_strbuf b = {0};
    if (!strcmp(role, "tool")) {
        llm_strbuf_printf(&b, "Tool result%s%s: %s", json_is_string(json_object_get(m, "tool_call_id")) ? " for " : "",
                          json_is_string(json_object_get(m, "tool_call_id"))
                              ? json_string_value(json_object_get(m, "tool_call_id")) : "", text);
        if (json_object_set_new(copy, "role", json_string("user")))
            b.failed = 1;
    } else if (json_is_array(calls) && json_array_size(calls)) {
        json_t *list = json_array(), *c;
        size_t i;
        json_array_foreach(calls, i, c) {
            json_t *fn = json_object_get(c, "function"), *args = json_object_get(fn, "arguments");
            /* a JSON text as its value; any other text stays a string, as it was sent */
            json_t *a = json_is_string(args) ? llm_json_loads(json_string_value(args), 0, NULL) : json_incref(args);
            if (!a && json_is_string(args))
                a = json_incref(args);
            if (!list || json_array_append_new(list, json_pack("{s:O,s:o}", "name", json_object_get(fn, "name"),
                                                               "arguments", a ? a : json_object())))
                b.failed = 1;
        }
        json_t *w = list ? json_pack("{s:O}", "tool_calls", list) : NULL;
        char *s = w ? json_dumps(w, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        llm_strbuf_printf(&b, "%s%s%s", text, *text ? "\n" : "", s ? s : "");
        b.failed |= !s;
        free(s);
        json_decref(w);
        json_decref(list);
        json_object_del(copy, "tool_calls");
    } else
        llm_strbuf_append(&b, text, strlen(text));
    char *t = llm_strbuf_take(&b);
    int bad = !t || json_object_set_new(copy, "content", json_string(t));
    free(t);
    return bad ? srv_fail(e, 503, NULL, "out of memory") : 0;
}

/* tool_calls: null, or an array of {"function": {"name": a string,
 * "arguments": a string or an object}}; 1 (e set) otherwise. */
static int bad_calls(json_t *calls, size_t i, srv_err *e)
{
    if (!calls || json_is_null(calls))
        return 0;
    if (!json_is_array(calls)) {
        srv_err_set(e, 400, "messages", "messages[%zu].tool_calls must be an array", i);
        return 1;
    }
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
        json_t *fn = json_object_get(c, "function"), *args = json_object_get(fn, "arguments");
        llm_error err = {0};
        if (!json_is_string(json_object_get(fn, "name")) || (args && !json_is_string(args) && !json_is_object(args))) {
            srv_err_set(e, 400, "messages", "messages[%zu].tool_calls[%zu] must be {\"function\": {\"name\": "
                                            "string, \"arguments\": string or object}}", i, k);
            return 1;
        }
        /* a JSON text in it is read for the template: too deep is refused here, not taken for plain text */
        if (json_is_string(args) &&
            llm_json_scan(json_string_value(args), json_string_length(args), LLM_JSON_MAX_DEPTH, NULL, &err) ==
                LLM_ERR_TOO_LONG) {
            srv_err_set(e, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments: %s", i, k, err.msg);
            return 1;
        }
    }
    return 0;
}

/* One message as the template gets it: content as one string, tool calls
 * with object arguments (or, generic, as text). NULL with e set. */
static json_t *flat_message(json_t *m, size_t i, int generic, srv_err *e)
{
    json_t *role = json_object_get(m, "role");
    char *owned;
    const char *text;
    if (!json_is_object(m) || !json_is_string(role) || !role_ok(json_string_value(role))) {
        srv_err_set(e, 400, "messages", "messages[%zu] must be an object with a role of lower-case letters and "
                                        "'_' (at most 32)", i);
        return NULL;
    }
    json_t *calls = json_object_get(m, "tool_calls");
    if (bad_calls(calls, i, e))
        return NULL;
    if (!(text = content_text(m, i, &owned, e)))
        return NULL;
    json_t *copy = copy_members(m);
    int bad = !copy;
    if (!bad && generic)
        bad = generic_history(copy, m, text, e);
    else if (!bad) {
        bad = json_object_set_new(copy, "content", json_string(text)) != 0;
        if (!bad && json_is_array(calls))
            bad = json_object_set_new(copy, "tool_calls", calls_for_template(calls)) != 0;
        if (bad)
            srv_err_set(e, 503, NULL, "out of memory");
    } else
        srv_err_set(e, 503, NULL, "out of memory");
    free(owned);
    if (bad) {
        json_decref(copy);
        return NULL;
    }
    return copy;
}

/* Generic tool format: the instructions go before the first system
 * message's text, or else the first message's. */
static int add_instructions(json_t *ms, const llm_tools *t, srv_err *e)
{
    char *ins = llm_tools_instructions(t);
    size_t i, at = 0;
    json_t *m;
    json_array_foreach(ms, i, m) if (!strcmp(json_string_value(json_object_get(m, "role")), "system")) {
        at = i;
        break;
    }
    m = json_array_get(ms, at);
    const char *old = json_string_value(json_object_get(m, "content"));
    llm_strbuf b = {0};
    llm_strbuf_printf(&b, "%s%s%s", ins ? ins : "", old && *old ? "\n\n" : "", old ? old : "");
    char *s = ins ? llm_strbuf_take(&b) : NULL;
    llm_strbuf_free(&b);
    int bad = !s || json_object_set_new(m, "content", json_string(s));
    free(s);
    free(ins);
    return bad ? srv_fail(e, 503, NULL, "out of memory") : 0;
}

/* The messages as the template gets them (a new array), or NULL with e set. */
static json_t *flat_messages(json_t *ms, const llm_tools *t, int generic, srv_err *e)
{
    size_t n = json_is_array(ms) ? json_array_size(ms) : 0;
    if (n == 0 || n > 4096) {
        srv_err_set(e, 400, "messages", "'messages' must be a non-empty array (at most 4096)");
        return NULL;
    }
    json_t *out = json_array();
    if (!out)
        return srv_err_set(e, 503, NULL, "out of memory"), NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *m = flat_message(json_array_get(ms, i), i, generic, e);
        if (!m || json_array_append_new(out, m)) {
            if (m)
                srv_err_set(e, 503, NULL, "out of memory");
            json_decref(out);
            return NULL;
        }
    }
    if (generic && t && t->choice != LLM_TOOL_NONE && add_instructions(out, t, e)) {
        json_decref(out);
        return NULL;
    }
    return out;
}

static char *render_family(const srv_chat *c, json_t *ms, llm_span **spans, int *n_spans, srv_err *e)
{
    size_t n = json_array_size(ms);
    llm_chat_msg *msgs = calloc(n, sizeof *msgs);
    if (!msgs) {
        srv_err_set(e, 503, NULL, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(ms, i);
        msgs[i].role = json_string_value(json_object_get(m, "role"));
        msgs[i].content = json_string_value(json_object_get(m, "content"));
    }
    llm_error err = {0};
    char *text = llm_chat_render_spans(c->family, msgs, (int)n, spans, n_spans, &err);
    free(msgs);
    if (!text)
        srv_err_set(e, err.code == LLM_ERR_NOMEM ? 503 : 400, "messages", "%s", err.msg);
    return text;
}

/* A render's leading bos_token goes when the tokenizer adds its own. */
static void drop_bos(const srv_chat *c, char *text, llm_span *sp, int n_sp)
{
    size_t k = strlen(c->bos);
    if (!c->drop_bos || strncmp(text, c->bos, k) || (n_sp > 0 && sp[0].start < k))
        return;
    memmove(text, text + k, strlen(text + k) + 1);
    for (int i = 0; i < n_sp; i++) {
        sp[i].start -= k;
        sp[i].end -= k;
    }
}

static char *render_jinja(const srv_chat *c, json_t *body, json_t *ms, size_t body_bytes, const llm_tools *t,
                          llm_span **spans, int *n_spans, srv_err *e)
{
    json_t *agp = json_object_get(body, "add_generation_prompt"), *kw = json_object_get(body, "chat_template_kwargs");
    json_t *tools = t && t->choice != LLM_TOOL_NONE && c->tools != LLM_TOOLS_GENERIC ? t->tools : NULL;
    if ((agp && !json_is_boolean(agp)) || (kw && !json_is_object(kw) && !json_is_null(kw))) {
        srv_err_set(e, 400, agp && !json_is_boolean(agp) ? "add_generation_prompt" : "chat_template_kwargs",
                    "'%s' must be %s", agp && !json_is_boolean(agp) ? "add_generation_prompt" : "chat_template_kwargs",
                    agp && !json_is_boolean(agp) ? "a boolean" : "an object");
        return NULL;
    }
    static const char *const own[] = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"};
    for (size_t i = 0; json_is_object(kw) && i < sizeof own / sizeof *own; i++)
        if (json_object_get(kw, own[i])) /* the server's own variables (tools would skip their checks) */
            return srv_err_set(e, 400, "chat_template_kwargs", "chat_template_kwargs may not set '%s'", own[i]), NULL;
    /* a render holds its values and text: room for templates that copy the request a few times over */
    llm_jinja_limits lim = {.max_bytes = ((size_t)16 << 20) + 16 * body_bytes};
    llm_jctx *jc = llm_jctx_new(&lim);
    llm_error err = {0};
    llm_jv *vars = jc ? srv_chat_vars(jc, ms, tools,
                                      !agp || json_is_true(agp), c->bos, c->eos, kw, &err)
                      : NULL;
    char *text = vars ? llm_jinja_render(c->tmpl, jc, vars, NULL, spans, n_spans, &err) : NULL;
    llm_jctx_free(jc);
    if (!jc)
        srv_err_set(e, 503, NULL, "out of memory");
    else if (!text)
        srv_err_set(e, err.code == LLM_ERR_NOMEM ? 503 : 400, "messages", "chat template: %s", err.msg);
    return text;
}

char *srv_chat_render(const srv_chat *c, json_t *body, size_t body_len, const llm_tools *t, llm_span **spans,
                      int *n_spans, srv_err *e)
{
    *spans = NULL;
    *n_spans = 0;
    int generic = !c->tmpl || c->tools == LLM_TOOLS_GENERIC;
    json_t *ms = flat_messages(json_object_get(body, "messages"), t, generic, e);
    if (!ms)
        return NULL;
    char *text = c->tmpl ? render_jinja(c, body, ms, body_len, t, spans, n_spans, e)
                         : render_family(c, ms, spans, n_spans, e);
    json_decref(ms);
    if (text)
        drop_bos(c, text, *spans, *n_spans);
    return text;
}
