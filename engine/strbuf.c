/* strbuf.c - growable printf text buffer; see llm/strbuf.h. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "llm/strbuf.h"

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
        size_t cap = b->cap ? b->cap * 2 : 16384;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
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
