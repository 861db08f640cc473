/* moe.h - mixture-of-experts routing: which experts each row of a batch
 * goes to and with what weight, grouped by expert so the forward pass runs
 * each expert once over all of its rows.
 *
 * The rule is qwen3moe's (and llama.cpp's for it): softmax over every
 * expert's router logit, the n_used most probable experts (ties: the lower
 * id), their probabilities renormalised to sum to 1 (the sum clamped to at
 * least 2^-14, as llama.cpp does) and multiplied by scale.
 *
 * Ownership: a plan's arrays are the caller's (llm_moe_plan_alloc sizes
 * them for max_rows rows; llm_moe_plan_free). Thread-safety: a plan (its
 * result and scratch) belongs to one thread at a time; the routing itself
 * depends only on its inputs. */
#ifndef LLM_MOE_H
#define LLM_MOE_H

#include <stdint.h>

#include "llm/status.h"

typedef struct llm_moe_plan {
    int n_expert, n_used, max_rows;
    /* expert e's rows are rows[off[e] .. off[e + 1]); the first n_first[e]
     * of them have e as their lowest-id expert (the forward pass sets
     * those rows' output, the others add to it), then the rest */
    int32_t *off;     /* (n_expert + 1) */
    int32_t *n_first; /* (n_expert) */
    int32_t *rows;    /* (max_rows * n_used) */
    float *weight;    /* (max_rows * n_used), the weight of rows[i] for its expert */
    /* scratch */
    float *probs;     /* (n_expert) */
    int32_t *sel;     /* (max_rows * n_used) each row's experts */
    float *sel_w;     /* (max_rows * n_used) and weights */
    int32_t *cur;     /* (2 * n_expert) fill cursors */
} llm_moe_plan;

/* Sizes p for up to max_rows rows. LLM_ERR_INVALID_ARG (counts out of
 * range: 1 <= n_used <= n_expert, max_rows >= 1) or LLM_ERR_NOMEM, naming
 * the cause; p is then empty (freeing it is harmless). */
llm_status llm_moe_plan_alloc(llm_moe_plan *p, int n_expert, int n_used, int max_rows, llm_error *err);
/* Frees p's arrays and empties it (an empty or failed plan is fine). */
void llm_moe_plan_free(llm_moe_plan *p);

/* Routes n_rows rows (n_rows <= max_rows) given their router logits
 * (n_rows, n_expert) into p. A row with a NaN logit goes to experts 0 ..
 * n_used - 1 with NaN weights, so its output is NaN as it would be. */
void llm_moe_route(llm_moe_plan *p, const float *logits, int n_rows, float scale);

#endif
