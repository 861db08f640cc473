/* gbnf.c - JSON as a grammar text (llm/gbnf.h). */
#include "llm/gbnf.h"

/* "{0,20}": LLM_GBNF_JSON_WS (a string literal cannot take the macro).
 * A gap is nothing, one space, or one line break and an indentation (the
 * rule of llama.cpp's schema converter): a sampled model otherwise spends
 * its budget on blank lines and padding, and nothing may come before or
 * after the top-level value, so that the end of text is the only way on
 * once the value is closed. */
const char llm_gbnf_json[] =
    "json       ::= value\n"
    "jsonobject ::= object\n"
    "value      ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object     ::= \"{\" ws ( member ( ws \",\" ws member )* ws )? \"}\"\n"
    "member     ::= string ws \":\" ws value\n"
    "array      ::= \"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"\n"
    "string     ::= \"\\\"\" char* \"\\\"\"\n"
    "char       ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number     ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws         ::= ( \" \" | \"\\n\" [ \\t]{0,20} )?\n";
