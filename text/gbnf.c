/* gbnf.c - JSON as a grammar text (llm/gbnf.h). */
#include "llm/gbnf.h"

/* "{0,20}": LLM_GBNF_JSON_WS (a string literal cannot take the macro).
 * At most one line break per gap: small models otherwise fill the
 * output with blank lines that the grammar would have to allow. */
const char llm_gbnf_json[] =
    "json       ::= ws value ws\n"
    "jsonobject ::= ws object\n"
    "value      ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
    "object     ::= \"{\" ws ( member ( ws \",\" ws member )* ws )? \"}\"\n"
    "member     ::= string ws \":\" ws value\n"
    "array      ::= \"[\" ws ( value ( ws \",\" ws value )* ws )? \"]\"\n"
    "string     ::= \"\\\"\" char* \"\\\"\"\n"
    "char       ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} )\n"
    "number     ::= \"-\"? ( \"0\" | [1-9] [0-9]* ) ( \".\" [0-9]+ )? ( [eE] [-+]? [0-9]+ )?\n"
    "ws         ::= [ \\t]{0,20} ( \"\\r\"? \"\\n\" [ \\t]{0,20} )?\n";
