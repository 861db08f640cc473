/* schema.h - a JSON Schema, as structured outputs use them, turned into
 * a grammar (llm/gbnf.h's notation, compiled by the engine) that accepts the JSON texts the schema
 * validates: response_format {"type": "json_schema"}.
 *
 * Supported: type (one or a list; object, array, string, number, integer,
 * boolean, null), properties / required / additionalProperties (absent
 * means false, as strict mode has it: properties come in the listed
 * order), items / minItems / maxItems, enum, const, string pattern (a
 * regular-expression subset: literals, classes, \d \w \s, ., groups,
 * alternation, * + ? {m,n}, anchors), format (date, time, date-time,
 * uuid), minLength / maxLength, minimum / maximum / exclusiveMinimum /
 * exclusiveMaximum (integers: any bound; numbers: bounds that are whole
 * numbers, and then no exponent), anyOf, oneOf (as anyOf: the choices
 * are expected to be disjoint), a one-element allOf, $ref to #/$defs/...
 * or #/definitions/... (recursion included), nullable. Annotations
 * (title, description, default, examples, $schema, $id, $comment,
 * deprecated, readOnly, writeOnly) are ignored. Any other keyword, or a
 * construct above used in a way that is not built, is an error naming it:
 * a schema is never half-honoured.
 *
 * Thread-safety: reentrant. */
#ifndef LLM_SCHEMA_H
#define LLM_SCHEMA_H

#include <jansson.h>

#include "llm/status.h"

/* *out: the grammar text (malloc'd, caller frees; start rule "root": the
 * value, nothing before or after it; gaps as llm/gbnf.h says) for schema. LLM_OK;
 * LLM_ERR_INVALID_ARG with err naming the keyword or bound at fault;
 * LLM_ERR_NOMEM. *out is NULL on failure. */
llm_status llm_schema_grammar(json_t *schema, char **out, llm_error *err);

/* Schema levels (subschemas within subschemas) a schema may nest: each is
 * a level of the converter's recursion. */
#define LLM_SCHEMA_MAX_DEPTH 64
/* The same with at most one space between tokens and no line breaks: for
 * text only a program reads (forced tool calls), where a small model
 * would otherwise spend its max_tokens on indentation (Gemma 3 270M did,
 * greedy, in the mistral-args format). */
llm_status llm_schema_grammar_compact(json_t *schema, char **out, llm_error *err);

#endif
