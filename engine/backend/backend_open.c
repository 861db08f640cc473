/* backend_open.c - opening the backends a server or tool runs on by name:
 * one, or one per rank for tensor parallelism. */
#include <string.h>
#include <unistd.h>

#include "llm/backend.h"

llm_status llm_backends_open(const llm_backend_spec *spec, llm_backend **out, llm_error *err)
{
    int n = spec->n_ranks > 0 ? spec->n_ranks : 1;
    const char *kind = spec->kind && *spec->kind ? spec->kind : "cpu";
    int is_cpu = !strcmp(kind, "cpu");
    if (!is_cpu && strcmp(kind, "cuda"))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "backend '%s' is unknown (cpu or cuda)", kind);
    if (n > LLM_MAX_RANKS)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "tensor parallel %d: at most %d ranks", n, LLM_MAX_RANKS);
    int threads = spec->cpu.n_threads > 0 ? spec->cpu.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    llm_status st = LLM_OK;
    for (int r = 0; r < n && !st; r++) {
        if (is_cpu) {
            llm_cpu_config cc = spec->cpu;
            /* the ranks share the machine's cores */
            cc.n_threads = threads / n > 0 ? threads / n : 1;
            st = llm_backend_cpu_new(&cc, &out[r], err);
        } else {
            llm_cuda_config gc = {spec->first_device + r};
            st = llm_backend_cuda_new(&gc, &out[r], err);
        }
        if (st)
            for (int i = 0; i < r; i++) {
                llm_backend_free(out[i]);
                out[i] = NULL;
            }
    }
    return st;
}
