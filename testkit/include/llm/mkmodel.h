/* mkmodel.h - writes a GGUF model of a named shape with seeded random weights
 * and a small byte-level BPE vocabulary: the test model, the benchmark
 * models at realistic sizes, and the default model of `make run`. The files
 * follow the same conventions as llama.cpp's converters (tensor names,
 * metadata keys, Q4_K_M-style type mix) so llama.cpp loads them too.
 * Thread-safe: no shared state. */
#ifndef LLM_MKMODEL_H
#define LLM_MKMODEL_H

#include <stdint.h>

#include "llm/quant.h"
#include "llm/status.h"

typedef struct llm_shape {
    const char *name;
    const char *arch;   /* "llama", "qwen2", "qwen3", "gemma3" or "qwen3moe" */
    const char *pre;    /* tokenizer.ggml.pre */
    int n_embd, n_ff, n_layer, n_head, n_head_kv, n_vocab, n_ctx;
    float rope_theta;
    int tied;           /* no output.weight: the embedding is reused */
    int head_dim;       /* 0: n_embd / n_head */
    int n_swa, swa_pattern; /* gemma3: sliding window, and every swa_pattern-th layer global */
    int n_expert, n_expert_used, n_ff_exp; /* qwen3moe: experts, per token, and their hidden size */
} llm_shape;

/* NULL for an unknown name. */
const llm_shape *llm_shape_find(const char *name);
/* Names of all shapes, NULL-terminated. */
const char *const *llm_shape_names(void);

/* type: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K
 * (every matrix of that type, Q8_0 where a row does not fit a 256-block)
 * or Q4_K (Q4_K_M-like mix with Q6_K). */
llm_status llm_mkmodel(const llm_shape *shape, quant_type type, uint64_t seed, const char *path, llm_error *err);

/* A LoRA adapter of the model at base_path in llama.cpp's format
 * (general.type adapter, adapter.type lora, adapter.lora.alpha when alpha >
 * 0, "<W>.lora_a" [in, rank] and "<W>.lora_b" [rank, out] for every layer's
 * attention and dense MLP projection W), seeded random, of type F32, F16,
 * BF16 or Q8_0 (rank a multiple of 32: B's rows are rank long). */
llm_status llm_mklora(const char *base_path, int rank, float alpha, quant_type type, uint64_t seed, const char *path,
                      llm_error *err);

#endif
