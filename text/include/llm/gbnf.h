/* gbnf.h - the grammar notation's facts that text producers need (the
 * JSON Schema and regular-expression converters, the server): the bounds
 * every grammar text must keep, and JSON as a grammar to build on. The
 * notation itself and its compiler: the engine's llm/grammar.h.
 * Thread-safety: constants only. */
#ifndef LLM_GBNF_H
#define LLM_GBNF_H

/* The most bytes of grammar text the compiler takes, and the largest
 * repetition count ({m}, {m,n}) it expands. */
#define LLM_GBNF_MAX_BYTES (1u << 20)
#define LLM_GBNF_MAX_REPEAT 10000

/* JSON (RFC 8259) as a grammar, with two start rules: "json" (any
 * JSON value) and "jsonobject" (an object: what response_format
 * json_object asks for); nothing before or after the value. A gap
 * between tokens is nothing, one space, or one line break followed by
 * at most LLM_GBNF_JSON_WS spaces or tabs, so that a model cannot pad
 * forever. Other grammars may include it and refer to its rules (value,
 * object, array, string, number, ws). */
#define LLM_GBNF_JSON_WS 20
extern const char llm_gbnf_json[];

#endif
