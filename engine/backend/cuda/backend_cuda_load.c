/* backend_cuda_load.c - llm_backend_cuda_new: loads the CUDA backend from
 * libllm_cuda.so at run time, so the same binaries run on machines without
 * CUDA (they only fail when asked for backend cuda, saying why). The
 * library is looked for at $LLM_CUDA_LIB, then beside the executable
 * (../lib/libllm_cuda.so, as the build tree and the image lay it out), then
 * on the loader's path. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm/backend.h"

typedef llm_status (*cuda_new_fn)(const llm_cuda_config *cfg, llm_backend **out, llm_error *err);

static void *try_open(const char *path, char *why, size_t n)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        size_t used = strlen(why);
        snprintf(why + used, n - used, "%s%s", used ? "; " : "", e ? e : path);
    }
    return h;
}

/* ../lib/libllm_cuda.so relative to the running executable. */
static int beside_exe(char *out, size_t n)
{
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len <= 0)
        return -1;
    exe[len] = 0;
    char *slash = strrchr(exe, '/');
    if (!slash)
        return -1;
    *slash = 0;
    return snprintf(out, n, "%s/../lib/libllm_cuda.so", exe) < (int)n ? 0 : -1;
}

llm_status llm_backend_cuda_new(const llm_cuda_config *cfg, llm_backend **out, llm_error *err)
{
    *out = NULL;
    static void *lib; /* loaded once, never unloaded (CUDA does not like that) */
    char why[LLM_ERROR_MSG_MAX - 128] = "", path[PATH_MAX];
    if (!lib && getenv("LLM_CUDA_LIB"))
        lib = try_open(getenv("LLM_CUDA_LIB"), why, sizeof why);
    if (!lib && !beside_exe(path, sizeof path) && access(path, R_OK) == 0)
        lib = try_open(path, why, sizeof why);
    if (!lib)
        lib = try_open("libllm_cuda.so", why, sizeof why);
    if (!lib)
        return llm_errf(err, LLM_ERR_UNSUPPORTED,
                        "cuda backend: cannot load libllm_cuda.so (built only where nvcc is present): %s", why);
    cuda_new_fn fn = (cuda_new_fn)dlsym(lib, "llm_cuda_plugin_new");
    if (!fn)
        return llm_errf(err, LLM_ERR_UNSUPPORTED, "cuda backend: libllm_cuda.so has no llm_cuda_plugin_new");
    return fn(cfg, out, err);
}
