// peer.h - what the llama.cpp peer programs share: llama.cpp quiet, its
// backends up, and the model loaded (NULL, with a line on stderr, when it
// cannot be).
#ifndef LLM_TESTS_PEER_H
#define LLM_TESTS_PEER_H

#include <cstdio>

#include "llama.h"

static llama_model *peer_load(const char *path)
{
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model *model = llama_model_load_from_file(path, llama_model_default_params());
    if (!model)
        fprintf(stderr, "error: cannot load %s\n", path);
    return model;
}

#endif
