/* srv_api.c - OpenAI request bodies to engine requests, with validation
 * that names the field at fault, and the error body. Completions take
 * `prompt` as a string, a one-element array of strings, or token ids. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm/chat.h"
#include "llm/gbnf.h"
#include "llm/json.h"
#include "llm/schema.h"
#include "llm/strbuf.h"
#include "srv.h"
#include "srv_fields.h"

void srv_err_set(srv_err *e, int status, const char *param, const char *fmt, ...)
{
    va_list ap;
    e->status = status;
    e->type = status == 429 ? "rate_limit_error" : status >= 500 ? "server_error" : status == 404 ? "not_found_error"
            : status == 401 ? "authentication_error" : "invalid_request_error";
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    for (char *c = e->msg; *c; c++) /* a client's bytes may be in it: the JSON error body needs valid UTF-8 */
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
            *c = '?';
    va_end(ap);
}

char *srv_json_text(const json_t *j)
{
    if (!j)
        return NULL;
    llm_json_oom_reset();
    char *s = json_dumps(j, JSON_COMPACT);
    if (s && llm_json_oom()) { /* jansson 2.14 drops an object key it could not append, and goes on */
        free(s);
        s = NULL;
    }
    return s;
}

json_t *srv_json_parse(const char *body, size_t len, srv_err *e)
{
    llm_error err = {0};
    json_t *o = llm_json_load(body, len, JSON_REJECT_DUPLICATES, NULL, &err);
    if (!o && err.code == LLM_ERR_NOMEM)
        srv_err_set(e, 503, NULL, "out of memory while parsing the body");
    else if (!o && err.code == LLM_ERR_QUEUE_FULL) {
        /* 429, not 503: a router must not take one tenant's large bodies for the pod's state, pass the pod by and
         * hand the same bodies to the next one */
        srv_err_set(e, 429, NULL, "%s", err.msg);
        e->retry_s = 1;
    } else if (!o)
        srv_err_set(e, 400, NULL, "the body: %s", err.msg);
    return o;
}


json_t *srv_json_object(const char *body, size_t len, srv_err *e)
{
    json_t *o = srv_json_parse(body, len, e);
    if (o && !json_is_object(o)) {
        srv_err_set(e, 400, NULL, "the body must be a JSON object");
        json_decref(o);
        o = NULL;
    }
    return o;
}

char *srv_err_body(const srv_err *e)
{
    json_t *j = json_pack("{s:{s:s,s:s,s:o,s:n}}", "error", "message", e->msg, "type", e->type, "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code");
    char *s = srv_json_text(j);
    json_decref(j);
    return s;
}

int srv_status_of(llm_status st)
{
    switch (st) {
    case LLM_ERR_QUEUE_FULL: return 429;
    case LLM_ERR_SHUTDOWN: return 503;
    case LLM_ERR_INVALID_ARG: case LLM_ERR_TOO_LONG: case LLM_ERR_KV_FULL: case LLM_ERR_GRAMMAR: return 400;
    case LLM_ERR_NOMEM: return 503;
    default: return 500;
    }
}

int srv_fail(srv_err *e, int status, const char *param, const char *fmt, ...)
{
    char msg[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    srv_err_set(e, status, param, "%s", msg);
    return -1;
}

int srv_fail_from(srv_err *e, const llm_error *err, const char *param)
{
    int nomem = err->code == LLM_ERR_NOMEM;
    return srv_fail(e, nomem ? 503 : 400, err->field[0] ? err->field : param, "%s", err->msg);
}

/* ---- typed fields ------------------------------------------------------------ */

/* A number field in [lo, hi], or absent (out unchanged). 0 ok, -1 error set. */
static int num_field(json_t *o, const char *k, double lo, double hi, double *out, srv_err *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v)) {
        srv_err_set(e, 400, k, "'%s' must be a number", k);
        return -1;
    }
    double d = json_number_value(v);
    if (!(d >= lo && d <= hi)) {
        srv_err_set(e, 400, k, "'%s' is %g; it must be in [%g, %g]", k, d, lo, hi);
        return -1;
    }
    *out = d;
    return 0;
}

int srv_int_field(json_t *o, const char *k, long lo, long hi, long *out, srv_err *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v)) {
        srv_err_set(e, 400, k, "'%s' must be an integer", k);
        return -1;
    }
    long long d = json_integer_value(v);
    if (d < lo || d > hi) {
        srv_err_set(e, 400, k, "'%s' is %lld; it must be in [%ld, %ld]", k, d, lo, hi);
        return -1;
    }
    *out = (long)d;
    return 0;
}

static int bool_field(json_t *o, const char *k, int *out, srv_err *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v)) {
        srv_err_set(e, 400, k, "'%s' must be true or false", k);
        return -1;
    }
    *out = json_is_true(v);
    return 0;
}

/* ---- the request ---------------------------------------------------------------- */

static int parse_sampling(json_t *o, llm_request *rq, srv_err *e)
{
    llm_sampling *p = &rq->sampling;
    double t = 1, top_p = 1, min_p = 0, pres = 0, freq = 0, rep = 1;
    long top_k = 0, seed = -1, n = 1, prio = 0;
    if (num_field(o, "temperature", 0, 2, &t, e) || num_field(o, "top_p", 0, 1, &top_p, e) ||
        num_field(o, "min_p", 0, 1, &min_p, e) || num_field(o, "presence_penalty", -2, 2, &pres, e) ||
        num_field(o, "frequency_penalty", -2, 2, &freq, e) || num_field(o, "repetition_penalty", 0.01, 10, &rep, e) ||
        srv_int_field(o, "top_k", -1, 1 << 30, &top_k, e) || srv_int_field(o, "seed", -(1L << 62), 1L << 62, &seed, e) ||
        srv_int_field(o, "n", 1, LLM_MAX_N, &n, e) || srv_int_field(o, "priority", -1000000, 1000000, &prio, e))
        return -1;
    if (!((float)top_p > 0)) { /* 1e-320 is > 0, but not as the engine's float */
        srv_err_set(e, 400, "top_p", "'top_p' must be greater than 0 (and at least 1e-45, a float's least)");
        return -1;
    }
    p->temperature = (float)t;
    p->top_p = (float)top_p;
    p->min_p = (float)min_p;
    p->presence_penalty = (float)pres;
    p->frequency_penalty = (float)freq;
    p->repetition_penalty = (float)rep;
    p->top_k = top_k < 0 ? 0 : (int)top_k;
    /* no seed: a fresh one, so repeated requests differ as OpenAI's do */
    p->seed = seed >= 0 ? (uint64_t)seed : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20) ^ (uint64_t)(uintptr_t)rq;
    rq->n = (int)n;
    rq->priority = (int)prio;
    return 0;
}

static int parse_stop(json_t *o, srv_completion *c, srv_err *e)
{
    json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v))
        return 0;
    if (json_is_string(v)) {
        c->stops[0] = json_string_value(v);
        c->rq.n_stop = 1;
    } else if (json_is_array(v) && json_array_size(v) <= LLM_MAX_STOPS) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (!json_is_string(json_array_get(v, i))) {
                srv_err_set(e, 400, "stop", "'stop' must be a string or an array of strings");
                return -1;
            }
            c->stops[c->rq.n_stop++] = json_string_value(json_array_get(v, i));
        }
    } else {
        srv_err_set(e, 400, "stop", "'stop' must be a string or an array of at most %d strings", LLM_MAX_STOPS);
        return -1;
    }
    for (int i = 0; i < c->rq.n_stop; i++)
        if (!c->stops[i][0] || strlen(c->stops[i]) > LLM_MAX_STOP_LEN) {
            srv_err_set(e, 400, "stop", "stop strings must have 1 to %d bytes", LLM_MAX_STOP_LEN);
            return -1;
        }
    c->rq.stop = c->stops;
    return 0;
}

/* prompt: a string, [string], or [int, ...]. */
static int parse_prompt(json_t *o, srv_completion *c, srv_err *e)
{
    json_t *p = json_object_get(o, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        c->rq.text = json_string_value(p);
        return 0;
    }
    size_t n = json_is_array(p) ? json_array_size(p) : 0;
    if (n == 0) {
        srv_err_set(e, 400, "prompt", "'prompt' must be a non-empty string or an array of token ids (one prompt per request)");
        return -1;
    }
    if (!(c->ids = malloc(sizeof(int32_t) * n))) {
        srv_err_set(e, 503, NULL, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(p, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) > INT32_MAX) {
            srv_err_set(e, 400, "prompt", "'prompt' array item %zu is not a token id", i);
            return -1;
        }
        c->ids[i] = (int32_t)json_integer_value(t);
    }
    c->rq.tokens = c->ids;
    c->rq.n_tokens = (int)n;
    return 0;
}

/* A text of len bytes that cannot fit the context in any tokenization
 * (llm_vocab_min_tokens) is refused before the tokenizer spends time on
 * it: 0, or -1 with e set (400 naming param). */
static int fits_context(const srv *s, const llm_vocab *v, size_t len, const char *param, srv_err *e)
{
    size_t least = llm_vocab_min_tokens(v, len);
    if (!s->n_ctx || least <= (size_t)s->n_ctx) /* (no n_ctx: parsing alone, in tests; the engine checks it too) */
        return 0;
    return srv_fail(e, 400, param, "the %s of %zu bytes is at least %zu tokens; the context holds %d",
                    strcmp(param, "prompt") ? "rendered chat" : "prompt", len, least, s->n_ctx);
}

/* The rendered chat as token ids: the template's markup as control
 * tokens, the messages' contents as plain text (llm_tokenize_guarded). */
static int chat_tokens(const srv *s, const llm_vocab *v, const llm_span *sp, int n_sp, srv_completion *c, srv_err *e)
{
    llm_error err = {0};
    int n = 0;
    if (fits_context(s, v, strlen(c->prompt), "messages", e))
        return -1;
    if (llm_tokenize_guarded(v, c->prompt, strlen(c->prompt), 1, sp, n_sp, &c->ids, &n, &err)) {
        srv_err_set(e, err.code == LLM_ERR_NOMEM ? 503 : 400, "messages", "%s", err.msg);
        return -1;
    }
    c->rq.tokens = c->ids;
    c->rq.n_tokens = n;
    c->rq.text = NULL;
    return 0;
}

/* A whole answer is built in memory before it is sent: refuse one whose
 * size could pass max_answer_bytes, from the request alone. Per token: its
 * text, about 64 bytes; each logprob entry about 1 KiB, which is what one
 * costs as jansson objects (a token with 20 alternatives measured 17.9 KiB
 * of heap) before it is printed. max_tokens unset means up to the context. */
static int answer_too_big(const srv *s, const srv_completion *c, srv_err *e)
{
    double tokens = c->rq.max_tokens ? c->rq.max_tokens : s->cfg.n_ctx ? s->cfg.n_ctx : 4096;
    double per = 64 + (c->n_logprobs >= 0 ? 1024.0 * (1 + c->n_logprobs) : 0);
    double est = (c->rq.n > 0 ? c->rq.n : 1) * tokens * per;
    if (est <= (double)s->cfg.max_answer_bytes)
        return 0;
    srv_err_set(e, 400, c->n_logprobs > 0 ? "top_logprobs" : c->rq.n > 1 ? "n" : "max_tokens",
                "a whole answer of n %d x %.0f tokens%s could reach %.0f MiB, over max_answer_bytes (%.0f MiB): "
                "lower n, max_tokens or the logprobs%s", c->rq.n > 0 ? c->rq.n : 1, tokens,
                c->n_logprobs >= 0 ? " with logprobs" : "", est / 1048576, (double)s->cfg.max_answer_bytes / 1048576,
                c->stream ? " (a stream with tools is held until its calls are known)" : ", or stream it");
    return 1;
}

/* tools, tool_choice: a forced call (required, named) opens the answer
 * (tool_prefill, after the rendered prompt) and follows a grammar. */
static int parse_tools(const srv_chat *chat, json_t *o, srv_completion *c, srv_err *e)
{
    llm_error err = {0};
    if (llm_tools_parse(o, chat->tools, &c->tools, &err))
        return srv_fail_from(e, &err, "tools");
    if (c->tools.choice < LLM_TOOL_REQUIRED) {
        if (llm_tools_shows_markers(&c->tools)) { /* the answer carries the markers' text for its calls */
            _Static_assert(sizeof c->rq.shown >= sizeof chat->markers, "every marker fits");
            memcpy(c->rq.shown, chat->markers, sizeof chat->markers);
            c->rq.n_shown = chat->n_markers;
        }
        return 0;
    }
    if (c->rq.grammar)
        return srv_fail(e, 400, "tool_choice", "a required or named tool call cannot be combined with '%s'",
                        c->grammar_param);
    if (llm_tools_forced(&c->tools, &c->tool_prefill, &c->schema_grammar, &err))
        return srv_fail_from(e, &err, "tools");
    c->rq.grammar = c->schema_grammar;
    c->rq.grammar_len = strlen(c->schema_grammar);
    c->grammar_param = "tools";
    return 0;
}

/* The rendered prompt and the forced call's opening after it. */
static int add_prefill(srv_completion *c, srv_err *e)
{
    if (!c->tool_prefill || !*c->tool_prefill)
        return 0;
    llm_strbuf b = {0};
    llm_strbuf_printf(&b, "%s%s", c->prompt, c->tool_prefill);
    char *p = llm_strbuf_take(&b);
    if (!p)
        return srv_fail(e, 503, NULL, "out of memory");
    free(c->prompt);
    c->prompt = p;
    return 0;
}

static int parse_messages(const srv *s, const srv_chat *chat, const llm_vocab *vocab, json_t *o, size_t body_len,
                          srv_completion *c, srv_err *e)
{
    llm_span *sp = NULL;
    int n_sp = 0;
    if (parse_tools(chat, o, c, e))
        return -1;
    /* a stream with tools is held in memory until its calls are known, like a whole answer */
    if (c->stream && c->tools.choice != LLM_TOOL_NONE && answer_too_big(s, c, e))
        return -1;
    if (!(c->prompt = srv_chat_render(chat, o, body_len, &c->tools, &sp, &n_sp, e)))
        return -1;
    if (add_prefill(c, e)) {
        free(sp);
        return -1;
    }
    c->rq.text = c->prompt;
    int rc = vocab ? chat_tokens(s, vocab, sp, n_sp, c, e) : 0;
    free(sp);
    return rc;
}


int srv_check_envelope(srv *s, json_t *o, const char **cache_salt, srv_lora_ent **lora, srv_err *e)
{
    json_t *m = json_object_get(o, "model"), *salt = json_object_get(o, "cache_salt"), *u = json_object_get(o, "user");
    const char *name = json_string_value(m);
    *lora = NULL;
    if (m && !json_is_null(m) && (!name || strlen(name) != json_string_length(m)))
        return srv_fail(e, 400, "model", "'model' must be a string");
    if (name && strcmp(name, s->name) && !(*lora = srv_lora_pin(&s->loras, name)))
        return srv_fail(e, 404, "model", "model '%s' is not served here (this server has '%s'%s)", name, s->name,
                        s->loras.max ? " and the adapters /v1/models lists" : "");
    if (salt && !json_is_null(salt) &&
        (!json_is_string(salt) || json_string_length(salt) < 1 || json_string_length(salt) > 256))
        return srv_fail(e, 400, "cache_salt", "'cache_salt' must be a string of 1 to 256 bytes");
    if (u && !json_is_null(u) && !json_is_string(u))
        return srv_fail(e, 400, "user", "'user' must be a string");
    *cache_salt = json_string_value(salt);
    return 0;
}

static int parse_common(srv *s, json_t *o, srv_completion *c, srv_err *e)
{
    c->lora_table = &s->loras;
    if (srv_check_envelope(s, o, &c->cache_salt, &c->lora, e))
        return -1;
    if (c->lora)
        c->rq.lora = c->lora->l, c->rq.lora_scale = c->lora->scale;
    long max_tokens = c->chat ? 0 : 16, logprobs = -1; /* OpenAI's defaults: 16, and none for chat */
    json_t *opts = json_object_get(o, "stream_options");
    if (srv_int_field(o, c->chat ? "max_completion_tokens" : "max_tokens", 1, 1 << 24, &max_tokens, e) ||
        (c->chat && srv_int_field(o, "max_tokens", 1, 1 << 24, &max_tokens, e)) || bool_field(o, "stream", &c->stream, e) ||
        bool_field(o, "echo", &c->echo, e) || bool_field(o, "ignore_eos", &c->rq.ignore_eos, e) ||
        parse_sampling(o, &c->rq, e) || parse_stop(o, c, e))
        return -1;
    int guess = 1; /* false: this request opts out of the server's speculative decoding (same answer either way) */
    if (bool_field(o, "speculative", &guess, e))
        return -1;
    c->rq.no_speculate = !guess;
    if (!c->chat && srv_int_field(o, "logprobs", 0, LLM_MAX_LOGPROBS, &logprobs, e))
        return -1;
    long plp = -1;
    if (srv_int_field(o, "prompt_logprobs", 0, LLM_MAX_LOGPROBS, &plp, e))
        return -1;
    if (plp >= 0 && c->stream)
        return srv_fail(e, 400, "prompt_logprobs", "'prompt_logprobs' is answered whole: not with stream");
    c->rq.prompt_logprobs = plp >= 0, c->rq.prompt_top = plp >= 0 ? (int)plp : 0;
    if (c->chat) {
        int want = 0;
        long top = 0;
        if (bool_field(o, "logprobs", &want, e) || srv_int_field(o, "top_logprobs", 0, LLM_MAX_LOGPROBS, &top, e))
            return -1;
        logprobs = want ? top : -1;
    }
    if (opts && !json_is_null(opts) && (!json_is_object(opts) || bool_field(opts, "include_usage", &c->include_usage, e))) {
        if (!json_is_object(opts))
            srv_err_set(e, 400, "stream_options", "'stream_options' must be an object");
        return -1;
    }
    if (c->echo) {
        srv_err_set(e, 400, "echo", "'echo' is not supported");
        return -1;
    }
    c->rq.max_tokens = (int)max_tokens;
    c->n_logprobs = (int)logprobs;
    if (!c->stream && answer_too_big(s, c, e))
        return -1;
    if (logprobs >= 0) {
        c->rq.sampling.logprobs = 1;
        c->rq.sampling.n_logprobs = (int)logprobs;
    }
    return 0;
}

/* logit_bias: {"token id": bias in [-100, 100], ...}; ids are checked
 * against the vocabulary by the engine (its error names the token). */
static int parse_logit_bias(json_t *o, const llm_vocab *vocab, srv_completion *c, srv_err *e)
{
    json_t *b = json_object_get(o, "logit_bias"), *v;
    const char *k;
    if (!b || json_is_null(b))
        return 0;
    size_t n = json_is_object(b) ? json_object_size(b) : 0;
    if (!json_is_object(b) || n > LLM_MAX_LOGIT_BIAS) {
        srv_err_set(e, 400, "logit_bias", "'logit_bias' must be an object of at most %d token ids to biases",
                    LLM_MAX_LOGIT_BIAS);
        return -1;
    }
    if (n && !(c->bias = calloc(n, sizeof *c->bias))) {
        srv_err_set(e, 503, "logit_bias", "no memory for the logit biases");
        return -1;
    }
    json_object_foreach(b, k, v) {
        char *end = NULL;
        errno = 0;
        long id = strtol(k, &end, 10);
        double x = json_number_value(v);
        if (!*k || *end || errno || id < 0 || id > INT32_MAX || *k < '0' || *k > '9' || (*k == '0' && k[1])) {
            /* canonical decimals only: "7" and "007" must not both bias token 7 */
            srv_err_set(e, 400, "logit_bias", "logit_bias key '%.32s' is not a token id", k);
            return -1;
        }
        if (vocab && id >= llm_vocab_n(vocab)) {
            srv_err_set(e, 400, "logit_bias", "logit_bias names token %ld, not in [0, %d)", id, llm_vocab_n(vocab));
            return -1;
        }
        if (!json_is_number(v) || !(x >= -100 && x <= 100)) {
            srv_err_set(e, 400, "logit_bias", "logit_bias for token %ld must be a number in [-100, 100]", id);
            return -1;
        }
        c->bias[c->rq.sampling.n_bias++] = (llm_logit_bias){(int32_t)id, (float)x};
    }
    c->rq.sampling.bias = c->bias;
    return 0;
}

/* response_format json_schema: {"json_schema": {"name": ..., "schema":
 * {...}, "strict": ...}}; the schema becomes a grammar (llm/schema.h; it
 * is always followed strictly). */
static int parse_json_schema(json_t *rf, srv_completion *c, srv_err *e)
{
    json_t *js = json_object_get(rf, "json_schema"), *schema = json_object_get(js, "schema");
    if (!json_is_object(js) || !(json_is_object(schema) || json_is_true(schema)))
        return srv_err_set(e, 400, "response_format", "response_format json_schema needs \"json_schema\": {\"schema\": {...}}"),
               -1;
    llm_error err = {0};
    if (llm_schema_grammar(schema, &c->schema_grammar, &err))
        return srv_fail_from(e, &err, "response_format");
    c->rq.grammar = c->schema_grammar;
    c->rq.grammar_len = strlen(c->schema_grammar);
    c->grammar_param = "response_format";
    return 0;
}

/* response_format (json_object: the JSON grammar's object rule) and the
 * llama.cpp extension "grammar" (GBNF text) become the request's grammar;
 * the engine compiles it, and its errors name the field (grammar_param). */
static int parse_constraint(json_t *o, srv_completion *c, srv_err *e)
{
    json_t *rf = json_object_get(o, "response_format"), *gr = json_object_get(o, "grammar");
    const char *type = json_string_value(json_object_get(rf, "type"));
    int has_rf = rf && !json_is_null(rf) && !(type && !strcmp(type, "text"));
    if (rf && !json_is_null(rf) && !json_is_object(rf))
        return srv_fail(e, 400, "response_format", "'response_format' must be an object");
    if (gr && !json_is_null(gr) && (!json_is_string(gr) || json_string_length(gr) > LLM_GBNF_MAX_BYTES))
        return srv_fail(e, 400, "grammar", "'grammar' must be a string of at most %u bytes", LLM_GBNF_MAX_BYTES);
    if (has_rf && json_is_string(gr))
        return srv_fail(e, 400, "grammar", "'grammar' and 'response_format' cannot both be given");
    if (json_is_string(gr)) {
        c->rq.grammar = json_string_value(gr);
        c->rq.grammar_len = json_string_length(gr);
        c->grammar_param = "grammar";
        return 0;
    }
    if (!has_rf)
        return 0;
    if (type && !strcmp(type, "json_schema"))
        return parse_json_schema(rf, c, e);
    if (!type || strcmp(type, "json_object"))
        return srv_fail(e, 400, "response_format",
                           "response_format type '%.32s' is not supported (text, json_object, json_schema)",
                           type ? type : "(none)");
    c->rq.grammar = llm_gbnf_json;
    c->rq.grammar_len = strlen(llm_gbnf_json);
    c->rq.grammar_root = "jsonobject";
    c->grammar_param = "response_format";
    return 0;
}

/* Fields whose effect is not built refuse any value that asks for it
 * (srv_fields.h: nothing is silently ignored). */
static int parse_unbuilt(json_t *o, srv_completion *c, srv_err *e)
{
    json_t *mod = json_object_get(o, "modalities");
    json_t *bo = json_object_get(o, "best_of"), *suf = json_object_get(o, "suffix");
    if (mod && !json_is_null(mod) &&
        !(json_is_array(mod) && json_array_size(mod) == 1 && json_is_string(json_array_get(mod, 0)) &&
          !strcmp(json_string_value(json_array_get(mod, 0)), "text")))
        return srv_fail(e, 400, "modalities", "only the \"text\" modality is supported");
    if (bo && !json_is_null(bo) && !(json_is_integer(bo) && json_integer_value(bo) == (c->rq.n ? c->rq.n : 1)))
        return srv_fail(e, 400, "best_of", "'best_of' other than n is not supported");
    if (suf && !json_is_null(suf) && !(json_is_string(suf) && json_string_length(suf) == 0))
        return srv_fail(e, 400, "suffix", "'suffix' (insertion) is not supported");
    return 0;
}

/* /generate: the prompt is "text", a string. */
static int parse_text(json_t *o, srv_completion *c, srv_err *e)
{
    json_t *t = json_object_get(o, "text");
    if (!json_is_string(t)) {
        srv_err_set(e, 400, "text", "'text' must be a string");
        return -1;
    }
    if (c->stream) {
        srv_err_set(e, 400, "stream", "/generate does not stream; use /v1/completions");
        return -1;
    }
    c->rq.text = json_string_value(t);
    return 0;
}

/* prompt_logprobs' answer (an entry of up to top + 1 tokens per prompt
 * token: at most its bytes + 2 of a text prompt, or the context's) within
 * max_answer_bytes, at 1 KiB a listed token as answer_too_big counts a
 * logprob: its JSON object while built (~650 bytes) and its text, whose
 * decoded_token may be a long piece. */
static int prompt_lp_fits(const srv *s, const srv_completion *c, srv_err *e)
{
    if (!c->rq.prompt_logprobs)
        return 0;
    double ctx = s->cfg.n_ctx ? (double)s->cfg.n_ctx : (double)s->model->hp.n_ctx_train;
    double tokens = c->rq.tokens ? c->rq.n_tokens : c->rq.text ? (double)strlen(c->rq.text) + 2 : ctx;
    double est = (tokens < ctx ? tokens : ctx) * (1 + c->rq.prompt_top) * 1024;
    if (est <= (double)s->cfg.max_answer_bytes)
        return 0;
    return srv_fail(e, 400, "prompt_logprobs",
                    "prompt_logprobs %d over a prompt of up to %.0f tokens could reach %.0f MiB, over max_answer_bytes "
                    "(%.0f MiB): lower it, or send less text", c->rq.prompt_top, tokens, est / 1048576,
                    (double)s->cfg.max_answer_bytes / 1048576);
}

int srv_parse_completion(srv *s, const srv_chat *chat, const llm_vocab *vocab, const char *body, size_t len, int kind,
                         srv_completion *c, srv_err *e)
{
    memset(c, 0, sizeof *c);
    c->chat = kind == SRV_FIELDS_CHAT;
    c->generate = kind == SRV_FIELDS_GENERATE;
    int is_chat = c->chat;
    c->rq.sampling = llm_sampling_default();
    if (!(c->root = srv_json_object(body, len, e)))
        return -1;
    if (srv_fields_check(c->root, kind, e) || parse_common(s, c->root, c, e) || parse_logit_bias(c->root, vocab, c, e) ||
        parse_constraint(c->root, c, e) || parse_unbuilt(c->root, c, e))
        return -1;
    if (c->generate)
        return parse_text(c->root, c, e);
    if (is_chat)
        return parse_messages(s, chat, vocab, c->root, len, c, e) || prompt_lp_fits(s, c, e) ? -1 : 0;
    if (parse_prompt(c->root, c, e) || (c->rq.text && vocab && fits_context(s, vocab, strlen(c->rq.text), "prompt", e)))
        return -1;
    return prompt_lp_fits(s, c, e);
}

void srv_completion_free(srv_completion *c)
{
    if (c->lora_table)
        srv_lora_unpin(c->lora_table, c->lora);
    json_decref(c->root);
    free(c->prompt);
    free(c->ids);
    free(c->bias);
    free(c->schema_grammar);
    free(c->tool_prefill);
    memset(c, 0, sizeof *c);
}

int srv_parse_admin(json_t *req, const char **path, const char **sha, int *weight, srv_err *e)
{
    json_t *m = json_object_get(req, "model"), *h = json_object_get(req, "sha256"), *w = json_object_get(req, "weight");
    *path = json_string_value(m);
    *sha = json_string_value(h);
    if (!json_is_object(req) || (m && !json_is_null(m) && (!*path || **path != '/' || strlen(*path) >= 4096)))
        srv_err_set(e, 400, "model", "'model' must be an absolute path to a GGUF file, or null to unload");
    else if (h && !json_is_null(h) && (!*sha || strlen(*sha) != 64 || strspn(*sha, "0123456789abcdefABCDEF") != 64))
        srv_err_set(e, 400, "sha256", "'sha256' must be 64 hex digits");
    else if (w && (!json_is_integer(w) || json_integer_value(w) < 0 || json_integer_value(w) > 100))
        srv_err_set(e, 400, "weight", "'weight' must be an integer 0..100");
    *weight = w ? (int)json_integer_value(w) : -1;
    return e->status;
}
