/* check_kernels.c - every CUDA kernel (kernels/llm_kernels.h) against the
 * CPU backend's operation of the same name, on seeded random inputs, with
 * the output buffers poisoned (0xff bytes: NaN) before each run so a kernel
 * that skips an element fails. Prints one line per check (max abs and
 * relative error, the tolerance, PASS/FAIL) and exits 1 on any failure.
 * Runs on a GPU machine (tests/gpu/run.sh; built by `make gpu-check`) and
 * on the CUDA-on-CPU emulator in make test (build/cudasim/check_kernels).
 *
 * Tolerances: add, swiglu on exact inputs and embedding rows are exact or
 * within float rounding (1e-6 relative); RMSNorm reduces in double on both
 * sides but in another order (1e-5); RoPE gets its frequencies from the
 * host, so only sin/cos differ (2 ulps on a device: 2e-6 absolute). K/V rows written into the paged cache must match the
 * CPU backend's bytes exactly. Attention sums in another order than the
 * CPU backend (2e-5 absolute or 1e-4 relative); the tensor-core prefill
 * attention rounds Q and the softmax weights to half (4e-3 absolute or
 * 1e-2 relative). Sampling is checked by frequencies (check_sample). Small-batch matmul is
 * checked against float64 sums on the dequantized weights (1e-4). */
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm/backend.h"
#include "llm/quant.h"
#include "llm_kernels.h"

static int g_fail;

#define CK(call)                                                                                  \
    do {                                                                                          \
        cudaError_t e_ = (call);                                                                  \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(2);                                                                              \
        }                                                                                         \
    } while (0)

static unsigned long long g_rng = 12345;

static float frand(void)
{
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((g_rng >> 40) & 0xffffff) / 8388608.0f - 1.0f; /* [-1, 1) */
}

static float *rand_host(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (!p)
        exit(2);
    for (size_t i = 0; i < n; i++) p[i] = frand();
    return p;
}

static void *to_dev(const void *h, size_t bytes)
{
    void *d = NULL;
    CK(cudaMalloc(&d, bytes ? bytes : 1));
    CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}

static float *poisoned(size_t n)
{
    float *d = NULL;
    CK(cudaMalloc((void **)&d, n * sizeof *d));
    CK(cudaMemset(d, 0xff, n * sizeof *d));
    return d;
}

/* Compares the device result with the reference; prints the line. */
static void compare(const char *what, const float *dev, const float *ref, size_t n, double tol_abs, double tol_rel)
{
    float *got = malloc(n * sizeof *got);
    if (!got)
        exit(2);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got, dev, n * sizeof *got, cudaMemcpyDeviceToHost));
    double max_abs = 0, max_rel = 0;
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]), r = d / (fabs(ref[i]) > 1e-6 ? fabs(ref[i]) : 1e-6);
        if (!isfinite(got[i]) || (d > tol_abs && r > tol_rel))
            bad = 1;
        max_abs = d > max_abs || !isfinite(got[i]) ? d : max_abs;
        max_rel = r > max_rel ? r : max_rel;
    }
    printf("%-28s n=%-9zu max_abs %.3g max_rel %.3g (tolerance abs %.0e or rel %.0e) %s\n", what, n, max_abs, max_rel,
           tol_abs, tol_rel, bad ? "FAIL" : "PASS");
    g_fail |= bad;
    free(got);
}

static void check_rmsnorm(llm_backend *cpu, int n_tok, int dim)
{
    float *x = rand_host((size_t)n_tok * dim), *w = rand_host((size_t)dim), *ref = malloc((size_t)n_tok * dim * 4);
    llm_backend_rmsnorm(cpu, x, w, n_tok, dim, 1e-5f, ref);
    float *dx = to_dev(x, (size_t)n_tok * dim * 4), *dw = to_dev(w, (size_t)dim * 4), *dout = poisoned((size_t)n_tok * dim);
    CK((cudaError_t)lk_rmsnorm(dx, dw, n_tok, dim, 1e-5f, dout, NULL));
    char what[64];
    snprintf(what, sizeof what, "rmsnorm %dx%d", n_tok, dim);
    compare(what, dout, ref, (size_t)n_tok * dim, 1e-6, 1e-5);
    cudaFree(dx), cudaFree(dw), cudaFree(dout), free(x), free(w), free(ref);
}

static void check_rope(llm_backend *cpu, int neox, int with_factors)
{
    int n_tok = 37, n_head = 8, head_dim = 64, rot_dim = 64;
    size_t n = (size_t)n_tok * n_head * head_dim;
    float *x = rand_host(n), *ref = malloc(n * 4), *factors = rand_host((size_t)rot_dim / 2);
    for (int i = 0; i < rot_dim / 2; i++) factors[i] = 1.0f + fabsf(factors[i]) * 7; /* Llama 3.1-like divisors */
    int32_t pos[37];
    for (int t = 0; t < n_tok; t++) pos[t] = t * 113; /* up to ~4000 */
    memcpy(ref, x, n * 4);
    llm_rope_args a = {ref, n_tok, n_head, head_dim, rot_dim, pos, 500000.0f, 1.0f, neox, with_factors ? factors : NULL};
    llm_backend_rope(cpu, &a);
    float freq[32]; /* the host's table, as every backend computes it */
    llm_backend_rope_freqs(500000.0f, rot_dim, with_factors ? factors : NULL, freq);
    float *dx = to_dev(x, n * 4), *df = to_dev(freq, sizeof freq);
    int32_t *dp = to_dev(pos, sizeof pos);
    CK((cudaError_t)lk_rope(dx, n_tok, n_head, head_dim, rot_dim, dp, df, 1.0f, neox, NULL));
    char what[64];
    snprintf(what, sizeof what, "rope %s%s", neox ? "neox" : "llama", with_factors ? " +factors" : "");
    compare(what, dx, ref, n, 2e-6, 2e-6);
    cudaFree(dx), cudaFree(df), cudaFree(dp), free(x), free(ref), free(factors);
}

static void check_elementwise(llm_backend *cpu, size_t n)
{
    float *g = rand_host(n), *u = rand_host(n), *ref = malloc(n * 4), *y = rand_host(n), *yref = malloc(n * 4);
    llm_backend_swiglu(cpu, g, u, n, ref);
    memcpy(yref, y, n * 4);
    llm_backend_add(cpu, yref, g, n);
    float *dg = to_dev(g, n * 4), *du = to_dev(u, n * 4), *dout = poisoned(n), *dy = to_dev(y, n * 4);
    CK((cudaError_t)lk_swiglu(dg, du, n, dout, NULL));
    compare("swiglu", dout, ref, n, 1e-6, 1e-6);
    CK((cudaError_t)lk_add(dy, dg, n, NULL));
    compare("add", dy, yref, n, 0, 0);
    for (size_t i = 0; i < n; i++) g[i] *= 6.0f; /* GELU's tails and its curved middle */
    CK(cudaMemcpy(dg, g, n * 4, cudaMemcpyHostToDevice));
    llm_backend_geglu(cpu, g, u, n, ref);
    CK((cudaError_t)lk_geglu(dg, du, n, dout, NULL));
    compare("geglu", dout, ref, n, 1e-6, 1e-5);
    memcpy(yref, g, n * 4);
    llm_backend_scale(cpu, yref, 25.298f, n);
    CK((cudaError_t)lk_scale(dg, 25.298f, n, NULL));
    compare("scale", dg, yref, n, 0, 0);
    cudaFree(dg), cudaFree(du), cudaFree(dout), cudaFree(dy);
    free(g), free(u), free(ref), free(y), free(yref);
}

static void check_get_rows(llm_backend *cpu, quant_type t)
{
    int rows = 100, cols = 256, ids_n = 9;
    size_t rb = quant_row_bytes(t, (size_t)cols);
    float *src = rand_host((size_t)rows * cols);
    unsigned char *q = malloc((size_t)rows * rb);
    for (int r = 0; r < rows; r++) quant_quantize_row(t, src + (size_t)r * cols, q + (size_t)r * rb, (size_t)cols);
    int32_t ids[9] = {0, 99, 5, 5, 42, 17, 63, 1, 98};
    llm_weight emb = {t, rows, cols, rb, q, NULL};
    float *ref = malloc((size_t)ids_n * cols * 4);
    llm_backend_get_rows(cpu, &emb, ids, ids_n, ref);
    void *dq = to_dev(q, (size_t)rows * rb);
    int32_t *di = to_dev(ids, sizeof ids);
    float *dout = poisoned((size_t)ids_n * cols);
    CK((cudaError_t)lk_get_rows((int)t, dq, rb, cols, di, ids_n, dout, NULL));
    char what[64];
    snprintf(what, sizeof what, "get_rows %s", quant_type_name(t));
    compare(what, dout, ref, (size_t)ids_n * cols, 0, 0);
    cudaFree(dq), cudaFree(di), cudaFree(dout), free(src), free(q), free(ref);
}

/* K/V rows into the paged cache: the written rows must equal the CPU
 * backend's byte for byte (same conversions, same rounding). */
static void check_kv_write(llm_backend *cpu, quant_type t)
{
    enum { BLOCKS = 8, BS = 16, DIM = 128 };
    size_t rb = quant_row_bytes(t, DIM), bytes = (size_t)BLOCKS * BS * rb;
    unsigned char *kc = calloc(1, bytes), *vc = calloc(1, bytes);
    int32_t bt0[] = {5, 2}, bt1[] = {7, 0, 3};
    llm_batch_seq seqs[2] = {{0, 20, 3, bt0, NULL}, {20, 13, 30, bt1, NULL}}; /* rows 0..19 at 3..22, rows 20..32 at 30..42 */
    int n_rows = 33;
    float *k = rand_host((size_t)n_rows * DIM), *v = rand_host((size_t)n_rows * DIM);
    llm_kv_layer kv = {kc, vc, t, BS, DIM, rb};
    llm_backend_kv_write(cpu, &kv, seqs, 2, k, v);
    int32_t slot[33];
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < seqs[s].n_tok; j++) {
            int p = seqs[s].pos0 + j;
            slot[seqs[s].tok0 + j] = seqs[s].block_table[p / BS] * BS + p % BS;
        }
    void *dk = NULL, *dv = NULL;
    CK(cudaMalloc(&dk, bytes));
    CK(cudaMalloc(&dv, bytes));
    CK(cudaMemset(dk, 0xff, bytes));
    CK(cudaMemset(dv, 0xff, bytes));
    float *gk = to_dev(k, (size_t)n_rows * DIM * 4), *gv = to_dev(v, (size_t)n_rows * DIM * 4);
    int32_t *gs = to_dev(slot, sizeof slot);
    CK((cudaError_t)lk_kv_write((int)t, dk, dv, rb, DIM, gs, n_rows, gk, gv, NULL));
    unsigned char *hk = malloc(bytes), *hv = malloc(bytes);
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(hk, dk, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hv, dv, bytes, cudaMemcpyDeviceToHost));
    size_t diff = 0;
    for (int r = 0; r < n_rows; r++)
        for (size_t b = 0; b < rb; b++) {
            size_t off = (size_t)slot[r] * rb + b;
            diff += (hk[off] != kc[off]) + (hv[off] != vc[off]);
        }
    printf("kv_write %-19s rows=%-6d differing bytes %zu of %zu %s\n", quant_type_name(t), n_rows, diff, 2 * n_rows * rb,
           diff ? "FAIL" : "PASS");
    g_fail |= diff != 0;
    cudaFree(dk), cudaFree(dv), cudaFree(gk), cudaFree(gv), cudaFree(gs);
    free(kc), free(vc), free(k), free(v), free(hk), free(hv);
}

/* Attention over a paged cache filled by the CPU backend, against the CPU
 * backend's attention. Short: two sequences with scattered blocks, 33
 * prefill-like rows, GQA 8 query heads on 2 KV heads. Long: two decode rows
 * at positions 3000 and 700 of shuffled 16-token blocks, so each row's
 * positions are split over several blocks and combined (the second row's
 * later splits are empty). window > 0: a sliding window (rows see their
 * last `window` positions; splits and tiles before it are skipped). */
static void check_attention(llm_backend *cpu, quant_type t, int head, int lng, int window)
{
    enum { BS = 16, NH = 8, NKV = 2 };
    int dim = NKV * head, blocks = lng ? 256 : 8, hist_a = lng ? 3001 : 23, hist_b = lng ? 701 : 43;
    size_t rb = quant_row_bytes(t, (size_t)dim), bytes = (size_t)blocks * BS * rb;
    unsigned char *kc = calloc(1, bytes), *vc = calloc(1, bytes);
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)blocks);
    for (int i = 0; i < blocks; i++) tables[i] = (int32_t)((i * 97 + 5) % blocks); /* a permutation: blocks is 8 or 256 */
    int tb = (hist_a + BS - 1) / BS; /* sequence B's table starts after A's */
    llm_kv_layer kv = {kc, vc, t, BS, dim, rb};
    llm_batch_seq hist[2] = {{0, hist_a, 0, tables, NULL}, {hist_a, hist_b, 0, tables + tb, NULL}};
    float *hk = rand_host((size_t)(hist_a + hist_b) * dim), *hv = rand_host((size_t)(hist_a + hist_b) * dim);
    llm_backend_kv_write(cpu, &kv, hist, 2, hk, hv);
    /* short: rows 0..19 at 3..22 of A, rows 20..32 at 30..42 of B; long: one row each at the end */
    llm_batch_seq seqs[2] = {{0, lng ? 1 : 20, lng ? hist_a - 1 : 3, tables, NULL},
                             {lng ? 1 : 20, lng ? 1 : 13, lng ? hist_b - 1 : 30, tables + tb, NULL}};
    int n_rows = seqs[1].tok0 + seqs[1].n_tok, max_len = 0;
    float scale = 1.0f / sqrtf((float)head);
    float *q = rand_host((size_t)n_rows * NH * head), *ref = malloc((size_t)n_rows * NH * head * 4);
    llm_attn_args a = {q, ref, NH, NKV, head, scale, seqs, 2, &kv, window};
    if (llm_backend_attention(cpu, &a))
        exit(2);
    int32_t row_pos[33], row_table[33];
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < seqs[s].n_tok; j++) {
            row_pos[seqs[s].tok0 + j] = seqs[s].pos0 + j;
            row_table[seqs[s].tok0 + j] = s ? tb : 0;
            if (seqs[s].pos0 + j + 1 > max_len)
                max_len = seqs[s].pos0 + j + 1;
        }
    size_t wf = lk_attention_work(n_rows, NH, head, max_len);
    void *dk = to_dev(kc, bytes), *dv = to_dev(vc, bytes);
    float *dq = to_dev(q, (size_t)n_rows * NH * head * 4), *dout = poisoned((size_t)n_rows * NH * head);
    float *dwork = wf ? poisoned(wf) : NULL;
    int32_t *dpos = to_dev(row_pos, sizeof(int32_t) * (size_t)n_rows),
            *drt = to_dev(row_table, sizeof(int32_t) * (size_t)n_rows),
            *dtab = to_dev(tables, sizeof(int32_t) * (size_t)blocks);
    if (!lng && head == 64) { /* a length of 0 is refused, not launched as an empty grid */
        int rc = lk_attention(dq, dout, n_rows, NH, NKV, head, scale, dpos, drt, dtab, (int)t, dk, dv, rb, BS, 0, window,
                              dwork, NULL);
        int launch = (int)cudaGetLastError();
        printf("%-28s rc %d launch error %d %s\n", "attention max_len 0", rc, launch,
               rc == LK_UNSUPPORTED && !launch ? "PASS" : "FAIL");
        g_fail |= rc != LK_UNSUPPORTED || launch;
    }
    CK((cudaError_t)lk_attention(dq, dout, n_rows, NH, NKV, head, scale, dpos, drt, dtab, (int)t, dk, dv, rb, BS,
                                 max_len, window, dwork, NULL));
    char what[64];
    snprintf(what, sizeof what, "attention %s d%d %s w%d", quant_type_name(t), head, lng ? "split" : "rows", window);
    compare(what, dout, ref, (size_t)n_rows * NH * head, 2e-5, 1e-4);
    if (t == QT_F16 && head % 16 == 0) { /* the tensor-core kernel on the same rows: 16-row tiles per sequence */
        int32_t tiles[4 * 8];
        int nt = 0;
        for (int s = 0; s < 2; s++)
            for (int r = 0; r < seqs[s].n_tok; r += 16, nt++) {
                tiles[4 * nt] = seqs[s].tok0 + r;
                tiles[4 * nt + 1] = seqs[s].n_tok - r < 16 ? seqs[s].n_tok - r : 16;
                tiles[4 * nt + 2] = seqs[s].pos0 + r;
                tiles[4 * nt + 3] = s ? tb : 0;
            }
        int32_t *dtiles = to_dev(tiles, sizeof(int32_t) * 4 * (size_t)nt);
        CK(cudaMemset(dout, 0xff, (size_t)n_rows * NH * head * 4));
        CK((cudaError_t)lk_attention_tc(dq, dout, nt, dtiles, NH, NKV, head, scale, dtab, dk, dv, rb, BS, window, NULL));
        snprintf(what, sizeof what, "attention_tc d%d %s w%d", head, lng ? "long" : "rows", window);
        compare(what, dout, ref, (size_t)n_rows * NH * head, 4e-3, 1e-2); /* Q and P rounded to half */
        cudaFree(dtiles);
    }
    cudaFree(dk), cudaFree(dv), cudaFree(dq), cudaFree(dout), cudaFree(dpos), cudaFree(drt), cudaFree(dtab);
    cudaFree(dwork);
    free(kc), free(vc), free(hk), free(hv), free(q), free(ref), free(tables);
}

/* Small-batch matmul against a float64 reference on the dequantized
 * weights (the CPU backend rounds activations to 8 bits for quantized
 * weights, so it is not the reference here). */
static void check_gemv(quant_type t, int n_tok, int cols)
{
    int rows = 300;
    size_t rb = quant_row_bytes(t, (size_t)cols);
    float *w = rand_host((size_t)rows * cols), *x = rand_host((size_t)n_tok * cols), *deq = malloc((size_t)cols * 4);
    unsigned char *q = malloc((size_t)rows * rb);
    float *ref = malloc((size_t)n_tok * rows * 4);
    for (int r = 0; r < rows; r++) {
        quant_quantize_row(t, w + (size_t)r * cols, q + (size_t)r * rb, (size_t)cols);
        quant_dequantize_row(t, q + (size_t)r * rb, deq, (size_t)cols);
        for (int k = 0; k < n_tok; k++) {
            double acc = 0;
            for (int c = 0; c < cols; c++) acc += (double)deq[c] * x[(size_t)k * cols + c];
            ref[(size_t)k * rows + r] = (float)acc;
        }
    }
    void *dq = to_dev(q, (size_t)rows * rb);
    float *dx = to_dev(x, (size_t)n_tok * cols * 4), *dy = poisoned((size_t)n_tok * rows);
    CK((cudaError_t)lk_gemv((int)t, dq, rb, rows, cols, dx, n_tok, dy, NULL));
    char what[64];
    snprintf(what, sizeof what, "gemv %s batch %d cols %d", quant_type_name(t), n_tok, cols);
    compare(what, dy, ref, (size_t)n_tok * rows, 1e-4, 1e-4);
    if (n_tok > 1) { /* each token alone gives its row bit for bit (batch invariance) */
        float *dy1 = poisoned(rows), *all = malloc((size_t)n_tok * rows * 4), *one = malloc((size_t)rows * 4);
        if (!all || !one)
            exit(2);
        CK(cudaMemcpy(all, dy, (size_t)n_tok * rows * 4, cudaMemcpyDeviceToHost));
        int same = 1;
        for (int k = 0; k < n_tok; k++) {
            CK((cudaError_t)lk_gemv((int)t, dq, rb, rows, cols, dx + (size_t)k * cols, 1, dy1, NULL));
            CK(cudaMemcpy(one, dy1, (size_t)rows * 4, cudaMemcpyDeviceToHost));
            same &= !memcmp(all + (size_t)k * rows, one, (size_t)rows * 4);
        }
        printf("%-28s each row alone bit for bit: %s\n", what, same ? "PASS" : "FAIL");
        g_fail |= !same;
        cudaFree(dy1), free(all), free(one);
    }
    cudaFree(dq), cudaFree(dx), cudaFree(dy), free(w), free(x), free(deq), free(q), free(ref);
}

/* An expert's outputs into the rows it served (lk_add_rows): rows 1, 4,
 * 5, ... of y set, then others added to, with the CPU's rounding (the
 * product rounded before the add): exact. */
static void check_add_rows(int rows, int cols)
{
    size_t n = (size_t)rows * cols;
    int k = rows / 3, rs[64], ra[64];
    float *y = rand_host(n), *x = rand_host((size_t)k * cols), *w = rand_host((size_t)k), *want = malloc(n * 4);
    memcpy(want, y, n * 4);
    for (int i = 0; i < k; i++) {
        rs[i] = (3 * i + 1) % rows; /* distinct within a call */
        ra[i] = (3 * i + 2) % rows;
        for (int c = 0; c < cols; c++) want[(size_t)rs[i] * cols + c] = w[i] * x[(size_t)i * cols + c];
    }
    for (int i = 0; i < k; i++)
        for (int c = 0; c < cols; c++) {
            float p = w[i] * x[(size_t)i * cols + c];
            want[(size_t)ra[i] * cols + c] = want[(size_t)ra[i] * cols + c] + p;
        }
    float *dy = to_dev(y, n * 4), *dx = to_dev(x, (size_t)k * cols * 4), *dw = to_dev(w, (size_t)k * 4);
    int32_t *drs = to_dev(rs, sizeof(int32_t) * (size_t)k), *dra = to_dev(ra, sizeof(int32_t) * (size_t)k);
    CK((cudaError_t)lk_add_rows(dy, drs, dw, dx, k, cols, 1, NULL));
    CK((cudaError_t)lk_add_rows(dy, dra, dw, dx, k, cols, 0, NULL));
    compare("add_rows", dy, want, n, 0, 0);
    cudaFree(dy), cudaFree(dx), cudaFree(dw), cudaFree(drs), cudaFree(dra), free(y), free(x), free(w), free(want);
}

/* lk_lora's words for segment sg with device matrices a and bt, then a
 * (row, segment) pair per row of the n segments, into w (device copy
 * returned). */
static int32_t *lora_words(const llm_lora_seg *sg, int n, int32_t *w, int *rows)
{
    int k = 0;
    for (int i = 0; i < n; i++) {
        uint64_t a = (uint64_t)(uintptr_t)sg[i].a, bt = (uint64_t)(uintptr_t)sg[i].bt;
        int32_t sb;
        memcpy(&sb, &sg[i].s, 4);
        int32_t rk = lk_lora_rank_word(sg[i].rank, sg[i].a_type == QT_F16, sg[i].b_type == QT_F16);
        int32_t v[8] = {sg[i].row0, sg[i].n_rows, rk, sb, (int32_t)(uint32_t)a, (int32_t)(uint32_t)(a >> 32),
                        (int32_t)(uint32_t)bt, (int32_t)(uint32_t)(bt >> 32)};
        memcpy(w + 8 * i, v, sizeof v);
    }
    for (int i = 0; i < n; i++)
        for (int r = 0; r < sg[i].n_rows; r++, k++) w[8 * n + 2 * k] = sg[i].row0 + r, w[8 * n + 2 * k + 1] = i;
    *rows = k;
    return to_dev(w, sizeof(int32_t) * (size_t)(8 * n + 2 * k));
}

/* n random values in [-1, 1) as float, or as half when half (host). */
static void *rand_typed(size_t n, int half)
{
    float *f = rand_host(n);
    if (!half)
        return f;
    quant_f16 *h = malloc(n * sizeof *h);
    if (!h)
        exit(2);
    for (size_t i = 0; i < n; i++) h[i] = quant_f32_to_f16(f[i]);
    free(f);
    return h;
}

/* LoRA's shrink and expand (lk_lora) against the CPU backend's op: four
 * segments of three adapters (ranks 8, 1, 64; one adapter twice, rows
 * left out between), in and out off the warp and block sizes; with half,
 * the first adapter's A and the third's A and B are F16 (types mixed in
 * one call); then one segment alone must give its rows bit for bit
 * (batch invariance). */
static void check_lora(llm_backend *cpu, int in, int out, int half)
{
    enum { NT = 12 };
    int ranks[3] = {8, 1, 64};
    quant_type at[3] = {half ? QT_F16 : QT_F32, QT_F32, half ? QT_F16 : QT_F32};
    quant_type bty[3] = {QT_F32, QT_F32, half ? QT_F16 : QT_F32};
    void *ha[3], *hb[3], *da[3], *db[3];
    for (int i = 0; i < 3; i++) {
        size_t ea = at[i] == QT_F16 ? 2 : 4, eb = bty[i] == QT_F16 ? 2 : 4;
        ha[i] = rand_typed((size_t)ranks[i] * in, at[i] == QT_F16);
        hb[i] = rand_typed((size_t)ranks[i] * out, bty[i] == QT_F16);
        da[i] = to_dev(ha[i], ea * (size_t)ranks[i] * in);
        db[i] = to_dev(hb[i], eb * (size_t)ranks[i] * out);
    }
    static const int which[4] = {0, 1, 2, 0}, row0[4] = {0, 3, 5, 10}, nrows[4] = {3, 1, 4, 2};
    static const float sc[4] = {0.5f, -2.0f, 1.0f, 0.5f};
    llm_lora_seg hs[4], ds[4];
    for (int i = 0; i < 4; i++) {
        int a = which[i];
        hs[i] = (llm_lora_seg){row0[i], nrows[i], ha[a], hb[a], ranks[a], sc[i], at[a], bty[a]};
        ds[i] = (llm_lora_seg){row0[i], nrows[i], da[a], db[a], ranks[a], sc[i], at[a], bty[a]};
    }
    float *x = rand_host((size_t)NT * in), *y = rand_host((size_t)NT * out), *ref = malloc(sizeof(float) * NT * out);
    memcpy(ref, y, sizeof(float) * NT * out);
    if (llm_backend_lora(cpu, hs, 4, x, in, ref, out)) {
        fprintf(stderr, "check_kernels: the CPU backend's lora op failed\n");
        exit(2);
    }
    int32_t w[8 * 4 + 2 * NT];
    int rows;
    int32_t *dw = lora_words(ds, 4, w, &rows);
    float *dx = to_dev(x, sizeof(float) * NT * in), *dy = to_dev(y, sizeof(float) * NT * out), *dt = poisoned(NT * 64);
    CK((cudaError_t)lk_lora(dw, dw + 32, rows, dx, in, dy, out, dt, 64, NULL));
    char what[64];
    snprintf(what, sizeof what, "lora in %d out %d%s", in, out, half ? " f16" : "");
    /* |y| reaches ~100 (rank 64 sums of 2048-long dots of values in [-1, 1)): float sums in another order differ
     * by ~1e-6 of that */
    compare(what, dy, ref, (size_t)NT * out, 5e-4, 1e-4);
    float *dy1 = to_dev(y, sizeof(float) * NT * out), *all = malloc(sizeof(float) * NT * out),
          *one = malloc(sizeof(float) * NT * out);
    int32_t *dw1 = lora_words(&ds[2], 1, w, &rows);
    CK((cudaError_t)lk_lora(dw1, dw1 + 8, rows, dx, in, dy1, out, dt, 64, NULL));
    CK(cudaMemcpy(all, dy, sizeof(float) * NT * out, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(one, dy1, sizeof(float) * NT * out, cudaMemcpyDeviceToHost));
    int same = !memcmp(all + (size_t)5 * out, one + (size_t)5 * out, sizeof(float) * 4 * (size_t)out);
    printf("%-28s its rows alone bit for bit: %s\n", what, same ? "PASS" : "FAIL");
    g_fail |= !same;
    for (int i = 0; i < 3; i++) cudaFree(da[i]), cudaFree(db[i]), free(ha[i]), free(hb[i]);
    cudaFree(dw), cudaFree(dw1), cudaFree(dx), cudaFree(dy), cudaFree(dy1), cudaFree(dt);
    free(x), free(y), free(ref), free(all), free(one);
}

/* Weights dequantized to float for cuBLAS: the CPU dequantizer's values,
 * exactly. Also the per-row bias add (exact). */
static void check_dequant(quant_type t)
{
    int rows = 37, cols = 512;
    size_t rb = quant_row_bytes(t, (size_t)cols), n = (size_t)rows * cols;
    float *w = rand_host(n), *ref = malloc(n * 4), *got = malloc(n * 4);
    unsigned char *q = malloc((size_t)rows * rb);
    for (int r = 0; r < rows; r++) {
        quant_quantize_row(t, w + (size_t)r * cols, q + (size_t)r * rb, (size_t)cols);
        quant_dequantize_row(t, q + (size_t)r * rb, ref + (size_t)r * cols, (size_t)cols);
    }
    void *dq = to_dev(q, (size_t)rows * rb);
    float *dout = poisoned(n);
    CK((cudaError_t)lk_dequant_f32((int)t, dq, rb, rows, cols, dout, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got, dout, n * 4, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(&got[i], &ref[i], 4) != 0;
    printf("dequant_f32 %-16s %zu of %zu values differ %s\n", quant_type_name(t), bad, n, bad ? "FAIL" : "PASS");
    g_fail |= bad != 0;
    if (t == QT_F32) { /* bias add on the same shape */
        float *b = rand_host((size_t)cols), *x = rand_host(n), *want = malloc(n * 4);
        for (size_t i = 0; i < n; i++) want[i] = x[i] + b[i % cols];
        float *dx = to_dev(x, n * 4), *db = to_dev(b, (size_t)cols * 4);
        CK((cudaError_t)lk_add_bias(dx, db, rows, cols, NULL));
        compare("add_bias", dx, want, n, 0, 0);
        cudaFree(dx), cudaFree(db), free(b), free(x), free(want);
        check_add_rows(rows, cols);
    }
    cudaFree(dq), cudaFree(dout), free(w), free(ref), free(q), free(got);
}

static const float *g_sort_v;
/* Larger value first, then the lower id: the samplers' order. */
static int by_value_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    float x = g_sort_v[i], y = g_sort_v[j];
    return x < y ? 1 : x > y ? -1 : i - j;
}

/* Sampling: N rows of the same logits with draws u = (i + 0.5) / N must
 * pick each token with the frequency of its probability in the truncated
 * distribution (computed here in float64 by sorting), within 2/N + 1e-3,
 * and never a token outside it. */
static int g_quick; /* CHECK_QUICK=1 (compute-sanitizer, the CUDA-on-CPU emulator): fewer sampling rows, no frequency test */

/* ties: 16 logits around the k-th share its value, so exactly k must be
 * kept with the lowest ids (the host's rule), not all 16. */
static void check_sample(float temp, int top_k, float top_p, float min_p, int ties)
{
    enum { V = 5000 };
    int N = g_quick ? 64 : 4000;
    float *row = rand_host(V);
    for (int i = 0; i < V; i++) row[i] *= 6.0f;
    int *idx = malloc(sizeof(int) * V);
    double *prob = calloc(V, sizeof *prob);
    for (int i = 0; i < V; i++) idx[i] = i;
    g_sort_v = row;
    qsort(idx, V, sizeof *idx, by_value_desc);
    if (ties && top_k > 8) {
        float v = row[idx[top_k - 5]];
        for (int j = top_k - 5; j < top_k + 11; j++) row[idx[j]] = v;
        qsort(idx, V, sizeof *idx, by_value_desc);
    }
    int n = temp <= 0 ? 1 : top_k > 0 && top_k < V ? top_k : V; /* temperature 0: the argmax alone */
    double mx = row[idx[0]], z = 0, t = temp > 0 ? temp : 1;
    if (min_p > 0)
        while (n > 1 && exp((row[idx[n - 1]] - mx) / t) < min_p) n--;
    for (int i = 0; i < n; i++) z += exp((row[idx[i]] - mx) / t);
    if (top_p < 1) {
        double acc = 0;
        int k = 0;
        while (k < n && acc < top_p * z) acc += exp((row[idx[k++]] - mx) / t);
        n = k, z = acc;
    }
    for (int i = 0; i < n; i++) prob[idx[i]] = exp((row[idx[i]] - mx) / t) / z;
    float *rows = malloc(sizeof(float) * (size_t)V * N);
    lk_sample_params *ps = malloc(sizeof *ps * N);
    for (int r = 0; r < N; r++) {
        memcpy(rows + (size_t)r * V, row, sizeof(float) * V);
        ps[r] = (lk_sample_params){temp, top_k, top_p, min_p, (r + 0.5f) / N};
    }
    float *drows = to_dev(rows, sizeof(float) * (size_t)V * N);
    lk_sample_params *dps = to_dev(ps, sizeof *ps * N);
    int32_t *dout = NULL, *got = malloc(sizeof(int32_t) * N);
    CK(cudaMalloc((void **)&dout, sizeof(int32_t) * N));
    CK(cudaMemset(dout, 0xff, sizeof(int32_t) * N));
    CK((cudaError_t)lk_sample(drows, N, V, dps, dout, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got, dout, sizeof(int32_t) * N, cudaMemcpyDeviceToHost));
    int *count = calloc(V, sizeof *count), outside = 0;
    for (int r = 0; r < N; r++) {
        if (got[r] < 0 || got[r] >= V || prob[got[r]] == 0)
            outside++;
        else
            count[got[r]]++;
    }
    double worst = 0;
    for (int i = 0; i < V; i++) worst = fmax(worst, fabs((double)count[i] / N - prob[i]));
    int bad = outside > 0 || (!g_quick && worst > 2.0 / N + 1e-3);
    printf("sample T=%.1f k=%d p=%.2f min_p=%.2f%s: %d candidates, max |freq - prob| %.2e, %d outside %s\n", temp,
           top_k, top_p, min_p, ties ? " ties at k" : "", n, worst, outside, bad ? "FAIL" : "PASS");
    g_fail |= bad;
    cudaFree(drows), cudaFree(dps), cudaFree(dout);
    free(row), free(idx), free(prob), free(rows), free(ps), free(got), free(count);
}

/* The sampler's rules where they decide the draw, with every row's answer
 * known: (a) 10 ids tied at the top of a 5000-token row, k = 4: exactly
 * the 4 lowest ids may come out (the host's tie rule), each about a
 * quarter of the time; (b) a 600-token row (fewer tokens than threads)
 * with every other logit -inf and k = 1000 (more than the finite ones):
 * never a -inf token; (c) the same at temperature 1e-3, where most weights
 * underflow: only the argmax may come out. */
static void check_sample_rules(void)
{
    enum { V = 5000, N = 64, VS = 600 };
    float *row = malloc(sizeof(float) * V * N), *small = malloc(sizeof(float) * VS * N);
    lk_sample_params ps[N];
    int32_t got[N];
    for (int i = 0; i < V; i++) row[i] = -20.f;
    for (int t = 0; t < 10; t++) row[100 + 500 * t] = 5.f; /* ids 100, 600, ..., 4600 */
    float best = -1e30f;
    int best_id = 0;
    for (int i = 0; i < VS; i++) {
        small[i] = i % 2 ? -INFINITY : frand() * 4.f;
        if (small[i] > best)
            best = small[i], best_id = i;
    }
    small[best_id] += 1.f; /* a clear maximum: at T 1e-3 every other weight is exp(-1000) = 0 */
    for (int r = 1; r < N; r++) {
        memcpy(row + (size_t)r * V, row, sizeof(float) * V);
        memcpy(small + (size_t)r * VS, small, sizeof(float) * VS);
    }
    float *drow = to_dev(row, sizeof(float) * V * N), *dsmall = to_dev(small, sizeof(float) * VS * N);
    int32_t *dout = NULL;
    CK(cudaMalloc((void **)&dout, sizeof got));
    const char *name[3] = {"ties at the top, k 4", "-inf mix, k > finite", "T 1e-3 (underflow)"};
    for (int c = 0; c < 3; c++) {
        for (int r = 0; r < N; r++)
            ps[r] = (lk_sample_params){c == 2 ? 1e-3f : 1.f, c == 0 ? 4 : 1000, 1.f, 0.f, (r + 0.5f) / N};
        lk_sample_params *dps = to_dev(ps, sizeof ps);
        CK((cudaError_t)lk_sample(c == 0 ? drow : dsmall, N, c == 0 ? V : VS, dps, dout, NULL));
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
        int bad = 0, seen[4] = {0};
        for (int r = 0; r < N; r++) {
            int id = got[r];
            if (c == 0) {
                int k = (id - 100) / 500;
                bad |= id < 100 || (id - 100) % 500 || k > 3;
                if (!bad)
                    seen[k]++;
            } else {
                bad |= id < 0 || id >= VS || !(small[id] > -INFINITY) || (c == 2 && id != best_id);
            }
        }
        if (c == 0)
            for (int k = 0; k < 4; k++) bad |= seen[k] < N / 8; /* each about N / 4 */
        printf("%-28s %s: %s\n", "sample rule", name[c], bad ? "FAIL" : "PASS");
        g_fail |= bad;
        cudaFree(dps);
    }
    cudaFree(drow), cudaFree(dsmall), cudaFree(dout), free(row), free(small);
}

/* Rows with edges, each with the id it must give: a tie (lowest id), a
 * NaN (LK_SAMPLE_NAN), a last-id maximum, +inf, and every logit -inf. */
static void check_argmax(void)
{
    enum { ROWS = 6, V = 32001 };
    float *l = rand_host((size_t)ROWS * V);
    l[1 * V + 7] = l[1 * V + 30000] = 5.0f; /* a tie: 7 wins */
    l[2 * V + 0] = NAN;
    l[3 * V + V - 1] = 9.0f;
    l[4 * V + 123] = INFINITY;
    for (int i = 0; i < V; i++) l[5 * V + i] = -INFINITY;
    int32_t want[ROWS] = {0, 7, LK_SAMPLE_NAN, V - 1, 123, 0}, got[ROWS];
    for (int i = 1; i < V; i++) /* row 0: plain random logits */
        if (l[i] > l[want[0]])
            want[0] = i;
    float *dl = to_dev(l, (size_t)ROWS * V * 4);
    int32_t *dout = NULL;
    CK(cudaMalloc((void **)&dout, sizeof got));
    CK((cudaError_t)lk_argmax(dl, ROWS, V, dout, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    int bad = memcmp(got, want, sizeof got) != 0;
    printf("%-28s rows=%d vocab=%d ids %s (tie %d want 7, NaN %d want -1, +inf %d want 123)\n", "argmax", ROWS, V,
           bad ? "FAIL" : "PASS", got[1], got[2], got[4]);
    g_fail |= bad;
    /* the sampler's edges: T so small that logits / T overflows (argmax),
     * the same rows with top-p; NaN and +inf rows as above */
    lk_sample_params ps[ROWS];
    for (int r = 0; r < ROWS; r++) ps[r] = (lk_sample_params){r % 2 ? 1e-30f : 0.8f, 0, r == 3 ? 0.5f : 1.f, 0, 0.999f};
    ps[0].temperature = 1e-38f;
    lk_sample_params *dps = to_dev(ps, sizeof ps);
    CK((cudaError_t)lk_sample(dl, ROWS, V, dps, dout, NULL));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    int bad2 = got[0] != want[0] || got[1] != 7 || got[2] != LK_SAMPLE_NAN || got[3] != V - 1 || got[4] != 123 ||
               got[5] < 0 || got[5] >= V;
    printf("%-28s rows=%d ids %s (tiny T %d want %d, tie %d want 7, NaN %d, tiny T top-p %d want %d, +inf %d, all -inf %d)\n",
           "sample edges", ROWS, bad2 ? "FAIL" : "PASS", got[0], want[0], got[1], got[2], got[3], V - 1, got[4], got[5]);
    g_fail |= bad2;
    cudaFree(dl), cudaFree(dps), cudaFree(dout), free(l);
}

int main(void)
{
    quant_init();
    g_quick = getenv("CHECK_QUICK") && strtol(getenv("CHECK_QUICK"), NULL, 10);
    llm_backend *cpu = NULL;
    llm_error err = {0};
    llm_cpu_config cc = {.n_threads = 2, .force_scalar = 0, .kernels = NULL};
    if (llm_backend_cpu_new(&cc, &cpu, &err)) {
        fprintf(stderr, "check_kernels: %s\n", err.msg);
        return 2;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d), CPU reference: %s kernels\n", prop.name, prop.major, prop.minor,
           llm_backend_cpu_kernels(cpu));
    check_rmsnorm(cpu, 1, 4096);
    check_rmsnorm(cpu, 33, 2048);
    check_rmsnorm(cpu, 7, 100); /* not a multiple of the block */
    for (int neox = 0; neox < 2; neox++)
        for (int f = 0; f < 2; f++) check_rope(cpu, neox, f);
    check_elementwise(cpu, 1000003);
    static const quant_type types[] = {QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q6_K, QT_Q4_1, QT_Q5_0,
                                       QT_Q5_1, QT_Q2_K, QT_Q3_K, QT_Q5_K};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++) check_get_rows(cpu, types[i]);
    static const quant_type kv_types[] = {QT_F32, QT_F16, QT_Q8_0};
    for (size_t i = 0; i < sizeof kv_types / sizeof *kv_types; i++) check_kv_write(cpu, kv_types[i]);
    /* The avx512 set scores Q8_0 K in integers with the query rounded to
     * Q8_0 (attn_dots_q8q, checked by test_quant); the CUDA kernels score
     * the K rows' floats, as the scalar set does: Q8_0's reference. */
    llm_backend *fcpu = NULL;
    if (llm_backend_cpu_new(&(llm_cpu_config){.n_threads = 2, .force_scalar = 1}, &fcpu, &err)) {
        fprintf(stderr, "check_kernels: %s\n", err.msg);
        llm_backend_free(cpu);
        return 2;
    }
    printf("Q8_0 attention's CPU reference: %s kernels (float scores)\n", llm_backend_cpu_kernels(fcpu));
    for (size_t i = 0; i < sizeof kv_types / sizeof *kv_types; i++)
        for (int lng = 0; lng < 2; lng++) {
            llm_backend *ref = kv_types[i] == QT_Q8_0 ? fcpu : cpu;
            check_attention(ref, kv_types[i], 64, lng, 0);
            check_attention(ref, kv_types[i], 128, lng, 0);
            if (kv_types[i] != QT_Q8_0) /* Q8_0 rows need heads of whole 32-blocks */
                check_attention(ref, kv_types[i], 8, lng, 0);
            /* sliding windows: 7 cuts into every short row's history (and
             * whole 16-row tiles); 1000 cuts the long row's first splits */
            check_attention(ref, kv_types[i], 128, lng, lng ? 1000 : 7);
        }
    llm_backend_free(fcpu);
    check_attention(cpu, QT_F16, 256, 0, 19); /* gemma3's head size */
    static const int batches[] = {1, 3, 8};
    static const quant_type gemv_types[] = {QT_F32, QT_F16, QT_BF16, QT_Q4_0, QT_Q8_0, QT_Q4_K, QT_Q6_K, QT_Q4_1,
                                            QT_Q5_0, QT_Q5_1, QT_Q2_K, QT_Q3_K, QT_Q5_K};
    for (size_t i = 0; i < sizeof gemv_types / sizeof *gemv_types; i++)
        for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) {
            check_gemv(gemv_types[i], batches[b], 512); /* the vector paths */
            if (quant_block_elems(gemv_types[i]) < 256)
                check_gemv(gemv_types[i], batches[b], 288); /* a partial pass; half types by the scalar path */
        }
    for (size_t i = 0; i < sizeof gemv_types / sizeof *gemv_types; i++) check_dequant(gemv_types[i]);
    for (int half = 0; half < 2; half++) {
        check_lora(cpu, 200, 300, half);
        check_lora(cpu, 2048, 640, half);
    }
    check_argmax();
    check_sample_rules();
    check_sample(0.0f, 0, 1.0f, 0.0f, 0);
    check_sample(0.7f, 0, 1.0f, 0.0f, 0);
    check_sample(1.0f, 50, 1.0f, 0.0f, 0);
    check_sample(2.0f, 50, 1.0f, 0.0f, 1);
    check_sample(0.9f, 0, 0.9f, 0.0f, 0);
    check_sample(1.2f, 100, 0.95f, 0.05f, 0);
    llm_backend_free(cpu);
    printf("%s\n", g_fail ? "check_kernels: FAILED" : "check_kernels: all passed");
    return g_fail;
}
