/* tools.h - tool calling: the request's tools, tool_choice and
 * parallel_tool_calls; how the model writes calls (its template's format);
 * the prompt prefill and grammar that force a call (tool_choice required
 * or a named function); and the calls parsed back out of the model's text
 * as OpenAI tool_calls (arguments as a JSON string).
 *
 * Formats, told from the chat template's text:
 *   hermes   <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one
 *            block per call (Qwen 2.5/3, Hermes, SmolLM3, GLM ...);
 *   llama3   the whole answer a JSON object {"name": ..., "parameters":
 *            {...}} (Llama 3.1-3.3; <|python_tag|> before it is skipped);
 *   mistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Nemo);
 *   mistral-args  [TOOL_CALLS]name[ARGS]{...} (Mistral Small 3.2, Devstral);
 *   xml      <tool_call><function=name><parameter=key>value</parameter>...
 *            </function></tool_call> (Qwen3-Coder, Qwen 3.5, Nemotron 3,
 *            Step 3.5; Seed-OSS's <seed:tool_call>): a value is text, read
 *            as the parameter's schema type says (JSON when it is not a
 *            string, or when there is no schema and it parses);
 *   gemma4   <|tool_call>call:name{key:value,...}<tool_call|> (Gemma 4):
 *            keys bare, strings between <|"|> quotes, the rest JSON-like;
 *            its markers are control tokens, so a request in this format
 *            asks the engine for their text (llm_tools_markers).
 *   generic  templates that do not show tools (and the built-in families):
 *            the tools are described in the conversation and the model
 *            answers {"tool_calls": [{"name": ..., "arguments": {...}}]}.
 * Control tokens are not in the engine's text (but for gemma4), so a
 * parser takes each format with or without its markers. A forced call in
 * the xml and gemma4 formats uses the generic shape: a grammar can hold
 * neither raw parameter text nor control-token quotes.
 *
 * Thread-safety: reentrant; llm_tools borrows the request's JSON. */
#ifndef LLM_TOOLS_H
#define LLM_TOOLS_H

#include <jansson.h>
#include <stddef.h>

#include "llm/status.h"

typedef enum llm_tool_format {
    LLM_TOOLS_GENERIC = 0,
    LLM_TOOLS_HERMES,
    LLM_TOOLS_LLAMA3,
    LLM_TOOLS_MISTRAL,
    LLM_TOOLS_MISTRAL_ARGS,
    LLM_TOOLS_XML,
    LLM_TOOLS_GEMMA4,
} llm_tool_format;

typedef enum llm_tool_choice { LLM_TOOL_NONE = 0, LLM_TOOL_AUTO, LLM_TOOL_REQUIRED, LLM_TOOL_NAMED } llm_tool_choice;

typedef struct llm_tools {
    json_t *tools;          /* the request's tools (borrowed); NULL: none */
    llm_tool_choice choice; /* NONE when there are no tools */
    const char *named;      /* LLM_TOOL_NAMED: the function */
    int parallel;           /* parallel_tool_calls (default true) */
    llm_tool_format fmt;    /* how the model writes calls */
    llm_tool_format out;    /* how this request's calls come out (a forced call may use another) */
} llm_tools;

/* The format a chat template's text shows tools in (NULL: generic). */
llm_tool_format llm_tools_format(const char *tmpl, size_t len);
const char *llm_tools_format_name(llm_tool_format f);

/* Reads tools, tool_choice and parallel_tool_calls from a chat body.
 * LLM_OK, or LLM_ERR_INVALID_ARG with err naming the field (err->field). */
llm_status llm_tools_parse(json_t *body, llm_tool_format fmt, llm_tools *t, llm_error *err);

/* For tool_choice required or named: *prefill, text that opens the call
 * (appended to the prompt as markup), and *grammar, what the answer must
 * then be (both malloc'd; caller frees). LLM_OK, LLM_ERR_NOMEM, or
 * LLM_ERR_INVALID_ARG with err->field "tools" (a tool's parameters use a
 * JSON Schema keyword that is not built; the message names it). */
llm_status llm_tools_forced(llm_tools *t, char **prefill, char **grammar, llm_error *err);

/* Generic format: the text that tells the model its tools and how to call
 * them (malloc'd), or NULL when memory ran out. */
char *llm_tools_instructions(const llm_tools *t);

/* The calls in a model's answer (prefill, then text): *calls a JSON array
 * of OpenAI tool calls, or NULL when the answer holds no valid call (then
 * it is all content); *content the text outside the calls (malloc'd; NULL
 * when there is none). Calls name only the request's tools. LLM_OK;
 * LLM_ERR_NOMEM when memory ran out; LLM_ERR_TOO_LONG when a JSON value in
 * it is nested deeper than LLM_JSON_MAX_DEPTH or over its memory budget
 * (llm/json.h), which no answer can carry (nothing is returned then). */
llm_status llm_tools_extract(const llm_tools *t, const char *prefill, const char *text, size_t n, json_t **calls,
                             char **content);

/* The texts of format f's markers that vocabularies make control tokens
 * (gemma4's tags and quotes), whose text an answer must carry for its
 * calls to be read back; NULL-terminated, static, empty for the others. */
const char *const *llm_tools_markers(llm_tool_format f);

/* 1 when this request's answer is read in a format with such markers
 * (tools offered, the call not forced into the generic shape). */
int llm_tools_shows_markers(const llm_tools *t);

/* Streaming: how many bytes of the answer so far (text, n bytes, of which
 * the first from went out already, and this said so) may go out as
 * content; the rest may be, or start, a call. Looks only past from where
 * it can, so a stream costs linear time. */
size_t llm_tools_releasable(const llm_tools *t, const char *text, size_t n, size_t from);

#endif
