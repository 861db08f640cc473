/* tok_heap.h - the bigram priority queue shared by the SPM and BPE merge
 * loops: a binary heap of candidate merges ordered by a key (higher score
 * first for SPM, lower rank first for BPE, made uniform by the caller), ties
 * broken by the leftmost position, exactly as the reference tokenizers do. */
#ifndef LLM_TOK_HEAP_H
#define LLM_TOK_HEAP_H

#include <stdlib.h>

typedef struct tok_bigram {
    double key;   /* smaller pops first */
    int left, right;
    size_t size;  /* byte length of the merged text, to detect stale entries */
} tok_bigram;

typedef struct tok_heap { tok_bigram *a; size_t n, cap; int oom; } tok_heap;

static inline int tok_bigram_less(const tok_bigram *x, const tok_bigram *y)
{
    return x->key < y->key || (x->key == y->key && x->left < y->left);
}

static inline void tok_heap_push(tok_heap *h, tok_bigram b)
{
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        tok_bigram *p = realloc(h->a, cap * sizeof *p);
        if (!p) {
            h->oom = 1;
            return;
        }
        h->a = p;
        h->cap = cap;
    }
    size_t i = h->n++;
    h->a[i] = b;
    while (i > 0 && tok_bigram_less(&h->a[i], &h->a[(i - 1) / 2])) {
        tok_bigram t = h->a[i];
        h->a[i] = h->a[(i - 1) / 2];
        h->a[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static inline tok_bigram tok_heap_pop(tok_heap *h)
{
    tok_bigram top = h->a[0];
    h->a[0] = h->a[--h->n];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && tok_bigram_less(&h->a[l], &h->a[m])) m = l;
        if (r < h->n && tok_bigram_less(&h->a[r], &h->a[m])) m = r;
        if (m == i) break;
        tok_bigram t = h->a[i];
        h->a[i] = h->a[m];
        h->a[m] = t;
        i = m;
    }
    return top;
}

/* A symbol of the merge loops: a byte span of the text, linked to its
 * neighbours; n == 0 marks a symbol merged into its left neighbour. */
typedef struct tok_sym { int prev, next; const char *text; size_t n; } tok_sym;

#endif
