/* fuzz_schema.c - libFuzzer target for llm-server's JSON Schema to grammar
 * conversion: arbitrary bytes as a response_format json_schema body give a
 * grammar the engine compiles (or an error naming the cause), or a 400
 * naming the keyword; never a crash, leak, UB or hang. The schema is read
 * as llm-server reads it (llm_json_load), nested deep by deep.h's mutator,
 * on a thread with the production stack. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deep.h"
#include "llm/grammar.h"
#include "llm/json.h"
#include "llm/schema.h"

static void one(const uint8_t *data, size_t size)
{
    json_t *schema = llm_json_load((const char *)data, size, JSON_REJECT_DUPLICATES, NULL, NULL);
    if (!schema)
        return;
    llm_error e = {0};
    char *text = NULL;
    llm_status st = llm_schema_grammar(schema, &text, &e);
    json_decref(schema);
    if (st) {
        if ((st != LLM_ERR_INVALID_ARG && st != LLM_ERR_NOMEM) || e.code != st || !e.msg[0] || text)
            abort();
        return;
    }
    llm_grammar *g;
    llm_error err = {0};
    if (llm_grammar_compile(text, strlen(text), NULL, &g, &err) == LLM_OK)
        llm_grammar_free(g);
    else if (!err.msg[0])
        abort();
    free(text);
}

DEEP_FUZZ_TARGET(one)
