/* chat.c - chat template families rendered in C (see chat.h). Each
 * renderer appends turns to a growing buffer; the formats follow the
 * templates these families ship in their GGUF files. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "llm/chat.h"
#include "llm/strbuf.h"

/* The text being rendered and where its message contents lie. */
typedef struct chat_out {
    llm_strbuf b;
    llm_span *sp;
    int n, cap;
    int oom;
} chat_out;

static void cat(chat_out *o, const char *s)
{
    llm_strbuf_append(&o->b, s, strlen(s)); /* a failure is remembered: checked once at the end */
}

static void cats(chat_out *o, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) cat(o, va_arg(ap, const char *));
    va_end(ap);
}

/* A message's own text (a client's: never markup), its span recorded. */
static void content(chat_out *o, const char *s)
{
    size_t start = o->b.len;
    cat(o, s);
    if (o->b.len == start)
        return;
    if (o->n == o->cap) {
        int cap = o->cap ? 2 * o->cap : 16;
        llm_span *p = realloc(o->sp, sizeof *p * (size_t)cap);
        if (!p) {
            o->oom = 1;
            return;
        }
        o->sp = p;
        o->cap = cap;
    }
    o->sp[o->n++] = (llm_span){start, o->b.len};
}

llm_chat_template llm_chat_detect(const char *t, size_t len)
{
    if (!t)
        return LLM_CHAT_CHATML;
    static const struct { const char *mark; llm_chat_template t; } marks[] = {
        {"<|start_header_id|>", LLM_CHAT_LLAMA3}, {"<|im_start|>", LLM_CHAT_CHATML},
        {"<start_of_turn>", LLM_CHAT_GEMMA},      {"<<SYS>>", LLM_CHAT_LLAMA2},
        {"[INST]", LLM_CHAT_MISTRAL},             {"<|user|>", LLM_CHAT_ZEPHYR},
    };
    for (size_t i = 0; i < sizeof marks / sizeof *marks; i++)
        if (memmem(t, len, marks[i].mark, strlen(marks[i].mark)))
            return marks[i].t;
    return LLM_CHAT_CHATML;
}

const char *llm_chat_name(llm_chat_template t)
{
    static const char *const n[] = {"chatml", "llama2", "llama3", "mistral", "zephyr", "gemma"};
    return (unsigned)t < 6 ? n[t] : "?";
}

static int is(const llm_chat_msg *m, const char *role) { return !strcmp(m->role, role); }

static void render_chatml(chat_out *b, const llm_chat_msg *m, int n)
{
    for (int i = 0; i < n; i++) {
        cats(b, 3, "<|im_start|>", m[i].role, "\n");
        content(b, m[i].content);
        cat(b, "<|im_end|>\n");
    }
    cat(b, "<|im_start|>assistant\n");
}

static void render_llama3(chat_out *b, const llm_chat_msg *m, int n)
{
    for (int i = 0; i < n; i++) {
        cats(b, 3, "<|start_header_id|>", m[i].role, "<|end_header_id|>\n\n");
        content(b, m[i].content);
        cat(b, "<|eot_id|>");
    }
    cat(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* llama-2: the system prompt goes inside the first [INST] block. Mistral:
 * no system block, the system text leads the first user message. */
static void render_inst(chat_out *b, const llm_chat_msg *m, int n, int llama2)
{
    const char *sys = NULL;
    int first = 1;
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "system")) {
            sys = m[i].content;
        } else if (is(&m[i], "user")) {
            cat(b, first || !llama2 ? "[INST] " : "<s>[INST] "); /* llama-2 repeats BOS per turn */
            if (sys) {
                cat(b, llama2 ? "<<SYS>>\n" : "");
                content(b, sys);
                cat(b, llama2 ? "\n<</SYS>>\n\n" : "\n\n");
            }
            content(b, m[i].content);
            cat(b, " [/INST]");
            sys = NULL;
            first = 0;
        } else {
            cat(b, llama2 ? " " : "");
            content(b, m[i].content);
            cat(b, llama2 ? " </s>" : "</s>");
        }
    }
}

static void render_zephyr(chat_out *b, const llm_chat_msg *m, int n)
{
    for (int i = 0; i < n; i++) {
        cats(b, 3, "<|", m[i].role, "|>\n");
        content(b, m[i].content);
        cat(b, "</s>\n");
    }
    cat(b, "<|assistant|>\n");
}

/* Gemma has user and model turns only: a system message leads the next
 * user turn. */
static void render_gemma(chat_out *b, const llm_chat_msg *m, int n)
{
    const char *sys = NULL;
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "system")) {
            sys = m[i].content;
            continue;
        }
        cats(b, 3, "<start_of_turn>", is(&m[i], "assistant") ? "model" : "user", "\n");
        if (sys && is(&m[i], "user")) {
            content(b, sys);
            cat(b, "\n\n");
        }
        sys = is(&m[i], "user") ? NULL : sys;
        content(b, m[i].content);
        cat(b, "<end_of_turn>\n");
    }
    cat(b, "<start_of_turn>model\n");
}

char *llm_chat_render_spans(llm_chat_template t, const llm_chat_msg *m, int n, llm_span **spans, int *n_spans,
                           llm_error *err)
{
    *spans = NULL;
    *n_spans = 0;
    if (n < 1) {
        llm_errf(err, LLM_ERR_INVALID_ARG, "messages: at least one message is needed");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!m[i].role || !m[i].content || !(is(&m[i], "system") || is(&m[i], "user") || is(&m[i], "assistant"))) {
            llm_errf(err, LLM_ERR_INVALID_ARG, "messages[%d]: role must be system, user or assistant, with content", i);
            return NULL;
        }
    chat_out o = {0};
    switch (t) {
    case LLM_CHAT_LLAMA3: render_llama3(&o, m, n); break;
    case LLM_CHAT_LLAMA2: render_inst(&o, m, n, 1); break;
    case LLM_CHAT_MISTRAL: render_inst(&o, m, n, 0); break;
    case LLM_CHAT_ZEPHYR: render_zephyr(&o, m, n); break;
    case LLM_CHAT_GEMMA: render_gemma(&o, m, n); break;
    default: render_chatml(&o, m, n); break;
    }
    char *text = llm_strbuf_take(&o.b);
    if (!text || o.oom) {
        free(text);
        free(o.sp);
        llm_errf(err, LLM_ERR_NOMEM, "chat template: no memory");
        return NULL;
    }
    *spans = o.sp;
    *n_spans = o.n;
    return text;
}

char *llm_chat_render(llm_chat_template t, const llm_chat_msg *m, int n, llm_error *err)
{
    llm_span *sp;
    int k;
    char *text = llm_chat_render_spans(t, m, n, &sp, &k, err);
    free(sp);
    return text;
}
