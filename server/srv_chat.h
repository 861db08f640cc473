/* srv_chat.h - a chat request as the variables of a Jinja chat template
 * (engine/include/llm/jinja.h): messages, tools, add_generation_prompt,
 * bos_token, eos_token and the request's chat_template_kwargs, converted
 * from the request's JSON.
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

#include "llm/jinja.h"

#define SRV_CHAT_DEPTH 64

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
