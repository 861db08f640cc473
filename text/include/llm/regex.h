/* regex.h - a JSON Schema "pattern" (the ECMA-262 subset structured
 * outputs use: literals, classes, \\d \\w \\s and their negations, ., groups
 * (capturing or not), alternation, * + ? {m} {m,} {m,n}, lazy forms, the
 * anchors ^ and $ at the ends) as grammar elements (llm/gbnf.h's notation)
 * matching the text of a JSON string whose value the pattern finds a
 * match in. Sound first: \\D \\W \\S and negated classes holding \\d \\w
 * \\s are taken within ASCII (inside both ECMA's ASCII and Python's Unicode
 * reading), and escapes other than \\" \\\\ \\n \\t \\r are not written: a
 * narrower language, never a wrong one. Lookarounds, backreferences, \\b,
 * \\p{...}, possessive quantifiers are refused.
 * Thread-safety: reentrant. */
#ifndef LLM_REGEX_H
#define LLM_REGEX_H

#include <stddef.h>

#include "llm/strbuf.h"

/* Appends the elements for pattern (n bytes of UTF-8) to out; they refer
 * to the JSON grammar's rule `char` for the unanchored ends. 0, or -1 with
 * why (why_n bytes) naming the construct. */
int llm_regex_grammar(const char *pattern, size_t n, llm_strbuf *out, char *why, size_t why_n);

/* Groups a pattern may nest (each a level of the parser's recursion). */
#define LLM_REGEX_MAX_DEPTH 64

#endif
