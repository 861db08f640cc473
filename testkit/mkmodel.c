/* mkmodel.c - seeded random GGUF models of named shapes (see mkmodel.h).
 *
 * The vocabulary: 256 byte tokens (GPT-2 byte mapping), merges learned by a
 * few hundred rounds of BPE over a short built-in English text, then
 * deterministic synthetic merges up to the shape's vocab size, then two
 * control tokens (BOS, EOS). Every merge's result is a token, so the vocab
 * is a valid byte-level BPE vocab for any tokenizer that reads GGUF. */
#include "llm/mkmodel.h"

#include <math.h>
#include <string.h>

#include "llm/gguf_writer.h"
#include "llm/strmap.h"
#include "llm/tokenizer.h"
#include "llm/utf8.h"

static const llm_shape shapes[] = {
    {"tiny", "llama", "gpt-2", 256, 512, 2, 4, 2, 512, 512, 10000.f, 0, 0, 0, 0, 0, 0, 0},
    {"tiny-qwen2", "qwen2", "qwen2", 256, 512, 2, 4, 2, 512, 512, 1000000.f, 1, 0, 0, 0, 0, 0, 0},
    {"tiny-llama3", "llama", "llama-bpe", 256, 512, 2, 4, 1, 512, 512, 500000.f, 1, 0, 0, 0, 0, 0, 0},
    {"tiny-starcoder", "llama", "starcoder", 256, 512, 1, 4, 4, 512, 512, 10000.f, 0, 0, 0, 0, 0, 0, 0},
    {"llama-110m", "llama", "gpt-2", 768, 2048, 12, 12, 12, 32000, 1024, 10000.f, 0, 0, 0, 0, 0, 0, 0},
    {"tinyllama-1.1b", "llama", "gpt-2", 2048, 5632, 22, 32, 4, 32000, 2048, 10000.f, 0, 0, 0, 0, 0, 0, 0},
    {"llama-3.2-1b", "llama", "llama-bpe", 2048, 8192, 16, 32, 8, 128256, 131072, 500000.f, 1, 0, 0, 0, 0, 0, 0},
    {"qwen2-0.5b", "qwen2", "qwen2", 896, 4864, 24, 14, 2, 151936, 32768, 1000000.f, 1, 0, 0, 0, 0, 0, 0},
    {"llama-8b", "llama", "llama-bpe", 4096, 14336, 32, 32, 8, 128256, 131072, 500000.f, 0, 0, 0, 0, 0, 0, 0},
    /* head size unlike n_embd / n_head, as both families have */
    {"tiny-qwen3", "qwen3", "qwen2", 256, 512, 2, 4, 2, 512, 512, 1000000.f, 1, 96, 0, 0, 0, 0, 0},
    /* window 8 so a 21-token prompt crosses it; layers 0 and 2 local; 2 KV heads so TP=2 splits it */
    {"tiny-gemma3", "gemma3", "gpt-2", 256, 512, 4, 4, 2, 512, 512, 1000000.f, 1, 128, 8, 2, 0, 0, 0},
    {"qwen3-0.6b", "qwen3", "qwen2", 1024, 3072, 28, 16, 8, 151936, 40960, 1000000.f, 1, 128, 0, 0, 0, 0, 0},
    {"gemma3-270m", "gemma3", "gpt-2", 640, 2048, 18, 4, 1, 262144, 32768, 1000000.f, 1, 256, 512, 6, 0, 0, 0},
    /* 8 experts, 2 per token; expert rows of 256 so K-quants apply; 2 KV heads so TP=2 splits it */
    {"tiny-qwen3moe", "qwen3moe", "qwen2", 256, 512, 2, 4, 2, 512, 512, 1000000.f, 0, 64, 0, 0, 8, 2, 256},
    /* Qwen3-30B-A3B's layout (128 experts, 8 per token, head 128, 4 KV heads) scaled to ~1B parameters */
    {"qwen3moe-1b", "qwen3moe", "qwen2", 1024, 3072, 12, 16, 4, 151936, 40960, 1000000.f, 0, 128, 0, 0, 64, 8, 256},
};
#define N_SHAPES (sizeof shapes / sizeof *shapes)

const llm_shape *llm_shape_find(const char *name)
{
    for (size_t i = 0; i < N_SHAPES; i++)
        if (!strcmp(shapes[i].name, name))
            return &shapes[i];
    return NULL;
}

const char *const *llm_shape_names(void)
{
    static const char *names[N_SHAPES + 1];
    for (size_t i = 0; i < N_SHAPES; i++) names[i] = shapes[i].name;
    return names;
}

/* ---- vocabulary ---------------------------------------------------------- */

static const char corpus[] =
    "Once upon a time there was a little robot who lived in a quiet town by the sea. Every morning the "
    "robot walked to the harbour and counted the boats. One day a storm came and the boats were gone. "
    "The robot was sad, but the children of the town came to help. Together they built a new boat, and "
    "when the sun came back they sailed out on the water and laughed. The model reads the text, the "
    "model writes the answer, and the server sends the tokens to the client as fast as it can. In the "
    "beginning the engine loads the weights, then it runs the layers one after another for every token.";

typedef struct vocab_build {
    char **tok;      /* token texts (GPT-2 mapped), owned */
    int n;
    llm_strmap seen;     /* text -> id, to keep tokens unique */
    char **merges;   /* "left right", owned */
    int n_merges;
} vocab_build;

/* Takes ownership of s. Returns 0 added, 1 duplicate, -1 oom. */
static int vb_add(vocab_build *vb, char *s)
{
    if (!s)
        return -1;
    if (llm_strmap_get(&vb->seen, s, strlen(s)) >= 0) {
        free(s);
        return 1;
    }
    llm_strmap_put(&vb->seen, s, strlen(s), vb->n);
    vb->tok[vb->n++] = s;
    return 0;
}

static char *cat2(const char *a, const char *b, char sep)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    size_t k = la;
    if (sep)
        s[k++] = sep;
    memcpy(s + k, b, lb + 1);
    return s;
}

/* Adds merge (a, b) -> ab if ab is new. Returns 0 added, 1 skipped, -1 oom. */
static int vb_merge(vocab_build *vb, int a, int b)
{
    int rc = vb_add(vb, cat2(vb->tok[a], vb->tok[b], 0));
    if (rc)
        return rc;
    vb->merges[vb->n_merges] = cat2(vb->tok[a], vb->tok[b], ' ');
    return vb->merges[vb->n_merges++] ? 0 : -1;
}

/* One BPE training round over the corpus as token ids (a space starts a
 * word): merge the most frequent adjacent pair. 0 merged, 1 none, -1 oom. */
static int train_round(vocab_build *vb, int *q, int *n)
{
    int best = -1, best_n = 1;
    for (int i = 0; i + 1 < *n; i++) {
        if (q[i + 1] == ' ')
            continue;
        int c = 0;
        for (int j = i; j + 1 < *n; j++) c += q[j] == q[i] && q[j + 1] == q[i + 1];
        if (c > best_n) {
            best = i;
            best_n = c;
        }
    }
    if (best < 0)
        return 1;
    int a = q[best], b = q[best + 1], rc = vb_merge(vb, a, b);
    if (rc)
        return rc < 0 ? -1 : 1;
    int k = 0;
    for (int j = 0; j < *n; j++) {
        if (j + 1 < *n && q[j] == a && q[j + 1] == b) {
            q[k++] = vb->n - 1;
            j++;
        } else {
            q[k++] = q[j];
        }
    }
    *n = k;
    return 0;
}

static uint64_t mix(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int learn_corpus(vocab_build *vb, int n_normal)
{
    int n = (int)sizeof corpus - 1, rc = 0;
    int *q = malloc(sizeof(int) * (size_t)n);
    if (!q)
        return -1;
    for (int i = 0; i < n; i++) q[i] = (unsigned char)corpus[i]; /* byte b is token b */
    for (int r = 0; rc == 0 && r < 300 && vb->n < n_normal; r++) rc = train_round(vb, q, &n);
    free(q);
    return rc < 0 ? -1 : 0;
}

static int build_vocab(vocab_build *vb, int n_vocab, uint64_t seed)
{
    int n_normal = n_vocab - 2;
    vb->tok = calloc((size_t)n_vocab, sizeof(char *));
    vb->merges = calloc((size_t)n_vocab, sizeof(char *));
    if (!vb->tok || !vb->merges || n_normal < 256 || llm_strmap_init(&vb->seen, (size_t)n_vocab))
        return -1;
    for (int b = 0; b < 256; b++) {
        char buf[8];
        buf[llm_utf8_encode(llm_vocab_byte_cp((uint8_t)b), buf)] = 0;
        if (vb_add(vb, strdup(buf)))
            return -1;
    }
    if (learn_corpus(vb, n_normal))
        return -1;
    /* synthetic merges: pairs of printable tokens, deterministic in seed */
    uint64_t x = seed ^ 0x5eedull;
    while (vb->n < n_normal) {
        int a = 32 + (int)(mix(&x) % (uint64_t)(vb->n - 32)), b = 32 + (int)(mix(&x) % (uint64_t)(vb->n - 32));
        if (strlen(vb->tok[a]) + strlen(vb->tok[b]) <= 48 && vb_merge(vb, a, b) < 0)
            return -1;
    }
    return vb_add(vb, strdup("<|begin_of_text|>")) || vb_add(vb, strdup("<|end_of_text|>")) ? -1 : 0;
}

static void vb_free(vocab_build *vb)
{
    for (int i = 0; i < vb->n; i++) free(vb->tok[i]);
    for (int i = 0; i < vb->n_merges; i++) free(vb->merges[i]);
    free(vb->tok);
    free(vb->merges);
    llm_strmap_free(&vb->seen);
}

static llm_status write_vocab(gguf_writer *w, const vocab_build *vb, const llm_shape *s)
{
    int32_t *types = malloc(sizeof(int32_t) * (size_t)vb->n);
    if (!types)
        return LLM_ERR_NOMEM;
    for (int i = 0; i < vb->n; i++) types[i] = i >= vb->n - 2 ? 3 : 1; /* CONTROL : NORMAL */
    llm_status st = LLM_OK;
    if (gguf_writer_str(w, "tokenizer.ggml.model", "gpt2") || gguf_writer_str(w, "tokenizer.ggml.pre", s->pre) ||
        gguf_writer_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)vb->tok, (uint64_t)vb->n) ||
        gguf_writer_arr(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)vb->n) ||
        gguf_writer_arr_str(w, "tokenizer.ggml.merges", (const char *const *)vb->merges, (uint64_t)vb->n_merges) ||
        gguf_writer_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)vb->n - 2) ||
        gguf_writer_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)vb->n - 1) ||
        gguf_writer_bool(w, "tokenizer.ggml.add_bos_token", 1))
        st = LLM_ERR_NOMEM;
    free(types);
    return st;
}

/* ---- weights ------------------------------------------------------------- */

typedef struct wspec {
    char name[64];
    quant_type type;
    uint64_t cols, rows; /* rows 0: a vector */
    uint64_t n;          /* > 1: a stack of n matrices (experts), 3-D */
    float scale;         /* uniform in [-scale, scale]; 0: all ones (norms) */
} wspec;

typedef struct mk_ctx {
    wspec *w;
    int n;
    uint64_t seed;
} mk_ctx;

/* Q4_K_M-style: more bits for some attn_v / ffn_down layers (as llama.cpp). */
static int more_bits(int il, int n_layer) { return il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2; }

static quant_type pick_type(quant_type t, const char *name, uint64_t cols, int il, int n_layer)
{
    if (t == QT_Q4_K && (strstr(name, "attn_v") || strstr(name, "ffn_down")) && more_bits(il, n_layer))
        t = QT_Q6_K;
    if (quant_block_elems(t) == QK_K && cols % QK_K)
        t = QT_Q8_0; /* as llama.cpp: rows that do not fit a K block */
    return t;
}

static void add_w(mk_ctx *m, const char *name, quant_type t, uint64_t cols, uint64_t rows)
{
    wspec *w = &m->w[m->n++];
    snprintf(w->name, sizeof w->name, "%s", name);
    w->type = rows ? t : QT_F32;
    w->cols = cols;
    w->rows = rows;
    w->n = 1;
    /* ~1/sqrt(fan-in) keeps activations in range through many layers */
    w->scale = rows ? (float)(1.0 / sqrt((double)cols)) : 0.0f;
    if (strstr(name, "bias"))
        w->scale = 0.1f;
}

static uint64_t head_dim(const llm_shape *s) { return (uint64_t)(s->head_dim ? s->head_dim : s->n_embd / s->n_head); }

static void layer_weights(mk_ctx *m, const llm_shape *s, quant_type t, int il)
{
    uint64_t E = (uint64_t)s->n_embd, hd = head_dim(s), q = hd * (uint64_t)s->n_head, kv = hd * (uint64_t)s->n_head_kv;
    int gemma = !strcmp(s->arch, "gemma3");
    char n[64];
#define W(suffix, cols, rows) \
    (snprintf(n, sizeof n, "blk.%d.%s", il, suffix), add_w(m, n, pick_type(t, n, cols, il, s->n_layer), cols, rows))
    W("attn_norm.weight", E, 0);
    W("attn_q.weight", E, q);
    W("attn_k.weight", E, kv);
    W("attn_v.weight", E, kv);
    if (!strcmp(s->arch, "qwen2")) {
        W("attn_q.bias", q, 0);
        W("attn_k.bias", kv, 0);
        W("attn_v.bias", kv, 0);
    }
    if (gemma || !strncmp(s->arch, "qwen3", 5)) {
        W("attn_q_norm.weight", hd, 0);
        W("attn_k_norm.weight", hd, 0);
    }
    W("attn_output.weight", q, E);
    if (gemma)
        W("post_attention_norm.weight", E, 0);
    W("ffn_norm.weight", E, 0);
    if (s->n_expert) { /* the router stays F32, as llama-quantize leaves it */
        uint64_t ne = (uint64_t)s->n_expert, ff = (uint64_t)s->n_ff_exp;
        snprintf(n, sizeof n, "blk.%d.ffn_gate_inp.weight", il);
        add_w(m, n, QT_F32, E, ne);
        W("ffn_gate_exps.weight", E, ff), m->w[m->n - 1].n = ne;
        W("ffn_up_exps.weight", E, ff), m->w[m->n - 1].n = ne;
        W("ffn_down_exps.weight", ff, E), m->w[m->n - 1].n = ne;
    } else {
        W("ffn_gate.weight", E, (uint64_t)s->n_ff);
        W("ffn_up.weight", E, (uint64_t)s->n_ff);
        W("ffn_down.weight", (uint64_t)s->n_ff, E);
    }
    if (gemma)
        W("post_ffw_norm.weight", E, 0);
#undef W
}

static int fill(void *ctx, int i, void *dst, size_t nbytes)
{
    mk_ctx *m = ctx;
    const wspec *w = &m->w[i];
    uint64_t rows = (w->rows ? w->rows : 1) * w->n, x = m->seed * 1000003ull + (uint64_t)i;
    float *row = malloc(sizeof(float) * w->cols);
    if (!row)
        return -1;
    size_t rb = quant_row_bytes(w->type, w->cols);
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t c = 0; c < w->cols; c++)
            row[c] = w->scale ? w->scale * (float)((double)(mix(&x) >> 11) * (2.0 / 9007199254740992.0) - 1.0) : 1.0f;
        quant_quantize_row(w->type, row, (char *)dst + r * rb, w->cols);
    }
    free(row);
    return rows * rb == nbytes ? 0 : -1;
}

/* llama.cpp's LLAMA_FTYPE for a file of type t (mixes as their _M kind). */
static uint32_t file_type(quant_type t)
{
    static const struct { quant_type t; uint32_t ft; } map[] = {
        {QT_F32, 0}, {QT_F16, 1}, {QT_Q4_0, 2}, {QT_Q4_1, 3}, {QT_Q8_0, 7}, {QT_Q5_0, 8}, {QT_Q5_1, 9},
        {QT_Q2_K, 10}, {QT_Q3_K, 12}, {QT_Q4_K, 15}, {QT_Q5_K, 17}, {QT_Q6_K, 18}, {QT_BF16, 32},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++)
        if (map[i].t == t)
            return map[i].ft;
    return 32;
}

static llm_status write_hparams(gguf_writer *w, const llm_shape *s, quant_type t)
{
    char k[96];
    llm_status st = LLM_OK;
#define KEY(suffix) (snprintf(k, sizeof k, "%s.%s", s->arch, suffix), k)
    st |= gguf_writer_str(w, "general.architecture", s->arch);
    st |= gguf_writer_str(w, "general.name", s->name);
    st |= gguf_writer_u32(w, "general.file_type", file_type(t));
    st |= gguf_writer_u32(w, KEY("context_length"), (uint32_t)s->n_ctx);
    st |= gguf_writer_u32(w, KEY("embedding_length"), (uint32_t)s->n_embd);
    st |= gguf_writer_u32(w, KEY("feed_forward_length"), (uint32_t)s->n_ff);
    st |= gguf_writer_u32(w, KEY("block_count"), (uint32_t)s->n_layer);
    st |= gguf_writer_u32(w, KEY("attention.head_count"), (uint32_t)s->n_head);
    st |= gguf_writer_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    st |= gguf_writer_u32(w, KEY("rope.dimension_count"), (uint32_t)head_dim(s));
    if (s->head_dim) {
        st |= gguf_writer_u32(w, KEY("attention.key_length"), (uint32_t)s->head_dim);
        st |= gguf_writer_u32(w, KEY("attention.value_length"), (uint32_t)s->head_dim);
    }
    if (s->n_expert) {
        st |= gguf_writer_u32(w, KEY("expert_count"), (uint32_t)s->n_expert);
        st |= gguf_writer_u32(w, KEY("expert_used_count"), (uint32_t)s->n_expert_used);
        st |= gguf_writer_u32(w, KEY("expert_feed_forward_length"), (uint32_t)s->n_ff_exp);
    }
    if (s->n_swa) {
        st |= gguf_writer_u32(w, KEY("attention.sliding_window"), (uint32_t)s->n_swa);
        st |= gguf_writer_u32(w, KEY("attention.sliding_window_pattern"), (uint32_t)s->swa_pattern);
    }
    st |= gguf_writer_f32(w, KEY("rope.freq_base"), s->rope_theta);
    st |= gguf_writer_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
#undef KEY
    return st ? LLM_ERR_NOMEM : LLM_OK;
}

static void model_weights(mk_ctx *m, const llm_shape *s, quant_type t)
{
    uint64_t E = (uint64_t)s->n_embd, V = (uint64_t)s->n_vocab;
    quant_type emb = t == QT_Q4_K && s->tied ? QT_Q6_K : t;
    add_w(m, "token_embd.weight", pick_type(emb, "token_embd", E, 0, s->n_layer), E, V);
    for (int il = 0; il < s->n_layer; il++) layer_weights(m, s, t, il);
    add_w(m, "output_norm.weight", t, E, 0);
    if (!s->tied)
        add_w(m, "output.weight", pick_type(t == QT_Q4_K ? QT_Q6_K : t, "output", E, 0, s->n_layer), E, V);
    m->w[0].scale = 1.0f; /* embeddings: unit scale, the norms follow */
}

llm_status llm_mkmodel(const llm_shape *s, quant_type t, uint64_t seed, const char *path, llm_error *err)
{
    if (t == QT_Q8_K || !quant_supported(t))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "mkmodel: type %s not offered (F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                        "Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K)", quant_type_name(t) ? quant_type_name(t) : "?");
    quant_init();
    mk_ctx m = {calloc((size_t)s->n_layer * 20 + 8, sizeof(wspec)), 0, seed};
    vocab_build vb = {0};
    gguf_writer *w = gguf_writer_new();
    llm_status st = LLM_OK;
    if (!m.w || !w || build_vocab(&vb, s->n_vocab, seed)) {
        st = llm_errf(err, LLM_ERR_NOMEM, "mkmodel: no memory for shape %s", s->name);
        goto out;
    }
    model_weights(&m, s, t);
    if (write_hparams(w, s, t) || write_vocab(w, &vb, s)) {
        st = llm_errf(err, LLM_ERR_NOMEM, "mkmodel: no memory for metadata");
        goto out;
    }
    for (int i = 0; i < m.n && !st; i++) {
        uint64_t ne[3] = {m.w[i].cols, m.w[i].rows, m.w[i].n};
        st = gguf_writer_tensor(w, m.w[i].name, m.w[i].type, m.w[i].n > 1 ? 3 : m.w[i].rows ? 2 : 1, ne);
        if (st)
            llm_errf(err, st, "mkmodel: tensor %s (%s, %llu cols) rejected", m.w[i].name,
                     quant_type_name(m.w[i].type), (unsigned long long)m.w[i].cols);
    }
    if (!st)
        st = gguf_writer_write(w, path, fill, &m, err);
out:
    gguf_writer_free(w);
    vb_free(&vb);
    free(m.w);
    return st;
}

/* ---- LoRA adapters ------------------------------------------------------------------------------ */

/* name is a layer's attention or dense MLP projection (what adapters adapt). */
static int adaptable(const gguf_tensor *t)
{
    static const char *const projs[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    char n[96], proj[40];
    int layer, at = 0;
    if (t->n_dims != 2 || t->name.len >= sizeof n)
        return 0;
    memcpy(n, t->name.data, t->name.len);
    n[t->name.len] = 0;
    if (sscanf(n, "blk.%d.%39[a-z_].weight%n", &layer, proj, &at) != 2 || n[at])
        return 0;
    for (size_t i = 0; i < sizeof projs / sizeof *projs; i++)
        if (!strcmp(proj, projs[i]))
            return 1;
    return 0;
}

llm_status llm_mklora(const char *base_path, int rank, float alpha, quant_type t, uint64_t seed, const char *path,
                      llm_error *err)
{
    if (rank < 1 || (t != QT_F32 && t != QT_F16 && t != QT_BF16 && t != QT_Q8_0) ||
        (t == QT_Q8_0 && rank % 32))
        return llm_errf(err, LLM_ERR_INVALID_ARG, "mklora: rank %d, type %s (F32, F16, BF16, or Q8_0 with a rank "
                        "that is a multiple of 32)", rank, quant_type_name(t) ? quant_type_name(t) : "?");
    quant_init();
    gguf_file *base;
    llm_status st = gguf_open(base_path, &base, err);
    if (st)
        return st;
    const gguf_kv *arch = gguf_find(base, "general.architecture");
    mk_ctx m = {calloc(2 * gguf_n_tensors(base) + 1, sizeof(wspec)), 0, seed};
    gguf_writer *w = gguf_writer_new();
    char a[64] = "";
    if (arch && arch->type == GGUF_TYPE_STRING)
        snprintf(a, sizeof a, "%.*s", (int)(arch->v.str.len < 63 ? arch->v.str.len : 63), arch->v.str.data);
    if (!m.w || !w || gguf_writer_str(w, "general.architecture", a) || gguf_writer_str(w, "general.type", "adapter") ||
        gguf_writer_str(w, "adapter.type", "lora") || gguf_writer_str(w, "general.name", "mklora") ||
        (alpha > 0 && gguf_writer_f32(w, "adapter.lora.alpha", alpha)))
        st = llm_errf(err, LLM_ERR_NOMEM, "mklora: no memory");
    for (uint64_t i = 0; !st && i < gguf_n_tensors(base); i++) {
        const gguf_tensor *bt = gguf_tensor_at(base, i);
        if (!adaptable(bt))
            continue;
        char n[96];
        snprintf(n, sizeof n, "%.*s.lora_a", (int)bt->name.len, bt->name.data);
        add_w(&m, n, t, bt->ne[0], (uint64_t)rank); /* A: rank rows of in, ~1/sqrt(in) */
        snprintf(n, sizeof n, "%.*s.lora_b", (int)bt->name.len, bt->name.data);
        add_w(&m, n, t, (uint64_t)rank, bt->ne[1]); /* B: out rows of rank, ~1/sqrt(rank) */
    }
    for (int i = 0; i < m.n && !st; i++) {
        uint64_t ne[2] = {m.w[i].cols, m.w[i].rows};
        if ((st = gguf_writer_tensor(w, m.w[i].name, m.w[i].type, 2, ne)))
            llm_errf(err, st, "mklora: tensor %s rejected", m.w[i].name);
    }
    if (!st && !m.n)
        st = llm_errf(err, LLM_ERR_INVALID_ARG, "mklora: %s has no attention or dense MLP projection", base_path);
    if (!st)
        st = gguf_writer_write(w, path, fill, &m, err);
    gguf_writer_free(w);
    free(m.w);
    gguf_close(base);
    return st;
}
