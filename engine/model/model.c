/* model.c - GGUF metadata and tensors -> llm_model (hyper-parameters and
 * weights bound in place to the mapping). Every tensor's type and shape is
 * checked here so the forward pass never needs to. */
#include "llm/model.h"

#include <math.h>
#include <string.h>

typedef struct loader {
    llm_model *m;
    const gguf_file *f;
    char arch[32];
    llm_error *err;
} loader;

static llm_status get_int(loader *L, const char *suffix, int *v, int required, int def)
{
    char key[128];
    uint64_t x;
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    llm_status st = gguf_get_u64(L->f, key, &x, L->err);
    if (st == LLM_ERR_INVALID_ARG) {
        if (required)
            return llm_errf(L->err, LLM_ERR_FORMAT, "%s: missing required key %s", gguf_name(L->f), key);
        *v = def;
        return LLM_OK;
    }
    if (st)
        return st;
    if (x > (1u << 30))
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: key %s = %llu is out of range", gguf_name(L->f), key,
                        (unsigned long long)x);
    *v = (int)x;
    return LLM_OK;
}

static llm_status get_float(loader *L, const char *suffix, float *v, float def)
{
    char key[128];
    double x;
    snprintf(key, sizeof key, "%s.%s", L->arch, suffix);
    llm_status st = gguf_get_f64(L->f, key, &x, L->err);
    if (st == LLM_ERR_INVALID_ARG) {
        *v = def;
        return LLM_OK;
    }
    if (st)
        return st;
    *v = (float)x;
    return LLM_OK;
}

static llm_status read_arch(loader *L)
{
    gguf_str s;
    llm_status st = gguf_get_str(L->f, "general.architecture", &s, L->err);
    if (st == LLM_ERR_INVALID_ARG)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: missing general.architecture", gguf_name(L->f));
    if (st)
        return st;
    snprintf(L->arch, sizeof L->arch, "%.*s", (int)(s.len < 31 ? s.len : 31), s.data);
    if (!strcmp(L->arch, "llama"))
        L->m->hp.arch = LLM_ARCH_LLAMA;
    else if (!strcmp(L->arch, "qwen2"))
        L->m->hp.arch = LLM_ARCH_QWEN2;
    else if (!strcmp(L->arch, "qwen3"))
        L->m->hp.arch = LLM_ARCH_QWEN3;
    else if (!strcmp(L->arch, "gemma3"))
        L->m->hp.arch = LLM_ARCH_GEMMA3;
    else if (!strcmp(L->arch, "qwen3moe"))
        L->m->hp.arch = LLM_ARCH_QWEN3MOE;
    else
        return llm_errf(L->err, LLM_ERR_UNSUPPORTED,
                        "%s: architecture '%s' is not supported (llama, qwen2, qwen3, gemma3, qwen3moe)", gguf_name(L->f),
                        L->arch);
    return LLM_OK;
}

static llm_status read_rope_scaling(loader *L, llm_hparams *hp)
{
    char key[128];
    gguf_str type;
    float factor = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", L->arch);
    llm_status st = gguf_get_str(L->f, key, &type, L->err);
    if (st && st != LLM_ERR_INVALID_ARG)
        return st;
    if (st == LLM_OK && !gguf_str_eq(type, "linear") && !gguf_str_eq(type, "none"))
        return llm_errf(L->err, LLM_ERR_UNSUPPORTED, "%s: %s '%.*s' not supported (linear, none)", gguf_name(L->f),
                        key, (int)type.len, type.data);
    if (st == LLM_OK && gguf_str_eq(type, "none"))
        return LLM_OK;
    if ((st = get_float(L, "rope.scaling.factor", &factor, 0.0f)))
        return st;
    if (factor == 0.0f && (st = get_float(L, "rope.scale_linear", &factor, 1.0f)))
        return st;
    if (!(factor > 0.0f))
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: rope scaling factor %g must be > 0", gguf_name(L->f), factor);
    hp->rope_freq_scale = 1.0f / factor;
    return LLM_OK;
}

/* qwen3moe's experts: how many, how many per token, their hidden size
 * (feed_forward_length is then optional: no dense MLP uses it). */
static llm_status read_experts(loader *L, llm_hparams *hp)
{
    llm_status st;
    hp->expert_scale = 1.0f;
    if (hp->arch != LLM_ARCH_QWEN3MOE)
        return LLM_OK;
    if ((st = get_int(L, "expert_count", &hp->n_expert, 1, 0)) ||
        (st = get_int(L, "expert_used_count", &hp->n_expert_used, 1, 0)) ||
        (st = get_int(L, "expert_feed_forward_length", &hp->n_ff_exp, 1, 0)) ||
        (st = get_float(L, "expert_weights_scale", &hp->expert_scale, 0.0f)))
        return st;
    if (hp->n_expert < 1 || hp->n_expert > LLM_MAX_EXPERTS || hp->n_expert_used < 1 ||
        hp->n_expert_used > hp->n_expert || hp->n_ff_exp < 1)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: %d experts (1 to %d), %d used per token (1 to the experts), "
                        "expert_feed_forward_length %d (> 0)", gguf_name(L->f), hp->n_expert, LLM_MAX_EXPERTS,
                        hp->n_expert_used, hp->n_ff_exp);
    if (!isfinite(hp->expert_scale) || hp->expert_scale < 0.0f)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: expert_weights_scale %g must be finite and >= 0", gguf_name(L->f),
                        hp->expert_scale);
    if (hp->expert_scale == 0.0f) /* llama.cpp reads 0 (absent) as no scaling */
        hp->expert_scale = 1.0f;
    if (hp->n_ff == 0)
        hp->n_ff = hp->n_ff_exp;
    return LLM_OK;
}

static llm_status read_hparams(loader *L)
{
    llm_hparams *hp = &L->m->hp;
    llm_status st;
    int moe = hp->arch == LLM_ARCH_QWEN3MOE;
    if ((st = get_int(L, "context_length", &hp->n_ctx_train, 1, 0)) ||
        (st = get_int(L, "embedding_length", &hp->n_embd, 1, 0)) ||
        (st = get_int(L, "feed_forward_length", &hp->n_ff, !moe, 0)) || (st = read_experts(L, hp)) ||
        (st = get_int(L, "block_count", &hp->n_layer, 1, 0)) ||
        (st = get_int(L, "attention.head_count", &hp->n_head, 1, 0)))
        return st;
    if (hp->n_head <= 0 || hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_ff <= 0 || hp->n_ctx_train <= 0)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: zero-sized hyper-parameter (embd %d, ff %d, layers %d, heads %d, ctx %d)",
                        gguf_name(L->f), hp->n_embd, hp->n_ff, hp->n_layer, hp->n_head, hp->n_ctx_train);
    if ((st = get_int(L, "attention.head_count_kv", &hp->n_head_kv, 0, hp->n_head)) ||
        (st = get_int(L, "attention.key_length", &hp->head_dim, 0, hp->n_embd / hp->n_head)))
        return st;
    if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: head_count %d is not a multiple of head_count_kv %d",
                        gguf_name(L->f), hp->n_head, hp->n_head_kv);
    if ((st = get_int(L, "rope.dimension_count", &hp->rot_dim, 0, hp->head_dim)))
        return st;
    if (hp->head_dim <= 0 || hp->rot_dim <= 0 || hp->rot_dim > hp->head_dim || hp->rot_dim % 2 ||
        hp->rot_dim > LLM_MAX_ROT_DIM)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: rope.dimension_count %d invalid for head size %d (max %d)",
                        gguf_name(L->f), hp->rot_dim, hp->head_dim, LLM_MAX_ROT_DIM);
    if ((st = get_float(L, "attention.layer_norm_rms_epsilon", &hp->eps, 1e-5f)) ||
        (st = get_float(L, "rope.freq_base", &hp->rope_theta, 10000.0f)))
        return st;
    hp->rope_freq_scale = 1.0f;
    hp->rope_neox = hp->arch != LLM_ARCH_LLAMA;
    hp->embd_scale = hp->arch == LLM_ARCH_GEMMA3 ? sqrtf((float)hp->n_embd) : 1.0f;
    /* Gemma 3 27B (62 layers) scales queries by its model width per head,
     * not its head size (Google's config; llama.cpp does the same) */
    int q_width = hp->arch == LLM_ARCH_GEMMA3 && hp->n_layer == 62 ? hp->n_embd / hp->n_head : hp->head_dim;
    hp->attn_scale = 1.0f / sqrtf((float)q_width);
    hp->ffn_gelu = hp->arch == LLM_ARCH_GEMMA3;
    if (!(isfinite(hp->eps) && hp->eps >= 0.0f) || !(isfinite(hp->rope_theta) && hp->rope_theta > 0.0f))
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: layer_norm_rms_epsilon %g must be finite and >= 0, rope.freq_base %g "
                        "finite and > 0", gguf_name(L->f), hp->eps, hp->rope_theta);
    /* only gemma3 here has local layers; other families' keys are not read */
    if (hp->arch == LLM_ARCH_GEMMA3 && (st = get_int(L, "attention.sliding_window", &hp->n_swa, 0, 0)))
        return st;
    return read_rope_scaling(L, hp);
}

/* `attention.sliding_window_pattern` given as one bool per layer (1:
 * local) into is_local; 0 when the key is not such an array. */
static int pattern_array(loader *L, int *is_local)
{
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", L->arch);
    const gguf_kv *kv = gguf_find(L->f, key);
    if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_BOOL ||
        kv->arr_n != (uint64_t)L->m->hp.n_layer)
        return 0;
    for (int i = 0; i < L->m->hp.n_layer; i++) is_local[i] = ((const uint8_t *)kv->arr_data)[i] != 0;
    return 1;
}

/* Which layers are local (sliding window) and their RoPE: gemma3 makes
 * every layer but each sixth local (`attention.sliding_window_pattern`
 * overrides the 6, or lists each layer), with base `rope.freq_base_swa`
 * (default 10000) and no scaling; global layers use the model's base and
 * scaling. */
static llm_status layer_windows(loader *L)
{
    llm_hparams *hp = &L->m->hp;
    int pattern = 6;
    float base_swa = 10000.0f;
    llm_status st;
    int *is_local = calloc((size_t)hp->n_layer, sizeof *is_local);
    if (!is_local)
        return llm_errf(L->err, LLM_ERR_NOMEM, "%s: no memory", gguf_name(L->f));
    int listed = hp->n_swa > 0 && pattern_array(L, is_local);
    if (hp->n_swa > 0 &&
        ((!listed && (st = get_int(L, "attention.sliding_window_pattern", &pattern, 0, 6))) ||
         (st = get_float(L, "rope.freq_base_swa", &base_swa, 10000.0f)))) {
        free(is_local);
        return st;
    }
    if (!(isfinite(base_swa) && base_swa > 0.0f)) {
        free(is_local);
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: %s.rope.freq_base_swa %g must be finite and > 0", gguf_name(L->f),
                        L->arch, base_swa);
    }
    for (int i = 0; i < hp->n_layer; i++) {
        llm_layer *l = &L->m->layers[i];
        int local = hp->n_swa > 0 && (listed ? is_local[i] : pattern == 0 || i % pattern < pattern - 1);
        l->window = local ? hp->n_swa : 0;
        l->rope_theta = local ? base_swa : hp->rope_theta;
        l->rope_freq_scale = local ? 1.0f : hp->rope_freq_scale;
    }
    free(is_local);
    return LLM_OK;
}

/* Binds tensor `name` with ne = {cols, rows}; rows == 0 means a vector. */
static llm_status bind(loader *L, const char *name, int64_t cols, int64_t rows, const gguf_tensor **out)
{
    const gguf_tensor *t = gguf_find_tensor(L->f, name);
    *out = t;
    if (!t)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: missing tensor %s", gguf_name(L->f), name);
    int want_dims = rows ? 2 : 1;
    if ((int)t->n_dims != want_dims || (int64_t)t->ne[0] != cols || (rows && (int64_t)t->ne[1] != rows))
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: tensor %s has shape [%llu, %llu], expected [%lld, %lld]",
                        gguf_name(L->f), name, (unsigned long long)t->ne[0],
                        (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 1), (long long)cols,
                        (long long)(rows ? rows : 1));
    return LLM_OK;
}

static llm_status bind_matrix(loader *L, const char *name, int64_t cols, int64_t rows, llm_weight *w)
{
    const gguf_tensor *t;
    llm_status st = bind(L, name, cols, rows, &t);
    if (st)
        return st;
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = quant_row_bytes(t->type, (size_t)cols);
    w->data = t->data;
    return LLM_OK;
}

/* Vectors are used as float32; other types are dequantized into an owned copy. */
static llm_status bind_vector(loader *L, const char *name, int64_t n, const float **out, int optional)
{
    const gguf_tensor *t = gguf_find_tensor(L->f, name);
    if (!t && optional) {
        *out = NULL;
        return LLM_OK;
    }
    llm_status st = bind(L, name, n, 0, &t);
    if (st)
        return st;
    if (t->type == QT_F32) {
        *out = t->data;
        return LLM_OK;
    }
    void **owned = realloc(L->m->owned, sizeof(void *) * (size_t)(L->m->n_owned + 1));
    float *v = malloc(sizeof(float) * (size_t)n);
    if (owned)
        L->m->owned = owned;
    if (!owned || !v) {
        free(v);
        return llm_errf(L->err, LLM_ERR_NOMEM, "%s: no memory for tensor %s", gguf_name(L->f), name);
    }
    quant_dequantize_row(t->type, t->data, v, (size_t)n);
    L->m->owned[L->m->n_owned++] = v;
    *out = v;
    return LLM_OK;
}

/* A 3-D tensor of n matrices (ne = {cols, rows, n}) as n weight views,
 * in an array the model owns. */
static llm_status bind_stack(loader *L, const char *name, int64_t cols, int64_t rows, int n, llm_weight **out)
{
    const gguf_tensor *t = gguf_find_tensor(L->f, name);
    if (!t)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: missing tensor %s", gguf_name(L->f), name);
    if (t->n_dims != 3 || (int64_t)t->ne[0] != cols || (int64_t)t->ne[1] != rows || (int64_t)t->ne[2] != n)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: tensor %s has shape [%llu, %llu, %llu], expected [%lld, %lld, %d]",
                        gguf_name(L->f), name, (unsigned long long)t->ne[0],
                        (unsigned long long)(t->n_dims > 1 ? t->ne[1] : 1),
                        (unsigned long long)(t->n_dims > 2 ? t->ne[2] : 1), (long long)cols, (long long)rows, n);
    void **owned = realloc(L->m->owned, sizeof(void *) * (size_t)(L->m->n_owned + 1));
    llm_weight *w = calloc((size_t)n, sizeof *w);
    if (owned)
        L->m->owned = owned;
    if (!owned || !w) {
        free(w);
        return llm_errf(L->err, LLM_ERR_NOMEM, "%s: no memory for tensor %s", gguf_name(L->f), name);
    }
    L->m->owned[L->m->n_owned++] = w;
    size_t rb = quant_row_bytes(t->type, (size_t)cols);
    for (int e = 0; e < n; e++)
        w[e] = (llm_weight){t->type, rows, cols, rb, (const char *)t->data + (size_t)e * (size_t)rows * rb, NULL};
    *out = w;
    return LLM_OK;
}

/* A mixture-of-experts MLP: the router and the experts' three stacks. */
static llm_status bind_experts(loader *L, int i, llm_layer *l)
{
    const llm_hparams *hp = &L->m->hp;
    char n[96];
    llm_status st;
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", i, s), n)
    if ((st = bind_matrix(L, NAME("ffn_gate_inp.weight"), hp->n_embd, hp->n_expert, &l->w_router)) ||
        (st = bind_stack(L, NAME("ffn_gate_exps.weight"), hp->n_embd, hp->n_ff_exp, hp->n_expert, &l->exp_gate)) ||
        (st = bind_stack(L, NAME("ffn_up_exps.weight"), hp->n_embd, hp->n_ff_exp, hp->n_expert, &l->exp_up)))
        return st;
    return bind_stack(L, NAME("ffn_down_exps.weight"), hp->n_ff_exp, hp->n_embd, hp->n_expert, &l->exp_down);
#undef NAME
}

static llm_status bind_layer(loader *L, int i, llm_layer *l)
{
    const llm_hparams *hp = &L->m->hp;
    int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    char n[96];
    llm_status st;
#define NAME(s) (snprintf(n, sizeof n, "blk.%d.%s", i, s), n)
    if ((st = bind_vector(L, NAME("attn_norm.weight"), hp->n_embd, &l->attn_norm, 0)) ||
        (st = bind_vector(L, NAME("ffn_norm.weight"), hp->n_embd, &l->ffn_norm, 0)) ||
        (st = bind_matrix(L, NAME("attn_q.weight"), hp->n_embd, qd, &l->wq)) ||
        (st = bind_matrix(L, NAME("attn_k.weight"), hp->n_embd, kvd, &l->wk)) ||
        (st = bind_matrix(L, NAME("attn_v.weight"), hp->n_embd, kvd, &l->wv)) ||
        (st = bind_matrix(L, NAME("attn_output.weight"), qd, hp->n_embd, &l->wo)))
        return st;
    if (hp->n_expert > 0)
        st = bind_experts(L, i, l);
    else if (!(st = bind_matrix(L, NAME("ffn_gate.weight"), hp->n_embd, hp->n_ff, &l->w_gate)) &&
             !(st = bind_matrix(L, NAME("ffn_up.weight"), hp->n_embd, hp->n_ff, &l->w_up)))
        st = bind_matrix(L, NAME("ffn_down.weight"), hp->n_ff, hp->n_embd, &l->w_down);
    if (st)
        return st;
    /* qwen2 always has Q/K/V biases; llama files may carry them too */
    if ((st = bind_vector(L, NAME("attn_q.bias"), qd, &l->bq, hp->arch != LLM_ARCH_QWEN2)) ||
        (st = bind_vector(L, NAME("attn_k.bias"), kvd, &l->bk, hp->arch != LLM_ARCH_QWEN2)) ||
        (st = bind_vector(L, NAME("attn_v.bias"), kvd, &l->bv, hp->arch != LLM_ARCH_QWEN2)))
        return st;
    int qk_norm = hp->arch == LLM_ARCH_QWEN3 || hp->arch == LLM_ARCH_QWEN3MOE || hp->arch == LLM_ARCH_GEMMA3,
        post = hp->arch == LLM_ARCH_GEMMA3;
    if ((st = bind_vector(L, NAME("attn_q_norm.weight"), hp->head_dim, &l->attn_q_norm, !qk_norm)) ||
        (st = bind_vector(L, NAME("attn_k_norm.weight"), hp->head_dim, &l->attn_k_norm, !qk_norm)))
        return st;
    if (!l->attn_q_norm != !l->attn_k_norm) /* the forward pass normalises Q and K together */
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: layer %d has %s but not %s", gguf_name(L->f), i,
                        l->attn_q_norm ? "attn_q_norm.weight" : "attn_k_norm.weight",
                        l->attn_q_norm ? "attn_k_norm.weight" : "attn_q_norm.weight");
    if (!post) /* a post-norm found in a family that has none would be ignored: refuse nothing, bind nothing */
        return LLM_OK;
    if ((st = bind_vector(L, NAME("post_attention_norm.weight"), hp->n_embd, &l->attn_post_norm, 0)) ||
        (st = bind_vector(L, NAME("post_ffw_norm.weight"), hp->n_embd, &l->ffn_post_norm, 0)))
        return st;
#undef NAME
    return LLM_OK;
}

static llm_status bind_all(loader *L)
{
    llm_model *m = L->m;
    llm_hparams *hp = &m->hp;
    const gguf_tensor *te = gguf_find_tensor(L->f, "token_embd.weight");
    if (!te || te->n_dims != 2)
        return llm_errf(L->err, LLM_ERR_FORMAT, "%s: missing or malformed tensor token_embd.weight", gguf_name(L->f));
    hp->n_vocab = (int)te->ne[1];
    llm_status st = bind_matrix(L, "token_embd.weight", hp->n_embd, hp->n_vocab, &m->tok_embd);
    if (!st)
        st = bind_vector(L, "output_norm.weight", hp->n_embd, &m->output_norm, 0);
    if (!st)
        st = bind_vector(L, "rope_freqs.weight", hp->rot_dim / 2, &m->rope_freqs, 1);
    if (st)
        return st;
    if (gguf_find_tensor(L->f, "output.weight"))
        st = bind_matrix(L, "output.weight", hp->n_embd, hp->n_vocab, &m->output);
    else
        m->output = m->tok_embd; /* tied embeddings */
    if (st)
        return st;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers)
        return llm_errf(L->err, LLM_ERR_NOMEM, "%s: no memory for %d layers", gguf_name(L->f), hp->n_layer);
    for (int i = 0; i < hp->n_layer; i++)
        if ((st = bind_layer(L, i, &m->layers[i])))
            return st;
    return layer_windows(L);
}

/* Every tensor holds finite numbers: a NaN or infinity in a weight (or a
 * block's scale) would reach the logits as NaN, so the file is refused
 * here, naming the tensor, rather than failing requests later. One pass
 * over the mapping (the first forward pass reads it all anyway). */
static llm_status check_finite(loader *L)
{
    for (uint64_t i = 0; i < gguf_n_tensors(L->f); i++) {
        const gguf_tensor *t = gguf_tensor_at(L->f, i);
        size_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) n *= (size_t)t->ne[d];
        if (!quant_supported(t->type))
            continue;
        size_t at = quant_find_nonfinite(t->type, t->data, n);
        if (at < n)
            return llm_errf(L->err, LLM_ERR_NUMERIC, "%s: tensor %.*s (%s) holds a NaN or infinity at element %zu%s",
                            gguf_name(L->f), (int)t->name.len, t->name.data, quant_type_name(t->type), at,
                            quant_block_elems(t->type) > 1 ? " (its block's scale)" : "");
    }
    return LLM_OK;
}

static void set_name(llm_model *m, const char *path)
{
    gguf_str s;
    if (gguf_get_str(m->gguf, "general.name", &s, NULL) == LLM_OK && s.len) {
        snprintf(m->name, sizeof m->name, "%.*s", (int)(s.len < 127 ? s.len : 127), s.data);
        return;
    }
    const char *base = strrchr(path, '/');
    snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
}

llm_status llm_model_load(const char *path, llm_model **out, llm_error *err)
{
    return llm_model_load_checked(path, NULL, NULL, out, err);
}

llm_status llm_model_load_checked(const char *path, gguf_part_check_fn check, void *ctx, llm_model **out, llm_error *err)
{
    *out = NULL;
    quant_init();
    llm_model *m = calloc(1, sizeof *m);
    if (!m)
        return llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for model", path);
    loader L = {m, NULL, {0}, err};
    llm_status st = gguf_open_checked(path, check, ctx, &m->gguf, err);
    if (st)
        goto out;
    L.f = m->gguf;
    if ((st = read_arch(&L)) || (st = read_hparams(&L)) || (st = bind_all(&L)) || (st = check_finite(&L)))
        goto out;
    if ((st = llm_vocab_load(m->gguf, &m->vocab, err)))
        goto out;
    if (llm_vocab_n(m->vocab) != m->hp.n_vocab) {
        st = llm_errf(err, LLM_ERR_FORMAT, "%s: tokenizer has %d tokens but token_embd.weight has %d rows", path,
                      llm_vocab_n(m->vocab), m->hp.n_vocab);
        goto out;
    }
    set_name(m, path);
    *out = m;
    return LLM_OK;
out:
    llm_model_free(m);
    return st;
}

int llm_model_windows(const llm_model *m, unsigned char *local)
{
    int w = 0;
    for (int l = 0; l < m->hp.n_layer; l++) {
        local[l] = m->layers[l].window > 0;
        w = m->layers[l].window > w ? m->layers[l].window : w;
    }
    return w;
}

void llm_model_free(llm_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->layers);
    llm_vocab_free(m->vocab);
    gguf_close(m->gguf);
    free(m);
}

size_t llm_model_weight_bytes(const llm_model *m)
{
    size_t n = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(m->gguf); i++) n += gguf_tensor_at(m->gguf, i)->nbytes;
    return n;
}

