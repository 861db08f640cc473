/* model.h - a loaded Llama-family model (weights bound to the GGUF mapping)
 * and a single-sequence session that runs the forward pass through a backend.
 *
 * Supported `general.architecture`: llama (Llama 2/3, TinyLlama, Mistral,
 * SmolLM), qwen2 (adds Q/K/V biases, NEOX-style RoPE), qwen3 (Q/K
 * RMSNorm per head instead of biases) and gemma3 (embeddings scaled by
 * sqrt(n_embd), Q/K norms, norms after attention and MLP as well as
 * before, GELU-gated MLP, sliding-window layers with their own RoPE base
 * between global ones) and qwen3moe (qwen3's attention; each layer's MLP
 * is n_expert SwiGLU experts of which a router picks n_expert_used per
 * token: softmax over all experts, the top k, weights renormalised to sum
 * to 1).
 *
 * Ownership: llm_model_load returns a model the caller frees with
 * llm_model_free; weights are used in place from the mmap (nothing copied
 * except small norm vectors stored in non-F32 types). A session borrows its
 * model and backend (both must outlive it) and owns its KV cache and scratch.
 * The batched, multi-sequence forward pass is forward.h; the serving engine
 * is engine.h.
 * Thread-safety: a model is read-only after load and may be shared; a session
 * is used by one thread at a time. */
#ifndef LLM_MODEL_H
#define LLM_MODEL_H

#include <stdint.h>

#include "llm/backend.h"
#include "llm/gguf.h"
#include "llm/status.h"
#include "llm/tokenizer.h"

typedef enum llm_arch {
    LLM_ARCH_LLAMA = 0,
    LLM_ARCH_QWEN2 = 1,
    LLM_ARCH_QWEN3 = 2,
    LLM_ARCH_GEMMA3 = 3,
    LLM_ARCH_QWEN3MOE = 4
} llm_arch;

#define LLM_MAX_EXPERTS 512

typedef struct llm_hparams {
    llm_arch arch;
    int n_vocab, n_ctx_train, n_embd, n_ff, n_layer;
    int n_head, n_head_kv, head_dim, rot_dim;
    float eps, rope_theta, rope_freq_scale;
    int rope_neox;
    int n_swa;          /* sliding window of the local layers; 0: none */
    float embd_scale;   /* token embeddings are multiplied by this (gemma3: sqrt(n_embd)) */
    float attn_scale;   /* scores = q . k * attn_scale (1 / sqrt(head_dim)) */
    int ffn_gelu;       /* 1: GELU(tanh)-gated MLP (gemma3); 0: SwiGLU */
    int n_expert, n_expert_used; /* mixture of experts (qwen3moe); 0: dense MLP */
    int n_ff_exp;       /* an expert's hidden size */
    float expert_scale; /* routing weights are multiplied by this (1: none) */
} llm_hparams;

typedef struct llm_layer {
    const float *attn_norm, *ffn_norm;  /* (n_embd) */
    const float *attn_q_norm, *attn_k_norm;      /* (head_dim) each head's Q/K RMSNorm: qwen3, gemma3; else NULL */
    const float *attn_post_norm, *ffn_post_norm; /* (n_embd) norms of the blocks' outputs: gemma3; else NULL */
    const float *bq, *bk, *bv;          /* qwen2 only, else NULL */
    llm_weight wq, wk, wv, wo;          /* (n_head*hd, n_embd) ... (n_embd, n_head*hd) */
    llm_weight w_gate, w_up, w_down;    /* (n_ff, n_embd), (n_ff, n_embd), (n_embd, n_ff); unset with experts */
    llm_weight w_router;                /* (n_expert, n_embd) with experts */
    llm_weight *exp_gate, *exp_up, *exp_down; /* (n_expert) each expert's (n_ff_exp, n_embd) ... (n_embd, n_ff_exp):
                                         * views into the file's 3-D tensors, arrays owned by the model */
    int window;                         /* this layer's sliding window (0: attends to everything) */
    float rope_theta, rope_freq_scale;  /* this layer's RoPE (local layers have their own base) */
} llm_layer;

typedef struct llm_model {
    gguf_file *gguf;
    llm_hparams hp;
    llm_weight tok_embd;     /* (n_vocab, n_embd) */
    llm_weight output;       /* (n_vocab, n_embd); tok_embd when tied */
    const float *output_norm;
    const float *rope_freqs;  /* (rot_dim / 2) or NULL: Llama 3.1+ frequency factors */
    llm_layer *layers;
    llm_vocab *vocab;
    void **owned;            /* malloc'd copies freed with the model: dequantized
                              * vectors, a tensor-parallel rank's column slices */
    int n_owned;
    char name[128];          /* general.name or the file's base name */
} llm_model;

/* Loads and validates a GGUF model: architecture, hyper-parameters, every
 * tensor's presence, type and shape, and the tokenizer. Errors name the key
 * or tensor at fault. */
llm_status llm_model_load(const char *path, llm_model **out, llm_error *err);
/* The same with check run on each file's mapped bytes before they are
 * parsed (gguf_open_checked): a model pinned by its digest is parsed only
 * once its bytes are the ones expected. */
llm_status llm_model_load_checked(const char *path, gguf_part_check_fn check, void *ctx, llm_model **out, llm_error *err);
void llm_model_free(llm_model *m);

/* Marks the sliding-window layers in local (n_layer flags) and returns the
 * widest window (0: none) - what a KV cache keeps apart for them. */
int llm_model_windows(const llm_model *m, unsigned char *local);
/* Bytes of all weights (for the bandwidth roofline). */
size_t llm_model_weight_bytes(const llm_model *m);

typedef struct llm_session llm_session;

typedef struct llm_session_config {
    int n_ctx;     /* 0: the model's training context */
    int max_batch; /* most tokens evaluated in one step (longer inputs are chunked); 0: 512 */
    int kv_type;   /* an llm_kv_type (kv_cache.h); 0: F16 */
    int tensor_parallel;             /* ranks (tp.h); 0 or 1: b alone */
    llm_backend *const *tp_backends; /* (tensor_parallel) with [0] == b */
    int logit_rows;  /* most logit rows per step for llm_session_eval_each (each n_vocab floats); 0: 1 */
    const struct llm_lora *lora; /* an adapter (lora.h) every step runs with, borrowed for the session's life; NULL:
                                  * none. Not with tensor_parallel */
    float lora_scale;            /* its scale */
} llm_session_config;

/* A single sequence over its own paged KV cache (no prefix caching): the
 * simple way to run a model, used by the tools and the reference tests. */
llm_status llm_session_new(const llm_model *m, llm_backend *b, const llm_session_config *cfg, llm_session **out,
                           llm_error *err);
void llm_session_free(llm_session *s);
/* Appends n tokens at the current position and computes the logits of the
 * last one. Fails (changing nothing) on a token id out of range or when the
 * context would overflow. A backend failure midway leaves the session at
 * its position before the call, or - when sliding-window layers had
 * already dropped K/V that position's window reads - reset to position 0
 * (llm_session_pos says which; the message too). Returns a pointer to
 * n_vocab logits owned by the session, valid until the next call. */
llm_status llm_session_eval(llm_session *s, const int32_t *tokens, int n, const float **logits, llm_error *err);
/* As llm_session_eval, but every token's logits: fn(ctx, i, logits) for
 * i = 0 .. n-1 in order (logits: n_vocab floats owned by the session,
 * valid during the call), so perplexity can be scored without n x n_vocab
 * floats. Runs in steps of at most logit_rows tokens. A non-zero return
 * from fn stops the evaluation with LLM_ERR_CANCELLED (the tokens of the
 * step it was in are evaluated). */
typedef int (*llm_logits_fn)(void *ctx, int i, const float *logits);
llm_status llm_session_eval_each(llm_session *s, const int32_t *tokens, int n, llm_logits_fn fn, void *ctx,
                                 llm_error *err);
int llm_session_pos(const llm_session *s);
int llm_session_n_ctx(const llm_session *s);
/* Forgets the KV contents: the next eval starts at position 0. */
void llm_session_reset(llm_session *s);

#endif
