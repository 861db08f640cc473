/* lora.h - LoRA adapters in llama.cpp's GGUF format, checked against the
 * base model they adapt.
 *
 * The format (llama.cpp's convert_lora_to_gguf.py writes it): general.type
 * "adapter", adapter.type "lora", general.architecture the base's, an
 * optional adapter.lora.alpha, and for each adapted projection W (out x in)
 * the tensors "<W's name>.lora_a" (ne [in, rank]: rank rows of in) and
 * "<W's name>.lora_b" (ne [rank, out]: out rows of rank), in F32, F16,
 * BF16 or Q8_0. The projections adapted here are every layer's attention
 * (Q, K, V, output) and dense MLP (gate, up, down); an adapter of anything
 * else (experts, embeddings, the output head) is refused by name.
 *
 * The adapted output is y = W x + s * B (A x) with s = scale * alpha / rank
 * (scale the request's; without alpha, s = scale, as llama.cpp does).
 *
 * Ownership: llm_lora_load returns an adapter the caller frees with
 * llm_lora_free; A and B are copied out of the file (which is closed on
 * return): F16 tensors as they are (each step reads them: half the bytes,
 * and products over their exact float values), the others as F32. It
 * borrows nothing from the base. Thread-safety: an adapter is read-only
 * after load and may be shared by any threads. */
#ifndef LLM_LORA_H
#define LLM_LORA_H

#include "llm/backend.h"
#include "llm/gguf.h"
#include "llm/model.h"
#include "llm/status.h"

typedef enum llm_lora_proj {
    LLM_LORA_Q, LLM_LORA_K, LLM_LORA_V, LLM_LORA_O, LLM_LORA_GATE, LLM_LORA_UP, LLM_LORA_DOWN, LLM_LORA_N_PROJ
} llm_lora_proj;

/* Ranks above this are refused whatever the caller allows (a rank-4096
 * adapter of an 8B model is larger than the model). */
#define LLM_LORA_MAX_RANK LLM_LORA_SEG_MAX_RANK
/* alpha above this is refused: with s = alpha / rank it would swamp W x. */
#define LLM_LORA_MAX_ALPHA 65536.0f
/* Bytes an adapter file may hold beyond its largest possible tensors
 * (metadata, alignment): llm_lora_load's size bound. */
#define LLM_LORA_FILE_SLACK ((size_t)16 << 20)

typedef struct llm_lora_mat {
    int rank, in, out;         /* rank 0: this projection is not adapted */
    quant_type a_type, b_type; /* QT_F32 or QT_F16 */
    void *a;                   /* (rank x in), row-major */
    void *bt;                  /* B transposed: (rank x out), row-major */
} llm_lora_mat;

typedef struct llm_lora {
    float alpha;        /* 0: none given */
    int max_rank;       /* the largest rank among its matrices */
    int n_layer;        /* the base's */
    int n_mats;         /* adapted projections */
    llm_lora_mat *mats; /* (n_layer * LLM_LORA_N_PROJ) */
    size_t bytes;       /* of A and B as stored */
} llm_lora;

/* Loads path and checks it against base: the format keys, the
 * architecture, every tensor's name, type, shape and values (finite),
 * ranks at most max_rank (<= 0: LLM_LORA_MAX_RANK) and at most the smaller
 * side of W, alpha in (0, LLM_LORA_MAX_ALPHA], an A for every B and a B
 * for every A, at least one pair. LLM_ERR_FORMAT / LLM_ERR_INVALID_ARG /
 * LLM_ERR_UNSUPPORTED with a message naming the file and the tensor or key
 * at fault; LLM_ERR_NOMEM. The file is read into memory, not mapped (it may
 * change while a server runs), and one larger than any adapter of base
 * could be (every projection at the largest rank, in F32) is refused with
 * LLM_ERR_INVALID_ARG before it is read. */
llm_status llm_lora_load(const char *path, const llm_model *base, int max_rank, llm_lora **out, llm_error *err);
/* llm_lora_load with check (gguf.h's gguf_check_fn; NULL: none) run on the
 * file's bytes as read, before they are parsed: a digest of the very
 * bytes loaded. */
llm_status llm_lora_load_checked(const char *path, const llm_model *base, int max_rank, gguf_check_fn check, void *ctx,
                                 llm_lora **out, llm_error *err);
/* The same over an open file (name for messages); f is not kept. */
llm_status llm_lora_from_gguf(const gguf_file *f, const char *name, const llm_model *base, int max_rank,
                              llm_lora **out, llm_error *err);
void llm_lora_free(llm_lora *l);

/* Layer layer's matrices for p (rank 0 when not adapted); NULL out of range. */
const llm_lora_mat *llm_lora_mat_at(const llm_lora *l, int layer, llm_lora_proj p);
/* s for a request scale: scale * alpha / m->rank, or scale without alpha. */
float llm_lora_factor(const llm_lora *l, const llm_lora_mat *m, float scale);

/* A's element (k, i) and B's (o, k) as floats, for 0 <= k < rank,
 * 0 <= i < in, 0 <= o < out (not checked). Host matrices only (an
 * adapter's own, not a backend's copies). */
float llm_lora_mat_a_at(const llm_lora_mat *m, int k, int i);
float llm_lora_mat_b_at(const llm_lora_mat *m, int o, int k);
/* Bytes of A (rank x in) and of B (rank x out) as stored. */
size_t llm_lora_mat_a_bytes(const llm_lora_mat *m);
size_t llm_lora_mat_b_bytes(const llm_lora_mat *m);

/* y[r] += s * (B (A x[r])) for the n rows of x (in floats apart) into y (out
 * floats apart), each row on its own: the same arithmetic whatever n is. */
void llm_lora_apply(const llm_lora_mat *m, float s, const float *x, int n, float *y);

#endif
