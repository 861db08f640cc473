/* schema_grammar.c - the text library's JSON Schema to grammar conversion for
 * the Python oracle tests (tests/integration/test_schema_oracle.py), which
 * hold the grammar's verdicts on JSON texts against the `jsonschema`
 * package. Usage: schema_grammar < schema.json > grammar.gbnf
 * On a refused schema: "error: MESSAGE" on stdout, exit 2. */
#include <stdio.h>
#include <stdlib.h>

#include <jansson.h>

#include "llm/schema.h"

int main(void)
{
    json_error_t je;
    json_t *schema = json_loadf(stdin, JSON_REJECT_DUPLICATES, &je);
    llm_error e = {0};
    if (!schema) {
        printf("error: %s\n", je.text);
        return 2;
    }
    char *g = NULL;
    llm_status st = llm_schema_grammar(schema, &g, &e);
    json_decref(schema);
    if (st) {
        printf("error: %s\n", e.msg);
        return 2;
    }
    fputs(g, stdout);
    free(g);
    return 0;
}
