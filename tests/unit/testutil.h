/* testutil.h - helpers shared by the cmocka unit tests: paths to
 * ../shared data (skipping cleanly when absent), temp files, and a seeded
 * RNG for random inputs. */
#ifndef LLM_TESTUTIL_H
#define LLM_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "llm/backend.h"
#include "llm/mkmodel.h"
#include "llm/model.h"

/* ../shared relative to the repository root (tests run from there), or
 * $LLM_SHARED. Returns NULL when the file is missing. */
static inline const char *shared_path(const char *rel, char *buf, size_t n)
{
    const char *root = getenv("LLM_SHARED");
    snprintf(buf, n, "%s/%s", root ? root : "../shared", rel);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

#define SKIP_UNLESS_SHARED(var, rel, buf)                                          \
    const char *var = shared_path(rel, buf, sizeof buf);                           \
    if (!var) {                                                                    \
        print_message("skipped: ../shared/%s not present\n", rel);                \
        skip();                                                                    \
    }

static inline uint64_t test_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float test_randf(uint64_t *s) { return (float)((double)(test_rng(s) >> 11) * (2.0 / 9007199254740992.0) - 1.0); }

static inline char *test_tmpfile(const char *tag, char *buf, size_t n)
{
    const char *dir = getenv("TMPDIR");
    snprintf(buf, n, "%s/llm-test-%s-%d.gguf", dir ? dir : "/tmp", tag, (int)getpid());
    return buf;
}

/* A test group's synthetic model: the "tiny" shape (seeded, weights of
 * type qt) written to a temp file named by tag and loaded, and a CPU
 * backend of n_threads. test_tiny_close undoes it (file removed). */
typedef struct test_tiny {
    llm_model *m;
    llm_backend *b;
    char path[256];
} test_tiny;

/* 0, or -1 with the reason on stderr. */
/* As test_tiny_open, for any llm-mkmodel shape. */
static inline int test_shape_open(test_tiny *t, const char *shape, const char *tag, quant_type qt, uint64_t seed,
                                  int n_threads)
{
    llm_error err = {0};
    memset(t, 0, sizeof *t);
    test_tmpfile(tag, t->path, sizeof t->path);
    if (llm_mkmodel(llm_shape_find(shape), qt, seed, t->path, &err) || llm_model_load(t->path, &t->m, &err) ||
        llm_backend_cpu_new(&(llm_cpu_config){.n_threads = n_threads, .force_scalar = 0, .kernels = NULL}, &t->b, &err)) {
        fprintf(stderr, "%s: setup: %s\n", tag, err.msg);
        return -1;
    }
    return 0;
}

static inline int test_tiny_open(test_tiny *t, const char *tag, quant_type qt, uint64_t seed, int n_threads)
{
    return test_shape_open(t, "tiny", tag, qt, seed, n_threads);
}

static inline void test_tiny_close(test_tiny *t)
{
    llm_model_free(t->m);
    llm_backend_free(t->b);
    remove(t->path);
}

#endif
