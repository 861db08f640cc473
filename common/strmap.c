/* strmap.c - the byte-string to int32 map (llm/strmap.h). FNV-1a, not the
 * keyed hash: a map's keys come from a model file or a test's vocabulary,
 * and lookups cannot add keys, so nobody outside chooses the probe lengths. */
#include "llm/strmap.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int llm_strmap_init(llm_strmap *m, size_t n)
{
    m->cap = 16;
    while (m->cap < n * 2) m->cap <<= 1;
    m->e = calloc(m->cap, sizeof *m->e);
    return m->e ? 0 : -1;
}

void llm_strmap_free(llm_strmap *m)
{
    free(m->e);
    m->e = NULL;
}

void llm_strmap_put(llm_strmap *m, const char *s, size_t len, int32_t val)
{
    size_t i = hash_bytes(s, len) & (m->cap - 1);
    for (; m->e[i].s; i = (i + 1) & (m->cap - 1))
        if (m->e[i].len == len && !memcmp(m->e[i].s, s, len))
            return;
    m->e[i] = (llm_strmap_entry){s, (uint32_t)len, val};
}

int32_t llm_strmap_get(const llm_strmap *m, const char *s, size_t len)
{
    if (!m->e)
        return -1;
    size_t i = hash_bytes(s, len) & (m->cap - 1);
    for (; m->e[i].s; i = (i + 1) & (m->cap - 1))
        if (m->e[i].len == len && !memcmp(m->e[i].s, s, len))
            return m->e[i].val;
    return -1;
}
