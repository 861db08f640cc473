/* pk_layout.h - the packed weight layout that the tile kernels read (the
 * avx512 set's 512-bit tiles, the avx2 and avxvnni sets' 256-bit ones),
 * and the activation format they read. Internal to the CPU backend.
 *
 * Rows go in groups of PK_ROWS (16); per group and block of 32 columns
 * the quants are stored as 64-byte vectors of 16 rows x 4 bytes (row r's
 * 4 bytes at 4r), so one 512-bit load, or two 256-bit ones (rows 0-7,
 * rows 8-15), gives 4 consecutive columns of every row:
 *   PK_Q8:  8 vectors, vector j = columns 4j..4j+3, each weight + 128;
 *   PK_Q4, PK_Q41, PK_Q4K: 4 vectors, vector j holding in each row's 4
 *           bytes columns 4j.. (low nibbles) and 16 + 4j.. (high
 *           nibbles), unsigned (Q4_0: the file's bytes 4j..4j+3, the
 *           weight + 8);
 *   PK_Q5, PK_Q51, PK_Q5K: those nibbles of the low 4 bits, then 8 x 64
 *           fifth bits, bit 4r + k of mask j for row r, column 4j + k;
 *   PK_Q6K: Q4_K's 4 vectors of the low 4 bits, then 2 vectors of the top
 *           two: bits 2 (j % 4) of byte 4r + k of vector j / 4 for row r,
 *           column 4j + k (so a vector serves 4 steps, one shift each);
 *   PK_Q2K: only such 2 vectors, of the 2-bit quants;
 *   PK_Q3K: those 2 vectors of the low two bits, then 8 x 64 third bits
 *           laid out as the fifth bits above.
 * Q8_0, Q4_0 and Q5_0 blocks start with their 16 rows' f16 scales; w . x
 * = q . x - offset * sum(x), offset 128, 8 or 16. Q4_1 and Q5_1 blocks
 * start with 16 f16 d, then 16 f16 m; w = d q + m. A Q4_K super-block (256
 * columns) starts with a header - 16 f16 d, 16 f16 dmin, then the 6-bit
 * scales and mins as bytes, 16 rows per sub-block - and holds its 8
 * blocks; w = d sc q - dmin m (Q5_K: the same header). A Q6_K super-block starts with 16 f16 d
 * and the signed 8-bit scales of its 16 sub-blocks of 16 columns, 16 rows
 * each; w = d sc (q - 32). A Q3_K super-block has Q6_K's header (its
 * scales -32..31); w = d sc (q - 4). A Q2_K super-block starts with 16 f16
 * d, 16 f16 dmin and the file's scale byte of each of its 16 sub-blocks, 16
 * rows each (scale low nibble, min high); w = d sc q - dmin m. The same
 * bytes as the file (Q4_K 2.8% more, Q3_K 3.5%), so a decode step reads
 * about as much. Rows past the weight's are zeros.
 *
 * Activations (pk_layout_act, kind 4): per row n signed bytes, then n/32
 * float scales, then n/32 int32 negated sums of each block's first 16
 * quants and n/32 of its last 16 (the tiles' offset corrections start from
 * them: Q6_K's offset applies per 16 columns); in 8-row tiles as cpu_tile8
 * lays out.
 * The inline accessors are pure; pk_layout_pack writes only its groups,
 * so threads may pack disjoint group ranges of one copy at once. */
#ifndef LLM_CPU_PK_LAYOUT_H
#define LLM_CPU_PK_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"
#include "llm/status.h"
#include "quant_impl.h"

#define PK_ROWS 16 /* rows per packed group */

enum { PK_Q8, PK_Q4, PK_Q4K, PK_Q5, PK_Q6K, PK_Q5K, PK_Q41, PK_Q51, PK_Q2K, PK_Q3K };

/* Kinds whose 5th bits follow the nibbles; kinds with Q4_K's header
 * (6-bit scales and mins: w = d sc q - dmin m); kinds whose weights add a
 * per-block min instead of taking an offset from the quants. */
static inline int pk_layout_fifth(int kind) { return kind == PK_Q5 || kind == PK_Q5K || kind == PK_Q51; }
static inline int pk_layout_k4(int kind) { return kind == PK_Q4K || kind == PK_Q5K; }
static inline int pk_layout_mins(int kind) { return pk_layout_k4(kind) || kind == PK_Q41 || kind == PK_Q51 || kind == PK_Q2K; }
/* Kinds of 2-bit planes (no nibbles). */
static inline int pk_layout_2bit(int kind) { return kind == PK_Q2K || kind == PK_Q3K; }
/* Kinds in 256-column super-blocks with a header each. */
static inline int pk_layout_kquant(int kind) { return pk_layout_k4(kind) || kind == PK_Q6K || pk_layout_2bit(kind); }
/* Kinds whose scales (and offsets or mins) are per 16 columns: two parts
 * of a block, each its own integer sum. */
static inline int pk_layout_halves(int kind) { return kind == PK_Q6K || pk_layout_2bit(kind); }

/* Bytes before the quants of a Q8_0, Q4_0, Q5_0, Q4_1 or Q5_1 block: the
 * 16 rows' d (and m). */
static inline int pk_layout_head(int kind) { return PK_ROWS * 2 * (kind == PK_Q41 || kind == PK_Q51 ? 2 : 1); }

#define PK_Q4K_HEAD (PK_ROWS * 2 * 2 + PK_ROWS * 8 * 2) /* d, dmin; sc, m bytes */
#define PK_Q4K_SUPER (PK_Q4K_HEAD + 8 * PK_ROWS * 16)   /* header + 8 blocks of nibbles */
#define PK_Q5K_BLOCK (PK_ROWS * 16 + PK_ROWS * 4)        /* nibbles, fifth bits */
#define PK_Q5K_SUPER (PK_Q4K_HEAD + 8 * PK_Q5K_BLOCK)
#define PK_Q6K_HEAD (PK_ROWS * 2 + 16 * PK_ROWS)         /* d; 16 sub-blocks' scales */
#define PK_Q6K_BLOCK (PK_ROWS * 16 + PK_ROWS * 8)        /* nibbles, top bits */
#define PK_Q6K_SUPER (PK_Q6K_HEAD + 8 * PK_Q6K_BLOCK)
#define PK_Q2K_HEAD (PK_ROWS * 2 * 2 + 16 * PK_ROWS)    /* d, dmin; 16 sub-blocks' scale bytes */
#define PK_Q2K_BLOCK (PK_ROWS * 8)                       /* 2-bit planes */
#define PK_Q2K_SUPER (PK_Q2K_HEAD + 8 * PK_Q2K_BLOCK)
#define PK_Q3K_BLOCK (PK_ROWS * 8 + PK_ROWS * 4)         /* 2-bit planes, third bits */
#define PK_Q3K_SUPER (PK_Q6K_HEAD + 8 * PK_Q3K_BLOCK)

/* Bytes of one block of a group (the K-quants: without their headers,
 * which are per 256 columns). */
static inline int pk_layout_block_bytes(int kind)
{
    if (kind == PK_Q4K)
        return PK_ROWS * 16;
    if (kind == PK_Q6K || kind == PK_Q5K)
        return kind == PK_Q6K ? PK_Q6K_BLOCK : PK_Q5K_BLOCK;
    if (pk_layout_2bit(kind))
        return kind == PK_Q2K ? PK_Q2K_BLOCK : PK_Q3K_BLOCK;
    return pk_layout_head(kind) + PK_ROWS * (kind == PK_Q8 ? 32 : 16) + (pk_layout_fifth(kind) ? PK_ROWS * 4 : 0);
}

/* Bytes of a K-quant kind's super-block (256 columns) of a group. */
static inline size_t pk_layout_super(int kind)
{
    return kind == PK_Q4K ? PK_Q4K_SUPER : kind == PK_Q5K ? PK_Q5K_SUPER : kind == PK_Q2K ? PK_Q2K_SUPER
         : kind == PK_Q3K ? PK_Q3K_SUPER : PK_Q6K_SUPER;
}

/* The header of the super-block holding block b (K-quants), and in it:
 * the 16 rows' f16 d (then Q4_K/Q5_K's 16 dmin), the 6-bit scales and mins
 * of sub-block j (Q4_K/Q5_K), the int8 scales of 16-column sub-block s
 * (Q6_K), 16 bytes each. */
static inline const uint8_t *pk_layout_super_at(int kind, const uint8_t *g, int b)
{
    return g + (size_t)(b / 8) * pk_layout_super(kind);
}
static inline size_t pk_layout_k4_sc(int j) { return 64 + PK_ROWS * (size_t)j; }
static inline size_t pk_layout_k4_min(int j) { return 64 + PK_ROWS * 8 + PK_ROWS * (size_t)j; }
static inline size_t pk_layout_q6k_sc(int s) { return PK_ROWS * 2 + PK_ROWS * (size_t)s; } /* Q3_K's too */
static inline size_t pk_layout_q2k_sc(int s) { return PK_ROWS * 4 + PK_ROWS * (size_t)s; }

/* log2 of the offset the unsigned quants of a kind carry (w = q - offset:
 * Q8_0 128, Q4_0 8, Q5_0 16, Q6_K 32 and Q3_K 4 per 16 columns); -1 for
 * the kinds with mins, whose quants carry none. */
static inline int pk_layout_offset_log2(int kind)
{
    return kind == PK_Q8 ? 7 : kind == PK_Q4 ? 3 : kind == PK_Q5 ? 4 : kind == PK_Q6K ? 5 : kind == PK_Q3K ? 2 : -1;
}

/* Bytes of one group over cols columns. */
static inline size_t pk_layout_group_bytes(int kind, int64_t cols)
{
    if (pk_layout_kquant(kind))
        return (size_t)(cols / QK_K) * pk_layout_super(kind);
    return (size_t)(cols / QK8_0) * (size_t)pk_layout_block_bytes(kind);
}

static inline size_t pk_layout_groups(int64_t rows) { return (size_t)((rows + PK_ROWS - 1) / PK_ROWS); }

/* The quant vectors of block b (32 columns) of the group at g; the
 * block's pk_layout_head bytes (not the K-quants) are just before them. */
static inline const uint8_t *pk_layout_qs(int kind, const uint8_t *g, int b)
{
    if (kind == PK_Q4K)
        return g + (size_t)(b / 8) * PK_Q4K_SUPER + PK_Q4K_HEAD + (size_t)(b % 8) * PK_ROWS * 16;
    if (kind == PK_Q5K)
        return g + (size_t)(b / 8) * PK_Q5K_SUPER + PK_Q4K_HEAD + (size_t)(b % 8) * PK_Q5K_BLOCK;
    if (kind == PK_Q6K)
        return g + (size_t)(b / 8) * PK_Q6K_SUPER + PK_Q6K_HEAD + (size_t)(b % 8) * PK_Q6K_BLOCK;
    if (kind == PK_Q2K)
        return g + (size_t)(b / 8) * PK_Q2K_SUPER + PK_Q2K_HEAD + (size_t)(b % 8) * PK_Q2K_BLOCK;
    if (kind == PK_Q3K)
        return g + (size_t)(b / 8) * PK_Q3K_SUPER + PK_Q6K_HEAD + (size_t)(b % 8) * PK_Q3K_BLOCK;
    return g + (size_t)b * (size_t)pk_layout_block_bytes(kind) + pk_layout_head(kind);
}

/* How far ahead (bytes) a one-token tile asks for its weights. Alone, a
 * token's loads are the step's whole work, and the hardware's stream
 * prefetch left them waiting on memory; the distance must cover the
 * memory's latency times one stream's rate (~120 ns x 40 GB/s at one
 * thread on a Zen 5 EPYC). Measured there (llm-bench -p 16 -n 64, one
 * thread, tinyllama-1.1b seeded Q4_K_M-style file, 3 alternating runs,
 * every line asked for as below): avx512 tiles 1024 ahead 45-46 tok/s,
 * 4096 49-53.5, 8192 53-55.5; Q8_0 and Q6_K files alike at 4096 and
 * 8192; the avx2 tiles forced 43-44 at 1024, 57-62 at 8192. (A Xeon,
 * quants-only prefetch, 2 threads: 512 to 4096 alike.) */
#define PK_LAYOUT_PF 8192

_Static_assert(PK_Q4K_SUPER % 8 == 0 && PK_Q5K_SUPER % 8 == 0 && PK_Q6K_SUPER % 8 == 0 && PK_Q2K_SUPER % 8 == 0 &&
                   PK_Q3K_SUPER % 8 == 0,
               "pk_layout_prefetch: a block's share of a super-block is an eighth of it");

/* Asks for block b's share of the group at g, dist bytes ahead: the group
 * is one stream, a K-quant's headers inline in it, so each block takes an
 * eighth of its super-block (Q4_K: 296 bytes, not its 256 of nibbles,
 * which had left a header's 5 lines per super-block to the hardware;
 * decode at one thread, same file and method: 45 -> 51-57 tok/s). A block
 * asks for the lines that start in its share, so consecutive blocks ask
 * for each line once. A prefetch never faults; lines past the group's
 * end cost the request (and perhaps a page walk). gcc keeps these
 * prefetches (objdump: prefetcht0 in both tile files; cpu_attention.c's
 * prefetch_l2 tells of a loop it did delete). */
static inline void pk_layout_prefetch(int kind, const uint8_t *g, int b, size_t dist)
{
    size_t share = pk_layout_kquant(kind) ? pk_layout_super(kind) / 8 : (size_t)pk_layout_block_bytes(kind);
    uintptr_t a = (uintptr_t)g + (size_t)b * share + dist, end = a + share;
    for (a = (a + 63) & ~(uintptr_t)63; a < end; a += 64) __builtin_prefetch((const void *)a, 0, 3);
}

/* Packs groups [g0, g1) of the weight w (rows x cols of the kind's file
 * type, row_bytes apart) into dst, which holds every group. */
void pk_layout_pack(int kind, const void *w, size_t row_bytes, int64_t rows, int64_t cols, int64_t g0, int64_t g1,
                    void *dst);

/* Where a tile finds its tokens' activations: token t's quants j of block
 * b at q[qb * b + qj * j + 4 t], its scale and negated half sums at
 * [sb * b + t]; a tile (8 tokens): qb 256, qj 32, sb 8; a row (1 token):
 * 32, 4, 1. */
typedef struct pk_layout_view {
    const int8_t *q;
    const float *d;
    const int32_t *nsa, *nsb; /* negated sums of columns 0..15, 16..31 */
} pk_layout_view;

static inline pk_layout_view pk_layout_tile_view(const void *x, int n)
{
    const int8_t *q = x;
    const float *d = (const float *)(q + 8 * (size_t)n);
    const int32_t *nsa = (const int32_t *)(d + 8 * (size_t)(n / QK8_0));
    return (pk_layout_view){q, d, nsa, nsa + 8 * (size_t)(n / QK8_0)};
}

static inline pk_layout_view pk_layout_row_view(const void *x, int n)
{
    const int8_t *q = x;
    const float *d = (const float *)(q + n);
    const int32_t *nsa = (const int32_t *)(d + n / QK8_0);
    return (pk_layout_view){q, d, nsa, nsa + n / QK8_0};
}

/* The negated sum of the 32 quants at index i of a view. */
static inline int32_t pk_layout_nsum(pk_layout_view x, size_t i) { return x.nsa[i] + x.nsb[i]; }

/* The negated sum over part p of the block at index i: a kind with
 * halves' 16 columns, else the block's 32. */
static inline int32_t pk_layout_part_nsum(int kind, pk_layout_view x, size_t i, int p)
{
    return pk_layout_halves(kind) ? (p ? x.nsb[i] : x.nsa[i]) : pk_layout_nsum(x, i);
}

/* The activation format (needs AVX2; only the sets that need AVX2 use it). */
extern const cpu_act pk_layout_act;

#endif
