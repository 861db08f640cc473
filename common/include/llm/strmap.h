/* strmap.h - an open-addressing map from byte strings to int32, sized
 * once for the number of keys it will hold (a vocabulary's tokens, its
 * merges). Keys are borrowed: they must outlive the map.
 *
 * Ownership: caller-owned struct; llm_strmap_free releases the table.
 * Thread-safety: lookups may run on any number of threads once the puts
 * are done; puts need the caller's exclusion. */
#ifndef LLM_STRMAP_H
#define LLM_STRMAP_H

#include <stddef.h>
#include <stdint.h>

typedef struct llm_strmap_entry { const char *s; uint32_t len; int32_t val; } llm_strmap_entry;
typedef struct llm_strmap { llm_strmap_entry *e; size_t cap; } llm_strmap;

/* A table for up to n keys (at most half full). 0, or -1 when out of memory. */
int llm_strmap_init(llm_strmap *m, size_t n);
/* NULL-safe on a zeroed map; the map is empty and unusable after. */
void llm_strmap_free(llm_strmap *m);
/* Inserts unless present (the first insertion wins, as in llama.cpp's
 * vocabularies). At most the n keys given to llm_strmap_init. */
void llm_strmap_put(llm_strmap *m, const char *s, size_t len, int32_t val);
/* The value of s, or -1 when absent. */
int32_t llm_strmap_get(const llm_strmap *m, const char *s, size_t len);

#endif
