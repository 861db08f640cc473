/* fuzz_gguf.c - libFuzzer target for the GGUF reader and the vocab loader:
 * any byte string must either load or fail with a message; never crash,
 * leak or read out of bounds (built with ASan + UBSan). When a vocab loads,
 * it also tokenizes and detokenizes a fixed text. */
#include <stdint.h>
#include <string.h>

#include "llm/gguf.h"
#include "llm/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *g;
    llm_error err = {0};
    if (gguf_open_buffer(data, size, "fuzz", &g, &err) != LLM_OK) {
        if (!err.msg[0])
            __builtin_trap(); /* every failure must say why */
        return 0;
    }
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        volatile uint8_t sink = 0;
        if (t->nbytes) /* touch both ends: ASan flags any bad bound */
            sink = ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1];
        (void)sink;
    }
    llm_vocab *v;
    if (llm_vocab_load(g, &v, &err) == LLM_OK) {
        static const char text[] = "Hello world's 123 <s> \xe2\x96\x81 caf\xc3\xa9 \xff";
        int32_t *ids;
        int n;
        if (llm_tokenize(v, text, sizeof text - 1, 1, 1, &ids, &n, &err) == LLM_OK) {
            char *back = llm_detokenize(v, ids, n, 1, NULL, &err);
            free(back);
            free(ids);
        }
        llm_vocab_free(v);
    }
    gguf_close(g);
    return 0;
}
