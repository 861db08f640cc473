/* cpu_impl.h - state shared by the CPU backend's translation units
 * (backend_cpu.c: matmul and element-wise ops; cpu_attention.c: paged KV
 * and attention; cpu_lora.c: adapters' low-rank products; cpu_pack.c:
 * the packed copies of a model's matrices).
 * Not a public header. */
#ifndef LLM_CPU_IMPL_H
#define LLM_CPU_IMPL_H

#include "kernels.h"
#include "threadpool.h"
#include "llm/backend.h"

typedef struct cpu_ctx {
    tp_pool *pool;
    const cpu_kernels *k;
    void *act;          /* quantized activations, grown on demand */
    size_t act_cap;
    float *scratch;     /* attention: per thread, scratch_per_thread floats */
    size_t scratch_per_thread;
    _Atomic size_t used; /* bytes of buffer_alloc and packed weights (read by /metrics threads) */
    llm_cpu_pack pack;   /* llm_cpu_config's */
    /* nanoseconds spent in matmuls and in attention (llm_backend_cpu_times); relaxed atomics, since a
     * reader may be another thread than the one running the passes */
    _Atomic uint64_t matmul_ns, attn_ns;
} cpu_ctx;

void cpu_kv_write(llm_backend *b, const llm_kv_layer *kv, const llm_batch_seq *seqs, int n_seqs, const float *k,
                  const float *v);
void cpu_kv_copy(llm_backend *b, const llm_kv_layer *layers, int n_layers, const int32_t *src, const int32_t *dst,
                 int n);
llm_status cpu_attention(llm_backend *b, const llm_attn_args *a);
/* llm_backend_i.lora (cpu_lora.c). */
llm_status cpu_lora(llm_backend *b, const llm_lora_seg *segs, int n_segs, const float *x, int in, float *y, int out);
/* MemAvailable (/proc/meminfo), or free pages where that is missing. */
size_t cpu_mem_available(llm_backend *b);
/* model_upload / model_release (cpu_pack.c). */
llm_status cpu_pack_model(llm_backend *b, const struct llm_model *m, struct llm_model **dev, llm_error *err);
void cpu_pack_release(llm_backend *b, struct llm_model *dev);

#endif
