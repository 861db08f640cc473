/* scheduler.h - continuous batching: which sequences run in the next
 * engine step and how many of their tokens, within a token budget and a
 * sequence limit, with priorities, chunked prefill and preemption.
 *
 * Each step's plan puts first one token for every running sequence that is
 * decoding, then prefill chunks of running sequences, then admits waiting
 * ones, so decoding never stalls behind a long prompt; last, decoding
 * sequences' guessed tokens (speculation) get what is left. Order everywhere is
 * by urgency: key = arrival_ms - priority * aging_ms (smaller is more
 * urgent; ties by submission order). A request one priority level higher
 * counts as having arrived aging_ms earlier, so priorities are honoured and
 * nothing starves. When a running sequence needs a KV block and none is
 * left, the least urgent running sequence is preempted: its blocks are
 * released (full ones stay in the prefix cache) and it waits to be
 * recomputed from its tokens, which gives the same output since the
 * forward pass is batch-invariant. A waiting sequence of strictly higher
 * priority and more urgent key also preempts the least urgent running one
 * when the sequence limit or the KV pool is what keeps it out.
 *
 * Ownership: the caller owns every sched_seq (and its token array) and
 * keeps it alive until sched_remove; the scheduler keeps pointers.
 * Thread-safety: none; the engine calls it under its lock. */
#ifndef LLM_SCHEDULER_H
#define LLM_SCHEDULER_H

#include <stdint.h>

#include "llm/kv_cache.h"

typedef enum sched_state { SCHED_NEW = 0, SCHED_WAITING, SCHED_RUNNING, SCHED_DONE } sched_state;

typedef struct sched_seq sched_seq;
struct sched_seq {
    /* set by the caller; tokens/n_tokens grow as tokens are generated */
    const int32_t *tokens;  /* prompt, then generated tokens */
    int n_tokens;
    int n_prompt;
    int priority;           /* larger is more urgent */
    int64_t arrival_ms;
    sched_seq *fork_of;     /* n > 1: a sibling whose prompt K/V this one may share */
    uint64_t salt;          /* prefix cache partition (kv_seq.salt): 0 shared */
    int no_reuse;           /* 1: every admission computes from position 0, reading neither the prefix cache nor
                             * a sibling (its blocks are still offered to the cache) */
    int all_logits;         /* 1: each row of a prompt position followed by another prompt token needs a logits
                             * row of its own (prompt log-probabilities): its chunks are cut so that a step's
                             * logit rows stay within sched_config.max_logits, and it is admitted only where
                             * it gets the rows beyond one per sequence (or all it has left); with no_reuse.
                             * The caller may clear both once it needs no more rows */
    int n_draft;            /* speculation: tokens[n_tokens, n_tokens + n_draft) are proposed next tokens (the
                             * caller writes them and sets this between sched_plan and sched_plan_drafts; the
                             * array must hold them). Its item may take them as extra rows, see sched_item */
    void *user;
    /* owned by the scheduler */
    kv_seq kv;              /* kv.n_tokens of the tokens have K/V */
    sched_state state;
    int64_t key;
    uint64_t order;
    int admitted;           /* has run at least once */
    int in_plan;            /* has an item in the current plan */
    int cached_tokens;      /* prompt tokens found in the prefix cache (or shared by a fork) at first admission */
    int n_preempted;
    int oom;                /* its block table could not grow: left waiting, never admitted again; the caller fails it */
};

typedef struct sched_config {
    int max_seqs;          /* running at once */
    int max_batch_tokens;  /* rows per step */
    int aging_ms;          /* waiting this long is worth one priority level */
    int max_logits;        /* logit rows per step (an item's last row when it samples, and all_logits prompt
                            * rows), at least max_seqs or max_batch_tokens, whichever is smaller; 0: that */
    int max_draft_rows;    /* proposed tokens (sched_seq.n_draft) a step may check, all items together, each with
                            * a logit row beyond max_logits (a step has at most max_logits + max_draft_rows);
                            * 0: none */
} sched_config;

/* One sequence's share of a step: n tokens from position pos0. A
 * decoding item with n_draft > 0 runs its last token and n_draft
 * proposals after it (n = 1 + n_draft), every row with logits; the
 * caller checks them and raises n_commit (then 1) to the rows whose K/V
 * stand (its last token and the proposals it took) before sched_commit. */
typedef struct sched_item {
    sched_seq *seq;
    int pos0, n;
    int logits;  /* 1: after this step every known token has K/V; sample next */
    int logit_rows; /* rows of it that need logits: its sampling rows, and an all_logits prompt's rows */
    int n_draft; /* proposals among its rows (at the end) */
    int n_commit; /* rows sched_commit keeps: n unless the caller lowers it (1 .. n) */
} sched_item;

/* Whether item it decodes: one row, which samples (the only kind that
 * may take proposals). */
static inline int sched_item_decodes(const sched_item *it) { return it->n == 1 && it->logits; }

typedef struct sched_stats {
    uint64_t preemptions;
    uint64_t prompt_tokens;     /* prompt tokens at first admission */
    uint64_t cached_tokens;     /* of those, found in the prefix cache */
    uint64_t forked_tokens;     /* shared from a sibling (n > 1) */
    uint64_t recomputed_tokens; /* computed again after a preemption */
    uint64_t oom;               /* sequences marked oom (the caller compares to find new ones) */
} sched_stats;

typedef struct sched {
    sched_config cfg;
    kv_cache *kv;
    sched_seq **running, **waiting;
    int n_running, n_waiting, cap_waiting;
    sched_item *items;     /* (max_seqs) the current plan */
    int n_items, n_rows;
    int n_logits;          /* logit rows the current plan takes */
    uint64_t next_order;
    sched_stats stats;
} sched;

/* Allocates the queues. Errors: LLM_ERR_INVALID_ARG (a limit < 1),
 * LLM_ERR_NOMEM. */
llm_status sched_init(sched *s, const sched_config *cfg, kv_cache *kv, llm_error *err);
/* Releases every sequence's blocks still held and the queues. */
void sched_free(sched *s);

/* Queues a new sequence. LLM_ERR_NOMEM only. */
llm_status sched_add(sched *s, sched_seq *q);
/* Takes a sequence out (finished or cancelled) and releases its blocks. */
void sched_remove(sched *s, sched_seq *q);

/* Plans the next step into s->items (n_items sequences, n_rows tokens);
 * allocates their KV (queuing copy-on-write copies in the cache) and may
 * preempt. Returns n_items. */
int sched_plan(sched *s);
/* After sched_plan, once the caller has set the n_draft of planned
 * decoding sequences: their items grow by their proposals, most urgent
 * first, from the rows, logit rows and free KV blocks the plan left (up
 * to max_draft_rows; never a preemption), so speculation steps back when
 * prompts fill the step. Returns the proposal rows planned. */
int sched_plan_drafts(sched *s);
/* After the step's forward pass: each item's first n_commit tokens now
 * have K/V; rows past them are forgotten (never offered to the prefix
 * cache) and blocks holding only such rows go back to the pool. The items
 * stay readable until the next plan. */
void sched_commit(sched *s);
/* The step failed: forget the plan without committing (reserved blocks
 * stay with their sequences). */
void sched_abort(sched *s);

#endif
