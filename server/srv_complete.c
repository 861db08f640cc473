/* srv_complete.c - one completion request run through the engine: its
 * events read and streamed (SSE) or collected, tool calls read back out of
 * the answer, usage and logprobs, the tenant's share of sequences in
 * flight and its prefix-cache partition. The routes that call it are
 * srv_http.c. */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <civetweb.h>
#include <openssl/evp.h>

#include "http_guard.h"
#include "http_reply.h"
#include "llm/clock.h"
#include "llm/json.h"
#include "llm/strbuf.h"
#include "srv.h"

/* ---- completions ------------------------------------------------------------- */

typedef struct choice {
    llm_strbuf text;     /* the choice's text so far (non-streamed answers) */
    const char *finish;
    json_t *lp;          /* logprobs object (completions or chat form), or NULL */
    size_t offset;       /* text offset of the next token */
    int started;         /* chat stream: the role delta went out */
    size_t sent;         /* chat stream with tools: bytes of text sent as content */
    json_t *calls;       /* the tool calls parsed from the answer, or NULL */
    char *content;       /* with calls: the answer's text outside them, or NULL */
} choice;

typedef struct run {
    srv *s;
    struct mg_connection *c;
    srv_completion *cp;
    llm_request_id id;
    char cid[48];
    long created;
    int n_done, prompt_tokens, completion_tokens, cached_tokens;
    choice ch[LLM_MAX_N];
    double t_start, t_last, t_looked; /* t_looked: the last look for a client that left (run_look) */
    llm_engine *eng;           /* the serving revision's: stable, or a colocated canary */
    const llm_vocab *vocab;
    int rev;                   /* 0 stable, 1 canary */
    llm_strbuf out;            /* a stream's frames not yet written (sse_queue, sse_flush) */
    int out_events;            /* the events in out */
    int unchunked;             /* an HTTP/1.0 client: events go out bare, and the close ends the stream */
    uint64_t start_ns, submit_ns; /* wall clock at the start and at the submit (the spans' times) */
    uint64_t end_ns;              /* and just before the answer's last write (run_mark_end) */
    llm_usage usage;           /* the last answer's timings (the spans') */
    json_t *plp;               /* prompt_logprobs: vLLM's list (null, then an entry per prompt token), or NULL */
} run;

/* The answer's model: the adapter the request named, else the served model. */
static const char *model_of(const run *r) { return r->cp->lora ? r->cp->lora->name : r->s->name; }

/* The token's text as the tokenizer has it (for logprobs), made valid
 * UTF-8 (a byte token alone is often half a character). */
static json_t *piece_json(const llm_vocab *v, int32_t id)
{
    char buf[256];
    int n = llm_token_to_piece(v, id, 1, buf, sizeof buf);
    size_t len;
    char *u = llm_utf8_dup_valid(buf, n < 0 ? 0 : n > (int)sizeof buf ? sizeof buf : (size_t)n, &len);
    json_t *j = u ? json_stringn(u, len) : NULL; /* NULL: out of memory */
    free(u);
    return j;
}

/* The token's own bytes as a JSON array (OpenAI's "bytes": the raw bytes,
 * so a client can join the pieces of a character split over tokens; the
 * text beside them reads such a piece as U+FFFD). NULL when memory ran out. */
static json_t *bytes_json(const llm_vocab *v, int32_t id)
{
    char buf[256];
    int n = llm_token_to_piece(v, id, 1, buf, sizeof buf);
    json_t *a = json_array();
    for (int i = 0; a && i < n && i < (int)sizeof buf; i++)
        if (json_array_append_new(a, json_integer((unsigned char)buf[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* One logprob entry {token, logprob, bytes} (+ top_logprobs when top),
 * or NULL when memory ran out. Consumes top. */
static json_t *chat_logprob(const llm_vocab *v, int32_t id, float lp, json_t *top)
{
    json_t *t = piece_json(v, id), *j = NULL;
    if (t)
        j = top ? json_pack("{s:O,s:f,s:o,s:o}", "token", t, "logprob", (double)lp, "bytes", bytes_json(v, id),
                            "top_logprobs", top)
                : json_pack("{s:O,s:f,s:o}", "token", t, "logprob", (double)lp, "bytes", bytes_json(v, id));
    else
        json_decref(top);
    json_decref(t);
    return j;
}

/* Chat form: {"content": [{token, logprob, bytes, top_logprobs: [...]}]}.
 * 0, or -1 when memory ran out (the answer would miss an entry). */
static int add_chat_logprobs(const llm_vocab *v, choice *ch, const llm_event *ev)
{
    if (!ch->lp && !(ch->lp = json_pack("{s:[]}", "content")))
        return -1;
    json_t *top = json_array();
    int rc = top ? 0 : -1;
    for (int i = 0; !rc && i < ev->sample.n_top; i++)
        rc = json_array_append_new(top, chat_logprob(v, ev->sample.top[i].id, ev->sample.top[i].logprob, NULL));
    if (rc) {
        json_decref(top);
        return -1;
    }
    return json_array_append_new(json_object_get(ch->lp, "content"), chat_logprob(v, ev->token, ev->sample.logprob, top));
}

/* Appends one token to a logprobs object (completions API form, or the
 * chat form); 0, or -1 when memory ran out. */
static int add_logprobs(const llm_vocab *v, choice *ch, const llm_event *ev, int chat)
{
    if (chat)
        return add_chat_logprobs(v, ch, ev);
    if (!ch->lp && !(ch->lp = json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset")))
        return -1;
    json_t *top = json_object();
    int rc = top ? 0 : -1;
    for (int i = 0; !rc && i < ev->sample.n_top; i++) { /* tokens with the same text share a key, as in OpenAI's */
        json_t *t = piece_json(v, ev->sample.top[i].id);
        rc = t ? 0 : -1;
        if (t && !json_object_get(top, json_string_value(t)))
            rc = json_object_set_new(top, json_string_value(t), json_real(ev->sample.top[i].logprob));
        json_decref(t);
    }
    if (rc) {
        json_decref(top);
        return -1;
    }
    rc |= json_array_append_new(json_object_get(ch->lp, "tokens"), piece_json(v, ev->token));
    rc |= json_array_append_new(json_object_get(ch->lp, "token_logprobs"), json_real(ev->sample.logprob));
    rc |= json_array_append_new(json_object_get(ch->lp, "top_logprobs"), top);
    rc |= json_array_append_new(json_object_get(ch->lp, "text_offset"), json_integer((json_int_t)ch->offset));
    return rc ? -1 : 0;
}

static json_t *usage_json(const run *r)
{
    return json_pack("{s:i,s:i,s:i,s:{s:i}}", "prompt_tokens", r->prompt_tokens, "completion_tokens",
                     r->completion_tokens, "total_tokens", r->prompt_tokens + r->completion_tokens,
                     "prompt_tokens_details", "cached_tokens", r->cached_tokens);
}

/* What writing a part of the answer came to (OUT_DEEP: the model's
 * answer holds a tool call too deep to read back, llm/json.h). */
enum { OUT_OK = 0, OUT_GONE = -1, OUT_NOMEM = -2, OUT_DEEP = -3 };

/* A stream's frames are gathered in r->out and written when no more
 * events are ready: the events of one engine step (n > 1 choices, or a
 * client that fell behind) go out in one write, not one each. The buffer
 * holds at most SSE_FLUSH_BYTES plus one event's frames (run_events
 * flushes past it); a flush that wrote more than twice that gives the
 * memory back rather than keep it for the rest of the stream. */
enum { SSE_FLUSH_BYTES = 64 * 1024 };
/* One SSE event "data: TEXT" as an HTTP chunk; its size is strlen(TEXT) + 8. */
#define SSE_FRAME "%zx\r\ndata: %s\n\n\r\n"

/* Writes the queued frames (the whole ones, after a failed append) at
 * once: OUT_OK, or OUT_GONE when the client is gone. A write that carries
 * events is counted (llm_stream_writes). */
static int sse_flush(run *r)
{
    size_t n = r->out.len;
    int ok = 1;
    if (n) { /* all of it or gone: a short write (a timeout midway) leaves the framing broken */
        http_guard_sending(r->c, n);
        ok = mg_write(r->c, r->out.p, n) == (int)n;
        http_guard_disarm(r->c);
        if (r->out_events)
            srv_metrics_stream_write(&r->s->metrics, r->out_events);
    }
    if (r->out.cap > 2 * SSE_FLUSH_BYTES)
        llm_strbuf_free(&r->out);
    else
        llm_strbuf_clear(&r->out);
    r->out_events = 0;
    return ok ? OUT_OK : OUT_GONE;
}

/* One SSE event "data: TEXT" as an HTTP chunk (a stream is chunked so that
 * its connection can be kept alive), queued: OUT_OK, or OUT_NOMEM when it
 * could not be appended. After an earlier failed append the whole frames
 * queued before it are written first (so this may write, and then
 * OUT_GONE says the client is gone). */
static int sse_queue(run *r, const char *text)
{
    if (r->out.failed && sse_flush(r) == OUT_GONE)
        return OUT_GONE;
    if (r->unchunked)
        llm_strbuf_printf(&r->out, "data: %s\n\n", text);
    else
        llm_strbuf_printf(&r->out, SSE_FRAME, strlen(text) + 8, text);
    if (r->out.failed)
        return OUT_NOMEM;
    r->out_events++;
    return OUT_OK;
}

/* An error event that must reach the client even when memory is short:
 * queued after the frames before it, or, when it cannot be, written
 * alone after them. */
static void sse_error(run *r, const char *text)
{
    if (sse_queue(r, text) != OUT_NOMEM)
        return;
    if (sse_flush(r) != OUT_OK) /* the whole frames, then this one directly */
        return;
    if (r->unchunked)
        mg_printf(r->c, "data: %s\n\n", text);
    else
        mg_printf(r->c, SSE_FRAME, strlen(text) + 8, text);
}

/* The end of a stream: [DONE] when done, then the last chunk, with what
 * is queued, in one write (a client that stops reading at [DONE] may
 * still find the end). */
static void sse_end(run *r, int done)
{
    const char *tail = r->unchunked ? (done ? "data: [DONE]\n\n" : "")
                       : done ? "e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n" : "0\r\n\r\n";
    if (llm_strbuf_append(&r->out, tail, strlen(tail))) { /* no room: the whole frames, then the end alone */
        sse_flush(r);
        mg_printf(r->c, "%s", tail);
        return;
    }
    sse_flush(r);
}

/* Queues one SSE event (consumes j): OUT_OK, or OUT_NOMEM when j (NULL)
 * or its text could not be made. */
static int sse_send(run *r, json_t *j)
{
    char *s = srv_json_text(j);
    json_decref(j);
    if (!s)
        return OUT_NOMEM;
    int rc = sse_queue(r, s);
    free(s);
    return rc;
}

/* A chat chunk with delta (consumed; NULL: out of memory). */
static json_t *delta_chunk(run *r, int index, json_t *delta, json_t *lp, const char *finish)
{
    json_t *lpj = lp ? lp : json_null(), *fin = finish ? json_string(finish) : json_null();
    if (delta && !r->ch[index].started && json_object_set_new(delta, "role", json_string("assistant"))) {
        json_decref(delta); /* no first chunk without its role */
        delta = NULL;
    }
    r->ch[index].started = 1;
    return json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:o,s:o}]}", "id", r->cid, "object", "chat.completion.chunk",
                     "created", (json_int_t)r->created, "model", model_of(r), "choices", "index", index, "delta", delta,
                     "logprobs", lpj, "finish_reason", fin);
}

static json_t *chunk(run *r, int index, const char *text, size_t n, json_t *lp, const char *finish)
{
    if (!r->cp->chat)
        return json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:s%,s:o,s:o}]}", "id", r->cid, "object", "text_completion", "created",
                         (json_int_t)r->created, "model", model_of(r), "choices", "index", index, "text", text, n,
                         "logprobs", lp ? lp : json_null(), "finish_reason", finish ? json_string(finish) : json_null());
    return delta_chunk(r, index, finish && !n ? json_object() : json_pack("{s:s%}", "content", text, n), lp, finish);
}

/* ---- tool calls in answers ------------------------------------------------------- */

static int tools_on(const run *r)
{
    return r->cp->chat && r->cp->tools.choice != LLM_TOOL_NONE;
}

/* Streaming with tools: the text that cannot be (the start of) a call
 * goes out as content; the rest waits for the end. */
static int release_content(run *r, int index, size_t upto)
{
    choice *ch = &r->ch[index];
    if (upto <= ch->sent)
        return OUT_OK;
    json_t *lp = ch->lp;
    ch->lp = NULL;
    int rc = sse_send(r, chunk(r, index, ch->text.p + ch->sent, upto - ch->sent, lp, NULL));
    ch->sent = upto;
    return rc;
}

/* The end of an answer with tools: its calls parsed; streamed, the held
 * text and then each call as a tool_calls delta. */
static int finish_tools(run *r, int index)
{
    choice *ch = &r->ch[index];
    const char *text = ch->text.p ? ch->text.p : "";
    llm_status st = llm_tools_extract(&r->cp->tools, r->cp->tool_prefill, text, ch->text.len, &ch->calls, &ch->content);
    int rc = OUT_OK;
    if (st)
        return st == LLM_ERR_TOO_LONG ? OUT_DEEP : OUT_NOMEM;
    if (ch->calls)
        ch->finish = "tool_calls";
    if (!r->cp->stream)
        return OUT_OK;
    if (!ch->calls) /* no call after all: the held text is content */
        rc = release_content(r, index, ch->text.len);
    else if (ch->content && strlen(ch->content) > ch->sent) { /* the rest of the text around the calls */
        /* what went out is where the content starts: streaming stops before the first call */
        rc = sse_send(r, chunk(r, index, ch->content + ch->sent, strlen(ch->content) - ch->sent, NULL, NULL));
        ch->sent = strlen(ch->content);
    }
    size_t i;
    json_t *c;
    json_array_foreach(ch->calls, i, c) {
        if (rc)
            return rc;
        json_t *d = json_pack("{s:[{s:i,s:O,s:s,s:O}]}", "tool_calls", "index", (int)i, "id", json_object_get(c, "id"),
                              "type", "function", "function", json_object_get(c, "function"));
        rc = sse_send(r, delta_chunk(r, index, d, NULL, NULL));
    }
    return rc;
}

static int on_token(run *r, const llm_event *ev)
{
    choice *ch = &r->ch[ev->index];
    double t = llm_clock_mono_s();
    if (ev->index == 0 && r->t_last > 0) {
        srv_metrics_observe(&r->s->metrics, H_ITL, t - r->t_last);
        if (!r->cp->unmetered)
            srv_metrics_rev_observe(&r->s->metrics, r->rev, 1, t - r->t_last);
    }
    if (ev->index == 0)
        r->t_last = t;
    if (r->cp->n_logprobs >= 0 && add_logprobs(r->vocab, ch, ev, r->cp->chat))
        return OUT_NOMEM;
    ch->offset += ev->text_len;
    if (!r->cp->stream || tools_on(r)) {
        if (llm_strbuf_append(&ch->text, ev->text, ev->text_len))
            return OUT_NOMEM;
        if (!r->cp->stream)
            return OUT_OK;
        return release_content(r, ev->index, llm_tools_releasable(&r->cp->tools, ch->text.p, ch->text.len, ch->sent));
    }
    json_t *lp = ch->lp;
    ch->lp = NULL;
    return sse_send(r, chunk(r, ev->index, ev->text, ev->text_len, lp, NULL));
}

/* One prompt token's entry, vLLM's form: {"ID": {"logprob", "rank",
 * "decoded_token"}} for the token and each of its top alternatives. */
static json_t *prompt_entry(const llm_vocab *v, const llm_prompt_logprob *p)
{
    json_t *o = json_object();
    for (int k = -1; o && k < p->n_top; k++) {
        int32_t id = k < 0 ? p->id : p->top[k].id;
        if (k >= 0 && id == p->id)
            continue; /* the prompt token among its alternatives: once */
        char key[16];
        snprintf(key, sizeof key, "%d", (int)id);
        json_t *piece = piece_json(v, id);
        json_t *e = piece ? json_pack("{s:f,s:i,s:o}", "logprob", (double)(k < 0 ? p->logprob : p->top[k].logprob),
                                      "rank", k < 0 ? (int)p->rank : k + 1, "decoded_token", piece)
                          : NULL;
        if (!e || json_object_set_new(o, key, e)) {
            json_decref(o);
            o = NULL;
        }
    }
    return o;
}

/* The DONE's prompt entries as vLLM lists them: null for the first
 * token (nothing precedes it), then one entry per token. NULL: out of
 * memory. */
static json_t *prompt_lp_json(const run *r, const llm_event *ev)
{
    json_t *a = json_array();
    if (!a || json_array_append_new(a, json_null())) {
        json_decref(a);
        return NULL;
    }
    for (int i = 0; i < ev->n_prompt_lp; i++)
        if (json_array_append_new(a, prompt_entry(r->vocab, &ev->prompt_lp[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static int on_done(run *r, const llm_event *ev)
{
    choice *ch = &r->ch[ev->index];
    ch->finish = ev->finish == LLM_FINISH_LENGTH ? "length" : "stop";
    srv_metrics_finished(&r->s->metrics, ev->finish == LLM_FINISH_LENGTH);
    r->prompt_tokens = ev->usage.prompt_tokens;
    r->usage = ev->usage;
    r->cached_tokens = ev->usage.cached_tokens > r->cached_tokens ? ev->usage.cached_tokens : r->cached_tokens;
    r->completion_tokens += ev->usage.completion_tokens;
    srv_metrics_observe(&r->s->metrics, H_TTFT, ev->usage.ttft_ms / 1e3);
    if (!r->cp->unmetered)
        srv_metrics_rev_observe(&r->s->metrics, r->rev, 0, ev->usage.ttft_ms / 1e3);
    srv_metrics_observe(&r->s->metrics, H_QUEUE, ev->usage.queue_ms / 1e3);
    srv_metrics_observe(&r->s->metrics, H_E2E, ev->usage.total_ms / 1e3);
    srv_metrics_observe(&r->s->metrics, H_PREFILL, (ev->usage.ttft_ms - ev->usage.queue_ms) / 1e3);
    srv_metrics_observe(&r->s->metrics, H_DECODE, (ev->usage.total_ms - ev->usage.ttft_ms) / 1e3);
    srv_metrics_observe(&r->s->metrics, H_PROMPT_TOKENS, ev->usage.prompt_tokens);
    srv_lora_count(r->cp->lora, ev->usage.prompt_tokens, ev->usage.completion_tokens);
    srv_metrics_observe(&r->s->metrics, H_GEN_TOKENS, ev->usage.completion_tokens);
    long room = (r->s->cfg.n_ctx > 0 ? r->s->cfg.n_ctx : r->s->model->hp.n_ctx_train) - ev->usage.prompt_tokens;
    srv_metrics_observe(&r->s->metrics, H_MAX_TOKENS, r->cp->rq.max_tokens ? r->cp->rq.max_tokens : (double)room);
    r->n_done++;
    if (r->cp->rq.prompt_logprobs && ev->index == 0 && !(r->plp = prompt_lp_json(r, ev)))
        return OUT_NOMEM;
    if (!r->cp->stream || tools_on(r)) {
        if (llm_strbuf_append(&ch->text, ev->text, ev->text_len))
            return OUT_NOMEM;
        int rc = tools_on(r) ? finish_tools(r, ev->index) : OUT_OK;
        if (rc || !r->cp->stream)
            return rc;
        return sse_send(r, chunk(r, ev->index, "", 0, NULL, ch->finish));
    }
    return sse_send(r, chunk(r, ev->index, ev->text, ev->text_len, NULL, ch->finish));
}

/* Gives up a request whose client is gone or that cannot be answered:
 * its blocks are freed now; counted as aborted. */
static int run_abandon(run *r, int status)
{
    llm_engine_cancel(r->eng, r->id);
    srv_metrics_finished(&r->s->metrics, 2);
    return status;
}

/* Whether to look for a client that left: on each timeout, and at most
 * every 100 ms while events come (a whole answer writes nothing until the
 * end, and a stream with tools may hold its text; a stream that writes
 * also finds out from its writes). */
static int run_look(run *r, llm_status st)
{
    if (st != LLM_OK)
        return st == LLM_ERR_TIMEOUT;
    double now = llm_clock_mono_s();
    if (now - r->t_looked < 0.1)
        return 0;
    r->t_looked = now;
    return 1;
}

/* Reads the request's events to the end. 0, or an HTTP status (with e
 * set) when it failed; 499 when a streaming client went away. */
static int run_events(run *r, srv_err *e)
{
    double deadline = r->t_start + (double)r->s->cfg.request_timeout_s;
    while (r->n_done < r->cp->rq.n) {
        llm_event ev;
        /* frames queued: only events ready now join them; none ready, they go out */
        llm_status st = llm_engine_next(r->eng, r->id, &ev, r->out.len ? 0 : r->cp->stream ? 1000 : 100);
        if (st == LLM_ERR_TIMEOUT && r->out.len) {
            if (sse_flush(r) == OUT_OK)
                continue;
            return run_abandon(r, 499);
        }
        int gone = run_look(r, st) && http_guard_client_gone(r->c), cut = atomic_load(&r->s->cutting);
        if (gone || cut) { /* cut: shutting down past drain_timeout_s */
            if (st == LLM_OK)
                llm_event_clear(&ev);
            if (cut)
                srv_err_set(e, 503, NULL, "the server is shutting down and drain_timeout_s (%ld s) has passed",
                            r->s->cfg.drain_timeout_s);
            return run_abandon(r, gone ? 499 : 503);
        }
        if (st == LLM_OK && llm_clock_mono_s() > deadline) { /* events keep coming, but time is up */
            llm_event_clear(&ev);
            st = LLM_ERR_TIMEOUT;
        }
        if (st == LLM_ERR_TIMEOUT && llm_clock_mono_s() < deadline)
            continue;
        if (st) {
            llm_engine_cancel(r->eng, r->id);
            srv_err_set(e, st == LLM_ERR_TIMEOUT ? 504 : 500, NULL, st == LLM_ERR_TIMEOUT
                        ? "the request ran past its deadline of %ld s" : "the request was lost (%ld)",
                        r->s->cfg.request_timeout_s);
            return e->status;
        }
        int rc = ev.type == LLM_EVENT_TOKEN ? on_token(r, &ev) : ev.type == LLM_EVENT_DONE ? on_done(r, &ev) : 0;
        if (ev.type == LLM_EVENT_ERROR)
            srv_err_set(e, srv_status_of(ev.error.code), NULL, "%s", ev.error.msg);
        llm_event_clear(&ev);
        if (ev.type == LLM_EVENT_ERROR)
            return e->status;
        if (rc == OUT_OK && r->out.len >= SSE_FLUSH_BYTES)
            rc = sse_flush(r);
        if (rc == OUT_NOMEM) { /* the answer cannot be written whole: no partial one */
            srv_err_set(e, 503, NULL, "out of memory while writing the answer");
            return run_abandon(r, 503);
        }
        if (rc == OUT_DEEP) { /* the request's own answer: 400 like the grammar's dead ends, never a fault of the pod */
            srv_err_set(e, 400, NULL, "the answer's tool call nests JSON deeper than %d levels (or is too large) to "
                        "be read back", LLM_JSON_MAX_DEPTH);
            return run_abandon(r, 400);
        }
        if (rc)
            return run_abandon(r, 499);
    }
    return 0;
}

static json_t *whole_choice(run *r, int i)
{
    choice *ch = &r->ch[i];
    json_t *lp = ch->lp ? ch->lp : json_null();
    const char *fin = ch->finish ? ch->finish : "stop", *text = ch->text.p ? ch->text.p : "";
    ch->lp = NULL;
    if (r->cp->chat && ch->calls) /* content null when the answer is only calls, as OpenAI's */
        return json_pack("{s:i,s:{s:s,s:o,s:O},s:o,s:s}", "index", i, "message", "role", "assistant", "content",
                         ch->content ? json_string(ch->content) : json_null(), "tool_calls", ch->calls, "logprobs", lp,
                         "finish_reason", fin);
    if (r->cp->chat)
        return json_pack("{s:i,s:{s:s,s:s%},s:o,s:s}", "index", i, "message", "role", "assistant", "content", text,
                         ch->text.len, "logprobs", lp, "finish_reason", fin);
    json_t *c = json_pack("{s:i,s:s%,s:o,s:s}", "index", i, "text", text, ch->text.len, "logprobs", lp, "finish_reason",
                          fin);
    if (c && r->plp && i == 0 && json_object_set(c, "prompt_logprobs", r->plp)) { /* (vLLM: each choice carries
                                                                                       * them; once is enough) */
        json_decref(c);
        return NULL;
    }
    return c;
}

static int respond_whole(run *r)
{
    if (r->cp->generate)
        return srv_http_send_json(r->c, 200, json_pack("{s:s%,s:s,s:o}", "text", r->ch[0].text.p ? r->ch[0].text.p : "", r->ch[0].text.len,
                                              "finish_reason", r->ch[0].finish ? r->ch[0].finish : "stop", "usage",
                                              usage_json(r)));
    json_t *choices = json_array();
    int rc = choices ? 0 : -1;
    for (int i = 0; !rc && i < r->cp->rq.n; i++) rc = json_array_append_new(choices, whole_choice(r, i));
    if (rc) { /* a choice missing is no answer: send_json's out-of-memory 503 */
        json_decref(choices);
        return srv_http_send_json(r->c, 200, NULL); /* NULL: 503 */
    }
    json_t *answer = json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", r->cid, "object",
                               r->cp->chat ? "chat.completion" : "text_completion", "created", (json_int_t)r->created,
                               "model", model_of(r), "choices", choices, "usage", usage_json(r));
    if (answer && r->cp->chat && r->plp && json_object_set(answer, "prompt_logprobs", r->plp)) { /* (vLLM: at the top) */
        json_decref(answer);
        answer = NULL;
    }
    return srv_http_send_json(r->c, 200, answer);
}

static void run_free(run *r)
{
    llm_strbuf_free(&r->out);
    json_decref(r->plp);
    for (int i = 0; i < LLM_MAX_N; i++) {
        llm_strbuf_free(&r->ch[i].text);
        json_decref(r->ch[i].lp);
        json_decref(r->ch[i].calls);
        free(r->ch[i].content);
    }
}


static unsigned char g_salt_secret[32];

static void salt_secret(void)
{
    if (getentropy(g_salt_secret, sizeof g_salt_secret))
        for (size_t i = 0; i < sizeof g_salt_secret; i++) g_salt_secret[i] = (unsigned char)(rand() ^ (int)i);
}

/* The request's prefix cache partition: with API keys each tenant has
 * its own, shared by its keys (cache hits, usage.cached_tokens and time
 * to first token would otherwise tell a tenant which prompts another
 * sent); a cache_salt field partitions further. No keys and no field: the
 * common cache. */
uint64_t srv_complete_cache_salt(const char *tenant, const char *field)
{
    if (!tenant && !field)
        return 0;
    /* a digest under a per-process random key over both, length-prefixed:
     * no tenant can choose a salt that lands in another's partition */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, salt_secret);
    const char *t = tenant ? tenant : "", *f = field ? field : "";
    char buf[1200];
    int n = snprintf(buf, sizeof buf, "%zu:%s|%zu:%s|%d", strlen(t), t, strlen(f), f, field != NULL);
    unsigned char d[EVP_MAX_MD_SIZE];
    unsigned int dn = 0;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    int ok = md && EVP_DigestInit_ex(md, EVP_sha256(), NULL) && EVP_DigestUpdate(md, g_salt_secret, sizeof g_salt_secret) &&
             EVP_DigestUpdate(md, buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1)) &&
             EVP_DigestFinal_ex(md, d, &dn) && dn >= 8;
    EVP_MD_CTX_free(md);
    uint64_t h = 0;
    for (int i = 0; ok && i < 8; i++) h = h << 8 | d[i];
    return ok ? (h ? h : 1) : 1; /* a failed digest: a partition of its own for all such (never the common 0) */
}

/* A caller's priority goes as high as its key allows, no further. */
int srv_complete_priority_ceiling(const srv *s, const api_key *key)
{
    return key ? key->max_priority : (int)s->cfg.max_priority_anonymous;
}

/* Grows a request's share of key's tenant's max_inflight from held to n
 * sequences: 0, or the refusal in e - 400 when n alone is over the cap (no
 * retry helps), 429 when the tenant's requests in flight hold it. */
int srv_complete_tenant_take(srv *s, const api_key *key, int n, int held, srv_err *e)
{
    int dflt = (int)s->cfg.tenant_max_inflight, cap = api_keys_cap(&s->keys, key, dflt);
    const char *from = key && cap != dflt ? "its keys' max_inflight" : "tenant_max_inflight";
    if (n <= held || api_keys_take(&s->keys, key, n - held, dflt))
        return 0;
    if (n > cap) {
        srv_err_set(e, 400, "n", "n %d is over tenant '%s''s cap of %d sequences in flight (%s)", n, key->tenant, cap,
                    from);
        return 400;
    }
    srv_err_set(e, 429, NULL, "tenant '%s' has its cap of %d sequences queued or running (%s); retry when one ends",
                key->tenant, cap, from);
    e->retry_s = 1;
    return 429;
}

/* The request's span ends before its answer's last bytes are made and
 * written (a whole answer's JSON is built after it): a caller (the router)
 * that ends its own span on reading them must find ours inside it,
 * whichever thread runs first after the write. */
static void run_mark_end(run *r)
{
    if (r->s->traces)
        r->end_ns = otlp_now_ns();
}

/* The request's spans, when traced (otlp.h): the request (under the
 * caller's traceparent), and within it the queue wait, prefill and
 * decode, from the engine's timings of its last answer. */
static void trace_spans(const run *r, const otlp_ctx *in, int has_in, int status)
{
    otlp_ctx req, part;
    otlp_child(r->s->traces, in, has_in, &req);
    if (!req.sampled)
        return;
    const char *tenant = srv_http_tenant(r->s, r->c);
    /* who and what, the same on each span; the request's counts on it and on its prefill */
    otlp_attr who[] = {{"gen_ai.request.model", model_of(r), 0}, {"llm.adapter", r->cp->lora ? r->cp->lora->name : "", 0},
                       {"llm.tenant", tenant ? tenant : "", 0}};
    otlp_attr all[] = {who[0], who[1], who[2], {"gen_ai.usage.input_tokens", NULL, r->prompt_tokens},
                       {"gen_ai.usage.cached_tokens", NULL, r->cached_tokens},
                       {"gen_ai.usage.output_tokens", NULL, r->completion_tokens},
                       {"http.response.status_code", NULL, status}};
    otlp_span(r->s->traces, &req, has_in ? in->span_id : NULL, "llm-server request", OTLP_SERVER, r->start_ns,
              r->end_ns ? r->end_ns : otlp_now_ns(), all, (int)(sizeof all / sizeof *all), status >= 500);
    if (!r->n_done) /* no answer ended (refused, failed): no engine timings */
        return;
    const char *names[3] = {"queue", "prefill", "decode"};
    double at_ms[4] = {0, r->usage.queue_ms, r->usage.ttft_ms, r->usage.total_ms};
    for (int i = 0; i < 3; i++) {
        otlp_child(r->s->traces, &req, 1, &part);
        otlp_span(r->s->traces, &part, req.span_id, names[i], OTLP_INTERNAL, r->submit_ns + (uint64_t)(at_ms[i] * 1e6),
                  r->submit_ns + (uint64_t)(at_ms[i + 1] * 1e6), i == 1 ? all : who, i == 1 ? 5 : 3, 0);
    }
}

/* A request refused before it ran: the error sent, and its span. */
static int refused(run *r, const otlp_ctx *in, int has_in, srv_err *e)
{
    run_mark_end(r);
    int status = srv_http_send_err(r->c, e);
    if (r->s->traces)
        trace_spans(r, in, has_in, status);
    return status;
}

/* Streams or collects; the response is sent here. *held: the sequences
 * of the tenant's cap the request holds, grown to its n here. */
int srv_complete(srv *s, const srv_rev *rv, struct mg_connection *c, srv_completion *cp, int *held, srv_err *e)
{
    run r = {.s = s, .c = c, .cp = cp, .created = (long)time(NULL), .t_start = llm_clock_mono_s(),
             .eng = rv ? rv->engine : s->engine, .vocab = rv ? rv->model->vocab : s->model->vocab, .rev = rv != NULL,
             .start_ns = otlp_now_ns()};
    otlp_ctx in;
    int has_in = s->traces && otlp_traceparent_parse(mg_get_header(c, "traceparent"), &in);
    llm_error err = {0};
    const api_key *key = srv_http_caller(s, c);
    cp->rq.cache_salt = srv_complete_cache_salt(srv_http_tenant(s, c), cp->cache_salt);
    if (cp->rq.priority > srv_complete_priority_ceiling(s, key))
        cp->rq.priority = srv_complete_priority_ceiling(s, key);
    if (srv_complete_tenant_take(s, key, cp->rq.n, *held, e))
        return refused(&r, &in, has_in, e);
    *held = cp->rq.n;
    r.submit_ns = otlp_now_ns();
    llm_status st = llm_engine_submit(r.eng, &cp->rq, &r.id, &err);
    if (st) {
        const char *param = st == LLM_ERR_TOO_LONG ? "max_tokens" : st == LLM_ERR_GRAMMAR ? cp->grammar_param : NULL;
        srv_err_set(e, srv_status_of(st), param, "%s", err.msg);
        e->retry_s = st == LLM_ERR_SHUTDOWN; /* the pod is closing: Retry-After (send_err) */
        return refused(&r, &in, has_in, e);
    }
    snprintf(r.cid, sizeof r.cid, "%s-%llu", cp->chat ? "chatcmpl" : "cmpl", (unsigned long long)r.id);
    r.unchunked = cp->stream && http_reply_unchunked(c); /* HTTP/1.0: the stream is the rest of the connection */
    if (cp->stream)
        http_reply_stream_head(c, 200, "text/event-stream", NULL);
    int status = run_events(&r, e);
    run_mark_end(&r); /* (a stream's usage chunk and end, or the whole answer, are all that is left to write) */
    if (!cp->stream) /* (499: the client left, nobody to answer) */
        status = status == 499 ? 499 : status ? srv_http_send_err(c, e) : respond_whole(&r);
    else if (status == 0 || status == 499) {
        int rc = status == 0 && cp->include_usage
                     ? sse_send(&r, json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", r.cid, "object",
                                             cp->chat ? "chat.completion.chunk" : "text_completion", "created",
                                             (json_int_t)r.created, "model", r.cp->lora ? r.cp->lora->name : s->name, "choices", "usage", usage_json(&r)))
                     : OUT_OK;
        if (rc == OUT_NOMEM) {
            srv_err_set(e, 503, NULL, "out of memory while writing the usage");
            sse_error(&r, SRV_OOM_BODY);
        }
        sse_end(&r, status == 0);
        status = rc == OUT_NOMEM ? 503 : status ? status : 200;
    } else { /* a failure mid-stream: an error event, then the end */
        char *body = srv_err_body(e);
        sse_error(&r, body ? body : SRV_OOM_BODY); /* after the frames queued before the failure */
        sse_end(&r, 1);
        free(body);
    }
    if (s->traces)
        trace_spans(&r, &in, has_in, status);
    run_free(&r);
    return status;
}
