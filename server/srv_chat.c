/* srv_chat.c - chat requests as Jinja template variables (see srv_chat.h). */
#include <string.h>

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
