/* kv_cache.h - the paged KV cache: a pool of fixed-size blocks holding
 * K/V rows for every layer (a second one for sliding-window layers, below),
 * per-sequence block tables, reference counts, automatic prefix caching and
 * copy-on-write.
 *
 * A full block is known by its own tokens and the block before it in its
 * sequence (physical id and generation; the first block by the sequence's
 * salt), so two sequences with the same prefix and salt find the same
 * blocks, and a match is exact (no hash is trusted). A block nobody references but whose content
 * is known stays cached until the pool needs it (least recently released
 * first). Blocks shared by several sequences (n > 1 completions forked from
 * one prompt) are copied before a sequence writes into one: the copies are
 * queued here and performed by the caller through the backend before the
 * forward pass that writes.
 *
 * Sliding-window layers (kv_cache_config.window and .local) keep their
 * K/V in a second pool: a sequence holds local blocks only for positions
 * some later row's window can still read (kv_seq.lblocks, -1 before
 * kv_seq.lfirst), so their memory per sequence is bounded by the window.
 * A cached local block is found as the twin of the global block of the
 * same positions and prefix; a prefix match keeps only as many blocks as
 * it also has the local blocks for (their windows' worth before the
 * match's end), and recomputes the rest.
 *
 * Storage comes from the backend (kv_cache_layers() hands out each layer's
 * K/V arrays in the backend.h layout); everything else here is plain host
 * bookkeeping, the same for every backend.
 *
 * Ownership: kv_cache_new returns a cache the caller frees with
 * kv_cache_free (NULL ok) before freeing the backend. A kv_seq is
 * caller-owned storage (kv_seq_init cannot fail); its blocks belong to the
 * cache and go back with kv_seq_release. Thread-safety: none; the engine
 * calls everything under its lock. */
#ifndef LLM_KV_CACHE_H
#define LLM_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "llm/backend.h"
#include "llm/status.h"

/* Element type of cached K/V. F16 is the default (zero value). */
typedef enum llm_kv_type { LLM_KV_F16 = 0, LLM_KV_F32 = 1, LLM_KV_Q8_0 = 2 } llm_kv_type;

/* "f16", "f32", "q8_0" -> type; LLM_ERR_INVALID_ARG naming the value. */
llm_status llm_kv_type_parse(const char *s, llm_kv_type *out, llm_error *err);
const char *llm_kv_type_name(llm_kv_type t);

#define KV_DEFAULT_BLOCK 16
#define KV_MAX_BLOCK 256

typedef struct kv_cache_config {
    int block_size;   /* tokens per block; 0: KV_DEFAULT_BLOCK */
    llm_kv_type type;
    int n_blocks;     /* > 0: exactly this many blocks */
    size_t bytes;     /* else as many blocks as fit in this budget */
    int prefix_cache; /* 1: keep full blocks for reuse by content */
    /* Tensor parallelism: n_ranks > 1 stores each block's K/V for rank r's
     * heads on ranks[r] (ranks[0] is kv_cache_new's b); n_head_kv is then
     * one rank's count and the byte budget is per rank. */
    llm_backend *const *ranks;
    int n_ranks;
    /* Sliding-window layers: with window > 0 and local[l] set for some
     * layer, those layers keep only the last `window` positions of each
     * sequence in a pool of n_local_blocks blocks (0, or more than the
     * global pool: as many as the global pool). */
    int window;
    const unsigned char *local; /* (n_layer) flags, or NULL; read by kv_cache_new only */
    int n_local_blocks;
} kv_cache_config;

typedef struct kv_cache kv_cache;

/* One sequence's block table. n_tokens positions hold K/V; its first
 * n_hashed full blocks have been offered to the prefix index. */
typedef struct kv_seq {
    int32_t *blocks; /* logical -> physical block */
    int32_t *lblocks; /* with a window: logical -> local block; -1 before lfirst (dropped); else NULL */
    int n_blocks, cap, lfirst;
    int n_tokens;
    int n_hashed;
    uint64_t salt;   /* set before kv_seq_match (0 after init): prefixes are shared only among sequences with the same
                      * salt (a tenant's own cache); at most 63 bits are used */
} kv_seq;

typedef struct kv_cache_stats {
    int n_blocks;   /* total */
    int used;       /* referenced by some sequence */
    int cached;     /* unreferenced, content kept for reuse (evictable) */
    int free;       /* unreferenced, no content: free + cached is what can be allocated */
    uint64_t evictions;
    int local_blocks, local_used, local_cached, local_free; /* the local pool (0 without one) */
    uint64_t local_evictions;
} kv_cache_stats;

/* Sizes and allocates the pool. Errors: LLM_ERR_INVALID_ARG (block size,
 * Q8_0 with head_dim not a multiple of 32, a budget under one block),
 * LLM_ERR_NOMEM (the backend could not allocate `bytes`). */
llm_status kv_cache_new(const kv_cache_config *cfg, llm_backend *b, int n_layer, int n_head_kv, int head_dim,
                        kv_cache **out, llm_error *err);
void kv_cache_free(kv_cache *c);

/* Local blocks that running sequences can hold at once: each at most its
 * window and one more position (the row before the next is kept for
 * forks) plus its rows of a step, with a partial block at each end, and
 * the rows of a step are at most max_rows in all. A local pool this size
 * is never what stops a step (but keeps few cached twins under load). */
size_t kv_cache_local_need(int window, int block_size, int max_seqs, int max_rows);

/* Bytes one block takes over all layers, K and V (for budgets). */
size_t kv_cache_block_bytes(llm_kv_type type, int block_size, int n_layer, int kv_dim);
/* Per-layer storage views (n_layer entries per rank, rank-major), valid for
 * the cache's life. */
const llm_kv_layer *kv_cache_layers(const kv_cache *c);
int kv_cache_block_size(const kv_cache *c);
/* Blocks of the global pool (every layer's, or the global layers' with a
 * local pool). */
int kv_cache_n_blocks(const kv_cache *c);
/* The window local layers keep; 0 when there is no local pool. */
int kv_cache_window(const kv_cache *c);
/* Global blocks an allocation could get now (free + evictable). */
int kv_cache_available(const kv_cache *c);
void kv_cache_get_stats(const kv_cache *c, kv_cache_stats *out);

/* The two pools: every layer's (or, with sliding-window layers, the global
 * layers') and the sliding-window layers'. */
typedef enum kv_pool_id { KV_POOL_GLOBAL = 0, KV_POOL_LOCAL = 1 } kv_pool_id;

/* Queued copy-on-write copies of one pool: *src and *dst get n block ids
 * (n 0: possibly NULL); the caller copies them in that pool's layers
 * (llm_forward_kv_copy) before the next forward pass, then calls
 * kv_cache_copies_done (for both pools). */
int kv_cache_copies(const kv_cache *c, kv_pool_id pool, const int32_t **src, const int32_t **dst);
void kv_cache_copies_done(kv_cache *c);

void kv_seq_init(kv_seq *s);
/* Drops every block reference (full blocks with known content stay cached)
 * and empties s (its salt stays); s may be reused. Frees s's table memory. */
void kv_seq_release(kv_cache *c, kv_seq *s);

/* For an empty s: takes every cached full block of the longest prefix of
 * tokens[0, n) found in the cache. Returns the tokens now in s (a multiple
 * of the block size; 0 when prefix caching is off or nothing matched, or
 * when the table cannot grow). */
int kv_seq_match(kv_cache *c, kv_seq *s, const int32_t *tokens, int n);

/* For an empty dst: shares the blocks holding positions [0, n_tokens) of
 * src (and its salt). A block both then write into is copied first (see
 * kv_seq_reserve). LLM_ERR_NOMEM, and LLM_ERR_KV_FULL when src already
 * dropped local blocks dst's windows read, change nothing. */
llm_status kv_seq_fork(kv_cache *c, kv_seq *dst, const kv_seq *src, int n_tokens);

/* Makes positions [n_tokens, n_tokens + n) writable: allocates blocks (in
 * both pools) and queues a copy when the block at n_tokens is shared.
 * LLM_ERR_KV_FULL (not enough blocks in either pool) and LLM_ERR_NOMEM
 * change nothing. */
llm_status kv_seq_reserve(kv_cache *c, kv_seq *s, int n);
/* How many global blocks kv_seq_reserve(c, s, n) would allocate. */
int kv_seq_blocks_needed(const kv_cache *c, const kv_seq *s, int n);

/* Forgets positions from n_tokens on (a failed step's partial input):
 * blocks past the one holding position n_tokens go back. Returns n_tokens,
 * or 0 when s had already dropped local blocks the windows of positions
 * from n_tokens on read: s is then emptied (its salt stays) and must be
 * computed again from position 0. */
int kv_seq_truncate(kv_cache *c, kv_seq *s, int n_tokens);

/* After a forward pass stored K/V for [n_tokens, n_tokens + n): advances
 * n_tokens, registers blocks that became full (with their local twins) and
 * drops local blocks no later row's window reads. tokens holds the
 * sequence's tokens from position 0. */
void kv_seq_commit(kv_cache *c, kv_seq *s, const int32_t *tokens, int n);

#endif
