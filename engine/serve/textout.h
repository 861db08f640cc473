/* textout.h - the text of one completion as it is generated: token pieces
 * go in, text that can be shown comes out. Bytes are held back while they
 * could be the start of a stop string or end inside a UTF-8 character; a
 * stop string ends the text just before it.
 *
 * Ownership: caller-owned struct; textout_free releases its buffer. The
 * stop strings are borrowed and must outlive it. Not thread-safe. */
#ifndef LLM_TEXTOUT_H
#define LLM_TEXTOUT_H

#include <stddef.h>

#include "llm/status.h"
#include "llm/strbuf.h"

typedef struct textout {
    llm_strbuf text;   /* everything generated so far */
    size_t sent;
    const char *const *stops;
    int n_stops;
    int stopped;       /* a stop string matched: nothing more comes out */
} textout;

void textout_init(textout *t, const char *const *stops, int n_stops);
void textout_free(textout *t);
/* Appends a piece; *out and *n get the newly releasable text (pointing into
 * t, valid until the next call). Returns 1 when a stop string matched (the
 * released text ends before it), 0 otherwise, -1 when out of memory. */
int textout_push(textout *t, const char *piece, size_t len, const char **out, size_t *n);
/* At the end (no stop matched): releases whatever was held back. */
void textout_flush(textout *t, const char **out, size_t *n);
#endif
