/* chat.h - chat templates: messages -> the prompt text a chat model was
 * trained on. The GGUF key tokenizer.chat_template holds a Jinja template;
 * rather than run Jinja we recognise the common families by their marker
 * strings and render them in C: llama-2, llama-3, chatml (Qwen and many
 * others), mistral, zephyr, gemma. Models without a template, or with one we
 * do not recognise, get chatml (documented in the README), as llama.cpp's
 * server does; except gemma3 files without one, which get gemma.
 *
 * The rendered text has no BOS: tokenize it with add_special = 1 (the BOS
 * the vocabulary asks for) and the markers as special tokens, but not the
 * messages' contents: llm_chat_render_spans says where those lie, for
 * llm_tokenize_guarded (a user's "<|im_end|>" must stay text, or anyone
 * could forge a system turn). Thread-safety: pure functions. */
#ifndef LLM_CHAT_H
#define LLM_CHAT_H

#include <stddef.h>

#include "llm/status.h"
#include "llm/utf8.h"

typedef enum llm_chat_template {
    LLM_CHAT_CHATML = 0,
    LLM_CHAT_LLAMA2 = 1,
    LLM_CHAT_LLAMA3 = 2,
    LLM_CHAT_MISTRAL = 3,
    LLM_CHAT_ZEPHYR = 4,
    LLM_CHAT_GEMMA = 5,
} llm_chat_template;

typedef struct llm_chat_msg {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} llm_chat_msg;

/* The family of a template text (NULL or unknown: chatml). */
llm_chat_template llm_chat_detect(const char *tmpl, size_t len);
const char *llm_chat_name(llm_chat_template t);

/* Renders messages, ending with the assistant's turn opened. Returns a
 * malloc'd NUL-terminated string, or NULL with err set: LLM_ERR_INVALID_ARG
 * for a role other than system/user/assistant or no messages,
 * LLM_ERR_NOMEM. */
char *llm_chat_render(llm_chat_template t, const llm_chat_msg *msgs, int n, llm_error *err);
/* The same, and *spans (malloc'd, caller frees; NULL when none) the
 * *n_spans byte ranges of the text that are message contents, in order. */
char *llm_chat_render_spans(llm_chat_template t, const llm_chat_msg *msgs, int n, llm_span **spans, int *n_spans,
                           llm_error *err);

#endif
