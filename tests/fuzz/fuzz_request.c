/* fuzz_request.c - libFuzzer target for llm-server's request parsing:
 * arbitrary bytes as /v1/completions, /v1/chat/completions and
 * /v1/embeddings bodies (each input as all three) must give either a request whose fields are all
 * in range or an error with an HTTP status and a message; never a crash,
 * leak or UB (ASan + UBSan). Chats render with one of the six built-in
 * families or, for the seventh value of the first byte, a Jinja template
 * that uses tools and chat_template_kwargs the way published templates do.
 * Embedding inputs are tokenized with the SentencePiece vocabulary of the
 * seed corpus (make_seeds.py's spm.gguf, written before this runs).
 * Inputs are nested deep by deep.h's mutator and run on a thread with the
 * production stack. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deep.h"
#include "http_guard.h"
#include "srv.h"
#include "srv_embed.h"

/* srv_embed.c's running half is not reached from parsing: link seams. */
int http_guard_client_gone(struct mg_connection *c) { (void)c; return 1; }
llm_status llm_engine_submit(llm_engine *e, const llm_request *rq, llm_request_id *id, llm_error *err)
{
    (void)e, (void)rq, (void)id;
    return llm_errf(err, LLM_ERR_SHUTDOWN, "fuzz: no engine");
}
llm_status llm_engine_next(llm_engine *e, llm_request_id id, llm_event *ev, int timeout_ms)
{
    (void)e, (void)id, (void)ev, (void)timeout_ms;
    return LLM_ERR_NOT_FOUND;
}
void llm_engine_cancel(llm_engine *e, llm_request_id id) { (void)e, (void)id; }
void llm_event_clear(llm_event *ev) { (void)ev; }
void srv_metrics_observe(srv_metrics *m, srv_hist_id h, double v) { (void)m, (void)h, (void)v; }

/* The seed corpus's SentencePiece vocabulary in a model with 8-wide
 * embeddings. */
static llm_model *embed_model(void)
{
    static llm_model m;
    static gguf_file *g; /* open for the whole run (static: reachable, not a leak) */
    if (m.vocab)
        return &m;
    const char *path = getenv("FUZZ_VOCAB") ? getenv("FUZZ_VOCAB") : "build-fuzz/seeds/spm.gguf";
    llm_error err = {0};
    if (gguf_open(path, &g, &err) || llm_vocab_load(g, &m.vocab, &err)) {
        fprintf(stderr, "fuzz_request: %s (run make_seeds.py first)\n", err.msg);
        abort();
    }
    m.hp.n_embd = 8;
    return &m;
}

/* An embeddings body: parsed, or refused with a status and a message. */
static void embed_one(srv *s, const uint8_t *data, size_t size)
{
    srv_embed q = {0};
    srv_err e = {0};
    s->model = embed_model();
    s->embed_pooling = LLM_POOL_LAST;
    if (srv_embed_parse(s, 64, (const char *)data, size, &q, &e) == 0) {
        if (q.n < 1 || q.n > SRV_EMBED_MAX_INPUTS || q.dim != 8 || !q.pooling)
            abort();
        for (int i = 0; i < q.n; i++) {
            if (q.n_ids[i] < 1 || q.n_ids[i] > 64 || !q.ids[i])
                abort();
            for (int k = 0; k < q.n_ids[i]; k++)
                if (q.ids[i][k] < 0 || q.ids[i][k] >= llm_vocab_n(s->model->vocab))
                    abort();
        }
    } else if (e.status < 400 || e.status > 599 || !e.msg[0]) {
        abort();
    }
    srv_embed_free(&q);
}

static const char TEMPLATE[] =
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}{%- for t in tools %}{{- t | tojson }}\\n{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
    "{%- if m.content is string %}{{- m.content | trim }}{%- endif %}{%- for c in m.tool_calls | default([]) %}"
    "{{- '<tool_call>' + (c.function | tojson) + '</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- if enable_thinking is false %}"
    "{{- '<think></think>' }}{%- endif %}{%- endif %}";

static void one(const uint8_t *data, size_t size)
{
    static srv s;
    static char none[] = "", bos[] = "<s>";
    static srv_chat fam = {.bos = bos, .eos = none}, jinja = {.bos = bos, .eos = none};
    if (!jinja.tmpl && llm_jinja_compile(TEMPLATE, strlen(TEMPLATE), &jinja.tmpl, NULL))
        abort();
    snprintf(s.name, sizeof s.name, "m");
    s.cfg.max_answer_bytes = 1 << 26;
    embed_one(&s, data, size); /* every body as an embeddings one too */
    int pick = size ? data[0] % 7 : 0;
    fam.family = (llm_chat_template)(pick % 6);
    const srv_chat *chat = pick == 6 ? &jinja : &fam;
    for (int is_chat = 0; is_chat < 2; is_chat++) {
        srv_completion c;
        srv_err e = {0};
        if (srv_parse_completion(&s, chat, NULL, (const char *)data, size, is_chat, &c, &e) == 0) {
            if (c.rq.n < 1 || c.rq.n > LLM_MAX_N || c.rq.n_stop > LLM_MAX_STOPS || (!c.rq.text && !c.rq.tokens))
                abort();
            if (c.rq.max_tokens < 0 || !(c.rq.sampling.temperature >= 0) || !(c.rq.sampling.top_p > 0))
                abort();
        } else if (e.status < 400 || e.status > 599 || !e.msg[0]) {
            abort();
        } else {
            char *body = srv_err_body(&e);
            free(body);
        }
        srv_completion_free(&c);
    }
}

DEEP_FUZZ_TARGET(one)
