/* forward.h - one batched forward pass of a model: the rows of several
 * sequences go through every layer together (one matmul per weight for all
 * rows), attention reads and writes each sequence's K/V through its block
 * table, and logits come out for the rows the caller asks for.
 *
 * A row's result depends only on its sequence's tokens and K/V, never on
 * what else shares the batch (the CPU kernels are batch-invariant), so
 * batching, chunking and recomputation leave outputs unchanged.
 *
 * Ownership: llm_forward_new borrows the model and backend (they must
 * outlive it) and owns its scratch; the caller frees with llm_forward_free
 * (NULL ok). Thread-safety: one thread at a time per llm_forward. */
#ifndef LLM_FORWARD_H
#define LLM_FORWARD_H

#include "llm/lora.h"
#include "llm/model.h"

typedef struct llm_forward llm_forward;

/* A LoRA adapter (lora.h) made ready for a forward pass's backend by
 * llm_forward_lora_add. */
typedef struct llm_forward_lora llm_forward_lora;

/* A sequence's adapter in a batch: its projections get s * B (A x) with s
 * = llm_lora_factor(adapter, matrix, scale). */
typedef struct llm_forward_seq_lora {
    const llm_forward_lora *lora; /* NULL: the base model alone */
    float scale;                  /* the request's; finite */
} llm_forward_seq_lora;

typedef struct llm_forward_batch {
    const int32_t *tokens;      /* (n_rows) ids; one outside [0, n_vocab) fails the pass (LLM_ERR_INVALID_ARG) */
    int n_rows;
    const llm_batch_seq *seqs;  /* consecutive: seqs[0].tok0 = 0, each starts where the last ended */
    int n_seqs;
    const int32_t *logit_rows;  /* (n_logits) rows whose logits are wanted */
    int n_logits;
    const int32_t *hidden_rows; /* (n_hidden) rows whose final hidden state (after the output norm, the input of
                                 * the output matmul) is wanted: embeddings; see llm_forward_hidden */
    int n_hidden;               /* 0 to n_rows */
    const llm_forward_seq_lora *loras;  /* (n_seqs) each sequence's adapter, or NULL: none in this batch */
} llm_forward_batch;

/* max_rows: most rows per batch; max_logits: most logit rows per batch. */
llm_status llm_forward_new(const llm_model *m, llm_backend *b, int max_rows, int max_logits, llm_forward **out,
                           llm_error *err);
void llm_forward_free(llm_forward *f);

/* Makes adapter l usable in f's batches: a host-memory backend reads l
 * in place (l must outlive the handle), a device backend gets copies of
 * its matrices (llm_backend_i.write). Errors: LLM_ERR_UNSUPPORTED (the
 * backend runs no adapters; tensor parallelism), LLM_ERR_INVALID_ARG (l
 * was checked against a model of another depth), LLM_ERR_NOMEM. */
llm_status llm_forward_lora_add(llm_forward *f, const llm_lora *l, llm_forward_lora **out, llm_error *err);
/* Releases a handle (NULL ok); no batch may name it any more. */
void llm_forward_lora_free(llm_forward *f, llm_forward_lora *fl);

/* Whether the backend picks tokens on its device (llm_forward_eval_sample
 * with sampling settings); host-memory backends read logits in place. */
int llm_forward_device_sample(const llm_forward *f);

/* As llm_forward_eval, but only one token id per logit row comes back
 * (*ids, n_logits entries owned by f, valid until the next call): picked
 * with p[i] for row i on a device that samples, or the argmax when p is
 * NULL (on any backend); LLM_SAMPLE_NAN for a row with a NaN logit.
 * LLM_ERR_INVALID_ARG for a p on a backend that cannot sample. */
llm_status llm_forward_eval_sample(llm_forward *f, const llm_forward_batch *batch, const llm_kv_layer *layers,
                                   const llm_sample_params *p, const int32_t **ids);

/* Tensor parallelism over n_ranks backends (tp.h): rank r runs its share
 * of heads and MLP columns on b[r] in a thread of its own, K/V of its heads
 * in its own layers. n_ranks 1 is llm_forward_new(m, b[0], ...). Errors:
 * the model does not split (llm_tp_check), no memory, no threads. */
llm_status llm_forward_new_tp(const llm_model *m, llm_backend *const *b, int n_ranks, int max_rows, int max_logits,
                              llm_forward **out, llm_error *err);

/* Which layers a block copy applies to: every layer (one pool), or with a
 * sliding-window pool (kv_cache.h) the global or the local layers. */
typedef enum llm_kv_copy_layers { LLM_KV_COPY_ALL = 0, LLM_KV_COPY_GLOBAL, LLM_KV_COPY_LOCAL } llm_kv_copy_layers;

/* Copy-on-write of K/V blocks src[i] -> dst[i] in the `which` layers of
 * every rank (layers as for llm_forward_eval). */
void llm_forward_kv_copy(llm_forward *f, const llm_kv_layer *layers, llm_kv_copy_layers which, const int32_t *src,
                         const int32_t *dst, int n);

/* Runs the batch, storing its K/V into layers (model n_layer entries per
 * rank, rank-major, as kv_cache_layers hands them out; with room reserved
 * for every row's position). *logits gets (n_logits, n_vocab)
 * floats owned by f, valid until the next call. Errors: LLM_ERR_INVALID_ARG
 * (batch over the limits, a token id outside the vocabulary: checked
 * before anything runs), or the backend's status. */
llm_status llm_forward_eval(llm_forward *f, const llm_forward_batch *batch, const llm_kv_layer *layers,
                            const float **logits);

/* The last pass's hidden rows: (n_hidden, n_embd) floats in host memory,
 * owned by f, valid until the next pass; NULL when it asked for none.
 * With tensor parallelism they come from rank 0 (every rank holds the
 * whole residual stream). */
const float *llm_forward_hidden(const llm_forward *f);

#endif
