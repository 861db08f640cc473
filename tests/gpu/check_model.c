/* check_model.c - a whole model on the CUDA backend against the CPU backend
 * (tests/gpu/run.sh): logits after a 100-token prompt (the cuBLAS path) and
 * after each of 16 single-token steps (the GEMV path), then greedy tokens.
 *
 *   check_model MODEL.gguf [-n 64] [--scalar]
 *
 * --scalar puts the CPU backend's scalar kernels in the GPU's place, so the
 * harness itself runs (and is tried) on machines without a GPU.
 *
 * Logits are compared by ||gpu - cpu|| / ||cpu|| over each row, against a
 * tolerance set by the weights' type (the prompt's at least 3e-3: cuBLAS
 * takes half or TF32 inputs, the tensor-core attention rounds Q and the
 * softmax weights to half): F32 weights 1e-3 (float32 arithmetic in another
 * order, and the CPU's vectorised exp; its own scalar and AVX2 kernels
 * differ by 2e-4 on stories260K); F16/BF16 3e-3 (cuBLAS rounds activations
 * to the weights' half type for the prompt); quantized 3e-2 (the CPU
 * quantizes activations to 8 bits in its dot products, the GPU keeps them
 * float, TF32 in the prompt's GEMM). Greedy tokens: both backends are fed the CPU's choices (teacher
 * forcing) and must pick the same token at every step where the CPU's top
 * two logits are further apart than 4x the largest logit difference seen;
 * closer steps are counted, not failed. The prompt's final hidden states
 * (what /v1/embeddings pools, read back from the device) are held to the
 * prompt's tolerance row by row (a quantized mixture of experts: 1 row in
 * 16 may take another expert, and differ by up to 0.25). Exit 0 pass, 1 fail, 2 no device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/forward.h"
#include "llm/kv_cache.h"
#include "llm/model.h"

/* Single steps (GEMV, decode attention, all in float32 on the GPU): the
 * weights' type decides. The prompt (cuBLAS with half or TF32 inputs,
 * tensor-core attention rounding Q and the softmax weights to half) gets
 * at least 3e-3. */
static double tolerance(const llm_model *m, int prompt)
{
    double t;
    switch (m->layers[0].wq.type) {
    case QT_F32: t = 1e-3; break;
    case QT_F16:
    case QT_BF16: t = 3e-3; break;
    default: t = 3e-2;
    }
    return prompt && t < 3e-3 ? 3e-3 : t;
}

/* ||a - b|| / ||b|| and the largest |a - b|. */
static double rel_err(const float *a, const float *b, int n, double *maxd)
{
    double num = 0, den = 0;
    *maxd = 0;
    for (int i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        if (d != d)
            return INFINITY; /* NaN never passes */
        num += d * d;
        den += (double)b[i] * b[i];
        if (fabs(d) > *maxd)
            *maxd = fabs(d);
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* The top id and its margin over the runner-up. */
static int top2(const float *v, int n, double *margin)
{
    int a = 0, b = -1;
    for (int i = 1; i < n; i++) {
        if (v[i] > v[a]) {
            b = a;
            a = i;
        } else if (b < 0 || v[i] > v[b]) {
            b = i;
        }
    }
    *margin = b < 0 ? INFINITY : (double)v[a] - v[b];
    return a;
}

/* Every row's final hidden state after n prompt tokens in one pass on b,
 * into out (n, n_embd). */
static int hidden_of(const llm_model *m, llm_backend *b, const int32_t *t, int n, float *out, llm_error *err)
{
    kv_cache *kv = NULL;
    llm_forward *f = NULL;
    kv_cache_config kc = {.type = LLM_KV_F16, .n_blocks = (n + 15) / 16 + 1};
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n), last = n - 1;
    kv_seq s;
    kv_seq_init(&s);
    int rc = -1;
    llm_status st = LLM_OK;
    if (!rows || kv_cache_new(&kc, b, m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim, &kv, err) ||
        llm_forward_new(m, b, n, 1, &f, err) || (st = kv_seq_reserve(kv, &s, n))) {
        if (st || !rows)
            llm_errf(err, st ? st : LLM_ERR_NOMEM, "hidden states: %s", st ? llm_status_str(st) : "no memory");
        goto out;
    }
    for (int i = 0; i < n; i++) rows[i] = i;
    llm_batch_seq bs = {0, n, 0, s.blocks, NULL};
    llm_forward_batch bt = {t, n, &bs, 1, &last, 1, rows, n, NULL};
    const float *lg;
    if ((st = llm_forward_eval(f, &bt, kv_cache_layers(kv), &lg)) || !llm_forward_hidden(f)) {
        llm_errf(err, st ? st : LLM_ERR_INTERNAL, "hidden states: the pass %s", st ? llm_status_str(st) : "gave none");
        goto out;
    }
    memcpy(out, llm_forward_hidden(f), sizeof(float) * (size_t)n * m->hp.n_embd);
    rc = 0;
out:
    if (kv)
        kv_seq_release(kv, &s);
    llm_forward_free(f);
    kv_cache_free(kv);
    free(rows);
    return rc;
}

/* The worst row's ||gpu - cpu|| / ||cpu|| of the prompt's hidden states,
 * and in *over the rows past tol; -1 when either pass failed. */
static double hidden_rel(const llm_model *m, llm_backend *cpu, llm_backend *gpu, const int32_t *t, int n, double tol,
                         int *over, llm_error *err)
{
    size_t d = (size_t)m->hp.n_embd;
    float *a = malloc(sizeof(float) * (size_t)n * d), *g = malloc(sizeof(float) * (size_t)n * d);
    double worst = -1, maxd;
    if (a && g && !hidden_of(m, cpu, t, n, a, err) && !hidden_of(m, gpu, t, n, g, err)) {
        worst = 0;
        for (int i = 0; i < n; i++) {
            double r = rel_err(g + (size_t)i * d, a + (size_t)i * d, (int)d, &maxd);
            worst = r > worst || r != r ? r : worst;
            *over += !(r <= tol);
        }
    }
    free(a);
    free(g);
    return worst;
}

typedef struct side {
    llm_backend *b;
    llm_session *s;
    float *logits;
} side;

static int eval(side *sd, const int32_t *t, int n, int n_vocab, llm_error *err)
{
    const float *lg;
    if (llm_session_eval(sd->s, t, n, &lg, err))
        return -1;
    memcpy(sd->logits, lg, sizeof(float) * (size_t)n_vocab);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: check_model MODEL.gguf [-n 64]\n");
        return 2;
    }
    int n_gen = 64, scalar = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--scalar"))
            scalar = 1;
        else if (!strcmp(argv[i], "-n") && i + 1 < argc && strtol(argv[i + 1], NULL, 10) > 0)
            n_gen = (int)strtol(argv[++i], NULL, 10);
        else {
            fprintf(stderr, "check_model: unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    llm_error err = {0};
    llm_model *m = NULL;
    side cpu = {0}, gpu = {0};
    llm_cuda_config gc = {0};
    if (llm_model_load(argv[1], &m, &err) || llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 0, .force_scalar = 0, .kernels = NULL}, &cpu.b, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    if (scalar ? llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 0, .force_scalar = 1, .kernels = NULL}, &gpu.b, &err) : llm_backend_cuda_new(&gc, &gpu.b, &err)) {
        fprintf(stderr, "no device: %s\n", err.msg);
        return 2;
    }
    int nv = m->hp.n_vocab, n_prompt = 100, rc = 0;
    llm_session_config sc = {.n_ctx = n_prompt + n_gen + 32, .max_batch = 512, .kv_type = 0};
    cpu.logits = malloc(sizeof(float) * (size_t)nv);
    gpu.logits = malloc(sizeof(float) * (size_t)nv);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n_prompt + n_gen + 32));
    if (!cpu.logits || !gpu.logits || !toks || llm_session_new(m, cpu.b, &sc, &cpu.s, &err) ||
        llm_session_new(m, gpu.b, &sc, &gpu.s, &err)) {
        fprintf(stderr, "error: %s\n", err.msg[0] ? err.msg : "no memory");
        return 1;
    }
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < n_prompt; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)nv);
    }
    double tol = tolerance(m, 0), tol_prompt = tolerance(m, 1), worst_prompt = 0, worst_step = 0, worst_abs = 0, maxd;
    int agree = 0, close_steps = 0, must_fail = 0;
    if (eval(&cpu, toks, n_prompt, nv, &err) || eval(&gpu, toks, n_prompt, nv, &err)) {
        fprintf(stderr, "error: %s\n", err.msg);
        return 1;
    }
    worst_prompt = rel_err(gpu.logits, cpu.logits, nv, &maxd);
    worst_abs = maxd;
    for (int i = 0; i < n_gen; i++) {
        double margin, gm;
        int want = top2(cpu.logits, nv, &margin), got = top2(gpu.logits, nv, &gm);
        if (want == got)
            agree++;
        else if (margin > 4 * worst_abs)
            must_fail++;
        else
            close_steps++;
        toks[n_prompt + i] = want;
        if (eval(&cpu, &toks[n_prompt + i], 1, nv, &err) || eval(&gpu, &toks[n_prompt + i], 1, nv, &err)) {
            fprintf(stderr, "error: %s\n", err.msg);
            return 1;
        }
        double r = rel_err(gpu.logits, cpu.logits, nv, &maxd);
        worst_step = r > worst_step ? r : worst_step;
        worst_abs = maxd > worst_abs ? maxd : worst_abs;
    }
    int over = 0;
    double hid = hidden_rel(m, cpu.b, gpu.b, toks, n_prompt, tol_prompt, &over, &err);
    if (hid < 0)
        fprintf(stderr, "%s\n", err.msg[0] ? err.msg : "hidden states: no memory");
    /* A quantized mixture of experts: a row whose two best router scores
     * are closer than the 8-bit activations' error takes another expert on
     * one backend (measured: tiny-qwen3moe Q4_K, 2 of 80 rows 0.10-0.11
     * away, at mkmodel seed 3 on the avx512vnni set and at seed 7 on the
     * packed avx512 set; every other row within 3e-2). Such rows may be
     * 1 in 16, each within 0.25; every other model holds every row. */
    int moe_q = m->hp.n_expert && m->layers[0].wq.type != QT_F32;
    int hid_ok = hid >= 0 && (moe_q ? over <= n_prompt / 16 && hid <= 0.25 : hid <= tol_prompt);
    if (!(worst_prompt <= tol_prompt) || !(worst_step <= tol) || must_fail || !hid_ok)
        rc = 1;
    printf("model=%s backend=%s type=%s prompt_rel=%.2e hidden_rel=%.2e hidden_over=%d step_rel=%.2e max_abs=%.2e tol=%.0e/%.0e greedy_agree=%d/%d close=%d wrong=%d %s\n",
           m->name, gpu.b->iface->name, quant_type_name(m->layers[0].wq.type), worst_prompt, hid, over, worst_step, worst_abs, tol_prompt, tol, agree, n_gen,
           close_steps, must_fail, rc ? "FAIL" : "ok");
    llm_session_free(cpu.s);
    llm_session_free(gpu.s);
    llm_backend_free(cpu.b);
    llm_backend_free(gpu.b);
    llm_model_free(m);
    free(cpu.logits);
    free(gpu.logits);
    free(toks);
    return rc;
}
