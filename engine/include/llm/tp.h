/* tp.h - tensor parallelism: a model's attention heads and MLP columns split
 * over N ranks (one backend each, typically one GPU each), and the
 * all-reduce that sums the ranks' partial outputs after the attention output
 * and MLP down projections (Megatron-style: Q/K/V and gate/up are split by
 * rows, wo and w_down by columns; norms, embeddings and the output matrix
 * are replicated, and only rank 0 computes logits).
 *
 * The forward pass (forward.h, llm_forward_new_tp) drives the ranks, one
 * thread each; this header is what it is built from, exposed so tests can
 * check the pieces.
 *
 * Ownership: a partition borrows the full model's mapping (row slices point
 * into it) and owns the column slices it copies; free it with
 * llm_tp_part_free before the full model. A communicator is owned by its
 * creator (llm_comm_free). Thread-safety: llm_comm_allreduce is a
 * collective: every rank calls it from its own thread, the same number of
 * times with the same lengths. */
#ifndef LLM_TP_H
#define LLM_TP_H

#include <stddef.h>

#include "llm/model.h"

typedef struct llm_comm llm_comm;

struct llm_comm_i {
    const char *name;
    /* Sums buf (n floats, memory of the rank's backend) over every rank, in
     * rank order, so each rank ends with the same bits. Returns
     * LLM_ERR_CANCELLED once another rank aborted. */
    llm_status (*allreduce)(llm_comm *c, int rank, float *buf, size_t n);
    /* A rank that fails outside a collective calls this so the others do
     * not wait for it forever. */
    void (*abort)(llm_comm *c);
    /* After every rank returned: ready for the next forward pass. */
    void (*reset)(llm_comm *c);
    void (*free)(llm_comm *c);
};

struct llm_comm {
    const struct llm_comm_i *iface;
    void *ctx;
    int n_ranks;
};

/* The host-memory all-reduce between threads (CPU backends): a
 * reduce-scatter where rank r sums its 1/N of the elements over all ranks'
 * buffers, then every rank reads the full result. */
llm_status llm_comm_threads_new(int n_ranks, llm_comm **out, llm_error *err);

static inline llm_status llm_comm_allreduce(llm_comm *c, int rank, float *buf, size_t n)
{ return c->iface->allreduce(c, rank, buf, n); }
static inline void llm_comm_abort(llm_comm *c) { c->iface->abort(c); }
static inline void llm_comm_reset(llm_comm *c) { c->iface->reset(c); }
static inline void llm_comm_free(llm_comm *c) { if (c) c->iface->free(c); }

/* Whether m splits over n_ranks: heads, KV heads and n_ff divisible, and
 * the column slices of wo and w_down on whole quantization blocks. The
 * message names the field and values. */
llm_status llm_tp_check(const llm_model *m, int n_ranks, llm_error *err);

/* Rank `rank`'s share of m as a model of its own: hp.n_head, n_head_kv and
 * n_ff divided by n_ranks, the same layer count, embeddings and output.
 * Only tokenizer-free fields are meaningful (vocab and gguf are NULL). */
llm_status llm_tp_partition(const llm_model *m, int rank, int n_ranks, llm_model **out, llm_error *err);
void llm_tp_part_free(llm_model *part);

#endif
