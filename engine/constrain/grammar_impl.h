/* grammar_impl.h - the compiled form of a grammar, shared by grammar.c
 * (which builds it) and gmatch.c (which walks it). Not a public API.
 *
 * Every alternative of every rule is a run of elements in el[] ended by
 * GEL_END; a position is an index into el[]. Rule r's alternatives start
 * at alt[rule_alt[r] .. rule_alt[r + 1]). A character element names a
 * class: ranges rng[cls.first .. cls.first + cls.n) of code points,
 * inclusive, sorted and disjoint, matched or (neg) excluded. */
#ifndef LLM_GRAMMAR_IMPL_H
#define LLM_GRAMMAR_IMPL_H

#include <stdint.h>
#include <stdlib.h>

#include "llm/grammar.h"

typedef enum gel_type { GEL_END = 0, GEL_CHAR = 1, GEL_REF = 2 } gel_type;

typedef struct gel {
    int32_t type; /* gel_type */
    int32_t arg;  /* GEL_CHAR: class; GEL_REF: rule */
} gel;

typedef struct gclass {
    int32_t first, n;
    int32_t neg;
} gclass;

typedef struct grange {
    uint32_t lo, hi;
} grange;

struct llm_grammar {
    gel *el;
    int n_el;
    int32_t *alt;      /* (n_alt) start positions */
    int n_alt;
    int32_t *rule_alt; /* (n_rule + 1) */
    int n_rule;
    gclass *cls;
    int n_cls;
    grange *rng;
    int n_rng;
    int root;
    int32_t *rest;     /* (n_el + 1) the fewest bytes that finish an alternative from each position (grammar_cost.c) */
    uint64_t id;          /* unique to this compiled grammar in the process (never reused): masks cached for
                           * its states are kept under it (gmatch.c), never under a hash a client could aim */
};

/* A cost no string reaches: a rule without a finite string, or sums past it. */
#define GRAMMAR_COST_INF (1 << 29)

/* g->rest for a compiled grammar (grammar_cost.c). 0, or -1 on no memory
 * (the caller names it: it is the one failure). */
int grammar_cost_build(llm_grammar *g);

/* Makes room in *v (n items used, capacity *cap) for one more of size sz,
 * doubling from first: the parser's and the matcher's growing arrays.
 * 0, or -1 on no memory (*v unchanged). */
static inline int grammar_grow(void **v, int n, int *cap, size_t sz, int first)
{
    if (n < *cap)
        return 0;
    int nc = *cap ? *cap * 2 : first;
    void *nv = realloc(*v, sz * (size_t)nc); /* lint: realloc checked */
    if (!nv)
        return -1;
    *v = nv;
    *cap = nc;
    return 0;
}

/* 1 when code point cp is in class c. */
static inline int grammar_class_has(const struct llm_grammar *g, int c, uint32_t cp)
{
    const gclass *k = &g->cls[c];
    int lo = k->first, hi = k->first + k->n - 1, in = 0;
    while (lo <= hi && !in) { /* ranges sorted and disjoint: binary search */
        int mid = (lo + hi) / 2;
        if (cp < g->rng[mid].lo)
            hi = mid - 1;
        else if (cp > g->rng[mid].hi)
            lo = mid + 1;
        else
            in = 1;
    }
    return in != k->neg;
}

/* 1 when class c holds some code point of [lo, hi]. O(log ranges): a
 * class may have hundreds of thousands of ranges, and this runs for every
 * stack at every byte of a partial character. */
static inline int grammar_class_meets(const struct llm_grammar *g, int c, uint32_t lo, uint32_t hi)
{
    const gclass *k = &g->cls[c];
    int a = k->first, b = k->first + k->n; /* the first range ending at or after lo: in [a, b] */
    while (a < b) {
        int mid = (a + b) / 2;
        if (g->rng[mid].hi < lo)
            a = mid + 1;
        else
            b = mid;
    }
    int overlaps = a < k->first + k->n && g->rng[a].lo <= hi;
    if (!k->neg)
        return overlaps;
    return !(overlaps && g->rng[a].lo <= lo && g->rng[a].hi >= hi); /* ranges are merged: one covers it or none */
}

#endif
