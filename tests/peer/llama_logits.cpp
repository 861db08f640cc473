// llama_logits.cpp - a peer for black-box comparison: llama.cpp's logits
// for given token ids (one batch, every position), written as float32 rows
// (n_ids, n_vocab) to OUT. Built by tests/peer scripts only when
// LLAMA_CPP_DIR points at a llama.cpp checkout with a CMake build.
//   llama_logits [--lora ADAPTER.gguf SCALE] MODEL.gguf OUT.bin ID...
// (--lora: with that adapter at that scale, as llama-server --lora-scaled)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "llama.h"
#include "peer.h"

int main(int argc, char **argv)
{
    const char *lora_path = nullptr;
    float scale = 1;
    if (argc > 4 && !strcmp(argv[1], "--lora")) {
        lora_path = argv[2];
        scale = (float)atof(argv[3]);
        argc -= 3, argv += 3;
    }
    if (argc < 4) {
        fprintf(stderr, "usage: llama_logits [--lora ADAPTER.gguf SCALE] MODEL.gguf OUT.bin ID...\n");
        return 2;
    }
    llama_model *model = peer_load(argv[1]);
    if (!model)
        return 1;
    std::vector<llama_token> toks;
    for (int i = 3; i < argc; i++) toks.push_back(atoi(argv[i]));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = 2;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (lora_path) {
        llama_adapter_lora *lora = llama_adapter_lora_init(model, lora_path);
        if (!lora || llama_set_adapters_lora(ctx, &lora, 1, &scale)) {
            fprintf(stderr, "error: llama.cpp refused the adapter %s\n", lora_path);
            return 1;
        }
    }
    llama_batch b = llama_batch_init((int)toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        b.token[i] = toks[i];
        b.pos[i] = (llama_pos)i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = 1;
    }
    b.n_tokens = (int)toks.size();
    if (llama_decode(ctx, b))
        return 1;
    int nv = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE *f = fopen(argv[2], "wb");
    if (!f)
        return 1;
    for (size_t i = 0; i < toks.size(); i++) fwrite(llama_get_logits_ith(ctx, (int)i), sizeof(float), nv, f);
    fclose(f);
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
