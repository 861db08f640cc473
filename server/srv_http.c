/* srv_http.c - llm-server's routes on civetweb: OpenAI completions
 * (streamed as Server-Sent Events or whole), models, tokenize/detokenize,
 * /generate, probes and /metrics. Each handler runs on a civetweb worker
 * thread and talks to the engine only through engine.h. */
#include <civetweb.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "http_guard.h"
#include "http_probe.h"
#include "http_reply.h"
#include "srv.h"
#include "srv_embed.h"
#include "srv_fields.h"
#include "llm/clock.h"
#include "llm/heap.h"
#include "llm/json.h"
#include "llm/strbuf.h"
#include "llm/utf8.h"

/* A body refused unread is read and dropped, up to this many times
 * max_body_bytes within DISCARD_S seconds, so the client reads the answer. */
enum { DISCARD_BODIES = 4, DISCARD_S = 2 };

enum { R_COMPLETIONS, R_CHAT, R_MODELS, R_GENERATE, R_TOKENIZE, R_DETOKENIZE, R_METRICS, R_PROBES, R_ROOT, R_OTHER,
       R_EMBEDDINGS };


/* Sends j (consumed) as the answer; NULL (a body that could not be
 * built) sends 503 with SRV_OOM_BODY. */
int srv_http_send_json(struct mg_connection *c, int status, json_t *j)
{
    char *s = srv_json_text(j); /* NULL: a body could not be built or printed */
    int rc = http_reply_text(c, s ? status : 503, "application/json", s ? s : SRV_OOM_BODY, NULL);
    free(s);
    json_decref(j);
    return rc;
}

/* A 429 always says when to retry; a 503 only when the whole server is
 * not taking requests now (loading, draining: e->retry_s set), which tells
 * a router to pass this pod by - a 503 for one request's trouble (its
 * memory) has none, so a router hands it to the client. */
int srv_http_send_err(struct mg_connection *c, const srv_err *e)
{
    char *body = srv_err_body(e), retry[40];
    snprintf(retry, sizeof retry, "Retry-After: %d\r\n", e->retry_s > 1 ? e->retry_s : 1);
    int says_retry = e->status == 429 || (e->status == 503 && e->retry_s > 0);
    int rc = http_reply_text(c, e->status, "application/json", body ? body : "{}",
                       says_retry ? retry : e->status == 401 ? "WWW-Authenticate: Bearer\r\n" : NULL);
    free(body);
    return rc;
}

/* ---- request bodies and access ------------------------------------------------ */

/* Reads the whole body, at most max_body_bytes within body_timeout_s in
 * all; 0 or an error status with e set. */
static int read_body(const srv *s, struct mg_connection *c, char **out, size_t *len, srv_err *e)
{
    char msg[256];
    size_t max = (size_t)s->cfg.max_body_bytes;
    double seconds = (double)s->cfg.body_timeout_s;
    int st = http_guard_read_body(c, max, seconds, out, len);
    if (st) /* the message names the setting that set the bound */
        srv_err_set(e, st, NULL, "%s%s", http_guard_body_msg(st, max, seconds, msg, sizeof msg),
                    st == 413 ? " (max_body_bytes)" : st == 408 ? " (body_timeout_s)" : "");
    return st;
}

/* The key the request presents (NULL without keys, or when it names none). */
static const api_key *presented(const srv *s, struct mg_connection *c)
{
    return s->keys.n ? api_keys_find(&s->keys, mg_get_header(c, "Authorization")) : NULL;
}

/* The tenant a gateway's request names (X-LLM-Tenant), or NULL: from a
 * gateway=1 key alone (api_gate refuses the header from any other). */
static const char *forwarded(const api_key *key, struct mg_connection *c)
{
    const char *t = key && key->gateway ? mg_get_header(c, "X-LLM-Tenant") : NULL;
    return t && api_keys_tenant_ok(t, strlen(t)) ? t : NULL;
}

const api_key *srv_http_caller(const srv *s, struct mg_connection *c)
{
    const api_key *key = presented(s, c), *own;
    const char *t = forwarded(key, c);
    return t && (own = api_keys_tenant(&s->keys, t)) ? own : key;
}

const char *srv_http_tenant(const srv *s, struct mg_connection *c)
{
    const api_key *key = presented(s, c);
    const char *t = forwarded(key, c);
    return t ? t : key ? key->tenant : NULL;
}

/* Common gate of the API routes: method, phase, key. 0 to go on. */
static int api_gate(srv *s, struct mg_connection *c, const char *method, srv_err *e)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    const api_key *key = NULL;
    const char *tenant = mg_get_header(c, "X-LLM-Tenant");
    double retry = 0;
    if (strcmp(ri->request_method, method))
        srv_err_set(e, 405, NULL, "use %s for %s", method, ri->local_uri);
    else if (s->keys.n && !(key = presented(s, c)))
        srv_err_set(e, 401, NULL, "a valid API key is required (Authorization: Bearer KEY)");
    else if (tenant && key && !key->gateway) /* a client naming a tenant (another's cache, caps) is refused */
        srv_err_set(e, 403, NULL, "X-LLM-Tenant is set only by a gateway (a key with gateway=1), not by this key");
    else if (tenant && key && !forwarded(key, c))
        srv_err_set(e, 400, NULL, "X-LLM-Tenant: 1 to %d printable characters without spaces, not key-<hex>",
                    API_KEY_MAX_LEN);
    else if (!api_keys_admit(&s->keys, key, llm_clock_mono_s(), &retry)) {
        srv_err_set(e, 429, NULL, "this API key (tenant '%s') is over its rate of %g requests/s; retry in %.1f s",
                    key->tenant, key->rate, retry);
        e->retry_s = retry < 3600 ? (int)ceil(retry) : 3600;
    }
    else if (atomic_load(&s->phase) != SRV_READY && (atomic_load(&s->phase) != SRV_DRAINING || atomic_load(&s->refusing))) {
        srv_err_set(e, 503, NULL, "%s", atomic_load(&s->phase) == SRV_LOADING ? "the model is still loading"
                                        : atomic_load(&s->phase) == SRV_DRAINING ? "the server is shutting down"
                                                                                 : "the model failed to load");
        e->retry_s = 1; /* the pod, not the request: Retry-After */
    } else
        return 0;
    return e->status;
}

/* ---- routes ---------------------------------------------------------------------- */

/* Runs an API route: gate, body, handler; counts it in the metrics. */
typedef int (*api_fn)(srv *s, struct mg_connection *c, const char *body, size_t len, srv_err *e);

static int api(srv *s, struct mg_connection *c, int route, const char *method, api_fn fn)
{
    srv_err e = {0};
    char *body = NULL;
    size_t len = 0;
    atomic_fetch_add(&s->active, 1);
    int status = api_gate(s, c, method, &e);
    if (!status && !strcmp(method, "POST") && !http_guard_json_body(c)) {
        srv_err_set(&e, 415, NULL, "a POST body must be Content-Type: application/json");
        status = 415;
    }
    if (!status && !strcmp(method, "POST"))
        status = read_body(s, c, &body, &len, &e);
    status = status ? srv_http_send_err(c, &e) : fn(s, c, body, len, &e);
    http_guard_discard(c, DISCARD_BODIES * s->cfg.max_body_bytes, DISCARD_S); /* refused before its body was read */
    free(body);
    llm_heap_after(len + llm_json_spent()); /* what a large body or a costly parse took goes back (a route runs on a
                                             * thread of its own: llm_json_spent is this request's) */
    srv_metrics_request(&s->metrics, route, status);
    atomic_fetch_sub(&s->active, 1);
    return status == 499 ? 200 : status; /* civetweb logs the status; the client is gone */
}

/* Injected faults (testing canaries and routers against a bad revision):
 * a delay, then a share of requests failing with 500. 1 when this one fails. */
static int injected_fault(srv *s, srv_err *e)
{
    if (s->cfg.fault_delay_ms > 0)
        usleep((useconds_t)s->cfg.fault_delay_ms * 1000);
    if (s->cfg.fault_error_ratio <= 0)
        return 0;
    static _Atomic unsigned long long n;
    /* deterministic spread: request k fails when the ratio's running total crosses an integer */
    unsigned long long k = atomic_fetch_add(&n, 1);
    double r = s->cfg.fault_error_ratio;
    if ((unsigned long long)((double)(k + 1) * r) == (unsigned long long)((double)k * r))
        return 0;
    srv_err_set(e, 500, NULL, "injected fault (fault_error_ratio %.2f)", r);
    return 1;
}

static int do_completion(srv *s, struct mg_connection *c, const char *body, size_t len, int kind, srv_err *e)
{
    /* one sequence of the tenant's cap before any parsing: a tenant at its
     * cap gets its 429 without a template rendered or a prompt tokenized */
    const api_key *key = srv_http_caller(s, c);
    int held = 1;
    if (srv_complete_tenant_take(s, key, 1, 0, e))
        return srv_http_send_err(c, e);
    srv_rev *rv = srv_canary_pick(s, mg_get_header(c, "X-Session-Id")); /* NULL: the stable model */
    srv_completion cp = {0};
    int bad = srv_parse_completion(s, rv ? rv->chat : s->chat, rv ? rv->model->vocab : s->model->vocab, body, len,
                                   kind, &cp, e);
    if (!bad && cp.lora && rv) { /* adapters are the stable model's: such a request is parsed again for it */
        srv_completion_free(&cp);
        srv_canary_release(rv);
        rv = NULL;
        bad = srv_parse_completion(s, s->chat, s->model->vocab, body, len, kind, &cp, e);
    }
    bad = bad || injected_fault(s, e); /* after the parse: a delayed request holds what it names (its adapter) */
    if (!bad)
        srv_lora_count_request(cp.lora);
    int status = bad ? srv_http_send_err(c, e) : srv_complete(s, rv, c, &cp, &held, e);
    api_keys_give(&s->keys, key, held);
    srv_completion_free(&cp);
    srv_metrics_revision(&s->metrics, rv != NULL, status);
    srv_canary_release(rv);
    return status;
}

static int fn_completions(srv *s, struct mg_connection *c, const char *b, size_t n, srv_err *e)
{
    return do_completion(s, c, b, n, SRV_FIELDS_COMPLETIONS, e);
}

static int fn_chat(srv *s, struct mg_connection *c, const char *b, size_t n, srv_err *e)
{
    return do_completion(s, c, b, n, SRV_FIELDS_CHAT, e);
}

static int fn_generate(srv *s, struct mg_connection *c, const char *b, size_t n, srv_err *e)
{
    return do_completion(s, c, b, n, SRV_FIELDS_GENERATE, e);
}

/* The base model, then each adapter with its parent (as vLLM lists them). */
static int fn_models(srv *s, struct mg_connection *c, const char *b, size_t n, srv_err *e)
{
    (void)b, (void)n, (void)e;
    json_t *j = json_pack("{s:s,s:[{s:s,s:s,s:I,s:s}]}", "object", "list", "data", "id", s->name, "object", "model",
                          "created", (json_int_t)s->created, "owned_by", "llm-k8s");
    if (j)
        srv_lora_models(&s->loras, s->name, s->created, json_object_get(j, "data"));
    return srv_http_send_json(c, 200, j);
}

static int fn_tokenize(srv *s, struct mg_connection *c, const char *b, size_t n, srv_err *e)
{
    json_t *o = srv_json_object(b, n, e), *t = o ? json_object_get(o, "content") : NULL;
    int add = 1;
    if (o && !t)
        t = json_object_get(o, "text");
    if (o && !json_is_string(t))
        srv_err_set(e, 400, "content", "'content' must be a string");
    json_t *a = json_object_get(o, "add_special");
    if (o && a && !json_is_boolean(a))
        srv_err_set(e, 400, "add_special", "'add_special' must be true or false");
    if (!o || e->status) {
        json_decref(o);
        return srv_http_send_err(c, e);
    }
    add = a ? json_is_true(a) : 1;
    int32_t *ids = NULL;
    int k = 0;
    llm_error err = {0};
    llm_status st = llm_tokenize(s->model->vocab, json_string_value(t), json_string_length(t), add, 1, &ids, &k, &err);
    json_decref(o);
    if (st) {
        srv_err_set(e, srv_status_of(st), "content", "%s", err.msg);
        return srv_http_send_err(c, e);
    }
    json_t *arr = json_array();
    for (int i = 0; arr && i < k; i++)
        if (json_array_append_new(arr, json_integer(ids[i]))) { /* no answer with ids missing */
            json_decref(arr);
            arr = NULL;
        }
    free(ids);
    return srv_http_send_json(c, 200, arr ? json_pack("{s:o}", "tokens", arr) : NULL);
}

static int fn_detokenize(srv *s, struct mg_connection *c, const char *b, size_t n, srv_err *e)
{
    json_t *o = srv_json_object(b, n, e), *t = o ? json_object_get(o, "tokens") : NULL;
    size_t k = json_is_array(t) ? json_array_size(t) : 0;
    int32_t *ids = o && json_is_array(t) ? malloc(sizeof(int32_t) * (k + 1)) : NULL;
    if (o && !json_is_array(t))
        srv_err_set(e, 400, "tokens", "'tokens' must be an array of token ids");
    for (size_t i = 0; ids && i < k && !e->status; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= llm_vocab_n(s->model->vocab))
            srv_err_set(e, 400, "tokens", "'tokens' item %zu is not a token id of this model", i);
        else
            ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(o);
    size_t len = 0;
    llm_error err = {0};
    char *text = o && !e->status && ids ? llm_detokenize(s->model->vocab, ids, (int)k, 0, &len, &err) : NULL;
    if (!text && !e->status && o && (!ids || err.code == LLM_ERR_NOMEM))
        srv_err_set(e, 503, NULL, "out of memory");
    free(ids);
    if (!text) {
        if (!e->status)
            srv_err_set(e, o ? 400 : e->status, "tokens", "%s", err.msg[0] ? err.msg : "cannot detokenize");
        return srv_http_send_err(c, e);
    }
    /* the ids' bytes may end inside a character (a byte token alone): such bytes read as U+FFFD, as in streamed text */
    size_t ulen = 0;
    char *u = llm_utf8_dup_valid(text, len, &ulen);
    free(text);
    int rc = srv_http_send_json(c, 200, u ? json_pack("{s:s%}", "content", u, ulen) : NULL);
    free(u);
    return rc;
}

/* The most tokens one embedding input may have: the context, and what the
 * KV pool holds for one sequence. */
static int embed_max_tokens(srv *s)
{
    llm_stats st;
    llm_engine_stats(s->engine, &st);
    long pool = (long)st.kv_blocks_total * st.kv_block_size;
    return pool < st.n_ctx ? (int)pool : st.n_ctx;
}

/* Grows a request's share of its tenant's cap from held towards want: as
 * many as are free now, at least what it holds (its inputs then run fewer
 * at a time instead of being refused). Returns the share. */
static int tenant_grow(srv *s, const api_key *key, int held, int want)
{
    for (int w = want; w > held; w--)
        if (api_keys_take(&s->keys, key, w - held, (int)s->cfg.tenant_max_inflight))
            return w;
    return held;
}

/* Sends q's answer and counts it (a pooling request finishes with reason
 * stop, as vLLM counts them). */
static int embed_answer(srv *s, struct mg_connection *c, const srv_embed *q, double t0)
{
    char *text = srv_embed_answer(q, q->lora ? q->lora->name : s->name);
    int status = http_reply_text(c, text ? 200 : 503, "application/json", text ? text : SRV_OOM_BODY, NULL);
    free(text);
    srv_metrics_finished(&s->metrics, 0);
    srv_metrics_observe(&s->metrics, H_E2E, llm_clock_mono_s() - t0);
    srv_metrics_observe(&s->metrics, H_PROMPT_TOKENS, (double)q->prompt_tokens);
    return status;
}

/* Embeddings come from the stable model only: vectors of two revisions
 * are not comparable, and a client stores them side by side. As for
 * completions one sequence of the tenant's cap is taken before the body is
 * parsed; the share is held until the answer is sent, so a slow reader of
 * a large answer keeps its cap taken. */
static int fn_embeddings(srv *s, struct mg_connection *c, const char *b, size_t n, srv_err *e)
{
    srv_embed q = {0};
    const api_key *key = srv_http_caller(s, c);
    double t0 = llm_clock_mono_s();
    int status = srv_complete_tenant_take(s, key, 1, 0, e), held = status ? 0 : 1;
    if (!status && srv_embed_parse(s, embed_max_tokens(s), b, n, &q, e))
        status = e->status;
    if (!status) {
        srv_lora_count_request(q.lora);
        held = tenant_grow(s, key, held, q.n < SRV_EMBED_WINDOW ? q.n : SRV_EMBED_WINDOW);
        if (q.priority > srv_complete_priority_ceiling(s, key))
            q.priority = srv_complete_priority_ceiling(s, key);
        status = srv_embed_run(s, s->engine, c, &q, srv_complete_cache_salt(srv_http_tenant(s, c), q.cache_salt), held, e);
    }
    if (!status)
        status = embed_answer(s, c, &q, t0);
    else if (status != 499)
        status = srv_http_send_err(c, e);
    api_keys_give(&s->keys, key, held);
    srv_embed_free(&q);
    return status;
}

static int h_completions(struct mg_connection *c, void *s) { return api(s, c, R_COMPLETIONS, "POST", fn_completions); }
static int h_chat(struct mg_connection *c, void *s) { return api(s, c, R_CHAT, "POST", fn_chat); }
static int h_models(struct mg_connection *c, void *s) { return api(s, c, R_MODELS, "GET", fn_models); }
static int h_generate(struct mg_connection *c, void *s) { return api(s, c, R_GENERATE, "POST", fn_generate); }
static int h_tokenize(struct mg_connection *c, void *s) { return api(s, c, R_TOKENIZE, "POST", fn_tokenize); }
static int h_detokenize(struct mg_connection *c, void *s) { return api(s, c, R_DETOKENIZE, "POST", fn_detokenize); }
static int h_embeddings(struct mg_connection *c, void *s) { return api(s, c, R_EMBEDDINGS, "POST", fn_embeddings); }

/* ---- probes and metrics ---------------------------------------------------------- */

static const char *phase_name(int p)
{
    static const char *const n[] = {"loading", "ready", "draining", "failed"};
    return p >= 0 && p < 4 ? n[p] : "unknown";
}

/* The body of a probe's answer (malloc'd; NULL without memory). */
static char *probe_body(srv *s, int ok)
{
    int p = atomic_load(&s->phase), dl = atomic_load(&s->dl.on);
    const char *phase = dl && p == SRV_LOADING ? "downloading" : phase_name(p);
    json_t *j = json_pack("{s:s,s:s,s:s}", "status", ok ? "ok" : phase, "phase", phase, "detail", s->status);
    unsigned long long done = atomic_load(&s->dl.done), total = atomic_load(&s->dl.total);
    if (j && dl)
        json_object_set_new(j, "download", json_pack("{s:s,s:I,s:I,s:I,s:f}", "state", atomic_load(&s->dl.phase),
                                                     "bytes_done", (json_int_t)done, "bytes_total", (json_int_t)total,
                                                     "bytes_per_second", (json_int_t)atomic_load(&s->dl.rate),
                                                     "percent", total ? 100.0 * (double)done / (double)total : 0.0));
    if (j && p == SRV_FAILED && s->dl.reason[0])
        json_object_set_new(j, "reason", json_string(s->dl.reason));
    char *text = srv_json_text(j);
    json_decref(j);
    return text;
}

/* Alive unless loading failed or an engine step has run too long; never
 * waits on the engine (stats are read without blocking on a step). */
int srv_http_alive(srv *s)
{
    int ok = atomic_load(&s->phase) != SRV_FAILED;
    if (ok && atomic_load(&s->phase) >= SRV_READY && s->engine) {
        llm_stats st;
        llm_engine_stats(s->engine, &st);
        ok = st.step_running_ms < (double)s->cfg.liveness_timeout_s * 1e3;
    }
    return ok;
}

static char *metrics_text(srv *s)
{
    int p = atomic_load(&s->phase);
    int up = p >= SRV_READY && p != SRV_FAILED;
    http_guard_stats gs;
    http_guard_stats_get(s->http, &gs);
    srv_metrics_connections(&s->metrics, (const long long[4]){gs.open, gs.accepted, gs.refused, gs.cut});
    char *text = srv_metrics_render(&s->metrics, up ? s->engine : NULL, p, s->backends, up ? s->n_backends : 0, s->name);
    if (!text || !up)
        return text;
    llm_strbuf b = {0};
    llm_strbuf_append(&b, text, strlen(text));
    free(text);
    srv_lora_metrics(&s->loras, s->engine, s->name, &b);
    otlp_metrics(s->traces, &b);
    return llm_strbuf_take(&b);
}

/* The answer of a probe route (/livez, /health, /readyz, /startupz) or
 * /metrics, for either listener: its status, *body (malloc'd) and *type;
 * 404 for any other path. Never waits on the engine. */
static int health_answer(void *ctx, const char *path, const char *query, char **body, const char **type)
{
    (void)query;
    srv *s = ctx;
    int p = atomic_load(&s->phase), ok, route = R_PROBES;
    *type = "application/json";
    if (!strcmp(path, "/livez") || !strcmp(path, "/health")) /* /health: probe templates written for vLLM, llama.cpp */
        ok = srv_http_alive(s);
    else if (!strcmp(path, "/readyz"))
        ok = p == SRV_READY;
    else if (!strcmp(path, "/startupz"))
        ok = p == SRV_READY || p == SRV_DRAINING;
    else if (!strcmp(path, "/metrics")) {
        *type = "text/plain; version=0.0.4; charset=utf-8";
        route = R_METRICS;
        ok = (*body = metrics_text(s)) != NULL;
    } else {
        srv_err e = {0};
        srv_err_set(&e, 404, NULL, "no route %s (this port serves /livez, /readyz, /startupz and /metrics)", path);
        *body = srv_err_body(&e);
        srv_metrics_request(&s->metrics, R_OTHER, 404);
        return 404;
    }
    if (route == R_PROBES)
        *body = probe_body(s, ok);
    int status = !*body ? 503 : ok ? 200 : 503;
    srv_metrics_request(&s->metrics, route, status);
    return status;
}

/* A probe route or /metrics on the API port. With API keys /metrics needs
 * one (it shows every tenant's traffic; the health port serves it to the
 * cluster's scrapers). */
static int h_health(struct mg_connection *c, void *cb)
{
    srv *s = cb;
    const char *path = mg_get_request_info(c)->local_uri, *type = NULL;
    char *body = NULL;
    if (!strcmp(path, "/metrics") && s->keys.n && !srv_http_caller(s, c)) {
        srv_err e = {0};
        srv_err_set(&e, 401, NULL, "/metrics on the API port needs an API key (Authorization: Bearer KEY); "
                                   "the health port serves it without one");
        srv_metrics_request(&s->metrics, R_METRICS, 401);
        return srv_http_send_err(c, &e);
    }
    int status = health_answer(s, path, "", &body, &type);
    http_reply_text(c, status, type, body ? body : SRV_OOM_BODY, NULL);
    free(body);
    return status;
}

extern const unsigned char srv_playground_html[];
extern const size_t srv_playground_html_len;

/* GET /: the playground (self-contained HTML + JS, compiled in). */
static int h_root(struct mg_connection *c, void *cb)
{
    http_reply(c, 200, "text/html; charset=utf-8", (const char *)srv_playground_html, srv_playground_html_len,
               "Cache-Control: no-cache\r\n");
    srv_metrics_request(&((srv *)cb)->metrics, R_ROOT, 200);
    return 200;
}

/* Everything else: the playground at "/", else a JSON 404. (civetweb
 * prefers no handler between "/$" and "/" for the root, so it is here.) */
static int h_other(struct mg_connection *c, void *cb)
{
    if (!strcmp(mg_get_request_info(c)->local_uri, "/") && !strcmp(mg_get_request_info(c)->request_method, "GET"))
        return h_root(c, cb);
    srv_err e = {0};
    srv_err_set(&e, 404, NULL, "no route %s", mg_get_request_info(c)->local_uri);
    srv_metrics_request(&((srv *)cb)->metrics, R_OTHER, 404);
    return srv_http_send_err(c, &e);
}

/* The admin bearer token: admin_token_file (read at each request, so a
 * rotated Secret takes effect), else admin_token, else
 * LLM_SERVER_ADMIN_TOKEN; NULL: the route is off (also when the file
 * cannot be read: never open by accident). */
static const char *admin_token(const srv *s, char *buf, size_t cap)
{
    if (s->cfg.admin_token_file && *s->cfg.admin_token_file)
        return http_guard_token_file(s->cfg.admin_token_file, buf, cap) ? NULL : buf;
    const char *t = s->cfg.admin_token && *s->cfg.admin_token ? s->cfg.admin_token : getenv("LLM_SERVER_ADMIN_TOKEN");
    return t && *t ? t : NULL;
}

/* The checks every admin route makes, in order: a token set (routes:
 * "the adapter routes are", for the 404's words), the caller's bearer, the method (methods:
 * "POST" or "GET|POST"), a serving model when ready is set. 0 to go on,
 * else the status with e set. */
static int admin_check(srv *s, struct mg_connection *c, const char *routes, const char *methods, int ready, srv_err *e)
{
    char tbuf[256];
    const char *tok = admin_token(s, tbuf, sizeof tbuf), *m = mg_get_request_info(c)->request_method;
    size_t ml = strlen(m);
    const char *at = strstr(methods, m);
    int method_ok = at && (at == methods || at[-1] == '|') && (at[ml] == 0 || at[ml] == '|');
    if (!tok)
        srv_err_set(e, 404, NULL, "%s off (no admin token: admin_token_file unset or unreadable)", routes);
    else if (!http_guard_bearer_ok(mg_get_header(c, "Authorization"), tok))
        srv_err_set(e, 401, NULL, "the admin token is required (Authorization: Bearer TOKEN)");
    else if (!method_ok)
        srv_err_set(e, 405, NULL, "use %s for %s", strchr(methods, '|') ? "GET or POST" : methods,
                    mg_get_request_info(c)->local_uri);
    else if (ready && atomic_load(&s->phase) != SRV_READY)
        srv_err_set(e, 503, NULL, "the model is not serving");
    OPENSSL_cleanse(tbuf, sizeof tbuf);
    return e->status;
}

/* GET /admin/canary: the colocated canary's state; POST sets it. */
static int h_admin_canary(struct mg_connection *c, void *cb)
{
    srv *s = cb;
    srv_err e = {0};
    const char *m = mg_get_request_info(c)->request_method;
    char *body = NULL;
    size_t len = 0;
    json_t *out = NULL;
    int status;
    if (admin_check(s, c, "the admin route is", "GET|POST", 1, &e))
        status = srv_http_send_err(c, &e);
    else if (!strcmp(m, "GET"))
        status = srv_http_send_json(c, 200, srv_canary_state(s));
    else if (read_body(s, c, &body, &len, &e))
        status = srv_http_send_err(c, &e);
    else {
        json_t *req = srv_json_parse(body, len, &e); /* srv_canary_admin names the field of a non-object */
        status = req ? srv_canary_admin(s, req, &out, &e) : e.status;
        status = status == 200 ? srv_http_send_json(c, 200, out) : srv_http_send_err(c, &e);
        json_decref(req);
    }
    free(body);
    srv_metrics_request(&s->metrics, R_OTHER, status);
    return status;
}

/* POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's routes):
 * the admin token, as /admin/canary. */
static int lora_admin(srv *s, struct mg_connection *c, int load)
{
    srv_err e = {0};
    char *body = NULL;
    size_t len = 0;
    int status;
    if (admin_check(s, c, "the adapter routes are", "POST", 1, &e) || read_body(s, c, &body, &len, &e))
        status = srv_http_send_err(c, &e);
    else {
        json_t *req = srv_json_parse(body, len, &e);
        status = !req ? e.status : load ? srv_lora_load_req(s, req, &e) : srv_lora_unload_req(s, req, &e);
        json_decref(req);
        status = status == 200 ? http_reply_text(c, 200, "text/plain; charset=utf-8",
                                                 load ? "Success: LoRA adapter loaded\n" : "Success: LoRA adapter unloaded\n",
                                                 NULL)
                               : srv_http_send_err(c, &e);
    }
    free(body);
    srv_metrics_request(&s->metrics, R_OTHER, status);
    return status;
}

static int h_lora_load(struct mg_connection *c, void *cb) { return lora_admin(cb, c, 1); }
static int h_lora_unload(struct mg_connection *c, void *cb) { return lora_admin(cb, c, 0); }

/* GET /admin/lora: what is loaded (the operator's view of a pod's adapters). */
static int h_lora_state(struct mg_connection *c, void *cb)
{
    srv *s = cb;
    srv_err e = {0};
    admin_check(s, c, "the adapter routes are", "GET", 0, &e);
    int status = e.status ? srv_http_send_err(c, &e) : srv_http_send_json(c, 200, srv_lora_state(&s->loras));
    srv_metrics_request(&s->metrics, R_OTHER, status);
    return status;
}

/* ---- the quality gate's reads -------------------------------------------------- */

/* The controller's quality gate reads one revision's next-token
 * distributions along fixed texts: POST /admin/tokenize ({"prompt": TEXT}
 * or {"messages": [...]}, rendered with that revision's template) gives
 * its token ids and vocabulary size, POST /admin/completions a completion
 * (prompt_logprobs) from it. X-LLM-Revision: stable (the default) or
 * canary (the colocated canary, whatever its weight). Both need the admin
 * token; the request counts as an anonymous one against the pod's caps. */

/* The admin token, the method, a serving pod, the body and the revision
 * (*rv held: NULL the stable model): 0 to go on. */
static int admin_read(srv *s, struct mg_connection *c, char **body, size_t *len, srv_rev **rv, srv_err *e)
{
    const char *want = mg_get_header(c, "X-LLM-Revision");
    *rv = NULL;
    if (admin_check(s, c, "the admin routes are", "POST", 1, e)) {
    } else if (want && strcmp(want, "stable") && strcmp(want, "canary"))
        srv_err_set(e, 400, NULL, "X-LLM-Revision must be stable or canary");
    else if (want && !strcmp(want, "canary") && !(*rv = srv_canary_hold(s)))
        srv_err_set(e, 409, NULL, "no colocated canary is loaded");
    if (!e->status && !read_body(s, c, body, len, e))
        return 0;
    srv_canary_release(*rv);
    *rv = NULL;
    return e->status;
}

/* {"tokens": [...], "vocab_size": N}: the prompt's ids as a completion of
 * this revision would read them. */
static int admin_tokens(srv *s, struct mg_connection *c, srv_rev *rv, const char *body, size_t len, srv_err *e)
{
    json_t *o = srv_json_object(body, len, e);
    int kind = json_object_get(o, "messages") ? SRV_FIELDS_CHAT : SRV_FIELDS_COMPLETIONS;
    json_decref(o);
    if (!o)
        return srv_http_send_err(c, e);
    const llm_vocab *v = rv ? rv->model->vocab : s->model->vocab;
    srv_completion cp = {0};
    int32_t *ids = NULL;
    int n = 0;
    llm_error err = {0};
    if (!srv_parse_completion(s, rv ? rv->chat : s->chat, v, body, len, kind, &cp, e) && !cp.rq.tokens &&
        llm_tokenize(v, cp.rq.text, strlen(cp.rq.text), 1, 1, &ids, &n, &err))
        srv_err_set(e, srv_status_of(err.code), "prompt", "%s", err.msg);
    const int32_t *t = cp.rq.tokens ? cp.rq.tokens : ids;
    n = cp.rq.tokens ? cp.rq.n_tokens : n;
    json_t *arr = e->status ? NULL : json_array();
    for (int i = 0; arr && i < n; i++)
        if (json_array_append_new(arr, json_integer(t[i]))) { /* no answer with ids missing */
            json_decref(arr);
            arr = NULL;
        }
    free(ids);
    srv_completion_free(&cp);
    if (e->status)
        return srv_http_send_err(c, e);
    return srv_http_send_json(c, 200, arr ? json_pack("{s:o,s:i}", "tokens", arr, "vocab_size", llm_vocab_n(v)) : NULL);
}

static int admin_quality(struct mg_connection *c, void *cb, int complete)
{
    srv *s = cb;
    srv_err e = {0};
    srv_rev *rv = NULL;
    char *body = NULL;
    size_t len = 0;
    int status = admin_read(s, c, &body, &len, &rv, &e);
    if (status) {
        status = srv_http_send_err(c, &e);
    } else if (!complete) {
        status = admin_tokens(s, c, rv, body, len, &e);
    } else {
        srv_completion cp = {0};
        int held = 0;
        int bad = srv_parse_completion(s, rv ? rv->chat : s->chat, rv ? rv->model->vocab : s->model->vocab, body, len,
                                       SRV_FIELDS_COMPLETIONS, &cp, &e);
        cp.unmetered = 1;
        if (!bad && cp.lora) /* (a canary's model is judged, not an adapter of the stable's) */
            bad = srv_fail(&e, 400, "model", "the admin routes read base models, not adapters");
        status = bad ? srv_http_send_err(c, &e) : srv_complete(s, rv, c, &cp, &held, &e);
        api_keys_give(&s->keys, srv_http_caller(s, c), held);
        srv_completion_free(&cp);
    }
    http_guard_discard(c, DISCARD_BODIES * s->cfg.max_body_bytes, DISCARD_S);
    free(body);
    srv_canary_release(rv);
    srv_metrics_request(&s->metrics, R_OTHER, status);
    return status == 499 ? 200 : status;
}

static int h_admin_tokenize(struct mg_connection *c, void *cb) { return admin_quality(c, cb, 0); }
static int h_admin_completions(struct mg_connection *c, void *cb) { return admin_quality(c, cb, 1); }

/* The probes and /metrics on the health port: a listener of its own
 * (http_probe.h), which neither API traffic nor idle connections can hold. */
static llm_status start_health(srv *s, llm_error *err)
{
    return http_probe_start(s->cfg.host, s->cfg.health_port, health_answer, s, &s->health, err);
}

int srv_http_start(srv *s, llm_error *err)
{
    char ports[300], backlog[24];
    snprintf(ports, sizeof ports, "%s:%ld", s->cfg.host, s->cfg.port);
    snprintf(backlog, sizeof backlog, "%ld", s->cfg.max_connections > 128 ? s->cfg.max_connections : 128);
    const char *opts[] = {"listening_ports", ports, "listen_backlog", backlog, NULL};
    http_guard_cfg g = {.max_connections = (int)s->cfg.max_connections, .header_timeout_s = (double)s->cfg.header_timeout_s,
                        .keep_alive_s = (double)s->cfg.keep_alive_s, .send_timeout_s = (double)s->cfg.send_timeout_s,
                        .cors_origin = s->cfg.cors_origin,
                        .fds_extra = s->cfg.health_port ? HTTP_PROBE_MAX_CONNS : 0};
    if (http_guard_start(&g, opts, &s->http, err))
        return -1;
    if (s->cfg.health_port && start_health(s, err)) {
        http_guard_stop(s->http);
        s->http = NULL;
        return -1;
    }
    static const struct { const char *uri; mg_request_handler fn; } routes[] = {
        {"/v1/completions$", h_completions}, {"/v1/chat/completions$", h_chat}, {"/v1/models$", h_models},
        {"/tokenize$", h_tokenize},          {"/detokenize$", h_detokenize},    {"/livez$", h_health},
        {"/generate$", h_generate},          {"/health$", h_health},
        {"/readyz$", h_health},              {"/startupz$", h_health},          {"/metrics$", h_health},
        {"/v1/embeddings$", h_embeddings},   {"/admin/canary$", h_admin_canary},
        {"/v1/load_lora_adapter$", h_lora_load}, {"/v1/unload_lora_adapter$", h_lora_unload},
        {"/admin/lora$", h_lora_state},      {"/admin/tokenize$", h_admin_tokenize},
        {"/admin/completions$", h_admin_completions}, {"/", h_other},
    };
    /* every route on a big stack (http_guard_route): request bodies, schemas, templates and the model's tool
     * calls are read there */
    _Static_assert(sizeof routes / sizeof *routes <= HTTP_GUARD_ROUTES, "more routes than http_guard holds");
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++)
        http_guard_route(s->http, routes[i].uri, routes[i].fn, s); /* (cannot fail: the assertion above) */
    http_guard_serve(s->http);
    return 0;
}
