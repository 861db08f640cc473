/* kv_cache.c - paged KV blocks: free stack, reference counts, a hash index
 * of full blocks by content, an LRU list of cached unreferenced blocks, and
 * copy-on-write. See kv_cache.h for the contract and
 * docs/internals/kv-cache.md for the design. */
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
    uint8_t hashed;       /* content known: in the hash index */
    uint32_t gen;         /* bumped when its content is forgotten: children keyed on it go stale */
    uint64_t pkey, hash;  /* key of what precedes it; hash of the whole key (bucket) */
} kv_block;

struct kv_cache {
    llm_backend *b[LLM_MAX_RANKS];
    void *storage[LLM_MAX_RANKS];
    llm_kv_layer *layers; /* (n_ranks, n_layer) */
    int n_ranks, n_layer, bs, n_blocks, prefix_cache;
    kv_block *blk;        /* (n_blocks) */
    int32_t *tokens;      /* (n_blocks, bs): a hashed block's own tokens, to confirm a hit */
    int32_t *bucket;      /* (n_buckets) */
    uint64_t bucket_mask;
    int32_t *free_stack;  /* (n_blocks) */
    int n_free;
    int32_t lru_head, lru_tail; /* cached unreferenced: evicted from the head */
    int n_cached, n_used;
    uint64_t evictions;
    int32_t *cp_src, *cp_dst; /* (n_blocks) queued copies */
    int n_copies;
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

/* The key of what precedes block k of s: block k-1 (id, generation), or
 * for the first block the sequence's salt (top bit set: never an id). */
static uint64_t parent_key(const kv_cache *c, const kv_seq *s, int k)
{
    if (k == 0)
        return s->salt | (1ULL << 63);
    int32_t p = s->blocks[k - 1];
    return (uint64_t)(uint32_t)p << 32 | c->blk[p].gen;
}

static int32_t index_find(const kv_cache *c, uint64_t h, uint64_t pkey, const int32_t *t)
{
    for (int32_t i = c->bucket[h & c->bucket_mask]; i != NIL; i = c->blk[i].hnext)
        if (c->blk[i].hash == h && c->blk[i].pkey == pkey &&
            !memcmp(c->tokens + (size_t)i * c->bs, t, sizeof(int32_t) * (size_t)c->bs))
            return i;
    return NIL;
}

static void index_add(kv_cache *c, int32_t i, uint64_t h, uint64_t pkey, const int32_t *t)
{
    kv_block *b = &c->blk[i];
    b->hash = h;
    b->pkey = pkey;
    b->hashed = 1;
    memcpy(c->tokens + (size_t)i * c->bs, t, sizeof(int32_t) * (size_t)c->bs);
    b->hnext = c->bucket[h & c->bucket_mask];
    c->bucket[h & c->bucket_mask] = i;
}

static void index_remove(kv_cache *c, int32_t i)
{
    int32_t *p = &c->bucket[c->blk[i].hash & c->bucket_mask];
    while (*p != i) {
        LLM_ASSERT(*p != NIL);
        p = &c->blk[*p].hnext;
    }
    *p = c->blk[i].hnext;
    c->blk[i].hashed = 0;
    c->blk[i].gen++;
}

/* ---- LRU of cached, unreferenced blocks ------------------------------------ */

static void lru_unlink(kv_cache *c, int32_t i)
{
    kv_block *b = &c->blk[i];
    if (b->prev != NIL) c->blk[b->prev].next = b->next; else c->lru_head = b->next;
    if (b->next != NIL) c->blk[b->next].prev = b->prev; else c->lru_tail = b->prev;
    b->prev = b->next = NIL;
    c->n_cached--;
}

static void lru_append(kv_cache *c, int32_t i)
{
    kv_block *b = &c->blk[i];
    b->prev = c->lru_tail;
    b->next = NIL;
    if (c->lru_tail != NIL) c->blk[c->lru_tail].next = i; else c->lru_head = i;
    c->lru_tail = i;
    c->n_cached++;
}

/* ---- blocks ------------------------------------------------------------------ */

/* A block with ref 1: a free one, else the least recently released cached
 * one (forgetting its content). Callers check kv_cache_available first. */
static int32_t block_alloc(kv_cache *c)
{
    int32_t i;
    if (c->n_free > 0) {
        i = c->free_stack[--c->n_free];
    } else {
        i = c->lru_head;
        LLM_ASSERT(i != NIL);
        lru_unlink(c, i);
        index_remove(c, i);
        c->evictions++;
    }
    c->blk[i].ref = 1;
    c->n_used++;
    return i;
}

static void block_ref(kv_cache *c, int32_t i)
{
    if (c->blk[i].ref++ == 0) {
        lru_unlink(c, i); /* only hashed blocks sit unreferenced outside the free stack */
        c->n_used++;
    }
}

static void block_unref(kv_cache *c, int32_t i)
{
    LLM_ASSERT(c->blk[i].ref > 0);
    if (--c->blk[i].ref > 0)
        return;
    c->n_used--;
    if (c->blk[i].hashed)
        lru_append(c, i);
    else
        c->free_stack[c->n_free++] = i;
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
    return LLM_OK;
}

static llm_status cache_alloc_meta(kv_cache *c)
{
    size_t nb = (size_t)c->n_blocks, nbk = 1;
    while (nbk < nb) nbk <<= 1;
    c->bucket_mask = nbk - 1;
    c->blk = calloc(nb, sizeof *c->blk);
    c->tokens = malloc(nb * (size_t)c->bs * sizeof(int32_t));
    c->bucket = malloc(nbk * sizeof(int32_t));
    c->free_stack = malloc(nb * sizeof(int32_t));
    c->cp_src = malloc(nb * sizeof(int32_t));
    c->cp_dst = malloc(nb * sizeof(int32_t));
    c->layers = calloc((size_t)c->n_layer * (size_t)c->n_ranks, sizeof *c->layers);
    if (!c->blk || !c->tokens || !c->bucket || !c->free_stack || !c->cp_src || !c->cp_dst || !c->layers)
        return LLM_ERR_NOMEM;
    for (size_t i = 0; i < nbk; i++) c->bucket[i] = NIL;
    for (int i = 0; i < c->n_blocks; i++) {
        c->blk[i].hnext = c->blk[i].prev = c->blk[i].next = NIL;
        c->free_stack[i] = c->n_blocks - 1 - i; /* block 0 handed out first */
    }
    c->n_free = c->n_blocks;
    c->lru_head = c->lru_tail = NIL;
    return LLM_OK;
}

llm_status kv_cache_new(const kv_cache_config *cfg, llm_backend *b, int n_layer, int n_head_kv, int head_dim,
                        kv_cache **out, llm_error *err)
{
    *out = NULL;
    int bs = cfg->block_size > 0 ? cfg->block_size : KV_DEFAULT_BLOCK, kv_dim = n_head_kv * head_dim;
    llm_status st = cache_check(cfg, bs, n_head_kv, head_dim, err);
    if (st)
        return st;
    size_t per_block = kv_cache_block_bytes(cfg->type, bs, n_layer, kv_dim);
    size_t n = cfg->n_blocks > 0 ? (size_t)cfg->n_blocks : cfg->bytes / per_block;
    if (n < 1 || n > INT32_MAX / KV_MAX_BLOCK)
        return llm_errf(err, LLM_ERR_INVALID_ARG, "kv cache: %zu bytes hold %zu blocks of %zu bytes (need 1 to %d)",
                        cfg->bytes, n, per_block, INT32_MAX / KV_MAX_BLOCK);
    int n_ranks = cfg->n_ranks > 1 ? cfg->n_ranks : 1;
    if (n_ranks > LLM_MAX_RANKS || (n_ranks > 1 && !cfg->ranks))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "kv cache: %d ranks (at most %d, each with a backend)", n_ranks,
                        LLM_MAX_RANKS);
    kv_cache *c = calloc(1, sizeof *c);
    if (!c)
        return llm_errf(err, LLM_ERR_NOMEM, "kv cache: no memory");
    *c = (kv_cache){.n_ranks = n_ranks, .n_layer = n_layer, .bs = bs, .n_blocks = (int)n, .prefix_cache = cfg->prefix_cache};
    if (cache_alloc_meta(c)) {
        kv_cache_free(c);
        return llm_errf(err, LLM_ERR_NOMEM, "kv cache: no memory for %zu blocks", n);
    }
    quant_type qt = kv_qtype(cfg->type);
    size_t row = quant_row_bytes(qt, (size_t)kv_dim), half = (size_t)bs * row * n;
    for (int r = 0; r < n_ranks; r++) {
        c->b[r] = r ? cfg->ranks[r] : b;
        if (!(c->storage[r] = llm_backend_buffer_alloc(c->b[r], per_block * n))) {
            size_t avail = llm_backend_mem_available(c->b[r]);
            const char *name = c->b[r]->iface->name;
            kv_cache_free(c);
            return llm_errf(err, LLM_ERR_NOMEM,
                            "kv cache: cannot allocate %zu blocks (%zu MiB) on backend %s rank %d; %zu MiB available", n,
                            per_block * n >> 20, name, r, avail >> 20);
        }
        char *base = c->storage[r];
        for (int l = 0; l < n_layer; l++)
            c->layers[r * n_layer + l] = (llm_kv_layer){base + 2 * (size_t)l * half, base + (2 * (size_t)l + 1) * half,
                                                        qt, bs, kv_dim, row};
    }
    *out = c;
    return LLM_OK;
}

void kv_cache_free(kv_cache *c)
{
    if (!c)
        return;
    for (int r = 0; r < c->n_ranks; r++)
        if (c->b[r])
            llm_backend_buffer_free(c->b[r], c->storage[r]);
    free(c->blk);
    free(c->tokens);
    free(c->bucket);
    free(c->free_stack);
    free(c->cp_src);
    free(c->cp_dst);
    free(c->layers);
    free(c);
}

const llm_kv_layer *kv_cache_layers(const kv_cache *c) { return c->layers; }
int kv_cache_block_size(const kv_cache *c) { return c->bs; }
int kv_cache_n_blocks(const kv_cache *c) { return c->n_blocks; }
int kv_cache_available(const kv_cache *c) { return c->n_free + c->n_cached; }

void kv_cache_get_stats(const kv_cache *c, kv_cache_stats *out)
{
    *out = (kv_cache_stats){c->n_blocks, c->n_used, c->n_cached, c->n_free, c->evictions};
}

int kv_cache_copies(const kv_cache *c, const int32_t **src, const int32_t **dst)
{
    *src = c->cp_src;
    *dst = c->cp_dst;
    return c->n_copies;
}

void kv_cache_copies_done(kv_cache *c) { c->n_copies = 0; }

/* ---- sequences ------------------------------------------------------------------ */

void kv_seq_init(kv_seq *s) { memset(s, 0, sizeof *s); }

void kv_seq_release(kv_cache *c, kv_seq *s)
{
    /* last blocks first, so a prefix's tail is evicted before its head */
    for (int i = s->n_blocks - 1; i >= 0; i--) block_unref(c, s->blocks[i]);
    free(s->blocks);
    uint64_t salt = s->salt; /* the sequence's, for when it is matched again */
    kv_seq_init(s);
    s->salt = salt;
}

static int seq_grow(kv_seq *s, int n_blocks)
{
    if (n_blocks <= s->cap)
        return 0;
    int cap = s->cap ? s->cap : 8;
    while (cap < n_blocks) cap *= 2;
    int32_t *p = realloc(s->blocks, sizeof(int32_t) * (size_t)cap);
    if (!p)
        return -1;
    s->blocks = p;
    s->cap = cap;
    return 0;
}

int kv_seq_match(kv_cache *c, kv_seq *s, const int32_t *tokens, int n)
{
    LLM_ASSERT(s->n_blocks == 0);
    if (!c->prefix_cache || seq_grow(s, n / c->bs + 1))
        return 0;
    for (int k = 0; (k + 1) * c->bs <= n; k++) {
        const int32_t *t = tokens + (size_t)k * c->bs;
        uint64_t pk = parent_key(c, s, k);
        int32_t i = index_find(c, block_hash(pk, t, c->bs), pk, t);
        if (i == NIL)
            break;
        block_ref(c, i);
        s->blocks[s->n_blocks++] = i;
    }
    s->n_tokens = s->n_blocks * c->bs;
    s->n_hashed = s->n_blocks; /* a block count, like kv_seq_commit reads it */
    return s->n_tokens;
}

llm_status kv_seq_fork(kv_cache *c, kv_seq *dst, const kv_seq *src, int n_tokens)
{
    LLM_ASSERT(dst->n_blocks == 0 && n_tokens <= src->n_tokens);
    int nb = (n_tokens + c->bs - 1) / c->bs;
    if (seq_grow(dst, nb))
        return LLM_ERR_NOMEM;
    for (int i = 0; i < nb; i++) {
        block_ref(c, src->blocks[i]);
        dst->blocks[i] = src->blocks[i];
    }
    dst->n_blocks = nb;
    dst->n_tokens = n_tokens;
    dst->n_hashed = n_tokens / c->bs;
    dst->salt = src->salt;
    return LLM_OK;
}

/* The block that the next write lands in, when it already exists. */
static int32_t write_block(const kv_cache *c, const kv_seq *s)
{
    int k = s->n_tokens / c->bs;
    return k < s->n_blocks ? s->blocks[k] : NIL;
}

int kv_seq_blocks_needed(const kv_cache *c, const kv_seq *s, int n)
{
    int want = (s->n_tokens + n + c->bs - 1) / c->bs, extra = want > s->n_blocks ? want - s->n_blocks : 0;
    int32_t w = write_block(c, s);
    return extra + (n > 0 && w != NIL && c->blk[w].ref > 1);
}

llm_status kv_seq_reserve(kv_cache *c, kv_seq *s, int n)
{
    int need = kv_seq_blocks_needed(c, s, n), want = (s->n_tokens + n + c->bs - 1) / c->bs;
    if (need > kv_cache_available(c))
        return LLM_ERR_KV_FULL;
    if (seq_grow(s, want))
        return LLM_ERR_NOMEM;
    int32_t w = n > 0 ? write_block(c, s) : NIL;
    if (w != NIL && c->blk[w].ref > 1) { /* shared: write into a private copy */
        int32_t cp = block_alloc(c);
        c->cp_src[c->n_copies] = w;
        c->cp_dst[c->n_copies++] = cp;
        block_unref(c, w);
        s->blocks[s->n_tokens / c->bs] = cp;
    } else if (w != NIL && c->blk[w].hashed) { /* ours alone, but its content is about to change */
        index_remove(c, w);
    }
    while (s->n_blocks < want) s->blocks[s->n_blocks++] = block_alloc(c);
    return LLM_OK;
}

void kv_seq_commit(kv_cache *c, kv_seq *s, const int32_t *tokens, int n)
{
    LLM_ASSERT(s->n_tokens + n <= s->n_blocks * c->bs);
    s->n_tokens += n;
    for (; (s->n_hashed + 1) * c->bs <= s->n_tokens; s->n_hashed++) {
        int k = s->n_hashed;
        const int32_t *t = tokens + (size_t)k * c->bs;
        int32_t i = s->blocks[k];
        /* only under a known parent (else no match can reach it), and not
         * when a block with this key is known already (another sequence
         * computed the same prefix at the same time: it keeps the entry) */
        if (!c->prefix_cache || c->blk[i].hashed || (k > 0 && !c->blk[s->blocks[k - 1]].hashed))
            continue;
        uint64_t pk = parent_key(c, s, k), h = block_hash(pk, t, c->bs);
        if (index_find(c, h, pk, t) == NIL)
            index_add(c, i, h, pk, t);
    }
}
