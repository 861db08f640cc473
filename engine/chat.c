/* chat.c - chat template families rendered in C (see chat.h). Each
 * renderer appends turns to a growing buffer; the formats follow the
 * templates these families ship in their GGUF files. */
#include <stdarg.h>
#include <string.h>

#include "llm/chat.h"
#include "llm/strbuf.h"

static void cat(llm_strbuf *b, const char *s)
{
    llm_strbuf_append(b, s, strlen(s)); /* a failure is remembered: checked once at the end */
}

static void cats(llm_strbuf *b, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int i = 0; i < n; i++) cat(b, va_arg(ap, const char *));
    va_end(ap);
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

llm_chat_template llm_chat_for_model(const llm_model *m)
{
    gguf_str s;
    if (gguf_get_str(m->gguf, "tokenizer.chat_template", &s, NULL))
        /* a gemma3 file without its template (some conversions drop it)
         * was still trained on Gemma's turns, not chatml's */
        return m->hp.arch == LLM_ARCH_GEMMA3 ? LLM_CHAT_GEMMA : LLM_CHAT_CHATML;
    return llm_chat_detect(s.data, (size_t)s.len);
}

const char *llm_chat_name(llm_chat_template t)
{
    static const char *const n[] = {"chatml", "llama2", "llama3", "mistral", "zephyr", "gemma"};
    return (unsigned)t < 6 ? n[t] : "?";
}

static int is(const llm_chat_msg *m, const char *role) { return !strcmp(m->role, role); }

static void render_chatml(llm_strbuf *b, const llm_chat_msg *m, int n)
{
    for (int i = 0; i < n; i++) cats(b, 5, "<|im_start|>", m[i].role, "\n", m[i].content, "<|im_end|>\n");
    cat(b, "<|im_start|>assistant\n");
}

static void render_llama3(llm_strbuf *b, const llm_chat_msg *m, int n)
{
    for (int i = 0; i < n; i++)
        cats(b, 5, "<|start_header_id|>", m[i].role, "<|end_header_id|>\n\n", m[i].content, "<|eot_id|>");
    cat(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* llama-2: the system prompt goes inside the first [INST] block. Mistral:
 * no system block, the system text leads the first user message. */
static void render_inst(llm_strbuf *b, const llm_chat_msg *m, int n, int llama2)
{
    const char *sys = NULL;
    int first = 1;
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "system")) {
            sys = m[i].content;
        } else if (is(&m[i], "user")) {
            cat(b, first || !llama2 ? "[INST] " : "<s>[INST] "); /* llama-2 repeats BOS per turn */
            if (sys && llama2)
                cats(b, 3, "<<SYS>>\n", sys, "\n<</SYS>>\n\n");
            else if (sys)
                cats(b, 2, sys, "\n\n");
            cats(b, 2, m[i].content, " [/INST]");
            sys = NULL;
            first = 0;
        } else {
            cats(b, 3, llama2 ? " " : "", m[i].content, llama2 ? " </s>" : "</s>");
        }
    }
}

static void render_zephyr(llm_strbuf *b, const llm_chat_msg *m, int n)
{
    for (int i = 0; i < n; i++) cats(b, 5, "<|", m[i].role, "|>\n", m[i].content, "</s>\n");
    cat(b, "<|assistant|>\n");
}

/* Gemma has user and model turns only: a system message leads the next
 * user turn. */
static void render_gemma(llm_strbuf *b, const llm_chat_msg *m, int n)
{
    const char *sys = NULL;
    for (int i = 0; i < n; i++) {
        if (is(&m[i], "system")) {
            sys = m[i].content;
            continue;
        }
        cats(b, 3, "<start_of_turn>", is(&m[i], "assistant") ? "model" : "user", "\n");
        if (sys && is(&m[i], "user"))
            cats(b, 2, sys, "\n\n");
        sys = is(&m[i], "user") ? NULL : sys;
        cats(b, 2, m[i].content, "<end_of_turn>\n");
    }
    cat(b, "<start_of_turn>model\n");
}

char *llm_chat_render(llm_chat_template t, const llm_chat_msg *m, int n, llm_error *err)
{
    if (n < 1) {
        llm_errf(err, LLM_ERR_INVALID_ARG, "messages: at least one message is needed");
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (!m[i].role || !m[i].content || !(is(&m[i], "system") || is(&m[i], "user") || is(&m[i], "assistant"))) {
            llm_errf(err, LLM_ERR_INVALID_ARG, "messages[%d]: role must be system, user or assistant, with content", i);
            return NULL;
        }
    llm_strbuf b = {0};
    switch (t) {
    case LLM_CHAT_LLAMA3: render_llama3(&b, m, n); break;
    case LLM_CHAT_LLAMA2: render_inst(&b, m, n, 1); break;
    case LLM_CHAT_MISTRAL: render_inst(&b, m, n, 0); break;
    case LLM_CHAT_ZEPHYR: render_zephyr(&b, m, n); break;
    case LLM_CHAT_GEMMA: render_gemma(&b, m, n); break;
    default: render_chatml(&b, m, n); break;
    }
    char *text = llm_strbuf_take(&b);
    if (!text)
        llm_errf(err, LLM_ERR_NOMEM, "chat template: no memory");
    return text;
}
