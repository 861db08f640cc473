// llama_greedy.cpp - a peer for black-box comparison: greedy generation
// through llama.cpp's C API, printing the prompt ids and generated ids in
// the same form as `llm-generate --ids`. Built by tests only when
// LLAMA_CPP_DIR points at a llama.cpp checkout with a CMake build.
//   llama_greedy MODEL.gguf PROMPT N_TOKENS [LORA.gguf SCALE]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "llama.h"
#include "peer.h"

int main(int argc, char **argv)
{
    if (argc != 4 && argc != 6) {
        fprintf(stderr, "usage: llama_greedy MODEL.gguf PROMPT N [LORA.gguf SCALE]\n");
        return 2;
    }
    llama_model *model = peer_load(argv[1]);
    if (!model)
        return 1;
    const llama_vocab *vocab = llama_model_get_vocab(model);
    std::vector<llama_token> toks(strlen(argv[2]) + 16);
    int n = llama_tokenize(vocab, argv[2], (int)strlen(argv[2]), toks.data(), (int)toks.size(), true, true);
    if (n < 0)
        return 1;
    toks.resize(n);
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + atoi(argv[3]) + 16 > 512 ? n + atoi(argv[3]) + 16 : 512; /* the whole prompt in one batch (n_batch 2048) */
    cp.n_threads = cp.n_threads_batch = 2;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (argc == 6) { /* an adapter, at its scale, as llama-server --lora does */
        llama_adapter_lora *lora = llama_adapter_lora_init(model, argv[4]);
        float scale = (float)atof(argv[5]);
        if (!lora || llama_set_adapters_lora(ctx, &lora, 1, &scale)) {
            fprintf(stderr, "error: llama.cpp refused the adapter %s\n", argv[4]);
            return 1;
        }
    }
    fprintf(stderr, "prompt ids:");
    for (llama_token t : toks) fprintf(stderr, " %d", t);
    fprintf(stderr, "\ngenerated ids:");
    llama_batch batch = llama_batch_get_one(toks.data(), (int)toks.size());
    int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token next;
    for (int i = 0; i < atoi(argv[3]); i++) {
        if (llama_decode(ctx, batch))
            return 1;
        const float *logits = llama_get_logits_ith(ctx, -1);
        next = 0;
        for (int j = 1; j < n_vocab; j++)
            if (logits[j] > logits[next])
                next = j;
        if (llama_vocab_is_eog(vocab, next))
            break;
        fprintf(stderr, " %d", next);
        batch = llama_batch_get_one(&next, 1);
    }
    fprintf(stderr, "\n");
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
