/* test_model.c - the forward pass against a float64 reference written
 * plainly here, on small random models made by llm_mkmodel (llama shape
 * with GQA and adjacent-pair RoPE; qwen2 shape with biases, NEOX RoPE and
 * tied embeddings), plus model-loading errors.
 *
 * Tolerances, as max |logit - ref| / max |ref| over the vocabulary:
 *   F32 weights: 1e-4 (only float32 rounding differs).
 *   F16, BF16: the reference uses the same decoded weights, so 1e-4 too.
 *   Q8_0, Q4_0, Q4_K (with Q6_K): activations are quantized to 8 bits per
 *   block before every matmul (weights are the same decoded values), an
 *   error of about 1/254 of each block's range per matmul that grows over
 *   the layers: bound 3e-2, measured values are printed. */
#include <math.h>
#include <stddef.h>

#include "testutil.h"

#include "llm/gguf_writer.h"
#include "llm/mkmodel.h"
#include "llm/kv_cache.h"
#include "llm/forward.h"
#include "llm/lora.h"
#include "llm/model.h"

/* ---- float64 reference ----------------------------------------------------- */

static double *deq(const llm_weight *w)
{
    size_t n = (size_t)w->rows * (size_t)w->cols;
    double *d = malloc(sizeof(double) * n);
    float *row = malloc(sizeof(float) * (size_t)w->cols);
    for (int64_t r = 0; r < w->rows; r++) {
        quant_dequantize_row(w->type, (const char *)w->data + (size_t)r * w->row_bytes, row, (size_t)w->cols);
        for (int64_t c = 0; c < w->cols; c++) d[(size_t)r * (size_t)w->cols + (size_t)c] = row[c];
    }
    free(row);
    return d;
}

static void mat(const llm_weight *w, const double *x, double *y)
{
    double *d = deq(w);
    for (int64_t r = 0; r < w->rows; r++) {
        double s = 0;
        for (int64_t c = 0; c < w->cols; c++) s += d[(size_t)r * (size_t)w->cols + (size_t)c] * x[c];
        y[r] = s;
    }
    free(d);
}

/* The reference's adapter: NULL, or this one at this scale. */
static const llm_lora *g_ref_lora;
static double g_ref_scale;

/* mat, plus s * B (A x) when the reference's adapter adapts projection p
 * of layer l (float64 throughout, s = scale * alpha / rank). */
static void mat_l(const llm_weight *w, int l, llm_lora_proj p, const double *x, double *y)
{
    mat(w, x, y);
    const llm_lora_mat *a = g_ref_lora ? llm_lora_mat_at(g_ref_lora, l, p) : NULL;
    if (!a || a->rank == 0)
        return;
    double s = g_ref_lora->alpha > 0 ? g_ref_scale * g_ref_lora->alpha / a->rank : g_ref_scale;
    for (int o = 0; o < a->out; o++) {
        double acc = 0;
        for (int k = 0; k < a->rank; k++) {
            double t = 0;
            for (int i = 0; i < a->in; i++) t += (double)llm_lora_mat_a_at(a, k, i) * x[i];
            acc += (double)llm_lora_mat_b_at(a, o, k) * t;
        }
        y[o] += s * acc;
    }
}

static void rms(const double *x, const float *w, int n, double eps, double *o)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) o[i] = x[i] * s * w[i];
}

static void rope(double *v, int n_head, int hd, int rot, int pos, double theta, int neox)
{
    for (int h = 0; h < n_head; h++)
        for (int i = 0; i < rot / 2; i++) {
            double a = pos * pow(theta, -2.0 * i / rot), c = cos(a), s = sin(a);
            double *p = v + h * hd;
            int i0 = neox ? i : 2 * i, i1 = neox ? i + rot / 2 : 2 * i + 1;
            double x0 = p[i0], x1 = p[i1];
            p[i0] = x0 * c - x1 * s;
            p[i1] = x0 * s + x1 * c;
        }
}

static void add_b(double *x, const float *b, int n)
{
    for (int i = 0; b && i < n; i++) x[i] += b[i];
}

/* Logits after feeding tokens[0..n) one position at a time (with
 * g_ref_lora's adapter when set). */
static double *ref_forward(const llm_model *m, const int32_t *tokens, int n)
{
    const llm_hparams *hp = &m->hp;
    int E = hp->n_embd, hd = hp->head_dim, qd = hp->n_head * hd, kvd = hp->n_head_kv * hd, F = hp->n_ff;
    double *kc = calloc((size_t)hp->n_layer * n * kvd, 8), *vc = calloc((size_t)hp->n_layer * n * kvd, 8);
    double *x = malloc(8 * (size_t)E), *xb = malloc(8 * (size_t)(qd > E ? qd : E)), *q = malloc(8 * (size_t)qd);
    double *att = malloc(8 * (size_t)qd), *g = malloc(8 * (size_t)F), *u = malloc(8 * (size_t)F), *sc = malloc(8 * (size_t)n);
    double *logits = malloc(8 * (size_t)hp->n_vocab), *emb = deq(&m->tok_embd);
    for (int p = 0; p < n; p++) {
        for (int i = 0; i < E; i++) x[i] = emb[(size_t)tokens[p] * E + i];
        for (int l = 0; l < hp->n_layer; l++) {
            const llm_layer *L = &m->layers[l];
            double *k = kc + ((size_t)l * n + p) * kvd, *v = vc + ((size_t)l * n + p) * kvd;
            rms(x, L->attn_norm, E, hp->eps, xb);
            mat_l(&L->wq, l, LLM_LORA_Q, xb, q); mat_l(&L->wk, l, LLM_LORA_K, xb, k); mat_l(&L->wv, l, LLM_LORA_V, xb, v);
            add_b(q, L->bq, qd); add_b(k, L->bk, kvd); add_b(v, L->bv, kvd);
            rope(q, hp->n_head, hd, hp->rot_dim, p, hp->rope_theta, hp->rope_neox);
            rope(k, hp->n_head_kv, hd, hp->rot_dim, p, hp->rope_theta, hp->rope_neox);
            for (int h = 0; h < hp->n_head; h++) {
                int kh = h / (hp->n_head / hp->n_head_kv);
                double mx = -INFINITY, sum = 0;
                for (int t = 0; t <= p; t++) {
                    double s = 0;
                    for (int i = 0; i < hd; i++) s += q[h * hd + i] * kc[((size_t)l * n + t) * kvd + kh * hd + i];
                    sc[t] = s / sqrt(hd);
                    mx = fmax(mx, sc[t]);
                }
                for (int t = 0; t <= p; t++) sum += (sc[t] = exp(sc[t] - mx));
                for (int i = 0; i < hd; i++) {
                    double o = 0;
                    for (int t = 0; t <= p; t++) o += sc[t] / sum * vc[((size_t)l * n + t) * kvd + kh * hd + i];
                    att[h * hd + i] = o;
                }
            }
            mat_l(&L->wo, l, LLM_LORA_O, att, xb);
            for (int i = 0; i < E; i++) x[i] += xb[i];
            rms(x, L->ffn_norm, E, hp->eps, xb);
            mat_l(&L->w_gate, l, LLM_LORA_GATE, xb, g); mat_l(&L->w_up, l, LLM_LORA_UP, xb, u);
            for (int i = 0; i < F; i++) g[i] = g[i] / (1 + exp(-g[i])) * u[i];
            mat_l(&L->w_down, l, LLM_LORA_DOWN, g, xb);
            for (int i = 0; i < E; i++) x[i] += xb[i];
        }
    }
    rms(x, m->output_norm, E, hp->eps, xb);
    mat(&m->output, xb, logits);
    free(kc); free(vc); free(x); free(xb); free(q); free(att); free(g); free(u); free(sc); free(emb);
    return logits;
}

/* ---- helpers --------------------------------------------------------------- */

static llm_model *make_model(const char *shape, quant_type t, char *path, size_t n)
{
    char tag[64];
    snprintf(tag, sizeof tag, "%s-%s", shape, quant_type_name(t));
    test_tmpfile(tag, path, n);
    llm_error err = {0};
    if (llm_mkmodel(llm_shape_find(shape), t, 7, path, &err))
        fail_msg("mkmodel: %s", err.msg);
    llm_model *m;
    if (llm_model_load(path, &m, &err))
        fail_msg("load: %s", err.msg);
    return m;
}

static double rel_err(const float *a, const double *ref, int n)
{
    double md = 0, mr = 0;
    for (int i = 0; i < n; i++) {
        md = fmax(md, fabs(a[i] - ref[i]));
        mr = fmax(mr, fabs(ref[i]));
    }
    return md / mr;
}

static const int32_t prompt[] = {510, 3, 77, 200, 9, 131, 64};
#define NP ((int)(sizeof prompt / sizeof *prompt))
/* 21 tokens in one batch: two 8-token tiles, one 4-token tile, one single */
static const int32_t long_prompt[] = {510, 3, 77, 200, 9, 131, 64, 300, 12, 45, 99, 400, 250, 7, 18, 260,
                                      301, 402, 33, 71, 5};

static llm_kv_type g_kv = LLM_KV_F32; /* KV type of the sessions below */

static double engine_vs_ref_with(const char *shape, quant_type t, int scalar, const int32_t *toks, int n, int batch)
{
    char path[256];
    llm_model *m = make_model(shape, t, path, sizeof path);
    llm_backend *b;
    llm_session *s;
    llm_cpu_config cc = {.n_threads = 2, .force_scalar = scalar, .kernels = NULL};
    llm_error err = {0};
    assert_int_equal(llm_backend_cpu_new(&cc, &b, &err), LLM_OK);
    assert_int_equal(llm_session_new(m, b, &(llm_session_config){.n_ctx = 64, .max_batch = batch, .kv_type = (int)g_kv}, &s, &err), LLM_OK);
    const float *logits;
    assert_int_equal(llm_session_eval(s, toks, n, &logits, &err), LLM_OK);
    double *ref = ref_forward(m, toks, n);
    double e = rel_err(logits, ref, m->hp.n_vocab);
    print_message("%-10s %-5s %-6s %2d tokens, batch %3d, kv %-4s: rel err %.3g\n", shape, quant_type_name(t),
                  scalar ? "scalar" : "simd", n, batch, llm_kv_type_name(g_kv), e);
    free(ref);
    llm_session_free(s);
    llm_backend_free(b);
    llm_model_free(m);
    remove(path);
    return e;
}

/* A LoRA adapter (rank 8 with alpha 16, every projection, F32 or F16) on
 * the F32 tiny models at scale 0.75: the forward pass (chunks of 4,
 * through a session) against the float64 reference that adds s B (A x) to
 * each projection; 1e-4 as for the plain F32 models. The same positions
 * without the adapter must be far off, so the adapter is what is checked. */
static void test_lora_vs_ref(void **st)
{
    (void)st;
    const char *shapes[] = {"tiny", "tiny-qwen2"};
    quant_type lt[] = {QT_F32, QT_F16};
    for (int i = 0; i < 2; i++) {
        char path[256], lpath[256];
        llm_model *m = make_model(shapes[i], QT_F32, path, sizeof path);
        llm_backend *b;
        llm_session *s;
        llm_lora *l;
        llm_error err = {0};
        test_tmpfile("lora-ref", lpath, sizeof lpath);
        assert_int_equal(llm_mklora(path, 8, 16, lt[i], 9, lpath, &err), LLM_OK);
        assert_int_equal(llm_lora_load(lpath, m, 0, &l, &err), LLM_OK);
        assert_int_equal(llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 2}, &b, &err), LLM_OK);
        llm_session_config sc = {.n_ctx = 64, .max_batch = 4, .kv_type = LLM_KV_F32, .lora = l, .lora_scale = 0.75f};
        assert_int_equal(llm_session_new(m, b, &sc, &s, &err), LLM_OK);
        const float *logits;
        assert_int_equal(llm_session_eval(s, prompt, NP, &logits, &err), LLM_OK);
        double *plain = ref_forward(m, prompt, NP);
        g_ref_lora = l, g_ref_scale = 0.75;
        double *ref = ref_forward(m, prompt, NP);
        g_ref_lora = NULL;
        double e = rel_err(logits, ref, m->hp.n_vocab), off = rel_err(logits, plain, m->hp.n_vocab);
        print_message("%-10s + %s adapter: rel err %.3g (%.3g from the plain model's)\n", shapes[i],
                      quant_type_name(lt[i]), e, off);
        assert_true(e < 1e-4);
        assert_true(off > 1e-2);
        free(ref);
        free(plain);
        llm_session_free(s);
        llm_backend_free(b);
        llm_lora_free(l);
        llm_model_free(m);
        remove(path);
        remove(lpath);
    }
}

/* The short prompt in batches of 4: chunked prefill through 4-token tiles. */
static double engine_vs_ref(const char *shape, quant_type t, int scalar)
{
    return engine_vs_ref_with(shape, t, scalar, prompt, NP, 4);
}

static double engine_vs_ref_long(const char *shape, quant_type t)
{
    return engine_vs_ref_with(shape, t, 0, long_prompt, (int)(sizeof long_prompt / sizeof *long_prompt), 512);
}

static void test_long_prompts(void **st)
{
    (void)st;
    assert_true(engine_vs_ref_long("tiny", QT_Q8_0) < 3e-2);
    assert_true(engine_vs_ref_long("tiny", QT_Q4_K) < 3e-2);
    assert_true(engine_vs_ref_long("tiny-qwen2", QT_F16) < 1e-4);
    assert_true(engine_vs_ref_long("tiny-llama3", QT_F32) < 1e-4);
}

static void test_f32_llama(void **st) { (void)st; assert_true(engine_vs_ref("tiny", QT_F32, 0) < 1e-4); }
static void test_f32_qwen2(void **st) { (void)st; assert_true(engine_vs_ref("tiny-qwen2", QT_F32, 0) < 1e-4); }
static void test_f32_scalar(void **st) { (void)st; assert_true(engine_vs_ref("tiny", QT_F32, 1) < 1e-4); }
static void test_f16(void **st) { (void)st; assert_true(engine_vs_ref("tiny", QT_F16, 0) < 1e-4); }
static void test_bf16(void **st) { (void)st; assert_true(engine_vs_ref("tiny-qwen2", QT_BF16, 0) < 1e-4); }
static void test_q8_0(void **st) { (void)st; assert_true(engine_vs_ref("tiny", QT_Q8_0, 0) < 3e-2); }
static void test_q4_0(void **st) { (void)st; assert_true(engine_vs_ref("tiny", QT_Q4_0, 0) < 3e-2); }
static void test_q4_k(void **st) { (void)st; assert_true(engine_vs_ref("tiny-qwen2", QT_Q4_K, 0) < 3e-2); }
static void test_q4_k_scalar(void **st) { (void)st; assert_true(engine_vs_ref("tiny", QT_Q4_K, 1) < 3e-2); }

/* The KV cache's own rounding: F16 keeps 11 significant bits of K and V,
 * Q8_0 eight bits per block of 32 (and on the avx512 set the query is
 * rounded alike for integer scores; measured: see the printed errors). */
static void test_kv_types(void **st)
{
    (void)st;
    g_kv = LLM_KV_F16;
    double f16 = engine_vs_ref_long("tiny", QT_F32), f16q = engine_vs_ref_long("tiny-qwen2", QT_F32);
    g_kv = LLM_KV_Q8_0;
    double q8 = engine_vs_ref_long("tiny", QT_F32);
    g_kv = LLM_KV_F32;
    assert_true(f16 < 4e-4 && f16q < 4e-4); /* measured 4e-5, 1e-5 */
    assert_true(q8 < 8e-3);                 /* measured 8e-4 */
}

/* Prefill in one call, in chunks, or token by token: same logits. */
static void test_incremental(void **state)
{
    (void)state;
    char path[256];
    llm_model *m = make_model("tiny", QT_F32, path, sizeof path);
    llm_backend *b;
    llm_session *s1, *s2;
    llm_error err = {0};
    assert_int_equal(llm_backend_cpu_new(NULL, &b, &err), LLM_OK);
    assert_int_equal(llm_session_new(m, b, &(llm_session_config){.n_ctx = 32, .max_batch = 512, .kv_type = LLM_KV_F32}, &s1, &err), LLM_OK);
    assert_int_equal(llm_session_new(m, b, &(llm_session_config){.n_ctx = 32, .max_batch = 512, .kv_type = LLM_KV_F32}, &s2, &err), LLM_OK);
    const float *l1, *l2;
    uint64_t mm0, at0, mm1, at1;
    llm_backend_cpu_times(b, &mm0, &at0);
    assert_true(mm0 == 0 && at0 == 0); /* a new backend */
    assert_int_equal(llm_session_eval(s1, prompt, NP, &l1, &err), LLM_OK);
    llm_backend_cpu_times(b, &mm1, &at1); /* llm-bench's step split: both counted */
    assert_true(mm1 > 0 && at1 > 0);
    for (int i = 0; i < NP; i++) assert_int_equal(llm_session_eval(s2, prompt + i, 1, &l2, &err), LLM_OK);
    for (int i = 0; i < m->hp.n_vocab; i++) assert_true(fabsf(l1[i] - l2[i]) <= 1e-5f * (1 + fabsf(l1[i])));
    /* bad input changes nothing */
    int32_t bad = m->hp.n_vocab;
    assert_int_equal(llm_session_eval(s1, &bad, 1, &l1, &err), LLM_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "token id"));
    assert_int_equal(llm_session_pos(s1), NP);
    int32_t many[40] = {0};
    assert_int_equal(llm_session_eval(s1, many, 40, &l1, &err), LLM_ERR_TOO_LONG);
    assert_int_equal(llm_session_pos(s1), NP);
    llm_session_free(s1);
    llm_session_free(s2);
    llm_backend_free(b);
    llm_model_free(m);
    remove(path);
}

/* Logits of a prompt whole (K/V blocks converted to float once for all its
 * rows) or token by token (one row: F16 and Q8_0 rows read in place) are
 * equal bit for bit for every K/V type: a row's attention must not depend
 * on the path its batch took. F32 weights, since quantizing activations
 * to 8 bits would hide a difference of one rounding (it did: a Q8_0 scale
 * off by one ulp in the in-place kernels passed with Q8_0 weights). 40
 * tokens: three KV blocks. */
static void test_incremental_kv(void **state)
{
    (void)state;
    char path[256];
    llm_model *m = make_model("tiny", QT_F32, path, sizeof path);
    llm_backend *b;
    llm_error err = {0};
    enum { N = 40 };
    int32_t p[N];
    for (int i = 0; i < N; i++) p[i] = (int32_t)((i * 37 + 11) % m->hp.n_vocab);
    assert_int_equal(llm_backend_cpu_new(NULL, &b, &err), LLM_OK);
    static const llm_kv_type types[] = {LLM_KV_F32, LLM_KV_F16, LLM_KV_Q8_0};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        llm_session *s1, *s2;
        llm_session_config c = {.n_ctx = 64, .max_batch = 512, .kv_type = types[t]};
        assert_int_equal(llm_session_new(m, b, &c, &s1, &err), LLM_OK);
        assert_int_equal(llm_session_new(m, b, &c, &s2, &err), LLM_OK);
        const float *l1, *l2;
        assert_int_equal(llm_session_eval(s1, p, N, &l1, &err), LLM_OK);
        for (int i = 0; i < N; i++) assert_int_equal(llm_session_eval(s2, p + i, 1, &l2, &err), LLM_OK);
        if (memcmp(l1, l2, sizeof(float) * (size_t)m->hp.n_vocab))
            fail_msg("K/V type %zu: logits of the prompt whole differ from token by token", t);
        llm_session_free(s1);
        llm_session_free(s2);
    }
    llm_backend_free(b);
    llm_model_free(m);
    remove(path);
}

/* Rewrites the first occurrence of `from` (same length as `to`). */
static void patch_file(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    for (size_t i = 0; i + strlen(from) <= n; i++)
        if (!memcmp(buf + i, from, strlen(from))) {
            fseek(f, (long)i, SEEK_SET);
            fwrite(to, 1, strlen(to), f);
            fclose(f);
            return;
        }
    fclose(f);
    fail_msg("'%s' not found in %s", from, path);
}

/* Every occurrence of from (in the first MiB) replaced by to. */
static void patch_all(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f), hits = 0;
    for (size_t i = 0; i + strlen(from) <= n; i++)
        if (!memcmp(buf + i, from, strlen(from))) {
            fseek(f, (long)i, SEEK_SET);
            fwrite(to, 1, strlen(to), f);
            hits++;
        }
    fclose(f);
    if (!hits)
        fail_msg("'%s' not found in %s", from, path);
}

/* A qwen3 file relabelled llama (same key prefix length) whose layer 0
 * lost attn_k_norm: llama binds Q/K norms when present, but only both. */
static void test_one_qk_norm_refused(void **state)
{
    (void)state;
    char path[256];
    test_tmpfile("qknorm", path, sizeof path);
    llm_error err = {0};
    assert_int_equal(llm_mkmodel(llm_shape_find("tiny-qwen3"), QT_F32, 1, path, &err), LLM_OK);
    patch_all(path, "qwen3", "llama");
    patch_file(path, "blk.0.attn_k_norm", "blk.0.attn_k_norX");
    llm_model *m = (llm_model *)1;
    assert_int_not_equal(llm_model_load(path, &m, &err), LLM_OK);
    assert_null(m);
    if (!strstr(err.msg, "layer 0 has attn_q_norm.weight but not attn_k_norm.weight"))
        fail_msg("message '%s'", err.msg);
    remove(path);
}

static void expect_shape_error(const char *shape, const char *from, const char *to, const char *needle)
{
    char path[256];
    test_tmpfile("bad", path, sizeof path);
    llm_error err = {0};
    assert_int_equal(llm_mkmodel(llm_shape_find(shape), QT_F32, 1, path, &err), LLM_OK);
    patch_file(path, from, to);
    llm_model *m = (llm_model *)1;
    assert_int_not_equal(llm_model_load(path, &m, &err), LLM_OK);
    assert_null(m);
    if (!strstr(err.msg, needle))
        fail_msg("message '%s' lacks '%s'", err.msg, needle);
    remove(path);
}

static void expect_load_error(const char *from, const char *to, const char *needle)
{
    expect_shape_error("tiny", from, to, needle);
}

/* A model file with one value (or one block scale) set to bits: the load
 * must refuse it with LLM_ERR_NUMERIC naming the tensor and element. */
static void expect_nonfinite(const char *shape, quant_type qt, const char *tensor, size_t byte, const void *bits,
                             size_t n_bits, const char *want)
{
    char path[256], bad[300];
    llm_error err = {0};
    test_tmpfile("finite", path, sizeof path);
    snprintf(bad, sizeof bad, "%s.bad", path);
    assert_int_equal(llm_mkmodel(llm_shape_find(shape), qt, 3, path, &err), LLM_OK);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    size_t size = (size_t)ftell(fp);
    rewind(fp);
    uint8_t *buf = malloc(size);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, size, fp), size);
    fclose(fp);
    gguf_file *g;
    assert_int_equal(gguf_open_buffer(buf, size, "buf", &g, &err), LLM_OK);
    const gguf_tensor *t = gguf_find_tensor(g, tensor);
    assert_non_null(t);
    size_t at = (size_t)((const uint8_t *)t->data - buf) + byte;
    gguf_close(g);
    memcpy(buf + at, bits, n_bits);
    fp = fopen(bad, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(buf, 1, size, fp), size);
    fclose(fp);
    free(buf);
    llm_model *m = NULL;
    if (llm_model_load(path, &m, &err))
        fail_msg("%s", err.msg); /* the untouched file loads */
    llm_model_free(m);
    llm_status st = llm_model_load(bad, &m, &err);
    if (st != LLM_ERR_NUMERIC)
        fail_msg("status %d: %s", st, err.msg);
    assert_null(m);
    if (!strstr(err.msg, want))
        fail_msg("'%s' does not say '%s'", err.msg, want);
    remove(path);
    remove(bad);
}

/* NaN and infinity in F32 norms, F16 and BF16 weights, and Q8_0 / Q4_K
 * block scales are found at load, with the tensor's name. */
static void test_nonfinite_weights(void **state)
{
    (void)state;
    const float nan = NAN;
    const uint16_t f16_inf = 0x7c00, bf16_nan = 0x7fc0, f16_nan = 0x7e00;
    expect_nonfinite("tiny", QT_F32, "output_norm.weight", 5 * 4, &nan, 4, "output_norm.weight (F32) holds a NaN or infinity at element 5");
    expect_nonfinite("tiny", QT_F32, "blk.1.attn_norm.weight", 0, &nan, 4, "blk.1.attn_norm.weight");
    expect_nonfinite("tiny", QT_F16, "token_embd.weight", 100 * 2, &f16_inf, 2, "token_embd.weight (F16) holds a NaN or infinity at element 100");
    expect_nonfinite("tiny-qwen2", QT_BF16, "blk.1.ffn_down.weight", 7 * 2, &bf16_nan, 2, "blk.1.ffn_down.weight (BF16)");
    expect_nonfinite("tiny", QT_Q8_0, "blk.0.attn_q.weight", 3 * sizeof(block_q8_0), &f16_nan, 2,
                     "blk.0.attn_q.weight (Q8_0) holds a NaN or infinity at element 96 (its block's scale)");
    expect_nonfinite("tiny", QT_Q4_K, "blk.0.ffn_up.weight", sizeof(block_q4_K) + offsetof(block_q4_K, dmin), &f16_inf, 2,
                     "blk.0.ffn_up.weight (Q4_K) holds a NaN or infinity at element 256");
}

/* A token id outside the vocabulary never reaches the embedding lookup:
 * the forward pass refuses the batch before running it. */
static void test_forward_token_bounds(void **state)
{
    (void)state;
    char path[256];
    llm_error err = {0};
    llm_model *m = NULL;
    llm_backend *b = NULL;
    llm_forward *f = NULL;
    kv_cache *kv = NULL;
    test_tmpfile("bounds", path, sizeof path);
    assert_int_equal(llm_mkmodel(llm_shape_find("tiny"), QT_F32, 3, path, &err), LLM_OK);
    assert_int_equal(llm_model_load(path, &m, &err), LLM_OK);
    assert_int_equal(llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 1, .force_scalar = 0, .kernels = NULL}, &b, &err), LLM_OK);
    assert_int_equal(llm_forward_new(m, b, 4, 4, &f, &err), LLM_OK);
    kv_cache_config kc = {.block_size = 16, .type = LLM_KV_F32, .n_blocks = 1};
    assert_int_equal(kv_cache_new(&kc, b, m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim, &kv, &err), LLM_OK);
    int32_t table[1] = {0}, rows[1] = {1}, nv = m->hp.n_vocab;
    const int32_t bad[][2] = {{1, nv}, {-1, 2}, {3, 1 << 30}};
    for (int i = 0; i < 3; i++) {
        llm_batch_seq sq = {.tok0 = 0, .n_tok = 2, .pos0 = 0, .block_table = table};
        llm_forward_batch bt = {.tokens = bad[i], .n_rows = 2, .seqs = &sq, .n_seqs = 1, .logit_rows = rows, .n_logits = 1};
        const float *lg = NULL;
        assert_int_equal(llm_forward_eval(f, &bt, kv_cache_layers(kv), &lg), LLM_ERR_INVALID_ARG);
    }
    kv_cache_free(kv);
    llm_forward_free(f);
    llm_backend_free(b);
    llm_model_free(m);
    remove(path);
}

static void test_load_errors(void **state)
{
    (void)state;
    expect_load_error("llama\x0c", "llamb\x0c", "architecture 'llamb' is not supported");
    expect_load_error("blk.1.ffn_up.weight", "blk.1.ffn_uX.weight", "missing tensor blk.1.ffn_up.weight");
    expect_load_error("llama.block_count", "llama.block_coun_", "missing required key llama.block_count");
    expect_load_error("gpt-2", "gpt-9", "pre-tokenizer 'gpt-9'");
    /* the RMS epsilon 1e-5 (0x3727c5ac, little-endian in the metadata) made negative */
    expect_load_error("\xac\xc5\x27\x37", "\xac\xc5\x27\xb7", "layer_norm_rms_epsilon -1e-05 must be finite");
    /* a mixture of experts without its counts or one of its stacks */
    expect_shape_error("tiny-qwen3moe", "expert_used_count", "expert_used_counX",
                       "missing required key qwen3moe.expert_used_count");
    expect_shape_error("tiny-qwen3moe", "blk.1.ffn_down_exps", "blk.1.ffn_down_expX",
                       "missing tensor blk.1.ffn_down_exps.weight");
    expect_shape_error("tiny-qwen3moe", "blk.0.ffn_gate_inp", "blk.0.ffn_gate_inX",
                       "missing tensor blk.0.ffn_gate_inp.weight");
}

/* A part of a gguf-split set whose name hides the others is refused by
 * name (split.no is 0-based), not on the first tensor that lives in
 * another part. (Whole sets: test_gguf.c and test_split.py.) */
static void test_split_part_refused(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_new();
    assert_non_null(w);
    assert_int_equal(gguf_writer_u32(w, "split.no", 1), LLM_OK);
    assert_int_equal(gguf_writer_u32(w, "split.count", 3), LLM_OK);
    assert_int_equal(gguf_writer_u32(w, "split.tensors.count", 3), LLM_OK);
    assert_int_equal(gguf_writer_str(w, "general.architecture", "llama"), LLM_OK);
    char path[256];
    test_tmpfile("split", path, sizeof path);
    llm_error err = {0};
    assert_int_equal(gguf_writer_write(w, path, NULL, NULL, &err), LLM_OK);
    gguf_writer_free(w);
    llm_model *m = NULL;
    assert_int_equal(llm_model_load(path, &m, &err), LLM_ERR_FORMAT);
    assert_null(m);
    assert_non_null(strstr(err.msg, "part 2 of 3 of a split GGUF whose name does not end in -00002-of-00003.gguf"));
    remove(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f32_llama), cmocka_unit_test(test_f32_qwen2), cmocka_unit_test(test_f32_scalar),
        cmocka_unit_test(test_f16), cmocka_unit_test(test_bf16), cmocka_unit_test(test_q8_0),
        cmocka_unit_test(test_q4_0), cmocka_unit_test(test_q4_k), cmocka_unit_test(test_q4_k_scalar),
        cmocka_unit_test(test_long_prompts), cmocka_unit_test(test_kv_types), cmocka_unit_test(test_incremental),
        cmocka_unit_test(test_incremental_kv), cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_one_qk_norm_refused),
        cmocka_unit_test(test_nonfinite_weights), cmocka_unit_test(test_forward_token_bounds),
        cmocka_unit_test(test_split_part_refused), cmocka_unit_test(test_lora_vs_ref),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
