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
 * The matcher that walks a compiled grammar is gmatch.h; the notation
 * (its bounds, JSON as a grammar) is the text library's llm/gbnf.h.
 *
 * Ownership: llm_grammar_compile returns a grammar the caller frees with
 * llm_grammar_free (NULL ok). Thread-safety: a compiled grammar is
 * immutable; any number of matchers on any threads may share it. */
#ifndef LLM_GRAMMAR_H
#define LLM_GRAMMAR_H

#include <stddef.h>

#include "llm/gbnf.h"
#include "llm/status.h"

/* Declared bounds of the compiler: rules, elements after the repetitions
 * are expanded, group nesting (the text's own bounds, a text's bytes and a
 * repetition count, are the notation's: llm/gbnf.h). */
#define LLM_GRAMMAR_MAX_RULES 65536
#define LLM_GRAMMAR_MAX_ELEMENTS (1 << 21)
#define LLM_GRAMMAR_MAX_NESTING 128

typedef struct llm_grammar llm_grammar;

/* Compiles len bytes of grammar text; root names the start rule (NULL:
 * "root"). LLM_ERR_GRAMMAR with err giving the line, column and the
 * construct at fault (syntax, an undefined or left-recursive rule, a
 * bound above), LLM_ERR_NOMEM. */
llm_status llm_grammar_compile(const char *text, size_t len, const char *root, llm_grammar **out, llm_error *err);
void llm_grammar_free(llm_grammar *g);

#endif
