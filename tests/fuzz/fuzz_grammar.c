/* fuzz_grammar.c - libFuzzer target for the grammar compiler and matcher:
 * the input is a grammar text, a NUL, then bytes of output. The grammar
 * compiles or fails with a message; a compiled one is walked over the
 * output a byte or a few at a time, and llm_gmatch_viable must agree with
 * what feeding does. Never a crash, leak, UB or hang (ASan + UBSan). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm/gmatch.h"

static void walk(const llm_grammar *g, const char *out, size_t n)
{
    llm_gmatch *m;
    llm_error err = {0};
    if (llm_gmatch_new(g, NULL, NULL, 0, &m, &err))
        return;
    for (size_t i = 0; i < n;) {
        size_t k = 1 + (unsigned char)out[i] % 3;
        k = k > n - i ? n - i : k;
        int v = llm_gmatch_viable(m, out + i, k);
        llm_status st = llm_gmatch_feed(m, out + i, k, &err);
        if ((v == 1) != (st == LLM_OK) && v >= 0)
            abort(); /* the two must agree */
        if (st)
            break;
        i += k;
    }
    (void)llm_gmatch_complete(m);
    llm_gmatch_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data, *nul = memchr(data, 0, size);
    size_t tl = nul ? (size_t)(nul - text) : size;
    llm_grammar *g;
    llm_error err = {0};
    if (llm_grammar_compile(text, tl, NULL, &g, &err)) {
        if (!err.msg[0])
            abort();
        return 0;
    }
    if (nul)
        walk(g, nul + 1, size - tl - 1);
    llm_grammar_free(g);
    return 0;
}
