/* gmatch.c - the grammar matcher and token masks (gmatch.h).
 *
 * A stack is a chain of nodes, top first: the top's position is the
 * character element to match next, each node below it the position to
 * continue at once the rule above it ends. Chains share their tails, so a
 * step that advances one stack allocates only the nodes it changes. A rule
 * reference at the end of an alternative pushes no continuation (a tail
 * call), so X* and the like run in constant depth.
 *
 * Nodes and the stack lists of states live in two arrays used as stacks:
 * the committed state at the bottom, a mask walk's states above it (each
 * depth's share popped when the walk backs up), and after a token is
 * accepted the new state is copied down to a fresh bottom. */
#include "llm/gmatch.h"

#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

#define GM_CACHE 16          /* masks a matcher keeps when it has no shared cache */
#define GM_KEEP_NODES 65536  /* node capacity a matcher keeps between masks (1.5 MiB) */

#define GM_KEY_MAX 512        /* a state longer than this (stack positions) is not cached */
#define GM_LIST_MAX 2048      /* tokens a cached mask lists as leaving more, or less, to finish than its state */

/* A mask is found again only for an exact (grammar id, partition, state):
 * the hash only picks the candidates. */
struct llm_gmatch_cache {
    int n_words, cap, n, next;
    size_t list_bytes, list_max; /* the lists' bytes now, and their share of the cache's bytes */
    uint64_t *hash;          /* (cap) of the three below */
    uint64_t *grammar, *part; /* (cap) */
    int32_t *key_len;        /* (cap) */
    int32_t *max_cost;       /* (cap) the most any text token the mask allows leaves to finish (-1: none) */
    int32_t *n_text;         /* (cap) text tokens the mask allows */
    int32_t *n_down, *n_up;  /* (cap) tokens listed as leaving less / more than the state (-1: too many) */
    int32_t **list;          /* (cap) their (id, cost) pairs, the fewer first (own allocations; NULL: none) */
    size_t *list_size;       /* (cap) its bytes */
    int32_t *key;            /* (cap, GM_KEY_MAX) the state: each stack's positions top down, then -1 */
    uint32_t *bits;          /* (cap, n_words) */
};

struct llm_gmatch_vocab {
    int n_vocab;
    char *bytes;             /* pieces, concatenated */
    int32_t *off;            /* (n_vocab + 1) piece id is bytes[off[id] .. off[id + 1]) */
    int32_t *order;          /* (n_text) text tokens sorted by piece */
    int32_t *lcp;            /* (n_text) bytes order[i] shares with order[i - 1] */
    int n_text;
    int32_t *eog;            /* (n_eog) end-of-generation ids */
    int n_eog;
    unsigned char *kind;     /* (n_vocab) GM_TEXT, GM_EOG or 0 */
    int max_len;
};

enum { GM_TEXT = 1, GM_EOG = 2 };

typedef struct gnode {
    int32_t pos, parent;     /* parent -1: the bottom */
    int32_t depth;
    int32_t cost;            /* the fewest bytes that finish this stack (its positions' rest, summed) */
    uint64_t hash;           /* of the whole chain */
} gnode;

/* A set of stacks (node ids in sv[first .. first + n); -1 is the empty
 * stack: the output is complete) and a character begun but not ended. */
typedef struct gstate {
    int32_t first, n;
    uint32_t cp;             /* its bits so far */
    int32_t rem, len;        /* continuation bytes still to come; its whole length */
} gstate;

struct llm_gmatch {
    const llm_grammar *g;
    const llm_gmatch_vocab *gv;
    gnode *nodes, *nodes2;   /* nodes2: where the next committed state is compacted */
    int n_nodes, cap_nodes, cap_nodes2;
    int32_t *sv, *sv2;
    int n_sv, cap_sv, cap_sv2;
    gstate cur;
    gstate *walk;            /* (max_len + 1) a mask walk's states by depth */
    int32_t *mark_nodes, *mark_sv; /* (max_len + 1) arena tops after walk[k] */
    int32_t *remap;          /* compaction: old node id -> new */
    int32_t chain[LLM_GMATCH_MAX_DEPTH + 1]; /* compaction: one stack's nodes not copied yet */
    int cap_remap;
    uint32_t *plain;         /* (n_words) the mask without the budget, while the budget binds */
    int32_t *down, *up;      /* (2 * GM_LIST_MAX) a walk's lists of tokens that change the cost (gm_found) */
    int32_t budget;          /* tokens left, the end's included; -1: no bound */
    llm_gmatch_cache *cache; /* shared (borrowed) or own */
    int own_cache, n_words;
    uint64_t partition;
    int32_t key[GM_KEY_MAX]; /* the committed state, serialized for the cache */
    int key_len;             /* -1: too long to cache */
    uint64_t masks, cached;
    long work, max_work;     /* stack operations in this call (bounded by LLM_GMATCH_MAX_WORK), the most yet */
    int overflow;            /* a bound was hit while building the last state: 1 stacks, 2 depth, 3 expansion,
                              * 4 work, 5 nodes */
};

/* ---- the vocabulary index ----------------------------------------------------------- */

static int gm_piece_cmp(const void *a, const void *b, void *ctx)
{
    const llm_gmatch_vocab *gv = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    int32_t lx = gv->off[x + 1] - gv->off[x], ly = gv->off[y + 1] - gv->off[y];
    int c = memcmp(gv->bytes + gv->off[x], gv->bytes + gv->off[y], (size_t)(lx < ly ? lx : ly));
    return c ? c : lx != ly ? (lx < ly ? -1 : 1) : (x < y ? -1 : x > y);
}

/* Every piece into gv->bytes / gv->off, and each id's kind. */
static llm_status gm_vocab_pieces(llm_gmatch_vocab *gv, const llm_vocab *v, llm_error *err)
{
    size_t cap = 1 << 16, used = 0;
    if (!(gv->bytes = malloc(cap)))
        return llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory for the vocabulary's pieces");
    for (int id = 0; id < gv->n_vocab; id++) {
        int type = llm_vocab_token_type(v, id), n;
        gv->off[id] = (int32_t)used;
        while ((n = llm_token_to_piece(v, id, 0, gv->bytes + used, cap - used)) > 0 && (size_t)n > cap - used) {
            char *nb = cap < (1u << 30) ? realloc(gv->bytes, cap * 2) : NULL; /* lint: realloc checked */
            if (!nb)
                return llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory for the vocabulary's pieces");
            gv->bytes = nb, cap *= 2;
        }
        int eog = llm_vocab_is_eog(v, id), text = n > 0 && !eog && type != LLM_TOKEN_CONTROL &&
                                                     type != LLM_TOKEN_UNUSED && type != LLM_TOKEN_UNKNOWN;
        gv->kind[id] = eog ? GM_EOG : text ? GM_TEXT : 0;
        if (text) {
            used += (size_t)n;
            gv->max_len = n > gv->max_len ? n : gv->max_len;
        }
        gv->n_text += text, gv->n_eog += eog;
    }
    gv->off[gv->n_vocab] = (int32_t)used;
    return LLM_OK;
}

llm_status llm_gmatch_vocab_new(const llm_vocab *v, llm_gmatch_vocab **out, llm_error *err)
{
    *out = NULL;
    llm_gmatch_vocab *gv = calloc(1, sizeof *gv);
    int n = llm_vocab_n(v);
    if (gv) {
        gv->n_vocab = n;
        gv->off = malloc(sizeof *gv->off * (size_t)(n + 1));
        gv->kind = calloc((size_t)n, 1);
    }
    if (!gv || !gv->off || !gv->kind) {
        llm_gmatch_vocab_free(gv);
        return llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory for a %d-token vocabulary index", n);
    }
    llm_status st = gm_vocab_pieces(gv, v, err);
    if (!st && (!(gv->order = malloc(sizeof(int32_t) * (size_t)(gv->n_text + 1))) ||
                !(gv->lcp = malloc(sizeof(int32_t) * (size_t)(gv->n_text + 1))) ||
                !(gv->eog = malloc(sizeof(int32_t) * (size_t)(gv->n_eog + 1)))))
        st = llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory for a %d-token vocabulary index", n);
    if (st) {
        llm_gmatch_vocab_free(gv);
        return st;
    }
    int t = 0, e = 0;
    for (int id = 0; id < n; id++) {
        if (gv->kind[id] == GM_TEXT)
            gv->order[t++] = id;
        else if (gv->kind[id] == GM_EOG)
            gv->eog[e++] = id;
    }
    qsort_r(gv->order, (size_t)t, sizeof *gv->order, gm_piece_cmp, gv);
    for (int i = 0; i < t; i++) {
        int32_t a = i ? gv->order[i - 1] : 0, b = gv->order[i], k = 0;
        int32_t la = i ? gv->off[a + 1] - gv->off[a] : 0, lb = gv->off[b + 1] - gv->off[b];
        while (k < la && k < lb && gv->bytes[gv->off[a] + k] == gv->bytes[gv->off[b] + k]) k++;
        gv->lcp[i] = k;
    }
    *out = gv;
    return LLM_OK;
}

void llm_gmatch_vocab_free(llm_gmatch_vocab *gv)
{
    if (!gv)
        return;
    free(gv->bytes);
    free(gv->off);
    free(gv->order);
    free(gv->lcp);
    free(gv->eog);
    free(gv->kind);
    free(gv);
}

/* ---- stacks ------------------------------------------------------------------------ */

static uint64_t gm_mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

#define GM_EMPTY_HASH 0x51ed270b27a3c9d1ull

static uint64_t gm_hash_of(const llm_gmatch *m, int32_t node) { return node < 0 ? GM_EMPTY_HASH : m->nodes[node].hash; }

static int gm_grow(void **v, int n, int *cap, size_t sz) { return grammar_grow(v, n, cap, sz, 64); }

/* A new node (pos over parent); -1 too deep (overflow set), -2 no memory. */
static int32_t gm_node(llm_gmatch *m, int32_t pos, int32_t parent)
{
    int32_t depth = parent < 0 ? 1 : m->nodes[parent].depth + 1;
    if (depth > LLM_GMATCH_MAX_DEPTH) {
        m->overflow = 2;
        return -1;
    }
    if (m->n_nodes >= LLM_GMATCH_MAX_NODES) {
        m->overflow = 5;
        return -1;
    }
    if (gm_grow((void **)&m->nodes, m->n_nodes, &m->cap_nodes, sizeof *m->nodes))
        return -2;
    int32_t below = parent < 0 ? 0 : m->nodes[parent].cost, rest = m->g->rest[pos];
    int32_t cost = below >= GRAMMAR_COST_INF - rest ? GRAMMAR_COST_INF : below + rest;
    m->nodes[m->n_nodes] = (gnode){pos, parent, depth, cost, gm_mix(gm_hash_of(m, parent), (uint64_t)pos)};
    return m->n_nodes++;
}

static int gm_same(const llm_gmatch *m, int32_t a, int32_t b)
{
    while (a >= 0 && b >= 0 && a != b) {
        if (m->nodes[a].pos != m->nodes[b].pos || m->nodes[a].hash != m->nodes[b].hash)
            return 0;
        a = m->nodes[a].parent, b = m->nodes[b].parent;
    }
    return a == b;
}

/* Adds stack s to the set being built (sv[first ..]) unless there already. */
static int gm_add(llm_gmatch *m, int32_t first, int32_t s)
{
    uint64_t h = gm_hash_of(m, s);
    m->work += m->n_sv - first + 1;
    for (int i = first; i < m->n_sv; i++)
        if (gm_hash_of(m, m->sv[i]) == h && gm_same(m, m->sv[i], s))
            return 0;
    if (m->n_sv - first >= LLM_GMATCH_MAX_STACKS) {
        m->overflow = 1;
        return 0;
    }
    if (gm_grow((void **)&m->sv, m->n_sv, &m->cap_sv, sizeof *m->sv))
        return -1;
    m->sv[m->n_sv++] = s;
    return 0;
}

static int gm_push(llm_gmatch *m, int32_t first, int32_t parent, int32_t pos, int guard);

/* Brings stack s (its top a character, a reference, or s == -1) to
 * character tops, adding each to the set. */
static int gm_settle(llm_gmatch *m, int32_t first, int32_t s, int guard)
{
    if (s < 0 || m->g->el[m->nodes[s].pos].type == GEL_CHAR)
        return gm_add(m, first, s);
    return gm_push(m, first, m->nodes[s].parent, m->nodes[s].pos, guard);
}

/* Continues at pos over parent: an end pops, a character is a top, a
 * reference expands into its rule's alternatives. 0, or -1 (no memory). */
static int gm_push(llm_gmatch *m, int32_t first, int32_t parent, int32_t pos, int guard)
{
    const llm_grammar *g = m->g;
    const gel *e = &g->el[pos];
    if (guard > LLM_GMATCH_MAX_EXPAND || ++m->work > LLM_GMATCH_MAX_WORK) {
        m->overflow = guard > LLM_GMATCH_MAX_EXPAND ? 3 : 4;
        return 0;
    }
    if (e->type == GEL_END)
        return parent < 0 ? gm_add(m, first, -1) : gm_settle(m, first, parent, guard + 1);
    if (e->type == GEL_CHAR) {
        int32_t n = gm_node(m, pos, parent);
        return n == -2 ? -1 : n < 0 ? 0 : gm_add(m, first, n);
    }
    int32_t cont = parent;
    if (g->el[pos + 1].type != GEL_END && (cont = gm_node(m, pos + 1, parent)) < 0)
        return cont == -2 ? -1 : 0;
    for (int a = g->rule_alt[e->arg]; a < g->rule_alt[e->arg + 1]; a++)
        if (gm_push(m, first, cont, g->alt[a], guard + 1))
            return -1;
    return 0;
}

/* ---- advancing ------------------------------------------------------------------- */

static const uint32_t gm_utf8_min[5] = {0, 0, 0x80, 0x800, 0x10000};

/* to = from after code point cp. 0, or -1 (no memory). */
static int gm_step_cp(llm_gmatch *m, const gstate *from, uint32_t cp, gstate *to)
{
    *to = (gstate){.first = m->n_sv};
    m->work += from->n;
    for (int i = 0; i < from->n; i++) {
        int32_t s = m->sv[from->first + i];
        if (s < 0 || !grammar_class_has(m->g, m->g->el[m->nodes[s].pos].arg, cp))
            continue;
        if (gm_push(m, to->first, m->nodes[s].parent, m->nodes[s].pos + 1, 0))
            return -1;
    }
    to->n = m->n_sv - to->first;
    return 0;
}

/* Whether class `arg` holds a code point of [lo, hi] that UTF-8 can
 * encode: the surrogates D800-DFFF are not characters (gm_step refuses
 * them at a character's last byte), so a begun character whose only
 * endings are surrogates must be dead now; left alive, a mask allowed
 * the byte (0xED 0xB8) and the next mask then allowed no token at all. */
static int gm_meets(const llm_gmatch *m, int arg, uint32_t lo, uint32_t hi)
{
    if (lo < 0xD800 && grammar_class_meets(m->g, arg, lo, hi < 0xD800 ? hi : 0xD7FF))
        return 1;
    return hi > 0xDFFF && grammar_class_meets(m->g, arg, lo > 0xE000 ? lo : 0xE000, hi);
}

/* to = from's stacks that can take some code point of [lo, hi] (a
 * character begun, not ended). */
static int gm_step_partial(llm_gmatch *m, const gstate *from, uint32_t cp, int rem, int len, gstate *to)
{
    *to = (gstate){.first = m->n_sv, .cp = cp, .rem = rem, .len = len};
    uint32_t lo = cp << (6 * rem), hi = lo | ((1u << (6 * rem)) - 1);
    lo = lo < gm_utf8_min[len] ? gm_utf8_min[len] : lo;
    hi = hi > 0x10FFFF ? 0x10FFFF : hi;
    m->work += from->n;
    for (int i = 0; lo <= hi && i < from->n; i++) {
        int32_t s = m->sv[from->first + i];
        if (s < 0 || !gm_meets(m, m->g->el[m->nodes[s].pos].arg, lo, hi))
            continue;
        if (gm_grow((void **)&m->sv, m->n_sv, &m->cap_sv, sizeof *m->sv))
            return -1;
        m->sv[m->n_sv++] = s;
    }
    to->n = m->n_sv - to->first;
    return 0;
}

/* to = from after byte b (to->n 0: dead). 0, or -1 (no memory). */
static int gm_step(llm_gmatch *m, const gstate *from, unsigned char b, gstate *to)
{
    if (from->rem == 0) {
        if (b < 0x80)
            return gm_step_cp(m, from, b, to);
        int len = b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3 : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (!len) {
            *to = (gstate){.first = m->n_sv};
            return 0;
        }
        return gm_step_partial(m, from, b & (0x7Fu >> len), len - 1, len, to);
    }
    uint32_t cp = (from->cp << 6) | (b & 0x3F);
    if ((b & 0xC0) != 0x80) {
        *to = (gstate){.first = m->n_sv};
        return 0;
    }
    if (from->rem > 1)
        return gm_step_partial(m, from, cp, from->rem - 1, from->len, to);
    if (cp < gm_utf8_min[from->len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        *to = (gstate){.first = m->n_sv};
        return 0;
    }
    return gm_step_cp(m, from, cp, to);
}

static int gm_has_empty(const llm_gmatch *m, const gstate *s)
{
    for (int i = 0; i < s->n; i++)
        if (m->sv[s->first + i] < 0)
            return 1;
    return 0;
}

/* The fewest bytes that finish the output from state st: its cheapest
 * stack's, and for a character begun, its continuation bytes in place of
 * the character's own cost. */
static int32_t gm_cost(const llm_gmatch *m, const gstate *st)
{
    int32_t best = GRAMMAR_COST_INF;
    for (int i = 0; i < st->n; i++) {
        int32_t s = m->sv[st->first + i];
        int32_t c = s < 0 ? 0 : m->nodes[s].cost;
        if (st->rem && s >= 0 && c < GRAMMAR_COST_INF) {
            int32_t pos = m->nodes[s].pos;
            c += st->rem - (m->g->rest[pos] - m->g->rest[pos + 1]);
        }
        best = c < best ? c : best;
    }
    return best;
}

/* The most a text token may leave to finish, while the budget binds,
 * from a state of that cost: the tokens after it, one kept for the end.
 * GRAMMAR_COST_INF when no budget is set or the output is already past
 * finishing within it (then it is not bent at all). */
static int32_t gm_limit_for_cost(const llm_gmatch *m, int32_t cost)
{
    return m->budget >= 0 && cost < m->budget ? m->budget - 2 : GRAMMAR_COST_INF;
}

/* gm_limit_for_cost of the committed state (its cost only walked for a budget). */
static int32_t gm_limit(const llm_gmatch *m)
{
    return m->budget < 0 ? GRAMMAR_COST_INF : gm_limit_for_cost(m, gm_cost(m, &m->cur));
}

void llm_gmatch_set_budget(llm_gmatch *m, long tokens)
{
    m->budget = tokens < 0 ? -1 : tokens > GRAMMAR_COST_INF ? GRAMMAR_COST_INF : (int32_t)tokens;
}

int llm_gmatch_complete(const llm_gmatch *m) { return m->cur.rem == 0 && gm_has_empty(m, &m->cur); }
int llm_gmatch_finished(const llm_gmatch *m) { return llm_gmatch_complete(m) && m->cur.n == 1; }

/* ---- committing a state ------------------------------------------------------------ */

/* The node x copied into nodes2 (parents first), its new id. */
static int32_t gm_copy(llm_gmatch *m, int32_t x, int *n2)
{
    int chain = 0;
    for (int32_t y = x; y >= 0 && m->remap[y] < 0; y = m->nodes[y].parent) m->chain[chain++] = y;
    while (chain > 0) { /* bottom up: a parent is copied before its children */
        int32_t y = m->chain[--chain];
        gnode c = m->nodes[y];
        c.parent = c.parent < 0 ? -1 : m->remap[c.parent];
        m->nodes2[*n2] = c;
        m->remap[y] = (*n2)++;
    }
    return x < 0 ? -1 : m->remap[x];
}

/* Makes st (built above the committed state) the committed one, copied
 * to a fresh bottom so the arrays do not grow with the output. */
/* Makes room for n items of size sz in *v (capacity *cap, contents not
 * kept). -1 on no memory (*cap 0 then). */
static int gm_reserve(void **v, int *cap, int n, size_t sz)
{
    if (*cap >= n)
        return 0;
    free(*v);
    *cap = 0;
    if (!(*v = malloc(sz * (size_t)(n > 0 ? n : 1))))
        return -1;
    *cap = n;
    return 0;
}

static int gm_commit(llm_gmatch *m, const gstate *st)
{
    if (gm_reserve((void **)&m->remap, &m->cap_remap, m->n_nodes, sizeof *m->remap) ||
        gm_reserve((void **)&m->nodes2, &m->cap_nodes2, m->n_nodes, sizeof *m->nodes2) ||
        gm_reserve((void **)&m->sv2, &m->cap_sv2, st->n, sizeof *m->sv2))
        return -1;
    memset(m->remap, 0xff, sizeof *m->remap * (size_t)m->n_nodes);
    int n2 = 0;
    for (int i = 0; i < st->n; i++) m->sv2[i] = gm_copy(m, m->sv[st->first + i], &n2);
    gnode *tn = m->nodes; m->nodes = m->nodes2; m->nodes2 = tn;
    int tc = m->cap_nodes; m->cap_nodes = m->cap_nodes2; m->cap_nodes2 = tc;
    int32_t *ts = m->sv; m->sv = m->sv2; m->sv2 = ts;
    tc = m->cap_sv; m->cap_sv = m->cap_sv2; m->cap_sv2 = tc;
    m->n_nodes = n2;
    m->n_sv = st->n;
    m->cur = (gstate){0, st->n, st->cp, st->rem, st->len};
    return 0;
}

static llm_status gm_overflow_err(const llm_gmatch *m, llm_error *err)
{
    if (m->overflow == 1)
        return llm_errf(err, LLM_ERR_GRAMMAR, "grammar: more than %d possible parses at once (the grammar is too ambiguous)",
                        LLM_GMATCH_MAX_STACKS);
    if (m->overflow == 2)
        return llm_errf(err, LLM_ERR_GRAMMAR, "grammar: output nested deeper than %d", LLM_GMATCH_MAX_DEPTH);
    if (m->overflow == 5)
        return llm_errf(err, LLM_ERR_GRAMMAR, "grammar: more than %d stack nodes alive in one step", LLM_GMATCH_MAX_NODES);
    if (m->overflow == 4)
        return llm_errf(err, LLM_ERR_GRAMMAR, "grammar: a step would take more than %ld stack operations "
                        "(the grammar is too costly to match)", LLM_GMATCH_MAX_WORK);
    return llm_errf(err, LLM_ERR_GRAMMAR, "grammar: a rule expansion deeper than %d", LLM_GMATCH_MAX_EXPAND);
}

/* st = the committed state after n bytes, built above it (st->n 0:
 * dead). -1 on no memory. */
static int gm_run(llm_gmatch *m, const char *bytes, size_t n, gstate *st)
{
    *st = m->cur;
    m->overflow = 0;
    m->work = 0;
    for (size_t i = 0; i < n && st->n > 0; i++) {
        gstate next;
        if (gm_step(m, st, (unsigned char)bytes[i], &next))
            return -1;
        *st = next;
    }
    return 0;
}

int llm_gmatch_viable(llm_gmatch *m, const char *bytes, size_t n)
{
    int nodes0 = m->n_nodes, sv0 = m->n_sv;
    gstate st;
    int rc = gm_run(m, bytes, n, &st) || m->overflow ? -1 : st.n > 0;
    m->n_nodes = nodes0, m->n_sv = sv0;
    return rc;
}

llm_status llm_gmatch_feed(llm_gmatch *m, const char *bytes, size_t n, llm_error *err)
{
    int nodes0 = m->n_nodes, sv0 = m->n_sv;
    gstate st;
    if (gm_run(m, bytes, n, &st)) {
        m->n_nodes = nodes0, m->n_sv = sv0;
        return llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory");
    }
    if (st.n == 0 || m->overflow) { /* an overflow dropped stacks: the state would be wrong */
        int of = m->overflow;
        m->n_nodes = nodes0, m->n_sv = sv0;
        return of ? gm_overflow_err(m, err) : llm_errf(err, LLM_ERR_GRAMMAR, "grammar: the output cannot continue with these bytes");
    }
    if (gm_commit(m, &st)) {
        m->n_nodes = nodes0, m->n_sv = sv0;
        return llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory");
    }
    return LLM_OK;
}

llm_status llm_gmatch_accept(llm_gmatch *m, int32_t id, llm_error *err)
{
    const llm_gmatch_vocab *gv = m->gv;
    m->work = 0; /* an end or a token without text walks nothing */
    if (!gv || id < 0 || id >= gv->n_vocab)
        return llm_errf(err, LLM_ERR_GRAMMAR, "grammar: token %d is not in the vocabulary index", id);
    if (gv->kind[id] == GM_EOG)
        return llm_gmatch_complete(m) ? LLM_OK
                                      : llm_errf(err, LLM_ERR_GRAMMAR, "grammar: the output ended before the grammar was complete");
    if (gv->kind[id] != GM_TEXT)
        return llm_errf(err, LLM_ERR_GRAMMAR, "grammar: token %d has no text to match", id);
    return llm_gmatch_feed(m, gv->bytes + gv->off[id], (size_t)(gv->off[id + 1] - gv->off[id]), err);
}

/* ---- masks ------------------------------------------------------------------------- */

/* What a mask walk finds beside the plain mask: the pieces that also
 * leave at most lim bytes to finish (tight, when not NULL), the most any
 * piece leaves, and the pieces that leave less or more than the state
 * itself (base), with what they leave: from these a cached mask serves any
 * later budget without a walk. */
typedef struct gm_found {
    uint32_t *tight;
    int32_t lim, base, max_cost;
    int n_text, n_tight;
    int32_t *down, *up; /* (id, cost) pairs */
    int n_down, n_up;   /* -1: more than GM_LIST_MAX */
} gm_found;

static void gm_list(int32_t *l, int *n, int32_t id, int32_t cost)
{
    if (*n < 0 || *n >= GM_LIST_MAX) {
        *n = -1;
        return;
    }
    l[2 * *n] = id, l[2 * *n + 1] = cost;
    (*n)++;
}

/* A text token the walk allows, leaving cost c to finish. */
static void gm_found_one(gm_found *f, int32_t id, int32_t c)
{
    f->n_text++;
    f->max_cost = c > f->max_cost ? c : f->max_cost;
    if (f->tight && c <= f->lim)
        f->tight[id >> 5] |= 1u << (id & 31), f->n_tight++;
    if (c < f->base)
        gm_list(f->down, &f->n_down, id, c);
    else if (c > f->base)
        gm_list(f->up, &f->n_up, id, c);
}

/* Walks the sorted pieces from the committed state, setting the bits of
 * those that survive. -1 on no memory. */
static int gm_walk(llm_gmatch *m, uint32_t *allow, gm_found *f)
{
    const llm_gmatch_vocab *gv = m->gv;
    int valid = 0; /* walk[0 .. valid] hold the states along the previous piece */
    m->walk[0] = m->cur;
    m->mark_nodes[0] = m->n_nodes, m->mark_sv[0] = m->n_sv;
    for (int i = 0; i < gv->n_text && !m->overflow; i++) {
        int32_t id = gv->order[i], len = gv->off[id + 1] - gv->off[id];
        const unsigned char *p = (const unsigned char *)gv->bytes + gv->off[id];
        int k = gv->lcp[i] < valid ? gv->lcp[i] : valid;
        m->n_nodes = m->mark_nodes[k], m->n_sv = m->mark_sv[k];
        for (; k < len && m->walk[k].n > 0; k++) {
            if (gm_step(m, &m->walk[k], p[k], &m->walk[k + 1]))
                return -1;
            m->mark_nodes[k + 1] = m->n_nodes, m->mark_sv[k + 1] = m->n_sv;
        }
        valid = k;
        if (k == len && m->walk[k].n > 0) {
            allow[id >> 5] |= 1u << (id & 31);
            gm_found_one(f, id, gm_cost(m, &m->walk[k]));
        }
    }
    m->n_nodes = m->mark_nodes[0], m->n_sv = m->mark_sv[0];
    return 0;
}

llm_gmatch_cache *llm_gmatch_cache_new(int n_vocab, size_t max_bytes)
{
    llm_gmatch_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->n_words = (n_vocab + 31) / 32;
    /* a quarter for the lists (most masks list few tokens or none), at least room for two at their longest */
    size_t each = sizeof(uint32_t) * (size_t)c->n_words + sizeof(int32_t) * (GM_KEY_MAX + 5) + 4 * sizeof(uint64_t);
    size_t two = sizeof(int32_t) * 8 * GM_LIST_MAX, slots = max_bytes - max_bytes / 4;
    c->list_max = max_bytes / 4 > two ? max_bytes / 4 : two;
    c->cap = slots / each < 16 ? 16 : slots / each > 4096 ? 4096 : (int)(slots / each);
    c->hash = malloc(sizeof *c->hash * (size_t)c->cap);
    c->grammar = malloc(sizeof *c->grammar * (size_t)c->cap);
    c->part = malloc(sizeof *c->part * (size_t)c->cap);
    c->key_len = malloc(sizeof *c->key_len * (size_t)c->cap);
    c->max_cost = malloc(sizeof *c->max_cost * (size_t)c->cap);
    c->n_text = malloc(sizeof *c->n_text * (size_t)c->cap);
    c->n_down = malloc(sizeof *c->n_down * (size_t)c->cap);
    c->n_up = malloc(sizeof *c->n_up * (size_t)c->cap);
    c->list = calloc((size_t)c->cap, sizeof *c->list);
    c->list_size = calloc((size_t)c->cap, sizeof *c->list_size);
    c->key = malloc(sizeof *c->key * (size_t)c->cap * GM_KEY_MAX);
    c->bits = malloc(sizeof *c->bits * (size_t)c->n_words * (size_t)c->cap);
    if (!c->hash || !c->grammar || !c->part || !c->key_len || !c->max_cost || !c->n_text || !c->n_down || !c->n_up ||
        !c->list || !c->list_size || !c->key || !c->bits) {
        llm_gmatch_cache_free(c);
        return NULL;
    }
    return c;
}

void llm_gmatch_cache_free(llm_gmatch_cache *c)
{
    if (!c)
        return;
    free(c->hash);
    free(c->grammar);
    free(c->part);
    free(c->key_len);
    free(c->max_cost);
    free(c->n_text);
    free(c->n_down);
    free(c->n_up);
    for (int i = 0; c->list && i < c->n; i++) free(c->list[i]);
    free(c->list);
    free(c->list_size);
    free(c->key);
    free(c->bits);
    free(c);
}

static int gm_node_cmp(const void *a, const void *b)
{
    uint64_t x = ((const uint64_t *)a)[0], y = ((const uint64_t *)b)[0];
    return x < y ? -1 : x > y;
}

/* m->key = the committed state, canonical: the stacks in the order of
 * their hashes (stacks whose hashes collide may come in either order: the
 * key then differs between matchers, a missed hit, never a false one),
 * each as its positions top down and -1, then the partial character.
 * m->key_len -1 when it does not fit. */
static void gm_serialize(llm_gmatch *m)
{
    const gstate *st = &m->cur;
    uint64_t order[LLM_GMATCH_MAX_STACKS][2];
    int n = 0, k = 0;
    for (int i = 0; i < st->n && n < LLM_GMATCH_MAX_STACKS; i++) {
        int32_t s = m->sv[st->first + i];
        order[n][0] = gm_hash_of(m, s), order[n++][1] = (uint64_t)(int64_t)s;
    }
    qsort(order, (size_t)n, sizeof order[0], gm_node_cmp);
    for (int i = 0; i < n && k >= 0; i++) {
        for (int32_t s = (int32_t)(int64_t)order[i][1]; s >= 0 && k >= 0; s = m->nodes[s].parent)
            k = k < GM_KEY_MAX - 4 ? (m->key[k] = m->nodes[s].pos, k + 1) : -1;
        if (k >= 0)
            m->key[k++] = -1;
    }
    if (k >= 0 && k <= GM_KEY_MAX - 3) {
        m->key[k++] = (int32_t)st->cp, m->key[k++] = st->rem, m->key[k++] = st->len;
    } else {
        k = -1;
    }
    m->key_len = k;
}

static uint64_t gm_key_hash(const llm_gmatch *m)
{
    uint64_t h = gm_mix(m->g->id, m->partition);
    for (int i = 0; i < m->key_len; i++) h = gm_mix(h, (uint64_t)(uint32_t)m->key[i]);
    return h;
}

/* A walk may have grown the node array far past what the committed state
 * needs; a sequence keeps its matcher for its whole life, so give the
 * excess back (a failed shrink keeps the larger array, which is fine). */
static void gm_shrink(llm_gmatch *m)
{
    if (m->cap_nodes <= GM_KEEP_NODES || m->n_nodes > m->cap_nodes / 4)
        return;
    int cap = m->n_nodes * 2 > GM_KEEP_NODES ? m->n_nodes * 2 : GM_KEEP_NODES;
    gnode *p = realloc(m->nodes, sizeof *p * (size_t)cap); /* lint: realloc checked */
    if (p)
        m->nodes = p, m->cap_nodes = cap;
}

/* The slot of m's state's mask, or -1. */
static int gm_cached(const llm_gmatch_cache *c, const llm_gmatch *m, uint64_t h)
{
    for (int i = 0; i < c->n; i++)
        if (c->hash[i] == h && c->grammar[i] == m->g->id && c->part[i] == m->partition && c->key_len[i] == m->key_len &&
            !memcmp(c->key + (size_t)i * GM_KEY_MAX, m->key, sizeof *m->key * (size_t)m->key_len))
            return i;
    return -1;
}

/* Keeps a mask and what its walk found, replacing the oldest once full
 * (without memory for the lists, they are kept as too many). */
static void gm_cache_put(llm_gmatch_cache *c, const llm_gmatch *m, uint64_t h, const uint32_t *allow, const gm_found *f)
{
    int slot = c->n;
    if (c->n < c->cap) {
        c->n++;
    } else { /* full: the oldest goes (next stays below cap: a count past INT_MAX would wrap) */
        slot = c->next;
        c->next = (c->next + 1) % c->cap;
    }
    c->hash[slot] = h, c->grammar[slot] = m->g->id, c->part[slot] = m->partition, c->key_len[slot] = m->key_len;
    c->max_cost[slot] = f->max_cost, c->n_text[slot] = f->n_text, c->n_down[slot] = f->n_down, c->n_up[slot] = f->n_up;
    if (c->list[slot]) /* the replaced mask's lists */
        c->list_bytes -= c->list_size[slot];
    free(c->list[slot]);
    c->list[slot] = NULL;
    c->list_size[slot] = 0;
    if (f->n_down > 0 || f->n_up > 0) {
        int n_down = f->n_down > 0 ? f->n_down : 0, n_up = f->n_up > 0 ? f->n_up : 0;
        size_t sz = sizeof(int32_t) * 2 * (size_t)(n_down + n_up);
        if (c->list_bytes + sz <= c->list_max && (c->list[slot] = malloc(sz))) {
            memcpy(c->list[slot], f->down, sizeof(int32_t) * 2 * (size_t)n_down);
            memcpy(c->list[slot] + 2 * n_down, f->up, sizeof(int32_t) * 2 * (size_t)n_up);
            c->list_bytes += sz;
            c->list_size[slot] = sz;
        } else { /* no room (or memory): this state walks while a budget binds */
            c->n_down[slot] = c->n_up[slot] = -1;
        }
    }
    memcpy(c->key + (size_t)slot * GM_KEY_MAX, m->key, sizeof *m->key * (size_t)m->key_len);
    memcpy(c->bits + (size_t)slot * (size_t)c->n_words, allow, sizeof *allow * (size_t)c->n_words);
}

static void gm_allow_ends(const llm_gmatch *m, uint32_t *allow)
{
    for (int i = 0; i < m->gv->n_eog; i++) allow[m->gv->eog[i] >> 5] |= 1u << (m->gv->eog[i] & 31);
}

/* Whether the mask in slot serves m under limit lim without a walk: every
 * token it allows leaves at most lim, or its lists tell which do not. */
static int gm_slot_serves(const llm_gmatch *m, int slot, int32_t lim)
{
    const llm_gmatch_cache *c = m->cache;
    return slot >= 0 && (c->max_cost[slot] <= lim || (c->n_down[slot] >= 0 && c->n_up[slot] >= 0));
}

/* allow = the mask in slot under limit lim (gm_slot_serves). A binding
 * limit is at least the state's own cost (cost) less one (gm_limit_for_cost):
 * at the state's cost or above, the plain mask less the listed tokens that
 * leave more than lim; just below it, only the listed tokens that leave
 * less. Returns the text tokens allowed. */
static int gm_from_slot(const llm_gmatch *m, int slot, int32_t lim, int32_t cost, uint32_t *allow)
{
    const llm_gmatch_cache *c = m->cache;
    const uint32_t *bits = c->bits + (size_t)slot * (size_t)m->n_words;
    size_t bytes = sizeof *allow * (size_t)m->n_words;
    if (c->max_cost[slot] <= lim) {
        memcpy(allow, bits, bytes);
        return c->n_text[slot];
    }
    const int32_t *down = c->list[slot], *up = down ? down + 2 * c->n_down[slot] : NULL;
    int n = 0;
    if (lim >= cost) {
        memcpy(allow, bits, bytes);
        n = c->n_text[slot];
        for (int i = 0; i < c->n_up[slot]; i++)
            if (up[2 * i + 1] > lim)
                allow[up[2 * i] >> 5] &= ~(1u << (up[2 * i] & 31)), n--;
        return n;
    }
    memset(allow, 0, bytes);
    for (int i = 0; i < c->n_down[slot]; i++)
        if (down[2 * i + 1] <= lim)
            allow[down[2 * i] >> 5] |= 1u << (down[2 * i] & 31), n++;
    if (llm_gmatch_complete(m))
        gm_allow_ends(m, allow);
    return n;
}

/* A walk from the committed state: the plain mask into plain, the one
 * under limit lim into f->tight (when set), what it found into f. -1 on
 * no memory, 1 on a bound passed (m->overflow), else 0. */
static int gm_walk_all(llm_gmatch *m, uint32_t *plain, gm_found *f)
{
    size_t bytes = sizeof *plain * (size_t)m->n_words;
    memset(plain, 0, bytes);
    if (f->tight)
        memset(f->tight, 0, bytes);
    m->overflow = 0;
    if (!llm_gmatch_finished(m) && gm_walk(m, plain, f))
        return -1;
    m->max_work = m->work > m->max_work ? m->work : m->max_work;
    gm_shrink(m);
    if (m->overflow)
        return 1;
    if (llm_gmatch_complete(m)) {
        gm_allow_ends(m, plain);
        if (f->tight)
            gm_allow_ends(m, f->tight);
    }
    return 0;
}

llm_status llm_gmatch_mask(llm_gmatch *m, uint32_t *allow, llm_error *err)
{
    if (!m->gv)
        return llm_errf(err, LLM_ERR_GRAMMAR, "grammar: a matcher without a vocabulary index has no masks");
    gm_serialize(m);
    uint64_t h = m->key_len >= 0 ? gm_key_hash(m) : 0;
    int slot = m->key_len >= 0 ? gm_cached(m->cache, m, h) : -1;
    int32_t cost = gm_cost(m, &m->cur), lim = gm_limit_for_cost(m, cost);
    int n_tight;
    m->masks++;
    m->work = 0;
    uint32_t *plain = m->plain;
    if (gm_slot_serves(m, slot, lim)) {
        m->cached++;
        n_tight = gm_from_slot(m, slot, lim, cost, allow);
    } else {
        int finished = llm_gmatch_finished(m);
        gm_found f = {.tight = lim < GRAMMAR_COST_INF && !finished ? allow : NULL, .lim = lim, .max_cost = -1,
                      .base = cost, .down = m->down, .up = m->up};
        if (!f.tight)
            plain = allow; /* the budget does not bind: the plain mask is the one */
        int rc = gm_walk_all(m, plain, &f);
        if (rc)
            return rc < 0 ? llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory for a mask")
                          : gm_overflow_err(m, err); /* a stack was dropped: the mask could miss tokens */
        if (m->key_len >= 0 && slot < 0)
            gm_cache_put(m->cache, m, h, plain, &f);
        if (!f.tight)
            return LLM_OK;
        n_tight = f.n_tight;
        slot = -1;
    }
    if (n_tight == 0 && !llm_gmatch_complete(m)) /* no token keeps the budget (a byte the vocabulary lacks on
                                                  * the shortest way): the output is not bent */
        memcpy(allow, slot >= 0 ? m->cache->bits + (size_t)slot * (size_t)m->n_words : plain,
               sizeof *allow * (size_t)m->n_words);
    return LLM_OK;
}

int llm_gmatch_mask_cached(llm_gmatch *m)
{
    if (!m->gv)
        return 0;
    if (llm_gmatch_finished(m))
        return 1; /* only an end may come: nothing to walk */
    gm_serialize(m);
    return m->key_len >= 0 && gm_slot_serves(m, gm_cached(m->cache, m, gm_key_hash(m)), gm_limit(m));
}

long llm_gmatch_work(const llm_gmatch *m) { return m->work; }

void llm_gmatch_stats(const llm_gmatch *m, uint64_t *masks, uint64_t *cached, long *max_work)
{
    *masks = m->masks;
    *cached = m->cached;
    *max_work = m->max_work;
}

/* ---- life ------------------------------------------------------------------------- */

llm_status llm_gmatch_new(const llm_grammar *g, const llm_gmatch_vocab *gv, llm_gmatch_cache *cache, uint64_t partition,
                          llm_gmatch **out, llm_error *err)
{
    *out = NULL;
    llm_gmatch *m = calloc(1, sizeof *m);
    if (!m)
        return llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory for a matcher");
    m->g = g, m->gv = gv, m->partition = partition, m->budget = -1;
    if (gv) {
        size_t d = (size_t)gv->max_len + 1;
        m->n_words = (gv->n_vocab + 31) / 32;
        m->walk = malloc(sizeof *m->walk * d);
        m->plain = malloc(sizeof *m->plain * (size_t)m->n_words);
        m->down = malloc(sizeof(int32_t) * 2 * GM_LIST_MAX);
        m->up = malloc(sizeof(int32_t) * 2 * GM_LIST_MAX);
        m->mark_nodes = malloc(sizeof(int32_t) * d);
        m->mark_sv = malloc(sizeof(int32_t) * d);
        m->own_cache = !cache || cache->n_words != m->n_words;
        m->cache = m->own_cache ? llm_gmatch_cache_new(gv->n_vocab, 0) : cache;
        if (!m->walk || !m->plain || !m->down || !m->up || !m->mark_nodes || !m->mark_sv || !m->cache) {
            llm_gmatch_free(m);
            return llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory for a matcher");
        }
    }
    llm_status st = LLM_OK;
    for (int a = g->rule_alt[g->root]; !st && a < g->rule_alt[g->root + 1]; a++)
        if (gm_push(m, 0, -1, g->alt[a], 0))
            st = llm_errf(err, LLM_ERR_NOMEM, "grammar: no memory for a matcher");
    if (!st && m->overflow)
        st = gm_overflow_err(m, err);
    if (st) {
        llm_gmatch_free(m);
        return st;
    }
    m->cur = (gstate){0, m->n_sv, 0, 0, 0};
    *out = m;
    return LLM_OK;
}

void llm_gmatch_free(llm_gmatch *m)
{
    if (!m)
        return;
    free(m->nodes);
    free(m->nodes2);
    free(m->sv);
    free(m->sv2);
    free(m->walk);
    free(m->plain);
    free(m->down);
    free(m->up);
    free(m->mark_nodes);
    free(m->mark_sv);
    free(m->remap);
    if (m->own_cache)
        llm_gmatch_cache_free(m->cache);
    free(m);
}
