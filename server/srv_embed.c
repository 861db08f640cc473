/* srv_embed.c - POST /v1/embeddings (srv_embed.h). */
#include "llm/json.h"
#include "srv_embed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "http_guard.h"
#include "llm/clock.h"
#include "llm/strbuf.h"
#include "srv.h"
#include "srv_fields.h"

/* The pooling a name says (mean | last), else LLM_POOL_NONE. */
static llm_pooling pooling_named(const char *v)
{
    return !strcmp(v, "mean") ? LLM_POOL_MEAN : !strcmp(v, "last") ? LLM_POOL_LAST : LLM_POOL_NONE;
}

llm_pooling srv_embed_default_pooling(const llm_model *m, const char *setting)
{
    if (pooling_named(setting) || strcmp(setting, "auto"))
        return pooling_named(setting);
    gguf_str arch;
    uint64_t type = 0;
    char key[96];
    if (m->gguf && !gguf_get_str(m->gguf, "general.architecture", &arch, NULL) && arch.len < 64) {
        snprintf(key, sizeof key, "%.*s.pooling_type", (int)arch.len, arch.data);
        if (!gguf_get_u64(m->gguf, key, &type, NULL) && type == 1)
            return LLM_POOL_MEAN; /* llama.cpp's numbering: 1 mean, 3 last (0 none, 2 cls, 4 rank: not ours) */
    }
    return LLM_POOL_LAST;
}

/* ---- parsing ------------------------------------------------------------------ */

/* Token ids of one array input, checked against the vocabulary. */
static int ids_of(json_t *a, int n_vocab, int idx, int32_t **out, int *n, srv_err *e)
{
    size_t k = json_array_size(a);
    if (k == 0)
        return srv_fail(e, 400, "input", "input %d is an empty array of token ids", idx);
    if (k > (size_t)INT32_MAX)
        return srv_fail(e, 400, "input", "input %d has too many token ids", idx);
    if (!(*out = malloc(sizeof(int32_t) * k)))
        return srv_fail(e, 503, NULL, "out of memory");
    for (size_t i = 0; i < k; i++) {
        json_t *t = json_array_get(a, i);
        if (!json_is_integer(t) || json_integer_value(t) < 0 || json_integer_value(t) >= n_vocab)
            return srv_fail(e, 400, "input", "input %d: item %zu is not a token id of this model (0 to %d)", idx, i,
                            n_vocab - 1);
        (*out)[i] = (int32_t)json_integer_value(t);
    }
    *n = (int)k;
    return 0;
}

/* One string input, tokenized as a completion's prompt text is. */
static int ids_of_text(const srv *s, json_t *str, int idx, int max_tokens, int32_t **out, int *n, srv_err *e)
{
    size_t least = llm_vocab_min_tokens(s->model->vocab, json_string_length(str));
    if (json_string_length(str) == 0)
        return srv_fail(e, 400, "input", "input %d is an empty string", idx);
    if (least > (size_t)max_tokens) /* refused before the tokenizer spends time on it */
        return srv_fail(e, 400, "input", "input %d of %zu bytes is at least %zu tokens; at most %d fit", idx,
                        json_string_length(str), least, max_tokens);
    llm_error err = {0};
    llm_status st = llm_tokenize(s->model->vocab, json_string_value(str), json_string_length(str), 1, 1, out, n, &err);
    if (st)
        return srv_fail(e, srv_status_of(st), "input", "input %d: %s", idx, err.msg);
    return 0;
}

/* How many inputs "input" holds: an array of them (*many), or one (a
 * string, or an array of token ids). */
static size_t input_count(json_t *in, int *many)
{
    *many = json_is_array(in) && json_array_size(in) > 0 && !json_is_integer(json_array_get(in, 0));
    return *many ? json_array_size(in) : 1;
}

/* The inputs: a string, an array of token ids, or an array of strings or
 * of arrays of token ids (one input each); each of at most max_tokens. */
static int parse_input(const srv *s, json_t *in, int max_tokens, srv_embed *q, srv_err *e)
{
    int n_vocab = llm_vocab_n(s->model->vocab), many;
    size_t n = input_count(in, &many);
    if (!in || (!json_is_string(in) && !json_is_array(in)) || (json_is_array(in) && json_array_size(in) == 0))
        return srv_fail(e, 400, "input", "'input' must be a non-empty string, array of strings, array of token ids "
                                         "or array of arrays of token ids");
    if (n > SRV_EMBED_MAX_INPUTS)
        return srv_fail(e, 400, "input", "'input' has %zu items; at most %d", n, SRV_EMBED_MAX_INPUTS);
    if (!(q->ids = calloc(n, sizeof *q->ids)) || !(q->n_ids = calloc(n, sizeof *q->n_ids)))
        return srv_fail(e, 503, NULL, "out of memory");
    q->n = (int)n;
    for (size_t i = 0; i < n; i++) {
        json_t *x = many ? json_array_get(in, i) : in;
        int rc = json_is_string(x)  ? ids_of_text(s, x, (int)i, max_tokens, &q->ids[i], &q->n_ids[i], e)
                 : json_is_array(x) ? ids_of(x, n_vocab, (int)i, &q->ids[i], &q->n_ids[i], e)
                                    : srv_fail(e, 400, "input", "input %zu is neither a string nor an array of token ids", i);
        if (rc)
            return rc;
        if (q->n_ids[i] > max_tokens) /* found before anything runs: a bad request changes nothing */
            return srv_fail(e, 400, "input", "input %zu has %d tokens; one sequence holds at most %d here", i,
                            q->n_ids[i], max_tokens);
    }
    return 0;
}

/* encoding_format, dimensions, pooling, priority. */
static int parse_options(json_t *o, srv_embed *q, srv_err *e)
{
    json_t *f = json_object_get(o, "encoding_format"), *d = json_object_get(o, "dimensions"),
           *p = json_object_get(o, "pooling");
    const char *fmt = json_is_string(f) ? json_string_value(f) : "";
    long prio = 0;
    if (f && !json_is_null(f) && strcmp(fmt, "float") && strcmp(fmt, "base64"))
        return srv_fail(e, 400, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    q->base64 = !strcmp(fmt, "base64");
    if (d && !json_is_null(d) && (!json_is_integer(d) || json_integer_value(d) != q->dim))
        return srv_fail(e, 400, "dimensions", "'dimensions' must be %d: this model's embeddings cannot be shortened",
                        q->dim);
    if (p && !json_is_null(p)) {
        q->pooling = pooling_named(json_is_string(p) ? json_string_value(p) : "");
        if (!q->pooling)
            return srv_fail(e, 400, "pooling", "'pooling' must be \"mean\" or \"last\"");
    }
    if (srv_int_field(o, "priority", -1000000, 1000000, &prio, e))
        return -1;
    q->priority = (int)prio;
    return 0;
}

/* The answer's size, an upper bound: each value at its longest, each item's
 * fields, the envelope. */
static double answer_bound(const srv_embed *q, size_t n_inputs)
{
    double value = q->base64 ? 4.0 * 4 / 3 + 1 : SRV_EMBED_VALUE_BYTES;
    return (double)n_inputs * ((double)q->dim * value + 64) + 256 + 2 * 128;
}

int srv_embed_parse(srv *s, int max_tokens, const char *body, size_t len, srv_embed *q, srv_err *e)
{
    q->dim = s->model->hp.n_embd;
    q->lora_table = &s->loras;
    q->pooling = s->embed_pooling ? s->embed_pooling : LLM_POOL_LAST; /* (a server that never chose: last) */
    if (!(q->root = srv_json_object(body, len, e)) || srv_fields_check(q->root, SRV_FIELDS_EMBED, e) ||
        srv_check_envelope(s, q->root, &q->cache_salt, &q->lora, e) || parse_options(q->root, q, e))
        return -1;
    json_t *in = json_object_get(q->root, "input");
    int many;
    size_t n = input_count(in, &many);
    /* before the inputs are tokenized: an answer too big for max_answer_bytes */
    if (answer_bound(q, n) > (double)s->cfg.max_answer_bytes)
        return srv_fail(e, 400, "input", "%zu inputs of %d values each make an answer over max_answer_bytes (%ld)", n,
                        q->dim, s->cfg.max_answer_bytes);
    return parse_input(s, in, max_tokens, q, e);
}

/* ---- running ------------------------------------------------------------------- */

/* The inputs in the engine: slot i runs input at[i] as id[i]. */
typedef struct embed_run {
    srv *s;
    llm_engine *eng;
    struct mg_connection *c;
    srv_embed *q;
    llm_request_id id[SRV_EMBED_WINDOW];
    int at[SRV_EMBED_WINDOW];
    int n_slots, next, done;
    double deadline;
} embed_run;

static void cancel_all(embed_run *r)
{
    for (int i = 0; i < r->n_slots; i++) llm_engine_cancel(r->eng, r->id[i]);
    r->n_slots = 0;
}

static int submit_next(embed_run *r, uint64_t salt, srv_err *e)
{
    srv_embed *q = r->q;
    llm_request rq = {.tokens = q->ids[r->next], .n_tokens = q->n_ids[r->next], .sampling = llm_sampling_default(),
                      .priority = q->priority, .cache_salt = salt, .pooling = q->pooling,
                      .lora = q->lora ? q->lora->l : NULL, .lora_scale = q->lora ? q->lora->scale : 0};
    llm_error err = {0};
    llm_status st = llm_engine_submit(r->eng, &rq, &r->id[r->n_slots], &err);
    if (st)
        return srv_fail(e, srv_status_of(st), "input", "input %d: %s", r->next, err.msg);
    r->at[r->n_slots++] = r->next++;
    return 0;
}

/* Why the oldest input is not waited for any longer: the client left, the
 * server is cutting requests, or the deadline passed; 0 to wait on. */
static int stop_waiting(embed_run *r, srv_err *e)
{
    if (http_guard_client_gone(r->c))
        return 499;
    if (atomic_load(&r->s->cutting))
        srv_err_set(e, 503, NULL, "the server is shutting down and drain_timeout_s (%ld s) has passed",
                    r->s->cfg.drain_timeout_s);
    else if (llm_clock_mono_s() > r->deadline)
        srv_err_set(e, 504, NULL, "the request ran past its deadline of %ld s", r->s->cfg.request_timeout_s);
    return e->status;
}

/* The oldest slot's event: its embedding stored, the slot freed. */
static int take_oldest(embed_run *r, srv_err *e)
{
    llm_event ev;
    llm_status st;
    while ((st = llm_engine_next(r->eng, r->id[0], &ev, 100)) == LLM_ERR_TIMEOUT) {
        int why = stop_waiting(r, e);
        if (why)
            return why;
    }
    if (st) {
        srv_err_set(e, 500, NULL, "input %d was lost (%s)", r->at[0], llm_status_str(st));
        return e->status;
    }
    if (ev.type == LLM_EVENT_ERROR)
        srv_err_set(e, srv_status_of(ev.error.code), "input", "input %d: %s", r->at[0], ev.error.msg);
    else if (ev.type != LLM_EVENT_DONE || ev.n_embedding != r->q->dim)
        srv_err_set(e, 500, NULL, "input %d: the engine gave no embedding", r->at[0]);
    else {
        memcpy(r->q->vecs + (size_t)r->at[0] * r->q->dim, ev.embedding, sizeof(float) * (size_t)r->q->dim);
        r->q->prompt_tokens += ev.usage.prompt_tokens;
        srv_metrics_observe(&r->s->metrics, H_QUEUE, ev.usage.queue_ms / 1e3);
    }
    llm_event_clear(&ev);
    if (e->status)
        return e->status;
    r->n_slots--;
    memmove(r->id, r->id + 1, sizeof *r->id * (size_t)r->n_slots);
    memmove(r->at, r->at + 1, sizeof *r->at * (size_t)r->n_slots);
    r->done++;
    return 0;
}

int srv_embed_run(srv *s, llm_engine *eng, struct mg_connection *c, srv_embed *q, uint64_t salt, int window, srv_err *e)
{
    embed_run r = {.s = s, .eng = eng, .c = c, .q = q,
                   .deadline = llm_clock_mono_s() + (double)s->cfg.request_timeout_s};
    if (window < 1 || window > SRV_EMBED_WINDOW)
        window = window < 1 ? 1 : SRV_EMBED_WINDOW;
    if (!(q->vecs = malloc(sizeof(float) * (size_t)q->n * (size_t)q->dim))) {
        srv_err_set(e, 503, NULL, "out of memory");
        return 503;
    }
    int rc = 0;
    while (!rc && r.done < q->n) {
        while (!rc && r.n_slots < window && r.next < q->n)
            if (submit_next(&r, salt, e))
                rc = e->status;
        if (!rc) /* inputs end every few milliseconds: look at each, not only when one is slow */
            rc = stop_waiting(&r, e);
        if (!rc)
            rc = take_oldest(&r, e);
    }
    cancel_all(&r);
    return rc;
}

/* ---- the answer ------------------------------------------------------------------- */

/* One embedding as base64 of its little-endian float32 bytes, appended. */
static void put_base64(llm_strbuf *b, const float *v, int dim)
{
    size_t n = sizeof(float) * (size_t)dim;
    unsigned char *raw = malloc(n), *txt = malloc(4 * ((n + 2) / 3) + 1);
    int len = -1;
    if (raw && txt) {
        for (int i = 0; i < dim; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int k = 0; k < 4; k++) raw[4 * (size_t)i + (size_t)k] = (unsigned char)(u >> (8 * k));
        }
        len = EVP_EncodeBlock(txt, raw, (int)n);
    }
    if (len < 0 || llm_strbuf_append(b, "\"", 1) || llm_strbuf_append(b, (const char *)txt, (size_t)len) ||
        llm_strbuf_append(b, "\"", 1))
        b->failed = 1;
    free(raw);
    free(txt);
}

/* One embedding as a JSON array; 9 significant digits give back every
 * float32 exactly. */
static void put_floats(llm_strbuf *b, const float *v, int dim)
{
    llm_strbuf_append(b, "[", 1);
    for (int i = 0; i < dim; i++) llm_strbuf_printf(b, i ? ",%.9g" : "%.9g", (double)v[i]);
    llm_strbuf_append(b, "]", 1);
}

char *srv_embed_answer(const srv_embed *q, const char *model)
{
    json_t *name = json_string(model);
    char *quoted = name ? json_dumps(name, JSON_ENCODE_ANY) : NULL; /* the name as a JSON string */
    json_decref(name);
    if (!quoted)
        return NULL;
    llm_strbuf b = {0};
    llm_strbuf_printf(&b, "{\"object\":\"list\",\"data\":[");
    for (int i = 0; i < q->n && !b.failed; i++) {
        llm_strbuf_printf(&b, "%s{\"object\":\"embedding\",\"index\":%d,\"embedding\":", i ? "," : "", i);
        const float *v = q->vecs + (size_t)i * q->dim;
        if (q->base64)
            put_base64(&b, v, q->dim);
        else
            put_floats(&b, v, q->dim);
        llm_strbuf_append(&b, "}", 1);
    }
    llm_strbuf_printf(&b, "],\"model\":%s,\"usage\":{\"prompt_tokens\":%ld,\"total_tokens\":%ld}}", quoted,
                      q->prompt_tokens, q->prompt_tokens);
    free(quoted);
    char *text = llm_strbuf_take(&b);
    llm_strbuf_free(&b);
    return text;
}

void srv_embed_free(srv_embed *q)
{
    if (!q)
        return;
    for (int i = 0; q->ids && i < q->n; i++) free(q->ids[i]);
    free(q->ids);
    free(q->n_ids);
    free(q->vecs);
    json_decref(q->root);
    if (q->lora_table)
        srv_lora_unpin(q->lora_table, q->lora);
    memset(q, 0, sizeof *q);
}
