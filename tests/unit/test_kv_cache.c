/* test_kv_cache.c - the paged KV block pool: allocation and release, prefix
 * matching by content, LRU eviction, all-or-nothing reservation, forks with
 * copy-on-write (bookkeeping and the backend's block copy). */
#include "testutil.h"

#include "llm/kv_cache.h"

enum { BS = 4, LAYERS = 2, HEADS = 2, HD = 32 };

typedef struct fx {
    llm_backend *b;
    kv_cache *c;
} fx;

/* A CPU backend and a cache of cfg (block size, type and pool size set here). */
static fx make_cfg(kv_cache_config cfg, int n_blocks)
{
    fx f;
    llm_error err = {0};
    assert_int_equal(llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 1, .force_scalar = 0, .kernels = NULL}, &f.b, &err), LLM_OK);
    cfg.block_size = BS;
    cfg.type = LLM_KV_F32;
    cfg.n_blocks = n_blocks;
    assert_int_equal(kv_cache_new(&cfg, f.b, LAYERS, HEADS, HD, &f.c, &err), LLM_OK);
    return f;
}

static fx make(int n_blocks, int prefix) { return make_cfg((kv_cache_config){.prefix_cache = prefix}, n_blocks); }

/* The first block a row at pos reads in a layer with this window. */
static int lfirst(int pos, int window) { return pos - window + 1 > 0 ? (pos - window + 1) / BS : 0; }

/* Layer 0 local with this window (layer 1 global), n_local local blocks. */
static fx make_window(int n_blocks, int n_local, int window)
{
    static const unsigned char local[LAYERS] = {1, 0};
    return make_cfg((kv_cache_config){.prefix_cache = 1, .window = window, .local = local, .n_local_blocks = n_local},
                    n_blocks);
}

static void done(fx *f)
{
    kv_cache_stats st;
    kv_cache_get_stats(f->c, &st);
    assert_int_equal(st.used, 0); /* every test gives every block back */
    assert_int_equal(st.local_used, 0);
    assert_int_equal(st.free + st.cached, st.n_blocks);
    assert_int_equal(st.local_free + st.local_cached, st.local_blocks);
    kv_cache_free(f->c);
    llm_backend_free(f->b);
}

/* Reserve and commit n tokens of toks (from the sequence's current end). */
static void feed(fx *f, kv_seq *s, const int32_t *toks, int n)
{
    assert_int_equal(kv_seq_reserve(f->c, s, n), LLM_OK);
    kv_seq_commit(f->c, s, toks, n);
}

static const int32_t T[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
                            21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static void test_alloc_release(void **st)
{
    (void)st;
    fx f = make(8, 1);
    kv_seq s;
    kv_seq_init(&s);
    feed(&f, &s, T, 10);
    assert_int_equal(s.n_blocks, 3);
    assert_int_equal(s.n_tokens, 10);
    assert_int_equal(s.n_hashed, 2);
    kv_cache_stats cs;
    kv_cache_get_stats(f.c, &cs);
    assert_int_equal(cs.used, 3);
    assert_int_equal(kv_cache_available(f.c), 5);
    kv_seq_release(f.c, &s);
    kv_cache_get_stats(f.c, &cs);
    assert_int_equal(cs.cached, 2); /* the two full blocks keep their content */
    assert_int_equal(cs.free, 6);
    done(&f);
}

static void test_prefix_match(void **st)
{
    (void)st;
    fx f = make(16, 1);
    kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    feed(&f, &a, T, 12);
    /* b shares 10 tokens, so two whole blocks; the caller asks for n-1 */
    int32_t tb[12];
    memcpy(tb, T, sizeof tb);
    tb[10] = 99;
    assert_int_equal(kv_seq_match(f.c, &b, tb, 11), 8);
    assert_int_equal(b.blocks[0], a.blocks[0]);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    feed(&f, &b, tb, 4); /* tokens from position 0, as the contract says */
    assert_true(b.blocks[2] != a.blocks[2]);
    /* a different first block matches nothing, even with the same later tokens */
    int32_t tc[12];
    memcpy(tc, T, sizeof tc);
    tc[0] = 42;
    assert_int_equal(kv_seq_match(f.c, &c, tc, 12), 0);
    kv_cache_stats cs;
    kv_cache_get_stats(f.c, &cs);
    assert_int_equal(cs.used, 4); /* a: 3, b: 1 of its own */
    kv_seq_release(f.c, &a);
    kv_seq_release(f.c, &b);
    kv_seq_release(f.c, &c);
    /* released blocks are still found */
    assert_int_equal(kv_seq_match(f.c, &c, T, 12), 12);
    kv_seq_release(f.c, &c);
    done(&f);
}

/* After a prefix hit, the blocks a sequence adds are registered as the
 * children of the matched ones (a multi-turn conversation's later turns
 * hit), and a block is only ever found at its own position: the chain is
 * counted in blocks. A far block's tokens at a near position must miss. */
static void test_match_then_grow(void **st)
{
    (void)st;
    fx f = make(32, 1);
    int32_t u[48];
    for (int i = 0; i < 48; i++) u[i] = 100 + i;
    kv_seq a, b, c, d;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    kv_seq_init(&d);
    feed(&f, &a, u, 8); /* turn 1: blocks 0 and 1 */
    kv_seq_release(f.c, &a);
    assert_int_equal(kv_seq_match(f.c, &b, u, 11), 8);
    assert_int_equal(b.n_hashed, 2);
    feed(&f, &b, u, 40 - 8); /* turn 2 grows to 40 tokens: 10 full blocks */
    assert_int_equal(b.n_hashed, 10);
    kv_seq_release(f.c, &b);
    assert_int_equal(kv_seq_match(f.c, &c, u, 41), 40); /* every block of turn 2 is found */
    kv_seq_release(f.c, &c);
    int32_t near[16];
    memcpy(near, u, 8 * sizeof *near);
    memcpy(near + 8, u + 32, 4 * sizeof *near); /* block 8's tokens at block 2's place */
    memcpy(near + 12, u + 36, 4 * sizeof *near);
    assert_int_equal(kv_seq_match(f.c, &d, near, 16), 8);
    kv_seq_release(f.c, &d);
    done(&f);
}

/* Prefixes are shared only within a salt. And a cached block whose
 * predecessor was rewritten in place (a fork's child writing into the
 * block it inherited) is not found after the new content: its key names
 * the predecessor's generation, and its K/V was computed after the old. */
static void test_salt_and_generation(void **st)
{
    (void)st;
    fx f = make(8, 1);
    kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    a.salt = 7;
    feed(&f, &a, T, 8); /* blocks 0, 1 under salt 7 */
    kv_seq_release(f.c, &a);
    assert_int_equal(kv_seq_match(f.c, &b, T, 9), 0); /* salt 0: another tenant's cache */
    kv_seq_release(f.c, &b);
    c.salt = 7;
    assert_int_equal(kv_seq_match(f.c, &c, T, 9), 8);
    kv_seq_release(f.c, &c);
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c); /* salt 0 again (release keeps it) */
    feed(&f, &a, T, 8);
    assert_int_equal(kv_seq_fork(f.c, &b, &a, 3), LLM_OK);
    kv_seq_release(f.c, &a); /* block 1 cached; block 0 b's alone */
    int32_t tb[8];
    memcpy(tb, T, sizeof tb);
    tb[3] = 77;
    feed(&f, &b, tb, 1); /* block 0 rewritten: tb[0..4) */
    kv_seq_release(f.c, &b);
    assert_int_equal(kv_seq_match(f.c, &c, tb, 8), 4); /* block 1's tokens follow, but not its K/V */
    kv_seq_release(f.c, &c);
    done(&f);
}

static void test_prefix_off(void **st)
{
    (void)st;
    fx f = make(8, 0);
    kv_seq a;
    kv_seq_init(&a);
    feed(&f, &a, T, 8);
    kv_seq_release(f.c, &a);
    assert_int_equal(kv_seq_match(f.c, &a, T, 8), 0);
    kv_cache_stats cs;
    kv_cache_get_stats(f.c, &cs);
    assert_int_equal(cs.cached, 0);
    done(&f);
}

static void test_lru_eviction(void **st)
{
    (void)st;
    fx f = make(4, 1);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    feed(&f, &a, T, 8);        /* blocks for T[0..4), T[4..8) */
    kv_seq_release(f.c, &a);   /* both cached: tail first in the LRU */
    feed(&f, &b, T + 10, 8);   /* takes the 2 free blocks */
    feed(&f, &b, T + 10, 4);   /* must evict: the tail of a's prefix goes first */
    kv_cache_stats cs;
    kv_cache_get_stats(f.c, &cs);
    assert_int_equal(cs.evictions, 1);
    kv_seq_release(f.c, &b);
    assert_int_equal(kv_seq_match(f.c, &a, T, 8), 4); /* the head block survived */
    kv_seq_release(f.c, &a);
    done(&f);
}

static void test_full_changes_nothing(void **st)
{
    (void)st;
    fx f = make(3, 1);
    kv_seq a;
    kv_seq_init(&a);
    feed(&f, &a, T, 6);
    kv_seq before = a;
    assert_int_equal(kv_seq_blocks_needed(f.c, &a, 7), 2);
    assert_int_equal(kv_seq_reserve(f.c, &a, 7), LLM_ERR_KV_FULL);
    assert_int_equal(a.n_blocks, before.n_blocks);
    assert_int_equal(a.n_tokens, 6);
    assert_int_equal(kv_cache_available(f.c), 1);
    assert_int_equal(kv_seq_reserve(f.c, &a, 6), LLM_OK);
    kv_seq_release(f.c, &a);
    done(&f);
}

static void test_fork_cow(void **st)
{
    (void)st;
    fx f = make(8, 1);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    feed(&f, &a, T, 7); /* block 1 holds positions 4..6, partial */
    const llm_kv_layer *L = kv_cache_layers(f.c);
    size_t bb = (size_t)BS * L[0].row_bytes;
    for (int l = 0; l < LAYERS; l++) /* mark a's block 1 in every layer */
        for (size_t i = 0; i < bb / 4; i++) ((float *)L[l].k)[(size_t)a.blocks[1] * bb / 4 + i] = (float)(l + 1);
    assert_int_equal(kv_seq_fork(f.c, &b, &a, 6), LLM_OK);
    assert_int_equal(b.n_tokens, 6);
    assert_int_equal(b.blocks[1], a.blocks[1]);
    const int32_t *src, *dst;
    assert_int_equal(kv_cache_copies(f.c, KV_POOL_GLOBAL, &src, &dst), 0);
    feed(&f, &b, T, 1); /* writes position 6 of a shared block: copy first */
    assert_int_equal(kv_cache_copies(f.c, KV_POOL_GLOBAL, &src, &dst), 1);
    assert_int_equal(src[0], a.blocks[1]);
    assert_int_equal(dst[0], b.blocks[1]);
    assert_true(a.blocks[1] != b.blocks[1]);
    assert_int_equal(b.blocks[0], a.blocks[0]); /* the full block stays shared */
    llm_backend_kv_copy(f.b, L, LAYERS, src, dst, 1);
    kv_cache_copies_done(f.c);
    for (int l = 0; l < LAYERS; l++)
        assert_true(((float *)L[l].k)[(size_t)b.blocks[1] * bb / 4 + 5] == (float)(l + 1));
    feed(&f, &a, T + 7, 1); /* a's block is its own again: no copy */
    assert_int_equal(kv_cache_copies(f.c, KV_POOL_GLOBAL, &src, &dst), 0);
    kv_seq_release(f.c, &a);
    kv_seq_release(f.c, &b);
    done(&f);
}

/* A child forked from a finished parent writes into a block the index
 * knows by the parent's content: the index entry must go. */
static void test_fork_unindexes(void **st)
{
    (void)st;
    fx f = make(8, 1);
    kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    feed(&f, &a, T, 8);
    assert_int_equal(kv_seq_fork(f.c, &b, &a, 7), LLM_OK);
    kv_seq_release(f.c, &a);
    int32_t tb[8];
    memcpy(tb, T, sizeof tb);
    tb[7] = 77;
    feed(&f, &b, tb, 1); /* b's position 7 now differs from T[7] */
    const int32_t *src, *dst;
    assert_int_equal(kv_cache_copies(f.c, KV_POOL_GLOBAL, &src, &dst), 0);
    assert_int_equal(kv_seq_match(f.c, &c, T, 8), 4); /* only the untouched block */
    kv_seq_release(f.c, &b);
    kv_seq_release(f.c, &c);
    done(&f);
}

static void test_config_errors(void **st)
{
    (void)st;
    llm_backend *b;
    llm_error err = {0};
    kv_cache *c = NULL;
    assert_int_equal(llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 1, .force_scalar = 0, .kernels = NULL}, &b, &err), LLM_OK);
    kv_cache_config q8 = {.block_size = 16, .type = LLM_KV_Q8_0, .n_blocks = 4, .prefix_cache = 1};
    assert_int_equal(kv_cache_new(&q8, b, 2, 4, 8, &c, &err), LLM_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "multiple of 32"));
    kv_cache_config tiny = {.block_size = 16, .type = LLM_KV_F16, .bytes = 100, .prefix_cache = 1};
    assert_int_equal(kv_cache_new(&tiny, b, 2, 4, 32, &c, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "100 bytes"));
    kv_cache_config bad_bs = {.block_size = 1000, .type = LLM_KV_F16, .n_blocks = 4, .prefix_cache = 1};
    assert_int_equal(kv_cache_new(&bad_bs, b, 2, 4, 32, &c, &err), LLM_ERR_INVALID_ARG);
    llm_kv_type t;
    assert_int_equal(llm_kv_type_parse("q8_0", &t, &err), LLM_OK);
    assert_int_equal(t, LLM_KV_Q8_0);
    assert_int_equal(llm_kv_type_parse("fp8", &t, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "'fp8'"));
    assert_null(c);
    llm_backend_free(b);
}

/* What a physical block holds, as the test tracks it: the position of
 * its first slot and, per slot, the sequence's whole prefix up to it (a
 * block's K/V depends on every earlier token). */
enum { CHURN_BLOCKS = 64, CHURN_LEN = 64 };
typedef struct shadow {
    int pos0;
    int32_t prefix[CHURN_LEN];
    int filled; /* slots written */
} shadow;

static void shadow_write(shadow *sh, const kv_seq *s, const int32_t *toks, int n)
{
    for (int q = s->n_tokens; q < s->n_tokens + n; q++) {
        shadow *b = &sh[s->blocks[q / BS]];
        b->pos0 = q / BS * BS;
        memcpy(b->prefix, toks, sizeof(int32_t) * (size_t)(q + 1));
        b->filled = q % BS + 1;
    }
}

/* Every block a match hands out holds K/V computed for exactly this prefix
 * at exactly these positions. */
static void shadow_check_match(const shadow *sh, const kv_seq *s, const int32_t *toks)
{
    for (int k = 0; k < s->n_blocks; k++) {
        const shadow *b = &sh[s->blocks[k]];
        assert_int_equal(b->pos0, k * BS);
        assert_int_equal(b->filled, BS);
        assert_memory_equal(b->prefix, toks, sizeof(int32_t) * (size_t)((k + 1) * BS));
    }
}

/* A prompt for the churn: one of three bases, often with one token
 * changed, sometimes with a far stretch of the base moved to a near block
 * boundary (the same tokens at another position must not hit). */
static void churn_tokens(int32_t *t, int32_t base[3][CHURN_LEN], uint64_t *seed)
{
    memcpy(t, base[test_rng(seed) % 3], sizeof(int32_t) * CHURN_LEN);
    int r = (int)(test_rng(seed) % 4), at = (int)(test_rng(seed) % CHURN_LEN);
    if (r == 1)
        t[at] = (int32_t)(test_rng(seed) % 3);
    if (r == 2) { /* from block k on, the tokens of block k + shift */
        int k = 1 + (int)(test_rng(seed) % 4), shift = 1 + (int)(test_rng(seed) % 8);
        memmove(t + k * BS, t + (k + shift) * BS, sizeof(int32_t) * (size_t)(CHURN_LEN - (k + shift) * BS));
    }
}

/* Random churn: forks, matches, reservations, copies and releases keep
 * every reference count consistent (used returns to 0, nothing leaks), and
 * a match never returns a block whose content is another prefix's or
 * another position's. Sequences grow far past BS * BS tokens. */
static void test_random_churn(void **st)
{
    (void)st;
    fx f = make(CHURN_BLOCKS, 1);
    enum { N = 6 };
    kv_seq s[N];
    int32_t toks[N][CHURN_LEN];
    static shadow sh[CHURN_BLOCKS];
    int32_t base[3][CHURN_LEN];
    int live[N] = {0};
    memset(sh, 0, sizeof sh);
    uint64_t seed = 7;
    int hits = 0;
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < CHURN_LEN; k++) base[b][k] = (int32_t)(test_rng(&seed) % 3);
    for (int i = 0; i < N; i++) kv_seq_init(&s[i]);
    for (int step = 0; step < 20000; step++) {
        int i = (int)(test_rng(&seed) % N), op = (int)(test_rng(&seed) % 10);
        if (op == 0 || s[i].n_tokens > 56) {
            kv_seq_release(f.c, &s[i]);
            live[i] = 0;
        } else if (!live[i]) {
            live[i] = 1; /* a miss leaves it empty: it still grows from here */
            int j = (int)(test_rng(&seed) % N);
            churn_tokens(toks[i], base, &seed);
            if (op < 4 && s[j].n_tokens > 1 && j != i) {
                memcpy(toks[i], toks[j], sizeof toks[i]);
                assert_int_equal(kv_seq_fork(f.c, &s[i], &s[j], s[j].n_tokens - 1), LLM_OK);
            } else {
                int n = 1 + (int)(test_rng(&seed) % 56);
                hits += kv_seq_match(f.c, &s[i], toks[i], n) > 0;
                shadow_check_match(sh, &s[i], toks[i]);
            }
        } else {
            int n = 1 + (int)(test_rng(&seed) % 6);
            if (kv_seq_reserve(f.c, &s[i], n) == LLM_OK) {
                const int32_t *src, *dst;
                int nc = kv_cache_copies(f.c, KV_POOL_GLOBAL, &src, &dst);
                for (int k = 0; k < nc; k++) sh[dst[k]] = sh[src[k]];
                kv_cache_copies_done(f.c);
                shadow_write(sh, &s[i], toks[i], n);
                kv_seq_commit(f.c, &s[i], toks[i], n);
            }
        }
    }
    print_message("churn: %d matches hit\n", hits);
    assert_true(hits > 100); /* the check saw real reuse */
    for (int i = 0; i < N; i++) kv_seq_release(f.c, &s[i]);
    done(&f);
}

/* Sliding-window layers: a long sequence holds only its window's local
 * blocks; the local layer's storage is its own (not the global layer's);
 * a match reuses local blocks as twins, and keeps fewer blocks when the
 * twins its windows need are gone. */
static void test_window_bounded(void **st)
{
    (void)st;
    fx f = make_window(16, 6, 6); /* window 6: the next row reads at most 2 earlier blocks */
    const llm_kv_layer *L = kv_cache_layers(f.c);
    assert_true(L[0].k != L[1].k && L[0].k != L[1].v);
    assert_int_equal(kv_cache_window(f.c), 6);
    kv_seq a, b;
    kv_seq_init(&a);
    kv_seq_init(&b);
    for (int i = 0; i < 32; i++) { /* 32 tokens: 8 global blocks, never more than 3 local ones */
        feed(&f, &a, T, 1);
        kv_cache_stats cs;
        kv_cache_get_stats(f.c, &cs);
        assert_true(cs.local_used <= 3);
        assert_int_equal(a.lfirst, lfirst(a.n_tokens - 1, 6));
        for (int k = 0; k < a.lfirst; k++) assert_int_equal(a.lblocks[k], -1);
    }
    kv_seq_release(f.c, &a);
    /* the whole prompt is found: the blocks before its end have their twins */
    assert_int_equal(kv_seq_match(f.c, &b, T, 32), 32);
    assert_int_equal(b.lfirst, 6);
    assert_true(b.lblocks[6] >= 0 && b.lblocks[7] >= 0);
    kv_seq_release(f.c, &b);
    /* but not a shorter prompt whose window reaches blocks dropped long ago
     * (evicted: 6 local blocks, the oldest reused first) */
    kv_seq c;
    kv_seq_init(&c);
    int32_t u[40];
    for (int i = 0; i < 40; i++) u[i] = 500 + i;
    feed(&f, &c, u, 20); /* other content takes local blocks over */
    kv_seq_release(f.c, &c);
    assert_int_equal(kv_seq_match(f.c, &b, T, 16), 0);
    kv_seq_release(f.c, &b);
    done(&f);
}

/* A match whose twins were evicted keeps less and recomputes; the
 * recomputed blocks take the place of the twinless entries, so the next
 * match of the same prefix hits in full again. */
static void test_window_recompute_supersedes(void **st)
{
    (void)st;
    fx f = make_window(32, 4, 4); /* 4 local blocks: evicted fast */
    kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    feed(&f, &a, T, 16);
    kv_seq_release(f.c, &a);
    int32_t u[16];
    for (int i = 0; i < 16; i++) u[i] = 700 + i;
    feed(&f, &b, u, 16); /* other content takes every local block over */
    kv_seq_release(f.c, &b);
    assert_int_equal(kv_seq_match(f.c, &c, T, 16), 0); /* no twins left: recompute */
    feed(&f, &c, T, 16);
    kv_seq_release(f.c, &c);
    assert_int_equal(kv_seq_match(f.c, &c, T, 16), 16); /* the recomputed chain is the index's now */
    kv_seq_release(f.c, &c);
    done(&f);
}

/* Forgetting a failed step's positions: blocks past the kept position go
 * back; with a window, a position whose window's blocks were dropped
 * empties the sequence instead (its K/V cannot be read again). */
static void test_truncate(void **st)
{
    (void)st;
    fx f = make_window(16, 16, 4);
    kv_seq a;
    kv_seq_init(&a);
    feed(&f, &a, T, 20); /* lfirst 4: the row at 19 reads from position 16 */
    assert_int_equal(a.lfirst, 4);
    assert_int_equal(kv_seq_truncate(f.c, &a, 19), 19);
    assert_int_equal(a.n_blocks, 5);
    assert_int_equal(kv_seq_truncate(f.c, &a, 18), 0); /* 18's window starts at 15: block 3, dropped */
    assert_int_equal(a.n_blocks, 0);
    assert_int_equal(a.n_tokens, 0);
    feed(&f, &a, T, 12);
    kv_seq_release(f.c, &a);
    done(&f);
    fx g = make(16, 1);
    kv_seq b;
    kv_seq_init(&b);
    feed(&g, &b, T, 14);
    assert_int_equal(kv_seq_truncate(g.c, &b, 5), 5); /* blocks 2 and 3 go back, block 1 (positions 4-7) stays */
    assert_int_equal(b.n_blocks, 2);
    assert_int_equal(b.n_hashed, 1);
    kv_cache_stats cs;
    kv_cache_get_stats(g.c, &cs);
    assert_int_equal(cs.used, 2);
    feed(&g, &b, T, 3); /* the tokens from position 0, as commit reads them */
    kv_seq_release(g.c, &b);
    done(&g);
}

/* A fork needs its parent to still hold the local blocks its windows read. */
static void test_window_fork(void **st)
{
    (void)st;
    fx f = make_window(16, 16, 4);
    kv_seq a, b, c;
    kv_seq_init(&a);
    kv_seq_init(&b);
    kv_seq_init(&c);
    feed(&f, &a, T, 7);
    assert_int_equal(kv_seq_fork(f.c, &b, &a, 6), LLM_OK); /* reads positions 3..6: a still has blocks 0 and 1 */
    assert_int_equal(b.lblocks[1], a.lblocks[1]);
    feed(&f, &b, T, 1); /* position 6 in the shared partial block: copied in both pools */
    const int32_t *src, *dst;
    assert_int_equal(kv_cache_copies(f.c, KV_POOL_GLOBAL, &src, &dst), 1);
    assert_int_equal(kv_cache_copies(f.c, KV_POOL_LOCAL, &src, &dst), 1);
    assert_int_equal(src[0], a.lblocks[1]);
    assert_int_equal(dst[0], b.lblocks[1]);
    kv_cache_copies_done(f.c);
    feed(&f, &a, T + 7, 9); /* a moves on to 16 tokens and drops blocks 0..2 */
    assert_int_equal(kv_seq_fork(f.c, &c, &a, 6), LLM_ERR_KV_FULL);
    assert_int_equal(c.n_blocks, 0);
    kv_seq_release(f.c, &a);
    kv_seq_release(f.c, &b);
    done(&f);
}

/* Blocks of a sequence's table as the test tracks their content. */
static void shadow_table_write(shadow *sh, const kv_seq *s, const int32_t *table, const int32_t *toks, int n)
{
    for (int q = s->n_tokens; q < s->n_tokens + n; q++) {
        shadow *b = &sh[table[q / BS]];
        b->pos0 = q / BS * BS;
        memcpy(b->prefix, toks, sizeof(int32_t) * (size_t)(q + 1));
        b->filled = q % BS + 1;
    }
}

/* Every local block s holds is the one for its prefix and positions (up
 * to what s has written), it holds every block its next row reads, and
 * none before what the row before that read. */
static void shadow_check_local(const shadow *sh, const kv_seq *s, const int32_t *toks, int window)
{
    int first = s->lfirst;
    assert_true(first <= lfirst(s->n_tokens, window) && first >= lfirst(s->n_tokens - 1, window));
    for (int k = 0; k < s->n_blocks; k++) {
        if (k < first) {
            assert_int_equal(s->lblocks[k], -1);
            continue;
        }
        const shadow *b = &sh[s->lblocks[k]];
        int have = s->n_tokens - k * BS < BS ? s->n_tokens - k * BS : BS;
        if (have <= 0)
            continue;
        assert_int_equal(b->pos0, k * BS);
        assert_true(b->filled >= have);
        assert_memory_equal(b->prefix, toks, sizeof(int32_t) * (size_t)(k * BS + have));
    }
}

/* The churn with a window: both pools' blocks hold the right content for
 * every sequence after every operation, the local pool never holds more
 * than the windows need, and references return to zero. */
static void test_window_churn(void **st)
{
    (void)st;
    enum { N = 6, W = 7, LOCAL_BLOCKS = N * ((W + BS - 1) / BS + 4) };
    fx f = make_window(CHURN_BLOCKS, LOCAL_BLOCKS, W);
    kv_seq s[N];
    int32_t toks[N][CHURN_LEN];
    static shadow sh[CHURN_BLOCKS], lsh[LOCAL_BLOCKS];
    int32_t base[3][CHURN_LEN];
    int live[N] = {0};
    memset(sh, 0, sizeof sh);
    memset(lsh, 0, sizeof lsh);
    uint64_t seed = 11;
    int hits = 0, forks = 0, full = 0;
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < CHURN_LEN; k++) base[b][k] = (int32_t)(test_rng(&seed) % 3);
    for (int i = 0; i < N; i++) kv_seq_init(&s[i]);
    for (int step = 0; step < 20000; step++) {
        int i = (int)(test_rng(&seed) % N), op = (int)(test_rng(&seed) % 10);
        if (op == 0 || s[i].n_tokens > 56) {
            kv_seq_release(f.c, &s[i]);
            live[i] = 0;
        } else if (!live[i]) {
            live[i] = 1;
            int j = (int)(test_rng(&seed) % N);
            churn_tokens(toks[i], base, &seed);
            if (op < 4 && s[j].n_tokens > 1 && j != i) {
                memcpy(toks[i], toks[j], sizeof toks[i]);
                forks += kv_seq_fork(f.c, &s[i], &s[j], s[j].n_tokens - 1) == LLM_OK;
            } else {
                int n = 1 + (int)(test_rng(&seed) % 56);
                hits += kv_seq_match(f.c, &s[i], toks[i], n) > 0;
                shadow_check_match(sh, &s[i], toks[i]);
            }
            shadow_check_local(lsh, &s[i], toks[i], W);
        } else {
            int n = 1 + (int)(test_rng(&seed) % 6);
            llm_status rs = kv_seq_reserve(f.c, &s[i], n);
            full += rs == LLM_ERR_KV_FULL;
            if (rs == LLM_OK) {
                const int32_t *src, *dst;
                int nc = kv_cache_copies(f.c, KV_POOL_GLOBAL, &src, &dst);
                for (int k = 0; k < nc; k++) sh[dst[k]] = sh[src[k]];
                nc = kv_cache_copies(f.c, KV_POOL_LOCAL, &src, &dst);
                for (int k = 0; k < nc; k++) lsh[dst[k]] = lsh[src[k]];
                kv_cache_copies_done(f.c);
                shadow_table_write(sh, &s[i], s[i].blocks, toks[i], n);
                shadow_table_write(lsh, &s[i], s[i].lblocks, toks[i], n);
                kv_seq_commit(f.c, &s[i], toks[i], n);
                shadow_check_local(lsh, &s[i], toks[i], W);
            }
        }
        /* each sequence holds at most its window, the row before, and one
         * reservation of up to 6 tokens, with a partial block at each end
         * (without dropping, a 56-token sequence alone holds 14) */
        kv_cache_stats cs;
        kv_cache_get_stats(f.c, &cs);
        assert_true(cs.local_used <= N * ((W + 6 + BS - 1) / BS + 1));
    }
    print_message("window churn: %d matches hit, %d forks, %d reservations refused\n", hits, forks, full);
    assert_true(hits > 100 && forks > 100);
    for (int i = 0; i < N; i++) kv_seq_release(f.c, &s[i]);
    done(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_release), cmocka_unit_test(test_prefix_match),
        cmocka_unit_test(test_match_then_grow),
        cmocka_unit_test(test_salt_and_generation),
        cmocka_unit_test(test_prefix_off),    cmocka_unit_test(test_lru_eviction),
        cmocka_unit_test(test_full_changes_nothing), cmocka_unit_test(test_fork_cow),
        cmocka_unit_test(test_fork_unindexes), cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_random_churn),  cmocka_unit_test(test_window_bounded),
        cmocka_unit_test(test_window_fork),   cmocka_unit_test(test_window_churn),
        cmocka_unit_test(test_window_recompute_supersedes), cmocka_unit_test(test_truncate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
