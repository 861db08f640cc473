/* strbuf.c - growable printf text buffer; see llm/strbuf.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/strbuf.h"

/* Room for need more bytes and a NUL; 0 or -1 (remembered). */
static int reserve(llm_strbuf *b, size_t need)
{
    if (b->failed)
        return -1;
    if (b->p && b->len + need < b->cap)
        return 0;
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->len + need + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) {
        b->failed = 1;
        return -1;
    }
    b->p = q;
    b->cap = cap;
    return 0;
}

int llm_strbuf_append(llm_strbuf *b, const char *s, size_t n)
{
    if (reserve(b, n))
        return -1;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return 0;
}

void llm_strbuf_printf(llm_strbuf *b, const char *fmt, ...)
{
    for (int pass = 0; pass < 2 && !b->failed; pass++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        if (reserve(b, (size_t)n))
            return;
    }
}

char *llm_strbuf_take(llm_strbuf *b)
{
    char *p = b->failed ? NULL : b->p ? b->p : calloc(1, 1);
    if (b->failed)
        free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
    return p;
}

void llm_strbuf_free(llm_strbuf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

void llm_strbuf_clear(llm_strbuf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = 0;
    b->failed = 0;
}
