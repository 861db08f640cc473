/* kv_cache.c - paged KV blocks: free stack, reference counts, a hash index
 * of full blocks by content, an LRU list of cached unreferenced blocks, and
 * copy-on-write; with sliding-window layers, a second pool of blocks for
 * them whose blocks are dropped once every window has passed them. See
 * kv_cache.h for the contract and docs/internals/kv-cache.md for the
 * design. */
#include <string.h>

#include "llm/kv_cache.h"

#define NIL (-1)

/* A hashed block is known by its key: what precedes it (pkey) and its
 * own tokens. pkey names the previous block of its sequence by physical
 * id and generation, so a match is exact by induction (the first block
 * by its tokens and the sequence's salt): no hash collision, however
 * crafted, can hand out K/V computed after another prefix. */
typedef struct kv_block {
    int32_t ref;
    int32_t hnext;        /* next block in its hash bucket */
    int32_t prev, next;   /* LRU links while cached and unreferenced */
    int32_t twin;         /* global block: the local block with the same positions' K/V of local layers (or NIL) */
    int32_t owner;        /* local block linked as a twin: the global block it is the twin of */
    uint8_t hashed;       /* content known: global, in the hash index; local, linked as its owner's twin */
    uint32_t gen;         /* bumped when its content is forgotten: children keyed on it go stale */
    uint64_t pkey, hash;  /* global: key of what precedes it; hash of the whole key (bucket) */
} kv_block;

/* One pool of blocks: the global pool holds every layer's K/V (or, with
 * sliding-window layers, the global layers'); the local pool the
 * sliding-window layers'. A local block's content is known through its
 * owner, the global block of the same positions and prefix: it is found
 * as that block's twin, never by hash. */
typedef struct kv_pool {
    void *storage[LLM_MAX_RANKS];
    int n_blocks;
    kv_block *blk;            /* (n_blocks) */
    int32_t *free_stack;      /* (n_blocks) */
    int n_free;
    int32_t lru_head, lru_tail; /* cached unreferenced: evicted from the head */
    int n_cached, n_used;
    uint64_t evictions;
    int32_t *cp_src, *cp_dst; /* (n_blocks) queued copies */
    int n_copies;
} kv_pool;

struct kv_cache {
    llm_backend *b[LLM_MAX_RANKS];
    llm_kv_layer *layers; /* (n_ranks, n_layer) */
    int n_ranks, n_layer, bs, prefix_cache;
    int window;           /* > 0: local layers keep only this many positions back */
    kv_pool pool[2];      /* global, local (used when window > 0) */
    int32_t *tokens;      /* (global n_blocks, bs): a hashed block's own tokens, to confirm a hit */
    int32_t *bucket;      /* (n_buckets) */
    uint64_t bucket_mask;
};

static const char *const kv_names[] = {"f16", "f32", "q8_0"};

llm_status llm_kv_type_parse(const char *s, llm_kv_type *out, llm_error *err)
{
    for (int i = 0; i < 3; i++)
        if (s && !strcmp(s, kv_names[i])) {
            *out = (llm_kv_type)i;
            return LLM_OK;
        }
    return llm_errf(err, LLM_ERR_INVALID_ARG, "kv cache type '%s' is not one of f16, f32, q8_0", s ? s : "(null)");
}

const char *llm_kv_type_name(llm_kv_type t) { return (unsigned)t < 3 ? kv_names[t] : "?"; }

static quant_type kv_qtype(llm_kv_type t) { return t == LLM_KV_F32 ? QT_F32 : t == LLM_KV_Q8_0 ? QT_Q8_0 : QT_F16; }

size_t kv_cache_block_bytes(llm_kv_type type, int block_size, int n_layer, int kv_dim)
{
    return 2 * (size_t)n_layer * (size_t)block_size * quant_row_bytes(kv_qtype(type), (size_t)kv_dim);
}

/* ---- hashing ---------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static uint64_t block_hash(uint64_t pkey, const int32_t *t, int n)
{
    uint64_t h = mix64(pkey ^ 0x9e3779b97f4a7c15ULL);
    for (int i = 0; i < n; i++) h = mix64(h ^ (uint64_t)(uint32_t)t[i] ^ ((uint64_t)i << 32));
    return h;
}

/* A global block by physical id and generation. */
static uint64_t block_key(const kv_cache *c, int32_t i) { return (uint64_t)(uint32_t)i << 32 | c->pool[KV_POOL_GLOBAL].blk[i].gen; }

/* The key of what precedes block k of s: block k-1 (id, generation), or
 * for the first block the sequence's salt (top bit set: never an id). */
static uint64_t parent_key(const kv_cache *c, const kv_seq *s, int k)
{
    return k == 0 ? s->salt | (1ULL << 63) : block_key(c, s->blocks[k - 1]);
}

static int32_t index_find(const kv_cache *c, uint64_t h, uint64_t pkey, const int32_t *t)
{
    const kv_block *blk = c->pool[KV_POOL_GLOBAL].blk;
    for (int32_t i = c->bucket[h & c->bucket_mask]; i != NIL; i = blk[i].hnext)
        if (blk[i].hash == h && blk[i].pkey == pkey &&
            !memcmp(c->tokens + (size_t)i * c->bs, t, sizeof(int32_t) * (size_t)c->bs))
            return i;
    return NIL;
}

static void index_add(kv_cache *c, int32_t i, uint64_t h, uint64_t pkey, const int32_t *t)
{
    kv_block *b = &c->pool[KV_POOL_GLOBAL].blk[i];
    b->hash = h;
    b->pkey = pkey;
    b->hashed = 1;
    memcpy(c->tokens + (size_t)i * c->bs, t, sizeof(int32_t) * (size_t)c->bs);
    b->hnext = c->bucket[h & c->bucket_mask];
    c->bucket[h & c->bucket_mask] = i;
}

/* ---- LRU of cached, unreferenced blocks ------------------------------------ */

static void lru_unlink(kv_pool *p, int32_t i)
{
    kv_block *b = &p->blk[i];
    if (b->prev != NIL) p->blk[b->prev].next = b->next; else p->lru_head = b->next;
    if (b->next != NIL) p->blk[b->next].prev = b->prev; else p->lru_tail = b->prev;
    b->prev = b->next = NIL;
    p->n_cached--;
}

static void lru_append(kv_pool *p, int32_t i)
{
    kv_block *b = &p->blk[i];
    b->prev = p->lru_tail;
    b->next = NIL;
    if (p->lru_tail != NIL) p->blk[p->lru_tail].next = i; else p->lru_head = i;
    p->lru_tail = i;
    p->n_cached++;
}

/* ---- forgetting content ------------------------------------------------------ */

/* Local block j's content is no longer known (its owner was forgotten, or
 * it is evicted or about to be written): unlinked from its owner; an
 * unreferenced one goes from the LRU to the free stack. */
static void local_forget(kv_cache *c, int32_t j)
{
    kv_pool *p = &c->pool[KV_POOL_LOCAL];
    kv_block *b = &p->blk[j];
    if (!b->hashed)
        return;
    kv_block *owner = &c->pool[KV_POOL_GLOBAL].blk[b->owner];
    if (owner->twin == j)
        owner->twin = NIL;
    b->hashed = 0;
    if (b->ref == 0) {
        lru_unlink(p, j);
        p->free_stack[p->n_free++] = j;
    }
}

/* Global block i leaves the index (evicted, or about to be rewritten): its
 * generation moves on, so blocks keyed on it go stale, and its twin's
 * content is no longer reachable. */
static void index_remove(kv_cache *c, int32_t i)
{
    kv_block *blk = c->pool[KV_POOL_GLOBAL].blk;
    int32_t *p = &c->bucket[blk[i].hash & c->bucket_mask];
    while (*p != i) {
        LLM_ASSERT(*p != NIL);
        p = &blk[*p].hnext;
    }
    *p = blk[i].hnext;
    blk[i].hashed = 0;
    blk[i].gen++;
    if (blk[i].twin != NIL)
        local_forget(c, blk[i].twin);
}

static void forget(kv_cache *c, kv_pool_id pool, int32_t i)
{
    if (pool == KV_POOL_GLOBAL)
        index_remove(c, i);
    else
        local_forget(c, i);
}

/* ---- blocks ------------------------------------------------------------------ */

/* A block of pool with ref 1: a free one, else the least recently released
 * cached one (forgetting its content). Callers check availability first. */
static int32_t block_alloc(kv_cache *c, kv_pool_id pool)
{
    kv_pool *p = &c->pool[pool];
    if (p->n_free == 0) { /* evict the least recently released: forgetting it frees it */
        int32_t i = p->lru_head;
        LLM_ASSERT(i != NIL);
        if (pool == KV_POOL_LOCAL) {
            local_forget(c, i); /* unreferenced: moves it from the LRU to the free stack */
        } else {
            index_remove(c, i);
            lru_unlink(p, i);
            p->free_stack[p->n_free++] = i;
        }
        p->evictions++;
    }
    int32_t i = p->free_stack[--p->n_free];
    p->blk[i].ref = 1;
    p->n_used++;
    return i;
}

static void block_ref(kv_pool *p, int32_t i)
{
    if (p->blk[i].ref++ == 0) {
        lru_unlink(p, i); /* only blocks with known content sit unreferenced outside the free stack */
        p->n_used++;
    }
}

static void block_unref(kv_pool *p, int32_t i)
{
    LLM_ASSERT(p->blk[i].ref > 0);
    if (--p->blk[i].ref > 0)
        return;
    p->n_used--;
    if (p->blk[i].hashed)
        lru_append(p, i);
    else
        p->free_stack[p->n_free++] = i;
}

/* ---- the cache ----------------------------------------------------------------- */

static llm_status cache_check(const kv_cache_config *cfg, int bs, int n_head_kv, int head_dim, llm_error *err)
{
    if (bs < 1 || bs > KV_MAX_BLOCK)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "kv cache: block size %d not in [1, %d]", bs, KV_MAX_BLOCK);
    if ((unsigned)cfg->type > LLM_KV_Q8_0)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "kv cache: unknown type %d", (int)cfg->type);
    if (cfg->type == LLM_KV_Q8_0 && head_dim % QK8_0)
        return llm_errf(err, LLM_ERR_UNSUPPORTED, "kv cache: q8_0 needs a head size that is a multiple of %d (model has %d)",
                        QK8_0, head_dim);
    if (n_head_kv < 1 || head_dim < 1)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "kv cache: bad head shape %d x %d", n_head_kv, head_dim);
    if (cfg->window < 0 || cfg->n_local_blocks < 0)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "kv cache: window %d and local blocks %d must not be negative",
                        cfg->window, cfg->n_local_blocks);
    return LLM_OK;
}

static llm_status pool_alloc(kv_pool *p, int n_blocks)
{
    size_t nb = (size_t)n_blocks;
    p->n_blocks = n_blocks;
    p->blk = calloc(nb, sizeof *p->blk);
    p->free_stack = malloc(nb * sizeof(int32_t));
    p->cp_src = malloc(nb * sizeof(int32_t));
    p->cp_dst = malloc(nb * sizeof(int32_t));
    if (!p->blk || !p->free_stack || !p->cp_src || !p->cp_dst)
        return LLM_ERR_NOMEM;
    for (int i = 0; i < n_blocks; i++) {
        p->blk[i].hnext = p->blk[i].prev = p->blk[i].next = p->blk[i].twin = NIL;
        p->free_stack[i] = n_blocks - 1 - i; /* block 0 handed out first */
    }
    p->n_free = n_blocks;
    p->lru_head = p->lru_tail = NIL;
    return LLM_OK;
}

static llm_status cache_alloc_meta(kv_cache *c, int n_local)
{
    size_t nb = (size_t)c->pool[KV_POOL_GLOBAL].n_blocks, nbk = 1;
    while (nbk < nb) nbk <<= 1;
    c->bucket_mask = nbk - 1;
    c->tokens = malloc(nb * (size_t)c->bs * sizeof(int32_t));
    c->bucket = malloc(nbk * sizeof(int32_t));
    c->layers = calloc((size_t)c->n_layer * (size_t)c->n_ranks, sizeof *c->layers);
    if (!c->tokens || !c->bucket || !c->layers || pool_alloc(&c->pool[KV_POOL_GLOBAL], (int)nb) ||
        (c->window > 0 && pool_alloc(&c->pool[KV_POOL_LOCAL], n_local)))
        return LLM_ERR_NOMEM;
    for (size_t i = 0; i < nbk; i++) c->bucket[i] = NIL;
    return LLM_OK;
}

/* The pool layer l keeps its K/V in (with a window, flagged layers are local). */
static kv_pool_id layer_pool(const kv_cache_config *cfg, int l)
{
    return cfg->window > 0 && cfg->local && cfg->local[l] ? KV_POOL_LOCAL : KV_POOL_GLOBAL;
}

static int pool_layers(const kv_cache_config *cfg, int n_layer, kv_pool_id pool)
{
    int n = 0;
    for (int l = 0; l < n_layer; l++) n += layer_pool(cfg, l) == pool;
    return n;
}

/* One pool's storage on every rank, and its layers' views into it (K then
 * V of each of its layers, in layer order). A pool with no layers (every
 * layer local) is bookkeeping only. */
static llm_status pool_storage(kv_cache *c, const kv_cache_config *cfg, kv_pool_id pl, quant_type qt, int kv_dim,
                               llm_error *err)
{
    kv_pool *p = &c->pool[pl];
    size_t row = quant_row_bytes(qt, (size_t)kv_dim), half = (size_t)c->bs * row * (size_t)p->n_blocks;
    size_t bytes = 2 * half * (size_t)pool_layers(cfg, c->n_layer, pl);
    for (int r = 0; r < c->n_ranks && bytes > 0; r++) {
        if (!(p->storage[r] = llm_backend_buffer_alloc(c->b[r], bytes)))
            return llm_errf(err, LLM_ERR_NOMEM,
                            "kv cache: cannot allocate %d %s blocks (%zu MiB) on backend %s rank %d; %zu MiB available",
                            p->n_blocks, pl == KV_POOL_LOCAL ? "local" : "global", bytes >> 20, c->b[r]->iface->name,
                            r, llm_backend_mem_available(c->b[r]) >> 20);
        char *base = p->storage[r];
        for (int l = 0, k = 0; l < c->n_layer; l++)
            if (layer_pool(cfg, l) == pl) {
                c->layers[r * c->n_layer + l] = (llm_kv_layer){base + 2 * (size_t)k * half,
                                                               base + (2 * (size_t)k + 1) * half, qt, c->bs, kv_dim, row};
                k++;
            }
    }
    return LLM_OK;
}

static llm_status cache_storage(kv_cache *c, const kv_cache_config *cfg, int kv_dim, llm_error *err)
{
    quant_type qt = kv_qtype(cfg->type);
    llm_status st = pool_storage(c, cfg, KV_POOL_GLOBAL, qt, kv_dim, err);
    return st || c->window == 0 ? st : pool_storage(c, cfg, KV_POOL_LOCAL, qt, kv_dim, err);
}

llm_status kv_cache_new(const kv_cache_config *cfg, llm_backend *b, int n_layer, int n_head_kv, int head_dim,
                        kv_cache **out, llm_error *err)
{
    *out = NULL;
    int bs = cfg->block_size > 0 ? cfg->block_size : KV_DEFAULT_BLOCK, kv_dim = n_head_kv * head_dim;
    llm_status st = cache_check(cfg, bs, n_head_kv, head_dim, err);
    if (st)
        return st;
    int window = cfg->window > 0 && pool_layers(cfg, n_layer, KV_POOL_LOCAL) > 0 ? cfg->window : 0;
    size_t per_block = kv_cache_block_bytes(cfg->type, bs, n_layer, kv_dim);
    size_t n = cfg->n_blocks > 0 ? (size_t)cfg->n_blocks : cfg->bytes / per_block;
    if (n < 1 || n > INT32_MAX / KV_MAX_BLOCK)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "kv cache: %zu bytes hold %zu blocks of %zu bytes (need 1 to %d)",
                        cfg->bytes, n, per_block, INT32_MAX / KV_MAX_BLOCK);
    int n_local = cfg->n_local_blocks > 0 && (size_t)cfg->n_local_blocks < n ? cfg->n_local_blocks : (int)n;
    int n_ranks = cfg->n_ranks > 1 ? cfg->n_ranks : 1;
    if (n_ranks > LLM_MAX_RANKS || (n_ranks > 1 && !cfg->ranks))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "kv cache: %d ranks (at most %d, each with a backend)", n_ranks,
                        LLM_MAX_RANKS);
    kv_cache *c = calloc(1, sizeof *c);
    if (!c)
        return llm_errf(err, LLM_ERR_NOMEM, "kv cache: no memory");
    *c = (kv_cache){.n_ranks = n_ranks, .n_layer = n_layer, .bs = bs, .prefix_cache = cfg->prefix_cache, .window = window};
    c->pool[KV_POOL_GLOBAL].n_blocks = (int)n;
    for (int r = 0; r < n_ranks; r++) c->b[r] = r ? cfg->ranks[r] : b;
    if (cache_alloc_meta(c, n_local)) {
        kv_cache_free(c);
        return llm_errf(err, LLM_ERR_NOMEM, "kv cache: no memory for %zu blocks", n);
    }
    if ((st = cache_storage(c, cfg, kv_dim, err))) {
        kv_cache_free(c);
        return st;
    }
    *out = c;
    return LLM_OK;
}

static void pool_free(kv_cache *c, kv_pool *p)
{
    for (int r = 0; r < c->n_ranks; r++)
        if (c->b[r] && p->storage[r])
            llm_backend_buffer_free(c->b[r], p->storage[r]);
    free(p->blk);
    free(p->free_stack);
    free(p->cp_src);
    free(p->cp_dst);
}

void kv_cache_free(kv_cache *c)
{
    if (!c)
        return;
    pool_free(c, &c->pool[KV_POOL_GLOBAL]);
    pool_free(c, &c->pool[KV_POOL_LOCAL]);
    free(c->tokens);
    free(c->bucket);
    free(c->layers);
    free(c);
}

size_t kv_cache_local_need(int window, int block_size, int max_seqs, int max_rows)
{
    size_t bs = (size_t)block_size, per = ((size_t)window + bs - 1) / bs + 2;
    return per * (size_t)max_seqs + ((size_t)max_rows + bs - 1) / bs;
}

const llm_kv_layer *kv_cache_layers(const kv_cache *c) { return c->layers; }
int kv_cache_block_size(const kv_cache *c) { return c->bs; }
int kv_cache_n_blocks(const kv_cache *c) { return c->pool[KV_POOL_GLOBAL].n_blocks; }
int kv_cache_window(const kv_cache *c) { return c->window; }

static int pool_available(const kv_pool *p) { return p->n_free + p->n_cached; }
int kv_cache_available(const kv_cache *c) { return pool_available(&c->pool[KV_POOL_GLOBAL]); }

void kv_cache_get_stats(const kv_cache *c, kv_cache_stats *out)
{
    const kv_pool *g = &c->pool[KV_POOL_GLOBAL], *l = &c->pool[KV_POOL_LOCAL];
    *out = (kv_cache_stats){g->n_blocks, g->n_used, g->n_cached, g->n_free, g->evictions,
                            l->n_blocks, l->n_used, l->n_cached, l->n_free, l->evictions};
}

int kv_cache_copies(const kv_cache *c, kv_pool_id pool, const int32_t **src, const int32_t **dst)
{
    const kv_pool *p = &c->pool[pool == KV_POOL_LOCAL ? KV_POOL_LOCAL : KV_POOL_GLOBAL];
    *src = p->cp_src;
    *dst = p->cp_dst;
    return p->n_copies;
}

void kv_cache_copies_done(kv_cache *c) { c->pool[KV_POOL_GLOBAL].n_copies = c->pool[KV_POOL_LOCAL].n_copies = 0; }

/* ---- sequences ------------------------------------------------------------------ */

void kv_seq_init(kv_seq *s) { memset(s, 0, sizeof *s); }

/* The first block a row at position pos or later still reads in local
 * layers: earlier ones have left every window. */
static int local_first(const kv_cache *c, int pos)
{
    return pos - c->window + 1 > 0 ? (pos - c->window + 1) / c->bs : 0;
}

/* Drops s's local blocks before block `first`. */
static void local_trim(kv_cache *c, kv_seq *s, int first)
{
    for (; s->lfirst < first && s->lfirst < s->n_blocks; s->lfirst++) {
        block_unref(&c->pool[KV_POOL_LOCAL], s->lblocks[s->lfirst]);
        s->lblocks[s->lfirst] = NIL;
    }
}

void kv_seq_release(kv_cache *c, kv_seq *s)
{
    /* last blocks first, so a prefix's tail is evicted before its head */
    for (int i = s->n_blocks - 1; i >= 0; i--) {
        block_unref(&c->pool[KV_POOL_GLOBAL], s->blocks[i]);
        if (c->window > 0 && i >= s->lfirst)
            block_unref(&c->pool[KV_POOL_LOCAL], s->lblocks[i]);
    }
    free(s->blocks);
    free(s->lblocks);
    uint64_t salt = s->salt; /* the sequence's, for when it is matched again */
    kv_seq_init(s);
    s->salt = salt;
}

int kv_seq_truncate(kv_cache *c, kv_seq *s, int n_tokens)
{
    LLM_ASSERT(n_tokens >= 0 && n_tokens <= s->n_tokens);
    if (c->window > 0 && local_first(c, n_tokens) < s->lfirst) { /* its windows' blocks are gone */
        kv_seq_release(c, s);
        return 0;
    }
    int keep = (n_tokens + c->bs - 1) / c->bs;
    for (int k = s->n_blocks - 1; k >= keep; k--) { /* later writes must not land in blocks others may share */
        block_unref(&c->pool[KV_POOL_GLOBAL], s->blocks[k]);
        if (c->window > 0)
            block_unref(&c->pool[KV_POOL_LOCAL], s->lblocks[k]);
    }
    s->n_blocks = keep < s->n_blocks ? keep : s->n_blocks;
    s->n_tokens = n_tokens;
    s->n_hashed = s->n_hashed < n_tokens / c->bs ? s->n_hashed : n_tokens / c->bs;
    return n_tokens;
}

static int seq_grow(const kv_cache *c, kv_seq *s, int n_blocks)
{
    if (n_blocks <= s->cap)
        return 0;
    int cap = s->cap ? s->cap : 8;
    while (cap < n_blocks) cap *= 2;
    int32_t *p = realloc(s->blocks, sizeof(int32_t) * (size_t)cap);
    if (!p)
        return -1;
    s->blocks = p;
    if (c->window > 0) {
        if (!(p = realloc(s->lblocks, sizeof(int32_t) * (size_t)cap)))
            return -1; /* blocks grew: harmless, cap stays (both are at least cap long) */
        s->lblocks = p;
    }
    s->cap = cap;
    return 0;
}

/* How many of the first m matched blocks s can keep: all of them when the
 * local blocks the rows after them read (their windows) are cached as the
 * matched blocks' twins, else fewer (m = 0 always works). */
static int local_match(const kv_cache *c, const kv_seq *s, int m)
{
    const kv_block *g = c->pool[KV_POOL_GLOBAL].blk;
    for (; m > 0; m--) {
        int k = local_first(c, m * c->bs);
        while (k < m && g[s->blocks[k]].twin != NIL) k++;
        if (k == m)
            return m;
    }
    return 0;
}

int kv_seq_match(kv_cache *c, kv_seq *s, const int32_t *tokens, int n)
{
    LLM_ASSERT(s->n_blocks == 0);
    if (!c->prefix_cache || seq_grow(c, s, n / c->bs + 1))
        return 0;
    for (int k = 0; (k + 1) * c->bs <= n; k++) {
        const int32_t *t = tokens + (size_t)k * c->bs;
        uint64_t pk = parent_key(c, s, k);
        int32_t i = index_find(c, block_hash(pk, t, c->bs), pk, t);
        if (i == NIL)
            break;
        block_ref(&c->pool[KV_POOL_GLOBAL], i);
        s->blocks[s->n_blocks++] = i;
    }
    if (c->window > 0) {
        int keep = local_match(c, s, s->n_blocks);
        while (s->n_blocks > keep) block_unref(&c->pool[KV_POOL_GLOBAL], s->blocks[--s->n_blocks]);
        s->lfirst = local_first(c, keep * c->bs);
        for (int k = 0; k < keep; k++) {
            s->lblocks[k] = k < s->lfirst ? NIL : c->pool[KV_POOL_GLOBAL].blk[s->blocks[k]].twin;
            if (k >= s->lfirst)
                block_ref(&c->pool[KV_POOL_LOCAL], s->lblocks[k]);
        }
    }
    s->n_tokens = s->n_blocks * c->bs;
    s->n_hashed = s->n_blocks; /* a block count, like kv_seq_commit reads it */
    return s->n_tokens;
}

llm_status kv_seq_fork(kv_cache *c, kv_seq *dst, const kv_seq *src, int n_tokens)
{
    LLM_ASSERT(dst->n_blocks == 0 && n_tokens <= src->n_tokens);
    int nb = (n_tokens + c->bs - 1) / c->bs, lfirst = c->window > 0 ? local_first(c, n_tokens) : 0;
    if (lfirst < src->lfirst)
        return LLM_ERR_KV_FULL; /* src moved on and dropped local blocks dst's windows read */
    if (seq_grow(c, dst, nb))
        return LLM_ERR_NOMEM;
    for (int i = 0; i < nb; i++) {
        block_ref(&c->pool[KV_POOL_GLOBAL], src->blocks[i]);
        dst->blocks[i] = src->blocks[i];
        if (c->window > 0) {
            dst->lblocks[i] = i < lfirst ? NIL : src->lblocks[i];
            if (i >= lfirst)
                block_ref(&c->pool[KV_POOL_LOCAL], src->lblocks[i]);
        }
    }
    dst->n_blocks = nb;
    dst->lfirst = lfirst;
    dst->n_tokens = n_tokens;
    dst->n_hashed = n_tokens / c->bs;
    dst->salt = src->salt;
    return LLM_OK;
}

/* The block of table t (s->blocks or s->lblocks) that the next write lands
 * in, when it already exists. */
static int32_t write_block(const kv_cache *c, const kv_seq *s, const int32_t *t)
{
    int k = s->n_tokens / c->bs;
    return k < s->n_blocks ? t[k] : NIL;
}

/* Blocks pool must give for writing n more tokens: new ones, plus a copy
 * of a shared block the write lands in. */
static int pool_needed(const kv_cache *c, const kv_seq *s, kv_pool_id pool, int n)
{
    int want = (s->n_tokens + n + c->bs - 1) / c->bs, extra = want > s->n_blocks ? want - s->n_blocks : 0;
    int32_t w = write_block(c, s, pool == KV_POOL_LOCAL ? s->lblocks : s->blocks);
    return extra + (n > 0 && w != NIL && c->pool[pool].blk[w].ref > 1);
}

int kv_seq_blocks_needed(const kv_cache *c, const kv_seq *s, int n) { return pool_needed(c, s, KV_POOL_GLOBAL, n); }

/* Makes the write block of table t private (a queued copy when shared;
 * forgotten content when cached), then appends new blocks up to want. */
static void pool_reserve(kv_cache *c, kv_seq *s, kv_pool_id pool, int32_t *t, int n, int want)
{
    kv_pool *p = &c->pool[pool];
    int32_t w = n > 0 ? write_block(c, s, t) : NIL;
    if (w != NIL && p->blk[w].ref > 1) { /* shared: write into a private copy */
        int32_t cp = block_alloc(c, pool);
        p->cp_src[p->n_copies] = w;
        p->cp_dst[p->n_copies++] = cp;
        block_unref(p, w);
        t[s->n_tokens / c->bs] = cp;
    } else if (w != NIL && p->blk[w].hashed) { /* ours alone, but its content is about to change */
        forget(c, pool, w);
    }
    for (int k = s->n_blocks; k < want; k++) t[k] = block_alloc(c, pool);
}

llm_status kv_seq_reserve(kv_cache *c, kv_seq *s, int n)
{
    int want = (s->n_tokens + n + c->bs - 1) / c->bs;
    if (pool_needed(c, s, KV_POOL_GLOBAL, n) > pool_available(&c->pool[KV_POOL_GLOBAL]) ||
        (c->window > 0 && pool_needed(c, s, KV_POOL_LOCAL, n) > pool_available(&c->pool[KV_POOL_LOCAL])))
        return LLM_ERR_KV_FULL;
    if (seq_grow(c, s, want))
        return LLM_ERR_NOMEM;
    pool_reserve(c, s, KV_POOL_GLOBAL, s->blocks, n, want);
    if (c->window > 0)
        pool_reserve(c, s, KV_POOL_LOCAL, s->lblocks, n, want);
    if (want > s->n_blocks)
        s->n_blocks = want;
    return LLM_OK;
}

/* Global block k of s was just registered: its local block becomes its
 * twin, findable by later matches through it. */
static void local_link(kv_cache *c, kv_seq *s, int k)
{
    int32_t i = s->blocks[k], j = s->lblocks[k];
    if (j == NIL || c->pool[KV_POOL_LOCAL].blk[j].hashed)
        return; /* already dropped (a window shorter than a block), or another owner's twin */
    c->pool[KV_POOL_GLOBAL].blk[i].twin = j;
    c->pool[KV_POOL_LOCAL].blk[j].hashed = 1;
    c->pool[KV_POOL_LOCAL].blk[j].owner = i;
}

/* Whether block k of s should take the place of the unreferenced entry e
 * with the same key: e lost its twin (a match then keeps less than e's
 * prefix and recomputes), while s holds the same positions' local block.
 * Without this the recomputed chain would never be registered and every
 * later match of the prefix would recompute again. */
static int supersedes(const kv_cache *c, const kv_seq *s, int k, int32_t e)
{
    const kv_block *b = &c->pool[KV_POOL_GLOBAL].blk[e];
    return c->window > 0 && b->ref == 0 && b->twin == NIL && s->lblocks[k] != NIL;
}

/* Unreferenced global block e leaves the index and goes to the free stack. */
static void index_drop(kv_cache *c, int32_t e)
{
    kv_pool *p = &c->pool[KV_POOL_GLOBAL];
    index_remove(c, e);
    lru_unlink(p, e);
    p->free_stack[p->n_free++] = e;
}

void kv_seq_commit(kv_cache *c, kv_seq *s, const int32_t *tokens, int n)
{
    LLM_ASSERT(s->n_tokens + n <= s->n_blocks * c->bs);
    s->n_tokens += n;
    for (; (s->n_hashed + 1) * c->bs <= s->n_tokens; s->n_hashed++) {
        int k = s->n_hashed;
        const int32_t *t = tokens + (size_t)k * c->bs;
        int32_t i = s->blocks[k];
        kv_block *blk = c->pool[KV_POOL_GLOBAL].blk;
        /* only under a known parent (else no match can reach it), and not
         * when a block with this key is known already (another sequence
         * computed the same prefix at the same time: it keeps the entry) */
        if (!c->prefix_cache || blk[i].hashed || (k > 0 && !blk[s->blocks[k - 1]].hashed))
            continue;
        uint64_t pk = parent_key(c, s, k), h = block_hash(pk, t, c->bs);
        int32_t e = index_find(c, h, pk, t);
        if (e != NIL && !supersedes(c, s, k, e))
            continue;
        if (e != NIL)
            index_drop(c, e);
        index_add(c, i, h, pk, t);
        if (c->window > 0)
            local_link(c, s, k);
    }
    /* kept from the row before the next one on: a sibling forked at that
     * row (n > 1 completions fork at the prompt's last token, after the
     * first completion computed it) still finds every block it reads */
    if (c->window > 0)
        local_trim(c, s, local_first(c, s->n_tokens - 1));
}
