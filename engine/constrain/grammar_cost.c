/* grammar_cost.c - the fewest bytes that finish each grammar position
 * (grammar_impl.h: grammar_cost_build), which let the matcher keep an output
 * completable within the tokens it has left (gmatch.h: budgets).
 *
 * A character costs the shortest UTF-8 encoding of any code point its
 * class holds; a rule the least an alternative of it costs; an
 * alternative the sum of its elements. Sums make this Knuth's
 * generalisation of Dijkstra's algorithm: rules are settled cheapest
 * first from a heap, and an alternative is a candidate for its rule once
 * every rule it names is settled. A fixed point over all rules would be
 * quadratic on a chain of rules a client can write; this is
 * O(elements + alternatives log alternatives). Costs saturate at
 * GRAMMAR_COST_INF (a rule with no finite string, or sums past it). */
#include <stdlib.h>

#include "grammar_impl.h"

static int32_t gc_add(int32_t a, int32_t b) { return a >= GRAMMAR_COST_INF - b ? GRAMMAR_COST_INF : a + b; }

/* The shortest UTF-8 encoding of a code point class c holds (surrogates
 * are not characters). */
static int32_t gc_class(const llm_grammar *g, int c)
{
    if (grammar_class_meets(g, c, 0, 0x7F))
        return 1;
    if (grammar_class_meets(g, c, 0x80, 0x7FF))
        return 2;
    if (grammar_class_meets(g, c, 0x800, 0xD7FF) || grammar_class_meets(g, c, 0xE000, 0xFFFF))
        return 3;
    return grammar_class_meets(g, c, 0x10000, 0x10FFFF) ? 4 : GRAMMAR_COST_INF;
}

typedef struct gc_heap {
    int64_t *v; /* (cost << 32) | rule, a min-heap */
    int n;
} gc_heap;

static void gc_push(gc_heap *h, int32_t cost, int rule)
{
    int64_t x = ((int64_t)cost << 32) | (uint32_t)rule;
    int i = h->n++;
    while (i > 0 && h->v[(i - 1) / 2] > x) {
        h->v[i] = h->v[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->v[i] = x;
}

static int64_t gc_pop(gc_heap *h)
{
    int64_t top = h->v[0], x = h->v[--h->n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= h->n)
            break;
        if (c + 1 < h->n && h->v[c + 1] < h->v[c])
            c++;
        if (h->v[c] >= x)
            break;
        h->v[i] = h->v[c];
        i = c;
    }
    if (h->n > 0)
        h->v[i] = x;
    return top;
}

typedef struct gc_work {
    int32_t *sum, *cnt, *of;  /* (n_alt) characters' cost plus settled rules'; rules not settled; its rule */
    int32_t *occ_at, *occ;    /* the alternatives naming each rule (once per mention), by rule */
    int32_t *best;            /* (n_rule) least candidate yet */
    unsigned char *done;      /* (n_rule) settled */
    gc_heap h;
} gc_work;

/* Each alternative's characters summed and references counted; the
 * mentions of each rule indexed. */
static void gc_index(const llm_grammar *g, gc_work *w)
{
    for (int r = 0; r < g->n_rule; r++)
        for (int a = g->rule_alt[r]; a < g->rule_alt[r + 1]; a++) {
            w->of[a] = r;
            for (int pos = g->alt[a]; g->el[pos].type != GEL_END; pos++) {
                if (g->el[pos].type == GEL_CHAR)
                    w->sum[a] = gc_add(w->sum[a], gc_class(g, g->el[pos].arg));
                else
                    w->cnt[a]++, w->occ_at[g->el[pos].arg + 1]++;
            }
        }
    for (int r = 0; r < g->n_rule; r++) w->occ_at[r + 1] += w->occ_at[r];
    for (int a = 0; a < g->n_alt; a++)
        for (int pos = g->alt[a]; g->el[pos].type != GEL_END; pos++)
            if (g->el[pos].type == GEL_REF)
                w->occ[w->occ_at[g->el[pos].arg]++] = a;
    for (int r = g->n_rule; r > 0; r--) w->occ_at[r] = w->occ_at[r - 1]; /* back to starts */
    w->occ_at[0] = 0;
}

static void gc_offer(gc_work *w, int a)
{
    int r = w->of[a];
    if (!w->done[r] && w->sum[a] < w->best[r]) {
        w->best[r] = w->sum[a];
        gc_push(&w->h, w->sum[a], r);
    }
}

/* best[r] = rule r's least cost, by settling rules cheapest first. */
static void gc_settle(const llm_grammar *g, gc_work *w)
{
    for (int r = 0; r < g->n_rule; r++) w->best[r] = GRAMMAR_COST_INF;
    for (int a = 0; a < g->n_alt; a++)
        if (w->cnt[a] == 0)
            gc_offer(w, a);
    while (w->h.n > 0) {
        int64_t x = gc_pop(&w->h);
        int r = (int)(uint32_t)x;
        if (w->done[r])
            continue; /* a costlier candidate pushed before the best */
        w->done[r] = 1;
        for (int k = w->occ_at[r]; k < w->occ_at[r + 1]; k++) {
            int a = w->occ[k];
            w->sum[a] = gc_add(w->sum[a], w->best[r]);
            if (--w->cnt[a] == 0)
                gc_offer(w, a);
        }
    }
}

int grammar_cost_build(llm_grammar *g)
{
    size_t na = (size_t)g->n_alt + 1, nr = (size_t)g->n_rule + 1;
    gc_work w = {.sum = calloc(na, sizeof(int32_t)), .cnt = calloc(na, sizeof(int32_t)), .of = calloc(na, sizeof(int32_t)),
                 .occ_at = calloc(nr + 1, sizeof(int32_t)), .occ = malloc(sizeof(int32_t) * ((size_t)g->n_el + 1)),
                 .best = malloc(sizeof(int32_t) * nr), .done = calloc(nr, 1),
                 .h = {.v = malloc(sizeof(int64_t) * na)}}; /* each alternative offers its rule at most once */
    int rc = -1;
    g->rest = malloc(sizeof *g->rest * ((size_t)g->n_el + 1));
    if (!w.sum || !w.cnt || !w.of || !w.occ_at || !w.occ || !w.best || !w.done || !w.h.v || !g->rest)
        goto out;
    gc_index(g, &w);
    gc_settle(g, &w);
    for (int a = 0; a < g->n_alt; a++) { /* rest[pos]: from pos to its alternative's end, back to front */
        int end = g->alt[a];
        while (g->el[end].type != GEL_END) end++;
        g->rest[end] = 0;
        for (int pos = end - 1; pos >= g->alt[a]; pos--) {
            const gel *e = &g->el[pos];
            g->rest[pos] = gc_add(g->rest[pos + 1], e->type == GEL_CHAR ? gc_class(g, e->arg) : w.best[e->arg]);
        }
    }
    rc = 0;
out:
    free(w.sum), free(w.cnt), free(w.of), free(w.occ_at), free(w.occ), free(w.best), free(w.done), free(w.h.v);
    return rc;
}
