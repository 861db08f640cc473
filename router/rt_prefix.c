/* rt_prefix.c - request chains and per-backend prefix indexes; see rt_prefix.h. */
#include <stdlib.h>
#include <string.h>

#include "llm/hash.h"
#include "rt_prefix.h"

/* ---- a request's chain ------------------------------------------------------------------ */

typedef struct chainer {
    unsigned char buf[8 + RT_PREFIX_CHUNK]; /* the link before, then the chunk being filled */
    size_t fill;
    uint64_t h;
    rt_prefix_chain *out;
} chainer;

static void feed(chainer *c, const char *p, size_t n)
{
    rt_prefix_chain *o = c->out;
    o->bytes += n;
    while (n && o->n < RT_PREFIX_MAX_LINKS) {
        size_t take = RT_PREFIX_CHUNK - c->fill < n ? RT_PREFIX_CHUNK - c->fill : n;
        memcpy(c->buf + 8 + c->fill, p, take);
        c->fill += take, p += take, n -= take;
        if (c->fill == RT_PREFIX_CHUNK) {
            memcpy(c->buf, &c->h, 8);
            c->h = llm_hash(c->buf, sizeof c->buf);
            o->link[o->n++] = c->h ? c->h : 1; /* 0 marks an empty slot in the index */
            c->fill = 0;
        }
    }
}

/* A tag byte, then the value's text as the client wrote it (a missing
 * one feeds the tag alone: "no tools" differs from "tools: []"). */
static void feed_member(chainer *c, char tag, llm_json_span obj, const char *key)
{
    llm_json_span v;
    feed(c, &tag, 1);
    if (llm_json_member(obj, key, &v))
        feed(c, v.p, v.n);
}

void rt_prefix_chain_of(llm_json_span body, const char *auth, rt_prefix_chain *out)
{
    chainer c = {.out = out};
    out->n = 0, out->bytes = 0;
    llm_json_span msgs, m;
    int chat = llm_json_member(body, "messages", &msgs);
    if (!chat && !llm_json_member(body, "prompt", &m))
        return; /* no object, or no prompt in it (embeddings): nothing a prefix cache keeps */
    /* the partition: a pod's prefix cache is per model (adapter), tenant and salt */
    feed_member(&c, 'M', body, "model");
    feed(&c, "A", 1);
    if (auth)
        feed(&c, auth, strlen(auth));
    feed_member(&c, 'S', body, "cache_salt");
    size_t partition = out->bytes;
    if (chat) {
        feed_member(&c, 'T', body, "tools");
        size_t pos = 0;
        while (out->n < RT_PREFIX_MAX_LINKS && llm_json_item(msgs, &pos, &m)) {
            feed(&c, "m", 1);
            feed(&c, m.p, m.n);
        }
    } else {
        feed_member(&c, 'P', body, "prompt");
    }
    out->bytes -= partition; /* the prompt's own bytes: what a pod computes */
}

/* ---- the index ---------------------------------------------------------------------------- */

typedef struct gen {
    uint64_t *slot; /* open addressing, linear probing; 0: empty */
    int n;
} gen;

struct rt_prefix_index {
    gen g[2];       /* g[cur] current, g[!cur] previous */
    int cur;
    int cap;        /* links in both generations at most; each holds cap/2 */
    int size;       /* slots per table: a power of two >= cap (load at most 1/2) */
};

static int clamp_cap(int cap)
{
    return cap < RT_PREFIX_MIN_CAP ? RT_PREFIX_MIN_CAP : cap > RT_PREFIX_MAX_CAP ? RT_PREFIX_MAX_CAP : cap;
}

llm_status rt_prefix_index_new(int cap, rt_prefix_index **out, llm_error *err)
{
    rt_prefix_index *x = calloc(1, sizeof *x);
    if (!x)
        return llm_errf(err, LLM_ERR_NOMEM, "no memory for a prefix index");
    x->cap = clamp_cap(cap);
    *out = x;
    return LLM_OK;
}

static void drop_tables(rt_prefix_index *x)
{
    for (int k = 0; k < 2; k++) {
        free(x->g[k].slot);
        x->g[k] = (gen){0};
    }
    x->size = 0;
}

void rt_prefix_index_free(rt_prefix_index *x)
{
    if (!x)
        return;
    drop_tables(x);
    free(x);
}

void rt_prefix_index_set_cap(rt_prefix_index *x, int cap)
{
    cap = clamp_cap(cap);
    if (cap != x->cap) { /* tables are sized by cap: start again (a pod's cache size changes when it restarts) */
        drop_tables(x);
        x->cap = cap;
    }
}

int rt_prefix_index_cap(const rt_prefix_index *x) { return x->cap; }

int rt_prefix_index_size(const rt_prefix_index *x) { return x->g[0].n + x->g[1].n; }

void rt_prefix_index_clear(rt_prefix_index *x)
{
    for (int k = 0; k < 2 && x->size; k++) {
        memset(x->g[k].slot, 0, (size_t)x->size * sizeof *x->g[k].slot);
        x->g[k].n = 0;
    }
}

static int has(const rt_prefix_index *x, const gen *g, uint64_t h)
{
    size_t mask = (size_t)x->size - 1;
    for (size_t i = (size_t)h & mask; g->slot[i]; i = (i + 1) & mask)
        if (g->slot[i] == h)
            return 1;
    return 0;
}

static int held(const rt_prefix_index *x, uint64_t h)
{
    return x->size && (has(x, &x->g[0], h) || has(x, &x->g[1], h));
}

int rt_prefix_match(const rt_prefix_index *x, const uint64_t *link, int n)
{
    int lo = 0, hi = n; /* link k held implies links 0..k-1 held (rt_prefix.h) */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (held(x, link[mid - 1]))
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static int alloc_tables(rt_prefix_index *x)
{
    int size = 1;
    while (size < x->cap) size <<= 1;
    uint64_t *a = calloc((size_t)size, sizeof *a), *b = calloc((size_t)size, sizeof *b);
    if (!a || !b) {
        free(a);
        free(b);
        return -1;
    }
    x->g[0] = (gen){a, 0}, x->g[1] = (gen){b, 0};
    x->cur = 0;
    x->size = size;
    return 0;
}

/* The current generation is full: it becomes the previous one, and the
 * previous one, forgotten, the current. */
static void rotate(rt_prefix_index *x)
{
    x->cur = !x->cur;
    gen *g = &x->g[x->cur];
    memset(g->slot, 0, (size_t)x->size * sizeof *g->slot);
    g->n = 0;
}

static void put(rt_prefix_index *x, uint64_t h)
{
    gen *g = &x->g[x->cur];
    if (has(x, g, h))
        return;
    if (g->n >= x->cap / 2) {
        rotate(x);
        g = &x->g[x->cur];
    }
    size_t mask = (size_t)x->size - 1, i = (size_t)h & mask;
    while (g->slot[i]) i = (i + 1) & mask;
    g->slot[i] = h;
    g->n++;
}

int rt_prefix_insert(rt_prefix_index *x, const uint64_t *link, int n)
{
    if (!x->size && alloc_tables(x))
        return -1;
    /* last link first: should the current generation fill midway, the
     * chain's tail goes to the older one and is forgotten first, so a
     * link held still means the links before it are */
    for (int k = n - 1; k >= 0; k--) put(x, link[k]);
    return 0;
}
