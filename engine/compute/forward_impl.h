/* forward_impl.h - what forward.c and its tensor-parallel driver
 * (forward_tp.c) share inside the engine; not a public API. */
#ifndef LLM_FORWARD_IMPL_H
#define LLM_FORWARD_IMPL_H

#include "llm/forward.h"
#include "llm/tp.h"

/* Block copies on one backend, one rank's layers (llm_forward_kv_copy). */
void forward_kv_copy_on(llm_backend *b, const llm_model *m, const llm_kv_layer *layers, llm_kv_copy_layers which,
                        const int32_t *src, const int32_t *dst, int n);

/* The pass behind llm_forward_eval (pick 0: logits to *logits) and
 * llm_forward_eval_sample (pick 1: ids to *ids, with sp or argmax). */
llm_status forward_eval_mode(llm_forward *f, const llm_forward_batch *bt, const llm_kv_layer *layers, int pick,
                             const llm_sample_params *sp, const float **logits, const int32_t **ids);

/* Makes f a rank of a tensor-parallel group: partial outputs go through c. */
void forward_set_comm(llm_forward *f, llm_comm *c, int rank);

typedef struct tp_group tp_group;
llm_status tp_group_new(const llm_model *m, llm_backend *const *b, int n_ranks, int max_rows, int max_logits,
                        tp_group **out, llm_error *err);
llm_status tp_group_eval(tp_group *g, const llm_forward_batch *bt, const llm_kv_layer *layers, int pick,
                         const llm_sample_params *sp, const float **logits, const int32_t **ids);
int tp_group_device_sample(const tp_group *g);
const float *tp_group_hidden(const tp_group *g); /* rank 0's */
void tp_group_kv_copy(tp_group *g, const llm_model *m, const llm_kv_layer *layers, llm_kv_copy_layers which,
                      const int32_t *src, const int32_t *dst, int n);
void tp_group_free(tp_group *g); /* NULL ok */

#endif
