/* logits_rows.c - the engine's logits for given token ids, fed one
 * position at a time through a session (2 CPU threads, F16 KV cache),
 * written as float32 rows (n_ids, n_vocab) to stdout: the engine's side of
 * tests/integration/test_mkmodel_oracle.py, which holds it against
 * llama.cpp's logits on the same files.
 * With --lora, every position runs with that adapter at that scale
 * (tests/integration/test_lora.py against llama.cpp's --lora-scaled).
 * Usage: logits_rows [--lora ADAPTER.gguf SCALE] MODEL.gguf ID... > floats */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/lora.h"
#include "llm/model.h"

int main(int argc, char **argv)
{
    const char *lora_path = NULL;
    float scale = 1;
    if (argc > 3 && !strcmp(argv[1], "--lora")) {
        lora_path = argv[2];
        scale = strtof(argv[3], NULL);
        argc -= 3, argv += 3;
    }
    if (argc < 3)
        return 2;
    llm_error err = {0};
    llm_model *m = NULL;
    llm_backend *b = NULL;
    llm_session *s = NULL;
    llm_lora *l = NULL;
    int rc = 1;
    if (llm_model_load(argv[1], &m, &err) || llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 2}, &b, &err) ||
        (lora_path && llm_lora_load(lora_path, m, 0, &l, &err)) ||
        llm_session_new(m, b, &(llm_session_config){.n_ctx = 512, .lora = l, .lora_scale = scale}, &s, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        goto out;
    }
    for (int i = 2; i < argc; i++) {
        int32_t t = (int32_t)strtol(argv[i], NULL, 10);
        const float *lg;
        if (llm_session_eval(s, &t, 1, &lg, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            goto out;
        }
        if (fwrite(lg, sizeof(float), (size_t)m->hp.n_vocab, stdout) != (size_t)m->hp.n_vocab)
            goto out;
    }
    rc = 0;
out:
    llm_session_free(s);
    llm_lora_free(l);
    llm_backend_free(b);
    llm_model_free(m);
    return rc;
}
