/* logits_rows.c - the engine's logits for given token ids, fed one
 * position at a time through a session (2 CPU threads, F16 KV cache),
 * written as float32 rows (n_ids, n_vocab) to stdout: the engine's side of
 * tests/integration/test_mkmodel_oracle.py, which holds it against
 * llama.cpp's logits on the same files.
 * Usage: logits_rows MODEL.gguf ID... > floats */
#include <stdio.h>
#include <stdlib.h>

#include "llm/model.h"

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    llm_error err = {0};
    llm_model *m = NULL;
    llm_backend *b = NULL;
    llm_session *s = NULL;
    int rc = 1;
    if (llm_model_load(argv[1], &m, &err) || llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 2}, &b, &err) ||
        llm_session_new(m, b, &(llm_session_config){.n_ctx = 512}, &s, &err)) {
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
    llm_backend_free(b);
    llm_model_free(m);
    return rc;
}
