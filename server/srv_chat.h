/* srv_chat.h - chat requests rendered into prompt text with the model's
 * own chat template: the GGUF's tokenizer.chat_template run by the Jinja
 * interpreter (engine/include/llm/jinja.h) with the variables messages,
 * tools, add_generation_prompt, bos_token, eos_token and the request's
 * chat_template_kwargs; or, when the template does not compile or the
 * server is told so (chat_template: builtin), the built-in family renderer
 * (engine/include/llm/chat.h). Message contents are strings or arrays of
 * text parts (joined).
 *
 * Every string from the request is tenant data (its bytes become spans
 * that are tokenized as plain text) except a message's role, which must be
 * a short lower-case word (a-z and '_', at most 32 bytes): templates glue
 * roles into markup, so a role never carries anything else.
 *
 * Bounds: values nested deeper than SRV_CHAT_DEPTH are refused.
 * Thread-safety: reentrant; the values live in the caller's llm_jctx. */
#ifndef SRV_CHAT_H
#define SRV_CHAT_H

#include <jansson.h>

#include "llm/chat.h"
#include "llm/jinja.h"
#include "llm/model.h"
#include "llm/tools.h"

#define SRV_CHAT_DEPTH 64

struct srv_err;

/* A model's chat renderer; immutable once made (any thread may render). */
typedef struct srv_chat {
    llm_jinja *tmpl;          /* the model's template; NULL: the family renderer */
    llm_chat_template family; /* used when tmpl is NULL */
    char *bos, *eos;          /* token texts for bos_token and eos_token */
    int drop_bos;             /* the tokenizer adds BOS itself: a render's leading bos_token goes */
    llm_tool_format tools;    /* how the template shows tools and the model writes calls */
    int32_t markers[8];       /* that format's markers which are control tokens in this vocabulary */
    int n_markers;
    char what[256];           /* which renderer, and why, for the log */
} srv_chat;

/* The renderer for m. mode "auto": the template of file (a path; NULL or
 * "": none) or else the model's, when it compiles, else the model's family
 * (what says why); "builtin": the family. NULL with err set:
 * LLM_ERR_INVALID_ARG (mode), LLM_ERR_IO (file unreadable),
 * LLM_ERR_TEMPLATE (file does not compile), LLM_ERR_NOMEM. */
srv_chat *srv_chat_new(const llm_model *m, const char *mode, const char *file, llm_error *err);
void srv_chat_free(srv_chat *c);

/* The prompt text for a chat body (its messages, add_generation_prompt,
 * chat_template_kwargs; body_len its size as received, which scales the
 * render's memory bound) and the request's tools t (NULL: none; the
 * template shows them, or in the generic format the conversation does),
 * malloc'd, and *spans (malloc'd, caller frees; NULL when none) the byte
 * ranges of request text in it. Assistant tool_calls reach the template
 * with their arguments as objects. NULL with e set: 400 naming the field
 * (a bad message, the template raised or failed: its message), 503 out of
 * memory. */
char *srv_chat_render(const srv_chat *c, json_t *body, size_t body_len, const llm_tools *t, llm_span **spans,
                      int *n_spans, struct srv_err *e);

/* A JSON value as a template value; tenant marks its strings (and keys).
 * NULL with err set: LLM_ERR_INVALID_ARG (too deep), LLM_ERR_NOMEM. */
llm_jv *srv_chat_value(llm_jctx *c, json_t *v, int tenant, llm_error *err);

/* The variables dict for a chat request: messages (an array of objects
 * with a valid role), tools (an array, or NULL), add_generation_prompt,
 * bos_token and eos_token (NULL: ""), and kwargs (an object, or NULL)
 * whose members are added first so the names above win. NULL with err
 * set: LLM_ERR_INVALID_ARG naming the message or field, LLM_ERR_NOMEM. */
llm_jv *srv_chat_vars(llm_jctx *c, json_t *messages, json_t *tools, int add_generation_prompt, const char *bos,
                      const char *eos, json_t *kwargs, llm_error *err);

#endif
