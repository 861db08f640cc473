/* deep.h - what the libFuzzer targets that read JSON share: a mutator that
 * nests (libFuzzer's own rarely builds deep nesting out of a flat seed),
 * and a run on a thread with the stack request code has in production
 * (LLM_THREAD_STACK), so a recursion that does not fit it crashes here as
 * it would in llm-server. Header-only: each target is one program. */
#ifndef FUZZ_DEEP_H
#define FUZZ_DEEP_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "llm/thread.h"

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

/* One time in three: a run of openers (and, half the time, their closers
 * after the next byte) at a random place, 1 to 400 levels deep; else
 * libFuzzer's own mutation. */
static inline size_t deep_mutate(uint8_t *data, size_t size, size_t max, unsigned int seed)
{
    static const char *const opens[] = {"[", "{\"a\":", "[{\"k\":[", "{\"content\":", "{\"properties\":{\"p\":"};
    static const char *const closes[] = {"]", "}", "]}]", "}", "}}"};
    if (seed % 3)
        return LLVMFuzzerMutate(data, size, max);
    int k = (int)(seed / 3 % 5), depth = 1 + (int)(seed / 15 % 400);
    size_t at = size ? (seed / 6000) % (size + 1) : 0, ol = strlen(opens[k]), cl = strlen(closes[k]);
    size_t add = (size_t)depth * (ol + ((seed >> 20) & 1 ? cl : 0));
    if (size + add > max)
        return LLVMFuzzerMutate(data, size, max);
    memmove(data + at + add, data + at, size - at);
    uint8_t *p = data + at;
    for (int i = 0; i < depth; i++, p += ol) memcpy(p, opens[k], ol);
    for (int i = 0; (seed >> 20) & 1 && i < depth; i++, p += cl) memcpy(p, closes[k], cl);
    return size + add;
}

typedef struct deep_job {
    void (*fn)(const uint8_t *, size_t);
    const uint8_t *data;
    size_t size;
} deep_job;

static inline void *deep_job_run(void *arg)
{
    deep_job *j = arg;
    j->fn(j->data, j->size);
    return NULL;
}

/* fn(data, size) on a thread of LLM_THREAD_STACK, as llm-server runs it. */
static inline void deep_run(void (*fn)(const uint8_t *, size_t), const uint8_t *data, size_t size)
{
    deep_job j = {fn, data, size};
    pthread_t t;
    if (llm_thread_create(&t, LLM_THREAD_STACK, deep_job_run, &j))
        abort();
    pthread_join(t, NULL);
}

/* A target's libFuzzer entry points: the nesting mutator, and each input
 * through one(data, size) on the production stack. */
#define DEEP_FUZZ_TARGET(one)                                                                     \
    size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max, unsigned int seed)    \
    {                                                                                            \
        return deep_mutate(data, size, max, seed);                                               \
    }                                                                                            \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)                                 \
    {                                                                                            \
        deep_run(one, data, size);                                                               \
        return 0;                                                                                \
    }

#endif
