/* srv_schema.h - a JSON Schema, as structured outputs use them, turned into
 * a grammar (engine/grammar.h) that accepts the JSON texts the schema
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
#ifndef SRV_SCHEMA_H
#define SRV_SCHEMA_H

#include <jansson.h>

struct srv_err;

/* The grammar text (malloc'd, caller frees; start rule "root", an
 * optional run of whitespace then the value) for schema, or NULL with e
 * set: 400 naming the keyword (param "response_format"), 503 when memory
 * ran out. */
char *srv_schema_grammar(json_t *schema, struct srv_err *e);

/* Schema levels (subschemas within subschemas) a schema may nest: each is
 * a level of the converter's recursion. */
#define SRV_SCHEMA_MAX_DEPTH 64
/* The same with at most one space between tokens and no line breaks: for
 * text only a program reads (forced tool calls), where a small model
 * would otherwise spend its max_tokens on indentation (Gemma 3 270M did,
 * greedy, in the mistral-args format). */
char *srv_schema_grammar_compact(json_t *schema, struct srv_err *e);

#endif
