/* strbuf.h - a growable text buffer with printf-style and byte appends:
 * the Prometheus expositions of llm-server, llm-controller and
 * llm-router, generated text, rendered chat prompts.
 * An allocation failure is remembered: later appends do nothing and
 * llm_strbuf_take returns NULL, so callers check once at the end.
 *
 * Ownership: the buffer owns its text until llm_strbuf_take hands it over
 * (or llm_strbuf_free drops it). Thread-safety: one buffer per thread. */
#ifndef LLM_STRBUF_H
#define LLM_STRBUF_H

#include <stddef.h>

typedef struct llm_strbuf {
    char *p;
    size_t len, cap;
    int failed;
} llm_strbuf;

void llm_strbuf_printf(llm_strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends n bytes of s (then a NUL, not counted in len); 0, or -1 when
 * this or an earlier append ran out of memory. */
int llm_strbuf_append(llm_strbuf *b, const char *s, size_t n);
/* The text (malloc'd, NUL-terminated, "" when empty) for the caller to free;
 * NULL when an allocation failed. The buffer is empty afterwards. */
char *llm_strbuf_take(llm_strbuf *b);
void llm_strbuf_free(llm_strbuf *b);
/* Empties the buffer for reuse, keeping its memory; an earlier failure is
 * forgotten (what len counts was appended whole). */
void llm_strbuf_clear(llm_strbuf *b);

#endif
