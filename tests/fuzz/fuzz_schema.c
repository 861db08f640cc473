/* fuzz_schema.c - libFuzzer target for llm-server's JSON Schema to grammar
 * conversion: arbitrary bytes as a response_format json_schema body give a
 * grammar the engine compiles (or an error naming the cause), or a 400
 * naming the keyword; never a crash, leak, UB or hang. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm/grammar.h"
#include "srv.h"
#include "srv_schema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *schema = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    if (!schema)
        return 0;
    srv_err e = {0};
    char *text = srv_schema_grammar(schema, &e);
    json_decref(schema);
    if (!text) {
        if (e.status < 400 || !e.msg[0])
            abort();
        return 0;
    }
    llm_grammar *g;
    llm_error err = {0};
    if (llm_grammar_compile(text, strlen(text), NULL, &g, &err) == LLM_OK)
        llm_grammar_free(g);
    else if (!err.msg[0])
        abort();
    free(text);
    return 0;
}
