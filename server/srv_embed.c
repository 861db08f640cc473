/* srv_embed.c - POST /v1/embeddings (srv_embed.h). */
#include "srv_embed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "http_guard.h"
#include "llm/clock.h"
#include "srv.h"
#include "srv_fields.h"

llm_pooling srv_embed_default_pooling(const llm_model *m, const char *setting)
{
    if (!strcmp(setting, "mean"))
        return LLM_POOL_MEAN;
    if (!strcmp(setting, "last"))
        return LLM_POOL_LAST;
    if (strcmp(setting, "auto"))
        return LLM_POOL_NONE;
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
static int ids_of_text(const srv *s, json_t *str, int idx, int32_t **out, int *n, srv_err *e)
{
    if (json_string_length(str) == 0)
        return srv_fail(e, 400, "input", "input %d is an empty string", idx);
    llm_error err = {0};
    llm_status st = llm_tokenize(s->model->vocab, json_string_value(str), json_string_length(str), 1, 1, out, n, &err);
    if (st)
        return srv_fail(e, srv_status_of(st), "input", "input %d: %s", idx, err.msg);
    return 0;
}

/* The inputs: a string, an array of token ids, or an array of strings or
 * of arrays of token ids (one input each). */
static int parse_input(const srv *s, json_t *in, srv_embed *q, srv_err *e)
{
    int n_vocab = llm_vocab_n(s->model->vocab);
    int many = json_is_array(in) && json_array_size(in) > 0 && !json_is_integer(json_array_get(in, 0));
    size_t n = many ? json_array_size(in) : 1;
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
        int rc = json_is_string(x)  ? ids_of_text(s, x, (int)i, &q->ids[i], &q->n_ids[i], e)
                 : json_is_array(x) ? ids_of(x, n_vocab, (int)i, &q->ids[i], &q->n_ids[i], e)
                                    : srv_fail(e, 400, "input", "input %zu is neither a string nor an array of token ids", i);
        if (rc)
            return rc;
    }
    return 0;
}

/* encoding_format, dimensions, pooling, priority, cache_salt, user. */
static int parse_options(const srv *s, json_t *o, srv_embed *q, srv_err *e)
{
    json_t *f = json_object_get(o, "encoding_format"), *d = json_object_get(o, "dimensions"),
           *p = json_object_get(o, "pooling"), *pr = json_object_get(o, "priority"),
           *salt = json_object_get(o, "cache_salt"), *u = json_object_get(o, "user");
    if (f && !json_is_null(f) && !(json_is_string(f) && (!strcmp(json_string_value(f), "float") ||
                                                          (q->base64 = !strcmp(json_string_value(f), "base64")))))
        return srv_fail(e, 400, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
    if (d && !json_is_null(d) && (!json_is_integer(d) || json_integer_value(d) != q->dim))
        return srv_fail(e, 400, "dimensions", "'dimensions' must be %d: this model's embeddings cannot be shortened",
                        q->dim);
    if (p && !json_is_null(p)) {
        const char *v = json_is_string(p) ? json_string_value(p) : "";
        q->pooling = !strcmp(v, "mean") ? LLM_POOL_MEAN : !strcmp(v, "last") ? LLM_POOL_LAST : LLM_POOL_NONE;
        if (!q->pooling)
            return srv_fail(e, 400, "pooling", "'pooling' must be \"mean\" or \"last\"");
    }
    if (pr && !json_is_null(pr) && (!json_is_integer(pr) || json_integer_value(pr) < -1000000 ||
                                    json_integer_value(pr) > 1000000))
        return srv_fail(e, 400, "priority", "'priority' must be an integer in [-1000000, 1000000]");
    q->priority = pr && json_is_integer(pr) ? (int)json_integer_value(pr) : 0;
    if (salt && !json_is_null(salt) &&
        (!json_is_string(salt) || json_string_length(salt) < 1 || json_string_length(salt) > 256))
        return srv_fail(e, 400, "cache_salt", "'cache_salt' must be a string of 1 to 256 bytes");
    q->cache_salt = json_string_value(salt);
    if (u && !json_is_null(u) && !json_is_string(u))
        return srv_fail(e, 400, "user", "'user' must be a string");
    (void)s;
    return 0;
}

int srv_embed_parse(const srv *s, const char *body, size_t len, srv_embed *q, srv_err *e)
{
    q->dim = s->model->hp.n_embd;
    q->pooling = s->embed_pooling;
    if (!(q->root = srv_json_object(body, len, e)) || srv_fields_check(q->root, SRV_FIELDS_EMBED, e))
        return -1;
    json_t *m = json_object_get(q->root, "model");
    if (m && !json_is_null(m) && (!json_is_string(m) || strcmp(json_string_value(m), s->name)))
        return srv_fail(e, json_is_string(m) ? 404 : 400, "model", "model '%s' is not served here (this server has '%s')",
                        json_is_string(m) ? json_string_value(m) : "?", s->name);
    if (parse_options(s, q->root, q, e) || parse_input(s, json_object_get(q->root, "input"), q, e))
        return -1;
    /* the answer's size, estimated as the answers of completions are */
    size_t per = q->base64 ? 6 : 16; /* bytes a value takes in the text */
    if ((double)q->n * q->dim * per > (double)s->cfg.max_answer_bytes)
        return srv_fail(e, 400, "input", "%d inputs of %d values each make an answer over max_answer_bytes (%ld)", q->n,
                        q->dim, s->cfg.max_answer_bytes);
    return 0;
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
                      .priority = q->priority, .cache_salt = salt, .pooling = q->pooling};
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

/* One embedding as base64 of its little-endian float32 bytes. */
static json_t *base64_of(const float *v, int dim)
{
    size_t n = sizeof(float) * (size_t)dim;
    unsigned char *raw = malloc(n), *txt = malloc(4 * ((n + 2) / 3) + 1);
    json_t *out = NULL;
    if (raw && txt) {
        for (int i = 0; i < dim; i++) {
            uint32_t u;
            memcpy(&u, &v[i], 4);
            for (int b = 0; b < 4; b++) raw[4 * (size_t)i + (size_t)b] = (unsigned char)(u >> (8 * b));
        }
        int len = EVP_EncodeBlock(txt, raw, (int)n);
        out = len >= 0 ? json_stringn((const char *)txt, (size_t)len) : NULL;
    }
    free(raw);
    free(txt);
    return out;
}

static json_t *floats_of(const float *v, int dim)
{
    json_t *a = json_array();
    for (int i = 0; a && i < dim; i++)
        if (json_array_append_new(a, json_real(v[i]))) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

char *srv_embed_answer(const srv_embed *q, const char *model)
{
    json_t *data = json_array();
    for (int i = 0; data && i < q->n; i++) {
        const float *v = q->vecs + (size_t)i * q->dim;
        json_t *emb = q->base64 ? base64_of(v, q->dim) : floats_of(v, q->dim);
        json_t *item = emb ? json_pack("{s:s,s:i,s:o}", "object", "embedding", "index", i, "embedding", emb) : NULL;
        if (!item || json_array_append_new(data, item)) {
            json_decref(data);
            data = NULL;
        }
    }
    json_t *j = data ? json_pack("{s:s,s:o,s:s,s:{s:I,s:I}}", "object", "list", "data", data, "model", model, "usage",
                                 "prompt_tokens", (json_int_t)q->prompt_tokens, "total_tokens",
                                 (json_int_t)q->prompt_tokens)
                     : NULL;
    /* 9 significant digits give back every float32 exactly */
    char *text = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    return text;
}

void srv_embed_free(srv_embed *q)
{
    for (int i = 0; q->ids && i < q->n; i++) free(q->ids[i]);
    free(q->ids);
    free(q->n_ids);
    free(q->vecs);
    json_decref(q->root);
    memset(q, 0, sizeof *q);
}
