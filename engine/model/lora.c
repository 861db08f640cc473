/* lora.c - LoRA adapters in llama.cpp's GGUF format; see lora.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/lora.h"
#include "llm/quant.h"

static const char *const proj_names[LLM_LORA_N_PROJ] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                                       "ffn_gate", "ffn_up", "ffn_down"};

static int str_is(gguf_str s, const char *c)
{
    return s.len == strlen(c) && !memcmp(s.data, c, s.len);
}

/* A string key equal to want; else the error naming it. */
static llm_status want_str(const gguf_file *f, const char *name, const char *key, const char *want, llm_error *err)
{
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv || kv->type != GGUF_TYPE_STRING)
        return llm_errf(err, LLM_ERR_FORMAT, "%s: no %s: not a LoRA adapter", name, key);
    if (!str_is(kv->v.str, want))
        return llm_errf(err, LLM_ERR_FORMAT, "%s: %s is '%.*s', not '%s': not a LoRA adapter", name, key,
                        (int)(kv->v.str.len > 64 ? 64 : kv->v.str.len), kv->v.str.data, want);
    return LLM_OK;
}

static const llm_weight *base_weight(const llm_model *m, int layer, llm_lora_proj p)
{
    const llm_layer *l = &m->layers[layer];
    const llm_weight *w[LLM_LORA_N_PROJ] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w_gate, &l->w_up, &l->w_down};
    return w[p]->data ? w[p] : NULL; /* an MoE layer has no dense MLP */
}

/* "blk.N.PROJ.weight.lora_a|b": the layer, the projection and which (0 a, 1
 * b); -1 with the reason for a name this loader does not take. */
static int parse_name(gguf_str s, int n_layer, int *layer, llm_lora_proj *p, int *which, char *why, size_t wn)
{
    char n[160];
    if (s.len >= sizeof n) {
        snprintf(why, wn, "a tensor name of %llu bytes", (unsigned long long)s.len);
        return -1;
    }
    memcpy(n, s.data, s.len);
    n[s.len] = 0;
    size_t len = strlen(n);
    if (len != s.len || len < 7 || (strcmp(n + len - 7, ".lora_a") && strcmp(n + len - 7, ".lora_b"))) {
        snprintf(why, wn, "tensor '%.100s' is neither NAME.lora_a nor NAME.lora_b", n);
        return -1;
    }
    *which = n[len - 1] == 'b';
    n[len - 7] = 0;
    char proj[40];
    int at = 0;
    char again[160];
    /* written back the one way the base names it ("blk.01", "blk.+1" are not its tensors) */
    if (sscanf(n, "blk.%d.%39[a-z_].weight%n", layer, proj, &at) != 2 || n[at] != 0 || at == 0 ||
        (snprintf(again, sizeof again, "blk.%d.%s.weight", *layer, proj), strcmp(again, n))) {
        snprintf(why, wn, "'%.100s' is not a layer's attention or MLP projection (only those are adapted)", n);
        return -1;
    }
    if (*layer < 0 || *layer >= n_layer) {
        snprintf(why, wn, "'%.100s': the base has %d layers", n, n_layer);
        return -1;
    }
    for (int k = 0; k < LLM_LORA_N_PROJ; k++)
        if (!strcmp(proj, proj_names[k])) {
            *p = (llm_lora_proj)k;
            return 0;
        }
    snprintf(why, wn, strstr(proj, "_exps") ? "'%.100s': adapters of MoE experts are not supported"
                                            : "'%.100s' is not an attention or MLP projection (only those are adapted)",
             n);
    return -1;
}

/* Element i of a stored F16 or F32 matrix as float. */
static float value_at(quant_type t, const void *p, size_t i)
{
    return t == QT_F16 ? quant_f16_to_f32(((const quant_f16 *)p)[i]) : ((const float *)p)[i];
}

/* How a tensor of type t is kept: F16 as it is, everything else as F32. */
static quant_type kept_type(quant_type t)
{
    return t == QT_F16 ? QT_F16 : QT_F32;
}

/* The tensor's n values into dst as kept_type keeps them; -1 on a type
 * this loader does not take or a value that is not finite. */
static int copy_values(const gguf_tensor *t, void *dst, size_t n, char *why, size_t wn)
{
    if (t->type != QT_F32 && t->type != QT_F16 && t->type != QT_BF16 && t->type != QT_Q8_0) {
        snprintf(why, wn, "'%.*s' is %s (F32, F16, BF16 or Q8_0 expected)", (int)(t->name.len > 100 ? 100 : t->name.len),
                 t->name.data, quant_type_name(t->type));
        return -1;
    }
    quant_type kept = kept_type(t->type);
    size_t cols = (size_t)t->ne[0], rb = quant_row_bytes(t->type, cols);
    if (kept == QT_F16)
        memcpy(dst, t->data, n * sizeof(quant_f16)); /* F16 rows have no padding */
    else
        for (size_t r = 0; r < n / cols; r++)
            quant_dequantize_row(t->type, (const char *)t->data + r * rb, (float *)dst + r * cols, cols);
    for (size_t i = 0; i < n; i++) {
        float v = value_at(kept, dst, i);
        if (!isfinite(v)) {
            snprintf(why, wn, "'%.*s' holds a value that is not finite (element %zu)",
                     (int)(t->name.len > 100 ? 100 : t->name.len), t->name.data, i);
            return -1;
        }
    }
    return 0;
}

/* *m (rows x cols elements of size es) replaced by its transpose; -2
 * without memory. */
static int transpose(void **m, size_t rows, size_t cols, size_t es, char *why, size_t wn)
{
    char *t = malloc(rows * cols * es);
    if (!t) {
        snprintf(why, wn, "no memory for %zu values", rows * cols);
        return -2;
    }
    const char *src = *m;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) memcpy(t + (c * rows + r) * es, src + (r * cols + c) * es, es);
    free(*m);
    *m = t;
    return 0;
}

/* The caller's rank limit: <= 0 or above LLM_LORA_MAX_RANK is that maximum. */
static int rank_limit(int max_rank)
{
    return max_rank <= 0 || max_rank > LLM_LORA_MAX_RANK ? LLM_LORA_MAX_RANK : max_rank;
}

/* One tensor into its matrix: shape checked against W and the other half. */
static int take(llm_lora *l, const llm_model *base, const gguf_tensor *t, int max_rank, char *why, size_t wn)
{
    int layer, which;
    llm_lora_proj p;
    if (parse_name(t->name, base->hp.n_layer, &layer, &p, &which, why, wn))
        return -1;
    const llm_weight *w = base_weight(base, layer, p);
    llm_lora_mat *m = &l->mats[layer * LLM_LORA_N_PROJ + p];
    const char *tn = which ? "lora_b" : "lora_a";
    if (!w) {
        snprintf(why, wn, "blk.%d.%s: the base has no such dense projection (an MoE layer)", layer, proj_names[p]);
        return -1;
    }
    /* a: ne [in, rank]; b: ne [rank, out] */
    uint64_t len = t->ne[0], rows = t->ne[1];
    int64_t side = which ? w->rows : w->cols;
    uint64_t rank = which ? len : rows;
    if (t->n_dims != 2 || (which ? rows : len) != (uint64_t)side) {
        snprintf(why, wn, "blk.%d.%s.weight.%s has shape [%llu, %llu]; W is %lld x %lld (a: [in, rank], b: [rank, out])",
                 layer, proj_names[p], tn, (unsigned long long)len, (unsigned long long)rows, (long long)w->rows,
                 (long long)w->cols);
        return -1;
    }
    if (rank < 1 || rank > (uint64_t)max_rank || rank > (uint64_t)w->rows || rank > (uint64_t)w->cols) {
        snprintf(why, wn, "blk.%d.%s.weight.%s: rank %llu (at least 1, at most %d and W's smaller side)", layer,
                 proj_names[p], tn, (unsigned long long)rank, max_rank);
        return -1;
    }
    if ((m->rank && m->rank != (int)rank) || (which ? m->bt : m->a)) {
        snprintf(why, wn, "blk.%d.%s.weight: lora_a and lora_b disagree on the rank, or one comes twice", layer,
                 proj_names[p]);
        return -1;
    }
    quant_type kept = kept_type(t->type);
    size_t n = (size_t)len * (size_t)rows, es = quant_row_bytes(kept, 1);
    void *dst = malloc(n * es);
    if (!dst) {
        snprintf(why, wn, "no memory for %zu values", n);
        return -2;
    }
    int bad = copy_values(t, dst, n, why, wn);
    if (!bad && which) /* B is kept transposed: a row's B t is then rank scaled additions of contiguous rows */
        bad = transpose(&dst, (size_t)rows, (size_t)len, es, why, wn);
    if (bad) {
        free(dst);
        return bad;
    }
    m->rank = (int)rank, m->in = (int)w->cols, m->out = (int)w->rows;
    *(which ? &m->bt : &m->a) = dst;
    *(which ? &m->b_type : &m->a_type) = kept;
    l->bytes += n * es;
    return 0;
}

/* alpha: absent, or finite in (0, LLM_LORA_MAX_ALPHA]. */
static llm_status read_alpha(const gguf_file *f, const char *name, float *alpha, llm_error *err)
{
    const gguf_kv *kv = gguf_find(f, "adapter.lora.alpha");
    *alpha = 0;
    if (!kv)
        return LLM_OK;
    double a = kv->type == GGUF_TYPE_FLOAT32 || kv->type == GGUF_TYPE_FLOAT64 ? kv->v.f64 : NAN;
    if (!(a > 0 && a <= LLM_LORA_MAX_ALPHA))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "%s: adapter.lora.alpha %g (a float above 0, at most %g)", name, a,
                        (double)LLM_LORA_MAX_ALPHA);
    *alpha = (float)a;
    return LLM_OK;
}

/* Every A has its B and the other way round; the largest rank, the count. */
static llm_status complete(llm_lora *l, const char *name, llm_error *err)
{
    for (int i = 0; i < l->n_layer * LLM_LORA_N_PROJ; i++) {
        llm_lora_mat *m = &l->mats[i];
        if (!m->a != !m->bt)
            return llm_errf(err, LLM_ERR_FORMAT, "%s: blk.%d.%s.weight has lora_%s without lora_%s", name,
                            i / LLM_LORA_N_PROJ, proj_names[i % LLM_LORA_N_PROJ], m->a ? "a" : "b", m->a ? "b" : "a");
        if (m->a) {
            l->n_mats++;
            l->max_rank = m->rank > l->max_rank ? m->rank : l->max_rank;
        }
    }
    return l->n_mats ? LLM_OK : llm_errf(err, LLM_ERR_FORMAT, "%s: no lora_a/lora_b tensors", name);
}

llm_status llm_lora_from_gguf(const gguf_file *f, const char *name, const llm_model *base, int max_rank,
                              llm_lora **out, llm_error *err)
{
    *out = NULL;
    max_rank = rank_limit(max_rank);
    const gguf_kv *arch = gguf_find(base->gguf, "general.architecture");
    char want[64];
    snprintf(want, sizeof want, "%.*s", arch && arch->type == GGUF_TYPE_STRING ? (int)(arch->v.str.len > 63 ? 63 : arch->v.str.len) : 0,
             arch && arch->type == GGUF_TYPE_STRING ? arch->v.str.data : "");
    llm_status st = want_str(f, name, "general.type", "adapter", err);
    if (!st)
        st = want_str(f, name, "adapter.type", "lora", err);
    if (!st && (st = want_str(f, name, "general.architecture", want, err)))
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "%s: an adapter for another architecture than the base's %s", name,
                      want);
    float alpha = 0;
    if (!st)
        st = read_alpha(f, name, &alpha, err);
    if (st)
        return st;
    llm_lora *l = calloc(1, sizeof *l);
    if (!l || !(l->mats = calloc((size_t)base->hp.n_layer * LLM_LORA_N_PROJ, sizeof *l->mats))) {
        free(l);
        return llm_errf(err, LLM_ERR_NOMEM, "%s: no memory for the adapter", name);
    }
    l->alpha = alpha, l->n_layer = base->hp.n_layer;
    char why[320];
    for (uint64_t i = 0; !st && i < gguf_n_tensors(f); i++) {
        int r = take(l, base, gguf_tensor_at(f, i), max_rank, why, sizeof why);
        if (r)
            st = llm_errf(err, r == -2 ? LLM_ERR_NOMEM : LLM_ERR_INVALID_ARG, "%s: %s", name, why);
    }
    if (!st)
        st = complete(l, name, err);
    if (st) {
        llm_lora_free(l);
        return st;
    }
    *out = l;
    return LLM_OK;
}

/* The largest file an adapter of base can be: every dense projection
 * adapted at the largest rank allowed, in F32 (the widest type), and room
 * for metadata and alignment. Reading more than this is refused before
 * any of it is copied. */
static size_t max_file_bytes(const llm_model *base, int max_rank)
{
    max_rank = rank_limit(max_rank);
    size_t total = LLM_LORA_FILE_SLACK;
    for (int layer = 0; layer < base->hp.n_layer; layer++)
        for (int p = 0; p < LLM_LORA_N_PROJ; p++) {
            const llm_weight *w = base_weight(base, layer, (llm_lora_proj)p);
            if (!w)
                continue;
            int64_t r = max_rank;
            r = r < w->rows ? r : w->rows;
            r = r < w->cols ? r : w->cols;
            total += (size_t)r * (size_t)(w->rows + w->cols) * sizeof(float) + 2 * 64;
        }
    return total;
}

llm_status llm_lora_load(const char *path, const llm_model *base, int max_rank, llm_lora **out, llm_error *err)
{
    return llm_lora_load_checked(path, base, max_rank, NULL, NULL, out, err);
}

llm_status llm_lora_load_checked(const char *path, const llm_model *base, int max_rank, gguf_check_fn check, void *ctx,
                                 llm_lora **out, llm_error *err)
{
    gguf_file *f;
    *out = NULL;
    /* A copy, not a mapping: adapters are loaded while serving, and a file
     * truncated under a mapping would fault the whole server. */
    llm_status st = gguf_read_checked(path, max_file_bytes(base, max_rank), check, ctx, &f, err);
    if (st)
        return st;
    st = llm_lora_from_gguf(f, path, base, max_rank, out, err);
    gguf_close(f);
    return st;
}

void llm_lora_free(llm_lora *l)
{
    if (!l)
        return;
    for (int i = 0; l->mats && i < l->n_layer * LLM_LORA_N_PROJ; i++) {
        free(l->mats[i].a);
        free(l->mats[i].bt);
    }
    free(l->mats);
    free(l);
}

const llm_lora_mat *llm_lora_mat_at(const llm_lora *l, int layer, llm_lora_proj p)
{
    if (!l || layer < 0 || layer >= l->n_layer || (int)p < 0 || p >= LLM_LORA_N_PROJ)
        return NULL;
    return &l->mats[layer * LLM_LORA_N_PROJ + p];
}

float llm_lora_factor(const llm_lora *l, const llm_lora_mat *m, float scale)
{
    return l->alpha > 0 && m->rank > 0 ? scale * l->alpha / (float)m->rank : scale;
}

float llm_lora_mat_a_at(const llm_lora_mat *m, int k, int i)
{
    return value_at(m->a_type, m->a, (size_t)k * m->in + i);
}

float llm_lora_mat_b_at(const llm_lora_mat *m, int o, int k)
{
    return value_at(m->b_type, m->bt, (size_t)k * m->out + o);
}

size_t llm_lora_mat_a_bytes(const llm_lora_mat *m)
{
    return (size_t)m->rank * quant_row_bytes(m->a_type, (size_t)m->in);
}

size_t llm_lora_mat_b_bytes(const llm_lora_mat *m)
{
    return (size_t)m->rank * quant_row_bytes(m->b_type, (size_t)m->out);
}

void llm_lora_apply(const llm_lora_mat *m, float s, const float *x, int n, float *y)
{
    float t[LLM_LORA_MAX_RANK];
    for (int r = 0; r < n && m->rank > 0; r++) {
        const float *xr = x + (size_t)r * m->in;
        for (int k = 0; k < m->rank; k++) {
            float acc = 0;
            for (int i = 0; i < m->in; i++) acc += llm_lora_mat_a_at(m, k, i) * xr[i];
            t[k] = acc;
        }
        float *yr = y + (size_t)r * m->out;
        for (int o = 0; o < m->out; o++) {
            float acc = 0;
            for (int k = 0; k < m->rank; k++) acc += llm_lora_mat_b_at(m, o, k) * t[k];
            yr[o] += s * acc; /* scaled after B, as llama.cpp does */
        }
    }
}
