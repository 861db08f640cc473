/* schema_grammar.c - llm-server's JSON Schema to grammar conversion for
 * the Python oracle tests (tests/integration/test_schema_oracle.py), which
 * hold the grammar's verdicts on JSON texts against the `jsonschema`
 * package. Usage: schema_grammar < schema.json > grammar.gbnf
 * On a refused schema: "error: MESSAGE" on stdout, exit 2. */
#include <stdio.h>
#include <stdlib.h>

#include "srv.h"
#include "srv_schema.h"

int main(void)
{
    json_error_t je;
    json_t *schema = json_loadf(stdin, JSON_REJECT_DUPLICATES, &je);
    srv_err e = {0};
    if (!schema) {
        printf("error: %s\n", je.text);
        return 2;
    }
    char *g = srv_schema_grammar(schema, &e);
    json_decref(schema);
    if (!g) {
        printf("error: %s\n", e.msg);
        return 2;
    }
    fputs(g, stdout);
    free(g);
    return 0;
}
