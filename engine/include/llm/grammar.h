/* grammar.h - grammars for constrained decoding, in a GBNF-like notation:
 *
 *   root   ::= "{" ws pair ("," ws pair)* "}"     # rules, one per definition
 *   pair   ::= [a-z]+ ":" ws ( "true" | "false" ) # literals, classes, groups
 *   ws     ::= [ \t\n]*                           # * + ? {m} {m,} {m,n}
 *
 * Literals take the escapes \n \r \t \\ \" \' \[ \] \- \^ \xHH \uHHHH and
 * \UHHHHHHHH; classes [a-z], [^"\\], ranges over Unicode code points; "."
 * is any character. A definition runs until the next `name ::=`; `#`
 * comments to the end of the line. The rule `root` (or the one named)
 * is the language. Left recursion (also through rules that can match the
 * empty string) is refused, since a top-down matcher cannot run it.
 *
 * The matcher that walks a compiled grammar is gmatch.h.
 *
 * Ownership: llm_grammar_compile returns a grammar the caller frees with
 * llm_grammar_free (NULL ok). Thread-safety: a compiled grammar is
 * immutable; any number of matchers on any threads may share it. */
#ifndef LLM_GRAMMAR_H
#define LLM_GRAMMAR_H

#include <stddef.h>

#include "llm/status.h"

/* Declared bounds: a grammar text, its rules, its elements after the
 * repetitions are expanded, a repetition count, group nesting. */
#define LLM_GRAMMAR_MAX_BYTES (1u << 20)
#define LLM_GRAMMAR_MAX_RULES 65536
#define LLM_GRAMMAR_MAX_ELEMENTS (1 << 21)
#define LLM_GRAMMAR_MAX_REPEAT 10000
#define LLM_GRAMMAR_MAX_NESTING 128

typedef struct llm_grammar llm_grammar;

/* Compiles len bytes of grammar text; root names the start rule (NULL:
 * "root"). LLM_ERR_GRAMMAR with err giving the line, column and the
 * construct at fault (syntax, an undefined or left-recursive rule, a
 * bound above), LLM_ERR_NOMEM. */
llm_status llm_grammar_compile(const char *text, size_t len, const char *root, llm_grammar **out, llm_error *err);
void llm_grammar_free(llm_grammar *g);

/* JSON (RFC 8259) as a grammar, with two start rules: "json" (any
 * JSON text) and "jsonobject" (an object after optional whitespace,
 * nothing after it: what response_format json_object asks for). The
 * whitespace between tokens is at most one line break with at most
 * LLM_GRAMMAR_JSON_WS spaces or tabs either side, so that a model cannot
 * pad forever. Other grammars may include it and
 * refer to its rules (value, object, array, string, number, ws). */
#define LLM_GRAMMAR_JSON_WS 20
extern const char llm_grammar_json[];

#endif
